/* conv_cpu.c: the CPU's library convolution, the one the CPU runs by default (ddp_path's
 * library path): the three modes of ddp_device_conv as OpenBLAS products, a tile of
 * rows at a time.
 *
 * The generated path writes a whole column matrix (im2col) to memory and multiplies it
 * after: tens of megabytes written and read back for each convolution of a batch. Here
 * each thread fills the columns of a tile of rows into its own scratch (about 512 KB,
 * which stays in the cache; more where 256 rows are wider) and multiplies them at once:
 *   forward          y   = columns(x) . w^T, a tile of y's rows at a time;
 *   backward data    the columns' gradient dy_tile . w, added into dx where the forward
 *                    read each tap, an image at a time (one thread writes an image);
 *   backward filter  dw = sum over tiles of dy_tile^T . columns(x)_tile, the tiles in
 *                    order, dw cut into blocks of outputs and columns among threads;
 *                    where dw has few blocks, the tiles too are cut into groups, each
 *                    summing its own copy of dw, the copies then added in order.
 * A 1x1 convolution with stride 1 and no padding reads its image (or dy) in place.
 *
 * A narrow convolution (f32, a filter of at most NARROW_WIDTH columns: a network's first
 * layer, of one or three channels) gains nothing from the products, whose sums of 25
 * or 27 terms cost less than packing their factors, and its columns repeat each pixel
 * R x S times. Where the CPU has AVX2 and FMA, the forward and the filter's gradient
 * read an image padded once instead (conv_narrow below), 32 outputs of two pixels, or
 * of two columns, at a time in registers.
 *
 * Each element of the result is summed in an order set by the shapes alone: tiles and
 * blocks have sizes that follow from the convolution, never from the threads, so that
 * any number of threads gives the same bits (OpenBLAS's sums of an element depend on
 * where its block starts). */
#include <cblas.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "runtime.h"

/* A tile's columns fill about TILE_BYTES, at least MIN_TILE_ROWS rows: each product
 * packs the filters anew, which a tile of fewer rows would not pay back. A 1x1
 * convolution read in place takes tiles of MAX_TILE_ROWS. Products smaller than
 * MIN_PARALLEL_MACS run on one thread. The backward filter's blocks are BLOCK outputs
 * by BLOCK columns of dw; with fewer than FILTER_PIECES blocks, groups of tiles make up
 * the rest, as many as have at least a tile each and copies of dw within
 * GROUP_COPIES_BYTES. */
enum { TILE_BYTES = 512 << 10, MIN_TILE_ROWS = 256, MAX_TILE_ROWS = 1024, MIN_PARALLEL_MACS = 1 << 18,
       BLOCK = 128, FILTER_PIECES = 32, GROUP_COPIES_BYTES = 8 << 20, NARROW_WIDTH = 160, LANES = 32 };

/* Where a column matrix's entries come from: row g is the output pixel (n, py, px),
 * column (r, s, ch) reads x at y = py * stride0 - pad0 + r * dilation0 (x likewise),
 * channel ch, or zero outside the image. */
typedef struct Window {
    const char *src;             /* N x src_h x src_w x channels */
    int64_t src_h, src_w, channels;
    int64_t out_h, out_w;
    int64_t taps_h, taps_w;
    int64_t mul[2], off[2], dil[2];
} Window;

typedef struct Conv {
    const ddp_device_conv *c;
    Window win;
    size_t es;                   /* bytes of an element */
    int64_t rows, width;         /* of the column matrix */
    int64_t tile;                /* rows a tile */
    bool direct;                 /* the columns are the source itself (1x1, stride 1, no padding) */
    const char *filters;         /* w: [outputs][width] (KRSC) */
    const char *grad;            /* dy */
    char *out;                   /* the written tensor */
    int64_t outputs;             /* y's channels (k); a 1x1 backward data: x's (c) */
    int64_t blocks_wide;         /* backward filter: dw's blocks along a row */
    int64_t groups;              /* backward filter: groups of tiles, each its own dw */
    char *copies;                /* dw of groups 1.. (group 0's is the output), dw apart */
    char *scratch;               /* a tile for each part, slot bytes apart */
    size_t slot;
    int parts;
    bool narrow;                 /* conv_narrow's way, below */
    int64_t pad_h, pad_w;        /* narrow: the padded image's size */
    float *lanes;                /* narrow: w as [chunk][width][LANES], zeros past the last output */
    int64_t *offsets;            /* narrow: where column j reads, from its pixel's first tap */
} Conv;

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

