/* GFLOP/s of ctrain's own SGEMM (ct_sgemm_own: AVX-512, or AVX2 under CTRAIN_GEMM=avx2 or without AVX-512) against OpenBLAS cblas_sgemm as
 * configured (OPENBLAS_CORETYPE from the environment), for the GEMM shapes of the models,
 * on 1 and 2 threads. Each figure is the best of 3 timed runs of >= 0.15 s.
 *
 *   build/bench/gemm_bench            model shapes, 1 and 2 threads
 *   build/bench/gemm_bench small      small cubes (the dispatch crossover), 1 thread
 *   build/bench/gemm_bench THREADS    model shapes, that thread count only
 *   build/bench/gemm_bench bf16 [THREADS]  the bf16 GEMM's paths (ct_sgemm_bf16_on: rounded,
 *                                     AVX-512 BF16, AMX) next to the f32 kernel: cubes and GPT shapes */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "ops/cpu/sgemm.h"

typedef struct {
    const char *what;
    int ta, tb;
    int M, N, K;
} shape;

static const shape shapes[] = {
    {"MLP fc1 fwd  x W1^T", 0, 1, 128, 1024, 784},
    {"MLP fc2 fwd  h W2^T", 0, 1, 128, 1024, 1024},
    {"MLP fc3 fwd  h W3^T", 0, 1, 128, 10, 1024},
    {"MLP fc2 dX   dY W2", 0, 0, 128, 1024, 1024},
    {"MLP fc3 dX   dY W3", 0, 0, 128, 1024, 10},
    {"MLP fc1 dW   dY^T x", 1, 0, 1024, 784, 128},
    {"MLP fc2 dW   dY^T h", 1, 0, 1024, 1024, 128},
    {"MLP fc3 dW   dY^T h", 1, 0, 10, 1024, 128},
    {"GPT qkv fwd", 0, 1, 2048, 768, 256},
    {"GPT proj/head fwd", 0, 1, 2048, 256, 256},
    {"GPT mlp fc fwd", 0, 1, 2048, 1024, 256},
    {"GPT mlp proj fwd", 0, 1, 2048, 256, 1024},
    {"GPT qkv dX", 0, 0, 2048, 256, 768},
    {"GPT mlp proj dX", 0, 0, 2048, 1024, 256},
    {"GPT qkv dW", 1, 0, 768, 256, 2048},
    {"GPT mlp fc dW", 1, 0, 1024, 256, 2048},
    {"attn S = Q K^T", 0, 1, 256, 256, 32},
    {"attn S causal blk", 0, 1, 64, 192, 32},
    {"attn O = P V", 0, 0, 256, 32, 256},
    {"attn dV = P^T dO", 1, 0, 256, 32, 64},
    {"attn dK = dS^T Q", 1, 0, 192, 32, 64},
    {"CNN conv1 fwd", 0, 0, 32, 41552, 25},
    {"CNN conv2 fwd", 0, 0, 64, 1176, 800},
    {"CNN conv2 dW", 0, 1, 64, 800, 1176},
    {"CNN conv2 dcol", 1, 0, 800, 1176, 64},
    {"CNN conv1 dW", 0, 1, 32, 25, 41552},
    {"square 1024", 0, 0, 1024, 1024, 1024},
};

static float *rnd(size_t n) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

static int bf16_path; /* > 0: call() runs ct_sgemm_bf16_on(bf16_path) instead of the f32 kernel */

static void call(int own, const shape *s, const float *A, const float *B, float *C) {
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    if (bf16_path) ct_sgemm_bf16_on((ct_gemm_bf16_path)bf16_path, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 1.0f, C, s->N);
    else if (own) ct_sgemm_own(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 1.0f, C, s->N);
    else
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, 1.0f, A,
                    lda, B, ldb, 1.0f, C, s->N);
}

static double gflops(int own, const shape *s) {
    float *A = rnd((size_t)s->M * s->K), *B = rnd((size_t)s->K * s->N), *C = rnd((size_t)s->M * s->N);
    double fl = 2.0 * s->M * s->N * s->K, best = 0;
    for (int w = 0; w < 2; w++) call(own, s, A, B, C);
    for (int rep = 0; rep < 3; rep++) {
        int it = 0;
        double t0 = ct_time_now(), t;
        do {
            call(own, s, A, B, C);
            it++;
        } while ((t = ct_time_now() - t0) < 0.15);
        double g = it * fl / t / 1e9;
        if (g > best) best = g;
    }
    free(A); free(B); free(C);
    return best;
}

