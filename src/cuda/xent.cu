/* Fused softmax + cross-entropy and the embedding lookup. Cross-entropy: one warp per row
 * folds the row into an online (max, sum) per lane and merges the lanes (ops/kmath.h), so
 * the logits are read once for the loss and once for the gradient, and only the log-sum-exp
 * per row is kept. The mean over rows is one block summing the rows in a fixed order. */
#include <math.h>

#include "cuda/launch.cuh"

namespace {
enum { WARPS = 8, THREADS = 256 };

__device__ inline int64_t tgt(const void *t, bool i64, int64_t r) { return ct_k_index_at(t, i64, r); }

/* X8: each lane reads 8 neighbours at a time (16 bytes of bf16: C a multiple of 8, x
 * 16-byte aligned), a quarter of the load instructions of 2-byte reads */
template <typename TX, bool X8>
__global__ void xent_rows_k(const TX *x, const void *t, bool i64, int64_t N, int64_t C, int64_t ign, float *lse,
                            float *rowloss) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= N) return;
    const TX *xr = x + r * C;
    float m = -INFINITY, s = 0;
    if (X8)
        for (int64_t j = (int64_t)lane * 8; j < C; j += 32 * 8) {
            const ct_x8<TX> a = *(const ct_x8<TX> *)(xr + j);
#pragma unroll
            for (int e = 0; e < 8; e++) ct_k_online_add(&m, &s, ct_ld(a.v[e]));
        }
    else
        for (int64_t j = lane; j < C; j += 32) ct_k_online_add(&m, &s, ct_ld(xr[j]));
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ct_k_online_merge(&m, &s, m2, s2);
    }
    if (lane == 0) {
        float l = ct_k_attn_lse(m, s);
        int64_t tr = tgt(t, i64, r);
        lse[r] = l;
        rowloss[r] = tr == ign || tr < 0 || tr >= C ? 0.0f : l - ct_ld(xr[tr]);
    }
}

/* one block: out[0] = mean row loss over counted rows, out[1] = their count */
__global__ void xent_mean_k(const float *rowloss, const void *t, bool i64, int64_t N, int64_t C, int64_t ign, float *out) {
    __shared__ double ss[THREADS];
    __shared__ long long sc[THREADS];
    double s = 0;
    long long c = 0;
    for (int64_t r = threadIdx.x; r < N; r += THREADS) {
        int64_t tr = tgt(t, i64, r);
        if (tr == ign || tr < 0 || tr >= C) continue;
        s += rowloss[r];
        c++;
    }
    ss[threadIdx.x] = s;
    sc[threadIdx.x] = c;
    __syncthreads();
    for (int o = THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) {
            ss[threadIdx.x] += ss[threadIdx.x + o];
            sc[threadIdx.x] += sc[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = sc[0] ? (float)(ss[0] / (double)sc[0]) : NAN; /* all ignored: 0/0, as PyTorch */
        out[1] = (float)sc[0];
    }
}

/* dx of TD: f32, or the logits' own bf16/f16 (rounded as stored: the fused classifier's
 * gradient, no f32 copy of the [N, C] logits). A block per row (rows strided by the grid):
 * the row's target and lse read once, and no 64-bit division per element (a flat loop over
 * N C divided each index by C); X8: 8 neighbours a thread, as the forward */
template <typename TX, typename TD, bool X8>
__global__ void xent_bwd_k(const TX *x, const void *t, bool i64, int64_t N, int64_t C, int64_t ign, const float *lse,
                           const float *out, const float *dloss, TD *dx) {
    const float g = out[1] > 0 ? dloss[0] / out[1] : 0.0f;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const int64_t tr = tgt(t, i64, r);
        const bool none = tr == ign || tr < 0 || tr >= C;
        const float l = lse[r];
        const TX *xr = x + r * C;
        TD *dr = dx + r * C;
        if (X8)
            for (int64_t j = (int64_t)threadIdx.x * 8; j < C; j += (int64_t)blockDim.x * 8) {
                const ct_x8<TX> a = *(const ct_x8<TX> *)(xr + j);
                ct_x8<TD> o;
#pragma unroll
                for (int e = 0; e < 8; e++) o.v[e] = ct_st<TD>(none ? 0.0f : ct_k_xent_grad(ct_ld(a.v[e]), l, g, j + e == tr));
                *(ct_x8<TD> *)(dr + j) = o;
            }
        else
            for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
                dr[j] = ct_st<TD>(none ? 0.0f : ct_k_xent_grad(ct_ld(xr[j]), l, g, j == tr));
    }
}
/* the backward's launch: a block per row up to 2^20 blocks */
template <typename TX, typename TD>
void xent_bwd(cudaStream_t s, const TX *x, const void *t, bool i64, int64_t N, int64_t C, int64_t ign, const float *lse,
              const float *out, const float *dloss, TD *dx) {
    const unsigned blocks = (unsigned)(N < (1 << 20) ? N : (1 << 20));
    if (ct_x8_fits(C, x, dx)) xent_bwd_k<TX, TD, true><<<blocks, THREADS, 0, s>>>(x, t, i64, N, C, ign, lse, out, dloss, dx);
    else xent_bwd_k<TX, TD, false><<<blocks, THREADS, 0, s>>>(x, t, i64, N, C, ign, lse, out, dloss, dx);
}

