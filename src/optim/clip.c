/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_). */
#include "ctrain/optim.h"

#include <math.h>
#include <stdlib.h>

#include "core/kernel.h" /* device hooks: the passes on a GPU */
#include "ops/kmath.h"

/* Fixed chunks summed in a fixed order (ops/kmath.h): the norm does not depend on the thread
 * count, nor on whether the gradients are on a GPU (the device pass sums the same chunks). */
#define CHUNK CT_K_SUMSQ_CHUNK

/* the store's device backend, for gradients on a GPU (NULL with ct_error set when it has
 * none) */
static const ct_device_hooks *dev_hooks(const ct_params *p, const char *op) {
    const ct_device_hooks *h = ct_device_hooks_get(ct_params_device(p), op);
    if (h && (!h->sumsq || !h->scale)) {
        ct_error(CT_ERR_UNSUPPORTED, "%s: the device backend has no gradient norm pass", op);
        return NULL;
    }
    return h;
}

double ct_grad_norm(const ct_params *p) {
    const float *G = ct_params_grad(p);
    size_t n = ct_params_numel(p);
    if (ct_params_device(p).type != CT_DEV_CPU) { /* NaN with ct_error set when the device fails */
        const ct_device_hooks *h = dev_hooks(p, "clip_grad_norm");
        double ss = NAN;
        if (h && h->sumsq(ct_params_device(p).index, G, (int64_t)n, &ss) != CT_OK) ss = NAN;
        return sqrt(ss);
    }
    long nch = (long)((n + CHUNK - 1) / CHUNK);
    double part_small[64];
    double *part = nch <= 64 ? part_small : malloc((size_t)nch * sizeof(double));
    double total = 0;
    if (!part) { /* out of memory: same chunked order, one thread */
        for (long c = 0; c < nch; c++) {
            size_t b = (size_t)c * CHUNK, e = b + CHUNK < n ? b + CHUNK : n;
            total += ct_k_sumsq(G, b, e);
        }
        return sqrt(total);
    }
#pragma omp parallel for schedule(static) if (nch > 2)
    for (long c = 0; c < nch; c++) {
        size_t b = (size_t)c * CHUNK, e = b + CHUNK < n ? b + CHUNK : n;
        part[c] = ct_k_sumsq(G, b, e);
    }
    for (long c = 0; c < nch; c++) total += part[c];
    if (part != part_small) free(part);
    return sqrt(total);
}

float ct_clip_grad_norm(ct_params *p, float max_norm) {
    float total = (float)ct_grad_norm(p);
    /* PyTorch: clip_coef = max_norm / (total_norm + 1e-6) on float tensors, where
     * `scalar / tensor` is reciprocal(tensor) * scalar; clamped to 1 */
    float coef = (1.0f / (total + 1e-6f)) * max_norm;
    if (coef > 1.0f) coef = 1.0f;
    if (coef != 1.0f) { /* also when nan: the gradients become nan, as in PyTorch */
        float *G = ct_params_grad(p);
        long n = (long)ct_params_numel(p);
        if (ct_params_device(p).type != CT_DEV_CPU) {
            const ct_device_hooks *h = dev_hooks(p, "clip_grad_norm");
            if (!h || h->scale(ct_params_device(p).index, G, coef, n, NULL) != CT_OK) return NAN;
            return total;
        }
#pragma omp parallel for schedule(static) if (n > 32768)
        for (long i = 0; i < n; i++) G[i] *= coef;
    }
    return total;
}
