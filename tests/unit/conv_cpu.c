/* conv_cpu.c: the CPU's convolution (runtime/conv_cpu.c) against the reference
 * (conv_reference.c), for shapes that take each of its ways: im2col tiles with
 * padding on both sides, strides (the backward data's taps between the gradient's
 * pixels), dilations (tap by tap), channels of one (whole tap rows copied at once), a
 * 1x1 convolution read in place and one with a stride, batches big enough for several
 * tiles and threads; the three modes, beta 0 and 1, f32 and f64.
 *
 * Each element must lie within the rounding any order of summation allows: n terms
 * summed in the tensor's type are within n * eps * sum |terms| of the exact sum, and
 * sum |terms| is the reference's result on the tensors' absolute values. A tap read
 * from the wrong pixel misses by the size of a term, far outside that. Then the same
 * convolution on pools of 1, 2 and 3 threads gives the same bits, an empty batch
 * zeroes the filters' gradient (beta 0) or leaves it (beta 1), the scratch grows
 * from one call to a larger one, and a scratch that cannot be allocated refuses the
 * call. Where the CPU has AVX2 and FMA, every shape runs again with the narrow
 * convolutions' kernels allowed (f32 filters of at most 160 columns and outputs in
 * eights: outputs of one, two, three and four vectors, odd pixels and columns left
 * over, strides, dilations, padding past the taps' reach), held to the same bounds. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "conv_test.h"
#include "conv.h"
#include "runtime.h"

typedef struct Shape {
    const char *name;
    int n, h, w, c, k, r, s, stride[2], dilation[2], pad_before[2], pad_after[2];
} Shape;

static const Shape shapes[] = {
    {"5x5 same, channels 1", 3, 12, 11, 1, 8, 5, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}},
    {"5x5 same, many tiles", 8, 14, 14, 32, 24, 5, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}},
    {"5x5 channels 1, filter gradient in groups of tiles", 16, 28, 28, 1, 32, 5, 5, {1, 1}, {1, 1}, {2, 2}, {2, 2}},
    {"3x3 stride 2 asymmetric padding", 4, 9, 10, 6, 5, 3, 3, {2, 2}, {1, 1}, {0, 1}, {1, 0}},
    {"3x3 strides 2 and 1", 3, 9, 8, 5, 7, 3, 3, {2, 1}, {1, 1}, {1, 1}, {1, 1}},
    {"3x2 dilation 2", 2, 9, 9, 3, 4, 3, 2, {1, 1}, {2, 2}, {2, 1}, {2, 1}},
    {"3x3 dilation 2 stride 2", 2, 11, 11, 4, 3, 3, 3, {2, 2}, {2, 2}, {2, 2}, {2, 2}},
    {"1x1 in place", 6, 13, 13, 40, 24, 1, 1, {1, 1}, {1, 1}, {0, 0}, {0, 0}},
    {"1x1 stride 2", 4, 9, 9, 16, 32, 1, 1, {2, 2}, {1, 1}, {0, 0}, {0, 0}},
    {"7x7 stride 2 wide padding", 2, 16, 16, 3, 16, 7, 7, {2, 2}, {1, 1}, {3, 3}, {3, 3}},
    {"4x4 padding larger than the taps reach", 2, 5, 5, 2, 3, 4, 4, {1, 1}, {1, 1}, {4, 4}, {4, 4}},
    {"4x4 padding past the taps, 8 outputs", 3, 5, 7, 2, 8, 4, 4, {1, 1}, {1, 1}, {4, 4}, {4, 3}},
    {"3x3 dilation 2 stride 2, 40 outputs", 5, 13, 12, 3, 40, 3, 3, {2, 2}, {2, 2}, {2, 1}, {2, 2}},
    {"3x3 asymmetric padding, 56 outputs", 3, 9, 10, 2, 56, 3, 3, {1, 2}, {1, 1}, {0, 1}, {1, 0}},
    {"5x5 strides 2 and 1, 24 outputs, tail of the image unread", 4, 11, 9, 1, 24, 5, 5, {2, 1}, {1, 1}, {0, 2}, {0, 2}},
};

static bool wide;   /* the narrow convolutions' kernels allowed */
static int narrows; /* the checks they ran */

static ddp_device_conv make_conv(const Shape *sh, int mode, double beta, bool f64) {
    ddp_device_conv c = {.mode = mode, .n = sh->n, .h = sh->h, .w = sh->w, .c = sh->c, .k = sh->k, .r = sh->r,
                         .s = sh->s, .beta = beta, .f64 = f64};
    for (int i = 0; i < 2; i++) {
        c.stride[i] = sh->stride[i], c.dilation[i] = sh->dilation[i];
        c.pad_before[i] = sh->pad_before[i], c.pad_after[i] = sh->pad_after[i];
    }
    c.oh = (c.h + c.pad_before[0] + c.pad_after[0] - (c.r - 1) * c.dilation[0] - 1) / c.stride[0] + 1;
    c.ow = (c.w + c.pad_before[1] + c.pad_after[1] - (c.s - 1) * c.dilation[1] - 1) / c.stride[1] + 1;
    return c;
}

