/* The bottom of src/cuda: the error conversion behind CT_GPU_CHECK (check.h) for the CUDA
 * runtime and NCCL (cuBLASLt's and cuDNN's are in gemm.c and cudnn.c, which load those
 * libraries) and the device queries (count, current device, properties).
 * Without a driver the runtime's first call fails with cudaErrorInsufficientDriver
 * ("CUDA driver version is insufficient for CUDA runtime version"), without a GPU with
 * cudaErrorNoDevice: both are reported as CT_ERR_UNSUPPORTED, and nothing is loaded that
 * would stop a CPU-only run of the same binary. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/tensor.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

void ct_cuda_dev_str(char *buf, size_t n) {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error so later calls are not confused */
        snprintf(buf, n, "cuda:?");
    } else {
        snprintf(buf, n, "cuda:%d", d);
    }
}

ct_status ct_gpu_check_cuda(int code, const char *call, const char *op) {
    cudaError_t e = (cudaError_t)code;
    if (e == cudaSuccess) return CT_OK;
    char dev[32];
    ct_cuda_dev_str(dev, sizeof dev);
    ct_status st = e == cudaErrorMemoryAllocation ? CT_ERR_NOMEM
                   : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice)
                       ? CT_ERR_UNSUPPORTED
                       : CT_ERR_SYSTEM;
    return ct_error(st, "%s on %s: %s failed: %s (%s)", op, dev, call, cudaGetErrorString(e), cudaGetErrorName(e));
}

ct_status ct_gpu_check_nccl(int code, const char *call, const char *op) {
    ncclResult_t e = (ncclResult_t)code;
    if (e == ncclSuccess || e == ncclInProgress) return CT_OK; /* in progress: non-blocking communicators */
    char dev[32];
    ct_cuda_dev_str(dev, sizeof dev);
    ct_status st = e == ncclRemoteError ? CT_ERR_PEER : e == ncclInvalidArgument || e == ncclInvalidUsage ? CT_ERR_INVALID
                                                                                                           : CT_ERR_SYSTEM;
    return ct_error(st, "%s on %s: %s failed: %s", op, dev, call, ncclGetErrorString(e));
}

ct_status ct_cuda_device_count(int *n) {
    *n = 0;
    int c = 0;
    ct_status st = CT_GPU_CHECK(cuda, "device count", cudaGetDeviceCount(&c));
    if (st != CT_OK) return st;
    *n = c;
    return CT_OK;
}

ct_status ct_cuda_current_device(int *dev) {
    *dev = 0;
    return CT_GPU_CHECK(cuda, "current device", cudaGetDevice(dev));
}

ct_status ct_cuda_set_device(int dev, const char *op) {
    return CT_GPU_CHECK(cuda, op, cudaSetDevice(dev));
}

ct_status ct_cuda_device_info_get(int dev, ct_device_info *out) {
    memset(out, 0, sizeof *out);
    struct cudaDeviceProp p;
    CT_GPU_TRY(cuda, "device info", cudaGetDeviceProperties(&p, dev));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->total_bytes = p.totalGlobalMem;
    int prev = 0;
    CT_GPU_TRY(cuda, "device info", cudaGetDevice(&prev));
    CT_GPU_TRY(cuda, "device info", cudaSetDevice(dev));
    size_t fr = 0, tot = 0;
    ct_status st = CT_GPU_CHECK(cuda, "device info", cudaMemGetInfo(&fr, &tot));
    (void)cudaSetDevice(prev);
    out->free_bytes = fr;
    return st;
}
