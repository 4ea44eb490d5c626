/* cudnn.c: runtime/cudnn.c, the cuDNN wrapper, against the stand-in libcudnn.so.9 of
 * tests/gpu/fake_cudnn.c (argv[1]), which runs ddp_conv_reference on host memory given
 * as device addresses. For several shapes, f32, f64 and bf16, the three modes and beta
 * 0 and 1: the wrapper's result is the reference's, bit for bit, and both agree with
 * checks that share no code with them (bf16 within its one rounding of the result): the forward with an im2col matrix product, the
 * backward modes element by element with the derivatives of that forward (it is
 * linear: forward(e_i) is its derivative along e_i), and the adjoint identity
 * <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>. Then which engine the
 * filtering keeps (determinism, tensor cores and TF32, tensor cores for bf16 and sums
 * in reduced precision, workspace, finalize failures, the fallback to every engine), the
 * choice by timing (--conv-search timed), the refusals with their messages (a missing library,
 * an old one, no usable engine, a misaligned pointer, a run of another shape), and the
 * stand-in's own strictness, so that the wrapper passing it means something. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>

#include "bf16.h"
#include "check.h"
#include "conv.h"

enum { MIB = 1 << 20 };
enum { F32, F64, BF16 }; /* a shape's data type */

typedef struct Shape {
    const char *name;
    int n, h, w, c, k, r, s, stride, dilation, pad_before[2], pad_after[2];
    int type;
} Shape;

static const Shape shapes[] = {
    {"3x3 stride 1 same", 2, 5, 6, 3, 4, 3, 3, 1, 1, {1, 1}, {1, 1}, F32},
    {"3x3 stride 2, TensorFlow's same on an even image", 2, 6, 8, 3, 5, 3, 3, 2, 1, {0, 0}, {1, 1}, F32},
    {"1x1 stride 2", 2, 5, 5, 4, 3, 1, 1, 2, 1, {0, 0}, {0, 0}, F32},
    {"7x7 stride 2 pad 3", 1, 9, 10, 2, 3, 7, 7, 2, 1, {3, 3}, {3, 3}, F32},
    {"3x3 dilation 2", 1, 7, 7, 3, 2, 3, 3, 1, 2, {2, 2}, {2, 2}, F32},
    {"3x3 stride 1 same, f64", 2, 5, 6, 3, 4, 3, 3, 1, 1, {1, 1}, {1, 1}, F64},
    {"3x3 stride 2 asymmetric padding, f64", 1, 6, 7, 2, 3, 3, 3, 2, 1, {0, 1}, {1, 0}, F64},
    {"3x3 stride 1 same, bf16", 2, 5, 6, 3, 4, 3, 3, 1, 1, {1, 1}, {1, 1}, BF16},
    {"3x3 stride 2 asymmetric padding, bf16", 1, 6, 7, 2, 3, 3, 3, 2, 1, {0, 1}, {1, 0}, BF16},
    {"7x7 stride 2 pad 3, bf16", 1, 9, 10, 2, 3, 7, 7, 2, 1, {3, 3}, {3, 3}, BF16},
};
enum { F32_SHAPE = 0, F64_SHAPE = 5, BF16_SHAPE = 7 }; /* the first shape of each type */

static const char *const mode_names[] = {"forward", "backward data", "backward filter"};

static ddp_device_conv make_conv(const Shape *sh, int mode, double beta, size_t workspace_bytes) {
    ddp_device_conv c = {.mode = mode, .n = sh->n, .h = sh->h, .w = sh->w, .c = sh->c, .k = sh->k, .r = sh->r,
                         .s = sh->s, .beta = beta, .workspace_bytes = workspace_bytes, .f64 = sh->type == F64,
                         .bf16 = sh->type == BF16};
    int size[2] = {sh->h, sh->w}, taps[2] = {sh->r, sh->s}, out[2];
    for (int i = 0; i < 2; i++) {
        c.stride[i] = sh->stride, c.dilation[i] = sh->dilation;
        c.pad_before[i] = sh->pad_before[i], c.pad_after[i] = sh->pad_after[i];
        out[i] = (size[i] + sh->pad_before[i] + sh->pad_after[i] - (taps[i] - 1) * sh->dilation - 1) / sh->stride + 1;
    }
    c.oh = out[0], c.ow = out[1];
    return c;
}

/* ------------------------------------------------------------------- tensors */

typedef struct Tensors {
    void *t[3];                 /* x, filters, y */
    size_t count[3];
    bool f64, bf16;
} Tensors;

static size_t element_bytes(const Tensors *t) {
    return t->f64 ? 8 : t->bf16 ? 2 : 4;
}

