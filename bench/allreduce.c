/* allreduce.c: the speed of the runtime's ring all-reduce (runtime/ring.c) between
 * processes on this machine, beside a plain memcpy of the same size.
 *
 * bench_allreduce [--workers N,...] [--min BYTES] [--max BYTES] [--seconds S] [--json]
 *
 * For each worker count it forks that many workers, connects them into a TCP ring
 * on 127.0.0.1 and all-reduces f32 buffers from --min to --max bytes, 4 times larger
 * each time (K, M and G suffixes are powers of 2). Before each all-reduce every worker
 * fills its buffer with known values and meets the others at a barrier; only the
 * all-reduce is timed, and every sum is checked (the bench fails on a wrong value).
 * After 2 warm-ups the workers repeat it for about --seconds (5 to 200 times). A
 * repetition's time is the slowest worker's; the median over repetitions is reported.
 *
 * How to read it: algbw is bytes / time; busbw is algbw * 2(n-1)/n, NCCL's bus
 * bandwidth for all-reduce: the bytes each worker really sends and receives per
 * second, comparable across worker counts. memcpy is one copy of the same size in
 * one process (bytes / time), measured at the start of the run: the rate at which
 * this machine moves memory at all. Workers share this machine's CPUs, so with more
 * workers than CPUs busbw falls, and busbw/memcpy says how much of the memory
 * bandwidth the ring turns into bus bandwidth. GB/s are 10^9 bytes per second. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "measure.h"
#include "runtime.h"

enum {
    MAX_WORKERS = 64,
    MAX_WORKER_COUNTS = 16,
    MAX_SIZES = 32,
    SIZE_STEP = 4,              /* each size is this times the one before */
    MEMCPY_SAMPLE_BYTES = 1 << 20, /* a memcpy sample copies at least this much: small copies are shorter
                                      than the clock's own overhead */
    FORM_TIMEOUT_MS = 30000,    /* for the ring to form */
    SILENCE_TIMEOUT_MS = 600000 /* a run whose workers report nothing this long is taken as hung */
};

/* Not a secret: the ring only needs the same 32 bytes on every worker. */
static const char ring_key[] = "bench_allreduce: fixed ring key.";
_Static_assert(sizeof ring_key == 32 + 1, "the ring's key is 32 bytes");
static const uint64_t program_hash = 0xbe9c4a11;

typedef struct Options {
    int workers[MAX_WORKER_COUNTS], worker_counts;
    int64_t sizes[MAX_SIZES];   /* bytes, each a whole number of f32 values */
    int size_count;
    double seconds;             /* of timed repetitions per size */
    bool json;
} Options;

typedef struct Measurement {
    int workers;
    int64_t bytes;
    int reps;
    double seconds;             /* median */
    double memcpy_gbps;         /* the reference for this size */
} Measurement;

/* ------------------------------------------------------------ statistics */

static double gbps(int64_t bytes, double seconds) {
    return (double)bytes / seconds / 1e9;
}

static double bus_factor(int workers) {
    return 2.0 * (workers - 1) / workers;
}

/* -------------------------------------------------------- memcpy reference */

/* The median time of one memcpy of bytes, in this process alone. */
static double memcpy_seconds(int64_t bytes, double budget) {
    char *src = malloc((size_t)bytes), *dst = malloc((size_t)bytes);
    if (!src || !dst) {
        fprintf(stderr, "bench_allreduce: out of memory for a memcpy of %lld bytes\n", (long long)bytes);
        exit(1);
    }
    memset(src, 1, (size_t)bytes); /* every page faulted in before timing */
    memset(dst, 2, (size_t)bytes);
    int batch = bytes < MEMCPY_SAMPLE_BYTES ? (int)(MEMCPY_SAMPLE_BYTES / bytes) : 1;
    double samples[MAX_REPS];
    int reps = 1;
    for (int k = 0; k < WARMUP + reps; k++) {
        double begin = ddp_now_ms();
        for (int b = 0; b < batch; b++) {
            memcpy(dst, src, (size_t)bytes);
            __asm__ volatile("" : : "r"(dst), "r"(src) : "memory"); /* each copy happens */
        }
        double seconds = (ddp_now_ms() - begin) / 1e3 / batch;
        if (k == WARMUP - 1)
            reps = reps_for(seconds, budget);
        if (k >= WARMUP)
            samples[k - WARMUP] = seconds;
    }
    free(src);
    free(dst);
    return median(samples, reps);
}

