/* The per-element math of the CUDA kernels (src/ops/kmath.h), run on the CPU against the
 * CPU ops on random inputs: bit-equal where the operations are the same (activations,
 * cross-entropy gradient, embedding, AdamW, SGD), within 1e-6 (normwise relative) where only
 * the order of a row's sums differs (layer norm, log-sum-exp, log-softmax; 5e-6 for softmax), 1e-5 for
 * attention (flash rows, and plain attention's masked softmax and dS rows), whose dot products
 * run in another order and tile size than the CPU's GEMM tiles; bit-equal for the mse_loss
 * gradient, bias_add and the bf16 conversions. */
#include <math.h>
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/ops.h"
#include "kernel_check.h"
#include "ctrain/optim.h"
#include "ops/kmath.h"
#include "ops/cpu/gelu_simd.h"

/* elements not bit-equal; +0 and -0 count as equal (the CPU ops accumulate into a zeroed
 * gradient, and 0 + -0 is +0) */
static int64_t bit_diffs(const float *a, const float *b, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += memcmp(a + i, b + i, sizeof(float)) != 0 && !(a[i] == 0 && b[i] == 0);
    return k;
}

/* unary op forward and backward (seed g) against f and its gradient */
static void check_unary(const char *name, int which) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t n = 4099;
    ct_tensor *x = rnd(c, 1, &n, 6.0f), *g = rnd(c, 1, &n, 1.0f);
    ct_requires_grad(x);
    ct_tensor *y = which == 0 ? ct_gelu(c, x, false) : which == 1 ? ct_gelu(c, x, true) : which == 2 ? ct_relu(c, x)
                 : which == 3 ? ct_tanh(c, x) : ct_sigmoid(c, x);
    ct_backward_seed(c, y, g);
    float *ky = malloc(2 * n * sizeof(float)), *kg = ky + n;
    for (int64_t i = 0; i < n; i++) {
        float xi = ct_f32(x)[i], gi = ct_f32(g)[i];
        ky[i] = which == 0 ? ct_k_gelu(xi) : which == 1 ? ct_k_gelu_tanh(xi) : which == 2 ? ct_k_relu(xi)
              : which == 3 ? ct_k_tanh(xi) : ct_k_sigmoid(xi);
        kg[i] = which == 0 ? ct_k_gelu_bwd(xi, gi) : which == 1 ? ct_k_gelu_tanh_bwd(xi, gi) : which == 2 ? ct_k_relu_bwd(ky[i], gi)
              : which == 3 ? ct_k_tanh_bwd(ky[i], gi) : ct_k_sigmoid_bwd(ky[i], gi);
    }
    CT_EXPECTF(bit_diffs(ky, ct_f32(y), n) == 0, "%s forward: %lld elements differ", name, (long long)bit_diffs(ky, ct_f32(y), n));
    CT_EXPECTF(bit_diffs(kg, ct_f32(x->grad), n) == 0, "%s backward: %lld elements differ", name,
               (long long)bit_diffs(kg, ct_f32(x->grad), n));
    free(ky);
    ct_ctx_free(c);
}
CT_TEST(gelu_erf_bit_equal) { check_unary("gelu", 0); }
CT_TEST(gelu_tanh_bit_equal) { check_unary("gelu_tanh", 1); }

/* the AVX-512 exact GELU (ops/cpu/gelu_simd.c) at the edges of the scalar function's selects:
 * the same bits (NaN: NaN), forward and backward, accumulating and fresh */
CT_TEST(gelu_erf_edges_bit_equal) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const float v[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 13.0f, -13.0f, 20.0f, -20.0f, 1e-40f, -1e-40f,
                       1e-20f, 3.4e38f, -3.4e38f, 0.5f, -0.5f, 5.0f, -5.0f, 9.0f, -9.0f, -13.4f, 1.0f};
    const int64_t n = (int64_t)(sizeof v / sizeof v[0]);
    ct_tensor *x = ct_new(c, CT_F32, 1, &n), *g = ct_new(c, CT_F32, 1, &n);
    for (int64_t i = 0; i < n; i++) { ct_f32(x)[i] = v[i]; ct_f32(g)[i] = 0.75f; }
    ct_requires_grad(x);
    ct_tensor *y = ct_gelu(c, x, false);
    ct_backward_seed(c, y, g);
    for (int64_t i = 0; i < n; i++) {
        float ky = ct_k_gelu(v[i]), kg = 0.0f + ct_k_gelu_bwd(v[i], 0.75f), oy = ct_f32(y)[i], og = ct_f32(x->grad)[i];
        bool same_y = ky != ky ? oy != oy : memcmp(&ky, &oy, sizeof ky) == 0;
        bool same_g = kg != kg ? og != og : memcmp(&kg, &og, sizeof kg) == 0 || (kg == 0 && og == 0);
        CT_EXPECTF(same_y, "gelu(%g): op %g, kmath %g", (double)v[i], (double)oy, (double)ky);
        CT_EXPECTF(same_g, "gelu'(%g): op %g, kmath %g", (double)v[i], (double)og, (double)kg);
    }
    ct_ctx_free(c);
}
/* The AVX2 exact GELU (the path of CPUs without AVX-512) called directly, so that CPUs with
 * AVX-512, where the op never takes it, check it too: random values and the edges above, every
 * length's tail (masked lanes), forward and backward, fresh and accumulating. */
