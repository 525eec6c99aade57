/* The model API shared by the built-in models: configs, creation, forward, loss. What
 * differs between kinds lives in each kind's file behind the table in model_internal.h. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "models/model_internal.h"

#define KIND_ENTRY_(entry) &entry,
static const ct_model_kind_ops *const kinds[] = {CT_MODEL_KINDS(KIND_ENTRY_)};
#undef KIND_ENTRY_
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

static const ct_model_kind_ops *kind_ops(ct_model_kind k) { return (int)k >= 0 && (int)k < NKINDS ? kinds[k] : NULL; }
const ct_model_kind_ops *ct_model_kind_ops_(ct_model_kind k) { return kind_ops(k); }
int ct_model_kind_count(void) { return NKINDS; }
const ct_model_kind_info *ct_model_kind_info_of(ct_model_kind k) { return kind_ops(k) ? &kinds[k]->info : NULL; }

/* "mlp, cnn, gpt or llama" (or "CT_MODEL_MLP, ..." with enum_names) */
static const char *kinds_list(char *buf, size_t n, bool enum_names) {
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < NKINDS && o < n; k++) {
        const char *sep = k == 0 ? "" : k == NKINDS - 1 ? " or " : ", ";
        o += (size_t)snprintf(buf + o, n - o, "%s%s", sep, enum_names ? "CT_MODEL_" : "");
        for (const char *c = kinds[k]->info.name; *c && o + 1 < n; c++) buf[o++] = enum_names ? (char)toupper((unsigned char)*c) : *c;
        if (o < n) buf[o] = 0;
    }
    return buf;
}
const char *ct_model_kind_list(char *buf, size_t n) { return kinds_list(buf, n, false); }

/* every kind's part gets its defaults, so switching cfg.kind afterwards still works */
ct_model_config ct_model_default_config(ct_model_kind kind) {
    ct_model_config c;
    memset(&c, 0, sizeof c);
    for (int k = 0; k < NKINDS; k++) kinds[k]->defaults(&c);
    c.kind = kind;
    return c;
}

const char *ct_model_kind_name(ct_model_kind k) {
    const ct_model_kind_ops *ops = kind_ops(k);
    return ops ? ops->info.name : "?";
}

ct_status ct_model_kind_parse(const char *s, ct_model_kind *out) {
    for (int k = 0; k < NKINDS; k++)
        if (s && !strcasecmp(s, kinds[k]->info.name)) { *out = (ct_model_kind)k; return CT_OK; }
    char list[128];
    return ct_error(CT_ERR_INVALID, "unknown model '%s' (expected %s)", s ? s : "(null)", kinds_list(list, sizeof list, false));
}

ct_model_batch ct_model_batch_of(const ct_model_config *c) {
    ct_model_batch b = {.ignore_index = -100};
    const ct_model_kind_ops *ops = c ? kind_ops(c->kind) : NULL;
    if (ops && ops->batch) ops->batch(c, &b);
    return b;
}

ct_status ct_model_config_check(const ct_model_config *c) {
    if (!c) CT_MODEL_BAD("model config is NULL");
    const ct_model_kind_ops *ops = kind_ops(c->kind);
    char list[160];
    if (!ops) CT_MODEL_BAD("model kind %d unknown (expected %s)", (int)c->kind, kinds_list(list, sizeof list, true));
    return ops->check(c);
}

