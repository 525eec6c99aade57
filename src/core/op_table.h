/* The op table: every differentiable op, in one place. Autocast policies and activation
 * checkpointing hook in here: an op's row names its backward function and its autocast
 * class (what dtype it runs in under autocast — PyTorch's lists: matmul-like ops in the
 * low-precision dtype, reductions/losses/norms in f32, the rest follow their input).
 *
 * To add an op: add a row, write `void ct_bw_<name>(ct_ctx *, ct_node *)` in src/ops/cpu,
 * and call ct_record(ctx, CT_OP_<NAME>, out, n, inputs) from its forward. */
#ifndef CT_OP_TABLE_H
#define CT_OP_TABLE_H

#include "ctrain/autograd.h"

typedef enum { CT_AC_PROMOTE = 0, CT_AC_LOWP, CT_AC_FP32 } ct_autocast_class;

/*        NAME           name             autocast class */
#define CT_OP_LIST(X)                                   \
    X(RESHAPE,        reshape,        CT_AC_PROMOTE)    \
    X(TRANSPOSE,      transpose,      CT_AC_PROMOTE)    \
    X(SLICE,          slice,          CT_AC_PROMOTE)    \
    X(CONTIGUOUS,     contiguous,     CT_AC_PROMOTE)    \
    X(MATMUL,         matmul,         CT_AC_LOWP)       \
    X(LINEAR,         linear,         CT_AC_LOWP)       \
    X(ADD,            add,            CT_AC_PROMOTE)    \
    X(RELU,           relu,           CT_AC_PROMOTE)    \
    X(SUM,            sum,            CT_AC_FP32)       \
    X(MEAN,           mean,           CT_AC_FP32)       \
    X(MUL,            mul,            CT_AC_PROMOTE)    \
    X(SCALE,          scale,          CT_AC_PROMOTE)    \
    X(BIAS_ADD,       bias_add,       CT_AC_PROMOTE)    \
    X(GELU,           gelu,           CT_AC_PROMOTE)    \
    X(TANH,           tanh,           CT_AC_PROMOTE)    \
    X(SIGMOID,        sigmoid,        CT_AC_PROMOTE)    \
    X(DROPOUT,        dropout,        CT_AC_PROMOTE)    \
    X(SOFTMAX,        softmax,        CT_AC_FP32)       \
    X(LOG_SOFTMAX,    log_softmax,    CT_AC_FP32)       \
    X(CROSS_ENTROPY,  cross_entropy,  CT_AC_FP32)       \
    X(MSE_LOSS,       mse_loss,       CT_AC_FP32)       \
    X(LAYER_NORM,     layer_norm,     CT_AC_FP32)       \
    X(EMBEDDING,      embedding,      CT_AC_PROMOTE)    \
    X(CONV2D,         conv2d,         CT_AC_LOWP)       \
    X(MAX_POOL2D,     max_pool2d,     CT_AC_PROMOTE)    \
    X(AVG_POOL2D,     avg_pool2d,     CT_AC_PROMOTE)    \
    X(SPLIT_HEADS,    split_heads,    CT_AC_PROMOTE)    \
    X(MERGE_HEADS,    merge_heads,    CT_AC_PROMOTE)    \
    X(ATTENTION,      attention,      CT_AC_LOWP)

#define CT_OP_ENUM_(N, n, ac) CT_OP_##N,
enum { CT_OP_LIST(CT_OP_ENUM_) CT_OP_COUNT };
#undef CT_OP_ENUM_

#define CT_OP_DECL_(N, n, ac) void ct_bw_##n(ct_ctx *ctx, ct_node *node);
CT_OP_LIST(CT_OP_DECL_)
#undef CT_OP_DECL_

typedef struct {
    const char *name;
    ct_backward_fn backward;
    ct_autocast_class autocast;
} ct_op_def;
extern const ct_op_def ct_op_table[CT_OP_COUNT];

/* Workspace the kernels need per thread, allocated ahead so that no op allocates it
 * (src/ops/cpu/sgemm.c: GEMM packing buffers) — for ct_ctx_create and ct_set_num_threads.
 * CT_ERR_NOMEM when it cannot be allocated. */
ct_status ct_kernels_reserve(int nthreads);

/* ---- helpers for op implementations (src/core/autograd.c) ---- */
/* Record a node if grad mode is on and any input requires grad; marks `out` as requiring
 * grad. Returns NULL when nothing was recorded (then skip saving state). */
ct_node *ct_record(ct_ctx *ctx, int op, ct_tensor *out, int nin, ct_tensor *const *in);
/* Gradient buffer of t for accumulation during backward: the persistent one for
 * parameters, a zeroed arena tensor otherwise. NULL if t does not require grad. */
float *ct_grad_acc(ct_ctx *ctx, ct_tensor *t);
/* Shape check that aborts naming the op and both shapes. */
void ct_check_same_shape(const char *op, const char *file, int line, const ct_tensor *a, const ct_tensor *b);
#define CT_CHECK_SAME_SHAPE(op, a, b) ct_check_same_shape(op, __FILE__, __LINE__, a, b)
#define CT_CHECK_CONTIG(op, t) do { if (!ct_is_contiguous(t)) { char b_[96]; \
    ct_fatal(__FILE__, __LINE__, "%s: input %s is not contiguous (use ct_contiguous)", op, ct_shape_str(t, b_, sizeof b_)); } } while (0)
#define CT_CHECK_F32(op, t) do { if ((t)->dtype != CT_F32) { char b_[96]; \
    ct_fatal(__FILE__, __LINE__, "%s: expected f32 input, got %s", op, ct_shape_str(t, b_, sizeof b_)); } } while (0)

/* Fires the store's grad hook for parameter i (params.c). */
void ct_params_fire_hook_(struct ct_params *p, int i);

/* Number of OpenMP threads worth using for n elements of light work. */
static inline int ct_omp_threads_for(int64_t n) { return n >= (1 << 15) ? 0 : 1; }
#endif
