/* conv2d, max_pool2d, relu_max_pool2d and avg_pool2d in the op table's device column (NCHW,
 * f32, or bf16/f16 under autocast). Convolution and average pooling run on cuDNN's C API
 * (cudnn_lib.h); max pooling on
 * pool.cu's kernels, because the CPU op gives a tied window's gradient to the first maximum
 * in scan order (and to a NaN), which cuDNN does not promise: the kernels keep the arg-max,
 * as the CPU op does, and route gradients exactly as it does.
 *
 * Convolution algorithms: cuDNN's heuristic list (cudnnGet*Algorithm_v7), taking the first
 * that fits a 256 MiB workspace, runs in plain f32 (CUDNN_FMA_MATH: no TF32, like the GEMMs)
 * and sums directly (implicit/explicit GEMM or direct: no FFT or Winograd, whose transforms
 * round differently and would need a looser tolerance than the CPU op's 1e-5), preferring
 * deterministic ones; a non-deterministic one only when nothing else is offered. Gradients
 * of parameters accumulate (beta = 1); fresh gradient buffers are written (beta = 0).
 *
 * bf16/f16 (autocast's rounded tensors): the convolution runs in f32 on the operands widened
 * (exactly), the bias is added in f32 and y rounded once, and backward runs in f32 on the
 * widened operands and the f32 output gradient: the CPU's autocast arithmetic, so the CPU's
 * max-pooling choices and gradients (conv_fwd_lowp and conv_bwd_lowp say what 16-bit cuDNN
 * did on an H200). Not on tensor cores: the price of matching the CPU in a small CNN. */
#include <limits.h>
#include <string.h>

#include "core/kernel.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"
#include "cuda/cudnn_lib.h"
#include "ops/op_table.h"

#define WS_MAX ((size_t)256 << 20)

typedef struct {
    ct_ctx *ctx;
    int dev;
    cudaStream_t s;
    const char *op;
    ct_dtype dt; /* of the tensors cuDNN reads and writes: f32, bf16 or f16 */
} step;

/* false when the context has failed already or the device cannot be used */
static bool start(ct_ctx *ctx, ct_device d, const char *op, ct_dtype dt, step *r) {
    *r = (step){ctx, d.index, NULL, op, dt};
    if (ct_ctx_status(ctx) != CT_OK) return false;
    ct_status st = ct_cuda_set_device(d.index, op);
    if (st == CT_OK) st = ct_cuda_stream(d.index, CT_CUDA_COMPUTE, &r->s);
    return ct_ctx_fail(ctx, st) == CT_OK;
}
/* a gradient buffer nothing was written to (an empty batch): +0 where it is fresh */
static ct_status zero_if_fresh(step *r, float *g, bool fresh, int64_t n) {
    return g && fresh && n > 0 ? ct_cuda_fill(r->s, g, 0.0f, n) : CT_OK;
}

/* ---- descriptors ---- */
typedef struct {
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnPoolingDescriptor_t pool;
} descs;
static void descs_free(descs *d) {
    if (d->x) (void)ct_cudnn.cudnnDestroyTensorDescriptor(d->x);
    if (d->y) (void)ct_cudnn.cudnnDestroyTensorDescriptor(d->y);
    if (d->b) (void)ct_cudnn.cudnnDestroyTensorDescriptor(d->b);
    if (d->w) (void)ct_cudnn.cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) (void)ct_cudnn.cudnnDestroyConvolutionDescriptor(d->conv);
    if (d->pool) (void)ct_cudnn.cudnnDestroyPoolingDescriptor(d->pool);
}
static cudnnDataType_t data_type(const step *r) {
    return r->dt == CT_BF16 ? CUDNN_DATA_BFLOAT16 : r->dt == CT_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}
