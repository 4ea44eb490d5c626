/* coordinator_link.c: each worker's link to the coordinator (coordinator.c), and the thread
 * that keeps it: heartbeats out every beat, the coordinator's heartbeats and notices
 * in, replies handed to the main thread.
 *
 * Worker 0 starts the coordinator first, on the coordinator's port, and then
 * connects to it like everyone else, so one code path serves all. The others connect
 * with retries until the rendezvous timeout, since srun starts tasks in no order.
 *
 * When a worker is lost (the coordinator says so, or the coordinator itself goes
 * silent or away), the link remembers who and why, and makes its wake descriptor
 * readable: the ring polls it, so a worker blocked in a collective stops at once. A
 * worker busy computing meets the news at its next collective; should it not get
 * there within a grace period, the link thread ends the process itself, so no worker
 * is ever left behind (S12). Its status is 3, a worker lost, unless the lost worker
 * ended with an error of its own (a bad data file, a refused setting): then every
 * worker ends with that worker's status, so the job's status (srun gives the highest
 * of its tasks') says what happened. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime.h"

enum { GRACE_MS = 5000, TEXT = 4096 };

struct ddp_link {
    int fd, rank, world;
    char coordinator[300];      /* host:port, for messages */
    char coordinator_host[256];
    ddp_coordinator *served;          /* worker 0's: the coordinator it serves */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t send_lock;  /* the main thread's frames and the beats */
    pthread_mutex_t lock;
    pthread_cond_t replied;
    ddp_frame reply;            /* TABLE, VALUE or REFUSED for the main thread */
    bool has_reply;
    bool closing, closed;       /* closing: the goodbye is sent; closed: the connection is gone */
    int wake_fd;
    bool lost;
    bool lost_seen;             /* a collective or the main thread met the loss: it is on its way out */
    double deferred_until;      /* ms: another thread's own way out ends the process by then if it must */
    bool awaiting;              /* the main thread waits for a reply */
    int lost_rank;
    int lost_status;            /* what this worker ends with for the loss: 3, or the lost one's own */
    char lost_text[TEXT];
    double lost_at;
    double last_heard, last_beat;
    double clock_offset;        /* this clock minus the coordinator's, at best */
    int peer_timeout_ms, beat_ms;
    atomic_llong step;          /* what the main thread is at, for the last-resort message */
    char prog[256];
};

/* ------------------------------------------------------------- losses */

static void set_lost(ddp_link *l, int rank, int status, const char *text) {
    pthread_mutex_lock(&l->lock);
    if (!l->lost) {
        l->lost = true;
        l->lost_rank = rank;
        l->lost_status = status;
        snprintf(l->lost_text, sizeof l->lost_text, "%.4000s", text);
        l->lost_at = ddp_now_ms();
        uint64_t one = 1;
        (void)!write(l->wake_fd, &one, sizeof one);
    }
    pthread_cond_broadcast(&l->replied);
    pthread_mutex_unlock(&l->lock);
}

/* A LOST notice: "rank R\nhost H\nstatus S\nreason ..." */
static void notice(ddp_link *l, const char *text) {
    int64_t rank = -1, status = 3;
    char host[256] = "?", reason[TEXT] = "", line[TEXT + 300];
    ddp_text_number(text, "rank", &rank);
    ddp_text_field(text, "host", host, sizeof host);
    ddp_text_number(text, "status", &status);
    const char *r = strstr(text, "\nreason ");
    snprintf(reason, sizeof reason, "%s", r ? r + 8 : "no reason given");
    snprintf(line, sizeof line, "lost rank %lld on %s: %s", (long long)rank, host, reason);
    set_lost(l, (int)rank, status > 0 && status < 256 ? (int)status : 3, line);
}

bool ddp_link_lost(ddp_link *l, int *rank, char *text, size_t len) {
    if (!l)
        return false;
    pthread_mutex_lock(&l->lock);
    bool lost = l->lost;
    l->lost_seen |= lost;
    if (lost) {
        if (rank)
            *rank = l->lost_rank;
        if (text)
            snprintf(text, len, "%s", l->lost_text);
    }
    pthread_mutex_unlock(&l->lock);
    return lost;
}

