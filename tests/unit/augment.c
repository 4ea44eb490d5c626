/* augment.c: the random changes of training samples (a dataset's `augment`).
 *
 * The images' values are all different and none is zero, so what an augmentation did
 * can be read back: each result must be exactly one of the images it may give (the
 * image mirrored or not along each axis its mode names, then moved to one of the
 * (2p + 1)^2 places of a crop, zero where the crop is in the padding), written here
 * from those definitions alone. Over thousands of samples every outcome must come
 * about about as often as chance says. The draws depend on the seed, the epoch and the
 * sample alone: a sample changes alike at any row of any batch, in f32, f64 and bf16
 * (two-byte elements), [h, w] or [h, w, c]; another epoch or seed changes it otherwise;
 * and validation (no key) reads it as it is. A cutout erases a square centred on any
 * pixel alike. A normalised dataset's padding is the normalised zero of each channel.
 * The loader gives a pass's batches the same bits on 1, 2, 3 or 5 threads.
 *
 * random_color: ddp_color_image against torchvision's functions (color_reference.h),
 * its draws (every order as likely, the factors uniform in their ranges), and a sample
 * changed through ddp_augment_sample as the draws and the functions say, its
 * normalisation undone and made again, in each element type. random_erasing's boxes
 * and values, random_grayscale's share and greys. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "fnv.h"
#include "runtime.h"

#include "color_reference.h"
#include "auto_augment_reference.h"

enum { H = 5, W = 7, C = 2, PER = H * W * C, SAMPLES = 4000, PAD = 2 };

/* An outcome: the flips, then the crop's move (dy, dx in [-PAD, PAD]). */
typedef struct Outcome {
    int hflip, vflip, dy, dx;
} Outcome;

/* The normalisation of the dataset under test (none: NULL), each channel's pair. */
static const ddp_channel *normalized;

/* A value of the image as the batch holds it, normalised as the runtime does (in
 * double, rounded to f32 where f32, and that to bf16 where bf16: its bits). */
static double as_held(double v, int c, size_t elem) {
    if (!normalized)
        return v;
    double n = (v - normalized[c].mean) / normalized[c].std;
    return elem == 2 ? ddp_bf16_from_float((float)n) : elem == 4 ? (float)n : n;
}

/* 1 .. 70: exact in every element type tried here, bf16's included. */
static double original(int y, int x, int c) {
    return 1 + (y * W + x) * C + c;
}

/* Pixel (y, x) of the outcome: the mirrored image's (y + dy, x + dx), or the padding. */
static double expected(Outcome o, int y, int x, int c, size_t elem) {
    int sy = y + o.dy, sx = x + o.dx;
    if (sy < 0 || sy >= H || sx < 0 || sx >= W)
        return as_held(0, c, elem);
    return as_held(original(o.vflip ? H - 1 - sy : sy, o.hflip ? W - 1 - sx : sx, c), c, elem);
}

static ddp_program image_program(int64_t dtype, int rank) {
    ddp_program p = {.name = "net", .dtype = dtype, .input_rank = rank, .input_slot = -1,
                     .label_positions = 1};
    int64_t shape[] = {H, W, C};
    memcpy(p.input_shape, shape, sizeof shape);
    return p;
}

/* Values as elements of elem bytes: f32, f64, or two-byte integers standing for bf16
 * (the augmentations move elements whole, whatever they hold). */
static void store(void *row, size_t elem, int64_t i, double v) {
    if (elem == 4)
        ((float *)row)[i] = (float)v;
    else if (elem == 8)
        ((double *)row)[i] = v;
    else
        ((uint16_t *)row)[i] = (uint16_t)v;
}

static double load(const void *row, size_t elem, int64_t i) {
    return elem == 4 ? ((const float *)row)[i] : elem == 8 ? ((const double *)row)[i] : ((const uint16_t *)row)[i];
}

static bool matches(const void *row, size_t elem, int channels, Outcome o) {
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < channels; c++)
                if (load(row, elem, (y * W + x) * channels + c) != expected(o, y, x, c, elem))
                    return false;
    return true;
}

/* The outcome index (flips and move) of sample `sample` augmented by spec, or -1 when
 * the result is none of them or more than one. */
static int augmented_outcome(const ddp_dataset *spec, const ddp_program *p, size_t elem, ddp_draw_key key,
                             int64_t sample) {
    int channels = p->input_rank == 3 ? C : 1;
    double row[PER];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < channels; c++)
                store(row, elem, (y * W + x) * channels + c, as_held(original(y, x, c), c, elem));
    ddp_augment_sample(spec, p, elem, &key, sample, 1, row);
    int found = -1, count = 0;
    for (int k = 0; k < 4 * (2 * PAD + 1) * (2 * PAD + 1); k++) {
        Outcome o = {k & 1, (k >> 1) & 1, (k >> 2) % (2 * PAD + 1) - PAD, (k >> 2) / (2 * PAD + 1) - PAD};
        if (matches(row, elem, channels, o)) {
            found = k;
            count++;
        }
    }
    return count == 1 ? found : -1;
}

/* Each of `outcomes` equally likely: every count within 5 standard deviations. */
static void check_uniform(const int *counts, int outcomes, int n, const char *what) {
    double mean = (double)n / outcomes, sd = sqrt(mean * (1 - 1.0 / outcomes));
    for (int k = 0; k < outcomes; k++)
        if (fabs(counts[k] - mean) > 5 * sd) {
            fprintf(stderr, "%s: outcome %d came %d times in %d, expected about %.0f\n", what, k, counts[k], n,
                    mean);
            failures++;
        }
}

/* Outcome k's flips and move, from its index (bits 0 and 1: the flips). */
static int move_of(int k) {
    return k >> 2;
}

static void test_flip_then_crop(void) {
    ddp_augment list[] = {{.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_BOTH}, {.kind = DDP_AUGMENT_CROP, .padding = PAD}};
    ddp_dataset spec = {.name = "images", .augment = list, .naugment = 2};
    ddp_program p = image_program(DDP_F32, 3);
    enum { OUTCOMES = 4 * (2 * PAD + 1) * (2 * PAD + 1) };
    int counts[OUTCOMES] = {0}, bad = 0;
    for (int64_t s = 0; s < SAMPLES; s++) {
        int k = augmented_outcome(&spec, &p, sizeof(float), (ddp_draw_key){11, 3}, s);
        if (k < 0)
            bad++;
        else
            counts[k]++;
    }
    CHECK(bad == 0);
    check_uniform(counts, OUTCOMES, SAMPLES, "random_flip(horizontal_and_vertical), random_crop(padding = 2)");
}

