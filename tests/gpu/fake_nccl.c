/* fake_nccl.c: a stand-in for NCCL (libnccl.so.2), so that the GPU path's collectives
 * run on machines without GPUs, on the emulated device. Built on runtime/nccl_api.h, it
 * serves the calls listed there, with ncclGetErrorString and ncclGetLastError, and
 * defines ddp_standin_nccl, by which the runtime knows to give it emulated streams; any
 * other stream, and any buffer the stream's device does not hold, is refused
 * (ncclInvalidArgument, with the reason in ncclGetLastError).
 *
 * ncclGetUniqueId listens on a TCP port of this host and writes the host's name, the
 * port and a random token into the id. Rank 0 must be in the process that made the id:
 * it accepts one connection from every other rank, which retries connecting for 60 s;
 * a wrong token, a rank twice or another count of ranks fails the init. Rank 0 waits
 * for the others as long as it takes (until ncclCommAbort). With config->blocking 0 the
 * connecting is done by a thread: the init returns ncclInProgress and
 * ncclCommGetAsyncError says ncclInProgress until it is over.
 *
 * ncclAllReduce (ncclSum of ncclFloat32, ncclFloat64 or ncclBfloat16) only queues the work on the
 * stream: device memory is the host's to touch only while the emulated device runs its
 * queue. When it runs, the ranks send their buffers to rank 0, which adds them in rank
 * order in the element type and sends the sum back, so every rank has the same bits.
 * Every wait polls in steps of 100 ms while the communicator is not aborted, so that
 * ncclCommAbort from another thread ends it at once. A lost peer fails the communicator
 * with ncclRemoteError, and the communicator shuts its own connections so that its
 * peers fail too; the collectives queued after a failure or an abort return at once,
 * leaving their buffers as they were. After ncclCommAbort, ncclCommGetAsyncError gives
 * the communicator's error, or ncclRemoteError when it had none (never ncclSuccess).
 * All-reduces between ncclGroupStart and ncclGroupEnd are queued, in order, at the
 * outermost ncclGroupEnd.
 *
 * NCCL_DEBUG set (INFO, WARN, ...): one line on stderr when a rank has connected, as
 * NCCL prints, showing NCCL_SOCKET_IFNAME, and a line for each failure. Unset: nothing
 * is printed, failures are told by return codes only.
 *
 * Faults for the runtime's tests: DDP_STANDIN_NCCL_FAULT=KIND@N or KIND@N:RANK acts on
 * the N-th all-reduce (from 1; counting those the communicator accepted) of the
 * communicators of rank RANK, or of every rank without :RANK. KIND is
 *   hang          the collective, when it runs, blocks until the communicator is aborted
 *   remote-error  when it runs, the communicator fails with ncclRemoteError and shuts its
 *                 connections, so that its peers fail with ncclRemoteError too
 *   in-progress   the call returns ncclInProgress and queues nothing; the asynchronous
 *                 error stays ncclInProgress (ncclRemoteError once aborted)
 *   abort-hang    as hang, and ncclCommAbort then never returns: the collective hangs on
 * A value not of this form is warned about on stderr, once, and injects nothing. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bf16.h"
#include "nccl_api.h"
#include "standin_clock.h"

/* the runtime's declarations, so that a definition that strays from them fails to build */
#define DECLARE_CALL(name, params) ncclResult_t name params;
DDP_NCCL_CALLS(DECLARE_CALL)
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);

extern const int ddp_standin_nccl;
const int ddp_standin_nccl = 1;

enum { STEP_MS = 100, CONNECT_SECONDS = 60, TEXT = 512 };
#define ID_MAGIC 0x3164696c636e6464ull    /* "ddnclid1" */
#define HELLO_MAGIC 0x316f6c6c65686464ull /* "ddhello1" */

/* ------------------------------------------------------------------ errors */

static __thread char last_error[TEXT];

static bool debugging(void) {
    const char *level = getenv("NCCL_DEBUG");
    return level && *level;
}

/* One line as NCCL prints them: HOST:PID, then what happened. */
static void debug_line(const char *level, const char *text) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(stderr, "%s:%d stand-in NCCL %s %s\n", host, (int)getpid(), level, text);
}

static const char *const result_names[] = {
    [ncclSuccess] = "no error",
    [ncclUnhandledCudaError] = "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    [ncclSystemError] = "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    [ncclInternalError] = "internal error",
    [ncclInvalidArgument] = "invalid argument (run with NCCL_DEBUG=WARN for details)",
    [ncclInvalidUsage] = "invalid usage (run with NCCL_DEBUG=WARN for details)",
    [ncclRemoteError] = "remote process exited or there was a network error",
    [ncclInProgress] = "NCCL operation in progress",
};