/* lengths for the 8-lane loops, which take 4 vectors a step, then single (masked) ones: n <= 16
 * itself, then 37 and 71 (a tail after 1 and 2 steps), then the whole buffer */
static int64_t tail_len(int64_t n, int64_t whole) { return n <= 16 ? n : n == 17 ? 37 : n == 18 ? 71 : whole; }
CT_TEST(gelu_erf_avx2_bit_equal) {
    if (!ct_gelu_avx2_available()) CT_SKIP("no AVX2 and FMA here (the CPU, or CTRAIN_CPU_CAPABILITY=none)");
    const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 13.0f, -13.0f, 20.0f, -20.0f, 1e-40f,
                          -1e-40f, 1e-20f, 3.4e38f, -3.4e38f, 0.5f, -0.5f, 5.0f, -5.0f, 9.0f, -9.0f, -13.4f, 1.0f};
    enum { N = 1000 };
    float x[N], g[N], y[N], gx[N], acc[N];
    const int64_t ne = (int64_t)(sizeof edge / sizeof edge[0]);
    for (int64_t i = 0; i < N; i++) {
        x[i] = i < ne ? edge[i] : urand(9.0f);
        g[i] = urand(1.0f);
        acc[i] = urand(1.0f);
    }
    int64_t bad = 0;
    for (int64_t n = 1; n <= 19; n++) { /* every tail; tails after blocks of 4 vectors; the whole buffer */
        for (int fresh = 0; fresh < 2; fresh++) {
            int64_t len = tail_len(n, N);
            memcpy(gx, acc, sizeof gx);
            ct_gelu_avx2(x, y, len);
            ct_gelu_bwd_avx2(x, g, gx, len, fresh);
            for (int64_t i = 0; i < len; i++) {
                float ky = ct_k_gelu(x[i]), kg = (fresh ? 0.0f : acc[i]) + ct_k_gelu_bwd(x[i], g[i]);
                bad += !(ky != ky ? y[i] != y[i] : memcmp(&ky, &y[i], 4) == 0);
                bad += !(kg != kg ? gx[i] != gx[i] : memcmp(&kg, &gx[i], 4) == 0);
            }
            for (int64_t i = len; i < N; i++) bad += memcmp(&gx[i], &acc[i], 4) != 0; /* past the end: untouched */
        }
    }
    CT_EXPECTF(bad == 0, "%lld values differ from kmath's GELU or were written past the end", (long long)bad);
}
/* SiLU: the op (on CPUs without AVX-512 its 8-lane code) against x ct_k_sigmoid(x) and its
 * gradient written as elementwise.c's loop; then the 8-lane code called directly at every
 * tail length with the edges of ct_vexpf's selects, so that AVX-512 CPUs check it too */
static float silu_ref(float x) { return x * ct_k_sigmoid(x); }
static float silu_grad_ref(float x, float g) {
    float s = ct_k_sigmoid(x);
    return g * (s * (1.0f + x * (1.0f - s)));
}
static const float silu_edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 87.0f, -87.0f, 88.0f, -88.0f, 89.0f,
                                  -89.0f, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f, 0.5f, -0.5f, 17.0f, -17.0f, 1.0f};
