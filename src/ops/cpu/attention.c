/* split_heads / merge_heads and plain (materialised) scaled dot-product attention.
 *
 * attention: per head S = q k^T / sqrt(D) (sgemm), masked row softmax, O = P v (sgemm).
 * P [B, H, Tq, Tk] is saved for backward. Causal heads run their GEMMs by blocks of query
 * rows against the visible keys only (the masked upper triangle is never computed). The GEMMs
 * run one head per thread where ctrain's own GEMM takes them all, else head by head with BLAS
 * threading (OpenBLAS must not be entered from several OpenMP threads at once); the
 * softmax passes run over all rows of all heads at once, split by rows with OpenMP.
 * Causal masking is PyTorch's is_causal: query i sees keys j <= i (top-left aligned);
 * masked entries are exactly 0 in P, and rows only touch their visible prefix.
 * attention_qkv: the same on the heads of a packed qkv [B, T, 3C], read in place (GEMM
 * leading dimensions), y written as [B, T, C]: one body for both, by per-tensor head layouts. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/vmath.h"

/* ---- split_heads: [B, T, H*D] -> [B, H, T, D]; merge_heads: the inverse ---- */
typedef enum {
    PH_COPY,      /* f32 rows copied */
    PH_ADD,       /* f32 rows added (gradients) */
    PH_COPY_BF16, /* bf16 rows copied as autocast's f32 copy and conversion back would (NaN quieted) */
    PH_ADD_BF16G  /* f32 rows rounded to bf16 (a bf16 tensor's gradient: autocast's round_to), added */
} ph_mode;
#define PH_BUF 256
/* one row added: never inlined, so that PH_ADD and PH_ADD_BF16G run the same code (bits) */
__attribute__((noinline)) static void add_row(float *restrict d, const float *restrict s, int64_t D) {
#pragma omp simd
    for (int64_t j = 0; j < D; j++) d[j] += s[j];
}
/* dst[b][h][t][:] (op) src[b][t][h*D:] when to_heads, else the other way round */
static void permute_heads(void *dst, const void *src, int64_t B, int64_t T, int64_t H, int64_t D, bool to_heads, ph_mode mode) {
    size_t es = mode == PH_COPY_BF16 ? 2 : 4;
#pragma omp parallel for collapse(2) if (B * T * H * D >= (1 << 16))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t hi = ((b * H + h) * T + t) * D, ti = (b * T + t) * H * D + h * D;
                char *d = (char *)dst + (size_t)(to_heads ? hi : ti) * es;
                const char *s = (const char *)src + (size_t)(to_heads ? ti : hi) * es;
                if (mode == PH_COPY) {
                    memcpy(d, s, (size_t)D * es);
                } else if (mode == PH_ADD) {
                    add_row((float *)d, (const float *)s, D);
                } else if (mode == PH_COPY_BF16) {
                    uint16_t *dh = (uint16_t *)d;
                    const uint16_t *sh = (const uint16_t *)s;
#pragma omp simd
                    for (int64_t j = 0; j < D; j++) dh[j] = ct_k_f32_to_bf16(ct_k_bf16_to_f32(sh[j]));
                } else {
                    float r[PH_BUF];
                    for (int64_t j0 = 0; j0 < D; j0 += PH_BUF) {
                        int64_t m = D - j0 < PH_BUF ? D - j0 : PH_BUF;
                        for (int64_t j = 0; j < m; j++) r[j] = ct_k_round_bf16(((const float *)s)[j0 + j]);
                        add_row((float *)d + j0, r, m);
                    }
                }
            }
}

