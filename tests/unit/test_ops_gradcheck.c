/* Finite-difference gradient checks for every op in ops.h beyond the core ones
 * (test_autograd.c covers matmul, linear, add, relu, views): small, odd shapes. */
#include "ct_test.h"
#include "gradcheck.h"

#define TOL 2e-3
/* check one gradcheck result; CT_VERBOSE=1 prints every error */
#define GC(expr) do { double e_ = (expr); if (getenv("CT_VERBOSE")) fprintf(stderr, "  %-60.60s %.3g\n", #expr, e_); \
    if (!(e_ < TOL)) CT_FAILF("%s: error %.3g", #expr, e_); } while (0)

static ct_tensor *f_mul(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_mul(c, in[0], in[1]); }
static ct_tensor *f_mul_self(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_mul(c, in[0], in[0]); }
static ct_tensor *f_scale(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_scale(c, in[0], -1.75f); }
CT_TEST(gradcheck_mul_scale) {
    ct_tensor_spec s[2] = {{3, {2, 3, 5}}, {3, {2, 3, 5}}};
    GC(ct_gradcheck(f_mul, NULL, 2, s, false));
    GC(ct_gradcheck(f_mul_self, NULL, 1, s, false));
    GC(ct_gradcheck(f_scale, NULL, 1, s, false));
}

static ct_tensor *f_bias_add(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_bias_add(c, in[0], in[1]); }
CT_TEST(gradcheck_bias_add) {
    ct_tensor_spec s4[2] = {{4, {2, 3, 4, 5}}, {1, {3}}};
    GC(ct_gradcheck(f_bias_add, NULL, 2, s4, false));
    ct_tensor_spec s2[2] = {{2, {3, 7}}, {1, {7}}};
    GC(ct_gradcheck(f_bias_add, NULL, 2, s2, false));
}

static ct_tensor *f_gelu(ct_ctx *c, ct_tensor **in, void *a) { return ct_gelu(c, in[0], a != NULL); }
static ct_tensor *f_tanh(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_tanh(c, ct_scale(c, in[0], 3.0f)); }
static ct_tensor *f_sigmoid(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_sigmoid(c, ct_scale(c, in[0], 4.0f)); }
CT_TEST(gradcheck_activations) {
    ct_tensor_spec s[1] = {{2, {7, 9}}};
    int one = 1;
    GC(ct_gradcheck(f_gelu, NULL, 1, s, false));
    GC(ct_gradcheck(f_gelu, &one, 1, s, false));
    GC(ct_gradcheck(f_tanh, NULL, 1, s, false));
    GC(ct_gradcheck(f_sigmoid, NULL, 1, s, false));
}

static ct_tensor *f_dropout(ct_ctx *c, ct_tensor **in, void *a) { return ct_dropout(c, in[0], *(float *)a); }
CT_TEST(gradcheck_dropout) {
    /* each evaluation uses a fresh context with the same seed and step: same mask */
    ct_tensor_spec s[1] = {{2, {9, 11}}};
    float ps[3] = {0.0f, 0.3f, 0.9f};
    for (int i = 0; i < 3; i++) GC(ct_gradcheck(f_dropout, &ps[i], 1, s, false));
}

static ct_tensor *f_softmax(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_softmax(c, ct_scale(c, in[0], 3.0f)); }
static ct_tensor *f_log_softmax(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_log_softmax(c, ct_scale(c, in[0], 3.0f)); }
CT_TEST(gradcheck_softmax) {
    ct_tensor_spec s[1] = {{3, {2, 3, 7}}};
    GC(ct_gradcheck(f_softmax, NULL, 1, s, false));
    GC(ct_gradcheck(f_log_softmax, NULL, 1, s, false));
    ct_tensor_spec s1[1] = {{1, {1}}};
    GC(ct_gradcheck(f_softmax, NULL, 1, s1, false));
}

static ct_tensor *f_ce(ct_ctx *c, ct_tensor **in, void *a) {
    bool i32 = a != NULL;
    int64_t t64[6] = {2, 0, -100, 4, 4, 1};
    int32_t t32[6] = {2, 0, -100, 4, 4, 1};
    ct_tensor *t = i32 ? ct_from_data(c, CT_I32, t32, 1, (int64_t[]){6}) : ct_from_data(c, CT_I64, t64, 1, (int64_t[]){6});
    return ct_cross_entropy(c, ct_scale(c, in[0], 2.0f), t, -100);
}
CT_TEST(gradcheck_cross_entropy) {
    ct_tensor_spec s[1] = {{2, {6, 5}}};
    int one = 1;
    GC(ct_gradcheck(f_ce, NULL, 1, s, false));
    GC(ct_gradcheck(f_ce, &one, 1, s, false));
}

static ct_tensor *f_mse(ct_ctx *c, ct_tensor **in, void *a) { (void)a; return ct_mse_loss(c, in[0], in[1]); }
CT_TEST(gradcheck_mse_loss) {
    ct_tensor_spec s[2] = {{2, {4, 5}}, {2, {4, 5}}};
    GC(ct_gradcheck(f_mse, NULL, 2, s, false));
}

static ct_tensor *f_ln(ct_ctx *c, ct_tensor **in, void *a) {
    int m = *(int *)a;
    return ct_layer_norm(c, ct_scale(c, in[0], 2.0f), m & 1 ? in[1] : NULL, m & 2 ? in[2] : NULL, 1e-5f);
}
CT_TEST(gradcheck_layer_norm) {
    ct_tensor_spec s[3] = {{3, {2, 3, 7}}, {1, {7}}, {1, {7}}};
    for (int m = 0; m < 4; m++) GC(ct_gradcheck_h(f_ln, &m, 3, s, false, 1e-2, 5));
}

static ct_tensor *f_emb(ct_ctx *c, ct_tensor **in, void *a) {
    int32_t idx[7] = {3, 0, 3, 5, 1, 3, 0};
    int64_t i64[7] = {3, 0, 3, 5, 1, 3, 0};
    ct_tensor *t = a ? ct_from_data(c, CT_I32, idx, 2, (int64_t[]){1, 7}) : ct_from_data(c, CT_I64, i64, 1, (int64_t[]){7});
    return ct_embedding(c, in[0], t);
}
CT_TEST(gradcheck_embedding) {
    ct_tensor_spec s[1] = {{2, {6, 5}}};
    int one = 1;
    GC(ct_gradcheck(f_emb, NULL, 1, s, false));
    GC(ct_gradcheck(f_emb, &one, 1, s, false));
}

typedef struct { int stride, pad, bias; } conv_arg;
static ct_tensor *f_conv(ct_ctx *c, ct_tensor **in, void *a) {
    conv_arg *ca = a;
    return ct_conv2d(c, in[0], in[1], ca->bias ? in[2] : NULL, ca->stride, ca->pad);
}
CT_TEST(gradcheck_conv2d) {
    ct_tensor_spec s[3] = {{4, {2, 3, 6, 5}}, {4, {4, 3, 3, 2}}, {1, {4}}};
    conv_arg args[3] = {{1, 1, 1}, {2, 0, 0}, {2, 2, 1}};
    for (int i = 0; i < 3; i++) GC(ct_gradcheck(f_conv, &args[i], args[i].bias ? 3 : 2, s, false));
}

typedef struct { int k, s, p; } pool_arg;
static ct_tensor *f_maxpool(ct_ctx *c, ct_tensor **in, void *a) { pool_arg *p = a; return ct_max_pool2d(c, in[0], p->k, p->s, p->p); }
static ct_tensor *f_avgpool(ct_ctx *c, ct_tensor **in, void *a) { pool_arg *p = a; return ct_avg_pool2d(c, in[0], p->k, p->s, p->p); }
CT_TEST(gradcheck_pooling) {
    ct_tensor_spec s[1] = {{4, {2, 3, 7, 6}}};
    pool_arg args[3] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}};
    for (int i = 0; i < 3; i++) {
        /* small step: a max must not change places inside the difference */
        GC(ct_gradcheck_h(f_maxpool, &args[i], 1, s, false, 1e-3, 2));
        GC(ct_gradcheck(f_avgpool, &args[i], 1, s, false));
    }
}

