/* ctrain/fsdp.h — fully sharded data parallel: parameters, gradients and optimizer state
 * split across the ranks, a unit's full parameters gathered only while it runs.
 *
 *   ct_fsdp *f;
 *   if (ct_fsdp_create(pg, ct_model_params(model), opt, CT_SHARD_FULL, &f) != CT_OK) ...
 *   for (step...) {
 *       ct_fsdp_begin_step(f);
 *       ct_tensor *loss = ct_model_loss(ctx, model, x, y);  // units gathered on entry, freed on leaving
 *       ct_fsdp_pre_backward(f);
 *       ct_backward(ctx, loss);                  // units gathered again, grads reduce-scattered
 *       if (ct_fsdp_post_backward(f) != CT_OK) ...
 *       ct_fsdp_step(f, lr);                     // each rank steps its shard
 *       ct_params_zero_grad(P);
 *       ct_ctx_reset(ctx);
 *   }
 *   ct_fsdp_free(f);                             // the full parameters come back into P
 *
 * Units: parameters whose names share the prefix up to their first numeric component
 * ("transformer.h.3.", "0.") form one unit (a transformer block, a layer); the rest (GPT's
 * embeddings and final norm, tied to the head) is the root unit, gathered all the time. A
 * unit's parameters must be consecutive in the store. Each unit's flat range is padded to a
 * multiple of the world size and split evenly: rank r owns the r-th part of every unit.
 * Models bracket units with ct_unit_enter / ct_unit_leave (ct_module_forward does).
 *
 * Modes (PyTorch's ShardingStrategy):
 *   CT_SHARD_FULL        FULL_SHARD: a unit is gathered before its forward and freed after
 *                        it, gathered again before its backward (when the unit after it in
 *                        forward order finished backward) and freed once its gradients are
 *                        reduce-scattered.
 *   CT_SHARD_GRAD_OPTIM  SHARD_GRAD_OP: gathered in forward and kept until its gradients are
 *                        reduce-scattered.
 *   CT_SHARD_OPTIM       ZeRO-1: parameters and gradients stay whole on every rank;
 *                        gradients are reduce-scattered, each rank steps its shard, and the
 *                        updated shards are all-gathered after the step.
 *   CT_SHARD_NONE        no FSDP: DDP (the trainer's default path).
 * Freed memory: P's flat parameter and gradient buffers are mappings of their own, a unit's
 * whole pages given back with madvise(MADV_DONTNEED); the pointers stay valid (views taken
 * in forward still point at the right place once gathered again).
 * Gradients are averaged with ct_reduce_scatter (CT_RED_AVG), per backward (accumulation
 * sums the averaged shards); the optimizer is an optimizer like `like` (ct_optim_create_like)
 * over this rank's pieces of each parameter, with the parameter's weight decay. Runs on any
 * backend with all-gather and reduce-scatter; the store must be on the CPU. */
#ifndef CTRAIN_FSDP_H
#define CTRAIN_FSDP_H

#include "ctrain/dist.h"
#include "ctrain/io.h"
#include "ctrain/optim.h"
#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CT_SHARD_NONE = 0, CT_SHARD_OPTIM, CT_SHARD_GRAD_OPTIM, CT_SHARD_FULL } ct_shard_mode;
const char *ct_shard_mode_name(ct_shard_mode m); /* "none", "optim", "grad-optim", "full" */
ct_status ct_shard_mode_parse(const char *s, ct_shard_mode *out);

typedef struct ct_fsdp ct_fsdp;

/* Bytes of this rank, counted by the module and measured (resident pages, mincore). */
typedef struct ct_fsdp_mem {
    int units;                    /* root included */
    size_t full_param_bytes;      /* the unsharded parameters (= their gradients) */
    size_t root_bytes;            /* the root unit's parameters, gathered all the time */
    size_t largest_unit_bytes;
    size_t shard_param_bytes;     /* this rank's shards (the optimizer's parameters) */
    size_t shard_grad_bytes;
    size_t optim_state_bytes;     /* this rank's optimizer state */
    size_t peak_gathered_bytes;   /* most non-root unit parameters gathered at once in a training step (counted) */
    size_t peak_resident_bytes;   /* most resident pages of P's flat parameters + gradients (measured
                                     at every gather and reduce-scatter of a training step) */
    size_t staging_bytes;         /* the collectives' buffers: two units (one gathering, one prefetched) */
    size_t peak_total_bytes;      /* peak_resident + shards + their grads + state + staging */
    int64_t gathers, reduce_scatters;
    uint64_t gathered_bytes;      /* what this rank's parameter all-gathers received (all ranks' parts) */
} ct_fsdp_mem;

