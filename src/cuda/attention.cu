/* Flash-style attention, forward and backward, in f32, bf16 and f16 (f32 arithmetic). One
 * thread runs one query row (forward, dQ) or one key row (dK, dV) through the row functions of
 * ops/kmath.h: the online softmax over key tiles, then backward from the saved log-sum-exp
 * per row, so memory beyond inputs and outputs is O(T) (lse and Dr) and no [T, T] matrix is
 * formed. dK/dV by key rows and dQ by query rows need no atomics: every gradient element is
 * summed by one thread in a fixed order. The threads of a block take consecutive rows of one
 * head and read the same K/V (or Q/dO) rows at the same time, which the cache broadcasts;
 * this is the simple form of the algorithm, not a tensor-core kernel. Grouped-query (G query
 * heads per key/value head, all three families): query head h reads k, v at head h / G, and
 * dK, dV are written per query head (the caller sums each group). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ctrain/config.h"
#include "cuda/attention_tiled.cuh"
#include "cuda/launch.cuh"

/* the row functions for 2-byte types: here, not in kmath.h, which C files include too */
#define CT_K_BF16_LD(x) __bfloat162float(x)
#define CT_K_BF16_ST(x) __float2bfloat16(x)
CT_K_DEFINE_ATTN(bf16, __nv_bfloat16, CT_K_BF16_LD, CT_K_BF16_ST)
#define CT_K_F16_LD(x) __half2float(x)
#define CT_K_F16_ST(x) __float2half_rn(x)
CT_K_DEFINE_ATTN(f16, __half, CT_K_F16_LD, CT_K_F16_ST)

namespace {
enum { ROWS = 64 };

/* rows<E>: kmath.h's row functions for element type E (suffix SUF), its dtype, its load */
template <typename E> struct rows;
#define ROWS_OF(SUF, E, DT, LD)                                                                                        \
    template <> struct rows<E> {                                                                                       \
        static constexpr ct_cuda_dtype dt = DT;                                                                        \
        __device__ static void fwd(const E *q, const E *K, const E *V, int64_t nk, int D, float sc, E *o, float *l) {  \
            ct_k_attn_fwd_row_##SUF(q, K, V, nk, D, D, sc, o, l);                                                      \
        }                                                                                                              \
        __device__ static void dq(const E *q, const E *g, const E *K, const E *V, int64_t nk, int D, float sc,        \
                                  float l, float dr, E *dq) {                                                          \
            ct_k_attn_dq_row_##SUF(q, g, K, V, nk, D, D, sc, l, dr, dq);                                               \
        }                                                                                                              \
        __device__ static void dkv(const E *k, const E *v, const E *Q, const E *G, const float *l, const float *dr,    \
                                   int64_t i0, int64_t nq, int D, float sc, E *dk, E *dv) {                            \
            ct_k_attn_dkv_row_##SUF(k, v, Q, G, l, dr, i0, nq, D, D, sc, dk, dv);                                      \
        }                                                                                                              \
        __device__ static float ld(E x) { return LD(x); }                                                              \
    };
ROWS_OF(f32, float, CT_CUDA_F32, CT_K_F32_LD)
ROWS_OF(bf16, __nv_bfloat16, CT_CUDA_BF16, CT_K_BF16_LD)
ROWS_OF(f16, __half, CT_CUDA_F16, CT_K_F16_LD)
#undef ROWS_OF

/* DC: the head dim as a compile-time constant (0: D at run time). With it the row
 * functions' loops over D unroll and their per-thread arrays live in registers; with D at run
 * time they are indexed memory (local, per thread), several times slower. Same arithmetic. */
template <typename T, int DC>
__global__ void fwd_k(const T *q, const T *k, const T *v, T *o, float *lse, int64_t T_, int D_, bool causal, float sc,
                      int64_t G) {
    const int D = DC ? DC : D_;
    int64_t h = blockIdx.y, i = (int64_t)blockIdx.x * ROWS + threadIdx.x;
    if (i >= T_) return;
    const int64_t base = h * T_ * D;
    const int64_t kb = h / G * T_ * D; /* the key/value head of query head h */
    rows<T>::fwd(q + base + i * D, k + kb, v + kb, causal ? i + 1 : T_, D, sc, o + base + i * D, lse + h * T_ + i);
}
template <typename T> __global__ void dr_k(const T *o, const T *g, float *dr, int64_t n, int D) {
    CT_GRID_STRIDE(r, n) {
        float s = 0;
        for (int c = 0; c < D; c++) s = fmaf(rows<T>::ld(g[r * D + c]), rows<T>::ld(o[r * D + c]), s);
        dr[r] = s;
    }
}
template <typename T, int DC>
__global__ void dq_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr, T *dq, int64_t T_,
                     int D_, bool causal, float sc, int64_t G) {
    const int D = DC ? DC : D_;
    int64_t h = blockIdx.y, i = (int64_t)blockIdx.x * ROWS + threadIdx.x;
    if (i >= T_) return;
    const int64_t base = h * T_ * D;
    const int64_t kb = h / G * T_ * D;
    rows<T>::dq(q + base + i * D, g + base + i * D, k + kb, v + kb, causal ? i + 1 : T_, D, sc, lse[h * T_ + i],
                dr[h * T_ + i], dq + base + i * D);
}
template <typename T, int DC>
__global__ void dkv_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr, T *dk, T *dv,
                      int64_t T_, int D_, bool causal, float sc, int64_t G) {
    const int D = DC ? DC : D_;
    int64_t h = blockIdx.y, j = (int64_t)blockIdx.x * ROWS + threadIdx.x;
    if (j >= T_) return;
    const int64_t base = h * T_ * D;
    const int64_t kb = h / G * T_ * D;
    rows<T>::dkv(k + kb + j * D, v + kb + j * D, q + base, g + base, lse + h * T_, dr + h * T_, causal ? j : 0, T_, D, sc,
                 dk + base + j * D, dv + base + j * D);
}

