/* Fused ("flash") scaled-dot-product attention: the same result as ct_attention without ever
 * holding the [Tq, Tk] score matrix.
 *
 * Forward, per head and tile of BR query rows: walk the visible key tiles of BC keys,
 *   S = q k^T * scale (BR x BC), m' = max(m, rowmax S), P = exp(S - m'),
 *   l = l exp(m - m') + rowsum P, O = O exp(m - m') + P v,
 * and finish with O /= l (the online softmax). Saved for backward: the output and one
 * log-sum-exp per row, lse = m + log l — O(T) memory instead of the plain version's O(T^2).
 * Backward recomputes each tile's P = exp(S - lse) and, with Dr = rowsum(dO * O),
 *   dV += P^T dO, dP = dO v^T, dS = P (dP - Dr) scale, dQ += dS k, dK += dS^T q.
 * Cost: forward 2 tile GEMMs per tile pair (as plain), backward 5 (plain: 4, it keeps P).
 *
 * With AVX-512 or AVX2 + FMA (and CTRAIN_GEMM != openblas) threads take whole heads and run
 * the kernels of flash_simd.c / flash_avx2.c, written for these tile shapes (the same bits on
 * both); every output element is accumulated by one thread in a fixed order, so the result
 * does not depend on the thread count. Elsewhere (CTRAIN_GEMM=openblas, or a CPU without
 * AVX2) the tiles below go through BLAS, heads one after the other on the threaded BLAS
 * (OpenBLAS is not entered from several OpenMP threads at once).
 * Causal masking is PyTorch's is_causal (query i sees keys j <= i); tiles entirely above the
 * diagonal are skipped.
 * Both paths take each tensor's row, batch and head strides (ct_flash_layout), so that
 * ct_flash_attention_qkv runs the same tiles on q, k, v inside c_attn's [B, T, 3C] output
 * and writes y (and reads dO) as [B, T, C]: the values and their order are those of
 * ct_flash_attention on the copies, only the addresses differ.
 * A bf16 qkv (c_attn's output under bf16 autocast) is read as it is on the own kernels' path: the
 * kernels widen each head's rows into their scratch, y is written as bf16 and y's gradient
 * rounded to bf16 as it is read — the bits of autocast's f32 copies of qkv and y, its
 * conversion of y and its rounding of the gradient (autocast.c), without those passes. The
 * BLAS path keeps autocast's copies.
 * Where the bf16 GEMMs run on AMX (ct_sgemm_bf16_path()) a bf16 qkv goes to the AMX kernels
 * of flash_amx.c instead: tile products in bf16 with f32 sums, as PyTorch's CPU flash
 * attention does for bf16; not the bits of the f32 kernels (CTRAIN_GEMM_BF16=rounded keeps those). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "ctrain/config.h"
#include "ctrain/ops.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/flash_simd.h"
#include "ops/cpu/sgemm.h"
#include "ops/cpu/vmath.h"
#include "ops/kmath.h"
#include "ops/op_table.h"

enum { BR = 64, BC = 128 }; /* query rows x keys per tile: S, P, dP fit in L2 */

