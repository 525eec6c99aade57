/* ctrain/tensor.h — tensors, the per-step context (arena + tape) and parameter stores.
 *
 *   ct_ctx *ctx;
 *   ct_params *P;
 *   if (ct_ctx_create(NULL, &ctx) != CT_OK) ...         // arena for activations + autograd tape
 *   if (ct_params_create(&P) != CT_OK) ...               // one flat buffer for all weights
 *   ct_tensor *W = ct_param(P, "fc.weight", 2, (int64_t[]){10, 784}, CT_INIT_KAIMING_UNIFORM, 784);
 *   ct_params_finalize(P, 42);                           // allocate + initialise (seed 42)
 *   for (step...) {
 *       ct_tensor *x = ct_from_f32(ctx, batch, 2, (int64_t[]){B, 784});
 *       ct_tensor *loss = ct_cross_entropy(ctx, ct_linear(ctx, x, W, NULL), labels, -100);
 *       ct_backward(ctx, loss);                          // grads accumulate in P's flat grad buffer
 *       ... optimizer step over ct_params_data(P) / ct_params_grad(P) ...
 *       ct_params_zero_grad(P);
 *       ct_ctx_reset(ctx);                               // frees every activation of the step at once
 *   }
 *
 * Tensors are descriptors (struct below) whose storage lives either in a ct_ctx arena
 * (activations: valid until ct_ctx_reset) or in a ct_params flat buffer (parameters).
 * Views (reshape, transpose, slice) share storage. Kernels take contiguous inputs.
 *
 * Constructors (here and in every header) return a ct_status and the object through their
 * last argument: CT_OK, or an error status with *out = NULL and the message in ct_last_error().
 */
#ifndef CTRAIN_TENSOR_H
#define CTRAIN_TENSOR_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CT_MAX_DIMS 5

typedef enum { CT_DEV_CPU = 0, CT_DEV_CUDA = 1, CT_DEV_TYPES } ct_device_type;
typedef struct { ct_device_type type; int index; } ct_device;
#define CT_CPU ((ct_device){CT_DEV_CPU, 0})
#define CT_CUDA(i) ((ct_device){CT_DEV_CUDA, (i)})

/* ---- devices ----
 * Tensors live on the CPU or on a GPU ("cuda:N"). The GPU backend exists in builds with
 * CUDA (it registers itself); elsewhere, and without a driver or a GPU, moving anything to
 * cuda:N fails with CT_ERR_UNSUPPORTED naming the reason.
 *
 *   ct_device dev;
 *   if (ct_device_parse("cuda:0", &dev) != CT_OK) ...
 *   if (ct_module_to(net, dev) != CT_OK) ...            // parameters and gradients (nn.h)
 *   ct_tensor *xd; ct_tensor_to(ctx, x, dev, &xd);       // inputs: a copy on the device
 *   ct_tensor *loss = ct_cross_entropy(ctx, ct_module_forward(ctx, net, xd), yd, -100);
 *   ct_backward(ctx, loss);
 *   if (ct_ctx_status(ctx) != CT_OK) ...                 // an op without a kernel there, OOM
 *
 * Ops run where their inputs are. An op on a device fails (it cannot return a status) by
 * recording the first error in the context: ct_ctx_status returns it, and from then on
 * every device op of the step returns a placeholder without data and does nothing, until
 * ct_ctx_reset (ct_backward then does nothing, ct_item of a placeholder is NaN). CPU ops
 * never take this path. */
/* "cpu", "cuda" (= cuda:0) or "cuda:N"; CT_ERR_INVALID otherwise. Does not check the device exists. */
ct_status ct_device_parse(const char *s, ct_device *out);
/* "cpu" / "cuda:N" into buf; returns buf */
const char *ct_device_str(ct_device d, char *buf, size_t n);
static inline bool ct_device_eq(ct_device a, ct_device b) { return a.type == b.type && (a.type == CT_DEV_CPU || a.index == b.index); }
/* Number of usable devices of a type (CPU: 1); CT_ERR_UNSUPPORTED with the reason when there
 * are none (no CUDA in this build, no driver, no GPU). */
ct_status ct_device_count(ct_device_type type, int *n);
/* What a device is, for reports (`ctrain env`): its name, memory in bytes (free: as nvidia-smi
 * shows it, all processes), and for a GPU its compute capability and multiprocessor count.
 * The CPU, a device type this build lacks, or no such device: zeros and CT_ERR_UNSUPPORTED
 * (CT_ERR_INVALID for an index past the last GPU) with the reason. */
