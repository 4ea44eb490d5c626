/* ddp_abi.h: the contract between ddpc and the runtime, version 1.
 *
 * `ddpc build` emits one object file holding the generated kernels and a ddp_program
 * describing everything the runtime needs to train the model without knowing it: the
 * kernels and their index ranges, the buffer table, the schedule of every phase
 * (kernel and library calls, gradient-bucket markers, collectives), the parameter
 * table, the run-time scalar expressions, the settings, and a hash over them. The
 * runtime walks the schedule; it never interprets the model.
 *
 * Each structure's fields are declared once, in a list (DDP_FIELDS_<type>), from which
 * the C definition below, the static assertions after it, and the compiler's emitter
 * (compiler/contract.c, program.c) are all made: the compiler fills a C instance of
 * ddp_program and emits it field by field as the list says, so the two sides cannot
 * disagree on an order (tests/contract/swap.sh swaps two fields and trains). Every
 * field is 8 bytes wide (int64_t, double, a pointer, or arrays and structures of
 * those), so there is no padding to agree on either; the assertions hold it.
 *
 * A list entry is X##_KIND(T, ...), the consumer defining X##_KIND for each kind:
 *   I64(T, name)  U64(T, name)  F64(T, name)  STR(T, name)     one value
 *   I64S(T, name, n)  STRS(T, name, n)                          a fixed array
 *   SUB(T, type, name)  SUBS(T, type, name, n)                  structures inside
 *   REFS(T, type, name, count)                                  -> count structures
 *   I64REFS(T, name, count)  STRREFS(T, name, count)            -> count values
 *   FNS(T, name, wide)                                          -> kernel functions
 * where count names the field holding the element count. A change to anything here
 * changes DDP_ABI_VERSION; the runtime refuses a program built for another version. */
#ifndef DDP_ABI_H
#define DDP_ABI_H

#include <stddef.h>
#include <stdint.h>

#define DDP_ABI_VERSION 24

/* The C definition of a listed structure. */
#define DDP_DECL_I64(T, name) int64_t name;
#define DDP_DECL_U64(T, name) uint64_t name;
#define DDP_DECL_F64(T, name) double name;
#define DDP_DECL_STR(T, name) const char *name;
#define DDP_DECL_I64S(T, name, n) int64_t name[n];
#define DDP_DECL_STRS(T, name, n) const char *name[n];
#define DDP_DECL_SUB(T, type, name) type name;
#define DDP_DECL_SUBS(T, type, name, n) type name[n];
#define DDP_DECL_REFS(T, type, name, count) const type *name;
#define DDP_DECL_I64REFS(T, name, count) const int64_t *name;
#define DDP_DECL_STRREFS(T, name, count) const char *const *name;
#define DDP_DECL_FNS(T, name, wide) const ddp_kernel_fn *name;
#define DDP_DEFINE(T) typedef struct T { DDP_FIELDS_##T(DDP_DECL, T) } T;

/* The assertions: each field 8-byte aligned, and the fields' sizes adding up to the
 * structure's (no padding anywhere). */
#define DDP_SIZE_I64(T, name) +sizeof(((T *)0)->name)
#define DDP_SIZE_U64 DDP_SIZE_I64
#define DDP_SIZE_F64 DDP_SIZE_I64
#define DDP_SIZE_STR DDP_SIZE_I64
#define DDP_SIZE_I64S(T, name, n) DDP_SIZE_I64(T, name)
#define DDP_SIZE_STRS DDP_SIZE_I64S
#define DDP_SIZE_SUB(T, type, name) DDP_SIZE_I64(T, name)
#define DDP_SIZE_SUBS(T, type, name, n) DDP_SIZE_I64(T, name)
#define DDP_SIZE_REFS(T, type, name, count) DDP_SIZE_I64(T, name)
#define DDP_SIZE_I64REFS(T, name, count) DDP_SIZE_I64(T, name)
#define DDP_SIZE_STRREFS DDP_SIZE_I64REFS
#define DDP_SIZE_FNS(T, name, wide) DDP_SIZE_I64(T, name)
#define DDP_ALIGNED_I64(T, name) _Static_assert(offsetof(T, name) % 8 == 0 && sizeof(((T *)0)->name) % 8 == 0, \
                                                #T "." #name " is not 8-byte aligned and sized");
