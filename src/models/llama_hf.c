/* Llama in Hugging Face's layout: LlamaForCausalLM's state_dict in model.safetensors and a
 * LlamaConfig in config.json beside it.
 *
 * ctrain's Llama already has LlamaForCausalLM's names and [out, in] Linear weights, so the
 * tensors load as ctrain's own (ct_model_load: any float dtype, converted); what this file
 * adds is the config from config.json (a Llama's head count is in no tensor's shape) and the
 * export. transformers' save_pretrained leaves a tied lm_head.weight out of the file (it
 * keeps one copy of shared tensors), and so does the export here. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/io.h"
#include "models/hf_internal.h"

/* older transformers saved each layer's rotary inv_freq buffer: recomputed from rope_theta */
bool ct_llama_load_ignores_(const char *name) {
    const char *s = strstr(name, ".self_attn.rotary_emb.inv_freq");
    return s && !s[strlen(".self_attn.rotary_emb.inv_freq")];
}

/* a bool under key: false leaves *out */
static bool json_bool(const cJSON *j, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsBool(v)) return false;
    *out = cJSON_IsTrue(v);
    return true;
}

/* rope_scaling (or transformers 5's rope_parameters): null or rope_type "default" is plain
 * rotary positions, "llama3" Llama 3.1's scaling; the others are refused by name */
static void read_rope_scaling(const cJSON *rs, ct_model_config *c, ct_status *st, const char *path) {
    if (!rs || cJSON_IsNull(rs) || *st != CT_OK) return;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(ty)) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "?";
    if (!strcmp(t, "default")) return;
    if (strcmp(t, "llama3")) {
        *st = ct_error(CT_ERR_UNSUPPORTED, "%s: rope_scaling '%s': ctrain's llama computes plain rotary positions and 'llama3' only", path, t);
        return;
    }
    ct_rope_scaling *r = &c->llama.rope_scaling;
    const char *need[] = {"factor", "low_freq_factor", "high_freq_factor"};
    float *at[] = {&r->factor, &r->low_freq_factor, &r->high_freq_factor};
    for (int i = 0; i < 3; i++)
        if (!ct_hf_json_float_(rs, need[i], 0, 1e6f, at[i], st, path) && *st == CT_OK)
            *st = ct_error(CT_ERR_FORMAT, "%s: rope_scaling 'llama3' without %s", path, need[i]);
    /* absent: max_position_embeddings, as transformers */
    r->original_max_position_embeddings = c->llama.max_position_embeddings;
    ct_hf_json_int_(rs, "original_max_position_embeddings", &r->original_max_position_embeddings, st, path);
}

/* LlamaConfig's fields that change the model, over LlamaConfig's defaults (save_pretrained
 * writes only the fields that differ from them); what ctrain's Llama does not compute is
 * refused */
