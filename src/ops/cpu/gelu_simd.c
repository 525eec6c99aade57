/* Exact (erf) GELU forward and backward on 16 lanes: ct_k_gelu and ct_k_gelu_bwd
 * (ops/kmath.h) written out with the same operations in the same order, so every finite
 * input gives the same bits as the scalar function (test_kmath checks the op against it).
 * gcc's own vectorisation of those functions is ~1.35x slower on data in L1 (it keeps the
 * scalar code's NaN and overflow selects). That is where bf16 autocast runs GELU (widened
 * chunks on the stack): GELU's share of a bf16 GPT step fell from 6.5% to 5.5%. The f32
 * op streams 8 MB tensors, yet is bound by its arithmetic: 0.83 ns an element forward there
 * against 0.64 in L1, 0.98 against 0.96 backward (Zen 4), so fusing it into the GEMM's
 * epilogue would save little.
 * Then the same GELU on 8 lanes (AVX2 + FMA) for CPUs without AVX-512, and on 8 lanes too the
 * loops of ct_vexpf that gcc leaves scalar there: SiLU and the exponentials of softmax rows. */
#include "ctrain/core.h"
#include "ops/cpu/gelu_simd.h"

#include "ops/cpu/avx2.h"
#include "ops/cpu/avx512.h"
#include "ops/kmath.h"

/* ct_vnormcdf, Phi(x) = 0.5 erfc(-x / sqrt 2) (Numerical Recipes' erfc), on N vectors side by
 * side (see ct_exp16n), in two halves around the exponential so that a caller can run other
 * exponentials with it: pre leaves its argument in a[u] and t in t[u]; after ct_exp16n(a),
 * post makes Phi(x). */
CT_AVX512 static inline __attribute__((always_inline)) void cdf16_pre(const __m512 *x, __m512 *a, __m512 *t, int N) {
    static const float c[9] = {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f,
                               0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 z[8];
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        z[u] = _mm512_mul_ps(_mm512_abs_ps(x[u]), _mm512_set1_ps(0.70710678118654752f));
        t[u] = _mm512_div_ps(one, _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(0.5f), z[u])));
        a[u] = _mm512_set1_ps(0.17087277f);
    }
#pragma GCC unroll 9
    for (int k = 0; k < 9; k++)
#pragma GCC unroll 8
        for (int u = 0; u < N; u++) a[u] = _mm512_fmadd_ps(a[u], t[u], _mm512_set1_ps(c[k]));
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) a[u] = _mm512_fnmadd_ps(z[u], z[u], a[u]);
}
CT_AVX512 static inline __attribute__((always_inline)) void cdf16_post(const __m512 *x, const __m512 *ea, const __m512 *t, __m512 *cdf,
                                                                       int N) {
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        __m512 e = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), t[u]), ea[u]);
        cdf[u] = _mm512_mask_sub_ps(e, _mm512_cmp_ps_mask(x[u], _mm512_setzero_ps(), _CMP_GE_OQ), _mm512_set1_ps(1.0f), e);
    }
}

/* the tail (n % 16) through masked loads and stores, so no scalar loop can round otherwise */
static inline __mmask16 tail(int64_t n, int64_t i) { return n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1); }

/* 4 vectors a step, then the rest one (masked) vector at a time: m is each vector's mask */
enum { UN16 = 4 };
#define CT_LOOP16(n, STEP)                                                                                                 \
    do {                                                                                                                   \
        int64_t i_ = 0;                                                                                                    \
        for (; i_ + 16 * UN16 <= (n); i_ += 16 * UN16) STEP(i_, UN16, (__mmask16)0xFFFF);                                  \
        for (; i_ < (n); i_ += 16) STEP(i_, 1, tail((n), i_));                                                             \
    } while (0)

CT_AVX512 static inline __attribute__((always_inline)) void gelu16_step(const float *X, float *Y, int64_t i, int N, __mmask16 m) {
    __m512 x[UN16], a[UN16], t[UN16], c[UN16];
    for (int u = 0; u < N; u++) x[u] = _mm512_maskz_loadu_ps(m, X + i + 16 * u);
    cdf16_pre(x, a, t, N);
    ct_exp16n(a, N);
    cdf16_post(x, a, t, c, N);
    for (int u = 0; u < N; u++) _mm512_mask_storeu_ps(Y + i + 16 * u, m, _mm512_mul_ps(x[u], c[u]));
}
CT_AVX512 void ct_gelu_simd(const float *restrict X, float *restrict Y, int64_t n) {
#define STEP(i, N, m) gelu16_step(X, Y, i, N, m)
    CT_LOOP16(n, STEP);
#undef STEP
}

