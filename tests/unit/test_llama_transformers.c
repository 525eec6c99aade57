/* Llama against transformers itself (tests/torch/gen_llama_transformers.py: random
 * LlamaForCausalLM models of transformers 5 saved with save_pretrained, one of them sharded,
 * two with rope_scaling "llama3"). From each directory alone: the rotary inverse frequencies,
 * the logits (f32, normwise <= 1e-5), 20 AdamW steps from the same weights (each step's loss
 * within 1e-5 in f32, 1e-2 under bf16 autocast), greedy generation with the key/value cache
 * (transformers' generate's 50 tokens), and the export: re-opened, the same weights and
 * logits, config.json carrying the rope scaling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"

#define FIX "tests/fixtures/models/llama_tf_"

static const char *names[] = {"gqa", "llama3", "sharded"};

typedef struct {
    ct_st_file *f;
    ct_st_tensor ids, logits, inv, tx, ty, l32, l16, prompt, greedy;
} ref;

static void ref_open(ref *r, const char *name) {
    char p[128];
    snprintf(p, sizeof p, FIX "%s/ref.safetensors", name);
    CT_CHECK(ct_st_open(p, &r->f) == CT_OK, "%s", ct_last_error());
    const char *n[] = {"input_ids", "logits", "inv_freq", "train_x", "train_y", "loss_f32", "loss_bf16", "prompt", "greedy"};
    ct_st_tensor *t[] = {&r->ids, &r->logits, &r->inv, &r->tx, &r->ty, &r->l32, &r->l16, &r->prompt, &r->greedy};
    for (int i = 0; i < 9; i++) CT_CHECK(ct_st_get(r->f, n[i], t[i]) == CT_OK, "%s: %s", p, n[i]);
}

static int64_t i64_at(const ct_st_tensor *t, int64_t i) {
    int64_t v;
    memcpy(&v, (const char *)t->data + 8 * i, 8);
    return v;
}

static ct_model *open_fixture(const char *name) {
    char p[128];
    snprintf(p, sizeof p, FIX "%s", name);
    ct_model *m;
    CT_CHECK(ct_model_open(p, &m) == CT_OK, "%s", ct_last_error());
    return m;
}

/* the model's logits for the reference's input_ids: normwise error against its logits */
static double logits_err(ct_model *m, const ref *r) {
    ct_ctx *ctx;
    CT_CHECK(ct_ctx_create(NULL, &ctx) == CT_OK, "ctx");
    ct_set_grad_enabled(ctx, false);
    ct_ctx_set_training(ctx, false);
    ct_tensor *l = ct_model_forward(ctx, m, ct_from_data(ctx, CT_I64, r->ids.data, 2, r->ids.shape));
    CT_CHECK((size_t)ct_numel(l) * 4 == r->logits.nbytes, "logits shape");
    double e = ct_norm_rel_err(ct_f32(l), r->logits.data, (long)ct_numel(l));
    ct_ctx_free(ctx);
    return e;
}

CT_TEST(config_and_rope_scaling_read) {
    ct_model_config c;
    ct_weights_layout lay;
    CT_ASSERT(ct_model_config_from_file(FIX "gqa", &c, &lay) == CT_OK);
    CT_EXPECT(c.llama.rope_scaling.factor == 0 && c.llama.tie_word_embeddings && c.llama.num_key_value_heads == 2);
    CT_ASSERT(ct_model_config_from_file(FIX "llama3", &c, &lay) == CT_OK);
    CT_EXPECT(c.llama.rope_scaling.factor == 4 && c.llama.rope_scaling.low_freq_factor == 1 &&
              c.llama.rope_scaling.high_freq_factor == 4 && c.llama.rope_scaling.original_max_position_embeddings == 32);
    CT_EXPECT(!c.llama.tie_word_embeddings);
    /* the sharded one: from the directory and from its index */
    CT_ASSERT(ct_model_config_from_file(FIX "sharded", &c, &lay) == CT_OK);
    CT_EXPECT(c.llama.vocab_size == 384 && c.llama.num_key_value_heads == 4 && c.llama.rope_scaling.factor == 4);
    CT_ASSERT(ct_model_config_from_file(FIX "sharded/model.safetensors.index.json", &c, &lay) == CT_OK);
    CT_EXPECT_EQ(lay, CT_LAYOUT_HF);
}

