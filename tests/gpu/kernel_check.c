/* kernel_check.c: every step of the linked model's schedule (kernels with their launch
 * geometry, matrix products through cuBLAS) run by the runtime's GPU executor, against
 * the same step on the CPU.
 *
 *   kernel_check [gpu|emulated] [--training-steps N] [--small-grids] [--conv-search timed]
 *                [--mutate=KIND]
 *
 * (default: the CUDA device 0, one training step).
 * Two runtimes hold the same program: one on the CPU, one on the device. Before each
 * step the CPU's whole state (every region, the scalars) is copied to the device, so a
 * step is judged alone, free of the amplification a deep network gives rounding over a
 * whole pass; after it, every buffer alive at that point must agree: f32 to
 * 1e-4 relative (or 1e-6 absolute), f64 to 1e-10 relative (or 1e-12 absolute), bf16
 * (precision = bf16) to one step of its own, 2^-7 relative (the CPU forms a bf16
 * program's products with the reference of gemm_reference.c, its BLAS having none). The
 * code is the same, but sums run in another order (blocks, cuBLAS) and the GPU's
 * compiler fuses multiplies and adds. A library's convolution is held to the CPU's
 * reference (formed in double) within that, or within what its own sums may round
 * by where that is more (conv_rounding below). Without a usable GPU, `gpu` says so and exits 77
 * (skipped); `emulated` runs everywhere. With --training-steps N the check repeats
 * over N training steps, each on its own batch, the state advancing by the CPU's. The program is linked with the runtime alone:
 * it can be copied to a GPU machine as it is.
 *
 * With --conv-search timed cuDNN's engines are chosen by timing them, as the benchmark
 * chooses them: their trial runs write the outputs, which must be kept where a
 * convolution adds to what its output holds.
 *
 * With --small-grids every index launch gets the fewest blocks its period allows (one
 * block, for most), so that each thread runs many indices: what a large batch does on
 * a GPU, where the grid stops growing (ddp_abi.h's DDP_INDEX_GRID_THREADS), and what
 * the small batches of these checks never reach otherwise.
 *
 * --mutate puts a fault between the executor and the device, as a bug in gpu.c would:
 * `leading-dimension` (every product's A one element short of its rows),
 * `synchronisation` (no waiting: copies to the host read before they land), `copy`
 * (the host reads device memory itself instead of copying it), `threads` (blocks of
 * 2048 threads), `period` (small grids, whose index launches lose a thread a block: a
 * thread's indices then fall in different channels, and what it computed once for
 * its first channel is wrong for the others), `shared` (64 KB of shared memory a block), `capture-sync` (a
 * synchronisation while a CUDA graph is being captured), `capture-pageable` (a copy
 * from ordinary host memory into a capture), `padding` (each convolution through the
 * library with its padding moved a row down: a wrong convolution of the right shape,
 * which must fail within what its rounding is allowed). Each must fail on the emulated
 * device, as on a GPU; tests/gpu/mutations.sh checks that it does.
 *
 * Then the CUDA graphs: each phase run whole three times from the same state and
 * batch, step by step (its first run), captured as a graph (the second) and replayed
 * (the third), must leave every buffer alive at its end the same, bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "conv.h"
#include "device.h"
#include "runtime.h"
#include "test_device.h"

static const ddp_program *const program = &ddp_program_desc;
static const ddp_device_backend *real;   /* the device's own operations, under a mutation */
static ddp_device_backend mutated;
static const char *const phase_names[DDP_PHASE_COUNT] = {"forward", "backward", "optimizer", "evaluation"};

static void fail(const char *what, const char *why) {
    fprintf(stderr, "kernel_check %s: %s: %s\n", program->name, what, why);
    exit(1);
}

/* Whether buffer b holds a value at this point of its sequence. */
static bool alive(const ddp_buffer *b, int64_t sequence, int64_t position) {
    if (b->sequence == 0)
        return true;
    return b->sequence == sequence && b->first_step <= position && position <= b->last_step;
}

static int element_size(int dtype) {
    return dtype == DDP_F64 ? 8 : dtype == DDP_BF16 ? 2 : 4;
}

