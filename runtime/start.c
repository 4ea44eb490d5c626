/* start.c: a built program's start, in an order the user cannot get wrong (S4): the
 * command line read over the program's settings; this worker's place in the job; a
 * refusal of what this runtime cannot honour; with several workers the link to the
 * coordinator (so a worker that fails from here on tells the others at once); the
 * datasets read and checked; the executor prepared with parameters from the seed or
 * a saved file; the rendezvous (same program, same settings, same data sizes on every
 * worker), the ring, and a check that every worker holds the same parameters (S5);
 * then the training loop. The device is chosen before the data are read: the GPU
 * visible to this task, the CPU, or the emulated GPU.
 *
 * Exit status: 0 done, 1 a run-time error (data, files, numbers, a job that cannot
 * form), 2 bad usage, 3 another worker of the job was lost, 4 stopped by SIGUSR1 or
 * SIGTERM after a checkpoint, 130 the same after SIGINT. A worker that fails with 1 or
 * 2 tells the job, and the others end with that status rather than 3. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bf16.h"
#include "data_read.h"
#include "device.h"
#include "runtime.h"

static int fail(ddp_job *job, const char *message) {
    ddp_error("%s", message);
    snprintf(job->why, sizeof job->why, "%.1000s", message);
    return 1;
}

/* A dataset read and checked against the program, this worker's part of its inputs
 * checked for values that are not numbers, or false with the message printed. */
static bool open_dataset(const ddp_config *cfg, const ddp_program *p, const ddp_dataset *spec, ddp_data *d,
                         ddp_job *job) {
    char err[2048];
    if (ddp_data_open(spec, cfg->data_root, d, err, sizeof err) && ddp_data_fits(d, p, err, sizeof err) &&
        ddp_data_check_inputs(d, p, cfg->cluster.rank, cfg->cluster.world, err, sizeof err))
        return true;
    ddp_data_free(d);
    fail(job, err);
    return false;
}
/* --synthetic: random samples for the model's input and output, enough for the run's
 * epochs (at least 65536, or steps_per_epoch global batches). */
static const ddp_dataset *synthetic_like(const ddp_program *p, const ddp_config *cfg, ddp_dataset *d) {
    int64_t batches = cfg->steps_per_epoch > 0 ? cfg->steps_per_epoch : 0;
    int64_t samples = batches * ddp_step_samples(p, cfg->cluster.world);
    memset(d, 0, sizeof *d);
    d->name = "synthetic";
    d->kind = DDP_DATA_SYNTHETIC;
    d->scale = 1;
    d->classes = p->output_elems > p->label_positions ? p->output_elems / p->label_positions : 2;
    d->samples = samples > 65536 ? samples : 65536;
    return d;
}

/* ----------------------------------------------------------------- devices */

static int gpus_per_worker(const ddp_program *p) {
    return p->settings.gpus_per_worker > 1 ? (int)p->settings.gpus_per_worker : 1;
}

/* Replica i of a worker of n: its rank and local rank among the job's replicas. */
static ddp_cluster replica_place(const ddp_cluster *worker, int n, int i) {
    ddp_cluster c = *worker; /* the lists stay the worker's */
    c.rank = worker->rank * n + i;
    c.world = worker->world * n;
    c.local_rank = worker->local_rank * n + i;
    c.local_world = worker->local_world * n;
    return c;
}

/* Variables that say this task was given GPUs: inside such a job, not using one is an
 * error, not a silent CPU run. */
static const char *gpus_given(void) {
    static const char *const vars[] = {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v && strcmp(v, "NoDevFiles") != 0)
            return vars[i];
    }
    return NULL;
}

/* Which GPU of those visible: the only one, or the local rank's when there is one per
 * replica of the node (S4, S14); -1 with why not. */