void ddp_link_defer(ddp_link *l, double until_ms) {
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    if (until_ms > l->deferred_until)
        l->deferred_until = until_ms;
    pthread_mutex_unlock(&l->lock);
}

int ddp_link_lost_status(ddp_link *l) {
    if (!l)
        return 3;
    pthread_mutex_lock(&l->lock);
    int status = l->lost ? l->lost_status : 3;
    pthread_mutex_unlock(&l->lock);
    return status;
}

int ddp_link_wake_fd(const ddp_link *l) {
    return l ? l->wake_fd : -1;
}

void ddp_link_at_step(ddp_link *l, int64_t step) {
    if (l)
        atomic_store(&l->step, step);
}

/* --------------------------------------------------------------- thread */

static void take(ddp_link *l, ddp_frame *f) {
    switch (f->type) {
    case DDP_MSG_BEAT: {
        double theirs = atof(f->data), offset = ddp_now_ms() - theirs;
        pthread_mutex_lock(&l->lock);
        if (l->clock_offset == 0 || offset < l->clock_offset)
            l->clock_offset = offset;
        pthread_mutex_unlock(&l->lock);
        ddp_frame_free(f);
        return;
    }
    case DDP_MSG_LOST:
        notice(l, f->data);
        ddp_frame_free(f);
        return;
    default: /* a reply: the main thread waits for exactly one at a time */
        pthread_mutex_lock(&l->lock);
        if (f->type == DDP_MSG_VALUE && !l->awaiting) { /* too late: its request timed out */
            pthread_mutex_unlock(&l->lock);
            ddp_frame_free(f);
            return;
        }
        ddp_frame_free(&l->reply);
        l->reply = *f;
        l->has_reply = true;
        pthread_cond_broadcast(&l->replied);
        pthread_mutex_unlock(&l->lock);
        memset(f, 0, sizeof *f);
    }
}

static bool send_frame(ddp_link *l, int type, const void *payload, size_t len) {
    pthread_mutex_lock(&l->send_lock);
    bool ok = ddp_frame_send(l->fd, type, payload, len, ddp_now_ms() + l->peer_timeout_ms);
    pthread_mutex_unlock(&l->send_lock);
    return ok;
}

static bool is_closing(ddp_link *l) {
    pthread_mutex_lock(&l->lock);
    bool c = l->closing;
    pthread_mutex_unlock(&l->lock);
    return c;
}

static void gone(ddp_link *l, const char *how) {
    char text[1024];
    pthread_mutex_lock(&l->lock);
    snprintf(text, sizeof text, "lost rank 0 on %.200s, the coordinator (%.300s): %.400s", l->coordinator_host,
             l->coordinator, how);
    pthread_mutex_unlock(&l->lock);
    set_lost(l, 0, 3, text);
}

/* The last resort: the main thread did not act on a loss in time. */
static void give_up(ddp_link *l) {
    char text[TEXT];
    ddp_link_lost(l, NULL, text, sizeof text);
    ddp_error("%s; this worker was computing step %lld and did not reach a collective within %d s: ending it",
              text, (long long)atomic_load(&l->step), GRACE_MS / 1000);
    _exit(ddp_link_lost_status(l));
}

static void *keep(void *arg) {
    pthread_setname_np(pthread_self(), "ddp-heartbeat");
    ddp_link *l = arg;
    ddp_reader in = {0};
    while (!is_closing(l)) { /* once closing, the goodbye is sent and nothing more matters */
        struct pollfd p = {.fd = l->closed ? -1 : l->fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) {
            for (;;) {
                ddp_frame f = {0};
                const char *problem;
                int got = ddp_reader_feed(&in, l->fd, DDP_WIRE_MAX, &f, &problem);
                if (got == 1) {
                    take(l, &f);
                    l->last_heard = ddp_now_ms();
                    continue;
                }
                if (got < 0) {
                    l->closed = true;
                    gone(l, got == -1 ? "its connection closed: worker 0 ended or was killed" : problem);
                }
                break;
            }
        }
        double now = ddp_now_ms();
        if (!l->closed && now - l->last_beat >= l->beat_ms) {
            l->last_beat = now;
            if (!send_frame(l, DDP_MSG_BEAT, NULL, 0))
                gone(l, "it no longer takes heartbeats");
        }
        if (!l->closed && now - l->last_heard > l->peer_timeout_ms) {
            char how[160];
            snprintf(how, sizeof how, "it has not answered for %d s (frozen, or its host unreachable; "
                     "--peer-timeout)", l->peer_timeout_ms / 1000);
            gone(l, how);
            l->last_heard = now;
        }
        pthread_mutex_lock(&l->lock);
        bool overdue = l->lost && !l->lost_seen && !l->closing && now - l->lost_at > GRACE_MS &&
                       now > l->deferred_until;
        pthread_mutex_unlock(&l->lock);
        if (overdue)
            give_up(l);
    }
    ddp_reader_free(&in);
    return NULL;
}

