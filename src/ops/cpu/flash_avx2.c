/* The fused attention's tile kernels on 8 lanes (AVX2 + FMA), for CPUs without AVX-512
 * (AMD Zen 2 and 3, Intel's client cores). flash_simd.c drives them as it drives its AVX-512
 * ones; see there for the layouts (operands transposed once per head, the score tile kept
 * transposed as St[key][query]) and flash_attention.c for the algorithm.
 *
 * Same bits as the AVX-512 kernels: every output element is one FMA chain over k in order,
 * from +0, then + C where it accumulates; the softmax and gradient steps are the same
 * operations per lane (ct_exp8 is ct_exp16's). Only which elements sit side by side in a
 * register changes. Before these kernels the path without AVX-512 ran the tiles through the
 * general sgemm, whose packing cost as much as a 64 x 64 x 32 product: 20% of the GPT's step.
 *
 * Register blocks: 6 rows x 16 columns (12 accumulators, two B vectors, one broadcast A:
 * 15 of the 16 ymm registers, the GEMM family's tile) or 12 x 8 at an 8-wide edge. Built with
 * -mno-avx512f (Makefile), so it is the code a CPU without AVX-512 runs. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops/cpu/avx2.h"
#include "ops/cpu/flash_simd.h"

#define INL static inline __attribute__((always_inline))

enum { BR = 64, BC = 64 }; /* flash_simd.c's tile */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* C[0:mr][0:n] = (acc ? C : 0) + sum_{k < K} A[i*as + k*ak] B[k*ldb + 0:n], n <= 8 NV; full:
 * n == 8 NV (plain loads and stores). Rows mr..MR-1 are computed from whatever A holds there
 * and dropped (callers pad A). */
CT_AVX2 INL void mk(int MR, int NV, bool full, int64_t as, int64_t ak, int64_t K, const float *restrict A, const float *restrict B,
                    int64_t ldb, float *restrict C, int64_t ldc, int mr, int n, bool acc) {
    __m256 c[12][2];
    __m256i m[2];
    for (int v = 0; v < NV; v++) m[v] = ct_lanes8(n - 8 * v);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) c[i][v] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 b[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) b[v] = full ? _mm256_loadu_ps(B + 8 * v) : _mm256_maskload_ps(B + 8 * v, m[v]);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(A + i * as);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) c[i][v] = _mm256_fmadd_ps(a, b[v], c[i][v]);
        }
        A += ak;
        B += ldb;
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        if (i >= mr) break;
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *p = C + i * ldc + 8 * v;
            __m256 r = c[i][v];
            if (full) {
                if (acc) r = _mm256_add_ps(r, _mm256_loadu_ps(p));
                _mm256_storeu_ps(p, r);
            } else {
                if (acc) r = _mm256_add_ps(r, _mm256_maskload_ps(p, m[v]));
                _mm256_maskstore_ps(p, m[v], r);
            }
        }
    }
}

/* C[M][N] (+)= A B with A(i, k) = At[k * lda + i] ("T") or A(i, k) = At[i * BR + k] ("N"), in
 * column blocks of 16 (the last one 8 where it fits); as flash_simd.c's gemm, the k range
 * of each row block stops (T) or starts (N) where the tile's rows turn 0. */
CT_AVX2 INL void gemm(bool tform, int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *B, int64_t ldb, float *C,
                      int64_t ldc, bool acc, int64_t lim0) {
    for (int64_t j = 0; j < N; j += 16) {
        const int n = (int)min64(16, N - j);
#define RUN(MR, NV, FULL)                                                                                                  \
    for (int64_t i = 0; i < M; i += MR) {                                                                                  \
        const int mr = (int)min64(MR, M - i);                                                                              \
        if (tform) {                                                                                                       \
            const int64_t kk = clamp64(i + mr - lim0, 0, K);                                                               \
            mk(MR, NV, FULL, 1, lda, kk, At + i, B + j, ldb, C + i * ldc + j, ldc, mr, n, acc);                            \
        } else {                                                                                                           \
            const int64_t k0 = clamp64(lim0 + i, 0, K);                                                                    \
            mk(MR, NV, FULL, BR, 1, K - k0, At + i * BR + k0, B + k0 * ldb + j, ldb, C + i * ldc + j, ldc, mr, n, acc);    \
        }                                                                                                                  \
    }
        if (n == 16) RUN(6, 2, true)
        else if (n == 8) RUN(12, 1, true)
        else if (n > 8) RUN(6, 2, false)
        else RUN(12, 1, false)
#undef RUN
    }
}
/* flash_simd.c's gemm_s on 8 lanes; causal, a row block skips the 16-column blocks no row of
 * it sees */
