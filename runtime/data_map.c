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
 * with status 1, as any dataset error does, rather than leave a bare "Bus error". One
 * changed in place is found at the end of an epoch (ddp_data_files_unchanged). */
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

/* The mapped files, grown and changed only while datasets are opened or freed (before
 * and after training, by one thread), read by the handler. */
typedef struct Watched {
    const unsigned char *start;
    size_t len;                  /* 0: a free entry */
    char *path;
    struct stat as_mapped;       /* the file when it was mapped */
} Watched;
static Watched *watched;
static size_t nwatched;
static char whose[512];          /* the identity of messages, as the last file was mapped */

static void say(const char *text) {
    ssize_t written = write(STDERR_FILENO, text, strlen(text));
    (void)written;
}

static void on_bus_error(int sig, siginfo_t *info, void *context) {
    (void)context;
    const unsigned char *at = info->si_addr;
    for (size_t i = 0; i < nwatched; i++)
        if (watched[i].len && at >= watched[i].start && at < watched[i].start + watched[i].len) {
            say(whose);
            say(watched[i].path);
            say(": the file was cut short while this worker read it (it was rewritten or truncated "
                "during the run); a dataset's files must stay as they are until training ends: write a "
                "new version to another path\n");
            _exit(1);
        }
    signal(sig, SIG_DFL); /* not a dataset's: the default action, when the access repeats */
}

/* false: out of memory (the file is then read instead) */
static bool watch(const unsigned char *start, size_t len, const char *path, const struct stat *st) {
    if (!watched) {
        struct sigaction sa = {.sa_sigaction = on_bus_error, .sa_flags = SA_SIGINFO};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, NULL);
    }
    snprintf(whose, sizeof whose, "%s", ddp_identity());
    size_t free_entry = 0;
    while (free_entry < nwatched && watched[free_entry].len)
        free_entry++;
    char *copy = strdup(path);
    if (!copy)
        return false;
    if (free_entry == nwatched) {
        size_t room = nwatched ? 2 * nwatched : 16;
        Watched *grown = realloc(watched, room * sizeof *grown);
        if (!grown) {
            free(copy);
            return false;
        }
        memset(grown + nwatched, 0, (room - nwatched) * sizeof *grown);
        watched = grown;
        nwatched = room;
    }
    watched[free_entry] = (Watched){start, len, copy, *st};
    return true;
}

static void unwatch(const unsigned char *start) {
    for (size_t i = 0; i < nwatched; i++)
        if (watched[i].len && watched[i].start == start) {
            free(watched[i].path);
            watched[i] = (Watched){0};
        }
}

/* A file changed in place keeps its size and pages: nothing faults, and batches would
 * read the new bytes. Its time of modification says so; a path that now names another
 * file (one written beside and renamed over it, or removed) leaves the mapping with the
 * bytes the run began with. */
bool ddp_data_files_unchanged(char *err, size_t errlen) {
    for (size_t i = 0; i < nwatched; i++) {
        const struct stat *then = &watched[i].as_mapped;
        struct stat now;
        if (!watched[i].len || stat(watched[i].path, &now) != 0 || now.st_dev != then->st_dev ||
            now.st_ino != then->st_ino)
            continue;
        if (now.st_size != then->st_size || now.st_mtim.tv_sec != then->st_mtim.tv_sec ||
            now.st_mtim.tv_nsec != then->st_mtim.tv_nsec)
            return ddp_fail(err, errlen,
                            "%s: the file was changed during the run, so its samples are no longer those the "
                            "run began with; put it back as it was and resume from the last checkpoint, or "
                            "write a new version to another path",
                            watched[i].path);
    }
    return true;
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
    /* read ahead in the background the files that fit in half the memory together;
     * the rest is asked for a few batches ahead of the loader (ddp_data_prefetch) */
    static uint64_t advised;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    bool read_ahead = false;
    if (pages > 0 && page > 0 && advised + (uint64_t)st.st_size <= (uint64_t)pages * (uint64_t)page / 2) {
        madvise(map, (size_t)st.st_size, MADV_WILLNEED);
        advised += (uint64_t)st.st_size;
        read_ahead = true;
    }
    if (!watch(map, (size_t)st.st_size, path, &st)) {
        munmap(map, (size_t)st.st_size);
        return data_read_file(path, spec, role, out, err, errlen);
    }
    out->data = map;
    out->len = (size_t)st.st_size;
    out->mapped = true;
    out->read_ahead = read_ahead;
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
    *b = (data_bytes){copy, len, false, false};
    return true;
}

void *data_keep_inputs(ddp_data *d, data_bytes *b, size_t offset, int width) {
    if (!b->mapped || offset % (size_t)width != 0)
        return data_take(b, offset);
    d->mapping = b->data;
    d->mapping_len = b->len;
    d->read_ahead = b->read_ahead;
    *b = (data_bytes){0};
    return d->mapping + offset;
}

static void free_block(void *inputs, unsigned char *mapping, size_t mapping_len) {
    if (mapping) {
        data_bytes mapped = {mapping, mapping_len, true, false};
        data_unmap(&mapped);
    } else {
        free(inputs);
    }
}

void data_free_inputs(ddp_data *d) {
    free_block(d->inputs, d->mapping, d->mapping_len);
    for (int64_t i = 0; i < d->nshards; i++) {
        free_block(d->shards[i].inputs, d->shards[i].mapping, d->shards[i].mapping_len);
        free(d->shards[i].path);
        free(d->shards[i].label_path);
    }
    free(d->shards);
    d->inputs = NULL;
    d->mapping = NULL;
    d->mapping_len = 0;
    d->read_ahead = false;
    d->shards = NULL;
    d->nshards = 0;
}