static uint64_t seed = 0x2545f4914f6cdd1du; /* the values of every run the same */

static size_t count_of(const ddp_device_conv *c, int which) {
    return which == 0   ? (size_t)c->n * c->h * c->w * c->c
           : which == 1 ? (size_t)c->k * c->r * c->s * c->c
                        : (size_t)c->n * c->oh * c->ow * c->k;
}

static double get(const ddp_device_conv *c, const void *t, size_t i) {
    return c->f64 ? ((const double *)t)[i] : ((const float *)t)[i];
}

static void set(const ddp_device_conv *c, void *t, size_t i, double v) {
    if (c->f64)
        ((double *)t)[i] = v;
    else
        ((float *)t)[i] = (float)v;
}

/* The three tensors of c, random, and copies. */
typedef struct Tensors {
    void *t[3];
    size_t bytes[3];
} Tensors;

static Tensors random_tensors(const ddp_device_conv *c) {
    Tensors t;
    for (int which = 0; which < 3; which++) {
        t.bytes[which] = count_of(c, which) * (c->f64 ? 8 : 4);
        t.t[which] = malloc(t.bytes[which] ? t.bytes[which] : 1);
        for (size_t i = 0; i < count_of(c, which); i++)
            set(c, t.t[which], i, uniform_next(&seed));
    }
    return t;
}

static Tensors copy_tensors(const Tensors *from) {
    Tensors t = *from;
    for (int which = 0; which < 3; which++) {
        t.t[which] = malloc(t.bytes[which] ? t.bytes[which] : 1);
        memcpy(t.t[which], from->t[which], t.bytes[which]);
    }
    return t;
}

static void free_tensors(Tensors *t) {
    for (int which = 0; which < 3; which++)
        free(t->t[which]);
}

/* How many terms each written element sums. */
static double terms(const ddp_device_conv *c) {
    return c->mode == DDP_CONV_FORWARD         ? (double)c->r * c->s * c->c
           : c->mode == DDP_CONV_BACKWARD_DATA ? (double)c->r * c->s * c->k
                                               : (double)c->n * c->oh * c->ow;
}

static ddp_pool *pools[4];

/* The written tensor of c on t by the CPU's convolution, with `threads` threads. */
static bool run_cpu(const ddp_device_conv *c, Tensors *t, int threads, ddp_conv_scratch *scratch) {
    return ddp_conv_cpu(pools[threads], scratch, c, t->t[0], t->t[1], t->t[2], wide);
}

static void check_mode(const Shape *sh, int mode, double beta, bool f64) {
    ddp_device_conv c = make_conv(sh, mode, beta, f64);
    int written = written_by(&c);
    Tensors given = random_tensors(&c), ours = copy_tensors(&given), reference = copy_tensors(&given),
            bound = copy_tensors(&given);
    ddp_conv_scratch scratch = {0};
    CHECK(run_cpu(&c, &ours, 2, &scratch));
    ddp_conv_reference(&c, reference.t[0], reference.t[1], reference.t[2]);
    for (int which = 0; which < 3; which++) /* sum |terms|: the reference on absolute values */
        for (size_t i = 0; i < count_of(&c, which); i++)
            set(&c, bound.t[which], i, which == written ? 0 : fabs(get(&c, bound.t[which], i)));
    ddp_device_conv plain = c;
    plain.beta = 0;
    ddp_conv_reference(&plain, bound.t[0], bound.t[1], bound.t[2]);
    double eps = f64 ? 0x1p-53 : 0x1p-24, worst = 0;
    bool within = true;
    for (size_t i = 0; i < count_of(&c, written); i++) {
        double got = get(&c, ours.t[written], i), want = get(&c, reference.t[written], i);
        double old = beta ? fabs(get(&c, given.t[written], i)) : 0;
        double allowed = 2 * (terms(&c) + 2) * eps * (get(&c, bound.t[written], i) + old);
        double miss = fabs(got - want);
        within = within && miss <= allowed;
        if (allowed > 0 && miss / allowed > worst)
            worst = miss / allowed;
    }
    CHECK(within);
    bool same_bits = true;
    for (int threads = 1; threads <= 3; threads++) {
        Tensors again = copy_tensors(&given);
        CHECK(run_cpu(&c, &again, threads, &scratch));
        same_bits = same_bits && memcmp(again.t[written], ours.t[written], ours.bytes[written]) == 0;
        free_tensors(&again);
    }
    CHECK(same_bits);
    narrows += ddp_conv_narrow(&c, wide);
    printf("%s %s, %s, beta %g, %s%s: %.2f of the rounding allowed%s\n", within && same_bits ? "ok  " : "FAIL",
           sh->name, mode_names[mode], beta, f64 ? "f64" : "f32", ddp_conv_narrow(&c, wide) ? ", narrow kernels" : "", worst,
           same_bits ? ", the same bits on 1, 2 and 3 threads" : ", DIFFERENT bits on 1, 2 or 3 threads");
    ddp_conv_scratch_free(&scratch);
    free_tensors(&given);
    free_tensors(&ours);
    free_tensors(&reference);
    free_tensors(&bound);
}

