/* Flash attention with its tiles in registers (FlashAttention-2's layout), on tensor cores
 * through mma.sync m16n8k16 (cuda/mma.cuh), for bf16 and f16 q, k, v of head dim 32 or 64,
 * with CTRAIN_CUDA_ATTENTION=mma. Not yet run on a GPU; tests/scripts/cuda_emu.sh runs these
 * kernels on the CPU (the warp's registers exchanged as the hardware's fragment layout
 * places them) against the row kernels.
 *
 * The passes are attention_tc.cu's (attention_tiled.cu gives the flops):
 *   forward   per 64-query tile, over 64-key tiles: S = Q K^T, online softmax, O = O alpha + P V
 *   dK, dV    per 64-key tile, over query tiles: S^T = K Q^T, dP^T = V dO^T, P^T, dS^T;
 *             dV += P^T dO, dK += dS^T Q
 *   dQ        per 64-query tile, over key tiles: S = Q K^T, dP = dO V^T, P, dS; dQ += dS K
 * (dQ its own pass instead of atomics: every gradient element summed in one fixed order.)
 * Each of a block's 4 warps owns 16 rows of the tile. Where attention_tc.cu stores each 16 x 64
 * product to shared memory for the softmax and reads P back (WMMA's layout is unspecified),
 * here a lane's S and O elements stay in its registers: it knows their rows (g and g + 8) and
 * columns, so the row max and sum take two shuffles within its group of four, alpha rescales
 * O where it lies, and S's C fragments, rounded pairwise, are P's A fragments for P V. Shared
 * memory holds only the 16-bit Q, K, V (dO) tiles, the streamed pair twice: the next tile pair
 * loads by cp.async while this one is computed. For D = 64: 45 KiB forward, 55 and 54 KiB
 * backward (attention_tc.cu: 71, 89 and 80). exp is exp2 on log2-scaled scores (scale * log2 e
 * folded in), as FlashAttention's; P and dS enter their products rounded to the element type.
 *
 * Registers per lane for D = 64: forward S 32 + O 32 + Q 16 floats; dK/dV S^T, dP^T, dK, dV
 * 32 each; dQ S, dP, dQ 32 each + Q, dO 16 each. Head dim 128 would double the accumulators
 * past what a lane holds without spilling: it takes attention_tc.cu's kernels. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/attention_launch.cuh"
#include "cuda/attention_tile.cuh"
#include "cuda/attention_tiled.cuh"
#include "cuda/mma.cuh"

namespace {
enum { BM = 64, NT = 128 };
/* 16-bit tile rows padded by 16 bytes: the 8 row addresses of an ldmatrix land on distinct
 * banks (unpadded, a 64- or 32-wide row puts them on the same ones) */
template <int D> __host__ __device__ constexpr int ldt() { return D + 8; }
const float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

template <int D, typename T> __device__ void load(T *s, const T *g, int64_t ld, int64_t r0, int64_t n) {
    ct_attn_load_tile<BM, NT, D, ldt<D>()>(s, g, r0, n, ld);
}
/* where head bh of a query-side tensor (v: its view) starts; kv_head: that of a key-side input */
__device__ __forceinline__ int64_t head_at(const ct_cuda_attn_view &v, int64_t bh, int64_t H) {
    return bh / H * v.batch + bh % H * v.head;
}
__device__ __forceinline__ int64_t kv_head_at(const ct_cuda_attn_view &v, int64_t bh, const ct_cuda_attn_views &V) {
    return head_at(v, bh / V.G, V.H / V.G);
}
/* rows [r0, r0 + 64) of two heads (row strides la, lb) into the tiles sa and sb without waiting
 * (cp.async, one group; rows past n as zeros), so that they load while the tile before them is
 * computed; at once where a head's rows are not 16-byte aligned */
