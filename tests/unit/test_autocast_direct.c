/* Ops that read bf16 tensors themselves give the bits autocast gives by running the f32 op on
 * f32 copies (autocast.c):
 *  - GELU on bf16 (elementwise.c): the output converted to bf16 as ct_convert does, the input
 *    gradient from the output gradient rounded to bf16 with NaN kept (autocast's round_to);
 *  - add of a bf16 and an f32 tensor (basic.c, either order): the f32 sum and both gradients;
 *  - merge_heads of a bf16 tensor (attention.c): the bf16 output (signalling NaNs quieted, as
 *    the conversion does) and the input gradient from the rounded output gradient.
 * 1 and 2 threads, sizes past the threading thresholds, special values (NaN of both signs,
 * infinities, signed zeros, rounding ties). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "ct_test.h"
#include "ctrain/autograd.h"
#include "ctrain/ops.h"

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

CT_TEST(gelu_bf16_bits_of_f32_copy) {
    for (int t = 1; t <= 2; t++) {
        check_gelu(false, t);
        check_gelu(true, t);
    }
}

CT_TEST_MAIN()
