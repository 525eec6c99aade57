/* What core gives the op kernels (src/ops): the op-table row type, recording a node on the
 * tape, gradient buffers, shape checks, the dropout stream and the counter-based RNG. The
 * op table itself, its rows and their backward functions belong to src/ops (op_table.h
 * there), so core never calls up into the kernels: a node carries its row. */
#ifndef CT_CORE_KERNEL_H
#define CT_CORE_KERNEL_H

#include <stdio.h>

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

/* Memory an op keeps past its return (saved state for backward) while it may be running
 * on temporaries (below): like ct_ctx_alloc, never a temporary. */
void *ct_ctx_alloc_keep(ct_ctx *ctx, size_t bytes);
/* Temporaries: between begin and end every ct_ctx_alloc / ct_new (except nodes and
 * ct_ctx_alloc_keep) comes from a separate block list that end rewinds. Autocast runs an op
 * on f32 copies of its low-precision inputs this way (src/ops/autocast.c). */
typedef struct { void *cur; size_t cur_used, used; } ct_temp_mark;
ct_temp_mark ct_ctx_temp_begin_(ct_ctx *ctx);
void ct_ctx_temp_end_(ct_ctx *ctx, ct_temp_mark m);
int ct_ctx_temp_depth_(const ct_ctx *ctx);
/* The low-precision dtype an op is running in on f32 copies (forward or backward; CT_F32
 * when none): GEMMs then take the bf16 path. set returns the previous one. */
ct_dtype ct_ctx_lowp_run_(const ct_ctx *ctx);
ct_dtype ct_ctx_set_lowp_run_(ct_ctx *ctx, ct_dtype dt);
/* Set while an op runs for a node whose output values nobody reads (ct_linear_unevaluated):
 * it records as usual and may leave the output zero. set returns the previous state. */
bool ct_ctx_values_unread_(const ct_ctx *ctx);
bool ct_ctx_set_values_unread_(ct_ctx *ctx, bool on);
/* The autocast weight cache of the current region (autograd.c): the cast of `param` to dt
 * made with (grad) or without gradient, or NULL; put remembers one (ignored when full). */
ct_tensor *ct_autocast_cache_get_(ct_ctx *ctx, const ct_tensor *param, ct_dtype dt, bool grad);
void ct_autocast_cache_put_(ct_ctx *ctx, ct_tensor *param, ct_tensor *cast, ct_dtype dt, bool grad);
/* > 0 while an activation-checkpointed segment runs (counting or recomputing): no caching */
bool ct_ckpt_active_(const ct_ctx *ctx);

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

/* ---- device backends (device.c) ----
 * What core needs from a device's runtime to hold tensors there. A backend (src/cuda)
 * registers its hooks when the program starts; core never calls it otherwise. Copies and
 * fills are queued on the device's compute stream; a copy to the host waits for it. */
