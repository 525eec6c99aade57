/* Device tensors without a GPU: parsing device names, the real backend refusing cleanly
 * where there is no GPU (or no CUDA in the build), and the device plumbing of core and the
 * op table run against a stand-in backend whose "device memory" is host memory: copies,
 * moving a parameter store, an op without a device kernel failing the context, mixed
 * devices, and backward through a device op into parameter gradients on the device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "core/kernel.h"
#include "ct_test.h"
#include "ctrain/nn.h"
#include "ctrain/ops.h"
#include "ctrain/optim.h"
#include "ctrain/train.h"
#include "ops/kmath.h"
#include "ops/op_table.h"

/* a Linear(4, 3) in a store of its own (*P), initialised with seed; its weights into w0 */
static ct_module *small_linear(ct_params **P, uint64_t seed, float w0[12]) {
    if (ct_params_create(P) != CT_OK) abort();
    ct_module *lin = ct_nn_linear(*P, "fc", 4, 3, true);
    if (!lin || ct_params_finalize(*P, seed) != CT_OK) abort();
    memcpy(w0, lin->w->data, 12 * sizeof(float));
    return lin;
}

CT_TEST(parse_and_print) {
    ct_device d;
    char b[32];
    CT_EXPECT(ct_device_parse("cpu", &d) == CT_OK && d.type == CT_DEV_CPU);
    CT_EXPECT(ct_device_parse("cuda", &d) == CT_OK && d.type == CT_DEV_CUDA && d.index == 0);
    CT_EXPECT(ct_device_parse("cuda:3", &d) == CT_OK && d.type == CT_DEV_CUDA && d.index == 3);
    CT_EXPECT(!strcmp(ct_device_str(d, b, sizeof b), "cuda:3"));
    CT_EXPECT(ct_device_parse("cuda:", &d) == CT_ERR_INVALID);
    CT_EXPECT(ct_device_parse("cuda:1x", &d) == CT_ERR_INVALID);
    CT_EXPECT(ct_device_parse("gpu", &d) == CT_ERR_INVALID && strstr(ct_last_error(), "cuda:N"));
}

/* must run before the stand-in replaces the real backend */
CT_TEST(real_backend_refuses_without_gpu) {
    int n = 0;
    if (ct_device_count(CT_DEV_CUDA, &n) == CT_OK && n > 0) { CT_SKIP("a CUDA GPU is present (tests/gpu covers it)"); return; }
    ct_params *P;
    float w[12];
    ct_module *lin = small_linear(&P, 1, w);
    float w0 = w[0];
    ct_status st = ct_module_to(lin, CT_CUDA(0));
    CT_EXPECTF(st == CT_ERR_UNSUPPORTED, "ct_module_to: %d (%s)", st, ct_last_error());
    CT_EXPECTF(strstr(ct_last_error(), "CUDA") || strstr(ct_last_error(), "driver") || strstr(ct_last_error(), "device"),
               "message: %s", ct_last_error());
    /* the store stayed on the CPU, intact */
    CT_EXPECT(ct_params_device(P).type == CT_DEV_CPU && lin->w->device.type == CT_DEV_CPU && ct_f32(lin->w)[0] == w0);
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    ct_tensor *x = ct_zeros(c, CT_F32, 2, (int64_t[]){2, 4}), *xd = NULL;
    CT_EXPECT(ct_tensor_to(c, x, CT_CUDA(0), &xd) == CT_ERR_UNSUPPORTED && xd == NULL);
    ct_ctx_free(c);
    ct_module_free(lin);
    ct_params_free(P);
    /* the reports say "none" the same way, with or without CUDA in the build */
    ct_device_info in;
    CT_EXPECT(ct_device_info_get(CT_CUDA(0), &in) == CT_ERR_UNSUPPORTED && in.name[0] == 0 && in.total_bytes == 0);
    char rep[64] = "x";
    CT_EXPECT(ct_device_check(CT_DEV_CUDA, rep, sizeof rep) == CT_ERR_UNSUPPORTED && rep[0] == 0);
    CT_EXPECT(ct_device_info_get(CT_CPU, &in) == CT_ERR_UNSUPPORTED);
    ct_device_versions(CT_DEV_CPU, rep, sizeof rep);
    CT_EXPECT(rep[0] == 0);
    float a[3] = {1, 2, 3}, b[3] = {0};
    CT_EXPECT(ct_device_copy(CT_CPU, b, a, sizeof a, true) == CT_OK && b[2] == 3);
}

/* ---- the stand-in backend: device memory is host memory, counted ---- */
static int live_bufs;
static ct_status f_count(int *n) { *n = 1; return CT_OK; }
static ct_status f_alloc(int dev, size_t bytes, void **out) {
    (void)dev;
    *out = NULL;
    if (posix_memalign(out, 64, bytes)) return ct_error(CT_ERR_NOMEM, "fake alloc");
    live_bufs++;
    return CT_OK;
}
static void f_free(void *p) { if (p) { live_bufs--; free(p); } }
static ct_status f_copy(int dev, void *dst, const void *src, size_t bytes, ct_copy_kind k) {
    (void)dev; (void)k;
    memcpy(dst, src, bytes);
    return CT_OK;
}
static ct_status f_zero(int dev, void *p, size_t bytes) { (void)dev; memset(p, 0, bytes); return CT_OK; }
static ct_status f_sync(int dev) { (void)dev; return CT_OK; }
/* the optimizer pass with ops/kmath.h's element updates, as the CUDA kernels run them */
static ct_status f_optim(int dev, ct_device_optim kind, const void *k, float *p, const float *g, float *s0, float *s1,
                         float *s2, int64_t n) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) {
        if (kind == CT_DEV_OPTIM_SGD) ct_k_sgd_elem(k, p + i, g[i], s0 ? s0 + i : NULL);
        else ct_k_adamw_elem(k, p + i, g[i], s0 + i, s1 + i, s2 ? s2 + i : NULL);
    }
    return CT_OK;
}
static int live_pinned;
static ct_status f_host_alloc(int dev, size_t bytes, void **out) {
    (void)dev;
    if (!(*out = malloc(bytes))) return ct_error(CT_ERR_NOMEM, "fake pinned alloc");
    live_pinned++;
    return CT_OK;
}
static void f_host_free(void *p) { live_pinned--; free(p); }
static void f_mem(int dev, size_t *current, size_t *peak, size_t *reserved) {
    (void)dev;
    *current = (size_t)live_bufs << 20;
    *peak = *reserved = (size_t)(live_bufs + 1) << 20;
}
/* the clipping and scaling passes as the CUDA kernels run them: kmath.h's chunks in order */
static ct_status f_sumsq(int dev, const float *g, int64_t n, double *out) {
    (void)dev;
    double t = 0;
    for (int64_t b = 0; b < n; b += CT_K_SUMSQ_CHUNK) t += ct_k_sumsq(g, (size_t)b, (size_t)(b + CT_K_SUMSQ_CHUNK < n ? b + CT_K_SUMSQ_CHUNK : n));
    *out = t;
    return CT_OK;
}
static ct_status f_scale(int dev, float *g, float coef, int64_t n, bool *nonfinite) {
    (void)dev;
    bool bad = false;
    for (int64_t i = 0; i < n; i++) {
        bad |= !isfinite(g[i]);
        g[i] *= coef;
    }
    if (nonfinite) *nonfinite = bad;
    return CT_OK;
}
/* autocast's conversions as the CUDA cast kernels do them: kmath.h's rounding for bf16 */
static int converts; /* autocast's f32 copies and roundings made through the hook */
static ct_status f_convert(int dev, void *y, ct_dtype to, const void *x, ct_dtype from, int64_t n) {
    converts++;
    (void)dev;
    ct_convert(y, to, x, from, (size_t)n);
    return CT_OK;
}
static ct_status f_round(int dev, float *g, ct_dtype dt, int64_t n) {
    (void)dev;
    CT_CHECK(dt == CT_BF16, "the stand-in rounds to bf16 only");
    for (int64_t i = 0; i < n; i++) g[i] = ct_k_bf16_to_f32(ct_k_f32_to_bf16(g[i]));
    return CT_OK;
}
static int adds; /* ct_device_add's calls that reached the hook */
static ct_status f_add(int dev, float *y, const float *x, int64_t n) {
    (void)dev;
    adds++;
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
    return CT_OK;
}
static const ct_device_hooks fake = {.count = f_count, .alloc = f_alloc, .free = f_free, .copy = f_copy, .zero = f_zero,
                                     .sync = f_sync, .optim = f_optim, .sumsq = f_sumsq, .scale = f_scale,
                                     .host_alloc = f_host_alloc, .host_free = f_host_free, .mem = f_mem,
                                     .convert = f_convert, .round = f_round, .add = f_add};

