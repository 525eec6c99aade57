/* Dynamic int8 quantization of a built-in model: conversion (nn's ct_quantize_dynamic on the
 * module tree), size, and the quantized safetensors layout (models.h), loaded all-or-nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/io.h"
#include "models/model_internal.h"

ct_status ct_model_quantize_dynamic(ct_model *m, const ct_quantize_opts *opts) {
    if (m->quantized) return ct_error(CT_ERR_INVALID, "model is already quantized");
    ct_quantize_opts o = opts ? *opts : ct_quantize_default_opts();
    int n = 0;
    ct_status st = ct_quantize_dynamic(m->root, &o, &n);
    /* converted Linears stay converted on failure (nn.h), so the model counts as quantized */
    m->quantized = n > 0 || st == CT_OK;
    m->per_channel = o.per_channel;
    return st;
}

bool ct_model_is_quantized(const ct_model *m) { return m->quantized; }

/* the quantized Linears of the tree, in module order (at most cap; returns the count) */
static int collect(ct_module *mod, ct_module **out, int cap, int n) {
    if (ct_module_is_qlinear(mod)) {
        if (n < cap) out[n] = mod;
        return n + 1;
    }
    for (int i = 0; i < mod->nchildren; i++) n = collect(mod->children[i], out, cap, n);
    return n;
}

/* ql: n quantized Linears; true when parameter t was one of their f32 weight or bias */
static bool replaced(const ct_tensor *t, ct_module *const *ql, int n) {
    size_t len;
    for (int i = 0; i < n; i++) {
        const char *nm = ql[i]->name;
        len = strlen(nm);
        if (len && strncmp(t->name, nm, len) == 0 && (!strcmp(t->name + len, ".weight") || !strcmp(t->name + len, ".bias")))
            return true;
    }
    return false;
}

/* the quantized Linears as a malloc'd array (*n entries), or NULL with *n = -1 when out of memory */
static ct_module **qlinears(const ct_model *m, int *n) {
    int k = collect(m->root, NULL, 0, 0);
    ct_module **ql = malloc((size_t)(k ? k : 1) * sizeof *ql);
    if (!ql) { *n = -1; return NULL; }
    *n = collect(m->root, ql, k, 0);
    return ql;
}

size_t ct_model_weight_bytes(const ct_model *m) {
    int n;
    ct_module **ql = m->quantized ? qlinears(m, &n) : NULL;
    if (!ql) n = 0;
    size_t bytes = 0;
    for (int i = 0; i < ct_params_count(m->P); i++) {
        const ct_tensor *t = ct_params_get(m->P, i);
        if ((t->flags & CT_TF_PARAM) && !replaced(t, ql, n)) bytes += ct_nbytes(t);
    }
    for (int i = 0; i < n; i++)
        bytes += ct_qweight_bytes(ct_qlinear_weight(ql[i])) + (ct_qlinear_bias(ql[i]) ? (size_t)ql[i]->hp[1] * sizeof(float) : 0);
    free(ql);
    return bytes;
}

static const char *leaf(char *buf, size_t n, const char *prefix, const char *suffix) {
    snprintf(buf, n, "%s.%s", prefix, suffix);
    return buf;
}

