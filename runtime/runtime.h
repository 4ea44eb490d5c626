/* runtime.h: the runtime library's internal interface, one section per file.
 *
 * The runtime knows the machine and never the model: it allocates the regions the
 * program's descriptor asks for, fills the buffer table, and walks the schedule of a
 * phase, running generated kernels on its threads and matrix products with BLAS. The
 * minimal executor here trains on one CPU worker; the data, cluster and transport
 * layers plug into its hooks. */
#ifndef DDP_RUNTIME_H
#define DDP_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp_abi.h"

/* --------------------------------------------------------------- philox.c */

void ddp_philox4(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);
/* A draw keyed as ddp_abi.h says. */
void ddp_draw(uint64_t seed, uint32_t stream, uint64_t sample, uint32_t element, uint32_t step,
              uint32_t out[4]);
double ddp_uniform53(const uint32_t w[4]); /* [0, 1) from words 0 and 1 */

/* ----------------------------------------------------------------- pool.c */

typedef struct ddp_pool ddp_pool;
ddp_pool *ddp_pool_new(int threads);
void ddp_pool_free(ddp_pool *p);
int ddp_pool_threads(const ddp_pool *p);
/* Runs fn over [begin, end), split among the threads, or on the caller alone when the
 * range is shorter than min_parallel; returns when all parts are done. */
typedef void (*ddp_range_fn)(void *ctx, int64_t begin, int64_t end);
void ddp_pool_for(ddp_pool *p, ddp_range_fn fn, void *ctx, int64_t begin, int64_t end, int64_t min_parallel);
/* A kernel over [begin, end) the same way. */
void ddp_pool_run(ddp_pool *p, ddp_kernel_fn fn, void *const *buffers, const ddp_scalar *scalars,
                  int64_t begin, int64_t end);

/* ----------------------------------------------------------------- exec.c */

typedef struct ddp_options {
    int threads;           /* 0: as many as the process may use */
    bool baseline_cpu;     /* the baseline kernels even where AVX2 is there */
    bool poison;           /* fill planned memory with NaN outside each value's life */
} ddp_options;

/* Called by the executor at the schedule's markers; NULL for one worker. */
typedef struct ddp_hooks {
    void *ctx;
    void (*bucket_ready)(void *ctx, int64_t bucket);
    void (*wait_buckets)(void *ctx);
    void (*metrics_ready)(void *ctx);
} ddp_hooks;

typedef struct ddp_runtime {
    const ddp_program *program;
    ddp_options options;
    ddp_hooks hooks;
    void *region[DDP_REGION_COUNT];
    void **buffers;                /* the buffer table */
    void ***step_args[DDP_PHASE_COUNT]; /* each kernel step's buffers, by step */
    ddp_scalar scalars[DDP_S_COUNT];
    const ddp_kernel_fn *kernels;  /* the variant this CPU runs */
    ddp_pool *pool;
    int64_t elem_size;
    int replicas, workers;
} ddp_runtime;

/* Allocates and prepares a program's regions; NULL with a message in err. */
ddp_runtime *ddp_open(const ddp_program *p, const ddp_options *o, char *err, size_t errlen);
void ddp_close(ddp_runtime *rt);
/* Sets the parameters and statistics to their initial values for a seed: the same on
 * every machine and for any number of workers. */
void ddp_init_params(ddp_runtime *rt, uint64_t seed);
void ddp_set_batch(ddp_runtime *rt, int64_t local, int64_t global);
void ddp_run_phase(ddp_runtime *rt, int phase);
/* steps [first, first + count) of a phase */
void ddp_run_steps(ddp_runtime *rt, int phase, int64_t first, int64_t count);
/* forward, backward, optimizer: one training step on the batch in the input region */
void ddp_train_step(ddp_runtime *rt);
void ddp_zero_accumulators(ddp_runtime *rt);
double ddp_accumulator(ddp_runtime *rt, int pair, double *count);
void *ddp_buffer_ptr(ddp_runtime *rt, int64_t slot);

/* ------------------------------------------------------------- schedule.c */

double ddp_rt_eval(const ddp_rt_expr *e, double replicas, double workers, double global_batch);
/* The learning rate of step (0-based) with steps_per_epoch steps in an epoch. */
double ddp_learning_rate(const ddp_program *p, int64_t step, int64_t steps_per_epoch, double replicas,
                         double workers, double global_batch);
/* Sets the step's scalars: learning rate, weight decay, bias corrections, step. */
void ddp_prepare_step(ddp_runtime *rt, int64_t step, int64_t steps_per_epoch);

#endif
