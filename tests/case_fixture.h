/* Fixtures holding numbered cases ("0.q", "0.y", "1.q", ...: tests/torch/gen_sdpa*.py): one
 * f32 tensor of case cs copied into the context; a missing one is a programmer error.
 *
 *   ct_tensor *q = case_tensor(c, f, 0, "q");
 *
 * Include after ct_test.h and ctrain/io.h. */
#ifndef CT_CASE_FIXTURE_H
#define CT_CASE_FIXTURE_H
#include <stdio.h>
#include <string.h>

static inline ct_tensor *case_tensor(ct_ctx *c, ct_st_file *f, int cs, const char *name) {
    char key[32];
    snprintf(key, sizeof key, "%d.%s", cs, name);
    ct_st_tensor t;
    CT_CHECK(ct_st_get(f, key, &t) == CT_OK && t.dtype == CT_F32, "fixture %s lacks f32 '%s'", ct_st_path(f), key);
    ct_tensor *x = ct_new(c, CT_F32, t.ndim, t.shape);
    memcpy(x->data, t.data, t.nbytes);
    return x;
}
#endif