static uint64_t seed = 0x9e3779b97f4a7c15u;

static double uniform(void) { /* in [-1, 1), the same sequence every run */
    seed = seed * 6364136223846793005u + 1442695040888963407u;
    return (double)(seed >> 11) / (double)(1ull << 52) - 1;
}

static double get(const Tensors *t, int which, size_t i) {
    if (t->bf16)
        return ddp_bf16_to_float(((uint16_t *)t->t[which])[i]);
    return t->f64 ? ((double *)t->t[which])[i] : ((float *)t->t[which])[i];
}

static void put(Tensors *t, int which, size_t i, double v) {
    if (t->f64)
        ((double *)t->t[which])[i] = v;
    else if (t->bf16)
        ((uint16_t *)t->t[which])[i] = ddp_bf16_from_double(v);
    else
        ((float *)t->t[which])[i] = (float)v;
}

/* Random tensors for c; the one c's mode writes holds old values to add to (beta 1)
 * or NaN, which beta 0 must not read. */
static Tensors random_tensors(const ddp_device_conv *c) {
    Tensors t = {.count = {(size_t)c->n * c->h * c->w * c->c, (size_t)c->k * c->r * c->s * c->c,
                           (size_t)c->n * c->oh * c->ow * c->k},
                 .f64 = c->f64, .bf16 = c->bf16};
    int written = c->mode == DDP_CONV_FORWARD ? 2 : c->mode == DDP_CONV_BACKWARD_DATA ? 0 : 1;
    for (int which = 0; which < 3; which++) {
        t.t[which] = malloc(t.count[which] * element_bytes(&t));
        for (size_t i = 0; i < t.count[which]; i++)
            put(&t, which, i, which == written && c->beta == 0 ? NAN : uniform());
    }
    return t;
}

static Tensors copy_tensors(const Tensors *from) {
    Tensors t = *from;
    for (int which = 0; which < 3; which++) {
        size_t bytes = t.count[which] * element_bytes(&t);
        memcpy(t.t[which] = malloc(bytes), from->t[which], bytes);
    }
    return t;
}

static void free_tensors(Tensors *t) {
    for (int which = 0; which < 3; which++)
        free(t->t[which]);
}

static void point_at(ddp_device_conv *c, const Tensors *t, void *workspace) {
    c->x = (uintptr_t)t->t[0], c->filters = (uintptr_t)t->t[1], c->y = (uintptr_t)t->t[2];
    c->workspace = (uintptr_t)workspace;
}

/* ------------------------------------------------------- the independent checks */

/* The forward as an im2col matrix product in double: each output pixel's receptive
 * field as a row of R*S*C values (zeros in the padding) times each filter. */
static void forward_im2col(const ddp_device_conv *c, const double *x, const double *w, double *y) {
    size_t patch = (size_t)c->r * c->s * c->c, pixel = 0;
    double *row = malloc(patch * sizeof *row);
    for (int n = 0; n < c->n; n++)
        for (int p = 0; p < c->oh; p++)
            for (int q = 0; q < c->ow; q++, pixel++) {
                for (size_t e = 0; e < patch; e++) {
                    int r = (int)(e / ((size_t)c->s * c->c)), s = (int)(e / c->c % c->s), ch = (int)(e % c->c);
                    int ih = p * c->stride[0] - c->pad_before[0] + r * c->dilation[0];
                    int iw = q * c->stride[1] - c->pad_before[1] + s * c->dilation[1];
                    bool inside = ih >= 0 && ih < c->h && iw >= 0 && iw < c->w;
                    row[e] = inside ? x[(((size_t)n * c->h + ih) * c->w + iw) * c->c + ch] : 0;
                }
                for (int k = 0; k < c->k; k++) {
                    double sum = 0;
                    for (size_t e = 0; e < patch; e++)
                        sum += row[e] * w[k * patch + e];
                    y[pixel * c->k + k] = sum;
                }
            }
    free(row);
}

