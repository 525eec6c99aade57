/* Llama as Hugging Face's LlamaForCausalLM (modeling_llama.py) computes it: token embedding,
 * num_hidden_layers pre-norm layers x = x + attn(rms(x)); x = x + mlp(rms(x)), final RMSNorm,
 * LM head (tied to the embedding or its own). Attention: q, k, v projections without biases,
 * rotary positions (rotate_half, rope_theta) on q and k, grouped-query heads (each key/value
 * head serves num_attention_heads / num_key_value_heads query heads), causal softmax
 * attention, o_proj. MLP: down(silu(gate(x)) * up(x)). Names are its state_dict's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/kv_cache.h"

/* model.layers.<l> by part */
typedef struct llama_layer {
    ct_module *mod, *input_layernorm, *post_attention_layernorm;
    ct_module *attn, *q_proj, *k_proj, *v_proj, *o_proj;
    ct_module *mlp, *gate_proj, *up_proj, *down_proj;
    const struct ct_llama *g;
} llama_layer;

/* the root module's priv (freed with it) */
typedef struct ct_llama {
    ct_module *embed, *norm, *lm_head;
    int n_layer, n_head, n_kv;
    float rope_theta;
    ct_rope_scaling rope_scaling;
    int64_t context;
    bool flash, checkpoint;
    llama_layer layers[]; /* [n_layer] */
} ct_llama;

static void llama_defaults(ct_model_config *c) {
    /* a small model, as the GPT's defaults (LlamaConfig's own are Llama-2-7B's) */
    c->llama.vocab_size = 256;
    c->llama.hidden_size = 256;
    c->llama.intermediate_size = 688;
    c->llama.num_hidden_layers = 6;
    c->llama.num_attention_heads = 8;
    c->llama.num_key_value_heads = 8;
    c->llama.max_position_embeddings = 256;
    c->llama.rms_norm_eps = 1e-6f;
    c->llama.rope_theta = 10000.0f;
    c->llama.tie_word_embeddings = false;
    c->llama.flash_attention = true;
}

static ct_status llama_check(const ct_model_config *c) {
    const int L = c->llama.num_hidden_layers, C = c->llama.hidden_size, H = c->llama.num_attention_heads,
              KV = c->llama.num_key_value_heads;
    if (L <= 0 || L > 1024) CT_MODEL_BAD("llama.num_hidden_layers = %d must be in [1, 1024]", L);
    if (!ct_model_dim_ok_(C)) CT_MODEL_BAD("llama.hidden_size = %d must be positive", C);
    if (!ct_model_dim_ok_(c->llama.intermediate_size))
        CT_MODEL_BAD("llama.intermediate_size = %d must be positive", c->llama.intermediate_size);
    if (H <= 0 || C % H) CT_MODEL_BAD("llama.hidden_size = %d must be a multiple of llama.num_attention_heads = %d", C, H);
    if ((C / H) % 2) CT_MODEL_BAD("llama: the head size hidden_size / num_attention_heads = %d must be even (rotary pairs)", C / H);
    if (KV <= 0 || H % KV)
        CT_MODEL_BAD("llama.num_attention_heads = %d must be a multiple of llama.num_key_value_heads = %d", H, KV);
    if (!ct_model_dim_ok_(c->llama.max_position_embeddings))
        CT_MODEL_BAD("llama.max_position_embeddings = %d must be positive", c->llama.max_position_embeddings);
    if (!ct_model_dim_ok_(c->llama.vocab_size)) CT_MODEL_BAD("llama.vocab_size = %d must be positive", c->llama.vocab_size);
    if (!(c->llama.rms_norm_eps > 0 && c->llama.rms_norm_eps < 1))
        CT_MODEL_BAD("llama.rms_norm_eps = %g must be in (0, 1)", (double)c->llama.rms_norm_eps);
    if (!(c->llama.rope_theta >= 1 && c->llama.rope_theta <= 1e9f))
        CT_MODEL_BAD("llama.rope_theta = %g must be in [1, 1e9]", (double)c->llama.rope_theta);
    const ct_rope_scaling *rs = &c->llama.rope_scaling;
    if (rs->factor != 0 && !(rs->factor >= 1 && rs->factor <= 1e6f && rs->low_freq_factor > 0 &&
                             rs->high_freq_factor > rs->low_freq_factor && rs->original_max_position_embeddings > 0))
        CT_MODEL_BAD("llama.rope_scaling: factor %g (>= 1), low_freq_factor %g (> 0), high_freq_factor %g (> low), "
                     "original_max_position_embeddings %d (> 0)",
                     (double)rs->factor, (double)rs->low_freq_factor, (double)rs->high_freq_factor, rs->original_max_position_embeddings);
    if ((4.0 * C + 3.0 * c->llama.intermediate_size) * C * L > 4e10) CT_MODEL_BAD("llama: model too large");
    return CT_OK;
}

