/* Fused attention, one head per call (see flash_attention.c for the algorithm): the drivers
 * (forward, backward) and the AVX-512 kernels; flash_avx2.c has the same kernels on 8 lanes.
 *
 * Why not the general sgemm: a tile product here is 64 x 64 x D with D = 32 or 64; packing
 * both operands for each of them costs as much as the product. Instead every operand is laid
 * out once per head so that all five tile products are the same register-blocked kernel,
 *   C[i][0:n] (+)= sum_k A(i, k) B[k][0:n]   (A broadcast, B rows as vectors),
 * reading A and B where they lie:
 *   - K, V, Q (times scale) and dO are transposed once per head (Kt [D][Tk], ...; K's and
 *     V's own rows as the score tiles' A, six rows apart a broadcast, cost the GPT's attention
 *     more than their transposes);
 *   - the score tile is kept transposed, St[c][r] (key c, query r) = Kt^T-panel x Qt-panel,
 *     so the online softmax runs down the columns: per query lane, no horizontal sums; causal,
 *     a tile on the diagonal skips the vectors of queries no key of a register block sees
 *     (-6% of the GPT's attention, forward and backward);
 *   - O += P V reads P as St (A(r, c) = St[c][r]), dQ += dS K likewise; dV += P^T dO and
 *     dK += dS^T Q read St's rows (A(c, r) = St[c][r]).
 * Every output element is summed by one thread in a fixed order (keys ascending for O and
 * dQ, query tiles ascending for dK, dV): the same bits for any thread count.
 * bf16 inputs (ct_flash_args.Qb) are widened per head into f32 rows in the scratch (V, and in
 * backward Q, K and the rounded dO, which the products read as rows), so the kernels above
 * run unchanged on the values autocast's f32 copies would hold. Where AMX is present a bf16
 * qkv goes to flash_amx.c instead (bf16 tile products), which shares the two tile steps
 * exported below (ct_flash_softmax_tile_, ct_flash_grad_tile_). */
#include "ops/cpu/flash_simd.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops/cpu/avx512.h" /* CT_AVX512, ct_exp16, ct_tr16 */
#include "ops/cpu/sgemm.h"     /* ct_sgemm_kernel_isa */
#include "ops/cpu/vmath.h"
#include "ops/kmath.h"

#define INL static inline __attribute__((always_inline))

enum { BR = 64, BC = 64, PAD = CT_FLASH_PAD }; /* query rows x keys per tile; PAD: reads past a tile's last row */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ld_of(int64_t T) { return (T + 15) / 16 * 16 + 16; } /* transposed row length */

/* C[0:mr][0:n] = (acc ? C : 0) + sum_{k < K} A[i*as + k*ak] B[k*ldb + 0:n], n <= 16 NV.
 * Rows mr..MR-1 are computed from whatever A holds there and dropped (callers pad A). */
CT_AVX512 INL void mk(int MR, int NV, int64_t as, int64_t ak, int64_t K, const float *restrict A, const float *restrict B,
                      int64_t ldb, float *restrict C, int64_t ldc, int mr, int n, bool acc) {
    __m512 c[16][4];
    __mmask16 m[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        int rem = n - 16 * v;
        m[v] = rem >= 16 ? (__mmask16)0xFFFF : rem <= 0 ? (__mmask16)0 : (__mmask16)((1u << rem) - 1);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[i][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm512_maskz_loadu_ps(m[v], B + 16 * v);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(A[i * as]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[i][v] = _mm512_fmadd_ps(a, b[v], c[i][v]);
        }
        A += ak;
        B += ldb;
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        if (i >= mr) break;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __m512 r = c[i][v];
            if (acc) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m[v], C + i * ldc + 16 * v));
            _mm512_mask_storeu_ps(C + i * ldc + 16 * v, m[v], r);
        }
    }
}

/* register block per vector count: MR x NV accumulators, MR dividing the 64-row tiles where it can */
#define MR_OF(NV) ((NV) == 1 ? 16 : (NV) == 4 ? 6 : 8)

static inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* C[M][N] (+)= A B with A(i, k) = At[k * lda + i] ("T") or A(i, k) = At[i * BR + k] ("N").
 * A is a P or dS tile (rows r see keys c where r >= lim0 + c, zeros elsewhere): the k range
 * of each row block stops (T: k = key) or starts (N: k = query row) where A turns 0. */
