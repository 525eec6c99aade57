/* embedding: w [V, D], idx [...] of i32/i64 → [..., D] (nn.Embedding, no padding_idx).
 * Backward scatters rows of the gradient into w's gradient. Repeated indices make that a
 * reduction, so threads split the columns (never the rows): each gradient element is
 * summed by one thread in index order, the same for any thread count. */
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"

static inline int64_t idx_at(const ct_tensor *t, int64_t r) {
    return t->dtype == CT_I64 ? ((const int64_t *)t->data)[r] : (int64_t)((const int32_t *)t->data)[r];
}

ct_tensor *ct_embedding(ct_ctx *ctx, ct_tensor *w, ct_tensor *idx) {
    CT_DEV_DISPATCH(ctx, CT_OP_EMBEDDING, .in = {w, idx});
    CT_AUTOCAST(ctx, CT_OP_EMBEDDING, 1, ((ct_tensor **[]){&w}), ct_embedding(ctx, w, idx));
    char sw[96], si[96];
    CT_CHECK_F32("embedding", w); CT_CHECK_CONTIG("embedding", w); CT_CHECK_CONTIG("embedding", idx);
    if (w->ndim != 2) CT_FATAL("embedding: weight must be [V, D], got %s", ct_shape_str(w, sw, sizeof sw));
    if (idx->dtype != CT_I32 && idx->dtype != CT_I64)
        CT_FATAL("embedding: indices must be i32 or i64, got %s", ct_shape_str(idx, si, sizeof si));
    if (idx->ndim >= CT_MAX_DIMS)
        CT_FATAL("embedding: indices %s have too many dims", ct_shape_str(idx, si, sizeof si));
    int64_t V = w->shape[0], D = w->shape[1], n = ct_numel(idx);
    for (int64_t r = 0; r < n; r++) {
        int64_t t = idx_at(idx, r);
        if (t < 0 || t >= V)
            CT_FATAL("embedding: index %lld at position %lld out of range for weight %s", (long long)t, (long long)r,
                     ct_shape_str(w, sw, sizeof sw));
    }
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, idx->shape, (size_t)idx->ndim * sizeof *shape);
    shape[idx->ndim] = D;
    ct_tensor *y = ct_new(ctx, CT_F32, idx->ndim + 1, shape);
    const float *W = w->data;
    float *Y = y->data;
#pragma omp parallel for if (n * D >= (1 << 16))
    for (int64_t r = 0; r < n; r++) memcpy(Y + r * D, W + idx_at(idx, r) * D, (size_t)D * sizeof(float));
    ct_node *nd = ct_record(ctx, CT_OP_EMBEDDING, y, 1, &w);
    if (nd) { nd->saved_t[0] = idx; nd->i[0] = n; nd->i[1] = D; }
    return y;
}

void ct_bw_embedding(ct_ctx *ctx, ct_node *n) {
    float *gw = ct_grad_acc(ctx, n->in[0]);
    if (!gw) return;
    const ct_tensor *idx = n->saved_t[0];
    int64_t N = n->i[0], D = n->i[1];
    const float *G = n->out->grad->data;
    int64_t nblk = (D + 63) / 64; /* 64-column (256-byte) blocks */
#pragma omp parallel for if (N * D >= (1 << 16) && nblk > 1)
    for (int64_t k = 0; k < nblk; k++) {
        int64_t j0 = k * 64, j1 = j0 + 64 < D ? j0 + 64 : D;
        for (int64_t r = 0; r < N; r++) {
            float *dst = gw + idx_at(idx, r) * D;
            const float *src = G + r * D;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) dst[j] += src[j];
        }
    }
}
