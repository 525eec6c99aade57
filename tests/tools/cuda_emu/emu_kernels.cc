// The kernels of src/cuda run on the CPU under cuda_emu.h, against the CPU ops of libctrain,
// with the tolerances of tests/gpu (1e-5 normwise in f32; bit-equal where the GPU tests ask
// for it). tests/scripts/cuda_emu.sh builds and runs this. Device pointers are host pointers.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <condition_variable>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda_emu.h"
extern "C" {
#include "ctrain/autograd.h"
#include "ctrain/config.h"
#include "ctrain/ops.h"
#include "ctrain/tensor.h"
#include "cuda/cuda.h"
}
#include "ops/kmath.h"

// the launch check of CT_LAUNCHED (src/cuda/runtime.c is not part of the emulation)
extern "C" ct_status ct_gpu_check_cuda(int code, const char *call, const char *op) {
    (void)call;
    (void)op;
    return code == 0 ? CT_OK : CT_ERR_SYSTEM;
}

// device memory is host memory (the kernels' wrappers take scratch from the allocator)
extern "C" ct_status ct_cuda_alloc(int dev, size_t bytes, void **out) {
    (void)dev;
    *out = malloc(bytes ? bytes : 1);
    return *out ? CT_OK : CT_ERR_NOMEM;
}
extern "C" void ct_cuda_free(void *p) { free(p); }

// ---- the checks ----
namespace {
int failures, checks;
// a shape for one call (C++ has no compound literals): 16 of them in turn
const int64_t *sh(std::initializer_list<int64_t> l) {
    static int64_t pool[16][8];
    static int next;
    int64_t *p = pool[next++ % 16];
    int i = 0;
    for (int64_t v : l) p[i++] = v;
    return p;
}
uint64_t rs = 0x1234567;
float rnd() {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) / 16777216.0 * 2 - 1);
}
ct_tensor *rnd_t(ct_ctx *c, int nd, const int64_t *sh, float scale) {
    ct_tensor *t = ct_new(c, CT_F32, nd, sh);
    for (int64_t i = 0; i < ct_numel(t); i++) ct_f32(t)[i] = scale * rnd();
    return t;
}
double normwise(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) d += (double)(a[i] - b[i]) * (a[i] - b[i]), s += (double)b[i] * b[i];
    return sqrt(d / (s > 0 ? s : 1));
}
// the second pass of the elementwise checks: sizes (and a repeating operand) of multiples of 8,
// so that the 8-wide kernels run where the first pass's odd sizes take the scalar ones
bool wide8;
void expect(const char *what, double err, double tol) {
    checks++;
    bool ok = err <= tol;
    if (!ok) failures++;
    char w[160];
    snprintf(w, sizeof w, "%s%s", what, wide8 ? " (8-wide)" : "");
    printf("%s %-44s error %.2e (<= %.0e)\n", ok ? "ok  " : "FAIL", w, err, tol);
}
void expect_ok(const char *what, ct_status st) {
    if (st != CT_OK) {
        failures++;
        printf("FAIL %s: status %d\n", what, (int)st);
    }
}
#define RUN(call) expect_ok(#call, call)

void elementwise(ct_ctx *c) {
    const int64_t rows = wide8 ? 16 : 13, m = wide8 ? 96 : 97, n = rows * m;
    ct_tensor *x0 = rnd_t(c, 2, sh({rows, m}), 5.0f), *g = rnd_t(c, 2, sh({rows, m}), 1.0f);
    std::vector<float> y(n), dx(n);
    const char *names[5] = {"gelu", "gelu tanh", "relu", "tanh", "sigmoid"};
    for (int k = 0; k < 5; k++) {
        ct_tensor *x = ct_new_like(c, x0);
        memcpy(x->data, x0->data, ct_nbytes(x0));
        ct_requires_grad(x);
        ct_tensor *r = k < 2 ? ct_gelu(c, x, k == 1) : k == 2 ? ct_relu(c, x) : k == 3 ? ct_tanh(c, x) : ct_sigmoid(c, x);
        ct_backward_seed(c, r, g);
        if (k < 2) {
            RUN(ct_cuda_gelu(NULL, ct_f32(x0), y.data(), n, k == 1));
            RUN(ct_cuda_gelu_bwd(NULL, ct_f32(x0), ct_f32(g), dx.data(), n, k == 1));
        } else if (k == 2) {
            RUN(ct_cuda_relu(NULL, ct_f32(x0), y.data(), n));
            RUN(ct_cuda_relu_bwd(NULL, y.data(), ct_f32(g), dx.data(), n));
        } else {
            RUN(ct_cuda_tanh(NULL, ct_f32(x0), y.data(), n, k == 4));
            RUN(ct_cuda_tanh_bwd(NULL, y.data(), ct_f32(g), dx.data(), n, k == 4));
        }
        char w[96];
        snprintf(w, sizeof w, "%s forward", names[k]);
        expect(w, normwise(y.data(), ct_f32(r), n), 1e-5);
        snprintf(w, sizeof w, "%s backward", names[k]);
        expect(w, normwise(dx.data(), ct_f32(x->grad), n), 1e-5);
    }
    ct_tensor *prod = ct_mul(c, x0, g), *sc = ct_scale(c, x0, -0.37f);
    RUN(ct_cuda_mul(NULL, ct_f32(x0), ct_f32(g), y.data(), n));
    expect("mul", normwise(y.data(), ct_f32(prod), n), 0);
    RUN(ct_cuda_scale(NULL, ct_f32(x0), -0.37f, y.data(), n));
    expect("scale", normwise(y.data(), ct_f32(sc), n), 0);
    // dropout: each element kept or not by its index's hash (ops/kmath.h), forward and backward
    const uint64_t key = 0x243f6a8885a308d3ull;
    std::vector<float> want(n), wantg(n);
    for (int64_t i = 0; i < n; i++) {
        want[i] = ct_f32(x0)[i] * ct_k_dropout(key, i, 0.3f, 1.0f / 0.7f);
        wantg[i] = ct_f32(g)[i] * ct_k_dropout(key, i, 0.3f, 1.0f / 0.7f);
    }
    const ct_cuda_map dm = {CT_CUDA_MAP_DROPOUT, 1.0f / 0.7f, key, 0.3f};
    RUN(ct_cuda_dropout(NULL, ct_f32(x0), y.data(), n, key, 0.3f, 1.0f / 0.7f));
    RUN(ct_cuda_map_bwd(NULL, &dm, NULL, CT_CUDA_CAST_F32, ct_f32(g), dx.data(), n));
    expect("dropout forward, backward (bits)", (memcmp(y.data(), want.data(), n * 4) != 0) + (memcmp(dx.data(), wantg.data(), n * 4) != 0),
           0);
    ct_tensor *b = rnd_t(c, 1, &m, 1.0f), *sum = ct_add(c, x0, b);
    RUN(ct_cuda_add(NULL, ct_f32(x0), ct_f32(b), y.data(), n, m));
    expect("add (broadcast)", normwise(y.data(), ct_f32(sum), n), 0);
    // a transpose as a strided copy, and back with a strided add
    ct_tensor *t = ct_contiguous(c, ct_transpose(c, x0, 0, 1));
    ct_cuda_layout l = {2, {m, rows}, {1, m}};
    RUN(ct_cuda_strided_copy(NULL, y.data(), ct_f32(x0), &l));
    expect("strided copy (transpose)", normwise(y.data(), ct_f32(t), n), 0);
    std::vector<float> acc(n, 0.0f);
    RUN(ct_cuda_strided_add(NULL, acc.data(), &l, y.data()));
    expect("strided add (transpose back)", normwise(acc.data(), ct_f32(x0), n), 0);
    // split heads ([B, T, H, D] -> [B, H, T, D]) and a slice of the last dim (dims merged)
    ct_tensor *x4 = rnd_t(c, 4, sh({2, 5, 3, 7}), 1.0f);
    ct_tensor *p4 = ct_contiguous(c, ct_transpose(c, x4, 1, 2)), *s4 = ct_contiguous(c, ct_slice(c, x4, 3, 2, 4));
    ct_cuda_layout lp = {4, {2, 3, 5, 7}, {105, 7, 21, 1}}, ls = {4, {2, 5, 3, 4}, {105, 21, 7, 1}};
    std::vector<float> y4(210), a4(210, 0.0f);
    RUN(ct_cuda_strided_copy(NULL, y4.data(), ct_f32(x4), &lp));
    expect("strided copy (split heads)", normwise(y4.data(), ct_f32(p4), 210), 0);
    RUN(ct_cuda_strided_add(NULL, a4.data(), &lp, y4.data()));
    expect("strided add (merge heads)", normwise(a4.data(), ct_f32(x4), 210), 0);
    RUN(ct_cuda_strided_copy(NULL, y4.data(), ct_f32(x4) + 2, &ls));
    expect("strided copy (slice, merged dims)", normwise(y4.data(), ct_f32(s4), 120), 0);
    // the 2-byte copy (autocast's bf16 views): split heads of bf16 values, bit for bit
    std::vector<uint16_t> h4(210), hp(210), hy(210);
    ct_convert(h4.data(), CT_BF16, ct_f32(x4), CT_F32, 210);
    ct_convert(hp.data(), CT_BF16, ct_f32(p4), CT_F32, 210);
    RUN(ct_cuda_strided_copy16(NULL, hy.data(), h4.data(), &lp));
    expect("strided copy, 2-byte (split heads, bits)", memcmp(hy.data(), hp.data(), 210 * 2) != 0, 0);
}

