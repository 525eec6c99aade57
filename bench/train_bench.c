/* bench/train_bench.c — training throughput of ctrain's built-in models (bench/run.sh drives it).
 *
 *   train_bench single mlp|gpt|cnn|llama THREADS [SECONDS]   one process, fp32
 *   train_bench ddp    mlp|gpt|cnn|llama NRANKS  [SECONDS]   NRANKS ranks x 1 thread (ct_spawn, shm)
 *   train_bench sgemm  THREADS                         OpenBLAS sgemm GFLOP/s (the GEMM ceiling)
 *   train_bench single gpt THREADS SECONDS VARIANT      VARIANT: comma list of flash (fused attention),
 *                                                      ckpt (activation checkpointing), T=N (context),
 *                                                      amp=bf16|fp16 (autocast, any model)
 *
 * Sizes are those of the benchmark issue: MLP 784-1024-1024-10, batch 128, SGD momentum 0.9;
 * GPT 6 layers, width 256, 8 heads, context 256, vocab 256, batch 8, AdamW; Llama the same with
 * 8 query / 2 key-value heads (grouped-query), SwiGLU width 688, RMSNorm, RoPE; CNN (defaults)
 * batch 128, SGD momentum. Synthetic data; warmup steps are excluded; then steps run until
 * SECONDS have passed (at least 5 steps). Every result is one line:
 *   RESULT impl=ctrain model=mlp threads=1 ranks=1 rate=... unit=samples/s step_ms=...
 *          peak_rss_mb=... flops_per_step=... [hidden_frac=... wait_ms=... (time per step ct_ddp_finish waited)]
 * (DDP: rate and peak are per rank, from rank 0; peak = ru_maxrss of that process.) */
#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ctrain/ctrain.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"
#include "ops/cpu/blas.h" /* ct_sgemm: the GEMM every ctrain op calls */
#include "ctrain/dist.h"
#include "ctrain/ddp.h"
#include "ctrain/train.h"

typedef struct {
    ct_model_kind kind;
    int threads;
    double seconds;
    int nranks;
    bool flash, ckpt;   /* GPT / Llama memory savers */
    int T;              /* GPT / Llama context (0: the default 256) */
    ct_dtype amp;       /* CT_F32, or autocast bf16 / f16 (variant amp=bf16|fp16) */
} bench_cfg;

static bool is_lm(ct_model_kind k) { return k == CT_MODEL_GPT || k == CT_MODEL_LLAMA; }
/* GPT, Llama: 2048 tokens a step whatever the context (batch 8 at 256, 2 at 1024, 1 at 2048) */
static int batch_of(const bench_cfg *bc) {
    if (!is_lm(bc->kind)) return 128;
    int T = bc->T > 0 ? bc->T : 256;
    return 2048 / T > 1 ? 2048 / T : 1;
}

/* CPU time of the whole process (all threads): on a loaded machine, 1-thread CPU time per
 * step moves much less than wall time */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

/* Model FLOPs per step: 6 x params x samples (MLP/CNN: conv counted by its MACs instead),
 * GPT: 6 x params x tokens + attention (12 x layers x T x width per token, PaLM's count
 * halved for the causal mask is not used: full-matrix figure as the GEMMs compute it). */
static double flops_per_step(ct_model *m, int B) {
    const ct_model_config *c = ct_model_config_of(m);
    double P = (double)ct_model_num_params(m);
    if (c->kind == CT_MODEL_GPT) {
        double T = c->gpt.block_size, tokens = B * T;
        return 6.0 * P * tokens + 12.0 * c->gpt.n_layer * T * c->gpt.n_embd * tokens;
    }
    if (c->kind == CT_MODEL_LLAMA) {
        double T = c->llama.max_position_embeddings, tokens = B * T;
        return 6.0 * P * tokens + 12.0 * c->llama.num_hidden_layers * T * c->llama.hidden_size * tokens;
    }
    if (c->kind == CT_MODEL_CNN) {
        int H = c->cnn.height, W = c->cnn.width, k = c->cnn.kernel;
        double conv1 = (double)H * W * c->cnn.c1 * c->cnn.in_channels * k * k;
        double conv2 = (double)(H / 2) * (W / 2) * c->cnn.c2 * c->cnn.c1 * k * k;
        double fc = (double)c->cnn.c2 * (H / 4) * (W / 4) * c->cnn.fc + (double)c->cnn.fc * c->cnn.classes;
        return 6.0 * B * (conv1 + conv2 + fc);
    }
    return 6.0 * P * B;
}