typedef struct ct_device_info {
    char name[256];
    size_t total_bytes, free_bytes;
    int cc_major, cc_minor, sm_count;
} ct_device_info;
ct_status ct_device_info_get(ct_device d, ct_device_info *out);
/* The software under a device type, one line: for CUDA "driver 13.0, runtime 13.0, cuBLASLt
 * 13.0.2, NCCL 2.27.7, cuDNN 9.19.0" (a missing driver reads "driver none", a missing cuDNN
 * says why); "" for the CPU or a type this build lacks. Never fails. */
void ct_device_versions(ct_device_type type, char *buf, size_t n);
/* One collective across every visible device of a type from this process, checked (CUDA: a
 * 64 MiB NCCL all-reduce); report gets a line with the result and its bus bandwidth. No
 * usable device, or a type this build lacks: CT_ERR_UNSUPPORTED with the reason. */
ct_status ct_device_check(ct_device_type type, char *report, size_t len);
/* The device of a type this thread's calls go to when none is named (CUDA: the current
 * device, which the nccl backend sets to its rank's GPU); CT_ERR_UNSUPPORTED as above. */
ct_status ct_device_current(ct_device_type type, ct_device *out);
/* Waits for everything queued on the device (its compute stream). */
ct_status ct_device_sync(ct_device d);
/* Memory of a device's caching allocator, in bytes: handed out now, the most handed out at
 * once, held from the driver (what nvidia-smi shows for this process, less the context).
 * The CPU, or a device type this build lacks: all zero and CT_ERR_UNSUPPORTED. */
typedef struct { size_t current, peak, reserved; } ct_device_mem;
ct_status ct_device_mem_get(ct_device d, ct_device_mem *out);
/* Page-locked ("pinned") host memory for staging copies to d: a copy from it to the device
 * is truly asynchronous, so the buffer must not be rewritten until the device has read it
 * (ct_device_sync, or anything that waits for the compute stream, e.g. ct_item). d on the
 * CPU: plain malloc. Free with ct_host_free(d, p) (the same d). */
ct_status ct_host_alloc(ct_device d, size_t bytes, void **out);
void ct_host_free(ct_device d, void *p);
/* Buffers and conversions outside a context, for code that keeps its own buffers next to a
 * store's (DDP's compressed gradients), the same calls for the CPU and a device. alloc: a
 * buffer on d (the CPU: malloc; a device: its caching allocator), CT_ERR_NOMEM when there is
 * no room; free it with ct_device_free(d, p). convert: y (dtype to) = x (from), n elements of
 * f32/bf16/f16, round to nearest even; scale: x *= coef over n floats. On a device both are
 * queued on its compute stream (ordered with the ops' kernels); the CPU runs them at once. */
ct_status ct_device_alloc(ct_device d, size_t bytes, void **out);
void ct_device_free(ct_device d, void *p);
ct_status ct_device_convert(ct_device d, void *y, ct_dtype to, const void *x, ct_dtype from, int64_t n);
ct_status ct_device_scale(ct_device d, float *x, float coef, int64_t n);
/* The same kind of calls for sharded training (src/train/fsdp.c), each queued on a device's
 * compute stream: bytes set to 0; bytes copied between two of d's buffers; y += x over n
 * floats; and the sum of squares of n floats, waited for (the CPU's summation order). */
ct_status ct_device_zero(ct_device d, void *p, size_t bytes);
ct_status ct_device_copy_within(ct_device d, void *dst, const void *src, size_t bytes);
ct_status ct_device_add(ct_device d, float *y, const float *x, int64_t n);
ct_status ct_device_sumsq(ct_device d, const float *x, int64_t n, double *out);
/* Address ranges whose memory comes and goes: sharded training gives a unit's memory back
 * while every pointer into it (a parameter's tensor, a view saved for backward) stays valid.
 *   void *base; size_t g;
 *   ct_device_reserve(d, bytes, &base, &g);   // bytes of addresses, all mapped, zeros
 *   ct_device_unmap(d, p, k * g);             // p g-aligned: that memory given back
 *   ct_device_map(d, p, k * g);               // fresh zeros there again
 *   ct_device_unreserve(d, base, bytes);
 * g is the CPU's page, or a GPU's allocation granularity (2 MiB on current NVIDIA GPUs). unmap
 * waits for d's queued work first. Touching unmapped memory is a fault on a GPU (an illegal
 * address) and reads zeros on the CPU. map and unmap skip what already is as asked.
 * CT_ERR_NOMEM when the memory is not there, CT_ERR_UNSUPPORTED on a device without it. */
