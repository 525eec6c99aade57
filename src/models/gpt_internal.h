/* Private to the GPT's files (gpt.c, gpt_decode.c): its modules by the names nanoGPT's
 * model.py gives them, so that the training forward and the cached decoder walk the same
 * parts without knowing the order of the module tree's children. */
#ifndef CT_GPT_INTERNAL_H
#define CT_GPT_INTERNAL_H
#include "models/model_internal.h"

/* transformer.h.<l>: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)) */
typedef struct ct_gpt_block {
    ct_module *mod; /* the "Block" module itself */
    ct_module *ln_1, *ln_2;
    struct { ct_module *mod, *c_attn, *c_proj; } attn; /* CausalSelfAttention and its Linears */
    struct { ct_module *mod, *c_fc, *c_proj; } mlp;
} ct_gpt_block;

/* the GPT root module's priv (freed with it) */
typedef struct ct_gpt {
    ct_module *wte, *wpe, *ln_f, *lm_head; /* lm_head: a Linear over wte's weight */
    int64_t block_size;
    bool checkpoint; /* each block a checkpointed segment */
    float dropout;   /* on the embeddings */
    int n_layer;
    bool pad_head; /* set by the loss for one forward on a GPU: the LM head over a padded vocabulary */
    /* on a GPU, made at the first forward there (gpt.c's consts_on): the positions 0..block_size-1
     * (i32), then the padded head's bias, so that a step copies nothing from the host */
    void *consts;
    ct_device consts_dev;
    ct_gpt_block h[]; /* [n_layer] */
} ct_gpt;

static inline const ct_gpt *ct_gpt_of_(const ct_model *m) { return m->root->priv; }
#endif
