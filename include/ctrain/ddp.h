/* ctrain/ddp.h — DistributedDataParallel: every rank trains the same model on its share of
 * the batch and ends each step with the same averaged gradients.
 *
 *   ct_ddp *ddp;
 *   ct_ddp_opts o = ct_ddp_default_opts();
 *   if (ct_ddp_create(pg, ct_model_params(model), &o, &ddp) != CT_OK) { ...ct_last_error()... }
 *   for (step...) {
 *       ct_tensor *loss = ct_model_loss(ctx, model, x, y);
 *       ct_backward(ctx, loss);        // buckets all-reduce as soon as their grads are ready
 *       if (ct_ddp_finish(ddp) != CT_OK) { ... a peer died or timed out ... }
 *       ct_optim_step(opt, lr);        // every rank applies the same averaged gradient
 *       ct_params_zero_grad(P);
 *       ct_ctx_reset(ctx);
 *   }
 *   ct_ddp_free(ddp);
 *
 * Creation checks that every rank has the same parameter names, shapes and dtypes (the first
 * difference is named on every rank) and broadcasts parameters and buffers from rank 0.
 * Buckets are slices of the flat gradient buffer, in reverse parameter order (the order
 * backward produces gradients): no copies. A bucket's asynchronous all-reduce starts when
 * its last gradient arrives, so communication overlaps the rest of backward; buckets are
 * launched in index order on every rank.
 * Zero-copy (opts.zero_copy; shm backend with f32 traffic, or hier with any under
 * CTRAIN_DDP_SHARD_HIER=1, where the ranks of each machine share it): ct_params_grad(P) then points into a segment
 * shared by the ranks — re-read it after ct_ddp_create and ct_ddp_free (it moves back) — and
 * peers read and write it until ct_ddp_finish returns. Free the DDP before the process group.
 */
#ifndef CTRAIN_DDP_H
#define CTRAIN_DDP_H

#include "ctrain/dist.h"
#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_ddp ct_ddp;

typedef struct ct_ddp_opts {
    size_t bucket_cap_bytes;    /* default 25 MiB (PyTorch's bucket_cap_mb=25) */
    size_t first_bucket_bytes;  /* default 1 MiB: the first bucket starts communicating early */
    bool find_unused_parameters;/* parameters without a gradient are reduced as zeros instead of an error */
    ct_dtype comm_dtype;        /* CT_F32 (default), CT_BF16 or CT_F16: compress the gradient traffic */
    bool broadcast_buffers;     /* broadcast buffers from rank 0 at creation (default true) */
    bool zero_copy;             /* default true: on the shm backend with f32 traffic, the gradient buffer
                                   moves into memory shared by the ranks and buckets are reduced in
                                   place there (no staging copies); on hier with CTRAIN_DDP_SHARD_HIER=1,
                                   shared by each machine's ranks, for ct_zero; CTRAIN_DDP_ZERO_COPY=0 turns it off */
} ct_ddp_opts;

typedef struct ct_ddp_stats {
    int buckets;
    double compute_s;  /* last step: time from the previous ct_ddp_finish to this one's start
                          (data, forward, backward, optimizer) */
    double comm_s;     /* sum over buckets of launch→completion time, last step */
    double exposed_s;  /* time ct_ddp_finish waited, last step (communication not hidden) */
    double hidden_frac;/* 1 - exposed / comm, last step */
    double total_comm_s, total_exposed_s, total_compute_s; /* over all steps */
    int64_t steps;
    bool deferred;     /* last step: nothing all-reduced, the reader averaged (comm = its waits) */
} ct_ddp_stats;

ct_ddp_opts ct_ddp_default_opts(void);
ct_status ct_ddp_create(ct_pg *pg, ct_params *params, const ct_ddp_opts *opts, ct_ddp **out);
void ct_ddp_free(ct_ddp *ddp);
/* Gradient accumulation: while on, backward only accumulates locally (like `with no_sync()`).
 * The first step after turning it off reduces the accumulated gradients. */
void ct_ddp_set_no_sync(ct_ddp *ddp, bool no_sync);
/* Waits for every bucket (launching those whose parameters got no gradient when
 * find_unused_parameters is on), leaving the averaged gradients in the flat buffer.
 * A parameter that got no gradient without find_unused_parameters is an error naming it. */
ct_status ct_ddp_finish(ct_ddp *ddp);
ct_ddp_stats ct_ddp_get_stats(const ct_ddp *ddp);

/* Deferred averaging (what ct_zero, train.h, builds on): while on, backward reduces no
 * bucket and ct_ddp_finish only waits until every rank's backward is done, leaving each rank
 * its own gradients in the shared buffer, for a reader that averages them itself. Needs the
 * zero-copy buffer (CT_ERR_INVALID otherwise). Set between steps. */
ct_status ct_ddp_set_deferred(ct_ddp *ddp, bool on);
/* While deferred: fn(user, lo) is called during backward each time the gradients of
 * [lo, numel) of the flat buffer became final on this rank (whole parameters, from the last
 * down as backward finishes them; lo only falls), so that the reader can start on them
 * before backward ends. fn NULL: none. Set between steps. */
typedef void (*ct_ddp_progress_fn)(void *user, size_t lo);
void ct_ddp_set_progress(ct_ddp *ddp, ct_ddp_progress_fn fn, void *user);
bool ct_ddp_zero_copy(const ct_ddp *ddp); /* the gradients are in memory shared by the ranks */
ct_dtype ct_ddp_comm_dtype(const ct_ddp *ddp); /* opts.comm_dtype: f32, or the compression's dtype */
ct_pg *ct_ddp_pg(const ct_ddp *ddp);
ct_params *ct_ddp_params(const ct_ddp *ddp);
/* Counts a wait that belongs to the gradient exchange (a sharded step's) in the statistics. */
void ct_ddp_add_wait(ct_ddp *ddp, double seconds);
int ct_ddp_num_buckets(const ct_ddp *ddp);
/* Parameter index range [first, last] of bucket b (first >= last: reverse order). */
void ct_ddp_bucket_range(const ct_ddp *ddp, int b, int *first_param, int *last_param);

#ifdef __cplusplus
}
#endif
#endif
