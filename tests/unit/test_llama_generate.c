/* Llama generation with the key/value cache (decode.c, llama.c): the cache (grouped K/V,
 * rotary positions at the absolute position) gives a full forward's logits one token at a
 * time and in chunks; the prompt's last row through the cache is the reference's last
 * position; greedy generation with the cache equals full forwards over the context token
 * for token, past the context too; and it equals transformers' LlamaForCausalLM.generate. */
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"

#define FIX "tests/fixtures/models/llama_hf_"

static const char *names[] = {"tied", "gqa"};

/* expected.safetensors' input_ids [2, 16] (row 0 as int32 into ids) and logits [2, 16, 256] */
static const float *expected(ct_st_file **f, const char *name, int32_t *ids) {
    char p[128];
    snprintf(p, sizeof p, FIX "%s/expected.safetensors", name);
    CT_CHECK(ct_st_open(p, f) == CT_OK, "%s", ct_last_error());
    ct_st_tensor t, l;
    CT_CHECK(ct_st_get(*f, "input_ids", &t) == CT_OK && t.dtype == CT_I64 && t.shape[0] == 2 && t.shape[1] == 16, "input_ids");
    CT_CHECK(ct_st_get(*f, "logits", &l) == CT_OK && l.dtype == CT_F32 && l.shape[2] == 256, "logits");
    for (int i = 0; i < 16; i++) {
        int64_t v;
        memcpy(&v, (const char *)t.data + 8 * i, 8);
        ids[i] = (int32_t)v;
    }
    return l.data;
}

static ct_model *open_fixture(const char *name) {
    char p[128];
    snprintf(p, sizeof p, FIX "%s", name);
    ct_model *m;
    CT_CHECK(ct_model_open(p, &m) == CT_OK, "%s", ct_last_error());
    return m;
}

/* one by one, then chunks of 5, 7, 4: the rows of a full forward; the prompt's last row = the reference's */
CT_TEST(cache_logits_equal_full_forward_and_reference) {
    for (int n = 0; n < 2; n++) {
        ct_model *m = open_fixture(names[n]);
        ct_st_file *f;
        int32_t ids[16];
        const float *ref = expected(&f, names[n], ids);
        ct_ctx *ctx;
        CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
        ct_set_grad_enabled(ctx, false);
        ct_ctx_set_training(ctx, false);
        float *full = malloc(sizeof(float) * 16 * 256), *got = malloc(sizeof(float) * 16 * 256);
        memcpy(full, ct_model_forward(ctx, m, ct_wrap(ctx, CT_I32, ids, 2, (int64_t[]){1, 16}))->data, sizeof(float) * 16 * 256);
        ct_ctx_reset(ctx);
        ct_kv_cache *kv;
        CT_ASSERT(ct_model_cache_create(m, &kv) == CT_OK);
        const int chunks[3] = {5, 7, 4};
        for (int k = 0; k < 2; k++) {
            ct_kv_cache_reset(kv);
            for (int at = 0, j = 0; at < 16; j++) {
                int len = k == 0 ? 1 : chunks[j];
                ct_tensor *l = ct_model_forward_cached(ctx, m, kv, ct_wrap(ctx, CT_I32, ids + at, 2, (int64_t[]){1, len}));
                memcpy(got + at * 256, l->data, sizeof(float) * (size_t)(len * 256));
                ct_ctx_reset(ctx);
                at += len;
            }
            CT_EXPECT_EQ(ct_kv_cache_len(kv), 16);
            double e = ct_max_rel_err(got, full, 16 * 256, 1.0);
            CT_EXPECTF(e <= 1e-5, "%s, %s: cached logits differ from the full forward by %g", names[n], k ? "chunks" : "one by one", e);
        }
        /* the first generated token's logits: the prompt through the cache, its last row */
        ct_kv_cache_reset(kv);
        ct_tensor *l = ct_model_forward_cached(ctx, m, kv, ct_wrap(ctx, CT_I32, ids, 2, (int64_t[]){1, 16}));
        double e = ct_norm_rel_err(ct_f32(l) + 15 * 256, ref + 15 * 256, 256);
        printf("  %s: first generated token's logits vs the reference's last position: normwise error %.3g\n", names[n], e);
        CT_EXPECTF(e <= 1e-5, "%s: %g", names[n], e);
        ct_kv_cache_free(kv);
        free(full);
        free(got);
        ct_ctx_free(ctx);
        ct_st_close(f);
        ct_model_free(m);
    }
}

