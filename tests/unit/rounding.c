/* rounding.c: the roundings of f32 the GPU's reduced precisions make.
 *
 * TF32 (precision = tf32, the emulated tensor cores' reading of a factor,
 * ddp_tf32_round): against values worked out by hand from the format: values TF32
 * holds stay, ties go away from zero, one bit below a tie goes down, signs are kept,
 * infinities and NaN stay, the largest float rounds to infinity, subnormals round like
 * the rest.
 *
 * bf16 (precision = bf16): against a reference worked from the values, not the bits:
 * a value's neighbours in bf16 (8 significant bits, or the subnormals' fixed step)
 * found with frexp and ldexp, the nearer one taken, a tie to the one with an even last
 * bit, past the largest bf16 (by half a step or more) infinity. Three conversions are
 * held to it:
 *   - ddp_bf16_from_float (runtime/bf16.h: the loader, the emulated device): every
 *     f32 whose low half is a tie or next to one, and a sweep over the others;
 *   - ddp_bf16_from_double, which must round a double once, not through a nearest
 *     f32 (doubles just off a tie, that an f32 would round onto it);
 *   - the generated kernels (compiler/llvm.c), through the linked bf16 model's cast
 *     of its weights to bf16 (a pointwise kernel from an f32 parameter to a bf16
 *     copy), called directly on every f32 there is (a chunk in 31 under the
 *     sanitizers), both CPU variants, against ddp_bf16_from_float;
 *   - with an argument, `gpu` or `emulated`, that cast alone on the device, whose
 *     kernels round with the GPU's cvt.rn.bf16.f32 (the emulated device with
 *     ddp_bf16_from_float): every tie and 1 in 997 f32, on large grids and on small
 *     ones (a thread taking its indices several at a time), nothing written past the
 *     end (tests/gpu/check.sh runs it on a GPU; `gpu` without one exits 77).
 * NaN must stay NaN, infinities stay, zeros keep their sign. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "device.h"
#include "runtime.h"
#include "test_device.h"

static int failures;

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* The reference: x rounded to bf16, as a double (NaN for NaN). */
static double reference(double x) {
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    int e;
    frexp(x, &e);                          /* |x| = m 2^e, m in [0.5, 1) */
    int step_exp = e - 8 < -133 ? -133 : e - 8; /* 8 significant bits; subnormals' step 2^-133 */
    double step = ldexp(1, step_exp);
    double q = x / step;                   /* exact: a power of two */
    double low = floor(q), r = q - low;
    double pick = r > 0.5 ? low + 1 : r < 0.5 ? low : fmod(low, 2) == 0 ? low : low + 1;
    double v = pick * step;
    double largest = ldexp(255.0 / 128, 127); /* 0x7f7f */
    return fabs(v) > largest ? copysign(INFINITY, x) : copysign(v, x); /* -tiny rounds to -0 */
}

static bool same(double want, uint16_t got) {
    double g = ddp_bf16_to_float(got);
    if (isnan(want))
        return isnan(g);
    return g == want && signbit(g) == signbit(want);
}

static void expect_float(const char *what, uint32_t in) {
    uint16_t got = ddp_bf16_from_float(from_bits(in));
    double want = reference(from_bits(in));
    if (!same(want, got)) {
        if (failures++ < 20)
            printf("FAIL %s: %08x -> %04x, want %.9g\n", what, in, got, want);
    }
}

/* One named case: got and want as the format's bits, equal or both NaN. */
static void report(const char *what, uint32_t in, uint32_t got, uint32_t want, bool nan_got, bool nan_want) {
    bool ok = nan_want ? nan_got : got == want;
    printf("%s %s: %08x -> %0*x%s\n", ok ? "ok  " : "FAIL", what, in, got > 0xffff || want > 0xffff ? 8 : 4, got,
           ok ? "" : " (wrong)");
    failures += !ok;
}

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static void tf32(const char *what, uint32_t in, uint32_t want) {
    float got = ddp_tf32_round(from_bits(in));
    report(what, in, bits_of(got), want, isnan(got), isnan(from_bits(want)));
}

static void named(const char *what, uint32_t in, uint16_t want) {
    uint16_t got = ddp_bf16_from_float(from_bits(in));
    report(what, in, got, want, isnan(ddp_bf16_to_float(got)), isnan(ddp_bf16_to_float(want)));
}

