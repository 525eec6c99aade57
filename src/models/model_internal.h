/* Private to src/models/: the layout of ct_model and the table of per-kind functions.
 * Adding a model = its own file defining a ct_model_kind_ops entry, its enum value in
 * models.h, and one line in CT_MODEL_KINDS below. */
#ifndef CT_MODEL_INTERNAL_H
#define CT_MODEL_INTERNAL_H
#include <stddef.h>

#include "ctrain/models.h"

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

/* One config field of a kind, for the metadata ct_model_save writes and
 * ct_model_config_from_file reads back ("ctrain.<name>" = value as text). 'i' int, 'f' float,
 * 'b' bool, 'l' int list at off with its length (an int) at len_off. */
typedef struct ct_model_field {
    const char *name;
    char type;
    size_t off, len_off;
} ct_model_field;

typedef struct ct_model_kind_ops {
    const char *name; /* "mlp": ct_model_kind_name, ct_model_kind_parse */
    /* fills this kind's sub-struct of the config with its defaults */
    void (*defaults)(ct_model_config *c);
    /* CT_ERR_INVALID naming the bad field of this kind's sub-struct */
    ct_status (*check)(const ct_model_config *c);
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
    const ct_model_field *fields; /* the config sub-struct, described for the metadata */
    int nfields;
} ct_model_kind_ops;

/* the per-kind table, for model_io.c (NULL for an unknown kind) */
const ct_model_kind_ops *ct_model_kind_ops_(ct_model_kind k);

/* X(enum value, entry): the table of kinds, in enum order */
#define CT_MODEL_KINDS(X)            \
    X(CT_MODEL_MLP, ct_mlp_kind_)    \
    X(CT_MODEL_CNN, ct_cnn_kind_)    \
    X(CT_MODEL_GPT, ct_gpt_kind_)

#define CT_MODEL_KIND_DECL_(k, entry) extern const ct_model_kind_ops entry;
CT_MODEL_KINDS(CT_MODEL_KIND_DECL_)
#undef CT_MODEL_KIND_DECL_

/* gpt_hf.c: a GPT config from a file's tensors (and config.json beside it), for files
 * without ctrain's metadata; CT_ERR_FORMAT when they are no GPT */
struct ct_st_file;
ct_status ct_gpt_config_from_tensors_(const struct ct_st_file *f, ct_model_config *c, ct_weights_layout *layout);

/* Config checks shared by the kinds: any single dimension is at most CT_MODEL_DIM_MAX,
 * which keeps every product of two inside int64. */
#define CT_MODEL_DIM_MAX (1 << 24)
#define CT_MODEL_BAD(...) return ct_error(CT_ERR_INVALID, __VA_ARGS__)
static inline bool ct_model_dim_ok_(int v) { return v > 0 && v <= CT_MODEL_DIM_MAX; }
static inline bool ct_model_p_ok_(float p) { return p >= 0 && p < 1; } /* also rejects NaN */
#endif
