/* Fused softmax + cross-entropy and the embedding lookup. Cross-entropy: one warp per row
 * folds the row into an online (max, sum) per lane and merges the lanes (ops/kmath.h), so
 * the logits are read once for the loss and once for the gradient, and only the log-sum-exp
 * per row is kept. The mean over rows is one block summing the rows in a fixed order. */
#include <math.h>

#include "cuda/launch.cuh"

namespace {
enum { WARPS = 8, THREADS = 256 };

__device__ inline int64_t tgt(const void *t, bool i64, int64_t r) { return ct_k_index_at(t, i64, r); }

template <typename TX>
__global__ void xent_rows_k(const TX *x, const void *t, bool i64, int64_t N, int64_t C, int64_t ign, float *lse,
                            float *rowloss) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= N) return;
    const TX *xr = x + r * C;
    float m = -INFINITY, s = 0;
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
 * gradient, no f32 copy of the [N, C] logits) */
template <typename TX, typename TD>
__global__ void xent_bwd_k(const TX *x, const void *t, bool i64, int64_t N, int64_t C, int64_t ign, const float *lse,
                           const float *out, const float *dloss, TD *dx) {
    float g = out[1] > 0 ? dloss[0] / out[1] : 0.0f;
    CT_GRID_STRIDE(i, N * C) {
        int64_t r = i / C, j = i % C, tr = tgt(t, i64, r);
        dx[i] = ct_st<TD>(tr == ign || tr < 0 || tr >= C ? 0.0f : ct_k_xent_grad(ct_ld(x[i]), lse[r], g, j == tr));
    }
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
    if (N > 0)
        CT_WITH_TYPE(xt, T, xent_rows_k<T><<<(unsigned)((N + WARPS - 1) / WARPS), WARPS * 32, 0, s>>>((const T *)logits, target,
                                                                                                      target_i64, N, C, ignore,
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
        CT_WITH_TYPE(xt, T, xent_bwd_k<T, T><<<ct_grid(N * C, THREADS), THREADS, 0, s>>>((const T *)logits, target, target_i64, N,
                                                                                        C, ignore, lse, out, dloss, (T *)dlogits));
    else if (N * C > 0)
        CT_WITH_TYPE(xt, T, xent_bwd_k<T, float><<<ct_grid(N * C, THREADS), THREADS, 0, s>>>((const T *)logits, target, target_i64,
                                                                                            N, C, ignore, lse, out, dloss,
                                                                                            (float *)dlogits));
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
