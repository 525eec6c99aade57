/* Kernels at sizes where they go parallel give the same bits with 1 and 2 threads
 * (forward and every gradient), and conv2d's one-sample-per-GEMM path (large images)
 * matches a direct convolution.
 *
 * Exception: ops built on sgemm (linear, matmul, conv2d, attention) inherit OpenBLAS's
 * rounding, which depends on its thread count (0.3.21 computes edge blocks with other
 * kernels when the partition moves: ~8% of a 256x1024x784 product differ in the last
 * bit). For those the test asks for agreement within 1e-6, normwise. */
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/ops.h"
#include "ops/cpu/sgemm.h"

typedef ct_tensor *(*op_fn)(ct_ctx *c, ct_tensor **in);

static void fill(ct_tensor *t, uint64_t seed, float scale) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    float *p = t->data;
    for (int64_t i = 0; i < ct_numel(t); i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        p[i] = ((float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f) * scale;
    }
}

typedef struct { int ndim; int64_t shape[CT_MAX_DIMS]; float scale; } ct_tensor_spec_;

/* forward + backward with `threads`; returns a malloc'ed concatenation of y and grads */
static float *run(op_fn f, int nin, const ct_tensor_spec_ *spec, int threads, int64_t *len) {
    ct_set_num_threads(threads);
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *in[4];
    for (int i = 0; i < nin; i++) {
        in[i] = ct_new(c, CT_F32, spec[i].ndim, spec[i].shape);
        fill(in[i], 11 + i, spec[i].scale);
        ct_requires_grad(in[i]);
    }
    ct_tensor *y = ct_contiguous(c, f(c, in));
    ct_tensor *g = ct_new_like(c, y);
    fill(g, 99, 1.0f);
    int64_t n = ct_numel(y);
    for (int i = 0; i < nin; i++) n += ct_numel(in[i]);
    float *out = malloc((size_t)n * sizeof(float)), *o = out;
    memcpy(o, y->data, ct_nbytes(y));
    o += ct_numel(y);
    ct_backward_seed(c, y, g);
    for (int i = 0; i < nin; i++) {
        if (in[i]->grad) memcpy(o, in[i]->grad->data, ct_nbytes(in[i]));
        else memset(o, 0, ct_nbytes(in[i]));
        o += ct_numel(in[i]);
    }
    *len = n;
    ct_ctx_free(c);
    return out;
}

/* tol 0: bitwise; else max|a - b| / max|a| <= tol */
static void compare_threads(const char *name, op_fn f, int nin, const ct_tensor_spec_ *spec, double tol) {
    int saved = ct_get_num_threads();
    int64_t n1, n2;
    float *a = run(f, nin, spec, 1, &n1), *b = run(f, nin, spec, 2, &n2);
    ct_set_num_threads(saved);
    int64_t diff = 0;
    double e = 0, m = 1e-30;
    for (int64_t i = 0; i < n1 && n1 == n2; i++) {
        diff += memcmp(&a[i], &b[i], 4) != 0;
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs(a[i]));
    }
    if (n1 != n2 || (tol == 0 && diff) || e / m > tol)
        CT_FAILF("%s: %lld of %lld values differ between 1 and 2 threads (normwise %.2e)", name, (long long)diff, (long long)n1, e / m);
    free(a);
    free(b);
}
#define same_bits(name, f, nin, ...) compare_threads(name, f, nin, __VA_ARGS__, 0)
#define close_enough(name, f, nin, ...) compare_threads(name, f, nin, __VA_ARGS__, 1e-6)

