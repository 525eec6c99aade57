/* The SGD step inside backward (ct_optim_arm_in_backward; ct_train_step arms it for one
 * process): the same bits as backward followed by ct_optim_step, and it really runs inside
 * backward (a linear weight has moved before the step is called, its bias has not). */
#include <string.h>

#include "ct_test.h"
#include "ctrain/config.h"
#include "ctrain/models.h"
#include "ctrain/ops.h"
#include "ctrain/optim.h"
#include "ctrain/train.h"

static uint64_t rng_state;
static float urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* params of a built-in model after `steps` ct_train_step calls (a malloc'ed copy) */
static float *train(ct_model_kind kind, int threads, bool in_backward, const ct_sgd_opts *so, int steps, size_t *n) {
    CT_EXPECT_OK(ct_config_set("CTRAIN_OPTIM_IN_BACKWARD", in_backward ? "1" : "0"));
    ct_set_num_threads(threads);
    ct_model_config cfg = ct_model_default_config(kind);
    if (kind == CT_MODEL_MLP) { /* odd sizes: edge tiles, a GEMM split over threads, a last layer below the own GEMM */
        cfg.mlp.n_hidden = 2; cfg.mlp.hidden[0] = 301; cfg.mlp.hidden[1] = 77;
    }
    ct_model *m;
    CT_EXPECT_OK(ct_model_create(&cfg, 7, &m));
    ct_optim *opt;
    CT_EXPECT_OK(ct_optim_create_sgd(ct_model_params(m), so, &opt));
    ct_ctx *ctx;
    CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    enum { B = 19 };
    int64_t xs[4] = {B, 1, 28, 28}, ys[1] = {B};
    static float x[B * 28 * 28];
    static int32_t y[B];
    ct_train_model tm = ct_train_model_builtin(m);
    ct_step_args sa = {.ctx = ctx, .model = &tm, .opt = opt, .lr = 0.05};
    for (int s = 0; s < steps; s++) {
        rng_state = 1000u + (uint64_t)s;
        for (int i = 0; i < B * 28 * 28; i++) x[i] = urand();
        for (int i = 0; i < B; i++) y[i] = (int32_t)((urand() + 1.0f) * 4.99f);
        ct_train_batch tb = kind == CT_MODEL_MLP ? ct_train_batch_of(CT_F32, x, 2, (int64_t[]){B, 784}, y, 1, ys)
                                                 : ct_train_batch_of(CT_F32, x, 4, xs, y, 1, ys);
        sa.step = s;
        sa.lr = 0.05 * (1.0 - 0.1 * s); /* a schedule: the armed lr follows it */
        CT_EXPECT_OK(ct_train_step(&sa, &tb, 1, NULL));
    }
    *n = ct_params_numel(ct_model_params(m));
    float *out = malloc(*n * sizeof(float));
    memcpy(out, ct_params_data(ct_model_params(m)), *n * sizeof(float));
    ct_ctx_free(ctx);
    ct_optim_free(opt);
    ct_model_free(m);
    ct_set_num_threads(1);
    CT_EXPECT_OK(ct_config_set("CTRAIN_OPTIM_IN_BACKWARD", "1"));
    return out;
}

CT_TEST(trainer_same_bits_with_and_without) {
    ct_sgd_opts variants[3];
    variants[0] = ct_sgd_default_opts();
    variants[0].momentum = 0.9;
    variants[1] = variants[0];
    variants[1].weight_decay = 1e-3;
    variants[1].decay_only_ndim_ge2 = true; /* weights and biases in runs of different decay */
    variants[2] = variants[1];
    variants[2].nesterov = true;
    variants[2].maximize = true;
    ct_model_kind kinds[2] = {CT_MODEL_MLP, CT_MODEL_CNN};
    for (int k = 0; k < 2; k++)
        for (int v = 0; v < 3; v++)
            for (int t = 1; t <= 2; t++) {
                size_t n0, n1;
                float *ref = train(kinds[k], t, false, &variants[v], 4, &n0);
                float *got = train(kinds[k], t, true, &variants[v], 4, &n1);
                CT_EXPECTF(n0 == n1 && memcmp(ref, got, n0 * sizeof(float)) == 0, "model %d, variant %d, %d threads: other bits", k,
                           v, t);
                free(ref);
                free(got);
            }
}

/* armed by hand: the weight moves during backward, the bias in the step; the result is the
 * unarmed one's. Shapes the own GEMM takes (the update per block inside it) and one it leaves
 * to OpenBLAS (5 outputs: the update after the product). */
static void inside_backward(int O) {
    const int R = 40, I = 70;
    float ref[50 * 70 + 50];
    for (int armed = 0; armed < 2; armed++) {
        ct_params *P;
        CT_EXPECT_OK(ct_params_create(&P));
        ct_tensor *w = ct_param(P, "w", 2, (int64_t[]){O, I}, CT_INIT_ZEROS, 0), *b = ct_param(P, "b", 1, (int64_t[]){O}, CT_INIT_ZEROS, 0);
        CT_EXPECT_OK(ct_params_finalize(P, 1));
        rng_state = 5;
        for (int i = 0; i < O * I; i++) ct_f32(w)[i] = urand();
        for (int i = 0; i < O; i++) ct_f32(b)[i] = urand();
        ct_sgd_opts so = ct_sgd_default_opts();
        so.momentum = 0.5;
        ct_optim *opt;
        CT_EXPECT_OK(ct_optim_create_sgd(P, &so, &opt));
        ct_ctx *ctx;
        CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
        for (int s = 0; s < 3; s++) {
            ct_tensor *x = ct_new(ctx, CT_F32, 2, (int64_t[]){R, I});
            for (int i = 0; i < R * I; i++) ct_f32(x)[i] = urand();
            ct_params_zero_grad(P);
            float w0 = ct_f32(w)[7], b0 = ct_f32(b)[3];
            CT_EXPECT(!armed || ct_optim_arm_in_backward(opt, 0.1));
            ct_backward(ctx, ct_sum(ctx, ct_linear(ctx, x, w, b)));
            if (armed) CT_EXPECTF(ct_f32(w)[7] != w0 && ct_f32(b)[3] == b0, "step %d: weight moved %d, bias moved %d", s,
                                  ct_f32(w)[7] != w0, ct_f32(b)[3] != b0);
            ct_optim_step(opt, 0.1);
            ct_ctx_reset(ctx);
        }
        size_t bytes = (size_t)(O * I + O) * sizeof(float);
        if (!armed) memcpy(ref, ct_params_data(P), bytes);
        else CT_EXPECTF(memcmp(ref, ct_params_data(P), bytes) == 0, "%d outputs: other bits", O);
        ct_ctx_free(ctx);
        ct_optim_free(opt);
        ct_params_free(P);
    }
}
CT_TEST(weight_updated_inside_backward) {
    inside_backward(50);
    inside_backward(5);
}

/* AdamW (and a store on no CPU) is not armed: the trainer steps after backward */
CT_TEST(only_sgd_arms) {
    ct_params *P;
    CT_EXPECT_OK(ct_params_create(&P));
    (void)ct_param(P, "w", 2, (int64_t[]){3, 4}, CT_INIT_ZEROS, 0);
    CT_EXPECT_OK(ct_params_finalize(P, 1));
    ct_optim *opt;
    CT_EXPECT_OK(ct_optim_create_adamw(P, NULL, &opt));
    CT_EXPECT(!ct_optim_arm_in_backward(opt, 0.1));
    ct_optim_free(opt);
    ct_params_free(P);
}

CT_TEST_MAIN()