/* a device sum: forward and backward on the stand-in's (host) memory */
static ct_tensor *fake_sum(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    ct_tensor *y = ct_new_on(ctx, x->device, CT_F32, 0, NULL, "sum");
    float s = 0;
    for (int64_t i = 0; i < ct_numel(x); i++) s += ct_f32(x)[i];
    ct_f32(y)[0] = s;
    ct_record(ctx, CT_OP_SUM, y, 1, &x);
    return y;
}
static int live_max; /* most stand-in buffers alive at once during a backward */
static void fake_sum_bw(ct_ctx *ctx, ct_node *n) {
    /* a scratch buffer, as the CUDA backwards take them: returned after this node */
    float *scratch = ct_ctx_dev_alloc(ctx, n->out->device, 64, "sum backward");
    float *g = ct_grad_acc(ctx, n->in[0]);
    for (int64_t i = 0; g && i < ct_numel(n->in[0]); i++) g[i] += ct_f32(n->out->grad)[0];
    if (scratch && live_bufs > live_max) live_max = live_bufs;
}
/* a device cast and a device matmul (2-d, no transposes) on host memory: f32 operands, or
 * bf16 ones read as they are with an f32 result, as the CUDA entry takes them from autocast */
static ct_tensor *fake_cast(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    ct_dtype dt = (ct_dtype)a->i[0];
    if (x->dtype == dt) return x;
    ct_tensor *y = ct_new_on(ctx, x->device, dt, x->ndim, x->shape, "cast");
    ct_convert(y->data, dt, x->data, x->dtype, (size_t)ct_numel(x));
    ct_record(ctx, CT_OP_CAST, y, 1, &x);
    return y;
}
static void fake_cast_bw(ct_ctx *ctx, ct_node *n) {
    float *g = ct_grad_acc(ctx, n->in[0]), *go = n->out->grad->data;
    f_round(0, go, n->out->dtype, ct_numel(n->out));
    for (int64_t i = 0; g && i < ct_numel(n->out); i++) g[i] += go[i];
}
static float ld(const ct_tensor *t, int64_t i) {
    return t->dtype == CT_BF16 ? ct_k_bf16_to_f32(((const uint16_t *)t->data)[i]) : ((const float *)t->data)[i];
}
static int bf16_matmuls; /* forwards and backwards that read bf16 operands */
static ct_tensor *fake_matmul(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *A = a->in[0], *B = a->in[1];
    int64_t M, N, K, batch;
    ct_check_matmul(A, B, a->i[0], a->i[1], &M, &N, &K, &batch);
    CT_CHECK(A->dtype == B->dtype && batch == 1 && !a->i[0] && !a->i[1], "the stand-in matmul: one dtype, 2-d, plain");
    bf16_matmuls += A->dtype == CT_BF16;
    ct_tensor *y = ct_new_on(ctx, A->device, CT_F32, 2, (int64_t[]){M, N}, "matmul");
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float t = 0;
            for (int64_t k = 0; k < K; k++) t += ld(A, i * K + k) * ld(B, k * N + j);
            ct_f32(y)[i * N + j] = t;
        }
    ct_record(ctx, CT_OP_MATMUL, y, 2, (ct_tensor *[]){A, B});
    return y;
}
static void fake_matmul_bw(ct_ctx *ctx, ct_node *n) {
    ct_tensor *A = n->in[0], *B = n->in[1];
    bf16_matmuls += A->dtype == CT_BF16;
    int64_t M = A->shape[0], K = A->shape[1], N = B->shape[1];
    const float *G = n->out->grad->data;
    float *gA = ct_grad_acc(ctx, A), *gB = ct_grad_acc(ctx, B);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t k = 0; k < K; k++) {
                if (gA) gA[i * K + k] += G[i * N + j] * ld(B, k * N + j);
                if (gB) gB[k * N + j] += G[i * N + j] * ld(A, i * K + k);
            }
}

/* a stand-in for a device op with bf16 kernels and a bf16 output (the CUDA flash attention):
 * here y = v, bf16 in and out; backward dv += dy */
static ct_tensor *fake_flash(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *v = a->in[2];
    CT_CHECK(v->dtype == CT_BF16 && a->in[0]->dtype == CT_BF16, "the stand-in flash attention: bf16 under autocast");
    ct_tensor *y = ct_new_on(ctx, v->device, CT_BF16, v->ndim, v->shape, "flash_attention");
    memcpy(y->data, v->data, ct_nbytes(v));
    ct_record(ctx, CT_OP_FLASH_ATTENTION, y, 3, (ct_tensor *[]){a->in[0], a->in[1], v});
    return y;
}
static void fake_flash_bw(ct_ctx *ctx, ct_node *n) {
    CT_CHECK(n->in[2]->dtype == CT_BF16 && n->out->dtype == CT_BF16, "the stand-in flash attention's backward: bf16");
    float *g = ct_grad_acc(ctx, n->in[2]);
    for (int64_t i = 0; g && i < ct_numel(n->out); i++) g[i] += ct_f32(n->out->grad)[i];
}

