/* ctrain/optim.h — optimizers (SGD, AdamW), learning-rate schedules, gradient clipping by
 * global norm and the mixed-precision gradient scaler. Formulas are PyTorch's (1.13–2.x,
 * single-tensor path), checked against it by tests/unit/test_optim.c.
 *
 *   ct_adamw_opts ao = ct_adamw_default_opts();        // betas 0.9/0.999, eps 1e-8, wd 1e-2
 *   ao.decay_only_ndim_ge2 = true;                      // no decay for biases / LayerNorm (nanoGPT)
 *   ct_optim *opt;
 *   if (ct_optim_create_adamw(P, &ao, &opt) != CT_OK) ...
 *   ct_lr_schedule sched = ct_lr_cosine(6e-4, 6e-5, 100, 5000); // base, min, warmup, total
 *   for (int64_t step = 0; step < 5000; step++) {
 *       ... forward, ct_backward ...
 *       float norm = ct_clip_grad_norm(P, 1.0f);        // torch.nn.utils.clip_grad_norm_
 *       ct_optim_step(opt, ct_lr_at(&sched, step));     // lr per step: schedules stay outside
 *       ct_params_zero_grad(P);
 *   }
 *   // checkpoints (train.h) save and restore its state as named tensors: ct_optim_state_tensor_at
 *   ct_optim_free(opt);
 *
 * The optimizer works on the flat buffers of a ct_params store: parameters, gradients and
 * every state buffer share one layout, so a step is one fused elementwise loop (OpenMP over
 * the buffer; elementwise, hence the same bits for any thread count).
 */
#ifndef CTRAIN_OPTIM_H
#define CTRAIN_OPTIM_H

#include "ctrain/core.h"
#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- optimizers ---- */

typedef struct ct_optim ct_optim;

/* torch.optim.SGD (lr is given to each ct_optim_step):
 *   g = grad (+ weight_decay * p);
 *   momentum: buf = g on the first step, else buf = momentum * buf + (1 - dampening) * g;
 *             g = nesterov ? g + momentum * buf : buf;
 *   p -= lr * g */
typedef struct ct_sgd_opts {
    double momentum;          /* 0 */
    double dampening;         /* 0 */
    double weight_decay;      /* 0 (L2, added to the gradient) */
    bool nesterov;            /* false; needs momentum > 0 and dampening == 0, as PyTorch */
    bool maximize;            /* false */
    bool decay_only_ndim_ge2; /* false; true: parameters with ndim < 2 get no weight decay */
    bool template_only;       /* false; true: no state buffers, a template for ct_optim_create_like
                                 (FSDP steps its shards with a copy); it cannot step */
} ct_sgd_opts;
ct_sgd_opts ct_sgd_default_opts(void);

/* torch.optim.AdamW:
 *   t += 1; p *= 1 - lr * weight_decay;
 *   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g;
 *   amsgrad: vmax = max(vmax, v), used instead of v below;
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps;  p -= (lr / (1 - beta1^t)) * m / denom */
typedef struct ct_adamw_opts {
    double beta1;             /* 0.9 */
    double beta2;             /* 0.999 */
    double eps;               /* 1e-8 */
    double weight_decay;      /* 1e-2 */
    bool amsgrad;             /* false */
    bool maximize;            /* false */
    bool decay_only_ndim_ge2; /* false; true: parameters with ndim < 2 get no weight decay */
    bool template_only;       /* as ct_sgd_opts.template_only */
} ct_adamw_opts;
ct_adamw_opts ct_adamw_default_opts(void);

/* NULL opts = defaults. The store must be finalized. CT_ERR_INVALID for invalid options,
 * CT_ERR_NOMEM when out of memory (*out = NULL, message in ct_last_error()). The optimizer
 * keeps a pointer to the store; free the optimizer first. */
ct_status ct_optim_create_sgd(ct_params *p, const ct_sgd_opts *opts, ct_optim **out);
ct_status ct_optim_create_adamw(ct_params *p, const ct_adamw_opts *opts, ct_optim **out);
void ct_optim_free(ct_optim *o);
/* An optimizer of like's kind and options (and step count) over another store: weight decay
 * is per parameter of the new store from its options (set overrides with
 * ct_optim_set_weight_decay); state starts at zero. FSDP steps its shards with one. */
ct_status ct_optim_create_like(const ct_optim *like, ct_params *p, ct_optim **out);
/* Frees the state buffers: the optimizer is then only a template (kind, options, weight
 * decay per parameter) for ct_optim_create_like; stepping it is a programmer error. The
 * trainer does it under FSDP, whose shards have an optimizer of their own. */
void ct_optim_release_state(ct_optim *o);
bool ct_optim_is_template(const ct_optim *o); /* template_only, or its state released */

/* One update of every parameter from the store's flat gradients, with learning rate lr
 * (double, as PyTorch's Python float: the scalars it derives are computed in double and
 * rounded to float once, exactly as PyTorch does). */
