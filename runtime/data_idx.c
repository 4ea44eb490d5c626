/* data_idx.c: IDX files, the format of MNIST and its family (Fashion-MNIST, KMNIST,
 * EMNIST): the images in one file and the labels in another, plain or gzip-compressed.
 *
 * A file is two zero bytes, a type byte, a rank byte, rank big-endian u32 sizes (the
 * first counts the samples) and then the values, big-endian, in C order. The sizes say
 * exactly how long the file is, so a download cut short or a wrong file shows at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_read.h"

enum { IDX_MAX_RANK = 9 }; /* the sample axis and ddp_data's eight */

/* One file, checked; its values start at offset, still big-endian. */
typedef struct idx_array {
    data_bytes bytes;
    int elem;
    int rank;
    int64_t dims[IDX_MAX_RANK];
    size_t offset;
} idx_array;

static bool idx_elem(unsigned char code, int *elem) {
    static const struct {
        unsigned char code;
        int elem;
    } types[] = {{0x08, DDP_ELEM_U8},  {0x09, DDP_ELEM_I8},  {0x0B, DDP_ELEM_I16},
                 {0x0C, DDP_ELEM_I32}, {0x0D, DDP_ELEM_F32}, {0x0E, DDP_ELEM_F64}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].code == code) {
            *elem = types[i].elem;
            return true;
        }
    return false;
}

/* "60000 images of 28x28", "60000 labels", "60000 labels of 3 values" */
static const char *describe(char *buf, size_t len, const idx_array *a, const char *role) {
    char dims[128];
    int per_rank = a->rank - 1;
    ddp_dims_text(dims, sizeof dims, a->dims + 1, per_rank, "x");
    if (per_rank == 0)
        snprintf(buf, len, "%lld %s", (long long)a->dims[0], role);
    else if (per_rank == 1)
        snprintf(buf, len, "%lld %s of %s values", (long long)a->dims[0], role, dims);
    else
        snprintf(buf, len, "%lld %s of %s", (long long)a->dims[0], role, dims);
    return buf;
}

static bool parse_header(const char *path, const char *role, int max_rank, idx_array *a, char *err,
                         size_t errlen) {
    const unsigned char *b = a->bytes.data;
    size_t len = a->bytes.len;
    if (len < 4 || b[0] != 0 || b[1] != 0)
        return data_fail(
            err, errlen, path,
            "not an IDX file: it does not start with IDX's magic number (two zero bytes, a type, "
            "a rank); check that it is the %s file of an MNIST-style dataset",
            role);
    if (!idx_elem(b[2], &a->elem))
        return data_fail(err, errlen, path,
                         "unknown IDX element type 0x%02X (known: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, "
                         "0x0D f32, 0x0E f64); the file is damaged or not an IDX file",
                         b[2]);
    a->rank = b[3];
    if (a->rank < 1 || a->rank > max_rank)
        return data_fail(err, errlen, path,
                         "IDX rank %d: %s files need 1 to %d dimensions (the first counts the samples); "
                         "check that this is the %s file",
                         a->rank, role, max_rank, role);
    a->offset = 4 + 4 * (size_t)a->rank;
    if (len < a->offset)
        return data_fail(err, errlen, path,
                         "truncated: the file ends inside its header (%zu bytes of %zu); download it again",
                         len, a->offset);
    for (int i = 0; i < a->rank; i++)
        a->dims[i] = data_be32(b + 4 + 4 * i);
    return true;
}

static bool check_size(const char *path, const char *role, const idx_array *a, char *err, size_t errlen) {
    char what[192];
    describe(what, sizeof what, a, role);
    uint64_t bytes;
    if (!data_array_bytes(a->dims[0], a->dims + 1, a->rank - 1, data_elem_size[a->elem], &bytes) ||
        bytes > UINT64_MAX - a->offset)
        return data_fail(err, errlen, path,
                         "the header promises %s, more than any file holds; the file is "
                         "damaged: download it again",
                         what);
    uint64_t expected = bytes + a->offset;
    if (a->bytes.len < expected)
        return data_fail(err, errlen, path,
                         "truncated: the header promises %s (%llu bytes) but the file has "
                         "%zu bytes; download it again",
                         what, (unsigned long long)expected, a->bytes.len);
    if (a->bytes.len > expected)
        return data_fail(err, errlen, path,
                         "%llu bytes too many: the header promises %s (%llu bytes) but the "
                         "file has %zu; it is damaged or not an IDX file: download it again",
                         (unsigned long long)(a->bytes.len - expected), what, (unsigned long long)expected,
                         a->bytes.len);
    if (a->dims[0] == 0)
        return data_fail(err, errlen, path, "holds no %s (its header counts 0); a dataset needs samples",
                         role);
    for (int i = 1; i < a->rank; i++)
        if (a->dims[i] == 0)
            return data_fail(err, errlen, path, "holds %s: no values per sample; check the file", what);
    return true;
}

/* Images are mapped where they can be (data_map.c); labels, converted anyway, are read. */
static bool read_idx_file(const char *path, const ddp_dataset *spec, const char *role, int max_rank,
                          idx_array *a, char *err, size_t errlen) {
    bool images = max_rank == IDX_MAX_RANK;
    return (images ? data_map_file : data_read_file)(path, spec, role, &a->bytes, err, errlen) &&
           parse_header(path, role, max_rank, a, err, errlen) && check_size(path, role, a, err, errlen);
}

/* The values of a checked file, in the host's byte order (a mapped file of values wider
 * than a byte is copied first); false: out of memory. */
static bool native_values(idx_array *a, size_t *count) {
    size_t width = (size_t)data_elem_size[a->elem];
    *count = (a->bytes.len - a->offset) / width;
    if (width > 1 && !data_own(&a->bytes))
        return false;
    data_to_native(a->bytes.data + a->offset, *count, (int)width, true);
    return true;
}

static bool keep_arrays(ddp_data *d, idx_array *images, idx_array *labels, char *err, size_t errlen) {
    d->samples = images->dims[0];
    d->elem = images->elem;
    data_set_sample_shape(d, images->rank - 1, images->dims + 1);
    d->label_elems = labels->rank == 2 ? labels->dims[1] : 1;
    size_t count;
    native_values(labels, &count); /* labels are read, never mapped: nothing to copy */
    d->labels = data_into_doubles(data_take(&labels->bytes, labels->offset), labels->elem, count);
    if (!d->labels)
        return data_fail(err, errlen, d->label_where, "out of memory for %zu labels", count);
    if (native_values(images, &count))
        d->inputs = data_keep_inputs(d, &images->bytes, images->offset, data_elem_size[images->elem]);
    if (!d->inputs)
        return data_fail(err, errlen, d->where, "out of memory for %zu values", count);
    return true;
}

bool data_read_idx(ddp_data *d, char *err, size_t errlen) {
    idx_array images = {0}, labels = {0};
    bool ok = read_idx_file(d->where, d->spec, "images", IDX_MAX_RANK, &images, err, errlen) &&
              read_idx_file(d->label_where, d->spec, "labels", 2, &labels, err, errlen);
    if (ok && images.dims[0] != labels.dims[0])
        ok = data_fail(err, errlen, d->label_where,
                       "holds %lld labels but %s holds %lld images; the two files must belong together "
                       "(train-images with train-labels, t10k-images with t10k-labels)",
                       (long long)labels.dims[0], d->where, (long long)images.dims[0]);
    if (ok)
        ok = keep_arrays(d, &images, &labels, err, errlen);
    data_bytes_free(&images.bytes);
    data_bytes_free(&labels.bytes);
    return ok;
}
