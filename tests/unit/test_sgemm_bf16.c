/* The bf16 GEMM (ct_sgemm_bf16): operands rounded to bf16 to nearest even, products exact,
 * f32 sums. Exact where every partial sum is representable (small integers, halfway
 * values that must round to even); within f32 summation error of a double reference on
 * bf16-rounded operands elsewhere, for every transpose, odd K (the pair padding), edges of
 * the 14 x 32 tile and of AMX's 16 x 16 tiles and 32-k chunks, blocks past the AMX cache
 * blocking (M > 256, N > 2048, K > 256), alpha/beta; the same bits with 1 and 2 threads.
 * Each test runs every path the CPU has (rounded, AVX-512 BF16, AMX); CTRAIN_GEMM_BF16
 * chooses among them with a fallback where the CPU lacks one. */
#include <omp.h>
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/config.h"
#include "ctrain/tensor.h"
#include "ops/cpu/sgemm.h"

static const ct_gemm_bf16_path paths[] = {CT_GEMM_BF16_ROUNDED, CT_GEMM_BF16_NATIVE, CT_GEMM_BF16_AMX};
static const char *const path_names[] = {"", "rounded", "native (AVX-512 BF16)", "AMX"};
static ct_gemm_bf16_path path_ = CT_GEMM_BF16_ROUNDED; /* the path check() runs */
#define FOR_EACH_PATH(p)                                                                              \
    for (size_t p##i_ = 0; p##i_ < 3; p##i_++)                                                         \
        if (!ct_sgemm_bf16_path_available(paths[p##i_])) printf("  %s: not on this CPU\n", path_names[paths[p##i_]]); \
        else for (ct_gemm_bf16_path p = path_ = paths[p##i_]; p; p = 0)

static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static void fill(float *p, int64_t n, uint64_t s, bool ints) {
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = ints ? (float)((int)(s % 17) - 8) : (float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
}

/* C = alpha op(A) op(B) + beta C0 in double on rounded operands; bound = sum |a b| */
static void reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B, float beta,
                      const float *C0, double *ref, double *bound) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, b = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = bf16_round(ta ? A[k * M + i] : A[i * K + k]), c = bf16_round(tb ? B[j * K + k] : B[k * N + j]);
                s += a * c;
                b += fabs(a * c);
            }
            ref[i * N + j] = alpha * s + (beta != 0 ? beta * C0[i * N + j] : 0);
            bound[i * N + j] = fabs(alpha) * b + fabs(beta * C0[i * N + j]);
        }
}

static double check(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta, bool ints, int threads) {
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N)), *C0 = malloc(sizeof(float) * (size_t)(M * N));
    double *ref = malloc(sizeof(double) * (size_t)(M * N)), *bound = malloc(sizeof(double) * (size_t)(M * N));
    fill(A, M * K, 1 + (uint64_t)M, ints);
    fill(B, K * N, 2 + (uint64_t)N, ints);
    fill(C0, M * N, 3, ints);
    memcpy(C, C0, sizeof(float) * (size_t)(M * N));
    omp_set_num_threads(threads);
    ct_sgemm_bf16_on(path_, ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N);
    reference(ta, tb, M, N, K, alpha, A, B, beta, C0, ref, bound);
    double worst = 0; /* error in units of the f32 summation bound K eps sum|ab| */
    for (int64_t i = 0; i < M * N; i++) {
        double e = fabs(C[i] - ref[i]), lim = (double)(K + 2) * 0x1p-24 * bound[i] + 1e-30;
        if (ints && e != 0) worst = INFINITY;
        if (!ints && e / lim > worst) worst = e / lim;
    }
    free(A), free(B), free(C), free(C0), free(ref), free(bound);
    return worst;
}

CT_TEST(bf16_gemm_exact_on_small_integers) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) CT_SKIP("neither GEMM family of ctrain runs here (no AVX2 and FMA, or CTRAIN_CPU_CAPABILITY=none)");
    CT_ASSERT(ct_kernels_reserve(2) == CT_OK); /* the packing buffers a context would reserve */
    printf("  AVX-512 BF16 on this CPU: %s\n", ct_sgemm_bf16_native() ? "yes" : "no");
    FOR_EACH_PATH(p) {
        for (int t = 0; t < 4; t++) CT_EXPECTF(check(t & 1, t & 2, 37, 45, 255, 1.0f, 0.0f, true, 2) == 0, "%s", path_names[p]);
        CT_EXPECTF(check(false, false, 14, 32, 1, 1.0f, 1.0f, true, 1) == 0, "%s", path_names[p]);
        CT_EXPECTF(check(false, true, 1, 1, 3, 1.0f, 0.0f, true, 1) == 0, "%s", path_names[p]);
        CT_EXPECTF(check(true, false, 33, 17, 64, 1.0f, 1.0f, true, 1) == 0, "%s", path_names[p]);
        /* halfway cases round to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6 */
        float a[2] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f}, b[2] = {1.0f, 1.0f}, c = 0;
        ct_sgemm_bf16_on(p, false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1);
        CT_EXPECTF(c == 2.0f + 0x1p-6f, "%s: %.9g", path_names[p], c);
    }
}