static void llama_describe(const ct_model_config *c, char *arch, size_t n) {
    snprintf(arch, n,
             "Llama(num_hidden_layers=%d, hidden_size=%d, num_attention_heads=%d, num_key_value_heads=%d, "
             "intermediate_size=%d, max_position_embeddings=%d, vocab_size=%d%s)",
             c->llama.num_hidden_layers, c->llama.hidden_size, c->llama.num_attention_heads, c->llama.num_key_value_heads,
             c->llama.intermediate_size, c->llama.max_position_embeddings, c->llama.vocab_size,
             c->llama.tie_word_embeddings ? ", tie_word_embeddings=True" : "");
}

/* LlamaRMSNorm: w = its weight [C], fp[0] = eps. Each feeds only linears (the q/k/v, gate/up
 * projections, the LM head), so under autocast on a device it gives them their 16-bit input
 * itself (ct_rms_norm_lowp: the bits of autocast's cast of its f32 output) */
static ct_tensor *rms_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return ct_rms_norm_lowp(ctx, x, m->w, m->fp[0]); }
static int rms_repr(const ct_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "LlamaRMSNorm((%lld,), eps=%g)", (long long)m->hp[0], (double)m->fp[0]);
}
static const ct_module_ops rms_ops = {"LlamaRMSNorm", rms_fw, NULL, rms_repr};
static ct_module *rms_norm(ct_params *P, const char *name, int64_t C, float eps) {
    ct_module *m = ct_module_new(&rms_ops, name);
    char w[CT_NN_NAME_MAX + 16];
    if (!m) return NULL;
    m->w = ct_param(P, ct_nn_join(w, sizeof w, name, "weight"), 1, &C, CT_INIT_ONES, 0);
    m->hp[0] = C;
    m->fp[0] = eps;
    return m;
}

/* LlamaAttention (priv: its layer): x [B, T, C] → [B, T, C] */
static ct_tensor *attn_run(ct_ctx *ctx, const llama_layer *l, ct_tensor *x) {
    const ct_llama *g = l->g;
    ct_tensor *q = ct_split_heads(ctx, ct_module_forward(ctx, l->q_proj, x), g->n_head);  /* [B, H, T, D] */
    ct_tensor *k = ct_split_heads(ctx, ct_module_forward(ctx, l->k_proj, x), g->n_kv);    /* [B, KV, T, D] */
    ct_tensor *v = ct_split_heads(ctx, ct_module_forward(ctx, l->v_proj, x), g->n_kv);
    q = ct_rope_scaled(ctx, q, NULL, g->rope_theta, &g->rope_scaling);
    k = ct_rope_scaled(ctx, k, NULL, g->rope_theta, &g->rope_scaling);
    /* grouped-query attention: the fused op (CPU and device) takes k, v with their KV heads;
     * the plain op takes copies per query head (repeat_kv) */
    if (!g->flash) {
        k = ct_repeat_kv(ctx, k, g->n_head / g->n_kv);
        v = ct_repeat_kv(ctx, v, g->n_head / g->n_kv);
    }
    ct_tensor *y = g->flash ? ct_flash_attention(ctx, q, k, v, true) : ct_attention(ctx, q, k, v, true);
    return ct_module_forward(ctx, l->o_proj, ct_merge_heads(ctx, y));
}
static ct_tensor *attn_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return attn_run(ctx, m->priv, x); }
static const ct_module_ops attn_ops = {"LlamaAttention", attn_fw, NULL, NULL};

