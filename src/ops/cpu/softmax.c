/* softmax, log_softmax (last dim), cross_entropy (with ignore_index), mse_loss.
 * Rows are independent, so OpenMP splits rows; inside a row the passes are plain loops
 * (max, exp+sum, scale) over a row that stays in L1. Loss reductions sum per-row terms in
 * double in row order: thread-count independent and within f32 rounding of PyTorch. */
#include <math.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/vmath.h"

static int64_t last_dim(const ct_tensor *x) { return x->ndim ? x->shape[x->ndim - 1] : 1; }

static inline float row_max(const float *x, int64_t D) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < D; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* ---- softmax ---- */
ct_tensor *ct_softmax(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_SOFTMAX, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_SOFTMAX, 1, ((ct_tensor **[]){&x}), ct_softmax(ctx, x));
    CT_CHECK_F32("softmax", x); CT_CHECK_CONTIG("softmax", x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t D = last_dim(x), R = D ? ct_numel(x) / D : 0;
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (R * D >= (1 << 13))
    for (int64_t r = 0; r < R; r++) {
        const float *xr = X + r * D;
        float *yr = Y + r * D;
        float m = row_max(xr, D);
        float s = ct_vexp_sub_sum(yr, xr, m, D);
        float inv = 1.0f / s;
        for (int64_t j = 0; j < D; j++) yr[j] *= inv;
    }
    ct_node *nd = ct_record(ctx, CT_OP_SOFTMAX, y, 1, &x);
    if (nd) nd->i[0] = D;
    return y;
}
void ct_bw_softmax(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t D = n->i[0], R = D ? ct_numel(n->out) / D : 0;
    const float *G = n->out->grad->data, *Y = n->out->data;
#pragma omp parallel for if (R * D >= (1 << 14))
    for (int64_t r = 0; r < R; r++) {
        const float *g = G + r * D, *y = Y + r * D;
        float *o = gx + r * D;
        /* g - dot cancels where g is near the row's mean: a double dot keeps that exact */
        double dd = 0;
#pragma omp simd reduction(+ : dd)
        for (int64_t j = 0; j < D; j++) dd += (double)g[j] * y[j];
        float dot = (float)dd;
#pragma omp simd
        for (int64_t j = 0; j < D; j++) o[j] += ct_k_softmax_bwd(y[j], g[j], dot);
    }
}

/* ---- log_softmax ---- */
ct_tensor *ct_log_softmax(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_LOG_SOFTMAX, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_LOG_SOFTMAX, 1, ((ct_tensor **[]){&x}), ct_log_softmax(ctx, x));
    CT_CHECK_F32("log_softmax", x); CT_CHECK_CONTIG("log_softmax", x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t D = last_dim(x), R = D ? ct_numel(x) / D : 0;
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (R * D >= (1 << 13))
    for (int64_t r = 0; r < R; r++) {
        const float *xr = X + r * D;
        float *yr = Y + r * D;
        float m = row_max(xr, D);
        float s = ct_vexp_sub_sum(yr, xr, m, D); /* yr used as scratch */
        float lse = ct_k_attn_lse(m, s);
        for (int64_t j = 0; j < D; j++) yr[j] = ct_k_log_softmax_out(xr[j], lse);
    }
    ct_node *nd = ct_record(ctx, CT_OP_LOG_SOFTMAX, y, 1, &x);
    if (nd) nd->i[0] = D;
    return y;
}
void ct_bw_log_softmax(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t D = n->i[0], R = D ? ct_numel(n->out) / D : 0;
    const float *G = n->out->grad->data, *Y = n->out->data;
#pragma omp parallel for if (R * D >= (1 << 13))
    for (int64_t r = 0; r < R; r++) {
        const float *g = G + r * D, *y = Y + r * D;
        float *o = gx + r * D;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++) s += g[j];
#pragma omp simd
        for (int64_t j = 0; j < D; j++) o[j] += ct_k_log_softmax_bwd(y[j], g[j], s);
    }
}

/* ---- cross_entropy ---- */
static inline int64_t target_at(const ct_tensor *t, int64_t r) {
    return t->dtype == CT_I64 ? ((const int64_t *)t->data)[r] : (int64_t)((const int32_t *)t->data)[r];
}