const char *ncclGetErrorString(ncclResult_t result) {
    if ((unsigned)result < ncclNumResults)
        return result_names[result];
    return "unknown result code";
}

/* ------------------------------------------------------------------- faults */

typedef enum { FAULT_NONE, FAULT_HANG, FAULT_REMOTE_ERROR, FAULT_IN_PROGRESS, FAULT_ABORT_HANG } FaultKind;

static const char *const fault_names[] = {
    [FAULT_HANG] = "hang",
    [FAULT_REMOTE_ERROR] = "remote-error",
    [FAULT_IN_PROGRESS] = "in-progress",
    [FAULT_ABORT_HANG] = "abort-hang",
};

typedef struct Fault {
    FaultKind kind;
    long call; /* the N-th all-reduce */
    long rank; /* -1: every rank */
} Fault;

static bool parse_count(const char *text, long *value, const char **end) {
    if (!isdigit((unsigned char)*text))
        return false;
    errno = 0;
    *value = strtol(text, (char **)end, 10);
    return errno == 0 && *value <= INT_MAX;
}

static bool parse_fault(const char *text, Fault *fault) {
    const char *at = strchr(text, '@'), *end;
    if (!at)
        return false;
    for (int k = FAULT_HANG; k <= FAULT_ABORT_HANG; k++)
        if (strlen(fault_names[k]) == (size_t)(at - text) && strncmp(text, fault_names[k], at - text) == 0)
            fault->kind = k;
    if (fault->kind == FAULT_NONE || !parse_count(at + 1, &fault->call, &end) || fault->call < 1)
        return false;
    if (*end == ':' && !parse_count(end + 1, &fault->rank, &end))
        return false;
    return *end == 0;
}

static Fault read_fault(void) {
    static atomic_bool warned;
    const char *text = getenv("DDP_STANDIN_NCCL_FAULT");
    Fault fault = {FAULT_NONE, 0, -1};
    if (!text || !*text || parse_fault(text, &fault))
        return fault;
    if (!atomic_exchange(&warned, true))
        fprintf(stderr, "stand-in NCCL: warning: DDP_STANDIN_NCCL_FAULT=%s is not KIND@N or KIND@N:RANK "
                        "(KIND hang, remote-error, in-progress or abort-hang): no fault is injected\n", text);
    return (Fault){FAULT_NONE, 0, -1};
}

/* ------------------------------------------------------------ communicators */

/* What ncclGetUniqueId writes into the id. */
typedef struct IdContents {
    uint64_t magic;
    uint64_t token;
    uint32_t port;
    char host[NCCL_UNIQUE_ID_BYTES - 20];
} IdContents;
_Static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "the id's contents exceed ncclUniqueId");

struct ncclComm {
    pthread_mutex_t lock; /* guards what follows up to `links`, and the links' values */
    int refs;             /* the caller's, the connecting thread's, each queued all-reduce's */
    ncclResult_t state;   /* what ncclCommGetAsyncError gives */
    bool aborted, destroyed, abort_hangs;
    char error[TEXT];
    long accepted; /* all-reduces accepted, for the fault's N */
    /* the sockets: rank 0 has one to every other rank r (links[r]); the others one to
     * rank 0 (links[0]); -1 where there is none */
    int *links;
    int rank, nranks;
    IdContents id;
    Fault fault;
    uint64_t collectives;      /* run so far: the stream's thread's only */
    struct ncclComm *next_aborted;
};

/* Aborted communicators stay alive here until ncclCommDestroy, if it ever comes: a
 * collective still queued may run later, and a leak checker sees them held. */
static pthread_mutex_t aborted_lock = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t aborted_comms;

static void hold(ncclComm_t c) {
    pthread_mutex_lock(&c->lock);
    c->refs++;
    pthread_mutex_unlock(&c->lock);
}