/* g * (Phi(x) + x / sqrt(2 pi) * exp(-0.5 x x)); fresh: +0 + that, the bits of adding to a
 * zeroed buffer */
CT_AVX512 static inline __attribute__((always_inline)) void gelu16_bwd_step(const float *X, const float *g, float *gx, bool fresh, int64_t i,
                                                                            int N, __mmask16 m) {
    const __m512 inv_sqrt_2pi = _mm512_set1_ps(CT_K_INV_SQRT_2PI), mhalf = _mm512_set1_ps(-0.5f);
    __m512 x[UN16], a[2 * UN16], t[UN16], c[UN16]; /* a: Phi's exponentials, then the density's */
    for (int u = 0; u < N; u++) {
        x[u] = _mm512_maskz_loadu_ps(m, X + i + 16 * u);
        a[N + u] = _mm512_mul_ps(_mm512_mul_ps(mhalf, x[u]), x[u]);
    }
    cdf16_pre(x, a, t, N);
    ct_exp16n(a, 2 * N);
    cdf16_post(x, a, t, c, N);
    for (int u = 0; u < N; u++) {
        __m512 pdf = _mm512_mul_ps(_mm512_mul_ps(x[u], inv_sqrt_2pi), a[N + u]);
        __m512 d = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, g + i + 16 * u), _mm512_add_ps(c[u], pdf));
        __m512 base = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, gx + i + 16 * u);
        _mm512_mask_storeu_ps(gx + i + 16 * u, m, _mm512_add_ps(base, d));
    }
}
CT_AVX512 void ct_gelu_bwd_simd(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n, bool fresh) {
#define STEP(i, N, m) gelu16_bwd_step(X, g, gx, fresh, i, N, m)
    CT_LOOP16(n, STEP);
#undef STEP
}

/* ---- the same on 8 lanes (AVX2 + FMA), for CPUs without AVX-512 (AMD Zen 3): gcc's own
 * vectorisation of the scalar functions left GELU at 26% of a GPT step there. Operation for
 * operation the scalar code (and the 16-lane code above), so the same bits for finite input. */

bool ct_gelu_avx2_available(void) { return ct_cpu_capability() >= CT_CPU_AVX2; }

/* ct_vnormcdf on N vectors of 8 lanes, side by side (see ct_exp8n for why), in two halves so
 * that a caller can run other exponentials with its own: cdf_pre leaves the exponential's
 * argument in a[u] and t in t[u]; after ct_exp8n(a), cdf_post makes Phi(x). */
CT_AVX2 static inline __attribute__((always_inline)) void cdf_pre(const __m256 *x, __m256 *a, __m256 *t, int N) {
    static const float c[9] = {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f,
                               0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 z[8];
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        z[u] = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x[u]), _mm256_set1_ps(0.70710678118654752f));
        t[u] = _mm256_div_ps(one, _mm256_add_ps(one, _mm256_mul_ps(_mm256_set1_ps(0.5f), z[u])));
        a[u] = _mm256_set1_ps(0.17087277f);
    }
#pragma GCC unroll 9
    for (int k = 0; k < 9; k++)
#pragma GCC unroll 8
        for (int u = 0; u < N; u++) a[u] = _mm256_fmadd_ps(a[u], t[u], _mm256_set1_ps(c[k]));
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) a[u] = _mm256_fnmadd_ps(z[u], z[u], a[u]);
}
CT_AVX2 static inline __attribute__((always_inline)) void cdf_post(const __m256 *x, const __m256 *ea, const __m256 *t, __m256 *cdf, int N) {
    const __m256 one = _mm256_set1_ps(1.0f);
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        __m256 e = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), t[u]), ea[u]);
        cdf[u] = _mm256_blendv_ps(e, _mm256_sub_ps(one, e), _mm256_cmp_ps(x[u], _mm256_setzero_ps(), _CMP_GE_OQ));
    }
}