static bool lowp(const step *r) { return r->dt != CT_F32; }
/* the cast kernels' name for r's low-precision type */
static ct_cuda_cast_type cast_type(const step *r) { return r->dt == CT_BF16 ? CT_CUDA_CAST_BF16 : CT_CUDA_CAST_F16; }
/* cuDNN's 4-d descriptors count in int */
static ct_status fits_int(const step *r, const int64_t *s) {
    if (s[0] * s[1] * s[2] * s[3] <= INT_MAX) return CT_OK;
    return ct_error(CT_ERR_UNSUPPORTED, "%s on cuda:%d: [%lld, %lld, %lld, %lld] has more than INT_MAX elements (cuDNN's limit)",
                    r->op, r->dev, (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
}
static ct_status tensor4(const step *r, cudnnTensorDescriptor_t *t, const int64_t *s) {
    ct_status st = fits_int(r, s);
    if (st != CT_OK) return st;
    CT_GPU_TRY(cudnn, r->op, ct_cudnn.cudnnCreateTensorDescriptor(t));
    return CT_GPU_CHECK(cudnn, r->op,
                        ct_cudnn.cudnnSetTensor4dDescriptor(*t, CUDNN_TENSOR_NCHW, data_type(r), (int)s[0], (int)s[1], (int)s[2], (int)s[3]));
}
/* x, y, w, the convolution, and b ([1, O, 1, 1]) when has_bias */
static ct_status conv_descs(const step *r, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y, bool has_bias, int stride,
                            int pad, descs *d) {
    const int64_t *ws = w->shape, bs[4] = {1, w->shape[0], 1, 1};
    CT_GPU_TRY(cudnn, r->op, tensor4(r, &d->x, x->shape));
    CT_GPU_TRY(cudnn, r->op, tensor4(r, &d->y, y->shape));
    if (has_bias) CT_GPU_TRY(cudnn, r->op, tensor4(r, &d->b, bs));
    CT_GPU_TRY(cudnn, r->op, ct_cudnn.cudnnCreateFilterDescriptor(&d->w));
    CT_GPU_TRY(cudnn, r->op, ct_cudnn.cudnnSetFilter4dDescriptor(d->w, data_type(r), CUDNN_TENSOR_NCHW, (int)ws[0], (int)ws[1],
                                                                 (int)ws[2], (int)ws[3]));
    CT_GPU_TRY(cudnn, r->op, ct_cudnn.cudnnCreateConvolutionDescriptor(&d->conv));
    CT_GPU_TRY(cudnn, r->op, ct_cudnn.cudnnSetConvolution2dDescriptor(d->conv, pad, pad, stride, stride, 1, 1,
                                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    /* f32: no TF32; bf16/f16: tensor cores, exact products of the rounded values */
    return CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnSetConvolutionMathType(d->conv, lowp(r) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
}

/* ---- algorithm choice ---- */
typedef struct {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnDeterminism_t det;
    cudnnMathType_t math;
} cand;
/* the first usable candidate (deterministic if any is) among the algorithms in `plain` (a
 * bit mask); *k its index */
static ct_status pick(const step *r, const cand *c, int n, unsigned plain, const char *what, int *k) {
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++)
            if (c[i].status == CUDNN_STATUS_SUCCESS && c[i].memory <= WS_MAX && (plain >> c[i].algo & 1u) &&
                (lowp(r) || (c[i].math != CUDNN_TENSOR_OP_MATH && c[i].math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) &&
                (pass == 1 || c[i].det == CUDNN_DETERMINISTIC)) {
                *k = i;
                return CT_OK;
            }
    return ct_error(CT_ERR_UNSUPPORTED, "%s on cuda:%d: cuDNN offers no plain %s %s algorithm within %zu MiB of workspace (%d considered)",
                    r->op, r->dev, ct_dtype_name(r->dt), what, WS_MAX >> 20, n);
}
/* Declares `algo` (AlgoT) and `mem`: cuDNN's heuristic query fn into Perf[], pick's choice,
 * and the device's workspace grown to it (h, ws); st says whether it worked. */
#define CHOOSE(r, AlgoT, Perf, N, plain, what, fn, ...)                                                               \
    AlgoT algo = (AlgoT)0;                                                                                             \
    size_t mem = 0;                                                                                                    \
    {                                                                                                                  \
        Perf p_[N];                                                                                                    \
        cand c_[N];                                                                                                    \
        int n_ = 0, k_ = 0;                                                                                            \
        st = CT_GPU_CHECK(cudnn, (r)->op, ct_cudnn.fn(__VA_ARGS__, N, &n_, p_));                                      \
        for (int i_ = 0; i_ < n_ && i_ < N; i_++)                                                                      \
            c_[i_] = (cand){(int)p_[i_].algo, p_[i_].status, p_[i_].memory, p_[i_].determinism, p_[i_].mathType};       \
        if (st == CT_OK) st = pick(r, c_, n_ < N ? n_ : N, plain, what, &k_);                                          \
        if (st == CT_OK) { algo = p_[k_].algo; mem = p_[k_].memory; }                                                  \
        if (st == CT_OK) st = ct_cudnn_handle((r)->dev, (r)->s, mem, &h, &ws, (r)->op);                               \
    }
#define FWD_PLAIN 0xFu  /* implicit GEMM, precomputed implicit GEMM, GEMM, direct */
#define DATA_PLAIN 0x3u /* algorithms 0 and 1 */
#define FILT_PLAIN 0xBu /* algorithms 0, 1 and 3 */

/* ---- conv2d: y = conv(x, w) + b ---- */
/* y's data yd = conv(xd, wd) + bd, all of r's dtype (x, w, b, y give the shapes) */
static ct_status conv_fwd(step *r, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, const ct_tensor *y, const void *xd,
                          const void *wd, const void *bd, void *yd, int stride, int pad) {
    descs d = {0};
    cudnnHandle_t h;
    void *ws;
    const float one = 1.0f, zero = 0.0f;
    ct_status st = ct_cudnn_handle(r->dev, r->s, 0, &h, &ws, r->op);
    if (st == CT_OK) st = conv_descs(r, x, w, y, b != NULL, stride, pad, &d);
    if (st != CT_OK) {
        descs_free(&d);
        return st;
    }
    CHOOSE(r, cudnnConvolutionFwdAlgo_t, cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, FWD_PLAIN, "forward",
           cudnnGetConvolutionForwardAlgorithm_v7, h, d.x, d.w, d.conv, d.y);
    if (st == CT_OK)
        st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnConvolutionForward(h, &one, d.x, xd, d.w, wd, d.conv, algo, ws, mem, &zero,
                                                                        d.y, yd));
    if (st == CT_OK && b) st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnAddTensor(h, &one, d.b, bd, &one, d.y, yd));
    descs_free(&d);
    return st;
}

/* f32, bf16 or f16, one dtype for all (autocast casts every operand of conv2d) */
static void check_dtypes(const char *op, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b) {
    CT_CHECK(x->dtype == CT_F32 || x->dtype == CT_BF16 || x->dtype == CT_F16, "%s on cuda:%d: a %s input", op, x->device.index,
             ct_dtype_name(x->dtype));
    CT_CHECK((!w || w->dtype == x->dtype) && (!b || b->dtype == x->dtype), "%s on cuda:%d: %s input with %s parameters", op,
             x->device.index, ct_dtype_name(x->dtype), ct_dtype_name(w && w->dtype != x->dtype ? w->dtype : b->dtype));
}

/* t (r's low-precision type) widened into f32 device scratch; NULL for a NULL t, or when the
 * context has failed (*st says which) */
static float *widen(step *r, const ct_tensor *t, ct_status *st) {
    if (!t || *st != CT_OK) return NULL;
    float *f = ct_ctx_dev_alloc(r->ctx, (ct_device){CT_DEV_CUDA, r->dev}, (size_t)(ct_numel(t) > 0 ? ct_numel(t) : 1) * sizeof(float), r->op);
    *st = f ? ct_cuda_cast(r->s, t->data, cast_type(r), f, CT_CUDA_CAST_F32, ct_numel(t)) : ct_ctx_status(r->ctx);
    return *st == CT_OK ? f : NULL;
}
/* bf16/f16: the convolution and the bias in f32 on the widened operands, rounded once into y,
 * as the CPU's autocast computes it. cuDNN's 16-bit configuration rounds the sums before it
 * adds the bias and rounds again, and on an H200 (2026-12-04) those 1-ulp differences moved
 * the maxima of the next max pooling, which took the CNN's weight gradients 4 % (f16) to
 * 41 % (bf16) away from the CPU's. */
static ct_status conv_fwd_lowp(step *r, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_tensor *y, int stride, int pad) {
    ct_status st = CT_OK;
    float *x32 = widen(r, x, &st), *w32 = widen(r, w, &st), *b32 = widen(r, b, &st), *y32 = NULL;
    if (st == CT_OK) {
        y32 = ct_ctx_dev_alloc(r->ctx, (ct_device){CT_DEV_CUDA, r->dev}, (size_t)ct_numel(y) * sizeof(float), r->op);
        if (!y32) st = ct_ctx_status(r->ctx);
    }
    step r32 = *r;
    r32.dt = CT_F32;
    if (st == CT_OK) st = conv_fwd(&r32, x, w, b, y, x32, w32, b32, y32, stride, pad);
    if (st == CT_OK) st = ct_cuda_cast(r->s, y32, CT_CUDA_CAST_F32, y->data, cast_type(r), ct_numel(y));
    float *scratch[4] = {x32, w32, b32, y32};
    for (int i = 0; i < 4; i++)
        if (scratch[i]) ct_ctx_dev_free_(r->ctx, scratch[i]);
    return st;
}

static ct_tensor *fwd_conv2d(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *w = a->in[1], *b = a->in[2];
    int stride = (int)a->i[0], pad = (int)a->i[1];
    int64_t shape[4] = {x->shape[0], w->shape[0], 0, 0};
    check_dtypes("conv2d", x, w, b);
    ct_check_conv2d_shapes(x, w, b, stride, pad, &shape[2], &shape[3]);
    step r;
    bool go = start(ctx, x->device, "conv2d", x->dtype, &r);
    ct_tensor *y = ct_new_on(ctx, x->device, x->dtype, 4, shape, "conv2d");
    if (go && y->data && ct_numel(y) > 0)
        ct_ctx_fail(ctx, lowp(&r) ? conv_fwd_lowp(&r, x, w, b, y, stride, pad)
                                  : conv_fwd(&r, x, w, b, y, x->data, w->data, b ? b->data : NULL, y->data, stride, pad));
    ct_node *n = ct_record(ctx, CT_OP_CONV2D, y, b ? 3 : 2, (ct_tensor *[]){x, w, b});
    if (n) { n->i[0] = stride; n->i[1] = pad; }
    return y;
}

/* dx, dw, db (each may be NULL) from dy and the forward's operands xd, wd, all of r's dtype:
 * written where fresh, else added to */
static ct_status conv_bwd(step *r, const ct_node *n, const void *xd, const void *wd, const void *dy, void *dx, bool fx, void *dw,
                          bool fw, void *db, bool fb) {
    const ct_tensor *x = n->in[0], *w = n->in[1], *y = n->out;
    descs d = {0};
    cudnnHandle_t h;
    void *ws;
    const float one = 1.0f, bx = fx ? 0.0f : 1.0f, bw = fw ? 0.0f : 1.0f, bb = fb ? 0.0f : 1.0f;
    ct_status st = ct_cudnn_handle(r->dev, r->s, 0, &h, &ws, r->op);
    if (st == CT_OK) st = conv_descs(r, x, w, y, db != NULL, (int)n->i[0], (int)n->i[1], &d);
    if (st == CT_OK && db)
        st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnConvolutionBackwardBias(h, &one, d.y, dy, &bb, d.b, db));
    if (st == CT_OK && dx) {
        CHOOSE(r, cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, DATA_PLAIN,
               "backward-data", cudnnGetConvolutionBackwardDataAlgorithm_v7, h, d.w, d.y, d.conv, d.x);
        if (st == CT_OK)
            st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnConvolutionBackwardData(h, &one, d.w, wd, d.y, dy, d.conv, algo, ws, mem,
                                                                                 &bx, d.x, dx));
    }
    if (st == CT_OK && dw) {
        CHOOSE(r, cudnnConvolutionBwdFilterAlgo_t, cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
               FILT_PLAIN, "backward-filter", cudnnGetConvolutionBackwardFilterAlgorithm_v7, h, d.x, d.y, d.conv, d.w);
        if (st == CT_OK)
            st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnConvolutionBackwardFilter(h, &one, d.x, xd, d.y, dy, d.conv, algo, ws,
                                                                                   mem, &bw, d.w, dw));
    }
    descs_free(&d);
    return st;
}