template <int D, typename T>
__device__ void fetch2(T *sa, const T *ga, int64_t la, T *sb, const T *gb, int64_t lb, int64_t r0, int64_t n) {
    if ((uintptr_t)ga % 16 || (uintptr_t)gb % 16 || la % 8 || lb % 8) {
        ct_attn_load_tile<BM, NT, D, ldt<D>()>(sa, ga, r0, n, la);
        ct_attn_load_tile<BM, NT, D, ldt<D>()>(sb, gb, r0, n, lb);
    } else {
        for (int e = threadIdx.x; e < BM * D / 8; e += NT) {
            const int r = e / (D / 8), c = e % (D / 8) * 8;
            const bool in = r0 + r < n;
            ct_cp_async16(&sa[r * ldt<D>() + c], in ? &ga[(r0 + r) * la + c] : ga, in);
            ct_cp_async16(&sb[r * ldt<D>() + c], in ? &gb[(r0 + r) * lb + c] : gb, in);
        }
    }
    ct_cp_async_commit();
}
/* before computing on the tile pair fetched last: the one after it (if any) starts loading into
 * the other buffer, then this one's copies are waited for; the caller's __syncthreads makes
 * them every thread's */
__device__ __forceinline__ void wait_for_tile(bool next_fetched) {
    if (next_fetched) ct_cp_async_wait<1>();
    else ct_cp_async_wait<0>();
}
/* the double-buffered K/V loop's stage for key tile k0 (buffer `it` of the pair after `base`,
 * which holds tile 0's pair from before the loop): fetches the next pair into the other buffer,
 * waits for this one and makes it every thread's; returns this pair's K (V follows it) */
template <int D, typename T>
__device__ const T *kv_stage(T *base, const T *kh, const T *vh, const ct_cuda_attn_views &V, int64_t k0, int64_t it,
                             int64_t kend, int64_t n) {
    constexpr int L = ldt<D>();
    if (k0 + BM < kend)
        fetch2<D>(base + (3 - 2 * it) * BM * L, kh, V.k.row, base + (4 - 2 * it) * BM * L, vh, V.v.row, k0 + BM, n);
    wait_for_tile(k0 + BM < kend);
    __syncthreads();
    return base + (1 + 2 * it) * BM * L;
}
/* two neighbouring elements of row r of a head's [n, D] output (n checked by the caller) */
template <typename T> __device__ void store2(T *p, float a, float b) {
    if ((uintptr_t)p % 4 == 0) {
        *(uint32_t *)p = ct_pack2(a, b, (T *)nullptr);
        return;
    }
    ct_attn_put(p, a);
    ct_attn_put(p + 1, b);
}
/* P or dS (two neighbouring 8-column C tiles, j and j + 1) as the A operand of k = 16 */
template <typename T> __device__ void as_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = ct_pack2(c0[0], c0[1], (T *)nullptr);
    a[1] = ct_pack2(c0[2], c0[3], (T *)nullptr);
    a[2] = ct_pack2(c1[0], c1[1], (T *)nullptr);
    a[3] = ct_pack2(c1[2], c1[3], (T *)nullptr);
}
/* c[8] (16 x 64: the warp's 16 rows against 64 rows of Bs) += A Bs^T over k = 16 kk..16 kk + 15,
 * A's fragment af in registers */