static ct_tensor *f_bias_add(ct_ctx *c, ct_tensor **in) { return ct_bias_add(c, in[0], in[1]); }
static ct_tensor *f_gelu(ct_ctx *c, ct_tensor **in) { return ct_gelu(c, in[0], true); }
static ct_tensor *f_softmax(ct_ctx *c, ct_tensor **in) { return ct_softmax(c, in[0]); }
static ct_tensor *f_log_softmax(ct_ctx *c, ct_tensor **in) { return ct_log_softmax(c, in[0]); }
static ct_tensor *f_ln(ct_ctx *c, ct_tensor **in) { return ct_layer_norm(c, in[0], in[1], in[2], 1e-5f); }
static ct_tensor *f_sum(ct_ctx *c, ct_tensor **in) { return ct_sum(c, in[0]); }
static ct_tensor *f_mse(ct_ctx *c, ct_tensor **in) { return ct_mse_loss(c, in[0], in[1]); }
static ct_tensor *f_ce(ct_ctx *c, ct_tensor **in) {
    int64_t N = in[0]->shape[0], C = in[0]->shape[1];
    ct_tensor *t = ct_new(c, CT_I64, 1, &N);
    for (int64_t i = 0; i < N; i++) ((int64_t *)t->data)[i] = i % 13 == 0 ? -100 : (i * 7919) % C;
    return ct_cross_entropy(c, in[0], t, -100);
}
static ct_tensor *f_emb(ct_ctx *c, ct_tensor **in) {
    int64_t n = 4096;
    ct_tensor *t = ct_new(c, CT_I32, 1, &n);
    for (int64_t i = 0; i < n; i++) ((int32_t *)t->data)[i] = (int32_t)((i * 31) % 97);
    return ct_embedding(c, in[0], t);
}
static ct_tensor *f_conv(ct_ctx *c, ct_tensor **in) { return ct_conv2d(c, in[0], in[1], in[2], 1, 1); }
static ct_tensor *f_pool(ct_ctx *c, ct_tensor **in) {
    return ct_add(c, ct_max_pool2d(c, in[0], 3, 2, 1), ct_avg_pool2d(c, in[0], 3, 2, 1));
}
static ct_tensor *f_pool2(ct_ctx *c, ct_tensor **in) {
    return ct_add(c, ct_max_pool2d(c, in[0], 2, 2, 0), ct_relu_max_pool2d(c, in[0], 2, 2, 0));
}
static ct_tensor *f_attn(ct_ctx *c, ct_tensor **in) { return ct_attention(c, in[0], in[1], in[2], true); }
static ct_tensor *f_heads(ct_ctx *c, ct_tensor **in) { return ct_merge_heads(c, ct_split_heads(c, in[0], 8)); }
static ct_tensor *f_linear(ct_ctx *c, ct_tensor **in) { return ct_linear(c, in[0], in[1], in[2]); }

CT_TEST(same_results_for_1_and_2_threads) {
    same_bits("bias_add", f_bias_add, 2, (ct_tensor_spec_[]){{4, {8, 32, 24, 24}, 1}, {1, {32}, 1}});
    same_bits("gelu", f_gelu, 1, (ct_tensor_spec_[]){{2, {256, 1024}, 3}});
    same_bits("softmax", f_softmax, 1, (ct_tensor_spec_[]){{2, {512, 256}, 5}});
    same_bits("log_softmax", f_log_softmax, 1, (ct_tensor_spec_[]){{2, {512, 256}, 5}});
    same_bits("layer_norm", f_ln, 3, (ct_tensor_spec_[]){{2, {1024, 256}, 2}, {1, {256}, 1}, {1, {256}, 1}});
    same_bits("sum", f_sum, 1, (ct_tensor_spec_[]){{1, {300001}, 1}});
    same_bits("mse_loss", f_mse, 2, (ct_tensor_spec_[]){{2, {300, 1001}, 1}, {2, {300, 1001}, 1}});
    same_bits("cross_entropy", f_ce, 1, (ct_tensor_spec_[]){{2, {512, 1000}, 4}});
    same_bits("embedding", f_emb, 1, (ct_tensor_spec_[]){{2, {97, 256}, 1}});
    close_enough("conv2d", f_conv, 3, (ct_tensor_spec_[]){{4, {8, 16, 28, 28}, 1}, {4, {32, 16, 3, 3}, 0.3f}, {1, {32}, 1}});
    same_bits("pools", f_pool, 1, (ct_tensor_spec_[]){{4, {8, 16, 28, 28}, 1}});
    same_bits("pools 2x2", f_pool2, 1, (ct_tensor_spec_[]){{4, {16, 32, 28, 28}, 1}});
    close_enough("attention", f_attn, 3, (ct_tensor_spec_[]){{4, {2, 4, 128, 32}, 1}, {4, {2, 4, 128, 32}, 1}, {4, {2, 4, 128, 32}, 1}});
    same_bits("split_merge_heads", f_heads, 1, (ct_tensor_spec_[]){{3, {4, 256, 256}, 1}});
    close_enough("linear", f_linear, 3, (ct_tensor_spec_[]){{2, {256, 784}, 1}, {2, {1024, 784}, 0.05f}, {1, {1024}, 1}});
    if (ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE) { /* own GEMM: exact; 2 threads run the heads one per thread */
        same_bits("attention, heads in parallel", f_attn, 3,
                  (ct_tensor_spec_[]){{4, {2, 4, 128, 32}, 1}, {4, {2, 4, 128, 32}, 1}, {4, {2, 4, 128, 32}, 1}});
        same_bits("attention, odd blocks", f_attn, 3,
                  (ct_tensor_spec_[]){{4, {3, 3, 150, 24}, 1}, {4, {3, 3, 150, 24}, 1}, {4, {3, 3, 150, 24}, 1}});
    }
}

