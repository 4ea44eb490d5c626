/* data_npy.c: NumPy's .npy files (numpy.save): one array of inputs, one of labels; or
 * two patterns of several such files (x-*.npy, y-*.npy) whose files pair in order; or
 * inputs alone, for predictions (--predict-inputs).
 *
 * A file is the magic "\x93NUMPY", a version (1.0: a u16 header length; 2.0 and 3.0: a
 * u32), a header that is a Python dict literal with 'descr' (the dtype), 'fortran_order'
 * and 'shape', and then the values. Other byte orders and Fortran order are converted
 * here, once, so that batches read the values as they are. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_read.h"

enum { NPY_MAX_RANK = 9 }; /* the sample axis and ddp_data's eight */

typedef struct npy_array {
    data_bytes bytes;
    size_t offset; /* where the values start */
    int elem;
    bool big_endian, fortran;
    int rank;
    int64_t shape[NPY_MAX_RANK];
} npy_array;

/* A piece of the header's text. */
typedef struct span {
    const char *p;
    size_t len;
} span;

/* ------------------------------------------------------------ the header */

static void skip_space(span *s) {
    while (s->len && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++, s->len--;
}

static bool next_is(span *s, char c) {
    skip_space(s);
    return s->len && *s->p == c;
}

static bool eat(span *s, char c) {
    if (!next_is(s, c))
        return false;
    s->p++, s->len--;
    return true;
}

static bool is_quote(char c) {
    return c == '\'' || c == '"';
}

/* One key or value of the dict: a quoted string, a bracketed group (a tuple, or a
 * structured dtype's list) or a bare word, up to the colon, comma or brace after it. */
static span take_value(span *s) {
    skip_space(s);
    size_t n = 0;
    int depth = 0;
    while (n < s->len) {
        char c = s->p[n];
        if (is_quote(c)) {
            const char *close = memchr(s->p + n + 1, c, s->len - n - 1);
            n = close ? (size_t)(close - s->p) + 1 : s->len;
            continue;
        }
        if (depth == 0 && (c == ',' || c == '}' || c == ':'))
            break;
        depth += c == '(' || c == '[' || c == '{';
        depth -= c == ')' || c == ']';
        n++;
    }
    span v = {s->p, n};
    while (v.len && (v.p[v.len - 1] == ' ' || v.p[v.len - 1] == '\n'))
        v.len--;
    s->p += n, s->len -= n;
    return v;
}

static bool is_string(span v) {
    return v.len >= 2 && is_quote(v.p[0]) && v.p[v.len - 1] == v.p[0];
}

static bool equals(span v, const char *word) {
    return v.len == strlen(word) && memcmp(v.p, word, v.len) == 0;
}

static bool damaged_header(const char *path, span at, char *err, size_t errlen) {
    char near[48];
    return data_fail(err, errlen, path,
                     "the .npy header is not a dict of 'descr', 'fortran_order' and 'shape' "
                     "(near \"%s\"); the file is damaged: save it again with numpy.save",
                     data_excerpt(near, sizeof near, at.p, at.len));
}

/* The dict's three entries; other keys are ignored, as numpy does. */
static bool parse_dict(const char *path, span text, span *descr, span *fortran, span *shape, char *err,
                       size_t errlen) {
    *descr = *fortran = *shape = (span){NULL, 0};
    if (!eat(&text, '{'))
        return damaged_header(path, text, err, errlen);
    while (!eat(&text, '}')) {
        span key = take_value(&text);
        if (!is_string(key) || !eat(&text, ':'))
            return damaged_header(path, key, err, errlen);
        span value = take_value(&text);
        span inner = {key.p + 1, key.len - 2};
        if (equals(inner, "descr"))
            *descr = value;
        else if (equals(inner, "fortran_order"))
            *fortran = value;
        else if (equals(inner, "shape"))
            *shape = value;
        if (!eat(&text, ',') && !next_is(&text, '}'))
            return damaged_header(path, value, err, errlen);
    }
    const char *missing = !descr->p ? "descr" : !fortran->p ? "fortran_order" : !shape->p ? "shape" : NULL;
    if (missing)
        return data_fail(err, errlen, path,
                         "the .npy header has no '%s'; the file is damaged: save it again "
                         "with numpy.save",
                         missing);
    return true;
}

static bool parse_descr(const char *path, span v, npy_array *a, char *err, size_t errlen) {
    static const struct {
        char kind;
        int size, elem;
    } types[] = {{'u', 1, DDP_ELEM_U8},  {'i', 1, DDP_ELEM_I8},  {'u', 2, DDP_ELEM_U16},
                 {'i', 2, DDP_ELEM_I16}, {'u', 4, DDP_ELEM_U32}, {'i', 4, DDP_ELEM_I32},
                 {'u', 8, DDP_ELEM_U64}, {'i', 8, DDP_ELEM_I64}, {'f', 2, DDP_ELEM_F16},
                 {'f', 4, DDP_ELEM_F32}, {'f', 8, DDP_ELEM_F64}, {'b', 1, DDP_ELEM_U8}};
    char quoted[128];
    if (!is_string(v))
        return data_fail(err, errlen, path,
                         "the array has the structured dtype %s; save the inputs and the "
                         "labels as two plain numeric arrays",
                         data_excerpt(quoted, sizeof quoted, v.p, v.len));
    const char *s = v.p + 1;
    int n = (int)v.len - 2;
    data_excerpt(quoted, 24, s, (size_t)n);
    if (n >= 2 && s[1] == 'O')
        return data_fail(err, errlen, path,
                         "the array holds Python objects (dtype '%s'), not numbers; save a "
                         "numeric array, e.g. np.asarray(a, dtype=np.float32)",
                         quoted);
    char digits[8] = "";
    if (n >= 3 && n <= 4 && strchr("<>|=", s[0]))
        memcpy(digits, s + 2, (size_t)n - 2);
    int size = digits[0] && strspn(digits, "0123456789") == strlen(digits) ? atoi(digits) : 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (size && types[i].kind == s[1] && types[i].size == size) {
            a->elem = types[i].elem;
            a->big_endian = s[0] == '>' || (s[0] == '=' && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__);
            return true;
        }
    return data_fail(err, errlen, path,
                     "unsupported dtype '%s': the arrays must hold numbers (u1, i1, u2, i2, "
                     "u4, i4, u8, i8, f2, f4, f8 or b1, either byte order); convert it before saving, e.g. "
                     "a.astype(np.float32)",
                     quoted);
}

static bool parse_shape(const char *path, span v, npy_array *a, char *err, size_t errlen) {
    char quoted[64];
    span s = v;
    a->rank = 0;
    if (!eat(&s, '('))
        return damaged_header(path, v, err, errlen);
    while (!eat(&s, ')')) {
        skip_space(&s);
        /* digits read within the header only: a mapped file has nothing after its end */
        int64_t size = s.len && *s.p >= '0' && *s.p <= '9' ? 0 : -1;
        size_t n = 0;
        for (; size >= 0 && n < s.len && s.p[n] >= '0' && s.p[n] <= '9'; n++)
            if (__builtin_mul_overflow(size, 10, &size) || __builtin_add_overflow(size, s.p[n] - '0', &size))
                size = -1;
        if (size < 0 || a->rank == NPY_MAX_RANK)
            return data_fail(err, errlen, path,
                             "the .npy shape %s is not a tuple of at most %d sizes; "
                             "save the array again with numpy.save",
                             data_excerpt(quoted, sizeof quoted, v.p, v.len), NPY_MAX_RANK);
        a->shape[a->rank++] = size;
        s.p += n, s.len -= n;
        if (s.len && *s.p == 'L') /* Python 2 long integers */
            s.p++, s.len--;
        if (!eat(&s, ',') && !next_is(&s, ')'))
            return damaged_header(path, v, err, errlen);
    }
    return true;
}

static bool parse_header(const char *path, npy_array *a, char *err, size_t errlen) {
    const unsigned char *b = a->bytes.data;
    size_t len = a->bytes.len;
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return data_fail(err, errlen, path,
                         "not a NumPy .npy file (it does not start with \\x93NUMPY); save the "
                         "array with numpy.save");
    int major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0)
        return data_fail(err, errlen, path,
                         "npy format version %d.%d is not supported (1.0, 2.0 and 3.0 are); "
                         "save the array again with numpy.save",
                         major, minor);
    size_t start = major == 1 ? 10 : 12;
    size_t header = len < start ? 0 : major == 1 ? data_le16(b + 8) : data_le32(b + 8);
    if (len < start || header > len - start)
        return data_fail(err, errlen, path, "truncated: the file ends inside its header; save it again");
    a->offset = start + header;
    span text = {(const char *)b + start, header}, descr, fortran, shape;
    if (!parse_dict(path, text, &descr, &fortran, &shape, err, errlen) ||
        !parse_descr(path, descr, a, err, errlen) || !parse_shape(path, shape, a, err, errlen))
        return false;
    if (!equals(fortran, "True") && !equals(fortran, "False"))
        return damaged_header(path, fortran, err, errlen);
    a->fortran = equals(fortran, "True");
    return true;
}

