/* Exact (erf) GELU forward and backward on 16 lanes: ct_k_gelu and ct_k_gelu_bwd
 * (ops/kmath.h) written out with the same operations in the same order, so every finite
 * input gives the same bits as the scalar function (test_kmath checks the op against it).
 * gcc's own vectorisation of those functions is ~1.35x slower on data in L1 (it keeps the
 * scalar code's NaN and overflow selects). That is where bf16 autocast runs GELU (widened
 * chunks on the stack): GELU's share of a bf16 GPT step fell from 6.5% to 5.5%. The f32
 * op streams 8 MB tensors and is bound by memory either way.
 * Then the same GELU on 8 lanes (AVX2 + FMA) for CPUs without AVX-512, and on 8 lanes too the
 * loops of ct_vexpf that gcc leaves scalar there: SiLU and the exponentials of softmax rows. */
#include "ctrain/core.h"
#include "ops/cpu/gelu_simd.h"

#include "ops/cpu/avx2.h"
#include "ops/cpu/avx512.h"
#include "ops/kmath.h"

/* ct_vnormcdf: Phi(x) = 0.5 erfc(-x / sqrt 2), Numerical Recipes' erfc */
CT_AVX512 static inline __m512 normcdf16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
    __m512 t = _mm512_div_ps(one, _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(0.5f), z)));
    __m512 p = _mm512_set1_ps(0.17087277f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.26551223f));
    __m512 e = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), t), ct_exp16(_mm512_fnmadd_ps(z, z, p)));
    return _mm512_mask_sub_ps(e, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), one, e);
}

/* the tail (n % 16) through masked loads and stores, so no scalar loop can round otherwise */
static inline __mmask16 tail(int64_t n, int64_t i) { return n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1); }

CT_AVX512 void ct_gelu_simd(const float *restrict X, float *restrict Y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail(n, i);
        __m512 x = _mm512_maskz_loadu_ps(m, X + i);
        _mm512_mask_storeu_ps(Y + i, m, _mm512_mul_ps(x, normcdf16(x)));
    }
}

CT_AVX512 void ct_gelu_bwd_simd(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n, bool fresh) {
    const __m512 inv_sqrt_2pi = _mm512_set1_ps(CT_K_INV_SQRT_2PI), mhalf = _mm512_set1_ps(-0.5f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail(n, i);
        __m512 x = _mm512_maskz_loadu_ps(m, X + i);
        /* g * (Phi(x) + x / sqrt(2 pi) * exp(-0.5 x x)) */
        __m512 pdf = _mm512_mul_ps(_mm512_mul_ps(x, inv_sqrt_2pi), ct_exp16(_mm512_mul_ps(_mm512_mul_ps(mhalf, x), x)));
        __m512 d = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, g + i), _mm512_add_ps(normcdf16(x), pdf));
        /* fresh: +0 + d, the bits of adding to a zeroed buffer */
        __m512 base = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, gx + i);
        _mm512_mask_storeu_ps(gx + i, m, _mm512_add_ps(base, d));
    }
}

/* ---- the same on 8 lanes (AVX2 + FMA), for CPUs without AVX-512 (AMD Zen 3): gcc's own
 * vectorisation of the scalar functions left GELU at 26% of a GPT step there. Operation for
 * operation the scalar code (and the 16-lane code above), so the same bits for finite input. */

bool ct_gelu_avx2_available(void) { return ct_cpu_capability() >= CT_CPU_AVX2; }

/* ct_vnormcdf on 8 lanes */
CT_AVX2 static inline __m256 normcdf8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    __m256 z = _mm256_mul_ps(ax, _mm256_set1_ps(0.70710678118654752f));
    __m256 t = _mm256_div_ps(one, _mm256_add_ps(one, _mm256_mul_ps(_mm256_set1_ps(0.5f), z)));
    __m256 p = _mm256_set1_ps(0.17087277f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.82215223f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.48851587f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.13520398f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.27886807f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.18628806f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.09678418f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.37409196f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.00002368f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.26551223f));
    __m256 e = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), t), ct_exp8(_mm256_fnmadd_ps(z, z, p)));
    return _mm256_blendv_ps(e, _mm256_sub_ps(one, e), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
}