/* One flip's mode: the axes it may mirror, each half the time; never the other. */
static void test_flip_modes(void) {
    static const struct {
        int64_t mode;
        bool h, v;
    } modes[] = {{DDP_FLIP_HORIZONTAL, true, false}, {DDP_FLIP_VERTICAL, false, true}};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        ddp_augment flip = {.kind = DDP_AUGMENT_FLIP, .mode = modes[m].mode};
        ddp_dataset spec = {.name = "images", .augment = &flip, .naugment = 1};
        ddp_program p = image_program(DDP_F64, 3);
        int counts[4] = {0}, bad = 0;
        for (int64_t s = 0; s < SAMPLES; s++) {
            int k = augmented_outcome(&spec, &p, sizeof(double), (ddp_draw_key){5, 0}, s);
            if (k < 0 || move_of(k) != PAD * (2 * PAD + 1) + PAD) /* no move */
                bad++;
            else
                counts[k & 3]++;
        }
        CHECK(bad == 0);
        CHECK(modes[m].h || (counts[1] == 0 && counts[3] == 0));
        CHECK(modes[m].v || (counts[2] == 0 && counts[3] == 0));
        int two[2] = {counts[0], counts[modes[m].h ? 1 : 2]};
        check_uniform(two, 2, SAMPLES, modes[m].h ? "random_flip(horizontal)" : "random_flip(vertical)");
    }
}

/* A horizontal flip of [3, w, c] images, w even and odd, c from 1 to 9 channels of 2,
 * 4 and 8 bytes (pixels of 2 to 72 bytes, each size the mirror copies whole and the
 * others): each sample left as it is or mirrored exactly, and both come about. */
static void test_mirror_pixel_sizes(void) {
    enum { ROWS = 3, MAX_W = 7, MAX_C = 9 };
    ddp_augment flip = {.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL};
    ddp_dataset spec = {.name = "images", .augment = &flip, .naugment = 1};
    static const size_t elems[] = {2, 4, 8};
    static const int64_t dtypes[] = {DDP_BF16, DDP_F32, DDP_F64};
    for (int64_t w = MAX_W - 1; w <= MAX_W; w++)
        for (int64_t c = 1; c <= MAX_C; c++)
            for (int t = 0; t < 3; t++) {
                ddp_program p = {.name = "net", .dtype = dtypes[t], .input_rank = 3, .input_slot = -1,
                                 .input_shape = {ROWS, w, c}};
                int64_t n = ROWS * w * c;
                int same = 0, mirrored = 0;
                for (int64_t s = 0; s < 64; s++) {
                    double row[ROWS * MAX_W * MAX_C];
                    for (int64_t i = 0; i < n; i++)
                        store(row, elems[t], i, (double)(i + 1));
                    ddp_augment_sample(&spec, &p, elems[t], &(ddp_draw_key){9, 1}, s, 1, row);
                    bool is_same = true, is_mirror = true;
                    for (int64_t y = 0; y < ROWS; y++)
                        for (int64_t x = 0; x < w; x++)
                            for (int64_t k = 0; k < c; k++) {
                                double v = load(row, elems[t], (y * w + x) * c + k);
                                is_same &= v == (double)((y * w + x) * c + k + 1);
                                is_mirror &= v == (double)((y * w + (w - 1 - x)) * c + k + 1);
                            }
                    same += is_same;
                    mirrored += is_mirror;
                    if (!is_same && !is_mirror)
                        fprintf(stderr, "[3, %lld, %lld] of %zu-byte elements: sample %lld neither as it was nor "
                                        "mirrored\n", (long long)w, (long long)c, elems[t], (long long)s);
                }
                CHECK(same + mirrored == 64 && same > 0 && mirrored > 0);
            }
}

/* The same flips and crop of each sample whatever a pixel's bytes: f32, f64 and bf16
 * (two-byte elements), [h, w] and [h, w, c], so pixels of 2, 4, 8 and 16 bytes. */
static void test_element_types(void) {
    ddp_augment list[] = {{.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_BOTH}, {.kind = DDP_AUGMENT_CROP, .padding = PAD}};
    ddp_dataset spec = {.name = "images", .augment = list, .naugment = 2};
    static const struct {
        int64_t dtype;
        size_t elem;
        int rank;
    } kinds[] = {{DDP_F32, 4, 3}, {DDP_F32, 4, 2}, {DDP_F64, 8, 3}, {DDP_F64, 8, 2}, {DDP_BF16, 2, 3},
                 {DDP_BF16, 2, 2}};
    int differ = 0, moved = 0, flipped = 0;
    for (int64_t s = 0; s < 500; s++) {
        ddp_draw_key key = {3, 7};
        ddp_program first = image_program(kinds[0].dtype, kinds[0].rank);
        int a = augmented_outcome(&spec, &first, kinds[0].elem, key, s);
        for (size_t k = 1; k < sizeof kinds / sizeof *kinds; k++) {
            ddp_program p = image_program(kinds[k].dtype, kinds[k].rank);
            differ += a < 0 || augmented_outcome(&spec, &p, kinds[k].elem, key, s) != a;
        }
        moved += move_of(a) != PAD * (2 * PAD + 1) + PAD;
        flipped += (a & 3) != 0;
    }
    CHECK(differ == 0);
    CHECK(moved > 400 && flipped > 300); /* 24 of 25 places move the image; 3 of 4 flip it */
}

/* A cutout of size 3: the image as it was but for the square of 3 x 3 pixels centred on
 * one of its 35 pixels (clipped at the edges), zero; each centre as likely. */
static void test_cutout(void) {
    enum { SIZE = 3 };
    ddp_augment cutout = {.kind = DDP_AUGMENT_CUTOUT, .size = SIZE};
    ddp_dataset spec = {.name = "images", .augment = &cutout, .naugment = 1};
    ddp_program p = image_program(DDP_F32, 3);
    int counts[H * W] = {0}, bad = 0;
    for (int64_t s = 0; s < SAMPLES; s++) {
        float row[PER];
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int c = 0; c < C; c++)
                    row[(y * W + x) * C + c] = (float)original(y, x, c);
        ddp_augment_sample(&spec, &p, sizeof(float), &(ddp_draw_key){4, 2}, s, 1, row);
        int found = -1, matches = 0;
        for (int centre = 0; centre < H * W; centre++) {
            int y0 = centre / W - SIZE / 2, x0 = centre % W - SIZE / 2;
            bool same = true;
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    for (int c = 0; c < C; c++) {
                        bool erased = y >= y0 && y < y0 + SIZE && x >= x0 && x < x0 + SIZE;
                        same &= row[(y * W + x) * C + c] == (erased ? 0 : (float)original(y, x, c));
                    }
            if (same) {
                found = centre;
                matches++;
            }
        }
        if (matches == 1)
            counts[found]++;
        else
            bad++;
    }
    CHECK(bad == 0);
    check_uniform(counts, H * W, SAMPLES, "random_cutout(size = 3)");
}

