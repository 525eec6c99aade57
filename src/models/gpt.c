/* GPT-2 as nanoGPT writes it (model.py): token + learned position embeddings, dropout,
 * n_layer pre-LN blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), final LayerNorm,
 * LM head tied to wte. Names follow nanoGPT's state_dict ("transformer.h.0.attn.c_attn.weight"). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "models/model_internal.h"

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

/* MLP: c_fc (C → 4C), GELU (hp[0]: tanh approximation), c_proj (4C → C), dropout.
 * unread: c_proj's output values are never read (see block_segment) */
static ct_tensor *mlp_run(ct_ctx *ctx, ct_module *m, ct_tensor *x, bool unread) {
    ct_module *proj = m->children[1];
    ct_tensor *h = ct_gelu(ctx, ct_module_forward(ctx, m->children[0], x), m->hp[0] != 0);
    h = unread ? ct_linear_unevaluated(ctx, h, proj->w, proj->b) : ct_module_forward(ctx, proj, h);
    return m->fp[0] > 0 ? ct_dropout(ctx, h, m->fp[0]) : h;
}
static ct_tensor *mlp_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return mlp_run(ctx, m, x, false); }
static const ct_module_ops mlp_ops = {"MLP", mlp_fw, NULL, NULL};

/* Block: children ln_1, attn, ln_2, mlp */
static ct_tensor *block_run(ct_ctx *ctx, ct_module *m, ct_tensor *x, bool unread) {
    ct_module **c = m->children;
    x = ct_add(ctx, x, ct_module_forward(ctx, c[1], ct_module_forward(ctx, c[0], x)));
    return ct_add(ctx, x, mlp_run(ctx, c[3], ct_module_forward(ctx, c[2], x), unread));
}
static ct_tensor *block_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return block_run(ctx, m, x, false); }
static const ct_module_ops block_ops = {"Block", block_fw, NULL, NULL};

/* A block as a checkpointed segment. On the recompute nothing reads the block's output, and
 * the MLP's c_proj output reaches it only through dropout and the residual add, whose
 * gradients read no values: c_proj records its node without its GEMM (a third of the
 * block's forward FLOPs at width 256, context 256). Gradients are the same bits. */
static ct_tensor *block_segment(ct_ctx *ctx, ct_tensor *x, void *arg) {
    ct_module *m = arg;
    bool linear = !strcmp(ct_module_type(m->children[3]->children[1]), "Linear"); /* not a quantized one */
    return block_run(ctx, m, x, linear && ct_checkpoint_recomputing(ctx));
}

/* GPT: children wte, wpe, h.0 .. h.{L-1}, ln_f, lm_head (a Linear over wte); hp[0] = block_size, hp[1] = checkpoint the
 * blocks, fp[0] = dropout */
static ct_tensor *gpt_fw(ct_ctx *ctx, ct_module *m, ct_tensor *idx) {
    CT_CHECK(idx->ndim == 2 && (idx->dtype == CT_I32 || idx->dtype == CT_I64),
             "GPT: expected [B, T] i32/i64 tokens, got %d dims of %s", idx->ndim, ct_dtype_name(idx->dtype));
    int64_t T = idx->shape[1];
    CT_CHECK(T >= 1 && T <= m->hp[0], "GPT: sequence length %lld outside [1, block_size=%lld]", (long long)T, (long long)m->hp[0]);
    ct_tensor *wte = m->children[0]->w, *wpe = m->children[1]->w;
    ct_tensor *pos = ct_new(ctx, CT_I32, 1, &T);
    for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
    /* on a GPU the positions go where the table is (a failure shows in ct_ctx_status: the
     * embedding then sees a CPU index and fails the step naming it) */
    ct_tensor *pos_dev;
    if (wpe->device.type != CT_DEV_CPU && ct_tensor_to(ctx, pos, wpe->device, &pos_dev) == CT_OK) pos = pos_dev;
    ct_tensor *x = ct_add(ctx, ct_embedding(ctx, wte, idx), ct_embedding(ctx, wpe, pos)); /* [B,T,C] + [T,C] */
    if (m->fp[0] > 0) x = ct_dropout(ctx, x, m->fp[0]);
    for (int i = 2; i < m->nchildren - 2; i++) /* blocks: checkpointed one by one when hp[1] */
        x = m->hp[1] ? ct_checkpoint(ctx, block_segment, m->children[i], x) : ct_module_forward(ctx, m->children[i], x);
    x = ct_module_forward(ctx, m->children[m->nchildren - 2], x); /* ln_f */
    /* LM head tied to wte; a module of its own so that ct_quantize_dynamic finds it, as
     * PyTorch's quantize_dynamic finds nanoGPT's lm_head */
    return ct_module_forward(ctx, m->children[m->nchildren - 1], x);
}
static const ct_module_ops gpt_ops = {"GPT", gpt_fw, NULL, NULL};

