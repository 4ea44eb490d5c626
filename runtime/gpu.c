/* gpu.c: the executor on a GPU (device.h): the program's regions allocated on the
 * device once, every kernel step's arguments resident there, and each phase's
 * schedule queued on the compute stream: kernels with their launch geometry, matrix
 * products through the device's cuBLAS (row-major made column-major by swapping the
 * operands), convolutions through its library (cuDNN) where it has one, else their
 * generated steps (ddp_path), poisoning as on the CPU.
 *
 * The host keeps mirrors of what it reads or writes: the parameters and statistics
 * (initialised, loaded, saved, compared), the gradients (summed over the ring with
 * several workers), the accumulators (read for the figures) and the batch (assembled
 * by the loader). Mirrors and device meet only through ddp_to_device, ddp_to_host and
 * the batch's upload; arena and workspace have no mirror. The next batch goes up from
 * pinned memory on its own stream into a staging area while the current step runs,
 * and the compute stream copies it into place when the step before is done with the
 * batch it used; the batch after waits for that copy before it enters the staging area.
 *
 * A phase run whole on a full batch is a CUDA graph from its second run on: captured
 * then (the first run warms up: cuBLAS picks its kernels, cuDNN its plans, the device
 * loads the code) and launched as one operation after, instead of hundreds of
 * launches. What changes from step to step lives in device memory the graph reads
 * (the scalars, uploaded before it; the batch, copied into place before it), and its
 * sizes follow the full batch; a shorter batch (the last of an epoch, an empty shard)
 * runs step by step. A lone worker (options.step_graph) has nothing between its
 * phases, so its whole training step is one graph: the capture begun with the
 * forward phase ends with the optimizer's, and from then on the forward phase's call
 * launches the whole step and the two calls after it have nothing left to queue.
 * Under accumulate_batches the batches a step sums before its last (forward and
 * backward, no optimizer) are a second such graph.
 *
 * With several workers the gradients are summed bucket by bucket as backward marks
 * them final (the schedule's markers): through NCCL on the communication stream, each
 * bucket's all-reduce queued behind an event of the compute stream and the optimizer
 * queued behind one of the communication stream, so the host never waits for them; or
 * through the ring, each bucket copied into the pinned gradient mirror behind its own
 * event, which the host watches to hand the bucket to the communication thread (comm.c)
 * while the device goes on with backward. Backward then runs call by call (its markers
 * act on the host); forward and the optimizer are still graphs. With NCCL the host's
 * waits poll the device's events and the NCCL watchdog (nccl.c), so that a lost worker
 * ends them instead of hanging them.
 *
 * --profile times each step of a training phase between two timing events and tells
 * the profile after the phase (so the phase then runs step by step, and waits). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "runtime.h"

/* The executor's events (below DDP_BUCKET_EVENT(0, 0)): the batch uploaded, the figures
 * downloaded, a download's end, backward's gradients before a bucket's collective, the
 * collectives' end before the optimizer, the staging area copied into place. */
enum { EVENT_UPLOADED = 0, EVENT_FIGURES = 1, EVENT_HOST = 2, EVENT_TO_COMM = 3, EVENT_COMM_DONE = 4,
       EVENT_STAGING_FREE = 5 };

struct ddp_gpu {
    ddp_device *dev;
    ddp_dptr region[DDP_REGION_COUNT];
    ddp_dptr *buffer;           /* by slot: each buffer's device address */
    ddp_dptr scalars;
    ddp_dptr *step_args[DDP_PHASE_COUNT]; /* by step: its kernel's argument array on the device */
    ddp_dptr staging;           /* the next batch, as it arrives */
    bool upload_queued;         /* a batch is on its way up: its mirror must not be written yet */
    void *pinned[DDP_REGION_COUNT]; /* the mirrors the device allocated (pinned), to give back */
    int path;                   /* the convolutions' ddp_path: the library's where the device has one */
    char no_library[1024];      /* the banner's line when the library's convolutions were given up, or "" */
    int64_t full_runs[DDP_PHASE_COUNT]; /* runs of each phase whole on a full batch */
    bool captured[DDP_PHASE_COUNT]; /* graph `phase` holds the phase */
    int step_graph[2];          /* STEP_*: where the lone worker's step graphs stand: the whole
                                   step's, and a held batch's (below) */
    int64_t step_runs[2];       /* runs of each on a full batch */
    ddp_scalar step_scalars[DDP_S_COUNT]; /* the scalars the step's graph was given */
    ddp_nccl *nccl;             /* the buckets' all-reduce through NCCL; NULL: none */
    bool staged;                /* the buckets copied into the pinned gradient mirror for the ring */
    bool whole;                 /* no bucket events to spare: the whole vector once backward is done */
    int64_t *marked;            /* staged: this step's buckets in the order backward marked them */
    int64_t nmarked, handed;    /* of them, those handed to the host so far */
    int64_t step;               /* the training step, for messages */
};

/* The whole-step graph: none yet, being captured (forward queued, the rest to come),
 * captured, or launched for this step (backward and optimizer are in it). */
