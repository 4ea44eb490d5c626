/* bf16.h: bfloat16 on the host: the top half of an f32 (sign, 8 bits of exponent, 7 of
 * mantissa). Widening is exact; narrowing rounds to nearest, ties to even, as the
 * GPU's cvt.rn.bf16.f32 and the generated kernels (compiler/llvm.c) do: infinities
 * stay, a value past the largest bf16 becomes infinity, a NaN stays a NaN (made quiet,
 * its sign kept). The loader, the emulated device and the tests share these. */
#ifndef DDP_BF16_H
#define DDP_BF16_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline float ddp_bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t ddp_bf16_from_float(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (f != f)
        return (uint16_t)((bits >> 16) | 0x40);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

/* A double rounded once: to f32 rounding to odd (toward zero, the last bit set when
 * inexact), which then rounds to bf16 as the double itself would. */
static inline uint16_t ddp_bf16_from_double(double d) {
    float f = (float)d;
    if (d == d && (double)f != d) {
        uint32_t bits;
        memcpy(&bits, &f, 4);
        bool away = d > 0 ? (double)f > d : (double)f < d;
        bits = (away ? bits - 1 : bits) | 1;
        memcpy(&f, &bits, 4);
    }
    return ddp_bf16_from_float(f);
}

#endif