/* n elements of r's low-precision type in backward scratch (NULL: the context has failed) */
static void *scratch16(step *r, int64_t n) {
    return ct_ctx_dev_alloc(r->ctx, (ct_device){CT_DEV_CUDA, r->dev}, (size_t)(n > 0 ? n : 1) * 2, r->op);
}
/* the f32 gradient g (fresh: written) += src, n values of r's low-precision type */
static ct_status add_lowp(step *r, float *g, bool fresh, const void *src, int64_t n) {
    if (!g || n == 0) return CT_OK;
    if (fresh) return ct_cuda_cast(r->s, src, cast_type(r), g, CT_CUDA_CAST_F32, n);
    float *t = ct_ctx_dev_alloc(r->ctx, (ct_device){CT_DEV_CUDA, r->dev}, (size_t)n * sizeof(float), r->op);
    if (!t) return ct_ctx_status(r->ctx);
    ct_status st = ct_cuda_cast(r->s, src, cast_type(r), t, CT_CUDA_CAST_F32, n);
    return st == CT_OK ? ct_cuda_add(r->s, g, t, g, n, n) : st;
}
/* an f32 gradient dy (holding low-precision values: rounded by autocast) as a copy in r's type */
static const void *dy_lowp(step *r, const float *dy, int64_t n) {
    void *c = scratch16(r, n);
    if (c && ct_ctx_fail(r->ctx, ct_cuda_cast(r->s, dy, CT_CUDA_CAST_F32, c, cast_type(r), n)) != CT_OK) return NULL;
    return c;
}