static bool same_float(float a, float b) { return a != a ? b != b : memcmp(&a, &b, 4) == 0; }
CT_TEST(silu_bit_equal) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t n = 20011; /* past PAR_EXP and SILU_CHUNK: threads and chunks */
    ct_tensor *x = rnd(c, 1, &n, 12.0f), *g = rnd(c, 1, &n, 1.0f);
    const int64_t ne = (int64_t)(sizeof silu_edge / sizeof silu_edge[0]);
    for (int64_t i = 0; i < ne; i++) ct_f32(x)[i * 37] = silu_edge[i];
    ct_requires_grad(x);
    ct_tensor *y = ct_silu(c, x);
    ct_backward_seed(c, y, g);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float xi = ct_f32(x)[i], kg = 0.0f + silu_grad_ref(xi, ct_f32(g)[i]), og = ct_f32(x->grad)[i];
        bad += !same_float(silu_ref(xi), ct_f32(y)[i]);
        bad += !(same_float(kg, og) || (kg == 0 && og == 0));
    }
    CT_EXPECTF(bad == 0, "%lld SiLU values differ from x ct_k_sigmoid(x) or its gradient", (long long)bad);
    ct_ctx_free(c);
}
CT_TEST(silu_avx2_bit_equal) {
    if (!ct_gelu_avx2_available()) CT_SKIP("no AVX2 and FMA here (the CPU, or CTRAIN_CPU_CAPABILITY=none)");
    enum { N = 1000 };
    float x[N], g[N], y[N], gx[N], acc[N];
    const int64_t ne = (int64_t)(sizeof silu_edge / sizeof silu_edge[0]);
    for (int64_t i = 0; i < N; i++) {
        x[i] = i < ne ? silu_edge[i] : urand(20.0f);
        g[i] = urand(1.0f);
        acc[i] = urand(1.0f);
    }
    int64_t bad = 0;
    for (int64_t n = 1; n <= 19; n++) {
        int64_t len = tail_len(n, N);
        memcpy(gx, acc, sizeof gx);
        ct_silu_avx2(x, y, len);
        ct_silu_bwd_avx2(x, g, gx, len);
        for (int64_t i = 0; i < len; i++) bad += !same_float(silu_ref(x[i]), y[i]) + !same_float(acc[i] + silu_grad_ref(x[i], g[i]), gx[i]);
        for (int64_t i = len; i < N; i++) bad += memcmp(&gx[i], &acc[i], 4) != 0; /* past the end: untouched */
    }
    CT_EXPECTF(bad == 0, "%lld values differ from the scalar SiLU or were written past the end", (long long)bad);
}
/* the 8-lane exp-and-sum of softmax rows (the exp alone: flash attention's backward; the sum
 * alone: cross-entropy's log-sum-exp): each exponential ct_vexpf's bits, in place or not, every
 * tail; the sum within float rounding of the sequential one, the same bits with or without
 * storing; a NaN gives NaN */
CT_TEST(vexp_sub_sum_avx2) {
    if (!ct_gelu_avx2_available()) CT_SKIP("no AVX2 and FMA here (the CPU, or CTRAIN_CPU_CAPABILITY=none)");
    enum { N = 300 };
    float x[N], y[N], z[N];
    int64_t bad = 0;
    for (int64_t i = 0; i < N; i++) x[i] = urand(30.0f) - 15.0f;
    x[3] = -1e30f; x[5] = 80.0f; x[7] = -INFINITY; /* exp(76.5): large, finite */
    for (int64_t n = 1; n <= N; n += n < 20 ? 1 : 37) {
        const float m = 3.5f;
        for (int inplace = 0; inplace < 2; inplace++) {
            float *out = inplace ? z : y, ref = 0;
            for (int64_t i = 0; i < N; i++) { z[i] = x[i]; y[i] = -7.0f; }
            float s = ct_vexp_sub_sum_avx2(out, inplace ? z : x, m, n), w[N];
            ct_vexp_sub_avx2(w, x, m, n); /* the same without the sum */
            for (int64_t i = 0; i < n; i++) {
                float e = ct_vexpf(x[i] - m);
                ref += e;
                bad += !same_float(e, out[i]) + !same_float(e, w[i]);
            }
            for (int64_t i = n; i < N; i++) bad += inplace ? !same_float(z[i], x[i]) : y[i] != -7.0f; /* untouched */
            bad += !(fabsf(s - ref) <= 1e-6f * ref);
            bad += !same_float(s, ct_vexp_sum_avx2(x, m, n)); /* the sum alone: the same bits */
        }
    }
    x[11] = NAN;
    bad += !(ct_vexp_sub_sum_avx2(y, x, 0.0f, 40) != ct_vexp_sub_sum_avx2(y, x, 0.0f, 40)) + !(y[11] != y[11]);
    bad += !(ct_vexp_sum_avx2(x, 0.0f, 40) != ct_vexp_sum_avx2(x, 0.0f, 40));
    CT_EXPECTF(bad == 0, "%lld exponentials or sums differ", (long long)bad);
}
CT_TEST(relu_bit_equal) { check_unary("relu", 2); }
CT_TEST(tanh_bit_equal) { check_unary("tanh", 3); }

CT_TEST(sigmoid_bit_equal) { check_unary("sigmoid", 4); }

