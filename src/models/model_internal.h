/* Private layout of ct_model, shared by src/models/ and src/io/model_io.c. */
#ifndef CT_MODEL_INTERNAL_H
#define CT_MODEL_INTERNAL_H
#include "ctrain/models.h"

struct ct_model {
    ct_model_config cfg;
    ct_params *P;
    ct_module *root;
    /* GPT */
    ct_tensor *wte, *wpe;
    int64_t nparams;
    char desc[320];
};

/* Per-kind builders: register modules/parameters on m->P and set m->root (before finalize). */
void ct_mlp_build_(ct_model *m);
void ct_cnn_build_(ct_model *m);
void ct_gpt_build_(ct_model *m);
ct_tensor *ct_mlp_forward_(ct_ctx *ctx, ct_model *m, ct_tensor *x);
ct_tensor *ct_cnn_forward_(ct_ctx *ctx, ct_model *m, ct_tensor *x);
ct_tensor *ct_gpt_forward_(ct_ctx *ctx, ct_model *m, ct_tensor *x);
#endif
