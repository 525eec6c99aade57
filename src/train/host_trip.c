/* A GPU model's checkpoint goes through the host: the safetensors writers and readers, the
 * models' save/load and the optimizer-state tensors all address host memory. Moving the
 * store and the state (ct_params_to, ct_optim_to) re-points every tensor view, and the
 * caching allocator hands the same blocks back on the way home, so a periodic checkpoint
 * costs two copies of the model and state and no cudaMalloc. */
#include <stdio.h>

#include "train/host_trip.h"

ct_status ct_train_to_host_(const ct_train_model *m, ct_optim *o, ct_device *was) {
    *was = ct_params_device(m->params);
    if (was->type == CT_DEV_CPU) return CT_OK;
    ct_status st = ct_params_to(m->params, CT_CPU);
    if (st == CT_OK && o && (st = ct_optim_to(o, CT_CPU)) != CT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        ct_status bs = ct_params_to(m->params, *was); /* all or nothing */
        return ct_error(st, "%s%s", msg, bs != CT_OK ? " (and the parameters could not go back to the GPU)" : "");
    }
    return st;
}

ct_status ct_train_from_host_(const ct_train_model *m, ct_optim *o, ct_device was, ct_status st) {
    if (was.type == CT_DEV_CPU) return st;
    char msg[1024] = "";
    if (st != CT_OK) snprintf(msg, sizeof msg, "%s", ct_last_error());
    ct_status ms = ct_params_to(m->params, was);
    if (ms == CT_OK && o) ms = ct_optim_to(o, was);
    if (ms != CT_OK) return ms;
    if (st != CT_OK) ct_error(st, "%s", msg); /* the work's message, not the move's */
    return st;
}