static int gpu_ordinal(const ddp_cluster *c, int visible, int per_worker, char *err, size_t len) {
    if (visible == 1 && per_worker == 1)
        return 0;
    if (visible >= c->local_world)
        return (int)c->local_rank;
    if (per_worker > 1) {
        const char *v = getenv("CUDA_VISIBLE_DEVICES");
        ddp_fail(err, len, "gpus_per_worker = %d: this node's %lld task%s need %lld GPUs, but this task sees %d%s%s%s: "
                           "give each task %d GPUs (srun --gpus-per-task=%d), or lower gpus_per_worker",
                 per_worker, (long long)(c->local_world / per_worker), c->local_world / per_worker == 1 ? "" : "s",
                 (long long)c->local_world, visible, v ? " (CUDA_VISIBLE_DEVICES=" : "", v ? v : "", v ? ")" : "",
                 per_worker, per_worker);
        return -1;
    }
    ddp_fail(err, len, "this task sees %d GPUs, but %lld tasks of the job share its node: give each task its own "
                       "GPU (srun --gpus-per-task=1), or let every task see one GPU per task of the node",
             visible, (long long)c->local_world);
    return -1;
}

/* The device this worker trains on: *dev NULL for the CPU; false with why. */
/* No GPU can be used, where one was asked for (--device gpu) or given (a job's GPUs). */
static bool unusable(const ddp_config *cfg, const char *given, const char *why, char *err, size_t len) {
    if (cfg->device == DDP_DEVICE_GPU)
        return ddp_fail(err, len, "--device gpu: no usable GPU: %s", why);
    return ddp_fail(err, len, "this task was given GPUs (%s=%s), but none is usable: %s. Pass --device cpu to train "
                              "on the CPU instead", given, getenv(given), why);
}

static bool choose_device(ddp_config *cfg, const ddp_program *p, ddp_device **dev, char *err, size_t len) {
    *dev = NULL;
    if (cfg->device == DDP_DEVICE_CPU)
        return true;
    if (cfg->device == DDP_DEVICE_EMULATED)
        return ddp_device_open_emulated(p, dev, err, len);
    char why[1024];
    int visible = ddp_cuda_device_count(why, sizeof why);
    const char *given = gpus_given();
    if (visible <= 0) {
        if (cfg->device == DDP_DEVICE_AUTO && !given) {
            cfg->device = DDP_DEVICE_CPU;
            return true;
        }
        return unusable(cfg, given, visible == 0 ? "the CUDA driver sees no GPU" : why, err, len);
    }
    int ordinal = gpu_ordinal(&cfg->cluster, visible, gpus_per_worker(p), err, len);
    if (ordinal < 0)
        return false;
    if (!ddp_device_open_cuda(p, ordinal, dev, why, sizeof why)) {
        if (cfg->device == DDP_DEVICE_AUTO && !given) { /* said, not silent */
            ddp_error("a GPU is visible but cannot be used: %s; training on the CPU (--device gpu makes this an "
                      "error)", why);
            cfg->device = DDP_DEVICE_CPU;
            return true;
        }
        return unusable(cfg, given, why, err, len);
    }
    cfg->device = DDP_DEVICE_GPU;
    return true;
}

/* --check on a machine without a GPU (a login node) can check the rest on the
 * emulated one, whose memory is the host's. */
static const char *check_elsewhere(const ddp_config *cfg) {
    return cfg->check ? "; --check --device emulated checks the rest on a machine without a GPU (in the "
                        "host's memory)"
                      : "";
}

/* gpus_per_worker > 1 puts each replica on a GPU: none is no CPU run. */
static bool gpus_found(const ddp_config *cfg, const ddp_program *p, const ddp_device *dev, char *err, size_t len) {
    return dev || gpus_per_worker(p) == 1 ||
           ddp_fail(err, len, "gpus_per_worker = %d puts each replica on a GPU of its own, but this worker trains "
                              "on the CPU (--device cpu, or no GPU found): run it on GPUs, or remove the setting%s",
                    gpus_per_worker(p), check_elsewhere(cfg));
}

/* precision = bf16 is for a GPU's bf16 tensor cores (or the emulated device, which
 * models them): the CPU's products go through f32 BLAS, where bf16 would only cost
 * accuracy, so a CPU worker refuses rather than run something else than was asked. */
static bool precision_runs_here(const ddp_config *cfg, const ddp_program *p, const ddp_device *dev, char *err,
                                size_t len) {
    return dev || p->settings.precision != DDP_PRECISION_BF16 ||
           ddp_fail(err, len, "precision = bf16 runs on a GPU (compute capability 8.0 or later), but this worker "
                              "trains on the CPU (--device cpu, or no usable GPU found): set precision = fp32 to "
                              "train on the CPU%s", check_elsewhere(cfg));
}

/* The GPU, said: on stderr by every worker of a job (each its own), in the banner by
 * worker 0; the plan's memory checked against what the device has free. */
