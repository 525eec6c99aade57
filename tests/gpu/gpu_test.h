/* Shared by the GPU tests (tests/gpu): whether a GPU is usable (else the reason to skip),
 * an NCCL process group of world size 1 on it, and a small MLP. */
#ifndef CT_GPU_TEST_H
#define CT_GPU_TEST_H
#include <stdio.h>
#include <stdlib.h>

#include "ctrain/dist.h"
#include "ctrain/models.h"
#include "cuda/cuda.h"

static char no_gpu[600];
/* true when a GPU is usable; otherwise no_gpu holds the reason for the skip */
static inline bool have_gpu(void) {
    int n = 0;
    ct_status st = ct_cuda_device_count(&n);
    if (st == CT_OK && n > 0) return true;
    snprintf(no_gpu, sizeof no_gpu, "no CUDA GPU (%s)", st != CT_OK ? ct_last_error() : "none visible");
    return false;
}
#define NEED_GPU() do { if (!have_gpu()) CT_SKIP(no_gpu); } while (0)

/* the MLP of the device tests: 32 -> 64 -> 48 -> 10, seed 5 */
static inline ct_model *gpu_test_mlp(void) {
    ct_model_config cfg = ct_model_default_config(CT_MODEL_MLP);
    cfg.mlp.in = 32;
    cfg.mlp.n_hidden = 2;
    cfg.mlp.hidden[0] = 64;
    cfg.mlp.hidden[1] = 48;
    cfg.mlp.out = 10;
    ct_model *m = NULL;
    if (ct_model_create(&cfg, 5, &m) != CT_OK) abort();
    return m;
}

/* rank 0 of 1 on the nccl backend (the store is not needed at world size 1) */
static inline ct_status nccl_world1(ct_pg **pg) {
    ct_dist_opts o = ct_dist_default_opts();
    o.rank = 0;
    o.world_size = 1;
    o.backend = "nccl";
    o.timeout_s = 60;
    *pg = NULL;
    return ct_dist_init(&o, pg);
}
#endif
