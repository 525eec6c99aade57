/* Layers: Linear, Conv2d, MaxPool2d, Embedding, LayerNorm, Dropout, activations, Flatten.
 * Forward functions are thin: the op does the work (fused bias in linear, views for flatten). */
#include <stdio.h>
#include <string.h>

#include "ctrain/nn.h"

static ct_tensor *reg(ct_params *P, const char *prefix, const char *leaf, int ndim, const int64_t *shape, ct_init init, double arg) {
    char nm[CT_NN_NAME_MAX + 16];
    return ct_param(P, ct_nn_join(nm, sizeof nm, prefix, leaf), ndim, shape, init, arg);
}

/* The start of every constructor with a store (nn.h): a NULL name (from a Sequential that
 * could not be built) or a store that already failed give NULL at once; so does a module
 * that cannot be allocated, marking the store. */
static ct_module *new_in(ct_params *P, const ct_module_ops *ops, const char *name) {
    ct_module *m = name && ct_params_status(P) == CT_OK ? ct_module_new(ops, name) : NULL;
    if (!m) ct_params_fail(P, CT_ERR_NOMEM);
    return m;
}
/* a registration ran out of memory (the store is marked already) */
static ct_module *undo(ct_module *m) {
    ct_module_free(m);
    return NULL;
}

/* ---- Linear ---- */
static ct_tensor *linear_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return ct_linear(ctx, x, m->w, m->b); }
static int linear_repr(const ct_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "Linear(in_features=%lld, out_features=%lld, bias=%s)", (long long)m->hp[0], (long long)m->hp[1],
                    m->b ? "True" : "False");
}
static const ct_module_ops linear_ops = {"Linear", linear_fw, NULL, linear_repr};

ct_module *ct_nn_linear_ex(ct_params *P, const char *name, int64_t in, int64_t out, bool bias, ct_init w_init,
                           double w_arg, ct_init b_init, double b_arg) {
    CT_CHECK(in > 0 && out > 0, "Linear '%s': in_features=%lld, out_features=%lld must be positive", name ? name : "",
             (long long)in, (long long)out);
    ct_module *m = new_in(P, &linear_ops, name);
    if (!m) return NULL;
    m->w = reg(P, m->name, "weight", 2, (int64_t[]){out, in}, w_init, w_arg);
    if (bias) m->b = reg(P, m->name, "bias", 1, (int64_t[]){out}, b_init, b_arg);
    if (!m->w || (bias && !m->b)) return undo(m);
    m->hp[0] = in;
    m->hp[1] = out;
    return m;
}
ct_module *ct_nn_linear(ct_params *P, const char *name, int64_t in, int64_t out, bool bias) {
    return ct_nn_linear_ex(P, name, in, out, bias, CT_INIT_KAIMING_UNIFORM, (double)in, CT_INIT_KAIMING_UNIFORM, (double)in);
}
ct_module *ct_nn_linear_tied(const char *name, ct_tensor *w, ct_tensor *b) {
    if (!w) return NULL; /* its owner could not be built (out of memory): passed on (nn.h) */
    CT_CHECK(w->ndim == 2 && (!b || (b->ndim == 1 && b->shape[0] == w->shape[0])), "Linear '%s': tied weight must be [out, in], bias [out]",
             name ? name : "");
    ct_module *m = ct_module_new(&linear_ops, name);
    if (!m) return NULL;
    m->w = w;
    m->b = b;
    m->hp[0] = w->shape[1];
    m->hp[1] = w->shape[0];
    return m;
}

/* ---- Conv2d ---- */
static ct_tensor *conv_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    return ct_conv2d(ctx, x, m->w, m->b, (int)m->hp[3], (int)m->hp[4]);
}
static int conv_repr(const ct_module *m, char *buf, size_t n) {
    const int64_t *h = m->hp;
    return snprintf(buf, n, "Conv2d(%lld, %lld, kernel_size=(%lld, %lld), stride=(%lld, %lld), padding=(%lld, %lld)%s)", (long long)h[0],
                    (long long)h[1], (long long)h[2], (long long)h[2], (long long)h[3], (long long)h[3], (long long)h[4],
                    (long long)h[4], m->b ? "" : ", bias=False");
}
static const ct_module_ops conv_ops = {"Conv2d", conv_fw, NULL, conv_repr};