int main(int argc, char **argv) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) {
        printf("gemm_bench: neither AVX-512 nor AVX2 and FMA on this CPU: the own SGEMM is not used\n");
        return 0;
    }
    if (ct_kernels_reserve(ct_get_num_threads()) != CT_OK) { /* packing buffers; no context here */
        fprintf(stderr, "gemm_bench: %s\n", ct_last_error());
        return 1;
    }
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("OpenBLAS core %s (OPENBLAS_CORETYPE=%s); own = ctrain %s sgemm (CTRAIN_GEMM); GFLOP/s, best of 3\n", openblas_get_corename(),
           ct ? ct : "unset", ct_gemm_kernel_name());
    if (argc > 1 && !strcmp(argv[1], "small")) {
        ct_set_num_threads(1);
        printf("%-6s %-8s %9s %9s %7s\n", "n^3", "op", "own", "openblas", "ratio");
        const int ns[] = {2, 4, 8, 12, 16, 24, 32, 48, 64, 96};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (int t = 0; t < 4; t++) {
                shape s = {"", t & 1, t >> 1, ns[i], ns[i], ns[i]};
                double o = gflops(1, &s), b = gflops(0, &s);
                printf("%-6d %c%c       %9.1f %9.1f %6.2fx\n", ns[i], t & 1 ? 'T' : 'N', t >> 1 ? 'T' : 'N', o, b, o / b);
            }
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bf16")) {
        ct_set_num_threads(argc > 2 ? atoi(argv[2]) : 1);
        const shape cubes[] = {{"cube 768", 0, 0, 768, 768, 768},     {"cube 1024", 0, 0, 1024, 1024, 1024},
                               {"cube 1024 NT", 0, 1, 1024, 1024, 1024}, {"GPT qkv fwd", 0, 1, 2048, 768, 256},
                               {"GPT mlp proj fwd", 0, 1, 2048, 256, 1024}, {"GPT mlp fc dW", 1, 0, 1024, 256, 2048},
                               {"attn S = Q K^T", 0, 1, 256, 256, 32}};
        printf("%d thread(s); GFLOP/s, best of 3\n%-18s %-2s %5s %5s %5s %8s %8s %8s %8s %6s\n", ct_get_num_threads(), "shape", "op", "M",
               "N", "K", "f32", "rounded", "native", "amx", "amx/f32");
        for (size_t i = 0; i < sizeof cubes / sizeof cubes[0]; i++) {
            const shape *s = &cubes[i];
            double g[4];
            for (int p = 0; p < 4; p++) {
                bf16_path = p;
                g[p] = p == 0 || ct_sgemm_bf16_path_available((ct_gemm_bf16_path)p) ? gflops(1, s) : 0;
            }
            bf16_path = 0;
            printf("%-18s %c%c %5d %5d %5d %8.1f %8.1f %8.1f %8.1f %5.2fx\n", s->what, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N,
                   s->K, g[0], g[1], g[2], g[3], g[3] / g[0]);
            fflush(stdout);
        }
        return 0;
    }
    int t0 = 1, t1 = 2;
    if (argc > 1) t0 = t1 = atoi(argv[1]);
    for (int th = t0; th <= t1; th++) {
        ct_set_num_threads(th);
        printf("\n%d thread%s\n%-22s %-2s %5s %6s %5s %9s %9s %7s\n", th, th > 1 ? "s" : "", "shape", "op", "M", "N", "K", "own",
               "openblas", "ratio");
        double so = 0, sb = 0, fl = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const shape *s = &shapes[i];
            double o = gflops(1, s), b = gflops(0, s), f = 2.0 * s->M * s->N * s->K;
            if (strncmp(s->what, "square", 6)) { so += f / o; sb += f / b; fl += f; }
            printf("%-22s %c%c %5d %6d %5d %9.1f %9.1f %6.2fx\n", s->what, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N, s->K, o, b,
                   o / b);
            fflush(stdout);
        }
        printf("%-22s %25s %9.1f %9.1f %6.2fx\n", "model shapes (time-avg)", "", fl / so, fl / sb, sb / so);
    }
    return 0;
}
