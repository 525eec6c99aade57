/* bias_add (forward; its backward is a sum the op entry does with GEMMs), mean squared error
 * forward and backward, and dtype casts (f32, bf16, f16) with their backward. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/launch.cuh"

namespace {
enum { THREADS = 256, MSE_THREADS = 512 };

/* x and b of types TX, TB (f32, bf16, f16) widened as read; y of their common type, rounded as stored */
template <typename TX, typename TB, typename TY>
__global__ void bias_add_k(const TX *x, const TB *b, TY *y, int64_t n, int64_t C, int64_t inner) {
    CT_GRID_STRIDE(i, n) y[i] = ct_st<TY>(ct_ld(x[i]) + ct_ld(b[ct_k_bias_channel(i, C, inner)]));
}

/* one block: each thread sums its strided elements in double, then a fixed tree; the order
 * depends only on n (deterministic), not on timing. a and b widened as read, the loss f32. */
template <typename TA, typename TB> __global__ void mse_k(const TA *a, const TB *b, int64_t n, float *out) {
    __shared__ double ss[MSE_THREADS];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += MSE_THREADS) {
        float d = ct_ld(a[i]) - ct_ld(b[i]);
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
template <typename TA, typename TB>
__global__ void mse_bwd_k(const TA *a, const TB *b, int64_t n, const float *dloss, float *da, float *db) {
    float sc = ct_k_mse_scale(dloss[0], n);
    CT_GRID_STRIDE(i, n) {
        float t = ct_k_mse_grad(ct_ld(a[i]), ct_ld(b[i]), sc);
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
/* the same 8 elements a thread where ct_x8_fits (the same conversions: ct_ld and ct_st are
 * load's and cast_k's) */
template <typename TF, typename TT> __global__ void cast_k8(const ct_x8<TF> *x, ct_x8<TT> *y, int64_t n8) {
    CT_GRID_STRIDE(i, n8) {
        const ct_x8<TF> a = x[i];
        ct_x8<TT> b;
#pragma unroll
        for (int j = 0; j < 8; j++) b.v[j] = ct_st<TT>(ct_ld(a.v[j]));
        y[i] = b;
    }
}
__global__ void cast_bwd_k8(const ct_x8<float> *g, ct_cuda_cast_type to, ct_x8<float> *dx, int64_t n8) {
    CT_GRID_STRIDE(i, n8) {
        ct_x8<float> a = g[i];
#pragma unroll
        for (int j = 0; j < 8; j++) a.v[j] = rounded(a.v[j], to);
        dx[i] = a;
    }
}
} // namespace

#define LAUNCH(op, kernel, n, ...) CT_LAUNCH_N(op, kernel, n, THREADS, __VA_ARGS__)

extern "C" {
ct_status ct_cuda_bias_add_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const void *b, ct_cuda_cast_type bt, void *y,
                             int64_t n, int64_t C, int64_t inner) {
    if (C <= 0 || inner <= 0) return CT_OK; /* no elements */
    CT_WITH_TYPE(xt, TX, CT_WITH_TYPE(bt, TB, {
        typedef typename ct_common<TX, TB>::T TY;
        LAUNCH("bias_add", (bias_add_k<TX, TB, TY>), n, (const TX *)x, (const TB *)b, (TY *)y, n, C, inner);
    }));
    return CT_OK;
}
ct_status ct_cuda_bias_add(cudaStream_t s, const float *x, const float *b, float *y, int64_t n, int64_t C, int64_t inner) {
    return ct_cuda_bias_add_t(s, x, CT_CUDA_CAST_F32, b, CT_CUDA_CAST_F32, y, n, C, inner);
}
ct_status ct_cuda_mse_t(cudaStream_t s, const void *a, ct_cuda_cast_type at, const void *b, ct_cuda_cast_type bt, int64_t n,
                        float *out) {
    CT_WITH_TYPE(at, TA, CT_WITH_TYPE(bt, TB, mse_k<TA, TB><<<1, MSE_THREADS, 0, s>>>((const TA *)a, (const TB *)b, n, out)));
    CT_LAUNCHED("mse_loss");
    return CT_OK;
}
ct_status ct_cuda_mse(cudaStream_t s, const float *a, const float *b, int64_t n, float *out) {
    return ct_cuda_mse_t(s, a, CT_CUDA_CAST_F32, b, CT_CUDA_CAST_F32, n, out);
}
ct_status ct_cuda_mse_bwd_t(cudaStream_t s, const void *a, ct_cuda_cast_type at, const void *b, ct_cuda_cast_type bt, int64_t n,
                            const float *dloss, float *da, float *db) {
    CT_WITH_TYPE(at, TA, CT_WITH_TYPE(bt, TB, LAUNCH("mse_loss backward", (mse_bwd_k<TA, TB>), n, (const TA *)a, (const TB *)b,
                                                     n, dloss, da, db)));
    return CT_OK;
}
ct_status ct_cuda_mse_bwd(cudaStream_t s, const float *a, const float *b, int64_t n, const float *dloss, float *da,
                          float *db) {
    return ct_cuda_mse_bwd_t(s, a, CT_CUDA_CAST_F32, b, CT_CUDA_CAST_F32, n, dloss, da, db);
}
ct_status ct_cuda_cast(cudaStream_t s, const void *x, ct_cuda_cast_type from, void *y, ct_cuda_cast_type to, int64_t n) {
    if (ct_x8_fits(n, x, y))
        CT_WITH_TYPE(from, TF, CT_WITH_TYPE(to, TT, LAUNCH("cast", (cast_k8<TF, TT>), n / 8, (const ct_x8<TF> *)x, (ct_x8<TT> *)y, n / 8)));
    LAUNCH("cast", cast_k, n, x, from, y, to, n);
}
ct_status ct_cuda_cast_bwd(cudaStream_t s, const float *g, ct_cuda_cast_type to, float *dx, int64_t n) {
    if (ct_x8_fits(n, g, dx)) LAUNCH("cast backward", cast_bwd_k8, n / 8, (const ct_x8<float> *)g, to, (ct_x8<float> *)dx, n / 8);
    LAUNCH("cast backward", cast_bwd_k, n, g, to, dx, n);
}
}
