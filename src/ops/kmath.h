/* Per-element math shared by the CPU ops and the CUDA kernels (the .cu files in src/cuda).
 *
 *   y[i] = ct_k_gelu_tanh(x[i]);                         // one element, host or device
 *   float lse = ct_k_xent_row_lse(logits + r * C, C);     // one row
 *
 * Every function is CT_HD: __host__ __device__ under nvcc, plain static inline under gcc,
 * so the arithmetic of each kernel is compiled into the CPU build too and checked there
 * against the CPU ops (tests/unit/test_kmath.c) without a GPU. The exp, tanh and normal CDF
 * are the CPU kernels' own: branch-free (selects only) Cephes-style polynomials, ~2 ulp,
 * which gcc vectorises under `omp simd` (libm's calls it cannot without -ffast-math).
 * Horner steps are explicit fmaf: -std=c11 turns off FMA contraction, and a chain of
 * separate mul/add doubles both the work and the latency. */
#ifndef CT_OPS_KMATH_H
#define CT_OPS_KMATH_H
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/rng.h" /* the counter-based streams of dropout */

#ifdef __CUDACC__
#define CT_HD __host__ __device__
#else
#define CT_HD
#endif

CT_HD static inline float ct_k_bits_to_float(int32_t e) {
#ifdef __CUDA_ARCH__
    return __int_as_float(e);
#else
    float s;
    memcpy(&s, &e, sizeof s);
    return s;
#endif
}

CT_HD static inline uint32_t ct_k_float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u); /* device code too: nvcc makes it a register move */
    return u;
}

CT_HD static inline float ct_vexpf(float x) {
    float xc = x < -87.33654f ? -87.33654f : x; /* 2^-126: keep the exponent field normal */
    xc = xc > 88.72283f ? 88.72283f : xc;
    /* round to nearest by the 1.5 * 2^23 trick: floorf would be a libm call, not a vector op */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r); /* ln2 split in two: n * ln2_hi is exact */
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    /* NaN in, NaN out through p; its exponent is taken from 0, as converting NaN to an
     * integer is undefined in C */
    float ne = n == n ? n : 0.0f;
    float y = p * ct_k_bits_to_float(((int32_t)ne + 127) << 23);
    y = x < -87.33654f ? 0.0f : y;   /* underflow: 0 (PyTorch gives a denormal below 1e-38) */
    return x > 88.72283f ? INFINITY : y; /* a NaN stays NaN through p without a select */
}

CT_HD static inline float ct_vtanhf(float x) {
    float a = fabsf(x);
    /* small |x|: odd polynomial (no cancellation); large: 1 - 2/(e^{2|x|} + 1) */
    float z = x * x;
    float q = fmaf(-5.70498872745e-3f, z, 2.06390887954e-2f);
    q = fmaf(q, z, -5.37397155531e-2f);
    q = fmaf(q, z, 1.33314422036e-1f);
    q = fmaf(q, z, -3.33332819422e-1f);
    float small = fmaf(q * z, x, x);
    float big = 1.0f - 2.0f / (ct_vexpf(2.0f * a) + 1.0f);
    big = x < 0 ? -big : big;
    return a < 0.625f ? small : big;
}

/* Standard normal CDF Phi(x) = 0.5 erfc(-x / sqrt 2), via the Numerical Recipes erfc
 * (fractional error < 1.2e-7 everywhere): the left tail keeps its relative accuracy, which
 * 1 + erf(x) computed from an erf would lose. Exact gelu is x * Phi(x). */
CT_HD static inline float ct_vnormcdf(float x) {
    float z = fabsf(x) * 0.70710678118654752f;
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    float e = 0.5f * t * ct_vexpf(fmaf(-z, z, p)); /* 0.5 erfc(|x| / sqrt 2) */
    return x >= 0.0f ? 1.0f - e : e;
}

/* ---- activations: forward from x, backward as dL/dx given dL/dy ---- */
#define CT_K_SQRT_2_OVER_PI 0.7978845608028654f
#define CT_K_INV_SQRT_2PI 0.3989422804014327f
#define CT_K_GELU_C 0.044715f