CT_TEST(layer_norm_rows) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t R = 37, D = 768;
    ct_tensor *x = rnd(c, 2, (int64_t[]){R, D}, 3.0f), *w = rnd(c, 1, &D, 1.5f), *b = rnd(c, 1, &D, 0.5f);
    ct_tensor *g = rnd(c, 2, (int64_t[]){R, D}, 1.0f);
    for (int64_t j = 0; j < R * D; j++) ct_f32(x)[j] += 2.0f; /* a mean away from 0 */
    ct_tensor *ts[3] = {x, w, b};
    for (int i = 0; i < 3; i++) ct_requires_grad(ts[i]);
    ct_tensor *y = ct_layer_norm(c, x, w, b, 1e-5f);
    ct_backward_seed(c, y, g);
    float *ky = calloc((size_t)(2 * R * D + 2 * D), sizeof(float)), *kdx = ky + R * D, *kdw = kdx + R * D, *kdb = kdw + D;
    for (int64_t r = 0; r < R; r++) {
        float mean, rstd;
        const float *xr = ct_f32(x) + r * D, *gr = ct_f32(g) + r * D;
        ct_k_ln_row_fwd(xr, D, ct_f32(w), ct_f32(b), 1e-5f, ky + r * D, &mean, &rstd);
        ct_k_ln_row_bwd(xr, gr, D, ct_f32(w), mean, rstd, kdx + r * D);
        for (int64_t j = 0; j < D; j++) {
            kdw[j] += gr[j] * ((xr[j] - mean) * rstd);
            kdb[j] += gr[j];
        }
    }
    double e[4] = {normwise(ky, ct_f32(y), R * D), normwise(kdx, ct_f32(x->grad), R * D), normwise(kdw, ct_f32(w->grad), D),
                   normwise(kdb, ct_f32(b->grad), D)};
    for (int i = 0; i < 4; i++) CT_EXPECTF(e[i] <= 1e-6, "layer norm part %d: error %g > 1e-6", i, e[i]);
    free(ky);
    ct_ctx_free(c);
}

CT_TEST(cross_entropy_rows) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t N = 23, C = 1000;
    ct_tensor *x = rnd(c, 2, (int64_t[]){N, C}, 8.0f), *t = ct_new(c, CT_I64, 1, &N);
    for (int64_t r = 0; r < N; r++) ((int64_t *)t->data)[r] = r == 5 ? -100 : (r * 7919) % C;
    ct_requires_grad(x);
    ct_tensor *loss = ct_cross_entropy(c, x, t, -100);
    ct_backward(c, loss);
    double s = 0;
    int64_t cnt = 0;
    float *kg = calloc((size_t)(N * C), sizeof(float));
    for (int64_t r = 0; r < N; r++) {
        int64_t tr = ct_k_index_at(t->data, true, r);
        if (tr == -100) continue;
        const float *xr = ct_f32(x) + r * C;
        float lse = ct_k_xent_row_lse(xr, C), m = -INFINITY, os = 0;
        for (int64_t j = 0; j < C; j++) ct_k_online_add(&m, &os, xr[j]);
        /* the online form the kernel's lanes use, merged from two halves */
        float m1 = -INFINITY, s1 = 0;
        for (int64_t j = C / 2; j < C; j++) ct_k_online_add(&m1, &s1, xr[j]);
        float m0 = -INFINITY, s0 = 0;
        for (int64_t j = 0; j < C / 2; j++) ct_k_online_add(&m0, &s0, xr[j]);
        ct_k_online_merge(&m0, &s0, m1, s1);
        CT_EXPECTF(fabsf(ct_k_attn_lse(m, os) - lse) <= 1e-6f * fabsf(lse), "row %lld: online lse %.9g vs %.9g", (long long)r,
                   ct_k_attn_lse(m, os), lse);
        CT_EXPECTF(fabsf(ct_k_attn_lse(m0, s0) - lse) <= 1e-6f * fabsf(lse), "row %lld: merged lse %.9g vs %.9g",
                   (long long)r, ct_k_attn_lse(m0, s0), lse);
        s += (double)lse - xr[tr];
        cnt++;
    }
    CT_EXPECT_NEAR(s / (double)cnt, ct_f32(loss)[0], 1e-6 * fabs(ct_f32(loss)[0]));
    /* the gradient from the CPU's own lse: the same operations, so the same bits */
    float g = 1.0f / (float)cnt;
    for (int64_t r = 0; r < N; r++) {
        int64_t tr = ct_k_index_at(t->data, true, r);
        if (tr == -100) continue;
        const float *xr = ct_f32(x) + r * C;
        float lse = ct_k_xent_row_lse(xr, C);
        for (int64_t j = 0; j < C; j++) kg[r * C + j] = ct_k_xent_grad(xr[j], lse, g, j == tr);
    }
    CT_EXPECTF(normwise(kg, ct_f32(x->grad), N * C) <= 1e-6, "cross-entropy gradient: error %g",
               normwise(kg, ct_f32(x->grad), N * C));
    free(kg);
    ct_ctx_free(c);
}

/* masked (-inf) logits before the first finite one add nothing, as in the two-pass form */
CT_TEST(online_lse_masked) {
    const float row[5] = {-INFINITY, -INFINITY, 1.5f, -INFINITY, -0.25f};
    float m = -INFINITY, s = 0;
    for (int j = 0; j < 5; j++) ct_k_online_add(&m, &s, row[j]);
    CT_EXPECT_NEAR(ct_k_attn_lse(m, s), ct_k_xent_row_lse(row, 5), 1e-6);
    float m2 = -INFINITY, s2 = 0;
    ct_k_online_merge(&m2, &s2, -INFINITY, 0); /* two empty states stay empty */
    CT_EXPECT(m2 == -INFINITY && s2 == 0);
}