#define DDP_ALIGNED_U64 DDP_ALIGNED_I64
#define DDP_ALIGNED_F64 DDP_ALIGNED_I64
#define DDP_ALIGNED_STR DDP_ALIGNED_I64
#define DDP_ALIGNED_I64S(T, name, n) DDP_ALIGNED_I64(T, name)
#define DDP_ALIGNED_STRS DDP_ALIGNED_I64S
#define DDP_ALIGNED_SUB(T, type, name) DDP_ALIGNED_I64(T, name)
#define DDP_ALIGNED_SUBS(T, type, name, n) DDP_ALIGNED_I64(T, name)
#define DDP_ALIGNED_REFS(T, type, name, count) DDP_ALIGNED_I64(T, name)
#define DDP_ALIGNED_I64REFS(T, name, count) DDP_ALIGNED_I64(T, name)
#define DDP_ALIGNED_STRREFS DDP_ALIGNED_I64REFS
#define DDP_ALIGNED_FNS(T, name, wide) DDP_ALIGNED_I64(T, name)
#define DDP_CHECK(T)                                                                                         \
    DDP_FIELDS_##T(DDP_ALIGNED, T)                                                                           \
    _Static_assert(sizeof(T) == 0 DDP_FIELDS_##T(DDP_SIZE, T), #T " has padding: every field is 8 bytes");
#define DDP_CONTRACT(T) DDP_DEFINE(T) DDP_CHECK(T)

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
    DDP_S_ACCUMULATED,      /* i: accumulate_batches: the step's batches before this one */
    DDP_S_SEED,             /* i: the program's seed */
    DDP_S_LEARNING_RATE,    /* f: the rate for this step, schedule and scalars applied */
    DDP_S_BIAS_CORRECTION1, /* f: adam: 1 - beta1^(step + 1) */
    DDP_S_BIAS_CORRECTION2, /* f: adam: 1 - beta2^(step + 1) */
    DDP_S_WEIGHT_DECAY,     /* f: the optimizer's weight decay for this step */
    DDP_S_EMA_DECAY,        /* f: ema: the average's decay for this step (warmed up or not) */
    DDP_S_EMA_REST,         /* f: ema: 1 - that, in double */
    DDP_S_BIAS_WEIGHT_DECAY, /* f: the weight decay of dense and convolution biases */
    DDP_S_NORM_WEIGHT_DECAY, /* f: the weight decay of normalisation layers' parameters */
    DDP_S_COUNT
};

/* A size that may grow with the live batch: fixed + per_sample * live local batch. */
#define DDP_FIELDS_ddp_dim(X, T)                                                                             \
    X##_I64(T, fixed)                                                                                        \
    X##_I64(T, per_sample)
DDP_CONTRACT(ddp_dim)

/* A kernel and its launch on a GPU. DDP_LAUNCH_INDEX: blocks of `threads`, each thread
 * taking the indices of the step's range from its place in the grid on, every T-th (T
 * the grid's threads); the grid has a block per `threads` indices, up to
 * DDP_INDEX_GRID_THREADS threads, and then more blocks until T is a multiple of
 * `period`: a thread's indices then share their remainder by it (their channel), and
 * what follows the channel alone it computes once. DDP_LAUNCH_BLOCK: one block of
 * `threads` per index, which its threads share (a tree reduction over shared memory
 * with barriers), `shared_bytes` of shared memory each; the grid is the range's
 * length. Either way the grid follows the problem and never the GPU. On the CPU each
 * index is one iteration of a loop. */
enum ddp_launch { DDP_LAUNCH_INDEX, DDP_LAUNCH_BLOCK };
enum { DDP_INDEX_GRID_THREADS = 1 << 19 };

/* The greatest common divisor, for periods: the compiler's least common multiple of a
 * kernel's channel counts, the runtime's blocks that make whole periods. */
static inline int64_t ddp_gcd(int64_t a, int64_t b) {
    while (b) {
        int64_t r = a % b;
        a = b, b = r;
    }
    return a;
}

#define DDP_FIELDS_ddp_kernel(X, T)                                                                          \
    X##_STR(T, name)        /* "ddp_k12_pointwise": its symbol, for the GPU, traces, errors */              \
    X##_I64(T, flags)       /* DDP_KERNEL_* */                                                               \
    X##_I64(T, launch)      /* ddp_launch */                                                                 \
    X##_I64(T, threads)     /* a block's threads: a power of two up to 1024 */                               \
    X##_I64(T, shared_bytes) /* a block's shared memory, 48 KB at most */                                  \
    X##_I64(T, per_thread)  /* DDP_LAUNCH_BLOCK: the rows a thread adds at the full batch */                 \
    X##_I64(T, period)      /* DDP_LAUNCH_INDEX: what the grid's threads are a multiple of */
DDP_CONTRACT(ddp_kernel)

enum { DDP_KERNEL_SERIAL = 1 }; /* must run as one call (a reduction in a fixed order) */

/* ------------------------------------------------------------------ buffers */

/* DDP_BF16: bfloat16 (the top half of an f32), for activations under precision = bf16;
 * DDP_U8: small codes (the parameters' weight-decay groups). */
enum ddp_dtype { DDP_F32, DDP_F64, DDP_I32, DDP_I64, DDP_BF16, DDP_U8 };

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
    DDP_REGION_CONSTANTS, /* what the runtime derives from the program at start and never changes:
                           * each parameter element's ddp_decay_group (u8), where the groups' decays differ;
                           * with lars or lamb, each element's parameter (i32) and each parameter's span (below) */
    DDP_REGION_COUNT
};

/* The CONSTANTS region's parts, in bytes from its start, for a program of param_count
 * parameter elements in `params` parameters (the flat vector's, in its order): the decay
 * groups (param_count bytes, where the optimizer has them), then under lars and lamb each
 * element's parameter number (i32) and each parameter's first element and element count
 * (i64 pairs), each part 8-byte aligned. */
