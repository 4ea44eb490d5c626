/* auto_augment.c: TrivialAugmentWide (Müller and Hutter, 2021), RandAugment (Cubuk et
 * al., 2020) and AutoAugment (Cubuk et al., 2019) on 8-bit images, as torchvision's
 * transforms make them on a uint8 tensor: one of fourteen operations drawn per sample
 * at one of `bins` magnitudes (trivial), `ops` of them in a row at one fixed magnitude
 * (rand), or one of a policy's 25 pairs, each step with its probability (auto), with a
 * random sign where the operation has one.
 *
 * torchvision computes these in float32 and casts back to uint8, truncating (blends)
 * or rounding (resampling); each operation here does the same arithmetic in the same
 * order, in float, so that its bytes are torchvision's (tests/unit/augment.c holds them
 * to torchvision's own, tests/reference/auto_augment.py). The file is built with
 * -ffp-contract=off: a fused multiply-add would round otherwise. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* Each operation's magnitudes: torch.linspace(0, top, bins) in float32 (solarize's from
 * 255 down to 0), signed or not; posterize's bits 8 - round(k / ((bins - 1) / span));
 * the translations' top a share of the image's side in RandAugment. Identity,
 * autocontrast and equalize have none. */
typedef struct OpSpace {
    float top, rand_top;
    bool is_signed;
} OpSpace;

static const OpSpace spaces[DDP_OP_INVERT + 1] = {
    [DDP_OP_SHEAR_X] = {0.99f, 0.3f, true},      [DDP_OP_SHEAR_Y] = {0.99f, 0.3f, true},
    [DDP_OP_TRANSLATE_X] = {32, 0, true},        [DDP_OP_TRANSLATE_Y] = {32, 0, true},
    [DDP_OP_ROTATE] = {135, 30, true},           [DDP_OP_BRIGHTNESS] = {0.99f, 0.9f, true},
    [DDP_OP_COLOR] = {0.99f, 0.9f, true},        [DDP_OP_CONTRAST] = {0.99f, 0.9f, true},
    [DDP_OP_SHARPNESS] = {0.99f, 0.9f, true},    [DDP_OP_SOLARIZE] = {255, 255, false},
};

/* ATen's linspace kernel: from the start below the halfway index, from the end above
 * it, each a fused multiply-add (its vectorised kernel's, on any CPU with FMA). */
static float linspace(float lo, float hi, int64_t bins, int64_t k) {
    if (bins == 1)
        return lo;
    float step = (hi - lo) / (float)(bins - 1);
    return k < bins / 2 ? fmaf(step, (float)k, lo) : fmaf(-step, (float)(bins - 1 - k), hi);
}

double ddp_image_op_magnitude(int kind, int op, int64_t bins, int64_t k, int64_t h, int64_t w) {
    bool rand = kind == DDP_AUGMENT_RAND || kind == DDP_AUGMENT_AUTO; /* AutoAugment's table is RandAugment's */
    switch (op) {
    case DDP_OP_IDENTITY:
    case DDP_OP_AUTOCONTRAST:
    case DDP_OP_EQUALIZE:
    case DDP_OP_INVERT:
        return 0;
    case DDP_OP_POSTERIZE: /* 8 - round(k / ((bins - 1) / span)), half to even */
        return 8 - (double)(int64_t)nearbyintf((float)k / ((float)(bins - 1) / (rand ? 4.0f : 6.0f)));
    case DDP_OP_SOLARIZE:
        return linspace(255, 0, bins, k);
    case DDP_OP_TRANSLATE_X:
    case DDP_OP_TRANSLATE_Y:
        if (rand) /* 150 / 331 of the side, as AutoAugment's 150 pixels of 331 */
            return linspace(0, (float)(150.0 / 331.0 * (double)(op == DDP_OP_TRANSLATE_X ? w : h)), bins, k);
        /* fall through */
    default:
        return linspace(0, rand ? spaces[op].rand_top : spaces[op].top, bins, k);
    }
}