__global__ void emb_k(const float *w, const void *idx, bool i64, int64_t n, int64_t V, int64_t D, float *y, int *bad) {
    CT_GRID_STRIDE(i, n * D) {
        int64_t r = i / D, t = ct_k_index_at(idx, i64, r);
        bool ok = t >= 0 && t < V;
        y[i] = ok ? w[t * D + i % D] : 0.0f;
        if (!ok && bad) *bad = 1;
    }
}
/* one thread per column and slice of the vocabulary (blockIdx.y of gridDim.y): it reads every
 * index but adds only the rows of its slice, so each element of dw is still summed by one
 * thread in index order (no atomics, the same bits), while the dependent read-add-writes are
 * spread over gridDim.y times more threads than one per column */
__global__ void emb_bwd_k(const float *g, const void *idx, bool i64, int64_t n, int64_t V, int64_t D, float *dw) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D) return;
    const int64_t k = blockIdx.y, K = gridDim.y, v0 = V * k / K, v1 = V * (k + 1) / K;
    for (int64_t r = 0; r < n; r++) {
        int64_t t = ct_k_index_at(idx, i64, r);
        if (t >= v0 && t < v1) dw[t * D + c] += g[r * D + c];
    }
}
} // namespace

extern "C" {
ct_status ct_cuda_cross_entropy_t(cudaStream_t s, const void *logits, ct_cuda_cast_type xt, const void *target, bool target_i64,
                                  int64_t N, int64_t C, int64_t ignore, float *lse, float *out) {
    int dev = 0;
    CT_GPU_TRY(cuda, "cross_entropy", cudaGetDevice(&dev));
    float *rowloss;
    ct_status st = ct_cuda_alloc(dev, (size_t)(N > 0 ? N : 1) * sizeof(float), (void **)&rowloss);
    if (st != CT_OK) return st;
    const unsigned blocks = (unsigned)((N + WARPS - 1) / WARPS);
    if (N > 0 && ct_x8_fits(C, logits))
        CT_WITH_TYPE(xt, T, xent_rows_k<T, true><<<blocks, WARPS * 32, 0, s>>>((const T *)logits, target, target_i64, N, C, ignore,
                                                                               lse, rowloss));
    else if (N > 0)
        CT_WITH_TYPE(xt, T, xent_rows_k<T, false><<<blocks, WARPS * 32, 0, s>>>((const T *)logits, target, target_i64, N, C, ignore,
                                                                                lse, rowloss));
    xent_mean_k<<<1, THREADS, 0, s>>>(rowloss, target, target_i64, N, C, ignore, out);
    st = CT_GPU_CHECK(cuda, "cross_entropy", cudaGetLastError());
    ct_cuda_free(rowloss);
    return st;
}
ct_status ct_cuda_cross_entropy(cudaStream_t s, const float *logits, const void *target, bool target_i64, int64_t N,
                                int64_t C, int64_t ignore, float *lse, float *out) {
    return ct_cuda_cross_entropy_t(s, logits, CT_CUDA_CAST_F32, target, target_i64, N, C, ignore, lse, out);
}
ct_status ct_cuda_cross_entropy_bwd_t(cudaStream_t s, const void *logits, ct_cuda_cast_type xt, const void *target,
                                      bool target_i64, int64_t N, int64_t C, int64_t ignore, const float *lse, const float *out,
                                      const float *dloss, void *dlogits, bool dlogits_as_x) {
    if (N * C > 0 && dlogits_as_x)
        CT_WITH_TYPE(xt, T, xent_bwd<T, T>(s, (const T *)logits, target, target_i64, N, C, ignore, lse, out, dloss, (T *)dlogits));
    else if (N * C > 0)
        CT_WITH_TYPE(xt, T,
                     xent_bwd<T, float>(s, (const T *)logits, target, target_i64, N, C, ignore, lse, out, dloss, (float *)dlogits));
    CT_LAUNCHED("cross_entropy backward");
    return CT_OK;
}
ct_status ct_cuda_cross_entropy_bwd(cudaStream_t s, const float *logits, const void *target, bool target_i64, int64_t N,
                                    int64_t C, int64_t ignore, const float *lse, const float *out, const float *dloss,
                                    float *dlogits) {
    return ct_cuda_cross_entropy_bwd_t(s, logits, CT_CUDA_CAST_F32, target, target_i64, N, C, ignore, lse, out, dloss, dlogits,
                                       false);
}
ct_status ct_cuda_embedding(cudaStream_t s, const float *w, const void *idx, bool idx_i64, int64_t n, int64_t V, int64_t D,
                            float *y, int *bad) {
    if (n * D > 0) emb_k<<<ct_grid(n * D, THREADS), THREADS, 0, s>>>(w, idx, idx_i64, n, V, D, y, bad);
    CT_LAUNCHED("embedding");
    return CT_OK;
}
ct_status ct_cuda_embedding_bwd(cudaStream_t s, const float *g, const void *idx, bool idx_i64, int64_t n, int64_t V,
                                int64_t D, float *dw) {
    /* about 64 slices: 49k threads for GPT-2's 768 columns */
    const unsigned K = (unsigned)(V < 64 ? (V > 0 ? V : 1) : 64);
    if (n > 0 && D > 0) emb_bwd_k<<<dim3((unsigned)((D + 127) / 128), K), 128, 0, s>>>(g, idx, idx_i64, n, V, D, dw);
    CT_LAUNCHED("embedding backward");
    return CT_OK;
}
}
