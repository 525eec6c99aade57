/* Layer norm: one warp per row (lanes stride the row, shuffles reduce), the per-element
 * math from ops/kmath.h. The weight and bias gradients are column sums: chunks of ROWS rows
 * (a number fixed by R) write partial sums, then one pass adds the chunks in order (no
 * atomics, so the result is the same on every run). Chunks of 16 rows: GPT-2's [8192, 768]
 * is 3 x 512 blocks of 256 threads, where 64 chunks of 128 rows gave 192 blocks (under two
 * an SM on an H200), each thread 128 dependent loads; the H200 profile's 2.0 ms for the step's
 * 25 layer-norm backwards is about four times what their bytes need. */
#include "cuda/launch.cuh"

namespace {
enum { WARPS = 8, ROWS = 16, MAX_CHUNKS = 1024 };

template <typename TX, typename TY>
__global__ void ln_fwd_k(const TX *x, const float *w, const float *b, TY *y, float *mean, float *rstd, int64_t R,
                         int64_t D, float eps) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= R) return;
    const TX *xr = x + r * D;
    float s = 0;
    for (int64_t j = lane; j < D; j += 32) s += ct_ld(xr[j]);
    float mu = ct_warp_sum(s) / (float)D, v = 0;
    for (int64_t j = lane; j < D; j += 32) v += (ct_ld(xr[j]) - mu) * (ct_ld(xr[j]) - mu);
    float rs = ct_k_ln_rstd(ct_warp_sum(v), D, eps);
    for (int64_t j = lane; j < D; j += 32)
        y[r * D + j] = ct_st<TY>(ct_k_ln_out(ct_ld(xr[j]), mu, rs, w ? w[j] : 1.0f, b ? b[j] : 0.0f));
    if (lane == 0) {
        mean[r] = mu;
        rstd[r] = rs;
    }
}

template <typename TX, typename TG>
__global__ void ln_dx_k(const TX *x, const TG *g, const float *w, const float *mean, const float *rstd, float *dx,
                        int64_t R, int64_t D, bool acc) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= R) return;
    const TX *xr = x + r * D;
    const TG *gr = g + r * D;
    float mu = mean[r], rs = rstd[r], s1 = 0, s2 = 0;
    for (int64_t j = lane; j < D; j += 32) {
        float gw = w ? ct_ld(gr[j]) * w[j] : ct_ld(gr[j]);
        s1 += gw;
        s2 += gw * ((ct_ld(xr[j]) - mu) * rs);
    }
    s1 = ct_warp_sum(s1) / (float)D;
    s2 = ct_warp_sum(s2) / (float)D;
    for (int64_t j = lane; j < D; j += 32) {
        float v = ct_k_ln_dx(w ? ct_ld(gr[j]) * w[j] : ct_ld(gr[j]), ct_ld(xr[j]), mu, rs, s1, s2);
        dx[r * D + j] = acc ? dx[r * D + j] + v : v; /* the sum an add of the written dx would give */
    }
}

/* part [chunks][2][D]: per chunk of rows, sums of g * xhat and g per column */
template <typename TX, typename TG>
__global__ void ln_dwb_part_k(const TX *x, const TG *g, const float *mean, const float *rstd, float *part, int64_t R,
                              int64_t D, int chunks) {
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int k = blockIdx.y;
    if (j >= D) return;
    int64_t per = (R + chunks - 1) / chunks, r0 = k * per, r1 = r0 + per < R ? r0 + per : R;
    float sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; r++) {
        float gv = ct_ld(g[r * D + j]);
        sw += gv * ((ct_ld(x[r * D + j]) - mean[r]) * rstd[r]);
        sb += gv;
    }
    part[(2 * k) * D + j] = sw;
    part[(2 * k + 1) * D + j] = sb;
}
__global__ void ln_dwb_sum_k(const float *part, float *dw, float *db, int64_t D, int chunks) {
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D) return;
    float sw = 0, sb = 0;
    for (int k = 0; k < chunks; k++) {
        sw += part[(2 * k) * D + j];
        sb += part[(2 * k + 1) * D + j];
    }
    if (dw) dw[j] += sw;
    if (db) db[j] += sb;
}
/* x of type TX, y of TY, the gradient g of TG (each f32, bf16 or f16; y and g rounded to
 * nearest even as stored, read widened); everything else f32 */