/* torchvision's AutoAugment policies (from the AutoAugment paper's appendix): 25
 * pairs of (operation, probability, magnitude bin of 10 or -1) each. */
static const ddp_auto_step policies[3][DDP_AUTO_SUBPOLICIES][2] = {
    [DDP_POLICY_IMAGENET] = {
        {{DDP_OP_POSTERIZE, 0.4, 8}, {DDP_OP_ROTATE, 0.6, 9}},
        {{DDP_OP_SOLARIZE, 0.6, 5}, {DDP_OP_AUTOCONTRAST, 0.6, -1}},
        {{DDP_OP_EQUALIZE, 0.8, -1}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_POSTERIZE, 0.6, 7}, {DDP_OP_POSTERIZE, 0.6, 6}},
        {{DDP_OP_EQUALIZE, 0.4, -1}, {DDP_OP_SOLARIZE, 0.2, 4}},
        {{DDP_OP_EQUALIZE, 0.4, -1}, {DDP_OP_ROTATE, 0.8, 8}},
        {{DDP_OP_SOLARIZE, 0.6, 3}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_POSTERIZE, 0.8, 5}, {DDP_OP_EQUALIZE, 1.0, -1}},
        {{DDP_OP_ROTATE, 0.2, 3}, {DDP_OP_SOLARIZE, 0.6, 8}},
        {{DDP_OP_EQUALIZE, 0.6, -1}, {DDP_OP_POSTERIZE, 0.4, 6}},
        {{DDP_OP_ROTATE, 0.8, 8}, {DDP_OP_COLOR, 0.4, 0}},
        {{DDP_OP_ROTATE, 0.4, 9}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_EQUALIZE, 0.0, -1}, {DDP_OP_EQUALIZE, 0.8, -1}},
        {{DDP_OP_INVERT, 0.6, -1}, {DDP_OP_EQUALIZE, 1.0, -1}},
        {{DDP_OP_COLOR, 0.6, 4}, {DDP_OP_CONTRAST, 1.0, 8}},
        {{DDP_OP_ROTATE, 0.8, 8}, {DDP_OP_COLOR, 1.0, 2}},
        {{DDP_OP_COLOR, 0.8, 8}, {DDP_OP_SOLARIZE, 0.8, 7}},
        {{DDP_OP_SHARPNESS, 0.4, 7}, {DDP_OP_INVERT, 0.6, -1}},
        {{DDP_OP_SHEAR_X, 0.6, 5}, {DDP_OP_EQUALIZE, 1.0, -1}},
        {{DDP_OP_COLOR, 0.4, 0}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_EQUALIZE, 0.4, -1}, {DDP_OP_SOLARIZE, 0.2, 4}},
        {{DDP_OP_SOLARIZE, 0.6, 5}, {DDP_OP_AUTOCONTRAST, 0.6, -1}},
        {{DDP_OP_INVERT, 0.6, -1}, {DDP_OP_EQUALIZE, 1.0, -1}},
        {{DDP_OP_COLOR, 0.6, 4}, {DDP_OP_CONTRAST, 1.0, 8}},
        {{DDP_OP_EQUALIZE, 0.8, -1}, {DDP_OP_EQUALIZE, 0.6, -1}},
    },
    [DDP_POLICY_CIFAR10] = {
        {{DDP_OP_INVERT, 0.1, -1}, {DDP_OP_CONTRAST, 0.2, 6}},
        {{DDP_OP_ROTATE, 0.7, 2}, {DDP_OP_TRANSLATE_X, 0.3, 9}},
        {{DDP_OP_SHARPNESS, 0.8, 1}, {DDP_OP_SHARPNESS, 0.9, 3}},
        {{DDP_OP_SHEAR_Y, 0.5, 8}, {DDP_OP_TRANSLATE_Y, 0.7, 9}},
        {{DDP_OP_AUTOCONTRAST, 0.5, -1}, {DDP_OP_EQUALIZE, 0.9, -1}},
        {{DDP_OP_SHEAR_Y, 0.2, 7}, {DDP_OP_POSTERIZE, 0.3, 7}},
        {{DDP_OP_COLOR, 0.4, 3}, {DDP_OP_BRIGHTNESS, 0.6, 7}},
        {{DDP_OP_SHARPNESS, 0.3, 9}, {DDP_OP_BRIGHTNESS, 0.7, 9}},
        {{DDP_OP_EQUALIZE, 0.6, -1}, {DDP_OP_EQUALIZE, 0.5, -1}},
        {{DDP_OP_CONTRAST, 0.6, 7}, {DDP_OP_SHARPNESS, 0.6, 5}},
        {{DDP_OP_COLOR, 0.7, 7}, {DDP_OP_TRANSLATE_X, 0.5, 8}},
        {{DDP_OP_EQUALIZE, 0.3, -1}, {DDP_OP_AUTOCONTRAST, 0.4, -1}},
        {{DDP_OP_TRANSLATE_Y, 0.4, 3}, {DDP_OP_SHARPNESS, 0.2, 6}},
        {{DDP_OP_BRIGHTNESS, 0.9, 6}, {DDP_OP_COLOR, 0.2, 8}},
        {{DDP_OP_SOLARIZE, 0.5, 2}, {DDP_OP_INVERT, 0.0, -1}},
        {{DDP_OP_EQUALIZE, 0.2, -1}, {DDP_OP_AUTOCONTRAST, 0.6, -1}},
        {{DDP_OP_EQUALIZE, 0.2, -1}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_COLOR, 0.9, 9}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_AUTOCONTRAST, 0.8, -1}, {DDP_OP_SOLARIZE, 0.2, 8}},
        {{DDP_OP_BRIGHTNESS, 0.1, 3}, {DDP_OP_COLOR, 0.7, 0}},
        {{DDP_OP_SOLARIZE, 0.4, 5}, {DDP_OP_AUTOCONTRAST, 0.9, -1}},
        {{DDP_OP_TRANSLATE_Y, 0.9, 9}, {DDP_OP_TRANSLATE_Y, 0.7, 9}},
        {{DDP_OP_AUTOCONTRAST, 0.9, -1}, {DDP_OP_SOLARIZE, 0.8, 3}},
        {{DDP_OP_EQUALIZE, 0.8, -1}, {DDP_OP_INVERT, 0.1, -1}},
        {{DDP_OP_TRANSLATE_Y, 0.7, 9}, {DDP_OP_AUTOCONTRAST, 0.9, -1}},
    },
    [DDP_POLICY_SVHN] = {
        {{DDP_OP_SHEAR_X, 0.9, 4}, {DDP_OP_INVERT, 0.2, -1}},
        {{DDP_OP_SHEAR_Y, 0.9, 8}, {DDP_OP_INVERT, 0.7, -1}},
        {{DDP_OP_EQUALIZE, 0.6, -1}, {DDP_OP_SOLARIZE, 0.6, 6}},
        {{DDP_OP_INVERT, 0.9, -1}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_EQUALIZE, 0.6, -1}, {DDP_OP_ROTATE, 0.9, 3}},
        {{DDP_OP_SHEAR_X, 0.9, 4}, {DDP_OP_AUTOCONTRAST, 0.8, -1}},
        {{DDP_OP_SHEAR_Y, 0.9, 8}, {DDP_OP_INVERT, 0.4, -1}},
        {{DDP_OP_SHEAR_Y, 0.9, 5}, {DDP_OP_SOLARIZE, 0.2, 6}},
        {{DDP_OP_INVERT, 0.9, -1}, {DDP_OP_AUTOCONTRAST, 0.8, -1}},
        {{DDP_OP_EQUALIZE, 0.6, -1}, {DDP_OP_ROTATE, 0.9, 3}},
        {{DDP_OP_SHEAR_X, 0.9, 4}, {DDP_OP_SOLARIZE, 0.3, 3}},
        {{DDP_OP_SHEAR_Y, 0.8, 8}, {DDP_OP_INVERT, 0.7, -1}},
        {{DDP_OP_EQUALIZE, 0.9, -1}, {DDP_OP_TRANSLATE_Y, 0.6, 6}},
        {{DDP_OP_INVERT, 0.9, -1}, {DDP_OP_EQUALIZE, 0.6, -1}},
        {{DDP_OP_CONTRAST, 0.3, 3}, {DDP_OP_ROTATE, 0.8, 4}},
        {{DDP_OP_INVERT, 0.8, -1}, {DDP_OP_TRANSLATE_Y, 0.0, 2}},
        {{DDP_OP_SHEAR_Y, 0.7, 6}, {DDP_OP_SOLARIZE, 0.4, 8}},
        {{DDP_OP_INVERT, 0.6, -1}, {DDP_OP_ROTATE, 0.8, 4}},
        {{DDP_OP_SHEAR_Y, 0.3, 7}, {DDP_OP_TRANSLATE_X, 0.9, 3}},
        {{DDP_OP_SHEAR_X, 0.1, 6}, {DDP_OP_INVERT, 0.6, -1}},
        {{DDP_OP_SOLARIZE, 0.7, 2}, {DDP_OP_TRANSLATE_Y, 0.6, 7}},
        {{DDP_OP_SHEAR_Y, 0.8, 4}, {DDP_OP_INVERT, 0.8, -1}},
        {{DDP_OP_SHEAR_X, 0.7, 9}, {DDP_OP_TRANSLATE_Y, 0.8, 3}},
        {{DDP_OP_SHEAR_Y, 0.8, 5}, {DDP_OP_AUTOCONTRAST, 0.7, -1}},
        {{DDP_OP_SHEAR_X, 0.7, 2}, {DDP_OP_INVERT, 0.1, -1}},
    },
};