/* Collective. Broadcasts P's parameters and buffers from rank 0, splits them, moves P's flat
 * buffers into mappings of their own and frees what the mode does not keep. A deferred store
 * (ct_params_finalize_deferred, ct_model_create_deferred) is initialised sharded: rank 0's
 * seed is broadcast and each rank makes only its pieces and the units it keeps gathered (the
 * same values as the whole model's), so no rank ever holds the whole model. like: the
 * optimizer to imitate (its state is not copied: create the FSDP before the first step).
 * CT_ERR_UNSUPPORTED for a store on a device or units not consecutive; CT_ERR_NOMEM. */
ct_status ct_fsdp_create(ct_pg *pg, ct_params *P, const ct_optim *like, ct_shard_mode mode, ct_fsdp **out);
/* Gathers every unit back into P (collective when the group is alive), then frees. */
void ct_fsdp_free(ct_fsdp *f);
/* Frees without gathering (not collective): P's parameters and gradients are given up and P
 * is deferred again (ct_params_defer), so no rank ever holds the whole model; for a caller
 * done with the values, e.g. once ct_fsdp_stream wrote them. */
void ct_fsdp_discard(ct_fsdp *f);
ct_optim *ct_fsdp_optim(ct_fsdp *f);       /* the shards' optimizer */
ct_shard_mode ct_fsdp_mode(const ct_fsdp *f);
/* Off by default: each gather waits. On: while a unit runs, the next one's all-gather is in
 * flight (asynchronous, on the group's comm thread): forward in the last training forward's
 * order, backward in reverse. One more unit of staging; the comm thread's allocations add
 * address space (a malloc arena), which matters under RLIMIT_AS. */
void ct_fsdp_set_prefetch(ct_fsdp *f, bool on);
/* What the parameter all-gathers carry: CT_F32 (default) or CT_BF16, as FSDP's
 * MixedPrecision(param_dtype=torch.bfloat16): each rank rounds its f32 shard to bf16 before
 * the gather, so the gathered units (and the root, and in CT_SHARD_OPTIM every unit) hold the
 * master weights rounded to bf16, and the gathers move half the bytes. The shards, their
 * gradients (reduce-scattered in f32) and the optimizer stay f32; ct_fsdp_gather_all still
 * gathers f32, so saved and exported weights are the masters. Local (no collective); call it
 * on every rank alike. CT_ERR_INVALID for another dtype. */
ct_status ct_fsdp_set_param_dtype(ct_fsdp *f, ct_dtype dt);
ct_status ct_fsdp_begin_step(ct_fsdp *f);  /* zeroes the shards' gradients */
ct_status ct_fsdp_pre_backward(ct_fsdp *f); /* before each ct_backward */
/* After each ct_backward: every unit's gradients reduce-scattered (an unused parameter is an
 * error naming it), or the first failure of a collective. */
ct_status ct_fsdp_post_backward(ct_fsdp *f);
/* torch.nn.utils.clip_grad_norm_ over the shards: the norm of all ranks' shards (an
 * all-reduce of the sums of squares); returns it (NaN when the collective failed). */
double ct_fsdp_clip_grad_norm(ct_fsdp *f, double max_norm);
/* The shards' optimizer step, then the all-gathers the mode needs (the root; every unit in
 * CT_SHARD_OPTIM). */
ct_status ct_fsdp_step(ct_fsdp *f, double lr);
/* Collective, for fp16 loss scaling (PyTorch's ShardedGradScaler.unscale_): this rank's shard
 * gradients multiplied by 1 / scale (ct_grad_scaler_unscale_and_check), and whether any rank
 * found an inf or NaN in its shards (an all-reduce of the flag: each rank sees only its
 * shards). Then skip the step when *found_inf, and ct_grad_scaler_update(s, *found_inf). */