static void release(ncclComm_t c) {
    pthread_mutex_lock(&c->lock);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (!last)
        return;
    for (int r = 0; r < c->nranks; r++)
        if (c->links[r] >= 0)
            close(c->links[r]);
    free(c->links);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* 1 when the communicator is aborted or destroyed: every wait ends. */
static bool stopping(ncclComm_t c) {
    pthread_mutex_lock(&c->lock);
    bool stop = c->aborted || c->destroyed;
    pthread_mutex_unlock(&c->lock);
    return stop;
}

static ncclResult_t state_of(ncclComm_t c) {
    pthread_mutex_lock(&c->lock);
    ncclResult_t state = c->state;
    pthread_mutex_unlock(&c->lock);
    return state;
}

static void shut_links(ncclComm_t c) {
    for (int r = 0; r < c->nranks; r++)
        if (c->links[r] >= 0)
            shutdown(c->links[r], SHUT_RDWR);
}

/* A call refused: its reason is the thread's last error, and the communicator's. */
static ncclResult_t refuse(ncclComm_t c, ncclResult_t result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t refuse(ncclComm_t c, ncclResult_t result, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (c) {
        pthread_mutex_lock(&c->lock);
        snprintf(c->error, sizeof c->error, "%s", last_error);
        pthread_mutex_unlock(&c->lock);
    }
    if (debugging())
        debug_line("WARN", last_error);
    return result;
}

/* The communicator fails (its first failure is the one it keeps) and shuts its links,
 * so that its peers' waits end too. Gives the communicator's state. */
static ncclResult_t fail(ncclComm_t c, ncclResult_t result, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ncclResult_t fail(ncclComm_t c, ncclResult_t result, const char *fmt, ...) {
    char text[TEXT];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->lock);
    bool first = c->state == ncclSuccess || c->state == ncclInProgress;
    if (first) {
        c->state = result;
        snprintf(c->error, sizeof c->error, "%s", text);
    }
    shut_links(c);
    result = c->state;
    pthread_mutex_unlock(&c->lock);
    if (first && debugging())
        debug_line("WARN", text);
    return result;
}

static void set_link(ncclComm_t c, int r, int fd) {
    pthread_mutex_lock(&c->lock);
    c->links[r] = fd;
    if (fd >= 0 && (c->aborted || c->destroyed))
        shutdown(fd, SHUT_RDWR);
    pthread_mutex_unlock(&c->lock);
}

/* ------------------------------------------------------------------ sockets */


static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Waits for fd to be ready for events, in steps, while the communicator lives: 1 when
 * ready (or in error: the next call on it says which), 0 when it stops, -1 on failure. */
static int wait_ready(ncclComm_t c, int fd, short events) {
    for (;;) {
        if (stopping(c))
            return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, STEP_MS);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

static bool send_all(ncclComm_t c, int fd, const void *data, size_t bytes, const char **why) {
    const char *p = data;
    while (bytes > 0) {
        int ready = wait_ready(c, fd, POLLOUT);
        if (ready <= 0) {
            *why = ready == 0 ? "the communicator was stopped" : strerror(errno);
            return false;
        }
        ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            *why = strerror(errno);
            return false;
        }
        if (n > 0)
            p += n, bytes -= n;
    }
    return true;
}

static bool receive_all(ncclComm_t c, int fd, void *data, size_t bytes, const char **why) {
    char *p = data;
    while (bytes > 0) {
        int ready = wait_ready(c, fd, POLLIN);
        if (ready <= 0) {
            *why = ready == 0 ? "the communicator was stopped" : strerror(errno);
            return false;
        }
        ssize_t n = recv(fd, p, bytes, MSG_DONTWAIT);
        if (n == 0) {
            *why = "the connection was closed";
            return false;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            *why = strerror(errno);
            return false;
        }
        if (n > 0)
            p += n, bytes -= n;
    }
    return true;
}

/* ------------------------------------------------------------- unique ids */

/* The listening sockets of the ids this process made, until rank 0 takes its own. */
typedef struct Listener {
    int fd;
    uint32_t port;
    uint64_t token;
    struct Listener *next;
} Listener;

static pthread_mutex_t listeners_lock = PTHREAD_MUTEX_INITIALIZER;
static Listener *listeners;

static int take_listener(uint32_t port, uint64_t token) {
    int fd = -1;
    pthread_mutex_lock(&listeners_lock);
    for (Listener **l = &listeners; *l; l = &(*l)->next)
        if ((*l)->port == port && (*l)->token == token) {
            Listener *found = *l;
            *l = found->next;
            fd = found->fd;
            free(found);
            break;
        }
    pthread_mutex_unlock(&listeners_lock);
    return fd;
}

static uint64_t random_token(void) {
    uint64_t token;
    if (getrandom(&token, sizeof token, 0) == sizeof token)
        return token;
    return (uint64_t)getpid() << 32 ^ (uint64_t)(now() * 1e9);
}

static int listen_anywhere(uint32_t *port) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = 0};
    socklen_t length = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &length) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(addr.sin_port);
    return fd;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    IdContents contents = {.magic = ID_MAGIC, .token = random_token()};
    if (!id)
        return refuse(NULL, ncclInvalidArgument, "ncclGetUniqueId: no place for the id (NULL)");
    int fd = listen_anywhere(&contents.port);
    Listener *l = malloc(sizeof *l);
    if (fd < 0 || !l) {
        int error = errno;
        if (fd >= 0)
            close(fd);
        free(l);
        return refuse(NULL, ncclSystemError, "ncclGetUniqueId: cannot listen on a TCP port: %s", strerror(error));
    }
    gethostname(contents.host, sizeof contents.host - 1);
    *l = (Listener){fd, contents.port, contents.token, NULL};
    pthread_mutex_lock(&listeners_lock);
    l->next = listeners;
    listeners = l;
    pthread_mutex_unlock(&listeners_lock);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &contents, sizeof contents);
    return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version)
        return refuse(NULL, ncclInvalidArgument, "ncclGetVersion: no place for the version (NULL)");
    *version = 22800;
    return ncclSuccess;
}

