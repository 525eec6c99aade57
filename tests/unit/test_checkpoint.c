/* Activation checkpointing: a checkpointed GPT (every block recomputed in backward) gives the
 * same loss and bit-identical gradients as the plain one, dropout on; parameters inside a
 * segment whose input needs no gradient still get theirs; grad-ready hooks fire once per
 * parameter and only when its gradient is complete; a forward without backward leaves no
 * stale counts; checkpoint_sequential splits as PyTorch; and the activation memory drops.
 * ct_linear_unevaluated (the GPT block's last GEMM on the recompute) gives ct_linear's gradients. */
#include "ct_test.h"
#include "ctrain/ctrain.h"

static ct_model *gpt(bool ckpt, int layers, int T) {
    ct_model_config c = ct_model_default_config(CT_MODEL_GPT);
    c.gpt.n_layer = layers;
    c.gpt.n_embd = 64;
    c.gpt.n_head = 4;
    c.gpt.block_size = T;
    c.gpt.vocab_size = 61;
    c.gpt.dropout = 0.1f;
    c.gpt.checkpoint_activations = ckpt;
    ct_model *m = NULL;
    ct_model_create(&c, 5, &m);
    return m;
}

static void tokens(int32_t *x, int32_t *y, int n) {
    uint64_t s = 77;
    for (int i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (int32_t)(s % 61);
        y[i] = (int32_t)((s >> 20) % 61);
    }
}

typedef struct {
    int fired[64];
    double at_fire[64]; /* sum of the parameter's gradient when its hook fired */
} hooks;
static void on_ready(void *user, ct_params *P, int i) {
    hooks *h = user;
    h->fired[i]++;
    const ct_tensor *t = ct_params_get(P, i);
    double s = 0;
    for (int64_t k = 0; k < ct_numel(t); k++) s += ct_f32(t->grad)[k];
    h->at_fire[i] = s;
}

/* loss, gradients (copied into g) and the arena peak of one step of batch 4 x T */
static double step(ct_model *m, int T, float *g, size_t *peak, hooks *h) {
    static int32_t x[4 * 256], y[4 * 256];
    tokens(x, y, 4 * T);
    ct_ctx *ctx = NULL;
    ct_ctx_create(&(ct_ctx_opts){.arena_block = 1 << 20, .seed = 3}, &ctx);
    ct_params *P = ct_model_params(m);
    if (h) ct_params_set_grad_hook(P, on_ready, h);
    ct_ctx_set_step(ctx, 11);
    ct_tensor *xt = ct_wrap(ctx, CT_I32, x, 2, (int64_t[]){4, T}), *yt = ct_wrap(ctx, CT_I32, y, 2, (int64_t[]){4, T});
    ct_tensor *loss = ct_model_loss(ctx, m, xt, yt);
    double l = ct_item(loss);
    ct_backward(ctx, loss);
    memcpy(g, ct_params_grad(P), ct_params_numel(P) * sizeof(float));
    *peak = ct_ctx_peak_bytes(ctx);
    ct_params_set_grad_hook(P, NULL, NULL);
    ct_params_zero_grad(P);
    ct_ctx_free(ctx);
    return l;
}

CT_TEST(checkpointed_gpt_bit_identical_with_dropout) {
    ct_model *a = gpt(false, 3, 32), *b = gpt(true, 3, 32);
    CT_ASSERT(a && b);
    size_t n = ct_params_numel(ct_model_params(a)), pa, pb;
    float *ga = malloc(n * sizeof(float)), *gb = malloc(n * sizeof(float));
    hooks ha = {0}, hb = {0};
    double la = step(a, 32, ga, &pa, &ha), lb = step(b, 32, gb, &pb, &hb);
    CT_EXPECT(la == lb);
    CT_EXPECT(memcmp(ga, gb, n * sizeof(float)) == 0);
    ct_params *P = ct_model_params(b);
    for (int i = 0; i < ct_params_count(P); i++) {
        if (ct_params_is_buffer(P, i)) continue;
        /* once each, and only when the gradient was complete */
        CT_EXPECT_EQ(hb.fired[i], 1);
        CT_EXPECT_EQ(ha.fired[i], 1);
        double final = 0;
        const ct_tensor *t = ct_params_get(P, i);
        for (int64_t k = 0; k < ct_numel(t); k++) final += gb[ct_params_offset(P, i) + (size_t)k];
        if (hb.at_fire[i] != final) CT_FAILF("hook of %s fired before its gradient was complete", t->name);
    }
    free(ga);
    free(gb);
    ct_model_free(a);
    ct_model_free(b);
}

/* The first segment's input is the data itself (no gradient): its parameters must still get
 * theirs — the case PyTorch's reentrant checkpoint gets wrong. */