static int64_t max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

static void product(const Conv *v, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                    const void *b, int64_t ldb, double beta, void *out, int64_t ldc) {
    enum CBLAS_TRANSPOSE at = ta ? CblasTrans : CblasNoTrans, bt = tb ? CblasTrans : CblasNoTrans;
    if (v->c->f64)
        cblas_dgemm(CblasRowMajor, at, bt, (blasint)m, (blasint)n, (blasint)k, 1.0, a, (blasint)lda, b,
                    (blasint)ldb, beta, out, (blasint)ldc);
    else
        cblas_sgemm(CblasRowMajor, at, bt, (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)lda, b,
                    (blasint)ldb, (float)beta, out, (blasint)ldc);
}

/* memcpy and memset of a run of elements: a call for long runs, inline for the few
 * elements a tap row of a thin image has (a call each would cost more than the copy). */
static void copy_run(char *restrict out, const char *restrict in, size_t bytes) {
    if (bytes > 64) {
        memcpy(out, in, bytes);
        return;
    }
    for (; bytes >= 16; bytes -= 16, out += 16, in += 16)
        memcpy(out, in, 16);
    for (; bytes >= 4; bytes -= 4, out += 4, in += 4)
        memcpy(out, in, 4);
}

static void zero_run(char *out, size_t bytes) {
    static const char zeros[64];
    if (bytes > 64)
        memset(out, 0, bytes);
    else
        copy_run(out, zeros, bytes);
}

/* The source coordinate a tap reads along one axis, or -1 for a zero. */
static int64_t source_at(const Window *w, int axis, int64_t at, int64_t tap, int64_t size) {
    int64_t num = at * w->mul[axis] - w->off[axis] + tap * w->dil[axis];
    return num >= 0 && num < size ? num : -1;
}

/* Columns [a, b) of one tap row r's block (taps_w x channels wide) of row (n, py, px),
 * written to out: the source where it has the pixel, zeros elsewhere. */
static void fill_tap_row(const Window *w, size_t es, const char *image, int64_t y, int64_t px, int64_t a,
                         int64_t b, char *out) {
    int64_t ch = w->channels;
    if (y < 0) {
        zero_run(out, (size_t)(b - a) * es);
        return;
    }
    const char *line = image + (size_t)(y * w->src_w * ch) * es;
    if (w->dil[1] == 1 && ch == 1) { /* one channel: element by element */
        int64_t x0 = px * w->mul[1] - w->off[1];
        for (int64_t s = a; s < b; s++, out += es) {
            bool inside = x0 + s >= 0 && x0 + s < w->src_w;
            if (es == 4)
                *(float *)out = inside ? ((const float *)line)[x0 + s] : 0;
            else
                *(double *)out = inside ? ((const double *)line)[x0 + s] : 0;
        }
        return;
    }
    if (w->dil[1] == 1) { /* the taps along x are neighbours in the source */
        int64_t x0 = px * w->mul[1] - w->off[1];
        int64_t lo = max64(a, max64(0, -x0) * ch), hi = min64(b, min64(w->taps_w, w->src_w - x0) * ch);
        if (hi <= lo) {
            zero_run(out, (size_t)(b - a) * es);
            return;
        }
        zero_run(out, (size_t)(lo - a) * es);
        copy_run(out + (size_t)(lo - a) * es, line + (size_t)(x0 * ch + lo) * es, (size_t)(hi - lo) * es);
        zero_run(out + (size_t)(hi - a) * es, (size_t)(b - hi) * es);
        return;
    }
    for (int64_t j = a; j < b;) { /* tap by tap */
        int64_t s = j / ch, first = j - s * ch, run = min64(ch - first, b - j);
        int64_t x = source_at(w, 1, px, s, w->src_w);
        if (x < 0)
            zero_run(out, (size_t)run * es);
        else
            copy_run(out, line + (size_t)(x * ch + first) * es, (size_t)run * es);
        out += (size_t)run * es;
        j += run;
    }
}

/* A row of the column matrix: its pixel (n, py, px). */
typedef struct Pixel {
    int64_t n, py, px;
} Pixel;

