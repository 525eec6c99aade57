/* AVX-512 SGEMM, BLIS/GotoBLAS style (see sgemm.h for the contract).
 *
 *   for jc in N by NC:                 B panel  KC x NC  packed (L3; NC = 2048)
 *     for pc in K by KC:               K blocks in order (KC = 256)
 *       pack B into NR-wide micro-panels [k][NR]
 *       for ic in M by MC:             A block  MC x KC  packed (L2; MC = 168)
 *         for jr, for ir:              B micro-panel (KC x NR, 32 KiB) stays in L1
 *           MR x NR register tile (14 x 32: 28 zmm accumulators) += A micro-panel . B micro-panel
 *
 * Packed layouts: A micro-panel [k][MR], B micro-panel [k][NR], zero padded at the M / N
 * edges; C edges are stored with row bounds and lane masks. Transposed sources (A not
 * transposed, B transposed: rows contiguous in k) are packed through 16x16 in-register
 * transposes. The micro-kernel loads two B vectors and broadcasts 14 A values per k.
 *
 * Threads: take ranges of whole micro-panels of the larger of M and N in turn (a shared
 * counter) and run the serial algorithm on each with their own packing buffers (no barriers). K is
 * never split and the blocking does not depend on the thread count, so every C element is
 * computed by the same instructions in the same order: bit-identical for any thread count.
 * Packing buffers come from a pool reserved ahead (see "packing buffers" below): a GEMM
 * never allocates. Kernel functions carry
 * target("avx512f,avx512vl,avx512bw,fma") so the file builds without -mavx512f;
 * ct_sgemm_own_available is the runtime check (AVX-512 F and BW: every AVX-512 CPU but the
 * Xeon Phi). The bf16 GEMM also reads operands stored as bf16 (ct_sgemm_bf16_ex): the packers
 * widen them to f32 in registers, so the packed panels, hence the bits, are those of f32
 * copies. And it can write a bf16 result (ct_sgemm_bf16_out): the last K block's store rounds
 * alpha acc + C to bf16 into a second output, the earlier blocks' partial sums stay in C. */
#include "ops/cpu/sgemm.h"
#include "ops/cpu/sgemm_amx.h"
#include "ops/cpu/sgemm_job.h"
#include "ctrain/config.h"
#include "ctrain/ops.h"

#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernel.h"
#include "ops/cpu/avx512.h"


/* micro-tile and cache blocking (L1 48 KiB, L2 1 MiB on Zen 5) */
#define MR 14
#define NV 2
#define NR (16 * NV)
#define KC 256
_Static_assert(NR == CT_SGEMM_NR && KC == CT_SGEMM_KC, "sgemm.h publishes the B micro-panel shape");
#define MC (MR * 12)
#define NC (NR * 64)
_Static_assert(MC * KC * 4 == CT_SGEMM_PA_BYTES && NC * KC * 4 == CT_SGEMM_PB_BYTES, "sgemm_amx.h knows the buffers");

/* AVX-512 F and BW, unless CTRAIN_CPU_CAPABILITY caps it (every AVX-512 kernel of ctrain
 * asks this) */
bool ct_sgemm_own_available(void) { return ct_cpu_capability() == CT_CPU_AVX512; }

/* CTRAIN_GEMM (auto|openblas|avx2), read once per process: 0 auto, 1 openblas, 2 avx2 */
static int gemm_choice(void) {
    static int c = -1;
    int v = __atomic_load_n(&c, __ATOMIC_RELAXED);
    if (v < 0) {
        v = ct_config_choice(CT_CFG_GEMM);
        __atomic_store_n(&c, v, __ATOMIC_RELAXED);
    }
    return v;
}
static bool openblas_only(void) { return gemm_choice() == 1; }
static bool avx2_fma(void) { return ct_cpu_capability() >= CT_CPU_AVX2; }
static int isa_forced; /* tests: ct_sgemm_set_isa_ (0: none) */
ct_sgemm_isa ct_sgemm_kernel_isa(void) {
    int f = __atomic_load_n(&isa_forced, __ATOMIC_RELAXED);
    if (f) return (ct_sgemm_isa)f;
    if (ct_sgemm_own_available() && gemm_choice() != 2) return CT_SGEMM_ISA_AVX512;
    return avx2_fma() ? CT_SGEMM_ISA_AVX2 : CT_SGEMM_ISA_NONE;
}
const char *ct_gemm_kernel_name(void) {
    const ct_sgemm_isa isa = openblas_only() ? CT_SGEMM_ISA_NONE : ct_sgemm_kernel_isa();
    return isa == CT_SGEMM_ISA_AVX512 ? "avx512" : isa == CT_SGEMM_ISA_AVX2 ? "avx2" : "openblas";
}
void ct_sgemm_set_isa_(ct_sgemm_isa isa) {
    CT_CHECK(isa == CT_SGEMM_ISA_NONE || (isa == CT_SGEMM_ISA_AVX2 && avx2_fma()) || (isa == CT_SGEMM_ISA_AVX512 && ct_sgemm_own_available()),
             "ct_sgemm_set_isa_(%d): this CPU cannot run that family", (int)isa);
    __atomic_store_n(&isa_forced, (int)isa, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- micro-kernel ---- */

/* C tile (rows < mr, columns < nr, row stride ldc) from the accumulators, per mode:
 * 0: C = alpha acc;  1: C = alpha acc + C;  2: C = alpha acc + beta C (both kernels).
 * The C read is ci's (row stride ldci): c itself, or the first K block's input of
 * ct_sgemm_bias (a bias row, ldci 0). c is not restrict: ci may be c.
 * cb (the last K block of ct_sgemm_bf16_out): the result goes to cb (row stride ldcb) rounded
 * to bf16 instead, C only read */
CT_AVX512 static inline __attribute__((always_inline)) void store_tile(__m512 acc[MR][NV], float *c, const float *ci, uint16_t *restrict cb,
                                                                      int64_t ldc, int64_t ldci, int64_t ldcb, int mr, int nr, float alpha,
                                                                      float beta, int mode) {
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 m[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        int rem = nr - 16 * v;
        m[v] = rem >= 16 ? (__mmask16)0xFFFF : rem <= 0 ? (__mmask16)0 : (__mmask16)((1u << rem) - 1);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        if (i >= mr) break;
        float *cr = c + i * ldc;
        const float *cir = ci + i * ldci;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __m512 r = _mm512_mul_ps(acc[i][v], va);
            if (mode == 1) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m[v], cir + 16 * v));
            else if (mode == 2) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m[v], cir + 16 * v), r);
            if (cb) ct_store_bf16x16(cb + i * ldcb + 16 * v, m[v], r);
            else _mm512_mask_storeu_ps(cr + 16 * v, m[v], r);
        }
    }}

