/* Row loops over the vectorisable exp of ops/kmath.h for the CPU kernels. */
#ifndef CT_OPS_CPU_VMATH_H
#define CT_OPS_CPU_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/kmath.h" /* ct_vexpf, ct_vtanhf, ct_vnormcdf: shared with the CUDA kernels */
#include "ops/cpu/gelu_simd.h" /* the 8-lane loops */

/* gcc leaves the ct_vexpf loops below scalar (its selects may trap, so it does not if-convert
 * them): on an AMD Zen 3 plain attention's softmax was 7% of a Llama step. Builds without
 * AVX-512 take the 8-lane loops of gelu_simd.c where the CPU has AVX2 and FMA. AVX-512 builds
 * keep the loops below, whose bits the training recording (tests/fixtures/train/golden.txt)
 * holds. */
#if defined(__AVX2__) && !defined(__AVX512F__)
#define CT_VMATH_8LANES() ct_gelu_avx2_available()
#else
#define CT_VMATH_8LANES() 0
#endif

/* y[j] = exp(x[j] - m); returns the sum of y. y may be x (in place). On 8 lanes the sum is
 * made of 8 partial sums. */
static inline float ct_vexp_sub_sum(float *y, const float *x, float m, int64_t n) {
    if (CT_VMATH_8LANES()) return ct_vexp_sub_sum_avx2(y, x, m, n);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        y[j] = ct_vexpf(x[j] - m);
        s += y[j];
    }
    return s;
}
/* y[j] = exp(x[j] - m), y may be x: elementwise, so the same bits on every path */
static inline void ct_vexp_sub(float *y, const float *x, float m, int64_t n) {
    if (CT_VMATH_8LANES()) {
        ct_vexp_sub_avx2(y, x, m, n);
        return;
    }
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j] = ct_vexpf(x[j] - m);
}
/* sum_j exp(x[j] - m) without storing (a row of the logits: cross-entropy's log-sum-exp) */
static inline float ct_vexp_sum(const float *restrict x, float m, int64_t n) {
    if (CT_VMATH_8LANES()) return ct_vexp_sum_avx2(x, m, n);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += ct_vexpf(x[j] - m);
    return s;
}
#endif