CT_AVX512 INL void gemm(bool tform, int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *B, int64_t ldb,
                        float *C, int64_t ldc, bool acc, int64_t lim0) {
    for (int64_t j = 0; j < N; j += 64) {
        int n = (int)min64(64, N - j), nv = (n + 15) / 16;
#define RUN(NV)                                                                                                            \
    for (int64_t i = 0; i < M; i += MR_OF(NV)) {                                                                           \
        int mr = (int)min64(MR_OF(NV), M - i);                                                                             \
        if (tform) {                                                                                                       \
            int64_t kk = clamp64(i + mr - lim0, 0, K);                                                                     \
            mk(MR_OF(NV), NV, 1, lda, kk, At + i, B + j, ldb, C + i * ldc + j, ldc, mr, n, acc);                           \
        } else {                                                                                                           \
            int64_t k0 = clamp64(lim0 + i, 0, K);                                                                          \
            mk(MR_OF(NV), NV, BR, 1, K - k0, At + i * BR + k0, B + k0 * ldb + j, ldb, C + i * ldc + j, ldc, mr, n, acc);   \
        }                                                                                                                  \
    }
        switch (nv) {
        case 1: RUN(1) break;
        case 2: RUN(2) break;
        case 3: RUN(3) break;
        default: RUN(4) break;
        }
#undef RUN
    }
}
/* the three uses as separate functions: each call site gets one copy of the kernels.
 * gemm_s, a transposed score tile: C[M][N] = sum_k At[k lda + i] B[k ldb + 0:N], C's row
 * stride BR. Causal (lim0 from lim_of): rows [i, i + mr) use the columns from lim0 + i on, so
 * the whole vectors left of that are not computed; the tile steps mask those lanes and read
 * them only masked (they hold whatever the buffer held). s_block: one row block, the vectors
 * from the first one some row of it uses; NVMAX, the tile's vector count, a constant. */
CT_AVX512 INL void s_block(int MR, int NVMAX, int64_t i, int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *B,
                           int64_t ldb, float *C, int64_t lim0) {
    const int v0 = (int)clamp64((lim0 + i) / 16, 0, NVMAX), mr = (int)min64(MR, M - i); /* lim0 + i < 16: 0 */
    const int n = (int)(N - 16 * v0);
    At += i;
    B += 16 * v0;
    C += i * BR + 16 * v0;
    switch (NVMAX - v0) {
    case 1: mk(MR, 1, 1, lda, K, At, B, ldb, C, BR, mr, n, false); break;
    case 2: if (NVMAX >= 2) mk(MR, 2, 1, lda, K, At, B, ldb, C, BR, mr, n, false); break;
    case 3: if (NVMAX >= 3) mk(MR, 3, 1, lda, K, At, B, ldb, C, BR, mr, n, false); break;
    case 4: if (NVMAX >= 4) mk(MR, 4, 1, lda, K, At, B, ldb, C, BR, mr, n, false); break;
    default: break; /* 0: no row of the block sees any column */
    }
}
CT_AVX512 static void gemm_s(int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *B, int64_t ldb, float *C,
                             int64_t lim0) {
#define RUN(NV)                                                                                                            \
    for (int64_t i = 0; i < M; i += MR_OF(NV)) s_block(MR_OF(NV), NV, i, M, N, K, At, lda, B, ldb, C, lim0);
    switch ((N + 15) / 16) {
    case 0: break;
    case 1: RUN(1) break;
    case 2: RUN(2) break;
    case 3: RUN(3) break;
    default: RUN(4) break;
    }
#undef RUN
}
/* acc false: C's first contribution, stored (the sums start at +0 and are never -0, so these
 * are the bits of adding them to a zeroed C) */
CT_AVX512 static void gemm_t(int64_t M, int64_t N, int64_t K, const float *At, const float *B, int64_t ldb, float *C, int64_t ldc,
                             int64_t lim0, bool acc) {
    gemm(true, M, N, K, At, BR, B, ldb, C, ldc, acc, lim0);
}
CT_AVX512 static void gemm_n(int64_t M, int64_t N, int64_t K, const float *A, const float *B, int64_t ldb, float *C, int64_t ldc,
                             int64_t lim0, bool acc) {
    gemm(false, M, N, K, A, 0, B, ldb, C, ldc, acc, lim0);
}