CT_HD static inline float ct_k_relu(float x) { return x > 0 ? x : 0.0f; }
/* from the saved output, as the CPU op */
CT_HD static inline float ct_k_relu_bwd(float y, float g) { return y > 0 ? g : 0.0f; }
/* dropout: element i of stream `key` kept (times scale = 1/(1-p)) when its uniform draw is
 * >= p; backward applies the same factor to the gradient */
CT_HD static inline float ct_k_dropout(uint64_t key, int64_t i, float p, float scale) {
    return ct_rand_uniform(key, (uint64_t)i) >= p ? scale : 0.0f;
}
CT_HD static inline float ct_k_tanh(float x) { return ct_vtanhf(x); }
CT_HD static inline float ct_k_tanh_bwd(float y, float g) { return g * (1.0f - y * y); } /* from the output */
CT_HD static inline float ct_k_sigmoid(float x) { return 1.0f / (1.0f + ct_vexpf(-x)); }
CT_HD static inline float ct_k_sigmoid_bwd(float y, float g) { return g * y * (1.0f - y); }
CT_HD static inline float ct_k_gelu(float x) { return x * ct_vnormcdf(x); }
CT_HD static inline float ct_k_gelu_bwd(float x, float g) {
    return g * (ct_vnormcdf(x) + x * CT_K_INV_SQRT_2PI * ct_vexpf(-0.5f * x * x));
}
CT_HD static inline float ct_k_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + ct_vtanhf(CT_K_SQRT_2_OVER_PI * (x + CT_K_GELU_C * x * x * x)));
}
CT_HD static inline float ct_k_gelu_tanh_bwd(float x, float g) {
    float x2 = x * x, t = ct_vtanhf(CT_K_SQRT_2_OVER_PI * (x + CT_K_GELU_C * x2 * x));
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * CT_K_SQRT_2_OVER_PI * (1.0f + 3.0f * CT_K_GELU_C * x2));
}

/* ---- layer norm (biased variance; w, b may be NULL in the row functions) ---- */
CT_HD static inline float ct_k_ln_rstd(float sq_dev_sum, int64_t D, float eps) {
    return 1.0f / sqrtf(sq_dev_sum / (float)D + eps);
}
CT_HD static inline float ct_k_ln_out(float x, float mean, float rstd, float w, float b) {
    return (x - mean) * rstd * w + b;
}
/* dx = rstd (g w - s1 - xhat s2), s1 = mean(g w), s2 = mean(g w xhat) over the row */
CT_HD static inline float ct_k_ln_dx(float gw, float x, float mean, float rstd, float s1, float s2) {
    return rstd * (gw - s1 - (x - mean) * rstd * s2);
}
/* One row, two passes (no cancellation in the variance); mean and rstd out for backward. */
CT_HD static inline void ct_k_ln_row_fwd(const float *x, int64_t D, const float *w, const float *b, float eps, float *y,
                                         float *mean_out, float *rstd_out) {
    float s = 0, v = 0;
    for (int64_t j = 0; j < D; j++) s += x[j];
    float mean = s / (float)D;
    for (int64_t j = 0; j < D; j++) v += (x[j] - mean) * (x[j] - mean);
    float rstd = ct_k_ln_rstd(v, D, eps);
    for (int64_t j = 0; j < D; j++) y[j] = ct_k_ln_out(x[j], mean, rstd, w ? w[j] : 1.0f, b ? b[j] : 0.0f);
    *mean_out = mean;
    *rstd_out = rstd;
}
/* dx of one row (written, not accumulated); the w/b gradients are column sums of
 * g * xhat and g, left to the caller. */
CT_HD static inline void ct_k_ln_row_bwd(const float *x, const float *g, int64_t D, const float *w, float mean, float rstd,
                                         float *dx) {
    float s1 = 0, s2 = 0;
    for (int64_t j = 0; j < D; j++) {
        float gw = w ? g[j] * w[j] : g[j];
        s1 += gw;
        s2 += gw * ((x[j] - mean) * rstd);
    }
    s1 /= (float)D;
    s2 /= (float)D;
    for (int64_t j = 0; j < D; j++) dx[j] = ct_k_ln_dx(w ? g[j] * w[j] : g[j], x[j], mean, rstd, s1, s2);
}

