/* The ops of src/cuda/ops_more.c on cuda:0 against the same ops on the CPU, forward and
 * backward, on random inputs: bias_add, softmax, log_softmax, mse_loss, plain attention
 * (causal and not, Tq != Tk, Dv != D), and cast f32 -> bf16 / f16 -> f32. Each op's output
 * y is reduced as sum(y * w) with a random w, so every element of every input gradient is
 * checked. Tolerance 1e-5 normwise in f32; the casts must agree bit for bit. The first four
 * and sum and mean also on bf16 inputs under autocast (the kernels reading bf16), within 1e-2.
 * Llama's ops (rms_norm, silu, rope, repeat_kv) within 1e-6 (repeat_kv bit for bit), and on
 * bf16 inputs under autocast within 1e-2. The fused flash attention with grouped-query k, v
 * (H = 4, KV = 2 and 1), f32 within 1e-5 and bf16 under autocast within 1e-2; the fused one on
 * a packed qkv likewise, and bit for bit against the same attention spelled out on the device.
 * Layer norm and RMSNorm with a bf16/f16 output (ct_layer_norm_lowp, ct_rms_norm_lowp) bit for bit
 * against autocast's cast.
 * Built only with CUDA; without a GPU every test skips with "no CUDA GPU" (scripts/gpu-check.sh
 * runs them). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "ctrain/ops.h"
#include "cuda/cuda.h"
#include "gpu/gpu_test.h"
#include "kernel_check.h"

#define OK(call) CT_ASSERT((call) == CT_OK || (fprintf(stderr, "%s: %s\n", #call, ct_last_error()), 0))

typedef ct_tensor *(*op_fn)(ct_ctx *c, ct_tensor **in, const int64_t *arg);

/* a tensor on the host holding t's values (t itself when on the CPU) */
static ct_tensor *host(ct_ctx *c, ct_tensor *t) {
    if (t->device.type == CT_DEV_CPU) return t;
    ct_tensor *h = NULL;
    if (ct_device_sync(t->device) != CT_OK || ct_tensor_to(c, t, CT_CPU, &h) != CT_OK) {
        fprintf(stderr, "copy to the host: %s\n", ct_last_error());
        abort();
    }
    return h;
}

/* f on nin random inputs (shapes[i] of ndims[i] dims) on the CPU and on cuda:0: output and
 * every input gradient within tol (normwise) */
static void check_op(const char *name, op_fn f, const int64_t *arg, int nin, const int *ndims, const int64_t (*shapes)[4],
                     double tol) {
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *x[2][4], *y[2], *w[2];
    for (int i = 0; i < nin; i++) {
        x[0][i] = rnd(c, ndims[i], shapes[i], 2.0f);
        OK(ct_tensor_to(c, x[0][i], CT_CUDA(0), &x[1][i]));
    }
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < nin; i++) ct_requires_grad(x[d][i]);
        y[d] = f(c, x[d], arg);
        CT_ASSERT(ct_ctx_status(c) == CT_OK || (fprintf(stderr, "%s on %s: %s\n", name, d ? "cuda:0" : "cpu", ct_last_error()), 0));
        if (d == 0) w[0] = rnd(c, y[0]->ndim, y[0]->shape, 1.0f);
        else OK(ct_tensor_to(c, w[0], CT_CUDA(0), &w[1]));
        ct_backward(c, ct_sum(c, ct_mul(c, y[d], w[d])));
    }
    CT_ASSERT(ct_ctx_status(c) == CT_OK || (fprintf(stderr, "%s backward on cuda:0: %s\n", name, ct_last_error()), 0));
    ct_tensor *yh = host(c, y[1]);
    double e = normwise(yh->data, y[0]->data, ct_numel(y[0]));
    CT_EXPECTF(e <= tol, "%s forward: error %g > %g", name, e, tol);
    for (int i = 0; i < nin; i++) {
        ct_tensor *gh = host(c, x[1][i]->grad);
        e = normwise(gh->data, x[0][i]->grad->data, ct_numel(x[0][i]));
        CT_EXPECTF(e <= tol, "%s gradient of input %d: error %g > %g", name, i, e, tol);
    }
    ct_ctx_free(c);
}