static bool attach_device(ddp_runtime *rt, ddp_device *dev, const ddp_config *cfg, char *err, size_t len) {
    const ddp_program *p = rt->program;
    int64_t needed = 0;
    for (int r = 0; r < DDP_REGION_COUNT; r++)
        needed += p->region_bytes[r];
    needed += p->region_bytes[DDP_REGION_INPUT]; /* the next batch's staging */
    const ddp_device_info *info = &dev->info;
    if (info->free_bytes > 0 && needed > info->free_bytes) {
        ddp_fail(err, len, "%s (%s) has %.2f GiB free, but the program's memory plan needs %.2f GiB: lower "
                           "batch_per_replica, or free the GPU", info->name, info->uuid,
                 (double)info->free_bytes / (1 << 30), (double)needed / (1 << 30));
        ddp_device_close(dev);
        return false;
    }
    if (cfg->cluster.world > 1)
        ddp_error("training on %s %s, %s (bus %s)", dev->ops->name, info->name, info->uuid, info->bus);
    return ddp_gpu_attach(rt, dev, err, len);
}

/* How the gradients travel between several workers: NCCL where the replicas are on
 * GPUs and it can be loaded, unless the program asks for the ring; the ring otherwise.
 * False with why when the program asks for NCCL and it cannot serve. */
static bool choose_communication(ddp_config *cfg, const ddp_program *p, const ddp_device *dev, char *err,
                                 size_t len) {
    int asked = p->settings.communication;
    char *text = cfg->communication, about[1300], why[1400];
    size_t room = sizeof cfg->communication;
    cfg->nccl = false;
    /* alone, nothing is summed; a lone GPU worker still uses NCCL when asked (one rank) */
    if (cfg->cluster.world == 1 && (asked != DDP_COMM_NCCL || !dev))
        return true;
    if (!dev) {
        if (asked == DDP_COMM_NCCL)
            return ddp_fail(err, len, "communication = nccl needs every replica on a GPU, but this worker trains on the "
                                      "CPU: set communication = auto (or ring), or run it where it is given a GPU");
        snprintf(text, room, "the TCP ring, bucket by bucket during backward");
        return true;
    }
    if (asked == DDP_COMM_RING) {
        snprintf(text, room, "the TCP ring (communication = ring), each bucket staged through pinned memory during "
                             "backward");
        return true;
    }
    if (ddp_nccl_load(dev->ops->name, about, sizeof about, why, sizeof why)) {
        cfg->nccl = true;
        snprintf(text, room, "%s, each bucket's all-reduce on the communication stream during backward", about);
        return true;
    }
    if (asked == DDP_COMM_NCCL)
        return ddp_fail(err, len, "communication = nccl: %s", why);
    snprintf(text, room, "the TCP ring, each bucket staged through pinned memory (no NCCL: %.1400s)", why);
    return true;
}

/* ------------------------------------------------------------------ the job */


/* What must be the same on every worker, as "setting NAME VALUE" lines the
 * coordinator compares (flags that change the collectives or the numbers). */
static int join_text(char *out, size_t len, const ddp_config *cfg, const ddp_program *p, const ddp_data *train,
                     const ddp_data *validation, int port, const char *address) {
    static const char *const devices[] = {[DDP_DEVICE_AUTO] = "auto", [DDP_DEVICE_CPU] = "cpu",
                                          [DDP_DEVICE_GPU] = "gpu", [DDP_DEVICE_EMULATED] = "emulated"};
    char rate[64] = "the program's";
    if (!isnan(cfg->learning_rate))
        snprintf(rate, sizeof rate, "%.17g", cfg->learning_rate);
    return snprintf(out, len,
                    "rank %lld\nport %d\naddress %s\nsetting program %016llx\nsetting epochs %lld\n"
                    "setting steps_per_epoch %lld\nsetting seed %llu\nsetting learning_rate %s\n"
                    "setting evaluate %s\nsetting predict %s\nsetting synthetic %s\nsetting load %s\n"
                    "setting trace %s\nsetting resume %s\nsetting check %s\n"
                    "setting peer_timeout %lld\nsetting train_samples %lld\nsetting validation_samples %lld\n"
                    "setting device %s\nsetting communication %s",
                    (long long)cfg->cluster.rank, port, address, (unsigned long long)p->hash, (long long)cfg->epochs,
                    (long long)cfg->steps_per_epoch, (unsigned long long)cfg->seed, rate,
                    cfg->evaluate ? "yes" : "no", cfg->predict_path ? "yes" : "no", cfg->synthetic ? "yes" : "no",
                    cfg->load_path ? "yes" : "no",
                    cfg->trace_path ? "yes" : "no", cfg->resume ? "yes" : "no", cfg->check ? "yes" : "no", (long long)cfg->peer_timeout, (long long)train->samples,
                    (long long)validation->samples, devices[cfg->device], cfg->nccl ? "nccl" : "ring");
}