/* --------------------------------------------------------------- connecting */

/* What a rank sends rank 0 on connecting, and what rank 0 answers once all have. */
typedef struct Hello {
    uint64_t magic, token;
    int32_t rank, nranks;
} Hello;

typedef struct Reply {
    int32_t result;
    char why[252];
} Reply;

static void refuse_peer(ncclComm_t c, int fd, const char *why) {
    Reply reply = {ncclInvalidUsage, ""};
    const char *ignored;
    snprintf(reply.why, sizeof reply.why, "%s", why);
    send_all(c, fd, &reply, sizeof reply, &ignored);
    close(fd);
    fail(c, ncclInvalidUsage, "rank 0 refused a connection: %s", why);
}

/* Rank 0's check of a connecting rank's hello: NULL when it may join. */
static const char *judge_hello(ncclComm_t c, const Hello *h, char *why, size_t size) {
    if (h->magic != HELLO_MAGIC || h->token != c->id.token)
        snprintf(why, size, "a connection with another unique id's token");
    else if (h->nranks != c->nranks)
        snprintf(why, size, "rank %d says there are %d ranks, rank 0 that there are %d", (int)h->rank,
                 (int)h->nranks, c->nranks);
    else if (h->rank < 1 || h->rank >= c->nranks)
        snprintf(why, size, "a rank %d of %d ranks connected to rank 0", (int)h->rank, c->nranks);
    else if (c->links[h->rank] >= 0)
        snprintf(why, size, "two connections say they are rank %d", (int)h->rank);
    else
        return NULL;
    return why;
}

/* Rank 0 accepts a rank and learns which it is: 1 when it joined, 0 when none came
 * yet, -1 when the init failed or stopped. */
static int accept_rank(ncclComm_t c, int listener) {
    const char *why;
    char reason[200];
    Hello hello;
    int ready = wait_ready(c, listener, POLLIN);
    if (ready < 0)
        fail(c, ncclSystemError, "rank 0 cannot wait for the other ranks: %s", strerror(errno));
    if (ready <= 0)
        return -1;
    int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED))
        return 0;
    if (fd < 0) {
        fail(c, ncclSystemError, "rank 0 cannot accept the other ranks: %s", strerror(errno));
        return -1;
    }
    set_nodelay(fd);
    if (!receive_all(c, fd, &hello, sizeof hello, &why)) {
        close(fd);
        if (!stopping(c))
            fail(c, ncclRemoteError, "a rank connecting to rank 0 failed: %s", why);
        return -1;
    }
    if (judge_hello(c, &hello, reason, sizeof reason)) {
        refuse_peer(c, fd, reason);
        return -1;
    }
    set_link(c, hello.rank, fd);
    return 1;
}

static bool rank0_connect(ncclComm_t c, int listener) {
    for (int joined = 0; joined < c->nranks - 1;) {
        int accepted = accept_rank(c, listener);
        if (accepted < 0)
            return false;
        joined += accepted;
    }
    Reply welcome = {ncclSuccess, ""};
    for (int r = 1; r < c->nranks; r++) {
        const char *why;
        if (!send_all(c, c->links[r], &welcome, sizeof welcome, &why)) {
            if (!stopping(c))
                fail(c, ncclRemoteError, "rank %d's connection failed while connecting: %s", r, why);
            return false;
        }
    }
    return true;
}

/* Rank 0's address: its host's name, or this host's loopback where the name of this
 * very host does not resolve (as in some containers). */
static bool resolve(const IdContents *id, struct sockaddr_in *addr) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *found;
    char host[sizeof id->host + 1] = {0}, self[256] = {0};
    memcpy(host, id->host, sizeof id->host);
    *addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)id->port)};
    if (getaddrinfo(host, NULL, &hints, &found) == 0) {
        addr->sin_addr = ((struct sockaddr_in *)found->ai_addr)->sin_addr;
        freeaddrinfo(found);
        return true;
    }
    gethostname(self, sizeof self - 1);
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return strcmp(host, self) == 0;
}

