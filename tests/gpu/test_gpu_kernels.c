/* Every CUDA kernel against the CPU op on random inputs: within 1e-5 (normwise relative) in
 * f32, 1e-2 in bf16, 1e-3 in f16 (inputs rounded to that type for both sides). Built only
 * with CUDA; on a machine without a GPU each test skips with "no CUDA GPU" except the ones
 * that check the clean failure there (device count, NCCL backend). scripts/gpu-check.sh runs
 * this on a GPU. */
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/config.h"
#include "ctrain/dist.h"
#include "ctrain/ops.h"
#include "kernel_check.h"
#include "ctrain/optim.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "gpu/gpu_test.h"



/* device copies through the caching allocator; every test frees what it uploads */
static void *up(const void *h, size_t bytes) {
    void *d = NULL;
    if (ct_cuda_alloc(0, bytes, &d) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); abort(); }
    if (h && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) abort();
    if (!h && cudaMemset(d, 0, bytes) != cudaSuccess) abort();
    return d;
}
static float *upf(const ct_tensor *t) { return up(t->data, ct_nbytes(t)); }
static float *zeros(int64_t n) { return up(NULL, (size_t)n * sizeof(float)); }
/* copies n floats back and returns the error against ref */
static double err_f32(const float *d, const float *ref, int64_t n) {
    float *h = malloc((size_t)n * sizeof(float));
    if (cudaMemcpy(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) abort();
    double e = normwise(h, ref, n);
    free(h);
    return e;
}
#define EXPECT_CLOSE(what, e, tol) CT_EXPECTF((e) <= (tol), "%s: error %g > %g", what, (double)(e), (double)(tol))
#define OK(call) CT_EXPECTF((call) == CT_OK, "%s: %s", #call, ct_last_error())

/* the error conversion of CT_GPU_CHECK: statuses by kind, messages naming op and call */
CT_TEST(check_macro_statuses_and_messages) {
    CT_EXPECT(CT_GPU_CHECK(cuda, "x", cudaSuccess) == CT_OK);
    CT_EXPECT(CT_GPU_CHECK(nccl, "x", ncclInProgress) == CT_OK); /* non-blocking communicators */
    ct_status st = CT_GPU_CHECK(cuda, "layer_norm", cudaErrorMemoryAllocation);
    CT_EXPECTF(st == CT_ERR_NOMEM && strstr(ct_last_error(), "layer_norm on cuda:") &&
                   strstr(ct_last_error(), "cudaErrorMemoryAllocation failed: out of memory (cudaErrorMemoryAllocation)"),
               "%d %s", (int)st, ct_last_error());
    st = CT_GPU_CHECK(cuda, "x", cudaErrorLaunchFailure);
    CT_EXPECT(st == CT_ERR_SYSTEM && strstr(ct_last_error(), "unspecified launch failure"));
    st = CT_GPU_CHECK(cublas, "gemm", CUBLAS_STATUS_ALLOC_FAILED);
    CT_EXPECTF(st == CT_ERR_NOMEM && strstr(ct_last_error(), "gemm on cuda:"), "%d %s", (int)st, ct_last_error());
    CT_EXPECT(CT_GPU_CHECK(cublas, "gemm", CUBLAS_STATUS_NOT_SUPPORTED) == CT_ERR_UNSUPPORTED);
    st = CT_GPU_CHECK(nccl, "all_reduce #3 on rank 1", ncclRemoteError);
    CT_EXPECTF(st == CT_ERR_PEER && strstr(ct_last_error(), "all_reduce #3 on rank 1 on cuda:") &&
                   strstr(ct_last_error(), "ncclRemoteError failed"),
               "%d %s", (int)st, ct_last_error());
    CT_EXPECT(CT_GPU_CHECK(nccl, "x", ncclInvalidUsage) == CT_ERR_INVALID);
}

CT_TEST(device_count_is_clean) {
    int n = -1;
    ct_status st = ct_cuda_device_count(&n);
    /* without a driver or GPU: an error naming the call and the reason, never a crash */
    CT_EXPECTF(st == CT_OK ? n > 0 || n == 0 : (st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "cudaGetDeviceCount")),
               "status %d, %s", (int)st, ct_last_error());
}