static inline int64_t ddp_parameter_numbers_at(int64_t param_count, int64_t decay_groups) {
    return decay_groups ? (param_count + 7) / 8 * 8 : 0;
}
static inline int64_t ddp_parameter_spans_at(int64_t param_count, int64_t decay_groups) {
    return ddp_parameter_numbers_at(param_count, decay_groups) + (4 * param_count + 7) / 8 * 8;
}
static inline int64_t ddp_constants_bytes(int64_t param_count, int64_t params, int64_t decay_groups, int64_t lars) {
    return lars ? ddp_parameter_spans_at(param_count, decay_groups) + 16 * params : decay_groups ? param_count : 0;
}

/* Arena and workspace buffers carry the steps that first and last use them, counted
 * over the training sequence (forward, backward, optimizer) or, for evaluation's own
 * buffers (sequence 2), over the evaluation phase; sequence 0 for other regions. */
#define DDP_FIELDS_ddp_buffer(X, T)                                                                          \
    X##_STR(T, name)                                                                                         \
    X##_I64(T, region)      /* ddp_region */                                                                 \
    X##_I64(T, offset)      /* bytes from the start of its region */                                         \
    X##_I64(T, bytes)       /* for a full batch */                                                           \
    X##_I64(T, dtype)       /* ddp_dtype */                                                                  \
    X##_I64(T, sequence)                                                                                     \
    X##_I64(T, first_step)                                                                                   \
    X##_I64(T, last_step)
DDP_CONTRACT(ddp_buffer)

/* ---------------------------------------------------------------- schedule */

enum ddp_step_kind {
    DDP_STEP_KERNEL,        /* index: a kernel */
    DDP_STEP_GEMM,          /* index: a ddp_gemm */
    DDP_STEP_BUCKET_READY,  /* index: a gradient bucket is final; all-reduce may start */
    DDP_STEP_WAIT_BUCKETS,  /* every bucket's all-reduce must be done (before the optimizer) */
    DDP_STEP_METRICS_READY, /* the loss and metric sums of this batch are final */
    DDP_STEP_CONV,          /* index: a ddp_conv, through a convolution library */
};

/* A convolution is in the schedule twice: as generated steps (im2col, products,
 * col2im) and as library steps (the filters turned KRSC, the library's convolution,
 * the filters' gradient turned back); an executor runs the steps of one path and of
 * DDP_PATH_ALL, skipping the other's. Both write the same values. */
enum ddp_path { DDP_PATH_ALL, DDP_PATH_GENERATED, DDP_PATH_LIBRARY };

#define DDP_FIELDS_ddp_step(X, T)                                                                            \
    X##_I64(T, kind)                /* ddp_step_kind */                                                      \
    X##_I64(T, index)               /* the kernel, GEMM or bucket */                                         \
    X##_SUB(T, ddp_dim, range)      /* DDP_STEP_KERNEL: the index range */                                   \
    X##_I64REFS(T, args, nargs)     /* DDP_STEP_KERNEL: the kernel's buffers, as buffer slots */             \
    X##_I64(T, nargs)                                                                                        \
    X##_STR(T, layer)               /* the layer it works for ("block1.conv1"); "" for none (optimizer) */ \
    X##_I64(T, path)                /* ddp_path */
DDP_CONTRACT(ddp_step)

/* C = alpha op(A) op(B) + beta C, row-major, on buffer slots; op is a transpose when t*
 * is 1. op(A) is m x k, op(B) is k x n. A leading dimension of 0 is the packed one (op(A)
 * stored m x k: k). Batched: batches x groups products, product (i, j) on each operand
 * from element i * batch_stride + j * group_stride (attention: a batch per sample, a
 * group per head, the heads side by side in a row). With one_hot, A is an embedding's
 * one-hot rows (row r: 1 in the column equal to element r of that buffer, else 0), so
 * that an executor may gather B's rows (or, A transposed, add them up by index)
 * instead of multiplying. */
#define DDP_FIELDS_ddp_gemm(X, T)                                                                            \
    X##_I64(T, a)                                                                                            \
    X##_I64(T, b)                                                                                            \
    X##_I64(T, c)                                                                                            \
    X##_I64(T, transpose_a)                                                                                  \
    X##_I64(T, transpose_b)                                                                                  \
    X##_SUB(T, ddp_dim, m)                                                                                   \
    X##_SUB(T, ddp_dim, n)                                                                                   \
    X##_SUB(T, ddp_dim, k)                                                                                   \
    X##_F64(T, alpha)                                                                                        \
    X##_F64(T, beta)                                                                                         \
    X##_I64S(T, ld, 3)              /* a, b, c; 0: packed */                                                 \
    X##_SUB(T, ddp_dim, batches)                                                                             \
    X##_I64(T, groups)                                                                                       \
    X##_I64S(T, batch_stride, 3)                                                                             \
    X##_I64S(T, group_stride, 3)                                                                             \
    X##_I64(T, one_hot)             /* 0, or 1 + the buffer slot of A's one-hot rows' indices */
DDP_CONTRACT(ddp_gemm)

/* A convolution as a library runs it, channels last (NHWC images, KRSC filters), cross-
 * correlation with zero padding. The mode says which tensor is written from the other
 * two: forward y from x and the filters; backward data x's gradient (slot x) from y's
 * (slot y) and the filters; backward filter the filters' gradient from x and y's. The
 * written one is result + beta * itself. */