typedef struct {
    double rate, step_ms, flops, hidden, arena_mb, cpu_step_ms;
    bool sharded;   /* DDP: the sharded optimizer step averaged the gradients (no all-reduce) */
    double wait_ms; /* DDP: per step, time ct_ddp_finish and the step's sync waited */
    int steps;
} bench_out;

static int run_training(const bench_cfg *bc, int rank, int nranks, ct_pg *pg, bench_out *out) {
    (void)nranks;
    ct_model_config cfg = ct_model_default_config(bc->kind);
    if (bc->kind == CT_MODEL_MLP) { cfg.mlp.n_hidden = 2; cfg.mlp.hidden[0] = 1024; cfg.mlp.hidden[1] = 1024; }
    if (bc->kind == CT_MODEL_GPT) {
        cfg.gpt.flash_attention = bc->flash;
        cfg.gpt.checkpoint_activations = bc->ckpt;
        if (bc->T > 0) cfg.gpt.block_size = bc->T;
    }
    if (bc->kind == CT_MODEL_LLAMA) {
        cfg.llama.num_key_value_heads = 2;
        cfg.llama.flash_attention = bc->flash;
        cfg.llama.checkpoint_activations = bc->ckpt;
        if (bc->T > 0) cfg.llama.max_position_embeddings = bc->T;
    }
    const int lm_T = bc->kind == CT_MODEL_LLAMA ? cfg.llama.max_position_embeddings : cfg.gpt.block_size;
    const int lm_V = bc->kind == CT_MODEL_LLAMA ? cfg.llama.vocab_size : cfg.gpt.vocab_size;
    ct_model *m; ct_model_create(&cfg, 1234, &m);
    if (!m) { fprintf(stderr, "model: %s\n", ct_last_error()); return 1; }
    ct_params *P = ct_model_params(m);
    ct_optim *opt;
    double lr;
    if (is_lm(bc->kind)) {
        ct_adamw_opts ao = ct_adamw_default_opts();
        ao.weight_decay = 0.1;
        ao.beta2 = 0.95;
        ao.decay_only_ndim_ge2 = true;
        ct_optim_create_adamw(P, &ao, &opt);
        lr = 3e-4;
    } else {
        ct_sgd_opts so = ct_sgd_default_opts();
        so.momentum = 0.9;
        ct_optim_create_sgd(P, &so, &opt);
        lr = 0.01;
    }
    if (!opt) { fprintf(stderr, "optim: %s\n", ct_last_error()); return 1; }
    ct_ddp *ddp = NULL;
    ct_zero *zero = NULL; /* the sharded optimizer step, where it applies (ctrain train uses it too) */
    if (pg) {
        ct_ddp_opts dd = ct_ddp_default_opts();
        if (ct_ddp_create(pg, P, &dd, &ddp) != CT_OK || ct_zero_create(ddp, opt, &zero) != CT_OK) {
            fprintf(stderr, "ddp: %s\n", ct_last_error());
            return 1;
        }
    }
    ct_ctx *ctx; ct_ctx_create(NULL, &ctx);

    /* synthetic data: a few fixed batches, different per rank */
    int B = batch_of(bc);
    enum { NB = 4 };
    int64_t xshape[4], yshape[2];
    int xnd, ynd;
    size_t xn, yn;
    if (is_lm(bc->kind)) {
        int T = lm_T;
        xnd = 2; xshape[0] = B; xshape[1] = T; ynd = 2; yshape[0] = B; yshape[1] = T;
        xn = (size_t)B * T; yn = xn;
    } else if (bc->kind == CT_MODEL_CNN) {
        xnd = 4; xshape[0] = B; xshape[1] = cfg.cnn.in_channels; xshape[2] = cfg.cnn.height; xshape[3] = cfg.cnn.width;
        ynd = 1; yshape[0] = B;
        xn = (size_t)B * cfg.cnn.in_channels * cfg.cnn.height * cfg.cnn.width; yn = B;
    } else {
        xnd = 2; xshape[0] = B; xshape[1] = cfg.mlp.in; ynd = 1; yshape[0] = B;
        xn = (size_t)B * cfg.mlp.in; yn = B;
    }
    float *xf[NB];
    int32_t *xi[NB], *yi[NB];
    uint64_t s = 88172645463325252ull ^ (uint64_t)(rank + 1) * 0x9E3779B97F4A7C15ull;
#define RNG() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, s)
    int classes = is_lm(bc->kind) ? lm_V : bc->kind == CT_MODEL_CNN ? cfg.cnn.classes : cfg.mlp.out;
    for (int b = 0; b < NB; b++) {
        xf[b] = malloc(xn * sizeof(float));
        xi[b] = malloc(xn * sizeof(int32_t));
        yi[b] = malloc(yn * sizeof(int32_t));
        for (size_t i = 0; i < xn; i++) {
            uint64_t r = RNG();
            xf[b][i] = (float)((r >> 11) * (1.0 / 9007199254740992.0));
            xi[b][i] = (int32_t)(r % (uint64_t)classes);
        }
        for (size_t i = 0; i < yn; i++) yi[b][i] = (int32_t)(RNG() % (uint64_t)classes);
    }
#undef RNG

    ct_train_model tm = ct_train_model_builtin(m);
    ct_step_args sa = {.ctx = ctx, .model = &tm, .opt = opt, .ddp = ddp, .zero = zero, .lr = lr, .amp = bc->amp};
    int warmup = is_lm(bc->kind) ? 3 : 10;
    double t0 = 0, c0 = 0;
    int measured = 0;
    double loss_v = 0;
    for (int step = 0;; step++) {
        if (step == warmup) {
            if (pg) ct_barrier_sync(pg);
            t0 = ct_time_now();
            c0 = cpu_now();
        }
        int b = step % NB;
        ct_train_batch tb = is_lm(bc->kind) ? ct_train_batch_of(CT_I32, xi[b], xnd, xshape, yi[b], ynd, yshape)
                                                     : ct_train_batch_of(CT_F32, xf[b], xnd, xshape, yi[b], ynd, yshape);
        sa.step = step;
        ct_step_result res;
        if (ct_train_step(&sa, &tb, 1, &res) != CT_OK) { fprintf(stderr, "step: %s\n", ct_last_error()); return 1; }
        loss_v = res.loss;
        if (step >= warmup) {
            measured++;
            int done = measured >= 5 && ct_time_now() - t0 >= bc->seconds;
            if (pg) { /* every rank stops at the same step */
                int32_t d = done;
                ct_all_reduce_sync(pg, &d, 1, CT_I32, CT_RED_MIN);
                done = d;
            }
            if (done) break;
        }
    }
    double dt = ct_time_now() - t0, dc = cpu_now() - c0;
    double per_step_items = is_lm(bc->kind) ? (double)B * lm_T : B;
    out->rate = measured * per_step_items / dt;
    out->step_ms = 1e3 * dt / measured;
    out->cpu_step_ms = 1e3 * dc / measured;
    out->flops = flops_per_step(m, B);
    out->steps = measured;
    out->hidden = -1;
    out->arena_mb = ct_ctx_peak_bytes(ctx) / 1048576.0;
    if (ddp) {
        ct_ddp_stats st = ct_ddp_get_stats(ddp);
        out->hidden = st.total_comm_s > 0 ? 1.0 - st.total_exposed_s / st.total_comm_s : 0;
        out->sharded = zero != NULL;
        ct_zero_free(zero);
        out->wait_ms = 1e3 * st.total_exposed_s / (double)(st.steps ? st.steps : 1);
        ct_ddp_free(ddp);
    }
    if (!isfinite(loss_v)) { fprintf(stderr, "loss is %g\n", loss_v); return 1; }
    for (int b = 0; b < NB; b++) { free(xf[b]); free(xi[b]); free(yi[b]); }
    ct_ctx_free(ctx);
    ct_optim_free(opt);
    ct_model_free(m);
    return 0;
}

