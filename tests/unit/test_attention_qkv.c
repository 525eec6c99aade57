/* ct_attention_qkv (plain attention on a packed qkv [B, T, 3C]) against the chain
 * CausalSelfAttention ran before it: qkv viewed as [3, B, H, T, D] and made contiguous,
 * ct_attention on its slices, ct_merge_heads. The same bytes (memcmp), y and the gradients,
 * for odd T (37, 150, 257: one row block, and the causal row blocks with a short last one),
 * causal or not, 1..4 heads, B 1..3, 1 and 2 threads (heads in parallel or one at a time),
 * qkv a leaf, a linear's output (gradients reach x, W, b) or used twice (its gradient holds
 * a value when the attention's comes), and on the BLAS path. */
#include "ct_test.h"
#include "ctrain/config.h"
#include "ctrain/ops.h"
#include "gradcheck.h"
#include "ops/cpu/sgemm.h"
#include "kernel_check.h"

typedef struct { int64_t B, T, H, D; bool causal; } ashape;
enum { QKV_LEAF, QKV_LINEAR, QKV_TWICE, AC_LINEAR, AC_LEAF, AC_TWICE, AC16_LINEAR, BF16_LEAF };

static ct_tensor *rand_tensor(ct_ctx *c, int ndim, const int64_t *shape, uint64_t seed, float scale) {
    ct_tensor *t = ct_new(c, CT_F32, ndim, shape);
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 7;
    for (int64_t i = 0; i < ct_numel(t); i++) ct_f32(t)[i] = ct_gc_rand(&s) * scale;
    return t;
}

static ct_tensor *unfused(ct_ctx *c, ct_tensor *qkv, const ashape *s) {
    const int64_t hs[4] = {s->B, s->H, s->T, s->D};
    ct_tensor *t = ct_reshape(c, qkv, 5, (int64_t[]){s->B, s->T, 3, s->H, s->D});
    t = ct_contiguous(c, ct_transpose(c, ct_transpose(c, ct_transpose(c, t, 1, 2), 2, 3), 0, 1));
    ct_tensor *q = ct_reshape(c, ct_slice(c, t, 0, 0, 1), 4, hs), *k = ct_reshape(c, ct_slice(c, t, 0, 1, 1), 4, hs);
    ct_tensor *v = ct_reshape(c, ct_slice(c, t, 0, 2, 1), 4, hs);
    return ct_merge_heads(c, ct_attention(c, q, k, v, s->causal));
}

/* the bytes of y, then of every leaf's gradient */
static unsigned char *bytes_of(const ashape *s, bool fused, int threads, int mode, size_t *len) {
    ct_set_num_threads(threads);
    ct_ctx *c;
    if (ct_ctx_create(NULL, &c) != CT_OK) return NULL;
    const int64_t B = s->B, T = s->T, C = s->H * s->D;
    ct_tensor *leaf[3] = {rand_tensor(c, 3, (int64_t[]){B, T, 3 * C}, 11, 2.0f), NULL, NULL};
    int nl = 1;
    const bool ac = mode >= AC_LINEAR && mode <= AC16_LINEAR, lin = mode == QKV_LINEAR || mode == AC_LINEAR || mode == AC_TWICE || mode == AC16_LINEAR;
    if (lin) {
        leaf[0] = rand_tensor(c, 3, (int64_t[]){B, T, C}, 12, 1.0f);
        leaf[1] = rand_tensor(c, 2, (int64_t[]){3 * C, C}, 13, 3.0f / sqrtf((float)C));
        leaf[2] = rand_tensor(c, 1, (int64_t[]){3 * C}, 14, 0.5f);
        nl = 3;
    }
    for (int i = 0; i < nl; i++) ct_requires_grad(leaf[i]);
    if (ac) CT_EXPECT_OK(ct_autocast_begin(c, mode == AC16_LINEAR ? CT_F16 : CT_BF16));
    ct_tensor *qkv = lin ? ct_linear(c, leaf[0], leaf[1], leaf[2]) : leaf[0];
    if (mode == BF16_LEAF) qkv = ct_cast(c, qkv, CT_BF16);
    ct_tensor *y = fused ? ct_attention_qkv(c, qkv, (int)s->H, s->causal) : unfused(c, qkv, s);
    if (ac) ct_autocast_end(c);
    ct_tensor *loss = ct_sum(c, ct_mul(c, ct_cast(c, y, CT_F32), rand_tensor(c, 3, (int64_t[]){B, T, C}, 15, 1.0f)));
    if (mode == QKV_TWICE || mode == AC_TWICE) {
        ct_tensor *q32 = ct_cast(c, qkv, CT_F32);
        loss = ct_add(c, loss, ct_sum(c, ct_mul(c, q32, q32)));
    }
    ct_backward(c, loss);
    size_t n = ct_nbytes(y);
    for (int i = 0; i < nl; i++) n += ct_nbytes(leaf[i]->grad);
    unsigned char *out = malloc(n), *o = out;
    memcpy(o, y->data, ct_nbytes(y));
    o += ct_nbytes(y);
    for (int i = 0; i < nl; i++, o += ct_nbytes(leaf[i - 1]->grad)) memcpy(o, leaf[i]->grad->data, ct_nbytes(leaf[i]->grad));
    *len = n;
    ct_ctx_free(c);
    return out;
}

