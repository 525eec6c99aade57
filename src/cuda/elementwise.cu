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
__device__ inline int64_t strided_off(const ct_cuda_layout &l, int64_t i) {
    int64_t off = 0;
    for (int d = l.ndim - 1; d >= 0; d--) {
        off += (i % l.shape[d]) * l.stride[d];
        i /= l.shape[d];
    }
    return off;
}
/* 4-byte elements: f32, and i32 bit for bit */
__global__ void strided_copy_k(float *dst, const float *src, ct_cuda_layout l, int64_t n) {
    CT_GRID_STRIDE(i, n) dst[i] = src[strided_off(l, i)];
}
/* 2-byte elements: bf16 and f16 bit for bit (autocast's saved activations) */
__global__ void strided_copy16_k(uint16_t *dst, const uint16_t *src, ct_cuda_layout l, int64_t n) {
    CT_GRID_STRIDE(i, n) dst[i] = src[strided_off(l, i)];
}
/* the view is one-to-one (transpose, slice, permutation): no two i write one element */
__global__ void strided_add_k(float *dst, ct_cuda_layout l, const float *src, int64_t n) {
    CT_GRID_STRIDE(i, n) dst[strided_off(l, i)] += src[i];
}
int64_t numel(const ct_cuda_layout *l) {
    int64_t n = 1;
    for (int d = 0; d < l->ndim; d++) n *= l->shape[d];
    return n;
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
    LAUNCH("strided copy", strided_copy_k, n, dst, src, *l, n);
}
ct_status ct_cuda_strided_copy16(cudaStream_t s, void *dst, const void *src, const ct_cuda_layout *l) {
    int64_t n = numel(l);
    LAUNCH("strided copy", strided_copy16_k, n, (uint16_t *)dst, (const uint16_t *)src, *l, n);
}
ct_status ct_cuda_strided_add(cudaStream_t s, float *dst, const ct_cuda_layout *l, const float *src) {
    int64_t n = numel(l);
    LAUNCH("strided add", strided_add_k, n, dst, *l, src, n);
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
