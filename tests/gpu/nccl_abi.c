/* nccl_abi.c: runtime/nccl_api.h, NCCL's interface as the runtime transcribed it, held
 * to the real nccl.h. Built twice, with -DREAL_NCCL against <nccl.h> and without it
 * against nccl_api.h, each build prints the same lines: the sizes, the offsets of the
 * configuration's fields that nccl_api.h declares (the real one has more after them),
 * the constants' values; the test compares the two outputs. Built against the real
 * header, the calls nccl_api.h lists are also held to the types it gives them, so that
 * a wrong parameter fails the build. */
#include <stddef.h>
#include <stdio.h>

#ifdef REAL_NCCL
/* nccl_api.h's names moved aside, for its call list; the real header's are the ones used */
#define ncclResult_t api_ncclResult_t
#define ncclSuccess api_ncclSuccess
#define ncclUnhandledCudaError api_ncclUnhandledCudaError
#define ncclSystemError api_ncclSystemError
#define ncclInternalError api_ncclInternalError
#define ncclInvalidArgument api_ncclInvalidArgument
#define ncclInvalidUsage api_ncclInvalidUsage
#define ncclRemoteError api_ncclRemoteError
#define ncclInProgress api_ncclInProgress
#define ncclNumResults api_ncclNumResults
#define ncclRedOp_t api_ncclRedOp_t
#define ncclSum api_ncclSum
#define ncclDataType_t api_ncclDataType_t
#define ncclFloat32 api_ncclFloat32
#define ncclFloat64 api_ncclFloat64
#define ncclBfloat16 api_ncclBfloat16
#define ncclComm_t api_ncclComm_t
#define cudaStream_t api_cudaStream_t
#define ncclUniqueId api_ncclUniqueId
#define ncclConfig_t api_ncclConfig_t
#include "nccl_api.h"
#undef ncclResult_t
#undef ncclSuccess
#undef ncclUnhandledCudaError
#undef ncclSystemError
#undef ncclInternalError
#undef ncclInvalidArgument
#undef ncclInvalidUsage
#undef ncclRemoteError
#undef ncclInProgress
#undef ncclNumResults
#undef ncclRedOp_t
#undef ncclSum
#undef ncclDataType_t
#undef ncclFloat32
#undef ncclFloat64
#undef ncclBfloat16
#undef ncclComm_t
#undef cudaStream_t
#undef ncclUniqueId
#undef ncclConfig_t
#include <nccl.h>
static const ncclConfig_t initializer = NCCL_CONFIG_INITIALIZER;
#define CONFIG_MAGIC initializer.magic
#define CONFIG_VERSION_2_18 NCCL_VERSION(2, 18, 0)
#define CONFIG_UNDEF_INT NCCL_CONFIG_UNDEF_INT
#else
#include "nccl_api.h"
#define CONFIG_MAGIC DDP_NCCL_CONFIG_MAGIC
#define CONFIG_VERSION_2_18 DDP_NCCL_CONFIG_VERSION
#define CONFIG_UNDEF_INT DDP_NCCL_CONFIG_UNDEF_INT
#endif

#define FIELD(name)                                                                                          \
    printf("ncclConfig_t.%s: offset %zu, size %zu\n", #name, offsetof(ncclConfig_t, name),                    \
           sizeof(((ncclConfig_t *)0)->name))
#define CONSTANT(name) printf("%s = %lld\n", #name, (long long)(name))

/* Where the fields listed in main end, rounded up as the struct is, against the size of
 * nccl_api.h's struct (a field it gains must be listed in main too). */
static size_t declared_end(void) {
#ifdef REAL_NCCL
    size_t end = offsetof(ncclConfig_t, splitShare) + sizeof(int), align = _Alignof(ncclConfig_t);
    return (end + align - 1) / align * align;
#else
    return sizeof(ncclConfig_t);
#endif
}

int main(void) {
    int calls = 0;
#ifdef REAL_NCCL
#define TAKE(name, params)                                                                                   \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ncclResult_t(*) params),                  \
                   #name ": nccl_api.h's parameters are not nccl.h's");                                      \
    calls++;
#else
#define TAKE(name, params) calls++;
#endif
    DDP_NCCL_CALLS(TAKE)
    printf("calls of nccl_api.h with the real header's types: %d\n", calls);
    printf("sizeof(ncclUniqueId) = %zu\n", sizeof(ncclUniqueId));
    CONSTANT(NCCL_UNIQUE_ID_BYTES);
    printf("sizeof(ncclComm_t) = %zu\n", sizeof(ncclComm_t));
    printf("sizeof(cudaStream_t) = %zu\n", sizeof(cudaStream_t));
    FIELD(size);
    FIELD(magic);
    FIELD(version);
    FIELD(blocking);
    FIELD(cgaClusterSize);
    FIELD(minCTAs);
    FIELD(maxCTAs);
    FIELD(netName);
    FIELD(splitShare);
    printf("the declared fields end at %zu\n", declared_end());
    printf("config magic = %#llx\n", (unsigned long long)CONFIG_MAGIC);
    printf("config version of NCCL 2.18 = %lld\n", (long long)CONFIG_VERSION_2_18);
    printf("config undefined int = %lld\n", (long long)CONFIG_UNDEF_INT);
    CONSTANT(ncclSuccess);
    CONSTANT(ncclUnhandledCudaError);
    CONSTANT(ncclSystemError);
    CONSTANT(ncclInternalError);
    CONSTANT(ncclInvalidArgument);
    CONSTANT(ncclInvalidUsage);
    CONSTANT(ncclRemoteError);
    CONSTANT(ncclInProgress);
    CONSTANT(ncclNumResults);
    CONSTANT(ncclSum);
    CONSTANT(ncclFloat32);
    CONSTANT(ncclFloat64);
    CONSTANT(ncclBfloat16);
    printf("sizeof(ncclResult_t) = %zu, sizeof(ncclRedOp_t) = %zu, sizeof(ncclDataType_t) = %zu\n",
           sizeof(ncclResult_t), sizeof(ncclRedOp_t), sizeof(ncclDataType_t));
    return 0;
}