static void tf32_cases(void) {
    tf32("tf32: 1 stays", 0x3f800000u, 0x3f800000u);
    tf32("tf32: 1 + 2^-10 (the last bit TF32 keeps) stays", 0x3f802000u, 0x3f802000u);
    tf32("tf32: 1 + 2^-11, a tie, goes away from zero", 0x3f801000u, 0x3f802000u);
    tf32("tf32: -(1 + 2^-11), a tie, goes away from zero", 0xbf801000u, 0xbf802000u);
    tf32("tf32: 1 + 2^-11 - 2^-23, below the tie, goes down", 0x3f800fffu, 0x3f800000u);
    tf32("tf32: 1 + 3 * 2^-11, a tie, goes away from zero too", 0x3f803000u, 0x3f804000u);
    tf32("tf32: a mantissa of all ones carries into the exponent", 0x3fffffffu, 0x40000000u);
    tf32("tf32: the largest float rounds to infinity", 0x7f7fffffu, 0x7f800000u);
    tf32("tf32: infinity stays", 0x7f800000u, 0x7f800000u);
    tf32("tf32: -infinity stays", 0xff800000u, 0xff800000u);
    tf32("tf32: NaN stays NaN", 0x7fc00001u, 0x7fc00000u);
    tf32("tf32: zero stays", 0x00000000u, 0x00000000u);
    tf32("tf32: -zero stays", 0x80000000u, 0x80000000u);
    tf32("tf32: a subnormal at a tie goes up", 0x00001000u, 0x00002000u);
    tf32("tf32: a subnormal below the tie goes to zero", 0x00000fffu, 0x00000000u);
}

/* The f32 a sweep takes, the j-th of SAMPLED: every high half (each sign, exponent
 * and kept mantissa: subnormals, infinities and NaNs too) with its low half at and
 * around a tie and at the ends, then 1 in SWEEP of the rest. */
static const uint32_t tie_lows[] = {0x0000, 0x0001, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff};
enum { TIE_CASES = 0x10000 * 8, SWEEP = 997 };
/* Under the sanitizers, which check the memory the test touches and not the rounding,
 * the generated cast takes a chunk of f32 in CHUNK_STRIDE (every f32 there is takes 13
 * minutes there); the release build takes every one. */
#ifdef DDP_SANITIZED
#define CHUNK_STRIDE 31
#else
#define CHUNK_STRIDE 1
#endif
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
#define SAMPLED (TIE_CASES + ((1ull << 32) + SWEEP - 1) / SWEEP)

static uint32_t sampled(uint64_t j) {
    return j < TIE_CASES ? (uint32_t)(j / 8) << 16 | tie_lows[j % 8] : (uint32_t)((j - TIE_CASES) * SWEEP);
}

static void host_float(void) {
    named("1 stays", 0x3f800000u, 0x3f80);
    named("1 + 2^-8, a tie, goes to even (down)", 0x3f808000u, 0x3f80);
    named("1 + 3 * 2^-8, a tie, goes to even (up)", 0x3f818000u, 0x3f82);
    named("-(1 + 3 * 2^-8) likewise, its sign kept", 0xbf818000u, 0xbf82);
    named("just above a tie goes up", 0x3f808001u, 0x3f81);
    named("just below a tie goes down", 0x3f807fffu, 0x3f80);
    named("a mantissa of all ones carries into the exponent", 0x3fffffffu, 0x4000);
    named("the largest float rounds to infinity", 0x7f7fffffu, 0x7f80);
    named("the largest bf16 stays", 0x7f7f0000u, 0x7f7f);
    named("infinity stays", 0x7f800000u, 0x7f80);
    named("-infinity stays", 0xff800000u, 0xff80);
    named("a quiet NaN stays NaN", 0x7fc00000u, 0x7fc0);
    named("a NaN whose payload is in the low half stays NaN (not infinity)", 0x7f800001u, 0x7fc0);
    named("a negative NaN stays NaN", 0xff800001u, 0xffc0);
    named("zero stays", 0x00000000u, 0x0000);
    named("-zero stays", 0x80000000u, 0x8000);
    named("the smallest subnormal goes to zero", 0x00000001u, 0x0000);
    named("a subnormal tie goes to even", 0x00018000u, 0x0002);
    /* every high half with the low halves at and around a tie, and at the ends */
    for (uint64_t j = 0; j < SAMPLED; j++)
        expect_float(j < TIE_CASES ? "tie sweep" : "sweep", sampled(j));
    printf("%s ddp_bf16_from_float against the reference (every tie, and 1 in 997 floats)\n",
           failures ? "FAIL" : "ok  ");
}

