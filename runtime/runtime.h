/* runtime.h: the runtime library's internal interface, one section per file.
 *
 * The runtime knows the machine and never the model: it allocates the regions the
 * program's descriptor asks for, fills the buffer table, and walks the schedule of a
 * phase, running generated kernels on its threads and matrix products with BLAS. The
 * layers around it: the data and their loader, the cluster resolver, the coordinator
 * and its links, the ring that sums gradients between CPU workers, the training loop
 * and its reports. */
#ifndef DDP_RUNTIME_H
#define DDP_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conv.h"
#include "ddp_abi.h"
#include "ddp_support.h"
#include "fnv.h"

/* --------------------------------------------------------------- philox.c */

void ddp_philox4(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);
/* A draw keyed as ddp_abi.h says. */
void ddp_draw(uint64_t seed, uint32_t stream, uint64_t sample, uint32_t element, uint32_t step,
              uint32_t out[4]);
double ddp_uniform53(const uint32_t w[2]); /* [0, 1) from two words (w[0] the high one) */
/* A whole number in [0, bound) from two words (w[0] the high one). */
int64_t ddp_draw_below(const uint32_t w[2], int64_t bound);
/* A standard normal number from all four words (Box-Muller), the same bits on every
 * machine. */
double ddp_normal(const uint32_t w[4]);

/* --------------------------------------------------------------- message.c */