/* conv2d against a direct convolution in double: y, dx, dw, db for upstream gradient g */
static void conv_vs_direct(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k, int64_t s, int64_t p) {
    const int64_t OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = ct_new(c, CT_F32, 4, (int64_t[]){N, C, H, W}), *w = ct_new(c, CT_F32, 4, (int64_t[]){O, C, k, k});
    ct_tensor *b = ct_new(c, CT_F32, 1, (int64_t[]){O});
    fill(x, 1, 1); fill(w, 2, 0.3f); fill(b, 3, 1);
    ct_requires_grad(x); ct_requires_grad(w); ct_requires_grad(b);
    ct_tensor *y = ct_conv2d(c, x, w, b, (int)s, (int)p);
    ct_tensor *g = ct_new_like(c, y);
    fill(g, 4, 1);
    ct_backward_seed(c, y, g);
    const float *X = x->data, *Wt = w->data, *B = b->data, *G = g->data, *Y = y->data;
    double *dx = calloc((size_t)(N * C * H * W), sizeof(double)), *dw = calloc((size_t)(O * C * k * k), sizeof(double));
    double *db = calloc((size_t)O, sizeof(double)), ey = 0, my = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double acc = B[o], gv = G[((n * O + o) * OH + oh) * OW + ow];
                    db[o] += gv;
                    for (int64_t ci = 0; ci < C; ci++)
                        for (int64_t ki = 0; ki < k; ki++)
                            for (int64_t kj = 0; kj < k; kj++) {
                                int64_t ih = oh * s - p + ki, iw = ow * s - p + kj;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                int64_t xi = ((n * C + ci) * H + ih) * W + iw, wi = ((o * C + ci) * k + ki) * k + kj;
                                acc += (double)X[xi] * Wt[wi];
                                dx[xi] += gv * Wt[wi];
                                dw[wi] += gv * X[xi];
                            }
                    double yv = Y[((n * O + o) * OH + oh) * OW + ow];
                    ey = fmax(ey, fabs(yv - acc));
                    my = fmax(my, fabs(acc));
                }
    double ex = 0, mx = 0, ew = 0, mw = 0, eb = 0, mb = 0;
    for (int64_t i = 0; i < N * C * H * W; i++) { ex = fmax(ex, fabs(ct_f32(x->grad)[i] - dx[i])); mx = fmax(mx, fabs(dx[i])); }
    for (int64_t i = 0; i < O * C * k * k; i++) { ew = fmax(ew, fabs(ct_f32(w->grad)[i] - dw[i])); mw = fmax(mw, fabs(dw[i])); }
    for (int64_t i = 0; i < O; i++) { eb = fmax(eb, fabs(ct_f32(b->grad)[i] - db[i])); mb = fmax(mb, fabs(db[i])); }
    if (!(ey / my < 1e-5 && ex / mx < 1e-5 && ew / mw < 1e-5 && eb / mb < 1e-5))
        CT_FAILF("conv2d [%lld,%lld,%lld,%lld] k%lld s%lld p%lld: normwise errors y %.2e dx %.2e dw %.2e db %.2e", (long long)N,
                 (long long)C, (long long)H, (long long)W, (long long)k, (long long)s, (long long)p, ey / my, ex / mx, ew / mw, eb / mb);
    free(dx); free(dw); free(db);
    ct_ctx_free(c);
}
CT_TEST(conv2d_large_image_matches_direct) {
    conv_vs_direct(2, 16, 97, 95, 3, 3, 1, 1); /* C*k*k*OH*OW > 1M: one sample per GEMM */
}
/* The chunked paths (im2col from padded planes where there is no own GEMM, the direct kernels
 * where there is): rows shorter than a vector, no padding, padding wider than half the kernel,
 * one input channel, odd sizes, stride 2 */
