/* message.c: the one way a runtime function that fails says why: a formatted line
 * into the caller's buffer, and false to return; and the one way a message reaches
 * the user: a whole line on stderr, prefixed with who wrote it; and the growing
 * strings JSON texts are written into. Under srun the lines
 * of every task meet on one terminal, so with several workers each says its rank and
 * host. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime.h"

static char identity[512] = "ddp: ";

bool ddp_fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return false;
}

void ddp_set_identity(const char *prog, int64_t rank, const char *host, bool several) {
    if (several)
        snprintf(identity, sizeof identity, "%s: rank %lld on %s: ", prog, (long long)rank, host);
    else
        snprintf(identity, sizeof identity, "%s: ", prog);
}

void ddp_error(const char *fmt, ...) {
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s%s\n", identity, line); /* one call: lines of threads do not mix */
}

void ddp_text_printf(ddp_text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || t->failed)
        return;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->failed = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}