void rows_ops(ct_ctx *c) {
    const int64_t R = 37, D = wide8 ? 304 : 300; // 304: the 8-wide cross-entropy kernels
    ct_tensor *x = rnd_t(c, 2, sh({R, D}), 3.0f), *g = rnd_t(c, 2, sh({R, D}), 1.0f);
    std::vector<float> y(R * D), dx(R * D);
    for (int lg = 0; lg < 2; lg++) {
        ct_tensor *xl = ct_new_like(c, x);
        memcpy(xl->data, x->data, ct_nbytes(x));
        ct_requires_grad(xl);
        ct_tensor *r = lg ? ct_log_softmax(c, xl) : ct_softmax(c, xl);
        ct_backward_seed(c, r, g);
        RUN(ct_cuda_softmax(NULL, ct_f32(x), y.data(), R, D, lg, 0));
        RUN(ct_cuda_softmax_bwd(NULL, y.data(), ct_f32(g), dx.data(), R, D, lg));
        expect(lg ? "log_softmax forward" : "softmax forward", normwise(y.data(), ct_f32(r), R * D), 1e-5);
        expect(lg ? "log_softmax backward" : "softmax backward", normwise(dx.data(), ct_f32(xl->grad), R * D), 1e-5);
    }
    // the causal form plain attention uses: row r sees keys j <= r % T (T = 10 rows a head)
    {
        const int64_t T = 10, Rc = 4 * T;
        ct_tensor *sc = rnd_t(c, 2, sh({Rc, T}), 3.0f), *m = ct_new_like(c, sc);
        for (int64_t r = 0; r < Rc; r++)
            for (int64_t j = 0; j < T; j++) ct_f32(m)[r * T + j] = j <= r % T ? ct_f32(sc)[r * T + j] : -INFINITY;
        ct_tensor *ref = ct_softmax(c, m);
        std::vector<float> yc(Rc * T);
        RUN(ct_cuda_softmax(NULL, ct_f32(sc), yc.data(), Rc, T, false, T));
        expect("softmax, causal mask", normwise(yc.data(), ct_f32(ref), Rc * T), 1e-6);
    }
    // layer norm, weights and biases accumulated
    ct_tensor *w = rnd_t(c, 1, &D, 1.0f), *bb = rnd_t(c, 1, &D, 1.0f), *xl = ct_new_like(c, x);
    memcpy(xl->data, x->data, ct_nbytes(x));
    ct_requires_grad(xl);
    ct_requires_grad(w);
    ct_requires_grad(bb);
    ct_tensor *r = ct_layer_norm(c, xl, w, bb, 1e-5f);
    ct_backward_seed(c, r, g);
    std::vector<float> mean(R), rstd(R), dw(D, 0.0f), db(D, 0.0f);
    RUN(ct_cuda_layer_norm(NULL, ct_f32(x), ct_f32(w), ct_f32(bb), y.data(), mean.data(), rstd.data(), R, D, 1e-5f));
    RUN(ct_cuda_layer_norm_bwd(NULL, ct_f32(x), ct_f32(g), ct_f32(w), mean.data(), rstd.data(), dx.data(), dw.data(),
                               db.data(), R, D));
    expect("layer_norm forward", normwise(y.data(), ct_f32(r), R * D), 1e-5);
    expect("layer_norm dx", normwise(dx.data(), ct_f32(xl->grad), R * D), 1e-5);
    expect("layer_norm dw", normwise(dw.data(), ct_f32(w->grad), D), 1e-5);
    expect("layer_norm db", normwise(db.data(), ct_f32(bb->grad), D), 1e-5);
    // cross-entropy with an ignored target
    std::vector<int32_t> tgt(R);
    for (int64_t i = 0; i < R; i++) tgt[i] = i == 5 ? -100 : (int32_t)((i * 37) % D);
    ct_tensor *xe = ct_new_like(c, x), *tt = ct_from_data(c, CT_I32, tgt.data(), 1, &R);
    memcpy(xe->data, x->data, ct_nbytes(x));
    ct_requires_grad(xe);
    ct_tensor *loss = ct_cross_entropy(c, xe, tt, -100);
    float lossv = ct_f32(loss)[0];
    ct_backward(c, loss);
    std::vector<float> lse(R), out(2);
    float one = 1.0f;
    RUN(ct_cuda_cross_entropy(NULL, ct_f32(x), tgt.data(), false, R, D, -100, lse.data(), out.data()));
    RUN(ct_cuda_cross_entropy_bwd(NULL, ct_f32(x), tgt.data(), false, R, D, -100, lse.data(), out.data(), &one, dx.data()));
    expect("cross_entropy loss", fabs(out[0] - lossv) / fabs(lossv), 1e-6);
    expect("cross_entropy backward", normwise(dx.data(), ct_f32(xe->grad), R * D), 1e-5);
}

void embedding_pool(ct_ctx *c) {
    const int64_t V = 50, D = 24, n = 77;
    ct_tensor *w = rnd_t(c, 2, sh({V, D}), 1.0f), *g = rnd_t(c, 2, sh({n, D}), 1.0f);
    std::vector<int64_t> idx(n);
    for (int64_t i = 0; i < n; i++) idx[i] = (i * 13) % V;
    ct_requires_grad(w);
    ct_tensor *it = ct_from_data(c, CT_I64, idx.data(), 1, &n), *e = ct_embedding(c, w, it);
    ct_backward_seed(c, e, g);
    std::vector<float> y(n * D), dw(V * D, 0.0f);
    RUN(ct_cuda_embedding(NULL, ct_f32(w), idx.data(), true, n, V, D, y.data(), NULL));
    RUN(ct_cuda_embedding_bwd(NULL, ct_f32(g), idx.data(), true, n, V, D, dw.data()));
    expect("embedding forward", normwise(y.data(), ct_f32(e), n * D), 0);
    expect("embedding backward", normwise(dw.data(), ct_f32(w->grad), V * D), 0);
    // max pooling 3x3 stride 2 padding 1 over odd planes, ties included, and the ReLU form
    const int64_t N = 2, C = 3, H = 11, W = 9;
    for (int relu = 0; relu < 2; relu++) {
        ct_tensor *x = rnd_t(c, 4, sh({N, C, H, W}), 2.0f);
        for (int64_t i = 0; i < ct_numel(x); i++) ct_f32(x)[i] = roundf(ct_f32(x)[i] * 2.0f) * 0.5f;
        ct_requires_grad(x);
        ct_tensor *p = relu ? ct_relu_max_pool2d(c, x, 3, 2, 1) : ct_max_pool2d(c, x, 3, 2, 1);
        ct_tensor *gp = rnd_t(c, 4, p->shape, 1.0f);
        ct_backward_seed(c, p, gp);
        ct_cuda_pool_geom geo = {N * C, H, W, p->shape[2], p->shape[3], 3, 2, 1};
        std::vector<float> py(ct_numel(p)), pdx(ct_numel(x));
        std::vector<int32_t> arg(ct_numel(p));
        RUN(ct_cuda_max_pool(NULL, ct_f32(x), py.data(), arg.data(), &geo, relu));
        RUN(ct_cuda_max_pool_bwd(NULL, ct_f32(gp), py.data(), arg.data(), pdx.data(), &geo, relu, false));
        expect(relu ? "relu_max_pool forward (bits)" : "max_pool forward (bits)", memcmp(py.data(), ct_f32(p), py.size() * 4) != 0, 0);
        expect(relu ? "relu_max_pool backward (bits)" : "max_pool backward (bits)",
               memcmp(pdx.data(), ct_f32(x->grad), pdx.size() * 4) != 0, 0);
    }
}

