/* conv2d, max_pool2d, relu_max_pool2d and avg_pool2d on cuda:0 (cuDNN, and pool.cu's max
 * pooling) against the CPU ops on random inputs: odd sizes, stride 2, padding, bias or none,
 * each op used twice so its backward both writes a fresh gradient and adds to one. conv2d
 * and avg_pool2d within 1e-5 normwise (cuDNN sums in its own order; FFT and Winograd
 * algorithms are not used, see src/cuda/conv.c); max pooling bit-equal, ties and a NaN
 * included; the CNN model's loss and gradients. Without a GPU these skip with "no CUDA GPU"; the cuDNN loader's failure path and
 * CT_GPU_CHECK(cudnn, ...) are tested anyway. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include "ct_test.h"
#include "ctrain/models.h"
#include "ctrain/nn.h"
#include "ctrain/ops.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cudnn_lib.h"
#include "gpu/gpu_test.h"
#include "ops/op_table.h"
#include "kernel_check.h"

#define OK(call) CT_ASSERT((call) == CT_OK || (fprintf(stderr, "%s: %s\n", #call, ct_last_error()), 0))

/* a loss whose gradient at y is g: sum(y * g) */
static ct_tensor *seeded(ct_ctx *c, ct_tensor *y, ct_tensor *g) { return ct_sum(c, ct_mul(c, y, g)); }
/* normwise error of device tensor d against host tensor h */
static double err_of(ct_ctx *c, ct_tensor *d, ct_tensor *h) {
    ct_tensor *t = NULL;
    if (ct_tensor_to(c, d, CT_CPU, &t) != CT_OK) return INFINITY;
    return normwise(t->data, h->data, ct_numel(h));
}

typedef struct { int64_t N, C, H, W, O, k; int s, p; bool bias; } conv_case;

static void check_conv(const conv_case *k) {
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = rnd(c, 4, (int64_t[]){k->N, k->C, k->H, k->W}, 1.0f), *w = rnd(c, 4, (int64_t[]){k->O, k->C, k->k, k->k}, 0.5f);
    ct_tensor *b = k->bias ? rnd(c, 1, &k->O, 0.5f) : NULL, *t[2][3] = {{x, w, b}}, *y[2], *g[2];
    for (int i = 0; i < 3; i++)
        if (t[0][i]) OK(ct_tensor_to(c, t[0][i], CT_CUDA(0), &t[1][i]));
    for (int j = 0; j < 2; j++) {
        for (int i = 0; i < 3; i++)
            if (t[j][i]) ct_requires_grad(t[j][i]);
        /* twice: the second backward adds to the gradients the first wrote */
        ct_tensor *a = ct_conv2d(c, t[j][0], t[j][1], t[j][2], k->s, k->p), *a2 = ct_conv2d(c, t[j][0], t[j][1], t[j][2], k->s, k->p);
        y[j] = ct_add(c, a, ct_scale(c, a2, 0.5f));
        if (j == 0) g[0] = rnd(c, 4, y[0]->shape, 1.0f);
        else OK(ct_tensor_to(c, g[0], CT_CUDA(0), &g[1]));
        ct_backward(c, seeded(c, y[j], g[j]));
    }
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "conv2d on cuda:0: %s", ct_last_error());
    double e[4] = {err_of(c, y[1], y[0]), err_of(c, t[1][0]->grad, x->grad), err_of(c, t[1][1]->grad, w->grad),
                   b ? err_of(c, t[1][2]->grad, b->grad) : 0};
    const char *part[4] = {"forward", "input gradient", "weight gradient", "bias gradient"};
    for (int i = 0; i < 4; i++)
        CT_EXPECTF(e[i] <= 1e-5, "conv2d x [%lld, %lld, %lld, %lld] w %lldx%lld stride %d pad %d: %s error %g", (long long)k->N,
                   (long long)k->C, (long long)k->H, (long long)k->W, (long long)k->k, (long long)k->k, k->s, k->p, part[i], e[i]);
    printf("    conv2d %lldx%lldx%lld k%lld s%d p%d: errors %.1e %.1e %.1e %.1e\n", (long long)k->C, (long long)k->H, (long long)k->W,
           (long long)k->k, k->s, k->p, e[0], e[1], e[2], e[3]);
    ct_ctx_free(c);
}

