/* device.h: a GPU as the runtime's GPU executor (gpu.c) sees it, whichever backend
 * serves it: CUDA (device_cuda.c: the driver and cuBLAS, found and loaded at run time)
 * or the emulated device (device_emulated.c: the GPU module's own kernels compiled for
 * this machine, run with the GPU's launch geometry and held to the GPU's rules).
 *
 * The rules, which the emulated device enforces where a GPU would fail:
 *   - device memory is an address the host cannot touch: data cross only by copies;
 *   - work is queued on a stream and runs in the stream's order, but not before the
 *     call that queues it returns: its results reach the host once an event recorded
 *     after them has completed, or the device has been synchronised; a copy from
 *     pinned host memory reads it when it runs, one from ordinary memory when queued;
 *   - a kernel runs as a grid of blocks of threads; a block's threads share its shared
 *     memory and meet at barriers, at most 1024 threads and 48 KB a block;
 *   - matrix products follow cuBLAS: column-major, each operand with its leading
 *     dimension, checked as cuBLAS checks them.
 * Every operation returns false on failure, with the reason in the device's `error`. */
#ifndef DDP_DEVICE_H
#define DDP_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp_abi.h"

typedef uint64_t ddp_dptr;      /* a device address */

/* The streams: the schedule's, the next batch's upload, the gradients' collectives. */
enum { DDP_STREAM_COMPUTE, DDP_STREAM_UPLOAD, DDP_STREAM_COMM, DDP_STREAMS };
/* Events are numbered 0..DDP_EVENTS-1: the executor's own below DDP_BUCKET_EVENT(0, 0),
 * then two for each of the first DDP_MAX_BUCKET_EVENTS gradient buckets (its collective
 * begun, ended). */
enum { DDP_MAX_BUCKET_EVENTS = 128, DDP_EVENTS = 8 + 2 * DDP_MAX_BUCKET_EVENTS };
#define DDP_BUCKET_EVENT(bucket, ended) (8 + 2 * (int)(bucket) + ((ended) ? 1 : 0))
enum { DDP_GRAPHS = 8 };        /* captured graphs are numbered 0..DDP_GRAPHS-1 */
enum { DDP_MARKS = 4096 };      /* timing marks (--profile) are numbered 0..DDP_MARKS-1 */
enum { DDP_MAX_BLOCK_THREADS = 1024, DDP_MAX_SHARED_BYTES = 48 * 1024 };

typedef struct ddp_device_info {
    char name[128];
    char uuid[48];              /* "GPU-8c3e..." */
    char bus[32];               /* "0000:1b:00.0" */
    int64_t free_bytes, total_bytes;
    int driver_version;         /* 13000 for CUDA 13.0 */
} ddp_device_info;

/* C = alpha op(A) op(B) + beta C, column-major as cuBLAS's gemm: op(A) is m x k. With
 * batch above 1, batch such products, the i-th's operands i strides (elements) on, as
 * cuBLAS's strided batched gemm. */
typedef struct ddp_device_gemm {
    bool transa, transb;
    int m, n, k;
    double alpha, beta;
    ddp_dptr a, b, c;
    int lda, ldb, ldc;
    int batch;
    int64_t stride_a, stride_b, stride_c;
    bool f64;
    bool bf16;                  /* A and B are bf16, the products summed in f32 (precision = bf16) */
    bool c_bf16;                /* ... and C is bf16 too (else f32) */
} ddp_device_gemm;

/* C = alpha op(A) op(B) + beta C with g's arguments on host memory (its ddp_dptr fields
 * host addresses): the products and sums in double, in a fixed order, rounded once
 * into C; with tf32 an f32 factor is first rounded as the tensor cores read it. False
 * when it has no memory for its copies of the factors (gemm_reference.c). */
bool ddp_gemm_reference(const ddp_device_gemm *g, bool tf32);

/* A convolution as cuDNN runs it, channels last: x is N x H x W x C, y is N x OH x OW x
 * K, the filters w are K x R x S x C (cuDNN's NHWC filter format, "KRSC"; the program's
 * saved layout is HWIO, turned by a kernel of the schedule before and after). Cross-
 * correlation, as every framework's "convolution":
 *   y[n,p,q,k] = sum_{r,s,c} x[n, p*stride0 - pad_before0 + r*dilation0,
 *                              q*stride1 - pad_before1 + s*dilation1, c] * w[k,r,s,c]
 * with x zero outside the image. The mode says which of the three tensors is written
 * (the others are read): DDP_CONV_FORWARD y, DDP_CONV_BACKWARD_DATA x (from y's
 * gradient), DDP_CONV_BACKWARD_FILTER w (from x and y's gradient); the written one
 * becomes alpha * result + beta * itself, beta 0 or 1 (ddp_conv_mode: ddp_abi.h). */
typedef struct ddp_device_conv {
    int mode;                   /* ddp_conv_mode */
    int n, h, w, c;             /* the image */
    int k, r, s;                /* filters, and their height and width */
    int oh, ow;                 /* the output */
    int stride[2], dilation[2], pad_before[2], pad_after[2]; /* [height, width] */
    double beta;
    ddp_dptr x, filters, y;
    ddp_dptr workspace;         /* scratch the library may use, workspace_bytes of it */
    size_t workspace_bytes;
    bool f64;
    bool tf32;                  /* f32 products may read TF32 factors (tensor cores) */
    bool bf16;                  /* x, filters and y are bf16, the sums f32 (precision = bf16) */
    bool planning;              /* the start's trial (gpu.c plan_convolutions), whose output
                                   nothing reads: cuDNN picks its plan, the emulated device
                                   checks the call and computes nothing */
} ddp_device_conv;

