/* split_heads / merge_heads and plain (materialised) scaled dot-product attention.
 *
 * attention: per head S = q k^T / sqrt(D) (one sgemm), masked row softmax, O = P v (one
 * sgemm). P [B, H, Tq, Tk] is saved for backward. The GEMMs run head by head with BLAS
 * threading (OpenBLAS must not be entered from several OpenMP threads at once); the
 * softmax passes run over all rows of all heads at once, split by rows with OpenMP.
 * Causal masking is PyTorch's is_causal: query i sees keys j <= i (top-left aligned);
 * masked entries are exactly 0 in P, and rows only touch their visible prefix. */
#include <math.h>
#include <string.h>

#include "core/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/vmath.h"

/* ---- split_heads: [B, T, H*D] -> [B, H, T, D]; merge_heads: the inverse ---- */
/* dst[b][h][t][:] (op) src[b][t][h*D:] when to_heads, else the other way round */
static void permute_heads(float *dst, const float *src, int64_t B, int64_t T, int64_t H, int64_t D, bool to_heads, bool acc) {
#pragma omp parallel for collapse(2) if (B * T * H * D >= (1 << 16))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t hi = ((b * H + h) * T + t) * D, ti = (b * T + t) * H * D + h * D;
                float *d = dst + (to_heads ? hi : ti);
                const float *s = src + (to_heads ? ti : hi);
                if (acc) {
#pragma omp simd
                    for (int64_t j = 0; j < D; j++) d[j] += s[j];
                } else {
                    memcpy(d, s, (size_t)D * sizeof(float));
                }
            }
}

ct_tensor *ct_split_heads(ct_ctx *ctx, ct_tensor *x, int heads) {
    CT_CHECK_F32("split_heads", x); CT_CHECK_CONTIG("split_heads", x);
    char sx[96];
    if (x->ndim != 3 || heads < 1 || x->shape[2] % heads)
        CT_FATAL("split_heads: input %s must be [B, T, H*D] with H = %d dividing the last dim", ct_shape_str(x, sx, sizeof sx), heads);
    int64_t B = x->shape[0], T = x->shape[1], H = heads, D = x->shape[2] / heads;
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){B, H, T, D});
    permute_heads(y->data, x->data, B, T, H, D, true, false);
    ct_record(ctx, CT_OP_SPLIT_HEADS, y, 1, &x);
    return y;
}
void ct_bw_split_heads(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    const int64_t *s = n->out->shape; /* [B, H, T, D] */
    permute_heads(gx, n->out->grad->data, s[0], s[2], s[1], s[3], false, true);
}

ct_tensor *ct_merge_heads(ct_ctx *ctx, ct_tensor *x) {
    CT_CHECK_F32("merge_heads", x); CT_CHECK_CONTIG("merge_heads", x);
    char sx[96];
    if (x->ndim != 4) CT_FATAL("merge_heads: input %s must be [B, H, T, D]", ct_shape_str(x, sx, sizeof sx));
    int64_t B = x->shape[0], H = x->shape[1], T = x->shape[2], D = x->shape[3];
    ct_tensor *y = ct_new(ctx, CT_F32, 3, (int64_t[]){B, T, H * D});
    permute_heads(y->data, x->data, B, T, H, D, false, false);
    ct_record(ctx, CT_OP_MERGE_HEADS, y, 1, &x);
    return y;
}
void ct_bw_merge_heads(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    const int64_t *s = n->in[0]->shape; /* [B, H, T, D] */
    permute_heads(gx, n->out->grad->data, s[0], s[2], s[1], s[3], true, true);
}

/* ---- attention ---- */
/* number of visible keys for query row i */
static inline int64_t visible(bool causal, int64_t i, int64_t Tk) { return causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk; }

