/* bench/attention_bench.c — plain vs fused (flash) attention, forward + backward, the GPT's
 * head shape (8 heads of 32 or 64), causal, at several context lengths:
 *
 *   attention_bench THREADS [D]     one line per T: ms per forward+backward, best of 5 (wall
 *                                   and process CPU time), and the bytes forward keeps for backward
 *   attention_bench qkv THREADS [N] the GPT benchmark's attention on c_attn's output (B 8, T 256,
 *                                   C 256, 8 heads): head-layout copies + ct_flash_attention +
 *                                   merge_heads against ct_flash_attention_qkv, best and median of N (20)
 *   attention_bench qkv16 THREADS [N] the same on a bf16 qkv: the fused op's f32 kernels on
 *                                   widened values (CTRAIN_GEMM_BF16=rounded) against its AMX path
 * Interleaved (plain, flash, plain, flash...) so a disturbed moment hits both alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/ctrain.h"

static void fill(ct_tensor *t, uint64_t s) {
    float *p = t->data;
    for (int64_t i = 0; i < ct_numel(t); i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        p[i] = (float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* seconds for one forward + backward (wall; *cpu: process CPU time); *kept = arena bytes
 * forward added beyond its output */
static double once(ct_ctx *c, int64_t T, int64_t D, bool flash, size_t *kept, double *cpu) {
    const int64_t B = 1, H = 8;
    ct_ctx_reset(c);
    ct_tensor *q = ct_new(c, CT_F32, 4, (int64_t[]){B, H, T, D}), *k = ct_new(c, CT_F32, 4, (int64_t[]){B, H, T, D});
    ct_tensor *v = ct_new(c, CT_F32, 4, (int64_t[]){B, H, T, D});
    fill(q, 1), fill(k, 2), fill(v, 3);
    ct_requires_grad(q), ct_requires_grad(k), ct_requires_grad(v);
    ct_tensor *g = ct_new(c, CT_F32, 4, (int64_t[]){B, H, T, D});
    fill(g, 4);
    size_t before = ct_ctx_used_bytes(c);
    double t0 = ct_time_now(), c0 = cpu_now();
    ct_tensor *y = flash ? ct_flash_attention(c, q, k, v, true) : ct_attention(c, q, k, v, true);
    *kept = ct_ctx_used_bytes(c) - before - ct_nbytes(y);
    ct_backward_seed(c, y, g);
    *cpu = cpu_now() - c0;
    return ct_time_now() - t0;
}

/* qkv [B, T, 3C] → y [B, T, C], the unfused way CausalSelfAttention ran before the qkv op */
static ct_tensor *chain(ct_ctx *c, ct_tensor *qkv, int64_t B, int64_t T, int64_t H, int64_t D) {
    ct_tensor *t = ct_reshape(c, qkv, 5, (int64_t[]){B, T, 3, H, D});
    t = ct_contiguous(c, ct_transpose(c, ct_transpose(c, ct_transpose(c, t, 1, 2), 2, 3), 0, 1));
    ct_tensor *in[3];
    for (int i = 0; i < 3; i++) in[i] = ct_reshape(c, ct_slice(c, t, 0, i, 1), 4, (int64_t[]){B, H, T, D});
    return ct_merge_heads(c, ct_flash_attention(c, in[0], in[1], in[2], true));
}

static int cmp_d(const void *a, const void *b) { return *(const double *)a < *(const double *)b ? -1 : *(const double *)a > *(const double *)b; }

/* bf16: a bf16 qkv (as under autocast), the fused op's f32 kernels on widened values
 * (CTRAIN_GEMM_BF16=rounded, reported as "chain") against its AMX path ("fused") */
static int qkv_main(int threads, int n, bool bf16) {
    const int64_t B = 8, T = 256, H = 8, D = 32, C = H * D;
    ct_set_num_threads(threads);
    ct_ctx *c;
    if (ct_ctx_create(NULL, &c) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
    double *ms = calloc((size_t)(4 * n), sizeof(double)); /* [fused][wall, cpu][rep] */
    for (int rep = 0; rep < n + 1; rep++) /* the first round warms up */
        for (int f = 0; f < 2; f++) {
            ct_ctx_reset(c);
            ct_tensor *qkv = ct_new(c, CT_F32, 3, (int64_t[]){B, T, 3 * C}), *g = ct_new(c, CT_F32, 3, (int64_t[]){B, T, C});
            fill(qkv, 1), fill(g, 2);
            ct_requires_grad(qkv);
            if (bf16) {
                qkv = ct_cast(c, qkv, CT_BF16);
                if (f) ct_config_unset("CTRAIN_GEMM_BF16");
                else ct_config_set("CTRAIN_GEMM_BF16", "rounded");
            }
            double t0 = ct_time_now(), c0 = cpu_now();
            ct_tensor *y = f || bf16 ? ct_flash_attention_qkv(c, qkv, (int)H, true) : chain(c, qkv, B, T, H, D);
            ct_backward_seed(c, y, g);
            if (rep) ms[(f * 2) * n + rep - 1] = 1e3 * (ct_time_now() - t0), ms[(f * 2 + 1) * n + rep - 1] = 1e3 * (cpu_now() - c0);
        }
    for (int i = 0; i < 4; i++) qsort(ms + i * n, (size_t)n, sizeof(double), cmp_d);
    printf("RESULT attention_qkv%s B=8 T=256 C=256 heads=8 threads=%d reps=%d %s_ms=%.2f/%.2f %s_ms=%.2f/%.2f "
           "%s_cpu_ms=%.2f/%.2f %s_cpu_ms=%.2f/%.2f (best/median)\n",
           bf16 ? "_bf16" : "", threads, n, bf16 ? "f32kernels" : "chain", ms[0], ms[n / 2], bf16 ? "amx" : "fused", ms[2 * n],
           ms[2 * n + n / 2], bf16 ? "f32kernels" : "chain", ms[n], ms[n + n / 2], bf16 ? "amx" : "fused", ms[3 * n], ms[3 * n + n / 2]);
    ct_config_unset("CTRAIN_GEMM_BF16");
    free(ms);
    ct_ctx_free(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && (!strcmp(argv[1], "qkv") || !strcmp(argv[1], "qkv16")))
        return qkv_main(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 20, argv[1][3] == '1');
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int64_t D = argc > 2 ? atoll(argv[2]) : 32;
    ct_set_num_threads(threads);
    ct_ctx *c;
    if (ct_ctx_create(NULL, &c) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
    const int64_t Ts[] = {256, 1024, 2048};
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        double best[2] = {1e30, 1e30}, cbest[2] = {1e30, 1e30};
        size_t kept[2];
        for (int rep = 0; rep < 5; rep++)
            for (int f = 0; f < 2; f++) {
                double cpu, t = once(c, Ts[i], D, f, &kept[f], &cpu);
                if (t < best[f]) best[f] = t;
                if (cpu < cbest[f]) cbest[f] = cpu;
            }
        printf("RESULT attention T=%lld D=%lld heads=8 threads=%d plain_ms=%.2f flash_ms=%.2f flash_vs_plain=%.2f "
               "plain_cpu_ms=%.2f flash_cpu_ms=%.2f plain_kept_mb=%.2f flash_kept_mb=%.3f\n",
               (long long)Ts[i], (long long)D, threads, 1e3 * best[0], 1e3 * best[1], best[0] / best[1], 1e3 * cbest[0], 1e3 * cbest[1], kept[0] / 1048576.0,
               kept[1] / 1048576.0);
    }
    ct_ctx_free(c);
    return 0;
}