void pointwise(ct_ctx *c) {
    const int64_t N = 3, C = 5, inner = wide8 ? 32 : 29, n = N * C * inner;
    ct_tensor *x = rnd_t(c, 3, sh({N, C, inner}), 1.0f), *b = rnd_t(c, 1, &C, 1.0f), *y = ct_bias_add(c, x, b);
    std::vector<float> out(n), da(n), dbv(n);
    RUN(ct_cuda_bias_add(NULL, ct_f32(x), ct_f32(b), out.data(), n, C, inner));
    expect("bias_add (bits)", memcmp(out.data(), ct_f32(y), n * 4) != 0, 0);
    ct_tensor *a = rnd_t(c, 1, &n, 2.0f), *bt = rnd_t(c, 1, &n, 2.0f);
    ct_requires_grad(a);
    ct_requires_grad(bt);
    ct_tensor *l = ct_mse_loss(c, a, bt);
    float lv = ct_f32(l)[0], one = 1.0f, m = 0;
    ct_backward(c, l);
    RUN(ct_cuda_mse(NULL, ct_f32(a), ct_f32(bt), n, &m));
    RUN(ct_cuda_mse_bwd(NULL, ct_f32(a), ct_f32(bt), n, &one, da.data(), dbv.data()));
    expect("mse forward", fabs(m - lv) / fabs(lv), 1e-6);
    expect("mse backward", normwise(da.data(), ct_f32(a->grad), n) + normwise(dbv.data(), ct_f32(bt->grad), n), 1e-6);
    // casts: f32 -> bf16 / f16 -> f32, against ct_convert, bit for bit
    std::vector<uint16_t> h(n), hr(n);
    for (int t = 1; t < 3; t++) {
        ct_dtype dt = t == 1 ? CT_BF16 : CT_F16;
        RUN(ct_cuda_cast(NULL, ct_f32(x), CT_CUDA_CAST_F32, h.data(), (ct_cuda_cast_type)t, n));
        ct_convert(hr.data(), dt, ct_f32(x), CT_F32, (size_t)n);
        expect(t == 1 ? "cast f32 -> bf16 (bits)" : "cast f32 -> f16 (bits)", memcmp(h.data(), hr.data(), n * 2) != 0, 0);
        RUN(ct_cuda_cast(NULL, h.data(), (ct_cuda_cast_type)t, out.data(), CT_CUDA_CAST_F32, n));
        std::vector<float> back(n);
        ct_convert(back.data(), CT_F32, hr.data(), dt, (size_t)n);
        expect(t == 1 ? "cast bf16 -> f32 (bits)" : "cast f16 -> f32 (bits)", memcmp(out.data(), back.data(), n * 4) != 0, 0);
        // autocast's rounding of a gradient in place (the device's round hook): the same bits
        std::vector<float> g(ct_f32(x), ct_f32(x) + n);
        RUN(ct_cuda_cast_bwd(NULL, g.data(), (ct_cuda_cast_type)t, g.data(), n));
        expect(t == 1 ? "round to bf16 in place (bits)" : "round to f16 in place (bits)",
               memcmp(g.data(), back.data(), n * 4) != 0, 0);
    }
}

void optim(void) {
    const int64_t n = 40000; // three chunks of the norm, and a tail
    std::vector<float> g(n), p(n), p2(n), m(n, 0.0f), v(n, 0.0f), m2(n, 0.0f), v2(n, 0.0f);
    for (int64_t i = 0; i < n; i++) g[i] = rnd(), p[i] = p2[i] = rnd();
    double ss = 0, part[8], ref = 0;
    RUN(ct_cuda_sumsq(NULL, g.data(), n, part, &ss));
    for (int64_t b = 0; b < n; b += CT_K_SUMSQ_CHUNK)
        ref += ct_k_sumsq(g.data(), (size_t)b, (size_t)(b + CT_K_SUMSQ_CHUNK < n ? b + CT_K_SUMSQ_CHUNK : n));
    expect("gradient sum of squares (bits)", ss != ref, 0);
    ct_k_adamw k = ct_k_adamw_consts(0.9, 0.999, 1e-8, 0.01, 1e-3, 1, false);
    RUN(ct_cuda_adamw(NULL, &k, p.data(), g.data(), m.data(), v.data(), NULL, n));
    for (int64_t i = 0; i < n; i++) ct_k_adamw_elem(&k, &p2[i], g[i], &m2[i], &v2[i], NULL);
    expect("adamw (bits)", memcmp(p.data(), p2.data(), n * 4) != 0, 0);
    std::vector<float> buf(n, 0.0f), buf2(n, 0.0f);
    for (int step = 0; step < 2; step++) { /* momentum's first step, then the buffer's */
        ct_k_sgd ks = ct_k_sgd_consts(0.9, 0.0, 1e-3, true, false, 0.05, step == 0);
        RUN(ct_cuda_sgd(NULL, &ks, p.data(), g.data(), buf.data(), n));
        for (int64_t i = 0; i < n; i++) ct_k_sgd_elem(&ks, &p2[i], g[i], &buf2[i]);
    }
    expect("sgd with Nesterov momentum (bits)", memcmp(p.data(), p2.data(), n * 4) != 0, 0);
    int bad = 0;
    g[n - 1] = INFINITY;
    RUN(ct_cuda_scale_check(NULL, g.data(), 0.5f, n, &bad));
    expect("scale and inf check", bad != 1 || g[0] * 2 != g[0] * 2.0f, 0);
}

// the 2-byte kernels against the f32 kernel (checked against the CPU op first) on the same
// inputs rounded to their type: both compute in f32, so they differ by the outputs' rounding and
// Dr's (from the rounded O), ~2^-9 (bf16) or ~2^-12 (f16) normwise; lse is f32 from the same values
// random q, k, v and dO of n elements rounded to ht: h the 16-bit values, in the same as f32;
// ref and out sized for the results
void rounded_qkvg(int64_t n, ct_dtype ht, std::vector<float> (&in)[4], std::vector<uint16_t> (&h)[4], std::vector<float> (&ref)[4],
                  std::vector<uint16_t> (&out)[4]) {
    for (int i = 0; i < 4; i++) {
        in[i].resize(n), h[i].resize(n), ref[i].resize(n), out[i].resize(n);
        for (float &x : in[i]) x = (i < 2 ? 2.0f : 1.0f) * rnd();
        ct_convert(h[i].data(), ht, in[i].data(), CT_F32, (size_t)n);
        ct_convert(in[i].data(), CT_F32, h[i].data(), ht, (size_t)n);
    }
}
void attention_16(ct_cuda_dtype dt, const char *nm) {
    const int64_t BH = 2, T = 70;
    const int D = 32;
    const int64_t n = BH * T * D;
    const ct_dtype ht = dt == CT_CUDA_BF16 ? CT_BF16 : CT_F16;
    std::vector<float> in[4], ref[4], got(n), lse_ref(BH * T), lse(BH * T), dr(BH * T);
    std::vector<uint16_t> h[4], out[4];
    rounded_qkvg(n, ht, in, h, ref, out);
    RUN(ct_cuda_attention(NULL, CT_CUDA_F32, in[0].data(), in[1].data(), in[2].data(), ref[0].data(), lse_ref.data(), BH, T,
                          D, true));
    RUN(ct_cuda_attention_bwd(NULL, CT_CUDA_F32, in[0].data(), in[1].data(), in[2].data(), ref[0].data(), in[3].data(),
                              lse_ref.data(), dr.data(), ref[1].data(), ref[2].data(), ref[3].data(), BH, T, D, true));
    RUN(ct_cuda_attention(NULL, dt, h[0].data(), h[1].data(), h[2].data(), out[0].data(), lse.data(), BH, T, D, true));
    RUN(ct_cuda_attention_bwd(NULL, dt, h[0].data(), h[1].data(), h[2].data(), out[0].data(), h[3].data(), lse.data(),
                              dr.data(), out[1].data(), out[2].data(), out[3].data(), BH, T, D, true));
    const char *tn = dt == CT_CUDA_BF16 ? "bf16" : "f16", *part[4] = {"O", "dQ", "dK", "dV"};
    char w[96];
    for (int i = 0; i < 4; i++) {
        ct_convert(got.data(), CT_F32, out[i].data(), ht, (size_t)n);
        snprintf(w, sizeof w, "%s %s %s", nm, tn, part[i]);
        expect(w, normwise(got.data(), ref[i].data(), n), dt == CT_CUDA_BF16 ? 1e-2 : 1e-3);
    }
    snprintf(w, sizeof w, "%s %s lse", nm, tn);
    expect(w, normwise(lse.data(), lse_ref.data(), BH * T), 1e-6);
}

