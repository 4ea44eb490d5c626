/* device_cuda.c: an NVIDIA GPU through the CUDA driver and cuBLAS, both loaded when a
 * GPU run is asked for, so a built program starts with only libc and libm and runs
 * on machines without them.
 *
 * The driver is libcuda.so.1 (the loader's own search, then the usual folders, or
 * exactly the file DDP_CUDA_DRIVER names); its
 * entry points come from cuGetProcAddress at the ABI of CUDA 12.0. A driver older than
 * the PTX needs (ISA 7.5: CUDA 11.5) is refused with both versions named. The PTX is
 * loaded with its JIT log shown on failure. cuBLAS is libcublas.so.13, else .so.12,
 * whichever the driver supports, from CUDA's folders, LD_LIBRARY_PATH and Python's
 * nvidia/cublas/lib wheel folders (DDP_CUDA_LIBRARY_PATH, a list of folders, replaces
 * them all); a missing one is named with every place searched. Two streams (compute,
 * uploads), each with its cuBLAS handle and workspace. Under precision = bf16 the
 * products of bf16 operands go to cublasGemmEx, summed in f32, and a GPU without bf16
 * tensor cores (compute capability below 8.0) is refused as it is opened, named with
 * its capability.
 *
 * Convolutions go to cuDNN (cudnn.c) on the compute stream when it loads: a device
 * without it (or with DDP_CUDNN=0) has no conv op, and the schedule's generated steps
 * run its convolutions. A plan is made on a shape's first run and kept; a CUDA graph's
 * capture finds every plan made, since each phase runs once uncaptured first. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "device.h"
#include "runtime.h"

enum { PTX_NEEDS = 11050, CUBLAS_WORKSPACE = 32 << 20, CONV_KEY = 26, BF16_NEEDS = 80 };

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent, *CUgraph, *CUgraphExec, *cublasHandle_t;
typedef struct {
    char bytes[16];
} CUuuid;

/* The driver's entry points this file uses, by their base names. */
#define DRIVER_CALLS(X)                                                                                      \
    X(cuInit, (unsigned))                                                                                    \
    X(cuDriverGetVersion, (int *))                                                                           \
    X(cuDeviceGetCount, (int *))                                                                             \
    X(cuDeviceGet, (CUdevice *, int))                                                                        \
    X(cuDeviceGetName, (char *, int, CUdevice))                                                              \
    X(cuDeviceGetAttribute, (int *, int, CUdevice))                                                          \
    X(cuDeviceGetUuid, (CUuuid *, CUdevice))                                                                 \
    X(cuDeviceGetPCIBusId, (char *, int, CUdevice))                                                          \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                                     \
    X(cuDevicePrimaryCtxRelease, (CUdevice))                                                                 \
    X(cuCtxSetCurrent, (CUcontext))                                                                          \
    X(cuCtxSynchronize, (void))                                                                              \
    X(cuMemGetInfo, (size_t *, size_t *))                                                                    \
    X(cuModuleLoadDataEx, (CUmodule *, const void *, unsigned, int *, void **))                              \
    X(cuModuleUnload, (CUmodule))                                                                            \
    X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                                           \
    X(cuMemAlloc, (CUdeviceptr *, size_t))                                                                   \
    X(cuMemFree, (CUdeviceptr))                                                                              \
    X(cuMemHostAlloc, (void **, size_t, unsigned))                                                           \
    X(cuMemFreeHost, (void *))                                                                               \
    X(cuMemcpyHtoDAsync, (CUdeviceptr, const void *, size_t, CUstream))                                      \
    X(cuMemcpyDtoHAsync, (void *, CUdeviceptr, size_t, CUstream))                                            \
    X(cuMemcpyDtoDAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                       \
    X(cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))                                       \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,     \
                       CUstream, void **, void **))                                                          \
    X(cuStreamCreate, (CUstream *, unsigned))                                                                \
    X(cuStreamDestroy, (CUstream))                                                                           \
    X(cuStreamWaitEvent, (CUstream, CUevent, unsigned))                                                      \
    X(cuEventCreate, (CUevent *, unsigned))                                                                  \
    X(cuEventDestroy, (CUevent))                                                                             \
    X(cuEventRecord, (CUevent, CUstream))                                                                    \
    X(cuEventQuery, (CUevent))                                                                               \
    X(cuEventSynchronize, (CUevent))                                                                         \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                                       \
    X(cuStreamBeginCapture, (CUstream, int))                                                                 \
    X(cuStreamEndCapture, (CUstream, CUgraph *))                                                             \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long))                             \
    X(cuGraphLaunch, (CUgraphExec, CUstream))                                                                \
    X(cuGraphExecDestroy, (CUgraphExec))                                                                     \
    X(cuGraphDestroy, (CUgraph))                                                                             \
    X(cuGetErrorName, (CUresult, const char **))                                                             \
    X(cuGetErrorString, (CUresult, const char **))

#define DECLARE(name, args) CUresult (*name) args;
static struct {
    DRIVER_CALLS(DECLARE)
    void *library;
    char path[512];
} cu;
#undef DECLARE