/* --------------------------------------------------------------- values */

/* "(60000, 28, 28)", "(5,)", as numpy prints shapes */
static const char *shape_text(char *buf, size_t len, const npy_array *a) {
    char dims[160];
    snprintf(buf, len, "(%s%s)", ddp_dims_text(dims, sizeof dims, a->shape, a->rank, ", "),
             a->rank == 1 ? "," : "");
    return buf;
}

static bool check_size(const char *path, const char *role, const npy_array *a, int max_rank, char *err,
                       size_t errlen) {
    char shape[192];
    shape_text(shape, sizeof shape, a);
    if (a->rank < 1 || a->rank > max_rank)
        return data_fail(err, errlen, path, "the %s have the shape %s, but they need %s", role, shape,
                         max_rank == 2 ? "the shape (samples,) or (samples, values)"
                                       : "a first axis of samples (and at most 8 more)");
    uint64_t bytes;
    size_t present = a->bytes.len - a->offset;
    if (!data_array_bytes(a->shape[0], a->shape + 1, a->rank - 1, data_elem_size[a->elem], &bytes))
        return data_fail(err, errlen, path, "the shape %s is impossibly large; the file is damaged", shape);
    if (present < bytes)
        return data_fail(err, errlen, path,
                         "truncated: the header promises %s of %s (%llu bytes of values) but "
                         "the file has %zu; save it again",
                         shape, data_elem_name[a->elem], (unsigned long long)bytes, present);
    if (present > bytes)
        return data_fail(err, errlen, path,
                         "%llu bytes too many: the header promises %s of %s (%llu bytes of "
                         "values) but the file has %zu; it is damaged: save it again",
                         (unsigned long long)(present - bytes), shape, data_elem_name[a->elem],
                         (unsigned long long)bytes, present);
    if (a->shape[0] == 0)
        return data_fail(err, errlen, path, "the %s have the shape %s: no samples", role, shape);
    for (int i = 1; i < a->rank; i++)
        if (a->shape[i] == 0)
            return data_fail(err, errlen, path, "the %s have the shape %s: no values per sample", role,
                             shape);
    return true;
}

