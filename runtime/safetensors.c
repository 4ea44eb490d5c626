/* safetensors.c: parameters to and from safetensors files, the format PyTorch, JAX
 * and Hugging Face read: 8 bytes of header length (little-endian), a JSON header
 * naming each tensor's dtype, shape and byte range, then the raw little-endian data.
 *
 * Saving replaces the target whole (files.c), so a crash leaves the old file or the
 * new one, never half of one. Loading checks every tensor by name, dtype and shape
 * before anything is copied. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

/* ------------------------------------------------------------------ save */

/* s as a JSON string's contents: quotes, backslashes and control characters escaped. */
static void json_escaped(ddp_text *t, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            ddp_text_printf(t, "\\%c", c);
        else if (c < 0x20)
            ddp_text_printf(t, "\\u%04x", c);
        else
            ddp_text_printf(t, "%c", c);
    }
}

static ddp_text header_for(const ddp_meta *meta, int nmeta, const ddp_tensor_out *t, int64_t n) {
    ddp_text h = {0};
    int64_t offset = 0;
    ddp_text_printf(&h, "{\"__metadata__\":{");
    for (int i = 0; i < nmeta; i++) {
        ddp_text_printf(&h, "%s\"", i ? "," : "");
        json_escaped(&h, meta[i].key);
        ddp_text_printf(&h, "\":\"");
        json_escaped(&h, meta[i].value);
        ddp_text_printf(&h, "\"");
    }
    ddp_text_printf(&h, "}");
    for (int64_t i = 0; i < n; i++) {
        ddp_text_printf(&h, ",\"");
        json_escaped(&h, t[i].name);
        ddp_text_printf(&h, "\":{\"dtype\":\"%s\",\"shape\":[", t[i].dtype);
        for (int d = 0; d < t[i].rank; d++)
            ddp_text_printf(&h, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        ddp_text_printf(&h, "],\"data_offsets\":[%lld,%lld]}", (long long)offset, (long long)(offset + t[i].bytes));
        offset += t[i].bytes;
    }
    ddp_text_printf(&h, "}");
    while (!h.failed && h.len % 8) /* the data starts 8-byte aligned */
        ddp_text_printf(&h, " ");
    return h;
}

bool ddp_tensors_write(const char *path, const ddp_meta *meta, int nmeta, const ddp_tensor_out *t, int64_t n,
                       bool durable, char *err, size_t errlen) {
    ddp_text header = header_for(meta, nmeta, t, n);
    if (header.failed) {
        free(header.s);
        return ddp_fail(err, errlen, "%s: out of memory writing the header", path);
    }
    ddp_replacement w;
    if (!ddp_replace_open(&w, path, err, errlen)) {
        free(header.s);
        return false;
    }
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)header.len >> (8 * i));
    fwrite(len, 1, 8, w.f);
    fwrite(header.s, 1, header.len, w.f);
    for (int64_t i = 0; i < n; i++)
        fwrite(t[i].data, 1, (size_t)t[i].bytes, w.f);
    free(header.s);
    return ddp_replace_commit(&w, durable, err, errlen);
}

const char *ddp_dtype_name(const ddp_program *p) {
    return p->dtype == DDP_F64 ? "F64" : "F32";
}

/* The program's parameters and statistics, by name, as tensors: *n of them (malloc'd). */
ddp_tensor_out *ddp_param_tensors(ddp_runtime *rt, int64_t *n) {
    const ddp_program *p = rt->program;
    ddp_tensor_out *t = calloc((size_t)p->nparams + 1, sizeof *t);
    for (int64_t i = 0; t && i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        t[i] = (ddp_tensor_out){q->name, ddp_dtype_name(p), (int)q->rank, {0},
                                (const char *)rt->region[q->region] + q->offset * rt->elem_size,
                                q->count * rt->elem_size};
        memcpy(t[i].shape, q->shape, sizeof q->shape);
    }
    *n = p->nparams;
    return t;
}