static Pixel pixel_of(const Window *w, int64_t g) {
    return (Pixel){g / (w->out_w * w->out_h), g / w->out_w % w->out_h, g % w->out_w};
}

static void next_pixel(const Window *w, Pixel *at) {
    if (++at->px < w->out_w)
        return;
    at->px = 0;
    if (++at->py < w->out_h)
        return;
    at->py = 0;
    at->n++;
}

/* Columns [j0, j1) of the row of pixel `at` into out. */
static void fill_row(const Window *w, size_t es, Pixel at, int64_t j0, int64_t j1, char *out) {
    int64_t block = w->taps_w * w->channels;
    const char *image = w->src + (size_t)(at.n * w->src_h * w->src_w * w->channels) * es;
    for (int64_t r = j0 / block; r < w->taps_h && r * block < j1; r++) {
        int64_t a = max64(j0, r * block), b = min64(j1, (r + 1) * block);
        fill_tap_row(w, es, image, source_at(w, 0, at.py, r, w->src_h), at.px, a - r * block, b - r * block, out);
        out += (size_t)(b - a) * es;
    }
}

/* Rows [g0, g0 + count) and columns [j0, j1) of the column matrix: a pointer to them and
 * their row stride, in the source itself when direct, else filled into the part's slot. */
static const char *columns(const Conv *v, int part, int64_t g0, int64_t count, int64_t j0, int64_t j1,
                           int64_t *ld) {
    if (v->direct) {
        *ld = v->width;
        return v->win.src + (size_t)(g0 * v->width + j0) * v->es;
    }
    char *slot = v->scratch + (size_t)part * v->slot;
    Pixel at = pixel_of(&v->win, g0);
    for (int64_t i = 0; i < count; i++, next_pixel(&v->win, &at))
        fill_row(&v->win, v->es, at, j0, j1, slot + (size_t)(i * (j1 - j0)) * v->es);
    *ld = j1 - j0;
    return slot;
}

/* The columns' gradient of output pixel (p, q), cols (R x S x C), added into its
 * image dx where the forward read each tap. */
static void add_columns(const Conv *v, int64_t p, int64_t q, const char *cols, char *dx) {
    const ddp_device_conv *c = v->c;
    for (int64_t r = 0; r < c->r; r++) {
        int64_t y = source_at(&v->win, 0, p, r, c->h);
        for (int64_t s = 0; y >= 0 && s < c->s; s++) {
            int64_t x = source_at(&v->win, 1, q, s, c->w);
            if (x < 0)
                continue;
            size_t from = (size_t)((r * c->s + s) * c->c), to = (size_t)((y * c->w + x) * c->c);
            for (int64_t ch = 0; ch < c->c; ch++)
                if (v->es == 8)
                    ((double *)dx)[to + ch] += ((const double *)cols)[from + ch];
                else
                    ((float *)dx)[to + ch] += ((const float *)cols)[from + ch];
        }
    }
}

/* The forward's parts: each its share of the tiles, y_tile = columns . w^T. A 1x1
 * backward data is the same product of dy in place and w untransposed (dx = dy . w). */
static void forward_part(void *ctx, int64_t first, int64_t last) {
    const Conv *v = ctx;
    bool by_output = v->c->mode == DDP_CONV_FORWARD; /* w as [outputs][width] */
    int64_t tiles = (v->rows + v->tile - 1) / v->tile;
    for (int64_t part = first; part < last; part++)
        for (int64_t t = tiles * part / v->parts; t < tiles * (part + 1) / v->parts; t++) {
            int64_t g0 = t * v->tile, count = min64(v->tile, v->rows - g0), ld;
            const char *a = columns(v, (int)part, g0, count, 0, v->width, &ld);
            product(v, false, by_output, count, v->outputs, v->width, a, ld, v->filters,
                    by_output ? v->width : v->outputs, v->c->beta, v->out + (size_t)(g0 * v->outputs) * v->es,
                    v->outputs);
        }
}

static int64_t tiles_of(const Conv *v) {
    return (v->rows + v->tile - 1) / v->tile;
}

/* Worth the threads: smaller products run on one. */
static bool worth_threads(const Conv *v) {
    return v->rows * v->width * v->outputs >= MIN_PARALLEL_MACS;
}

/* The backward filter's parts: each its share of the pieces, a piece one block of dw
 * summed over one group's tiles of rows in order, into the group's own dw. */
