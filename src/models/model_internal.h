/* Private to src/models/: the layout of ct_model and the table of per-kind functions.
 * Adding a model = its own file defining a ct_model_kind_ops entry and one row in
 * CT_MODEL_KINDS below (docs/adding-a-model.md). */
#ifndef CT_MODEL_INTERNAL_H
#define CT_MODEL_INTERNAL_H
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/models.h"

struct ct_st_file;
struct ct_st_writer;

struct ct_model {
    ct_model_config cfg;
    const struct ct_model_kind_ops *kind;
    ct_params *P;
    ct_module *root;
    ct_tensor *tied; /* the parameter state_dict also lists under kind->tied_name (GPT: wte) */
    int64_t nparams;
    char desc[320];
    bool quantized;      /* ct_model_quantize_dynamic ran: Linears are int8 (model_quant.c) */
    bool per_channel;    /* ... with one weight scale per output row */
};

typedef struct ct_model_kind_ops {
    /* the public part: name, data, options (CT_OPT_META ones are the file's metadata),
     * training defaults */
    ct_model_kind_info info;
    /* fills this kind's part of the config with its defaults */
    void (*defaults)(ct_model_config *c);
    /* CT_ERR_INVALID naming the bad field of this kind's part */
    ct_status (*check)(const ct_model_config *c);
    /* what one sample is, from the config (ignore_index comes preset to -100) */
    void (*batch)(const ct_model_config *c, ct_model_batch *b);
    /* registers modules and parameters on m->P, sets m->root (and m->tied); runs before
     * finalize. Out of memory is left to the nn rule (nn.h): ct_model_create checks. */
    void (*build)(ct_model *m);
    /* the architecture part of ct_model_describe: "MLP(784-1024-10, dropout=0)" */
    void (*describe)(const ct_model_config *c, char *buf, size_t n);
    ct_tensor *(*forward)(ct_ctx *ctx, ct_model *m, ct_tensor *x);
    /* NULL: cross-entropy of [B, classes] logits against [B] targets, ignore_index -100 */
    ct_tensor *(*loss)(ct_ctx *ctx, ct_model *m, ct_tensor *x, ct_tensor *target);
    /* state_dict I/O: an extra name for m->tied (saved, accepted on load; NULL: none) and
     * names of buffers other implementations save that load may skip (NULL: none) */
    const char *tied_name;
    bool (*load_ignores)(const char *name);
    /* For files without ctrain's metadata (NULL: none): a config from the file's tensors
     * (and the config.json beside it), and their layout; CT_ERR_NOT_FOUND, with no message,
     * when they are not this kind's */
    ct_status (*from_tensors)(const struct ct_st_file *f, ct_model_config *c, ct_weights_layout *layout);
    /* Hugging Face's layout (NULL: none): the weights in, the directory out */
    ct_status (*hf_load)(ct_model *m, const char *path);
    ct_status (*hf_save)(const ct_model *m, const char *dir);
    /* Generation with a key/value cache (NULL: none; info.generates says there is): the
     * cache's layers, key/value heads and head size, and the forward of new tokens [1, t]
     * (checked: they fit) at positions c->len .. through the cache (kv_cache.h), adding t
     * to c->len: logits [1, t, vocab] */
    void (*kv_shape)(const ct_model_config *c, int *layers, int *kv_heads, int *head_dim);
    ct_tensor *(*forward_cached)(ct_ctx *ctx, ct_model *m, struct ct_kv_cache *c, ct_tensor *tokens);
} ct_model_kind_ops;

/* the per-kind table, for model_io.c (NULL for an unknown kind) */
const ct_model_kind_ops *ct_model_kind_ops_(ct_model_kind k);

/* The table of kinds: one row a kind, in ct_model_kind's order (the built-in kinds first).
 * A new kind is its own file defining `const ct_model_kind_ops ct_<name>_kind_` and a row
 * here (docs/adding-a-model.md). */
