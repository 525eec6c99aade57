/* Flash attention on tensor cores (WMMA, 16 x 16 x 16 bf16/f16 products with f32 sums), for
 * bf16 and f16 q, k, v of head dim 32, 64 or 128, with CTRAIN_CUDA_ATTENTION=tc. Not yet run
 * on a GPU; tests/scripts/cuda_emu.sh runs these kernels on the CPU (tests/tools/cuda_emu:
 * whole-tile fragments per lane, the API's alignment rules checked) against the row kernels.
 *
 * The algorithm and its passes are attention_tiled.cu's (its notes give the flops):
 *   forward   per 64-query tile, over key tiles: S = Q K^T, online softmax, O = O alpha + P V
 *   dK, dV    per 64-key tile, over query tiles: P^T, dP^T = V dO^T, dS^T; dV += P^T dO, dK += dS^T Q
 *   dQ        per 64-query tile, over key tiles: P, dP = dO V^T, dS; dQ += dS K
 * (dQ its own pass instead of atomics: every gradient element summed in one fixed order.)
 * Each of the 4 warps of a block owns 16 rows of the tile. The products run on tensor cores:
 * the warp's 16 x 64 block of S (or dP) is stored to shared memory as f32, where the lanes apply
 * the mask and the per-element math of ops/kmath.h (two lanes a row, 32 columns each), and P
 * (or dS) goes back into the next product rounded to the element type, as FlashAttention does:
 * so P V and dS K see P and dS in bf16/f16, where the row kernels keep them in f32 (the
 * results agree within the low precision's tolerance, not bit for bit). The forward's O stays
 * in shared memory (f32), because rescaling it by each row's alpha needs to know which row an
 * accumulator element is in, which WMMA leaves unspecified; the backward's dK, dV and dQ
 * accumulate in fragments (registers) across the whole loop.
 *
 * Shared memory, 64-row tiles: forward Q, K, V (16-bit), S and O (f32), P (16-bit); dK/dV
 * and dQ: four 16-bit tiles, S and dP (f32), P/dS (16-bit), lse and Dr rows. For D = 64:
 * 71 KiB (forward), 89 and 80 KiB (backward) with the padded rows, above the 48 KiB default, so
 * each kernel asks for it. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "cuda/attention_launch.cuh"
#include "cuda/attention_tile.cuh"
#include "cuda/attention_tiled.cuh"

using namespace nvcuda;

namespace {
enum { BM = 64, NT = 128 };
/* Row strides in shared memory, padded so that neither the WMMA tile loads and stores nor
 * the lanes' row-wise passes fall on one bank (unpadded, a 64-wide row put every row of a
 * tile on the same banks: up to 32-way conflicts). LS: S and dP (f32); LP: P and dS (16-bit);
 * ld16<D>: the Q, K, V, dO tiles (16-bit); ldo<D>: the forward's O (f32). Each keeps a 16-row
 * step a multiple of 32 bytes, as WMMA's pointers need. */
enum { LS = BM + 4, LP = BM + 8 };
template <int D> __host__ __device__ constexpr int ld16() { return D + 8; }
template <int D> __host__ __device__ constexpr int ldo() { return D + 4; }

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_t;
template <typename T> using a_row = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T> using b_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T> using b_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

template <int D, typename T> __device__ void load16(T *s, const T *g, int64_t r0, int64_t n) {
    ct_attn_load_tile<BM, NT, D, ld16<D>()>(s, g, r0, n);
}
__device__ void load_rows(float *lse_t, float *dr_t, const float *lse, const float *dr, int64_t r0, int64_t n) {
    for (int r = threadIdx.x; r < BM; r += NT) {
        lse_t[r] = r0 + r < n ? lse[r0 + r] : 0.0f;
        dr_t[r] = r0 + r < n ? dr[r0 + r] : 0.0f;
    }
}

/* out (the warp's 16 x 64 block, f32, row stride LS) = A16 (16 x K, row stride lda) times B^T
 * or B, for B's 64 rows (64 x K, row stride ldb: `transposed`) or (K x 64) */
