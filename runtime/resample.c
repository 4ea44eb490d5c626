/* resample.c: antialiased bilinear resizing (resample.h). Each output coordinate is a
 * weighted mean of the input coordinates under a triangle filter centred on it, one
 * input pixel wide when enlarging and widened by the scale when shrinking, so that a
 * smaller image averages every pixel it covers instead of sampling a few: PIL's
 * bilinear resize, and torchvision's with antialias. Weights are computed in double
 * and kept as floats; sums run in float, in a fixed order, so a window is resized to
 * the same bits on any thread or machine. */
#include "resample.h"

#include <math.h>
#include <stdlib.h>

int64_t ddp_taps_span(int64_t max_in, int64_t size) {
    double scale = (double)max_in / (double)size;
    return 2 * (int64_t)ceil(scale > 1 ? scale : 1) + 2;
}

bool ddp_taps_init(ddp_taps *t, int64_t out, int64_t span) {
    t->out = out;
    t->span = span;
    t->first = malloc((size_t)out * sizeof *t->first);
    t->n = malloc((size_t)out * sizeof *t->n);
    t->w = malloc((size_t)(out * span) * sizeof *t->w);
    if (t->first && t->n && t->w)
        return true;
    ddp_taps_free(t);
    return false;
}

void ddp_taps_free(ddp_taps *t) {
    free(t->first);
    free(t->n);
    free(t->w);
    t->first = t->n = NULL;
    t->w = NULL;
}

void ddp_taps_set(ddp_taps *t, int64_t in_first, int64_t in_len, int64_t size, int64_t offset) {
    double scale = (double)in_len / (double)size, support = scale > 1 ? scale : 1;
    for (int64_t i = 0; i < t->out; i++) {
        double centre = ((double)(offset + i) + 0.5) * scale; /* within the window */
        int64_t lo = (int64_t)floor(centre - support), hi = (int64_t)ceil(centre + support);
        lo = lo < 0 ? 0 : lo;
        hi = hi > in_len ? in_len : hi;
        hi = hi - lo > t->span ? lo + t->span : hi;
        float *w = t->w + i * t->span;
        double total = 0;
        for (int64_t k = lo; k < hi; k++) {
            double d = fabs(((double)k + 0.5 - centre) / support), weight = d < 1 ? 1 - d : 0;
            w[k - lo] = (float)weight;
            total += weight;
        }
        for (int64_t k = 0; k < hi - lo; k++)
            w[k] = total > 0 ? (float)(w[k] / total) : 0;
        t->first[i] = in_first + lo;
        t->n[i] = hi - lo;
    }
}

/* The first pass for pixels of C values, C known to the compiler (RGB, grey), so each
 * pixel's sums stay in registers. */
#define RESAMPLE_PIXELS(C)                                                                                   \
    for (int64_t x = 0; x < cols->out; x++) {                                                                \
        const float *w = cols->w + x * cols->span, *in = src + (cols->first[x] - from) * (C);                \
        float sum[C] = {0};                                                                                  \
        for (int64_t k = 0; k < cols->n[x]; k++)                                                             \
            for (int ch = 0; ch < (C); ch++)                                                                 \
                sum[ch] += w[k] * in[k * (C) + ch];                                                          \
        for (int ch = 0; ch < (C); ch++)                                                                     \
            dst[x * (C) + ch] = sum[ch];                                                                     \
    }

void ddp_resample_row(const ddp_taps *cols, const float *src, int64_t from, int64_t channels, float *dst) {
    if (channels == 3) {
        RESAMPLE_PIXELS(3);
        return;
    }
    if (channels == 1) {
        RESAMPLE_PIXELS(1);
        return;
    }
    for (int64_t x = 0; x < cols->out; x++) {
        const float *w = cols->w + x * cols->span, *in = src + (cols->first[x] - from) * channels;
        float *to = dst + x * channels;
        for (int64_t ch = 0; ch < channels; ch++)
            to[ch] = 0;
        for (int64_t k = 0; k < cols->n[x]; k++)
            for (int64_t ch = 0; ch < channels; ch++)
                to[ch] += w[k] * in[k * channels + ch];
    }
}

void ddp_resample_column(const ddp_taps *rows, int64_t i, const float *mid, int64_t from, int64_t len,
                         float *dst) {
    const float *w = rows->w + i * rows->span, *in = mid + (rows->first[i] - from) * len;
    for (int64_t x = 0; x < len; x++)
        dst[x] = 0;
    for (int64_t k = 0; k < rows->n[i]; k++)
        for (int64_t x = 0; x < len; x++)
            dst[x] += w[k] * in[k * len + x];
}
