/* message.c: the one way a runtime function that fails says why: a formatted line
 * into the caller's buffer, and false to return; and the one way a message reaches
 * the user: a whole line on stderr, prefixed with who wrote it; and the growing
 * strings JSON texts are written into. Under srun the lines
 * of every task meet on one terminal, so with several workers each says its rank and
 * host. Once a run has its folder, every such line, and everything worker 0 prints,
 * goes to the worker's log there too. Both belong to the thread that set them, since
 * a process with several GPUs runs a worker on each in a thread of its own; threads
 * that set none (a worker's helpers) write with the identity the process shared. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static char shared_identity[512] = "ddp: ";
static __thread char thread_identity[512]; /* "": the shared one */
static __thread FILE *log_file;            /* the run folder's log of this worker; NULL before */

const char *ddp_identity(void) {
    return thread_identity[0] ? thread_identity : shared_identity;
}

bool ddp_fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return false;
}

void ddp_set_identity(const char *prog, int64_t rank, const char *host, bool several) {
    if (several)
        snprintf(thread_identity, sizeof thread_identity, "%s: rank %lld on %s: ", prog, (long long)rank, host);
    else
        snprintf(thread_identity, sizeof thread_identity, "%s: ", prog);
}

void ddp_share_identity(void) {
    memcpy(shared_identity, thread_identity, sizeof shared_identity);
}

void ddp_error(const char *fmt, ...) {
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s%s\n", ddp_identity(), line); /* one call: lines of threads do not mix */
    if (log_file) {
        fprintf(log_file, "%s%s\n", ddp_identity(), line);
        fflush(log_file);
    }
}

bool ddp_log_open(const char *path, char *err, size_t len) {
    ddp_log_close();
    if (!(log_file = fopen(path, "a")))
        return ddp_fail(err, len, "%s: cannot write: %s", path, strerror(errno));
    return true;
}

void ddp_log_close(void) {
    if (log_file)
        fclose(log_file);
    log_file = NULL;
}

void ddp_say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (log_file) {
        va_start(ap, fmt);
        vfprintf(log_file, fmt, ap);
        va_end(ap);
        fflush(log_file);
    }
}

void ddp_log_only(const char *fmt, ...) {
    if (!log_file)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(log_file, fmt, ap);
    va_end(ap);
    fflush(log_file);
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
