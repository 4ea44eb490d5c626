/* nccl_standin.c: the stand-in NCCL of tests/gpu/fake_nccl.c (argv[1]) held to what its
 * head comment says, with neither the runtime nor an emulated device: a stream of its
 * own here queues the work and runs it when the test synchronises, and a malloc'd arena
 * plays the device's memory. Three processes, forked once the id is made, add buffers
 * whose sum depends on the order (1e8 + 1 - 1e8 is 0 in float when added in rank order,
 * 1 otherwise) and must agree bit for bit; then the refusals, groups, each injected
 * fault, and the warning for a malformed one. Every child is bounded by alarm(), every
 * wait of the test by a deadline. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_api.h"
#include "standin_clock.h"

enum { RANKS = 3, BIG = 300000, SMALL = 1000, MAX_WORK = 16, RESULTS = 4, CHILD_SECONDS = 10 };
enum { ARENA_BYTES = 16 << 20 };
static const float SENTINEL = -7.0f;

/* ------------------------------------------------------------------ checks */

static int failures;
static char who[16] = "main";

static bool check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool check(bool ok, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    printf("%s %s: %s\n", ok ? "ok  " : "FAIL", who, text);
    failures += !ok;
    return ok;
}


static uint64_t fnv1a(const void *data, size_t bytes) {
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ------------------------------------------------------------- the library */

typedef struct Nccl {
#define FIELD(name, params) ncclResult_t(*name) params;
    DDP_NCCL_CALLS(FIELD)
    const char *(*ncclGetErrorString)(ncclResult_t);
    const char *(*ncclGetLastError)(ncclComm_t);
} Nccl;

static Nccl nccl;

static bool load(const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "nccl_standin: %s\n", dlerror());
        return false;
    }
    bool ok = check(dlsym(lib, DDP_STANDIN_NCCL_SYMBOL) != NULL, "the library defines %s", DDP_STANDIN_NCCL_SYMBOL);
#define LOAD(name, params)                                                                                   \
    if (!(nccl.name = (ncclResult_t(*) params)dlsym(lib, #name)))                                              \
        ok = check(false, "the library lacks %s", #name);
    DDP_NCCL_CALLS(LOAD)
    nccl.ncclGetErrorString = (const char *(*)(ncclResult_t))dlsym(lib, "ncclGetErrorString");
    nccl.ncclGetLastError = (const char *(*)(ncclComm_t))dlsym(lib, "ncclGetLastError");
    return check(ok && nccl.ncclGetErrorString && nccl.ncclGetLastError, "every call resolves");
}

static const char *result_name(ncclResult_t r) {
    static const char *const names[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
                                        "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage",
                                        "ncclRemoteError", "ncclInProgress"};
    return (unsigned)r < ncclNumResults ? names[r] : "(no result)";
}

static ncclResult_t state_of(ncclComm_t c) {
    ncclResult_t r = ncclNumResults;
    nccl.ncclCommGetAsyncError(c, &r);
    return r;
}

static const char *last_error(ncclComm_t c) {
    return nccl.ncclGetLastError(c);
}

static bool contains(const char *text, const char *part) {
    return text && strstr(text, part);
}

/* ------------------------------------------ a stream and device of the test's own */

typedef struct Work {
    void (*run)(void *);
    void *arg;
} Work;

typedef struct Stream {
    ddp_emulated_stream s; /* first: the stand-in is given &stream.s */
    Work work[MAX_WORK];
    int queued;
} Stream;

static char *arena;
static size_t arena_used;

static int enqueue(ddp_emulated_stream *s, void (*run)(void *arg), void *arg) {
    Stream *t = (Stream *)s;
    if (t->queued == MAX_WORK)
        return -1;
    t->work[t->queued++] = (Work){run, arg};
    return 0;
}

static int on_device(ddp_emulated_stream *s, const void *p, size_t bytes) {
    uintptr_t at = (uintptr_t)p, base = (uintptr_t)arena;
    (void)s;
    return at >= base && bytes <= arena_used && at - base <= arena_used - bytes;
}

static void open_stream(Stream *t) {
    *t = (Stream){.s = {DDP_EMULATED_STREAM_MAGIC, NULL, 0, enqueue, on_device}};
}

/* What the emulated device would do: run the stream's work, in order. */
static void synchronize(Stream *t) {
    for (int i = 0; i < t->queued; i++)
        t->work[i].run(t->work[i].arg);
    t->queued = 0;
}

static void *device_alloc(size_t bytes) {
    size_t at = (arena_used + 63) & ~(size_t)63;
    if (at + bytes > ARENA_BYTES) {
        fprintf(stderr, "nccl_standin: the device arena is too small\n");
        exit(2);
    }
    arena_used = at + bytes;
    return arena + at;
}

/* ------------------------------------------------------------------ values */

/* Rank r's element i: rank 0's and 2's cancel, rank 1's is lost in rank 0's when
 * added in rank order, not when added in another. */
static float f32_value(int rank, size_t i) {
    static const float base[RANKS] = {1e8f, 1.0f, -1e8f};
    return base[rank] * (float)(1 + i % 5) + (float)(i % 3) * 0.25f;
}

static double f64_value(int rank, size_t i) {
    static const double base[RANKS] = {1e17, 1.0, -1e17};
    return base[rank] * (double)(1 + i % 5) + (double)(i % 3) * 0.25;
}

static float f32_sum(int nranks, size_t i) {
    float sum = f32_value(0, i);
    for (int r = 1; r < nranks; r++)
        sum += f32_value(r, i);
    return sum;
}

static double f64_sum(int nranks, size_t i) {
    double sum = f64_value(0, i);
    for (int r = 1; r < nranks; r++)
        sum += f64_value(r, i);
    return sum;
}

static bool f32_sums(const float *x, size_t n, int nranks) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != f32_sum(nranks, i))
            return false;
    return true;
}

static bool f64_sums(const double *x, size_t n, int nranks) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != f64_sum(nranks, i))
            return false;
    return true;
}

