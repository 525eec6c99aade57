/* Private layout of ct_ctx, shared by tensor.c and autograd.c. */
#ifndef CT_CTX_INTERNAL_H
#define CT_CTX_INTERNAL_H
#include "ctrain/autograd.h"

typedef struct ct_block {
    struct ct_block *next;
    size_t size, used;
    char *mem;
} ct_block;

/* A gradient buffer of an intermediate whose node's backward has run: free for reuse by
 * the next gradient that fits (arena memory, valid until reset). */
typedef struct { void *p; size_t bytes; } ct_free_buf;

struct ct_ctx {
    ct_block *head;      /* first block */
    ct_block *cur;       /* block being filled */
    size_t block_size;
    size_t used;         /* bytes handed out since reset (incl. alignment) */
    size_t peak;
    size_t reserved;
    /* backward scratch: what a node's backward allocates besides gradients lives here and
     * is rewound as soon as that backward returns */
    ct_block *shead, *scur;
    size_t sused;
    int bw_depth;        /* > 0 while run_backward is in a node's backward */
    bool grad_alloc;     /* ct_grad_acc is allocating: main arena */
    ct_free_buf *gfree;  /* recycled gradient buffers */
    int gfree_n, gfree_cap;
    ct_node *tape;       /* newest node */
    int tape_len;
    bool grad_enabled;
    bool training;
    uint64_t seed, step;
    /* dropout calls made during `dropout_step`: each call gets its own mask stream, and
     * the numbering restarts whenever the step changes (zeroed by calloc) */
    uint64_t dropout_step, dropout_calls;
    /* activation checkpointing (autograd.c): > 0 while a checkpointed segment runs without
     * grad (its parameters' uses are still counted, for the grad-ready hooks) / is being
     * recomputed in backward (uses already counted: not again) */
    int ckpt_counting, ckpt_recompute;
    /* ct_linear_unevaluated: the op records its node and leaves its output's values at 0 */
    bool values_unread;
    struct ct_tensor **ckpt_params; /* parameters counted by the segment running now */
    int ckpt_nparams, ckpt_cap;
    /* autocast (ct_autocast_begin): the low-precision dtype per nested region, CT_F32 when
     * off; the f32 -> low-precision casts of parameters made in the region, reused by every
     * later use of that parameter (PyTorch's weight cast cache) */
    ct_dtype ac_stack[8];
    int ac_depth;
    struct { struct ct_tensor *param, *cast; ct_dtype dt; bool grad; } ac_cache[64];
    int ac_ncache;
    /* temporaries of an op running on f32 copies of low-precision tensors: a third block
     * list, rewound when the op returns (ct_ctx_temp_begin_/end_ in kernel.h) */
    ct_block *thead, *tcur;
    size_t tused;
    int temp_depth;
    bool no_temp;        /* allocating a node or saved state: never a temporary */
    ct_dtype lowp_run;   /* the dtype of the low-precision op running now (CT_F32: none) */
    /* device memory of the step (device.c): tensors on a GPU are not in the arena but in
     * the device's caching allocator, returned at ct_ctx_reset; first device failure */
    struct { void *p; int type; bool scratch; } *dev_bufs;
    int dev_n, dev_cap;
    ct_status dev_status;
};

/* Stream key for the next dropout call: a pure function of (seed, step, call number in
 * the step), so masks are reproducible, thread-count independent and exact on resume.
 * Activation checkpointing saves `dropout_calls` before a segment and restores it before
 * recomputing, to get the same masks back. */
static inline uint64_t ct_ctx_dropout_key_(struct ct_ctx *c) {
    if (c->dropout_step != c->step) { c->dropout_step = c->step; c->dropout_calls = 0; }
    uint64_t k = c->seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    k = (k ^ (k >> 31)) * 0xbf58476d1ce4e5b9ull + c->step;
    k = (k ^ (k >> 29)) * 0x94d049bb133111ebull + ++c->dropout_calls;
    return k ^ (k >> 32);
}
static inline uint64_t ct_ctx_dropout_calls_(const struct ct_ctx *c) { return c->dropout_step == c->step ? c->dropout_calls : 0; }
static inline void ct_ctx_set_dropout_calls_(struct ct_ctx *c, uint64_t n) { c->dropout_step = c->step; c->dropout_calls = n; }
/* Returns the step's device buffers to their allocators (device.c). */
void ct_ctx_dev_release_(struct ct_ctx *c);
/* ct_item of a device tensor: false for CPU tensors (device.c) */
bool ct_device_item_(const struct ct_tensor *t, double *v);
/* Backward memory (tensor.c): gradients of intermediates are recycled once consumed. */
void *ct_ctx_grad_buffer_(struct ct_ctx *c, size_t bytes);  /* zeroed; reuses a freed one */
void *ct_ctx_grad_buffer_raw_(struct ct_ctx *c, size_t bytes); /* the same, contents undefined */
void ct_ctx_grad_release_(struct ct_ctx *c, void *p, size_t bytes);
void ct_ctx_scratch_rewind_(struct ct_ctx *c);
/* device.c: every device buffer a backward allocated as scratch (after its node); one
 * buffer at a time: ct_ctx_dev_free_ (kernel.h) */
void ct_ctx_dev_scratch_free_(struct ct_ctx *c);
/* device.c: a position in the step's list of device buffers, and going back to it: every
 * buffer allocated since returns to its allocator, except `keep` (activation checkpointing's
 * output). Buffers allocated before the mark stay, whatever was freed in between. */
int ct_ctx_dev_mark_(const struct ct_ctx *c);
void ct_ctx_dev_rewind_(struct ct_ctx *c, int mark, const void *keep);
/* A position in the main arena, and going back to it (everything allocated since is gone). */
typedef struct { ct_block *cur; size_t cur_used, used; } ct_arena_mark;
ct_arena_mark ct_ctx_mark_(struct ct_ctx *c);
void ct_ctx_rewind_(struct ct_ctx *c, ct_arena_mark m);
/* The op-table row of checkpointed segments: ct_ctx_reset clears the uses they counted. */
extern const struct ct_op_def ct_checkpoint_def_;
typedef struct {
    ct_tensor *(*fn)(struct ct_ctx *, ct_tensor *, void *);
    void *arg;
    uint64_t step, calls;      /* dropout stream position before the segment */
    ct_dtype autocast;         /* the region it ran in: the recompute runs in the same one */
    ct_tensor **params;        /* parameters the segment uses, counted once per use */
    int nparams;
} ct_ckpt_saved;
#endif