static void filter_part(void *ctx, int64_t first, int64_t last) {
    const Conv *v = ctx;
    int64_t tiles = tiles_of(v), pieces = v->groups * v->blocks_wide * ((v->outputs + BLOCK - 1) / BLOCK);
    for (int64_t part = first; part < last; part++)
        for (int64_t piece = pieces * part / v->parts; piece < pieces * (part + 1) / v->parts; piece++) {
            int64_t block = piece / v->groups, group = piece % v->groups;
            int64_t o0 = block / v->blocks_wide * BLOCK, o1 = min64(v->outputs, o0 + BLOCK);
            int64_t j0 = block % v->blocks_wide * BLOCK, j1 = min64(v->width, j0 + BLOCK);
            int64_t t0 = tiles * group / v->groups, t1 = tiles * (group + 1) / v->groups;
            char *dw = group ? v->copies + (size_t)((group - 1) * v->outputs * v->width) * v->es : v->out;
            for (int64_t t = t0; t < t1; t++) {
                int64_t g0 = t * v->tile, count = min64(v->tile, v->rows - g0), ld;
                const char *b = columns(v, (int)part, g0, count, j0, j1, &ld);
                double beta = t > t0 ? 1.0 : group ? 0.0 : v->c->beta;
                product(v, true, false, o1 - o0, j1 - j0, count, v->grad + (size_t)(g0 * v->outputs + o0) * v->es,
                        v->outputs, b, ld, beta, dw + (size_t)(o0 * v->width + j0) * v->es, v->width);
            }
        }
}

/* The groups' copies of dw added into the output, each element in the groups' order. */
static void add_copies(void *ctx, int64_t first, int64_t last) {
    const Conv *v = ctx;
    int64_t elems = v->outputs * v->width;
    for (int64_t group = 1; group < v->groups; group++) {
        const char *copy = v->copies + (size_t)((group - 1) * elems) * v->es;
        for (int64_t e = first; e < last; e++)
            if (v->es == 8)
                ((double *)v->out)[e] += ((const double *)copy)[e];
            else
                ((float *)v->out)[e] += ((const float *)copy)[e];
    }
}

/* The backward data's parts: each its share of the images. The columns' gradient of a
 * tile of dy's rows (dy_tile . w) is added into dx where the forward read each tap, in
 * the order of rows and taps. The tiles are the same for any split, so a tile that
 * straddles two parts' images is multiplied by both, each adding its own rows. */
static void data_part(void *ctx, int64_t first, int64_t last) {
    const Conv *v = ctx;
    const ddp_device_conv *c = v->c;
    int64_t per_image = (int64_t)c->oh * c->ow, image = (int64_t)c->h * c->w * c->c;
    for (int64_t part = first; part < last; part++) {
        int64_t n0 = c->n * part / v->parts, n1 = c->n * (part + 1) / v->parts;
        char *slot = v->scratch + (size_t)part * v->slot;
        if (n0 == n1)
            continue;
        if (c->beta == 0)
            memset(v->out + (size_t)(n0 * image) * v->es, 0, (size_t)((n1 - n0) * image) * v->es);
        int64_t g_first = n0 * per_image, g_last = n1 * per_image;
        for (int64_t g0 = g_first / v->tile * v->tile; g0 < g_last; g0 += v->tile) {
            int64_t count = min64(v->tile, v->rows - g0);
            product(v, false, false, count, v->width, c->k, v->grad + (size_t)(g0 * c->k) * v->es, c->k, v->filters,
                    v->width, 0, slot, v->width);
            for (int64_t g = max64(g0, g_first); g < min64(g0 + count, g_last); g++) {
                int64_t n = g / per_image, at = g % per_image;
                add_columns(v, at / c->ow, at % c->ow, slot + (size_t)((g - g0) * v->width) * v->es,
                            v->out + (size_t)(n * image) * v->es);
            }
        }
    }
}

/* conv_narrow: the padded image of each image in turn, in the part's slot, then for each
 * output (or column) of the filters the sum over its R x S x C taps (or the image's
 * pixels), in order, by FMA in f32. */

static bool in_place(const ddp_device_conv *c) {
    return c->r == 1 && c->s == 1 && c->stride[0] == 1 && c->stride[1] == 1 && !c->pad_before[0] &&
           !c->pad_before[1] && !c->pad_after[0] && !c->pad_after[1];
}

