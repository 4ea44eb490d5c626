/* pool.c: the worker's threads, the only ones doing compute in the process. A range
 * (a kernel's indices, a matrix product's row blocks) is cut into one contiguous part
 * per thread; the calling thread takes the first part and waits for the rest. Ranges
 * too small to be worth waking threads for run on the caller alone. */
#include <pthread.h>
#include <stdlib.h>

#include "runtime.h"

enum { MIN_PARALLEL = 4096 };

struct ddp_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    ddp_range_fn fn;
    void *ctx;
    int64_t begin, end;
    unsigned generation;
    int pending;
    bool quit;
};

typedef struct Worker {
    ddp_pool *pool;
    int index;
} Worker;

static void run_part(ddp_pool *p, int part) {
    int64_t total = p->end - p->begin;
    int64_t lo = p->begin + total * part / p->n, hi = p->begin + total * (part + 1) / p->n;
    if (lo < hi)
        p->fn(p->ctx, lo, hi);
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    ddp_pool *p = w->pool;
    unsigned seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->generation == seen && !p->quit)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->quit)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_part(p, w->index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    free(w);
    return NULL;
}

ddp_pool *ddp_pool_new(int threads) {
    ddp_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = threads < 1 ? 1 : threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)p->n, sizeof(pthread_t));
    for (int i = 1; i < p->n; i++) {
        Worker *w = malloc(sizeof *w);
        w->pool = p;
        w->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, w) != 0) {
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
    pthread_mutex_lock(&p->mu);
    p->quit = true;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->begin = begin;
    p->end = end;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_part(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
                  int64_t begin, int64_t end) {
    KernelCall k = {fn, buffers, scalars};
    ddp_pool_for(p, kernel_part, &k, begin, end, MIN_PARALLEL);
}