/* An empty batch: the filters' gradient is zero with beta 0 and untouched with beta 1;
 * the forward and backward data write nothing. */
static void check_empty_batch(void) {
    for (int beta = 0; beta <= 1; beta++) {
        ddp_device_conv c = make_conv(&shapes[1], DDP_CONV_BACKWARD_FILTER, beta, false);
        c.n = 0;
        size_t count = (size_t)c.k * c.r * c.s * c.c;
        float *filters = malloc(count * sizeof *filters), x = 0, y = 0;
        for (size_t i = 0; i < count; i++)
            filters[i] = 1.5f;
        ddp_conv_scratch scratch = {0};
        CHECK(ddp_conv_cpu(pools[2], &scratch, &c, &x, filters, &y, wide));
        bool right = true;
        for (size_t i = 0; i < count; i++)
            right = right && filters[i] == (beta ? 1.5f : 0.0f);
        CHECK(right);
        printf("%s an empty batch, backward filter, beta %d\n", right ? "ok  " : "FAIL", beta);
        ddp_conv_scratch_free(&scratch);
        free(filters);
    }
}

/* One scratch for a small convolution, then a larger one: it grows, and the second's
 * result is the one a fresh scratch gives. */
static void check_scratch_grows(void) {
    ddp_device_conv small = make_conv(&shapes[2], DDP_CONV_FORWARD, 0, false);
    ddp_device_conv large = make_conv(&shapes[1], DDP_CONV_FORWARD, 0, false);
    Tensors a = random_tensors(&small), b = random_tensors(&large), fresh = copy_tensors(&b);
    ddp_conv_scratch kept = {0}, other = {0};
    CHECK(run_cpu(&small, &a, 3, &kept));
    size_t before = kept.bytes;
    CHECK(run_cpu(&large, &b, 3, &kept));
    CHECK(run_cpu(&large, &fresh, 3, &other));
    bool right = kept.bytes > before && memcmp(b.t[2], fresh.t[2], b.bytes[2]) == 0;
    CHECK(right);
    printf("%s the scratch grows from %zu to %zu bytes between calls\n", right ? "ok  " : "FAIL", before, kept.bytes);
    ddp_conv_scratch_free(&kept);
    ddp_conv_scratch_free(&other);
    free_tensors(&a);
    free_tensors(&b);
    free_tensors(&fresh);
}

/* A convolution whose scratch cannot be had (a tile row of 2^40 columns): false, and
 * nothing read or written. */
static void check_no_memory(void) {
    ddp_device_conv c = {.mode = DDP_CONV_FORWARD, .n = 1, .h = 1, .w = 1, .c = 1 << 28, .k = 1, .r = 64, .s = 64,
                         .oh = 1, .ow = 1, .stride = {1, 1}, .dilation = {1, 1}, .pad_before = {63, 63}};
    float x = 1, w = 2, y = 3;
    ddp_conv_scratch scratch = {0};
    bool refused = !ddp_conv_cpu(pools[2], &scratch, &c, &x, &w, &y, false) && y == 3 && !scratch.base;
    CHECK(refused);
    printf("%s no memory for the scratch: refused, nothing written\n", refused ? "ok  " : "FAIL");
    ddp_conv_scratch_free(&scratch);
}

int main(void) {
    for (int threads = 1; threads <= 3; threads++)
        pools[threads] = ddp_pool_new(threads, "ddp-test");
    bool has_wide = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!has_wide)
        printf("this CPU has no AVX2 and FMA: the narrow convolutions' kernels are not run\n");
    for (int way = 0; way <= has_wide; way++) {
        wide = way == 1;
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int mode = DDP_CONV_FORWARD; mode <= DDP_CONV_BACKWARD_FILTER; mode++)
                for (int f64 = 0; f64 <= 1; f64++)
                    for (int beta = 0; beta <= 1; beta++)
                        check_mode(&shapes[i], mode, beta, f64);
        check_empty_batch();
    }
    CHECK(narrows == 0 || has_wide);
    CHECK(narrows == 32 || !has_wide); /* 8 shapes, forward and filter, beta 0 and 1, f32 */
    printf("%d checks by the narrow kernels\n", narrows);
    check_scratch_grows();
    check_no_memory();
    for (int threads = 1; threads <= 3; threads++)
        ddp_pool_free(pools[threads]);
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