/* c[0:mr, 0:nr] (row stride ldc) = alpha * a-panel . b-panel (+ C per mode):
 * mode 0: C = alpha acc;  1: C = alpha acc + C;  2: C = alpha acc + beta C; to cb as bf16 when cb */
/* R (a constant at each call) rows of the panel: a last panel of mr < MR rows runs only the
 * rows it has (M = 128 is 9 full panels and 2 rows: the 14-row kernel would compute 140) */
CT_AVX512 static inline __attribute__((always_inline)) void kernel_r(int64_t kc, const float *restrict a, const float *restrict b, float *c,
                                                                    const float *ci, uint16_t *restrict cb, int64_t ldc, int64_t ldci,
                                                                    int64_t ldcb, int mr, int nr, float alpha, float beta, int mode,
                                                                    const int R) {
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m512 bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
        }
        a += MR;
        b += NR;
    }
    store_tile(acc, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode);
}
/* Each element's products and their order do not depend on R: the same bits for any split. */
CT_AVX512 static void kernel(int64_t kc, const float *restrict a, const float *restrict b, float *c, const float *ci, uint16_t *restrict cb,
                             int64_t ldc, int64_t ldci, int64_t ldcb, int mr, int nr, float alpha, float beta, int mode) {
    if (mr >= MR) kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, MR);
    else if (mr <= 2) kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, 2);
    else if (mr <= 4) kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, 4);
    else if (mr <= 7) kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, 7);
    else kernel_r(kc, a, b, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode, MR);
}

/* bf16 x bf16 -> f32 (AVX-512 BF16): a and b hold k in pairs — a[kp][i] is the pair
 * (A[i][2kp], A[i][2kp+1]), b[kp][j] the pair of column j — and vdpbf16ps adds both
 * products (exact in f32) to the f32 accumulator, rounding after each add: twice the
 * multiply-adds of the f32 kernel per instruction. kp2 = pairs. */
#define CT_AVX512BF16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16,fma")))
CT_AVX512BF16 static void kernel_bf16(int64_t kp2, const uint32_t *restrict a, const uint32_t *restrict b, float *c, const float *ci,
                                      uint16_t *restrict cb, int64_t ldc, int64_t ldci, int64_t ldcb, int mr, int nr, float alpha,
                                      float beta, int mode) {
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp2; k++) {
        __m512bh bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_load_si512((const void *)(b + 16 * v));
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
        }
        a += MR;
        b += NR;
    }
    store_tile(acc, c, ci, cb, ldc, ldci, ldcb, mr, nr, alpha, beta, mode);
}

/* A packed f32 panel p[k][W] (kc rows, W a multiple of 16) into bf16 pairs in place:
 * q[kp][j] = (bf16 p[2kp][j], bf16 p[2kp+1][j]), round to nearest even; an odd last k pairs
 * with 0. Row pair kp is read (into registers) before its 16-column chunk is overwritten,
 * and later pairs are written below what is still to be read. */
CT_AVX512BF16 static void panel_to_bf16(float *p, int W, int64_t kc) {
    /* W = 14 (A panels) or 32 (B panels): masked 16-column chunks */
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                         20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t kp = 0; kp < (kc + 1) / 2; kp++)
        for (int g = 0; g < W; g += 16) {
            __mmask16 m = W - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (W - g)) - 1);
            __m512 r0 = _mm512_maskz_loadu_ps(m, p + 2 * kp * W + g);
            __m512 r1 = 2 * kp + 1 < kc ? _mm512_maskz_loadu_ps(m, p + (2 * kp + 1) * W + g) : _mm512_setzero_ps();
            /* [bf16 r0 (16) | bf16 r1 (16)] -> (r0[j], r1[j]) pairs */
            __m512i both = (__m512i)_mm512_cvtne2ps_pbh(r1, r0);
            _mm512_mask_storeu_epi32((void *)(p + kp * W + g), m, _mm512_permutexvar_epi16(idx, both));
        }
}