static void gpt_build(ct_model *m) {
    const ct_model_config *c = &m->cfg;
    int64_t C = c->gpt.n_embd;
    bool bias = c->gpt.bias;
    float p = c->gpt.dropout, eps = c->gpt.ln_eps;
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * c->gpt.n_layer);
    char nm[CT_NN_NAME_MAX], sub[CT_NN_NAME_MAX + 32];

    ct_module *root = ct_module_new(&gpt_ops, "");
    ct_module *wte = ct_module_add_child(root, ct_nn_embedding_ex(m->P, "transformer.wte", c->gpt.vocab_size, C, CT_INIT_NORMAL, std));
    ct_module_add_child(root, ct_nn_embedding_ex(m->P, "transformer.wpe", c->gpt.block_size, C, CT_INIT_NORMAL, std));
    m->tied = wte ? wte->w : NULL;
    for (int l = 0; l < c->gpt.n_layer; l++) {
        snprintf(nm, sizeof nm, "transformer.h.%d", l);
        ct_module *b = ct_module_add_child(root, ct_module_new(&block_ops, nm));
        ct_module_add_child(b, ct_nn_layer_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "ln_1"), C, eps, bias));
        ct_module *attn = ct_module_add_child(b, ct_nn_causal_self_attention(m->P, ct_nn_join(sub, sizeof sub, nm, "attn"), C,
                                                                             c->gpt.n_head, bias, p, std, proj_std));
        if (attn) ct_nn_attention_set_fused(attn, c->gpt.flash_attention);
        ct_module_add_child(b, ct_nn_layer_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "ln_2"), C, eps, bias));
        ct_module *mlp = ct_module_add_child(b, ct_module_new(&mlp_ops, ct_nn_join(sub, sizeof sub, nm, "mlp")));
        char lin[CT_NN_NAME_MAX + 48];
        ct_module_add_child(mlp, ct_nn_linear_ex(m->P, ct_nn_join(lin, sizeof lin, sub, "c_fc"), C, 4 * C, bias,
                                                 CT_INIT_NORMAL, std, CT_INIT_ZEROS, 0));
        ct_module_add_child(mlp, ct_nn_linear_ex(m->P, ct_nn_join(lin, sizeof lin, sub, "c_proj"), 4 * C, C, bias,
                                                 CT_INIT_NORMAL, proj_std, CT_INIT_ZEROS, 0));
        if (mlp) { /* NULL: out of memory, ct_model_create reports it */
            mlp->fp[0] = p;
            mlp->hp[0] = c->gpt.gelu_tanh;
        }
    }
    ct_module_add_child(root, ct_nn_layer_norm(m->P, "transformer.ln_f", C, eps, bias));
    ct_module_add_child(root, ct_nn_linear_tied("lm_head", m->tied, NULL));
    if (root) {
        root->hp[0] = c->gpt.block_size;
        root->hp[1] = c->gpt.checkpoint_activations;
        root->fp[0] = p;
    }
    m->root = root;
}

static ct_tensor *gpt_forward(ct_ctx *ctx, ct_model *m, ct_tensor *idx) { return ct_module_forward(ctx, m->root, idx); }

/* next-token cross-entropy over all B*T positions; -1 targets ignored (nanoGPT) */
static ct_tensor *gpt_loss(ct_ctx *ctx, ct_model *m, ct_tensor *x, ct_tensor *target) {
    ct_tensor *logits = gpt_forward(ctx, m, x);
    CT_CHECK(target->ndim == 2 && target->shape[0] == x->shape[0] && target->shape[1] == x->shape[1],
             "GPT loss: target must be [B, T] = [%lld, %lld] like the input, got %d dims", (long long)x->shape[0],
             (long long)x->shape[1], target->ndim);
    int64_t V = logits->shape[2], N = x->shape[0] * x->shape[1];
    return ct_cross_entropy(ctx, ct_reshape(ctx, logits, 2, (int64_t[]){N, V}), ct_reshape(ctx, target, 1, &N), -1);
}

/* nanoGPT (PyTorch < 2) registers its causal mask as "transformer.h.N.attn.bias" */
static bool is_gpt_mask(const char *name) {
    int n = 0, len = 0;
    return sscanf(name, "transformer.h.%d.attn.bias%n", &n, &len) == 1 && name[len] == 0;
}

#define F_(n, t) {#n, t, offsetof(ct_model_config, gpt.n), 0}
static const ct_model_field gpt_fields[] = {
    F_(n_layer, 'i'), F_(n_embd, 'i'), F_(n_head, 'i'), F_(block_size, 'i'), F_(vocab_size, 'i'),
    F_(dropout, 'f'), F_(bias, 'b'), F_(gelu_tanh, 'b'), F_(ln_eps, 'f'),
};
#undef F_

const ct_model_kind_ops ct_gpt_kind_ = {
    .name = "gpt", .defaults = gpt_defaults, .check = gpt_check, .build = gpt_build, .describe = gpt_describe,
    .forward = gpt_forward, .loss = gpt_loss,
    /* PyTorch's state_dict of nanoGPT lists the tied head under both names */
    .tied_name = "lm_head.weight", .load_ignores = is_gpt_mask,
    .fields = gpt_fields, .nfields = (int)(sizeof gpt_fields / sizeof gpt_fields[0]),
};