/* One try at connecting to rank 0: the socket, or -1 (with errno) when it failed. */
static int try_connect(ncclComm_t c, const struct sockaddr_in *addr) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), error = 0;
    socklen_t length = sizeof error;
    if (fd < 0)
        return -1;
    set_link(c, 0, fd);
    if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0)
        return fd;
    if (errno == EINPROGRESS) {
        int ready = wait_ready(c, fd, POLLOUT);
        error = ready < 0 ? errno : ready == 0 ? ECANCELED : 0;
        if (ready > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0)
            error = errno;
    } else {
        error = errno;
    }
    if (error == 0)
        return fd;
    set_link(c, 0, -1);
    close(fd);
    errno = error;
    return -1;
}

static bool peer_connect(ncclComm_t c) {
    struct sockaddr_in addr;
    if (!resolve(&c->id, &addr)) {
        fail(c, ncclSystemError, "rank %d cannot resolve rank 0's host %.*s", c->rank, (int)sizeof c->id.host,
             c->id.host);
        return false;
    }
    double deadline = now() + CONNECT_SECONDS;
    int fd;
    while ((fd = try_connect(c, &addr)) < 0) {
        if (stopping(c))
            return false;
        if (now() > deadline) {
            fail(c, ncclRemoteError, "rank %d could not connect to rank 0 at %.*s:%u for %d s: %s", c->rank,
                 (int)sizeof c->id.host, c->id.host, (unsigned)c->id.port, CONNECT_SECONDS, strerror(errno));
            return false;
        }
        sleep_ms(STEP_MS);
    }
    set_nodelay(fd);
    Hello hello = {HELLO_MAGIC, c->id.token, c->rank, c->nranks};
    Reply reply;
    const char *why;
    if (!send_all(c, fd, &hello, sizeof hello, &why) || !receive_all(c, fd, &reply, sizeof reply, &why)) {
        if (!stopping(c))
            fail(c, ncclRemoteError, "rank 0's connection failed while rank %d connected: %s", c->rank, why);
        return false;
    }
    if (reply.result != ncclSuccess) {
        fail(c, (ncclResult_t)reply.result, "rank 0 refused rank %d: %.*s", c->rank, (int)sizeof reply.why,
             reply.why);
        return false;
    }
    return true;
}

static void say_connected(ncclComm_t c) {
    const char *ifname = getenv("NCCL_SOCKET_IFNAME");
    char text[TEXT];
    snprintf(text, sizeof text, "rank %d of %d connected (NCCL_SOCKET_IFNAME=%s)", c->rank, c->nranks,
             ifname ? ifname : "unset");
    debug_line("INFO", text);
}

/* Connects the ranks; the state becomes ncclSuccess or the failure. */
static ncclResult_t connect_ranks(ncclComm_t c, int listener) {
    bool connected = c->rank == 0 ? rank0_connect(c, listener) : peer_connect(c);
    if (listener >= 0)
        close(listener);
    pthread_mutex_lock(&c->lock);
    if (connected && c->state == ncclInProgress && !c->aborted && !c->destroyed)
        c->state = ncclSuccess;
    else if (c->state == ncclInProgress)
        c->state = ncclRemoteError; /* stopped: the abort said why */
    ncclResult_t state = c->state;
    pthread_mutex_unlock(&c->lock);
    if (state == ncclSuccess && debugging())
        say_connected(c);
    return state;
}

typedef struct Connecting {
    ncclComm_t comm;
    int listener;
} Connecting;

static void *connect_in_background(void *arg) {
    Connecting *job = arg;
    connect_ranks(job->comm, job->listener);
    release(job->comm);
    free(job);
    return NULL;
}

static int connect_later(ncclComm_t c, int listener) {
    Connecting *job = malloc(sizeof *job);
    pthread_t thread;
    pthread_attr_t attr;
    if (!job)
        return ENOMEM;
    *job = (Connecting){c, listener};
    hold(c);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int error = pthread_create(&thread, &attr, connect_in_background, job);
    pthread_attr_destroy(&attr);
    if (error) {
        c->refs--;
        free(job);
    }
    return error;
}

static ncclComm_t new_comm(int nranks, int rank, const IdContents *id) {
    ncclComm_t c = calloc(1, sizeof *c);
    int *links = calloc(nranks, sizeof *links);
    if (!c || !links) {
        free(c);
        free(links);
        return NULL;
    }
    for (int r = 0; r < nranks; r++)
        links[r] = -1;
    pthread_mutex_init(&c->lock, NULL);
    c->refs = 1;
    c->state = ncclInProgress;
    c->links = links;
    c->rank = rank, c->nranks = nranks;
    c->id = *id;
    c->fault = read_fault();
    return c;
}

