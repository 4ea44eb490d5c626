/* ring.c: the CPU transport: the workers in a ring of TCP connections, each sending
 * to the next and receiving from the one before.
 *
 * All-reduce is reduce-scatter then all-gather over N chunks (N - 1 steps each): every
 * chunk is summed along the ring in one order by one worker and then copied to the
 * others, so all workers hold bit-identical sums. Each step sends and receives at once
 * over non-blocking sockets in slices of a few hundred KB, so no chunk size can
 * deadlock two workers both blocked sending, and the terms received are summed slice
 * by slice while the rest are still coming. Every step's stream starts with a header
 * carrying the collective's sequence number, the step and the byte count; a neighbour
 * that sent anything else is reported, never guessed at. Proxy settings play no part:
 * these are plain sockets to the addresses the rendezvous gave (S15), and each
 * connection proves at once that it holds the key the coordinator drew for this job.
 *
 * The ring has no clock of its own once a link watches the job: a neighbour slow to
 * send (a long step) is not a fault; the heartbeat decides who is lost. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bf16.h"
#include "runtime.h"

enum { SLICE = 256 * 1024, SPIN_US = 50, HELLO_MAGIC = 0x44445031 /* "DDP1" */, STEP_MAGIC = 0x44445053 };

struct ddp_ring {
    int rank, world;
    int next_fd, prev_fd;
    uint64_t sequence;          /* collectives so far */
    uint64_t program_hash;
    int timeout_ms;             /* with no progress at all */
    int lost;                   /* the rank that died or froze, or -1 */
    char (*hosts)[256];         /* by rank, for messages */
    void *scratch;              /* a slice of a neighbour's terms, on their way into the sums */
    uint64_t bytes_sent;
    ddp_link *link;             /* whose news of a lost worker ends a collective; NULL */
    double spin_ms;             /* how long a step tries again before it sleeps in poll */
};

/* The header of every step of every collective. */
typedef struct StepHeader {
    uint32_t magic, step;
    uint64_t sequence, bytes;
} StepHeader;

/* A connection of the ring: non-blocking, no Nagle delay, and with unanswered_s the
 * kernel's own watch on the path to the neighbour. A live neighbour's kernel answers
 * keepalives and window probes even while the worker computes a long step, so only
 * a path that is gone trips it. */
static bool tune_connection(int fd, int unanswered_s) {
    int flags = fcntl(fd, F_GETFL), one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (unanswered_s > 0) {
        unsigned user_timeout = (unsigned)unanswered_s * 1000;
        int idle = unanswered_s, interval = unanswered_s / 3 > 0 ? unanswered_s / 3 : 1, count = 3;
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    }
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

/* ------------------------------------------------------------- exchange */

/* One step's traffic in one direction: the header, then the payload, as one stream,
 * so a small step costs one send and no extra round trip. Received, the header is
 * checked before a byte of the payload is taken. With sum_into, the payload is not
 * kept: each slice is added into sum_into as it lands in the ring's scratch (a
 * slice's size, so it is still in cache), while the rest is on its way. */
typedef struct Flow {
    int fd;                     /* -1: nothing to move this way */
    StepHeader header;          /* sent, or received */
    char *data;                 /* the payload, or NULL with sum_into */
    size_t len;                 /* of the payload */
    size_t done;                /* bytes moved, the header's included */
    void *sum_into;             /* received payload added here */
    int64_t dtype;              /* ddp_dtype of the values: f32, f64 or bf16 */
    size_t summed, carried;     /* payload bytes added; bytes of a split value kept at the scratch's start */
} Flow;

static size_t flow_total(const Flow *f) {
    return f->fd < 0 ? 0 : sizeof f->header + f->len;
}

/* bf16 values are added as NCCL adds them: in f32, each sum rounded back to bf16. */
static void add_into(void *dst, const void *src, size_t n, int64_t dtype) {
    if (dtype == DDP_F64) {
        double *d = dst;
        const double *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] += s[i];
    } else if (dtype == DDP_BF16) {
        uint16_t *d = dst;
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = ddp_bf16_from_float(ddp_bf16_to_float(d[i]) + ddp_bf16_to_float(s[i]));
    } else {
        float *d = dst;
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] += s[i];
    }
}

