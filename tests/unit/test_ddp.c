/* DDP equivalence: 2 ranks x batch B must follow 1 rank x batch 2B (same initial weights,
 * same global batches) step for step — losses and final weights within 1e-5 — for each
 * model. Also: parameter mismatch across ranks is named; unused parameters are reported;
 * bf16 compression stays close. Ranks are forked with ct_spawn. */
#include <stdio.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"
#include "ctrain/ddp.h"
#include "ctrain/dist.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"

#define STEPS 30
#define B 4 /* per rank */

typedef struct {
    ct_model_kind kind;
    float losses[STEPS];
    char out[128]; /* where rank 0 writes losses + weights */
    ct_dtype comm;
} job;

static ct_model_config small(ct_model_kind k) {
    ct_model_config c = ct_model_default_config(k);
    if (k == CT_MODEL_MLP) { c.mlp.in = 20; c.mlp.n_hidden = 2; c.mlp.hidden[0] = 32; c.mlp.hidden[1] = 16; c.mlp.out = 5; }
    if (k == CT_MODEL_CNN) { c.cnn.c1 = 4; c.cnn.c2 = 8; c.cnn.fc = 16; }
    if (k == CT_MODEL_GPT) { c.gpt.n_layer = 2; c.gpt.n_embd = 16; c.gpt.n_head = 2; c.gpt.block_size = 8; c.gpt.vocab_size = 11; }
    return c;
}

/* Deterministic global batch `step`: rows [first, first+n). */
static void make_batch(ct_ctx *ctx, ct_model_kind k, int step, int first, int n, ct_tensor **x, ct_tensor **y) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
#define RNG() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, s)
    if (k == CT_MODEL_GPT) {
        *x = ct_new(ctx, CT_I32, 2, (int64_t[]){n, 8});
        *y = ct_new(ctx, CT_I32, 2, (int64_t[]){n, 8});
        for (int r = 0; r < 2 * B; r++)
            for (int t = 0; t < 8; t++) {
                int32_t a = (int32_t)(RNG() % 11), b = (int32_t)(RNG() % 11);
                if (r >= first && r < first + n) { ((int32_t *)(*x)->data)[(r - first) * 8 + t] = a; ((int32_t *)(*y)->data)[(r - first) * 8 + t] = b; }
            }
        return;
    }
    int64_t feat = k == CT_MODEL_MLP ? 20 : 784;
    *x = k == CT_MODEL_MLP ? ct_new(ctx, CT_F32, 2, (int64_t[]){n, 20}) : ct_new(ctx, CT_F32, 4, (int64_t[]){n, 1, 28, 28});
    *y = ct_new(ctx, CT_I32, 1, (int64_t[]){n});
    for (int r = 0; r < 2 * B; r++) {
        for (int64_t j = 0; j < feat; j++) {
            float v = (float)((RNG() >> 40) * (1.0 / 16777216.0)) - 0.5f;
            if (r >= first && r < first + n) ct_f32(*x)[(r - first) * feat + j] = v;
        }
        int32_t c = (int32_t)(RNG() % 5);
        if (r >= first && r < first + n) ((int32_t *)(*y)->data)[r - first] = c;
    }
#undef RNG
}

/* Train STEPS steps; pg NULL = single process on the whole global batch. */
static int train(job *j, ct_pg *pg, float *final_w, size_t *nw) {
    ct_model_config c = small(j->kind);
    ct_model *m = ct_model_create(&c, 7);
    ct_params *P = ct_model_params(m);
    ct_ddp *ddp = NULL;
    if (pg) {
        ct_ddp_opts o = ct_ddp_default_opts();
        o.first_bucket_bytes = 256; /* several buckets even for small models */
        o.bucket_cap_bytes = 2048;
        o.comm_dtype = j->comm;
        if (ct_ddp_create(pg, P, &o, &ddp) != CT_OK) { fprintf(stderr, "ddp: %s\n", ct_last_error()); return 1; }
    }
    ct_optim *opt = ct_optim_create_sgd(P, &(ct_sgd_opts){.momentum = 0.9});
    ct_ctx *ctx = ct_ctx_create(NULL);
    int rank = pg ? ct_pg_rank(pg) : 0;
    for (int s = 0; s < STEPS; s++) {
        ct_tensor *x, *y;
        make_batch(ctx, j->kind, s, pg ? rank * B : 0, pg ? B : 2 * B, &x, &y);
        ct_tensor *loss = ct_model_loss(ctx, m, x, y);
        float lv = (float)ct_item(loss);
        ct_backward(ctx, loss);
        if (ddp && ct_ddp_finish(ddp) != CT_OK) { fprintf(stderr, "finish: %s\n", ct_last_error()); return 1; }
        if (pg) ct_all_reduce_sync(pg, &lv, 1, CT_F32, CT_RED_AVG);
        j->losses[s] = lv;
        ct_optim_step(opt, 0.05);
        ct_params_zero_grad(P);
        ct_ctx_reset(ctx);
    }
    *nw = ct_params_numel(P);
    memcpy(final_w, ct_params_data(P), *nw * sizeof(float));
    ct_ctx_free(ctx);
    ct_optim_free(opt);
    ct_ddp_free(ddp);
    ct_model_free(m);
    return 0;
}

static float W1[400000], W2[400000];

