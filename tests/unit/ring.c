/* ring.c: the TCP ring with real processes on this machine: 2 to 5 workers forked
 * here all-reduce buffers of every awkward size (empty, fewer values than workers,
 * several MB) in f32 and f64, broadcast and meet at barriers. Sums of values exact in
 * binary must come out exact; sums that round must come out bit-identical on every
 * worker; bytes must really cross the ring. Then the failures: a worker out of step
 * (another byte count), a worker that dies, a worker running another program, a
 * stray connection (refused, and the ring forms), a worker without the job's key. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "runtime.h"

enum { MAX_WORKERS = 8 };

/* Listening sockets for ranks 1.. on ports the kernel picks, made before the workers
 * start so that no other program can take a port between choosing and listening;
 * each worker inherits its own. False with a message when one cannot be made. */
static bool open_listeners(int world, int *listeners, int *ports) {
    char err[512];
    listeners[0] = -1;
    ports[0] = 0;
    for (int rank = 1; rank < world; rank++) {
        struct sockaddr_in a;
        socklen_t alen = sizeof a;
        listeners[rank] = ddp_listen(0, err, sizeof err);
        if (listeners[rank] < 0 || getsockname(listeners[rank], (struct sockaddr *)&a, &alen) != 0) {
            fprintf(stderr, "a listening socket for rank %d: %s\n", rank, listeners[rank] < 0 ? err : strerror(errno));
            return false;
        }
        ports[rank] = ntohs(a.sin_port);
    }
    return true;
}


typedef enum { NORMAL, OUT_OF_STEP, DIES, OTHER_PROGRAM, STRAY, WRONG_KEY } Scenario;

/* Rank 0 of STRAY first knocks at rank 2's port with something that is not ddp. */
static void knock(int port) {
    char err[256];
    int fd = ddp_connect("127.0.0.1", port, ddp_now_ms() + 5000, err, sizeof err);
    if (fd >= 0) {
        (void)!write(fd, "GET / HTTP/1.0\r\n\r\n", 18);
        usleep(200 * 1000);
        close(fd);
    }
}

/* The worker's side; writes one hash per collective to `out`; returns its status. */
static int worker(int rank, int world, int *ports, int *listeners, Scenario scenario, int out) {
    const char *hosts[MAX_WORKERS];
    for (int i = 0; i < world; i++) {
        hosts[i] = "127.0.0.1";
        if (i != rank && listeners[i] >= 0)
            close(listeners[i]);
    }
    unsigned char key[32];
    memset(key, scenario == WRONG_KEY && rank == 1 ? 'q' : 'k', sizeof key);
    char err[512];
    int listener = listeners[rank];
    if (scenario == STRAY && rank == 0)
        knock(ports[2]);
    double deadline = ddp_now_ms() + (scenario == WRONG_KEY ? 3000 : 20000);
    ddp_ring_peers peers = {rank, world, hosts, ports, hosts, scenario == OTHER_PROGRAM && rank == 1 ? 99 : 42,
                            key, listener, deadline, 5, NULL, 5};
    ddp_ring *r = ddp_ring_connect(&peers, err, sizeof err);
    if (listener >= 0)
        close(listener);
    if (!r) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 3;
    }
    static const int64_t sizes[] = {0, 1, 3, 7, 1000, (1 << 20) + 3, 5000000};
    int bad = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t n = sizes[k];
        if (scenario == DIES && rank == world - 1 && k == 2)
            _exit(0);
        if (scenario == OUT_OF_STEP && rank == 1 && k == 3)
            n += 1;
        float *exact = malloc(sizeof(float) * (size_t)(n + 1));
        double *rounding = malloc(sizeof(double) * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++) {
            exact[i] = (float)((i * 7 + rank * 13) % 101) / 8; /* sums stay exact */
            rounding[i] = 1.0 / (double)(i + rank + 3);
        }
        if (!ddp_ring_allreduce(r, exact, n, DDP_F32, err, sizeof err) ||
            !ddp_ring_allreduce(r, rounding, n, DDP_F64, err, sizeof err)) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            free(exact);
            free(rounding);
            ddp_ring_close(r);
            return 4;
        }
        for (int64_t i = 0; i < n; i++) {
            float want = 0;
            for (int w = 0; w < world; w++)
                want += (float)((i * 7 + w * 13) % 101) / 8;
            bad += exact[i] != want;
            double near = 0;
            for (int w = 0; w < world; w++)
                near += 1.0 / (double)(i + w + 3);
            bad += fabs(rounding[i] - near) > 1e-15 * near;
        }
        uint64_t h[2] = {ddp_fnv1a(exact, sizeof(float) * (size_t)n, DDP_FNV_START),
                         ddp_fnv1a(rounding, sizeof(double) * (size_t)n, DDP_FNV_START)};
        if (write(out, h, sizeof h) != (ssize_t)sizeof h)
            bad++;
        free(exact);
        free(rounding);
    }
    char message[100 * 1024];
    int root = world > 1 ? 1 : 0;
    memset(message, rank == root ? 'x' : 0, sizeof message);
    bad += !ddp_ring_broadcast(r, message, sizeof message, root, err, sizeof err);
    for (size_t i = 0; i < sizeof message; i++)
        bad += message[i] != 'x';
    bad += !ddp_ring_barrier(r, err, sizeof err);
    bad += world > 1 && ddp_ring_bytes_sent(r) < 5000000; /* the big buffers crossed */
    ddp_ring_close(r);
    if (bad)
        fprintf(stderr, "rank %d: %d wrong values\n", rank, bad);
    return bad ? 5 : 0;
}

