/* Ops that read bf16 tensors themselves give the bits autocast gives by running the f32 op on
 * f32 copies (autocast.c):
 *  - GELU on bf16 (elementwise.c): the output converted to bf16 as ct_convert does, the input
 *    gradient from the output gradient rounded to bf16 with NaN kept (autocast's round_to);
 *  - add of a bf16 and an f32 tensor (basic.c, either order): the f32 sum and both gradients;
 *  - merge_heads of a bf16 tensor (attention.c): the bf16 output (signalling NaNs quieted, as
 *    the conversion does) and the input gradient from the rounded output gradient;
 *  - linear under bf16 autocast (gemm.c, ct_sgemm_bf16_out): the bf16 output its GEMM rounds
 *    as it stores, against the f32 GEMM result then ct_convert (K in one and several K blocks,
 *    odd sizes, bias or none, every bf16 GEMM path the CPU has), and the gradients.
 * 1 and 2 threads, sizes past the threading thresholds, special values (NaN of both signs,
 * infinities, signed zeros, rounding ties). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "ct_test.h"
#include "ctrain/autograd.h"
#include "ctrain/config.h"
#include "ctrain/ops.h"
#include "ops/cpu/sgemm.h"

#define N 70001 /* past add's threading threshold (2^16) too */

static uint32_t lcg(uint32_t *s) { return *s = *s * 1664525u + 1013904223u; }