ddp_auto_step ddp_auto_policy_step(int policy, int index, int which) {
    return policies[policy][index][which];
}

/* An AutoAugment sample: element 0 picks the pair and draws the first step's chance,
 * element 1 the second's and both signs; a step applies where its chance is at most
 * its probability (torchvision's probs[i] <= p), at its bin of RandAugment's table of
 * 10, negated where its draw says (signs[i] == 0). */
static int auto_policy_draw(const ddp_augment *a, const ddp_draw_key *key, int64_t place, int64_t sample, int64_t h,
                            int64_t w, ddp_image_op *out) {
    uint32_t d[2][4];
    for (uint32_t e = 0; e < 2; e++)
        ddp_augment_draws(key, place, sample, e, d[e]);
    int index = (int)ddp_draw_below(d[0], DDP_AUTO_SUBPOLICIES), count = 0;
    double chance[2] = {ddp_uniform53(d[0] + 2), ddp_uniform53(d[1])};
    for (int which = 0; which < 2; which++) {
        ddp_auto_step step = policies[a->policy][index][which];
        if (!(chance[which] <= step.probability))
            continue;
        double magnitude = step.bin < 0 ? 0 : ddp_image_op_magnitude(DDP_AUGMENT_AUTO, step.op, 10, step.bin, h, w);
        bool negative = spaces[step.op].is_signed && (d[1][2 + which] & 1);
        out[count++] = (ddp_image_op){step.op, negative ? -magnitude : magnitude};
    }
    return count;
}