enum ddp_conv_mode { DDP_CONV_FORWARD, DDP_CONV_BACKWARD_DATA, DDP_CONV_BACKWARD_FILTER };

#define DDP_FIELDS_ddp_conv(X, T)                                                                            \
    X##_I64(T, mode)        /* ddp_conv_mode */                                                              \
    X##_I64(T, x)           /* buffer slots */                                                               \
    X##_I64(T, filters)                                                                                      \
    X##_I64(T, y)                                                                                            \
    X##_I64(T, workspace)                                                                                    \
    X##_SUB(T, ddp_dim, n)  /* images: the live batch */                                                     \
    X##_I64S(T, image, 3)   /* h, w, c */                                                                    \
    X##_I64S(T, filter, 3)  /* k, r, s */                                                                    \
    X##_I64S(T, output, 2)  /* oh, ow */                                                                     \
    X##_I64S(T, stride, 2)                                                                                   \
    X##_I64S(T, dilation, 2)                                                                                 \
    X##_I64S(T, pad_before, 2) /* top, left */                                                               \
    X##_I64S(T, pad_after, 2)  /* bottom, right */                                                           \
    X##_F64(T, beta)
DDP_CONTRACT(ddp_conv)

#define DDP_FIELDS_ddp_phase(X, T)                                                                           \
    X##_REFS(T, ddp_step, steps, count)                                                                      \
    X##_I64(T, count)
DDP_CONTRACT(ddp_phase)

/* A range of the flat gradient vector, all-reduced as one message. */
#define DDP_FIELDS_ddp_bucket(X, T)                                                                          \
    X##_I64(T, begin)       /* elements of the gradient vector */                                            \
    X##_I64(T, end)
DDP_CONTRACT(ddp_bucket)

/* ------------------------------------------------------- parameters, data */

enum ddp_init { DDP_INIT_GLOROT_UNIFORM, DDP_INIT_GLOROT_NORMAL, DDP_INIT_HE_NORMAL, DDP_INIT_HE_UNIFORM,
                DDP_INIT_ZEROS, DDP_INIT_ONES };

/* Which of the optimizer's weight decays a parameter takes: weight_decay (kernels),
 * bias_weight_decay (dense and convolution biases) or norm_weight_decay (both
 * parameters of a normalisation layer). */
enum ddp_decay_group { DDP_DECAY_WEIGHTS, DDP_DECAY_BIASES, DDP_DECAY_NORMS };

#define DDP_FIELDS_ddp_param(X, T)                                                                           \
    X##_STR(T, name)        /* "classifier.conv1.weight" */                                                  \
    X##_I64(T, region)      /* DDP_REGION_PARAMS or DDP_REGION_STATS */                                      \
    X##_I64(T, offset)      /* elements into its flat vector */                                              \
    X##_I64(T, count)                                                                                        \
    X##_I64(T, rank)                                                                                         \
    X##_I64S(T, shape, 4)                                                                                    \
    X##_STR(T, layout)      /* "HWIO", "IO", "C" */                                                          \
    X##_I64(T, init)        /* ddp_init */                                                                   \
    X##_I64(T, fan_in)                                                                                       \
    X##_I64(T, fan_out)                                                                                      \
    X##_I64(T, decay)       /* ddp_decay_group; 0 for statistics */
DDP_CONTRACT(ddp_param)

/* ------------------------------------------------------ run-time scalars */

/* An expression over replicas, workers and global_batch as a stack program: each op
 * pushes or combines; the result is the one value left. */
enum ddp_rt_op { DDP_RT_CONST, DDP_RT_REPLICAS, DDP_RT_WORKERS, DDP_RT_GLOBAL_BATCH,
                 DDP_RT_ADD, DDP_RT_SUB, DDP_RT_MUL, DDP_RT_DIV, DDP_RT_NEG };

#define DDP_FIELDS_ddp_rt_instr(X, T)                                                                        \
    X##_I64(T, op)          /* ddp_rt_op */                                                                  \
    X##_F64(T, value)       /* DDP_RT_CONST */
DDP_CONTRACT(ddp_rt_instr)

#define DDP_FIELDS_ddp_rt_expr(X, T)                                                                         \
    X##_REFS(T, ddp_rt_instr, code, count)                                                                   \
    X##_I64(T, count)
DDP_CONTRACT(ddp_rt_expr)

/* --------------------------------------------------------- random draws */

