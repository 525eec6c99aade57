/* The op table: every differentiable op, in one place. An op's row names its backward
 * function and its autocast class; activation checkpointing and autocast hook in here.
 *
 * To add an op: add a row, write `void ct_bw_<name>(ct_ctx *, ct_node *)` in src/ops/cpu,
 * and call ct_record(ctx, CT_OP_<NAME>, out, n, inputs) from its forward. */
#ifndef CT_OPS_OP_TABLE_H
#define CT_OPS_OP_TABLE_H

#include "core/kernel.h"

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
    X(RELU_MAX_POOL2D, relu_max_pool2d, CT_AC_PROMOTE)  \
    X(AVG_POOL2D,     avg_pool2d,     CT_AC_PROMOTE)    \
    X(SPLIT_HEADS,    split_heads,    CT_AC_PROMOTE)    \
    X(MERGE_HEADS,    merge_heads,    CT_AC_PROMOTE)    \
    X(ATTENTION,      attention,      CT_AC_LOWP)       \
    X(FLASH_ATTENTION, flash_attention, CT_AC_LOWP) \
    X(CAST,           cast,           CT_AC_PROMOTE)

#define CT_OP_ENUM_(N, n, ac) CT_OP_##N,
enum { CT_OP_LIST(CT_OP_ENUM_) CT_OP_COUNT };
#undef CT_OP_ENUM_

#define CT_OP_DECL_(N, n, ac) void ct_bw_##n(ct_ctx *ctx, ct_node *node);
CT_OP_LIST(CT_OP_DECL_)
#undef CT_OP_DECL_

extern const ct_op_def ct_op_table[CT_OP_COUNT];

/* The same rows for nodes whose op ran on low-precision tensors (autocast.c): their
 * backward, ct_bw_lowp, hands the row's f32 backward f32 copies of what the node saved. */
extern const ct_op_def ct_op_table_lp[CT_OP_COUNT];
void ct_bw_lowp(ct_ctx *ctx, ct_node *node);

/* Autocast at an op's entry (autocast.c), by the op's class in the table: casts the
 * arguments (pointers to the op's own parameters) as the policy says and returns false
 * (the op goes on in f32), or, when the op is to run in bf16/f16, swaps them for f32
 * temporaries and returns true: the op is then called again on those (`call`) and
 * ct_ac_leave rounds its result to the low precision and points the node at the real
 * inputs. All-f32 arguments outside a region: false at once (the f32 path is unchanged). */
typedef struct {
    ct_temp_mark mark;
    ct_dtype dt, prev_run;
    int n;
    ct_tensor *orig[CT_NODE_MAX_IN], *tmp[CT_NODE_MAX_IN];
} ct_ac_frame;
bool ct_ac_enter(ct_ctx *ctx, int op, ct_ac_frame *f, int n, ct_tensor **const *args);
/* true when matmul and linear read bf16 tensors themselves in a bf16 run (the bf16 GEMM's
 * packers widen them): autocast then makes no f32 copies of their inputs, forward or backward */
bool ct_ac_reads_bf16(void);
ct_tensor *ct_ac_leave(ct_ctx *ctx, ct_ac_frame *f, ct_tensor *y);
#define CT_AUTOCAST(ctx, op, n, args, call) do {                              \
        ct_ac_frame ac_;                                                      \
        if (ct_ac_enter(ctx, op, &ac_, n, args)) return ct_ac_leave(ctx, &ac_, call); \
    } while (0)

/* the node carries its row, so core's backward walk calls the kernel without knowing it */
static inline ct_node *ct_record(ct_ctx *ctx, int op, ct_tensor *out, int nin, ct_tensor *const *in) {
    return ct_record_op(ctx, &ct_op_table[op], out, nin, in);
}
#endif
