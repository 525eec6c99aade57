/* ctrain's SGEMM (src/ops/cpu/sgemm.c; the AVX2 family under CTRAIN_GEMM=avx2 or on a CPU
 * without AVX-512) against a double-precision reference:
 * every transpose combination, odd sizes (1..67, primes, K = 1, M/N off the register tile,
 * sizes crossing the MC/KC/NC cache blocks), sub-matrices (ld > width), alpha/beta values
 * including beta = 0 over NaN garbage; and bit-identical results for 1 and 2 threads; the AVX2
 * family's bits against the AVX-512 family's. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "ctrain/config.h"
#include "ctrain/core.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/conv_direct.h"
#include "ops/cpu/sgemm.h"

static uint64_t rng_s = 12345;
static float frand(void) {
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return (float)((rng_s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static float *rnd(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

/* one product checked elementwise: |C - ref| <= (K + 4) eps (|alpha| sum|a b| + |beta c|) */
static int check(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta, int pad) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    float *A = rnd(ar * lda), *B = rnd(br * ldb), *C = rnd(M * ldc), *C0 = malloc((size_t)(M * ldc + 1) * sizeof(float));
    if (beta == 0.0f)
        for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN; /* must be ignored */
    memcpy(C0, C, (size_t)(M * ldc) * sizeof(float));
    ct_sgemm_own(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    int bad = 0;
    for (int64_t i = 0; i < M && bad < 3; i++)
        for (int64_t j = 0; j < ldc && bad < 3; j++) {
            if (j >= N) { /* padding columns untouched */
                if (memcmp(&C[i * ldc + j], &C0[i * ldc + j], sizeof(float))) { CT_FAILF("wrote padding (%lld,%lld)", (long long)i, (long long)j); bad++; }
                continue;
            }
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
                sa += fabs(a * b);
            }
            double c0 = beta == 0.0f ? 0.0 : C0[i * ldc + j];
            double ref = alpha * s + beta * c0;
            double tol = (K + 4) * 1.2e-7 * (fabs(alpha) * sa + fabs(beta * c0)) + 1e-30;
            double got = C[i * ldc + j];
            if (!(fabs(got - ref) <= tol)) {
                CT_FAILF("ta=%d tb=%d M=%lld N=%lld K=%lld alpha=%g beta=%g pad=%d: C[%lld,%lld] = %.9g, ref %.9g (tol %.3g)", ta, tb,
                         (long long)M, (long long)N, (long long)K, alpha, beta, pad, (long long)i, (long long)j, got, ref, tol);
                bad++;
            }
        }
    free(A); free(B); free(C); free(C0);
    return bad;
}

/* also the packing buffers, which a context would reserve. NEED_KERNEL: either family (the
 * CPU's, or CTRAIN_GEMM=avx2's); NEED_AVX512: entries only the AVX-512 family has */
#define NEED_AVX512() do { if (!ct_sgemm_own_available()) CT_SKIP("no AVX-512 here (the CPU, or CTRAIN_CPU_CAPABILITY)"); \
                           CT_ASSERT(ct_kernels_reserve(2) == CT_OK); } while (0)
#define NEED_KERNEL() do { if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) CT_SKIP("neither AVX-512 nor AVX2 and FMA here (the CPU, or CTRAIN_CPU_CAPABILITY=none)"); \
                           CT_ASSERT(ct_kernels_reserve(2) == CT_OK); } while (0)

CT_TEST(small_sizes_all_transposes) {
    NEED_KERNEL();
    const int sz[] = {1, 2, 3, 5, 7, 13, 14, 15, 16, 17, 29, 31, 32, 33, 47, 48, 49, 63, 64, 67};
    int n = sizeof sz / sizeof sz[0], bad = 0;
    for (int t = 0; t < 4 && !bad; t++)
        for (int a = 0; a < n && !bad; a++)
            for (int b = 0; b < n && !bad; b += 3)
                for (int c = 0; c < n && !bad; c += 4)
                    bad += check(t & 1, t >> 1, sz[a], sz[b], sz[c], 1.0f, 0.0f, 0);
    CT_EXPECT_EQ(bad, 0);
}

CT_TEST(every_m_n_up_to_67) {
    NEED_KERNEL();
    int bad = 0;
    for (int t = 0; t < 4 && !bad; t++)
        for (int m = 1; m <= 67 && !bad; m++)
            for (int nn = 1; nn <= 67 && !bad; nn += (m % 5) + 1) bad += check(t & 1, t >> 1, m, nn, (m * 7 + nn) % 37 + 1, 1.0f, 1.0f, 0);
    CT_EXPECT_EQ(bad, 0);
}

