/* safetensors.c: parameters to and from safetensors files, the format PyTorch, JAX
 * and Hugging Face read: 8 bytes of header length (little-endian), a JSON header
 * naming each tensor's dtype, shape and byte range, then the raw little-endian data.
 *
 * Saving writes a temporary file beside the target, syncs it and renames it over the
 * target, so a crash leaves the old file or the new one, never half of one. Loading
 * checks every tensor by name, dtype and shape before anything is copied. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

/* ------------------------------------------------------------------ save */

static const char *dtype_name(const ddp_program *p) {
    return p->dtype == DDP_F64 ? "F64" : "F32";
}

static ddp_text header_for(const ddp_program *p) {
    ddp_text t = {0};
    int64_t es = p->dtype == DDP_F64 ? 8 : 4, offset = 0;
    ddp_text_printf(&t, "{\"__metadata__\":{\"format\":\"ddp\",\"model\":\"%s\",\"program_hash\":\"%016llx\",\"layouts\":\"",
                p->name, (unsigned long long)p->hash);
    for (int64_t i = 0; i < p->nparams; i++)
        ddp_text_printf(&t, "%s%s:%s", i ? "," : "", p->params[i].name, p->params[i].layout);
    ddp_text_printf(&t, "\"}");
    for (int64_t i = 0; i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        ddp_text_printf(&t, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", q->name, dtype_name(p));
        for (int64_t d = 0; d < q->rank; d++)
            ddp_text_printf(&t, "%s%lld", d ? "," : "", (long long)q->shape[d]);
        ddp_text_printf(&t, "],\"data_offsets\":[%lld,%lld]}", (long long)offset, (long long)(offset + q->count * es));
        offset += q->count * es;
    }
    ddp_text_printf(&t, "}");
    while (!t.failed && t.len % 8) /* the data starts 8-byte aligned */
        ddp_text_printf(&t, " ");
    return t;
}

static const void *param_data(ddp_runtime *rt, const ddp_param *q) {
    return (const char *)rt->region[q->region] + q->offset * rt->elem_size;
}

bool ddp_save_params(ddp_runtime *rt, const char *path, char *err, size_t errlen) {
    const ddp_program *p = rt->program;
    ddp_text header = header_for(p);
    if (header.failed) {
        free(header.s);
        return ddp_fail(err, errlen, "%s: out of memory writing the header", path);
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(header.s);
        return ddp_fail(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    }
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)header.len >> (8 * i));
    bool ok = fwrite(len, 1, 8, f) == 8 && fwrite(header.s, 1, header.len, f) == header.len;
    for (int64_t i = 0; ok && i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        ok = fwrite(param_data(rt, q), (size_t)rt->elem_size, (size_t)q->count, f) == (size_t)q->count;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    free(header.s);
    if (!ok || rename(tmp, path) != 0) {
        if (ok)
            saved = errno;
        unlink(tmp);
        return ddp_fail(err, errlen, "%s: cannot write: %s (the file, if any, is as it was)", path, strerror(saved));
    }
    return true;
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

static int64_t json_integer(Json *j) {
    skip_space(j);
    char *stop;
    errno = 0;
    long long v = strtoll(j->s, &stop, 10);
    if (stop == j->s || stop > j->end || errno || v < 0)
        j->bad = true;
    j->s = stop;
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

typedef struct Entry {
    char name[256], dtype[16];
    int64_t rank, shape[8], begin, end;
} Entry;

typedef struct Header {
    Entry *entries;
    int64_t count, cap;
    char hash[64];
    bool out_of_memory;
} Header;

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
    Entry *e = ctx;
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

static void metadata_member(Json *j, const char *key, void *ctx) {
    Header *h = ctx;
    if (strcmp(key, "program_hash") == 0)
        json_string(j, h->hash, sizeof h->hash);
    else
        skip_value(j, 0);
}

static void header_member(Json *j, const char *key, void *ctx) {
    Header *h = ctx;
    if (strcmp(key, "__metadata__") == 0) {
        json_object(j, metadata_member, h);
        return;
    }
    if (h->count == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 64;
        Entry *grown = realloc(h->entries, sizeof(Entry) * (size_t)cap);
        if (!grown) {
            h->out_of_memory = j->bad = true;
            return;
        }
        h->entries = grown;
        h->cap = cap;
    }
    Entry *e = &h->entries[h->count++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", key);
    json_object(j, tensor_member, e);
}

static bool parse_header(const char *text, size_t len, Header *h) {
    Json j = {text, text + len, false};
    json_object(&j, header_member, h);
    skip_space(&j);
    return !j.bad && j.s == j.end;
}

static const Entry *find_entry(const Header *h, const char *name) {
    for (int64_t i = 0; i < h->count; i++)
        if (strcmp(h->entries[i].name, name) == 0)
            return &h->entries[i];
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

/* Every tensor of the program is in the file with its shape, a float dtype and a byte
 * range inside the data; and the file has no tensor the program lacks. */
static bool check_entries(const ddp_program *p, const Header *h, const char *path, size_t data_len, char *err,
                          size_t errlen) {
    for (int64_t i = 0; i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        const Entry *e = find_entry(h, q->name);
        if (!e)
            return ddp_fail(err, errlen, "%s: has no tensor `%s`: it was saved from another model (it holds %lld "
                                     "tensors, this model has %lld)",
                        path, q->name, (long long)h->count, (long long)p->nparams);
        char want[128], got[128];
        ddp_shape_text(want, sizeof want, q->shape, (int)(q->rank));
        ddp_shape_text(got, sizeof got, e->shape, (int)(e->rank));
        if (strcmp(want, got) != 0)
            return ddp_fail(err, errlen, "%s: tensor `%s` is %s, and this model's is %s", path, q->name, got, want);
        int size = dtype_bytes(e->dtype);
        if (!size)
            return ddp_fail(err, errlen, "%s: tensor `%s` is %s; parameters load from F32, F64, F16 or BF16", path,
                        q->name, e->dtype);
        if (e->begin > e->end || (uint64_t)e->end > data_len || e->end - e->begin != q->count * size)
            return ddp_fail(err, errlen, "%s: tensor `%s` has byte range [%lld, %lld), which does not fit its shape "
                                     "and the file's %zu bytes of data: the file is damaged",
                        path, q->name, (long long)e->begin, (long long)e->end, data_len);
    }
    for (int64_t i = 0; i < h->count; i++) {
        bool known = false;
        for (int64_t k = 0; k < p->nparams && !known; k++)
            known = strcmp(p->params[k].name, h->entries[i].name) == 0;
        if (!known)
            return ddp_fail(err, errlen, "%s: holds tensor `%s`, which this model does not have: it was saved from "
                                     "another model", path, h->entries[i].name);
    }
    return true;
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

bool ddp_load_params(ddp_runtime *rt, const char *path, char *note, size_t notelen, char *err, size_t errlen) {
    const ddp_program *p = rt->program;
    unsigned char *file = NULL;
    size_t len = 0;
    if (notelen)
        note[0] = 0;
    if (!read_whole(path, &file, &len, err, errlen))
        return false;
    uint64_t header_len = 0;
    for (int i = 7; len >= 8 && i >= 0; i--)
        header_len = header_len << 8 | file[i];
    Header h = {0};
    bool ok = len >= 8 && header_len <= len - 8;
    if (!ok)
        ddp_fail(err, errlen, "%s: not a safetensors file (%s)", path,
             len < 8 ? "shorter than its 8-byte header length" : "its header length is beyond the end of the file");
    else if (!(ok = parse_header((const char *)file + 8, header_len, &h)))
        ddp_fail(err, errlen, h.out_of_memory ? "%s: out of memory reading its header"
                                          : "%s: not a safetensors file: its header is not the JSON the format wants",
             path);
    else
        ok = check_entries(p, &h, path, len - 8 - header_len, err, errlen);
    const unsigned char *data = file + 8 + header_len;
    for (int64_t i = 0; ok && i < p->nparams; i++) {
        const ddp_param *q = &p->params[i];
        const Entry *e = find_entry(&h, q->name);
        char *dst = (char *)rt->region[q->region] + q->offset * rt->elem_size;
        for (int64_t k = 0; k < q->count; k++) {
            double v = element(data + e->begin, e->dtype, k);
            if (p->dtype == DDP_F64)
                ((double *)dst)[k] = v;
            else
                ((float *)dst)[k] = (float)v;
        }
    }
    char mine[32];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)p->hash);
    if (ok && h.hash[0] && strcmp(h.hash, mine) != 0 && notelen)
        snprintf(note, notelen, "%s was saved by program %s, and this is %s; its tensors fit by name and shape",
                 path, h.hash, mine);
    free(h.entries);
    free(file);
    return ok;
}