static const char *check_config(const ncclConfig_t *config, int *blocking) {
    *blocking = DDP_NCCL_CONFIG_UNDEF_INT;
    if (!config)
        return NULL;
    if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int) || config->magic != DDP_NCCL_CONFIG_MAGIC)
        return "the configuration is not one NCCL_CONFIG_INITIALIZER made";
    *blocking = config->blocking;
    if (*blocking != 0 && *blocking != 1 && *blocking != DDP_NCCL_CONFIG_UNDEF_INT)
        return "the configuration's blocking is neither 0 nor 1";
    return NULL;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    IdContents contents;
    int blocking, listener = -1;
    const char *wrong = check_config(config, &blocking);
    memcpy(&contents, id.internal, sizeof contents);
    if (!comm)
        return refuse(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: no place for the communicator (NULL)");
    *comm = NULL;
    if (wrong)
        return refuse(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: %s", wrong);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return refuse(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d ranks", rank, nranks);
    if (contents.magic != ID_MAGIC)
        return refuse(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: the id is none ncclGetUniqueId made");
    if (rank == 0 && (listener = take_listener(contents.port, contents.token)) < 0)
        return refuse(NULL, ncclInvalidUsage, "ncclCommInitRankConfig: rank 0 must be in the process that made "
                                              "the unique id, which listens for the other ranks, once per id");
    ncclComm_t c = new_comm(nranks, rank, &contents);
    if (c && blocking == 0 && connect_later(c, listener) == 0) {
        *comm = c;
        return ncclInProgress;
    }
    ncclResult_t result = c ? connect_ranks(c, listener) : ncclSystemError;
    if (result == ncclSuccess) {
        *comm = c;
        return ncclSuccess;
    }
    if (!c) {
        if (listener >= 0)
            close(listener);
        return refuse(NULL, ncclSystemError, "ncclCommInitRankConfig: out of memory");
    }
    snprintf(last_error, sizeof last_error, "%s", c->error);
    release(c);
    return result;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *result) {
    if (!comm || !result)
        return refuse(comm, ncclInvalidArgument, "ncclCommGetAsyncError: no communicator or no place for the result");
    *result = state_of(comm);
    return ncclSuccess;
}

const char *ncclGetLastError(ncclComm_t comm) {
    static __thread char copy[TEXT];
    if (!comm)
        return last_error;
    pthread_mutex_lock(&comm->lock);
    snprintf(copy, sizeof copy, "%s", comm->error[0] ? comm->error : last_error);
    pthread_mutex_unlock(&comm->lock);
    return copy;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm)
        return refuse(NULL, ncclInvalidArgument, "ncclCommFinalize: no communicator (NULL)");
    return state_of(comm);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm)
        return ncclSuccess;
    pthread_mutex_lock(&comm->lock);
    bool hangs = comm->abort_hangs, first = !comm->aborted;
    pthread_mutex_unlock(&comm->lock);
    while (hangs) /* the fault abort-hang */
        sleep(3600);
    pthread_mutex_lock(&comm->lock);
    comm->aborted = true;
    if (comm->state == ncclSuccess || comm->state == ncclInProgress) {
        comm->state = ncclRemoteError;
        snprintf(comm->error, sizeof comm->error, "the communicator was aborted (ncclCommAbort)");
    }
    shut_links(comm);
    pthread_mutex_unlock(&comm->lock);
    if (first) {
        pthread_mutex_lock(&aborted_lock);
        comm->next_aborted = aborted_comms;
        aborted_comms = comm;
        pthread_mutex_unlock(&aborted_lock);
    }
    return ncclSuccess;
}

static void forget_aborted(ncclComm_t comm) {
    pthread_mutex_lock(&aborted_lock);
    for (ncclComm_t *c = &aborted_comms; *c; c = &(*c)->next_aborted)
        if (*c == comm) {
            *c = comm->next_aborted;
            break;
        }
    pthread_mutex_unlock(&aborted_lock);
}

/* The communicator's memory and sockets go with the last all-reduce queued on it. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm)
        return ncclSuccess;
    pthread_mutex_lock(&comm->lock);
    comm->destroyed = true;
    pthread_mutex_unlock(&comm->lock);
    forget_aborted(comm);
    release(comm);
    return ncclSuccess;
}

/* -------------------------------------------------------------- all-reduces */

typedef struct AllReduce {
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclComm_t comm; /* held */
    ddp_emulated_stream *stream;
    FaultKind fault;
    struct AllReduce *next; /* in the group */
} AllReduce;

/* Each message of an all-reduce: which of the communicator's collectives, its size. */
typedef struct Frame {
    uint64_t sequence, bytes;
} Frame;

static size_t type_size(ncclDataType_t type) {
    return type == ncclFloat64 ? sizeof(double) : type == ncclBfloat16 ? sizeof(uint16_t) : sizeof(float);
}

