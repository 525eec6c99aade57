/* Out of memory: construction returns CT_ERR_NOMEM, never aborts or crashes. This binary
 * replaces malloc/calloc/realloc/aligned_alloc/posix_memalign (glibc lets a program do so) with versions that can fail
 * the n-th allocation from now, and builds models, contexts and optimizers failing each
 * allocation in turn. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"

#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer owns malloc and friends: replacing them as below would hand its memory to
 * glibc's free. The normal build (`make test`) runs these tests. */
CT_TEST(skipped_under_asan) { CT_SKIP("replaces malloc, which AddressSanitizer owns; `make test` runs it"); }
#else

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

static long fail_at = -1; /* allocations left before the failing one; -1: none fails */
static bool fail_rest;    /* after the first failure, fail every later one too */
static int failed_allocs;

static bool fail_now(void) {
    if (fail_at < 0) return false;
    if (fail_at > 0) { fail_at--; return false; }
    failed_allocs++;
    if (!fail_rest) fail_at = -1;
    return true;
}
void *malloc(size_t n) { return fail_now() ? NULL : __libc_malloc(n); }
void *calloc(size_t a, size_t b) { return fail_now() ? NULL : __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return fail_now() ? NULL : __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
void *aligned_alloc(size_t al, size_t n) { return fail_now() ? NULL : __libc_memalign(al, n); }
int posix_memalign(void **p, size_t al, size_t n) {
    if (fail_now()) return ENOMEM;
    *p = __libc_memalign(al, n);
    return *p ? 0 : ENOMEM;
}

static ct_model_config small(ct_model_kind k) {
    ct_model_config c = ct_model_default_config(k);
    c.mlp.hidden[0] = c.mlp.hidden[1] = 16;
    c.cnn.c1 = 4; c.cnn.c2 = 4; c.cnn.fc = 8;
    c.gpt.n_layer = 2; c.gpt.n_embd = 16; c.gpt.n_head = 2; c.gpt.block_size = 8; c.gpt.vocab_size = 32;
    return c;
}

/* Fails allocation 0, 1, 2, ... of ct_model_create until it succeeds without a failure;
 * every failed attempt must be CT_ERR_NOMEM with *out NULL. */
static void model_under_oom(ct_model_kind kind, bool rest) {
    ct_model_config c = small(kind);
    int attempts = 0, nomem = 0;
    for (long k = 0; k < 100000; k++) {
        ct_model *m = (ct_model *)&c;
        failed_allocs = 0;
        fail_rest = rest;
        fail_at = k;
        ct_status st = ct_model_create(&c, 1, &m);
        fail_at = -1;
        attempts++;
        if (!failed_allocs) { /* all of its allocations done: the model must be whole */
            CT_EXPECT_OK(st);
            CT_ASSERT(m != NULL);
            CT_EXPECT(ct_model_num_params(m) > 0);
            ct_model_free(m);
            break;
        }
        CT_EXPECTF(st == CT_ERR_NOMEM && m == NULL, "%s, allocation %ld failing: status %d (%s), model %p",
                   ct_model_kind_name(kind), k, st, ct_last_error(), (void *)m);
        if (st == CT_OK) ct_model_free(m);
        nomem++;
    }
    CT_EXPECT(nomem > 10); /* the injection reached the builders */
    CT_EXPECT(attempts == nomem + 1);
}

CT_TEST(mlp_each_allocation_fails) { model_under_oom(CT_MODEL_MLP, false); model_under_oom(CT_MODEL_MLP, true); }
CT_TEST(cnn_each_allocation_fails) { model_under_oom(CT_MODEL_CNN, false); model_under_oom(CT_MODEL_CNN, true); }
CT_TEST(gpt_each_allocation_fails) { model_under_oom(CT_MODEL_GPT, false); model_under_oom(CT_MODEL_GPT, true); }

/* the nn rule by hand: a failed layer in the middle of a Sequential */
CT_TEST(nn_null_is_passed_on) {
    ct_params *P;
    CT_ASSERT(ct_params_create(&P) == CT_OK);
    ct_module *net = ct_nn_sequential("");
    ct_seq_add(net, ct_nn_linear(P, ct_seq_next_name(net), 4, 3, true));
    fail_rest = false;
    fail_at = 0;
    CT_EXPECT(ct_seq_add(net, ct_nn_relu()) == NULL); /* the ReLU cannot be allocated */
    fail_at = -1;
    CT_EXPECT(ct_module_status(net) == CT_ERR_NOMEM);
    CT_EXPECT(ct_params_status(P) == CT_OK); /* no registration failed */
    /* a Sequential that could not be built: its children fail too, the store is marked */
    CT_EXPECT(ct_seq_next_name(NULL) == NULL);
    CT_EXPECT(ct_nn_linear(P, ct_seq_next_name(NULL), 3, 2, true) == NULL);
    CT_EXPECT(ct_params_status(P) == CT_ERR_NOMEM);
    CT_EXPECT(ct_params_finalize(P, 1) == CT_ERR_NOMEM);
    CT_EXPECT(ct_module_status(NULL) == CT_ERR_NOMEM);
    ct_module_free(net);
    ct_params_free(P);
}

CT_TEST(ctx_optim_scaler_writer) {
    ct_model_config c = small(CT_MODEL_MLP);
    ct_model *m;
    CT_ASSERT(ct_model_create(&c, 1, &m) == CT_OK);
    int nomem = 0;
    for (long k = 0; k < 1000; k++) {
        void *o[5] = {&c, &c, &c, &c, &c};
        ct_status st[5];
        failed_allocs = 0;
        fail_rest = false;
        fail_at = k;
        st[0] = ct_ctx_create(NULL, (ct_ctx **)&o[0]);
        if (k == 0) /* this binary's first context: the GEMM packing buffers are allocated here */
            CT_EXPECTF(st[0] == CT_ERR_NOMEM && strstr(ct_last_error(), "GEMM packing buffers"), "context: status %d (%s)", st[0],
                       ct_last_error());
        st[1] = ct_optim_create_adamw(ct_model_params(m), NULL, (ct_optim **)&o[1]);
        st[2] = ct_optim_create_sgd(ct_model_params(m), &(ct_sgd_opts){.momentum = 0.9}, (ct_optim **)&o[2]);
        st[3] = ct_grad_scaler_create(NULL, (ct_grad_scaler **)&o[3]);
        st[4] = ct_st_writer_create((ct_st_writer **)&o[4]);
        fail_at = -1;
        for (int i = 0; i < 5; i++)
            CT_EXPECTF((st[i] == CT_OK) == (o[i] != NULL) && (st[i] == CT_OK || st[i] == CT_ERR_NOMEM),
                       "allocation %ld failing, constructor %d: status %d, object %p", k, i, st[i], o[i]);
        for (int i = 0; i < 5; i++) nomem += st[i] == CT_ERR_NOMEM;
        ct_ctx_free(o[0]);
        ct_optim_free(o[1]);
        ct_optim_free(o[2]);
        ct_grad_scaler_free(o[3]);
        ct_st_writer_free(o[4]);
        if (!failed_allocs) break;
    }
    CT_EXPECT(nomem >= 5);
    ct_model_free(m);
}

#endif

CT_TEST_MAIN()
