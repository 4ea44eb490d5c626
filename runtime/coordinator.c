/* coordinator.c: the coordinator, a thread of worker 0 serving every worker of the job
 * (worker 0's own link included) on the coordinator's port.
 *
 * What it does, in the order a job meets it:
 * - handshakes: each connection proves it belongs to the job (auth.c) in a short
 *   thread of its own, so a stray that connects and says nothing holds up no one;
 *   what fails is refused, logged, and never read further;
 * - the rendezvous: each worker says who it is (HELLO) as soon as it connects, and
 *   what it will run (JOIN: the program's hash and the settings in effect, its
 *   data's sizes, where its ring listens) once its data is read; when the whole
 *   world has joined with one program and one set of settings, every worker gets the
 *   table of everyone's address and the ring's key; otherwise every worker gets the
 *   same refusal, naming the rank and the setting that differ;
 * - a key-value store (SET, GET that waits for its key) for what workers exchange
 *   later: the traces now, the NCCL id with GPUs;
 * - the heartbeat: every connection beats both ways; a worker whose connection
 *   closes without a goodbye, or that is silent past the peer timeout, is lost, and
 *   every other worker is told at once, naming it (S12).
 * Everything runs from one poll loop over non-blocking sockets with a queue of bytes
 * to send per connection, so a frozen worker cannot stall the coordinator. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime.h"

enum { MAX_HANDSHAKES = 64, TEXT = 4096 };

typedef struct Conn {
    int fd;
    char peer[64];              /* address:port, for the log */
    char address[64];           /* the address it connected from */
    char local[64];             /* the coordinator's address it connected to */
    int rank;                   /* -1 until its HELLO */
    bool refused;               /* at its HELLO: it is told so, and nothing it sends counts */
    bool joined, left;
    double last_heard;
    ddp_reader in;
    char *out;                  /* bytes queued to send */
    size_t out_len, out_cap;
} Conn;

typedef struct Worker {
    int conn;                   /* index in conns, -1 */
    char host[256];
    char *join;                 /* its JOIN text once joined */
    bool seen;                  /* it said HELLO */
    bool lost;
} Worker;

typedef struct Entry {
    char *key;
    ddp_frame value;
} Entry;

typedef struct Pending {
    int conn;
    char *key;
} Pending;

struct ddp_coordinator {
    ddp_coordinator_config cfg;
    pthread_t thread;
    int wake[2];                /* handshakes done (their fds), and the stop request (-1) */
    pthread_mutex_t lock;       /* handshakes, stopping */
    int handshakes;
    int handshake_fds[MAX_HANDSHAKES]; /* theirs, -1 where none: shut down when the coordinator stops */
    bool full_logged;           /* that connections wait for a handshake to end */
    int port;                   /* the coordinator's, for the log */
    bool stopping;              /* asked by ddp_coordinator_stop */
    bool stop_seen;             /* the loop's copy, read without the lock */
    double stop_deadline;
    Conn *conns;
    int nconns, capconns;
    Worker *workers;
    int joined;
    bool table_sent;
    char refusal[TEXT];         /* once set, every worker gets it */
    char failure[TEXT];         /* a worker lost or failed: told to every worker that comes */
    Entry *entries;
    int nentries;
    Pending *pending;
    int npending;
    double last_beat;
    double started, last_notice; /* the rendezvous: when it began, when a wait was last reported */
    unsigned char ring_key[32];
};

__attribute__((format(printf, 2, 3))) static void log_line(ddp_coordinator *s, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ddp_error("coordinator at port %d: %s", s->port, text);
}

/* --------------------------------------------------------------- sending */