CT_TEST(k_equals_1_and_k_0) {
    NEED_KERNEL();
    for (int t = 0; t < 4; t++) {
        CT_EXPECT_EQ(check(t & 1, t >> 1, 37, 53, 1, 1.0f, 0.0f, 0), 0);
        CT_EXPECT_EQ(check(t & 1, t >> 1, 37, 53, 1, -0.5f, 2.0f, 3), 0);
    }
    /* K = 0: C = beta C (beta = 0: zeros over NaN) */
    float C[6] = {NAN, NAN, NAN, 1, 2, 3}, A[1] = {0}, B[1] = {0};
    ct_sgemm_own(false, false, 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, C, 3);
    for (int i = 0; i < 6; i++) CT_EXPECT(C[i] == 0.0f);
    float D[3] = {1, 2, 3};
    ct_sgemm_own(false, false, 1, 3, 0, 1.0f, A, 1, B, 3, 2.0f, D, 3);
    CT_EXPECT(D[0] == 2.0f && D[1] == 4.0f && D[2] == 6.0f);
}

CT_TEST(alpha_beta_values) {
    NEED_KERNEL();
    const float ab[][2] = {{1, 0}, {1, 1}, {2.5f, 0}, {-1, 1}, {0.5f, -0.75f}, {1, 2}, {0, 0.5f}, {-3, 0}};
    int bad = 0;
    for (int t = 0; t < 4 && !bad; t++)
        for (size_t i = 0; i < sizeof ab / sizeof ab[0] && !bad; i++) {
            bad += check(t & 1, t >> 1, 45, 71, 39, ab[i][0], ab[i][1], 0);
            bad += check(t & 1, t >> 1, 19, 40, 301, ab[i][0], ab[i][1], 5);
        }
    CT_EXPECT_EQ(bad, 0);
}

CT_TEST(primes_and_cache_block_edges) {
    NEED_KERNEL();
    /* crosses MC (168), KC (256) and NC (2048) block edges; strided sub-matrices */
    const int64_t sh[][3] = {{101, 103, 107}, {167, 97, 257}, {169, 33, 513}, {337, 61, 255}, {29, 2053, 71}, {5, 4099, 3},
                             {211, 17, 1031}, {1, 1, 997}, {2, 2111, 260}};
    int bad = 0;
    for (int t = 0; t < 4 && !bad; t++)
        for (size_t i = 0; i < sizeof sh / sizeof sh[0] && !bad; i++)
            bad += check(t & 1, t >> 1, sh[i][0], sh[i][1], sh[i][2], i % 2 ? 1.0f : -0.5f, i % 3 == 0 ? 0.0f : 1.0f, (int)(i % 3));
    CT_EXPECT_EQ(bad, 0);
}

CT_TEST(model_shapes) {
    NEED_KERNEL();
    /* MLP 784-1024 at batch 128 (forward, dX, dW), GPT width 256, attention 64 x 256 x 32 */
    int bad = 0;
    bad += check(false, true, 128, 1024, 784, 1.0f, 1.0f, 0);
    bad += check(false, false, 128, 784, 1024, 1.0f, 1.0f, 0);
    bad += check(true, false, 1024, 784, 128, 1.0f, 1.0f, 0);
    bad += check(false, true, 256, 768, 256, 1.0f, 0.0f, 0);
    bad += check(false, true, 64, 256, 32, 0.17677669f, 0.0f, 0);
    bad += check(true, false, 256, 32, 64, 1.0f, 1.0f, 0);
    CT_EXPECT_EQ(bad, 0);
}