typedef int (*cublas_fn)();
static struct {
    int (*create)(cublasHandle_t *);
    int (*destroy)(cublasHandle_t);
    int (*set_stream)(cublasHandle_t, CUstream);
    int (*set_workspace)(cublasHandle_t, void *, size_t);
    int (*set_math_mode)(cublasHandle_t, int);
    int (*sgemm)(cublasHandle_t, int, int, int, int, int, const float *, const float *, int, const float *, int,
                 const float *, float *, int);
    int (*dgemm)(cublasHandle_t, int, int, int, int, int, const double *, const double *, int, const double *,
                 int, const double *, double *, int);
    int (*gemm_ex)(cublasHandle_t, int, int, int, int, int, const void *, const void *, int, int, const void *, int,
                   int, const void *, void *, int, int, int, int);
    /* strided batched: each operand's stride (long long) after its leading dimension, the count after C's */
    int (*sgemm_batched)(cublasHandle_t, int, int, int, int, int, const float *, const float *, int, long long,
                         const float *, int, long long, const float *, float *, int, long long, int);
    int (*dgemm_batched)(cublasHandle_t, int, int, int, int, int, const double *, const double *, int, long long,
                         const double *, int, long long, const double *, double *, int, long long, int);
    int (*gemm_ex_batched)(cublasHandle_t, int, int, int, int, int, const void *, const void *, int, int, long long,
                           const void *, int, int, long long, const void *, void *, int, int, long long, int, int,
                           int);
    void *library;
    char path[1024];
} blas;

typedef struct Cuda {
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CUfunction *functions;      /* by kernel index */
    CUstream streams[DDP_STREAMS];
    CUevent events[DDP_EVENTS];
    cublasHandle_t handles[DDP_STREAMS];
    CUdeviceptr workspaces[DDP_STREAMS];
    CUgraph graphs[DDP_GRAPHS];
    CUgraphExec graph_execs[DDP_GRAPHS];
    CUevent *marks;             /* timing events, made as --profile first asks for them */
    bool capturing[DDP_STREAMS]; /* between capture_begin and capture_end */
    ddp_cudnn *dnn;             /* on the compute stream; NULL: no cuDNN */
    struct ConvPlan *plans;     /* each convolution's plan, made on its first run */
    int nplans, plans_cap;
} Cuda;

/* ------------------------------------------------------------- messages */

static const char *describe(CUresult r) {
    static char text[256];
    const char *name = "?", *what = "";
    if (cu.cuGetErrorName)
        cu.cuGetErrorName(r, &name);
    if (cu.cuGetErrorString)
        cu.cuGetErrorString(r, &what);
    snprintf(text, sizeof text, "%s (%d): %s", name ? name : "?", r, what ? what : "");
    return text;
}

static bool check(ddp_device *d, CUresult r, const char *what) {
    return r == 0 || ddp_device_fail(d, "%s: %s", what, describe(r));
}

/* ------------------------------------------------------------- the driver */

