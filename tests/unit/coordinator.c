/* coordinator.c: the coordinator's answers to workers it refuses at their HELLO, over
 * real sockets on this machine. A worker sends its HELLO and, not waiting for an
 * answer, its JOIN once its data is read: with tiny data both can reach the
 * coordinator in one read. Then the refusal must still go out, and the connection stay
 * until the worker leaves; a worker that saw the connection close instead would report
 * the coordinator lost (exit 3) rather than refused (exit 1). Here both frames go in
 * one write, so that the coordinator reads them together every time. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "runtime.h"

enum { WORLD = 3, WAIT_MS = 5000 };

static ddp_auth job_auth(void) {
    unsigned char key[32];
    for (int i = 0; i < 32; i++)
        key[i] = (unsigned char)(i * 7 + 1);
    ddp_auth a;
    ddp_auth_with_key(&a, key, "unit coordinator");
    return a;
}

/* A coordinator for WORLD workers on a port the kernel picks; its port in *port. */
static ddp_coordinator *start(const ddp_auth *auth, int *port) {
    char err[512];
    int listener = ddp_listen(0, err, sizeof err);
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    if (listener < 0 || getsockname(listener, (struct sockaddr *)&a, &alen) != 0) {
        fprintf(stderr, "listening: %s\n", listener < 0 ? err : "getsockname failed");
        exit(1);
    }
    *port = ntohs(a.sin_port);
    ddp_coordinator_config cfg = {listener, WORLD, *auth, 10000, 1000, ddp_now_ms() + 20000, 20};
    ddp_coordinator *s = ddp_coordinator_start(&cfg, err, sizeof err);
    if (!s) {
        fprintf(stderr, "starting the coordinator: %s\n", err);
        exit(1);
    }
    return s;
}

/* A connection that has proved it belongs to the job; -1 on failure. */
static int worker_connection(const ddp_auth *auth, int port) {
    char err[512];
    int fd = ddp_connect("127.0.0.1", port, ddp_now_ms() + WAIT_MS, err, sizeof err);
    if (fd >= 0 && !ddp_auth_connect(auth, fd, ddp_now_ms() + WAIT_MS, err, sizeof err)) {
        close(fd);
        fd = -1;
    }
    if (fd < 0)
        fprintf(stderr, "connecting to the coordinator: %s\n", err);
    return fd;
}

/* Appends one frame, header and payload, to buf at *n. */
static void put_frame(char *buf, size_t *n, int type, const char *payload) {
    size_t len = strlen(payload);
    ddp_frame_header h = ddp_frame_header_for(type, len);
    memcpy(buf + *n, &h, sizeof h);
    memcpy(buf + *n + sizeof h, payload, len);
    *n += sizeof h + len;
}

/* A worker's HELLO: who it is and the job it was started for. */
static const char *hello_text(char *buf, size_t len, int rank, int world) {
    snprintf(buf, len, "rank %d\nworld %d\nhost unit", rank, world);
    return buf;
}

static bool send_hello(int fd, int rank, int world) {
    char hello[128];
    hello_text(hello, sizeof hello, rank, world);
    return ddp_frame_send(fd, DDP_MSG_HELLO, hello, strlen(hello), ddp_now_ms() + WAIT_MS);
}

/* HELLO and JOIN in one write; then the first frame that is not a heartbeat must be
 * a refusal saying `why`. */
static void refused_with_join_queued(const ddp_auth *auth, int port, int rank, int world, const char *why) {
    int fd = worker_connection(auth, port);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    char buf[1024], hello[128];
    size_t n = 0;
    put_frame(buf, &n, DDP_MSG_HELLO, hello_text(hello, sizeof hello, rank, world));
    put_frame(buf, &n, DDP_MSG_JOIN, "address 127.0.0.1\nport 0");
    CHECK(ddp_send_all(fd, buf, n, ddp_now_ms() + WAIT_MS));
    ddp_frame f = {0};
    char err[512] = "";
    bool got;
    while ((got = ddp_frame_recv(fd, &f, DDP_WIRE_MAX, ddp_now_ms() + WAIT_MS, err, sizeof err)) &&
           f.type == DDP_MSG_BEAT)
        ddp_frame_free(&f);
    if (!got)
        fprintf(stderr, "rank %d, world %d: no refusal (%s)\n", rank, world, err);
    CHECK(got && f.type == DDP_MSG_REFUSED && strstr(f.data, why));
    if (got)
        printf("rank %d, world %d with its JOIN sent: refused: %s\n", rank, world, f.data);
    ddp_frame_free(&f);
    ddp_frame_send(fd, DDP_MSG_BYE, NULL, 0, ddp_now_ms() + WAIT_MS);
    close(fd);
}

int main(void) {
    ddp_auth auth = job_auth();
    int port;
    /* one rank claimed twice before the job formed: the job is refused, the newcomer too */
    ddp_coordinator *s = start(&auth, &port);
    int first = worker_connection(&auth, port);
    CHECK(first >= 0 && send_hello(first, 1, WORLD));
    usleep(200 * 1000); /* rank 1's first claim is the coordinator's before the second */
    refused_with_join_queued(&auth, port, 1, WORLD, "two workers claim rank 1");
    if (first >= 0) {
        ddp_frame_send(first, DDP_MSG_BYE, NULL, 0, ddp_now_ms() + WAIT_MS);
        close(first);
    }
    ddp_coordinator_stop(s, ddp_now_ms() + 2000);
    /* a worker started for a job of another size */
    s = start(&auth, &port);
    refused_with_join_queued(&auth, port, 2, WORLD + 1, "started for a job of 4 workers");
    ddp_coordinator_stop(s, ddp_now_ms() + 2000);
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