/* Inputs are mapped where they can be (data_map.c); labels, converted anyway, are read. */
static bool read_npy(const char *path, const ddp_dataset *spec, const char *role, int max_rank, npy_array *a,
                     char *err, size_t errlen) {
    bool inputs = max_rank == NPY_MAX_RANK;
    return (inputs ? data_map_file : data_read_file)(path, spec, role, &a->bytes, err, errlen) &&
           parse_header(path, a, err, errlen) && check_size(path, role, a, max_rank, err, errlen);
}

/* Fortran order (first axis fastest) to C order (last axis fastest). */
static void to_c_order(unsigned char *dst, const unsigned char *src, const npy_array *a, size_t count) {
    size_t width = (size_t)data_elem_size[a->elem];
    int64_t index[NPY_MAX_RANK] = {0}, stride[NPY_MAX_RANK];
    for (int i = 0; i < a->rank; i++)
        stride[i] = i == 0 ? 1 : stride[i - 1] * a->shape[i - 1];
    int64_t from = 0;
    for (size_t k = 0; k < count; k++) {
        memcpy(dst + k * width, src + (size_t)from * width, width);
        for (int i = a->rank - 1; i >= 0; i--) {
            from += stride[i];
            if (++index[i] < a->shape[i])
                break;
            from -= stride[i] * a->shape[i];
            index[i] = 0;
        }
    }
}

/* The values, native and in C order, as a block the caller owns, or for inputs (d not
 * NULL) in the file's mapping where they need no rewriting; NULL: out of memory. */
static void *take_values(npy_array *a, size_t *count, ddp_data *d) {
    size_t width = (size_t)data_elem_size[a->elem];
    *count = (a->bytes.len - a->offset) / width;
    bool swapped = width > 1 && a->big_endian != (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__);
    if (swapped && !data_own(&a->bytes))
        return NULL;
    data_to_native(a->bytes.data + a->offset, *count, (int)width, a->big_endian);
    if (!a->fortran || a->rank < 2)
        return d ? data_keep_inputs(d, &a->bytes, a->offset, (int)width) : data_take(&a->bytes, a->offset);
    unsigned char *c_order = malloc(*count * width);
    if (c_order)
        to_c_order(c_order, a->bytes.data + a->offset, a, *count);
    return c_order;
}

