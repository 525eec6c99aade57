/* The model API shared by the three built-in models: configs, creation, forward, loss. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "models/model_internal.h"

ct_model_config ct_model_default_config(ct_model_kind kind) {
    ct_model_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.mlp.in = 784;
    c.mlp.n_hidden = 2;
    c.mlp.hidden[0] = 1024;
    c.mlp.hidden[1] = 1024;
    c.mlp.out = 10;
    c.cnn.in_channels = 1;
    c.cnn.height = 28;
    c.cnn.width = 28;
    c.cnn.c1 = 32;
    c.cnn.c2 = 64;
    c.cnn.kernel = 5;
    c.cnn.fc = 128;
    c.cnn.classes = 10;
    c.gpt.n_layer = 6;
    c.gpt.n_embd = 256;
    c.gpt.n_head = 8;
    c.gpt.block_size = 256;
    c.gpt.vocab_size = 256;
    c.gpt.bias = true;
    return c;
}

const char *ct_model_kind_name(ct_model_kind k) {
    switch (k) {
    case CT_MODEL_MLP: return "mlp";
    case CT_MODEL_CNN: return "cnn";
    case CT_MODEL_GPT: return "gpt";
    }
    return "?";
}

ct_status ct_model_kind_parse(const char *s, ct_model_kind *out) {
    for (int k = CT_MODEL_MLP; k <= CT_MODEL_GPT; k++)
        if (s && !strcasecmp(s, ct_model_kind_name((ct_model_kind)k))) { *out = (ct_model_kind)k; return CT_OK; }
    return ct_error(CT_ERR_INVALID, "unknown model '%s' (expected mlp, cnn or gpt)", s ? s : "(null)");
}

#define SIZE_MAX_ (1 << 24) /* any single dimension; keeps every product inside int64 */
#define BAD(...) return ct_error(CT_ERR_INVALID, __VA_ARGS__)
static bool dim_ok(int v) { return v > 0 && v <= SIZE_MAX_; }
static bool p_ok(float p) { return p >= 0 && p < 1; } /* also rejects NaN */

ct_status ct_model_config_check(const ct_model_config *c) {
    if (!c) BAD("model config is NULL");
    switch (c->kind) {
    case CT_MODEL_MLP:
        if (!dim_ok(c->mlp.in)) BAD("mlp.in = %d must be in [1, %d]", c->mlp.in, SIZE_MAX_);
        if (!dim_ok(c->mlp.out)) BAD("mlp.out = %d must be in [1, %d]", c->mlp.out, SIZE_MAX_);
        if (c->mlp.n_hidden < 0 || c->mlp.n_hidden > CT_MLP_MAX_HIDDEN)
            BAD("mlp.n_hidden = %d must be in [0, %d]", c->mlp.n_hidden, CT_MLP_MAX_HIDDEN);
        for (int i = 0; i < c->mlp.n_hidden; i++)
            if (!dim_ok(c->mlp.hidden[i])) BAD("mlp.hidden[%d] = %d must be in [1, %d]", i, c->mlp.hidden[i], SIZE_MAX_);
        if (!p_ok(c->mlp.dropout)) BAD("mlp.dropout = %g must be in [0, 1)", (double)c->mlp.dropout);
        return CT_OK;
    case CT_MODEL_CNN:
        if (!dim_ok(c->cnn.in_channels)) BAD("cnn.in_channels = %d must be positive", c->cnn.in_channels);
        if (!dim_ok(c->cnn.height) || c->cnn.height % 4)
            BAD("cnn.height = %d must be a positive multiple of 4 (two 2x2 poolings)", c->cnn.height);
        if (!dim_ok(c->cnn.width) || c->cnn.width % 4)
            BAD("cnn.width = %d must be a positive multiple of 4 (two 2x2 poolings)", c->cnn.width);
        if (!dim_ok(c->cnn.c1) || !dim_ok(c->cnn.c2)) BAD("cnn.c1 = %d, cnn.c2 = %d must be positive", c->cnn.c1, c->cnn.c2);
        if (c->cnn.kernel <= 0 || c->cnn.kernel % 2 == 0 || c->cnn.kernel > 31)
            BAD("cnn.kernel = %d must be odd, in [1, 31] ('same' padding)", c->cnn.kernel);
        if (!dim_ok(c->cnn.fc)) BAD("cnn.fc = %d must be positive", c->cnn.fc);
        if (!dim_ok(c->cnn.classes)) BAD("cnn.classes = %d must be positive", c->cnn.classes);
        if ((double)c->cnn.c2 * (c->cnn.height / 4) * (c->cnn.width / 4) * c->cnn.fc > 4e9)
            BAD("cnn: first linear layer (%d x %lld) too large", c->cnn.fc, (long long)c->cnn.c2 * (c->cnn.height / 4) * (c->cnn.width / 4));
        if (!p_ok(c->cnn.dropout)) BAD("cnn.dropout = %g must be in [0, 1)", (double)c->cnn.dropout);
        return CT_OK;
    case CT_MODEL_GPT:
        if (c->gpt.n_layer <= 0 || c->gpt.n_layer > 1024) BAD("gpt.n_layer = %d must be in [1, 1024]", c->gpt.n_layer);
        if (!dim_ok(c->gpt.n_embd)) BAD("gpt.n_embd = %d must be positive", c->gpt.n_embd);
        if (c->gpt.n_head <= 0 || c->gpt.n_embd % c->gpt.n_head)
            BAD("gpt.n_embd = %d must be a multiple of gpt.n_head = %d", c->gpt.n_embd, c->gpt.n_head);
        if (!dim_ok(c->gpt.block_size)) BAD("gpt.block_size = %d must be positive", c->gpt.block_size);
        if (!dim_ok(c->gpt.vocab_size)) BAD("gpt.vocab_size = %d must be positive", c->gpt.vocab_size);
        if (!p_ok(c->gpt.dropout)) BAD("gpt.dropout = %g must be in [0, 1)", (double)c->gpt.dropout);
        if (12.0 * c->gpt.n_layer * c->gpt.n_embd * c->gpt.n_embd > 4e10) BAD("gpt: model too large");
        return CT_OK;
    }
    BAD("model kind %d unknown (expected CT_MODEL_MLP, CT_MODEL_CNN or CT_MODEL_GPT)", (int)c->kind);
}

