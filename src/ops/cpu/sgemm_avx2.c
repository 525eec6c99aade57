/* AVX2 + FMA SGEMM, for CPUs without AVX-512 (AMD Zen 2 and 3, Intel's client cores): the
 * algorithm and cache blocking of sgemm.c (KC 256, MC 168, NC 2048: the same packing buffers),
 * with a 6 x 16 register tile: 12 ymm accumulators, two B vectors and one broadcast A value,
 * 15 of the 16 registers. Per k: 2 loads, 6 broadcasts, 12 FMAs.
 *
 * The same bits as the AVX-512 kernel. Every C element is one FMA chain over a K block, in k
 * order from zero, then alpha acc, + C or + beta C, as sgemm.c's store_tile does it. The tile's
 * shape decides which elements are computed side by side, never an element's arithmetic. So a
 * machine without AVX-512 trains to the bits of one with it (in bf16, those of the rounded
 * path, CTRAIN_GEMM_BF16=rounded).
 *
 * Packed layouts: A micro-panel [k][6], B micro-panel [k][16], zero padded at the M / N edges;
 * C edges are stored through lane masks. Rows contiguous in k are packed through 8 x 8
 * in-register transposes. Operands stored as bf16 are widened exactly while packed.
 * What this family does not do (implicit B, AMX, vdpbf16ps) has AVX-512 callers only. */
#include "ops/cpu/sgemm_job.h"
#include "ops/cpu/sgemm_amx.h" /* CT_SGEMM_PA_BYTES, CT_SGEMM_PB_BYTES: the pool's buffer sizes */

#include <immintrin.h>
#include <string.h>

#include "ctrain/core.h"
#include "ops/cpu/avx2.h"

#define MR CT_SGEMM_AVX2_MR
#define NR 16
#define KC CT_SGEMM_KC
#define MC (MR * 28)
#define NC (NR * 128)
_Static_assert(MC * KC * 4 == CT_SGEMM_PA_BYTES && NC * KC * 4 == CT_SGEMM_PB_BYTES, "the AVX-512 family's buffers");

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---------------------------------------------------------------- lanes ---- */

/* the first n (<= 8) of 8 elements of x from element i, the rest 0: f32, or bf16 (h) widened */
CT_AVX2 static inline __attribute__((always_inline)) __m256 load8(const void *x, bool h, int64_t i, int64_t n) {
    if (!h) return n >= 8 ? _mm256_loadu_ps((const float *)x + i) : _mm256_maskload_ps((const float *)x + i, ct_lanes8(n));
    __m128i w;
    if (n >= 8) w = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    else { /* no 16-bit masked load in AVX2: the edge through a copy */
        uint16_t t[8] = {0};
        if (n > 0) memcpy(t, (const uint16_t *)x + i, (size_t)n * 2);
        w = _mm_loadu_si128((const __m128i *)t);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16));
}

/* the first n lanes of v at p. Not vmaskmovps: AMD's Zen cores run its store form as a
 * microcoded sequence, and the A panels (6 of 8 lanes) take one per k. */
CT_AVX2 static inline __attribute__((always_inline)) void store8(float *p, int64_t n, __m256 v) {
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
        return;
    }
    __m128 x = _mm256_castps256_ps128(v);
    if (n >= 4) {
        _mm_storeu_ps(p, x);
        p += 4;
        n -= 4;
        x = _mm256_extractf128_ps(v, 1);
    }
    if (n >= 2) {
        _mm_storel_pi((__m64 *)p, x);
        p += 2;
        n -= 2;
        x = _mm_movehl_ps(x, x);
    }
    if (n >= 1) _mm_store_ss(p, x);
}

/* the first n lanes of x rounded to bf16 at p: avx512.h's ct_store_bf16x16 on 8 lanes (nearest
 * even on the integer bits; a NaN kept and made quiet) */
CT_AVX2 static inline __attribute__((always_inline)) void store_bf16x8(uint16_t *p, int64_t n, __m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    /* |u| > inf's bits: both sides below 2^31, so the signed compare is the unsigned one */
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    /* every lane < 2^16: the unsigned-saturating pack keeps it whole */
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    if (n >= 8) _mm_storeu_si128((__m128i *)p, h);
    else if (n > 0) {
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, h);
        memcpy(p, t, (size_t)n * 2);
    }
}

/* ---------------------------------------------------------------- micro-kernel ---- */

/* C tile (rows < mr, columns < nr) from the accumulators; mode, ci, cb as sgemm.c's
 * store_tile: 0: C = alpha acc; 1: alpha acc + C; 2: alpha acc + beta C, C read from ci
 * (row stride ldci); to cb as bf16 instead of C when cb */
