/* Elementwise kernels: one grid-stride pass each over the ops/kmath.h functions. */
#include "cuda/launch.cuh"

namespace {
enum { THREADS = 256 };

__global__ void relu_k(const float *x, float *y, int64_t n) { CT_GRID_STRIDE(i, n) y[i] = ct_k_relu(x[i]); }
__global__ void relu_bwd_k(const float *y, const float *g, float *dx, int64_t n) {
    CT_GRID_STRIDE(i, n) dx[i] = ct_k_relu_bwd(y[i], g[i]);
}
__global__ void gelu_k(const float *x, float *y, int64_t n, bool th) {
    CT_GRID_STRIDE(i, n) y[i] = th ? ct_k_gelu_tanh(x[i]) : ct_k_gelu(x[i]);
}
__global__ void gelu_bwd_k(const float *x, const float *g, float *dx, int64_t n, bool th) {
    CT_GRID_STRIDE(i, n) dx[i] = th ? ct_k_gelu_tanh_bwd(x[i], g[i]) : ct_k_gelu_bwd(x[i], g[i]);
}
__global__ void add_k(const float *a, const float *b, float *y, int64_t n, int64_t m) {
    CT_GRID_STRIDE(i, n) y[i] = a[i] + b[i % m];
}
__global__ void scale_k(const float *a, float s, float *y, int64_t n) { CT_GRID_STRIDE(i, n) y[i] = a[i] * s; }
__global__ void mul_k(const float *a, const float *b, float *y, int64_t n) { CT_GRID_STRIDE(i, n) y[i] = a[i] * b[i]; }
__global__ void dropout_k(const float *x, float *y, int64_t n, uint64_t key, float p, float scale) {
    CT_GRID_STRIDE(i, n) y[i] = x[i] * ct_k_dropout(key, i, p, scale);
}
__global__ void tanh_k(const float *x, float *y, int64_t n, bool sig) {
    CT_GRID_STRIDE(i, n) y[i] = sig ? ct_k_sigmoid(x[i]) : ct_k_tanh(x[i]);
}
__global__ void tanh_bwd_k(const float *y, const float *g, float *dx, int64_t n, bool sig) {
    CT_GRID_STRIDE(i, n) dx[i] = sig ? ct_k_sigmoid_bwd(y[i], g[i]) : ct_k_tanh_bwd(y[i], g[i]);
}
__global__ void fill_k(float *y, float v, int64_t n) { CT_GRID_STRIDE(i, n) y[i] = v; }
/* offset under l's strides of the i-th element in row-major order over l's shape */
/* the offset of element i (row-major over l.shape) in the view; I: the index type, 32-bit
 * where every index and offset fits (integer division by a 64-bit value costs several times
 * more on a GPU) */
template <typename I> __device__ inline I strided_off(const ct_cuda_layout &l, I i) {
    I off = 0;
    for (int d = l.ndim - 1; d >= 0; d--) {
        I sh = (I)l.shape[d];
        off += (i % sh) * (I)l.stride[d];
        i /= sh;
    }
    return off;
}
/* 4-byte elements: f32, and i32 bit for bit */
template <typename I> __global__ void strided_copy_k(float *dst, const float *src, ct_cuda_layout l, int64_t n) {
    CT_GRID_STRIDE(i, n) dst[i] = src[strided_off<I>(l, (I)i)];
}
/* 2-byte elements: bf16 and f16 bit for bit (autocast's saved activations) */
template <typename I> __global__ void strided_copy16_k(uint16_t *dst, const uint16_t *src, ct_cuda_layout l, int64_t n) {
    CT_GRID_STRIDE(i, n) dst[i] = src[strided_off<I>(l, (I)i)];
}
/* the view is one-to-one (transpose, slice, permutation): no two i write one element */
template <typename I> __global__ void strided_add_k(float *dst, ct_cuda_layout l, const float *src, int64_t n) {
    CT_GRID_STRIDE(i, n) dst[strided_off<I>(l, (I)i)] += src[i];
}
int64_t numel(const ct_cuda_layout *l) {
    int64_t n = 1;
    for (int d = 0; d < l->ndim; d++) n *= l->shape[d];
    return n;
}
/* The same view with fewer dims: size-1 dims dropped, and a dim merged into the next inner
 * one where its stride is that dim's stride times its size (the same offsets, fewer
 * divisions per element: a split of heads [B, T, H, D] is 3 dims, not 4). */
ct_cuda_layout simplify(const ct_cuda_layout *l) {
    ct_cuda_layout o = {0, {0}, {0}};
    for (int d = 0; d < l->ndim; d++) {
        if (l->shape[d] == 1) continue;
        if (o.ndim > 0 && o.stride[o.ndim - 1] == l->stride[d] * l->shape[d]) {
            o.shape[o.ndim - 1] *= l->shape[d];
            o.stride[o.ndim - 1] = l->stride[d];
            continue;
        }
        o.shape[o.ndim] = l->shape[d];
        o.stride[o.ndim] = l->stride[d];
        o.ndim++;
    }
    if (o.ndim == 0) o = {1, {1}, {0}};
    return o;
}
/* whether every index below n and every offset of the view fit in 32 bits */
bool fits32(const ct_cuda_layout *l, int64_t n) {
    int64_t last = 0;
    for (int d = 0; d < l->ndim; d++) {
        if (l->stride[d] < 0) return false;
        last += (l->shape[d] - 1) * l->stride[d];
    }
    return n <= INT32_MAX && last <= INT32_MAX;
}
} // namespace

