/* Private to src/train: one job per output directory. */
#ifndef CT_TRAIN_OUTPUT_LOCK_H
#define CT_TRAIN_OUTPUT_LOCK_H

#include "ctrain/core.h"

/* Creates dir if needed and takes dir/.lock (an exclusive flock, the holder's pid inside).
 * A lock held by a live process is CT_ERR_INVALID naming the directory and that pid; the
 * kernel drops the lock of a process that dies, however it dies, so a stale file never
 * blocks. *fd gets the descriptor to pass to ct_output_unlock. */
ct_status ct_output_lock(const char *dir, int *fd);
void ct_output_unlock(int fd);

#endif
