/* DDP equivalence: N ranks x batch B must follow 1 rank x batch NB (same initial weights,
 * same global batches) step for step — losses and final weights within 1e-5 — for each
 * model, with zero-copy (the default on shm) and with the staged path; so must gradient
 * accumulation (K micro-batches per step, alone and under DDP) against one K times larger
 * batch. Every step is ct_train_step, the trainer's. Also: both paths give
 * bit-identical weights; parameter mismatch across ranks is named; unused parameters are
 * reported; bf16 compression stays close; a stalled or vanished peer is an error, not a
 * hang. Ranks are forked with ct_spawn. */
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"
#include "ctrain/ddp.h"
#include "ctrain/dist.h"
#include "ctrain/config.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"

#define STEPS 30
#define B 4 /* per rank */

typedef struct {
    ct_model_kind kind;
    float losses[STEPS];
    char out[128]; /* where rank 0 writes losses + weights */
    ct_dtype comm;
    int nranks;     /* global batch = nranks * B (the single-process run uses all of it) */
    bool staged;    /* zero_copy off */
    bool zc_active; /* out: the gradient buffer moved into shared memory */
    int accum;      /* micro-batches of B per step and rank (0 = 1) */
    bool adamw;     /* AdamW instead of SGD with momentum */
    bool sgd_full;  /* SGD with nesterov and weight decay: every input of the update matters */
    bool shard;     /* ct_ddp_shard_optimizer */
    bool sharded;   /* out: it took effect */
    double clip;    /* clip_norm: the gradients are read before the step (no averaging in it) */
    bool ddp_first; /* free the sharded step before the optimizer (the other order detaches) */
} job;

static ct_model_config small(ct_model_kind k) {
    ct_model_config c = ct_model_default_config(k);
    if (k == CT_MODEL_MLP) { c.mlp.in = 20; c.mlp.n_hidden = 2; c.mlp.hidden[0] = 32; c.mlp.hidden[1] = 16; c.mlp.out = 5; }
    if (k == CT_MODEL_CNN) { c.cnn.c1 = 4; c.cnn.c2 = 8; c.cnn.fc = 16; }
    if (k == CT_MODEL_GPT) { c.gpt.n_layer = 2; c.gpt.n_embd = 16; c.gpt.n_head = 2; c.gpt.block_size = 8; c.gpt.vocab_size = 11; }
    return c;
}

/* Deterministic global batch `step` of `total` rows: rows [first, first+n) into x / y
 * (caller memory: ct_train_step resets its context between micro-batches). */
static ct_train_batch make_batch(ct_model_kind k, int step, int first, int n, int total, void *xbuf, int32_t *y) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
#define RNG() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, s)
    if (k == CT_MODEL_GPT) {
        int32_t *x = xbuf;
        for (int r = 0; r < total; r++)
            for (int t = 0; t < 8; t++) {
                int32_t a = (int32_t)(RNG() % 11), b = (int32_t)(RNG() % 11);
                if (r >= first && r < first + n) { x[(r - first) * 8 + t] = a; y[(r - first) * 8 + t] = b; }
            }
        return ct_train_batch_of(CT_I32, x, 2, (int64_t[]){n, 8}, y, 2, (int64_t[]){n, 8});
    }
    int64_t feat = k == CT_MODEL_MLP ? 20 : 784;
    float *x = xbuf;
    for (int r = 0; r < total; r++) {
        for (int64_t j = 0; j < feat; j++) {
            float v = (float)((RNG() >> 40) * (1.0 / 16777216.0)) - 0.5f;
            if (r >= first && r < first + n) x[(r - first) * feat + j] = v;
        }
        int32_t c = (int32_t)(RNG() % 5);
        if (r >= first && r < first + n) y[r - first] = c;
    }
#undef RNG
    return k == CT_MODEL_MLP ? ct_train_batch_of(CT_F32, x, 2, (int64_t[]){n, 20}, y, 1, (int64_t[]){n})
                             : ct_train_batch_of(CT_F32, x, 4, (int64_t[]){n, 1, 28, 28}, y, 1, (int64_t[]){n});
}