/* A normalised dataset pads with each channel's normalised zero, in f32, f64 and bf16
 * (the normalised values of both channels distinct in bf16 too). */
static void test_normalized_padding(void) {
    static const ddp_channel pairs[C] = {{.mean = 0.5, .std = 0.25}, {.mean = -3, .std = 7}};
    ddp_augment crop = {.kind = DDP_AUGMENT_CROP, .padding = PAD};
    ddp_dataset spec = {.name = "images", .augment = &crop, .naugment = 1, .normalize = pairs, .nnormalize = C};
    normalized = pairs;
    ddp_program f32 = image_program(DDP_F32, 3), f64 = image_program(DDP_F64, 3), bf16 = image_program(DDP_BF16, 3);
    int bad = 0, padded = 0;
    for (int64_t s = 0; s < 300; s++) {
        int a = augmented_outcome(&spec, &f32, 4, (ddp_draw_key){9, 1}, s);
        bad += a < 0 || augmented_outcome(&spec, &f64, 8, (ddp_draw_key){9, 1}, s) != a ||
               augmented_outcome(&spec, &bf16, 2, (ddp_draw_key){9, 1}, s) != a;
        padded += move_of(a) != PAD * (2 * PAD + 1) + PAD;
    }
    normalized = NULL;
    CHECK(bad == 0 && padded > 250);
}

/* ddp_color_image against torchvision's functions (tests/reference/color_jitter.py) on
 * float64 images in [0, 1], and on the same images times 255 with top 255 (a byte
 * file's scale of 1): the same values times 255. */
static void test_color_against_torchvision(void) {
    for (size_t k = 0; k < sizeof color_cases / sizeof color_cases[0]; k++) {
        const ColorCase *t = &color_cases[k];
        int n = COLOR_PIXELS * t->channels, bad = 0;
        double unit[3 * COLOR_PIXELS], bytes[3 * COLOR_PIXELS];
        memcpy(unit, t->channels == 3 ? color_rgb : color_grey, sizeof(double) * (size_t)n);
        for (int e = 0; e < n; e++)
            bytes[e] = unit[e] * 255;
        ddp_color_image(&t->color, unit, COLOR_PIXELS, t->channels, 1);
        ddp_color_image(&t->color, bytes, COLOR_PIXELS, t->channels, 255);
        for (int e = 0; e < n; e++)
            bad += fabs(unit[e] - t->expect[e]) > 1e-12 || fabs(bytes[e] / 255 - t->expect[e]) > 1e-12;
        if (bad)
            fprintf(stderr, "colour case %zu (%d changes, first %d by %g): %d values unlike torchvision's\n", k,
                    t->color.count, t->color.change[0], t->color.factor[0], bad);
        CHECK(bad == 0);
    }
}

/* random_color's draws: every order of the four changes as likely, each factor in its
 * range with the mean of a uniform draw; a change of spread 0 left out of the order
 * (the others' order then as likely either way); the same key and sample the same
 * draws, another epoch others. */
static void test_color_draws(void) {
    enum { DRAWS = 24000 };
    ddp_augment all = {.kind = DDP_AUGMENT_COLOR, .brightness = 0.4, .contrast = 1.5, .saturation = 0.2, .hue = 0.1};
    ddp_augment two = {.kind = DDP_AUGMENT_COLOR, .brightness = 0.3, .hue = 0.5};
    int orders[24] = {0}, hue_first = 0, bad = 0, same_next_epoch = 0;
    double sum[4] = {0};
    const double lo[4] = {0.6, 0, 0.8, -0.1}, hi[4] = {1.4, 2.5, 1.2, 0.1};
    for (int64_t s = 0; s < DRAWS; s++) {
        ddp_color c, again, next, pair;
        ddp_color_draw(&all, &(ddp_draw_key){3, 1}, 2, s, &c);
        ddp_color_draw(&all, &(ddp_draw_key){3, 1}, 2, s, &again);
        ddp_color_draw(&all, &(ddp_draw_key){3, 2}, 2, s, &next);
        bad += c.count != 4 || again.count != 4 || memcmp(c.change, again.change, sizeof c.change) != 0 ||
               memcmp(c.factor, again.factor, sizeof c.factor) != 0;
        same_next_epoch += memcmp(c.factor, next.factor, sizeof c.factor) == 0;
        int seen = 0, code = 0;
        for (int k = 0; k < 4 && c.count == 4; k++) {
            int change = c.change[k];
            bad += change < 0 || change > 3 || (seen & 1 << change) || !(c.factor[k] >= lo[change]) ||
                   !(c.factor[k] < hi[change]);
            seen |= 1 << change;
            sum[change] += c.factor[k];
            code = code * 4 + change;
        }
        int index = 0; /* the order's rank among the 24, by a table of the 256 codes' */
        static int rank_of[256], ranks;
        if (!rank_of[code] && ranks < 24)
            rank_of[code] = ++ranks;
        index = rank_of[code] - 1;
        if (index >= 0 && index < 24)
            orders[index]++;
        ddp_color_draw(&two, &(ddp_draw_key){3, 1}, 0, s, &pair);
        bad += pair.count != 2 || (pair.change[0] == DDP_COLOR_HUE) == (pair.change[1] == DDP_COLOR_HUE) ||
               (pair.change[0] != DDP_COLOR_HUE && pair.change[0] != DDP_COLOR_BRIGHTNESS);
        hue_first += pair.change[0] == DDP_COLOR_HUE;
    }
    CHECK(bad == 0);
    CHECK(same_next_epoch == 0);
    check_uniform(orders, 24, DRAWS, "random_color's orders");
    for (int change = 0; change < 4; change++) {
        double mean = sum[change] / DRAWS, want = (lo[change] + hi[change]) / 2;
        if (fabs(mean - want) > 0.01 * (hi[change] - lo[change]))
            fprintf(stderr, "random_color: change %d's factors average %g, not about %g\n", change, mean, want);
        CHECK(fabs(mean - want) <= 0.01 * (hi[change] - lo[change]));
    }
    CHECK(abs(hue_first - DRAWS / 2) < DRAWS / 40);
}

