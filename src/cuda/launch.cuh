/* Shared by the .cu files: grid sizes and the launch check. */
#ifndef CT_CUDA_LAUNCH_CUH
#define CT_CUDA_LAUNCH_CUH
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/cuda.h"

/* grid-stride loops: enough blocks to fill any of the target GPUs, never more than needed */
static inline unsigned ct_grid(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
#define CT_GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
/* a kernel launch's own error (bad configuration) and any earlier asynchronous one */
#define CT_LAUNCHED(op) CT_GPU_TRY(cuda, op, cudaGetLastError())
/* a grid-stride kernel over n elements on stream s, checked; returns from the wrapper */
#define CT_LAUNCH_N(op, kernel, n, threads, ...)                                                \
    do {                                                                                        \
        if ((n) > 0) kernel<<<ct_grid(n, threads), threads, 0, s>>>(__VA_ARGS__);               \
        CT_LAUNCHED(op);                                                                        \
        return CT_OK;                                                                           \
    } while (0)

/* warp-wide sum and online log-sum-exp merge (all 32 lanes take part) */
__device__ static inline float ct_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#endif
