/* CNN for small images: two conv+ReLU+maxpool blocks, two linear layers.
 *   features   = Sequential(Conv2d(C, c1, k, padding=k/2), ReLU(), MaxPool2d(2),
 *                           Conv2d(c1, c2, k, padding=k/2), ReLU(), MaxPool2d(2))
 *   classifier = Sequential(Linear(c2*H/4*W/4, fc), ReLU(), Dropout(p), Linear(fc, classes))
 *   forward(x) = classifier(flatten(features(x), 1))                                     */
#include <stdio.h>
#include <string.h>

#include <stddef.h>

#include "models/model_internal.h"

static void cnn_defaults(ct_model_config *c) {
    c->cnn.in_channels = 1;
    c->cnn.height = 28;
    c->cnn.width = 28;
    c->cnn.c1 = 32;
    c->cnn.c2 = 64;
    c->cnn.kernel = 5;
    c->cnn.fc = 128;
    c->cnn.classes = 10;
}

static ct_status cnn_check(const ct_model_config *c) {
    if (!ct_model_dim_ok_(c->cnn.in_channels)) CT_MODEL_BAD("cnn.in_channels = %d must be positive", c->cnn.in_channels);
    if (!ct_model_dim_ok_(c->cnn.height) || c->cnn.height % 4)
        CT_MODEL_BAD("cnn.height = %d must be a positive multiple of 4 (two 2x2 poolings)", c->cnn.height);
    if (!ct_model_dim_ok_(c->cnn.width) || c->cnn.width % 4)
        CT_MODEL_BAD("cnn.width = %d must be a positive multiple of 4 (two 2x2 poolings)", c->cnn.width);
    if (!ct_model_dim_ok_(c->cnn.c1) || !ct_model_dim_ok_(c->cnn.c2))
        CT_MODEL_BAD("cnn.c1 = %d, cnn.c2 = %d must be positive", c->cnn.c1, c->cnn.c2);
    if (c->cnn.kernel <= 0 || c->cnn.kernel % 2 == 0 || c->cnn.kernel > 31)
        CT_MODEL_BAD("cnn.kernel = %d must be odd, in [1, 31] ('same' padding)", c->cnn.kernel);
    if (!ct_model_dim_ok_(c->cnn.fc)) CT_MODEL_BAD("cnn.fc = %d must be positive", c->cnn.fc);
    if (!ct_model_dim_ok_(c->cnn.classes)) CT_MODEL_BAD("cnn.classes = %d must be positive", c->cnn.classes);
    if ((double)c->cnn.c2 * (c->cnn.height / 4) * (c->cnn.width / 4) * c->cnn.fc > 4e9)
        CT_MODEL_BAD("cnn: first linear layer (%d x %lld) too large", c->cnn.fc,
                     (long long)c->cnn.c2 * (c->cnn.height / 4) * (c->cnn.width / 4));
    if (!ct_model_p_ok_(c->cnn.dropout)) CT_MODEL_BAD("cnn.dropout = %g must be in [0, 1)", (double)c->cnn.dropout);
    return CT_OK;
}

static void cnn_describe(const ct_model_config *c, char *arch, size_t n) {
    snprintf(arch, n, "CNN(%dx%dx%d, conv %d-%d k%d, fc %d, classes %d, dropout=%g)", c->cnn.in_channels, c->cnn.height,
             c->cnn.width, c->cnn.c1, c->cnn.c2, c->cnn.kernel, c->cnn.fc, c->cnn.classes, (double)c->cnn.dropout);
}


static bool is_type(const ct_module *f, int i, const char *type) {
    return i < f->nchildren && !strcmp(ct_module_type(f->children[i]), type);
}

/* features: each ReLU followed by a MaxPool2d runs as one relu_max_pool2d op (the same bits,
 * one pass over the conv output instead of three, and no ReLU output kept for backward);
 * Conv2d -> ReLU -> MaxPool2d as conv2d_relu_max_pool2d (the conv output pooled while in
 * cache where the direct conv runs, never stored) */
static ct_tensor *features_fw(ct_ctx *ctx, ct_module *f, ct_tensor *h) {
    for (int i = 0; i < f->nchildren; i++) {
        ct_module *c = f->children[i];
        if (is_type(f, i, "Conv2d") && is_type(f, i + 1, "ReLU") && is_type(f, i + 2, "MaxPool2d")) {
            const ct_module *p = f->children[i += 2];
            h = ct_conv2d_relu_max_pool2d(ctx, h, c->w, c->b, (int)c->hp[3], (int)c->hp[4], (int)p->hp[0], (int)p->hp[1], (int)p->hp[2]);
        } else if (is_type(f, i, "ReLU") && is_type(f, i + 1, "MaxPool2d")) {
            const ct_module *p = f->children[++i];
            h = ct_relu_max_pool2d(ctx, h, (int)p->hp[0], (int)p->hp[1], (int)p->hp[2]);
        } else {
            h = ct_module_forward(ctx, c, h);
        }
    }
    return h;
}