/* 1 and 2 threads: the same bits */
CT_TEST(thread_count_bit_identity) {
    NEED_KERNEL();
    const int64_t sh[][3] = {{300, 500, 700}, {128, 1024, 784}, {1024, 784, 128}, {2048, 256, 256}, {37, 2500, 300}, {64, 256, 32}};
    for (int t = 0; t < 4; t++)
        for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
            bool ta = t & 1, tb = t >> 1;
            int64_t M = sh[s][0], N = sh[s][1], K = sh[s][2];
            float *A = rnd(M * K), *B = rnd(K * N), *C1 = rnd(M * N);
            float *C2 = malloc((size_t)(M * N) * sizeof(float));
            memcpy(C2, C1, (size_t)(M * N) * sizeof(float));
            ct_set_num_threads(1);
            ct_sgemm_own(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 1.0f, C1, N);
            ct_set_num_threads(2);
            ct_sgemm_own(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 1.0f, C2, N);
            CT_EXPECTF(!memcmp(C1, C2, (size_t)(M * N) * sizeof(float)), "ta=%d tb=%d %lldx%lldx%lld: 1 and 2 threads differ", ta,
                       tb, (long long)M, (long long)N, (long long)K);
            free(A); free(B); free(C1); free(C2);
        }
    ct_set_num_threads(ct_default_num_threads());
}

/* ct_sgemm_bias (linear's forward): the bits of ct_sgemm_own with beta 1 on rows filled with
 * the bias, for every transpose, 1 and 2 threads (ranges split by rows and by columns), K in
 * one block and across several, sizes off the tile, a C with row padding */
CT_TEST(bias_row_same_bits) {
    NEED_KERNEL();
    const int64_t sh[][3] = {{2048, 256, 256}, {37, 1000, 300}, {300, 40, 777}, {7, 17, 16}, {128, 1024, 784}, {5, 3, 0}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t >> 1;
            int64_t M = sh[s][0], N = sh[s][1], K = sh[s][2], ldc = N + 3;
            float *A = rnd(M * K), *B = rnd(K * N), *bias = rnd(N), *E = rnd(M * ldc), *C = malloc((size_t)(M * ldc) * sizeof(float));
            for (int64_t i = 0; i < M; i++) memcpy(E + i * ldc, bias, (size_t)N * sizeof(float));
            ct_set_num_threads(1);
            ct_sgemm_own(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 1.0f, E, ldc);
            for (int th = 1; th <= 2; th++) {
                ct_set_num_threads(th);
                for (int64_t i = 0; i < M * ldc; i++) C[i] = E[i] + 1.0f; /* every element written must change */
                ct_sgemm_bias(ta, tb, M, N, K, A, ta ? M : K, B, tb ? K : N, bias, C, ldc);
                int bad = 0;
                for (int64_t i = 0; i < M && !bad; i++) bad = memcmp(C + i * ldc, E + i * ldc, (size_t)N * sizeof(float)) != 0;
                CT_EXPECTF(!bad, "%lldx%lldx%lld ta=%d tb=%d threads=%d: bias-row GEMM differs", (long long)M, (long long)N,
                           (long long)K, ta, tb, th);
            }
            free(A); free(B); free(bias); free(E); free(C);
        }
    ct_set_num_threads(ct_default_num_threads());
}

/* implicit B (conv2d's path): the packer hands out the micro-panels of an explicit B, and
 * the product has the bits of ct_sgemm_own on that B, for 1 and 2 threads, at sizes off the
 * tile and across the KC and MC blocks, beta 0 (over NaN) and 1 */
typedef struct { const float *B; int64_t ldb; } explicit_b;
static void pack_explicit(const void *arg, float *dst, int64_t n0, int n, int64_t k0, int64_t kc) {
    const explicit_b *e = arg;
    for (int64_t k = 0; k < kc; k++)
        for (int c = 0; c < CT_SGEMM_NR; c++) dst[k * CT_SGEMM_NR + c] = c < n ? e->B[(k0 + k) * e->ldb + n0 + c] : 0.0f;
}
CT_TEST(implicit_b_same_bits) {
    NEED_AVX512();
    const int64_t sh[][3] = {{64, 1176, 800}, {32, 2509, 25}, {200, 77, 300}, {7, 40, 16}, {170, 33, 513}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int beta = 0; beta < 2; beta++) {
                int64_t M = sh[s][0], N = sh[s][1], K = sh[s][2];
                float *A = rnd(M * K), *B = rnd(K * N), *R = rnd(M * N), *C = malloc((size_t)(M * N) * sizeof(float));
                if (!beta)
                    for (int64_t i = 0; i < M * N; i++) R[i] = NAN;
                explicit_b e = {B, N};
                for (int t = 1; t <= 2; t++) {
                    memcpy(C, R, (size_t)(M * N) * sizeof(float));
                    ct_set_num_threads(t);
                    ct_sgemm_implicit_b(ta, M, N, K, A, ta ? M : K, pack_explicit, &e, (float)beta, C, N);
                    float *E = malloc((size_t)(M * N) * sizeof(float));
                    memcpy(E, R, (size_t)(M * N) * sizeof(float));
                    ct_sgemm_own(ta, false, M, N, K, 1.0f, A, ta ? M : K, B, N, (float)beta, E, N);
                    CT_EXPECTF(!memcmp(C, E, (size_t)(M * N) * sizeof(float)), "%lldx%lldx%lld ta=%d beta=%d threads=%d: implicit B differs",
                               (long long)M, (long long)N, (long long)K, ta, beta, t);
                    free(E);
                }
                free(A); free(B); free(R); free(C);
            }
    ct_set_num_threads(ct_default_num_threads());
}