template <int D, typename T> __device__ __forceinline__ void mm_abt(float (&c)[8][4], const uint32_t (&af)[4], const T *Bs, int kk) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int np = 0; np < 4; np++) {
        uint32_t b[4];
        ct_ldsm_x4(b, Bs + np * 16 * ldt<D>() + ct_mma_bn_at(lane, ldt<D>()) + kk * 16);
        ct_mma16816<T>(c[2 * np], af, b[0], b[1]);
        ct_mma16816<T>(c[2 * np + 1], af, b[2], b[3]);
    }
}
/* the same over all of D, A the warp's 16 rows of a shared tile As */
template <int D, typename T> __device__ __forceinline__ void mm_abt_s(float (&c)[8][4], const T *As, const T *Bs) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t af[4];
        ct_ldsm_x4(af, As + ct_mma_a_at(lane, ldt<D>()) + kk * 16);
        mm_abt<D, T>(c, af, Bs, kk);
    }
}
/* acc[D / 8] (16 x D) += P (16 x 64, C fragments p[8], rounded) Bs (64 x D, a shared tile) */
template <int D, typename T> __device__ __forceinline__ void mm_pb(float (&acc)[D / 8][4], const float (&p)[8][4], const T *Bs) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        as_a<T>(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t b[4];
            ct_ldsm_x4_t(b, Bs + kk * 16 * ldt<D>() + ct_mma_bt_at(lane, ldt<D>()) + dp * 16);
            ct_mma16816<T>(acc[2 * dp], a, b[0], b[1]);
            ct_mma16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}
template <int N> __device__ void zero(float (&c)[N][4]) {
    for (int j = 0; j < N; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
}
/* the warp's 16 x D result (rows r0 + g and r0 + g + 8) to a head's rows (stride ld), rows past n
 * skipped */
template <int D, typename T>
__device__ void store_rows(T *out, int64_t ld, const float (&acc)[D / 8][4], int64_t r0, int64_t n, float s0, float s1) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        if (r0 + g < n) store2(&out[(r0 + g) * ld + j * 8 + 2 * t], acc[j][0] * s0, acc[j][1] * s0);
        if (r0 + g + 8 < n) store2(&out[(r0 + g + 8) * ld + j * 8 + 2 * t], acc[j][2] * s1, acc[j][3] * s1);
    }
}
/* the column (key, or query in dK/dV) of element e of C tile j, as an offset in the tile */
__device__ __forceinline__ int col_of(int j, int e) { return j * 8 + 2 * (threadIdx.x % 4) + e % 2; }

/* S scaled to log2 units in place, -inf where masked (MASK: only the tiles that cross the
 * diagonal or the end of the keys), and this lane's max of each of its rows r[2] */
template <bool MASK>
__device__ __forceinline__ void scale_mask(float (&s)[8][4], float (&mt)[2], const int64_t (&r)[2], int64_t k0, int64_t n, bool causal,
                                           float sl2) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t kj = k0 + col_of(j, e);
            s[j][e] = !MASK || (kj < n && (!causal || kj <= r[e / 2])) ? s[j][e] * sl2 : -INFINITY;
            mt[e / 2] = fmaxf(mt[e / 2], s[j][e]);
        }
    }
}

template <int D, typename T>
__global__ void __launch_bounds__(NT, 3) fwd_k(const T *q, const T *k, const T *v, T *o, float *lse, int64_t n, bool causal,
                                               float sc, ct_cuda_attn_views V) {
    extern __shared__ float sm[];
    constexpr int L = ldt<D>();
    T *Qs = (T *)sm; /* then K, V of the even tiles, K, V of the odd ones */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = blockIdx.y, q0 = (int64_t)blockIdx.x * BM;
    const T *kh = k + kv_head_at(V.k, bh, V), *vh = v + kv_head_at(V.v, bh, V); /* this query head's key/value head */
    const int64_t row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    const float sl2 = sc * LOG2E;
    const int64_t kend = causal ? (q0 + BM < n ? q0 + BM : n) : n;
    load<D>(Qs, q + head_at(V.q, bh, V.H), V.q.row, q0, n);
    fetch2<D>(Qs + BM * L, kh, V.k.row, Qs + 2 * BM * L, vh, V.v.row, 0, n);
    __syncthreads();
    uint32_t qa[D / 16][4]; /* the warp's 16 query rows, kept as A fragments */
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ct_ldsm_x4(qa[kk], Qs + warp * 16 * L + ct_mma_a_at(lane, L) + kk * 16);
    float oacc[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero(oacc);
    for (int64_t k0 = 0, it = 0; k0 < kend; k0 += BM, it ^= 1) {
        const T *Ks = kv_stage<D>(Qs, kh, vh, V, k0, it, kend, n), *Vs = Ks + BM * L;
        float s[8][4];
        zero(s);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) mm_abt<D, T>(s, qa[kk], Ks, kk); /* S = Q K^T */
        /* scaled to log2 units and masked; each row's max over the tile, within the group of four
         * lanes that hold the row */
        float mt[2] = {-INFINITY, -INFINITY};
        /* the mask only where the tile crosses the diagonal or the end of the keys for this warp */
        const bool edge = k0 + BM > n || (causal && k0 + BM - 1 > q0 + warp * 16);
        if (edge) scale_mask<true>(s, mt, row, k0, n, causal, sl2);
        else scale_mask<false>(s, mt, row, k0, n, causal, sl2);
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
            const float mn = fmaxf(m[h], mt[h]);
            alpha[h] = m[h] == -INFINITY ? 0.0f : exp2f(m[h] - mn);
            m[h] = mn;
            l[h] *= alpha[h]; /* this lane's part of the row sum; the four parts meet at the end */
        }
        const float mz[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]}; /* a row with no key yet */