ct_tensor *ct_split_heads(ct_ctx *ctx, ct_tensor *x, int heads) {
    CT_DEV_DISPATCH(ctx, CT_OP_SPLIT_HEADS, .in = {x}, .i = {heads});
    CT_AUTOCAST(ctx, CT_OP_SPLIT_HEADS, 1, ((ct_tensor **[]){&x}), ct_split_heads(ctx, x, heads));
    CT_CHECK_F32("split_heads", x); CT_CHECK_CONTIG("split_heads", x);
    char sx[96];
    if (x->ndim != 3 || heads < 1 || x->shape[2] % heads)
        CT_FATAL("split_heads: input %s must be [B, T, H*D] with H = %d dividing the last dim", ct_shape_str(x, sx, sizeof sx), heads);
    int64_t B = x->shape[0], T = x->shape[1], H = heads, D = x->shape[2] / heads;
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){B, H, T, D});
    permute_heads(y->data, x->data, B, T, H, D, true, PH_COPY);
    ct_record(ctx, CT_OP_SPLIT_HEADS, y, 1, &x);
    return y;
}
void ct_bw_split_heads(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    const int64_t *s = n->out->shape; /* [B, H, T, D] */
    permute_heads(gx, n->out->grad->data, s[0], s[2], s[1], s[3], false, PH_ADD);
}

/* bf16 x (the attention's output under autocast) is permuted as it is, into a bf16 output in
 * the arena, and its backward rounds the output gradient as it reads it: the bits of
 * autocast's f32 copy, conversion and rounding pass (autocast.c), without those passes. */
ct_tensor *ct_merge_heads(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_MERGE_HEADS, .in = {x});
    bool bf16 = x->dtype == CT_BF16;
    if (bf16 && !ct_is_contiguous(x)) x = ct_contiguous(ctx, x);
    if (!bf16) CT_AUTOCAST(ctx, CT_OP_MERGE_HEADS, 1, ((ct_tensor **[]){&x}), ct_merge_heads(ctx, x));
    if (!bf16) { CT_CHECK_F32("merge_heads", x); CT_CHECK_CONTIG("merge_heads", x); }
    char sx[96];
    if (x->ndim != 4) CT_FATAL("merge_heads: input %s must be [B, H, T, D]", ct_shape_str(x, sx, sizeof sx));
    int64_t B = x->shape[0], H = x->shape[1], T = x->shape[2], D = x->shape[3];
    ct_tensor *y = ct_new(ctx, x->dtype, 3, (int64_t[]){B, T, H * D});
    permute_heads(y->data, x->data, B, T, H, D, false, bf16 ? PH_COPY_BF16 : PH_COPY);
    ct_node *nd = ct_record(ctx, CT_OP_MERGE_HEADS, y, 1, &x);
    if (nd && bf16) nd->op = &ct_op_table_lp[CT_OP_MERGE_HEADS]; /* as ct_ac_leave makes it */
    return y;
}
void ct_bw_merge_heads(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    const int64_t *s = n->in[0]->shape; /* [B, H, T, D] */
    permute_heads(gx, n->out->grad->data, s[0], s[2], s[1], s[3], true, n->out->dtype == CT_BF16 ? PH_ADD_BF16G : PH_ADD);
}

/* ---- attention ---- */
/* number of visible keys for query row i */
static inline int64_t visible(bool causal, int64_t i, int64_t Tk) { return causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk; }
/* keys any row of a block ending (exclusive) at row i1 can see */
static inline int64_t keys_for(bool causal, int64_t i1, int64_t Tk) { return causal ? (i1 < Tk ? i1 : Tk) : Tk; }
/* Causal GEMMs go by blocks of query rows, each against only the keys it can see: with 4
 * blocks that skips 3/8 of the flops of the full square. Non-causal: one block. */
static inline int64_t row_block(bool causal, int64_t Tq, int64_t Tk) {
    if (!causal || Tq < 128 || Tk < 128) return Tq > 0 ? Tq : 1;
    return (Tq + 3) / 4;
}

/* Whether the per-head GEMMs run one head per thread instead of one head at a time. The
 * blocks are small (GPT: 64 x 64..256 x 32, under the GEMM's threading threshold), so one at a
 * time they ran on one thread while the others waited (11% of a 2-thread GPT step). Only where
 * every block goes to ctrain's own GEMM, which any number of threads may enter at once (OpenBLAS
 * may not), and where there are heads enough to share. A GEMM's bits do not depend on the
 * threads it runs on, so both ways give the same result. */