/* CTRAIN_CUDA_ATTENTION: the tensor-core kernels (tc, the default; mma: the register-tile ones
 * of attention_mma.cu where they fit, tc's elsewhere) for bf16/f16 where they fit, else the tiled ones (tiled, or tc on f32) where those fit, else the rows. The fastest first,
 * as measured on an H200 (GPT-2 small's bf16 step, 2026-12-04: tc 88 ms, tiled 95, rows 599) */
bool mma(ct_cuda_dtype dt, int D) { return ct_config_choice(CT_CFG_CUDA_ATTENTION) == 3 && ct_cuda_attention_mma_fits(dt, D); }
bool tc(ct_cuda_dtype dt, int D) { return ct_config_choice(CT_CFG_CUDA_ATTENTION) >= 2 && ct_cuda_attention_tc_fits(dt, D); }
bool tiled(int D) { return ct_cuda_attention_tiled_fits(D) && ct_config_choice(CT_CFG_CUDA_ATTENTION) >= 1; }

ct_status check_shape(const char *op, int64_t BH, int64_t T, int D, int64_t G) {
    if (D <= 0 || D > CT_K_ATTN_MAX_D || BH > 65535 || BH < 0 || T < 0 || G < 1 || BH % G != 0)
        return ct_error(CT_ERR_INVALID, "cuda %s: head dim %d (1..%d), %lld heads (<= 65535) in groups of %lld, T %lld not supported",
                        op, D, CT_K_ATTN_MAX_D, (long long)BH, (long long)G, (long long)T);
    return CT_OK;
}

