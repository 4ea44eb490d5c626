/* gemm_small.c: the many small f32 products of a batched GEMM (attention's, a product
 * per sample and head: 64 x 64 x 16 for a GPT of 64 tokens and heads of 16) on a CPU
 * with AVX2 and FMA. OpenBLAS packs both factors and walks its blocking on each such
 * call; here op(B) is copied once into rows of 16 floats and each tile of 6 x 16
 * outputs is summed in registers, term after term in order, so the result depends on
 * nothing but the factors (the char-level GPT's attention products take a fifth to two
 * fifths less time on one thread of an AMD EPYC). */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime.h"

enum { TILE_ROWS = 6, TILE_COLS = 16, PACKED_MAX = DDP_SMALL_GEMM_FLOATS };

#define TILE_KERNEL static inline __attribute__((always_inline, target("avx2,fma")))

/* op(A)'s element (i, p) */
TILE_KERNEL float a_at(const float *a, int64_t lda, bool ta, int64_t i, int64_t p) {
    return ta ? a[p * lda + i] : a[i * lda + p];
}

/* Rows [i0, i0 + rows) and columns [j0, j0 + 16) of C (cols of them real), from
 * packed op(B) (k rows of `stride` floats): alpha times the sum, plus beta times C
 * unless beta is 0 (C is then not read: it may hold anything). */
TILE_KERNEL void tile(int rows, const float *a, int64_t lda, bool ta, const float *packed, int64_t stride,
                      int64_t k, int64_t i0, int64_t j0, int64_t cols, float alpha, float beta, float *c,
                      int64_t ldc) {
    __m256 lo[TILE_ROWS], hi[TILE_ROWS];
#pragma GCC unroll 6
    for (int r = 0; r < TILE_ROWS; r++)
        lo[r] = hi[r] = _mm256_setzero_ps();
    const float *b = packed + j0;
    for (int64_t p = 0; p < k; p++, b += stride) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
        for (int r = 0; r < TILE_ROWS; r++)
            if (r < rows) {
                __m256 x = _mm256_set1_ps(a_at(a, lda, ta, i0 + r, p));
                lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
            }
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int r = 0; r < TILE_ROWS; r++)
        if (r < rows) {
            /* a last tile's row short of 16 columns goes through `part` */
            float part[TILE_COLS] = {0}, *out = c + (i0 + r) * ldc + j0;
            float *to = cols == TILE_COLS ? out : part;
            if (beta != 0 && to == part)
                memcpy(part, out, (size_t)cols * sizeof *part);
            __m256 s0 = _mm256_mul_ps(lo[r], va), s1 = _mm256_mul_ps(hi[r], va);
            if (beta != 0) {
                s0 = _mm256_add_ps(s0, _mm256_mul_ps(vb, _mm256_loadu_ps(to)));
                s1 = _mm256_add_ps(s1, _mm256_mul_ps(vb, _mm256_loadu_ps(to + 8)));
            }
            _mm256_storeu_ps(to, s0);
            _mm256_storeu_ps(to + 8, s1);
            if (to == part)
                memcpy(out, part, (size_t)cols * sizeof *part);
        }
}

/* tile() with rows and the transposition of A constants, each pair its own inlined
 * copy: with ta a variable, the loop over the terms tested it every term and GCC's -O3
 * kept one of the twelve sums on the stack, a store and a load each term (the
 * attention's products on data in cache took 1.4 to 1.9 times as long). */
__attribute__((target("avx2,fma"))) static void tile_rows(int rows, const float *a, int64_t lda, bool ta,
                                                          const float *packed, int64_t stride, int64_t k,
                                                          int64_t i0, int64_t j0, int64_t cols, float alpha,
                                                          float beta, float *c, int64_t ldc) {
    switch (rows * 2 + ta) {
#define ROWS(n)                                                                                          \
    case 2 * n: tile(n, a, lda, false, packed, stride, k, i0, j0, cols, alpha, beta, c, ldc); break;   \
    case 2 * n + 1: tile(n, a, lda, true, packed, stride, k, i0, j0, cols, alpha, beta, c, ldc); break;
        ROWS(6) ROWS(5) ROWS(4) ROWS(3) ROWS(2) ROWS(1)
#undef ROWS
    }
}

bool ddp_small_gemm_fits(int64_t m, int64_t n, int64_t k) {
    int64_t stride = (n + TILE_COLS - 1) / TILE_COLS * TILE_COLS;
    return m > 0 && n > 0 && k > 0 && k * stride <= PACKED_MAX;
}

__attribute__((target("avx2,fma"))) void ddp_small_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                                         float alpha, const float *a, int64_t lda, const float *b,
                                                         int64_t ldb, float beta, float *c, int64_t ldc) {
    int64_t stride = (n + TILE_COLS - 1) / TILE_COLS * TILE_COLS;
    float packed[PACKED_MAX] __attribute__((aligned(32)));
    for (int64_t p = 0; p < k; p++) {
        float *row = packed + p * stride;
        if (tb)
            for (int64_t j = 0; j < n; j++)
                row[j] = b[j * ldb + p];
        else
            memcpy(row, b + p * ldb, (size_t)n * sizeof *row);
        memset(row + n, 0, (size_t)(stride - n) * sizeof *row);
    }
    for (int64_t j0 = 0; j0 < n; j0 += TILE_COLS) {
        int64_t cols = n - j0 < TILE_COLS ? n - j0 : TILE_COLS;
        for (int64_t i0 = 0; i0 < m; i0 += TILE_ROWS) {
            int rows = (int)(m - i0 < TILE_ROWS ? m - i0 : TILE_ROWS);
            tile_rows(rows, a, lda, ta, packed, stride, k, i0, j0, cols, alpha, beta, c, ldc);
        }
    }
}