CT_TEST(embedding_rows) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t V = 50, D = 16, n = 40;
    ct_tensor *w = rnd(c, 2, (int64_t[]){V, D}, 1.0f), *idx = ct_new(c, CT_I32, 1, &n);
    for (int64_t r = 0; r < n; r++) ((int32_t *)idx->data)[r] = (int32_t)((r * 13) % V);
    ct_tensor *y = ct_embedding(c, w, idx);
    int64_t bad = 0;
    for (int64_t r = 0; r < n; r++)
        bad += memcmp(ct_f32(y) + r * D, ct_f32(w) + ct_k_index_at(idx->data, false, r) * D, D * sizeof(float)) != 0;
    CT_EXPECT_EQ(bad, 0);
    ct_ctx_free(c);
}

/* a store of two parameters with random gradients; the CPU optimizer and the kmath element
 * function step copies of the same state */
static void check_optim(bool adamw, bool variant) {
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_param(P, "w", 2, (int64_t[]){33, 17}, CT_INIT_NORMAL, 0.5);
    ct_param(P, "b", 1, (int64_t[]){17}, CT_INIT_NORMAL, 0.5);
    CT_ASSERT(ct_params_finalize(P, 7) == CT_OK);
    size_t n = ct_params_numel(P);
    float *p = malloc(4 * n * sizeof(float)), *s1 = p + n, *s2 = s1 + n, *s3 = s2 + n;
    memcpy(p, ct_params_data(P), n * sizeof(float));
    memset(s1, 0, 3 * n * sizeof(float));
    ct_optim *o;
    ct_adamw_opts ao = ct_adamw_default_opts();
    ao.amsgrad = variant;
    ao.weight_decay = 0.1;
    ct_sgd_opts so = ct_sgd_default_opts();
    so.momentum = 0.9;
    so.weight_decay = 1e-3;
    so.nesterov = variant;
    CT_ASSERT((adamw ? ct_optim_create_adamw(P, &ao, &o) : ct_optim_create_sgd(P, &so, &o)) == CT_OK);
    for (int step = 1; step <= 3; step++) {
        float *G = ct_params_grad(P);
        for (size_t i = 0; i < n; i++) G[i] = urand(1.0f);
        double lr = 1e-2 * step;
        ct_optim_step(o, lr);
        if (adamw) {
            ct_k_adamw k = ct_k_adamw_consts(ao.beta1, ao.beta2, ao.eps, ao.weight_decay, lr, step, false);
            for (size_t i = 0; i < n; i++) ct_k_adamw_elem(&k, p + i, G[i], s1 + i, s2 + i, variant ? s3 + i : NULL);
        } else {
            ct_k_sgd k = ct_k_sgd_consts(so.momentum, so.dampening, so.weight_decay, so.nesterov, false, lr, step == 1);
            for (size_t i = 0; i < n; i++) ct_k_sgd_elem(&k, p + i, G[i], s1 + i);
        }
    }
    int64_t d = bit_diffs(p, ct_params_data(P), (int64_t)n);
    CT_EXPECTF(d == 0, "%s%s: %lld of %zu parameters differ after 3 steps", adamw ? "adamw" : "sgd",
               variant ? (adamw ? " amsgrad" : " nesterov") : "", (long long)d, n);
    ct_optim_free(o);
    ct_params_free(P);
    free(p);
}
CT_TEST(adamw_bit_equal) { check_optim(true, false); check_optim(true, true); }
CT_TEST(sgd_bit_equal) { check_optim(false, false); check_optim(false, true); }

/* The attention rows the GPU threads run, over whole heads, against ct_flash_attention's
 * output and gradients (the CPU op is checked against PyTorch elsewhere). */
static void check_attention(int64_t T, int D, bool causal) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t H = 2, sh[4] = {1, H, T, D};
    ct_tensor *q = rnd(c, 4, sh, 2.0f), *k = rnd(c, 4, sh, 2.0f), *v = rnd(c, 4, sh, 1.0f), *g = rnd(c, 4, sh, 1.0f);
    ct_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
    ct_tensor *y = ct_flash_attention(c, q, k, v, causal);
    ct_backward_seed(c, y, g);
    int64_t n = H * T * D;
    float *o = malloc((size_t)(4 * n + 2 * H * T) * sizeof(float)), *dq = o + n, *dk = dq + n, *dv = dk + n;
    float *lse = dv + n, *dr = lse + H * T;
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t h = 0; h < H; h++) {
        const float *Q = ct_f32(q) + h * T * D, *K = ct_f32(k) + h * T * D, *V = ct_f32(v) + h * T * D;
        const float *dO = ct_f32(g) + h * T * D;
        for (int64_t i = 0; i < T; i++) {
            ct_k_attn_fwd_row_f32(Q + i * D, K, V, causal ? i + 1 : T, D, D, scale, o + (h * T + i) * D, lse + h * T + i);
            float s = 0;
            for (int cc = 0; cc < D; cc++) s += dO[i * D + cc] * o[(h * T + i) * D + cc];
            dr[h * T + i] = s;
        }
        for (int64_t i = 0; i < T; i++)
            ct_k_attn_dq_row_f32(Q + i * D, dO + i * D, K, V, causal ? i + 1 : T, D, D, scale, lse[h * T + i], dr[h * T + i],
                                 dq + (h * T + i) * D);
        for (int64_t j = 0; j < T; j++)
            ct_k_attn_dkv_row_f32(K + j * D, V + j * D, Q, dO, lse + h * T, dr + h * T, causal ? j : 0, T, D, D, scale,
                                  dk + (h * T + j) * D, dv + (h * T + j) * D);
    }
    const float *ref[4] = {ct_f32(y), ct_f32(q->grad), ct_f32(k->grad), ct_f32(v->grad)};
    const char *nm[4] = {"O", "dQ", "dK", "dV"};
    for (int p = 0; p < 4; p++) {
        double e = normwise(o + p * n, ref[p], n);
        CT_EXPECTF(e <= 1e-5, "attention T=%lld D=%d causal=%d %s: error %g > 1e-5", (long long)T, D, causal, nm[p], e);
    }
    free(o);
    ct_ctx_free(c);
}
CT_TEST(flash_attention_rows) {
    check_attention(100, 64, true);
    check_attention(77, 32, false);
    check_attention(33, 128, true);
}

