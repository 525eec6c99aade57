/* What `ctrain env` reports about the GPUs beyond their properties (the device hooks behind
 * tensor.h's ct_device_versions and ct_device_check): the versions of the libraries under
 * src/cuda, and one NCCL all-reduce across every visible GPU from one process
 * (ncclCommInitAll), checked against the expected sum, with its bus bandwidth. */
#include <cudnn_graph.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

void ct_cuda_versions(char *buf, size_t n) {
    int drv = 0, rt = 0, nc = 0;
    char d[32] = "none";
    if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) snprintf(d, sizeof d, "%d.%d", drv / 1000, drv % 1000 / 10);
    (void)cudaRuntimeGetVersion(&rt);
    (void)ncclGetVersion(&nc);
    size_t lt = ct_cuda_cublaslt_version(), dn = ct_cuda_cudnn_version();
    char cd[400];
    if (dn) snprintf(cd, sizeof cd, "cuDNN %zu.%zu.%zu", dn / 10000, dn / 100 % 100, dn % 100);
    else snprintf(cd, sizeof cd, "%s (headers %d.%d.%d)", ct_cuda_cudnn_load_error(), CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
    snprintf(buf, n, "driver %s, runtime %d.%d, cuBLASLt %zu.%zu.%zu, NCCL %d.%d.%d, %s", d, rt / 1000, rt % 1000 / 10,
             lt / 10000, lt / 100 % 100, lt % 100, nc / 10000, nc / 100 % 100, nc % 100, cd);
}

#define MAX_GPUS 64
#define COUNT ((size_t)16 << 20) /* 64 MiB of f32 per GPU */

static ct_status run(int n, ncclComm_t *comms, float **bufs, cudaStream_t *ss, double *secs) {
    const char *op = "nccl check";
    for (int d = 0; d < n; d++) {
        CT_GPU_TRY(cuda, op, cudaSetDevice(d));
        CT_GPU_TRY(cuda, op, cudaStreamCreate(&ss[d]));
        ct_status st = ct_cuda_alloc(d, COUNT * sizeof(float), (void **)&bufs[d]);
        if (st != CT_OK) return st;
        /* GPU d holds d + 1 everywhere: the sum is n (n + 1) / 2 */
        st = ct_cuda_fill(ss[d], bufs[d], (float)(d + 1), (int64_t)COUNT);
        if (st != CT_OK) return st;
        CT_GPU_TRY(cuda, op, cudaStreamSynchronize(ss[d]));
    }
    double t0 = ct_time_now();
    CT_GPU_TRY(nccl, op, ncclGroupStart());
    for (int d = 0; d < n; d++)
        CT_GPU_TRY(nccl, op, ncclAllReduce(bufs[d], bufs[d], COUNT, ncclFloat32, ncclSum, comms[d], ss[d]));
    CT_GPU_TRY(nccl, op, ncclGroupEnd());
    for (int d = 0; d < n; d++) {
        CT_GPU_TRY(cuda, op, cudaSetDevice(d));
        CT_GPU_TRY(cuda, op, cudaStreamSynchronize(ss[d]));
    }
    *secs = ct_time_now() - t0;
    float want = (float)n * (float)(n + 1) / 2, got[2];
    for (int d = 0; d < n; d++) {
        CT_GPU_TRY(cuda, op, cudaSetDevice(d));
        CT_GPU_TRY(cuda, op, cudaMemcpy(&got[0], bufs[d], sizeof(float), cudaMemcpyDeviceToHost));
        CT_GPU_TRY(cuda, op, cudaMemcpy(&got[1], bufs[d] + COUNT - 1, sizeof(float), cudaMemcpyDeviceToHost));
        if (got[0] != want || got[1] != want)
            return ct_error(CT_ERR_SYSTEM, "nccl check: GPU %d holds %g and %g after the all-reduce, expected %g", d,
                            (double)got[0], (double)got[1], (double)want);
    }
    return CT_OK;
}

ct_status ct_cuda_nccl_check(char *report, size_t len) {
    report[0] = 0;
    int n = 0;
    ct_status st = ct_cuda_device_count(&n);
    if (st != CT_OK) return st;
    if (n < 1) return ct_error(CT_ERR_UNSUPPORTED, "nccl check: no CUDA device is visible");
    if (n > MAX_GPUS) n = MAX_GPUS;
    ncclComm_t comms[MAX_GPUS] = {0};
    float *bufs[MAX_GPUS] = {0};
    cudaStream_t ss[MAX_GPUS] = {0};
    double secs = 0;
    st = CT_GPU_CHECK(nccl, "nccl check", ncclCommInitAll(comms, n, NULL));
    if (st == CT_OK) st = run(n, comms, bufs, ss, &secs);
    for (int d = 0; d < n; d++) {
        if (comms[d]) (void)ncclCommDestroy(comms[d]);
        if (ss[d]) (void)cudaStreamDestroy(ss[d]);
        ct_cuda_free(bufs[d]);
    }
    if (st != CT_OK) return st;
    double algbw = (double)(COUNT * sizeof(float)) / secs / 1e9;
    snprintf(report, len, "nccl all-reduce of %zu MiB across %d GPU%s correct, %.1f GB/s bus bandwidth (one call, cold)",
             COUNT * sizeof(float) >> 20, n, n > 1 ? "s" : "", n > 1 ? algbw * 2.0 * (n - 1) / n : algbw);
    return CT_OK;
}
