/* ct_params_zero_grad marks gradients stale instead of clearing them (tensor.h): backward's
 * first write of each stores, and what backward leaves untouched reads as zeros. Checked
 * here: an unused parameter, accumulation over two backwards, the grad hook, and the
 * built-in models' gradients against the cleared-buffer path (ct_params_grad right after
 * ct_params_zero_grad settles every gradient to zeros, so backward then adds into zeros as
 * before), bit for bit but the sign of a zero, on 1 and 2 threads. */
#include <omp.h>

#include "ct_test.h"
#include "ctrain/models.h"
#include "ctrain/ops.h"

/* x [1, 3] = (1, 2, 3) in c */
static ct_tensor *row123(ct_ctx *c) {
    ct_tensor *x = ct_zeros(c, CT_F32, 2, (int64_t[]){1, 3});
    for (int i = 0; i < 3; i++) ct_f32(x)[i] = (float)(i + 1);
    return x;
}

static int hook_calls;
static float hook_seen; /* max |gradient| of the hooked parameter when its hook fired */
static void max_abs_hook(void *user, ct_params *P, int i) {
    (void)user;
    const ct_tensor *t = ct_params_get(P, i);
    if (strcmp(t->name, "v")) return;
    hook_calls++;
    for (int64_t k = 0; k < ct_numel(t); k++) hook_seen = fmaxf(hook_seen, fabsf(ct_f32(t->grad)[k]));
}

CT_TEST(unused_parameter_ends_with_zero_gradient) {
    ct_params *P;
    ct_ctx *c;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_tensor *w = ct_param(P, "w", 2, (int64_t[]){2, 3}, CT_INIT_ONES, 0);
    ct_tensor *u = ct_param(P, "u", 2, (int64_t[]){2, 3}, CT_INIT_ONES, 0);
    ct_tensor *v = ct_param(P, "v", 2, (int64_t[]){2, 3}, CT_INIT_ONES, 0);
    CT_ASSERT(ct_params_finalize(P, 1) == CT_OK);
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    ct_params_set_grad_hook(P, max_abs_hook, NULL);
    /* step 1: all three get gradients */
    ct_tensor *x = row123(c);
    ct_tensor *l = ct_add(c, ct_sum(c, ct_linear(c, x, w, NULL)), ct_sum(c, ct_linear(c, x, u, NULL)));
    ct_backward(c, ct_add(c, l, ct_sum(c, ct_linear(c, x, v, NULL))));
    ct_ctx_reset(c);
    CT_EXPECT(ct_f32(u->grad)[0] == 1.0f && ct_f32(v->grad)[5] == 3.0f);
    /* step 2: u unused, v used by an op whose output the loss does not need */
    ct_params_zero_grad(P);
    CT_EXPECT(u->flags & CT_TF_GRAD_STALE);
    hook_calls = 0;
    hook_seen = -1;
    x = row123(c);
    (void)ct_linear(c, x, v, NULL);
    ct_backward(c, ct_sum(c, ct_linear(c, x, w, NULL)));
    CT_EXPECT_EQ(hook_calls, 1);
    CT_EXPECT(hook_seen == 0.0f); /* the hook read zeros, not step 1's gradient */
    int bad = 0;
    for (int k = 0; k < 6; k++) bad += ct_f32(u->grad)[k] != 0.0f || ct_f32(v->grad)[k] != 0.0f;
    CT_EXPECT_EQ(bad, 0); /* through the tensors, right after backward */
    CT_EXPECT(ct_f32(w->grad)[0] == 1.0f && ct_f32(w->grad)[5] == 3.0f);
    CT_EXPECT(!(u->flags & CT_TF_GRAD_STALE));
    /* zero_grad and no backward: the flat buffer reads zeros */
    ct_params_zero_grad(P);
    const float *G = ct_params_grad(P);
    bad = 0;
    for (size_t k = 0; k < ct_params_numel(P); k++) bad += G[k] != 0.0f;
    CT_EXPECT_EQ(bad, 0);
    ct_ctx_free(c);
    ct_params_free(P);
}

CT_TEST(two_backwards_without_zero_grad_accumulate) {
    ct_params *P;
    ct_ctx *c;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_tensor *w = ct_param(P, "w", 2, (int64_t[]){2, 3}, CT_INIT_ONES, 0);
    ct_tensor *b = ct_param(P, "b", 1, (int64_t[]){2}, CT_INIT_ZEROS, 0);
    CT_ASSERT(ct_params_finalize(P, 1) == CT_OK);
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    for (int step = 0; step < 2; step++) {
        ct_params_zero_grad(P);
        for (int k = 0; k < 2; k++) { /* micro-steps, as gradient accumulation runs them */
            ct_backward(c, ct_sum(c, ct_linear(c, row123(c), w, b)));
            ct_ctx_reset(c);
        }
        CT_EXPECT(ct_f32(w->grad)[0] == 2.0f && ct_f32(w->grad)[4] == 4.0f && ct_f32(w->grad)[5] == 6.0f);
        CT_EXPECT(ct_f32(b->grad)[0] == 2.0f && ct_f32(b->grad)[1] == 2.0f);
    }
    ct_ctx_free(c);
    ct_params_free(P);
}