static bool heads_in_parallel(int64_t BH, int64_t RB, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, bool causal) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt < 2 || BH < 2 * nt) return false;
    int64_t rows = Tq - (Tq - 1) / RB * RB, kv = keys_for(causal, RB < Tq ? RB : Tq, Tk); /* smallest block */
    int64_t m = rows < kv ? rows : kv;
    m = m < D ? m : D;
    m = m < Dv ? m : Dv;
    return ct_sgemm_kernel_takes(m, m, m);
}

/* Where one tensor's heads lie: row t of head h = b H + j starts at b bs + j hs + t ld floats
 * from its base. [BH, T, D] contiguous is {D, T D, 0} with H = 1; q of a packed qkv [B, T, 3C]
 * is {3C, T 3C, D} with H heads, k and v the same from base + C and + 2C; y [B, T, C] {C, T C, D}. */
typedef struct {
    int64_t ld, bs, hs;
} layout;

/* one call: BH heads of Tq queries [D] against Tk keys [D] and values [Dv], H heads per batch
 * entry; the gradients have the layouts of their tensors, y and dO layout o */
typedef struct {
    const float *Q, *K, *V;
    int64_t BH, H, Tq, Tk, D, Dv, RB;
    bool causal, par;
    float scale;
    layout q, k, v, o;
} attn;

static inline int64_t head_at(const attn *a, const layout *l, int64_t h) { return h / a->H * l->bs + h % a->H * l->hs; }

static attn make_attn(const float *Q, const float *K, const float *V, int64_t BH, int64_t H, int64_t Tq, int64_t Tk, int64_t D,
                      int64_t Dv, bool causal, layout q, layout k, layout v, layout o) {
    attn a = {Q, K, V, BH, H, Tq, Tk, D, Dv, row_block(causal, Tq, Tk), causal, false, D ? 1.0f / sqrtf((float)D) : 1.0f, q, k, v, o};
    a.par = heads_in_parallel(BH, a.RB, Tq, Tk, D, Dv, causal);
    return a;
}

/* The buffers a head's GEMMs read and write (unused ones NULL) */
typedef struct {
    const float *P, *dO;
    float *out, *dq, *dk;
} head_io;
typedef void (*head_fn)(const attn *a, int64_t h, const head_io *io);

/* fn on every head: in parallel where a->par (the own GEMM takes the blocks), else on this
 * thread outside any OpenMP region. OpenBLAS entered inside one, even an inactive region
 * (`parallel if (0)`), opens a nested team and starts a thread per call (Debian's 0.3.21,
 * OpenMP build: on a CPU without AVX-512, 42,000 thread starts in a 4 s GPT run, and 2
 * threads half as fast as 1). */
static void each_head(const attn *a, head_fn fn, const head_io *io) {
    if (a->par) {
#pragma omp parallel for schedule(static)
        for (int64_t h = 0; h < a->BH; h++) fn(a, h, io);
    } else
        for (int64_t h = 0; h < a->BH; h++) fn(a, h, io);
}

