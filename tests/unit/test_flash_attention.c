/* Fused (flash) attention against the plain version, which is checked against PyTorch in
 * test_ops_torch: forward and every gradient within 1e-5 (normwise) on shapes around the
 * tile sizes (64 query rows x 128 keys), causal and not, Tq != Tk, Dv != D; against
 * PyTorch's F.scaled_dot_product_attention itself (fixtures from tests/torch/gen_sdpa.py);
 * the same bits with 1 and 2 threads; and the memory it promises: no [T, T] matrix. */
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/io.h"
#include "ctrain/ops.h"
#include "case_fixture.h"

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

CT_TEST(flash_equals_plain) {
    const shape shapes[] = {
        {1, 1, 1, 1, 8, 8, true},      {2, 3, 7, 7, 8, 8, true},      {1, 2, 64, 64, 32, 32, true},
        {1, 2, 65, 65, 32, 16, true},  {2, 2, 130, 130, 16, 16, true}, {1, 1, 300, 300, 64, 64, true},
        {2, 1, 37, 200, 24, 40, false}, {1, 2, 129, 129, 32, 32, false}, {1, 1, 200, 70, 8, 8, false},
    };
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
            const char *ref[4] = {"y", "dq", "dk", "dv"};
            const ct_tensor *got[4] = {y, in[0]->grad, in[1]->grad, in[2]->grad};
            for (int p = 0; p < 4; p++) {
                const ct_tensor *r = case_tensor(c, f, cs, ref[p]);
                CT_ASSERT(got[p] && ct_numel(got[p]) == ct_numel(r));
                const float *a = got[p]->data, *b = r->data;
                double d = 0, m = 0;
                for (int64_t i = 0; i < ct_numel(r); i++) {
                    double e = fabs((double)a[i] - b[i]);
                    d = e > d || e != e ? e : d;
                    m = fabs(b[i]) > m ? fabs(b[i]) : m;
                }
                double e = d / m;
                if (e > worst[flash]) worst[flash] = e;
                if (!(e <= 1e-5)) CT_FAILF("case %d %s %s vs SDPA: %.3g", cs, flash ? "flash" : "plain", ref[p], e);
            }
            ct_ctx_free(c);
        }
    }
    printf("  worst normwise difference to F.scaled_dot_product_attention: flash %.2e, plain %.2e\n", worst[1], worst[0]);
    ct_st_close(f);
}

CT_TEST_MAIN()