/* greedy: the cache and full forwards agree token for token, also past the context (32) */
CT_TEST(greedy_cache_equals_full_forward) {
    for (int n = 0; n < 2; n++) {
        ct_model *m = open_fixture(names[n]);
        int32_t prompt[3] = {72, 105, 33}, a[48], b[48];
        ct_generate_opts o = ct_generate_default_opts();
        o.temperature = 0;
        o.max_new_tokens = 48;
        ct_generate_stats s;
        CT_ASSERT(ct_model_generate(m, prompt, 3, &o, a, &s) == CT_OK);
        CT_EXPECT_EQ(s.new_tokens, 48);
        o.kv_cache = false;
        CT_ASSERT(ct_model_generate(m, prompt, 3, &o, b, NULL) == CT_OK);
        int same = 0;
        while (same < 48 && a[same] == b[same]) same++;
        CT_EXPECTF(same == 48, "%s: token %d: %d with the cache, %d without", names[n], same, same < 48 ? a[same] : -1, same < 48 ? b[same] : -1);
        /* sampled: the same seed gives the same tokens either way */
        o.temperature = 0.8;
        o.top_k = 20;
        CT_ASSERT(ct_model_generate(m, prompt, 3, &o, b, NULL) == CT_OK);
        o.kv_cache = true;
        CT_ASSERT(ct_model_generate(m, prompt, 3, &o, a, NULL) == CT_OK);
        CT_EXPECT(!memcmp(a, b, sizeof a));
        ct_model_free(m);
    }
}

/* LlamaForCausalLM.generate(do_sample=False) of transformers 4.40.2 (torch 1.13) on these
 * directories as --export hf writes them, from the first 5 ids of expected.safetensors */
CT_TEST(greedy_matches_transformers) {
    const int32_t want[2][12] = {{190, 190, 209, 209, 209, 151, 151, 151, 151, 151, 151, 151},
                                 {193, 77, 39, 8, 29, 171, 201, 165, 63, 77, 8, 8}};
    for (int n = 0; n < 2; n++) {
        ct_model *m = open_fixture(names[n]);
        ct_st_file *f;
        int32_t ids[16], got[12];
        expected(&f, names[n], ids);
        ct_generate_opts o = ct_generate_default_opts();
        o.temperature = 0;
        o.max_new_tokens = 12;
        CT_ASSERT(ct_model_generate(m, ids, 5, &o, got, NULL) == CT_OK);
        CT_EXPECTF(!memcmp(got, want[n], sizeof got), "%s: greedy differs from transformers' (first: %d vs %d)", names[n], got[0], want[n][0]);
        ct_st_close(f);
        ct_model_free(m);
    }
}

CT_TEST(kinds_that_do_not_generate) {
    ct_model_config c = ct_model_default_config(CT_MODEL_MLP);
    c.mlp.in = 4; c.mlp.n_hidden = 1; c.mlp.hidden[0] = 8; c.mlp.out = 3;
    ct_model *m;
    CT_ASSERT(ct_model_create(&c, 0, &m) == CT_OK);
    int32_t p[1] = {0}, out[1];
    CT_EXPECT(ct_model_generate(m, p, 1, NULL, out, NULL) == CT_ERR_INVALID && strstr(ct_last_error(), "cannot generate"));
    ct_kv_cache *kv;
    CT_EXPECT(ct_model_cache_create(m, &kv) == CT_ERR_UNSUPPORTED && kv == NULL);
    ct_model_free(m);
    /* a Llama is no GPT for the GPT's names */
    m = open_fixture("gqa");
    CT_EXPECT(ct_gpt_generate(m, p, 1, NULL, out, NULL) == CT_ERR_INVALID && strstr(ct_last_error(), "not a GPT"));
    ct_model_free(m);
}

CT_TEST_MAIN()
