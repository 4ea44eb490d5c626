/* data.c: datasets in memory: opening one (the readers are data_idx.c, data_cifar10.c,
 * data_npy.c and data_csv.c), checking it against the program, and assembling batches.
 *
 * Files are kept as their files hold them: inputs in their own element type (mapped
 * where data_map.c can, else read whole), labels as doubles. A batch converts and
 * scales only the rows it takes, so the dataset costs its file's size in memory, not
 * that of its f32 or f64 copy, and a mapped file's one copy serves every worker of a
 * node. Synthetic data has no arrays at all: every value is a draw, made when a batch
 * asks for it.
 *
 * Also here: the helpers the readers share (data_read.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bf16.h"
#include "data_read.h"
#include "resample.h"

/* ------------------------------------------------------------- messages */

bool data_fail(char *err, size_t errlen, const char *file, const char *fmt, ...) {
    int n = snprintf(err, errlen, "%s: ", file);
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return false;
}

const char *data_role(char *buf, size_t len, const ddp_dataset *spec, const char *role) {
    if (spec->name && *spec->name)
        snprintf(buf, len, "the dataset `%s`, %s", spec->name, role);
    else
        snprintf(buf, len, "the dataset's %s", role);
    return buf;
}

const char *data_root_hint(const ddp_dataset *spec) {
    for (int i = 0; i < 2; i++)
        if (spec->path[i] && spec->path[i][0] && spec->path[i][0] != '/')
            return " or give --data-root";
    return "";
}

const char *ddp_dims_text(char *buf, size_t len, const int64_t *dims, int rank, const char *sep) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < rank && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%lld", i ? sep : "", (long long)dims[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    return buf;
}

const char *ddp_shape_text(char *buf, size_t len, const int64_t *dims, int rank) {
    char inner[256];
    snprintf(buf, len, "[%s]", ddp_dims_text(inner, sizeof inner, dims, rank, ", "));
    return buf;
}

const char *data_excerpt(char *buf, size_t len, const char *text, size_t n) {
    size_t room = len - 4, k = 0; /* room for "..." and the terminator */
    for (; k < n && k < room && text[k]; k++)
        buf[k] = (unsigned char)text[k] < 0x20 || text[k] == 0x7f ? '?' : text[k];
    strcpy(buf + k, k < n && text[k] ? "..." : "");
    return buf;
}

bool data_join_path(char *out, size_t outlen, const char *dir, const char *name) {
    size_t n = strlen(dir);
    const char *slash = n > 0 && dir[n - 1] == '/' ? "" : "/";
    int written = snprintf(out, outlen, "%s%s%s", dir, slash, name);
    return written >= 0 && (size_t)written < outlen;
}

/* ---------------------------------------------------------------- files */

void data_bytes_free(data_bytes *b) {
    if (b->mapped)
        data_unmap(b);
    free(b->data);
    *b = (data_bytes){0};
}

void *data_take(data_bytes *b, size_t offset) {
    if (!data_own(b))
        return NULL;
    size_t n = b->len - offset;
    memmove(b->data, b->data + offset, n);
    void *shrunk = realloc(b->data, n ? n : 1);
    void *block = shrunk ? shrunk : b->data;
    *b = (data_bytes){0};
    return block;
}

