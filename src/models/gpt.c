/* GPT-2 as nanoGPT writes it (model.py): token + learned position embeddings, dropout,
 * n_layer pre-LN blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), final LayerNorm,
 * LM head tied to wte. Names follow nanoGPT's state_dict ("transformer.h.0.attn.c_attn.weight"). */
#include <math.h>
#include <stdio.h>

#include "models/model_internal.h"

/* MLP: c_fc (C → 4C), exact GELU, c_proj (4C → C), dropout */
static ct_tensor *mlp_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    ct_tensor *h = ct_gelu(ctx, ct_module_forward(ctx, m->children[0], x), false);
    h = ct_module_forward(ctx, m->children[1], h);
    return m->fp[0] > 0 ? ct_dropout(ctx, h, m->fp[0]) : h;
}
static const ct_module_ops mlp_ops = {"MLP", mlp_fw, NULL};

/* Block: children ln_1, attn, ln_2, mlp */
static ct_tensor *block_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    ct_module **c = m->children;
    x = ct_add(ctx, x, ct_module_forward(ctx, c[1], ct_module_forward(ctx, c[0], x)));
    return ct_add(ctx, x, ct_module_forward(ctx, c[3], ct_module_forward(ctx, c[2], x)));
}
static const ct_module_ops block_ops = {"Block", block_fw, NULL};

/* GPT: children wte, wpe, h.0 .. h.{L-1}, ln_f; hp[0] = block_size, fp[0] = dropout */
static ct_tensor *gpt_fw(ct_ctx *ctx, ct_module *m, ct_tensor *idx) {
    CT_CHECK(idx->ndim == 2 && (idx->dtype == CT_I32 || idx->dtype == CT_I64),
             "GPT: expected [B, T] i32/i64 tokens, got %d dims of %s", idx->ndim, ct_dtype_name(idx->dtype));
    int64_t T = idx->shape[1];
    CT_CHECK(T >= 1 && T <= m->hp[0], "GPT: sequence length %lld outside [1, block_size=%lld]", (long long)T, (long long)m->hp[0]);
    ct_tensor *wte = m->children[0]->w, *wpe = m->children[1]->w;
    ct_tensor *pos = ct_new(ctx, CT_I32, 1, &T);
    for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
    ct_tensor *x = ct_add(ctx, ct_embedding(ctx, wte, idx), ct_embedding(ctx, wpe, pos)); /* [B,T,C] + [T,C] */
    if (m->fp[0] > 0) x = ct_dropout(ctx, x, m->fp[0]);
    for (int i = 2; i < m->nchildren; i++) x = ct_module_forward(ctx, m->children[i], x); /* blocks, ln_f */
    return ct_linear(ctx, x, wte, NULL); /* LM head tied to wte */
}
static const ct_module_ops gpt_ops = {"GPT", gpt_fw, NULL};

void ct_gpt_build_(ct_model *m) {
    const ct_model_config *c = &m->cfg;
    int64_t C = c->gpt.n_embd;
    bool bias = c->gpt.bias;
    float p = c->gpt.dropout;
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * c->gpt.n_layer);
    char nm[CT_NN_NAME_MAX], sub[CT_NN_NAME_MAX + 32];

    ct_module *root = ct_module_new(&gpt_ops, "");
    ct_module *wte = ct_module_add_child(root, ct_nn_embedding_ex(m->P, "transformer.wte", c->gpt.vocab_size, C, CT_INIT_NORMAL, std));
    ct_module *wpe = ct_module_add_child(root, ct_nn_embedding_ex(m->P, "transformer.wpe", c->gpt.block_size, C, CT_INIT_NORMAL, std));
    m->wte = wte->w;
    m->wpe = wpe->w;
    for (int l = 0; l < c->gpt.n_layer; l++) {
        snprintf(nm, sizeof nm, "transformer.h.%d", l);
        ct_module *b = ct_module_add_child(root, ct_module_new(&block_ops, nm));
        ct_module_add_child(b, ct_nn_layer_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "ln_1"), C, 1e-5f, bias));
        ct_module_add_child(b, ct_nn_causal_self_attention(m->P, ct_nn_join(sub, sizeof sub, nm, "attn"), C, c->gpt.n_head, bias, p,
                                                           std, proj_std));
        ct_module_add_child(b, ct_nn_layer_norm(m->P, ct_nn_join(sub, sizeof sub, nm, "ln_2"), C, 1e-5f, bias));
        ct_module *mlp = ct_module_add_child(b, ct_module_new(&mlp_ops, ct_nn_join(sub, sizeof sub, nm, "mlp")));
        char lin[CT_NN_NAME_MAX + 48];
        ct_module_add_child(mlp, ct_nn_linear_ex(m->P, ct_nn_join(lin, sizeof lin, mlp->name, "c_fc"), C, 4 * C, bias,
                                                 CT_INIT_NORMAL, std, CT_INIT_ZEROS, 0));
        ct_module_add_child(mlp, ct_nn_linear_ex(m->P, ct_nn_join(lin, sizeof lin, mlp->name, "c_proj"), 4 * C, C, bias,
                                                 CT_INIT_NORMAL, proj_std, CT_INIT_ZEROS, 0));
        mlp->fp[0] = p;
    }
    ct_module_add_child(root, ct_nn_layer_norm(m->P, "transformer.ln_f", C, 1e-5f, bias));
    root->hp[0] = c->gpt.block_size;
    root->fp[0] = p;
    m->root = root;
}

ct_tensor *ct_gpt_forward_(ct_ctx *ctx, ct_model *m, ct_tensor *idx) { return ct_module_forward(ctx, m->root, idx); }