enum { STEP_NONE, STEP_CAPTURING, STEP_CAPTURED, STEP_LAUNCHED };
/* The slots of the whole step's graph, and of a held batch's: under accumulate_batches
 * a step's batches before its last run forward and backward alone, a graph of their own. */
enum { GRAPH_STEP = DDP_PHASE_COUNT, GRAPH_HELD_BATCH };

bool ddp_device_fail(ddp_device *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->error, sizeof d->error, fmt, ap);
    va_end(ap);
    return false;
}

void ddp_device_close(ddp_device *d) {
    if (!d)
        return;
    d->ops->close(d);
    free(d);
}

/* The device's failure as the runtime's: its message into rt->device_error. */
static bool failed(ddp_runtime *rt, const char *doing) {
    snprintf(rt->device_error, sizeof rt->device_error, "%.200s: %.1800s", doing, rt->gpu->dev->error);
    return false;
}

/* NCCL's watchdog aborted the collectives: its reason, which names them, is the failure. */
static bool nccl_failed(ddp_runtime *rt) {
    char why[2048];
    if (!ddp_nccl_failed(rt->gpu->nccl, why, sizeof why))
        return false;
    snprintf(rt->device_error, sizeof rt->device_error, "%s", why);
    return true;
}

/* Waits for the event. With NCCL in use the wait polls it, and gives up once the
 * watchdog has aborted the collectives the event may follow; on the emulated device
 * the host's wait runs the queue, which an abort lets go on. */
static bool await(ddp_runtime *rt, int event, const char *doing) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    if (!g->nccl || !d->ops->event_done)
        return d->ops->synchronize_event(d, event) || failed(rt, doing);
    for (unsigned spins = 0;; spins++) {
        if (nccl_failed(rt))
            return false;
        int done = d->ops->event_done(d, event);
        if (done < 0)
            return (d->ops->synchronize_event(d, event) || failed(rt, doing)) && !nccl_failed(rt);
        if (done || d->ops->host_runs_queue)
            return (done || d->ops->synchronize_event(d, event) || failed(rt, doing)) && !nccl_failed(rt);
        if (spins > 64)
            usleep(spins > 4096 ? 1000 : 50);
    }
}

/* ------------------------------------------------------------ attaching */

/* The device addresses of every kernel step's arguments, uploaded once. */
static bool place_arguments(ddp_runtime *rt, ddp_gpu *g) {
    const ddp_program *p = rt->program;
    ddp_device *d = g->dev;
    int64_t total = 0;
    for (int ph = 0; ph < DDP_PHASE_COUNT; ph++)
        for (int64_t s = 0; s < p->phases[ph].count; s++)
            total += p->phases[ph].steps[s].nargs + 1;
    ddp_dptr *host = calloc((size_t)total + 1, sizeof *host), all;
    if (!host)
        return ddp_device_fail(d, "out of memory for the launches' arguments");
    bool ok = d->ops->alloc(d, sizeof *host * (size_t)(total + 1), &all);
    int64_t at = 0;
    for (int ph = 0; ok && ph < DDP_PHASE_COUNT; ph++) {
        if (!(g->step_args[ph] = calloc((size_t)p->phases[ph].count + 1, sizeof(ddp_dptr))))
            ok = ddp_device_fail(d, "out of memory for the launches' arguments");
        for (int64_t s = 0; ok && s < p->phases[ph].count; s++) {
            const ddp_step *step = &p->phases[ph].steps[s];
            g->step_args[ph][s] = all + (ddp_dptr)(at * (int64_t)sizeof *host);
            for (int64_t a = 0; a < step->nargs; a++)
                host[at + a] = g->buffer[step->args[a]];
            at += step->nargs + 1;
        }
    }
    ok = ok && d->ops->upload(d, DDP_STREAM_COMPUTE, all, host, sizeof *host * (size_t)(total + 1)) &&
         d->ops->synchronize(d);
    free(host);
    return ok;
}

/* Mirrors the host needs that the device should pin (the copies that overlap work);
 * the arena and workspace need none. */
static bool replace_mirrors(ddp_runtime *rt, ddp_gpu *g) {
    const ddp_program *p = rt->program;
    ddp_device *d = g->dev;
    int pinned[] = {DDP_REGION_INPUT, DDP_REGION_ACCUM};
    for (size_t i = 0; i < sizeof pinned / sizeof *pinned; i++) {
        int r = pinned[i];
        void *m = d->ops->host_alloc(d, (size_t)(p->region_bytes[r] ? p->region_bytes[r] : 64));
        if (!m)
            return ddp_device_fail(d, "cannot pin %lld bytes of host memory for the %s",
                                   (long long)p->region_bytes[r], r == DDP_REGION_INPUT ? "batch" : "figures");
        free(rt->region[r]);
        rt->region[r] = g->pinned[r] = m;
    }
    free(rt->region[DDP_REGION_ARENA]);
    free(rt->region[DDP_REGION_WORKSPACE]);
    rt->region[DDP_REGION_ARENA] = rt->region[DDP_REGION_WORKSPACE] = NULL;
    for (int64_t i = 0; i < p->nbuffers; i++)
        rt->buffers[i] = rt->region[p->buffers[i].region]
                             ? (char *)rt->region[p->buffers[i].region] + p->buffers[i].offset
                             : NULL;
    return true;
}

