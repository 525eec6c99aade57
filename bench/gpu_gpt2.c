/* bench/gpu_gpt2.c — GPT-2 small (124M) training steps on cuda:0, the GPU benchmark of
 * scripts/gpu-check.sh (bench/gpu_gpt2_torch.py is PyTorch's side of the same table).
 *
 *   gpu_gpt2 [STEPS [BATCH [SEQ [LAYERS [AMP]]]]]  defaults 20 steps of 8 x 1024, 12 layers, f32;
 *                                              AMP bf16: forward and loss under bf16 autocast
 *   CTRAIN_CUDA_MATMUL=highest|high|medium     f32 GEMMs in f32, TF32 or bf16 tensor cores
 *   CTRAIN_DEVICE_PROFILE=1                    also each op's time (serialised), and AdamW's
 *   GPU_GPT2_PROBES=0                          without the GEMMs timed alone (below)
 *
 * GPT-2 small: 12 layers, width 768, 12 heads, context 1024, vocabulary 50257, biases, GELU
 * (tanh form), tied LM head, fused attention, AdamW (lr 6e-4, weight decay 0.1). Random
 * tokens (seeded); the loss is read back every step, as a training loop that logs it does.
 * Three warm-up steps are left out; the median step time gives tokens/s. Model FLOPs per
 * token are nanoGPT's estimate, 6 N + 12 L T d (N without the position embedding), and MFU
 * is against the H100/H200 SXM dense bf16 peak, 989.4 TFLOP/s. Before the steps it times two
 * GEMMs alone: the MLP's first in f32, and the LM head's logits GEMM in bf16 at the
 * vocabulary's 50,257 rows and padded to 50,304. Then one line:
 *   RESULT impl=ctrain ... tokens_per_s=... step_ms=... peak_alloc_mib=... reserved_mib=... mfu=...
 * Without CUDA in the build or without a GPU it says so and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/ctrain.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"
#ifdef CT_HAVE_CUDA
#include "core/kernel.h" /* ct_devprof_report */
#include "cuda/cuda.h"

#define PEAK_BF16 989.4e12

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
/* [M, K] x [N, K]^T on cuda:0 alone in dt (f32, or bf16 cast there), reps times after one
 * warm-up; prints its time and rate */