/* The draws of a sample's operation j: element 2j picks the operation (and for
 * trivial_augment its bin), element 2j + 1 its sign. */
int ddp_auto_augment_draw(const ddp_augment *a, const ddp_draw_key *key, int64_t place, int64_t sample, int64_t h,
                          int64_t w, ddp_image_op *out) {
    if (a->kind == DDP_AUGMENT_AUTO)
        return auto_policy_draw(a, key, place, sample, h, w, out);
    int count = a->kind == DDP_AUGMENT_RAND ? (int)a->ops : 1;
    for (int j = 0; j < count; j++) {
        uint32_t d[4], sign[4];
        ddp_augment_draws(key, place, sample, 2 * (uint32_t)j, d);
        ddp_augment_draws(key, place, sample, 2 * (uint32_t)j + 1, sign);
        out[j].op = (int)ddp_draw_below(d, DDP_IMAGE_OPS);
        int64_t k = a->kind == DDP_AUGMENT_RAND ? a->strength : ddp_draw_below(d + 2, a->size);
        out[j].magnitude = ddp_image_op_magnitude((int)a->kind, out[j].op, a->size, k, h, w);
        if (spaces[out[j].op].is_signed && (sign[0] & 1))
            out[j].magnitude = -out[j].magnitude;
    }
    return count;
}

