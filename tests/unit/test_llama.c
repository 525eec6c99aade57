/* The llama kind against a PyTorch Llama written after transformers' modeling_llama
 * (tests/torch/gen_llama.py): for grouped-query, tied-head and multi-head configs, the
 * fixture's weights load under Hugging Face's names, and logits, loss and every parameter's
 * gradient match (normwise: ||a - b|| / ||b||), with fused and plain attention and with
 * activation checkpointing. Also the new ops against finite differences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "gradcheck.h"
#include "ctrain/ctrain.h"

#define FIX "tests/fixtures/models/llama_"

/* the config from the reference file's metadata (its keys are the kind's option keys) */
static ct_model_config fixture_config(const ct_st_file *ref) {
    ct_model_kind k;
    CT_CHECK(ct_model_kind_parse("llama", &k) == CT_OK, "llama kind");
    ct_model_config c = ct_model_default_config(k);
    const ct_model_kind_info *ki = ct_model_kind_info_of(k);
    for (int i = 0; i < ki->noptions; i++) {
        const char *v = ct_st_metadata(ref, ki->options[i].key);
        if (v) CT_CHECK(ct_model_config_set(&c, &ki->options[i], v) == CT_OK, "option %s = %s", ki->options[i].key, v);
    }
    return c;
}

/* I64 [B, T] tensor `name` of the reference file, copied into ctx */
static ct_tensor *ids(ct_ctx *ctx, const ct_st_file *f, const char *name) {
    ct_st_tensor t;
    CT_CHECK(ct_st_get(f, name, &t) == CT_OK && t.dtype == CT_I64 && t.ndim == 2, "fixture %s", name);
    return ct_from_data(ctx, CT_I64, t.data, 2, t.shape);
}

/* errors of one run: logits, loss, and the largest over the parameters' gradients */
typedef struct { double logits, loss, grad; char worst[128]; } errs;

static errs run(const char *name, bool flash, bool checkpoint) {
    errs e = {INFINITY, INFINITY, INFINITY, ""};
    char path[256];
    snprintf(path, sizeof path, FIX "%s.ref.safetensors", name);
    ct_st_file *ref;
    if (ct_st_open(path, &ref) != CT_OK) { fprintf(stderr, "  %s\n", ct_last_error()); return e; }
    ct_model_config c = fixture_config(ref);
    c.llama.flash_attention = flash;
    c.llama.checkpoint_activations = checkpoint;
    ct_model *m;
    ct_ctx *ctx;
    CT_CHECK(ct_model_create(&c, 0, &m) == CT_OK, "%s", ct_last_error());
    snprintf(path, sizeof path, FIX "%s.weights.safetensors", name);
    CT_CHECK(ct_model_load(m, path) == CT_OK, "%s", ct_last_error());
    CT_CHECK(ct_ctx_create(NULL, &ctx) == CT_OK, "ctx");
    ct_tensor *x = ids(ctx, ref, "input_ids"), *y = ids(ctx, ref, "labels");
    ct_st_tensor t;
    CT_CHECK(ct_st_get(ref, "logits", &t) == CT_OK, "logits");
    bool prev = ct_set_grad_enabled(ctx, false);
    ct_tensor *logits = ct_model_forward(ctx, m, x);
    e.logits = ct_norm_rel_err(ct_f32(logits), t.data, (long)ct_numel(logits));
    ct_set_grad_enabled(ctx, prev);
    ct_tensor *loss = ct_model_loss(ctx, m, x, y);
    CT_CHECK(ct_st_get(ref, "loss", &t) == CT_OK, "loss");
    e.loss = fabs(ct_item(loss) - *(const float *)t.data) / fabs(*(const float *)t.data);
    ct_backward(ctx, loss);
    ct_params *P = ct_model_params(m);
    ct_params_grad(P); /* settles the gradients */
    e.grad = 0;
    for (int i = 0; i < ct_params_count(P); i++) {
        ct_tensor *p = ct_params_get(P, i);
        char gname[160];
        snprintf(gname, sizeof gname, "grad.%s", p->name);
        CT_CHECK(ct_st_get(ref, gname, &t) == CT_OK && (int64_t)t.nbytes == 4 * ct_numel(p), "%s in the fixture", gname);
        double err = ct_norm_rel_err(ct_f32(p->grad), t.data, (long)ct_numel(p));
        if (err > e.grad || err != err) { e.grad = err != err ? INFINITY : err; snprintf(e.worst, sizeof e.worst, "%s", p->name); }
    }
    ct_ctx_free(ctx);
    ct_model_free(m);
    ct_st_close(ref);
    return e;
}

static void check(const char *name, bool flash, bool checkpoint) {
    errs e = run(name, flash, checkpoint);
    printf("  %s (%s%s): logits %.2e, loss %.2e, gradients %.2e (worst: %s)\n", name, flash ? "flash" : "plain",
           checkpoint ? ", checkpointed" : "", e.logits, e.loss, e.grad, e.worst);
    CT_EXPECTF(e.logits <= 1e-5, "%s: logits differ from PyTorch's: %g", name, e.logits);
    CT_EXPECTF(e.loss <= 1e-5, "%s: loss differs from PyTorch's: %g", name, e.loss);
    CT_EXPECTF(e.grad <= 1e-4, "%s: gradient of %s differs from PyTorch's: %g", name, e.worst, e.grad);
}

CT_TEST(gqa_matches_torch) { check("gqa", true, false); check("gqa", false, false); }
CT_TEST(tied_matches_torch) { check("tied", true, false); }
CT_TEST(mha_matches_torch) { check("mha", false, false); }
CT_TEST(checkpointed_matches_torch) { check("gqa", true, true); }

