/* state_dict I/O: a parameter store (or a model) to and from a safetensors file, with
 * PyTorch's state_dict names. Loading is all-or-nothing: every name, shape and dtype is
 * checked before the first byte of the model changes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrain/io.h"
#include "models/hf_internal.h"

/* ---- the config as metadata ---- */
/* "ctrain.model" = kind and "ctrain.<key>" = value for each CT_OPT_META option: strings, as
 * the format's metadata must be */
ct_status ct_model_config_metadata_(ct_st_writer *w, const ct_model_config *c) {
    const ct_model_kind_info *k = ct_model_kind_info_of(c->kind);
    ct_status st = ct_st_writer_set_metadata(w, "ctrain.model", k->name);
    char key[96], val[CT_MLP_MAX_HIDDEN * 12 + 16], def[sizeof val];
    const ct_model_config d = ct_model_default_config(c->kind);
    for (int i = 0; i < k->noptions && st == CT_OK; i++) {
        const ct_model_option *o = &k->options[i];
        if (!(o->flags & CT_OPT_META)) continue;
        if ((o->flags & CT_OPT_META_SET) && !strcmp(ct_model_config_get(c, o, val, sizeof val), ct_model_config_get(&d, o, def, sizeof def)))
            continue;
        snprintf(key, sizeof key, "ctrain.%s", o->key);
        st = ct_st_writer_set_metadata(w, key, ct_model_config_get(c, o, val, sizeof val));
    }
    return st;
}

/* the inverse of add_config_metadata; CT_ERR_NOT_FOUND when the file has none */
static ct_status config_from_metadata(const ct_st_file *f, ct_model_config *c) {
    const char *kind = ct_st_metadata(f, "ctrain.model");
    if (!kind) return CT_ERR_NOT_FOUND;
    ct_model_kind kk;
    if (ct_model_kind_parse(kind, &kk) != CT_OK)
        return ct_error(CT_ERR_FORMAT, "%s: metadata ctrain.model = '%s' is no model this ctrain knows", ct_st_path(f), kind);
    *c = ct_model_default_config(kk);
    const ct_model_kind_info *k = ct_model_kind_info_of(kk);
    for (int i = 0; i < k->noptions; i++) {
        const ct_model_option *o = &k->options[i];
        if (!(o->flags & CT_OPT_META)) continue;
        char key[96];
        snprintf(key, sizeof key, "ctrain.%s", o->key);
        const char *v = ct_st_metadata(f, key);
        if (!v) continue; /* a field added after the file was written keeps its default */
        if (!ct_model_option_parse_(c, o, v))
            return ct_error(CT_ERR_FORMAT, "%s: metadata %s = '%s' is not a valid value", ct_st_path(f), key, v);
    }
    ct_status st = ct_model_config_check(c);
    if (st != CT_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", ct_last_error());
        return ct_error(CT_ERR_FORMAT, "%s: the model in its metadata is invalid: %s", ct_st_path(f), why);
    }
    return CT_OK;
}

ct_status ct_model_config_from_metadata(const ct_st_file *f, ct_model_config *cfg, double *numel) {
    ct_status st = config_from_metadata(f, cfg);
    if (st == CT_OK && numel) st = ct_model_config_numel_(cfg, numel);
    return st;
}

ct_status ct_model_write_config(const ct_model *m, ct_st_writer *w) { return ct_model_config_metadata_(w, &m->cfg); }