typedef struct ddp_device ddp_device;

typedef struct ddp_device_backend {
    const char *name;           /* "cuda", "emulated" */
    void (*close)(ddp_device *d);
    bool (*alloc)(ddp_device *d, size_t bytes, ddp_dptr *p);
    void *(*host_alloc)(ddp_device *d, size_t bytes); /* pinned, zeroed; NULL when it cannot */
    void (*host_free)(ddp_device *d, void *p);
    bool (*upload)(ddp_device *d, int stream, ddp_dptr to, const void *from, size_t bytes);
    bool (*download)(ddp_device *d, int stream, void *to, ddp_dptr from, size_t bytes);
    bool (*copy)(ddp_device *d, int stream, ddp_dptr to, ddp_dptr from, size_t bytes);
    bool (*fill)(ddp_device *d, int stream, ddp_dptr to, unsigned char byte, size_t bytes);
    /* kernel k of the program, on grid blocks of threads with shared bytes each */
    bool (*launch)(ddp_device *d, int stream, int64_t k, uint32_t grid, uint32_t threads, uint32_t shared,
                   ddp_dptr args, ddp_dptr scalars, int64_t begin, int64_t end);
    bool (*gemm)(ddp_device *d, int stream, const ddp_device_gemm *g);
    bool (*record)(ddp_device *d, int stream, int event);
    bool (*wait)(ddp_device *d, int stream, int event); /* later work on stream waits for event */
    bool (*synchronize_event)(ddp_device *d, int event);
    bool (*synchronize)(ddp_device *d);
    /* Stream capture, as CUDA graphs: the work queued on `stream` from capture_begin to
     * capture_end is not run but kept, as it was queued (sizes, addresses and launch
     * geometry fixed then), as graph `graph`; graph_launch queues all of it again on a
     * stream, as one operation. While a stream captures, synchronising, copies from or
     * to ordinary (pageable) host memory on it and events across the capture's edge are
     * refused (and end the capture in failure), as CUDA refuses them. A pinned source is
     * read when the graph runs. */
    bool (*capture_begin)(ddp_device *d, int stream);
    bool (*capture_end)(ddp_device *d, int stream, int graph);
    bool (*graph_launch)(ddp_device *d, int stream, int graph);
    /* Timing (--profile), as CUDA's timing events: mark `i` takes the time at which the
     * stream's work queued before it has run; elapsed waits for mark `to` and gives
     * the seconds from mark `from` to it. */
    bool (*mark)(ddp_device *d, int stream, int i);
    bool (*elapsed)(ddp_device *d, int from, int to, double *seconds);
    /* The convolution c queued on the stream, as the library runs it (cuDNN, or the
     * emulated device's reference); NULL: this device runs no library convolutions (the
     * schedule's generated steps do). */
    bool (*conv)(ddp_device *d, int stream, const ddp_device_conv *c);
    /* The stream's native handle, for a library that queues its own work on it (NCCL):
     * a CUstream on CUDA, a ddp_emulated_stream (nccl_api.h) on the emulated device. */
    void *(*native_stream)(ddp_device *d, int stream);
    /* Whether the work queued before the event's last record has run: 1 yes (or the
     * event was never recorded), 0 not yet, -1 the device failed. It never waits and
     * may be called from any thread (a watchdog's). */
    int (*event_done)(ddp_device *d, int event);
    /* The host runs the queued work when it waits (the emulated device): an event is
     * done only once a synchronisation has run it, so a poll must end in one. */
    bool host_runs_queue;
} ddp_device_backend;

struct ddp_device {
    const ddp_device_backend *ops;
    const ddp_program *program;
    ddp_device_info info;
    char error[2048];           /* why the last operation failed */
    /* How this device runs convolutions, for the banner: "cuDNN: PATH (cuDNN 9.x.y)", "the emulated
     * device's reference convolution", or "generated kernels: " and why not cuDNN. */
    char convolutions[256];
    /* cuDNN's engine for a convolution chosen by timing the first it ranks (--conv-search
     * timed) rather than taking its first; set before the first convolution */
    bool timed_conv_search;
    void *state;                /* the backend's */
};

/* The CUDA device `ordinal` of those visible to this process; false with why not. */
bool ddp_device_open_cuda(const ddp_program *p, int ordinal, ddp_device **out, char *err, size_t len);
/* How many CUDA devices this process sees; -1 with why when the driver is unusable. */
int ddp_cuda_device_count(char *err, size_t len);
/* x as the emulated tensor cores read a factor under precision = tf32 (PTX
 * cvt.rna.tf32.f32): 10 bits of mantissa, to nearest with ties away from zero;
 * infinities and NaN kept, a value past the largest TF32 rounded to infinity. */
float ddp_tf32_round(float x);
/* The emulated device, running the program's GPU module compiled for the host. */
bool ddp_device_open_emulated(const ddp_program *p, ddp_device **out, char *err, size_t len);
void ddp_device_close(ddp_device *d);

/* ddp_device_fail(d, fmt, ...): the reason into d->error; false. */
bool ddp_device_fail(ddp_device *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
