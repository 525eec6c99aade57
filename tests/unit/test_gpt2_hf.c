/* GPT-2 from Hugging Face: a tiny GPT2LMHeadModel saved by `transformers`
 * (tests/torch/gen_gpt2_hf.py) loads and gives transformers' logits and greedy tokens; the
 * KV cache gives a full forward's logits; export and re-import keep the model; the config
 * travels in ctrain's own files' metadata. */
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"

#define FIX "tests/fixtures/models/gpt2_hf/"

static char *tmpdir(void) {
    static char d[64];
    snprintf(d, sizeof d, "/tmp/ct_gpt2_XXXXXX");
    return mkdtemp(d);
}

/* expected.safetensors: I64 tensor `name` as int32 into out (at most max), count back */
static int read_ids(const ct_st_file *f, const char *name, int32_t *out, int max) {
    ct_st_tensor t;
    if (ct_st_get(f, name, &t) != CT_OK || t.dtype != CT_I64) return -1;
    int n = (int)(t.nbytes / 8);
    for (int i = 0; i < n && i < max; i++) {
        int64_t v;
        memcpy(&v, (const char *)t.data + 8 * i, 8);
        out[i] = (int32_t)v;
    }
    return n;
}

static double max_rel(const float *a, const float *b, long n) { /* relative to the largest reference value */
    double big = 0, d = 0;
    for (long i = 0; i < n; i++) {
        if (fabs(b[i]) > big) big = fabs(b[i]);
        if (fabs((double)a[i] - b[i]) > d || a[i] != a[i]) d = a[i] != a[i] ? INFINITY : fabs((double)a[i] - b[i]);
    }
    return d / (big > 0 ? big : 1);
}

CT_TEST(config_from_hf_files) {
    ct_model_config c;
    ct_weights_layout lay;
    CT_ASSERT(ct_model_config_from_file(FIX "model.safetensors", &c, &lay) == CT_OK);
    CT_EXPECT_EQ(lay, CT_LAYOUT_HF_GPT2);
    CT_EXPECT_EQ(c.kind, CT_MODEL_GPT);
    CT_EXPECT_EQ(c.gpt.n_layer, 2);
    CT_EXPECT_EQ(c.gpt.n_embd, 64);
    CT_EXPECT_EQ(c.gpt.n_head, 4); /* from config.json: shapes alone would say 1 */
    CT_EXPECT_EQ(c.gpt.block_size, 64);
    CT_EXPECT_EQ(c.gpt.vocab_size, 256);
    CT_EXPECT(c.gpt.gelu_tanh);
    CT_EXPECT(c.gpt.bias);
}

/* logits of transformers' GPT2LMHeadModel for the fixed input, within 1e-4 */
CT_TEST(logits_match_transformers) {
    ct_model *m;
    CT_ASSERT(ct_model_open(FIX "model.safetensors", &m) == CT_OK);
    ct_st_file *f;
    CT_ASSERT(ct_st_open(FIX "expected.safetensors", &f) == CT_OK);
    int32_t ids[2 * 16];
    CT_ASSERT(read_ids(f, "input_ids", ids, 32) == 32);
    ct_st_tensor ref;
    CT_ASSERT(ct_st_get(f, "logits", &ref) == CT_OK && ref.dtype == CT_F32 && ref.nbytes == sizeof(float) * 2 * 16 * 256);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    ct_ctx_set_training(ctx, false);
    ct_set_grad_enabled(ctx, false);
    ct_tensor *logits = ct_model_forward(ctx, m, ct_wrap(ctx, CT_I32, ids, 2, (int64_t[]){2, 16}));
    double err = max_rel(ct_f32(logits), ref.data, 2 * 16 * 256);
    printf("  logits vs transformers: max error %.3g (relative to the largest logit)\n", err);
    CT_EXPECTF(err <= 1e-4, "logits differ from transformers': %g", err);
    /* the exact-GELU model must differ: the fixture tells the activations apart */
    ct_model_config c = *ct_model_config_of(m);
    c.gpt.gelu_tanh = false;
    ct_model *exact;
    CT_ASSERT(ct_model_create(&c, 0, &exact) == CT_OK);
    CT_ASSERT(ct_gpt_load_hf(exact, FIX "model.safetensors") == CT_OK);
    ct_tensor *l2 = ct_model_forward(ctx, exact, ct_wrap(ctx, CT_I32, ids, 2, (int64_t[]){2, 16}));
    CT_EXPECT(max_rel(ct_f32(l2), ref.data, 2 * 16 * 256) > 1e-4);
    ct_model_free(exact);
    ct_ctx_free(ctx);
    ct_st_close(f);
    ct_model_free(m);
}