/* "name:layout,..." for the metadata (malloc'd text). */
ddp_text ddp_layouts_text(const ddp_program *p) {
    ddp_text t = {0};
    for (int64_t i = 0; i < p->nparams; i++)
        ddp_text_printf(&t, "%s%s:%s", i ? "," : "", p->params[i].name, p->params[i].layout);
    return t;
}

bool ddp_save_params(ddp_runtime *rt, const char *path, const ddp_meta *extra, int nextra, char *err,
                     size_t errlen) {
    const ddp_program *p = rt->program;
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)p->hash);
    int64_t n;
    ddp_tensor_out *t = ddp_param_tensors(rt, &n);
    ddp_text layouts = ddp_layouts_text(p);
    bool ok = t && !layouts.failed;
    if (ok) {
        ddp_meta meta[8] = {{"format", "ddp"}, {"model", p->name}, {"program_hash", hash},
                            {"layouts", layouts.s ? layouts.s : ""}};
        for (int i = 0; i < nextra && i < 4; i++)
            meta[4 + i] = extra[i];
        ok = ddp_tensors_write(path, meta, 4 + (nextra < 4 ? nextra : 4), t, n, false, err, errlen);
    } else {
        ddp_fail(err, errlen, "%s: out of memory", path);
    }
    free(t);
    free(layouts.s);
    return ok;
}

/* ------------------------------------------------------------------ JSON */

/* Just enough JSON for a safetensors header: objects, arrays, strings, integers. */
typedef struct Json {
    const char *s, *end;
    bool bad;
} Json;

static void skip_space(Json *j) {
    while (j->s < j->end && (*j->s == ' ' || *j->s == '\t' || *j->s == '\n' || *j->s == '\r'))
        j->s++;
}

static bool accept(Json *j, char c) {
    skip_space(j);
    if (j->s < j->end && *j->s == c) {
        j->s++;
        return true;
    }
    return false;
}

static void expect(Json *j, char c) {
    if (!accept(j, c))
        j->bad = true;
}

/* A string into out (truncated to outlen - 1 bytes); \u escapes outside ASCII become '?'. */
static void json_string(Json *j, char *out, size_t outlen) {
    size_t n = 0;
    expect(j, '"');
    while (!j->bad && j->s < j->end && *j->s != '"') {
        char c = *j->s++;
        if (c == '\\' && j->s < j->end) {
            char e = *j->s++;
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e;
            if (e == 'u') {
                unsigned v = 0;
                for (int k = 0; k < 4 && j->s < j->end; k++, j->s++)
                    v = v * 16 + (unsigned)(*j->s <= '9' ? *j->s - '0' : (*j->s | 32) - 'a' + 10);
                c = v < 128 ? (char)v : '?';
            }
        }
        if (n + 1 < outlen)
            out[n++] = c;
    }
    if (outlen)
        out[n] = 0;
    if (!accept(j, '"'))
        j->bad = true;
}

/* A whole number of at least 0, its digits read only up to the header's end: strtoll
 * would read on into the tensors' bytes, or past the end of a file cut short. */
static int64_t json_integer(Json *j) {
    skip_space(j);
    const char *start = j->s;
    int64_t v = 0;
    for (; j->s < j->end && *j->s >= '0' && *j->s <= '9'; j->s++) {
        int digit = *j->s - '0';
        if (v > (INT64_MAX - digit) / 10)
            j->bad = true;
        else
            v = v * 10 + digit;
    }
    if (j->s == start)
        j->bad = true;
    return v;
}

/* Calls member for each key of an object, the reader at the key's value. */
typedef void (*MemberFn)(Json *j, const char *key, void *ctx);

static void json_object(Json *j, MemberFn member, void *ctx) {
    expect(j, '{');
    if (accept(j, '}'))
        return;
    do {
        char key[256];
        json_string(j, key, sizeof key);
        expect(j, ':');
        if (!j->bad)
            member(j, key, ctx);
    } while (!j->bad && accept(j, ','));
    expect(j, '}');
}

/* Calls item for each element of an array, the reader at the element. */
typedef void (*ItemFn)(Json *j, void *ctx);