/* Each library convolution run once at the full batch before training, on buffers
 * still zero (whatever it writes is written again before anyone reads it), so that
 * every plan is made now: one the library cannot make (cuDNN with no deterministic
 * engine for a shape, as bf16 with few channels may be) turns the program to the
 * generated steps, which the banner says, rather than failing its first step. Left
 * to the first step when the path was asked for (--convolutions). */
static void plan_convolutions(ddp_runtime *rt, ddp_gpu *g) {
    const ddp_program *p = rt->program;
    if (g->path != DDP_PATH_LIBRARY || rt->options.convolutions)
        return;
    for (int64_t i = 0; i < p->nconvs; i++) {
        const ddp_conv *cv = &p->convs[i];
        ddp_device_conv c = ddp_conv_at(rt, cv);
        c.n = (int)(cv->n.fixed + cv->n.per_sample * p->settings.batch_per_replica);
        c.x = g->buffer[cv->x], c.filters = g->buffer[cv->filters], c.y = g->buffer[cv->y];
        c.workspace = g->buffer[cv->workspace];
        c.planning = true;
        if (c.n > 0 && !g->dev->ops->conv(g->dev, DDP_STREAM_COMPUTE, &c)) {
            snprintf(g->no_library, sizeof g->no_library, "generated: im2col and products (the library's were given "
                                                           "up at the start: %.900s)", g->dev->error);
            g->dev->error[0] = '\0';
            g->path = DDP_PATH_GENERATED;
            return;
        }
    }
}

bool ddp_gpu_attach(ddp_runtime *rt, ddp_device *dev, char *err, size_t len) {
    const ddp_program *p = rt->program;
    ddp_gpu *g = calloc(1, sizeof *g);
    if (!g)
        return ddp_fail(err, len, "out of memory");
    g->dev = dev;
    dev->timed_conv_search = rt->options.timed_conv_search;
    g->path = rt->options.convolutions ? rt->options.convolutions : dev->ops->conv ? DDP_PATH_LIBRARY
                                                                                    : DDP_PATH_GENERATED;
    rt->gpu = g;
    if (g->path == DDP_PATH_LIBRARY && !dev->ops->conv)
        return ddp_fail(err, len, "--convolutions library: the %s GPU (%s) runs none: %s", dev->ops->name,
                        dev->info.name, dev->convolutions);
    bool ok = (g->buffer = calloc((size_t)p->nbuffers + 1, sizeof *g->buffer)) != NULL ||
              ddp_device_fail(dev, "out of memory");
    /* zeroed, as the CPU's regions start */
    for (int r = 0; ok && r < DDP_REGION_COUNT; r++)
        ok = dev->ops->alloc(dev, (size_t)(p->region_bytes[r] ? p->region_bytes[r] : 64), &g->region[r]) &&
             dev->ops->fill(dev, DDP_STREAM_COMPUTE, g->region[r], 0, (size_t)p->region_bytes[r]);
    for (int64_t i = 0; ok && i < p->nbuffers; i++)
        g->buffer[i] = g->region[p->buffers[i].region] + (ddp_dptr)p->buffers[i].offset;
    ok = ok && dev->ops->alloc(dev, sizeof rt->scalars, &g->scalars) &&
         dev->ops->alloc(dev, (size_t)(p->region_bytes[DDP_REGION_INPUT] ? p->region_bytes[DDP_REGION_INPUT] : 64),
                         &g->staging) &&
         place_arguments(rt, g) && replace_mirrors(rt, g) && ddp_to_device(rt, DDP_REGION_CONSTANTS);
    if (!ok)
        return ddp_fail(err, len, "setting up the %s GPU (%s): %s", dev->ops->name, dev->info.name, dev->error);
    plan_convolutions(rt, g);
    return true;
}

void ddp_gpu_detach(ddp_runtime *rt) {
    ddp_gpu *g = rt->gpu;
    if (!g)
        return;
    if (g->dev)
        g->dev->ops->synchronize(g->dev);
    for (int r = 0; r < DDP_REGION_COUNT; r++)
        if (g->pinned[r]) {
            g->dev->ops->host_free(g->dev, g->pinned[r]);
            rt->region[r] = NULL;
        }
    for (int ph = 0; ph < DDP_PHASE_COUNT; ph++)
        free(g->step_args[ph]);
    free(g->marked);
    free(g->buffer);
    ddp_device_close(g->dev);
    free(g);
    rt->gpu = NULL;
}

/* ---------------------------------------------------------- transfers */