static ct_tensor *cnn_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    ct_tensor *h = features_fw(ctx, m->children[0], x);
    return ct_module_forward(ctx, m->children[1], ct_flatten(ctx, h, 1));
}
static const ct_module_ops cnn_ops = {"CNN", cnn_fw, NULL, NULL};

static void cnn_build(ct_model *m) {
    const ct_model_config *c = &m->cfg;
    int k = c->cnn.kernel;
    ct_module *root = ct_module_new(&cnn_ops, "");
    ct_module *f = ct_module_add_child(root, ct_nn_sequential("features"));
    ct_seq_add(f, ct_nn_conv2d(m->P, ct_seq_next_name(f), c->cnn.in_channels, c->cnn.c1, k, 1, k / 2, true));
    ct_seq_add(f, ct_nn_relu());
    ct_seq_add(f, ct_nn_max_pool2d(2, 2, 0));
    ct_seq_add(f, ct_nn_conv2d(m->P, ct_seq_next_name(f), c->cnn.c1, c->cnn.c2, k, 1, k / 2, true));
    ct_seq_add(f, ct_nn_relu());
    ct_seq_add(f, ct_nn_max_pool2d(2, 2, 0));
    ct_module *cl = ct_module_add_child(root, ct_nn_sequential("classifier"));
    int64_t flat = (int64_t)c->cnn.c2 * (c->cnn.height / 4) * (c->cnn.width / 4);
    ct_seq_add(cl, ct_nn_linear(m->P, ct_seq_next_name(cl), flat, c->cnn.fc, true));
    ct_seq_add(cl, ct_nn_relu());
    ct_seq_add(cl, ct_nn_dropout(c->cnn.dropout));
    ct_seq_add(cl, ct_nn_linear(m->P, ct_seq_next_name(cl), c->cnn.fc, c->cnn.classes, true));
    m->root = root;
}

static ct_tensor *cnn_forward(ct_ctx *ctx, ct_model *m, ct_tensor *x) {
    const ct_model_config *c = &m->cfg;
    CT_CHECK(x->ndim == 4 && x->dtype == CT_F32 && x->shape[1] == c->cnn.in_channels && x->shape[2] == c->cnn.height &&
                 x->shape[3] == c->cnn.width,
             "CNN: expected f32 input [B, %d, %d, %d], got %d dims [.., %lld, %lld, %lld] of %s", c->cnn.in_channels,
             c->cnn.height, c->cnn.width, x->ndim, (long long)(x->ndim > 1 ? x->shape[1] : 0),
             (long long)(x->ndim > 2 ? x->shape[2] : 0), (long long)(x->ndim > 3 ? x->shape[3] : 0), ct_dtype_name(x->dtype));
    return ct_module_forward(ctx, m->root, x);
}

static void cnn_batch(const ct_model_config *c, ct_model_batch *b) {
    b->classes = c->cnn.classes;
    b->x_ndim = 3;
    b->x_shape[0] = c->cnn.in_channels;
    b->x_shape[1] = c->cnn.height;
    b->x_shape[2] = c->cnn.width;
}

#define O_(n, fl) CT_MODEL_OPT_(cnn.n, #n, 'i', fl, 1, CT_MODEL_DIM_MAX)
static const ct_model_option cnn_options[] = {
    {O_(in_channels, CT_OPT_META)}, {O_(height, CT_OPT_META)}, {O_(width, CT_OPT_META)}, {O_(c1, CT_OPT_META)},
    {O_(c2, CT_OPT_META)}, {O_(kernel, CT_OPT_META)}, {O_(fc, CT_OPT_META)}, {O_(classes, CT_OPT_META)},
    {CT_MODEL_OPT_(cnn.dropout, "dropout", 'f', CT_OPT_META | CT_OPT_FLAG | CT_OPT_RUN, 0, 0.99), .help = "classifier dropout"},
};
#undef O_

const ct_model_kind_ops ct_cnn_kind_ = {
    .info = {.name = "cnn", .data = CT_MODEL_DATA_IMAGES, .optimizer = "sgd", .adam_beta2 = 0.999, .eval_each_epoch = true,
             .options = cnn_options, .noptions = CT_MODEL_NOPTS_(cnn_options)},
    .defaults = cnn_defaults, .check = cnn_check, .batch = cnn_batch, .build = cnn_build, .describe = cnn_describe,
    .forward = cnn_forward,
};
