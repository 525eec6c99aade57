/* Llama's attention helpers: rotary position embedding (Hugging Face's rotate_half
 * convention) and repeat_kv for grouped-query attention.
 *
 * rope rotates each pair (x_j, x_{j+h}), h = D/2, by the angle pos * theta^(-2j/D): a
 * rotation, so backward is the same rotation by the negative angle. The cos/sin table
 * [T, h] is computed once per call in f32 as transformers computes it (inv_freq in f32,
 * angle = float(pos) * inv_freq) and kept for backward.
 *
 * repeat_kv copies each key/value head n_rep times; its backward sums the n_rep gradients of
 * a group into the head. (A fused attention kernel that indexes the shared head instead is
 * the faster way; this one lets the existing attention ops serve grouped-query attention.)
 * Both are per element or per head, split statically over threads: any thread count gives
 * the same bits. */
#include <math.h>
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"

static inline int64_t pos_at(const ct_tensor *p, int64_t t) {
    if (!p) return t;
    return p->dtype == CT_I64 ? ((const int64_t *)p->data)[t] : (int64_t)((const int32_t *)p->data)[t];
}

/* inv_freq[j] = theta^(-2j/D), then Llama 3.1's scaling, in f32 step by step as transformers'
 * _compute_llama3_parameters (a Python scalar meets an f32 tensor as an f32; x / s as x * (1 / s)
 * only where torch does so: division by a tensor stays a division) */
static float inv_freq_at(float theta, int64_t j, int64_t D, const ct_rope_scaling *s) {
    float inv = 1.0f / powf(theta, (float)(2 * j) / (float)D);
    if (!s || s->factor == 0) return inv;
    const double old = s->original_max_position_embeddings;
    const float lo_wl = (float)(old / s->low_freq_factor), hi_wl = (float)(old / s->high_freq_factor);
    const float factor = s->factor, wl = (1.0f / inv) * (float)(2 * M_PI);
    float f = wl > lo_wl ? inv / factor : inv;
    if (!(wl < hi_wl) && !(wl > lo_wl)) {
        float sm = ((1.0f / wl) * (float)old - s->low_freq_factor) / (float)((double)s->high_freq_factor - s->low_freq_factor);
        f = (1.0f - sm) * f / factor + sm * f;
    }
    return f;
}

ct_tensor *ct_rope(ct_ctx *ctx, ct_tensor *x, ct_tensor *pos, float theta) { return ct_rope_scaled(ctx, x, pos, theta, NULL); }

ct_tensor *ct_rope_scaled(ct_ctx *ctx, ct_tensor *x, ct_tensor *pos, float theta, const ct_rope_scaling *rs) {
    if (rs && rs->factor == 0) rs = NULL;
    if (rs)
        CT_CHECK(rs->factor > 0 && rs->low_freq_factor > 0 && rs->high_freq_factor > rs->low_freq_factor &&
                     rs->original_max_position_embeddings > 0,
                 "rope: scaling factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d out of range",
                 (double)rs->factor, (double)rs->low_freq_factor, (double)rs->high_freq_factor, rs->original_max_position_embeddings);
    const ct_rope_scaling none = {0, 0, 0, 0}, *sc = rs ? rs : &none;
    CT_DEV_DISPATCH(ctx, CT_OP_ROPE, .in = {x, pos}, .f = {theta, sc->factor, sc->low_freq_factor, sc->high_freq_factor},
                    .i = {sc->original_max_position_embeddings});
    CT_AUTOCAST(ctx, CT_OP_ROPE, 1, ((ct_tensor **[]){&x}), ct_rope_scaled(ctx, x, pos, theta, rs));
    CT_CHECK_F32("rope", x);
    int64_t R, T, D;
    ct_check_rope_shapes(x, pos, theta, &R, &T, &D);
    int64_t h = D / 2;
    /* cs: [T, h] cosines then [T, h] sines */
    float *cs = ct_ctx_alloc_keep(ctx, (size_t)(2 * T * h + 1) * sizeof(float));
    for (int64_t j = 0; j < h; j++) {
        float inv = inv_freq_at(theta, j, D, rs);
        for (int64_t t = 0; t < T; t++) {
            float a = (float)pos_at(pos, t) * inv;
            cs[t * h + j] = cosf(a);
            cs[T * h + t * h + j] = sinf(a);
        }
    }
    ct_tensor *y = ct_new_like(ctx, x);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (R * T * D >= (1 << 15))
    for (int64_t rt = 0; rt < R * T; rt++) {
        const float *xr = X + rt * D, *c = cs + (rt % T) * h, *s = cs + T * h + (rt % T) * h;
        float *yr = Y + rt * D;
#pragma omp simd
        for (int64_t j = 0; j < h; j++) {
            yr[j] = xr[j] * c[j] - xr[j + h] * s[j];
            yr[j + h] = xr[j + h] * c[j] + xr[j] * s[j];
        }
    }
    ct_node *nd = ct_record(ctx, CT_OP_ROPE, y, 1, &x);
    if (nd) {
        nd->saved = cs;
        nd->i[0] = R; nd->i[1] = T; nd->i[2] = D;
    }
    return y;
}