static double element(const void *p, int dtype, int64_t e) {
    return dtype == DDP_F64    ? ((const double *)p)[e]
           : dtype == DDP_BF16 ? ddp_bf16_to_float(((const uint16_t *)p)[e])
                               : ((const float *)p)[e];
}

/* How far the device's copy of buffer b is from the CPU's, in units of the tolerance
 * (above 1 fails). An element is measured against the larger of its own size and the
 * buffer's root mean square: a sum that cancels to near zero is as exact as its terms.
 * The tolerance is the program's precision's: an f32 program's f64 sums add f32 terms.
 * A bf16 value is one rounding of an f32 result, which the two may round to
 * neighbouring values: one step of bf16 apart, 2^-7 of the value at most. */
static double difference(const ddp_buffer *b, const void *cpu, const void *device, const double *allowed) {
    if (b->dtype == DDP_I32 || b->dtype == DDP_I64)
        return memcmp(cpu, device, (size_t)b->bytes) ? INFINITY : 0;
    if (memcmp(cpu, device, (size_t)b->bytes) == 0)
        return 0;
    bool wide = program->dtype == DDP_F64;
    double rel = wide ? 1e-10 : b->dtype == DDP_BF16 ? 0x1p-7 : 1e-4, abs_tol = wide ? 1e-12 : 1e-6;
    double squares = 0, worst = 0;
    int64_t n = b->bytes / element_size(b->dtype);
    for (int64_t e = 0; e < n; e++) {
        double x = element(cpu, b->dtype, e);
        squares += isfinite(x) ? x * x : 0;
    }
    double rms = n ? sqrt(squares / (double)n) : 0;
    for (int64_t e = 0; e < n; e++) {
        double x = element(cpu, b->dtype, e), y = element(device, b->dtype, e);
        if (isnan(x) && isnan(y))
            continue;
        double d = fabs(x - y);
        double scale = fmax(fmax(fabs(x), rms), 1e-30) * rel;
        double err = d <= abs_tol ? 0 : d / (allowed ? fmax(scale, allowed[e]) : scale);
        if (!(err <= worst))
            worst = isnan(err) ? INFINITY : err;
    }
    return worst;
}

/* The buffers a step reads or writes, as slots: a kernel's arguments, a product's
 * operands. */
static int64_t step_buffers(const ddp_step *step, int64_t *slots, int64_t cap) {
    if (step->kind == DDP_STEP_CONV) { /* not the workspace: what a library leaves there is its own */
        const ddp_conv *c = &program->convs[step->index];
        slots[0] = c->x, slots[1] = c->filters, slots[2] = c->y;
        return 3;
    }
    if (step->kind == DDP_STEP_GEMM) {
        const ddp_gemm *g = &program->gemms[step->index];
        slots[0] = g->a, slots[1] = g->b, slots[2] = g->c;
        return 3;
    }
    int64_t n = 0;
    for (int64_t a = 0; step->kind == DDP_STEP_KERNEL && a < step->nargs && n < cap; a++)
        slots[n++] = step->args[a];
    return n;
}

typedef struct Check {
    ddp_runtime *cpu, *gpu;
    void *device[DDP_REGION_COUNT]; /* what the device holds, copied back */
    int failures, checked;
    double worst;
} Check;

static void *at(void *const *regions, const ddp_buffer *b) {
    return (char *)regions[b->region] + b->offset;
}

/* ------------------------------------------------- a convolution's rounding */

/* A copy of buffer b with every element's sign cleared: its magnitudes, in its type. */
static void *magnitudes(const ddp_buffer *b, const void *from) {
    unsigned char *m = malloc((size_t)b->bytes + 8);
    if (!m)
        fail("allocating", "out of memory");
    memcpy(m, from, (size_t)b->bytes);
    int size = element_size(b->dtype);
    for (int64_t at = size - 1; at < b->bytes; at += size)
        m[at] &= 0x7f; /* little-endian: the sign is the top bit of the last byte */
    return m;
}

/* The slot of the tensor a convolution writes. */
static int64_t conv_written(const ddp_conv *cv) {
    return cv->mode == DDP_CONV_FORWARD ? cv->y : cv->mode == DDP_CONV_BACKWARD_DATA ? cv->x : cv->filters;
}

