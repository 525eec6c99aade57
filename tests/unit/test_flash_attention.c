/* Fused (flash) attention against the plain version, which is checked against PyTorch in
 * test_ops_torch: forward and every gradient within 1e-5 (normwise) on shapes around the
 * tile sizes (64 query rows x 128 keys), causal and not, Tq != Tk, Dv != D; against
 * PyTorch's F.scaled_dot_product_attention itself (fixtures from tests/torch/gen_sdpa.py);
 * the same bits with 1 and 2 threads; and the memory it promises: no [T, T] matrix.
 * Grouped-query attention (k, v of fewer heads than q): against SDPA with enable_gqa
 * (tests/torch/gen_sdpa_gqa.py) and against the same op on repeat_kv's copies. */
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/io.h"
#include "ctrain/ops.h"
#include "case_fixture.h"
#include "ops/cpu/sgemm.h" /* ct_sgemm_set_isa_: the AVX2 family on an AVX-512 CPU */

static void fill(ct_tensor *t, uint64_t seed, float scale) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    float *p = t->data;
    for (int64_t i = 0; i < ct_numel(t); i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        p[i] = ((float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f) * scale;
    }
}

typedef struct { int64_t B, H, Tq, Tk, D, Dv; bool causal; } shape;

/* y and the three input gradients, concatenated (malloc'ed); peak arena bytes in *peak */
static float *run(const shape *s, bool flash, int threads, int64_t *len, size_t *peak) {
    ct_set_num_threads(threads);
    ct_ctx *c;
    if (ct_ctx_create(NULL, &c) != CT_OK) return NULL;
    ct_tensor *q = ct_new(c, CT_F32, 4, (int64_t[]){s->B, s->H, s->Tq, s->D});
    ct_tensor *k = ct_new(c, CT_F32, 4, (int64_t[]){s->B, s->H, s->Tk, s->D});
    ct_tensor *v = ct_new(c, CT_F32, 4, (int64_t[]){s->B, s->H, s->Tk, s->Dv});
    fill(q, 1, 2.0f); /* scores of a few units: a softmax that is neither flat nor one-hot */
    fill(k, 2, 2.0f);
    fill(v, 3, 1.0f);
    ct_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
    size_t before = ct_ctx_used_bytes(c);
    ct_tensor *y = flash ? ct_flash_attention(c, q, k, v, s->causal) : ct_attention(c, q, k, v, s->causal);
    ct_tensor *g = ct_new_like(c, y);
    fill(g, 4, 1.0f);
    *peak = ct_ctx_used_bytes(c) - before;
    ct_backward_seed(c, y, g);
    int64_t n = ct_numel(y) + ct_numel(q) + ct_numel(k) + ct_numel(v);
    float *out = malloc((size_t)n * sizeof(float)), *o = out;
    memcpy(o, y->data, ct_nbytes(y));
    o += ct_numel(y);
    for (int i = 0; i < 3; i++) {
        memcpy(o, in[i]->grad->data, ct_nbytes(in[i]));
        o += ct_numel(in[i]);
    }
    *len = n;
    ct_ctx_free(c);
    return out;
}

/* max |a - b| / max |b| over each of the 4 parts */
static double normwise(const float *a, const float *b, const shape *s) {
    int64_t part[4] = {s->B * s->H * s->Tq * s->Dv, s->B * s->H * s->Tq * s->D, s->B * s->H * s->Tk * s->D,
                       s->B * s->H * s->Tk * s->Dv};
    double worst = 0;
    for (int p = 0, off = 0; p < 4; off += (int)part[p++]) {
        double d = 0, m = 0;
        for (int64_t i = 0; i < part[p]; i++) {
            double e = fabs((double)a[off + i] - b[off + i]);
            d = e > d || e != e ? e : d;
            m = fabs(b[off + i]) > m ? fabs(b[off + i]) : m;
        }
        if (m > 0 && d / m > worst) worst = d / m;
    }
    return worst;
}