/* rows [t0, t1) of d columns at g (row stride ld) set to zero */
static void zero_rows(float *g, int64_t ld, int64_t t0, int64_t t1, int64_t d) {
    for (int64_t t = t0; g && t < t1; t++) memset(g + t * ld, 0, (size_t)d * sizeof(float));
}

/* dst[c * ldd + r] = scale src[r * lds + c] for r < rows (zeros up to ldd): one head's [rows][cols],
 * 16 x 16 blocks transposed in registers (a scalar loop took ~2% of the GPT's step: 4
 * transposes per head in backward, 2 in forward). Rows past `rows` are +0, as the memset
 * writes them. */
CT_AVX512 static void transpose(float *restrict dst, int64_t ldd, const float *restrict src, int64_t lds, int64_t rows, int64_t cols,
                                float scale) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t c0 = 0; c0 < cols; c0 += 16) {
            const int nc = (int)min64(16, cols - c0), nr = (int)min64(16, rows - r0);
            const __mmask16 m = nc == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nc) - 1);
            __m512 b[16];
            for (int i = 0; i < 16; i++)
                b[i] = i < nr ? _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + (r0 + i) * lds + c0), vs) : _mm512_setzero_ps();
            ct_tr16(b);
            for (int j = 0; j < nc; j++) _mm512_storeu_ps(dst + (c0 + j) * ldd + r0, b[j]);
        }
    const int64_t done = (rows + 15) / 16 * 16;
    for (int64_t c = 0; c < cols; c++) memset(dst + c * ldd + done, 0, (size_t)(ldd - done) * sizeof(float));
}

/* bf16 inputs: head h's rows of input i (0 q, 1 k, 2 v) widened into buf as [T][d]; f32
 * inputs: where they lie. *ld: their row length. */
static const float *rows_of(const ct_flash_args *a, int i, int64_t h, float *buf, int64_t *ld) {
    const ct_flash_layout *l = i == 0 ? &a->q : i == 1 ? &a->k : &a->v;
    const int64_t T = i ? a->Tk : a->Tq, d = i == 2 ? a->Dv : a->D, off = ct_flash_head(a, l, h);
    if (!a->Qb) {
        *ld = l->ld;
        return (i == 0 ? a->Q : i == 1 ? a->K : a->V) + off;
    }
    const uint16_t *s = (i == 0 ? a->Qb : i == 1 ? a->Kb : a->Vb) + off;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < d; c++) buf[t * d + c] = ct_k_bf16_to_f32(s[t * l->ld + c]);
    *ld = d;
    return buf;
}

/* floats of the per-head f32 copies of bf16 inputs and output: forward V, one of K / Q at a
 * time (for their transposes) and a tile of O; backward Q, K, V and the rounded dO */
static size_t bf16_work(const ct_flash_args *a, bool backward) {
    if (!a->Qb && !a->y16) return 0;
    const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv;
    if (!backward) return (size_t)(Tk * Dv + (Tq > Tk ? Tq : Tk) * D + BR * Dv);
    return (size_t)(Tq * D + Tk * D + Tk * Dv + Tq * Dv);
}

size_t ct_flash_simd_work(const ct_flash_args *a, bool backward) {
    size_t kq = (size_t)(a->D * ld_of(a->Tk) + a->D * ld_of(a->Tq)), tile = (size_t)BC * BR + PAD;
    if (!backward) return kq + tile + 16 + bf16_work(a, false);
    return kq + (size_t)(a->Dv * ld_of(a->Tk) + a->Dv * ld_of(a->Tq)) + 2 * tile + 16 + bf16_work(a, true);
}

/* row r of the query tile at i0 sees key c of the tile at j0 where r >= lim_of(.., c, ..) */
static inline int64_t lim_of(bool causal, int64_t j0, int64_t c, int64_t i0) { return causal ? j0 + c - i0 : -(int64_t)BC; }


