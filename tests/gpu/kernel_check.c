/* kernel_check.c: every generated kernel of the linked model, run on the GPU through
 * the CUDA driver, against the same kernel on the CPU.
 *
 * The phases (forward, backward, optimizer, evaluation) are walked on the CPU as the
 * runtime does. Before each kernel the whole state is copied to the GPU; the kernel
 * runs on both; every buffer alive at that step must then agree, f32 to 1e-4
 * relative (or 1e-6 absolute), f64 to 1e-10 relative (or 1e-12 absolute): the code is
 * the same, but the GPU compiler fuses multiplies and adds. Matrix products run on the
 * CPU only (with the small product below, so this program needs no BLAS and can be
 * copied to a GPU machine as it is). The driver is loaded with dlopen: without a GPU
 * the program says so and exits 77 (skipped). */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* ------------------------------------------- the CPU's matrix products, plainly */

enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };

#define GEMM(name, T)                                                                            \
    void name(int order, int ta, int tb, int m, int n, int k, T alpha, const T *a, int lda,      \
              const T *b, int ldb, T beta, T *c, int ldc) {                                      \
        (void)order;                                                                             \
        for (int i = 0; i < m; i++)                                                              \
            for (int j = 0; j < n; j++) {                                                        \
                double acc = 0;                                                                  \
                for (int p = 0; p < k; p++)                                                      \
                    acc += (double)(ta == CblasTrans ? a[p * lda + i] : a[i * lda + p]) *        \
                           (tb == CblasTrans ? b[j * ldb + p] : b[p * ldb + j]);                 \
                c[i * ldc + j] = (T)(alpha * acc + (beta != 0 ? beta * c[i * ldc + j] : 0));     \
            }                                                                                    \
    }
GEMM(cblas_sgemm, float)
GEMM(cblas_dgemm, double)
void openblas_set_num_threads(int n) {
    (void)n;
}

/* ---------------------------------------------------------- the CUDA driver */

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction;

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_count)(int *);
    CUresult (*device_get)(int *, int);
    CUresult (*retain)(CUcontext *, int);
    CUresult (*set_current)(CUcontext);
    CUresult (*load)(CUmodule *, const void *, unsigned, int *, void **);
    CUresult (*function)(CUfunction *, CUmodule, const char *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*to_device)(CUdeviceptr, const void *, size_t);
    CUresult (*to_host)(void *, CUdeviceptr, size_t);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                       void **, void **);
    CUresult (*sync)(void);
    CUresult (*free)(CUdeviceptr);
    CUresult (*error_string)(CUresult, const char **);
} cu;

static void check(CUresult r, const char *what) {
    if (r == 0)
        return;
    const char *s = "?";
    if (cu.error_string)
        cu.error_string(r, &s);
    fprintf(stderr, "kernel_check: %s failed: %s (%d)\n", what, s, r);
    exit(1);
}

static bool load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib)
        return false;
#define SYM(field, name) *(void **)&cu.field = dlsym(lib, name)
    SYM(init, "cuInit");
    SYM(device_count, "cuDeviceGetCount");
    SYM(device_get, "cuDeviceGet");
    SYM(retain, "cuDevicePrimaryCtxRetain");
    SYM(set_current, "cuCtxSetCurrent");
    SYM(load, "cuModuleLoadDataEx");
    SYM(function, "cuModuleGetFunction");
    SYM(alloc, "cuMemAlloc_v2");
    SYM(to_device, "cuMemcpyHtoD_v2");
    SYM(to_host, "cuMemcpyDtoH_v2");
    SYM(launch, "cuLaunchKernel");
    SYM(sync, "cuCtxSynchronize");
    SYM(free, "cuMemFree_v2");
    SYM(error_string, "cuGetErrorString");
#undef SYM
    return cu.init && cu.launch && cu.alloc;
}

/* ------------------------------------------------------------------ the check */

typedef struct Gpu {
    CUdeviceptr region[DDP_REGION_COUNT], scalars;
    CUmodule module;
    void *host_copy[DDP_REGION_COUNT];
} Gpu;