#pragma unroll
        for (int j = 0; j < D / 8; j++) oacc[j][0] *= alpha[0], oacc[j][1] *= alpha[0], oacc[j][2] *= alpha[1], oacc[j][3] *= alpha[1];
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[j][e] - mz[e / 2]); /* exp2(-inf) = 0 */
                l[e / 2] += p;
                s[j][e] = p;
            }
        }
        mm_pb<D, T>(oacc, s, Vs); /* O += P V */
        __syncthreads(); /* every warp is done with Ks, Vs before the next fetch refills them */
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    store_rows<D>(o + head_at(V.o, bh, V.H), V.o.row, oacc, q0 + warp * 16, n, l[0] > 0 ? 1.0f / l[0] : 0.0f,
                  l[1] > 0 ? 1.0f / l[1] : 0.0f);
    if (lane % 4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (row[h] < n) lse[bh * n + row[h]] = m[h] * LN2 + logf(l[h]); /* ct_k_attn_lse, natural units */
    }
}

/* P and dS in place over the warp's 16 x 64 tile pair (s: S, then P; dp: dP, then dS): this lane's
 * rows r[2], columns c0 + col_of(j, e). With KEY_ROWS the rows are keys and each column's lse
 * and dr come from the tile's rows lse_c, dr_c (dK/dV), else the rows are queries with their
 * own lse_r, dr_r (dQ). lse in log2 units; P is 0 where masked (MASK: only the tiles that cross
 * the diagonal or an end) */
template <bool KEY_ROWS, bool MASK>
__device__ __forceinline__ void p_ds(float (&s)[8][4], float (&dp)[8][4], const int64_t (&r)[2], int64_t c0, int64_t n, bool causal,
                                     float sl2, float sc, const float *lse_c, const float *dr_c, const float (&lse_r)[2],
                                     const float (&dr_r)[2]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int c = col_of(j, e);
            const int64_t qi = KEY_ROWS ? c0 + c : r[e / 2], kj = KEY_ROWS ? r[e / 2] : c0 + c;
            const bool visible = !MASK || (qi < n && kj < n && (!causal || kj <= qi));
            const float p = visible ? exp2f(s[j][e] * sl2 - (KEY_ROWS ? lse_c[c] : lse_r[e / 2])) : 0.0f;
            dp[j][e] = p * (dp[j][e] - (KEY_ROWS ? dr_c[c] : dr_r[e / 2])) * sc; /* ct_k_attn_ds */
            s[j][e] = p;
        }
    }
}
template <bool KEY_ROWS>
__device__ __forceinline__ void p_ds_tile(bool edge, float (&s)[8][4], float (&dp)[8][4], const int64_t (&r)[2], int64_t c0, int64_t n,
                                     bool causal, float sl2, float sc, const float *lse_c, const float *dr_c, const float (&lse_r)[2],
                                     const float (&dr_r)[2]) {
    if (edge) p_ds<KEY_ROWS, true>(s, dp, r, c0, n, causal, sl2, sc, lse_c, dr_c, lse_r, dr_r);
    else p_ds<KEY_ROWS, false>(s, dp, r, c0, n, causal, sl2, sc, lse_c, dr_c, lse_r, dr_r);
}