ct_status ct_model_save_quantized(const ct_model *m, const char *path) {
    if (!m->quantized) return ct_error(CT_ERR_INVALID, "%s: the model is not quantized (ct_model_quantize_dynamic)", path);
    int n;
    ct_module **ql = qlinears(m, &n);
    int64_t *zeros = NULL;
    int64_t most = 1;
    for (int i = 0; i < n; i++) most = ql[i]->hp[1] > most ? ql[i]->hp[1] : most;
    ct_st_writer *w = NULL;
    if (!ql || !(zeros = calloc((size_t)most, sizeof *zeros)) || ct_st_writer_create(&w) != CT_OK) {
        free(ql); free(zeros);
        return ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    }
    ct_status st = CT_OK;
    for (int i = 0; i < ct_params_count(m->P) && st == CT_OK; i++) {
        const ct_tensor *t = ct_params_get(m->P, i);
        if (!replaced(t, ql, n)) st = ct_st_writer_add(w, t->name, CT_F32, t->ndim, t->shape, t->data);
    }
    char nm[CT_NN_NAME_MAX + 32];
    for (int i = 0; i < n && st == CT_OK; i++) {
        const ct_qweight *qw = ct_qlinear_weight(ql[i]);
        int64_t ns, shape[2] = {ct_qweight_out(qw), ct_qweight_in(qw)};
        const float *sc = ct_qweight_scales(qw, &ns);
        st = ct_st_writer_add(w, leaf(nm, sizeof nm, ql[i]->name, "weight"), CT_I8, 2, shape, ct_qweight_int8(qw));
        if (st == CT_OK) st = ct_st_writer_add(w, leaf(nm, sizeof nm, ql[i]->name, "weight_scale"), CT_F32, 1, &ns, sc);
        if (st == CT_OK) st = ct_st_writer_add(w, leaf(nm, sizeof nm, ql[i]->name, "weight_zero_point"), CT_I64, 1, &ns, zeros);
        if (st == CT_OK && ct_qlinear_bias(ql[i]))
            st = ct_st_writer_add(w, leaf(nm, sizeof nm, ql[i]->name, "bias"), CT_F32, 1, shape, ct_qlinear_bias(ql[i]));
    }
    const char *meta[][2] = {{"format", "pt"}, {"quantization", "dynamic"}, {"dtype", "qint8"},
                             {"qscheme", m->per_channel ? "per_channel_symmetric" : "per_tensor_symmetric"},
                             {"activation", "quint8_reduce_range"}, {"model", m->kind->info.name}};
    for (size_t i = 0; i < sizeof meta / sizeof *meta && st == CT_OK; i++) st = ct_st_writer_set_metadata(w, meta[i][0], meta[i][1]);
    /* the config too, so that the file opens alone (ct_model_open: eval, generate) */
    if (st == CT_OK) st = ct_model_config_metadata_(w, &m->cfg);
    if (st == CT_OK) st = ct_st_writer_save(w, path);
    ct_st_writer_free(w);
    free(zeros);
    free(ql);
    return st;
}

/* ---- load ---- */

/* tensor `name` of dtype dt and the given shape, or CT_ERR_FORMAT naming it */
static ct_status want(ct_st_file *f, const char *name, ct_dtype dt, int ndim, const int64_t *shape, ct_st_tensor *t) {
    ct_status st = ct_st_get(f, name, t);
    if (st == CT_ERR_NOT_FOUND) return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' missing", ct_st_path(f), name);
    if (st != CT_OK) return ct_error(CT_ERR_FORMAT, "%s: tensor '%s': %s", ct_st_path(f), name, ct_last_error());
    bool same = t->dtype == dt && t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same)
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' is not %s with the model's shape (%d dims of %s)", ct_st_path(f), name,
                        ct_dtype_safetensors_name(dt), t->ndim, ct_dtype_safetensors_name(t->dtype));
    return CT_OK;
}

/* unaligned-safe copy out of the mapped file */
static void *dup_bytes(const ct_st_tensor *t) {
    void *p = malloc(t->nbytes ? t->nbytes : 1);
    if (p) memcpy(p, t->data, t->nbytes);
    return p;
}

