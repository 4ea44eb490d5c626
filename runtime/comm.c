/* comm.c: the communication thread, which sums gradient buckets over the ring while
 * backward goes on computing the rest.
 *
 * The compiler lays the gradient vector out in the order backward finishes it and
 * cuts it into buckets, each with a marker in the backward schedule where it becomes
 * final. At a marker the executor hands the bucket here; this thread all-reduces the
 * buckets one after another, in the order they were handed over, which is the same on
 * every worker since all walk the same schedule. The training loop waits for the last
 * one before it looks at the gradients. Only this thread touches the ring between a
 * step's start and that wait. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

struct ddp_comm {
    ddp_ring *ring;
    char *grads;                /* the GRADS region */
    const ddp_program *program; /* its buckets, and where they are summed (ddp_wire_offset) */
    const ddp_bucket *buckets;
    int64_t nbuckets;
    ddp_trace *trace;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int64_t *ready;             /* this step's buckets in the order they were marked */
    int64_t marked, completed;
    int64_t step;
    bool failed, stop;
    char err[1024];
};

static void *run(void *arg) {
    pthread_setname_np(pthread_self(), "ddp-comm");
    ddp_comm *c = arg;
    int64_t dtype = ddp_wire_dtype(c->program), es = ddp_dtype_size(dtype);
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->stop && c->completed == c->marked)
            pthread_cond_wait(&c->changed, &c->lock);
        if (c->stop)
            break;
        int64_t b = c->ready[c->completed], step = c->step;
        bool failed = c->failed;
        pthread_mutex_unlock(&c->lock);
        const ddp_bucket *k = &c->buckets[b];
        char err[1024];
        double begin = ddp_trace_clock();
        bool ok = failed || ddp_ring_allreduce(c->ring, c->grads + ddp_wire_offset(c->program, k->begin),
                                               k->end - k->begin, dtype, err, sizeof err);
        ddp_trace_event e = {"all-reduce", DDP_LANE_COMM, step, b, (k->end - k->begin) * es, begin,
                             ddp_trace_clock(), NULL, 0};
        if (!failed)
            ddp_trace_span(c->trace, &e);
        pthread_mutex_lock(&c->lock);
        if (!ok && !c->failed) { /* the buckets after a failure are not sent: the job is over */
            c->failed = true;
            snprintf(c->err, sizeof c->err, "bucket %lld of %lld: %.900s", (long long)b + 1, (long long)c->nbuckets,
                     err);
        }
        c->completed++;
        pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

ddp_comm *ddp_comm_start(ddp_ring *ring, void *grads, const ddp_program *p, ddp_trace *trace) {
    ddp_comm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = (ddp_comm){.ring = ring, .grads = grads, .program = p, .buckets = p->buckets, .nbuckets = p->nbuckets,
                    .trace = trace};
    c->ready = calloc((size_t)p->nbuckets + 1, sizeof *c->ready);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    if (c->ready && pthread_create(&c->thread, NULL, run, c) == 0)
        return c;
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    free(c->ready);
    free(c);
    return NULL;
}

void ddp_comm_begin_step(ddp_comm *c, int64_t step) {
    pthread_mutex_lock(&c->lock);
    c->marked = c->completed = 0;
    c->step = step;
    pthread_mutex_unlock(&c->lock);
}

void ddp_comm_bucket_ready(void *ctx, int64_t bucket) {
    ddp_comm *c = ctx;
    pthread_mutex_lock(&c->lock);
    if (c->marked < c->nbuckets)
        c->ready[c->marked++] = bucket;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* The executor's marker before the optimizer: every bucket marked so far is done. */
void ddp_comm_wait_hook(void *ctx) {
    ddp_comm *c = ctx;
    pthread_mutex_lock(&c->lock);
    while (c->completed < c->marked)
        pthread_cond_wait(&c->changed, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

bool ddp_comm_wait(ddp_comm *c, char *err, size_t errlen) {
    ddp_comm_wait_hook(c);
    pthread_mutex_lock(&c->lock);
    bool ok = !c->failed && c->marked == c->nbuckets;
    if (c->failed)
        snprintf(err, errlen, "%s", c->err);
    else if (!ok)
        snprintf(err, errlen, "backward marked %lld of the program's %lld gradient buckets",
                 (long long)c->marked, (long long)c->nbuckets);
    pthread_mutex_unlock(&c->lock);
    return ok;
}

void ddp_comm_stop(ddp_comm *c) {
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    free(c->ready);
    free(c);
}