bool ddp_gpu_exchange(ddp_runtime *rt, int region, int64_t offset, int64_t bytes, void *host, bool up) {
    ddp_device *d = rt->gpu->dev;
    ddp_dptr at = rt->gpu->region[region] + (ddp_dptr)offset;
    if (up)
        return d->ops->upload(d, DDP_STREAM_COMPUTE, at, host, (size_t)bytes) || failed(rt, "copying to the GPU");
    if (!d->ops->download(d, DDP_STREAM_COMPUTE, host, at, (size_t)bytes) ||
        !d->ops->record(d, DDP_STREAM_COMPUTE, EVENT_HOST))
        return failed(rt, "copying from the GPU");
    return await(rt, EVENT_HOST, "copying from the GPU");
}

bool ddp_to_device(ddp_runtime *rt, int region) {
    return !rt->gpu || ddp_gpu_exchange(rt, region, 0, rt->program->region_bytes[region], rt->region[region], true);
}

bool ddp_to_host(ddp_runtime *rt, int region) {
    return !rt->gpu || ddp_gpu_exchange(rt, region, 0, rt->program->region_bytes[region], rt->region[region], false);
}

bool ddp_average_moved(ddp_runtime *rt, bool up) {
    char *average = ddp_average(rt);
    if (!rt->gpu || !average)
        return true;
    int64_t offset = average - (char *)rt->region[DDP_REGION_STATE];
    return ddp_gpu_exchange(rt, DDP_REGION_STATE, offset, rt->program->param_count * rt->elem_size, average, up);
}

bool ddp_batch_writable(ddp_runtime *rt) {
    ddp_gpu *g = rt->gpu;
    if (!g || !g->upload_queued)
        return true;
    g->upload_queued = false;
    return g->dev->ops->synchronize_event(g->dev, EVENT_UPLOADED) || failed(rt, "uploading a batch");
}

bool ddp_batch_uploaded(ddp_runtime *rt) {
    ddp_gpu *g = rt->gpu;
    if (!g)
        return true;
    ddp_device *d = g->dev;
    size_t bytes = (size_t)rt->program->region_bytes[DDP_REGION_INPUT];
    g->upload_queued = true;
    /* The staging area is written only once the compute stream has copied the batch
     * before out of it: the upload stream does not wait for the compute stream
     * otherwise, and a batch still queued there would be overwritten before its step. */
    return (d->ops->wait(d, DDP_STREAM_UPLOAD, EVENT_STAGING_FREE) &&
            d->ops->upload(d, DDP_STREAM_UPLOAD, g->staging, rt->region[DDP_REGION_INPUT], bytes) &&
            d->ops->record(d, DDP_STREAM_UPLOAD, EVENT_UPLOADED) &&
            d->ops->wait(d, DDP_STREAM_COMPUTE, EVENT_UPLOADED) &&
            d->ops->copy(d, DDP_STREAM_COMPUTE, g->region[DDP_REGION_INPUT], g->staging, bytes) &&
            d->ops->record(d, DDP_STREAM_COMPUTE, EVENT_STAGING_FREE)) ||
           failed(rt, "uploading a batch");
}

bool ddp_accumulators_send(ddp_runtime *rt) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    size_t bytes = (size_t)rt->program->region_bytes[DDP_REGION_ACCUM];
    return (d->ops->download(d, DDP_STREAM_COMPUTE, rt->region[DDP_REGION_ACCUM], g->region[DDP_REGION_ACCUM],
                             bytes) &&
            d->ops->record(d, DDP_STREAM_COMPUTE, EVENT_FIGURES)) ||
           failed(rt, "copying the loss and metrics from the GPU");
}

bool ddp_accumulators_arrived(ddp_runtime *rt) {
    return await(rt, EVENT_FIGURES, "copying the loss and metrics from the GPU");
}

bool ddp_gpu_zero(ddp_runtime *rt, int region) {
    ddp_gpu *g = rt->gpu;
    size_t bytes = (size_t)rt->program->region_bytes[region];
    return g->dev->ops->fill(g->dev, DDP_STREAM_COMPUTE, g->region[region], 0, bytes) ||
           failed(rt, "clearing memory on the GPU");
}

/* --------------------------------------------------------------- the walk */

static int64_t live(const ddp_runtime *rt, ddp_dim d) {
    return d.fixed + d.per_sample * rt->scalars[DDP_S_LOCAL_BATCH].i;
}

/* A product at the live batch: one cuBLAS call, or one a group (head) of a batched
 * product, each strided over the batch. */
static bool queue_gemm(ddp_runtime *rt, const ddp_gemm *gm) {
    ddp_gpu *g = rt->gpu;
    int64_t m = live(rt, gm->m), n = live(rt, gm->n), k = live(rt, gm->k);
    if (m == 0 || n == 0 || live(rt, gm->batches) == 0)
        return true;
    for (int64_t j = 0; j < gm->groups; j++) {
        ddp_device_gemm c = ddp_gemm_at(rt, gm, j, g->buffer[gm->a], g->buffer[gm->b], g->buffer[gm->c]);
        if (k == 0 && gm->beta == 0) { /* an empty batch: the product is zero; C is packed when k is batched */
            if (!g->dev->ops->fill(g->dev, DDP_STREAM_COMPUTE, c.c, 0,
                                   (size_t)(m * n * ddp_dtype_size(rt->program->buffers[gm->c].dtype))))
                return false;
        } else if (k && !g->dev->ops->gemm(g->dev, DDP_STREAM_COMPUTE, &c))
            return false;
    }
    return true;
}