ct_tensor *ct_attention(ct_ctx *ctx, ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal) {
    ct_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) { CT_CHECK_F32("attention", in[i]); CT_CHECK_CONTIG("attention", in[i]); }
    char s1[96], s2[96], s3[96];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || q->shape[0] != k->shape[0] || q->shape[1] != k->shape[1] ||
        q->shape[3] != k->shape[3] || v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1] || v->shape[2] != k->shape[2])
        CT_FATAL("attention: q %s, k %s, v %s: need [B, H, Tq, D], [B, H, Tk, D], [B, H, Tk, Dv]", ct_shape_str(q, s1, sizeof s1),
                 ct_shape_str(k, s2, sizeof s2), ct_shape_str(v, s3, sizeof s3));
    int64_t BH = q->shape[0] * q->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    float scale = D ? 1.0f / sqrtf((float)D) : 1.0f;
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){q->shape[0], q->shape[1], Tq, Dv});
    float *P = ct_ctx_alloc(ctx, (size_t)(BH * Tq * Tk + 1) * sizeof(float));
    const float *Q = q->data, *K = k->data, *V = v->data;
    for (int64_t h = 0; h < BH; h++)
        ct_sgemm(false, true, Tq, Tk, D, scale, Q + h * Tq * D, K + h * Tk * D, 0.0f, P + h * Tq * Tk);
    /* softmax over the visible prefix of each row; the rest is exactly 0 */
#pragma omp parallel for if (BH * Tq * Tk >= (1 << 14))
    for (int64_t r = 0; r < BH * Tq; r++) {
        float *p = P + r * Tk;
        int64_t nv = visible(causal, r % Tq, Tk);
        if (nv == 0) continue;
        float m = -INFINITY;
        for (int64_t j = 0; j < nv; j++) m = p[j] > m ? p[j] : m;
        float inv = 1.0f / ct_vexp_sub_sum(p, p, m, nv);
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) p[j] *= inv;
        if (nv < Tk) memset(p + nv, 0, (size_t)(Tk - nv) * sizeof(float));
    }
    float *Y = y->data;
    for (int64_t h = 0; h < BH; h++) ct_sgemm(false, false, Tq, Dv, Tk, 1.0f, P + h * Tq * Tk, V + h * Tk * Dv, 0.0f, Y + h * Tq * Dv);
    ct_node *nd = ct_record(ctx, CT_OP_ATTENTION, y, 3, in);
    if (nd) {
        nd->saved = P;
        nd->i[0] = causal;
        nd->f[0] = scale;
    }
    return y;
}

void ct_bw_attention(ct_ctx *ctx, ct_node *n) {
    ct_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    int64_t BH = q->shape[0] * q->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    bool causal = n->i[0];
    float scale = (float)n->f[0];
    const float *P = n->saved, *dO = n->out->grad->data, *Q = q->data, *K = k->data, *V = v->data;
    float *dq = ct_grad_acc(ctx, q), *dk = ct_grad_acc(ctx, k), *dv = ct_grad_acc(ctx, v);
    if (dv)
        for (int64_t h = 0; h < BH; h++) /* dV += P^T dO */
            ct_sgemm(true, false, Tk, Dv, Tq, 1.0f, P + h * Tq * Tk, dO + h * Tq * Dv, 1.0f, dv + h * Tk * Dv);
    if (!dq && !dk) return;
    float *dS = ct_ctx_alloc(ctx, (size_t)(BH * Tq * Tk + 1) * sizeof(float));
    for (int64_t h = 0; h < BH; h++) /* dP = dO V^T */
        ct_sgemm(false, true, Tq, Tk, Dv, 1.0f, dO + h * Tq * Dv, V + h * Tk * Dv, 0.0f, dS + h * Tq * Tk);
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
        for (int64_t j = 0; j < nv; j++) d[j] = p[j] * (d[j] - dot) * scale;
        if (nv < Tk) memset(d + nv, 0, (size_t)(Tk - nv) * sizeof(float));
    }
    for (int64_t h = 0; h < BH; h++) {
        if (dq) ct_sgemm(false, false, Tq, D, Tk, 1.0f, dS + h * Tq * Tk, K + h * Tk * D, 1.0f, dq + h * Tq * D); /* dQ += dS K */
        if (dk) ct_sgemm(true, false, Tk, D, Tq, 1.0f, dS + h * Tq * Tk, Q + h * Tq * D, 1.0f, dk + h * Tk * D); /* dK += dS^T Q */
    }
}