/* How far a library's convolution may round, element by element of the tensor it
 * writes (NULL where that is not f32 or f64): a sum of K products formed in a type of
 * unit roundoff u, in any order, lies within gamma_K S of the exact sum, gamma_K =
 * K u / (1 - K u) and S the sum of the products' magnitudes (Higham, Accuracy and
 * Stability of Numerical Algorithms, 3.1); S is the reference convolution of the
 * operands' magnitudes. This is more than the relative tolerance only where many
 * terms cancel: in the weight gradients of ResNet-50's first stage (2048 terms at
 * batch 2 on CIFAR-10's images) an H200's cuDNN, summing in f32, was 2.6e-4 of a
 * sum's size from the reference in double, while every other step agreed to 1e-4. A
 * wrong convolution is off by a term's size or more, and TF32 products, where few
 * terms are summed, by far more than this. */
static double *conv_rounding(Check *k, const ddp_conv *cv) {
    ddp_device_conv c = ddp_conv_at(k->cpu, cv);
    int64_t slots[3] = {cv->x, cv->filters, cv->y}, written = conv_written(cv);
    const ddp_buffer *out = &program->buffers[written];
    if (out->dtype != DDP_F32 && out->dtype != DDP_F64)
        return NULL;
    double terms = c.mode == DDP_CONV_FORWARD         ? (double)c.r * c.s * c.c
                   : c.mode == DDP_CONV_BACKWARD_DATA ? (double)c.r * c.s * c.k
                                                      : (double)c.n * c.oh * c.ow;
    double u = out->dtype == DDP_F64 ? 0x1p-53 : 0x1p-24, gamma = terms * u / (1 - terms * u);
    void *m[3];
    for (int i = 0; i < 3; i++)
        m[i] = magnitudes(&program->buffers[slots[i]], at(k->cpu->region, &program->buffers[slots[i]]));
    c.beta = 0;
    ddp_conv_reference(&c, m[0], m[1], m[2]);
    const void *sums = m[written == cv->x ? 0 : written == cv->filters ? 1 : 2];
    int64_t n = out->bytes / (out->dtype == DDP_F64 ? 8 : 4);
    double *allowed = malloc(sizeof *allowed * (size_t)(n + 1));
    if (!allowed)
        fail("allocating", "out of memory");
    for (int64_t e = 0; e < n; e++)
        allowed[e] = gamma * element(sums, out->dtype, e);
    for (int i = 0; i < 3; i++)
        free(m[i]);
    return allowed;
}

static void exchange(Check *k, const ddp_buffer *b, void *host, bool up) {
    if (b->bytes && !ddp_gpu_exchange(k->gpu, (int)b->region, b->offset, b->bytes, host, up))
        fail(up ? "copying to the device" : "copying from the device", k->gpu->device_error);
}

/* Buffer b compared after `what`; the device is then given the CPU's value again, so
 * that the next step starts from the same state on both. */
static void judge(Check *k, const ddp_buffer *b, const char *what, int64_t sequence, int64_t position,
                  const ddp_conv *cv) {
    if (!alive(b, sequence, position))
        return;
    exchange(k, b, at(k->device, b), false);
    double worst = difference(b, at(k->cpu->region, b), at(k->device, b), NULL);
    /* a convolution's result that differs by more than the tolerance: by more than
     * its rounding too? (worked out only then: a reference convolution more) */
    if (worst > 1 && cv && b == &program->buffers[conv_written(cv)]) {
        double *allowed = conv_rounding(k, cv);
        if (allowed)
            worst = difference(b, at(k->cpu->region, b), at(k->device, b), allowed);
        free(allowed);
    }
    k->worst = worst > k->worst ? worst : k->worst;
    if (worst > 1) {
        k->failures++;
        printf("  FAIL %s: %s differs by %.3g times the tolerance\n", what, b->name, worst);
    }
    if (memcmp(at(k->cpu->region, b), at(k->device, b), (size_t)b->bytes) != 0)
        exchange(k, b, at(k->cpu->region, b), true);
}

