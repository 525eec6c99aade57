/* GPT-2 as nanoGPT writes it (model.py): token + learned position embeddings, dropout,
 * n_layer pre-LN blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), final LayerNorm,
 * LM head tied to wte. Names follow nanoGPT's state_dict ("transformer.h.0.attn.c_attn.weight"). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt_internal.h"

static void gpt_defaults(ct_model_config *c) {
    c->gpt.n_layer = 6;
    c->gpt.n_embd = 256;
    c->gpt.n_head = 8;
    c->gpt.block_size = 256;
    c->gpt.vocab_size = 256;
    c->gpt.bias = true;
    c->gpt.gelu_tanh = false;
    c->gpt.ln_eps = 1e-5f;
    c->gpt.flash_attention = true; /* fused: O(T) memory and faster at every context (docs/bench/gpt.md) */
}

static ct_status gpt_check(const ct_model_config *c) {
    if (c->gpt.n_layer <= 0 || c->gpt.n_layer > 1024) CT_MODEL_BAD("gpt.n_layer = %d must be in [1, 1024]", c->gpt.n_layer);
    if (!ct_model_dim_ok_(c->gpt.n_embd)) CT_MODEL_BAD("gpt.n_embd = %d must be positive", c->gpt.n_embd);
    if (c->gpt.n_head <= 0 || c->gpt.n_embd % c->gpt.n_head)
        CT_MODEL_BAD("gpt.n_embd = %d must be a multiple of gpt.n_head = %d", c->gpt.n_embd, c->gpt.n_head);
    if (!ct_model_dim_ok_(c->gpt.block_size)) CT_MODEL_BAD("gpt.block_size = %d must be positive", c->gpt.block_size);
    if (!ct_model_dim_ok_(c->gpt.vocab_size)) CT_MODEL_BAD("gpt.vocab_size = %d must be positive", c->gpt.vocab_size);
    if (!ct_model_p_ok_(c->gpt.dropout)) CT_MODEL_BAD("gpt.dropout = %g must be in [0, 1)", (double)c->gpt.dropout);
    if (!ct_model_p_ok_(c->gpt.ln_eps)) CT_MODEL_BAD("gpt.ln_eps = %g must be in [0, 1) (0: 1e-5)", (double)c->gpt.ln_eps);
    if (12.0 * c->gpt.n_layer * c->gpt.n_embd * c->gpt.n_embd > 4e10) CT_MODEL_BAD("gpt: model too large");
    return CT_OK;
}

static void gpt_describe(const ct_model_config *c, char *arch, size_t n) {
    char eps[48] = "";
    if (c->gpt.ln_eps > 0 && c->gpt.ln_eps != 1e-5f) snprintf(eps, sizeof eps, ", ln_eps=%g", (double)c->gpt.ln_eps);
    snprintf(arch, n, "GPT(n_layer=%d, n_embd=%d, n_head=%d, block_size=%d, vocab_size=%d, dropout=%g%s%s%s)", c->gpt.n_layer,
             c->gpt.n_embd, c->gpt.n_head, c->gpt.block_size, c->gpt.vocab_size, (double)c->gpt.dropout,
             c->gpt.bias ? "" : ", bias=False", c->gpt.gelu_tanh ? ", gelu=tanh" : "", eps);
}

/* MLP (a block's mlp: priv is its block): c_fc (C → 4C), GELU (hp[0]: tanh approximation),
 * c_proj (4C → C), dropout (fp[0]). unread: c_proj's output values are never read (see block_segment) */
static ct_tensor *mlp_run(ct_ctx *ctx, const ct_gpt_block *b, ct_tensor *x, bool unread) {
    const ct_module *m = b->mlp.mod;
    ct_module *proj = b->mlp.c_proj;
    ct_tensor *h = ct_gelu(ctx, ct_module_forward(ctx, b->mlp.c_fc, x), m->hp[0] != 0);
    h = unread ? ct_linear_unevaluated(ctx, h, proj->w, proj->b) : ct_module_forward(ctx, proj, h);
    return m->fp[0] > 0 ? ct_dropout(ctx, h, m->fp[0]) : h;
}
static ct_tensor *mlp_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return mlp_run(ctx, m->priv, x, false); }
static const ct_module_ops mlp_ops = {"MLP", mlp_fw, NULL, NULL};

