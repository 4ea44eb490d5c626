/* ring.c: the CPU transport: the workers in a ring of TCP connections, each sending
 * to the next and receiving from the one before.
 *
 * All-reduce is reduce-scatter then all-gather over N chunks (N - 1 steps each): every
 * chunk is summed along the ring in one order by one worker and then copied to the
 * others, so all workers hold bit-identical sums. Each step sends and receives at once
 * over non-blocking sockets in slices of a few hundred KB, so no chunk size can
 * deadlock two workers both blocked sending. Every step starts with a header carrying
 * the collective's sequence number, the step and the byte count; a neighbour that sent
 * anything else is reported, never guessed at. Proxy settings play no part: these are
 * plain sockets to the addresses the job gives (S15). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

enum { SLICE = 256 * 1024, HELLO_MAGIC = 0x44445031 /* "DDP1" */, STEP_MAGIC = 0x44445053 };

struct ddp_ring {
    int rank, world;
    int next_fd, prev_fd;
    uint64_t sequence;          /* collectives so far */
    uint64_t program_hash;
    int timeout_ms;             /* with no progress at all */
    int lost;                   /* the rank that died or froze, or -1 */
    char (*hosts)[128];         /* by rank, for messages */
    void *scratch;
    size_t scratch_bytes;
    uint64_t bytes_sent;
};

/* The first message on a connection, both ways. */
typedef struct Hello {
    uint32_t magic, version;
    uint32_t rank, world;
    uint64_t program_hash;
} Hello;

/* The header of every step of every collective. */
typedef struct StepHeader {
    uint32_t magic, step;
    uint64_t sequence, bytes;
} StepHeader;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static bool set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

/* ------------------------------------------------------------- exchange */

/* One direction of an exchange: a buffer moved in slices. */
typedef struct Flow {
    int fd;
    char *data;
    size_t len, done;
} Flow;

/* Moves out.len bytes to the next worker while receiving in.len from the one
 * before, whichever is ready, until both are done; false with a message naming the
 * neighbour when it stops answering, closes or fails. */
/* A neighbour is gone: remembered for the exit status, and named with its host. */
static bool lose(ddp_ring *r, int rank, const char *what, const char *how, char *err, size_t errlen) {
    r->lost = rank;
    return ddp_fail(err, errlen, "%s: lost rank %d on %s: %s", what, rank, r->hosts[rank], how);
}

static bool exchange(ddp_ring *r, Flow out, Flow in, const char *what, char *err, size_t errlen) {
    double last = now_ms();
    char how[160];
    int prev = (r->rank + r->world - 1) % r->world, next = (r->rank + 1) % r->world;
    while (out.done < out.len || in.done < in.len) {
        struct pollfd fds[2] = {{.fd = out.done < out.len ? out.fd : -1, .events = POLLOUT},
                                {.fd = in.done < in.len ? in.fd : -1, .events = POLLIN}};
        int ready = poll(fds, 2, 1000);
        if (ready < 0 && errno != EINTR)
            return ddp_fail(err, errlen, "%s: poll: %s", what, strerror(errno));
        if (ready <= 0) {
            if (now_ms() - last <= r->timeout_ms)
                continue;
            snprintf(how, sizeof how, "it has not %s anything for %d s (--peer-timeout)",
                     in.done < in.len ? "sent" : "received", r->timeout_ms / 1000);
            return lose(r, in.done < in.len ? prev : next, what, how, err, errlen);
        }
        if (fds[0].revents) {
            size_t n = out.len - out.done < SLICE ? out.len - out.done : SLICE;
            ssize_t k = send(out.fd, out.data + out.done, n, MSG_NOSIGNAL);
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                return lose(r, next, what, strerror(errno), err, errlen);
            if (k > 0) {
                out.done += (size_t)k;
                r->bytes_sent += (uint64_t)k;
                last = now_ms();
            }
        }
        if (fds[1].revents) {
            size_t n = in.len - in.done < SLICE ? in.len - in.done : SLICE;
            ssize_t k = recv(in.fd, in.data + in.done, n, 0);
            if (k == 0)
                return lose(r, prev, what, "it closed the connection", err, errlen);
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                return lose(r, prev, what, strerror(errno), err, errlen);
            if (k > 0) {
                in.done += (size_t)k;
                last = now_ms();
            }
        }
    }
    return true;
}

