/* Llama's ops on the device: RMSNorm (one warp per row, as layer norm in norm.cu), the rotary
 * embedding (a cos/sin table per call, then one thread per rotated pair) and repeat_kv's
 * backward (its forward is a strided copy with a stride of 0 over the repeats).
 *
 * The arithmetic is the CPU op's (src/ops/cpu/norm.c, rope.c), element for element. The rope
 * table takes powf, cosf and sinf in double rounded to f32: the correctly rounded values, as
 * the host's libm gives them, where the device's single-precision functions may be 2 ulp off.
 * The weight gradient of RMSNorm is a column sum in fixed chunks of rows added in order, and
 * repeat_kv's backward adds a group's gradients in head order as the CPU op does: no atomics,
 * the same result on every run. */
#include "cuda/launch.cuh"

namespace {
enum { WARPS = 8, CHUNKS = 64, THREADS = 256 };

template <typename TX, typename TY>
__global__ void rms_fwd_k(const TX *x, const float *w, TY *y, float *rstd, int64_t R, int64_t D, float eps) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= R) return;
    const TX *xr = x + r * D;
    float s = 0;
    for (int64_t j = lane; j < D; j += 32) s += ct_ld(xr[j]) * ct_ld(xr[j]);
    float rs = 1.0f / sqrtf(ct_warp_sum(s) / (float)D + eps);
    for (int64_t j = lane; j < D; j += 32) y[r * D + j] = ct_st<TY>((ct_ld(xr[j]) * rs) * (w ? w[j] : 1.0f));
    if (lane == 0) rstd[r] = rs;
}

/* dx = rstd (gw - xhat mean(gw xhat)), gw = g w, xhat = x rstd; acc: added to dx */
template <typename TX, typename TG>
__global__ void rms_dx_k(const TX *x, const TG *g, const float *w, const float *rstd, float *dx, int64_t R, int64_t D, bool acc) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= R) return;
    const TX *xr = x + r * D;
    const TG *gr = g + r * D;
    float rs = rstd[r], s = 0;
    for (int64_t j = lane; j < D; j += 32) s += (w ? ct_ld(gr[j]) * w[j] : ct_ld(gr[j])) * (ct_ld(xr[j]) * rs);
    s = ct_warp_sum(s) / (float)D;
    for (int64_t j = lane; j < D; j += 32) {
        float v = rs * ((w ? ct_ld(gr[j]) * w[j] : ct_ld(gr[j])) - (ct_ld(xr[j]) * rs) * s);
        dx[r * D + j] = acc ? dx[r * D + j] + v : v;
    }
}

/* part [CHUNKS][D]: per chunk of rows, the sums of g * xhat per column */
template <typename TX, typename TG>
__global__ void rms_dw_part_k(const TX *x, const TG *g, const float *rstd, float *part, int64_t R, int64_t D) {
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int k = blockIdx.y;
    if (j >= D) return;
    int64_t per = (R + CHUNKS - 1) / CHUNKS, r0 = k * per, r1 = r0 + per < R ? r0 + per : R;
    float sw = 0;
    for (int64_t r = r0; r < r1; r++) sw += ct_ld(g[r * D + j]) * (ct_ld(x[r * D + j]) * rstd[r]);
    part[k * D + j] = sw;
}
__global__ void rms_dw_sum_k(const float *part, float *dw, int64_t D) {
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D) return;
    float sw = 0;
    for (int k = 0; k < CHUNKS; k++) sw += part[k * D + j];
    dw[j] += sw;
}