template <typename TX, typename TY>
ct_status ln_fwd(cudaStream_t s, const TX *x, const float *w, const float *b, TY *y, float *mean, float *rstd, int64_t R,
                 int64_t D, float eps) {
    ln_fwd_k<TX, TY><<<(unsigned)((R + WARPS - 1) / WARPS), WARPS * 32, 0, s>>>(x, w, b, y, mean, rstd, R, D, eps);
    CT_LAUNCHED("layer_norm");
    return CT_OK;
}
template <typename TX, typename TG>
ct_status ln_bwd(cudaStream_t s, const TX *x, const TG *g, const float *w, const float *mean, const float *rstd, float *dx,
                 bool acc, float *dw, float *db, int64_t R, int64_t D) {
    if (dx) ln_dx_k<TX, TG><<<(unsigned)((R + WARPS - 1) / WARPS), WARPS * 32, 0, s>>>(x, g, w, mean, rstd, dx, R, D, acc);
    CT_LAUNCHED("layer_norm backward");
    if (!dw && !db) return CT_OK;
    int dev = 0;
    CT_GPU_TRY(cuda, "layer_norm backward", cudaGetDevice(&dev));
    const int64_t want = (R + ROWS - 1) / ROWS;
    const int chunks = (int)(want < (int64_t)MAX_CHUNKS ? want : (int64_t)MAX_CHUNKS);
    float *part;
    ct_status st = ct_cuda_alloc(dev, (size_t)(2 * chunks * D) * sizeof(float), (void **)&part);
    if (st != CT_OK) return st;
    unsigned cols = (unsigned)((D + 255) / 256);
    ln_dwb_part_k<TX, TG><<<dim3(cols, (unsigned)chunks), 256, 0, s>>>(x, g, mean, rstd, part, R, D, chunks);
    ln_dwb_sum_k<<<cols, 256, 0, s>>>(part, dw, db, D, chunks);
    st = CT_GPU_CHECK(cuda, "layer_norm backward", cudaGetLastError());
    ct_cuda_free(part); /* reused only by later work on the same stream */
    return st;
}
} // namespace

extern "C" {
ct_status ct_cuda_layer_norm_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const float *w, const float *b, void *y,
                               ct_cuda_cast_type yt, float *mean, float *rstd, int64_t R, int64_t D, float eps) {
    if (R <= 0 || D <= 0) return CT_OK;
    CT_WITH_TYPE(xt, TX, CT_WITH_TYPE(yt, TY, return ln_fwd<TX, TY>(s, (const TX *)x, w, b, (TY *)y, mean, rstd, R, D, eps)));
    return CT_OK;
}
ct_status ct_cuda_layer_norm(cudaStream_t s, const float *x, const float *w, const float *b, float *y, float *mean,
                             float *rstd, int64_t R, int64_t D, float eps) {
    return ct_cuda_layer_norm_t(s, x, CT_CUDA_CAST_F32, w, b, y, CT_CUDA_CAST_F32, mean, rstd, R, D, eps);
}
ct_status ct_cuda_layer_norm_bwd_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const void *g, ct_cuda_cast_type gt,
                                   const float *w, const float *mean, const float *rstd, float *dx, bool accumulate, float *dw,
                                   float *db, int64_t R, int64_t D) {
    if (R <= 0 || D <= 0) return CT_OK;
    CT_WITH_TYPE(xt, TX,
                 CT_WITH_TYPE(gt, TG,
                              return ln_bwd<TX, TG>(s, (const TX *)x, (const TG *)g, w, mean, rstd, dx, accumulate, dw, db, R, D)));
    return CT_OK;
}
ct_status ct_cuda_layer_norm_bwd(cudaStream_t s, const float *x, const float *g, const float *w, const float *mean,
                                 const float *rstd, float *dx, float *dw, float *db, int64_t R, int64_t D) {
    return ct_cuda_layer_norm_bwd_t(s, x, CT_CUDA_CAST_F32, g, CT_CUDA_CAST_F32, w, mean, rstd, dx, false, dw, db, R, D);
}
}