/* --------------------------------------------------------------- workers */

/* What every worker of one run knows. */
typedef struct Run {
    const Options *options;
    int world;
    int ports[MAX_WORKERS];     /* where each rank listens; rank 0: nowhere */
} Run;

/* One repetition: fill, barrier, the timed all-reduce, the check. */
static bool timed_allreduce(ddp_ring *r, float *data, int64_t count, const float *sums, double *seconds, char *err,
                            size_t errlen) {
    fill(data, count, ddp_ring_rank(r));
    if (!ddp_ring_barrier(r, err, errlen))
        return false;
    double begin = ddp_now_ms();
    if (!ddp_ring_allreduce(r, data, count, DDP_F32, err, errlen))
        return false;
    *seconds = (ddp_now_ms() - begin) / 1e3;
    int64_t wrong = first_wrong(data, count, sums);
    if (wrong >= 0)
        return ddp_fail(err, errlen, "all-reduce of %lld values gave a wrong sum: value %lld is %g, it should be %g",
                        (long long)count, (long long)wrong, (double)data[wrong], (double)sums[wrong % PERIOD]);
    return true;
}

/* One size: the warm-ups, then as many repetitions as every worker agrees on; their
 * times go to the parent as a count and that many doubles. */
static bool measure_size(ddp_ring *r, float *data, int64_t count, const float *sums, double budget, int report,
                         char *err, size_t errlen) {
    double times[MAX_REPS], warm = 0;
    for (int k = 0; k < WARMUP; k++)
        if (!timed_allreduce(r, data, count, sums, &warm, err, errlen))
            return false;
    /* the sum of the last warm-up's times is the same bits on every worker, and so is
     * the repetition count drawn from it */
    if (!ddp_ring_allreduce(r, &warm, 1, DDP_F64, err, errlen))
        return false;
    int reps = reps_for(warm / ddp_ring_world(r), budget);
    for (int k = 0; k < reps; k++)
        if (!timed_allreduce(r, data, count, sums, &times[k], err, errlen))
            return false;
    double deadline = ddp_now_ms() + SILENCE_TIMEOUT_MS;
    if (!ddp_send_all(report, &reps, sizeof reps, deadline) ||
        !ddp_send_all(report, times, sizeof(double) * (size_t)reps, deadline))
        return ddp_fail(err, errlen, "reporting to the parent: %s", strerror(errno));
    return true;
}

/* A worker's whole life; its exit status. */
static int worker(const Run *run, int rank, int listener, int report) {
    const Options *o = run->options;
    const char *addresses[MAX_WORKERS];
    for (int i = 0; i < run->world; i++)
        addresses[i] = "127.0.0.1";
    char err[1024];
    ddp_ring_peers peers = {.rank = rank, .world = run->world, .addresses = addresses, .ports = run->ports,
                            .hosts = addresses, .program_hash = program_hash,
                            .key = (const unsigned char *)ring_key, .listener = listener,
                            .deadline = ddp_now_ms() + FORM_TIMEOUT_MS, .timeout_s = 0, .link = NULL};
    ddp_ring *r = ddp_ring_connect(&peers, err, sizeof err);
    if (listener >= 0)
        close(listener);
    float sums[PERIOD];
    pattern_sums(sums, run->world);
    float *data = malloc((size_t)o->sizes[o->size_count - 1]);
    bool ok = r && data;
    if (r && !data)
        ddp_fail(err, sizeof err, "out of memory for %lld bytes", (long long)o->sizes[o->size_count - 1]);
    for (int s = 0; ok && s < o->size_count; s++)
        ok = measure_size(r, data, o->sizes[s] / (int64_t)sizeof(float), sums, o->seconds, report, err, sizeof err);
    if (!ok)
        fprintf(stderr, "bench_allreduce: %d workers: rank %d: %s\n", run->world, rank, err);
    free(data);
    ddp_ring_close(r);
    close(report);
    return ok ? 0 : 1;
}