#define MAXROWS 48 /* rows of one global batch: ranks x accum x B */
static float XB[MAXROWS * 784];
static int32_t YB[MAXROWS * 8];

/* Train STEPS steps; pg NULL = single process on the whole global batch. */
static int train(job *j, ct_pg *pg, float *final_w, size_t *nw) {
    ct_model_config c = small(j->kind);
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 7, &m));
    ct_params *P = ct_model_params(m);
    ct_ddp *ddp = NULL;
    if (pg) {
        ct_ddp_opts o = ct_ddp_default_opts();
        o.first_bucket_bytes = 256; /* several buckets even for small models */
        o.bucket_cap_bytes = 2048;
        o.comm_dtype = j->comm;
        o.zero_copy = !j->staged;
        float *g0 = ct_params_grad(P);
        if (ct_ddp_create(pg, P, &o, &ddp) != CT_OK) { fprintf(stderr, "ddp: %s\n", ct_last_error()); return 1; }
        j->zc_active = ct_params_grad(P) != g0;
    }
    ct_adamw_opts ao = ct_adamw_default_opts();
    ao.decay_only_ndim_ge2 = true;
    ct_optim *opt; CT_EXPECT_OK(j->adamw ? ct_optim_create_adamw(P, &ao, &opt)
                    : j->sgd_full ? ct_optim_create_sgd(P, &(ct_sgd_opts){.momentum = 0.9, .nesterov = true, .weight_decay = 1e-2}, &opt)
                    : ct_optim_create_sgd(P, &(ct_sgd_opts){.momentum = 0.9}, &opt));
    ct_zero *zero = NULL;
    if (ddp && j->shard) {
        float *d0 = ct_params_data(P);
        CT_EXPECT_OK(ct_zero_create(ddp, opt, &zero));
        j->sharded = zero != NULL;
        CT_EXPECT_EQ(ct_params_data(P) != d0, j->sharded); /* the parameters moved into the shared segment */
    }
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    int rank = pg ? ct_pg_rank(pg) : 0;
    int nr = j->nranks ? j->nranks : 2, K = j->accum ? j->accum : 1;
    ct_train_model tm = ct_train_model_builtin(m);
    ct_step_args sa = {.ctx = ctx, .model = &tm, .opt = opt, .ddp = ddp, .zero = zero, .lr = 0.05, .clip_norm = j->clip};
    for (int s = 0; s < STEPS; s++) {
        /* rank r's micro-batch k holds rows [(r K + k) B, + B) of the global batch; alone, the
         * K micro-batches of every rank in turn, or one batch of all rows (K = 1) */
        ct_train_batch micro[MAXROWS];
        int nmicro = pg ? K : K > 1 ? nr * K : 1, rows = pg || K > 1 ? B : nr * B;
        int64_t xrow = j->kind == CT_MODEL_GPT ? 8 : j->kind == CT_MODEL_MLP ? 20 : 784, yrow = j->kind == CT_MODEL_GPT ? 8 : 1;
        for (int k = 0; k < nmicro; k++) {
            int first = (pg ? rank * K + k : k) * rows;
            float *xb = XB + (size_t)k * (size_t)(rows * xrow);
            micro[k] = make_batch(j->kind, s, first, rows, nr * K * B, xb, YB + (size_t)k * (size_t)(rows * yrow));
        }
        ct_step_result r;
        sa.step = s;
        if (ct_train_step(&sa, micro, nmicro, &r) != CT_OK) { fprintf(stderr, "step: %s\n", ct_last_error()); return 1; }
        float lv = (float)r.loss;
        if (pg) ct_all_reduce_sync(pg, &lv, 1, CT_F32, CT_RED_AVG);
        j->losses[s] = lv;
    }
    /* averaged in the step unless clipping read the gradients first */
    if (zero) CT_EXPECT_EQ(ct_ddp_get_stats(ddp).deferred, !(j->clip > 0));
    *nw = ct_params_numel(P);
    memcpy(final_w, ct_params_data(P), *nw * sizeof(float));
    ct_ctx_free(ctx);
    if (j->ddp_first) ct_zero_free(zero);
    ct_optim_free(opt);
    if (!j->ddp_first) ct_zero_free(zero);
    ct_ddp_free(ddp);
    /* back in private memory either way, with the trained values */
    CT_EXPECT(memcmp(final_w, ct_params_data(P), *nw * sizeof(float)) == 0);
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
    if (ct_failed_) rc = 1; /* an expectation failed in this rank's process: the test fails */
    if (rc == 0 && rank == 0) {
        FILE *f = fopen(j->out, "wb");
        fwrite(j->losses, sizeof(float), STEPS, f);
        fwrite(&j->zc_active, sizeof j->zc_active, 1, f);
        fwrite(&j->sharded, sizeof j->sharded, 1, f);
        fwrite(&nw, sizeof nw, 1, f);
        fwrite(W2, sizeof(float), nw, f);
        fclose(f);
    }
    ct_pg_free(pg);
    return rc;
}