// The tensor-core kernels (CTRAIN_CUDA_ATTENTION=tc: WMMA fragments emulated whole per lane,
// their alignment rules checked; mma: mma.sync and ldmatrix with the registers exchanged in
// the hardware's fragment layout) against the f32 row kernels on the same rounded inputs:
// head dims 32 and 64, causal or not, T = 70 and 131 (partial tiles), bf16 and f16. P and dS
// enter their products rounded, as on the GPU: the 16-bit tolerances. mma's cp.async copies
// land as late as the waits allow, then (" eager", bf16) as soon as issued.
void attention_tc(const char *fam, const char *how = "", bool bf16_only = false) {
    struct { int D; int64_t T; bool causal; } cases[] = {{32, 70, true}, {64, 131, true}, {64, 70, false}};
    for (auto &k : cases)
        for (ct_cuda_dtype dt : {CT_CUDA_BF16, CT_CUDA_F16}) {
            if (bf16_only && dt != CT_CUDA_BF16) continue;
            const int64_t BH = 2, n = BH * k.T * k.D;
            const ct_dtype ht = dt == CT_CUDA_BF16 ? CT_BF16 : CT_F16;
            std::vector<float> in[4], ref[4], got(n), lse_ref(BH * k.T), lse(BH * k.T), dr(BH * k.T);
            std::vector<uint16_t> h[4], out[4];
            rounded_qkvg(n, ht, in, h, ref, out);
            if (ct_config_set("CTRAIN_CUDA_ATTENTION", "rows") != CT_OK) abort();
            RUN(ct_cuda_attention(NULL, CT_CUDA_F32, in[0].data(), in[1].data(), in[2].data(), ref[0].data(), lse_ref.data(), BH,
                                  k.T, k.D, k.causal));
            RUN(ct_cuda_attention_bwd(NULL, CT_CUDA_F32, in[0].data(), in[1].data(), in[2].data(), ref[0].data(), in[3].data(),
                                      lse_ref.data(), dr.data(), ref[1].data(), ref[2].data(), ref[3].data(), BH, k.T, k.D,
                                      k.causal));
            if (ct_config_set("CTRAIN_CUDA_ATTENTION", fam) != CT_OK) abort();
            RUN(ct_cuda_attention(NULL, dt, h[0].data(), h[1].data(), h[2].data(), out[0].data(), lse.data(), BH, k.T, k.D,
                                  k.causal));
            RUN(ct_cuda_attention_bwd(NULL, dt, h[0].data(), h[1].data(), h[2].data(), out[0].data(), h[3].data(), lse.data(),
                                      dr.data(), out[1].data(), out[2].data(), out[3].data(), BH, k.T, k.D, k.causal));
            const char *part[4] = {"O", "dQ", "dK", "dV"};
            char w[96];
            for (int i = 0; i < 4; i++) {
                ct_convert(got.data(), CT_F32, out[i].data(), ht, (size_t)n);
                snprintf(w, sizeof w, "attention (%s%s) D %d T %lld%s %s %s", fam, how, k.D, (long long)k.T, k.causal ? " causal" : "",
                         dt == CT_CUDA_BF16 ? "bf16" : "f16", part[i]);
                expect(w, normwise(got.data(), ref[i].data(), n), dt == CT_CUDA_BF16 ? 1e-2 : 1e-3);
            }
            snprintf(w, sizeof w, "attention (%s%s) D %d T %lld%s %s lse", fam, how, k.D, (long long)k.T, k.causal ? " causal" : "",
                     dt == CT_CUDA_BF16 ? "bf16" : "f16");
            expect(w, normwise(lse.data(), lse_ref.data(), BH * k.T), 1e-6);
        }
    if (ct_config_set("CTRAIN_CUDA_ATTENTION", "rows") != CT_OK) abort();
}

void attention(ct_ctx *c, bool tiled) {
    const int64_t B = 1, H = 2, T = 70;
    const int D = 32;
    const int64_t sh[4] = {B, H, T, D}, n = B * H * T * D;
    ct_tensor *q = rnd_t(c, 4, sh, 2.0f), *k = rnd_t(c, 4, sh, 2.0f), *v = rnd_t(c, 4, sh, 1.0f), *g = rnd_t(c, 4, sh, 1.0f);
    for (ct_tensor *t : {q, k, v}) ct_requires_grad(t);
    ct_tensor *y = ct_flash_attention(c, q, k, v, true);
    ct_backward_seed(c, y, g);
    std::vector<float> o(n), gq(n), gk(n), gv(n), lse(B * H * T), dr(B * H * T);
    if (ct_config_set("CTRAIN_CUDA_ATTENTION", tiled ? "tiled" : "rows") != CT_OK) {
        failures++;
        printf("FAIL CTRAIN_CUDA_ATTENTION: %s\n", ct_last_error());
        return;
    }
    RUN(ct_cuda_attention(NULL, CT_CUDA_F32, ct_f32(q), ct_f32(k), ct_f32(v), o.data(), lse.data(), B * H, T, D, true));
    RUN(ct_cuda_attention_bwd(NULL, CT_CUDA_F32, ct_f32(q), ct_f32(k), ct_f32(v), o.data(), ct_f32(g), lse.data(), dr.data(),
                              gq.data(), gk.data(), gv.data(), B * H, T, D, true));
    const char *nm = tiled ? "flash attention (tiled)" : "flash attention (rows)";
    char w[96];
    const float *got[4] = {o.data(), gq.data(), gk.data(), gv.data()};
    const ct_tensor *ref[4] = {y, q->grad, k->grad, v->grad};
    const char *part[4] = {"O", "dQ", "dK", "dV"};
    for (int i = 0; i < 4; i++) {
        snprintf(w, sizeof w, "%s %s", nm, part[i]);
        expect(w, normwise(got[i], ct_f32(ref[i]), n), 1e-5);
    }
    attention_16(CT_CUDA_BF16, nm);
    attention_16(CT_CUDA_F16, nm);
}
// The low-precision kernels (bf16, f16 in and out, f32 arithmetic) against the f32 kernels on
// the widened values, rounded as stored: what autocast's f32 copies give, bit for bit (the f32
// kernels are checked against the CPU ops above). 16-bit values are kept as their bits.
struct lp_buf {
    ct_cuda_cast_type t;
    std::vector<uint16_t> bits;
    std::vector<float> wide; // the values as f32 (exact)
};
lp_buf to_lp(const float *x, int64_t n, ct_cuda_cast_type t) {
    lp_buf b{t, std::vector<uint16_t>(n), std::vector<float>(n)};
    ct_dtype dt = t == CT_CUDA_CAST_BF16 ? CT_BF16 : CT_F16;
    ct_convert(b.bits.data(), dt, x, CT_F32, (size_t)n);
    ct_convert(b.wide.data(), CT_F32, b.bits.data(), dt, (size_t)n);
    return b;
}
// bits of f32 values rounded to t, for comparing with a 16-bit kernel output
std::vector<uint16_t> rounded(const std::vector<float> &x, ct_cuda_cast_type t) {
    return to_lp(x.data(), (int64_t)x.size(), t).bits;
}
double mismatches(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b) {
    int64_t d = 0;
    for (size_t i = 0; i < a.size(); i++) d += a[i] != b[i];
    return (double)d;
}
double bit_diff(const std::vector<float> &a, const std::vector<float> &b) {
    return memcmp(a.data(), b.data(), a.size() * sizeof(float)) ? 1.0 : 0.0;
}