/* LlamaMLP (priv: its layer): down(silu(gate(x)) * up(x)) */
static ct_tensor *mlp_run(ct_ctx *ctx, const llama_layer *l, ct_tensor *x) {
    ct_tensor *h = ct_mul(ctx, ct_silu(ctx, ct_module_forward(ctx, l->gate_proj, x)), ct_module_forward(ctx, l->up_proj, x));
    return ct_module_forward(ctx, l->down_proj, h);
}
static ct_tensor *mlp_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return mlp_run(ctx, m->priv, x); }
static const ct_module_ops mlp_ops = {"LlamaMLP", mlp_fw, NULL, NULL};

/* LlamaDecoderLayer (priv: its layer) */
static ct_tensor *layer_run(ct_ctx *ctx, ct_tensor *x, void *arg) {
    const llama_layer *l = arg;
    x = ct_add(ctx, x, attn_run(ctx, l, ct_module_forward(ctx, l->input_layernorm, x)));
    return ct_add(ctx, x, mlp_run(ctx, l, ct_module_forward(ctx, l->post_attention_layernorm, x)));
}
static ct_tensor *layer_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return layer_run(ctx, x, m->priv); }
static const ct_module_ops layer_ops = {"LlamaDecoderLayer", layer_fw, NULL, NULL};

/* LlamaForCausalLM (priv: its ct_llama): tokens [B, T] → logits [B, T, vocab] */
static ct_tensor *llama_fw(ct_ctx *ctx, ct_module *m, ct_tensor *idx) {
    ct_llama *g = m->priv;
    CT_CHECK(idx->ndim == 2 && (idx->dtype == CT_I32 || idx->dtype == CT_I64),
             "Llama: expected [B, T] i32/i64 tokens, got %d dims of %s", idx->ndim, ct_dtype_name(idx->dtype));
    int64_t T = idx->shape[1];
    CT_CHECK(T >= 1 && T <= g->context, "Llama: sequence length %lld outside [1, max_position_embeddings=%lld]", (long long)T,
             (long long)g->context);
    ct_tensor *x = ct_module_forward(ctx, g->embed, idx); /* [B, T, C] */
    for (int l = 0; l < g->n_layer; l++)
        x = g->checkpoint ? ct_checkpoint(ctx, layer_run, &g->layers[l], x) : ct_module_forward(ctx, g->layers[l].mod, x);
    return ct_module_forward(ctx, g->lm_head, ct_module_forward(ctx, g->norm, x));
}
static void llama_destroy(ct_module *m) { free(m->priv); }
static const ct_module_ops llama_ops = {"LlamaForCausalLM", llama_fw, llama_destroy, NULL};

static ct_module *linear(ct_params *P, const char *prefix, const char *leaf, int64_t in, int64_t out) {
    char nm[CT_NN_NAME_MAX + 32];
    return ct_nn_linear_ex(P, ct_nn_join(nm, sizeof nm, prefix, leaf), in, out, false, CT_INIT_NORMAL, 0.02, CT_INIT_ZEROS, 0);
}

/* Children in LlamaForCausalLM's order (its state_dict's): embed_tokens, layers (self_attn,
 * mlp, input_layernorm, post_attention_layernorm), norm, lm_head. NULL children (out of
 * memory) are left to ct_model_create. */