/* ---------------------------------------------------------------- parent */

/* The workers of one run, as the parent sees them. */
typedef struct Crew {
    int world, started;
    pid_t pids[MAX_WORKERS];
    int reports[MAX_WORKERS];   /* our ends of the sockets they report on */
} Crew;

/* Listening sockets on ports the kernel picks, made here so no other program can take
 * a port between choosing and listening; each worker inherits its own. */
static bool open_listeners(Run *run, int *listeners) {
    char err[512];
    listeners[0] = -1;
    run->ports[0] = 0;
    for (int rank = 1; rank < run->world; rank++) {
        struct sockaddr_in a;
        socklen_t alen = sizeof a;
        listeners[rank] = ddp_listen(0, err, sizeof err);
        if (listeners[rank] < 0 || getsockname(listeners[rank], (struct sockaddr *)&a, &alen) != 0) {
            fprintf(stderr, "bench_allreduce: a listening socket for rank %d: %s\n", rank,
                    listeners[rank] < 0 ? err : strerror(errno));
            return false;
        }
        run->ports[rank] = ntohs(a.sin_port);
    }
    return true;
}

static void close_all(int *fds, int count) {
    for (int i = 0; i < count; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Forks the workers; false when one could not start (those started are the caller's
 * to stop). */
static bool start_crew(Run *run, Crew *crew) {
    int listeners[MAX_WORKERS], writers[MAX_WORKERS];
    *crew = (Crew){.world = run->world};
    for (int i = 0; i < run->world; i++)
        listeners[i] = writers[i] = crew->reports[i] = -1;
    bool listening = open_listeners(run, listeners), ok = listening;
    for (int rank = 0; ok && rank < run->world; rank++) {
        int ends[2];
        ok = socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) == 0;
        if (ok) {
            crew->reports[rank] = ends[0];
            writers[rank] = ends[1];
        }
    }
    pid_t parent = getpid();
    fflush(NULL);
    for (int rank = 0; ok && rank < run->world; rank++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* a worker never outlives the bench, however the bench ends */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1);
            int mine = listeners[rank], report = writers[rank];
            listeners[rank] = writers[rank] = -1;
            close_all(listeners, run->world);
            close_all(writers, run->world);
            close_all(crew->reports, run->world);
            _exit(worker(run, rank, mine, report));
        }
        ok = pid > 0;
        if (ok)
            crew->pids[crew->started++] = pid;
    }
    if (listening && !ok)
        fprintf(stderr, "bench_allreduce: starting %d workers: %s\n", run->world, strerror(errno));
    close_all(listeners, run->world);
    close_all(writers, run->world);
    return ok;
}

/* len bytes from a worker's report socket; false when it closed it or said nothing for too long. */
static bool read_report(int fd, void *data, size_t len) {
    int got = ddp_recv_all(fd, data, len, ddp_now_ms() + SILENCE_TIMEOUT_MS);
    if (got == -1)
        fprintf(stderr, "bench_allreduce: no worker reported for %d s: stopping them\n", SILENCE_TIMEOUT_MS / 1000);
    return got == 1;
}

/* The median over repetitions of the slowest worker's time, from every worker's
 * report of one size; false when a worker stopped before reporting. */
static bool collect_size(const Crew *crew, int *reps, double *seconds) {
    double slowest[MAX_REPS];
    for (int rank = 0; rank < crew->world; rank++) {
        double times[MAX_REPS];
        int count;
        if (!read_report(crew->reports[rank], &count, sizeof count) || count < 1 || count > MAX_REPS ||
            (rank > 0 && count != *reps) || !read_report(crew->reports[rank], times, sizeof(double) * (size_t)count))
            return false;
        *reps = count;
        for (int k = 0; k < count; k++)
            slowest[k] = rank == 0 || times[k] > slowest[k] ? times[k] : slowest[k];
    }
    *seconds = median(slowest, *reps);
    return true;
}

