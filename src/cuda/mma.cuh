/* Warp-level tensor-core products with fragments in registers (PTX mma.sync m16n8k16 and
 * ldmatrix), for kernels that work on a product's elements where they lie: FlashAttention's
 * softmax over S, its P fed straight back as the next product's A operand. WMMA (<mma.h>)
 * leaves the element layout unspecified, so it cannot do that; PTX fixes it:
 *
 *   lane = 4 g + t (g = lane / 4: "group", t = lane % 4)
 *   A, 16 x 16, 16-bit, 4 registers of two: a[0] = (g, 2t..2t+1)   a[1] = (g + 8, 2t..)
 *                                           a[2] = (g, 2t + 8..)    a[3] = (g + 8, 2t + 8..)
 *   B, 16 x 8 (k x n), 2 registers:         b[0] = (k 2t..2t+1, n g)  b[1] = (k 2t + 8.., n g)
 *   C, D, 16 x 8, f32, 4 values:            c[0..1] = (g, 2t..2t+1)   c[2..3] = (g + 8, 2t..)
 *
 * so two neighbouring 8-column C tiles, rounded to 16 bits pairwise, are one A operand of
 * k = 16. The lower half of a register is the lower column (or k).
 *
 * ldmatrix .x4 loads four 8 x 8 16-bit matrices from shared memory: lanes 8i..8i+7 give the
 * addresses of matrix i's rows (16-byte aligned), register i of lane l receives row l / 4,
 * columns 2 (l % 4)..+1 of matrix i; with .trans, column l / 4, rows 2 (l % 4)..+1. The
 * ct_mma_*_at helpers give each lane its address for the three operand shapes used.
 *
 * cp.async (sm_80 and later) copies global memory to shared without holding the thread, so the
 * next tile loads while this one is computed.
 *
 * Under tests/tools/cuda_emu (CT_CUDA_EMU_H) the lanes exchange their registers through the
 * emulator's warp slots and each computes its own elements, summing k in order with f32 fmas. */
#ifndef CT_CUDA_MMA_CUH
#define CT_CUDA_MMA_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* two floats rounded into one register of 16-bit pairs (lo in the lower half) */
__device__ __forceinline__ uint32_t ct_pack2(float lo, float hi, __nv_bfloat16 *) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) | (uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16;
}
__device__ __forceinline__ uint32_t ct_pack2(float lo, float hi, __half *) {
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

/* ldmatrix addresses, as element offsets from the operand's top-left element in a row-major
 * shared tile of row stride ld (elements):
 *   a_at: a 16 x 16 A operand (rows are M, columns K)
 *   bn_at: two 8-wide B operands of k 16 from rows that are N (a [n][k] tile: K of Q K^T);
 *          registers 0-1 are n 0..7, 2-3 n 8..15
 *   bt_at: the same from rows that are K (a [k][n] tile: V of P V), loaded with .trans */
__device__ __forceinline__ int ct_mma_a_at(int lane, int ld) { return (lane % 16) * ld + (lane / 16) * 8; }
__device__ __forceinline__ int ct_mma_bn_at(int lane, int ld) { return (lane % 8 + (lane / 16) * 8) * ld + (lane / 8 % 2) * 8; }
__device__ __forceinline__ int ct_mma_bt_at(int lane, int ld) { return (lane % 8 + (lane / 8 % 2) * 8) * ld + (lane / 16) * 8; }

#ifdef CT_CUDA_EMU_H
#include <stdio.h>
#include <stdlib.h>
template <bool trans> void ct_emu_ldsm_x4(uint32_t (&r)[4], const void *p) {
    const int lane = (int)(threadIdx.x % 32);
    if ((uintptr_t)p % 16) {
        fprintf(stderr, "ldmatrix: row address %p is not 16-byte aligned\n", p);
        abort();
    }
    const uint16_t *rows[32];
    ct_emu_warp_exchange(&p, sizeof p, rows);
    for (int i = 0; i < 4; i++) {
        const uint16_t *const *m = rows + 8 * i;
        uint16_t lo = trans ? m[2 * (lane % 4)][lane / 4] : m[lane / 4][2 * (lane % 4)];
        uint16_t hi = trans ? m[2 * (lane % 4) + 1][lane / 4] : m[lane / 4][2 * (lane % 4) + 1];
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
}
__device__ __forceinline__ void ct_ldsm_x4(uint32_t (&r)[4], const void *p) { ct_emu_ldsm_x4<false>(r, p); }
/* cp.async's emulation (tests/tools/cuda_emu): copies land as late as the waits allow, or at once */
__device__ __forceinline__ void ct_cp_async16(void *dst, const void *src, bool valid) { ct_emu_cp_async16(dst, src, valid); }
__device__ __forceinline__ void ct_cp_async_commit(void) { ct_emu_cp_async_commit(); }
template <int N> __device__ __forceinline__ void ct_cp_async_wait(void) { ct_emu_cp_async_wait(N); }
__device__ __forceinline__ void ct_ldsm_x4_t(uint32_t (&r)[4], const void *p) { ct_emu_ldsm_x4<true>(r, p); }
template <typename T> void ct_mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    struct frag {
        uint32_t a[4], b[2];
    } mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}}, all[32];
    ct_emu_warp_exchange(&mine, sizeof mine, all);
    auto wide = [](uint32_t reg, int half) {
        T h;
        uint16_t bits = (uint16_t)(reg >> (16 * half));
        memcpy(&h, &bits, 2);
        return ct_emu_wf(h);
    };
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int e = 0; e < 2; e++) {
            A[g][2 * t + e] = wide(all[l].a[0], e), A[g + 8][2 * t + e] = wide(all[l].a[1], e);
            A[g][2 * t + 8 + e] = wide(all[l].a[2], e), A[g + 8][2 * t + 8 + e] = wide(all[l].a[3], e);
            B[2 * t + e][g] = wide(all[l].b[0], e), B[2 * t + 8 + e][g] = wide(all[l].b[1], e);
        }
    }
    const int lane = (int)(threadIdx.x % 32), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
        float s = d[i];
        for (int k = 0; k < 16; k++) s = fmaf(A[r][k], B[k][c], s);
        d[i] = s;
    }
}
#else
__device__ __forceinline__ void ct_ldsm_x4(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ct_ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* 16 bytes global -> shared without the thread waiting (zeros when !valid: src is not read);
 * commit closes a group of them, wait<N> waits until at most N groups are still in flight */
__device__ __forceinline__ void ct_cp_async16(void *dst, const void *src, bool valid) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void ct_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void ct_cp_async_wait(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
/* d += A B, f32 sums of 16-bit products */
template <typename T> __device__ __forceinline__ void ct_mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void ct_mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void ct_mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
#endif