#define CT_MODEL_KINDS(X) \
    X(ct_mlp_kind_)       \
    X(ct_cnn_kind_)       \
    X(ct_gpt_kind_)       \
    X(ct_llama_kind_)     \
    /* a new kind: one row above this line */

#define CT_MODEL_KIND_DECL_(entry) extern const ct_model_kind_ops entry;
CT_MODEL_KINDS(CT_MODEL_KIND_DECL_)
#undef CT_MODEL_KIND_DECL_

/* An option row: CT_MODEL_OPT_(name of the field in ct_model_config, key, type, flags, lo, hi) */
#define CT_MODEL_OPT_(field, key_, type_, flags_, lo_, hi_) \
    .key = key_, .type = type_, .flags = flags_, .off = offsetof(ct_model_config, field), .lo = lo_, .hi = hi_
#define CT_MODEL_NOPTS_(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* model_options.c: an option from metadata text (any value of its type; false: not one) */
bool ct_model_option_parse_(ct_model_config *c, const ct_model_option *o, const char *value);

/* model.c: the elements of every tensor (parameters and buffers) the config's model has,
 * counted from its shapes without allocating its weights; the config's check otherwise */
ct_status ct_model_config_numel_(const ct_model_config *c, double *out);
/* model.c: mean cross-entropy of logits [B, T, V] against next-token targets [B, T] (x's
 * shape; `what` names the model in the shape error) */
ct_tensor *ct_model_token_loss_(ct_ctx *ctx, const char *what, ct_tensor *logits, ct_tensor *x, ct_tensor *target,
                                int64_t ignore_index);
/* model.c: 1234567 -> "1,234,567" (a whole number) */
void ct_model_fmt_count_(char *buf, size_t n, double v);

/* model_io.c: "ctrain.model" = kind and "ctrain.<key>" = value of each CT_OPT_META option */
ct_status ct_model_config_metadata_(struct ct_st_writer *w, const ct_model_config *c);
/* model_io.c: a weights file, or a sharded checkpoint's model.safetensors.index.json (its
 * shards as one file, ct_st_open_shards) */
ct_status ct_model_open_weights_(const char *path, struct ct_st_file **out);
/* "dir/config.json" beside a weights file: where a Hugging Face checkpoint keeps its config */
static inline void ct_model_config_json_path_(const char *path, char *buf, size_t n) {
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(buf, n, "%.*s/config.json", (int)(slash - path), path);
    else snprintf(buf, n, "config.json");
}

/* gpt_hf.c: the GPT's from_tensors */
ct_status ct_gpt_config_from_tensors_(const struct ct_st_file *f, ct_model_config *c, ct_weights_layout *layout);

/* gpt_decode.c: the GPT's kv_shape and forward_cached */
void ct_gpt_kv_shape_(const ct_model_config *c, int *layers, int *kv_heads, int *head_dim);
ct_tensor *ct_gpt_forward_cached_(ct_ctx *ctx, ct_model *m, struct ct_kv_cache *c, ct_tensor *tokens);

/* llama_hf.c: the Llama's from_tensors, load_ignores and hf_save */
ct_status ct_llama_config_from_tensors_(const struct ct_st_file *f, ct_model_config *c, ct_weights_layout *layout);
bool ct_llama_load_ignores_(const char *name);
ct_status ct_llama_save_hf_(const ct_model *m, const char *dir);

/* Config checks shared by the kinds: any single dimension is at most CT_MODEL_DIM_MAX,
 * which keeps every product of two inside int64. */
#define CT_MODEL_DIM_MAX (1 << 24)
#define CT_MODEL_BAD(...) return ct_error(CT_ERR_INVALID, __VA_ARGS__)
static inline bool ct_model_dim_ok_(int v) { return v > 0 && v <= CT_MODEL_DIM_MAX; }
static inline bool ct_model_p_ok_(float p) { return p >= 0 && p < 1; } /* also rejects NaN */
#endif