/* sum += x, element by element, in the element type (bf16: added in f32, the sum
 * rounded back to bf16, as NCCL does) */
static void add_into(void *sum, const void *x, size_t count, ncclDataType_t type) {
    if (type == ncclFloat64) {
        double *s = sum;
        const double *a = x;
        for (size_t i = 0; i < count; i++)
            s[i] += a[i];
    } else if (type == ncclBfloat16) {
        uint16_t *s = sum;
        const uint16_t *a = x;
        for (size_t i = 0; i < count; i++)
            s[i] = ddp_bf16_from_float(ddp_bf16_to_float(s[i]) + ddp_bf16_to_float(a[i]));
    } else {
        float *s = sum;
        const float *a = x;
        for (size_t i = 0; i < count; i++)
            s[i] += a[i];
    }
}

static int link_to(ncclComm_t c, int r) {
    return c->rank == 0 ? c->links[r] : c->links[0];
}

static bool link_failed(ncclComm_t c, int r, const char *why) {
    if (!stopping(c))
        fail(c, ncclRemoteError, "rank %d: the connection to rank %d failed: %s", c->rank, r, why);
    return false;
}

static bool send_frame(ncclComm_t c, int r, const Frame *f, const void *data) {
    const char *why;
    int fd = link_to(c, r);
    if (!send_all(c, fd, f, sizeof *f, &why) || !send_all(c, fd, data, f->bytes, &why))
        return link_failed(c, r, why);
    return true;
}

static bool receive_frame(ncclComm_t c, int r, const Frame *expected, void *data) {
    const char *why;
    Frame f;
    int fd = link_to(c, r);
    if (!receive_all(c, fd, &f, sizeof f, &why))
        return link_failed(c, r, why);
    if (f.sequence != expected->sequence || f.bytes != expected->bytes) {
        fail(c, ncclInvalidUsage, "rank %d's all-reduce #%llu has %llu bytes where rank %d's #%llu has %llu: "
             "the ranks' calls differ", r, (unsigned long long)f.sequence, (unsigned long long)f.bytes, c->rank,
             (unsigned long long)expected->sequence, (unsigned long long)expected->bytes);
        return false;
    }
    if (!receive_all(c, fd, data, f.bytes, &why))
        return link_failed(c, r, why);
    return true;
}

/* Rank 0: the ranks' buffers added in rank order, the sum sent to every rank. */
static bool reduce_at_root(ncclComm_t c, const AllReduce *op, const Frame *f, char *sum, char *part) {
    if (f->bytes)
        memcpy(sum, op->send, f->bytes);
    for (int r = 1; r < c->nranks; r++) {
        if (!receive_frame(c, r, f, part))
            return false;
        add_into(sum, part, op->count, op->type);
    }
    for (int r = 1; r < c->nranks; r++)
        if (!send_frame(c, r, f, sum))
            return false;
    return true;
}

static bool reduce_at_peer(ncclComm_t c, const AllReduce *op, const Frame *f, char *sum) {
    return send_frame(c, 0, f, op->send) && receive_frame(c, 0, f, sum);
}

static bool usable(ncclComm_t c) {
    pthread_mutex_lock(&c->lock);
    bool ok = c->state == ncclSuccess && !c->aborted && !c->destroyed;
    pthread_mutex_unlock(&c->lock);
    return ok;
}

static void all_reduce(ncclComm_t c, const AllReduce *op) {
    Frame f = {++c->collectives, op->count * type_size(op->type)};
    char *sum = malloc(f.bytes + 1), *part = c->rank == 0 ? malloc(f.bytes + 1) : NULL;
    if (!sum || (c->rank == 0 && !part))
        fail(c, ncclSystemError, "rank %d: out of memory for an all-reduce of %llu bytes", c->rank,
             (unsigned long long)f.bytes);
    else if (c->rank == 0 ? reduce_at_root(c, op, &f, sum, part) : reduce_at_peer(c, op, &f, sum))
        if (f.bytes)
            memcpy(op->recv, sum, f.bytes);
    free(sum);
    free(part);
}

/* What the emulated device runs, in the stream's order, with device memory open. */
static void run_all_reduce(void *arg) {
    AllReduce *op = arg;
    ncclComm_t c = op->comm;
    if (op->fault == FAULT_HANG || op->fault == FAULT_ABORT_HANG) {
        while (!stopping(c))
            sleep_ms(10);
    } else if (op->fault == FAULT_REMOTE_ERROR) {
        fail(c, ncclRemoteError, "rank %d: a remote error injected by DDP_STANDIN_NCCL_FAULT", c->rank);
    } else if (usable(c)) {
        all_reduce(c, op);
    }
    release(c);
    free(op);
}