CT_TEST(bf16_gemm_within_f32_summation_error) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) CT_SKIP("neither GEMM family of ctrain runs here (no AVX2 and FMA, or CTRAIN_CPU_CAPABILITY=none)");
    CT_ASSERT(ct_kernels_reserve(2) == CT_OK); /* the packing buffers a context would reserve */
    const int64_t sizes[][3] = {{1, 1, 1}, {13, 31, 17}, {14, 32, 256}, {15, 33, 257}, {100, 70, 513}, {200, 300, 129},
                                {17, 15, 31}, {33, 47, 33}, {31, 16, 95}};
    FOR_EACH_PATH(p) {
        double worst = 0;
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (int t = 0; t < 4; t++) {
                float beta = t == 3 ? 0.5f : t == 2 ? 1.0f : 0.0f;
                double e = check(t & 1, t & 2, sizes[s][0], sizes[s][1], sizes[s][2], 0.75f, beta, false, 2);
                if (e > worst) worst = e;
            }
        /* past the AMX blocking in M, N and K at once */
        double e = check(true, false, 260, 2100, 300, 1.0f, 1.0f, false, 2);
        if (e > worst) worst = e;
        printf("  %s: worst error %.3f of the f32 summation bound\n", path_names[p], worst);
        CT_EXPECTF(worst <= 1.0, "%s: %.3f", path_names[p], worst);
    }
}

CT_TEST(bf16_gemm_same_bits_any_thread_count) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) CT_SKIP("neither GEMM family of ctrain runs here (no AVX2 and FMA, or CTRAIN_CPU_CAPABILITY=none)");
    CT_ASSERT(ct_kernels_reserve(2) == CT_OK); /* the packing buffers a context would reserve */
    /* M > N: threads take row ranges; N > M: column ranges; K past one AMX block */
    const int64_t shapes[][3] = {{300, 200, 150}, {77, 1100, 600}};
    FOR_EACH_PATH(p)
    for (int s = 0; s < 2; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C1 = malloc(sizeof(float) * M * N),
              *C2 = malloc(sizeof(float) * M * N);
        fill(A, M * K, 5, false);
        fill(B, K * N, 6, false);
        for (int t = 1; t <= 2; t++) {
            omp_set_num_threads(t);
            float *C = t == 1 ? C1 : C2;
            fill(C, M * N, 7, false);
            ct_sgemm_bf16_on(p, false, true, M, N, K, 1.0f, A, K, B, K, 1.0f, C, N);
        }
        CT_EXPECTF(memcmp(C1, C2, sizeof(float) * M * N) == 0, "%s, %lld x %lld x %lld", path_names[p], (long long)M, (long long)N,
                   (long long)K);
        free(A), free(B), free(C1), free(C2);
    }
}

/* operands stored as bf16 (ct_sgemm_bf16_ex) give the bits of their f32 copies, for each
 * transpose and each mix of storage, odd K included */