CT_AVX2 static inline __attribute__((always_inline)) void store_tile(__m256 acc[MR][2], float *c, const float *ci, uint16_t *restrict cb,
                                                                    int64_t ldc, int64_t ldci, int64_t ldcb, int mr, int nr, float alpha,
                                                                    float beta, int mode) {
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        if (i >= mr) break;
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) {
            const int64_t rem = nr - 8 * v;
            if (rem <= 0) break;
            __m256 r = _mm256_mul_ps(acc[i][v], va);
            if (mode == 1) r = _mm256_add_ps(r, load8(ci + i * ldci + 8 * v, false, 0, rem));
            else if (mode == 2) r = _mm256_fmadd_ps(vb, load8(ci + i * ldci + 8 * v, false, 0, rem), r);
            if (cb) store_bf16x8(cb + i * ldcb + 8 * v, rem, r);
            else store8(c + i * ldc + 8 * v, rem, r);
        }
    }
}

/* R (a constant at each call) rows of the A panel against a B panel, kc deep */
CT_AVX2 static inline __attribute__((always_inline)) void kernel_r(int64_t kc, const float *restrict a, const float *restrict b, float *c,
                                                                  const float *ci, uint16_t *restrict cb, int64_t ldc, int64_t ldci,
                                                                  int64_t ldcb, int mr, int nr, float alpha, float beta, int mode,
                                                                  const int R) {
    __m256 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        /* the C tile's rows, read (or written) after the loop: in cache by then */
        _mm_prefetch((const char *)(ci + i * ldci), _MM_HINT_T0);
        _mm_prefetch((const char *)(ci + i * ldci + 15), _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
    store_tile(acc, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode);
}
CT_AVX2 static void kernel(int64_t kc, const float *restrict a, const float *restrict b, float *c, const float *ci, uint16_t *restrict cb,
                           int64_t ldc, int64_t ldci, int64_t ldcb, int mr, int nr, float alpha, float beta, int mode) {
    if (mr <= 2) kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, 2);
    else if (mr <= 4) kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, 4);
    else kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, MR);
}

/* ---------------------------------------------------------------- packing ---- */

/* rows [0, n) (n <= W; W = MR or NR) x k in [0, kc) of X, element (r, k) at x[r rs + k ks]
 * (f32, or bf16 when h), into dst[k][W] as f32, rows n..W-1 zero. Either rs == 1 (copied)
 * or ks == 1 (rows contiguous in k: transposed 8 x 8 through registers). */
CT_AVX2 static void pack_panel(float *restrict dst, const void *restrict x, bool h, int64_t rs, int64_t ks, int n, int W, int64_t kc) {
    if (rs == 1) {
        for (int64_t k = 0; k < kc; k++)
            for (int g = 0; g < W; g += 8) store8(dst + k * W + g, W - g, load8(x, h, k * ks + g, n - g));
        return;
    }
    for (int g = 0; g < W; g += 8) {
        const int rows = n - g < 8 ? n - g : 8; /* may be <= 0: a zero group */
        for (int64_t k0 = 0; k0 < kc; k0 += 8) {
            const int64_t kr = imin(8, kc - k0);
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = i < rows ? load8(x, h, (g + i) * rs + k0, kr) : _mm256_setzero_ps();
            ct_tr8(r);
            for (int64_t kk = 0; kk < kr; kk++) store8(dst + (k0 + kk) * W + g, W - g, r[kk]);
        }
    }
}

/* the copy case (rs == 1, f32) for a whole block: ceil(n / W) micro-panels at dst + p W kc,
 * each row k of x read once, left to right, for all of them (as sgemm.c's pack_block_rows) */
enum { PF = 4 }; /* rows ahead */
CT_AVX2 static void pack_block_rows(float *restrict dst, const float *restrict x, int64_t ks, int64_t n, int W, int64_t kc) {
    const int64_t npan = (n + W - 1) / W;
    for (int64_t k = 0; k < kc; k++) {
        const float *xr = x + k * ks;
        if (k + PF < kc) _mm_prefetch((const char *)(xr + PF * ks), _MM_HINT_T0);
        float *d = dst + k * W;
        if (W == MR && k + 1 < kc) {
            /* A panels (6 wide): one 8-wide store whose last 2 lanes land on row k + 1, which
             * the next k overwrites (a 6-lane store was 3 stores: a third of the step's packing) */
            for (int64_t p = 0; p < npan; p++, d += W * kc) _mm256_storeu_ps(d, load8(xr, false, p * W, n - p * W));
            continue;
        }
        for (int64_t p = 0; p < npan; p++, d += W * kc)
            for (int g = 0; g < W; g += 8) store8(d + g, W - g, load8(xr, false, p * W + g, n - p * W - g));
    }
}