/* Runs j on j->nranks ranks; rank 0's losses and final weights land in dl / W. */
static int run_ddp(job *j, float *dl, float *W, size_t *nw) {
    snprintf(j->out, sizeof j->out, "/tmp/ct_ddp_%d_%d.bin", (int)getpid(), (int)j->kind);
    ct_status st = ct_spawn(rank_main, j->nranks, j);
    if (st != CT_OK) { fprintf(stderr, "  spawn: %s\n", ct_last_error()); return 1; }
    FILE *f = fopen(j->out, "rb");
    int ok = f && fread(dl, sizeof(float), STEPS, f) == STEPS && fread(&j->zc_active, sizeof j->zc_active, 1, f) == 1 &&
             fread(&j->sharded, sizeof j->sharded, 1, f) == 1 &&
             fread(nw, sizeof *nw, 1, f) == 1 && *nw <= 400000 && fread(W, sizeof(float), *nw, f) == *nw;
    if (f) fclose(f);
    unlink(j->out);
    return ok ? 0 : 1;
}

/* The single-process reference trains in a forked child: the parent must not start OpenMP's
 * thread pool, which does not survive the next ct_spawn's fork (children hang in libgomp). */
static int train_single(job *single, float *W, size_t *nw) {
    size_t bytes = sizeof(job) + sizeof(size_t) + sizeof W1;
    uint8_t *sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        size_t n = 0;
        int rc = train(single, NULL, W, &n);
        memcpy(sh, single, sizeof *single);
        memcpy(sh + sizeof(job), &n, sizeof n);
        memcpy(sh + sizeof(job) + sizeof n, W, n * sizeof(float));
        _exit(rc);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) { munmap(sh, bytes); return 1; }
    memcpy(single, sh, sizeof *single);
    memcpy(nw, sh + sizeof(job), sizeof *nw);
    memcpy(W, sh + sizeof(job) + sizeof *nw, *nw * sizeof(float));
    munmap(sh, bytes);
    return 0;
}

static void check_equivalence_n(ct_model_kind k, ct_dtype comm, int nranks, bool staged, double tol, double wtol) {
    job j = {.kind = k, .comm = comm, .nranks = nranks, .staged = staged};
    float dl[STEPS];
    size_t nw2 = 0;
    CT_ASSERT(run_ddp(&j, dl, W2, &nw2) == 0);
    /* zero-copy is taken exactly when it should be */
    CT_EXPECT_EQ(j.zc_active, !staged && comm == CT_F32);
    job single = {.kind = k, .nranks = nranks};
    size_t nw1;
    CT_ASSERT(train_single(&single, W1, &nw1) == 0);
    CT_EXPECT_EQ(nw1, nw2);
    double le = ct_max_rel_err(dl, single.losses, STEPS, 1e-6);
    double we = ct_max_rel_err(W2, W1, (long)nw1, 1e-2);
    printf("  %s, %d ranks (%s traffic, %s): loss max rel err %.2e, weights %.2e\n", ct_model_kind_name(k), nranks,
           ct_dtype_name(comm), j.zc_active ? "zero-copy" : "staged", le, we);
    CT_EXPECT(le <= tol);
    CT_EXPECT(we <= wtol);
}
static void check_equivalence(ct_model_kind k, ct_dtype comm, double tol, double wtol) {
    check_equivalence_n(k, comm, 2, false, tol, wtol);
}

