/* Elementwise kernels: one grid-stride pass each over the ops/kmath.h functions. */
#include "cuda/launch.cuh"

namespace {
enum { THREADS = 256 };

/* One kernel per direction for the unary ops, on any element type T: f32 arithmetic (the
 * ops/kmath.h functions), each result rounded to T as it is stored. The op is uniform over the
 * launch, so its switch costs a predictable branch per element, not a divergence. */
__device__ inline float map1(const ct_cuda_map &m, float x, int64_t i) {
    switch (m.op) {
    case CT_CUDA_MAP_RELU: return ct_k_relu(x);
    case CT_CUDA_MAP_GELU: return ct_k_gelu(x);
    case CT_CUDA_MAP_GELU_TANH: return ct_k_gelu_tanh(x);
    case CT_CUDA_MAP_TANH: return ct_k_tanh(x);
    case CT_CUDA_MAP_SIGMOID: return ct_k_sigmoid(x);
    case CT_CUDA_MAP_SCALE: return x * m.alpha;
    case CT_CUDA_MAP_SILU: return x * ct_k_sigmoid(x);
    default: return x * ct_k_dropout(m.key, i, m.p, m.alpha);
    }
}
/* v: the input (gelu, silu) or the output (relu, tanh, sigmoid); scale and dropout read only g */
__device__ inline float map1_bwd(const ct_cuda_map &m, float v, float g, int64_t i) {
    switch (m.op) {
    case CT_CUDA_MAP_RELU: return ct_k_relu_bwd(v, g);
    case CT_CUDA_MAP_GELU: return ct_k_gelu_bwd(v, g);
    case CT_CUDA_MAP_GELU_TANH: return ct_k_gelu_tanh_bwd(v, g);
    case CT_CUDA_MAP_TANH: return ct_k_tanh_bwd(v, g);
    case CT_CUDA_MAP_SIGMOID: return ct_k_sigmoid_bwd(v, g);
    case CT_CUDA_MAP_SCALE: return g * m.alpha;
    case CT_CUDA_MAP_SILU: { /* d/dx x s(x) = s (1 + x (1 - s)), as the CPU op */
        float s = ct_k_sigmoid(v);
        return g * (s * (1.0f + v * (1.0f - s)));
    }
    default: return g * ct_k_dropout(m.key, i, m.p, m.alpha);
    }
}
template <typename T> __global__ void map_k(ct_cuda_map m, const T *x, T *y, int64_t n) {
    CT_GRID_STRIDE(i, n) y[i] = ct_st<T>(map1(m, ct_ld(x[i]), i));
}
/* g and dx f32 or of v's type T (low-precision activation gradients: read widened, written rounded) */
template <typename T, typename TG, typename TD>
__global__ void map_bwd_k(ct_cuda_map m, const T *v, const TG *g, TD *dx, int64_t n) {
    CT_GRID_STRIDE(i, n) dx[i] = ct_st<TD>(map1_bwd(m, v ? ct_ld(v[i]) : 0.0f, ct_ld(g[i]), i));
}
/* y = a + b[i % m] or a * b; TY: the common type, f32 for mixed inputs (autocast's promotion) */
template <typename TA, typename TB, typename TY>
__global__ void binary_k(bool mul, const TA *a, const TB *b, TY *y, int64_t n, int64_t m) {
    CT_GRID_STRIDE(i, n) {
        float x = ct_ld(a[i]), z = ct_ld(b[i % m]);
        y[i] = ct_st<TY>(mul ? x * z : x + z);
    }
}
__global__ void fill_k(float *y, float v, int64_t n) { CT_GRID_STRIDE(i, n) y[i] = v; }

/* The same kernels 8 elements a thread: one 16-byte access for a 2-byte type, two for f32
 * (a 2-byte element a thread moved about a quarter of the bandwidth on the H200). Taken where
 * every pointer is 16-byte aligned and n (and a repeating operand's m) a multiple of 8 (ct_x8_fits);
 * each element's arithmetic is the scalar kernel's, so the results are the same bits. */
template <typename T, typename TG, typename TD>
__global__ void map_bwd_k8(ct_cuda_map m, const ct_x8<T> *v, const ct_x8<TG> *g, ct_x8<TD> *dx, int64_t n8) {
    CT_GRID_STRIDE(i, n8) {
        const ct_x8<TG> b = g[i];
        const ct_x8<T> a = v ? v[i] : ct_x8<T>{};
        ct_x8<TD> d;
#pragma unroll
        for (int j = 0; j < 8; j++) d.v[j] = ct_st<TD>(map1_bwd(m, v ? ct_ld(a.v[j]) : 0.0f, ct_ld(b.v[j]), i * 8 + j));
        dx[i] = d;
    }
}
template <typename T> __global__ void map_k8(ct_cuda_map m, const ct_x8<T> *x, ct_x8<T> *y, int64_t n8) {
    CT_GRID_STRIDE(i, n8) {
        const ct_x8<T> a = x[i];
        ct_x8<T> b;
#pragma unroll
        for (int j = 0; j < 8; j++) b.v[j] = ct_st<T>(map1(m, ct_ld(a.v[j]), i * 8 + j));
        y[i] = b;
    }
}
template <typename TA, typename TB, typename TY>
__global__ void binary_k8(bool mul, const ct_x8<TA> *a, const ct_x8<TB> *b, ct_x8<TY> *y, int64_t n8, int64_t m8) {
    CT_GRID_STRIDE(i, n8) {
        const ct_x8<TA> x = a[i];
        const ct_x8<TB> z = b[i % m8];
        ct_x8<TY> r;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float u = ct_ld(x.v[j]), w = ct_ld(z.v[j]);
            r.v[j] = ct_st<TY>(mul ? u * w : u + w);
        }
        y[i] = r;
    }
}
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
/* 16 bytes at a time (8 bf16/f16 or 4 f32 elements): one thread's index arithmetic and one
 * 128-bit load and store for what the kernels above do in 8 or 4 (their 2-byte gathers ran at
 * about a tenth of an H200's bandwidth in the GPT's head-layout copies) */