CT_TEST(parameters_get_gradients_when_input_needs_none) {
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_module *seq = ct_nn_sequential("");
    for (int i = 0; i < 3; i++) {
        ct_seq_add(seq, ct_nn_linear(P, ct_seq_next_name(seq), 16, 16, true));
        ct_seq_add(seq, ct_nn_tanh());
    }
    CT_ASSERT(ct_params_finalize(P, 9) == CT_OK);
    float x[8 * 16];
    for (int i = 0; i < 8 * 16; i++) x[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    size_t n = ct_params_numel(P);
    float *want = malloc(n * sizeof(float));
    for (int pass = 0; pass < 3; pass++) {
        ct_ctx *ctx;
        CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
        ct_tensor *xt = ct_wrap(ctx, CT_F32, x, 2, (int64_t[]){8, 16});
        ct_tensor *y = pass == 0 ? ct_module_forward(ctx, seq, xt)
                     : pass == 1 ? ct_checkpoint_sequential(ctx, seq, 3, xt)   /* 2 checkpointed segments of 2 */
                                 : ct_checkpoint_module(ctx, seq, xt);         /* the whole net as one */
        ct_backward(ctx, ct_sum(ctx, y));
        if (pass == 0) memcpy(want, ct_params_grad(P), n * sizeof(float));
        else CT_EXPECT(memcmp(want, ct_params_grad(P), n * sizeof(float)) == 0);
        double norm = 0;
        for (size_t i = 0; i < n; i++) norm += fabs(ct_params_grad(P)[i]);
        CT_EXPECT(norm > 0);
        ct_params_zero_grad(P);
        ct_ctx_free(ctx);
    }
    free(want);
    ct_module_free(seq);
    ct_params_free(P);
}

/* A checkpointed forward that never runs backward (evaluation with grad on, an error) must not
 * leave use counts behind: the next step's hooks still fire once, at the right time. */
CT_TEST(forward_without_backward_leaves_no_counts) {
    ct_model *m = gpt(true, 2, 16);
    CT_ASSERT(m);
    static int32_t x[64], y[64];
    tokens(x, y, 64);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    ct_model_loss(ctx, m, ct_wrap(ctx, CT_I32, x, 2, (int64_t[]){4, 16}), ct_wrap(ctx, CT_I32, y, 2, (int64_t[]){4, 16}));
    ct_ctx_reset(ctx);
    size_t n = ct_params_numel(ct_model_params(m)), peak;
    float *g = malloc(n * sizeof(float));
    hooks h = {0};
    step(m, 16, g, &peak, &h);
    ct_params *P = ct_model_params(m);
    for (int i = 0; i < ct_params_count(P); i++)
        if (!ct_params_is_buffer(P, i)) CT_EXPECT_EQ(h.fired[i], 1);
    free(g);
    ct_ctx_free(ctx);
    ct_model_free(m);
}

CT_TEST(checkpointing_saves_activation_memory) {
    ct_model *a = gpt(false, 6, 256), *b = gpt(true, 6, 256);
    CT_ASSERT(a && b);
    size_t n = ct_params_numel(ct_model_params(a)), pa, pb;
    float *g = malloc(n * sizeof(float));
    step(a, 256, g, &pa, NULL);
    step(b, 256, g, &pb, NULL);
    printf("  GPT 6 x 64, batch 4 x 256: arena peak %.1f MB plain, %.1f MB checkpointed (%.2fx)\n", pa / 1048576.0,
           pb / 1048576.0, (double)pb / (double)pa);
    CT_EXPECT(pb < 0.5 * pa);
    free(g);
    ct_model_free(a);
    ct_model_free(b);
}

/* the same node without the GEMM: output 0, every gradient the same bits as ct_linear's */
CT_TEST(linear_unevaluated_gives_the_same_gradients) {
    float grads[2][3][24] = {{{0}}};
    for (int u = 0; u < 2; u++) {
        ct_ctx *c;
        CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
        ct_tensor *x = ct_new(c, CT_F32, 2, (int64_t[]){4, 6}), *w = ct_new(c, CT_F32, 2, (int64_t[]){4, 6});
        ct_tensor *b = ct_new(c, CT_F32, 1, (int64_t[]){4}), *g = ct_new(c, CT_F32, 2, (int64_t[]){4, 4});
        ct_tensor *in[3] = {x, w, b};
        for (int i = 0; i < 24; i++) {
            ((float *)x->data)[i] = (float)(i % 7) * 0.25f - 0.5f;
            ((float *)w->data)[i] = (float)(i % 5) * 0.125f - 0.3f;
        }
        for (int i = 0; i < 16; i++) ((float *)g->data)[i] = (float)(i % 3) - 1.0f;
        for (int i = 0; i < 4; i++) ((float *)b->data)[i] = 0.1f * (float)i;
        for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
        ct_tensor *y = u ? ct_linear_unevaluated(c, x, w, b) : ct_linear(c, x, w, b);
        if (u)
            for (int i = 0; i < 16; i++) CT_EXPECT(((float *)y->data)[i] == 0.0f);
        ct_backward_seed(c, y, g);
        for (int i = 0; i < 3; i++) memcpy(grads[u][i], in[i]->grad->data, ct_nbytes(in[i]));
        ct_ctx_free(c);
    }
    CT_EXPECT(memcmp(grads[0], grads[1], sizeof grads[0]) == 0);
}

CT_TEST_MAIN()