/* Joins the rendezvous and forms the ring of every worker of the job; false with
 * *lost set when another worker's loss stopped it. */
static bool form_ring(ddp_job *job, ddp_config *cfg, const ddp_program *p, const ddp_data *train,
                      const ddp_data *validation, bool *lost, char *err, size_t errlen) {
    const ddp_cluster *c = &cfg->cluster;
    char address[64] = "", text[4096], why[1024];
    int port = c->rank == 0 ? 0 : ddp_cluster_ring_port(c), listener = -1;
    if (cfg->interface && !ddp_interface_address(cfg->interface, address, sizeof address, err, errlen))
        return false;
    if (c->rank != 0 && (listener = ddp_listen(port, why, sizeof why)) < 0)
        return ddp_fail(err, errlen, "the ring cannot listen: %s", why);
    join_text(text, sizeof text, cfg, p, train, validation, port, address);
    ddp_table table;
    bool ok = ddp_link_join(job->link, text, &table, (int)cfg->rendezvous_timeout, lost, err, errlen);
    int world = (int)c->world;
    const char **addresses = calloc((size_t)world, sizeof *addresses), **hosts = calloc((size_t)world, sizeof *hosts);
    int *ports = calloc((size_t)world, sizeof *ports);
    if (ok && (!addresses || !hosts || !ports))
        ok = ddp_fail(err, errlen, "out of memory");
    int64_t nodes = 0; /* without Slurm, the machines are known only now */
    for (int r = 0; ok && r < world; r++) {
        addresses[r] = table.peers[r].address;
        hosts[r] = table.peers[r].host;
        ports[r] = table.peers[r].port;
        int first = 0;
        while (strcmp(table.peers[first].host, hosts[r]) != 0)
            first++;
        nodes += first == r;
    }
    if (ok && !c->tasks)
        cfg->cluster.nodes = nodes;
    if (ok) {
        ddp_ring_peers peers = {(int)c->rank, world, addresses, ports, hosts, p->hash, table.key, listener,
                                ddp_now_ms() + (double)cfg->rendezvous_timeout * 1000, 0, job->link,
                                (int)cfg->peer_timeout};
        ok = (job->ring = ddp_ring_connect(&peers, err, errlen)) != NULL;
        *lost = !ok && ddp_link_lost(job->link, NULL, NULL, 0);
    }
    if (listener >= 0)
        close(listener);
    free(addresses);
    free(hosts);
    free(ports);
    ddp_table_free(&table);
    return ok;
}

/* One worker's end: its goodbye, or the failure the others are told (its own NCCL
 * watchdog's too: the others may still wait in the collective it gave up). */
static void leave_job(ddp_job *job, int status) {
    bool nccl_gave_up = ddp_nccl_failed(job->nccl, NULL, 0) && !ddp_link_lost(job->link, NULL, NULL, 0);
    ddp_nccl_close(job->nccl);
    if (nccl_gave_up)
        ddp_link_abort(job->link, 3, job->why[0] ? job->why : "its NCCL communicator was aborted");
    else if (status == 0 || status == 3 || status == 4 || status == 130 || ddp_link_lost(job->link, NULL, NULL, 0))
        ddp_link_close(job->link); /* 4, 130: every worker stopped alike; after a loss, its echo */
    else
        ddp_link_abort(job->link, status, job->why[0] ? job->why : "it stopped with an error");
    ddp_ring_close(job->ring);
    ddp_trace_free(job->trace);
}

/* Connects to the job's coordinator (worker 0 starts it), first of all, so that a
 * worker that fails afterwards tells the others at once; false with why it could not. */