/* ------------------------------------------------------------ pixels */

typedef struct Bytes {
    unsigned char *at; /* [h][w][c] */
    int64_t h, w, c;
} Bytes;

/* float to uint8 as torch's .to(uint8) after a clamp to [0, 255]: truncation, the
 * clamp made on the integer (conditional moves, not branches on the data; the values
 * here lie well within an int). */
static unsigned char to_byte(float v) {
    int i = (int)v;
    i = i > 0 ? i : 0;
    return (unsigned char)(i < 255 ? i : 255);
}

/* torchvision's rgb_to_grayscale on uint8: ((0.2989 r + 0.587 g) + 0.114 b) in float32,
 * truncated. */
static unsigned char grey_byte(const unsigned char *rgb) {
    float v = 0.2989f * (float)rgb[0] + 0.587f * (float)rgb[1];
    return (unsigned char)(v + 0.114f * (float)rgb[2]);
}

/* v rounded to the nearest whole number, half to even (torch.round's, and nearbyintf's
 * in the default mode), for |v| < 2^22: adding 1.5 x 2^23 leaves no fraction to keep.
 * Inline, where nearbyintf and floorf are calls on the baseline x86-64. */
static inline float round_even(float v) {
    return (v + 12582912.0f) - 12582912.0f;
}

static inline int64_t floor_int(float v) {
    int64_t i = (int64_t)v;
    return i - ((float)i > v);
}

/* Every byte of the image through a table of the 256 (an operation of the byte alone:
 * computed 256 times, not once a value). */
static void look_up(Bytes *m, const unsigned char table[256]) {
    unsigned char *at = m->at;
    for (int64_t e = 0, n = m->h * m->w * m->c; e < n; e++)
        at[e] = table[at[e]];
}

/* _blend: ratio x + (1 - ratio) y, in float32, clamped and truncated; y is the other
 * image's value (other: NULL for the constant `y`, the same for every x: a table). */
static void blend(Bytes *m, const unsigned char *other, float y, double ratio) {
    float r = (float)ratio, s = (float)(1.0 - ratio);
    if (!other) {
        unsigned char table[256];
        for (int b = 0; b < 256; b++)
            table[b] = to_byte(r * (float)b + s * y);
        look_up(m, table);
        return;
    }
    unsigned char *at = m->at; /* not m->at in the loop: a byte store may alias *m */
    for (int64_t e = 0, n = m->h * m->w * m->c; e < n; e++)
        at[e] = to_byte(r * (float)at[e] + s * (float)other[e]);
}

/* adjust_saturation (the grey of each pixel, as a byte) and adjust_contrast (the mean
 * of those greys, or of a grey image's values, in float32: exact sums of integers below
 * 2^24 divided once). */
static void saturate(Bytes *m, double factor, unsigned char *scratch) {
    if (m->c != 3)
        return;
    for (int64_t x = 0; x < m->h * m->w; x++)
        scratch[3 * x] = scratch[3 * x + 1] = scratch[3 * x + 2] = grey_byte(m->at + 3 * x);
    blend(m, scratch, 0, factor);
}