static void json_array(Json *j, ItemFn item, void *ctx) {
    expect(j, '[');
    if (accept(j, ']'))
        return;
    do
        item(j, ctx);
    while (!j->bad && accept(j, ','));
    expect(j, ']');
}

static void skip_value(Json *j, void *depth);

static void skip_member(Json *j, const char *key, void *depth) {
    (void)key;
    skip_value(j, depth);
}

/* Any value, nested at most 32 deep; depth counts through the pointer's value. */
static void skip_value(Json *j, void *depth) {
    skip_space(j);
    intptr_t d = (intptr_t)depth;
    if (d > 32 || j->s >= j->end) {
        j->bad = true;
        return;
    }
    if (*j->s == '"') {
        char ignored[1];
        json_string(j, ignored, sizeof ignored);
    } else if (*j->s == '{') {
        json_object(j, skip_member, (void *)(d + 1));
    } else if (*j->s == '[') {
        json_array(j, skip_value, (void *)(d + 1));
    } else {
        while (j->s < j->end && !strchr(",}] \t\r\n", *j->s))
            j->s++;
    }
}

/* ------------------------------------------------------------------ load */

typedef struct Integers {
    int64_t n, v[8];
} Integers;

static void integer_item(Json *j, void *ctx) {
    Integers *list = ctx;
    int64_t x = json_integer(j);
    if (list->n < 8)
        list->v[list->n] = x;
    list->n++;
}

static void tensor_member(Json *j, const char *key, void *ctx) {
    ddp_tensor_in *e = ctx;
    Integers list = {0};
    if (strcmp(key, "dtype") == 0) {
        json_string(j, e->dtype, sizeof e->dtype);
    } else if (strcmp(key, "shape") == 0) {
        json_array(j, integer_item, &list);
        j->bad |= list.n > 8;
        e->rank = list.n;
        memcpy(e->shape, list.v, sizeof list.v);
    } else if (strcmp(key, "data_offsets") == 0) {
        json_array(j, integer_item, &list);
        j->bad |= list.n != 2;
        e->begin = list.v[0];
        e->end = list.v[1];
    } else {
        skip_value(j, 0);
    }
}

/* An array of size-byte items with room for one more (moved, perhaps), or NULL when
 * memory ran out (the array as it was). */
static void *room_for_one(void *items, int64_t *cap, int64_t count, size_t size) {
    if (count < *cap)
        return items;
    int64_t more = *cap ? 2 * *cap : 16;
    void *grown = realloc(items, size * (size_t)more);
    if (grown)
        *cap = more;
    return grown;
}

static void metadata_member(Json *j, const char *key, void *ctx) {
    ddp_tensor_file *f = ctx;
    size_t room = (size_t)(j->end - j->s) + 1;
    char *value = malloc(room), *k = strdup(key);
    ddp_meta *meta = room_for_one(f->meta, &f->meta_cap, f->nmeta, sizeof *meta);
    if (meta)
        f->meta = meta;
    if (!value || !k || !meta) {
        free(value);
        free(k);
        f->out_of_memory = j->bad = true;
        return;
    }
    json_string(j, value, room);
    f->meta[f->nmeta++] = (ddp_meta){k, value};
}