CT_TEST(nccl_backend_without_gpu_fails_cleanly) {
    if (have_gpu()) CT_SKIP("a CUDA GPU is present: the nccl_world1 test covers the backend");
    ct_dist_opts o = ct_dist_default_opts();
    o.rank = 0;
    o.world_size = 1;
    o.backend = "nccl";
    ct_pg *pg = NULL;
    ct_status st = ct_dist_init(&o, &pg);
    CT_EXPECT(st == CT_ERR_UNSUPPORTED && pg == NULL);
    CT_EXPECTF(strstr(ct_last_error(), "nccl backend needs a GPU") != NULL, "message: %s", ct_last_error());
}

/* Without a GPU every entry point returns an error naming the op and the call; none crashes
 * (a launch without a driver fails at the launch check, cuBLASLt still loads). */
CT_TEST(calls_without_gpu_fail_cleanly) {
    if (have_gpu()) CT_SKIP("a CUDA GPU is present: the other tests run the real thing");
    void *p = (void *)1;
    ct_status st = ct_cuda_alloc(0, 1024, &p);
    CT_EXPECTF(st == CT_ERR_UNSUPPORTED && p == NULL && strstr(ct_last_error(), "alloc on cuda:?"), "alloc: %d %s", (int)st,
               ct_last_error());
    st = ct_cuda_gelu(NULL, NULL, NULL, 10, false);
    CT_EXPECTF(st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "gelu on cuda:?: cudaGetLastError()"), "gelu: %d %s",
               (int)st, ct_last_error());
    ct_cuda_gemm_desc d = {CT_CUDA_F32, false, false, 4, 4, 4, 1, 1.0f, 0.0f, CT_GEMM_EPI_NONE, NULL, false};
    st = ct_cuda_gemm(NULL, 0, &d, NULL, NULL, NULL);
    CT_EXPECTF(st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "cuda:?"), "gemm: %d %s", (int)st, ct_last_error());
    char v[512];
    ct_cuda_versions(v, sizeof v);
    CT_EXPECTF(strstr(v, "driver none") && !strstr(v, "cuBLASLt 0.0.0"), "versions: %s", v);
    ct_cuda_mem_stats ms;
    ct_cuda_mem_stats_get(0, &ms);
    CT_EXPECT(ms.current == 0 && ms.mallocs == 0);
}

CT_TEST(elementwise) {
    NEED_GPU();
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t rows = 131, m = 771, n = rows * m;
    ct_tensor *x0 = rnd(c, 2, (int64_t[]){rows, m}, 5.0f), *g = rnd(c, 2, (int64_t[]){rows, m}, 1.0f), *b = rnd(c, 1, &m, 1.0f);
    float *dx = upf(x0), *dg = upf(g), *db = upf(b), *dy = zeros(n), *dgx = zeros(n);
    const char *names[3] = {"gelu", "gelu_tanh", "relu"};
    for (int k = 0; k < 3; k++) {
        ct_tensor *x = ct_new_like(c, x0); /* a fresh leaf: gradients do not mix between ops */
        memcpy(x->data, x0->data, ct_nbytes(x0));
        ct_requires_grad(x);
        ct_tensor *y = k == 2 ? ct_relu(c, x) : ct_gelu(c, x, k == 1);
        ct_backward_seed(c, y, g);
        if (k == 2) {
            OK(ct_cuda_relu(NULL, dx, dy, n));
            OK(ct_cuda_relu_bwd(NULL, dy, dg, dgx, n));
        } else {
            OK(ct_cuda_gelu(NULL, dx, dy, n, k == 1));
            OK(ct_cuda_gelu_bwd(NULL, dx, dg, dgx, n, k == 1));
        }
        char w[64];
        snprintf(w, sizeof w, "%s forward", names[k]);
        EXPECT_CLOSE(w, err_f32(dy, ct_f32(y), n), 1e-5);
        snprintf(w, sizeof w, "%s backward", names[k]);
        EXPECT_CLOSE(w, err_f32(dgx, ct_f32(x->grad), n), 1e-5);
    }
    ct_tensor *sum = ct_add(c, x0, b), *sc = ct_scale(c, x0, -0.37f);
    OK(ct_cuda_add(NULL, dx, db, dy, n, m));
    EXPECT_CLOSE("add", err_f32(dy, ct_f32(sum), n), 1e-6);
    OK(ct_cuda_scale(NULL, dx, -0.37f, dy, n));
    EXPECT_CLOSE("scale", err_f32(dy, ct_f32(sc), n), 1e-6);
    CT_EXPECT(ct_cuda_add(NULL, dx, db, dy, n + 1, m) == CT_ERR_INVALID);
    void *ps[] = {dx, dg, dy, dgx, db};
    for (int i = 0; i < 5; i++) ct_cuda_free(ps[i]);
    ct_ctx_free(c);
}