static void llama_build(ct_model *m) {
    const ct_model_config *c = &m->cfg;
    int64_t C = c->llama.hidden_size, I = c->llama.intermediate_size, V = c->llama.vocab_size;
    int64_t D = C / c->llama.num_attention_heads, KVC = D * c->llama.num_key_value_heads;
    float eps = c->llama.rms_norm_eps;
    char nm[CT_NN_NAME_MAX], sub[CT_NN_NAME_MAX + 32];

    ct_module *root = ct_module_new(&llama_ops, "");
    ct_llama *g = root ? calloc(1, sizeof *g + (size_t)c->llama.num_hidden_layers * sizeof g->layers[0]) : NULL;
    if (!g) {
        if (root) ct_error(CT_ERR_NOMEM, "out of memory creating a Llama");
        ct_module_free(root);
        m->root = NULL;
        return;
    }
    root->priv = g;
    g->n_layer = c->llama.num_hidden_layers;
    g->n_head = c->llama.num_attention_heads;
    g->n_kv = c->llama.num_key_value_heads;
    g->rope_theta = c->llama.rope_theta;
    g->rope_scaling = c->llama.rope_scaling;
    g->context = c->llama.max_position_embeddings;
    g->flash = c->llama.flash_attention;
    g->checkpoint = c->llama.checkpoint_activations;
    g->embed = ct_module_add_child(root, ct_nn_embedding_ex(m->P, "model.embed_tokens", V, C, CT_INIT_NORMAL, 0.02));
    for (int i = 0; i < g->n_layer; i++) {
        llama_layer *l = &g->layers[i];
        l->g = g;
        snprintf(nm, sizeof nm, "model.layers.%d", i);
        l->mod = ct_module_add_child(root, ct_module_new(&layer_ops, nm));
        if (l->mod) l->mod->priv = l;
        l->attn = ct_module_add_child(l->mod, ct_module_new(&attn_ops, ct_nn_join(sub, sizeof sub, nm, "self_attn")));
        if (l->attn) l->attn->priv = l;
        l->q_proj = ct_module_add_child(l->attn, linear(m->P, sub, "q_proj", C, C));
        l->k_proj = ct_module_add_child(l->attn, linear(m->P, sub, "k_proj", C, KVC));
        l->v_proj = ct_module_add_child(l->attn, linear(m->P, sub, "v_proj", C, KVC));
        l->o_proj = ct_module_add_child(l->attn, linear(m->P, sub, "o_proj", C, C));
        l->mlp = ct_module_add_child(l->mod, ct_module_new(&mlp_ops, ct_nn_join(sub, sizeof sub, nm, "mlp")));
        if (l->mlp) l->mlp->priv = l;
        l->gate_proj = ct_module_add_child(l->mlp, linear(m->P, sub, "gate_proj", C, I));
        l->up_proj = ct_module_add_child(l->mlp, linear(m->P, sub, "up_proj", C, I));
        l->down_proj = ct_module_add_child(l->mlp, linear(m->P, sub, "down_proj", I, C));
        l->input_layernorm = ct_module_add_child(l->mod, rms_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "input_layernorm"), C, eps));
        l->post_attention_layernorm =
            ct_module_add_child(l->mod, rms_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "post_attention_layernorm"), C, eps));
    }
    g->norm = ct_module_add_child(root, rms_norm(m->P, "model.norm", C, eps));
    if (c->llama.tie_word_embeddings) {
        m->tied = g->embed ? g->embed->w : NULL;
        g->lm_head = ct_module_add_child(root, m->tied ? ct_nn_linear_tied("lm_head", m->tied, NULL) : NULL);
    } else {
        g->lm_head = ct_module_add_child(root, linear(m->P, "", "lm_head", C, V));
    }
    m->root = root;
}

