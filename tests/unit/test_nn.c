/* Modules and models without references: state_dict names, parameter counts,
 * initialisation statistics, config validation, forward shapes, save/load and its errors.
 * (Numerical agreement with PyTorch is in test_nn_torch.c.) */
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/io.h"
#include "ctrain/models.h"

static const char *pname(ct_params *P, int i) { return ct_params_get(P, i)->name; }

CT_TEST(sequential_numbers_children_like_pytorch) {
    ct_params *P; CT_EXPECT_OK(ct_params_create(&P));
    ct_module *root = ct_nn_sequential("");
    ct_seq_add(root, ct_nn_linear(P, ct_seq_next_name(root), 4, 8, true));   /* 0 */
    ct_seq_add(root, ct_nn_relu());                                          /* 1 */
    ct_seq_add(root, ct_nn_dropout(0.1f));                                   /* 2 */
    ct_seq_add(root, ct_nn_linear(P, ct_seq_next_name(root), 8, 3, false));  /* 3 */
    ct_module *feat = ct_seq_add(root, ct_nn_sequential(ct_seq_next_name(root))); /* 4 */
    ct_seq_add(feat, ct_nn_tanh());
    ct_seq_add(feat, ct_nn_layer_norm(P, ct_seq_next_name(feat), 3, 0, true));
    CT_EXPECT_OK(ct_params_finalize(P, 1));
    const char *want[] = {"0.weight", "0.bias", "3.weight", "4.1.weight", "4.1.bias"};
    CT_ASSERT(ct_params_count(P) == 5);
    for (int i = 0; i < 5; i++) CT_EXPECT(!strcmp(pname(P, i), want[i]));
    CT_EXPECT_EQ(ct_seq_len(root), 5);
    CT_EXPECT(!strcmp(ct_module_type(ct_seq_get(root, 2)), "Dropout"));
    char buf[1024];
    size_t n = ct_module_repr(root, buf, sizeof buf);
    CT_EXPECT(n < sizeof buf);
    CT_EXPECT(strstr(buf, "(3): Linear(in_features=8, out_features=3, bias=False)") != NULL);
    CT_EXPECT(strstr(buf, "(1): LayerNorm((3,), eps=1e-05)") != NULL);
    ct_module_free(root);
    ct_params_free(P);
}

static double mean_of(const float *x, int64_t n) { double s = 0; for (int64_t i = 0; i < n; i++) s += x[i]; return s / n; }
static double std_of(const float *x, int64_t n) {
    double m = mean_of(x, n), s = 0;
    for (int64_t i = 0; i < n; i++) s += (x[i] - m) * (x[i] - m);
    return sqrt(s / n);
}
static double maxabs(const float *x, int64_t n) { double m = 0; for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i])); return m; }

CT_TEST(default_init_matches_pytorch_distributions) {
    ct_params *P; CT_EXPECT_OK(ct_params_create(&P));
    ct_module *lin = ct_nn_linear(P, "fc", 300, 200, true);
    ct_module *conv = ct_nn_conv2d(P, "conv", 3, 16, 5, 1, 2, true);
    ct_module *emb = ct_nn_embedding(P, "emb", 100, 64);
    ct_module *ln = ct_nn_layer_norm(P, "ln", 64, 0, true);
    CT_EXPECT_OK(ct_params_finalize(P, 3));
    double b = 1 / sqrt(300.0);
    CT_EXPECT(maxabs(ct_f32(lin->w), 60000) <= b);
    CT_EXPECT_NEAR(std_of(ct_f32(lin->w), 60000), b / sqrt(3.0), 0.02 * b);
    CT_EXPECT(maxabs(ct_f32(lin->b), 200) <= b);
    CT_EXPECT(maxabs(ct_f32(lin->b), 200) > 0.8 * b);
    double bc = 1 / sqrt(75.0);
    CT_EXPECT(maxabs(ct_f32(conv->w), 16 * 75) <= bc);
    CT_EXPECT_NEAR(std_of(ct_f32(conv->w), 16 * 75), bc / sqrt(3.0), 0.06 * bc);
    CT_EXPECT_NEAR(std_of(ct_f32(emb->w), 6400), 1.0, 0.03);
    CT_EXPECT_NEAR(mean_of(ct_f32(emb->w), 6400), 0.0, 0.04);
    for (int i = 0; i < 64; i++) { CT_EXPECT(ct_f32(ln->w)[i] == 1.0f); CT_EXPECT(ct_f32(ln->b)[i] == 0.0f); }
    ct_module_free(lin); ct_module_free(conv); ct_module_free(emb); ct_module_free(ln);
    ct_params_free(P);
}