CT_AVX2 INL void s_rows(int MR, int NV, bool full, int64_t M, int64_t j, int n, int64_t K, const float *At, int64_t lda, const float *B,
                        int64_t ldb, float *C, int64_t lim0) {
    for (int64_t i = 0; i < M; i += MR)
        if (j + 16 > lim0 + i) mk(MR, NV, full, 1, lda, K, At + i, B + j, ldb, C + i * BR + j, BR, (int)min64(MR, M - i), n, false);
}
CT_AVX2 static void gemm_s(int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *B, int64_t ldb, float *C, int64_t lim0) {
    for (int64_t j = 0; j < N; j += 16) {
        const int n = (int)min64(16, N - j);
        if (n == 16) s_rows(6, 2, true, M, j, n, K, At, lda, B, ldb, C, lim0);
        else if (n == 8) s_rows(12, 1, true, M, j, n, K, At, lda, B, ldb, C, lim0);
        else if (n > 8) s_rows(6, 2, false, M, j, n, K, At, lda, B, ldb, C, lim0);
        else s_rows(12, 1, false, M, j, n, K, At, lda, B, ldb, C, lim0);
    }
}
CT_AVX2 static void gemm_t(int64_t M, int64_t N, int64_t K, const float *At, const float *B, int64_t ldb, float *C, int64_t ldc, int64_t lim0,
                           bool acc) {
    gemm(true, M, N, K, At, BR, B, ldb, C, ldc, acc, lim0);
}
CT_AVX2 static void gemm_n(int64_t M, int64_t N, int64_t K, const float *A, const float *B, int64_t ldb, float *C, int64_t ldc, int64_t lim0,
                           bool acc) {
    gemm(false, M, N, K, A, 0, B, ldb, C, ldc, acc, lim0);
}

/* dst[c * ldd + r] = scale src[r * lds + c] for r < rows (zeros up to ldd), 8 x 8 blocks
 * transposed in registers */
CT_AVX2 static void transpose(float *restrict dst, int64_t ldd, const float *restrict src, int64_t lds, int64_t rows, int64_t cols,
                              float scale) {
    const __m256 vs = _mm256_set1_ps(scale);
    for (int64_t r0 = 0; r0 < rows; r0 += 8)
        for (int64_t c0 = 0; c0 < cols; c0 += 8) {
            const int nc = (int)min64(8, cols - c0), nr = (int)min64(8, rows - r0);
            const __m256i m = ct_lanes8(nc);
            __m256 b[8];
            for (int i = 0; i < 8; i++)
                b[i] = i < nr ? _mm256_mul_ps(nc == 8 ? _mm256_loadu_ps(src + (r0 + i) * lds + c0) : _mm256_maskload_ps(src + (r0 + i) * lds + c0, m), vs)
                              : _mm256_setzero_ps();
            ct_tr8(b);
            for (int j = 0; j < nc; j++) _mm256_storeu_ps(dst + (c0 + j) * ldd + r0, b[j]);
        }
    const int64_t done = (rows + 7) / 8 * 8;
    for (int64_t c = 0; c < cols; c++) memset(dst + c * ldd + done, 0, (size_t)(ldd - done) * sizeof(float));
}

/* lanes of vector v of a transposed tile's row c that row r may not use (r < lim0 + c): all
 * ones where masked */