static void fmt_count(char *buf, size_t n, int64_t v) { /* 1234567 -> "1,234,567" */
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%lld", (long long)v), o = 0;
    for (int i = 0; i < len && (size_t)o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
}

static void describe(ct_model *m) {
    const ct_model_config *c = &m->cfg;
    char cnt[32], arch[256];
    fmt_count(cnt, sizeof cnt, m->nparams);
    int o = 0;
    switch (c->kind) {
    case CT_MODEL_MLP:
        o = snprintf(arch, sizeof arch, "MLP(%d", c->mlp.in);
        for (int i = 0; i < c->mlp.n_hidden && o < (int)sizeof arch; i++) o += snprintf(arch + o, sizeof arch - (size_t)o, "-%d", c->mlp.hidden[i]);
        if (o < (int)sizeof arch) snprintf(arch + o, sizeof arch - (size_t)o, "-%d, dropout=%g)", c->mlp.out, (double)c->mlp.dropout);
        break;
    case CT_MODEL_CNN:
        snprintf(arch, sizeof arch, "CNN(%dx%dx%d, conv %d-%d k%d, fc %d, classes %d, dropout=%g)", c->cnn.in_channels, c->cnn.height,
                 c->cnn.width, c->cnn.c1, c->cnn.c2, c->cnn.kernel, c->cnn.fc, c->cnn.classes, (double)c->cnn.dropout);
        break;
    case CT_MODEL_GPT:
        snprintf(arch, sizeof arch, "GPT(n_layer=%d, n_embd=%d, n_head=%d, block_size=%d, vocab_size=%d, dropout=%g%s)",
                 c->gpt.n_layer, c->gpt.n_embd, c->gpt.n_head, c->gpt.block_size, c->gpt.vocab_size, (double)c->gpt.dropout,
                 c->gpt.bias ? "" : ", bias=False");
        break;
    }
    snprintf(m->desc, sizeof m->desc, "%s: %s parameters", arch, cnt);
}

ct_model *ct_model_create(const ct_model_config *cfg, uint64_t seed) {
    if (ct_model_config_check(cfg) != CT_OK) return NULL;
    ct_model *m = calloc(1, sizeof *m);
    if (!m) { ct_error(CT_ERR_NOMEM, "out of memory creating a model"); return NULL; }
    m->cfg = *cfg;
    m->P = ct_params_create();
    if (!m->P) { free(m); ct_error(CT_ERR_NOMEM, "out of memory creating a model"); return NULL; }
    switch (cfg->kind) {
    case CT_MODEL_MLP: ct_mlp_build_(m); break;
    case CT_MODEL_CNN: ct_cnn_build_(m); break;
    case CT_MODEL_GPT: ct_gpt_build_(m); break;
    }
    if (ct_params_finalize(m->P, seed) != CT_OK) { ct_model_free(m); return NULL; }
    for (int i = 0; i < ct_params_count(m->P); i++) {
        ct_tensor *t = ct_params_get(m->P, i);
        if (t->flags & CT_TF_PARAM) m->nparams += ct_numel(t);
    }
    describe(m);
    return m;
}

void ct_model_free(ct_model *m) {
    if (!m) return;
    ct_module_free(m->root);
    ct_params_free(m->P);
    free(m);
}

ct_params *ct_model_params(ct_model *m) { return m->P; }
const ct_model_config *ct_model_config_of(const ct_model *m) { return &m->cfg; }
ct_module *ct_model_module(ct_model *m) { return m->root; }
int64_t ct_model_num_params(const ct_model *m) { return m->nparams; }
const char *ct_model_describe(const ct_model *m) { return m->desc; }

ct_tensor *ct_model_forward(ct_ctx *ctx, ct_model *m, ct_tensor *x) {
    switch (m->cfg.kind) {
    case CT_MODEL_MLP: return ct_mlp_forward_(ctx, m, x);
    case CT_MODEL_CNN: return ct_cnn_forward_(ctx, m, x);
    case CT_MODEL_GPT: return ct_gpt_forward_(ctx, m, x);
    }
    CT_FATAL("ct_model_forward: bad model kind %d", (int)m->cfg.kind);
}

ct_tensor *ct_model_loss(ct_ctx *ctx, ct_model *m, ct_tensor *x, ct_tensor *target) {
    ct_tensor *logits = ct_model_forward(ctx, m, x);
    if (m->cfg.kind == CT_MODEL_GPT) {
        CT_CHECK(target->ndim == 2 && target->shape[0] == x->shape[0] && target->shape[1] == x->shape[1],
                 "GPT loss: target must be [B, T] = [%lld, %lld] like the input, got %d dims", (long long)x->shape[0],
                 (long long)x->shape[1], target->ndim);
        int64_t V = logits->shape[2], N = x->shape[0] * x->shape[1];
        return ct_cross_entropy(ctx, ct_reshape(ctx, logits, 2, (int64_t[]){N, V}), ct_reshape(ctx, target, 1, &N), -1);
    }
    return ct_cross_entropy(ctx, logits, target, -100);
}