/* A library convolution at the live batch. With no image (an empty shard) there is
 * nothing to do, but a filters' gradient that overwrites is zero. */
static bool queue_conv(ddp_runtime *rt, const ddp_conv *cv) {
    ddp_gpu *g = rt->gpu;
    ddp_device_conv c = ddp_conv_at(rt, cv);
    c.x = g->buffer[cv->x], c.filters = g->buffer[cv->filters], c.y = g->buffer[cv->y];
    c.workspace = g->buffer[cv->workspace];
    if (c.n == 0)
        return c.mode != DDP_CONV_BACKWARD_FILTER || c.beta != 0 ||
               g->dev->ops->fill(g->dev, DDP_STREAM_COMPUTE, c.filters, 0,
                                 (size_t)rt->program->buffers[cv->filters].bytes);
    return g->dev->ops->conv(g->dev, DDP_STREAM_COMPUTE, &c);
}

int64_t ddp_index_grid(const ddp_kernel *k, int64_t indices) {
    int64_t threads = k->threads, period = k->period > 1 ? k->period : 1;
    int64_t blocks = (indices + threads - 1) / threads, most = DDP_INDEX_GRID_THREADS / threads;
    int64_t whole = period / ddp_gcd(period, threads); /* the fewest blocks whose threads make whole periods */
    if (blocks > most)
        blocks = most;
    return (blocks + whole - 1) / whole * whole;
}

static bool queue_kernel(ddp_runtime *rt, int phase, int64_t i) {
    ddp_gpu *g = rt->gpu;
    const ddp_program *p = rt->program;
    const ddp_step *s = &p->phases[phase].steps[i];
    const ddp_kernel *k = &p->kernels[s->index];
    int64_t end = live(rt, s->range);
    if (end == 0) /* nothing to do (a worker's empty shard); the GPU refuses empty grids */
        return true;
    uint32_t threads = (uint32_t)k->threads;
    int64_t blocks = k->launch == DDP_LAUNCH_BLOCK ? end : ddp_index_grid(k, end);
    if (blocks > 0x7fffffff)
        return ddp_device_fail(g->dev, "kernel %s: %lld blocks are more than a grid holds", k->name,
                               (long long)blocks);
    return g->dev->ops->launch(g->dev, DDP_STREAM_COMPUTE, s->index, (uint32_t)blocks, threads,
                               (uint32_t)k->shared_bytes, g->step_args[phase][i], g->scalars, 0, end);
}

/* ------------------------------------------------------------ the buckets */

/* Gradient bucket b final on the compute stream: its all-reduce queued on the
 * communication stream behind it (NCCL), or its copy into the pinned mirror queued,
 * with an event the host watches (the ring). b -1: the whole vector as one. */
static bool bucket_ready(ddp_runtime *rt, int64_t b) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    const ddp_program *p = rt->program;
    int64_t begin = b < 0 ? 0 : p->buckets[b].begin, end = b < 0 ? p->param_count : p->buckets[b].end;
    int64_t at = ddp_wire_offset(p, begin), wire = ddp_wire_dtype(p); /* the gradients, or their bf16 copy */
    ddp_dptr data = g->region[DDP_REGION_GRADS] + (ddp_dptr)at;
    if (g->nccl) {
        char err[2048];
        if (!d->ops->record(d, DDP_STREAM_COMPUTE, EVENT_TO_COMM) || !d->ops->wait(d, DDP_STREAM_COMM, EVENT_TO_COMM))
            return failed(rt, "queueing a gradient bucket's all-reduce");
        if (ddp_nccl_allreduce(g->nccl, data, end - begin, wire, b < 0 ? 0 : b, b < 0 ? 1 : p->nbuckets,
                               g->step, err, sizeof err))
            return true;
        if (!nccl_failed(rt))
            snprintf(rt->device_error, sizeof rt->device_error, "%s", err);
        return false;
    }
    g->marked[g->nmarked++] = b;
    return (d->ops->download(d, DDP_STREAM_COMPUTE, (char *)rt->region[DDP_REGION_GRADS] + at, data,
                             (size_t)((end - begin) * ddp_dtype_size(wire))) &&
            d->ops->record(d, DDP_STREAM_COMPUTE, DDP_BUCKET_EVENT(b < 0 ? 0 : b, true))) ||
           failed(rt, "copying a gradient bucket from the GPU");
}

static bool summing(const ddp_gpu *g) {
    return g->nccl || g->staged;
}

/* Whether backward's markers hand its buckets on: summing, and not on a batch before
 * a step's last (accumulate_batches), whose gradients go no further than their sum. */
static bool markers_act(const ddp_runtime *rt) {
    return summing(rt->gpu) && !rt->holding_gradients;
}