/* lanes r of vector v of a transposed tile's row c that may be used: r >= lim0 + c (causal) */
CT_AVX512 INL __mmask16 seen(int64_t lim0, int64_t c, int v) {
    int64_t lim = lim0 + c - 16 * v;
    if (lim <= 0) return (__mmask16)0xFFFF;
    if (lim >= 16) return 0;
    return (__mmask16)(0xFFFFu << lim);
}

/* Online softmax over the tile ssc St[c][r] (c < cols; key c seen by row r where r >= lim0 + c):
 * m, l the running row max and sum, P = exp(S - m') in place, al[r] = exp(m - m') the factor
 * for O. Returns whether some al != 1. ssc: the scale not yet applied (1: exact, no change). */
CT_AVX512 bool ct_flash_softmax_tile_(float *St, int64_t cols, int64_t lim0, float *m, float *l, float *al, float ssc) {
    enum { NV = BR / 16 };
    __m512 mt[NV], mn[NV], sum[NV], vs = _mm512_set1_ps(ssc);
    for (int v = 0; v < NV; v++) mt[v] = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < cols; c++)
        for (int v = 0; v < NV; v++)
            mt[v] = _mm512_mask_max_ps(mt[v], seen(lim0, c, v), mt[v], _mm512_mul_ps(_mm512_loadu_ps(St + c * BR + 16 * v), vs));
    __mmask16 changed = 0;
    for (int v = 0; v < NV; v++) {
        __m512 mo = _mm512_loadu_ps(m + 16 * v);
        mn[v] = _mm512_max_ps(mo, mt[v]);
        /* a row with no key yet keeps -inf and the factor 1; the first tile's exp(-inf) = 0 */
        __mmask16 none = _mm512_cmp_ps_mask(mn[v], _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
        __m512 a = _mm512_mask_mov_ps(ct_exp16(_mm512_sub_ps(mo, mn[v])), none, _mm512_set1_ps(1.0f));
        changed |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
        _mm512_storeu_ps(al + 16 * v, a);
        _mm512_storeu_ps(m + 16 * v, mn[v]);
        sum[v] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < cols; c++) {
        __m512 p[NV];
        for (int v = 0; v < NV; v++) p[v] = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(St + c * BR + 16 * v), vs), mn[v]);
        ct_exp16n(p, NV); /* side by side: ct_exp16n says why */
        for (int v = 0; v < NV; v++) {
            p[v] = _mm512_maskz_mov_ps(seen(lim0, c, v), p[v]);
            _mm512_storeu_ps(St + c * BR + 16 * v, p[v]);
            sum[v] = _mm512_add_ps(sum[v], p[v]);
        }
    }
    for (int v = 0; v < NV; v++)
        _mm512_storeu_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * v), _mm512_loadu_ps(al + 16 * v), sum[v]));
    return changed != 0;
}

/* P = exp(ssc S - lse) into St and dS = P (dP - Dr) sc into dSt, over the seen lanes */
CT_AVX512 void ct_flash_grad_tile_(float *St, float *dSt, int64_t cols, int64_t lim0, const float *L, const float *R, float sc, float ssc) {
    enum { NV = BR / 16 };
    const __m512 vs = _mm512_set1_ps(ssc);
    for (int64_t c = 0; c < cols; c++) {
        __m512 p[NV];
        for (int v = 0; v < NV; v++) p[v] = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(St + c * BR + 16 * v), vs), _mm512_loadu_ps(L + 16 * v));
        ct_exp16n(p, NV);
        for (int v = 0; v < NV; v++) {
            float *s = St + c * BR + 16 * v, *d = dSt + c * BR + 16 * v;
            p[v] = _mm512_maskz_mov_ps(seen(lim0, c, v), p[v]);
            _mm512_storeu_ps(s, p[v]);
            /* masked: gemm_s leaves the lanes no row uses unwritten; their dS is +0 */
            __m512 dp = _mm512_sub_ps(_mm512_loadu_ps(d), _mm512_loadu_ps(R + 16 * v));
            _mm512_storeu_ps(d, _mm512_maskz_mul_ps(seen(lim0, c, v), _mm512_mul_ps(p[v], dp), _mm512_set1_ps(sc)));
        }
    }
}

