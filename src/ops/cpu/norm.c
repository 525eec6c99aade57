/* layer_norm and rms_norm over the last dim.
 *
 * layer_norm (nn.LayerNorm): y = (x - mean) * rstd * w + b, biased
 * variance. Forward keeps mean and rstd per row (2 floats) for backward.
 *
 * Rows are split over threads. The weight/bias gradients are sums over rows: each fixed
 * block of rows writes its partial sums, then the partials are added in block order, so
 * the result is the same for any thread count. */
#include <math.h>
#include <string.h>

#include "ops/kmath.h"
#include "ops/op_table.h"
#include "ctrain/ops.h"

static void check_affine(const char *what, const ct_tensor *p, const ct_tensor *x, int64_t D) {
    if (!p) return;
    CT_CHECK_F32("layer_norm", p); CT_CHECK_CONTIG("layer_norm", p);
    if (p->ndim != 1 || p->shape[0] != D) {
        char sp[96], sx[96];
        CT_FATAL("layer_norm: %s %s does not match the last dim of %s", what, ct_shape_str(p, sp, sizeof sp), ct_shape_str(x, sx, sizeof sx));
    }
}

ct_tensor *ct_layer_norm_lowp(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, float eps) {
    ct_dtype ac = ct_autocast_dtype(ctx);
    /* all f32: autocast leaves the op alone (an f32 op), so the device forward's 16-bit y is
     * the result as it is */
    if (ac != CT_F32 && x->device.type != CT_DEV_CPU && x->dtype == CT_F32 && (!w || w->dtype == CT_F32) &&
        (!b || b->dtype == CT_F32))
        CT_DEV_DISPATCH(ctx, CT_OP_LAYER_NORM, .in = {x, w, b}, .i = {ac}, .f = {eps});
    return ct_layer_norm(ctx, x, w, b, eps);
}

ct_tensor *ct_layer_norm(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, float eps) {
    CT_DEV_DISPATCH(ctx, CT_OP_LAYER_NORM, .in = {x, w, b}, .f = {eps});
    CT_AUTOCAST(ctx, CT_OP_LAYER_NORM, 3, ((ct_tensor **[]){&x, &w, &b}), ct_layer_norm(ctx, x, w, b, eps));
    CT_CHECK_F32("layer_norm", x); CT_CHECK_CONTIG("layer_norm", x);
    CT_CHECK(x->ndim >= 1, "layer_norm: input must have at least one dim");
    int64_t D = x->shape[x->ndim - 1], R = D ? ct_numel(x) / D : 0;
    check_affine("weight", w, x, D);
    check_affine("bias", b, x, D);
    ct_tensor *y = ct_new_like(ctx, x);
    float *stats = ct_ctx_alloc_keep(ctx, (size_t)(2 * R + 1) * sizeof(float)); /* mean, rstd per row */
    const float *X = x->data, *W = w ? w->data : NULL, *B = b ? b->data : NULL;
    float *Y = y->data;
#pragma omp parallel for if (R * D >= (1 << 14))
    for (int64_t r = 0; r < R; r++) {
        const float *xr = X + r * D;
        float *yr = Y + r * D;
        /* two passes over an L1-resident row: no cancellation in the variance */
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++) s += xr[j];
        float mean = s / (float)D, v = 0;
#pragma omp simd reduction(+ : v)
        for (int64_t j = 0; j < D; j++) v += (xr[j] - mean) * (xr[j] - mean);
        float rstd = 1.0f / sqrtf(v / (float)D + eps);
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
        if (W && B) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mean) * rstd * W[j] + B[j];
        } else if (W) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mean) * rstd * W[j];
        } else if (B) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mean) * rstd + B[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mean) * rstd;
        }
    }
    /* inputs: x, then w and b only when given (their slots are found by flags in i[]) */
    ct_tensor *in[3] = {x, w, b};
    ct_node *nd = ct_record(ctx, CT_OP_LAYER_NORM, y, 3, in);
    if (nd) {
        nd->saved = stats;
        nd->i[0] = R; nd->i[1] = D;
    }
    return y;
}

