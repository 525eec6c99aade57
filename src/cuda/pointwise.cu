/* bias_add (forward; its backward is a sum the op entry does with GEMMs), mean squared error
 * forward and backward, and dtype casts (f32, bf16, f16) with their backward. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/launch.cuh"

namespace {
enum { THREADS = 256, MSE_THREADS = 512 };

__global__ void bias_add_k(const float *x, const float *b, float *y, int64_t n, int64_t C, int64_t inner) {
    CT_GRID_STRIDE(i, n) y[i] = x[i] + b[ct_k_bias_channel(i, C, inner)];
}

/* one block: each thread sums its strided elements in double, then a fixed tree; the order
 * depends only on n (deterministic), not on timing */
__global__ void mse_k(const float *a, const float *b, int64_t n, float *out) {
    __shared__ double ss[MSE_THREADS];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += MSE_THREADS) {
        float d = a[i] - b[i];
        s += (double)(d * d);
    }
    ss[threadIdx.x] = s;
    __syncthreads();
    for (int o = MSE_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) ss[threadIdx.x] += ss[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = n ? (float)(ss[0] / (double)n) : NAN;
}
__global__ void mse_bwd_k(const float *a, const float *b, int64_t n, const float *dloss, float *da, float *db) {
    float sc = ct_k_mse_scale(dloss[0], n);
    CT_GRID_STRIDE(i, n) {
        float t = ct_k_mse_grad(a[i], b[i], sc);
        if (da) da[i] = t;
        if (db) db[i] = -t;
    }
}

__device__ inline float load(const void *x, ct_cuda_cast_type t, int64_t i) {
    if (t == CT_CUDA_CAST_BF16) return ct_k_bf16_to_f32(((const uint16_t *)x)[i]);
    if (t == CT_CUDA_CAST_F16) return __half2float(((const __half *)x)[i]);
    return ((const float *)x)[i];
}
/* v rounded to t's precision (to nearest even), as a float */
__device__ inline float rounded(float v, ct_cuda_cast_type t) {
    if (t == CT_CUDA_CAST_BF16) return ct_k_bf16_to_f32(ct_k_f32_to_bf16(v));
    if (t == CT_CUDA_CAST_F16) return __half2float(__float2half_rn(v));
    return v;
}
__global__ void cast_k(const void *x, ct_cuda_cast_type from, void *y, ct_cuda_cast_type to, int64_t n) {
    CT_GRID_STRIDE(i, n) {
        float v = load(x, from, i);
        if (to == CT_CUDA_CAST_BF16) ((uint16_t *)y)[i] = ct_k_f32_to_bf16(v);
        else if (to == CT_CUDA_CAST_F16) ((__half *)y)[i] = __float2half_rn(v);
        else ((float *)y)[i] = v;
    }
}
__global__ void cast_bwd_k(const float *g, ct_cuda_cast_type to, float *dx, int64_t n) {
    CT_GRID_STRIDE(i, n) dx[i] = rounded(g[i], to);
}
} // namespace

#define LAUNCH(op, kernel, n, ...) CT_LAUNCH_N(op, kernel, n, THREADS, __VA_ARGS__)

extern "C" {
ct_status ct_cuda_bias_add(cudaStream_t s, const float *x, const float *b, float *y, int64_t n, int64_t C, int64_t inner) {
    if (C <= 0 || inner <= 0) return CT_OK; /* no elements */
    LAUNCH("bias_add", bias_add_k, n, x, b, y, n, C, inner);
}
ct_status ct_cuda_mse(cudaStream_t s, const float *a, const float *b, int64_t n, float *out) {
    mse_k<<<1, MSE_THREADS, 0, s>>>(a, b, n, out);
    CT_LAUNCHED("mse_loss");
    return CT_OK;
}
ct_status ct_cuda_mse_bwd(cudaStream_t s, const float *a, const float *b, int64_t n, const float *dloss, float *da,
                          float *db) {
    LAUNCH("mse_loss backward", mse_bwd_k, n, a, b, n, dloss, da, db);
}
ct_status ct_cuda_cast(cudaStream_t s, const void *x, ct_cuda_cast_type from, void *y, ct_cuda_cast_type to, int64_t n) {
    LAUNCH("cast", cast_k, n, x, from, y, to, n);
}
ct_status ct_cuda_cast_bwd(cudaStream_t s, const float *g, ct_cuda_cast_type to, float *dx, int64_t n) {
    LAUNCH("cast backward", cast_bwd_k, n, g, to, dx, n);
}
}
