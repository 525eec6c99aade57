/* ctrain/nn.h — modules: layers with PyTorch's default initialisation and PyTorch's
 * state_dict names, composed through a small vtable.
 *
 *   ct_params *P;
 *   if (ct_params_create(&P) != CT_OK) ...
 *   ct_module *net = ct_nn_sequential("");                 // root: names "0.weight", "2.bias"...
 *   ct_seq_add(net, ct_nn_linear(P, ct_seq_next_name(net), 784, 512, true));   // "0.weight", "0.bias"
 *   ct_seq_add(net, ct_nn_relu());                                             // index 1 (no parameters)
 *   ct_seq_add(net, ct_nn_linear(P, ct_seq_next_name(net), 512, 10, true));    // "2.weight", "2.bias"
 *   if (ct_module_status(net) != CT_OK || ct_params_finalize(P, 42) != CT_OK) ... // out of memory
 *                                                          // (finalize: allocate + initialise the flat buffer)
 *   ct_tensor *logits = ct_module_forward(ctx, net, x);    // x [B, 784]
 *   ...
 *   ct_module_free(net);                                   // frees children; P owns the weights
 *   ct_params_free(P);
 *
 * A module registers its parameters in a ct_params store under its name (`name + ".weight"`,
 * or just "weight" when the name is ""), at construction; the weights exist once the store
 * is finalised. Modules never own parameter memory. Sequential numbers its children as
 * PyTorch does, parameterless layers included: ct_seq_next_name() gives the name the next
 * child gets ("features.3"), valid until the next ct_seq_add.
 *
 * Initialisation (PyTorch defaults): Linear/Conv2d weight and bias U(±1/sqrt(fan_in));
 * Embedding N(0, 1); LayerNorm weight 1, bias 0. The *_ex constructors take explicit
 * initialisers (GPT-2 uses N(0, 0.02) and zero biases).
 *
 * Out of memory never aborts; building checks once, at the end. A constructor that cannot
 * allocate returns NULL (ct_last_error() says why); one that takes a store also marks the
 * store failed (ct_params_fail), which then registers nothing more and which
 * ct_params_finalize refuses with CT_ERR_NOMEM. NULL is passed on: ct_module_add_child and
 * ct_seq_add with a NULL child return NULL and mark the parent incomplete, with a NULL
 * parent they free the child and return NULL; ct_seq_next_name(NULL) is NULL, and a
 * constructor with a store given a NULL name returns NULL (marking the store). So build
 * without checking each call, then: ct_module_status(root) (CT_ERR_NOMEM when root is NULL
 * or any module below it is incomplete) and ct_params_finalize — as ct_model_create does.
 *
 * Dropout follows the context's training flag (ct_ctx_set_training), like module.train().
 * Your own module: fill a ct_module_ops and call ct_module_new(); use `w`, `b`, `hp`,
 * `children` and `priv` as you like (destroy frees priv; children are freed for you).
 */
#ifndef CTRAIN_NN_H
#define CTRAIN_NN_H

#include "ctrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CT_NN_NAME_MAX 192

typedef struct ct_module ct_module;

typedef struct ct_module_ops {
    const char *type;                                               /* "Linear", "Conv2d", ... */
    ct_tensor *(*forward)(ct_ctx *ctx, ct_module *m, ct_tensor *x);
    void (*destroy)(ct_module *m);                                  /* frees priv; may be NULL */
    /* its one line in ct_module_repr without the children ("Linear(in_features=784, ...)"),
     * as snprintf writes it: at most n bytes, returns the length it needed; NULL: "Type()" */
    int (*repr)(const ct_module *m, char *buf, size_t n);
} ct_module_ops;

struct ct_module {
    const ct_module_ops *ops;
    char name[CT_NN_NAME_MAX];  /* state_dict prefix, "" for a root */
    ct_tensor *w, *b;           /* weight / bias (NULL if absent) */
    ct_tensor *p[4];            /* further parameters of composite modules */
    int64_t hp[8];              /* integer hyper-parameters (sizes, kernel, stride...) */
    float fp[2];                /* float hyper-parameters (eps, dropout p) */
    ct_module **children;
    int nchildren, cap;
    char next_name[CT_NN_NAME_MAX];
    void *priv;
    bool incomplete;            /* a child could not be built (out of memory): see ct_module_status */
};

