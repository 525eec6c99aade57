/* MLP: nn.Sequential(Linear, ReLU, [Dropout], ..., Linear) — state_dict "0.weight", "2.weight", ... */
#include "models/model_internal.h"

void ct_mlp_build_(ct_model *m) {
    const ct_model_config *c = &m->cfg;
    ct_module *seq = ct_nn_sequential("");
    int64_t prev = c->mlp.in;
    for (int i = 0; i < c->mlp.n_hidden; i++) {
        ct_seq_add(seq, ct_nn_linear(m->P, ct_seq_next_name(seq), prev, c->mlp.hidden[i], true));
        ct_seq_add(seq, ct_nn_relu());
        if (c->mlp.dropout > 0) ct_seq_add(seq, ct_nn_dropout(c->mlp.dropout));
        prev = c->mlp.hidden[i];
    }
    ct_seq_add(seq, ct_nn_linear(m->P, ct_seq_next_name(seq), prev, c->mlp.out, true));
    m->root = seq;
}

ct_tensor *ct_mlp_forward_(ct_ctx *ctx, ct_model *m, ct_tensor *x) {
    CT_CHECK(x->ndim >= 2 && x->dtype == CT_F32, "MLP: expected f32 input [B, %d] (or [B, ...] to flatten), got %d dims of %s",
             m->cfg.mlp.in, x->ndim, ct_dtype_name(x->dtype));
    if (x->ndim > 2) x = ct_flatten(ctx, x, 1);
    CT_CHECK(x->shape[1] == m->cfg.mlp.in, "MLP: input has %lld features, the model takes %d", (long long)x->shape[1], m->cfg.mlp.in);
    return ct_module_forward(ctx, m->root, x);
}