ct_status ct_model_load_quantized(ct_model *m, const char *path) {
    ct_st_file *f;
    ct_status st = ct_st_open(path, &f);
    if (st != CT_OK) return st;
    const char *q = ct_st_metadata(f, "quantization"), *qs = ct_st_metadata(f, "qscheme");
    bool pc = qs && !strcmp(qs, "per_channel_symmetric");
    if (!q || strcmp(q, "dynamic") || !qs || (!pc && strcmp(qs, "per_tensor_symmetric"))) {
        ct_st_close(f);
        return ct_error(CT_ERR_FORMAT, "%s: not a dynamically quantized model (metadata quantization=dynamic and a symmetric qscheme expected)", path);
    }
    if (m->quantized && m->per_channel != pc) {
        ct_st_close(f);
        return ct_error(CT_ERR_INVALID, "%s: the file is %s, the model was quantized otherwise", path, qs);
    }
    if (!m->quantized) {
        ct_quantize_opts o = {.per_channel = pc};
        if ((st = ct_model_quantize_dynamic(m, &o)) != CT_OK) { ct_st_close(f); return st; }
    }
    int n;
    ct_module **ql = qlinears(m, &n);
    ct_qweight **neww = ql ? calloc((size_t)(n ? n : 1), sizeof *neww) : NULL;
    float **newb = ql ? calloc((size_t)(n ? n : 1), sizeof *newb) : NULL;
    if (!ql || !neww || !newb) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    /* 1. check everything and build the new int8 weights; the model is not touched */
    int expected = 0;
    ct_st_tensor t;
    char nm[CT_NN_NAME_MAX + 32];
    for (int i = 0; i < ct_params_count(m->P) && st == CT_OK; i++) {
        const ct_tensor *p = ct_params_get(m->P, i);
        if (replaced(p, ql, n)) continue;
        expected++;
        st = want(f, p->name, CT_F32, p->ndim, p->shape, &t);
    }
    for (int i = 0; i < n && st == CT_OK; i++) {
        int64_t out = ql[i]->hp[1], in = ql[i]->hp[0], shape[2] = {out, in}, ns = pc ? out : 1;
        ct_st_tensor tw, ts, tz;
        st = want(f, leaf(nm, sizeof nm, ql[i]->name, "weight"), CT_I8, 2, shape, &tw);
        if (st == CT_OK) st = want(f, leaf(nm, sizeof nm, ql[i]->name, "weight_scale"), CT_F32, 1, &ns, &ts);
        if (st == CT_OK) st = want(f, leaf(nm, sizeof nm, ql[i]->name, "weight_zero_point"), CT_I64, 1, &ns, &tz);
        for (int64_t k = 0; st == CT_OK && k < ns; k++) {
            int64_t z;
            memcpy(&z, (const char *)tz.data + k * 8, 8);
            if (z != 0) st = ct_error(CT_ERR_FORMAT, "%s: '%s' is not zero: only symmetric weights are supported", path, nm);
        }
        expected += 3;
        if (st == CT_OK && ct_qlinear_bias(ql[i])) {
            expected++;
            st = want(f, leaf(nm, sizeof nm, ql[i]->name, "bias"), CT_F32, 1, &out, &t);
            if (st == CT_OK && !(newb[i] = dup_bytes(&t))) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
        }
        if (st == CT_OK) {
            int8_t *qv = dup_bytes(&tw);
            float *sv = dup_bytes(&ts);
            st = qv && sv ? ct_qweight_from_int8(qv, out, in, sv, ns, &neww[i]) : ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
            free(qv); free(sv);
        }
    }
    if (st == CT_OK && ct_st_count(f) != expected)
        st = ct_error(CT_ERR_FORMAT, "%s: %d tensors in the file, the quantized model has %d", path, ct_st_count(f), expected);
    /* 2. apply: f32 parameters copied, int8 weights swapped in (ct_qlinear_set copies the
     * bias; its one allocation is the only thing left that can fail) */
    for (int i = 0; i < ct_params_count(m->P) && st == CT_OK; i++) {
        ct_tensor *p = ct_params_get(m->P, i);
        if (replaced(p, ql, n)) continue;
        ct_st_get(f, p->name, &t);
        memcpy(p->data, t.data, t.nbytes);
    }
    for (int i = 0; i < n && st == CT_OK; i++) {
        st = ct_qlinear_set(ql[i], neww[i], newb[i]);
        neww[i] = NULL;
    }
    for (int i = 0; neww && i < n; i++) ct_qweight_free(neww[i]);
    for (int i = 0; newb && i < n; i++) free(newb[i]);
    free(neww); free(newb); free(ql);
    ct_st_close(f);
    return st;
}