static float *f32_buffer(int rank, size_t n) {
    float *x = device_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = f32_value(rank, i);
    return x;
}

static float *sentinel_buffer(size_t n) {
    float *x = device_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = SENTINEL;
    return x;
}

static bool untouched(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != SENTINEL)
            return false;
    return true;
}

static bool unchanged(const float *x, int rank, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != f32_value(rank, i))
            return false;
    return true;
}

/* ----------------------------------------------------------- communicators */

static ncclConfig_t config(int blocking) {
    return (ncclConfig_t){sizeof(ncclConfig_t), DDP_NCCL_CONFIG_MAGIC, DDP_NCCL_CONFIG_VERSION, blocking,
                          DDP_NCCL_CONFIG_UNDEF_INT, DDP_NCCL_CONFIG_UNDEF_INT, DDP_NCCL_CONFIG_UNDEF_INT, NULL,
                          DDP_NCCL_CONFIG_UNDEF_INT};
}

static ncclResult_t wait_connected(ncclComm_t c) {
    double deadline = now() + 5;
    ncclResult_t r;
    while ((r = state_of(c)) == ncclInProgress && now() < deadline)
        sleep_ms(5);
    return r;
}

/* Rank `rank` of a communicator: blocking 0 connects in the background. */
static ncclComm_t join(ncclUniqueId id, int nranks, int rank, int blocking) {
    ncclConfig_t cfg = config(blocking);
    ncclComm_t c = NULL;
    ncclResult_t r = nccl.ncclCommInitRankConfig(&c, nranks, id, rank, &cfg);
    if (blocking == 0) {
        check(r == ncclInProgress && c, "a non-blocking init returns ncclInProgress (%s)", result_name(r));
        r = c ? wait_connected(c) : r;
        check(r == ncclSuccess, "its asynchronous error becomes ncclSuccess (%s)", result_name(r));
    } else {
        check(r == ncclSuccess && c, "an init with blocking %d connects rank %d of %d (%s) %s", blocking, rank, nranks,
              result_name(r), r ? last_error(NULL) : "");
    }
    return r == ncclSuccess ? c : NULL;
}

