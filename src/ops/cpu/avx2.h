/* AVX2 + FMA helpers shared by the 8-lane kernels that run where the CPU has no AVX-512
 * (sgemm_avx2.c, gelu_simd.c, flash_avx2.c): functions carry CT_AVX2 so the files build for
 * any x86-64, and run only where ct_cpu_capability() >= CT_CPU_AVX2.
 *
 *   CT_AVX2 static void f(float *p) { __m256 r[8]; ...; ct_tr8(r); ... r[0] = ct_exp8(r[0]); } */
#ifndef CT_OPS_CPU_AVX2_H
#define CT_OPS_CPU_AVX2_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define CT_AVX2 __attribute__((target("avx2,fma")))

/* in-place transpose of 8 rows of 8 floats */
CT_AVX2 static inline __attribute__((always_inline)) void ct_tr8(__m256 r[8]) {
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; g++) { /* rows 4g..4g+3 */
        s[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
    }
}

/* ct_vexpf (ops/kmath.h) on N vectors of 8 lanes, in place: the operations of avx512.h's
 * ct_exp16, so the same bits as it and as ct_vexpf for every finite input. The N exponentials
 * run step by step side by side (N a constant, up to 8): one exponential is a chain of ~20
 * dependent operations, and the out-of-order core holds too few of them to overlap chains
 * that the program lists one after the other (GELU on 8 lanes ran 1.49 ns an element one
 * vector at a time, 0.87 four at a time on Zen 4). */
CT_AVX2 static inline __attribute__((always_inline)) void ct_exp8n(__m256 *v, int N) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f), big = _mm256_set1_ps(12582912.0f);
    static const float c[5] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
    __m256 xc[8], n[8], r[8], p[8];
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        xc[u] = _mm256_min_ps(_mm256_max_ps(v[u], lo), hi);
        n[u] = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc[u], _mm256_set1_ps(1.44269504088896341f)), big), big);
    }
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        r[u] = _mm256_fmadd_ps(n[u], _mm256_set1_ps(-0.693359375f), xc[u]);
        r[u] = _mm256_fmadd_ps(n[u], _mm256_set1_ps(2.12194440e-4f), r[u]);
        p[u] = _mm256_set1_ps(1.9875691500e-4f);
    }
#pragma GCC unroll 5
    for (int k = 0; k < 5; k++)
#pragma GCC unroll 8
        for (int u = 0; u < N; u++) p[u] = _mm256_fmadd_ps(p[u], r[u], _mm256_set1_ps(c[k]));
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        p[u] = _mm256_add_ps(_mm256_fmadd_ps(p[u], _mm256_mul_ps(r[u], r[u]), r[u]), _mm256_set1_ps(1.0f));
        __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n[u]), _mm256_set1_epi32(127)), 23);
        __m256 y = _mm256_mul_ps(p[u], _mm256_castsi256_ps(e));
        y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(v[u], lo, _CMP_LT_OQ));
        v[u] = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(v[u], hi, _CMP_GT_OQ));
    }
}
/* one vector */
CT_AVX2 static inline __attribute__((always_inline)) __m256 ct_exp8(__m256 x) {
    ct_exp8n(&x, 1);
    return x;
}

/* lanes [0, n) of 8 as a maskload / maskstore mask */
CT_AVX2 static inline __attribute__((always_inline)) __m256i ct_lanes8(int64_t n) {
    const int c = n <= 0 ? 0 : n >= 8 ? 8 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif
