/* Autocast (ct_autocast_begin/end) against torch.autocast("cpu") (fixtures from
 * tests/torch/gen_autocast.py, models and batches of gen_models.py):
 *  - MLP, CNN, GPT under bf16 and the MLP under f16: the output's dtype (low precision) and
 *    values, the loss (f32) and every parameter gradient (f32, in the store), normwise
 *    max|ours - torch| / max|torch| within the tolerances below;
 *  - the policy op by op: LOWP ops give bf16/f16, FP32 ops f32, others follow their inputs,
 *    mixed inputs promote to f32; one cast per parameter and region (the weight cache);
 *  - a checkpointed segment recomputed in the region it ran in (same gradients);
 *  - bad dtypes refused with a message; outside a region nothing changes (bit-identical). */
#include "ct_test.h"
#include "ctrain/io.h"
#include "ctrain/models.h"
#include "model_fixture.h"

#define FIX "tests/fixtures/models/"
/* bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3): ctrain and PyTorch round
 * the same products but sum in different orders and round intermediates at slightly
 * different places (see autocast.c), so results differ by a few bf16 ulps of the largest
 * value; f16 keeps 11 bits. Measured worst cases are printed. */
#define TOL_BF16_OUT 1e-2
#define TOL_BF16_GRAD 2e-2
#define TOL_F16 2e-3


static ct_tensor *fix_tensor(ct_ctx *ctx, ct_st_file *f, const char *name) {
    ct_st_tensor t;
    CT_CHECK(ct_st_get(f, name, &t) == CT_OK, "fixture %s lacks '%s'", ct_st_path(f), name);
    return ct_from_data(ctx, t.dtype, t.data, t.ndim, t.shape);
}

/* max|a - b| / max|b| over n values of any float dtype */
static double norm_err(const ct_tensor *a, const ct_tensor *b) {
    int64_t n = ct_numel(b);
    if (!a || ct_numel(a) != n) return INFINITY;
    double d = 0, mx = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double x = ct_elem_get(a->data, a->dtype, (size_t)i), y = ct_elem_get(b->data, b->dtype, (size_t)i);
        double e = fabs(x - y);
        d = (e > d || e != e) ? e : d;
        mx = fmax(mx, fabs(y));
    }
    return d / mx;
}

/* flash: the GPT with fused attention (its bf16 tile GEMMs round P and dS) against the same
 * PyTorch fixture */
