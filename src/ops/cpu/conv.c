/* conv2d (im2col + sgemm), max_pool2d, avg_pool2d (count_include_pad=True), NCHW.
 *
 * conv2d unfolds a chunk of samples at once into col [C*kh*kw, nb*OH*OW] so one GEMM
 * covers the chunk (bigger GEMMs than one per sample: small images give tiny per-sample
 * GEMMs). The chunk size depends only on the shapes, so the summation order of the weight
 * gradient — and hence every bit of the result — is the same for any thread count.
 * Backward recomputes col rather than keeping it (it is kh*kw times the input). */
#include <math.h>
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/blas.h"

#define COL_BUDGET (1 << 20) /* floats per im2col chunk (4 MiB) */

/* C = op(A) op(B) + beta C */
static inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C, float beta) {
    ct_sgemm(ta, tb, M, N, K, 1.0f, A, B, beta, C);
}

typedef struct {
    int64_t N, C, H, W, O, kh, kw, OH, OW, s, p;
} conv_geom;

/* Output columns [*o0, *o1) whose input column ow*s - p + kj falls inside [0, W): the rest
 * is padding. Lets the inner loops run branch-free (and vectorise for stride 1). */
static inline void valid_cols(const conv_geom *g, int64_t kj, int64_t *o0, int64_t *o1) {
    int64_t lo = g->p - kj, hi = g->W + g->p - kj; /* need lo <= ow*s < hi */
    int64_t a = lo <= 0 ? 0 : (lo + g->s - 1) / g->s;
    int64_t b = hi <= 0 ? 0 : (hi + g->s - 1) / g->s;
    *o0 = a < g->OW ? a : g->OW;
    *o1 = b < g->OW ? b : g->OW;
    if (*o1 < *o0) *o1 = *o0;
}

/* col[k][j*P + oh*OW + ow] = x[n0+j][c][oh*s - p + ki][ow*s - p + kj] (0 outside), k = (c, ki, kj) */
static void im2col(const conv_geom *g, const float *x, int64_t n0, int64_t nb, float *col) {
    int64_t K = g->C * g->kh * g->kw, P = g->OH * g->OW, ld = nb * P;
#pragma omp parallel for if (K * ld >= (1 << 15))
    for (int64_t k = 0; k < K; k++) {
        int64_t c = k / (g->kh * g->kw), ki = (k / g->kw) % g->kh, kj = k % g->kw, o0, o1;
        valid_cols(g, kj, &o0, &o1);
        for (int64_t j = 0; j < nb; j++) {
            const float *xp = x + ((n0 + j) * g->C + c) * g->H * g->W;
            float *dst = col + k * ld + j * P;
            for (int64_t oh = 0; oh < g->OH; oh++) {
                int64_t ih = oh * g->s - g->p + ki;
                float *d = dst + oh * g->OW;
                if (ih < 0 || ih >= g->H) {
                    memset(d, 0, (size_t)g->OW * sizeof(float));
                    continue;
                }
                const float *xr = xp + ih * g->W - g->p + kj; /* xr[ow * s] is input column ow*s - p + kj */
                for (int64_t ow = 0; ow < o0; ow++) d[ow] = 0.0f;
                if (g->s == 1) memcpy(d + o0, xr + o0, (size_t)(o1 - o0) * sizeof(float));
                else
                    for (int64_t ow = o0; ow < o1; ow++) d[ow] = xr[ow * g->s];
                for (int64_t ow = o1; ow < g->OW; ow++) d[ow] = 0.0f;
            }
        }
    }
}

/* dx[n0+j][c][ih][iw] += dcol[k][j*P + ...]; threads split (sample, channel) pairs, each
 * owning its plane of dx, kernel offsets in fixed order: deterministic. */
static void col2im_add(const conv_geom *g, const float *dcol, int64_t n0, int64_t nb, float *dx) {
    int64_t P = g->OH * g->OW, ld = nb * P, KK = g->kh * g->kw;
#pragma omp parallel for collapse(2) if (g->C * KK * ld >= (1 << 15))
    for (int64_t j = 0; j < nb; j++)
        for (int64_t c = 0; c < g->C; c++) {
            float *xp = dx + ((n0 + j) * g->C + c) * g->H * g->W;
            for (int64_t kk = 0; kk < KK; kk++) {
                int64_t ki = kk / g->kw, kj = kk % g->kw, o0, o1;
                valid_cols(g, kj, &o0, &o1);
                const float *src = dcol + (c * KK + kk) * ld + j * P;
                for (int64_t oh = 0; oh < g->OH; oh++) {
                    int64_t ih = oh * g->s - g->p + ki;
                    if (ih < 0 || ih >= g->H) continue;
                    float *xr = xp + ih * g->W - g->p + kj;
                    const float *sr = src + oh * g->OW;
                    if (g->s == 1) {
#pragma omp simd
                        for (int64_t ow = o0; ow < o1; ow++) xr[ow] += sr[ow];
                    } else {
                        for (int64_t ow = o0; ow < o1; ow++) xr[ow * g->s] += sr[ow];
                    }
                }
            }
        }
}