static void queue(ddp_coordinator *s, int c, int type, const void *payload, size_t len) {
    Conn *k = &s->conns[c];
    ddp_frame_header h = ddp_frame_header_for(type, len);
    size_t need = k->out_len + sizeof h + len;
    if (k->fd < 0 || len > DDP_WIRE_MAX)
        return;
    if (need > k->out_cap) {
        size_t cap = need * 2;
        char *grown = realloc(k->out, cap);
        if (!grown)
            return;
        k->out = grown;
        k->out_cap = cap;
    }
    memcpy(k->out + k->out_len, &h, sizeof h);
    memcpy(k->out + k->out_len + sizeof h, payload, len);
    k->out_len = need;
}

static void queue_text(ddp_coordinator *s, int c, int type, const char *text) {
    queue(s, c, type, text, strlen(text));
}

static void flush_out(Conn *k) {
    while (k->out_len) {
        ssize_t n = send(k->fd, k->out, k->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0)
            return;
        memmove(k->out, k->out + n, k->out_len - (size_t)n);
        k->out_len -= (size_t)n;
    }
}

static void drop(ddp_coordinator *s, int c) {
    Conn *k = &s->conns[c];
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
    ddp_reader_free(&k->in);
    free(k->out);
    k->out = NULL;
    k->out_len = k->out_cap = 0;
    if (k->rank >= 0 && s->workers[k->rank].conn == c)
        s->workers[k->rank].conn = -1;
    for (int i = 0; i < s->npending;) { /* its requests die with it */
        if (s->pending[i].conn != c) {
            i++;
            continue;
        }
        free(s->pending[i].key);
        s->pending[i] = s->pending[--s->npending];
    }
}

/* Every worker still there gets the same text, but rank except_rank (-1: none). A
 * connection that has not said which rank it is yet hears it too: a worker slow to
 * start (rank 0's own, on a busy machine) would otherwise wait for its timeout. */
static void tell_all(ddp_coordinator *s, int type, const char *text, int except_rank) {
    for (int c = 0; c < s->nconns; c++)
        if (s->conns[c].fd >= 0 && (except_rank < 0 || s->conns[c].rank != except_rank) && !s->conns[c].left)
            queue_text(s, c, type, text);
}

static void refuse_all(ddp_coordinator *s, const char *text) {
    if (!s->refusal[0])
        snprintf(s->refusal, sizeof s->refusal, "%s", text);
    tell_all(s, DDP_MSG_REFUSED, s->refusal, -1);
}

/* Rank r is gone: every other worker hears it once. Once worker 0 stops the
 * coordinator, connections that close are goodbyes, not losses; a failure a worker
 * reported is still told, with the status it ends with (status 3: it did not say, it
 * died or went silent). A job refused before it formed has told every
 * worker why: the failures and goodbyes that follow are that refusal's echoes, and
 * telling them too would race it (a worker hearing of a loss before the refusal). */
static void lose(ddp_coordinator *s, int rank, const char *reason, bool failed, int status) {
    Worker *w = &s->workers[rank];
    if (w->lost || (s->stop_seen && !failed) || (s->refusal[0] && !s->table_sent))
        return;
    w->lost = true;
    char text[TEXT];
    snprintf(text, sizeof text, "rank %d\nhost %s\nstatus %d\nreason %s", rank, w->host[0] ? w->host : "?", status,
             reason);
    if (!s->failure[0])
        snprintf(s->failure, sizeof s->failure, "%s", text);
    tell_all(s, DDP_MSG_LOST, text, rank);
}

/* ------------------------------------------------------------ handshakes */

typedef struct Handshake {
    ddp_coordinator *store;
    int fd;
    char peer[64];
} Handshake;

/* Keeps or forgets a running handshake's fd; under the lock. */
static void track_handshake(ddp_coordinator *s, int fd, bool running) {
    for (int i = 0; i < MAX_HANDSHAKES; i++)
        if (s->handshake_fds[i] == (running ? -1 : fd)) {
            s->handshake_fds[i] = running ? fd : -1;
            return;
        }
}

