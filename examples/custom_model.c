/* A model ctrain does not ship — a residual MLP — trained by the library's trainer with
 * what `ctrain train` has: DDP, the sampler, evaluation, checkpoints, resume, metrics.
 *
 *   build/ctrain run --standalone --nproc-per-node 2 build/examples/custom_model out 200
 *   (again with the same arguments: it resumes from the newest checkpoint in out/)
 *
 * Data: Fashion-MNIST from CTRAIN_DATA_DIR (default /usr/share/datasets/fashion-mnist). */
#include <stdio.h>
#include <stdlib.h>

#include "ctrain/ctrain.h"

/* y = x + relu(W x + b): the block PyTorch users write as a small nn.Module */
static ct_tensor *residual_forward(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    return ct_add(ctx, x, ct_relu(ctx, ct_linear(ctx, x, m->w, m->b)));
}
static const ct_module_ops RESIDUAL = {.type = "Residual", .forward = residual_forward};

static ct_module *residual(ct_params *P, const char *name, int64_t d) {
    ct_module *m = ct_module_new(&RESIDUAL, name);
    char n[CT_NN_NAME_MAX + 8];
    m->w = ct_param(P, ct_nn_join(n, sizeof n, name, "weight"), 2, (int64_t[]){d, d}, CT_INIT_KAIMING_UNIFORM, (double)d);
    m->b = ct_param(P, ct_nn_join(n, sizeof n, name, "bias"), 1, (int64_t[]){d}, CT_INIT_KAIMING_UNIFORM, (double)d);
    return m;
}

int main(int argc, char **argv) {
    const char *out = argc > 1 ? argv[1] : "output/custom", *ws = getenv("WORLD_SIZE");
    const char *dir = getenv("CTRAIN_DATA_DIR") ? getenv("CTRAIN_DATA_DIR") : "/usr/share/datasets/fashion-mnist";
    int64_t steps = argc > 2 ? atoll(argv[2]) : 200;
    ct_pg *pg = NULL; /* under `ctrain run`: the process group of the launcher's ranks */
    if (ws && atoi(ws) > 1 && ct_dist_init(NULL, &pg) != CT_OK) return fprintf(stderr, "%s\n", ct_last_error()), 1;
    ct_set_num_threads(ct_default_num_threads());
    ct_dataset *train = NULL, *test = NULL;
    if (ct_dataset_idx_open_dir(dir, true, &train) != CT_OK || ct_dataset_idx_open_dir(dir, false, &test) != CT_OK)
        return fprintf(stderr, "%s\n", ct_last_error()), 1;

    ct_params *P;
    if (ct_params_create(&P) != CT_OK) return fprintf(stderr, "%s\n", ct_last_error()), 1;
    ct_module *net = ct_nn_sequential(""); /* state_dict names "1.weight", "3.weight", ... */
    ct_seq_add(net, ct_nn_flatten(1));
    ct_seq_add(net, ct_nn_linear(P, ct_seq_next_name(net), 784, 128, true));
    ct_seq_add(net, ct_nn_relu());
    ct_seq_add(net, residual(P, ct_seq_next_name(net), 128));
    ct_seq_add(net, residual(P, ct_seq_next_name(net), 128));
    ct_seq_add(net, ct_nn_linear(P, ct_seq_next_name(net), 128, 10, true));
    if (ct_params_finalize(P, 42) != CT_OK) return fprintf(stderr, "%s\n", ct_last_error()), 1;
    ct_optim *opt = NULL;
    if (ct_optim_create_sgd(P, &(ct_sgd_opts){.momentum = 0.9}, &opt) != CT_OK) return fprintf(stderr, "%s\n", ct_last_error()), 1;

    ct_train_model model = ct_train_model_module(net, P, "resmlp"); /* cross-entropy loss */
    model.expect = (ct_train_expect){.classes = 10, .ignore_index = -100, .x_numel = 784}; /* checked at create */
    ct_trainer_opts o = ct_trainer_default_opts();
    o.pg = pg;
    o.max_steps = steps;
    o.batch_size = 32;
    o.save_every = steps / 2;
    o.resume = "auto";
    o.output_dir = out;
    o.eval_max = 2000;
    o.log_every = 25;
    ct_trainer *t = NULL;
    ct_status st = ct_trainer_create(&o, &model, opt, train, test, &t);
    if (st == CT_OK) st = ct_trainer_fit(t);
    if (st != CT_OK) fprintf(stderr, "custom_model: %s\n", ct_last_error());
    ct_trainer_free(t);
    ct_optim_free(opt);
    ct_module_free(net);
    ct_params_free(P);
    ct_dataset_free(train);
    ct_dataset_free(test);
    if (pg) ct_pg_free(pg);
    return st == CT_OK ? 0 : 1;
}
