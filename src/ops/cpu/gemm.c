/* matmul and linear on sgemm (ops/cpu/blas.h: ctrain's AVX-512 kernel or OpenBLAS). Transposes
 * are GEMM flags: nothing is copied, forward or backward. Backward accumulates with beta = 1 straight into the gradients
 * (for a parameter that is its slice of the flat gradient buffer). */
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/blas.h"

/* C = op(A) op(B) + beta C, through the shared wrapper (own AVX-512 sgemm or OpenBLAS); in a
 * bf16 autocast run (operands already bf16 values) through the bf16 GEMM, whose
 * CTRAIN_GEMM_BF16=native mode uses the CPU's bf16 dot products */
static void gemm_(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C, float beta) {
    if (bf16 && M > 0 && N > 0 && K > 0 && ct_sgemm_own_available())
        ct_sgemm_bf16(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
    else
        ct_sgemm(ta, tb, M, N, K, 1.0f, A, B, beta, C);
}
#define gemm(...) gemm_(bf16, __VA_ARGS__)

ct_tensor *ct_matmul(ct_ctx *ctx, ct_tensor *a, ct_tensor *b, bool ta, bool tb) {
    CT_DEV_DISPATCH(ctx, CT_OP_MATMUL, .in = {a, b}, .i = {ta, tb});
    CT_AUTOCAST(ctx, CT_OP_MATMUL, 2, ((ct_tensor **[]){&a, &b}), ct_matmul(ctx, a, b, ta, tb));
    int64_t M, N, Ka, batch;
    ct_check_matmul(a, b, ta, tb, &M, &N, &Ka, &batch);
    int64_t shape[3] = {batch, M, N};
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    ct_tensor *c = ct_new(ctx, CT_F32, a->ndim, a->ndim == 3 ? shape : shape + 1);
    for (int64_t i = 0; i < batch; i++)
        gemm(ta, tb, M, N, Ka, ct_f32(a) + i * M * Ka, ct_f32(b) + i * Ka * N, ct_f32(c) + i * M * N, 0.0f);
    ct_node *n = ct_record(ctx, CT_OP_MATMUL, c, 2, (ct_tensor *[]){a, b});
    if (n) { n->i[0] = ta; n->i[1] = tb; n->i[2] = M; n->i[3] = N; n->i[4] = Ka; n->i[5] = batch; }
    return c;
}

void ct_bw_matmul(ct_ctx *ctx, ct_node *n) {
    bool ta = n->i[0], tb = n->i[1];
    int64_t M = n->i[2], N = n->i[3], K = n->i[4], batch = n->i[5];
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    const float *A = n->in[0]->data, *B = n->in[1]->data, *dC = n->out->grad->data;
    float *dA = ct_grad_acc(ctx, n->in[0]), *dB = ct_grad_acc(ctx, n->in[1]);
    for (int64_t i = 0; i < batch; i++) {
        const float *Ai = A + i * M * K, *Bi = B + i * K * N, *dCi = dC + i * M * N;
        if (dA) {
            if (!ta) gemm(false, !tb, M, K, N, dCi, Bi, dA + i * M * K, 1.0f);  /* dA = dC op(B)^T */
            else gemm(tb, true, K, M, N, Bi, dCi, dA + i * M * K, 1.0f);        /* dA = op(B) dC^T */
        }
        if (dB) {
            if (!tb) gemm(!ta, false, K, N, M, Ai, dCi, dB + i * K * N, 1.0f);  /* dB = op(A)^T dC */
            else gemm(true, ta, N, K, M, dCi, Ai, dB + i * K * N, 1.0f);        /* dB = dC^T op(A) */
        }
    }
}

ct_tensor *ct_linear(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b) {
    CT_DEV_DISPATCH(ctx, CT_OP_LINEAR, .in = {x, w, b});
    CT_AUTOCAST(ctx, CT_OP_LINEAR, 3, ((ct_tensor **[]){&x, &w, &b}), ct_linear(ctx, x, w, b));
    int64_t rows, in, out;
    ct_check_linear(x, w, b, &rows, &in, &out);
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    ct_tensor *y = ct_new(ctx, CT_F32, x->ndim, shape);
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    float *Y = y->data;
    if (b) {
        const float *B = b->data;
        for (int64_t r = 0; r < rows; r++) memcpy(Y + r * out, B, (size_t)out * sizeof(float));
    }
    gemm(false, true, rows, out, in, x->data, w->data, Y, b ? 1.0f : 0.0f);
    ct_node *n = ct_record(ctx, CT_OP_LINEAR, y, b ? 3 : 2, (ct_tensor *[]){x, w, b});
    if (n) { n->i[0] = rows; n->i[1] = in; n->i[2] = out; }
    return y;
}

void ct_bw_linear(ct_ctx *ctx, ct_node *n) {
    int64_t rows = n->i[0], in = n->i[1], out = n->i[2];
    const float *dY = n->out->grad->data;
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    float *dX = ct_grad_acc(ctx, n->in[0]), *dW = ct_grad_acc(ctx, n->in[1]);
    float *dB = n->nin > 2 ? ct_grad_acc(ctx, n->in[2]) : NULL;
    if (dX) gemm(false, false, rows, in, out, dY, n->in[1]->data, dX, 1.0f);
    if (dW) gemm(true, false, out, in, rows, dY, n->in[0]->data, dW, 1.0f);
    if (dB)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < out; j++) dB[j] += dY[r * out + j];
}
