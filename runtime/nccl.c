/* nccl.c: the gradients' sums between GPUs through NCCL, loaded at run time
 * (libnccl.so.2: DDP_NCCL_LIBRARY, else searched as cuBLAS and cuDNN are), and the
 * watchdog that makes a lost peer end the job instead of hanging it (S12).
 *
 * One communicator for the job: rank 0 makes its unique id and hands it to the others
 * through the coordinator's store. The communicator is non-blocking: a call may answer
 * ncclInProgress, and the host then polls the communicator; it never blocks in NCCL.
 * Each collective is queued on the communication stream between two events (begun,
 * ended). A watchdog thread watches those events, the communicator's asynchronous
 * error and the coordinator's news of a lost or frozen worker, and aborts the
 * communicator (ncclCommAbort) when a worker is lost, NCCL reports an error, or a
 * collective has run (or a call stayed in progress) longer than the peer timeout; if
 * the abort does not return within a grace period the process ends with status 3.
 * Whatever waited for the collective then fails with the reason, which names the
 * collective and the step, and the worker ends with status 3.
 *
 * NCCL's own environment variables (NCCL_DEBUG, NCCL_SOCKET_IFNAME, ...) reach it
 * untouched; it never sees proxies (S15): it makes its own connections. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conv.h"
#include "device.h"
#include "nccl_api.h"
#include "runtime.h"

enum { WATCH_MS = 20, ABORT_GRACE_MS = 5000 };

static struct {
#define POINTER(name, args) ncclResult_t(*name) args;
    DDP_NCCL_CALLS(POINTER)
#undef POINTER
    const char *(*ncclGetErrorString)(ncclResult_t);
    const char *(*ncclGetLastError)(ncclComm_t);
    void *library;
    bool standin;               /* the tests' stand-in, which serves the emulated device only */
    char about[1200];           /* "NCCL 2.28.9 (PATH)" */
} nc;

/* A collective the watchdog follows, from its queueing to its end. */
typedef struct Watched {
    int64_t step, bucket, nbuckets;
    double started_ms;          /* when its begun event was first seen done; 0 before */
} Watched;

struct ddp_nccl {
    ncclComm_t comm;
    ddp_device *device;
    void *stream;               /* the communication stream's native handle */
    int stream_index;
    ddp_link *link;
    int rank, world;
    double timeout_ms;
    pthread_t watchdog;
    bool watching;
    pthread_mutex_t lock;
    Watched queued[DDP_MAX_BUCKET_EVENTS]; /* this step's, in the order queued */
    int nqueued, first_unended;
    double calling_ms;          /* a call answered ncclInProgress at this time; 0: none */
    Watched calling;
    bool failed, stop;
    char why[2048];
    int64_t test_abort_step;    /* DDP_TEST_NCCL_ABORT: the step (from 1) whose collective is aborted; 0 none */
    bool test_abort_due;        /* that collective is being called: the watchdog aborts it */
};

/* ------------------------------------------------------------ the library */

static const char *result_name(ncclResult_t r) {
    if (nc.ncclGetErrorString)
        return nc.ncclGetErrorString(r);
    static const char *const names[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
                                        "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage",
                                        "ncclRemoteError", "ncclInProgress"};
    return r >= 0 && r < ncclNumResults ? names[r] : "an unknown NCCL result";
}

/* NCCL's last words on a failure, where it has any. */
static const char *last_error(ncclComm_t comm) {
    const char *text = nc.ncclGetLastError ? nc.ncclGetLastError(comm) : NULL;
    return text && *text ? text : "no detail given";
}

static void *open_library(char *path, size_t pathlen, char *err, size_t len) {
    char tried[2048] = "";
    void *library = ddp_cuda_library_chosen("DDP_NCCL_LIBRARY", "NCCL", "libnccl.so.2", "nccl", path, pathlen, tried,
                                            sizeof tried, err, len);
    if (!library && !err[0])
        ddp_fail(err, len, "NCCL (libnccl.so.2) is not installed where CUDA's libraries are searched (%s): install "
                           "it (apt install libnccl2, or pip install nvidia-nccl-cu12), or set communication = ring",
                 tried);
    return library;
}