/* bf16/f16: the backward runs in f32 on the operands widened (exactly: they hold rounded
 * values) and on the f32 dy, as the CPU's autocast computes it. Not in 16 bits: cuDNN has no
 * bf16 bias gradient (CUDNN_STATUS_NOT_SUPPORTED on an H200, 2026-12-04). */
static ct_status conv_bwd_lowp(step *r, const ct_node *n, float *dx, bool fx, float *dw, bool fw, float *db, bool fb) {
    ct_status st = CT_OK;
    float *x32 = dw ? widen(r, n->in[0], &st) : NULL, *w32 = dx ? widen(r, n->in[1], &st) : NULL;
    step r32 = *r;
    r32.dt = CT_F32;
    if (st == CT_OK) st = conv_bwd(&r32, n, x32, w32, n->out->grad->data, dx, fx, dw, fw, db, fb);
    if (x32) ct_ctx_dev_free_(r->ctx, x32);
    if (w32) ct_ctx_dev_free_(r->ctx, w32);
    return st;
}

static void bw_conv2d(ct_ctx *ctx, ct_node *n) {
    step r;
    if (!start(ctx, n->out->device, "conv2d backward", n->in[0]->dtype, &r)) return;
    bool fx = false, fw = false, fb = false;
    float *dx = ct_grad_acc_fresh(ctx, n->in[0], &fx), *dw = ct_grad_acc_fresh(ctx, n->in[1], &fw);
    float *db = n->nin > 2 && n->in[2] ? ct_grad_acc_fresh(ctx, n->in[2], &fb) : NULL;
    if (!dx && !dw && !db) return;
    ct_status st;
    if (ct_numel(n->in[0]) == 0 || ct_numel(n->out) == 0) { /* an empty batch: nothing to add */
        st = zero_if_fresh(&r, dx, fx, ct_numel(n->in[0]));
        if (st == CT_OK) st = zero_if_fresh(&r, dw, fw, ct_numel(n->in[1]));
        if (st == CT_OK) st = zero_if_fresh(&r, db, fb, n->in[1]->shape[0]);
    } else {
        st = lowp(&r) ? conv_bwd_lowp(&r, n, dx, fx, dw, fw, db, fb)
                       : conv_bwd(&r, n, n->in[0]->data, n->in[1]->data, n->out->grad->data, dx, fx, dw, fw, db, fb);
    }
    ct_ctx_fail(ctx, st);
}