/* A sample changed by random_color through ddp_augment_sample: its normalisation
 * undone, the changes drawn for it made, normalised again, in f32, f64 and bf16 (to
 * their rounding), in [h, w, 3] and grey [h, w]; before it, a flip moves pixels whole,
 * so the changes see the flipped image (the contrast's mean is the same; its pixels'
 * places are not). */
static void test_color_sample(void) {
    enum { CH = 3, HW = H * W };
    static const ddp_channel pairs[CH] = {{.mean = 0.5, .std = 0.25}, {.mean = 0.4, .std = 0.2}, {.mean = 0.3, .std = 2}};
    ddp_augment list[2] = {{.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_HORIZONTAL},
                           {.kind = DDP_AUGMENT_COLOR, .brightness = 0.5, .contrast = 0.5, .saturation = 0.5,
                            .hue = 0.2}};
    const int64_t dtypes[] = {DDP_F32, DDP_F64, DDP_BF16};
    const size_t elems[] = {4, 8, 2};
    const double tolerance[] = {1e-5, 1e-12, 2e-2};
    int bad = 0, flipped = 0, changed = 0;
    for (int grey = 0; grey < 2; grey++)
        for (int t = 0; t < 3; t++)
            for (int64_t s = 0; s < 200; s++) {
                int channels = grey ? 1 : CH;
                ddp_augment color = list[1];
                if (grey)
                    color.saturation = color.hue = 0;
                ddp_augment used[2] = {list[0], color};
                ddp_dataset spec = {.name = "images", .augment = used, .naugment = 2, .normalize = pairs,
                                    .nnormalize = grey ? 1 : CH};
                ddp_program p = image_program(dtypes[t], grey ? 2 : 3);
                p.input_shape[2] = CH;
                double raw[HW * CH], row[HW * CH];
                for (int e = 0; e < HW * channels; e++) {
                    raw[e] = (double)((e * 37 + 11) % 256) / 255; /* bf16 holds these to its rounding */
                    const ddp_channel *pair = &pairs[e % channels];
                    if (elems[t] == 2)
                        ((uint16_t *)row)[e] = ddp_bf16_from_float((float)((raw[e] - pair->mean) / pair->std));
                    else
                        store(row, elems[t], e, (raw[e] - pair->mean) / pair->std);
                }
                ddp_draw_key key = {6, 0};
                ddp_augment_sample(&spec, &p, elems[t], &key, s, 1, row);
                uint32_t w[4];
                ddp_draw(key.seed, DDP_STREAM_AUGMENT + 0, (uint64_t)s, 0, 0, w);
                double want[HW * CH];
                for (int y = 0; y < H; y++) /* the flip, if drawn */
                    for (int x = 0; x < W; x++)
                        for (int c = 0; c < channels; c++)
                            want[(y * W + x) * channels + c] = raw[(y * W + ((w[0] & 1) ? W - 1 - x : x)) * channels + c];
                flipped += w[0] & 1;
                ddp_color drawn;
                ddp_color_draw(&color, &key, 1, s, &drawn);
                ddp_color_image(&drawn, want, HW, channels, 1);
                for (int e = 0; e < HW * channels; e++) {
                    const ddp_channel *pair = &pairs[e % channels];
                    double held = elems[t] == 2 ? ddp_bf16_to_float(((uint16_t *)row)[e]) : load(row, elems[t], e);
                    double got = held * pair->std + pair->mean;
                    bad += !(fabs(got - want[e]) <= tolerance[t] * (1 + fabs(want[e])));
                    changed += fabs(got - raw[e]) > 0.05;
                }
            }
    CHECK(bad == 0);
    CHECK(flipped > 400 && flipped < 800);
    CHECK(changed > 2 * 3 * 200 * HW / 2);
}

/* random_erasing's boxes on 32 x 24 images: a share of the samples as the probability
 * says; each box inside the image, of an area and shape within the ranges as the
 * rounding of its sides allows, at places covering every row and column it may start
 * at; the same draws for the same key. Through ddp_augment_sample: the box zero and
 * the rest as it was, or (value = random) the box standard normal values, in f32, f64
 * and bf16. */