template <typename T>
ct_status attn_fwd(cudaStream_t s, const void *q, const void *k, const void *v, void *o, float *lse, int64_t BH, int64_t T_,
                   int D, bool causal, int64_t G) {
    dim3 grid((unsigned)((T_ + ROWS - 1) / ROWS), (unsigned)BH);
    if (mma(rows<T>::dt, D)) return ct_cuda_attention_mma(s, rows<T>::dt, q, k, v, o, lse, BH, T_, D, causal, G);
    if (tc(rows<T>::dt, D)) return ct_cuda_attention_tc(s, rows<T>::dt, q, k, v, o, lse, BH, T_, D, causal, G);
    if (tiled(D)) return ct_cuda_attention_tiled(s, rows<T>::dt, q, k, v, o, lse, BH, T_, D, causal, G);
    float sc = 1.0f / sqrtf((float)D);
#define FWD(DC) fwd_k<T, DC><<<grid, ROWS, 0, s>>>((const T *)q, (const T *)k, (const T *)v, (T *)o, lse, T_, D, causal, sc, G)
    if (D == 64) FWD(64);
    else if (D == 32) FWD(32);
    else if (D == 128) FWD(128);
    else FWD(0);
#undef FWD
    CT_LAUNCHED("attention");
    return CT_OK;
}
template <typename T>
ct_status attn_bwd(cudaStream_t s, const void *q, const void *k, const void *v, const void *o, const void *g, const float *lse,
                   float *dr, void *dq, void *dk, void *dv, int64_t BH, int64_t T_, int D, bool causal,
                   int64_t G) {
    dim3 grid((unsigned)((T_ + ROWS - 1) / ROWS), (unsigned)BH);
    float sc = 1.0f / sqrtf((float)D);
    dr_k<T><<<ct_grid(BH * T_, 256), 256, 0, s>>>((const T *)o, (const T *)g, dr, BH * T_, D);
    if (mma(rows<T>::dt, D))
        return ct_cuda_attention_mma_bwd(s, rows<T>::dt, q, k, v, g, lse, dr, dq, dk, dv, BH, T_, D, causal, G);
    if (tc(rows<T>::dt, D)) return ct_cuda_attention_tc_bwd(s, rows<T>::dt, q, k, v, g, lse, dr, dq, dk, dv, BH, T_, D, causal, G);
    if (tiled(D))
        return ct_cuda_attention_tiled_bwd(s, rows<T>::dt, q, k, v, g, lse, dr, dq, dk, dv, BH, T_, D, causal, G);
#define BWD(DC)                                                                                                    \
    do {                                                                                                           \
        dq_k<T, DC><<<grid, ROWS, 0, s>>>((const T *)q, (const T *)k, (const T *)v, (const T *)g, lse, dr, (T *)dq, T_, D, \
                                          causal, sc, G);                                                          \
        dkv_k<T, DC><<<grid, ROWS, 0, s>>>((const T *)q, (const T *)k, (const T *)v, (const T *)g, lse, dr, (T *)dk,       \
                                           (T *)dv, T_, D, causal, sc, G);                                         \
    } while (0)
    if (D == 64) BWD(64);
    else if (D == 32) BWD(32);
    else if (D == 128) BWD(128);
    else BWD(0);
#undef BWD
    CT_LAUNCHED("attention backward");
    return CT_OK;
}
} // namespace

extern "C" {
bool ct_cuda_attention_views_fit(ct_cuda_dtype dt, int D) { return mma(dt, D); }
ct_status ct_cuda_attention_gqa(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                                float *lse, int64_t BH, int64_t T, int D, bool causal, int64_t G) {
    ct_status st = check_shape("attention", BH, T, D, G);
    if (st != CT_OK || BH == 0 || T == 0) return st;
    return dt == CT_CUDA_BF16  ? attn_fwd<__nv_bfloat16>(s, q, k, v, o, lse, BH, T, D, causal, G)
           : dt == CT_CUDA_F16 ? attn_fwd<__half>(s, q, k, v, o, lse, BH, T, D, causal, G)
                               : attn_fwd<float>(s, q, k, v, o, lse, BH, T, D, causal, G);
}
ct_status ct_cuda_attention_gqa_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                    const void *o, const void *dO, const float *lse, float *dr, void *dq, void *dk, void *dv,
                                    int64_t BH, int64_t T, int D, bool causal, int64_t G) {
    ct_status st = check_shape("attention backward", BH, T, D, G);
    if (st != CT_OK || BH == 0 || T == 0) return st;
    return dt == CT_CUDA_BF16  ? attn_bwd<__nv_bfloat16>(s, q, k, v, o, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G)
           : dt == CT_CUDA_F16 ? attn_bwd<__half>(s, q, k, v, o, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G)
                               : attn_bwd<float>(s, q, k, v, o, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G);
}
ct_status ct_cuda_attention(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                            float *lse, int64_t BH, int64_t T, int D, bool causal) {
    return ct_cuda_attention_gqa(s, dt, q, k, v, o, lse, BH, T, D, causal, 1);
}
ct_status ct_cuda_attention_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                const void *o, const void *dO, const float *lse, float *dr, void *dq, void *dk, void *dv,
                                int64_t BH, int64_t T, int D, bool causal) {
    return ct_cuda_attention_gqa_bwd(s, dt, q, k, v, o, dO, lse, dr, dq, dk, dv, BH, T, D, causal, 1);
}
}
