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
#endif