static void test_erasing(void) {
    enum { EH = 32, EW = 24, DRAWS = 20000 };
    ddp_augment a = {.kind = DDP_AUGMENT_ERASING, .probability = 0.3, .scale_min = 0.02, .scale_max = 0.33,
                     .ratio_min = 0.3, .ratio_max = 3.3};
    int erased = 0, bad = 0, rows[EH] = {0}, cols[EW] = {0};
    double smallest = 1, largest = 0;
    for (int64_t s = 0; s < DRAWS; s++) {
        int64_t box[4], again[4];
        bool some = ddp_erase_box(&a, &(ddp_draw_key){2, 3}, 1, s, EH, EW, box);
        bad += some != ddp_erase_box(&a, &(ddp_draw_key){2, 3}, 1, s, EH, EW, again) ||
               (some && memcmp(box, again, sizeof box) != 0);
        if (!some)
            continue;
        erased++;
        int64_t bh = box[2] - box[0], bw = box[3] - box[1];
        bad += box[0] < 0 || box[1] < 0 || box[2] > EH || box[3] > EW || bh < 1 || bw < 1;
        double share = (double)(bh * bw) / (EH * EW), lo = (bh - 0.5) * (bw - 0.5) / (EH * EW),
               hi = (bh + 0.5) * (bw + 0.5) / (EH * EW);
        bad += !(hi >= 0.02 && lo <= 0.33) || !((bh + 0.5) / (bw - 0.5) >= 0.3) || !((bh - 0.5) / (bw + 0.5) <= 3.3);
        smallest = fmin(smallest, share), largest = fmax(largest, share);
        rows[box[0]]++, cols[box[1]]++;
    }
    CHECK(bad == 0);
    CHECK(abs(erased - DRAWS * 3 / 10) < DRAWS / 50);
    CHECK(smallest < 0.03 && largest > 0.25);
    CHECK(rows[0] > 0 && cols[0] > 0 && rows[EH - 5] > 0 && cols[EW - 5] > 0); /* small boxes reach the edges */

    /* through the samples, f32, f64 and bf16 */
    const int64_t dtypes[] = {DDP_F32, DDP_F64, DDP_BF16};
    const size_t elems[] = {4, 8, 2};
    for (int random = 0; random < 2; random++) {
        ddp_augment e = {.kind = DDP_AUGMENT_ERASING, .mode = random ? DDP_ERASE_RANDOM : DDP_ERASE_ZERO,
                         .probability = 1, .scale_min = 0.1, .scale_max = 0.3, .ratio_min = 0.5, .ratio_max = 2};
        ddp_dataset spec = {.name = "images", .augment = &e, .naugment = 1};
        int wrong = 0;
        double sum = 0, squares = 0, count = 0;
        for (int t = 0; t < 3; t++) {
            ddp_program p = image_program(dtypes[t], 3);
            for (int64_t s = 0; s < 400; s++) {
                double row[PER];
                for (int v = 0; v < PER; v++)
                    store(row, elems[t], v, 1 + v);
                ddp_augment_sample(&spec, &p, elems[t], &(ddp_draw_key){8, 0}, s, 1, row);
                int64_t box[4];
                if (!ddp_erase_box(&e, &(ddp_draw_key){8, 0}, 0, s, H, W, box))
                    continue; /* no try fitted: the sample as it was (checked below) */
                for (int y = 0; y < H; y++)
                    for (int x = 0; x < W; x++)
                        for (int c = 0; c < C; c++) {
                            int v = (y * W + x) * C + c;
                            double got = elems[t] == 2 ? ddp_bf16_to_float(((uint16_t *)row)[v]) : load(row, elems[t], v);
                            bool inside = y >= box[0] && y < box[2] && x >= box[1] && x < box[3];
                            if (!inside)
                                wrong += got != (elems[t] == 2 ? ddp_bf16_to_float((uint16_t)(1 + v)) : 1 + v);
                            else if (!random)
                                wrong += got != 0;
                            else
                                sum += got, squares += got * got, count++;
                        }
            }
        }
        CHECK(wrong == 0);
        if (random) {
            double mean = sum / count, sd = sqrt(squares / count - mean * mean);
            if (!(fabs(mean) < 0.05 && fabs(sd - 1) < 0.05))
                fprintf(stderr, "random_erasing(value = random): mean %g, sd %g over %.0f values\n", mean, sd, count);
            CHECK(count > 10000 && fabs(mean) < 0.05 && fabs(sd - 1) < 0.05);
        }
    }
}

/* random_grayscale: with its probability, every pixel its grey, as torchvision's
 * rgb_to_grayscale (held to it in color_reference.h); the other samples as they were. */
static void test_grayscale(void) {
    enum { CH = 3 };
    ddp_augment g = {.kind = DDP_AUGMENT_GRAYSCALE, .probability = 0.25};
    ddp_dataset spec = {.name = "images", .augment = &g, .naugment = 1};
    ddp_program p = image_program(DDP_F64, 3);
    p.input_shape[2] = CH;
    int grey = 0, bad = 0;
    for (int64_t s = 0; s < 4000; s++) {
        double row[H * W * CH];
        for (int v = 0; v < H * W * CH; v++)
            row[v] = (double)((v * 29 + 7) % 256) / 255;
        ddp_augment_sample(&spec, &p, sizeof(double), &(ddp_draw_key){5, 1}, s, 1, row);
        bool made_grey = row[0] == row[1] && row[1] == row[2];
        grey += made_grey;
        for (int x = 0; x < H * W; x++)
            for (int c = 0; c < CH; c++) {
                const double *was = (double[]){(double)(((3 * x) * 29 + 7) % 256) / 255,
                                               (double)(((3 * x + 1) * 29 + 7) % 256) / 255,
                                               (double)(((3 * x + 2) * 29 + 7) % 256) / 255};
                double want = made_grey ? 0.2989 * was[0] + 0.587 * was[1] + 0.114 * was[2] : was[c];
                bad += row[3 * x + c] != want;
            }
    }
    CHECK(bad == 0);
    CHECK(abs(grey - 1000) < 150);
}

/* ddp_image_op_apply against torchvision's _apply_op on uint8 tensors
 * (tests/reference/auto_augment.py): every operation at magnitudes of the table of
 * 31 bins, both signs, nearest and bilinear, RGB and grey; the magnitudes themselves
 * from ddp_image_op_magnitude, to the bit; then on images of 32 x 32 and 17 x 23, the
 * hash of each result's bytes. */
static void test_trivial_against_torchvision(void) {
    for (size_t k = 0; k < sizeof trivial_cases / sizeof trivial_cases[0]; k++) {
        const TrivialCase *t = &trivial_cases[k];
        int n = TRIVIAL_H * TRIVIAL_W * t->channels, bad = 0;
        unsigned char image[TRIVIAL_H * TRIVIAL_W * 3], scratch[TRIVIAL_H * TRIVIAL_W * 3];
        memcpy(image, t->channels == 3 ? trivial_rgb : trivial_grey, (size_t)n);
        ddp_image_op op = {t->op, t->sign * ddp_image_op_magnitude(DDP_AUGMENT_TRIVIAL, t->op, 31, t->bin, 0, 0)};
        ddp_image_op_apply(&op, t->bilinear, image, TRIVIAL_H, TRIVIAL_W, t->channels, scratch);
        for (int e = 0; e < n; e++)
            bad += image[e] != t->expect[e];
        if (bad || op.magnitude != t->magnitude)
            fprintf(stderr, "trivial case %zu (op %d, bin %d, magnitude %.9g, torchvision's %.9g%s, %d channels): "
                    "%d of %d bytes unlike torchvision's\n", k, t->op, t->bin, op.magnitude, t->magnitude,
                    t->bilinear ? ", bilinear" : "", t->channels, bad, n);
        CHECK(bad == 0 && op.magnitude == t->magnitude);
    }
    enum { MOST = 32 * 32 * 3 };
    unsigned char image[MOST], scratch[MOST];
    int differ = 0, cases = (int)(sizeof trivial_hashes / sizeof trivial_hashes[0]);
    for (int k = 0; k < cases; k++) {
        const TrivialHash *t = &trivial_hashes[k];
        int n = t->h * t->w * 3;
        for (int e = 0; e < n; e++)
            image[e] = (unsigned char)((e * 7919 + 13) % 251);
        ddp_image_op op = {t->op, t->sign * ddp_image_op_magnitude(DDP_AUGMENT_TRIVIAL, t->op, 31, t->bin, 0, 0)};
        ddp_image_op_apply(&op, t->bilinear, image, t->h, t->w, 3, scratch);
        if (ddp_fnv1a(image, (size_t)n, DDP_FNV_START) != t->hash) {
            fprintf(stderr, "trivial hash case %d (%d x %d, op %d, bin %d, sign %d%s) unlike torchvision's\n", k,
                    t->h, t->w, t->op, t->bin, t->sign, t->bilinear ? ", bilinear" : "");
            differ++;
        }
    }
    CHECK(differ == 0 && cases > 200);
}