/* segmented A (dY of NCHW samples read as [M, nseg*seg]) gives the bits of the gathered A,
 * segments shorter and longer than a K block, any thread count */
CT_TEST(implicit_b_seg_same_bits) {
    NEED_AVX512();
    const int64_t sh[][4] = {{64, 800, 6, 196}, {32, 25, 53, 784}, {20, 40, 7, 13}, {15, 33, 3, 300}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        int64_t M = sh[s][0], N = sh[s][1], nseg = sh[s][2], seg = sh[s][3], K = nseg * seg, stride = M * seg + 5;
        float *As = rnd(nseg * stride), *A = malloc((size_t)(M * K) * sizeof(float)), *B = rnd(K * N), *R = rnd(M * N);
        float *C = malloc((size_t)(M * N) * sizeof(float)), *E = malloc((size_t)(M * N) * sizeof(float));
        for (int64_t i = 0; i < M; i++)
            for (int64_t k = 0; k < K; k++) A[i * K + k] = As[(k / seg) * stride + i * seg + k % seg];
        explicit_b e = {B, N};
        memcpy(E, R, (size_t)(M * N) * sizeof(float));
        ct_sgemm_implicit_b(false, M, N, K, A, K, pack_explicit, &e, 1.0f, E, N);
        for (int t = 1; t <= 2; t++) {
            memcpy(C, R, (size_t)(M * N) * sizeof(float));
            ct_set_num_threads(t);
            ct_sgemm_implicit_b_seg(M, N, K, As, seg, seg, stride, pack_explicit, &e, 1.0f, C, N);
            CT_EXPECTF(!memcmp(C, E, (size_t)(M * N) * sizeof(float)), "%lldx%lld, %lld segments of %lld, threads=%d: segmented A differs",
                       (long long)M, (long long)N, (long long)nseg, (long long)seg, t);
        }
        free(As); free(A); free(B); free(R); free(C); free(E);
    }
    ct_set_num_threads(ct_default_num_threads());
}

/* conv2d's direct forward (conv_direct.c) has the bits of the explicit GEMM on im2col with
 * conv.c's bias copy-out, for 1 and 2 threads: O off the 32-channel tile, rows shorter and
 * longer than the 14-pixel tile, K across a KC block, no padding; without a bias, the +0.0f
 * of the copy-out only for groups (chunk) of more than one sample */