/* ---- save ---- */
static ct_status save_impl(const ct_params *P, const char *path, const char *alias, const ct_tensor *alias_of,
                           const ct_model_config *cfg, ct_st_fetch_fn fetch, void *user) {
    if (!path || !*path) return ct_error(CT_ERR_INVALID, "save: empty path");
    ct_st_writer *w;
    if (ct_st_writer_create(&w) != CT_OK) return ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    ct_status st = CT_OK;
    for (int i = 0; i < ct_params_count(P) && st == CT_OK; i++) {
        const ct_tensor *t = ct_params_get(P, i);
        if (!t->data) { st = ct_error(CT_ERR_INVALID, "%s: parameter store not finalised", path); break; }
        st = ct_st_writer_add(w, t->name, CT_F32, t->ndim, t->shape, t->data);
    }
    if (st == CT_OK && alias) st = ct_st_writer_add(w, alias, CT_F32, alias_of->ndim, alias_of->shape, alias_of->data);
    if (st == CT_OK) st = ct_st_writer_set_metadata(w, "format", "pt");
    if (st == CT_OK && cfg) st = ct_model_config_metadata_(w, cfg);
    ct_st_writer_set_fetch(w, fetch, user);
    if (st == CT_OK) st = ct_st_writer_save(w, path);
    ct_st_writer_free(w);
    return st;
}

ct_status ct_params_save(const ct_params *P, const char *path) { return save_impl(P, path, NULL, NULL, NULL, NULL, NULL); }

ct_status ct_model_save_fetch(const ct_model *m, const char *path, ct_st_fetch_fn fetch, void *user) {
    if (m->quantized) { /* its f32 Linear weights are stale */
        if (fetch) return ct_error(CT_ERR_UNSUPPORTED, "%s: a quantized model is saved whole, not fetched", path);
        return ct_model_save_quantized(m, path);
    }
    return save_impl(m->P, path, m->tied ? m->kind->tied_name : NULL, m->tied, &m->cfg, fetch, user); /* untied: no alias */
}
ct_status ct_model_save(const ct_model *m, const char *path) { return ct_model_save_fetch(m, path, NULL, NULL); }

ct_status ct_model_save_hf(const ct_model *m, const char *dir) {
    if (!m->kind->hf_save)
        return ct_error(CT_ERR_UNSUPPORTED, "%s: a %s has no Hugging Face layout", dir, m->kind->info.name);
    return m->kind->hf_save(m, dir);
}

/* ---- load ---- */
/* path itself, or for a directory (a Hugging Face model's) the model.safetensors in it */
static ct_status weights_file(const char *path, char *buf, size_t n, const char **out) {
    struct stat sb;
    *out = path;
    if (!path || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return CT_OK; /* ct_st_open says what is wrong */
    snprintf(buf, n, "%s/model.safetensors", path);
    *out = buf;
    if (access(buf, F_OK) == 0) return CT_OK;
    char idx[4300];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", path);
    if (access(idx, F_OK) == 0) {
        snprintf(buf, n, "%s/model.safetensors.index.json", path);
        return CT_OK;
    }
    return ct_error(CT_ERR_NOT_FOUND, "%s: a directory without model.safetensors (or model.safetensors.index.json)", path);
}

static bool ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

/* A sharded checkpoint: the index's weight_map names each tensor's shard, a file beside the
 * index (a name with a '/' could point anywhere: refused); the shards open as one file, and
 * every tensor the map names must be in its view */
static ct_status open_shards(const char *index, ct_st_file **out) {
    cJSON *j;
    ct_status st = ct_hf_read_json_(index, &j);
    if (st != CT_OK) return st;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *e;
    if (!cJSON_IsObject(map) || !map->child) st = ct_error(CT_ERR_FORMAT, "%s: no weight_map object naming the tensors' shards", index);
    const cJSON *walk = st == CT_OK ? map : NULL;
    int nmap = st == CT_OK ? cJSON_GetArraySize(map) : 0, n = 0;
    const char **files = calloc((size_t)nmap + 1, sizeof *files);
    if (st == CT_OK && !files) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", index);
    cJSON_ArrayForEach(e, walk) {
        if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..")) {
            st = ct_error(CT_ERR_FORMAT, "%s: weight_map['%s'] is no file name beside the index", index, e->string);
            break;
        }
        int k = 0;
        while (k < n && strcmp(files[k], e->valuestring)) k++;
        if (k == n) files[n++] = e->valuestring;
    }
    const char *slash = strrchr(index, '/');
    int dl = slash ? (int)(slash - index) + 1 : 0;
    char **paths = st == CT_OK ? calloc((size_t)n + 1, sizeof *paths) : NULL;
    if (st == CT_OK && !paths) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", index);
    for (int k = 0; k < n && st == CT_OK; k++) {
        size_t len = (size_t)dl + strlen(files[k]) + 1;
        if (!(paths[k] = malloc(len))) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", index);
        else snprintf(paths[k], len, "%.*s%s", dl, index, files[k]);
    }
    ct_st_file *f = NULL;
    if (st == CT_OK) st = ct_st_open_shards(index, (const char *const *)paths, n, &f);
    walk = st == CT_OK ? map : NULL;
    cJSON_ArrayForEach(e, walk) {
        ct_st_tensor t;
        if (ct_st_get(f, e->string, &t) == CT_ERR_NOT_FOUND) {
            st = ct_error(CT_ERR_FORMAT, "%s: weight_map's '%s' is in none of the shards", index, e->string);
            break;
        }
    }
    if (st == CT_OK && ct_st_count(f) != nmap)
        st = ct_error(CT_ERR_FORMAT, "%s: the shards hold %d tensors, its weight_map names %d", index, ct_st_count(f), nmap);
    for (int k = 0; paths && k < n; k++) free(paths[k]);
    free(paths);
    free(files);
    cJSON_Delete(j);
    if (st != CT_OK) ct_st_close(f);
    else *out = f;
    return st;
}