/* ddp_image_op_magnitude against torchvision's tables of TrivialAugmentWide and
 * RandAugment (linspace's float32 to the bit, posterize's rounding, RandAugment's
 * translations by the image's sides); then RandAugment's pairs of operations in a row
 * at its default strength, 9 of 31, on the 32 x 32 pattern: torchvision's bytes. */
static void test_rand_against_torchvision(void) {
    int bad = 0, cases = (int)(sizeof magnitude_cases / sizeof magnitude_cases[0]);
    for (int k = 0; k < cases; k++) {
        const MagnitudeCase *t = &magnitude_cases[k];
        double got = ddp_image_op_magnitude(t->kind, t->op, t->bins, t->bin, t->h, t->w);
        if (got != t->magnitude) {
            fprintf(stderr, "magnitude case %d (kind %d, op %d, bin %d of %d, %d x %d): %.9g, torchvision's %.9g\n",
                    k, t->kind, t->op, t->bin, t->bins, t->h, t->w, got, t->magnitude);
            bad++;
        }
    }
    CHECK(bad == 0 && cases > 400);
    for (size_t k = 0; k < sizeof rand_pairs / sizeof rand_pairs[0]; k++) {
        const RandPair *t = &rand_pairs[k];
        unsigned char image[32 * 32 * 3], scratch[32 * 32 * 3];
        for (int e = 0; e < 32 * 32 * 3; e++)
            image[e] = (unsigned char)((e * 7919 + 13) % 251);
        int ops[2] = {t->first, t->second}, signs[2] = {t->first_sign, t->second_sign};
        for (int j = 0; j < 2; j++) {
            ddp_image_op op = {ops[j], ddp_image_op_magnitude(DDP_AUGMENT_RAND, ops[j], 31, 9, 32, 32)};
            if (ops[j] >= DDP_OP_SHEAR_X && ops[j] <= DDP_OP_SHARPNESS)
                op.magnitude *= signs[j];
            ddp_image_op_apply(&op, false, image, 32, 32, 3, scratch);
        }
        if (ddp_fnv1a(image, sizeof image, DDP_FNV_START) != t->hash)
            fprintf(stderr, "rand_augment pair %zu (ops %d then %d) unlike torchvision's\n", k, t->first, t->second);
        CHECK(ddp_fnv1a(image, sizeof image, DDP_FNV_START) == t->hash);
    }
}

/* auto_augment: its three policies step by step as torchvision's, and Invert's bytes;
 * its draws: each of a policy's 25 pairs as likely, each step applied as often as its
 * probability says, signed either way as often. */
static void test_auto_augment(void) {
    int bad = 0, steps = (int)(sizeof policy_steps / sizeof policy_steps[0]);
    for (int k = 0; k < steps; k++) {
        const PolicyStep *t = &policy_steps[k];
        ddp_auto_step got = ddp_auto_policy_step(t->policy, t->index, t->which);
        bad += got.op != t->op || got.probability != t->probability || got.bin != t->bin;
    }
    CHECK(bad == 0 && steps == 3 * DDP_AUTO_SUBPOLICIES * 2);
    unsigned char image[32 * 32 * 3], scratch[32 * 32 * 3];
    for (int e = 0; e < 32 * 32 * 3; e++)
        image[e] = (unsigned char)((e * 7919 + 13) % 251);
    ddp_image_op_apply(&(ddp_image_op){DDP_OP_INVERT, 0}, false, image, 32, 32, 3, scratch);
    CHECK(ddp_fnv1a(image, sizeof image, DDP_FNV_START) == inverted_hash);

    enum { DRAWS = 25000 };
    ddp_augment a = {.kind = DDP_AUGMENT_AUTO, .policy = DDP_POLICY_SVHN};
    int applied[DDP_OP_INVERT + 1] = {0}, negative = 0, signed_ops = 0;
    double expected[DDP_OP_INVERT + 1] = {0};
    for (int index = 0; index < DDP_AUTO_SUBPOLICIES; index++)
        for (int which = 0; which < 2; which++) {
            ddp_auto_step step = ddp_auto_policy_step(DDP_POLICY_SVHN, index, which);
            expected[step.op] += step.probability * DRAWS / DDP_AUTO_SUBPOLICIES;
        }
    for (int64_t s = 0; s < DRAWS; s++) {
        ddp_image_op ops[DDP_MOST_IMAGE_OPS];
        int count = ddp_auto_augment_draw(&a, &(ddp_draw_key){2, 0}, 1, s, 32, 32, ops);
        bad += count < 0 || count > 2;
        for (int j = 0; j < count; j++) {
            applied[ops[j].op]++;
            if (ops[j].op == DDP_OP_SHEAR_X || ops[j].op == DDP_OP_SHEAR_Y || ops[j].op == DDP_OP_ROTATE)
                signed_ops++, negative += ops[j].magnitude < 0;
        }
    }
    CHECK(bad == 0);
    for (int op = 0; op <= DDP_OP_INVERT; op++)
        if (fabs(applied[op] - expected[op]) > 5 * sqrt(expected[op] + 1)) {
            fprintf(stderr, "auto_augment(svhn): operation %d applied %d times, expected about %.0f\n", op,
                    applied[op], expected[op]);
            failures++;
        }
    CHECK(applied[DDP_OP_INVERT] > 0 && abs(2 * negative - signed_ops) < signed_ops / 10);
}

/* rand_augment's draws: `ops` operations a sample, each of the 14 as likely in every
 * place, each at the one strength (signed as often either way where it has a sign). */