static bool load_driver(char *err, size_t len) {
    if (cu.library)
        return true;
    const char *chosen = getenv("DDP_CUDA_DRIVER");
    if (chosen && *chosen) {
        if (!(cu.library = dlopen(chosen, RTLD_NOW | RTLD_LOCAL)))
            return ddp_fail(err, len, "the CUDA driver DDP_CUDA_DRIVER=%s cannot be loaded: %s", chosen, dlerror());
        snprintf(cu.path, sizeof cu.path, "%s", chosen);
    }
    static const char *const places[] = {"libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1",
                                         "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
                                         "/usr/lib/wsl/lib/libcuda.so.1"};
    for (size_t i = 0; i < sizeof places / sizeof *places && !cu.library; i++)
        if ((cu.library = dlopen(places[i], RTLD_NOW | RTLD_LOCAL)))
            snprintf(cu.path, sizeof cu.path, "%s", places[i]);
    if (!cu.library)
        return ddp_fail(err, len, "the CUDA driver (libcuda.so.1) is not installed, or not where the loader, "
                                  "/usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu and /usr/lib64 have it: "
                                  "this machine cannot run GPU code");
    typedef CUresult (*proc_v2)(const char *, void **, int, unsigned long long, int *);
    typedef CUresult (*proc_v1)(const char *, void **, int, unsigned long long);
    proc_v2 get2 = (proc_v2)dlsym(cu.library, "cuGetProcAddress_v2");
    proc_v1 get1 = (proc_v1)dlsym(cu.library, "cuGetProcAddress");
    if (!get2 && !get1)
        return ddp_fail(err, len, "the CUDA driver %s has no cuGetProcAddress: it is older than CUDA 11.3, and "
                                  "the program's PTX needs CUDA 11.5 or newer: update the NVIDIA driver", cu.path);
#define RESOLVE(name, args)                                                                                  \
    if (get2 ? get2(#name, (void **)&cu.name, 12000, 0, NULL) : get1(#name, (void **)&cu.name, 12000, 0))    \
        cu.name = NULL;
    DRIVER_CALLS(RESOLVE)
#undef RESOLVE
    if (!cu.cuDriverGetVersion || !cu.cuInit)
        return ddp_fail(err, len, "the CUDA driver %s does not give its entry points for CUDA 12.0", cu.path);
    return true;
}

/* Whether every entry point resolved; false naming the first missing. */
static bool driver_complete(char *err, size_t len) {
#define PRESENT(name, args)                                                                                  \
    if (!cu.name)                                                                                            \
        return ddp_fail(err, len, "the CUDA driver %s lacks %s (a driver for CUDA 12.0 or newer has it)",      \
                        cu.path, #name);
    DRIVER_CALLS(PRESENT)
#undef PRESENT
    return true;
}

/* The driver, ready, and the version it supports; false with why it cannot run the
 * program's PTX. */
static bool start_driver(int *version, char *err, size_t len) {
    if (!load_driver(err, len))
        return false;
    CUresult r;
    if ((r = cu.cuDriverGetVersion(version)) != 0)
        return ddp_fail(err, len, "the CUDA driver %s cannot say its version: %s", cu.path, describe(r));
    if (*version < PTX_NEEDS)
        return ddp_fail(err, len, "the CUDA driver %s supports CUDA %d.%d, but the program's PTX (ISA 7.5, sm_80) "
                                  "needs CUDA %d.%d or newer: update the NVIDIA driver", cu.path, *version / 1000,
                        *version % 1000 / 10, PTX_NEEDS / 1000, PTX_NEEDS % 1000 / 10);
    if ((r = cu.cuInit(0)) != 0)
        return ddp_fail(err, len, "the CUDA driver %s does not start: %s", cu.path, describe(r));
    return driver_complete(err, len);
}

/* The libraries are loaded once, whichever thread asks first (a process with several
 * GPUs opens each from a thread of its own). */
static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;

static bool driver_ready(int *version, char *err, size_t len) {
    pthread_mutex_lock(&loading);
    bool ok = start_driver(version, err, len);
    pthread_mutex_unlock(&loading);
    return ok;
}

int ddp_cuda_device_count(char *err, size_t len) {
    int version, count = 0;
    if (!driver_ready(&version, err, len))
        return -1;
    CUresult r = cu.cuDeviceGetCount(&count);
    if (r != 0) {
        ddp_fail(err, len, "the CUDA driver cannot count the GPUs: %s", describe(r));
        return -1;
    }
    return count;
}

/* ---------------------------------------------------------------- cuBLAS */

static bool open_blas(int driver_version, char *err, size_t len);

static bool load_blas(int driver_version, char *err, size_t len) {
    pthread_mutex_lock(&loading);
    bool ok = open_blas(driver_version, err, len);
    pthread_mutex_unlock(&loading);
    return ok;
}

static bool open_blas(int driver_version, char *err, size_t len) {
    if (blas.library)
        return true;
    /* the newest cuBLAS the driver runs: 13 needs a CUDA 13 driver */
    const char *names[] = {"libcublas.so.13", "libcublas.so.12"};
    char tried[2048] = "";
    for (int i = driver_version >= 13000 ? 0 : 1; i < 2 && !blas.library; i++)
        blas.library = ddp_cuda_library_open(names[i], "cublas", blas.path, sizeof blas.path, tried, sizeof tried);
    if (!blas.library)
        return ddp_fail(err, len, "cuBLAS (%s) is not installed, or not in any place searched: %.1500s. Install "
                                  "the CUDA toolkit's cuBLAS, or `pip install nvidia-cublas-cu%d`, or name its "
                                  "folder in DDP_CUDA_LIBRARY_PATH", driver_version >= 13000 ? "libcublas.so.13 or "
                                  "libcublas.so.12" : "libcublas.so.12", tried, driver_version >= 13000 ? 13 : 12);
    *(void **)&blas.create = dlsym(blas.library, "cublasCreate_v2");
    *(void **)&blas.destroy = dlsym(blas.library, "cublasDestroy_v2");
    *(void **)&blas.set_stream = dlsym(blas.library, "cublasSetStream_v2");
    *(void **)&blas.set_workspace = dlsym(blas.library, "cublasSetWorkspace_v2");
    *(void **)&blas.set_math_mode = dlsym(blas.library, "cublasSetMathMode");
    *(void **)&blas.sgemm = dlsym(blas.library, "cublasSgemm_v2");
    *(void **)&blas.dgemm = dlsym(blas.library, "cublasDgemm_v2");
    *(void **)&blas.gemm_ex = dlsym(blas.library, "cublasGemmEx");
    *(void **)&blas.sgemm_batched = dlsym(blas.library, "cublasSgemmStridedBatched");
    *(void **)&blas.dgemm_batched = dlsym(blas.library, "cublasDgemmStridedBatched");
    *(void **)&blas.gemm_ex_batched = dlsym(blas.library, "cublasGemmStridedBatchedEx");
    if (!blas.create || !blas.destroy || !blas.set_stream || !blas.set_workspace || !blas.set_math_mode ||
        !blas.sgemm || !blas.dgemm || !blas.gemm_ex || !blas.sgemm_batched || !blas.dgemm_batched ||
        !blas.gemm_ex_batched)
        return ddp_fail(err, len, "%s lacks the functions of cuBLAS 12 (cublasCreate_v2, cublasSgemm_v2, ...)",
                        blas.path);
    return true;
}

/* --------------------------------------------------------------- the ops */

static Cuda *cuda(ddp_device *d) {
    return d->state;
}

static bool alloc(ddp_device *d, size_t bytes, ddp_dptr *p) {
    CUdeviceptr ptr;
    CUresult r = cu.cuMemAlloc(&ptr, bytes ? bytes : 1);
    if (r != 0)
        return ddp_device_fail(d, "allocating %zu bytes on the GPU: %s", bytes, describe(r));
    *p = ptr;
    return true;
}

static void *host_alloc(ddp_device *d, size_t bytes) {
    (void)d;
    void *p = NULL;
    if (cu.cuMemHostAlloc(&p, bytes ? bytes : 1, 0) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

static void host_free(ddp_device *d, void *p) {
    (void)d;
    if (p)
        cu.cuMemFreeHost(p);
}

static bool upload(ddp_device *d, int stream, ddp_dptr to, const void *from, size_t bytes) {
    return bytes == 0 ||
           check(d, cu.cuMemcpyHtoDAsync(to, from, bytes, cuda(d)->streams[stream]), "a copy to the GPU");
}

static bool download(ddp_device *d, int stream, void *to, ddp_dptr from, size_t bytes) {
    return bytes == 0 ||
           check(d, cu.cuMemcpyDtoHAsync(to, from, bytes, cuda(d)->streams[stream]), "a copy from the GPU");
}

static bool copy(ddp_device *d, int stream, ddp_dptr to, ddp_dptr from, size_t bytes) {
    return bytes == 0 ||
           check(d, cu.cuMemcpyDtoDAsync(to, from, bytes, cuda(d)->streams[stream]), "a copy on the GPU");
}

static bool fill(ddp_device *d, int stream, ddp_dptr to, unsigned char byte, size_t bytes) {
    return bytes == 0 || check(d, cu.cuMemsetD8Async(to, byte, bytes, cuda(d)->streams[stream]), "a fill");
}

static bool launch(ddp_device *d, int stream, int64_t k, uint32_t grid, uint32_t threads, uint32_t shared,
                   ddp_dptr args, ddp_dptr scalars, int64_t begin, int64_t end) {
    CUdeviceptr a = args, s = scalars;
    void *params[] = {&a, &s, &begin, &end};
    CUresult r = cu.cuLaunchKernel(cuda(d)->functions[k], grid, 1, 1, threads, 1, 1, shared, cuda(d)->streams[stream],
                                   params, NULL);
    return r == 0 || ddp_device_fail(d, "launching %s (%u blocks of %u threads, %u bytes shared): %s",
                                     d->program->kernels[k].name, grid, threads, shared, describe(r));
}

/* cuBLAS's values for cublasGemmEx (library_types.h, cublas_api.h) */
enum { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUBLAS_COMPUTE_32F = 68, CUBLAS_GEMM_DEFAULT = -1 };

/* precision = bf16: A and B bf16, C bf16 or f32, the products summed in f32 on the
 * tensor cores; alpha and beta are in the compute type, f32. */
static int gemm_bf16(cublasHandle_t h, const ddp_device_gemm *g) {
    float alpha = (float)g->alpha, beta = (float)g->beta;
    if (g->batch > 1)
        return blas.gemm_ex_batched(h, g->transa, g->transb, g->m, g->n, g->k, &alpha, (const void *)(uintptr_t)g->a,
                                    CUDA_R_16BF, g->lda, g->stride_a, (const void *)(uintptr_t)g->b, CUDA_R_16BF,
                                    g->ldb, g->stride_b, &beta, (void *)(uintptr_t)g->c,
                                    g->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, g->ldc, g->stride_c, g->batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return blas.gemm_ex(h, g->transa, g->transb, g->m, g->n, g->k, &alpha, (const void *)(uintptr_t)g->a,
                        CUDA_R_16BF, g->lda, (const void *)(uintptr_t)g->b, CUDA_R_16BF, g->ldb, &beta,
                        (void *)(uintptr_t)g->c, g->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, g->ldc, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}

static bool gemm(ddp_device *d, int stream, const ddp_device_gemm *g) {
    cublasHandle_t h = cuda(d)->handles[stream];
    int status;
    if (g->bf16)
        status = gemm_bf16(h, g);
    else if (g->f64 && g->batch > 1) {
        double alpha = g->alpha, beta = g->beta;
        status = blas.dgemm_batched(h, g->transa, g->transb, g->m, g->n, g->k, &alpha, (const double *)(uintptr_t)g->a,
                                    g->lda, g->stride_a, (const double *)(uintptr_t)g->b, g->ldb, g->stride_b, &beta,
                                    (double *)(uintptr_t)g->c, g->ldc, g->stride_c, g->batch);
    } else if (g->batch > 1) {
        float alpha = (float)g->alpha, beta = (float)g->beta;
        status = blas.sgemm_batched(h, g->transa, g->transb, g->m, g->n, g->k, &alpha, (const float *)(uintptr_t)g->a,
                                    g->lda, g->stride_a, (const float *)(uintptr_t)g->b, g->ldb, g->stride_b, &beta,
                                    (float *)(uintptr_t)g->c, g->ldc, g->stride_c, g->batch);
    } else if (g->f64) {
        double alpha = g->alpha, beta = g->beta;
        status = blas.dgemm(h, g->transa, g->transb, g->m, g->n, g->k, &alpha, (const double *)(uintptr_t)g->a, g->lda,
                            (const double *)(uintptr_t)g->b, g->ldb, &beta, (double *)(uintptr_t)g->c, g->ldc);
    } else {
        float alpha = (float)g->alpha, beta = (float)g->beta;
        status = blas.sgemm(h, g->transa, g->transb, g->m, g->n, g->k, &alpha, (const float *)(uintptr_t)g->a, g->lda,
                            (const float *)(uintptr_t)g->b, g->ldb, &beta, (float *)(uintptr_t)g->c, g->ldc);
    }
    const char *which = !g->bf16 ? (g->f64 ? "dgemm(" : "sgemm(")
                        : g->c_bf16 ? "GemmEx(A, B and C bf16, compute f32, "
                                    : "GemmEx(A and B bf16, C f32, compute f32, ";
    return status == 0 || ddp_device_fail(d, "cuBLAS %s%s, %s, m %d, n %d, k %d, lda %d, ldb %d, ldc %d, batch %d) "
                                             "failed with status %d", which, g->transa ? "T" : "N",
                                          g->transb ? "T" : "N", g->m, g->n, g->k, g->lda, g->ldb, g->ldc,
                                          g->batch > 1 ? g->batch : 1, status);
}

static bool record(ddp_device *d, int stream, int event) {
    return check(d, cu.cuEventRecord(cuda(d)->events[event], cuda(d)->streams[stream]), "recording an event");
}

static bool wait_event(ddp_device *d, int stream, int event) {
    return check(d, cu.cuStreamWaitEvent(cuda(d)->streams[stream], cuda(d)->events[event], 0), "waiting for an event");
}

static bool synchronize_event(ddp_device *d, int event) {
    return check(d, cu.cuEventSynchronize(cuda(d)->events[event]), "running on the GPU");
}

static bool synchronize(ddp_device *d) {
    return check(d, cu.cuCtxSynchronize(), "running on the GPU");
}

/* From any thread: the context is made that thread's first (a watchdog's has none). */
static int event_done(ddp_device *d, int event) {
    static __thread CUcontext current;
    Cuda *c = cuda(d);
    if (event < 0 || event >= DDP_EVENTS)
        return -1;
    if (current != c->context && cu.cuCtxSetCurrent(c->context) == 0)
        current = c->context;
    CUresult r = cu.cuEventQuery(c->events[event]);
    return r == 0 ? 1 : r == 600 /* CUDA_ERROR_NOT_READY */ ? 0 : -1;
}

static void *native_stream(ddp_device *d, int stream) {
    return stream >= 0 && stream < DDP_STREAMS ? (void *)cuda(d)->streams[stream] : NULL;
}

/* ------------------------------------------------------------- timing */

static bool mark(ddp_device *d, int stream, int i) {
    Cuda *c = cuda(d);
    if (i < 0 || i >= DDP_MARKS)
        return ddp_device_fail(d, "no timing mark %d", i);
    if (!c->marks && !(c->marks = calloc(DDP_MARKS, sizeof *c->marks)))
        return ddp_device_fail(d, "out of memory for timing marks");
    if (!c->marks[i] && !check(d, cu.cuEventCreate(&c->marks[i], 0), "creating a timing event"))
        return false;
    return check(d, cu.cuEventRecord(c->marks[i], c->streams[stream]), "recording a timing event");
}

static bool elapsed(ddp_device *d, int from, int to, double *seconds) {
    Cuda *c = cuda(d);
    float ms = 0;
    if (!c->marks || from < 0 || to < 0 || from >= DDP_MARKS || to >= DDP_MARKS || !c->marks[from] || !c->marks[to])
        return ddp_device_fail(d, "no timing marks %d, %d", from, to);
    if (!check(d, cu.cuEventSynchronize(c->marks[to]), "waiting for a timing event") ||
        !check(d, cu.cuEventElapsedTime(&ms, c->marks[from], c->marks[to]), "reading a timing event"))
        return false;
    *seconds = ms / 1e3;
    return true;
}

/* ------------------------------------------------------------ convolutions */

/* A plan and what it was made for: the descriptor's shape, mode, beta, types and
 * workspace, and of its pointers only the low bits that fix the alignment cuDNN was
 * promised (at most 16 bytes), so that one plan serves every run of that shape. */
typedef struct ConvPlan {
    int64_t key[CONV_KEY];
    ddp_cudnn_plan *plan;
} ConvPlan;

static void conv_key(const ddp_device_conv *cv, int64_t key[CONV_KEY]) {
    const int64_t fields[CONV_KEY] = {
        cv->mode, cv->n, cv->h, cv->w, cv->c, cv->k, cv->r, cv->s, cv->oh, cv->ow, cv->stride[0], cv->stride[1],
        cv->dilation[0], cv->dilation[1], cv->pad_before[0], cv->pad_before[1], cv->pad_after[0], cv->pad_after[1],
        cv->beta != 0, cv->f64, cv->tf32, cv->bf16, (int64_t)cv->workspace_bytes, (int64_t)(cv->x & 15),
        (int64_t)(cv->filters & 15), (int64_t)(cv->y & 15)};
    memcpy(key, fields, sizeof fields);
}

static const ddp_cudnn_plan *find_plan(const Cuda *c, const int64_t key[CONV_KEY]) {
    for (int i = 0; i < c->nplans; i++)
        if (memcmp(c->plans[i].key, key, sizeof c->plans[i].key) == 0)
            return c->plans[i].plan;
    return NULL;
}

/* "forward f32 2x32x32x3 * 16x3x3x3 -> 2x32x32x16, stride 1,1, dilation 1,1, padding 1+1,1+1" */
static void describe_conv(const ddp_device_conv *cv, char *text, size_t len) {
    static const char *const modes[] = {"forward", "backward data", "backward filter"};
    const char *type = cv->f64 ? "f64" : cv->bf16 ? "bf16" : cv->tf32 ? "tf32" : "f32";
    snprintf(text, len, "%s %s %dx%dx%dx%d * %dx%dx%dx%d -> %dx%dx%dx%d, stride %d,%d, dilation %d,%d, padding "
                        "%d+%d,%d+%d", modes[cv->mode], type, cv->n, cv->h, cv->w, cv->c, cv->k, cv->r, cv->s, cv->c,
             cv->n, cv->oh, cv->ow, cv->k, cv->stride[0], cv->stride[1], cv->dilation[0], cv->dilation[1],
             cv->pad_before[0], cv->pad_after[0], cv->pad_before[1], cv->pad_after[1]);
}

/* --conv-search timed: each candidate engine run once to warm up, then TIMED_RUNS
 * times between two events. */
enum { TIMED_RUNS = 5 };

static bool time_plan(void *ctx, ddp_cudnn *h, const ddp_cudnn_plan *p, const ddp_device_conv *cv, double *seconds,
                      char *err, size_t len) {
    ddp_device *d = ctx;
    CUstream s = cuda(d)->streams[DDP_STREAM_COMPUTE];
    CUevent ev[2] = {NULL, NULL};
    float ms = 0;
    bool ok = check(d, cu.cuEventCreate(&ev[0], 0), "creating a timing event") &&
              check(d, cu.cuEventCreate(&ev[1], 0), "creating a timing event") && ddp_cudnn_run(h, p, cv, err, len) &&
              check(d, cu.cuEventRecord(ev[0], s), "recording a timing event");
    for (int i = 0; ok && i < TIMED_RUNS; i++)
        ok = ddp_cudnn_run(h, p, cv, err, len);
    ok = ok && check(d, cu.cuEventRecord(ev[1], s), "recording a timing event") &&
         check(d, cu.cuEventSynchronize(ev[1]), "timing a convolution's engine") &&
         check(d, cu.cuEventElapsedTime(&ms, ev[0], ev[1]), "reading a timing event");
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cu.cuEventDestroy(ev[i]);
    if (!ok && err != d->error && d->error[0])
        snprintf(err, len, "%s", d->error);
    *seconds = ms / 1e3 / TIMED_RUNS;
    return ok;
}

/* The tensor a convolution writes (y, x or the filters, by its mode), and its bytes. */
static ddp_dptr conv_output(const ddp_device_conv *cv, size_t *bytes) {
    size_t elements = cv->mode == DDP_CONV_FORWARD         ? (size_t)cv->n * cv->oh * cv->ow * cv->k
                      : cv->mode == DDP_CONV_BACKWARD_DATA ? (size_t)cv->n * cv->h * cv->w * cv->c
                                                           : (size_t)cv->k * cv->r * cv->s * cv->c;
    *bytes = elements * (cv->f64 ? 8 : cv->bf16 ? 2 : 4);
    return cv->mode == DDP_CONV_FORWARD ? cv->y : cv->mode == DDP_CONV_BACKWARD_DATA ? cv->x : cv->filters;
}

/* A plan chosen by timing its candidates on cv's own tensors. Their runs overwrite the
 * output, which the run the plan is made for overwrites in turn, unless it adds to it
 * (beta 1): then the output is kept aside and put back. Without the memory for that,
 * the heuristics' first choice. */
static bool plan_timed(ddp_device *d, const ddp_device_conv *cv, ddp_cudnn_plan **plan) {
    Cuda *c = cuda(d);
    CUstream s = c->streams[DDP_STREAM_COMPUTE];
    ddp_cudnn_timing timing = {time_plan, d};
    size_t bytes = 0;
    ddp_dptr out = conv_output(cv, &bytes);
    CUdeviceptr kept = 0;
    *plan = NULL;
    if (cv->beta != 0 && cu.cuMemAlloc(&kept, bytes) != 0) {
        ddp_log_only("GPU: no memory to keep a convolution's output while its engines are timed: the heuristics' "
                     "first engine\n");
        return ddp_cudnn_plan_conv(c->dnn, cv, NULL, plan, d->error, sizeof d->error);
    }
    bool ok = (!kept || check(d, cu.cuMemcpyDtoDAsync(kept, out, bytes, s), "keeping a convolution's output")) &&
              ddp_cudnn_plan_conv(c->dnn, cv, &timing, plan, d->error, sizeof d->error);
    if (kept) {
        ok = check(d, cu.cuMemcpyDtoDAsync(out, kept, bytes, s), "putting a convolution's output back") &&
             check(d, cu.cuCtxSynchronize(), "putting a convolution's output back") && ok;
        cu.cuMemFree(kept);
    }
    if (!ok && *plan) {
        ddp_cudnn_plan_free(*plan);
        *plan = NULL;
    }
    return ok;
}

/* The convolution's plan, made and kept; each new plan's engine goes to the log. A
 * capture cannot hold the planning (it runs work on the GPU and synchronises). */
static const ddp_cudnn_plan *new_plan(ddp_device *d, int stream, const ddp_device_conv *cv,
                                      const int64_t key[CONV_KEY]) {
    Cuda *c = cuda(d);
    char shape[256];
    describe_conv(cv, shape, sizeof shape);
    if (c->capturing[stream]) {
        ddp_device_fail(d, "convolution %s: no cuDNN plan for it, and none can be made while stream %d is being "
                           "captured into a CUDA graph (each convolution runs once uncaptured first)", shape, stream);
        return NULL;
    }
    if (c->nplans == c->plans_cap) {
        int cap = c->plans_cap ? 2 * c->plans_cap : 16;
        ConvPlan *grown = realloc(c->plans, (size_t)cap * sizeof *grown);
        if (!grown) {
            ddp_device_fail(d, "out of memory for convolution plans");
            return NULL;
        }
        c->plans = grown, c->plans_cap = cap;
    }
    ConvPlan *kept = &c->plans[c->nplans];
    if (!(d->timed_conv_search ? plan_timed(d, cv, &kept->plan)
                               : ddp_cudnn_plan_conv(c->dnn, cv, NULL, &kept->plan, d->error, sizeof d->error)))
        return NULL;
    memcpy(kept->key, key, sizeof kept->key);
    c->nplans++;
    ddp_log_only("GPU: convolution %s: %s\n", shape, ddp_cudnn_plan_name(kept->plan));
    return kept->plan;
}

/* cuDNN's handle runs its work on the compute stream, and only there. */
static bool conv(ddp_device *d, int stream, const ddp_device_conv *cv) {
    Cuda *c = cuda(d);
    int64_t key[CONV_KEY];
    if (stream != DDP_STREAM_COMPUTE)
        return ddp_device_fail(d, "a convolution queued on stream %d: cuDNN's handle is bound to the compute "
                                  "stream", stream);
    if (!ddp_conv_check(cv, d->error, sizeof d->error))
        return false;
    conv_key(cv, key);
    const ddp_cudnn_plan *plan = find_plan(c, key);
    if (!plan && !(plan = new_plan(d, stream, cv, key)))
        return false;
    return ddp_cudnn_run(c->dnn, plan, cv, d->error, sizeof d->error);
}

static void free_plans(Cuda *c) {
    for (int i = 0; i < c->nplans; i++)
        ddp_cudnn_plan_free(c->plans[i].plan);
    free(c->plans);
    c->plans = NULL, c->nplans = c->plans_cap = 0;
}

/* --------------------------------------------------------------- graphs */

static void drop_graph(Cuda *c, int g) {
    if (c->graph_execs[g])
        cu.cuGraphExecDestroy(c->graph_execs[g]);
    if (c->graphs[g])
        cu.cuGraphDestroy(c->graphs[g]);
    c->graph_execs[g] = NULL, c->graphs[g] = NULL;
}

/* Captured by this thread only (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL): the
 * communication thread's host work must not spoil it. */
static bool capture_begin(ddp_device *d, int stream) {
    Cuda *c = cuda(d);
    c->capturing[stream] = check(d, cu.cuStreamBeginCapture(c->streams[stream], 1), "beginning a CUDA graph's capture");
    return c->capturing[stream];
}

static bool capture_end(ddp_device *d, int stream, int graph) {
    Cuda *c = cuda(d);
    CUgraph captured = NULL;
    c->capturing[stream] = false;
    if (!check(d, cu.cuStreamEndCapture(c->streams[stream], &captured), "ending a CUDA graph's capture"))
        return false;
    drop_graph(c, graph);
    c->graphs[graph] = captured;
    return check(d, cu.cuGraphInstantiateWithFlags(&c->graph_execs[graph], captured, 0),
                 "instantiating a CUDA graph");
}

static bool graph_launch(ddp_device *d, int stream, int graph) {
    Cuda *c = cuda(d);
    if (!c->graph_execs[graph])
        return ddp_device_fail(d, "graph %d launched, never captured", graph);
    return check(d, cu.cuGraphLaunch(c->graph_execs[graph], c->streams[stream]), "launching a CUDA graph");
}

static void close_device(ddp_device *d) {
    Cuda *c = cuda(d);
    if (!c)
        return;
    if (c->context) {
        cu.cuCtxSynchronize();
        free_plans(c);
        ddp_cudnn_close(c->dnn);
        for (int g = 0; g < DDP_GRAPHS; g++)
            drop_graph(c, g);
        for (int m = 0; c->marks && m < DDP_MARKS; m++)
            if (c->marks[m])
                cu.cuEventDestroy(c->marks[m]);
        for (int s = 0; s < DDP_STREAMS; s++) {
            if (c->handles[s])
                blas.destroy(c->handles[s]);
            if (c->workspaces[s])
                cu.cuMemFree(c->workspaces[s]);
            if (c->streams[s])
                cu.cuStreamDestroy(c->streams[s]);
        }
        for (int e = 0; e < DDP_EVENTS; e++)
            if (c->events[e])
                cu.cuEventDestroy(c->events[e]);
        if (c->module)
            cu.cuModuleUnload(c->module);
        cu.cuDevicePrimaryCtxRelease(c->device);
    }
    free(c->functions);
    free(c->marks);
    free(c);
    d->state = NULL;
}

/* Two tables, so that a device without cuDNN shows the executor no conv op. */
#define CUDA_OPS                                                                                             \
    "cuda", close_device, alloc, host_alloc, host_free, upload, download, copy, fill, launch, gemm, record,  \
        wait_event, synchronize_event, synchronize, capture_begin, capture_end, graph_launch, mark, elapsed
static const ddp_device_backend cuda_backend = {CUDA_OPS, NULL, native_stream, event_done, false};
static const ddp_device_backend cuda_cudnn_backend = {CUDA_OPS, conv, native_stream, event_done, false};
#undef CUDA_OPS

/* ---------------------------------------------------------------- opening */

/* The PTX into a module, its JIT log shown when the GPU refuses it, every kernel's
 * function looked up. */
static bool load_module(ddp_device *d, Cuda *c) {
    const ddp_program *p = d->program;
    char log[16384] = "";
    int options[] = {5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */};
    void *values[] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = cu.cuModuleLoadDataEx(&c->module, p->ptx, 2, options, values);
    if (r != 0)
        return ddp_device_fail(d, "the GPU's compiler refused the program's PTX: %s%s%.8000s", describe(r),
                               log[0] ? "; its log:\n" : "", log);
    if (!(c->functions = calloc((size_t)p->nkernels + 1, sizeof *c->functions)))
        return ddp_device_fail(d, "out of memory");
    for (int64_t k = 0; k < p->nkernels; k++)
        if ((r = cu.cuModuleGetFunction(&c->functions[k], c->module, p->kernels[k].name)) != 0)
            return ddp_device_fail(d, "the program's PTX has no kernel %s: %s", p->kernels[k].name, describe(r));
    return true;
}

/* precision = tf32: f32 products on the tensor cores (CUBLAS_TF32_TENSOR_OP_MATH); else
 * the default, which keeps f32 products in f32 and runs bf16 ones on the tensor cores.
 * Under bf16 the sums stay f32 even where C is bf16: a product split along k is summed
 * in the compute type, not C's (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION). */
static int math_mode(int precision) {
    return precision == DDP_PRECISION_TF32 ? 3 : precision == DDP_PRECISION_BF16 ? 16 : 0;
}

static bool start_streams(ddp_device *d, Cuda *c) {
    for (int s = 0; s < DDP_STREAMS; s++) {
        if (!check(d, cu.cuStreamCreate(&c->streams[s], 1 /* CU_STREAM_NON_BLOCKING */), "creating a stream") ||
            !check(d, cu.cuMemAlloc(&c->workspaces[s], CUBLAS_WORKSPACE), "allocating cuBLAS's workspace"))
            return false;
        int status = blas.create(&c->handles[s]);
        if (status == 0)
            status = blas.set_stream(c->handles[s], c->streams[s]);
        if (status == 0)
            status = blas.set_workspace(c->handles[s], (void *)(uintptr_t)c->workspaces[s], CUBLAS_WORKSPACE);
        if (status == 0)
            status = blas.set_math_mode(c->handles[s], math_mode(d->program->settings.precision));
        if (status != 0)
            return ddp_device_fail(d, "starting cuBLAS (%s): status %d", blas.path, status);
    }
    for (int e = 0; e < DDP_EVENTS; e++)
        if (!check(d, cu.cuEventCreate(&c->events[e], 2 /* CU_EVENT_DISABLE_TIMING */), "creating an event"))
            return false;
    return true;
}

/* cuDNN on the compute stream, unless DDP_CUDNN=0; without it (not found, too old, or
 * turned off) the device is no worse, only without the conv op, and says why. */
static void start_cudnn(ddp_device *d, Cuda *c) {
    const char *setting = getenv("DDP_CUDNN");
    char why[2048];
    if (setting && strcmp(setting, "0") == 0) {
        snprintf(d->convolutions, sizeof d->convolutions, "generated kernels: cuDNN turned off (DDP_CUDNN=0)");
        return;
    }
    if (!(c->dnn = ddp_cudnn_open(c->streams[DDP_STREAM_COMPUTE], why, sizeof why))) {
        int room = (int)sizeof d->convolutions - 24;
        snprintf(d->convolutions, sizeof d->convolutions, "generated kernels: %.*s%s", room, why,
                 (int)strlen(why) > room ? "..." : "");
        return;
    }
    snprintf(d->convolutions, sizeof d->convolutions, "cuDNN: %.*s", (int)sizeof d->convolutions - 8,
             ddp_cudnn_library());
    d->ops = &cuda_cudnn_backend;
}

static void describe_device(ddp_device *d, CUdevice dev, int version) {
    ddp_device_info *info = &d->info;
    info->driver_version = version;
    cu.cuDeviceGetName(info->name, sizeof info->name, dev);
    CUuuid u;
    if (cu.cuDeviceGetUuid(&u, dev) == 0) {
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(info->uuid, sizeof info->uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
                 b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    }
    cu.cuDeviceGetPCIBusId(info->bus, sizeof info->bus, dev);
}

/* precision = bf16 runs its products on bf16 tensor cores, which begin with compute
 * capability 8.0 (Ampere). Asked before cuBLAS is looked for, so that a user of an
 * older GPU hears about the GPU, not about a library. The way out is a newer GPU or
 * the CPU in f32, not another precision here: the program's PTX is for sm_80 whatever
 * its precision. */
static bool precision_fits(ddp_device *d, Cuda *c) {
    int major = 0, minor = 0;
    if (d->program->settings.precision != DDP_PRECISION_BF16)
        return true;
    if (!check(d, cu.cuDeviceGetAttribute(&major, 75 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */, c->device),
               "reading the GPU's compute capability") ||
        !check(d, cu.cuDeviceGetAttribute(&minor, 76 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */, c->device),
               "reading the GPU's compute capability"))
        return false;
    return major * 10 + minor >= BF16_NEEDS ||
           ddp_device_fail(d, "precision = bf16 needs a GPU of compute capability %d.%d or later (bf16 tensor "
                              "cores), and this one is %d.%d: run it on such a GPU, or set precision = fp32 and train "
                              "on the CPU (--device cpu); the program's PTX is for sm_80, so no precision runs on "
                              "this GPU", BF16_NEEDS / 10, BF16_NEEDS % 10, major, minor);
}

bool ddp_device_open_cuda(const ddp_program *p, int ordinal, ddp_device **out, char *err, size_t len) {
    *out = NULL;
    int version;
    if (!p->ptx)
        return ddp_fail(err, len, "this program was built without GPU code");
    if (!driver_ready(&version, err, len))
        return false;
    ddp_device *d = calloc(1, sizeof *d);
    Cuda *c = calloc(1, sizeof *c);
    if (!d || !c) {
        free(d);
        free(c);
        return ddp_fail(err, len, "out of memory");
    }
    d->ops = &cuda_backend;
    d->program = p;
    d->state = c;
    bool ok = check(d, cu.cuDeviceGet(&c->device, ordinal), "choosing the GPU");
    if (ok)
        describe_device(d, c->device, version);
    ok = ok && precision_fits(d, c);
    if (ok && !load_blas(version, err, len)) { /* said as it is, the GPU aside: no GPU would run without it */
        ddp_device_close(d);
        return false;
    }
    ok = ok && check(d, cu.cuDevicePrimaryCtxRetain(&c->context, c->device), "starting the GPU's context") &&
         check(d, cu.cuCtxSetCurrent(c->context), "starting the GPU's context");
    size_t free_bytes = 0, total = 0;
    if (ok && cu.cuMemGetInfo(&free_bytes, &total) == 0)
        d->info.free_bytes = (int64_t)free_bytes, d->info.total_bytes = (int64_t)total;
    ok = ok && load_module(d, c) && start_streams(d, c);
    if (ok)
        start_cudnn(d, c);
    if (!ok) {
        ddp_fail(err, len, "GPU %d (%s): %s", ordinal, d->info.name[0] ? d->info.name : "?", d->error);
        ddp_device_close(d);
        return false;
    }
    *out = d;
    return true;
}