static const ct_flash_kernels avx512 = {gemm_s, gemm_t, gemm_n, transpose, ct_flash_softmax_tile_, ct_flash_grad_tile_};
/* the kernels of the GEMM family that runs: the same bits either way */
static const ct_flash_kernels *kernels(void) {
    return ct_sgemm_kernel_isa() == CT_SGEMM_ISA_AVX512 ? &avx512 : &ct_flash_kernels_avx2_;
}

/* The two drivers below carry no target attribute: they run on either family's CPU. */
void ct_flash_simd_fwd_head(const ct_flash_args *a, int64_t h, void *Y, float *lse, float *work) {
    const ct_flash_kernels *ks = kernels();
    const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, ldk = ld_of(Tk), ldq = ld_of(Tq);
    const bool bf16 = a->y16; /* Y as bf16 */
    float *Kt = work, *Qt = Kt + D * ldk, *St = Qt + D * ldq;
    float *Vw = St + BC * BR + PAD, *tmp = Vw + Tk * Dv, *Ob = tmp + (Tq > Tk ? Tq : Tk) * D; /* bf16 only */
    memset(St, 0, ((size_t)BC * BR + PAD) * sizeof(float));
    int64_t lk, lq, lv, lo = a->o.ld; /* rows of K, Q, V (f32) and Y */
    const float *Kh = rows_of(a, 1, h, tmp, &lk);
    ks->transpose(Kt, ldk, Kh, lk, Tk, D, 1.0f);
    const float *Qh = rows_of(a, 0, h, tmp, &lq);
    ks->transpose(Qt, ldq, Qh, lq, Tq, D, a->scale);
    const float *Vh = rows_of(a, 2, h, Vw, &lv);
    const int64_t yh = ct_flash_head(a, &a->o, h);
    for (int64_t i0 = 0; i0 < Tq; i0 += BR) {
        const int64_t rows = min64(BR, Tq - i0), lO = bf16 ? Dv : lo;
        float *O = bf16 ? Ob : (float *)Y + yh + i0 * lo; /* bf16: the tile in f32, rounded at the end */
        float m[BR], l[BR], al[BR];
        for (int r = 0; r < BR; r++) { m[r] = -INFINITY; l[r] = 0; }
        for (int64_t r = 0; r < rows; r++) memset(O + r * lO, 0, (size_t)Dv * sizeof(float));
        const int64_t kv = a->causal ? min64(i0 + rows, Tk) : Tk;
        for (int64_t j0 = 0; j0 < kv; j0 += BC) {
            const int64_t cols = min64(BC, kv - j0);
            const int64_t lim0 = lim_of(a->causal, j0, 0, i0);
            ks->gemm_s(cols, rows, D, Kt + j0, ldk, Qt + i0, ldq, St, lim0); /* St = scale K Q^T */
            const bool rescale = ks->softmax(St, cols, lim0, m, l, al, 1.0f);
            if (rescale)
                for (int64_t r = 0; r < rows; r++)
                    if (al[r] != 1.0f) {
#pragma omp simd
                        for (int64_t e = 0; e < Dv; e++) O[r * lO + e] *= al[r];
                    }
            ks->gemm_t(rows, Dv, cols, St, Vh + j0 * lv, lv, O, lO, lim0, true); /* O += P V */
        }
        for (int64_t r = 0; r < rows; r++) {
            /* a row that sees no key (Tk == 0) stays 0, as in the plain version */
            float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
#pragma omp simd
            for (int64_t e = 0; e < Dv; e++) O[r * lO + e] *= inv;
            lse[h * Tq + i0 + r] = m[r] + logf(l[r]);
        }
        if (bf16) { /* rounded as ct_convert rounds autocast's f32 result */
            uint16_t *y = (uint16_t *)Y + yh + i0 * lo;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t e = 0; e < Dv; e++) y[r * lo + e] = ct_k_f32_to_bf16(O[r * Dv + e]);
        }
    }
}

