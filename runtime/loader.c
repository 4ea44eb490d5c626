/* loader.c: which samples each step trains on, and a thread that assembles them.
 *
 * An epoch's order is a permutation drawn from (seed, epoch) alone, so every worker
 * computes the same one without talking (S8); the order is cut into global batches,
 * the last one dropped or kept (S9), and each worker reads only its shard of each
 * global batch (S6). The loader thread assembles batch b + 1 while step b runs, with
 * helpers where it has them: each takes a contiguous part of the batch's rows (a row's
 * values and augmentation depend on its sample alone, so the batch is the same bits
 * whatever the number of threads). Before it assembles a batch it asks for the samples
 * of the PREFETCH batches after it (ddp_data_prefetch), which a dataset too large to
 * be read ahead whole needs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* ------------------------------------------------------------------ order */

/* The position that position i swaps with: one of [0, i], drawn with counter
 * (0, i, epoch). */
static int64_t swap_partner(uint64_t seed, int64_t epoch, int64_t i) {
    uint32_t w[4];
    ddp_draw(seed, DDP_STREAM_SHUFFLE, (uint64_t)i, 0, (uint32_t)epoch, w);
    return ddp_draw_below(w, i + 1);
}

/* Fisher-Yates from the end. A partner depends on its position alone, so each is
 * drawn SHUFFLE_AHEAD swaps early and its entry asked into the cache then: an order
 * larger than the cache (a corpus of millions of windows) otherwise waits on memory
 * at every swap. */
enum { SHUFFLE_AHEAD = 32 };

void ddp_epoch_order(uint64_t seed, int64_t epoch, bool shuffle, int64_t n, int64_t *order) {
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    if (!shuffle)
        return;
    int64_t partner[SHUFFLE_AHEAD];
    for (int64_t i = n - 1; i > 0 && i > n - 1 - SHUFFLE_AHEAD; i--)
        partner[i % SHUFFLE_AHEAD] = swap_partner(seed, epoch, i);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = partner[i % SHUFFLE_AHEAD], later = i - SHUFFLE_AHEAD;
        if (later > 0) {
            int64_t k = swap_partner(seed, epoch, later);
            partner[later % SHUFFLE_AHEAD] = k;
            __builtin_prefetch(&order[k], 1);
        }
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

void ddp_repeat_order(int64_t n, int64_t repeats, int64_t *order) {
    /* from the end: entry p reads entry p / repeats, at or before p, still the permutation's */
    for (int64_t p = n - 1; repeats > 1 && p >= 0; p--)
        order[p] = order[p / repeats] + p % repeats * n;
}

void ddp_training_order(const ddp_program *p, uint64_t seed, int64_t epoch, int64_t n, int64_t *order) {
    ddp_epoch_order(seed, epoch, p->settings.shuffle, n, order);
    ddp_repeat_order(n, p->settings.augment_repeats, order);
}

void ddp_shard_range(int64_t count, int64_t parts, int64_t part, int64_t *begin, int64_t *size) {
    int64_t base = count / parts, extra = count % parts;
    *begin = part * base + (part < extra ? part : extra);
    *size = base + (part < extra);
}

bool ddp_plan_epoch(int64_t samples, int64_t global_batch, bool drop_remainder, int64_t steps_per_epoch,
                    ddp_epoch_plan *plan, char *err, size_t errlen) {
    int64_t full = samples / global_batch, available = full + (!drop_remainder && samples % global_batch);
    plan->samples = samples;
    plan->global_batch = global_batch;
    if (available == 0) {
        snprintf(err, errlen, "the dataset has %lld samples, fewer than one global batch of %lld, and "
                              "drop_remainder is on: lower batch_per_replica (or accumulate_batches) or set "
                              "drop_remainder = false",
                 (long long)samples, (long long)global_batch);
        return false;
    }
    if (steps_per_epoch > available) {
        snprintf(err, errlen, "steps_per_epoch is %lld, but %lld samples make only %lld global batch%s of %lld "
                              "per epoch: lower it",
                 (long long)steps_per_epoch, (long long)samples, (long long)available, available == 1 ? "" : "es",
                 (long long)global_batch);
        return false;
    }
    plan->steps = steps_per_epoch >= 0 ? steps_per_epoch : available;
    int64_t used = plan->steps * global_batch < samples ? plan->steps * global_batch : samples;
    plan->dropped = samples - used;
    return true;
}

void ddp_batch_span(const ddp_epoch_plan *plan, int64_t step, int64_t *begin, int64_t *size) {
    *begin = step * plan->global_batch;
    int64_t left = plan->samples - *begin;
    *size = left < plan->global_batch ? left : plan->global_batch;
}

/* ----------------------------------------------------------------- thread */

enum { SLOTS = 2, PREFETCH = 2 };

typedef struct Slot {
    void *x, *y;
    int64_t *ids;
    int64_t rows;
} Slot;

struct ddp_loader {
    const ddp_data *data;
    const ddp_program *program;
    ddp_pool *helpers;          /* the loader thread and its helpers; NULL: the thread alone */
    int64_t x_row, y_row;       /* bytes per row */
    Slot slot[SLOTS];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    /* the pass: batches filled and taken so far; batch b lives in slot b % SLOTS */
    const int64_t *order, *starts, *sizes;
    ddp_draw_key key;
    bool augment;
    int64_t batches, filled, taken;
    int64_t asked;              /* batches of the pass whose samples were asked for */
    bool filling, quit;
};

static int64_t row_bytes(const ddp_program *p, bool label) {
    int64_t per = 1;
    if (label)
        return ddp_dtype_size(p->label_dtype) * ddp_label_values(p);
    for (int d = 0; d < p->input_rank; d++)
        per *= p->input_shape[d];
    return ddp_dtype_size(ddp_input_dtype(p)) * per;
}

static bool may_fill(const ddp_loader *l) {
    return l->filled < l->batches && l->filled - l->taken < SLOTS;
}

typedef struct Fill {
    ddp_loader *loader;
    Slot *slot;
    const int64_t *rows;
} Fill;

static void fill_rows(void *ctx, int64_t begin, int64_t end) {
    Fill *f = ctx;
    ddp_loader *l = f->loader;
    Slot *s = f->slot;
    ddp_data_batch(l->data, l->program, f->rows + begin, end - begin, l->augment ? &l->key : NULL,
                   (char *)s->x + begin * l->x_row, (char *)s->y + begin * l->y_row, s->ids + begin);
}

static void *loader_main(void *arg) {
    pthread_setname_np(pthread_self(), "ddp-loader");
    ddp_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && !may_fill(l))
            pthread_cond_wait(&l->changed, &l->mu);
        if (l->quit)
            break;
        int64_t b = l->filled;
        Slot *s = &l->slot[b % SLOTS];
        const int64_t *rows = l->order + l->starts[b];
        s->rows = l->sizes[b];
        l->filling = true;
        pthread_mutex_unlock(&l->mu);
        for (; l->asked < l->batches && l->asked <= b + PREFETCH; l->asked++)
            ddp_data_prefetch(l->data, l->order + l->starts[l->asked], l->sizes[l->asked]);
        Fill fill = {l, s, rows};
        if (l->helpers)
            ddp_pool_for(l->helpers, fill_rows, &fill, 0, s->rows, 2);
        else
            fill_rows(&fill, 0, s->rows);
        pthread_mutex_lock(&l->mu);
        l->filling = false;
        l->filled++;
        pthread_cond_broadcast(&l->changed);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Everything but the thread. */
static void release(ddp_loader *l) {
    for (int i = 0; i < SLOTS; i++) {
        free(l->slot[i].x);
        free(l->slot[i].y);
        free(l->slot[i].ids);
    }
    ddp_pool_free(l->helpers);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->changed);
    free(l);
}