/* lanes [0, n - i) of 8 (the tail through masked loads and stores, as above) */
CT_AVX2 static inline __m256i tail8(int64_t n, int64_t i) {
    int k = n - i >= 8 ? 8 : (int)(n - i);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The loops below take UN vectors a step (their chains side by side), then the tail one vector
 * at a time through masks. A step of N vectors from element i: whole (m unused) or the masked
 * tail (N = 1). */
enum { UN = 4 };
CT_AVX2 static inline __attribute__((always_inline)) __m256 ld8(const float *p, bool whole, __m256i m) {
    return whole ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}
/* stores whole vectors as such: a masked store is slow on AMD CPUs even with every lane set */
CT_AVX2 static inline __attribute__((always_inline)) void st8(float *p, bool whole, __m256i m, __m256 v) {
    if (whole) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, m, v);
}
/* for (i = 0; i < n; ...) STEP(i, N, whole, m): UN vectors while they fit, then single ones */
#define CT_LOOP8(n, STEP)                                                                                                  \
    do {                                                                                                                   \
        int64_t i_ = 0;                                                                                                    \
        const __m256i all_ = _mm256_set1_epi32(-1);                                                                        \
        for (; i_ + 8 * UN <= (n); i_ += 8 * UN) STEP(i_, UN, true, all_);                                                 \
        for (; i_ < (n); i_ += 8) {                                                                                        \
            const __m256i m_ = tail8((n), i_);                                                                             \
            if ((n) - i_ >= 8) STEP(i_, 1, true, m_);                                                                      \
            else STEP(i_, 1, false, m_);                                                                                   \
        }                                                                                                                  \
    } while (0)

CT_AVX2 static inline __attribute__((always_inline)) void gelu_step(const float *X, float *Y, int64_t i, int N, bool whole, __m256i m) {
    __m256 x[UN], a[UN], t[UN], c[UN];
    for (int u = 0; u < N; u++) x[u] = ld8(X + i + 8 * u, whole, m);
    cdf_pre(x, a, t, N);
    ct_exp8n(a, N);
    cdf_post(x, a, t, c, N);
    for (int u = 0; u < N; u++) st8(Y + i + 8 * u, whole, m, _mm256_mul_ps(x[u], c[u]));
}
CT_AVX2 void ct_gelu_avx2(const float *restrict X, float *restrict Y, int64_t n) {
#define STEP(i, N, w, m) gelu_step(X, Y, i, N, w, m)
    CT_LOOP8(n, STEP);
#undef STEP
}

CT_AVX2 static inline __attribute__((always_inline)) void gelu_bwd_step(const float *X, const float *g, float *gx, bool fresh, int64_t i,
                                                                        int N, bool whole, __m256i m) {
    const __m256 inv_sqrt_2pi = _mm256_set1_ps(CT_K_INV_SQRT_2PI), mhalf = _mm256_set1_ps(-0.5f);
    __m256 x[UN], a[2 * UN], t[UN], c[UN]; /* a: Phi's exponentials, then the density's */
    for (int u = 0; u < N; u++) {
        x[u] = ld8(X + i + 8 * u, whole, m);
        a[N + u] = _mm256_mul_ps(_mm256_mul_ps(mhalf, x[u]), x[u]);
    }
    cdf_pre(x, a, t, N);
    ct_exp8n(a, 2 * N);
    cdf_post(x, a, t, c, N);
    for (int u = 0; u < N; u++) {
        __m256 pdf = _mm256_mul_ps(_mm256_mul_ps(x[u], inv_sqrt_2pi), a[N + u]);
        __m256 d = _mm256_mul_ps(ld8(g + i + 8 * u, whole, m), _mm256_add_ps(c[u], pdf));
        __m256 base = fresh ? _mm256_setzero_ps() : ld8(gx + i + 8 * u, whole, m);
        st8(gx + i + 8 * u, whole, m, _mm256_add_ps(base, d));
    }
}
CT_AVX2 void ct_gelu_bwd_avx2(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n, bool fresh) {
#define STEP(i, N, w, m) gelu_bwd_step(X, g, gx, fresh, i, N, w, m)
    CT_LOOP8(n, STEP);
#undef STEP
}

/* SiLU, x sigmoid(x) with sigmoid = 1 / (1 + ct_vexpf(-x)) (ct_k_sigmoid), and its gradient
 * accumulated, gx += g (s (1 + x (1 - s))): elementwise.c's loops, operation for operation */
CT_AVX2 static inline __attribute__((always_inline)) void sigmoid8n(const __m256 *x, __m256 *s, int N) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int u = 0; u < N; u++) s[u] = _mm256_xor_ps(x[u], _mm256_set1_ps(-0.0f));
    ct_exp8n(s, N);
    for (int u = 0; u < N; u++) s[u] = _mm256_div_ps(one, _mm256_add_ps(one, s[u]));
}

