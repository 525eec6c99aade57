/* Shared by the .cu files: grid sizes and the launch check. */
#ifndef CT_CUDA_LAUNCH_CUH
#define CT_CUDA_LAUNCH_CUH
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/cuda.h"

/* grid-stride loops: enough blocks to fill any of the target GPUs, never more than needed */
static inline unsigned ct_grid(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
#define CT_GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
/* a kernel launch's own error (bad configuration) and any earlier asynchronous one */
#define CT_LAUNCHED(op) CT_GPU_TRY(cuda, op, cudaGetLastError())
/* a grid-stride kernel over n elements on stream s, checked; returns from the wrapper */
#define CT_LAUNCH_N(op, kernel, n, threads, ...)                                                \
    do {                                                                                        \
        if ((n) > 0) kernel<<<ct_grid(n, threads), threads, 0, s>>>(__VA_ARGS__);               \
        CT_LAUNCHED(op);                                                                        \
        return CT_OK;                                                                           \
    } while (0)

/* Element types of the low-precision kernels: loads widen to f32 (exact), stores round to
 * nearest even; the arithmetic between them is the f32 kernels' own. bf16 is its bits, rounded
 * by ops/kmath.h's conversion (the CPU's, NaN included), as the cast kernel does. */
struct ct_bf16_t {
    uint16_t bits;
};
__host__ __device__ static inline float ct_ld(float x) { return x; }
__host__ __device__ static inline float ct_ld(ct_bf16_t x) { return ct_k_bf16_to_f32(x.bits); }
__host__ __device__ static inline float ct_ld(__half x) { return __half2float(x); }
template <typename T> struct ct_st_;
template <> struct ct_st_<float> {
    __host__ __device__ static float of(float v) { return v; }
};
template <> struct ct_st_<ct_bf16_t> {
    __host__ __device__ static ct_bf16_t of(float v) { return ct_bf16_t{ct_k_f32_to_bf16(v)}; }
};
template <> struct ct_st_<__half> {
    __host__ __device__ static __half of(float v) { return __float2half_rn(v); }
};
template <typename T> __host__ __device__ static inline T ct_st(float v) { return ct_st_<T>::of(v); }
/* the result type of two operands: theirs when they have one, else f32 (autocast's promotion
 * of mixed inputs) */
template <typename TA, typename TB> struct ct_common {
    typedef float T;
};
template <typename T_> struct ct_common<T_, T_> {
    typedef T_ T;
};
/* runs the statements with T the C++ type of t (a ct_cuda_cast_type) */
#define CT_WITH_TYPE(t, T, ...)                                                              \
    do {                                                                                     \
        if ((t) == CT_CUDA_CAST_BF16) { typedef ct_bf16_t T; __VA_ARGS__; }                 \
        else if ((t) == CT_CUDA_CAST_F16) { typedef __half T; __VA_ARGS__; }                 \
        else { typedef float T; __VA_ARGS__; }                                               \
    } while (0)

/* 8 elements of T, 16-byte aligned: one 128-bit access for a 2-byte type, two for f32 */
template <typename T> struct alignas(16) ct_x8 {
    T v[8];
};
/* the 8-wide kernels apply: n a multiple of 8 and every (non-NULL) pointer 16-byte aligned */
static inline bool ct_x8_fits(int64_t n, const void *a, const void *b = NULL, const void *c = NULL) {
    return n % 8 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 16 == 0;
}

/* warp-wide sum and online log-sum-exp merge (all 32 lanes take part) */
__device__ static inline float ct_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#endif