bool ddp_gpu_sum_with_nccl(ddp_runtime *rt, ddp_nccl *n) {
    ddp_gpu *g = rt->gpu;
    g->nccl = n;
    g->whole = rt->program->nbuckets == 0 || rt->program->nbuckets > DDP_MAX_BUCKET_EVENTS;
    return true;
}

int ddp_gpu_stage_buckets(ddp_runtime *rt, char *err, size_t len) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    const ddp_program *p = rt->program;
    int r = DDP_REGION_GRADS;
    if (p->nbuckets > DDP_MAX_BUCKET_EVENTS)
        return 0;
    void *m = d->ops->host_alloc(d, (size_t)(p->region_bytes[r] ? p->region_bytes[r] : 64));
    if (!m || !(g->marked = calloc((size_t)p->nbuckets + 1, sizeof *g->marked))) {
        if (m)
            d->ops->host_free(d, m);
        ddp_fail(err, len, "cannot pin %lld bytes of host memory for the gradients", (long long)p->region_bytes[r]);
        return -1;
    }
    memcpy(m, rt->region[r], (size_t)p->region_bytes[r]);
    free(rt->region[r]);
    rt->region[r] = g->pinned[r] = m;
    for (int64_t i = 0; i < p->nbuffers; i++) /* the buffer table points into the mirror */
        if (p->buffers[i].region == r)
            rt->buffers[i] = (char *)m + p->buffers[i].offset;
    g->staged = true;
    return 1;
}

int ddp_gpu_next_bucket(ddp_runtime *rt, int64_t *bucket) {
    ddp_gpu *g = rt->gpu;
    if (!g->staged || g->handed == g->nmarked)
        return 0;
    int64_t b = g->marked[g->handed++];
    *bucket = b;
    return await(rt, DDP_BUCKET_EVENT(b < 0 ? 0 : b, true), "copying a gradient bucket from the GPU") ? 1 : -1;
}

bool ddp_gpu_buckets_summed(const ddp_runtime *rt) {
    return rt->gpu && summing(rt->gpu);
}

/* Poisoning (--poison): planned memory NaN before a sequence, each value's bytes NaN
 * again after its last use. */
static bool poison(ddp_runtime *rt, int phase, int64_t first, int64_t sequence, int64_t position, bool start) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    const ddp_program *p = rt->program;
    if (start && first == 0 && (phase == DDP_PHASE_FORWARD || phase == DDP_PHASE_EVAL))
        return d->ops->fill(d, DDP_STREAM_COMPUTE, g->region[DDP_REGION_ARENA], 0xff,
                            (size_t)p->region_bytes[DDP_REGION_ARENA]) &&
               d->ops->fill(d, DDP_STREAM_COMPUTE, g->region[DDP_REGION_WORKSPACE], 0xff,
                            (size_t)p->region_bytes[DDP_REGION_WORKSPACE]);
    for (int64_t b = 0; !start && b < p->nbuffers; b++) {
        const ddp_buffer *buf = &p->buffers[b];
        if (buf->sequence == sequence && buf->last_step == position &&
            !d->ops->fill(d, DDP_STREAM_COMPUTE, g->buffer[b], 0xff, (size_t)buf->bytes))
            return false;
    }
    return true;
}

/* --profile: a training phase's steps each between two timing marks. */
static bool timed(const ddp_runtime *rt, int phase) {
    return rt->profile && phase != DDP_PHASE_EVAL && rt->gpu->dev->ops->mark;
}

/* Each timed step's time, from its marks, told to the profile; a step of the path not
 * taken ran nothing between its marks and is not told. */
static bool read_marks(ddp_runtime *rt, int phase, int64_t first, int64_t count) {
    ddp_device *d = rt->gpu->dev;
    const ddp_step *steps = rt->program->phases[phase].steps;
    for (int64_t i = 0; i < count && i + 1 < DDP_MARKS; i++) {
        double seconds;
        if (!ddp_path_runs(steps[first + i].path, rt->gpu->path))
            continue;
        if (!d->ops->elapsed(d, (int)i, (int)i + 1, &seconds))
            return failed(rt, "reading the profile's timing events");
        ddp_profile_step(rt->profile, phase, first + i, seconds);
    }
    return true;
}