static ct_tensor *op_bias_add(ct_ctx *c, ct_tensor **in, const int64_t *arg) { (void)arg; return ct_bias_add(c, in[0], in[1]); }
static ct_tensor *op_softmax(ct_ctx *c, ct_tensor **in, const int64_t *arg) {
    return arg[0] ? ct_log_softmax(c, in[0]) : ct_softmax(c, in[0]);
}
static ct_tensor *op_mse(ct_ctx *c, ct_tensor **in, const int64_t *arg) { (void)arg; return ct_mse_loss(c, in[0], in[1]); }
static ct_tensor *op_attention(ct_ctx *c, ct_tensor **in, const int64_t *arg) {
    return ct_attention(c, in[0], in[1], in[2], arg[0] != 0);
}
/* the fused op, k and v with fewer heads than q (grouped-query); arg[1]: under bf16 autocast
 * (the bf16 kernels), the output back in f32 */
static ct_tensor *op_flash(ct_ctx *c, ct_tensor **in, const int64_t *arg) {
    if (!arg[1]) return ct_flash_attention(c, in[0], in[1], in[2], arg[0] != 0);
    ct_autocast_begin(c, CT_BF16);
    ct_tensor *y = ct_flash_attention(c, in[0], in[1], in[2], arg[0] != 0);
    ct_autocast_end(c);
    return ct_cast(c, y, CT_F32);
}
/* the fused attention on a packed qkv [B, T, 3C] (arg[0] heads), f32 or (arg[1]) under bf16
 * autocast; arg[2]: spelled out instead, as the GPT's attention did on a device before the
 * op had a kernel there (reshape, transposes, one copy into head layout, slices, flash, merge) */
static ct_tensor *op_flash_qkv(ct_ctx *c, ct_tensor **in, const int64_t *arg) {
    ct_tensor *qkv = in[0], *y;
    int64_t H = arg[0], B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, D = C / H;
    if (arg[1]) ct_autocast_begin(c, CT_BF16);
    if (!arg[2]) {
        y = ct_flash_attention_qkv(c, qkv, (int)H, true);
    } else {
        ct_tensor *t5 = ct_reshape(c, qkv, 5, (int64_t[]){B, T, 3, H, D});
        ct_tensor *hd = ct_contiguous(c, ct_transpose(c, ct_transpose(c, ct_transpose(c, t5, 1, 2), 2, 3), 0, 1));
        ct_tensor *qkvh[3];
        for (int i = 0; i < 3; i++) qkvh[i] = ct_reshape(c, ct_slice(c, hd, 0, i, 1), 4, (int64_t[]){B, H, T, D});
        y = ct_merge_heads(c, ct_flash_attention(c, qkvh[0], qkvh[1], qkvh[2], true));
    }
    if (arg[1]) { ct_autocast_end(c); y = ct_cast(c, y, CT_F32); }
    return y;
}
/* there and back: f32 -> dt -> f32 (the gradient rounded to dt on the way back) */
static ct_tensor *op_cast(ct_ctx *c, ct_tensor **in, const int64_t *arg) {
    return ct_cast(c, ct_cast(c, in[0], (ct_dtype)arg[0]), CT_F32);
}

