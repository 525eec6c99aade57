/* Views: reshape, flatten, transpose, slice share storage with their input; contiguous
 * copies. Every gradient is contiguous in its tensor's own shape, so a view's backward
 * scatters its gradient through the view's strides into the input's gradient. */
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"

/* Offset under `stride` of row `row` of a row-major walk over shape[0..ndim-2] (rows of
 * the innermost dimension): each row found on its own, so rows can be split over threads. */
static int64_t row_offset(int64_t row, const int64_t *shape, const int64_t *stride, int ndim) {
    int64_t off = 0;
    for (int d = ndim - 2; d >= 0; d--) {
        off += (row % shape[d]) * stride[d];
        row /= shape[d];
    }
    return off;
}

/* Rows (innermost dimension) of `shape` and their length. */
static int64_t rows_of(const int64_t *shape, int ndim, int64_t *inner) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    *inner = ndim ? shape[ndim - 1] : 1;
    return *inner ? n / *inner : 0;
}

/* Threshold in elements for splitting a strided pass over threads: a pure copy or add per
 * element, so the split never changes a bit. */
#define PAR_STRIDED (1 << 16)

/* dst (contiguous) = src (strided under sstride) */
static void strided_copy(char *dst, const char *src, const int64_t *shape, const int64_t *sstride, int ndim, size_t esz) {
    int64_t inner, rows = rows_of(shape, ndim, &inner);
    int64_t is = ndim ? sstride[ndim - 1] : 1;
#pragma omp parallel for if (rows * inner >= PAR_STRIDED)
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = row_offset(r, shape, sstride, ndim), o = r * inner;
        if (esz == 4) {
            const float *s = (const float *)src + off;
            float *d = (float *)dst + o;
            for (int64_t j = 0; j < inner; j++) d[j] = s[j * is];
        } else {
            for (int64_t j = 0; j < inner; j++) memcpy(dst + (o + j) * (int64_t)esz, src + (off + j * is) * (int64_t)esz, esz);
        }
    }
}

/* dst (strided, f32) += src (contiguous, same shape); fresh: dst is unwritten memory that
 * the walk covers entirely, written as +0 + src (the bits of adding to a zeroed buffer,
 * without the zeroing pass) */
static void strided_add(float *dst, const int64_t *dstride, const float *src, const int64_t *shape, int ndim, bool fresh) {
    int64_t inner, rows = rows_of(shape, ndim, &inner);
    int64_t ds = ndim ? dstride[ndim - 1] : 1;
#pragma omp parallel for if (rows * inner >= PAR_STRIDED)
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + row_offset(r, shape, dstride, ndim);
        const float *s = src + r * inner;
        if (fresh)
            for (int64_t j = 0; j < inner; j++) d[j * ds] = 0.0f + s[j];
        else
            for (int64_t j = 0; j < inner; j++) d[j * ds] += s[j];
    }
}

/* d += s, or d = +0 + s where d is a fresh (unzeroed) gradient buffer */
static void add_inplace(float *d, const float *s, int64_t n, bool fresh) {
    if (fresh) {
#pragma omp parallel for simd if (n >= PAR_STRIDED)
        for (int64_t i = 0; i < n; i++) d[i] = 0.0f + s[i];
    } else {
#pragma omp parallel for simd if (n >= PAR_STRIDED)
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    }
}

/* The whole gradient of a view's input from its output's (same element count, contiguous) */
static void bw_same_size(ct_ctx *ctx, ct_node *n) {
    bool fresh;
    float *gi = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    if (gi) add_inplace(gi, n->out->grad->data, ct_numel(n->out), fresh);
}

static ct_tensor *view_of(ct_ctx *ctx, ct_tensor *x) {
    ct_tensor *v = ct_ctx_alloc(ctx, sizeof *v);
    *v = *x;
    v->grad = NULL;
    v->node = NULL;
    v->flags = 0;
    v->param_id = -1;
    v->uses = 0;
    v->params = NULL;
    v->name = NULL;
    return v;
}

ct_tensor *ct_contiguous(ct_ctx *ctx, ct_tensor *x) {
    if (ct_is_contiguous(x)) return x;
    CT_DEV_DISPATCH(ctx, CT_OP_CONTIGUOUS, .in = {x});
    ct_tensor *y = ct_new(ctx, x->dtype, x->ndim, x->shape);
    strided_copy(y->data, x->data, x->shape, x->stride, x->ndim, ct_dtype_size(x->dtype));
    ct_record(ctx, CT_OP_CONTIGUOUS, y, 1, &x);
    return y;
}
void ct_bw_contiguous(ct_ctx *ctx, ct_node *n) { bw_same_size(ctx, n); }