/* shapes around the tiles: every tile edge, masked lanes, D and Dv not multiples of 8 or 16 */
static const shape shapes[] = {
    {1, 1, 1, 1, 8, 8, true},      {2, 3, 7, 7, 8, 8, true},      {1, 2, 64, 64, 32, 32, true},
    {1, 2, 65, 65, 32, 16, true},  {2, 2, 130, 130, 16, 16, true}, {1, 1, 300, 300, 64, 64, true},
    {2, 1, 37, 200, 24, 40, false}, {1, 2, 129, 129, 32, 32, false}, {1, 1, 200, 70, 8, 8, false},
};

CT_TEST(flash_equals_plain) {
    double worst = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        int64_t n1, n2;
        size_t p1, p2;
        float *plain = run(s, false, 2, &n1, &p1), *flash = run(s, true, 2, &n2, &p2);
        CT_ASSERT(plain && flash && n1 == n2);
        double e = normwise(flash, plain, s);
        if (e > worst) worst = e;
        if (!(e <= 1e-5))
            CT_FAILF("B%lld H%lld Tq%lld Tk%lld D%lld Dv%lld %s: flash vs plain %.3g", (long long)s->B, (long long)s->H,
                     (long long)s->Tq, (long long)s->Tk, (long long)s->D, (long long)s->Dv, s->causal ? "causal" : "full", e);
        free(plain);
        free(flash);
    }
    printf("  worst normwise difference to the plain version: %.2e\n", worst);
}

CT_TEST(flash_same_bits_any_thread_count) {
    const shape s = {2, 3, 150, 150, 32, 32, true};
    int64_t n1, n2;
    size_t p;
    float *a = run(&s, true, 1, &n1, &p), *b = run(&s, true, 2, &n2, &p);
    CT_ASSERT(a && b && n1 == n2);
    CT_EXPECT(memcmp(a, b, (size_t)n1 * sizeof(float)) == 0);
    free(a);
    free(b);
}

/* The kernels of CPUs without AVX-512 (flash_avx2.c, taken with the AVX2 GEMM family) compute
 * the AVX-512 kernels' bits: forward and every gradient, memcmp, on the shapes above. */
CT_TEST(flash_avx2_kernels_bits_of_avx512) {
    if (ct_sgemm_kernel_isa() != CT_SGEMM_ISA_AVX512) CT_SKIP("no AVX-512 here (the CPU, or CTRAIN_CPU_CAPABILITY)");
    int64_t differ = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int64_t n1, n2;
        size_t p;
        float *a = run(&shapes[i], true, 2, &n1, &p);
        ct_sgemm_set_isa_(CT_SGEMM_ISA_AVX2);
        float *b = run(&shapes[i], true, 2, &n2, &p);
        ct_sgemm_set_isa_(CT_SGEMM_ISA_NONE);
        CT_ASSERT(a && b && n1 == n2);
        for (int64_t j = 0; j < n1; j++) differ += memcmp(&a[j], &b[j], sizeof(float)) != 0;
        free(a);
        free(b);
    }
    CT_EXPECTF(differ == 0, "%lld values of the AVX2 kernels differ from the AVX-512 kernels'", (long long)differ);
}

/* What forward keeps for backward: plain holds P [B, H, T, T]; flash one float per row. */
CT_TEST(flash_memory_is_linear_in_T) {
    const shape s = {1, 2, 1024, 1024, 32, 32, true};
    int64_t n;
    size_t plain, flash;
    float *a = run(&s, false, 2, &n, &plain), *b = run(&s, true, 2, &n, &flash);
    CT_ASSERT(a && b);
    size_t out = (size_t)(s.B * s.H * s.Tq * s.Dv) * sizeof(float) * 2; /* y and its seed gradient */
    printf("  T = 1024: forward keeps %.2f MB (plain) vs %.2f MB (flash), outputs %.2f MB\n", (plain - out) / 1048576.0,
           (flash - out) / 1048576.0, out / 1048576.0);
    CT_EXPECT(plain - out >= (size_t)(s.B * s.H * s.Tq * s.Tk) * sizeof(float));
    CT_EXPECT(flash - out <= (size_t)(s.B * s.H * s.Tq) * sizeof(float) + (4u << 20)); /* lse + per-thread tiles */
    free(a);
    free(b);
}