template <int D, typename T>
__global__ void __launch_bounds__(NT, 2) dkv_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr,
                                               T *dk, T *dv, int64_t n, bool causal, float sc, ct_cuda_attn_views V) {
    extern __shared__ float sm[];
    constexpr int L = ldt<D>();
    T *Ks = (T *)sm, *Vs = Ks + BM * L; /* then Q, dO of the even tiles, Q, dO of the odd ones */
    float *rows = (float *)(Vs + 5 * BM * L); /* lse, dr of the even tiles, of the odd ones */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = blockIdx.y, k0 = (int64_t)blockIdx.x * BM;
    const T *qh = q + head_at(V.q, h, V.H), *gh = g + head_at(V.dO, h, V.H);
    const int64_t key[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};
    const float sl2 = sc * LOG2E;
    load<D>(Ks, k + kv_head_at(V.k, h, V), V.k.row, k0, n); /* this query head's key/value head */
    load<D>(Vs, v + kv_head_at(V.v, h, V), V.v.row, k0, n);
    float akk[D / 8][4], avv[D / 8][4];
    zero(akk);
    zero(avv);
    const T *Kw = Ks + warp * 16 * L, *Vw = Vs + warp * 16 * L;
    /* the query tile at t0 into buffer b: Q and dO fetched, lse (log2 units) and dr stored */
    auto fetch = [&](int64_t t0, int b) {
        fetch2<D>(Vs + (1 + 2 * b) * BM * L, qh, V.q.row, Vs + (2 + 2 * b) * BM * L, gh, V.dO.row, t0, n);
        for (int r = threadIdx.x; r < BM; r += NT) {
            rows[2 * b * BM + r] = t0 + r < n ? lse[h * n + t0 + r] * LOG2E : 0.0f;
            rows[(2 * b + 1) * BM + r] = t0 + r < n ? dr[h * n + t0 + r] : 0.0f;
        }
    };
    const int64_t qstart = causal ? k0 : 0;
    fetch(qstart, 0);
    for (int64_t q0 = qstart, it = 0; q0 < n; q0 += BM, it ^= 1) {
        const T *Qs = Vs + (1 + 2 * it) * BM * L, *Gs = Qs + BM * L;
        const float *lse_t = rows + 2 * it * BM, *dr_t = lse_t + BM;
        if (q0 + BM < n) fetch(q0 + BM, (int)it ^ 1);
        wait_for_tile(q0 + BM < n);
        __syncthreads();
        float s[8][4], dp[8][4]; /* S^T and dP^T: the warp's 16 keys x 64 queries */
        zero(s);
        zero(dp);
        mm_abt_s<D, T>(s, Kw, Qs);  /* S^T = K Q^T */
        mm_abt_s<D, T>(dp, Vw, Gs); /* dP^T = V dO^T */
        /* the mask only where the tile crosses the diagonal or an end for this warp's keys */
        const bool edge = q0 + BM > n || k0 + warp * 16 + 16 > n || (causal && q0 < k0 + warp * 16 + 15);
        const float none[2] = {0.0f, 0.0f};
        p_ds_tile<true>(edge, s, dp, key, q0, n, causal, sl2, sc, lse_t, dr_t, none, none);
        mm_pb<D, T>(avv, s, Gs);  /* dV += P^T dO */
        mm_pb<D, T>(akk, dp, Qs); /* dK += dS^T Q */
        __syncthreads(); /* every warp is done with this buffer before the next fetch refills it */
    }
    store_rows<D>(dk + head_at(V.dk, h, V.H), V.dk.row, akk, k0 + warp * 16, n, 1.0f, 1.0f);
    store_rows<D>(dv + head_at(V.dv, h, V.H), V.dv.row, avv, k0 + warp * 16, n, 1.0f, 1.0f);
}