bool ct_sgemm_bf16_native(void) {
    static int avail = -1;
    int a = __atomic_load_n(&avail, __ATOMIC_RELAXED);
    if (a < 0) {
        __builtin_cpu_init();
        a = ct_sgemm_own_available() && __builtin_cpu_supports("avx512bf16") ? 1 : 0;
        __atomic_store_n(&avail, a, __ATOMIC_RELAXED);
    }
    return a == 1;
}

/* Without AVX-512 BF16: round the packed f32 values to bf16 in place (to nearest even) and
 * run the f32 kernel — the same products, summed in another order. */
void ct_sgemm_round_bf16_(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], 4);
        if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        else if (u & 0xffffu) u |= 0x00400000u; /* NaN stays NaN */
        memcpy(&p[i], &u, 4);
    }
}

/* ---------------------------------------------------------------- packing ---- */

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* 16 elements (lanes m) of x from element i on: f32, or bf16 (h) widened exactly to f32 */
CT_AVX512 static inline __attribute__((always_inline)) __m512 load16(const void *x, bool h, int64_t i, __mmask16 m) {
    if (!h) return _mm512_maskz_loadu_ps(m, (const float *)x + i);
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* Packs rows [0, n) (n <= W, W <= 16 or a multiple of 16) x k in [0, kc) of a matrix X
 * whose element (row r, k) is element r * rs + k * ks of x (f32, or bf16 when h) into
 * dst[k][W] (f32), zero padding rows n..W-1. Either ks == 1 (rows contiguous in k:
 * transposed through registers) or rs == 1 (contiguous across rows: copied). */
CT_AVX512 static inline __attribute__((always_inline)) void pack_any(float *restrict dst, const void *restrict x, bool h, int64_t rs,
                                                                    int64_t ks, int n, int W, int64_t kc) {
    if (rs == 1) {
        for (int64_t k = 0; k < kc; k++) {
            float *d = dst + k * W;
            for (int g = 0; g < W; g += 16) {
                __mmask16 wm = lanes(W - g);
                _mm512_mask_storeu_ps(d + g, wm, load16(x, h, k * ks + g, lanes(n - g)));
            }
        }
        return;
    }
    /* ks == 1: 16 rows x 16 k at a time */
    for (int g = 0; g < W; g += 16) {
        int rows = n - g < 16 ? n - g : 16; /* may be <= 0: zero group */
        __mmask16 wm = lanes(W - g);
        for (int64_t k0 = 0; k0 < kc; k0 += 16) {
            int64_t kr = kc - k0 < 16 ? kc - k0 : 16;
            __mmask16 km = lanes(kr);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? load16(x, h, (g + i) * rs + k0, km) : _mm512_setzero_ps();
            ct_tr16(r);
            for (int64_t kk = 0; kk < kr; kk++) _mm512_mask_storeu_ps(dst + (k0 + kk) * W + g, wm, r[kk]);
        }
    }
}

CT_AVX512 static void pack_panel(float *restrict dst, const float *restrict x, int64_t rs, int64_t ks, int n, int W, int64_t kc) {
    pack_any(dst, x, false, rs, ks, n, W, kc);
}
CT_AVX512 static void pack_panel_h(float *restrict dst, const uint16_t *restrict x, int64_t rs, int64_t ks, int n, int W, int64_t kc) {
    pack_any(dst, x, true, rs, ks, n, W, kc);
}
/* the panel of x at element offset off (f32, or bf16 when h) */
static inline void pack_from(float *dst, const void *x, bool h, int64_t off, int64_t rs, int64_t ks, int n, int W, int64_t kc) {
    if (h) pack_panel_h(dst, (const uint16_t *)x + off, rs, ks, n, W, kc);
    else pack_panel(dst, (const float *)x + off, rs, ks, n, W, kc);
}

/* The copy case (rs == 1) for a whole block: n rows of the packed operand (columns of x)
 * as ceil(n / W) micro-panels dst + p W kc, row k of x read once, left to right, for all
 * panels (W = MR or NR). Panel by panel (pack_any) walked down kc rows of x at a stride of
 * ks for every 14 or 32 columns: an L1 miss per row per panel, the same rows again for the
 * next panel. The same values land in the same places. */
enum { PF = 4 }; /* rows ahead */
CT_AVX512 static void pack_block_rows(float *restrict dst, const float *restrict x, int64_t ks, int64_t n, int W, int64_t kc) {
    const int64_t npan = (n + W - 1) / W;
    for (int64_t k = 0; k < kc; k++) {
        const float *xr = x + k * ks;
        float *d = dst + k * W;
        for (int64_t p = 0; p < npan; p++, d += W * kc) {
            const int64_t c0 = p * W;
            if (k + PF < kc) _mm_prefetch((const char *)(xr + PF * ks + c0), _MM_HINT_T0);
            for (int g = 0; g < W; g += 16)
                _mm512_mask_storeu_ps(d + g, lanes(W - g), _mm512_maskz_loadu_ps(lanes(n - c0 - g), xr + c0 + g));
        }
    }
}

/* pack_block_rows for A (W = MR) that also adds each packed row's values to sum (rows of
 * op(A): sum[i] += A(i, k), k ascending, one chain per i: the bits of a row-order loop). The
 * at most MC / MR panels' sums stay in registers across the kc rows. */
CT_AVX512 static void pack_block_rows_sum(float *restrict dst, const float *restrict x, int64_t ks, int64_t n, int64_t kc,
                                          float *restrict sum) {
    enum { NP = MC / MR };
    const int64_t npan = (n + MR - 1) / MR;
    __m512 acc[NP];
    __mmask16 sm[NP];
#pragma GCC unroll 12
    for (int p = 0; p < NP; p++) { /* panels past n: mask 0, nothing read or written */
        sm[p] = lanes(imin(MR, n - p * MR));
        acc[p] = _mm512_maskz_loadu_ps(sm[p], sum + p * MR);
    }
    for (int64_t k = 0; k < kc; k++) {
        const float *xr = x + k * ks;
        if (k + PF < kc) _mm_prefetch((const char *)(xr + PF * ks), _MM_HINT_T0);
#pragma GCC unroll 12
        for (int p = 0; p < NP; p++)
            if (p < npan) {
                __m512 v = _mm512_maskz_loadu_ps(sm[p], xr + p * MR);
                _mm512_mask_storeu_ps(dst + p * MR * kc + k * MR, lanes(MR), v);
                acc[p] = _mm512_add_ps(acc[p], v);
            }
    }
#pragma GCC unroll 12
    for (int p = 0; p < NP; p++) _mm512_mask_storeu_ps(sum + p * MR, sm[p], acc[p]);
}

void ct_sgemm_pack_panel_(float *dst, const void *x, bool h, int64_t off, int64_t rs, int64_t ks, int n, int W, int64_t kc) {
    pack_from(dst, x, h, off, rs, ks, n, W, kc);
}
CT_AVX512BF16 void ct_sgemm_panel_to_bf16_(float *p, int W, int64_t kc) { panel_to_bf16(p, W, kc); }

CT_AVX512 void ct_sgemm_pack_rows(float *dst, const float *x, int64_t rs, int n, int64_t kc) { pack_panel(dst, x, rs, 1, n, NR, kc); }

/* ---------------------------------------------------------------- driver ---- */

typedef ct_sgemm_job_ job; /* sgemm_job.h: shared with the AVX2 family */

/* Implicit B: each B micro-panel is packed by the caller's packer right before the MR-row
 * kernels that use it (it stays in L1; no B matrix in memory, no packed B block). The
 * kernels, K blocks and modes are those of run(): the same bits as the explicit product. */
CT_AVX512 static void run_implicit_b(const job *j) {
    const int64_t ars = j->ta ? 1 : j->lda, aks = j->ta ? j->lda : 1;
    int64_t npan = (j->N + NR - 1) / NR;
    for (int64_t pc = 0; pc < j->K; pc += KC) {
        int64_t kc = imin(KC, j->K - pc);
        int mode = pc > 0 ? 1 : j->beta == 0.0f ? 0 : j->beta == 1.0f ? 1 : 2;
        for (int64_t ic = 0; ic < j->M; ic += MC) {
            int64_t mc = imin(MC, j->M - ic), mpan = (mc + MR - 1) / MR;
            for (int64_t p = 0; p < mpan; p++) {
                int64_t m0 = ic + p * MR;
                if (!j->aseg) {
                    pack_panel(j->pa + p * MR * kc, (const float *)j->A + m0 * ars + pc * aks, ars, aks, (int)imin(MR, j->M - m0), MR, kc);
                    continue;
                }
                /* segmented A: the panel's k range piece by piece, the same values in place */
                for (int64_t k = pc; k < pc + kc;) {
                    int64_t sg = k / j->aseg, q = k - sg * j->aseg, len = imin(j->aseg - q, pc + kc - k);
                    pack_panel(j->pa + p * MR * kc + (k - pc) * MR, (const float *)j->A + sg * j->aseg_stride + m0 * j->lda + q, j->lda, 1,
                               (int)imin(MR, j->M - m0), MR, len);
                    k += len;
                }
            }
            for (int64_t jr = 0; jr < npan; jr++) {
                int64_t n0 = jr * NR;
                int nr = (int)imin(NR, j->N - n0);
                j->packb(j->packb_arg, j->pb, j->noff + n0, nr, pc, kc);
                for (int64_t ir = 0; ir < mpan; ir++) {
                    int64_t i0 = ic + ir * MR;
                    float *c = j->C + i0 * j->ldc + n0;
                    kernel(kc, j->pa + ir * MR * kc, j->pb, c, c, NULL, j->ldc, j->ldc, 0, (int)imin(MR, j->M - i0), nr,
                           j->alpha, j->beta, mode);
                }
            }
        }
    }
}

/* n rows (n <= MC or NC) x kc of an operand (element (r, k) at off + r rs + k ks of x) as
 * micro-panels of W rows at dst + p W kc; for the bf16 GEMM (bf16: its path) converted or
 * rounded as its kernel reads them */
CT_AVX512 static void pack_block(int bf16, float *dst, const void *x, bool h, int64_t off, int64_t rs, int64_t ks, int64_t n, int W,
                                 int64_t kc) {
    if (rs == 1 && !h && !bf16) {
        pack_block_rows(dst, (const float *)x + off, ks, n, W, kc);
        return;
    }
    for (int64_t p = 0; p * W < n; p++) {
        float *d = dst + p * W * kc;
        pack_from(d, x, h, off + p * W * rs, rs, ks, (int)imin(W, n - p * W), W, kc);
        if (bf16 == CT_GEMM_BF16_NATIVE) panel_to_bf16(d, W, kc);
        else if (bf16) ct_sgemm_round_bf16_(d, W * kc);
    }
}

CT_AVX512 static void run(const job *j) {
    if (j->packb) {
        run_implicit_b(j);
        return;
    }
    if (j->bf16 == CT_GEMM_BF16_AMX) {
        ct_sgemm_amx_run_(j->ta, j->tb, j->M, j->N, j->K, j->alpha, j->A, j->ah, j->lda, j->B, j->bh, j->ldb, j->beta, j->C, j->ldc,
                          j->Cb, j->ldcb, j->pa, j->pb);
        return;
    }
    const bool native = j->bf16 == CT_GEMM_BF16_NATIVE;
    /* op(A)(i, k) = A[i * ars + k * aks]; op(B)(k, n) = B[k * bks + n * brs] */
    const int64_t ars = j->ta ? 1 : j->lda, aks = j->ta ? j->lda : 1;
    const int64_t brs = j->tb ? j->ldb : 1, bks = j->tb ? 1 : j->ldb;
    for (int64_t jc = 0; jc < j->N; jc += NC) {
        int64_t nc = imin(NC, j->N - jc), npan = (nc + NR - 1) / NR;
        for (int64_t pc = 0; pc < j->K; pc += KC) {
            int64_t kc = imin(KC, j->K - pc);
            int mode = pc > 0 ? 1 : j->beta == 0.0f ? 0 : j->beta == 1.0f ? 1 : 2;
            uint16_t *cb = pc + kc >= j->K ? j->Cb : NULL;
            pack_block(j->bf16, j->pb, j->B, j->bh, jc * brs + pc * bks, brs, bks, nc, NR, kc);
            for (int64_t ic = 0; ic < j->M; ic += MC) {
                int64_t mc = imin(MC, j->M - ic), mpan = (mc + MR - 1) / MR;
                if (ars == 1 && !j->ah && !j->bf16 && j->asum && jc == 0)
                    pack_block_rows_sum(j->pa, (const float *)j->A + ic + pc * aks, aks, mc, kc, j->asum + ic);
                else
                    pack_block(j->bf16, j->pa, j->A, j->ah, ic * ars + pc * aks, ars, aks, mc, MR, kc);
                for (int64_t jr = 0; jr < npan; jr++) /* B micro-panel stays in L1, A panels stream from L2 */
                    for (int64_t ir = 0; ir < mpan; ir++) {
                        int64_t i0 = ic + ir * MR, n0 = jc + jr * NR;
                        uint16_t *cbt = cb ? cb + i0 * j->ldcb + n0 : NULL;
                        float *c = j->C + i0 * j->ldc + n0;
                        const float *ci = pc == 0 && j->Ci ? j->Ci + i0 * j->ldci + n0 : c;
                        int64_t ldci = pc == 0 && j->Ci ? j->ldci : j->ldc;
                        if (j->bf16 && native)
                            kernel_bf16((kc + 1) / 2, (const uint32_t *)(j->pa + ir * MR * kc), (const uint32_t *)(j->pb + jr * NR * kc),
                                        c, ci, cbt, j->ldc, ldci, j->ldcb, (int)imin(MR, j->M - i0), (int)imin(NR, j->N - n0), j->alpha,
                                        j->beta, mode);
                        else
                            kernel(kc, j->pa + ir * MR * kc, j->pb + jr * NR * kc, c, ci, cbt, j->ldc, ldci, j->ldcb,
                                   (int)imin(MR, j->M - i0), (int)imin(NR, j->N - n0), j->alpha, j->beta, mode);
                    }
            }
        }
    }
}

/* ---------------------------------------------------------------- packing buffers ----
 * An op cannot return a status, so a GEMM must not allocate: out of memory there could only
 * abort. The buffers (one fixed-size A and B pair per thread, 2.2 MiB) form a pool that is
 * reserved ahead, where a failure can be reported: ct_ctx_create reserves one pair per
 * thread of ct_get_num_threads() and fails with CT_ERR_NOMEM if it cannot; a larger
 * ct_set_num_threads grows the pool when memory allows. A GEMM claims free pairs (an atomic
 * flag each) and runs on as many threads as it got: the result does not depend on the
 * thread count, so a short pool costs speed, never bits. When every pair is taken by GEMMs
 * running at the same time (ranks as threads of one process), it waits for one: holders
 * only compute, so one comes free. The pool lives as long as the process. */
#define MAX_SLOTS 256
typedef struct {
    float *pa, *pb;
    atomic_int busy;
    char pad_[64 - 2 * sizeof(float *) - sizeof(atomic_int)]; /* one cache line per flag */
} slot;
static _Alignas(64) slot pool[MAX_SLOTS];
static atomic_int pool_n; /* pairs allocated; published after their pointers */
static pthread_mutex_t pool_grow = PTHREAD_MUTEX_INITIALIZER;

ct_status ct_kernels_reserve(int nthreads) {
    if (nthreads > MAX_SLOTS) nthreads = MAX_SLOTS; /* more threads simply share the pool */
    if (atomic_load_explicit(&pool_n, memory_order_acquire) >= nthreads) return CT_OK;
    ct_status st = CT_OK;
    pthread_mutex_lock(&pool_grow);
    for (int n = atomic_load_explicit(&pool_n, memory_order_relaxed); n < nthreads; n++) {
        float *pa = aligned_alloc(64, (size_t)MC * KC * sizeof(float)), *pb = aligned_alloc(64, (size_t)NC * KC * sizeof(float));
        if (!pa || !pb) {
            free(pa);
            free(pb);
            st = ct_error(CT_ERR_NOMEM, "out of memory for GEMM packing buffers (%d of %d threads)", n, nthreads);
            break;
        }
        pool[n].pa = pa;
        pool[n].pb = pb;
        atomic_store_explicit(&pool_n, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&pool_grow);
    return st;
}

/* core reserves through this from ct_ctx_create / ct_set_num_threads (it cannot call up) */
__attribute__((constructor)) static void register_reserve(void) { ct_kernel_register_reserve(ct_kernels_reserve); }

/* claims 1..want free pairs into ids (waits while none is free); returns how many */
static int claim(int want, int *ids) {
    int n = atomic_load_explicit(&pool_n, memory_order_acquire);
    CT_CHECK(n > 0, "GEMM without packing buffers: ct_ctx_create (or ct_kernels_reserve) reserves them");
    for (;;) {
        int got = 0;
        for (int i = 0; i < n && got < want; i++) {
            int idle = 0;
            if (!atomic_load_explicit(&pool[i].busy, memory_order_relaxed) &&
                atomic_compare_exchange_strong_explicit(&pool[i].busy, &idle, 1, memory_order_acquire, memory_order_relaxed))
                ids[got++] = i;
        }
        if (got) return got;
        sched_yield();
        n = atomic_load_explicit(&pool_n, memory_order_acquire);
    }
}
static void release(const int *ids, int n) {
    for (int i = 0; i < n; i++) atomic_store_explicit(&pool[ids[i]].busy, 0, memory_order_release);
}
static void buffers(job *j, int id) {
    j->pa = pool[id].pa;
    j->pb = pool[id].pb;
}

/* p advanced by n elements of f32, or of bf16 when h */
static inline const void *advance(const void *p, bool h, int64_t n) { return (const char *)p + n * (h ? 2 : 4); }

static void gemm(int bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, bool ah, int64_t lda,
                 const void *B, bool bh, int64_t ldb, float beta, float *C, int64_t ldc, uint16_t *Cb, int64_t ldcb,
                 ct_sgemm_pack_b_fn packb, const void *parg, int64_t aseg, int64_t aseg_stride, const float *Ci, int64_t ldci,
                 float *asum) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        for (int64_t i = 0; i < M; i++) {
            float *c = C + i * ldc;
            if (Cb) /* C only read (its rows may be one row: ldc 0) */
                for (int64_t n = 0; n < N; n++) {
                    float v = beta == 0.0f ? 0.0f : beta == 1.0f ? c[n] : c[n] * beta;
                    ct_convert(Cb + i * ldcb + n, CT_BF16, &v, CT_F32, 1);
                }
            else if (beta == 0.0f) memset(c, 0, (size_t)N * sizeof(float));
            else if (beta != 1.0f)
                for (int64_t n = 0; n < N; n++) c[n] *= beta;
        }
        return;
    }
    /* the AVX2 family where it is the choice (its bf16 path is the rounded one: ct_sgemm_bf16_path);
     * implicit B and segmented A have AVX-512 callers only (ct_sgemm_own_takes) */
    const ct_sgemm_isa isa = ct_sgemm_kernel_isa();
    CT_CHECK(isa != CT_SGEMM_ISA_NONE, "own GEMM on a CPU without AVX2 and FMA (%lld x %lld x %lld)", (long long)M, (long long)N,
             (long long)K);
    const bool avx2 = isa == CT_SGEMM_ISA_AVX2 && !packb && !aseg;
    void (*run_job)(const job *) = avx2 ? ct_sgemm_avx2_run_ : run;
    job j = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, ah, bh, C, Cb, ldcb, Ci, ldci, NULL, NULL, bf16, packb,
             parg, 0, aseg, aseg_stride, asum};
    /* threads: only with enough work per thread (~1 MFLOP each, a few microseconds) */
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    double flops = 2.0 * (double)M * (double)N * (double)K;
    if (nt > 1 && flops < 2e6 * nt) nt = (int)(flops / 2e6) > 1 ? (int)(flops / 2e6) : 1;
    /* Threads take ranges of whole micro-panels of the larger of M and N and run the serial
     * algorithm on each (their own packing, no barriers): the smaller operand is packed for
     * every range, which costs little next to the range's share of the product. An
     * element's arithmetic does not depend on which range it is in, nor on the thread. */
    bool split_n = N >= M || packb; /* a packer's B is split by columns */
    int64_t unit = split_n ? NR : bf16 == CT_GEMM_BF16_AMX ? 32 : avx2 ? CT_SGEMM_AVX2_MR : MR, units = ((split_n ? N : M) + unit - 1) / unit;
    if (nt > units) nt = (int)units;
    if (nt > MAX_SLOTS) nt = MAX_SLOTS;
    if (nt < 1) nt = 1;
    int ids[MAX_SLOTS];
    nt = claim(nt, ids);
    if (nt <= 1) {
        buffers(&j, ids[0]);
        run_job(&j);
        release(ids, nt);
        return;
    }
    /* Ranges handed out in order from a shared counter: a thread whose core is taken by
     * another process (a shared machine) takes fewer instead of holding the other at the
     * join. Every range repacks the smaller operand, so there are two per thread only where
     * each still spans >= 16 micro-panels (the repacking then stays ~1-2 % of the work);
     * otherwise one per thread, as a static split. */
    int64_t per = (units + 2 * nt - 1) / (2 * nt);
    if (per < 16) per = (units + nt - 1) / nt;
    int64_t nchunks = (units + per - 1) / per;
    atomic_llong next = 0;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num();
        for (;;) {
            int64_t ch = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
            if (ch >= nchunks) break;
            int64_t lo = ch * per * unit, hi = (ch + 1) * per * unit;
            job s = j;
            if (split_n) {
                hi = imin(hi, N);
                s.N = hi - lo;
                if (packb) s.noff = lo;
                else s.B = advance(B, bh, tb ? lo * ldb : lo);
                if (lo > 0) s.asum = NULL; /* every column range packs all of A: one sums it */
                s.C = C + lo;
                if (Cb) s.Cb = Cb + lo;
                if (Ci) s.Ci = Ci + lo;
            } else {
                hi = imin(hi, M);
                s.M = hi - lo;
                s.A = advance(A, ah, ta ? lo : lo * lda);
                if (asum) s.asum = asum + lo;
                s.C = C + lo * ldc;
                if (Cb) s.Cb = Cb + lo * ldcb;
                if (Ci) s.Ci = Ci + lo * ldci;
            }
            if (hi > lo) {
                buffers(&s, ids[t]);
                run_job(&s);
            }
        }
    }
    release(ids, nt);
}