ct_module *ct_nn_conv2d(ct_params *P, const char *name, int64_t in_ch, int64_t out_ch, int kernel, int stride,
                        int padding, bool bias) {
    CT_CHECK(in_ch > 0 && out_ch > 0 && kernel > 0 && stride > 0 && padding >= 0,
             "Conv2d '%s': bad arguments (in=%lld out=%lld kernel=%d stride=%d padding=%d)", name ? name : "",
             (long long)in_ch, (long long)out_ch, kernel, stride, padding);
    ct_module *m = new_in(P, &conv_ops, name);
    if (!m) return NULL;
    double fan_in = (double)in_ch * kernel * kernel;
    m->w = reg(P, m->name, "weight", 4, (int64_t[]){out_ch, in_ch, kernel, kernel}, CT_INIT_KAIMING_UNIFORM, fan_in);
    if (bias) m->b = reg(P, m->name, "bias", 1, (int64_t[]){out_ch}, CT_INIT_KAIMING_UNIFORM, fan_in);
    if (!m->w || (bias && !m->b)) return undo(m);
    m->hp[0] = in_ch; m->hp[1] = out_ch; m->hp[2] = kernel; m->hp[3] = stride; m->hp[4] = padding;
    return m;
}

/* ---- MaxPool2d ---- */
static ct_tensor *pool_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    return ct_max_pool2d(ctx, x, (int)m->hp[0], (int)m->hp[1], (int)m->hp[2]);
}
static int pool_repr(const ct_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "MaxPool2d(kernel_size=%lld, stride=%lld, padding=%lld)", (long long)m->hp[0], (long long)m->hp[1],
                    (long long)m->hp[2]);
}
static const ct_module_ops pool_ops = {"MaxPool2d", pool_fw, NULL, pool_repr};
ct_module *ct_nn_max_pool2d(int kernel, int stride, int padding) {
    CT_CHECK(kernel > 0 && stride >= 0 && padding >= 0 && 2 * padding <= kernel,
             "MaxPool2d: bad arguments (kernel=%d stride=%d padding=%d)", kernel, stride, padding);
    ct_module *m = ct_module_new(&pool_ops, NULL);
    if (!m) return NULL;
    m->hp[0] = kernel; m->hp[1] = stride ? stride : kernel; m->hp[2] = padding;
    return m;
}

/* ---- Embedding ---- */
static ct_tensor *emb_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return ct_embedding(ctx, m->w, x); }
static int emb_repr(const ct_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "Embedding(%lld, %lld)", (long long)m->hp[0], (long long)m->hp[1]);
}
static const ct_module_ops emb_ops = {"Embedding", emb_fw, NULL, emb_repr};
ct_module *ct_nn_embedding_ex(ct_params *P, const char *name, int64_t num, int64_t dim, ct_init init, double arg) {
    CT_CHECK(num > 0 && dim > 0, "Embedding '%s': num=%lld dim=%lld must be positive", name ? name : "", (long long)num, (long long)dim);
    ct_module *m = new_in(P, &emb_ops, name);
    if (!m) return NULL;
    m->w = reg(P, m->name, "weight", 2, (int64_t[]){num, dim}, init, arg);
    if (!m->w) return undo(m);
    m->hp[0] = num; m->hp[1] = dim;
    return m;
}
ct_module *ct_nn_embedding(ct_params *P, const char *name, int64_t num, int64_t dim) {
    return ct_nn_embedding_ex(P, name, num, dim, CT_INIT_NORMAL, 1.0);
}

/* ---- LayerNorm ---- */
/* hp[1]: its output feeds only low-precision ops (ct_nn_layer_norm_set_lowp_out) */
static ct_tensor *ln_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    return m->hp[1] ? ct_layer_norm_lowp(ctx, x, m->w, m->b, m->fp[0]) : ct_layer_norm(ctx, x, m->w, m->b, m->fp[0]);
}
static int ln_repr(const ct_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "LayerNorm((%lld,), eps=%g)", (long long)m->hp[0], (double)m->fp[0]);
}
static const ct_module_ops ln_ops = {"LayerNorm", ln_fw, NULL, ln_repr};
ct_module *ct_nn_layer_norm(ct_params *P, const char *name, int64_t dim, float eps, bool bias) {
    CT_CHECK(dim > 0, "LayerNorm '%s': dim=%lld must be positive", name ? name : "", (long long)dim);
    ct_module *m = new_in(P, &ln_ops, name);
    if (!m) return NULL;
    m->w = reg(P, m->name, "weight", 1, (int64_t[]){dim}, CT_INIT_ONES, 0);
    if (bias) m->b = reg(P, m->name, "bias", 1, (int64_t[]){dim}, CT_INIT_ZEROS, 0);
    if (!m->w || (bias && !m->b)) return undo(m);
    m->hp[0] = dim;
    m->fp[0] = eps > 0 ? eps : 1e-5f;
    return m;
}

void ct_nn_layer_norm_set_lowp_out(ct_module *m, bool on) {
    CT_CHECK(m && m->ops == &ln_ops, "ct_nn_layer_norm_set_lowp_out: '%s' is not a LayerNorm", m ? m->name : "(null)");
    m->hp[1] = on;
}

