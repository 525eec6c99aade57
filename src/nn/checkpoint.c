/* Checkpointing over modules: one module as a segment, and torch.utils.checkpoint's
 * checkpoint_sequential split of a Sequential. */
#include "ctrain/nn.h"

static ct_tensor *module_segment(ct_ctx *ctx, ct_tensor *x, void *m) { return ct_module_forward(ctx, m, x); }

ct_tensor *ct_checkpoint_module(ct_ctx *ctx, ct_module *m, ct_tensor *x) { return ct_checkpoint(ctx, module_segment, m, x); }

typedef struct {
    ct_module *seq;
    int first, last; /* children [first, last] */
} run_range;

static ct_tensor *range_segment(ct_ctx *ctx, ct_tensor *x, void *arg) {
    const run_range *r = arg;
    for (int i = r->first; i <= r->last; i++) x = ct_module_forward(ctx, ct_seq_get(r->seq, i), x);
    return x;
}

/* PyTorch: segment_size = len // segments; the first segments - 1 segments of that size are
 * checkpointed, the rest runs normally (its activations are needed right away anyway). */
ct_tensor *ct_checkpoint_sequential(ct_ctx *ctx, ct_module *seq, int segments, ct_tensor *x) {
    int n = ct_seq_len(seq);
    CT_CHECK(segments >= 1 && segments <= n, "ct_checkpoint_sequential: %d segments for a Sequential of %d modules", segments, n);
    int size = n / segments, end = -1;
    for (int start = 0; start < size * (segments - 1); start += size) {
        end = start + size - 1;
        /* the range must outlive this call (backward reads it): the arena keeps it to the reset */
        run_range *r = ct_ctx_alloc(ctx, sizeof *r);
        *r = (run_range){seq, start, end};
        x = ct_checkpoint(ctx, range_segment, r, x);
    }
    run_range rest = {seq, end + 1, n - 1};
    return range_segment(ctx, x, &rest);
}
