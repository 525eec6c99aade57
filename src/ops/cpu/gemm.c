/* matmul and linear on sgemm (ops/cpu/blas.h: ctrain's AVX-512 or AVX2 kernels, or OpenBLAS). Transposes
 * are GEMM flags: nothing is copied, forward or backward. Backward accumulates with beta = 1 straight into the gradients
 * (for a parameter that is its slice of the flat gradient buffer); an input gradient the
 * GEMM creates (ct_grad_acc_fresh) is written with beta = 0 instead of zeroed first and
 * read back (the same bits: the GEMM's sums are never -0, so adding them to +0 changes nothing).
 * Under bf16 autocast linear returns its output as bf16 itself (ct_sgemm_bf16_out rounds in the
 * GEMM's last store, ct_ac_leave keeps it): no f32 output written and read back to convert. */
#include <omp.h>
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/blas.h"
#include "ops/kmath.h"

/* An operand: f32, or bf16 storage (h) — in a bf16 run autocast hands matmul and linear their
 * bf16 tensors as they are (autocast.c, ct_ac_reads_bf16) */
typedef struct {
    const void *p;
    bool h;
} operand;
static operand opnd(const ct_tensor *t, int64_t off) {
    bool h = t->dtype == CT_BF16;
    return (operand){(const char *)t->data + off * (h ? 2 : 4), h};
}
static operand f32op(const float *p) { return (operand){p, false}; }

/* C = op(A) op(B) + beta C, through the shared wrapper (own sgemm or OpenBLAS); in a
 * bf16 run through the bf16 GEMM (AMX, AVX-512 BF16 or rounded operands by CTRAIN_GEMM_BF16; rounded on AVX2),
 * which reads bf16 storage directly */
static void gemm_(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, operand A, operand B, float *C, float beta) {
    if (bf16 && M > 0 && N > 0 && K > 0 && ct_ac_reads_bf16())
        ct_sgemm_bf16_ex(ta, tb, M, N, K, 1.0f, A.p, A.h, ta ? M : K, B.p, B.h, tb ? K : N, beta, C, N);
    else {
        CT_CHECK(!A.h && !B.h, "matmul/linear: bf16 operands without the bf16 GEMM");
        ct_sgemm(ta, tb, M, N, K, 1.0f, A.p, B.p, beta, C);
    }
}
#define gemm(...) gemm_(bf16, __VA_ARGS__)

/* op_table.h: the bf16 GEMM exists where an own family runs (AVX-512, or AVX2 and FMA) */
bool ct_ac_reads_bf16(void) { return ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE; }

/* f32, or bf16 in a bf16 run whose operands the GEMM reads as they are */
static void check_operand(ct_ctx *ctx, const char *op, const ct_tensor *t) {
    if (t->dtype == CT_BF16 && ct_ctx_lowp_run_(ctx) == CT_BF16 && ct_ac_reads_bf16()) return;
    CT_CHECK_F32(op, t);
}

ct_tensor *ct_matmul(ct_ctx *ctx, ct_tensor *a, ct_tensor *b, bool ta, bool tb) {
    CT_DEV_DISPATCH(ctx, CT_OP_MATMUL, .in = {a, b}, .i = {ta, tb});
    CT_AUTOCAST(ctx, CT_OP_MATMUL, 2, ((ct_tensor **[]){&a, &b}), ct_matmul(ctx, a, b, ta, tb));
    check_operand(ctx, "matmul", a);
    check_operand(ctx, "matmul", b);
    int64_t M, N, Ka, batch;
    ct_check_matmul(a, b, ta, tb, &M, &N, &Ka, &batch);
    int64_t shape[3] = {batch, M, N};
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    ct_tensor *c = ct_new(ctx, CT_F32, a->ndim, a->ndim == 3 ? shape : shape + 1);
    for (int64_t i = 0; i < batch; i++)
        gemm(ta, tb, M, N, Ka, opnd(a, i * M * Ka), opnd(b, i * Ka * N), ct_f32(c) + i * M * N, 0.0f);
    ct_node *n = ct_record(ctx, CT_OP_MATMUL, c, 2, (ct_tensor *[]){a, b});
    if (n) { n->i[0] = ta; n->i[1] = tb; n->i[2] = M; n->i[3] = N; n->i[4] = Ka; n->i[5] = batch; }
    return c;
}