ct_tensor *ct_reshape(ct_ctx *ctx, ct_tensor *x, int ndim, const int64_t *shape) {
    CT_CHECK(ndim >= 0 && ndim <= CT_MAX_DIMS, "reshape to %d dims", ndim);
    int64_t known = 1, n = ct_numel(x);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) { CT_CHECK(infer < 0, "reshape: more than one -1"); infer = i; }
        else known *= shape[i];
    }
    int64_t sh[CT_MAX_DIMS];
    memcpy(sh, shape, (size_t)ndim * sizeof *sh);
    if (infer >= 0) sh[infer] = known ? n / known : 0;
    int64_t m = 1;
    for (int i = 0; i < ndim; i++) m *= sh[i];
    if (m != n) {
        char b[96];
        CT_FATAL("reshape: cannot view %s as %d dims with %lld elements", ct_shape_str(x, b, sizeof b), ndim, (long long)m);
    }
    x = ct_contiguous(ctx, x);
    ct_tensor *y = view_of(ctx, x);
    y->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) { y->shape[i] = sh[i]; y->stride[i] = s; s *= sh[i]; }
    ct_record(ctx, CT_OP_RESHAPE, y, 1, &x);
    return y;
}
void ct_bw_reshape(ct_ctx *ctx, ct_node *n) { bw_same_size(ctx, n); }

ct_tensor *ct_flatten(ct_ctx *ctx, ct_tensor *x, int start_dim) {
    CT_CHECK(start_dim >= 0 && start_dim < x->ndim, "flatten: start_dim %d for %d-d tensor", start_dim, x->ndim);
    int64_t sh[CT_MAX_DIMS], last = 1;
    for (int i = 0; i < start_dim; i++) sh[i] = x->shape[i];
    for (int i = start_dim; i < x->ndim; i++) last *= x->shape[i];
    sh[start_dim] = last;
    return ct_reshape(ctx, x, start_dim + 1, sh);
}

ct_tensor *ct_transpose(ct_ctx *ctx, ct_tensor *x, int d0, int d1) {
    CT_CHECK(d0 >= 0 && d0 < x->ndim && d1 >= 0 && d1 < x->ndim, "transpose(%d, %d) of %d-d tensor", d0, d1, x->ndim);
    ct_tensor *y = view_of(ctx, x);
    y->shape[d0] = x->shape[d1]; y->shape[d1] = x->shape[d0];
    y->stride[d0] = x->stride[d1]; y->stride[d1] = x->stride[d0];
    ct_node *n = ct_record(ctx, CT_OP_TRANSPOSE, y, 1, &x);
    if (n) { n->i[0] = d0; n->i[1] = d1; }
    return y;
}
void ct_bw_transpose(ct_ctx *ctx, ct_node *n) {
    ct_tensor *x = n->in[0];
    bool fresh; /* a transpose covers all of x */
    float *gi = ct_grad_acc_fresh(ctx, x, &fresh);
    if (!gi) return;
    /* x's gradient is contiguous in x's shape; view it with the transposed strides */
    int64_t st[CT_MAX_DIMS], s = 1;
    for (int i = x->ndim - 1; i >= 0; i--) { st[i] = s; s *= x->shape[i]; }
    int d0 = (int)n->i[0], d1 = (int)n->i[1];
    int64_t t = st[d0]; st[d0] = st[d1]; st[d1] = t;
    strided_add(gi, st, n->out->grad->data, n->out->shape, n->out->ndim, fresh);
}

ct_tensor *ct_slice(ct_ctx *ctx, ct_tensor *x, int dim, int64_t start, int64_t len) {
    CT_CHECK(dim >= 0 && dim < x->ndim, "slice: dim %d of %d-d tensor", dim, x->ndim);
    if (start < 0 || len < 0 || start + len > x->shape[dim]) {
        char b[96];
        CT_FATAL("slice: [%lld, %lld) out of range for dim %d of %s", (long long)start, (long long)(start + len), dim, ct_shape_str(x, b, sizeof b));
    }
    ct_tensor *y = view_of(ctx, x);
    y->shape[dim] = len;
    y->data = (char *)x->data + start * x->stride[dim] * (int64_t)ct_dtype_size(x->dtype);
    ct_node *n = ct_record(ctx, CT_OP_SLICE, y, 1, &x);
    if (n) { n->i[0] = dim; n->i[1] = start; }
    return y;
}
void ct_bw_slice(ct_ctx *ctx, ct_node *n) {
    ct_tensor *x = n->in[0];
    float *gi = ct_grad_acc(ctx, x);
    if (!gi) return;
    int64_t st[CT_MAX_DIMS], s = 1;
    for (int i = x->ndim - 1; i >= 0; i--) { st[i] = s; s *= x->shape[i]; }
    int dim = (int)n->i[0];
    strided_add(gi + n->i[1] * st[dim], st, n->out->grad->data, n->out->shape, n->out->ndim, false);
}

ct_tensor *ct_pad_rows(ct_ctx *ctx, ct_tensor *x, int64_t rows) {
    CT_DEV_DISPATCH(ctx, CT_OP_PAD_ROWS, .in = {x}, .i = {rows});
    int64_t shape[CT_MAX_DIMS];
    ct_check_pad_rows(x, rows, shape);
    ct_tensor *y = ct_new(ctx, x->dtype, x->ndim, shape);
    size_t xb = (size_t)ct_numel(x) * ct_dtype_size(x->dtype), yb = (size_t)ct_numel(y) * ct_dtype_size(x->dtype);
    memcpy(y->data, x->data, xb);
    memset((char *)y->data + xb, 0, yb - xb);
    ct_record(ctx, CT_OP_PAD_ROWS, y, 1, &x);
    return y;
}
void ct_bw_pad_rows(ct_ctx *ctx, ct_node *n) { /* x's rows come first in y's gradient */
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    if (gx) add_inplace(gx, n->out->grad->data, ct_numel(n->in[0]), fresh);
}