CT_AVX2 static inline __attribute__((always_inline)) void silu_step(const float *X, float *Y, int64_t i, int N, bool whole, __m256i m) {
    __m256 x[UN], s[UN];
    for (int u = 0; u < N; u++) x[u] = ld8(X + i + 8 * u, whole, m);
    sigmoid8n(x, s, N);
    for (int u = 0; u < N; u++) st8(Y + i + 8 * u, whole, m, _mm256_mul_ps(x[u], s[u]));
}
CT_AVX2 void ct_silu_avx2(const float *restrict X, float *restrict Y, int64_t n) {
#define STEP(i, N, w, m) silu_step(X, Y, i, N, w, m)
    CT_LOOP8(n, STEP);
#undef STEP
}

CT_AVX2 static inline __attribute__((always_inline)) void silu_bwd_step(const float *X, const float *g, float *gx, int64_t i, int N, bool whole,
                                                                        __m256i m) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 x[UN], s[UN];
    for (int u = 0; u < N; u++) x[u] = ld8(X + i + 8 * u, whole, m);
    sigmoid8n(x, s, N);
    for (int u = 0; u < N; u++) {
        __m256 d = _mm256_mul_ps(ld8(g + i + 8 * u, whole, m), _mm256_mul_ps(s[u], _mm256_add_ps(one, _mm256_mul_ps(x[u], _mm256_sub_ps(one, s[u])))));
        st8(gx + i + 8 * u, whole, m, _mm256_add_ps(ld8(gx + i + 8 * u, whole, m), d));
    }
}
CT_AVX2 void ct_silu_bwd_avx2(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n) {
#define STEP(i, N, w, m) silu_bwd_step(X, g, gx, i, N, w, m)
    CT_LOOP8(n, STEP);
#undef STEP
}

/* y[j] = ct_vexpf(x[j] - m) for N vectors at x; a NaN difference gives NaN, as ct_vexpf does
 * (the exponential would clamp it). Lanes outside m are +0 (masked loads), so not NaN. */
CT_AVX2 static inline __attribute__((always_inline)) void exp_sub8n(const float *x, __m256 mv, __m256 *e, int N, bool whole, __m256i m) {
    __m256 d[UN];
    for (int u = 0; u < N; u++) e[u] = d[u] = _mm256_sub_ps(ld8(x + 8 * u, whole, m), mv);
    ct_exp8n(e, N);
    for (int u = 0; u < N; u++) e[u] = _mm256_blendv_ps(e[u], d[u], _mm256_cmp_ps(d[u], d[u], _CMP_UNORD_Q));
}

CT_AVX2 static inline __attribute__((always_inline)) void exp_sub_step(float *y, const float *x, __m256 mv, int64_t i, int N, bool whole,
                                                                       __m256i m) {
    __m256 e[UN];
    exp_sub8n(x + i, mv, e, N, whole, m);
    for (int u = 0; u < N; u++) st8(y + i + 8 * u, whole, m, e[u]);
}
CT_AVX2 void ct_vexp_sub_avx2(float *y, const float *x, float m, int64_t n) {
    const __m256 mv = _mm256_set1_ps(m);
#define STEP(i, N, w, mk) exp_sub_step(y, x, mv, i, N, w, mk)
    CT_LOOP8(n, STEP);
#undef STEP
}

/* y = exp(x - m) (stored unless y is NULL) and the sum of y: 8 lanes' partial sums (each lane
 * adds its elements in order; lanes past n add +0), then added in a fixed order (lane j +
 * lane j+4, then pairs). Inlined with y constant, so the sum alone has no store in its loop. */
CT_AVX2 static inline __attribute__((always_inline)) void exp_sum_step(float *y, const float *x, __m256 mv, __m256 *acc, int64_t i, int N,
                                                                       bool whole, __m256i m) {
    __m256 e[UN];
    exp_sub8n(x + i, mv, e, N, whole, m);
    for (int u = 0; u < N; u++) {
        if (y) st8(y + i + 8 * u, whole, m, e[u]);
        *acc = _mm256_add_ps(*acc, whole ? e[u] : _mm256_and_ps(e[u], _mm256_castsi256_ps(m)));
    }
}
CT_AVX2 static inline __attribute__((always_inline)) float exp_sub_sum(float *y, const float *x, float m, int64_t n) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
#define STEP(i, N, w, mk) exp_sum_step(y, x, mv, &acc, i, N, w, mk)
    CT_LOOP8(n, STEP);
#undef STEP
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

CT_AVX2 float ct_vexp_sub_sum_avx2(float *y, const float *x, float m, int64_t n) { return exp_sub_sum(y, x, m, n); }

/* the sum alone (cross-entropy's log-sum-exp): the same bits, nothing stored */
CT_AVX2 float ct_vexp_sum_avx2(const float *x, float m, int64_t n) { return exp_sub_sum(NULL, x, m, n); }