static bool queue_steps(ddp_runtime *rt, int phase, int64_t first, int64_t count, int64_t sequence,
                        int64_t position) {
    const ddp_phase *ph = &rt->program->phases[phase];
    ddp_device *d = rt->gpu->dev;
    bool timing = timed(rt, phase);
    if (count > ph->count - first)
        count = ph->count - first;
    if (rt->options.poison && !poison(rt, phase, first, sequence, position, true))
        return failed(rt, "poisoning");
    if (timing && !d->ops->mark(d, DDP_STREAM_COMPUTE, 0))
        return failed(rt, "recording a timing event");
    for (int64_t i = first; i < first + count; i++, position++) {
        const ddp_step *s = &ph->steps[i];
        bool ok = true, ours = ddp_path_runs(s->path, rt->gpu->path);
        if (ours && s->kind == DDP_STEP_KERNEL)
            ok = queue_kernel(rt, phase, i);
        else if (ours && s->kind == DDP_STEP_GEMM)
            ok = queue_gemm(rt, &rt->program->gemms[s->index]);
        else if (ours && s->kind == DDP_STEP_CONV)
            ok = queue_conv(rt, &rt->program->convs[s->index]);
        else if (s->kind == DDP_STEP_BUCKET_READY && markers_act(rt) && !rt->gpu->whole)
            ok = bucket_ready(rt, s->index);
        /* WAIT_BUCKETS: NCCL's is queued before the optimizer phase; the ring's
         * gradients are summed and uploaded before it (train.c) */
        if (!ok && s->kind == DDP_STEP_BUCKET_READY)
            return false;
        if (!ok)
            return failed(rt, s->kind == DDP_STEP_KERNEL ? rt->program->kernels[s->index].name
                              : s->kind == DDP_STEP_CONV ? "a convolution" : "a matrix product");
        if (rt->options.poison && !poison(rt, phase, first, sequence, position, false))
            return failed(rt, "poisoning");
        if (timing && i - first + 1 < DDP_MARKS && !d->ops->mark(d, DDP_STREAM_COMPUTE, (int)(i - first + 1)))
            return failed(rt, "recording a timing event");
    }
    return !timing || read_marks(rt, phase, first, count);
}

/* Whether this run of the phase may be (or be served by) its graph: the whole phase,
 * a full batch, and nothing that needs each step apart (poisoning). */
static bool graph_fits(const ddp_runtime *rt, int phase, int64_t first, int64_t count) {
    const ddp_program *p = rt->program;
    bool markers_on = phase == DDP_PHASE_BACKWARD && markers_act(rt) && !rt->gpu->whole;
    return !rt->options.no_graphs && !rt->options.poison && !timed(rt, phase) && rt->gpu->dev->ops->capture_begin &&
           !markers_on && first == 0 &&
           count >= p->phases[phase].count && rt->scalars[DDP_S_LOCAL_BATCH].i == p->settings.batch_per_replica;
}

/* The phase's graph launched, captured first if it is not yet. */
static bool run_graph(ddp_runtime *rt, int phase, int64_t sequence, int64_t position) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    if (!g->captured[phase]) {
        if (!d->ops->capture_begin(d, DDP_STREAM_COMPUTE))
            return failed(rt, "capturing a CUDA graph (--no-cuda-graphs runs without)");
        bool queued = queue_steps(rt, phase, 0, rt->program->phases[phase].count, sequence, position);
        if (!d->ops->capture_end(d, DDP_STREAM_COMPUTE, phase) || !queued)
            return queued ? failed(rt, "capturing a CUDA graph (--no-cuda-graphs runs without)") : false;
        g->captured[phase] = true;
        static const char *const names[DDP_PHASE_COUNT] = {"forward", "backward", "optimizer", "evaluation"};
        ddp_log_only("GPU: the %s phase runs as a CUDA graph from its run %lld on\n", names[phase],
                     (long long)g->full_runs[phase]);
    }
    return d->ops->graph_launch(d, DDP_STREAM_COMPUTE, phase) ||
           failed(rt, "launching a CUDA graph (--no-cuda-graphs runs without)");
}

/* A training phase of a lone worker on a full batch: run step by step in the first
 * step (the warm-up), captured into the whole-step graph in the second, a part of
 * that graph from then on (the forward phase's call launches it). A held batch
 * (accumulate_batches) is a step of forward and backward alone, with a graph of its
 * own, met the same way. */
static bool run_in_step_graph(ddp_runtime *rt, int phase, int64_t sequence, int64_t position) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    int held = rt->holding_gradients, *state = &g->step_graph[held], slot = held ? GRAPH_HELD_BATCH : GRAPH_STEP;
    int64_t count = rt->program->phases[phase].count;
    if (phase == DDP_PHASE_FORWARD) {
        memcpy(g->step_scalars, rt->scalars, sizeof rt->scalars);
        if (!d->ops->upload(d, DDP_STREAM_COMPUTE, g->scalars, rt->scalars, sizeof rt->scalars))
            return failed(rt, "copying the step's scalars to the GPU");
        if (*state == STEP_CAPTURED) {
            *state = STEP_LAUNCHED;
            return d->ops->graph_launch(d, DDP_STREAM_COMPUTE, slot) ||
                   failed(rt, "launching the step's CUDA graph (--no-cuda-graphs runs without)");
        }
        if (g->step_runs[held]++ == 0) /* the warm-up */
            return queue_steps(rt, phase, 0, count, sequence, position);
        *state = STEP_CAPTURING;
        return (d->ops->capture_begin(d, DDP_STREAM_COMPUTE) ||
                failed(rt, "capturing the step's CUDA graph (--no-cuda-graphs runs without)")) &&
               queue_steps(rt, phase, 0, count, sequence, position);
    }
    if (*state == STEP_NONE || *state == STEP_CAPTURED) /* the warm-up */
        return (d->ops->upload(d, DDP_STREAM_COMPUTE, g->scalars, rt->scalars, sizeof rt->scalars) ||
                failed(rt, "copying the step's scalars to the GPU")) &&
               queue_steps(rt, phase, 0, count, sequence, position);
    if (memcmp(g->step_scalars, rt->scalars, sizeof rt->scalars) != 0)
        return ddp_device_fail(d, "they changed between its phases, which its CUDA graph cannot follow (run with "
                                  "--no-cuda-graphs)") || failed(rt, "the step's scalars");
    bool capturing = *state == STEP_CAPTURING;
    bool ok = !capturing || queue_steps(rt, phase, 0, count, sequence, position);
    if (phase != (held ? DDP_PHASE_BACKWARD : DDP_PHASE_OPTIMIZER))
        return ok;
    *state = STEP_CAPTURED;
    if (!capturing)
        return ok;
    bool ended = d->ops->capture_end(d, DDP_STREAM_COMPUTE, slot);
    if (!ok || !ended || !d->ops->graph_launch(d, DDP_STREAM_COMPUTE, slot))
        return ok ? failed(rt, "capturing the step's CUDA graph (--no-cuda-graphs runs without)") : false;
    if (held)
        ddp_log_only("GPU: each batch a step sums before its last (accumulate_batches) runs as one CUDA graph from "
                     "the second on\n");
    else
        ddp_log_only("GPU: the whole training step runs as a CUDA graph from its step %lld on\n",
                     (long long)g->step_runs[0]);
    return true;
}

