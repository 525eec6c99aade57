/* Rate of the CNN's direct convolution kernels (src/ops/cpu/conv_direct.c) one at a time,
 * 1 thread, batch 128, the shapes of `ctrain train cnn`: conv1 (1 -> 32) and conv2
 * (32 -> 64), 5x5, pad 2. Process CPU time, best of 5; GFLOP/s against the
 * 1-thread GEMM peak of `train_bench sgemm 1`.
 *
 *   build/bench/conv_bench
 *   conv2 fw: 13.81 ms 186.0 GFLOP/s                                                    */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ops/cpu/conv_direct.h"
#include "ops/cpu/sgemm.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static float *rnd(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) {
        fprintf(stderr, "conv_bench: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return p;
}

typedef struct {
    const ct_conv_direct_geom *g;
    float *x, *dy, *dx, *dw, *y, *b, *s;
    int64_t N, nbmax;
} kargs;

static void run_fw(const kargs *a) { ct_conv_direct_fw(a->g, a->s, 1, a->x, a->b, a->N, 1, a->y); }
static void run_dx(const kargs *a) { ct_conv_direct_dx(a->g, a->s, 1, a->dy, a->N, a->dx, true); }
static void run_dw(const kargs *a) {
    const ct_conv_direct_geom *g = a->g;
    bool few = g->C < 16;
    (few ? ct_conv_direct_dws_layout : ct_conv_direct_dw_layout)(g, a->dw, a->s, true);
    for (int64_t n0 = 0; n0 < a->N; n0 += a->nbmax) {
        int64_t nb = a->N - n0 < a->nbmax ? a->N - n0 : a->nbmax;
        (few ? ct_conv_direct_dws : ct_conv_direct_dw)(g, a->s, 1, a->x + n0 * g->C * g->H * g->W, a->dy + n0 * g->O * g->OH * g->OW, nb);
    }
    (few ? ct_conv_direct_dws_layout : ct_conv_direct_dw_layout)(g, a->dw, a->s, false);
}

static void timed(const char *name, void (*fn)(const kargs *), const kargs *a, double gflop) {
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t = cpu_now();
        fn(a);
        t = cpu_now() - t;
        if (t < best) best = t;
    }
    printf("%s: %.2f ms %.1f GFLOP/s\n", name, best * 1e3, gflop / best);
}

int main(void) {
    if (!ct_sgemm_own_available()) {
        printf("conv_bench: the direct kernels need an AVX-512 CPU\n");
        return 0;
    }
    const int64_t N = 128;
    ct_conv_direct_geom gs[2] = {{1, 28, 28, 32, 5, 5, 2, 28, 28}, {32, 14, 14, 64, 5, 5, 2, 14, 14}};
    for (int l = 0; l < 2; l++) {
        const ct_conv_direct_geom *g = &gs[l];
        int64_t P = g->OH * g->OW, K = g->C * g->kh * g->kw;
        /* conv.c's weight-gradient chunk (COL_BUDGET floats of col) */
        int64_t nbmax = (1 << 20) / (K * P);
        nbmax = nbmax < 1 ? 1 : nbmax > N ? N : nbmax;
        double gflop = 2.0 * (double)(N * g->O * P * K) / 1e9;
        kargs a = {g, rnd(N * g->C * g->H * g->W), rnd(N * g->O * P), rnd(N * g->C * g->H * g->W), rnd(g->O * K),
                   rnd(N * g->O * P), rnd(g->O), NULL, N, nbmax};
        char name[32];
        a.s = rnd((int64_t)ct_conv_direct_scratch(g, 1, false));
        ct_conv_direct_prep(g, a.dw, a.s);
        snprintf(name, sizeof name, "conv%d fw", l + 1);
        timed(name, run_fw, &a, gflop);
        free(a.s);
        a.s = rnd((int64_t)(g->C < 16 ? ct_conv_direct_dws_scratch(g, nbmax, 1) : ct_conv_direct_dw_scratch(g, nbmax)));
        snprintf(name, sizeof name, "conv%d dw", l + 1);
        timed(name, run_dw, &a, gflop);
        free(a.s);
        if (g->C >= 16) { /* conv1's input is data: no input gradient */
            a.s = rnd((int64_t)ct_conv_direct_dx_scratch(g, 1));
            ct_conv_direct_dx_prep(g, a.dw, a.s);
            snprintf(name, sizeof name, "conv%d dx", l + 1);
            timed(name, run_dx, &a, gflop);
            free(a.s);
        }
        free(a.x); free(a.dy); free(a.dx); free(a.dw); free(a.y); free(a.b);
    }
    return 0;
}