static void to_device(ddp_runtime *rt, Gpu *g) {
    const ddp_program *p = rt->program;
    for (int r = 0; r < DDP_REGION_COUNT; r++)
        if (p->region_bytes[r])
            check(cu.to_device(g->region[r], rt->region[r], (size_t)p->region_bytes[r]), "copy to the GPU");
    check(cu.to_device(g->scalars, rt->scalars, sizeof rt->scalars), "copy the scalars");
}

/* Whether buffer b holds a value at this step of its sequence. */
static bool alive(const ddp_buffer *b, int64_t sequence, int64_t position) {
    if (b->sequence == 0)
        return true;
    return b->sequence == sequence && b->first_step <= position && position <= b->last_step;
}

static double compare(ddp_runtime *rt, Gpu *g, int64_t sequence, int64_t position, const char **worst_name) {
    const ddp_program *p = rt->program;
    for (int r = 0; r < DDP_REGION_COUNT; r++)
        if (p->region_bytes[r])
            check(cu.to_host(g->host_copy[r], g->region[r], (size_t)p->region_bytes[r]), "copy to the host");
    double worst = 0;
    for (int64_t i = 0; i < p->nbuffers; i++) {
        const ddp_buffer *b = &p->buffers[i];
        if (!alive(b, sequence, position) || b->dtype == DDP_I32 || b->dtype == DDP_I64)
            continue;
        const char *cpu = (const char *)rt->region[b->region] + b->offset;
        const char *gpu = (const char *)g->host_copy[b->region] + b->offset;
        bool f64 = b->dtype == DDP_F64;
        double rel = f64 ? 1e-10 : 1e-4, abs_tol = f64 ? 1e-12 : 1e-6;
        int64_t n = b->bytes / (f64 ? 8 : 4);
        for (int64_t e = 0; e < n; e++) {
            double x = f64 ? ((const double *)cpu)[e] : ((const float *)cpu)[e];
            double y = f64 ? ((const double *)gpu)[e] : ((const float *)gpu)[e];
            if (isnan(x) && isnan(y))
                continue;
            double d = fabs(x - y);
            double err = d <= abs_tol ? 0 : d / fmax(fabs(x), 1e-30) / rel;
            if (!(err <= worst)) {
                worst = isnan(err) ? INFINITY : err;
                *worst_name = b->name;
            }
        }
    }
    return worst; /* in units of the tolerance: above 1 fails */
}

static void random_batch(ddp_runtime *rt) {
    const ddp_program *p = rt->program;
    int64_t batch = p->settings.batch_per_replica, per = 1;
    for (int d = 0; d < p->input_rank; d++)
        per *= p->input_shape[d];
    for (int64_t i = 0; i < batch * per; i++) {
        double v = sin(0.3 * (double)i) * 2;
        if (p->dtype == DDP_F64)
            ((double *)ddp_buffer_ptr(rt, p->input_slot))[i] = v;
        else
            ((float *)ddp_buffer_ptr(rt, p->input_slot))[i] = (float)v;
    }
    int64_t k = p->output_elems;
    for (int64_t s = 0; s < batch; s++) {
        if (p->label_dtype == DDP_I32)
            ((int32_t *)ddp_buffer_ptr(rt, p->label_slot))[s] = (int32_t)(s % k);
        else
            for (int64_t j = 0; j < k; j++) {
                double t = j == s % k;
                if (p->dtype == DDP_F64)
                    ((double *)ddp_buffer_ptr(rt, p->label_slot))[s * k + j] = t;
                else
                    ((float *)ddp_buffer_ptr(rt, p->label_slot))[s * k + j] = (float)t;
            }
        ((int64_t *)ddp_buffer_ptr(rt, p->sample_id_slot))[s] = 100 + s;
    }
}