/* ---- pooling ---- */
static ct_cuda_pool_geom pool_geom_of(const ct_tensor *x, const ct_tensor *y, int64_t k, int64_t s, int64_t p) {
    return (ct_cuda_pool_geom){x->shape[0] * x->shape[1], x->shape[2], x->shape[3], y->shape[2], y->shape[3], k, s, p};
}

/* average pooling (count_include_pad: every window counts k*k) on cuDNN: forward (dy NULL)
 * y = avg(x); backward dx = avg'(dy) + beta dx; dy and dx of r's dtype */
static ct_status avg_pool(step *r, const ct_tensor *x, const ct_tensor *y, const ct_cuda_pool_geom *g, const void *dy, void *dx,
                          float beta) {
    descs d = {0};
    cudnnHandle_t h;
    void *ws;
    const float one = 1.0f, zero = 0.0f;
    ct_status st = ct_cudnn_handle(r->dev, r->s, 0, &h, &ws, r->op);
    if (st == CT_OK) st = tensor4(r, &d.x, x->shape);
    if (st == CT_OK) st = tensor4(r, &d.y, y->shape);
    if (st == CT_OK) st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnCreatePoolingDescriptor(&d.pool));
    if (st == CT_OK)
        st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnSetPooling2dDescriptor(d.pool, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                                                            CUDNN_PROPAGATE_NAN, (int)g->k, (int)g->k, (int)g->p,
                                                                            (int)g->p, (int)g->s, (int)g->s));
    if (st == CT_OK && !dy)
        st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnPoolingForward(h, d.pool, &one, d.x, x->data, &zero, d.y, y->data));
    else if (st == CT_OK)
        st = CT_GPU_CHECK(cudnn, r->op, ct_cudnn.cudnnPoolingBackward(h, d.pool, &one, d.y, y->data, d.y, dy, d.x, x->data, &beta,
                                                                     d.x, dx));
    descs_free(&d);
    return st;
}