ct_status ct_model_open_weights_(const char *path, ct_st_file **out) {
    *out = NULL;
    if (path && ends_with(path, ".index.json")) return open_shards(path, out);
    return ct_st_open(path, out);
}

static const char *shape_s(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

static bool is_float(ct_dtype d) { return d == CT_F32 || d == CT_F16 || d == CT_BF16 || d == CT_F64; }

/* Check one file tensor against the expected shape; message names tensor and file. */
static ct_status check_tensor(const ct_st_file *f, const char *name, const ct_st_tensor *t, int ndim, const int64_t *shape) {
    char a[128], b[128];
    if (!is_float(t->dtype))
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float type (F32, F16, BF16 or F64)", ct_st_path(f),
                        name, ct_dtype_safetensors_name(t->dtype));
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same)
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model expects %s", ct_st_path(f), name,
                        shape_s(a, sizeof a, t->ndim, t->shape), shape_s(b, sizeof b, ndim, shape));
    return CT_OK;
}

static bool aligned(const ct_st_tensor *t) { return (uintptr_t)t->data % ct_dtype_size(t->dtype) == 0; }

/* tmp: room for an unaligned tensor's bytes (a writer that did not pad) */
static void copy_in(float *dst, const ct_st_tensor *t, size_t n, void *tmp) {
    if (aligned(t)) { ct_convert(dst, CT_F32, t->data, t->dtype, n); return; }
    memcpy(tmp, t->data, n * ct_dtype_size(t->dtype));
    ct_convert(dst, CT_F32, tmp, t->dtype, n);
}

/* alias: an extra accepted name that must have alias_of's shape (values ignored);
 * ignore (may be NULL): further names in the file to skip. */