static int64_t chunk_of(const conv_geom *g) {
    int64_t per = g->C * g->kh * g->kw * g->OH * g->OW;
    int64_t nb = per ? COL_BUDGET / per : g->N;
    if (nb < 1) nb = 1;
    return nb < g->N ? nb : g->N;
}

ct_tensor *ct_conv2d(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, int stride, int padding) {
    CT_AUTOCAST(ctx, CT_OP_CONV2D, 3, ((ct_tensor **[]){&x, &w, &b}), ct_conv2d(ctx, x, w, b, stride, padding));
    CT_CHECK_F32("conv2d", x); CT_CHECK_F32("conv2d", w);
    CT_CHECK_CONTIG("conv2d", x); CT_CHECK_CONTIG("conv2d", w);
    char sx[96], sw[96];
    if (x->ndim != 4 || w->ndim != 4 || x->shape[1] != w->shape[1])
        CT_FATAL("conv2d: input %s and weight %s: need [N, C, H, W] and [O, C, kh, kw]", ct_shape_str(x, sx, sizeof sx),
                 ct_shape_str(w, sw, sizeof sw));
    CT_CHECK(stride >= 1 && padding >= 0, "conv2d: stride %d, padding %d", stride, padding);
    conv_geom g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[2], w->shape[3], 0, 0, stride, padding};
    if (g.H + 2 * g.p < g.kh || g.W + 2 * g.p < g.kw)
        CT_FATAL("conv2d: kernel of %s larger than padded input %s", ct_shape_str(w, sw, sizeof sw), ct_shape_str(x, sx, sizeof sx));
    if (b) {
        CT_CHECK_F32("conv2d", b); CT_CHECK_CONTIG("conv2d", b);
        if (b->ndim != 1 || b->shape[0] != g.O)
            CT_FATAL("conv2d: bias %s does not match weight %s", ct_shape_str(b, sx, sizeof sx), ct_shape_str(w, sw, sizeof sw));
    }
    g.OH = (g.H + 2 * g.p - g.kh) / g.s + 1;
    g.OW = (g.W + 2 * g.p - g.kw) / g.s + 1;
    int64_t K = g.C * g.kh * g.kw, P = g.OH * g.OW, nbmax = chunk_of(&g);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){g.N, g.O, g.OH, g.OW});
    float *Y = y->data;
    const float *Wt = w->data, *B = b ? b->data : NULL;
    /* scratch: col and (when several samples share a GEMM) its [O, nb*P] result */
    float *col = ct_ctx_alloc(ctx, (size_t)(K * nbmax * P + 1) * sizeof(float));
    float *tmp = nbmax > 1 ? ct_ctx_alloc(ctx, (size_t)(g.O * nbmax * P) * sizeof(float)) : NULL;
    for (int64_t n0 = 0; n0 < g.N; n0 += nbmax) {
        int64_t nb = g.N - n0 < nbmax ? g.N - n0 : nbmax;
        im2col(&g, x->data, n0, nb, col);
        if (nb == 1) {
            gemm(false, false, g.O, P, K, Wt, col, Y + n0 * g.O * P, 0.0f);
            if (B)
                for (int64_t o = 0; o < g.O; o++)
                    for (int64_t q = 0; q < P; q++) Y[(n0 * g.O + o) * P + q] += B[o];
        } else {
            gemm(false, false, g.O, nb * P, K, Wt, col, tmp, 0.0f);
#pragma omp parallel for collapse(2) if (nb * g.O * P >= (1 << 15))
            for (int64_t j = 0; j < nb; j++)
                for (int64_t o = 0; o < g.O; o++) {
                    float *dst = Y + ((n0 + j) * g.O + o) * P;
                    const float *src = tmp + o * nb * P + j * P;
                    float bv = B ? B[o] : 0.0f;
                    for (int64_t q = 0; q < P; q++) dst[q] = src[q] + bv;
                }
        }
    }
    ct_node *nd = ct_record(ctx, CT_OP_CONV2D, y, b ? 3 : 2, (ct_tensor *[]){x, w, b});
    if (nd) {
        nd->i[0] = stride;
        nd->i[1] = padding;
    }
    return y;
}

