/* The ops of src/cuda/ops_more.c on cuda:0 against the same ops on the CPU, forward and
 * backward, on random inputs: bias_add, softmax, log_softmax, mse_loss, plain attention
 * (causal and not, Tq != Tk, Dv != D), and cast f32 -> bf16 / f16 -> f32. Each op's output
 * y is reduced as sum(y * w) with a random w, so every element of every input gradient is
 * checked. Tolerance 1e-5 normwise in f32; the casts must agree bit for bit. Built only with
 * CUDA; without a GPU every test skips with "no CUDA GPU" (scripts/gpu-check.sh runs them). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
CT_TEST(cast_on_cuda_matches_cpu_bit_for_bit) {
    NEED_GPU();
    const int64_t sh[1][4] = {{1031, 9}};
    check_op("cast bf16", op_cast, (int64_t[]){CT_BF16}, 1, (int[]){2}, sh, 0.0);
    check_op("cast f16", op_cast, (int64_t[]){CT_F16}, 1, (int[]){2}, sh, 0.0);
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
