/* nccl_api.h: the part of NCCL's interface the runtime uses, transcribed from nccl.h
 * (NCCL >= 2.18), so that the runtime builds without NCCL installed and loads
 * libnccl.so.2 at run time; tests/gpu/nccl_abi.c holds these against the real nccl.h
 * where it is installed. The stand-in NCCL of the tests (tests/gpu/fake_nccl.c) is
 * built on this header too.
 *
 * Also here: what the emulated device gives as a stream's native handle, where CUDA
 * gives a CUstream. A library that takes streams (the stand-in NCCL) queues its work on
 * the emulated device through it, and that work runs in the stream's order, when the
 * emulated device runs its queue, as a GPU would run a kernel. */
#ifndef DDP_NCCL_API_H
#define DDP_NCCL_API_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef enum { ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;

typedef struct ncclComm *ncclComm_t;
typedef void *cudaStream_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* The configuration's first fields, as NCCL 2.18 laid them out; `size` and `version`
 * tell a newer NCCL that the fields after them are absent (left at their defaults). */
typedef struct ncclConfig_v21800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
} ncclConfig_t;

#define DDP_NCCL_CONFIG_MAGIC 0xcafebeef
#define DDP_NCCL_CONFIG_VERSION 21800 /* NCCL_VERSION(2, 18, 0) */
#define DDP_NCCL_CONFIG_UNDEF_INT INT_MIN

/* The calls, as the runtime resolves them (name, parameters). */
#define DDP_NCCL_CALLS(X)                                                                                    \
    X(ncclGetVersion, (int *))                                                                               \
    X(ncclGetUniqueId, (ncclUniqueId *))                                                                     \
    X(ncclCommInitRankConfig, (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *))                        \
    X(ncclCommGetAsyncError, (ncclComm_t, ncclResult_t *))                                                   \
    X(ncclCommFinalize, (ncclComm_t))                                                                        \
    X(ncclCommDestroy, (ncclComm_t))                                                                         \
    X(ncclCommAbort, (ncclComm_t))                                                                           \
    X(ncclAllReduce, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))  \
    X(ncclGroupStart, (void))                                                                                \
    X(ncclGroupEnd, (void))

/* ------------------------------------------------- the emulated device's streams */

#define DDP_EMULATED_STREAM_MAGIC 0x316d727473706464ull /* "ddpstrm1" */

/* The native handle of an emulated stream (a cudaStream_t to the library given it). */
typedef struct ddp_emulated_stream {
    uint64_t magic;             /* DDP_EMULATED_STREAM_MAGIC: anything else is no emulated stream */
    void *device;               /* the emulated device's, for the calls below */
    int stream;
    /* Queues run(arg) on the stream: it runs after the work queued on the stream before
     * it, with device memory readable and writable, on the thread that runs the
     * emulated device's queue; 0, or -1 when it cannot be queued. */
    int (*enqueue)(struct ddp_emulated_stream *s, void (*run)(void *arg), void *arg);
    /* 1 when [p, p + bytes) is allocated memory of this device, else 0. */
    int (*on_device)(struct ddp_emulated_stream *s, const void *p, size_t bytes);
} ddp_emulated_stream;

/* The stand-in NCCL defines this symbol: the runtime gives it emulated streams, and
 * gives them to no other NCCL (nor the stand-in CUDA streams). */
#define DDP_STANDIN_NCCL_SYMBOL "ddp_standin_nccl"

#endif