struct alignas(16) v16 {
    uint32_t w[4];
};
template <typename I> __global__ void strided_copy_v16_k(v16 *dst, const v16 *src, ct_cuda_layout l, int64_t n) {
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
/* *out: the simplified view v counted in 16-byte units of `per` elements, where its innermost
 * dim is contiguous, every offset a multiple of 16 bytes and both pointers 16-byte aligned */
bool in_v16(const ct_cuda_layout *v, int per, const void *dst, const void *src, ct_cuda_layout *out) {
    const int last = v->ndim - 1;
    if (((uintptr_t)dst | (uintptr_t)src) % 16 || v->stride[last] != 1 || v->shape[last] % per) return false;
    for (int d = 0; d < last; d++)
        if (v->stride[d] % per) return false;
    *out = *v;
    out->shape[last] /= per;
    for (int d = 0; d < last; d++) out->stride[d] /= per;
    return true;
}
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
static const char *const map_names[][2] = {{"relu", "relu backward"},       {"gelu", "gelu backward"},
                                          {"gelu", "gelu backward"},       {"tanh", "tanh backward"},
                                          {"sigmoid", "sigmoid backward"}, {"scale", "scale backward"},
                                          {"dropout", "dropout backward"}, {"silu", "silu backward"}};
ct_status ct_cuda_map_fwd(cudaStream_t s, const ct_cuda_map *m, const void *x, void *y, ct_cuda_cast_type t, int64_t n) {
    if (ct_x8_fits(n, x, y))
        CT_WITH_TYPE(t, T, LAUNCH(map_names[m->op][0], map_k8<T>, n / 8, *m, (const ct_x8<T> *)x, (ct_x8<T> *)y, n / 8));
    CT_WITH_TYPE(t, T, LAUNCH(map_names[m->op][0], map_k<T>, n, *m, (const T *)x, (T *)y, n));
    return CT_OK;
}
ct_status ct_cuda_map_bwd_t(cudaStream_t s, const ct_cuda_map *m, const void *v, ct_cuda_cast_type t, const void *g, bool g_as_v,
                            void *dx, bool dx_as_v, int64_t n) {
    if (m->op == CT_CUDA_MAP_SCALE || m->op == CT_CUDA_MAP_DROPOUT) v = NULL;
    const char *name = map_names[m->op][1];
    if (ct_x8_fits(n, g, dx, v))
        CT_WITH_TYPE(t, T, {
            typedef const ct_x8<T> *V8;
            if (g_as_v && dx_as_v) LAUNCH(name, (map_bwd_k8<T, T, T>), n / 8, *m, (V8)v, (V8)g, (ct_x8<T> *)dx, n / 8);
            else if (g_as_v) LAUNCH(name, (map_bwd_k8<T, T, float>), n / 8, *m, (V8)v, (V8)g, (ct_x8<float> *)dx, n / 8);
            else if (dx_as_v)
                LAUNCH(name, (map_bwd_k8<T, float, T>), n / 8, *m, (V8)v, (const ct_x8<float> *)g, (ct_x8<T> *)dx, n / 8);
            else LAUNCH(name, (map_bwd_k8<T, float, float>), n / 8, *m, (V8)v, (const ct_x8<float> *)g, (ct_x8<float> *)dx, n / 8);
        });
    CT_WITH_TYPE(t, T, {
        if (g_as_v && dx_as_v) LAUNCH(name, (map_bwd_k<T, T, T>), n, *m, (const T *)v, (const T *)g, (T *)dx, n);
        else if (g_as_v) LAUNCH(name, (map_bwd_k<T, T, float>), n, *m, (const T *)v, (const T *)g, (float *)dx, n);
        else if (dx_as_v) LAUNCH(name, (map_bwd_k<T, float, T>), n, *m, (const T *)v, (const float *)g, (T *)dx, n);
        else LAUNCH(name, (map_bwd_k<T, float, float>), n, *m, (const T *)v, (const float *)g, (float *)dx, n);
    });
    return CT_OK;
}
ct_status ct_cuda_map_bwd(cudaStream_t s, const ct_cuda_map *m, const void *v, ct_cuda_cast_type t, const float *g, float *dx,
                          int64_t n) {
    return ct_cuda_map_bwd_t(s, m, v, t, g, false, dx, false, n);
}
ct_status ct_cuda_binary(cudaStream_t s, bool mul, const void *a, ct_cuda_cast_type ta, const void *b, ct_cuda_cast_type tb,
                         void *y, int64_t n, int64_t m) {
    if (m <= 0 || n % m) return ct_error(CT_ERR_INVALID, "cuda %s: %lld elements do not repeat a %lld-element operand",
                                         mul ? "mul" : "add", (long long)n, (long long)m);
    if (m % 8 == 0 && ct_x8_fits(n, a, b, y))
        CT_WITH_TYPE(ta, TA, CT_WITH_TYPE(tb, TB, {
            typedef typename ct_common<TA, TB>::T TY;
            LAUNCH(mul ? "mul" : "add", (binary_k8<TA, TB, TY>), n / 8, mul, (const ct_x8<TA> *)a, (const ct_x8<TB> *)b,
                   (ct_x8<TY> *)y, n / 8, m / 8);
        }));
    CT_WITH_TYPE(ta, TA, CT_WITH_TYPE(tb, TB, {
        typedef typename ct_common<TA, TB>::T TY;
        LAUNCH(mul ? "mul" : "add", (binary_k<TA, TB, TY>), n, mul, (const TA *)a, (const TB *)b, (TY *)y, n, m);
    }));
    return CT_OK;
}
static ct_status map32(cudaStream_t s, ct_cuda_map m, const float *x, float *y, int64_t n) {
    return ct_cuda_map_fwd(s, &m, x, y, CT_CUDA_CAST_F32, n);
}
static ct_status map32_bwd(cudaStream_t s, ct_cuda_map m, const float *v, const float *g, float *dx, int64_t n) {
    return ct_cuda_map_bwd(s, &m, v, CT_CUDA_CAST_F32, g, dx, n);
}
static ct_cuda_map gelu_map(bool th) { return ct_cuda_map{th ? CT_CUDA_MAP_GELU_TANH : CT_CUDA_MAP_GELU, 0, 0, 0}; }
ct_status ct_cuda_relu(cudaStream_t s, const float *x, float *y, int64_t n) {
    return map32(s, ct_cuda_map{CT_CUDA_MAP_RELU, 0, 0, 0}, x, y, n);
}
ct_status ct_cuda_relu_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t n) {
    return map32_bwd(s, ct_cuda_map{CT_CUDA_MAP_RELU, 0, 0, 0}, y, g, dx, n);
}
ct_status ct_cuda_gelu(cudaStream_t s, const float *x, float *y, int64_t n, bool tanh_approx) {
    return map32(s, gelu_map(tanh_approx), x, y, n);
}
ct_status ct_cuda_gelu_bwd(cudaStream_t s, const float *x, const float *g, float *dx, int64_t n, bool tanh_approx) {
    return map32_bwd(s, gelu_map(tanh_approx), x, g, dx, n);
}
ct_status ct_cuda_add(cudaStream_t s, const float *a, const float *b, float *y, int64_t n, int64_t m) {
    return ct_cuda_binary(s, false, a, CT_CUDA_CAST_F32, b, CT_CUDA_CAST_F32, y, n, m);
}
ct_status ct_cuda_scale(cudaStream_t s, const float *a, float alpha, float *y, int64_t n) {
    return map32(s, ct_cuda_map{CT_CUDA_MAP_SCALE, alpha, 0, 0}, a, y, n);
}
ct_status ct_cuda_fill(cudaStream_t s, float *y, float v, int64_t n) {
    LAUNCH("fill", fill_k, n, y, v, n);
}
static ct_status copy_v16(cudaStream_t s, void *dst, const void *src, const ct_cuda_layout *w, int64_t n) {
    v16 *d = (v16 *)dst;
    const v16 *x = (const v16 *)src;
    if (fits32(w, n)) LAUNCH("strided copy", strided_copy_v16_k<uint32_t>, n, d, x, *w, n);
    LAUNCH("strided copy", strided_copy_v16_k<int64_t>, n, d, x, *w, n);
}
ct_status ct_cuda_strided_copy(cudaStream_t s, float *dst, const float *src, const ct_cuda_layout *l) {
    int64_t n = numel(l);
    ct_cuda_layout v = simplify(l), w;
    if (in_v16(&v, 4, dst, src, &w)) return copy_v16(s, dst, src, &w, n / 4);
    if (fits32(&v, n)) LAUNCH("strided copy", strided_copy_k<uint32_t>, n, dst, src, v, n);
    LAUNCH("strided copy", strided_copy_k<int64_t>, n, dst, src, v, n);
}
ct_status ct_cuda_strided_copy16(cudaStream_t s, void *dst, const void *src, const ct_cuda_layout *l) {
    int64_t n = numel(l);
    ct_cuda_layout v = simplify(l);
    uint16_t *d = (uint16_t *)dst;
    const uint16_t *x = (const uint16_t *)src;
    ct_cuda_layout w;
    if (in_v16(&v, 8, dst, src, &w)) return copy_v16(s, dst, src, &w, n / 8);
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
    return ct_cuda_binary(s, true, a, CT_CUDA_CAST_F32, b, CT_CUDA_CAST_F32, y, n, n);
}
ct_status ct_cuda_tanh(cudaStream_t s, const float *x, float *y, int64_t n, bool sigmoid) {
    return map32(s, ct_cuda_map{sigmoid ? CT_CUDA_MAP_SIGMOID : CT_CUDA_MAP_TANH, 0, 0, 0}, x, y, n);
}
ct_status ct_cuda_tanh_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t n, bool sigmoid) {
    return map32_bwd(s, ct_cuda_map{sigmoid ? CT_CUDA_MAP_SIGMOID : CT_CUDA_MAP_TANH, 0, 0, 0}, y, g, dx, n);
}
ct_status ct_cuda_dropout(cudaStream_t s, const float *x, float *y, int64_t n, uint64_t key, float p, float scale) {
    return map32(s, ct_cuda_map{CT_CUDA_MAP_DROPOUT, scale, key, p}, x, y, n);
}
}