ct_tensor *ct_cross_entropy(ct_ctx *ctx, ct_tensor *logits, ct_tensor *target, int64_t ignore_index) {
    CT_DEV_DISPATCH(ctx, CT_OP_CROSS_ENTROPY, .in = {logits, target}, .i = {ignore_index});
    CT_AUTOCAST(ctx, CT_OP_CROSS_ENTROPY, 1, ((ct_tensor **[]){&logits}), ct_cross_entropy(ctx, logits, target, ignore_index));
    CT_CHECK_F32("cross_entropy", logits); CT_CHECK_CONTIG("cross_entropy", logits);
    CT_CHECK_CONTIG("cross_entropy", target);
    char sl[96], st[96];
    if (target->dtype != CT_I32 && target->dtype != CT_I64)
        CT_FATAL("cross_entropy: target must be i32 or i64 class indices, got %s", ct_shape_str(target, st, sizeof st));
    if (logits->ndim != 2 || target->ndim != 1 || target->shape[0] != logits->shape[0])
        CT_FATAL("cross_entropy: logits %s and target %s: need [N, C] and [N]", ct_shape_str(logits, sl, sizeof sl),
                 ct_shape_str(target, st, sizeof st));
    int64_t N = logits->shape[0], C = logits->shape[1];
    for (int64_t r = 0; r < N; r++) {
        int64_t t = target_at(target, r);
        if (t != ignore_index && (t < 0 || t >= C))
            CT_FATAL("cross_entropy: target %lld at row %lld out of range for %lld classes (logits %s)", (long long)t,
                     (long long)r, (long long)C, ct_shape_str(logits, sl, sizeof sl));
    }
    /* per-row log-sum-exp, kept for backward */
    float *lse = ct_ctx_alloc_keep(ctx, (size_t)(N ? N : 1) * sizeof(float));
    const float *X = logits->data;
#pragma omp parallel for if (N * C >= (1 << 13))
    for (int64_t r = 0; r < N; r++) {
        const float *xr = X + r * C;
        float m = row_max(xr, C);
        lse[r] = m + logf(ct_vexp_sum(xr, m, C));
    }
    double s = 0;
    int64_t cnt = 0;
    for (int64_t r = 0; r < N; r++) {
        int64_t t = target_at(target, r);
        if (t == ignore_index) continue;
        s += (double)lse[r] - (double)X[r * C + t];
        cnt++;
    }
    ct_tensor *y = ct_new(ctx, CT_F32, 0, NULL);
    ct_f32(y)[0] = cnt ? (float)(s / (double)cnt) : NAN; /* all ignored: 0/0, as PyTorch */
    ct_node *nd = ct_record(ctx, CT_OP_CROSS_ENTROPY, y, 1, &logits);
    if (nd) {
        nd->saved = lse;
        nd->saved_t[0] = target;
        nd->i[0] = N; nd->i[1] = C; nd->i[2] = cnt; nd->i[3] = ignore_index;
    }
    return y;
}
void ct_bw_cross_entropy(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    int64_t N = n->i[0], C = n->i[1], cnt = n->i[2], ign = n->i[3];
    if (!gx || cnt == 0) return;
    const float *X = n->in[0]->data, *lse = n->saved;
    const ct_tensor *target = n->saved_t[0];
    float g = ct_f32(n->out->grad)[0] / (float)cnt;
#pragma omp parallel for if (N * C >= (1 << 13))
    for (int64_t r = 0; r < N; r++) {
        int64_t t = target_at(target, r);
        if (t == ign) continue;
        const float *xr = X + r * C;
        float *o = gx + r * C, l = lse[r];
#pragma omp simd
        for (int64_t j = 0; j < C; j++) o[j] += g * ct_vexpf(xr[j] - l);
        o[t] -= g;
    }
}

/* ---- mse_loss (mean) ---- */
ct_tensor *ct_mse_loss(ct_ctx *ctx, ct_tensor *a, ct_tensor *b) {
    CT_DEV_DISPATCH(ctx, CT_OP_MSE_LOSS, .in = {a, b});
    CT_AUTOCAST(ctx, CT_OP_MSE_LOSS, 2, ((ct_tensor **[]){&a, &b}), ct_mse_loss(ctx, a, b));
    CT_CHECK_F32("mse_loss", a); CT_CHECK_F32("mse_loss", b);
    CT_CHECK_CONTIG("mse_loss", a); CT_CHECK_CONTIG("mse_loss", b);
    CT_CHECK_SAME_SHAPE("mse_loss", a, b);
    int64_t n = ct_numel(a);
    const float *A = a->data, *B = b->data;
    double s = 0;
    /* fixed 4096-element blocks summed in order: same result for any thread count */
    int64_t nb = (n + 4095) / 4096;
    double *part = ct_ctx_alloc(ctx, (size_t)(nb ? nb : 1) * sizeof(double));
#pragma omp parallel for if (n >= (1 << 16))
    for (int64_t k = 0; k < nb; k++) {
        int64_t e = (k + 1) * 4096 < n ? (k + 1) * 4096 : n;
        double p = 0;
#pragma omp simd reduction(+ : p)
        for (int64_t i = k * 4096; i < e; i++) {
            float d = A[i] - B[i];
            p += (double)(d * d);
        }
        part[k] = p;
    }
    for (int64_t k = 0; k < nb; k++) s += part[k];
    ct_tensor *y = ct_new(ctx, CT_F32, 0, NULL);
    ct_f32(y)[0] = n ? (float)(s / (double)n) : NAN;
    ct_node *nd = ct_record(ctx, CT_OP_MSE_LOSS, y, 2, (ct_tensor *[]){a, b});
    if (nd) nd->i[0] = n;
    return y;
}
void ct_bw_mse_loss(ct_ctx *ctx, ct_node *n) {
    int64_t N = n->i[0];
    if (N == 0) return;
    const float *A = n->in[0]->data, *B = n->in[1]->data;
    float g = ct_k_mse_scale(ct_f32(n->out->grad)[0], N);
    float *ga = ct_grad_acc(ctx, n->in[0]);
    if (ga)
#pragma omp parallel for simd if (N >= (1 << 16))
        for (int64_t i = 0; i < N; i++) ga[i] += ct_k_mse_grad(A[i], B[i], g);
    float *gb = ct_grad_acc(ctx, n->in[1]);
    if (gb)
#pragma omp parallel for simd if (N >= (1 << 16))
        for (int64_t i = 0; i < N; i++) gb[i] -= ct_k_mse_grad(A[i], B[i], g);
}