/* ------------------------------------------------------------- opening */

static bool connect_coordinator(ddp_link *l, const ddp_link_config *cfg, char *err, size_t errlen) {
    const ddp_cluster *c = cfg->cluster;
    double deadline = ddp_now_ms() + cfg->rendezvous_timeout_s * 1000.0;
    char why[1024];
    /* on the coordinator's node, through loopback: a node's own name need not resolve
     * there (Slurm's node names are its own), and the table gives the others the
     * address they reach it at (coordinator.c) */
    bool same_node = c->rank == 0 || strcmp(c->host, c->coordinator) == 0;
    const char *host = same_node ? "127.0.0.1" : c->coordinator;
    snprintf(l->coordinator, sizeof l->coordinator, "%s:%lld", c->coordinator, (long long)c->port_base);
    snprintf(l->coordinator_host, sizeof l->coordinator_host, "%s", c->coordinator);
    if (c->rank == 0) {
        int listener = ddp_listen((int)c->port_base, why, sizeof why);
        if (listener < 0)
            return ddp_fail(err, errlen, "the coordinator cannot listen: %s", why);
        ddp_coordinator_config sc = {listener, (int)c->world, *cfg->auth, cfg->peer_timeout_s * 1000, l->beat_ms,
                               deadline, cfg->rendezvous_timeout_s};
        if (!(l->served = ddp_coordinator_start(&sc, err, errlen))) {
            close(listener);
            return false;
        }
    }
    /* tries until the deadline, saying every so often that it waits */
    double started = ddp_now_ms(), every = ddp_wait_notice_ms(cfg->rendezvous_timeout_s);
    for (;;) {
        double until = ddp_now_ms() + every;
        l->fd = ddp_connect(host, (int)c->port_base, until < deadline ? until : deadline, why, sizeof why);
        if (l->fd >= 0 || ddp_now_ms() >= deadline)
            break;
        ddp_error("waiting for the coordinator (rank 0) at %s: %.0f s of the %d s --rendezvous-timeout (%s)",
                  l->coordinator, (ddp_now_ms() - started) / 1000, cfg->rendezvous_timeout_s, why);
    }
    if (l->fd < 0)
        return ddp_fail(err, errlen, "no coordinator (rank 0) at %s within %d s (--rendezvous-timeout): %s. Is "
                                     "rank 0 running, and is this its host and port?", l->coordinator,
                        cfg->rendezvous_timeout_s, why);
    /* the coordinator may be busy with strays' handshakes: wait for it until the
     * rendezvous deadline, but give a connection made at the last moment its chance */
    double proof_deadline = deadline > ddp_now_ms() + DDP_HANDSHAKE_MS ? deadline : ddp_now_ms() + DDP_HANDSHAKE_MS;
    if (!ddp_auth_connect(cfg->auth, l->fd, proof_deadline, why, sizeof why))
        return ddp_fail(err, errlen, "the coordinator at %s: %s", l->coordinator, why);
    char hello[512];
    int n = snprintf(hello, sizeof hello, "rank %lld\nworld %lld\nhost %s", (long long)c->rank, (long long)c->world,
                     c->host);
    if (!ddp_frame_send(l->fd, DDP_MSG_HELLO, hello, (size_t)n, deadline))
        return ddp_fail(err, errlen, "the coordinator at %s closed the connection", l->coordinator);
    return true;
}