static void expect_same(const ashape *s, int threads, int mode) {
    static const char *what[] = {"qkv leaf", "after a linear", "qkv used twice", "bf16 autocast", "bf16 autocast, f32 leaf", "bf16 autocast, used twice",
                                 "f16 autocast", "bf16 qkv (a cast leaf), no autocast"};
    size_t n1 = 0, n2 = 0;
    unsigned char *a = bytes_of(s, false, threads, mode, &n1), *f = bytes_of(s, true, threads, mode, &n2);
    CT_ASSERT(a && f);
    CT_EXPECTF(n1 == n2 && !memcmp(a, f, n1), "B%lld T%lld H%lld D%lld %s, %s, %d thread(s): fused differs from the chain",
               (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->D, s->causal ? "causal" : "full", what[mode],
               threads);
    free(a);
    free(f);
}

static const ashape cases[] = {
    {1, 37, 1, 16, true}, {2, 37, 2, 8, false},  {3, 37, 4, 24, true},  {1, 150, 3, 32, true}, {2, 150, 4, 16, false},
    {2, 150, 2, 64, true}, {1, 257, 4, 32, true}, {3, 257, 1, 16, false}, {2, 257, 3, 8, true},  {1, 1, 2, 8, true},
};
#define NCASES (sizeof cases / sizeof *cases)

CT_TEST(attention_qkv_same_bits_as_chain) {
    for (size_t i = 0; i < NCASES; i++)
        for (int t = 1; t <= 2; t++)
            for (int mode = QKV_LEAF; mode <= QKV_TWICE; mode++) expect_same(&cases[i], t, mode);
}

/* Under bf16 or f16 autocast (qkv a linear's low-precision output, or an f32 leaf autocast
 * casts) and on a bf16 qkv: both run the same f32 attention on f32 copies of the same values
 * and round y and the low-precision tensors' gradients the same way */
CT_TEST(attention_qkv_same_bits_as_chain_low_precision) {
    for (size_t i = 0; i < NCASES; i++)
        for (int t = 1; t <= 2; t++)
            for (int mode = AC_LINEAR; mode <= BF16_LEAF; mode++) expect_same(&cases[i], t, mode);
}

/* OpenBLAS for every GEMM: head by head, BLAS threading */
CT_TEST(attention_qkv_same_bits_as_chain_blas_path) {
    CT_EXPECT_OK(ct_config_set("CTRAIN_GEMM", "openblas"));
    for (size_t i = 0; i < NCASES; i += 2) expect_same(&cases[i], 2, i % 4 ? QKV_TWICE : QKV_LINEAR);
    CT_EXPECT_OK(ct_config_unset("CTRAIN_GEMM"));
}

/* the same bits at 1 and 2 threads on the own GEMM; within f32 rounding on OpenBLAS's */
CT_TEST(attention_qkv_same_bits_any_thread_count) {
    size_t n1 = 0, n2 = 0;
    unsigned char *a = bytes_of(&cases[6], true, 1, QKV_LINEAR, &n1), *b = bytes_of(&cases[6], true, 2, QKV_LINEAR, &n2);
    CT_ASSERT(a && b && n1 == n2);
    expect_threads_agree(a, b, n1, 1e-5, "attention_qkv");
    free(a);
    free(b);
}

static ct_tensor *f_attn_qkv(ct_ctx *c, ct_tensor **in, void *arg) { return ct_attention_qkv(c, in[0], 3, *(bool *)arg); }
CT_TEST(attention_qkv_gradcheck) {
    for (int causal = 0; causal < 2; causal++) {
        bool cz = causal;
        double e = ct_gradcheck(f_attn_qkv, &cz, 1, (ct_tensor_spec[]){{3, {2, 5, 18}}}, false);
        CT_EXPECTF(e < 1e-2, "%s: gradcheck error %g", causal ? "causal" : "full", e);
    }
}

CT_TEST_MAIN()
