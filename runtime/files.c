/* files.c: files written whole or not at all.
 *
 * Every file a run leaves (parameters, checkpoints, predictions, profiles, the run
 * folder's notes) is written to a temporary file beside its target, synced and renamed
 * over it: a reader, or a run after a crash, sees the old file or the whole new one,
 * never part of one. A durable write syncs the folder too, so that the rename itself
 * survives the machine's crash. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

/* A test's crash at a named point of a write (DDP_CRASH_AT): the process ends there, as
 * a node that loses power would, so the tests can show what survives. */
void ddp_crash_point(const char *name) {
    const char *at = getenv("DDP_CRASH_AT");
    if (at && strcmp(at, name) == 0) {
        fprintf(stderr, "crashing at %s (DDP_CRASH_AT)\n", name);
        _exit(9);
    }
}

bool ddp_sync_folder(const char *path) {
    char folder[4096];
    snprintf(folder, sizeof folder, "%s", path);
    char *slash = strrchr(folder, '/');
    if (!slash)
        snprintf(folder, sizeof folder, ".");
    else if (slash == folder)
        folder[1] = 0;
    else
        *slash = 0;
    int fd = open(folder, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return false;
    bool ok = fsync(fd) == 0;
    close(fd);
    return ok;
}

bool ddp_replace_open(ddp_replacement *w, const char *path, char *err, size_t len) {
    w->path = path;
    w->f = NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) /* found now, not at the rename after the work */
        return ddp_fail(err, len, "%s: cannot write: it is a folder; name a file", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    return w->f || ddp_fail(err, len, "%s: cannot write: %s", path, strerror(errno));
}

void ddp_replace_abandon(ddp_replacement *w) {
    if (!w->f)
        return;
    fclose(w->f);
    w->f = NULL;
    unlink(w->tmp);
}

bool ddp_replace_commit(ddp_replacement *w, bool durable, char *err, size_t len) {
    bool ok = !ferror(w->f) && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    int saved = errno;
    ok = fclose(w->f) == 0 && ok;
    w->f = NULL;
    if (ok)
        ddp_crash_point("before-rename");
    if (!ok || rename(w->tmp, w->path) != 0) {
        if (ok || !saved)
            saved = errno;
        unlink(w->tmp);
        return ddp_fail(err, len, "%s: cannot write: %s (the file, if any, is as it was)", w->path,
                        strerror(saved ? saved : EIO));
    }
    if (durable) {
        ddp_crash_point("before-folder-sync");
        if (!ddp_sync_folder(w->path))
            return ddp_fail(err, len, "%s: written, but its folder cannot be synced: %s", w->path, strerror(errno));
    }
    return true;
}

bool ddp_replace_possible(const char *path, char *err, size_t len) {
    ddp_replacement w;
    if (!ddp_replace_open(&w, path, err, len))
        return false;
    ddp_replace_abandon(&w);
    return true;
}

bool ddp_write_text(const char *path, const char *text, char *err, size_t len) {
    ddp_replacement w;
    if (!ddp_replace_open(&w, path, err, len))
        return false;
    fputs(text, w.f);
    return ddp_replace_commit(&w, false, err, len);
}