/* worst normwise difference of the case's y, dq, dk, dv to the fixture's (fails past tol) */
static double vs_fixture(ct_ctx *c, ct_st_file *f, int cs, ct_tensor *y, ct_tensor *const in[3], double tol, const char *what) {
    const char *ref[4] = {"y", "dq", "dk", "dv"};
    const ct_tensor *got[4] = {y, in[0]->grad, in[1]->grad, in[2]->grad};
    double worst = 0;
    for (int p = 0; p < 4; p++) {
        const ct_tensor *r = case_tensor(c, f, cs, ref[p]);
        if (!got[p] || ct_numel(got[p]) != ct_numel(r)) {
            CT_FAILF("case %d %s %s: missing or of another size", cs, what, ref[p]);
            return INFINITY;
        }
        const float *a = got[p]->data, *b = r->data;
        double d = 0, m = 0;
        for (int64_t i = 0; i < ct_numel(r); i++) {
            double e = fabs((double)a[i] - b[i]);
            d = e > d || e != e ? e : d;
            m = fabs(b[i]) > m ? fabs(b[i]) : m;
        }
        double e = d / m;
        if (e > worst) worst = e;
        if (!(e <= tol)) CT_FAILF("case %d %s %s vs SDPA: %.3g", cs, what, ref[p], e);
    }
    return worst;
}

/* ct_flash_attention (and the plain version) vs F.scaled_dot_product_attention, forward and
 * backward, both with ctrain's default thread count */
CT_TEST(flash_matches_torch_sdpa) {
    ct_st_file *f = NULL;
    CT_ASSERT(ct_st_open("tests/fixtures/ops/sdpa.safetensors", &f) == CT_OK);
    double worst[2] = {0, 0};
    for (int cs = 0;; cs++) {
        char key[32];
        snprintf(key, sizeof key, "%d.shape", cs);
        ct_st_tensor sh;
        if (ct_st_get(f, key, &sh) != CT_OK) { CT_EXPECT(cs >= 4); break; }
        bool causal = ((const int64_t *)sh.data)[6] != 0;
        for (int flash = 0; flash < 2; flash++) {
            ct_ctx *c;
            CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
            ct_tensor *in[3] = {case_tensor(c, f, cs, "q"), case_tensor(c, f, cs, "k"), case_tensor(c, f, cs, "v")};
            for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
            ct_tensor *y = flash ? ct_flash_attention(c, in[0], in[1], in[2], causal) : ct_attention(c, in[0], in[1], in[2], causal);
            ct_backward_seed(c, y, case_tensor(c, f, cs, "g"));
            double e = vs_fixture(c, f, cs, y, in, 1e-5, flash ? "flash" : "plain");
            if (e > worst[flash]) worst[flash] = e;
            ct_ctx_free(c);
        }
    }
    printf("  worst normwise difference to F.scaled_dot_product_attention: flash %.2e, plain %.2e\n", worst[1], worst[0]);
    ct_st_close(f);
}

/* grouped-query: k, v [B, KV, T, d] read by H / KV query heads each, vs SDPA(enable_gqa=True);
 * the same bits with 1 and 2 threads */
CT_TEST(flash_gqa_matches_torch_sdpa) {
    ct_st_file *f = NULL;
    CT_ASSERT(ct_st_open("tests/fixtures/ops/sdpa_gqa.safetensors", &f) == CT_OK);
    double worst = 0;
    int cases = 0;
    for (int cs = 0;; cs++, cases++) {
        char key[32];
        snprintf(key, sizeof key, "%d.shape", cs);
        ct_st_tensor sh;
        if (ct_st_get(f, key, &sh) != CT_OK) break;
        const int64_t *d = sh.data;
        bool causal = d[7] != 0;
        float *first = NULL;
        for (int threads = 1; threads <= 2; threads++) {
            ct_set_num_threads(threads);
            ct_ctx *c;
            CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
            ct_tensor *in[3] = {case_tensor(c, f, cs, "q"), case_tensor(c, f, cs, "k"), case_tensor(c, f, cs, "v")};
            CT_ASSERT(in[0]->shape[1] == d[1] && in[1]->shape[1] == d[2] && d[2] < d[1]);
            for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
            ct_tensor *y = ct_flash_attention(c, in[0], in[1], in[2], causal);
            ct_backward_seed(c, y, case_tensor(c, f, cs, "g"));
            double e = vs_fixture(c, f, cs, y, in, 1e-5, "flash gqa");
            if (e > worst) worst = e;
            size_t n[4] = {ct_nbytes(y), ct_nbytes(in[0]), ct_nbytes(in[1]), ct_nbytes(in[2])};
            const void *part[4] = {y->data, in[0]->grad->data, in[1]->grad->data, in[2]->grad->data};
            if (threads == 1) first = malloc(n[0] + n[1] + n[2] + n[3]);
            CT_ASSERT(first);
            for (int p = 0, off = 0; p < 4; off += (int)n[p++]) {
                if (threads == 1) memcpy((char *)first + off, part[p], n[p]);
                else if (memcmp((char *)first + off, part[p], n[p]) != 0) CT_FAILF("case %d part %d: 1 and 2 threads differ", cs, p);
            }
            ct_ctx_free(c);
        }
        free(first);
    }
    CT_EXPECT(cases >= 3);
    printf("  %d grouped-query cases, worst normwise difference to SDPA(enable_gqa): %.2e\n", cases, worst);
    ct_st_close(f);
}

