/* ct_flash_attention_qkv (attention on a packed qkv [B, T, 3C]) against the unfused chain
 * CausalSelfAttention ran before it: qkv viewed as [3, B, H, T, D] and made contiguous,
 * ct_flash_attention on its slices, ct_merge_heads. The same bits, forward and backward
 * (qkv's gradient, and through a linear the gradients upstream of it), for 1 and 2
 * threads, odd T, D = 5, 8, 24, 32 and 64, causal or not, with qkv's gradient fresh or already
 * holding a value, on the AVX-512 kernels and the BLAS path, under bf16 autocast and on a bf16
 * qkv (the fused op reads it itself where the chain runs on autocast's f32 copies) with
 * CTRAIN_GEMM_BF16=rounded: the f32 kernels. With AMX the bf16 run computes its tile products
 * in bf16 instead: checked against the f32 kernels and PyTorch's bf16 SDPA within bf16 tolerance. */
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/config.h"
#include "ctrain/ops.h"
#include "ctrain/io.h"
#include "case_fixture.h"
#include "gradcheck.h"
#include "ops/cpu/sgemm.h"
#include "kernel_check.h"

typedef struct { int64_t B, T, H, D; bool causal; } qshape;

static void fill(ct_tensor *t, uint64_t seed, float scale) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < ct_numel(t); i++) ct_f32(t)[i] = ct_gc_rand(&s) * scale;
}

/* the chain of ops the fused one replaces */
static ct_tensor *chain(ct_ctx *c, ct_tensor *qkv, const qshape *s) {
    const int64_t hs[4] = {s->B, s->H, s->T, s->D};
    ct_tensor *t = ct_reshape(c, qkv, 5, (int64_t[]){s->B, s->T, 3, s->H, s->D});
    t = ct_contiguous(c, ct_transpose(c, ct_transpose(c, ct_transpose(c, t, 1, 2), 2, 3), 0, 1));
    ct_tensor *in[3];
    for (int i = 0; i < 3; i++) in[i] = ct_reshape(c, ct_slice(c, t, 0, i, 1), 4, hs);
    return ct_merge_heads(c, ct_flash_attention(c, in[0], in[1], in[2], s->causal));
}

enum { LEAF, LINEAR, TWICE, AUTOCAST, AC_LEAF, AC_TWICE, BF16_LEAF };
static const char *mode_name[] = {"qkv leaf",      "after a linear",          "qkv used twice",
                                  "bf16 autocast", "bf16 autocast, f32 leaf", "bf16 autocast, qkv used twice",
                                  "bf16 qkv (a cast leaf), no autocast"};

/* y's bytes and the gradients (qkv's for a leaf, else x's, W's, b's), concatenated */
static unsigned char *run(const qshape *s, bool fused, int threads, int mode, size_t *len) {
    ct_set_num_threads(threads);
    ct_ctx *c;
    if (ct_ctx_create(NULL, &c) != CT_OK) return NULL;
    const int64_t C = s->H * s->D;
    ct_tensor *x = ct_new(c, CT_F32, 3, (int64_t[]){s->B, s->T, C}), *W = ct_new(c, CT_F32, 2, (int64_t[]){3 * C, C});
    ct_tensor *b = ct_new(c, CT_F32, 1, (int64_t[]){3 * C}), *qkv = ct_new(c, CT_F32, 3, (int64_t[]){s->B, s->T, 3 * C});
    fill(x, 1, 1.0f);
    fill(W, 2, 3.0f / sqrtf((float)C)); /* scores of a few units */
    fill(b, 3, 0.5f);
    fill(qkv, 4, 2.0f);
    ct_tensor *leaves[3] = {x, W, b}, *G = ct_new(c, CT_F32, 3, (int64_t[]){s->B, s->T, C});
    fill(G, 5, 1.0f);
    const bool leaf = mode == LEAF || mode == AC_LEAF || mode == BF16_LEAF, ac = mode >= AUTOCAST && mode <= AC_TWICE, twice = mode == TWICE || mode == AC_TWICE;
    int nl = leaf ? 1 : 3;
    if (leaf) leaves[0] = qkv;
    for (int i = 0; i < nl; i++) ct_requires_grad(leaves[i]);
    if (ac) CT_EXPECT_OK(ct_autocast_begin(c, CT_BF16));
    if (!leaf) qkv = ct_linear(c, x, W, b);
    if (mode == BF16_LEAF) qkv = ct_cast(c, qkv, CT_BF16);
    ct_tensor *y = fused ? ct_flash_attention_qkv(c, qkv, (int)s->H, s->causal) : chain(c, qkv, s);
    if (ac) ct_autocast_end(c);
    ct_tensor *loss = ct_sum(c, ct_mul(c, ct_cast(c, y, CT_F32), G));
    /* a later use of qkv: its gradient holds a value when the attention's backward comes */
    if (twice) loss = ct_add(c, loss, ct_sum(c, ct_mul(c, ct_cast(c, qkv, CT_F32), qkv)));
    ct_backward(c, loss);
    size_t n = ct_nbytes(y);
    for (int i = 0; i < nl; i++) n += ct_nbytes(leaves[i]->grad);
    unsigned char *out = malloc(n), *o = out;
    memcpy(o, y->data, ct_nbytes(y));
    o += ct_nbytes(y);
    for (int i = 0; i < nl; i++) {
        memcpy(o, leaves[i]->grad->data, ct_nbytes(leaves[i]->grad));
        o += ct_nbytes(leaves[i]->grad);
    }
    *len = n;
    ct_ctx_free(c);
    return out;
}

