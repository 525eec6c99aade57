/* Dynamic int8 Linear (ct_linear_dynamic_int8: quantize the input, u8 x s8 GEMM, dequantize
 * with bias) against ctrain's f32 Linear (ct_linear: own AVX-512 SGEMM) on the same shapes,
 * y [M, N] = x [M, K] W^T + b, in GFLOP/s-equivalents (2 M N K / time: the int8 figure
 * counts the f32 work it replaces). Each figure is the best of 3 timed runs of >= 0.1 s.
 * Also the int8 kernels one by one (VNNI, AVX2) through the same path.
 *
 *   build/bench/qlinear_bench             M = 1, 16, 64, 256; K = N = 1024, 2048, 4096; 1 thread
 *   build/bench/qlinear_bench THREADS     the same on THREADS threads
 *   build/bench/qlinear_bench THREADS quick  K = N = 1024 and 4096 only, M = 1, 256 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#include <time.h>

#include "ctrain/ctrain.h"
#include "ops/cpu/qgemm.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef void (*run_fn)(void *arg);

/* seconds per call: best of 3 runs of >= 0.1 s */
static double best_time(run_fn fn, void *arg) {
    fn(arg); /* warm-up */
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        int reps = 0;
        double t0 = now(), t;
        do { fn(arg); reps++; } while ((t = now() - t0) < 0.1);
        if (t / reps < best) best = t / reps;
    }
    return best;
}

typedef struct {
    ct_ctx *ctx;
    ct_tensor *x, *w, *b;
    ct_qweight *qw;
    ct_qkernel k;
    float *y;
    uint8_t *abuf;
} job;

static void run_f32(void *a) { job *j = a; ct_linear(j->ctx, j->x, j->w, j->b); ct_ctx_reset(j->ctx); }
static void run_int8(void *a) { job *j = a; ct_linear_dynamic_int8(j->ctx, j->x, j->qw, j->b); ct_ctx_reset(j->ctx); }
static void run_kernel(void *a) {
    job *j = a;
    ct_qlinear_raw(j->k, ct_f32(j->x), j->x->shape[0], j->qw, ct_f32(j->b), j->y, j->abuf);
}

/* The int8 instruction's own ceiling on one thread, in the table's unit (2 ops per u8 x s8
 * product): 16 independent vpdpbusd chains (64 products each), nothing loaded. 0 without VNNI. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vnni_chain_rate(void) {
    __m512i acc[16], a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x01010101);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_epi32(i);
    const long n = 4000000;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        for (long i = 0; i < n; i++) {
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
            __asm__ volatile("" : "+v"(a)); /* one loop-carried input: nothing hoisted */
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    int sink = 0;
    for (int i = 0; i < 16; i++) sink += _mm512_reduce_add_epi32(acc[i]);
    __asm__ volatile("" ::"r"(sink));
    return (double)n * 16 * 64 * 2 / best;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    bool quick = argc > 2 && !strcmp(argv[2], "quick");
    ct_set_num_threads(threads > 0 ? threads : 1);
    int Ms[] = {1, 16, 64, 256}, KNs[] = {1024, 2048, 4096};
    printf("int8 dynamic Linear vs f32 Linear, %d thread%s, int8 kernel %s (GFLOP/s-equivalent, 2MNK/t)\n", ct_get_num_threads(),
           ct_get_num_threads() > 1 ? "s" : "", ct_qgemm_kernel_name());
    if (ct_qkernel_available(CT_QK_VNNI))
        printf("vpdpbusd ceiling, 1 thread (16 chains, no loads): %.1f GOPS in this unit\n", vnni_chain_rate() * 1e-9);
    printf("%5s %5s %5s | %9s %9s %7s | %9s %9s\n", "M", "K", "N", "f32", "int8", "ratio", "vnni", "avx2");
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 4; b++) {
            int K = KNs[a], N = KNs[a], M = Ms[b];
            if (quick && ((K != 1024 && K != 4096) || (M != 1 && M != 256))) continue;
            job j = {0};
            if (ct_ctx_create(NULL, &j.ctx) != CT_OK) return 1;
            ct_params *P;
            ct_params_create(&P);
            j.w = ct_param(P, "w", 2, (int64_t[]){N, K}, CT_INIT_KAIMING_UNIFORM, K);
            j.b = ct_param(P, "b", 1, (int64_t[]){N}, CT_INIT_KAIMING_UNIFORM, K);
            if (ct_params_finalize(P, 1) != CT_OK) return 1;
            float *xd = malloc((size_t)M * K * sizeof *xd);
            for (int64_t i = 0; i < (int64_t)M * K; i++) xd[i] = (float)((i * 7919) % 1000) / 500.f - 1.f;
            ct_ctx *xc;
            ct_ctx_create(NULL, &xc);
            j.x = ct_from_f32(xc, xd, 2, (int64_t[]){M, K});
            if (ct_qweight_quantize(ct_f32(j.w), N, K, false, &j.qw) != CT_OK) return 1;
            j.y = malloc((size_t)M * N * sizeof *j.y);
            j.abuf = aligned_alloc(64, (ct_qlinear_abuf_bytes(M, j.qw) + 63) / 64 * 64);
            ct_set_grad_enabled(j.ctx, false);
            double flop = 2.0 * M * N * K;
            double tf = best_time(run_f32, &j), ti = best_time(run_int8, &j);
            double tk[CT_QK_COUNT] = {0};
            for (int k = CT_QK_AVX2; k < CT_QK_COUNT; k++)
                if (ct_qkernel_available((ct_qkernel)k)) { j.k = (ct_qkernel)k; tk[k] = best_time(run_kernel, &j); }
            printf("%5d %5d %5d | %9.1f %9.1f %6.2fx | %9.1f %9.1f\n", M, K, N, flop / tf * 1e-9, flop / ti * 1e-9, tf / ti,
                   tk[CT_QK_VNNI] > 0 ? flop / tk[CT_QK_VNNI] * 1e-9 : 0, tk[CT_QK_AVX2] > 0 ? flop / tk[CT_QK_AVX2] * 1e-9 : 0);
            fflush(stdout);
            free(xd); free(j.y); free(j.abuf);
            ct_qweight_free(j.qw);
            ct_params_free(P);
            ct_ctx_free(xc);
            ct_ctx_free(j.ctx);
        }
    return 0;
}