/* A batch of smooth inputs (token indices where an embedding reads them; another
 * batch for each training step) and every class in turn, at each of a sample's rows of
 * classes (a language model's positions). */
static void make_batch(ddp_runtime *rt, int64_t step) {
    const ddp_program *p = program;
    int64_t batch = p->settings.batch_per_replica, per = 1;
    for (int d = 0; d < p->input_rank; d++)
        per *= p->input_shape[d];
    int input_dtype = (int)p->buffers[p->input_slot].dtype;
    for (int64_t i = 0; i < batch * per; i++) {
        double v = sin(0.3 * (double)i + 0.7 * (double)step) * 2;
        if (p->input_vocab)
            v = (double)((i * 7 + step) % p->input_vocab);
        if (input_dtype == DDP_F64)
            ((double *)ddp_buffer_ptr(rt, p->input_slot))[i] = v;
        else if (input_dtype == DDP_BF16)
            ((uint16_t *)ddp_buffer_ptr(rt, p->input_slot))[i] = ddp_bf16_from_double(v);
        else
            ((float *)ddp_buffer_ptr(rt, p->input_slot))[i] = (float)v;
    }
    int64_t rows = p->label_positions, k = p->output_elems / rows;
    for (int64_t s = 0; s < batch; s++) {
        for (int64_t r = s * rows; r < (s + 1) * rows; r++) {
            if (p->label_dtype == DDP_I32)
                ((int32_t *)ddp_buffer_ptr(rt, p->label_slot))[r] = (int32_t)((r + step) % k);
            else
                for (int64_t j = 0; j < k; j++) {
                    double t = j == (r + step) % k;
                    if (p->dtype == DDP_F64)
                        ((double *)ddp_buffer_ptr(rt, p->label_slot))[r * k + j] = t;
                    else
                        ((float *)ddp_buffer_ptr(rt, p->label_slot))[r * k + j] = (float)t;
                }
        }
        ((int64_t *)ddp_buffer_ptr(rt, p->sample_id_slot))[s] = 100 + step * batch + s;
    }
}

static ddp_runtime *open_runtime(void) {
    ddp_options o = {.threads = 1};
    char err[512];
    ddp_runtime *rt = ddp_open(program, &o, err, sizeof err);
    if (!rt)
        fail("opening the runtime", err);
    return rt;
}

/* ------------------------------------------------------------- mutations */

static bool short_leading_dimension(ddp_device *d, int stream, const ddp_device_gemm *g) {
    ddp_device_gemm wrong = *g;
    wrong.lda--;
    return real->gemm(d, stream, &wrong);
}

static bool no_wait(ddp_device *d) {
    (void)d;
    return true;
}

static bool no_wait_for_event(ddp_device *d, int event) {
    (void)d, (void)event;
    return true;
}

static bool read_device_memory(ddp_device *d, int stream, void *to, ddp_dptr from, size_t bytes) {
    (void)d, (void)stream;
    memcpy(to, (const void *)(uintptr_t)from, bytes);
    return true;
}

static bool too_many_threads(ddp_device *d, int stream, int64_t k, uint32_t grid, uint32_t threads, uint32_t shared,
                             ddp_dptr args, ddp_dptr scalars, int64_t begin, int64_t end) {
    (void)threads;
    return real->launch(d, stream, k, grid, 2048, shared, args, scalars, begin, end);
}

/* An index launch with the fewest blocks its period allows, its threads `less` short
 * of a block's. */
static bool small_grid(ddp_device *d, int stream, int64_t k, uint32_t threads, uint32_t shared, ddp_dptr args,
                       ddp_dptr scalars, int64_t begin, int64_t end, uint32_t less) {
    return real->launch(d, stream, k, (uint32_t)ddp_index_grid(&program->kernels[k], 1), threads - less, shared, args,
                        scalars, begin, end);
}

static bool small_grids(ddp_device *d, int stream, int64_t k, uint32_t grid, uint32_t threads, uint32_t shared,
                        ddp_dptr args, ddp_dptr scalars, int64_t begin, int64_t end) {
    if (program->kernels[k].launch != DDP_LAUNCH_INDEX)
        return real->launch(d, stream, k, grid, threads, shared, args, scalars, begin, end);
    return small_grid(d, stream, k, threads, shared, args, scalars, begin, end, 0);
}