/* dropout: the CPU op's mask and scale are ct_k_dropout's, forward and backward (last: the
 * earlier tests keep their random inputs) */
CT_TEST(dropout_bit_equal) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t n = 4099;
    ct_tensor *x = rnd(c, 1, &n, 2.0f), *g = rnd(c, 1, &n, 1.0f);
    ct_requires_grad(x);
    ct_tensor *y = ct_dropout(c, x, 0.3f);
    uint64_t key = (uint64_t)y->node->i[0];
    ct_backward_seed(c, y, g);
    int64_t fwd = 0, bwd = 0, dropped = 0;
    float scale = 1.0f / (1.0f - 0.3f);
    for (int64_t i = 0; i < n; i++) {
        float f = ct_k_dropout(key, i, 0.3f, scale), ky = ct_f32(x)[i] * f, kg = ct_f32(g)[i] * f;
        fwd += memcmp(&ky, ct_f32(y) + i, sizeof ky) != 0;
        bwd += memcmp(&kg, ct_f32(x->grad) + i, sizeof kg) != 0 && !(kg == 0 && ct_f32(x->grad)[i] == 0);
        dropped += f == 0;
    }
    CT_EXPECTF(fwd == 0 && bwd == 0, "dropout: %lld forward, %lld backward elements differ", (long long)fwd, (long long)bwd);
    CT_EXPECTF(dropped > n / 5 && dropped < n * 2 / 5, "dropped %lld of %lld at p = 0.3", (long long)dropped, (long long)n);
    ct_ctx_free(c);
}


/* Max pooling: ct_k_max_pool_at (forward, arg-max) and ct_k_max_pool_dx (the gradient gathered
 * per input, as the CUDA kernels run them) against the CPU op, bit for bit, on inputs with
 * many ties (values on a grid of 5) and a NaN: 2x2/2 (the CPU's vector path), overlapping
 * 3x3/2 windows with padding 1 over odd sizes, 3x3/1, with and without the fused ReLU. */
static void check_max_pool(int64_t H, int64_t W, int k, int s, int p, bool relu) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t N = 2, C = 3, HW = H * W;
    ct_tensor *x = rnd(c, 4, (int64_t[]){N, C, H, W}, 1.0f);
    for (int64_t i = 0; i < ct_numel(x); i++) ct_f32(x)[i] = roundf(ct_f32(x)[i] * 2.0f) * 0.5f;
    ct_f32(x)[HW + 5] = NAN;
    ct_requires_grad(x);
    ct_tensor *y = relu ? ct_relu_max_pool2d(c, x, k, s, p) : ct_max_pool2d(c, x, k, s, p);
    int64_t OH = y->shape[2], OW = y->shape[3], OP = OH * OW;
    ct_tensor *g = rnd(c, 4, y->shape, 1.0f);
    ct_backward_seed(c, y, g);
    float *ky = malloc((size_t)(N * C * (OP + HW)) * sizeof(float)), *kdx = ky + N * C * OP;
    int32_t *arg = malloc((size_t)(N * C * OP) * sizeof(int32_t));
    for (int64_t pl = 0; pl < N * C; pl++)
        for (int64_t q = 0; q < OP; q++)
            ky[pl * OP + q] = ct_k_max_pool_at(ct_f32(x) + pl * HW, H, W, k, s, p, q / OW, q % OW, relu, arg + pl * OP + q);
    for (int64_t pl = 0; pl < N * C; pl++)
        for (int64_t i = 0; i < HW; i++)
            kdx[pl * HW + i] = ct_k_max_pool_dx(ct_f32(g) + pl * OP, ky + pl * OP, arg + pl * OP, W, OH, OW, k, s, p, i / W, i % W,
                                                relu, 0.0f);
    CT_EXPECTF(bit_diffs(ky, ct_f32(y), N * C * OP) == 0, "max pool %dx%d/%d p%d relu %d: forward differs", k, k, s, p, relu);
    CT_EXPECTF(bit_diffs(kdx, ct_f32(x->grad), N * C * HW) == 0, "max pool %dx%d/%d p%d relu %d: gradient differs", k, k, s, p,
               relu);
    free(ky);
    free(arg);
    ct_ctx_free(c);
}
CT_TEST(max_pool_bit_equal) {
    for (int relu = 0; relu < 2; relu++) {
        check_max_pool(12, 16, 2, 2, 0, relu);
        check_max_pool(13, 11, 3, 2, 1, relu);
        check_max_pool(9, 7, 3, 1, 1, relu);
        check_max_pool(7, 10, 2, 2, 1, relu);
    }
}

