/* Vectorisable float exp and tanh for the CPU kernels. libm's expf/tanhf are calls gcc
 * cannot vectorise without -ffast-math; these are branch-free (selects only) Cephes-style
 * polynomials, accurate to ~2 ulp, so loops over them vectorise under `omp simd` and stay
 * within f32 rounding of PyTorch (which uses Sleef's vector versions). */
#ifndef CT_OPS_CPU_VMATH_H
#define CT_OPS_CPU_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ct_vexpf(float x) {
    float xc = x < -87.33654f ? -87.33654f : x; /* 2^-126: keep the exponent field normal */
    xc = xc > 88.72283f ? 88.72283f : xc;
    float n = floorf(xc * 1.44269504088896341f + 0.5f);
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f; /* ln2 split in two: exact n*ln2_hi */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    float y = p * s;
    y = x < -87.33654f ? 0.0f : y;   /* underflow: 0 (PyTorch gives a denormal below 1e-38) */
    y = x > 88.72283f ? INFINITY : y;
    return x != x ? x : y;
}

static inline float ct_vtanhf(float x) {
    float a = fabsf(x);
    /* small |x|: odd polynomial (no cancellation); large: 1 - 2/(e^{2|x|} + 1) */
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
                   3.33332819422e-1f) * z * x + x;
    float big = 1.0f - 2.0f / (ct_vexpf(2.0f * a) + 1.0f);
    big = x < 0 ? -big : big;
    return a < 0.625f ? small : big;
}

/* y[j] = exp(x[j] - m); returns the sum of y. y may be x (in place). */
static inline float ct_vexp_sub_sum(float *y, const float *x, float m, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        y[j] = ct_vexpf(x[j] - m);
        s += y[j];
    }
    return s;
}
/* sum_j exp(x[j] - m) without storing. */
static inline float ct_vexp_sum(const float *restrict x, float m, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += ct_vexpf(x[j] - m);
    return s;
}
#endif