/* random f32 bit patterns from a few exponent ranges, plus the special values */
static float value(uint32_t *s, int64_t i) {
    static const uint32_t special[] = {0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
                                       0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00000001u, 0xc1200000u, 0x41a00000u};
    uint32_t u;
    if (i < (int64_t)(sizeof special / sizeof special[0])) {
        u = special[i];
    } else {
        float f = (float)(lcg(s) >> 8) / (float)(1u << 24) * 12.0f - 6.0f; /* [-6, 6) */
        memcpy(&u, &f, 4);
        u ^= lcg(s) & 0xffffu; /* low bits set: exercises the rounding */
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void check_gelu(bool tanh_approx, int threads) {
    omp_set_num_threads(threads);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    int64_t shape[] = {N};
    uint32_t s = 7;
    ct_tensor *xb = ct_new(ctx, CT_BF16, 1, shape), *xf = ct_new(ctx, CT_F32, 1, shape);
    ct_tensor *seed = ct_new(ctx, CT_F32, 1, shape), *seed_r = ct_new(ctx, CT_F32, 1, shape);
    uint16_t *XB = xb->data;
    float *XF = xf->data, *G = seed->data, *GR = seed_r->data;
    for (int64_t i = 0; i < N; i++) {
        XB[i] = ct_f32_to_bf16(value(&s, i));
        XF[i] = ct_bf16_to_f32(XB[i]);
        G[i] = value(&s, (i * 7) % N);
        GR[i] = isnan(G[i]) ? G[i] : ct_bf16_to_f32(ct_f32_to_bf16(G[i])); /* round_to: NaN as it is */
    }
    /* reference: the f32 op on the copy, its output converted, its gradient from the rounded one */
    ct_requires_grad(xf);
    ct_tensor *yf = ct_gelu(ctx, xf, tanh_approx);
    ct_backward_seed(ctx, yf, seed_r);
    uint16_t *want_y = malloc(N * sizeof *want_y);
    float *want_g = malloc(N * sizeof *want_g);
    CT_ASSERT(want_y && want_g);
    ct_convert(want_y, CT_BF16, yf->data, CT_F32, N);
    memcpy(want_g, xf->grad->data, N * sizeof *want_g);

    ct_requires_grad(xb);
    ct_tensor *yb = ct_gelu(ctx, xb, tanh_approx);
    CT_EXPECT(yb->dtype == CT_BF16);
    CT_EXPECTF(!memcmp(yb->data, want_y, N * sizeof *want_y), "gelu(tanh=%d, %d threads): bf16 output differs", tanh_approx, threads);
    ct_backward_seed(ctx, yb, seed);
    CT_ASSERT(xb->grad && xb->grad->dtype == CT_F32);
    CT_EXPECTF(!memcmp(xb->grad->data, want_g, N * sizeof *want_g), "gelu(tanh=%d, %d threads): input gradient differs", tanh_approx,
               threads);
    free(want_y);
    free(want_g);
    ct_ctx_free(ctx);
}

/* a + b with a (a_lp) or b bf16, the other f32, against the f32 add of the widened copy */
static void check_add(bool a_lp, int threads) {
    omp_set_num_threads(threads);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    int64_t shape[] = {7, N / 7};
    int64_t n = shape[0] * shape[1];
    uint32_t s = 11;
    ct_tensor *lp = ct_new(ctx, CT_BF16, 2, shape), *lpf = ct_new(ctx, CT_F32, 2, shape);
    ct_tensor *f = ct_new(ctx, CT_F32, 2, shape), *f2 = ct_new(ctx, CT_F32, 2, shape), *seed = ct_new(ctx, CT_F32, 2, shape);
    uint16_t *L = lp->data;
    float *LF = lpf->data, *F = f->data, *F2 = f2->data, *G = seed->data;
    for (int64_t i = 0; i < n; i++) {
        L[i] = ct_f32_to_bf16(value(&s, i));
        LF[i] = ct_bf16_to_f32(L[i]);
        /* a NaN of the other sign against each bf16 NaN, then special values here and there */
        F[i] = F2[i] = value(&s, i < 12 ? (i + 1) % 12 : (i * 5) % 13 == 0 ? (i / 13) % 12 : i + 12);
        G[i] = value(&s, i + 12);
    }
    ct_requires_grad(lpf);
    ct_requires_grad(f2);
    ct_tensor *want = a_lp ? ct_add(ctx, lpf, f2) : ct_add(ctx, f2, lpf);
    ct_backward_seed(ctx, want, seed);
    ct_requires_grad(lp);
    ct_requires_grad(f);
    ct_tensor *got = a_lp ? ct_add(ctx, lp, f) : ct_add(ctx, f, lp);
    CT_EXPECT(got->dtype == CT_F32);
    CT_EXPECTF(!memcmp(got->data, want->data, n * sizeof(float)), "add(bf16 %s, %d threads): sum differs", a_lp ? "a" : "b", threads);
    ct_backward_seed(ctx, got, seed);
    CT_ASSERT(lp->grad && f->grad);
    CT_EXPECTF(!memcmp(lp->grad->data, lpf->grad->data, n * sizeof(float)), "add: bf16 input's gradient differs");
    CT_EXPECTF(!memcmp(f->grad->data, f2->grad->data, n * sizeof(float)), "add: f32 input's gradient differs");
    ct_ctx_free(ctx);
}

CT_TEST(add_bf16_f32_bits_of_f32_copy) {
    for (int t = 1; t <= 2; t++) {
        check_add(true, t);
        check_add(false, t);
    }
}

/* merge_heads of bf16 x [B, H, T, D] against the f32 op on the widened copy */
static void check_merge_heads(int64_t D, int threads) {
    omp_set_num_threads(threads);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    int64_t shape[] = {2, 3, 70000 / (6 * D) + 1, D}, n = shape[0] * shape[1] * shape[2] * D;
    uint32_t s = 5;
    ct_tensor *xb = ct_new(ctx, CT_BF16, 4, shape), *xf = ct_new(ctx, CT_F32, 4, shape);
    ct_tensor *seed = ct_new(ctx, CT_F32, 3, (int64_t[]){2, shape[2], 3 * D}), *seed_r = ct_new(ctx, CT_F32, 3, seed->shape);
    uint16_t *XB = xb->data;
    float *XF = xf->data, *G = seed->data, *GR = seed_r->data;
    for (int64_t i = 0; i < n; i++) {
        XB[i] = i == 12 ? 0x7f81u : i == 13 ? 0xff81u : ct_f32_to_bf16(value(&s, i)); /* signalling NaNs too */
        XF[i] = ct_bf16_to_f32(XB[i]);
        G[i] = value(&s, (i * 7) % n);
        GR[i] = isnan(G[i]) ? G[i] : ct_bf16_to_f32(ct_f32_to_bf16(G[i]));
    }
    ct_requires_grad(xf);
    ct_tensor *yf = ct_merge_heads(ctx, xf);
    ct_backward_seed(ctx, yf, seed_r);
    uint16_t *want_y = malloc(n * sizeof *want_y);
    CT_ASSERT(want_y);
    ct_convert(want_y, CT_BF16, yf->data, CT_F32, n);
    ct_requires_grad(xb);
    ct_tensor *yb = ct_merge_heads(ctx, xb);
    CT_EXPECT(yb->dtype == CT_BF16 && ct_same_shape(yb, yf));
    CT_EXPECTF(!memcmp(yb->data, want_y, n * sizeof *want_y), "merge_heads(D=%lld, %d threads): bf16 output differs", (long long)D,
               threads);
    ct_backward_seed(ctx, yb, seed);
    CT_ASSERT(xb->grad);
    CT_EXPECTF(!memcmp(xb->grad->data, xf->grad->data, n * sizeof(float)), "merge_heads(D=%lld, %d threads): input gradient differs",
               (long long)D, threads);
    free(want_y);
    ct_ctx_free(ctx);
}

CT_TEST(merge_heads_bf16_bits_of_f32_copy) {
    for (int t = 1; t <= 2; t++) {
        check_merge_heads(32, t);
        check_merge_heads(300, t); /* rows longer than the rounding buffer */
    }
}

/* linear of bf16 x [rows, in], w [out, in], b [out] (bf16 leaves) under bf16 autocast against
 * the two-step path: the bf16 GEMM's f32 result (bias broadcast first, beta = 1) converted by
 * ct_convert; gradients against the bf16 GEMMs on dY (rounded in their packers) and the sum
 * of the rounded dY */
static void check_linear(int64_t rows, int64_t in, int64_t out, bool bias, int threads) {
    omp_set_num_threads(threads);
    ct_ctx *ctx;
    CT_ASSERT(ct_ctx_create(NULL, &ctx) == CT_OK);
    uint32_t s = (uint32_t)(rows * 131 + in * 7 + out);
    ct_tensor *x = ct_new(ctx, CT_BF16, 2, (int64_t[]){rows, in}), *w = ct_new(ctx, CT_BF16, 2, (int64_t[]){out, in});
    ct_tensor *b = ct_new(ctx, CT_BF16, 1, (int64_t[]){out}), *seed = ct_new(ctx, CT_F32, 2, (int64_t[]){rows, out});
    uint16_t *X = x->data, *W = w->data, *B = b->data;
    float *G = seed->data;
    /* values in [-6, 6) with low bits set; a NaN and an infinity in x's last row */
    for (int64_t i = 0; i < rows * in; i++) X[i] = ct_f32_to_bf16(value(&s, 12 + i));
    X[(rows - 1) * in] = 0x7fc0u;
    X[(rows - 1) * in + 1] = 0xff80u;
    for (int64_t i = 0; i < out * in; i++) W[i] = ct_f32_to_bf16(value(&s, 12 + i) * 0.01f);
    for (int64_t i = 0; i < out; i++) B[i] = ct_f32_to_bf16(value(&s, 12 + i));
    for (int64_t i = 0; i < rows * out; i++) G[i] = value(&s, 12 + i);
    float *ref = malloc(sizeof(float) * (size_t)(rows * out)), *dx = malloc(sizeof(float) * (size_t)(rows * in));
    float *dw = malloc(sizeof(float) * (size_t)(out * in)), *db = calloc((size_t)out, sizeof(float));
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)(rows * out));
    CT_ASSERT(ref && dx && dw && db && want);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < out; j++) ref[r * out + j] = bias ? ct_bf16_to_f32(B[j]) : 0.0f;
    ct_sgemm_bf16_ex(false, true, rows, out, in, 1.0f, X, true, in, W, true, in, bias ? 1.0f : 0.0f, ref, out);
    ct_convert(want, CT_BF16, ref, CT_F32, (size_t)(rows * out));
    ct_sgemm_bf16_ex(false, false, rows, in, out, 1.0f, G, false, out, W, true, in, 0.0f, dx, in);
    ct_sgemm_bf16_ex(true, false, out, in, rows, 1.0f, G, false, out, X, true, in, 0.0f, dw, in);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < out; j++) db[j] += ct_bf16_to_f32(ct_f32_to_bf16(G[r * out + j]));

    ct_requires_grad(x);
    ct_requires_grad(w);
    ct_requires_grad(b);
    CT_ASSERT(ct_autocast_begin(ctx, CT_BF16) == CT_OK);
    ct_tensor *y = ct_linear(ctx, x, w, bias ? b : NULL);
    ct_autocast_end(ctx);
    CT_EXPECT(y->dtype == CT_BF16 && y->shape[0] == rows && y->shape[1] == out);
    CT_EXPECTF(!memcmp(y->data, want, sizeof(uint16_t) * (size_t)(rows * out)),
               "linear %lldx%lldx%lld bias=%d (%d threads): bf16 output differs", (long long)rows, (long long)in, (long long)out, bias,
               threads);
    ct_backward_seed(ctx, y, seed);
    CT_ASSERT(x->grad && w->grad);
    CT_EXPECTF(!memcmp(x->grad->data, dx, sizeof(float) * (size_t)(rows * in)), "linear: x gradient differs");
    CT_EXPECTF(!memcmp(w->grad->data, dw, sizeof(float) * (size_t)(out * in)), "linear: w gradient differs");
    if (bias) CT_EXPECTF(b->grad && !memcmp(b->grad->data, db, sizeof(float) * (size_t)out), "linear: b gradient differs");
    free(ref);
    free(dx);
    free(dw);
    free(db);
    free(want);
    ct_ctx_free(ctx);
}