static ct_tensor *f_heads(ct_ctx *c, ct_tensor **in, void *a) {
    (void)a;
    ct_tensor *h = ct_split_heads(c, in[0], 3); /* [2, 3, 4, 2] */
    return ct_merge_heads(c, ct_mul(c, h, h));
}
CT_TEST(gradcheck_split_merge_heads) {
    ct_tensor_spec s[1] = {{3, {2, 4, 6}}};
    GC(ct_gradcheck(f_heads, NULL, 1, s, false));
}

static ct_tensor *f_attn(ct_ctx *c, ct_tensor **in, void *a) {
    return ct_attention(c, ct_scale(c, in[0], 2.0f), in[1], in[2], *(int *)a);
}
CT_TEST(gradcheck_attention) {
    for (int causal = 0; causal < 2; causal++) {
        ct_tensor_spec s[3] = {{4, {2, 2, 5, 3}}, {4, {2, 2, 5, 3}}, {4, {2, 2, 5, 4}}};
        GC(ct_gradcheck(f_attn, &causal, 3, s, false));
        /* more keys than queries */
        ct_tensor_spec r[3] = {{4, {1, 2, 3, 3}}, {4, {1, 2, 6, 3}}, {4, {1, 2, 6, 2}}};
        GC(ct_gradcheck(f_attn, &causal, 3, r, false));
    }
}