/* the kernels of flash_simd.c: on AVX-512 or on AVX2 + FMA, whichever GEMM family runs */
static bool own_gemm(void) {
    return ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE && ct_config_choice(CT_CFG_GEMM) != 1 /* openblas */;
}
bool ct_flash_reads_bf16(void) { return own_gemm(); }
/* C = alpha op(A) op(B) + beta C on the threaded BLAS (the path without the own kernels) */
static void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    ct_sgemm_ld(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
/* keys [0, n) that query row i sees */
static inline int64_t visible(bool causal, int64_t i, int64_t Tk) { return causal ? min64(i + 1, Tk) : Tk; }

typedef ct_flash_args att;

/* Rows [i0, i1) of head h: O (rows of Y) and lse. S is BR x BC scratch. */
static void fwd_tile(const att *a, int64_t h, int64_t i0, int64_t i1, float *Y, float *lse, float *S) {
    const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, rows = i1 - i0;
    const int64_t lq = a->q.ld, lk = a->k.ld, lv = a->v.ld, lo = a->o.ld;
    const float *Qh = a->Q + ct_flash_head(a, &a->q, h) + i0 * lq, *Kh = a->K + ct_flash_head(a, &a->k, h);
    const float *Vh = a->V + ct_flash_head(a, &a->v, h);
    float *O = Y + ct_flash_head(a, &a->o, h) + i0 * lo;
    float m[BR], l[BR];
    for (int64_t r = 0; r < rows; r++) { m[r] = -INFINITY; l[r] = 0; }
    for (int64_t r = 0; r < rows; r++) memset(O + r * lo, 0, (size_t)Dv * sizeof(float));
    int64_t kv = a->causal ? min64(i1, Tk) : Tk;
    for (int64_t j0 = 0; j0 < kv; j0 += BC) {
        int64_t cols = min64(BC, kv - j0);
        tile_gemm(false, true, rows, cols, D, a->scale, Qh, lq, Kh + j0 * lk, lk, 0.0f, S, BC);
        for (int64_t r = 0; r < rows; r++) {
            float *s = S + r * BC, *o = O + r * lo;
            int64_t n = min64(visible(a->causal, i0 + r, Tk) - j0, cols);
            if (n <= 0) { memset(s, 0, (size_t)cols * sizeof(float)); continue; }
            float mt = -INFINITY;
#pragma omp simd reduction(max : mt)
            for (int64_t c = 0; c < n; c++) mt = s[c] > mt ? s[c] : mt;
            float mn = mt > m[r] ? mt : m[r], alpha = ct_vexpf(m[r] - mn); /* first tile: exp(-inf) = 0 */
            l[r] = l[r] * alpha + ct_vexp_sub_sum(s, s, mn, n);
            if (n < cols) memset(s + n, 0, (size_t)(cols - n) * sizeof(float));
            if (alpha != 1.0f) {
#pragma omp simd
                for (int64_t c = 0; c < Dv; c++) o[c] *= alpha;
            }
            m[r] = mn;
        }
        tile_gemm(false, false, rows, Dv, cols, 1.0f, S, BC, Vh + j0 * lv, lv, 1.0f, O, lo);
    }
    for (int64_t r = 0; r < rows; r++) {
        /* a row that sees no key (Tk == 0) stays 0, as in the plain version */
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f, *o = O + r * lo;
#pragma omp simd
        for (int64_t c = 0; c < Dv; c++) o[c] *= inv;
        lse[h * Tq + i0 + r] = m[r] + logf(l[r]);
    }
}

/* Y (layout a->o) and lse [BH, Tq] of all BH heads */
static void forward(ct_ctx *ctx, const att *a, int64_t BH, void *Y, float *lse) {
    ct_temp_mark mark = ct_ctx_temp_begin_(ctx); /* the scratch goes when forward returns */
    if (a->own) {
        int nt = ct_get_num_threads();
        size_t w = a->amx ? ct_flash_amx_work(a, false) : ct_flash_simd_work(a, false);
        float *work = ct_ctx_alloc(ctx, (size_t)nt * w * sizeof(float));
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (nt > 1 && BH > 1)
        for (int64_t h = 0; h < BH; h++) {
            float *wt = work + (size_t)omp_get_thread_num() * w;
            if (a->amx) ct_flash_amx_fwd_head(a, h, Y, lse, wt);
            else ct_flash_simd_fwd_head(a, h, Y, lse, wt);
        }
    } else {
        int64_t ntile = (a->Tq + BR - 1) / BR;
        float *S = ct_ctx_alloc(ctx, (size_t)BR * BC * sizeof(float));
        for (int64_t w = 0; w < BH * ntile; w++) {
            int64_t h = w / ntile, i0 = w % ntile * BR;
            fwd_tile(a, h, i0, min64(i0 + BR, a->Tq), Y, lse, S);
        }
    }
    ct_ctx_temp_end_(ctx, mark);
}

/* one head's layout in a contiguous [B, H, T, d] tensor */
static ct_flash_layout heads_layout(int64_t H, int64_t T, int64_t d) { return (ct_flash_layout){d, H * T * d, T * d}; }
/* k and v may have fewer heads than q (grouped-query: KV dividing H) */
static att heads_args(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal) {
    const int64_t H = q->shape[1], KV = k->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    return (att){q->data, k->data, v->data, Tq, Tk, D, Dv, D ? 1.0f / sqrtf((float)D) : 1.0f, causal, own_gemm(), H,
                 heads_layout(H, Tq, D), heads_layout(KV, Tk, D), heads_layout(KV, Tk, Dv), heads_layout(H, Tq, Dv),
                 NULL, NULL, NULL, false, false, H / KV};
}

ct_tensor *ct_flash_attention(ct_ctx *ctx, ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal) {
    CT_DEV_DISPATCH(ctx, CT_OP_FLASH_ATTENTION, .in = {q, k, v}, .i = {causal});
    CT_AUTOCAST(ctx, CT_OP_FLASH_ATTENTION, 3, ((ct_tensor **[]){&q, &k, &v}), ct_flash_attention(ctx, q, k, v, causal));
    ct_tensor *in[3] = {q, k, v};
    ct_check_attention_gqa("flash_attention", q, k, v);
    att a = heads_args(q, k, v, causal);
    int64_t BH = q->shape[0] * q->shape[1];
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){q->shape[0], q->shape[1], a.Tq, a.Dv});
    float *lse = ct_ctx_alloc_keep(ctx, (size_t)(BH * a.Tq + 1) * sizeof(float));
    forward(ctx, &a, BH, y->data, lse);
    ct_node *nd = ct_record(ctx, CT_OP_FLASH_ATTENTION, y, 3, in);
    if (nd) {
        nd->saved = lse;
        nd->i[0] = causal;
        nd->f[0] = a.scale;
    }
    return y;
}

