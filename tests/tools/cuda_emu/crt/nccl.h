/* NCCL's C API as the emulated device gives it (tests/tools/cuda_emu/emu_nccl.cc): the calls
 * src/distributed/nccl.c makes, with the same names, enum values and non-blocking semantics,
 * between processes on one machine (each an emulated GPU of host memory). Usage is NCCL's:
 *
 *   ncclUniqueId id;  ncclGetUniqueId(&id);            // rank 0, then shared (the store)
 *   ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;  cfg.blocking = 0;
 *   ncclCommInitRankConfig(&comm, n, id, rank, &cfg);  // ncclInProgress until all n joined
 *   ncclAllReduce(x, x, count, ncclFloat32, ncclSum, comm, stream);
 *   while (cudaStreamQuery(stream) == cudaErrorNotReady) ncclCommGetAsyncError(comm, &e);
 */
#ifndef CT_CUDA_EMU_NCCL_H
#define CT_CUDA_EMU_NCCL_H
#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3, ncclInvalidArgument = 4,
    ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7, ncclNumResults = 8
} ncclResult_t;
typedef enum {
    ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8, ncclDouble = 8, ncclBfloat16 = 9
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct {
    size_t size;
    unsigned magic, version;
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {sizeof(ncclConfig_t), 0xcafebeefu, 0, 1}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t r);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sbuf, void *rbuf, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t s);
ncclResult_t ncclBroadcast(const void *sbuf, void *rbuf, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t s);
ncclResult_t ncclReduce(const void *sbuf, void *rbuf, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclAllGather(const void *sbuf, void *rbuf, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t s);
ncclResult_t ncclReduceScatter(const void *sbuf, void *rbuf, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
#ifdef __cplusplus
}
#endif
#endif