static ct_tensor *pool_fwd(ct_ctx *ctx, const ct_op_args *a, int op) {
    const char *name = ct_op_table[op].name;
    ct_tensor *x = a->in[0];
    int k = (int)a->i[0], s = (int)a->i[1], p = (int)a->i[2];
    int64_t shape[4] = {x->shape[0], x->shape[1], 0, 0};
    check_dtypes(name, x, NULL, NULL);
    ct_check_pool2d_shapes(name, x, k, &s, p, &shape[2], &shape[3]);
    step r;
    bool go = start(ctx, x->device, name, x->dtype, &r);
    ct_tensor *y = ct_new_on(ctx, x->device, x->dtype, 4, shape, name);
    ct_cuda_pool_geom g = pool_geom_of(x, y, k, s, p);
    /* the winner of each window (an offset in its input plane), for backward */
    int32_t *arg = op == CT_OP_AVG_POOL2D ? NULL : ct_ctx_dev_alloc(ctx, x->device, (size_t)(ct_numel(y) + 1) * sizeof(int32_t), name);
    if (go && y->data && ct_numel(y) > 0) {
        if (op == CT_OP_AVG_POOL2D) ct_ctx_fail(ctx, avg_pool(&r, x, y, &g, NULL, NULL, 0.0f));
        else if (arg)
            ct_ctx_fail(ctx, ct_cuda_max_pool_t(r.s, x->data, ct_cuda_cast_type_of(x->dtype), y->data, arg, &g,
                                                op == CT_OP_RELU_MAX_POOL2D));
    }
    ct_node *n = ct_record(ctx, op, y, 1, &x);
    if (n) { n->saved = arg; n->i[0] = k; n->i[1] = s; n->i[2] = p; }
    return y;
}
static ct_tensor *fwd_max_pool2d(ct_ctx *ctx, const ct_op_args *a) { return pool_fwd(ctx, a, CT_OP_MAX_POOL2D); }
static ct_tensor *fwd_relu_max_pool2d(ct_ctx *ctx, const ct_op_args *a) { return pool_fwd(ctx, a, CT_OP_RELU_MAX_POOL2D); }
static ct_tensor *fwd_avg_pool2d(ct_ctx *ctx, const ct_op_args *a) { return pool_fwd(ctx, a, CT_OP_AVG_POOL2D); }