/* ---- generic ---- */
ct_module *ct_module_new(const ct_module_ops *ops, const char *name); /* zeroed; NULL when out of memory */
ct_tensor *ct_module_forward(ct_ctx *ctx, ct_module *m, ct_tensor *x);
/* The first trainable parameter of m's tree (its own, then its children's, depth first), or
 * NULL: what ct_module_forward names to ct_unit_enter / ct_unit_leave (tensor.h). */
const ct_tensor *ct_module_first_param(const ct_module *m);
void ct_module_free(ct_module *m);                 /* recursive; NULL is fine */
const char *ct_module_type(const ct_module *m);
/* The child whose name ends in "." + leaf (or is leaf), PyTorch's getattr(m, leaf); NULL if none. */
ct_module *ct_module_child(const ct_module *m, const char *leaf);
/* Append a child (owned by the parent); returns it. NULL child or parent: see above. */
ct_module *ct_module_add_child(ct_module *parent, ct_module *child);
/* CT_OK, or CT_ERR_NOMEM when m is NULL or a module in its tree lacks a child that could
 * not be built. */
ct_status ct_module_status(const ct_module *m);
/* Moves the parameters of m's tree (and their gradients) to `dev`: the whole store they
 * live in moves (stores are flat, see ct_params_to), so modules sharing a store move together.
 * CT_OK when the tree has no parameters; CT_ERR_INVALID when they span several stores. */
ct_status ct_module_to(ct_module *m, ct_device dev);
/* `prefix + "." + leaf` (or leaf alone when prefix is empty) into buf; returns buf. */
const char *ct_nn_join(char *buf, size_t n, const char *prefix, const char *leaf);
/* One line per module, PyTorch-like ("(0): Linear(in_features=784, out_features=512, bias=True)"),
 * into buf; returns the length it needed. */
size_t ct_module_repr(const ct_module *m, char *buf, size_t n);

/* ---- layers ---- */
/* nn.Linear(in, out, bias): weight [out, in], bias [out]; input [..., in] */
ct_module *ct_nn_linear(ct_params *P, const char *name, int64_t in, int64_t out, bool bias);
ct_module *ct_nn_linear_ex(ct_params *P, const char *name, int64_t in, int64_t out, bool bias,
                           ct_init w_init, double w_arg, ct_init b_init, double b_arg);
/* A Linear over existing tensors, registering nothing (weight tying: GPT's lm_head is wte). */
ct_module *ct_nn_linear_tied(const char *name, ct_tensor *w, ct_tensor *b);
/* nn.Conv2d(in_ch, out_ch, kernel, stride, padding, bias): weight [out, in, k, k] */
ct_module *ct_nn_conv2d(ct_params *P, const char *name, int64_t in_ch, int64_t out_ch, int kernel,
                        int stride, int padding, bool bias);
/* nn.MaxPool2d(kernel, stride, padding); stride 0 means stride = kernel (PyTorch's default) */
ct_module *ct_nn_max_pool2d(int kernel, int stride, int padding);
/* nn.Embedding(num, dim): weight [num, dim] ~ N(0, 1); input i32/i64 indices */
ct_module *ct_nn_embedding(ct_params *P, const char *name, int64_t num, int64_t dim);
ct_module *ct_nn_embedding_ex(ct_params *P, const char *name, int64_t num, int64_t dim, ct_init init, double arg);
/* nn.LayerNorm(dim, eps) over the last dim; eps <= 0 means 1e-5; bias=false omits ".bias" */
ct_module *ct_nn_layer_norm(ct_params *P, const char *name, int64_t dim, float eps, bool bias);
/* The LayerNorm feeds only ops that autocast runs in low precision (the linears after a
 * transformer's norms): its forward is then ct_layer_norm_lowp (ops.h), the same bits. */