void ct_bw_conv2d(ct_ctx *ctx, ct_node *n) {
    ct_tensor *x = n->in[0], *w = n->in[1];
    conv_geom g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[2], w->shape[3],
                   n->out->shape[2], n->out->shape[3], n->i[0], n->i[1]};
    int64_t K = g.C * g.kh * g.kw, P = g.OH * g.OW, nbmax = chunk_of(&g);
    const float *G = n->out->grad->data, *Wt = w->data;
    float *dx = ct_grad_acc(ctx, x), *dw = ct_grad_acc(ctx, w);
    float *db = n->nin > 2 ? ct_grad_acc(ctx, n->in[2]) : NULL;
    if (db)
#pragma omp parallel for if (g.N * g.O * P >= (1 << 15))
        for (int64_t o = 0; o < g.O; o++) {
            double s = 0;
            for (int64_t i = 0; i < g.N; i++) {
                const float *gs = G + (i * g.O + o) * P;
                float part = 0;
#pragma omp simd reduction(+ : part)
                for (int64_t q = 0; q < P; q++) part += gs[q];
                s += part;
            }
            db[o] += (float)s;
        }
    if (!dx && !dw) return;
    float *col = ct_ctx_alloc(ctx, (size_t)(K * nbmax * P + 1) * sizeof(float));
    float *tmp = nbmax > 1 ? ct_ctx_alloc(ctx, (size_t)(g.O * nbmax * P) * sizeof(float)) : NULL;
    for (int64_t n0 = 0; n0 < g.N; n0 += nbmax) {
        int64_t nb = g.N - n0 < nbmax ? g.N - n0 : nbmax;
        const float *gy = G + n0 * g.O * P; /* [O, P] when nb == 1 */
        if (nb > 1) {
            /* gather dY of the chunk into [O, nb*P], the layout of the forward GEMM */
#pragma omp parallel for collapse(2) if (nb * g.O * P >= (1 << 15))
            for (int64_t o = 0; o < g.O; o++)
                for (int64_t j = 0; j < nb; j++)
                    memcpy(tmp + o * nb * P + j * P, G + ((n0 + j) * g.O + o) * P, (size_t)P * sizeof(float));
            gy = tmp;
        }
        if (dw) {
            im2col(&g, x->data, n0, nb, col);
            gemm(false, true, g.O, K, nb * P, gy, col, dw, 1.0f); /* dW += dY col^T */
        }
        if (dx) {
            gemm(true, false, K, nb * P, g.O, Wt, gy, col, 0.0f); /* dcol = W^T dY */
            col2im_add(&g, col, n0, nb, dx);
        }
    }
}

/* ---- pooling ---- */
typedef struct {
    int64_t N, C, H, W, OH, OW, k, s, p;
} pool_geom;

/* Input rows [h0, h1) and columns [w0, w1) under output (oh, ow), clipped to the image
 * (padding contributes nothing to max pooling and zeros to average pooling). */
static inline void pool_window(const pool_geom *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0,
                               int64_t *w1) {
    int64_t hs = oh * g->s - g->p, ws = ow * g->s - g->p;
    *h1 = hs + g->k < g->H ? hs + g->k : g->H;
    *w1 = ws + g->k < g->W ? ws + g->k : g->W;
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
}

static pool_geom pool_setup(const char *op, const ct_tensor *x, int kernel, int stride, int padding) {
    char sx[96];
    CT_CHECK_F32(op, x); CT_CHECK_CONTIG(op, x);
    if (x->ndim != 4) CT_FATAL("%s: input must be [N, C, H, W], got %s", op, ct_shape_str(x, sx, sizeof sx));
    if (stride <= 0) stride = kernel; /* PyTorch: stride defaults to kernel_size */
    CT_CHECK(kernel >= 1 && padding >= 0 && 2 * padding <= kernel,
             "%s: kernel %d, padding %d (padding must be at most half the kernel)", op, kernel, padding);
    pool_geom g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], 0, 0, kernel, stride, padding};
    if (g.H + 2 * g.p < g.k || g.W + 2 * g.p < g.k)
        CT_FATAL("%s: kernel %d larger than padded input %s", op, kernel, ct_shape_str(x, sx, sizeof sx));
    g.OH = (g.H + 2 * g.p - g.k) / g.s + 1;
    g.OW = (g.W + 2 * g.p - g.k) / g.s + 1;
    return g;
}