static ct_model_config small_gpt(void) {
    ct_model_config c = ct_model_default_config(CT_MODEL_GPT);
    c.gpt.n_layer = 2; c.gpt.n_embd = 32; c.gpt.n_head = 4; c.gpt.block_size = 16; c.gpt.vocab_size = 64;
    return c;
}

CT_TEST(model_state_dict_names_and_counts) {
    ct_model_config c = ct_model_default_config(CT_MODEL_MLP);
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    CT_ASSERT(m);
    ct_params *P = ct_model_params(m);
    const char *mlp[] = {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};
    CT_ASSERT(ct_params_count(P) == 6);
    for (int i = 0; i < 6; i++) CT_EXPECT(!strcmp(pname(P, i), mlp[i]));
    CT_EXPECT_EQ(ct_model_num_params(m), 1863690);
    CT_EXPECT(strstr(ct_model_describe(m), "1,863,690 parameters") != NULL);
    ct_model_free(m);

    c.mlp.dropout = 0.2f; /* Dropout layers shift the numbering as in PyTorch */
    CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    CT_ASSERT(m);
    CT_EXPECT(!strcmp(pname(ct_model_params(m), 2), "3.weight"));
    CT_EXPECT(!strcmp(pname(ct_model_params(m), 4), "6.weight"));
    ct_model_free(m);

    c = ct_model_default_config(CT_MODEL_CNN);
    CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    CT_ASSERT(m);
    P = ct_model_params(m);
    const char *cnn[] = {"features.0.weight", "features.0.bias", "features.3.weight", "features.3.bias",
                         "classifier.0.weight", "classifier.0.bias", "classifier.3.weight", "classifier.3.bias"};
    CT_ASSERT(ct_params_count(P) == 8);
    for (int i = 0; i < 8; i++) CT_EXPECT(!strcmp(pname(P, i), cnn[i]));
    CT_EXPECT_EQ(ct_params_find(P, "classifier.0.weight")->shape[1], 3136);
    CT_EXPECT_EQ(ct_model_num_params(m), 454922);
    ct_model_free(m);

    c = ct_model_default_config(CT_MODEL_GPT);
    CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    CT_ASSERT(m);
    P = ct_model_params(m);
    CT_EXPECT_EQ(ct_params_count(P), 4 + 12 * 6);
    const char *gpt[] = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                         "transformer.h.0.ln_1.bias", "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                         "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias", "transformer.h.0.ln_2.weight",
                         "transformer.h.0.ln_2.bias", "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
                         "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias"};
    for (int i = 0; i < 14; i++) CT_EXPECT(!strcmp(pname(P, i), gpt[i]));
    CT_EXPECT(!strcmp(pname(P, ct_params_count(P) - 1), "transformer.ln_f.bias"));
    CT_EXPECT(ct_params_find(P, "lm_head.weight") == NULL); /* tied, not a separate parameter */
    CT_EXPECT_EQ(ct_params_find(P, "transformer.h.5.attn.c_attn.weight")->shape[0], 768);
    CT_EXPECT_EQ(ct_model_num_params(m), 4870144);
    /* GPT-2 init */
    ct_tensor *w = ct_params_find(P, "transformer.h.1.mlp.c_fc.weight");
    CT_EXPECT_NEAR(std_of(ct_f32(w), ct_numel(w)), 0.02, 0.0005);
    w = ct_params_find(P, "transformer.h.1.attn.c_proj.weight");
    CT_EXPECT_NEAR(std_of(ct_f32(w), ct_numel(w)), 0.02 / sqrt(12.0), 0.0005);
    w = ct_params_find(P, "transformer.h.1.mlp.c_proj.weight");
    CT_EXPECT_NEAR(std_of(ct_f32(w), ct_numel(w)), 0.02 / sqrt(12.0), 0.0005);
    w = ct_params_find(P, "transformer.wte.weight");
    CT_EXPECT_NEAR(std_of(ct_f32(w), ct_numel(w)), 0.02, 0.0005);
    CT_EXPECT(maxabs(ct_f32(ct_params_find(P, "transformer.h.3.attn.c_attn.bias")), 768) == 0);
    CT_EXPECT(ct_f32(ct_params_find(P, "transformer.ln_f.weight"))[7] == 1.0f);
    ct_model_free(m);
}

