/* conv_reference.c: the convolution of device.h computed on host memory by direct
 * loops, the result the emulated device gives as its cuDNN and the one the tests hold
 * cuDNN's engines to.
 *
 * The read tensors are first widened to double (an f32 factor rounded to TF32 first
 * when c->tf32, as the tensor cores read it; bf16 widens exactly); every product and sum is then formed in
 * double and the sum rounded once into the written tensor's type. A product of two
 * floats is exact in double, so the result depends on the summation order only through
 * double's rounding: far below f32's, and the same on every machine, since the order
 * is fixed:
 *   forward          y[n,p,q,k]  sums over (r, s, c), c fastest;
 *   backward data    dx[n,h,w,c] over the (p, q) that read the pixel, then k;
 *   backward filter  dw[k,r,s,c] over (n, p, q), q fastest.
 * A cuDNN engine summing in f32 lies within its own rounding of this.
 *
 * Speed: one walk over (n, p, q, r, s) for every mode, whose innermost loop runs along
 * contiguous channels (c or k) into independent sums, which the compiler vectorises
 * without reordering any one sum; the forward reads the filters transposed to
 * [r][s][c][k] for that. */
#include <stdio.h>
#include <stdlib.h>

#include "bf16.h"
#include "conv.h"

/* The three tensors widened to double; the written one holds the sums, from zero. */
typedef struct Wide {
    double *x, *w, *y;
} Wide;

static size_t image_elements(const ddp_device_conv *c) {
    return (size_t)c->n * (size_t)c->h * (size_t)c->w * (size_t)c->c;
}

static size_t output_elements(const ddp_device_conv *c) {
    return (size_t)c->n * (size_t)c->oh * (size_t)c->ow * (size_t)c->k;
}

static size_t filter_elements(const ddp_device_conv *c) {
    return (size_t)c->k * (size_t)c->r * (size_t)c->s * (size_t)c->c;
}

/* The reference has no error path its callers could take: running out of host memory
 * here ends the process, saying where. */
static double *doubles(size_t count) {
    double *p = calloc(count ? count : 1, sizeof *p);
    if (!p) {
        fprintf(stderr, "ddp_conv_reference: out of memory for %zu values\n", count);
        abort();
    }
    return p;
}

static double factor(const ddp_device_conv *c, const void *from, size_t i) {
    if (c->f64)
        return ((const double *)from)[i];
    if (c->bf16)
        return ddp_bf16_to_float(((const uint16_t *)from)[i]);
    float v = ((const float *)from)[i];
    return c->tf32 ? ddp_tf32_round(v) : v;
}

static double *widen(const ddp_device_conv *c, const void *from, size_t count) {
    double *to = doubles(count);
    for (size_t i = 0; i < count; i++)
        to[i] = factor(c, from, i);
    return to;
}

/* KRSC filters as [r][s][c][k], so the forward's innermost loop runs along k. */
static double *widen_filters_by_tap(const ddp_device_conv *c, const void *from) {
    size_t taps = (size_t)c->r * (size_t)c->s * (size_t)c->c, k_count = (size_t)c->k;
    double *to = doubles(filter_elements(c));
    for (size_t tap = 0; tap < taps; tap++)
        for (size_t k = 0; k < k_count; k++)
            to[tap * k_count + k] = factor(c, from, k * taps + tap);
    return to;
}

/* The sums into the written tensor: overwritten (beta 0), or added to it (beta 1) in
 * its own type, as cuDNN adds beta times the old value to the rounded result. */
static void narrow(const ddp_device_conv *c, const double *sums, void *to, size_t count) {
    bool add = c->beta != 0;
    if (c->f64) {
        double *out = to;
        for (size_t i = 0; i < count; i++)
            out[i] = add ? out[i] + sums[i] : sums[i];
        return;
    }
    if (c->bf16) { /* the f32 epilogue of a bf16 convolution, rounded once into bf16 */
        uint16_t *out = to;
        for (size_t i = 0; i < count; i++)
            out[i] = add ? ddp_bf16_from_float(ddp_bf16_to_float(out[i]) + (float)sums[i])
                         : ddp_bf16_from_double(sums[i]);
        return;
    }
    float *out = to;
    for (size_t i = 0; i < count; i++)
        out[i] = add ? out[i] + (float)sums[i] : (float)sums[i];
}