void ct_bw_rope(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t R = n->i[0], T = n->i[1], D = n->i[2], h = D / 2;
    const float *G = n->out->grad->data, *cs = n->saved;
#pragma omp parallel for if (R * T * D >= (1 << 15))
    for (int64_t rt = 0; rt < R * T; rt++) {
        const float *g = G + rt * D, *c = cs + (rt % T) * h, *s = cs + T * h + (rt % T) * h;
        float *o = gx + rt * D;
#pragma omp simd
        for (int64_t j = 0; j < h; j++) {
            float a = g[j] * c[j] + g[j + h] * s[j], b = g[j + h] * c[j] - g[j] * s[j];
            o[j] += a;
            o[j + h] += b;
        }
    }
}

ct_tensor *ct_repeat_kv(ct_ctx *ctx, ct_tensor *x, int n_rep) {
    CT_CHECK(n_rep >= 1, "repeat_kv: n_rep %d must be at least 1", n_rep);
    if (n_rep == 1) return x; /* as transformers: the tensor itself */
    CT_DEV_DISPATCH(ctx, CT_OP_REPEAT_KV, .in = {x}, .i = {n_rep});
    CT_AUTOCAST(ctx, CT_OP_REPEAT_KV, 1, ((ct_tensor **[]){&x}), ct_repeat_kv(ctx, x, n_rep));
    char sx[96];
    CT_CHECK_F32("repeat_kv", x); CT_CHECK_CONTIG("repeat_kv", x);
    if (x->ndim != 4) CT_FATAL("repeat_kv: input %s must be [B, H, T, D]", ct_shape_str(x, sx, sizeof sx));
    int64_t BH = x->shape[0] * x->shape[1], TD = x->shape[2] * x->shape[3];
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){x->shape[0], x->shape[1] * n_rep, x->shape[2], x->shape[3]});
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (BH * n_rep * TD >= (1 << 16))
    for (int64_t k = 0; k < BH * n_rep; k++) memcpy(Y + k * TD, X + (k / n_rep) * TD, (size_t)TD * sizeof(float));
    ct_node *nd = ct_record(ctx, CT_OP_REPEAT_KV, y, 1, &x);
    if (nd) {
        nd->i[0] = BH; nd->i[1] = TD; nd->i[2] = n_rep;
    }
    return y;
}

void ct_bw_repeat_kv(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t BH = n->i[0], TD = n->i[1], rep = n->i[2];
    const float *G = n->out->grad->data;
    /* one thread per source head: its group's gradients added in head order */
#pragma omp parallel for if (BH * rep * TD >= (1 << 16))
    for (int64_t k = 0; k < BH; k++)
        for (int64_t r = 0; r < rep; r++) {
            const float *g = G + (k * rep + r) * TD;
            float *o = gx + k * TD;
#pragma omp simd
            for (int64_t j = 0; j < TD; j++) o[j] += g[j];
        }
}