static void *handshake(void *arg) {
    pthread_setname_np(pthread_self(), "ddp-handshake");
    Handshake *h = arg;
    ddp_coordinator *s = h->store;
    char why[512];
    bool ok = ddp_auth_accept(&s->cfg.auth, h->fd, ddp_now_ms() + DDP_HANDSHAKE_MS, why, sizeof why);
    if (!ok)
        log_line(s, "refused a connection from %s: %s", h->peer, why);
    int result = ok ? h->fd : -2;
    pthread_mutex_lock(&s->lock);
    track_handshake(s, h->fd, false); /* before the close, so a stop never shuts down a reused fd */
    s->handshakes--;
    if (!ok)
        close(h->fd);
    (void)!write(s->wake[1], &result, sizeof result);
    pthread_mutex_unlock(&s->lock);
    free(h);
    return NULL;
}

static void accept_new(ddp_coordinator *s) {
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int fd = accept4(s->cfg.listener, (struct sockaddr *)&a, &alen, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    Handshake *h = malloc(sizeof *h);
    pthread_mutex_lock(&s->lock);
    bool room = h && s->handshakes < MAX_HANDSHAKES; /* even while stopping: a late worker hears why */
    if (room) {
        s->handshakes++;
        track_handshake(s, fd, true);
    }
    pthread_mutex_unlock(&s->lock);
    pthread_t t;
    if (room) {
        *h = (Handshake){s, fd, ""};
        inet_ntop(AF_INET, &a.sin_addr, h->peer, sizeof h->peer);
        snprintf(h->peer + strlen(h->peer), sizeof h->peer - strlen(h->peer), ":%d", ntohs(a.sin_port));
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        room = pthread_create(&t, &attr, handshake, h) == 0;
        pthread_attr_destroy(&attr);
        if (room)
            return;
        pthread_mutex_lock(&s->lock);
        track_handshake(s, fd, false);
        s->handshakes--;
        pthread_mutex_unlock(&s->lock);
    }
    log_line(s, "refused a connection: %s", h ? "cannot start a thread for its handshake" : "out of memory");
    free(h);
    close(fd);
}

/* Whether a new connection can be taken now. While MAX_HANDSHAKES are under way (a
 * flood of strays, each dropped after DDP_HANDSHAKE_MS) the others wait in the
 * listener's queue, and a worker among them is taken when a place frees. */
static bool handshake_room(ddp_coordinator *s) {
    pthread_mutex_lock(&s->lock);
    bool room = s->handshakes < MAX_HANDSHAKES;
    pthread_mutex_unlock(&s->lock);
    if (!room && !s->full_logged)
        log_line(s, "%d connections are proving that they belong to the job; the next wait their turn",
                 MAX_HANDSHAKES);
    s->full_logged = !room;
    return room;
}

static void add_conn(ddp_coordinator *s, int fd) {
    if (s->nconns == s->capconns) {
        int cap = s->capconns ? 2 * s->capconns : 16;
        Conn *grown = realloc(s->conns, sizeof *grown * (size_t)cap);
        if (!grown) {
            close(fd);
            return;
        }
        s->conns = grown;
        s->capconns = cap;
    }
    Conn *k = &s->conns[s->nconns++];
    memset(k, 0, sizeof *k);
    k->fd = fd;
    k->rank = -1;
    k->last_heard = ddp_now_ms();
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    if (getpeername(fd, (struct sockaddr *)&a, &alen) == 0) {
        inet_ntop(AF_INET, &a.sin_addr, k->address, sizeof k->address);
        snprintf(k->peer, sizeof k->peer, "%.46s:%d", k->address, ntohs(a.sin_port));
    }
    alen = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        inet_ntop(AF_INET, &a.sin_addr, k->local, sizeof k->local);
    if (s->refusal[0])
        queue_text(s, s->nconns - 1, DDP_MSG_REFUSED, s->refusal);
}

/* ------------------------------------------------------------- rendezvous */

static bool is_loopback(const char *address) {
    return strncmp(address, "127.", 4) == 0;
}

/* The coordinator's node as the other nodes reach it: the address a worker from
 * another node connected to; NULL when every worker connected through loopback (one
 * node). Workers on the coordinator's node connect through loopback, and their ring
 * listeners are reached at this address from the other nodes. */
static const char *coordinator_node_address(const ddp_coordinator *s) {
    for (int r = 0; r < s->cfg.world; r++) {
        const Conn *k = &s->conns[s->workers[r].conn];
        if (!is_loopback(k->address) && k->local[0] && !is_loopback(k->local))
            return k->local;
    }
    return NULL;
}

/* The first line of `setting` lines where a and b differ, or NULL. */
static const char *first_difference(const char *a, const char *b, char *name, size_t len) {
    const char *p = strstr(a, "\nsetting "), *q = strstr(b, "\nsetting ");
    while (p && q) {
        const char *pe = strchr(p + 1, '\n'), *qe = strchr(q + 1, '\n');
        size_t pl = pe ? (size_t)(pe - p) : strlen(p), ql = qe ? (size_t)(qe - q) : strlen(q);
        if (pl != ql || memcmp(p, q, pl) != 0) {
            const char *n = p + 9, *end = strchr(n, ' ');
            size_t nl = end && (size_t)(end - n) < len ? (size_t)(end - n) : 0;
            memcpy(name, n, nl);
            name[nl] = 0;
            return p;
        }
        p = pe, q = qe;
    }
    if (p || q) {
        snprintf(name, len, "%s", "the list of settings");
        return p ? p : q;
    }
    return NULL;
}

static void setting_value(const char *join, const char *name, char *out, size_t len) {
    char key[160];
    snprintf(key, sizeof key, "setting %s", name);
    if (!ddp_text_field(join, key, out, len))
        snprintf(out, len, "(none)");
}

/* Every worker has joined: the same program and settings, then the table. */
static void finish_rendezvous(ddp_coordinator *s) {
    int world = s->cfg.world;
    const char *reference = s->workers[0].join;
    char name[128], theirs[512], ours[512], text[TEXT];
    for (int r = 1; r < world; r++) {
        if (!first_difference(s->workers[r].join, reference, name, sizeof name))
            continue;
        setting_value(s->workers[r].join, name, theirs, sizeof theirs);
        setting_value(reference, name, ours, sizeof ours);
        if (strcmp(name, "program") == 0)
            snprintf(text, sizeof text, "rank %d on %s runs another program (hash %s) than rank 0 on %s (%s): start "
                     "the same program on every worker", r, s->workers[r].host, theirs, s->workers[0].host, ours);
        else
            snprintf(text, sizeof text, "rank %d on %s runs with %s = %s, and rank 0 on %s with %s = %s: every "
                     "worker needs the same program, flags and data", r, s->workers[r].host, name, theirs,
                     s->workers[0].host, name, ours);
        refuse_all(s, text);
        return;
    }
    for (int r = 0; r < world; r++)
        if (s->workers[r].conn < 0) {
            snprintf(text, sizeof text, "rank %d on %s left before the job formed", r, s->workers[r].host);
            refuse_all(s, text);
            return;
        }
    char *table = malloc((size_t)world * 400 + 256);
    if (!table) {
        refuse_all(s, "the coordinator ran out of memory");
        return;
    }
    const char *node_address = coordinator_node_address(s);
    size_t n = (size_t)sprintf(table, "world %d\nkey ", world);
    for (int i = 0; i < 32; i++)
        n += (size_t)sprintf(table + n, "%02x", s->ring_key[i]);
    for (int r = 0; r < world; r++) {
        Worker *w = &s->workers[r];
        char address[64], port[16] = "0";
        if (!ddp_text_field(w->join, "address", address, sizeof address) || !address[0])
            snprintf(address, sizeof address, "%s", s->conns[w->conn].address);
        if (is_loopback(address) && node_address)
            snprintf(address, sizeof address, "%s", node_address);
        ddp_text_field(w->join, "port", port, sizeof port);
        n += (size_t)sprintf(table + n, "\nworker %d %s %s %.255s", r, address, port, w->host);
    }
    for (int r = 0; r < world; r++)
        queue(s, s->workers[r].conn, DDP_MSG_TABLE, table, n);
    free(table);
    s->table_sent = true;
}

/* HELLO: rank, world, host. */
static bool hello(ddp_coordinator *s, int c, const char *text) {
    Conn *k = &s->conns[c];
    int64_t rank, world;
    char host[256] = "?", msg[TEXT];
    ddp_text_field(text, "host", host, sizeof host);
    if (!ddp_text_number(text, "rank", &rank) || !ddp_text_number(text, "world", &world))
        return false;
    if (world != s->cfg.world) {
        snprintf(msg, sizeof msg, "the worker on %s was started for a job of %lld workers, and the coordinator's "
                 "job has %d: start every worker with the same world size", host, (long long)world, s->cfg.world);
        queue_text(s, c, DDP_MSG_REFUSED, msg);
        k->refused = true;
        return true;
    }
    if (rank < 0 || rank >= world)
        return false;
    Worker *w = &s->workers[rank];
    if (w->conn >= 0 || w->lost || w->join) {
        snprintf(msg, sizeof msg, "two workers claim rank %lld: one on %s and one on %s (%s): every worker "
                 "needs its own rank", (long long)rank, w->host, host, k->peer);
        if (!s->table_sent) /* a job already running goes on; the newcomer alone is refused */
            refuse_all(s, msg);
        queue_text(s, c, DDP_MSG_REFUSED, msg);
        k->refused = true;
        return true;
    }
    k->rank = (int)rank;
    w->conn = c;
    w->seen = true;
    snprintf(w->host, sizeof w->host, "%s", host);
    if (s->failure[0])
        queue_text(s, c, DDP_MSG_LOST, s->failure);
    return true;
}

/* ------------------------------------------------------------ the store */

static Entry *find_entry(ddp_coordinator *s, const char *key) {
    for (int i = 0; i < s->nentries; i++)
        if (strcmp(s->entries[i].key, key) == 0)
            return &s->entries[i];
    return NULL;
}

/* SET: "key\0value" */
static bool set_value(ddp_coordinator *s, ddp_frame *f) {
    size_t klen = strnlen(f->data, f->len);
    if (klen == f->len || klen == 0)
        return false;
    size_t vlen = f->len - klen - 1;
    char *value = malloc(vlen + 1);
    if (!value)
        return false;
    memcpy(value, f->data + klen + 1, vlen);
    value[vlen] = 0;
    Entry *e = find_entry(s, f->data);
    if (!e) {
        char *key = strdup(f->data);
        Entry *grown = key ? realloc(s->entries, sizeof *grown * (size_t)(s->nentries + 1)) : NULL;
        if (!grown) {
            free(key);
            free(value);
            return false;
        }
        s->entries = grown;
        e = &s->entries[s->nentries++];
        e->key = key;
    } else {
        ddp_frame_free(&e->value);
    }
    e->value = (ddp_frame){.data = value, .len = vlen};
    for (int i = 0; i < s->npending;) {
        Pending *p = &s->pending[i];
        if (strcmp(p->key, e->key) != 0) {
            i++;
            continue;
        }
        queue(s, p->conn, DDP_MSG_VALUE, e->value.data, e->value.len);
        free(p->key);
        *p = s->pending[--s->npending];
    }
    return true;
}

static bool get_value(ddp_coordinator *s, int c, const char *key) {
    Entry *e = find_entry(s, key);
    if (e) {
        queue(s, c, DDP_MSG_VALUE, e->value.data, e->value.len);
        return true;
    }
    char *copy = strdup(key);
    Pending *grown = copy ? realloc(s->pending, sizeof *grown * (size_t)(s->npending + 1)) : NULL;
    if (!grown) {
        free(copy);
        return false;
    }
    s->pending = grown;
    s->pending[s->npending++] = (Pending){c, copy};
    return true;
}

/* ------------------------------------------------------------- the loop */

/* One frame from connection c; false: a protocol error, the connection is dropped. */
static bool handle(ddp_coordinator *s, int c, ddp_frame *f) {
    Conn *k = &s->conns[c];
    k->last_heard = ddp_now_ms();
    if (f->type == DDP_MSG_HELLO)
        return k->rank < 0 && !k->refused && hello(s, c, f->data);
    /* A worker refused at its HELLO beats and says goodbye; what it sent before its
     * refusal reached it (its JOIN, a GET) is ignored: dropping it would close the
     * connection before the refusal went out, and the worker would report the
     * coordinator lost instead. */
    if (k->rank < 0)
        return f->type == DDP_MSG_BEAT || f->type == DDP_MSG_ABORT || f->type == DDP_MSG_BYE ||
               (k->refused && (f->type == DDP_MSG_JOIN || f->type == DDP_MSG_SET || f->type == DDP_MSG_GET));
    Worker *w = &s->workers[k->rank];
    switch (f->type) {
    case DDP_MSG_BEAT: return true;
    case DDP_MSG_JOIN:
        if (k->joined)
            return false;
        k->joined = true;
        w->join = strdup(f->data);
        if (w->join && ++s->joined == s->cfg.world && !s->refusal[0] && !s->failure[0])
            finish_rendezvous(s); /* a worker lost meanwhile was told to everyone instead */
        return w->join != NULL;
    case DDP_MSG_SET: return set_value(s, f);
    case DDP_MSG_GET: return get_value(s, c, f->data);
    case DDP_MSG_ABORT: { /* "status S\nreason MESSAGE" */
        char reason[TEXT];
        int64_t status = 3;
        const char *message = strstr(f->data, "\nreason ");
        ddp_text_number(f->data, "status", &status);
        snprintf(reason, sizeof reason, "it failed: %.3000s", message ? message + 8 : f->data);
        lose(s, k->rank, reason, true, (int)status);
        k->left = true;
        return true;
    }
    case DDP_MSG_BYE: k->left = true; return true;
    default: return false;
    }
}

static void read_conn(ddp_coordinator *s, int c) {
    for (;;) {
        ddp_frame f = {0};
        const char *problem;
        int got = ddp_reader_feed(&s->conns[c].in, s->conns[c].fd, DDP_WIRE_MAX, &f, &problem);
        if (got == 0)
            return;
        Conn *k = &s->conns[c];
        if (got == 1) {
            bool ok = handle(s, c, &f);
            ddp_frame_free(&f);
            if (ok)
                continue;
            log_line(s, "dropped %s (rank %d): it broke the protocol", k->peer, k->rank);
        } else if (got == -2) {
            log_line(s, "dropped %s (rank %d): %s", k->peer, k->rank, problem);
        }
        int rank = k->rank;
        bool silent_exit = k->left;
        drop(s, c);
        if (rank >= 0 && !silent_exit)
            lose(s, rank, "its connection closed: the process ended or was killed", false, 3);
        return;
    }
}

/* "rank 3, rank 5 (connected, still starting)": the workers that have not joined */
static void missing_ranks(const ddp_coordinator *s, char *text, size_t len) {
    int n = 0, missing = 0;
    text[0] = 0;
    for (int r = 0; r < s->cfg.world && n < (int)len - 80; r++)
        if (!s->workers[r].join)
            n += snprintf(text + n, len - (size_t)n, "%srank %d%s", missing++ ? ", " : "", r,
                          s->workers[r].conn >= 0 ? " (connected, still starting)" : "");
    if (n >= (int)len - 80)
        snprintf(text + n, len - (size_t)n, ", ...");
}

static void tick(ddp_coordinator *s) {
    double now = ddp_now_ms();
    if (now - s->last_beat >= s->cfg.beat_ms) {
        char clock[32];
        snprintf(clock, sizeof clock, "%.3f", now);
        for (int c = 0; c < s->nconns; c++)
            if (s->conns[c].fd >= 0 && s->conns[c].rank >= 0)
                queue_text(s, c, DDP_MSG_BEAT, clock);
        s->last_beat = now;
    }
    for (int c = 0; c < s->nconns; c++) {
        Conn *k = &s->conns[c];
        if (k->fd >= 0 && k->rank >= 0 && !k->left && now - k->last_heard > s->cfg.peer_timeout_ms) {
            char why[160];
            snprintf(why, sizeof why, "it has not answered for %d s (frozen, or its host unreachable; "
                     "--peer-timeout)", s->cfg.peer_timeout_ms / 1000);
            lose(s, k->rank, why, false, 3);
            k->last_heard = now; /* told once; the connection stays for its goodbye */
        }
    }
    bool forming = !s->table_sent && !s->refusal[0] && !s->failure[0];
    if (forming && now > s->cfg.join_deadline) {
        char text[TEXT];
        int n = snprintf(text, sizeof text, "not every worker joined within %d s (--rendezvous-timeout): missing ",
                         s->cfg.rendezvous_timeout_s);
        missing_ranks(s, text + n, sizeof text - (size_t)n);
        refuse_all(s, text);
    } else if (forming && now - s->last_notice >= ddp_wait_notice_ms(s->cfg.rendezvous_timeout_s)) {
        char missing[TEXT - 200];
        missing_ranks(s, missing, sizeof missing);
        log_line(s, "waiting for %s to join (%d of %d have, %.0f s of the %d s --rendezvous-timeout)", missing,
                 s->joined, s->cfg.world, (now - s->started) / 1000, s->cfg.rendezvous_timeout_s);
        s->last_notice = now;
    }
}

/* Everyone is gone, or told: a job that never formed waits for every rank to have
 * come and heard why, so late workers are not left to their rendezvous timeout. */
static bool everyone_left(const ddp_coordinator *s) {
    for (int r = 0; !s->table_sent && (s->refusal[0] || s->failure[0]) && r < s->cfg.world; r++)
        if (!s->workers[r].seen)
            return false;
    for (int c = 0; c < s->nconns; c++)
        if (s->conns[c].fd >= 0 && s->conns[c].rank >= 0 && !s->conns[c].left && !s->workers[s->conns[c].rank].lost)
            return false;
    return true;
}

static void *serve(void *arg) {
    pthread_setname_np(pthread_self(), "ddp-coordinator");
    ddp_coordinator *s = arg;
    struct pollfd *fds = NULL;
    int cap = 0;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        bool stopping = s->stopping;
        double deadline = s->stop_deadline;
        pthread_mutex_unlock(&s->lock);
        s->stop_seen = stopping;
        if (stopping && (everyone_left(s) || ddp_now_ms() > deadline))
            break;
        if (cap < s->nconns + 2) {
            cap = 2 * (s->nconns + 2);
            struct pollfd *grown = realloc(fds, sizeof *fds * (size_t)cap);
            if (!grown)
                break;
            fds = grown;
        }
        fds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        fds[1] = (struct pollfd){.fd = handshake_room(s) ? s->cfg.listener : -1, .events = POLLIN};
        for (int c = 0; c < s->nconns; c++)
            fds[c + 2] = (struct pollfd){.fd = s->conns[c].fd,
                                         .events = (short)(POLLIN | (s->conns[c].out_len ? POLLOUT : 0))};
        int n = s->nconns + 2;
        poll(fds, (nfds_t)n, 100);
        if (fds[0].revents & POLLIN) {
            int fd;
            while (read(s->wake[0], &fd, sizeof fd) == (ssize_t)sizeof fd)
                if (fd >= 0)
                    add_conn(s, fd);
        }
        if (fds[1].revents & POLLIN)
            accept_new(s);
        for (int c = 0; c < n - 2; c++) {
            if (s->conns[c].fd < 0)
                continue;
            if (fds[c + 2].revents & (POLLIN | POLLHUP | POLLERR))
                read_conn(s, c);
            if (s->conns[c].fd >= 0)
                flush_out(&s->conns[c]);
        }
        tick(s);
        for (int c = 0; c < s->nconns; c++)
            if (s->conns[c].fd >= 0)
                flush_out(&s->conns[c]);
    }
    free(fds);
    return NULL;
}

