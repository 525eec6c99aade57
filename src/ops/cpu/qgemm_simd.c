/* The u8 x s8 -> s32 micro-tiles of the int8 GEMM (layout in qgemm.h): QG_MR rows x QG_NB
 * columns over the whole K. Each function carries its own target attribute so the file
 * builds for any x86-64; ct_qkernel_available is the run-time check before calling one.
 *  - AVX-512 VNNI: vpdpbusd multiplies 4 u8 of A by 4 s8 of B and adds the four products to
 *    an int32 lane, exactly; 12 zmm accumulators (6 rows x 2 panels).
 *  - AVX2: vpmaddubsw (u8 x s8 pairs summed to s16, saturating) then vpmaddwd by 1 (pairs to
 *    s32). Exact while a pair stays inside int16: |a0 b0 + a1 b1| <= 2 * 128 * 128 = 32768
 *    only reaches +32768 with b = -128 and a = 128 on the negative side, so for A <= 128
 *    (reduce_range) nothing saturates — the same argument fbgemm's AVX2 path relies on. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops/cpu/qgemm.h"

#define CT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#include "ops/cpu/avx2.h"

static inline int32_t load4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* one row (GEMV and the last rows of a matrix: no work on padding rows) */
CT_VNNI static void row_vnni(int64_t kp, const uint8_t *a, const int8_t *b, int32_t *c) {
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    const int8_t *b0 = b, *b1 = b + kp * QG_NP;
    int64_t k = 0;
    /* two k-groups per step into separate accumulators: two independent dependency chains per panel */
    for (; k + 8 <= kp; k += 8) {
        __m512i a0 = _mm512_set1_epi32(load4(a + k)), a1 = _mm512_set1_epi32(load4(a + k + 4));
        acc[0] = _mm512_dpbusd_epi32(acc[0], a0, _mm512_load_si512((const void *)(b0 + k * QG_NP)));
        acc[1] = _mm512_dpbusd_epi32(acc[1], a0, _mm512_load_si512((const void *)(b1 + k * QG_NP)));
        acc[2] = _mm512_dpbusd_epi32(acc[2], a1, _mm512_load_si512((const void *)(b0 + (k + 4) * QG_NP)));
        acc[3] = _mm512_dpbusd_epi32(acc[3], a1, _mm512_load_si512((const void *)(b1 + (k + 4) * QG_NP)));
    }
    for (; k < kp; k += 4) {
        __m512i a0 = _mm512_set1_epi32(load4(a + k));
        acc[0] = _mm512_dpbusd_epi32(acc[0], a0, _mm512_load_si512((const void *)(b0 + k * QG_NP)));
        acc[1] = _mm512_dpbusd_epi32(acc[1], a0, _mm512_load_si512((const void *)(b1 + k * QG_NP)));
    }
    _mm512_storeu_si512((void *)c, _mm512_add_epi32(acc[0], acc[2]));
    _mm512_storeu_si512((void *)(c + QG_NP), _mm512_add_epi32(acc[1], acc[3]));
}

/* R rows (a compile-time constant at each call) over the whole K: the B slice read once for
 * all of them */
CT_VNNI static inline __attribute__((always_inline)) void rows_vnni(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b,
                                                                   int32_t *c, int64_t ldc, const int R) {
    __m512i acc[QG_MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    const int8_t *b0 = b, *b1 = b + kp * QG_NP;
    for (int64_t k = 0; k < kp; k += 4) {
        __m512i v0 = _mm512_load_si512((const void *)(b0 + k * QG_NP));
        __m512i v1 = _mm512_load_si512((const void *)(b1 + k * QG_NP));
#pragma GCC unroll 6
        for (int i = 0; i < R; i++) {
            __m512i ai = _mm512_set1_epi32(load4(a + i * lda + k));
            acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], ai, v0);
            acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], ai, v1);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < R; i++) {
        _mm512_storeu_si512((void *)(c + i * ldc), acc[i][0]);
        _mm512_storeu_si512((void *)(c + i * ldc + QG_NP), acc[i][1]);
    }
}