CT_TEST(conv2d_small_geometries_match_direct) {
    const int64_t g[][8] = {{3, 1, 28, 28, 4, 5, 1, 2}, {2, 5, 14, 14, 6, 5, 1, 2}, {2, 3, 7, 5, 2, 3, 1, 1},
                            {2, 2, 9, 13, 3, 3, 1, 0}, {1, 3, 6, 3, 2, 3, 1, 3}, {2, 4, 11, 17, 3, 1, 1, 0},
                            {2, 17, 10, 9, 5, 3, 1, 1}, {2, 3, 15, 12, 4, 5, 2, 2}, {3, 2, 20, 33, 2, 7, 1, 3}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) conv_vs_direct(g[i][0], g[i][1], g[i][2], g[i][3], g[i][4], g[i][5], g[i][6], g[i][7]);
}
/* relu_max_pool2d gives the bits of max_pool2d(relu(x)), forward and backward, and the 2x2
 * fast path the bits of a plain scan (first maximum wins, NaN wins and stays): inputs with
 * ties, zeros, negative zeros, NaN and widths that leave partial vectors. */
static void pool_ref(const float *x, int64_t planes, int64_t H, int64_t W, float *y) {
    int64_t OH = H / 2, OW = W / 2;
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                float m = -INFINITY;
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++) {
                        float v = x[(pl * H + 2 * oh + i) * W + 2 * ow + j];
                        if (isnan(m)) continue;
                        if (v > m || isnan(v)) m = v;
                    }
                y[(pl * OH + oh) * OW + ow] = m;
            }
}
CT_TEST(relu_max_pool2d_is_max_pool_of_relu) {
    const int64_t shapes[][4] = {{3, 5, 14, 30}, {2, 3, 28, 28}, {1, 2, 6, 66}, {2, 2, 9, 7}};
    for (int si = 0; si < 4; si++) {
        const int64_t *sh = shapes[si];
        for (int kind = 0; kind < 2; kind++) { /* 0: 2x2 stride 2; 1: 3x3 stride 2 padding 1 */
            int k = kind ? 3 : 2, st = 2, pad = kind;
            float *res[2][2];
            int64_t ny = 0, nx = sh[0] * sh[1] * sh[2] * sh[3];
            for (int fused = 0; fused < 2; fused++) {
                ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
                ct_tensor *x = ct_new(c, CT_F32, 4, sh);
                fill(x, 7, 1);
                float *X = x->data;
                for (int64_t i = 0; i < nx; i++) {
                    if (i % 5 == 0) X[i] = X[i + 1 < nx ? i + 1 : i];  /* ties */
                    if (i % 11 == 0) X[i] = 0.0f;
                    if (i % 13 == 0) X[i] = -0.0f;
                    if (i % 97 == 3) X[i] = NAN;
                }
                ct_requires_grad(x);
                ct_tensor *y = fused ? ct_relu_max_pool2d(c, x, k, st, pad) : ct_max_pool2d(c, ct_relu(c, x), k, st, pad);
                ny = ct_numel(y);
                if (kind == 0) { /* the unfused pooling of raw x against the scan */
                    ct_tensor *yr = ct_max_pool2d(c, x, 2, 2, 0);
                    float *ref = malloc((size_t)ny * sizeof(float));
                    pool_ref(X, sh[0] * sh[1], sh[2], sh[3], ref);
                    CT_EXPECT(memcmp(ref, yr->data, (size_t)ny * sizeof(float)) == 0);
                    free(ref);
                }
                ct_tensor *g = ct_new_like(c, y);
                fill(g, 5, 1);
                ct_backward_seed(c, y, g);
                res[fused][0] = malloc((size_t)ny * sizeof(float));
                res[fused][1] = malloc((size_t)nx * sizeof(float));
                memcpy(res[fused][0], y->data, (size_t)ny * sizeof(float));
                memcpy(res[fused][1], x->grad->data, (size_t)nx * sizeof(float));
                ct_ctx_free(c);
            }
            if (memcmp(res[0][0], res[1][0], (size_t)ny * sizeof(float)) || memcmp(res[0][1], res[1][1], (size_t)nx * sizeof(float)))
                CT_FAILF("relu_max_pool2d k%d on [%lld,%lld,%lld,%lld] differs from max_pool2d(relu)", k, (long long)sh[0],
                         (long long)sh[1], (long long)sh[2], (long long)sh[3]);
            for (int i = 0; i < 2; i++) { free(res[i][0]); free(res[i][1]); }
        }
    }
}
/* conv2d_relu_max_pool2d gives the bits of relu_max_pool2d(conv2d(...)) — output and every
 * gradient — with 1 and 2 threads: odd image sizes (partial tiles and windows), batches
 * that do not split evenly, channels off the 32-wide tile, no bias, a 3x3 pooling, and
 * values on a coarse grid (exact sums) with a negative bias, so the ReLU zeroes many
 * outputs and windows hold ties. On the direct path the conv output is never stored (its
 * tensor has no data); stride 2 takes the unfused ops. */
