/* main.c: the entry point of a built program: one CPU worker training the model.
 *
 * This is the minimal executor: it trains on synthetic data (inputs uniform in
 * [-1, 1), labels drawn at random, both from the seed) and reports the loss and the
 * metrics. Programs whose datasets are read from files are refused with a clear
 * message until the data readers are part of the runtime. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"

static const char usage[] =
    "usage: %s [--steps N] [--threads N] [--seed N] [--baseline-cpu] [--help]\n"
    "Trains %s on one CPU worker with synthetic data and prints the loss and metrics.\n"
    "  --steps N        training steps (default: the program's epochs of its dataset)\n"
    "  --threads N      threads for kernels and BLAS (default: every processor)\n"
    "  --seed N         the seed (default: the program's)\n"
    "  --baseline-cpu   run the baseline x86-64 kernels even where AVX2 is present\n";

static int bad_usage(const char *prog, const char *what, const char *arg) {
    fprintf(stderr, "%s: %s%s\nRun `%s --help` for the options.\n", prog, what, arg, prog);
    return 2;
}

static bool parse_count(const char *s, long long *out) {
    char *end;
    long long v = s ? strtoll(s, &end, 10) : -1;
    if (!s || *end || v < 0)
        return false;
    *out = v;
    return true;
}

/* Sample i of the synthetic dataset, written at row `row` of the batch. */
static void synthetic_sample(ddp_runtime *rt, uint64_t seed, int64_t i, int64_t row, int64_t classes) {
    const ddp_program *p = rt->program;
    int64_t per = 1;
    for (int d = 0; d < p->input_rank; d++)
        per *= p->input_shape[d];
    void *x = ddp_buffer_ptr(rt, p->input_slot);
    for (int64_t e = 0; e < per; e++) {
        uint32_t w[4];
        ddp_draw(seed, DDP_STREAM_SHUFFLE + 1, (uint64_t)i, (uint32_t)e, 0, w);
        double v = 2 * ddp_uniform53(w) - 1;
        if (p->dtype == DDP_F64)
            ((double *)x)[row * per + e] = v;
        else
            ((float *)x)[row * per + e] = (float)v;
    }
    uint32_t w[4];
    ddp_draw(seed, DDP_STREAM_SHUFFLE + 2, (uint64_t)i, 0, 0, w);
    int64_t cls = (int64_t)(ddp_uniform53(w) * (double)classes);
    void *y = ddp_buffer_ptr(rt, p->label_slot);
    if (p->label_dtype == DDP_I32) {
        ((int32_t *)y)[row] = (int32_t)cls;
    } else {
        int64_t k = p->output_elems;
        for (int64_t j = 0; j < k; j++) {
            double t = k == 1 ? (double)(cls % 2) : (double)(j == cls % k);
            if (p->dtype == DDP_F64)
                ((double *)y)[row * k + j] = t;
            else
                ((float *)y)[row * k + j] = (float)t;
        }
    }
    ((int64_t *)ddp_buffer_ptr(rt, p->sample_id_slot))[row] = i;
}

int main(int argc, char **argv) {
    const ddp_program *p = &ddp_program_desc;
    const char *prog = argv[0];
    ddp_options o = {0};
    long long steps = -1, seed = p->settings.seed, v;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf(usage, prog, p->name);
            return 0;
        } else if (strcmp(argv[i], "--steps") == 0 && parse_count(i + 1 < argc ? argv[i + 1] : NULL, &v)) {
            steps = v, i++;
        } else if (strcmp(argv[i], "--threads") == 0 && parse_count(i + 1 < argc ? argv[i + 1] : NULL, &v) && v > 0) {
            o.threads = (int)v, i++;
        } else if (strcmp(argv[i], "--seed") == 0 && parse_count(i + 1 < argc ? argv[i + 1] : NULL, &v)) {
            seed = v, i++;
        } else if (strcmp(argv[i], "--baseline-cpu") == 0) {
            o.baseline_cpu = true;
        } else {
            return bad_usage(prog, "unknown or incomplete option ", argv[i]);
        }
    }
    const ddp_dataset *ds = &p->settings.train;
    if (ds->kind != DDP_DATA_SYNTHETIC) {
        static const char *const kinds[] = {"idx", "cifar10", "npy", "csv", "synthetic"};
        fprintf(stderr, "%s: the dataset `%s` is %s files, and this runtime trains on synthetic data "
                        "only so far; give the model a synthetic(shape, classes, samples) dataset\n",
                prog, ds->name, kinds[ds->kind]);
        return 1;
    }
    char err[512];
    ddp_runtime *rt = ddp_open(p, &o, err, sizeof err);
    if (!rt) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    rt->scalars[DDP_S_SEED].i = seed;
    ddp_init_params(rt, (uint64_t)seed);
    int64_t batch = p->settings.batch_per_replica;
    int64_t per_epoch = p->settings.steps_per_epoch > 0 ? p->settings.steps_per_epoch : ds->samples / batch;
    if (per_epoch < 1)
        per_epoch = 1;
    if (steps < 0)
        steps = p->settings.epochs * per_epoch;
    printf("%s: %lld parameters, batch %lld, %lld steps, %d threads\n", p->name, (long long)p->param_count,
           (long long)batch, steps, ddp_pool_threads(rt->pool));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long long s = 0; s < steps; s++) {
        for (int64_t r = 0; r < batch; r++)
            synthetic_sample(rt, (uint64_t)seed, (s * batch + r) % ds->samples, r, ds->classes);
        ddp_set_batch(rt, batch, batch);
        ddp_prepare_step(rt, s, per_epoch);
        ddp_zero_accumulators(rt);
        ddp_train_step(rt);
        double n;
        double loss = ddp_accumulator(rt, 0, &n) / (n > 0 ? n : 1);
        if (s == steps - 1 || (s + 1) % 10 == 0 || s == 0)
            printf("step %lld: loss %.6f\n", s + 1, loss);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%lld steps in %.3f s, %.1f samples/s\n", steps, secs, secs > 0 ? (double)(steps * batch) / secs : 0);
    ddp_close(rt);
    return 0;
}