/* stand-ins for device kernels that read bf16 themselves (src/cuda's relu and add): relu
 * bf16 in and out, reading its bf16 output backward; add of mixed f32 and bf16 with an f32
 * result (autocast's promotion), or of one dtype with a result in it */
static void st(ct_tensor *t, int64_t i, float v) {
    if (t->dtype == CT_BF16) ((uint16_t *)t->data)[i] = ct_k_f32_to_bf16(v);
    else ((float *)t->data)[i] = v;
}
static int lowp_reads; /* forwards and backwards that read a bf16 input or output */
static ct_tensor *fake_relu(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *y = ct_new_on(ctx, x->device, x->dtype, x->ndim, x->shape, "relu");
    lowp_reads += x->dtype == CT_BF16;
    for (int64_t i = 0; i < ct_numel(x); i++) st(y, i, ld(x, i) > 0 ? ld(x, i) : 0.0f);
    ct_record(ctx, CT_OP_RELU, y, 1, &x);
    return y;
}
static void fake_relu_bw(ct_ctx *ctx, ct_node *n) {
    float *g = ct_grad_acc(ctx, n->in[0]), *go = n->out->grad->data;
    lowp_reads += n->out->dtype == CT_BF16;
    for (int64_t i = 0; g && i < ct_numel(n->out); i++) g[i] += ld(n->out, i) > 0 ? go[i] : 0.0f;
}
static ct_tensor *fake_add(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *b = a->in[1];
    CT_CHECK(ct_same_shape(x, b), "the stand-in add: one shape");
    ct_dtype dt = x->dtype == b->dtype ? x->dtype : CT_F32;
    ct_tensor *y = ct_new_on(ctx, x->device, dt, x->ndim, x->shape, "add");
    lowp_reads += (x->dtype == CT_BF16) + (b->dtype == CT_BF16);
    for (int64_t i = 0; i < ct_numel(x); i++) st(y, i, ld(x, i) + ld(b, i));
    ct_record(ctx, CT_OP_ADD, y, 2, (ct_tensor *[]){x, b});
    return y;
}
static void fake_add_bw(ct_ctx *ctx, ct_node *n) {
    for (int k = 0; k < 2; k++) {
        float *g = ct_grad_acc(ctx, n->in[k]);
        for (int64_t i = 0; g && i < ct_numel(n->out); i++) g[i] += ct_f32(n->out->grad)[i];
    }
}

static void use_fake(void) {
    ct_device_register(CT_DEV_CUDA, &fake);
    ct_op_register_device(CT_DEV_CUDA, CT_OP_SUM, fake_sum, fake_sum_bw);
    ct_op_device_reads_lowp(CT_OP_SUM, 0, 0); /* the stand-in reads f32 (src/cuda's also bf16/f16) */
    /* softmax plays the op without a device kernel, also in builds where src/cuda has one */
    ct_op_register_device(CT_DEV_CUDA, CT_OP_SOFTMAX, NULL, NULL);
}

CT_TEST(copies_and_params_to) {
    use_fake();
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    float v[6] = {1, -2, 3, -4, 5, -6};
    ct_tensor *x = ct_from_f32(c, v, 2, (int64_t[]){2, 3}), *xd, *xh;
    CT_ASSERT(ct_tensor_to(c, x, CT_CUDA(0), &xd) == CT_OK);
    CT_EXPECT(xd->device.type == CT_DEV_CUDA && xd->data != x->data && ct_same_shape(x, xd));
    CT_ASSERT(ct_tensor_to(c, xd, CT_CPU, &xh) == CT_OK);
    CT_EXPECT(xh->device.type == CT_DEV_CPU && !memcmp(xh->data, v, sizeof v));
    ct_ctx_reset(c);
    CT_EXPECTF(live_bufs == 0, "%d device buffers left after reset", live_bufs);

    ct_params *P;
    float w[12];
    ct_module *lin = small_linear(&P, 7, w);
    ct_f32(lin->w->grad)[5] = 2.5f;
    CT_ASSERT(ct_module_to(lin, CT_CUDA(0)) == CT_OK);
    CT_EXPECT(ct_params_device(P).type == CT_DEV_CUDA && lin->w->device.type == CT_DEV_CUDA && lin->b->device.type == CT_DEV_CUDA);
    CT_EXPECT(lin->w->grad->device.type == CT_DEV_CUDA && lin->w->data == ct_params_data(P));
    CT_EXPECT(live_bufs == 3); /* data, grad, buffers */
    ct_params_zero_grad(P);
    CT_ASSERT(ct_params_to(P, CT_CPU) == CT_OK);
    CT_EXPECT(live_bufs == 0 && lin->w->device.type == CT_DEV_CPU);
    CT_EXPECT(!memcmp(lin->w->data, w, sizeof w) && ct_f32(lin->w->grad)[5] == 0.0f);
    ct_module_free(lin);
    ct_params_free(P);
    ct_ctx_free(c);
}

/* ct_device_zero, _copy_within, _add and _sumsq (sharded training's calls) on the CPU and
 * through a device's hooks: the same values */
CT_TEST(device_buffer_calls) {
    use_fake();
    const ct_device devs[2] = {CT_CPU, CT_CUDA(0)};
    for (int k = 0; k < 2; k++) {
        float *a = NULL, *b = NULL;
        CT_ASSERT(ct_device_alloc(devs[k], 8 * sizeof(float), (void **)&a) == CT_OK);
        CT_ASSERT(ct_device_alloc(devs[k], 8 * sizeof(float), (void **)&b) == CT_OK);
        for (int i = 0; i < 8; i++) a[i] = (float)i - 2.5f; /* the stand-in's memory is the host's */
        const int adds0 = adds;
        double ss = 0;
        CT_EXPECT_OK(ct_device_copy_within(devs[k], b, a, 8 * sizeof(float)));
        CT_EXPECT_OK(ct_device_add(devs[k], b, a, 8));
        CT_EXPECT_OK(ct_device_zero(devs[k], b + 6, 2 * sizeof(float)));
        CT_EXPECT_OK(ct_device_sumsq(devs[k], b, 8, &ss));
        double want = 0;
        for (int i = 0; i < 6; i++) want += 4.0 * ((double)i - 2.5) * ((double)i - 2.5);
        CT_EXPECTF(b[0] == -5.0f && b[5] == 5.0f && b[6] == 0.0f && b[7] == 0.0f && ss == want, "%s: %g %g %g %g, sum of squares %g (%g)",
                   k ? "device" : "cpu", b[0], b[5], b[6], b[7], ss, want);
        CT_EXPECT(adds - adds0 == k); /* the device's add ran through its hook */
        ct_device_free(devs[k], a);
        ct_device_free(devs[k], b);
    }
    CT_EXPECTF(live_bufs == 0, "%d device buffers left", live_bufs);
}

/* ct_device_reserve / _map / _unmap on the CPU (pages given back read as zeros; the others keep
 * their values), a device without the hooks refused by name; and a device store's flat buffers
 * moved to storage of the caller's and back, with their values (sharded training's moves) */