template <int K, typename T, bool transposed>
__device__ void mm_16x64(float *out, const T *A, int lda, const T *B, int ldb) {
    for (int j = 0; j < BM / 16; j++) {
        acc_t c;
        wmma::fill_fragment(c, 0.0f);
        for (int k = 0; k < K / 16; k++) {
            a_row<T> a;
            wmma::load_matrix_sync(a, A + k * 16, lda);
            if (transposed) {
                b_col<T> b;
                wmma::load_matrix_sync(b, B + j * 16 * ldb + k * 16, ldb);
                wmma::mma_sync(c, a, b, c);
            } else {
                b_row<T> b;
                wmma::load_matrix_sync(b, B + k * 16 * ldb + j * 16, ldb);
                wmma::mma_sync(c, a, b, c);
            }
        }
        wmma::store_matrix_sync(out + j * 16, c, LS, wmma::mem_row_major);
    }
}
/* acc[j] (the warp's 16 x D result, columns 16 j..) += A16 (16 x 64, row stride LP) B (64 x D,
 * row stride ld16<D>) */
template <int D, typename T> __device__ void acc_16xD(acc_t (&acc)[D / 16], const T *A, const T *B) {
    for (int k = 0; k < BM / 16; k++) {
        a_row<T> a;
        wmma::load_matrix_sync(a, A + k * 16, LP);
        for (int j = 0; j < D / 16; j++) {
            b_row<T> b;
            wmma::load_matrix_sync(b, B + k * 16 * ld16<D>() + j * 16, ld16<D>());
            wmma::mma_sync(acc[j], a, b, acc[j]);
        }
    }
}
/* the warp's 16 x D result to rows [r0, r0 + 16) of a head's matrix (rows past n skipped),
 * through its 16 x 64 f32 scratch of row stride LS (D <= 64 at a time) */
template <int D, typename T> __device__ void store_16xD(T *g, acc_t (&acc)[D / 16], float *scr, int64_t r0, int64_t n) {
    const int lane = threadIdx.x % 32;
    for (int c0 = 0; c0 < D; c0 += BM) {
        for (int j = c0 / 16; j < D / 16 && j < (c0 + BM) / 16; j++)
            wmma::store_matrix_sync(scr + (j * 16 - c0), acc[j], LS, wmma::mem_row_major);
        __syncwarp();
        const int w = D - c0 < BM ? D - c0 : BM;
        for (int e = lane; e < 16 * w; e += 32) {
            int r = e / w, c = e % w;
            if (r0 + r < n) ct_attn_put(&g[(r0 + r) * D + c0 + c], scr[r * LS + c]);
        }
        __syncwarp();
    }
}