/* ---------------------------------------------------------- start, stop */

ddp_coordinator *ddp_coordinator_start(const ddp_coordinator_config *cfg, char *err, size_t errlen) {
    ddp_coordinator *s = calloc(1, sizeof *s);
    if (!s) {
        ddp_fail(err, errlen, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->wake[0] = s->wake[1] = -1;
    s->started = s->last_notice = ddp_now_ms();
    for (int i = 0; i < MAX_HANDSHAKES; i++)
        s->handshake_fds[i] = -1;
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    if (getsockname(cfg->listener, (struct sockaddr *)&a, &alen) == 0)
        s->port = ntohs(a.sin_port);
    s->workers = calloc((size_t)cfg->world, sizeof *s->workers);
    pthread_mutex_init(&s->lock, NULL);
    const char *failed = !s->workers ? "out of memory"
                         : pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0 ? strerror(errno)
                         : !ddp_random_bytes(s->ring_key, sizeof s->ring_key) ? "cannot draw the ring's key"
                                                                                : NULL;
    for (int r = 0; !failed && r < cfg->world; r++)
        s->workers[r].conn = -1;
    int e = failed ? 0 : pthread_create(&s->thread, NULL, serve, s);
    if (!failed && e == 0)
        return s;
    ddp_fail(err, errlen, "cannot start the coordinator: %s", failed ? failed : strerror(e));
    if (s->wake[0] >= 0) {
        close(s->wake[0]);
        close(s->wake[1]);
    }
    pthread_mutex_destroy(&s->lock);
    free(s->workers);
    free(s);
    return NULL;
}

void ddp_coordinator_stop(ddp_coordinator *s, double deadline) {
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    s->stop_deadline = deadline;
    pthread_mutex_unlock(&s->lock);
    int stop = -1;
    (void)!write(s->wake[1], &stop, sizeof stop);
    pthread_join(s->thread, NULL);
    /* handshakes still running hold s: cut their connections short and wait for them */
    for (;;) {
        pthread_mutex_lock(&s->lock);
        int running = s->handshakes;
        for (int i = 0; i < MAX_HANDSHAKES; i++)
            if (s->handshake_fds[i] >= 0)
                shutdown(s->handshake_fds[i], SHUT_RDWR);
        pthread_mutex_unlock(&s->lock);
        if (!running)
            break;
        usleep(10000);
    }
    int fd;
    while (read(s->wake[0], &fd, sizeof fd) == (ssize_t)sizeof fd)
        if (fd >= 0)
            close(fd);
    for (int c = 0; c < s->nconns; c++) {
        flush_out(&s->conns[c]);
        drop(s, c);
    }
    for (int r = 0; r < s->cfg.world; r++)
        free(s->workers[r].join);
    for (int i = 0; i < s->nentries; i++) {
        free(s->entries[i].key);
        ddp_frame_free(&s->entries[i].value);
    }
    for (int i = 0; i < s->npending; i++)
        free(s->pending[i].key);
    close(s->wake[0]);
    close(s->wake[1]);
    close(s->cfg.listener);
    pthread_mutex_destroy(&s->lock);
    free(s->entries);
    free(s->pending);
    free(s->conns);
    free(s->workers);
    free(s);
}