/* the angles rope gives position 1 are the inverse frequencies: transformers' inv_freq */
CT_TEST(inverse_frequencies_match) {
    for (int n = 0; n < 3; n++) {
        ct_model_config c;
        char dir[96];
        snprintf(dir, sizeof dir, FIX "%s", names[n]);
        CT_ASSERT(ct_model_config_from_file(dir, &c, NULL) == CT_OK);
        ref r;
        ref_open(&r, names[n]);
        int64_t h = r.inv.shape[0], D = 2 * h;
        ct_ctx *ctx;
        CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
        ct_tensor *x = ct_zeros(ctx, CT_F32, 2, (int64_t[]){2, D});
        for (int64_t j = 0; j < h; j++) ct_f32(x)[D + j] = 1; /* row 1 (position 1): (1, 0) pairs */
        ct_tensor *y = ct_rope_scaled(ctx, x, NULL, c.llama.rope_theta, &c.llama.rope_scaling);
        double worst = 0;
        for (int64_t j = 0; j < h; j++) {
            double a = atan2(ct_f32(y)[D + h + j], ct_f32(y)[D + j]), want = ((const float *)r.inv.data)[j];
            worst = fmax(worst, fabs(a - want) / want);
        }
        printf("  %s: inverse frequencies vs transformers' inv_freq: largest relative difference %.3g\n", names[n], worst);
        CT_EXPECTF(worst <= 1e-6, "%s: inv_freq off by %g", names[n], worst);
        ct_ctx_free(ctx);
        ct_st_close(r.f);
    }
}

CT_TEST(logits_match_transformers) {
    for (int n = 0; n < 3; n++) {
        ct_model *m = open_fixture(names[n]);
        ref r;
        ref_open(&r, names[n]);
        double e = logits_err(m, &r);
        printf("  %s: logits vs transformers (f32): normwise error %.3g\n", names[n], e);
        CT_EXPECTF(e <= 1e-5, "%s: %g", names[n], e);
        ct_st_close(r.f);
        ct_model_free(m);
    }
}

/* 20 AdamW steps (lr 1e-4, torch's defaults) on the reference's batches */
static void train_steps(const char *name, bool bf16, double tol) {
    ct_model *m = open_fixture(name);
    ref r;
    ref_open(&r, name);
    ct_optim *opt;
    ct_adamw_opts ao = ct_adamw_default_opts();
    CT_ASSERT(ct_optim_create_adamw(ct_model_params(m), &ao, &opt) == CT_OK);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    ct_ctx_set_training(ctx, true);
    const int64_t S = r.tx.shape[0], B = r.tx.shape[1], T = r.tx.shape[2];
    int32_t *x = malloc(sizeof(int32_t) * (size_t)(B * T)), *y = malloc(sizeof(int32_t) * (size_t)(B * T));
    double worst = 0;
    for (int64_t s = 0; s < S; s++) {
        for (int64_t i = 0; i < B * T; i++) {
            x[i] = (int32_t)i64_at(&r.tx, s * B * T + i);
            y[i] = (int32_t)i64_at(&r.ty, s * B * T + i);
        }
        if (bf16) CT_ASSERT(ct_autocast_begin(ctx, CT_BF16) == CT_OK);
        ct_tensor *loss = ct_model_loss(ctx, m, ct_wrap(ctx, CT_I32, x, 2, (int64_t[]){B, T}), ct_wrap(ctx, CT_I32, y, 2, (int64_t[]){B, T}));
        if (bf16) ct_autocast_end(ctx);
        double want = ((const double *)(bf16 ? r.l16.data : r.l32.data))[s], got = ct_f32(loss)[0];
        worst = fmax(worst, fabs(got - want));
        if (getenv("CT_TEST_VERBOSE")) printf("    step %lld: %.7f vs %.7f\n", (long long)s, got, want);
        ct_backward(ctx, loss);
        ct_optim_step(opt, 1e-4);
        ct_params_zero_grad(ct_model_params(m));
        ct_ctx_reset(ctx);
    }
    printf("  %s: %lld AdamW steps%s: largest loss difference from transformers' %.3g\n", name, (long long)S,
           bf16 ? " under bf16 autocast" : " (f32)", worst);
    CT_EXPECTF(worst <= tol, "%s: %g", name, worst);
    free(x);
    free(y);
    ct_ctx_free(ctx);
    ct_optim_free(opt);
    ct_st_close(r.f);
    ct_model_free(m);
}

CT_TEST(adamw_losses_match_f32) {
    for (int n = 0; n < 3; n++) train_steps(names[n], false, 1e-5);
}

CT_TEST(adamw_losses_match_bf16_autocast) {
    for (int n = 0; n < 3; n++) train_steps(names[n], true, 1e-2);
}

CT_TEST(greedy_generation_matches) {
    for (int n = 0; n < 3; n++) {
        ct_model *m = open_fixture(names[n]);
        ref r;
        ref_open(&r, names[n]);
        int np = (int)r.prompt.shape[0], ng = (int)r.greedy.shape[0];
        int32_t prompt[64], got[64];
        for (int i = 0; i < np; i++) prompt[i] = (int32_t)i64_at(&r.prompt, i);
        ct_generate_opts o = ct_generate_default_opts();
        o.max_new_tokens = ng;
        o.temperature = 0;
        CT_ASSERT(ct_model_generate(m, prompt, np, &o, got, NULL) == CT_OK);
        int same = 0;
        while (same < ng && got[same] == (int32_t)i64_at(&r.greedy, same)) same++;
        printf("  %s: greedy generation with the cache: %d of %d tokens as transformers' generate\n", names[n], same, ng);
        CT_EXPECTF(same == ng, "%s: token %d differs", names[n], same);
        ct_st_close(r.f);
        ct_model_free(m);
    }
}

