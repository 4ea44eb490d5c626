/* source.c: reading source files and finding imports on the search path.
 *
 * `import "std/resnet"` names a file without its `.ddp`. Search order: the importing
 * file's folder (for imports not under std/), each -I folder in order, then the
 * standard library folder, where `std/x` is `x.ddp`. */
#include "ddpc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static SourceFile *source_add(Ddpc *c, const char *path, const char *real, char *text,
                              size_t len, bool imported) {
    SourceFile *f = arena_alloc(c->arena, sizeof *f);
    f->path = arena_strdup(c->arena, path);
    f->realpath = arena_strdup(c->arena, real);
    f->text = text;
    f->len = len;
    f->imported = imported;
    vec_push(c->arena, &c->files, f);
    return f;
}

/* Reads the whole file into the arena, NUL-terminated (the lexer's sentinel). */
SourceFile *source_load(Ddpc *c, const char *path, bool imported, const char **why) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        *why = S_ISDIR(st.st_mode) ? "it is a directory" : strerror(errno);
        close(fd);
        return NULL;
    }
    if (st.st_size > MAX_SOURCE_BYTES) {
        *why = arena_printf(c->arena, "it is larger than the %d MiB a source file may have",
                            MAX_SOURCE_BYTES >> 20);
        close(fd);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *text = arena_alloc(c->arena, cap + 1);
    for (;;) {
        ssize_t n = read(fd, text + len, cap - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            *why = strerror(errno);
            close(fd);
            return NULL;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len == cap) { /* the file grew while we read it, or is a pipe */
            if (cap > MAX_SOURCE_BYTES) {
                *why = "it is too large";
                close(fd);
                return NULL;
            }
            char *bigger = arena_alloc(c->arena, cap * 2 + 1);
            memcpy(bigger, text, len);
            text = bigger;
            cap *= 2;
        }
    }
    close(fd);
    text[len] = '\0';
    char real[PATH_MAX];
    const char *r = realpath(path, real) ? real : path;
    return source_add(c, path, r, text, len, imported);
}

SourceFile *source_from_memory(Ddpc *c, const char *name, const char *data, size_t len) {
    char *text = arena_alloc(c->arena, len + 1);
    memcpy(text, data, len);
    text[len] = '\0';
    return source_add(c, name, name, text, len, false);
}

static bool is_readable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, R_OK) == 0;
}

static const char *dir_of(Ddpc *c, const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        return ".";
    if (slash == path)
        return "/";
    return arena_strndup(c->arena, path, (size_t)(slash - path));
}

static const char *join(Ddpc *c, const char *dir, const char *name) {
    if (strcmp(dir, ".") == 0)
        return name;
    size_t n = strlen(dir);
    return arena_printf(c->arena, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
}

/* Returns the path of the file an import names, or NULL when none is found. */
const char *source_find_import(Ddpc *c, SourceFile *from, const char *name) {
    size_t n = strlen(name);
    const char *file = n > 4 && strcmp(name + n - 4, ".ddp") == 0
                           ? name : arena_printf(c->arena, "%s.ddp", name);
    if (file[0] == '/')
        return is_readable_file(file) ? file : NULL;
    bool is_std = strncmp(file, "std/", 4) == 0;
    if (!is_std) {
        const char *p = join(c, dir_of(c, from->path), file);
        if (is_readable_file(p))
            return p;
    }
    for (int i = 0; i < c->ninclude_dirs; i++) {
        const char *p = join(c, c->include_dirs[i], file);
        if (is_readable_file(p))
            return p;
    }
    if (is_std && c->stdlib_dir) {
        const char *p = join(c, c->stdlib_dir, file + 4);
        if (is_readable_file(p))
            return p;
    }
    return NULL;
}

static bool exists(const char *path, bool folder) {
    struct stat st;
    return path && *path && stat(path, &st) == 0 && (folder ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

const char *find_installed(const char *env, const char *relative, const char *install_path,
                           const char *tree_path, bool folder) {
    const char *e = getenv(env);
    if (e && *e)
        return e;
    static char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - strlen(relative) - 2);
    if (n > 0) {
        path[n] = '\0';
        char *slash = strrchr(path, '/');
        if (slash) {
            strcpy(slash + 1, relative);
            if (exists(path, folder))
                return path;
        }
    }
    if (exists(install_path, folder))
        return install_path;
    return exists(tree_path, folder) ? tree_path : NULL;
}