/* ---- softmax + cross-entropy ---- */
/* Online log-sum-exp: (m, s) with s = sum exp(x_j - m); fold one value in, or merge two
 * partial states (threads of a warp). Start from m = -INFINITY, s = 0. */
CT_HD static inline void ct_k_online_add(float *m, float *s, float x) {
    if (x > *m) {
        *s = *s * ct_vexpf(*m - x) + 1.0f;
        *m = x;
    } else if (x != -INFINITY) { /* -inf - -inf would be NaN: a masked value adds nothing */
        *s += ct_vexpf(x - *m);
    }
}
CT_HD static inline void ct_k_online_merge(float *m, float *s, float m2, float s2) {
    float mn = m2 > *m ? m2 : *m;
    if (mn == -INFINITY) return; /* both empty */
    *s = *s * ct_vexpf(*m - mn) + s2 * ct_vexpf(m2 - mn);
    *m = mn;
}
/* the log-sum-exp m + log s of an online state (also flash attention's saved lse) */
CT_HD static inline float ct_k_attn_lse(float m, float l) { return m + logf(l); }
/* log-sum-exp of a row, as the CPU op: max, then the sum of exp(x - max) */
CT_HD static inline float ct_k_xent_row_lse(const float *x, int64_t C) {
    float m = -INFINITY, s = 0;
    for (int64_t j = 0; j < C; j++) m = x[j] > m ? x[j] : m;
    for (int64_t j = 0; j < C; j++) s += ct_vexpf(x[j] - m);
    return m + logf(s);
}
/* dL/dx_j of g * (lse - x_t): g softmax_j - g [j == t] */
CT_HD static inline float ct_k_xent_grad(float x, float lse, float g, bool is_target) {
    float d = g * ct_vexpf(x - lse);
    return is_target ? d - g : d;
}
/* a class index or token id of an i32 or i64 index tensor */
CT_HD static inline int64_t ct_k_index_at(const void *idx, bool i64, int64_t r) {
    return i64 ? ((const int64_t *)idx)[r] : (int64_t)((const int32_t *)idx)[r];
}

/* ---- softmax and log-softmax over a row's visible prefix [0, nv) of D (attention's causal
 * rows see nv < D; the rest is exactly 0), mean squared error, bias_add ---- */
/* softmax from the row max m and 1 / sum exp(x - m); log-softmax from the row's lse
 * (ct_k_attn_lse(m, sum)) */
CT_HD static inline float ct_k_softmax_out(float x, float m, float inv_sum) { return ct_vexpf(x - m) * inv_sum; }
CT_HD static inline float ct_k_log_softmax_out(float x, float lse) { return x - lse; }
/* dL/dx from the output y and dL/dy g: softmax with dot = sum_j g_j y_j, log-softmax with
 * gsum = sum_j g_j */
CT_HD static inline float ct_k_softmax_bwd(float y, float g, float dot) { return y * (g - dot); }
CT_HD static inline float ct_k_log_softmax_bwd(float y, float g, float gsum) { return g - ct_vexpf(y) * gsum; }
/* One row, the two-pass form (max, then sums): the CPU test's reference for the kernels,
 * whose lanes sum the same terms in another order. Softmax's dot sums in double, as the
 * CPU op does (g - dot cancels where g is near the row's mean). */
