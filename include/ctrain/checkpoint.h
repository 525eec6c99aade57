/* ctrain/checkpoint.h — atomic, verified training checkpoints and exact resume.
 *
 *   ct_train_state ts = {.step = step, .epoch = epoch, .sampler = ct_loader_state(L), .seed = seed};
 *   if (rank == 0 && ct_checkpoint_save("output/checkpoints", model, opt, &ts, 3) != CT_OK)
 *       fprintf(stderr, "checkpoint: %s\n", ct_last_error());     // training goes on; nothing lost
 *
 *   char dir[4096];
 *   if (ct_checkpoint_find_latest("output/checkpoints", dir, sizeof dir) == CT_OK)
 *       ct_checkpoint_load(dir, model, opt, &ts);                   // then continue from ts
 *
 * A checkpoint is a directory `step-00001234/` holding model.safetensors (PyTorch
 * state_dict names), train_state.safetensors (optimizer state, step, epoch, sampler
 * position, seeds) and manifest.json (size and CRC-32 of each file). It is written under a
 * temporary name, fsynced and renamed, so a crash or a full disk never leaves a checkpoint
 * that looks complete; the last `keep` are kept.
 */
#ifndef CTRAIN_CHECKPOINT_H
#define CTRAIN_CHECKPOINT_H

#include "ctrain/data.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_train_state {
    int64_t step;              /* optimizer steps done */
    int64_t epoch;
    ct_sampler_state sampler;  /* global position of the next unseen sample */
    uint64_t seed;             /* run seed (initialisation, shuffling, dropout) */
    int world_size;            /* ranks that wrote it (informational: resume may use another) */
    double loss_scale;         /* mixed precision scaler state (0 = none) */
    int64_t scaler_growth_tracker;
} ct_train_state;

ct_status ct_checkpoint_save(const char *root, const ct_model *m, const ct_optim *o, const ct_train_state *ts, int keep);
/* Newest checkpoint under root whose manifest verifies; CT_ERR_NOT_FOUND if none. */
ct_status ct_checkpoint_find_latest(const char *root, char *dir, size_t n);
/* Checks every file of the manifest (size and CRC-32). */
ct_status ct_checkpoint_verify(const char *dir);
/* Verifies, then loads model weights, optimizer state and ts. A checkpoint of another model
 * (names, shapes, kind) or optimizer is CT_ERR_MISMATCH naming the difference; on any error
 * model and optimizer are unchanged. */
ct_status ct_checkpoint_load(const char *dir, ct_model *m, ct_optim *o, ct_train_state *ts);

#ifdef __cplusplus
}
#endif
#endif