/* One step: the header, checked, then the payloads. */
static bool step(ddp_ring *r, uint32_t index, const void *out, size_t out_len, void *in, size_t in_len,
                 const char *what, char *err, size_t errlen) {
    StepHeader mine = {STEP_MAGIC, index, r->sequence, out_len}, theirs;
    if (!exchange(r, (Flow){r->next_fd, (char *)&mine, sizeof mine, 0}, (Flow){r->prev_fd, (char *)&theirs,
                                                                               sizeof theirs, 0},
                  what, err, errlen))
        return false;
    if (theirs.magic != STEP_MAGIC || theirs.sequence != r->sequence || theirs.step != index ||
        theirs.bytes != in_len)
        return ddp_fail(err, errlen, "%s: rank %d is out of step: it sent collective %llu step %u of %llu bytes, "
                                     "and this worker expected collective %llu step %u of %zu bytes",
                        what, (r->rank + r->world - 1) % r->world, (unsigned long long)theirs.sequence,
                        theirs.step, (unsigned long long)theirs.bytes, (unsigned long long)r->sequence, index, in_len);
    return exchange(r, (Flow){r->next_fd, (char *)out, out_len, 0}, (Flow){r->prev_fd, in, in_len, 0}, what, err,
                    errlen);
}

/* ----------------------------------------------------------- collectives */

static bool grow_scratch(ddp_ring *r, size_t bytes) {
    if (bytes <= r->scratch_bytes)
        return true;
    void *p = realloc(r->scratch, bytes);
    if (!p)
        return false;
    r->scratch = p;
    r->scratch_bytes = bytes;
    return true;
}

static void add_into(void *dst, const void *src, int64_t n, bool f64) {
    if (f64) {
        double *d = dst;
        const double *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
    } else {
        float *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
    }
}

bool ddp_ring_allreduce(ddp_ring *r, void *data, int64_t count, bool f64, char *err, size_t errlen) {
    int n = r->world;
    size_t es = f64 ? 8 : 4;
    char *base = data;
    char what[64];
    snprintf(what, sizeof what, "all-reduce %llu", (unsigned long long)r->sequence);
    if (n == 1) {
        r->sequence++;
        return true;
    }
    int64_t begin[n > 0 ? n : 1], size[n > 0 ? n : 1], largest = 0;
    for (int c = 0; c < n; c++) {
        ddp_shard_range(count, n, c, &begin[c], &size[c]);
        largest = size[c] > largest ? size[c] : largest;
    }
    if (!grow_scratch(r, (size_t)largest * es + 1))
        return ddp_fail(err, errlen, "%s: out of memory", what);
    for (int s = 0; s < n - 1; s++) { /* reduce-scatter: chunk (rank - s - 1) gathers one more term */
        int out = (r->rank - s + n) % n, in = (r->rank - s - 1 + n) % n;
        if (!step(r, (uint32_t)s, base + begin[out] * es, (size_t)size[out] * es, r->scratch, (size_t)size[in] * es,
                  what, err, errlen))
            return false;
        add_into(base + begin[in] * es, r->scratch, size[in], f64);
    }
    for (int s = 0; s < n - 1; s++) { /* all-gather: the finished chunks go round */
        int out = (r->rank + 1 - s + n) % n, in = (r->rank - s + n) % n;
        if (!step(r, (uint32_t)(n - 1 + s), base + begin[out] * es, (size_t)size[out] * es, base + begin[in] * es,
                  (size_t)size[in] * es, what, err, errlen))
            return false;
    }
    r->sequence++;
    return true;
}