/* The arrays' values into d; without labels (an unlabelled dataset), zeros. */
static bool keep_arrays(ddp_data *d, npy_array *inputs, npy_array *labels, char *err, size_t errlen) {
    size_t count;
    d->samples = inputs->shape[0];
    d->elem = inputs->elem;
    data_set_sample_shape(d, inputs->rank - 1, inputs->shape + 1);
    d->inputs = take_values(inputs, &count, d);
    if (!d->inputs)
        return data_fail(err, errlen, d->where, "out of memory for %zu values", count);
    d->label_elems = labels && labels->rank == 2 ? labels->shape[1] : 1;
    if (!labels) {
        d->labels = calloc((size_t)d->samples + 1, sizeof *d->labels);
        return d->labels || data_fail(err, errlen, d->where, "out of memory for its labels");
    }
    /* apart: the count must be the labels' before it is passed on */
    void *label_values = take_values(labels, &count, NULL);
    d->labels = data_into_doubles(label_values, labels->elem, count);
    if (!d->labels)
        return data_fail(err, errlen, d->label_where, "out of memory for %zu labels", count);
    return true;
}

/* Inputs alone: every label 0, one value a sample. */
static bool read_unlabelled(ddp_data *d, char *err, size_t errlen) {
    npy_array inputs = {0};
    bool ok = read_npy(d->where, d->spec, "inputs", NPY_MAX_RANK, &inputs, err, errlen);
    ok = ok && keep_arrays(d, &inputs, NULL, err, errlen);
    data_bytes_free(&inputs.bytes);
    return ok;
}

/* One pair of files, d->where and d->label_where, into d. */
static bool read_pair(ddp_data *d, char *err, size_t errlen) {
    if (d->unlabelled)
        return read_unlabelled(d, err, errlen);
    npy_array inputs = {0}, labels = {0};
    bool ok = read_npy(d->where, d->spec, "inputs", NPY_MAX_RANK, &inputs, err, errlen) &&
              read_npy(d->label_where, d->spec, "labels", 2, &labels, err, errlen);
    if (ok && inputs.shape[0] != labels.shape[0]) {
        char in[192], out[192];
        ok = data_fail(err, errlen, d->label_where,
                       "holds %lld labels (shape %s) but %s holds %lld samples "
                       "(shape %s); the labels must be one per sample, in the same order",
                       (long long)labels.shape[0], shape_text(out, sizeof out, &labels), d->where,
                       (long long)inputs.shape[0], shape_text(in, sizeof in, &inputs));
    }
    if (ok)
        ok = keep_arrays(d, &inputs, &labels, err, errlen);
    data_bytes_free(&inputs.bytes);
    data_bytes_free(&labels.bytes);
    return ok;
}

/* ------------------------------------------------- datasets of several files */

/* A path with *, ? or [ and no file of that very name is a pattern of several. */
static bool is_pattern(const char *path) {
    return strpbrk(path, "*?[") && access(path, F_OK) != 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files a pattern matches, sorted by name byte by byte (whatever the locale, so
 * every worker pairs and orders them alike); false with a message when none does. */
static bool expand(const char *pattern, const char *role, const ddp_dataset *spec, glob_t *g, char *err,
                   size_t errlen) {
    char what[DATA_ROLE_MAX];
    int got = glob(pattern, GLOB_NOSORT, NULL, g);
    if (got == GLOB_NOMATCH || (got == 0 && g->gl_pathc == 0))
        return data_fail(err, errlen, pattern, "no file matches this pattern (%s); check the path",
                         data_role(what, sizeof what, spec, role));
    if (got != 0)
        return data_fail(err, errlen, pattern, "cannot list the files of this pattern (%s): %s",
                         data_role(what, sizeof what, spec, role),
                         got == GLOB_NOSPACE ? "out of memory" : "a folder cannot be read");
    qsort(g->gl_pathv, g->gl_pathc, sizeof *g->gl_pathv, by_name);
    return true;
}

/* part, one pair of the files, must hold samples like the first pair's (d's). */
static bool like_first(const ddp_data *d, const ddp_data *part, char *err, size_t errlen) {
    char first[128], its[128];
    bool same_shape = part->rank == d->rank && memcmp(part->shape, d->shape, sizeof d->shape) == 0;
    if (!same_shape || part->elem != d->elem)
        return data_fail(err, errlen, part->where,
                         "its samples are %s of %s, but those of %s, the pattern's first file, are %s of %s; "
                         "every file of a dataset holds samples of one shape and type",
                         ddp_shape_text(its, sizeof its, part->shape, part->rank), data_elem_name[part->elem],
                         d->shards[0].path, ddp_shape_text(first, sizeof first, d->shape, d->rank),
                         data_elem_name[d->elem]);
    if (part->label_elems != d->label_elems)
        return data_fail(err, errlen, part->label_where,
                         "holds labels of %lld values, but the first file of the pattern %s holds labels "
                         "of %lld; every file of a dataset holds labels of one shape",
                         (long long)part->label_elems, d->label_where, (long long)d->label_elems);
    return true;
}

/* part's inputs made shard i of d (which then owns them), its labels appended. */
static bool add_shard(ddp_data *d, ddp_data *part, int64_t i, char *err, size_t errlen) {
    size_t count = (size_t)((d->samples + part->samples) * part->label_elems);
    double *labels = realloc(d->labels, count * sizeof *labels);
    if (labels)
        d->labels = labels;
    char *path = strdup(part->where), *label_path = strdup(part->label_where);
    if (!labels || !path || !label_path) {
        free(path);
        free(label_path);
        return data_fail(err, errlen, part->where, "out of memory for its labels");
    }
    memcpy(labels + d->samples * part->label_elems, part->labels,
           (size_t)(part->samples * part->label_elems) * sizeof *labels);
    d->shards[i] = (ddp_data_shard){path,         label_path,         d->samples,       part->inputs,
                                    part->mapping, part->mapping_len, part->read_ahead};
    d->nshards = i + 1;
    d->samples += part->samples;
    part->inputs = NULL, part->mapping = NULL;
    return true;
}

/* Inputs and labels given as two patterns: their files pair in order, each pair read
 * and checked as a dataset of its own, the samples one after another. An unlabelled
 * dataset's inputs alone. */
static bool read_shards(ddp_data *d, char *err, size_t errlen) {
    if (!d->unlabelled && (!is_pattern(d->where) || !is_pattern(d->label_where)))
        return data_fail(err, errlen, is_pattern(d->where) ? d->where : d->label_where,
                         "the inputs or the labels are given as a pattern of several files and the other "
                         "as one file; give both as patterns (x-*.npy and y-*.npy), whose files pair in order");
    glob_t inputs = {0}, labels = {0};
    bool ok = expand(d->where, "inputs", d->spec, &inputs, err, errlen) &&
              (d->unlabelled || expand(d->label_where, "labels", d->spec, &labels, err, errlen));
    if (ok && !d->unlabelled && inputs.gl_pathc != labels.gl_pathc)
        ok = data_fail(err, errlen, d->label_where,
                       "%zu files match the labels' pattern but %zu match the inputs' (%s); their files pair "
                       "in order, one of labels for each of inputs",
                       labels.gl_pathc, inputs.gl_pathc, d->where);
    if (ok && !(d->shards = calloc(inputs.gl_pathc, sizeof *d->shards)))
        ok = data_fail(err, errlen, d->where, "out of memory for %zu files", inputs.gl_pathc);
    for (size_t i = 0; ok && i < inputs.gl_pathc; i++) {
        ddp_data part = {.spec = d->spec, .unlabelled = d->unlabelled};
        const char *label_path = d->unlabelled ? "" : labels.gl_pathv[i];
        const char *too_long = strlen(inputs.gl_pathv[i]) >= sizeof part.where ? inputs.gl_pathv[i]
                               : strlen(label_path) >= sizeof part.where      ? label_path
                                                                              : NULL;
        if (too_long) {
            ok = data_fail(err, errlen, d->where, "it matches a path of over %zu characters, %.200s...",
                           sizeof part.where - 1, too_long);
            break;
        }
        snprintf(part.where, sizeof part.where, "%s", inputs.gl_pathv[i]);
        snprintf(part.label_where, sizeof part.label_where, "%s", label_path);
        ok = read_pair(&part, err, errlen) && data_check_labels(&part, err, errlen);
        if (ok && i == 0) {
            d->elem = part.elem, d->label_elems = part.label_elems;
            data_set_sample_shape(d, part.rank, part.shape);
        }
        ok = ok && like_first(d, &part, err, errlen) && add_shard(d, &part, (int64_t)i, err, errlen);
        ddp_data_free(&part);
    }
    globfree(&inputs);
    globfree(&labels);
    return ok;
}

bool data_read_npy(ddp_data *d, char *err, size_t errlen) {
    return is_pattern(d->where) || is_pattern(d->label_where) ? read_shards(d, err, errlen)
                                                              : read_pair(d, err, errlen);
}