static ncclResult_t issue(AllReduce *op) {
    ncclComm_t c = op->comm;
    if (op->stream->enqueue(op->stream, run_all_reduce, op) == 0)
        return ncclSuccess;
    free(op);
    ncclResult_t result = refuse(c, ncclUnhandledCudaError, "ncclAllReduce: the emulated stream refused the work");
    release(c);
    return result;
}

/* The all-reduces of the group this thread is in, to be queued at its end. */
static __thread int group_depth;
static __thread AllReduce *group_first, *group_last;

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0)
        return refuse(NULL, ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart before it");
    if (--group_depth > 0)
        return ncclSuccess;
    ncclResult_t result = ncclSuccess;
    while (group_first) {
        AllReduce *op = group_first;
        group_first = op->next;
        ncclResult_t r = issue(op);
        if (result == ncclSuccess)
            result = r;
    }
    group_last = NULL;
    return result;
}

/* Counts the all-reduce for the fault, and gives the fault that falls on it. */
static FaultKind count_call(ncclComm_t c) {
    FaultKind kind = FAULT_NONE;
    pthread_mutex_lock(&c->lock);
    if (++c->accepted == c->fault.call && (c->fault.rank < 0 || c->fault.rank == c->rank))
        kind = c->fault.kind;
    if (kind == FAULT_ABORT_HANG)
        c->abort_hangs = true;
    if (kind == FAULT_IN_PROGRESS)
        c->state = ncclInProgress;
    pthread_mutex_unlock(&c->lock);
    return kind;
}

/* Why the communicator takes no all-reduce now: false when it does. */
static bool unusable(ncclComm_t c, char *why, size_t size) {
    pthread_mutex_lock(&c->lock);
    bool refused = true;
    if (c->aborted || c->destroyed)
        snprintf(why, size, "the communicator was aborted");
    else if (c->state == ncclInProgress)
        snprintf(why, size, "the communicator is in progress (ncclCommGetAsyncError says ncclInProgress)");
    else if (c->state != ncclSuccess)
        snprintf(why, size, "the communicator has failed: %.400s", c->error);
    else
        refused = false;
    pthread_mutex_unlock(&c->lock);
    return refused;
}

static bool on_device(ddp_emulated_stream *s, const void *p, size_t bytes) {
    return bytes == 0 || s->on_device(s, p, bytes);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    ddp_emulated_stream *s = stream;
    char why[TEXT];
    if (!comm)
        return refuse(NULL, ncclInvalidArgument, "ncclAllReduce: no communicator (NULL)");
    if (op != ncclSum)
        return refuse(comm, ncclInvalidArgument, "ncclAllReduce: the stand-in NCCL adds only (ncclSum), not "
                                                 "operation %d", (int)op);
    if (type != ncclFloat32 && type != ncclFloat64 && type != ncclBfloat16)
        return refuse(comm, ncclInvalidArgument, "ncclAllReduce: the stand-in NCCL adds ncclFloat32, ncclFloat64 "
                                                 "and ncclBfloat16 only, not data type %d", (int)type);
    if (!s || s->magic != DDP_EMULATED_STREAM_MAGIC)
        return refuse(comm, ncclInvalidArgument, "ncclAllReduce: the stream is no emulated device's: the "
                                                 "stand-in NCCL serves only the emulated device");
    if (count > SIZE_MAX / 2 / type_size(type))
        return refuse(comm, ncclInvalidArgument, "ncclAllReduce: %zu elements are too many", count);
    size_t bytes = count * type_size(type);
    bool send_outside = !on_device(s, send, bytes);
    if (send_outside || !on_device(s, recv, bytes))
        return refuse(comm, ncclInvalidArgument, "ncclAllReduce: the %s buffer %p (%zu bytes) is not the emulated "
                      "device's memory: host memory given as device memory", send_outside ? "send" : "receive",
                      send_outside ? send : (const void *)recv, bytes);
    if (unusable(comm, why, sizeof why))
        return refuse(comm, ncclInvalidUsage, "ncclAllReduce: %s", why);
    FaultKind fault = count_call(comm);
    if (fault == FAULT_IN_PROGRESS)
        return ncclInProgress;
    AllReduce *work = malloc(sizeof *work);
    if (!work)
        return refuse(comm, ncclSystemError, "ncclAllReduce: out of memory");
    hold(comm);
    *work = (AllReduce){send, recv, count, type, comm, s, fault, NULL};
    if (group_depth == 0)
        return issue(work);
    if (group_last)
        group_last->next = work;
    else
        group_first = work;
    group_last = work;
    return ncclSuccess;
}