template <int D, typename T>
__global__ void __launch_bounds__(NT, 2) dq_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr,
                                              T *dq, int64_t n, bool causal, float sc, ct_cuda_attn_views V) {
    extern __shared__ float sm[];
    constexpr int L = ldt<D>();
    T *Qs = (T *)sm, *Gs = Qs + BM * L; /* then K, V of the even tiles, K, V of the odd ones */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = blockIdx.y, q0 = (int64_t)blockIdx.x * BM;
    const T *kh = k + kv_head_at(V.k, h, V), *vh = v + kv_head_at(V.v, h, V); /* this query head's key/value head */
    const int64_t row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    const float sl2 = sc * LOG2E;
    float lse2[2], drr[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lse2[i] = row[i] < n ? lse[h * n + row[i]] * LOG2E : 0.0f;
        drr[i] = row[i] < n ? dr[h * n + row[i]] : 0.0f;
    }
    const int64_t kend = causal ? (q0 + BM < n ? q0 + BM : n) : n;
    load<D>(Qs, q + head_at(V.q, h, V.H), V.q.row, q0, n);
    load<D>(Gs, g + head_at(V.dO, h, V.H), V.dO.row, q0, n);
    fetch2<D>(Gs + BM * L, kh, V.k.row, Gs + 2 * BM * L, vh, V.v.row, 0, n);
    __syncthreads();
    uint32_t qa[D / 16][4], ga[D / 16][4]; /* the warp's 16 rows of Q and dO, kept as A fragments */
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        ct_ldsm_x4(qa[kk], Qs + warp * 16 * L + ct_mma_a_at(lane, L) + kk * 16);
        ct_ldsm_x4(ga[kk], Gs + warp * 16 * L + ct_mma_a_at(lane, L) + kk * 16);
    }
    float aq[D / 8][4];
    zero(aq);
    for (int64_t k0 = 0, it = 0; k0 < kend; k0 += BM, it ^= 1) {
        const T *Ks = kv_stage<D>(Gs, kh, vh, V, k0, it, kend, n), *Vs = Ks + BM * L;
        float s[8][4], dp[8][4];
        zero(s);
        zero(dp);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            mm_abt<D, T>(s, qa[kk], Ks, kk);  /* S = Q K^T */
            mm_abt<D, T>(dp, ga[kk], Vs, kk); /* dP = dO V^T */
        }
        /* the mask only where the tile crosses the diagonal or an end for this warp's rows */
        const bool edge = k0 + BM > n || q0 + warp * 16 + 16 > n || (causal && k0 + BM - 1 > q0 + warp * 16);
        p_ds_tile<false>(edge, s, dp, row, k0, n, causal, sl2, sc, nullptr, nullptr, lse2, drr);
        mm_pb<D, T>(aq, dp, Ks); /* dQ += dS K */
        __syncthreads(); /* every warp is done with Ks, Vs before the next fetch refills them */
    }
    store_rows<D>(dq + head_at(V.dq, h, V.H), V.dq.row, aq, q0 + warp * 16, n, 1.0f, 1.0f);
}