template <typename TX, typename TY>
ct_status rms_fwd(cudaStream_t s, const TX *x, const float *w, TY *y, float *rstd, int64_t R, int64_t D, float eps) {
    rms_fwd_k<TX, TY><<<(unsigned)((R + WARPS - 1) / WARPS), WARPS * 32, 0, s>>>(x, w, y, rstd, R, D, eps);
    CT_LAUNCHED("rms_norm");
    return CT_OK;
}
template <typename TX, typename TG>
ct_status rms_bwd(cudaStream_t s, const TX *x, const TG *g, const float *w, const float *rstd, float *dx, bool acc, float *dw,
                  int64_t R, int64_t D) {
    if (dx) rms_dx_k<TX, TG><<<(unsigned)((R + WARPS - 1) / WARPS), WARPS * 32, 0, s>>>(x, g, w, rstd, dx, R, D, acc);
    CT_LAUNCHED("rms_norm backward");
    if (!dw) return CT_OK;
    int dev = 0;
    CT_GPU_TRY(cuda, "rms_norm backward", cudaGetDevice(&dev));
    float *part;
    ct_status st = ct_cuda_alloc(dev, (size_t)(CHUNKS * D) * sizeof(float), (void **)&part);
    if (st != CT_OK) return st;
    unsigned cols = (unsigned)((D + 255) / 256);
    rms_dw_part_k<TX, TG><<<dim3(cols, CHUNKS), 256, 0, s>>>(x, g, rstd, part, R, D);
    rms_dw_sum_k<<<cols, 256, 0, s>>>(part, dw, D);
    st = CT_GPU_CHECK(cuda, "rms_norm backward", cudaGetLastError());
    ct_cuda_free(part); /* reused only by later work on the same stream */
    return st;
}

/* Llama 3.1's scaling of an inverse frequency, the CPU op's f32 steps (src/ops/cpu/rope.c
 * inv_freq_at): factor 0 is none */
typedef struct {
    float factor, lo, hi;
    int old;
} rope_scale;
__device__ static float scaled_inv(float inv, rope_scale sc) {
    if (sc.factor == 0) return inv;
    const double old = sc.old;
    const float lo_wl = (float)(old / sc.lo), hi_wl = (float)(old / sc.hi);
    const float wl = __fmul_rn(__fdiv_rn(1.0f, inv), (float)(2 * 3.14159265358979323846));
    float f = wl > lo_wl ? __fdiv_rn(inv, sc.factor) : inv;
    if (!(wl < hi_wl) && !(wl > lo_wl)) {
        float sm = __fdiv_rn(__fsub_rn(__fmul_rn(__fdiv_rn(1.0f, wl), (float)old), sc.lo), (float)((double)sc.hi - sc.lo));
        f = __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.0f, sm), f), sc.factor), __fmul_rn(sm, f));
    }
    return f;
}
/* cs: [T, h] cosines, then [T, h] sines of pos[t] * theta^(-2j/D), scaled (the CPU op's f32 angle) */
__global__ void rope_table_k(const void *pos, bool pos_i64, int64_t T, int64_t D, float theta, rope_scale sc, float *cs) {
    int64_t h = D / 2;
    CT_GRID_STRIDE(i, T * h) {
        int64_t t = i / h, j = i % h;
        int64_t p = !pos ? t : pos_i64 ? ((const int64_t *)pos)[t] : (int64_t)((const int32_t *)pos)[t];
        float inv = scaled_inv(1.0f / (float)pow((double)theta, (double)((float)(2 * j) / (float)D)), sc);
        float a = (float)p * inv;
        cs[i] = (float)cos((double)a);
        cs[T * h + i] = (float)sin((double)a);
    }
}
/* each pair (x_j, x_{j+h}) of a row rotated by its position's angle; y of x's type */
template <typename T>
__global__ void rope_k(const T *x, T *y, const float *cs, int64_t R, int64_t Tn, int64_t D) {
    int64_t h = D / 2;
    CT_GRID_STRIDE(i, R * Tn * h) {
        int64_t rt = i / h, j = i % h, t = rt % Tn;
        float c = cs[t * h + j], sn = cs[Tn * h + t * h + j];
        float x0 = ct_ld(x[rt * D + j]), x1 = ct_ld(x[rt * D + j + h]);
        y[rt * D + j] = ct_st<T>(x0 * c - x1 * sn);
        y[rt * D + j + h] = ct_st<T>(x1 * c + x0 * sn);
    }
}
/* the rotation by the negative angle; dx written (accumulate: added to) */
__global__ void rope_bwd_k(const float *g, const float *cs, float *dx, int64_t R, int64_t Tn, int64_t D, bool accumulate) {
    int64_t h = D / 2;
    CT_GRID_STRIDE(i, R * Tn * h) {
        int64_t rt = i / h, j = i % h, t = rt % Tn;
        float c = cs[t * h + j], sn = cs[Tn * h + t * h + j];
        float g0 = g[rt * D + j], g1 = g[rt * D + j + h];
        float a = g0 * c + g1 * sn, b = g1 * c - g0 * sn;
        float *o = dx + rt * D;
        o[j] = (accumulate ? o[j] : 0.0f) + a;
        o[j + h] = (accumulate ? o[j + h] : 0.0f) + b;
    }
}
/* dx [BH, TD] (=, or += with accumulate) the sum of the rep gradients of each head, in order */
__global__ void repeat_sum_k(const float *g, float *dx, int64_t BH, int64_t TD, int64_t rep, bool accumulate) {
    CT_GRID_STRIDE(i, BH * TD) {
        int64_t k = i / TD, j = i % TD;
        float o = accumulate ? dx[i] : 0.0f;
        for (int64_t r = 0; r < rep; r++) o += g[(k * rep + r) * TD + j];
        dx[i] = o;
    }
}
} // namespace