CT_TEST(mlp_two_ranks_equal_one_rank_double_batch) { check_equivalence(CT_MODEL_MLP, CT_F32, 1e-5, 1e-5); }
CT_TEST(cnn_two_ranks_equal_one_rank_double_batch) { check_equivalence(CT_MODEL_CNN, CT_F32, 1e-5, 1e-5); }
CT_TEST(gpt_two_ranks_equal_one_rank_double_batch) { check_equivalence(CT_MODEL_GPT, CT_F32, 1e-5, 1e-5); }
/* the staged path (zero_copy off) */
CT_TEST(mlp_staged_two_ranks_equal_one_rank) { check_equivalence_n(CT_MODEL_MLP, CT_F32, 2, true, 1e-5, 1e-5); }
CT_TEST(cnn_staged_two_ranks_equal_one_rank) { check_equivalence_n(CT_MODEL_CNN, CT_F32, 2, true, 1e-5, 1e-5); }
CT_TEST(gpt_staged_two_ranks_equal_one_rank) { check_equivalence_n(CT_MODEL_GPT, CT_F32, 2, true, 1e-5, 1e-5); }
/* 3 ranks: slices of uneven length, partial sums through region 0, results copied to 3 regions */
CT_TEST(mlp_three_ranks_equal_one_rank_triple_batch) { check_equivalence_n(CT_MODEL_MLP, CT_F32, 3, false, 1e-5, 1e-5); }
CT_TEST(gpt_three_ranks_equal_one_rank_triple_batch) { check_equivalence_n(CT_MODEL_GPT, CT_F32, 3, false, 1e-5, 1e-5); }
/* both paths sum in the same rank order with the same arithmetic: identical weights */
CT_TEST(zero_copy_and_staged_bit_identical) {
    for (int n = 2; n <= 3; n++) {
        job a = {.kind = CT_MODEL_MLP, .comm = CT_F32, .nranks = n}, b = a;
        b.staged = true;
        float la[STEPS], lb[STEPS];
        size_t na = 0, nb = 0;
        CT_ASSERT(run_ddp(&a, la, W1, &na) == 0 && run_ddp(&b, lb, W2, &nb) == 0);
        CT_EXPECT(a.zc_active && !b.zc_active);
        CT_EXPECT_EQ(na, nb);
        CT_EXPECT(memcmp(W1, W2, na * sizeof(float)) == 0);
    }
}
/* The sharded optimizer step (one copy of parameters and state in shared memory, each rank
 * updating its share and averaging the gradients as it reads them) gives the bits of every
 * rank reducing and then stepping the whole buffer: SGD with momentum, SGD with Nesterov and
 * weight decay, AdamW with decay runs; 2 and 3 ranks (uneven shares); accumulation; clipping
 * (buckets all-reduced, the step reads the reduced gradients); either free order. */