CT_TEST(layer_norm) {
    NEED_GPU();
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t R = 517, D = 768;
    ct_tensor *x = rnd(c, 2, (int64_t[]){R, D}, 3.0f), *w = rnd(c, 1, &D, 1.5f), *b = rnd(c, 1, &D, 0.5f);
    ct_tensor *g = rnd(c, 2, (int64_t[]){R, D}, 1.0f);
    ct_tensor *ts[3] = {x, w, b};
    for (int i = 0; i < 3; i++) ct_requires_grad(ts[i]);
    ct_tensor *y = ct_layer_norm(c, x, w, b, 1e-5f);
    ct_backward_seed(c, y, g);
    float *dx = upf(x), *dw = upf(w), *db = upf(b), *dg = upf(g), *dy = zeros(R * D), *mean = zeros(R), *rstd = zeros(R);
    float *gx = zeros(R * D), *gw = zeros(D), *gb = zeros(D);
    OK(ct_cuda_layer_norm(NULL, dx, dw, db, dy, mean, rstd, R, D, 1e-5f));
    OK(ct_cuda_layer_norm_bwd(NULL, dx, dg, dw, mean, rstd, gx, gw, gb, R, D));
    EXPECT_CLOSE("layer_norm forward", err_f32(dy, ct_f32(y), R * D), 1e-5);
    EXPECT_CLOSE("layer_norm dx", err_f32(gx, ct_f32(x->grad), R * D), 1e-5);
    EXPECT_CLOSE("layer_norm dw", err_f32(gw, ct_f32(w->grad), D), 1e-5);
    EXPECT_CLOSE("layer_norm db", err_f32(gb, ct_f32(b->grad), D), 1e-5);
    void *ps[] = {dx, dw, db, dg, dy, mean, rstd, gx, gw, gb};
    for (int i = 0; i < 10; i++) ct_cuda_free(ps[i]);
    ct_ctx_free(c);
}

CT_TEST(cross_entropy) {
    NEED_GPU();
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t N = 301, C = 50257;
    ct_tensor *x = rnd(c, 2, (int64_t[]){N, C}, 6.0f), *t = ct_new(c, CT_I64, 1, &N);
    for (int64_t r = 0; r < N; r++) ((int64_t *)t->data)[r] = r % 17 == 3 ? -100 : (r * 7919) % C;
    ct_requires_grad(x);
    ct_tensor *loss = ct_cross_entropy(c, x, t, -100);
    ct_backward(c, loss);
    float *dx = upf(x), *lse = zeros(N), *out = zeros(2), *gx = zeros(N * C), one = 1.0f, *done = up(&one, sizeof one);
    int64_t *dt = up(t->data, ct_nbytes(t));
    OK(ct_cuda_cross_entropy(NULL, dx, dt, true, N, C, -100, lse, out));
    OK(ct_cuda_cross_entropy_bwd(NULL, dx, dt, true, N, C, -100, lse, out, done, gx));
    EXPECT_CLOSE("cross_entropy loss", err_f32(out, ct_f32(loss), 1), 1e-5);
    EXPECT_CLOSE("cross_entropy gradient", err_f32(gx, ct_f32(x->grad), N * C), 1e-5);
    void *ps[] = {dx, lse, out, gx, done, dt};
    for (int i = 0; i < 6; i++) ct_cuda_free(ps[i]);
    ct_ctx_free(c);
}

