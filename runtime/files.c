/* files.c: files written whole or not at all.
 *
 * Every file a run leaves (parameters, checkpoints, predictions, profiles, traces, the
 * run folder's notes) is written to a temporary file beside its target, synced and
 * renamed over it: a reader, or a run after a crash, sees the old file or the whole
 * new one, never part of one. A durable write syncs the folder too, so that the rename
 * itself survives the machine's crash. A signal that ends the process (Ctrl-C while it
 * evaluates, SIGTERM while it saves) removes the temporary files being written first,
 * so that nothing is left beside the targets. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

/* A test's crash at a named point of a write (DDP_CRASH_AT=NAME): the process ends
 * there, as a node that loses power would, so the tests can show what survives; or
 * (NAME:INT, :TERM, :HUP, :USR1) it raises that signal there, as a user's Ctrl-C or a
 * scheduler's signal could, arriving at that moment. */
void ddp_crash_point(const char *name) {
    static const struct {
        const char *name;
        int sig;
    } signals[] = {{"INT", SIGINT}, {"TERM", SIGTERM}, {"HUP", SIGHUP}, {"USR1", SIGUSR1}};
    const char *at = getenv("DDP_CRASH_AT");
    size_t n = strlen(name);
    if (!at || strncmp(at, name, n) != 0 || (at[n] && at[n] != ':'))
        return;
    for (size_t i = 0; at[n] && i < sizeof signals / sizeof *signals; i++)
        if (strcmp(at + n + 1, signals[i].name) == 0) {
            fprintf(stderr, "raising SIG%s at %s (DDP_CRASH_AT)\n", signals[i].name, name);
            raise(signals[i].sig);
            return;
        }
    if (at[n])
        fprintf(stderr, "DDP_CRASH_AT=%s: `%s` is not INT, TERM, HUP or USR1; crashing there instead\n", at,
                at + n + 1);
    fprintf(stderr, "crashing at %s (DDP_CRASH_AT)\n", name);
    _exit(9);
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

/* ------------------------------------------- temporary files at a fatal signal */

/* The temporary files being written (their owners' buffers), read by the handler. */
enum { UNFINISHED_MAX = 64 };
static const char *volatile unfinished[UNFINISHED_MAX];
static pthread_mutex_t unfinished_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_unfinished(const char *tmp) {
    pthread_mutex_lock(&unfinished_lock);
    for (int i = 0; i < UNFINISHED_MAX; i++) /* more at once than that: left unremoved */
        if (!unfinished[i]) {
            unfinished[i] = tmp;
            break;
        }
    pthread_mutex_unlock(&unfinished_lock);
}

static void forget_unfinished(const char *tmp) {
    pthread_mutex_lock(&unfinished_lock);
    for (int i = 0; i < UNFINISHED_MAX; i++)
        if (unfinished[i] == tmp)
            unfinished[i] = NULL;
    pthread_mutex_unlock(&unfinished_lock);
}

void ddp_end_by_signal(int sig) {
    for (int i = 0; i < UNFINISHED_MAX; i++) {
        const char *tmp = unfinished[i];
        if (tmp)
            unlink(tmp);
    }
    signal(sig, SIG_DFL);
    raise(sig); /* the process ends as the signal ends it, with its status */
}

void ddp_remove_unfinished_on_signals(void) {
    static const int fatal[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) {
        struct sigaction was;
        if (sigaction(fatal[i], NULL, &was) != 0 || was.sa_handler != SIG_DFL)
            continue; /* ignored (a background job's SIGINT) or handled: left as it is */
        struct sigaction sa = {.sa_handler = ddp_end_by_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(fatal[i], &sa, NULL);
    }
}

/* --------------------------------------------------------------- replacement */

bool ddp_replace_open(ddp_replacement *w, const char *path, char *err, size_t len) {
    w->path = path;
    w->f = NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) /* found now, not at the rename after the work */
        return ddp_fail(err, len, "%s: cannot write: it is a folder; name a file", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", path, (long)getpid());
    note_unfinished(w->tmp);
    w->f = fopen(w->tmp, "wb");
    if (w->f)
        return true;
    forget_unfinished(w->tmp);
    return ddp_fail(err, len, "%s: cannot write: %s", path, strerror(errno));
}

void ddp_replace_abandon(ddp_replacement *w) {
    if (!w->f)
        return;
    fclose(w->f);
    w->f = NULL;
    unlink(w->tmp);
    forget_unfinished(w->tmp);
}

bool ddp_replace_commit(ddp_replacement *w, bool durable, char *err, size_t len) {
    bool ok = !ferror(w->f) && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    int saved = errno;
    ok = fclose(w->f) == 0 && ok;
    w->f = NULL;
    if (ok)
        ddp_crash_point("before-rename");
    bool renamed = ok && rename(w->tmp, w->path) == 0;
    if (!renamed) {
        if (ok || !saved)
            saved = errno;
        unlink(w->tmp);
        forget_unfinished(w->tmp);
        return ddp_fail(err, len, "%s: cannot write: %s (the file, if any, is as it was)", w->path,
                        strerror(saved ? saved : EIO));
    }
    forget_unfinished(w->tmp);
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