#define LAUNCH(op, kernel, n, ...) CT_LAUNCH_N(op, kernel, n, THREADS, __VA_ARGS__)

extern "C" {
ct_status ct_cuda_rms_norm_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const float *w, void *y, ct_cuda_cast_type yt,
                             float *rstd, int64_t R, int64_t D, float eps) {
    if (R <= 0 || D <= 0) return CT_OK;
    CT_WITH_TYPE(xt, TX, CT_WITH_TYPE(yt, TY, return rms_fwd<TX, TY>(s, (const TX *)x, w, (TY *)y, rstd, R, D, eps)));
    return CT_OK;
}
ct_status ct_cuda_rms_norm_bwd_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const void *g, ct_cuda_cast_type gt,
                                 const float *w, const float *rstd, float *dx, bool accumulate, float *dw, int64_t R, int64_t D) {
    if (R <= 0 || D <= 0) return CT_OK;
    CT_WITH_TYPE(xt, TX,
                 CT_WITH_TYPE(gt, TG, return rms_bwd<TX, TG>(s, (const TX *)x, (const TG *)g, w, rstd, dx, accumulate, dw, R, D)));
    return CT_OK;
}
ct_status ct_cuda_rope_table(cudaStream_t s, const void *pos, bool pos_i64, int64_t T, int64_t D, float theta, float *cs) {
    return ct_cuda_rope_table_scaled(s, pos, pos_i64, T, D, theta, 0, 0, 0, 0, cs);
}
ct_status ct_cuda_rope_table_scaled(cudaStream_t s, const void *pos, bool pos_i64, int64_t T, int64_t D, float theta,
                                    float factor, float low_freq_factor, float high_freq_factor, int original_max_pos, float *cs) {
    rope_scale sc = {factor, low_freq_factor, high_freq_factor, original_max_pos};
    LAUNCH("rope", rope_table_k, T * (D / 2), pos, pos_i64, T, D, theta, sc, cs);
}
ct_status ct_cuda_rope(cudaStream_t s, const void *x, ct_cuda_cast_type t, void *y, const float *cs, int64_t R, int64_t T,
                       int64_t D) {
    CT_WITH_TYPE(t, TX, LAUNCH("rope", rope_k<TX>, R * T * (D / 2), (const TX *)x, (TX *)y, cs, R, T, D));
    return CT_OK;
}
ct_status ct_cuda_rope_bwd(cudaStream_t s, const float *g, const float *cs, float *dx, int64_t R, int64_t T, int64_t D,
                           bool accumulate) {
    LAUNCH("rope backward", rope_bwd_k, R * T * (D / 2), g, cs, dx, R, T, D, accumulate);
}
ct_status ct_cuda_repeat_kv_bwd(cudaStream_t s, const float *g, float *dx, int64_t BH, int64_t TD, int64_t rep, bool accumulate) {
    LAUNCH("repeat_kv backward", repeat_sum_k, BH * TD, g, dx, BH, TD, rep, accumulate);
}
}