/* transformers' greedy continuation, token for token, with and without the KV cache */
CT_TEST(greedy_matches_transformers) {
    ct_model *m;
    CT_ASSERT(ct_model_open(FIX "model.safetensors", &m) == CT_OK);
    ct_st_file *f;
    CT_ASSERT(ct_st_open(FIX "expected.safetensors", &f) == CT_OK);
    int32_t prompt[64], want[64], got[64];
    int np = read_ids(f, "prompt", prompt, 64), ng = read_ids(f, "greedy", want, 64);
    CT_ASSERT(np > 0 && ng > 0);
    for (int cache = 0; cache < 2; cache++) {
        ct_generate_opts o = ct_generate_default_opts();
        o.temperature = 0;
        o.max_new_tokens = ng;
        o.kv_cache = cache;
        ct_generate_stats s;
        CT_ASSERT(ct_gpt_generate(m, prompt, np, &o, got, &s) == CT_OK);
        CT_EXPECT_EQ(s.new_tokens, ng);
        int same = 0;
        while (same < ng && got[same] == want[same]) same++;
        CT_EXPECTF(same == ng, "%s: token %d is %d, transformers gives %d", cache ? "KV cache" : "full forward", same,
                   same < ng ? got[same] : -1, same < ng ? want[same] : -1);
    }
    ct_st_close(f);
    ct_model_free(m);
}

/* one token at a time through the cache = the rows of one full forward; also in chunks */
CT_TEST(kv_cache_logits_equal_full_forward) {
    ct_model_config c = ct_model_default_config(CT_MODEL_GPT);
    c.gpt.n_layer = 2; c.gpt.n_embd = 48; c.gpt.n_head = 3; c.gpt.block_size = 32; c.gpt.vocab_size = 50;
    ct_model *m;
    CT_ASSERT(ct_model_create(&c, 7, &m) == CT_OK);
    int T = 32;
    int32_t ids[32];
    for (int i = 0; i < T; i++) ids[i] = (i * 17 + 3) % 50;
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    ct_set_grad_enabled(ctx, false);
    ct_ctx_set_training(ctx, false);
    ct_tensor *full = ct_model_forward(ctx, m, ct_wrap(ctx, CT_I32, ids, 2, (int64_t[]){1, T}));
    float *ref = malloc(sizeof(float) * (size_t)(T * 50)), *got = malloc(sizeof(float) * (size_t)(T * 50));
    memcpy(ref, full->data, sizeof(float) * (size_t)(T * 50));
    ct_ctx_reset(ctx);
    ct_gpt_cache *kv;
    CT_ASSERT(ct_gpt_cache_create(m, &kv) == CT_OK);
    const int chunks[4] = {5, 11, 16}; /* k = 0: one by one; k = 1: a prompt of 5, 11 more, the rest */
    for (int k = 0; k < 2; k++) {
        ct_gpt_cache_reset(kv);
        int at = 0;
        for (int j = 0; at < T; j++) {
            int n = k == 0 ? 1 : chunks[j];
            ct_tensor *l = ct_gpt_forward_cached(ctx, m, kv, ct_wrap(ctx, CT_I32, ids + at, 2, (int64_t[]){1, n}));
            memcpy(got + at * 50, l->data, sizeof(float) * (size_t)(n * 50));
            ct_ctx_reset(ctx);
            at += n;
        }
        CT_EXPECT_EQ(ct_gpt_cache_len(kv), T);
        double err = max_rel(got, ref, T * 50);
        CT_EXPECTF(err <= 1e-5, "%s: cached logits differ from the full forward by %g", k ? "chunks" : "one by one", err);
    }
    ct_gpt_cache_free(kv);
    ct_ctx_free(ctx);
    free(ref);
    free(got);
    ct_model_free(m);
}