/* ---- generation (decode.c): the cache keeps num_key_value_heads heads a layer ---- */
static void llama_kv_shape(const ct_model_config *c, int *layers, int *kv_heads, int *head_dim) {
    *layers = c->llama.num_hidden_layers;
    *kv_heads = c->llama.num_key_value_heads;
    *head_dim = c->llama.hidden_size / c->llama.num_attention_heads;
}

/* the layers as layer_run computes them, for the new rows only: q and k rotated at their
 * absolute positions, k and v appended to the cache, attention against it */
static ct_tensor *llama_forward_cached(ct_ctx *ctx, ct_model *m, struct ct_kv_cache *c, ct_tensor *tokens) {
    const ct_llama *g = m->root->priv;
    int64_t t = tokens->shape[1], C = m->cfg.llama.hidden_size, KVC = (int64_t)c->H * c->D;
    ct_tensor *pos = ct_new(ctx, CT_I32, 1, &t);
    for (int64_t i = 0; i < t; i++) ((int32_t *)pos->data)[i] = (int32_t)(c->len + i);
    ct_tensor *x = ct_module_forward(ctx, g->embed, tokens);
    float *scores = ct_ctx_alloc(ctx, sizeof(float) * (size_t)g->n_head * (size_t)t * (size_t)(c->len + t));
    for (int i = 0; i < g->n_layer; i++) {
        const llama_layer *l = &g->layers[i];
        ct_tensor *h = ct_module_forward(ctx, l->input_layernorm, x);
        ct_tensor *q = ct_rope_scaled(ctx, ct_split_heads(ctx, ct_module_forward(ctx, l->q_proj, h), g->n_head), pos, g->rope_theta,
                                      &g->rope_scaling);
        ct_tensor *k = ct_rope_scaled(ctx, ct_split_heads(ctx, ct_module_forward(ctx, l->k_proj, h), g->n_kv), pos, g->rope_theta,
                                      &g->rope_scaling);
        q = ct_merge_heads(ctx, q); /* [1, t, C]: rows as the cache takes them */
        k = ct_merge_heads(ctx, k);
        ct_tensor *v = ct_module_forward(ctx, l->v_proj, h), *y = ct_new(ctx, CT_F32, 3, (int64_t[]){1, t, C});
        ct_kv_attend_(c, i, q->data, (int)C, g->n_head, k->data, v->data, (int)KVC, y->data, (int)t, scores);
        x = ct_add(ctx, x, ct_module_forward(ctx, l->o_proj, y));
        x = ct_add(ctx, x, mlp_run(ctx, l, ct_module_forward(ctx, l->post_attention_layernorm, x)));
    }
    c->len += (int)t;
    return ct_module_forward(ctx, g->lm_head, ct_module_forward(ctx, g->norm, x));
}

static ct_tensor *llama_forward(ct_ctx *ctx, ct_model *m, ct_tensor *idx) { return ct_module_forward(ctx, m->root, idx); }

/* next-token cross-entropy over all B*T positions (targets already shifted); -100 ignored
 * (Hugging Face's) */
static ct_tensor *llama_loss(ct_ctx *ctx, ct_model *m, ct_tensor *x, ct_tensor *target) {
    return ct_model_token_loss_(ctx, "Llama", llama_forward(ctx, m, x), x, target, -100);
}

static void llama_batch(const ct_model_config *c, ct_model_batch *b) {
    b->classes = b->vocab = c->llama.vocab_size;
    b->ignore_index = -100;
    b->x_ndim = 1;
    b->x_max_len = c->llama.max_position_embeddings;
}