static double dot(const double *a, const double *b, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

static double abs_dot(const double *a, const double *b, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += fabs(a[i] * b[i]);
    return sum;
}

static double *widened(const Tensors *t, int which) {
    double *d = malloc(t->count[which] * sizeof *d);
    for (size_t i = 0; i < t->count[which]; i++)
        d[i] = get(t, which, i);
    return d;
}

/* The backward modes' result element by element: along e_i, the forward's derivative
 * is the forward of e_i, and its inner product with dy is dgrad's (or wgrad's) i-th. */
static double *derivatives(const ddp_device_conv *c, const double *x, const double *w, const double *dy,
                           int along, size_t count, size_t out_count) {
    double *result = malloc(count * sizeof *result), *unit = calloc(count, sizeof *unit);
    double *y = malloc(out_count * sizeof *y);
    for (size_t i = 0; i < count; i++) {
        unit[i] = 1;
        forward_im2col(c, along == 0 ? unit : x, along == 0 ? w : unit, y);
        result[i] = dot(y, dy, out_count);
        unit[i] = 0;
    }
    free(unit);
    free(y);
    return result;
}

/* The mode's result computed without the reference. */
static double *independent(const ddp_device_conv *c, const Tensors *t) {
    double *x = widened(t, 0), *w = widened(t, 1), *y = widened(t, 2), *result;
    if (c->mode == DDP_CONV_FORWARD) {
        result = malloc(t->count[2] * sizeof *result);
        forward_im2col(c, x, w, result);
    } else
        result = derivatives(c, x, w, y, c->mode == DDP_CONV_BACKWARD_DATA ? 0 : 1,
                             t->count[c->mode == DDP_CONV_BACKWARD_DATA ? 0 : 1], t->count[2]);
    free(x);
    free(w);
    free(y);
    return result;
}

/* Within the written type's rounding: a bf16 result is rounded once, to 8 bits. */
static bool close_to(double got, double want, const Tensors *t) {
    return fabs(got - want) <= (t->f64 ? 1e-12 : t->bf16 ? 1.0 / 256 : 1e-6) * (1 + fabs(want));
}

/* ------------------------------------------------------------ through cuDNN */

static ddp_cudnn *dnn;
static char *workspace;
static const ddp_cudnn_timing *timing; /* how plans are chosen: NULL, the heuristics' first */

static bool plan_and_run(const ddp_device_conv *c, ddp_cudnn_plan **plan, char *err, size_t len) {
    if (!ddp_cudnn_plan_conv(dnn, c, timing, plan, err, len))
        return false;
    bool ok = ddp_cudnn_run(dnn, *plan, c, err, len);
    if (!ok) {
        ddp_cudnn_plan_free(*plan);
        *plan = NULL;
    }
    return ok;
}

static void check_mode(const Shape *sh, int mode, double beta) {
    ddp_device_conv c = make_conv(sh, mode, beta, MIB);
    int written = mode == DDP_CONV_FORWARD ? 2 : mode == DDP_CONV_BACKWARD_DATA ? 0 : 1;
    Tensors t = random_tensors(&c), before = copy_tensors(&t), reference = copy_tensors(&t);
    ddp_cudnn_plan *plan = NULL;
    char err[4096] = "";
    point_at(&c, &t, workspace);
    bool ran = plan_and_run(&c, &plan, err, sizeof err);
    if (!ran)
        fprintf(stderr, "%s, %s, beta %g: %s\n", sh->name, mode_names[mode], beta, err);
    CHECK(ran);
    ddp_conv_reference(&c, reference.t[0], reference.t[1], reference.t[2]);
    CHECK(memcmp(t.t[written], reference.t[written], t.count[written] * element_bytes(&t)) == 0);
    double *want = independent(&c, &before);
    size_t bad = 0;
    for (size_t i = 0; i < t.count[written]; i++) {
        double old = beta != 0 ? get(&before, written, i) : 0;
        bad += !close_to(get(&t, written, i) - old, want[i], &t);
    }
    if (bad)
        fprintf(stderr, "%s, %s, beta %g: %zu of %zu elements differ from the independent check\n", sh->name,
                mode_names[mode], beta, bad, t.count[written]);
    CHECK(bad == 0);
    printf("ok   %s, %s, beta %g (%s)\n", sh->name, mode_names[mode], beta, plan ? ddp_cudnn_plan_name(plan) : "-");
    free(want);
    ddp_cudnn_plan_free(plan);
    free_tensors(&t);
    free_tensors(&before);
    free_tensors(&reference);
}

/* <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>, each through cuDNN, each
 * mode on its own copy of the same random x, w and dy; bf16 within the rounding of each
 * written element (2^-9 of it, at most, weighted by what it is multiplied with). */
static void check_adjoint(const Shape *sh) {
    ddp_device_conv c = make_conv(sh, DDP_CONV_FORWARD, 1, MIB);
    Tensors copies[3];
    copies[0] = random_tensors(&c); /* beta 1 makes every tensor random, dy among them */
    copies[1] = copy_tensors(&copies[0]), copies[2] = copy_tensors(&copies[0]);
    double *dy = widened(&copies[0], 2), *x = widened(&copies[0], 0), *w = widened(&copies[0], 1);
    char err[4096];
    c.beta = 0;
    for (int mode = 0; mode < 3; mode++) {
        ddp_cudnn_plan *plan = NULL;
        c.mode = mode;
        point_at(&c, &copies[mode], workspace);
        CHECK(plan_and_run(&c, &plan, err, sizeof err));
        ddp_cudnn_plan_free(plan);
    }
    double *y = widened(&copies[0], 2), *dx = widened(&copies[1], 0), *dw = widened(&copies[2], 1);
    double sides[3] = {dot(y, dy, copies[0].count[2]), dot(x, dx, copies[0].count[0]), dot(w, dw, copies[0].count[1])};
    double scale = (sh->type == F64 ? 1e-12 : 1e-5) * (1 + fabs(sides[0]));
    if (sh->type == BF16)
        scale += (abs_dot(y, dy, copies[0].count[2]) + abs_dot(x, dx, copies[0].count[0]) +
                  abs_dot(w, dw, copies[0].count[1])) / 256;
    CHECK(fabs(sides[0] - sides[1]) <= scale && fabs(sides[0] - sides[2]) <= scale);
    printf("ok   %s: adjoint identity %.9g = %.9g = %.9g\n", sh->name, sides[0], sides[1], sides[2]);
    free(y), free(dy), free(x), free(dx), free(w), free(dw);
    for (int i = 0; i < 3; i++)
        free_tensors(&copies[i]);
}

/* ------------------------------------------------------------ engine choice */

/* The plan chosen for the shape's forward (of its type), with tf32 or not and so much
 * workspace; its name starts with want (and ran), or planning failed with each of the
 * texts in refusal. */
static void expect_engine(const char *what, const Shape *sh, bool tf32, size_t workspace_bytes, const char *want,
                          const char *const *refusal) {
    ddp_device_conv c = make_conv(sh, DDP_CONV_FORWARD, 0, workspace_bytes);
    c.tf32 = tf32;
    Tensors t = random_tensors(&c), reference = copy_tensors(&t);
    char *space = workspace_bytes > MIB ? malloc(workspace_bytes) : workspace;
    ddp_cudnn_plan *plan = NULL;
    char err[8192] = "";
    point_at(&c, &t, workspace_bytes ? space : NULL);
    bool ran = plan_and_run(&c, &plan, err, sizeof err);
    if (want) {
        bool named = ran && strncmp(ddp_cudnn_plan_name(plan), want, strlen(want)) == 0;
        if (!named)
            fprintf(stderr, "%s: want %s, got %s\n", what, want, ran ? ddp_cudnn_plan_name(plan) : err);
        CHECK(named);
        ddp_conv_reference(&c, reference.t[0], reference.t[1], reference.t[2]);
        CHECK(ran && memcmp(t.t[2], reference.t[2], t.count[2] * element_bytes(&t)) == 0);
    } else {
        CHECK(!ran);
        for (int i = 0; refusal[i]; i++)
            if (!strstr(err, refusal[i])) {
                fprintf(stderr, "%s: the refusal lacks \"%s\": %s\n", what, refusal[i], err);
                failures++;
            }
    }
    printf("ok   %s: %s\n", what, ran ? ddp_cudnn_plan_name(plan) : err);
    ddp_cudnn_plan_free(plan);
    if (space != workspace)
        free(space);
    free_tensors(&t);
    free_tensors(&reference);
}

static void check_engine_choice(void) {
    const Shape *f32 = &shapes[F32_SHAPE], *f64 = &shapes[F64_SHAPE];
    const char *const nothing_usable[] = {"no engine for this forward convolution", "engine 0: nondeterministic",
                                          "of all 6 engines", NULL};
    const char *const each_reason[] = {"engine 0: nondeterministic", "engine 1: tensor cores",
                                       "engine 2: workspace 67108864 > 1048576 bytes",
                                       "engine 3: not supported: CUDNN_STATUS_NOT_SUPPORTED (3000): engine 3 is left "
                                       "out by FAKE_CUDNN_ENGINES", NULL};
    const char *const f32_only[] = {"engine 1: finalize failed: CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE (3003): engine 1 "
                                    "does not run f64 data", NULL};
    const char *const f32_reduced[] = {"(f32, image", "engine 5: sums in reduced precision", NULL};
    expect_engine("f32, 1 MiB of workspace", f32, false, MIB, "engine 3, knobs 2=2 14=3", NULL);
    expect_engine("f32, no workspace", f32, false, 0, "engine 4", NULL);
    expect_engine("f32, 64 MiB of workspace", f32, false, 64 * MIB, "engine 2", NULL);
    expect_engine("f32 with tf32", f32, true, MIB, "engine 1, tensor cores", NULL);
    expect_engine("f64", f64, false, MIB, "engine 3", NULL);
    setenv("FAKE_CUDNN_HEURISTICS", "none", 1);
    expect_engine("no heuristics: every engine tried", f32, false, MIB, "engine 3", NULL);
    unsetenv("FAKE_CUDNN_HEURISTICS");
    setenv("FAKE_CUDNN_ENGINES", "nondeterministic", 1);
    expect_engine("only a nondeterministic engine", f32, false, MIB, NULL, nothing_usable);
    setenv("FAKE_CUDNN_ENGINES", "nondeterministic,tensor_cores,large_workspace", 1);
    expect_engine("every engine rejected", f32, false, MIB, NULL, each_reason);
    expect_engine("every engine rejected, f64", f64, false, MIB, NULL, f32_only);
    setenv("FAKE_CUDNN_ENGINES", "reduced_precision", 1);
    expect_engine("f32, only an engine summing in reduced precision", f32, false, MIB, NULL, f32_reduced);
    unsetenv("FAKE_CUDNN_ENGINES");
}

/* precision = bf16: the tensor-core engine is taken (it reads bf16 factors exactly),
 * the one that sums in reduced precision never, though the heuristics rank it first
 * of the deterministic ones; the rest as for f32. */
static void check_bf16_engine_choice(void) {
    const Shape *bf16 = &shapes[BF16_SHAPE];
    const char *const reduced[] = {"no engine for this forward convolution (bf16, image",
                                   "engine 5: sums in reduced precision (bf16 convolutions sum in f32)",
                                   "engine 0: nondeterministic", "of all 6 engines", NULL};
    expect_engine("bf16: tensor cores", bf16, false, MIB, "engine 1, tensor cores", NULL);
    setenv("FAKE_CUDNN_HEURISTICS", "none", 1);
    expect_engine("bf16, no heuristics: tensor cores", bf16, false, MIB, "engine 1, tensor cores", NULL);
    unsetenv("FAKE_CUDNN_HEURISTICS");
    setenv("FAKE_CUDNN_ENGINES", "nondeterministic,reduced_precision", 1);
    expect_engine("bf16: only nondeterministic and reduced-precision engines", bf16, false, MIB, NULL, reduced);
    setenv("FAKE_CUDNN_ENGINES", "reduced_precision,no_workspace", 1);
    expect_engine("bf16: reduced precision passed over", bf16, false, MIB, "engine 4", NULL);
    setenv("FAKE_CUDNN_ENGINES", "large_workspace", 1);
    expect_engine("bf16, 64 MiB of workspace", bf16, false, 64 * MIB, "engine 2", NULL);
    unsetenv("FAKE_CUDNN_ENGINES");
}

/* --conv-search timed, with a stand-in for the GPU's timing: each engine takes
 * engine_ms[its number]; the engines timed, in order, go to timed_engines. */
static double engine_ms[6];
static char timed_engines[256];
static bool timing_fails;

static bool stand_in_time(void *ctx, ddp_cudnn *h, const ddp_cudnn_plan *p, const ddp_device_conv *c,
                          double *seconds, char *err, size_t len) {
    (void)ctx;
    if (timing_fails) {
        snprintf(err, len, "timing a convolution's engine: CUDA_ERROR_LAUNCH_FAILED");
        return false;
    }
    int engine = atoi(ddp_cudnn_plan_name(p) + strlen("engine "));
    size_t used = strlen(timed_engines);
    snprintf(timed_engines + used, sizeof timed_engines - used, "%s%d", used ? " " : "", engine);
    *seconds = engine_ms[engine] / 1e3;
    return ddp_cudnn_run(h, p, c, err, len); /* as a GPU's timing runs it */
}

static void expect_timed(const char *what, const Shape *sh, bool tf32, const char *want, const char *want_timed) {
    timed_engines[0] = '\0';
    expect_engine(what, sh, tf32, MIB, want, NULL);
    if (strcmp(timed_engines, want_timed) != 0)
        fprintf(stderr, "%s: timed \"%s\", want \"%s\"\n", what, timed_engines, want_timed);
    CHECK(strcmp(timed_engines, want_timed) == 0);
}

/* The fastest of the engines that qualify, each timed once its plan is made (the
 * heuristics' order among equals); those that do not qualify never run; a lone one is
 * taken untimed; a failed timing fails the plan, saying why. */
static void check_timed_choice(void) {
    const Shape *f32 = &shapes[F32_SHAPE];
    const ddp_cudnn_timing stand_in = {stand_in_time, NULL};
    const char *const failed[] = {"timing a convolution's engine: CUDA_ERROR_LAUNCH_FAILED", NULL};
    timing = &stand_in;
    memcpy(engine_ms, (double[]){1, 1, 1, 0.9, 0.5, 1}, sizeof engine_ms);
    expect_timed("timed: the faster of two", f32, false, "engine 4, the fastest of 2 timed (0.500 ms)", "3 4");
    memcpy(engine_ms, (double[]){1, 0.2, 1, 0.7, 0.7, 1}, sizeof engine_ms);
    expect_timed("timed, tf32: the fastest of three", f32, true, "engine 1, tensor cores, the fastest of 3", "1 3 4");
    expect_timed("timed, two equal: the heuristics' order", f32, false, "engine 3, knobs 2=2 14=3, the fastest of 2",
                 "3 4");
    setenv("FAKE_CUDNN_ENGINES", "nondeterministic,small_workspace", 1);
    expect_timed("timed, one engine that qualifies: taken untimed", f32, false, "engine 3, knobs 2=2 14=3", "");
    unsetenv("FAKE_CUDNN_ENGINES");
    timing_fails = true;
    expect_engine("timed, the timing fails", f32, false, MIB, NULL, failed);
    timing_fails = false;
    timing = NULL;
}

/* The tf32 flag reaches the engine: its result is the reference's with TF32 factors,
 * not the f32 one. */
static void check_tf32_reaches_the_engine(void) {
    ddp_device_conv c = make_conv(&shapes[F32_SHAPE], DDP_CONV_FORWARD, 0, MIB);
    Tensors t = random_tensors(&c), plain = copy_tensors(&t);
    ddp_cudnn_plan *plan = NULL;
    char err[4096];
    c.tf32 = true;
    point_at(&c, &t, workspace);
    CHECK(plan_and_run(&c, &plan, err, sizeof err));
    c.tf32 = false;
    ddp_conv_reference(&c, plain.t[0], plain.t[1], plain.t[2]);
    CHECK(memcmp(t.t[2], plain.t[2], t.count[2] * 4) != 0);
    printf("ok   tf32: the tensor-core engine's result is not f32's\n");
    ddp_cudnn_plan_free(plan);
    free_tensors(&t);
    free_tensors(&plain);
}

static void expect_run_refused(const char *what, ddp_device_conv *planned, ddp_device_conv *run, const char *text) {
    ddp_cudnn_plan *plan = NULL;
    char err[4096] = "";
    CHECK(ddp_cudnn_plan_conv(dnn, planned, NULL, &plan, err, sizeof err));
    bool refused = plan && !ddp_cudnn_run(dnn, plan, run, err, sizeof err) && strstr(err, text);
    if (!refused)
        fprintf(stderr, "%s: want a refusal with \"%s\", got \"%s\"\n", what, text, err);
    CHECK(refused);
    printf("ok   %s: %s\n", what, err);
    ddp_cudnn_plan_free(plan);
}

static void check_run_refusals(void) {
    ddp_device_conv c = make_conv(&shapes[F32_SHAPE], DDP_CONV_FORWARD, 0, MIB);
    Tensors t = random_tensors(&c);
    point_at(&c, &t, workspace);
    ddp_device_conv misaligned = c, other = c, starved = c, other_type = c;
    misaligned.x += 4;
    other.k += 1;
    starved.workspace_bytes = 100;
    other_type.bf16 = true;
    expect_run_refused("a pointer less aligned than planned", &c, &misaligned, "is not aligned to the 16 bytes");
    expect_run_refused("a run of another shape", &c, &other, "not the one its plan");
    expect_run_refused("a bf16 run of an f32 plan", &c, &other_type, "not the one its plan");
    expect_run_refused("less workspace than planned", &c, &starved, "needs 4096 bytes of workspace, and the run has 100");
    free_tensors(&t);
}

/* ---------------------------------------------------------------- loading */

static void expect_open_refused(const char *what, const char *const *texts) {
    char err[4096] = "";
    ddp_cudnn *h = ddp_cudnn_open(NULL, err, sizeof err);
    CHECK(h == NULL);
    ddp_cudnn_close(h);
    for (int i = 0; texts[i]; i++)
        if (!strstr(err, texts[i])) {
            fprintf(stderr, "%s: the refusal lacks \"%s\": %s\n", what, texts[i], err);
            failures++;
        }
    printf("ok   %s: %s\n", what, err);
}

/* The refusals first: a library refused is not kept, the one accepted is. */
static void check_loading(const char *fake) {
    char folder[1024], version_text[1200];
    snprintf(folder, sizeof folder, "%s", fake);
    *strrchr(folder, '/') = 0;
    const char *missing_file[] = {"DDP_CUDNN_LIBRARY=/nonexistent/libcudnn.so.9, cannot be loaded", NULL};
    const char *not_found[] = {"cuDNN 9 (libcudnn.so.9) not found; searched: /nonexistent/a, /nonexistent/b", NULL};
    snprintf(version_text, sizeof version_text, "%s is cuDNN 8.9.7", fake);
    const char *too_old[] = {version_text, "needs cuDNN 9.0 or newer", NULL};
    setenv("DDP_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9", 1);
    expect_open_refused("a missing DDP_CUDNN_LIBRARY", missing_file);
    unsetenv("DDP_CUDNN_LIBRARY");
    setenv("DDP_CUDA_LIBRARY_PATH", "/nonexistent/a:/nonexistent/b", 1);
    expect_open_refused("no libcudnn.so.9 in DDP_CUDA_LIBRARY_PATH", not_found);
    setenv("DDP_CUDNN_LIBRARY", fake, 1);
    setenv("FAKE_CUDNN_VERSION", "8907", 1);
    expect_open_refused("cuDNN 8", too_old);
    unsetenv("FAKE_CUDNN_VERSION");
    unsetenv("DDP_CUDNN_LIBRARY");
    setenv("DDP_CUDA_LIBRARY_PATH", folder, 1);
    char err[4096] = "";
    dnn = ddp_cudnn_open(NULL, err, sizeof err);
    if (!dnn)
        fprintf(stderr, "opening the stand-in through the search: %s\n", err);
    CHECK(dnn != NULL);
    CHECK(strstr(ddp_cudnn_library(), fake) && strstr(ddp_cudnn_library(), "(cuDNN 9.19.0)"));
    printf("ok   found through DDP_CUDA_LIBRARY_PATH: %s\n", ddp_cudnn_library());
}

/* ------------------------------------------------- the stand-in's strictness */

static struct {
    __typeof__(cudnnBackendCreateDescriptor) *create;
    __typeof__(cudnnBackendDestroyDescriptor) *destroy;
    __typeof__(cudnnBackendSetAttribute) *set;
    __typeof__(cudnnBackendFinalize) *finalize;
    __typeof__(cudnnGetLastErrorString) *last_error;
} fake;

/* The types a descriptor made here is given: the tensors', the compute type, and
 * alpha's and beta's. */
typedef struct Types {
    cudnnDataType_t data, compute;
    cudnnBackendAttributeType_t scalars;
} Types;

static const Types f32_types = {CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_TYPE_FLOAT};

static cudnnBackendDescriptor_t fake_tensor(int64_t uid, const int64_t dims[4], bool with_uid, cudnnDataType_t type) {
    cudnnBackendDescriptor_t t;
    int64_t strides[4] = {dims[2] * dims[3] * dims[1], 1, dims[3] * dims[1], dims[1]}, alignment = 16;
    fake.create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
    fake.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    fake.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    fake.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    fake.set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    if (with_uid)
        fake.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    return t;
}

static cudnnBackendDescriptor_t fake_convolution(cudnnDataType_t type) {
    cudnnBackendDescriptor_t d;
    int64_t two = 2, ones[2] = {1, 1}, pads[2] = {1, 1};
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    fake.create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &d);
    fake.set(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    fake.set(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    fake.set(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &two);
    fake.set(d, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, ones);
    fake.set(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, ones);
    fake.set(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    fake.set(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    fake.finalize(d);
    return d;
}

static void expect_status(const char *what, cudnnStatus_t got, cudnnStatus_t want, const char *text) {
    char message[1024] = "";
    fake.last_error(message, sizeof message);
    bool ok = got == want && strstr(message, text);
    if (!ok)
        fprintf(stderr, "stand-in, %s: status %d (want %d), \"%s\" (want \"%s\")\n", what, (int)got, (int)want,
                message, text);
    CHECK(ok);
    printf("ok   stand-in, %s: %s\n", what, message[0] ? message : "accepted");
}

/* A 3x3 same forward on a 5x5 image whose output or filters are wrong, or whose
 * types do not go together. */
static cudnnStatus_t fake_forward(const int64_t x[4], const int64_t w[4], const int64_t y[4], bool finalized_y,
                                  const Types *types) {
    cudnnBackendDescriptor_t op, conv = fake_convolution(types->compute);
    cudnnBackendDescriptor_t t[3] = {fake_tensor(1, x, true, types->data), fake_tensor(2, w, true, types->data),
                                     fake_tensor(3, y, true, types->data)};
    float one32 = 1, zero32 = 0;
    double one64 = 1, zero64 = 0;
    bool wide = types->scalars == CUDNN_TYPE_DOUBLE;
    fake.finalize(t[0]), fake.finalize(t[1]);
    if (finalized_y)
        fake.finalize(t[2]);
    fake.create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op);
    fake.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, types->scalars, 1,
             wide ? (void *)&one64 : (void *)&one32);
    fake.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, types->scalars, 1,
             wide ? (void *)&zero64 : (void *)&zero32);
    fake.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    fake.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t[0]);
    fake.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t[1]);
    cudnnStatus_t status = fake.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                    &t[2]);
    if (status == CUDNN_STATUS_SUCCESS)
        status = fake.finalize(op);
    fake.destroy(op);
    fake.destroy(conv);
    for (int i = 0; i < 3; i++)
        fake.destroy(t[i]);
    return status;
}