CT_TEST(bias_add_on_cuda_matches_cpu) {
    NEED_GPU();
    const int64_t sh[2][4] = {{6, 7, 5, 3}, {7}};
    check_op("bias_add", op_bias_add, NULL, 2, (int[]){4, 1}, sh, 1e-5);
    const int64_t sh2[2][4] = {{33, 20}, {20}}; /* no inner dims: the column sums alone */
    check_op("bias_add [N, C]", op_bias_add, NULL, 2, (int[]){2, 1}, sh2, 1e-5);
}
CT_TEST(softmax_on_cuda_matches_cpu) {
    NEED_GPU();
    const int64_t sh[1][4] = {{3, 17, 1000}};
    check_op("softmax", op_softmax, (int64_t[]){0}, 1, (int[]){3}, sh, 1e-5);
    const int64_t sh2[1][4] = {{5, 7}}; /* rows shorter than a warp */
    check_op("softmax (short rows)", op_softmax, (int64_t[]){0}, 1, (int[]){2}, sh2, 1e-5);
}
CT_TEST(log_softmax_on_cuda_matches_cpu) {
    NEED_GPU();
    const int64_t sh[1][4] = {{41, 5003}};
    check_op("log_softmax", op_softmax, (int64_t[]){1}, 1, (int[]){2}, sh, 1e-5);
}
CT_TEST(mse_loss_on_cuda_matches_cpu) {
    NEED_GPU();
    const int64_t sh[2][4] = {{129, 77}, {129, 77}};
    check_op("mse_loss", op_mse, NULL, 2, (int[]){2, 2}, sh, 1e-5);
}
CT_TEST(attention_on_cuda_matches_cpu) {
    NEED_GPU();
    const int64_t causal[3][4] = {{2, 3, 130, 32}, {2, 3, 130, 32}, {2, 3, 130, 32}};
    check_op("attention (causal)", op_attention, (int64_t[]){1}, 3, (int[]){4, 4, 4}, causal, 1e-5);
    const int64_t cross[3][4] = {{1, 2, 37, 16}, {1, 2, 53, 16}, {1, 2, 53, 24}};
    check_op("attention (Tq != Tk, Dv != D)", op_attention, (int64_t[]){0}, 3, (int[]){4, 4, 4}, cross, 1e-5);
    const int64_t wide[3][4] = {{1, 2, 60, 8}, {1, 2, 20, 8}, {1, 2, 20, 8}}; /* causal, more queries than keys */
    check_op("attention (causal, Tq > Tk)", op_attention, (int64_t[]){1}, 3, (int[]){4, 4, 4}, wide, 1e-5);
}
/* grouped-query flash attention: H = 4 query heads over KV = 2 and 1 key/value heads, so dk
 * and dv are sums over each group's query heads; f32 and bf16 under autocast */
CT_TEST(flash_attention_gqa_on_cuda_matches_cpu) {
    NEED_GPU();
    for (int kv = 2; kv >= 1; kv--)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t sh[3][4] = {{2, 4, 70, 32}, {2, kv, 70, 32}, {2, kv, 70, 32}};
            char name[96];
            snprintf(name, sizeof name, "flash_attention (H 4, KV %d, causal %d)", kv, causal);
            check_op(name, op_flash, (int64_t[]){causal, 0}, 3, (int[]){4, 4, 4}, sh, 1e-5);
            snprintf(name, sizeof name, "flash_attention bf16 (H 4, KV %d, causal %d)", kv, causal);
            check_op(name, op_flash, (int64_t[]){causal, 1}, 3, (int[]){4, 4, 4}, sh, 1e-2);
        }
}
/* the packed-qkv fused attention: against the CPU op (f32 within 1e-5, bf16 autocast within
 * 1e-2), and bit for bit against the same attention spelled out on the device (the same
 * kernels on the same values: output and the gradient of qkv) */
CT_TEST(flash_attention_qkv_on_cuda_matches_cpu_and_chain) {
    NEED_GPU();
    const int64_t sh[1][4] = {{2, 70, 3 * 4 * 32}};
    for (int bf = 0; bf < 2; bf++) {
        char name[96];
        snprintf(name, sizeof name, "flash_attention_qkv%s", bf ? " bf16" : "");
        check_op(name, op_flash_qkv, (int64_t[]){4, bf, 0}, 1, (int[]){3}, sh, bf ? 1e-2 : 1e-5);
        ct_ctx *c;
        OK(ct_ctx_create(NULL, &c));
        ct_tensor *x = rnd(c, 3, sh[0], 2.0f), *xd[2], *y[2];
        ct_tensor *w = rnd(c, 3, (int64_t[]){2, 70, 4 * 32}, 1.0f), *wd;
        OK(ct_tensor_to(c, w, CT_CUDA(0), &wd));
        for (int k = 0; k < 2; k++) {
            OK(ct_tensor_to(c, x, CT_CUDA(0), &xd[k]));
            ct_requires_grad(xd[k]);
            y[k] = op_flash_qkv(c, &xd[k], (int64_t[]){4, bf, k});
            ct_backward(c, ct_sum(c, ct_mul(c, y[k], wd)));
        }
        CT_ASSERT(ct_ctx_status(c) == CT_OK || (fprintf(stderr, "%s: %s\n", name, ct_last_error()), 0));
        ct_tensor *a = host(c, y[0]), *b = host(c, y[1]), *ga = host(c, xd[0]->grad), *gb = host(c, xd[1]->grad);
        CT_EXPECTF(memcmp(a->data, b->data, (size_t)ct_numel(a) * 4) == 0, "%s: output differs from the spelled-out attention", name);
        CT_EXPECTF(memcmp(ga->data, gb->data, (size_t)ct_numel(ga) * 4) == 0, "%s: gradient of qkv differs from the spelled-out one",
                   name);
        ct_ctx_free(c);
    }
}
/* ct_layer_norm_lowp (and ct_rms_norm_lowp) under autocast on the device: a bf16/f16 y that the
 * linear after it reads as it is, against the f32 y that autocast casts for the linear: the same bits,
 * forward and backward, in a pre-LN residual z = x + linear(ln(x)) (so the norm's dx is added
 * to the gradient the residual add gave x) */