CT_TEST(bad_configs_fail_with_a_message) {
    ct_model_config c = ct_model_default_config(CT_MODEL_GPT);
    c.gpt.n_head = 7;
    ct_model *bad = (ct_model *)&c; /* must come back NULL */
    CT_EXPECT(ct_model_create(&c, 1, &bad) == CT_ERR_INVALID && bad == NULL);
    CT_EXPECT(strstr(ct_last_error(), "n_head") != NULL);
    c = ct_model_default_config(CT_MODEL_CNN);
    c.cnn.height = 30;
    CT_EXPECT(ct_model_create(&c, 1, &bad) == CT_ERR_INVALID && bad == NULL);
    CT_EXPECT(strstr(ct_last_error(), "cnn.height") != NULL);
    c = ct_model_default_config(CT_MODEL_MLP);
    c.mlp.hidden[1] = 0;
    CT_EXPECT(ct_model_create(&c, 1, &bad) == CT_ERR_INVALID && bad == NULL);
    CT_EXPECT(strstr(ct_last_error(), "mlp.hidden[1]") != NULL);
    c.mlp.hidden[1] = 5;
    c.mlp.dropout = 1.0f;
    CT_EXPECT(ct_model_create(&c, 1, &bad) == CT_ERR_INVALID && bad == NULL);
    c.kind = (ct_model_kind)9;
    CT_EXPECT(ct_model_create(&c, 1, &bad) == CT_ERR_INVALID && bad == NULL);
    CT_EXPECT(strstr(ct_last_error(), "CT_MODEL_MLP, CT_MODEL_CNN, CT_MODEL_GPT or CT_MODEL_LLAMA") != NULL);
    CT_EXPECT(ct_model_create(NULL, 1, &bad) == CT_ERR_INVALID && bad == NULL);
    ct_model_kind k;
    CT_EXPECT_OK(ct_model_kind_parse("GPT", &k));
    CT_EXPECT(k == CT_MODEL_GPT);
    CT_EXPECT(ct_model_kind_parse("resnet", &k) == CT_ERR_INVALID);
    CT_EXPECT(!strcmp(ct_last_error(), "unknown model 'resnet' (expected mlp, cnn, gpt or llama)"));
    CT_EXPECT(!strcmp(ct_model_kind_name(CT_MODEL_CNN), "cnn") && !strcmp(ct_model_kind_name((ct_model_kind)9), "?"));
}

CT_TEST(same_seed_same_weights) {
    ct_model_config c = small_gpt();
    ct_model *a, *b, *d;
    CT_EXPECT_OK(ct_model_create(&c, 5, &a));
    CT_EXPECT_OK(ct_model_create(&c, 5, &b));
    CT_EXPECT_OK(ct_model_create(&c, 6, &d));
    CT_ASSERT(a && b && d);
    size_t n = ct_params_numel(ct_model_params(a));
    CT_EXPECT(!memcmp(ct_params_data(ct_model_params(a)), ct_params_data(ct_model_params(b)), n * 4));
    CT_EXPECT(memcmp(ct_params_data(ct_model_params(a)), ct_params_data(ct_model_params(d)), n * 4) != 0);
    ct_model_free(a); ct_model_free(b); ct_model_free(d);
}