bool ddp_conv_narrow(const ddp_device_conv *c, bool wide) {
    return wide && !c->f64 && !in_place(c) && c->mode != DDP_CONV_BACKWARD_DATA && c->k % 8 == 0 &&
           (int64_t)c->r * c->s * c->c <= NARROW_WIDTH;
}

/* Image n of x, padded: pixel (y, x) of the result is the source's (y - pad_before[0],
 * x - pad_before[1]), zero outside it, pad_h x pad_w pixels, as many as the taps reach. */
static void pad_image(const Conv *v, int64_t n, float *out) {
    const ddp_device_conv *c = v->c;
    int64_t ch = c->c, row = v->pad_w * ch;
    int64_t lo = min64(v->pad_w, c->pad_before[1]), hi = min64(v->pad_w, c->pad_before[1] + c->w);
    const float *image = (const float *)v->win.src + n * c->h * c->w * ch;
    for (int64_t y = 0; y < v->pad_h; y++, out += row) {
        int64_t from = y - c->pad_before[0];
        if (from < 0 || from >= c->h) {
            memset(out, 0, (size_t)row * sizeof *out);
            continue;
        }
        memset(out, 0, (size_t)(lo * ch) * sizeof *out);
        memcpy(out + lo * ch, image + from * c->w * ch, (size_t)((hi - lo) * ch) * sizeof *out);
        memset(out + hi * ch, 0, (size_t)((v->pad_w - hi) * ch) * sizeof *out);
    }
}

/* The padded image's first element output pixel (py, px) reads. */
static int64_t pixel_base(const Conv *v, int64_t py, int64_t px) {
    const ddp_device_conv *c = v->c;
    return (py * c->stride[0] * v->pad_w + px * c->stride[1]) * c->c;
}

/* The kernels below take `vecs`, a chunk's vectors of 8 outputs (1 to 4), as a
 * constant: inlined for each count, the accumulators it leaves unused vanish. */
#define NARROW_KERNEL static inline __attribute__((always_inline, target("avx2,fma")))

/* Two rows of sums, 8 x vecs lanes each (at most LANES), in registers once inlined. */
typedef struct Sums {
    __m256 a[4], b[4];
} Sums;

NARROW_KERNEL Sums zero_sums(void) {
    __m256 z = _mm256_setzero_ps();
    return (Sums){{z, z, z, z}, {z, z, z, z}};
}

/* a += x0 f and b += x1 f, f the first vecs vectors at from. */
NARROW_KERNEL void fma_rows(Sums *s, int vecs, const float *from, __m256 x0, __m256 x1) {
    for (int i = 0; i < 4; i++)
        if (i < vecs) {
            __m256 f = _mm256_loadu_ps(from + 8 * i);
            s->a[i] = _mm256_fmadd_ps(x0, f, s->a[i]), s->b[i] = _mm256_fmadd_ps(x1, f, s->b[i]);
        }
}

/* Row a of s stored at out0 and row b at out1 (where not NULL), each added to what is
 * there when `add`. */
NARROW_KERNEL void store_rows(const Sums *s, int vecs, float *out0, float *out1, bool add) {
    for (int i = 0; i < vecs; i++) {
        __m256 a = s->a[i], b = s->b[i];
        if (add)
            a = _mm256_add_ps(_mm256_loadu_ps(out0 + 8 * i), a);
        _mm256_storeu_ps(out0 + 8 * i, a);
        if (!out1)
            continue;
        if (add)
            b = _mm256_add_ps(_mm256_loadu_ps(out1 + 8 * i), b);
        _mm256_storeu_ps(out1 + 8 * i, b);
    }
}

/* Outputs [chunk * LANES, + 8 x vecs) of pixels p0 and p1 (p1 == p0 for a last odd
 * pixel), out0 and out1 (NULL then), each the sum over the columns in order, plus
 * beta x the old. */
NARROW_KERNEL void narrow_pixels(const Conv *v, int vecs, const float *lanes, const float *p0, const float *p1,
                                 float *out0, float *out1, bool beta) {
    Sums s = zero_sums();
    for (int64_t j = 0; j < v->width; j++, lanes += LANES)
        fma_rows(&s, vecs, lanes, _mm256_broadcast_ss(p0 + v->offsets[j]), _mm256_broadcast_ss(p1 + v->offsets[j]));
    store_rows(&s, vecs, out0, out1, beta);
}

