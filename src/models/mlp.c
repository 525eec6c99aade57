/* MLP: nn.Sequential(Linear, ReLU, [Dropout], ..., Linear) — state_dict "0.weight", "2.weight", ... */
#include <stdio.h>

#include <stddef.h>

#include "models/model_internal.h"

static void mlp_defaults(ct_model_config *c) {
    c->mlp.in = 784;
    c->mlp.n_hidden = 2;
    c->mlp.hidden[0] = 1024;
    c->mlp.hidden[1] = 1024;
    c->mlp.out = 10;
}

static ct_status mlp_check(const ct_model_config *c) {
    if (!ct_model_dim_ok_(c->mlp.in)) CT_MODEL_BAD("mlp.in = %d must be in [1, %d]", c->mlp.in, CT_MODEL_DIM_MAX);
    if (!ct_model_dim_ok_(c->mlp.out)) CT_MODEL_BAD("mlp.out = %d must be in [1, %d]", c->mlp.out, CT_MODEL_DIM_MAX);
    if (c->mlp.n_hidden < 0 || c->mlp.n_hidden > CT_MLP_MAX_HIDDEN)
        CT_MODEL_BAD("mlp.n_hidden = %d must be in [0, %d]", c->mlp.n_hidden, CT_MLP_MAX_HIDDEN);
    for (int i = 0; i < c->mlp.n_hidden; i++)
        if (!ct_model_dim_ok_(c->mlp.hidden[i]))
            CT_MODEL_BAD("mlp.hidden[%d] = %d must be in [1, %d]", i, c->mlp.hidden[i], CT_MODEL_DIM_MAX);
    if (!ct_model_p_ok_(c->mlp.dropout)) CT_MODEL_BAD("mlp.dropout = %g must be in [0, 1)", (double)c->mlp.dropout);
    return CT_OK;
}

static void mlp_describe(const ct_model_config *c, char *arch, size_t n) {
    int o = snprintf(arch, n, "MLP(%d", c->mlp.in);
    for (int i = 0; i < c->mlp.n_hidden && o < (int)n; i++) o += snprintf(arch + o, n - (size_t)o, "-%d", c->mlp.hidden[i]);
    if (o < (int)n) snprintf(arch + o, n - (size_t)o, "-%d, dropout=%g)", c->mlp.out, (double)c->mlp.dropout);
}


static void mlp_build(ct_model *m) {
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

static ct_tensor *mlp_forward(ct_ctx *ctx, ct_model *m, ct_tensor *x) {
    CT_CHECK(x->ndim >= 2 && x->dtype == CT_F32, "MLP: expected f32 input [B, %d] (or [B, ...] to flatten), got %d dims of %s",
             m->cfg.mlp.in, x->ndim, ct_dtype_name(x->dtype));
    if (x->ndim > 2) x = ct_flatten(ctx, x, 1);
    CT_CHECK(x->shape[1] == m->cfg.mlp.in, "MLP: input has %lld features, the model takes %d", (long long)x->shape[1], m->cfg.mlp.in);
    return ct_module_forward(ctx, m->root, x);
}

static void mlp_batch(const ct_model_config *c, ct_model_batch *b) {
    b->classes = c->mlp.out;
    b->x_numel = c->mlp.in; /* any shape of that many values: it flattens */
}

static const ct_model_option mlp_options[] = {
    {CT_MODEL_OPT_(mlp.in, "in", 'i', CT_OPT_META, 1, CT_MODEL_DIM_MAX)},
    {CT_MODEL_OPT_(mlp.hidden, "hidden", 'l', CT_OPT_META | CT_OPT_FLAG, 1, 1 << 20), .len_off = offsetof(ct_model_config, mlp.n_hidden),
     .want = "comma-separated widths, e.g. 1024,1024", .help = "hidden layer widths"},
    {CT_MODEL_OPT_(mlp.out, "out", 'i', CT_OPT_META, 1, CT_MODEL_DIM_MAX)},
    /* Dropout layers shift the state_dict's numbering: part of what the model is */
    {CT_MODEL_OPT_(mlp.dropout, "dropout", 'f', CT_OPT_META | CT_OPT_FLAG, 0, 0.99), .help = "after each hidden ReLU"},
};

const ct_model_kind_ops ct_mlp_kind_ = {
    .info = {.name = "mlp", .data = CT_MODEL_DATA_IMAGES, .optimizer = "sgd", .adam_beta2 = 0.999, .eval_each_epoch = true,
             .options = mlp_options, .noptions = CT_MODEL_NOPTS_(mlp_options)},
    .defaults = mlp_defaults, .check = mlp_check, .batch = mlp_batch, .build = mlp_build, .describe = mlp_describe,
    .forward = mlp_forward,
};