static bool join_job(ddp_job *job, ddp_config *cfg, char *err, size_t errlen) {
    const ddp_cluster *c = &cfg->cluster;
    ddp_auth auth;
    ddp_link_config lc = {c, &auth, (int)cfg->rendezvous_timeout, (int)cfg->peer_timeout};
    if (!ddp_auth_init(&auth, c, err, errlen) || !(job->link = ddp_link_open(&lc, err, errlen)))
        return false;
    cfg->proven_by = auth.munge ? "munge" : "a shared secret";
    return true;
}

/* The job's NCCL communicator, every worker at once after the ring. */
static bool open_nccl(ddp_job *job, const ddp_config *cfg, ddp_runtime *rt, char *err, size_t len) {
    const ddp_cluster *c = &cfg->cluster;
    ddp_nccl_config nc = {ddp_gpu_device(rt), DDP_STREAM_COMM, job->link, (int)c->rank, (int)c->world,
                          (int)cfg->peer_timeout, (int)cfg->rendezvous_timeout};
    return (job->nccl = ddp_nccl_open(&nc, err, len)) != NULL;
}

/* A command line refused: the other workers are told why, where this worker can tell
 * where its job is (they would otherwise wait for it until the rendezvous timeout). */
static int refuse_usage(const ddp_program *p, ddp_config *cfg) {
    char err[2048], why[700];
    ddp_job job = {0};
    bool resolved = ddp_cluster_resolve(&p->settings, &cfg->cluster_flags, &cfg->cluster, err, sizeof err);
    ddp_cluster process = cfg->cluster;
    if (resolved)
        cfg->cluster = replica_place(&process, gpus_per_worker(p), 0); /* its first replica tells */
    if (resolved && cfg->cluster.world > 1) {
        ddp_set_identity(cfg->prog, cfg->cluster.rank, cfg->cluster.host, true);
        if (join_job(&job, cfg, err, sizeof err)) {
            snprintf(why, sizeof why, "its command line was refused: %s", cfg->usage_error);
            ddp_link_abort(job.link, 2, why);
        }
    }
    if (resolved)
        ddp_cluster_free(&process);
    return 2;
}

/* The loader's threads: on the CPU one, since the compute threads have the CPUs; on a
 * GPU (real or emulated) the worker's CPUs but the main thread's, at most 8: the step
 * leaves them idle, and one thread assembles fewer large images than a GPU trains on. */
static void choose_loader_threads(ddp_config *cfg, const ddp_device *device) {
    int spare = cfg->exec.threads - 1;
    if (cfg->loader_threads == 0)
        cfg->loader_threads = !device || spare < 1 ? 1 : spare > 8 ? 8 : spare;
}

/* --data-stats: the first worker alone reads the dataset (every sample, or of one past
 * 1 GiB of inputs a random 20,000 or as many as make 1 GiB) and prints its mean and std
 * as the dataset takes them: per channel of images [h, w, c], per feature of a table
 * [features], one number for images [h, w] and anything else. The other workers have
 * nothing to do. */
static int print_data_stats(const ddp_program *p, const ddp_config *cfg) {
    if (cfg->cluster.rank != 0)
        return 0;
    ddp_job job = {0};
    ddp_data d = {0};
    const ddp_dataset *spec = cfg->evaluate ? &p->settings.validation : &p->settings.train;
    if (spec->kind == DDP_DATA_SYNTHETIC)
        return fail(&job, "--data-stats: the dataset is synthetic, its values random draws of no file");
    if (!open_dataset(cfg, p, spec, &d, &job))
        return 1;
    int64_t places = d.rank == 1 || d.rank >= 3 ? d.shape[d.rank - 1] : 1, used = 0;
    int64_t sample_bytes = d.elems * data_elem_size[d.elem], by_bytes = (1 << 30) / (sample_bytes ? sample_bytes : 1);
    double *mean = malloc(sizeof *mean * (size_t)places), *std = malloc(sizeof *std * (size_t)places);
    bool ok = mean && std &&
              ddp_data_stats(&d, places, by_bytes > 20000 ? by_bytes : 20000, cfg->seed, mean, std, &used);
    if (ok) {
        char shape[160], read[64] = "every one read";
        if (used < d.samples)
            snprintf(read, sizeof read, "a random %lld read", (long long)used);
        printf("%s: %lld samples of %s, %s, after scale = %g%s:\n", d.where, (long long)d.samples,
               ddp_shape_text(shape, sizeof shape, d.shape, d.rank), read, spec->scale,
               spec->nnormalize ? " (before the mean and std it has)" : "");
        for (int which = 0; which < 2; which++) {
            const double *v = which ? std : mean;
            printf("    %s = %s", which ? "std " : "mean", places > 1 ? "[" : "");
            for (int64_t c = 0; c < places; c++)
                printf("%s%.5g", c ? ", " : "", v[c]);
            printf("%s\n", places > 1 ? "]" : "");
        }
    }
    free(mean);
    free(std);
    ddp_data_free(&d);
    return ok ? 0 : fail(&job, "--data-stats: out of memory");
}

