/* GPT-2 weights in Hugging Face's layout (GPT2LMHeadModel's state_dict, as save_pretrained
 * writes it) in and out, and the GPT config of a file that has no ctrain metadata.
 *
 * The two layouts differ in the four projections only: Hugging Face keeps them as Conv1D,
 * weight [in, out] (x @ W), ctrain as nn.Linear, weight [out, in]; everything else has the
 * same name and shape. Hugging Face may also drop the "transformer." prefix (GPT2Model) and
 * save the attention mask buffers "attn.bias" / "attn.masked_bias". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/io.h"
#include "models/hf_internal.h"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* the four projection weights that Conv1D stores transposed */
static bool is_conv1d(const char *name) {
    return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") || ends_with(name, ".mlp.c_fc.weight") ||
           ends_with(name, ".mlp.c_proj.weight");
}

static bool is_hf_buffer(const char *name) { return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"); }

/* "transformer.h.0.ln_1.weight" in f under that name or without "transformer." */
static ct_status find(const ct_st_file *f, const char *name, ct_st_tensor *t) {
    ct_status st = ct_st_get(f, name, t);
    if (st == CT_ERR_NOT_FOUND && !strncmp(name, "transformer.", 12)) st = ct_st_get(f, name + 12, t);
    return st;
}

static bool has(const ct_st_file *f, const char *name) {
    ct_st_tensor t;
    return find(f, name, &t) == CT_OK;
}

/* ---- config ---- */

/* Hugging Face's GPT2Config fields that change the model */
static ct_status read_config_json(const char *path, ct_model_config *c) {
    cJSON *j;
    ct_status st = ct_hf_read_json_(path, &j);
    if (st != CT_OK) return st;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (cJSON_IsString(mt) && strcmp(mt->valuestring, "gpt2"))
        st = ct_error(CT_ERR_UNSUPPORTED, "%s: model_type '%s': ctrain reads GPT-2 (gpt2) checkpoints only", path, mt->valuestring);
    ct_hf_json_int_(j, "n_layer", &c->gpt.n_layer, &st, path);
    ct_hf_json_int_(j, "n_embd", &c->gpt.n_embd, &st, path);
    ct_hf_json_int_(j, "n_head", &c->gpt.n_head, &st, path);
    if (!ct_hf_json_int_(j, "n_positions", &c->gpt.block_size, &st, path)) ct_hf_json_int_(j, "n_ctx", &c->gpt.block_size, &st, path);
    ct_hf_json_int_(j, "vocab_size", &c->gpt.vocab_size, &st, path);
    ct_hf_json_float_(j, "layer_norm_epsilon", 0, 1, &c->gpt.ln_eps, &st, path);
    /* ctrain's one dropout serves GPT-2's embedding and residual ones (equal in GPT-2's configs: 0.1) */
    float embd = -1;
    ct_hf_json_float_(j, "embd_pdrop", 0, 1, &embd, &st, path);
    if (!ct_hf_json_float_(j, "resid_pdrop", 0, 1, &c->gpt.dropout, &st, path) && embd >= 0) c->gpt.dropout = embd;
    ct_hf_json_float_(j, "attn_pdrop", 0, 1, &c->gpt.attn_pdrop, &st, path);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "activation_function");
    if (st == CT_OK && cJSON_IsString(act)) {
        const char *a = act->valuestring;
        /* gelu_fast is the same tanh formula written differently */
        if (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_pytorch_tanh") || !strcmp(a, "gelu_fast")) c->gpt.gelu_tanh = true;
        else if (!strcmp(a, "gelu")) c->gpt.gelu_tanh = false;
        else st = ct_error(CT_ERR_UNSUPPORTED, "%s: activation_function '%s' (ctrain has gelu and gelu_new)", path, a);
    }
    int inner;
    if (ct_hf_json_int_(j, "n_inner", &inner, &st, path) && (double)inner != 4.0 * c->gpt.n_embd)
        st = ct_error(CT_ERR_UNSUPPORTED, "%s: n_inner %d (ctrain's MLP is 4 x n_embd)", path, inner);
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(j, "scale_attn_by_inverse_layer_idx");
    if (st == CT_OK && cJSON_IsTrue(idx)) st = ct_error(CT_ERR_UNSUPPORTED, "%s: scale_attn_by_inverse_layer_idx is not supported", path);
    cJSON_Delete(j);
    return st;
}

ct_status ct_gpt_config_from_tensors_(const ct_st_file *f, ct_model_config *c, ct_weights_layout *layout) {
    const char *path = ct_st_path(f);
    ct_st_tensor wte, wpe, attn;
    if (find(f, "transformer.wte.weight", &wte) != CT_OK || find(f, "transformer.wpe.weight", &wpe) != CT_OK)
        return CT_ERR_NOT_FOUND; /* no GPT: model_io.c says what the file is not */
    if (wte.ndim != 2 || wpe.ndim != 2 || wte.shape[1] != wpe.shape[1])
        return ct_error(CT_ERR_FORMAT, "%s: wte and wpe must be 2-D matrices of the same width", path);
    *c = ct_model_default_config(CT_MODEL_GPT);
    int64_t C = wte.shape[1];
    c->gpt.n_embd = (int)C;
    c->gpt.vocab_size = (int)wte.shape[0];
    c->gpt.block_size = (int)wpe.shape[0];
    char nm[96];
    int L = 0;
    for (;; L++) {
        snprintf(nm, sizeof nm, "transformer.h.%d.ln_1.weight", L);
        if (!has(f, nm) || L > 1024) break;
    }
    c->gpt.n_layer = L;
    c->gpt.bias = has(f, "transformer.h.0.ln_1.bias");
    if (L == 0 || find(f, "transformer.h.0.attn.c_attn.weight", &attn) != CT_OK || attn.ndim != 2)
        return ct_error(CT_ERR_FORMAT, "%s: a GPT without blocks (no transformer.h.0.attn.c_attn.weight)", path);
    if (attn.shape[0] == C && attn.shape[1] == 3 * C) *layout = CT_LAYOUT_HF_GPT2;
    else if (attn.shape[0] == 3 * C && attn.shape[1] == C) *layout = CT_LAYOUT_CTRAIN;
    else
        return ct_error(CT_ERR_FORMAT, "%s: h.0.attn.c_attn.weight is [%lld, %lld], expected [%lld, %lld] (GPT-2) or [%lld, %lld]", path,
                        (long long)attn.shape[0], (long long)attn.shape[1], (long long)C, (long long)(3 * C), (long long)(3 * C),
                        (long long)C);
    /* GPT-2's head size is 64 in every size OpenAI released; a nanoGPT state_dict has no
     * such rule, so without ctrain's metadata its heads must come from a config.json */
    bool hf = *layout == CT_LAYOUT_HF_GPT2;
    c->gpt.n_head = hf && C % 64 == 0 ? (int)(C / 64) : 0;
    c->gpt.gelu_tanh = hf; /* GPT2Config's default activation_function is gelu_new */
    char cj[4200];
    ct_model_config_json_path_(path, cj, sizeof cj);
    if (access(cj, F_OK) == 0) {
        ct_status st = read_config_json(cj, c);
        if (st != CT_OK) return st;
    }
    if (c->gpt.n_head <= 0)
        return ct_error(CT_ERR_FORMAT, "%s: the number of attention heads is not in the file (a GPT saved without ctrain's "
                        "metadata): put a config.json with n_head beside it", path);
    return ct_hf_config_check_(c, path);
}

/* ---- load ---- */

static bool is_float(ct_dtype d) { return d == CT_F32 || d == CT_F16 || d == CT_BF16 || d == CT_F64; }

static const char *shape_s(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* file tensor t for model tensor p (expected transposed when conv1d) */
static ct_status check(const char *path, const char *name, const ct_st_tensor *t, const ct_tensor *p, bool conv1d) {
    int64_t want[2] = {p->shape[0], p->ndim > 1 ? p->shape[1] : 0};
    if (conv1d) { want[0] = p->shape[1]; want[1] = p->shape[0]; }
    char a[64], b[64];
    if (!is_float(t->dtype))
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float type", path, name, ct_dtype_safetensors_name(t->dtype));
    bool same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == (p->ndim == 2 ? want[d] : p->shape[d]);
    if (!same)
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model expects %s%s", path, name, shape_s(a, sizeof a, t->ndim, t->shape),
                        shape_s(b, sizeof b, p->ndim, p->ndim == 2 ? want : p->shape), conv1d ? " (Conv1D: [in, out])" : "");
    return CT_OK;
}

ct_status ct_gpt_load_hf(ct_model *m, const char *path) {
    if (m->cfg.kind != CT_MODEL_GPT) return ct_error(CT_ERR_INVALID, "%s: a GPT-2 checkpoint loads into a GPT, not a %s", path, m->kind->info.name);
    ct_st_file *f = NULL;
    ct_status st = ct_model_open_weights_(path, &f);
    if (st != CT_OK) return st;
    int np = ct_params_count(m->P);
    ct_st_tensor *src = calloc((size_t)np, sizeof *src);
    if (!src) { ct_st_close(f); return ct_error(CT_ERR_NOMEM, "%s: out of memory", path); }
    size_t most_raw = 1, most_numel = 1;
    /* 1. every tensor of the model present with its shape (transposed for Conv1D) */
    for (int i = 0; i < np && st == CT_OK; i++) {
        const ct_tensor *p = ct_params_get(m->P, i);
        ct_status g = find(f, p->name, &src[i]);
        if (g == CT_ERR_NOT_FOUND) st = ct_error(CT_ERR_FORMAT, "%s: tensor '%s' of the model missing from the file", path, p->name);
        else if (g != CT_OK) st = ct_error(g, "%s: tensor '%s': %s", path, p->name, ct_status_str(g));
        else st = check(path, p->name, &src[i], p, is_conv1d(p->name));
        if (st == CT_OK && src[i].nbytes > most_raw) most_raw = src[i].nbytes;
        if (st == CT_OK && (size_t)ct_numel(p) > most_numel) most_numel = (size_t)ct_numel(p);
    }
    /* 2. nothing else but the tied head and the attention buffers */
    for (int j = 0; j < ct_st_count(f) && st == CT_OK; j++) {
        const char *name = ct_st_name(f, j);
        char full[256];
        snprintf(full, sizeof full, "%s%s", strncmp(name, "transformer.", 12) && strcmp(name, "lm_head.weight") ? "transformer." : "", name);
        if (ct_params_find(m->P, full) || is_hf_buffer(name)) continue;
        if (!strcmp(name, "lm_head.weight")) {
            ct_st_tensor t, wte;
            st = ct_st_get(f, name, &t);
            if (st == CT_OK) st = check(path, name, &t, m->tied, false);
            /* ctrain's head is wte itself: a head trained apart from it cannot be kept */
            if (st == CT_OK && find(f, "transformer.wte.weight", &wte) == CT_OK &&
                (wte.dtype != t.dtype || memcmp(wte.data, t.data, t.nbytes)))
                st = ct_error(CT_ERR_FORMAT, "%s: lm_head.weight differs from wte.weight: an untied LM head, which ctrain's GPT "
                              "(head tied to wte) cannot hold", path);
            continue;
        }
        st = ct_error(CT_ERR_FORMAT, "%s: tensor '%s' in the file is not part of GPT-2", path, name);
    }
    /* 3. copy: raw bytes (the file's data may be unaligned) → f32 → (transposed) into the model */
    char *raw = st == CT_OK ? malloc(most_raw) : NULL;
    float *conv = st == CT_OK ? malloc(most_numel * sizeof *conv) : NULL;
    if (st == CT_OK && (!raw || !conv)) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < np && st == CT_OK; i++) {
        ct_tensor *p = ct_params_get(m->P, i);
        size_t n = (size_t)ct_numel(p);
        memcpy(raw, src[i].data, src[i].nbytes);
        if (!is_conv1d(p->name)) { ct_convert(p->data, CT_F32, raw, src[i].dtype, n); continue; }
        ct_convert(conv, CT_F32, raw, src[i].dtype, n);
        float *dst = p->data;
        int64_t in = p->shape[1], out = p->shape[0]; /* file [in, out] → model [out, in] */
        for (int64_t r = 0; r < in; r++)
            for (int64_t c = 0; c < out; c++) dst[c * in + r] = conv[r * out + c];
    }
    free(raw);
    free(conv);
    free(src);
    ct_st_close(f);
    return st;
}