void ct_nn_layer_norm_set_lowp_out(ct_module *m, bool on);
ct_module *ct_nn_dropout(float p);
ct_module *ct_nn_relu(void);
ct_module *ct_nn_gelu(bool tanh_approx);           /* nn.GELU(approximate='none'|'tanh') */
ct_module *ct_nn_tanh(void);
ct_module *ct_nn_sigmoid(void);
ct_module *ct_nn_flatten(int start_dim);           /* nn.Flatten(start_dim) (end_dim = -1); PyTorch's default is 1 */

/* ---- Sequential ---- */
ct_module *ct_nn_sequential(const char *name);
/* Name the next child will get: "<name>.<index>" (or "<index>" for a root). */
const char *ct_seq_next_name(ct_module *seq);
ct_module *ct_seq_add(ct_module *seq, ct_module *child);
int ct_seq_len(const ct_module *seq);
ct_module *ct_seq_get(const ct_module *seq, int i);

/* ---- GPT-2 causal self-attention (nanoGPT's CausalSelfAttention) ----
 * Parameters "<name>.c_attn.{weight,bias}" [3C, C], [3C] and "<name>.c_proj.{weight,bias}"
 * [C, C], [C]; weights N(0, w_std) and N(0, proj_std), biases zero. Input [B, T, C].
 * `dropout` is applied to the output projection (resid_dropout). */
ct_module *ct_nn_causal_self_attention(ct_params *P, const char *name, int64_t n_embd, int n_head, bool bias,
                                       float dropout, double w_std, double proj_std);
/* ---- activation checkpointing (autograd.h: ct_checkpoint) ----
 * A module as one checkpointed segment (its output must be contiguous). */
ct_tensor *ct_checkpoint_module(ct_ctx *ctx, ct_module *m, ct_tensor *x);
/* torch.utils.checkpoint.checkpoint_sequential(seq, segments, x): the first segments - 1
 * runs of len / segments children are checkpointed, the rest runs normally. */
ct_tensor *ct_checkpoint_sequential(ct_ctx *ctx, ct_module *seq, int segments, ct_tensor *x);

/* Fused (flash) attention inside it: ct_flash_attention instead of ct_attention (default). */
void ct_nn_attention_set_fused(ct_module *m, bool fused);

/* ---- dynamic int8 quantization (inference; see ops.h and docs/quantization.md) ----
 * torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8):
 *
 *   ct_quantize_opts qo = ct_quantize_default_opts();     // per tensor; qo.per_channel for per channel
 *   int n;
 *   if (ct_quantize_dynamic(net, &qo, &n) != CT_OK) ...    // CT_ERR_NOMEM
 *   ct_ctx_set_training(ctx, false);
 *   ct_tensor *y = ct_module_forward(ctx, net, x);         // n Linears now run in int8
 *
 * Every Linear in the tree (type "Linear" with a 2-d f32 weight: ct_nn_linear's) becomes, in
 * place, a DynamicQuantizedLinear with its own int8 weight and a copy of its bias: pointers
 * to it stay valid, the f32 parameters stay in their store but are no longer read. On
 * CT_ERR_NOMEM the Linears converted so far stay converted (each one complete). No backward. */
typedef struct ct_quantize_opts {
    bool per_channel; /* one weight scale per output row (per_channel_dynamic_qconfig); default per tensor */
} ct_quantize_opts;
ct_quantize_opts ct_quantize_default_opts(void);
ct_status ct_quantize_dynamic(ct_module *root, const ct_quantize_opts *opts, int *nconverted);
/* A DynamicQuantizedLinear from an int8 weight (taken over, freed with the module, also on
 * failure) and a bias [out] (copied; may be NULL). NULL when out of memory. */
ct_module *ct_nn_linear_dynamic_int8(const char *name, ct_qweight *w, const float *bias);
bool ct_module_is_qlinear(const ct_module *m);
const ct_qweight *ct_qlinear_weight(const ct_module *m); /* NULL unless ct_module_is_qlinear */
const float *ct_qlinear_bias(const ct_module *m);        /* NULL without bias */
/* Replace its weight (taken over, freed on failure too) and bias (copied): CT_ERR_NOMEM. */
ct_status ct_qlinear_set(ct_module *m, ct_qweight *w, const float *bias);

#ifdef __cplusplus
}
#endif
#endif