static void time_gemm(ct_ctx *c, int64_t M, int64_t N, int64_t K, ct_dtype dt, int reps, const char *what, const char *note) {
    int64_t xs[2] = {M, K}, ws[2] = {N, K};
    ct_tensor *xh = ct_zeros(c, CT_F32, 2, xs), *wh = ct_zeros(c, CT_F32, 2, ws), *xg, *wg;
    ct_fill(xh, 0.5f);
    ct_fill(wh, 0.25f);
    ct_set_grad_enabled(c, false);
    if (ct_tensor_to(c, xh, CT_CUDA(0), &xg) == CT_OK && ct_tensor_to(c, wh, CT_CUDA(0), &wg) == CT_OK) {
        if (dt != CT_F32) xg = ct_cast(c, xg, dt), wg = ct_cast(c, wg, dt);
        ct_linear(c, xg, wg, NULL);
        ct_device_sync(CT_CUDA(0));
        double t0 = now();
        for (int i = 0; i < reps; i++) ct_linear(c, xg, wg, NULL);
        ct_device_sync(CT_CUDA(0));
        double s1 = (now() - t0) / reps;
        if (ct_ctx_status(c) == CT_OK)
            printf("%s %lldx%lldx%lld %s on cuda:0: %.3f ms, %.1f TFLOP/s%s\n", what, (long long)M, (long long)N, (long long)K,
                   ct_dtype_name(dt), 1e3 * s1, 2.0 * M * N * K / s1 / 1e12, note);
    }
    ct_set_grad_enabled(c, true);
    ct_ctx_reset(c);
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
#endif

int main(int argc, char **argv) {
#ifndef CT_HAVE_CUDA
    (void)argc;
    (void)argv;
    printf("gpu_gpt2: this build has no CUDA (make CUDA=1)\n");
    return 77;
#else
    int steps = argc > 1 ? atoi(argv[1]) : 20, B = argc > 2 ? atoi(argv[2]) : 8, T = argc > 3 ? atoi(argv[3]) : 1024;
    int L = argc > 4 ? atoi(argv[4]) : 12;
    const bool amp = argc > 5 && !strcmp(argv[5], "bf16");
    if (steps < 1 || B < 1 || T < 1 || L < 1 || (argc > 5 && !amp)) {
        fprintf(stderr, "usage: gpu_gpt2 [STEPS [BATCH [SEQ [LAYERS [bf16]]]]]\n");
        return 2;
    }
    int n = 0;
    if (ct_device_count(CT_DEV_CUDA, &n) != CT_OK || n < 1) {
        printf("gpu_gpt2: no CUDA GPU (%s)\n", ct_last_error());
        return 77;
    }
    ct_model_config cfg = ct_model_default_config(CT_MODEL_GPT);
    cfg.gpt.n_layer = L;
    cfg.gpt.n_embd = 768;
    cfg.gpt.n_head = 12;
    cfg.gpt.block_size = 1024;
    cfg.gpt.vocab_size = 50257;
    cfg.gpt.gelu_tanh = true;
    cfg.gpt.flash_attention = true;
    ct_model *m = NULL;
    ct_status st = ct_model_create(&cfg, 1337, &m);
    if (st == CT_OK) st = ct_module_to(ct_model_module(m), CT_CUDA(0));
    ct_params *P = m ? ct_model_params(m) : NULL;
    ct_adamw_opts ao = ct_adamw_default_opts();
    ao.weight_decay = 0.1f;
    ct_optim *opt = NULL;
    if (st == CT_OK) st = ct_optim_create_adamw(P, &ao, &opt);
    ct_ctx *c = NULL;
    if (st == CT_OK) st = ct_ctx_create(NULL, &c);
    if (st != CT_OK) {
        fprintf(stderr, "gpu_gpt2: setup: %s\n", ct_last_error());
        return 1;
    }
    const int64_t N = ct_model_num_params(m) - (int64_t)cfg.gpt.block_size * cfg.gpt.n_embd;
    const double flops_tok = 6.0 * (double)N + 12.0 * L * T * cfg.gpt.n_embd;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * (T + 1));
    if (!tok) return 1;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < (int64_t)B * (T + 1); i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((r >> 33) % (uint64_t)cfg.gpt.vocab_size);
    }
    int32_t *x = malloc(sizeof(int32_t) * (size_t)B * T), *y = malloc(sizeof(int32_t) * (size_t)B * T);
    if (!x || !y) return 1;
    for (int b = 0; b < B; b++) {
        memcpy(x + (size_t)b * T, tok + (size_t)b * (T + 1), sizeof(int32_t) * T);
        memcpy(y + (size_t)b * T, tok + (size_t)b * (T + 1) + 1, sizeof(int32_t) * T);
    }
    /* GPU_GPT2_PROBES=0 leaves the GEMMs alone out (a kernel profiler then sees the step's first) */
    const char *pe = getenv("GPU_GPT2_PROBES");
    const bool probes = !pe || strcmp(pe, "0");
    if (probes) {
        /* the GEMM alone, as the MLP's first linear runs it: [B T, 768] x [3072, 768]^T */
        time_gemm(c, (int64_t)B * T, 4 * cfg.gpt.n_embd, cfg.gpt.n_embd, CT_F32, 20, "gemm", "");
        /* the tied LM head's logits GEMM in bf16 alone, at the vocabulary's 50,257 rows and at
         * 50,304 (a multiple of 64, as llm.c pads it): an odd row length leaves cuBLASLt only
         * kernels for 2-byte-aligned rows (on an H200 the LM head's three GEMMs took 15.5 ms a step) */
        time_gemm(c, (int64_t)B * T, cfg.gpt.vocab_size, cfg.gpt.n_embd, CT_BF16, 5, "lm head gemm", "");
        time_gemm(c, (int64_t)B * T, 50304, cfg.gpt.n_embd, CT_BF16, 5, "lm head gemm", " (vocabulary padded)");
    }
    const int warm = 3;
    double *ms = calloc((size_t)steps, sizeof(double)), first = NAN, last = NAN;
    for (int s = 0; s < warm + steps; s++) {
        double t0 = now();
        int64_t shape[2] = {B, T};
        ct_tensor *xd, *yd;
        st = ct_tensor_to(c, ct_from_data(c, CT_I32, x, 2, shape), CT_CUDA(0), &xd);
        if (st == CT_OK) st = ct_tensor_to(c, ct_from_data(c, CT_I32, y, 2, shape), CT_CUDA(0), &yd);
        if (st != CT_OK) break;
        if (amp && ct_autocast_begin(c, CT_BF16) != CT_OK) break; /* like `with torch.autocast(...)` */
        ct_tensor *loss = ct_model_loss(c, m, xd, yd);
        if (amp) ct_autocast_end(c);
        ct_backward(c, loss);
        double to = 0;
        bool prof = ct_devprof_begin(CT_CUDA(0), &to);
        ct_optim_step(opt, 6e-4);
        if (prof) ct_devprof_end(CT_CUDA(0), "adamw (optimizer)", true, to);
        ct_params_zero_grad(P);
        double l = ct_item(loss); /* waits for the step, as logging the loss does */
        if ((st = ct_ctx_status(c)) != CT_OK || (st = ct_optim_status(opt)) != CT_OK) break;
        ct_ctx_reset(c);
        if (s == 0) first = l;
        last = l;
        if (s >= warm) ms[s - warm] = 1e3 * (now() - t0);
        if (s == 0) ct_cuda_mem_reset_peak(0); /* the first step's cuBLASLt workspaces and caches stay */
        if (s == warm - 1) ct_devprof_reset();  /* the profile leaves out the warm-up's first calls */
    }
    if (st != CT_OK) {
        fprintf(stderr, "gpu_gpt2: step failed: %s\n", ct_last_error());
        return 1;
    }
    if (ct_config_bool(CT_CFG_DEVICE_PROFILE)) {
        printf("per-op device time over %d steps after the warm-up (each op waited for; the step is slower than above):\n", steps);
        ct_devprof_report(stdout);
    }
    ct_cuda_mem_stats mst;
    ct_cuda_mem_stats_get(0, &mst);
    qsort(ms, (size_t)steps, sizeof(double), cmp_d);
    double med = ms[steps / 2], tps = (double)B * T / (med * 1e-3);
    const char *prec = getenv("CTRAIN_CUDA_MATMUL");
    const char *att = ct_config_str(CT_CFG_CUDA_ATTENTION); /* the setting or its default */
    if (!amp && att && !strcmp(att, "tc")) att = "tiled"; /* tc is for bf16/f16: f32 takes the tiled kernels */
    printf("RESULT impl=ctrain model=gpt2-124M batch=%d seq=%d layers=%d amp=%s attention=%s matmul=%s params=%lld step_ms=%.2f "
           "min_ms=%.2f tokens_per_s=%.0f peak_alloc_mib=%.0f reserved_mib=%.0f mfu=%.3f loss_first=%.4f loss_last=%.4f\n",
           B, T, L, amp ? "bf16" : "none", att && *att ? att : "?", prec && *prec ? prec : "highest", (long long)ct_model_num_params(m), med, ms[0], tps,
           mst.peak / 1048576.0, mst.reserved / 1048576.0, tps * flops_tok / PEAK_BF16, first, last);
    free(ms);
    free(tok);
    free(x);
    free(y);
    ct_ctx_free(c);
    ct_optim_free(opt);
    ct_model_free(m);
    return 0;
#endif
}