/* ---- save ---- */

static ct_status write_config_json(const ct_model_config *c, const char *path) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "n_layer", c->gpt.n_layer);
    cJSON_AddNumberToObject(j, "n_embd", c->gpt.n_embd);
    cJSON_AddNumberToObject(j, "n_head", c->gpt.n_head);
    cJSON_AddNumberToObject(j, "n_positions", c->gpt.block_size);
    cJSON_AddNumberToObject(j, "n_ctx", c->gpt.block_size);
    cJSON_AddNumberToObject(j, "vocab_size", c->gpt.vocab_size);
    cJSON_AddStringToObject(j, "activation_function", c->gpt.gelu_tanh ? "gelu_new" : "gelu");
    /* the float's short text (1e-05, not 9.99999975e-06) where it reads back as the same float */
    ct_hf_json_add_float_(j, "layer_norm_epsilon", c->gpt.ln_eps > 0 ? c->gpt.ln_eps : 1e-5f);
    ct_hf_json_add_float_(j, "resid_pdrop", c->gpt.dropout);
    ct_hf_json_add_float_(j, "embd_pdrop", c->gpt.dropout);
    ct_hf_json_add_float_(j, "attn_pdrop", c->gpt.attn_pdrop);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", true);
    /* GPT-2's <|endoftext|> where the vocabulary has it; none in a byte-level model */
    if (c->gpt.vocab_size > 50256) {
        cJSON_AddNumberToObject(j, "bos_token_id", 50256);
        cJSON_AddNumberToObject(j, "eos_token_id", 50256);
    } else {
        cJSON_AddNullToObject(j, "bos_token_id");
        cJSON_AddNullToObject(j, "eos_token_id");
    }
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return ct_hf_write_json_(j, path);
}

