/* The GPT's forward through the key/value cache (decode.c has the cache and the generation
 * loop), and the GPT's names for them (ct_gpt_*, kept for the programs that use them).
 *
 * Positions are absolute (learned wpe), so once the sequence is longer than block_size the
 * window slides and every cached key changes (decode.c). */
#include <string.h>

#include "models/gpt_internal.h"
#include "models/kv_cache.h"

ct_status ct_gpt_cache_create(const ct_model *m, ct_gpt_cache **out) {
    *out = NULL;
    if (m->cfg.kind != CT_MODEL_GPT) return ct_error(CT_ERR_INVALID, "KV cache: the model is a %s, not a GPT", m->kind->info.name);
    return ct_model_cache_create(m, out);
}

void ct_gpt_cache_free(ct_gpt_cache *c) { ct_kv_cache_free(c); }
void ct_gpt_cache_reset(ct_gpt_cache *c) { ct_kv_cache_reset(c); }
int ct_gpt_cache_len(const ct_gpt_cache *c) { return ct_kv_cache_len(c); }

void ct_gpt_kv_shape_(const ct_model_config *c, int *layers, int *kv_heads, int *head_dim) {
    *layers = c->gpt.n_layer;
    *kv_heads = c->gpt.n_head;
    *head_dim = c->gpt.n_embd / c->gpt.n_head;
}

ct_tensor *ct_gpt_forward_cached_(ct_ctx *ctx, ct_model *m, ct_kv_cache *c, ct_tensor *tokens) {
    int64_t t = tokens->shape[1];
    const ct_gpt *g = ct_gpt_of_(m);
    int64_t C = m->cfg.gpt.n_embd;
    ct_tensor *pos = ct_new(ctx, CT_I32, 1, &t);
    for (int64_t i = 0; i < t; i++) ((int32_t *)pos->data)[i] = (int32_t)(c->len + i);
    ct_tensor *x = ct_add(ctx, ct_embedding(ctx, g->wte->w, tokens), ct_embedding(ctx, g->wpe->w, pos));
    float *scores = ct_ctx_alloc(ctx, sizeof(float) * (size_t)c->H * (size_t)t * (size_t)(c->len + t));
    for (int l = 0; l < c->L; l++) {
        const ct_gpt_block *b = &g->h[l];
        /* projections through their modules: a quantized model's int8 Linears are used too */
        ct_tensor *qkv = ct_module_forward(ctx, b->attn.c_attn, ct_module_forward(ctx, b->ln_1, x));
        ct_tensor *y = ct_new(ctx, CT_F32, 3, (int64_t[]){1, t, C});
        const float *q = qkv->data; /* [t, 3C]: q, k, v side by side */
        ct_kv_attend_(c, l, q, (int)(3 * C), c->H, q + C, q + 2 * C, (int)(3 * C), y->data, (int)t, scores);
        x = ct_add(ctx, x, ct_module_forward(ctx, b->attn.c_proj, y));
        x = ct_add(ctx, x, ct_module_forward(ctx, b->mlp.mod, ct_module_forward(ctx, b->ln_2, x)));
    }
    x = ct_module_forward(ctx, g->ln_f, x);
    c->len += (int)t;
    return ct_module_forward(ctx, g->lm_head, x); /* tied to wte */
}

ct_tensor *ct_gpt_forward_cached(ct_ctx *ctx, ct_model *m, ct_gpt_cache *c, ct_tensor *tokens) {
    CT_CHECK(m->cfg.kind == CT_MODEL_GPT, "ct_gpt_forward_cached: the model is a %s, not a GPT", m->kind->info.name);
    return ct_model_forward_cached(ctx, m, c, tokens);
}

ct_status ct_gpt_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_generate_opts *opts, int32_t *out,
                          ct_generate_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (m->cfg.kind != CT_MODEL_GPT) return ct_error(CT_ERR_INVALID, "the model is a %s, not a GPT: it cannot generate", m->kind->info.name);
    return ct_model_generate(m, prompt, n_prompt, opts, out, stats);
}