ct_status ct_device_reserve(ct_device d, size_t bytes, void **base, size_t *granule);
ct_status ct_device_map(ct_device d, void *p, size_t bytes);
ct_status ct_device_unmap(ct_device d, void *p, size_t bytes);
void ct_device_unreserve(ct_device d, void *base, size_t bytes);
/* bytes from host memory to d's buffer (to_device), or back; waits until the host side may be
 * reused or read. On the CPU: memcpy. */
ct_status ct_device_copy(ct_device d, void *dst, const void *src, size_t bytes, bool to_device);

enum {
    CT_TF_REQUIRES_GRAD = 1u << 0, /* gradients flow into this tensor */
    CT_TF_PARAM = 1u << 1,         /* lives in a ct_params store; grad is persistent */
    /* a parameter's grad reads as zeros but its memory was not cleared (ct_params_zero_grad):
     * backward's first write stores instead of adding; readers get zeros (ct_params_grad) */
    CT_TF_GRAD_STALE = 1u << 2,
};

struct ct_node;
struct ct_params;

typedef struct ct_tensor {
    ct_dtype dtype;
    ct_device device;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t stride[CT_MAX_DIMS]; /* in elements */
    void *data;                  /* first element */
    struct ct_tensor *grad;      /* same shape, f32, contiguous; NULL until needed */
    struct ct_node *node;        /* autograd node that produced it (NULL for leaves) */
    uint32_t flags;
    int32_t param_id;            /* index in its ct_params, -1 otherwise */
    int32_t uses;                /* param uses recorded this step, counted down by backward */
    struct ct_params *params;    /* owning store for parameters */
    const char *name;            /* parameter name (state_dict key) or NULL */
} ct_tensor;

/* ---- shape helpers ---- */
int64_t ct_numel(const ct_tensor *t);
size_t ct_nbytes(const ct_tensor *t);
bool ct_is_contiguous(const ct_tensor *t);
bool ct_same_shape(const ct_tensor *a, const ct_tensor *b);
/* "[2, 3, 4] f32" into buf; returns buf (for error messages). */
const char *ct_shape_str(const ct_tensor *t, char *buf, size_t n);
static inline float *ct_f32(const ct_tensor *t) { return (float *)t->data; }

/* ---- the per-step context: arena + tape + grad mode ---- */
typedef struct ct_ctx ct_ctx;
typedef struct ct_ctx_opts {
    size_t arena_block;  /* bytes per arena block (default 64 MiB; larger requests get their own block) */
    uint64_t seed;       /* base seed for dropout's counter-based RNG */
} ct_ctx_opts;
ct_ctx_opts ct_ctx_default_opts(void);
/* NULL opts = defaults. CT_ERR_NOMEM when the context, or the GEMM packing buffers for
 * ct_get_num_threads() threads (see ct_set_num_threads), cannot be allocated. */
ct_status ct_ctx_create(const ct_ctx_opts *opts, ct_ctx **out);
void ct_ctx_free(ct_ctx *ctx);
/* Drop every activation and tape node of the step. Blocks are kept for reuse. */
void ct_ctx_reset(ct_ctx *ctx);
size_t ct_ctx_peak_bytes(const ct_ctx *ctx);   /* arena high-water mark since creation */
size_t ct_ctx_used_bytes(const ct_ctx *ctx);
size_t ct_ctx_reserved_bytes(const ct_ctx *ctx);
/* Training mode (dropout active) — like module.train()/eval(). Default true. */
void ct_ctx_set_training(ct_ctx *ctx, bool training);
bool ct_ctx_training(const ct_ctx *ctx);
/* Per-step dropout counter base: changes every step so masks differ. */
void ct_ctx_set_step(ct_ctx *ctx, uint64_t step);

/* Raw arena allocation, 64-byte aligned, valid until ct_ctx_reset. Aborts on OOM
 * (activations cannot be recovered mid-step; the peak is reported in the log). */
void *ct_ctx_alloc(ct_ctx *ctx, size_t bytes);