CT_TEST(conv_direct_same_bits) {
    NEED_AVX512();
    const int64_t sh[][6] = {{1, 28, 28, 32, 5, 2}, {32, 14, 14, 64, 5, 2}, {3, 9, 11, 20, 3, 1}, {16, 17, 30, 40, 3, 0},
                             {11, 8, 20, 70, 5, 2}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        int64_t C = sh[s][0], H = sh[s][1], W = sh[s][2], O = sh[s][3], k = sh[s][4], p = sh[s][5], nb = 3;
        int64_t OH = H + 2 * p - k + 1, OW = W + 2 * p - k + 1, P = OH * OW, K = C * k * k;
        float *x = rnd(nb * C * H * W), *w = rnd(O * K), *b = rnd(O), *col = malloc((size_t)(K * P) * sizeof(float));
        float *E = malloc((size_t)(nb * O * P) * sizeof(float)), *Y = malloc((size_t)(nb * O * P) * sizeof(float));
        for (int64_t i = 0; i < nb * C * H * W; i += 7) x[i] = 0.0f; /* zero products: signs of zero */
        ct_conv_direct_geom g = {C, H, W, O, k, k, p, OH, OW};
        for (int bias = 0; bias < 2; bias++)
            for (int64_t chunk = 1; chunk <= nb; chunk += nb - 1) {
                for (int64_t j = 0; j < nb; j++) {
                    for (int64_t kk = 0; kk < K; kk++)
                        for (int64_t q = 0; q < P; q++) {
                            int64_t c = kk / (k * k), ih = q / OW - p + (kk / k) % k, iw = q % OW - p + kk % k;
                            col[kk * P + q] = ih < 0 || ih >= H || iw < 0 || iw >= W ? 0.0f : x[((j * C + c) * H + ih) * W + iw];
                        }
                    float *e = E + j * O * P;
                    ct_sgemm_own(false, false, O, P, K, 1.0f, w, K, col, P, 0.0f, e, P);
                    for (int64_t o = 0; o < O; o++)
                        for (int64_t q = 0; q < P; q++)
                            if (bias || chunk > 1) e[o * P + q] = e[o * P + q] + (bias ? b[o] : 0.0f);
                }
                for (int t = 1; t <= 2; t++) {
                    ct_set_num_threads(t);
                    float *sc = malloc(ct_conv_direct_scratch(&g, t, false) * sizeof(float));
                    ct_conv_direct_prep(&g, w, sc);
                    for (int64_t i = 0; i < nb * O * P; i++) Y[i] = NAN;
                    ct_conv_direct_fw(&g, sc, t, x, bias ? b : NULL, nb, chunk, Y);
                    CT_EXPECTF(!memcmp(Y, E, (size_t)(nb * O * P) * sizeof(float)),
                               "C=%lld %lldx%lld O=%lld k=%lld p=%lld bias=%d chunk=%lld threads=%d: direct conv differs", (long long)C,
                               (long long)H, (long long)W, (long long)O, (long long)k, (long long)p, bias, (long long)chunk, t);
                    free(sc);
                }
            }
        free(x); free(w); free(b); free(col); free(E); free(Y);
    }
    ct_set_num_threads(ct_default_num_threads());
}

/* conv2d's direct weight gradients (conv_direct.c) have the bits of the GEMM dW += dY col^T
 * over the chunk's pixels (explicit operands), for 1 and 2 threads, accumulated over two
 * chunks; few: the C < 16 kernel (output channels as the vectors) */
static void dw_same_bits(const int64_t (*sh)[6], size_t nsh, bool few) {
    for (size_t s = 0; s < nsh; s++) {
        int64_t C = sh[s][0], H = sh[s][1], W = sh[s][2], O = sh[s][3], k = sh[s][4], p = sh[s][5], nb = 3, chunks = 2;
        const int64_t nbs[2] = {3, 2}; /* a full chunk, then a shorter one */
        int64_t OH = H + 2 * p - k + 1, OW = W + 2 * p - k + 1, P = OH * OW, K = C * k * k;
        float *x = rnd(chunks * nb * C * H * W), *dy = rnd(chunks * nb * O * P), *dw0 = rnd(O * K);
        float *col = malloc((size_t)(K * nb * P) * sizeof(float)), *A = malloc((size_t)(O * nb * P) * sizeof(float));
        float *E = malloc((size_t)(O * K) * sizeof(float)), *D = malloc((size_t)(O * K) * sizeof(float));
        ct_conv_direct_geom g = {C, H, W, O, k, k, p, OH, OW};
        memcpy(E, dw0, (size_t)(O * K) * sizeof(float));
        for (int64_t ch = 0; ch < chunks; ch++) {
            const float *xc = x + ch * nb * C * H * W, *dc = dy + ch * nb * O * P;
            int64_t Q = nbs[ch] * P;
            for (int64_t kk = 0; kk < K; kk++)
                for (int64_t q = 0; q < Q; q++) {
                    int64_t j = q / P, r = q % P, c = kk / (k * k), ih = r / OW - p + (kk / k) % k, iw = r % OW - p + kk % k;
                    col[kk * Q + q] = ih < 0 || ih >= H || iw < 0 || iw >= W ? 0.0f : xc[((j * C + c) * H + ih) * W + iw];
                }
            for (int64_t o = 0; o < O; o++)
                for (int64_t q = 0; q < Q; q++) A[o * Q + q] = dc[((q / P) * O + o) * P + q % P];
            ct_sgemm_own(false, true, O, K, Q, 1.0f, A, Q, col, Q, 1.0f, E, K);
        }
        /* up to 4 threads: more than some shapes have items or channel groups */
        for (int t = 1; t <= 4; t++) {
            ct_set_num_threads(t);
            float *sc = malloc((few ? ct_conv_direct_dws_scratch(&g, nb, t) : ct_conv_direct_dw_scratch(&g, nb)) * sizeof(float));
            memcpy(D, dw0, (size_t)(O * K) * sizeof(float));
            (few ? ct_conv_direct_dws_layout : ct_conv_direct_dw_layout)(&g, D, sc, true);
            for (int64_t ch = 0; ch < chunks; ch++)
                (few ? ct_conv_direct_dws : ct_conv_direct_dw)(&g, sc, t, x + ch * nb * C * H * W, dy + ch * nb * O * P, nbs[ch]);
            (few ? ct_conv_direct_dws_layout : ct_conv_direct_dw_layout)(&g, D, sc, false);
            int64_t bad = -1;
            for (int64_t i = 0; i < O * K && bad < 0; i++)
                if (memcmp(&D[i], &E[i], sizeof(float))) bad = i;
            CT_EXPECTF(bad < 0, "C=%lld %lldx%lld O=%lld k=%lld p=%lld threads=%d: direct dW differs at %lld (%g vs %g)", (long long)C,
                       (long long)H, (long long)W, (long long)O, (long long)k, (long long)p, t, (long long)bad,
                       bad < 0 ? 0.0 : (double)D[bad], bad < 0 ? 0.0 : (double)E[bad]);
            free(sc);
        }
        free(x); free(dy); free(dw0); free(col); free(A); free(E); free(D);
    }
    ct_set_num_threads(ct_default_num_threads());
}

