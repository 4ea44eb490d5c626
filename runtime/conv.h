/* conv.h: the convolutions of device.h (ddp_device_conv) as three things run them: the
 * reference on host memory (conv_reference.c), which the emulated device runs as its
 * cuDNN and the tests hold everything else to; the CPU's own, by tiles of columns and
 * OpenBLAS products (conv_cpu.c); and cuDNN 9 through its backend graph API (cudnn.c),
 * loaded when a GPU run asks for it, so that a program starts without it and a machine
 * without it falls back to the program's own convolution kernels. */
#ifndef DDP_CONV_H
#define DDP_CONV_H

#include <stdbool.h>
#include <stddef.h>

#include "device.h"

/* The mode's result written into its tensor (y, x or filters, by c->mode), on host
 * memory: c's ddp_dptr fields are ignored, the three tensors are the pointers given,
 * f32 or f64 as c->f64 says. Products and sums are formed in double in a fixed order
 * and rounded once into the written tensor; with c->tf32 an f32 factor is first
 * rounded as the tensor cores read it (ddp_tf32_round). */
void ddp_conv_reference(const ddp_device_conv *c, void *x, void *filters, void *y);

/* Scratch the CPU's convolution keeps between calls, grown to the largest asked for;
 * its owner frees it with ddp_conv_scratch_free. */
typedef struct ddp_conv_scratch {
    void *base;
    size_t bytes;
} ddp_conv_scratch;
typedef struct ddp_pool ddp_pool;

/* The mode's result written into its tensor on host memory, as ddp_conv_reference's
 * arguments (f32 or f64: not bf16; TF32 is ignored, as by the CPU's products), split
 * among the pool's threads: the same bits for any number of threads. Each sum is
 * formed in the tensor's type by OpenBLAS, a tile of rows after another, or with `wide`
 * (the CPU has AVX2 and FMA) a narrow convolution's by FMA, term after term
 * (conv_cpu.c). false when the scratch could not grow, nothing written. */
bool ddp_conv_cpu(ddp_pool *pool, ddp_conv_scratch *scratch, const ddp_device_conv *c, void *x, void *filters,
                  void *y, bool wide);
void ddp_conv_scratch_free(ddp_conv_scratch *s);
/* Whether ddp_conv_cpu runs c by the narrow kernels: with `wide`, f32, the forward or the
 * filters' gradient, outputs in eights, at most 160 columns (R x S x C), not read in place. */
bool ddp_conv_narrow(const ddp_device_conv *c, bool wide);

/* The checks cuDNN makes of a convolution's descriptor (CUDNN_STATUS_BAD_PARAM): the
 * mode, beta 0 or 1, no empty tensor, strides and dilations of at least 1, padding of
 * at least 0, and the output size that follows from the rest. false with why in err. */
bool ddp_conv_check(const ddp_device_conv *c, char *err, size_t len);

/* cuDNN: a handle bound to one CUDA stream, and execution plans made for it. */
typedef struct ddp_cudnn ddp_cudnn;
typedef struct ddp_cudnn_plan ddp_cudnn_plan;

/* libcudnn.so.9 loaded (DDP_CUDNN_LIBRARY names exactly the file; otherwise the places
 * ddp_cuda_library_open searches), refused when older than 9.0, and a handle made
 * whose work goes to cuda_stream (a CUstream). NULL with why in err. */
ddp_cudnn *ddp_cudnn_open(void *cuda_stream, char *err, size_t len);
void ddp_cudnn_close(ddp_cudnn *h);
/* "/usr/lib/x86_64-linux-gnu/libcudnn.so.9 (cuDNN 9.19.0)": what ddp_cudnn_open loaded. */
const char *ddp_cudnn_library(void);

/* How a GPU times a plan: time() runs p on c's pointers and says how long a run takes,
 * in seconds; false with why in err. */
typedef struct ddp_cudnn_timing {
    bool (*time)(void *ctx, ddp_cudnn *h, const ddp_cudnn_plan *p, const ddp_device_conv *c, double *seconds,
                 char *err, size_t len);
    void *ctx;
} ddp_cudnn_timing;

/* An execution plan for the convolution c: the first engine cuDNN's heuristics offer
 * (or, when they offer none usable, the first of all engines) that is deterministic,
 * keeps f32 products in f32 unless c->tf32, finalizes, and needs at most
 * c->workspace_bytes of workspace. With timing, the fastest of the first 8 the
 * heuristics offer that qualify, each timed on c's pointers: the runs write c's
 * output, which the caller keeps if it matters. The tensors' alignment is read from
 * c's pointers (at most 16 bytes); a run with pointers less aligned is refused. false
 * with every engine rejected and why, or why the timing failed. */
bool ddp_cudnn_plan_conv(ddp_cudnn *h, const ddp_device_conv *c, const ddp_cudnn_timing *timing,
                         ddp_cudnn_plan **out, char *err, size_t len);
void ddp_cudnn_plan_free(ddp_cudnn_plan *p);
/* "engine 12, knobs 2=3 14=1" (and ", the fastest of 8 timed (0.123 ms)"): which
 * engine runs it, for the log. */
const char *ddp_cudnn_plan_name(const ddp_cudnn_plan *p);
size_t ddp_cudnn_plan_workspace(const ddp_cudnn_plan *p);
/* The convolution queued on the handle's stream, on c's pointers (the shapes must be
 * those planned). Neither synchronises nor allocates device memory, so it can be
 * captured into a CUDA graph. */
bool ddp_cudnn_run(ddp_cudnn *h, const ddp_cudnn_plan *p, const ddp_device_conv *c, char *err, size_t len);

/* A CUDA library (name: "libcudnn.so.9"; wheel: the folder of its Python wheel below
 * site-packages/nvidia, "cudnn") dlopened from the first place that has it: the
 * folders of DDP_CUDA_LIBRARY_PATH alone when set; else CUDA_HOME, CUDA_PATH and
 * /usr/local/cuda (lib64, targets/x86_64-linux/lib), LD_LIBRARY_PATH, the wheel folders
 * of the active Python environments, of those on PATH and of the system's, and last
 * the loader's own search. Its path into path; every place tried appended to tried
 * (", "-separated). NULL when none has it. */
void *ddp_cuda_library_open(const char *name, const char *wheel, char *path, size_t path_len, char *tried,
                            size_t tried_len);
/* The same, unless the environment variable `chosen` names the very file: that file
 * or NULL with why in err ("cuDNN, DDP_CUDNN_LIBRARY=... cannot be loaded"; what names
 * the library). NULL with err "" when the search found nothing (tried says where). */
void *ddp_cuda_library_chosen(const char *chosen, const char *what, const char *name, const char *wheel, char *path,
                              size_t path_len, char *tried, size_t tried_len, char *err, size_t len);

#endif