static void test_rand_draws(void) {
    enum { DRAWS = 14000 };
    ddp_augment a = {.kind = DDP_AUGMENT_RAND, .ops = 3, .strength = 9, .size = 31};
    int firsts[DDP_IMAGE_OPS] = {0}, thirds[DDP_IMAGE_OPS] = {0}, bad = 0, negative = 0, signed_ops = 0;
    for (int64_t s = 0; s < DRAWS; s++) {
        ddp_image_op ops[DDP_MOST_IMAGE_OPS];
        int count = ddp_auto_augment_draw(&a, &(ddp_draw_key){7, 1}, 2, s, 32, 24, ops);
        bad += count != 3;
        for (int j = 0; j < count; j++) {
            double want = ddp_image_op_magnitude(DDP_AUGMENT_RAND, ops[j].op, 31, 9, 32, 24);
            bad += fabs(ops[j].magnitude) != want;
            if (ops[j].op >= DDP_OP_SHEAR_X && ops[j].op <= DDP_OP_SHARPNESS)
                signed_ops++, negative += ops[j].magnitude < 0;
        }
        firsts[ops[0].op]++;
        thirds[ops[2].op]++;
    }
    CHECK(bad == 0);
    check_uniform(firsts, DDP_IMAGE_OPS, DRAWS, "rand_augment's first operations");
    check_uniform(thirds, DDP_IMAGE_OPS, DRAWS, "rand_augment's third operations");
    CHECK(abs(2 * negative - signed_ops) < signed_ops / 20);
}

/* trivial_augment's draws: each of the 14 operations and of the 31 bins as likely, a
 * signed operation's sign either way as often, the magnitudes the table's; through
 * ddp_augment_sample, an RGB image of bytes scaled by 1 / 255 and normalised comes out
 * as ddp_image_op_apply makes its bytes, normalised (an identity leaves it alone). */
static void test_trivial_draws(void) {
    enum { DRAWS = 28000, BINS = 31 };
    ddp_augment a = {.kind = DDP_AUGMENT_TRIVIAL, .size = BINS};
    int ops[DDP_IMAGE_OPS] = {0}, bins[BINS] = {0}, negative = 0, signed_ops = 0, bad = 0;
    for (int64_t s = 0; s < DRAWS; s++) {
        ddp_image_op t;
        bad += ddp_auto_augment_draw(&a, &(ddp_draw_key){4, 0}, 3, s, H, W, &t) != 1;
        ops[t.op]++;
        int found = -1;
        for (int k = 0; k < BINS; k++)
            if (fabs(t.magnitude) == ddp_image_op_magnitude(DDP_AUGMENT_TRIVIAL, t.op, BINS, k, H, W))
                found = found < 0 ? k : found;
        bad += found < 0;
        if (t.op == DDP_OP_ROTATE && found >= 0) /* its magnitudes are all distinct */
            bins[found]++;
        if (t.op >= DDP_OP_SHEAR_X && t.op <= DDP_OP_SHARPNESS && t.magnitude != 0)
            signed_ops++, negative += t.magnitude < 0;
    }
    CHECK(bad == 0);
    check_uniform(ops, DDP_IMAGE_OPS, DRAWS, "trivial_augment's operations");
    check_uniform(bins, BINS, ops[DDP_OP_ROTATE], "trivial_augment's rotations");
    CHECK(abs(2 * negative - signed_ops) < signed_ops / 20);

    enum { CH = 3 };
    static const ddp_channel pairs[CH] = {{.mean = 0.5, .std = 0.25}, {.mean = 0.4, .std = 0.2}, {.mean = 0.3, .std = 2}};
    ddp_dataset spec = {.name = "images", .augment = &a, .naugment = 1, .normalize = pairs, .nnormalize = CH};
    ddp_program p = image_program(DDP_F32, 3);
    p.input_shape[2] = CH;
    int wrong = 0, changed = 0;
    for (int64_t s = 0; s < 300; s++) {
        unsigned char bytes[H * W * CH], scratch[H * W * CH];
        float row[H * W * CH];
        for (int e = 0; e < H * W * CH; e++) {
            bytes[e] = (unsigned char)((e * 53 + 19) % 256);
            row[e] = (float)(((double)(float)(bytes[e] * (1.0 / 255)) - pairs[e % CH].mean) / pairs[e % CH].std);
        }
        ddp_augment_sample(&spec, &p, sizeof(float), &(ddp_draw_key){4, 0}, s, 1, row);
        ddp_image_op t;
        ddp_auto_augment_draw(&a, &(ddp_draw_key){4, 0}, 0, s, H, W, &t);
        ddp_image_op_apply(&t, false, bytes, H, W, CH, scratch);
        for (int e = 0; e < H * W * CH; e++) {
            double want = ((double)(float)(bytes[e] * (1.0 / 255)) - pairs[e % CH].mean) / pairs[e % CH].std;
            wrong += fabs(row[e] - want) > 1e-6 * (1 + fabs(want));
            changed += bytes[e] != (unsigned char)((e * 53 + 19) % 256);
        }
    }
    CHECK(wrong == 0);
    CHECK(changed > 300 * H * W * CH / 4);
}

/* 100 synthetic images of 3 classes, cropped and flipped both ways, and the f32
 * classifier they feed. */
typedef struct Noise {
    ddp_augment list[2];
    ddp_dataset spec;
    ddp_data d;
    ddp_program p;
} Noise;

/* n opened with crops of padding `padding`; false, counted as a failure, where it cannot
 * be. n must stay where it is: its dataset points into it. */
static bool open_noise(Noise *n, int padding) {
    n->list[0] = (ddp_augment){.kind = DDP_AUGMENT_CROP, .padding = padding};
    n->list[1] = (ddp_augment){.kind = DDP_AUGMENT_FLIP, .mode = DDP_FLIP_BOTH};
    n->spec = (ddp_dataset){.name = "noise", .kind = DDP_DATA_SYNTHETIC, .scale = 1, .classes = 3, .samples = 100,
                            .augment = n->list, .naugment = 2};
    char err[512];
    if (!ddp_data_open(&n->spec, ".", &n->d, err, sizeof err)) {
        fprintf(stderr, "unexpected failure: %s\n", err);
        failures++;
        return false;
    }
    n->p = image_program(DDP_F32, 3);
    n->p.label_dtype = DDP_I32;
    n->p.output_elems = 3;
    n->p.settings.loss = DDP_LOSS_SPARSE_CATEGORICAL;
    return true;
}

/* Through batches of a synthetic dataset: a sample's row depends on its index, the
 * seed and the epoch, not on its place in the batch; no key leaves it as it is. */