/* C on and off the 32-channel tile, O off the 14-row panel (8 and other rests) */
CT_TEST(conv_direct_dw_same_bits) {
    NEED_AVX512();
    const int64_t sh[][6] = {{32, 14, 14, 64, 5, 2}, {16, 9, 11, 20, 3, 1}, {40, 7, 6, 22, 3, 0}};
    dw_same_bits(sh, sizeof sh / sizeof sh[0], false);
}

/* the CNN's first layer (C = 1, 28x28, 5x5), K off the 14-column panel (27, 18, 50), O on
 * and off the 32-lane tile (20, 40 = 32 + 8, 16: no second vector), chunks whose pixel
 * counts are not multiples of the 256-pixel block */
CT_TEST(conv_direct_dws_same_bits) {
    NEED_AVX512();
    const int64_t sh[][6] = {{1, 28, 28, 32, 5, 2}, {3, 9, 11, 20, 3, 1}, {2, 7, 6, 40, 3, 0}, {2, 10, 13, 16, 5, 2}, {15, 6, 5, 33, 3, 1}};
    dw_same_bits(sh, sizeof sh / sizeof sh[0], true);
}

/* conv2d's direct input gradient (conv_direct.c) has the bits of dcol = W^T dY on the own
 * GEMM followed by col2im's additions (kernel offsets in order, only where the offset lands
 * inside the output), fresh (from +0) and onto an existing gradient, 1 and 2 threads */
CT_TEST(conv_direct_dx_same_bits) {
    NEED_AVX512();
    const int64_t sh[][6] = {{32, 14, 14, 64, 5, 2}, {16, 9, 17, 20, 3, 1}, {40, 7, 30, 22, 3, 0}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        int64_t C = sh[s][0], H = sh[s][1], W = sh[s][2], O = sh[s][3], k = sh[s][4], p = sh[s][5], nb = 3;
        int64_t OH = H + 2 * p - k + 1, OW = W + 2 * p - k + 1, P = OH * OW, K = C * k * k, HW = H * W;
        float *w = rnd(O * K), *dy = rnd(nb * O * P), *dx0 = rnd(nb * C * HW), *dcol = malloc((size_t)(K * P) * sizeof(float));
        float *E = malloc((size_t)(nb * C * HW) * sizeof(float)), *D = malloc((size_t)(nb * C * HW) * sizeof(float));
        ct_conv_direct_geom g = {C, H, W, O, k, k, p, OH, OW};
        for (int fresh = 0; fresh < 2; fresh++) {
            for (int64_t i = 0; i < nb * C * HW; i++) E[i] = fresh ? 0.0f : dx0[i];
            for (int64_t j = 0; j < nb; j++) {
                ct_sgemm_own(true, false, K, P, O, 1.0f, w, K, dy + j * O * P, P, 0.0f, dcol, P);
                for (int64_t kk = 0; kk < K; kk++)
                    for (int64_t q = 0; q < P; q++) {
                        int64_t c = kk / (k * k), ih = q / OW - p + (kk / k) % k, iw = q % OW - p + kk % k;
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W) E[(j * C + c) * HW + ih * W + iw] += dcol[kk * P + q];
                    }
            }
            for (int t = 1; t <= 2; t++) {
                ct_set_num_threads(t);
                float *sc = malloc(ct_conv_direct_dx_scratch(&g, t) * sizeof(float));
                ct_conv_direct_dx_prep(&g, w, sc);
                for (int64_t i = 0; i < nb * C * HW; i++) D[i] = fresh ? NAN : dx0[i];
                ct_conv_direct_dx(&g, sc, t, dy, nb, D, fresh);
                CT_EXPECTF(!memcmp(D, E, (size_t)(nb * C * HW) * sizeof(float)), "C=%lld %lldx%lld O=%lld k=%lld p=%lld fresh=%d threads=%d: direct dx differs",
                           (long long)C, (long long)H, (long long)W, (long long)O, (long long)k, (long long)p, fresh, t);
                free(sc);
            }
        }
        free(w); free(dy); free(dx0); free(dcol); free(E); free(D);
    }
    ct_set_num_threads(ct_default_num_threads());
}