/* --dump-batch FILE: the first batch of epoch 1 as one worker training alone takes it
 * (the first batch_per_replica samples of the epoch's order, scaled, normalised and
 * augmented with the epoch's draws) written as float32 [batch, *input shape] to FILE,
 * and its labels as the loss takes them to FILE-labels.npy; the first worker alone
 * writes. */
static int dump_batch(const ddp_program *p, const ddp_config *cfg) {
    if (cfg->cluster.rank != 0)
        return 0;
    ddp_job job = {0};
    ddp_data d = {0};
    ddp_dataset noise;
    const ddp_dataset *spec = cfg->synthetic ? synthetic_like(p, cfg, &noise) : &p->settings.train;
    if (!open_dataset(cfg, p, spec, &d, &job))
        return 1;
    int64_t n = p->settings.batch_per_replica < d.samples ? p->settings.batch_per_replica : d.samples;
    int64_t per = 1, labels = ddp_label_values(p);
    for (int64_t a = 0; a < p->input_rank; a++)
        per *= p->input_shape[a];
    size_t in_size = (size_t)ddp_dtype_size(ddp_input_dtype(p)), label_size = (size_t)ddp_dtype_size(p->label_dtype);
    int64_t *order = malloc(sizeof *order * (size_t)d.samples), *ids = malloc(sizeof *ids * (size_t)n);
    void *x = malloc(in_size * (size_t)(n * per)), *y = malloc(label_size * (size_t)(n * labels));
    float *x32 = malloc(sizeof *x32 * (size_t)(n * per));
    char err[2048], labels_path[4200];
    bool ok = order && ids && x && y && x32;
    if (ok) {
        ddp_training_order(p, cfg->seed, 0, d.samples, order);
        ddp_draw_key key = {cfg->seed, 0};
        ddp_data_batch(&d, p, order, n, &key, x, y, ids);
        for (int64_t e = 0; e < n * per; e++) /* the program's inputs, as float32 */
            x32[e] = in_size == 2 ? ddp_bf16_to_float(((uint16_t *)x)[e])
                     : in_size == 8 ? (float)((double *)x)[e] : ((float *)x)[e];
        snprintf(labels_path, sizeof labels_path, "%.*s-labels.npy", (int)(strlen(cfg->dump_path) - 4),
                 cfg->dump_path);
        const char *label_descr = p->label_dtype == DDP_I32 ? "<i4" : label_size == 8 ? "<f8" : "<f4";
        int64_t label_dims[1] = {labels};
        ok = ddp_npy_write(cfg->dump_path, "<f4", n, p->input_shape, p->input_rank, x32, sizeof *x32 * (size_t)(n * per),
                           err, sizeof err) &&
             ddp_npy_write(labels_path, label_descr, n, label_dims, labels > 1 || p->label_dtype != DDP_I32, y,
                           label_size * (size_t)(n * labels), err, sizeof err);
        if (ok)
            printf("%s: %lld samples of %s's first batch of epoch 1 (samples %lld, %lld, ...); their labels: %s\n",
                   cfg->dump_path, (long long)n, d.where, (long long)ddp_entry_sample(ids[0], d.samples),
                   (long long)ddp_entry_sample(ids[n > 1], d.samples),
                   labels_path);
    } else {
        snprintf(err, sizeof err, "--dump-batch: out of memory");
    }
    free(order), free(ids), free(x), free(y), free(x32);
    ddp_data_free(&d);
    return ok ? 0 : fail(&job, err);
}

/* One worker's run, from its place in the job (a replica's, with several GPUs a worker)
 * to its exit status. */