CT_TEST(linear_bf16_output_bits_of_convert) {
    if (ct_sgemm_kernel_isa() == CT_SGEMM_ISA_NONE) CT_SKIP("neither AVX-512 nor AVX2 and FMA on this CPU: no direct bf16 linear");
    const char *const paths[] = {"rounded", "native", "amx"};
    /* K in one block (the bias row read for every row), in several (KC = 256; a last partial
     * one, one of a single k), odd M and N, past the threading thresholds (split by N, by M),
     * N past one 2048-column B block */
    const int64_t shapes[][3] = {{37, 200, 45}, {45, 600, 77}, {301, 520, 33}, {19, 1030, 301}, {3, 16, 5},
                                 {200, 256, 130}, {90, 250, 300}, {33, 257, 40}, {5, 300, 2100}};
    for (int p = 0; p < 3; p++) {
        CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM_BF16", paths[p]));
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int t = 1; t <= 2; t++)
                for (int bias = 0; bias <= 1; bias++) check_linear(shapes[i][0], shapes[i][1], shapes[i][2], bias, t);
    }
    CT_EXPECT_OK(ct_config_unset("CTRAIN_GEMM_BF16"));
}

CT_TEST(gelu_bf16_bits_of_f32_copy) {
    for (int t = 1; t <= 2; t++) {
        check_gelu(false, t);
        check_gelu(true, t);
    }
}

CT_TEST_MAIN()