static void print_result(const bench_cfg *bc, int threads, int ranks, const bench_out *o, double rss) {
    printf("RESULT impl=ctrain model=%s threads=%d ranks=%d rate=%.1f unit=%s step_ms=%.2f steps=%d peak_rss_mb=%.1f flops_per_step=%.4g",
           ct_model_kind_name(bc->kind), threads, ranks, o->rate,
           is_lm(bc->kind) ? "tokens/s" : "samples/s", o->step_ms, o->steps, rss, o->flops);
    printf(" arena_peak_mb=%.1f cpu_step_ms=%.2f amp=%s", o->arena_mb, o->cpu_step_ms,
           bc->amp == CT_F32 ? "off" : ct_dtype_name(bc->amp));
    if (is_lm(bc->kind)) printf(" T=%d attention=%s ckpt=%d", bc->T > 0 ? bc->T : 256, bc->flash ? "flash" : "plain", bc->ckpt);
    if (o->sharded) printf(" ddp=sharded_step wait_ms=%.2f", o->wait_ms);
    else if (o->hidden >= 0) printf(" hidden_frac=%.3f wait_ms=%.2f", o->hidden, o->wait_ms);
    printf("\n");
    fflush(stdout);
}

static int ddp_rank(int rank, int nranks, void *arg) {
    const bench_cfg *bc = arg;
    ct_set_num_threads(1);
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg) != CT_OK) { fprintf(stderr, "dist init: %s\n", ct_last_error()); return 1; }
    bench_out o = {0};
    int rc = run_training(bc, rank, nranks, pg, &o);
    double rss = peak_rss_mb();
    double v[2] = {rss, 0};
    ct_all_reduce_sync(pg, v, 1, CT_F64, CT_RED_MAX); /* worst rank's peak */
    if (rc == 0 && rank == 0) print_result(bc, 1, nranks, &o, v[0]);
    ct_pg_free(pg);
    return rc;
}