/* ctrain train's defaults are a small model that trains in minutes on a CPU */
#define O_(n, fl, lo, hi) CT_MODEL_OPT_(llama.n, #n, 'i', CT_OPT_META | CT_OPT_FLAG | (fl), lo, hi)
static const ct_model_option llama_options[] = {
    {O_(num_hidden_layers, 0, 1, 256), .cli_default = "4", .help = "decoder layers"},
    {O_(hidden_size, 0, 2, 65536), .cli_default = "128", .help = "width"},
    {O_(intermediate_size, 0, 1, 262144), .cli_default = "352", .help = "MLP width"},
    {O_(num_attention_heads, 0, 1, 1024), .cli_default = "4", .help = "query heads (dividing --hidden-size)"},
    {O_(num_key_value_heads, 0, 1, 1024), .cli_default = "2", .help = "key/value heads (dividing --num-attention-heads)"},
    {O_(max_position_embeddings, CT_OPT_CONTEXT, 1, 1 << 20), .cli_default = "64",
     .help = "context length (with --init-from: a shorter training context)"},
    {O_(vocab_size, 0, 2, 1 << 20), .cli_default = "256", .help = "vocabulary (256: bytes)"},
    {CT_MODEL_OPT_(llama.rms_norm_eps, "rms_norm_eps", 'f', CT_OPT_META, 0, 1)},
    {CT_MODEL_OPT_(llama.rope_theta, "rope_theta", 'f', CT_OPT_META, 1, 1e9)},
    /* rope_scaling "llama3" (0: none) */
    {CT_MODEL_OPT_(llama.rope_scaling.factor, "rope_scaling_factor", 'f', CT_OPT_META | CT_OPT_META_SET, 0, 1e6)},
    {CT_MODEL_OPT_(llama.rope_scaling.low_freq_factor, "rope_scaling_low_freq_factor", 'f', CT_OPT_META | CT_OPT_META_SET, 0, 1e6)},
    {CT_MODEL_OPT_(llama.rope_scaling.high_freq_factor, "rope_scaling_high_freq_factor", 'f', CT_OPT_META | CT_OPT_META_SET, 0, 1e6)},
    {CT_MODEL_OPT_(llama.rope_scaling.original_max_position_embeddings, "rope_scaling_original_max_position_embeddings", 'i',
                   CT_OPT_META | CT_OPT_META_SET, 0, 1 << 30)},
    {CT_MODEL_OPT_(llama.tie_word_embeddings, "tie_word_embeddings", 'b', CT_OPT_META | CT_OPT_FLAG, 0, 1),
     .help = "the LM head is the token embedding"},
    {CT_MODEL_OPT_(llama.flash_attention, "flash_attention", 'b', CT_OPT_FLAG | CT_OPT_RUN, 0, 1), .flag = "--attention",
     .words = "plain|flash", .help = "flash: fused, O(T) memory (the default); plain keeps the [T, T] matrix"},
    {CT_MODEL_OPT_(llama.checkpoint_activations, "checkpoint_activations", 'b', CT_OPT_FLAG | CT_OPT_RUN, 0, 1),
     .help = "recompute each layer in backward (less memory)"},
};
#undef O_

const ct_model_kind_ops ct_llama_kind_ = {
    .info = {.name = "llama", .data = CT_MODEL_DATA_TOKENS, .optimizer = "adamw", .adam_beta2 = 0.95, .eval_each_epoch = false,
             .hf = true, .generates = true, .options = llama_options, .noptions = CT_MODEL_NOPTS_(llama_options)},
    .defaults = llama_defaults, .check = llama_check, .batch = llama_batch, .build = llama_build, .describe = llama_describe,
    .forward = llama_forward, .loss = llama_loss,
    /* a tied head is also saved (and accepted) as lm_head.weight, as LlamaForCausalLM's state_dict lists it */
    .tied_name = "lm_head.weight", .load_ignores = ct_llama_load_ignores_,
    /* ctrain's names are LlamaForCausalLM's: its files load as ctrain's own (llama_hf.c) */
    .from_tensors = ct_llama_config_from_tensors_, .hf_load = ct_model_load, .hf_save = ct_llama_save_hf_,
    .kv_shape = llama_kv_shape, .forward_cached = llama_forward_cached,
};
