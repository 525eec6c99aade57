/* What core gives the op kernels (src/ops): the op-table row type, recording a node on the
 * tape, gradient buffers, shape checks, the dropout stream and the counter-based RNG. The
 * op table itself, its rows and their backward functions belong to src/ops (op_table.h
 * there), so core never calls up into the kernels: a node carries its row. */
#ifndef CT_CORE_KERNEL_H
#define CT_CORE_KERNEL_H

#include "ctrain/autograd.h"
#include "core/rng.h"

/* What dtype an op runs in under autocast (PyTorch's lists): matmul-like ops in the
 * low-precision dtype, reductions/losses/norms in f32, the rest follow their input. */
typedef enum { CT_AC_PROMOTE = 0, CT_AC_LOWP, CT_AC_FP32 } ct_autocast_class;

typedef struct ct_op_def {
    const char *name;
    ct_backward_fn backward;
    ct_autocast_class autocast;
} ct_op_def;

/* Record a node if grad mode is on and any input requires grad; marks `out` as requiring
 * grad. Returns NULL when nothing was recorded (then skip saving state). */
ct_node *ct_record_op(ct_ctx *ctx, const ct_op_def *op, ct_tensor *out, int nin, ct_tensor *const *in);
/* Gradient buffer of t for accumulation during backward: the persistent one for
 * parameters, a zeroed arena tensor otherwise. NULL if t does not require grad. */
float *ct_grad_acc(ct_ctx *ctx, ct_tensor *t);
/* The same, except that a buffer allocated by this call is not zeroed and *fresh says so:
 * then the caller must write every element, as if adding to +0 (an op that writes its
 * gradient piecewise saves a pass over memory by zeroing each piece as it goes). */
float *ct_grad_acc_fresh(ct_ctx *ctx, ct_tensor *t, bool *fresh);
/* Shape check that aborts naming the op and both shapes. */
void ct_check_same_shape(const char *op, const char *file, int line, const ct_tensor *a, const ct_tensor *b);
#define CT_CHECK_SAME_SHAPE(op, a, b) ct_check_same_shape(op, __FILE__, __LINE__, a, b)
#define CT_CHECK_CONTIG(op, t) do { if (!ct_is_contiguous(t)) { char b_[96]; \
    ct_fatal(__FILE__, __LINE__, "%s: input %s is not contiguous (use ct_contiguous)", op, ct_shape_str(t, b_, sizeof b_)); } } while (0)
#define CT_CHECK_F32(op, t) do { if ((t)->dtype != CT_F32) { char b_[96]; \
    ct_fatal(__FILE__, __LINE__, "%s: expected f32 input, got %s", op, ct_shape_str(t, b_, sizeof b_)); } } while (0)

/* Stream key for the next dropout call: a pure function of (seed, step, call number in the
 * step), so masks are reproducible, thread-count independent and exact on resume. */
uint64_t ct_ctx_dropout_key(ct_ctx *ctx);

/* Workspace the kernels need per thread, allocated ahead so that no op allocates it (src/ops:
 * GEMM packing buffers). The kernels register how to reserve it (core never calls up into
 * them); ct_ctx_create and ct_set_num_threads call ct_kernel_reserve, where a failure can
 * still be CT_ERR_NOMEM. CT_OK when nothing is registered. */
typedef ct_status (*ct_kernel_reserve_fn)(int nthreads);
void ct_kernel_register_reserve(ct_kernel_reserve_fn fn);
ct_status ct_kernel_reserve(int nthreads);

/* Fires the store's grad hook for parameter i (params.c). */
void ct_params_fire_hook_(struct ct_params *p, int i);

/* Number of OpenMP threads worth using for n elements of light work. */
static inline int ct_omp_threads_for(int64_t n) { return n >= (1 << 15) ? 0 : 1; }
#endif
