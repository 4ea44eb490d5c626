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
 *   void kernel(void *const *args, const ddp_scalar *scalars, int64_t begin, int64_t end)
 *
 * args: the buffers of this launch, in the order its step lists them (a kernel serves
 * every step whose work differs only in the buffers, so one kernel may run on many);
 * scalars: the run-time scalar block (ddp_scalar_slot);
 * [begin, end): the part of the step's index range this call covers. The CPU runtime
 * splits a range among its threads; on the GPU each thread takes one index,
 * begin + blockIdx.x * blockDim.x + threadIdx.x, and returns when it reaches end.
 * A step's index range is range.fixed + range.per_sample * scalars[DDP_S_LOCAL_BATCH]. */
typedef union ddp_scalar {
    int64_t i;
    double f;
} ddp_scalar;

typedef void (*ddp_kernel_fn)(void *const *args, const ddp_scalar *scalars, int64_t begin,
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
    const char *name;       /* "ddp_k12_pointwise": its symbol, for the GPU, traces, errors */
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
    /* arena and workspace buffers: the steps that first and last use it, counted over
     * the training sequence (forward, backward, optimizer) or, for evaluation's own
     * buffers (sequence 2), over the evaluation phase; sequence 0 for other regions */
    int64_t sequence, first_step, last_step;
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
    int64_t index;          /* the kernel, GEMM or bucket */
    ddp_dim range;          /* DDP_STEP_KERNEL: the index range */
    const int64_t *args;    /* DDP_STEP_KERNEL: the kernel's buffers, as buffer slots */
    int64_t nargs;
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

/* --------------------------------------------------------- random draws */

/* Every random draw (dropout, shuffling, initialisation, synthetic data) is
 * Philox4x32-10 with
 *   key     = {seed & 0xffffffff, (seed >> 32) ^ stream}
 *   counter = {element, sample & 0xffffffff, sample >> 32, step}
 * where stream names the use (DDP_STREAM_DROPOUT + layer key, DDP_STREAM_SHUFFLE,
 * DDP_STREAM_INIT, DDP_STREAM_DATA). A draw depends on nothing else: not on the
 * worker, the thread or the device. The first output word w gives the uniform number
 * (w >> 8) * 2^-24 in [0, 1) (two words, 53 bits, for f64 initialisation). A synthetic
 * dataset's sample i draws once (element 0); its words 0 and 1 seed a SplitMix64
 * sequence over the sample's elements (runtime/data.c). */
enum { DDP_STREAM_DROPOUT = 1 << 16, DDP_STREAM_SHUFFLE = 2 << 16, DDP_STREAM_INIT = 3 << 16,
       DDP_STREAM_DATA = 4 << 16 };

/* ----------------------------------------------------------------- settings */

enum ddp_unit { DDP_UNIT_EPOCHS = 1, DDP_UNIT_STEPS = 2 };

typedef struct ddp_duration {
    int64_t value;
    int64_t unit;           /* ddp_unit; 0: not set */
} ddp_duration;

enum ddp_schedule_kind { DDP_SCHEDULE_CONSTANT, DDP_SCHEDULE_STEP, DDP_SCHEDULE_COSINE,
                         DDP_SCHEDULE_LINEAR };

/* The learning rate of step t: constant `rate`; step: rate * drop^(t / period);
 * cosine and linear: from 0 to rate over `warmup`, then down to `final` at the end. */
typedef struct ddp_schedule {
    int64_t kind;           /* ddp_schedule_kind */
    ddp_rt_expr rate;       /* lr or peak */
    ddp_rt_expr drop;       /* step */
    ddp_rt_expr final;      /* cosine, linear */
    ddp_duration period;    /* step: every; cosine, linear: warmup */
} ddp_schedule;

enum ddp_optimizer_kind { DDP_OPT_SGD, DDP_OPT_ADAM, DDP_OPT_ADAMW };

typedef struct ddp_optimizer {
    int64_t kind;           /* ddp_optimizer_kind */
    ddp_schedule learning_rate;
    ddp_rt_expr weight_decay;
    double momentum, beta1, beta2, epsilon;
    int64_t nesterov;
    int64_t state_vectors;
} ddp_optimizer;

enum ddp_loss_kind { DDP_LOSS_SPARSE_CATEGORICAL, DDP_LOSS_CATEGORICAL, DDP_LOSS_BINARY,
                     DDP_LOSS_MSE };
enum ddp_metric_kind { DDP_METRIC_LOSS, DDP_METRIC_ACCURACY, DDP_METRIC_TOP_K, DDP_METRIC_MAE };

typedef struct ddp_metric {
    const char *name;       /* "accuracy", "top_k_accuracy", ... */
    int64_t kind;           /* ddp_metric_kind */
    int64_t pair;           /* its (sum, count) in the accumulators */
} ddp_metric;

enum ddp_dataset_kind { DDP_DATA_IDX, DDP_DATA_CIFAR10, DDP_DATA_NPY, DDP_DATA_CSV,
                        DDP_DATA_SYNTHETIC };

typedef struct ddp_dataset {
    const char *name;       /* its definition's name, or "" */
    int64_t kind;           /* ddp_dataset_kind */
    const char *path[2];    /* idx: images, labels; npy: inputs, labels; cifar10: dir; csv */
    double scale;
    int64_t part;           /* cifar10: 0 train, 1 test */
    int64_t header;         /* csv */
    const char *const *features;
    int64_t nfeatures;
    const char *target;
    int64_t classes, samples;  /* synthetic */
} ddp_dataset;

enum ddp_cluster_kind { DDP_CLUSTER_AUTO, DDP_CLUSTER_SLURM, DDP_CLUSTER_ENV, DDP_CLUSTER_LOCAL };
enum ddp_comm_kind { DDP_COMM_AUTO, DDP_COMM_NCCL, DDP_COMM_RING };
enum ddp_precision { DDP_PRECISION_FP32, DDP_PRECISION_BF16, DDP_PRECISION_FP16 };

typedef struct ddp_settings {
    int64_t cluster;        /* ddp_cluster_kind */
    int64_t port_base;      /* -1: derived from the job within port_range */
    int64_t port_range[2];
    int64_t communication;  /* ddp_comm_kind */
    int64_t batch_per_replica, gpus_per_worker, seed, shuffle, drop_remainder;
    int64_t precision;      /* ddp_precision */
    int64_t epochs;
    int64_t steps_per_epoch;   /* -1: every full global batch */
    ddp_duration validate_every;
    const char *checkpoint_dir; /* NULL: none */
    ddp_duration checkpoint_every;
    int64_t checkpoint_keep;
    ddp_dataset train, validation; /* validation.kind -1: none */
    int64_t loss;           /* ddp_loss_kind */
    int64_t from_logits;
    double label_smoothing;
    const ddp_metric *metrics;
    int64_t nmetrics;
    ddp_optimizer optimizer;
} ddp_settings;

/* ------------------------------------------------------------------ program */

enum ddp_phase_kind { DDP_PHASE_FORWARD, DDP_PHASE_BACKWARD, DDP_PHASE_OPTIMIZER,
                      DDP_PHASE_EVAL, DDP_PHASE_COUNT };

typedef struct ddp_program {
    int64_t abi_version;    /* DDP_ABI_VERSION */
    uint64_t hash;          /* over the program and its settings: workers compare it */
    const char *name;       /* the model */
    const char *source;     /* the .ddp file it was built from */
    int64_t dtype;          /* ddp_dtype of parameters and activations */
    int64_t input_rank;
    int64_t input_shape[8]; /* per sample */
    int64_t output_elems;   /* per sample */
    int64_t label_dtype;    /* DDP_I32 class indices, else the output's dtype */
    int64_t param_count, stats_count;
    int64_t region_bytes[DDP_REGION_COUNT];
    const ddp_param *params;
    int64_t nparams;        /* trainable first, then statistics */
    const ddp_buffer *buffers;
    int64_t nbuffers;
    int64_t input_slot, label_slot, sample_id_slot, accum_slot;
    const ddp_kernel *kernels;
    int64_t nkernels;
    const ddp_kernel_fn *cpu_baseline; /* one per kernel: any x86-64 */
    const ddp_kernel_fn *cpu_wide;     /* one per kernel: AVX2 and FMA, if the CPU has them */
    const ddp_gemm *gemms;
    int64_t ngemms;
    ddp_phase phases[DDP_PHASE_COUNT];
    const ddp_bucket *buckets;
    int64_t nbuckets;
    int64_t accum_pairs;
    const char *ptx;        /* every kernel for the GPU, one module; NULL if not built */
    ddp_settings settings;
} ddp_program;

/* The symbol a built program defines. */
extern const ddp_program ddp_program_desc;

#endif
