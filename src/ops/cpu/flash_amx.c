/* AMX-BF16 fused attention for bf16 q, k, v (ct_flash_attention_qkv under bf16 autocast),
 * one head per call; the algorithm is flash_attention.c's, the tile steps (online softmax,
 * P and dS) flash_simd.c's, on the same transposed 64 x 64 score tile St[key][query].
 *
 * The numerics are those of PyTorch's CPU flash attention for bf16 inputs
 * (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): every tile product takes bf16
 * operands and sums in f32 (TDPBF16PS), the scale, the softmax and its row sums in f32, P
 * rounded to bf16 for P V, and in backward P and dS rounded to bf16 for dV, dK and dQ (dO is
 * bf16). The results thus differ from the f32 kernels by bf16 rounding.
 *
 * Layouts (sgemm_amx.h's packed operands), per head:
 *   S^T  [keys][queries] = K rows (A)  x Q^T (B)         forward and backward
 *   O^T  [Dv][queries]  += V^T (A)     x P^T (B, from St) forward; O rescaled per query lane
 *   dP^T [keys][queries] = V rows (A)  x dO^T (B)
 *   dV   [keys][Dv]     += P^T (A, St) x dO rows (B)
 *   dK   [keys][D]      += dS^T (A)    x Q rows (B)
 *   dQ^T [D][queries]   += K^T (A)     x dS^T (B)
 * Each output element is summed by one thread in a fixed order (key tiles ascending for O,
 * dQ; query tiles ascending for dK, dV): the same bits for any thread count. Padding (rows
 * past T, columns past D) is zeros, and P, dS are 0 on padded query lanes (lse = +inf). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops/cpu/avx512.h"
#include "ops/cpu/flash_simd.h"
#include "ops/cpu/sgemm_amx.h"

#define CT_AVX512BF16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16,fma")))

enum { BR = 64, BC = 64, TILE = BR * BC, PPAN = 16 * BC }; /* PPAN: floats of one 32-query panel of P^T pairs */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

typedef struct {
    int64_t Tqp, Tkp, Dp, Dvp; /* padded: T to tiles of 64, head dims to chunks of 32 */
} dims;
static dims dims_of(const ct_flash_args *a) { return (dims){up(a->Tq, BR), up(a->Tk, BC), up(a->D, 32), up(a->Dv, 32)}; }

/* sub-buffers of the scratch, each 64-byte aligned (the A packer stores aligned) */
static float *take(float **w, int64_t n) {
    float *p = *w;
    *w += up(n, 16);
    return p;
}
static float *aligned(float *w) { return (float *)(((uintptr_t)w + 63) & ~(uintptr_t)63); }

size_t ct_flash_amx_work(const ct_flash_args *a, bool backward) {
    const dims d = dims_of(a);
    const int64_t kq = d.Tkp * d.Dp / 2 + d.Tqp * d.Dp + 2 * TILE; /* K rows, Q^T, St and P or dS pairs */
    if (!backward) return (size_t)(kq + d.Dvp * d.Tkp / 2 + d.Dvp * BR + 8 * 16 + 16);
    return (size_t)(kq + d.Tkp * d.Dvp / 2 + 2 * d.Tqp * d.Dvp + d.Tqp * d.Dp + d.Dp * d.Tkp / 2 + 2 * TILE + BC * (d.Dvp + d.Dp) +
                    d.Dp * d.Tqp + 16 * 16 + 16);
}

/* B panels of 32 columns over n [0, np) (zeros past n), k [0, kc) padded to kcp: element
 * (k, n) at off + n brs + k bks of X (f32 rounded, or bf16 where h) */
static void pack_b(float *dst, const void *X, bool h, int64_t off, int64_t brs, int64_t bks, int64_t n, int64_t np, int64_t kc, int64_t kcp) {
    for (int64_t n0 = 0; n0 < np; n0 += 32) {
        float *p = dst + n0 * kcp;
        if (n0 >= n) memset(p, 0, (size_t)(16 * kcp) * sizeof(float));
        else ct_amx_pack_b_(p, X, h, off + n0 * brs, brs, bks, (int)min64(32, n - n0), kc, kcp);
    }
}

