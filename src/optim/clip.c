/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_). */
#include "ctrain/optim.h"
#include "core/kernel.h" /* device hooks: a GPU store's gradients copied to the host */

#include <math.h>
#include <stdlib.h>

/* Fixed chunks summed in a fixed order: the norm does not depend on the thread count. */
#define CHUNK 16384

/* Sum of squares of G[b..e) in double with 8 interleaved accumulators (a fixed order that
 * the compiler can keep in vector registers; a single running sum would serialise). */
static double sumsq(const float *G, size_t b, size_t e) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = b;
    for (; i + 8 <= e; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)G[i + j] * (double)G[i + j];
    for (int j = 0; i < e; i++, j++) acc[j] += (double)G[i] * (double)G[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static double norm_of(const float *G, size_t n) {
    long nch = (long)((n + CHUNK - 1) / CHUNK);
    double part_small[64];
    double *part = nch <= 64 ? part_small : malloc((size_t)nch * sizeof(double));
    double total = 0;
    if (!part) { /* out of memory: same chunked order, one thread */
        for (long c = 0; c < nch; c++) {
            size_t b = (size_t)c * CHUNK, e = b + CHUNK < n ? b + CHUNK : n;
            total += sumsq(G, b, e);
        }
        return sqrt(total);
    }
#pragma omp parallel for schedule(static) if (nch > 2)
    for (long c = 0; c < nch; c++) {
        size_t b = (size_t)c * CHUNK, e = b + CHUNK < n ? b + CHUNK : n;
        part[c] = sumsq(G, b, e);
    }
    for (long c = 0; c < nch; c++) total += part[c];
    if (part != part_small) free(part);
    return sqrt(total);
}

double ct_grad_norm(const ct_params *p) {
    CT_CHECK(ct_params_device(p).type == CT_DEV_CPU, "ct_grad_norm: gradients on a GPU (use ct_clip_grad_norm_any)");
    return norm_of(ct_params_grad(p), ct_params_numel(p));
}

/* Clips host gradients G[0, n) to max_norm; returns whether they changed, *total the norm */
static bool clip_host(float *G, size_t n, float max_norm, float *total) {
    *total = (float)norm_of(G, n);
    /* PyTorch: clip_coef = max_norm / (total_norm + 1e-6) on float tensors, where
     * `scalar / tensor` is reciprocal(tensor) * scalar; clamped to 1 */
    float coef = (1.0f / (*total + 1e-6f)) * max_norm;
    if (coef > 1.0f) coef = 1.0f;
    if (coef == 1.0f) return false;
    /* also when nan: the gradients become nan, as in PyTorch */
    long m = (long)n;
#pragma omp parallel for schedule(static) if (m > 32768)
    for (long i = 0; i < m; i++) G[i] *= coef;
    return true;
}

float ct_clip_grad_norm(ct_params *p, float max_norm) {
    CT_CHECK(ct_params_device(p).type == CT_DEV_CPU, "ct_clip_grad_norm: gradients on a GPU (use ct_clip_grad_norm_any)");
    float total;
    clip_host(ct_params_grad(p), ct_params_numel(p), max_norm, &total);
    return total;
}

ct_status ct_clip_grad_norm_any(ct_params *p, float max_norm, float *total_norm) {
    ct_device d = ct_params_device(p);
    *total_norm = NAN;
    if (d.type == CT_DEV_CPU) {
        *total_norm = ct_clip_grad_norm(p, max_norm);
        return CT_OK;
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, "gradient clipping");
    if (!h) return CT_ERR_UNSUPPORTED;
    size_t n = ct_params_numel(p), bytes = n * sizeof(float);
    float *G = malloc(bytes ? bytes : 1);
    if (!G) return ct_error(CT_ERR_NOMEM, "gradient clipping on cuda:%d: no host memory for %zu gradients", d.index, n);
    /* the copy to the host waits for backward's kernels; the one back (from pageable memory)
     * is staged before it returns, so G may be freed at once */
    ct_status st = h->copy(d.index, G, ct_params_grad(p), bytes, CT_COPY_D2H);
    if (st == CT_OK && clip_host(G, n, max_norm, total_norm)) st = h->copy(d.index, ct_params_grad(p), G, bytes, CT_COPY_H2D);
    free(G);
    return st;
}