/* Writes a message into err and returns false: `return ddp_fail(err, len, ...)`. */
bool ddp_fail(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Who this process is, for what it writes to stderr: "PROG: " alone, or with several
 * workers "PROG: rank R on HOST: ", so the user sees whose message it is. */
void ddp_set_identity(const char *prog, int64_t rank, const char *host, bool several);
/* The calling thread's identity made the one of threads that set none. */
void ddp_share_identity(void);
/* That prefix, for a line written where ddp_error cannot be called (a signal handler). */
const char *ddp_identity(void);
/* One line to stderr, with that prefix. */
void ddp_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The run folder's log of this worker (appended to): every ddp_error line from now on,
 * and what ddp_say prints. */
bool ddp_log_open(const char *path, char *err, size_t len);
void ddp_log_close(void);
/* Worker 0's output: to stdout and the log. */
void ddp_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* To the log alone (the plain progress lines where stdout has a bar). */
void ddp_log_only(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A string that grows as it is printed into; failed once memory ran out. */
typedef struct ddp_text {
    char *s;                    /* malloc'd, 0-terminated */
    size_t len, cap;
    bool failed;
} ddp_text;
void ddp_text_printf(ddp_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ----------------------------------------------------------------- pool.c */

typedef struct ddp_pool ddp_pool;
/* The caller and threads - 1 more, each named name (a static string, 15 bytes at most). */
ddp_pool *ddp_pool_new(int threads, const char *name);
void ddp_pool_free(ddp_pool *p);
int ddp_pool_threads(const ddp_pool *p);
/* Runs fn over [begin, end), split among the threads, or on the caller alone when the
 * range is shorter than min_parallel; returns when all parts are done. */
typedef void (*ddp_range_fn)(void *ctx, int64_t begin, int64_t end);
void ddp_pool_for(ddp_pool *p, ddp_range_fn fn, void *ctx, int64_t begin, int64_t end, int64_t min_parallel);
/* A kernel over [begin, end) the same way; an index of it does about `work` elements'
 * work, so fewer indices are worth the threads. */
void ddp_pool_run(ddp_pool *p, ddp_kernel_fn fn, void *const *buffers, const ddp_scalar *scalars,
                  int64_t begin, int64_t end, int64_t work);

/* ----------------------------------------------------------------- data.c */

/* Element types of data files; inputs stay in their file's type in memory and are
 * converted (and scaled) only when a batch is assembled. */
enum ddp_elem { DDP_ELEM_U8, DDP_ELEM_I8, DDP_ELEM_U16, DDP_ELEM_I16, DDP_ELEM_U32, DDP_ELEM_I32,
                DDP_ELEM_U64, DDP_ELEM_I64, DDP_ELEM_F16, DDP_ELEM_F32, DDP_ELEM_F64, DDP_ELEM_COUNT };

/* A dataset in memory, as its files hold it. */
/* One file of a dataset of several (.npy patterns): its samples, from first on. */
typedef struct ddp_data_shard {
    char *path, *label_path;    /* its inputs' and labels' files, for messages */
    int64_t first;              /* the dataset's index of its first sample */
    void *inputs;               /* its samples x elems, as ddp_data's */
    unsigned char *mapping;     /* the mapped file inputs point into; NULL: read */
    size_t mapping_len;
    bool read_ahead;            /* the mapped file was asked whole to be read in the background */
} ddp_data_shard;

typedef struct ddp_data {
    const ddp_dataset *spec;
    char where[1024];           /* the file or folder of the inputs, as opened, for messages */
    char label_where[1024];     /* the labels' file, where it is another */
    int64_t samples;
    int rank;
    int64_t shape[8];           /* per sample, as the file says */
    int64_t elems;              /* per sample */
    int elem;                   /* ddp_elem of inputs */
    void *inputs;               /* samples x elems, native byte order, C order; NULL: synthetic, or shards */
    unsigned char *mapping;     /* the mapped file inputs point into (data_map.c); NULL: read */
    size_t mapping_len;
    bool read_ahead;            /* the mapped file was asked whole to be read in the background */
    ddp_data_shard *shards;     /* a dataset of several files: their inputs (inputs is NULL) */
    int64_t nshards;
    int64_t label_elems;        /* values per sample's label (1 for a class index) */
    bool integral_labels;       /* every label value is a whole number (a class index) */
    double *labels;             /* samples x label_elems; NULL: synthetic, tokens (the inputs' next ones) */
    bool unlabelled;            /* inputs alone (--predict-inputs): every label reads 0 */
} ddp_data;

/* dims joined by sep: "28x28" with "x", "28, 28" with ", " (every shape in messages). */
const char *ddp_dims_text(char *buf, size_t len, const int64_t *dims, int rank, const char *sep);
/* "[28, 28]" */
const char *ddp_shape_text(char *buf, size_t len, const int64_t *dims, int rank);
/* The bytes of one element of a ddp_dtype. */
static inline int64_t ddp_dtype_size(int64_t dtype) {
    return dtype == DDP_U8 ? 1 : dtype == DDP_BF16 ? 2 : dtype == DDP_F32 || dtype == DDP_I32 ? 4 : 8;
}
/* The values of a sample's label in a batch: class indices, one a row of classes of
 * the output (a language model's, one a position), or one an output. */
static inline int64_t ddp_label_values(const ddp_program *p) {
    return p->label_dtype == DDP_I32 ? p->label_positions : p->output_elems;
}
/* The element type of the batch's inputs (bf16 under precision = bf16, else the
 * program's dtype). */
static inline int64_t ddp_input_dtype(const ddp_program *p) {
    return p->input_slot >= 0 && p->input_slot < p->nbuffers ? p->buffers[p->input_slot].dtype : p->dtype;
}
/* The type the gradients are summed in, and where element e of them is then: bytes
 * into the GRADS region (ddp_abi.h's ddp_allreduce_precision). */
static inline int64_t ddp_wire_dtype(const ddp_program *p) {
    return p->settings.allreduce_precision == DDP_ALLREDUCE_BF16 && p->dtype == DDP_F32 ? DDP_BF16 : p->dtype;
}
static inline int64_t ddp_wire_offset(const ddp_program *p, int64_t e) {
    int64_t vectors = p->settings.accumulate_batches > 1 ? 2 : 1; /* the gradients, and their sum */
    return ddp_wire_dtype(p) == DDP_BF16 ? vectors * 4 * p->param_count + 2 * e : e * ddp_dtype_size(p->dtype);
}
/* The samples of an optimizer step over the whole job: batch_per_replica from each
 * replica, accumulate_batches times. */
static inline int64_t ddp_step_samples(const ddp_program *p, int64_t replicas) {
    return p->settings.batch_per_replica * replicas * p->settings.accumulate_batches;
}
/* An IEEE half-precision number's value. */
double ddp_half_to_double(uint16_t h);

/* A synthetic dataset's input values: element e of sample i is
 * ddp_synthetic_element(ddp_synthetic_seed(i), e), in [-1, 1): the top 24 bits of
 * the SplitMix64 output, (z >> 40) 2^-24, mapped to 2u - 1. */
uint64_t ddp_synthetic_seed(int64_t sample);
static inline double ddp_synthetic_element(uint64_t sample_seed, int64_t e) {
    uint64_t z = sample_seed + (uint64_t)(e + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return 2 * ((double)(z >> 40) * 0x1p-24) - 1;
}
/* Elements 0 .. per - 1 of a sample rounded to f32, as a batch takes them: the same
 * bits, faster (avx2: the AVX2 code, for a CPU that has it). */
void ddp_synthetic_floats(uint64_t sample_seed, int64_t per, float *row, bool avx2);

/* Reads a dataset's files (or maps them: data_map.c) and checks them on their own
 * (sizes, magic numbers, truncation, NaN or infinite labels, consistent counts). A
 * relative path is taken below root when root is not NULL. On failure: false, and err
 * holds one message naming the file and what is wrong with it, ending with what to do. */
bool ddp_data_open(const ddp_dataset *spec, const char *root, ddp_data *d, char *err, size_t errlen);
/* Checks that the inputs of part `part` of `parts` of the samples (ddp_shard_range)
 * are finite numbers, as ddp_data_open's messages say, and with a program p (NULL:
 * none), that the token indices an embedding looks up are below its vocab and a token
 * file's tokens below the classes too (a message as ddp_data_fits's). The workers of
 * a job check a part each, so a dataset is read once between them, not once by each. */
bool ddp_data_check_inputs(const ddp_data *d, const ddp_program *p, int64_t part, int64_t parts, char *err,
                           size_t errlen);
void ddp_data_free(ddp_data *d);
/* The bytes a dataset holds: its files' mapped (one copy in the page cache for every
 * worker of the node) and those in this worker's own memory. */
void ddp_data_held(const ddp_data *d, int64_t *mapped, int64_t *in_memory);
/* The mapped bytes not read ahead whole (files past half the memory): the loader asks
 * for them a few batches ahead (ddp_data_prefetch). */
int64_t ddp_data_asked_ahead(const ddp_data *d);
/* Every file this process has mapped as it was then (a file changed in place since, of
 * another size or time of modification, is named in err). */
bool ddp_data_files_unchanged(char *err, size_t errlen);
/* Checks that the data fits the program: per-sample element count against the
 * model's input, labels against the loss and the model's output (class indices below
 * the number of outputs, binary targets in [0, 1], ...); the values of the inputs
 * are ddp_data_check_inputs's. */
bool ddp_data_fits(const ddp_data *d, const ddp_program *p, char *err, size_t errlen);
/* What a training epoch's augmentations draw from: the run's seed and the epoch. */
typedef struct ddp_draw_key {
    uint64_t seed;
    int64_t epoch; /* from 0 */
} ddp_draw_key;
/* Augmentation `place`'s draws for a sample, in an epoch: four words of its element
 * (0 its first, others as each augmentation numbers them). */
static inline void ddp_augment_draws(const ddp_draw_key *key, int64_t place, int64_t sample, uint32_t element,
                                     uint32_t w[4]) {
    ddp_draw(key->seed, DDP_STREAM_AUGMENT + (uint32_t)place, (uint64_t)sample, element, (uint32_t)key->epoch, w);
}
/* Writes the samples of order entries indices[0..n) (ddp_entry_sample; a repeated
 * sample's copies draw as their entries) as rows 0..n of a batch in the program's layout:
 * x (n x input elements, the program's dtype, inputs times the dataset's scale, then
 * changed by the dataset's augmentations when augment is given: training, not
 * validation), y (n labels as the program's label_dtype wants them) and ids (the
 * entries). */
void ddp_data_batch(const ddp_data *d, const ddp_program *p, const int64_t *indices, int64_t n,
                    const ddp_draw_key *augment, void *x, void *y, int64_t *ids);
/* The mean and standard deviation (of the population) at each of `places` places along
 * the inputs' last axis (1: every value alike) after the dataset's scale, over every
 * sample or, past `most`, a random `most` of them drawn from seed (how many: *used).
 * False when memory runs out. */
bool ddp_data_stats(const ddp_data *d, int64_t places, int64_t most, uint64_t seed, double *mean, double *std,
                    int64_t *used);
/* Asks the kernel to read the inputs of samples indices[0..n) into the page cache in
 * the background where they lie in a mapped file not read ahead whole (one larger than
 * half the memory): the loader asks for the batches after the one it assembles, so a
 * dataset larger than memory, on a parallel file system, comes in many samples at a
 * time rather than a page fault at a time. */
void ddp_data_prefetch(const ddp_data *d, const int64_t *indices, int64_t n);
/* The augmentations of a sample's inputs (a row of the program's input shape, elements
 * of elem_size bytes), drawn from (key, sample) alone. top: the brightest value the
 * inputs can hold after the dataset's scale (ddp_data_top), where random_color clips. */
void ddp_augment_sample(const ddp_dataset *spec, const ddp_program *p, size_t elem_size, const ddp_draw_key *key,
                        int64_t sample, double top, void *row);
/* The brightest input value after scale: the largest an unsigned integer file's
 * element can hold, times scale; 1 for floats (as torchvision takes float images). */
double ddp_data_top(const ddp_data *d);
/* One sample's colour change (random_color, augmentation `place` of the list): the
 * changes with a spread above 0, in the order drawn, each with its factor (the hue's
 * shift for DDP_COLOR_HUE). random_grayscale's is DDP_COLOR_GREY alone (no factor). */
enum ddp_color_change { DDP_COLOR_BRIGHTNESS, DDP_COLOR_CONTRAST, DDP_COLOR_SATURATION, DDP_COLOR_HUE,
                        DDP_COLOR_GREY };
typedef struct ddp_color {
    int count;
    int change[4];    /* ddp_color_change, in the order they apply */
    double factor[4]; /* change[k]'s */
} ddp_color;
void ddp_color_draw(const ddp_augment *a, const ddp_draw_key *key, int64_t place, int64_t sample, ddp_color *out);
/* The changes on an image of `pixels` pixels of 1 or 3 channels, values in [0, top],
 * in place: torchvision's adjust_brightness, adjust_contrast, adjust_saturation,
 * adjust_hue and rgb_to_grayscale(num_output_channels = 3) on a float image (each
 * clipped to [0, top]; grey is 0.2989 R + 0.587 G + 0.114 B), in double. */
void ddp_color_image(const ddp_color *color, double *values, int64_t pixels, int64_t channels, double top);
/* trivial_augment and rand_augment (auto_augment.c): the operations of torchvision's
 * TrivialAugmentWide and RandAugment, in its order, each with its magnitude (signed). */
enum ddp_image_op_kind { DDP_OP_IDENTITY, DDP_OP_SHEAR_X, DDP_OP_SHEAR_Y, DDP_OP_TRANSLATE_X,
                         DDP_OP_TRANSLATE_Y, DDP_OP_ROTATE, DDP_OP_BRIGHTNESS, DDP_OP_COLOR, DDP_OP_CONTRAST,
                         DDP_OP_SHARPNESS, DDP_OP_POSTERIZE, DDP_OP_SOLARIZE, DDP_OP_AUTOCONTRAST,
                         DDP_OP_EQUALIZE, DDP_IMAGE_OPS };
enum { DDP_OP_INVERT = DDP_IMAGE_OPS }; /* AutoAugment's policies alone have it */
typedef struct ddp_image_op {
    int op;
    double magnitude;
} ddp_image_op;
/* A sample's operations, in the order they apply, drawn from augmentation `place` of
 * the list (a trivial_augment: one; a rand_augment: its `ops`; an auto_augment: those
 * of its policy's two its probabilities keep), for images of h x w pixels: how many. */
int ddp_auto_augment_draw(const ddp_augment *a, const ddp_draw_key *key, int64_t place, int64_t sample, int64_t h,
                          int64_t w, ddp_image_op *out);
/* Magnitude k of `bins` of an operation, unsigned, as torchvision's table for kind
 * (DDP_AUGMENT_TRIVIAL, or DDP_AUGMENT_RAND and DDP_AUGMENT_AUTO) has it for images of
 * h x w pixels. */
double ddp_image_op_magnitude(int kind, int op, int64_t bins, int64_t k, int64_t h, int64_t w);
/* Step `which` (0 or 1) of sub-policy `index` (of DDP_AUTO_SUBPOLICIES) of an AutoAugment
 * policy: its operation, its probability and its magnitude's bin of 10 (-1: none). */
enum { DDP_AUTO_SUBPOLICIES = 25 };
typedef struct ddp_auto_step {
    int op;
    double probability;
    int bin;
} ddp_auto_step;
ddp_auto_step ddp_auto_policy_step(int policy, int index, int which);
/* The operation on an 8-bit image [h][w][channels] (1 or 3), in place, as torchvision
 * makes it on a uint8 tensor (geometry by the nearest pixel or bilinear); scratch
 * holds as many bytes as the image. */
void ddp_image_op_apply(const ddp_image_op *t, bool bilinear, unsigned char *image, int64_t h, int64_t w,
                       int64_t channels, unsigned char *scratch);
/* random_erasing's box for a sample of h x w pixels, [y0, x0, y1, x1), drawn as
 * torchvision's RandomErasing.get_params; false where the sample keeps its values
 * (not drawn, by the probability, or no try of ten fitted). */
bool ddp_erase_box(const ddp_augment *a, const ddp_draw_key *key, int64_t place, int64_t sample, int64_t h,
                   int64_t w, int64_t box[4]);
/* How a training sample is mixed with another (random_mixup, random_cutmix): which
 * sample, the share of its own values and labels it keeps, and for a cutmix the box
 * [y0, x0, y1, x1) of the other's pixels it takes (its share then the rest of the
 * area). */
typedef struct ddp_mix {
    int64_t partner;
    double share;
    bool cut;
    int64_t box[4];
} ddp_mix;
/* The mixing of `sample` in training, drawn from (key, sample) alone, from a dataset
 * of `samples` whose augmentations end in random_mixup or random_cutmix (with both,
 * each sample takes one of them). */
void ddp_mix_draw(const ddp_dataset *spec, const ddp_program *p, int64_t samples, const ddp_draw_key *key,
                  int64_t sample, ddp_mix *mix);
/* The window {y, x, height, width} random_resized_crop a (the list's first) cuts from a
 * sample of height x width pixels in training, drawn from (key, sample) alone. */
void ddp_resized_window(const ddp_augment *a, int64_t height, int64_t width, const ddp_draw_key *key,
                        int64_t sample, int64_t window[4]);

/* -------------------------------------------------------------- profile.c */

/* --profile: each training step's time by schedule step, by part and by layer. The
 * executor (CPU or GPU, whatever measured the time) tells it each schedule step's
 * time, the training loop the parts that are no schedule step and each step's end;
 * every call of a training step comes before its ddp_profile_end_step. A NULL
 * profile records nothing. The first DDP_PROFILE_WARMUP_STEPS steps are left out. */
typedef struct ddp_profile ddp_profile;
enum { DDP_PROFILE_WARMUP_STEPS = 1 };
/* The parts of a step that are no schedule step; the rest of its wall time that no
 * call or part measured is its "other" share. */
enum ddp_profile_part {
    DDP_PROFILE_DATA,          /* waiting for the batch, assembling it, sending it to the device */
    DDP_PROFILE_COMMUNICATION, /* the wait for the gradients' sum; the loss and metrics' all-reduce */
    DDP_PROFILE_PARTS
};
ddp_profile *ddp_profile_new(const ddp_program *p); /* NULL: out of memory */
void ddp_profile_free(ddp_profile *pf);
/* Schedule step `step` of a training phase took seconds in the current training step:
 * a kernel or library call counts for its phase and layer, a wait for the gradient
 * buckets as communication; evaluation is not profiled. */
void ddp_profile_step(ddp_profile *pf, int phase, int64_t step, double seconds);
void ddp_profile_part(ddp_profile *pf, int part, double seconds);
/* The samples of the current step on this worker (the library calls' sizes grow with it). */
void ddp_profile_local_batch(ddp_profile *pf, int64_t samples);
void ddp_profile_end_step(ddp_profile *pf, double step_seconds);
/* The averages per step: worker 0 prints the table (through ddp_say) and writes it to
 * run_dir/profile.txt, every worker its figures to run_dir/profile.json (worker 0) or
 * profile.rankR.json; false with err when a file cannot be written. */
bool ddp_profile_report(ddp_profile *pf, int64_t rank, int64_t workers, const char *device, const char *run_dir,
                        char *err, size_t len);

/* ----------------------------------------------------------------- exec.c */

typedef struct ddp_options {
    int threads;           /* 0: as many as the process may use */
    bool baseline_cpu;     /* the baseline kernels even where AVX2 is there */
    bool poison;           /* fill planned memory with NaN outside each value's life */
    bool no_graphs;        /* on a GPU, every phase step by step, never as a CUDA graph */
    bool step_graph;       /* a lone worker: forward, backward and optimizer follow one another with
                            * nothing between, so a GPU makes the whole step one CUDA graph */
    int convolutions;      /* ddp_path: generated, or the library's (conv_cpu.c on the CPU); 0: the device's */
    bool reference_convolutions; /* the CPU's library path by conv_reference.c: the GPU checks' yardstick */
    bool timed_conv_search; /* the library's engines chosen by timing them (cuDNN) */
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
    bool wide_cpu;                 /* that variant is AVX2's (the narrow convolutions' kernels too) */
    ddp_pool *pool;
    ddp_conv_scratch conv_scratch; /* the CPU's convolutions' tiles */
    int cpu_path;                  /* the CPU's convolutions' ddp_path unless options.convolutions says */
    int64_t elem_size;
    int replicas, workers;
    int64_t epochs;                /* of the run, for schedules (the program's unless changed) */
    double rate_override;          /* NAN: the program's learning rate */
    double rate_scale;             /* reduce_lr's reductions so far: the schedule's rate times it (1) */
    double sweep[2];               /* --find-lr: step t's rate rises geometrically from sweep[0] ... */
    int64_t sweep_steps;           /* ... to sweep[1] at step sweep_steps - 1; 0: the schedule's */
    struct ddp_gpu *gpu;           /* the GPU that runs the schedule (gpu.c); NULL: the CPU */
    bool holding_gradients;        /* accumulate_batches: a batch before its step's last, whose
                                      markers hand nothing to the all-reduce */
    ddp_profile *profile;          /* --profile: told each schedule step's time; NULL: off */
    char device_error[2048];       /* why the GPU failed */
} ddp_runtime;

/* Allocates and prepares a program's regions; NULL with a message in err. */
const char *ddp_blas_core(void); /* the kernels OpenBLAS multiplies with: "SkylakeX", ... */
ddp_runtime *ddp_open(const ddp_program *p, const ddp_options *o, char *err, size_t errlen);
void ddp_close(ddp_runtime *rt);
/* Sets the parameters and statistics to their initial values for a seed: the same on
 * every machine and for any number of workers. */
void ddp_init_params(ddp_runtime *rt, uint64_t seed);
/* The optimizer's ema (Keras's use_ema): the moving average of the parameters, the last
 * state vector, on the host (NULL without ema); made the parameters the run starts from
 * (ddp_start_average; ddp_load_params sets it, from a checkpoint's own average where it
 * has one; a resumed run's comes from its checkpoint); and its
 * contents traded with the parameters' (ddp_trade_average: validation, the best file and
 * --save see the average; trading again puts them back). */
char *ddp_average(ddp_runtime *rt);
void ddp_start_average(ddp_runtime *rt);
void ddp_trade_average(ddp_runtime *rt);
/* The average's host mirror copied to the GPU (up) or from it; true on the CPU. */
bool ddp_average_moved(ddp_runtime *rt, bool up);
/* The name of the optimizer's state vector v in a checkpoint: "optimizer.state.V", or
 * ema's average "optimizer.average", which --load of a checkpoint takes too. */
void ddp_state_name(const ddp_program *p, int64_t v, char *out, size_t len);
void ddp_set_batch(ddp_runtime *rt, int64_t local, int64_t global);
/* The steps of a phase. On a GPU they are queued, and run once the host waits for
 * them (ddp_to_host, ddp_gpu_synchronize); false with rt->device_error when the GPU
 * failed (the CPU never does). */
bool ddp_run_phase(ddp_runtime *rt, int phase);
/* steps [first, first + count) of a phase */
bool ddp_run_steps(ddp_runtime *rt, int phase, int64_t first, int64_t count);
/* forward, backward, optimizer: one training step on the batch in the input region */
bool ddp_train_step(ddp_runtime *rt);
/* Whether a step of that ddp_path runs when the executor takes the convolutions' `path`. */
bool ddp_path_runs(int64_t step_path, int path);
/* A library convolution of the schedule at the live batch, its addresses left zero. */
struct ddp_device_conv ddp_conv_at(const ddp_runtime *rt, const ddp_conv *cv);
/* A row-major product at the live batch as cuBLAS's column-major one: C^T = op(B)^T
 * op(A)^T, so the operands swap places and so do their transpositions and m and n.
 * a, b and c are where the product's A, B and C lie (on the device, or the host); a
 * batched product's group `group` of every batch (cuBLAS's batch). */
struct ddp_device_gemm ddp_gemm_at(const ddp_runtime *rt, const ddp_gemm *g, int64_t group, uint64_t a, uint64_t b,
                                   uint64_t c);
/* A small row-major f32 product C = alpha op(A) op(B) + beta C (C not read when beta
 * is 0) by AVX2 and FMA, term after term in order (gemm_small.c): the batched
 * products' path on a CPU that has them, where the product fits. Callers check
 * __builtin_cpu_supports first. */
enum { DDP_SMALL_GEMM_FLOATS = 8192 }; /* op(B) padded to 16 columns, at most */
bool ddp_small_gemm_fits(int64_t m, int64_t n, int64_t k);
void ddp_small_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
void ddp_zero_accumulators(ddp_runtime *rt);
double ddp_accumulator(ddp_runtime *rt, int pair, double *count);
/* The accumulators themselves: accum_pairs (sum, count) pairs, for saving around a
 * validation in mid-epoch. */
double *ddp_accumulators(ddp_runtime *rt);
/* The flag beside them (ddp_abi.h's nonfinite_slot): 0 while every summed gradient and
 * the loss were finite; else 1 + the first bad gradient element, or 1 + param_count
 * for the loss. */
/* The model's outputs for the first `rows` samples of the batch the evaluation phase
 * ran on, output_elems each, of the eval_output buffer's dtype, copied into host
 * (from a GPU once the phase is done). False with rt->device_error. */
bool ddp_eval_outputs(ddp_runtime *rt, int64_t rows, void *host);
double ddp_nonfinite_flag(const ddp_runtime *rt);
void *ddp_buffer_ptr(ddp_runtime *rt, int64_t slot);

/* ------------------------------------------------------------- hostlist.c */

/* Slurm's host lists and tasks per node, expanded exactly as Slurm does (and a
 * suffix after the last bracket, which newer versions write). */
typedef struct ddp_hostlist {
    char **names;               /* in the list's order, duplicates kept */
    int count, cap;
} ddp_hostlist;

bool ddp_hostlist_parse(const char *list, ddp_hostlist *out, char *err, size_t errlen);
void ddp_hostlist_free(ddp_hostlist *h);
/* "2(x3),1" as 2, 2, 2, 1 in *counts (malloc'd, the caller frees) */
bool ddp_tasks_per_node_parse(const char *list, int64_t **counts, int *nodes, char *err, size_t errlen);

/* -------------------------------------------------------------- cluster.c */

/* The cluster flags of the command line; world 0 and -1 elsewhere mean not given. */
typedef struct ddp_cluster_flags {
    int64_t rank, world, local_rank, local_world;
    const char *coordinator;    /* HOST:PORT */
    int64_t port_base;
} ddp_cluster_flags;

/* This worker's place in the job. */
typedef struct ddp_cluster {
    const char *source;         /* "flags", "env", "slurm" or "local" */
    int64_t rank, world, local_rank, local_world;
    int64_t node, nodes;        /* this worker's node of the job's (Slurm) */
    char host[256];             /* this worker's host, as the job names it */
    char coordinator[256];      /* rank 0's host */
    int64_t port_base;          /* the coordinator's port; local rank i listens on port_base + i */
    int64_t job, step;          /* Slurm's job and step ids; 0 elsewhere */
    char warning[512];          /* "", or what the user should know (a job without a step) */
    ddp_hostlist hosts;         /* Slurm: the step's nodes */
    int64_t *tasks;             /* Slurm: the tasks of each node */
} ddp_cluster;

/* From flags, DDP_* variables, a Slurm job step or one worker alone, as the program's
 * cluster setting allows; false with a message naming the variable at fault. */
/* Whether the program's `cluster` (slurm, env) asks for a job this process is not a
 * task of, with no flags giving its place instead. */
bool ddp_cluster_outside_job(const ddp_settings *s, const ddp_cluster_flags *f);
bool ddp_cluster_resolve(const ddp_settings *s, const ddp_cluster_flags *f, ddp_cluster *c, char *err,
                         size_t errlen);
void ddp_cluster_free(ddp_cluster *c);
/* The port this worker's end of the ring listens on: port_base + its local rank
 * (rank 0 listens only as the coordinator, on port_base). */
int ddp_cluster_ring_port(const ddp_cluster *c);

/* ----------------------------------------------------------------- wire.c */

/* Frames between workers (outside the ring's data): a checked header, a payload. */
enum { DDP_WIRE_MAGIC = 0x77504444 /* "DDPw" */, DDP_WIRE_VERSION = 1 };
/* How long a connection may take to prove it belongs to the job (auth.c): a stray
 * that connects and says nothing is dropped after this. */
enum { DDP_HANDSHAKE_MS = 5000 };
#define DDP_WIRE_MAX ((size_t)256 << 20)

enum ddp_msg { DDP_MSG_CHALLENGE = 1, DDP_MSG_PROOF, DDP_MSG_HELLO, DDP_MSG_JOIN, DDP_MSG_TABLE, DDP_MSG_REFUSED,
               DDP_MSG_SET, DDP_MSG_GET, DDP_MSG_VALUE, DDP_MSG_BEAT, DDP_MSG_LOST, DDP_MSG_ABORT, DDP_MSG_BYE };

typedef struct ddp_frame_header {
    uint32_t magic;
    uint16_t version, type;
    uint32_t length, spare;
} ddp_frame_header;

typedef struct ddp_frame {
    int type;
    char *data;                 /* len bytes and a 0 after them; malloc'd */
    size_t len;
} ddp_frame;

/* A monotonic clock in milliseconds: every deadline below is on it. */
double ddp_now_ms(void);
/* Neither waits past the deadline, on blocking sockets too. */
bool ddp_send_all(int fd, const void *data, size_t len, double deadline);
/* 1 read, 0 the peer closed first, -1 timed out, -2 failed (errno) */
int ddp_recv_all(int fd, void *data, size_t len, double deadline);
ddp_frame_header ddp_frame_header_for(int type, size_t len);
bool ddp_frame_send(int fd, int type, const void *payload, size_t len, double deadline);
/* A whole frame of at most max payload bytes; false with what was wrong. */
bool ddp_frame_recv(int fd, ddp_frame *f, size_t max, double deadline, char *err, size_t errlen);
void ddp_frame_free(ddp_frame *f);
/* What is wrong with a header (magic, version, length), or NULL. */
const char *ddp_header_problem(const ddp_frame_header *h, size_t max);

/* Frames read as bytes arrive on a non-blocking socket. */
typedef struct ddp_reader {
    char *buf;
    size_t have, cap;
} ddp_reader;
/* 1 a frame in *f, 0 not yet, -1 the peer closed, -2 a bad frame (*problem says). */
int ddp_reader_feed(ddp_reader *r, int fd, size_t max, ddp_frame *f, const char **problem);
void ddp_reader_free(ddp_reader *r);

/* Text payloads: lines "key value". */
bool ddp_text_field(const char *text, const char *key, char *out, size_t len);
bool ddp_text_number(const char *text, const char *key, int64_t *out);

/* A listening socket on every address at port; -1 with a message ("in use" said). */
int ddp_listen(int port, char *err, size_t errlen);
/* Connects to host:port, retrying while no one listens yet, until the deadline. */
int ddp_connect(const char *host, int port, double deadline, char *err, size_t errlen);
/* The IPv4 address of a network interface (--interface). */
bool ddp_interface_address(const char *name, char *out, size_t len, char *err, size_t errlen);

/* ----------------------------------------------------------------- auth.c */

typedef struct ddp_auth {
    bool munge;                 /* munge credentials, else a MAC under key */
    unsigned char key[32];
    char scope[128];            /* what both ends must share: the Slurm job step, or "secret" */
} ddp_auth;

bool ddp_random_bytes(void *out, size_t len);
/* munge inside a Slurm step where it works, else DDP_SECRET; false when neither. */
bool ddp_auth_init(ddp_auth *a, const ddp_cluster *c, char *err, size_t errlen);
/* A MAC under a given key (the ring's). */
void ddp_auth_with_key(ddp_auth *a, const unsigned char key[32], const char *scope);
/* The handshake from either end; false with why the other end is not trusted. */
bool ddp_auth_accept(const ddp_auth *a, int fd, double deadline, char *err, size_t errlen);
bool ddp_auth_connect(const ddp_auth *a, int fd, double deadline, char *err, size_t errlen);

/* ---------------------------------------------------------- coordinator.c */

typedef struct ddp_coordinator ddp_coordinator;
typedef struct ddp_coordinator_config {
    int listener;               /* listening on the coordinator's port; the coordinator closes it */
    int world;
    ddp_auth auth;
    int peer_timeout_ms, beat_ms;
    double join_deadline;       /* every worker must have joined by then */
    int rendezvous_timeout_s;   /* for the message when one did not */
} ddp_coordinator_config;

/* How often a wait at the rendezvous is reported, by the coordinator and by the
 * workers: every 30 s, sooner where the rendezvous timeout is short. */
static inline double ddp_wait_notice_ms(int rendezvous_timeout_s) {
    double ms = rendezvous_timeout_s * 1000.0 / 5;
    return ms > 30000 ? 30000 : ms < 1000 ? 1000 : ms;
}

ddp_coordinator *ddp_coordinator_start(const ddp_coordinator_config *cfg, char *err, size_t errlen);
/* Serves until every worker has said goodbye or the deadline passes, then stops. */
void ddp_coordinator_stop(ddp_coordinator *s, double deadline);

/* ----------------------------------------------------- coordinator_link.c */

typedef struct ddp_link ddp_link;
typedef struct ddp_link_config {
    const ddp_cluster *cluster;
    const ddp_auth *auth;
    int rendezvous_timeout_s, peer_timeout_s;
} ddp_link_config;

/* Where every worker's ring listens, from the rendezvous. */
typedef struct ddp_peer {
    char address[64];           /* to connect to */
    char host[256];             /* the job's name for it */
    int port;
} ddp_peer;

typedef struct ddp_table {
    int world;
    ddp_peer *peers;            /* by rank */
    unsigned char key[32];      /* the ring's */
} ddp_table;

/* Connects to the coordinator (worker 0 starts it first) and starts the heartbeat. */
ddp_link *ddp_link_open(const ddp_link_config *cfg, char *err, size_t errlen);
/* Sends what this worker will run (lines "key value"; "setting NAME VALUE" lines
 * must agree on every worker) and waits for the table or the job's refusal; *lost
 * tells whether a lost worker stopped it. */
bool ddp_link_join(ddp_link *l, const char *join, ddp_table *table, int timeout_s, bool *lost, char *err,
                   size_t errlen);
void ddp_table_free(ddp_table *t);
bool ddp_link_set(ddp_link *l, const char *key, const void *value, size_t len, char *err, size_t errlen);
/* Waits for the key; the value is the caller's to free. */
bool ddp_link_get(ddp_link *l, const char *key, ddp_frame *value, int timeout_s, char *err, size_t errlen);
/* True once a worker of the job is lost: its rank and a line naming it and why. */
bool ddp_link_lost(ddp_link *l, int *rank, char *text, size_t len);
/* The status a worker ends with for a loss: 3 (a worker died, froze or could not be
 * reached; also with no loss, or NULL), or the lost worker's own when it told the job
 * it failed with an error (1, 2), so that every worker, and srun, gives the cause's. */
int ddp_link_lost_status(ddp_link *l);
/* Readable once a worker is lost; -1 for NULL. */
int ddp_link_wake_fd(const ddp_link *l);
/* A loss the main thread does not act on ends the process after a grace period, but
 * not before until_ms (ddp_now_ms's clock): another thread ends it by then if it must
 * (the NCCL watchdog, its abort hung). */
void ddp_link_defer(ddp_link *l, double until_ms);
/* The training step this worker is at, for the message should it be ended. */
void ddp_link_at_step(ddp_link *l, int64_t step);
/* This clock minus the coordinator's, in ms (for traces). */
double ddp_link_clock_offset(ddp_link *l);
/* Says goodbye and closes; worker 0 first waits for everyone's goodbye. NULL: none. */
void ddp_link_close(ddp_link *l);
/* Tells the job this worker fails with message and ends with status, then closes. */
void ddp_link_abort(ddp_link *l, int status, const char *message);

/* ----------------------------------------------------------------- ring.c */

/* The CPU transport: the workers in a ring of TCP connections. */
typedef struct ddp_ring ddp_ring;

typedef struct ddp_ring_peers {
    int rank, world;
    const char *const *addresses; /* by rank: where to connect */
    const int *ports;           /* by rank: where each listens (rank 0: nowhere) */
    const char *const *hosts;   /* by rank, for messages */
    uint64_t program_hash;      /* every worker must run the same program */
    const unsigned char *key;   /* 32 bytes every connection must prove it holds */
    int listener;               /* this worker's listening socket (not rank 0's) */
    double deadline;            /* for the ring to form (ddp_now_ms) */
    int timeout_s;              /* a neighbour silent this long is lost; 0: never */
    ddp_link *link;             /* NULL, or the link whose news of a loss ends a collective */
    int unanswered_s;           /* the kernel ends a connection whose data or keepalives go unacknowledged
                                   this long (a link between two workers cut while both still reach the
                                   coordinator); 0: its defaults */
} ddp_ring_peers;

ddp_ring *ddp_ring_connect(const ddp_ring_peers *peers, char *err, size_t errlen);
void ddp_ring_close(ddp_ring *r);
/* Sums count values (f32 or f64) over the workers, in place; afterwards every
 * worker holds the same bits. */
bool ddp_ring_allreduce(ddp_ring *r, void *data, int64_t count, int64_t dtype, char *err, size_t errlen);
bool ddp_ring_broadcast(ddp_ring *r, void *data, size_t bytes, int root, char *err, size_t errlen);
bool ddp_ring_barrier(ddp_ring *r, char *err, size_t errlen);
uint64_t ddp_ring_bytes_sent(const ddp_ring *r);
/* The rank whose death or silence ended a collective, or -1. */
int ddp_ring_lost(const ddp_ring *r);
int ddp_ring_rank(const ddp_ring *r);
int ddp_ring_world(const ddp_ring *r);

/* ---------------------------------------------------------------- trace.c */

typedef struct ddp_trace ddp_trace;
enum ddp_trace_lane { DDP_LANE_COMPUTE, DDP_LANE_COMM };

typedef struct ddp_trace_event {
    const char *name;           /* a constant: "forward", "all-reduce", ... */
    int lane;
    int64_t step;               /* the optimizer step, from 0 */
    int64_t index, bytes;       /* a bucket and its size; -1, 0 for others */
    double begin, end;          /* ddp_trace_clock() */
    const int64_t *sample_ids;  /* a batch's samples, copied */
    int64_t nsamples;
} ddp_trace_event;

double ddp_trace_clock(void);   /* microseconds, monotonic */
ddp_trace *ddp_trace_new(void);
void ddp_trace_free(ddp_trace *t);
/* Records a span; NULL t records nothing. Safe from any thread. */
void ddp_trace_span(ddp_trace *t, const ddp_trace_event *e);
/* This worker's spans as JSON objects separated by commas, moved onto the
 * coordinator's clock (offset_ms: this clock minus the coordinator's); malloc'd. */
char *ddp_trace_json(ddp_trace *t, int rank, const char *host, double offset_ms, uint64_t ring_bytes, size_t *len);
/* The Chrome trace file from every worker's part, written whole or not at all. */
bool ddp_trace_write(const char *path, char *const *parts, const size_t *lens, int n, char *err, size_t errlen);

/* ----------------------------------------------------------------- comm.c */

/* The communication thread: p's buckets all-reduced as backward marks them ready, in
 * the GRADS region at grads (in the gradients' type, or their bf16 copy). */
typedef struct ddp_comm ddp_comm;
ddp_comm *ddp_comm_start(ddp_ring *ring, void *grads, const ddp_program *p, ddp_trace *trace);
void ddp_comm_stop(ddp_comm *c);
/* Before a step's backward. */
void ddp_comm_begin_step(ddp_comm *c, int64_t step);
/* The executor's hooks (ctx: the ddp_comm). */
void ddp_comm_bucket_ready(void *ctx, int64_t bucket);
void ddp_comm_wait_hook(void *ctx);
/* Waits for every bucket of the step; false with the failure. */
bool ddp_comm_wait(ddp_comm *c, char *err, size_t errlen);

/* ----------------------------------------------------------------- nccl.c */

/* The gradients' all-reduce between GPUs through NCCL, with a watchdog that aborts
 * the communicator when a worker is lost (S12). */
typedef struct ddp_nccl ddp_nccl;
/* NCCL loaded for a device of the backend ("cuda", or "emulated", which takes only the
 * tests' stand-in); false with why not (not found, too old, the wrong kind). */
bool ddp_nccl_load(const char *backend, char *about, size_t aboutlen, char *err, size_t len);
typedef struct ddp_nccl_config {
    struct ddp_device *device;
    int stream;                 /* the device's stream the collectives run on */
    ddp_link *link;             /* the unique id's way, and the news of lost workers; NULL alone */
    int rank, world;
    int peer_timeout_s, rendezvous_timeout_s;
} ddp_nccl_config;
/* Every rank calls it at once; NULL with why. */
ddp_nccl *ddp_nccl_open(const ddp_nccl_config *c, char *err, size_t len);
/* Before a step's first collective: the last step's have all ended (the host saw its
 * optimizer's work done, which waits for them). */
void ddp_nccl_begin_step(ddp_nccl *n);
/* The sum over every rank of count values at the device address data, in place,
 * queued on the stream between the bucket's two events (device.h); false with why. */
bool ddp_nccl_allreduce(ddp_nccl *n, uint64_t data, int64_t count, int64_t dtype, int64_t bucket, int64_t nbuckets,
                        int64_t step, char *err, size_t len);
/* Whether the watchdog aborted the communicator: why, naming the collective. */
bool ddp_nccl_failed(ddp_nccl *n, char *why, size_t len);
/* Finalized and destroyed, or nothing more after an abort. NULL: nothing. */
void ddp_nccl_close(ddp_nccl *n);

/* --------------------------------------------------------------- loader.c */

/* The order of an epoch's samples (S8): a permutation of [0, n) drawn from (seed,
 * epoch), the same on every worker, or 0..n-1 without shuffling. */
void ddp_epoch_order(uint64_t seed, int64_t epoch, bool shuffle, int64_t n, int64_t *order);
/* augment_repeats: an order's first n / repeats samples, each `repeats` times in a row
 * (repeated augmentation), the epoch as long as before; copy c of sample s is the
 * entry s + c n, whose random draws (augmentations, dropout) are its own. */
void ddp_repeat_order(int64_t n, int64_t repeats, int64_t *order);
/* A training epoch's order: ddp_epoch_order, repeated as the program says. */
void ddp_training_order(const ddp_program *p, uint64_t seed, int64_t epoch, int64_t n, int64_t *order);
/* The dataset's sample of an order's entry (ddp_repeat_order's copies). */
static inline int64_t ddp_entry_sample(int64_t entry, int64_t samples) {
    return entry % samples;
}
/* Part `part` of `parts` of count items, as even as possible: the first count % parts
 * parts hold one more. */
void ddp_shard_range(int64_t count, int64_t parts, int64_t part, int64_t *begin, int64_t *size);

/* How an epoch is cut into global batches (S6, S9). */
typedef struct ddp_epoch_plan {
    int64_t samples, global_batch;
    int64_t steps;              /* global batches per epoch */
    int64_t dropped;            /* samples per epoch that no batch holds */
} ddp_epoch_plan;

/* steps_per_epoch -1: every batch the data gives. False with a message when the data
 * cannot give one batch, or fewer than steps_per_epoch. */
bool ddp_plan_epoch(int64_t samples, int64_t global_batch, bool drop_remainder, int64_t steps_per_epoch,
                    ddp_epoch_plan *plan, char *err, size_t errlen);
/* Global batch `step` of an epoch: positions [*begin, *begin + *size) of its order. */
void ddp_batch_span(const ddp_epoch_plan *plan, int64_t step, int64_t *begin, int64_t *size);

/* A background thread that assembles each batch while the step before it runs, with
 * threads - 1 helpers (the batch is the same whatever their number). */
typedef struct ddp_loader ddp_loader;
ddp_loader *ddp_loader_new(const ddp_data *d, const ddp_program *p, int64_t max_rows, int threads);
void ddp_loader_free(ddp_loader *l);
/* Starts a pass: batch b holds samples order[starts[b] .. starts[b] + sizes[b]),
 * augmented with key's draws (NULL: as they are). The arrays remain the caller's and
 * must outlive the pass. A new pass may start before the last one was consumed. */
void ddp_loader_begin(ddp_loader *l, const int64_t *order, const int64_t *starts, const int64_t *sizes,
                      int64_t batches, const ddp_draw_key *augment);
/* Waits for the pass's next batch and copies it into x, y and ids; returns its rows. */
int64_t ddp_loader_next(ddp_loader *l, void *x, void *y, int64_t *ids);

/* -------------------------------------------------------------- options.c */

enum ddp_device_kind { DDP_DEVICE_AUTO, DDP_DEVICE_CPU, DDP_DEVICE_GPU, DDP_DEVICE_EMULATED };

/* A run's settings: the program's, then the command line's over them. */
typedef struct ddp_config {
    const char *prog;           /* the executable, as messages name it */
    char usage_error[512];      /* why the command line was refused (status 2), for the job */
    ddp_options exec;
    int64_t epochs;
    int64_t steps_per_epoch;    /* -1: every global batch */
    uint64_t seed;
    double learning_rate;       /* NAN: the program's */
    int device;                 /* ddp_device_kind */
    const char *data_root, *metrics_path, *save_path, *load_path;
    bool evaluate;              /* --evaluate, or --predict */
    bool check;                 /* --check: everything a run needs read and tried; nothing run */
    bool data_stats;            /* --data-stats: the inputs' mean and std printed; nothing run */
    const char *dump_path;      /* --dump-batch: the first training batch written there; nothing run */
    const char *find_lr_path;   /* --find-lr: the learning-rate range test's steps written there (.csv) */
    int64_t find_lr_steps;      /* its steps (--find-lr-steps) */
    double find_lr_range[2];    /* its first and last learning rates (--find-lr-range) */
    const char *predict_path;   /* --predict: where the validation samples' outputs go */
    char predict_inputs[4096];  /* --predict-inputs: unlabelled .npy inputs instead (an absolute
                                   path, or a pattern); "": the validation dataset */
    bool synthetic;             /* random data of the model's shapes, no validation */
    int64_t log_every;          /* steps between progress lines when not on a terminal */
    bool progress_bar;          /* stdout is a terminal */
    ddp_cluster_flags cluster_flags;
    ddp_cluster cluster;        /* resolved at start */
    int64_t rendezvous_timeout, peer_timeout; /* seconds */
    const char *interface;      /* --interface: the network interface whose address peers use */
    const char *trace_path;     /* --trace */
    bool profile;               /* --profile */
    const char *run_dir;        /* --run-dir; NULL: runs/MODEL-JOB */
    bool resume;                /* --resume */
    const char *resume_path;    /* its checkpoint or folder; NULL: the run's newest */
    bool resume_changed;        /* --resume-changed */
    bool requeue_on_signal;     /* --requeue-on-signal */
    const char *proven_by;      /* how workers prove they belong to the job, for the banner */
    char threads_from[128];     /* how the thread count was found, for the banner */
    int loader_threads;         /* --loader-threads; 0 until the device is chosen (start.c) */
    bool nccl;                  /* several workers: the gradients summed by NCCL, else the ring */
    char communication[1600];   /* how the gradients travel, for the banner */
} ddp_config;

/* --predict-inputs as a dataset, into out: the program's validation dataset (or, with
 * none, its training dataset) with those files in place of its own, no labels, scaled
 * and normalised alike, never augmented. out points into cfg. */
void ddp_predict_spec(const ddp_config *cfg, const ddp_program *p, ddp_dataset *out);

/* Fills cfg from the program's settings and argv. Returns -1 to go on, else the exit
 * status to end with (0 after --help, 2 on bad usage, the message printed). */
int ddp_parse_args(ddp_config *cfg, const ddp_program *p, int argc, char **argv);
/* Refuses what the program asks that this runtime cannot do yet (checkpoints, GPUs,
 * reduced precision): false with a message saying what to change. */
bool ddp_check_supported(const ddp_config *cfg, const ddp_program *p, char *err, size_t errlen);

/* ------------------------------------------------------------------ files.c */

/* A file replaced whole: written to a temporary file beside path, then synced and
 * renamed over it (commit), or removed (abandon). A reader sees the old file or the
 * whole new one; durable: the folder synced too, so the rename survives a crash of
 * the machine. Write errors are kept by the FILE and reported by the commit. */
typedef struct ddp_replacement {
    FILE *f;
    const char *path;
    char tmp[4200];
} ddp_replacement;

bool ddp_replace_open(ddp_replacement *w, const char *path, char *err, size_t len);
bool ddp_replace_commit(ddp_replacement *w, bool durable, char *err, size_t len);
void ddp_replace_abandon(ddp_replacement *w);
/* Whether path could be replaced now (its folder takes a file, it is no folder): what
 * a run checks at its start of the files it writes at its end. */
bool ddp_replace_possible(const char *path, char *err, size_t len);
/* From now on SIGINT, SIGTERM, SIGHUP and SIGUSR1, where they would end the process
 * (not ignored, not handled), remove the temporary files of the replacements being
 * written before they end it. Training catches them for a while (train.c), and gives
 * them back as they were. */
void ddp_remove_unfinished_on_signals(void);
/* The temporary files being written removed, then the process ended by sig as if
 * nothing handled it; async-signal-safe (unlink, signal and raise only). */
void ddp_end_by_signal(int sig);
/* A small text file, replaced whole. */
bool ddp_write_text(const char *path, const char *text, char *err, size_t len);
bool ddp_sync_folder(const char *path); /* the folder that holds path */
/* Ends the process at the point named by DDP_CRASH_AT, for the tests of what survives
 * a crash there ("before-rename", "before-folder-sync", "during-pruning"). */
void ddp_crash_point(const char *name);

/* ---------------------------------------------------------------- predict.c */

/* --predict FILE: the model's outputs, one row of output_elems per sample, written by
 * worker 0 as .npy (float32, or float64 for an f64 program; shape [samples, *output
 * shape]) or .csv (a header output_0,..., then one line per sample). */
typedef struct ddp_predictions ddp_predictions;

bool ddp_predictions_format_known(const char *path); /* ends in .npy or .csv */
/* The file begun beside path for `samples` rows: NULL with why in err. */
ddp_predictions *ddp_predictions_open(const char *path, const ddp_program *p, int64_t samples, char *err,
                                      size_t len);
/* n more rows in the dataset's order; false once a write failed (finish says why). */
bool ddp_predictions_add(ddp_predictions *w, const double *rows, int64_t n);
/* Every row in: the file replaces its target. Frees w; false with why in err. */
bool ddp_predictions_finish(ddp_predictions *w, char *err, size_t len);
void ddp_predictions_abandon(ddp_predictions *w); /* the file left as it was; frees w */
/* An array [samples, *dims] of descr ("<f4", "<i4", ...), `bytes` of values, as the
 * .npy at path, replacing it whole; false with why in err. */
bool ddp_npy_write(const char *path, const char *descr, int64_t samples, const int64_t *dims, int64_t rank,
                   const void *values, size_t bytes, char *err, size_t len);

/* ---------------------------------------------------------- safetensors.c */

/* A metadata entry of a safetensors header (both strings, as the format wants). */
typedef struct ddp_meta {
    const char *key, *value;
} ddp_meta;

/* A tensor to write: bytes of little-endian data. */
typedef struct ddp_tensor_out {
    const char *name, *dtype;   /* "F32", "F64" */
    int rank;
    int64_t shape[4];
    const void *data;
    int64_t bytes;
} ddp_tensor_out;

/* Writes a safetensors file, replaced whole (above). */
bool ddp_tensors_write(const char *path, const ddp_meta *meta, int nmeta, const ddp_tensor_out *t, int64_t n,
                       bool durable, char *err, size_t errlen);

/* A tensor of a file read, its bytes [begin, end) of the data. */
typedef struct ddp_tensor_in {
    char name[256], dtype[16];
    int64_t rank, shape[8], begin, end;
} ddp_tensor_in;

/* A safetensors file in memory, its header parsed and every byte range checked. */
typedef struct ddp_tensor_file {
    unsigned char *bytes;       /* the whole file, owned */
    size_t len;
    const unsigned char *data;  /* after the header */
    size_t data_len;
    ddp_tensor_in *tensors;
    int64_t count, cap;
    ddp_meta *meta;             /* malloc'd strings */
    int64_t nmeta, meta_cap;
    bool out_of_memory;
} ddp_tensor_file;

/* Parses len bytes (malloc'd; *f owns them from now on, even on failure: free it with
 * ddp_tensors_free); false with what is wrong, the file named as path. */
bool ddp_tensors_parse(ddp_tensor_file *f, unsigned char *bytes, size_t len, const char *path, char *err,
                       size_t errlen);
bool ddp_tensors_read(const char *path, ddp_tensor_file *f, char *err, size_t errlen);
void ddp_tensors_free(ddp_tensor_file *f);
const ddp_tensor_in *ddp_tensors_find(const ddp_tensor_file *f, const char *name); /* NULL: none */
const char *ddp_tensors_meta(const ddp_tensor_file *f, const char *key);           /* NULL: none */
/* count elements of a tensor (any float dtype) as f32 or f64 values at dst. */
void ddp_tensor_values(const ddp_tensor_file *f, const ddp_tensor_in *e, bool f64, void *dst, int64_t count);

const char *ddp_dtype_name(const ddp_program *p); /* "F32", "F64" */
/* The model's parameters and statistics as tensors named as the program names them
 * ("model.label.weight"); *n of them, malloc'd (NULL: out of memory). */
ddp_tensor_out *ddp_param_tensors(ddp_runtime *rt, int64_t *n);
/* "name:layout,..." of every tensor, for the metadata. */
ddp_text ddp_layouts_text(const ddp_program *p);

/* The parameters and statistics, atomically; the header's metadata holds the program
 * hash, each tensor's layout and the nextra (at most 4) strings of extra. */
bool ddp_save_params(ddp_runtime *rt, const char *path, const ddp_meta *extra, int nextra, char *err,
                     size_t errlen);
/* Reads every parameter and statistic from a safetensors file (a checkpoint too), each
 * checked by name, dtype and shape, and sets ema's average (a checkpoint's own, else
 * the parameters); note gets a line worth showing (another program's hash) or "". */
bool ddp_load_params(ddp_runtime *rt, const char *path, char *note, size_t notelen, char *err, size_t errlen);

/* ----------------------------------------------------------- tensorboard.c */

/* TensorBoard's event file in dir: its file_version record, and with resumed_step >= 0
 * a SessionLog START there (TensorBoard then drops the points of later steps that the
 * stopped run wrote). NULL with err. */
typedef struct ddp_events ddp_events;
ddp_events *ddp_events_open(const char *dir, int64_t resumed_step, char *err, size_t len);
void ddp_events_scalar(ddp_events *ev, int64_t step, const char *tag, double value); /* NULL ev: nothing */
void ddp_events_flush(ddp_events *ev);
void ddp_events_close(ddp_events *ev);
/* The TFRecord checksum: CRC-32C, rotated right by 15 bits, plus 0xa282ead8. */
uint32_t ddp_masked_crc32c(const void *data, size_t len);

/* ---------------------------------------------------------------- report.c */

enum { DDP_MAX_METRICS = 16 };

/* A pass's figures from the accumulators' (sum, count) pairs. */
typedef struct ddp_figures {
    double loss;                /* mean loss per sample */
    double metric[DDP_MAX_METRICS]; /* the program's metrics, in its order */
    int64_t samples;
} ddp_figures;

/* A validation figure watched over the run (save_best, early_stopping): the best
 * value so far, the step after which it was measured, and the validations since then
 * that did not improve on it. */
typedef struct ddp_watch {
    double best;                /* NAN: none yet */
    int64_t step;
    int64_t since;
} ddp_watch;

/* What an epoch did, for its line and its JSON object. */
typedef struct ddp_epoch_result {
    int64_t epoch;              /* from 1 */
    int64_t step;               /* optimizer steps so far */
    ddp_figures train;
    const ddp_figures *validation; /* NULL: none this epoch */
    bool validated_at_end;      /* validation is the epoch end's (not told before) */
    double learning_rate, samples_per_sec, seconds;
} ddp_epoch_result;

/* Everything a run prints (worker 0 only) and its --metrics file. */
typedef struct ddp_report ddp_report;
ddp_report *ddp_report_open(const ddp_config *cfg, const ddp_program *p, bool quiet, char *err, size_t errlen);
void ddp_report_close(ddp_report *r);
void ddp_report_banner(ddp_report *r, const ddp_runtime *rt, const ddp_data *train, const ddp_data *validation,
                       const ddp_epoch_plan *plan);
/* Step `step` (from 1) of `steps` of an epoch is done: a progress bar or line. */
/* global_step: the run's steps so far, for TensorBoard's scalars (every --log-every
 * steps and at an epoch's end). */
void ddp_report_step(ddp_report *r, int64_t epoch, int64_t step, int64_t steps, int64_t global_step,
                     const ddp_figures *running, double samples_per_sec, double learning_rate);
void ddp_report_validation(ddp_report *r, int64_t step, const ddp_figures *v);
void ddp_report_epoch(ddp_report *r, const ddp_epoch_result *e);
void ddp_report_evaluation(ddp_report *r, const ddp_data *validation, const ddp_figures *v, double seconds);
/* Where a run writes and where it starts, for the banner. */
typedef struct ddp_run_start {
    const char *run_dir, *checkpoint_dir;
    const char *resumed;        /* the checkpoint it continues, as said; "" for a new run */
    int64_t epoch, batch, step; /* the place of the next step */
    int64_t steps;              /* an epoch's */
} ddp_run_start;

/* --check: all that the run needs was read and tried (with s, training's: its run
 * folder and any checkpoint it resumes; NULL for an evaluation), and it stops there. */
void ddp_report_checked(ddp_report *r, const ddp_run_start *s, int64_t workers);
/* samples: over the whole run; session_samples: since this process started (a
 * resumed run's rate). */
void ddp_report_summary(ddp_report *r, int64_t epochs, int64_t steps, int64_t samples, int64_t session_samples,
                        double seconds, const ddp_figures *last_validation, const char *saved_to);
/* --find-lr's steps: the rate, the step's loss and the smoothed loss of each. */
typedef struct ddp_lr_sweep {
    const char *path;
    double *rate, *loss, *smoothed;
    int64_t steps;
    const char *ended;          /* why it ended there */
} ddp_lr_sweep;
/* Worker 0: every step written to out (CSV; a write error in err) and the suggestion
 * said: the rate where the smoothed loss falls fastest before its lowest. */
bool ddp_report_lr_sweep(ddp_report *r, const ddp_lr_sweep *s, FILE *out, char *err, size_t errlen);
/* The sweep's progress after its last step: a bar on a terminal, else a line at the
 * first step and every tenth of them. */
void ddp_report_sweep_step(ddp_report *r, const ddp_lr_sweep *s);
/* The validation figure save_best, early_stopping or reduce_lr watches (0 the loss,
 * 1 + i metric i), as the progress lines name it: "val_loss", "val_accuracy" (a
 * static buffer). */
const char *ddp_watched_name(const ddp_program *p, int64_t which);
/* The validation after `step` improved on save_best's figure, now `value`: its
 * parameters are in path. */
void ddp_report_best(ddp_report *r, double value, int64_t step, const char *path);
/* reduce_lr lowers the rate to `rate`: its figure has not improved on w->best for
 * w->since validations. */
void ddp_report_rate_reduced(ddp_report *r, const ddp_watch *w, double rate);
/* Early stopping ends training: its figure has not improved on w->best for w->since
 * validations; the run's epochs end with `epoch` (from 1). */
void ddp_report_stopped_early(ddp_report *r, const ddp_watch *w, int64_t epoch);
/* The banner's lines of the run folder and any resume; metrics.jsonl opened there (cut
 * back to the checkpoint's step when resuming). */
bool ddp_report_run(ddp_report *r, const ddp_run_start *s, char *err, size_t errlen);
/* Ends a progress bar's line before a message goes to stderr. */
void ddp_report_interrupt(ddp_report *r);

/* ------------------------------------------------------------ checkpoint.c */

/* Where a run is at a step boundary: what a checkpoint holds beside the tensors. */
typedef struct ddp_progress {
    int64_t step;               /* optimizer steps done */
    int64_t epoch, batch;       /* the epoch in progress (from 0) and its batches done */
    int64_t samples;            /* trained on, over all workers */
    int64_t validated_step;     /* the step after which last_validation was taken */
    bool validated, epoch_validated; /* a validation ever; one during this epoch */
    ddp_figures last_validation;
    ddp_watch best, stopping;   /* save_best's and early_stopping's */
    ddp_watch plateau;          /* reduce_lr's, its count since the best or the last reduction */
    double rate_scale;          /* reduce_lr's reductions so far */
} ddp_progress;

typedef struct ddp_checkpoint {
    const char *dir;            /* the folder of step-*.safetensors, there already */
    int64_t keep;               /* the newest kept */
    const char *reason;         /* "every 5 epochs", "SIGUSR1", ... */
    const char *run_settings;   /* "key value" lines of the run's settings in effect */
    const char *program_settings; /* ddp_settings_text */
    ddp_progress progress;
} ddp_checkpoint;

/* Every field of the program's settings as "program.key value" lines (text.s malloc'd). */
ddp_text ddp_settings_text(const ddp_settings *s);
/* Every worker calls it at the same step; worker 0 writes c->dir/step-N.safetensors
 * (its name in path on every worker). The host mirrors of the parameters, state,
 * statistics and accumulators must be current. */
bool ddp_checkpoint_save(ddp_runtime *rt, ddp_ring *ring, const ddp_checkpoint *c, char *path, size_t pathlen,
                         char *err, size_t errlen);
/* Every worker calls it: worker 0 reads the newest valid checkpoint of where (a folder
 * or a file), compares its settings with c's (refused with each difference unless
 * allow_changed) and sends it to the others; each takes its state into the host
 * mirrors and *g. said: what the banner says of it. */
bool ddp_checkpoint_resume(ddp_runtime *rt, ddp_ring *ring, const ddp_checkpoint *c, const char *where,
                           bool allow_changed, ddp_progress *g, char *said, size_t saidlen, char *err,
                           size_t errlen);
/* Whether dir holds a checkpoint. */
bool ddp_checkpoint_exists(const char *dir);

/* --------------------------------------------------------------- run_dir.c */

/* Where a run writes, and the checkpoint it continues (worker 0's decision, every
 * worker told). */
typedef struct ddp_run_place {
    char run_dir[2048], checkpoint_dir[2048];
    char resume_from[2048];     /* a checkpoint or a folder of them; "" for a new run */
    bool resume, refused;
    char note[512];             /* "", or how the resume came about (a requeued job) */
} ddp_run_place;

bool ddp_run_place_find(const ddp_config *cfg, const ddp_program *p, ddp_ring *ring, ddp_run_place *place, char *err,
                        size_t len);
/* `scontrol requeue JOBID`: false with why it failed. */
bool ddp_requeue_job(const ddp_cluster *c, char *err, size_t len);

/* ----------------------------------------------------------------- train.c */

/* The job around one worker: NULL members for one worker alone. */
typedef struct ddp_job {
    ddp_link *link;
    ddp_ring *ring;
    ddp_nccl *nccl;             /* the gradients' sums between GPUs; NULL: the ring's */
    ddp_trace *trace;
    char why[1024];             /* the message this worker failed with, for the others */
} ddp_job;

/* The status of a worker that failed: 1 for an error of its own, 3 when it lost a
 * worker of the job (S12), whether a collective, NCCL or the coordinator brought the
 * news, or the lost worker's own status when that one reported an error. */
int ddp_job_failure_status(ddp_job *job);

/* Whether every worker of the ring holds worker 0's parameters and running
 * statistics bit for bit (S5 at the start; at the end, the proof that every update
 * was the same). Every worker learns which ranks differ, so all stop alike; `when`
 * and `hint` start and end the message. */
bool ddp_parameters_agree(ddp_runtime *rt, ddp_ring *ring, const char *when, const char *hint, char *err,
                          size_t errlen);

/* Trains for cfg's epochs (validating as the program says) or, with cfg->evaluate,
 * only evaluates; saves to cfg->save_path at the end; writes the trace. With a ring,
 * as one worker of cfg->cluster's job. Returns the exit status (3: a worker of the
 * job was lost). */
int ddp_run(ddp_runtime *rt, const ddp_config *cfg, ddp_data *train, ddp_data *validation, ddp_report *report,
            ddp_job *job);

/* ----------------------------------------------------------------- start.c */

/* A built program's main: returns its exit status. */
int ddp_main(const ddp_program *p, int argc, char **argv);

/* ------------------------------------------------------------------ gpu.c */

struct ddp_device;
typedef struct ddp_gpu ddp_gpu;
/* The schedule run on dev from now on (the runtime owns dev then, even on failure):
 * regions on the device, the host's mirrors of them pinned where copies overlap work. */
bool ddp_gpu_attach(ddp_runtime *rt, struct ddp_device *dev, char *err, size_t len);
void ddp_gpu_detach(ddp_runtime *rt);
bool ddp_gpu_run_steps(ddp_runtime *rt, int phase, int64_t first, int64_t count, int64_t sequence,
                       int64_t position);
/* The blocks of k's index launch over `indices` indices (ddp_abi.h's DDP_LAUNCH_INDEX). */
int64_t ddp_index_grid(const ddp_kernel *k, int64_t indices);
/* The convolutions' ddp_path this runtime takes (the library's on a device that has one). */
int ddp_gpu_path(const ddp_runtime *rt);
/* Whether cuDNN's engines are chosen by timing them (--conv-search timed on a GPU that
 * runs cuDNN). */
bool ddp_gpu_times_engines(const ddp_runtime *rt);
/* How this runtime runs the convolutions, for the banner. */
const char *ddp_gpu_convolutions(const ddp_runtime *rt);
/* A region's host mirror onto the device (queued, in order with the steps), or the
 * device's region into the mirror (waits for it); both no-ops on the CPU. False with
 * rt->device_error. */
bool ddp_to_device(ddp_runtime *rt, int region);
bool ddp_to_host(ddp_runtime *rt, int region);
/* The same for bytes [offset, offset + bytes) of the device's region and any host
 * memory that size (up: to the device); on a GPU only. */
bool ddp_gpu_exchange(ddp_runtime *rt, int region, int64_t offset, int64_t bytes, void *host, bool up);
/* Before the loader writes a batch into the input region's mirror: the last upload
 * has read it. After: the batch goes up while the current step runs. */
bool ddp_batch_writable(ddp_runtime *rt);
bool ddp_batch_uploaded(ddp_runtime *rt);
bool ddp_gpu_zero(ddp_runtime *rt, int region);
/* The accumulators and the flag on their way to their mirror behind the work queued so
 * far, without waiting; then, when the host needs them, waiting for them alone. */
bool ddp_accumulators_send(ddp_runtime *rt);
bool ddp_accumulators_arrived(ddp_runtime *rt);
/* Waits for every queued step; true on the CPU. */
bool ddp_gpu_synchronize(ddp_runtime *rt);
/* With several workers, the gradients summed bucket by bucket as backward marks them:
 * through NCCL on the device (the runtime uses n, the caller owns it), or through the
 * ring, each bucket copied into the gradient mirror (pinned from now on), handed to the
 * host by ddp_gpu_next_bucket in the order marked: 1 a bucket's copy arrived (-1 for
 * the whole vector), 0 none left this step, -1 the device failed. */
bool ddp_gpu_sum_with_nccl(ddp_runtime *rt, ddp_nccl *n);
int ddp_gpu_stage_buckets(ddp_runtime *rt, char *err, size_t len); /* 1 staged, 0 too many buckets, -1 err */
struct ddp_device *ddp_gpu_device(const ddp_runtime *rt);          /* NULL on the CPU */
int ddp_gpu_next_bucket(ddp_runtime *rt, int64_t *bucket);
/* Whether backward's markers act (so backward runs call by call). */
bool ddp_gpu_buckets_summed(const ddp_runtime *rt);
const struct ddp_device_info *ddp_gpu_info(const ddp_runtime *rt); /* NULL on the CPU */
const char *ddp_gpu_backend(const ddp_runtime *rt);                  /* "cuda", "emulated", "cpu" */

/* -------------------------------------------------------- learning_rate.c */

double ddp_rt_eval(const ddp_rt_expr *e, double replicas, double workers, double global_batch);
/* The learning rate of step (0-based) of a run of epochs of steps_per_epoch steps;
 * rate_override, unless NAN, replaces the schedule's base rate (its peak). */
double ddp_learning_rate(const ddp_program *p, double rate_override, int64_t epochs, int64_t step,
                         int64_t steps_per_epoch, double replicas, double workers, double global_batch);
/* Sets the step's scalars: learning rate, weight decay, bias corrections, step. */
void ddp_prepare_step(ddp_runtime *rt, int64_t step, int64_t steps_per_epoch);

#endif
