/* AVX-512 kernels of the fused attention (src/ops/cpu/flash_simd.c), one whole head per
 * call, written for its shapes instead of going through the general sgemm:
 *
 *   float *w = ...ct_flash_simd_work(&a, false) floats...;
 *   ct_flash_simd_fwd_head(&a, h, Y, lse, w);
 *
 * Callers check ct_sgemm_own_available() (AVX-512F) first; flash_attention.c keeps the
 * BLAS path for CPUs without it. */
#ifndef CT_OPS_CPU_FLASH_SIMD_H
#define CT_OPS_CPU_FLASH_SIMD_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where one tensor's heads lie: row t of head h = b H + j starts at b bs + j hs + t ld floats
 * from its base. [BH, T, D] contiguous is {D, H T D, T D}; q of a packed qkv [B, T, 3C]
 * (ct_flash_attention_qkv) is {3C, T 3C, D}, k and v the same from base + C, + 2C. */
typedef struct {
    int64_t ld, bs, hs;
} ct_flash_layout;

/* one attention call: BH heads of Tq queries [D], Tk keys [D] and values [Dv]; H heads per
 * batch entry. Grouped-query attention: G query heads share one key/value head (query head j
 * of a batch entry reads key/value head j / G of the H / G there; G = 1: one each). The gradients dQ, dK, dV have the layouts of Q, K, V; dO (and Y) has o's;
 * lse and Dr are [BH, Tq] contiguous. */
typedef struct {
    const float *Q, *K, *V;
    int64_t Tq, Tk, D, Dv;
    float scale;
    bool causal, own;
    int64_t H;
    ct_flash_layout q, k, v, o;
    /* bf16 inputs instead (Q, K, V unused; needs `own`): the kernels widen each head's rows
     * into their scratch. y16: Y is bf16, written as ct_k_f32_to_bf16 rounds (forward), and
     * dO is rounded to bf16 (ct_k_round_bf16) as it is read (backward). The bits of the f32
     * kernels on autocast's f32 copies and of its conversions. */
    const uint16_t *Qb, *Kb, *Vb;
    bool y16;
    /* with Qb: the tile products in bf16 on AMX (flash_amx.c), not in f32 on widened values */
    bool amx;
    int64_t G;
} ct_flash_args;

/* offset of query head h's first row in a tensor of layout l (a->k, a->v: the key/value head
 * it reads) */
static inline int64_t ct_flash_head(const ct_flash_args *a, const ct_flash_layout *l, int64_t h) {
    const int64_t j = h % a->H;
    return h / a->H * l->bs + (l == &a->k || l == &a->v ? j / a->G : j) * l->hs;
}

/* floats of per-thread scratch a head needs (forward or backward) */
size_t ct_flash_simd_work(const ct_flash_args *a, bool backward);
/* Head h: its rows of Y (layout a->o; f32, or bf16 where y16) and of lse ([BH, Tq]). */
void ct_flash_simd_fwd_head(const ct_flash_args *a, int64_t h, void *Y, float *lse, float *work);
/* Head h's gradients, added to dq / dk / dv (each may be NULL), or written over them where
 * fresh (their previous contents ignored: no zeroing pass; G = 1 only); Dr = rowsum(dO * O).
 * With G > 1 the heads of one group add to the same dk, dv: one thread runs them in order. */
void ct_flash_simd_bwd_head(const ct_flash_args *a, int64_t h, const float *dO, const float *lse, const float *Dr, float *dq,
                            float *dk, float *dv, bool fresh, float *work);

/* The tile steps both kernel sets share (flash_simd.c), on a transposed 64 x 64 score tile
 * St[key][query]; ssc: a scale applied to S first (1: none, the bits unchanged). */
bool ct_flash_softmax_tile_(float *St, int64_t cols, int64_t lim0, float *m, float *l, float *al, float ssc);
void ct_flash_grad_tile_(float *St, float *dSt, int64_t cols, int64_t lim0, const float *L, const float *R, float sc, float ssc);

/* The AMX-BF16 kernels (flash_amx.c) for bf16 inputs (Qb) where ct_sgemm_amx_available():
 * the same contract as the two above, tile products in bf16 with f32 sums. */
size_t ct_flash_amx_work(const ct_flash_args *a, bool backward);
void ct_flash_amx_fwd_head(const ct_flash_args *a, int64_t h, void *Y, float *lse, float *work);
/* set: head h's rows of dq, dk, dv are written, not added to (each is written once) */
void ct_flash_amx_bwd_head(const ct_flash_args *a, int64_t h, const float *dO, const float *lse, const float *Dr, float *dq,
                           float *dk, float *dv, bool set, float *work);
#endif