static void check_sharded(job base) {
    job a = base, b = base;
    b.shard = true;
    float la[STEPS], lb[STEPS];
    size_t na = 0, nb = 0;
    CT_ASSERT(run_ddp(&a, la, W1, &na) == 0 && run_ddp(&b, lb, W2, &nb) == 0);
    CT_EXPECT(!a.sharded && b.sharded);
    bool same = na == nb && !memcmp(la, lb, sizeof la) && !memcmp(W1, W2, na * sizeof(float));
    CT_EXPECT(same);
    printf("  %s, %d ranks, %s%s%s: sharded step %s (%zu weights)\n", ct_model_kind_name(base.kind), base.nranks,
           base.adamw ? "adamw" : base.sgd_full ? "sgd nesterov+wd" : "sgd momentum", base.accum > 1 ? ", accumulation" : "",
           base.clip > 0 ? ", clipping" : "", same ? "bit-identical" : "DIFFERS", na);
}
CT_TEST(sharded_step_bit_identical_sgd) {
    check_sharded((job){.kind = CT_MODEL_MLP, .comm = CT_F32, .nranks = 2});
    check_sharded((job){.kind = CT_MODEL_MLP, .comm = CT_F32, .nranks = 3, .sgd_full = true, .ddp_first = true});
    check_sharded((job){.kind = CT_MODEL_CNN, .comm = CT_F32, .nranks = 2, .accum = 2});
    check_sharded((job){.kind = CT_MODEL_MLP, .comm = CT_F32, .nranks = 2, .clip = 0.05});
}
CT_TEST(sharded_step_bit_identical_adamw) {
    check_sharded((job){.kind = CT_MODEL_GPT, .comm = CT_F32, .nranks = 2, .adamw = true});
    check_sharded((job){.kind = CT_MODEL_GPT, .comm = CT_F32, .nranks = 3, .adamw = true, .clip = 0.5, .ddp_first = true});
}
/* where it cannot apply it changes nothing: staged traffic, bf16 compression, the variable */
CT_TEST(sharded_step_only_where_it_applies) {
    job st = {.kind = CT_MODEL_MLP, .comm = CT_F32, .nranks = 2, .staged = true, .shard = true};
    job bf = {.kind = CT_MODEL_MLP, .comm = CT_BF16, .nranks = 2, .shard = true};
    float l[STEPS];
    size_t nw = 0;
    CT_ASSERT(run_ddp(&st, l, W1, &nw) == 0 && run_ddp(&bf, l, W1, &nw) == 0);
    CT_EXPECT(!st.sharded && !bf.sharded);
    ct_config_set("CTRAIN_DDP_SHARD_OPTIM", "0");
    job off = {.kind = CT_MODEL_MLP, .comm = CT_F32, .nranks = 2, .shard = true};
    CT_ASSERT(run_ddp(&off, l, W1, &nw) == 0);
    ct_config_unset("CTRAIN_DDP_SHARD_OPTIM");
    CT_EXPECT(off.zc_active && !off.sharded);
}
/* Gradient accumulation: K micro-batches per step follow one K times larger batch within f32
 * rounding — alone (accumulated loss scaling) and under DDP (no all-reduce before the last
 * micro-batch's backward). */
static void check_accum(ct_model_kind k, int nranks, int accum) {
    job j = {.kind = k, .comm = CT_F32, .nranks = nranks, .accum = accum};
    job single = {.kind = k, .nranks = nranks * accum};
    float dl[STEPS];
    size_t nw1 = 0, nw2 = 0;
    if (nranks > 1) {
        CT_ASSERT(run_ddp(&j, dl, W2, &nw2) == 0);
    } else {
        /* alone: the nranks x accum micro-batches of the "global" batch on one process */
        j.nranks = 1;
        CT_ASSERT(train_single(&j, W2, &nw2) == 0);
        memcpy(dl, j.losses, sizeof dl);
    }
    single.nranks = nranks * accum;
    CT_ASSERT(train_single(&single, W1, &nw1) == 0);
    CT_EXPECT_EQ(nw1, nw2);
    double le = ct_max_rel_err(dl, single.losses, STEPS, 1e-6);
    double we = ct_max_rel_err(W2, W1, (long)nw1, 1e-2);
    printf("  %s, %d rank(s) x %d micro-batches vs 1 x batch %d: loss max rel err %.2e, weights %.2e\n", ct_model_kind_name(k),
           nranks, accum, nranks * accum * B, le, we);
    CT_EXPECT(le <= 1e-5);
    /* the CNN's small GEMMs go to OpenBLAS, whose kernel depends on the CPU: on an Intel Xeon
     * (family 6, model 207) that Debian's OpenBLAS 0.3.21 does not know it runs its SSE3
     * (Prescott) kernel, without FMA, and the weights differed by 1.37e-5 */
    CT_EXPECT(we <= (k == CT_MODEL_CNN ? 5e-5 : 1e-5));
}
CT_TEST(accumulation_equals_larger_batch_mlp) { check_accum(CT_MODEL_MLP, 1, 3); }
CT_TEST(accumulation_equals_larger_batch_gpt) { check_accum(CT_MODEL_GPT, 1, 4); }
CT_TEST(accumulation_under_ddp_mlp) { check_accum(CT_MODEL_MLP, 2, 3); }
CT_TEST(accumulation_under_ddp_cnn) { check_accum(CT_MODEL_CNN, 2, 2); }
CT_TEST(accumulation_under_ddp_gpt) { check_accum(CT_MODEL_GPT, 2, 4); }