CT_TEST(embedding) {
    NEED_GPU();
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t V = 1000, D = 768, n = 2048;
    ct_tensor *w = rnd(c, 2, (int64_t[]){V, D}, 1.0f), *idx = ct_new(c, CT_I32, 1, &n);
    for (int64_t r = 0; r < n; r++) ((int32_t *)idx->data)[r] = (int32_t)((r * r + 7) % V); /* repeats */
    ct_requires_grad(w);
    ct_tensor *y = ct_embedding(c, w, idx), *g = rnd(c, 2, (int64_t[]){n, D}, 1.0f);
    ct_backward_seed(c, y, g);
    float *dw = upf(w), *dy = zeros(n * D), *dg = upf(g), *gw = zeros(V * D);
    int32_t *di = up(idx->data, ct_nbytes(idx));
    int *bad = up(NULL, sizeof(int)), hbad = -1;
    OK(ct_cuda_embedding(NULL, dw, di, false, n, V, D, dy, bad));
    OK(ct_cuda_embedding_bwd(NULL, dg, di, false, n, V, D, gw));
    EXPECT_CLOSE("embedding forward", err_f32(dy, ct_f32(y), n * D), 0);
    EXPECT_CLOSE("embedding backward", err_f32(gw, ct_f32(w->grad), V * D), 1e-6);
    CT_EXPECT(cudaMemcpy(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost) == cudaSuccess && hbad == 0);
    int32_t oob = (int32_t)V;
    CT_EXPECT(cudaMemcpy(di, &oob, sizeof oob, cudaMemcpyHostToDevice) == cudaSuccess);
    OK(ct_cuda_embedding(NULL, dw, di, false, n, V, D, dy, bad));
    CT_EXPECT(cudaMemcpy(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost) == cudaSuccess && hbad == 1);
    void *ps[] = {dw, dy, dg, gw, di, bad};
    for (int i = 0; i < 6; i++) ct_cuda_free(ps[i]);
    ct_ctx_free(c);
}

