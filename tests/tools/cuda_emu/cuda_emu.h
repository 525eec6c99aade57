/* CUDA on the CPU, for checking kernels where no GPU is (tests/scripts/cuda_emu.sh).
 *
 * The .cu files of src/cuda are compiled as plain C++ against this header (the files in
 * include/ stand in for the CUDA headers), after tests/tools/cuda_emu/transform.py has turned
 * each `kernel<<<grid, block, smem, stream>>>(args)` into a ct_emu_launch call. A launch runs
 * the blocks one after another; a block's threads are host threads. __syncthreads is a barrier
 * over the block's live threads, a warp shuffle an exchange through slots between two
 * barriers over the warp's live lanes (a thread that returns leaves both), __shared__ arrays
 * are statics (one block at a time), dynamic shared memory one buffer. Device memory is host
 * memory, streams are ignored, every call succeeds. What this checks is the kernels' own
 * code: indexing, masking, reductions, the order of their sums; not timing, not races the
 * hardware would have, not cuBLAS/cuDNN/NCCL. */
#ifndef CT_CUDA_EMU_H
#define CT_CUDA_EMU_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __device_builtin__

typedef void *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
template <typename K> cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) { return cudaSuccess; }
inline const char *cudaGetErrorString(cudaError_t) { return "emulated"; }
inline const char *cudaGetErrorName(cudaError_t) { return "emulated"; }

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern thread_local uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim, gridDim;
extern float *ct_emu_dyn_smem;

void __syncthreads(void);
/* the value of lane (this lane ^ o) of the warp; 8 bytes a slot */
uint64_t ct_emu_shfl_xor(uint64_t bits, int o);
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = ct_emu_shfl_xor(b, o);
    memcpy(&v, &b, sizeof v);
    return v;
}
/* every lane's `bytes` (at most 64) into all[32 * bytes], between two barriers over the warp:
 * the register exchange of mma.sync and ldmatrix (src/cuda/mma.cuh) */
void ct_emu_warp_exchange(const void *mine, size_t bytes, void *all);
/* cp.async (src/cuda/mma.cuh), per thread: a copy lands only when a wait covers its group, as
 * late as the hardware may (a read before the wait sees the old tile); with CT_EMU_CP_EAGER set,
 * at once, as early as it may (a refill before every warp is done with a buffer overwrites
 * what they read). !valid: 16 zero bytes, src not read */
void ct_emu_cp_async16(void *dst, const void *src, bool valid);
void ct_emu_cp_async_commit(void);
void ct_emu_cp_async_wait(int n);
void ct_emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);

/* bf16 and fp16 as the CUDA headers give them on the host: round to nearest even */
struct __nv_bfloat16 {
    uint16_t x;
};
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    h.x = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fff : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
struct __half {
    uint16_t x;
};
float ct_emu_half_to_float(uint16_t h);
uint16_t ct_emu_float_to_half(float f);
inline float __half2float(__half h) { return ct_emu_half_to_float(h.x); }
inline __half __float2half_rn(float f) {
    __half h;
    h.x = ct_emu_float_to_half(f);
    return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.x; }

/* the tensor-core fragments of <mma.h> (nvcuda::wmma): every lane holds the whole tile (the
 * real ones spread it over the warp in an unspecified layout, so kernels may only touch their
 * elements uniformly), loads and stores check the API's alignment rules (a 256-bit aligned
 * pointer, ldm a multiple of 16 bytes), and a product sums in k order with f32 fmas. Lanes
 * meet in __syncwarp, as the hardware needs between a store and other lanes' reads; and after
 * each load and store, so that no lane overwrites a tile another is still loading, nor writes
 * its (equal) copy over a change a faster lane made next: each real lane moves its own
 * elements only. */
void __syncwarp(unsigned mask = 0xffffffffu);
void ct_emu_wmma_check(const void *p, unsigned ldm, size_t elem, const char *what);
/* CUDA's round-to-nearest arithmetic intrinsics (never contracted into an FMA) */
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float ct_emu_wf(float v) { return v; }
inline float ct_emu_wf(__half v) { return __half2float(v); }
inline float ct_emu_wf(__nv_bfloat16 v) { return __bfloat162float(v); }
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    enum { R = std::is_same<Use, matrix_b>::value ? K : M, C = std::is_same<Use, matrix_a>::value ? K : N };
    enum { num_elements = R * C };
    T x[num_elements];
};
template <typename Use, int M, int N, int K, typename T, typename L>
void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm) {
    typedef fragment<Use, M, N, K, T, L> F;
    ct_emu_wmma_check(p, ldm, sizeof(T), "load_matrix_sync");
    for (int r = 0; r < F::R; r++)
        for (int c = 0; c < F::C; c++) f.x[r * F::C + c] = std::is_same<L, col_major>::value ? p[c * ldm + r] : p[r * ldm + c];
    __syncwarp();
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm, layout_t l) {
    ct_emu_wmma_check(p, ldm, sizeof(float), "load_matrix_sync");
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) f.x[r * N + c] = l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
    __syncwarp();
}
template <int M, int N, int K>
void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm, layout_t l) {
    ct_emu_wmma_check(p, ldm, sizeof(float), "store_matrix_sync");
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * N + c];
    __syncwarp();
}
template <typename Use, int M, int N, int K, typename T, typename L>
void fill_fragment(fragment<Use, M, N, K, T, L> &f, float v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}
template <int M, int N, int K, typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
              const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c) {
    float out[M * N];
    for (int r = 0; r < M; r++)
        for (int j = 0; j < N; j++) {
            float s = c.x[r * N + j];
            for (int k = 0; k < K; k++) s = fmaf(ct_emu_wf(a.x[r * K + k]), ct_emu_wf(b.x[k * N + j]), s);
            out[r * N + j] = s;
        }
    memcpy(d.x, out, sizeof out);
}
} // namespace wmma
} // namespace nvcuda
#endif