static float *fused_run(const int64_t *s, int fused, int threads, bool *direct, int64_t *len) {
    int64_t N = s[0], C = s[1], H = s[2], W = s[3], O = s[4], k = s[5];
    int pad = (int)s[6], stride = (int)s[7], pk = (int)s[8], bias = (int)s[9], data = (int)s[10];
    ct_set_num_threads(threads);
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = ct_new(c, CT_F32, 4, (int64_t[]){N, C, H, W}), *w = ct_new(c, CT_F32, 4, (int64_t[]){O, C, k, k});
    ct_tensor *b = bias ? ct_new(c, CT_F32, 1, (int64_t[]){O}) : NULL;
    ct_tensor *ts[3] = {x, w, b};
    for (int i = 0; i < 3; i++) {
        if (!ts[i]) continue;
        fill(ts[i], 3 + i, 1);
        float *d = ts[i]->data;
        for (int64_t j = 0; j < ct_numel(ts[i]) && !data; j++) d[j] = roundf(d[j] * 2) * (i == 1 ? 0.25f : 0.5f) - (i == 2 ? 0.5f : 0.0f);
        if (i > 0 || !data) ct_requires_grad(ts[i]);
    }
    ct_tensor *y = fused ? ct_conv2d_relu_max_pool2d(c, x, w, b, stride, pad, pk, 2, pk == 3)
                         : ct_relu_max_pool2d(c, ct_conv2d(c, x, w, b, stride, pad), pk, 2, pk == 3);
    *direct = y->node && y->node->in[0]->data == NULL;
    if (data == 2) ct_requires_grad(x); /* after the forward chose its plan: conv2d's backward writes G out itself */
    ct_tensor *g = ct_new_like(c, y);
    fill(g, 9, 1);
    ct_backward_seed(c, y, g);
    int64_t n = ct_numel(y) + (data == 1 ? 0 : ct_numel(x)) + ct_numel(w) + (b ? ct_numel(b) : 0);
    float *out = malloc((size_t)n * sizeof(float)), *o = out;
    memcpy(o, y->data, ct_nbytes(y));
    o += ct_numel(y);
    for (int i = 0; i < 3; i++)
        if (ts[i] && ts[i]->grad) {
            memcpy(o, ts[i]->grad->data, ct_nbytes(ts[i]));
            o += ct_numel(ts[i]);
        }
    *len = n;
    ct_ctx_free(c);
    return out;
}
CT_TEST(conv2d_relu_max_pool2d_same_bits) {
    /* N, C, H, W, O, k, pad, stride, pool kernel, bias, data. data: x is input data (no
     * gradient: conv2d's backward scatters the pooled gradient itself where it has few
     * channels, unpool_fill) and every value unrounded (sums in a wrong order would show);
     * 2: x asks for a gradient only after the forward (G written out from the pooled one) */
    const int64_t sh[][11] = {{5, 1, 28, 28, 32, 5, 2, 1, 2, 1, 0}, {3, 32, 14, 14, 64, 5, 2, 1, 2, 1, 0},
                              {3, 16, 9, 11, 20, 3, 1, 1, 2, 1, 0},  {3, 17, 10, 13, 40, 3, 1, 1, 3, 0, 0},
                              {2, 3, 11, 9, 8, 3, 1, 2, 2, 1, 0},    {5, 1, 28, 28, 32, 5, 2, 1, 2, 1, 1},
                              {3, 3, 12, 10, 40, 3, 1, 1, 2, 1, 1},  {4, 2, 8, 6, 16, 3, 1, 1, 2, 0, 1},
                              {3, 1, 10, 14, 20, 5, 2, 1, 2, 1, 1},  {3, 2, 9, 9, 20, 3, 1, 1, 3, 1, 1},
                              {3, 1, 9, 11, 32, 3, 1, 1, 2, 1, 1},   {3, 32, 14, 14, 64, 5, 2, 1, 2, 1, 1},
                              {5, 1, 28, 28, 32, 5, 2, 1, 2, 1, 2},  {3, 3, 12, 10, 40, 3, 1, 1, 2, 1, 2}};
    int nsh = (int)(sizeof sh / sizeof sh[0]), saved = ct_get_num_threads(), ndirect = 0, nstride1 = 0;
    for (int si = 0; si < nsh; si++) {
        nstride1 += sh[si][7] == 1 && sh[si][1] * sh[si][5] * sh[si][5] >= 16; /* where the own GEMM, hence the direct kernel, runs */
        int64_t n0, n1;
        bool d0, d1;
        /* the unfused ops at 1 thread: the same bits at any thread count on the own GEMM; on
         * OpenBLAS (no AVX-512) at the same thread count, as its threaded sgemm rounds
         * differently from its one-thread path */
        float *ref = NULL;
        for (int t = 1; t <= 2; t++) {
            if (!ref || ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) {
                free(ref);
                ref = fused_run(sh[si], 0, t, &d0, &n0);
            }
            float *f = fused_run(sh[si], 1, t, &d1, &n1);
            ndirect += d1;
            int64_t diff = 0;
            for (int64_t i = 0; i < n0 && n0 == n1; i++) diff += memcmp(&ref[i], &f[i], 4) != 0;
            if (n0 != n1 || diff || d0)
                CT_FAILF("conv2d_relu_max_pool2d shape %d, %d threads: %lld of %lld values differ from the unfused ops", si, t, (long long)diff,
                         (long long)n0);
            free(f);
        }
        free(ref);
    }
    ct_set_num_threads(saved);
    /* the direct kernel runs where the AVX-512 family does */
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_AVX512) CT_EXPECTF(ndirect == 2 * nstride1, "fused path ran %d of %d times", ndirect, 2 * nstride1);
}
CT_TEST_MAIN()