template <int D, typename T>
__global__ void __launch_bounds__(NT) fwd_k(const T *q, const T *k, const T *v, T *o, float *lse, int64_t n, bool causal,
                                            float sc, int64_t G) {
    extern __shared__ float sm[];
    constexpr int L16 = ld16<D>(), LO = ldo<D>();
    T *Qs = (T *)sm, *Ks = Qs + BM * L16, *Vs = Ks + BM * L16;
    float *Ss = (float *)(Vs + BM * L16), *Os = Ss + BM * LS;
    T *Ps = (T *)(Os + BM * LO);
    float *ms = (float *)(Ps + BM * LP), *ls = ms + BM, *al = ls + BM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = warp * 16 + lane / 2, half = lane % 2;
    const int64_t base = (int64_t)blockIdx.y * n * D, q0 = (int64_t)blockIdx.x * BM, qi = q0 + r;
    const int64_t kb = (int64_t)blockIdx.y / G * n * D; /* the key/value head of this query head */
    load16<D>(Qs, q + base, q0, n);
    for (int e = threadIdx.x; e < BM * LO; e += NT) Os[e] = 0.0f;
    for (int i = threadIdx.x; i < BM; i += NT) ms[i] = -INFINITY, ls[i] = 0.0f;
    const int64_t kend = causal ? (q0 + BM < n ? q0 + BM : n) : n;
    for (int64_t k0 = 0; k0 < kend; k0 += BM) {
        __syncthreads(); /* the previous tile is done with Ks, Vs */
        load16<D>(Ks, k + kb, k0, n);
        load16<D>(Vs, v + kb, k0, n);
        __syncthreads();
        mm_16x64<D, T, true>(Ss + warp * 16 * LS, Qs + warp * 16 * L16, L16, Ks, L16); /* S = Q K^T */
        __syncwarp();
        /* the online softmax of row r over this tile's 64 keys, every other one per lane (the
         * two lanes of a row on neighbouring banks) */
        float *srow = Ss + r * LS, mt = -INFINITY, ps = 0.0f;
        for (int c = half; c < BM; c += 2) {
            const int64_t kj = k0 + c;
            srow[c] = kj < n && (!causal || kj <= qi) ? srow[c] * sc : -INFINITY;
            mt = fmaxf(mt, srow[c]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        float m = ms[r], l = ls[r], alpha = ct_k_attn_rescale(&m, &l, mt);
        for (int c = half; c < BM; c += 2) {
            float p = ct_vexpf(srow[c] - m);
            ps += p;
            ct_attn_put(&Ps[r * LP + c], p);
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        __syncwarp(); /* both lanes of the row read ms, ls before one writes them */
        if (half == 0) ms[r] = m, ls[r] = l + ps, al[r] = alpha;
        __syncwarp();
        float *orow = Os + warp * 16 * LO;
        for (int e = lane; e < 16 * D; e += 32) orow[e / D * LO + e % D] *= al[warp * 16 + e / D];
        __syncwarp();
        acc_t acc[D / 16]; /* O = O alpha + P V, through the accumulators */
        for (int j = 0; j < D / 16; j++) wmma::load_matrix_sync(acc[j], orow + j * 16, LO, wmma::mem_row_major);
        acc_16xD<D, T>(acc, Ps + warp * 16 * LP, Vs);
        for (int j = 0; j < D / 16; j++) wmma::store_matrix_sync(orow + j * 16, acc[j], LO, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < BM * D; e += NT) {
        const int rr = e / D;
        if (q0 + rr < n) ct_attn_put(&o[base + (q0 + rr) * D + e % D], ls[rr] > 0 ? Os[rr * LO + e % D] / ls[rr] : 0.0f);
    }
    for (int i = threadIdx.x; i < BM; i += NT)
        if (q0 + i < n) lse[(int64_t)blockIdx.y * n + q0 + i] = ct_k_attn_lse(ms[i], ls[i]);
}

/* P and dS of the warp's 16 rows of a (rows x 64 columns) tile pair from S and dP (f32, row
 * stride LS; P into Pf, S itself or NULL), dS rounded into Ds (row stride LP); rows are
 * queries (dQ) or keys (dK/dV) */
__device__ void p_ds(float *S, const float *dP, const float *lse_t, const float *dr_t, int64_t r0, int64_t c0, int64_t n,
                     bool causal, bool rows_are_q, float sc, float *Pf, void *Ds, bool bf16) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, ri = warp * 16 + lane / 2, half = lane % 2;
    for (int cj = half; cj < BM; cj += 2) { /* every other column: the row's two lanes on neighbouring banks */
        const int64_t qi = rows_are_q ? r0 + ri : c0 + cj, kj = rows_are_q ? c0 + cj : r0 + ri;
        const int qt = rows_are_q ? ri : cj;
        const int at = ri * LS + cj, ad = ri * LP + cj;
        float p = qi < n && kj < n && (!causal || kj <= qi) ? ct_vexpf(S[at] * sc - lse_t[qt]) : 0.0f;
        float ds = ct_k_attn_ds(p, dP[at], dr_t[qt], sc);
        if (Pf) Pf[at] = p;
        if (bf16) ct_attn_put(&((__nv_bfloat16 *)Ds)[ad], ds);
        else ct_attn_put(&((__half *)Ds)[ad], ds);
    }
}

template <int D, typename T>
__global__ void __launch_bounds__(NT) dkv_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr,
                                            T *dk, T *dv, int64_t n, bool causal, float sc, int64_t G) {
    extern __shared__ float sm[];
    constexpr int L16 = ld16<D>();
    T *Ks = (T *)sm, *Vs = Ks + BM * L16, *Qs = Vs + BM * L16, *Gs = Qs + BM * L16;
    float *Ss = (float *)(Gs + BM * L16), *dPs = Ss + BM * LS;
    T *Ps = (T *)(dPs + BM * LS), *Ds = Ps + BM * LP;
    float *lse_t = (float *)(Ds + BM * LP), *dr_t = lse_t + BM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = blockIdx.y, base = h * n * D, k0 = (int64_t)blockIdx.x * BM;
    const int64_t kb = (int64_t)blockIdx.y / G * n * D; /* the key/value head of this query head */
    load16<D>(Ks, k + kb, k0, n);
    load16<D>(Vs, v + kb, k0, n);
    acc_t ak[D / 16], av[D / 16];
    for (int j = 0; j < D / 16; j++) wmma::fill_fragment(ak[j], 0.0f), wmma::fill_fragment(av[j], 0.0f);
    float *Sw = Ss + warp * 16 * LS, *dPw = dPs + warp * 16 * LS;
    for (int64_t q0 = causal ? k0 : 0; q0 < n; q0 += BM) {
        __syncthreads(); /* the previous tile is done with Qs, Gs */
        load16<D>(Qs, q + base, q0, n);
        load16<D>(Gs, g + base, q0, n);
        load_rows(lse_t, dr_t, lse + h * n, dr + h * n, q0, n);
        __syncthreads();
        mm_16x64<D, T, true>(Sw, Ks + warp * 16 * L16, L16, Qs, L16);  /* S^T: keys x queries */
        mm_16x64<D, T, true>(dPw, Vs + warp * 16 * L16, L16, Gs, L16); /* dP^T = V dO^T */
        __syncwarp();
        p_ds(Ss, dPs, lse_t, dr_t, k0, q0, n, causal, false, sc, Ss, Ds, !std::is_same<T, __half>::value);
        __syncwarp(); /* P^T of the other lanes' rows */
        for (int e = lane; e < 16 * BM; e += 32) /* P^T rounded for its product */
            ct_attn_put(&Ps[(warp * 16 + e / BM) * LP + e % BM], Sw[e / BM * LS + e % BM]);
        __syncwarp();
        acc_16xD<D, T>(av, Ps + warp * 16 * LP, Gs); /* dV += P^T dO */
        acc_16xD<D, T>(ak, Ds + warp * 16 * LP, Qs); /* dK += dS^T Q */
    }
    __syncwarp();
    store_16xD<D>(dk + base, ak, Sw, k0 + warp * 16, n);
    store_16xD<D>(dv + base, av, Sw, k0 + warp * 16, n);
}

template <int D, typename T>
__global__ void __launch_bounds__(NT) dq_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr,
                                           T *dq, int64_t n, bool causal, float sc, int64_t G) {
    extern __shared__ float sm[];
    constexpr int L16 = ld16<D>();
    T *Qs = (T *)sm, *Gs = Qs + BM * L16, *Ks = Gs + BM * L16, *Vs = Ks + BM * L16;
    float *Ss = (float *)(Vs + BM * L16), *dPs = Ss + BM * LS;
    T *Ds = (T *)(dPs + BM * LS);
    float *lse_t = (float *)(Ds + BM * LP), *dr_t = lse_t + BM;
    const int warp = threadIdx.x / 32;
    const int64_t h = blockIdx.y, base = h * n * D, q0 = (int64_t)blockIdx.x * BM;
    const int64_t kb = (int64_t)blockIdx.y / G * n * D; /* the key/value head of this query head */
    load16<D>(Qs, q + base, q0, n);
    load16<D>(Gs, g + base, q0, n);
    load_rows(lse_t, dr_t, lse + h * n, dr + h * n, q0, n);
    acc_t aq[D / 16];
    for (int j = 0; j < D / 16; j++) wmma::fill_fragment(aq[j], 0.0f);
    float *Sw = Ss + warp * 16 * LS, *dPw = dPs + warp * 16 * LS;
    const int64_t kend = causal ? (q0 + BM < n ? q0 + BM : n) : n;
    for (int64_t k0 = 0; k0 < kend; k0 += BM) {
        __syncthreads();
        load16<D>(Ks, k + kb, k0, n);
        load16<D>(Vs, v + kb, k0, n);
        __syncthreads();
        mm_16x64<D, T, true>(Sw, Qs + warp * 16 * L16, L16, Ks, L16);  /* S: queries x keys */
        mm_16x64<D, T, true>(dPw, Gs + warp * 16 * L16, L16, Vs, L16); /* dP = dO V^T */
        __syncwarp();
        p_ds(Ss, dPs, lse_t, dr_t, q0, k0, n, causal, true, sc, NULL, Ds, !std::is_same<T, __half>::value);
        __syncwarp();
        acc_16xD<D, T>(aq, Ds + warp * 16 * LP, Ks); /* dQ += dS K */
    }
    __syncwarp();
    store_16xD<D>(dq + base, aq, Sw, q0 + warp * 16, n);
}

/* shared bytes: `t16` 16-bit tiles of 64 x D, `f32` f32 64 x 64 blocks plus `o` of 64 x D,
 * `p16` 16-bit 64 x 64 blocks (each at its padded row stride), and `rows` f32 rows of 64 */
template <int D> constexpr size_t smem(int t16, int f32, int o, int p16, int rows) {
    return 2 * (size_t)BM * ld16<D>() * t16 + 4 * (size_t)BM * LS * f32 + 4 * (size_t)BM * ldo<D>() * o + 2 * (size_t)BM * LP * p16 +
           4 * (size_t)BM * rows;
}
template <int D, typename T>
ct_status fwd(cudaStream_t s, const void *q, const void *k, const void *v, void *o, float *lse, int64_t BH, int64_t n,
              bool causal, int64_t G) {
    return ct_attn_launch_fwd<T>(s, fwd_k<D, T>, smem<D>(3, 1, 1, 1, 3), NT, BM, D, q, k, v, o, lse, BH, n, causal, G);
}
template <int D, typename T>
ct_status bwd(cudaStream_t s, const void *q, const void *k, const void *v, const void *g, const float *lse, const float *dr,
              void *dq, void *dk, void *dv, int64_t BH, int64_t n, bool causal, int64_t G) {
    return ct_attn_launch_bwd<T>(s, dkv_k<D, T>, smem<D>(4, 2, 0, 2, 2), dq_k<D, T>, smem<D>(4, 2, 0, 1, 2), NT, BM, D, q, k, v, g,
                                 lse, dr, dq, dk, dv, BH, n, causal, G);
}
template <typename T>
ct_status fwd_t(cudaStream_t s, const void *q, const void *k, const void *v, void *o, float *lse, int64_t BH, int64_t n, int D,
                bool causal, int64_t G) {
    return D == 64    ? fwd<64, T>(s, q, k, v, o, lse, BH, n, causal, G)
           : D == 128 ? fwd<128, T>(s, q, k, v, o, lse, BH, n, causal, G)
                      : fwd<32, T>(s, q, k, v, o, lse, BH, n, causal, G);
}
template <typename T>
ct_status bwd_t(cudaStream_t s, const void *q, const void *k, const void *v, const void *g, const float *lse, const float *dr,
                void *dq, void *dk, void *dv, int64_t BH, int64_t n, int D, bool causal, int64_t G) {
    return D == 64    ? bwd<64, T>(s, q, k, v, g, lse, dr, dq, dk, dv, BH, n, causal, G)
           : D == 128 ? bwd<128, T>(s, q, k, v, g, lse, dr, dq, dk, dv, BH, n, causal, G)
                      : bwd<32, T>(s, q, k, v, g, lse, dr, dq, dk, dv, BH, n, causal, G);
}
} // namespace

bool ct_cuda_attention_tc_fits(ct_cuda_dtype dt, int D) { return dt != CT_CUDA_F32 && (D == 32 || D == 64 || D == 128); }

ct_status ct_cuda_attention_tc(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o, float *lse,
                               int64_t BH, int64_t T, int D, bool causal, int64_t G) {
    if (dt == CT_CUDA_BF16) return fwd_t<__nv_bfloat16>(s, q, k, v, o, lse, BH, T, D, causal, G);
    return fwd_t<__half>(s, q, k, v, o, lse, BH, T, D, causal, G);
}
ct_status ct_cuda_attention_tc_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, const void *dO,
                                   const float *lse, const float *dr, void *dq, void *dk, void *dv, int64_t BH, int64_t T, int D,
                                   bool causal, int64_t G) {
    if (dt == CT_CUDA_BF16) return bwd_t<__nv_bfloat16>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G);
    return bwd_t<__half>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, G);
}
