/* ddprun.c: `ddprun -n N [--] PROGRAM ARGS...` starts N copies of a built program on
 * this machine as one job, the way srun does on a cluster (like torchrun
 * --standalone). Each worker gets DDP_RANK, DDP_WORLD_SIZE, DDP_LOCAL_RANK,
 * DDP_LOCAL_WORLD_SIZE, DDP_COORDINATOR (127.0.0.1 and a free port) and DDP_SECRET (a
 * fresh random secret the workers prove to each other). Worker i listens on the
 * coordinator's port + i, so the N ports are drawn together, all free, outside the
 * kernel's ephemeral range (where any outgoing connection may take one at any time)
 * and outside 10000-20000 (where jobs under srun derive theirs). Each line a worker writes to
 * stderr comes out prefixed with its rank; stdout passes through.
 *
 * SIGINT, SIGTERM and SIGHUP are passed on to every worker, once. When a worker fails
 * (a non-zero status or a signal), the others get SIGTERM (unless a signal was passed
 * on already), and SIGKILL if they are still there after a grace period. A worker that
 * ends with status 3 failed only because another did (it lost a peer), and the one
 * that failed first is then still ending and telling the others why: so after a 3 the
 * others get the grace period to end on their own before SIGTERM. ddprun exits with
 * the status of the failure that caused the others (128 + the signal for a signal):
 * the first failure that is not a 3, nor the end of a worker ddprun stopped; else the
 * first failure; 0 when every worker succeeded. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_WORKERS = 1024, LINE = 4096, GRACE_SECONDS = 5 };

static const char usage[] =
    "usage: ddprun -n N [--port P] [--grace S] [--] PROGRAM [ARGS...]\n"
    "Starts N workers of PROGRAM on this machine as one data-parallel job.\n"
    "  -n N         the number of workers (1 to 1024)\n"
    "  --port P     the coordinator's port (default: a free one)\n"
    "  --grace S    seconds the others get to stop after one fails (default 5)\n"
    "Exit status: the first failing worker's (128 + signal for a signal), where a worker that\n"
    "lost another (status 3) gives way to the one that failed; 0 if all succeed, 2 on bad usage.\n";

typedef struct Worker {
    pid_t pid;
    int err_fd;                 /* the read end of its stderr, -1 once closed */
    char line[LINE];            /* a line not yet ended */
    size_t len;
    bool running;
} Worker;

static Worker workers[MAX_WORKERS];
static int nworkers;
static int signal_pipe[2];

static void on_signal(int sig) {
    unsigned char s = (unsigned char)sig;
    int saved = errno;
    (void)!write(signal_pipe[1], &s, 1);
    errno = saved;
}

static int bad_usage(const char *what, const char *arg) {
    fprintf(stderr, "ddprun: %s%s\n%s", what, arg, usage);
    return 2;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Whether a listener could bind port now, as the workers do (SO_REUSEADDR, any
 * address). */
static bool port_free(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = INADDR_ANY};
    if (fd < 0)
        return false;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* The first of n consecutive free ports above 20000 and outside the ephemeral range,
 * drawn at random so that jobs started together rarely meet; -1 if none is found. */
static int free_port_run(int n) {
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768, hi = 60999;
        fclose(f);
    }
    int windows[2][2] = {{20000, lo - 1}, {hi + 1, 65535}};
    unsigned draw = 0;
    for (int attempt = 0; attempt < 200; attempt++) {
        int *w = windows[attempt % 2];
        int span = w[1] - w[0] + 1 - n;
        if (span <= 0)
            continue;
        if (getrandom(&draw, sizeof draw, 0) != (ssize_t)sizeof draw)
            draw = draw * 1103515245u + 12345u + (unsigned)getpid();
        int base = w[0] + (int)(draw % (unsigned)span), i = 0;
        while (i < n && port_free(base + i))
            i++;
        if (i == n)
            return base;
    }
    errno = EADDRINUSE;
    return -1;
}