CT_HD static inline void ct_k_softmax_row(const float *x, int64_t D, int64_t nv, bool log_out, float *y) {
    float m = -INFINITY, s = 0;
    for (int64_t j = 0; j < nv; j++) m = x[j] > m ? x[j] : m;
    for (int64_t j = 0; j < nv; j++) s += ct_vexpf(x[j] - m);
    float lse = ct_k_attn_lse(m, s), inv = 1.0f / s;
    for (int64_t j = 0; j < nv; j++) y[j] = log_out ? ct_k_log_softmax_out(x[j], lse) : ct_k_softmax_out(x[j], m, inv);
    for (int64_t j = nv; j < D; j++) y[j] = 0.0f;
}
CT_HD static inline void ct_k_softmax_row_bwd(const float *y, const float *g, int64_t D, bool log_out, float *dx) {
    double dd = 0;
    float gs = 0;
    for (int64_t j = 0; j < D; j++) { dd += (double)g[j] * y[j]; gs += g[j]; }
    for (int64_t j = 0; j < D; j++)
        dx[j] = log_out ? ct_k_log_softmax_bwd(y[j], g[j], gs) : ct_k_softmax_bwd(y[j], g[j], (float)dd);
}
/* mean((a - b)^2): dL/da = s (a - b) with s = 2 dL / n; dL/db its negative */
CT_HD static inline float ct_k_mse_scale(float dloss, int64_t n) { return 2.0f * dloss / (float)n; }
CT_HD static inline float ct_k_mse_grad(float a, float b, float s) { return s * (a - b); }
/* bias_add on x [N, C, inner...]: the channel of flat element i */
CT_HD static inline int64_t ct_k_bias_channel(int64_t i, int64_t C, int64_t inner) { return (i / inner) % C; }
/* f32 -> bf16 bits, round to nearest even, NaN kept NaN (the CPU's conversion) */
CT_HD static inline uint16_t ct_k_f32_to_bf16(float x) {
    uint32_t u = ct_k_float_bits(x);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}
CT_HD static inline float ct_k_bf16_to_f32(uint16_t h) { return ct_k_bits_to_float((int32_t)((uint32_t)h << 16)); }
/* x rounded to bf16's precision (nearest even) and kept f32, a NaN left as it is: the value of
 * a bf16 tensor's gradient (the CPU autocast's rounding) */
CT_HD static inline float ct_k_round_bf16(float x) {
    uint32_t u = ct_k_float_bits(x), r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return ct_k_bits_to_float((int32_t)((u & 0x7fffffffu) > 0x7f800000u ? u : r));
}

/* ---- optimizers: PyTorch's formulas, operation for operation (src/optim/optim.c runs these) ---- */
typedef struct {
    float gsign, decay, b1, omb1, b2, omb2, nstep, bc2s, eps;
} ct_k_adamw;
/* step: the step number after incrementing (1 on the first step) */
static inline ct_k_adamw ct_k_adamw_consts(double beta1, double beta2, double eps, double wd, double lr, int64_t step,
                                           bool maximize) {
    const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
    ct_k_adamw k = {maximize ? -1.0f : 1.0f, (float)(1.0 - lr * wd), (float)beta1, (float)(1.0 - beta1), (float)beta2,
                    (float)(1.0 - beta2), (float)-(lr / bc1), (float)sqrt(bc2), (float)eps};
    return k;
}
/* vm: the amsgrad running maximum, NULL without amsgrad */
CT_HD static inline void ct_k_adamw_elem(const ct_k_adamw *k, float *p, float g, float *m, float *v, float *vm) {
    g *= k->gsign;
    float pd = *p * k->decay;
    float mn = fmaf(g, k->omb1, *m * k->b1);
    float vn = fmaf(k->omb2 * g, g, *v * k->b2);
    *m = mn;
    *v = vn;
    if (vm) {
        float mx = *vm;
        mx = (vn > mx || vn != vn) ? vn : mx; /* torch.maximum: NaN wins */
        *vm = mx;
        vn = mx;
    }
    *p = pd + (k->nstep * mn) / (sqrtf(vn) / k->bc2s + k->eps);
}
typedef struct {
    float wd, mom, omd, nlr, gsign;
    bool first, nesterov, use_wd;
} ct_k_sgd;
/* first: no step taken yet (the momentum buffer starts as the gradient) */
static inline ct_k_sgd ct_k_sgd_consts(double momentum, double dampening, double wd, bool nesterov, bool maximize,
                                       double lr, bool first) {
    ct_k_sgd k = {(float)wd, (float)momentum, (float)(1.0 - dampening), (float)-lr, maximize ? -1.0f : 1.0f,
                  first, nesterov, wd != 0};
    return k;
}
/* buf: the momentum buffer, NULL without momentum */
CT_HD static inline void ct_k_sgd_elem(const ct_k_sgd *k, float *p, float g, float *buf) {
    g *= k->gsign;
    g = k->use_wd ? fmaf(*p, k->wd, g) : g; /* PyTorch skips the add when wd == 0 */
    if (buf) {
        float b = k->first ? g : fmaf(g, k->omd, *buf * k->mom);
        *buf = b;
        g = k->nesterov ? fmaf(b, k->mom, g) : b;
    }
    *p = fmaf(g, k->nlr, *p);
}