int main(void) {
    const ddp_program *p = &ddp_program_desc;
    if (!p->ptx) {
        fprintf(stderr, "kernel_check: %s was built without GPU code\n", p->name);
        return 1;
    }
    int count = 0;
    if (!load_driver() || cu.init(0) != 0 || cu.device_count(&count) != 0 || count == 0) {
        printf("kernel_check %s: SKIPPED: no GPU (the CUDA driver libcuda.so.1 or a device is missing)\n",
               p->name);
        return 77;
    }
    int dev;
    CUcontext ctx;
    check(cu.device_get(&dev, 0), "cuDeviceGet");
    check(cu.retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cu.set_current(ctx), "cuCtxSetCurrent");
    Gpu g = {0};
    char log[8192] = "";
    int opts[] = {5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */};
    void *vals[] = {log, (void *)(size_t)sizeof log};
    if (cu.load(&g.module, p->ptx, 2, opts, vals) != 0) {
        fprintf(stderr, "kernel_check: the GPU rejected the PTX of %s:\n%s\n", p->name, log);
        return 1;
    }

    ddp_options o = {.threads = 1};
    char err[256];
    ddp_runtime *rt = ddp_open(p, &o, err, sizeof err);
    if (!rt) {
        fprintf(stderr, "kernel_check: %s\n", err);
        return 1;
    }
    ddp_init_params(rt, 9);
    random_batch(rt);
    int64_t batch = p->settings.batch_per_replica;
    ddp_set_batch(rt, batch, batch);
    ddp_prepare_step(rt, 0, 10);

    void **table = calloc((size_t)p->nbuffers + 1, sizeof(void *));
    for (int r = 0; r < DDP_REGION_COUNT; r++) {
        check(cu.alloc(&g.region[r], (size_t)(p->region_bytes[r] ? p->region_bytes[r] : 64)), "cuMemAlloc");
        g.host_copy[r] = malloc((size_t)(p->region_bytes[r] ? p->region_bytes[r] : 64));
    }
    for (int64_t i = 0; i < p->nbuffers; i++)
        table[i] = (void *)(g.region[p->buffers[i].region] + (CUdeviceptr)p->buffers[i].offset);
    check(cu.alloc(&g.scalars, sizeof rt->scalars), "cuMemAlloc");

    int failures = 0, kernels = 0;
    double worst_all = 0;
    for (int phase = 0; phase < DDP_PHASE_COUNT; phase++) {
        const ddp_phase *ph = &p->phases[phase];
        int64_t sequence = phase == DDP_PHASE_EVAL ? 2 : 1, position = 0;
        for (int q = 0; q < phase && phase != DDP_PHASE_EVAL; q++)
            position += p->phases[q].count;
        for (int64_t s = 0; s < ph->count; s++, position++) {
            const ddp_step *step = &ph->steps[s];
            if (step->kind != DDP_STEP_KERNEL) {
                /* products and markers on the CPU only; the GPU gets the state at the next kernel */
                ddp_run_steps(rt, phase, s, 1);
                continue;
            }
            const ddp_kernel *k = &p->kernels[step->index];
            int64_t end = step->range.fixed + step->range.per_sample * batch;
            to_device(rt, &g);
            rt->kernels[step->index](rt->step_args[phase][s], rt->scalars, 0, end);
            /* the launch's buffers on the device */
            CUdeviceptr args_dev;
            void **args_host = calloc((size_t)step->nargs + 1, sizeof(void *));
            for (int64_t a = 0; a < step->nargs; a++)
                args_host[a] = table[step->args[a]];
            check(cu.alloc(&args_dev, sizeof(void *) * (size_t)(step->nargs + 1)), "cuMemAlloc");
            check(cu.to_device(args_dev, args_host, sizeof(void *) * (size_t)(step->nargs + 1)), "copy the arguments");
            CUfunction fn;
            check(cu.function(&fn, g.module, k->name), k->name);
            int64_t begin = 0;
            void *params[] = {&args_dev, &g.scalars, &begin, &end};
            unsigned blocks = (unsigned)((end + 255) / 256);
            if (blocks > 0)
                check(cu.launch(fn, blocks, 1, 1, 256, 1, 1, 0, NULL, params, NULL), k->name);
            check(cu.sync(), k->name);
            if (cu.free)
                cu.free(args_dev);
            free(args_host);
            const char *worst_name = "";
            double worst = compare(rt, &g, sequence, position, &worst_name);
            kernels++;
            if (worst > worst_all)
                worst_all = worst;
            if (worst > 1) {
                failures++;
                printf("  FAIL %s: %s differs by %.3g times the tolerance\n", k->name, worst_name, worst);
            }
        }
    }
    printf("kernel_check %s: %d kernels on the GPU, %s; largest difference %.3g of the tolerance\n", p->name,
           kernels, failures ? "FAIL" : "ok", worst_all);
    ddp_close(rt);
    return failures ? 1 : 0;
}