/* Columns j0 and j1 (j1 == j0 for a last odd column) of the filters' gradient, outputs
 * [chunk * LANES, + 8 x vecs), summed over the image's pixels in order and added into
 * rows j0 and j1 of dwt ([width][outputs]). */
NARROW_KERNEL void narrow_columns(const Conv *v, int vecs, const float *padded, const float *dy, int64_t j0,
                                  int64_t j1, float *dwt) {
    const ddp_device_conv *c = v->c;
    Sums s = zero_sums();
    const float *t0 = padded + v->offsets[j0], *t1 = padded + v->offsets[j1];
    for (int64_t py = 0; py < c->oh; py++)
        for (int64_t px = 0; px < c->ow; px++, dy += c->k) {
            int64_t at = pixel_base(v, py, px);
            fma_rows(&s, vecs, dy, _mm256_broadcast_ss(t0 + at), _mm256_broadcast_ss(t1 + at));
        }
    store_rows(&s, vecs, dwt + j0 * c->k, j1 != j0 ? dwt + j1 * c->k : NULL, true);
}

/* The chunk of outputs starting at o0: how many vectors of 8 it has. */
static int chunk_vecs(const Conv *v, int64_t o0) {
    return (int)(min64(LANES, v->outputs - o0) / 8);
}

/* kernel(v, vecs, ...) with vecs a constant, so that each count has its own inlined copy. */
#define WITH_VECS(vecs, kernel, ...)                \
    switch (vecs) {                                 \
    case 4: kernel(v, 4, __VA_ARGS__); break;       \
    case 3: kernel(v, 3, __VA_ARGS__); break;       \
    case 2: kernel(v, 2, __VA_ARGS__); break;       \
    default: kernel(v, 1, __VA_ARGS__); break;      \
    }

__attribute__((target("avx2,fma"))) static void narrow_forward_image(const Conv *v, const float *padded,
                                                                     float *y) {
    const ddp_device_conv *c = v->c;
    int64_t next = c->stride[1] * c->c;
    for (int64_t py = 0; py < c->oh; py++)
        for (int64_t px = 0; px < c->ow; px += 2) {
            const float *p0 = padded + pixel_base(v, py, px);
            bool two = px + 1 < c->ow;
            float *out0 = y + (py * c->ow + px) * c->k, *out1 = two ? out0 + c->k : NULL;
            for (int64_t o0 = 0; o0 < c->k; o0 += LANES) {
                const float *lanes = v->lanes + o0 * v->width;
                const float *p1 = two ? p0 + next : p0;
                float *o1 = out1 ? out1 + o0 : NULL;
                WITH_VECS(chunk_vecs(v, o0), narrow_pixels, lanes, p0, p1, out0 + o0, o1, c->beta != 0);
            }
        }
}

__attribute__((target("avx2,fma"))) static void narrow_filter_image(const Conv *v, const float *padded,
                                                                    const float *dy, float *dwt) {
    for (int64_t o0 = 0; o0 < v->outputs; o0 += LANES)
        for (int64_t j = 0; j < v->width; j += 2) {
            int64_t j1 = min64(j + 1, v->width - 1);
            WITH_VECS(chunk_vecs(v, o0), narrow_columns, padded, dy + o0, j, j1, dwt + o0);
        }
}

/* The forward's parts: each its share of the images. */
static void narrow_forward_part(void *ctx, int64_t first, int64_t last) {
    const Conv *v = ctx;
    const ddp_device_conv *c = v->c;
    for (int64_t part = first; part < last; part++) {
        float *padded = (float *)(v->scratch + (size_t)part * v->slot);
        for (int64_t n = c->n * part / v->parts; n < c->n * (part + 1) / v->parts; n++) {
            pad_image(v, n, padded);
            narrow_forward_image(v, padded, (float *)v->out + n * c->oh * c->ow * c->k);
        }
    }
}

/* The backward filter's parts: each its share of the groups, a group's images summed in
 * order into its own dwt, then written as the group's dw (group 0's onto beta x the
 * output), for add_copies to sum in order. */