static ct_tensor *norm_of(ct_ctx *c, bool rms, bool lowp, ct_tensor **d) {
    if (rms) return lowp ? ct_rms_norm_lowp(c, d[0], d[1], 1e-6f) : ct_rms_norm(c, d[0], d[1], 1e-6f);
    return lowp ? ct_layer_norm_lowp(c, d[0], d[1], d[2], 1e-5f) : ct_layer_norm(c, d[0], d[1], d[2], 1e-5f);
}
CT_TEST(layer_norm_lowp_on_cuda_matches_autocast_cast) {
    NEED_GPU();
    const ct_dtype dts[2] = {CT_BF16, CT_F16};
    for (int di = 0; di < 4; di++) {
        const bool rms = di >= 2;
        ct_ctx *c;
        OK(ct_ctx_create(NULL, &c));
        const int64_t xs[3] = {3, 17, 96}, ws[2] = {96, 96}, vs[1] = {96};
        ct_tensor *h[6] = {rnd(c, 3, xs, 2.0f), rnd(c, 1, vs, 1.0f), rnd(c, 1, vs, 1.0f), rnd(c, 2, ws, 0.2f), rnd(c, 1, vs, 1.0f),
                           rnd(c, 3, xs, 1.0f)}; /* x, norm weight and bias, linear weight and bias, w */
        ct_tensor *d[2][6], *z[2];
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < 6; i++) {
                OK(ct_tensor_to(c, h[i], CT_CUDA(0), &d[k][i]));
                if (i < 5) ct_requires_grad(d[k][i]);
            }
            ct_autocast_begin(c, dts[di % 2]);
            ct_tensor *n = norm_of(c, rms, k, d[k]);
            CT_EXPECTF(n->dtype == (k ? dts[di % 2] : CT_F32), "%s%s gave a %s y", rms ? "rms_norm" : "layer_norm", k ? "_lowp" : "",
                       ct_dtype_name(n->dtype));
            z[k] = ct_add(c, d[k][0], ct_linear(c, n, d[k][3], d[k][4]));
            ct_autocast_end(c);
            ct_backward(c, ct_sum(c, ct_mul(c, z[k], d[k][5])));
        }
        CT_ASSERT(ct_ctx_status(c) == CT_OK || (fprintf(stderr, "norm_lowp: %s\n", ct_last_error()), 0));
        ct_tensor *za = host(c, z[0]), *zb = host(c, z[1]);
        CT_EXPECTF(za->dtype == zb->dtype && memcmp(za->data, zb->data, (size_t)ct_numel(za) * ct_dtype_size(za->dtype)) == 0,
                   "%s %s: the residual's output differs", rms ? "rms_norm" : "layer_norm", ct_dtype_name(dts[di % 2]));
        for (int i = 0; i < 5; i++) {
            if (rms && i == 2) continue; /* no bias */
            ct_tensor *ga = host(c, d[0][i]->grad), *gb = host(c, d[1][i]->grad);
            CT_EXPECTF(memcmp(ga->data, gb->data, (size_t)ct_numel(ga) * 4) == 0, "%s %s: gradient of input %d differs",
                       rms ? "rms_norm" : "layer_norm", ct_dtype_name(dts[di % 2]), i);
        }
        ct_ctx_free(c);
    }
}
CT_TEST(cast_on_cuda_matches_cpu_bit_for_bit) {
    NEED_GPU();
    const int64_t sh[1][4] = {{1031, 9}};
    check_op("cast bf16", op_cast, (int64_t[]){CT_BF16}, 1, (int[]){2}, sh, 0.0);
    check_op("cast f16", op_cast, (int64_t[]){CT_F16}, 1, (int[]){2}, sh, 0.0);
}