void ct_sgemm_own(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    gemm(0, ta, tb, M, N, K, alpha, A, false, lda, B, false, ldb, beta, C, ldc, NULL, 0, NULL, NULL, 0, 0, NULL, 0, NULL);
}

void ct_sgemm_own_rowsum(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                         float *C, int64_t ldc, float *sum) {
    /* the sums need every element of A: a product that returns early still sums */
    if (M > 0 && N > 0 && K > 0) {
        gemm(0, true, false, M, N, K, 1.0f, A, false, lda, B, false, ldb, beta, C, ldc, NULL, 0, NULL, NULL, 0, 0, NULL, 0, sum);
        return;
    }
    ct_sgemm_own(true, false, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    for (int64_t k = 0; k < K; k++)
        for (int64_t i = 0; i < M; i++) sum[i] += A[k * lda + i];
}

void ct_sgemm_bias(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                   const float *bias, float *C, int64_t ldc) {
    CT_CHECK(ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE, "ct_sgemm_bias needs AVX2 and FMA or AVX-512");
    if (K <= 0) { /* no K block reads the bias: the rows are the bias */
        for (int64_t i = 0; i < M; i++) memcpy(C + i * ldc, bias, (size_t)N * sizeof(float));
        return;
    }
    gemm(0, ta, tb, M, N, K, 1.0f, A, false, lda, B, false, ldb, 1.0f, C, ldc, NULL, 0, NULL, NULL, 0, 0, bias, 0, NULL);
}

void ct_sgemm_implicit_b(bool ta, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, ct_sgemm_pack_b_fn pack,
                         const void *arg, float beta, float *C, int64_t ldc) {
    CT_CHECK(ct_sgemm_own_available(), "ct_sgemm_implicit_b needs an AVX-512 CPU");
    gemm(0, ta, false, M, N, K, 1.0f, A, false, lda, NULL, false, 0, beta, C, ldc, NULL, 0, pack, arg, 0, 0, NULL, 0, NULL);
}

void ct_sgemm_implicit_b_seg(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int64_t seg, int64_t seg_stride,
                             ct_sgemm_pack_b_fn pack, const void *arg, float beta, float *C, int64_t ldc) {
    CT_CHECK(ct_sgemm_own_available(), "ct_sgemm_implicit_b_seg needs an AVX-512 CPU");
    CT_CHECK(seg > 0, "ct_sgemm_implicit_b_seg: segment length %lld", (long long)seg);
    gemm(0, false, false, M, N, K, 1.0f, A, false, lda, NULL, false, 0, beta, C, ldc, NULL, 0, pack, arg, seg, seg_stride, NULL, 0, NULL);
}

bool ct_sgemm_bf16_native_preferred(void) {
    static int pref = -1;
    int p = __atomic_load_n(&pref, __ATOMIC_RELAXED);
    if (p < 0) {
        __builtin_cpu_init();
        p = ct_sgemm_bf16_native() && __builtin_cpu_is("amd") ? 1 : 0;
        __atomic_store_n(&pref, p, __ATOMIC_RELAXED);
    }
    return p == 1;
}

/* CTRAIN_GEMM_BF16 (auto|rounded|native|amx) against what the CPU has: auto takes AMX where
 * present (measured fastest, docs/bench/engine.md), else vdpbf16ps on AMD (Zen 4: a Llama's
 * bf16 step 1.45x faster than rounded, docs/bench/amp.md), else rounding on the f32 kernel
 * (faster than vdpbf16ps on the Intel CPUs measured); a path the CPU lacks falls back to
 * rounding. Read per call (no cache), so a program or test may switch paths between GEMMs. */
ct_gemm_bf16_path ct_sgemm_bf16_path(void) {
    if (ct_sgemm_kernel_isa() != CT_SGEMM_ISA_AVX512) return CT_GEMM_BF16_ROUNDED;
    int c = ct_config_choice(CT_CFG_GEMM_BF16);
    if ((c == 0 || c == 3) && ct_sgemm_amx_available()) return CT_GEMM_BF16_AMX;
    if ((c == 2 || (c == 0 && ct_sgemm_bf16_native_preferred())) && ct_sgemm_bf16_native()) return CT_GEMM_BF16_NATIVE;
    return CT_GEMM_BF16_ROUNDED;
}

bool ct_sgemm_bf16_path_available(ct_gemm_bf16_path path) {
    const ct_sgemm_isa isa = ct_sgemm_kernel_isa();
    if (isa == CT_SGEMM_ISA_NONE) return false;
    return path == CT_GEMM_BF16_ROUNDED || (isa == CT_SGEMM_ISA_AVX512 && path == CT_GEMM_BF16_NATIVE && ct_sgemm_bf16_native()) ||
           (isa == CT_SGEMM_ISA_AVX512 && path == CT_GEMM_BF16_AMX && ct_sgemm_amx_available());
}

void ct_sgemm_bf16_on(ct_gemm_bf16_path path, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    CT_CHECK(ct_sgemm_bf16_path_available(path), "ct_sgemm_bf16_on: bf16 GEMM path %d is not available on this CPU", (int)path);
    gemm((int)path, ta, tb, M, N, K, alpha, A, false, lda, B, false, ldb, beta, C, ldc, NULL, 0, NULL, NULL, 0, 0, NULL, 0, NULL);
}

void ct_sgemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    CT_CHECK(ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE, "ct_sgemm_bf16 needs AVX2 and FMA or AVX-512");
    gemm((int)ct_sgemm_bf16_path(), ta, tb, M, N, K, alpha, A, false, lda, B, false, ldb, beta, C, ldc, NULL, 0, NULL, NULL, 0, 0, NULL, 0, NULL);
}