/* Runs world workers; their statuses into status[], stderr into a temp file whose
 * text is returned (malloc'd). Checks that every worker saw the same sums. */
static char *run(int world, Scenario scenario, int *status) {
    int listeners[MAX_WORKERS], ports[MAX_WORKERS], hashes[MAX_WORKERS][2];
    if (!open_listeners(world, listeners, ports))
        exit(2);
    char path[] = "/tmp/ddp_ring_XXXXXX";
    int log = mkstemp(path);
    pid_t pids[MAX_WORKERS];
    unlink(path);
    for (int r = 0; r < world; r++) {
        if (pipe(hashes[r]) != 0)
            return NULL;
        if ((pids[r] = fork()) == 0) {
            close(hashes[r][0]);
            dup2(log, 2);
            _exit(worker(r, world, ports, listeners, scenario, hashes[r][1]));
        }
        close(hashes[r][1]);
    }
    for (int r = 1; r < world; r++)
        close(listeners[r]);
    uint64_t first[32][2], h[2];
    int collectives = 0;
    for (int r = 0; r < world; r++) {
        int k = 0;
        while (read(hashes[r][0], h, sizeof h) == (ssize_t)sizeof h && k < 32) {
            if (r == 0)
                memcpy(first[k], h, sizeof h);
            else if (scenario == NORMAL)
                CHECK(k < collectives && memcmp(first[k], h, sizeof h) == 0);
            k++;
        }
        if (r == 0)
            collectives = k;
        close(hashes[r][0]);
        waitpid(pids[r], &status[r], 0);
        status[r] = WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : 128 + WTERMSIG(status[r]);
    }
    if (scenario == NORMAL)
        CHECK(collectives == 7);
    char *text = calloc(1, 65536);
    lseek(log, 0, SEEK_SET);
    if (read(log, text, 65535) < 0)
        text[0] = 0;
    close(log);
    return text;
}

static void test_sums(void) {
    for (int world = 1; world <= 5; world++) {
        int status[MAX_WORKERS];
        char *log = run(world, NORMAL, status);
        int failed = 0;
        for (int r = 0; r < world; r++)
            failed += status[r] != 0;
        if (failed)
            fprintf(stderr, "%d workers:\n%s", world, log);
        CHECK(failed == 0);
        printf("ring of %d: %s\n", world, failed ? "FAIL" : "exact sums, the same bits on every worker");
        free(log);
    }
}

static void test_failures(void) {
    int status[MAX_WORKERS];
    char *log = run(3, OUT_OF_STEP, status);
    CHECK(strstr(log, "is out of step") && strstr(log, "bytes") && status[0] && status[1] && status[2]);
    printf("out of step: %s", strstr(log, "rank") ? strstr(log, "rank") : "(nothing said)\n");
    free(log);

    log = run(3, DIES, status);
    CHECK(strstr(log, "lost rank 2 on 127.0.0.1: it closed the connection") && status[0] == 4 && status[1] == 4);
    printf("a worker dies: %s", strstr(log, "rank") ? strstr(log, "rank") : "(nothing said)\n");
    free(log);

    log = run(3, OTHER_PROGRAM, status);
    CHECK(strstr(log, "rank 1 runs another program (hash 0000000000000063") && status[2] == 3);
    printf("another program: %s", strstr(log, "rank") ? strstr(log, "rank") : "(nothing said)\n");
    free(log);

    log = run(3, STRAY, status); /* refused and logged; the ring forms all the same */
    CHECK(strstr(log, "refused a connection from 127.0.0.1 to the ring's port: it does not speak ddp's protocol") &&
          status[0] == 0 && status[1] == 0 && status[2] == 0);
    printf("a stray connection: %s", strstr(log, "refused") ? strstr(log, "refused") : "(nothing said)\n");
    free(log);

    log = run(3, WRONG_KEY, status); /* a worker without the job's key is not let in */
    CHECK(strstr(log, "its proof does not match") && strstr(log, "rank 1: forming the ring: rank 2") &&
          status[1] == 3 && status[2] == 3);
    printf("a worker without the key: %s", strstr(log, "rank 1:") ? strstr(log, "rank 1:") : "(nothing said)\n");
    free(log);
}

int main(void) {
    test_sums();
    test_failures();
    printf("unit_ring: %s (%d failed checks)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