/* t's values as f32 on the host */
static ct_tensor *host_f32(ct_ctx *c, ct_tensor *t) {
    ct_tensor *h = host(c, t);
    return h->dtype == CT_F32 ? h : ct_cast(c, h, CT_F32);
}
/* the loss of every output o[k], weighted: sum over k of sum(f32(o[k]) * w[k]), so that each
 * backward runs and every gradient element counts; the weights drawn on the CPU (d = 0, into w0)
 * and copied to cuda:0 (d = 1, into wd) */
static ct_tensor *weighted_loss(ct_ctx *c, ct_tensor **o, ct_tensor **w0, ct_tensor **wd, int nout, int d) {
    ct_tensor *loss = NULL;
    for (int k = 0; k < nout; k++) {
        if (d == 0) w0[k] = rnd(c, o[k]->ndim, o[k]->shape, 1.0f);
        else if (ct_tensor_to(c, w0[k], CT_CUDA(0), &wd[k]) != CT_OK) {
            fprintf(stderr, "weights to cuda:0: %s\n", ct_last_error());
            abort();
        }
        ct_tensor *term = ct_sum(c, ct_mul(c, ct_cast(c, o[k], CT_F32), wd[k]));
        loss = loss ? ct_add(c, loss, term) : term;
    }
    return loss;
}
/* the outputs on the CPU (a) and on cuda:0 (b): dtypes want[k], values within 1e-2 */
static void check_outs(ct_ctx *c, ct_tensor **a, ct_tensor **b, const ct_dtype *want, const char *const *names, int nout) {
    for (int k = 0; k < nout; k++) {
        CT_EXPECTF(a[k]->dtype == want[k] && b[k]->dtype == a[k]->dtype && b[k]->device.type == CT_DEV_CUDA,
                   "%s: cpu %s, cuda %s (want %s)", names[k], ct_dtype_name(a[k]->dtype), ct_dtype_name(b[k]->dtype),
                   ct_dtype_name(want[k]));
        double e = normwise(host_f32(c, b[k])->data, host_f32(c, a[k])->data, ct_numel(a[k]));
        CT_EXPECTF(e <= 1e-2, "%s: error %g against the CPU", names[k], e);
    }
}
/* bf16 inputs under autocast: softmax, log_softmax, mse_loss, sum and mean (f32 ops: f32
 * results) and bias_add (bf16 with a bf16 bias, f32 with an f32 one), whose device kernels read
 * the bf16 tensors themselves, against the CPU under autocast: output dtypes the CPU's, outputs
 * and the gradients of the f32 leaves (through the casts) within 1e-2 */
CT_TEST(lowp_ops_under_autocast_on_cuda_match_cpu) {
    NEED_GPU();
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    enum { X, T, X4, B, NIN };
    const int nd[NIN] = {2, 2, 4, 1};
    const int64_t shapes[NIN][4] = {{33, 300}, {33, 300}, {6, 7, 5, 3}, {7}};
    ct_tensor *leaf[2][NIN];
    for (int i = 0; i < NIN; i++) {
        leaf[0][i] = rnd(c, nd[i], shapes[i], 2.0f);
        OK(ct_tensor_to(c, leaf[0][i], CT_CUDA(0), &leaf[1][i]));
    }
    enum { SM, LSM, BA, BA_MIX, MSE, SUM, MEAN, NOUT };
    static const char *names[NOUT] = {"softmax", "log_softmax", "bias_add", "bias_add (f32 bias)", "mse_loss", "sum", "mean"};
    static const ct_dtype want[NOUT] = {CT_F32, CT_F32, CT_BF16, CT_F32, CT_F32, CT_F32, CT_F32};
    ct_tensor *out[2][NOUT], *w[2][NOUT];
    for (int d = 0; d < 2; d++) {
        ct_tensor *in[NIN], **o = out[d];
        for (int i = 0; i < NIN; i++) {
            ct_requires_grad(leaf[d][i]);
            in[i] = ct_cast(c, leaf[d][i], CT_BF16);
        }
        OK(ct_autocast_begin(c, CT_BF16));
        o[SM] = ct_softmax(c, in[X]);
        o[LSM] = ct_log_softmax(c, in[X]);
        o[BA] = ct_bias_add(c, in[X4], in[B]);
        o[BA_MIX] = ct_bias_add(c, in[X4], leaf[d][B]);
        o[MSE] = ct_mse_loss(c, in[X], in[T]);
        o[SUM] = ct_sum(c, in[X]);
        o[MEAN] = ct_mean(c, in[X4]);
        ct_autocast_end(c);
        ct_backward(c, weighted_loss(c, o, w[0], w[d], NOUT, d));
        CT_ASSERT(ct_ctx_status(c) == CT_OK ||
                  (fprintf(stderr, "bf16 ops under autocast on %s: %s\n", d ? "cuda:0" : "cpu", ct_last_error()), 0));
    }
    check_outs(c, out[0], out[1], want, names, NOUT);
    static const char *leaves[NIN] = {"x", "target", "x [N, C, H, W]", "bias"};
    for (int i = 0; i < NIN; i++) {
        double e = normwise(host(c, leaf[1][i]->grad)->data, leaf[0][i]->grad->data, ct_numel(leaf[0][i]));
        CT_EXPECTF(e <= 1e-2, "gradient of %s: error %g against the CPU", leaves[i], e);
    }
    ct_ctx_free(c);
}