void ct_sgemm_bf16_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, bool a_bf16, int64_t lda,
                      const void *B, bool b_bf16, int64_t ldb, float beta, float *C, int64_t ldc) {
    CT_CHECK(ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE, "ct_sgemm_bf16_ex needs AVX2 and FMA or AVX-512");
    gemm((int)ct_sgemm_bf16_path(), ta, tb, M, N, K, alpha, A, a_bf16, lda, B, b_bf16, ldb, beta, C, ldc, NULL, 0, NULL, NULL, 0, 0, NULL, 0, NULL);
}

void ct_sgemm_bf16_out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, bool a_bf16, int64_t lda,
                       const void *B, bool b_bf16, int64_t ldb, float beta, float *C, int64_t ldc, uint16_t *Cb, int64_t ldcb) {
    CT_CHECK(ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE, "ct_sgemm_bf16_out needs AVX2 and FMA or AVX-512");
    gemm((int)ct_sgemm_bf16_path(), ta, tb, M, N, K, alpha, A, a_bf16, lda, B, b_bf16, ldb, beta, C, ldc, Cb, ldcb, NULL, NULL, 0, 0, NULL, 0, NULL);
}

/* ---------------------------------------------------------------- dispatch ---- */

bool ct_sgemm_dispatch(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (!ct_sgemm_kernel_takes(M, N, K)) return false;
    ct_sgemm_own(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return true;
}

bool ct_sgemm_own_takes(int64_t M, int64_t N, int64_t K) {
    return ct_sgemm_kernel_isa() == CT_SGEMM_ISA_AVX512 && ct_sgemm_kernel_takes(M, N, K);
}

bool ct_sgemm_kernel_takes(int64_t M, int64_t N, int64_t K) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE || openblas_only()) return false;
    /* no context created yet, hence no packing buffers (ops always have one) */
    if (!atomic_load_explicit(&pool_n, memory_order_acquire)) return false;
    /* Tiny products, where packing does not pay: below ~24^3 OpenBLAS wins (`gemm_bench
     * small`: 16^3 0.6x, 24^3 ~1x, 32^3 1.5x); so does K < 16 (the C tile's load/store
     * dominates: 128x1024x10 0.5x), N < 16 (the 32-wide tile mostly padding: 128x10x1024
     * 0.8x) and M < 8 (the 14-row tile mostly padding). Shape-only rules: the choice, and
     * hence the bits, never depend on the thread count. */
    return !(K < 16 || N < 16 || M < 8 || (double)M * (double)N * (double)K < 13824.0);
}