CT_TEST(device_address_ranges_and_storage) {
    use_fake();
    void *base = NULL;
    size_t g = 0;
    CT_ASSERT(ct_device_reserve(CT_CPU, 3 * 4096 + 5, &base, &g) == CT_OK);
    CT_ASSERT(g >= 4096 && base);
    unsigned char *m = base;
    memset(m, 7, 3 * g);
    CT_EXPECT_OK(ct_device_unmap(CT_CPU, m + g, g));
    CT_EXPECT(m[g] == 0 && m[2 * g - 1] == 0 && m[g - 1] == 7 && m[2 * g] == 7);
    m[g + 1] = 9;
    CT_EXPECT_OK(ct_device_map(CT_CPU, m + g, g));
    CT_EXPECT(m[g + 1] == 0 && m[0] == 7);
    ct_device_unreserve(CT_CPU, base, 3 * 4096 + 5);
    CT_EXPECT(ct_device_reserve(CT_CUDA(0), 4096, &base, &g) == CT_ERR_UNSUPPORTED && base == NULL);
    CT_EXPECTF(strstr(ct_last_error(), "cannot map and unmap"), "message: %s", ct_last_error());

    ct_params *P;
    float w[12];
    ct_module *lin = small_linear(&P, 7, w);
    CT_ASSERT(ct_module_to(lin, CT_CUDA(0)) == CT_OK);
    const size_t n = ct_params_numel(P);
    float *d = NULL, *gr = NULL;
    CT_ASSERT(ct_device_alloc(CT_CUDA(0), n * sizeof(float), (void **)&d) == CT_OK);
    CT_ASSERT(ct_device_alloc(CT_CUDA(0), n * sizeof(float), (void **)&gr) == CT_OK);
    ct_params_grad(P)[3] = 1.5f; /* the stand-in's memory is the host's */
    CT_EXPECT_OK(ct_params_set_data_storage(P, d, true));
    CT_EXPECT_OK(ct_params_set_grad_storage(P, gr));
    CT_EXPECT(ct_params_data(P) == d && lin->w->data == d && !memcmp(d, w, sizeof w) && gr[3] == 1.5f);
    CT_EXPECT(live_bufs == 3); /* the store's own went; the caller's two and the buffers' */
    CT_EXPECT_OK(ct_params_set_data_storage(P, NULL, true));
    CT_EXPECT_OK(ct_params_set_grad_storage(P, NULL));
    CT_EXPECT(ct_params_data(P) != d && lin->w->data == ct_params_data(P) && !memcmp(ct_params_data(P), w, sizeof w) &&
              ct_params_grad(P)[3] == 1.5f);
    ct_device_free(CT_CUDA(0), d);
    ct_device_free(CT_CUDA(0), gr);
    CT_ASSERT(ct_params_to(P, CT_CPU) == CT_OK);
    CT_EXPECTF(live_bufs == 0, "%d device buffers left", live_bufs);
    ct_module_free(lin);
    ct_params_free(P);
}

CT_TEST(op_without_kernel_fails_the_context) {
    use_fake();
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    ct_tensor *x = ct_zeros(c, CT_F32, 1, (int64_t[]){5}), *xd;
    CT_ASSERT(ct_tensor_to(c, x, CT_CUDA(0), &xd) == CT_OK);
    ct_tensor *y = ct_softmax(c, xd);
    CT_EXPECTF(ct_ctx_status(c) == CT_ERR_UNSUPPORTED, "status %d", ct_ctx_status(c));
    CT_EXPECTF(strstr(ct_last_error(), "softmax on cuda:0") && strstr(ct_last_error(), "no kernel"), "message: %s", ct_last_error());
    CT_EXPECT(y->data == NULL && y->device.type == CT_DEV_CUDA && ct_same_shape(y, xd));
    /* later device ops of the step do nothing; reading the placeholder gives NaN */
    ct_tensor *z = ct_sum(c, ct_tanh(c, y)), *x1 = ct_zeros(c, CT_F32, 1, (int64_t[]){1}), *x1d;
    CT_EXPECT(z->data == NULL);
    CT_EXPECT(ct_tensor_to(c, x1, CT_CUDA(0), &x1d) == CT_ERR_UNSUPPORTED); /* the failure sticks */
    CT_EXPECT(ct_ctx_status(c) == CT_ERR_UNSUPPORTED);
    ct_ctx_reset(c);
    CT_EXPECT(ct_ctx_status(c) == CT_OK);
    /* a placeholder reads as NaN */
    CT_ASSERT(ct_tensor_to(c, x1 = ct_zeros(c, CT_F32, 1, (int64_t[]){1}), CT_CUDA(0), &x1d) == CT_OK);
    CT_EXPECT(isnan(ct_item(ct_softmax(c, x1d))));
    ct_ctx_reset(c);
    /* mixed devices: named */
    x = ct_zeros(c, CT_F32, 1, (int64_t[]){5});
    CT_ASSERT(ct_tensor_to(c, x, CT_CUDA(0), &xd) == CT_OK);
    (void)ct_add(c, xd, x);
    CT_EXPECTF(ct_ctx_status(c) == CT_ERR_INVALID && strstr(ct_last_error(), "is on cpu"), "message: %s", ct_last_error());
    ct_ctx_free(c);
    CT_EXPECT(live_bufs == 0);
}

CT_TEST(backward_into_device_parameters) {
    use_fake();
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_tensor *W = ct_param(P, "w", 2, (int64_t[]){2, 3}, CT_INIT_ONES, 0);
    CT_ASSERT(ct_params_finalize(P, 1) == CT_OK);
    CT_ASSERT(ct_params_to(P, CT_CUDA(0)) == CT_OK);
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    for (int step = 0; step < 2; step++) { /* gradients accumulate over two backwards */
        ct_tensor *loss = ct_sum(c, W);
        CT_EXPECT(loss->device.type == CT_DEV_CUDA && ct_item(loss) == 6.0);
        int before = live_bufs;
        live_max = 0;
        ct_backward(c, loss);
        CT_EXPECT(ct_ctx_status(c) == CT_OK);
        /* the loss's gradient (consumed) and the node's scratch went back during backward,
         * not at the reset: what a GPU step's peak memory depends on */
        CT_EXPECTF(live_max == before + 2 && live_bufs == before, "buffers: %d before, %d at most, %d after", before,
                   live_max, live_bufs);
        ct_ctx_reset(c);
    }
    CT_ASSERT(ct_params_to(P, CT_CPU) == CT_OK);
    const float *g = ct_params_grad(P);
    bool ok = true;
    for (int i = 0; i < 6; i++) ok = ok && g[i] == 2.0f;
    CT_EXPECT(ok);
    ct_ctx_free(c);
    ct_params_free(P);
    CT_EXPECT(live_bufs == 0);
}