static void bw_pool(ct_ctx *ctx, ct_node *n) {
    step r;
    ct_tensor *x = n->in[0], *y = n->out;
    if (!start(ctx, n->out->device, n->op->name, x->dtype, &r)) return;
    bool fresh = false;
    float *dx = ct_grad_acc_fresh(ctx, x, &fresh);
    if (!dx || ct_numel(x) == 0) return;
    ct_cuda_pool_geom g = pool_geom_of(x, y, n->i[0], n->i[1], n->i[2]);
    const float *dy = y->grad->data;
    bool avg = n->op == &ct_op_table_dev[CT_OP_AVG_POOL2D].row;
    ct_status st;
    if (ct_numel(y) == 0) {
        st = zero_if_fresh(&r, dx, fresh, ct_numel(x));
    } else if (avg && lowp(&r)) { /* cuDNN in x's type, added to the f32 gradient */
        const void *d16 = dy_lowp(&r, dy, ct_numel(y));
        void *x16 = scratch16(&r, ct_numel(x));
        st = d16 && x16 ? avg_pool(&r, x, y, &g, d16, x16, 0.0f) : ct_ctx_status(ctx);
        if (st == CT_OK) st = add_lowp(&r, dx, fresh, x16, ct_numel(x));
    } else if (avg) {
        st = avg_pool(&r, x, y, &g, dy, dx, fresh ? 0.0f : 1.0f);
    } else { /* max pooling reads its saved output in its own type, the gradients in f32 */
        st = ct_cuda_max_pool_bwd_t(r.s, dy, y->data, ct_cuda_cast_type_of(y->dtype), n->saved, dx, &g,
                                    n->op == &ct_op_table_dev[CT_OP_RELU_MAX_POOL2D].row, !fresh);
    }
    ct_ctx_fail(ctx, st);
}

void ct_cuda_register_conv_ops_(void) {
    ct_op_register_device(CT_DEV_CUDA, CT_OP_CONV2D, fwd_conv2d, bw_conv2d);
    ct_op_register_device(CT_DEV_CUDA, CT_OP_MAX_POOL2D, fwd_max_pool2d, bw_pool);
    ct_op_register_device(CT_DEV_CUDA, CT_OP_RELU_MAX_POOL2D, fwd_relu_max_pool2d, bw_pool);
    ct_op_register_device(CT_DEV_CUDA, CT_OP_AVG_POOL2D, fwd_avg_pool2d, bw_pool);
    /* all of them read bf16/f16 themselves (autocast hands them the rounded tensors) */
    const unsigned lp = (1u << CT_BF16) | (1u << CT_F16);
    ct_op_device_reads_lowp(CT_OP_CONV2D, 7u, lp);
    ct_op_device_reads_lowp(CT_OP_MAX_POOL2D, 1u, lp);
    ct_op_device_reads_lowp(CT_OP_RELU_MAX_POOL2D, 1u, lp);
    ct_op_device_reads_lowp(CT_OP_AVG_POOL2D, 1u, lp);
}