void ct_flash_simd_bwd_head(const ct_flash_args *a, int64_t h, const float *dO, const float *lse, const float *Dr, float *dq,
                            float *dk, float *dv, bool fresh, float *work) {
    const ct_flash_kernels *ks = kernels();
    const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, ldk = ld_of(Tk), ldq = ld_of(Tq);
    /* rows of the gradients (Q's, K's, V's layouts) */
    const int64_t lgq = a->q.ld, lgk = a->k.ld, lgv = a->v.ld;
    const int64_t hq = ct_flash_head(a, &a->q, h), hk = ct_flash_head(a, &a->k, h), hv = ct_flash_head(a, &a->v, h);
    float *Kt = work, *Qt = Kt + D * ldk, *Vt = Qt + D * ldq, *dOt = Vt + Dv * ldk, *St = dOt + Dv * ldq;
    float *dSt = St + BC * BR + PAD;
    float *Qw = dSt + BC * BR + PAD, *Kw = Qw + Tq * D, *Vw = Kw + Tk * D, *dOw = Vw + Tk * Dv; /* bf16 only */
    memset(St, 0, 2 * ((size_t)BC * BR + PAD) * sizeof(float));
    int64_t lq, lk, lv, lo = a->o.ld; /* rows of Q, K, V (f32) and dO */
    const float *Qh = rows_of(a, 0, h, Qw, &lq), *Kh = rows_of(a, 1, h, Kw, &lk), *Vh = rows_of(a, 2, h, Vw, &lv);
    const float *dOh = dO + ct_flash_head(a, &a->o, h);
    if (a->y16) { /* dO of a bf16 output: rounded to bf16, as autocast rounds the gradient */
        for (int64_t t = 0; t < Tq; t++)
            for (int64_t c = 0; c < Dv; c++) dOw[t * Dv + c] = ct_k_round_bf16(dOh[t * lo + c]);
        dOh = dOw;
        lo = Dv;
    }
    ks->transpose(Kt, ldk, Kh, lk, Tk, D, 1.0f);
    ks->transpose(Qt, ldq, Qh, lq, Tq, D, a->scale);
    ks->transpose(Vt, ldk, Vh, lv, Tk, Dv, 1.0f);
    ks->transpose(dOt, ldq, dOh, lo, Tq, Dv, 1.0f);
    const float sc = a->scale;
    /* fresh: the gradients hold garbage; each tile's first product stores (dQ's at the first
     * key block, dK's and dV's at their first query block), rows no tile reaches are zeroed */
    if (fresh && Tk == 0) zero_rows(dq ? dq + hq : NULL, lgq, 0, Tq, D);
    for (int64_t j0 = 0; j0 < Tk; j0 += BC) {
        const int64_t cols = min64(BC, Tk - j0), first = a->causal ? j0 / BR * BR : 0;
        if (fresh && first >= Tq) {
            zero_rows(dk ? dk + hk : NULL, lgk, j0, j0 + cols, D);
            zero_rows(dv ? dv + hv : NULL, lgv, j0, j0 + cols, Dv);
        }
        for (int64_t i0 = first; i0 < Tq; i0 += BR) {
            const int64_t rows = min64(BR, Tq - i0);
            const bool akv = !(fresh && i0 == first), aq = !(fresh && j0 == 0);
            float L[BR], R[BR];
            for (int r = 0; r < BR; r++) {
                L[r] = r < rows ? lse[h * Tq + i0 + r] : 0.0f;
                R[r] = r < rows ? Dr[h * Tq + i0 + r] : 0.0f;
            }
            const int64_t lim0 = lim_of(a->causal, j0, 0, i0);
            ks->gemm_s(cols, rows, D, Kt + j0, ldk, Qt + i0, ldq, St, lim0);    /* scale S^T */
            ks->gemm_s(cols, rows, Dv, Vt + j0, ldk, dOt + i0, ldq, dSt, lim0); /* dP^T */
            ks->grad(St, dSt, cols, lim0, L, R, sc, 1.0f);
            if (dv) ks->gemm_n(cols, Dv, rows, St, dOh + i0 * lo, lo, dv + hv + j0 * lgv, lgv, lim0, akv); /* dV += P^T dO */
            if (dk) ks->gemm_n(cols, D, rows, dSt, Qh + i0 * lq, lq, dk + hk + j0 * lgk, lgk, lim0, akv);  /* dK += dS^T Q */
            if (dq) ks->gemm_t(rows, D, cols, dSt, Kh + j0 * lk, lk, dq + hq + i0 * lgq, lgq, lim0, aq);   /* dQ += dS K */
        }
    }
}