ct_status ct_gpt_save_hf(const ct_model *m, const char *dir) {
    if (m->cfg.kind != CT_MODEL_GPT) return ct_error(CT_ERR_INVALID, "Hugging Face export: the model is a %s, not a GPT", m->kind->info.name);
    if (!m->cfg.gpt.bias) return ct_error(CT_ERR_UNSUPPORTED, "Hugging Face export: GPT-2 has biases; this GPT was built without (bias=False)");
    ct_status st = ct_hf_mkdirs_(dir);
    if (st != CT_OK) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int np = ct_params_count(m->P);
    size_t total = 0;
    for (int i = 0; i < np; i++) {
        const ct_tensor *p = ct_params_get(m->P, i);
        if (is_conv1d(p->name)) total += (size_t)ct_numel(p);
    }
    float *tr = malloc((total ? total : 1) * sizeof *tr);
    ct_st_writer *w = NULL;
    if (!tr || ct_st_writer_create(&w) != CT_OK) { free(tr); return ct_error(CT_ERR_NOMEM, "%s: out of memory", path); }
    size_t o = 0;
    for (int i = 0; i < np && st == CT_OK; i++) {
        const ct_tensor *p = ct_params_get(m->P, i);
        if (!is_conv1d(p->name)) { st = ct_st_writer_add(w, p->name, CT_F32, p->ndim, p->shape, p->data); continue; }
        int64_t out = p->shape[0], in = p->shape[1];
        const float *s = p->data;
        float *d = tr + o;
        for (int64_t r = 0; r < out; r++)
            for (int64_t c = 0; c < in; c++) d[c * out + r] = s[r * in + c];
        st = ct_st_writer_add(w, p->name, CT_F32, 2, (int64_t[]){in, out}, d);
        o += (size_t)(in * out);
    }
    /* in the file as in state_dict(): load_state_dict(strict=True) finds it */
    if (st == CT_OK) st = ct_st_writer_add(w, "lm_head.weight", CT_F32, 2, m->tied->shape, m->tied->data);
    if (st == CT_OK) st = ct_st_writer_set_metadata(w, "format", "pt");
    if (st == CT_OK) st = ct_st_writer_save(w, path);
    ct_st_writer_free(w);
    free(tr);
    if (st == CT_OK) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        st = write_config_json(&m->cfg, path);
    }
    return st;
}