void ct_bw_matmul(ct_ctx *ctx, ct_node *n) {
    bool ta = n->i[0], tb = n->i[1];
    int64_t M = n->i[2], N = n->i[3], K = n->i[4], batch = n->i[5];
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    const float *dC = n->out->grad->data;
    bool fa, fb;
    float *dA = ct_grad_acc_fresh(ctx, n->in[0], &fa), *dB = ct_grad_acc_fresh(ctx, n->in[1], &fb);
    const float ba = fa ? 0.0f : 1.0f, bb = fb ? 0.0f : 1.0f;
    for (int64_t i = 0; i < batch; i++) {
        operand Ai = opnd(n->in[0], i * M * K), Bi = opnd(n->in[1], i * K * N), dCi = f32op(dC + i * M * N);
        if (dA) {
            if (!ta) gemm(false, !tb, M, K, N, dCi, Bi, dA + i * M * K, ba);  /* dA = dC op(B)^T */
            else gemm(tb, true, K, M, N, Bi, dCi, dA + i * M * K, ba);        /* dA = op(B) dC^T */
        }
        if (dB) {
            if (!tb) gemm(!ta, false, K, N, M, Ai, dCi, dB + i * K * N, bb);  /* dB = op(A)^T dC */
            else gemm(true, ta, N, K, M, dCi, Ai, dB + i * K * N, bb);        /* dB = dC^T op(A) */
        }
    }
}

ct_tensor *ct_linear(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b) {
    CT_DEV_DISPATCH(ctx, CT_OP_LINEAR, .in = {x, w, b});
    CT_AUTOCAST(ctx, CT_OP_LINEAR, 3, ((ct_tensor **[]){&x, &w, &b}), ct_linear(ctx, x, w, b));
    check_operand(ctx, "linear", x);
    check_operand(ctx, "linear", w);
    int64_t rows, in, out;
    ct_check_linear(x, w, b, &rows, &in, &out);
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    /* Under bf16 autocast (inside its frame: temporaries on, both operands bf16) the output is
     * bf16: the GEMM's last store rounds it (the bits of the f32 result rounded by ct_ac_leave,
     * without that pass), the output is kept. The f32 sums are a temporary: the bias row alone
     * where K is one GEMM block (read for every row, ldc 0), else [rows, out] for the blocks. */
    bool lowp_out = bf16 && x->dtype == CT_BF16 && w->dtype == CT_BF16 && ct_ctx_temp_depth_(ctx) > 0 && ct_ac_reads_bf16();
    bool bias_row = lowp_out && in <= CT_SGEMM_KC;
    ct_tensor *y = lowp_out ? ct_wrap(ctx, CT_BF16, ct_ctx_alloc_keep(ctx, (size_t)(rows * out) * 2), x->ndim, shape)
                            : ct_new(ctx, CT_F32, x->ndim, shape);
    float *Y = lowp_out ? ct_ctx_alloc(ctx, (size_t)((bias_row ? 1 : rows) * out) * sizeof(float)) : y->data;
    /* f32 with an f32 bias on the own kernel: the GEMM reads the bias row itself (the bits of
     * beta 1 on rows filled with it, without writing those copies and reading them back) */
    bool bias_in = !lowp_out && !bf16 && b && b->dtype == CT_F32 && x->dtype == CT_F32 && w->dtype == CT_F32 &&
                   ct_sgemm_kernel_takes(rows, out, in);
    if (ct_ctx_values_unread_(ctx)) memset(y->data, 0, ct_nbytes(y));
    else if (bias_in)
        ct_sgemm_bias(false, true, rows, out, in, x->data, in, w->data, in, b->data, Y, out);
    else {
        if (b && rows > 0) {
            if (b->dtype != CT_F32) check_operand(ctx, "linear", b);
            ct_convert(Y, CT_F32, b->data, b->dtype, (size_t)out);
            for (int64_t r = 1; r < rows && !bias_row; r++) memcpy(Y + r * out, Y, (size_t)out * sizeof(float));
        }
        if (lowp_out)
            ct_sgemm_bf16_out(false, true, rows, out, in, 1.0f, x->data, true, in, w->data, true, in, b ? 1.0f : 0.0f, Y,
                              bias_row ? 0 : out, y->data, out);
        else
            gemm(false, true, rows, out, in, opnd(x, 0), opnd(w, 0), Y, b ? 1.0f : 0.0f);
    }
    ct_node *n = ct_record(ctx, CT_OP_LINEAR, y, b ? 3 : 2, (ct_tensor *[]){x, w, b});
    if (n) { n->i[0] = rows; n->i[1] = in; n->i[2] = out; }
    return y;
}