CT_TEST(bf16_gemm_reads_bf16_storage) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) CT_SKIP("neither GEMM family of ctrain runs here (no AVX2 and FMA, or CTRAIN_CPU_CAPABILITY=none)");
    CT_ASSERT(ct_kernels_reserve(2) == CT_OK);
    /* odd K (pairs through f32), even K (bf16 pairs moved as 32-bit words), K past one block */
    const int64_t shapes[][3] = {{45, 70, 91}, {45, 70, 90}, {33, 40, 600}};
    for (int s = 0; s < 3; s++) {
    const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C1 = malloc(sizeof(float) * M * N),
          *C2 = malloc(sizeof(float) * M * N);
    uint16_t *Ah = malloc(2 * M * K), *Bh = malloc(2 * K * N);
    fill(A, M * K, 11, false);
    fill(B, K * N, 12, false);
    for (int64_t i = 0; i < M * K; i++) A[i] = bf16_round(A[i]);
    for (int64_t i = 0; i < K * N; i++) B[i] = bf16_round(B[i]);
    ct_convert(Ah, CT_BF16, A, CT_F32, (size_t)(M * K));
    ct_convert(Bh, CT_BF16, B, CT_F32, (size_t)(K * N));
    omp_set_num_threads(2);
    for (int t = 0; t < 4; t++)
        for (int h = 1; h < 4; h++) {
            bool ta = t & 1, tb = t & 2;
            int64_t lda = ta ? M : K, ldb = tb ? K : N;
            fill(C1, M * N, 13, false);
            memcpy(C2, C1, sizeof(float) * M * N);
            ct_sgemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C1, N);
            ct_sgemm_bf16_ex(ta, tb, M, N, K, 1.0f, h & 1 ? (const void *)Ah : A, h & 1, lda, h & 2 ? (const void *)Bh : B, h & 2, ldb, 1.0f,
                             C2, N);
            CT_EXPECTF(memcmp(C1, C2, sizeof(float) * M * N) == 0, "K %lld, ta %d tb %d, bf16 A %d B %d", (long long)K, ta, tb, h & 1,
                       h >> 1);
        }
    free(A), free(B), free(C1), free(C2), free(Ah), free(Bh);
    }
}

/* CTRAIN_GEMM_BF16 picks the path, read at each call; a path the CPU lacks falls back to
 * rounded, and ct_sgemm_bf16 gives that path's bits */
CT_TEST(bf16_gemm_path_from_environment) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) CT_SKIP("neither GEMM family of ctrain runs here (no AVX2 and FMA, or CTRAIN_CPU_CAPABILITY=none)");
    CT_ASSERT(ct_kernels_reserve(2) == CT_OK);
    const int64_t M = 40, N = 50, K = 70;
    float A[40 * 70], B[70 * 50], C[40 * 50], R[40 * 50];
    fill(A, M * K, 8, false);
    fill(B, K * N, 9, false);
    const char *const names[] = {"auto", "rounded", "native", "amx"};
    const ct_gemm_bf16_path want[] = {ct_sgemm_bf16_path_available(CT_GEMM_BF16_AMX) ? CT_GEMM_BF16_AMX
                                      : ct_sgemm_bf16_native_preferred() && ct_sgemm_bf16_path_available(CT_GEMM_BF16_NATIVE)
                                          ? CT_GEMM_BF16_NATIVE
                                          : CT_GEMM_BF16_ROUNDED,
                                      CT_GEMM_BF16_ROUNDED,
                                      ct_sgemm_bf16_path_available(CT_GEMM_BF16_NATIVE) ? CT_GEMM_BF16_NATIVE : CT_GEMM_BF16_ROUNDED,
                                      ct_sgemm_bf16_path_available(CT_GEMM_BF16_AMX) ? CT_GEMM_BF16_AMX : CT_GEMM_BF16_ROUNDED};
    for (int i = 0; i < 4; i++) {
        CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM_BF16", names[i]));
        CT_EXPECTF(ct_sgemm_bf16_path() == want[i], "CTRAIN_GEMM_BF16=%s: path %d, expected %d", names[i], (int)ct_sgemm_bf16_path(),
                   (int)want[i]);
        ct_sgemm_bf16(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
        ct_sgemm_bf16_on(want[i], false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, R, N);
        CT_EXPECTF(memcmp(C, R, sizeof C) == 0, "CTRAIN_GEMM_BF16=%s: not the bits of %s", names[i], path_names[want[i]]);
    }
    CT_EXPECT_OK(ct_config_unset("CTRAIN_GEMM_BF16"));
}

CT_TEST_MAIN()