/* Sharded initialisation rests on this: any flat range of a deferred store, made alone, has
 * the bits ct_model_create gives it (every init kind: normal, uniform, ones, zeros, padding). */
CT_TEST(deferred_init_any_range_same_bits) {
    ct_model_config cfgs[2] = {small_gpt(), ct_model_default_config(CT_MODEL_MLP)};
    for (int c = 0; c < 2; c++) {
        ct_model *a, *d;
        CT_EXPECT_OK(ct_model_create(&cfgs[c], 7, &a));
        CT_EXPECT_OK(ct_model_create_deferred(&cfgs[c], 7, &d));
        CT_ASSERT(a && d);
        ct_params *P = ct_model_params(a), *Q = ct_model_params(d);
        size_t n = ct_params_numel(P);
        CT_EXPECT(ct_params_is_deferred(Q) && !ct_params_is_deferred(P));
        CT_EXPECT(ct_params_data(Q) == NULL && ct_params_grad(Q) == NULL && ct_params_numel(Q) == n);
        CT_EXPECT(ct_params_seed(Q) == 7);
        float *buf = malloc(n * sizeof(float));
        CT_ASSERT(buf);
        uint64_t r = 12345;
        int bad = 0;
        for (int k = 0; k < 200; k++) { /* random ranges, some across parameters and padding */
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            size_t lo = (size_t)(r >> 33) % n, len = 1 + (size_t)(r >> 13) % (k < 100 ? 37 : n - lo);
            size_t hi = lo + len > n ? n : lo + len;
            ct_params_init_range(Q, 7, lo, hi, buf);
            bad += memcmp(buf, ct_params_data(P) + lo, (hi - lo) * sizeof(float)) != 0;
        }
        CT_EXPECTF(bad == 0, "model %d: %d of 200 ranges differ from ct_model_create's values", c, bad);
        ct_params_init_range(Q, 8, 0, n, buf); /* another seed, other values */
        CT_EXPECT(memcmp(buf, ct_params_data(P), n * sizeof(float)) != 0);
        free(buf);
        /* a deferred store refuses what needs values, then materialises to the same bits */
        CT_EXPECT(ct_params_to(Q, (ct_device){.type = CT_DEV_CUDA}) == CT_ERR_INVALID);
        ct_params_zero_grad(Q); /* nothing to zero: no crash */
        CT_EXPECT_OK(ct_params_materialize(Q));
        CT_EXPECT(!ct_params_is_deferred(Q));
        CT_EXPECT(!memcmp(ct_params_data(P), ct_params_data(Q), n * sizeof(float)));
        CT_EXPECT(ct_params_get(Q, 0)->data == ct_params_data(Q) && ct_params_get(Q, 0)->grad->data == ct_params_grad(Q));
        CT_EXPECT_OK(ct_params_materialize(Q)); /* once */
        ct_model_free(a);
        ct_model_free(d);
    }
}

