/* data_tokens.c: a flat file of token indices, as a language model's corpus is kept
 * (nanoGPT's train.bin: uint16, little-endian, no header; a text's own bytes with
 * type = uint8), cut into windows: sample i is the `window` tokens from i * window,
 * and its labels the `window` tokens one further on, each token's next.
 *
 * The file is mapped, not copied, and the labels are read from the same mapping
 * (data.c's label_value), so billions of tokens cost no memory of their own. The
 * tokens after the last whole window and the one token after it are not read. Their
 * range (below the embedding's vocab and the classes) is checked by the workers of a
 * job a part each (data.c's tokens_fit), not at opening by every worker. */
#include <stdio.h>

#include "data_read.h"

static const char *const type_names[] = {[1] = "uint8", [2] = "uint16", [4] = "uint32"};

/* The largest of count tokens of width bytes: a loop for each width, so each is a
 * vector maximum. */
static int64_t largest_token(const unsigned char *p, size_t count, int width) {
    uint32_t most = 0;
    if (width == 1)
        for (size_t i = 0; i < count; i++)
            most = p[i] > most ? p[i] : most;
    else if (width == 2)
        for (size_t i = 0; i < count; i++)
            most = ((const uint16_t *)p)[i] > most ? ((const uint16_t *)p)[i] : most;
    else
        for (size_t i = 0; i < count; i++)
            most = ((const uint32_t *)p)[i] > most ? ((const uint32_t *)p)[i] : most;
    return most;
}

int64_t data_largest_token(const ddp_data *d, int64_t first, int64_t count) {
    int width = (int)d->spec->token_bytes;
    return largest_token((const unsigned char *)d->inputs + first * width, (size_t)count, width);
}

bool data_read_tokens(ddp_data *d, char *err, size_t errlen) {
    const ddp_dataset *spec = d->spec;
    int width = (int)spec->token_bytes;
    int64_t window = spec->window;
    data_bytes b;
    if (!data_map_file(d->where, spec, "token file", &b, err, errlen))
        return false;
    size_t count = b.len / (size_t)width;
    bool ok = true;
    if (b.len % (size_t)width)
        ok = data_fail(err, errlen, d->where,
                       "holds %zu bytes, not a whole number of %d-byte tokens (type = %s); give the type the file "
                       "was written in",
                       b.len, width, type_names[width]);
    else if (count < (size_t)window + 1)
        ok = data_fail(err, errlen, d->where,
                       "holds %zu token%s (type = %s), too few for one window of %lld and the token after it",
                       count, count == 1 ? "" : "s", type_names[width], (long long)window);
    if (!ok) {
        data_bytes_free(&b);
        return false;
    }
    d->samples = (int64_t)((count - 1) / (size_t)window);
    d->elem = width == 1 ? DDP_ELEM_U8 : width == 2 ? DDP_ELEM_U16 : DDP_ELEM_U32;
    data_set_sample_shape(d, 1, &window);
    d->label_elems = window;
    d->integral_labels = true;
    d->inputs = data_keep_inputs(d, &b, 0, width);
    return d->inputs || data_fail(err, errlen, d->where, "out of memory for %zu tokens", count);
}
