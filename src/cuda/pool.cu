/* Max pooling (and max pooling of ReLU) with the arg-max saved: the CPU op's rule for ties
 * and NaNs (the first maximum in scan order wins, a NaN wins), which cuDNN does not document
 * for its backward. Forward: one thread per output; backward: one thread per input element,
 * gathering the gradients routed to it in output order (ops/kmath.h), so no atomics and the
 * CPU op's sums, bit for bit. */
#include "cuda/launch.cuh"

namespace {
enum { THREADS = 256 };

__global__ void max_pool_k(const float *x, float *y, int32_t *arg, ct_cuda_pool_geom g, bool relu, int64_t n) {
    CT_GRID_STRIDE(i, n) {
        int64_t op = g.OH * g.OW, pl = i / op, q = i - pl * op, oh = q / g.OW, ow = q - oh * g.OW;
        y[i] = ct_k_max_pool_at(x + pl * g.H * g.W, g.H, g.W, g.k, g.s, g.p, oh, ow, relu, arg + i);
    }
}
__global__ void max_pool_bwd_k(const float *gy, const float *y, const int32_t *arg, float *dx, ct_cuda_pool_geom g,
                               bool relu, bool accumulate, int64_t n) {
    CT_GRID_STRIDE(i, n) {
        int64_t hw = g.H * g.W, pl = i / hw, r = i - pl * hw, ih = r / g.W, iw = r - ih * g.W, o = pl * g.OH * g.OW;
        dx[i] = ct_k_max_pool_dx(gy + o, y + o, arg + o, g.W, g.OH, g.OW, g.k, g.s, g.p, ih, iw, relu,
                                 accumulate ? dx[i] : 0.0f);
    }
}
} // namespace

ct_status ct_cuda_max_pool(cudaStream_t s, const float *x, float *y, int32_t *arg, const ct_cuda_pool_geom *g, bool relu) {
    int64_t n = g->planes * g->OH * g->OW;
    if (n > 0) max_pool_k<<<ct_grid(n, THREADS), THREADS, 0, s>>>(x, y, arg, *g, relu, n);
    CT_LAUNCHED("max_pool2d");
    return CT_OK;
}

ct_status ct_cuda_max_pool_bwd(cudaStream_t s, const float *gy, const float *y, const int32_t *arg, float *dx,
                               const ct_cuda_pool_geom *g, bool relu, bool accumulate) {
    int64_t n = g->planes * g->H * g->W;
    if (n > 0) max_pool_bwd_k<<<ct_grid(n, THREADS), THREADS, 0, s>>>(gy, y, arg, dx, *g, relu, accumulate, n);
    CT_LAUNCHED("max_pool2d backward");
    return CT_OK;
}