CT_TEST(forward_shapes_and_loss_near_log_classes) {
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    ct_model_config c = ct_model_default_config(CT_MODEL_MLP);
    c.mlp.hidden[0] = 64; c.mlp.hidden[1] = 32;
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    ct_tensor *x = ct_zeros(ctx, CT_F32, 4, (int64_t[]){3, 1, 28, 28});
    for (int i = 0; i < 3 * 784; i++) ct_f32(x)[i] = (float)((i * 37) % 101) / 101.0f;
    ct_tensor *y = ct_model_forward(ctx, m, x);
    CT_EXPECT(y->ndim == 2 && y->shape[0] == 3 && y->shape[1] == 10);
    ct_tensor *t = ct_zeros(ctx, CT_I32, 1, (int64_t[]){3});
    double l = ct_item(ct_model_loss(ctx, m, x, t));
    CT_EXPECT(l > 1.5 && l < 3.5);
    ct_ctx_reset(ctx); /* the tape refers to the model's parameters */
    ct_model_free(m);

    c = ct_model_default_config(CT_MODEL_CNN);
    c.cnn.c1 = 4; c.cnn.c2 = 8; c.cnn.fc = 16;
    CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    x = ct_zeros(ctx, CT_F32, 4, (int64_t[]){3, 1, 28, 28});
    for (int i = 0; i < 3 * 784; i++) ct_f32(x)[i] = (float)((i * 37) % 101) / 101.0f;
    y = ct_model_forward(ctx, m, x);
    CT_EXPECT(y->ndim == 2 && y->shape[0] == 3 && y->shape[1] == 10);
    ct_ctx_reset(ctx);
    ct_model_free(m);

    c = small_gpt();
    CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    ct_tensor *tok = ct_zeros(ctx, CT_I32, 2, (int64_t[]){2, 9});
    for (int i = 0; i < 18; i++) ((int32_t *)tok->data)[i] = (i * 7) % 64;
    y = ct_model_forward(ctx, m, tok);
    CT_EXPECT(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 9 && y->shape[2] == 64);
    ct_tensor *tgt = ct_zeros(ctx, CT_I32, 2, (int64_t[]){2, 9});
    for (int i = 0; i < 18; i++) ((int32_t *)tgt->data)[i] = (i * 5 + 3) % 64;
    ((int32_t *)tgt->data)[4] = -1; /* ignored */
    ct_tensor *loss = ct_model_loss(ctx, m, tok, tgt);
    CT_EXPECT_NEAR(ct_item(loss), log(64.0), 0.1); /* small init: near-uniform predictions */
    ct_backward(ctx, loss);
    CT_EXPECT(ct_f32(ct_params_find(ct_model_params(m), "transformer.wpe.weight")->grad)[0] != 0);
    ct_model_free(m);
    ct_ctx_free(ctx);
}

static char tmpdir[64];
static const char *tmp_path(const char *leaf) {
    static char ps[4][128];
    static int k;
    char *p = ps[k++ % 4];
    if (!tmpdir[0]) { strcpy(tmpdir, "/tmp/ct_nn_XXXXXX"); CT_CHECK(mkdtemp(tmpdir), "mkdtemp"); }
    snprintf(p, sizeof ps[0], "%s/%s", tmpdir, leaf);
    return p;
}

CT_TEST(save_load_roundtrip_and_gpt_lm_head) {
    ct_model_config c = small_gpt();
    ct_model *a, *b;
    CT_EXPECT_OK(ct_model_create(&c, 1, &a));
    CT_EXPECT_OK(ct_model_create(&c, 2, &b));
    const char *p = tmp_path("gpt.safetensors");
    CT_EXPECT_OK(ct_model_save(a, p));
    ct_st_file *f;
    CT_ASSERT(ct_st_open(p, &f) == CT_OK);
    ct_st_tensor t;
    CT_EXPECT_OK(ct_st_get(f, "lm_head.weight", &t)); /* PyTorch's state_dict has the tied head too */
    CT_EXPECT_EQ(ct_st_count(f), ct_params_count(ct_model_params(a)) + 1);
    CT_EXPECT(!strcmp(ct_st_metadata(f, "format"), "pt"));
    ct_st_close(f);
    CT_EXPECT_OK(ct_model_load(b, p));
    size_t n = ct_params_numel(ct_model_params(a));
    CT_EXPECT(!memcmp(ct_params_data(ct_model_params(a)), ct_params_data(ct_model_params(b)), n * 4));
    /* and without lm_head.weight (as written by ct_params_save) */
    CT_EXPECT_OK(ct_params_save(ct_model_params(a), p));
    CT_EXPECT_OK(ct_model_load(b, p));
    CT_EXPECT(ct_params_load(ct_model_params(b), p) == CT_OK);
    ct_model_free(a); ct_model_free(b);
    unlink(p);
}