/* The heads of a packed qkv [B, T, 3C] (c_attn's output) read where they lie and y written
 * as [B, T, H, D]: the same tile products on the same values as ct_flash_attention, so the
 * same bits, without the copies into and out of head layout (nor their mirror in backward). */
static att qkv_args(const ct_tensor *qkv, int64_t H, bool causal) {
    const int64_t T = qkv->shape[1], C = qkv->shape[2] / 3, D = C / H;
    ct_flash_layout in = {3 * C, T * 3 * C, D};
    att a = {NULL, NULL, NULL, T, T, D, D, D ? 1.0f / sqrtf((float)D) : 1.0f, causal, own_gemm(), H,
             in, in, in, (ct_flash_layout){C, T * C, D}, NULL, NULL, NULL, false, false, 1};
    if (qkv->dtype == CT_BF16) { /* the own kernels widen it themselves */
        const uint16_t *p = qkv->data;
        a.Qb = p, a.Kb = p + C, a.Vb = p + 2 * C, a.own = true;
        /* tile products in bf16 where the bf16 GEMMs run on AMX (CTRAIN_GEMM_BF16=rounded:
         * the f32 kernels on the widened values) */
        a.amx = ct_sgemm_bf16_path() == CT_GEMM_BF16_AMX;
    } else {
        const float *p = qkv->data;
        a.Q = p, a.K = p + C, a.V = p + 2 * C;
    }
    return a;
}

ct_tensor *ct_flash_attention_qkv(ct_ctx *ctx, ct_tensor *qkv, int n_head, bool causal) {
    CT_DEV_DISPATCH(ctx, CT_OP_FLASH_ATTENTION_QKV, .in = {qkv}, .i = {n_head, causal});
    /* bf16 qkv (c_attn's output under autocast) read as it is where the own kernels run:
     * the bits of autocast's f32 copy, f32 op and conversion of y, without those passes */
    const bool bf16 = qkv->dtype == CT_BF16 && ct_flash_reads_bf16();
    /* y in bf16, or in f32 inside autocast's frame (an f32 qkv cast there; ct_ac_leave converts y) */
    const bool y16 = bf16 && ct_ctx_temp_depth_(ctx) == 0;
    if (bf16 && !ct_is_contiguous(qkv)) qkv = ct_contiguous(ctx, qkv);
    if (!bf16) {
        CT_AUTOCAST(ctx, CT_OP_FLASH_ATTENTION_QKV, 1, ((ct_tensor **[]){&qkv}), ct_flash_attention_qkv(ctx, qkv, n_head, causal));
        CT_CHECK_F32("flash_attention_qkv", qkv);
        CT_CHECK_CONTIG("flash_attention_qkv", qkv);
    }
    char sx[96];
    if (qkv->ndim != 3 || n_head < 1 || qkv->shape[2] % (3 * (int64_t)n_head))
        CT_FATAL("flash_attention_qkv: input %s must be [B, T, 3 C] with n_head = %d dividing C", ct_shape_str(qkv, sx, sizeof sx),
                 n_head);
    att a = qkv_args(qkv, n_head, causal);
    const int64_t B = qkv->shape[0], BH = B * n_head;
    a.y16 = y16;
    ct_tensor *y = ct_new(ctx, y16 ? CT_BF16 : CT_F32, 3, (int64_t[]){B, a.Tq, n_head * a.D});
    float *lse = ct_ctx_alloc_keep(ctx, (size_t)(BH * a.Tq + 1) * sizeof(float));
    forward(ctx, &a, BH, y->data, lse);
    ct_node *nd = ct_record(ctx, CT_OP_FLASH_ATTENTION_QKV, y, 1, &qkv);
    if (nd) {
        nd->saved = lse;
        nd->i[0] = causal;
        nd->i[1] = n_head;
        if (y16) nd->op = &ct_op_table_lp[CT_OP_FLASH_ATTENTION_QKV]; /* a low-precision node, as ct_ac_leave makes */
    }
    return y;
}