void ct_optim_step(ct_optim *o, double lr);
const char *ct_optim_kind(const ct_optim *o);   /* "sgd" or "adamw" */
ct_params *ct_optim_params(const ct_optim *o);
/* Steps taken so far (AdamW's bias-correction t; for SGD it says whether the momentum
 * buffer exists yet). */
int64_t ct_optim_steps(const ct_optim *o);
/* Parameters on a GPU: the step is one fused kernel per run of equal weight decay, queued on
 * the device's compute stream, and the state buffers (ct_optim_state_buffer) are device
 * memory. CT_OK, or the first failure of such a step (a CPU step cannot fail). */
ct_status ct_optim_status(const ct_optim *o);
/* Moves the state buffers to dev, where the parameters must be moved too before the next
 * step (ct_params_to; like optimizer.load_state_dict's move to the parameters' device).
 * Between a device and the CPU only. On error (out of memory) the state stays where it was.
 * Checkpoints of a GPU model move both to the host and back around the save. */
ct_status ct_optim_to(ct_optim *o, ct_device dev);
ct_device ct_optim_device(const ct_optim *o);
void ct_optim_set_steps(ct_optim *o, int64_t steps);

/* Weight decay of parameter i (PyTorch's param groups, reduced to what training uses):
 * override per parameter, e.g. 0 for embeddings. Buffers are ignored. */
void ct_optim_set_weight_decay(ct_optim *o, int param_index, double weight_decay);
double ct_optim_weight_decay(const ct_optim *o, int param_index);

/* ---- state, for checkpoints ----
 * Flat state buffers in the store's layout (same length as ct_params_numel):
 * SGD with momentum: "momentum_buffer"; AdamW: "exp_avg", "exp_avg_sq" and, with amsgrad,
 * "max_exp_avg_sq" (PyTorch's state names). Writable: copy a saved buffer back, set the
 * step counter with ct_optim_set_steps, and the next step continues bit for bit. */
int ct_optim_state_count(const ct_optim *o);
void ct_optim_state_buffer(const ct_optim *o, int i, const char **name, float **data, size_t *numel);

/* ---- sharded steps (ZeroRedundancyOptimizer; ct_zero in train.h drives them) ----
 * With a shard set, ct_optim_step updates only elements [lo, hi) of the flat buffers —
 * parameters and state in memory every rank maps, each rank owning one share — then calls
 * sync, which returns once every rank has updated its share (its failure lands in
 * ct_optim_status). With averaging on for a step, each element's gradient is averaged from
 * every rank's gradient buffer as the update reads it — ((g0 + g1) + ... + g(n-1)) / n, the
 * shm all-reduce's order and arithmetic, so the bits of reducing first — instead of being
 * read from this rank's buffer. */
typedef struct ct_optim_shard {
    size_t lo, hi;              /* this rank's share of the flat buffers, in floats */
    const float *const *grads;  /* every rank's gradient buffer, in rank order */
    int ngrads;
    ct_status (*sync)(void *user); /* after the share's update: until every rank's is done */
    void (*detach)(void *user);    /* ct_optim_free: the optimizer goes away */
    void *user;
} ct_optim_shard;

/* NULL: the whole buffers again. Does not move the state (ct_optim_set_state_storage). */
void ct_optim_set_shard(ct_optim *o, const ct_optim_shard *s);
/* The next ct_optim_step averages the ranks' gradients itself (the shard's grads). */
void ct_optim_set_average(ct_optim *o, bool on);
/* Moves state buffer k to `buf` (the optimizer's numel floats, 64-byte aligned, the caller's
 * until moved again), copying the values when `copy`; NULL moves it back to private memory
 * with its values. */
ct_status ct_optim_set_state_storage(ct_optim *o, int k, float *buf, bool copy);


/* The same state as named tensors, per parameter with the parameter's shape, so a file of it
 * does not depend on the flat layout: tensor 0 is {state "step", param NULL, I64 scalar};
 * then {state "exp_avg", param "0.weight", F32, the parameter's shape}, ... for every state
 * buffer and trainable parameter. `data` points into the optimizer (writable: copying saved
 * values back restores the state). Checkpoints name them "optim.<state>.<param>" and
 * "optim.step" (src/train/checkpoint.c). */
typedef struct ct_optim_state_tensor {
    const char *state;     /* "step", "momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq" */
    const char *param;     /* parameter name, NULL for "step" */
    ct_dtype dtype;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    void *data;
} ct_optim_state_tensor;
int ct_optim_state_tensor_count(const ct_optim *o);
ct_optim_state_tensor ct_optim_state_tensor_at(ct_optim *o, int i);

/* ---------------------------------------------------------------- schedules ---- */