static void narrow_filter_part(void *ctx, int64_t first, int64_t last) {
    const Conv *v = ctx;
    const ddp_device_conv *c = v->c;
    int64_t image = c->oh * c->ow * c->k, elems = v->outputs * v->width;
    for (int64_t part = first; part < last; part++) {
        float *padded = (float *)(v->scratch + (size_t)part * v->slot), *dwt = padded + v->pad_h * v->pad_w * c->c;
        for (int64_t group = v->groups * part / v->parts; group < v->groups * (part + 1) / v->parts; group++) {
            memset(dwt, 0, (size_t)elems * sizeof *dwt);
            for (int64_t n = c->n * group / v->groups; n < c->n * (group + 1) / v->groups; n++) {
                pad_image(v, n, padded);
                narrow_filter_image(v, padded, (const float *)v->grad + n * image, dwt);
            }
            float *dw = (float *)(group ? v->copies + (size_t)((group - 1) * elems) * v->es : v->out);
            bool add = !group && c->beta != 0;
            for (int64_t o = 0; o < v->outputs; o++)
                for (int64_t j = 0; j < v->width; j++)
                    dw[o * v->width + j] = (add ? dw[o * v->width + j] : 0) + dwt[j * v->outputs + o];
        }
    }
}

/* The forward's filters as lanes of chunks, and each column's offset: (r, s, channel)
 * reads (r x dilation0, s x dilation1) pixels on from the output pixel's first tap. */
static void narrow_tables(Conv *v) {
    const ddp_device_conv *c = v->c;
    const float *w = (const float *)v->filters;
    for (int64_t o0 = 0; c->mode == DDP_CONV_FORWARD && o0 < v->outputs; o0 += LANES)
        for (int64_t j = 0; j < v->width; j++)
            for (int64_t l = 0; l < LANES; l++)
                v->lanes[o0 * v->width + j * LANES + l] = o0 + l < v->outputs ? w[(o0 + l) * v->width + j] : 0;
    for (int64_t j = 0; j < v->width; j++) {
        int64_t r = j / (c->s * c->c), s = j / c->c % c->s, ch = j % c->c;
        v->offsets[j] = (r * c->dilation[0] * v->pad_w + s * c->dilation[1]) * c->c + ch;
    }
}

static bool reserve(ddp_conv_scratch *s, size_t bytes) {
    if (s->bytes >= bytes)
        return true;
    free(s->base);
    s->bytes = 0;
    if (posix_memalign(&s->base, 64, bytes) != 0) {
        s->base = NULL;
        return false;
    }
    s->bytes = bytes;
    return true;
}

static size_t round_up(size_t bytes) {
    return (bytes + 63) / 64 * 64;
}

static int64_t tile_rows(int64_t width, size_t es) {
    return min64(MAX_TILE_ROWS, max64(MIN_TILE_ROWS, TILE_BYTES / (width * (int64_t)es)));
}

/* The mode's products: the column matrix, its tiles, the part's function, and how many
 * pieces there are to share among the threads. */
/* The narrow way's parts: images for the forward, groups of images for the filters'
 * gradient (as many as the shapes give, whatever the threads). */
static ddp_range_fn plan_narrow(Conv *v, const ddp_device_conv *c, char *filters, char *y, int64_t *pieces) {
    v->pad_h = (c->oh - 1) * c->stride[0] + (c->r - 1) * c->dilation[0] + 1;
    v->pad_w = (c->ow - 1) * c->stride[1] + (c->s - 1) * c->dilation[1] + 1;
    if (c->mode == DDP_CONV_FORWARD) {
        v->out = y;
        *pieces = c->n;
        return narrow_forward_part;
    }
    v->grad = y, v->out = filters;
    int64_t fit = 1 + GROUP_COPIES_BYTES / (v->outputs * v->width * (int64_t)v->es);
    v->groups = worth_threads(v) ? max64(1, min64(min64(FILTER_PIECES, c->n), fit)) : 1;
    *pieces = v->groups;
    return narrow_filter_part;
}