#define LAUNCH(op, kernel, n, ...) CT_LAUNCH_N(op, kernel, n, THREADS, __VA_ARGS__)

extern "C" {
ct_status ct_cuda_relu(cudaStream_t s, const float *x, float *y, int64_t n) {
    LAUNCH("relu", relu_k, n, x, y, n);
}
ct_status ct_cuda_relu_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t n) {
    LAUNCH("relu backward", relu_bwd_k, n, y, g, dx, n);
}
ct_status ct_cuda_gelu(cudaStream_t s, const float *x, float *y, int64_t n, bool tanh_approx) {
    LAUNCH("gelu", gelu_k, n, x, y, n, tanh_approx);
}
ct_status ct_cuda_gelu_bwd(cudaStream_t s, const float *x, const float *g, float *dx, int64_t n, bool tanh_approx) {
    LAUNCH("gelu backward", gelu_bwd_k, n, x, g, dx, n, tanh_approx);
}
ct_status ct_cuda_add(cudaStream_t s, const float *a, const float *b, float *y, int64_t n, int64_t m) {
    if (m <= 0 || n % m) return ct_error(CT_ERR_INVALID, "cuda add: %lld elements do not repeat a %lld-element operand",
                                         (long long)n, (long long)m);
    LAUNCH("add", add_k, n, a, b, y, n, m);
}
ct_status ct_cuda_scale(cudaStream_t s, const float *a, float alpha, float *y, int64_t n) {
    LAUNCH("scale", scale_k, n, a, alpha, y, n);
}
ct_status ct_cuda_fill(cudaStream_t s, float *y, float v, int64_t n) {
    LAUNCH("fill", fill_k, n, y, v, n);
}
ct_status ct_cuda_strided_copy(cudaStream_t s, float *dst, const float *src, const ct_cuda_layout *l) {
    int64_t n = numel(l);
    ct_cuda_layout v = simplify(l);
    if (fits32(&v, n)) LAUNCH("strided copy", strided_copy_k<uint32_t>, n, dst, src, v, n);
    LAUNCH("strided copy", strided_copy_k<int64_t>, n, dst, src, v, n);
}
ct_status ct_cuda_strided_copy16(cudaStream_t s, void *dst, const void *src, const ct_cuda_layout *l) {
    int64_t n = numel(l);
    ct_cuda_layout v = simplify(l);
    uint16_t *d = (uint16_t *)dst;
    const uint16_t *x = (const uint16_t *)src;
    if (fits32(&v, n)) LAUNCH("strided copy", strided_copy16_k<uint32_t>, n, d, x, v, n);
    LAUNCH("strided copy", strided_copy16_k<int64_t>, n, d, x, v, n);
}
ct_status ct_cuda_strided_add(cudaStream_t s, float *dst, const ct_cuda_layout *l, const float *src) {
    int64_t n = numel(l);
    ct_cuda_layout v = simplify(l);
    if (fits32(&v, n)) LAUNCH("strided add", strided_add_k<uint32_t>, n, dst, v, src, n);
    LAUNCH("strided add", strided_add_k<int64_t>, n, dst, v, src, n);
}
ct_status ct_cuda_mul(cudaStream_t s, const float *a, const float *b, float *y, int64_t n) {
    LAUNCH("mul", mul_k, n, a, b, y, n);
}
ct_status ct_cuda_tanh(cudaStream_t s, const float *x, float *y, int64_t n, bool sigmoid) {
    LAUNCH(sigmoid ? "sigmoid" : "tanh", tanh_k, n, x, y, n, sigmoid);
}
ct_status ct_cuda_tanh_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t n, bool sigmoid) {
    LAUNCH(sigmoid ? "sigmoid backward" : "tanh backward", tanh_bwd_k, n, y, g, dx, n, sigmoid);
}
ct_status ct_cuda_dropout(cudaStream_t s, const float *x, float *y, int64_t n, uint64_t key, float p, float scale) {
    LAUNCH("dropout", dropout_k, n, x, y, n, key, p, scale);
}
}