/* St[c][r] (c < BC, r < BR) as B panels of P^T pairs: panel p, pair row kp holds
 * (St[2kp][32p + j], St[2kp + 1][32p + j]), j < 32, rounded to bf16 */
CT_AVX512BF16 static void tile_pairs(float *dst, const float *St) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3,
                                        34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int p = 0; p < BR / 32; p++)
        for (int kp = 0; kp < BC / 2; kp++) {
            const float *r0 = St + 2 * kp * BR + 32 * p, *r1 = r0 + BR;
            __m512i x = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(r0 + 16), _mm512_loadu_ps(r0));
            __m512i y = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(r1 + 16), _mm512_loadu_ps(r1));
            float *d = dst + p * PPAN + 32 * kp;
            _mm512_storeu_si512((void *)d, _mm512_permutex2var_epi16(x, lo, y));
            _mm512_storeu_si512((void *)(d + 16), _mm512_permutex2var_epi16(x, hi, y));
        }
}

/* St = S^T for key tile j0 and query tile i0 from the packed K rows and Q^T */
static void scores(const dims *d, const uint16_t *pK, const float *pQ, int64_t j0, int64_t i0, float *St) {
    const int64_t nkd = d->Dp / 32;
    ct_amx_mm_(BC, BR, nkd, pK + j0 / 16 * nkd * 512, nkd * 512, pQ + i0 * d->Dp, 32 * d->Dp, St, BR, false);
}

/* K rows (A) and Q^T (B) of head h, both passes start from them */
static void pack_kq(const ct_flash_args *a, const dims *d, int64_t h, uint16_t *pK, float *pQ) {
    ct_amx_pack_a_(pK, a->Kb, true, ct_flash_head(a, &a->k, h), a->k.ld, 1, a->Tk, d->Tkp, a->D, d->Dp / 32);
    pack_b(pQ, a->Qb, true, ct_flash_head(a, &a->q, h), a->q.ld, 1, a->Tq, d->Tqp, a->D, d->Dp);
}

/* up to 16 values p[0], p[ld], ... (n of them; *m their lanes): a column of a transposed tile */
CT_AVX512 static inline __attribute__((always_inline)) __m512 column(const float *p, int64_t ld, int64_t n, __mmask16 *m) {
    *m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32((int)ld));
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), *m, idx, p, 4);
}

static inline int64_t lim_of(bool causal, int64_t j0, int64_t i0) { return causal ? j0 - i0 : -(int64_t)BC; }

