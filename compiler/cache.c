/* cache.c: the generated code of a build kept by what it was made from, so building a
 * program again after a change that leaves a module's kernels as they were (the
 * epochs, a learning rate, a dataset's path, or the same model in another program)
 * takes that module from the cache rather than from LLVM.
 *
 * An entry is one module's output (PTX, or an object file), named by the SHA-256 of
 * all that decides it: the module's LLVM IR before optimisation, the target machine
 * (triple, CPU, features), the optimisation level, the kind of file, LLVM's version
 * and the entries' format. It is written under a name of its own and renamed into
 * place, so a build running beside never reads half of one, and it begins with its
 * length and its content's SHA-256, checked at every read, so a damaged entry is made
 * again rather than used. The folder is $DDP_CACHE_DIR, else $XDG_CACHE_HOME/ddp, else
 * ~/.cache/ddp (DDP_CACHE_DIR=off: no cache). Past DDP_CACHE_SIZE bytes (256 MiB; a
 * home folder on a cluster often has a small quota) the entries used longest ago go
 * until it holds three quarters of that, one build (or one of a build's code
 * generators) at a time under a lock on the folder's .lock: two trimming at once would
 * each keep its own entry and remove the other's, and leave none. The cache never
 * fails a build: where it cannot read or write, the code is generated as without it. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <llvm/Config/llvm-config.h>

#include "cg.h"
#include "../runtime/sha256.h"

enum { HEADER = 16 + 8 + 32 }; /* magic, length, the content's SHA-256 */
static const char magic[16] = "ddp-cache 1\n\0\0\0";

/* The cache's folder, made if need be; false where there is none (off, or no folder
 * named: errno 0; else errno says why it could not be made). */
static bool cache_dir(char *dir, size_t len) {
    const char *set = getenv("DDP_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (set && *set)
        n = strcmp(set, "off") == 0 ? -1 : snprintf(dir, len, "%s", set);
    else if (xdg && *xdg)
        n = snprintf(dir, len, "%s/ddp", xdg);
    else if (home && *home)
        n = snprintf(dir, len, "%s/.cache/ddp", home);
    else
        n = -1;
    errno = n >= 0 ? ENAMETOOLONG : 0;
    if (n < 0 || (size_t)n >= len)
        return false;
    for (char *p = dir + 1;; p++) /* each folder of the path, as mkdir -p */
        if (*p == '/' || !*p) {
            char c = *p;
            *p = '\0';
            bool made = mkdir(dir, 0700) == 0 || errno == EEXIST;
            *p = c;
            if (!made)
                return false;
            if (!c)
                break;
        }
    struct stat st; /* there already, but perhaps not a folder */
    if (stat(dir, &st) != 0)
        return false;
    errno = ENOTDIR;
    return S_ISDIR(st.st_mode);
}

static void hex(const unsigned char digest[32], char out[65]) {
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", digest[i]);
}

bool cache_entry(LLVMModuleRef m, LLVMTargetMachineRef tm, int opt_level, LLVMCodeGenFileType type,
                 char path[PATH_MAX]) {
    char dir[PATH_MAX - 80];
    if (!cache_dir(dir, sizeof dir))
        return false;
    char *ir = LLVMPrintModuleToString(m), *triple = LLVMGetTargetMachineTriple(tm),
         *cpu = LLVMGetTargetMachineCPU(tm), *features = LLVMGetTargetMachineFeatureString(tm);
    char settings[512];
    int n = snprintf(settings, sizeof settings, "%s|%s|%s|O%d|file %d|LLVM %s|%.16s", triple, cpu, features,
                     opt_level, (int)type, LLVM_VERSION_STRING, magic);
    ddp_sha256 h;
    ddp_sha256_init(&h);
    ddp_sha256_update(&h, settings, (size_t)n + 1);
    ddp_sha256_update(&h, ir, strlen(ir));
    unsigned char digest[32];
    ddp_sha256_final(&h, digest);
    LLVMDisposeMessage(ir);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(features);
    char name[65];
    hex(digest, name);
    snprintf(path, PATH_MAX, "%s/%s", dir, name);
    return true;
}

/* The whole file at path into memory (free it); NULL where it cannot be read. */
static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    unsigned char *data = NULL;
    if (f && fstat(fileno(f), &st) == 0 && st.st_size >= HEADER && (data = malloc((size_t)st.st_size)) &&
        fread(data, 1, (size_t)st.st_size, f) == (size_t)st.st_size)
        *len = (size_t)st.st_size;
    else {
        free(data);
        data = NULL;
    }
    if (f)
        fclose(f);
    return data;
}

char *cache_get(Ddpc *c, const char *path, size_t *len) {
    size_t size;
    unsigned char *entry = slurp(path, &size);
    if (!entry)
        return NULL;
    uint64_t stored;
    memcpy(&stored, entry + 16, 8);
    unsigned char digest[32];
    ddp_sha256 h;
    ddp_sha256_init(&h);
    ddp_sha256_update(&h, entry + HEADER, size - HEADER);
    ddp_sha256_final(&h, digest);
    char *out = NULL;
    if (memcmp(entry, magic, 16) == 0 && stored == size - HEADER && memcmp(digest, entry + 24, 32) == 0) {
        out = arena_alloc(c->arena, (size_t)stored + 1);
        memcpy(out, entry + HEADER, (size_t)stored);
        out[stored] = '\0';
        *len = (size_t)stored;
        utimensat(AT_FDCWD, path, NULL, 0); /* used now: the last to go */
    }
    free(entry);
    return out;
}

/* ------------------------------------------------------------------ size */

