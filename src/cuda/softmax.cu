/* Row softmax and log-softmax (forward and backward), and attention's masked softmax rows:
 * one warp per row, lanes striding over the row and merging by shuffles. Each row is read
 * three times (max, sum, write): the rows of these ops fit in L2, and the two-pass form is
 * the CPU op's (ops/kmath.h's ct_k_softmax_row), so the same per-element functions apply. */
#include <math.h>

#include "cuda/launch.cuh"

namespace {
enum { WARPS = 8, THREADS = 256 };

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v; /* the CPU's select: a NaN does not win */
    }
    return v;
}
__device__ inline double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* keys row r sees: all D, or with the causal mask query i = r % T sees j <= i */
__device__ inline int64_t visible(int64_t r, int64_t D, int64_t causal_T) {
    if (causal_T <= 0) return D;
    int64_t i = r % causal_T + 1;
    return i < D ? i : D;
}

/* x of type TX (f32, bf16 or f16), widened as read; y f32 (an f32 op under autocast) */
template <typename TX>
__global__ void softmax_k(const TX *x, float *y, int64_t R, int64_t D, bool log_out, int64_t causal_T) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= R) return;
    const TX *xr = x + r * D;
    float *yr = y + r * D;
    int64_t nv = visible(r, D, causal_T);
    float m = -INFINITY, s = 0;
    for (int64_t j = lane; j < nv; j += 32) {
        float v = ct_ld(xr[j]);
        m = v > m ? v : m;
    }
    m = warp_max(m);
    for (int64_t j = lane; j < nv; j += 32) s += ct_vexpf(ct_ld(xr[j]) - m);
    s = ct_warp_sum(s);
    float lse = ct_k_attn_lse(m, s), inv = 1.0f / s;
    for (int64_t j = lane; j < nv; j += 32)
        yr[j] = log_out ? ct_k_log_softmax_out(ct_ld(xr[j]), lse) : ct_k_softmax_out(ct_ld(xr[j]), m, inv);
    for (int64_t j = nv + lane; j < D; j += 32) yr[j] = 0.0f;
}

__global__ void softmax_bwd_k(const float *y, const float *g, float *dx, int64_t R, int64_t D, bool log_out) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= R) return;
    const float *yr = y + r * D, *gr = g + r * D;
    float *o = dx + r * D;
    double dd = 0;
    float gs = 0;
    for (int64_t j = lane; j < D; j += 32) {
        if (log_out) gs += gr[j];
        else dd += (double)gr[j] * yr[j];
    }
    if (log_out) gs = ct_warp_sum(gs);
    else dd = warp_sum_d(dd);
    float dot = (float)dd;
    for (int64_t j = lane; j < D; j += 32)
        o[j] = log_out ? ct_k_log_softmax_bwd(yr[j], gr[j], gs) : ct_k_softmax_bwd(yr[j], gr[j], dot);
}

__global__ void attention_ds_k(const float *P, float *dS, int64_t R, int64_t Tk, int64_t Tq, bool causal, float scale) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= R) return;
    const float *p = P + r * Tk;
    float *d = dS + r * Tk;
    int64_t nv = visible(r, Tk, causal ? Tq : 0);
    float dot = 0;
    for (int64_t j = lane; j < nv; j += 32) dot += d[j] * p[j];
    dot = ct_warp_sum(dot);
    for (int64_t j = lane; j < nv; j += 32) d[j] = ct_k_attn_ds(p[j], d[j], dot, scale);
    for (int64_t j = nv + lane; j < Tk; j += 32) d[j] = 0.0f;
}
} // namespace

/* one warp per row, WARPS rows per block; returns from the wrapper */
#define LAUNCH_ROWS(op, kernel, R, ...)                                                       \
    do {                                                                                      \
        if ((R) > 0) kernel<<<(unsigned)(((R) + WARPS - 1) / WARPS), THREADS, 0, s>>>(__VA_ARGS__); \
        CT_LAUNCHED(op);                                                                      \
        return CT_OK;                                                                         \
    } while (0)

extern "C" ct_status ct_cuda_softmax_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, float *y, int64_t R, int64_t D,
                                       bool log_out, int64_t causal_T) {
    CT_WITH_TYPE(xt, T, LAUNCH_ROWS(log_out ? "log_softmax" : "softmax", softmax_k<T>, R, (const T *)x, y, R, D, log_out,
                                    causal_T));
    return CT_OK;
}
extern "C" ct_status ct_cuda_softmax(cudaStream_t s, const float *x, float *y, int64_t R, int64_t D, bool log_out,
                                     int64_t causal_T) {
    return ct_cuda_softmax_t(s, x, CT_CUDA_CAST_F32, y, R, D, log_out, causal_T);
}
extern "C" ct_status ct_cuda_softmax_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t R, int64_t D,
                                         bool log_out) {
    LAUNCH_ROWS(log_out ? "log_softmax backward" : "softmax backward", softmax_bwd_k, R, y, g, dx, R, D, log_out);
}
extern "C" ct_status ct_cuda_attention_ds(cudaStream_t s, const float *P, float *dS, int64_t R, int64_t Tk, int64_t Tq,
                                          bool causal, float scale) {
    LAUNCH_ROWS("attention backward", attention_ds_k, R, P, dS, R, Tk, Tq, causal, scale);
}