CT_AVX512 void ct_flash_amx_fwd_head(const ct_flash_args *a, int64_t h, void *Y, float *lse, float *work) {
    const dims d = dims_of(a);
    const int64_t Tq = a->Tq, Tk = a->Tk, Dv = a->Dv, nkt = d.Tkp / 32, lo = a->o.ld, yh = ct_flash_head(a, &a->o, h);
    float *w = aligned(work);
    uint16_t *pK = (uint16_t *)take(&w, d.Tkp * d.Dp / 2), *pV = (uint16_t *)take(&w, d.Dvp * d.Tkp / 2);
    float *pQ = take(&w, d.Tqp * d.Dp), *St = take(&w, TILE), *pP = take(&w, TILE), *Ot = take(&w, d.Dvp * BR);
    ct_amx_tiles_load_();
    pack_kq(a, &d, h, pK, pQ);
    ct_amx_pack_a_(pV, a->Vb, true, ct_flash_head(a, &a->v, h), 1, a->v.ld, Dv, d.Dvp, Tk, nkt); /* V^T */
    for (int64_t i0 = 0; i0 < Tq; i0 += BR) {
        const int64_t rows = min64(BR, Tq - i0), kv = a->causal ? min64(i0 + rows, Tk) : Tk;
        _Alignas(64) float m[BR], l[BR], al[BR];
        for (int r = 0; r < BR; r++) m[r] = -INFINITY, l[r] = 0;
        for (int64_t j0 = 0; j0 < kv; j0 += BC) {
            const int64_t cols = min64(BC, kv - j0), lim0 = lim_of(a->causal, j0, i0);
            scores(&d, pK, pQ, j0, i0, St);
            const bool rescale = ct_flash_softmax_tile_(St, cols, lim0, m, l, al, a->scale);
            if (cols < BC) memset(St + cols * BR, 0, (size_t)((BC - cols) * BR) * sizeof(float)); /* keys past kv */
            tile_pairs(pP, St);
            if (rescale && j0) /* Ot holds nothing before the first key tile */
                for (int64_t e = 0; e < Dv; e++)
                    for (int v = 0; v < BR; v += 16)
                        _mm512_storeu_ps(Ot + e * BR + v, _mm512_mul_ps(_mm512_loadu_ps(Ot + e * BR + v), _mm512_load_ps(al + v)));
            ct_amx_mm_(d.Dvp, BR, BC / 32, pV + j0 / 32 * 512, nkt * 512, pP, PPAN, Ot, BR, j0 > 0); /* O^T += V^T P^T */
        }
        float inv[BR];
        for (int64_t r = 0; r < rows; r++) {
            /* a row that sees no key (Tk == 0) stays 0, as in the plain version */
            inv[r] = l[r] > 0 ? 1.0f / l[r] : 0.0f;
            lse[h * Tq + i0 + r] = m[r] + logf(l[r]);
        }
        for (int64_t r = 0; r < rows; r++) {
            const int64_t at = yh + (i0 + r) * lo;
            for (int64_t e = 0; e < Dv; e += 16) {
                __mmask16 mk;
                __m512 o = _mm512_mul_ps(column(Ot + e * BR + r, BR, Dv - e, &mk), _mm512_set1_ps(inv[r]));
                if (a->y16) ct_store_bf16x16((uint16_t *)Y + at + e, mk, o); /* ct_k_f32_to_bf16's rounding */
                else _mm512_mask_storeu_ps((float *)Y + at + e, mk, o);
            }
        }
    }
    ct_amx_tiles_release_();
}

/* g[t][0:n] (+)= acc[t][0:n] for t < rows: a tile's finished dK or dV rows into the gradient */
CT_AVX512 static void add_rows(float *g, int64_t ldg, const float *acc, int64_t lda, int64_t rows, int64_t n, bool set) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t e = 0; e < n; e += 16) {
            __mmask16 m = n - e >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - e)) - 1);
            __m512 x = _mm512_maskz_loadu_ps(m, acc + t * lda + e);
            if (!set) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, g + t * ldg + e));
            _mm512_mask_storeu_ps(g + t * ldg + e, m, x);
        }
}