/* A communicator of one rank, on an id of its own; only a failure is told. */
static ncclComm_t solo(void) {
    ncclUniqueId id;
    ncclConfig_t cfg = config(1);
    ncclComm_t c = NULL;
    ncclResult_t r = nccl.ncclGetUniqueId(&id);
    if (r == ncclSuccess)
        r = nccl.ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
    if (r != ncclSuccess)
        check(false, "a communicator of one rank (%s): %s", result_name(r), last_error(NULL));
    return c;
}

static ncclResult_t all_reduce_f32(const float *send, float *recv, size_t n, ncclComm_t c, Stream *t) {
    return nccl.ncclAllReduce(send, recv, n, ncclFloat32, ncclSum, c, &t->s);
}

static bool solo_all_reduce(ncclComm_t c) {
    Stream t;
    open_stream(&t);
    float *x = f32_buffer(0, SMALL);
    ncclResult_t r = all_reduce_f32(x, x, SMALL, c, &t);
    synchronize(&t);
    return r == ncclSuccess && f32_sums(x, SMALL, 1);
}

static bool finished(ncclComm_t c, char *text, size_t size) {
    ncclResult_t finalized = nccl.ncclCommFinalize(c), state = state_of(c), destroyed = nccl.ncclCommDestroy(c);
    snprintf(text, size, "ncclCommFinalize (%s), the asynchronous error after it (%s), ncclCommDestroy (%s)",
             result_name(finalized), result_name(state), result_name(destroyed));
    return finalized == ncclSuccess && state == ncclSuccess && destroyed == ncclSuccess;
}

static void finish(ncclComm_t c) {
    char text[256];
    bool ok = finished(c, text, sizeof text);
    check(ok, "%s", text);
}

/* --------------------------------------------------------------- children */

static uint64_t (*results)[RESULTS]; /* each rank's results' hashes, shared by the children */

static void become_child(const char *name, const char *fault, const char *debug) {
    failures = 0;
    snprintf(who, sizeof who, "%s", name);
    alarm(CHILD_SECONDS);
    if (fault)
        setenv("DDP_STANDIN_NCCL_FAULT", fault, 1);
    if (debug)
        setenv("NCCL_DEBUG", debug, 1), setenv("NCCL_SOCKET_IFNAME", "lo", 1);
}

static bool wait_child(pid_t pid, double deadline, int *status) {
    pid_t got;
    while ((got = waitpid(pid, status, WNOHANG)) == 0 && now() < deadline)
        sleep_ms(10);
    if (got == pid)
        return true;
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
    return false;
}

static bool ended_well(pid_t pid, double deadline) {
    int status = 0;
    return wait_child(pid, deadline, &status) && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Forks a process for each rank of ranks[], which runs fn on the id made here. */
static void run_ranks(const char *what, const int ranks[RANKS], void (*fn)(int rank, ncclUniqueId id),
                      const char *fault) {
    ncclUniqueId id;
    pid_t pids[RANKS];
    bool all_well = true;
    if (!check(nccl.ncclGetUniqueId(&id) == ncclSuccess, "%s: ncclGetUniqueId", what))
        return;
    fflush(stdout);
    for (int i = 0; i < RANKS; i++)
        if ((pids[i] = fork()) == 0) {
            char name[16];
            snprintf(name, sizeof name, "rank %d", ranks[i]);
            become_child(name, fault, NULL);
            fn(ranks[i], id);
            exit(failures ? 1 : 0);
        }
    double deadline = now() + CHILD_SECONDS + 2;
    for (int i = 0; i < RANKS; i++)
        all_well &= ended_well(pids[i], deadline);
    check(all_well, "%s: the %d processes ended well", what, RANKS);
}

/* Reads what fd gives until it ends or the deadline passes. */
static void read_until_end(int fd, char *text, size_t size, double deadline) {
    size_t used = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int wait = (int)((deadline - now()) * 1000);
        if (wait <= 0 || poll(&p, 1, wait) <= 0)
            break;
        ssize_t n = read(fd, text + used, size - 1 - used);
        if (n <= 0)
            break;
        used += n;
    }
    while (used > 0 && text[used - 1] == '\n')
        used--;
    text[used] = 0;
}