/* ---- gradient norm (clip_grad_norm_): the sum of squares of G[b, e) in double with 8
 * interleaved accumulators (a fixed order the CPU keeps in vector registers); the norm sums
 * chunks of CT_K_SUMSQ_CHUNK in order, on the CPU (src/optim/clip.c) and on a GPU (one chunk
 * per thread): the same bits for any thread count and either device ---- */
#define CT_K_SUMSQ_CHUNK 16384
CT_HD static inline double ct_k_sumsq(const float *G, size_t b, size_t e) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = b;
    for (; i + 8 <= e; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)G[i + j] * (double)G[i + j];
    for (int j = 0; i < e; i++, j++) acc[j] += (double)G[i] * (double)G[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* ---- flash attention: the online softmax over one query row ----
 * Keys come in tiles of CT_K_ATTN_TILE scores; per tile: m' = max(m, tile max),
 * alpha = exp(m - m'), l = l alpha + sum exp(s - m'), O = O alpha + sum exp(s - m') v.
 * After the last tile O /= l and lse = m + log l (saved: O(T) memory). Backward recomputes
 * p = exp(s - lse) and, with Dr = rowsum(dO * O), ds = p (dO.v - Dr) scale. */
#define CT_K_ATTN_TILE 32
#define CT_K_ATTN_MAX_D 128 /* head dims up to this (per-thread accumulators) */
/* m' from the tile's max; returns alpha and rescales l (the caller rescales O) */
CT_HD static inline float ct_k_attn_rescale(float *m, float *l, float tile_max) {
    float mn = tile_max > *m ? tile_max : *m;
    float alpha = ct_vexpf(*m - mn); /* first tile: exp(-inf) = 0 */
    *l *= alpha;
    *m = mn;
    return alpha;
}
CT_HD static inline float ct_k_attn_ds(float p, float dp, float dr, float scale) { return p * (dp - dr) * scale; }

/* Whole-row versions for one element type: q, o, dq ... are one row; K, V, dO, Q the
 * head's [T, D] matrices. LD converts an element to float, ST stores a float. One GPU
 * thread runs one row (src/cuda/attention.cu instantiates f32 and bf16); the f32 instance
 * below is what the CPU test runs. Query i of a causal head sees keys j <= i. */
#define CT_K_DEFINE_ATTN(SUF, T, LD, ST)                                                                              \
    /* O and lse of query row i over keys [0, nk) */                                                                 \
    CT_HD static inline void ct_k_attn_fwd_row_##SUF(const T *q, const T *K, const T *V, int64_t nk, int D, int Dv,   \
                                                     float scale, T *o, float *lse) {                                \
        float acc[CT_K_ATTN_MAX_D], qf[CT_K_ATTN_MAX_D], s[CT_K_ATTN_TILE], m = -INFINITY, l = 0;                    \
        for (int c = 0; c < Dv; c++) acc[c] = 0;                                                                     \
        for (int c = 0; c < D; c++) qf[c] = LD(q[c]);                                                                \
        for (int64_t j0 = 0; j0 < nk; j0 += CT_K_ATTN_TILE) {                                                        \
            int n = nk - j0 < CT_K_ATTN_TILE ? (int)(nk - j0) : CT_K_ATTN_TILE;                                      \
            float mt = -INFINITY;                                                                                    \
            for (int t = 0; t < n; t++) {                                                                            \
                const T *k = K + (j0 + t) * D;                                                                       \
                float d = 0;                                                                                         \
                for (int c = 0; c < D; c++) d = fmaf(qf[c], LD(k[c]), d);                                            \
                s[t] = d * scale;                                                                                    \
                mt = s[t] > mt ? s[t] : mt;                                                                          \
            }                                                                                                        \
            float alpha = ct_k_attn_rescale(&m, &l, mt);                                                             \
            for (int c = 0; c < Dv; c++) acc[c] *= alpha;                                                            \
            for (int t = 0; t < n; t++) {                                                                            \
                float p = ct_vexpf(s[t] - m);                                                                        \
                const T *v = V + (j0 + t) * Dv;                                                                      \
                l += p;                                                                                              \
                for (int c = 0; c < Dv; c++) acc[c] = fmaf(p, LD(v[c]), acc[c]);                                     \
            }                                                                                                        \
        }                                                                                                            \
        float inv = l > 0 ? 1.0f / l : 0.0f; /* no visible key: 0, as the CPU op */                                 \
        for (int c = 0; c < Dv; c++) o[c] = ST(acc[c] * inv);                                                        \
        *lse = ct_k_attn_lse(m, l);                                                                                  \
    }                                                                                                                \
    /* dQ of query row i (written) from its lse and dr = rowsum(dO_i * O_i) */                                      \
    CT_HD static inline void ct_k_attn_dq_row_##SUF(const T *q, const T *dO, const T *K, const T *V, int64_t nk, int D, \
                                                    int Dv, float scale, float lse, float dr, T *dq) {               \
        float acc[CT_K_ATTN_MAX_D], qf[CT_K_ATTN_MAX_D], gf[CT_K_ATTN_MAX_D];                                        \
        for (int c = 0; c < D; c++) { acc[c] = 0; qf[c] = LD(q[c]); }                                                \
        for (int c = 0; c < Dv; c++) gf[c] = LD(dO[c]);                                                              \
        for (int64_t j = 0; j < nk; j++) {                                                                           \
            const T *k = K + j * D, *v = V + j * Dv;                                                                 \
            float s = 0, dp = 0;                                                                                     \
            for (int c = 0; c < D; c++) s = fmaf(qf[c], LD(k[c]), s);                                                \
            for (int c = 0; c < Dv; c++) dp = fmaf(gf[c], LD(v[c]), dp);                                             \
            float ds = ct_k_attn_ds(ct_vexpf(s * scale - lse), dp, dr, scale);                                       \
            for (int c = 0; c < D; c++) acc[c] = fmaf(ds, LD(k[c]), acc[c]);                                         \
        }                                                                                                            \
        for (int c = 0; c < D; c++) dq[c] = ST(acc[c]);                                                              \
    }                                                                                                                \
    /* dK, dV of key row j (written) over query rows [i0, nq): Q, dO, lse, Dr of the head */                        \
    CT_HD static inline void ct_k_attn_dkv_row_##SUF(const T *k, const T *v, const T *Q, const T *dO, const float *lse, \
                                                     const float *Dr, int64_t i0, int64_t nq, int D, int Dv,         \
                                                     float scale, T *dk, T *dv) {                                    \
        float ak[CT_K_ATTN_MAX_D], av[CT_K_ATTN_MAX_D], kf[CT_K_ATTN_MAX_D], vf[CT_K_ATTN_MAX_D];                    \
        for (int c = 0; c < D; c++) { ak[c] = 0; kf[c] = LD(k[c]); }                                                 \
        for (int c = 0; c < Dv; c++) { av[c] = 0; vf[c] = LD(v[c]); }                                                \
        for (int64_t i = i0; i < nq; i++) {                                                                          \
            const T *q = Q + i * D, *g = dO + i * Dv;                                                                \
            float s = 0, dp = 0;                                                                                     \
            for (int c = 0; c < D; c++) s = fmaf(LD(q[c]), kf[c], s);                                                \
            for (int c = 0; c < Dv; c++) dp = fmaf(LD(g[c]), vf[c], dp);                                             \
            float p = ct_vexpf(s * scale - lse[i]), ds = ct_k_attn_ds(p, dp, Dr[i], scale);                          \
            for (int c = 0; c < Dv; c++) av[c] = fmaf(p, LD(g[c]), av[c]);                                           \
            for (int c = 0; c < D; c++) ak[c] = fmaf(ds, LD(q[c]), ak[c]);                                           \
        }                                                                                                            \
        for (int c = 0; c < D; c++) dk[c] = ST(ak[c]);                                                               \
        for (int c = 0; c < Dv; c++) dv[c] = ST(av[c]);                                                              \
    }