/* own = 1: ctrain's GEMM entry point (its AVX-512 kernel where the CPU has one); 2: its
 * bf16 GEMM (operands rounded to bf16, f32 sums: autocast's); 0: OpenBLAS as configured,
 * which is what PyTorch calls. */
static double sgemm_gflops(int threads, int own) {
    ct_set_num_threads(threads);
    /* the shapes that dominate the two models: square-ish 1024 GEMMs */
    int n = 1024;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; c[i] = 0; }
#define GEMM() (own == 2 ? ct_sgemm_bf16(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n) \
                    : own ? ct_sgemm(false, false, n, n, n, 1.0f, a, b, 0.0f, c) \
                    : cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n))
    for (int w = 0; w < 3; w++) GEMM();
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        int it = 8;
        double t0 = ct_time_now();
        for (int i = 0; i < it; i++) GEMM();
        double g = it * 2.0 * n * n * n / (ct_time_now() - t0) / 1e9;
        if (g > best) best = g;
    }
#undef GEMM
    free(a); free(b); free(c);
    return best;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s single|ddp MODEL THREADS|NRANKS [SECONDS] | sgemm THREADS\n", argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "sgemm")) {
        int t = atoi(argv[2]);
        printf("RESULT impl=openblas model=sgemm threads=%d gflops=%.1f blas=\"%s\"\n", t, sgemm_gflops(t, 0), ct_blas_info());
        printf("RESULT impl=ctrain model=sgemm threads=%d gflops=%.1f\n", t, sgemm_gflops(t, 1));
        if (ct_sgemm_own_available())
            printf("RESULT impl=ctrain-bf16 model=sgemm threads=%d gflops=%.1f native=%d\n", t, sgemm_gflops(t, 2),
                   ct_sgemm_bf16_native());
        return 0;
    }
    if (argc < 4) { fprintf(stderr, "missing THREADS/NRANKS\n"); return 2; }
    bench_cfg bc = {0};
    if (ct_model_kind_parse(argv[2], &bc.kind) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 2; }
    bc.seconds = argc > 4 ? atof(argv[4]) : 8.0;
    if (argc > 5) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", argv[5]);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (!strcmp(tok, "flash")) bc.flash = true;
            else if (!strcmp(tok, "ckpt")) bc.ckpt = true;
            else if (!strncmp(tok, "T=", 2) && atoi(tok + 2) > 0) bc.T = atoi(tok + 2);
            else if (!strcmp(tok, "amp=bf16")) bc.amp = CT_BF16;
            else if (!strcmp(tok, "amp=fp16")) bc.amp = CT_F16;
            else if (strcmp(tok, "plain")) { fprintf(stderr, "unknown variant '%s' (flash, ckpt, T=N, amp=bf16, amp=fp16, plain)\n", tok); return 2; }
        }
    }
    if (!strcmp(argv[1], "single")) {
        bc.threads = atoi(argv[3]);
        ct_set_num_threads(bc.threads);
        bench_out o = {0};
        if (run_training(&bc, 0, 1, NULL, &o)) return 1;
        print_result(&bc, bc.threads, 1, &o, peak_rss_mb());
        return 0;
    }
    if (!strcmp(argv[1], "ddp")) {
        bc.nranks = atoi(argv[3]);
        bc.threads = 1;
        if (ct_spawn(ddp_rank, bc.nranks, &bc) != CT_OK) { fprintf(stderr, "spawn: %s\n", ct_last_error()); return 1; }
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
