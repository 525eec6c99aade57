/* The bf16 GEMM on AMX-BF16 tiles (see sgemm_amx.h). One serial range of sgemm.c's driver:
 *
 *   for jc in N by NCA:              B block  KCA x NCA, packed as bf16 pairs (VNNI layout)
 *     for pc in K by KCA:            K blocks in order
 *       for ic in M by MCA:          A block  MCA x KCA, packed as bf16 rows of 32
 *         for jr, for ir:            32 x 32 C block = 2 x 2 tiles of 16 x 16 f32
 *
 * Tiles: tmm0-3 the four accumulators, tmm4-5 two A tiles (16 rows x 32 k), tmm6-7 two B
 * tiles (16 k-pairs x 16 columns). Each K block's sums (zeroed tiles, tdpbf16ps over the
 * block's 32-k chunks in order, zero padded past K) are added into C as the f32 kernel
 * does (alpha acc, + beta C on the first block, + C on the others). Every C element thus
 * sees the same operations in the same order whatever range or tile it falls in: the result
 * does not depend on the thread count. Only functions carry the AMX target.
 *
 * Packing: operands are f32 or bf16 storage. A rows contiguous in k go straight into tiles
 * (bf16 copied, f32 rounded 32 at a time); B rows contiguous in n are interleaved in pairs
 * (bf16) and B rows contiguous in k are a 32-bit transpose (bf16 pairs are words); the other
 * cases go through sgemm.c's f32 packer and are rounded to pairs. All give the same tiles.
 * K blocks of 256 measured faster than 512 on the GPT's shapes (gemm_bench bf16). */
#include "ops/cpu/sgemm_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ops/cpu/sgemm.h"
#include "ops/cpu/avx512.h"

#define CT_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512vl,avx512bw,avx512bf16,fma")))

#define KCA 256  /* multiple of 32 (one tile's k) */
#define MCA 256  /* multiple of 32; MCA x KCA bf16 within sgemm.c's A buffer */
#define NCA 2048 /* NCA x KCA f32 within sgemm.c's B buffer (packed as f32 first) */
_Static_assert(KCA % 32 == 0 && MCA % 32 == 0 && NCA % 32 == 0, "tile multiples");
_Static_assert(MCA * KCA * 2 <= CT_SGEMM_PA_BYTES && NCA * KCA * 4 <= CT_SGEMM_PB_BYTES, "AMX blocks fit the packing buffers");

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

bool ct_sgemm_amx_available(void) {
    static int avail = -1;
    int a = __atomic_load_n(&avail, __ATOMIC_ACQUIRE);
    if (a >= 0) return a == 1;
    unsigned eax, ebx, ecx, edx;
    /* CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; the packing needs AVX-512 BF16 */
    a = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 22 & 1) && (edx >> 24 & 1) && ct_sgemm_bf16_native();
    /* Linux hands out the 8 KiB tile state only on request (once per process, for all its
     * threads); a kernel or VM that refuses means no AMX, not an error */
    if (a && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) a = 0;
    __atomic_store_n(&avail, a, __ATOMIC_RELEASE);
    return a == 1;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

/* A rows [m0, m0 + mc) x k [pc, pc + kc) into dst: per 16-row group t and 32-k chunk kb,
 * a 16 x 32 bf16 tile at dst + (t * nkb + kb) * 512; zeros past M (up to mc rounded to 32)
 * and past kc */
CT_AMX static void pack_a(uint16_t *dst, const void *A, bool ah, int64_t aoff, int64_t ars, int64_t aks, int64_t rows, int64_t mcp, int64_t kc, int64_t nkb) {
    _Alignas(64) float tmp[16][32];
    for (int64_t t = 0; t < mcp / 16; t++) {
        int r = (int)imin(16, rows - 16 * t);
        for (int64_t kb = 0; kb < nkb; kb++) {
            int kn = (int)imin(32, kc - 32 * kb);
            uint16_t *d = dst + (t * nkb + kb) * 512;
            if (ah && aks == 1) { /* bf16 rows contiguous in k: already the tile's rows */
                const uint16_t *src = (const uint16_t *)A + aoff + 16 * t * ars + 32 * kb;
                __mmask32 km = kn >= 32 ? (__mmask32)~0u : (__mmask32)((1u << kn) - 1);
                for (int i = 0; i < 16; i++)
                    _mm512_store_si512((void *)(d + 32 * i), i < r ? _mm512_maskz_loadu_epi16(km, src + i * ars) : _mm512_setzero_si512());
                continue;
            }
            if (!ah && aks == 1) { /* f32 rows contiguous in k: round 32 at a time */
                const float *src = (const float *)A + aoff + 16 * t * ars + 32 * kb;
                __mmask16 m0 = kn >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << kn) - 1);
                __mmask16 m1 = kn >= 32 ? (__mmask16)0xFFFF : kn <= 16 ? 0 : (__mmask16)((1u << (kn - 16)) - 1);
                for (int i = 0; i < 16; i++) {
                    __m512i v = _mm512_setzero_si512();
                    if (i < r)
                        v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, src + i * ars + 16), _mm512_maskz_loadu_ps(m0, src + i * ars));
                    _mm512_store_si512((void *)(d + 32 * i), v);
                }
                continue;
            }
            if (r > 0 && kn > 0) /* element (row i, k) is tmp[i][k]: pack_panel's rows are our k */
                ct_sgemm_pack_panel_(&tmp[0][0], A, ah, aoff + 16 * t * ars + 32 * kb * aks, aks, ars, kn, 32, r);
            for (int i = 0; i < 16; i++) {
                __m512i v = _mm512_setzero_si512();
                if (i < r && kn > 0) v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(&tmp[i][16]), _mm512_load_ps(&tmp[i][0]));
                _mm512_store_si512((void *)(d + 32 * i), v);
            }
        }
    }
}