bool ddp_gpu_run_steps(ddp_runtime *rt, int phase, int64_t first, int64_t count, int64_t sequence,
                       int64_t position) {
    ddp_gpu *g = rt->gpu;
    ddp_device *d = g->dev;
    if (rt->options.step_graph && phase != DDP_PHASE_EVAL && graph_fits(rt, phase, first, count))
        return run_in_step_graph(rt, phase, sequence, position);
    bool backward = phase == DDP_PHASE_BACKWARD && markers_act(rt) && first == 0;
    if (backward) {
        g->nmarked = g->handed = 0;
        g->step = rt->scalars[DDP_S_STEP].i;
        if (g->nccl)
            ddp_nccl_begin_step(g->nccl);
    }
    /* the optimizer reads the sums: it waits for the collectives, on the device */
    if (phase == DDP_PHASE_OPTIMIZER && first == 0 && g->nccl &&
        (!d->ops->record(d, DDP_STREAM_COMM, EVENT_COMM_DONE) || !d->ops->wait(d, DDP_STREAM_COMPUTE, EVENT_COMM_DONE)))
        return failed(rt, "queueing the optimizer behind the gradients' all-reduce");
    /* the scalars travel from ordinary memory, so they are taken as they are now */
    if (!d->ops->upload(d, DDP_STREAM_COMPUTE, g->scalars, rt->scalars, sizeof rt->scalars))
        return failed(rt, "copying the step's scalars to the GPU");
    bool ok = graph_fits(rt, phase, first, count) && g->full_runs[phase]++ > 0
                  ? run_graph(rt, phase, sequence, position)
                  : queue_steps(rt, phase, first, count, sequence, position);
    return ok && (!backward || !g->whole || first + count < rt->program->phases[phase].count || bucket_ready(rt, -1));
}

bool ddp_gpu_synchronize(ddp_runtime *rt) {
    return !rt->gpu || rt->gpu->dev->ops->synchronize(rt->gpu->dev) || failed(rt, "running on the GPU");
}

const ddp_device_info *ddp_gpu_info(const ddp_runtime *rt) {
    return rt->gpu ? &rt->gpu->dev->info : NULL;
}

const char *ddp_gpu_convolutions(const ddp_runtime *rt) {
    if (rt->gpu && rt->gpu->no_library[0])
        return rt->gpu->no_library;
    if (ddp_gpu_path(rt) == DDP_PATH_GENERATED)
        return rt->gpu && !rt->gpu->dev->ops->conv ? rt->gpu->dev->convolutions : "generated: im2col and products";
    if (rt->gpu)
        return rt->gpu->dev->convolutions;
    return rt->wide_cpu ? "the CPU's: tiles of columns and products, narrow filters by FMA"
                        : "the CPU's: tiles of columns and products";
}

bool ddp_gpu_times_engines(const ddp_runtime *rt) {
    /* the emulated device's reference convolution has no engines to time */
    return rt->gpu && rt->gpu->path == DDP_PATH_LIBRARY && rt->gpu->dev->timed_conv_search &&
           strcmp(rt->gpu->dev->ops->name, "cuda") == 0;
}

int ddp_gpu_path(const ddp_runtime *rt) {
    return rt->gpu ? rt->gpu->path : rt->options.convolutions ? rt->options.convolutions : rt->cpu_path;
}

const char *ddp_gpu_backend(const ddp_runtime *rt) {
    return rt->gpu ? rt->gpu->dev->ops->name : "cpu";
}

struct ddp_device *ddp_gpu_device(const ddp_runtime *rt) {
    return rt->gpu ? rt->gpu->dev : NULL;
}
