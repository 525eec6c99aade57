/* Private to src/train: the checkpoint every rank resumes from, agreed over the group
 * (resume.c). */
#ifndef CT_TRAIN_RESUME_H
#define CT_TRAIN_RESUME_H

#include "ctrain/train.h"

/* Resume as `resume` says ("auto": the newest valid checkpoint under
 * output_dir/checkpoints; else a checkpoint directory), every rank from the same state.
 * Alone (pg NULL) it loads what it finds. Under a group the ranks first exchange what each
 * found (step and the CRC-32 of its manifest, host, directory): all the same, each loads its
 * own copy; rank 0's newest and the others' older, absent or unreadable (an output directory
 * per node), rank 0 loads it and broadcasts the weights, the optimizer state and ts; any
 * other disagreement (a rank holding a newer checkpoint than rank 0's, another checkpoint of
 * the same step, or rank 0 without one while another has one) is CT_ERR_MISMATCH on every
 * rank before any step, naming each rank's host, directory and step. Under fsdp (--shard)
 * every rank reads its shards from the one directory all share; a sharded checkpoint only
 * some ranks see is CT_ERR_NOT_FOUND on every rank. *resumed says whether a
 * checkpoint was loaded (none anywhere with "auto": a fresh start); dir gets rank 0's. */
ct_status ct_train_resume_(ct_pg *pg, ct_fsdp *fsdp, const char *resume, const char *output_dir, const ct_train_model *m, ct_optim *o,
                           ct_train_state *ts, bool *resumed, char *dir, size_t n);

/* Every rank's outcome: CT_OK only when all succeeded; a rank that succeeded names the
 * first that did not (its own message says why). Collective. */
ct_status ct_train_all_ok_(ct_pg *pg, ct_status st, const char *what);

#endif