// softmax, log_softmax (also with attention's causal mask), bias_add and mse on 16-bit
// inputs: f32 results bit-equal to the f32 kernels on the widened inputs, a 16-bit bias_add
// result their rounding; xl: 16-bit rows [37, 300] (304 in the 8-wide pass)
void lowp_more(ct_ctx *c, ct_cuda_cast_type t, const lp_buf &xl) {
    const char *tn = t == CT_CUDA_CAST_BF16 ? "bf16" : "f16";
    char w[96];
    const int64_t R = 37, D = wide8 ? 304 : 300;
    for (int lg = 0; lg < 2; lg++) {
        std::vector<float> y32(R * D), y(R * D);
        RUN(ct_cuda_softmax_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, y32.data(), R, D, lg, 0));
        RUN(ct_cuda_softmax_t(NULL, xl.bits.data(), t, y.data(), R, D, lg, 0));
        snprintf(w, sizeof w, "%s %s (bits differ)", tn, lg ? "log_softmax" : "softmax");
        expect(w, bit_diff(y, y32), 0);
    }
    const int64_t T = 10, Rc = 4 * T;
    ct_tensor *sc = rnd_t(c, 2, sh({Rc, T}), 3.0f);
    lp_buf sl = to_lp(ct_f32(sc), Rc * T, t);
    std::vector<float> yc32(Rc * T), yc(Rc * T);
    RUN(ct_cuda_softmax_t(NULL, sl.wide.data(), CT_CUDA_CAST_F32, yc32.data(), Rc, T, false, T));
    RUN(ct_cuda_softmax_t(NULL, sl.bits.data(), t, yc.data(), Rc, T, false, T));
    snprintf(w, sizeof w, "%s softmax, causal mask (bits differ)", tn);
    expect(w, bit_diff(yc, yc32), 0);
    // bias_add [N, C, inner] + [C]: one type, then f32 with a 16-bit operand either side
    const int64_t N = 3, C = 5, inner = wide8 ? 32 : 29, n = N * C * inner;
    ct_tensor *x0 = rnd_t(c, 3, sh({N, C, inner}), 4.0f), *b0 = rnd_t(c, 1, &C, 2.0f);
    lp_buf x = to_lp(ct_f32(x0), n, t), b = to_lp(ct_f32(b0), C, t);
    std::vector<float> y32(n), ym(n), ym2(n);
    std::vector<uint16_t> y(n);
    RUN(ct_cuda_bias_add_t(NULL, x.wide.data(), CT_CUDA_CAST_F32, b.wide.data(), CT_CUDA_CAST_F32, y32.data(), n, C, inner));
    RUN(ct_cuda_bias_add_t(NULL, x.bits.data(), t, b.bits.data(), t, y.data(), n, C, inner));
    snprintf(w, sizeof w, "%s bias_add (mismatches)", tn);
    expect(w, mismatches(y, rounded(y32, t)), 0);
    RUN(ct_cuda_bias_add_t(NULL, x.wide.data(), CT_CUDA_CAST_F32, b.bits.data(), t, ym.data(), n, C, inner));
    RUN(ct_cuda_bias_add_t(NULL, x.bits.data(), t, b.wide.data(), CT_CUDA_CAST_F32, ym2.data(), n, C, inner));
    snprintf(w, sizeof w, "f32 and %s bias_add (bits differ)", tn);
    expect(w, bit_diff(ym, y32) + bit_diff(ym2, y32), 0);
    // mse: the loss and both gradients, 16-bit on both sides and mixed with f32
    ct_tensor *a1 = rnd_t(c, 1, &n, 2.0f), *b1 = rnd_t(c, 1, &n, 2.0f);
    lp_buf ma = to_lp(ct_f32(a1), n, t), mb = to_lp(ct_f32(b1), n, t);
    const float dloss = 0.75f;
    const void *av[3] = {ma.wide.data(), ma.bits.data(), ma.bits.data()}, *bv[3] = {mb.wide.data(), mb.bits.data(), mb.wide.data()};
    const ct_cuda_cast_type at[3] = {CT_CUDA_CAST_F32, t, t}, bt[3] = {CT_CUDA_CAST_F32, t, CT_CUDA_CAST_F32};
    std::vector<float> loss[3], da[3], db[3];
    for (int v = 0; v < 3; v++) {
        loss[v].assign(1, 0.0f), da[v].assign(n, 0.0f), db[v].assign(n, 0.0f);
        RUN(ct_cuda_mse_t(NULL, av[v], at[v], bv[v], bt[v], n, loss[v].data()));
        RUN(ct_cuda_mse_bwd_t(NULL, av[v], at[v], bv[v], bt[v], n, &dloss, da[v].data(), db[v].data()));
    }
    snprintf(w, sizeof w, "%s mse loss, da, db (bits differ)", tn);
    expect(w, bit_diff(loss[1], loss[0]) + bit_diff(da[1], da[0]) + bit_diff(db[1], db[0]), 0);
    snprintf(w, sizeof w, "%s and f32 mse loss, da, db (bits differ)", tn);
    expect(w, bit_diff(loss[2], loss[0]) + bit_diff(da[2], da[0]) + bit_diff(db[2], db[0]), 0);
}