#define LN_ROWS 32 /* rows per backward task: fixed, so partial sums never depend on threads */

void ct_bw_layer_norm(ct_ctx *ctx, ct_node *n) {
    int64_t R = n->i[0], D = n->i[1];
    const float *X = n->in[0]->data, *G = n->out->grad->data, *st = n->saved;
    const float *W = n->in[1] ? n->in[1]->data : NULL;
    bool fresh; /* gx unzeroed: written as +0 + value, the bits of adding to zeros */
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    float *gw = ct_grad_acc(ctx, n->in[1]), *gb = ct_grad_acc(ctx, n->in[2]);
    int64_t nblk = (R + LN_ROWS - 1) / LN_ROWS;
    /* per row block: partial sums of g * xhat (weight) and g (bias), reduced in block order below */
    float *part = (gw || gb) ? ct_ctx_alloc(ctx, (size_t)(2 * nblk * D + 1) * sizeof(float)) : NULL;
#pragma omp parallel for if (R * D >= (1 << 13))
    for (int64_t k = 0; k < nblk; k++) {
        float *pw = part ? part + 2 * k * D : NULL, *pb = part ? pw + D : NULL;
        if (part) memset(pw, 0, (size_t)(2 * D) * sizeof(float));
        int64_t r1 = (k + 1) * LN_ROWS < R ? (k + 1) * LN_ROWS : R;
        for (int64_t r = k * LN_ROWS; r < r1; r++) {
            const float *xr = X + r * D, *g = G + r * D;
            float mean = st[2 * r], rstd = st[2 * r + 1];
            if (part) {
#pragma omp simd
                for (int64_t j = 0; j < D; j++) {
                    pw[j] += g[j] * ((xr[j] - mean) * rstd);
                    pb[j] += g[j];
                }
            }
            if (!gx) continue;
            /* gx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w */
            float *o = gx + r * D, s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
            for (int64_t j = 0; j < D; j++) {
                float gwj = W ? g[j] * W[j] : g[j];
                s1 += gwj;
                s2 += gwj * ((xr[j] - mean) * rstd);
            }
            s1 /= (float)D;
            s2 /= (float)D;
#pragma omp simd
            for (int64_t j = 0; j < D; j++) {
                float gwj = W ? g[j] * W[j] : g[j];
                o[j] = (fresh ? 0.0f : o[j]) + ct_k_ln_dx(gwj, xr[j], mean, rstd, s1, s2);
            }
        }
    }
    if (!part) return;
#pragma omp parallel for if (nblk * D >= (1 << 15))
    for (int64_t j = 0; j < D; j++) {
        double sw = 0, sb = 0;
        for (int64_t k = 0; k < nblk; k++) {
            sw += part[2 * k * D + j];
            sb += part[(2 * k + 1) * D + j];
        }
        if (gw) gw[j] += (float)sw;
        if (gb) gb[j] += (float)sb;
    }
}

/* ---- rms_norm (Hugging Face's LlamaRMSNorm): y = (x * rstd) * w, rstd = 1/sqrt(mean(x^2) + eps).
 * Forward keeps rstd per row; the weight gradient is reduced in fixed row blocks as above. */
ct_tensor *ct_rms_norm_lowp(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, float eps) {
    ct_dtype ac = ct_autocast_dtype(ctx);
    if (ac != CT_F32 && x->device.type != CT_DEV_CPU && x->dtype == CT_F32 && (!w || w->dtype == CT_F32))
        CT_DEV_DISPATCH(ctx, CT_OP_RMS_NORM, .in = {x, w}, .i = {ac}, .f = {eps}); /* as ct_layer_norm_lowp */
    return ct_rms_norm(ctx, x, w, eps);
}