static void autocast_case(ct_model_kind kind, ct_dtype dt, bool flash) {
    char name[64], p[256];
    const char *kn = ct_model_kind_name(kind);
    snprintf(name, sizeof name, "autocast_%s_%s", kn, ct_dtype_name(dt));
    snprintf(p, sizeof p, FIX "%s.ref.safetensors", name);
    ct_st_file *f = NULL, *mf = NULL;
    CT_ASSERT(ct_st_open(p, &f) == CT_OK);
    snprintf(p, sizeof p, FIX "model_%s.ref.safetensors", kn);
    CT_ASSERT(ct_st_open(p, &mf) == CT_OK);
    ct_model_config cfg = config_from_fixture(kind, mf);
    if (flash) {
        cfg.gpt.flash_attention = true;
        strcat(name, "_flash");
    }
    ct_model *m;
    CT_ASSERT(ct_model_create(&cfg, 7, &m) == CT_OK);
    snprintf(p, sizeof p, FIX "model_%s.weights.safetensors", kn);
    CT_EXPECT_OK(ct_model_load(m, p));
    ct_params *P = ct_model_params(m);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    ct_tensor *x = fix_tensor(ctx, mf, "input"), *y = fix_tensor(ctx, mf, "target");

    CT_EXPECT_OK(ct_autocast_begin(ctx, dt));
    bool prev = ct_set_grad_enabled(ctx, false);
    ct_tensor *out = ct_model_forward(ctx, m, x);
    ct_set_grad_enabled(ctx, prev);
    ct_tensor *loss = ct_model_loss(ctx, m, x, y);
    ct_autocast_end(ctx);
    CT_EXPECTF(out->dtype == dt, "%s: output is %s", name, ct_dtype_name(out->dtype));
    CT_EXPECTF(loss->dtype == CT_F32, "%s: loss is %s", name, ct_dtype_name(loss->dtype));
    ct_tensor *rout = fix_tensor(ctx, f, "output");
    CT_EXPECT(rout->dtype == dt);
    double tol_out = dt == CT_BF16 ? TOL_BF16_OUT : TOL_F16, tol_grad = dt == CT_BF16 ? TOL_BF16_GRAD : TOL_F16;
    double eo = norm_err(out, rout), el = norm_err(loss, fix_tensor(ctx, f, "loss"));
    CT_EXPECTF(eo <= tol_out, "%s output: normwise error %.2e > %.0e", name, eo, tol_out);
    CT_EXPECTF(el <= tol_out, "%s loss: error %.2e > %.0e", name, el, tol_out);
    ct_backward(ctx, loss);
    double eg = 0;
    const char *worst = "";
    for (int i = 0; i < ct_params_count(P); i++) {
        ct_tensor *pt = ct_params_get(P, i);
        char g[CT_NN_NAME_MAX + 8];
        snprintf(g, sizeof g, "grad.%s", pt->name);
        CT_EXPECT(pt->grad && pt->grad->dtype == CT_F32 && pt->dtype == CT_F32);
        double e = norm_err(pt->grad, fix_tensor(ctx, f, g));
        CT_EXPECTF(e <= tol_grad, "%s %s: normwise error %.2e > %.0e", name, g, e, tol_grad);
        if (e > eg) { eg = e; worst = pt->name; }
    }
    printf("  %-18s output %.2e, loss %.2e, worst of %d grads %.2e (%s)\n", name, eo, el, ct_params_count(P), eg, worst);
    ct_ctx_free(ctx);
    ct_model_free(m);
    ct_st_close(f);
    ct_st_close(mf);
}

CT_TEST(mlp_bf16_vs_torch_autocast) { autocast_case(CT_MODEL_MLP, CT_BF16, false); }
CT_TEST(cnn_bf16_vs_torch_autocast) { autocast_case(CT_MODEL_CNN, CT_BF16, false); }
CT_TEST(gpt_bf16_vs_torch_autocast) { autocast_case(CT_MODEL_GPT, CT_BF16, false); }
CT_TEST(gpt_flash_bf16_vs_torch_autocast) { autocast_case(CT_MODEL_GPT, CT_BF16, true); }
CT_TEST(mlp_f16_vs_torch_autocast) { autocast_case(CT_MODEL_MLP, CT_F16, false); }