/* The optimizers on a device store: the same bits as on the CPU (AdamW with amsgrad and
 * weight decay on matrices only, so several runs; SGD with Nesterov momentum), state there. */
CT_TEST(optimizers_on_device_match_cpu) {
    use_fake();
    for (int kind = 0; kind < 2; kind++) {
        ct_params *P[2];
        for (int j = 0; j < 2; j++) {
            CT_ASSERT(ct_params_create(&P[j]) == CT_OK);
            ct_param(P[j], "a.w", 2, (int64_t[]){5, 7}, CT_INIT_KAIMING_UNIFORM, 7);
            ct_param(P[j], "a.b", 1, (int64_t[]){5}, CT_INIT_KAIMING_UNIFORM, 7);
            ct_param(P[j], "c.w", 2, (int64_t[]){3, 5}, CT_INIT_KAIMING_UNIFORM, 5);
            CT_ASSERT(ct_params_finalize(P[j], 3) == CT_OK);
        }
        CT_ASSERT(ct_params_to(P[1], CT_CUDA(0)) == CT_OK);
        ct_optim *o[2];
        for (int j = 0; j < 2; j++) {
            if (kind == 0) {
                ct_adamw_opts a = ct_adamw_default_opts();
                a.amsgrad = true;
                a.decay_only_ndim_ge2 = true;
                CT_ASSERT(ct_optim_create_adamw(P[j], &a, &o[j]) == CT_OK);
            } else {
                ct_sgd_opts g = ct_sgd_default_opts();
                g.momentum = 0.9;
                g.nesterov = true;
                g.weight_decay = 1e-3;
                CT_ASSERT(ct_optim_create_sgd(P[j], &g, &o[j]) == CT_OK);
            }
        }
        size_t n = ct_params_numel(P[0]);
        for (int step = 0; step < 3; step++) {
            float *g0 = ct_params_grad(P[0]), *g1 = ct_params_grad(P[1]); /* fake device memory is host memory */
            for (size_t i = 0; i < n; i++) g0[i] = g1[i] = (float)sin((double)(i * 7 + step));
            ct_optim_step(o[0], 0.01);
            ct_optim_step(o[1], 0.01);
        }
        CT_EXPECT(ct_optim_status(o[1]) == CT_OK);
        CT_EXPECT(live_bufs == 3 + ct_optim_state_count(o[1])); /* store + state on the device */
        CT_ASSERT(ct_params_to(P[1], CT_CPU) == CT_OK);
        CT_EXPECTF(!memcmp(ct_params_data(P[0]), ct_params_data(P[1]), n * sizeof(float)), "%s: parameters differ",
                   kind ? "sgd" : "adamw");
        for (int j = 0; j < 2; j++) ct_optim_free(o[j]);
        for (int j = 0; j < 2; j++) ct_params_free(P[j]);
        CT_EXPECT(live_bufs == 0);
    }
}

/* gradient clipping and the grad scaler's unscale on a device store: through the backend's
 * passes, the CPU's bits (norm, clipped gradients, the inf check) */
CT_TEST(clipping_and_unscale_on_device_match_cpu) {
    use_fake();
    ct_params *P[2];
    for (int j = 0; j < 2; j++) {
        CT_ASSERT(ct_params_create(&P[j]) == CT_OK);
        ct_param(P[j], "w", 2, (int64_t[]){300, 111}, CT_INIT_KAIMING_UNIFORM, 111); /* two chunks and a tail */
        CT_ASSERT(ct_params_finalize(P[j], 4) == CT_OK);
    }
    CT_ASSERT(ct_params_to(P[1], CT_CUDA(0)) == CT_OK);
    size_t n = ct_params_numel(P[0]);
    float *g0 = ct_params_grad(P[0]), *g1 = ct_params_grad(P[1]); /* fake device memory is host memory */
    for (size_t i = 0; i < n; i++) g0[i] = g1[i] = (float)sin((double)i * 0.37) * 3.0f;
    float t0 = ct_clip_grad_norm(P[0], 1.0f), t1 = ct_clip_grad_norm(P[1], 1.0f);
    CT_EXPECTF(t0 == t1 && t0 > 1.0f, "norm cpu %.9g device %.9g", t0, t1);
    CT_EXPECT(!memcmp(g0, g1, n * sizeof(float)));
    ct_grad_scaler *s[2];
    for (int j = 0; j < 2; j++) CT_ASSERT(ct_grad_scaler_create(NULL, &s[j]) == CT_OK);
    CT_EXPECT(ct_grad_scaler_unscale_and_check(s[0], P[0]) && ct_grad_scaler_unscale_and_check(s[1], P[1]));
    CT_EXPECT(!memcmp(g0, g1, n * sizeof(float)));
    g0[n - 1] = g1[n - 1] = INFINITY;
    CT_EXPECT(!ct_grad_scaler_unscale_and_check(s[0], P[0]) && !ct_grad_scaler_unscale_and_check(s[1], P[1]));
    for (int j = 0; j < 2; j++) {
        ct_grad_scaler_free(s[j]);
        ct_params_free(P[j]);
    }
    CT_EXPECT(live_bufs == 0);
}

/* ct_train_step with the parameters on a device: the batch is copied there, backward and the
 * optimizer run there (a loss of sum(w): every gradient 1, SGD moves each weight by -lr);
 * an op that fails on the device comes back as the step's status; clipping and autocast
 * run there */
static ct_tensor *sum_loss(ct_ctx *ctx, void *self, ct_tensor *x, ct_tensor *y) {
    CT_CHECK(x->device.type == CT_DEV_CUDA && y->device.type == CT_DEV_CUDA, "the batch was not moved to the device");
    return ct_sum(ctx, ((ct_module *)self)->w);
}
static ct_tensor *lin_forward(ct_ctx *ctx, void *self, ct_tensor *x) { return ct_module_forward(ctx, self, x); }