/* the config describes what the file holds; a tied head is one parameter, saved twice */
CT_TEST(config_and_save) {
    ct_model_kind k;
    CT_ASSERT(ct_model_kind_parse("llama", &k) == CT_OK);
    CT_EXPECT_EQ(k, CT_MODEL_LLAMA);
    ct_st_file *ref;
    CT_ASSERT(ct_st_open(FIX "tied.ref.safetensors", &ref) == CT_OK);
    ct_model_config c = fixture_config(ref);
    ct_st_close(ref);
    CT_EXPECT(c.llama.tie_word_embeddings);
    CT_EXPECT_EQ(c.llama.num_key_value_heads, 2);
    ct_model *m;
    CT_ASSERT(ct_model_create(&c, 1, &m) == CT_OK);
    /* 256*64 + 2 * (64*64*2 + 64*32*2 + 3*64*176 + 2*64) + 64 */
    CT_EXPECT_EQ(ct_model_num_params(m), 256 * 64 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 176 + 2 * 64) + 64);
    CT_ASSERT(ct_model_load(m, FIX "tied.weights.safetensors") == CT_OK);
    const char *out = ct_test_tmp_path("llama.safetensors");
    CT_ASSERT(ct_model_save(m, out) == CT_OK);
    ct_model *back;
    CT_ASSERT(ct_model_open(out, &back) == CT_OK);
    CT_EXPECT(ct_model_config_of(back)->llama.tie_word_embeddings);
    CT_EXPECT_NEAR(ct_model_config_of(back)->llama.rope_theta, 500000.0, 0);
    ct_params *P = ct_model_params(m), *Q = ct_model_params(back);
    CT_ASSERT(ct_params_count(P) == ct_params_count(Q));
    bool same = true;
    for (int i = 0; i < ct_params_count(P); i++)
        same &= !memcmp(ct_params_get(P, i)->data, ct_params_get(Q, i)->data, 4 * (size_t)ct_numel(ct_params_get(P, i)));
    CT_EXPECT(same);
    ct_st_file *f;
    CT_ASSERT(ct_st_open(out, &f) == CT_OK);
    ct_st_tensor t;
    CT_EXPECT(ct_st_get(f, "lm_head.weight", &t) == CT_OK);
    ct_st_close(f);
    remove(out);
    ct_model_free(back);
    ct_model_free(m);
    /* bad configs name the field */
    c.llama.num_key_value_heads = 3;
    CT_EXPECT(ct_model_config_check(&c) == CT_ERR_INVALID && strstr(ct_last_error(), "num_key_value_heads"));
}

/* ---- the new ops against central differences (gradcheck.h) ---- */
static ct_tensor *rms_fn(ct_ctx *ctx, ct_tensor **in, void *arg) {
    (void)arg;
    return ct_rms_norm(ctx, in[0], in[1], 1e-5f);
}
static ct_tensor *rope_fn(ct_ctx *ctx, ct_tensor **in, void *arg) {
    (void)arg;
    return ct_rope(ctx, in[0], NULL, 100.0f);
}
static ct_tensor *silu_fn(ct_ctx *ctx, ct_tensor **in, void *arg) {
    (void)arg;
    return ct_silu(ctx, in[0]);
}
static ct_tensor *repeat_fn(ct_ctx *ctx, ct_tensor **in, void *arg) {
    (void)arg;
    return ct_repeat_kv(ctx, in[0], 3);
}

CT_TEST(ops_gradcheck) {
    CT_EXPECT(ct_gradcheck(rms_fn, NULL, 2, (ct_tensor_spec[]){{3, {3, 5, 8}}, {1, {8}}}, false) < 1e-2);
    CT_EXPECT(ct_gradcheck(rope_fn, NULL, 1, (ct_tensor_spec[]){{4, {2, 3, 5, 6}}}, false) < 1e-2);
    CT_EXPECT(ct_gradcheck(silu_fn, NULL, 1, (ct_tensor_spec[]){{2, {7, 9}}}, false) < 1e-2);
    CT_EXPECT(ct_gradcheck(repeat_fn, NULL, 1, (ct_tensor_spec[]){{4, {2, 2, 3, 4}}}, false) < 1e-2);
}

/* rope with explicit positions is rope at those positions; position 0 is the identity */
CT_TEST(rope_positions) {
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    int64_t T = 4, D = 6;
    ct_tensor *x = ct_new(ctx, CT_F32, 2, (int64_t[]){T, D});
    for (int64_t i = 0; i < T * D; i++) ct_f32(x)[i] = sinf((float)i);
    ct_tensor *pos = ct_new(ctx, CT_I32, 1, &T);
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
    ct_tensor *a = ct_rope(ctx, x, NULL, 10000.0f), *b = ct_rope(ctx, x, pos, 10000.0f);
    CT_EXPECT(!memcmp(a->data, b->data, sizeof(float) * (size_t)(T * D)));
    CT_EXPECT(!memcmp(a->data, x->data, sizeof(float) * (size_t)D));
    /* at position 1 the first pair turns by 1 radian: (x0 cos 1 - x3 sin 1, x3 cos 1 + x0 sin 1) */
    const float *X = ct_f32(x) + D, *Y = ct_f32(a) + D;
    CT_EXPECT_NEAR(Y[0], X[0] * cosf(1) - X[3] * sinf(1), 1e-6);
    CT_EXPECT_NEAR(Y[3], X[3] * cosf(1) + X[0] * sinf(1), 1e-6);
    ct_ctx_free(ctx);
}

CT_TEST_MAIN()
