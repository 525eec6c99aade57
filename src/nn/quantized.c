/* Dynamic int8 quantization of modules: DynamicQuantizedLinear (torch.ao.nn.quantized.dynamic.Linear)
 * and ct_quantize_dynamic, which converts every Linear of a tree in place. In place (the
 * module keeps its address, name and sizes; only its ops and state change) so that parents
 * holding the pointer — Sequential, attention, the GPT root, a user's module — need no
 * rewiring, and a Linear root converts too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/nn.h"

typedef struct {
    ct_qweight *w;
    float *bias; /* [out] or NULL; owned: a quantized model needs no f32 parameter store */
} qlin_state;

static ct_tensor *qlin_fw(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    qlin_state *q = m->priv;
    int64_t out = ct_qweight_out(q->w);
    ct_tensor *b = q->bias ? ct_wrap(ctx, CT_F32, q->bias, 1, &out) : NULL;
    return ct_linear_dynamic_int8(ctx, x, q->w, b);
}
static void qlin_destroy(ct_module *m) {
    qlin_state *q = m->priv;
    if (!q) return;
    ct_qweight_free(q->w);
    free(q->bias);
    free(q);
}
static int qlin_repr(const ct_module *m, char *buf, size_t n) {
    int64_t ns = 1;
    ct_qweight_scales(((const qlin_state *)m->priv)->w, &ns);
    return snprintf(buf, n, "DynamicQuantizedLinear(in_features=%lld, out_features=%lld, dtype=torch.qint8, qscheme=torch.per_%s_affine)",
                    (long long)m->hp[0], (long long)m->hp[1], ns > 1 ? "channel" : "tensor");
}
static const ct_module_ops qlin_ops = {"DynamicQuantizedLinear", qlin_fw, qlin_destroy, qlin_repr};

ct_quantize_opts ct_quantize_default_opts(void) { return (ct_quantize_opts){.per_channel = false}; }

bool ct_module_is_qlinear(const ct_module *m) { return m && m->ops == &qlin_ops; }
const ct_qweight *ct_qlinear_weight(const ct_module *m) { return ct_module_is_qlinear(m) ? ((qlin_state *)m->priv)->w : NULL; }
const float *ct_qlinear_bias(const ct_module *m) { return ct_module_is_qlinear(m) ? ((qlin_state *)m->priv)->bias : NULL; }

/* a fresh state for w (taken over) and a copy of bias; NULL (w freed) when out of memory */
static qlin_state *state_new(ct_qweight *w, const float *bias) {
    qlin_state *q = calloc(1, sizeof *q);
    size_t nb = (size_t)ct_qweight_out(w) * sizeof(float);
    if (q && bias && !(q->bias = malloc(nb))) { free(q); q = NULL; }
    if (!q) {
        ct_qweight_free(w);
        ct_error(CT_ERR_NOMEM, "out of memory for a quantized Linear");
        return NULL;
    }
    if (bias) memcpy(q->bias, bias, nb);
    q->w = w;
    return q;
}

ct_status ct_qlinear_set(ct_module *m, ct_qweight *w, const float *bias) {
    CT_CHECK(ct_module_is_qlinear(m), "ct_qlinear_set: '%s' is a %s, not a DynamicQuantizedLinear", m ? m->name : "(null)",
             m ? m->ops->type : "-");
    CT_CHECK(ct_qweight_out(w) == m->hp[1] && ct_qweight_in(w) == m->hp[0], "ct_qlinear_set: '%s' is [%lld, %lld], weight [%lld, %lld]",
             m->name, (long long)m->hp[1], (long long)m->hp[0], (long long)ct_qweight_out(w), (long long)ct_qweight_in(w));
    qlin_state *q = state_new(w, bias);
    if (!q) return CT_ERR_NOMEM;
    qlin_destroy(m);
    m->priv = q;
    return CT_OK;
}

ct_module *ct_nn_linear_dynamic_int8(const char *name, ct_qweight *w, const float *bias) {
    ct_module *m = ct_module_new(&qlin_ops, name);
    qlin_state *q = m ? state_new(w, bias) : NULL;
    if (!q) {
        if (!m) ct_qweight_free(w);
        free(m);
        return NULL;
    }
    m->priv = q;
    m->hp[0] = ct_qweight_in(w);
    m->hp[1] = ct_qweight_out(w);
    return m;
}

/* A Linear: type "Linear", a 2-d f32 weight, nothing private (ct_nn_linear's modules) */
static bool is_linear(const ct_module *m) {
    return !strcmp(m->ops->type, "Linear") && m->w && m->w->ndim == 2 && m->w->dtype == CT_F32 && !m->priv && !m->ops->destroy;
}

static ct_status convert(ct_module *m, const ct_quantize_opts *o, int *n) {
    for (int i = 0; i < m->nchildren; i++) {
        ct_status st = convert(m->children[i], o, n);
        if (st != CT_OK) return st;
    }
    if (!is_linear(m)) return CT_OK;
    ct_qweight *w;
    ct_status st = ct_qweight_quantize(ct_f32(m->w), m->w->shape[0], m->w->shape[1], o->per_channel, &w);
    if (st != CT_OK) return st;
    qlin_state *q = state_new(w, m->b ? ct_f32(m->b) : NULL);
    if (!q) return CT_ERR_NOMEM;
    m->ops = &qlin_ops;
    m->priv = q;
    m->w = m->b = NULL; /* the f32 parameters stay in their store, unused by this module */
    m->hp[0] = ct_qweight_in(w);
    m->hp[1] = ct_qweight_out(w);
    (*n)++;
    return CT_OK;
}

ct_status ct_quantize_dynamic(ct_module *root, const ct_quantize_opts *opts, int *nconverted) {
    ct_quantize_opts o = opts ? *opts : ct_quantize_default_opts();
    int n = 0;
    ct_status st = root ? convert(root, &o, &n) : ct_error(CT_ERR_INVALID, "ct_quantize_dynamic: no module");
    if (nconverted) *nconverted = n;
    return st;
}