static void same_bits(const qshape *s, int threads, int mode) {
    size_t n1, n2;
    unsigned char *a = run(s, false, threads, mode, &n1), *f = run(s, true, threads, mode, &n2);
    CT_ASSERT(a && f);
    CT_EXPECTF(n1 == n2 && !memcmp(a, f, n1), "B%lld T%lld H%lld D%lld %s, %s, %d thread(s): fused differs from the chain",
               (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->D, s->causal ? "causal" : "full",
               mode_name[mode], threads);
    free(a);
    free(f);
}

static const qshape shapes[] = {
    {2, 67, 2, 32, true}, {2, 130, 3, 64, true}, {1, 130, 2, 32, false}, {3, 67, 2, 64, false}, {1, 1, 1, 32, true},
    {2, 67, 3, 24, true}, {1, 70, 5, 8, false}, {1, 33, 3, 5, true},
};

CT_TEST(qkv_same_bits_as_chain) {
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int t = 1; t <= 2; t++)
            for (int mode = LEAF; mode <= TWICE; mode++) same_bits(&shapes[i], t, mode);
}

/* Under bf16 autocast (or given a bf16 qkv) the fused op reads the bf16 qkv and writes a
 * bf16 y itself on the AVX-512 path (an f32 leaf: autocast's cast, then the same kernels with
 * an f32 y it converts); the chain's ct_flash_attention runs on autocast's f32 copies and converts its y,
 * and its backward rounds y's gradient and copies y and q, k, v to f32: the same bits. */
CT_TEST(qkv_same_bits_as_chain_bf16_autocast) {
    /* the f32 kernels on widened values (the path of CPUs without AMX); with AMX the fused op
     * computes its tile products in bf16 instead (qkv_bf16_amx_vs_f32 below) */
    CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM_BF16", "rounded"));
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int t = 1; t <= 2; t++)
            for (int mode = AUTOCAST; mode <= BF16_LEAF; mode++) same_bits(&shapes[i], t, mode);
    CT_EXPECT_OK(ct_config_unset("CTRAIN_GEMM_BF16"));
}
CT_TEST(qkv_same_bits_as_chain_bf16_autocast_blas_path) {
    CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM", "openblas"));
    for (size_t i = 0; i < 2; i++) same_bits(&shapes[i], 2, AUTOCAST);
    CT_EXPECT_OK(ct_config_unset("CTRAIN_GEMM"));
}

/* The path for CPUs without AVX-512 (BLAS tiles), taken with CTRAIN_GEMM=openblas */
CT_TEST(qkv_same_bits_as_chain_blas_path) {
    CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM", "openblas"));
    for (size_t i = 0; i < 4; i++) same_bits(&shapes[i], 2, i % 2 ? TWICE : LEAF);
    CT_EXPECT_OK(ct_config_unset("CTRAIN_GEMM"));
}

/* the same bits at 1 and 2 threads where the own GEMM runs (AVX-512: a thread takes whole
 * heads); within f32 rounding on OpenBLAS's tiles */
CT_TEST(qkv_same_bits_any_thread_count) {
    size_t n1, n2;
    unsigned char *a = run(&shapes[1], true, 1, LINEAR, &n1), *b = run(&shapes[1], true, 2, LINEAR, &n2);
    CT_ASSERT(a && b && n1 == n2);
    expect_threads_agree(a, b, n1, 1e-5, "flash_attention_qkv");
    free(a);
    free(b);
}

