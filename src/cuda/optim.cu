/* AdamW and SGD as one pass over the flat parameter buffer: the per-element update is
 * ops/kmath.h's, operation for operation the CPU optimizer's (src/optim/optim.c). */
#include "cuda/launch.cuh"

namespace {
enum { THREADS = 256 };
__global__ void adamw_k(ct_k_adamw k, float *p, const float *g, float *m, float *v, float *vm, int64_t n) {
    CT_GRID_STRIDE(i, n) ct_k_adamw_elem(&k, p + i, g[i], m + i, v + i, vm ? vm + i : nullptr);
}
__global__ void sgd_k(ct_k_sgd k, float *p, const float *g, float *buf, int64_t n) {
    CT_GRID_STRIDE(i, n) ct_k_sgd_elem(&k, p + i, g[i], buf ? buf + i : nullptr);
}
} // namespace

extern "C" {
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