/* Every random draw (dropout, shuffling, initialisation, synthetic data,
 * augmentation) is Philox4x32-10 with
 *   key     = {seed & 0xffffffff, (seed >> 32) ^ stream}
 *   counter = {element, sample & 0xffffffff, sample >> 32, step}
 * where stream names the use (DDP_STREAM_DROPOUT + layer key, DDP_STREAM_SHUFFLE,
 * DDP_STREAM_INIT, DDP_STREAM_DATA, DDP_STREAM_AUGMENT + the augmentation's place in its
 * list). A draw depends on nothing else: not on the worker, the thread or the device.
 * The first output word w gives the uniform number (w >> 8) * 2^-24 in [0, 1) (two
 * words, 53 bits, for f64 initialisation). A dropout mask draws once for every four
 * elements of a sample: the draw of element g keeps the sample's element 4g + k where
 * its word k is at least the rate times 2^32, rounded. A synthetic dataset's
 * sample i draws once (element 0); its words 0 and 1 seed a SplitMix64 sequence over the
 * sample's elements (runtime/data.c). An augmentation draws once per sample and epoch
 * (element 0, step the epoch from 0, as shuffling's; a resized crop's tries elements 0
 * to 9, its place element 10), so the samples of an epoch change alike however the job
 * is cut into workers, and a resumed run changes them as the uninterrupted one. With
 * augment_repeats, copy c of sample s draws (augmentations, dropout) as sample s + c n
 * of a dataset of n would.
 */
enum { DDP_STREAM_DROPOUT = 1 << 16, DDP_STREAM_SHUFFLE = 2 << 16, DDP_STREAM_INIT = 3 << 16,
       DDP_STREAM_DATA = 4 << 16, DDP_STREAM_AUGMENT = 5 << 16 };

/* ----------------------------------------------------------------- settings */

enum ddp_unit { DDP_UNIT_EPOCHS = 1, DDP_UNIT_STEPS = 2 };

#define DDP_FIELDS_ddp_duration(X, T)                                                                        \
    X##_I64(T, value)                                                                                        \
    X##_I64(T, unit)        /* ddp_unit; 0: not set */
DDP_CONTRACT(ddp_duration)

enum ddp_schedule_kind { DDP_SCHEDULE_CONSTANT, DDP_SCHEDULE_STEP, DDP_SCHEDULE_COSINE,
                         DDP_SCHEDULE_LINEAR, DDP_SCHEDULE_MULTISTEP };

/* The learning rate of step t: constant `rate`; else, over `warmup`, from 0 up to rate
 * (rate * (t + 1) / warmup), then: step, rate * drop^(t / period); multistep, rate *
 * drop^(the milestones at or before t); cosine and linear, down to `final` at the end. */
#define DDP_FIELDS_ddp_schedule(X, T)                                                                        \
    X##_I64(T, kind)                    /* ddp_schedule_kind */                                              \
    X##_SUB(T, ddp_rt_expr, rate)       /* lr or peak */                                                     \
    X##_SUB(T, ddp_rt_expr, drop)       /* step, multistep */                                                \
    X##_SUB(T, ddp_rt_expr, final)      /* cosine, linear */                                                 \
    X##_SUB(T, ddp_duration, period)    /* step: every */                                                    \
    X##_SUB(T, ddp_duration, warmup)                                                                         \
    X##_I64REFS(T, milestones, nmilestones) /* multistep: ascending, in milestone_unit (ddp_unit) */         \
    X##_I64(T, nmilestones)                                                                                  \
    X##_I64(T, milestone_unit)
DDP_CONTRACT(ddp_schedule)

enum ddp_optimizer_kind { DDP_OPT_SGD, DDP_OPT_ADAM, DDP_OPT_ADAMW, DDP_OPT_LARS, DDP_OPT_LAMB };

#define DDP_FIELDS_ddp_optimizer(X, T)                                                                       \
    X##_I64(T, kind)        /* ddp_optimizer_kind */                                                         \
    X##_SUB(T, ddp_schedule, learning_rate)                                                                  \
    X##_SUB(T, ddp_rt_expr, weight_decay)                                                                    \
    X##_SUB(T, ddp_rt_expr, bias_weight_decay) /* weight_decay's expression where not set */               \
    X##_SUB(T, ddp_rt_expr, norm_weight_decay)                                                               \
    X##_I64(T, decay_groups)  /* 1: either set, the optimizer reading each element's group (the constants) */ \
    X##_F64(T, momentum)                                                                                     \
    X##_F64(T, beta1)                                                                                        \
    X##_F64(T, beta2)                                                                                        \
    X##_F64(T, epsilon)                                                                                      \
    X##_F64(T, trust_coefficient) /* lars: a parameter's step scaled by this x its norm / its gradient's */     \
    X##_I64(T, nesterov)                                                                                     \
    X##_F64(T, clip_norm)     /* the gradients' largest global L2 norm, scaled down to it past it; 0: none */ \
    X##_F64(T, ema)           /* the parameters' moving average's decay, its vector the last state; 0: none */ \
    X##_I64(T, ema_warmup)    /* the decay of update n at most (1 + n) / (10 + n) */                          \
    X##_I64(T, state_vectors) /* flat vectors of optimizer state: sgd 0 or 1 (momentum), adam 2; +1 with ema */
DDP_CONTRACT(ddp_optimizer)

enum ddp_loss_kind { DDP_LOSS_SPARSE_CATEGORICAL, DDP_LOSS_CATEGORICAL, DDP_LOSS_BINARY,
                     DDP_LOSS_MSE };
enum ddp_metric_kind { DDP_METRIC_LOSS, DDP_METRIC_ACCURACY, DDP_METRIC_TOP_K, DDP_METRIC_MAE };