static ct_status load_impl(ct_params *P, const char *path, const char *alias, const ct_tensor *alias_of,
                           bool (*ignore)(const char *name)) {
    ct_st_file *f = NULL;
    ct_status st = ct_model_open_weights_(path, &f);
    if (st != CT_OK) return st;
    int np = ct_params_count(P);
    ct_st_tensor *src = calloc((size_t)(np ? np : 1), sizeof *src);
    if (!src) { ct_st_close(f); return ct_error(CT_ERR_NOMEM, "%s: out of memory", path); }

    /* 1. every model tensor present, float, same shape */
    char missing[512] = "";
    int nmissing = 0;
    for (int i = 0; i < np && st == CT_OK; i++) {
        const ct_tensor *t = ct_params_get(P, i);
        ct_status g = ct_st_get(f, t->name, &src[i]);
        if (g == CT_ERR_NOT_FOUND) {
            if (nmissing++ < 6) {
                size_t o = strlen(missing);
                snprintf(missing + o, sizeof missing - o, "%s'%s'", o ? ", " : "", t->name);
            }
            continue;
        }
        if (g != CT_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", ct_last_error());
            st = ct_error(g, "%s: tensor '%s': %s", path, t->name, why);
            break;
        }
        st = check_tensor(f, t->name, &src[i], t->ndim, t->shape);
    }
    if (st == CT_OK && nmissing)
        st = ct_error(CT_ERR_FORMAT, "%s: %d tensor%s of the model missing from the file: %s%s", path, nmissing, nmissing > 1 ? "s" : "",
                      missing, nmissing > 6 ? ", ..." : "");

    /* 2. nothing in the file the model does not have */
    if (st == CT_OK) {
        char extra[512] = "";
        int nextra = 0;
        for (int j = 0; j < ct_st_count(f) && st == CT_OK; j++) {
            const char *name = ct_st_name(f, j);
            if (ct_params_find(P, name)) continue;
            if (alias && !strcmp(name, alias)) {
                ct_st_tensor t;
                st = ct_st_get(f, name, &t);
                if (st == CT_OK) st = check_tensor(f, name, &t, alias_of->ndim, alias_of->shape);
                continue;
            }
            if (ignore && ignore(name)) continue;
            if (nextra++ < 6) {
                size_t o = strlen(extra);
                snprintf(extra + o, sizeof extra - o, "%s'%s'", o ? ", " : "", name);
            }
        }
        if (st == CT_OK && nextra)
            st = ct_error(CT_ERR_FORMAT, "%s: %d tensor%s in the file the model does not have: %s%s", path, nextra, nextra > 1 ? "s" : "",
                          extra, nextra > 6 ? ", ..." : "");
    }

    /* 3. all checked: copy (the one allocation first, so that nothing changes on failure) */
    void *tmp = NULL;
    if (st == CT_OK) {
        size_t most = 0;
        for (int i = 0; i < np; i++)
            if (!aligned(&src[i]) && src[i].nbytes > most) most = src[i].nbytes;
        if (most && !(tmp = malloc(most))) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    }
    if (st == CT_OK)
        for (int i = 0; i < np; i++) {
            ct_tensor *t = ct_params_get(P, i);
            copy_in(t->data, &src[i], (size_t)ct_numel(t), tmp);
        }
    free(tmp);
    free(src);
    ct_st_close(f);
    return st;
}

ct_status ct_params_load(ct_params *P, const char *path) { return load_impl(P, path, NULL, NULL, NULL); }

ct_status ct_model_load(ct_model *m, const char *path) {
    return load_impl(m->P, path, m->tied ? m->kind->tied_name : NULL, m->tied, m->kind->load_ignores);
}

ct_status ct_model_load_layout(ct_model *m, const char *path, ct_weights_layout layout) {
    char buf[4200];
    ct_status st = weights_file(path, buf, sizeof buf, &path);
    if (st != CT_OK) return st;
    if (layout == CT_LAYOUT_CTRAIN) return ct_model_load(m, path);
    if (!m->kind->hf_load)
        return ct_error(CT_ERR_UNSUPPORTED, "%s: a %s has no Hugging Face layout", path, m->kind->info.name);
    return m->kind->hf_load(m, path);
}

/* ---- a model from a file alone ---- */

/* Every tensor of a model must be in its file with its shape, so the model a config
 * describes holds no more values than the file's float tensors: checked from the header and
 * the shapes alone, before anything the size of the model is allocated, so that a small
 * file (or an edit of its metadata or config.json) cannot ask for gigabytes. `what` says
 * where the config came from, for the message ("its metadata describes"). */
