/* Autograd engine: finite-difference checks of the core ops, accumulation, no_grad,
 * and the parameter grad-ready hook order. */
#include <sys/wait.h>
#include <unistd.h>

#include "ct_test.h"
#include "gradcheck.h"

static ct_tensor *f_matmul(ct_ctx *c, ct_tensor **in, void *arg) {
    int m = *(int *)arg;
    return ct_matmul(c, in[0], in[1], m & 1, m & 2);
}
CT_TEST(gradcheck_matmul_all_transposes) {
    for (int m = 0; m < 4; m++) {
        ct_tensor_spec s[2] = {{2, {(m & 1) ? 5 : 3, (m & 1) ? 3 : 5}}, {2, {(m & 2) ? 4 : 5, (m & 2) ? 5 : 4}}};
        CT_EXPECT(ct_gradcheck(f_matmul, &m, 2, s, false) < 2e-3);
        ct_tensor_spec b[2] = {{3, {2, (m & 1) ? 5 : 3, (m & 1) ? 3 : 5}}, {3, {2, (m & 2) ? 4 : 5, (m & 2) ? 5 : 4}}};
        CT_EXPECT(ct_gradcheck(f_matmul, &m, 2, b, false) < 2e-3);
    }
}
static ct_tensor *f_linear(ct_ctx *c, ct_tensor **in, void *arg) { return ct_linear(c, in[0], in[1], arg ? in[2] : NULL); }
CT_TEST(gradcheck_linear) {
    ct_tensor_spec s[3] = {{3, {2, 3, 7}}, {2, {5, 7}}, {1, {5}}};
    CT_EXPECT(ct_gradcheck(f_linear, s, 3, s, false) < 2e-3);
    CT_EXPECT(ct_gradcheck(f_linear, NULL, 2, s, false) < 2e-3);
}
static ct_tensor *f_add_relu(ct_ctx *c, ct_tensor **in, void *arg) { (void)arg; return ct_relu(c, ct_add(c, in[0], in[1])); }
CT_TEST(gradcheck_add_broadcast_relu) {
    ct_tensor_spec s[2] = {{3, {2, 3, 4}}, {2, {3, 4}}};
    CT_EXPECT(ct_gradcheck_h(f_add_relu, NULL, 2, s, true, 1e-3, 3) < 2e-3);
}
static ct_tensor *f_views(ct_ctx *c, ct_tensor **in, void *arg) {
    (void)arg;
    ct_tensor *t = ct_transpose(c, in[0], 0, 2);            /* [4,3,2] non-contiguous */
    t = ct_slice(c, t, 1, 1, 2);                             /* [4,2,2] */
    t = ct_reshape(c, t, 2, (int64_t[]){-1, 2});             /* copy + view */
    return ct_mean(c, ct_add(c, t, t));
}
CT_TEST(gradcheck_views) {
    ct_tensor_spec s[1] = {{3, {2, 3, 4}}};
    CT_EXPECT(ct_gradcheck(f_views, NULL, 1, s, false) < 2e-3);
}

/* pad_rows: x's rows, then zeros; the gradient is the first rows' (exact values, and gradcheck) */
static ct_tensor *f_pad_rows(ct_ctx *c, ct_tensor **in, void *arg) {
    (void)arg;
    ct_tensor *p = ct_pad_rows(c, in[0], 2); /* [3,4] -> [5,4] */
    return ct_mean(c, ct_mul(c, p, ct_add(c, p, p)));
}
CT_TEST(pad_rows_values_and_gradient) {
    ct_ctx *c;
    CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = ct_zeros(c, CT_F32, 2, (int64_t[]){3, 4});
    for (int i = 0; i < 12; i++) ct_f32(x)[i] = (float)i - 5.5f;
    ct_tensor *y = ct_pad_rows(c, x, 2);
    CT_EXPECT(y->ndim == 2 && y->shape[0] == 5 && y->shape[1] == 4);
    for (int i = 0; i < 20; i++) CT_EXPECT(ct_f32(y)[i] == (i < 12 ? (float)i - 5.5f : 0.0f));
    ct_ctx_free(c);
    ct_tensor_spec s[1] = {{2, {3, 4}}};
    CT_EXPECT(ct_gradcheck(f_pad_rows, NULL, 1, s, false) < 2e-3);
}

static int hook_order[16], hook_n;
static void hook(void *u, ct_params *p, int i) { (void)u; (void)p; hook_order[hook_n++] = i; }