/* One head's gradients: key tiles outer (dK, dV of a tile complete in one pass), query
 * tiles inner; dQ rows accumulate over key tiles in ascending order. */
static void bwd_head(const att *a, int64_t h, const float *dO, const float *lse, const float *Dr, float *dq,
                     float *dk, float *dv, float *P, float *dP) {
    const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv;
    const int64_t lq = a->q.ld, lk = a->k.ld, lv = a->v.ld, lo = a->o.ld;
    const int64_t hq = ct_flash_head(a, &a->q, h), hk = ct_flash_head(a, &a->k, h), hv = ct_flash_head(a, &a->v, h);
    const float *Qh = a->Q + hq, *Kh = a->K + hk, *Vh = a->V + hv, *dOh = dO + ct_flash_head(a, &a->o, h);
    for (int64_t j0 = 0; j0 < Tk; j0 += BC) {
        int64_t cols = min64(BC, Tk - j0);
        for (int64_t i0 = a->causal ? j0 / BR * BR : 0; i0 < Tq; i0 += BR) {
            int64_t rows = min64(BR, Tq - i0);
            tile_gemm(false, true, rows, cols, D, a->scale, Qh + i0 * lq, lq, Kh + j0 * lk, lk, 0.0f, P, BC);
            tile_gemm(false, true, rows, cols, Dv, 1.0f, dOh + i0 * lo, lo, Vh + j0 * lv, lv, 0.0f, dP, BC);
            for (int64_t r = 0; r < rows; r++) {
                float *p = P + r * BC, *d = dP + r * BC;
                int64_t n = min64(visible(a->causal, i0 + r, Tk) - j0, cols);
                if (n < 0) n = 0;
                const float L = lse[h * Tq + i0 + r], dr = Dr[h * Tq + i0 + r], sc = a->scale;
                ct_vexp_sub(p, p, L, n);
#pragma omp simd
                for (int64_t c = 0; c < n; c++) d[c] = p[c] * (d[c] - dr) * sc;
                if (n < cols) {
                    memset(p + n, 0, (size_t)(cols - n) * sizeof(float));
                    memset(d + n, 0, (size_t)(cols - n) * sizeof(float));
                }
            }
            if (dv) tile_gemm(true, false, cols, Dv, rows, 1.0f, P, BC, dOh + i0 * lo, lo, 1.0f, dv + hv + j0 * lv, lv);
            if (dq) tile_gemm(false, false, rows, D, cols, 1.0f, dP, BC, Kh + j0 * lk, lk, 1.0f, dq + hq + i0 * lq, lq);
            if (dk) tile_gemm(true, false, cols, D, rows, 1.0f, dP, BC, Qh + i0 * lq, lq, 1.0f, dk + hk + j0 * lk, lk);
        }
    }
}

/* Zeroes head h's rows of dq, dk, dv (each may be NULL) */
static void zero_head(const att *a, int64_t h, float *dq, float *dk, float *dv) {
    float *g[3] = {dq, dk, dv};
    const ct_flash_layout *l[3] = {&a->q, &a->k, &a->v};
    const int64_t T[3] = {a->Tq, a->Tk, a->Tk}, d[3] = {a->D, a->D, a->Dv};
    for (int i = 0; i < 3; i++) {
        float *p = g[i] ? g[i] + ct_flash_head(a, l[i], h) : NULL;
        for (int64_t t = 0; p && t < T[i]; t++) memset(p + t * l[i]->ld, 0, (size_t)d[i] * sizeof(float));
    }
}

/* one row's sum of g * o: the f32 and the bf16 rows run this same loop (the same bits) */
static inline float dot_row(const float *g, const float *o, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; c++) s += g[c] * o[c];
    return s;
}

/* All heads' gradients added to dq, dk, dv (NULL: not wanted; a key/value head gets the sum
 * over its group, heads in order); zero (G = 1 only): they are zeroed first,
 * head by head on the thread that computes the head. O is bf16 (and dO is rounded to bf16 as
 * it is read) where a->y16. */