CT_TEST(train_step_on_device) {
    use_fake();
    ct_params *P;
    float w0[12];
    ct_module *lin = small_linear(&P, 2, w0);
    CT_ASSERT(ct_module_to(lin, CT_CUDA(0)) == CT_OK);
    ct_optim *o;
    CT_ASSERT(ct_optim_create_sgd(P, NULL, &o) == CT_OK);
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    float x[8] = {0};
    int32_t y[2] = {0, 1};
    ct_train_batch b = ct_train_batch_of(CT_F32, x, 2, (int64_t[]){2, 4}, y, 1, (int64_t[]){2});
    ct_train_model tm = {.params = P, .forward = lin_forward, .loss = sum_loss, .self = lin, .kind = "linear"};
    ct_step_args sa = {.ctx = c, .model = &tm, .opt = o, .lr = 0.5};
    ct_step_result res;
    CT_ASSERT(ct_train_step(&sa, &b, 1, &res) == CT_OK);
    bool moved = true;
    for (int i = 0; i < 12; i++) moved = moved && ct_f32(lin->w)[i] == w0[i] - 0.5f; /* fake device memory is host memory */
    CT_EXPECTF(moved && res.loss != 0, "loss %g", res.loss);
    /* the default loss (cross-entropy of the Linear's output) has no working kernel here */
    tm.loss = NULL;
    ct_status st = ct_train_step(&sa, &b, 1, &res);
    CT_EXPECTF(st != CT_OK && strstr(ct_last_error(), "on cuda:"), "status %d: %s", st, ct_last_error());
    CT_EXPECT(ct_ctx_status(c) == CT_OK); /* reset for the next step */
    tm.loss = sum_loss;
    sa.clip_norm = 1.0; /* 12 weight gradients of 1 (the bias gets 0): each weight moves by -0.5 / sqrt(12) */
    float w1[12];
    memcpy(w1, ct_f32(lin->w), sizeof w1);
    CT_ASSERT(ct_train_step(&sa, &b, 1, &res) == CT_OK);
    CT_EXPECTF(fabs(res.grad_norm - sqrt(12.0)) < 1e-6 && fabsf(ct_f32(lin->w)[0] - (w1[0] - 0.5f / sqrtf(12.0f))) < 1e-6f,
               "norm %g, w %g from %g", res.grad_norm, ct_f32(lin->w)[0], w1[0]);
    sa.amp = CT_BF16; /* sum is f32-policy: the step runs as in f32 */
    memcpy(w1, ct_f32(lin->w), sizeof w1);
    CT_ASSERT(ct_train_step(&sa, &b, 1, &res) == CT_OK);
    CT_EXPECTF(fabsf(ct_f32(lin->w)[0] - (w1[0] - 0.5f / sqrtf(12.0f))) < 1e-6f, "w %g from %g", ct_f32(lin->w)[0], w1[0]);
    ct_ctx_free(c);
    ct_optim_free(o);
    ct_module_free(lin);
    ct_params_free(P);
    CT_EXPECT(live_bufs == 0);
}

/* The stores of the device tests below: w [wrows, 3] and v [3, 2] (and u [2, 2] when U is
 * asked for), initialised from seed, moved to the stand-in cuda:0 when on_device. */
static ct_params *wv_store(int64_t wrows, uint64_t seed, bool on_device, ct_tensor **W, ct_tensor **V, ct_tensor **U) {
    ct_params *P;
    if (ct_params_create(&P) != CT_OK) abort();
    *W = ct_param(P, "w", 2, (int64_t[]){wrows, 3}, CT_INIT_KAIMING_UNIFORM, 3);
    *V = ct_param(P, "v", 2, (int64_t[]){3, 2}, CT_INIT_KAIMING_UNIFORM, 4);
    if (U) *U = ct_param(P, "u", 2, (int64_t[]){2, 2}, CT_INIT_KAIMING_UNIFORM, 2);
    if (ct_params_finalize(P, seed) != CT_OK || (on_device && ct_params_to(P, CT_CUDA(0)) != CT_OK)) abort();
    return P;
}
/* the store's gradients into out (n floats), back from the device where it is, then freed */
static void grads_and_free(ct_params *P, float *out, size_t n) {
    if (ct_params_device(P).type != CT_DEV_CPU && ct_params_to(P, CT_CPU) != CT_OK) abort();
    memcpy(out, ct_params_grad(P), n * sizeof(float));
    ct_params_free(P);
}

/* Autocast on device tensors: the policy applied by the device dispatch (the cast op on the
 * device, the device matmul reading the bf16 casts with its f32 result rounded to a bf16
 * tensor on the device, forward and backward; the f32-policy sum given an f32 copy made there
 * and giving f32), the copies returned to the allocator when each op is done, and the loss
 * and the f32 parameter gradients the CPU's. */
CT_TEST(autocast_on_device) {
    use_fake();
    ct_op_register_device(CT_DEV_CUDA, CT_OP_CAST, fake_cast, fake_cast_bw);
    ct_op_dev_entry saved = ct_op_table_dev[CT_OP_MATMUL];
    ct_op_register_device(CT_DEV_CUDA, CT_OP_MATMUL, fake_matmul, fake_matmul_bw);
    ct_op_device_reads_lowp(CT_OP_MATMUL, 3u, 1u << CT_BF16);
    double loss[2];
    float grad[2][12];
    for (int d = 0; d < 2; d++) {
        ct_tensor *W, *V;
        ct_params *P = wv_store(2, 9, d, &W, &V, NULL);
        ct_ctx *c;
        CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
        int before = live_bufs;
        bf16_matmuls = 0;
        CT_ASSERT(ct_autocast_begin(c, CT_BF16) == CT_OK);
        ct_tensor *y = ct_matmul(c, W, V, false, false);
        ct_tensor *l = ct_sum(c, y);
        ct_autocast_end(c);
        CT_EXPECTF(y->dtype == CT_BF16 && l->dtype == CT_F32 && y->device.type == (d ? CT_DEV_CUDA : CT_DEV_CPU),
                   "dtypes %s, %s", ct_dtype_name(y->dtype), ct_dtype_name(l->dtype));
        /* kept on the device: the two bf16 casts, y and the loss; the f32 copy and results are gone */
        if (d) CT_EXPECTF(live_bufs == before + 4, "%d device buffers live after the forward, %d before", live_bufs, before);
        loss[d] = ct_item(l);
        ct_backward(c, l);
        CT_EXPECT(ct_ctx_status(c) == CT_OK);
        if (d) CT_EXPECTF(bf16_matmuls == 2, "%d of the device matmul's forward and backward read bf16", bf16_matmuls);
        ct_ctx_free(c);
        grads_and_free(P, grad[d], sizeof grad[d] / sizeof(float));
    }
    CT_EXPECTF(fabs(loss[0] - loss[1]) <= 1e-6 * fabs(loss[0]), "loss %.9g on the CPU, %.9g on the device", loss[0], loss[1]);
    bool same = true;
    for (int i = 0; i < 12; i++) same = same && fabsf(grad[0][i] - grad[1][i]) <= 1e-6f * fabsf(grad[0][i]);
    CT_EXPECT(same);
    ct_op_table_dev[CT_OP_MATMUL] = saved;
    CT_EXPECT(live_bufs == 0);
}

/* Device ops that read bf16 themselves (ct_op_device_reads_lowp) get the bf16 tensors, forward
 * and backward: no f32 copies through the conversion hook, a bf16 relu output, an f32 result
 * of a mixed add; loss and gradients the CPU autocast's. Without the declaration the same
 * step goes through f32 copies (the old path), with the same values. */