/* B panel [kp][32] of bf16 pairs straight from bf16 storage, or false (the caller packs
 * through f32): op(B)(k, n) = B[off + k * bks + n * brs], columns [0, nv), k [0, kc) */
CT_AMX static bool pack_b_bf16(uint32_t *dst, const uint16_t *B, int64_t off, int64_t brs, int64_t bks, int nv, int64_t kc) {
    if (brs == 1) { /* rows k contiguous in n: interleave rows 2kp and 2kp + 1 */
        const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35,
                                            3, 34, 2, 33, 1, 32, 0);
        const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
        __mmask32 nm = nv >= 32 ? (__mmask32)~0u : (__mmask32)((1u << nv) - 1);
        for (int64_t kp = 0; kp < (kc + 1) / 2; kp++) {
            __m512i r0 = _mm512_maskz_loadu_epi16(nm, B + off + 2 * kp * bks);
            __m512i r1 = 2 * kp + 1 < kc ? _mm512_maskz_loadu_epi16(nm, B + off + (2 * kp + 1) * bks) : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(dst + 32 * kp), _mm512_permutex2var_epi16(r0, lo, r1));
            _mm512_storeu_si512((void *)(dst + 32 * kp + 16), _mm512_permutex2var_epi16(r0, hi, r1));
        }
        return true;
    }
    /* rows n contiguous in k: each pair (2kp, 2kp + 1) is one 32-bit word, so the panel is
     * the transpose of a 32-bit matrix (sgemm.c's f32 transposing packer moves bits only);
     * needs whole pairs: even kc, row stride and offset */
    if (bks != 1 || kc % 2 || brs % 2 || off % 2) return false;
    ct_sgemm_pack_panel_((float *)dst, (const float *)B, false, off / 2, brs / 2, 1, nv, 32, kc / 2);
    return true;
}

/* C[0:mr, 0:nr] from the 32 x 32 sums t per mode (0: alpha t; 1: alpha t + C; 2: alpha t + beta C);
 * to cb (row stride ldcb) rounded to bf16 instead when cb (the last K block of ct_sgemm_bf16_out) */
CT_AMX static void store_c(const float (*t)[32], float *c, int64_t ldc, uint16_t *cb, int64_t ldcb, int mr, int nr, float alpha,
                           float beta, int mode) {
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < mr; i++)
        for (int g = 0; g < nr; g += 16) {
            __mmask16 m = nr - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nr - g)) - 1);
            float *cr = c + i * ldc + g;
            __m512 r = _mm512_mul_ps(_mm512_load_ps(&t[i][g]), va);
            if (mode == 1) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, cr));
            else if (mode == 2) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cr), r);
            if (cb) ct_store_bf16x16(cb + i * ldcb + g, m, r);
            else _mm512_mask_storeu_ps(cr, m, r);
        }
}

/* 32 x 32 sums over nkb chunks into c (row stride ldc floats), added to what c holds where acc:
 * a0/a1 the two A row groups, b the B panel ([kp][32] pairs) */