#define CT_K_F32_LD(x) (x)
CT_K_DEFINE_ATTN(f32, float, CT_K_F32_LD, CT_K_F32_LD)

/* ---- max pooling (NCHW planes of H x W; window k, stride s, padding p, p <= k/2 so no
 * window lies wholly in the padding) ---- */
/* CT_K_DEFINE_MAX_POOL(SUF, T, LD) defines both functions for planes stored as T, read as
 * floats through LD: here for f32 (no suffix), in src/cuda/pool.cu for bf16 and f16 (C++
 * overloads of the same names), so every precision runs this one arithmetic.
 *
 * ct_k_max_pool_at: output (oh, ow)'s max over the window clipped to the plane (relu: over
 * max(v, 0), ctrain's ReLU, NaN -> 0): the first maximum in scan order wins; a NaN wins and
 * stays (PyTorch's rule). *arg: the winner's offset in the plane, which backward routes the
 * gradient to.
 * ct_k_max_pool_dx: the gradient of input (ih, iw) of a plane: `start` plus gy of every
 * output whose saved argmax is this input (relu: and whose value is positive, as ReLU's
 * backward passes it), added in output order — the order in which the CPU op scatters them,
 * hence its bits. */
#define CT_K_DEFINE_MAX_POOL(SUF, T, LD)                                                                              \
    CT_HD static inline float ct_k_max_pool_at##SUF(const T *xp, int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, \
                                                    int64_t oh, int64_t ow, bool relu, int32_t *arg) {                 \
        int64_t hs = oh * s - p, ws = ow * s - p;                                                                      \
        int64_t h1 = hs + k < H ? hs + k : H, w1 = ws + k < W ? ws + k : W, h0 = hs < 0 ? 0 : hs, w0 = ws < 0 ? 0 : ws; \
        float m = -INFINITY;                                                                                           \
        int64_t am = h0 * W + w0;                                                                                      \
        for (int64_t ih = h0; ih < h1; ih++)                                                                           \
            for (int64_t iw = w0; iw < w1; iw++) {                                                                     \
                float v = LD(xp[ih * W + iw]);                                                                         \
                if (relu) v = v > 0 ? v : 0.0f;                                                                        \
                if (v > m || v != v) {                                                                                 \
                    m = v;                                                                                             \
                    am = ih * W + iw;                                                                                  \
                    if (v != v) {                                                                                      \
                        *arg = (int32_t)am;                                                                            \
                        return m;                                                                                      \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        *arg = (int32_t)am;                                                                                            \
        return m;                                                                                                      \
    }                                                                                                                  \
    CT_HD static inline float ct_k_max_pool_dx##SUF(const float *gy, const T *y, const int32_t *arg, int64_t W,        \
                                                    int64_t OH, int64_t OW, int64_t k, int64_t s, int64_t p, int64_t ih, \
                                                    int64_t iw, bool relu, float start) {                              \
        /* outputs whose window covers ih: oh*s - p <= ih < oh*s - p + k */                                          \
        int64_t a = ih + p - k + 1, b = iw + p - k + 1;                                                                \
        int64_t oh0 = a <= 0 ? 0 : (a + s - 1) / s, ow0 = b <= 0 ? 0 : (b + s - 1) / s;                               \
        int64_t oh1 = (ih + p) / s + 1, ow1 = (iw + p) / s + 1;                                                        \
        oh1 = oh1 < OH ? oh1 : OH;                                                                                     \
        ow1 = ow1 < OW ? ow1 : OW;                                                                                     \
        int32_t me = (int32_t)(ih * W + iw);                                                                           \
        float acc = start;                                                                                             \
        for (int64_t oh = oh0; oh < oh1; oh++)                                                                         \
            for (int64_t ow = ow0; ow < ow1; ow++) {                                                                   \
                int64_t q = oh * OW + ow;                                                                              \
                if (arg[q] == me && (!relu || LD(y[q]) > 0)) acc += gy[q];                                             \
            }                                                                                                          \
        return acc;                                                                                                    \
    }
CT_K_DEFINE_MAX_POOL(, float, CT_K_F32_LD)

#endif
