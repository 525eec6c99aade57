/* Shared by the GPU tests (tests/gpu): whether a GPU is usable (else the reason to skip),
 * an NCCL process group of world size 1 on it, a small MLP, and a model made twice (the CPU's
 * and cuda:0's) to train side by side. */
#ifndef CT_GPU_TEST_H
#define CT_GPU_TEST_H
#include <stdio.h>
#include <stdlib.h>

#include "ctrain/dist.h"
#include "ctrain/fsdp.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"
#include "ctrain/train.h"
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

/* a GPT of the nanoGPT layout with fused attention, block size 16, created with seed 9
 * (blocks recomputed in backward when ckpt); aborts when it cannot be made */
static inline ct_model *gpu_test_gpt(int n_layer, int n_embd, int n_head, int64_t vocab, bool ckpt) {
    ct_model_config cfg = ct_model_default_config(CT_MODEL_GPT);
    cfg.gpt.checkpoint_activations = ckpt;
    cfg.gpt.n_layer = n_layer;
    cfg.gpt.n_embd = n_embd;
    cfg.gpt.n_head = n_head;
    cfg.gpt.block_size = 16;
    cfg.gpt.vocab_size = vocab;
    cfg.gpt.flash_attention = true;
    ct_model *m = NULL;
    if (ct_model_create(&cfg, 9, &m) != CT_OK) abort();
    return m;
}

/* make() twice: [0] on the CPU, [1] moved to cuda:0, each with AdamW, a context and its
 * ct_train_model, to step side by side; aborts when they cannot be made */
typedef struct {
    ct_model *m[2];
    ct_optim *o[2];
    ct_ctx *c[2];
    ct_train_model tm[2];
} gpu_test_pair;
static inline gpu_test_pair gpu_test_pair_make(ct_model *(*make)(void)) {
    gpu_test_pair p;
    for (int j = 0; j < 2; j++) {
        p.m[j] = make();
        if ((j && ct_module_to(ct_model_module(p.m[j]), CT_CUDA(0)) != CT_OK) ||
            ct_optim_create_adamw(ct_model_params(p.m[j]), NULL, &p.o[j]) != CT_OK || ct_ctx_create(NULL, &p.c[j]) != CT_OK) {
            fprintf(stderr, "gpu_test_pair_make: %s\n", ct_last_error());
            abort();
        }
        p.tm[j] = ct_train_model_builtin(p.m[j]);
    }
    return p;
}
/* one AdamW ct_train_step of each: the CPU's on whole, the device's on mine (through f, sharded
 * training, unless NULL); the CPU's status first */
static inline ct_status gpu_test_pair_step(gpu_test_pair *p, ct_fsdp *f, double lr, double clip, int step, const ct_train_batch *whole,
                                           const ct_train_batch *mine, ct_step_result *rc, ct_step_result *rg) {
    ct_step_args ac = {.ctx = p->c[0], .model = &p->tm[0], .opt = p->o[0], .lr = lr, .clip_norm = clip, .step = step};
    ct_step_args ag = ac;
    ag.ctx = p->c[1], ag.model = &p->tm[1], ag.opt = p->o[1], ag.fsdp = f;
    ct_status st = ct_train_step(&ac, whole, 1, rc);
    return st != CT_OK ? st : ct_train_step(&ag, mine, 1, rg);
}
static inline void gpu_test_pair_free(gpu_test_pair *p) {
    for (int j = 0; j < 2; j++) {
        ct_optim_free(p->o[j]);
        ct_ctx_free(p->c[j]);
        ct_model_free(p->m[j]);
    }
}
#endif