static void test_batches(void) {
    static Noise n;
    if (!open_noise(&n, 1))
        return;
    static const int64_t rows_a[] = {5, 9, 2, 40}, rows_b[] = {2, 40, 9, 5};
    static float a[4 * PER], b[4 * PER], plain[4 * PER], other_epoch[4 * PER], other_seed[4 * PER];
    int32_t y[4];
    int64_t ids[4];
    ddp_data_batch(&n.d, &n.p, rows_a, 4, &(ddp_draw_key){1, 2}, a, y, ids);
    ddp_data_batch(&n.d, &n.p, rows_b, 4, &(ddp_draw_key){1, 2}, b, y, ids);
    static const int at_b[] = {3, 2, 0, 1}; /* where rows_a[i] is in rows_b */
    for (int i = 0; i < 4; i++)
        CHECK(memcmp(a + i * PER, b + at_b[i] * PER, sizeof(float) * PER) == 0);
    ddp_data_batch(&n.d, &n.p, rows_a, 4, NULL, plain, y, ids);
    ddp_data_batch(&n.d, &n.p, rows_a, 4, &(ddp_draw_key){1, 3}, other_epoch, y, ids);
    ddp_data_batch(&n.d, &n.p, rows_a, 4, &(ddp_draw_key){2, 2}, other_seed, y, ids);
    int changed = 0, epoch_differs = 0, seed_differs = 0;
    for (int i = 0; i < 4; i++) {
        float expect[PER];
        for (int e = 0; e < PER; e++)
            expect[e] = (float)ddp_synthetic_element(ddp_synthetic_seed(rows_a[i]), e);
        CHECK(memcmp(plain + i * PER, expect, sizeof expect) == 0);
        changed += memcmp(a + i * PER, expect, sizeof expect) != 0;
        epoch_differs += memcmp(a + i * PER, other_epoch + i * PER, sizeof expect) != 0;
        seed_differs += memcmp(a + i * PER, other_seed + i * PER, sizeof expect) != 0;
    }
    /* 4 samples, each left as it is with probability 1/9 * 1/4 */
    CHECK(changed >= 3 && epoch_differs >= 3 && seed_differs >= 3);
    ddp_data_free(&n.d);
}

/* A shuffled pass of 100 augmented samples in batches of 16 (the last of 4), through
 * loaders of 1, 2, 3 and 5 threads: every batch as ddp_data_batch makes it in one call. */
static void test_loader_threads(void) {
    enum { N = 100, BATCH = 16, BATCHES = (N + BATCH - 1) / BATCH };
    static Noise n;
    if (!open_noise(&n, 2))
        return;
    int64_t order[N], starts[BATCHES], sizes[BATCHES], ids[N], got_ids[N];
    ddp_epoch_order(11, 4, true, N, order);
    for (int b = 0; b < BATCHES; b++) {
        starts[b] = b * BATCH;
        sizes[b] = N - starts[b] < BATCH ? N - starts[b] : BATCH;
    }
    ddp_draw_key key = {3, 4};
    static float want[N * PER], got[N * PER];
    int32_t want_y[N], got_y[N];
    ddp_data_batch(&n.d, &n.p, order, N, &key, want, want_y, ids);
    static const int threads[] = {1, 2, 3, 5};
    for (int t = 0; t < 4; t++) {
        ddp_loader *l = ddp_loader_new(&n.d, &n.p, BATCH, threads[t]);
        CHECK(l != NULL);
        if (!l)
            continue;
        memset(got, 0, sizeof got);
        ddp_loader_begin(l, order, starts, sizes, BATCHES, &key);
        int64_t at = 0, rows;
        while ((rows = ddp_loader_next(l, got + at * PER, got_y + at, got_ids + at)) > 0)
            at += rows;
        CHECK(at == N);
        CHECK(memcmp(got, want, sizeof got) == 0);
        CHECK(memcmp(got_y, want_y, sizeof got_y) == 0 && memcmp(got_ids, order, sizeof got_ids) == 0);
        ddp_loader_free(l);
    }
    ddp_data_free(&n.d);
}

/* augment_repeats: the permutation's first samples, each three times in a row, copy c of
 * sample s the entry s + c n; a copy reads its sample and label, with draws of its own. */
static void test_repeats(void) {
    enum { N = 100, R = 3 };
    int64_t plain[N], repeated[N];
    ddp_epoch_order(11, 4, true, N, plain);
    memcpy(repeated, plain, sizeof plain);
    ddp_repeat_order(N, R, repeated);
    for (int64_t p = 0; p < N; p++)
        CHECK(ddp_entry_sample(repeated[p], N) == plain[p / R] && repeated[p] / N == p % R);
    ddp_repeat_order(N, 1, plain);
    for (int64_t p = 0; p < N; p++)
        CHECK(ddp_entry_sample(plain[p], N) == plain[p] && plain[p] < N);
    static Noise n;
    if (!open_noise(&n, 2))
        return;
    static const int64_t entries[] = {5, 105, 205, 9, 109, 209, 40, 140, 240};
    static float x[9 * PER], bare[9 * PER];
    int32_t y[9];
    int64_t ids[9];
    ddp_data_batch(&n.d, &n.p, entries, 9, &(ddp_draw_key){1, 2}, x, y, ids);
    ddp_data_batch(&n.d, &n.p, entries, 9, NULL, bare, y, ids);
    int apart = 0;
    for (int s = 0; s < 3; s++) {
        for (int c = 1; c < R; c++) {
            CHECK(memcmp(bare + (3 * s + c) * PER, bare + 3 * s * PER, sizeof(float) * PER) == 0);
            CHECK(y[3 * s + c] == y[3 * s] && ids[3 * s + c] == entries[3 * s + c]);
            apart += memcmp(x + (3 * s + c) * PER, x + 3 * s * PER, sizeof(float) * PER) != 0;
        }
    }
    CHECK(apart >= 5); /* a copy like its first with probability 1/25 * 1/4 */
    ddp_data_free(&n.d);
}

int main(void) {
    test_flip_then_crop();
    test_flip_modes();
    test_mirror_pixel_sizes();
    test_element_types();
    test_cutout();
    test_normalized_padding();
    test_color_against_torchvision();
    test_color_draws();
    test_color_sample();
    test_erasing();
    test_grayscale();
    test_trivial_against_torchvision();
    test_trivial_draws();
    test_rand_against_torchvision();
    test_rand_draws();
    test_auto_augment();
    test_batches();
    test_loader_threads();
    test_repeats();
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("augment: all checks passed\n");
    return 0;
}