static void backward(ct_ctx *ctx, const att *a, int64_t BH, const void *O, const float *dO, const float *lse, float *dq, float *dk,
                     float *dv, bool zero) {
    /* Dr = rowsum(dO * O): the softmax backward's row term, computed once per row */
    const int64_t Tq = a->Tq, Dv = a->Dv, lo = a->o.ld, G = a->G;
    CT_CHECK(!zero || G == 1, "flash_attention: a group's heads add to one dk, dv (no zeroing pass with G = %lld)", (long long)G);
    float *Dr = ct_ctx_alloc(ctx, (size_t)(BH * Tq + 1) * sizeof(float));
    const bool bf16 = a->y16;
    /* bf16: each row's dO and O as the f32 copies autocast would make, one pair per thread */
    float *rows = bf16 ? ct_ctx_alloc(ctx, (size_t)omp_get_max_threads() * 2 * (size_t)(Dv + 16) * sizeof(float)) : NULL;
#pragma omp parallel for if (BH * Tq * Dv >= (1 << 15))
    for (int64_t r = 0; r < BH * Tq; r++) {
        int64_t at = ct_flash_head(a, &a->o, r / Tq) + r % Tq * lo;
        if (!bf16) {
            Dr[r] = dot_row(dO + at, (const float *)O + at, Dv);
            continue;
        }
        float *g = rows + (size_t)omp_get_thread_num() * 2 * (size_t)(Dv + 16), *o = g + Dv + 16;
        const uint16_t *ob = (const uint16_t *)O + at;
        for (int64_t c = 0; c < Dv; c++) {
            g[c] = ct_k_round_bf16(dO[at + c]);
            o[c] = ct_k_bf16_to_f32(ob[c]);
        }
        Dr[r] = dot_row(g, o, Dv);
    }
    if (a->own) {
        int nt = ct_get_num_threads();
        size_t w = a->amx ? ct_flash_amx_work(a, true) : ct_flash_simd_work(a, true);
        float *work = ct_ctx_alloc(ctx, (size_t)nt * w * sizeof(float));
        /* one thread per key/value head: its G query heads add to its dk, dv in head order */
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (nt > 1 && BH > G)
        for (int64_t kv = 0; kv < BH / G; kv++) {
            float *wt = work + (size_t)omp_get_thread_num() * w;
            for (int64_t h = kv * G; h < kv * G + G; h++) {
                if (a->amx) ct_flash_amx_bwd_head(a, h, dO, lse, Dr, dq, dk, dv, zero, wt);
                else ct_flash_simd_bwd_head(a, h, dO, lse, Dr, dq, dk, dv, zero, wt);
            }
        }
        return;
    }
    float *P = ct_ctx_alloc(ctx, (size_t)2 * BR * BC * sizeof(float));
    for (int64_t h = 0; h < BH; h++) {
        if (zero) zero_head(a, h, dq, dk, dv);
        bwd_head(a, h, dO, lse, Dr, dq, dk, dv, P, P + BR * BC);
    }
}

void ct_bw_flash_attention(ct_ctx *ctx, ct_node *n) {
    ct_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    att a = heads_args(q, k, v, n->i[0] != 0);
    a.scale = (float)n->f[0];
    float *dq = ct_grad_acc(ctx, q), *dk = ct_grad_acc(ctx, k), *dv = ct_grad_acc(ctx, v);
    if (!dq && !dk && !dv) return;
    backward(ctx, &a, q->shape[0] * q->shape[1], n->out->data, n->out->grad->data, n->saved, dq, dk, dv, false);
}

/* dq, dk, dv are the parts of qkv's gradient. A gradient qkv already has gets the op's as
 * one sum, as the unfused chain adds it (its q, k, v gradients start from 0): computed apart,
 * then added. */
void ct_bw_flash_attention_qkv(ct_ctx *ctx, ct_node *n) {
    ct_tensor *qkv = n->in[0];
    att a = qkv_args(qkv, n->i[1], n->i[0] != 0);
    a.y16 = n->out->dtype == CT_BF16; /* the bf16 node ct_bw_lowp hands over as it is */
    bool fresh;
    float *g = ct_grad_acc_fresh(ctx, qkv, &fresh);
    if (!g) return;
    const int64_t N = ct_numel(qkv), C = a.D * a.H;
    float *d = fresh ? g : ct_ctx_alloc(ctx, (size_t)N * sizeof(float));
    backward(ctx, &a, qkv->shape[0] * a.H, n->out->data, n->out->grad->data, n->saved, d, d + C, d + 2 * C, true);
    if (d == g) return;
#pragma omp parallel for if (N >= (1 << 16))
    for (int64_t i = 0; i < N; i++) g[i] += d[i];
}