/* softmax and log-softmax rows (softmax.cu's arithmetic) against the CPU ops, forward and
 * backward: only the order of the row sums differs */
static void check_softmax(bool log_out) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t R = 29, D = 1000;
    ct_tensor *x = rnd(c, 2, (int64_t[]){R, D}, 6.0f), *g = rnd(c, 2, (int64_t[]){R, D}, 1.0f);
    ct_requires_grad(x);
    ct_tensor *y = log_out ? ct_log_softmax(c, x) : ct_softmax(c, x);
    ct_backward_seed(c, y, g);
    float *ky = malloc((size_t)(2 * R * D) * sizeof(float)), *kdx = ky + R * D;
    for (int64_t r = 0; r < R; r++) {
        ct_k_softmax_row(ct_f32(x) + r * D, D, D, log_out, ky + r * D);
        ct_k_softmax_row_bwd(ky + r * D, ct_f32(g) + r * D, D, log_out, kdx + r * D);
    }
    double ef = normwise(ky, ct_f32(y), R * D), eb = normwise(kdx, ct_f32(x->grad), R * D);
    /* 5e-6: every softmax output carries the rounding of its row's f32 sum of 1000 exps,
     * summed in order here and 16 lanes wide by the CPU op (log-softmax only through a log) */
    CT_EXPECTF(ef <= 5e-6 && eb <= 5e-6, "%s: forward error %g, backward %g (> 5e-6)", log_out ? "log_softmax" : "softmax", ef, eb);
    free(ky);
    ct_ctx_free(c);
}
CT_TEST(softmax_rows) { check_softmax(false); }
CT_TEST(log_softmax_rows) { check_softmax(true); }

/* mean squared error: the gradient is the same operations as the CPU op's, so the same bits */
CT_TEST(mse_loss_bit_equal_gradient) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t n = 5003;
    ct_tensor *a = rnd(c, 1, &n, 2.0f), *b = rnd(c, 1, &n, 2.0f);
    ct_requires_grad(a);
    ct_requires_grad(b);
    ct_tensor *loss = ct_mse_loss(c, a, b);
    ct_tensor *seed = ct_new(c, CT_F32, 0, NULL);
    ct_f32(seed)[0] = 0.75f;
    ct_backward_seed(c, loss, seed);
    float *ka = malloc((size_t)(2 * n) * sizeof(float)), *kb = ka + n, s = ct_k_mse_scale(0.75f, n);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        float d = ct_f32(a)[i] - ct_f32(b)[i];
        sum += (double)(d * d);
        ka[i] = ct_k_mse_grad(ct_f32(a)[i], ct_f32(b)[i], s);
        kb[i] = -ka[i];
    }
    CT_EXPECT_NEAR(sum / (double)n, ct_f32(loss)[0], 1e-6 * fabs(ct_f32(loss)[0]));
    CT_EXPECTF(bit_diffs(ka, ct_f32(a->grad), n) == 0 && bit_diffs(kb, ct_f32(b->grad), n) == 0,
               "mse_loss gradients: %lld and %lld elements differ", (long long)bit_diffs(ka, ct_f32(a->grad), n),
               (long long)bit_diffs(kb, ct_f32(b->grad), n));
    free(ka);
    ct_ctx_free(c);
}

/* bias_add's channel of each element: the CPU op's result bit for bit */
CT_TEST(bias_add_channels) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t sh[4] = {3, 5, 4, 7}, C = 5;
    ct_tensor *x = rnd(c, 4, sh, 1.0f), *b = rnd(c, 1, &C, 1.0f), *y = ct_bias_add(c, x, b);
    int64_t bad = 0;
    for (int64_t i = 0; i < ct_numel(x); i++) {
        float k = ct_f32(x)[i] + ct_f32(b)[ct_k_bias_channel(i, C, 28)];
        bad += memcmp(&k, ct_f32(y) + i, sizeof k) != 0;
    }
    CT_EXPECT_EQ(bad, 0);
    ct_ctx_free(c);
}

/* plain attention through the row functions of the CUDA path (softmax.cu: the masked softmax
 * row and dS = P (dP - rowsum) scale) with the GEMMs as plain loops, against ct_attention */