/* y[p,q,:] += sum_c in[c] * taps[c][:], taps the filters at (r, s) as [c][k]. */
static void forward_pixel(const double *restrict taps, const double *restrict in, double *restrict out, int channels,
                          int outputs) {
    for (int ch = 0; ch < channels; ch++) {
        double v = in[ch];
        const double *row = taps + (size_t)ch * (size_t)outputs;
        for (int k = 0; k < outputs; k++)
            out[k] += v * row[k];
    }
}

/* For each k: to_k[:] += dy[k] * from_k[:], the k-th rows a step apart (0: the same
 * row for every k). The backward data mode sums filter rows into one image pixel, the
 * backward filter mode adds one image pixel into each filter row. */
static void add_scaled_rows(const double *restrict dy, const double *restrict from, size_t from_step,
                            double *restrict to, size_t to_step, int channels, int outputs) {
    for (int k = 0; k < outputs; k++) {
        double g = dy[k];
        const double *row = from + (size_t)k * from_step;
        double *sum = to + (size_t)k * to_step;
        for (int ch = 0; ch < channels; ch++)
            sum[ch] += g * row[ch];
    }
}

/* One output pixel (n, p, q) and one filter tap (r, s) that reads the image at
 * (ih, iw), in the mode's way. */
static void visit(const ddp_device_conv *c, Wide *t, size_t image_at, size_t output_at, int r, int s) {
    size_t filter_stride = (size_t)c->r * (size_t)c->s * (size_t)c->c;
    size_t tap = ((size_t)r * (size_t)c->s + (size_t)s) * (size_t)c->c;
    switch (c->mode) {
    case DDP_CONV_FORWARD:
        forward_pixel(t->w + tap * (size_t)c->k, t->x + image_at, t->y + output_at, c->c, c->k);
        break;
    case DDP_CONV_BACKWARD_DATA:
        add_scaled_rows(t->y + output_at, t->w + tap, filter_stride, t->x + image_at, 0, c->c, c->k);
        break;
    default:
        add_scaled_rows(t->y + output_at, t->x + image_at, 0, t->w + tap, filter_stride, c->c, c->k);
        break;
    }
}

/* Every (n, p, q, r, s) whose tap falls inside the image; those in the padding read
 * zeros and add nothing. */
static void walk(const ddp_device_conv *c, Wide *t) {
    for (int n = 0; n < c->n; n++)
        for (int p = 0; p < c->oh; p++)
            for (int q = 0; q < c->ow; q++) {
                size_t output_at = (((size_t)n * (size_t)c->oh + (size_t)p) * (size_t)c->ow + (size_t)q) *
                                   (size_t)c->k;
                for (int r = 0; r < c->r; r++) {
                    int ih = p * c->stride[0] - c->pad_before[0] + r * c->dilation[0];
                    if (ih < 0 || ih >= c->h)
                        continue;
                    for (int s = 0; s < c->s; s++) {
                        int iw = q * c->stride[1] - c->pad_before[1] + s * c->dilation[1];
                        if (iw < 0 || iw >= c->w)
                            continue;
                        size_t image_at = (((size_t)n * (size_t)c->h + (size_t)ih) * (size_t)c->w + (size_t)iw) *
                                          (size_t)c->c;
                        visit(c, t, image_at, output_at, r, s);
                    }
                }
            }
}

void ddp_conv_reference(const ddp_device_conv *c, void *x, void *filters, void *y) {
    Wide t;
    size_t written;
    void *to;
    switch (c->mode) {
    case DDP_CONV_FORWARD:
        t = (Wide){widen(c, x, image_elements(c)), widen_filters_by_tap(c, filters), doubles(output_elements(c))};
        written = output_elements(c), to = y;
        break;
    case DDP_CONV_BACKWARD_DATA:
        t = (Wide){doubles(image_elements(c)), widen(c, filters, filter_elements(c)), widen(c, y, output_elements(c))};
        written = image_elements(c), to = x;
        break;
    default:
        t = (Wide){widen(c, x, image_elements(c)), doubles(filter_elements(c)), widen(c, y, output_elements(c))};
        written = filter_elements(c), to = filters;
        break;
    }
    walk(c, &t);
    narrow(c, c->mode == DDP_CONV_FORWARD ? t.y : c->mode == DDP_CONV_BACKWARD_DATA ? t.x : t.w, to, written);
    free(t.x);
    free(t.w);
    free(t.y);
}
