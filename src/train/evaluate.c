/* Evaluation: mean loss and accuracy of a model over a dataset, alone (ctrain eval) or
 * inside the trainer. Each rank takes every world-th sample (no padding, so every sample
 * counts once) and the sums are all-reduced; with lockstep the ranks with fewer batches run
 * uncounted forwards until they have run as many as rank 0. */
#include <math.h>
#include <stdlib.h>

#include "ctrain/train.h"

ct_eval_opts ct_eval_default_opts(void) { return (ct_eval_opts){.batch_size = 64}; }

ct_status ct_evaluate(const ct_train_model *m, const ct_dataset *d, const ct_eval_opts *opts, ct_ctx *ctx, ct_eval_report *r) {
    ct_eval_opts o = opts ? *opts : ct_eval_default_opts();
    *r = (ct_eval_report){.loss = NAN, .accuracy = NAN};
    if (!m || !m->forward || !d || o.batch_size < 1 || o.max_samples < 0)
        return ct_error(CT_ERR_INVALID, "ct_evaluate: a model with forward, a dataset, batch_size >= 1 (got %d) and max_samples >= 0 are needed",
                        o.batch_size);
    int rank = 0, world = 1;
    if (o.pg && ct_pg_size(o.pg) > 1) {
        rank = ct_pg_rank(o.pg);
        world = ct_pg_size(o.pg);
    }
    ct_ctx *own = NULL;
    if (!ctx) {
        ct_status st = ct_ctx_create(NULL, &own);
        if (st != CT_OK) return st;
        ctx = own;
    }
    int64_t last = ct_dataset_len(d);
    if (o.max_samples > 0 && last > o.max_samples) last = o.max_samples;
    int B = o.batch_size;
    int64_t xn = ct_dataset_x_numel(d), yn = ct_dataset_y_numel(d);
    size_t xs = ct_dtype_size(ct_dataset_x_dtype(d));
    int64_t xd[CT_MAX_DIMS];
    int xnd = ct_dataset_x_shape(d, xd + 1) + 1;
    void *x = malloc(xs * (size_t)(B * xn));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)(B * yn));
    if (!x || !y) {
        free(x);
        free(y);
        ct_ctx_free(own);
        return ct_error(CT_ERR_NOMEM, "out of memory for evaluation");
    }
    double sums[3] = {0, 0, 0}; /* loss * count, correct, count */
    ct_device dev = m->params ? ct_params_device(m->params) : CT_CPU;
    ct_status st = CT_OK;
    bool was = ct_set_grad_enabled(ctx, false), training = ct_ctx_training(ctx);
    ct_ctx_set_training(ctx, false);
    int64_t i = rank;
    /* rank 0 has the most samples: ceil(last / world), in ceil(that / B) batches */
    int64_t batches = ((last + world - 1) / world + B - 1) / B;
    for (int64_t b = 0; i < last || (o.lockstep && b < batches); b++) {
        /* past this rank's samples (lockstep): sample 0 once, for the collectives in the forward */
        bool counted = i < last;
        int64_t n = 0;
        for (; n < B && i < last; n++, i += world) ct_dataset_get(d, i, (char *)x + (size_t)(n * xn) * xs, y + n * yn);
        if (!counted) {
            ct_dataset_get(d, 0, x, y);
            n = 1;
        }
        xd[0] = n;
        ct_tensor *xt = ct_wrap(ctx, ct_dataset_x_dtype(d), x, xnd, xd);
        if (dev.type != CT_DEV_CPU && (st = ct_tensor_to(ctx, xt, dev, &xt)) != CT_OK) break;
        ct_tensor *logits = m->forward(ctx, m->self, xt);
        if (!counted) {
            ct_ctx_reset(ctx);
            continue;
        }
        int64_t V = logits->shape[logits->ndim - 1], rows = ct_numel(logits) / V;
        ct_tensor *l2 = ct_reshape(ctx, logits, 2, (int64_t[]){rows, V});
        ct_tensor *tg = ct_wrap(ctx, CT_I32, y, 1, (int64_t[]){rows});
        if (dev.type != CT_DEV_CPU && (st = ct_tensor_to(ctx, tg, dev, &tg)) != CT_OK) break;
        sums[0] += ct_item(ct_cross_entropy(ctx, l2, tg, -100)) * (double)rows;
        /* the arg-max on the host: the logits come back from a GPU */
        if (dev.type != CT_DEV_CPU && ((st = ct_ctx_status(ctx)) != CT_OK || (st = ct_tensor_to(ctx, l2, CT_CPU, &l2)) != CT_OK))
            break;
        const float *L = l2->data;
        for (int64_t k = 0; k < rows; k++) {
            int64_t best = 0;
            for (int64_t c = 1; c < V; c++)
                if (L[k * V + c] > L[k * V + best]) best = c;
            sums[1] += best == y[k];
        }
        sums[2] += (double)rows;
        ct_ctx_reset(ctx);
    }
    if (st != CT_OK) ct_ctx_reset(ctx);
    ct_set_grad_enabled(ctx, was);
    ct_ctx_set_training(ctx, training);
    free(x);
    free(y);
    ct_ctx_free(own);
    if (st != CT_OK) return st;
    st = world > 1 ? ct_all_reduce_sync(o.pg, sums, 3, CT_F64, CT_RED_SUM) : CT_OK;
    r->loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    r->accuracy = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    r->count = (int64_t)sums[2];
    return st;
}
