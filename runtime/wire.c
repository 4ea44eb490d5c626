/* wire.c: the frames workers exchange outside the ring's data path: the handshake,
 * the rendezvous, the key-value store, heartbeats and notices.
 *
 * A frame is a 16-byte header (magic, protocol version, type, payload length) and
 * the payload. The receiver checks the magic and the version before anything else and
 * the length against what the frame's reader allows, so a stray or malicious peer can
 * neither make it allocate without bound nor be mistaken for a worker of another
 * version. Payloads of text frames are lines of "key value". Both ends run the same
 * program (the rendezvous checks it), so integers travel in the machine's order. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
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

double ddp_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Waits until fd is ready for events or the deadline passes: 1 ready, 0 timed out,
 * -1 failed. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - ddp_now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > 1000 ? 1000 : (int)left + 1);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* Moves len bytes through fd, sending or receiving, never waiting past the deadline
 * whether the socket blocks or not: 1 done, 0 the peer closed, -1 timed out, -2
 * failed (errno says why). */
static int move_all(int fd, char *p, size_t len, bool sending, double deadline) {
    while (len) {
        ssize_t k = sending ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
            continue;
        }
        if (k == 0 && !sending)
            return 0;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -2;
        int ready = wait_fd(fd, sending ? POLLOUT : POLLIN, deadline);
        if (ready <= 0)
            return ready == 0 ? -1 : -2;
    }
    return 1;
}

bool ddp_send_all(int fd, const void *data, size_t len, double deadline) {
    return move_all(fd, (char *)data, len, true, deadline) == 1;
}

int ddp_recv_all(int fd, void *data, size_t len, double deadline) {
    return move_all(fd, data, len, false, deadline);
}

/* Why ddp_recv_all returned got (not 1). */
static const char *recv_problem(int got, const char *closed) {
    return got == 0 ? closed : got == -1 ? "no answer in time" : strerror(errno);
}

ddp_frame_header ddp_frame_header_for(int type, size_t len) {
    return (ddp_frame_header){DDP_WIRE_MAGIC, DDP_WIRE_VERSION, (uint16_t)type, (uint32_t)len, 0};
}

bool ddp_frame_send(int fd, int type, const void *payload, size_t len, double deadline) {
    ddp_frame_header h = ddp_frame_header_for(type, len);
    return len <= DDP_WIRE_MAX && ddp_send_all(fd, &h, sizeof h, deadline) &&
           ddp_send_all(fd, payload, len, deadline);
}

const char *ddp_header_problem(const ddp_frame_header *h, size_t max) {
    if (h->magic != DDP_WIRE_MAGIC)
        return "it does not speak ddp's protocol";
    if (h->version != DDP_WIRE_VERSION)
        return "it speaks another version of ddp's protocol (a program built by another ddpc)";
    if (h->length > max)
        return "it sent a frame larger than allowed";
    return NULL;
}

bool ddp_frame_recv(int fd, ddp_frame *f, size_t max, double deadline, char *err, size_t errlen) {
    ddp_frame_header h;
    memset(f, 0, sizeof *f);
    int got = ddp_recv_all(fd, &h, sizeof h, deadline);
    if (got <= 0)
        return ddp_fail(err, errlen, "%s", recv_problem(got, "the connection closed"));
    const char *problem = ddp_header_problem(&h, max);
    if (problem)
        return ddp_fail(err, errlen, "%s", problem);
    f->type = h.type;
    f->len = h.length;
    f->data = malloc(h.length + 1);
    if (!f->data)
        return ddp_fail(err, errlen, "out of memory");
    f->data[h.length] = 0;
    got = ddp_recv_all(fd, f->data, h.length, deadline);
    if (got <= 0) {
        ddp_frame_free(f);
        return ddp_fail(err, errlen, "a frame cut short: %s", recv_problem(got, "the connection closed"));
    }
    return true;
}

void ddp_frame_free(ddp_frame *f) {
    free(f->data);
    f->data = NULL;
    f->len = 0;
}

/* ------------------------------------------------------ incremental reading */

