/* gemm_small.c: the batched products' small GEMM (runtime/gemm_small.c) against a
 * product in double, for every transposition, rows and columns that fill its 6 x 16
 * tiles and that leave some over (1 row, 17 columns, ...), leading dimensions wider
 * than the product, and alpha and beta. Each element must be, bit for bit, alpha
 * times its terms added in order by fused multiply-adds, plus beta times the old value
 * (with beta 0, C is filled with NaN before, which must not leak in), and lie within
 * the rounding of such a sum of the exact product. Columns past the product are left
 * alone. Then which sizes it takes: op(B) padded to 16 columns within
 * DDP_SMALL_GEMM_FLOATS. Skipped (77) on a CPU without AVX2 and FMA. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "runtime.h"

typedef struct Case {
    int m, n, k;
    bool ta, tb;
    int pad; /* added to each leading dimension */
} Case;

static float draw(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)((int32_t)(*state >> 8) - (1 << 23)) / (float)(1 << 23);
}

static float op_at(const float *x, int ld, bool t, int row, int col) {
    return t ? x[col * ld + row] : x[row * ld + col];
}

static void check_case(const Case *c, float alpha, float beta) {
    int lda = (c->ta ? c->m : c->k) + c->pad, ldb = (c->tb ? c->k : c->n) + c->pad, ldc = c->n + c->pad;
    int arows = c->ta ? c->k : c->m, brows = c->tb ? c->n : c->k;
    float *a = malloc(sizeof(float) * (size_t)(arows * lda)), *b = malloc(sizeof(float) * (size_t)(brows * ldb));
    float *out = malloc(sizeof(float) * (size_t)(c->m * ldc)), *old = malloc(sizeof(float) * (size_t)(c->m * ldc));
    uint32_t state = (uint32_t)(c->m * 131 + c->n * 17 + c->k);
    for (int i = 0; i < arows * lda; i++)
        a[i] = draw(&state);
    for (int i = 0; i < brows * ldb; i++)
        b[i] = draw(&state);
    for (int i = 0; i < c->m * ldc; i++)
        out[i] = old[i] = beta == 0 ? NAN : draw(&state);
    ddp_small_sgemm(c->ta, c->tb, c->m, c->n, c->k, alpha, a, lda, b, ldb, beta, out, ldc);
    for (int i = 0; i < c->m; i++)
        for (int j = 0; j < ldc; j++) {
            float got = out[i * ldc + j];
            if (j >= c->n) { /* past the product: untouched */
                CHECK(isnan(got) == isnan(old[i * ldc + j]));
                continue;
            }
            float fused = 0;
            double exact = 0, size = 0;
            for (int p = 0; p < c->k; p++) {
                float x = op_at(a, lda, c->ta, i, p), y = op_at(b, ldb, c->tb, p, j);
                fused = fmaf(x, y, fused);
                exact += (double)x * y, size += fabs((double)x * y);
            }
            /* alpha times the fused sum, plus beta times the old value (NaN with beta 0:
             * left out): three roundings */
            double old_part = beta == 0 ? 0 : beta * (double)old[i * ldc + j];
            float scaled = alpha * fused, want = beta == 0 ? scaled : scaled + beta * old[i * ldc + j];
            if (got != want) {
                fprintf(stderr, "%dx%dx%d ta %d tb %d beta %g: (%d, %d) is %.9g, not %.9g\n", c->m, c->n, c->k,
                        c->ta, c->tb, beta, i, j, got, want);
                failures++;
            }
            double bound = (c->k + 2) * 0x1p-24 * (fabs(alpha) * size + fabs(old_part));
            CHECK(fabs(got - (alpha * exact + old_part)) <= bound);
        }
    free(a), free(b), free(out), free(old);
}

int main(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("no AVX2 and FMA here: skipped\n");
        return 77;
    }
    static const int sizes[][3] = {{64, 64, 16}, {64, 16, 64}, {1, 1, 1},  {6, 16, 5},   {7, 17, 3},
                                   {13, 33, 9},  {5, 8, 100},  {12, 15, 1}, {100, 64, 64}, {3, 128, 64}};
    int cases = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int pad = 0; pad <= 3; pad += 3) {
                Case c = {sizes[s][0], sizes[s][1], sizes[s][2], t & 1, (t & 2) != 0, pad};
                check_case(&c, 1, 0);
                check_case(&c, 0.125f, 0);
                check_case(&c, 1, 1);
                check_case(&c, -2, 0.5f);
                cases += 4;
            }
    CHECK(ddp_small_gemm_fits(64, 64, 128));            /* 128 x 64 = 8192 */
    CHECK(!ddp_small_gemm_fits(64, 64, 129));
    CHECK(ddp_small_gemm_fits(1, 17, DDP_SMALL_GEMM_FLOATS / 32)); /* 17 columns take 32 */
    CHECK(!ddp_small_gemm_fits(1, 17, DDP_SMALL_GEMM_FLOATS / 32 + 1));
    CHECK(!ddp_small_gemm_fits(0, 16, 16) && !ddp_small_gemm_fits(16, 0, 16) && !ddp_small_gemm_fits(16, 16, 0));
    printf("%d products checked\n", cases);
    return failures != 0;
}