CT_TEST(autocast_device_ops_read_lowp) {
    use_fake();
    ct_op_register_device(CT_DEV_CUDA, CT_OP_CAST, fake_cast, fake_cast_bw);
    const int ops[3] = {CT_OP_MATMUL, CT_OP_RELU, CT_OP_ADD};
    ct_op_dev_fwd fw[3] = {fake_matmul, fake_relu, fake_add};
    ct_backward_fn bw[3] = {fake_matmul_bw, fake_relu_bw, fake_add_bw};
    ct_op_dev_entry saved[3];
    for (int k = 0; k < 3; k++) {
        saved[k] = ct_op_table_dev[ops[k]];
        ct_op_register_device(CT_DEV_CUDA, ops[k], fw[k], bw[k]);
    }
    double loss[3];
    float grad[3][16];
    for (int d = 0; d < 3; d++) { /* the CPU; the device reading bf16; the device on f32 copies */
        bool declared = d == 1;
        ct_op_device_reads_lowp(CT_OP_MATMUL, declared ? 3u : 0u, 1u << CT_BF16);
        ct_op_device_reads_lowp(CT_OP_RELU, declared ? 1u : 0u, 1u << CT_BF16);
        ct_op_device_reads_lowp(CT_OP_ADD, declared ? 3u : 0u, (1u << CT_BF16) | (1u << CT_F32));
        ct_tensor *W, *V, *U;
        ct_params *P = wv_store(2, 9, d, &W, &V, &U);
        ct_ctx *c;
        CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
        converts = lowp_reads = bf16_matmuls = 0;
        CT_ASSERT(ct_autocast_begin(c, CT_BF16) == CT_OK);
        ct_tensor *y = ct_relu(c, ct_matmul(c, W, V, false, false));
        ct_tensor *z = ct_add(c, U, y);
        ct_tensor *l = ct_sum(c, z);
        ct_autocast_end(c);
        CT_EXPECTF(y->dtype == CT_BF16 && z->dtype == CT_F32, "relu gave %s, the mixed add %s", ct_dtype_name(y->dtype),
                   ct_dtype_name(z->dtype));
        loss[d] = ct_item(l);
        ct_backward(c, l);
        CT_EXPECT(ct_ctx_status(c) == CT_OK);
        /* read as bf16: matmul forward and backward, relu forward and backward, the add's bf16
         * input; one conversion, the rounding of matmul's f32 result to its bf16 output */
        if (d == 1)
            CT_EXPECTF(converts == 1 && lowp_reads == 3 && bf16_matmuls == 2, "%d conversions, %d + %d bf16 reads", converts,
                       lowp_reads, bf16_matmuls);
        if (d == 2)
            CT_EXPECTF(converts > 1 && lowp_reads == 0 && bf16_matmuls == 0, "undeclared: %d conversions, %d + %d bf16 reads",
                       converts, lowp_reads, bf16_matmuls);
        ct_ctx_free(c);
        grads_and_free(P, grad[d], sizeof grad[d] / sizeof(float));
    }
    for (int d = 1; d < 3; d++) {
        CT_EXPECTF(fabs(loss[0] - loss[d]) <= 1e-6 * fabs(loss[0]), "loss %.9g on the CPU, %.9g on the device (%d)", loss[0],
                   loss[d], d);
        bool same = true;
        for (int i = 0; i < 16; i++) same = same && fabsf(grad[0][i] - grad[d][i]) <= 1e-6f * fabsf(grad[0][i]);
        CT_EXPECTF(same, "gradients differ from the CPU's (%d)", d);
    }
    for (int k = 0; k < 3; k++) ct_op_table_dev[ops[k]] = saved[k];
    CT_EXPECT(live_bufs == 0);
}

/* Activation checkpointing on a device: the segment's intermediates go back to the allocator
 * after its forward (only its output stays), backward recomputes it (the matmuls run twice)
 * and the gradients are those of the CPU's checkpointed run and of the device run without
 * checkpointing. The segment: relu(W relu(W x)). */
static int matmul_calls;
static ct_tensor *seg_fw(ct_ctx *c, ct_tensor *x, void *w) {
    matmul_calls += 2;
    ct_tensor *W = w;
    return ct_relu(c, ct_matmul(c, W, ct_relu(c, ct_matmul(c, W, x, false, false)), false, false));
}
CT_TEST(checkpoint_on_device) {
    use_fake();
    const int ops[2] = {CT_OP_MATMUL, CT_OP_RELU};
    ct_op_dev_fwd fw[2] = {fake_matmul, fake_relu};
    ct_backward_fn bw[2] = {fake_matmul_bw, fake_relu_bw};
    ct_op_dev_entry saved[2];
    for (int k = 0; k < 2; k++) {
        saved[k] = ct_op_table_dev[ops[k]];
        ct_op_register_device(CT_DEV_CUDA, ops[k], fw[k], bw[k]);
    }
    float grad[3][15];
    int live[3], calls[3];
    for (int d = 0; d < 3; d++) { /* CPU checkpointed, device checkpointed, device plain */
        ct_tensor *W, *V;
        ct_params *P = wv_store(3, 5, d, &W, &V, NULL);
        ct_ctx *c;
        CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
        int before = live_bufs;
        matmul_calls = 0;
        ct_tensor *y = d < 2 ? ct_checkpoint(c, seg_fw, W, V) : seg_fw(c, V, W);
        ct_tensor *l = ct_sum(c, y);
        live[d] = live_bufs - before;
        ct_backward(c, l);
        CT_EXPECTF(ct_ctx_status(c) == CT_OK, "run %d: %s", d, ct_last_error());
        calls[d] = matmul_calls;
        ct_ctx_free(c);
        grads_and_free(P, grad[d], sizeof grad[d] / sizeof(float));
    }
    /* kept after the forward: the segment's output and the loss; plain: also the three intermediates */
    CT_EXPECTF(live[1] == 2 && live[2] == 5, "device buffers after the forward: %d checkpointed, %d plain", live[1], live[2]);
    CT_EXPECTF(calls[0] == 4 && calls[1] == 4 && calls[2] == 2, "matmuls: %d, %d, %d", calls[0], calls[1], calls[2]);
    for (int d = 1; d < 3; d++) {
        bool same = true;
        for (int i = 0; i < 15; i++) same = same && fabsf(grad[0][i] - grad[d][i]) <= 1e-6f * fabsf(grad[0][i]);
        CT_EXPECTF(same, "gradients of run %d differ from the CPU's", d);
    }
    for (int k = 0; k < 2; k++) ct_op_table_dev[ops[k]] = saved[k];
    CT_EXPECT(live_bufs == 0);
}

/* A device op with its own bf16 kernels (flash attention) keeps its bf16 output: no f32 result
 * or copies, the output's gradient reaching the f32 master gradient through the cast. */