int ddp_reader_feed(ddp_reader *r, int fd, size_t max, ddp_frame *f, const char **problem) {
    *problem = NULL;
    for (;;) {
        if (r->have >= sizeof(ddp_frame_header)) { /* a header, checked before its payload is awaited */
            ddp_frame_header h;
            memcpy(&h, r->buf, sizeof h);
            if ((*problem = ddp_header_problem(&h, max)))
                return -2;
            size_t whole = sizeof h + h.length;
            if (r->have >= whole) {
                f->type = h.type;
                f->len = h.length;
                f->data = malloc(h.length + 1);
                if (!f->data) {
                    *problem = "out of memory";
                    return -2;
                }
                memcpy(f->data, r->buf + sizeof h, h.length);
                f->data[h.length] = 0;
                memmove(r->buf, r->buf + whole, r->have - whole);
                r->have -= whole;
                return 1;
            }
            if (whole > r->cap) {
                char *grown = realloc(r->buf, whole);
                if (!grown) {
                    *problem = "out of memory";
                    return -2;
                }
                r->buf = grown;
                r->cap = whole;
            }
        } else if (r->cap < 4096) {
            char *grown = realloc(r->buf, 4096);
            if (!grown) {
                *problem = "out of memory";
                return -2;
            }
            r->buf = grown;
            r->cap = 4096;
        }
        ssize_t k = recv(fd, r->buf + r->have, r->cap - r->have, MSG_DONTWAIT);
        if (k == 0)
            return -1;
        if (k < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        r->have += (size_t)k;
    }
}

void ddp_reader_free(ddp_reader *r) {
    free(r->buf);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ text payloads */

bool ddp_text_field(const char *text, const char *key, char *out, size_t len) {
    size_t k = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, key, k) != 0 || line[k] != ' ')
            continue;
        const char *v = line + k + 1, *end = strchr(v, '\n');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        if (n >= len)
            return false;
        memcpy(out, v, n);
        out[n] = 0;
        return true;
    }
    return false;
}

bool ddp_text_number(const char *text, const char *key, int64_t *out) {
    char v[32], *end;
    if (!ddp_text_field(text, key, v, sizeof v))
        return false;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno)
        return false;
    *out = n;
    return true;
}

/* ----------------------------------------------------------------- sockets */

int ddp_listen(int port, char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = INADDR_ANY};
    if (fd < 0) {
        ddp_fail(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        ddp_fail(err, errlen, "port %d: %s%s", port, strerror(e),
                 e == EADDRINUSE ? " (another program, or another job on this node, uses it: pick another port "
                                   "base with --port-base or slurm(port_base = N))" : "");
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

/* One attempt, given until the deadline to complete: a connected (blocking) socket,
 * or -1 with errno. Non-blocking meanwhile, so a host that drops packets costs the
 * deadline, not the kernel's two minutes of retries. */
static int connect_once(const struct addrinfo *to, double deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), e = 0;
    if (fd < 0)
        return -1;
    if (connect(fd, to->ai_addr, to->ai_addrlen) != 0) {
        e = errno;
        if (e == EINPROGRESS) {
            socklen_t elen = sizeof e;
            int ready = wait_fd(fd, POLLOUT, deadline);
            if (ready <= 0)
                e = ready == 0 ? ETIMEDOUT : errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
                e = errno;
        }
    }
    if (!e && connected_to_itself(fd))
        e = ECONNREFUSED;
    int flags = fcntl(fd, F_GETFL);
    if (!e && (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0))
        e = errno;
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int ddp_connect(const char *host, int port, double deadline, char *err, size_t errlen) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int status;
    while ((status = getaddrinfo(host, service, &hints, &res)) == EAI_AGAIN && ddp_now_ms() < deadline)
        usleep(100 * 1000); /* the name service is busy: it may answer in a moment */
    if (status != 0) {
        ddp_fail(err, errlen, "cannot resolve the host `%s`: %s", host, gai_strerror(status));
        return -1;
    }
    int fd, e;
    for (;;) { /* every attempt gets a second at least, the first one included */
        double now = ddp_now_ms();
        fd = connect_once(res, deadline > now + 1000 ? deadline : now + 1000);
        e = errno;
        if (fd >= 0 || ddp_now_ms() > deadline)
            break;
        usleep(100 * 1000);
    }
    freeaddrinfo(res);
    if (fd < 0)
        ddp_fail(err, errlen, "cannot connect to %s:%d: %s", host, port, strerror(e));
    return fd;
}

bool ddp_interface_address(const char *name, char *out, size_t len, char *err, size_t errlen) {
    struct ifaddrs *all, *i;
    if (getifaddrs(&all) != 0)
        return ddp_fail(err, errlen, "--interface %s: cannot list the network interfaces: %s", name, strerror(errno));
    bool found = false;
    for (i = all; i && !found; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, name) == 0) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)len);
            found = true;
        }
    if (!found) {
        char names[512] = "";
        for (i = all; i; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strlen(names) + strlen(i->ifa_name) + 3 < sizeof names)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", i->ifa_name);
        ddp_fail(err, errlen, "--interface %s: this machine has no such interface with an IPv4 address (it has %s)",
                 name, names[0] ? names : "none");
    }
    freeifaddrs(all);
    return found;
}