static int run_worker(const ddp_program *p, ddp_config cfg) {
    char err[2048], note[1024];
    ddp_job job = {0};
    const ddp_cluster *c = &cfg.cluster;
    ddp_set_identity(cfg.prog, c->rank, c->host, c->world > 1);
    if (cfg.data_stats)
        return print_data_stats(p, &cfg);
    if (cfg.dump_path)
        return dump_batch(p, &cfg);
    int status;
    ddp_data train = {0}, validation = {0};
    ddp_runtime *rt = NULL;
    ddp_report *report = NULL;
    ddp_device *device = NULL; /* chosen early (a missing GPU before the data are read), the runtime's later */
    status = 1;
    if (c->warning[0])
        ddp_error("warning: %s", c->warning);
    if (c->world > 1 && !join_job(&job, &cfg, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    if (!ddp_check_supported(&cfg, p, err, sizeof err) || !choose_device(&cfg, p, &device, err, sizeof err) ||
        !gpus_found(&cfg, p, device, err, sizeof err) || !precision_runs_here(&cfg, p, device, err, sizeof err) ||
        !choose_communication(&cfg, p, device, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    choose_loader_threads(&cfg, device);
    if (cfg.trace_path && !(job.trace = ddp_trace_new())) {
        fail(&job, "out of memory");
        goto done;
    }
    bool has_validation = (p->settings.validation.kind >= 0 || cfg.predict_inputs[0]) && !cfg.synthetic;
    ddp_dataset noise;
    const ddp_dataset *train_spec = cfg.synthetic ? synthetic_like(p, &cfg, &noise) : &p->settings.train;
    ddp_dataset inputs_alone;
    const ddp_dataset *validation_spec = &p->settings.validation;
    if (cfg.predict_inputs[0]) {
        ddp_predict_spec(&cfg, p, &inputs_alone);
        validation_spec = &inputs_alone;
    }
    if ((!cfg.evaluate && !open_dataset(&cfg, p, train_spec, &train, &job)) ||
        (has_validation && !open_dataset(&cfg, p, validation_spec, &validation, &job)))
        goto done;
    /* several workers, or NCCL: the gradients are summed between backward and optimizer */
    cfg.exec.step_graph = c->world == 1 && !cfg.nccl;
    if (!(rt = ddp_open(p, &cfg.exec, err, sizeof err))) {
        fail(&job, err);
        goto done;
    }
    ddp_device *attaching = device;
    device = NULL; /* the runtime's now, even if attaching fails */
    if (attaching && !attach_device(rt, attaching, &cfg, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    rt->epochs = cfg.epochs;
    rt->rate_override = cfg.learning_rate;
    rt->replicas = (int)c->world; /* with several GPUs a worker, workers x gpus_per_worker */
    rt->workers = (int)c->world / gpus_per_worker(p);
    rt->scalars[DDP_S_SEED].i = (int64_t)cfg.seed;
    ddp_init_params(rt, cfg.seed);
    if (cfg.load_path && !ddp_load_params(rt, cfg.load_path, note, sizeof note, err, sizeof err)) {
        fail(&job, err);
        goto done;
    }
    if (!cfg.load_path) /* a loaded file sets it (ddp_load_params) */
        ddp_start_average(rt);
    if (!ddp_to_device(rt, DDP_REGION_PARAMS) || !ddp_to_device(rt, DDP_REGION_STATS) ||
        !ddp_to_device(rt, DDP_REGION_STATE)) {
        fail(&job, rt->device_error);
        goto done;
    }
    bool lost = false;
    if (c->world > 1 && (!form_ring(&job, &cfg, p, &train, &validation, &lost, err, sizeof err) ||
                         !ddp_parameters_agree(rt, job.ring, "at the start", "every worker needs the same seed "
                                               "and --load file", err, sizeof err))) {
        fail(&job, err);
        status = ddp_job_failure_status(&job);
        goto done;
    }
    if (cfg.nccl && !open_nccl(&job, &cfg, rt, err, sizeof err)) {
        fail(&job, err);
        status = ddp_job_failure_status(&job);
        goto done;
    }
    if (!(report = ddp_report_open(&cfg, p, c->rank != 0, err, sizeof err))) {
        fail(&job, err);
        goto done;
    }
    if (cfg.load_path && note[0] && c->rank == 0)
        printf("note: %s\n", note);
    status = ddp_run(rt, &cfg, cfg.evaluate ? NULL : &train, has_validation ? &validation : NULL, report, &job);
done:
    leave_job(&job, status);
    ddp_report_close(report);
    ddp_device_close(device);
    ddp_close(rt);
    ddp_data_free(&train);
    ddp_data_free(&validation);
    return status;
}

/* ----------------------------------------------------- several GPUs a worker */

typedef struct Replica {
    const ddp_program *program;
    ddp_config cfg;             /* its place in the job; the cluster's lists are the process's */
    int status;
    pthread_t thread;
} Replica;

static void *run_replica(void *arg) {
    Replica *r = arg;
    r->status = run_worker(r->program, r->cfg);
    return NULL;
}

/* gpus_per_worker = N (S14): a worker of N replicas, one on each of N GPUs, each
 * run by a thread of its own as a worker of the job, rank worker x N + i of workers x N
 * (so the ring, NCCL, sharding and the figures treat the replicas alike); the exit
 * status is the first failure's (1, 2), else the gravest stop (130, 4, 3), else 0. */
static int run_replicas(const ddp_program *p, const ddp_config *cfg, int n) {
    Replica *replicas = calloc((size_t)n, sizeof *replicas);
    if (!replicas) {
        ddp_error("out of memory");
        return 1;
    }
    int started = 0;
    for (; started < n; started++) {
        Replica *r = &replicas[started];
        *r = (Replica){p, *cfg, 1, 0};
        r->cfg.cluster = replica_place(&cfg->cluster, n, started);
        if (pthread_create(&r->thread, NULL, run_replica, r) != 0) {
            ddp_error("cannot start the thread of replica %d of this worker's %d", started, n);
            break;
        }
    }
    int status = started < n ? 1 : 0;
    for (int i = 0; i < started; i++) {
        pthread_join(replicas[i].thread, NULL);
        int s = replicas[i].status;
        if (status == 1 || status == 2)
            continue;
        status = s == 1 || s == 2 || s > status ? s : status;
    }
    free(replicas);
    return status;
}

/* A worker alone whose replicas form a job among themselves proves them with a secret
 * of its own, drawn here where the user gave none (ddprun draws one the same way). */
static bool adopt_secret(void) {
    unsigned char bytes[16];
    char hex[33];
    if (getenv("DDP_SECRET"))
        return true;
    if (!ddp_random_bytes(bytes, sizeof bytes))
        return false;
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
    return setenv("DDP_SECRET", hex, 1) == 0;
}

int ddp_main(const ddp_program *p, int argc, char **argv) {
    ddp_config cfg;
    int status = ddp_parse_args(&cfg, p, argc, argv);
    if (status == 2)
        return refuse_usage(p, &cfg);
    if (status >= 0)
        return status;
    char err[2048];
    ddp_remove_unfinished_on_signals();
    ddp_set_identity(cfg.prog, 0, "", false);
    ddp_share_identity();
    /* --check on a login node, outside the job the program is for: one worker alone */
    ddp_settings alone = p->settings;
    bool outside = cfg.check && ddp_cluster_outside_job(&p->settings, &cfg.cluster_flags);
    if (outside)
        alone.cluster = DDP_CLUSTER_LOCAL;
    if (!ddp_cluster_resolve(&alone, &cfg.cluster_flags, &cfg.cluster, err, sizeof err)) {
        ddp_error("%s", err);
        return 1;
    }
    if (outside)
        snprintf(cfg.cluster.warning, sizeof cfg.cluster.warning,
                 "the program says cluster = %s, but this process is not in such a job: --check checks it as one "
                 "worker alone", p->settings.cluster == DDP_CLUSTER_SLURM ? "slurm" : "env");
    int n = gpus_per_worker(p);
    if (n > 1 && cfg.cluster.world == 1 && !adopt_secret()) {
        ddp_error("cannot draw a secret for the replicas of this worker");
        ddp_cluster_free(&cfg.cluster);
        return 1;
    }
    ddp_set_identity(cfg.prog, cfg.cluster.rank * n, cfg.cluster.host, cfg.cluster.world * n > 1);
    ddp_share_identity(); /* the helper threads' */
    status = n > 1 ? run_replicas(p, &cfg, n) : run_worker(p, cfg);
    ddp_cluster_free(&cfg.cluster);
    return status;
}