static void check_optim(bool adamw) {
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_param(P, "w", 2, (int64_t[]){513, 257}, CT_INIT_NORMAL, 0.5);
    ct_param(P, "b", 1, (int64_t[]){257}, CT_INIT_NORMAL, 0.5);
    CT_ASSERT(ct_params_finalize(P, 3) == CT_OK);
    int64_t n = (int64_t)ct_params_numel(P);
    float *p = up(ct_params_data(P), (size_t)n * 4), *g = zeros(n), *s1 = zeros(n), *s2 = zeros(n);
    ct_adamw_opts ao = ct_adamw_default_opts();
    ct_sgd_opts so = ct_sgd_default_opts();
    so.momentum = 0.9;
    so.weight_decay = 1e-3;
    ct_optim *o;
    CT_ASSERT((adamw ? ct_optim_create_adamw(P, &ao, &o) : ct_optim_create_sgd(P, &so, &o)) == CT_OK);
    for (int step = 1; step <= 3; step++) {
        float *G = ct_params_grad(P);
        for (int64_t i = 0; i < n; i++) G[i] = urand(1.0f);
        CT_ASSERT(cudaMemcpy(g, G, (size_t)n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        double lr = 1e-2;
        ct_optim_step(o, lr);
        if (adamw) {
            ct_k_adamw k = ct_k_adamw_consts(ao.beta1, ao.beta2, ao.eps, ao.weight_decay, lr, step, false);
            OK(ct_cuda_adamw(NULL, &k, p, g, s1, s2, NULL, n));
        } else {
            ct_k_sgd k = ct_k_sgd_consts(so.momentum, so.dampening, so.weight_decay, false, false, lr, step == 1);
            OK(ct_cuda_sgd(NULL, &k, p, g, s1, n));
        }
    }
    EXPECT_CLOSE(adamw ? "adamw" : "sgd", err_f32(p, ct_params_data(P), n), 1e-6);
    void *ps[] = {p, g, s1, s2};
    for (int i = 0; i < 4; i++) ct_cuda_free(ps[i]);
    ct_optim_free(o);
    ct_params_free(P);
}
CT_TEST(adamw) { NEED_GPU(); check_optim(true); }
CT_TEST(sgd) { NEED_GPU(); check_optim(false); }

/* a 2-byte dtype's host type, name, and the tolerance of its results (their rounding, 2^-9
 * for bf16 and 2^-12 for f16, with room for sums in another order) */
static ct_dtype host16(ct_cuda_dtype dt) { return dt == CT_CUDA_F16 ? CT_F16 : CT_BF16; }
static const char *dt_name(ct_cuda_dtype dt) { return dt == CT_CUDA_F16 ? "f16" : dt == CT_CUDA_BF16 ? "bf16" : "f32"; }
static double tol16(ct_cuda_dtype dt) { return dt == CT_CUDA_F16 ? 1e-3 : 1e-2; }
/* bf16 or f16 copies (round to nearest even) of n floats, and the f32 values they hold */
static void *to_16(ct_cuda_dtype dt, const float *x, int64_t n, float *rounded) {
    uint16_t *h = malloc((size_t)n * 2);
    ct_convert(h, host16(dt), x, CT_F32, (size_t)n);
    ct_convert(rounded, CT_F32, h, host16(dt), (size_t)n);
    void *d = up(h, (size_t)n * 2);
    free(h);
    return d;
}
static double err_16(ct_cuda_dtype dt, const void *d, const float *ref, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    float *f = malloc((size_t)n * 4);
    if (cudaMemcpy(h, d, (size_t)n * 2, cudaMemcpyDeviceToHost) != cudaSuccess) abort();
    ct_convert(f, CT_F32, h, host16(dt), (size_t)n);
    double e = normwise(f, ref, n);
    free(h);
    free(f);
    return e;
}

/* bf16 or f16: operands, C and bias of that type, or (c_f32, autocast's GEMMs) an f32 C and bias */
static void check_gemm_c(ct_cuda_dtype dt, bool c_f32, bool ta, bool tb, int64_t batch, ct_gemm_epilogue epi) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t M = 129, N = 200, K = 96;
    int64_t sa[3] = {batch, ta ? K : M, ta ? M : K}, sb[3] = {batch, tb ? N : K, tb ? K : N};
    ct_tensor *a = rnd(c, 3, sa, 1.0f), *b = rnd(c, 3, sb, 1.0f), *bias = rnd(c, 1, &N, 1.0f);
    void *da, *db, *dbias, *dc;
    const bool lp = dt != CT_CUDA_F32;
    if (lp) { /* both sides from the same rounded inputs */
        da = to_16(dt, ct_f32(a), ct_numel(a), ct_f32(a));
        db = to_16(dt, ct_f32(b), ct_numel(b), ct_f32(b));
        dbias = c_f32 ? upf(bias) : to_16(dt, ct_f32(bias), N, ct_f32(bias));
        dc = c_f32 ? zeros(batch * M * N) : up(NULL, (size_t)(batch * M * N) * 2);
    } else {
        da = upf(a); db = upf(b); dbias = upf(bias); dc = zeros(batch * M * N);
    }
    ct_tensor *y = ct_matmul(c, batch == 1 ? ct_reshape(c, a, 2, sa + 1) : a, batch == 1 ? ct_reshape(c, b, 2, sb + 1) : b, ta, tb);
    if (epi == CT_GEMM_EPI_BIAS || epi == CT_GEMM_EPI_BIAS_GELU) y = ct_add(c, y, bias);
    if (epi == CT_GEMM_EPI_GELU || epi == CT_GEMM_EPI_BIAS_GELU) y = ct_gelu(c, y, true);
    ct_cuda_gemm_desc d = {dt, ta, tb, M, N, K, batch, 1.0f, 0.0f, epi, dbias, lp && c_f32};
    OK(ct_cuda_gemm(NULL, 0, &d, da, db, dc));
    char w[96];
    snprintf(w, sizeof w, "gemm %s%s ta=%d tb=%d batch=%lld epilogue=%d", dt_name(dt), lp && c_f32 ? "->f32" : "", ta, tb,
             (long long)batch, (int)epi);
    bool c16 = lp && !c_f32; /* an f32 C from 2-byte operands: exact products, f32 sums */
    double e = c16 ? err_16(dt, dc, ct_f32(y), batch * M * N) : err_f32(dc, ct_f32(y), batch * M * N);
    EXPECT_CLOSE(w, e, c16 ? tol16(dt) : 1e-5);
    void *ps[] = {da, db, dbias, dc};
    for (int i = 0; i < 4; i++) ct_cuda_free(ps[i]);
    ct_ctx_free(c);
}
static void check_gemm(ct_cuda_dtype dt, bool ta, bool tb, int64_t batch, ct_gemm_epilogue epi) {
    check_gemm_c(dt, false, ta, tb, batch, epi);
}
CT_TEST(gemm_f32) {
    NEED_GPU();
    for (int t = 0; t < 4; t++) check_gemm(CT_CUDA_F32, t & 1, t & 2, 1, CT_GEMM_EPI_NONE);
    check_gemm(CT_CUDA_F32, false, true, 3, CT_GEMM_EPI_NONE);
    check_gemm(CT_CUDA_F32, false, true, 1, CT_GEMM_EPI_BIAS);
    check_gemm(CT_CUDA_F32, false, true, 1, CT_GEMM_EPI_BIAS_GELU);
}
/* CTRAIN_CUDA_MATMUL on f32 operands: highest computes in f32 (<= 1e-5); high (TF32) and
 * medium (bf16 tensor cores) must round visibly (> 1e-5) but stay within their precision, so
 * the switch is seen to take effect. Then operands at a 4-byte offset (a view's pointer):
 * the heuristic is told the real alignment and the product is right. */
CT_TEST(gemm_matmul_precision_and_alignment) {
    NEED_GPU();
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t M = 256, N = 192, K = 320;
    ct_tensor *a = rnd(c, 2, (int64_t[]){M, K}, 1.0f), *b = rnd(c, 2, (int64_t[]){K, N}, 1.0f);
    ct_tensor *y = ct_matmul(c, a, b, false, false);
    float *da = upf(a), *db = upf(b), *dc = zeros(M * N);
    const char *prec[3] = {"highest", "high", "medium"};
    const double lo[3] = {0, 1e-5, 1e-5}, hi[3] = {1e-5, 2e-3, 1e-2};
    for (int i = 0; i < 3; i++) {
        CT_ASSERT(ct_config_set("CTRAIN_CUDA_MATMUL", prec[i]) == CT_OK);
        ct_cuda_gemm_desc d = {CT_CUDA_F32, false, false, M, N, K, 1, 1.0f, 0.0f, CT_GEMM_EPI_NONE, NULL, false};
        OK(ct_cuda_gemm(NULL, 0, &d, da, db, dc));
        double e = err_f32(dc, ct_f32(y), M * N);
        CT_EXPECTF(e > lo[i] && e <= hi[i], "CTRAIN_CUDA_MATMUL=%s: error %g, expected in (%g, %g]", prec[i], e, lo[i], hi[i]);
        printf("    f32 GEMM %lldx%lldx%lld, CTRAIN_CUDA_MATMUL=%s: normwise error %.2e\n", (long long)M, (long long)N,
               (long long)K, prec[i], e);
    }
    CT_ASSERT(ct_config_unset("CTRAIN_CUDA_MATMUL") == CT_OK);
    /* A [M-1, K-1] and B [K-1, N] read from the second element of a's and b's data, C written
     * from its second: every pointer only 4-byte aligned */
    float *oc = zeros(M * N + 1);
    ct_tensor *a1 = ct_from_data(c, CT_F32, ct_f32(a) + 1, 2, (int64_t[]){M - 1, K - 1});
    ct_tensor *b1 = ct_from_data(c, CT_F32, ct_f32(b) + 1, 2, (int64_t[]){K - 1, N});
    ct_tensor *y1 = ct_matmul(c, a1, b1, false, false);
    ct_cuda_gemm_desc d = {CT_CUDA_F32, false, false, M - 1, N, K - 1, 1, 1.0f, 0.0f, CT_GEMM_EPI_NONE, NULL, false};
    OK(ct_cuda_gemm(NULL, 0, &d, da + 1, db + 1, oc + 1));
    double e1 = err_f32(oc + 1, ct_f32(y1), (M - 1) * N);
    CT_EXPECTF(e1 <= 1e-5, "GEMM on 4-byte aligned operands: error %g", e1);
    void *ps[] = {da, db, dc, oc};
    for (int i = 0; i < 4; i++) ct_cuda_free(ps[i]);
    ct_ctx_free(c);
}

/* 2-byte operands: C of their type, then autocast's f32 C (built, not yet run on a GPU) */
static void check_gemm_16(ct_cuda_dtype dt) {
    for (int t = 0; t < 4; t++) check_gemm(dt, t & 1, t & 2, 1, CT_GEMM_EPI_NONE);
    check_gemm(dt, false, true, 2, CT_GEMM_EPI_NONE);
    check_gemm(dt, false, true, 1, CT_GEMM_EPI_BIAS_GELU);
    for (int t = 0; t < 4; t++) check_gemm_c(dt, true, t & 1, t & 2, 1, CT_GEMM_EPI_NONE);
    check_gemm_c(dt, true, false, true, 2, CT_GEMM_EPI_NONE);
    check_gemm_c(dt, true, false, true, 1, CT_GEMM_EPI_BIAS);
}
CT_TEST(gemm_bf16) { NEED_GPU(); check_gemm_16(CT_CUDA_BF16); }
CT_TEST(gemm_f16) { NEED_GPU(); check_gemm_16(CT_CUDA_F16); }

static void check_attention(ct_cuda_dtype dt, int64_t T, int D, bool causal) {
    ct_ctx *c;
    CT_ASSERT(ct_ctx_create(NULL, &c) == CT_OK);
    const int64_t B = 2, H = 3, sh[4] = {B, H, T, D}, n = B * H * T * D, BH = B * H;
    ct_tensor *q = rnd(c, 4, sh, 2.0f), *k = rnd(c, 4, sh, 2.0f), *v = rnd(c, 4, sh, 1.0f), *g = rnd(c, 4, sh, 1.0f);
    void *dq, *dk, *dv, *dg;
    const bool lp = dt != CT_CUDA_F32;
    size_t es = lp ? 2 : 4;
    if (lp) {
        dq = to_16(dt, ct_f32(q), n, ct_f32(q)); dk = to_16(dt, ct_f32(k), n, ct_f32(k));
        dv = to_16(dt, ct_f32(v), n, ct_f32(v)); dg = to_16(dt, ct_f32(g), n, ct_f32(g));
    } else {
        dq = upf(q); dk = upf(k); dv = upf(v); dg = upf(g);
    }
    ct_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) ct_requires_grad(in[i]);
    ct_tensor *y = ct_flash_attention(c, q, k, v, causal);
    ct_backward_seed(c, y, g);
    void *o = up(NULL, (size_t)n * es), *gq = up(NULL, (size_t)n * es), *gk = up(NULL, (size_t)n * es);
    void *gv = up(NULL, (size_t)n * es);
    float *lse = zeros(BH * T), *dr = zeros(BH * T);
    OK(ct_cuda_attention(NULL, dt, dq, dk, dv, o, lse, BH, T, D, causal));
    OK(ct_cuda_attention_bwd(NULL, dt, dq, dk, dv, o, dg, lse, dr, gq, gk, gv, BH, T, D, causal));
    const void *got[4] = {o, gq, gk, gv};
    const float *ref[4] = {ct_f32(y), ct_f32(q->grad), ct_f32(k->grad), ct_f32(v->grad)};
    const char *nm[4] = {"O", "dQ", "dK", "dV"};
    for (int p = 0; p < 4; p++) {
        char w[96];
        snprintf(w, sizeof w, "attention %s T=%lld D=%d causal=%d %s", dt_name(dt), (long long)T, D, causal, nm[p]);
        EXPECT_CLOSE(w, lp ? err_16(dt, got[p], ref[p], n) : err_f32(got[p], ref[p], n), lp ? tol16(dt) : 1e-5);
    }
    void *ps[] = {dq, dk, dv, dg, o, gq, gk, gv, lse, dr};
    for (int i = 0; i < 10; i++) ct_cuda_free(ps[i]);
    ct_ctx_free(c);
}
CT_TEST(attention_f32) {
    NEED_GPU();
    check_attention(CT_CUDA_F32, 257, 64, true);
    check_attention(CT_CUDA_F32, 100, 32, false);
    check_attention(CT_CUDA_F32, 64, 128, true);
}
CT_TEST(attention_bf16) {
    NEED_GPU();
    check_attention(CT_CUDA_BF16, 257, 64, true);
    check_attention(CT_CUDA_BF16, 100, 32, false);
}
CT_TEST(attention_f16) {
    NEED_GPU();
    check_attention(CT_CUDA_F16, 257, 64, true);
    check_attention(CT_CUDA_F16, 100, 32, false);
}
/* the tiled kernels (CTRAIN_CUDA_ATTENTION=tiled): head dims 32 and 64, partial tiles, every
 * dtype, against the same CPU op */