/* bf16 traffic rounds each gradient to 8 bits of mantissa: losses stay within 1e-3, weights
 * drift by a few percent of the 1e-2 floor (tiny weights move relatively most). */
CT_TEST(bf16_compression_stays_close) { check_equivalence(CT_MODEL_MLP, CT_BF16, 1e-3, 0.5); }

/* A peer that stalls (variant 0) or exits (variant 1) in the middle of training: the other
 * rank's ct_ddp_finish fails within about CTRAIN_TIMEOUT, naming it, instead of hanging on
 * the in-place all-reduce (peers would otherwise wait for its "bucket ready" post forever). */
/* Rank 1 stalls (variant 0) or exits (1) before its second step, or, with the sharded step,
 * exits between its backward and the step (2: rank 0 then waits in the step's own barrier,
 * whose failure ct_train_step returns through ct_optim_status). Rank 0 gets the error within
 * the 1-s timeout, naming rank 1. */
typedef struct { int variant; bool zero; } stall_case;
static int stall_main(int rank, int n, void *arg) {
    (void)n;
    stall_case sc = *(stall_case *)arg;
    setenv("CTRAIN_TIMEOUT", "1", 1);
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) return 1;
    ct_model_config c = small(CT_MODEL_MLP);
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 7, &m));
    ct_params *P = ct_model_params(m);
    ct_ddp_opts o = ct_ddp_default_opts();
    o.first_bucket_bytes = 256;
    o.bucket_cap_bytes = 2048;
    float *g0 = ct_params_grad(P);
    ct_ddp *ddp;
    if (ct_ddp_create(pg, P, &o, &ddp) != CT_OK) return 1;
    int ok = ct_params_grad(P) != g0; /* zero-copy is on */
    ct_optim *opt; CT_EXPECT_OK(ct_optim_create_sgd(P, &(ct_sgd_opts){.momentum = 0.9}, &opt));
    ct_zero *zero = NULL;
    if (sc.zero) {
        CT_EXPECT_OK(ct_zero_create(ddp, opt, &zero));
        ok = ok && zero != NULL;
    }
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    ct_train_model tm = ct_train_model_builtin(m);
    ct_step_args sa = {.ctx = ctx, .model = &tm, .opt = opt, .ddp = ddp, .zero = zero, .lr = 0.05};
    ct_status last = CT_OK;
    double t_fail = 0;
    for (int s = 0; s < 3 && last == CT_OK; s++) {
        ct_train_batch b = make_batch(CT_MODEL_MLP, s, rank * B, B, 2 * B, XB, YB);
        ct_tensor *x = ct_wrap(ctx, CT_F32, XB, b.x.ndim, b.x.shape), *y = ct_wrap(ctx, CT_I32, YB, 1, b.y.shape);
        if (rank == 1 && s == 1) {
            if (sc.variant == 0) sleep(3);
            if (sc.variant == 1) _exit(0);
            if (sc.variant == 2) {
                CT_EXPECT_OK(ct_zero_begin_step(zero, true));
                ct_backward(ctx, ct_model_loss(ctx, m, x, y));
                CT_EXPECT_OK(ct_ddp_finish(ddp));
                _exit(0);
            }
        }
        double t0 = ct_time_now();
        sa.step = s;
        if (sc.zero) last = ct_train_step(&sa, &b, 1, NULL);
        else { /* DDP alone: the failure comes out of ct_ddp_finish */
            ct_backward(ctx, ct_model_loss(ctx, m, x, y));
            last = ct_ddp_finish(ddp);
            ct_params_zero_grad(P);
            ct_ctx_reset(ctx);
        }
        t_fail = ct_time_now() - t0;
    }
    if (rank == 0) {
        const char *msg = ct_last_error();
        if (sc.variant == 0) ok = ok && last == CT_ERR_TIMEOUT && strstr(msg, "rank(s) 1 never reached");
        else ok = ok && (last == CT_ERR_PEER || last == CT_ERR_TIMEOUT) && strstr(msg, "rank");
        ok = ok && t_fail < 3;
        fprintf(stderr, "  rank 0 after %.2f s: %s\n", t_fail, last ? msg : "no error");
    } else {
        ok = ok && last != CT_OK; /* the sleeper finds the group failed */
    }
    ct_zero_free(zero);
    ct_optim_free(opt);
    ct_ddp_free(ddp);
    ct_ctx_free(ctx);
    ct_model_free(m);
    ct_pg_free(pg);
    return ok ? 0 : 1;
}
CT_TEST(stalled_peer_times_out_zero_copy) { stall_case c = {0, false}; CT_EXPECT_OK(ct_spawn(stall_main, 2, &c)); }
CT_TEST(vanished_peer_is_an_error_zero_copy) { stall_case c = {1, false}; CT_EXPECT_OK(ct_spawn(stall_main, 2, &c)); }
CT_TEST(stalled_peer_times_out_sharded_step) { stall_case c = {0, true}; CT_EXPECT_OK(ct_spawn(stall_main, 2, &c)); }
CT_TEST(vanished_peer_is_an_error_sharded_step) {
    for (int v = 1; v <= 2; v++) {
        stall_case c = {v, true};
        CT_EXPECT_OK(ct_spawn(stall_main, 2, &c));
    }
}