ddp_link *ddp_link_open(const ddp_link_config *cfg, char *err, size_t errlen) {
    ddp_link *l = calloc(1, sizeof *l);
    if (!l) {
        ddp_fail(err, errlen, "out of memory");
        return NULL;
    }
    l->fd = -1;
    l->rank = (int)cfg->cluster->rank;
    l->world = (int)cfg->cluster->world;
    l->peer_timeout_ms = cfg->peer_timeout_s * 1000;
    l->beat_ms = l->peer_timeout_ms / 4 < 1000 ? l->peer_timeout_ms / 4 : 1000;
    pthread_mutex_init(&l->send_lock, NULL);
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->replied, NULL);
    l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->wake_fd < 0 || !connect_coordinator(l, cfg, err, errlen)) {
        if (l->wake_fd < 0)
            ddp_fail(err, errlen, "eventfd: %s", strerror(errno));
        ddp_link_close(l);
        return NULL;
    }
    l->last_heard = l->last_beat = ddp_now_ms();
    if (pthread_create(&l->thread, NULL, keep, l) != 0) {
        ddp_fail(err, errlen, "cannot start the heartbeat thread");
        ddp_link_close(l);
        return NULL;
    }
    l->thread_started = true;
    return l;
}

/* ----------------------------------------------------------- requests */

/* Waits for the reply to the request just sent; false with the refusal, the loss or
 * the timeout in err. notice_ms > 0 (the rendezvous): a long wait for the others to
 * join is reported that often. */
static bool await_reply(ddp_link *l, int type, ddp_frame *out, double deadline, const char *what, double notice_ms,
                        bool *lost, char *err, size_t errlen) {
    double started = ddp_now_ms(), noticed = started;
    pthread_mutex_lock(&l->lock);
    while (!l->has_reply && !l->lost && ddp_now_ms() < deadline) {
        if (notice_ms > 0 && ddp_now_ms() - noticed >= notice_ms) {
            noticed = ddp_now_ms();
            ddp_error("waiting for the other workers to join: %.0f s so far (the coordinator at %s says whom "
                      "it waits for)", (noticed - started) / 1000, l->coordinator);
        }
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 100 * 1000 * 1000;
        if (t.tv_nsec >= 1000000000)
            t.tv_sec++, t.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&l->replied, &l->lock, &t);
    }
    bool ok = false;
    l->awaiting = false;
    if (l->has_reply && l->reply.type == DDP_MSG_REFUSED)
        ddp_fail(err, errlen, "the job cannot start: %s", l->reply.data);
    else if (l->has_reply && l->reply.type == type) {
        *out = l->reply;
        memset(&l->reply, 0, sizeof l->reply);
        ok = true;
    } else if (l->has_reply)
        ddp_fail(err, errlen, "%s: the coordinator sent an unexpected message", what);
    else if (l->lost) {
        ddp_fail(err, errlen, "%s", l->lost_text);
        *lost = true;
    }
    else
        ddp_fail(err, errlen, "%s: no answer from the coordinator at %s in time", what, l->coordinator);
    ddp_frame_free(&l->reply);
    l->has_reply = false;
    pthread_mutex_unlock(&l->lock);
    return ok;
}

static bool parse_table(const char *text, int world, ddp_table *t, char *err, size_t errlen) {
    char key[80];
    int64_t w;
    if (!ddp_text_number(text, "world", &w) || w != world || !ddp_text_field(text, "key", key, sizeof key) ||
        strlen(key) != 64)
        return ddp_fail(err, errlen, "the coordinator sent a malformed table");
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(key + 2 * i, "%2x", &v);
        t->key[i] = (unsigned char)v;
    }
    t->world = world;
    t->peers = calloc((size_t)world, sizeof *t->peers);
    if (!t->peers)
        return ddp_fail(err, errlen, "out of memory");
    for (const char *line = strstr(text, "\nworker "); line; line = strstr(line + 1, "\nworker ")) {
        int rank, port, used = 0;
        char address[64], host[256];
        if (sscanf(line, "\nworker %d %63s %d %255s%n", &rank, address, &port, host, &used) != 4 || rank < 0 ||
            rank >= world)
            return ddp_fail(err, errlen, "the coordinator sent a malformed table");
        snprintf(t->peers[rank].address, sizeof t->peers[rank].address, "%s", address);
        snprintf(t->peers[rank].host, sizeof t->peers[rank].host, "%s", host);
        t->peers[rank].port = port;
    }
    return true;
}

