/* CNN for small images: two conv+ReLU+maxpool blocks, two linear layers.
 *   features   = Sequential(Conv2d(C, c1, k, padding=k/2), ReLU(), MaxPool2d(2),
 *                           Conv2d(c1, c2, k, padding=k/2), ReLU(), MaxPool2d(2))
 *   classifier = Sequential(Linear(c2*H/4*W/4, fc), ReLU(), Dropout(p), Linear(fc, classes))
 *   forward(x) = classifier(flatten(features(x), 1))                                     */
#include "models/model_internal.h"

static ct_tensor *cnn_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    ct_tensor *h = ct_module_forward(ctx, m->children[0], x);
    return ct_module_forward(ctx, m->children[1], ct_flatten(ctx, h, 1));
}
static const ct_module_ops cnn_ops = {"CNN", cnn_fw, NULL};

void ct_cnn_build_(ct_model *m) {
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

ct_tensor *ct_cnn_forward_(ct_ctx *ctx, ct_model *m, ct_tensor *x) {
    const ct_model_config *c = &m->cfg;
    CT_CHECK(x->ndim == 4 && x->dtype == CT_F32 && x->shape[1] == c->cnn.in_channels && x->shape[2] == c->cnn.height &&
                 x->shape[3] == c->cnn.width,
             "CNN: expected f32 input [B, %d, %d, %d], got %d dims [.., %lld, %lld, %lld] of %s", c->cnn.in_channels,
             c->cnn.height, c->cnn.width, x->ndim, (long long)(x->ndim > 1 ? x->shape[1] : 0),
             (long long)(x->ndim > 2 ? x->shape[2] : 0), (long long)(x->ndim > 3 ? x->shape[3] : 0), ct_dtype_name(x->dtype));
    return ct_module_forward(ctx, m->root, x);
}