typedef struct Entry {
    char name[72];
    off_t size;
    struct timespec used;
} Entry;

static int used_earlier(const void *a, const void *b) {
    const struct timespec *x = &((const Entry *)a)->used, *y = &((const Entry *)b)->used;
    return x->tv_sec != y->tv_sec ? (x->tv_sec > y->tv_sec) - (x->tv_sec < y->tv_sec)
                                  : (x->tv_nsec > y->tv_nsec) - (x->tv_nsec < y->tv_nsec);
}

enum { DEFAULT_SIZE_MIB = 256 };

/* DDP_CACHE_SIZE in bytes: a whole number, with K, M or G (KiB, MiB, GiB) after it if
 * wished; -1 where it says something else. */
static long long size_setting(const char *set) {
    char *end;
    errno = 0;
    long long n = strtoll(set, &end, 10);
    int shift = !*end ? 0 : !end[1] && strchr("kK", *end) ? 10 : !end[1] && strchr("mM", *end) ? 20
                        : !end[1] && strchr("gG", *end) ? 30 : -1;
    if (end == set || !isdigit((unsigned char)*set) || errno || shift < 0 || n > (LLONG_MAX >> shift))
        return -1;
    return n << shift;
}

static long long size_limit(void) {
    const char *set = getenv("DDP_CACHE_SIZE");
    long long n = set && *set ? size_setting(set) : -1;
    return n >= 0 ? n : (long long)DEFAULT_SIZE_MIB << 20;
}

void cache_check_settings(void) {
    const char *size = getenv("DDP_CACHE_SIZE");
    if (size && *size && size_setting(size) < 0)
        fprintf(stderr, "ddpc: warning: DDP_CACHE_SIZE=%s is not a size (bytes, or a number with K, M or G after "
                        "it): the cache keeps to %d MiB\n", size, DEFAULT_SIZE_MIB);
    char dir[PATH_MAX - 80];
    if (!cache_dir(dir, sizeof dir) && errno) {
        const char *set = getenv("DDP_CACHE_DIR");
        fprintf(stderr, "ddpc: warning: no cache of generated code: cannot make %s%s: %s\n",
                set && *set ? set : getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME") ? "$XDG_CACHE_HOME/ddp"
                                                                                       : "~/.cache/ddp",
                set && *set ? " (DDP_CACHE_DIR)" : "", strerror(errno));
    }
}

/* A writer's file (an entry's name, a dot, its process id) an hour old: a writer that
 * was killed midway left it (one that lives renames it within seconds). */
static bool abandoned(const char *name, const struct stat *st) {
    size_t len = strlen(name);
    return len > 65 && name[64] == '.' && strspn(name + 65, "0123456789") == len - 65 &&
           st->st_mtime < time(NULL) - 3600;
}

/* The entries used longest ago removed while the folder holds more than the limit,
 * down to three quarters of it; the entry just written (keep) stays, and files that
 * writers killed midway left go too. Under the lock, the last to trim sees every entry
 * written before it, so the folder ends within the limit. (Without one, where the
 * lock cannot be made, as well as it can.) */
static void trim(const char *dir, const char *keep) {
    char lock_path[PATH_MAX + 8];
    snprintf(lock_path, sizeof lock_path, "%s/.lock", dir);
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock >= 0)
        while (flock(lock, LOCK_EX) != 0 && errno == EINTR)
            continue;
    DIR *d = opendir(dir);
    if (!d) {
        if (lock >= 0)
            close(lock); /* closing it lets the lock go */
        return;
    }
    Entry *entries = NULL;
    size_t count = 0, cap = 0;
    long long total = 0;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat st;
        char path[PATH_MAX + 80];
        if (strlen(e->d_name) < 64 || snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path ||
            stat(path, &st) != 0)
            continue;
        if (strlen(e->d_name) != 64) {
            if (abandoned(e->d_name, &st))
                unlink(path);
            continue;
        }
        if (count == cap) {
            Entry *more = realloc(entries, (cap = cap ? 2 * cap : 64) * sizeof *entries);
            if (!more)
                break;
            entries = more;
        }
        snprintf(entries[count].name, sizeof entries[count].name, "%s", e->d_name);
        entries[count].size = st.st_size;
        entries[count++].used = st.st_mtim;
        total += st.st_size;
    }
    closedir(d);
    long long limit = size_limit();
    if (total > limit) {
        qsort(entries, count, sizeof *entries, used_earlier);
        for (size_t i = 0; i < count && total > limit / 4 * 3; i++) {
            char path[PATH_MAX + 80];
            snprintf(path, sizeof path, "%s/%s", dir, entries[i].name);
            if (strcmp(path, keep) != 0 && unlink(path) == 0)
                total -= entries[i].size;
        }
    }
    free(entries);
    if (lock >= 0)
        close(lock);
}

void cache_put(const char *path, const char *data, size_t len) {
    char temp[PATH_MAX + 32];
    snprintf(temp, sizeof temp, "%s.%d", path, (int)getpid());
    unsigned char header[HEADER];
    uint64_t n = len;
    memcpy(header, magic, 16);
    memcpy(header + 16, &n, 8);
    ddp_sha256 h;
    ddp_sha256_init(&h);
    ddp_sha256_update(&h, data, len);
    ddp_sha256_final(&h, header + 24);
    FILE *f = fopen(temp, "wb");
    bool ok = f && fwrite(header, 1, HEADER, f) == HEADER && fwrite(data, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok || rename(temp, path) != 0) {
        unlink(temp);
        return;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    trim(dir, path);
}
