/* Internal to the CPU GEMM (sgemm.c, sgemm_amx.c): the AMX-BF16 path of ct_sgemm_bf16 and
 * the packers it shares with the AVX-512 kernels.
 *
 *   if (ct_sgemm_amx_available())   // CPUID AMX-TILE + AMX-BF16 and the OS granted tile state
 *       ct_sgemm_amx_run_(ta, tb, M, N, K, alpha, A, ah, lda, B, bh, ldb, beta, C, ldc, NULL, 0, pa, pb);
 */
#ifndef CT_OPS_CPU_SGEMM_AMX_H
#define CT_OPS_CPU_SGEMM_AMX_H
#include <stdbool.h>
#include <stdint.h>

/* sizes of one thread's packing buffers (sgemm.c's pool) */
#define CT_SGEMM_PA_BYTES (168 * 256 * 4)
#define CT_SGEMM_PB_BYTES (2048 * 256 * 4)

/* true when the CPU has AMX-TILE, AMX-BF16 and AVX-512 BF16 and Linux granted this process
 * the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once; a refusal is a false) */
bool ct_sgemm_amx_available(void);

/* One serial range of the bf16 GEMM on AMX (ct_sgemm_bf16's contract) with the packing
 * buffers pa, pb (CT_SGEMM_PA_BYTES, CT_SGEMM_PB_BYTES); Cb, ldcb: ct_sgemm_bf16_out's bf16 result
 * (or NULL). Needs ct_sgemm_amx_available(). */
void ct_sgemm_amx_run_(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, bool ah, int64_t lda,
                       const void *B, bool bh, int64_t ldb, float beta, float *C, int64_t ldc, uint16_t *Cb, int64_t ldcb,
                       void *pa, void *pb);

/* Pieces of the AMX GEMM for other kernels (the fused attention's bf16 path, flash_amx.c).
 * Tiles: ct_amx_tiles_load_() once on the thread before ct_amx_mm_ (8 tiles of 16 rows x 64
 * bytes), ct_amx_tiles_release_() after. Packed operands:
 *  - A: ct_amx_pack_a_ packs rows [0, rows) x k [0, kc) of A (element (r, k) at off + r ars + k aks,
 *    f32 rounded or bf16 when ah) as 16 x 32 bf16 tiles, tile (row group g, k chunk kb) at
 *    dst + (g nkb + kb) 512, zeros up to mcp rows (a multiple of 16) and nkb chunks;
 *  - B: ct_amx_pack_b_ packs a panel of 32 columns [0, nv) x k [0, kc) (element (k, n) at
 *    off + n brs + k bks) as bf16 pairs [kp][32], zeros up to kcp (a multiple of 32); the
 *    panel needs 32 kcp floats (it is packed as f32 first).
 * ct_amx_mm_: C[M][N] (+ C where acc) = A B over nkb chunks, M and N multiples of 32; A at
 * row group 0 with ags elements between row groups, B at panel 0 with bps floats between
 * panels. Each C element: the tile's sums over the chunks in order, starting from C where acc. */
void ct_amx_tiles_load_(void);
void ct_amx_tiles_release_(void);
void ct_amx_pack_a_(uint16_t *dst, const void *A, bool ah, int64_t off, int64_t ars, int64_t aks, int64_t rows, int64_t mcp,
                    int64_t kc, int64_t nkb);
void ct_amx_pack_b_(float *bp, const void *B, bool bh, int64_t off, int64_t brs, int64_t bks, int nv, int64_t kc, int64_t kcp);
void ct_amx_mm_(int64_t M, int64_t N, int64_t nkb, const uint16_t *A, int64_t ags, const float *B, int64_t bps, float *C,
                int64_t ldc, bool acc);

/* sgemm.c's packers: rows [0, n) x k [0, kc) of X (element (r, k) is element
 * off + r * rs + k * ks of x: f32, or bf16 when h; rs == 1 or ks == 1) into dst[k][W] (f32)
 * zero padded to W; and a packed panel p[k][W] into bf16
 * pairs in place, q[kp][j] = (p[2kp][j], p[2kp+1][j]), an odd last k paired with 0 */
void ct_sgemm_pack_panel_(float *dst, const void *x, bool h, int64_t off, int64_t rs, int64_t ks, int n, int W, int64_t kc);
void ct_sgemm_panel_to_bf16_(float *p, int W, int64_t kc);
#endif