/* ---- tensor creation in the arena ---- */
ct_tensor *ct_new(ct_ctx *ctx, ct_dtype dt, int ndim, const int64_t *shape);   /* uninitialised */
ct_tensor *ct_zeros(ct_ctx *ctx, ct_dtype dt, int ndim, const int64_t *shape);
ct_tensor *ct_new_like(ct_ctx *ctx, const ct_tensor *t);                       /* same dtype/shape */
ct_tensor *ct_from_f32(ct_ctx *ctx, const float *src, int ndim, const int64_t *shape); /* copies */
ct_tensor *ct_from_data(ct_ctx *ctx, ct_dtype dt, const void *src, int ndim, const int64_t *shape);
/* Wrap external memory (not copied; caller keeps it alive). */
ct_tensor *ct_wrap(ct_ctx *ctx, ct_dtype dt, void *data, int ndim, const int64_t *shape);
void ct_fill(ct_tensor *t, float v);
/* Scalar value of a one-element tensor as double (copied from a device: waits for it;
 * NaN for a placeholder of a failed device op). */
double ct_item(const ct_tensor *t);
/* A copy of t (contiguous) on `dev`, in the context (valid until reset). The copy
 * is not recorded for autograd: it is for data (inputs, targets, results). */
ct_status ct_tensor_to(ct_ctx *ctx, const ct_tensor *t, ct_device dev, ct_tensor **out);
/* CT_OK, or the first failure of a device op in this step (kept until ct_ctx_reset). */
ct_status ct_ctx_status(const ct_ctx *ctx);

/* ---- parameter stores: one flat data buffer + one flat f32 grad buffer ---- */
typedef enum {
    CT_INIT_ZEROS, CT_INIT_ONES,
    CT_INIT_KAIMING_UNIFORM, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): nn.Linear/Conv2d weight and bias */
    CT_INIT_NORMAL,          /* N(0, arg^2) (nn.Embedding: arg = 1; GPT-2: 0.02) */
    CT_INIT_UNIFORM,         /* U(-arg, arg) */
} ct_init;

typedef struct ct_params ct_params;
/* CT_ERR_NOMEM when out of memory. */
ct_status ct_params_create(ct_params **out);
void ct_params_free(ct_params *p);
/* Register a parameter; storage appears at ct_params_finalize. `arg` is fan_in for
 * KAIMING_UNIFORM, std for NORMAL, bound for UNIFORM. Names are copied. Out of memory
 * returns NULL and marks the store failed; a failed store registers nothing more. */
ct_tensor *ct_param(ct_params *p, const char *name, int ndim, const int64_t *shape, ct_init init, double arg);
/* A buffer (state_dict entry without gradient, e.g. a mask). */
ct_tensor *ct_param_buffer(ct_params *p, const char *name, int ndim, const int64_t *shape, ct_init init, double arg);
/* Allocate the flat buffers (64-byte aligned per tensor) and initialise with `seed`. */
ct_status ct_params_finalize(ct_params *p, uint64_t seed);
/* Deferred initialisation (torchdistx's deferred_init, a model on PyTorch's meta device):
 * the layout, the buffers (allocated and initialised) and the tensors, but no flat parameter
 * or gradient storage: ct_params_data and ct_params_grad return NULL and the parameters'
 * data pointers are NULL until ct_params_materialize, or until the caller gives both flat
 * buffers storage (ct_params_set_data_storage / _grad_storage) and makes the values with
 * ct_params_init_range. ct_fsdp_create does that: each rank makes only its shards and the
 * units it keeps, so the whole model is never in one rank's memory. */
ct_status ct_params_finalize_deferred(ct_params *p, uint64_t seed);
bool ct_params_is_deferred(const ct_params *p);
uint64_t ct_params_seed(const ct_params *p); /* finalize's seed */
/* The values ct_params_finalize(p, seed) gives the flat elements [lo, hi) (zeros in the
 * padding between parameters), written to dst: each element depends only on the seed, its
 * parameter's index and its own index, so any range can be made alone, bit for bit. */
void ct_params_init_range(const ct_params *p, uint64_t seed, size_t lo, size_t hi, float *dst);
/* A deferred store allocated and initialised as ct_params_finalize would have (no-op when not
 * deferred). CT_ERR_NOMEM. */
ct_status ct_params_materialize(ct_params *p);
/* The other way: the flat parameters and gradients given up, values lost (storage the store
 * owns is freed; external storage is only forgotten), the store deferred again. For a caller
 * done with the values (ct_fsdp_discard). A device store so given up can only be freed. */
void ct_params_defer(ct_params *p);
/* Failure is sticky: once a registration (or a module constructor, see nn.h) ran out of
 * memory, ct_params_status returns CT_ERR_NOMEM and ct_params_finalize refuses the store
 * with it, so building code checks once. ct_params_fail marks a store (first status kept). */
