/* Private layout of ct_ctx, shared by tensor.c and autograd.c. */
#ifndef CT_CTX_INTERNAL_H
#define CT_CTX_INTERNAL_H
#include "ctrain/autograd.h"

typedef struct ct_block {
    struct ct_block *next;
    size_t size, used;
    char *mem;
} ct_block;

struct ct_ctx {
    ct_block *head;      /* first block */
    ct_block *cur;       /* block being filled */
    size_t block_size;
    size_t used;         /* bytes handed out since reset (incl. alignment) */
    size_t peak;
    size_t reserved;
    ct_node *tape;       /* newest node */
    int tape_len;
    bool grad_enabled;
    bool training;
    uint64_t seed, step;
};
#endif
