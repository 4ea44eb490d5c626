/* philox.c: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11), the counter-based generator behind every random draw of a run; the
 * compiler generates the same function for the kernels (compiler/mathgen.c). */
#include <math.h>

#include "runtime.h"

void ddp_philox4(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
    uint32_t k0 = key[0], k1 = key[1];
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void ddp_draw(uint64_t seed, uint32_t stream, uint64_t sample, uint32_t element, uint32_t step,
              uint32_t out[4]) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ stream};
    uint32_t ctr[4] = {element, (uint32_t)sample, (uint32_t)(sample >> 32), step};
    ddp_philox4(key, ctr, out);
}

double ddp_uniform53(const uint32_t w[2]) {
    return ((double)(w[0] >> 5) * 67108864.0 + (double)(w[1] >> 6)) * (1.0 / 9007199254740992.0);
}

/* The high half of a 64 x 64-bit product, whose bias (below bound / 2^64) no one can
 * see. */
int64_t ddp_draw_below(const uint32_t w[2], int64_t bound) {
    uint64_t r = ((uint64_t)w[0] << 32) | w[1];
    return (int64_t)(((unsigned __int128)r * (uint64_t)bound) >> 64);
}

/* ------------------------------------------------ normal draws, portably */

/* Initial parameters must be bit-identical on every machine, and libm's log and cos
 * may differ in the last place between versions and CPU variants. These use only
 * IEEE additions, multiplications and divisions in a fixed order (this file is built
 * with -ffp-contract=off), so every x86-64, ARM or GPU host computes the same bits. */

static const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;

/* ln x for x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s),
 * s = (m - 1) / (m + 1), |s| < 0.172, summed to s^23 (error below 1e-18). */
static double portable_log(double x) {
    int e = 0;
    while (x >= 1.4142135623730951) {
        x *= 0.5;
        e++;
    }
    while (x < 0.7071067811865476) {
        x *= 2;
        e--;
    }
    double s = (x - 1) / (x + 1), s2 = s * s, sum = 0;
    for (int k = 23; k >= 1; k -= 2)
        sum = sum * s2 + 1.0 / k;
    return (double)e * ln2_hi + ((double)e * ln2_lo + 2 * s * sum);
}

/* cos t for t in [0, 2 pi): t = k pi/2 + r with |r| <= pi/4, then the Taylor series of
 * cos or sin of r to r^20 (error below 1e-20). */
static double portable_cos(double t) {
    static const double half_pi_hi = 1.57079632679489655800e+00, half_pi_lo = 6.12323399573676603587e-17;
    double k = (double)(int64_t)(t / half_pi_hi + 0.5);
    double r = (t - k * half_pi_hi) - k * half_pi_lo, r2 = r * r;
    double c = 1, s = 1, term_c = 1, term_s = 1;
    for (int n = 1; n <= 10; n++) {
        term_c *= -r2 / (double)((2 * n - 1) * (2 * n));
        term_s *= -r2 / (double)((2 * n) * (2 * n + 1));
        c += term_c;
        s += term_s;
    }
    s *= r;
    switch ((int64_t)k & 3) {
    case 0: return c;
    case 1: return -s;
    case 2: return -c;
    default: return s;
    }
}

double ddp_normal(const uint32_t w[4]) {
    uint32_t second[4] = {w[2], w[3], 0, 0};
    double u1 = ddp_uniform53(w), u2 = ddp_uniform53(second);
    return sqrt(-2 * portable_log(1 - u1)) * portable_cos(2 * M_PI * u2);
}