ct_tensor *ct_rms_norm(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, float eps) {
    CT_DEV_DISPATCH(ctx, CT_OP_RMS_NORM, .in = {x, w}, .f = {eps});
    CT_AUTOCAST(ctx, CT_OP_RMS_NORM, 2, ((ct_tensor **[]){&x, &w}), ct_rms_norm(ctx, x, w, eps));
    CT_CHECK_F32("rms_norm", x); CT_CHECK_CONTIG("rms_norm", x);
    CT_CHECK(x->ndim >= 1, "rms_norm: input must have at least one dim");
    int64_t D = x->shape[x->ndim - 1], R = D ? ct_numel(x) / D : 0;
    if (w) {
        CT_CHECK_F32("rms_norm", w); CT_CHECK_CONTIG("rms_norm", w);
        if (w->ndim != 1 || w->shape[0] != D) {
            char sw[96], sx[96];
            CT_FATAL("rms_norm: weight %s does not match the last dim of %s", ct_shape_str(w, sw, sizeof sw), ct_shape_str(x, sx, sizeof sx));
        }
    }
    ct_tensor *y = ct_new_like(ctx, x);
    float *rstd = ct_ctx_alloc_keep(ctx, (size_t)(R + 1) * sizeof(float));
    const float *X = x->data, *W = w ? w->data : NULL;
    float *Y = y->data;
#pragma omp parallel for if (R * D >= (1 << 14))
    for (int64_t r = 0; r < R; r++) {
        const float *xr = X + r * D;
        float *yr = Y + r * D, s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++) s += xr[j] * xr[j];
        float rs = 1.0f / sqrtf(s / (float)D + eps);
        rstd[r] = rs;
        if (W) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] * rs) * W[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * rs;
        }
    }
    ct_node *nd = ct_record(ctx, CT_OP_RMS_NORM, y, 2, (ct_tensor *[]){x, w});
    if (nd) {
        nd->saved = rstd;
        nd->i[0] = R; nd->i[1] = D;
    }
    return y;
}

void ct_bw_rms_norm(ct_ctx *ctx, ct_node *n) {
    int64_t R = n->i[0], D = n->i[1];
    const float *X = n->in[0]->data, *G = n->out->grad->data, *rstd = n->saved;
    const float *W = n->in[1] ? n->in[1]->data : NULL;
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    float *gw = ct_grad_acc(ctx, n->in[1]);
    int64_t nblk = (R + LN_ROWS - 1) / LN_ROWS;
    float *part = gw ? ct_ctx_alloc(ctx, (size_t)(nblk * D + 1) * sizeof(float)) : NULL; /* per block: sum g * xhat */
#pragma omp parallel for if (R * D >= (1 << 13))
    for (int64_t k = 0; k < nblk; k++) {
        float *pw = part ? part + k * D : NULL;
        if (pw) memset(pw, 0, (size_t)D * sizeof(float));
        int64_t r1 = (k + 1) * LN_ROWS < R ? (k + 1) * LN_ROWS : R;
        for (int64_t r = k * LN_ROWS; r < r1; r++) {
            const float *xr = X + r * D, *g = G + r * D;
            float rs = rstd[r];
            if (pw) {
#pragma omp simd
                for (int64_t j = 0; j < D; j++) pw[j] += g[j] * (xr[j] * rs);
            }
            if (!gx) continue;
            /* gx = rstd * (gw - xhat * mean(gw * xhat)), gw = g * w */
            float *o = gx + r * D, s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < D; j++) s += (W ? g[j] * W[j] : g[j]) * (xr[j] * rs);
            s /= (float)D;
#pragma omp simd
            for (int64_t j = 0; j < D; j++) {
                float gwj = W ? g[j] * W[j] : g[j];
                o[j] = (fresh ? 0.0f : o[j]) + rs * (gwj - (xr[j] * rs) * s);
            }
        }
    }
    if (!part) return;
#pragma omp parallel for if (nblk * D >= (1 << 15))
    for (int64_t j = 0; j < D; j++) {
        double sw = 0;
        for (int64_t k = 0; k < nblk; k++) sw += part[k * D + j];
        gw[j] += (float)sw;
    }
}