bool ddp_ring_broadcast(ddp_ring *r, void *data, size_t bytes, int root, char *err, size_t errlen) {
    char what[64];
    snprintf(what, sizeof what, "broadcast %llu", (unsigned long long)r->sequence);
    /* passed along the ring from the root: each worker receives, then sends on,
     * except the one before the root */
    int position = (r->rank - root + r->world) % r->world;
    for (int s = 0; s < r->world - 1; s++) {
        bool sends = position == s, receives = position == s + 1;
        StepHeader mine = {STEP_MAGIC, (uint32_t)s, r->sequence, bytes}, theirs;
        Flow none = {-1, NULL, 0, 0};
        if (sends && !exchange(r, (Flow){r->next_fd, (char *)&mine, sizeof mine, 0}, none, what, err, errlen))
            return false;
        if (sends && !exchange(r, (Flow){r->next_fd, data, bytes, 0}, none, what, err, errlen))
            return false;
        if (receives) {
            if (!exchange(r, none, (Flow){r->prev_fd, (char *)&theirs, sizeof theirs, 0}, what, err, errlen))
                return false;
            if (theirs.magic != STEP_MAGIC || theirs.sequence != r->sequence || theirs.bytes != bytes)
                return ddp_fail(err, errlen, "%s: rank %d is out of step (it sent collective %llu of %llu bytes)",
                                what, (r->rank + r->world - 1) % r->world, (unsigned long long)theirs.sequence,
                                (unsigned long long)theirs.bytes);
            if (!exchange(r, none, (Flow){r->prev_fd, data, bytes, 0}, what, err, errlen))
                return false;
        }
    }
    r->sequence++;
    return true;
}

bool ddp_ring_barrier(ddp_ring *r, char *err, size_t errlen) {
    float token = 0;
    return ddp_ring_allreduce(r, &token, 1, false, err, errlen);
}

uint64_t ddp_ring_bytes_sent(const ddp_ring *r) {
    return r->bytes_sent;
}

int ddp_ring_lost(const ddp_ring *r) {
    return r ? r->lost : -1;
}

/* ----------------------------------------------------------- connecting */

static int listen_on(int port, char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = INADDR_ANY};
    if (fd < 0) {
        ddp_fail(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0) {
        int e = errno;
        close(fd);
        ddp_fail(err, errlen, "port %d: %s%s", port, strerror(e),
                 e == EADDRINUSE ? " (another program, or another job on this node, uses it: pick another port "
                                   "base)" : "");
        return -1;
    }
    return fd;
}

/* Retrying a connection to a local port no one listens on can meet itself: the
 * kernel may pick that very port as the source (TCP's simultaneous open). */
static bool connected_to_itself(int fd) {
    struct sockaddr_in mine, theirs;
    socklen_t a = sizeof mine, b = sizeof theirs;
    if (getsockname(fd, (struct sockaddr *)&mine, &a) != 0 || getpeername(fd, (struct sockaddr *)&theirs, &b) != 0)
        return false;
    if (mine.sin_port != theirs.sin_port || mine.sin_addr.s_addr != theirs.sin_addr.s_addr)
        return false;
    errno = ECONNREFUSED;
    return true;
}

/* Connects to host:port, retrying until the deadline while the peer is not up yet. */
static int connect_to(const char *host, int port, double deadline, char *err, size_t errlen) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int status = getaddrinfo(host, service, &hints, &res);
    if (status != 0) {
        ddp_fail(err, errlen, "cannot resolve the host `%s`: %s", host, gai_strerror(status));
        return -1;
    }
    int fd = -1, e = 0;
    while (fd < 0) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && (connect(fd, res->ai_addr, res->ai_addrlen) != 0 || connected_to_itself(fd))) {
            e = errno;
            close(fd);
            fd = -1;
        }
        if (fd < 0 && now_ms() > deadline)
            break;
        if (fd < 0)
            usleep(50 * 1000);
    }
    freeaddrinfo(res);
    if (fd < 0)
        ddp_fail(err, errlen, "cannot connect to %s:%d: %s", host, port, strerror(e));
    return fd;
}

/* Waits for the previous worker on the listening socket. */
static int accept_from(int listener, double deadline, char *err, size_t errlen) {
    struct pollfd p = {.fd = listener, .events = POLLIN};
    while (poll(&p, 1, 200) <= 0)
        if (now_ms() > deadline) {
            ddp_fail(err, errlen, "no connection from the previous worker");
            return -1;
        }
    int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        ddp_fail(err, errlen, "accept: %s", strerror(errno));
    return fd;
}