/* linear's bias gradient is each column of dY summed in row order: the bits of a scalar loop, at 1 and 2 threads, at widths with and
 * without whole 128-column blocks. With the weight's gradient too, the dW GEMM sums the columns while it packs dY
 * (ct_sgemm_own_rowsum): the same bits for dB, and dW's bits are those of the product without dB. Shapes: out > MC (several A
 * blocks, split by rows of dW), in >= out (split by columns: one range sums), rows > KC (sums carried across K blocks), in > NC
 * (A packed again per column block: summed once), K < 16 (OpenBLAS, col_sums). */
static void bias_grad_run(int64_t rows, int64_t in, int64_t out, bool wgrad, bool bgrad, float **db, float **dw) {
    ct_ctx *c;
    CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = ct_new(c, CT_F32, 2, (int64_t[]){rows, in}), *w = ct_new(c, CT_F32, 2, (int64_t[]){out, in});
    ct_tensor *b = ct_new(c, CT_F32, 1, (int64_t[]){out});
    fill(x, 1, 1), fill(w, 2, 0.2f), fill(b, 3, 1);
    if (bgrad) ct_requires_grad(b);
    if (wgrad) ct_requires_grad(w);
    ct_tensor *y = ct_linear(c, x, w, b), *g = ct_new_like(c, y);
    fill(g, 4, 1);
    ct_backward_seed(c, y, g);
    *db = NULL, *dw = NULL;
    if (bgrad) {
        *db = malloc((size_t)out * sizeof(float));
        const float *gd = g->data;
        /* the row-order sum, to compare with */
        for (int64_t j = 0; j < out; j++) {
            float s = 0.0f;
            for (int64_t r = 0; r < rows; r++) s += gd[r * out + j];
            (*db)[j] = s;
        }
        int64_t bad = 0;
        for (int64_t j = 0; j < out; j++) bad += memcmp(&(*db)[j], (const float *)b->grad->data + j, 4) != 0;
        if (bad) CT_FAILF("bias gradient, %d threads, %lld x %lld -> %lld, weight grad %d: %lld of %lld columns differ from the row-order sum",
                          ct_get_num_threads(), (long long)rows, (long long)in, (long long)out, (int)wgrad, (long long)bad, (long long)out);
    }
    if (wgrad) {
        *dw = malloc((size_t)(out * in) * sizeof(float));
        memcpy(*dw, w->grad->data, (size_t)(out * in) * sizeof(float));
    }
    ct_ctx_free(c);
}
CT_TEST(linear_bias_grad_is_row_order_sum) {
    static const int64_t sh[][3] = {{300, 24, 1000}, {300, 24, 256}, {300, 24, 130}, {300, 24, 17}, {300, 200, 17}, {40, 2100, 20}, {5, 40, 33}};
    int saved = ct_get_num_threads();
    for (int t = 1; t <= 2; t++)
        for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
            ct_set_num_threads(t);
            float *db, *dw, *db2, *dw2;
            bias_grad_run(sh[i][0], sh[i][1], sh[i][2], false, true, &db, &dw);
            bias_grad_run(sh[i][0], sh[i][1], sh[i][2], true, true, &db2, &dw2);
            free(db), free(db2), free(dw);
            bias_grad_run(sh[i][0], sh[i][1], sh[i][2], true, false, &db, &dw);
            int64_t n = sh[i][1] * sh[i][2], bad = 0;
            for (int64_t e = 0; e < n; e++) bad += memcmp(&dw[e], &dw2[e], 4) != 0;
            if (bad) CT_FAILF("weight gradient, %d threads, shape %zu: %lld of %lld values differ with the bias gradient summed alongside", t, i,
                              (long long)bad, (long long)n);
            free(dw), free(dw2);
        }
    ct_set_num_threads(saved);
}
