/* Private to src/train: what reads a model on the host (checkpoints, saved weights) gets a
 * GPU model's store and optimizer state moved to the CPU for the duration (host_trip.c). */
#ifndef CT_TRAIN_HOST_TRIP_H
#define CT_TRAIN_HOST_TRIP_H

#include "ctrain/train.h"

/* Moves m's store and o's state (o may be NULL) to the CPU; *was gets where they were.
 * Already on the CPU: nothing moves. On error nothing has moved. */
ct_status ct_train_to_host_(const ct_train_model *m, ct_optim *o, ct_device *was);
/* Moves them back to was; st (the outcome of the work in between) is returned unless the
 * move itself fails, whose error then comes first (the model is left on the host). */
ct_status ct_train_from_host_(const ct_train_model *m, ct_optim *o, ct_device was, ct_status st);

#endif