/* Doubles a hair off a bf16 tie, which the nearest f32 would round onto the tie. */
static void host_double(void) {
    int before = failures;
    for (uint32_t high = 0x0080; high < 0x7f7f; high += 3) {
        for (int sign = 0; sign < 2; sign++) {
            double tie = from_bits((sign ? 0x80000000u : 0) | high << 16 | 0x8000);
            double step = fabs(tie) * 0x1p-40;
            const double cases[] = {tie, tie + step, tie - step};
            for (int k = 0; k < 3; k++) {
                uint16_t got = ddp_bf16_from_double(cases[k]);
                if (!same(reference(cases[k]), got) && failures++ < 20)
                    printf("FAIL double %.17g -> %04x, want %.9g\n", cases[k], got, reference(cases[k]));
            }
        }
    }
    const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e300, -1e300, 1e-300};
    for (size_t k = 0; k < sizeof specials / sizeof *specials; k++)
        if (!same(reference(specials[k]), ddp_bf16_from_double(specials[k])) && failures++ < 20)
            printf("FAIL double %g\n", specials[k]);
    printf("%s ddp_bf16_from_double rounds once (ties, a hair off them both ways, NaN, infinities, "
           "overflow, underflow)\n", failures == before ? "ok  " : "FAIL");
}

/* The linked program's cast of a weight to its bf16 copy: the first forward kernel
 * reading an f32 parameter and writing a bf16 workspace buffer; which argument is
 * which, from the buffer table. */
static const ddp_step *cast_step(const ddp_program *p, int *from_arg) {
    const ddp_phase *ph = &p->phases[DDP_PHASE_FORWARD];
    for (int64_t i = 0; i < ph->count; i++) {
        const ddp_step *s = &ph->steps[i];
        if (s->kind != DDP_STEP_KERNEL || s->nargs != 2)
            continue;
        const ddp_buffer *a = &p->buffers[s->args[0]], *b = &p->buffers[s->args[1]];
        if (a->region == DDP_REGION_PARAMS && a->dtype == DDP_F32 && b->dtype == DDP_BF16)
            return *from_arg = 0, s;
        if (b->region == DDP_REGION_PARAMS && b->dtype == DDP_F32 && a->dtype == DDP_BF16)
            return *from_arg = 1, s;
    }
    return NULL;
}

static void generated(const ddp_program *p) {
    int from_arg;
    const ddp_step *s = cast_step(p, &from_arg);
    if (!s) {
        printf("FAIL the bf16 model has no kernel casting a weight to bf16\n");
        failures++;
        return;
    }
    enum { CHUNK = 1 << 20 };
    uint32_t *in = malloc(CHUNK * sizeof *in);
    uint16_t *out = malloc(CHUNK * sizeof *out);
    ddp_scalar scalars[DDP_S_COUNT];
    memset(scalars, 0, sizeof scalars);
    const ddp_kernel_fn *variants[2] = {p->cpu_baseline, p->cpu_wide};
    const char *names[2] = {"baseline", "AVX2"};
    for (int v = 0; v < 2; v++) {
        bool wide = v == 1;
        if (wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
            printf("ok   (the AVX2 kernels are not run: this CPU lacks AVX2)\n");
            continue;
        }
        int before = failures;
        void *args[2];
        args[from_arg] = in;
        args[1 - from_arg] = out;
        for (uint64_t base = 0; base < 1ull << 32; base += (uint64_t)CHUNK * CHUNK_STRIDE) {
            for (uint32_t i = 0; i < CHUNK; i++)
                in[i] = (uint32_t)base + i;
            variants[v][s->index](args, scalars, 0, CHUNK);
            for (uint32_t i = 0; i < CHUNK; i++) {
                uint16_t want = ddp_bf16_from_float(from_bits(in[i]));
                bool ok = out[i] == want || (isnan(ddp_bf16_to_float(want)) && isnan(ddp_bf16_to_float(out[i])));
                if (!ok && failures++ < 20)
                    printf("FAIL generated (%s) %08x -> %04x, want %04x\n", names[v], in[i], out[i], want);
            }
        }
        printf("%s the generated cast (%s kernels, %s) rounds every f32%s as ddp_bf16_from_float does\n",
               failures == before ? "ok  " : "FAIL", names[v], p->kernels[s->index].name,
               CHUNK_STRIDE > 1 ? " of a chunk in " STRINGIFY(CHUNK_STRIDE) : "");
    }
    free(in);
    free(out);
}

static bool device_failed(const char *what, const char *why) {
    printf("FAIL the device's cast: %s: %s\n", what, why);
    failures++;
    return false;
}

/* The same cast on a device, launched as the runtime launches it but over buffers of
 * its own, DEVICE_CHUNK values at a time: the GPU's own conversion (cvt.rn.bf16.f32),
 * or the emulated device's, against ddp_bf16_from_float on the sweep's values. A NaN
 * must stay NaN (its bits are the device's). Every other chunk runs on the fewest
 * blocks the kernel allows, as a large batch does, each thread taking thousands of
 * indices (several at a time, then the rest one by one); DEVICE_CHUNK is odd so that
 * some are left over. Nothing may be written past a chunk's end: the output's tail
 * and a guard after it hold a pattern that must come back. */
enum { DEVICE_CHUNK = 1000003, GUARD = 4096, PATTERN = 0xa5a5 };