/* the GPT block pattern end to end: embedding → layer_norm → attention → gelu → loss */
static ct_tensor *f_block(ct_ctx *c, ct_tensor **in, void *a) {
    (void)a;
    int32_t tok[6] = {1, 4, 2, 2, 0, 3};
    ct_tensor *idx = ct_from_data(c, CT_I32, tok, 2, (int64_t[]){2, 3});
    ct_tensor *x = ct_embedding(c, in[0], idx);                          /* [2, 3, 4] */
    ct_tensor *h = ct_layer_norm(c, x, in[1], NULL, 1e-5f);
    ct_tensor *qh = ct_split_heads(c, h, 2);
    ct_tensor *o = ct_merge_heads(c, ct_attention(c, qh, qh, qh, true));
    o = ct_gelu(c, ct_add(c, o, x), true);
    int64_t t[6] = {0, 1, 2, 3, 0, 1};
    return ct_cross_entropy(c, ct_reshape(c, o, 2, (int64_t[]){6, 4}), ct_from_data(c, CT_I64, t, 1, (int64_t[]){6}), -100);
}
CT_TEST(gradcheck_composite_block) {
    ct_tensor_spec s[2] = {{2, {5, 4}}, {1, {4}}};
    GC(ct_gradcheck(f_block, NULL, 2, s, false));
}

CT_TEST(shapes_and_modes) {
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = ct_zeros(c, CT_F32, 2, (int64_t[]){4, 6});
    ct_fill(x, 1.0f);
    /* dropout is the identity in eval mode and with p = 0 */
    ct_ctx_set_training(c, false);
    CT_EXPECT(ct_dropout(c, x, 0.5f) == x);
    ct_ctx_set_training(c, true);
    CT_EXPECT(ct_dropout(c, x, 0.0f) == x);
    ct_tensor *z = ct_dropout(c, x, 1.0f);
    for (int i = 0; i < 24; i++) CT_EXPECT(ct_f32(z)[i] == 0.0f);
    /* two dropout calls in one step draw different masks */
    ct_tensor *d1 = ct_dropout(c, x, 0.5f), *d2 = ct_dropout(c, x, 0.5f);
    CT_EXPECT(memcmp(d1->data, d2->data, 24 * sizeof(float)) != 0);
    /* cross_entropy with every target ignored is NaN, as PyTorch */
    int64_t t[4] = {-100, -100, -100, -100};
    ct_tensor *l = ct_cross_entropy(c, x, ct_from_data(c, CT_I64, t, 1, (int64_t[]){4}), -100);
    CT_EXPECT(isnan(ct_item(l)));
    /* output shapes */
    ct_tensor *img = ct_zeros(c, CT_F32, 4, (int64_t[]){2, 3, 28, 28});
    ct_tensor *w = ct_zeros(c, CT_F32, 4, (int64_t[]){8, 3, 5, 5});
    ct_tensor *y = ct_conv2d(c, img, w, NULL, 2, 2);
    CT_EXPECT(y->shape[1] == 8 && y->shape[2] == 14 && y->shape[3] == 14);
    y = ct_max_pool2d(c, img, 2, 0, 0); /* stride 0 = kernel */
    CT_EXPECT(y->shape[2] == 14 && y->shape[3] == 14);
    y = ct_avg_pool2d(c, img, 3, 2, 1);
    CT_EXPECT(y->shape[2] == 14 && y->shape[3] == 14);
    ct_tensor *e = ct_embedding(c, ct_zeros(c, CT_F32, 2, (int64_t[]){10, 3}), ct_zeros(c, CT_I32, 2, (int64_t[]){2, 5}));
    CT_EXPECT(e->ndim == 3 && e->shape[2] == 3);
    ct_ctx_free(c);
}
CT_TEST_MAIN()