/* Waits for a worker until the deadline, then kills it; false when it was killed. */
static bool reap(pid_t pid, double deadline, int *status) {
    for (;;) {
        pid_t done = waitpid(pid, status, WNOHANG);
        if (done == pid || (done < 0 && errno != EINTR))
            return true;
        if (ddp_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, status, 0);
            return false;
        }
        usleep(10 * 1000);
    }
}

/* Reaps the workers. After a failure the others stop on their own once the ring
 * breaks; any still running a moment later is killed. False when any failed: each
 * failure is named. */
static bool stop_crew(Crew *crew, bool failed) {
    double deadline = failed ? ddp_now_ms() + 2000 : INFINITY;
    bool ok = !failed;
    for (int rank = 0; rank < crew->started; rank++) {
        int s = 0;
        if (!reap(crew->pids[rank], deadline, &s))
            fprintf(stderr, "bench_allreduce: %d workers: rank %d still ran: killed\n", crew->world, rank);
        else if (WIFSIGNALED(s))
            fprintf(stderr, "bench_allreduce: %d workers: rank %d ended by signal %d\n", crew->world, rank,
                    WTERMSIG(s));
        else if (WIFEXITED(s) && WEXITSTATUS(s) != 0)
            fprintf(stderr, "bench_allreduce: %d workers: rank %d exited with status %d\n", crew->world, rank,
                    WEXITSTATUS(s));
        else
            continue;
        ok = false;
    }
    close_all(crew->reports, crew->world);
    return ok;
}

/* ---------------------------------------------------------------- output */

/* "4K", "256M": sizes here are powers of 2 times small numbers. */
static const char *size_text(char *buf, size_t len, int64_t bytes) {
    static const char units[] = "KMGT";
    int u = 0;
    while (bytes >= 1024 && bytes % 1024 == 0 && u < 4) {
        bytes /= 1024;
        u++;
    }
    if (u)
        snprintf(buf, len, "%lld%c", (long long)bytes, units[u - 1]);
    else
        snprintf(buf, len, "%lld", (long long)bytes);
    return buf;
}

static const char *time_text(char *buf, size_t len, double seconds) {
    if (seconds < 1e-3)
        snprintf(buf, len, "%.1f us", seconds * 1e6);
    else if (seconds < 1)
        snprintf(buf, len, "%.2f ms", seconds * 1e3);
    else
        snprintf(buf, len, "%.3f s", seconds);
    return buf;
}

static void print_table_head(int workers) {
    printf("\n%d workers: ring all-reduce over TCP on 127.0.0.1, f32\n", workers);
    printf("%8s %5s %11s %11s %11s %12s %13s\n", "size", "reps", "time", "algbw GB/s", "busbw GB/s", "memcpy GB/s",
           "busbw/memcpy");
}

static void print_row(const Measurement *m) {
    char size[32], time[32];
    double algbw = gbps(m->bytes, m->seconds), busbw = algbw * bus_factor(m->workers);
    printf("%8s %5d %11s %11.3f %11.3f %12.2f %13.3f\n", size_text(size, sizeof size, m->bytes), m->reps,
           time_text(time, sizeof time, m->seconds), algbw, busbw, m->memcpy_gbps, busbw / m->memcpy_gbps);
    fflush(stdout);
}

static void print_json(const Measurement *m) {
    double algbw = gbps(m->bytes, m->seconds);
    printf("{\"bench\": \"ring_allreduce\", \"workers\": %d, \"bytes\": %lld, \"reps\": %d, \"seconds\": %.9g, "
           "\"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, \"memcpy_gbps\": %.6g}\n",
           m->workers, (long long)m->bytes, m->reps, m->seconds, algbw, algbw * bus_factor(m->workers),
           m->memcpy_gbps);
}

