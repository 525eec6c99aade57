/* AVX-512 helpers shared by the CPU kernels that pick AVX-512 at run time (sgemm.c,
 * conv_direct.c): functions carry CT_AVX512 so the files build without -mavx512f, and run
 * only where ct_sgemm_own_available() says the CPU has it.
 *
 *   CT_AVX512 static void f(float *p) { __m512 r[16]; ...; ct_tr16(r); ... }          */
#ifndef CT_OPS_CPU_AVX512_H
#define CT_OPS_CPU_AVX512_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define CT_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,fma")))

/* in-place transpose of 16 rows of 16 floats */
CT_AVX512 static inline void ct_tr16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
        __m512d a2 = _mm512_castps_pd(t[4 * i + 2]), a3 = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    /* r[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c */
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD);
        r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD);
    }
}

/* x (lanes m) rounded to bf16 and stored at p: ct_convert's bits (ct_k_f32_to_bf16: nearest even
 * on the integer bits, a NaN kept and made quiet). Not vcvtneps2bf16: it flushes subnormals. */
CT_AVX512 static inline __attribute__((always_inline)) void ct_store_bf16x16(uint16_t *p, __mmask16 m, __m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(r)); /* vpmovdw truncates: the low 16 bits */
}

/* ct_vexpf (ops/kmath.h) on N vectors of 16 lanes, in place, the same operations in the same
 * order (so the same bits for every finite input; ct_vexpf is built without fused
 * multiply-adds where it writes none, as the build contracts nothing: -std=c11). The N
 * exponentials run step by step side by side (N a constant, up to 8), as avx2.h's ct_exp8n
 * does and for the same reason: the core overlaps chains that lie side by side in the
 * program, not ~20-operation chains listed one after another. */
CT_AVX512 static inline __attribute__((always_inline)) void ct_exp16n(__m512 *v, int N) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f), big = _mm512_set1_ps(12582912.0f);
    static const float c[5] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
    __m512 xc[8], n[8], r[8], p[8];
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        xc[u] = _mm512_min_ps(_mm512_max_ps(v[u], lo), hi);
        n[u] = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(xc[u], _mm512_set1_ps(1.44269504088896341f)), big), big);
    }
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        r[u] = _mm512_fmadd_ps(n[u], _mm512_set1_ps(-0.693359375f), xc[u]);
        r[u] = _mm512_fmadd_ps(n[u], _mm512_set1_ps(2.12194440e-4f), r[u]);
        p[u] = _mm512_set1_ps(1.9875691500e-4f);
    }
#pragma GCC unroll 5
    for (int k = 0; k < 5; k++)
#pragma GCC unroll 8
        for (int u = 0; u < N; u++) p[u] = _mm512_fmadd_ps(p[u], r[u], _mm512_set1_ps(c[k]));
#pragma GCC unroll 8
    for (int u = 0; u < N; u++) {
        p[u] = _mm512_add_ps(_mm512_fmadd_ps(p[u], _mm512_mul_ps(r[u], r[u]), r[u]), _mm512_set1_ps(1.0f));
        __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n[u]), _mm512_set1_epi32(127)), 23);
        __m512 y = _mm512_mul_ps(p[u], _mm512_castsi512_ps(e));
        y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(v[u], lo, _CMP_LT_OQ), _mm512_setzero_ps());
        v[u] = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(v[u], hi, _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
    }
}
/* one vector */
CT_AVX512 static inline __attribute__((always_inline)) __m512 ct_exp16(__m512 x) {
    ct_exp16n(&x, 1);
    return x;
}

#endif