/* Why a file cannot be read, before reading it: missing, a folder, or empty. */
static bool check_file(const char *path, const ddp_dataset *spec, const char *role, struct stat *st,
                       char *err, size_t errlen) {
    char what[DATA_ROLE_MAX];
    if (stat(path, st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return data_fail(err, errlen, path, "no such file (%s); check the path%s",
                             data_role(what, sizeof what, spec, role), data_root_hint(spec));
        return data_fail(err, errlen, path, "cannot read it (%s): %s; check the file's permissions",
                         data_role(what, sizeof what, spec, role), strerror(errno));
    }
    if (S_ISDIR(st->st_mode))
        return data_fail(err, errlen, path, "is a folder, not a file (%s); name the file itself",
                         data_role(what, sizeof what, spec, role));
    if (st->st_size == 0)
        return data_fail(err, errlen, path, "the file is empty (%s); download it again or check the path",
                         data_role(what, sizeof what, spec, role));
    return true;
}

/* Reads everything gzread gives into b, growing it; the caller checks how it ended. */
static int read_all(gzFile f, data_bytes *b, size_t capacity) {
    enum { MAX_READ = 1 << 30 }; /* gzread counts in int */
    for (;;) {
        if (b->len + 1 >= capacity) {
            unsigned char *grown = realloc(b->data, capacity * 2);
            if (!grown)
                return Z_MEM_ERROR;
            b->data = grown;
            capacity *= 2;
        }
        size_t room = capacity - 1 - b->len;
        int got = gzread(f, b->data + b->len, (unsigned)(room < MAX_READ ? room : MAX_READ));
        if (got < 0) {
            int errnum;
            gzerror(f, &errnum);
            return errnum;
        }
        if (got == 0)
            return Z_OK;
        b->len += (size_t)got;
    }
}

bool data_read_file(const char *path, const ddp_dataset *spec, const char *role, data_bytes *out, char *err,
                    size_t errlen) {
    *out = (data_bytes){0};
    struct stat st;
    if (!check_file(path, spec, role, &st, err, errlen))
        return false;
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return data_fail(err, errlen, path, "cannot open it: %s", errno ? strerror(errno) : "out of memory");
    gzbuffer(f, 1 << 18);
    size_t capacity = (size_t)st.st_size + 1;
    out->data = malloc(capacity);
    int status = out->data ? read_all(f, out, capacity) : Z_MEM_ERROR, zlib_status, read_errno = errno;
    char why[128]; /* zlib's own words, without the path it puts first; gone once closed */
    const char *said = gzerror(f, &zlib_status);
    size_t n = strlen(path);
    snprintf(why, sizeof why, "%s", strncmp(said, path, n) == 0 && said[n] == ':' ? said + n + 2 : said);
    if (status == Z_OK) /* a gzip stream cut short reads as a clean end */
        status = zlib_status;
    if (gzclose(f) == Z_BUF_ERROR && status == Z_OK)
        status = Z_BUF_ERROR;
    if (status != Z_OK) {
        data_bytes_free(out);
        if (status == Z_BUF_ERROR)
            return data_fail(err, errlen, path,
                             "the gzip stream ends early: the file is cut short (%lld bytes); "
                             "download it again",
                             (long long)st.st_size);
        if (status == Z_MEM_ERROR)
            return data_fail(err, errlen, path, "out of memory reading it (%lld bytes)",
                             (long long)st.st_size);
        if (status == Z_ERRNO)
            return data_fail(err, errlen, path, "cannot read it: %s", strerror(read_errno));
        return data_fail(err, errlen, path, "the gzip data is damaged (%s); download it again", why);
    }
    if (out->len == 0) {
        data_bytes_free(out);
        char what[DATA_ROLE_MAX];
        return data_fail(err, errlen, path, "the file holds an empty gzip stream (%s); download it again",
                         data_role(what, sizeof what, spec, role));
    }
    unsigned char *fitted = realloc(out->data, out->len + 1);
    if (fitted)
        out->data = fitted;
    out->data[out->len] = '\0';
    return true;
}

/* ------------------------------------------------------- element types */

const int data_elem_size[DDP_ELEM_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8};
const char *const data_elem_name[DDP_ELEM_COUNT] = {"u8",  "i8",  "u16", "i16", "u32", "i32",
                                                    "u64", "i64", "f16", "f32", "f64"};

uint32_t data_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

uint32_t data_le32(const unsigned char *p) {
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

uint16_t data_le16(const unsigned char *p) {
    return (uint16_t)(p[1] << 8 | p[0]);
}

void data_to_native(void *p, size_t count, int width, bool big_endian) {
    if (big_endian == (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__))
        return;
    unsigned char *b = p;
    for (size_t i = 0; i < count; i++, b += width)
        for (int lo = 0, hi = width - 1; lo < hi; lo++, hi--) {
            unsigned char t = b[lo];
            b[lo] = b[hi];
            b[hi] = t;
        }
}

double ddp_half_to_double(uint16_t h) {
    int exponent = h >> 10 & 0x1f, fraction = h & 0x3ff;
    double v = exponent == 0    ? ldexp(fraction, -24)
               : exponent == 31 ? (fraction ? NAN : INFINITY)
                                : ldexp(fraction + 1024, exponent - 25);
    return h & 0x8000 ? -v : v;
}

/* Converters from each element type to f32 and f64, times a scale: the inner loop of
 * every batch, one plain loop per pair so the compiler vectorizes it. */
typedef void (*convert_fn)(void *dst, const void *src, int64_t n, double scale);

#define LOAD_NUMBER(v) ((double)(v))
#define LOAD_HALF(v) ddp_half_to_double(v)
#define CONVERT(name, S, D, LOAD)                                                                            \
    static void name(void *dst, const void *src, int64_t n, double scale) {                                  \
        const S *restrict s = src;                                                                           \
        D *restrict t = dst;                                                                                 \
        for (int64_t k = 0; k < n; k++)                                                                      \
            t[k] = (D)(LOAD(s[k]) * scale);                                                                  \
    }
#define CONVERTERS(name, S, LOAD)                                                                            \
    CONVERT(name##_to_f32, S, float, LOAD) CONVERT(name##_to_f64, S, double, LOAD)

CONVERTERS(u8, uint8_t, LOAD_NUMBER)
CONVERTERS(i8, int8_t, LOAD_NUMBER)
CONVERTERS(u16, uint16_t, LOAD_NUMBER)
CONVERTERS(i16, int16_t, LOAD_NUMBER)
CONVERTERS(u32, uint32_t, LOAD_NUMBER)
CONVERTERS(i32, int32_t, LOAD_NUMBER)
CONVERTERS(u64, uint64_t, LOAD_NUMBER)
CONVERTERS(i64, int64_t, LOAD_NUMBER)
CONVERTERS(f16, uint16_t, LOAD_HALF)
CONVERTERS(f32, float, LOAD_NUMBER)
CONVERTERS(f64, double, LOAD_NUMBER)

/* [elem][0: f32, 1: f64] */
static const convert_fn converters[DDP_ELEM_COUNT][2] = {
    {u8_to_f32, u8_to_f64},   {i8_to_f32, i8_to_f64},   {u16_to_f32, u16_to_f64}, {i16_to_f32, i16_to_f64},
    {u32_to_f32, u32_to_f64}, {i32_to_f32, i32_to_f64}, {u64_to_f32, u64_to_f64}, {i64_to_f32, i64_to_f64},
    {f16_to_f32, f16_to_f64}, {f32_to_f32, f32_to_f64}, {f64_to_f32, f64_to_f64},
};

double *data_into_doubles(void *values, int elem, size_t count) {
    double *doubles = values ? malloc((count ? count : 1) * sizeof *doubles) : NULL;
    if (doubles)
        converters[elem][1](doubles, values, (int64_t)count, 1.0);
    free(values);
    return doubles;
}

/* ---------------------------------------------------------------- shapes */

bool data_array_bytes(int64_t samples, const int64_t *dims, int rank, int width, uint64_t *bytes) {
    uint64_t total = (uint64_t)width;
    if (samples < 0 || __builtin_mul_overflow(total, (uint64_t)samples, &total))
        return false;
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0 || __builtin_mul_overflow(total, (uint64_t)dims[i], &total))
            return false;
    *bytes = total;
    return true;
}

void data_set_sample_shape(ddp_data *d, int rank, const int64_t *dims) {
    d->rank = rank;
    d->elems = 1;
    for (int i = 0; i < rank; i++) {
        d->shape[i] = dims[i];
        d->elems *= dims[i];
    }
}

static int64_t model_input_elems(const ddp_program *p) {
    int64_t n = 1;
    for (int i = 0; i < p->input_rank; i++)
        n *= p->input_shape[i];
    return n;
}

/* -------------------------------------------------------------- opening */

static bool is_synthetic(const ddp_data *d) {
    return d->spec->kind == DDP_DATA_SYNTHETIC;
}

/* The file a message about labels names: the labels' own, or the one file. */
static const char *labels_file(const ddp_data *d) {
    return d->label_where[0] ? d->label_where : d->where;
}

static bool resolve_path(const ddp_dataset *spec, const char *root, const char *path, const char *role,
                         char *out, size_t outlen, char *err, size_t errlen) {
    char what[DATA_ROLE_MAX];
    if (!path || !*path) {
        snprintf(err, errlen, "%s has no path; name the file in the dataset's definition",
                 data_role(what, sizeof what, spec, role));
        return false;
    }
    bool below_root = path[0] != '/' && root && *root;
    bool fits = below_root ? data_join_path(out, outlen, root, path)
                           : (size_t)snprintf(out, outlen, "%s", path) < outlen;
    if (!fits)
        return data_fail(err, errlen, path, "the path is too long (%s)",
                         data_role(what, sizeof what, spec, role));
    return true;
}

static bool open_synthetic(ddp_data *d, char *err, size_t errlen) {
    const ddp_dataset *spec = d->spec;
    snprintf(d->where, sizeof d->where, "the synthetic dataset `%s`", spec->name ? spec->name : "");
    if (spec->samples < 1 || spec->classes < 1)
        return data_fail(err, errlen, d->where, "needs at least one sample and one class, not %lld and %lld",
                         (long long)spec->samples, (long long)spec->classes);
    d->samples = spec->samples;
    d->label_elems = 1;
    return true;
}

static const char *non_finite_name(double v) {
    return isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf";
}

/* The first element of count that is NaN or infinite, or -1; integers are all finite. */
static int64_t first_non_finite(const void *data, int elem, int64_t count) {
    switch (elem) {
    case DDP_ELEM_F16:
        for (int64_t i = 0; i < count; i++)
            if ((((const uint16_t *)data)[i] & 0x7c00) == 0x7c00)
                return i;
        return -1;
    case DDP_ELEM_F32:
        for (int64_t i = 0; i < count; i++)
            if (!isfinite(((const float *)data)[i]))
                return i;
        return -1;
    case DDP_ELEM_F64:
        for (int64_t i = 0; i < count; i++)
            if (!isfinite(((const double *)data)[i]))
                return i;
        return -1;
    default: return -1;
    }
}

/* whose: "sample" or "the label of sample"; part: "element" or "value"; data holds
 * samples from the file's sample first on. */
static bool check_finite(const char *file, const char *whose, const char *part, const void *data, int elem,
                         int64_t first, int64_t samples, int64_t per_sample, char *err, size_t errlen) {
    int64_t bad = first_non_finite(data, elem, samples * per_sample);
    if (bad < 0)
        return true;
    double v;
    converters[elem][1](&v, (const char *)data + bad * data_elem_size[elem], 1, 1.0);
    return data_fail(err, errlen, file,
                     "%s %lld holds %s (%s %lld); every value must be a finite number: fix or "
                     "drop that sample",
                     whose, (long long)(first + bad / per_sample), non_finite_name(v), part,
                     (long long)(bad % per_sample));
}

bool data_check_labels(const ddp_data *d, char *err, size_t errlen) {
    return check_finite(labels_file(d), "the label of sample", "value", d->labels, DDP_ELEM_F64, 0, d->samples,
                        d->label_elems, err, errlen);
}

/* Samples [begin, begin + size) hold finite numbers. */
static bool inputs_finite(const ddp_data *d, int64_t begin, int64_t size, char *err, size_t errlen) {
    int64_t width = d->elems * data_elem_size[d->elem];
    if (!d->nshards)
        return check_finite(d->where, "sample", "element", (const char *)d->inputs + begin * width, d->elem,
                            begin, size, d->elems, err, errlen);
    for (int64_t i = 0; i < d->nshards; i++) { /* the files this part of the samples lies in */
        const ddp_data_shard *s = &d->shards[i];
        int64_t end = i + 1 < d->nshards ? d->shards[i + 1].first : d->samples;
        int64_t lo = begin > s->first ? begin : s->first, hi = begin + size < end ? begin + size : end;
        if (lo < hi && !check_finite(s->path, "sample", "element", (const char *)s->inputs + (lo - s->first) * width,
                                     d->elem, lo - s->first, hi - lo, d->elems, err, errlen))
            return false;
    }
    return true;
}

static bool all_whole(const double *v, int64_t count) {
    for (int64_t i = 0; i < count; i++)
        if (v[i] != floor(v[i]))
            return false;
    return true;
}

static bool read_files(const ddp_dataset *spec, const char *root, ddp_data *d, char *err, size_t errlen) {
    static const char *const roles[][2] = {
        [DDP_DATA_IDX] = {"images", "labels"},
        [DDP_DATA_CIFAR10] = {"CIFAR-10 folder", NULL},
        [DDP_DATA_NPY] = {"inputs", "labels"},
        [DDP_DATA_CSV] = {"CSV file", NULL},
        [DDP_DATA_TOKENS] = {"token file", NULL},
    };
    static bool (*const readers[])(ddp_data *, char *, size_t) = {
        [DDP_DATA_IDX] = data_read_idx,
        [DDP_DATA_CIFAR10] = data_read_cifar10,
        [DDP_DATA_NPY] = data_read_npy,
        [DDP_DATA_CSV] = data_read_csv,
        [DDP_DATA_TOKENS] = data_read_tokens,
    };
    const char *const *role = roles[spec->kind];
    d->unlabelled = spec->kind == DDP_DATA_NPY && !(spec->path[1] && *spec->path[1]);
    if (!resolve_path(spec, root, spec->path[0], role[0], d->where, sizeof d->where, err, errlen))
        return false;
    if (role[1] && !d->unlabelled &&
        !resolve_path(spec, root, spec->path[1], role[1], d->label_where, sizeof d->label_where, err, errlen))
        return false;
    /* a dataset of several files had each file's labels checked as it was read, and
     * a file of tokens holds whole numbers */
    if (!readers[spec->kind](d, err, errlen))
        return false;
    if (spec->kind == DDP_DATA_TOKENS)
        return true;
    if (!d->nshards && !data_check_labels(d, err, errlen))
        return false;
    d->integral_labels = all_whole(d->labels, d->samples * d->label_elems);
    return true;
}

bool ddp_data_open(const ddp_dataset *spec, const char *root, ddp_data *d, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->spec = spec;
    bool ok;
    if (spec->kind == DDP_DATA_SYNTHETIC) {
        ok = open_synthetic(d, err, errlen);
        d->integral_labels = true;
    } else if (spec->kind >= DDP_DATA_IDX && spec->kind < DDP_DATA_SYNTHETIC) {
        ok = read_files(spec, root, d, err, errlen);
    } else {
        snprintf(err, errlen,
                 "the dataset `%s` is of an unknown kind (%lld): build the program again with "
                 "the matching ddpc",
                 spec->name ? spec->name : "", (long long)spec->kind);
        ok = false;
    }
    if (!ok)
        ddp_data_free(d);
    return ok;
}

void ddp_data_held(const ddp_data *d, int64_t *mapped, int64_t *in_memory) {
    int64_t sample = is_synthetic(d) ? 0 : d->elems * data_elem_size[d->elem];
    *mapped = 0;
    *in_memory = d->labels ? d->samples * d->label_elems * (int64_t)sizeof *d->labels : 0;
    for (int64_t i = 0; i < d->nshards; i++) {
        int64_t end = i + 1 < d->nshards ? d->shards[i + 1].first : d->samples;
        *(d->shards[i].mapping ? mapped : in_memory) += (end - d->shards[i].first) * sample;
    }
    if (!d->nshards)
        *(d->mapping ? mapped : in_memory) += d->samples * sample;
}

int64_t ddp_data_asked_ahead(const ddp_data *d) {
    int64_t sample = is_synthetic(d) ? 0 : d->elems * data_elem_size[d->elem], bytes = 0;
    for (int64_t i = 0; i < d->nshards; i++) {
        int64_t end = i + 1 < d->nshards ? d->shards[i + 1].first : d->samples;
        bytes += d->shards[i].mapping && !d->shards[i].read_ahead ? (end - d->shards[i].first) * sample : 0;
    }
    return d->nshards ? bytes : d->mapping && !d->read_ahead ? d->samples * sample : 0;
}

void ddp_data_free(ddp_data *d) {
    data_free_inputs(d);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

/* ---------------------------------------------------------------- labels */

/* position: of the sample's label, where it has a class at each of the output's rows */
static int64_t synthetic_class(const ddp_data *d, int64_t sample, int64_t position) {
    uint32_t w[4];
    ddp_draw(0, DDP_STREAM_DATA + 1, (uint64_t)sample, (uint32_t)position, 0, w);
    return (int64_t)(ddp_uniform53(w) * (double)d->spec->classes);
}

static double label_value(const ddp_data *d, int64_t sample, int64_t j) {
    if (is_synthetic(d))
        return (double)synthetic_class(d, sample, j);
    if (d->unlabelled) /* any value will do: no figure is reported */
        return 0;
    if (d->spec->kind == DDP_DATA_TOKENS) { /* the token after input j */
        int64_t at = sample * d->label_elems + j + 1;
        return d->elem == DDP_ELEM_U8 ? ((const uint8_t *)d->inputs)[at]
               : d->elem == DDP_ELEM_U16 ? ((const uint16_t *)d->inputs)[at] : ((const uint32_t *)d->inputs)[at];
    }
    return d->labels[sample * d->label_elems + j];
}

/* Class-index labels (one a row of classes) become one-hot rows when the loss wants a
 * distribution. */
static bool one_hot(const ddp_data *d, const ddp_program *p) {
    return p->label_dtype != DDP_I32 && p->settings.loss == DDP_LOSS_CATEGORICAL &&
           (is_synthetic(d) || d->label_elems == p->label_positions) && p->output_elems > p->label_positions;
}

/* The shard of a dataset of several files that holds sample: the last whose first
 * sample is at or before it. */
static const ddp_data_shard *shard_of(const ddp_data *d, int64_t sample) {
    int64_t lo = 0, hi = d->nshards - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (d->shards[mid].first <= sample)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &d->shards[lo];
}

/* Whether some label falls outside [lo, hi] or, with whole, is not a whole number; what
 * then says which: the first such sample (its index in *file, the file that holds it),
 * or a synthetic dataset's classes (which its samples may happen not to show, but
 * could). */
static bool label_outside(const ddp_data *d, double lo, double hi, bool whole, char *what, size_t len,
                          const char **file) {
    *file = labels_file(d);
    if (is_synthetic(d)) {
        int64_t classes = d->spec->classes;
        if ((double)(classes - 1) <= hi)
            return false;
        snprintf(what, len, "it has %lld classes (0..%lld)", (long long)classes, (long long)(classes - 1));
        return true;
    }
    if (d->spec->kind == DDP_DATA_TOKENS) /* checked in parts: tokens_fit */
        return false;
    for (int64_t i = 0; i < d->samples * d->label_elems; i++) {
        double v = d->labels[i];
        if (v < lo || v > hi || (whole && v != floor(v))) {
            int64_t sample = i / d->label_elems;
            if (d->nshards) {
                const ddp_data_shard *shard = shard_of(d, sample);
                *file = shard->label_path;
                sample -= shard->first;
            }
            if (d->label_elems == 1)
                snprintf(what, len, "sample %lld has the label %.17g", (long long)sample, v);
            else
                snprintf(what, len, "sample %lld has the label value %.17g (value %lld of its label)",
                         (long long)sample, v, (long long)(i % d->label_elems));
            return true;
        }
    }
    return false;
}

static const char *loss_name(int64_t loss) {
    static const char *const names[] = {"sparse_categorical_crossentropy", "categorical_crossentropy",
                                        "binary_crossentropy", "mean_squared_error"};
    return loss >= 0 && loss < 4 ? names[loss] : "the loss";
}

/* Labels are class indices (one_hot: made one-hot as batches are assembled). */
static bool class_labels(const ddp_data *d, const ddp_program *p) {
    return p->label_dtype == DDP_I32 || one_hot(d, p);
}

/* The message for a label outside the loss's range, what saying which (label_outside's
 * words) and file where. */
static bool label_range_fail(const ddp_data *d, const ddp_program *p, const char *file, const char *what, char *err,
                             size_t errlen) {
    if (!class_labels(d, p))
        return data_fail(err, errlen, file,
                         "%s, but binary_crossentropy needs targets in [0, 1]; rescale the labels or use "
                         "mean_squared_error",
                         what);
    char shape[64], outputs[96];
    int64_t positions = p->label_positions, classes = p->output_elems / positions;
    ddp_shape_text(shape, sizeof shape, p->output_shape, (int)p->output_rank);
    if (positions == 1)
        snprintf(outputs, sizeof outputs, "has %lld outputs", (long long)classes);
    else
        snprintf(outputs, sizeof outputs, "outputs %s", shape);
    return data_fail(err, errlen, file,
                     "%s, but the model `%s` %s, so class indices run 0..%lld; give its last layer one unit "
                     "per class",
                     what, p->name ? p->name : "", outputs, (long long)(classes - 1));
}

static bool class_indices_fit(const ddp_data *d, const ddp_program *p, char *err, size_t errlen) {
    char what[160], shape[64];
    const char *file;
    int64_t positions = p->label_positions, classes = p->output_elems / positions;
    ddp_shape_text(shape, sizeof shape, p->output_shape, (int)p->output_rank);
    if (d->label_elems != positions && !is_synthetic(d)) {
        if (positions == 1)
            return data_fail(err, errlen, labels_file(d),
                             "holds %lld values per label, but %s wants one class index per sample; use "
                             "categorical_crossentropy for one-hot or probability labels",
                             (long long)d->label_elems, loss_name(p->settings.loss));
        return data_fail(err, errlen, labels_file(d),
                         "holds %lld class %s a sample, but the model `%s` outputs %s, a class at each of %lld "
                         "positions; give the labels as (samples, %lld) class indices",
                         (long long)d->label_elems, d->label_elems == 1 ? "index" : "indices", p->name ? p->name : "",
                         shape, (long long)positions, (long long)positions);
    }
    return !label_outside(d, 0, (double)(classes - 1), true, what, sizeof what, &file) ||
           label_range_fail(d, p, file, what, err, errlen);
}

static bool label_count_fits(const ddp_data *d, const ddp_program *p, char *err, size_t errlen) {
    if (d->label_elems == p->output_elems)
        return true;
    return data_fail(
        err, errlen, labels_file(d),
        "its labels have %lld value%s per sample, but the model `%s` has %lld output%s and %s "
        "compares them one to one; give the model's last layer as many units as a label has values",
        (long long)d->label_elems, d->label_elems == 1 ? "" : "s", p->name ? p->name : "",
        (long long)p->output_elems, p->output_elems == 1 ? "" : "s", loss_name(p->settings.loss));
}

static bool labels_fit(const ddp_data *d, const ddp_program *p, char *err, size_t errlen) {
    if (class_labels(d, p))
        return class_indices_fit(d, p, err, errlen);
    if (!label_count_fits(d, p, err, errlen))
        return false;
    char what[160];
    const char *file;
    return p->settings.loss != DDP_LOSS_BINARY || !label_outside(d, 0, 1, false, what, sizeof what, &file) ||
           label_range_fail(d, p, file, what, err, errlen);
}

/* The window [height, width] the dataset's first augmentation makes of each sample
 * where it changes their size (random_crop(size = ...), random_resized_crop); false
 * where samples keep their size. */
static bool crop_window(const ddp_dataset *spec, int64_t window[2]) {
    const ddp_augment *a = spec->naugment ? &spec->augment[0] : NULL;
    if (!a || !((a->kind == DDP_AUGMENT_CROP && a->height) || a->kind == DDP_AUGMENT_RESIZED_CROP))
        return false;
    window[0] = a->height;
    window[1] = a->width;
    return true;
}

static bool resizes(const ddp_dataset *spec) {
    return spec->naugment && spec->augment[0].kind == DDP_AUGMENT_RESIZED_CROP;
}

/* Samples [h, w, ...] at least the window's size, of the model's pixels (validation
 * cuts the window from their centre, whatever training does). */
static bool window_fits(const ddp_data *d, const ddp_program *p, const int64_t window[2], char *err, size_t errlen) {
    int64_t want = model_input_elems(p), pixel = want / (window[0] * window[1]);
    if (d->rank >= 2 && d->shape[0] >= window[0] && d->shape[1] >= window[1] &&
        d->elems == d->shape[0] * d->shape[1] * pixel)
        return true;
    char ours[160], theirs[160];
    return data_fail(err, errlen, d->where,
                     "its samples are [%s], but %s(size = [%lld, %lld]) cuts the model `%s`'s [%s] from "
                     "each: they must be images of at least %lld x %lld pixels of %lld value%s",
                     ddp_dims_text(ours, sizeof ours, d->shape, d->rank, ", "),
                     resizes(d->spec) ? "random_resized_crop" : "random_crop", (long long)window[0],
                     (long long)window[1], p->name ? p->name : "",
                     ddp_dims_text(theirs, sizeof theirs, p->input_shape, (int)p->input_rank, ", "),
                     (long long)window[0], (long long)window[1], (long long)pixel, pixel == 1 ? "" : "s");
}

/* Where a sample's inputs are: in inputs, or in its shard's of a dataset of several
 * files. */
static const char *sample_inputs(const ddp_data *d, int64_t sample) {
    size_t bytes = (size_t)d->elems * (size_t)data_elem_size[d->elem];
    if (!d->nshards)
        return (const char *)d->inputs + (size_t)sample * bytes;
    const ddp_data_shard *shard = shard_of(d, sample);
    return (const char *)shard->inputs + (size_t)(sample - shard->first) * bytes;
}

/* Token indices (the inputs of a model whose embedding reads them) must be whole
 * numbers 0..vocab - 1: each of samples [begin, begin + size) is checked once here,
 * where a wrong one would otherwise look up nothing, silently. */
static bool indices_fit(const ddp_data *d, const ddp_program *p, int64_t begin, int64_t size, char *err,
                        size_t errlen) {
    if (!p->input_vocab || !size)
        return true;
    double *row = malloc(sizeof *row * (size_t)d->elems);
    if (!row)
        return data_fail(err, errlen, d->where, "out of memory for checking its token indices");
    for (int64_t s = begin; s < begin + size; s++) {
        converters[d->elem][1](row, sample_inputs(d, s), d->elems, d->spec->scale);
        for (int64_t e = 0; e < d->elems; e++) {
            double v = row[e];
            if (v >= 0 && v < (double)p->input_vocab && v == floor(v))
                continue;
            const char *file = d->where;
            int64_t sample = s;
            if (d->nshards) {
                const ddp_data_shard *shard = shard_of(d, s);
                file = shard->path;
                sample -= shard->first;
            }
            free(row);
            return data_fail(err, errlen, file,
                             "sample %lld holds %.17g at position %lld, but the model `%s` looks it up in an "
                             "embedding of token indices 0..%lld",
                             (long long)sample, v, (long long)e, p->name ? p->name : "",
                             (long long)(p->input_vocab - 1));
        }
    }
    free(row);
    return true;
}

/* A token file's tokens that samples [begin, begin + size) read (their inputs, and one
 * token further their labels) must lie below the embedding's vocab and, as labels,
 * below the classes (binary_crossentropy: below 2). A worker that finds one past them
 * reads the whole file for its largest token, which the message names, as it would
 * with one worker: only a run that fails pays for that. */
static bool tokens_fit(const ddp_data *d, const ddp_program *p, int64_t begin, int64_t size, char *err,
                       size_t errlen) {
    int64_t vocab = p->input_vocab, classes = 0, window = d->elems;
    if (class_labels(d, p))
        classes = p->output_elems / p->label_positions;
    else if (p->settings.loss == DDP_LOSS_BINARY)
        classes = 2;
    int64_t bound = !vocab ? classes : !classes ? vocab : vocab < classes ? vocab : classes;
    if (!bound || !size || data_largest_token(d, begin * window, size * window + 1) < bound)
        return true;
    int64_t most = data_largest_token(d, 0, d->samples * window + 1);
    if (vocab && most >= vocab)
        return data_fail(err, errlen, d->where,
                         "holds the token %lld, but the model `%s` looks tokens up in an embedding of token "
                         "indices 0..%lld; give the embedding a vocab of at least %lld",
                         (long long)most, p->name ? p->name : "", (long long)(vocab - 1), (long long)most + 1);
    char what[64];
    snprintf(what, sizeof what, "it holds the token %lld", (long long)most);
    return label_range_fail(d, p, d->where, what, err, errlen);
}

bool ddp_data_check_inputs(const ddp_data *d, const ddp_program *p, int64_t part, int64_t parts, char *err,
                           size_t errlen) {
    int64_t begin, size;
    ddp_shard_range(d->samples, parts, part, &begin, &size);
    if (is_synthetic(d))
        return true;
    if (d->spec->kind == DDP_DATA_TOKENS) /* whole numbers, and finite */
        return !p || tokens_fit(d, p, begin, size, err, errlen);
    return inputs_finite(d, begin, size, err, errlen) && (!p || indices_fit(d, p, begin, size, err, errlen));
}

bool ddp_data_fits(const ddp_data *d, const ddp_program *p, char *err, size_t errlen) {
    int64_t want = model_input_elems(p), window[2];
    if (!is_synthetic(d) && crop_window(d->spec, window)) {
        if (!window_fits(d, p, window, err, errlen))
            return false;
    } else if (!is_synthetic(d) && d->elems != want) {
        char ours[160], theirs[160];
        return data_fail(err, errlen, d->where,
                         "its samples are [%s] (%lld values), but the model `%s` takes [%s] (%lld values); "
                         "train the model on data of its input's shape or change its input",
                         ddp_dims_text(ours, sizeof ours, d->shape, d->rank, ", "), (long long)d->elems,
                         p->name ? p->name : "",
                         ddp_dims_text(theirs, sizeof theirs, p->input_shape, (int)p->input_rank, ", "),
                         (long long)want);
    }
    return d->unlabelled || labels_fit(d, p, err, errlen);
}

/* --------------------------------------------------------------- batches */

/* One draw per sample seeds a SplitMix64 sequence over its elements (runtime.h), far
 * cheaper than a draw per element, so a benchmark on synthetic data measures
 * training, not this. */
uint64_t ddp_synthetic_seed(int64_t sample) {
    uint32_t w[4];
    ddp_draw(0, DDP_STREAM_DATA, (uint64_t)sample, 0, 0, w);
    return (uint64_t)w[0] << 32 | w[1];
}

/* A sample's values in f32: ddp_synthetic_element's, as (z >> 40) - 2^23, a whole
 * number a float holds exactly, times 2^-23, which are the bits the double gives
 * rounded. A loop the compiler makes vector code of, in AVX2 where the CPU has it (each
 * 64-bit product three 32-bit ones): the loader's thread then takes 44 us, not 143, for
 * a batch of 64 images of 784 values, time it takes from training where it shares the
 * CPUs (two threads on two). */
static inline __attribute__((always_inline)) void synthetic_floats(uint64_t seed, int64_t per, float *row) {
    uint64_t at = seed;
    for (int64_t e = 0; e < per; e++) {
        at += 0x9E3779B97F4A7C15ull;
        uint64_t z = (at ^ (at >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        row[e] = (float)((int32_t)(z >> 40) - 8388608) * 0x1p-23f;
    }
}

static void synthetic_floats_baseline(uint64_t seed, int64_t per, float *row) {
    synthetic_floats(seed, per, row);
}

__attribute__((target("avx2"))) static void synthetic_floats_avx2(uint64_t seed, int64_t per, float *row) {
    synthetic_floats(seed, per, row);
}

void ddp_synthetic_floats(uint64_t sample_seed, int64_t per, float *row, bool avx2) {
    (avx2 ? synthetic_floats_avx2 : synthetic_floats_baseline)(sample_seed, per, row);
}

/* vocab > 0: token indices, the values in [-1, 1) stretched over 0..vocab - 1 */
static void synthetic_inputs(int64_t sample, int64_t per, bool f64, int64_t vocab, void *row) {
    uint64_t seed = ddp_synthetic_seed(sample);
    if (!f64 && !vocab) {
        ddp_synthetic_floats(seed, per, row, __builtin_cpu_supports("avx2"));
        return;
    }
    for (int64_t e = 0; e < per; e++) {
        double v = ddp_synthetic_element(seed, e);
        if (vocab)
            v = floor((v + 1) / 2 * (double)vocab);
        if (f64)
            ((double *)row)[e] = v;
        else
            ((float *)row)[e] = (float)v;
    }
}

static int ascending(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Two passes, the mean then the squares about it, so a large mean costs no digits. */
bool ddp_data_stats(const ddp_data *d, int64_t places, int64_t most, uint64_t seed, double *mean, double *std,
                    int64_t *used) {
    int64_t n = d->samples, use = n < most ? n : most;
    int64_t *order = malloc(sizeof *order * (size_t)(n ? n : 1));
    double *row = malloc(sizeof *row * (size_t)d->elems);
    if (!order || !row || is_synthetic(d)) {
        free(order);
        free(row);
        return false;
    }
    ddp_epoch_order(seed, 0, use < n, n, order);
    qsort(order, (size_t)use, sizeof *order, ascending); /* the file in its order */
    for (int64_t c = 0; c < places; c++)
        mean[c] = std[c] = 0;
    double count = (double)(use * (d->elems / places)); /* values at each place */
    for (int pass = 0; pass < 2; pass++) {
        double *sums = pass ? std : mean;
        for (int64_t i = 0; i < use; i++) {
            converters[d->elem][1](row, sample_inputs(d, order[i]), d->elems, d->spec->scale);
            for (int64_t e = 0, c = 0; e < d->elems; e++, c = c + 1 == places ? 0 : c + 1)
                sums[c] += pass ? (row[e] - mean[c]) * (row[e] - mean[c]) : row[e];
        }
        for (int64_t c = 0; c < places; c++)
            sums[c] = pass ? sqrt(sums[c] / count) : sums[c] / count;
    }
    *used = use;
    free(order);
    free(row);
    return true;
}

void ddp_data_prefetch(const ddp_data *d, const int64_t *indices, int64_t n) {
    if (!d->nshards && (!d->mapping || d->read_ahead))
        return; /* read, or read ahead whole: the usual case, and every batch asks */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), bytes = (uintptr_t)d->elems * data_elem_size[d->elem];
    for (int64_t r = 0; r < n; r++) {
        int64_t sample = ddp_entry_sample(indices[r], d->samples);
        const ddp_data_shard *shard = d->nshards ? shard_of(d, sample) : NULL;
        if (shard ? !shard->mapping || shard->read_ahead : !d->mapping || d->read_ahead)
            continue;
        uintptr_t start = (uintptr_t)sample_inputs(d, sample), first = start & ~(page - 1);
        madvise((void *)first, start + bytes - first, MADV_WILLNEED);
    }
}

/* ----------------------------------------------------------- normalisation */

/* (x - mean) / std for values [first, first + count) of a sample held as floats or
 * doubles (f64), each with the pair of its place along the last axis; computed in
 * double and rounded once. The pairs are laid out over a span of whole periods (up to
 * SPAN values) so that the loop over each span has no index to wrap, and vectorises. */
static inline double normalized64(double v, double mean, double std) {
    return (v - mean) / std;
}

static inline float normalized32(float v, double mean, double std) {
    return (float)(((double)v - mean) / std);
}

static void normalize_values(const ddp_dataset *spec, void *values, int64_t first, int64_t count, bool f64) {
    enum { SPAN = 64 };
    int64_t n = spec->nnormalize;
    if (!n)
        return;
    int64_t span = n <= SPAN ? SPAN / n * n : 1;
    double mean[SPAN], std[SPAN];
    for (int64_t e = 0; span > 1 && e < span; e++) {
        const ddp_channel *ch = &spec->normalize[(first + e) % n];
        mean[e] = ch->mean;
        std[e] = ch->std;
    }
    for (int64_t at = 0; at < count; at += span) {
        int64_t k = count - at < span ? count - at : span;
        if (span == 1) { /* more pairs than a span holds: one value at a time */
            const ddp_channel *ch = &spec->normalize[(first + at) % n];
            mean[0] = ch->mean;
            std[0] = ch->std;
        }
        if (f64) {
            double *v = (double *)values + at;
            for (int64_t e = 0; e < k; e++)
                v[e] = normalized64(v[e], mean[e], std[e]);
        } else {
            float *v = (float *)values + at;
            for (int64_t e = 0; e < k; e++)
                v[e] = normalized32(v[e], mean[e], std[e]);
        }
    }
}

/* Inputs in bf16 (precision = bf16): made f32 a piece at a time, as the f32 program
 * reads them (normalised too), then each rounded once to nearest even. from: the
 * values [first, first + per) of a sample, or NULL for a synthetic sample's. */
static void bf16_inputs(const ddp_data *d, int64_t sample, const char *from, int64_t first, int64_t per,
                        uint16_t *to) {
    enum { PIECE = 1024 };
    float piece[PIECE];
    size_t elem = (size_t)data_elem_size[d->elem];
    uint64_t seed = ddp_synthetic_seed(sample); /* a synthetic sample's values are one sequence */
    for (int64_t at = 0; at < per; at += PIECE) {
        int64_t count = per - at < PIECE ? per - at : PIECE;
        if (!from)
            for (int64_t e = 0; e < count; e++)
                piece[e] = (float)ddp_synthetic_element(seed, at + e);
        else
            converters[d->elem][0](piece, from + (size_t)at * elem, count, d->spec->scale);
        normalize_values(d->spec, piece, first + at, count, false);
        for (int64_t e = 0; e < count; e++)
            to[at + e] = ddp_bf16_from_float(piece[e]);
    }
}

/* ------------------------------------------------------------ augmentation */

/* Swaps n bytes at a and b (distinct places). */
static void swap_bytes(char *a, char *b, size_t n) {
    char t[256];
    for (size_t at = 0; at < n; at += sizeof t) {
        size_t k = n - at < sizeof t ? n - at : sizeof t;
        memcpy(t, a + at, k);
        memcpy(a + at, b + at, k);
        memcpy(b + at, t, k);
    }
}

/* An image's rows of w pixels of `pixel` bytes each, h of them; elements of elem
 * bytes (2: bf16), normalised as spec says. */
typedef struct Image {
    char *at;
    int64_t h, w;
    size_t pixel, elem;
    const ddp_dataset *spec;
} Image;

/* The padding over elements [first, first + count) of the image: zero as the file
 * holds it, normalised as every other value was ((0 - mean) / std in double, rounded
 * once to the element's type). */
static void pad_values(const Image *m, int64_t first, int64_t count) {
    char *at = m->at + (size_t)first * m->elem;
    int64_t n = m->spec->nnormalize;
    if (!n) {
        memset(at, 0, (size_t)count * m->elem);
        return;
    }
    for (int64_t e = 0, c = (first % n); e < count; e++, c = c + 1 == n ? 0 : c + 1) {
        double zero = (0.0 - m->spec->normalize[c].mean) / m->spec->normalize[c].std;
        float zero32 = (float)zero;
        if (m->elem == sizeof(double))
            memcpy(at + (size_t)e * m->elem, &zero, sizeof zero);
        else if (m->elem == sizeof(float))
            memcpy(at + (size_t)e * m->elem, &zero32, sizeof zero32);
        else
            ((uint16_t *)m->at)[first + e] = ddp_bf16_from_float(zero32);
    }
}

static char *pixel_at(const Image *m, int64_t y, int64_t x) {
    return m->at + ((size_t)y * (size_t)m->w + (size_t)x) * m->pixel;
}

/* Pixels [x0, x1) of row y as padding. Where the normalisation's pairs repeat with
 * every pixel (one pair, or one a channel), every pixel pads alike: the first is made,
 * the others copied from it, rather than a division for every value. */
static void pad_pixels(const Image *m, int64_t y, int64_t x0, int64_t x1) {
    int64_t per_pixel = (int64_t)(m->pixel / m->elem), n = m->spec->nnormalize;
    if (x1 <= x0)
        return;
    if (!n || per_pixel % n != 0) {
        pad_values(m, (y * m->w + x0) * per_pixel, (x1 - x0) * per_pixel);
        return;
    }
    pad_values(m, (y * m->w + x0) * per_pixel, per_pixel);
    const char *first = pixel_at(m, y, x0);
    for (int64_t x = x0 + 1; x < x1; x++)
        memcpy(pixel_at(m, y, x), first, m->pixel);
}

/* A row of w pixels of SIZE bytes mirrored: pixels x and w - 1 - x swapped for every x
 * of its left half, by copies of a size known here (moves, not calls). */
#define MIRROR_ROW(SIZE)                                                                                     \
    for (size_t x = 0, y = (size_t)m->w - 1; x < y; x++, y--) {                                             \
        char t[SIZE];                                                                                        \
        memcpy(t, row + x * (SIZE), SIZE);                                                                   \
        memcpy(row + x * (SIZE), row + y * (SIZE), SIZE);                                                    \
        memcpy(row + y * (SIZE), t, SIZE);                                                                   \
    }
static void reverse_pixels(const Image *m, char *row) {
    switch (m->pixel) { /* one channel of each type, and three (RGB) or four */
    case 2: MIRROR_ROW(2) break;
    case 4: MIRROR_ROW(4) break;
    case 6: MIRROR_ROW(6) break;
    case 8: MIRROR_ROW(8) break;
    case 12: MIRROR_ROW(12) break;
    case 16: MIRROR_ROW(16) break;
    case 24: MIRROR_ROW(24) break;
    case 32: MIRROR_ROW(32) break;
    default:
        for (size_t x = 0, y = (size_t)m->w - 1; x < y; x++, y--)
            swap_bytes(row + x * m->pixel, row + y * m->pixel, m->pixel);
    }
}
#undef MIRROR_ROW

static void flip_across(Image *m, bool horizontal) {
    if (horizontal)
        for (int64_t y = 0; y < m->h; y++)
            reverse_pixels(m, pixel_at(m, y, 0));
    else
        for (int64_t y = 0; y < m->h / 2; y++)
            swap_bytes(pixel_at(m, y, 0), pixel_at(m, m->h - 1 - y, 0), (size_t)m->w * m->pixel);
}

/* The image moved by (dy, dx) in place: pixel (y, x) becomes (y + dy, x + dx) of the
 * old one, padding where that is outside it. Rows are taken in the order that reads
 * each before it is overwritten (memmove within a row). */
static void shift_image(Image *m, int64_t dy, int64_t dx) {
    int64_t x0 = dx < 0 ? -dx : 0, x1 = dx > 0 ? m->w - dx : m->w; /* output columns with a source */
    for (int64_t k = 0; k < m->h; k++) {
        int64_t y = dy > 0 ? k : m->h - 1 - k, from = y + dy;
        if (from < 0 || from >= m->h || x1 <= x0) {
            pad_pixels(m, y, 0, m->w);
            continue;
        }
        memmove(pixel_at(m, y, x0), pixel_at(m, from, x0 + dx), (size_t)(x1 - x0) * m->pixel);
        pad_pixels(m, y, 0, x0);
        pad_pixels(m, y, x1, m->w);
    }
}

/* The square of size x size pixels from (y0, x0), clipped to the image, as padding. */
static void cut_out(Image *m, int64_t y0, int64_t x0, int64_t size) {
    int64_t x1 = x0 + size < m->w ? x0 + size : m->w;
    for (int64_t y = y0 < 0 ? 0 : y0; y < y0 + size && y < m->h; y++)
        pad_pixels(m, y, x0 < 0 ? 0 : x0, x1);
}

/* ------------------------------------------------------------ colour */

double ddp_data_top(const ddp_data *d) {
    static const double largest[DDP_ELEM_COUNT] = {
        [DDP_ELEM_U8] = 255, [DDP_ELEM_I8] = 127, [DDP_ELEM_U16] = 65535, [DDP_ELEM_I16] = 32767,
        [DDP_ELEM_U32] = 4294967295.0, [DDP_ELEM_I32] = 2147483647.0, [DDP_ELEM_U64] = 18446744073709551615.0,
        [DDP_ELEM_I64] = 9223372036854775807.0};
    if (is_synthetic(d) || largest[d->elem] == 0)
        return 1;
    return largest[d->elem] * d->spec->scale;
}

/* The order is one of the 24 permutations of the four changes (element 0's first
 * words), as torchvision's ColorJitter draws a permutation and skips the changes it
 * was not given; the factors come from elements 1 and 2, two words each. */
void ddp_color_draw(const ddp_augment *a, const ddp_draw_key *key, int64_t place, int64_t sample, ddp_color *out) {
    const double spread[4] = {a->brightness, a->contrast, a->saturation, a->hue};
    uint32_t w[3][4];
    for (uint32_t e = 0; e < 3; e++)
        ddp_augment_draws(key, place, sample, e, w[e]);
    int left[4] = {0, 1, 2, 3}, order[4];
    int64_t perm = ddp_draw_below(w[0], 24);
    for (int k = 0, n = 4; k < 4; k++, n--) { /* perm's digits in bases 4, 3, 2, 1 pick from what is left */
        int at = (int)(perm % n);
        perm /= n;
        order[k] = left[at];
        memmove(left + at, left + at + 1, sizeof(int) * (size_t)(n - 1 - at));
    }
    out->count = 0;
    for (int k = 0; k < 4; k++) {
        int change = order[k];
        if (spread[change] <= 0)
            continue;
        double u = ddp_uniform53(&w[1 + change / 2][2 * (change % 2)]);
        double lo = change == DDP_COLOR_HUE ? -spread[change] : fmax(0, 1 - spread[change]);
        double hi = change == DDP_COLOR_HUE ? spread[change] : 1 + spread[change];
        out->change[out->count] = change;
        out->factor[out->count++] = lo + u * (hi - lo);
    }
}

/* v in [0, top], in the form of SSE's maxsd and minsd: no branch on the data */
static double clip(double v, double top) {
    v = v > 0 ? v : 0;
    return v < top ? v : top;
}

static double grey(const double *rgb) {
    return 0.2989 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
}

/* torchvision's _rgb2hsv, _hsv2rgb between them, on values in [0, top] taken to [0,
 * 1] (per_top: 1 / top) and back. Its divisions by the same divisor are a division and
 * products here (within an ulp or two of its values); its fmod and floors, of numbers
 * known to lie within a turn of [0, 1), are the same subtractions and truncations. */
static void turn_hue(double *rgb, double shift, double top, double per_top) {
    double r = rgb[0] * per_top, g = rgb[1] * per_top, b = rgb[2] * per_top;
    double maxc = r > g ? (r > b ? r : b) : (g > b ? g : b), minc = r < g ? (r < b ? r : b) : (g < b ? g : b);
    double cr = maxc - minc;
    bool same = maxc == minc;
    double s = cr / (same ? 1 : maxc), per = 1 / (same ? 1 : cr);
    double rc = (maxc - r) * per, gc = (maxc - g) * per, bc = (maxc - b) * per;
    double h = maxc == r ? bc - gc : maxc == g ? 2.0 + rc - bc : 4.0 + gc - rc;
    h = h * (1 / 6.0) + 1.0; /* in [5/6, 11/6] */
    h = (h >= 1 ? h - 1 : h) + shift;
    h = h < 0 ? h + 1 : h >= 1 ? h - 1 : h; /* Python's % 1.0 */
    double i = (double)(int)(h * 6.0), f = h * 6.0 - i, v = maxc;
    double p = clip(v * (1.0 - s), 1), q = clip(v * (1.0 - s * f), 1), t = clip(v * (1.0 - s * (1.0 - f)), 1);
    /* torchvision's choice of (v, q, p, t) for each channel in each sixth of the
     * circle, by index rather than by branch: a photograph's hues are no pattern */
    static const unsigned char pick[6][3] = {{0, 3, 2}, {1, 0, 2}, {2, 0, 3}, {2, 1, 0}, {3, 2, 0}, {0, 2, 1}};
    const double vqpt[4] = {v, q, p, t};
    const unsigned char *sixth = pick[(int)i % 6];
    for (int c = 0; c < 3; c++)
        rgb[c] = vqpt[sixth[c]] * top;
}

void ddp_color_image(const ddp_color *color, double *values, int64_t pixels, int64_t channels, double top) {
    int64_t n = pixels * channels;
    for (int k = 0; k < color->count; k++) {
        double f = color->factor[k];
        switch (color->change[k]) {
        case DDP_COLOR_BRIGHTNESS:
            for (int64_t e = 0; e < n; e++)
                values[e] = clip(f * values[e], top);
            break;
        case DDP_COLOR_CONTRAST: {
            double sum = 0;
            for (int64_t x = 0; x < pixels; x++)
                sum += channels == 3 ? grey(values + 3 * x) : values[x];
            double mean = sum / (double)pixels;
            for (int64_t e = 0; e < n; e++)
                values[e] = clip(f * values[e] + (1 - f) * mean, top);
            break;
        }
        case DDP_COLOR_GREY:
            for (int64_t x = 0; channels == 3 && x < pixels; x++) {
                double *rgb = values + 3 * x;
                rgb[0] = rgb[1] = rgb[2] = grey(rgb);
            }
            break;
        case DDP_COLOR_SATURATION:
            for (int64_t x = 0; channels == 3 && x < pixels; x++) {
                double *rgb = values + 3 * x, g = grey(rgb);
                for (int c = 0; c < 3; c++)
                    rgb[c] = clip(f * rgb[c] + (1 - f) * g, top);
            }
            break;
        case DDP_COLOR_HUE:
            for (int64_t x = 0; channels == 3 && x < pixels; x++)
                turn_hue(values + 3 * x, f, top, 1 / top);
        }
    }
}

/* Element e of the image, at place c of its normalisation, with the normalisation
 * undone, in double. */
static double raw_value(const Image *m, int64_t e, int64_t c) {
    double held = m->elem == sizeof(double) ? ((const double *)m->at)[e]
                  : m->elem == sizeof(float) ? ((const float *)m->at)[e]
                                             : ddp_bf16_to_float(((const uint16_t *)m->at)[e]);
    return m->spec->nnormalize ? held * m->spec->normalize[c].std + m->spec->normalize[c].mean : held;
}

/* The image's values with their normalisation undone, in double. */
static void raw_values(const Image *m, int64_t n, double *v) {
    int64_t pairs = m->spec->nnormalize;
    for (int64_t e = 0, c = 0; e < n; e++, c = c + 1 == pairs ? 0 : c + 1)
        v[e] = raw_value(m, e, c);
}

/* Element e from at as the image's type holds v: itself in f64, rounded once to f32 or
 * bf16. */
static void put_value(const Image *m, char *at, int64_t e, double v) {
    if (m->elem == sizeof(double))
        ((double *)at)[e] = v;
    else if (m->elem == sizeof(float))
        ((float *)at)[e] = (float)v;
    else
        ((uint16_t *)at)[e] = ddp_bf16_from_float((float)v);
}

/* A value after scale as any input is made of it, normalised by place c's pair: in
 * double for f64, else rounded to f32 and normalised from that (put_value rounds that
 * to bf16 where bf16). */
static double as_input(const Image *m, int64_t c, double v) {
    const ddp_channel *pair = m->spec->nnormalize ? &m->spec->normalize[c] : NULL;
    if (m->elem == sizeof(double))
        return pair ? normalized64(v, pair->mean, pair->std) : v;
    return pair ? normalized32((float)v, pair->mean, pair->std) : (float)v;
}

/* v back into the image, as any input is made of it. */
static void store_raw_values(const Image *m, int64_t n, const double *v) {
    int64_t pairs = m->spec->nnormalize;
    for (int64_t e = 0, c = 0; e < n; e++, c = c + 1 == pairs ? 0 : c + 1)
        put_value(m, m->at, e, as_input(m, c, v[e]));
}

/* random_color on the image, in double (its room, as big as the image, is the one
 * allocation of an augmentation: glibc then keeps it at hand for the next sample). */
static void change_colors(Image *m, const ddp_color *color, double top) {
    int64_t channels = (int64_t)(m->pixel / m->elem), n = m->h * m->w * channels;
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) {
        fprintf(stderr, "ddp: out of memory changing the colours of a sample of %lld values\n", (long long)n);
        abort();
    }
    raw_values(m, n, v);
    ddp_color_image(color, v, m->h * m->w, channels, top);
    store_raw_values(m, n, v);
    free(v);
}

/* trivial_augment's, rand_augment's or auto_augment's operations on the image: its
 * values after scale as bytes of [0, top] (where torchvision's versions work: a byte
 * file's own, with scale 1 / 255 or any other), the operations made on them, and the
 * bytes back as values: each of the 256 normalised once for each place of the
 * normalisation, as any input is made (in double for f64, else from f32), then looked
 * up. */
static void change_bytes(Image *m, const ddp_image_op *ops, int count, bool bilinear, double top) {
    int64_t channels = (int64_t)(m->pixel / m->elem), n = m->h * m->w * channels;
    int64_t pairs = m->spec->nnormalize, places = pairs ? pairs : 1;
    unsigned char *bytes = malloc(2 * (size_t)n);
    double *table = malloc(sizeof(double) * 256 * (size_t)places);
    if (!bytes || !table) {
        fprintf(stderr, "ddp: out of memory changing a sample of %lld values\n", (long long)n);
        abort();
    }
    double to_byte = 255 / top;
    for (int64_t e = 0, c = 0; e < n; e++, c = c + 1 == pairs ? 0 : c + 1)
        bytes[e] = (unsigned char)(clip(raw_value(m, e, c) * to_byte, 255) + 0.5); /* the nearest byte */
    for (int k = 0; k < count; k++)
        ddp_image_op_apply(&ops[k], bilinear, bytes, m->h, m->w, channels, bytes + n);
    for (int64_t c = 0; c < places; c++)
        for (int b = 0; b < 256; b++)
            table[c * 256 + b] = as_input(m, c, b * (top / 255));
    for (int64_t e = 0, c = 0; e < n; e++, c = c + 1 == pairs ? 0 : c + 1)
        put_value(m, m->at, e, table[c * 256 + bytes[e]]);
    free(table);
    free(bytes);
}

/* A batch row as the model's image: [h, w] or [h, w, ...] (the rest one pixel). */
static Image row_image(const ddp_dataset *spec, const ddp_program *p, size_t elem_size, void *row) {
    Image m = {row, p->input_shape[0], p->input_rank > 1 ? p->input_shape[1] : 1, elem_size, elem_size, spec};
    for (int d = 2; d < p->input_rank; d++)
        m.pixel *= (size_t)p->input_shape[d];
    return m;
}

static bool is_mixing(const ddp_augment *a) {
    return a->kind == DDP_AUGMENT_MIXUP || a->kind == DDP_AUGMENT_CUTMIX;
}

/* ------------------------------------------------------------ erasing */

/* random_erasing's draws for a sample: element 0 whether it erases, elements 1 .. 10
 * its tries' area and shape, 11 the box's place, and from ERASE_VALUES on one a
 * random value. */
enum { ERASE_TRIES = 10, ERASE_PLACE = 1 + ERASE_TRIES, ERASE_VALUES };

bool ddp_erase_box(const ddp_augment *a, const ddp_draw_key *key, int64_t place, int64_t sample, int64_t h,
                   int64_t w, int64_t box[4]) {
    uint32_t d[4];
    ddp_augment_draws(key, place, sample, 0, d);
    if (!(ddp_uniform53(d) < a->probability))
        return false;
    double area = (double)h * (double)w, log_lo = log(a->ratio_min), log_hi = log(a->ratio_max);
    for (uint32_t k = 0; k < ERASE_TRIES; k++) {
        ddp_augment_draws(key, place, sample, 1 + k, d);
        double erased = area * (a->scale_min + ddp_uniform53(d) * (a->scale_max - a->scale_min));
        double aspect = exp(log_lo + ddp_uniform53(d + 2) * (log_hi - log_lo)); /* height / width, as torchvision */
        int64_t bh = llrint(sqrt(erased * aspect)), bw = llrint(sqrt(erased / aspect)); /* Python's round */
        if (!(bh < h && bw < w))
            continue;
        ddp_augment_draws(key, place, sample, ERASE_PLACE, d);
        box[0] = ddp_draw_below(d, h - bh + 1);
        box[1] = ddp_draw_below(d + 2, w - bw + 1);
        box[2] = box[0] + bh;
        box[3] = box[1] + bw;
        return true;
    }
    return false;
}

/* The box's values set to 0 (every type's zero bits; the normalised mean, as
 * torchvision's RandomErasing after Normalize) or to standard normal draws. */
static void erase_box(const Image *m, const int64_t box[4], const ddp_augment *a, const ddp_draw_key *key,
                      int64_t place, int64_t sample) {
    int64_t count = (box[3] - box[1]) * (int64_t)(m->pixel / m->elem);
    uint32_t element = ERASE_VALUES;
    for (int64_t y = box[0]; y < box[2]; y++) {
        char *at = pixel_at(m, y, box[1]);
        if (a->mode == DDP_ERASE_ZERO) {
            memset(at, 0, (size_t)count * m->elem);
            continue;
        }
        for (int64_t e = 0; e < count; e++) {
            uint32_t d[4];
            ddp_augment_draws(key, place, sample, element++, d);
            put_value(m, at, e, ddp_normal(d));
        }
    }
}

void ddp_augment_sample(const ddp_dataset *spec, const ddp_program *p, size_t elem_size, const ddp_draw_key *key,
                        int64_t sample, double top, void *row) {
    Image m = row_image(spec, p, elem_size, row);
    for (int64_t i = 0; i < spec->naugment; i++) {
        const ddp_augment *a = &spec->augment[i];
        uint32_t w[4];
        if ((a->kind == DDP_AUGMENT_CROP && a->height) || a->kind == DDP_AUGMENT_RESIZED_CROP || is_mixing(a))
            continue; /* cut, or mixed, as the batch is assembled (batch_inputs) */
        if (a->kind == DDP_AUGMENT_COLOR) {
            ddp_color color;
            ddp_color_draw(a, key, i, sample, &color);
            change_colors(&m, &color, top);
            continue;
        }
        if (a->kind == DDP_AUGMENT_TRIVIAL || a->kind == DDP_AUGMENT_RAND || a->kind == DDP_AUGMENT_AUTO) {
            ddp_image_op ops[DDP_MOST_IMAGE_OPS];
            int count = ddp_auto_augment_draw(a, key, i, sample, m.h, m.w, ops), changes = 0;
            for (int k = 0; k < count; k++)
                changes += ops[k].op != DDP_OP_IDENTITY;
            if (changes) /* the identity alone leaves a float file's values as they are */
                change_bytes(&m, ops, count, a->mode == DDP_INTERPOLATION_BILINEAR, top);
            continue;
        }
        if (a->kind == DDP_AUGMENT_ERASING) {
            int64_t box[4];
            if (ddp_erase_box(a, key, i, sample, m.h, m.w, box))
                erase_box(&m, box, a, key, i, sample);
            continue;
        }
        ddp_augment_draws(key, i, sample, 0, w);
        if (a->kind == DDP_AUGMENT_GRAYSCALE) {
            if (ddp_uniform53(w) < a->probability)
                change_colors(&m, &(ddp_color){.count = 1, .change = {DDP_COLOR_GREY}}, top);
            continue;
        }
        if (a->kind == DDP_AUGMENT_FLIP) {
            if (a->mode != DDP_FLIP_VERTICAL && (w[0] & 1))
                flip_across(&m, true);
            if (a->mode != DDP_FLIP_HORIZONTAL && (w[1] & 1))
                flip_across(&m, false);
        } else if (a->kind == DDP_AUGMENT_CROP) {
            int64_t places = 2 * a->padding + 1;
            shift_image(&m, ddp_draw_below(w, places) - a->padding, ddp_draw_below(w + 2, places) - a->padding);
        } else {
            cut_out(&m, ddp_draw_below(w, m.h) - a->size / 2, ddp_draw_below(w + 2, m.w) - a->size / 2, a->size);
        }
    }
}

/* -------------------------------------------------------------- mixing */

/* Whether the dataset's augmentations end in mixing ones (the compiler keeps them last). */
static bool mixes_samples(const ddp_dataset *spec) {
    return spec->naugment && is_mixing(&spec->augment[spec->naugment - 1]);
}

/* A Gamma(alpha, 1) draw by Marsaglia and Tsang's method (2000), below alpha 1 from
 * Gamma(alpha + 1) times U^(1 / alpha), each try taking augmentation i's next draws
 * for the sample from *element on (a try fails with probability below 5%). */
static double gamma_draw(const ddp_draw_key *key, int64_t i, int64_t sample, uint32_t *element, double alpha) {
    uint32_t w[4];
    double boost = 1;
    if (alpha < 1) {
        ddp_augment_draws(key, i, sample, (*element)++, w);
        boost = pow(ddp_uniform53(w), 1 / alpha);
        alpha += 1;
    }
    double d = alpha - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (int tries = 0; tries < 64; tries++) {
        ddp_augment_draws(key, i, sample, (*element)++, w);
        double x = ddp_normal(w), v = 1 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        ddp_augment_draws(key, i, sample, (*element)++, w);
        if (log(ddp_uniform53(w)) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * boost;
    }
    return d * boost; /* 64 failures in a row: never seen */
}

/* The first mixing augmentation's first draws choose among them (the list's last
 * ones) and the other sample; the chosen one's draws give its share, from Beta(alpha,
 * alpha) as two Gamma draws (from element 2 on), and a cutmix's box centre (element
 * 1): torchvision's CutMix, a box of the image's sides times sqrt(1 - share), clipped,
 * whose area then sets the share. */
void ddp_mix_draw(const ddp_dataset *spec, const ddp_program *p, int64_t samples, const ddp_draw_key *key,
                  int64_t sample, ddp_mix *mix) {
    int64_t first = spec->naugment;
    while (first > 0 && is_mixing(&spec->augment[first - 1]))
        first--;
    uint32_t w[4], element = 2;
    ddp_augment_draws(key, first, sample, 0, w);
    int64_t chosen = first + ddp_draw_below(w, spec->naugment - first);
    const ddp_augment *a = &spec->augment[chosen];
    mix->partner = ddp_draw_below(w + 2, samples);
    double g1 = gamma_draw(key, chosen, sample, &element, a->alpha);
    double g2 = gamma_draw(key, chosen, sample, &element, a->alpha);
    mix->share = g1 + g2 > 0 ? g1 / (g1 + g2) : 0.5;
    mix->cut = a->kind == DDP_AUGMENT_CUTMIX;
    if (!mix->cut)
        return;
    int64_t h = p->input_shape[0], wd = p->input_shape[1];
    ddp_augment_draws(key, chosen, sample, 1, w);
    int64_t cy = ddp_draw_below(w, h), cx = ddp_draw_below(w + 2, wd);
    double r = 0.5 * sqrt(1 - mix->share);
    int64_t half_h = (int64_t)(r * (double)h), half_w = (int64_t)(r * (double)wd);
    mix->box[0] = cy - half_h > 0 ? cy - half_h : 0;
    mix->box[1] = cx - half_w > 0 ? cx - half_w : 0;
    mix->box[2] = cy + half_h < h ? cy + half_h : h;
    mix->box[3] = cx + half_w < wd ? cx + half_w : wd;
    mix->share = 1 - (double)((mix->box[2] - mix->box[0]) * (mix->box[3] - mix->box[1])) / (double)(h * wd);
}

/* ------------------------------------------------------------ byte tables */

/* Normalised 8-bit inputs (images, mostly) take their values from a table of what each
 * of the 256 bytes becomes at each place along the last axis that has a pair of its
 * own: made by the very conversion and normalisation every other input goes through,
 * so the same bits, without a division by std for every value of every batch. */
enum { TABLE_PLACES = 16 };

typedef struct ByteTable {
    int64_t places;             /* the normalisation's pairs */
    size_t elem;                /* 2 (bf16), 4 or 8 bytes a value */
    union {
        uint16_t bf16[TABLE_PLACES * 256];
        float f32[TABLE_PLACES * 256];
        double f64[TABLE_PLACES * 256];
    } value;                    /* [place][byte] */
} ByteTable;

/* False where the inputs are not normalised bytes, or have too many pairs for a table
 * (an unnormalised byte's conversion is a product, which vectorises: no table). */
static bool byte_table(const ddp_data *d, bool f64, bool bf16, ByteTable *t) {
    int64_t places = d->spec->nnormalize;
    if (is_synthetic(d) || (d->elem != DDP_ELEM_U8 && d->elem != DDP_ELEM_I8) || !places || places > TABLE_PLACES)
        return false;
    unsigned char bytes[256];
    float scaled32[256];
    double scaled64[256];
    for (int b = 0; b < 256; b++)
        bytes[b] = (unsigned char)b;
    converters[d->elem][0](scaled32, bytes, 256, d->spec->scale);
    converters[d->elem][1](scaled64, bytes, 256, d->spec->scale);
    t->places = places;
    t->elem = bf16 ? sizeof(uint16_t) : f64 ? sizeof(double) : sizeof(float);
    for (int64_t c = 0; c < places; c++) {
        const ddp_channel *pair = &d->spec->normalize[c];
        for (int b = 0; b < 256; b++) {
            size_t at = (size_t)(c * 256 + b);
            if (f64)
                t->value.f64[at] = normalized64(scaled64[b], pair->mean, pair->std);
            else if (bf16)
                t->value.bf16[at] = ddp_bf16_from_float(normalized32(scaled32[b], pair->mean, pair->std));
            else
                t->value.f32[at] = normalized32(scaled32[b], pair->mean, pair->std);
        }
    }
    return true;
}

/* A sample's per bytes as t makes them: pixels of 1 or 3 places unrolled (grey, RGB),
 * any other count place by place. */
#define LOOK_UP(T, table)                                                                                    \
    do {                                                                                                     \
        T *to = row;                                                                                         \
        const T *v = table;                                                                                  \
        if (t->places == 1)                                                                                  \
            for (int64_t e = 0; e < per; e++)                                                                \
                to[e] = v[bytes[e]];                                                                         \
        else if (t->places == 3 && per % 3 == 0)                                                             \
            for (int64_t e = 0; e < per; e += 3) {                                                           \
                to[e] = v[bytes[e]];                                                                         \
                to[e + 1] = v[256 + bytes[e + 1]];                                                           \
                to[e + 2] = v[512 + bytes[e + 2]];                                                           \
            }                                                                                                \
        else                                                                                                 \
            for (int64_t e = 0, c = 0; e < per; e++, c = c + 1 == t->places ? 0 : c + 1)                    \
                to[e] = v[c * 256 + bytes[e]];                                                               \
    } while (0)
static void look_up_bytes(const ByteTable *t, const unsigned char *bytes, int64_t per, void *row) {
    if (t->elem == sizeof(uint16_t))
        LOOK_UP(uint16_t, t->value.bf16);
    else if (t->elem == sizeof(float))
        LOOK_UP(float, t->value.f32);
    else
        LOOK_UP(double, t->value.f64);
}
#undef LOOK_UP

/* ------------------------------------------------------------------ batches */

/* How a batch's values are made from a file's: a table of normalised bytes, bf16, or
 * a conversion then the normalisation. */
typedef struct Making {
    const ddp_data *d;
    const ByteTable *table;   /* NULL: none */
    bool f64, bf16;
    convert_fn convert;
} Making;

/* count values of a sample from `from` on (the first at place `first` of its last
 * axis) into `to`, as the batch holds them. */
static void make_values(const Making *mk, int64_t sample, const char *from, int64_t first, int64_t count,
                        void *to) {
    if (mk->table)
        look_up_bytes(mk->table, (const unsigned char *)from, count, to);
    else if (mk->bf16)
        bf16_inputs(mk->d, sample, from, first, count, to);
    else {
        mk->convert(to, from, count, mk->d->spec->scale);
        normalize_values(mk->d->spec, to, first, count, mk->f64);
    }
}

/* The window of the model's size that random_crop(size = ...) cuts from a sample, with
 * its top left at (oy, ox) of the sample (negative, or past its edge, within the
 * crop's padding: padded), into the row. A row of the window is one run of values. */
static void crop_sample(const Making *mk, int64_t sample, int64_t oy, int64_t ox, Image *m) {
    const ddp_data *d = mk->d;
    int64_t h0 = d->shape[0], w0 = d->shape[1], per_pixel = d->elems / (h0 * w0);
    size_t elem = (size_t)data_elem_size[d->elem];
    const char *from = sample_inputs(d, sample);
    int64_t x0 = ox < 0 ? -ox : 0, x1 = w0 - ox < m->w ? w0 - ox : m->w; /* columns with a source */
    for (int64_t y = 0; y < m->h; y++) {
        int64_t sy = oy + y;
        if (sy < 0 || sy >= h0 || x1 <= x0) {
            pad_pixels(m, y, 0, m->w);
            continue;
        }
        make_values(mk, sample, from + (size_t)((sy * w0 + ox + x0) * per_pixel) * elem, 0, (x1 - x0) * per_pixel,
                    pixel_at(m, y, x0));
        pad_pixels(m, y, 0, x0);
        pad_pixels(m, y, x1, m->w);
    }
}

/* Where a sample's window starts: in training at a place drawn as random_crop's
 * (among the places of the sample padded by its padding), in validation at the centre. */
static void window_place(const ddp_data *d, const int64_t window[2], const ddp_draw_key *augment, int64_t sample,
                         int64_t *oy, int64_t *ox) {
    int64_t pad = d->spec->augment[0].padding;
    if (!augment) {
        *oy = (d->shape[0] - window[0]) / 2;
        *ox = (d->shape[1] - window[1]) / 2;
        return;
    }
    uint32_t w[4];
    ddp_augment_draws(augment, 0, sample, 0, w);
    *oy = ddp_draw_below(w, d->shape[0] + 2 * pad - window[0] + 1) - pad;
    *ox = ddp_draw_below(w + 2, d->shape[1] + 2 * pad - window[1] + 1) - pad;
}

/* random_resized_crop's window, as torchvision's RandomResizedCrop draws it: up to ten
 * tries (draw t: element t of the augmentation's stream) of an area, a uniform share
 * of the sample's in [scale_min, scale_max] (words 0 and 1), and an aspect ratio
 * log-uniform in [ratio_min, ratio_max] (words 2 and 3), whose sides rounded to whole
 * pixels (half to even) fit the sample; then a uniform place for it (element
 * RESIZED_TRIES). Where no try fits, the sample's centre, as large as the ratios allow. */
enum { RESIZED_TRIES = 10 };

void ddp_resized_window(const ddp_augment *a, int64_t height, int64_t width, const ddp_draw_key *key,
                        int64_t sample, int64_t window[4]) {
    double area = (double)height * (double)width, log_lo = log(a->ratio_min), log_hi = log(a->ratio_max);
    uint32_t w[4];
    for (uint32_t t = 0; t < RESIZED_TRIES; t++) {
        ddp_augment_draws(key, 0, sample, t, w);
        double target = area * (a->scale_min + ddp_uniform53(w) * (a->scale_max - a->scale_min));
        double ratio = exp(log_lo + ddp_uniform53(w + 2) * (log_hi - log_lo));
        int64_t h = llrint(sqrt(target / ratio)), wd = llrint(sqrt(target * ratio));
        if (h > 0 && h <= height && wd > 0 && wd <= width) {
            ddp_augment_draws(key, 0, sample, RESIZED_TRIES, w);
            window[0] = ddp_draw_below(w, height - h + 1);
            window[1] = ddp_draw_below(w + 2, width - wd + 1);
            window[2] = h;
            window[3] = wd;
            return;
        }
    }
    double own = (double)width / (double)height;
    int64_t h = height, wd = width;
    if (own < a->ratio_min)
        h = llrint((double)width / a->ratio_min);
    else if (own > a->ratio_max)
        wd = llrint((double)height * a->ratio_max);
    h = h < 1 ? 1 : h; /* a pixel at least, however extreme the ratio */
    wd = wd < 1 ? 1 : wd;
    window[0] = (height - h) / 2;
    window[1] = (width - wd) / 2;
    window[2] = h;
    window[3] = wd;
}

/* What resizing the windows of a batch's samples needs: the taps of each side, an
 * input row as floats, the first pass's rows, and an output row. */
typedef struct Resizing {
    ddp_taps rows, cols;
    float *line, *mid, *out;
} Resizing;

static void resizing_free(Resizing *rs) {
    ddp_taps_free(&rs->rows);
    ddp_taps_free(&rs->cols);
    free(rs->line);
    free(rs->mid);
    free(rs->out);
}

/* Room to resize windows of d's samples to m's size. A batch has no way to fail: out
 * of memory, the process ends, saying where. */
static void resizing_init(Resizing *rs, const ddp_data *d, const Image *m) {
    int64_t h0 = d->shape[0], w0 = d->shape[1], pixel = d->elems / (h0 * w0), len = m->w * pixel;
    bool ok = ddp_taps_init(&rs->rows, m->h, ddp_taps_span(h0, m->h));
    ok = ddp_taps_init(&rs->cols, m->w, ddp_taps_span(w0, m->w)) && ok;
    rs->line = malloc((size_t)(w0 * pixel) * sizeof(float));
    rs->mid = malloc((size_t)(h0 * len) * sizeof(float));
    rs->out = malloc((size_t)len * sizeof(float));
    if (!ok || !rs->line || !rs->mid || !rs->out) {
        fprintf(stderr, "ddp: out of memory resizing %s's samples to %lld x %lld\n", d->where, (long long)m->h,
                (long long)m->w);
        abort();
    }
}

/* The values of a float row into the image's row y, in its element type. */
static void store_row(const float *from, int64_t count, const Image *m, int64_t y) {
    char *to = pixel_at(m, y, 0);
    if (m->elem == sizeof(float))
        memcpy(to, from, (size_t)count * sizeof(float));
    else if (m->elem == sizeof(double))
        for (int64_t e = 0; e < count; e++)
            ((double *)to)[e] = from[e];
    else
        for (int64_t e = 0; e < count; e++)
            ((uint16_t *)to)[e] = ddp_bf16_from_float(from[e]);
}

/* The window {y, x, height, width} of a sample resized to the image m (resample.c),
 * from its values scaled as floats; normalised after, as every other input is. */
static void resize_sample(const ddp_data *d, Resizing *rs, int64_t sample, const int64_t window[4], Image *m) {
    int64_t w0 = d->shape[1], pixel = d->elems / (d->shape[0] * w0), len = m->w * pixel;
    size_t elem = (size_t)data_elem_size[d->elem];
    const char *from = sample_inputs(d, sample);
    ddp_taps_set(&rs->rows, window[0], window[2], m->h, 0);
    ddp_taps_set(&rs->cols, window[1], window[3], m->w, 0);
    int64_t y0 = rs->rows.first[0], y1 = rs->rows.first[m->h - 1] + rs->rows.n[m->h - 1];
    int64_t x0 = rs->cols.first[0], x1 = rs->cols.first[m->w - 1] + rs->cols.n[m->w - 1];
    for (int64_t y = y0; y < y1; y++) {
        converters[d->elem][0](rs->line, from + (size_t)((y * w0 + x0) * pixel) * elem, (x1 - x0) * pixel,
                               d->spec->scale);
        ddp_resample_row(&rs->cols, rs->line, x0, pixel, rs->mid + (y - y0) * len);
    }
    for (int64_t y = 0; y < m->h; y++) {
        ddp_resample_column(&rs->rows, y, rs->mid, y0, len, rs->out);
        normalize_values(d->spec, rs->out, 0, len, false);
        store_row(rs->out, len, m, y);
    }
}

/* What makes a batch's rows: the dataset's values, cut or resized where its first
 * augmentation says, normalised and augmented (augment: training's draws; NULL in
 * validation), each row a sample's whatever the others. */
typedef struct RowMaker {
    const ddp_data *d;
    const ddp_program *p;
    const ddp_draw_key *augment;
    Making mk;
    Resizing rs;
    int64_t per, window[2];
    size_t elem;
    bool cropped, resized;
} RowMaker;

static void row_maker_init(RowMaker *rm, const ddp_data *d, const ddp_program *p, const ddp_draw_key *augment,
                           ByteTable *table, void *row) {
    bool f64 = p->dtype == DDP_F64, bf16 = ddp_input_dtype(p) == DDP_BF16;
    *rm = (RowMaker){.d = d, .p = p, .augment = augment,
                     .mk = {d, NULL, f64, bf16, bf16 || is_synthetic(d) ? NULL : converters[d->elem][f64]},
                     .per = model_input_elems(p),
                     .elem = bf16 ? sizeof(uint16_t) : f64 ? sizeof(double) : sizeof(float)};
    if (table && byte_table(d, f64, bf16, table))
        rm->mk.table = table;
    rm->cropped = !is_synthetic(d) && crop_window(d->spec, rm->window);
    rm->resized = rm->cropped && augment && resizes(d->spec); /* validation cuts the centre */
    if (rm->resized) {
        Image m = row_image(d->spec, p, rm->elem, row);
        resizing_init(&rm->rs, d, &m);
    }
}

/* The sample of order entry `entry` into row, as the model receives it but for any
 * mixing; its draws are the entry's (a repeated sample's copies differ). */
static void make_row(RowMaker *rm, int64_t entry, char *row) {
    const ddp_data *d = rm->d;
    const ddp_program *p = rm->p;
    int64_t sample = ddp_entry_sample(entry, d->samples); /* read; its draws keyed by the entry */
    if (rm->resized) {
        Image m = row_image(d->spec, p, rm->elem, row);
        int64_t window[4];
        ddp_resized_window(&d->spec->augment[0], d->shape[0], d->shape[1], rm->augment, entry, window);
        resize_sample(d, &rm->rs, sample, window, &m);
    } else if (rm->cropped) {
        Image m = row_image(d->spec, p, rm->elem, row);
        int64_t oy, ox;
        window_place(d, rm->window, rm->augment, entry, &oy, &ox);
        crop_sample(&rm->mk, sample, oy, ox, &m);
    } else if (is_synthetic(d) && rm->mk.bf16) {
        bf16_inputs(d, sample, NULL, 0, rm->per, (uint16_t *)row);
    } else if (is_synthetic(d)) {
        synthetic_inputs(sample, rm->per, rm->mk.f64, p->input_vocab, row);
    } else {
        make_values(&rm->mk, sample, sample_inputs(d, sample), 0, rm->per, row);
    }
    if (rm->augment && d->spec->naugment)
        ddp_augment_sample(d->spec, p, rm->elem, rm->augment, entry, ddp_data_top(d), row);
}

/* The other sample's row mixed into row: its box's pixels (cutmix), or every value in
 * the shares (mixup), summed in double and rounded once to the row's type. */
static void mix_rows(const RowMaker *rm, const ddp_mix *mix, char *row, const char *other) {
    Image m = row_image(rm->d->spec, rm->p, rm->elem, row);
    if (mix->cut) {
        for (int64_t y = mix->box[0]; y < mix->box[2]; y++) {
            char *to = pixel_at(&m, y, mix->box[1]);
            memcpy(to, other + (to - row), (size_t)(mix->box[3] - mix->box[1]) * m.pixel);
        }
        return;
    }
    double a = mix->share, b = 1 - mix->share;
    for (int64_t e = 0; e < rm->per; e++)
        if (rm->mk.f64)
            ((double *)row)[e] = a * ((double *)row)[e] + b * ((const double *)other)[e];
        else if (rm->mk.bf16)
            ((uint16_t *)row)[e] = ddp_bf16_from_float((float)(a * ddp_bf16_to_float(((uint16_t *)row)[e]) +
                                                               b * ddp_bf16_to_float(((const uint16_t *)other)[e])));
        else
            ((float *)row)[e] = (float)(a * ((float *)row)[e] + b * ((const float *)other)[e]);
}

/* A loader's allocation failing where the batch has nowhere to go but the step. */
static void *batch_alloc(const ddp_data *d, size_t bytes, const char *what) {
    void *m = malloc(bytes ? bytes : 1);
    if (!m) {
        fprintf(stderr, "ddp: out of memory %s %s's samples\n", what, d->where);
        abort();
    }
    return m;
}

/* mixes: each row's mixing (random_mixup, random_cutmix), or NULL for none */
static void batch_inputs(const ddp_data *d, const ddp_program *p, const int64_t *indices, int64_t n,
                         const ddp_draw_key *augment, const ddp_mix *mixes, void *x) {
    ByteTable *table = malloc(sizeof *table); /* 32 KiB: not on a loader thread's stack */
    RowMaker rm;
    row_maker_init(&rm, d, p, augment, table, x);
    size_t row_bytes = (size_t)rm.per * rm.elem;
    char *other = mixes ? batch_alloc(d, row_bytes, "mixing") : NULL;
    for (int64_t r = 0; r < n; r++) {
        char *row = (char *)x + (size_t)r * row_bytes;
        make_row(&rm, indices[r], row);
        if (mixes) {
            make_row(&rm, mixes[r].partner, other);
            mix_rows(&rm, &mixes[r], row, other);
        }
    }
    free(other);
    resizing_free(&rm.rs);
    free(table);
}

/* A sample's label of k values: its class indices as one-hot rows (positions of them),
 * or the file's values. */
static void label_row(const ddp_data *d, bool hot, int64_t positions, int64_t sample, int64_t k, double *out) {
    int64_t classes = k / positions;
    for (int64_t j = 0; j < k; j++)
        out[j] = hot ? (double)(j % classes == (int64_t)label_value(d, sample, j / classes))
                     : label_value(d, sample, j);
}

/* mixes: as batch_inputs's, which mix label rows in the inputs' shares */
static void batch_labels(const ddp_data *d, const ddp_program *p, const int64_t *indices, int64_t n,
                         const ddp_mix *mixes, void *y) {
    if (p->label_dtype == DDP_I32) { /* class indices: the compiler refuses mixing them */
        int64_t positions = p->label_positions;
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < positions; j++)
                ((int32_t *)y)[r * positions + j] =
                    (int32_t)label_value(d, ddp_entry_sample(indices[r], d->samples), j);
        return;
    }
    int64_t k = p->output_elems;
    bool hot = one_hot(d, p), f64 = p->label_dtype == DDP_F64;
    double *own = batch_alloc(d, sizeof(double) * (size_t)(2 * k), "labelling"), *other = own + k;
    for (int64_t r = 0; r < n; r++) {
        label_row(d, hot, p->label_positions, ddp_entry_sample(indices[r], d->samples), k, own);
        if (mixes) {
            label_row(d, hot, p->label_positions, mixes[r].partner, k, other);
            for (int64_t j = 0; j < k; j++)
                own[j] = mixes[r].share * own[j] + (1 - mixes[r].share) * other[j];
        }
        for (int64_t j = 0; j < k; j++)
            if (f64)
                ((double *)y)[r * k + j] = own[j];
            else
                ((float *)y)[r * k + j] = (float)own[j];
    }
    free(own);
}

void ddp_data_batch(const ddp_data *d, const ddp_program *p, const int64_t *indices, int64_t n,
                    const ddp_draw_key *augment, void *x, void *y, int64_t *ids) {
    ddp_mix *mixes = NULL; /* drawn once for the inputs and the labels */
    if (augment && mixes_samples(d->spec) && (x || y)) {
        mixes = batch_alloc(d, sizeof *mixes * (size_t)n, "mixing");
        for (int64_t r = 0; r < n; r++)
            ddp_mix_draw(d->spec, p, d->samples, augment, indices[r], &mixes[r]);
    }
    if (x)
        batch_inputs(d, p, indices, n, augment, mixes, x);
    if (y)
        batch_labels(d, p, indices, n, mixes, y);
    if (ids)
        memcpy(ids, indices, (size_t)n * sizeof *ids);
    free(mixes);
}