ct_status ct_fsdp_unscale(ct_fsdp *f, ct_grad_scaler *s, bool *found_inf);
/* Instead of ct_fsdp_step when the step is skipped: the shards and the gathered units stay. */
ct_status ct_fsdp_skip_step(ct_fsdp *f);
/* Collective: a whole-model file written by rank 0 without the whole model in any rank's
 * memory (FSDP's FULL_STATE_DICT with rank0_only, a unit at a time): rank 0 calls
 * write(arg, fetch, user), a save that calls fetch before each tensor's bytes are written
 * (ct_model_save_fetch, ct_train_model.save_fetch); when a tensor of a unit not gathered
 * comes, every rank gathers that unit in f32 (the masters) and frees the one streamed before;
 * the other ranks follow rank 0's requests until it is done. Rank 0 returns write's status,
 * every rank the collectives'. */
ct_status ct_fsdp_stream(ct_fsdp *f, ct_status (*write)(void *arg, ct_st_fetch_fn fetch, void *user), void *arg);
/* Collective: every unit gathered into P (to save or export the model), and back. */
ct_status ct_fsdp_gather_all(ct_fsdp *f);
ct_status ct_fsdp_reshard(ct_fsdp *f);
ct_fsdp_mem ct_fsdp_memory(const ct_fsdp *f);

/* Sharded checkpoints, as torch.distributed.checkpoint lays them out: each rank writes its
 * shards of the parameters and of the optimizer state to a file of its own; one index
 * (CT_FSDP_INDEX) names, per parameter, which file holds which element range. A rank
 * loading reads the ranges its own shards cover from whichever files hold them, so a
 * checkpoint written by N ranks loads at any number of ranks (and whole, without a group).
 * The trainer's --save-every / --resume use these inside its atomic checkpoint directories.
 *
 *   dir/shard-00002-of-00004.safetensors   rank 2's pieces "<param>", "optim.<state>.<param>",
 *                                          "optim.step" (rank 0's file also the buffers,
 *                                          "buffer.<name>")
 *   dir/shards.json                        {"world_size": 4, "files": [...], "optimizer": "adamw",
 *                                           "params": {"<param>": {"shape": [...],
 *                                           "shards": [[rank, offset, length], ...]}}} */
#define CT_FSDP_INDEX "shards.json"
/* "shard-%05d-of-%05d.safetensors" of rank r of n, into buf. */
void ct_fsdp_shard_file(int r, int n, char *buf, size_t cap);
/* This rank's file under dir (not collective). CT_ERR_IO naming the path. */
ct_status ct_fsdp_save_shard(ct_fsdp *f, const char *dir);
/* The index of every rank's layout, written by one rank (not collective). */
ct_status ct_fsdp_save_index(const ct_fsdp *f, const char *dir);
/* Collective: this rank's shards and their optimizer state read from a sharded checkpoint
 * written at any world size, then what stays gathered is gathered again. Everything is
 * checked before anything changes: another model's parameters or shapes, another optimizer,
 * a range no file covers, a missing or truncated file are CT_ERR_FORMAT / CT_ERR_MISMATCH
 * naming the file and tensor, and leave the shards as they were. */
ct_status ct_fsdp_load_shards(ct_fsdp *f, const char *dir);
/* Not collective: every parameter of P (and buffer) whole from a sharded checkpoint, and,
 * when o is not NULL, o's state (an optimizer over P) whole too: to export the model or to
 * resume it unsharded. Checked before anything changes, as ct_fsdp_load_shards. */
ct_status ct_fsdp_read_full(const char *dir, ct_params *P, ct_optim *o);
/* A built-in model (ctrain/models.h) whole from a sharded checkpoint directory, built from the
 * config its train state carries: for eval, generate and `ctrain export`. */
struct ct_model;
ct_status ct_fsdp_open_model(const char *dir, struct ct_model **out);
/* The world size a sharded checkpoint directory was written at; 0 when dir has no index. */
int ct_fsdp_checkpoint_world(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