void lowp(ct_ctx *c, ct_cuda_cast_type t) {
    const char *tn = t == CT_CUDA_CAST_BF16 ? "bf16" : "f16";
    char w[96];
    const int64_t rows = wide8 ? 16 : 13, m = wide8 ? 96 : 97, n = rows * m;
    ct_tensor *x0 = rnd_t(c, 2, sh({rows, m}), 5.0f), *g = rnd_t(c, 2, sh({rows, m}), 1.0f), *b0 = rnd_t(c, 2, sh({rows, m}), 2.0f);
    lp_buf x = to_lp(ct_f32(x0), n, t), b = to_lp(ct_f32(b0), n, t);
    const ct_cuda_map maps[7] = {{CT_CUDA_MAP_RELU, 0, 0, 0},         {CT_CUDA_MAP_GELU, 0, 0, 0},
                                 {CT_CUDA_MAP_GELU_TANH, 0, 0, 0},    {CT_CUDA_MAP_TANH, 0, 0, 0},
                                 {CT_CUDA_MAP_SIGMOID, 0, 0, 0},      {CT_CUDA_MAP_SCALE, -0.37f, 0, 0},
                                 {CT_CUDA_MAP_DROPOUT, 1.0f / 0.7f, 0x9e3779b97f4a7c15ull, 0.3f}};
    const char *names[7] = {"relu", "gelu", "gelu tanh", "tanh", "sigmoid", "scale", "dropout"};
    for (int k = 0; k < 7; k++) {
        std::vector<float> y32(n), dx32(n), dx(n);
        std::vector<uint16_t> y(n);
        RUN(ct_cuda_map_fwd(NULL, &maps[k], x.wide.data(), y32.data(), CT_CUDA_CAST_F32, n));
        RUN(ct_cuda_map_fwd(NULL, &maps[k], x.bits.data(), y.data(), t, n));
        snprintf(w, sizeof w, "%s %s forward (mismatches)", tn, names[k]);
        expect(w, mismatches(y, rounded(y32, t)), 0);
        // backward from the saved input (gelu) or the 16-bit output (the others)
        bool from_x = maps[k].op == CT_CUDA_MAP_GELU || maps[k].op == CT_CUDA_MAP_GELU_TANH;
        lp_buf yl = to_lp(y32.data(), n, t);
        RUN(ct_cuda_map_bwd(NULL, &maps[k], from_x ? x.wide.data() : yl.wide.data(), CT_CUDA_CAST_F32, ct_f32(g), dx32.data(), n));
        RUN(ct_cuda_map_bwd(NULL, &maps[k], from_x ? x.bits.data() : (const void *)y.data(), t, ct_f32(g), dx.data(), n));
        snprintf(w, sizeof w, "%s %s backward (bits differ)", tn, names[k]);
        expect(w, bit_diff(dx, dx32), 0);
        // 16-bit activation gradients: g read as 16-bit values, dx stored rounded; against the f32
        // kernel on the widened g, rounded as stored
        lp_buf gl = to_lp(ct_f32(g), n, t);
        std::vector<float> dxg(n);
        std::vector<uint16_t> dxl(n);
        RUN(ct_cuda_map_bwd(NULL, &maps[k], from_x ? x.wide.data() : yl.wide.data(), CT_CUDA_CAST_F32, gl.wide.data(), dxg.data(), n));
        RUN(ct_cuda_map_bwd_t(NULL, &maps[k], from_x ? x.bits.data() : (const void *)y.data(), t, gl.bits.data(), true, dxl.data(),
                              true, n));
        snprintf(w, sizeof w, "%s %s backward, 16-bit g and dx (mismatches)", tn, names[k]);
        expect(w, mismatches(dxl, rounded(dxg, t)), 0);
    }
    // add with a repeating operand, mul; one type (a 16-bit result) and mixed (an f32 one)
    for (int mul = 0; mul < 2; mul++) {
        int64_t mm = mul ? n : m;
        std::vector<float> y32(n), ymix(n), ymix2(n);
        std::vector<uint16_t> y(n);
        RUN(ct_cuda_binary(NULL, mul, x.wide.data(), CT_CUDA_CAST_F32, b.wide.data(), CT_CUDA_CAST_F32, y32.data(), n, mm));
        RUN(ct_cuda_binary(NULL, mul, x.bits.data(), t, b.bits.data(), t, y.data(), n, mm));
        snprintf(w, sizeof w, "%s %s (mismatches)", tn, mul ? "mul" : "add");
        expect(w, mismatches(y, rounded(y32, t)), 0);
        RUN(ct_cuda_binary(NULL, mul, x.wide.data(), CT_CUDA_CAST_F32, b.bits.data(), t, ymix.data(), n, mm));
        RUN(ct_cuda_binary(NULL, mul, x.bits.data(), t, b.wide.data(), CT_CUDA_CAST_F32, ymix2.data(), n, mm));
        snprintf(w, sizeof w, "f32 and %s %s (bits differ)", tn, mul ? "mul" : "add");
        expect(w, bit_diff(ymix, y32) + bit_diff(ymix2, y32), 0);
    }
    // layer norm reading a 16-bit x: every output as the f32 kernel's on the widened x
    const int64_t R = 37, D = wide8 ? 304 : 300;
    ct_tensor *xr = rnd_t(c, 2, sh({R, D}), 3.0f), *gr = rnd_t(c, 2, sh({R, D}), 1.0f), *wt = rnd_t(c, 1, &D, 1.0f),
              *bt = rnd_t(c, 1, &D, 1.0f);
    lp_buf xl = to_lp(ct_f32(xr), R * D, t);
    std::vector<float> out[2][6];
    for (int v = 0; v < 2; v++) {
        for (int k = 0; k < 6; k++) out[v][k].assign(k < 2 ? R * D : k < 4 ? R : D, 0.0f);
        const void *xp = v ? (const void *)xl.bits.data() : xl.wide.data();
        ct_cuda_cast_type xt = v ? t : CT_CUDA_CAST_F32;
        RUN(ct_cuda_layer_norm_t(NULL, xp, xt, ct_f32(wt), ct_f32(bt), out[v][0].data(), CT_CUDA_CAST_F32, out[v][2].data(),
                                 out[v][3].data(), R, D, 1e-5f));
        RUN(ct_cuda_layer_norm_bwd_t(NULL, xp, xt, ct_f32(gr), CT_CUDA_CAST_F32, ct_f32(wt), out[v][2].data(), out[v][3].data(),
                                     out[v][1].data(), false, out[v][4].data(), out[v][5].data(), R, D));
    }
    double ln = 0;
    for (int k = 0; k < 6; k++) ln += bit_diff(out[0][k], out[1][k]);
    snprintf(w, sizeof w, "%s layer_norm y, stats, dx, dw, db (bits differ)", tn);
    expect(w, ln, 0);
    // layer norm writing a 16-bit y (ct_layer_norm_lowp): the f32 kernel's y rounded, bit for
    // bit; its backward reading that 16-bit y's gradient: the f32 kernel's on the widened
    // gradient; dx added in the kernel (accumulate): the f32 dx plus what was there
    {
        std::vector<float> st(2 * R), dx(R * D), dw(D, 0.0f), db(D, 0.0f), acc(R * D), want(R * D);
        std::vector<uint16_t> y16(R * D);
        RUN(ct_cuda_layer_norm_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, ct_f32(wt), ct_f32(bt), y16.data(), t, st.data(),
                                 st.data() + R, R, D, 1e-5f));
        snprintf(w, sizeof w, "layer_norm writing a %s y (mismatches)", tn);
        expect(w, mismatches(y16, rounded(out[0][0], t)), 0);
        lp_buf gl = to_lp(ct_f32(gr), R * D, t);
        std::vector<float> ref[3] = {std::vector<float>(R * D), std::vector<float>(D, 0.0f), std::vector<float>(D, 0.0f)};
        RUN(ct_cuda_layer_norm_bwd_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, gl.wide.data(), CT_CUDA_CAST_F32, ct_f32(wt), st.data(),
                                     st.data() + R, ref[0].data(), false, ref[1].data(), ref[2].data(), R, D));
        RUN(ct_cuda_layer_norm_bwd_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, gl.bits.data(), t, ct_f32(wt), st.data(), st.data() + R,
                                     dx.data(), false, dw.data(), db.data(), R, D));
        snprintf(w, sizeof w, "layer_norm backward reading a %s gradient: dx, dw, db (bits differ)", tn);
        expect(w, bit_diff(dx, ref[0]) + bit_diff(dw, ref[1]) + bit_diff(db, ref[2]), 0);
        for (int64_t i = 0; i < R * D; i++) {
            acc[i] = 0.25f * (float)((i * 37) % 17) - 2.0f;
            want[i] = acc[i] + ref[0][i];
        }
        RUN(ct_cuda_layer_norm_bwd_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, gl.bits.data(), t, ct_f32(wt), st.data(), st.data() + R,
                                     acc.data(), true, NULL, NULL, R, D));
        snprintf(w, sizeof w, "layer_norm backward adding dx (%s gradient) to a gradient (bits differ)", tn);
        expect(w, bit_diff(acc, want), 0);
    }
    // max pooling (plain and of ReLU) on 16-bit planes: the output is one of the inputs, so
    // bit-equal to the f32 kernel's on the widened planes rounded; backward reads the 16-bit
    // output (ReLU's sign) and gives the f32 kernel's gradients, bit for bit
    {
        const int64_t planes = 6, H = 9, W = 11;
        ct_cuda_pool_geom pg = {planes, H, W, (H + 2 - 3) / 2 + 1, (W + 2 - 3) / 2 + 1, 3, 2, 1};
        int64_t nin = planes * H * W, nout = planes * pg.OH * pg.OW;
        ct_tensor *px = rnd_t(c, 1, &nin, 2.0f), *pgy = rnd_t(c, 1, &nout, 1.0f);
        lp_buf xp = to_lp(ct_f32(px), nin, t);
        for (int relu = 0; relu < 2; relu++) {
            std::vector<float> y32(nout), dx32(nin), dx(nin);
            std::vector<uint16_t> y(nout);
            std::vector<int32_t> a32(nout), a(nout);
            RUN(ct_cuda_max_pool(NULL, xp.wide.data(), y32.data(), a32.data(), &pg, relu));
            RUN(ct_cuda_max_pool_t(NULL, xp.bits.data(), t, y.data(), a.data(), &pg, relu));
            RUN(ct_cuda_max_pool_bwd(NULL, ct_f32(pgy), y32.data(), a32.data(), dx32.data(), &pg, relu, false));
            RUN(ct_cuda_max_pool_bwd_t(NULL, ct_f32(pgy), y.data(), t, a.data(), dx.data(), &pg, relu, false));
            snprintf(w, sizeof w, "%s %s forward (mismatches)", tn, relu ? "relu_max_pool2d" : "max_pool2d");
            expect(w, mismatches(y, rounded(y32, t)) + (a != a32), 0);
            snprintf(w, sizeof w, "%s %s backward (bits differ)", tn, relu ? "relu_max_pool2d" : "max_pool2d");
            expect(w, bit_diff(dx, dx32), 0);
        }
    }
    // cross-entropy on 16-bit logits
    std::vector<int32_t> tgt(R);
    for (int64_t i = 0; i < R; i++) tgt[i] = i == 5 ? -100 : (int32_t)((i * 37) % D);
    std::vector<float> lse[2], o[2], dl[2];
    float one = 1.0f;
    for (int v = 0; v < 2; v++) {
        lse[v].assign(R, 0.0f), o[v].assign(2, 0.0f), dl[v].assign(R * D, 0.0f);
        const void *xp = v ? (const void *)xl.bits.data() : xl.wide.data();
        ct_cuda_cast_type xt = v ? t : CT_CUDA_CAST_F32;
        RUN(ct_cuda_cross_entropy_t(NULL, xp, xt, tgt.data(), false, R, D, -100, lse[v].data(), o[v].data()));
        RUN(ct_cuda_cross_entropy_bwd_t(NULL, xp, xt, tgt.data(), false, R, D, -100, lse[v].data(), o[v].data(), &one,
                                        dl[v].data(), false));
    }
    snprintf(w, sizeof w, "%s cross_entropy loss, lse, dlogits (bits differ)", tn);
    expect(w, bit_diff(o[0], o[1]) + bit_diff(lse[0], lse[1]) + bit_diff(dl[0], dl[1]), 0);
    // the fused classifier's 16-bit dlogits: the f32 ones rounded as stored
    std::vector<uint16_t> dll(R * D);
    RUN(ct_cuda_cross_entropy_bwd_t(NULL, xl.bits.data(), t, tgt.data(), false, R, D, -100, lse[1].data(), o[1].data(), &one,
                                    dll.data(), true));
    snprintf(w, sizeof w, "%s cross_entropy 16-bit dlogits (mismatches)", tn);
    expect(w, mismatches(dll, rounded(dl[1], t)), 0);
    lowp_more(c, t, xl);
}