/* Block (priv: its ct_gpt_block) */
static ct_tensor *block_run(ct_ctx *ctx, const ct_gpt_block *b, ct_tensor *x, bool unread) {
    x = ct_add(ctx, x, ct_module_forward(ctx, b->attn.mod, ct_module_forward(ctx, b->ln_1, x)));
    return ct_add(ctx, x, mlp_run(ctx, b, ct_module_forward(ctx, b->ln_2, x), unread));
}
static ct_tensor *block_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return block_run(ctx, m->priv, x, false); }
static const ct_module_ops block_ops = {"Block", block_fw, NULL, NULL};

/* A block as a checkpointed segment. On the recompute nothing reads the block's output, and
 * the MLP's c_proj output reaches it only through dropout and the residual add, whose
 * gradients read no values: c_proj records its node without its GEMM (a third of the
 * block's forward FLOPs at width 256, context 256). Gradients are the same bits. */
static ct_tensor *block_segment(ct_ctx *ctx, ct_tensor *x, void *arg) {
    const ct_gpt_block *b = arg;
    bool linear = !strcmp(ct_module_type(b->mlp.c_proj), "Linear"); /* not a quantized one */
    const ct_tensor *u = ct_module_first_param(b->mod); /* one unit, as ct_module_forward brackets it */
    ct_unit_enter(ctx, u);
    ct_tensor *y = block_run(ctx, b, x, linear && ct_checkpoint_recomputing(ctx));
    ct_unit_leave(ctx, u);
    return y;
}

/* The device constants of g on dev: block_size positions (i32), then at consts_bias(V) the
 * padded head's bias (0 on the V columns, -inf on the padding to a multiple of 64). Made once
 * per device (a model moved to another device makes them again); NULL when they cannot be
 * made, and the step then builds them on the host as before. */
static size_t consts_bias(const ct_gpt *g) { return ((size_t)g->block_size * 4 + 63) / 64 * 64; }
static const char *consts_on(ct_gpt *g, ct_device dev, int64_t V) {
    if (g->consts && ct_device_eq(g->consts_dev, dev)) return g->consts;
    if (g->consts) ct_device_free(g->consts_dev, g->consts);
    g->consts = NULL;
    const int64_t Vp = (V + 63) / 64 * 64;
    const size_t off = consts_bias(g), bytes = off + (size_t)Vp * sizeof(float);
    char *h = malloc(bytes);
    void *d = NULL;
    if (h && ct_device_alloc(dev, bytes, &d) == CT_OK) {
        for (int64_t t = 0; t < g->block_size; t++) ((int32_t *)h)[t] = (int32_t)t;
        for (int64_t i = 0; i < Vp; i++) ((float *)(h + off))[i] = i < V ? 0.0f : -INFINITY;
        if (ct_device_copy(dev, d, h, bytes, true) == CT_OK) g->consts = d, g->consts_dev = dev;
        else ct_device_free(dev, d);
    }
    free(h);
    return g->consts;
}
/* a tensor over device memory of the model's (not the step's) */
static ct_tensor *dev_view(ct_ctx *ctx, ct_dtype dt, const void *p, int64_t n, ct_device dev) {
    ct_tensor *t = ct_wrap(ctx, dt, (void *)p, 1, &n);
    t->device = dev;
    return t;
}

/* The loss's LM head on a GPU when the vocabulary is not a multiple of 64 (GPT-2's 50,257):
 * the logits over wte padded with zero rows to the next multiple of 64, plus a bias of -inf
 * on the padding's columns, so that every logits row starts 16-byte aligned and cuBLASLt can
 * take its Hopper kernels (with 50,257 columns it only had 2-byte-aligned fallbacks: the LM
 * head's three GEMMs took 15.5 ms of GPT-2 small's 75 ms step on an H200, 2026-12-04). The
 * padding's logits are -inf, so the softmax and the loss are those of the V columns, and
 * their gradient is 0: wte's gradient is the unpadded head's (as llm.c pads its vocabulary). */