/* past block_size both paths crop to the last block_size tokens; sampling is seeded */
CT_TEST(generation_past_block_size_and_seeded_sampling) {
    ct_model_config c = ct_model_default_config(CT_MODEL_GPT);
    c.gpt.n_layer = 1; c.gpt.n_embd = 32; c.gpt.n_head = 2; c.gpt.block_size = 8; c.gpt.vocab_size = 20;
    ct_model *m;
    CT_ASSERT(ct_model_create(&c, 3, &m) == CT_OK);
    int32_t prompt[3] = {1, 2, 3}, a[20], b[20], d[20];
    ct_generate_opts o = ct_generate_default_opts();
    o.max_new_tokens = 20;
    o.temperature = 0.9;
    o.top_k = 5;
    o.seed = 42;
    CT_ASSERT(ct_gpt_generate(m, prompt, 3, &o, a, NULL) == CT_OK);
    o.kv_cache = false;
    CT_ASSERT(ct_gpt_generate(m, prompt, 3, &o, b, NULL) == CT_OK);
    CT_EXPECT(!memcmp(a, b, sizeof a)); /* same seed, cache or not: same tokens */
    o.seed = 43;
    CT_ASSERT(ct_gpt_generate(m, prompt, 3, &o, d, NULL) == CT_OK);
    CT_EXPECT(memcmp(a, d, sizeof a) != 0);
    for (int i = 0; i < 20; i++) CT_EXPECT(a[i] >= 0 && a[i] < 20);
    /* bad input: statuses, not aborts */
    CT_EXPECT(ct_gpt_generate(m, prompt, 0, &o, a, NULL) == CT_ERR_INVALID);
    int32_t bad[1] = {20};
    CT_EXPECT(ct_gpt_generate(m, bad, 1, &o, a, NULL) == CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "vocabulary") != NULL);
    o.temperature = -1;
    CT_EXPECT(ct_gpt_generate(m, prompt, 3, &o, a, NULL) == CT_ERR_INVALID);
    ct_model_free(m);
}