static void contrast(Bytes *m, double factor) {
    double sum = 0;
    int64_t pixels = m->h * m->w;
    for (int64_t x = 0; x < pixels; x++)
        sum += m->c == 3 ? grey_byte(m->at + 3 * x) : m->at[x];
    blend(m, NULL, (float)sum / (float)pixels, factor);
}

/* adjust_sharpness: the image blended with its smoothing by [[1, 1, 1], [1, 5, 1], [1,
 * 1, 1]] / 13 inside a one-pixel border (the border as it is), rounded to bytes. */
static void sharpen(Bytes *m, double factor, unsigned char *scratch) {
    if (m->h <= 2 || m->w <= 2)
        return;
    const float side = 1.0f / 13.0f, centre = 5.0f / 13.0f;
    const float taps[9] = {side, side, side, side, centre, side, side, side, side};
    const unsigned char *at = m->at;
    int64_t w = m->w, c = m->c, row = w * c;
    memcpy(scratch, at, (size_t)(m->h * row));
    for (int64_t y = 1; y < m->h - 1; y++)
        for (int64_t e = y * row + c; e < (y + 1) * row - c; e++) {
            const unsigned char *above = at + e - row - c, *level = at + e - c, *below = at + e + row - c;
            float sum = 0;
            for (int k = 0; k < 3; k++) /* the taps in rows, as torch's convolution sums them */
                sum += taps[k] * (float)above[k * c];
            for (int k = 0; k < 3; k++)
                sum += taps[3 + k] * (float)level[k * c];
            for (int k = 0; k < 3; k++)
                sum += taps[6 + k] * (float)below[k * c];
            scratch[e] = (unsigned char)round_even(sum);
        }
    blend(m, scratch, 0, factor);
}

static void posterize(Bytes *m, int bits) {
    unsigned char mask = (unsigned char)(256 - (1 << (8 - bits))), *at = m->at;
    for (int64_t e = 0, n = m->h * m->w * m->c; e < n; e++)
        at[e] &= mask;
}

static void solarize(Bytes *m, double threshold) {
    unsigned char table[256];
    for (int b = 0; b < 256; b++)
        table[b] = (unsigned char)(b >= threshold ? 255 - b : b);
    look_up(m, table);
}