CT_TEST(grad_hook_fires_once_in_reverse_use_order) {
    ct_params *P; CT_EXPECT_OK(ct_params_create(&P));
    ct_tensor *w1 = ct_param(P, "l1.weight", 2, (int64_t[]){6, 4}, CT_INIT_KAIMING_UNIFORM, 4);
    ct_tensor *b1 = ct_param(P, "l1.bias", 1, (int64_t[]){6}, CT_INIT_KAIMING_UNIFORM, 4);
    ct_tensor *w2 = ct_param(P, "l2.weight", 2, (int64_t[]){3, 6}, CT_INIT_KAIMING_UNIFORM, 6);
    CT_EXPECT_OK(ct_params_finalize(P, 7));
    ct_params_set_grad_hook(P, hook, NULL);
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = ct_zeros(c, CT_F32, 2, (int64_t[]){2, 4});
    ct_fill(x, 0.5f);
    /* w1 used twice: its hook must wait for the second (earlier-recorded) use */
    ct_tensor *h = ct_relu(c, ct_linear(c, x, w1, b1));
    ct_tensor *h2 = ct_linear(c, x, w1, NULL);
    ct_tensor *y = ct_linear(c, ct_add(c, h, h2), w2, NULL);
    hook_n = 0;
    ct_backward(c, ct_sum(c, y));
    CT_EXPECT_EQ(hook_n, 3);
    CT_EXPECT_EQ(hook_order[0], 2);
    CT_EXPECT_EQ(hook_order[1], 0);
    CT_EXPECT_EQ(hook_order[2], 1);
    ct_ctx_free(c);
    ct_params_free(P);
}

/* w [2, 3] of ones in a store of its own (*P), a context, and x [1, 3] of twos in it */
static ct_tensor *ones_2x3(ct_params **P, ct_ctx **c, ct_tensor **x) {
    CT_EXPECT_OK(ct_params_create(P));
    ct_tensor *w = ct_param(*P, "w", 2, (int64_t[]){2, 3}, CT_INIT_ONES, 0);
    CT_EXPECT_OK(ct_params_finalize(*P, 1));
    CT_EXPECT_OK(ct_ctx_create(NULL, c));
    *x = ct_zeros(*c, CT_F32, 2, (int64_t[]){1, 3});
    ct_fill(*x, 2.0f);
    return w;
}

CT_TEST(grads_accumulate_until_zeroed_and_no_grad_records_nothing) {
    ct_params *P;
    ct_ctx *c;
    ct_tensor *x, *w = ones_2x3(&P, &c, &x);
    for (int k = 0; k < 2; k++) {
        ct_backward(c, ct_sum(c, ct_linear(c, x, w, NULL)));
        ct_ctx_reset(c);
        x = ct_zeros(c, CT_F32, 2, (int64_t[]){1, 3});
        ct_fill(x, 2.0f);
    }
    CT_EXPECT_NEAR(ct_f32(w->grad)[0], 4.0, 1e-6);
    ct_params_zero_grad(P);
    CT_EXPECT_NEAR(ct_params_grad(P)[0], 0.0, 0); /* stale until read: tensor.h */
    CT_EXPECT_NEAR(ct_f32(w->grad)[0], 0.0, 0);
    bool prev = ct_set_grad_enabled(c, false);
    ct_tensor *y = ct_linear(c, x, w, NULL);
    CT_EXPECT(!(y->flags & CT_TF_REQUIRES_GRAD));
    CT_EXPECT_EQ(ct_tape_len(c), 0);
    ct_set_grad_enabled(c, prev);
    ct_ctx_free(c);
    ct_params_free(P);
}

/* Two losses recorded, then two backwards: the first consumes the tape, so the second
 * would give no gradient; it aborts naming the cause instead (in a child process). */
CT_TEST(second_backward_over_a_consumed_tape_aborts) {
    ct_params *P;
    ct_ctx *c;
    ct_tensor *x, *w = ones_2x3(&P, &c, &x);
    ct_tensor *l1 = ct_sum(c, ct_linear(c, x, w, NULL)), *l2 = ct_sum(c, ct_linear(c, x, w, NULL));
    int fd[2];
    CT_ASSERT(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        ct_backward(c, l1);
        ct_backward(c, l2);
        _exit(0);
    }
    close(fd[1]);
    char msg[1024] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof msg - 1 && (r = read(fd[0], msg + got, sizeof msg - 1 - got)) > 0) got += (size_t)r;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CT_EXPECTF(WIFSIGNALED(status) && strstr(msg, "consumed by an earlier ct_backward"), "child status %d, stderr: %s",
               status, msg);
    /* one backward per forward is fine */
    ct_backward(c, l2);
    CT_EXPECT_NEAR(ct_f32(w->grad)[0], 2.0, 1e-6);
    ct_ctx_free(c);
    ct_params_free(P);
}

CT_TEST(arena_reset_reuses_memory_and_tracks_peak) {
    ct_ctx_opts o = ct_ctx_default_opts();
    o.arena_block = 1 << 20;
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(&o, &c));
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 10; i++) ct_new(c, CT_F32, 1, (int64_t[]){100000});
        ct_ctx_reset(c);
    }
    CT_EXPECT(ct_ctx_peak_bytes(c) >= 4000000);
    CT_EXPECT(ct_ctx_reserved_bytes(c) <= 6u << 20); /* blocks reused, not regrown each step */
    ct_ctx_free(c);
}
CT_TEST_MAIN()