/* file with the model's tensors, edited by `edit` */
typedef void (*edit_fn)(ct_st_writer *w, ct_params *P, const char *skip_name, int *skip);
static void write_variant(ct_params *P, const char *path, const char *skip, const char *reshape, ct_dtype dt_for,
                          const char *extra) {
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    static int32_t ibuf[1 << 16];
    for (int i = 0; i < ct_params_count(P); i++) {
        ct_tensor *t = ct_params_get(P, i);
        if (skip && !strcmp(t->name, skip)) continue;
        if (reshape && !strcmp(t->name, reshape)) {
            int64_t s[2] = {t->shape[0] + 1, t->ndim > 1 ? t->shape[1] : 1};
            float *z = calloc((size_t)(s[0] * s[1]), 4);
            ct_st_writer_add(w, t->name, CT_F32, 2, s, z);
            ct_st_writer_save(w, path);
            free(z);
            ct_st_writer_free(w);
            return;
        }
        if (dt_for != CT_F32 && !strcmp(t->name, "0.bias")) {
            ct_st_writer_add(w, t->name, dt_for, t->ndim, t->shape, ibuf);
            continue;
        }
        ct_st_writer_add(w, t->name, CT_F32, t->ndim, t->shape, t->data);
    }
    if (extra) ct_st_writer_add(w, extra, CT_F32, 1, (int64_t[]){2}, ibuf);
    CT_CHECK(ct_st_writer_save(w, path) == CT_OK, "save");
    ct_st_writer_free(w);
}

CT_TEST(load_errors_name_tensor_and_file_and_change_nothing) {
    ct_model_config c = ct_model_default_config(CT_MODEL_MLP);
    c.mlp.n_hidden = 1; c.mlp.hidden[0] = 16;
    ct_model *src, *m;
    CT_EXPECT_OK(ct_model_create(&c, 1, &src));
    CT_EXPECT_OK(ct_model_create(&c, 2, &m));
    ct_params *P = ct_model_params(m);
    size_t n = ct_params_numel(P);
    float *before = malloc(n * 4);
    memcpy(before, ct_params_data(P), n * 4);
    const char *p = tmp_path("bad.safetensors");

    write_variant(ct_model_params(src), p, "2.bias", NULL, CT_F32, NULL);
    CT_EXPECT(ct_model_load(m, p) == CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "'2.bias'") && strstr(ct_last_error(), "missing") && strstr(ct_last_error(), p));

    write_variant(ct_model_params(src), p, NULL, NULL, CT_F32, "head.weight");
    CT_EXPECT(ct_model_load(m, p) == CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "'head.weight'") && strstr(ct_last_error(), "does not have"));

    /* all but the last tensor fine, the last one mis-shaped: nothing may be copied */
    write_variant(ct_model_params(src), p, NULL, "2.bias", CT_F32, NULL);
    CT_EXPECT(ct_model_load(m, p) == CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "'2.bias'") && strstr(ct_last_error(), "[11, 1]") && strstr(ct_last_error(), "[10]"));

    write_variant(ct_model_params(src), p, NULL, NULL, CT_I32, NULL);
    CT_EXPECT(ct_model_load(m, p) == CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "'0.bias'") && strstr(ct_last_error(), "I32"));

    CT_EXPECT(!memcmp(before, ct_params_data(P), n * 4));

    ct_status nf = ct_model_load(m, tmp_path("does_not_exist.safetensors"));
    CT_EXPECT(nf == CT_ERR_IO || nf == CT_ERR_NOT_FOUND);
    CT_EXPECT(strstr(ct_last_error(), "does_not_exist") != NULL);
    FILE *fp = fopen(p, "wb");
    fputs("garbage", fp);
    fclose(fp);
    CT_EXPECT(ct_model_load(m, p) == CT_ERR_FORMAT);
    CT_EXPECT(!memcmp(before, ct_params_data(P), n * 4));

    /* bf16 weights convert, as PyTorch's copy_ does */
    ct_params *S = ct_model_params(src);
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    uint16_t *bf[4];
    for (int i = 0; i < ct_params_count(S); i++) {
        ct_tensor *t = ct_params_get(S, i);
        bf[i] = malloc((size_t)ct_numel(t) * 2);
        ct_convert(bf[i], CT_BF16, t->data, CT_F32, (size_t)ct_numel(t));
        ct_st_writer_add(w, t->name, CT_BF16, t->ndim, t->shape, bf[i]);
    }
    CT_EXPECT_OK(ct_st_writer_save(w, p));
    ct_st_writer_free(w);
    CT_EXPECT_OK(ct_model_load(m, p));
    float *a = ct_f32(ct_params_find(S, "0.weight")), *b = ct_f32(ct_params_find(P, "0.weight"));
    CT_EXPECT(ct_max_rel_err(b, a, 784 * 16, 1e-3) < 1e-2);
    for (int i = 0; i < 4; i++) free(bf[i]);
    free(before);
    unlink(p);
    rmdir(tmpdir);
    ct_model_free(src); ct_model_free(m);
}

