/* The tutorial's §3.2 program in C: init the process group, build the model, wrap it in
 * DDP, shard the data with a DistributedSampler, and run the epoch loop — the loop written
 * out, one ct_train_step per batch (examples/custom_model.c lets the trainer run it).
 *
 *   build/ctrain run --nproc-per-node 2 build/examples/ddp_minimal     # like torchrun
 *   build/examples/ddp_minimal --spawn 2                               # like mp.spawn
 *
 * Data: Fashion-MNIST from CTRAIN_DATA_DIR (default /usr/share/datasets/fashion-mnist);
 * the first 2048 training images keep the run short. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "ctrain/ddp.h"
#include "ctrain/dist.h"
#include "ctrain/loader.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"

static int train(int rank, int world, void *arg) {
    (void)arg;
    /* dist.init_process_group(...): ranks and rendezvous come from the launcher's environment */
    ct_pg *pg = NULL;
    if (world > 1 && ct_dist_init(NULL, &pg) != CT_OK) {
        fprintf(stderr, "rank %d: init: %s\n", rank, ct_last_error());
        return 1;
    }
    ct_set_num_threads(ct_default_num_threads());

    /* the dataset: every rank opens it; the sampler decides who sees what */
    const char *dir = getenv("CTRAIN_DATA_DIR") ? getenv("CTRAIN_DATA_DIR") : "/usr/share/datasets/fashion-mnist";
    ct_dataset *data;
    if (ct_dataset_idx_open_dir(dir, true, &data) != CT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, ct_last_error());
        return 1;
    }

    /* model = Net().to(rank); model = DDP(model) — DDP broadcasts rank 0's weights */
    ct_model_config cfg = ct_model_default_config(CT_MODEL_MLP);
    cfg.mlp.n_hidden = 1;
    cfg.mlp.hidden[0] = 128;
    ct_model *model; ct_model_create(&cfg, 42, &model);
    ct_params *P = ct_model_params(model);
    ct_ddp *ddp = NULL;
    if (pg && ct_ddp_create(pg, P, NULL, &ddp) != CT_OK) {
        fprintf(stderr, "rank %d: DDP: %s\n", rank, ct_last_error());
        return 1;
    }
    ct_optim *opt; ct_optim_create_sgd(P, &(ct_sgd_opts){.momentum = 0.9}, &opt);

    /* DistributedSampler(dataset, num_replicas=world, rank=rank) + DataLoader(batch_size=32) */
    ct_sampler_opts so = ct_sampler_default_opts();
    so.n = 2048;
    so.num_replicas = world;
    so.rank = rank;
    ct_sampler *sampler;
    ct_sampler_create(&so, &sampler);
    ct_loader_opts lo = ct_loader_default_opts();
    lo.batch_size = 32;
    ct_loader *loader;
    ct_loader_create(data, sampler, &lo, &loader);

    ct_ctx *ctx; /* this step's activations; reset after each step */
    if (ct_ctx_create(NULL, &ctx) != CT_OK) return 1;
    ct_train_model tm = ct_train_model_builtin(model);
    ct_step_args sa = {.ctx = ctx, .model = &tm, .opt = opt, .ddp = ddp, .lr = 0.05};
    int status = 0;
    for (int epoch = 0; epoch < 2 && !status; epoch++) {
        ct_loader_start_epoch(loader, epoch); /* sampler.set_epoch(epoch): a new shuffle */
        double sum = 0;
        int steps = 0;
        ct_batch b;
        while (ct_loader_next(loader, &b) == CT_OK && b.n > 0) {
            /* forward, backward (buckets all-reduce during it), DDP's average, optimizer step */
            ct_train_batch tb = ct_train_batch_of(CT_F32, b.x, 2, (int64_t[]){b.n, 784}, b.y, 1, (int64_t[]){b.n});
            ct_step_result r;
            if (ct_train_step(&sa, &tb, 1, &r) != CT_OK) { /* a peer failed or timed out */
                fprintf(stderr, "rank %d: %s\n", rank, ct_last_error());
                status = 1;
                break;
            }
            sum += r.loss;
            sa.step++;
            steps++;
        }
        if (rank == 0 && steps) printf("epoch %d: mean loss %.4f over %d steps\n", epoch, sum / steps, steps);
    }
    ct_ctx_free(ctx);
    ct_loader_free(loader);
    ct_sampler_free(sampler);
    ct_optim_free(opt);
    ct_ddp_free(ddp);
    ct_model_free(model);
    ct_dataset_free(data);
    if (pg) ct_pg_free(pg);
    return status;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--spawn")) { /* mp.spawn(train, nprocs=N) */
        ct_status st = ct_spawn(train, atoi(argv[2]), NULL);
        if (st != CT_OK) fprintf(stderr, "spawn: %s\n", ct_last_error());
        return st == CT_OK ? 0 : 1;
    }
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    return train(r ? atoi(r) : 0, w ? atoi(w) : 1, NULL);
}
