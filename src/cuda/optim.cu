/* AdamW and SGD as one pass over the flat parameter buffer: the per-element update is
 * ops/kmath.h's, operation for operation the CPU optimizer's (src/optim/optim.c). And the
 * passes of gradient clipping and loss scaling: the sum of squares by kmath.h's chunks (one
 * thread a chunk, then one thread over the chunks in order: the CPU's bits), and g *= coef
 * with a flag for values that were not finite. */
#include "cuda/launch.cuh"

namespace {
enum { THREADS = 256 };
__global__ void adamw_k(ct_k_adamw k, float *p, const float *g, float *m, float *v, float *vm, int64_t n) {
    CT_GRID_STRIDE(i, n) ct_k_adamw_elem(&k, p + i, g[i], m + i, v + i, vm ? vm + i : nullptr);
}
__global__ void sgd_k(ct_k_sgd k, float *p, const float *g, float *buf, int64_t n) {
    CT_GRID_STRIDE(i, n) ct_k_sgd_elem(&k, p + i, g[i], buf ? buf + i : nullptr);
}
__global__ void sumsq_k(const float *g, int64_t n, double *part, int64_t nch) {
    CT_GRID_STRIDE(c, nch) {
        int64_t b = c * CT_K_SUMSQ_CHUNK, e = b + CT_K_SUMSQ_CHUNK < n ? b + CT_K_SUMSQ_CHUNK : n;
        part[c] = ct_k_sumsq(g, (size_t)b, (size_t)e);
    }
}
__global__ void chunks_total_k(const double *part, int64_t nch, double *out) {
    double t = 0;
    for (int64_t c = 0; c < nch; c++) t += part[c];
    *out = t;
}
__global__ void scale_k(float *g, float coef, int64_t n, int *nonfinite) {
    CT_GRID_STRIDE(i, n) {
        float v = g[i];
        if (nonfinite && !isfinite(v)) *nonfinite = 1;
        g[i] = v * coef;
    }
}
} // namespace

extern "C" {
ct_status ct_cuda_sumsq(cudaStream_t s, const float *g, int64_t n, double *part, double *out) {
    int64_t nch = (n + CT_K_SUMSQ_CHUNK - 1) / CT_K_SUMSQ_CHUNK;
    if (nch > 0) sumsq_k<<<ct_grid(nch, THREADS), THREADS, 0, s>>>(g, n, part, nch);
    chunks_total_k<<<1, 1, 0, s>>>(part, nch, out);
    CT_LAUNCHED("clip_grad_norm");
    return CT_OK;
}
ct_status ct_cuda_scale_check(cudaStream_t s, float *g, float coef, int64_t n, int *nonfinite) {
    if (n > 0) scale_k<<<ct_grid(n, THREADS), THREADS, 0, s>>>(g, coef, n, nonfinite);
    CT_LAUNCHED("scale gradients");
    return CT_OK;
}
ct_status ct_cuda_adamw(cudaStream_t s, const ct_k_adamw *k, float *p, const float *g, float *m, float *v, float *vmax,
                        int64_t n) {
    if (n > 0) adamw_k<<<ct_grid(n, THREADS), THREADS, 0, s>>>(*k, p, g, m, v, vmax, n);
    CT_LAUNCHED("adamw");
    return CT_OK;
}
ct_status ct_cuda_sgd(cudaStream_t s, const ct_k_sgd *k, float *p, const float *g, float *buf, int64_t n) {
    if (n > 0) sgd_k<<<ct_grid(n, THREADS), THREADS, 0, s>>>(*k, p, g, buf, n);
    CT_LAUNCHED("sgd");
    return CT_OK;
}
}
