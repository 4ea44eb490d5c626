/* gemm_reference.c: cuBLAS's column-major product on host memory, in double: the
 * emulated device's cuBLAS, and the CPU's product of bf16 factors (its BLAS has none),
 * which the GPU's are held to. */
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "device.h"

/* One product of the batch, rows and cols room for op(A) and op(B) in double. */
static void product(const ddp_device_gemm *g, bool tf32, const void *a, const void *b, void *c, double *rows,
                    double *cols) {
    /* op(A) row by row and op(B) column by column, each contiguous in l, in double:
     * the same products cuBLAS sums, read in the order that keeps this loop fast. */
    size_t m = (size_t)g->m, n = (size_t)g->n, k = (size_t)g->k;
    /* bf16 factors widen exactly, and their products are exact in double */
#define AT(p, i) (g->f64    ? ((const double *)(p))[i]                                                          \
                  : g->bf16 ? (double)ddp_bf16_to_float(((const uint16_t *)(p))[i])                            \
                            : (double)((const float *)(p))[i])
    for (size_t i = 0; i < m; i++)
        for (size_t l = 0; l < k; l++)
            rows[i * k + l] = g->transa ? AT(a, i * (size_t)g->lda + l) : AT(a, l * (size_t)g->lda + i);
    for (size_t j = 0; j < n; j++)
        for (size_t l = 0; l < k; l++)
            cols[j * k + l] = g->transb ? AT(b, l * (size_t)g->ldb + j) : AT(b, j * (size_t)g->ldb + l);
    if (!g->f64 && tf32)
        for (size_t i = 0; i < (m + n) * k; i++)
            rows[i] = ddp_tf32_round((float)rows[i]);
    for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < m; i++) {
            const double *x = rows + i * k, *y = cols + j * k;
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            size_t l = 0;
            for (; l + 4 <= k; l += 4) {
                s0 += x[l] * y[l];
                s1 += x[l + 1] * y[l + 1];
                s2 += x[l + 2] * y[l + 2];
                s3 += x[l + 3] * y[l + 3];
            }
            for (; l < k; l++)
                s0 += x[l] * y[l];
            size_t at = j * (size_t)g->ldc + i;
            double v = g->alpha * ((s0 + s1) + (s2 + s3));
            if (g->beta != 0) /* beta 0: C is not read, as in cuBLAS; an f32 C of bf16 factors read as f32 */
                v += g->beta * (g->f64      ? ((const double *)c)[at]
                                : g->c_bf16 ? (double)ddp_bf16_to_float(((const uint16_t *)c)[at])
                                            : (double)((const float *)c)[at]);
            if (g->f64)
                ((double *)c)[at] = v;
            else if (g->c_bf16)
                ((uint16_t *)c)[at] = ddp_bf16_from_double(v);
            else
                ((float *)c)[at] = (float)v;
        }
#undef AT
}

bool ddp_gemm_reference(const ddp_device_gemm *g, bool tf32) {
    size_t m = (size_t)g->m, n = (size_t)g->n, k = (size_t)g->k;
    double *rows = malloc((m * k + n * k) * sizeof(double) + 1);
    if (!rows)
        return false;
    size_t width = g->f64 ? 8 : g->bf16 ? 2 : 4, width_c = g->f64 ? 8 : g->c_bf16 ? 2 : 4;
    for (int64_t i = 0; i < (g->batch > 1 ? g->batch : 1); i++)
        product(g, tf32, (const char *)(uintptr_t)g->a + (size_t)(i * g->stride_a) * width,
                (const char *)(uintptr_t)g->b + (size_t)(i * g->stride_b) * width,
                (char *)(uintptr_t)g->c + (size_t)(i * g->stride_c) * width_c, rows, rows + m * k);
    free(rows);
    return true;
}