static ct_tensor *padded_head(ct_ctx *ctx, ct_gpt *g, ct_tensor *wte, ct_tensor *x) {
    const int64_t V = wte->shape[0], Vp = (V + 63) / 64 * 64;
    const char *c = consts_on(g, wte->device, V);
    ct_tensor *bd = c ? dev_view(ctx, CT_F32, c + consts_bias(g), Vp, wte->device) : NULL;
    if (!bd) {
        ct_tensor *bias = ct_new(ctx, CT_F32, 1, &Vp);
        for (int64_t i = 0; i < Vp; i++) ct_f32(bias)[i] = i < V ? 0.0f : -INFINITY;
        /* (a failed copy leaves the bias on the CPU, and the linear then fails the step naming it) */
        if (ct_tensor_to(ctx, bias, wte->device, &bd) != CT_OK) bd = bias;
    }
    /* under autocast, its cast of the weight first: the padding then copies 2-byte values */
    const ct_dtype ad = ct_autocast_dtype(ctx);
    ct_tensor *w = ad != CT_F32 ? ct_cast(ctx, wte, ad) : wte;
    return ct_linear(ctx, x, ct_pad_rows(ctx, w, Vp - V), bd);
}
static bool gpt_pads_head(const ct_gpt *g) {
    const ct_tensor *w = g->wte->w;
    return w->device.type == CT_DEV_CUDA && w->shape[0] % 64 != 0 && !strcmp(ct_module_type(g->lm_head), "Linear");
}

/* GPT (priv: its ct_gpt): children wte, wpe, h.0 .. h.{L-1}, ln_f, lm_head */
static ct_tensor *gpt_fw(ct_ctx *ctx, ct_module *m, ct_tensor *idx) {
    ct_gpt *g = m->priv;
    CT_CHECK(idx->ndim == 2 && (idx->dtype == CT_I32 || idx->dtype == CT_I64),
             "GPT: expected [B, T] i32/i64 tokens, got %d dims of %s", idx->ndim, ct_dtype_name(idx->dtype));
    int64_t T = idx->shape[1];
    CT_CHECK(T >= 1 && T <= g->block_size, "GPT: sequence length %lld outside [1, block_size=%lld]", (long long)T,
             (long long)g->block_size);
    ct_tensor *wte = g->wte->w, *wpe = g->wpe->w;
    /* on a GPU the positions are the model's, already there */
    const char *c = wpe->device.type != CT_DEV_CPU ? consts_on(g, wpe->device, wte->shape[0]) : NULL;
    ct_tensor *pos = c ? dev_view(ctx, CT_I32, c, T, wpe->device) : NULL;
    if (!pos) {
        pos = ct_new(ctx, CT_I32, 1, &T);
        for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
        /* (a failure shows in ct_ctx_status: the embedding then sees a CPU index and fails the
         * step naming it) */
        ct_tensor *pos_dev;
        if (wpe->device.type != CT_DEV_CPU && ct_tensor_to(ctx, pos, wpe->device, &pos_dev) == CT_OK) pos = pos_dev;
    }
    ct_tensor *x = ct_add(ctx, ct_embedding(ctx, wte, idx), ct_embedding(ctx, wpe, pos)); /* [B,T,C] + [T,C] */
    if (g->dropout > 0) x = ct_dropout(ctx, x, g->dropout);
    for (int l = 0; l < g->n_layer; l++) /* blocks: checkpointed one by one when asked */
        x = g->checkpoint ? ct_checkpoint(ctx, block_segment, &g->h[l], x) : ct_module_forward(ctx, g->h[l].mod, x);
    x = ct_module_forward(ctx, g->ln_f, x);
    if (g->pad_head) return padded_head(ctx, g, wte, x);
    /* LM head tied to wte; a module of its own so that ct_quantize_dynamic finds it, as
     * PyTorch's quantize_dynamic finds nanoGPT's lm_head */
    return ct_module_forward(ctx, g->lm_head, x);
}
static void gpt_destroy(ct_module *m) {
    ct_gpt *g = m->priv; /* NULL when building it ran out of memory */
    if (g && g->consts) ct_device_free(g->consts_dev, g->consts);
    free(g);
}
static const ct_module_ops gpt_ops = {"GPT", gpt_fw, gpt_destroy, NULL};

/* The children are added in nanoGPT's order (the state_dict's, repr's and quantization's);
 * g names them as they come. NULL children (out of memory) are left to ct_model_create. */
