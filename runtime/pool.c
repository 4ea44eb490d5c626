/* pool.c: the worker's threads, the only ones doing compute in the process. A range
 * (a kernel's indices, a matrix product's row blocks) is cut into one contiguous part
 * per thread; the calling thread takes the first part and waits for the rest. Ranges
 * too small to be worth waking threads for run on the caller alone. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "runtime.h"

/* A training step is dozens of parallel ranges, some microseconds apart and some a
 * single-threaded kernel or the host's work apart; waking a sleeping thread costs 40 us
 * on a virtual machine, more than many of those ranges. So a waiting thread spins
 * (SPIN_ROUNDS pauses, some tens of microseconds), then keeps looking between
 * sched_yield calls, which give the CPU to any other thread that wants it, for up to
 * YIELD_MS, and only then sleeps. */
enum { MIN_PARALLEL = 4096, SPIN_ROUNDS = 2000, YIELD_MS = 2 };

struct ddp_pool {
    int n;
    const char *name;           /* its threads' name: a static string */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    ddp_range_fn fn;
    void *ctx;
    int64_t begin, end;
    atomic_uint generation;     /* a new range to run */
    atomic_int pending;         /* parts of the range not yet done */
    atomic_int sleepers;        /* threads asleep (or going to sleep) on start or done */
    atomic_bool quit;
};

typedef struct Worker {
    ddp_pool *pool;
    int index;
} Worker;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_part(ddp_pool *p, int part) {
    int64_t total = p->end - p->begin;
    int64_t lo = p->begin + total * part / p->n, hi = p->begin + total * (part + 1) / p->n;
    if (lo < hi)
        p->fn(p->ctx, lo, hi);
}

/* Spins, then yields, then sleeps on cond, until ready(p, arg). A thread that changes
 * what ready reads does so before it looks at sleepers (both sequentially consistent),
 * and a sleeper counts itself before it last reads, so no wake-up is lost. */
static void await(ddp_pool *p, pthread_cond_t *cond, bool (*ready)(ddp_pool *, unsigned), unsigned arg) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (ready(p, arg))
            return;
        cpu_relax();
    }
    for (double until = ddp_now_ms() + YIELD_MS; ddp_now_ms() < until;) {
        if (ready(p, arg))
            return;
        sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while (!ready(p, arg))
        pthread_cond_wait(cond, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
}

static void wake(ddp_pool *p, pthread_cond_t *cond) {
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(cond);
        pthread_mutex_unlock(&p->mu);
    }
}

static bool range_posted(ddp_pool *p, unsigned seen) {
    return atomic_load(&p->generation) != seen || atomic_load(&p->quit);
}

static bool parts_done(ddp_pool *p, unsigned unused) {
    (void)unused;
    return atomic_load(&p->pending) == 0;
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    pthread_setname_np(pthread_self(), w->pool->name);
    ddp_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        await(p, &p->start, range_posted, seen);
        if (atomic_load(&p->quit))
            break;
        seen = atomic_load(&p->generation);
        run_part(p, w->index);
        if (atomic_fetch_sub(&p->pending, 1) == 1)
            wake(p, &p->done);
    }
    free(w);
    return NULL;
}

ddp_pool *ddp_pool_new(int threads, const char *name) {
    ddp_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = threads < 1 ? 1 : threads;
    p->name = name;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    if (!(p->threads = calloc((size_t)p->n, sizeof(pthread_t)))) {
        p->n = 1;
        ddp_pool_free(p);
        return NULL;
    }
    for (int i = 1; i < p->n; i++) {
        Worker *w = malloc(sizeof *w);
        if (w) {
            w->pool = p;
            w->index = i;
        }
        if (!w || pthread_create(&p->threads[i], NULL, worker_main, w) != 0) {
            free(w);
            p->n = i; /* run with the threads that started */
            break;
        }
    }
    return p;
}

void ddp_pool_free(ddp_pool *p) {
    if (!p)
        return;
    atomic_store(&p->quit, true);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int ddp_pool_threads(const ddp_pool *p) {
    return p->n;
}

void ddp_pool_for(ddp_pool *p, ddp_range_fn fn, void *ctx, int64_t begin, int64_t end, int64_t min_parallel) {
    if (end <= begin)
        return;
    if (p->n == 1 || end - begin < min_parallel) {
        fn(ctx, begin, end);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->begin = begin;
    p->end = end;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->generation, 1);
    wake(p, &p->start);
    run_part(p, 0);
    await(p, &p->done, parts_done, 0);
}

typedef struct KernelCall {
    ddp_kernel_fn fn;
    void *const *buffers;
    const ddp_scalar *scalars;
} KernelCall;

static void kernel_part(void *ctx, int64_t begin, int64_t end) {
    KernelCall *k = ctx;
    k->fn(k->buffers, k->scalars, begin, end);
}

void ddp_pool_run(ddp_pool *p, ddp_kernel_fn fn, void *const *buffers, const ddp_scalar *scalars,
                  int64_t begin, int64_t end, int64_t work) {
    KernelCall k = {fn, buffers, scalars};
    int64_t indices = MIN_PARALLEL / (work > 1 ? work : 1);
    ddp_pool_for(p, kernel_part, &k, begin, end, indices > 2 ? indices : 2);
}