CT_TEST(export_reopens_with_same_logits) {
    /* CT_LLAMA_EXPORT_DIR keeps the exports there (tests/torch/check_llama_export.py loads them in transformers) */
    const char *keep = getenv("CT_LLAMA_EXPORT_DIR");
    char dir[64] = "/tmp/ct_llama_tf_XXXXXX";
    if (keep) snprintf(dir, sizeof dir, "%s", keep);
    else CT_ASSERT(mkdtemp(dir));
    for (int n = 0; n < 3; n++) {
        ct_model *m = open_fixture(names[n]);
        char out[96], cj[128];
        snprintf(out, sizeof out, "%s/%s", dir, names[n]);
        CT_ASSERT(ct_model_save_hf(m, out) == CT_OK);
        ct_model *b;
        CT_ASSERT(ct_model_open(out, &b) == CT_OK);
        ct_params *pa = ct_model_params(m), *pb = ct_model_params(b);
        CT_ASSERT(ct_params_count(pa) == ct_params_count(pb));
        bool same = true;
        for (int i = 0; i < ct_params_count(pa); i++) {
            const ct_tensor *ta = ct_params_get(pa, i), *tb = ct_params_get(pb, i);
            same = same && !strcmp(ta->name, tb->name) && !memcmp(ta->data, tb->data, (size_t)ct_numel(ta) * 4);
        }
        CT_EXPECTF(same, "%s: the export re-opens with other weights", names[n]);
        ref r;
        ref_open(&r, names[n]);
        double e = logits_err(b, &r);
        CT_EXPECTF(e <= 1e-5, "%s: %g", names[n], e);
        snprintf(cj, sizeof cj, "%s/config.json", out);
        FILE *fp = fopen(cj, "r");
        char text[4096] = "";
        CT_ASSERT(fp);
        size_t got = fread(text, 1, sizeof text - 1, fp);
        text[got] = 0;
        fclose(fp);
        cJSON *j = cJSON_Parse(text), *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
        if (n == 0) CT_EXPECT(cJSON_IsNull(rs));
        else {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type"), *f = cJSON_GetObjectItemCaseSensitive(rs, "factor"),
                        *o = cJSON_GetObjectItemCaseSensitive(rs, "original_max_position_embeddings");
            CT_EXPECT(cJSON_IsString(ty) && !strcmp(ty->valuestring, "llama3") && cJSON_IsNumber(f) && f->valuedouble == 4 &&
                      cJSON_IsNumber(o) && o->valueint == 32);
        }
        cJSON_Delete(j);
        /* ctrain's own file keeps the scaling in its metadata (written only when set) */
        char own[128];
        snprintf(own, sizeof own, "%s/own.safetensors", out);
        CT_ASSERT(ct_model_save(m, own) == CT_OK);
        ct_st_file *of;
        CT_ASSERT(ct_st_open(own, &of) == CT_OK);
        CT_EXPECT((ct_st_metadata(of, "ctrain.rope_scaling_factor") != NULL) == (n != 0));
        ct_st_close(of);
        ct_model *c;
        CT_ASSERT(ct_model_open(own, &c) == CT_OK);
        CT_EXPECT(!memcmp(&ct_model_config_of(c)->llama.rope_scaling, &ct_model_config_of(m)->llama.rope_scaling, sizeof(ct_rope_scaling)));
        CT_EXPECTF(logits_err(c, &r) <= 1e-5, "%s: own file", names[n]);
        ct_model_free(c);
        ct_model_free(b);
        ct_model_free(m);
        ct_st_close(r.f);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (!keep) CT_EXPECT(system(cmd) == 0);
}

/* a weight_map naming a file outside the directory, or a tensor in no shard, is refused */
CT_TEST(bad_shard_index_refused) {
    char dir[] = "/tmp/ct_llama_idx_XXXXXX";
    CT_ASSERT(mkdtemp(dir));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp " FIX "sharded/* %s/", dir);
    CT_ASSERT(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "sed -i 's|\"model-00001-of-00005.safetensors\"|\"../model-00001-of-00005.safetensors\"|' %s/model.safetensors.index.json", dir);
    CT_ASSERT(system(cmd) == 0);
    ct_model *m;
    CT_EXPECT(ct_model_open(dir, &m) == CT_ERR_FORMAT && strstr(ct_last_error(), "no file name beside the index"));
    snprintf(cmd, sizeof cmd, "cp " FIX "sharded/model.safetensors.index.json %s/ && rm %s/model-00002-of-00005.safetensors", dir, dir);
    CT_ASSERT(system(cmd) == 0);
    CT_EXPECT(ct_model_open(dir, &m) == CT_ERR_NOT_FOUND);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CT_EXPECT(system(cmd) == 0);
}

CT_TEST_MAIN()
