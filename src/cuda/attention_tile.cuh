/* Shared by the tensor-core attention kernels (attention_tc.cu, attention_mma.cu): 16-bit
 * stores and the loads of a head's rows into a padded shared tile. */
#ifndef CT_CUDA_ATTENTION_TILE_CUH
#define CT_CUDA_ATTENTION_TILE_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ void ct_attn_put(__nv_bfloat16 *p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void ct_attn_put(__half *p, float x) { *p = __float2half_rn(x); }

struct alignas(16) ct_attn_v16 { /* 8 bf16/f16 values: one 128-bit load or store */
    uint32_t w[4];
};
/* rows [r0, r0 + ROWS) of a head's n rows of D (row stride gld elements; D for a contiguous
 * [n, D]) into a 16-bit tile of row stride LD (rows past n as zeros), by the block's NT
 * threads: 16 bytes a thread where the head's rows are 16-byte aligned (every buffer the ops
 * hand over; D and LD are multiples of 8), else 2 */
template <int ROWS, int NT, int D, int LD, typename T>
__device__ void ct_attn_load_tile(T *s, const T *g, int64_t r0, int64_t n, int64_t gld = D) {
    if ((uintptr_t)g % 16 == 0 && gld % 8 == 0) {
        const ct_attn_v16 zero = {{0u, 0u, 0u, 0u}}; /* +0 in bf16 and f16 */
        for (int e = threadIdx.x; e < ROWS * D / 8; e += NT) {
            int r = e / (D / 8), c = e % (D / 8) * 8;
            *(ct_attn_v16 *)&s[r * LD + c] = r0 + r < n ? *(const ct_attn_v16 *)&g[(r0 + r) * gld + c] : zero;
        }
        return;
    }
    for (int e = threadIdx.x; e < ROWS * D; e += NT) {
        int r = e / D, c = e % D;
        if (r0 + r < n) s[r * LD + c] = g[(r0 + r) * gld + c];
        else ct_attn_put(&s[r * LD + c], 0.0f);
    }
}
#endif