ct_tensor *ct_max_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding) {
    CT_AUTOCAST(ctx, CT_OP_MAX_POOL2D, 1, ((ct_tensor **[]){&x}), ct_max_pool2d(ctx, x, kernel, stride, padding));
    pool_geom g = pool_setup("max_pool2d", x, kernel, stride, padding);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){g.N, g.C, g.OH, g.OW});
    int64_t planes = g.N * g.C, HW = g.H * g.W, OP = g.OH * g.OW;
    /* argmax (offset in the input plane) per output, for backward */
    int32_t *arg = ct_ctx_alloc_keep(ctx, (size_t)(planes * OP + 1) * sizeof(int32_t));
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (planes * OP * g.k * g.k >= (1 << 15))
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = X + pl * HW;
        for (int64_t oh = 0; oh < g.OH; oh++)
            for (int64_t ow = 0; ow < g.OW; ow++) {
                int64_t h0, h1, w0, w1;
                pool_window(&g, oh, ow, &h0, &h1, &w0, &w1);
                float m = -INFINITY;
                int64_t am = h0 * g.W + w0;
                /* first maximum in scan order wins; NaN propagates (PyTorch's rule) */
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) {
                        float v = xp[ih * g.W + iw];
                        if (v > m || isnan(v)) { m = v; am = ih * g.W + iw; if (isnan(v)) goto done; }
                    }
            done:
                Y[pl * OP + oh * g.OW + ow] = m;
                arg[pl * OP + oh * g.OW + ow] = (int32_t)am;
            }
    }
    ct_node *nd = ct_record(ctx, CT_OP_MAX_POOL2D, y, 1, &x);
    if (nd) nd->saved = arg;
    return y;
}
void ct_bw_max_pool2d(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    const ct_tensor *x = n->in[0], *y = n->out;
    int64_t planes = x->shape[0] * x->shape[1], HW = x->shape[2] * x->shape[3], OP = y->shape[2] * y->shape[3];
    const float *G = y->grad->data;
    const int32_t *arg = n->saved;
#pragma omp parallel for if (planes * OP >= (1 << 15))
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t q = 0; q < OP; q++) gx[pl * HW + arg[pl * OP + q]] += G[pl * OP + q];
}

ct_tensor *ct_avg_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding) {
    CT_AUTOCAST(ctx, CT_OP_AVG_POOL2D, 1, ((ct_tensor **[]){&x}), ct_avg_pool2d(ctx, x, kernel, stride, padding));
    pool_geom g = pool_setup("avg_pool2d", x, kernel, stride, padding);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){g.N, g.C, g.OH, g.OW});
    int64_t planes = g.N * g.C, HW = g.H * g.W, OP = g.OH * g.OW;
    /* count_include_pad=True, ceil_mode=False: every window counts k*k elements */
    float inv = 1.0f / (float)(g.k * g.k);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (planes * OP * g.k * g.k >= (1 << 15))
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = X + pl * HW;
        for (int64_t oh = 0; oh < g.OH; oh++)
            for (int64_t ow = 0; ow < g.OW; ow++) {
                int64_t h0, h1, w0, w1;
                pool_window(&g, oh, ow, &h0, &h1, &w0, &w1);
                float s = 0;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) s += xp[ih * g.W + iw];
                Y[pl * OP + oh * g.OW + ow] = s * inv;
            }
    }
    ct_node *nd = ct_record(ctx, CT_OP_AVG_POOL2D, y, 1, &x);
    if (nd) { nd->i[0] = g.k; nd->i[1] = g.s; nd->i[2] = g.p; }
    return y;
}
void ct_bw_avg_pool2d(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    const ct_tensor *x = n->in[0], *y = n->out;
    int64_t k = n->i[0], s = n->i[1], p = n->i[2];
    int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3], OH = y->shape[2], OW = y->shape[3];
    const float *G = y->grad->data;
    float inv = 1.0f / (float)(k * k);
#pragma omp parallel for if (planes * OH * OW * k * k >= (1 << 15))
    for (int64_t pl = 0; pl < planes; pl++) {
        float *xp = gx + pl * H * W;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0 = oh * s - p, w0 = ow * s - p;
                int64_t h1 = h0 + k < H ? h0 + k : H, w1 = w0 + k < W ? w0 + k : W;
                h0 = h0 < 0 ? 0 : h0;
                w0 = w0 < 0 ? 0 : w0;
                float gv = G[(pl * OH + oh) * OW + ow] * inv;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) xp[ih * W + iw] += gv;
            }
    }
}