/* y (as f32) and qkv's gradient of the fused op on a qkv leaf holding bf16 values (bf16:
 * the op reads it cast to bf16), seeded with a bf16-valued G; out: [y | dqkv] */
static float *run_bf16(const qshape *s, bool bf16, int threads, size_t *n) {
    ct_set_num_threads(threads);
    ct_ctx *c;
    if (ct_ctx_create(NULL, &c) != CT_OK) return NULL;
    const int64_t C = s->H * s->D;
    ct_tensor *qkv = ct_new(c, CT_F32, 3, (int64_t[]){s->B, s->T, 3 * C}), *G = ct_new(c, CT_F32, 3, (int64_t[]){s->B, s->T, C});
    fill(qkv, 4, 2.0f);
    fill(G, 5, 1.0f);
    qkv = ct_cast(c, ct_cast(c, qkv, CT_BF16), CT_F32); /* both runs see the same bf16 values */
    G = ct_cast(c, ct_cast(c, G, CT_BF16), CT_F32);
    ct_requires_grad(qkv);
    ct_tensor *y = ct_flash_attention_qkv(c, bf16 ? ct_cast(c, qkv, CT_BF16) : qkv, (int)s->H, s->causal);
    ct_tensor *y32 = ct_cast(c, y, CT_F32);
    ct_backward(c, ct_sum(c, ct_mul(c, y32, G)));
    const int64_t ny = ct_numel(y32), ng = ct_numel(qkv);
    float *out = malloc((size_t)(ny + ng) * sizeof(float));
    memcpy(out, y32->data, (size_t)ny * sizeof(float));
    memcpy(out + ny, qkv->grad->data, (size_t)ng * sizeof(float));
    *n = (size_t)ny;
    ct_ctx_free(c);
    return out;
}

/* The bf16 run (AMX tile products where the CPU has them: bf16 operands, P and dS rounded to
 * bf16) against the f32 kernels on the same bf16 values: within bf16 rounding, forward and
 * backward; the same bits for 1 and 2 threads. */
#define TOL_Y 1e-2
#define TOL_G 2e-2
CT_TEST(qkv_bf16_amx_vs_f32) {
    const bool amx = ct_sgemm_bf16_path() == CT_GEMM_BF16_AMX;
    double wy = 0, wg = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const qshape *s = &shapes[i];
        size_t ny, n2;
        float *r = run_bf16(s, false, 2, &ny), *b1 = run_bf16(s, true, 1, &n2), *b2 = run_bf16(s, true, 2, &n2);
        CT_ASSERT(r && b1 && b2);
        const int64_t ng = s->B * s->T * 3 * s->H * s->D;
        double ey = normwise(b2, r, (int64_t)ny), eg = normwise(b2 + ny, r + ny, ng);
        wy = ey > wy ? ey : wy;
        wg = eg > wg ? eg : wg;
        CT_EXPECTF(ey <= TOL_Y && eg <= TOL_G, "B%lld T%lld H%lld D%lld %s: bf16 vs f32 y %.2e, dqkv %.2e", (long long)s->B,
                   (long long)s->T, (long long)s->H, (long long)s->D, s->causal ? "causal" : "full", ey, eg);
        /* y is rounded to bf16, so where OpenBLAS's threads change an f32 sum some of its last
         * bits flip (2^-8 relative): a bf16 ulp's bound (measured 1.1e-4 to 3.4e-4 on Zen 3) */
        char what[32];
        snprintf(what, sizeof what, "bf16 shape %zu", i);
        expect_threads_agree(b1, b2, (ny + (size_t)ng) * sizeof(float), 1e-3, what);
        free(r);
        free(b1);
        free(b2);
    }
    printf("  bf16 (%s) vs f32: worst normwise y %.2e, dqkv %.2e\n", amx ? "AMX" : "f32 kernels", wy, wg);
}

/* Under bf16 autocast (qkv from a linear, an f32 leaf autocast casts, qkv used twice) with the
 * AMX path: fused vs the chain (f32 kernels on autocast's copies) within bf16 tolerance; y is
 * bf16 in both, the gradients f32. */
