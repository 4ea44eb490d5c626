/* data_map.c: dataset files mapped into memory instead of read.
 *
 * An uncompressed .npy or IDX file whose values need no rewriting (native byte order,
 * C order) is mapped read-only, and batches read its samples where the page cache
 * holds them: the workers of a node then share one copy of the dataset, where reading
 * it would give each its own (eight GPUs' workers, eight copies), and a worker starts
 * without reading its files whole. A gzip file, or one that cannot be mapped, is read
 * as before.
 *
 * A mapped file cut short while a program reads it makes the next access to the pages
 * past its new end fault (SIGBUS): the handler here names the file and ends the worker
 * with status 1, as any dataset error does, rather than leave a bare "Bus error". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_read.h"

/* ------------------------------------------------ files cut short while mapped */

enum { WATCHED_MAX = 16 };
/* The mapped files, with the line to print if one is cut short; written before the
 * handler can see an entry (len last), by the thread that opens or frees datasets. */
static struct watched {
    const unsigned char *start;
    size_t len;
    char message[2560];
} watched[WATCHED_MAX];

static void on_bus_error(int sig, siginfo_t *info, void *context) {
    (void)context;
    const unsigned char *at = info->si_addr;
    for (int i = 0; i < WATCHED_MAX; i++) {
        size_t len = __atomic_load_n(&watched[i].len, __ATOMIC_ACQUIRE);
        if (len && at >= watched[i].start && at < watched[i].start + len) {
            ssize_t written = write(STDERR_FILENO, watched[i].message, strlen(watched[i].message));
            (void)written;
            _exit(1);
        }
    }
    signal(sig, SIG_DFL); /* not a dataset's: the default action, when the access repeats */
}

static void watch(const unsigned char *start, size_t len, const char *path) {
    static bool handling;
    if (!handling) {
        struct sigaction sa = {.sa_sigaction = on_bus_error, .sa_flags = SA_SIGINFO};
        sigemptyset(&sa.sa_mask);
        handling = sigaction(SIGBUS, &sa, NULL) == 0;
    }
    for (int i = 0; i < WATCHED_MAX; i++)
        if (!watched[i].len) {
            watched[i].start = start;
            snprintf(watched[i].message, sizeof watched[i].message,
                     "%s%s: the file was cut short while this worker read it (it was rewritten or "
                     "truncated during the run); a dataset's files must stay as they are until "
                     "training ends: write a new version to another path\n",
                     ddp_identity(), path);
            __atomic_store_n(&watched[i].len, len, __ATOMIC_RELEASE);
            return;
        }
    /* more mappings than entries: such a fault is a plain SIGBUS */
}

static void unwatch(const unsigned char *start) {
    for (int i = 0; i < WATCHED_MAX; i++)
        if (watched[i].len && watched[i].start == start)
            __atomic_store_n(&watched[i].len, 0, __ATOMIC_RELEASE);
}

/* --------------------------------------------------------------- mapping */

static bool is_gzip(int fd) {
    unsigned char magic[2];
    return pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

bool data_map_file(const char *path, const ddp_dataset *spec, const char *role, data_bytes *out, char *err,
                   size_t errlen) {
    *out = (data_bytes){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    void *map = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && !is_gzip(fd))
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    if (map == MAP_FAILED) /* and every failure is said the way reading says it */
        return data_read_file(path, spec, role, out, err, errlen);
    /* read ahead in the background what the page cache can hold; a larger file comes
     * in as batches touch it */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (uint64_t)st.st_size <= (uint64_t)pages * (uint64_t)page / 2)
        madvise(map, (size_t)st.st_size, MADV_WILLNEED);
    out->data = map;
    out->len = (size_t)st.st_size;
    out->mapped = true;
    watch(out->data, out->len, path);
    return true;
}

void data_unmap(data_bytes *b) {
    unwatch(b->data);
    munmap(b->data, b->len);
    *b = (data_bytes){0};
}

bool data_own(data_bytes *b) {
    if (!b->mapped)
        return true;
    unsigned char *copy = malloc(b->len + 1);
    if (!copy)
        return false;
    memcpy(copy, b->data, b->len);
    copy[b->len] = 0;
    size_t len = b->len;
    data_unmap(b);
    *b = (data_bytes){copy, len, false};
    return true;
}

void *data_keep_inputs(ddp_data *d, data_bytes *b, size_t offset, int width) {
    if (!b->mapped || offset % (size_t)width != 0)
        return data_take(b, offset);
    d->mapping = b->data;
    d->mapping_len = b->len;
    *b = (data_bytes){0};
    return d->mapping + offset;
}

void data_free_inputs(ddp_data *d) {
    if (d->mapping) {
        data_bytes mapped = {d->mapping, d->mapping_len, true};
        data_unmap(&mapped);
    } else {
        free(d->inputs);
    }
    d->inputs = NULL;
    d->mapping = NULL;
    d->mapping_len = 0;
}
