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
    X(SILU,           silu,           CT_AC_PROMOTE)    \
    X(DROPOUT,        dropout,        CT_AC_PROMOTE)    \
    X(SOFTMAX,        softmax,        CT_AC_FP32)       \
    X(LOG_SOFTMAX,    log_softmax,    CT_AC_FP32)       \
    X(CROSS_ENTROPY,  cross_entropy,  CT_AC_FP32)       \
    X(MSE_LOSS,       mse_loss,       CT_AC_FP32)       \
    X(LAYER_NORM,     layer_norm,     CT_AC_FP32)       \
    X(RMS_NORM,       rms_norm,       CT_AC_FP32)       \
    X(EMBEDDING,      embedding,      CT_AC_PROMOTE)    \
    X(CONV2D,         conv2d,         CT_AC_LOWP)       \
    X(MAX_POOL2D,     max_pool2d,     CT_AC_PROMOTE)    \
    X(RELU_MAX_POOL2D, relu_max_pool2d, CT_AC_PROMOTE)  \
    X(AVG_POOL2D,     avg_pool2d,     CT_AC_PROMOTE)    \
    X(SPLIT_HEADS,    split_heads,    CT_AC_PROMOTE)    \
    X(MERGE_HEADS,    merge_heads,    CT_AC_PROMOTE)    \
    X(ROPE,           rope,           CT_AC_PROMOTE)    \
    X(REPEAT_KV,      repeat_kv,      CT_AC_PROMOTE)    \
    X(ATTENTION,      attention,      CT_AC_LOWP)       \
    X(ATTENTION_QKV,  attention_qkv,  CT_AC_LOWP)       \
    X(FLASH_ATTENTION, flash_attention, CT_AC_LOWP) \
    X(FLASH_ATTENTION_QKV, flash_attention_qkv, CT_AC_LOWP) \
    X(CAST,           cast,           CT_AC_PROMOTE)    \
    X(PAD_ROWS,       pad_rows,       CT_AC_PROMOTE)

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
    bool direct; /* the op reads its low-precision inputs itself (no f32 copies) */
    ct_tensor *orig[CT_NODE_MAX_IN], *tmp[CT_NODE_MAX_IN];
} ct_ac_frame;
bool ct_ac_enter(ct_ctx *ctx, int op, ct_ac_frame *f, int n, ct_tensor **const *args);
/* true when matmul and linear read bf16 tensors themselves in a bf16 run (the bf16 GEMM's
 * packers widen them): autocast then makes no f32 copies of their inputs, forward or backward */
bool ct_ac_reads_bf16(void);
/* true when ct_flash_attention_qkv reads a bf16 qkv itself on the CPU (its AVX-512 kernels):
 * no f32 copies of qkv or of its output, forward or backward */
bool ct_flash_reads_bf16(void);
ct_tensor *ct_ac_leave(ct_ctx *ctx, ct_ac_frame *f, ct_tensor *y);
#define CT_AUTOCAST(ctx, op, n, args, call) do {                              \
        ct_ac_frame ac_;                                                      \
        if (ct_ac_enter(ctx, op, &ac_, n, args)) return ct_ac_leave(ctx, &ac_, call); \
    } while (0)

/* ---- the device column ----
 * Every op's row has a second half for tensors on a GPU: its forward and its backward
 * there. A device backend (src/cuda) fills the column when the program starts
 * (ct_op_register_device); an op it leaves empty fails on the device with a status naming
 * the op and the device (ct_ctx_status) instead of touching device memory on the host.
 * The forwards take their arguments in one struct, so one dispatch serves every op: the
 * op's tensors in `in` (in the order of the CPU function), its integer and float arguments
 * in i[] and f[]. The backward is recorded on the node like the CPU one: the autograd walk
 * is the same for every device. */
typedef struct {
    ct_tensor *in[4];
    int64_t i[4];
    double f[4];
} ct_op_args;
typedef ct_tensor *(*ct_op_dev_fwd)(ct_ctx *ctx, const ct_op_args *a);
typedef struct {
    ct_op_dev_fwd forward; /* NULL: no kernel (views: the CPU forward, which only re-describes) */
    ct_op_def row;         /* name, backward on the device, autocast class */
    unsigned lowp_in;      /* bit i: input i is read as bf16/f16 as it is (ct_op_device_reads_lowp) */
    unsigned lowp_dt;      /* which of them: bit CT_BF16, bit CT_F16 */
    unsigned lowp_grad_dt; /* its backward reads a bf16/f16 output's gradient in that dtype (ct_op_device_grad_lowp) */
} ct_op_dev_entry;
extern ct_op_dev_entry ct_op_table_dev[CT_OP_COUNT];
/* the device rows of nodes whose op ran under autocast on low-precision tensors: ct_bw_lowp,
 * which hands the device row's backward f32 copies made on the device */
extern const ct_op_def ct_op_table_dev_lp[CT_OP_COUNT];
void ct_op_register_device(ct_device_type type, int op, ct_op_dev_fwd fwd, ct_backward_fn bwd);
/* The device's forward and backward of op read the inputs of in_mask (bit i: input i) in bf16
 * and/or f16 themselves, with f32 arithmetic, and give a result in the precision autocast runs
 * the op in, rounded to nearest even as stored. dtypes: the runs it does so in, bits of
 * CT_BF16 and CT_F16 (a result in that precision) and CT_F32 (an f32 result from
 * low-precision inputs: an f32 op, or mixed inputs). Autocast then makes no f32 copies of
 * those inputs, forward or backward; it copies the others (src/ops/autocast.c).
 * in_mask 0: every input copied (the default). */