/* Loss scaling under DDP: rank 1 alone overflows at step 3, yet every rank skips that step
 * (the averaged gradients are inf/NaN everywhere), the weights stay as they were and equal
 * across ranks, and the scale halves on both. */
static int scaler_rank;
static ct_tensor *overflow_on_rank1(ct_ctx *ctx, void *self, ct_tensor *x, ct_tensor *y) {
    ct_tensor *l = ct_model_loss(ctx, self, x, y);
    static int calls;
    return ++calls == 3 && scaler_rank == 1 ? ct_scale(ctx, l, INFINITY) : l;
}
static int scaler_main(int rank, int n, void *arg) {
    (void)n; (void)arg;
    scaler_rank = rank;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) return 1;
    ct_model_config c = small(CT_MODEL_MLP);
    ct_model *m;
    ct_ddp *ddp;
    ct_optim *opt;
    ct_grad_scaler *sc;
    ct_ctx *ctx;
    if (ct_model_create(&c, 7, &m) || ct_ddp_create(pg, ct_model_params(m), NULL, &ddp) ||
        ct_optim_create_sgd(ct_model_params(m), &(ct_sgd_opts){.momentum = 0.9}, &opt) || ct_grad_scaler_create(NULL, &sc) ||
        ct_ctx_create(NULL, &ctx))
        return 1;
    ct_train_model tm = ct_train_model_builtin(m);
    tm.loss = overflow_on_rank1;
    ct_step_args sa = {.ctx = ctx, .model = &tm, .opt = opt, .ddp = ddp, .lr = 0.05, .scaler = sc};
    ct_params *P = ct_model_params(m);
    size_t nw = ct_params_numel(P);
    float *before = malloc(nw * sizeof(float));
    int ok = 1;
    for (int s = 1; s <= 5; s++) {
        ct_train_batch b = make_batch(CT_MODEL_MLP, s, rank * B, B, 2 * B, XB, YB);
        memcpy(before, ct_params_data(P), nw * sizeof(float));
        ct_step_result r;
        sa.step = s;
        if (ct_train_step(&sa, &b, 1, &r) != CT_OK) return 1;
        bool same = !memcmp(before, ct_params_data(P), nw * sizeof(float));
        ok = ok && r.skipped == (s == 3) && same == (s == 3) && r.scale == (s < 3 ? 65536.0f : 32768.0f);
    }
    double sum = 0;
    for (size_t i = 0; i < nw; i++) sum += ct_params_data(P)[i] * (double)(i % 7 + 1);
    double mx = sum, mn = sum;
    ct_all_reduce_sync(pg, &mx, 1, CT_F64, CT_RED_MAX);
    ct_all_reduce_sync(pg, &mn, 1, CT_F64, CT_RED_MIN);
    ok = ok && mx == mn && isfinite(sum);
    if (!ok) fprintf(stderr, "rank %d: skip pattern or weights wrong\n", rank);
    free(before);
    ct_ctx_free(ctx);
    ct_grad_scaler_free(sc);
    ct_optim_free(opt);
    ct_ddp_free(ddp);
    ct_model_free(m);
    ct_pg_free(pg);
    return ok ? 0 : 1;
}
CT_TEST(loss_scaling_skips_on_every_rank_alike) { CT_EXPECT_OK(ct_spawn(scaler_main, 2, NULL)); }