/* S[i0:i1, :kv] = q k^T * scale, into io->out (P) */
static void head_scores(const attn *a, int64_t h, const head_io *io) {
    for (int64_t i0 = 0; i0 < a->Tq; i0 += a->RB) {
        int64_t i1 = i0 + a->RB < a->Tq ? i0 + a->RB : a->Tq, kv = keys_for(a->causal, i1, a->Tk);
        ct_sgemm_ld(false, true, i1 - i0, kv, a->D, a->scale, a->Q + head_at(a, &a->q, h) + i0 * a->q.ld, a->q.ld,
                    a->K + head_at(a, &a->k, h), a->k.ld, 0.0f, io->out + (h * a->Tq + i0) * a->Tk, a->Tk);
    }
}
/* O[i0:i1] = P[i0:i1, :kv] v[:kv], into io->out (Y) */
static void head_values(const attn *a, int64_t h, const head_io *io) {
    for (int64_t i0 = 0; i0 < a->Tq; i0 += a->RB) {
        int64_t i1 = i0 + a->RB < a->Tq ? i0 + a->RB : a->Tq, kv = keys_for(a->causal, i1, a->Tk);
        ct_sgemm_ld(false, false, i1 - i0, a->Dv, kv, 1.0f, io->P + (h * a->Tq + i0) * a->Tk, a->Tk, a->V + head_at(a, &a->v, h),
                    a->v.ld, 0.0f, io->out + head_at(a, &a->o, h) + i0 * a->o.ld, a->o.ld);
    }
}
/* dV[:kv] += P[i0:i1, :kv]^T dO[i0:i1], into io->out (dv); row blocks in a fixed order */
static void head_dv(const attn *a, int64_t h, const head_io *io) {
    for (int64_t i0 = 0; i0 < a->Tq; i0 += a->RB) {
        int64_t i1 = i0 + a->RB < a->Tq ? i0 + a->RB : a->Tq, kv = keys_for(a->causal, i1, a->Tk);
        ct_sgemm_ld(true, false, kv, a->Dv, i1 - i0, 1.0f, io->P + (h * a->Tq + i0) * a->Tk, a->Tk,
                    io->dO + head_at(a, &a->o, h) + i0 * a->o.ld, a->o.ld, 1.0f, io->out + head_at(a, &a->v, h), a->v.ld);
    }
}
/* dP[i0:i1, :kv] = dO[i0:i1] V[:kv]^T, into io->out (dS) */
static void head_dp(const attn *a, int64_t h, const head_io *io) {
    for (int64_t i0 = 0; i0 < a->Tq; i0 += a->RB) {
        int64_t i1 = i0 + a->RB < a->Tq ? i0 + a->RB : a->Tq, kv = keys_for(a->causal, i1, a->Tk);
        ct_sgemm_ld(false, true, i1 - i0, kv, a->Dv, 1.0f, io->dO + head_at(a, &a->o, h) + i0 * a->o.ld, a->o.ld,
                    a->V + head_at(a, &a->v, h), a->v.ld, 0.0f, io->out + (h * a->Tq + i0) * a->Tk, a->Tk);
    }
}
/* dQ[i0:i1] += dS[i0:i1, :kv] K[:kv]; dK[:kv] += dS[i0:i1, :kv]^T Q[i0:i1] (io->P is dS) */
static void head_dqk(const attn *a, int64_t h, const head_io *io) {
    for (int64_t i0 = 0; i0 < a->Tq; i0 += a->RB) {
        int64_t i1 = i0 + a->RB < a->Tq ? i0 + a->RB : a->Tq, kv = keys_for(a->causal, i1, a->Tk);
        const float *dSb = io->P + (h * a->Tq + i0) * a->Tk;
        const int64_t hq = head_at(a, &a->q, h), hk = head_at(a, &a->k, h);
        if (io->dq) ct_sgemm_ld(false, false, i1 - i0, a->D, kv, 1.0f, dSb, a->Tk, a->K + hk, a->k.ld, 1.0f, io->dq + hq + i0 * a->q.ld, a->q.ld);
        if (io->dk) ct_sgemm_ld(true, false, kv, a->D, i1 - i0, 1.0f, dSb, a->Tk, a->Q + hq + i0 * a->q.ld, a->q.ld, 1.0f, io->dk + hk, a->k.ld);
    }
}