static bool load_library(char *err, size_t len);

/* Loaded once, whichever thread asks first. */
bool ddp_nccl_load(const char *backend, char *about, size_t aboutlen, char *err, size_t len) {
    static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&loading);
    bool ok = load_library(err, len);
    pthread_mutex_unlock(&loading);
    if (!ok)
        return false;
    bool emulated = strcmp(backend, "emulated") == 0;
    if (emulated && !nc.standin)
        return ddp_fail(err, len, "%s serves real GPUs, not the emulated device: set DDP_NCCL_LIBRARY to the tests' "
                                  "stand-in NCCL, or communication = ring", nc.about);
    if (!emulated && nc.standin)
        return ddp_fail(err, len, "%s serves only the emulated device, not a real GPU: point DDP_NCCL_LIBRARY or "
                                  "the library search at NCCL itself", nc.about);
    snprintf(about, aboutlen, "%s", nc.about);
    return true;
}

static bool load_library(char *err, size_t len) {
    if (!nc.library) {
        char path[1024];
        void *library = open_library(path, sizeof path, err, len);
        if (!library)
            return false;
#define RESOLVE(name, args)                                                                                  \
    if (!(*(void **)&nc.name = dlsym(library, #name))) {                                                     \
        ddp_fail(err, len, "NCCL %s lacks %s: it is older than 2.18; install a newer NCCL", path, #name);      \
        dlclose(library);                                                                                    \
        return false;                                                                                        \
    }
        DDP_NCCL_CALLS(RESOLVE)
#undef RESOLVE
        *(void **)&nc.ncclGetErrorString = dlsym(library, "ncclGetErrorString");
        *(void **)&nc.ncclGetLastError = dlsym(library, "ncclGetLastError");
        nc.standin = dlsym(library, DDP_STANDIN_NCCL_SYMBOL) != NULL;
        int version = 0;
        nc.ncclGetVersion(&version);
        if (version < 21800) {
            ddp_fail(err, len, "NCCL %s is version %d, older than 2.18 (21800): install a newer NCCL", path, version);
            dlclose(library);
            return false;
        }
        snprintf(nc.about, sizeof nc.about, "%sNCCL %d.%d.%d (%.1000s)", nc.standin ? "the stand-in " : "",
                 version / 10000, version / 100 % 100, version % 100, path);
        nc.library = library;
    }
    return true;
}

/* ------------------------------------------------------------- messages */

static void watched_text(const Watched *w, char *out, size_t len) {
    if (w->bucket < 0)
        snprintf(out, len, "the forming of the communicator");
    else if (w->nbuckets > 0)
        snprintf(out, len, "the all-reduce of gradient bucket %lld of %lld in step %lld", (long long)w->bucket + 1,
                 (long long)w->nbuckets, (long long)w->step + 1);
    else
        snprintf(out, len, "no collective (between steps)");
}

/* The collective the communicator is at: the first queued that has not ended, else
 * the last (the watchdog's lock held). */
static const Watched *current(const ddp_nccl *n) {
    static const Watched none = {0, 0, 0, 0};
    if (n->calling_ms > 0)
        return &n->calling;
    if (n->nqueued == 0)
        return &none;
    return &n->queued[n->first_unended < n->nqueued ? n->first_unended : n->nqueued - 1];
}

/* ---------------------------------------------------------------- the abort */

static void *run_abort(void *arg) {
    ddp_nccl *n = arg;
    nc.ncclCommAbort(n->comm);
    pthread_mutex_lock(&n->lock);
    n->stop = true;             /* the abort is over: the watchdog may go */
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

/* The communicator aborted for `reason` (the lock held on entry and on return). A
 * hung abort (a GPU that no longer answers) must not hang the job: after the grace
 * period the process ends with status 3, as a lost worker's peers do. */
static void abort_comm(ddp_nccl *n, const char *reason) {
    if (n->failed) /* the other thread is at it */
        return;
    char what[256];
    watched_text(current(n), what, sizeof what);
    snprintf(n->why, sizeof n->why, "NCCL, during %.250s: %.1500s; the communicator was aborted", what, reason);
    n->failed = true;
    pthread_t aborter;
    pthread_mutex_unlock(&n->lock);
    bool started = pthread_create(&aborter, NULL, run_abort, n) == 0;
    double deadline = ddp_now_ms() + ABORT_GRACE_MS;
    /* a peer's loss told meanwhile must not end the process first, saying this worker
     * did not reach a collective: the hung abort is the news (the two waits are equal) */
    ddp_link_defer(n->link, deadline + 1000);
    bool over = !started;
    while (!over && ddp_now_ms() < deadline) {
        usleep(WATCH_MS * 1000);
        pthread_mutex_lock(&n->lock);
        over = n->stop;
        pthread_mutex_unlock(&n->lock);
    }
    if (!over) {
        ddp_error("%s; ncclCommAbort did not return within %d s: exiting", n->why, ABORT_GRACE_MS / 1000);
        _exit(ddp_link_lost_status(n->link)); /* 3, or the status of the worker whose error began it */
    }
    if (started)
        pthread_join(aborter, NULL);
    pthread_mutex_lock(&n->lock);
}

/* ------------------------------------------------------------- the watchdog */

/* Why the communicator must be aborted now, or false (the lock held). */
static bool abort_reason(ddp_nccl *n, char *reason, size_t len) {
    char lost[1536];
    if (ddp_link_lost(n->link, NULL, lost, sizeof lost))
        return snprintf(reason, len, "%s", lost) > 0;
    ncclResult_t state = ncclSuccess;
    if (nc.ncclCommGetAsyncError(n->comm, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
        return snprintf(reason, len, "NCCL reported %s (%s)", result_name(state), last_error(n->comm)) > 0;
    if (n->test_abort_due)
        return snprintf(reason, len, "DDP_TEST_NCCL_ABORT=%lld asked for this abort", (long long)n->test_abort_step) > 0;
    double now = ddp_now_ms();
    if (n->calling_ms > 0 && now - n->calling_ms > n->timeout_ms)
        return snprintf(reason, len, "NCCL's call stayed in progress (ncclInProgress) longer than the peer timeout "
                                     "(%.0f s)", n->timeout_ms / 1000) > 0;
    while (n->first_unended < n->nqueued) {
        Watched *w = &n->queued[n->first_unended];
        int b = (int)w->bucket;
        int begun = n->device->ops->event_done(n->device, DDP_BUCKET_EVENT(b, false));
        int ended = n->device->ops->event_done(n->device, DDP_BUCKET_EVENT(b, true));
        if (begun < 0 || ended < 0)
            return snprintf(reason, len, "the GPU failed (its events cannot be read)") > 0;
        if (ended) {
            n->first_unended++;
            continue;
        }
        if (begun && w->started_ms == 0)
            w->started_ms = now;
        if (w->started_ms > 0 && now - w->started_ms > n->timeout_ms)
            return snprintf(reason, len, "it did not end within the peer timeout (%.0f s): a worker stopped taking "
                                         "part", n->timeout_ms / 1000) > 0;
        break;
    }
    return false;
}

/* A reason found, the coordinator's word on a lost worker is awaited a moment and
 * preferred: the peers' collectives stall because one worker died, and its name is
 * what the user needs. */
static void prefer_coordinator(ddp_nccl *n, char *reason, size_t len) {
    char lost[1536];
    int wake = ddp_link_wake_fd(n->link);
    if (wake < 0 || strncmp(reason, "lost rank", 9) == 0)
        return;
    pthread_mutex_unlock(&n->lock);
    struct pollfd p = {.fd = wake, .events = POLLIN};
    poll(&p, 1, 2000);
    pthread_mutex_lock(&n->lock);
    if (ddp_link_lost(n->link, NULL, lost, sizeof lost)) {
        size_t at = strlen(reason);
        snprintf(reason + at, len - at, " (%s)", lost);
    }
}

static void *watch(void *arg) {
    ddp_nccl *n = arg;
    pthread_setname_np(pthread_self(), "ddp-nccl-watch");
    pthread_mutex_lock(&n->lock);
    while (!n->stop) {
        char reason[1700];
        if (abort_reason(n, reason, sizeof reason)) {
            prefer_coordinator(n, reason, sizeof reason);
            abort_comm(n, reason);
            break;
        }
        pthread_mutex_unlock(&n->lock);
        usleep(WATCH_MS * 1000);
        pthread_mutex_lock(&n->lock);
    }
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

/* --------------------------------------------------------------- the calls */

/* A non-blocking call's answer followed to its end: ncclInProgress polled (the watchdog
 * timing it) until the communicator says success or fails; false with why. */
static bool settle(ddp_nccl *n, ncclResult_t r, const Watched *what, const char *doing, char *err, size_t len) {
    if (r != ncclSuccess && r != ncclInProgress) {
        /* refused because the communicator failed (a peer's error): aborted now, as the
         * watchdog would, and the worker ends as one whose peer was lost, named as the
         * watchdog names it where the coordinator knows it (a killed peer's broken
         * connection may reach NCCL before the coordinator's word reaches this worker) */
        ncclResult_t state = ncclSuccess;
        pthread_mutex_lock(&n->lock);
        if (!n->failed && n->comm && nc.ncclCommGetAsyncError(n->comm, &state) == ncclSuccess &&
            state != ncclSuccess && state != ncclInProgress) {
            char reason[1700];
            snprintf(reason, sizeof reason, "NCCL reported %s (%s)", result_name(state), last_error(n->comm));
            prefer_coordinator(n, reason, sizeof reason);
            if (!n->failed) { /* the watchdog may have aborted while the coordinator was awaited */
                n->calling = *what;
                n->calling_ms = ddp_now_ms();
                abort_comm(n, reason);
                n->calling_ms = 0;
            }
        }
        bool aborted = n->failed;
        pthread_mutex_unlock(&n->lock);
        if (aborted)
            return ddp_nccl_failed(n, err, len);
        return ddp_fail(err, len, "NCCL, %s: %s (%s)", doing, result_name(r), last_error(n->comm));
    }
    pthread_mutex_lock(&n->lock);
    n->calling = *what;
    n->calling_ms = ddp_now_ms();
    pthread_mutex_unlock(&n->lock);
    ncclResult_t state = ncclInProgress;
    /* the watchdog aborts first; this backstop serves when it no longer runs (the end) */
    double backstop = ddp_now_ms() + n->timeout_ms + ABORT_GRACE_MS;
    for (;;) {
        pthread_mutex_lock(&n->lock);
        bool aborted = n->failed;
        pthread_mutex_unlock(&n->lock);
        if (aborted || ddp_now_ms() > backstop)
            break;
        if ((r = nc.ncclCommGetAsyncError(n->comm, &state)) != ncclSuccess || state != ncclInProgress)
            break;
        usleep(200);
    }
    pthread_mutex_lock(&n->lock);
    n->calling_ms = 0;
    bool aborted = n->failed;
    pthread_mutex_unlock(&n->lock);
    if (aborted)
        return ddp_nccl_failed(n, err, len);
    if (r != ncclSuccess)
        state = r;
    return state == ncclSuccess ||
           ddp_fail(err, len, "NCCL, %s: %s (%s)", doing, result_name(state), last_error(n->comm));
}

/* DDP_TEST_NCCL_ABORT: the watchdog told to abort the collective being called, which
 * waits for it (the abort and the watchdog's thread seen through as a fault would). */
static bool test_abort(ddp_nccl *n, const Watched *w, char *err, size_t len) {
    pthread_mutex_lock(&n->lock);
    n->calling = *w;
    n->calling_ms = ddp_now_ms();
    n->test_abort_due = true;
    pthread_mutex_unlock(&n->lock);
    for (double deadline = ddp_now_ms() + 2.0 * ABORT_GRACE_MS; ddp_now_ms() < deadline; usleep(1000))
        if (ddp_nccl_failed(n, err, len))
            return false;
    return ddp_fail(err, len, "DDP_TEST_NCCL_ABORT: the watchdog did not abort the communicator");
}

/* The unique id: made by rank 0, read by the others from the coordinator's store. */
static bool share_id(const ddp_nccl_config *c, ncclUniqueId *id, char *err, size_t len) {
    if (c->rank == 0) {
        ncclResult_t r = nc.ncclGetUniqueId(id);
        if (r != ncclSuccess)
            return ddp_fail(err, len, "NCCL cannot make the communicator's id: %s (%s)", result_name(r),
                            last_error(NULL));
        return c->world == 1 || ddp_link_set(c->link, "nccl-id", id, sizeof *id, err, len);
    }
    ddp_frame f;
    if (!ddp_link_get(c->link, "nccl-id", &f, c->rendezvous_timeout_s, err, len))
        return false;
    bool ok = f.len == sizeof *id ||
              ddp_fail(err, len, "the NCCL id from rank 0 has %zu bytes, not %zu", f.len, sizeof *id);
    if (ok)
        memcpy(id, f.data, sizeof *id);
    ddp_frame_free(&f);
    return ok;
}

/* DDP_TEST_NCCL_ABORT=STEP, the tests' way to see the abort through on a real NCCL,
 * which injects no faults: the step (from 1), or 0 (none, said when it is no step). */
static int64_t test_abort_step(void) {
    const char *v = getenv("DDP_TEST_NCCL_ABORT");
    if (!v)
        return 0;
    char *end;
    long long step = strtoll(v, &end, 10);
    if (end == v || *end || step < 1) {
        ddp_error("warning: DDP_TEST_NCCL_ABORT=%s is not a step (from 1); no abort", v);
        return 0;
    }
    return step;
}

ddp_nccl *ddp_nccl_open(const ddp_nccl_config *c, char *err, size_t len) {
    ddp_nccl *n = calloc(1, sizeof *n);
    if (!n) {
        ddp_fail(err, len, "out of memory");
        return NULL;
    }
    *n = (ddp_nccl){.device = c->device, .stream_index = c->stream, .link = c->link, .rank = c->rank,
                    .world = c->world, .timeout_ms = c->peer_timeout_s * 1000.0};
    n->stream = c->device->ops->native_stream(c->device, c->stream);
    n->test_abort_step = test_abort_step();
    pthread_mutex_init(&n->lock, NULL);
    ncclUniqueId id;
    ncclConfig_t config = {sizeof config, DDP_NCCL_CONFIG_MAGIC, DDP_NCCL_CONFIG_VERSION, 0 /* non-blocking */,
                           DDP_NCCL_CONFIG_UNDEF_INT, DDP_NCCL_CONFIG_UNDEF_INT, DDP_NCCL_CONFIG_UNDEF_INT, NULL,
                           DDP_NCCL_CONFIG_UNDEF_INT};
    Watched forming = {-1, 0, 0, 0};
    n->timeout_ms = c->rendezvous_timeout_s * 1000.0; /* forming the communicator is a rendezvous */
    bool ok = share_id(c, &id, err, len);
    ncclResult_t r = ncclSuccess;
    if (ok)
        r = nc.ncclCommInitRankConfig(&n->comm, c->world, id, c->rank, &config);
    if (ok && n->comm)
        ok = (n->watching = pthread_create(&n->watchdog, NULL, watch, n) == 0) ||
             ddp_fail(err, len, "cannot start NCCL's watchdog thread");
    if (ok)
        ok = settle(n, r, &forming, "forming the communicator", err, len);
    pthread_mutex_lock(&n->lock);
    n->timeout_ms = c->peer_timeout_s * 1000.0;
    pthread_mutex_unlock(&n->lock);
    if (!ok) {
        ddp_nccl_close(n);
        return NULL;
    }
    return n;
}

void ddp_nccl_begin_step(ddp_nccl *n) {
    pthread_mutex_lock(&n->lock);
    n->nqueued = n->first_unended = 0;
    pthread_mutex_unlock(&n->lock);
}

bool ddp_nccl_allreduce(ddp_nccl *n, uint64_t data, int64_t count, int64_t dtype, int64_t bucket, int64_t nbuckets,
                        int64_t step, char *err, size_t len) {
    ddp_device *d = n->device;
    if (bucket < 0 || bucket >= DDP_MAX_BUCKET_EVENTS)
        return ddp_fail(err, len, "NCCL: gradient bucket %lld has no events (at most %d)", (long long)bucket,
                        DDP_MAX_BUCKET_EVENTS);
    pthread_mutex_lock(&n->lock);
    bool full = n->nqueued == DDP_MAX_BUCKET_EVENTS, aborted = n->failed;
    Watched w = {step, bucket, nbuckets, 0};
    if (!full && !aborted)
        n->queued[n->nqueued++] = w;
    pthread_mutex_unlock(&n->lock);
    if (aborted)
        return ddp_nccl_failed(n, err, len);
    if (full)
        return ddp_fail(err, len, "NCCL: more than %d collectives in a step", DDP_MAX_BUCKET_EVENTS);
    char doing[256];
    watched_text(&w, doing, sizeof doing);
    if (n->test_abort_step > 0 && step + 1 >= n->test_abort_step)
        return test_abort(n, &w, err, len);
    if (!d->ops->record(d, n->stream_index, DDP_BUCKET_EVENT(bucket, false)))
        return ddp_fail(err, len, "%s: %s", doing, d->error);
    void *p = (void *)(uintptr_t)data;
    ncclDataType_t type = dtype == DDP_F64 ? ncclFloat64 : dtype == DDP_BF16 ? ncclBfloat16 : ncclFloat32;
    ncclResult_t r = nc.ncclAllReduce(p, p, (size_t)count, type, ncclSum, n->comm, n->stream);
    if (!settle(n, r, &w, doing, err, len))
        return false;
    return d->ops->record(d, n->stream_index, DDP_BUCKET_EVENT(bucket, true)) ||
           ddp_fail(err, len, "%s: %s", doing, d->error);
}

bool ddp_nccl_failed(ddp_nccl *n, char *why, size_t len) {
    if (!n)
        return false;
    pthread_mutex_lock(&n->lock);
    bool failed = n->failed;
    if (failed && why)
        snprintf(why, len, "%s", n->why);
    pthread_mutex_unlock(&n->lock);
    return failed;
}

void ddp_nccl_close(ddp_nccl *n) {
    if (!n)
        return;
    pthread_mutex_lock(&n->lock);
    bool failed = n->failed;
    n->stop = !failed || n->stop; /* a watchdog aborting goes on until the abort is over */
    pthread_mutex_unlock(&n->lock);
    if (n->watching)
        pthread_join(n->watchdog, NULL);
    if (n->comm && !failed) {
        /* a clean end: every collective is over once the device has run its work */
        char err[256];
        Watched none = {0, 0, 0, 0};
        ncclResult_t r = nc.ncclCommFinalize(n->comm);
        if (settle(n, r, &none, "finishing the communicator", err, sizeof err))
            nc.ncclCommDestroy(n->comm);
        else
            nc.ncclCommAbort(n->comm);
    }
    pthread_mutex_destroy(&n->lock);
    free(n);
}