CT_TEST(qkv_bf16_autocast_amx_vs_chain) {
    for (size_t i = 0; i < 4; i++)
        for (int mode = AUTOCAST; mode <= AC_TWICE; mode++) {
            const qshape *s = &shapes[i];
            size_t n1, n2;
            unsigned char *a = run(s, false, 2, mode, &n1), *f = run(s, true, 2, mode, &n2);
            CT_ASSERT(a && f && n1 == n2);
            const int64_t ny = s->B * s->T * s->H * s->D, ng = (int64_t)(n1 - 2 * (size_t)ny) / 4;
            float *y[2] = {malloc((size_t)ny * sizeof(float)), malloc((size_t)ny * sizeof(float))};
            for (int64_t k = 0; k < ny; k++) /* bf16 -> f32: the high half */
                for (int v = 0; v < 2; v++) {
                    uint16_t h;
                    memcpy(&h, (v ? f : a) + 2 * k, 2);
                    uint32_t u = (uint32_t)h << 16;
                    memcpy(&y[v][k], &u, 4);
                }
            float *ga = malloc((size_t)ng * sizeof(float)), *gf = malloc((size_t)ng * sizeof(float));
            memcpy(ga, a + 2 * ny, (size_t)ng * sizeof(float));
            memcpy(gf, f + 2 * ny, (size_t)ng * sizeof(float));
            double ey = normwise(y[1], y[0], ny), eg = normwise(gf, ga, ng);
            CT_EXPECTF(ey <= TOL_Y && eg <= TOL_G, "shape %zu %s: fused vs chain y %.2e, grads %.2e", i, mode_name[mode], ey, eg);
            free(y[0]), free(y[1]), free(ga), free(gf), free(a), free(f);
        }
}

/* ct_flash_attention_qkv on a bf16 qkv against F.scaled_dot_product_attention on bf16 q, k, v
 * (PyTorch's CPU flash attention; fixtures from tests/torch/gen_sdpa_bf16.py), and both
 * against the f64 result; PyTorch's gradient is bf16, ours f32 (one more rounding apart) */
CT_TEST(qkv_bf16_vs_torch_sdpa_bf16) {
    ct_st_file *f = NULL;
    CT_ASSERT(ct_st_open("tests/fixtures/ops/sdpa_qkv_bf16.safetensors", &f) == CT_OK);
    for (int cs = 0;; cs++) {
        char key[32];
        snprintf(key, sizeof key, "%d.shape", cs);
        ct_st_tensor sh;
        if (ct_st_get(f, key, &sh) != CT_OK) { CT_EXPECT(cs >= 3); break; }
        const int64_t *d = sh.data; /* B, T, H, D, causal */
        ct_ctx *c;
        CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
        ct_tensor *qkv = case_tensor(c, f, cs, "qkv");
        ct_requires_grad(qkv);
        ct_tensor *y = ct_cast(c, ct_flash_attention_qkv(c, ct_cast(c, qkv, CT_BF16), (int)d[2], d[4] != 0), CT_F32);
        ct_backward(c, ct_sum(c, ct_mul(c, y, case_tensor(c, f, cs, "g"))));
        const char *ref[2] = {"y", "dqkv"};
        const ct_tensor *got[2] = {y, qkv->grad};
        for (int p = 0; p < 2; p++) {
            char n64[16];
            snprintf(n64, sizeof n64, "%s64", ref[p]);
            const ct_tensor *t = case_tensor(c, f, cs, ref[p]), *x = case_tensor(c, f, cs, n64);
            CT_ASSERT(got[p] && ct_numel(got[p]) == ct_numel(t));
            double e = normwise(got[p]->data, t->data, ct_numel(t)), ours = normwise(got[p]->data, x->data, ct_numel(t));
            double theirs = normwise(t->data, x->data, ct_numel(t)), tol = p ? TOL_G : TOL_Y;
            printf("  case %d %-4s vs torch bf16 %.2e; vs f64: ours %.2e, torch's %.2e\n", cs, ref[p], e, ours, theirs);
            CT_EXPECTF(e <= tol, "case %d %s vs torch bf16 SDPA: %.2e > %.0e", cs, ref[p], e, tol);
        }
        ct_ctx_free(c);
    }
    ct_st_close(f);
}

static ct_tensor *f_qkv(ct_ctx *c, ct_tensor **in, void *arg) { return ct_flash_attention_qkv(c, in[0], 2, *(bool *)arg); }
CT_TEST(qkv_gradcheck) {
    for (int causal = 0; causal < 2; causal++) {
        bool cz = causal;
        double e = ct_gradcheck(f_qkv, &cz, 1, (ct_tensor_spec[]){{3, {2, 5, 24}}}, false);
        CT_EXPECTF(e < 1e-2, "%s: gradcheck error %g", causal ? "causal" : "full", e);
    }
}

CT_TEST_MAIN()