bool ddp_link_join(ddp_link *l, const char *join, ddp_table *table, int timeout_s, bool *lost, char *err,
                   size_t errlen) {
    memset(table, 0, sizeof *table);
    *lost = false;
    ddp_frame f;
    if (!send_frame(l, DDP_MSG_JOIN, join, strlen(join))) {
        if (!(*lost = ddp_link_lost(l, NULL, err, errlen)))
            ddp_fail(err, errlen, "the coordinator at %s closed the connection", l->coordinator);
        return false;
    }
    /* the coordinator gives up at its own deadline and says who is missing; this
     * wait is only in case it cannot */
    if (!await_reply(l, DDP_MSG_TABLE, &f, ddp_now_ms() + timeout_s * 1000.0 + 10000, "the rendezvous",
                     l->rank == 0 ? 0 : ddp_wait_notice_ms(timeout_s), lost, err, errlen))
        return false;
    bool ok = parse_table(f.data, l->world, table, err, errlen);
    ddp_frame_free(&f);
    if (ok) { /* from now on rank 0 is named as the job names its host */
        pthread_mutex_lock(&l->lock);
        snprintf(l->coordinator_host, sizeof l->coordinator_host, "%s", table->peers[0].host);
        pthread_mutex_unlock(&l->lock);
    }
    return ok;
}

void ddp_table_free(ddp_table *t) {
    free(t->peers);
    t->peers = NULL;
}

bool ddp_link_set(ddp_link *l, const char *key, const void *value, size_t len, char *err, size_t errlen) {
    size_t k = strlen(key) + 1;
    char *payload = malloc(k + len);
    if (!payload)
        return ddp_fail(err, errlen, "out of memory");
    memcpy(payload, key, k);
    memcpy(payload + k, value, len);
    bool ok = send_frame(l, DDP_MSG_SET, payload, k + len);
    free(payload);
    return ok || ddp_fail(err, errlen, "storing %s: the coordinator at %s closed the connection", key, l->coordinator);
}

bool ddp_link_get(ddp_link *l, const char *key, ddp_frame *value, int timeout_s, char *err, size_t errlen) {
    pthread_mutex_lock(&l->lock);
    l->awaiting = true; /* before the request: the reply may come at once */
    pthread_mutex_unlock(&l->lock);
    if (!send_frame(l, DDP_MSG_GET, key, strlen(key) + 1))
        return ddp_fail(err, errlen, "reading %s: the coordinator at %s closed the connection", key, l->coordinator);
    bool lost;
    return await_reply(l, DDP_MSG_VALUE, value, ddp_now_ms() + timeout_s * 1000.0, key, 0, &lost, err, errlen);
}

double ddp_link_clock_offset(ddp_link *l) {
    if (!l)
        return 0;
    pthread_mutex_lock(&l->lock);
    double d = l->clock_offset;
    pthread_mutex_unlock(&l->lock);
    return d;
}

/* ------------------------------------------------------------- closing */

static void finish(ddp_link *l, int type, const char *text, double linger_ms) {
    if (!l)
        return;
    if (l->fd >= 0) {
        send_frame(l, type, text, text ? strlen(text) : 0);
        shutdown(l->fd, SHUT_WR);
    }
    pthread_mutex_lock(&l->lock);
    l->closing = true;
    pthread_mutex_unlock(&l->lock);
    if (l->thread_started)
        pthread_join(l->thread, NULL);
    /* worker 0 serves until every other worker has said goodbye, or the time is up */
    ddp_coordinator_stop(l->served, ddp_now_ms() + linger_ms);
    if (l->fd >= 0)
        close(l->fd);
    if (l->wake_fd >= 0)
        close(l->wake_fd);
    ddp_frame_free(&l->reply);
    pthread_mutex_destroy(&l->send_lock);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->replied);
    free(l);
}

void ddp_link_close(ddp_link *l) {
    finish(l, DDP_MSG_BYE, NULL, l ? l->peer_timeout_ms : 0);
}

void ddp_link_abort(ddp_link *l, int status, const char *message) {
    char text[TEXT];
    snprintf(text, sizeof text, "status %d\nreason %.4000s", status, message);
    finish(l, DDP_MSG_ABORT, text, 10000);
}