/* export → plain safetensors + config.json → import: the same logits; and the Conv1D layout */
CT_TEST(export_hf_roundtrip) {
    ct_model *m, *back;
    CT_ASSERT(ct_model_open(FIX "model.safetensors", &m) == CT_OK);
    char *dir = tmpdir(), path[256];
    CT_ASSERT(dir != NULL);
    CT_ASSERT(ct_gpt_save_hf(m, dir) == CT_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ct_st_file *f;
    CT_ASSERT(ct_st_open(path, &f) == CT_OK);
    ct_st_tensor t;
    CT_EXPECT(ct_st_get(f, "transformer.h.1.attn.c_attn.weight", &t) == CT_OK && t.shape[0] == 64 && t.shape[1] == 192);
    CT_EXPECT(ct_st_get(f, "lm_head.weight", &t) == CT_OK && t.dtype == CT_F32);
    CT_EXPECT(ct_st_metadata(f, "ctrain.model") == NULL); /* HF's layout: read by shapes and config.json */
    CT_EXPECT_EQ(ct_st_count(f), 28 + 1);
    ct_st_close(f);
    /* the same bytes as the file transformers wrote, tensor for tensor */
    ct_st_file *orig;
    CT_ASSERT(ct_st_open(FIX "model.safetensors", &orig) == CT_OK && ct_st_open(path, &f) == CT_OK);
    int differ = 0;
    for (int i = 0; i < ct_st_count(orig); i++) {
        ct_st_tensor a, b;
        const char *n = ct_st_name(orig, i);
        if (ct_st_get(orig, n, &a) != CT_OK || ct_st_get(f, n, &b) != CT_OK || a.nbytes != b.nbytes || memcmp(a.data, b.data, a.nbytes)) differ++;
    }
    CT_EXPECT_EQ(differ, 0);
    ct_st_close(orig);
    ct_st_close(f);
    CT_ASSERT(ct_model_open(path, &back) == CT_OK);
    CT_EXPECT(ct_model_config_of(back)->gpt.gelu_tanh);
    CT_EXPECT_EQ(ct_model_config_of(back)->gpt.n_head, 4);
    CT_EXPECT(!memcmp(ct_params_data(ct_model_params(m)), ct_params_data(ct_model_params(back)), ct_params_numel(ct_model_params(m)) * 4));
    ct_model_free(back);
    /* an untied head (lm_head != wte) cannot be held by the tied GPT: refused, model unchanged */
    {
        ct_st_file *ex;
        CT_ASSERT(ct_st_open(path, &ex) == CT_OK);
        ct_st_writer *w;
        CT_ASSERT(ct_st_writer_create(&w) == CT_OK);
        float *head = NULL;
        for (int i = 0; i < ct_st_count(ex); i++) {
            ct_st_tensor t;
            const char *n = ct_st_name(ex, i);
            CT_ASSERT(ct_st_get(ex, n, &t) == CT_OK);
            const void *data = t.data;
            if (!strcmp(n, "lm_head.weight")) {
                head = malloc(t.nbytes);
                memcpy(head, t.data, t.nbytes);
                head[5] += 1.0f;
                data = head;
            }
            CT_EXPECT_OK(ct_st_writer_add(w, n, t.dtype, t.ndim, t.shape, data));
        }
        char untied[300];
        snprintf(untied, sizeof untied, "%s/untied.safetensors", dir);
        CT_EXPECT_OK(ct_st_writer_save(w, untied));
        ct_st_writer_free(w);
        ct_st_close(ex);
        free(head);
        float before = ct_params_data(ct_model_params(m))[0];
        CT_EXPECT(ct_gpt_load_hf(m, untied) == CT_ERR_FORMAT);
        CT_EXPECT(strstr(ct_last_error(), "untied") != NULL);
        CT_EXPECT(ct_params_data(ct_model_params(m))[0] == before);
    }
    /* a model in ctrain's own layout loads as HF by mistake: a clear error */
    CT_EXPECT(ct_gpt_load_hf(m, "tests/fixtures/models/model_gpt.weights.safetensors") == CT_ERR_FORMAT);
    ct_model_free(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CT_EXPECT(system(cmd) == 0);
}

/* GPT2Config's dropouts survive import and export: resid_pdrop/embd_pdrop are ctrain's dropout,
 * attn_pdrop is carried */
CT_TEST(dropout_roundtrip) {
    char *dir = tmpdir(), cmd[1200], out[100];
    CT_ASSERT(dir != NULL);
    snprintf(cmd, sizeof cmd,
             "cp " FIX "model.safetensors %s/ && sed -e 's/\"resid_pdrop\": 0/\"resid_pdrop\": 0.1/' -e 's/\"embd_pdrop\": 0/\"embd_pdrop\": 0.1/' "
             "-e 's/\"attn_pdrop\": 0/\"attn_pdrop\": 0.05/' " FIX "config.json > %s/config.json", dir, dir);
    CT_ASSERT(system(cmd) == 0);
    ct_model *m, *back;
    CT_ASSERT(ct_model_open(dir, &m) == CT_OK);
    CT_EXPECT(ct_model_config_of(m)->gpt.dropout == 0.1f && ct_model_config_of(m)->gpt.attn_pdrop == 0.05f);
    snprintf(out, sizeof out, "%s/export", dir);
    CT_ASSERT(ct_model_save_hf(m, out) == CT_OK);
    CT_ASSERT(ct_model_open(out, &back) == CT_OK);
    CT_EXPECT(ct_model_config_of(back)->gpt.dropout == 0.1f && ct_model_config_of(back)->gpt.attn_pdrop == 0.05f);
    snprintf(cmd, sizeof cmd, "grep -q '\"attn_pdrop\":[[:space:]]*0.05,' %s/config.json && grep -q '\"resid_pdrop\":[[:space:]]*0.1,' %s/config.json && "
             "grep -q '\"embd_pdrop\":[[:space:]]*0.1,' %s/config.json", out, out, out);
    CT_EXPECT(system(cmd) == 0);
    /* ctrain's own file keeps them too (metadata) */
    snprintf(out, sizeof out, "%s/own.safetensors", dir);
    CT_ASSERT(ct_model_save(back, out) == CT_OK);
    ct_st_file *f;
    CT_ASSERT(ct_st_open(out, &f) == CT_OK);
    CT_EXPECT(ct_st_metadata(f, "ctrain.attn_pdrop") && !strcmp(ct_st_metadata(f, "ctrain.attn_pdrop"), "0.0500000007"));
    ct_st_close(f);
    ct_model_free(back);
    /* one without attention dropout: no such key, the file as before the field existed */
    ct_model *plain;
    char out0[120];
    snprintf(out0, sizeof out0, "%s/plain.safetensors", dir);
    CT_ASSERT(ct_model_open(FIX "model.safetensors", &plain) == CT_OK && ct_model_save(plain, out0) == CT_OK);
    CT_ASSERT(ct_st_open(out0, &f) == CT_OK);
    CT_EXPECT(ct_st_metadata(f, "ctrain.attn_pdrop") == NULL && ct_st_metadata(f, "ctrain.dropout") != NULL);
    ct_st_close(f);
    ct_model_free(plain);
    CT_ASSERT(ct_model_open(out, &back) == CT_OK);
    CT_EXPECT(ct_model_config_of(back)->gpt.dropout == 0.1f && ct_model_config_of(back)->gpt.attn_pdrop == 0.05f);
    ct_model_free(back);
    ct_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CT_EXPECT(system(cmd) == 0);
}

/* the sharded form (model.safetensors.index.json + shards) opens as the single file does */
CT_TEST(sharded_checkpoint) {
    char *dir = tmpdir(), path[200], cmd[300];
    CT_ASSERT(dir != NULL);
    ct_st_file *f;
    CT_ASSERT(ct_st_open(FIX "model.safetensors", &f) == CT_OK);
    ct_st_writer *w[2];
    CT_ASSERT(ct_st_writer_create(&w[0]) == CT_OK && ct_st_writer_create(&w[1]) == CT_OK);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *idx = fopen(path, "w");
    CT_ASSERT(idx != NULL);
    fprintf(idx, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < ct_st_count(f); i++) {
        ct_st_tensor t;
        const char *n = ct_st_name(f, i);
        CT_ASSERT(ct_st_get(f, n, &t) == CT_OK);
        CT_ASSERT(ct_st_writer_add(w[i % 2], n, t.dtype, t.ndim, t.shape, t.data) == CT_OK);
        fprintf(idx, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", n, i % 2 + 1);
    }
    fprintf(idx, "}}\n");
    CT_ASSERT(fclose(idx) == 0);
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, k + 1);
        CT_ASSERT(ct_st_writer_set_metadata(w[k], "format", "pt") == CT_OK && ct_st_writer_save(w[k], path) == CT_OK);
        ct_st_writer_free(w[k]);
    }
    ct_st_close(f);
    snprintf(cmd, sizeof cmd, "cp " FIX "config.json %s/", dir);
    CT_ASSERT(system(cmd) == 0);
    ct_model *a, *b;
    CT_ASSERT(ct_model_open(FIX "model.safetensors", &a) == CT_OK);
    CT_ASSERT(ct_model_open(dir, &b) == CT_OK);
    CT_EXPECT(ct_params_numel(ct_model_params(a)) == ct_params_numel(ct_model_params(b)));
    CT_EXPECT(!memcmp(ct_params_data(ct_model_params(a)), ct_params_data(ct_model_params(b)), ct_params_numel(ct_model_params(a)) * 4));
    ct_model_free(a);
    ct_model_free(b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CT_EXPECT(system(cmd) == 0);
}

/* ct_model_save writes the config: the file alone rebuilds the model, for every kind */
CT_TEST(config_metadata_roundtrip) {
    char *dir = tmpdir(), path[256];
    CT_ASSERT(dir != NULL);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    ct_model_config cs[3] = {ct_model_default_config(CT_MODEL_MLP), ct_model_default_config(CT_MODEL_CNN), ct_model_default_config(CT_MODEL_GPT)};
    cs[0].mlp.n_hidden = 2; cs[0].mlp.hidden[0] = 12; cs[0].mlp.hidden[1] = 7; cs[0].mlp.in = 20; cs[0].mlp.dropout = 0.25f;
    cs[1].cnn.c1 = 4; cs[1].cnn.c2 = 6; cs[1].cnn.fc = 16; cs[1].cnn.height = 8; cs[1].cnn.width = 12;
    cs[2].gpt.n_layer = 1; cs[2].gpt.n_embd = 24; cs[2].gpt.n_head = 3; cs[2].gpt.block_size = 10; cs[2].gpt.gelu_tanh = true;
    cs[2].gpt.ln_eps = 1e-6f;
    for (int k = 0; k < 3; k++) {
        ct_model *m, *back;
        CT_ASSERT(ct_model_create(&cs[k], 5, &m) == CT_OK);
        CT_ASSERT(ct_model_save(m, path) == CT_OK);
        CT_ASSERT(ct_model_open(path, &back) == CT_OK);
        CT_EXPECTF(!strcmp(ct_model_describe(m), ct_model_describe(back)), "%s vs %s", ct_model_describe(m), ct_model_describe(back));
        CT_EXPECT(!memcmp(ct_params_data(ct_model_params(m)), ct_params_data(ct_model_params(back)), ct_params_numel(ct_model_params(m)) * 4));
        ct_model_free(m);
        ct_model_free(back);
    }
    /* a file without metadata or GPT tensors: a message naming it */
    ct_model *m;
    CT_EXPECT(ct_model_open("tests/fixtures/models/model_mlp.weights.safetensors", &m) == CT_ERR_FORMAT && m == NULL);
    CT_EXPECT(strstr(ct_last_error(), "model_mlp.weights.safetensors") != NULL);
    CT_EXPECT(ct_model_open("/nonexistent/x.safetensors", &m) != CT_OK);
    /* nanoGPT's layout without metadata or config.json: its heads are unknown, refused */
    CT_EXPECT(ct_model_open("tests/fixtures/models/model_gpt.weights.safetensors", &m) == CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "attention heads") != NULL);
    unlink(path);
    rmdir(dir);
}

CT_TEST_MAIN()
