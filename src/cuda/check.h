/* Checking every CUDA runtime, cuBLAS(Lt), cuDNN and NCCL call through one macro:
 *
 *   CT_GPU_TRY(cuda, "layer_norm", cudaGetLastError());      // returns the ct_status on failure
 *   ct_status st = CT_GPU_CHECK(nccl, "all_reduce", ncclAllReduce(...));
 *
 * The first argument names the library (cuda, cublas, cudnn, nccl); a failure becomes ct_error
 * with a message naming the call as written, the current device and the op, e.g.
 * "layer_norm on cuda:0: cudaMalloc(&p, n) failed: out of memory (cudaErrorMemoryAllocation)",
 * and a status: CT_ERR_NOMEM for allocation failures, CT_ERR_UNSUPPORTED for no driver or
 * device (or what cuDNN does not support), CT_ERR_INVALID for bad parameters, CT_ERR_PEER for NCCL remote errors, CT_ERR_SYSTEM otherwise. */
#ifndef CT_CUDA_CHECK_H
#define CT_CUDA_CHECK_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

ct_status ct_gpu_check_cuda(int code, const char *call, const char *op);
ct_status ct_gpu_check_cublas(int code, const char *call, const char *op);
ct_status ct_gpu_check_cudnn(int code, const char *call, const char *op);
ct_status ct_gpu_check_nccl(int code, const char *call, const char *op);

#define CT_GPU_CHECK(lib, op, call) ct_gpu_check_##lib((int)(call), #call, (op))
#define CT_GPU_TRY(lib, op, call)                                  \
    do {                                                           \
        ct_status ct_st_ = CT_GPU_CHECK(lib, op, call);            \
        if (ct_st_ != CT_OK) return ct_st_;                        \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