__device__ __forceinline__ float wide(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float wide(__half x) { return __half2float(x); }
/* dr[row] = sum_d dO[row, d] O[row, d] (FlashAttention's D) for every row of the B * H heads, a
 * thread a row, summed in d order as attention.cu's dr_k: the same bits as the contiguous path */
template <typename T> __global__ void dr_k(const T *o, const T *g, float *dr, int64_t rows, int64_t n, int D, ct_cuda_attn_views V) {
    CT_GRID_STRIDE(r, rows) {
        const int64_t bh = r / n, t = r % n;
        const T *orow = o + head_at(V.o, bh, V.H) + t * V.o.row, *grow = g + head_at(V.dO, bh, V.H) + t * V.dO.row;
        float s = 0.0f;
        for (int c = 0; c < D; c++) s = fmaf(wide(grow[c]), wide(orow[c]), s);
        dr[r] = s;
    }
}

/* shared bytes: `t16` 16-bit tiles of 64 x D at the padded stride, `rows` f32 rows of 64 */
template <int D> constexpr size_t smem(int t16, int rows) { return 2 * (size_t)BM * ldt<D>() * t16 + 4 * (size_t)BM * rows; }
template <int D, typename T>
ct_status fwd(cudaStream_t s, const void *q, const void *k, const void *v, void *o, float *lse, int64_t BH, int64_t n, bool causal,
              const ct_cuda_attn_views &V) {
    const size_t sm = smem<D>(5, 0);
    ct_status st = ct_attn_allow_smem(fwd_k<D, T>, sm, "attention");
    if (st != CT_OK) return st;
    const dim3 grid((unsigned)((n + BM - 1) / BM), (unsigned)BH);
    fwd_k<D, T><<<grid, NT, sm, s>>>((const T *)q, (const T *)k, (const T *)v, (T *)o, lse, n, causal, 1.0f / sqrtf((float)D), V);
    CT_LAUNCHED("attention");
    return CT_OK;
}
template <int D, typename T>
ct_status bwd(cudaStream_t s, const void *q, const void *k, const void *v, const void *g, const float *lse, const float *dr, void *dq,
              void *dk, void *dv, int64_t BH, int64_t n, bool causal, const ct_cuda_attn_views &V) {
    const size_t skv = smem<D>(6, 4), sq = smem<D>(6, 0);
    ct_status st = ct_attn_allow_smem(dkv_k<D, T>, skv, "attention backward");
    if (st == CT_OK) st = ct_attn_allow_smem(dq_k<D, T>, sq, "attention backward");
    if (st != CT_OK) return st;
    const dim3 grid((unsigned)((n + BM - 1) / BM), (unsigned)BH);
    const float sc = 1.0f / sqrtf((float)D);
    dkv_k<D, T><<<grid, NT, skv, s>>>((const T *)q, (const T *)k, (const T *)v, (const T *)g, lse, dr, (T *)dk, (T *)dv, n, causal,
                                      sc, V);
    dq_k<D, T><<<grid, NT, sq, s>>>((const T *)q, (const T *)k, (const T *)v, (const T *)g, lse, dr, (T *)dq, n, causal, sc, V);
    CT_LAUNCHED("attention backward");
    return CT_OK;
}
template <typename T>
ct_status fwd_d(cudaStream_t s, const void *q, const void *k, const void *v, void *o, float *lse, int64_t BH, int64_t n, int D,
                bool causal, const ct_cuda_attn_views &V) {
    return D == 64 ? fwd<64, T>(s, q, k, v, o, lse, BH, n, causal, V) : fwd<32, T>(s, q, k, v, o, lse, BH, n, causal, V);
}
template <typename T>
ct_status bwd_d(cudaStream_t s, const void *q, const void *k, const void *v, const void *g, const float *lse, const float *dr,
                void *dq, void *dk, void *dv, int64_t BH, int64_t n, int D, bool causal, const ct_cuda_attn_views &V) {
    return D == 64 ? bwd<64, T>(s, q, k, v, g, lse, dr, dq, dk, dv, BH, n, causal, V)
                   : bwd<32, T>(s, q, k, v, g, lse, dr, dq, dk, dv, BH, n, causal, V);
}
/* contiguous [BH, n, D] q, o, dO, dq, dk, dv and [BH / G, n, D] k, v */
ct_cuda_attn_views contiguous(int64_t BH, int64_t n, int D, int64_t G) {
    const ct_cuda_attn_view h = {BH * n * D, n * D, D};
    return ct_cuda_attn_views{h, h, h, h, h, h, h, h, BH, G};
}
} // namespace

