/* util.c: the arena every compiler structure lives in, a string map, a string
 * builder, edit distance for "did you mean", and number formatting.
 *
 * The arena hands out zeroed memory from large chunks; nothing is freed until the
 * whole compilation ends, which keeps ownership trivial across passes. */
#include "ddpc.h"
#include "../runtime/fnv.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- arena */

typedef struct Chunk {
    struct Chunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} Chunk;

struct Arena {
    Chunk *chunks;
};

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "ddpc: out of memory (asked for %zu bytes)\n", n);
        exit(3);
    }
    return p;
}

Arena *arena_new(void) {
    Arena *a = xmalloc(sizeof *a);
    a->chunks = NULL;
    return a;
}

void arena_free(Arena *a) {
    if (!a)
        return;
    for (Chunk *c = a->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(a);
}

void *arena_alloc(Arena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    Chunk *c = a->chunks;
    if (!c || c->size - c->used < size) {
        size_t chunk_size = size > (1 << 20) ? size : (1 << 20);
        c = xmalloc(sizeof *c + chunk_size);
        c->size = chunk_size;
        c->used = 0;
        /* A chunk made for one large object goes behind the current one, so the
         * current chunk's free space is not abandoned. */
        if (a->chunks && size > (1 << 19)) {
            c->next = a->chunks->next;
            a->chunks->next = c;
        } else {
            c->next = a->chunks;
            a->chunks = c;
        }
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *arena_strdup(Arena *a, const char *s) {
    return arena_strndup(a, s, strlen(s));
}

char *arena_printf(Arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = arena_alloc(a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void *arena_grow(Arena *a, void *items, int *cap, size_t elem_size) {
    int new_cap = *cap ? *cap * 2 : 8;
    void *p = arena_alloc(a, (size_t)new_cap * elem_size);
    if (items)
        memcpy(p, items, (size_t)*cap * elem_size);
    *cap = new_cap;
    return p;
}

/* ------------------------------------------------------------------ map */

static uint64_t hash_string(const char *s) {
    return ddp_fnv1a(s, strlen(s), DDP_FNV_START);
}

static int map_slot(const Map *m, const char *key) {
    int mask = m->cap - 1;
    for (int i = (int)(hash_string(key) & (uint64_t)mask);; i = (i + 1) & mask)
        if (!m->keys[i] || strcmp(m->keys[i], key) == 0)
            return i;
}

void *map_get(const Map *m, const char *key) {
    if (!m->cap)
        return NULL;
    int i = map_slot(m, key);
    return m->keys[i] ? m->vals[i] : NULL;
}

void map_put(Arena *a, Map *m, const char *key, void *val) {
    if ((m->len + 1) * 4 >= m->cap * 3) {
        Map bigger = {0};
        bigger.cap = m->cap ? m->cap * 2 : 16;
        bigger.keys = arena_alloc(a, sizeof(char *) * (size_t)bigger.cap);
        bigger.vals = arena_alloc(a, sizeof(void *) * (size_t)bigger.cap);
        for (int i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                int j = map_slot(&bigger, m->keys[i]);
                bigger.keys[j] = m->keys[i];
                bigger.vals[j] = m->vals[i];
                bigger.len++;
            }
        *m = bigger;
    }
    int i = map_slot(m, key);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->len++;
    }
    m->vals[i] = val;
}

/* ------------------------------------------------------------- strings */

void sb_printf(StrBuf *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (sb->len + (size_t)n + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 256;
        while (sb->len + (size_t)n + 1 > cap)
            cap *= 2;
        char *p = realloc(sb->data, cap);
        if (!p) {
            fprintf(stderr, "ddpc: out of memory\n");
            exit(3);
        }
        sb->data = p;
        sb->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void sb_putc(StrBuf *sb, char c) {
    sb_printf(sb, "%c", c);
}

void sb_free(StrBuf *sb) {
    free(sb->data);
    sb->data = NULL;
    sb->len = sb->cap = 0;
}

/* Levenshtein distance with adjacent transpositions, giving up (returning limit + 1)
 * once the distance must exceed limit: names are short, candidates are many. */
int edit_distance(const char *a, const char *b, int limit) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 64 || lb > 64)
        return limit + 1;
    if (abs(la - lb) > limit)
        return limit + 1;
    int d[65][65];
    for (int i = 0; i <= la; i++)
        d[i][0] = i;
    for (int j = 0; j <= lb; j++)
        d[0][j] = j;
    for (int i = 1; i <= la; i++) {
        int row_min = limit + 1;
        for (int j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
            if (v < row_min)
                row_min = v;
        }
        if (row_min > limit)
            return limit + 1;
    }
    return d[la][lb];
}

const char *fmt_count(Arena *a, int64_t n) {
    char digits[32], out[48];
    bool neg = n < 0;
    uint64_t u = neg ? (uint64_t)0 - (uint64_t)n : (uint64_t)n;
    int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)u);
    int j = 0;
    if (neg)
        out[j++] = '-';
    for (int i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            out[j++] = ',';
        out[j++] = digits[i];
    }
    out[j] = '\0';
    return arena_strdup(a, out);
}

/* The shortest text that reads back as the same double: 0.001, 1e-07, 3. */
const char *fmt_number(Arena *a, double v) {
    char buf[40];
    if (v > -1e15 && v < 1e15 && v == (double)(int64_t)v) {
        snprintf(buf, sizeof buf, "%lld", (long long)v);
        return arena_strdup(a, buf);
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return arena_strdup(a, buf);
}

/* --------------------------------------------------------------- scopes */

void scopes_push(Arena *a, Scopes *s) {
    vec_push(a, &s->marks, s->undo.len);
}

void scopes_pop(Arena *a, Scopes *s) {
    int mark = s->marks.items[--s->marks.len];
    while (s->undo.len > mark) {
        ScopeEntry e = s->undo.items[--s->undo.len];
        map_put(a, &s->map, e.name, e.prev);
    }
}

void scopes_bind(Arena *a, Scopes *s, const char *name, void *val) {
    ScopeEntry e = {name, map_get(&s->map, name)};
    vec_push(a, &s->undo, e);
    map_put(a, &s->map, name, val);
}

void *scopes_get(const Scopes *s, const char *name) {
    return map_get(&s->map, name);
}

int scopes_innermost(const Scopes *s) {
    return s->marks.len ? s->marks.items[s->marks.len - 1] : 0;
}