static ct_tensor *randn(ct_ctx *ctx, int nd, const int64_t *shape, uint32_t seed) {
    ct_tensor *t = ct_new(ctx, CT_F32, nd, shape);
    float *d = t->data;
    for (int64_t i = 0; i < ct_numel(t); i++) {
        seed = seed * 1664525u + 1013904223u;
        d[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    return t;
}

CT_TEST(policy_op_by_op) {
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_tensor *W = ct_param(P, "w", 2, (int64_t[]){8, 8}, CT_INIT_KAIMING_UNIFORM, 8);
    ct_tensor *b = ct_param(P, "b", 1, (int64_t[]){8}, CT_INIT_KAIMING_UNIFORM, 8);
    ct_tensor *g = ct_param(P, "g", 1, (int64_t[]){8}, CT_INIT_ONES, 0);
    CT_ASSERT(ct_params_finalize(P, 1) == CT_OK);
    ct_tensor *x = randn(ctx, 2, (int64_t[]){4, 8}, 3);
    CT_EXPECT_OK(ct_autocast_begin(ctx, CT_BF16));
    CT_EXPECT(ct_autocast_dtype(ctx) == CT_BF16);
    int tape0 = ct_tape_len(ctx);
    ct_tensor *h = ct_linear(ctx, x, W, b);                  /* LOWP: x, W, b cast to bf16 */
    CT_EXPECT(h->dtype == CT_BF16);
    ct_tensor *h2 = ct_linear(ctx, h, W, b);                 /* W, b from the cache: linear only */
    CT_EXPECT_EQ(ct_tape_len(ctx) - tape0, 4);               /* x needs no grad: its cast records nothing */
    CT_EXPECT(ct_relu(ctx, h2)->dtype == CT_BF16);            /* follows its input */
    CT_EXPECT(ct_gelu(ctx, h2, true)->dtype == CT_BF16);
    CT_EXPECT(ct_dropout(ctx, h2, 0.5f)->dtype == CT_BF16);
    CT_EXPECT(ct_transpose(ctx, h2, 0, 1)->dtype == CT_BF16);
    CT_EXPECT(ct_contiguous(ctx, ct_transpose(ctx, h2, 0, 1))->dtype == CT_BF16);
    CT_EXPECT(ct_add(ctx, h2, h)->dtype == CT_BF16);
    CT_EXPECT(ct_add(ctx, x, h)->dtype == CT_F32);            /* promotion to the widest */
    CT_EXPECT(ct_softmax(ctx, h2)->dtype == CT_F32);          /* FP32 class */
    CT_EXPECT(ct_log_softmax(ctx, h2)->dtype == CT_F32);
    CT_EXPECT(ct_layer_norm(ctx, h2, g, b, 1e-5f)->dtype == CT_F32);
    /* Llama's ops as transformers runs them under autocast: LlamaRMSNorm upcasts to f32
     * itself; silu, rotate_half's mul/add and repeat_kv's expand follow their input */
    CT_EXPECT(ct_rms_norm(ctx, h2, g, 1e-5f)->dtype == CT_F32);
    CT_EXPECT(ct_silu(ctx, h2)->dtype == CT_BF16);
    CT_EXPECT(ct_rope(ctx, h2, NULL, 10000.0f)->dtype == CT_BF16);
    CT_EXPECT(ct_repeat_kv(ctx, ct_reshape(ctx, h2, 4, (int64_t[]){1, 2, 2, 8}), 2)->dtype == CT_BF16);
    ct_tensor *s = ct_sum(ctx, ct_relu(ctx, h2));
    CT_EXPECT(s->dtype == CT_F32);
    CT_EXPECT(ct_matmul(ctx, x, x, false, true)->dtype == CT_BF16);
    ct_autocast_end(ctx);
    CT_EXPECT(ct_autocast_dtype(ctx) == CT_F32);
    /* gradients reach the f32 master weights through the (cached) cast */
    ct_backward(ctx, s);
    CT_EXPECT(W->grad && W->grad->dtype == CT_F32);
    double gw = 0;
    for (int i = 0; i < 64; i++) gw += fabs(ct_f32(W->grad)[i]);
    CT_EXPECT(gw > 0);
    /* outside a region f32 stays f32, low precision keeps its dtype */
    ct_ctx_reset(ctx);
    CT_EXPECT(ct_linear(ctx, x, W, b)->dtype == CT_F32);
    ct_tensor *xb = ct_cast(ctx, x, CT_BF16);
    CT_EXPECT(xb->dtype == CT_BF16 && ct_relu(ctx, xb)->dtype == CT_BF16);
    CT_EXPECT(ct_cast(ctx, xb, CT_F32)->dtype == CT_F32);
    /* fp16 region */
    CT_EXPECT_OK(ct_autocast_begin(ctx, CT_F16));
    CT_EXPECT(ct_linear(ctx, x, W, b)->dtype == CT_F16);
    ct_autocast_end(ctx);
    /* bad input: a clear error, state unchanged */
    CT_EXPECT(ct_autocast_begin(ctx, CT_F32) == CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "bf16 or f16") != NULL);
    CT_EXPECT(ct_autocast_begin(ctx, CT_I32) == CT_ERR_INVALID);
    CT_EXPECT(ct_autocast_dtype(ctx) == CT_F32);
    ct_ctx_free(ctx);
    ct_params_free(P);
}

/* a two-linear segment with dropout, checkpointed or not, in a bf16 region */
typedef struct { ct_tensor *W1, *W2; } seg_arg;
static ct_tensor *segment(ct_ctx *ctx, ct_tensor *x, void *arg) {
    seg_arg *a = arg;
    ct_tensor *h = ct_dropout(ctx, ct_gelu(ctx, ct_linear(ctx, x, a->W1, NULL), true), 0.25f);
    return ct_linear(ctx, h, a->W2, NULL);
}

CT_TEST(checkpoint_recomputes_in_the_region) {
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    seg_arg a = {ct_param(P, "w1", 2, (int64_t[]){16, 8}, CT_INIT_KAIMING_UNIFORM, 8),
                 ct_param(P, "w2", 2, (int64_t[]){4, 16}, CT_INIT_KAIMING_UNIFORM, 16)};
    CT_ASSERT(ct_params_finalize(P, 5) == CT_OK);
    size_t n = ct_params_numel(P);
    float *ref = malloc(n * sizeof *ref);
    for (int pass = 0; pass < 2; pass++) {
        ct_ctx *ctx; /* a fresh context each pass: the same dropout stream */
        CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
        ct_ctx_set_step(ctx, 3);
        ct_tensor *x = randn(ctx, 2, (int64_t[]){6, 8}, 11);
        CT_EXPECT_OK(ct_autocast_begin(ctx, CT_BF16));
        ct_tensor *y = pass ? ct_checkpoint(ctx, segment, &a, x) : segment(ctx, x, &a);
        CT_EXPECT(y->dtype == CT_BF16);
        ct_tensor *loss = ct_mean(ctx, ct_mul(ctx, y, y));
        ct_autocast_end(ctx);
        ct_backward(ctx, loss);
        if (!pass) memcpy(ref, ct_params_grad(P), n * sizeof *ref);
        else CT_EXPECT(memcmp(ref, ct_params_grad(P), n * sizeof *ref) == 0);
        ct_params_zero_grad(P);
        ct_ctx_free(ctx);
    }
    free(ref);
    ct_params_free(P);
}

/* bf16 activations take half the arena of f32 ones */
CT_TEST(activations_saved_in_low_precision) {
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_tensor *W = ct_param(P, "w", 2, (int64_t[]){256, 256}, CT_INIT_KAIMING_UNIFORM, 256);
    CT_ASSERT(ct_params_finalize(P, 5) == CT_OK);
    size_t used[2];
    for (int amp = 0; amp < 2; amp++) {
        ct_tensor *x = ct_cast(ctx, randn(ctx, 2, (int64_t[]){512, 256}, 1), amp ? CT_BF16 : CT_F32);
        size_t before = ct_ctx_used_bytes(ctx);
        if (amp) CT_EXPECT_OK(ct_autocast_begin(ctx, CT_BF16));
        ct_tensor *h = x;
        for (int l = 0; l < 4; l++) h = ct_gelu(ctx, ct_linear(ctx, h, W, NULL), true);
        if (amp) ct_autocast_end(ctx);
        used[amp] = ct_ctx_used_bytes(ctx) - before;
        ct_ctx_reset(ctx);
    }
    printf("  4 x (linear + gelu) on [512, 256]: arena f32 %zu B, bf16 %zu B (%.2fx)\n", used[0], used[1], (double)used[1] / used[0]);
    CT_EXPECT(used[1] < 0.6 * used[0]);
    ct_ctx_free(ctx);
    ct_params_free(P);
}

CT_TEST_MAIN()

/* the vectorised bulk conversions give the scalar ones' bits (NaN, inf, ties, subnormals) */
CT_TEST(bulk_bf16_conversion_matches_scalar) {
    enum { N = 1 << 16 };
    static uint32_t u[N];
    static uint16_t h[N];
    static float back[N];
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) { s = s * 1664525u + 1013904223u; u[i] = s; }
    const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x00000001u,
                                0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x80000000u};
    memcpy(u, special, sizeof special);
    ct_convert(h, CT_BF16, u, CT_F32, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float f;
        memcpy(&f, &u[i], 4);
        bad += h[i] != ct_f32_to_bf16(f);
    }
    CT_EXPECT_EQ(bad, 0);
    ct_convert(back, CT_F32, h, CT_BF16, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        float want = ct_bf16_to_f32(h[i]);
        bad += memcmp(&back[i], &want, 4) != 0;
    }
    CT_EXPECT_EQ(bad, 0);
}
