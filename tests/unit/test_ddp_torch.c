/* ctrain DDP against PyTorch DDP (gloo, 2 ranks, DistributedSampler with shuffle, DataLoader
 * with a partial last batch), from the same initial weights: per-step losses within 1e-4
 * relative, final weights within 1e-4. Reference: tests/torch/gen_ddp.py. */
#include <stdio.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"
#include "ctrain/ddp.h"
#include "ctrain/dist.h"
#include "ctrain/io.h"
#include "ctrain/loader.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"

#define INIT "tests/fixtures/ddp/init.safetensors"
#define REF "tests/fixtures/ddp/ref.safetensors"

static int rank_main(int rank, int world, void *arg) {
    (void)arg;
    ct_st_file *f;
    if (ct_st_open(REF, &f) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
    ct_st_tensor x, y, L;
    if (ct_st_get(f, "x", &x) || ct_st_get(f, "y", &y) || ct_st_get(f, "losses", &L)) return 1;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) { fprintf(stderr, "init: %s\n", ct_last_error()); return 1; }
    ct_model_config c = ct_model_default_config(CT_MODEL_MLP);
    c.mlp.in = 20; c.mlp.n_hidden = 1; c.mlp.hidden[0] = 16; c.mlp.out = 5;
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 99, &m));
    if (ct_model_load(m, INIT) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
    ct_params *P = ct_model_params(m);
    ct_ddp *ddp;
    if (ct_ddp_create(pg, P, NULL, &ddp) != CT_OK) return 1;
    ct_optim *opt; CT_EXPECT_OK(ct_optim_create_sgd(P, &(ct_sgd_opts){.momentum = 0.9}, &opt));
    ct_dataset *ds;
    ct_dataset_tensors(x.data, 20, y.data, 1, x.shape[0], &ds);
    ct_sampler_opts so = ct_sampler_default_opts();
    so.n = x.shape[0]; so.num_replicas = world; so.rank = rank; so.seed = 3;
    ct_sampler *s;
    ct_sampler_create(&so, &s);
    ct_loader_opts lo = ct_loader_default_opts();
    lo.batch_size = 4;
    ct_loader *ld;
    ct_loader_create(ds, s, &lo, &ld);
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    const double *ref = L.data;
    int64_t nref = L.shape[0], step = 0;
    double worst = 0;
    for (int e = 0; e < 3; e++) {
        ct_loader_start_epoch(ld, e);
        ct_batch b;
        while (ct_loader_next(ld, &b) == CT_OK && b.n > 0) {
            ct_tensor *xt = ct_wrap(ctx, CT_F32, b.x, 2, (int64_t[]){b.n, 20});
            ct_tensor *yt = ct_wrap(ctx, CT_I32, b.y, 1, (int64_t[]){b.n});
            ct_tensor *loss = ct_model_loss(ctx, m, xt, yt);
            double lv = ct_item(loss);
            ct_backward(ctx, loss);
            if (ct_ddp_finish(ddp) != CT_OK) return 1;
            ct_all_reduce_sync(pg, &lv, 1, CT_F64, CT_RED_AVG);
            if (step < nref) {
                double e_ = fabs(lv - ref[step]) / fabs(ref[step]);
                if (e_ > worst) worst = e_;
            }
            step++;
            ct_optim_step(opt, 0.05);
            ct_params_zero_grad(P);
            ct_ctx_reset(ctx);
        }
    }
    double wworst = 0;
    for (int i = 0; i < ct_params_count(P); i++) {
        ct_tensor *p = ct_params_get(P, i);
        char name[256];
        snprintf(name, sizeof name, "final.%s", p->name);
        ct_st_tensor r;
        if (ct_st_get(f, name, &r) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
        double e_ = ct_max_rel_err(p->data, r.data, (long)ct_numel(p), 1e-2);
        if (e_ > wworst) wworst = e_;
    }
    int ok = step == nref && worst <= 1e-4 && wworst <= 1e-4;
    if (rank == 0) printf("  %lld steps (reference %lld): loss max rel err %.2e, final weights %.2e\n", (long long)step, (long long)nref, worst, wworst);
    ct_ctx_free(ctx); ct_loader_free(ld); ct_sampler_free(s); ct_dataset_free(ds);
    ct_optim_free(opt); ct_ddp_free(ddp); ct_model_free(m); ct_pg_free(pg); ct_st_close(f);
    return ok ? 0 : 1;
}

CT_TEST(matches_pytorch_ddp_gloo_with_distributed_sampler) {
    if (access(REF, R_OK) != 0) { CT_FAILF("missing %s (run from the repo root)", REF); return; }
    CT_EXPECT_OK(ct_spawn(rank_main, 2, NULL));
}
CT_TEST_MAIN()