/* Elements that differ other than +0 vs -0 */
static int64_t diffs(const float *a, const float *b, size_t n) {
    int64_t d = 0;
    for (size_t i = 0; i < n; i++) d += a[i] != b[i] && !(a[i] != a[i] && b[i] != b[i]);
    return d;
}

/* Three steps (forward, backward, SGD by hand) of two copies of a small model: one on stale
 * gradients, one whose gradients are settled to zeros before each backward. */
static void fresh_vs_cleared(ct_model_kind kind, int threads) {
    ct_model_config cfg = ct_model_default_config(kind);
    int B = 4;
    if (kind == CT_MODEL_MLP) { cfg.mlp.hidden[0] = 256; cfg.mlp.hidden[1] = 128; cfg.mlp.dropout = 0.1f; }
    if (kind == CT_MODEL_CNN) { cfg.cnn.c1 = 8; cfg.cnn.c2 = 16; cfg.cnn.fc = 32; cfg.cnn.dropout = 0.1f; }
    if (kind == CT_MODEL_GPT) {
        cfg.gpt.n_layer = 2; cfg.gpt.n_embd = 32; cfg.gpt.n_head = 4; cfg.gpt.block_size = 16; cfg.gpt.vocab_size = 64;
        cfg.gpt.dropout = 0.1f;
    }
    int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    ct_model *m[2];
    ct_ctx *c[2];
    for (int v = 0; v < 2; v++) {
        CT_EXPECT_OK(ct_model_create(&cfg, 7, &m[v]));
        CT_EXPECT_OK(ct_ctx_create(NULL, &c[v]));
    }
    ct_params *P[2] = {ct_model_params(m[0]), ct_model_params(m[1])};
    size_t n = ct_params_numel(P[0]);
    for (int step = 0; step < 3; step++) {
        for (int v = 0; v < 2; v++) {
            ct_params_zero_grad(P[v]);
            if (v == 1) (void)ct_params_grad(P[1]); /* settled: backward adds into zeros */
            ct_ctx_set_step(c[v], (uint64_t)step);
            ct_tensor *x, *y;
            if (kind == CT_MODEL_GPT) {
                x = ct_zeros(c[v], CT_I32, 2, (int64_t[]){B, 16});
                y = ct_zeros(c[v], CT_I32, 2, (int64_t[]){B, 16});
                for (int i = 0; i < B * 16; i++) {
                    ((int32_t *)x->data)[i] = (i * 7 + step) % 64;
                    ((int32_t *)y->data)[i] = (i * 5 + 3 * step) % 64;
                }
            } else {
                int64_t per = kind == CT_MODEL_MLP ? 784 : 28 * 28;
                x = kind == CT_MODEL_MLP ? ct_zeros(c[v], CT_F32, 2, (int64_t[]){B, 784})
                                         : ct_zeros(c[v], CT_F32, 4, (int64_t[]){B, 1, 28, 28});
                y = ct_zeros(c[v], CT_I32, 1, (int64_t[]){B});
                for (int64_t i = 0; i < B * per; i++) ct_f32(x)[i] = (float)sin(0.01 * (double)i + step);
                for (int i = 0; i < B; i++) ((int32_t *)y->data)[i] = (i + step) % 10;
            }
            ct_backward(c[v], ct_model_loss(c[v], m[v], x, y));
            ct_ctx_reset(c[v]);
        }
        const float *g0 = ct_params_grad(P[0]), *g1 = ct_params_grad(P[1]);
        int64_t d = diffs(g0, g1, n);
        CT_EXPECTF(d == 0, "%s, %d thread(s), step %d: %lld of %zu gradients differ", ct_model_kind_name(kind), threads, step,
                   (long long)d, n);
        for (int v = 0; v < 2; v++) {
            float *p = ct_params_data(P[v]);
            const float *g = ct_params_grad(P[v]);
            for (size_t i = 0; i < n; i++) p[i] -= 0.05f * g[i];
        }
    }
    for (int v = 0; v < 2; v++) { ct_ctx_free(c[v]); ct_model_free(m[v]); }
    omp_set_num_threads(prev);
}

CT_TEST(fresh_gradients_match_cleared_ones_mlp) { fresh_vs_cleared(CT_MODEL_MLP, 1); fresh_vs_cleared(CT_MODEL_MLP, 2); }
CT_TEST(fresh_gradients_match_cleared_ones_cnn) { fresh_vs_cleared(CT_MODEL_CNN, 1); fresh_vs_cleared(CT_MODEL_CNN, 2); }
CT_TEST(fresh_gradients_match_cleared_ones_gpt) { fresh_vs_cleared(CT_MODEL_GPT, 1); fresh_vs_cleared(CT_MODEL_GPT, 2); }

CT_TEST_MAIN()
