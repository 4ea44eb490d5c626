/* resample.h: antialiased bilinear resizing of a window of an image, in two passes
 * (along the rows, then down the columns). Shared by ddppack, which resizes whole
 * images as it packs them, and the loader's random_resized_crop, which resizes a
 * window of each training sample; resample.c says how. */
#ifndef DDP_RESAMPLE_H
#define DDP_RESAMPLE_H

#include <stdbool.h>
#include <stdint.h>

/* One side's taps: for each output coordinate, the input coordinates it reads
 * [first, first + n) and their weights, which sum to 1. */
typedef struct ddp_taps {
    int64_t out, span;  /* output coordinates; room for weights each */
    int64_t *first, *n; /* [out] */
    float *w;           /* [out][span] */
} ddp_taps;

/* The weights one output coordinate may need when at most max_in input coordinates
 * are resized to size. */
int64_t ddp_taps_span(int64_t max_in, int64_t size);
/* Room for out coordinates of span taps each; false when memory runs out. */
bool ddp_taps_init(ddp_taps *t, int64_t out, int64_t span);
void ddp_taps_free(ddp_taps *t);
/* The taps of output coordinates [offset, offset + t->out) of the window
 * [in_first, in_first + in_len) of a side resized to size coordinates; the window's
 * edges bound the filter (what lies outside it is cropped away first). */
void ddp_taps_set(ddp_taps *t, int64_t in_first, int64_t in_len, int64_t size, int64_t offset);

/* The first pass: src holds a row's pixels of `channels` values from input column
 * `from` on; dst receives cols->out pixels. */
void ddp_resample_row(const ddp_taps *cols, const float *src, int64_t from, int64_t channels, float *dst);
/* The second: output row i from the first pass's rows (mid: input rows from `from`
 * on, len values each) into dst (len values). */
void ddp_resample_column(const ddp_taps *rows, int64_t i, const float *mid, int64_t from, int64_t len,
                         float *dst);

#endif