static bool broken_period(ddp_device *d, int stream, int64_t k, uint32_t grid, uint32_t threads, uint32_t shared,
                          ddp_dptr args, ddp_dptr scalars, int64_t begin, int64_t end) {
    if (program->kernels[k].launch != DDP_LAUNCH_INDEX)
        return real->launch(d, stream, k, grid, threads, shared, args, scalars, begin, end);
    return small_grid(d, stream, k, threads, shared, args, scalars, begin, end, 1);
}

static bool too_much_shared(ddp_device *d, int stream, int64_t k, uint32_t grid, uint32_t threads, uint32_t shared,
                            ddp_dptr args, ddp_dptr scalars, int64_t begin, int64_t end) {
    (void)shared;
    return real->launch(d, stream, k, grid, threads, 64 << 10, args, scalars, begin, end);
}

static bool synchronised_in_capture(ddp_device *d, int stream) {
    return real->capture_begin(d, stream) && real->synchronize(d);
}

static bool pageable_in_capture(ddp_device *d, int stream) {
    static double ordinary[DDP_S_COUNT];
    ddp_dptr scratch;
    return real->alloc(d, sizeof ordinary, &scratch) && real->capture_begin(d, stream) &&
           real->upload(d, stream, scratch, ordinary, sizeof ordinary);
}

static bool shifted_padding(ddp_device *d, int stream, const ddp_device_conv *c) {
    ddp_device_conv wrong = *c;
    if (wrong.pad_after[0] > 0)
        wrong.pad_before[0]++, wrong.pad_after[0]--;
    return real->conv(d, stream, &wrong);
}

static bool mutate(ddp_device *dev, const char *kind) {
    real = dev->ops;
    mutated = *real;
    if (strcmp(kind, "small-grids") == 0)
        mutated.launch = small_grids;
    else if (strcmp(kind, "period") == 0)
        mutated.launch = broken_period;
    else if (strcmp(kind, "leading-dimension") == 0)
        mutated.gemm = short_leading_dimension;
    else if (strcmp(kind, "synchronisation") == 0)
        mutated.synchronize = no_wait, mutated.synchronize_event = no_wait_for_event;
    else if (strcmp(kind, "copy") == 0)
        mutated.download = read_device_memory;
    else if (strcmp(kind, "threads") == 0)
        mutated.launch = too_many_threads;
    else if (strcmp(kind, "shared") == 0)
        mutated.launch = too_much_shared;
    else if (strcmp(kind, "capture-sync") == 0)
        mutated.capture_begin = synchronised_in_capture;
    else if (strcmp(kind, "capture-pageable") == 0)
        mutated.capture_begin = pageable_in_capture;
    else if (strcmp(kind, "padding") == 0 && real->conv)
        mutated.conv = shifted_padding;
    else
        return false;
    dev->ops = &mutated;
    return true;
}

/* One training step (every phase, evaluation included), each step of its schedule
 * judged on the device against the CPU. */