void ct_model_fmt_count_(char *buf, size_t n, double v) {
    char tmp[400];
    int len = snprintf(tmp, sizeof tmp, "%.0f", v), o = 0;
    for (int i = 0; i < len && (size_t)o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
}

static void describe(ct_model *m) {
    char cnt[32], arch[256];
    ct_model_fmt_count_(cnt, sizeof cnt, (double)m->nparams);
    m->kind->describe(&m->cfg, arch, sizeof arch);
    snprintf(m->desc, sizeof m->desc, "%s: %s parameters", arch, cnt);
}

/* The model's modules and the shapes of its tensors, without their weights: registering a
 * tensor records its shape, ct_params_finalize allocates (nn.h). */
static ct_status build_shapes(const ct_model_config *cfg, ct_model **out) {
    *out = NULL;
    ct_status st = ct_model_config_check(cfg);
    if (st != CT_OK) return st;
    ct_model *m = calloc(1, sizeof *m);
    if (!m) return ct_error(CT_ERR_NOMEM, "out of memory creating a model");
    m->cfg = *cfg;
    if (ct_params_create(&m->P) != CT_OK) { free(m); return ct_error(CT_ERR_NOMEM, "out of memory creating a model"); }
    m->kind = kind_ops(cfg->kind);
    m->kind->build(m);
    /* the builders do not check each allocation: out of memory shows here (nn.h) */
    st = ct_module_status(m->root);
    if (st != CT_OK) { ct_model_free(m); return st; }
    *out = m;
    return CT_OK;
}

static ct_status create(const ct_model_config *cfg, uint64_t seed, bool deferred, ct_model **out) {
    *out = NULL;
    ct_model *m;
    ct_status st = build_shapes(cfg, &m);
    if (st != CT_OK) return st;
    st = deferred ? ct_params_finalize_deferred(m->P, seed) : ct_params_finalize(m->P, seed);
    if (st != CT_OK) { ct_model_free(m); return st; }
    for (int i = 0; i < ct_params_count(m->P); i++) {
        ct_tensor *t = ct_params_get(m->P, i);
        if (t->flags & CT_TF_PARAM) m->nparams += ct_numel(t);
    }
    describe(m);
    *out = m;
    return CT_OK;
}

ct_status ct_model_create(const ct_model_config *cfg, uint64_t seed, ct_model **out) { return create(cfg, seed, false, out); }
ct_status ct_model_create_deferred(const ct_model_config *cfg, uint64_t seed, ct_model **out) {
    return create(cfg, seed, true, out);
}

ct_status ct_model_config_numel_(const ct_model_config *cfg, double *out) {
    ct_model *m;
    ct_status st = build_shapes(cfg, &m);
    if (st != CT_OK) return st;
    /* in double: a config's dimensions are bounded one by one, a product of four is not */
    double total = 0;
    for (int i = 0; i < ct_params_count(m->P); i++) {
        const ct_tensor *t = ct_params_get(m->P, i);
        double n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (double)t->shape[d];
        total += n;
    }
    ct_model_free(m);
    *out = total;
    return CT_OK;
}

void ct_model_free(ct_model *m) {
    if (!m) return;
    ct_module_free(m->root);
    ct_params_free(m->P);
    free(m);
}

ct_params *ct_model_params(ct_model *m) { return m->P; }
const ct_model_config *ct_model_config_of(const ct_model *m) { return &m->cfg; }
ct_module *ct_model_module(ct_model *m) { return m->root; }
int64_t ct_model_num_params(const ct_model *m) { return m->nparams; }
const char *ct_model_describe(const ct_model *m) { return m->desc; }

ct_tensor *ct_model_forward(ct_ctx *ctx, ct_model *m, ct_tensor *x) { return m->kind->forward(ctx, m, x); }

ct_tensor *ct_model_token_loss_(ct_ctx *ctx, const char *what, ct_tensor *logits, ct_tensor *x, ct_tensor *target,
                                int64_t ignore_index) {
    CT_CHECK(target->ndim == 2 && target->shape[0] == x->shape[0] && target->shape[1] == x->shape[1],
             "%s loss: target must be [B, T] = [%lld, %lld] like the input, got %d dims", what, (long long)x->shape[0],
             (long long)x->shape[1], target->ndim);
    int64_t V = logits->shape[2], N = x->shape[0] * x->shape[1];
    return ct_cross_entropy(ctx, ct_reshape(ctx, logits, 2, (int64_t[]){N, V}), ct_reshape(ctx, target, 1, &N), ignore_index);
}

ct_tensor *ct_model_loss(ct_ctx *ctx, ct_model *m, ct_tensor *x, ct_tensor *target) {
    if (m->kind->loss) return m->kind->loss(ctx, m, x, target);
    return ct_cross_entropy(ctx, ct_model_forward(ctx, m, x), target, -100);
}