static ct_status check_fits(const ct_st_file *f, const ct_model_config *c, const char *what) {
    double need, have = 0;
    ct_status st = ct_model_config_numel_(c, &need);
    if (st != CT_OK) return st;
    for (int j = 0; j < ct_st_count(f); j++) {
        ct_st_tensor t;
        /* a quantized model's int8 weights hold one value each */
        if (ct_st_get(f, ct_st_name(f, j), &t) == CT_OK && (is_float(t.dtype) || t.dtype == CT_I8))
            have += (double)(t.nbytes / ct_dtype_size(t.dtype));
    }
    if (need <= have) return CT_OK;
    char a[64], b[64];
    ct_model_fmt_count_(a, sizeof a, need);
    ct_model_fmt_count_(b, sizeof b, have);
    return ct_error(CT_ERR_FORMAT, "%s: %s a %s of %s parameters but the file holds %s float values: the model does not match the weights",
                    ct_st_path(f), what, ct_model_kind_name(c->kind), a, b);
}

ct_status ct_model_config_fits_file(const ct_model_config *cfg, const char *path, const char *what) {
    char buf[4200];
    ct_status st = weights_file(path, buf, sizeof buf, &path);
    if (st != CT_OK) return st;
    ct_st_file *f = NULL;
    st = ct_model_open_weights_(path, &f);
    if (st != CT_OK) return st;
    st = check_fits(f, cfg, what ? what : "the config describes");
    ct_st_close(f);
    return st;
}

ct_status ct_model_config_from_file(const char *path, ct_model_config *cfg, ct_weights_layout *layout) {
    char buf[4200];
    ct_status st = weights_file(path, buf, sizeof buf, &path);
    if (st != CT_OK) return st;
    ct_st_file *f = NULL;
    st = ct_model_open_weights_(path, &f);
    if (st != CT_OK) return st;
    ct_weights_layout lay = CT_LAYOUT_CTRAIN;
    st = config_from_metadata(f, cfg);
    const char *what = "its metadata describes";
    /* no metadata: the first kind that recognises the tensors (and the config.json beside) */
    if (st == CT_ERR_NOT_FOUND) {
        char cj[4200];
        ct_model_config_json_path_(path, cj, sizeof cj);
        what = access(cj, F_OK) == 0 ? "its config.json describes" : "its tensors describe";
    }
    for (int k = 0; st == CT_ERR_NOT_FOUND && k < ct_model_kind_count(); k++) {
        const ct_model_kind_ops *ops = ct_model_kind_ops_((ct_model_kind)k);
        if (ops->from_tensors) st = ops->from_tensors(f, cfg, &lay);
    }
    if (st == CT_ERR_NOT_FOUND)
        st = ct_error(CT_ERR_FORMAT, "%s: no ctrain model metadata and no tensors of a model ctrain knows "
                      "(a GPT's transformer.wte.weight, a Llama's model.embed_tokens.weight): not a model ctrain saved nor a Hugging Face checkpoint", path);
    if (st == CT_OK) st = check_fits(f, cfg, what);
    ct_st_close(f);
    if (st == CT_OK && layout) *layout = lay;
    return st;
}

static bool is_quantized_file(const char *path) {
    char buf[4200];
    ct_st_file *f;
    if (weights_file(path, buf, sizeof buf, &path) != CT_OK || ends_with(path, ".index.json") || ct_st_open(path, &f) != CT_OK) return false;
    const char *q = ct_st_metadata(f, "quantization");
    bool yes = q && !strcmp(q, "dynamic");
    ct_st_close(f);
    return yes;
}

ct_status ct_model_open(const char *path, ct_model **out) {
    *out = NULL;
    ct_model_config cfg;
    ct_weights_layout lay;
    ct_status st = ct_model_config_from_file(path, &cfg, &lay);
    if (st != CT_OK) return st;
    ct_model *m;
    if ((st = ct_model_create(&cfg, 0, &m)) != CT_OK) return st;
    /* a file of ct_model_save_quantized (its metadata has the config too) */
    st = is_quantized_file(path) ? ct_model_load_quantized(m, path) : ct_model_load_layout(m, path, lay);
    if (st != CT_OK) { ct_model_free(m); return st; }
    *out = m;
    return CT_OK;
}