static bool send_all(int fd, const void *p, size_t n) {
    for (const char *c = p; n;) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0 && errno != EINTR)
            return false;
        if (k > 0)
            c += k, n -= (size_t)k;
    }
    return true;
}

static bool recv_all(int fd, void *p, size_t n, int timeout_ms) {
    for (char *c = p; n;) {
        struct pollfd q = {.fd = fd, .events = POLLIN};
        if (poll(&q, 1, timeout_ms) <= 0)
            return false;
        ssize_t k = recv(fd, c, n, 0);
        if (k <= 0)
            return false;
        c += k, n -= (size_t)k;
    }
    return true;
}

ddp_ring *ddp_ring_connect(const ddp_ring_peers *peers, char *err, size_t errlen) {
    ddp_ring *r = calloc(1, sizeof *r);
    if (!r) {
        ddp_fail(err, errlen, "out of memory");
        return NULL;
    }
    *r = (ddp_ring){.rank = peers->rank, .world = peers->world, .next_fd = -1, .prev_fd = -1,
                    .program_hash = peers->program_hash, .timeout_ms = peers->timeout_s * 1000, .lost = -1};
    r->hosts = calloc((size_t)r->world, sizeof *r->hosts);
    if (!r->hosts) {
        ddp_fail(err, errlen, "out of memory");
        free(r);
        return NULL;
    }
    for (int i = 0; i < r->world; i++)
        snprintf(r->hosts[i], sizeof r->hosts[i], "%s", peers->hosts[i]);
    if (r->world == 1)
        return r;
    double deadline = now_ms() + peers->connect_timeout_s * 1000.0;
    int next = (r->rank + 1) % r->world, prev = (r->rank + r->world - 1) % r->world;
    int listener = listen_on(peers->ports[r->rank], err, errlen);
    Hello mine = {HELLO_MAGIC, 1, (uint32_t)r->rank, (uint32_t)r->world, r->program_hash}, theirs;
    bool ok = listener >= 0;
    if (ok)
        ok = (r->next_fd = connect_to(peers->hosts[next], peers->ports[next], deadline, err, errlen)) >= 0;
    if (ok && !(ok = send_all(r->next_fd, &mine, sizeof mine)))
        ddp_fail(err, errlen, "sending the greeting to rank %d: %s", next, strerror(errno));
    while (ok) { /* a stray connection is refused and the wait goes on */
        memset(&theirs, 0, sizeof theirs);
        ok = (r->prev_fd = accept_from(listener, deadline, err, errlen)) >= 0;
        if (ok && recv_all(r->prev_fd, &theirs, sizeof theirs, 10000) && theirs.magic == HELLO_MAGIC &&
            theirs.version == 1 && theirs.rank == (uint32_t)prev && theirs.world == (uint32_t)r->world &&
            theirs.program_hash == r->program_hash)
            break;
        if (ok && theirs.magic == HELLO_MAGIC && theirs.program_hash != r->program_hash) {
            ddp_fail(err, errlen, "rank %u runs another program (hash %016llx, this is %016llx): start the same "
                                  "program on every worker", theirs.rank, (unsigned long long)theirs.program_hash,
                     (unsigned long long)r->program_hash);
            ok = false;
        }
        if (ok) {
            fprintf(stderr, "ddp: rank %d: refused a connection that is not rank %d of this job\n", r->rank, prev);
            close(r->prev_fd);
            r->prev_fd = -1;
        }
    }
    if (listener >= 0)
        close(listener);
    if (ok)
        ok = set_nonblocking(r->next_fd) && set_nonblocking(r->prev_fd);
    if (!ok) {
        ddp_ring_close(r);
        return NULL;
    }
    return r;
}

void ddp_ring_close(ddp_ring *r) {
    if (!r)
        return;
    if (r->next_fd >= 0)
        close(r->next_fd);
    if (r->prev_fd >= 0)
        close(r->prev_fd);
    free(r->scratch);
    free(r->hosts);
    free(r);
}