/* A neighbour is gone: remembered for the exit status, and named with its host. The
 * first worker lost may be another (a neighbour stops because its own neighbour
 * died), so the coordinator's word is awaited a moment and preferred. */
static bool lose(ddp_ring *r, int rank, const char *what, const char *how, char *err, size_t errlen) {
    char notice[1024];
    int wake = ddp_link_wake_fd(r->link);
    if (wake >= 0) {
        struct pollfd p = {.fd = wake, .events = POLLIN};
        poll(&p, 1, 2000);
    }
    if (ddp_link_lost(r->link, &r->lost, notice, sizeof notice))
        return ddp_fail(err, errlen, "%s: %s", what, notice);
    r->lost = rank;
    return ddp_fail(err, errlen, "%s: lost rank %d on %s: %s", what, rank, rank >= 0 ? r->hosts[rank] : "?", how);
}

/* Sends what the socket takes of the rest of `out`, at most a slice: > 0 bytes sent,
 * 0 none for now, -1 a failure (errno). */
static ssize_t send_some(ddp_ring *r, Flow *out) {
    struct iovec iov[2];
    int n = 0;
    size_t h = sizeof out->header, payload = out->done > h ? out->done - h : 0, rest = out->len - payload;
    if (out->done < h)
        iov[n++] = (struct iovec){(char *)&out->header + out->done, h - out->done};
    if (rest > 0)
        iov[n++] = (struct iovec){out->data + payload, rest < SLICE ? rest : SLICE};
    ssize_t k = sendmsg(out->fd, &(struct msghdr){.msg_iov = iov, .msg_iovlen = (size_t)n}, MSG_NOSIGNAL);
    if (k < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -1;
    out->done += (size_t)k;
    r->bytes_sent += (uint64_t)k;
    return k;
}

/* Receives what has come of `in`, at most a slice (the header alone first): > 0 bytes,
 * 0 none for now, -1 a failure (errno), -2 the neighbour closed its end. */
static ssize_t receive_some(ddp_ring *r, Flow *in) {
    size_t h = sizeof in->header;
    char *to;
    size_t room;
    if (in->done < h) {
        to = (char *)&in->header + in->done;
        room = h - in->done;
    } else if (in->sum_into) {
        to = (char *)r->scratch + in->carried;
        room = in->len - (in->done - h);
        room = room < SLICE ? room : SLICE;
    } else {
        to = in->data + (in->done - h);
        room = in->len - (in->done - h);
        room = room < SLICE ? room : SLICE;
    }
    ssize_t k = recv(in->fd, to, room, 0);
    if (k == 0)
        return -2;
    if (k < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -1;
    bool payload = in->done >= h;
    in->done += (size_t)k;
    if (payload && in->sum_into) { /* add every whole value that came; keep a split one for later */
        size_t es = (size_t)ddp_dtype_size(in->dtype), have = in->carried + (size_t)k, whole = have / es * es;
        add_into((char *)in->sum_into + in->summed, r->scratch, whole / es, in->dtype);
        in->summed += whole;
        in->carried = have - whole;
        memmove(r->scratch, (char *)r->scratch + whole, in->carried);
    }
    return k;
}

/* The header that came is the one this worker expects, or the neighbour is out of step. */
static bool check_header(ddp_ring *r, const Flow *in, uint32_t index, const char *what, char *err, size_t errlen) {
    const StepHeader *h = &in->header;
    if (h->magic == STEP_MAGIC && h->sequence == r->sequence && h->step == index && h->bytes == in->len)
        return true;
    return ddp_fail(err, errlen, "%s: rank %d is out of step: it sent collective %llu step %u of %llu bytes, "
                                 "and this worker expected collective %llu step %u of %zu bytes",
                    what, (r->rank + r->world - 1) % r->world, (unsigned long long)h->sequence, h->step,
                    (unsigned long long)h->bytes, (unsigned long long)r->sequence, index, in->len);
}

/* Step `index` of the current collective: sends `out` to the next worker while
 * receiving `in` from the one before, whichever is ready (so no size can deadlock two
 * workers both sending), until both are done; false with a message naming the
 * neighbour when it stops answering, closes, fails or is out of step, or the worker
 * the link says was lost. Each side is tried at once and poll waits only when neither
 * moved, so a small step costs no more than its two system calls. */
static bool step(ddp_ring *r, uint32_t index, Flow out, Flow in, const char *what, char *err, size_t errlen) {
    int prev = (r->rank + r->world - 1) % r->world, next = (r->rank + 1) % r->world;
    size_t out_total = flow_total(&out), in_total = flow_total(&in);
    out.header = (StepHeader){STEP_MAGIC, index, r->sequence, out.len};
    double last = ddp_now_ms(), idle_since = 0;
    char how[160];
    while (out.done < out_total || in.done < in_total) {
        bool moved = false;
        if (out.done < out_total) {
            ssize_t k = send_some(r, &out);
            if (k < 0)
                return lose(r, next, what, strerror(errno), err, errlen);
            moved |= k > 0;
        }
        if (in.done < in_total) {
            bool had_header = in.done >= sizeof in.header;
            ssize_t k = receive_some(r, &in);
            if (k == -2)
                return lose(r, prev, what, "it closed the connection", err, errlen);
            if (k < 0)
                return lose(r, prev, what, strerror(errno), err, errlen);
            if (!had_header && in.done >= sizeof in.header && !check_header(r, &in, index, what, err, errlen))
                return false;
            moved |= k > 0;
        }
        if (moved) {
            last = ddp_now_ms();
            idle_since = 0;
            continue;
        }
        double now = ddp_now_ms();
        if (idle_since == 0)
            idle_since = now;
        if (now - idle_since < r->spin_ms) {
            sched_yield(); /* a neighbour sharing this CPU for now gets it */
            continue;
        }
        struct pollfd fds[3] = {{.fd = out.done < out_total ? out.fd : -1, .events = POLLOUT},
                                {.fd = in.done < in_total ? in.fd : -1, .events = POLLIN},
                                {.fd = ddp_link_wake_fd(r->link), .events = POLLIN}};
        int ready = poll(fds, 3, 1000);
        if (ready < 0 && errno != EINTR)
            return ddp_fail(err, errlen, "%s: poll: %s", what, strerror(errno));
        if (fds[2].revents)
            return lose(r, -1, what, "", err, errlen);
        if (ready <= 0 && r->timeout_ms > 0 && ddp_now_ms() - last > r->timeout_ms) {
            snprintf(how, sizeof how, "it has not %s anything for %d s (--peer-timeout)",
                     in.done < in_total ? "sent" : "received", r->timeout_ms / 1000);
            return lose(r, in.done < in_total ? prev : next, what, how, err, errlen);
        }
    }
    return true;
}

/* ----------------------------------------------------------- collectives */

static Flow sending(ddp_ring *r, const void *data, size_t len) {
    return (Flow){.fd = r->next_fd, .data = (char *)data, .len = len};
}

static Flow receiving(ddp_ring *r, void *data, size_t len) {
    return (Flow){.fd = r->prev_fd, .data = data, .len = len};
}

static const Flow no_flow = {.fd = -1};

bool ddp_ring_allreduce(ddp_ring *r, void *data, int64_t count, int64_t dtype, char *err, size_t errlen) {
    int n = r->world;
    size_t es = (size_t)ddp_dtype_size(dtype);
    char *base = data;
    char what[64];
    snprintf(what, sizeof what, "all-reduce %llu", (unsigned long long)r->sequence);
    if (n == 1) {
        r->sequence++;
        return true;
    }
    if (!r->scratch && !(r->scratch = malloc(SLICE + sizeof(double))))
        return ddp_fail(err, errlen, "%s: out of memory", what);
    int64_t begin[n], size[n];
    for (int c = 0; c < n; c++)
        ddp_shard_range(count, n, c, &begin[c], &size[c]);
    for (int s = 0; s < n - 1; s++) { /* reduce-scatter: chunk (rank - s - 1) gathers one more term */
        int out = (r->rank - s + n) % n, in = (r->rank - s - 1 + n) % n;
        Flow sum = receiving(r, NULL, (size_t)size[in] * es);
        sum.sum_into = base + begin[in] * es;
        sum.dtype = dtype;
        if (!step(r, (uint32_t)s, sending(r, base + begin[out] * es, (size_t)size[out] * es), sum, what, err,
                  errlen))
            return false;
    }
    for (int s = 0; s < n - 1; s++) { /* all-gather: the finished chunks go round */
        int out = (r->rank + 1 - s + n) % n, in = (r->rank - s + n) % n;
        if (!step(r, (uint32_t)(n - 1 + s), sending(r, base + begin[out] * es, (size_t)size[out] * es),
                  receiving(r, base + begin[in] * es, (size_t)size[in] * es), what, err, errlen))
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
        Flow out = position == s ? sending(r, data, bytes) : no_flow;
        Flow in = position == s + 1 ? receiving(r, data, bytes) : no_flow;
        if ((out.fd >= 0 || in.fd >= 0) && !step(r, (uint32_t)s, out, in, what, err, errlen))
            return false;
    }
    r->sequence++;
    return true;
}

bool ddp_ring_barrier(ddp_ring *r, char *err, size_t errlen) {
    float token = 0;
    return ddp_ring_allreduce(r, &token, 1, DDP_F32, err, errlen);
}

uint64_t ddp_ring_bytes_sent(const ddp_ring *r) {
    return r->bytes_sent;
}

int ddp_ring_lost(const ddp_ring *r) {
    return r ? r->lost : -1;
}

/* ----------------------------------------------------------- connecting */

/* Edge e of the ring carries data from rank e to rank e + 1. Rank 0, whose port is
 * the coordinator's, never accepts: it connects both its edges, and every other
 * edge is connected by its sender. So rank world - 1 accepts two edges, ranks 1 to
 * world - 2 one each, and the order below (connect before accepting; rank 0 last)
 * never waits in a circle. */
static int edge_connector(int edge, int world) {
    return edge == world - 1 ? 0 : edge;
}

static int edge_acceptor(int edge, int world) {
    return edge == world - 1 ? world - 1 : edge + 1;
}

/* The first message on an edge, after both ends proved they hold the ring's key. */
typedef struct Hello {
    uint32_t magic, version;
    uint32_t edge, connector, world, spare;
    uint64_t program_hash;
} Hello;

static int connect_edge(ddp_ring *r, const ddp_ring_peers *peers, int edge, char *err, size_t errlen) {
    int to = edge_acceptor(edge, r->world);
    char why[512];
    ddp_auth auth;
    ddp_auth_with_key(&auth, peers->key, "ring");
    int fd = ddp_connect(peers->addresses[to], peers->ports[to], peers->deadline, why, sizeof why);
    if (fd < 0) {
        ddp_fail(err, errlen, "forming the ring: rank %d on %s: %s", to, r->hosts[to], why);
        return -1;
    }
    Hello mine = {HELLO_MAGIC, 2, (uint32_t)edge, (uint32_t)r->rank, (uint32_t)r->world, 0, r->program_hash};
    if (!ddp_auth_connect(&auth, fd, peers->deadline, why, sizeof why) ||
        !ddp_send_all(fd, &mine, sizeof mine, peers->deadline)) {
        close(fd);
        ddp_fail(err, errlen, "forming the ring: rank %d on %s (%s:%d): %s", to, r->hosts[to],
                 peers->addresses[to], peers->ports[to], why);
        return -1;
    }
    return fd;
}

/* Accepts connections until every edge this rank accepts has come; a stray or one
 * that fails the handshake is refused and logged, and the wait goes on. */
static bool accept_edges(ddp_ring *r, const ddp_ring_peers *peers, char *err, size_t errlen) {
    int edges[2], want = 0;
    for (int e = 0; e < r->world; e++)
        if (edge_acceptor(e, r->world) == r->rank && edge_connector(e, r->world) != r->rank)
            edges[want++] = e;
    ddp_auth auth;
    ddp_auth_with_key(&auth, peers->key, "ring");
    while (want > 0) {
        struct pollfd p = {.fd = peers->listener, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) {
            if (ddp_now_ms() <= peers->deadline)
                continue;
            return ddp_fail(err, errlen, "forming the ring: rank %d did not connect in time",
                            edge_connector(edges[0], r->world));
        }
        struct sockaddr_in a;
        socklen_t alen = sizeof a;
        int fd = accept4(peers->listener, (struct sockaddr *)&a, &alen, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        char why[512] = "", from[64];
        inet_ntop(AF_INET, &a.sin_addr, from, sizeof from);
        Hello theirs = {0};
        double deadline = ddp_now_ms() + DDP_HANDSHAKE_MS;
        bool ok = ddp_auth_accept(&auth, fd, deadline, why, sizeof why) &&
                  ddp_recv_all(fd, &theirs, sizeof theirs, deadline) == 1;
        int slot = -1;
        for (int i = 0; ok && i < want; i++)
            if (theirs.magic == HELLO_MAGIC && theirs.version == 2 && theirs.edge == (uint32_t)edges[i] &&
                theirs.connector == (uint32_t)edge_connector(edges[i], r->world) && theirs.world == (uint32_t)r->world)
                slot = i;
        if (ok && slot >= 0 && theirs.program_hash != r->program_hash) {
            close(fd);
            return ddp_fail(err, errlen, "rank %u runs another program (hash %016llx, this is %016llx): start the "
                            "same program on every worker", theirs.connector, (unsigned long long)theirs.program_hash,
                            (unsigned long long)r->program_hash);
        }
        if (slot < 0) {
            ddp_error("refused a connection from %s to the ring's port: %s", from,
                      why[0] ? why : "it is not a worker of this job");
            close(fd);
            continue;
        }
        if (edges[slot] == r->rank)
            r->next_fd = fd;
        else
            r->prev_fd = fd;
        edges[slot] = edges[--want];
    }
    return true;
}

/* Waking from poll costs tens of microseconds, more than a small step takes: a step
 * whose neighbour is about to answer does better to try again for a moment. Only
 * where every worker of this machine has a CPU of its own, since a spinning worker
 * would otherwise hold up the very neighbour it waits for. */
static double spin_budget_ms(const ddp_ring_peers *peers) {
    int local = 0;
    for (int i = 0; i < peers->world; i++)
        local += strcmp(peers->hosts[i], peers->hosts[peers->rank]) == 0;
    cpu_set_t mine;
    int cpus = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : 1;
    return local <= cpus ? SPIN_US / 1000.0 : 0;
}

ddp_ring *ddp_ring_connect(const ddp_ring_peers *peers, char *err, size_t errlen) {
    ddp_ring *r = calloc(1, sizeof *r);
    if (!r) {
        ddp_fail(err, errlen, "out of memory");
        return NULL;
    }
    *r = (ddp_ring){.rank = peers->rank, .world = peers->world, .next_fd = -1, .prev_fd = -1,
                    .program_hash = peers->program_hash, .timeout_ms = peers->timeout_s * 1000, .lost = -1,
                    .link = peers->link, .spin_ms = spin_budget_ms(peers)};
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
    int w = r->world, prev_edge = (r->rank + w - 1) % w;
    bool ok = true;
    if (r->rank == 0) { /* the edge from world - 1 first: that rank accepts from the start */
        ok = (r->prev_fd = connect_edge(r, peers, prev_edge, err, errlen)) >= 0 &&
             (r->next_fd = connect_edge(r, peers, 0, err, errlen)) >= 0;
    } else {
        if (edge_connector(r->rank, w) == r->rank)
            ok = (r->next_fd = connect_edge(r, peers, r->rank, err, errlen)) >= 0;
        ok = ok && accept_edges(r, peers, err, errlen);
    }
    if (ok)
        ok = tune_connection(r->next_fd, peers->unanswered_s) && tune_connection(r->prev_fd, peers->unanswered_s);
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

int ddp_ring_rank(const ddp_ring *r) {
    return r->rank;
}

int ddp_ring_world(const ddp_ring *r) {
    return r->world;
}
