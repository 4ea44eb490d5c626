/* fake_cuda.c: a stand-in for the CUDA driver (libcuda.so.1), loaded through
 * DDP_CUDA_DRIVER by tests/train/cli.sh to see what a program says on a machine whose
 * driver is too old, or whose driver is fine but cuBLAS is missing. It reports the
 * version in FAKE_CUDA_VERSION (default 11020: CUDA 11.2) and one GPU; it hands out
 * every entry point, but only cuInit, cuDriverGetVersion and cuDeviceGetCount work,
 * which is as far as those runs go. */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
enum { CUDA_ERROR_NOT_SUPPORTED = 801 };

static CUresult init(unsigned flags) {
    (void)flags;
    return 0;
}

static CUresult driver_version(int *version) {
    const char *v = getenv("FAKE_CUDA_VERSION");
    *version = v ? atoi(v) : 11020;
    return 0;
}

static CUresult device_count(int *count) {
    *count = 1;
    return 0;
}

static CUresult error_text(CUresult r, const char **text) {
    *text = r == CUDA_ERROR_NOT_SUPPORTED ? "operation not supported (the fake driver)" : "unknown";
    return 0;
}

/* Every other entry point: never reached by the runs this serves. */
static CUresult not_supported(void) {
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, unsigned long long flags, int *status);

CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, unsigned long long flags, int *status) {
    (void)version, (void)flags;
    if (status)
        *status = 0;
    if (strcmp(symbol, "cuInit") == 0)
        *fn = (void *)init;
    else if (strcmp(symbol, "cuDriverGetVersion") == 0)
        *fn = (void *)driver_version;
    else if (strcmp(symbol, "cuDeviceGetCount") == 0)
        *fn = (void *)device_count;
    else if (strcmp(symbol, "cuGetErrorName") == 0 || strcmp(symbol, "cuGetErrorString") == 0)
        *fn = (void *)error_text;
    else
        *fn = (void *)not_supported;
    return 0;
}
