/* Llama in Hugging Face's layout (src/models/llama_hf.c): directories laid out as
 * save_pretrained writes them (tests/torch/gen_llama.py: config.json + model.safetensors,
 * a tied head left out, one in BF16) open from the directory alone and give the reference
 * LlamaForCausalLM's logits; export → re-import keeps every weight bit for bit; config.json
 * fields ctrain's Llama does not compute are refused by name. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"

#define FIX "tests/fixtures/models/llama_hf_"

static char *tmpdir(void) {
    static char d[64];
    snprintf(d, sizeof d, "/tmp/ct_llama_hf_XXXXXX");
    return mkdtemp(d);
}

/* the model in dir against its expected.safetensors: the normwise error of the logits */
static double logits_err(ct_model *m, const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    ct_st_file *f;
    CT_CHECK(ct_st_open(path, &f) == CT_OK, "%s", ct_last_error());
    ct_st_tensor ids, ref;
    CT_CHECK(ct_st_get(f, "input_ids", &ids) == CT_OK && ids.dtype == CT_I64 && ids.ndim == 2, "input_ids");
    CT_CHECK(ct_st_get(f, "logits", &ref) == CT_OK && ref.dtype == CT_F32, "logits");
    ct_ctx *ctx;
    CT_CHECK(ct_ctx_create(NULL, &ctx) == CT_OK, "ctx");
    ct_set_grad_enabled(ctx, false);
    ct_ctx_set_training(ctx, false);
    ct_tensor *x = ct_from_data(ctx, CT_I64, ids.data, 2, ids.shape);
    ct_tensor *logits = ct_model_forward(ctx, m, x);
    CT_CHECK((size_t)ct_numel(logits) * sizeof(float) == ref.nbytes, "logits shape");
    double e = ct_norm_rel_err(ct_f32(logits), ref.data, (long)ct_numel(logits));
    ct_ctx_free(ctx);
    ct_st_close(f);
    return e;
}

CT_TEST(config_from_config_json) {
    ct_model_config c;
    ct_weights_layout lay;
    CT_ASSERT(ct_model_config_from_file(FIX "tied", &c, &lay) == CT_OK); /* the directory */
    CT_EXPECT_EQ(c.kind, CT_MODEL_LLAMA);
    CT_EXPECT_EQ(lay, CT_LAYOUT_HF);
    CT_EXPECT_EQ(c.llama.num_hidden_layers, 2);
    CT_EXPECT_EQ(c.llama.hidden_size, 64);
    CT_EXPECT_EQ(c.llama.intermediate_size, 176);
    CT_EXPECT_EQ(c.llama.num_attention_heads, 4);
    CT_EXPECT_EQ(c.llama.num_key_value_heads, 2);
    CT_EXPECT_EQ(c.llama.max_position_embeddings, 32);
    CT_EXPECT_EQ(c.llama.vocab_size, 256);
    CT_EXPECT(c.llama.tie_word_embeddings);
    CT_EXPECT(c.llama.rms_norm_eps == 1e-5f);
    CT_EXPECT(c.llama.rope_theta == 500000.0f);
    /* the file's path works as the directory does */
    CT_ASSERT(ct_model_config_from_file(FIX "gqa/model.safetensors", &c, &lay) == CT_OK);
    CT_EXPECT(!c.llama.tie_word_embeddings);
}

/* the reference's logits: F32 with the tied head left out, and BF16 weights */
CT_TEST(logits_match_reference) {
    const char *names[] = {"tied", "gqa"};
    for (int i = 0; i < 2; i++) {
        char dir[128];
        snprintf(dir, sizeof dir, FIX "%s", names[i]);
        ct_model *m;
        CT_ASSERT(ct_model_open(dir, &m) == CT_OK);
        double e = logits_err(m, dir);
        printf("  %s: logits vs the reference: normwise error %.3g\n", names[i], e);
        CT_EXPECTF(e <= 1e-5, "%s: logits differ from the reference's by %g", names[i], e);
        ct_model_free(m);
    }
}