/* Learning rate for optimizer step `step` (0 for the first step), as
 * torch.optim.lr_scheduler.LambdaLR(opt, lambda) gives it when scheduler.step() follows
 * every optimizer.step(): lr = base_lr * lambda(step). The lambdas are the Hugging Face
 * `transformers` ones (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
 * get_cosine_with_min_lr_schedule_with_warmup), with W = warmup_steps, T = total_steps,
 * r = min_lr / base_lr:
 *   step < W:  lambda = step / W                     (linear warmup from 0; all kinds)
 *   constant:  lambda = 1
 *   linear:    f = max(0, (T - step) / max(1, T - W)),             lambda = r + (1 - r) f
 *   cosine:    f = 0.5 (1 + cos(pi * min(1, (step - W) / max(1, T - W)))), lambda = r + (1 - r) f
 * After T the linear and cosine schedules stay at min_lr (HF's cosine would rise again).
 * With W = 0 the cosine one is torch.optim.lr_scheduler.CosineAnnealingLR(T_max = T,
 * eta_min = min_lr) for steps 0..T. */
typedef enum { CT_LR_CONSTANT = 0, CT_LR_LINEAR, CT_LR_COSINE } ct_lr_kind;
typedef struct ct_lr_schedule {
    ct_lr_kind kind;
    double base_lr;
    double min_lr;          /* linear/cosine floor (0) */
    int64_t warmup_steps;   /* 0 = no warmup */
    int64_t total_steps;    /* linear/cosine: end of the decay, warmup included */
} ct_lr_schedule;

static inline ct_lr_schedule ct_lr_constant(double lr, int64_t warmup_steps) {
    ct_lr_schedule s = {CT_LR_CONSTANT, lr, lr, warmup_steps, 0};
    return s;
}
static inline ct_lr_schedule ct_lr_linear(double base, double min_lr, int64_t warmup, int64_t total) {
    ct_lr_schedule s = {CT_LR_LINEAR, base, min_lr, warmup, total};
    return s;
}
static inline ct_lr_schedule ct_lr_cosine(double base, double min_lr, int64_t warmup, int64_t total) {
    ct_lr_schedule s = {CT_LR_COSINE, base, min_lr, warmup, total};
    return s;
}
double ct_lr_at(const ct_lr_schedule *s, int64_t step);

/* ---------------------------------------------------------------- clipping ---- */

/* torch.nn.utils.clip_grad_norm_(params, max_norm) (L2): total = ||all gradients||, summed in
 * double in fixed-size chunks (same result for any thread count); coef = max_norm /
 * (total + 1e-6) computed in float as PyTorch does; if coef < 1 every gradient is
 * multiplied by it. Returns the total norm before clipping (inf/nan if a gradient is:
 * then, as PyTorch with error_if_nonfinite=False, the gradients become nan). */
float ct_clip_grad_norm(ct_params *p, float max_norm);
/* The global L2 norm alone, in double. */
double ct_grad_norm(const ct_params *p);

/* ---------------------------------------------------------------- grad scaler ---- */

/* torch.cuda.amp.GradScaler's dynamic loss scale:
 *   loss * ct_grad_scaler_scale(s) -> backward -> found_inf = !ct_grad_scaler_unscale_and_check(s, P)
 *   -> if (!found_inf) ct_optim_step(...) -> ct_grad_scaler_update(s, found_inf).
 * update: found_inf: scale *= backoff (not below min_scale), tracker = 0; else tracker += 1
 * and when it reaches growth_interval: scale *= growth (kept only if finite), tracker = 0. */
typedef struct ct_grad_scaler_opts {
    float init_scale;        /* 65536 (2^16) */
    double growth_factor;    /* 2 */
    double backoff_factor;   /* 0.5 */
    int32_t growth_interval; /* 2000 */
    bool enabled;            /* true; false: scale 1, unscale and update do nothing (unscale: true) */
    float min_scale;         /* 1: backoff never goes below it (PyTorch has no floor: 0 = none) */
} ct_grad_scaler_opts;
ct_grad_scaler_opts ct_grad_scaler_default_opts(void);

typedef struct ct_grad_scaler_state {
    float scale;
    int32_t growth_tracker;  /* successful steps since the last change of scale */
} ct_grad_scaler_state;

typedef struct ct_grad_scaler ct_grad_scaler;
/* NULL opts = defaults. CT_ERR_INVALID for a non-positive scale, growth <= 1, backoff
 * outside (0, 1) or interval < 1; CT_ERR_NOMEM when out of memory (*out = NULL). */
ct_status ct_grad_scaler_create(const ct_grad_scaler_opts *opts, ct_grad_scaler **out);
void ct_grad_scaler_free(ct_grad_scaler *s);
float ct_grad_scaler_scale(const ct_grad_scaler *s);
/* Multiply every gradient by 1/scale (the float reciprocal, as PyTorch) and return true when
 * all of them are finite. */
bool ct_grad_scaler_unscale_and_check(ct_grad_scaler *s, ct_params *p);
void ct_grad_scaler_update(ct_grad_scaler *s, bool found_inf);
/* The scale sits at min_scale: steps that still overflow point at a diverged model. */
bool ct_grad_scaler_at_floor(const ct_grad_scaler *s);
ct_grad_scaler_state ct_grad_scaler_get_state(const ct_grad_scaler *s);
void ct_grad_scaler_set_state(ct_grad_scaler *s, ct_grad_scaler_state st);

#ifdef __cplusplus
}
#endif
#endif