ddp_loader *ddp_loader_new(const ddp_data *d, const ddp_program *p, int64_t max_rows, int threads) {
    ddp_loader *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->data = d;
    l->program = p;
    l->x_row = row_bytes(p, false);
    l->y_row = row_bytes(p, true);
    bool ok = true;
    for (int i = 0; i < SLOTS; i++) {
        Slot *s = &l->slot[i];
        s->x = malloc((size_t)(l->x_row * max_rows) + 1);
        s->y = malloc((size_t)(l->y_row * max_rows) + 1);
        s->ids = malloc(sizeof(int64_t) * (size_t)max_rows + 1);
        ok &= s->x && s->y && s->ids;
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->changed, NULL);
    if (ok && threads > 1) /* the loader thread is the pool's first */
        ok = (l->helpers = ddp_pool_new(threads, "ddp-loader")) != NULL;
    if (!ok || pthread_create(&l->thread, NULL, loader_main, l) != 0) {
        release(l);
        return NULL;
    }
    return l;
}

void ddp_loader_free(ddp_loader *l) {
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->quit = true;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    release(l);
}

void ddp_loader_begin(ddp_loader *l, const int64_t *order, const int64_t *starts, const int64_t *sizes,
                      int64_t batches, const ddp_draw_key *augment) {
    pthread_mutex_lock(&l->mu);
    while (l->filling) /* a batch of the last pass is being written into a slot */
        pthread_cond_wait(&l->changed, &l->mu);
    l->augment = augment != NULL;
    if (augment)
        l->key = *augment;
    l->order = order;
    l->starts = starts;
    l->sizes = sizes;
    l->batches = batches;
    l->filled = l->taken = l->asked = 0;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->mu);
}

int64_t ddp_loader_next(ddp_loader *l, void *x, void *y, int64_t *ids) {
    pthread_mutex_lock(&l->mu);
    if (l->taken >= l->batches) {
        pthread_mutex_unlock(&l->mu);
        return 0;
    }
    while (l->filled <= l->taken)
        pthread_cond_wait(&l->changed, &l->mu);
    Slot *s = &l->slot[l->taken % SLOTS];
    pthread_mutex_unlock(&l->mu);
    /* the thread leaves a filled slot alone until it is taken */
    memcpy(x, s->x, (size_t)(s->rows * l->x_row));
    memcpy(y, s->y, (size_t)(s->rows * l->y_row));
    memcpy(ids, s->ids, sizeof(int64_t) * (size_t)s->rows);
    int64_t rows = s->rows;
    pthread_mutex_lock(&l->mu);
    l->taken++;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->mu);
    return rows;
}