/* Y (layout o) = softmax(q k^T * scale) v; P [BH, Tq, Tk] keeps the probabilities */
static void forward(const attn *a, float *P, float *Y) {
    const int64_t BH = a->BH, Tq = a->Tq, Tk = a->Tk;
    const bool causal = a->causal;
    each_head(a, head_scores, &(head_io){.out = P});
    /* softmax over the visible prefix of each row; the rest is exactly 0 */
#pragma omp parallel for if (BH * Tq * Tk >= (1 << 14))
    for (int64_t r = 0; r < BH * Tq; r++) {
        float *p = P + r * Tk;
        int64_t nv = visible(causal, r % Tq, Tk);
        if (nv == 0) continue;
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < nv; j++) m = p[j] > m ? p[j] : m;
        float inv = 1.0f / ct_vexp_sub_sum(p, p, m, nv);
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) p[j] *= inv;
        if (nv < Tk) memset(p + nv, 0, (size_t)(Tk - nv) * sizeof(float));
    }
    each_head(a, head_values, &(head_io){.P = P, .out = Y});
}

/* The gradients added to dq, dk, dv (layouts q, k, v; NULL: not wanted) from dO (layout o) */
static void backward(ct_ctx *ctx, const attn *a, const float *P, const float *dO, float *dq, float *dk, float *dv) {
    const int64_t BH = a->BH, Tq = a->Tq, Tk = a->Tk;
    const bool causal = a->causal;
    /* row blocks in a fixed order within a head (a head is one thread's): the dV / dK
     * accumulation order never depends on threads */
    if (dv) each_head(a, head_dv, &(head_io){.P = P, .dO = dO, .out = dv});
    if (!dq && !dk) return;
    float *dS = ct_ctx_alloc(ctx, (size_t)(BH * Tq * Tk + 1) * sizeof(float));
    each_head(a, head_dp, &(head_io){.dO = dO, .out = dS});
    /* dS = P * (dP - rowsum(dP * P)) * scale; masked entries stay 0 */
#pragma omp parallel for if (BH * Tq * Tk >= (1 << 14))
    for (int64_t r = 0; r < BH * Tq; r++) {
        float *d = dS + r * Tk;
        const float *p = P + r * Tk;
        int64_t nv = visible(causal, r % Tq, Tk);
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < nv; j++) dot += d[j] * p[j];
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) d[j] = ct_k_attn_ds(p[j], d[j], dot, a->scale);
        if (nv < Tk) memset(d + nv, 0, (size_t)(Tk - nv) * sizeof(float));
    }
    each_head(a, head_dqk, &(head_io){.P = dS, .dq = dq, .dk = dk});
}

/* q, k, v [B, H, T, D] contiguous: H = 1 in the layouts, every head its own "batch entry" */
static attn heads_args(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool causal) {
    const int64_t Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    return make_attn(q->data, k->data, v->data, q->shape[0] * q->shape[1], 1, Tq, Tk, D, Dv, causal, (layout){D, Tq * D, 0},
                     (layout){D, Tk * D, 0}, (layout){Dv, Tk * Dv, 0}, (layout){Dv, Tq * Dv, 0});
}

ct_tensor *ct_attention(ct_ctx *ctx, ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal) {
    CT_DEV_DISPATCH(ctx, CT_OP_ATTENTION, .in = {q, k, v}, .i = {causal});
    CT_AUTOCAST(ctx, CT_OP_ATTENTION, 3, ((ct_tensor **[]){&q, &k, &v}), ct_attention(ctx, q, k, v, causal));
    ct_tensor *in[3] = {q, k, v};
    ct_check_attention("attention", q, k, v);
    attn a = heads_args(q, k, v, causal);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){q->shape[0], q->shape[1], a.Tq, a.Dv});
    float *P = ct_ctx_alloc_keep(ctx, (size_t)(a.BH * a.Tq * a.Tk + 1) * sizeof(float));
    forward(&a, P, y->data);
    ct_node *nd = ct_record(ctx, CT_OP_ATTENTION, y, 3, in);
    if (nd) {
        nd->saved = P;
        nd->i[0] = causal;
    }
    return y;
}