CT_AVX512 void ct_flash_amx_bwd_head(const ct_flash_args *a, int64_t h, const float *dO, const float *lse, const float *Dr,
                                     float *dq, float *dk, float *dv, bool set, float *work) {
    const dims d = dims_of(a);
    const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, nkt = d.Tkp / 32, lo = a->o.ld;
    const int64_t hq = ct_flash_head(a, &a->q, h), hk = ct_flash_head(a, &a->k, h), hv = ct_flash_head(a, &a->v, h);
    const int64_t ho = ct_flash_head(a, &a->o, h);
    float *w = aligned(work);
    uint16_t *pK = (uint16_t *)take(&w, d.Tkp * d.Dp / 2), *pVa = (uint16_t *)take(&w, d.Tkp * d.Dvp / 2);
    uint16_t *pKt = (uint16_t *)take(&w, d.Dp * d.Tkp / 2), *pPa = (uint16_t *)take(&w, TILE / 2), *pdSa = (uint16_t *)take(&w, TILE / 2);
    float *pQ = take(&w, d.Tqp * d.Dp), *pdO = take(&w, d.Tqp * d.Dvp), *pdOr = take(&w, d.Tqp * d.Dvp), *pQr = take(&w, d.Tqp * d.Dp);
    float *St = take(&w, TILE), *dSt = take(&w, TILE), *pdSb = take(&w, TILE), *dVa = take(&w, BC * d.Dvp), *dKa = take(&w, BC * d.Dp);
    float *dQt = take(&w, d.Dp * d.Tqp);
    ct_amx_tiles_load_();
    pack_kq(a, &d, h, pK, pQ);
    ct_amx_pack_a_(pVa, a->Vb, true, hv, a->v.ld, 1, Tk, d.Tkp, Dv, d.Dvp / 32);                 /* V rows */
    if (dq) ct_amx_pack_a_(pKt, a->Kb, true, hk, 1, a->k.ld, D, d.Dp, Tk, nkt);                  /* K^T */
    pack_b(pdO, dO, false, ho, lo, 1, Tq, d.Tqp, Dv, d.Dvp);                                     /* dO^T */
    if (dv) pack_b(pdOr, dO, false, ho, 1, lo, Dv, d.Dvp, Tq, d.Tqp);                            /* dO rows */
    if (dk) pack_b(pQr, a->Qb, true, hq, 1, a->q.ld, D, d.Dp, Tq, d.Tqp);                        /* Q rows */
    for (int64_t j0 = 0; j0 < Tk; j0 += BC) {
        const int64_t cols = min64(BC, Tk - j0);
        const int64_t first = a->causal ? j0 / BR * BR : 0; /* dV, dK start from the first query tile's products */
        for (int64_t i0 = first; i0 < Tq; i0 += BR) {
            const int64_t rows = min64(BR, Tq - i0), lim0 = lim_of(a->causal, j0, i0);
            _Alignas(64) float L[BR], R[BR];
            for (int r = 0; r < BR; r++) {
                L[r] = r < rows ? lse[h * Tq + i0 + r] : INFINITY; /* P = 0 on padded lanes */
                R[r] = r < rows ? Dr[h * Tq + i0 + r] : 0.0f;
            }
            scores(&d, pK, pQ, j0, i0, St);
            ct_amx_mm_(BC, BR, d.Dvp / 32, pVa + j0 / 16 * (d.Dvp / 32) * 512, d.Dvp / 32 * 512, pdO + i0 * d.Dvp, 32 * d.Dvp, dSt, BR,
                       false); /* dP^T */
            ct_flash_grad_tile_(St, dSt, cols, lim0, L, R, a->scale, a->scale);
            if (cols < BC) memset(dSt + cols * BR, 0, (size_t)((BC - cols) * BR) * sizeof(float)); /* keys past Tk */
            if (dv) {                                                                              /* dV += P^T dO */
                ct_amx_pack_a_(pPa, St, false, 0, BR, 1, BC, BC, BR, BR / 32);
                ct_amx_mm_(BC, d.Dvp, BR / 32, pPa, BR / 32 * 512, pdOr + i0 / 2 * 32, 32 * d.Tqp, dVa, d.Dvp, i0 > first);
            }
            if (dk) { /* dK += dS^T Q */
                ct_amx_pack_a_(pdSa, dSt, false, 0, BR, 1, BC, BC, BR, BR / 32);
                ct_amx_mm_(BC, d.Dp, BR / 32, pdSa, BR / 32 * 512, pQr + i0 / 2 * 32, 32 * d.Tqp, dKa, d.Dp, i0 > first);
            }
            if (dq) { /* dQ^T += K^T dS^T */
                tile_pairs(pdSb, dSt);
                ct_amx_mm_(d.Dp, BR, BC / 32, pKt + j0 / 32 * 512, nkt * 512, pdSb, PPAN, dQt + i0, d.Tqp, j0 > 0); /* j0 = 0 visits every query tile */
            }
        }
        if (dv) add_rows(dv + hv + j0 * a->v.ld, a->v.ld, dVa, d.Dvp, cols, Dv, set);
        if (dk) add_rows(dk + hk + j0 * a->k.ld, a->k.ld, dKa, d.Dp, cols, D, set);
    }
    if (dq)
        for (int64_t r = 0; r < Tq; r++)
            for (int64_t e = 0; e < D; e += 16) {
                __mmask16 mk;
                __m512 g = column(dQt + e * d.Tqp + r, d.Tqp, D - e, &mk);
                float *o = dq + hq + r * a->q.ld + e;
                _mm512_mask_storeu_ps(o, mk, set ? g : _mm512_add_ps(g, _mm512_maskz_loadu_ps(mk, o)));
            }
    ct_amx_tiles_release_();
}
