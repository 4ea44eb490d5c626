/* hostlist.c: Slurm's compressed lists, expanded exactly as Slurm expands them.
 *
 * A hostlist is items separated by commas or spaces; an item is text with bracket
 * groups of numbers and ranges, `jz[001-004,007]`, zero padding kept from each range's
 * first number, several groups multiplied out in Slurm's order (`x[1-2]y[1-2]` is
 * x1y1 x1y2 x2y1 x2y2; see expand_item). Hosts stay in the list's order, never
 * sorted, duplicates kept: rank 0 runs on the first. Tasks per node are counts with
 * repetitions, `2(x3),1` for 2 2 2 1. Anything else is refused with the place it
 * went wrong. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

enum { MAX_HOSTS = 1 << 20, MAX_NAME = 256, MAX_GROUPS = 8 };

__attribute__((format(printf, 4, 5))) static bool bad(char *err, size_t len, const char *list, const char *fmt,
                                                      ...) {
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(err, len, "the host list `%s` is malformed: %s", list, why);
    return false;
}

void ddp_hostlist_free(ddp_hostlist *h) {
    for (int i = 0; i < h->count; i++)
        free(h->names[i]);
    free(h->names);
    memset(h, 0, sizeof *h);
}

static bool push_host(ddp_hostlist *h, const char *name) {
    if (h->count == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        char **grown = realloc(h->names, sizeof(char *) * (size_t)cap);
        if (!grown)
            return false;
        h->names = grown;
        h->cap = cap;
    }
    return (h->names[h->count++] = strdup(name)) != NULL;
}

/* ---------------------------------------------------------------- an item */

/* One bracket group: its numbers in order, each with its zero-padded width. */
typedef struct Group {
    int64_t *values;
    int *widths;
    int count, cap;
} Group;

/* An item as text pieces and groups: text[0] group[0] text[1] ... text[ngroups]. */
typedef struct Item {
    char text[MAX_GROUPS + 1][MAX_NAME];
    Group group[MAX_GROUPS];
    int ngroups;
    int64_t hosts;              /* the names it expands to */
} Item;

static void item_free(Item *it) {
    for (int g = 0; g < it->ngroups; g++) {
        free(it->group[g].values);
        free(it->group[g].widths);
    }
}

static bool group_push(Group *g, int64_t value, int width) {
    if (g->count == g->cap) {
        int cap = g->cap ? 2 * g->cap : 8;
        int64_t *v = realloc(g->values, sizeof(int64_t) * (size_t)cap);
        if (v)
            g->values = v;
        int *w = realloc(g->widths, sizeof(int) * (size_t)cap);
        if (w)
            g->widths = w;
        if (!v || !w)
            return false;
        g->cap = cap;
    }
    g->values[g->count] = value;
    g->widths[g->count++] = width;
    return true;
}

/* A run of digits at *s: its value and its length; false if none or too long. */
static bool number(const char **s, int64_t *value, int *digits) {
    const char *p = *s;
    int64_t v = 0;
    while (isdigit((unsigned char)*p) && p - *s < 9)
        v = v * 10 + (*p++ - '0');
    if (p == *s || isdigit((unsigned char)*p))
        return false;
    *digits = (int)(p - *s);
    *value = v;
    *s = p;
    return true;
}

/* "001-004,007" up to the closing bracket. */
static bool parse_group(const char **s, Group *g, int64_t *total, const char *list, char *err, size_t len) {
    const char *p = *s;
    for (;;) {
        int64_t lo, hi;
        int width, ignored;
        if (!number(&p, &lo, &width))
            return bad(err, len, list, "`[` must hold numbers and ranges such as 1-4 (at `%.12s`)", p);
        hi = lo;
        if (*p == '-') {
            p++;
            if (!number(&p, &hi, &ignored))
                return bad(err, len, list, "a range needs a number after `-` (at `%.12s`)", p);
            if (hi < lo)
                return bad(err, len, list, "the range %lld-%lld runs backwards", (long long)lo, (long long)hi);
        }
        if ((*total += hi - lo + 1) > MAX_HOSTS)
            return bad(err, len, list, "it names more than %d hosts", MAX_HOSTS);
        for (int64_t v = lo; v <= hi; v++)
            if (!group_push(g, v, width))
                return bad(err, len, list, "out of memory");
        if (*p == ']') {
            *s = p + 1;
            return true;
        }
        if (*p == 0)
            return bad(err, len, list, "a `[` is not closed");
        if (*p != ',')
            return bad(err, len, list, "expected `,` or `]` in a bracket (at `%.12s`)", p);
        p++;
    }
}

static bool is_separator(char c) {
    return c == ',' || c == ' ' || c == '\t' || c == '\n';
}

