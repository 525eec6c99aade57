/* Flash attention in tiles, for head dims 32 and 64, with CTRAIN_CUDA_ATTENTION=tiled
 * (attention.cu's row kernels otherwise). Not yet run on a GPU; tests/scripts/cuda_tiled_emu.sh
 * runs the kernels (attention_tiled_kernels.cuh) on the CPU, a host thread per CUDA thread.
 *
 * A block of 256 threads owns a 64-row tile (queries in forward and dQ, keys in dK/dV) and
 * walks the other side's 64-row tiles through shared memory. Every product of two tiles is
 * a small GEMM in which each thread keeps a 4 x 4 (or 4 x D/16) block of the result in
 * registers, rows ty + 16 i and columns tx + 16 j: each value read from shared memory feeds
 * four multiply-adds instead of one, which is what the one-thread-per-row kernels lack.
 *
 *   forward   S = Q K^T scale (masked), online softmax per row (m, l), O += P V; O /= l,
 *             lse = m + log l                                        4 T^2 D flops (half causal)
 *   dK, dV    per key tile, over the query tiles that see it: P^T = exp(S^T - lse),
 *             dP^T = V dO^T, dS^T = P^T (dP^T - Dr) scale; dV += P^T dO, dK += dS^T Q
 *   dQ        per query tile, over the key tiles it sees: the same P and dS, dQ += dS K
 *
 * dQ is its own pass (S and dP computed twice) rather than atomics from the key tiles, so
 * every gradient element is summed by one thread in a fixed order: the same bits every run.
 * Memory beyond inputs and outputs stays O(T): lse and Dr. The per-element math (rescale,
 * lse, dS) is ops/kmath.h's, as in the row kernels and the CPU op; the sums run in another
 * order than theirs (within 1e-5 relative in f32, tests/gpu). Shared memory: 3 (forward), 5
 * (dQ) or 6 (dK, dV) tiles of 64 x (D + 1) floats, the +1 keeping column reads off one bank. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/attention_launch.cuh"
#include "cuda/attention_tiled.cuh"

namespace {
enum { BR = 64, NT = 256 };

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ld(__half x) { return __half2float(x); }
__device__ __forceinline__ void st(float *p, float x) { *p = x; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void st(__half *p, float x) { *p = __float2half_rn(x); }

#include "cuda/attention_tiled_kernels.cuh"

/* shared bytes: `tiles` tiles of 64 x (D + 1), `sq` of 64 x 65, and lse/Dr rows */
template <int D> constexpr size_t smem(int tiles, int sq, bool rows) {
    return sizeof(float) * ((size_t)tiles * BR * (D + 1) + (size_t)sq * BR * (BR + 1) + (rows ? 2 * BR : 0));
}
template <int D, typename T>
ct_status fwd(cudaStream_t s, const void *q, const void *k, const void *v, void *o, float *lse, int64_t BH, int64_t n,
              bool causal, int64_t G) {
    return ct_attn_launch_fwd<T>(s, fwd_k<D, T>, smem<D>(2, 1, false), NT, BR, D, q, k, v, o, lse, BH, n, causal, G);
}
template <int D, typename T>
ct_status bwd(cudaStream_t s, const void *q, const void *k, const void *v, const void *g, const float *lse, const float *dr,
              void *dq, void *dk, void *dv, int64_t BH, int64_t n, bool causal, int64_t G) {
    return ct_attn_launch_bwd<T>(s, dkv_k<D, T>, smem<D>(4, 2, true), dq_k<D, T>, smem<D>(4, 1, true), NT, BR, D, q, k, v, g, lse,
                                 dr, dq, dk, dv, BH, n, causal, G);
}

/* the head dim's instance (32 or 64: ct_cuda_attention_tiled_fits) for element type T */
template <typename T>
ct_status fwd_t(cudaStream_t s, const void *q, const void *k, const void *v, void *o, float *lse, int64_t BH, int64_t n, int D,
                bool causal, int64_t G) {
    return D == 64 ? fwd<64, T>(s, q, k, v, o, lse, BH, n, causal, G) : fwd<32, T>(s, q, k, v, o, lse, BH, n, causal, G);
}
template <typename T>
ct_status bwd_t(cudaStream_t s, const void *q, const void *k, const void *v, const void *g, const float *lse, const float *dr,
                void *dq, void *dk, void *dv, int64_t BH, int64_t n, int D, bool causal, int64_t G) {
    return D == 64 ? bwd<64, T>(s, q, k, v, g, lse, dr, dq, dk, dv, BH, n, causal, G)
                   : bwd<32, T>(s, q, k, v, g, lse, dr, dq, dk, dv, BH, n, causal, G);
}
} // namespace

bool ct_cuda_attention_tiled_fits(int D) { return D == 32 || D == 64; }

ct_status ct_cuda_attention_tiled(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                                  float *lse, int64_t BH, int64_t T, int D, bool causal, int64_t G) {
    return dt == CT_CUDA_BF16  ? fwd_t<__nv_bfloat16>(s, q, k, v, o, lse, BH, T, D, causal, G)
           : dt == CT_CUDA_F16 ? fwd_t<__half>(s, q, k, v, o, lse, BH, T, D, causal, G)
                               : fwd_t<float>(s, q, k, v, o, lse, BH, T, D, causal, G);
}

ct_status ct_cuda_attention_tiled_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                      const void *dO, const float *lse, const float *dr, void *dq, void *dk, void *dv,
                                      int64_t BH, int64_t T, int D, bool causal, int64_t G) {
    return dt == CT_CUDA_BF16  ? bwd_t<__nv_bfloat16>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G)
           : dt == CT_CUDA_F16 ? bwd_t<__half>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G)
                               : bwd_t<float>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G);
}