void ct_bw_attention(ct_ctx *ctx, ct_node *n) {
    ct_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    attn a = heads_args(q, k, v, n->i[0] != 0);
    float *dq = ct_grad_acc(ctx, q), *dk = ct_grad_acc(ctx, k), *dv = ct_grad_acc(ctx, v);
    backward(ctx, &a, n->saved, n->out->grad->data, dq, dk, dv);
}

/* ---- attention on a packed qkv ---- */
/* The heads of qkv [B, T, 3C] (c_attn's output) read where they lie and y written as
 * [B, T, H, D]: the same GEMMs on the same values as ct_attention on the chain's head-layout
 * copies, hence the same bits, without the copies (nor their mirror in backward). */
static attn qkv_args(const ct_tensor *qkv, int64_t H, bool causal) {
    const int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, D = C / H;
    const float *p = qkv->data;
    layout in = {3 * C, T * 3 * C, D};
    return make_attn(p, p + C, p + 2 * C, B * H, H, T, T, D, D, causal, in, in, in, (layout){C, T * C, D});
}

ct_tensor *ct_attention_qkv(ct_ctx *ctx, ct_tensor *qkv, int n_head, bool causal) {
    CT_DEV_DISPATCH(ctx, CT_OP_ATTENTION_QKV, .in = {qkv}, .i = {n_head, causal});
    CT_AUTOCAST(ctx, CT_OP_ATTENTION_QKV, 1, ((ct_tensor **[]){&qkv}), ct_attention_qkv(ctx, qkv, n_head, causal));
    CT_CHECK_F32("attention_qkv", qkv);
    CT_CHECK_CONTIG("attention_qkv", qkv);
    char sx[96];
    if (qkv->ndim != 3 || n_head < 1 || qkv->shape[2] % (3 * (int64_t)n_head))
        CT_FATAL("attention_qkv: input %s must be [B, T, 3 C] with n_head = %d dividing C", ct_shape_str(qkv, sx, sizeof sx), n_head);
    attn a = qkv_args(qkv, n_head, causal);
    ct_tensor *y = ct_new(ctx, CT_F32, 3, (int64_t[]){qkv->shape[0], a.Tq, n_head * a.D});
    float *P = ct_ctx_alloc_keep(ctx, (size_t)(a.BH * a.Tq * a.Tk + 1) * sizeof(float));
    forward(&a, P, y->data);
    ct_node *nd = ct_record(ctx, CT_OP_ATTENTION_QKV, y, 1, &qkv);
    if (nd) {
        nd->saved = P;
        nd->i[0] = causal;
        nd->i[1] = n_head;
    }
    return y;
}

/* dq, dk, dv are the parts of qkv's gradient. The chain's q, k, v gradients start from 0 and
 * get the GEMMs' sums (beta = 1), then reach qkv through copies that add them to 0: here the
 * same sums into a zeroed buffer, qkv's own where its gradient is fresh, else added after
 * (as the chain adds it). The chain's dO is +0 + y's gradient (a -0 turned +0): it only changes
 * the signs of zeros, which every sum into a zeroed gradient turns +0, so the bits are the same. */
void ct_bw_attention_qkv(ct_ctx *ctx, ct_node *n) {
    ct_tensor *qkv = n->in[0];
    bool fresh;
    float *g = ct_grad_acc_fresh(ctx, qkv, &fresh);
    if (!g) return;
    attn a = qkv_args(qkv, n->i[1], n->i[0] != 0);
    const int64_t N = ct_numel(qkv), C = a.H * a.D;
    float *d = fresh ? g : ct_ctx_alloc(ctx, (size_t)N * sizeof(float));
    memset(d, 0, (size_t)N * sizeof(float));
    backward(ctx, &a, n->saved, n->out->grad->data, d, d + C, d + 2 * C);
    if (d == g) return;
#pragma omp parallel for if (N >= (1 << 16))
    for (int64_t i = 0; i < N; i++) g[i] += d[i];
}
