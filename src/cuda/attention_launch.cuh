/* Launches shared by the tile kernels of attention_tiled.cu and attention_tc.cu. Each family
 * has a forward kernel, a dK/dV kernel (one block per key tile) and a dQ kernel (one block per
 * query tile), with these signatures, `rows`-row tiles, and more shared memory than the 48 KiB
 * a kernel gets by default (so each launch asks for its bytes first). */
#ifndef CT_CUDA_ATTENTION_LAUNCH_CUH
#define CT_CUDA_ATTENTION_LAUNCH_CUH
#include <math.h>

#include "cuda/launch.cuh"

template <typename T> using ct_attn_fwd_fn = void (*)(const T *, const T *, const T *, T *, float *, int64_t, bool, float, int64_t);
template <typename T>
using ct_attn_dkv_fn = void (*)(const T *, const T *, const T *, const T *, const float *, const float *, T *, T *, int64_t, bool,
                                float, int64_t);
template <typename T>
using ct_attn_dq_fn = void (*)(const T *, const T *, const T *, const T *, const float *, const float *, T *, int64_t, bool, float, int64_t);

template <typename K> static ct_status ct_attn_allow_smem(K kernel, size_t bytes, const char *op) {
    return CT_GPU_CHECK(cuda, op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
/* grid: one block per `rows` rows of each of the BH heads */
template <typename T>
static ct_status ct_attn_launch_fwd(cudaStream_t s, ct_attn_fwd_fn<T> k, size_t smem, int threads, int rows, int D, const void *q,
                                    const void *kk, const void *v, void *o, float *lse, int64_t BH, int64_t n, bool causal, int64_t G) {
    ct_status st = ct_attn_allow_smem(k, smem, "attention");
    if (st != CT_OK) return st;
    dim3 grid((unsigned)((n + rows - 1) / rows), (unsigned)BH);
    k<<<grid, threads, smem, s>>>((const T *)q, (const T *)kk, (const T *)v, (T *)o, lse, n, causal, 1.0f / sqrtf((float)D), G);
    CT_LAUNCHED("attention");
    return CT_OK;
}
template <typename T>
static ct_status ct_attn_launch_bwd(cudaStream_t s, ct_attn_dkv_fn<T> kkv, size_t smem_kv, ct_attn_dq_fn<T> kq, size_t smem_q,
                                    int threads, int rows, int D, const void *q, const void *k, const void *v, const void *g,
                                    const float *lse, const float *dr, void *dq, void *dk, void *dv, int64_t BH, int64_t n,
                                    bool causal, int64_t G) {
    ct_status st = ct_attn_allow_smem(kkv, smem_kv, "attention backward");
    if (st == CT_OK) st = ct_attn_allow_smem(kq, smem_q, "attention backward");
    if (st != CT_OK) return st;
    dim3 grid((unsigned)((n + rows - 1) / rows), (unsigned)BH);
    const float sc = 1.0f / sqrtf((float)D);
    kkv<<<grid, threads, smem_kv, s>>>((const T *)q, (const T *)k, (const T *)v, (const T *)g, lse, dr, (T *)dk, (T *)dv, n, causal,
                                       sc, G);
    kq<<<grid, threads, smem_q, s>>>((const T *)q, (const T *)k, (const T *)v, (const T *)g, lse, dr, (T *)dq, n, causal, sc, G);
    CT_LAUNCHED("attention backward");
    return CT_OK;
}
#endif