ct_tensor *ct_linear_unevaluated(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b) {
    bool prev = ct_ctx_set_values_unread_(ctx, true);
    ct_tensor *y = ct_linear(ctx, x, w, b);
    ct_ctx_set_values_unread_(ctx, prev);
    return y;
}

/* dB[j] += dY[r][j] for r = 0..rows-1 in order (where the dW GEMM does not sum them: ct_sgemm_own_rowsum), columns [j0, j1): 128 columns at a time in
 * registers across all rows (one load of each dY element; dB read and written once per
 * block, not once per row: the row-by-row loop ran at the store-to-load forwarding rate) */
static void col_sums(float *restrict dB, const float *restrict dY, int64_t rows, int64_t ld, int64_t j0, int64_t j1) {
    enum { W = 128 };
    int64_t j = j0;
    for (; j + W <= j1; j += W) {
        float acc[W];
        for (int e = 0; e < W; e++) acc[e] = dB[j + e];
        for (int64_t r = 0; r < rows; r++) {
            const float *y = dY + r * ld + j;
#pragma omp simd
            for (int e = 0; e < W; e++) acc[e] += y[e];
        }
        for (int e = 0; e < W; e++) dB[j + e] = acc[e];
    }
    for (int64_t r = 0; r < rows && j < j1; r++)
#pragma omp simd
        for (int64_t c = j; c < j1; c++) dB[c] += dY[r * ld + c];
}

void ct_bw_linear(ct_ctx *ctx, ct_node *n) {
    int64_t rows = n->i[0], in = n->i[1], out = n->i[2];
    const float *dY = n->out->grad->data;
    bool bf16 = ct_ctx_lowp_run_(ctx) == CT_BF16;
    bool fx, fw;
    float *dX = ct_grad_acc_fresh(ctx, n->in[0], &fx), *dW = ct_grad_acc_fresh(ctx, n->in[1], &fw);
    float *dB = n->nin > 2 ? ct_grad_acc(ctx, n->in[2]) : NULL;
    if (dX) gemm(false, false, rows, in, out, f32op(dY), opnd(n->in[1], 0), dX, fx ? 0.0f : 1.0f);
    if (dW && dB && !bf16 && n->in[0]->dtype == CT_F32 && ct_sgemm_kernel_takes(out, in, rows)) {
        /* dB's column sums while the dW GEMM packs dY: one read of dY for both */
        ct_sgemm_own_rowsum(out, in, rows, dY, out, ct_f32(n->in[0]), in, fw ? 0.0f : 1.0f, dW, in, dB);
        dB = NULL;
    } else if (dW) gemm(true, false, out, in, rows, f32op(dY), opnd(n->in[0], 0), dW, fw ? 0.0f : 1.0f);
    if (dB && bf16) { /* dY as the bf16 gradient it stands for (autocast leaves the rounding to this op) */
        float v[512];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j0 = 0; j0 < out; j0 += 512) {
                size_t m = (size_t)(out - j0 < 512 ? out - j0 : 512);
                const float *d = dY + r * out + j0;
#pragma omp simd
                for (size_t j = 0; j < m; j++) v[j] = ct_k_bf16_to_f32(ct_k_f32_to_bf16(d[j])); /* ct_convert's round trip, one pass */
                for (size_t j = 0; j < m; j++) dB[j0 + j] += v[j];
            }
    } else if (dB) {
        /* column sums, each in row order whatever the thread count: each thread sums its own
         * range of columns (16-column multiples) over all rows, as one thread sums them all */
#pragma omp parallel if (rows * out >= (int64_t)1 << 16)
        {
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t per = (out + 16 * nt - 1) / (16 * nt) * 16, j0 = t * per, j1 = j0 + per < out ? j0 + per : out;
            col_sums(dB, dY, rows, out, j0, j1);
        }
    }
}