#define DDP_FIELDS_ddp_metric(X, T)                                                                          \
    X##_STR(T, name)        /* "accuracy", "top_k_accuracy", ... */                                          \
    X##_I64(T, kind)        /* ddp_metric_kind */                                                            \
    X##_I64(T, k)           /* top_k_accuracy: k */                                                          \
    X##_I64(T, pair)        /* its (sum, count) in the accumulators */
DDP_CONTRACT(ddp_metric)

/* A random change of a training sample as its batch is assembled (the dataset's
 * `augment` list, applied in order to samples [h, w] or [h, w, c]): a flip with
 * probability 1/2 along each axis its mode names; a crop at a uniform place in the
 * sample padded with `padding` zeros on every side, of the sample's size or, where
 * height and width are not 0 (the list's first, then), of that window, which
 * validation cuts at the centre; a cutout, a size x size square (clipped at the
 * edges) centred on a uniform pixel, set to the padding's value; or a resized crop
 * (the list's first), a window of a uniform fraction in [scale_min, scale_max] of the
 * sample's area and an aspect ratio log-uniform in [ratio_min, ratio_max] at a uniform
 * place, resized to height x width (runtime/data.c says how it is drawn), whose
 * validation is the centre height x width. Last in the list, a mixup or a cutmix
 * mixes the sample, as the others made it, with another drawn at random from the
 * dataset, in a share drawn from Beta(alpha, alpha): every value (mixup) or a box of
 * the other's pixels (cutmix, the share then the box's area), and the labels as rows
 * in the same shares; with both, each sample takes one of them. A colour change
 * (torchvision's ColorJitter) scales the brightness, contrast and saturation by factors
 * uniform in [max(0, 1 - x), 1 + x] and turns the hue by a shift uniform in [-hue,
 * hue], those whose x is not 0, in a random order (runtime/data.c). With a
 * probability: a grey image (each RGB pixel its grey), or an erased box, of a
 * share of the area uniform in [scale_min, scale_max] and an aspect ratio
 * log-uniform in [ratio_min, ratio_max] at a uniform place (torchvision's
 * RandomErasing), set to the normalised zero or to standard normal draws (mode). A
 * trivial augmentation (torchvision's TrivialAugmentWide): one of fourteen operations
 * on the image as bytes, at one of `size` magnitudes (runtime/auto_augment.c), its
 * geometry resampled as mode says; a rand augmentation (RandAugment) `ops` of them at
 * magnitude `strength` of `size`; an auto augmentation (AutoAugment) one of the 25
 * pairs of its `policy`, each step with its probability. */
enum ddp_augment_kind { DDP_AUGMENT_FLIP, DDP_AUGMENT_CROP, DDP_AUGMENT_CUTOUT, DDP_AUGMENT_RESIZED_CROP,
                        DDP_AUGMENT_MIXUP, DDP_AUGMENT_CUTMIX, DDP_AUGMENT_COLOR, DDP_AUGMENT_GRAYSCALE,
                        DDP_AUGMENT_ERASING, DDP_AUGMENT_TRIVIAL, DDP_AUGMENT_RAND, DDP_AUGMENT_AUTO };
enum ddp_flip_mode { DDP_FLIP_HORIZONTAL, DDP_FLIP_VERTICAL, DDP_FLIP_BOTH };
enum ddp_erase_value { DDP_ERASE_ZERO, DDP_ERASE_RANDOM };
enum ddp_interpolation { DDP_INTERPOLATION_NEAREST, DDP_INTERPOLATION_BILINEAR };
enum { DDP_MOST_IMAGE_OPS = 16 }; /* a rand augmentation's `ops` at most */
enum ddp_auto_policy { DDP_POLICY_IMAGENET, DDP_POLICY_CIFAR10, DDP_POLICY_SVHN };

#define DDP_FIELDS_ddp_augment(X, T)                                                                         \
    X##_I64(T, kind)        /* ddp_augment_kind */                                                           \
    X##_I64(T, mode)        /* ddp_flip_mode, ddp_erase_value or (trivial, rand) ddp_interpolation */        \
    X##_I64(T, padding)     /* crop */                                                                       \
    X##_I64(T, size)        /* cutout: the square's side; trivial, rand: the magnitudes' bins */             \
    X##_I64(T, ops)         /* rand: operations a sample */                                                  \
    X##_I64(T, strength)    /* rand: the magnitude's bin */                                                  \
    X##_I64(T, policy)      /* auto: ddp_auto_policy */                                                      \
    X##_I64(T, height)      /* crop to a window, resized crop: its height and width; 0: the sample's size */ \
    X##_I64(T, width)                                                                                        \
    X##_F64(T, scale_min)   /* resized crop, erasing: the window's share of the area ... */                  \
    X##_F64(T, scale_max)                                                                                    \
    X##_F64(T, ratio_min)   /* ... and its width / height */                                                 \
    X##_F64(T, ratio_max)                                                                                    \
    X##_F64(T, alpha)       /* mixup, cutmix: the Beta distribution's parameter */                           \
    X##_F64(T, brightness)  /* colour: the factors' spread, and the hue's */                                 \
    X##_F64(T, contrast)                                                                                     \
    X##_F64(T, saturation)                                                                                   \
    X##_F64(T, hue)                                                                                          \
    X##_F64(T, probability) /* grayscale, erasing: each sample's chance */