static void check_training_step(Check *k, int64_t training_step, int64_t steps) {
    ddp_runtime *cpu = k->cpu, *gpu = k->gpu;
    int64_t batch = program->settings.batch_per_replica;
    make_batch(cpu, training_step);
    ddp_set_batch(cpu, batch, batch);
    ddp_set_batch(gpu, batch, batch);
    ddp_prepare_step(cpu, training_step, steps);
    ddp_prepare_step(gpu, training_step, steps);
    if (!ddp_gpu_exchange(gpu, DDP_REGION_INPUT, 0, program->region_bytes[DDP_REGION_INPUT],
                          cpu->region[DDP_REGION_INPUT], true))
        fail("copying the batch to the device", gpu->device_error);
    for (int phase = 0; phase < DDP_PHASE_COUNT; phase++) {
        const ddp_phase *ph = &program->phases[phase];
        int64_t sequence = phase == DDP_PHASE_EVAL ? 2 : 1, position = 0;
        for (int q = 0; q < phase && phase != DDP_PHASE_EVAL; q++)
            position += program->phases[q].count;
        for (int64_t s = 0; s < ph->count; s++, position++) {
            const ddp_step *step = &ph->steps[s];
            memcpy(gpu->scalars, cpu->scalars, sizeof cpu->scalars);
            ddp_run_steps(cpu, phase, s, 1);
            if (!ddp_run_steps(gpu, phase, s, 1) || !ddp_gpu_synchronize(gpu))
                fail("running a step on the device", gpu->device_error);
            /* the other path's convolution steps run on neither side: their buffers
             * hold what the step before left (a library's scratch, on the device) */
            if (!ddp_path_runs(step->path, ddp_gpu_path(gpu)))
                continue;
            int64_t slots[256];
            int64_t n = step_buffers(step, slots, 256);
            if (n == 0)
                continue;
            char what[200];
            snprintf(what, sizeof what, "%s (step %lld of %s, training step %lld)",
                     step->kind == DDP_STEP_KERNEL ? program->kernels[step->index].name
                     : step->kind == DDP_STEP_CONV ? "conv" : "gemm", (long long)s,
                     phase_names[phase], (long long)training_step + 1);
            const ddp_conv *cv = step->kind == DDP_STEP_CONV ? &program->convs[step->index] : NULL;
            for (int64_t a = 0; a < n; a++)
                judge(k, &program->buffers[slots[a]], what, sequence, position, cv);
            k->checked++;
        }
        /* at the phase's end, every live buffer: a step that wrote outside its own shows here */
        char what[96];
        snprintf(what, sizeof what, "the end of %s, training step %lld", phase_names[phase],
                 (long long)training_step + 1);
        for (int64_t i = 0; i < program->nbuffers; i++)
            judge(k, &program->buffers[i], what, sequence, position - 1, NULL);
    }
}

/* Every buffer alive at the end of the phase, copied from the device into out. */
static void take_results(Check *k, int phase, void *const *out) {
    int64_t sequence = phase == DDP_PHASE_EVAL ? 2 : 1, position = program->phases[phase].count - 1;
    for (int q = 0; q < phase && phase != DDP_PHASE_EVAL; q++)
        position += program->phases[q].count;
    for (int64_t i = 0; i < program->nbuffers; i++) {
        const ddp_buffer *b = &program->buffers[i];
        if (alive(b, sequence, position))
            exchange(k, b, at(out, b), false);
    }
}

/* Each phase from the CPU's state at its start, three times on the device: the last
 * two (captured as a graph, replayed) must end as the first (step by step) did. */
static void check_graphs(Check *k) {
    ddp_runtime *cpu = k->cpu, *gpu = k->gpu;
    int64_t batch = program->settings.batch_per_replica;
    make_batch(cpu, 0);
    ddp_set_batch(cpu, batch, batch);
    ddp_set_batch(gpu, batch, batch);
    ddp_prepare_step(cpu, 0, 1);
    ddp_prepare_step(gpu, 0, 1);
    void *rounds[3][DDP_REGION_COUNT];
    for (int n = 0; n < 3; n++)
        for (int r = 0; r < DDP_REGION_COUNT; r++)
            if (!(rounds[n][r] = calloc(1, (size_t)program->region_bytes[r] + 64)))
                fail("allocating", "out of memory");
    int differing = 0;
    for (int phase = 0; phase < DDP_PHASE_COUNT; phase++) {
        for (int n = 0; n < 3; n++) {
            for (int r = 0; r < DDP_REGION_COUNT; r++)
                if (program->region_bytes[r] &&
                    !ddp_gpu_exchange(gpu, r, 0, program->region_bytes[r], cpu->region[r], true))
                    fail("copying the state to the device", gpu->device_error);
            memcpy(gpu->scalars, cpu->scalars, sizeof cpu->scalars);
            if (!ddp_run_phase(gpu, phase) || !ddp_gpu_synchronize(gpu))
                fail(n == 0 ? "running a phase step by step" : n == 1 ? "capturing a phase as a CUDA graph"
                                                                      : "replaying a CUDA graph",
                     gpu->device_error);
            take_results(k, phase, rounds[n]);
        }
        for (int64_t i = 0; i < program->nbuffers; i++) {
            const ddp_buffer *b = &program->buffers[i];
            for (int n = 1; n < 3; n++)
                if (memcmp(at(rounds[0], b), at(rounds[n], b), (size_t)b->bytes) != 0) {
                    differing++;
                    printf("  FAIL the %s phase %s: %s differs from the phase run step by step\n",
                           phase_names[phase], n == 1 ? "captured" : "replayed", b->name);
                }
        }
        ddp_run_phase(cpu, phase);
    }
    for (int n = 0; n < 3; n++)
        for (int r = 0; r < DDP_REGION_COUNT; r++)
            free(rounds[n][r]);
    k->failures += differing;
    printf("kernel_check %s on the %s device: every phase captured as a CUDA graph and replayed, %s\n",
           program->name, ddp_gpu_backend(gpu), differing ? "FAIL" : "ok: bit for bit as step by step");
}