/* Each channel stretched to [0, 255]: (x - min) * (255 / (max - min)), in float32. */
static void autocontrast(Bytes *m) {
    int64_t pixels = m->h * m->w;
    for (int64_t c = 0; c < m->c; c++) {
        unsigned char lo = 255, hi = 0;
        for (int64_t x = 0; x < pixels; x++) {
            unsigned char v = m->at[x * m->c + c];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        if (lo == hi)
            continue; /* torchvision's scale of 1 from 0: the channel as it is */
        float scale = 255.0f / ((float)hi - (float)lo);
        unsigned char table[256];
        for (int b = 0; b < 256; b++)
            table[b] = to_byte(((float)b - (float)lo) * scale);
        for (int64_t x = 0; x < pixels; x++)
            m->at[x * m->c + c] = table[m->at[x * m->c + c]];
    }
}

/* Each channel's histogram equalised as torchvision's _scale_channel: a step of the
 * counts but the largest value's over 255, and a table of the running counts. */
static void equalize(Bytes *m) {
    int64_t pixels = m->h * m->w;
    for (int64_t c = 0; c < m->c; c++) {
        int64_t hist[256] = {0}, last = -1, table[256];
        for (int64_t x = 0; x < pixels; x++)
            hist[m->at[x * m->c + c]]++;
        int64_t total = 0;
        for (int v = 0; v < 256; v++)
            if (hist[v]) {
                total += hist[v];
                last = v;
            }
        int64_t step = (total - hist[last]) / 255;
        if (step == 0)
            continue;
        int64_t running = 0;
        for (int v = 0; v < 256; v++) { /* table[v]: the running count up to v - 1, shifted by one */
            int64_t entry = (running + step / 2) / step;
            table[v] = entry < 255 ? entry : 255;
            running += hist[v];
        }
        for (int64_t x = 0; x < pixels; x++)
            m->at[x * m->c + c] = (unsigned char)table[m->at[x * m->c + c]];
    }
}

/* ------------------------------------------------------------ geometry */

/* torchvision's _get_inverse_affine_matrix, in double as Python computes it. */
static void inverse_affine(double cx, double cy, double angle, double tx, double ty, double shear_x,
                           double shear_y, double matrix[6]) {
    double rot = angle * M_PI / 180, sx = shear_x * M_PI / 180, sy = shear_y * M_PI / 180;
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    double inverse[6] = {d, -b, 0.0, -c, a, 0.0};
    inverse[2] += inverse[0] * (-cx - tx) + inverse[1] * (-cy - ty);
    inverse[5] += inverse[3] * (-cx - tx) + inverse[4] * (-cy - ty);
    inverse[2] += cx;
    inverse[5] += cy;
    memcpy(matrix, inverse, sizeof inverse);
}

/* The image resampled through the inverse matrix as F_t.affine does: each output
 * pixel's centre, relative to the image's centre, through the matrix (in float32,
 * divided by half the sides: bmm's plain sum of products for small images), then
 * grid_sample's CPU kernel: its unnormalisation (align_corners = false) and the nearest
 * pixel (half to even) or the bilinear weights, outside the image zero, rounded to
 * bytes. That kernel's products and sums are fused multiply-adds where the CPU has
 * them (its compiler contracts them), so they are here: the hardware's where there is
 * one (resample_fused), else libm's, as exact and slower. The grid's linspace holds
 * half-integers, exact as k + its start. */
static inline __attribute__((always_inline)) void resample_body(Bytes *m, const double matrix[6], bool bilinear,
                                                                unsigned char *scratch) {
    float t[6], half_w = (float)m->w * 0.5f, half_h = (float)m->h * 0.5f;
    for (int k = 0; k < 6; k++)
        t[k] = (float)matrix[k];
    float gx_x = t[0] / half_w, gx_y = t[1] / half_w, gx_1 = t[2] / half_w; /* theta^T / [w / 2, h / 2] */
    float gy_x = t[3] / half_h, gy_y = t[4] / half_h, gy_1 = t[5] / half_h;
    float fw = (float)m->w, fh = (float)m->h;
    for (int64_t y = 0; y < m->h; y++) {
        float base_y = (float)y + (-fh * 0.5f + 0.5f);
        for (int64_t x = 0; x < m->w; x++) {
            float base_x = (float)x + (-fw * 0.5f + 0.5f);
            float gx = base_x * gx_x + base_y * gx_y + gx_1, gy = base_x * gy_x + base_y * gy_y + gy_1;
            float ix = fmaf(gx + 1, fw / 2, -0.5f), iy = fmaf(gy + 1, fh / 2, -0.5f);
            unsigned char *to = scratch + (y * m->w + x) * m->c;
            if (!bilinear) {
                int64_t sx = (int64_t)round_even(ix), sy = (int64_t)round_even(iy);
                bool inside = sx >= 0 && sx < m->w && sy >= 0 && sy < m->h;
                for (int64_t c = 0; c < m->c; c++)
                    to[c] = inside ? m->at[(sy * m->w + sx) * m->c + c] : 0;
                continue;
            }
            int64_t x0 = floor_int(ix), y0 = floor_int(iy);
            float wx = ix - (float)x0, ex = 1 - wx, wy = iy - (float)y0, ey = 1 - wy;
            float weights[4] = {ey * ex, ey * wx, wy * ex, wy * wx}; /* nw, ne, sw, se */
            for (int64_t c = 0; c < m->c; c++) {
                float sum = 0;
                for (int k = 0; k < 4; k++) {
                    int64_t sx = x0 + (k & 1), sy = y0 + (k >> 1);
                    bool inside = sx >= 0 && sx < m->w && sy >= 0 && sy < m->h;
                    float value = inside ? (float)m->at[(sy * m->w + sx) * m->c + c] : 0;
                    sum = k ? fmaf(value, weights[k], sum) : value * weights[k];
                }
                to[c] = (unsigned char)round_even(sum);
            }
        }
    }
    memcpy(m->at, scratch, (size_t)(m->h * m->w * m->c));
}

__attribute__((target("fma"))) static void resample_fused(Bytes *m, const double matrix[6], bool bilinear,
                                                           unsigned char *scratch) {
    resample_body(m, matrix, bilinear, scratch);
}

static void resample_plain(Bytes *m, const double matrix[6], bool bilinear, unsigned char *scratch) {
    resample_body(m, matrix, bilinear, scratch);
}

static void resample(Bytes *m, const double matrix[6], bool bilinear, unsigned char *scratch) {
    if (__builtin_cpu_supports("fma"))
        resample_fused(m, matrix, bilinear, scratch);
    else
        resample_plain(m, matrix, bilinear, scratch);
}

void ddp_image_op_apply(const ddp_image_op *t, bool bilinear, unsigned char *image, int64_t h, int64_t w,
                       int64_t channels, unsigned char *scratch) {
    Bytes m = {image, h, w, channels};
    double v = t->magnitude, matrix[6];
    double shear = atan(v) * 180 / M_PI; /* math.degrees(math.atan(v)) */
    switch (t->op) {
    case DDP_OP_SHEAR_X: /* about the top left corner: center = [0, 0] */
        inverse_affine(-(double)w * 0.5, -(double)h * 0.5, 0, 0, 0, shear, 0, matrix);
        resample(&m, matrix, bilinear, scratch);
        break;
    case DDP_OP_SHEAR_Y:
        inverse_affine(-(double)w * 0.5, -(double)h * 0.5, 0, 0, 0, 0, shear, matrix);
        resample(&m, matrix, bilinear, scratch);
        break;
    case DDP_OP_TRANSLATE_X:
        inverse_affine(0, 0, 0, (double)(int64_t)v, 0, 0, 0, matrix);
        resample(&m, matrix, bilinear, scratch);
        break;
    case DDP_OP_TRANSLATE_Y:
        inverse_affine(0, 0, 0, 0, (double)(int64_t)v, 0, 0, matrix);
        resample(&m, matrix, bilinear, scratch);
        break;
    case DDP_OP_ROTATE: /* F.rotate turns by -angle */
        inverse_affine(0, 0, -v, 0, 0, 0, 0, matrix);
        resample(&m, matrix, bilinear, scratch);
        break;
    case DDP_OP_BRIGHTNESS:
        blend(&m, NULL, 0, 1 + v);
        break;
    case DDP_OP_COLOR:
        saturate(&m, 1 + v, scratch);
        break;
    case DDP_OP_CONTRAST:
        contrast(&m, 1 + v);
        break;
    case DDP_OP_SHARPNESS:
        sharpen(&m, 1 + v, scratch);
        break;
    case DDP_OP_POSTERIZE:
        posterize(&m, (int)v);
        break;
    case DDP_OP_SOLARIZE:
        solarize(&m, v);
        break;
    case DDP_OP_AUTOCONTRAST:
        autocontrast(&m);
        break;
    case DDP_OP_EQUALIZE:
        equalize(&m);
        break;
    case DDP_OP_INVERT: {
        unsigned char table[256];
        for (int b = 0; b < 256; b++)
            table[b] = (unsigned char)(255 - b);
        look_up(&m, table);
        break;
    }
    default: /* identity */
        break;
    }
}