static void header_member(Json *j, const char *key, void *ctx) {
    ddp_tensor_file *f = ctx;
    if (strcmp(key, "__metadata__") == 0) {
        json_object(j, metadata_member, f);
        return;
    }
    ddp_tensor_in *tensors = room_for_one(f->tensors, &f->cap, f->count, sizeof *tensors);
    if (!tensors) {
        f->out_of_memory = j->bad = true;
        return;
    }
    f->tensors = tensors;
    ddp_tensor_in *e = &f->tensors[f->count++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", key);
    json_object(j, tensor_member, e);
}

static int dtype_bytes(const char *dtype);

bool ddp_tensors_parse(ddp_tensor_file *f, unsigned char *bytes, size_t len, const char *path, char *err,
                       size_t errlen) {
    memset(f, 0, sizeof *f);
    f->bytes = bytes;
    f->len = len;
    uint64_t header_len = 0;
    for (int i = 7; len >= 8 && i >= 0; i--)
        header_len = header_len << 8 | bytes[i];
    if (len < 8 || header_len > len - 8)
        return ddp_fail(err, errlen, "%s: not a safetensors file (%s)", path,
                        len < 8 ? "shorter than its 8-byte header length"
                                : "its header length is beyond the end of the file");
    Json j = {(const char *)bytes + 8, (const char *)bytes + 8 + header_len, false};
    json_object(&j, header_member, f);
    skip_space(&j);
    if (j.bad || j.s != j.end)
        return ddp_fail(err, errlen, f->out_of_memory ? "%s: out of memory reading its header"
                                    : "%s: not a safetensors file: its header is not the JSON the format wants", path);
    f->data = bytes + 8 + header_len;
    f->data_len = len - 8 - header_len;
    for (int64_t i = 0; i < f->count; i++) {
        const ddp_tensor_in *e = &f->tensors[i];
        int size = dtype_bytes(e->dtype);
        int64_t bytes = size;
        bool too_many = false;
        for (int64_t d = 0; d < e->rank; d++)
            too_many |= __builtin_mul_overflow(bytes, e->shape[d], &bytes);
        if (e->begin > e->end || (uint64_t)e->end > f->data_len || (size && (too_many || e->end - e->begin != bytes)))
            return ddp_fail(err, errlen, "%s: tensor `%s` has byte range [%lld, %lld), which does not fit its shape "
                                         "and the file's %zu bytes of data: the file is damaged",
                            path, e->name, (long long)e->begin, (long long)e->end, f->data_len);
    }
    return true;
}

void ddp_tensors_free(ddp_tensor_file *f) {
    for (int64_t i = 0; i < f->nmeta; i++) {
        free((char *)f->meta[i].key);
        free((char *)f->meta[i].value);
    }
    free(f->meta);
    free(f->tensors);
    free(f->bytes);
    memset(f, 0, sizeof *f);
}

const ddp_tensor_in *ddp_tensors_find(const ddp_tensor_file *f, const char *name) {
    for (int64_t i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *ddp_tensors_meta(const ddp_tensor_file *f, const char *key) {
    for (int64_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}

static int dtype_bytes(const char *dtype) {
    return strcmp(dtype, "F64") == 0 ? 8 : strcmp(dtype, "F32") == 0 ? 4
         : strcmp(dtype, "F16") == 0 || strcmp(dtype, "BF16") == 0 ? 2 : 0;
}

/* Element i of little-endian data of a safetensors dtype. */
static double element(const unsigned char *data, const char *dtype, int64_t i) {
    int size = dtype_bytes(dtype);
    uint64_t bits = 0;
    for (int b = size - 1; b >= 0; b--)
        bits = bits << 8 | data[i * size + b];
    if (size == 8) {
        double d;
        memcpy(&d, &bits, 8);
        return d;
    }
    if (size == 4 || dtype[0] == 'B') {
        uint32_t w = size == 4 ? (uint32_t)bits : (uint32_t)bits << 16;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    return ddp_half_to_double((uint16_t)bits);
}

/* A checkpoint's tensors beyond the model's own: the optimizer's state and the other
 * workers' statistics and figures, which --load leaves aside. */
static bool checkpoint_only(const ddp_tensor_file *f, const char *name) {
    const char *format = ddp_tensors_meta(f, "format");
    return format && strcmp(format, "ddp-checkpoint") == 0 &&
           (strncmp(name, "optimizer.", 10) == 0 || strncmp(name, "worker.", 7) == 0);
}

/* Every tensor of the program is in the file with its shape and a float dtype; and the
 * file has no tensor the program lacks. */
static bool check_entries(const ddp_program *p, const ddp_tensor_file *f, const char *path, char *err,
                          size_t errlen) {
    for (int64_t i = 0; i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        const ddp_tensor_in *e = ddp_tensors_find(f, q->name);
        if (!e)
            return ddp_fail(err, errlen, "%s: has no tensor `%s`: it was saved from another model (it holds %lld "
                                     "tensors, this model has %lld)",
                        path, q->name, (long long)f->count, (long long)p->nparams);
        char want[128], got[128];
        ddp_shape_text(want, sizeof want, q->shape, (int)(q->rank));
        ddp_shape_text(got, sizeof got, e->shape, (int)(e->rank));
        if (strcmp(want, got) != 0)
            return ddp_fail(err, errlen, "%s: tensor `%s` is %s, and this model's is %s", path, q->name, got, want);
        if (!dtype_bytes(e->dtype))
            return ddp_fail(err, errlen, "%s: tensor `%s` is %s; parameters load from F32, F64, F16 or BF16", path,
                        q->name, e->dtype);
    }
    for (int64_t i = 0; i < f->count; i++) {
        bool known = checkpoint_only(f, f->tensors[i].name);
        for (int64_t k = 0; k < p->nparams && !known; k++)
            known = strcmp(p->params[k].name, f->tensors[i].name) == 0;
        if (!known)
            return ddp_fail(err, errlen, "%s: holds tensor `%s`, which this model does not have: it was saved from "
                                     "another model", path, f->tensors[i].name);
    }
    return true;
}

/* A tensor's elements into count values of the program's dtype at dst. */
void ddp_tensor_values(const ddp_tensor_file *f, const ddp_tensor_in *e, bool f64, void *dst, int64_t count) {
    for (int64_t k = 0; k < count; k++) {
        double v = element(f->data + e->begin, e->dtype, k);
        if (f64)
            ((double *)dst)[k] = v;
        else
            ((float *)dst)[k] = (float)v;
    }
}

static bool read_whole(const char *path, unsigned char **data, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return ddp_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 20, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t got = 1; buf && got > 0;) {
        if (n == cap) {
            unsigned char *grown = realloc(buf, cap *= 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    }
    bool failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        return ddp_fail(err, errlen, "%s: cannot read: %s", path, buf ? strerror(errno) : "out of memory");
    }
    *data = buf;
    *len = n;
    return true;
}

bool ddp_tensors_read(const char *path, ddp_tensor_file *f, char *err, size_t errlen) {
    unsigned char *bytes = NULL;
    size_t len = 0;
    memset(f, 0, sizeof *f);
    return read_whole(path, &bytes, &len, err, errlen) && ddp_tensors_parse(f, bytes, len, path, err, errlen);
}

bool ddp_load_params(ddp_runtime *rt, const char *path, char *note, size_t notelen, char *err, size_t errlen) {
    const ddp_program *p = rt->program;
    ddp_tensor_file f;
    if (notelen)
        note[0] = 0;
    bool ok = ddp_tensors_read(path, &f, err, errlen) && check_entries(p, &f, path, err, errlen);
    for (int64_t i = 0; ok && i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        ddp_tensor_values(&f, ddp_tensors_find(&f, q->name), p->dtype == DDP_F64,
                          (char *)rt->region[q->region] + q->offset * rt->elem_size, q->count);
    }
    /* ema's average: a checkpoint's own (so that --evaluate of it gives its run's
     * figures), else the parameters loaded */
    const ddp_tensor_in *average =
        ok && ddp_average(rt) && checkpoint_only(&f, "optimizer.average") ? ddp_tensors_find(&f, "optimizer.average")
                                                                           : NULL;
    if (average && average->rank == 1 && average->shape[0] == p->param_count && dtype_bytes(average->dtype))
        ddp_tensor_values(&f, average, p->dtype == DDP_F64, ddp_average(rt), p->param_count);
    else if (ok)
        ddp_start_average(rt);
    char mine[32];
    const char *hash = ok ? ddp_tensors_meta(&f, "program_hash") : NULL;
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)p->hash);
    if (hash && hash[0] && strcmp(hash, mine) != 0 && notelen)
        snprintf(note, notelen, "%s was saved by program %s, and this is %s; its tensors fit by name and shape",
                 path, hash, mine);
    ddp_tensors_free(&f);
    return ok;
}