static int rank_main(int rank, int n, void *arg) {
    (void)n;
    job *j = arg;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) { fprintf(stderr, "init: %s\n", ct_last_error()); return 1; }
    size_t nw;
    int rc = train(j, pg, W2, &nw);
    if (rc == 0 && rank == 0) {
        FILE *f = fopen(j->out, "wb");
        fwrite(j->losses, sizeof(float), STEPS, f);
        fwrite(&nw, sizeof nw, 1, f);
        fwrite(W2, sizeof(float), nw, f);
        fclose(f);
    }
    ct_pg_free(pg);
    return rc;
}

static void check_equivalence(ct_model_kind k, ct_dtype comm, double tol, double wtol) {
    job j = {.kind = k, .comm = comm};
    snprintf(j.out, sizeof j.out, "/tmp/ct_ddp_%d_%d.bin", (int)getpid(), (int)k);
    ct_status st = ct_spawn(rank_main, 2, &j);
    if (st != CT_OK) { CT_FAILF("spawn: %s", ct_last_error()); return; }
    float dl[STEPS];
    size_t nw2 = 0;
    FILE *f = fopen(j.out, "rb");
    CT_ASSERT(f);
    CT_ASSERT(fread(dl, sizeof(float), STEPS, f) == STEPS);
    CT_ASSERT(fread(&nw2, sizeof nw2, 1, f) == 1);
    CT_ASSERT(fread(W2, sizeof(float), nw2, f) == nw2);
    fclose(f);
    unlink(j.out);
    job single = {.kind = k};
    size_t nw1;
    CT_ASSERT(train(&single, NULL, W1, &nw1) == 0);
    CT_EXPECT_EQ(nw1, nw2);
    double le = ct_max_rel_err(dl, single.losses, STEPS, 1e-6);
    double we = ct_max_rel_err(W2, W1, (long)nw1, 1e-2);
    printf("  %s (%s traffic): loss max rel err %.2e, weights %.2e\n", ct_model_kind_name(k), ct_dtype_name(comm), le, we);
    CT_EXPECT(le <= tol);
    CT_EXPECT(we <= wtol);
}

CT_TEST(mlp_two_ranks_equal_one_rank_double_batch) { check_equivalence(CT_MODEL_MLP, CT_F32, 1e-5, 1e-5); }
CT_TEST(cnn_two_ranks_equal_one_rank_double_batch) { check_equivalence(CT_MODEL_CNN, CT_F32, 1e-5, 1e-5); }
CT_TEST(gpt_two_ranks_equal_one_rank_double_batch) { check_equivalence(CT_MODEL_GPT, CT_F32, 1e-5, 1e-5); }
/* bf16 traffic rounds each gradient to 8 bits of mantissa: losses stay within 1e-3, weights
 * drift by a few percent of the 1e-2 floor (tiny weights move relatively most). */
CT_TEST(bf16_compression_stays_close) { check_equivalence(CT_MODEL_MLP, CT_BF16, 1e-3, 0.5); }

static int mismatch_main(int rank, int n, void *arg) {
    (void)n; (void)arg;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) return 1;
    ct_model_config c = small(CT_MODEL_MLP);
    if (rank == 1) c.mlp.hidden[1] = 17;
    ct_model *m = ct_model_create(&c, 7);
    ct_ddp *ddp;
    ct_status st = ct_ddp_create(pg, ct_model_params(m), NULL, &ddp);
    int ok = st == CT_ERR_MISMATCH && strstr(ct_last_error(), "'2.weight'") != NULL;
    if (!ok) fprintf(stderr, "rank %d: status %d: %s\n", rank, st, ct_last_error());
    ct_model_free(m);
    ct_pg_free(pg);
    return ok ? 0 : 1;
}
CT_TEST(parameter_mismatch_named_on_every_rank) { CT_EXPECT_OK(ct_spawn(mismatch_main, 2, NULL)); }

static int unused_main(int rank, int n, void *arg) {
    (void)rank; (void)n; (void)arg;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) return 1;
    ct_params *P = ct_params_create();
    ct_tensor *w = ct_param(P, "used.weight", 2, (int64_t[]){3, 4}, CT_INIT_ONES, 0);
    ct_param(P, "unused.weight", 2, (int64_t[]){3, 4}, CT_INIT_ONES, 0);
    ct_params_finalize(P, 1);
    ct_ddp *ddp;
    if (ct_ddp_create(pg, P, NULL, &ddp) != CT_OK) return 1;
    ct_ctx *ctx = ct_ctx_create(NULL);
    ct_tensor *x = ct_zeros(ctx, CT_F32, 2, (int64_t[]){2, 4});
    ct_backward(ctx, ct_sum(ctx, ct_linear(ctx, x, w, NULL)));
    ct_status st = ct_ddp_finish(ddp);
    int ok = st == CT_ERR_INVALID && strstr(ct_last_error(), "unused.weight");
    ct_ddp_free(ddp);
    /* with find_unused_parameters the same step succeeds */
    ct_ddp_opts o = ct_ddp_default_opts();
    o.find_unused_parameters = true;
    if (ct_ddp_create(pg, P, &o, &ddp) != CT_OK) return 1;
    ct_ctx_reset(ctx);
    x = ct_zeros(ctx, CT_F32, 2, (int64_t[]){2, 4});
    ct_backward(ctx, ct_sum(ctx, ct_linear(ctx, x, w, NULL)));
    ok = ok && ct_ddp_finish(ddp) == CT_OK;
    ct_ddp_free(ddp);
    ct_ctx_free(ctx);
    ct_params_free(P);
    ct_pg_free(pg);
    return ok ? 0 : 1;
}
CT_TEST(unused_parameter_named_or_handled) { CT_EXPECT_OK(ct_spawn(unused_main, 2, NULL)); }
CT_TEST_MAIN()