/* the dispatching wrapper (what linear/matmul/conv/attention call) agrees with the reference too */
CT_TEST(dispatch_wrapper) {
    CT_ASSERT(ct_kernels_reserve(2) == CT_OK);
    int64_t M = 33, N = 77, K = 129;
    float *A = rnd(M * K), *B = rnd(K * N), *C = rnd(M * N), *R = malloc((size_t)(M * N) * sizeof(float));
    for (int64_t i = 0; i < M * N; i++) C[i] = NAN;
    ct_sgemm(false, false, M, N, K, 1.0f, A, B, 0.0f, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, 1.0f, A, (blasint)K, B,
                (blasint)N, 0.0f, R, (blasint)N);
    /* values of order 1 summed in other orders (OpenBLAS's kernel depends on the CPU: its SSE3
     * one, without FMA, on a Xeon it does not know): agreement to 1e-5 of that scale; a wrong
     * element or transpose is off by order 1 */
    CT_EXPECT(ct_max_rel_err(C, R, (long)(M * N), 1.0) < 1e-5);
    free(A); free(B); free(C); free(R);
}

/* The AVX2 family (sgemm_avx2.c, 6 x 16 tiles) gives the AVX-512 family's bits (14 x 32):
 * every entry, all transposes, sizes off both tiles and across the MC / KC / NC blocks, alpha
 * and beta, row padding, 1 and 2 threads; the bf16 GEMM's rounded path on f32 and on bf16
 * operands, with an f32 and with a bf16 result. */
typedef struct { int64_t M, N, K; } mnk;
static const mnk fam_shapes[] = {{1, 1, 1}, {5, 7, 3}, {6, 16, 17}, {7, 17, 16}, {13, 33, 29}, {14, 32, 256}, {45, 71, 39},
                                 {169, 33, 513}, {29, 2053, 71}, {37, 1000, 300}, {2, 2111, 260}, {300, 40, 777}, {128, 1024, 784}};