static ct_status read_config_json(const char *path, ct_model_config *c) {
    cJSON *j;
    ct_status st = ct_hf_read_json_(path, &j);
    if (st != CT_OK) return st;
    c->llama.vocab_size = 32000;
    c->llama.hidden_size = 4096;
    c->llama.intermediate_size = 11008;
    c->llama.num_hidden_layers = 32;
    c->llama.num_attention_heads = 32;
    c->llama.max_position_embeddings = 2048;
    c->llama.rms_norm_eps = 1e-6f;
    c->llama.rope_theta = 10000.0f;
    c->llama.tie_word_embeddings = false;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (cJSON_IsString(mt) && strcmp(mt->valuestring, "llama"))
        st = ct_error(CT_ERR_UNSUPPORTED, "%s: model_type '%s': ctrain's llama reads Llama (llama) checkpoints only", path, mt->valuestring);
    ct_hf_json_int_(j, "vocab_size", &c->llama.vocab_size, &st, path);
    ct_hf_json_int_(j, "hidden_size", &c->llama.hidden_size, &st, path);
    ct_hf_json_int_(j, "intermediate_size", &c->llama.intermediate_size, &st, path);
    ct_hf_json_int_(j, "num_hidden_layers", &c->llama.num_hidden_layers, &st, path);
    ct_hf_json_int_(j, "num_attention_heads", &c->llama.num_attention_heads, &st, path);
    /* absent or null: multi-head attention, as LlamaConfig */
    if (!ct_hf_json_int_(j, "num_key_value_heads", &c->llama.num_key_value_heads, &st, path))
        c->llama.num_key_value_heads = c->llama.num_attention_heads;
    ct_hf_json_int_(j, "max_position_embeddings", &c->llama.max_position_embeddings, &st, path);
    ct_hf_json_float_(j, "rms_norm_eps", 0, 1, &c->llama.rms_norm_eps, &st, path);
    ct_hf_json_float_(j, "rope_theta", 1, 1e9f, &c->llama.rope_theta, &st, path);
    json_bool(j, "tie_word_embeddings", &c->llama.tie_word_embeddings);
    /* transformers 4 writes rope_scaling beside rope_theta, transformers 5 rope_parameters with both */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (cJSON_IsObject(rp)) ct_hf_json_float_(rp, "rope_theta", 1, 1e9f, &c->llama.rope_theta, &st, path);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    read_rope_scaling(rs && !cJSON_IsNull(rs) ? rs : rp, c, &st, path);
    const char *bias[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2 && st == CT_OK; i++) {
        bool b = false;
        if (json_bool(j, bias[i], &b) && b) st = ct_error(CT_ERR_UNSUPPORTED, "%s: %s = true: ctrain's llama has no biases", path, bias[i]);
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (st == CT_OK && cJSON_IsString(act) && strcmp(act->valuestring, "silu"))
        st = ct_error(CT_ERR_UNSUPPORTED, "%s: hidden_act '%s': ctrain's llama has silu only", path, act->valuestring);
    int hd, H = c->llama.num_attention_heads;
    if (ct_hf_json_int_(j, "head_dim", &hd, &st, path) && (H <= 0 || (double)hd * H != c->llama.hidden_size))
        st = ct_error(CT_ERR_UNSUPPORTED, "%s: head_dim %d is not hidden_size / num_attention_heads (%d / %d): not supported", path, hd,
                      c->llama.hidden_size, H);
    cJSON_Delete(j);
    return st;
}

ct_status ct_llama_config_from_tensors_(const ct_st_file *f, ct_model_config *c, ct_weights_layout *layout) {
    const char *path = ct_st_path(f);
    ct_st_tensor emb;
    if (ct_st_get(f, "model.embed_tokens.weight", &emb) != CT_OK) return CT_ERR_NOT_FOUND; /* no Llama */
    *c = ct_model_default_config(CT_MODEL_LLAMA);
    char cj[4200];
    ct_model_config_json_path_(path, cj, sizeof cj);
    if (access(cj, F_OK) != 0)
        return ct_error(CT_ERR_FORMAT, "%s: a Llama saved without ctrain's metadata and without a config.json beside it "
                        "(its heads are in no tensor's shape): put its config.json there", path);
    ct_status st = read_config_json(cj, c);
    if (st != CT_OK) return st;
    *layout = CT_LAYOUT_HF;
    return ct_hf_config_check_(c, cj);
}

static ct_status write_config_json(const ct_model_config *c, const char *path) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddNumberToObject(j, "vocab_size", c->llama.vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", c->llama.hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", c->llama.intermediate_size);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->llama.num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->llama.num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->llama.num_key_value_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->llama.hidden_size / c->llama.num_attention_heads);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->llama.max_position_embeddings);
    ct_hf_json_add_float_(j, "rms_norm_eps", c->llama.rms_norm_eps);
    ct_hf_json_add_float_(j, "rope_theta", c->llama.rope_theta);
    const ct_rope_scaling *r = &c->llama.rope_scaling;
    if (r->factor == 0) cJSON_AddNullToObject(j, "rope_scaling");
    else {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        ct_hf_json_add_float_(rs, "factor", r->factor);
        ct_hf_json_add_float_(rs, "low_freq_factor", r->low_freq_factor);
        ct_hf_json_add_float_(rs, "high_freq_factor", r->high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", r->original_max_position_embeddings);
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->llama.tie_word_embeddings);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddBoolToObject(j, "attention_bias", false);
    cJSON_AddBoolToObject(j, "mlp_bias", false);
    cJSON_AddRawToObject(j, "attention_dropout", "0.0");
    cJSON_AddRawToObject(j, "initializer_range", "0.02");
    cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    cJSON_AddBoolToObject(j, "use_cache", true);
    /* LlamaConfig's 1 and 2 would be ordinary tokens of a byte-level vocabulary: none */
    cJSON_AddNullToObject(j, "bos_token_id");
    cJSON_AddNullToObject(j, "eos_token_id");
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return ct_hf_write_json_(j, path);
}

ct_status ct_llama_save_hf_(const ct_model *m, const char *dir) {
    ct_status st = ct_hf_mkdirs_(dir);
    if (st != CT_OK) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ct_st_writer *w = NULL;
    if (ct_st_writer_create(&w) != CT_OK) return ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    /* the parameters are LlamaForCausalLM's state_dict less the tied head: as save_pretrained */
    for (int i = 0; i < ct_params_count(m->P) && st == CT_OK; i++) {
        const ct_tensor *p = ct_params_get(m->P, i);
        st = ct_st_writer_add(w, p->name, CT_F32, p->ndim, p->shape, p->data);
    }
    if (st == CT_OK) st = ct_st_writer_set_metadata(w, "format", "pt");
    if (st == CT_OK) st = ct_st_writer_save(w, path);
    ct_st_writer_free(w);
    if (st == CT_OK) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        st = write_config_json(&m->cfg, path);
    }
    return st;
}