void ct_op_device_reads_lowp(int op, unsigned in_mask, unsigned dtypes);
/* The device's backward of op reads the gradient of its bf16/f16 output (dtypes: bits of CT_BF16
 * and CT_F16) in the output's dtype when it comes so, as well as in f32. The ops that write
 * that gradient fresh then write it in the low precision (ct_ac_grad_lowp): PyTorch's bf16
 * gradient of a bf16 tensor, without the f32 buffer, its rounding pass and the GEMM's copy. */
void ct_op_device_grad_lowp(int op, unsigned dtypes);
/* Where t (a bf16/f16 tensor on a device) gets its gradient in its own dtype: a fresh buffer
 * for a backward that writes it whole (=, not +=) in that dtype, rounded to nearest even. NULL
 * when the op that made t does not read it so (ct_op_device_grad_lowp), t already has a
 * gradient (the op then adds to it in f32), or t is f32, on the CPU, a parameter or needs none. */
void *ct_ac_grad_lowp(ct_ctx *ctx, ct_tensor *t);
bool ct_ac_takes_grad_lowp(const ct_tensor *t); /* whether ct_ac_grad_lowp would give one */

/* the device of the op's tensor arguments: true when one is not on the CPU */
static inline bool ct_op_on_device(const ct_op_args *a) {
    for (int i = 0; i < 4; i++)
        if (a->in[i] && a->in[i]->device.type != CT_DEV_CPU) return true;
    return false;
}
/* runs the op's device forward, or fails the context and returns a placeholder. Autocast
 * applies here for the device (the CPU ops call CT_AUTOCAST after CT_DEV_DISPATCH): the same
 * ct_ac_enter/ct_ac_leave around the device forward, so one policy serves both. */
ct_tensor *ct_op_dispatch(ct_ctx *ctx, int op, const ct_op_args *a);
/* At an op's entry, before anything touches data: tensors on a device go to the column. */
#define CT_DEV_DISPATCH(ctx, op, ...) do {                                      \
        const ct_op_args a_ = {__VA_ARGS__};                                    \
        if (ct_op_on_device(&a_)) return ct_op_dispatch(ctx, op, &a_);          \
    } while (0)

/* Argument checks shared by an op's CPU and device forwards (abort naming the op and the
 * shapes: programmer errors). matmul: two 2-d or two 3-d (same batch) contiguous tensors;
 * add: b's shape a trailing part of a's; linear: x [..., in], w [out, in], b [out] or NULL.
 * matmul's and linear's dtypes are the caller's to check: the CPU GEMMs also read bf16. */
void ct_check_matmul(const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, int64_t *M, int64_t *N, int64_t *K,
                     int64_t *batch);
void ct_check_add(const ct_tensor *a, const ct_tensor *b);
void ct_check_add_shapes(const ct_tensor *a, const ct_tensor *b); /* the same without the dtypes (any float) */
void ct_check_linear(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, int64_t *rows, int64_t *in, int64_t *out);
/* conv2d: x [N, C, H, W], w [O, C, kh, kw], b [O] or NULL, all f32 and contiguous; the
 * output's height and width. pool2d (op names it): x [N, C, H, W] f32 contiguous, padding at
 * most half the kernel; *stride <= 0 becomes the kernel (PyTorch's default). */
void ct_check_conv2d(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, int stride, int padding, int64_t *OH,
                     int64_t *OW);
void ct_check_pool2d(const char *op, const ct_tensor *x, int kernel, int *stride, int padding, int64_t *OH, int64_t *OW);
/* the same without the dtypes (a device op reading bf16/f16 checks those itself) */
void ct_check_conv2d_shapes(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, int stride, int padding, int64_t *OH,
                            int64_t *OW);
void ct_check_pool2d_shapes(const char *op, const ct_tensor *x, int kernel, int *stride, int padding, int64_t *OH,
                            int64_t *OW);
/* bias_add: f32 contiguous x [N, C, ...] and b [C]; inner = the elements per (n, c) */
void ct_check_bias_add(const ct_tensor *x, const ct_tensor *b, int64_t *N, int64_t *C, int64_t *inner);
void ct_check_bias_add_shapes(const ct_tensor *x, const ct_tensor *b, int64_t *N, int64_t *C, int64_t *inner); /* any float */
/* pad_rows: contiguous x of at least one dim, rows >= 0; shape: x's with rows more in dim 0 */
void ct_check_pad_rows(const ct_tensor *x, int64_t rows, int64_t *shape);
/* rope: contiguous x [..., T, D] with D even (any float dtype: the caller checks it), positions
 * NULL or contiguous [T] i32/i64, theta > 0; R the rows of T positions */
void ct_check_rope_shapes(const ct_tensor *x, const ct_tensor *pos, float theta, int64_t *R, int64_t *T, int64_t *D);
/* attention and flash_attention (op): f32 contiguous q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] */
void ct_check_attention(const char *op, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v);
/* the same with k, v of KV heads, KV dividing H (grouped-query attention: flash_attention) */
void ct_check_attention_gqa(const char *op, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v);

/* the node carries its row, so core's backward walk calls the kernel without knowing it */
static inline ct_node *ct_record(ct_ctx *ctx, int op, ct_tensor *out, int nin, ct_tensor *const *in) {
    return ct_record_op(ctx, out->device.type == CT_DEV_CPU ? &ct_op_table[op] : &ct_op_table_dev[op].row, out, nin, in);
}
#endif