static uint16_t *to_bf16(const float *x, int64_t n) { /* the top halves: exact bf16 values */
    uint16_t *h = malloc((size_t)(n > 0 ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        h[i] = (uint16_t)(u >> 16);
    }
    return h;
}
/* what = 0 own, 1 bias, 2 rowsum, 3 bf16 rounded (f32 operands), 4 bf16 operands, 5 bf16 result */
static void fam_run(int what, ct_sgemm_isa isa, bool ta, bool tb, const mnk *s, float alpha, float beta, int pad, const float *A,
                    const float *B, const uint16_t *Ah, const uint16_t *Bh, const float *bias, float *C, float *sum, uint16_t *Cb) {
    ct_sgemm_set_isa_(isa);
    const int64_t lda = (ta ? s->M : s->K) + pad, ldb = (tb ? s->K : s->N) + pad, ldc = s->N + pad;
    switch (what) {
    case 0: ct_sgemm_own(ta, tb, s->M, s->N, s->K, alpha, A, lda, B, ldb, beta, C, ldc); break;
    case 1: ct_sgemm_bias(ta, tb, s->M, s->N, s->K, A, lda, B, ldb, bias, C, ldc); break;
    case 2: ct_sgemm_own_rowsum(s->M, s->N, s->K, A, s->M + pad, B, s->N + pad, beta, C, ldc, sum); break;
    case 3: ct_sgemm_bf16_on(CT_GEMM_BF16_ROUNDED, ta, tb, s->M, s->N, s->K, alpha, A, lda, B, ldb, beta, C, ldc); break;
    case 4: ct_sgemm_bf16_ex(ta, tb, s->M, s->N, s->K, alpha, Ah, true, lda, B, false, ldb, beta, C, ldc); break;
    default: ct_sgemm_bf16_out(ta, tb, s->M, s->N, s->K, alpha, A, false, lda, Bh, true, ldb, beta, C, ldc, Cb, ldc); break;
    }
    ct_sgemm_set_isa_(CT_SGEMM_ISA_NONE);
}
CT_TEST(avx2_family_bits_of_avx512) {
    if (!ct_sgemm_own_available()) CT_SKIP("no AVX-512 here (the CPU, or CTRAIN_CPU_CAPABILITY) to compare the AVX2 family with (the tests above check it)");
    CT_ASSERT(ct_kernels_reserve(2) == CT_OK);
    CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM_BF16", "rounded")); /* the one bf16 path both families have */
    const float ab[][2] = {{1, 0}, {1, 1}, {0.37f, -1.3f}}; /* the last: inexact products both ways */
    int checked = 0;
    for (size_t si = 0; si < sizeof fam_shapes / sizeof fam_shapes[0]; si++) {
        const mnk *s = &fam_shapes[si];
        for (int what = 0; what < 6; what++)
            for (int t = 0; t < 4; t++) {
                const bool ta = what == 2 ? true : t & 1, tb = what == 2 ? false : t >> 1;
                if (what == 2 && t) continue; /* rowsum: dY^T x only */
                const int pad = (int)(si % 3);
                const int64_t nA = (ta ? s->K : s->M) * ((ta ? s->M : s->K) + pad) + 1, nB = (tb ? s->N : s->K) * ((tb ? s->K : s->N) + pad) + 1;
                const int64_t nC = s->M * (s->N + pad) + 1;
                float *A = rnd(nA), *B = rnd(nB), *bias = rnd(s->N), *C0 = rnd(nC), *C1 = malloc((size_t)nC * 4), *C2 = malloc((size_t)nC * 4);
                float *S0 = rnd(s->M), *S1 = malloc((size_t)s->M * 4 + 4), *S2 = malloc((size_t)s->M * 4 + 4);
                uint16_t *Ah = to_bf16(A, nA), *Bh = to_bf16(B, nB), *H1 = calloc((size_t)nC, 2), *H2 = calloc((size_t)nC, 2);
                for (size_t a = 0; a < sizeof ab / sizeof ab[0]; a++) {
                    if ((what == 1 || what == 2) && a) continue; /* alpha 1, beta 1 / their own beta */
                    for (int th = 1; th <= 2; th++) {
                        ct_set_num_threads(th);
                        memcpy(C1, C0, (size_t)nC * 4);
                        memcpy(C2, C0, (size_t)nC * 4);
                        memcpy(S1, S0, (size_t)s->M * 4);
                        memcpy(S2, S0, (size_t)s->M * 4);
                        fam_run(what, CT_SGEMM_ISA_AVX512, ta, tb, s, ab[a][0], ab[a][1], pad, A, B, Ah, Bh, bias, C1, S1, H1);
                        fam_run(what, CT_SGEMM_ISA_AVX2, ta, tb, s, ab[a][0], ab[a][1], pad, A, B, Ah, Bh, bias, C2, S2, H2);
                        bool same = what == 5 ? !memcmp(H1, H2, (size_t)nC * 2) : !memcmp(C1, C2, (size_t)nC * 4);
                        if (what == 2) same = same && !memcmp(S1, S2, (size_t)s->M * 4);
                        CT_EXPECTF(same, "entry %d, %lldx%lldx%lld ta=%d tb=%d alpha=%g beta=%g pad=%d, %d threads: the families differ", what,
                                   (long long)s->M, (long long)s->N, (long long)s->K, ta, tb, ab[a][0], ab[a][1], pad, th);
                        checked++;
                    }
                }
                free(A); free(B); free(bias); free(C0); free(C1); free(C2); free(S0); free(S1); free(S2);
                free(Ah); free(Bh); free(H1); free(H2);
            }
    }
    CT_EXPECT(checked > 500);
    CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM_BF16", "auto"));
    ct_set_num_threads(ct_default_num_threads());
}

CT_TEST_MAIN()