static bool device_cast(const ddp_program *p, ddp_device *dev) {
    int from_arg;
    const ddp_step *s = cast_step(p, &from_arg);
    if (!s)
        return device_failed("finding it", "the bf16 model has no kernel casting a weight to bf16");
    const ddp_kernel *k = &p->kernels[s->index];
    uint32_t *in = malloc(DEVICE_CHUNK * sizeof *in);
    uint16_t *out = malloc((DEVICE_CHUNK + GUARD) * sizeof *out);
    ddp_scalar scalars[DDP_S_COUNT];
    memset(scalars, 0, sizeof scalars);
    ddp_dptr in_d, out_d, args_d, scalars_d, args[2];
    size_t out_bytes = (DEVICE_CHUNK + GUARD) * sizeof *out;
    if (!in || !out || !dev->ops->alloc(dev, DEVICE_CHUNK * sizeof *in, &in_d) || !dev->ops->alloc(dev, out_bytes, &out_d) ||
        !dev->ops->alloc(dev, sizeof args, &args_d) || !dev->ops->alloc(dev, sizeof scalars, &scalars_d))
        return device_failed("allocating", dev->error);
    args[from_arg] = in_d;
    args[1 - from_arg] = out_d;
    if (!dev->ops->upload(dev, DDP_STREAM_COMPUTE, args_d, args, sizeof args) ||
        !dev->ops->upload(dev, DDP_STREAM_COMPUTE, scalars_d, scalars, sizeof scalars))
        return device_failed("copying its arguments", dev->error);
    int before = failures;
    int64_t chunk = 0;
    for (uint64_t first = 0; first < SAMPLED; first += DEVICE_CHUNK, chunk++) {
        int64_t n = SAMPLED - first < DEVICE_CHUNK ? (int64_t)(SAMPLED - first) : DEVICE_CHUNK;
        for (int64_t i = 0; i < n; i++)
            in[i] = sampled(first + (uint64_t)i);
        for (int64_t i = 0; i < DEVICE_CHUNK + GUARD; i++)
            out[i] = PATTERN;
        uint32_t grid = (uint32_t)ddp_index_grid(k, chunk % 2 ? 1 : n);
        if (!dev->ops->upload(dev, DDP_STREAM_COMPUTE, in_d, in, (size_t)n * sizeof *in) ||
            !dev->ops->upload(dev, DDP_STREAM_COMPUTE, out_d, out, out_bytes) ||
            !dev->ops->launch(dev, DDP_STREAM_COMPUTE, s->index, grid, (uint32_t)k->threads, (uint32_t)k->shared_bytes,
                              args_d, scalars_d, 0, n) ||
            !dev->ops->download(dev, DDP_STREAM_COMPUTE, out, out_d, out_bytes) || !dev->ops->synchronize(dev))
            return device_failed("running it", dev->error);
        for (int64_t i = 0; i < n; i++) {
            uint16_t want = ddp_bf16_from_float(from_bits(in[i]));
            bool ok = out[i] == want || (isnan(ddp_bf16_to_float(want)) && isnan(ddp_bf16_to_float(out[i])));
            if (!ok && failures++ < 20)
                printf("FAIL the %s device's cast %08x -> %04x, want %04x\n", dev->ops->name, in[i], out[i], want);
        }
        for (int64_t i = n; i < DEVICE_CHUNK + GUARD; i++)
            if (out[i] != PATTERN && failures++ < 20)
                printf("FAIL the %s device's cast of %lld values (%u blocks) wrote element %lld, past its end\n",
                       dev->ops->name, (long long)n, grid, (long long)i);
    }
    printf("%s the %s device's cast (%s) rounds every tie and 1 in 997 f32 as ddp_bf16_from_float does, on "
           "large grids and small, and writes nothing past its end\n",
           failures == before ? "ok  " : "FAIL", dev->ops->name, k->name);
    free(in);
    free(out);
    return failures == before;
}

int main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "gpu") != 0 && strcmp(argv[1], "emulated") != 0)) {
        fprintf(stderr, "usage: unit_rounding [gpu|emulated]\n");
        return 2;
    }
    if (argc == 2) { /* the generated cast on that device alone */
        char why[1024];
        ddp_device *dev = open_test_device(&ddp_program_desc, argv[1], why, sizeof why);
        if (!dev) {
            bool gpu = strcmp(argv[1], "gpu") == 0;
            printf("unit_rounding: %s: %s\n", gpu ? "SKIPPED, no usable GPU" : "FAIL", why);
            return gpu ? 77 : 1;
        }
        device_cast(&ddp_program_desc, dev);
        ddp_device_close(dev);
        return failures ? 1 : 0;
    }
    tf32_cases();
    host_float();
    host_double();
    generated(&ddp_program_desc);
    return failures ? 1 : 0;
}
