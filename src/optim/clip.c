/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_). */
#include "ctrain/optim.h"

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

double ct_grad_norm(const ct_params *p) {
    CT_CHECK(ct_params_device(p).type == CT_DEV_CPU, "ct_grad_norm: gradients on a GPU are not supported yet");
    const float *G = ct_params_grad(p);
    size_t n = ct_params_numel(p);
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

float ct_clip_grad_norm(ct_params *p, float max_norm) {
    float total = (float)ct_grad_norm(p);
    /* PyTorch: clip_coef = max_norm / (total_norm + 1e-6) on float tensors, where
     * `scalar / tensor` is reciprocal(tensor) * scalar; clamped to 1 */
    float coef = (1.0f / (total + 1e-6f)) * max_norm;
    if (coef > 1.0f) coef = 1.0f;
    if (coef != 1.0f) { /* also when nan: the gradients become nan, as in PyTorch */
        float *G = ct_params_grad(p);
        long n = (long)ct_params_numel(p);
#pragma omp parallel for schedule(static) if (n > 32768)
        for (long i = 0; i < n; i++) G[i] *= coef;
    }
    return total;
}