// Llama's ops: RMSNorm (with and without a weight), SiLU, the rotary embedding (positions
// 0..T-1 and given i64 ones) and repeat_kv against the CPU ops; then their 16-bit forms against
// the f32 kernels on the widened inputs, rounded as stored (bit for bit, as lowp above)
void llama_ops(ct_ctx *c) {
    const int64_t R = 37, D = 300;
    ct_tensor *x = rnd_t(c, 2, sh({R, D}), 3.0f), *g = rnd_t(c, 2, sh({R, D}), 1.0f), *w = rnd_t(c, 1, &D, 1.0f);
    std::vector<float> y(R * D), dx(R * D), rstd(R);
    for (int hw = 0; hw < 2; hw++) {
        ct_tensor *xl = ct_new_like(c, x), *wl = hw ? ct_new_like(c, w) : NULL;
        memcpy(xl->data, x->data, ct_nbytes(x));
        ct_requires_grad(xl);
        if (wl) {
            memcpy(wl->data, w->data, ct_nbytes(w));
            ct_requires_grad(wl);
        }
        ct_tensor *r = ct_rms_norm(c, xl, wl, 1e-6f);
        ct_backward_seed(c, r, g);
        std::vector<float> dw(D, 0.0f);
        const float *wp = hw ? ct_f32(w) : NULL;
        RUN(ct_cuda_rms_norm_t(NULL, ct_f32(x), CT_CUDA_CAST_F32, wp, y.data(), CT_CUDA_CAST_F32, rstd.data(), R, D, 1e-6f));
        RUN(ct_cuda_rms_norm_bwd_t(NULL, ct_f32(x), CT_CUDA_CAST_F32, ct_f32(g), CT_CUDA_CAST_F32, wp, rstd.data(), dx.data(), false,
                                   hw ? dw.data() : NULL, R, D));
        expect(hw ? "rms_norm forward" : "rms_norm forward (no weight)", normwise(y.data(), ct_f32(r), R * D), 1e-6);
        expect(hw ? "rms_norm dx" : "rms_norm dx (no weight)", normwise(dx.data(), ct_f32(xl->grad), R * D), 1e-6);
        if (hw) expect("rms_norm dw", normwise(dw.data(), ct_f32(wl->grad), D), 1e-6);
    }
    {
        ct_tensor *xs = ct_new_like(c, x);
        memcpy(xs->data, x->data, ct_nbytes(x));
        ct_requires_grad(xs);
        ct_tensor *r = ct_silu(c, xs);
        ct_backward_seed(c, r, g);
        ct_cuda_map m = {CT_CUDA_MAP_SILU, 0, 0, 0};
        RUN(ct_cuda_map_fwd(NULL, &m, ct_f32(x), y.data(), CT_CUDA_CAST_F32, R * D));
        RUN(ct_cuda_map_bwd(NULL, &m, ct_f32(x), CT_CUDA_CAST_F32, ct_f32(g), dx.data(), R * D));
        expect("silu forward", normwise(y.data(), ct_f32(r), R * D), 1e-6);
        expect("silu backward", normwise(dx.data(), ct_f32(xs->grad), R * D), 1e-6);
    }
    // rope on [2, 3, T, Dh]: forward and backward, then accumulated into that gradient
    const int64_t T = 17, Dh = 16, Rr = 6, n = Rr * T * Dh;
    ct_tensor *xr = rnd_t(c, 4, sh({2, 3, T, Dh}), 2.0f), *gr = rnd_t(c, 4, sh({2, 3, T, Dh}), 1.0f);
    std::vector<int64_t> pos(T);
    for (int64_t t = 0; t < T; t++) pos[t] = 5 + 97 * t;
    ct_tensor *pt = ct_from_data(c, CT_I64, pos.data(), 1, &T);
    std::vector<float> cs(2 * T * Dh / 2), ry(n), rdx(n);
    for (int hp = 0; hp < 2; hp++) {
        float theta = hp ? 500000.0f : 10000.0f;
        ct_tensor *xl = ct_new_like(c, xr);
        memcpy(xl->data, xr->data, ct_nbytes(xr));
        ct_requires_grad(xl);
        ct_tensor *r = ct_rope(c, xl, hp ? pt : NULL, theta);
        ct_backward_seed(c, r, gr);
        RUN(ct_cuda_rope_table(NULL, hp ? pos.data() : NULL, true, T, Dh, theta, cs.data()));
        RUN(ct_cuda_rope(NULL, ct_f32(xr), CT_CUDA_CAST_F32, ry.data(), cs.data(), Rr, T, Dh));
        RUN(ct_cuda_rope_bwd(NULL, ct_f32(gr), cs.data(), rdx.data(), Rr, T, Dh, false));
        expect(hp ? "rope forward (i64 positions, theta 5e5)" : "rope forward", normwise(ry.data(), ct_f32(r), n), 1e-6);
        expect(hp ? "rope backward (i64 positions, theta 5e5)" : "rope backward", normwise(rdx.data(), ct_f32(xl->grad), n), 1e-6);
        if (hp) continue;
        RUN(ct_cuda_rope_bwd(NULL, ct_f32(gr), cs.data(), rdx.data(), Rr, T, Dh, true));
        for (int64_t i = 0; i < n; i++) rdx[i] *= 0.5f;
        expect("rope backward, accumulated", normwise(rdx.data(), ct_f32(xl->grad), n), 1e-6);
    }
    // rope with Llama 3.1's scaling: original context 64, low/high factors 1 and 4, so the 8
    // frequencies of Dh = 16 at theta 5e5 fall in all three regimes (kept, blended, divided)
    {
        ct_rope_scaling rs = {8.0f, 1.0f, 4.0f, 64};
        ct_tensor *r = ct_rope_scaled(c, xr, pt, 500000.0f, &rs), *r0 = ct_rope(c, xr, pt, 500000.0f);
        RUN(ct_cuda_rope_table_scaled(NULL, pos.data(), true, T, Dh, 500000.0f, rs.factor, rs.low_freq_factor,
                                      rs.high_freq_factor, rs.original_max_position_embeddings, cs.data()));
        RUN(ct_cuda_rope(NULL, ct_f32(xr), CT_CUDA_CAST_F32, ry.data(), cs.data(), Rr, T, Dh));
        expect("rope forward, llama3 scaling", normwise(ry.data(), ct_f32(r), n), 1e-6);
        expect("rope, llama3 scaling changes it", normwise(ct_f32(r0), ct_f32(r), n) > 1e-2 ? 0 : 1, 0);
    }
    // repeat_kv [2, 2, 5, 6] x 3: the strided copy with a stride of 0, and the group sums
    const int64_t BH = 4, TD = 30, rep = 3;
    ct_tensor *xk = rnd_t(c, 4, sh({2, 2, 5, 6}), 1.0f), *gk = rnd_t(c, 4, sh({2, 6, 5, 6}), 1.0f);
    ct_requires_grad(xk);
    ct_tensor *rk = ct_repeat_kv(c, xk, (int)rep);
    ct_backward_seed(c, rk, gk);
    ct_cuda_layout l = {3, {BH, rep, TD}, {TD, 0, 1}};
    std::vector<float> ky(BH * rep * TD), kdx(BH * TD);
    RUN(ct_cuda_strided_copy(NULL, ky.data(), ct_f32(xk), &l));
    RUN(ct_cuda_repeat_kv_bwd(NULL, ct_f32(gk), kdx.data(), BH, TD, rep, false));
    expect("repeat_kv forward (bits)", memcmp(ky.data(), ct_f32(rk), ky.size() * 4) != 0, 0);
    expect("repeat_kv backward (bits)", memcmp(kdx.data(), ct_f32(xk->grad), kdx.size() * 4) != 0, 0);
    // the 16-bit forms
    for (ct_cuda_cast_type t : {CT_CUDA_CAST_BF16, CT_CUDA_CAST_F16}) {
        const char *tn = t == CT_CUDA_CAST_BF16 ? "bf16" : "f16";
        char wn[96];
        lp_buf xl = to_lp(ct_f32(x), R * D, t);
        std::vector<float> out[2][4];
        for (int v = 0; v < 2; v++) {
            for (int k = 0; k < 4; k++) out[v][k].assign(k < 2 ? R * D : k == 2 ? R : D, 0.0f);
            const void *xp = v ? (const void *)xl.bits.data() : xl.wide.data();
            ct_cuda_cast_type xt = v ? t : CT_CUDA_CAST_F32;
            RUN(ct_cuda_rms_norm_t(NULL, xp, xt, ct_f32(w), out[v][0].data(), CT_CUDA_CAST_F32, out[v][2].data(), R, D, 1e-6f));
            RUN(ct_cuda_rms_norm_bwd_t(NULL, xp, xt, ct_f32(g), CT_CUDA_CAST_F32, ct_f32(w), out[v][2].data(), out[v][1].data(), false,
                                       out[v][3].data(), R, D));
        }
        double e = 0;
        for (int k = 0; k < 4; k++) e += bit_diff(out[0][k], out[1][k]);
        snprintf(wn, sizeof wn, "%s rms_norm y, rstd, dx, dw (bits differ)", tn);
        expect(wn, e, 0);
        { // a 16-bit y (ct_rms_norm_lowp): the f32 y rounded; backward on a 16-bit gradient: the
          // f32 one's on the widened gradient; dx added in the kernel: the f32 dx plus what was there
            std::vector<uint16_t> y16(R * D);
            std::vector<float> rs(R), dx(R * D), dw(D, 0.0f), ref(R * D), rdw(D, 0.0f), acc(R * D), want(R * D);
            RUN(ct_cuda_rms_norm_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, ct_f32(w), y16.data(), t, rs.data(), R, D, 1e-6f));
            lp_buf gl = to_lp(ct_f32(g), R * D, t);
            RUN(ct_cuda_rms_norm_bwd_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, gl.wide.data(), CT_CUDA_CAST_F32, ct_f32(w), rs.data(),
                                       ref.data(), false, rdw.data(), R, D));
            RUN(ct_cuda_rms_norm_bwd_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, gl.bits.data(), t, ct_f32(w), rs.data(), dx.data(),
                                       false, dw.data(), R, D));
            for (int64_t i = 0; i < R * D; i++) {
                acc[i] = 0.25f * (float)((i * 37) % 17) - 2.0f;
                want[i] = acc[i] + ref[i];
            }
            RUN(ct_cuda_rms_norm_bwd_t(NULL, xl.wide.data(), CT_CUDA_CAST_F32, gl.bits.data(), t, ct_f32(w), rs.data(), acc.data(),
                                       true, NULL, R, D));
            snprintf(wn, sizeof wn, "rms_norm with a %s y (mismatches), its gradient, dx added (bits differ)", tn);
            expect(wn, mismatches(y16, rounded(out[0][0], t)) + bit_diff(dx, ref) + bit_diff(dw, rdw) + bit_diff(acc, want), 0);
        }
        ct_cuda_map m = {CT_CUDA_MAP_SILU, 0, 0, 0};
        std::vector<float> y32(R * D), dx32(R * D), dxl(R * D);
        std::vector<uint16_t> yl(R * D);
        RUN(ct_cuda_map_fwd(NULL, &m, xl.wide.data(), y32.data(), CT_CUDA_CAST_F32, R * D));
        RUN(ct_cuda_map_fwd(NULL, &m, xl.bits.data(), yl.data(), t, R * D));
        RUN(ct_cuda_map_bwd(NULL, &m, xl.wide.data(), CT_CUDA_CAST_F32, ct_f32(g), dx32.data(), R * D));
        RUN(ct_cuda_map_bwd(NULL, &m, xl.bits.data(), t, ct_f32(g), dxl.data(), R * D));
        snprintf(wn, sizeof wn, "%s silu forward (mismatches), backward (bits)", tn);
        expect(wn, mismatches(yl, rounded(y32, t)) + bit_diff(dxl, dx32), 0);
        lp_buf xq = to_lp(ct_f32(xr), n, t), xkl = to_lp(ct_f32(xk), BH * TD, t);
        std::vector<float> q32(n);
        std::vector<uint16_t> ql(n), kl(BH * rep * TD), kref(BH * rep * TD);
        RUN(ct_cuda_rope_table(NULL, NULL, false, T, Dh, 10000.0f, cs.data()));
        RUN(ct_cuda_rope(NULL, xq.wide.data(), CT_CUDA_CAST_F32, q32.data(), cs.data(), Rr, T, Dh));
        RUN(ct_cuda_rope(NULL, xq.bits.data(), t, ql.data(), cs.data(), Rr, T, Dh));
        snprintf(wn, sizeof wn, "%s rope forward (mismatches)", tn);
        expect(wn, mismatches(ql, rounded(q32, t)), 0);
        for (int64_t i = 0; i < BH * rep * TD; i++) kref[i] = xkl.bits[(i / (rep * TD)) * TD + i % TD];
        RUN(ct_cuda_strided_copy16(NULL, kl.data(), xkl.bits.data(), &l));
        snprintf(wn, sizeof wn, "%s repeat_kv forward (mismatches)", tn);
        expect(wn, mismatches(kl, kref), 0);
    }
}
} // namespace

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* each check's line, also when a later one aborts */
    ct_ctx *c;
    if (ct_ctx_create(NULL, &c) != CT_OK) return 2;
    elementwise(c);
    lowp(c, CT_CUDA_CAST_BF16);
    lowp(c, CT_CUDA_CAST_F16);
    rows_ops(c);
    embedding_pool(c);
    pointwise(c);
    wide8 = true;
    elementwise(c);
    lowp(c, CT_CUDA_CAST_BF16);
    lowp(c, CT_CUDA_CAST_F16);
    rows_ops(c);
    pointwise(c);
    wide8 = false;
    llama_ops(c);
    optim();
    attention(c, false);
    attention(c, true);
    attention_tc("tc");
    attention_tc("mma");
    // cp.async's copies landing as soon as issued (above: as late as waited for)
    setenv("CT_EMU_CP_EAGER", "1", 1);
    attention_tc("mma", " eager", true);
    unsetenv("CT_EMU_CP_EAGER");
    ct_ctx_free(c);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