static int mismatch_main(int rank, int n, void *arg) {
    (void)n; (void)arg;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) return 1;
    ct_model_config c = small(CT_MODEL_MLP);
    if (rank == 1) c.mlp.hidden[1] = 17;
    ct_model *m; CT_EXPECT_OK(ct_model_create(&c, 7, &m));
    ct_ddp *ddp;
    ct_status st = ct_ddp_create(pg, ct_model_params(m), NULL, &ddp);
    int ok = st == CT_ERR_MISMATCH && strstr(ct_last_error(), "'2.weight'") != NULL;
    if (!ok) fprintf(stderr, "rank %d: status %d: %s\n", rank, st, ct_last_error());
    ct_model_free(m);
    ct_pg_free(pg);
    return ok ? 0 : 1;
}
CT_TEST(parameter_mismatch_named_on_every_rank) { CT_EXPECT_OK(ct_spawn(mismatch_main, 2, NULL)); }

/* a deferred model (no values yet) is refused before any collective, naming the way out */
static int deferred_main(int rank, int n, void *arg) {
    (void)n; (void)arg;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) return 1;
    ct_model_config c = small(CT_MODEL_MLP);
    ct_model *m;
    if (ct_model_create_deferred(&c, 7, &m) != CT_OK) return 1;
    ct_ddp *ddp = NULL;
    ct_status st = ct_ddp_create(pg, ct_model_params(m), NULL, &ddp);
    int ok = st == CT_ERR_INVALID && !ddp && strstr(ct_last_error(), "ct_params_materialize") != NULL;
    if (!ok) fprintf(stderr, "rank %d: status %d: %s\n", rank, st, ct_last_error());
    /* made whole, it is DDP's as any model: rank 0's values everywhere */
    ok = ok && ct_params_materialize(ct_model_params(m)) == CT_OK && ct_ddp_create(pg, ct_model_params(m), NULL, &ddp) == CT_OK;
    ct_ddp_free(ddp);
    ct_model_free(m);
    ct_pg_free(pg);
    return ok ? 0 : 1;
}
CT_TEST(deferred_model_refused_until_materialized) { CT_EXPECT_OK(ct_spawn(deferred_main, 2, NULL)); }

static int unused_main(int rank, int n, void *arg) {
    (void)rank; (void)n; (void)arg;
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) return 1;
    ct_params *P; CT_EXPECT_OK(ct_params_create(&P));
    ct_tensor *w = ct_param(P, "used.weight", 2, (int64_t[]){3, 4}, CT_INIT_ONES, 0);
    ct_param(P, "unused.weight", 2, (int64_t[]){3, 4}, CT_INIT_ONES, 0);
    ct_params_finalize(P, 1);
    ct_ddp *ddp;
    if (ct_ddp_create(pg, P, NULL, &ddp) != CT_OK) return 1;
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
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