static ddp_range_fn plan(Conv *v, const ddp_device_conv *c, char *x, char *filters, char *y, int64_t *pieces,
                         bool wide) {
    v->direct = in_place(c);
    v->win = (Window){x, c->h, c->w, c->c, c->oh, c->ow, c->r, c->s, {c->stride[0], c->stride[1]},
                      {c->pad_before[0], c->pad_before[1]}, {c->dilation[0], c->dilation[1]}};
    v->rows = (int64_t)c->n * c->oh * c->ow, v->width = (int64_t)c->r * c->s * c->c;
    v->outputs = c->k;
    v->tile = v->direct ? MAX_TILE_ROWS : tile_rows(v->width, v->es);
    v->filters = filters;
    if ((v->narrow = ddp_conv_narrow(c, wide)))
        return plan_narrow(v, c, filters, y, pieces);
    switch (c->mode) {
    case DDP_CONV_FORWARD:
        v->out = y;
        *pieces = (v->rows + v->tile - 1) / v->tile;
        return forward_part;
    case DDP_CONV_BACKWARD_FILTER: {
        v->grad = y, v->out = filters;
        v->blocks_wide = (v->width + BLOCK - 1) / BLOCK;
        v->tile = v->direct ? MAX_TILE_ROWS : tile_rows(min64(BLOCK, v->width), v->es);
        int64_t blocks = v->blocks_wide * ((v->outputs + BLOCK - 1) / BLOCK);
        int64_t fit = 1 + GROUP_COPIES_BYTES / (v->outputs * v->width * (int64_t)v->es);
        v->groups = worth_threads(v) ? max64(1, min64(min64((FILTER_PIECES + blocks - 1) / blocks, tiles_of(v)), fit))
                                     : 1;
        *pieces = blocks * v->groups;
        return filter_part;
    }
    }
    if (v->direct) { /* dx = dy . w, dy read in place */
        v->win.src = y, v->win.channels = c->k;
        v->width = c->k, v->outputs = c->c, v->out = x;
        *pieces = (v->rows + v->tile - 1) / v->tile;
        return forward_part;
    }
    v->grad = y, v->out = x;
    *pieces = c->n;
    return data_part;
}

bool ddp_conv_cpu(ddp_pool *pool, ddp_conv_scratch *scratch, const ddp_device_conv *c, void *x, void *filters,
                  void *y, bool wide) {
    Conv v = {.c = c, .es = c->f64 ? 8 : 4};
    int64_t pieces;
    ddp_range_fn run = plan(&v, c, x, filters, y, &pieces, wide);
    if (c->n == 0) { /* an empty batch: the filters' gradient is zero, the rest empty */
        if (c->mode == DDP_CONV_BACKWARD_FILTER && c->beta == 0)
            memset(filters, 0, (size_t)(v.width * v.outputs) * v.es);
        return true;
    }
    v.parts = worth_threads(&v) ? (int)min64(ddp_pool_threads(pool), pieces) : 1;
    int64_t slot_width = c->mode == DDP_CONV_BACKWARD_FILTER ? min64(BLOCK, v.width) : v.width;
    v.slot = v.direct ? 0 : round_up((size_t)(min64(v.tile, v.rows) * slot_width) * v.es);
    size_t copies = v.groups > 1 ? round_up((size_t)((v.groups - 1) * v.outputs * v.width) * v.es) : 0;
    size_t lanes = 0, offsets = 0;
    if (v.narrow) { /* a padded image a part (and a dwt), the filters' lanes and offsets for all */
        bool forward = c->mode == DDP_CONV_FORWARD;
        v.slot = round_up((size_t)(v.pad_h * v.pad_w * c->c + (forward ? 0 : v.width * v.outputs)) * sizeof(float));
        lanes = forward ? round_up((size_t)((v.outputs + LANES - 1) / LANES * LANES * v.width) * sizeof(float)) : 0;
        offsets = round_up((size_t)v.width * sizeof(int64_t));
    }
    if (!reserve(scratch, copies + lanes + offsets + v.slot * (size_t)v.parts))
        return false;
    v.copies = v.scratch = scratch->base; /* NULL where no scratch is needed: no offset added then */
    if (copies)
        v.scratch += copies;
    if (v.narrow) {
        v.lanes = (float *)v.scratch, v.offsets = (int64_t *)(v.scratch + lanes);
        v.scratch += lanes + offsets;
        narrow_tables(&v);
    }
    ddp_pool_for(pool, run, &v, 0, v.parts, 2);
    if (v.groups > 1)
        ddp_pool_for(pool, add_copies, &v, 0, v.outputs * v.width, 1 << 14);
    return true;
}

void ddp_conv_scratch_free(ddp_conv_scratch *s) {
    free(s->base);
    *s = (ddp_conv_scratch){0};
}
