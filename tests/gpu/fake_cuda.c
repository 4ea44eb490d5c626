/* fake_cuda.c: a stand-in for the CUDA driver (libcuda.so.1), loaded through
 * DDP_CUDA_DRIVER by tests/train/cli.sh to see what a program says on a machine whose
 * driver is too old, whose driver is fine but cuBLAS is missing, or whose GPU is too
 * old for the program's precision. It reports the version in FAKE_CUDA_VERSION
 * (default 11020: CUDA 11.2) and one GPU, named FAKE_CUDA_NAME (default "Fake GPU"),
 * of compute capability FAKE_CUDA_CC (major * 10 + minor; default 90). It hands out
 * every entry point, but only cuInit, cuDriverGetVersion, cuDeviceGetCount,
 * cuDeviceGet, cuDeviceGetName and cuDeviceGetAttribute (the compute capability) work,
 * which is as far as those runs go. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
enum { CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_NOT_SUPPORTED = 801 };
enum { CC_MAJOR = 75, CC_MINOR = 76 }; /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_* */

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

static CUresult device_get(int *device, int ordinal) {
    *device = ordinal;
    return ordinal == 0 ? 0 : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult device_name(char *name, int len, int device) {
    const char *chosen = getenv("FAKE_CUDA_NAME");
    (void)device;
    snprintf(name, (size_t)len, "%s", chosen ? chosen : "Fake GPU");
    return 0;
}

static CUresult device_attribute(int *value, int attribute, int device) {
    const char *v = getenv("FAKE_CUDA_CC");
    int cc = v ? atoi(v) : 90;
    (void)device;
    if (attribute != CC_MAJOR && attribute != CC_MINOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    *value = attribute == CC_MAJOR ? cc / 10 : cc % 10;
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
    static const struct {
        const char *symbol;
        void *fn;
    } working[] = {
        {"cuInit", (void *)init},
        {"cuDriverGetVersion", (void *)driver_version},
        {"cuDeviceGetCount", (void *)device_count},
        {"cuDeviceGet", (void *)device_get},
        {"cuDeviceGetName", (void *)device_name},
        {"cuDeviceGetAttribute", (void *)device_attribute},
        {"cuGetErrorName", (void *)error_text},
        {"cuGetErrorString", (void *)error_text},
    };
    (void)version, (void)flags;
    if (status)
        *status = 0;
    *fn = (void *)not_supported;
    for (size_t i = 0; i < sizeof working / sizeof *working; i++)
        if (strcmp(symbol, working[i].symbol) == 0)
            *fn = working[i].fn;
    return 0;
}