int main(int argc, char **argv) {
    const char *kind = "gpu", *mutation = NULL;
    long steps = 1;
    bool timed = false;
    bool usage = false;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--mutate=", 9) == 0)
            mutation = argv[i] + 9;
        else if (strcmp(argv[i], "--small-grids") == 0)
            mutation = "small-grids";
        else if (strcmp(argv[i], "--conv-search") == 0 && i + 1 < argc)
            usage |= !(timed = strcmp(argv[++i], "timed") == 0) && strcmp(argv[i], "heuristic") != 0;
        else if (strcmp(argv[i], "--training-steps") == 0 && i + 1 < argc)
            usage |= (steps = strtol(argv[++i], NULL, 10)) < 1;
        else if (strcmp(argv[i], "gpu") == 0 || strcmp(argv[i], "emulated") == 0)
            kind = argv[i];
        else
            usage = true;
    }
    if (usage) {
        fprintf(stderr, "usage: kernel_check [gpu|emulated] [--training-steps N] [--small-grids] "
                        "[--conv-search heuristic|timed] "
                        "[--mutate=leading-dimension|synchronisation|copy|threads|period|shared|capture-sync|"
                        "capture-pageable|padding]\n");
        return 2;
    }
    char why[1024];
    ddp_device *dev = open_test_device(program, kind, why, sizeof why);
    if (!dev) {
        bool driver = strcmp(kind, "gpu") == 0;
        printf("kernel_check %s: %s: %s\n", program->name, driver ? "SKIPPED, no usable GPU" : "FAIL", why);
        return driver ? 77 : 1;
    }
    if (mutation && !mutate(dev, mutation)) {
        fprintf(stderr, "kernel_check: no mutation `%s`\n", mutation);
        return 2;
    }
    ddp_runtime *cpu = open_runtime(), *gpu = open_runtime();
    gpu->options.timed_conv_search = timed;
    if (!ddp_gpu_attach(gpu, dev, why, sizeof why))
        fail("attaching the device", why);
    cpu->options.convolutions = ddp_gpu_path(gpu); /* the CPU takes the device's path, by the reference */
    cpu->options.reference_convolutions = true;
    ddp_init_params(cpu, 9);
    Check k = {.cpu = cpu, .gpu = gpu};
    for (int r = 0; r < DDP_REGION_COUNT; r++) {
        if (!(k.device[r] = calloc(1, (size_t)program->region_bytes[r] + 64)))
            fail("allocating", "out of memory");
        if (program->region_bytes[r] &&
            !ddp_gpu_exchange(gpu, r, 0, program->region_bytes[r], cpu->region[r], true))
            fail("copying the state to the device", gpu->device_error);
    }
    for (long t = 0; t < steps; t++)
        check_training_step(&k, t, steps);
    check_graphs(&k);
    printf("kernel_check %s on the %s device: %ld training step%s, %d steps of their schedules, %s; largest "
           "difference %.3g of the tolerance\n", program->name, ddp_gpu_backend(gpu), steps, steps > 1 ? "s" : "",
           k.checked, k.failures ? "FAIL" : "ok", k.worst);
    for (int r = 0; r < DDP_REGION_COUNT; r++)
        free(k.device[r]);
    ddp_close(gpu);
    ddp_close(cpu);
    return k.failures ? 1 : 0;
}