ct_status ct_params_status(const ct_params *p);
void ct_params_fail(ct_params *p, ct_status st);
int ct_params_count(const ct_params *p);
ct_tensor *ct_params_get(const ct_params *p, int i);
ct_tensor *ct_params_find(const ct_params *p, const char *name);
float *ct_params_data(const ct_params *p);   /* flat f32 parameters (buffers excluded) */
float *ct_params_grad(const ct_params *p);   /* flat f32 gradients, same layout */
/* Gradients of parameters lo..hi (their slice of the flat buffer, from lo's offset): for a
 * reader of a part while backward still writes the rest (DDP's buckets), which
 * ct_params_grad, settling every stale gradient (below), would zero for nothing. */
float *ct_params_grad_range(const ct_params *p, int lo, int hi);
size_t ct_params_numel(const ct_params *p);  /* length of the two flat buffers */
/* Offset (in floats) of parameter i inside the flat buffers. */
size_t ct_params_offset(const ct_params *p, int i);
/* PyTorch's zero_grad(set_to_none=True), with zeros instead of None: on the CPU it marks each
 * gradient stale (CT_TF_GRAD_STALE, O(parameters)); backward's first write of one stores
 * instead of adding, and the gradients it leaves untouched read as zeros after ct_backward,
 * through ct_params_grad (and ct_params_grad_range), in the grad hook and in everything built
 * on them (optimizers, DDP, clipping, the scaler, checkpoints). So take a ct_params_grad
 * pointer after ct_params_zero_grad to write gradients by hand, not before. On a device: a
 * memset on its stream. */
void ct_params_zero_grad(ct_params *p);
/* Moves the flat gradient buffer to `buf` (numel floats, 64-byte aligned, owned by the caller
 * and valid until storage is moved again): current gradients are copied, the grad views
 * re-pointed. NULL moves them back to storage owned by the store. DDP uses it to place
 * gradients in memory shared by the ranks. Cached ct_params_grad() pointers become stale. */
ct_status ct_params_set_grad_storage(ct_params *p, float *buf);
/* The same for the flat parameter buffer: `buf` takes the values (copied when `copy`; without
 * it the caller has put them there, e.g. one rank for all ranks mapping the same memory).
 * NULL moves them back, with their values, to storage owned by the store. DDP's sharded
 * optimizer step (ct_ddp_shard_optimizer) keeps one copy of the parameters per machine.
 * For a store on a device, buf is that device's memory (ct_device_alloc, ct_device_reserve)
 * and the copies are queued on its compute stream; sharded training (ct_fsdp) moves both
 * buffers into ranges whose memory comes and goes. */
ct_status ct_params_set_data_storage(ct_params *p, float *buf, bool copy);
/* Moves the store (parameters, gradients, buffers) to `dev`: the flat buffers are copied
 * and the tensors re-pointed; ct_params_data/ct_params_grad then return device pointers.
 * CT_ERR_UNSUPPORTED when the device cannot be used, CT_ERR_NOMEM when out of memory (the
 * store then stays where it was), CT_ERR_INVALID for external gradient storage. */
ct_status ct_params_to(ct_params *p, ct_device dev);
ct_device ct_params_device(const ct_params *p);
/* Buffers (ct_param_buffer) share a separate flat f32 buffer. */
float *ct_params_buffer_data(const ct_params *p);
size_t ct_params_buffer_numel(const ct_params *p);
bool ct_params_is_buffer(const ct_params *p, int i);
size_t ct_params_bytes(const ct_params *p);
/* Gradient-ready hook: called when backward delivered the last gradient of parameter i
 * for this step (in reverse use order). DDP uses it to launch bucket all-reduces. */
typedef void (*ct_grad_hook)(void *user, ct_params *p, int param_index);
void ct_params_set_grad_hook(ct_params *p, ct_grad_hook fn, void *user);
/* Unit hook: a model brackets the forward of each of its units (a transformer block, a layer)
 * with ct_unit_enter / ct_unit_leave, naming any parameter of the unit (ct_module_forward
 * does it for every module with parameters); the store's hook, if any, sees the calls
 * (nested: the same unit may be entered again inside). FSDP (ctrain/fsdp.h) gathers a unit's
 * parameters on entry and frees them on leaving. Without a hook the calls do nothing. */
typedef void (*ct_unit_hook)(void *user, ct_ctx *ctx, ct_params *p, int param_index, bool enter);
void ct_params_set_unit_hook(ct_params *p, ct_unit_hook fn, void *user);
void ct_unit_enter(ct_ctx *ctx, const ct_tensor *param);
void ct_unit_leave(ct_ctx *ctx, const ct_tensor *param);

#ifdef __cplusplus
}
#endif
#endif