CT_AVX2 INL __m256 unseen(int64_t lim0, int64_t c, int v) {
    const int64_t lim = clamp64(lim0 + c - 8 * v, 0, 8);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)lim), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* ct_flash_softmax_tile_ (flash_simd.c) on 8 lanes: per query lane, the max over the seen keys,
 * then P = exp(ssc S - m') summed over keys in ascending order. One vector of rows at a time
 * (the AVX-512 loop keeps all four in registers; 8 of 8 would not fit in 16). */
CT_AVX2 static bool softmax(float *St, int64_t cols, int64_t lim0, float *m, float *l, float *al, float ssc) {
    const __m256 vs = _mm256_set1_ps(ssc), ninf = _mm256_set1_ps(-INFINITY), one = _mm256_set1_ps(1.0f);
    int changed = 0;
    for (int v = 0; v < BR / 8; v++) {
        __m256 mt = ninf;
        for (int64_t c = 0; c < cols; c++)
            mt = _mm256_max_ps(mt, _mm256_blendv_ps(_mm256_mul_ps(_mm256_loadu_ps(St + c * BR + 8 * v), vs), ninf, unseen(lim0, c, v)));
        const __m256 mo = _mm256_loadu_ps(m + 8 * v), mn = _mm256_max_ps(mo, mt);
        /* a row with no key yet keeps -inf and the factor 1; the first tile's exp(-inf) = 0 */
        const __m256 a = _mm256_blendv_ps(ct_exp8(_mm256_sub_ps(mo, mn)), one, _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ));
        changed |= _mm256_movemask_ps(_mm256_cmp_ps(a, one, _CMP_NEQ_UQ));
        _mm256_storeu_ps(al + 8 * v, a);
        _mm256_storeu_ps(m + 8 * v, mn);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t c0 = 0; c0 < cols; c0 += 4) { /* 4 keys' exponentials side by side (ct_exp8n says why) */
            const int n = (int)min64(4, cols - c0);
            __m256 p[4];
            for (int u = 0; u < 4; u++) p[u] = u < n ? _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(St + (c0 + u) * BR + 8 * v), vs), mn) : mn;
            ct_exp8n(p, 4);
            for (int u = 0; u < n; u++) {
                p[u] = _mm256_blendv_ps(p[u], _mm256_setzero_ps(), unseen(lim0, c0 + u, v));
                _mm256_storeu_ps(St + (c0 + u) * BR + 8 * v, p[u]);
                sum = _mm256_add_ps(sum, p[u]);
            }
        }
        _mm256_storeu_ps(l + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(l + 8 * v), a, sum));
    }
    return changed != 0;
}

/* ct_flash_grad_tile_ on 8 lanes: P = exp(ssc S - lse) into St, dS = P (dP - Dr) sc into dSt */
CT_AVX2 static void grad(float *St, float *dSt, int64_t cols, int64_t lim0, const float *L, const float *R, float sc, float ssc) {
    const __m256 vs = _mm256_set1_ps(ssc), vsc = _mm256_set1_ps(sc);
    for (int64_t c = 0; c < cols; c++)
        for (int v0 = 0; v0 < BR / 8; v0 += 4) { /* 4 exponentials side by side (ct_exp8n says why) */
            __m256 p[4];
            for (int u = 0; u < 4; u++)
                p[u] = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(St + c * BR + 8 * (v0 + u)), vs), _mm256_loadu_ps(L + 8 * (v0 + u)));
            ct_exp8n(p, 4);
            for (int u = 0; u < 4; u++) {
                const int v = v0 + u;
                float *s = St + c * BR + 8 * v, *d = dSt + c * BR + 8 * v;
                p[u] = _mm256_blendv_ps(p[u], _mm256_setzero_ps(), unseen(lim0, c, v));
                _mm256_storeu_ps(s, p[u]);
                const __m256 dp = _mm256_sub_ps(_mm256_loadu_ps(d), _mm256_loadu_ps(R + 8 * v));
                /* masked: gemm_s leaves the lanes no row uses unwritten; their dS is +0 */
                _mm256_storeu_ps(d, _mm256_blendv_ps(_mm256_mul_ps(_mm256_mul_ps(p[u], dp), vsc), _mm256_setzero_ps(), unseen(lim0, c, v)));
            }
        }
}

const ct_flash_kernels ct_flash_kernels_avx2_ = {gemm_s, gemm_t, gemm_n, transpose, softmax, grad};