typedef enum { CT_COPY_H2D, CT_COPY_D2H, CT_COPY_D2D } ct_copy_kind;
typedef enum { CT_DEV_OPTIM_SGD, CT_DEV_OPTIM_ADAMW } ct_device_optim;
typedef struct ct_device_hooks {
    ct_status (*count)(int *n);
    ct_status (*alloc)(int dev, size_t bytes, void **out);
    void (*free)(void *p);
    ct_status (*copy)(int dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind);
    ct_status (*zero)(int dev, void *p, size_t bytes);
    ct_status (*sync)(int dev);
    /* one fused optimizer pass over n elements (src/optim): consts is the ops/kmath.h
     * struct of the kind (ct_k_sgd, ct_k_adamw); s0..s2 its state buffers (NULL if unused) */
    ct_status (*optim)(int dev, ct_device_optim kind, const void *consts, float *p, const float *g, float *s0, float *s1,
                       float *s2, int64_t n);
    /* page-locked host memory for asynchronous copies to dev, and its release */
    ct_status (*host_alloc)(int dev, size_t bytes, void **out);
    void (*host_free)(void *p);
    /* the caching allocator's bytes of dev: handed out, peak, reserved */
    void (*mem)(int dev, size_t *current, size_t *peak, size_t *reserved);
    /* gradient clipping and loss scaling (src/optim): the sum of squares of g[0, n) by
     * ops/kmath.h's chunks, in order (the CPU's bits), waited for; and g *= coef, with
     * *nonfinite (may be NULL) set when a value was inf or NaN before scaling, waited for */
    ct_status (*sumsq)(int dev, const float *g, int64_t n, double *out);
    ct_status (*scale)(int dev, float *g, float coef, int64_t n, bool *nonfinite);
    /* autocast on the device (src/ops/autocast.c): y = x converted between f32, bf16 and
     * f16 (to nearest even), n elements; and g rounded in place to dt's precision, kept f32
     * (the value a low-precision gradient holds). Queued on the compute stream. */
    ct_status (*convert)(int dev, void *y, ct_dtype to, const void *x, ct_dtype from, int64_t n);
    ct_status (*round)(int dev, float *g, ct_dtype dt, int64_t n);
    /* y += x, n f32 elements, queued on the compute stream (src/train/fsdp.c: a reduce-scattered
     * shard added to the shard's gradients) */
    ct_status (*add)(int dev, float *y, const float *x, int64_t n);
    /* y[0, n) = v, queued on the compute stream (backward's seed dloss = 1: nothing uploaded).
     * May be NULL: the value is then copied from the host. */
    ct_status (*fill)(int dev, float *y, float v, int64_t n);
    /* address ranges whose memory comes and goes (tensor.h's ct_device_reserve; src/train/fsdp.c
     * gives a released unit's memory back while pointers into it stay valid): reserve bytes of
     * addresses, all mapped and zeroed, *granule the unit map and unmap take; map fresh zeroed
     * memory under granule-aligned [p, p + bytes) where none is; unmap what is mapped there
     * once the device's queued work is done; release the range and its memory */
    ct_status (*vm_reserve)(int dev, size_t bytes, void **base, size_t *granule);
    ct_status (*vm_map)(int dev, void *p, size_t bytes);
    ct_status (*vm_unmap)(int dev, void *p, size_t bytes);
    void (*vm_release)(int dev, void *base, size_t bytes);
    /* reports (tensor.h: ct_device_info_get, ct_device_versions, ct_device_check) and the
     * calling thread's current device (ct_device_current) */
    ct_status (*info)(int dev, ct_device_info *out);
    void (*versions)(char *buf, size_t n);
    ct_status (*check)(char *report, size_t len);
    ct_status (*current)(int *dev);
} ct_device_hooks;
void ct_device_register(ct_device_type type, const ct_device_hooks *h);
/* The hooks of d's type, or NULL with CT_ERR_UNSUPPORTED set ("no cuda backend in this build") */
const ct_device_hooks *ct_device_hooks_get(ct_device d, const char *op);
/* Device memory for the step (freed at ct_ctx_reset); NULL and the context failed on error */
void *ct_ctx_dev_alloc(ct_ctx *ctx, ct_device d, size_t bytes, const char *op);
/* A tensor on d (contiguous, uninitialised); a placeholder without data when the context
 * has failed or allocation fails (which fails the context) */
ct_tensor *ct_new_on(ct_ctx *ctx, ct_device d, ct_dtype dt, int ndim, const int64_t *shape, const char *op);
/* Low-precision activation gradients (src/ops/autocast.c, ct_ac_grad_lowp): a fresh gradient
 * of t in dt on t's device (NULL when t needs none, has one, or is on the CPU); and t's
 * gradient made f32, exactly, when it is a low-precision one. Every op that adds to an
 * existing gradient gets an f32 one (ct_grad_acc widens it first). */
void *ct_grad_fresh_as_(ct_ctx *ctx, ct_tensor *t, ct_dtype dt);
void ct_grad_widen_(ct_ctx *ctx, ct_tensor *t);
/* A device view's backward (reshape, contiguous) without a copy: from's gradient buffer becomes
 * to's, when to has none yet and is no parameter (same number of elements, contiguous); false
 * otherwise (the caller adds it). */
bool ct_grad_handoff_(ct_ctx *ctx, ct_tensor *from, ct_tensor *to);
/* Returns a buffer from ct_ctx_dev_alloc before the step ends (stream order keeps it safe);
 * a pointer it did not hand out is ignored */
void ct_ctx_dev_free_(ct_ctx *ctx, void *p);
/* Records st as the context's failure (the first one is kept); returns st */
ct_status ct_ctx_fail(ct_ctx *ctx, ct_status st);
/* Fires the store's grad hook for parameter i (params.c), its gradient settled first. */
void ct_params_fire_hook_(struct ct_params *p, int i);

/* ---- per-op device time (CTRAIN_DEVICE_PROFILE=1; devprof.c) ----
 * The op dispatch and the backward walk wrap each device op: begin waits for the device and
 * reads the clock, end waits again and adds the time to the op's row (forward or backward).
 * Off, begin returns false and costs a flag test. */
bool ct_devprof_begin(ct_device d, double *t0);
void ct_devprof_end(ct_device d, const char *op, bool backward, double t0);
/* the rows, most time first: op, calls, milliseconds forward and backward; then clears them */
void ct_devprof_report(FILE *f);
/* clears the rows (a benchmark leaves its warm-up steps out) */
void ct_devprof_reset(void);

/* Number of OpenMP threads worth using for n elements of light work. */
static inline int ct_omp_threads_for(int64_t n) { return n >= (1 << 15) ? 0 : 1; }
#endif