/* One item from *s to the next separator outside brackets. */
static bool parse_item(const char **s, Item *it, const char *list, char *err, size_t len) {
    const char *p = *s;
    int64_t total = 1;
    size_t n = 0;
    memset(it, 0, sizeof *it);
    while (*p && !is_separator(*p)) {
        if (*p == ']')
            return bad(err, len, list, "a `]` without its `[`");
        if (*p != '[') {
            if (n + 1 >= MAX_NAME)
                return bad(err, len, list, "a host name is longer than %d characters", MAX_NAME - 1);
            it->text[it->ngroups][n++] = *p++;
            continue;
        }
        if (it->ngroups == MAX_GROUPS)
            return bad(err, len, list, "more than %d bracket groups in one name", MAX_GROUPS);
        int64_t count = 0;
        p++;
        if (!parse_group(&p, &it->group[it->ngroups++], &count, list, err, len))
            return false;
        if ((total *= count) > MAX_HOSTS)
            return bad(err, len, list, "it names more than %d hosts", MAX_HOSTS);
        n = 0;
    }
    it->hosts = total;
    *s = p;
    return true;
}

/* A name: text pieces with group g's value number idx[g] between them. */
static bool push_name(const Item *it, const int *idx, ddp_hostlist *out) {
    char name[(MAX_GROUPS + 1) * (MAX_NAME + 12)]; /* each number at most 9 digits */
    size_t used = 0;
    for (int g = 0; g <= it->ngroups; g++) {
        size_t n = strlen(it->text[g]);
        memcpy(name + used, it->text[g], n + 1);
        used += n;
        if (g < it->ngroups)
            used += (size_t)sprintf(name + used, "%0*lld", it->group[g].widths[idx[g]],
                                    (long long)it->group[g].values[idx[g]]);
    }
    return push_host(out, name);
}

/* Every name of the item in Slurm's order: the last group turns fastest; the others
 * count like an odometer whose first group turns fastest, so a[1-2]b[1-2]c[1-2] is
 * a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ... */
static bool expand_item(const Item *it, ddp_hostlist *out) {
    int idx[MAX_GROUPS] = {0}, last = it->ngroups - 1;
    for (;;) {
        int turns = last >= 0 ? it->group[last].count : 1;
        for (int k = 0; k < turns; k++) {
            if (last >= 0)
                idx[last] = k;
            if (!push_name(it, idx, out))
                return false;
        }
        int g = 0;
        while (g < last && ++idx[g] == it->group[g].count)
            idx[g++] = 0;
        if (g >= last)
            return true;
    }
}

bool ddp_hostlist_parse(const char *list, ddp_hostlist *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const char *p = list;
    while (*p) {
        if (is_separator(*p)) {
            p++;
            continue;
        }
        Item it;
        bool ok = parse_item(&p, &it, list, err, errlen);
        if (ok && out->count + it.hosts > MAX_HOSTS) /* refused before a name is made */
            ok = bad(err, errlen, list, "it names more than %d hosts", MAX_HOSTS);
        if (ok && !(ok = expand_item(&it, out)))
            bad(err, errlen, list, "out of memory");
        item_free(&it);
        if (!ok) {
            ddp_hostlist_free(out);
            return false;
        }
    }
    if (out->count == 0) {
        snprintf(err, errlen, "the host list `%s` names no host", list);
        return false;
    }
    return true;
}

/* --------------------------------------------------------- tasks per node */

bool ddp_tasks_per_node_parse(const char *list, int64_t **counts, int *nodes, char *err, size_t errlen) {
    *counts = NULL;
    *nodes = 0;
    int cap = 0;
    for (const char *p = list;;) {
        int64_t tasks, times = 1;
        int digits;
        if (!number(&p, &tasks, &digits) || tasks < 1)
            goto malformed;
        if (*p == '(') {
            if (p[1] != 'x')
                goto malformed;
            p += 2;
            if (!number(&p, &times, &digits) || times < 1 || *p++ != ')')
                goto malformed;
        }
        if (*nodes + times > MAX_HOSTS)
            goto malformed;
        if (*nodes + times > cap) {
            cap = (int)(*nodes + times) * 2;
            int64_t *grown = realloc(*counts, sizeof(int64_t) * (size_t)cap);
            if (!grown)
                goto malformed;
            *counts = grown;
        }
        for (int64_t k = 0; k < times; k++)
            (*counts)[(*nodes)++] = tasks;
        if (*p == 0)
            return true;
        if (*p++ != ',')
            goto malformed;
    }
malformed:
    free(*counts);
    *counts = NULL;
    *nodes = 0;
    snprintf(err, errlen, "the tasks per node `%s` are malformed: Slurm writes counts such as `2(x3),1`", list);
    return false;
}