static void gpt_build(ct_model *m) {
    const ct_model_config *c = &m->cfg;
    int64_t C = c->gpt.n_embd;
    bool bias = c->gpt.bias;
    float p = c->gpt.dropout, eps = c->gpt.ln_eps;
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * c->gpt.n_layer);
    char nm[CT_NN_NAME_MAX], sub[CT_NN_NAME_MAX + 32];

    ct_module *root = ct_module_new(&gpt_ops, "");
    ct_gpt *g = root ? calloc(1, sizeof *g + (size_t)c->gpt.n_layer * sizeof g->h[0]) : NULL;
    if (!g) { /* ct_model_create reports the missing root */
        if (root) ct_error(CT_ERR_NOMEM, "out of memory creating a GPT");
        ct_module_free(root);
        m->root = NULL;
        return;
    }
    root->priv = g;
    g->block_size = c->gpt.block_size;
    g->checkpoint = c->gpt.checkpoint_activations;
    g->dropout = p;
    g->n_layer = c->gpt.n_layer;
    g->wte = ct_module_add_child(root, ct_nn_embedding_ex(m->P, "transformer.wte", c->gpt.vocab_size, C, CT_INIT_NORMAL, std));
    g->wpe = ct_module_add_child(root, ct_nn_embedding_ex(m->P, "transformer.wpe", c->gpt.block_size, C, CT_INIT_NORMAL, std));
    m->tied = g->wte ? g->wte->w : NULL;
    for (int l = 0; l < c->gpt.n_layer; l++) {
        ct_gpt_block *b = &g->h[l];
        snprintf(nm, sizeof nm, "transformer.h.%d", l);
        b->mod = ct_module_add_child(root, ct_module_new(&block_ops, nm));
        if (b->mod) b->mod->priv = b;
        b->ln_1 = ct_module_add_child(b->mod, ct_nn_layer_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "ln_1"), C, eps, bias));
        b->attn.mod = ct_module_add_child(b->mod, ct_nn_causal_self_attention(m->P, ct_nn_join(sub, sizeof sub, nm, "attn"), C,
                                                                              c->gpt.n_head, bias, p, std, proj_std));
        if (b->attn.mod) {
            ct_nn_attention_set_fused(b->attn.mod, c->gpt.flash_attention);
            b->attn.c_attn = ct_module_child(b->attn.mod, "c_attn");
            b->attn.c_proj = ct_module_child(b->attn.mod, "c_proj");
        }
        b->ln_2 = ct_module_add_child(b->mod, ct_nn_layer_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "ln_2"), C, eps, bias));
        /* ln_1 and ln_2 feed only c_attn and c_fc (and ln_f only lm_head): under autocast on a
         * device they give those linears their bf16 input directly */
        if (b->ln_1) ct_nn_layer_norm_set_lowp_out(b->ln_1, true);
        if (b->ln_2) ct_nn_layer_norm_set_lowp_out(b->ln_2, true);
        b->mlp.mod = ct_module_add_child(b->mod, ct_module_new(&mlp_ops, ct_nn_join(sub, sizeof sub, nm, "mlp")));
        char lin[CT_NN_NAME_MAX + 48];
        b->mlp.c_fc = ct_module_add_child(b->mlp.mod, ct_nn_linear_ex(m->P, ct_nn_join(lin, sizeof lin, sub, "c_fc"), C, 4 * C, bias,
                                                                      CT_INIT_NORMAL, std, CT_INIT_ZEROS, 0));
        b->mlp.c_proj = ct_module_add_child(b->mlp.mod, ct_nn_linear_ex(m->P, ct_nn_join(lin, sizeof lin, sub, "c_proj"), 4 * C, C,
                                                                        bias, CT_INIT_NORMAL, proj_std, CT_INIT_ZEROS, 0));
        if (b->mlp.mod) {
            b->mlp.mod->priv = b;
            b->mlp.mod->fp[0] = p;
            b->mlp.mod->hp[0] = c->gpt.gelu_tanh;
        }
    }
    g->ln_f = ct_module_add_child(root, ct_nn_layer_norm(m->P, "transformer.ln_f", C, eps, bias));
    if (g->ln_f) ct_nn_layer_norm_set_lowp_out(g->ln_f, true);
    g->lm_head = ct_module_add_child(root, ct_nn_linear_tied("lm_head", m->tied, NULL));
    m->root = root;
}

static ct_tensor *gpt_forward(ct_ctx *ctx, ct_model *m, ct_tensor *idx) { return ct_module_forward(ctx, m->root, idx); }