/* Llama's ops (ops.c's silu, ops_llama.c): rms_norm with and without its weight, silu, rope
 * (positions 0..T-1, and given i64 positions on the device), repeat_kv; within 1e-6 */
static ct_tensor *op_rms_norm(ct_ctx *c, ct_tensor **in, const int64_t *arg) {
    return ct_rms_norm(c, in[0], arg[0] ? in[1] : NULL, 1e-6f);
}
static ct_tensor *op_silu(ct_ctx *c, ct_tensor **in, const int64_t *arg) { (void)arg; return ct_silu(c, in[0]); }
static ct_tensor *op_rope(ct_ctx *c, ct_tensor **in, const int64_t *arg) {
    (void)arg;
    return ct_rope(c, in[0], NULL, 10000.0f);
}
static ct_tensor *op_repeat_kv(ct_ctx *c, ct_tensor **in, const int64_t *arg) { return ct_repeat_kv(c, in[0], (int)arg[0]); }
CT_TEST(llama_ops_on_cuda_match_cpu) {
    NEED_GPU();
    const int64_t sh[2][4] = {{3, 11, 300}, {300}};
    check_op("rms_norm", op_rms_norm, (int64_t[]){1}, 2, (int[]){3, 1}, sh, 1e-6);
    check_op("rms_norm (no weight)", op_rms_norm, (int64_t[]){0}, 1, (int[]){3}, sh, 1e-6);
    const int64_t sx[1][4] = {{7, 1000}};
    check_op("silu", op_silu, NULL, 1, (int[]){2}, sx, 1e-6);
    const int64_t sq[1][4] = {{2, 3, 37, 64}};
    check_op("rope", op_rope, NULL, 1, (int[]){4}, sq, 1e-6);
    const int64_t sk[1][4] = {{2, 2, 9, 16}};
    check_op("repeat_kv", op_repeat_kv, (int64_t[]){3}, 1, (int[]){4}, sk, 0.0);
}
/* rope at given positions (i64 on the device, as generation passes them) and theta 5e5, plain
 * and with Llama 3.1's scaling (original context 64, factors 1 and 4: at D = 32 every regime),
 * forward and backward against the CPU */
CT_TEST(rope_positions_on_cuda_match_cpu) {
    NEED_GPU();
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    const int64_t T = 13;
    int64_t pos[13];
    for (int t = 0; t < T; t++) pos[t] = 100 + 31 * t;
    const ct_rope_scaling llama3 = {8.0f, 1.0f, 4.0f, 64};
    for (int scaled = 0; scaled < 2; scaled++) {
        const ct_rope_scaling *rs = scaled ? &llama3 : NULL;
        ct_tensor *x = rnd(c, 4, (int64_t[]){1, 4, T, 32}, 2.0f), *p = ct_from_data(c, CT_I64, pos, 1, &T), *xd, *pd;
        OK(ct_tensor_to(c, x, CT_CUDA(0), &xd));
        OK(ct_tensor_to(c, p, CT_CUDA(0), &pd));
        ct_requires_grad(x);
        ct_requires_grad(xd);
        ct_tensor *y = ct_rope_scaled(c, x, p, 500000.0f, rs);
        ct_backward(c, ct_sum(c, ct_mul(c, y, y)));
        ct_tensor *yd = ct_rope_scaled(c, xd, pd, 500000.0f, rs);
        ct_backward(c, ct_sum(c, ct_mul(c, yd, yd)));
        CT_ASSERT(ct_ctx_status(c) == CT_OK || (fprintf(stderr, "rope on cuda:0: %s\n", ct_last_error()), 0));
        double e = normwise(host(c, yd)->data, y->data, ct_numel(y));
        CT_EXPECTF(e <= 1e-6, "rope at positions%s: error %g", scaled ? ", llama3 scaling" : "", e);
        e = normwise(host(c, xd->grad)->data, x->grad->data, ct_numel(x));
        CT_EXPECTF(e <= 1e-6, "rope backward at positions%s: error %g", scaled ? ", llama3 scaling" : "", e);
    }
    ct_ctx_free(c);
}
/* bf16 inputs under autocast: rms_norm (an f32 op: an f32 result) and silu, rope, repeat_kv
 * (bf16 results), their device kernels reading bf16, against the CPU under autocast: dtypes the
 * CPU's, outputs and the gradients of the f32 leaves within 1e-2 */