CT_TEST(conv2d_on_cuda_matches_cpu) {
    NEED_GPU();
    static const conv_case cases[] = {
        {2, 3, 9, 7, 5, 3, 1, 1, true},    /* odd sizes */
        {3, 4, 11, 13, 6, 3, 2, 1, true},  /* stride 2 */
        {2, 16, 8, 8, 32, 3, 1, 1, false}, /* the CPU's direct kernels, no bias */
        {1, 3, 7, 7, 4, 1, 2, 0, true},    /* 1x1 */
        {2, 5, 10, 9, 3, 5, 2, 2, true},   /* 5x5, padding 2 */
        {4, 1, 28, 28, 8, 5, 1, 0, true},  /* the CNN's first layer on MNIST */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_conv(&cases[i]);
}

/* op 0 max, 1 relu + max, 2 avg */
static void check_pool(int op, int64_t H, int64_t W, int k, int s, int p) {
    static const char *names[3] = {"max_pool2d", "relu_max_pool2d", "avg_pool2d"};
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = rnd(c, 4, (int64_t[]){2, 3, H, W}, 1.0f), *t[2], *y[2], *g[2];
    if (op < 2) { /* ties everywhere (a grid of 5 values) and a NaN */
        for (int64_t i = 0; i < ct_numel(x); i++) ct_f32(x)[i] = roundf(ct_f32(x)[i] * 2.0f) * 0.5f;
        ct_f32(x)[H * W + 5] = NAN;
    }
    t[0] = x;
    OK(ct_tensor_to(c, x, CT_CUDA(0), &t[1]));
    for (int j = 0; j < 2; j++) {
        ct_requires_grad(t[j]);
        ct_tensor *a[2];
        for (int r = 0; r < 2; r++)
            a[r] = op == 0 ? ct_max_pool2d(c, t[j], k, s, p) : op == 1 ? ct_relu_max_pool2d(c, t[j], k, s, p) : ct_avg_pool2d(c, t[j], k, s, p);
        y[j] = ct_add(c, a[0], a[1]);
        if (j == 0) g[0] = rnd(c, 4, y[0]->shape, 1.0f);
        else OK(ct_tensor_to(c, g[0], CT_CUDA(0), &g[1]));
        ct_backward(c, seeded(c, y[j], g[j]));
    }
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "%s on cuda:0: %s", names[op], ct_last_error());
    double e[2] = {err_of(c, y[1], y[0]), err_of(c, t[1]->grad, x->grad)}, tol = op == 2 ? 1e-5 : 0;
    /* max pooling: bit for bit, but any NaN where the CPU has one: y adds two pools, and a GPU's
     * NaN + NaN is the canonical NaN where x86 keeps the first operand's bits (H200, 2026-12-04) */
    for (int i = 0; i < 2; i++) {
        if (op < 2 && i == 0) {
            ct_tensor *h = NULL;
            OK(ct_tensor_to(c, y[1], CT_CPU, &h));
            int64_t bad = 0;
            for (int64_t q = 0; q < ct_numel(h); q++) /* any NaN for a NaN: its sign and payload are not promised */
                bad += memcmp(ct_f32(h) + q, ct_f32(y[0]) + q, sizeof(float)) != 0 && !(isnan(ct_f32(h)[q]) && isnan(ct_f32(y[0])[q]));
            e[0] = (double)bad;
        }
        CT_EXPECTF(e[i] <= tol, "%s %dx%d/%d pad %d on %lldx%lld: %s error %g", names[op], k, k, s, p, (long long)H, (long long)W,
                   i ? "gradient" : "forward", e[i]);
    }
    ct_ctx_free(c);
}

CT_TEST(pooling_on_cuda_matches_cpu) {
    NEED_GPU();
    for (int op = 0; op < 3; op++) {
        check_pool(op, 12, 16, 2, 2, 0); /* the CNN's */
        check_pool(op, 13, 11, 3, 2, 1); /* overlapping windows, odd sizes, padding */
        check_pool(op, 9, 7, 3, 1, 1);
        check_pool(op, 7, 10, 2, 2, 1);
    }
}

/* the CNN model (conv2d, relu_max_pool2d, flatten, linear, relu, cross-entropy) on cuda:0:
 * the loss within 1e-5 of the CPU's, every gradient within 1e-4 normwise (the errors of
 * several ops compound; a max-pool window whose two largest values lie within the rounding
 * difference could route a gradient elsewhere, which random inputs make unlikely) */
/* the small CNN on cuda:0 against the CPU, in f32 (loss <= 1e-5, gradients <= 1e-4) or under
 * bf16/f16 autocast on both (conv2d on cuDNN's low-precision path, the poolings reading
 * bf16/f16: loss and gradients within tol) */