/* next-token cross-entropy over all B*T positions; -1 targets ignored (nanoGPT) */
static ct_tensor *gpt_loss(ct_ctx *ctx, ct_model *m, ct_tensor *x, ct_tensor *target) {
    ct_gpt *g = m->root->priv;
    g->pad_head = gpt_pads_head(g); /* the loss needs no [B, T, V] logits: see padded_head */
    ct_tensor *logits = gpt_forward(ctx, m, x);
    g->pad_head = false;
    return ct_model_token_loss_(ctx, "GPT", logits, x, target, -1);
}

/* nanoGPT (PyTorch < 2) registers its causal mask as "transformer.h.N.attn.bias" */
static bool is_gpt_mask(const char *name) {
    int n = 0, len = 0;
    return sscanf(name, "transformer.h.%d.attn.bias%n", &n, &len) == 1 && name[len] == 0;
}

static void gpt_batch(const ct_model_config *c, ct_model_batch *b) {
    b->classes = b->vocab = c->gpt.vocab_size;
    b->ignore_index = -1; /* nanoGPT's */
    b->x_ndim = 1;
    b->x_max_len = c->gpt.block_size;
}

/* ctrain train's defaults are a small model that trains in minutes on a CPU */
#define O_(n, fl, lo, hi) CT_MODEL_OPT_(gpt.n, #n, 'i', CT_OPT_META | CT_OPT_FLAG | (fl), lo, hi)
static const ct_model_option gpt_options[] = {
    {O_(n_layer, 0, 1, 256), .cli_default = "4", .help = "transformer blocks"},
    {O_(n_embd, 0, 1, 65536), .cli_default = "128", .help = "width"},
    {O_(n_head, 0, 1, 1024), .cli_default = "4", .help = "attention heads (dividing --n-embd)"},
    {O_(block_size, CT_OPT_CONTEXT, 1, 65536), .cli_default = "64",
     .help = "context length (with --init-from: a shorter training context)"},
    {O_(vocab_size, 0, 2, 65536), .cli_default = "256", .help = "vocabulary (256: bytes)"},
    {CT_MODEL_OPT_(gpt.dropout, "dropout", 'f', CT_OPT_META | CT_OPT_FLAG | CT_OPT_RUN, 0, 0.99), .help = "embedding and residual dropout"},
    {CT_MODEL_OPT_(gpt.attn_pdrop, "attn_pdrop", 'f', CT_OPT_META | CT_OPT_META_SET, 0, 0.99)},
    {CT_MODEL_OPT_(gpt.bias, "bias", 'b', CT_OPT_META, 0, 1)},
    {CT_MODEL_OPT_(gpt.gelu_tanh, "gelu_tanh", 'b', CT_OPT_META, 0, 1)},
    {CT_MODEL_OPT_(gpt.ln_eps, "ln_eps", 'f', CT_OPT_META, 0, 1)},
    {CT_MODEL_OPT_(gpt.flash_attention, "flash_attention", 'b', CT_OPT_FLAG | CT_OPT_RUN, 0, 1), .flag = "--attention",
     .words = "plain|flash", .help = "flash: fused, O(T) memory (the default); plain keeps the [T, T] matrix"},
    {CT_MODEL_OPT_(gpt.checkpoint_activations, "checkpoint_activations", 'b', CT_OPT_FLAG | CT_OPT_RUN, 0, 1),
     .help = "recompute each block in backward (less memory)"},
};
#undef O_

const ct_model_kind_ops ct_gpt_kind_ = {
    .info = {.name = "gpt", .data = CT_MODEL_DATA_TOKENS, .optimizer = "adamw", .adam_beta2 = 0.95,
             /* epochs over a small text can be a handful of steps: it evaluates at the end */
             .eval_each_epoch = false, .hf = true, .generates = true, .options = gpt_options, .noptions = CT_MODEL_NOPTS_(gpt_options)},
    .defaults = gpt_defaults, .check = gpt_check, .batch = gpt_batch, .build = gpt_build, .describe = gpt_describe,
    .forward = gpt_forward, .loss = gpt_loss,
    /* PyTorch's state_dict of nanoGPT lists the tied head under both names */
    .tied_name = "lm_head.weight", .load_ignores = is_gpt_mask,
    .from_tensors = ct_gpt_config_from_tensors_, .hf_load = ct_gpt_load_hf, .hf_save = ct_gpt_save_hf,
    .kv_shape = ct_gpt_kv_shape_, .forward_cached = ct_gpt_forward_cached_,
};