/* A tile's last rows (2..5) go through B together instead of row by row: with M = 16 the
 * row-by-row remainder read each B slice 4 more times (the weights stream from memory at
 * K = N = 4096). One row keeps row_vnni's two chains per panel. */
CT_VNNI void ct_qtile_vnni(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc, int mr) {
    _Static_assert(QG_MR == 6, "the cases below");
    switch (mr) {
    case 1: row_vnni(kp, a, b, c); return;
    case 2: rows_vnni(kp, a, lda, b, c, ldc, 2); return;
    case 3: rows_vnni(kp, a, lda, b, c, ldc, 3); return;
    case 4: rows_vnni(kp, a, lda, b, c, ldc, 4); return;
    case 5: rows_vnni(kp, a, lda, b, c, ldc, 5); return;
    default: rows_vnni(kp, a, lda, b, c, ldc, QG_MR); return;
    }
}

/* two rows at a time: 8 ymm accumulators (2 rows x 4 groups of 8 columns) fit the 16 registers */
CT_AVX2 static void tile2_avx2(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[2][4];
    for (int i = 0; i < 2; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = _mm256_setzero_si256();
    const int8_t *b0 = b, *b1 = b + kp * QG_NP;
    for (int64_t k = 0; k < kp; k += 4) {
        __m256i v[4] = {_mm256_load_si256((const void *)(b0 + k * QG_NP)), _mm256_load_si256((const void *)(b0 + k * QG_NP + 32)),
                        _mm256_load_si256((const void *)(b1 + k * QG_NP)), _mm256_load_si256((const void *)(b1 + k * QG_NP + 32))};
        for (int i = 0; i < 2; i++) {
            __m256i ai = _mm256_set1_epi32(load4(a + i * lda + k));
            for (int j = 0; j < 4; j++)
                acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(ai, v[j]), ones));
        }
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) _mm256_storeu_si256((void *)(c + i * ldc + 8 * j), acc[i][j]);
}

CT_AVX2 void ct_qtile_avx2(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc, int mr) {
    for (int i = 0; i < mr; i += 2) /* an odd last row computes one padding row as well */ tile2_avx2(kp, a + i * lda, lda, b, c + i * ldc, ldc);
}

/* ---- activation quantization (fbgemm's FindMinMax and QuantizeAvx2) ---- */

/* min(x, 0) and max(x, 0) over n floats (the range ChooseQuantizationParams widens to 0 anyway) */
CT_AVX2 void ct_qminmax_avx2(const float *x, int64_t n, float *lo, float *hi) {
    __m256 l = _mm256_setzero_ps(), h = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        l = _mm256_min_ps(l, v);
        h = _mm256_max_ps(h, v);
    }
    float ls[8], hs[8], a = 0.f, b = 0.f;
    _mm256_storeu_ps(ls, l);
    _mm256_storeu_ps(hs, h);
    for (int j = 0; j < 8; j++) { a = ls[j] < a ? ls[j] : a; b = hs[j] > b ? hs[j] : b; }
    for (; i < n; i++) { a = x[i] < a ? x[i] : a; b = x[i] > b ? x[i] : b; }
    *lo = a;
    *hi = b;
}

/* q = clamp(rint(min(x * inv, 2^31 - 128)) + zp, 0, 255), as QuantizeAvx2 (non-legacy):
 * _mm256_cvtps_epi32 rounds to nearest even; NaN becomes 2^31 - 128, hence 255, there too */
CT_AVX2 void ct_qrow_avx2(const float *x, int64_t n, float inv, int32_t zp, uint8_t *q) {
    const __m256 vinv = _mm256_set1_ps(inv), big = _mm256_set1_ps(2147483520.f);
    const __m256i vzp = _mm256_set1_epi32(zp), lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(255);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 t = _mm256_min_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), big);
        __m256i r = _mm256_add_epi32(_mm256_cvtps_epi32(t), vzp);
        r = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
        __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packus_epi16(p16, p16));
    }
    for (; i < n; i++) {
        float t = x[i] * inv;
        t = t < 2147483520.f ? t : 2147483520.f; /* NaN -> the bound, as _mm256_min_ps */
        int64_t r = (int64_t)rintf(t > -2147483520.f ? t : -2147483520.f) + zp;
        q[i] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
    }
}