/* ------------------------------------------------------------ command line */

static void usage(void) {
    fprintf(stderr, "usage: bench_allreduce [--workers N,...] [--min BYTES] [--max BYTES] [--seconds S] [--json]\n"
                    "  defaults: --workers 2,4,8 --min 1K --max 256M --seconds 0.5; sizes grow 4x; K, M, G: 2^10, "
                    "2^20, 2^30\n");
    exit(2);
}

static int64_t parse_bytes(const char *text) {
    char *end;
    long long n = strtoll(text, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift)
        end++;
    if (end == text || *end || n <= 0 || n > (1ll << (40 - shift)))
        usage();
    return (int64_t)n << shift;
}

static void parse_workers(const char *text, Options *o) {
    o->worker_counts = 0;
    for (const char *p = text; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 2 || n > MAX_WORKERS || o->worker_counts == MAX_WORKER_COUNTS || (*end && *end != ','))
            usage();
        o->workers[o->worker_counts++] = (int)n;
        p = *end ? end + 1 : end;
    }
    if (o->worker_counts == 0)
        usage();
}

static Options parse_options(int argc, char **argv) {
    Options o = {.seconds = 0.5};
    int64_t min = 1 << 10, max = 256 << 20;
    parse_workers("2,4,8", &o);
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(flag, "--json") == 0) {
            o.json = true;
            continue;
        }
        if (!value)
            usage();
        i++;
        if (strcmp(flag, "--workers") == 0)
            parse_workers(value, &o);
        else if (strcmp(flag, "--min") == 0)
            min = parse_bytes(value);
        else if (strcmp(flag, "--max") == 0)
            max = parse_bytes(value);
        else if (strcmp(flag, "--seconds") == 0)
            o.seconds = atof(value);
        else
            usage();
    }
    if (!(o.seconds > 0))
        usage();
    min -= min % (int64_t)sizeof(float);
    if (min < (int64_t)sizeof(float) || max < min)
        usage();
    for (int64_t bytes = min; bytes <= max && o.size_count < MAX_SIZES; bytes *= SIZE_STEP)
        o.sizes[o.size_count++] = bytes;
    return o;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    Options o = parse_options(argc, argv);
    char low[32], high[32];
    printf("bench_allreduce: %ld CPUs; %s to %s, %dx each step; about %g s of timed all-reduces per size (%d to "
           "%d repetitions after %d warm-ups)\n",
           sysconf(_SC_NPROCESSORS_ONLN), size_text(low, sizeof low, o.sizes[0]),
           size_text(high, sizeof high, o.sizes[o.size_count - 1]), SIZE_STEP, o.seconds, MIN_REPS, MAX_REPS,
           WARMUP);
    double memcpy_gbps[MAX_SIZES];
    for (int s = 0; s < o.size_count; s++)
        memcpy_gbps[s] = gbps(o.sizes[s], memcpy_seconds(o.sizes[s], o.seconds));

    static Measurement results[MAX_WORKER_COUNTS * MAX_SIZES];
    int measured = 0;
    for (int w = 0; w < o.worker_counts; w++) {
        Run run = {.options = &o, .world = o.workers[w]};
        Crew crew;
        bool ok = start_crew(&run, &crew);
        if (ok)
            print_table_head(run.world);
        for (int s = 0; ok && s < o.size_count; s++) {
            Measurement *m = &results[measured];
            *m = (Measurement){.workers = run.world, .bytes = o.sizes[s], .memcpy_gbps = memcpy_gbps[s]};
            ok = collect_size(&crew, &m->reps, &m->seconds);
            if (ok) {
                print_row(m);
                measured++;
            }
        }
        if (!stop_crew(&crew, !ok)) {
            fprintf(stderr, "bench_allreduce: FAILED with %d workers\n", run.world);
            return 1;
        }
    }
    if (o.json) {
        printf("\n");
        for (int i = 0; i < measured; i++)
            print_json(&results[i]);
    }
    return 0;
}