static bool random_secret(char *out, size_t len) {
    unsigned char bytes[16];
    if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes || len < 2 * sizeof bytes + 1)
        return false;
    for (size_t i = 0; i < sizeof bytes; i++)
        sprintf(out + 2 * i, "%02x", bytes[i]);
    return true;
}

static void set_number(const char *name, long v) {
    char text[32];
    snprintf(text, sizeof text, "%ld", v);
    setenv(name, text, 1);
}

/* The child's side: its variables, stderr into the pipe, then the program. */
static void exec_worker(int rank, int err_fd, char **argv) {
    setpgid(0, 0);
    set_number("DDP_RANK", rank);
    set_number("DDP_LOCAL_RANK", rank);
    dup2(err_fd, STDERR_FILENO);
    close(err_fd);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    execvp(argv[0], argv);
    fprintf(stderr, "ddprun: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

static bool start_workers(int n, char **argv) {
    for (int r = 0; r < n; r++) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0)
            return false;
        pid_t pid = fork();
        if (pid < 0)
            return false;
        if (pid == 0) {
            close(fds[0]);
            int keep = dup(fds[1]); /* without O_CLOEXEC, to become stderr */
            exec_worker(r, keep, argv);
        }
        close(fds[1]);
        setpgid(pid, pid); /* as the child does, whichever runs first */
        workers[r] = (Worker){.pid = pid, .err_fd = fds[0], .running = true};
        nworkers++;
    }
    return true;
}

/* ----------------------------------------------------------------- stderr */

static void emit(int rank, const char *text, size_t len) {
    fprintf(stderr, "[rank %d] %.*s\n", rank, (int)len, text);
}

/* Whole lines of what the worker wrote go out prefixed; a line too long for the
 * buffer goes out in pieces. */
static void drain(int rank) {
    Worker *w = &workers[rank];
    char buf[LINE];
    ssize_t n = read(w->err_fd, buf, sizeof buf);
    if (n <= 0) {
        if (n < 0 && errno == EINTR)
            return;
        if (w->len)
            emit(rank, w->line, w->len);
        w->len = 0;
        close(w->err_fd);
        w->err_fd = -1;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || w->len == sizeof w->line) {
            emit(rank, w->line, w->len);
            w->len = 0;
            if (buf[i] == '\n')
                continue;
        }
        w->line[w->len++] = buf[i];
    }
}

/* ------------------------------------------------------------------ statuses */

/* Each worker leads its own process group, so a signal reaches whatever it started
 * too (a shell's children that still hold its stderr). */
static void signal_all(int sig) {
    for (int r = 0; r < nworkers; r++)
        if (workers[r].running || workers[r].err_fd >= 0)
            kill(-workers[r].pid, sig);
}

/* The signal last passed on to every worker, 0 if none: a worker that ends because of
 * it is no failure to tell, and the others have it already. */
static int passed_on;

/* The job's status so far and when the workers still there get SIGTERM, then SIGKILL. */
typedef struct Ending {
    int status;                 /* of the failure that caused the others; 0: none yet */
    double term_at, kill_at;    /* 0: not due */
    bool stopped;               /* ddprun has signalled the workers */
} Ending;

/* A failure that another caused: a lost peer (3), or the end of a worker ddprun stopped
 * (SIGTERM or SIGKILL, or status 4 or 130, a checkpoint written on the signal). */
static bool caused_by_another(const Ending *e, int code) {
    return code == 3 || (e->stopped && (code == 128 + SIGTERM || code == 128 + SIGKILL || code == 4 || code == 130));
}

/* Reaps what has ended, keeping the status of the failure that caused the others. */
static void reap(Ending *e, double grace) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int r = 0; r < nworkers; r++) {
            if (workers[r].pid != pid)
                continue;
            workers[r].running = false;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (code == 0)
                continue;
            if (e->status != 0) {
                if (caused_by_another(e, e->status) && !caused_by_another(e, code)) {
                    e->status = code; /* the cause has ended: the others need not wait */
                    if (e->term_at)
                        e->term_at = now(), e->kill_at = now() + grace;
                }
                continue;
            }
            e->status = code;
            if (passed_on) { /* the workers have a signal already */
                e->kill_at = now() + grace;
                continue;
            }
            fprintf(stderr, "ddprun: worker %d %s %d%s; stopping the others\n", r,
                    WIFEXITED(status) ? "exited with status" : "was killed by signal",
                    WIFEXITED(status) ? code : WTERMSIG(status), code == 3 ? " (it lost another)" : "");
            e->term_at = now() + (code == 3 ? grace : 0);
            e->kill_at = e->term_at + grace;
        }
    }
}