/* The grouped kernel vs the same op on repeat_kv's copies: y and dq the same bits (the same
 * tile products on the same values), dk and dv the group's sums in another order. */
CT_TEST(flash_gqa_equals_repeat_kv) {
    const shape s = {2, 8, 200, 200, 32, 32, true};
    const int KV = 2;
    const int64_t n[4] = {s.B * s.H * s.Tq * s.Dv, s.B * s.H * s.Tq * s.D, s.B * KV * s.Tk * s.D, s.B * KV * s.Tk * s.Dv};
    float *res[2][4]; /* y, dq, dk, dv of each way */
    for (int rep = 0; rep < 2; rep++) {
        ct_ctx *c;
        CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
        ct_tensor *q = ct_new(c, CT_F32, 4, (int64_t[]){s.B, s.H, s.Tq, s.D});
        ct_tensor *k = ct_new(c, CT_F32, 4, (int64_t[]){s.B, KV, s.Tk, s.D});
        ct_tensor *v = ct_new(c, CT_F32, 4, (int64_t[]){s.B, KV, s.Tk, s.Dv});
        fill(q, 1, 2.0f);
        fill(k, 2, 2.0f);
        fill(v, 3, 1.0f);
        ct_tensor *in[3] = {q, k, v};
        for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
        ct_tensor *kk = rep ? ct_repeat_kv(c, k, (int)s.H / KV) : k, *vv = rep ? ct_repeat_kv(c, v, (int)s.H / KV) : v;
        ct_tensor *y = ct_flash_attention(c, q, kk, vv, s.causal), *g = ct_new_like(c, y);
        fill(g, 4, 1.0f);
        ct_backward_seed(c, y, g);
        const ct_tensor *got[4] = {y, q->grad, k->grad, v->grad};
        for (int p = 0; p < 4; p++) {
            CT_ASSERT(got[p] && ct_numel(got[p]) == n[p]);
            res[rep][p] = malloc((size_t)n[p] * sizeof(float));
            CT_ASSERT(res[rep][p]);
            memcpy(res[rep][p], got[p]->data, (size_t)n[p] * sizeof(float));
        }
        ct_ctx_free(c);
    }
    CT_EXPECT(memcmp(res[0][0], res[1][0], (size_t)n[0] * sizeof(float)) == 0);
    CT_EXPECT(memcmp(res[0][1], res[1][1], (size_t)n[1] * sizeof(float)) == 0);
    for (int p = 2; p < 4; p++) {
        double d = 0, m = 0;
        for (int64_t j = 0; j < n[p]; j++) {
            double e = fabs((double)res[0][p][j] - res[1][p][j]);
            d = e > d || e != e ? e : d;
            m = fabs(res[1][p][j]) > m ? fabs(res[1][p][j]) : m;
        }
        printf("  d%c: normwise difference to repeat_kv's %.2e\n", p == 2 ? 'k' : 'v', d / m);
        CT_EXPECT(m > 0 && d / m <= 1e-6);
    }
    for (int p = 0; p < 4; p++) { free(res[0][p]); free(res[1][p]); }
}

CT_TEST_MAIN()
