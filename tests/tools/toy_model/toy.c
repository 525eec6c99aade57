/* A toy model kind, as docs/adding-a-model.md adds one: this file plus one row in
 * CT_MODEL_KINDS (src/models/model_internal.h). tests/scripts/model_kind_toy.sh copies the
 * tree, drops this file into src/models/, adds the row and builds: `ctrain train toy`, its
 * flags and --help, its metadata in model.safetensors and `ctrain eval` then work with no
 * other change.
 *
 * The model: Sequential(Linear(in, hidden), Tanh(), Linear(hidden, classes)) on images
 * flattened to `in` values; state_dict "0.weight", "0.bias", "2.weight", "2.bias". */
#include <stdio.h>

#include "models/model_internal.h"

/* its config lives in ct_model_config.custom: models.h has no struct for it */
typedef struct {
    int in, hidden, classes;
} toy_config;
#define TOY(c) ((toy_config *)(void *)(c)->custom)
#define TOY_C(c) ((const toy_config *)(const void *)(c)->custom)
_Static_assert(sizeof(toy_config) <= sizeof(((ct_model_config *)0)->custom), "toy_config must fit ct_model_config.custom");

static void toy_defaults(ct_model_config *c) { *TOY(c) = (toy_config){.in = 784, .hidden = 64, .classes = 10}; }

static ct_status toy_check(const ct_model_config *c) {
    const toy_config *t = TOY_C(c);
    if (!ct_model_dim_ok_(t->in)) CT_MODEL_BAD("toy.in = %d must be positive", t->in);
    if (!ct_model_dim_ok_(t->hidden)) CT_MODEL_BAD("toy.hidden = %d must be positive", t->hidden);
    if (!ct_model_dim_ok_(t->classes)) CT_MODEL_BAD("toy.classes = %d must be positive", t->classes);
    return CT_OK;
}

static void toy_batch(const ct_model_config *c, ct_model_batch *b) {
    b->classes = TOY_C(c)->classes;
    b->x_numel = TOY_C(c)->in;
}

static void toy_build(ct_model *m) {
    const toy_config *t = TOY_C(&m->cfg);
    ct_module *seq = ct_nn_sequential("");
    ct_seq_add(seq, ct_nn_linear(m->P, ct_seq_next_name(seq), t->in, t->hidden, true));
    ct_seq_add(seq, ct_nn_tanh());
    ct_seq_add(seq, ct_nn_linear(m->P, ct_seq_next_name(seq), t->hidden, t->classes, true));
    m->root = seq;
}

static void toy_describe(const ct_model_config *c, char *arch, size_t n) {
    snprintf(arch, n, "Toy(%d-%d-%d)", TOY_C(c)->in, TOY_C(c)->hidden, TOY_C(c)->classes);
}

static ct_tensor *toy_forward(ct_ctx *ctx, ct_model *m, ct_tensor *x) {
    CT_CHECK(x->ndim >= 2 && x->dtype == CT_F32, "Toy: expected f32 input [B, ...], got %d dims of %s", x->ndim, ct_dtype_name(x->dtype));
    return ct_module_forward(ctx, m->root, x->ndim > 2 ? ct_flatten(ctx, x, 1) : x);
}

/* an int field of toy_config, inside ct_model_config.custom */
#define T_(f, fl, lo_, hi_) \
    .key = #f, .type = 'i', .flags = fl, .off = offsetof(ct_model_config, custom) + offsetof(toy_config, f), .lo = lo_, .hi = hi_
static const ct_model_option toy_options[] = {
    {T_(in, CT_OPT_META, 1, 1 << 20)},
    {T_(hidden, CT_OPT_META | CT_OPT_FLAG, 1, 4096), .cli_default = "32", .help = "hidden width"},
    {T_(classes, CT_OPT_META, 1, 1 << 20)},
};
#undef T_

const ct_model_kind_ops ct_toy_kind_ = {
    .info = {.name = "toy", .data = CT_MODEL_DATA_IMAGES, .optimizer = "sgd", .adam_beta2 = 0.999, .eval_each_epoch = true,
             .options = toy_options, .noptions = CT_MODEL_NOPTS_(toy_options)},
    .defaults = toy_defaults, .check = toy_check, .batch = toy_batch, .build = toy_build, .describe = toy_describe,
    .forward = toy_forward,
};