DDP_CONTRACT(ddp_augment)

/* A dataset's normalisation of one value of its samples' last axis (an image's
 * channel, a table's feature): (x - mean) / std, after scale and before any
 * augmentation, whose padding is then the normalised zero. */
#define DDP_FIELDS_ddp_channel(X, T)                                                                         \
    X##_F64(T, mean)                                                                                         \
    X##_F64(T, std)
DDP_CONTRACT(ddp_channel)

enum ddp_dataset_kind { DDP_DATA_IDX, DDP_DATA_CIFAR10, DDP_DATA_NPY, DDP_DATA_CSV, DDP_DATA_TOKENS,
                        DDP_DATA_SYNTHETIC };

#define DDP_FIELDS_ddp_dataset(X, T)                                                                         \
    X##_STR(T, name)        /* its definition's name, or "" */                                               \
    X##_I64(T, kind)        /* ddp_dataset_kind; -1: none */                                                 \
    X##_STRS(T, path, 2)    /* idx: images, labels; npy: inputs, labels; cifar10: dir; csv; token_file */        \
    X##_F64(T, scale)                                                                                        \
    X##_I64(T, part)        /* cifar10: 0 train, 1 test */                                                   \
    X##_I64(T, header)      /* csv */                                                                        \
    X##_STRREFS(T, features, nfeatures)                                                                      \
    X##_I64(T, nfeatures)                                                                                    \
    X##_STR(T, target)                                                                                       \
    X##_I64(T, classes)     /* synthetic */                                                                  \
    X##_I64(T, window)      /* token_file: the tokens of a sample */                                             \
    X##_I64(T, token_bytes) /* token_file: 1, 2 or 4, each an unsigned little-endian integer */                \
    X##_I64(T, samples)                                                                                      \
    X##_REFS(T, ddp_augment, augment, naugment) /* applied when trained on, never in validation */         \
    X##_I64(T, naugment)                                                                                     \
    X##_REFS(T, ddp_channel, normalize, nnormalize) /* none, one for every value, or one per last-axis value */ \
    X##_I64(T, nnormalize)
DDP_CONTRACT(ddp_dataset)

enum ddp_cluster_kind { DDP_CLUSTER_AUTO, DDP_CLUSTER_SLURM, DDP_CLUSTER_ENV, DDP_CLUSTER_LOCAL };
enum ddp_comm_kind { DDP_COMM_AUTO, DDP_COMM_NCCL, DDP_COMM_RING };
/* TF32: f32 values, whose products on a GPU's tensor cores read each factor rounded to
 * 10 bits of mantissa (what PyTorch calls allow_tf32); the CPU has no such unit. */
enum ddp_precision { DDP_PRECISION_FP32, DDP_PRECISION_BF16, DDP_PRECISION_FP16, DDP_PRECISION_TF32 };
/* The gradients' type in the all-reduce. BF16: the schedule rounds each bucket into a
 * bf16 copy that the GRADS region holds after the f32 gradients (2 bytes each, at
 * 4 * param_count + 2 * element), which the all-reduce sums (each addition rounded to
 * bf16, as NCCL's), and widens the sums back into the gradients after the wait. */
enum ddp_allreduce_precision { DDP_ALLREDUCE_FP32, DDP_ALLREDUCE_BF16 };

/* The program's configuration, every default filled in: the compiler's stages after
 * the checker read this very structure (compiler/config.c fills it), and the runtime
 * the copy emitted into the program. */
#define DDP_FIELDS_ddp_settings(X, T)                                                                        \
    X##_I64(T, cluster)             /* ddp_cluster_kind */                                                   \
    X##_I64(T, port_base)           /* -1: derived from the job within port_range */                         \
    X##_I64S(T, port_range, 2)                                                                               \
    X##_I64(T, communication)       /* ddp_comm_kind */                                                      \
    X##_I64(T, batch_per_replica)                                                                            \
    X##_I64(T, gpus_per_worker)                                                                              \
    X##_I64(T, seed)                                                                                         \
    X##_I64(T, shuffle)                                                                                      \
    X##_I64(T, augment_repeats)     /* each drawn sample this many times in a row (copy c of sample s: s + c n) */ \
    X##_I64(T, drop_remainder)                                                                               \
    X##_I64(T, accumulate_batches)  /* batches whose gradients each optimizer step sums */                   \
    X##_I64(T, precision)           /* ddp_precision */                                                      \
    X##_I64(T, allreduce_precision) /* ddp_allreduce_precision */                                            \
    X##_I64(T, epochs)                                                                                       \
    X##_I64(T, steps_per_epoch)     /* -1: every full global batch */                                        \
    X##_SUB(T, ddp_duration, validate_every)                                                                 \
    X##_STR(T, checkpoint_dir)      /* NULL: none */                                                         \
    X##_SUB(T, ddp_duration, checkpoint_every)                                                               \
    X##_I64(T, checkpoint_keep)                                                                              \
    X##_I64(T, save_best)           /* the validation figure whose best parameters are kept: -1 none, 0 the  \
                                       loss, 1 + i metrics[i] */                                             \
    X##_I64(T, early_stopping)      /* the validation figure that ends training once it stops improving, as \
                                       save_best */                                                          \
    X##_I64(T, early_stopping_patience) /* validations in a row without improvement */                       \
    X##_F64(T, early_stopping_min_delta) /* what an improvement must exceed */                               \
    X##_I64(T, reduce_lr)           /* the validation figure whose plateaus lower the rate, as save_best */   \
    X##_F64(T, reduce_lr_factor)    /* each lowering: the rate times factor ... */                           \
    X##_I64(T, reduce_lr_patience)  /* ... after that many validations in a row without improvement ... */    \
    X##_F64(T, reduce_lr_min_delta) /* ... by more than min_delta, */                                         \
    X##_F64(T, reduce_lr_min)       /* down to min_lr at most */                                              \
    X##_SUB(T, ddp_dataset, train)                                                                           \
    X##_SUB(T, ddp_dataset, validation) /* kind -1: none */                                                  \
    X##_I64(T, loss)                /* ddp_loss_kind */                                                      \
    X##_I64(T, from_logits)                                                                                  \
    X##_F64(T, label_smoothing)                                                                              \
    X##_REFS(T, ddp_metric, metrics, nmetrics)                                                               \
    X##_I64(T, nmetrics)                                                                                     \
    X##_SUB(T, ddp_optimizer, optimizer)