static void cnn_match(ct_dtype amp, double tol, double gtol) {
    ct_model_config cfg = ct_model_default_config(CT_MODEL_CNN);
    cfg.cnn.height = cfg.cnn.width = 12;
    cfg.cnn.c1 = 4;
    cfg.cnn.c2 = 6;
    cfg.cnn.kernel = 3;
    cfg.cnn.fc = 16;
    cfg.cnn.classes = 5;
    cfg.cnn.dropout = 0;
    ct_model *m[2];
    for (int j = 0; j < 2; j++) OK(ct_model_create(&cfg, 9, &m[j]));
    OK(ct_module_to(ct_model_module(m[1]), CT_CUDA(0)));
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    int64_t B = 3, lab[3] = {1, 4, 0};
    ct_tensor *x[2], *y[2];
    x[0] = rnd(c, 4, (int64_t[]){B, 1, 12, 12}, 1.0f);
    y[0] = ct_from_data(c, CT_I64, lab, 1, &B);
    OK(ct_tensor_to(c, x[0], CT_CUDA(0), &x[1]));
    OK(ct_tensor_to(c, y[0], CT_CUDA(0), &y[1]));
    double l[2];
    for (int j = 0; j < 2; j++) {
        if (amp != CT_F32) OK(ct_autocast_begin(c, amp));
        ct_tensor *loss = ct_cross_entropy(c, ct_model_forward(c, m[j], x[j]), y[j], -100);
        if (amp != CT_F32) ct_autocast_end(c);
        l[j] = ct_item(loss);
        ct_backward(c, loss);
    }
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "CNN on cuda:0 (%s): %s", ct_dtype_name(amp), ct_last_error());
    CT_EXPECTF(fabs(l[1] - l[0]) <= tol * fabs(l[0]), "CNN loss (%s): cuda %.9g cpu %.9g", ct_dtype_name(amp), l[1], l[0]);
    ct_params *P[2] = {ct_model_params(m[0]), ct_model_params(m[1])};
    for (int i = 0; i < ct_params_count(P[0]); i++) {
        ct_tensor *pc = ct_params_get(P[0], i), *pg = ct_params_get(P[1], i);
        double e = err_of(c, pg->grad, pc->grad);
        CT_EXPECTF(e <= gtol, "CNN gradient of %s (%s): normwise error %g", pc->name, ct_dtype_name(amp), e);
    }
    printf("    CNN on cuda:0 (%s): loss %.7f (cpu %.7f)\n", ct_dtype_name(amp), l[1], l[0]);
    ct_ctx_free(c);
    for (int j = 0; j < 2; j++) ct_model_free(m[j]);
}
CT_TEST(cnn_model_on_cuda_matches_cpu) {
    NEED_GPU();
    cnn_match(CT_F32, 1e-5, 1e-4);
}
/* low precision: the device computes in f32 on the rounded operands and rounds once, as the
 * CPU does, but its sums run in other orders, so a value may round the other way (and move a
 * max pooling's choice): bf16's tolerance */
CT_TEST(cnn_model_bf16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    cnn_match(CT_BF16, 2e-2, 3e-2);
}
CT_TEST(cnn_model_f16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    cnn_match(CT_F16, 1e-2, 1e-2);
}

/* Without a GPU: a missing cuDNN is a clean CT_ERR_UNSUPPORTED naming the library; the one
 * here either loads (its version printed) or fails the same way. */
CT_TEST(cudnn_missing_is_a_clean_status) {
    ct_cudnn_fns f;
    ct_status st = ct_cudnn_load_from("libcudnn_missing.so.9", &f, "conv2d");
    CT_EXPECT_EQ(st, CT_ERR_UNSUPPORTED);
    CT_EXPECTF(strstr(ct_last_error(), "conv2d: cuDNN: cannot load libcudnn_missing.so.9"), "%s", ct_last_error());
    size_t v = ct_cuda_cudnn_version();
    if (v) {
        CT_EXPECTF(v / 10000 == CUDNN_MAJOR, "cuDNN %zu loaded, headers %d", v, CUDNN_MAJOR);
        printf("    cuDNN %zu loaded\n", v);
    } else {
        st = ct_cudnn_ready("conv2d");
        CT_EXPECTF(st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "libcudnn.so."), "%s", ct_last_error());
        printf("    cuDNN not loadable here: %s\n", ct_last_error());
    }
}

CT_TEST(cudnn_errors_name_the_call_and_op) {
    ct_status st = CT_GPU_CHECK(cudnn, "conv2d", CUDNN_STATUS_BAD_PARAM);
    CT_EXPECT_EQ(st, CT_ERR_INVALID);
    CT_EXPECTF(strstr(ct_last_error(), "conv2d on cuda:") && strstr(ct_last_error(), "CUDNN_STATUS_BAD_PARAM failed"), "%s",
               ct_last_error());
    CT_EXPECT_EQ(CT_GPU_CHECK(cudnn, "conv2d", CUDNN_STATUS_NOT_SUPPORTED_SHAPE), CT_ERR_UNSUPPORTED);
    CT_EXPECT_EQ(CT_GPU_CHECK(cudnn, "conv2d", CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED), CT_ERR_NOMEM);
    CT_EXPECT_EQ(CT_GPU_CHECK(cudnn, "conv2d", CUDNN_STATUS_EXECUTION_FAILED), CT_ERR_SYSTEM);
    CT_EXPECT_EQ(CT_GPU_CHECK(cudnn, "conv2d", CUDNN_STATUS_SUCCESS), CT_OK);
}

/* the rows are in the device column (registered at start, without touching the driver) */
CT_TEST(conv_and_pool_rows_registered) {
    const int ops[4] = {CT_OP_CONV2D, CT_OP_MAX_POOL2D, CT_OP_RELU_MAX_POOL2D, CT_OP_AVG_POOL2D};
    for (int i = 0; i < 4; i++)
        CT_EXPECTF(ct_op_table_dev[ops[i]].forward && ct_op_table_dev[ops[i]].row.backward, "%s has no CUDA row",
                   ct_op_table[ops[i]].name);
}

CT_TEST_MAIN()