/* Runs fn in a child process, its stderr kept in err: true when it ended well. */
static bool run_captured(void (*fn)(void), const char *name, const char *fault, const char *debug, char *err,
                         size_t size) {
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return false;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 2);
        close(pipefd[1]);
        become_child(name, fault, debug);
        fn();
        exit(failures ? 1 : 0);
    }
    close(pipefd[1]);
    double deadline = now() + CHILD_SECONDS + 2;
    read_until_end(pipefd[0], err, size, deadline);
    close(pipefd[0]);
    return ended_well(pid, deadline);
}

/* ------------------------------------------------ three ranks: sums, refusals */

static void refusals(ncclComm_t c) {
    Stream t;
    open_stream(&t);
    float *device = device_alloc(64 * sizeof(float)), *host = malloc(64 * sizeof(float));
    ddp_emulated_stream cuda_stream = {0}; /* as a CUstream is: no emulated stream's magic */
    ncclResult_t r = all_reduce_f32(host, device, 16, c, &t);
    check(r == ncclInvalidArgument && contains(last_error(c), "host memory given as device memory"),
          "a host send buffer is refused (%s): %s", result_name(r), last_error(c));
    r = all_reduce_f32(device, host, 16, c, &t);
    check(r == ncclInvalidArgument && contains(last_error(c), "receive"), "a host receive buffer is refused: %s",
          last_error(c));
    r = nccl.ncclAllReduce(device, device, 16, ncclFloat32, ncclSum, c, &cuda_stream);
    check(r == ncclInvalidArgument && contains(last_error(c), "only the emulated device"),
          "a stream not the emulated device's is refused: %s", last_error(c));
    r = nccl.ncclAllReduce(device, device, 16, ncclFloat32, ncclSum, c, NULL);
    check(r == ncclInvalidArgument, "no stream is refused (%s)", result_name(r));
    r = nccl.ncclAllReduce(device, device, 16, ncclFloat32, (ncclRedOp_t)1, c, &t.s);
    check(r == ncclInvalidArgument, "another operation than ncclSum is refused: %s", last_error(c));
    r = nccl.ncclAllReduce(device, device, 16, (ncclDataType_t)0, ncclSum, c, &t.s);
    check(r == ncclInvalidArgument, "another type than f32 and f64 is refused: %s", last_error(c));
    r = nccl.ncclAllReduce(device, device, 16, ncclFloat32, ncclSum, NULL, &t.s);
    check(r == ncclInvalidArgument, "no communicator is refused (%s)", result_name(r));
    check(t.queued == 0, "nothing refused was queued");
    r = nccl.ncclGroupEnd();
    check(r == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart is refused: %s", last_error(NULL));
    free(host);
}

static void group(ncclComm_t c, int rank) {
    Stream a, b;
    open_stream(&a);
    open_stream(&b);
    float *x = f32_buffer(rank, SMALL);
    double *y = device_alloc(SMALL * sizeof *y);
    for (size_t i = 0; i < SMALL; i++)
        y[i] = f64_value(rank, i);
    bool ok = nccl.ncclGroupStart() == ncclSuccess && nccl.ncclGroupStart() == ncclSuccess &&
              all_reduce_f32(x, x, SMALL, c, &a) == ncclSuccess &&
              nccl.ncclAllReduce(y, y, SMALL, ncclFloat64, ncclSum, c, &b.s) == ncclSuccess;
    check(ok && nccl.ncclGroupEnd() == ncclSuccess && a.queued == 0 && b.queued == 0,
          "in nested groups nothing is queued before the outermost ncclGroupEnd");
    check(nccl.ncclGroupEnd() == ncclSuccess && a.queued == 1 && b.queued == 1,
          "the outermost ncclGroupEnd queues each all-reduce on its own stream");
    synchronize(&a);
    synchronize(&b);
    check(f32_sums(x, SMALL, RANKS) && f64_sums(y, SMALL, RANKS), "the group's f32 and f64 sums");
    results[rank][2] = fnv1a(x, SMALL * sizeof *x);
    results[rank][3] = fnv1a(y, SMALL * sizeof *y);
}

static void sums(int rank, ncclUniqueId id) {
    int blocking[RANKS] = {0, 1, DDP_NCCL_CONFIG_UNDEF_INT};
    ncclComm_t c = join(id, RANKS, rank, blocking[rank]);
    Stream t;
    if (!c)
        return;
    open_stream(&t);
    float *send = f32_buffer(rank, BIG), *recv = sentinel_buffer(BIG);
    ncclResult_t r = all_reduce_f32(send, recv, BIG, c, &t);
    check(r == ncclSuccess && t.queued == 1 && untouched(recv, BIG),
          "an f32 all-reduce is queued, its buffer untouched until the stream runs (%s)", result_name(r));
    synchronize(&t);
    check(f32_sums(recv, BIG, RANKS) && unchanged(send, rank, BIG),
          "%d f32 sums into another buffer, in rank order (element 0: %g), the send buffer unchanged", BIG, recv[0]);
    results[rank][0] = fnv1a(recv, BIG * sizeof *recv);

    double *both = device_alloc(BIG * sizeof *both);
    for (size_t i = 0; i < BIG; i++)
        both[i] = f64_value(rank, i);
    r = nccl.ncclAllReduce(both, both, BIG, ncclFloat64, ncclSum, c, &t.s);
    synchronize(&t);
    check(r == ncclSuccess && f64_sums(both, BIG, RANKS), "%d f64 sums in place, in rank order (element 0: %g)",
          BIG, both[0]);
    results[rank][1] = fnv1a(both, BIG * sizeof *both);

    if (rank == 1)
        refusals(c);
    group(c, rank);
    finish(c);
}

/* ----------------------------------------------------------------- faults */

typedef struct Watchdog {
    ncclComm_t comm;
    ncclResult_t seen, aborted;
    double abort_at;
} Watchdog;

/* Watches the asynchronous error while the stream runs, then aborts. */
static void *watch_then_abort(void *arg) {
    Watchdog *w = arg;
    double start = now();
    while (now() - start < 0.3) {
        nccl.ncclCommGetAsyncError(w->comm, &w->seen);
        sleep_ms(1);
    }
    w->abort_at = now();
    w->aborted = nccl.ncclCommAbort(w->comm);
    return NULL;
}

/* DDP_STANDIN_NCCL_FAULT=hang@2:1 */
static void hang(int rank, ncclUniqueId id) {
    ncclComm_t c = join(id, RANKS, rank, 1);
    Stream t;
    if (!c)
        return;
    open_stream(&t);
    float *x = f32_buffer(rank, SMALL);
    ncclResult_t r = all_reduce_f32(x, x, SMALL, c, &t);
    synchronize(&t);
    check(r == ncclSuccess && f32_sums(x, SMALL, RANKS), "the all-reduce before the fault");

    float *hung = sentinel_buffer(SMALL), *later = sentinel_buffer(SMALL);
    check(all_reduce_f32(hung, hung, SMALL, c, &t) == ncclSuccess &&
          all_reduce_f32(later, later, SMALL, c, &t) == ncclSuccess, "two more all-reduces queued");
    Watchdog w = {c, ncclNumResults, ncclNumResults, 0};
    pthread_t thread;
    pthread_create(&thread, NULL, watch_then_abort, &w);
    synchronize(&t);
    double done = now();
    pthread_join(thread, NULL);
    /* the hung rank's peers may see an error first: a faster peer's abort shuts its connections */
    check((w.seen == ncclSuccess || (rank != 1 && w.seen == ncclRemoteError)) && w.aborted == ncclSuccess,
          "another thread saw %s while the stream ran, then aborted (%s)", result_name(w.seen),
          result_name(w.aborted));
    if (rank == 1)
        check(done >= w.abort_at && done - w.abort_at < 1, "the hung all-reduce returned %.3f s after the abort",
              done - w.abort_at);
    else
        check(done - w.abort_at < 1, "the all-reduce waiting on the hung rank returned %.3f s after the abort",
              done - w.abort_at);
    check(untouched(hung, SMALL) && untouched(later, SMALL),
          "the hung all-reduce and the one queued after it left their buffers as they were");
    r = state_of(c);
    check(r != ncclSuccess && r != ncclNumResults, "after the abort the asynchronous error is %s", result_name(r));
    r = all_reduce_f32(x, x, SMALL, c, &t);
    check(r == ncclInvalidUsage && t.queued == 0, "an all-reduce on the aborted communicator is refused: %s",
          last_error(c));
    check(nccl.ncclCommDestroy(c) == ncclSuccess, "ncclCommDestroy after ncclCommAbort");
}

/* DDP_STANDIN_NCCL_FAULT=remote-error@1:1 */
static void remote_error(int rank, ncclUniqueId id) {
    ncclComm_t c = join(id, RANKS, rank, 1);
    Stream t;
    if (!c)
        return;
    open_stream(&t);
    float *x = f32_buffer(rank, SMALL), *y = sentinel_buffer(SMALL);
    ncclResult_t r = all_reduce_f32(x, y, SMALL, c, &t);
    double start = now();
    synchronize(&t);
    double took = now() - start;
    ncclResult_t state = state_of(c);
    check(r == ncclSuccess && state == ncclRemoteError && took < 1,
          "the all-reduce fails with %s in %.3f s: %s", result_name(state), took, last_error(c));
    check(untouched(y, SMALL) && unchanged(x, rank, SMALL), "its buffers are left as they were");
    if (rank != 1)
        check(contains(last_error(c), rank == 0 ? "rank 1" : "rank 0"), "the error names the rank lost");
    r = all_reduce_f32(x, y, SMALL, c, &t);
    check(r == ncclInvalidUsage && t.queued == 0, "an all-reduce on the failed communicator is refused (%s)",
          result_name(r));
    check(nccl.ncclCommAbort(c) == ncclSuccess, "ncclCommAbort, with no ncclCommDestroy after it");
}

/* Two processes say they are rank 1. */
static void duplicate(int rank, ncclUniqueId id) {
    ncclConfig_t cfg = config(1);
    ncclComm_t c = NULL;
    ncclResult_t r = nccl.ncclCommInitRankConfig(&c, RANKS, id, rank, &cfg);
    if (rank == 0)
        check(r == ncclInvalidUsage && !c && contains(last_error(NULL), "rank 1"),
              "rank 0's init fails with %s: %s", result_name(r), last_error(NULL));
    else
        check(r != ncclSuccess && !c, "rank 1's init fails with %s: %s", result_name(r), last_error(NULL));
}

/* DDP_STANDIN_NCCL_FAULT=in-progress@2 */
static void in_progress(void) {
    ncclComm_t c = solo();
    Stream t;
    if (!c)
        return;
    open_stream(&t);
    check(solo_all_reduce(c), "the all-reduce before the fault");
    float *x = f32_buffer(0, SMALL);
    ncclResult_t r = all_reduce_f32(x, x, SMALL, c, &t);
    check(r == ncclInProgress && t.queued == 0, "the 2nd all-reduce returns %s and queues nothing",
          result_name(r));
    sleep_ms(200);
    check(state_of(c) == ncclInProgress, "the asynchronous error stays ncclInProgress (%s)",
          result_name(state_of(c)));
    check(nccl.ncclCommFinalize(c) != ncclSuccess, "ncclCommFinalize does not say ncclSuccess");
    r = nccl.ncclCommAbort(c);
    check(r == ncclSuccess && state_of(c) == ncclRemoteError, "after ncclCommAbort it is %s",
          result_name(state_of(c)));
    nccl.ncclCommDestroy(c);
}

/* A malformed DDP_STANDIN_NCCL_FAULT: two communicators, all-reduces as usual. */
static void malformed(void) {
    ncclComm_t a = solo(), b = solo();
    if (!a || !b)
        return;
    char text[256];
    bool ok = solo_all_reduce(a) && solo_all_reduce(b);
    ok = finished(a, text, sizeof text) && ok;
    ok = finished(b, text, sizeof text) && ok;
    check(ok, "with %s two communicators run their all-reduces as usual", getenv("DDP_STANDIN_NCCL_FAULT"));
}

/* NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME=lo, DDP_STANDIN_NCCL_FAULT=hang@1:3 */
static void debug(void) {
    ncclComm_t c = solo();
    if (!c)
        return;
    check(solo_all_reduce(c), "a fault for rank 3 leaves rank 0 alone");
    finish(c);
}

static void *run_stream(void *stream) {
    synchronize(stream);
    return NULL;
}

/* One byte from fd, or -1 when none came before the deadline. */
static int read_byte(int fd, double deadline) {
    struct pollfd p = {fd, POLLIN, 0};
    unsigned char byte;
    int wait = (int)((deadline - now()) * 1000);
    if (wait < 0 || poll(&p, 1, wait) <= 0 || read(fd, &byte, 1) != 1)
        return -1;
    return byte;
}

/* DDP_STANDIN_NCCL_FAULT=abort-hang@1: ncclCommAbort does not return within 1 s. */
static void abort_hang(void) {
    int marks[2], status;
    if (pipe(marks) != 0)
        return;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        static Stream t;
        pthread_t thread;
        close(marks[0]);
        become_child("abort-hang", "abort-hang@1", NULL);
        ncclComm_t c = solo();
        open_stream(&t);
        float *x = f32_buffer(0, SMALL);
        if (!c || all_reduce_f32(x, x, SMALL, c, &t) != ncclSuccess)
            exit(1);
        pthread_create(&thread, NULL, run_stream, &t);
        sleep_ms(100);
        (void)!write(marks[1], "a", 1);
        nccl.ncclCommAbort(c);
        (void)!write(marks[1], "b", 1);
        exit(0);
    }
    close(marks[1]);
    int started = read_byte(marks[0], now() + 5), returned = read_byte(marks[0], now() + 1);
    check(started == 'a' && returned < 0, "abort-hang@1: ncclCommAbort has not returned after 1 s (%s)",
          started != 'a' ? "the child failed before the abort" : returned < 0 ? "the child is killed" : "it returned");
    close(marks[0]);
    wait_child(pid, now(), &status);
}

