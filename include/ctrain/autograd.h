/* ctrain/autograd.h — tape-based reverse mode.
 *
 *   ct_tensor *loss = model_forward(ctx, ...);   // each op records a node on ctx's tape
 *   ct_backward(ctx, loss);                      // walks the tape in reverse
 *
 *   bool prev = ct_set_grad_enabled(ctx, false); // like torch.no_grad(): nothing recorded
 *   ... evaluation ...
 *   ct_set_grad_enabled(ctx, prev);
 *
 *   ct_autocast_begin(ctx, CT_BF16);            // like torch.autocast("cpu", torch.bfloat16)
 *   ct_tensor *loss = ct_cross_entropy(ctx, ct_linear(ctx, x, W, b), labels, -100);
 *   ct_autocast_end(ctx);                        // linear ran in bf16, the loss in f32
 *   ct_backward(ctx, loss);                      // W's gradient is f32, in its store
 *
 * Parameter gradients accumulate across backward calls until ct_params_zero_grad.
 * Intermediate gradients live in the arena. When backward has delivered the last
 * contribution to a parameter, the store's grad hook fires (see ct_params_set_grad_hook).
 */
#ifndef CTRAIN_AUTOGRAD_H
#define CTRAIN_AUTOGRAD_H

#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CT_NODE_MAX_IN 4

struct ct_node;
typedef void (*ct_backward_fn)(ct_ctx *ctx, struct ct_node *n);

/* One recorded op. Ops keep what backward needs in `saved`, `f` and `i`. */
typedef struct ct_node {
    const struct ct_op_def *op;      /* its op-table row (src/ops/op_table.h): name, backward */
    ct_tensor *out;
    ct_tensor *in[CT_NODE_MAX_IN];
    int nin;
    void *saved;                     /* op-specific, arena-allocated */
    ct_tensor *saved_t[2];           /* saved tensors (e.g. softmax output, mask) */
    double f[4];
    int64_t i[6];
    struct ct_node *prev;            /* tape link, newest first */
} ct_node;

/* Activation checkpointing (torch.utils.checkpoint, use_reentrant=False): y = fn(ctx, x, arg)
 * computed without keeping the segment's activations — only x and y stay in the arena (on a
 * GPU: the segment's other device buffers go back to the caching allocator) — and computed
 * again during backward to get the gradients. Dropout draws the same masks on the
 * recompute; parameters inside get their gradients even when x needs none; their
 * grad-ready hooks fire once, after the recompute (DDP buckets stay right). fn must be a
 * pure function of x, arg and the parameters (called twice). Under no_grad: just fn. */
typedef ct_tensor *(*ct_checkpoint_fn)(ct_ctx *ctx, ct_tensor *x, void *arg);
ct_tensor *ct_checkpoint(ct_ctx *ctx, ct_checkpoint_fn fn, void *arg, ct_tensor *x);
/* True while fn runs again in backward: then nothing reads the value of fn's result (the
 * forward's copy is kept), so fn may skip computing values that reach only its result
 * through ops whose gradients do not read them (ct_linear_unevaluated). */
bool ct_checkpoint_recomputing(const ct_ctx *ctx);

/* Autocast regions, PyTorch's CPU policy (each op's class is in src/ops/op_table.h):
 * matmul, linear, conv2d and attention cast their f32 inputs to dt (bf16 or f16) and
 * produce dt, computing in f32 on the rounded values (f32 accumulation); softmax,
 * log-softmax, layer norm, losses and reductions cast low-precision inputs up and produce
 * f32; every other op runs in its inputs' dtype, promoting mixed inputs to the widest.
 * Parameters are cast through a recorded cast node, once per region (cached), so their
 * gradients arrive in f32 in the store; tensors saved for backward stay in dt. Gradient
 * buffers are f32, rounded to dt before a low-precision op consumes them (the values of a
 * dt gradient). The region applies to the ops called inside it; an activation-checkpointed
 * segment is recomputed in the region it first ran in. Regions nest (up to 8).
 * begin: CT_ERR_INVALID for a dtype other than CT_BF16 / CT_F16. */
ct_status ct_autocast_begin(ct_ctx *ctx, ct_dtype dt);
void ct_autocast_end(ct_ctx *ctx);
/* The current region's dtype, CT_F32 outside any region. */
ct_dtype ct_autocast_dtype(const ct_ctx *ctx);

/* Reverse pass from a scalar (seed gradient 1). */
void ct_backward(ct_ctx *ctx, ct_tensor *loss);
/* Reverse pass from any tensor with an explicit seed gradient of the same shape (f32). */
void ct_backward_seed(ct_ctx *ctx, ct_tensor *out, const ct_tensor *seed);
/* Returns the previous mode. */
bool ct_set_grad_enabled(ct_ctx *ctx, bool enabled);
bool ct_grad_enabled(const ct_ctx *ctx);
/* Mark a leaf (e.g. a test input) as needing a gradient; its grad is arena-allocated. */
void ct_requires_grad(ct_tensor *t);
/* Number of nodes on the tape (for tests and memory reports). */
int ct_tape_len(const ct_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