CT_TEST(attention_tiled) {
    NEED_GPU();
    CT_ASSERT(ct_config_set("CTRAIN_CUDA_ATTENTION", "tiled") == CT_OK);
    check_attention(CT_CUDA_F32, 257, 64, true);
    check_attention(CT_CUDA_F32, 100, 32, false);
    check_attention(CT_CUDA_F32, 64, 64, false);
    check_attention(CT_CUDA_F32, 130, 32, true);
    for (ct_cuda_dtype dt = CT_CUDA_BF16; dt <= CT_CUDA_F16; dt++) {
        check_attention(dt, 257, 64, true);
        check_attention(dt, 100, 32, false);
    }
    CT_ASSERT(ct_config_unset("CTRAIN_CUDA_ATTENTION") == CT_OK);
}
/* a tensor-core family (bf16/f16) of CTRAIN_CUDA_ATTENTION against the CPU op: P and dS enter
 * their products rounded, within the same 16-bit tolerances; where it does not fit it falls
 * back (f32 to the tiled kernels; mma's head dim 128 to tc's) */
static void check_attention_family(const char *fam) {
    CT_ASSERT(ct_config_set("CTRAIN_CUDA_ATTENTION", fam) == CT_OK);
    for (ct_cuda_dtype dt = CT_CUDA_BF16; dt <= CT_CUDA_F16; dt++) {
        check_attention(dt, 1024, 64, true); /* GPT-2's head */
        check_attention(dt, 257, 64, true);
        check_attention(dt, 100, 32, false);
        check_attention(dt, 130, 128, true);
    }
    check_attention(CT_CUDA_F32, 130, 32, true);
    CT_ASSERT(ct_config_unset("CTRAIN_CUDA_ATTENTION") == CT_OK);
}
/* WMMA */
CT_TEST(attention_tc) { NEED_GPU(); check_attention_family("tc"); }
/* mma.sync with the tiles in registers */
CT_TEST(attention_mma) { NEED_GPU(); check_attention_family("mma"); }
CT_TEST(attention_bad_head_dim) { /* checked before any launch: runs without a GPU too */
    ct_status st = ct_cuda_attention(NULL, CT_CUDA_F32, NULL, NULL, NULL, NULL, NULL, 1, 4, CT_K_ATTN_MAX_D + 1, true);
    CT_EXPECT(st == CT_ERR_INVALID && strstr(ct_last_error(), "head dim"));
}