static void check_stand_in(const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    if (!lib)
        return;
    *(void **)&fake.create = dlsym(lib, "cudnnBackendCreateDescriptor");
    *(void **)&fake.destroy = dlsym(lib, "cudnnBackendDestroyDescriptor");
    *(void **)&fake.set = dlsym(lib, "cudnnBackendSetAttribute");
    *(void **)&fake.finalize = dlsym(lib, "cudnnBackendFinalize");
    *(void **)&fake.last_error = dlsym(lib, "cudnnGetLastErrorString");
    const int64_t x[4] = {1, 3, 5, 5}, w[4] = {4, 3, 3, 3}, y[4] = {1, 4, 5, 5}, y_wrong[4] = {1, 4, 6, 5};
    const int64_t w_wrong[4] = {4, 2, 3, 3};
    cudnnBackendDescriptor_t t = fake_tensor(1, x, false, CUDNN_DATA_FLOAT);
    expect_status("a tensor without its unique id", fake.finalize(t), CUDNN_STATUS_BAD_PARAM,
                  "CUDNN_ATTR_TENSOR_UNIQUE_ID is required");
    int32_t dims32[4] = {1, 3, 5, 5};
    expect_status("dimensions of the wrong type", fake.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT32, 4, dims32),
                  CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_TENSOR_DIMENSIONS: attribute type");
    fake.destroy(t);
    const Types bf16 = {CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TYPE_FLOAT};
    const Types bf16_f64_sums = {CUDNN_DATA_BFLOAT16, CUDNN_DATA_DOUBLE, CUDNN_TYPE_DOUBLE};
    const Types bf16_double_scalars = {CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TYPE_DOUBLE};
    expect_status("a right forward", fake_forward(x, w, y, true, &f32_types), CUDNN_STATUS_SUCCESS, "");
    expect_status("an output of the wrong height", fake_forward(x, w, y_wrong, true, &f32_types),
                  CUDNN_STATUS_BAD_PARAM, "the output's height is 6, and the image's 5 with filters of 3, dilation "
                  "1, stride 1, padding 1 + 1 give 5");
    expect_status("filters of other channels than the image's", fake_forward(x, w_wrong, y, true, &f32_types),
                  CUDNN_STATUS_BAD_PARAM, "the filters have 2 channels and the image 3");
    expect_status("an operand not finalized", fake_forward(x, w, y, false, &f32_types),
                  CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "is not finalized");
    expect_status("a right bf16 forward (f32 compute type)", fake_forward(x, w, y, true, &bf16), CUDNN_STATUS_SUCCESS,
                  "");
    expect_status("bf16 with an f64 compute type", fake_forward(x, w, y, true, &bf16_f64_sums),
                  CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "compute type 1 for data of type 9");
    expect_status("bf16 with double alpha and beta", fake_forward(x, w, y, true, &bf16_double_scalars),
                  CUDNN_STATUS_BAD_PARAM, "of type 5, and a bf16 convolution's is 4");
    dlclose(lib);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH-OF-THE-STAND-IN-libcudnn.so.9\n", argv[0]);
        return 2;
    }
    check_loading(argv[1]);
    if (!dnn)
        return 1;
    workspace = malloc(MIB);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        for (int mode = 0; mode < 3; mode++)
            for (int beta = 0; beta < 2; beta++)
                check_mode(&shapes[i], mode, beta);
        check_adjoint(&shapes[i]);
    }
    check_engine_choice();
    check_bf16_engine_choice();
    check_timed_choice();
    check_tf32_reaches_the_engine();
    check_run_refusals();
    check_stand_in(argv[1]);
    ddp_cudnn_close(dnn);
    free(workspace);
    if (failures)
        fprintf(stderr, "%d checks failed\n", failures);
    return failures ? 1 : 0;
}