static void gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B, float *C) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t p = 0; p < K; p++) s += (double)(ta ? A[p * M + i] : A[i * K + p]) * (tb ? B[j * K + p] : B[p * N + j]);
            C[i * N + j] = (float)(s * alpha);
        }
}
static void check_plain_attention(int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, bool causal) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t H = 2;
    ct_tensor *q = rnd(c, 4, (int64_t[]){1, H, Tq, D}, 2.0f), *k = rnd(c, 4, (int64_t[]){1, H, Tk, D}, 2.0f);
    ct_tensor *v = rnd(c, 4, (int64_t[]){1, H, Tk, Dv}, 1.0f), *g = rnd(c, 4, (int64_t[]){1, H, Tq, Dv}, 1.0f);
    ct_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
    ct_tensor *y = ct_attention(c, q, k, v, causal);
    ct_backward_seed(c, y, g);
    int64_t nq = Tq * D, nk = Tk * D, nv = Tk * Dv, no = Tq * Dv;
    float *S = malloc((size_t)(2 * Tq * Tk) * sizeof(float)), *dS = S + Tq * Tk;
    float *o = malloc((size_t)(H * (no + nq + nk + nv)) * sizeof(float)), *dq = o + H * no, *dk = dq + H * nq, *dv = dk + H * nk;
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t h = 0; h < H; h++) {
        const float *Q = ct_f32(q) + h * nq, *K = ct_f32(k) + h * nk, *V = ct_f32(v) + h * nv, *dO = ct_f32(g) + h * no;
        gemm_ref(false, true, Tq, Tk, D, scale, Q, K, S);
        for (int64_t i = 0; i < Tq; i++) {
            int64_t vis = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
            ct_k_softmax_row(S + i * Tk, Tk, vis, false, S + i * Tk);
        }
        gemm_ref(false, false, Tq, Dv, Tk, 1.0f, S, V, o + h * no);
        gemm_ref(true, false, Tk, Dv, Tq, 1.0f, S, dO, dv + h * nv);
        gemm_ref(false, true, Tq, Tk, Dv, 1.0f, dO, V, dS);
        for (int64_t i = 0; i < Tq; i++) {
            float dot = 0;
            for (int64_t j = 0; j < Tk; j++) dot += dS[i * Tk + j] * S[i * Tk + j];
            for (int64_t j = 0; j < Tk; j++) dS[i * Tk + j] = ct_k_attn_ds(S[i * Tk + j], dS[i * Tk + j], dot, scale);
        }
        gemm_ref(false, false, Tq, D, Tk, 1.0f, dS, K, dq + h * nq);
        gemm_ref(true, false, Tk, D, Tq, 1.0f, dS, Q, dk + h * nk);
    }
    const float *kr[4] = {o, dq, dk, dv}, *ref[4] = {ct_f32(y), ct_f32(q->grad), ct_f32(k->grad), ct_f32(v->grad)};
    const int64_t len[4] = {H * no, H * nq, H * nk, H * nv};
    const char *nm[4] = {"O", "dQ", "dK", "dV"};
    for (int p = 0; p < 4; p++) {
        double e = normwise(kr[p], ref[p], len[p]);
        CT_EXPECTF(e <= 1e-5, "attention Tq=%lld Tk=%lld causal=%d %s: error %g > 1e-5", (long long)Tq, (long long)Tk, causal,
                   nm[p], e);
    }
    free(S);
    free(o);
    ct_ctx_free(c);
}
CT_TEST(plain_attention_rows) {
    check_plain_attention(45, 45, 16, 16, true);
    check_plain_attention(30, 41, 24, 8, false);
    check_plain_attention(50, 20, 8, 12, true); /* more queries than keys: late rows see all */
}

/* f32 <-> bf16 (the device cast, pointwise.cu) against ct_convert: ties to even, NaN, infinities, subnormals */
CT_TEST(bf16_conversion_bit_equal) {
    const float sp[] = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, 3.3895314e38f, INFINITY, -INFINITY, NAN, 1e-40f, -2.5e-39f};
    float xs[4096 + sizeof sp / sizeof sp[0]];
    size_t n = sizeof xs / sizeof xs[0];
    for (size_t i = 0; i < 4096; i++) xs[i] = urand(1000.0f);
    memcpy(xs + 4096, sp, sizeof sp);
    uint16_t ref[sizeof xs / sizeof xs[0]];
    float back[sizeof xs / sizeof xs[0]];
    ct_convert(ref, CT_BF16, xs, CT_F32, n);
    ct_convert(back, CT_F32, ref, CT_BF16, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float kb = ct_k_bf16_to_f32(ref[i]);
        bad += ct_k_f32_to_bf16(xs[i]) != ref[i] || memcmp(&kb, back + i, 4) != 0;
    }
    CT_EXPECT_EQ((long long)bad, 0);
}

CT_TEST_MAIN()