/* ------------------------------------------------------------------- main */

/* An init that must fail with `expected`, and leave no communicator. */
static void init_refused(ncclResult_t expected, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg,
                         const char *what) {
    ncclComm_t c = NULL;
    ncclResult_t r = nccl.ncclCommInitRankConfig(&c, nranks, id, rank, cfg);
    check(r == expected && !c, "%s is refused (%s): %s", what, result_name(r), last_error(NULL));
}

/* Refusals of the init that need no other rank. */
static void init_refusals(void) {
    ncclUniqueId id, zeros = {{0}};
    ncclConfig_t cfg = config(1), bad_magic = cfg, short_config = cfg, bad_blocking = config(2);
    bad_magic.magic = 0;
    short_config.size = offsetof(ncclConfig_t, blocking);
    check(nccl.ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    init_refused(ncclInvalidArgument, 1, id, 0, &bad_magic, "a configuration without NCCL's magic");
    init_refused(ncclInvalidArgument, 1, id, 0, &short_config, "a configuration too short to hold blocking");
    init_refused(ncclInvalidArgument, 1, id, 0, &bad_blocking, "blocking 2");
    init_refused(ncclInvalidArgument, 3, id, 3, &cfg, "rank 3 of 3");
    init_refused(ncclInvalidArgument, 3, id, -1, &cfg, "rank -1 of 3");
    init_refused(ncclInvalidArgument, 1, zeros, 0, &cfg, "an id ncclGetUniqueId did not make");

    ncclComm_t once = join(id, 1, 0, 0);
    check(once && solo_all_reduce(once), "one rank: its all-reduce is a copy");
    init_refused(ncclInvalidUsage, 1, id, 0, &cfg, "rank 0 on an id used already");
    if (once)
        finish(once);

    ncclUniqueId *elsewhere = mmap(NULL, sizeof id, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        exit(nccl.ncclGetUniqueId(elsewhere) == ncclSuccess ? 0 : 1);
    if (check(ended_well(pid, now() + 5), "another process made an id"))
        init_refused(ncclInvalidUsage, 1, *elsewhere, 0, &cfg, "rank 0 outside the process that made the id");
    munmap(elsewhere, sizeof id);
}

static void library_facts(void) {
    int version = 0;
    ncclResult_t r = nccl.ncclGetVersion(&version);
    check(r == ncclSuccess && version == 22800, "version %d", version);
    check(contains(nccl.ncclGetErrorString(ncclRemoteError), "remote") &&
          contains(nccl.ncclGetErrorString((ncclResult_t)99), "unknown"), "ncclGetErrorString names the results");
    /* the values tell the orders apart */
    check(f32_sum(RANKS, 0) == 0 && (f32_value(0, 0) + f32_value(2, 0)) + f32_value(1, 0) == 1 &&
          f64_sum(RANKS, 0) == 0 && (f64_value(0, 0) + f64_value(2, 0)) + f64_value(1, 0) == 1,
          "the sums depend on the order of adding");
}

static void same_bits_everywhere(void) {
    bool same = true;
    for (int r = 1; r < RANKS; r++)
        for (int k = 0; k < RESULTS; k++)
            same &= results[r][k] == results[0][k] && results[0][k] != 0;
    check(same, "every rank has the same bits");
}

static void faults_of_one_rank(void) {
    char err[4096];
    bool ok = run_captured(in_progress, "in-progress", "in-progress@2", NULL, err, sizeof err);
    check(ok && !err[0], "in-progress@2: the child ended well and printed nothing without NCCL_DEBUG%s%s",
          err[0] ? ":\n" : "", err);
    abort_hang();
    ok = run_captured(debug, "NCCL_DEBUG", "hang@1:3", "INFO", err, sizeof err);
    check(ok && contains(err, "stand-in NCCL INFO rank 0 of 1 connected (NCCL_SOCKET_IFNAME=lo)"),
          "NCCL_DEBUG=INFO: a line at init shows NCCL_SOCKET_IFNAME:\n%s", err);
    static const char *const wrong[] = {"hang", "hang@", "hang@0", "hang@x", "hang@ 1", "hang@1:", "hang@1:-1",
                                        "hang@1:2:3", "crash@1", "@1", "hang@99999999999"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        char name[32], *first;
        snprintf(name, sizeof name, "fault %s", wrong[i]);
        ok = run_captured(malformed, name, wrong[i], NULL, err, sizeof err);
        first = strstr(err, "DDP_STANDIN_NCCL_FAULT=");
        check(ok && first && contains(err, "warning") && !strstr(first + 1, "DDP_STANDIN_NCCL_FAULT="),
              "DDP_STANDIN_NCCL_FAULT=%s is warned about once: %s", wrong[i], err);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: nccl_standin LIBNCCL\n");
        return 2;
    }
    double start = now();
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsetenv("NCCL_DEBUG");
    unsetenv("DDP_STANDIN_NCCL_FAULT");
    arena = malloc(ARENA_BYTES);
    results = mmap(NULL, RANKS * sizeof *results, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!arena || results == MAP_FAILED || !load(argv[1]))
        return 1;
    library_facts();
    init_refusals();
    run_ranks("sums", (const int[RANKS]){0, 1, 2}, sums, NULL);
    same_bits_everywhere();
    run_ranks("hang@2:1", (const int[RANKS]){0, 1, 2}, hang, "hang@2:1");
    run_ranks("remote-error@1:1", (const int[RANKS]){0, 1, 2}, remote_error, "remote-error@1:1");
    run_ranks("rank 1 twice", (const int[RANKS]){0, 1, 1}, duplicate, NULL);
    faults_of_one_rank();
    check(now() - start < 20, "the test took %.1f s", now() - start);
    printf("%s\n", failures ? "nccl_standin: FAILED" : "nccl_standin: all passed");
    free(arena);
    return failures ? 1 : 0;
}