CT_TEST(llama_ops_bf16_autocast_on_cuda_match_cpu) {
    NEED_GPU();
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *leaf[2][3];
    const int64_t shapes[3][4] = {{2, 4, 21, 32}, {32}, {2, 2, 21, 32}};
    const int nd[3] = {4, 1, 4};
    for (int i = 0; i < 3; i++) {
        leaf[0][i] = rnd(c, nd[i], shapes[i], 2.0f);
        OK(ct_tensor_to(c, leaf[0][i], CT_CUDA(0), &leaf[1][i]));
    }
    enum { RMS, SILU, ROPE, REP, NOUT };
    static const char *names[NOUT] = {"rms_norm", "silu", "rope", "repeat_kv"};
    static const ct_dtype want[NOUT] = {CT_F32, CT_BF16, CT_BF16, CT_BF16};
    ct_tensor *out[2][NOUT], *w[2][NOUT];
    for (int d = 0; d < 2; d++) {
        ct_tensor **o = out[d], *x, *kv;
        for (int i = 0; i < 3; i++) ct_requires_grad(leaf[d][i]);
        x = ct_cast(c, leaf[d][0], CT_BF16);
        kv = ct_cast(c, leaf[d][2], CT_BF16);
        OK(ct_autocast_begin(c, CT_BF16));
        o[RMS] = ct_rms_norm(c, x, leaf[d][1], 1e-6f);
        o[SILU] = ct_silu(c, x);
        o[ROPE] = ct_rope(c, x, NULL, 10000.0f);
        o[REP] = ct_repeat_kv(c, kv, 2);
        ct_autocast_end(c);
        ct_backward(c, weighted_loss(c, o, w[0], w[d], NOUT, d));
        CT_ASSERT(ct_ctx_status(c) == CT_OK ||
                  (fprintf(stderr, "llama ops under autocast on %s: %s\n", d ? "cuda:0" : "cpu", ct_last_error()), 0));
    }
    check_outs(c, out[0], out[1], want, names, NOUT);
    static const char *leaves[3] = {"x", "rms_norm weight", "kv"};
    for (int i = 0; i < 3; i++) {
        double e = normwise(host(c, leaf[1][i]->grad)->data, leaf[0][i]->grad->data, ct_numel(leaf[0][i]));
        CT_EXPECTF(e <= 1e-2, "gradient of %s: error %g against the CPU", leaves[i], e);
    }
    ct_ctx_free(c);
}

/* attention(x, x, x): the three gradients accumulate into one on the device too */
CT_TEST(attention_one_input_three_times) {
    NEED_GPU();
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = rnd(c, 4, (int64_t[]){1, 2, 40, 16}, 1.0f), *xd, *gh = NULL;
    OK(ct_tensor_to(c, x, CT_CUDA(0), &xd));
    ct_tensor *t[2] = {x, xd};
    for (int d = 0; d < 2; d++) {
        ct_requires_grad(t[d]);
        ct_backward(c, ct_sum(c, ct_mul(c, ct_attention(c, t[d], t[d], t[d], true), t[d])));
    }
    CT_ASSERT(ct_ctx_status(c) == CT_OK || (fprintf(stderr, "attention(x, x, x) on cuda:0: %s\n", ct_last_error()), 0));
    gh = host(c, xd->grad);
    double e = normwise(gh->data, x->grad->data, ct_numel(x));
    CT_EXPECTF(e <= 1e-5, "gradient of x: error %g", e);
    ct_ctx_free(c);
}

CT_TEST_MAIN()