/* lanes [0, n - i) of 8 (the tail through masked loads and stores, as above) */
CT_AVX2 static inline __m256i tail8(int64_t n, int64_t i) {
    int k = n - i >= 8 ? 8 : (int)(n - i);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* stores whole vectors as such: a masked store is slow on AMD CPUs even with every lane set */
CT_AVX2 static inline void store8(float *p, __m256i m, int64_t n, int64_t i, __m256 v) {
    if (n - i >= 8) _mm256_storeu_ps(p + i, v);
    else _mm256_maskstore_ps(p + i, m, v);
}

CT_AVX2 void ct_gelu_avx2(const float *restrict X, float *restrict Y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail8(n, i);
        __m256 x = _mm256_maskload_ps(X + i, m);
        store8(Y, m, n, i, _mm256_mul_ps(x, normcdf8(x)));
    }
}

CT_AVX2 void ct_gelu_bwd_avx2(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n, bool fresh) {
    const __m256 inv_sqrt_2pi = _mm256_set1_ps(CT_K_INV_SQRT_2PI), mhalf = _mm256_set1_ps(-0.5f);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail8(n, i);
        __m256 x = _mm256_maskload_ps(X + i, m);
        __m256 pdf = _mm256_mul_ps(_mm256_mul_ps(x, inv_sqrt_2pi), ct_exp8(_mm256_mul_ps(_mm256_mul_ps(mhalf, x), x)));
        __m256 d = _mm256_mul_ps(_mm256_maskload_ps(g + i, m), _mm256_add_ps(normcdf8(x), pdf));
        __m256 base = fresh ? _mm256_setzero_ps() : _mm256_maskload_ps(gx + i, m);
        store8(gx, m, n, i, _mm256_add_ps(base, d));
    }
}

/* SiLU, x sigmoid(x) with sigmoid = 1 / (1 + ct_vexpf(-x)) (ct_k_sigmoid), and its gradient
 * accumulated, gx += g (s (1 + x (1 - s))): elementwise.c's loops, operation for operation */
CT_AVX2 static inline __m256 sigmoid8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, ct_exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)))));
}

CT_AVX2 void ct_silu_avx2(const float *restrict X, float *restrict Y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail8(n, i);
        __m256 x = _mm256_maskload_ps(X + i, m);
        store8(Y, m, n, i, _mm256_mul_ps(x, sigmoid8(x)));
    }
}

CT_AVX2 void ct_silu_bwd_avx2(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail8(n, i);
        __m256 x = _mm256_maskload_ps(X + i, m), s = sigmoid8(x);
        __m256 d = _mm256_mul_ps(_mm256_maskload_ps(g + i, m), _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, s)))));
        store8(gx, m, n, i, _mm256_add_ps(_mm256_maskload_ps(gx + i, m), d));
    }
}

/* y[j] = ct_vexpf(x[j] - m); a NaN difference gives NaN, as ct_vexpf does (exp8 would clamp
 * it). y may be x. */
CT_AVX2 static inline __m256 exp_sub8(const float *x, __m256i k, __m256 mv) {
    __m256 d = _mm256_sub_ps(_mm256_maskload_ps(x, k), mv);
    return _mm256_blendv_ps(ct_exp8(d), d, _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
}

CT_AVX2 void ct_vexp_sub_avx2(float *y, const float *x, float m, int64_t n) {
    const __m256 mv = _mm256_set1_ps(m);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i k = tail8(n, i);
        store8(y, k, n, i, exp_sub8(x + i, k, mv));
    }
}

/* y = exp(x - m) (stored unless y is NULL) and the sum of y: 8 lanes' partial sums, lanes
 * past n adding +0, then added in a fixed order (lane j + lane j+4, then pairs). Inlined with
 * y constant, so the sum alone has no store in its loop. */
CT_AVX2 static inline __attribute__((always_inline)) float exp_sub_sum(float *y, const float *x, float m, int64_t n) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256i k = tail8(n, i);
        __m256 e = exp_sub8(x + i, k, mv);
        if (y) store8(y, k, n, i, e);
        acc = _mm256_add_ps(acc, _mm256_and_ps(e, _mm256_castsi256_ps(k)));
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

CT_AVX2 float ct_vexp_sub_sum_avx2(float *y, const float *x, float m, int64_t n) { return exp_sub_sum(y, x, m, n); }

/* the sum alone (cross-entropy's log-sum-exp): the same bits, nothing stored */
CT_AVX2 float ct_vexp_sum_avx2(const float *x, float m, int64_t n) { return exp_sub_sum(NULL, x, m, n); }