static bool any_running(void) {
    for (int r = 0; r < nworkers; r++)
        if (workers[r].running || workers[r].err_fd >= 0)
            return true;
    return false;
}

static void forward_signals(void) {
    unsigned char s;
    while (read(signal_pipe[0], &s, 1) == 1) {
        passed_on = s;
        signal_all(s);
    }
}

static int supervise(double grace) {
    Ending e = {0};
    struct pollfd fds[MAX_WORKERS + 1];
    while (any_running()) {
        int n = 0, owner[MAX_WORKERS + 1];
        fds[n] = (struct pollfd){.fd = signal_pipe[0], .events = POLLIN};
        owner[n++] = -1;
        for (int r = 0; r < nworkers; r++)
            if (workers[r].err_fd >= 0) {
                fds[n] = (struct pollfd){.fd = workers[r].err_fd, .events = POLLIN};
                owner[n++] = r;
            }
        poll(fds, (nfds_t)n, 100);
        for (int i = 0; i < n; i++)
            if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (owner[i] < 0)
                    forward_signals();
                else
                    drain(owner[i]);
            }
        reap(&e, grace);
        if (e.term_at && now() >= e.term_at) {
            e.stopped = true;
            signal_all(SIGTERM);
            e.term_at = 0;
        }
        if (e.kill_at && now() >= e.kill_at) /* after the grace period */
            signal_all(SIGKILL);
    }
    return e.status;
}

int main(int argc, char **argv) {
    long n = 0, port = 0, grace = GRACE_SECONDS;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        char *end;
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("%s", usage);
            return 0;
        }
        long *target = strcmp(argv[i], "-n") == 0 ? &n : strcmp(argv[i], "--port") == 0 ? &port
                     : strcmp(argv[i], "--grace") == 0 ? &grace : NULL;
        if (!target)
            return bad_usage("unknown option ", argv[i]);
        if (i + 1 >= argc)
            return bad_usage(argv[i], " needs a value");
        *target = strtol(argv[++i], &end, 10);
        if (*end || !*argv[i])
            return bad_usage("not a number: ", argv[i]);
    }
    if (n < 1 || n > MAX_WORKERS)
        return bad_usage("-n wants a number of workers from 1 to 1024", "");
    if (port < 0 || port > 65535 || grace < 0)
        return bad_usage("--port wants a port from 1 to 65535 and --grace a number of seconds", "");
    if (i >= argc)
        return bad_usage("no program to run", "");
    if (port == 0 && (port = free_port_run((int)n)) < 0) {
        fprintf(stderr, "ddprun: cannot find %ld free ports in a row outside the ephemeral range: %s; "
                "give the first with --port\n", n, strerror(errno));
        return 1;
    }
    char secret[64], coordinator[64];
    if (!getenv("DDP_SECRET")) {
        if (!random_secret(secret, sizeof secret)) {
            fprintf(stderr, "ddprun: cannot draw a random secret: %s\n", strerror(errno));
            return 1;
        }
        setenv("DDP_SECRET", secret, 1);
    }
    snprintf(coordinator, sizeof coordinator, "127.0.0.1:%ld", port);
    setenv("DDP_COORDINATOR", coordinator, 1);
    set_number("DDP_WORLD_SIZE", n);
    set_number("DDP_LOCAL_WORLD_SIZE", n);
    if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return 1;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    if (!start_workers((int)n, argv + i)) {
        fprintf(stderr, "ddprun: cannot start the workers: %s\n", strerror(errno));
        signal_all(SIGKILL);
        supervise(0);
        return 1;
    }
    return supervise((double)grace);
}