CT_TEST(allocator_caches) {
    NEED_GPU();
    ct_cuda_mem_stats s0, s1, s2;
    ct_cuda_mem_stats_get(0, &s0);
    void *a, *b;
    OK(ct_cuda_alloc(0, 3 << 20, &a));
    ct_cuda_free(a);
    ct_cuda_mem_stats_get(0, &s1);
    for (int i = 0; i < 10; i++) { /* the same size again and again: no cudaMalloc */
        OK(ct_cuda_alloc(0, 3 << 20, &b));
        ct_cuda_free(b);
    }
    ct_cuda_mem_stats_get(0, &s2);
    CT_EXPECT_EQ(s2.mallocs, s1.mallocs);
    CT_EXPECT(s1.peak >= s0.current + (3u << 20));
    CT_EXPECT_EQ(s2.current, s0.current);
    /* more than the GPU has: CT_ERR_NOMEM naming the call and device, nothing leaked */
    void *huge = NULL;
    ct_status st = ct_cuda_alloc(0, (size_t)1 << 50, &huge);
    CT_EXPECTF(st == CT_ERR_NOMEM && huge == NULL && strstr(ct_last_error(), "cudaMalloc") && strstr(ct_last_error(), "cuda:0"),
               "status %d: %s", (int)st, ct_last_error());
    ct_cuda_mem_stats_get(0, &s1);
    CT_EXPECT_EQ(s1.current, s0.current);
}

CT_TEST(nccl_world1) {
    NEED_GPU();
    ct_pg *pg = NULL;
    ct_status st = nccl_world1(&pg);
    CT_ASSERT(st == CT_OK || (fprintf(stderr, "%s\n", ct_last_error()), 0));
    CT_EXPECT(!strcmp(ct_pg_backend(pg), "nccl"));
    float h[1000];
    for (int i = 0; i < 1000; i++) h[i] = (float)i;
    float *d = up(h, sizeof h);
    OK(ct_all_reduce_sync(pg, d, 1000, CT_F32, CT_RED_AVG));
    OK(ct_barrier_sync(pg));
    EXPECT_CLOSE("nccl all_reduce (avg, world 1)", err_f32(d, h, 1000), 0);
    ct_cuda_free(d);
    ct_pg_free(pg);
}

CT_TEST_MAIN()
