/* Max pooling (and max pooling of ReLU) with the arg-max saved: the CPU op's rule for ties
 * and NaNs (the first maximum in scan order wins, a NaN wins), which cuDNN does not document
 * for its backward. Forward: one thread per output; backward: one thread per input element,
 * gathering the gradients routed to it in output order (ops/kmath.h), so no atomics and the
 * CPU op's sums, bit for bit. */
#include "cuda/launch.cuh"

/* the same functions for bf16 and f16 planes (overloads): the max of rounded values is one of
 * them, so the output is exact in the input's precision */
CT_K_DEFINE_MAX_POOL(, ct_bf16_t, ct_ld)
CT_K_DEFINE_MAX_POOL(, __half, ct_ld)

namespace {
enum { THREADS = 256 };

template <typename T> __global__ void max_pool_k(const T *x, T *y, int32_t *arg, ct_cuda_pool_geom g, bool relu, int64_t n) {
    CT_GRID_STRIDE(i, n) {
        int64_t op = g.OH * g.OW, pl = i / op, q = i - pl * op, oh = q / g.OW, ow = q - oh * g.OW;
        y[i] = ct_st<T>(ct_k_max_pool_at(x + pl * g.H * g.W, g.H, g.W, g.k, g.s, g.p, oh, ow, relu, arg + i));
    }
}
template <typename T>
__global__ void max_pool_bwd_k(const float *gy, const T *y, const int32_t *arg, float *dx, ct_cuda_pool_geom g, bool relu,
                               bool accumulate, int64_t n) {
    CT_GRID_STRIDE(i, n) {
        int64_t hw = g.H * g.W, pl = i / hw, r = i - pl * hw, ih = r / g.W, iw = r - ih * g.W, o = pl * g.OH * g.OW;
        dx[i] = ct_k_max_pool_dx(gy + o, y + o, arg + o, g.W, g.OH, g.OW, g.k, g.s, g.p, ih, iw, relu,
                                 accumulate ? dx[i] : 0.0f);
    }
}
} // namespace

ct_status ct_cuda_max_pool_t(cudaStream_t s, const void *x, ct_cuda_cast_type t, void *y, int32_t *arg,
                             const ct_cuda_pool_geom *g, bool relu) {
    int64_t n = g->planes * g->OH * g->OW;
    if (n > 0)
        CT_WITH_TYPE(t, T, max_pool_k<T><<<ct_grid(n, THREADS), THREADS, 0, s>>>((const T *)x, (T *)y, arg, *g, relu, n));
    CT_LAUNCHED("max_pool2d");
    return CT_OK;
}
ct_status ct_cuda_max_pool(cudaStream_t s, const float *x, float *y, int32_t *arg, const ct_cuda_pool_geom *g, bool relu) {
    return ct_cuda_max_pool_t(s, x, CT_CUDA_CAST_F32, y, arg, g, relu);
}

ct_status ct_cuda_max_pool_bwd_t(cudaStream_t s, const float *gy, const void *y, ct_cuda_cast_type t, const int32_t *arg,
                                 float *dx, const ct_cuda_pool_geom *g, bool relu, bool accumulate) {
    int64_t n = g->planes * g->H * g->W;
    if (n > 0)
        CT_WITH_TYPE(t, T, max_pool_bwd_k<T><<<ct_grid(n, THREADS), THREADS, 0, s>>>(gy, (const T *)y, arg, dx, *g, relu,
                                                                                     accumulate, n));
    CT_LAUNCHED("max_pool2d backward");
    return CT_OK;
}
ct_status ct_cuda_max_pool_bwd(cudaStream_t s, const float *gy, const float *y, const int32_t *arg, float *dx,
                               const ct_cuda_pool_geom *g, bool relu, bool accumulate) {
    return ct_cuda_max_pool_bwd_t(s, gy, y, CT_CUDA_CAST_F32, arg, dx, g, relu, accumulate);
}