CT_TEST(autocast_keeps_a_device_bf16_output) {
    use_fake();
    ct_op_register_device(CT_DEV_CUDA, CT_OP_CAST, fake_cast, fake_cast_bw);
    ct_op_dev_entry saved = ct_op_table_dev[CT_OP_FLASH_ATTENTION];
    ct_op_register_device(CT_DEV_CUDA, CT_OP_FLASH_ATTENTION, fake_flash, fake_flash_bw);
    ct_op_device_reads_lowp(CT_OP_FLASH_ATTENTION, 7u, 1u << CT_BF16);
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_tensor *V = ct_param(P, "v", 4, (int64_t[]){1, 1, 4, 8}, CT_INIT_KAIMING_UNIFORM, 8);
    CT_ASSERT(ct_params_finalize(P, 2) == CT_OK);
    float v0[32];
    memcpy(v0, V->data, sizeof v0);
    CT_ASSERT(ct_params_to(P, CT_CUDA(0)) == CT_OK);
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    int before = live_bufs;
    CT_ASSERT(ct_autocast_begin(c, CT_BF16) == CT_OK);
    ct_tensor *y = ct_flash_attention(c, V, V, V, true);
    ct_tensor *l = ct_sum(c, y);
    ct_autocast_end(c);
    CT_EXPECTF(y->dtype == CT_BF16 && y->device.type == CT_DEV_CUDA && l->dtype == CT_F32, "y %s, loss %s", ct_dtype_name(y->dtype),
               ct_dtype_name(l->dtype));
    CT_EXPECTF(live_bufs == before + 3, "%d device buffers after the forward, %d before (the cast, y, the loss)", live_bufs, before);
    bool same = true;
    for (int i = 0; i < 32; i++) same = same && ((uint16_t *)y->data)[i] == ct_k_f32_to_bf16(v0[i]);
    CT_EXPECT(same);
    ct_backward(c, l);
    CT_EXPECT(ct_ctx_status(c) == CT_OK);
    ct_ctx_free(c);
    CT_ASSERT(ct_params_to(P, CT_CPU) == CT_OK);
    bool ones = true;
    for (int i = 0; i < 32; i++) ones = ones && ct_params_grad(P)[i] == 1.0f;
    CT_EXPECT(ones);
    ct_params_free(P);
    ct_op_table_dev[CT_OP_FLASH_ATTENTION] = saved;
    CT_EXPECT(live_bufs == 0);
}

/* The trainer with the model on a device: batches staged in pinned memory and copied there,
 * periodic and final checkpoints and model.safetensors written through the host with the
 * model back on the device afterwards, a resume loading into the device model, GPU memory
 * in the metrics; clipping, loss scaling and autocast taken, an optimizer made before the move
 * refused. A loss of sum(w): every step moves each weight by -lr. */
static ct_trainer_opts device_opts(const char *dir, int64_t steps) {
    ct_trainer_opts o = ct_trainer_default_opts();
    o.output_dir = ct_test_tmp_path(dir);
    o.log_every = 0; /* quiet; the metrics are still written at the last step */
    o.batch_size = 16;
    o.lr = 0.5;
    o.schedule = CT_LR_CONSTANT;
    o.max_steps = steps;
    o.save_every = 1;
    return o;
}

CT_TEST(trainer_on_device) {
    use_fake();
    static float xs[64 * 4];
    static int32_t ys[64];
    for (int i = 0; i < 64 * 4; i++) xs[i] = (float)i;
    for (int i = 0; i < 64; i++) ys[i] = i % 3;
    ct_dataset *train = NULL, *none = NULL;
    CT_ASSERT(ct_dataset_tensors(xs, 4, ys, 1, 64, &train) == CT_OK && ct_dataset_subset(train, 64, 0, &none) == CT_OK);
    float w0[12];
    ct_params *P[2];
    ct_module *lin[2];
    ct_optim *opt[2];
    ct_train_model tm[2];
    for (int j = 0; j < 2; j++) {
        lin[j] = small_linear(&P[j], 5, w0);
        CT_ASSERT(ct_module_to(lin[j], CT_CUDA(0)) == CT_OK);
        CT_ASSERT(ct_optim_create_sgd(P[j], NULL, &opt[j]) == CT_OK);
        tm[j] = (ct_train_model){.params = P[j], .forward = lin_forward, .loss = sum_loss, .self = lin[j], .kind = "linear"};
    }
    /* 2 steps, then a second run resuming from its checkpoint to step 4 */
    ct_trainer_opts o = device_opts("devtrain", 2);
    ct_trainer *t;
    CT_ASSERT(ct_trainer_create(&o, &tm[0], opt[0], train, none, &t) == CT_OK);
    CT_EXPECT(live_pinned == 2); /* x and y staging */
    CT_EXPECT_OK(ct_trainer_fit(t));
    ct_trainer_free(t);
    CT_EXPECT(live_pinned == 0);
    CT_EXPECT(ct_params_device(P[0]).type == CT_DEV_CUDA && ct_optim_device(opt[0]).type == CT_DEV_CUDA);
    CT_EXPECT(lin[0]->w->device.type == CT_DEV_CUDA && lin[0]->w->data == ct_params_data(P[0]));
    o = device_opts("devtrain", 4);
    o.resume = "auto";
    CT_ASSERT(ct_trainer_create(&o, &tm[1], opt[1], train, none, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(ct_trainer_step(t), 4);
    ct_trainer_free(t);
    bool ok = ct_params_device(P[1]).type == CT_DEV_CUDA;
    for (int i = 0; i < 12; i++) { /* fake device memory is host memory */
        float w = w0[i];
        for (int k = 0; k < 4; k++) w -= 0.5f;
        ok = ok && ct_f32(lin[1]->w)[i] == w;
    }
    CT_EXPECTF(ok, "the resumed device model did not continue from step 2's weights (w[0] %g, from %g)",
               (double)ct_f32(lin[1]->w)[0], (double)w0[0]);
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", o.output_dir);
    FILE *f = fopen(path, "r");
    char buf[65536] = "";
    size_t nr = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[nr] = 0;
    if (f) fclose(f);
    CT_EXPECTF(strstr(buf, "train/gpu_mem_mb") && strstr(buf, "train/gpu_peak_mb"), "metrics: %.200s", buf);
    /* refusals */
    o = device_opts("devrefuse", 1);
    o.clip_norm = 1;
    o.loss_scaling = true; /* both run on the device */
    CT_ASSERT(ct_trainer_create(&o, &tm[1], opt[1], train, none, &t) == CT_OK);
    ct_trainer_free(t);
    o.amp = CT_BF16; /* built for the device: taken */
    CT_ASSERT(ct_trainer_create(&o, &tm[1], opt[1], train, none, &t) == CT_OK);
    ct_trainer_free(t);
    o.amp = CT_F32;
    CT_ASSERT(ct_optim_to(opt[1], CT_CPU) == CT_OK);
    CT_EXPECT(ct_trainer_create(&o, &tm[1], opt[1], train, none, &t) == CT_ERR_INVALID && strstr(ct_last_error(), "optimizer"));
    for (int j = 0; j < 2; j++) {
        ct_optim_free(opt[j]);
        ct_module_free(lin[j]);
        ct_params_free(P[j]);
    }
    ct_dataset_free(none);
    ct_dataset_free(train);
    CT_EXPECT(live_bufs == 0 && live_pinned == 0);
}

CT_TEST_MAIN()