static int hook_count[256], hook_calls;
static void count_hook(void *u, ct_params *P, int i) { (void)u; (void)P; hook_count[i]++; hook_calls++; }

CT_TEST(gpt_grad_ready_hook_fires_once_per_parameter_tied_wte_included) {
    ct_model_config c = small_gpt();
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    ct_params *P = ct_model_params(m);
    ct_params_set_grad_hook(P, count_hook, NULL);
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    ct_tensor *tok = ct_zeros(ctx, CT_I64, 2, (int64_t[]){2, 16});
    for (int i = 0; i < 32; i++) ((int64_t *)tok->data)[i] = (i * 11) % 64;
    for (int step = 0; step < 2; step++) {
        memset(hook_count, 0, sizeof hook_count);
        hook_calls = 0;
        ct_backward(ctx, ct_model_loss(ctx, m, tok, tok));
        CT_EXPECT_EQ(hook_calls, ct_params_count(P));
        for (int i = 0; i < ct_params_count(P); i++) CT_EXPECT_EQ(hook_count[i], 1);
        ct_ctx_reset(ctx);
        tok = ct_zeros(ctx, CT_I64, 2, (int64_t[]){2, 16});
    }
    ct_ctx_free(ctx);
    ct_model_free(m);
}

CT_TEST(gpt_without_bias_has_nanogpt_names) {
    ct_model_config c = small_gpt();
    c.gpt.bias = false;
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 1, &m));
    CT_ASSERT(m);
    ct_params *P = ct_model_params(m);
    CT_EXPECT_EQ(ct_params_count(P), 3 + 6 * 2);
    CT_EXPECT(ct_params_find(P, "transformer.h.0.attn.c_attn.bias") == NULL);
    CT_EXPECT(ct_params_find(P, "transformer.ln_f.bias") == NULL);
    CT_EXPECT(ct_params_find(P, "transformer.h.1.mlp.c_proj.weight") != NULL);
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    ct_tensor *tok = ct_zeros(ctx, CT_I32, 2, (int64_t[]){1, 16});
    ct_backward(ctx, ct_model_loss(ctx, m, tok, tok));
    ct_ctx_free(ctx);
    ct_model_free(m);
}

CT_TEST(dropout_follows_training_mode) {
    ct_model_config c = ct_model_default_config(CT_MODEL_CNN);
    c.cnn.c1 = 4; c.cnn.c2 = 8; c.cnn.fc = 64; c.cnn.dropout = 0.5f;
    ct_model *a; CT_EXPECT_OK(ct_model_create(&c, 3, &a));
    c.cnn.dropout = 0;
    ct_model *b; CT_EXPECT_OK(ct_model_create(&c, 3, &b)); /* same names, same init */
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    ct_tensor *x = ct_zeros(ctx, CT_F32, 4, (int64_t[]){2, 1, 28, 28});
    for (int i = 0; i < 2 * 784; i++) ct_f32(x)[i] = (float)((i * 13) % 29) / 29.0f;
    ct_tensor *yb = ct_model_forward(ctx, b, x);
    ct_tensor *ya = ct_model_forward(ctx, a, x);
    CT_EXPECT(memcmp(ya->data, yb->data, 20 * 4) != 0);   /* training: dropout active */
    ct_ctx_set_training(ctx, false);
    ya = ct_model_forward(ctx, a, x);
    CT_EXPECT(!memcmp(ya->data, yb->data, 20 * 4));       /* eval: identity */
    ct_ctx_free(ctx);
    ct_model_free(a);
    ct_model_free(b);
}

CT_TEST_MAIN()
