/* nanoGPT's CausalSelfAttention: c_attn (C → 3C), causal softmax attention over n_head
 * heads, c_proj (C → C), residual dropout. */
#include "ctrain/nn.h"

/* qkv [B, T, 3C] → attention over H heads → [B, T, C], through head layout */
static ct_tensor *heads_attention(ct_ctx *ctx, ct_tensor *qkv, int64_t B, int64_t T, int64_t C, int H, bool flash) {
    /* One copy puts q, k and v into head layout at once: qkv [B, T, 3, H, D] viewed as
     * [3, B, H, T, D] and made contiguous; each of q, k, v is then a contiguous slice
     * (instead of three column copies followed by three split_heads copies). */
    int64_t D = C / H;
    ct_tensor *t5 = ct_reshape(ctx, qkv, 5, (int64_t[]){B, T, 3, H, D});
    t5 = ct_transpose(ctx, ct_transpose(ctx, ct_transpose(ctx, t5, 1, 2), 2, 3), 0, 1); /* [3, B, H, T, D] */
    ct_tensor *heads = ct_contiguous(ctx, t5);
    int64_t hs[4] = {B, H, T, D};
    ct_tensor *q = ct_reshape(ctx, ct_slice(ctx, heads, 0, 0, 1), 4, hs); /* [B, H, T, D] */
    ct_tensor *k = ct_reshape(ctx, ct_slice(ctx, heads, 0, 1, 1), 4, hs);
    ct_tensor *v = ct_reshape(ctx, ct_slice(ctx, heads, 0, 2, 1), 4, hs);
    /* hp[2]: fused (flash) attention, O(T) memory; else the plain one with its [T, T] matrix */
    ct_tensor *a = flash ? ct_flash_attention(ctx, q, k, v, true) : ct_attention(ctx, q, k, v, true);
    return ct_merge_heads(ctx, a); /* [B, T, C] */
}

static ct_tensor *csa_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    int64_t C = m->hp[0];
    int H = (int)m->hp[1];
    CT_CHECK(x->ndim == 3 && x->shape[2] == C, "CausalSelfAttention '%s': expected input [B, T, %lld], got %d dims (last %lld)",
             m->name, (long long)C, x->ndim, (long long)x->shape[x->ndim - 1]);
    /* the projections run through their modules, so that quantizing them (ct_quantize_dynamic) takes effect */
    ct_tensor *qkv = ct_module_forward(ctx, m->children[0], x);            /* c_attn: [B, T, 3C] */
    ct_tensor *y;
    /* fused: one op reads the heads out of qkv and writes y in [B, T, C] (the same bits as the
     * chain below, without its views and their gradients, f32 or under autocast); on a device
     * only the flash one has a kernel (src/cuda/ops_attention.c) */
    if (qkv->device.type == CT_DEV_CPU || m->hp[2]) {
        y = m->hp[2] ? ct_flash_attention_qkv(ctx, qkv, H, true) : ct_attention_qkv(ctx, qkv, H, true);
    } else {
        y = heads_attention(ctx, qkv, x->shape[0], x->shape[1], C, H, m->hp[2] != 0);
    }
    y = ct_module_forward(ctx, m->children[1], y); /* c_proj */
    return m->fp[0] > 0 ? ct_dropout(ctx, y, m->fp[0]) : y;
}
static const ct_module_ops csa_ops = {"CausalSelfAttention", csa_fw, NULL, NULL};

ct_module *ct_nn_causal_self_attention(ct_params *P, const char *name, int64_t n_embd, int n_head, bool bias,
                                       float dropout, double w_std, double proj_std) {
    CT_CHECK(n_embd > 0 && n_head > 0 && n_embd % n_head == 0,
             "CausalSelfAttention '%s': n_embd=%lld must be a positive multiple of n_head=%d", name ? name : "",
             (long long)n_embd, n_head);
    CT_CHECK(dropout >= 0 && dropout < 1, "CausalSelfAttention: dropout=%g must be in [0, 1)", (double)dropout);
    /* out of memory: NULL with the store marked failed (nn.h) */
    ct_module *m = name && ct_params_status(P) == CT_OK ? ct_module_new(&csa_ops, name) : NULL;
    if (!m) {
        ct_params_fail(P, CT_ERR_NOMEM);
        return NULL;
    }
    char nm[CT_NN_NAME_MAX + 32];
    ct_module *attn = ct_module_add_child(m, ct_nn_linear_ex(P, ct_nn_join(nm, sizeof nm, m->name, "c_attn"), n_embd, 3 * n_embd,
                                                             bias, CT_INIT_NORMAL, w_std, CT_INIT_ZEROS, 0));
    ct_module *proj = ct_module_add_child(m, ct_nn_linear_ex(P, ct_nn_join(nm, sizeof nm, m->name, "c_proj"), n_embd, n_embd,
                                                             bias, CT_INIT_NORMAL, proj_std, CT_INIT_ZEROS, 0));
    if (!attn || !proj) {
        ct_module_free(m);
        ct_params_fail(P, CT_ERR_NOMEM);
        return NULL;
    }
    m->p[0] = attn->w; m->p[1] = attn->b; m->p[2] = proj->w; m->p[3] = proj->b;
    m->hp[0] = n_embd; m->hp[1] = n_head;
    m->fp[0] = dropout;
    return m;
}

void ct_nn_attention_set_fused(ct_module *m, bool fused) {
    CT_CHECK(m && m->ops == &csa_ops, "ct_nn_attention_set_fused: '%s' is not a CausalSelfAttention", m ? m->name : "(null)");
    m->hp[2] = fused;
}