/* sum[i] += x[k ks + i] for k ascending, i < n: one chain per i, the bits of a row-order loop
 * (sgemm.c's pack_block_rows_sum sums while it packs; here the sums take a second pass over
 * the block, which the packing just brought into the cache) */
CT_AVX2 static void rows_sum(const float *restrict x, int64_t ks, int64_t n, int64_t kc, float *restrict sum) {
    for (int64_t i = 0; i < n; i += 32) {
        const int64_t m = imin(32, n - i);
        __m256 acc[4];
        for (int v = 0; v < 4; v++) acc[v] = load8(sum, false, i + 8 * v, m - 8 * v);
        for (int64_t k = 0; k < kc; k++)
            for (int v = 0; v < 4; v++) acc[v] = _mm256_add_ps(acc[v], load8(x, false, k * ks + i + 8 * v, m - 8 * v));
        for (int v = 0; v < 4; v++) store8(sum + i + 8 * v, m - 8 * v, acc[v]);
    }
}

/* n rows x kc of an operand (element (r, k) at off + r rs + k ks of x) as micro-panels of
 * W rows at dst + p W kc, rounded to bf16 for the bf16 GEMM */
CT_AVX2 static void pack_block(int bf16, float *dst, const void *x, bool h, int64_t off, int64_t rs, int64_t ks, int64_t n, int W, int64_t kc) {
    if (rs == 1 && !h && !bf16) {
        pack_block_rows(dst, (const float *)x + off, ks, n, W, kc);
        return;
    }
    for (int64_t p = 0; p * W < n; p++) {
        float *d = dst + p * W * kc;
        const void *xp = h ? (const void *)((const uint16_t *)x + off + p * W * rs) : (const void *)((const float *)x + off + p * W * rs);
        pack_panel(d, xp, h, rs, ks, (int)imin(W, n - p * W), W, kc);
        if (bf16) ct_sgemm_round_bf16_(d, (int64_t)W * kc);
    }
}

/* ---------------------------------------------------------------- driver ---- */

CT_AVX2 void ct_sgemm_avx2_run_(const ct_sgemm_job_ *j) {
    CT_CHECK(!j->packb && (j->bf16 == 0 || j->bf16 == CT_GEMM_BF16_ROUNDED) && !j->aseg,
             "AVX2 GEMM: implicit B, segmented A or bf16 path %d (AVX-512 only)", j->bf16);
    /* op(A)(i, k) = A[i ars + k aks]; op(B)(k, n) = B[k bks + n brs] */
    const int64_t ars = j->ta ? 1 : j->lda, aks = j->ta ? j->lda : 1;
    const int64_t brs = j->tb ? j->ldb : 1, bks = j->tb ? 1 : j->ldb;
    for (int64_t jc = 0; jc < j->N; jc += NC) {
        const int64_t nc = imin(NC, j->N - jc), npan = (nc + NR - 1) / NR;
        for (int64_t pc = 0; pc < j->K; pc += KC) {
            const int64_t kc = imin(KC, j->K - pc);
            const int mode = pc > 0 ? 1 : j->beta == 0.0f ? 0 : j->beta == 1.0f ? 1 : 2;
            uint16_t *cb = pc + kc >= j->K ? j->Cb : NULL;
            pack_block(j->bf16, j->pb, j->B, j->bh, jc * brs + pc * bks, brs, bks, nc, NR, kc);
            for (int64_t ic = 0; ic < j->M; ic += MC) {
                const int64_t mc = imin(MC, j->M - ic), mpan = (mc + MR - 1) / MR;
                pack_block(j->bf16, j->pa, j->A, j->ah, ic * ars + pc * aks, ars, aks, mc, MR, kc);
                if (ars == 1 && !j->ah && !j->bf16 && j->asum && jc == 0)
                    rows_sum((const float *)j->A + ic + pc * aks, aks, mc, kc, j->asum + ic);
                for (int64_t jr = 0; jr < npan; jr++) /* B micro-panel stays in L1, A panels stream from L2 */
                    for (int64_t ir = 0; ir < mpan; ir++) {
                        const int64_t i0 = ic + ir * MR, n0 = jc + jr * NR;
                        uint16_t *cbt = cb ? cb + i0 * j->ldcb + n0 : NULL;
                        float *c = j->C + i0 * j->ldc + n0;
                        const float *ci = pc == 0 && j->Ci ? j->Ci + i0 * j->ldci + n0 : c;
                        const int64_t ldci = pc == 0 && j->Ci ? j->ldci : j->ldc;
                        kernel(kc, j->pa + ir * MR * kc, j->pb + jr * NR * kc, c, ci, cbt, j->ldc, ldci, j->ldcb,
                               (int)imin(MR, j->M - i0), (int)imin(NR, j->N - n0), j->alpha, j->beta, mode);
                    }
            }
        }
    }
}