bool ct_cuda_attention_mma_fits(ct_cuda_dtype dt, int D) { return dt != CT_CUDA_F32 && (D == 32 || D == 64); }

ct_status ct_cuda_attention_mma(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o, float *lse,
                                int64_t BH, int64_t T, int D, bool causal, int64_t G) {
    const ct_cuda_attn_views V = contiguous(BH, T, D, G);
    return dt == CT_CUDA_BF16 ? fwd_d<__nv_bfloat16>(s, q, k, v, o, lse, BH, T, D, causal, V)
                              : fwd_d<__half>(s, q, k, v, o, lse, BH, T, D, causal, V);
}
ct_status ct_cuda_attention_mma_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, const void *dO,
                                    const float *lse, const float *dr, void *dq, void *dk, void *dv, int64_t BH, int64_t T, int D,
                                    bool causal, int64_t G) {
    const ct_cuda_attn_views V = contiguous(BH, T, D, G);
    return dt == CT_CUDA_BF16 ? bwd_d<__nv_bfloat16>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, V)
                              : bwd_d<__half>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, V);
}

extern "C" {
ct_status ct_cuda_attention_views(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                                  float *lse, int64_t BH, int64_t T, int D, bool causal, const ct_cuda_attn_views *V) {
    if (!ct_cuda_attention_views_fit(dt, D) || V->H < 1 || V->G < 1 || V->H % V->G || BH % V->H)
        return ct_error(CT_ERR_INVALID, "cuda attention on strided heads: %s, head dim %d, %lld heads of %lld in groups of %lld",
                        dt == CT_CUDA_F32 ? "f32" : "16-bit", D, (long long)BH, (long long)V->H, (long long)V->G);
    if (BH == 0 || T == 0) return CT_OK;
    return dt == CT_CUDA_BF16 ? fwd_d<__nv_bfloat16>(s, q, k, v, o, lse, BH, T, D, causal, *V)
                              : fwd_d<__half>(s, q, k, v, o, lse, BH, T, D, causal, *V);
}
ct_status ct_cuda_attention_views_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                      const void *o, const void *dO, const float *lse, float *dr, void *dq, void *dk, void *dv,
                                      int64_t BH, int64_t T, int D, bool causal, const ct_cuda_attn_views *V) {
    if (!ct_cuda_attention_views_fit(dt, D) || V->H < 1 || V->G < 1 || V->H % V->G || BH % V->H)
        return ct_error(CT_ERR_INVALID, "cuda attention backward on strided heads: %s, head dim %d, %lld heads of %lld in groups of %lld",
                        dt == CT_CUDA_F32 ? "f32" : "16-bit", D, (long long)BH, (long long)V->H, (long long)V->G);
    if (BH == 0 || T == 0) return CT_OK;
    const int64_t rows = BH * T;
    if (dt == CT_CUDA_BF16)
        dr_k<__nv_bfloat16><<<ct_grid(rows, 256), 256, 0, s>>>((const __nv_bfloat16 *)o, (const __nv_bfloat16 *)dO, dr, rows, T, D, *V);
    else dr_k<__half><<<ct_grid(rows, 256), 256, 0, s>>>((const __half *)o, (const __half *)dO, dr, rows, T, D, *V);
    CT_LAUNCHED("attention backward");
    return dt == CT_CUDA_BF16 ? bwd_d<__nv_bfloat16>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, *V)
                              : bwd_d<__half>(s, q, k, v, dO, lse, dr, dq, dk, dv, BH, T, D, causal, *V);
}
}