DDP_CONTRACT(ddp_settings)

/* ------------------------------------------------------------------ program */

enum ddp_phase_kind { DDP_PHASE_FORWARD, DDP_PHASE_BACKWARD, DDP_PHASE_OPTIMIZER,
                      DDP_PHASE_EVAL, DDP_PHASE_COUNT };

#define DDP_FIELDS_ddp_program(X, T)                                                                         \
    X##_I64(T, abi_version)         /* DDP_ABI_VERSION */                                                    \
    X##_U64(T, hash)                /* over the program and its settings: workers compare it */              \
    X##_STR(T, name)                /* the model */                                                          \
    X##_STR(T, source)              /* the .ddp file it was built from */                                    \
    X##_I64(T, dtype)               /* ddp_dtype of parameters and activations */                            \
    X##_I64(T, input_rank)                                                                                   \
    X##_I64S(T, input_shape, 8)     /* per sample */                                                         \
    X##_I64(T, output_elems)        /* per sample */                                                         \
    X##_I64(T, output_rank)                                                                                  \
    X##_I64S(T, output_shape, 8)    /* per sample */                                                         \
    X##_I64(T, label_dtype)         /* DDP_I32 class indices, else the output's dtype */                     \
    X##_I64(T, label_positions)     /* class indices a sample: one per row of the output's last axis */      \
    X##_I64(T, input_vocab)         /* > 0: the inputs are token indices, whole numbers below it */          \
    X##_I64(T, param_count)                                                                                  \
    X##_I64(T, stats_count)                                                                                  \
    X##_I64S(T, region_bytes, DDP_REGION_COUNT)                                                              \
    X##_REFS(T, ddp_param, params, nparams)                                                                  \
    X##_I64(T, nparams)             /* trainable first, then statistics */                                   \
    X##_REFS(T, ddp_buffer, buffers, nbuffers)                                                               \
    X##_I64(T, nbuffers)                                                                                     \
    X##_I64(T, input_slot)                                                                                   \
    X##_I64(T, label_slot)                                                                                   \
    X##_I64(T, sample_id_slot)                                                                               \
    X##_I64(T, accum_slot)                                                                                   \
    X##_I64(T, eval_output_slot)    /* the model's outputs at the evaluation phase's end (--predict) */      \
    X##_REFS(T, ddp_kernel, kernels, nkernels)                                                               \
    X##_I64(T, nkernels)                                                                                     \
    X##_FNS(T, cpu_baseline, 0)     /* one per kernel: any x86-64 */                                         \
    X##_FNS(T, cpu_wide, 1)         /* one per kernel: AVX2 and FMA, if the CPU has them */                  \
    X##_REFS(T, ddp_gemm, gemms, ngemms)                                                                     \
    X##_I64(T, ngemms)                                                                                       \
    X##_REFS(T, ddp_conv, convs, nconvs)                                                                     \
    X##_I64(T, nconvs)                                                                                       \
    X##_SUBS(T, ddp_phase, phases, DDP_PHASE_COUNT)                                                          \
    X##_REFS(T, ddp_bucket, buckets, nbuckets)                                                               \
    X##_I64(T, nbuckets)                                                                                     \
    X##_I64(T, accum_pairs)                                                                                  \
    X##_I64(T, nonfinite_slot)      /* an f64 beside the accumulators: 0, or where a NaN or infinity was */  \
    X##_STR(T, ptx)                 /* every kernel for the GPU, one module; NULL if not built */            \
    X##_U64(T, gpu_hash)            /* the hash of the GPU module both the PTX and gpu_emulated come from */ \
    X##_FNS(T, gpu_emulated, 2)     /* one per kernel: the GPU's code for the host, for the emulated device */ \
    X##_SUB(T, ddp_settings, settings)
DDP_CONTRACT(ddp_program)

/* The symbol a built program defines. */
extern const ddp_program ddp_program_desc;

#endif