static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    for (int ca = 0, cb = 0; same && ca != EOF;) {
        ca = fgetc(fa);
        cb = fgetc(fb);
        same = ca == cb;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* export → import → export: the same bytes, the same weights; the tied head is not in the file */
CT_TEST(export_reimport_roundtrip) {
    const char *names[] = {"tied", "gqa"};
    for (int i = 0; i < 2; i++) {
        char src[128], *dir = tmpdir(), a[256], b[256], p[300];
        CT_ASSERT(dir != NULL);
        snprintf(src, sizeof src, FIX "%s", names[i]);
        ct_model *m, *back;
        CT_ASSERT(ct_model_open(src, &m) == CT_OK);
        snprintf(a, sizeof a, "%s/a", dir);
        snprintf(b, sizeof b, "%s/b", dir);
        CT_ASSERT(ct_model_save_hf(m, a) == CT_OK);
        CT_ASSERT(ct_model_open(a, &back) == CT_OK);
        CT_ASSERT(ct_model_save_hf(back, b) == CT_OK);
        snprintf(p, sizeof p, "%s/model.safetensors", a);
        char q[300];
        snprintf(q, sizeof q, "%s/model.safetensors", b);
        CT_EXPECT(same_file(p, q));
        ct_st_file *f;
        CT_ASSERT(ct_st_open(p, &f) == CT_OK);
        ct_st_tensor t;
        CT_EXPECT((ct_st_get(f, "lm_head.weight", &t) == CT_OK) == (i != 0)); /* tied: left out */
        CT_EXPECT(ct_st_get(f, "model.embed_tokens.weight", &t) == CT_OK && t.dtype == CT_F32);
        CT_EXPECT(ct_st_metadata(f, "format") && !strcmp(ct_st_metadata(f, "format"), "pt"));
        CT_EXPECT(ct_st_metadata(f, "ctrain.model") == NULL);
        ct_st_close(f);
        ct_params *P = ct_model_params(m), *Q = ct_model_params(back);
        CT_ASSERT(ct_params_count(P) == ct_params_count(Q));
        for (int k = 0; k < ct_params_count(P); k++) {
            const ct_tensor *x = ct_params_get(P, k), *y = ct_params_get(Q, k);
            CT_EXPECTF(!strcmp(x->name, y->name) && !memcmp(x->data, y->data, sizeof(float) * (size_t)ct_numel(x)), "%s differs", x->name);
        }
        snprintf(p, sizeof p, "%s/config.json", a);
        snprintf(q, sizeof q, "%s/config.json", b);
        CT_EXPECT(same_file(p, q));
        double e = logits_err(back, src);
        CT_EXPECTF(e <= 1e-5, "%s: re-imported logits differ by %g", names[i], e);
        ct_model_free(back);
        ct_model_free(m);
        snprintf(p, sizeof p, "rm -rf '%s'", dir);
        CT_EXPECT(system(p) == 0);
    }
}

/* a copy of the tied fixture with config.json replaced by text */
static void with_config(const char *dir, const char *json) {
    char p[300];
    snprintf(p, sizeof p, "cp " FIX "tied/model.safetensors '%s/'", dir);
    CT_CHECK(system(p) == 0, "cp");
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    CT_CHECK(f && fputs(json, f) >= 0 && fclose(f) == 0, "%s", p);
}

#define SHAPE_(heads, width) "\"vocab_size\": 256, \"hidden_size\": " width ", \"intermediate_size\": 176, " \
              "\"num_hidden_layers\": 2, \"num_attention_heads\": " heads ", \"num_key_value_heads\": 2, \"tie_word_embeddings\": true"
#define SHAPE SHAPE_("4", "64")

CT_TEST(unsupported_config_refused) {
    struct { const char *json, *want; ct_status st; } cases[] = {
        {"{" SHAPE ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8.0}}", "rope_scaling 'yarn'", CT_ERR_UNSUPPORTED},
        {"{" SHAPE ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 8.0}}", "rope_scaling 'linear'", CT_ERR_UNSUPPORTED},
        {"{" SHAPE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}", "'llama3' without low_freq_factor", CT_ERR_FORMAT},
        {"{" SHAPE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4, \"high_freq_factor\": 1}}",
         "high_freq_factor", CT_ERR_FORMAT},
        {"{" SHAPE ", \"attention_bias\": true}", "attention_bias", CT_ERR_UNSUPPORTED},
        {"{" SHAPE ", \"mlp_bias\": true}", "mlp_bias", CT_ERR_UNSUPPORTED},
        {"{" SHAPE ", \"hidden_act\": \"gelu\"}", "hidden_act 'gelu'", CT_ERR_UNSUPPORTED},
        {"{" SHAPE ", \"head_dim\": 32}", "head_dim 32", CT_ERR_UNSUPPORTED},
        {"{" SHAPE ", \"model_type\": \"mistral\"}", "model_type 'mistral'", CT_ERR_UNSUPPORTED},
        {"{" SHAPE_("3", "64") "}", "num_attention_heads", CT_ERR_FORMAT},
        {"{" SHAPE ", \"rope_theta\": 1e40}", "rope_theta", CT_ERR_FORMAT},
        {"{" SHAPE_("4", "64.5") "}", "hidden_size = 64.5 is not an integer", CT_ERR_FORMAT},
        /* LlamaConfig's default sizes (7B) do not fit the file's weights: refused before allocating */
        {"{\"tie_word_embeddings\": true}", "does not match the weights", CT_ERR_FORMAT},
        {"[1, 2]", "not a JSON object", CT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = tmpdir(), p[300];
        CT_ASSERT(dir != NULL);
        with_config(dir, cases[i].json);
        ct_model *m = NULL;
        ct_status st = ct_model_open(dir, &m);
        CT_EXPECTF(st == cases[i].st && strstr(ct_last_error(), cases[i].want) && strstr(ct_last_error(), "config.json"),
                   "case %zu: status %d, '%s' (want '%s')", i, st, ct_last_error(), cases[i].want);
        ct_model_free(m);
        snprintf(p, sizeof p, "rm -rf '%s'", dir);
        CT_EXPECT(system(p) == 0);
    }
}

CT_TEST(directory_without_config_or_weights) {
    char *dir = tmpdir(), p[300];
    CT_ASSERT(dir != NULL);
    ct_model *m = NULL;
    CT_EXPECT(ct_model_open(dir, &m) == CT_ERR_NOT_FOUND && strstr(ct_last_error(), "without model.safetensors"));
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "w");
    CT_ASSERT(f && fputs("{\"weight_map\": {}}", f) >= 0 && fclose(f) == 0);
    CT_EXPECT(ct_model_open(dir, &m) == CT_ERR_FORMAT && strstr(ct_last_error(), "no weight_map object"));
    unlink(p);
    snprintf(p, sizeof p, "cp " FIX "tied/model.safetensors '%s/'", dir);
    CT_ASSERT(system(p) == 0);
    CT_EXPECT(ct_model_open(dir, &m) == CT_ERR_FORMAT && strstr(ct_last_error(), "config.json"));
    /* a FIFO as config.json: refused, not waited on */
    snprintf(p, sizeof p, "%s/config.json", dir);
    CT_ASSERT(mkfifo(p, 0600) == 0);
    CT_EXPECT(ct_model_open(dir, &m) == CT_ERR_FORMAT && strstr(ct_last_error(), "not a regular file"));
    CT_EXPECT(m == NULL);
    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    CT_EXPECT(system(p) == 0);
}

CT_TEST_MAIN()