CT_AMX static void kernel(int64_t nkb, const uint16_t *a0, const uint16_t *a1, const uint32_t *b, float *c, int64_t ldc, bool acc) {
    const int64_t st = ldc * 4;
    if (acc) {
        _tile_loadd(0, c, st);
        _tile_loadd(1, c + 16, st);
        _tile_loadd(2, c + 16 * ldc, st);
        _tile_loadd(3, c + 16 * ldc + 16, st);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t kb = 0; kb < nkb; kb++) {
        _tile_loadd(4, a0 + kb * 512, 64);
        _tile_loadd(6, b + kb * 512, 128);
        _tile_loadd(7, b + kb * 512 + 16, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + kb * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, st);
    _tile_stored(1, c + 16, st);
    _tile_stored(2, c + 16 * ldc, st);
    _tile_stored(3, c + 16 * ldc + 16, st);
}

CT_AMX void ct_amx_pack_b_(float *bp, const void *B, bool bh, int64_t off, int64_t brs, int64_t bks, int nv, int64_t kc, int64_t kcp) {
    if (!bh || !pack_b_bf16((uint32_t *)bp, B, off, brs, bks, nv, kc)) {
        ct_sgemm_pack_panel_(bp, B, bh, off, brs, bks, nv, 32, kc);
        ct_sgemm_panel_to_bf16_(bp, 32, kc);
    }
    for (int64_t kp = (kc + 1) / 2; kp < kcp / 2; kp++)
        _mm512_storeu_si512((void *)(bp + kp * 32), _mm512_setzero_si512()), _mm512_storeu_si512((void *)(bp + kp * 32 + 16), _mm512_setzero_si512());
}

CT_AMX void ct_amx_pack_a_(uint16_t *dst, const void *A, bool ah, int64_t off, int64_t ars, int64_t aks, int64_t rows, int64_t mcp,
                           int64_t kc, int64_t nkb) {
    pack_a(dst, A, ah, off, ars, aks, rows, mcp, kc, nkb);
}

/* static: GCC drops stores to a local config as dead (it does not see ldtilecfg read them) */
static _Alignas(64) const tilecfg tiles_cfg = {.palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};
CT_AMX void ct_amx_tiles_load_(void) { _tile_loadconfig(&tiles_cfg); }
CT_AMX void ct_amx_tiles_release_(void) { _tile_release(); }

CT_AMX void ct_amx_mm_(int64_t M, int64_t N, int64_t nkb, const uint16_t *A, int64_t ags, const float *B, int64_t bps, float *C,
                       int64_t ldc, bool acc) {
    for (int64_t j = 0; j < N; j += 32)
        for (int64_t i = 0; i < M; i += 32) {
            const uint16_t *a0 = A + i / 16 * ags;
            kernel(nkb, a0, a0 + ags, (const uint32_t *)(B + j / 32 * bps), C + i * ldc + j, ldc, acc);
        }
}

CT_AMX void ct_sgemm_amx_run_(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, bool ah, int64_t lda,
                              const void *B, bool bh, int64_t ldb, float beta, float *C, int64_t ldc, uint16_t *Cb,
                              int64_t ldcb, void *pa_, void *pb_) {
    uint16_t *pa = pa_;
    float *pb = pb_;
    const int64_t ars = ta ? 1 : lda, aks = ta ? lda : 1;
    const int64_t brs = tb ? ldb : 1, bks = tb ? 1 : ldb;
    ct_amx_tiles_load_();
    _Alignas(64) float t[32][32];
    for (int64_t jc = 0; jc < N; jc += NCA) {
        int64_t nc = imin(NCA, N - jc), npan = (nc + 31) / 32;
        for (int64_t pc = 0; pc < K; pc += KCA) {
            int64_t kc = imin(KCA, K - pc), nkb = (kc + 31) / 32, kcp = nkb * 32;
            int mode = pc > 0 ? 1 : beta == 0.0f ? 0 : beta == 1.0f ? 1 : 2;
            uint16_t *cb = pc + kc >= K ? Cb : NULL;
            /* B panels: f32 [k][32] (sgemm.c's packer), then bf16 pairs [kp][32] in place,
             * zero pairs up to kcp / 2 */
            for (int64_t p = 0; p < npan; p++) {
                int64_t n0 = jc + 32 * p;
                ct_amx_pack_b_(pb + p * 32 * kcp, B, bh, n0 * brs + pc * bks, brs, bks, (int)imin(32, N - n0), kc, kcp);
            }
            for (int64_t ic = 0; ic < M; ic += MCA) {
                int64_t mc = imin(MCA, M - ic), mcp = (mc + 31) / 32 * 32;
                pack_a(pa, A, ah, ic * ars + pc * aks, ars, aks, mc, mcp, kc, nkb);
                for (int64_t jr = 0; jr < npan; jr++) /* the B panel (<= 32 KiB) stays in L1 */
                    for (int64_t ir = 0; ir < mcp / 32; ir++) {
                        int64_t i0 = ic + 32 * ir, n0 = jc + 32 * jr;
                        const uint16_t *a0 = pa + 2 * ir * nkb * 512;
                        kernel(nkb, a0, a0 + nkb * 512, (const uint32_t *)(pb + jr * 32 * kcp), &t[0][0], 32, false);
                        store_c((const float (*)[32])t, C + i0 * ldc + n0, ldc, cb ? cb + i0 * ldcb + n0 : NULL, ldcb,
                                (int)imin(32, M - i0), (int)imin(32, N - n0), alpha, beta, mode);
                    }
            }
        }
    }
    _tile_release(); /* no tile state kept across context switches between GEMMs */
}
