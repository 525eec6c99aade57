/* Row loops over the vectorisable exp of ops/kmath.h for the CPU kernels. */
#ifndef CT_OPS_CPU_VMATH_H
#define CT_OPS_CPU_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/kmath.h" /* ct_vexpf, ct_vtanhf, ct_vnormcdf: shared with the CUDA kernels */
#include "ops/cpu/gelu_simd.h" /* the 8-lane loops */

/* y[j] = exp(x[j] - m); returns the sum of y. y may be x (in place). */
static inline float ct_vexp_sub_sum(float *y, const float *x, float m, int64_t n) {
    float s = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
    /* gcc leaves this loop scalar (ct_vexpf's selects may trap, so it does not if-convert
     * them): on an AMD Zen 3 plain attention's softmax was 7% of a Llama step. Written out on
     * 8 lanes there, the sum made of 8 partial sums. AVX-512 builds keep the loop below,
     * whose bits the training recording (tests/fixtures/train/golden.txt) holds. */
    if (ct_gelu_avx2_available()) return ct_vexp_sub_sum_avx2(y, x, m, n);
#endif
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        y[j] = ct_vexpf(x[j] - m);
        s += y[j];
    }
    return s;
}
/* y[j] = exp(x[j] - m), y may be x: elementwise, so the same bits on every path */
static inline void ct_vexp_sub(float *y, const float *x, float m, int64_t n) {
#if defined(__AVX2__) && !defined(__AVX512F__)
    if (ct_gelu_avx2_available()) { /* gcc leaves the loop below scalar, as above */
        ct_vexp_sub_avx2(y, x, m, n);
        return;
    }
#endif
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j] = ct_vexpf(x[j] - m);
}
/* sum_j exp(x[j] - m) without storing. */
static inline float ct_vexp_sum(const float *restrict x, float m, int64_t n) {
    float s = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
    /* scalar under gcc as ct_vexp_sub_sum's loop; a row of the logits (vocabulary wide) each */
    if (ct_gelu_avx2_available()) return ct_vexp_sum_avx2(x, m, n);
#endif
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += ct_vexpf(x[j] - m);
    return s;
}
#endif