/* ---- Dropout ---- */
static ct_tensor *drop_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    return m->fp[0] > 0 ? ct_dropout(ctx, x, m->fp[0]) : x;
}
static int drop_repr(const ct_module *m, char *buf, size_t n) { return snprintf(buf, n, "Dropout(p=%g)", (double)m->fp[0]); }
static const ct_module_ops drop_ops = {"Dropout", drop_fw, NULL, drop_repr};
ct_module *ct_nn_dropout(float p) {
    CT_CHECK(p >= 0 && p < 1, "Dropout: p=%g must be in [0, 1)", (double)p);
    ct_module *m = ct_module_new(&drop_ops, NULL);
    if (!m) return NULL;
    m->fp[0] = p;
    return m;
}

/* ---- activations ---- */
static ct_tensor *relu_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { (void)m; return ct_relu(ctx, x); }
static ct_tensor *gelu_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return ct_gelu(ctx, x, m->hp[0] != 0); }
static ct_tensor *tanh_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { (void)m; return ct_tanh(ctx, x); }
static ct_tensor *sigm_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { (void)m; return ct_sigmoid(ctx, x); }
static const ct_module_ops relu_ops = {"ReLU", relu_fw, NULL, NULL};
static int gelu_repr(const ct_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "GELU(approximate='%s')", m->hp[0] ? "tanh" : "none");
}
static const ct_module_ops gelu_ops = {"GELU", gelu_fw, NULL, gelu_repr};
static const ct_module_ops tanh_ops = {"Tanh", tanh_fw, NULL, NULL};
static const ct_module_ops sigm_ops = {"Sigmoid", sigm_fw, NULL, NULL};
ct_module *ct_nn_relu(void) { return ct_module_new(&relu_ops, NULL); }
ct_module *ct_nn_gelu(bool tanh_approx) {
    ct_module *m = ct_module_new(&gelu_ops, NULL);
    if (!m) return NULL;
    m->hp[0] = tanh_approx;
    return m;
}
ct_module *ct_nn_tanh(void) { return ct_module_new(&tanh_ops, NULL); }
ct_module *ct_nn_sigmoid(void) { return ct_module_new(&sigm_ops, NULL); }

/* ---- Flatten ---- */
static ct_tensor *flat_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return ct_flatten(ctx, x, (int)m->hp[0]); }
static int flat_repr(const ct_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "Flatten(start_dim=%lld, end_dim=-1)", (long long)m->hp[0]);
}
static const ct_module_ops flat_ops = {"Flatten", flat_fw, NULL, flat_repr};
ct_module *ct_nn_flatten(int start_dim) {
    ct_module *m = ct_module_new(&flat_ops, NULL);
    if (!m) return NULL;
    m->hp[0] = start_dim;
    return m;
}

/* ---- Sequential ---- */
static ct_tensor *seq_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    for (int i = 0; i < m->nchildren; i++) x = ct_module_forward(ctx, m->children[i], x);
    return x;
}
static const ct_module_ops seq_ops = {"Sequential", seq_fw, NULL, NULL};
ct_module *ct_nn_sequential(const char *name) { return ct_module_new(&seq_ops, name); }

const char *ct_seq_next_name(ct_module *seq) {
    if (!seq) return NULL; /* a Sequential that could not be built: its children fail too (nn.h) */
    CT_CHECK(seq->ops == &seq_ops, "ct_seq_next_name: '%s' is a %s, not a Sequential", seq->name, seq->ops->type);
    char idx[24];
    snprintf(idx, sizeof idx, "%d", seq->nchildren);
    return ct_nn_join(seq->next_name, sizeof seq->next_name, seq->name, idx);
}
ct_module *ct_seq_add(ct_module *seq, ct_module *child) {
    if (!seq || !child) return ct_module_add_child(seq, child); /* out of memory: passed on (nn.h) */
    CT_CHECK(seq->ops == &seq_ops, "ct_seq_add: '%s' is a %s, not a Sequential", seq->name, seq->ops->type);
    ct_seq_next_name(seq);
    /* parameterless layers take their index as name (for repr); layers with parameters
     * must have been created with ct_seq_next_name(), else their state_dict keys are off */
    if (!child->name[0]) memcpy(child->name, seq->next_name, sizeof child->name);
    else CT_CHECK(!strcmp(child->name, seq->next_name), "Sequential '%s': child #%d is named '%s', expected '%s' (use ct_seq_next_name)",
                  seq->name, seq->nchildren, child->name, seq->next_name);
    return ct_module_add_child(seq, child);
}
int ct_seq_len(const ct_module *seq) { return seq->nchildren; }
ct_module *ct_seq_get(const ct_module *seq, int i) {
    CT_CHECK(i >= 0 && i < seq->nchildren, "Sequential '%s': index %d out of range [0, %d)", seq->name, i, seq->nchildren);
    return seq->children[i];
}
