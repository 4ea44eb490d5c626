/* ddp_abi.h: the contract between ddpc and the runtime, version 1.
 *
 * `ddpc build` emits one object file holding the generated kernels and a ddp_program
 * describing everything the runtime needs to train the model without knowing it: the
 * kernels and their index ranges, the buffer table, the schedule of every phase
 * (kernel and library calls, gradient-bucket markers, collectives), the parameter
 * table, the run-time scalar expressions, the settings, and a hash over them. The
 * runtime walks the schedule; it never interprets the model.
 *
 * Every field of every structure here is 8 bytes wide (int64_t, double or a pointer),
 * so the compiler can emit them as plain LLVM constants with no padding questions. A
 * change to anything here changes DDP_ABI_VERSION; the runtime refuses a program built
 * for another version. */
#ifndef DDP_ABI_H
#define DDP_ABI_H

#include <stdint.h>

#define DDP_ABI_VERSION 1

/* ------------------------------------------------------------------ kernels */

/* Every generated kernel, on the CPU and on the GPU, has this signature:
 *
 *   void kernel(void *const *buffers, const ddp_scalar *scalars, int64_t begin, int64_t end)
 *
 * buffers: the buffer table (one pointer per buffer slot, see ddp_buffer);
 * scalars: the run-time scalar block (ddp_scalar_slot);
 * [begin, end): the part of the kernel's index range this call covers. The CPU runtime
 * splits a kernel's range among its threads; on the GPU each thread takes one index,
 * begin + blockIdx.x * blockDim.x + threadIdx.x, and returns when it reaches end.
 * An index range is range.fixed + range.per_sample * scalars[DDP_S_LOCAL_BATCH]. */
typedef union ddp_scalar {
    int64_t i;
    double f;
} ddp_scalar;

typedef void (*ddp_kernel_fn)(void *const *buffers, const ddp_scalar *scalars, int64_t begin,
                              int64_t end);

enum ddp_scalar_slot {
    DDP_S_LOCAL_BATCH,      /* i: live samples in this replica's batch (0 is possible) */
    DDP_S_GLOBAL_BATCH,     /* i: live samples in the global batch */
    DDP_S_STEP,             /* i: optimizer steps taken before this one */
    DDP_S_EPOCH,            /* i: the epoch, from 0 */
    DDP_S_SEED,             /* i: the program's seed */
    DDP_S_LEARNING_RATE,    /* f: the rate for this step, schedule and scalars applied */
    DDP_S_BIAS_CORRECTION1, /* f: adam: 1 - beta1^(step + 1) */
    DDP_S_BIAS_CORRECTION2, /* f: adam: 1 - beta2^(step + 1) */
    DDP_S_WEIGHT_DECAY,     /* f: the optimizer's weight decay for this step */
    DDP_S_COUNT
};

/* A size that may grow with the live batch: fixed + per_sample * live local batch. */
typedef struct ddp_dim {
    int64_t fixed;
    int64_t per_sample;
} ddp_dim;

typedef struct ddp_kernel {
    const char *name;       /* "k12_pointwise": for traces and errors */
    ddp_dim range;          /* the index range */
    int64_t flags;          /* DDP_KERNEL_* */
} ddp_kernel;

enum { DDP_KERNEL_SERIAL = 1 }; /* must run as one call (a reduction in a fixed order) */

/* ------------------------------------------------------------------ buffers */

enum ddp_dtype { DDP_F32, DDP_F64, DDP_I32, DDP_I64 };

/* Where a buffer's memory lives. The runtime allocates one region of each kind. */
enum ddp_region {
    DDP_REGION_PARAMS,  /* trainable parameters, one flat vector */
    DDP_REGION_GRADS,   /* their gradients, the same layout */
    DDP_REGION_STATE,   /* optimizer state: state_vectors flat vectors of params' size */
    DDP_REGION_STATS,   /* non-trainable values (batch normalisation running statistics) */
    DDP_REGION_ARENA,   /* activations and their gradients, placed by the memory plan */
    DDP_REGION_WORKSPACE, /* scratch (im2col columns, statistics), placed by the plan */
    DDP_REGION_INPUT,   /* the batch: inputs, labels, global sample indices */
    DDP_REGION_ACCUM,   /* loss and metric sums, f64 */
    DDP_REGION_COUNT
};

typedef struct ddp_buffer {
    const char *name;
    int64_t region;         /* ddp_region */
    int64_t offset;         /* bytes from the start of its region */
    int64_t bytes;          /* for a full batch */
    int64_t dtype;          /* ddp_dtype */
} ddp_buffer;

/* ---------------------------------------------------------------- schedule */

enum ddp_step_kind {
    DDP_STEP_KERNEL,        /* index: a kernel */
    DDP_STEP_GEMM,          /* index: a ddp_gemm */
    DDP_STEP_BUCKET_READY,  /* index: a gradient bucket is final; all-reduce may start */
    DDP_STEP_WAIT_BUCKETS,  /* every bucket's all-reduce must be done (before the optimizer) */
    DDP_STEP_METRICS_READY, /* the loss and metric sums of this batch are final */
};

typedef struct ddp_step {
    int64_t kind;           /* ddp_step_kind */
    int64_t index;
} ddp_step;

/* C = op(A) op(B) + beta C, row-major, on buffer slots; op is a transpose when t* is 1.
 * op(A) is m x k, op(B) is k x n. */
typedef struct ddp_gemm {
    int64_t a, b, c;
    int64_t transpose_a, transpose_b;
    ddp_dim m, n, k;
    double beta;
} ddp_gemm;

typedef struct ddp_phase {
    const ddp_step *steps;
    int64_t count;
} ddp_phase;

/* A range of the flat gradient vector, all-reduced as one message. */
typedef struct ddp_bucket {
    int64_t begin, end;     /* elements of the gradient vector */
} ddp_bucket;

/* ------------------------------------------------------- parameters, data */

enum ddp_init { DDP_INIT_ZEROS, DDP_INIT_ONES, DDP_INIT_GLOROT_UNIFORM, DDP_INIT_GLOROT_NORMAL,
                DDP_INIT_HE_NORMAL, DDP_INIT_HE_UNIFORM };

typedef struct ddp_param {
    const char *name;       /* "classifier.conv1.weight" */
    int64_t region;         /* DDP_REGION_PARAMS or DDP_REGION_STATS */
    int64_t offset;         /* elements into its flat vector */
    int64_t count;
    int64_t rank;
    int64_t shape[4];
    const char *layout;     /* "HWIO", "IO", "C" */
    int64_t init;           /* ddp_init */
    int64_t fan_in, fan_out;
} ddp_param;

/* ------------------------------------------------------ run-time scalars */

/* An expression over replicas, workers and global_batch as a stack program: each op
 * pushes or combines; the result is the one value left. */
enum ddp_rt_op { DDP_RT_CONST, DDP_RT_REPLICAS, DDP_RT_WORKERS, DDP_RT_GLOBAL_BATCH,
                 DDP_RT_ADD, DDP_RT_SUB, DDP_RT_MUL, DDP_RT_DIV, DDP_RT_NEG };

typedef struct ddp_rt_instr {
    int64_t op;             /* ddp_rt_op */
    double value;           /* DDP_RT_CONST */
} ddp_rt_instr;

typedef struct ddp_rt_expr {
    const ddp_rt_instr *code;
    int64_t count;
} ddp_rt_expr;

#endif
