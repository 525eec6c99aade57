/* The tiled flash attention kernels themselves (attention_tiled.cu has the algorithm's notes
 * and the launches). Included inside an anonymous namespace after BR, NT and ld()/st() for
 * each element type are declared: by attention_tiled.cu for the GPU, and by
 * tests/tools/cuda_emu_attention.cc, which runs them on the CPU with one thread per CUDA
 * thread to check their indexing against the CPU op where no GPU is. Uses only kmath.h. */
#ifndef CT_CUDA_ATTENTION_TILED_KERNELS_CUH
#define CT_CUDA_ATTENTION_TILED_KERNELS_CUH

/* rows [r0, r0 + 64) of a head's [T, D] matrix into a tile of leading dimension D + 1
 * (rows past T as zeros) */
template <int D, typename T> __device__ void load_tile(float *s, const T *g, int64_t r0, int64_t n) {
    for (int e = threadIdx.x; e < BR * D; e += NT) {
        int r = e / D, c = e % D;
        s[r * (D + 1) + c] = r0 + r < n ? ld(g[(r0 + r) * D + c]) : 0.0f;
    }
}

/* the head's lse and Dr of queries [q0, q0 + 64) (0 past T) */
__device__ void load_rows(float *lse_t, float *dr_t, const float *lse, const float *dr, int64_t q0, int64_t n) {
    if (threadIdx.x < BR) {
        int64_t qi = q0 + threadIdx.x;
        lse_t[threadIdx.x] = qi < n ? lse[qi] : 0.0f;
        dr_t[threadIdx.x] = qi < n ? dr[qi] : 0.0f;
    }
}

/* acc[i][j] += sum_k A(ty + 16 i, k) B(tx + 16 j, k), with A(r, k) at A[r * ar + k * ak] and
 * B(c, k) at B[c * bc + k * bk] in shared memory */
template <int K, int NJ>
__device__ __forceinline__ void mm(float (&acc)[4][NJ], const float *A, int ar, int ak, const float *B, int bc, int bk) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll 8
    for (int k = 0; k < K; k++) {
        float a[4], b[NJ];
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = A[(ty + 16 * i) * ar + k * ak];
#pragma unroll
        for (int j = 0; j < NJ; j++) b[j] = B[(tx + 16 * j) * bc + k * bk];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < NJ; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}
template <int NJ> __device__ __forceinline__ void zero(float (&a)[4][NJ]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++) a[i][j] = 0.0f;
}
/* max and sum over the 16 lanes that hold one row (same ty: a half warp) */
__device__ __forceinline__ float row_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float row_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int D, typename T>
__global__ void __launch_bounds__(NT) fwd_k(const T *q, const T *k, const T *v, T *o, float *lse, int64_t n, bool causal,
                                            float sc, int64_t G) {
    extern __shared__ float sm[];
    const int L = D + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float *Qs = sm, *KV = Qs + BR * L, *Ss = KV + BR * L;
    const int64_t base = (int64_t)blockIdx.y * n * D, q0 = (int64_t)blockIdx.x * BR;
    const int64_t kb = (int64_t)blockIdx.y / G * n * D; /* the key/value head of this query head */
    load_tile<D>(Qs, q + base, q0, n);
    float acc[4][D / 16], m[4], l[4];
    zero(acc);
    for (int i = 0; i < 4; i++) m[i] = -INFINITY, l[i] = 0.0f;
    const int64_t kend = causal ? (q0 + BR < n ? q0 + BR : n) : n;
    for (int64_t k0 = 0; k0 < kend; k0 += BR) {
        __syncthreads(); /* the previous tile's P V is done with KV and Ss */
        load_tile<D>(KV, k + kb, k0, n);
        __syncthreads();
        float s[4][4];
        zero(s);
        mm<D, 4>(s, Qs, L, 1, KV, L, 1);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t qi = q0 + ty + 16 * i;
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t kj = k0 + tx + 16 * j;
                s[i][j] = kj < n && (!causal || kj <= qi) ? s[i][j] * sc : -INFINITY;
                mt = fmaxf(mt, s[i][j]);
            }
            float alpha = ct_k_attn_rescale(&m[i], &l[i], row_max(mt)), ps = 0.0f;
#pragma unroll
            for (int j = 0; j < D / 16; j++) acc[i][j] *= alpha;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p = ct_vexpf(s[i][j] - m[i]);
                ps += p;
                Ss[(ty + 16 * i) * (BR + 1) + tx + 16 * j] = p;
            }
            l[i] += row_sum(ps);
        }
        __syncthreads(); /* S read from KV: now V may replace K */
        load_tile<D>(KV, v + kb, k0, n);
        __syncthreads();
        mm<BR, D / 16>(acc, Ss, BR + 1, 1, KV, 1, L);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t qi = q0 + ty + 16 * i;
        if (qi >= n) continue;
        float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
#pragma unroll
        for (int j = 0; j < D / 16; j++) st(&o[base + qi * D + tx + 16 * j], acc[i][j] * inv);
        if (tx == 0) lse[(int64_t)blockIdx.y * n + qi] = ct_k_attn_lse(m[i], l[i]);
    }
}

/* P and dS of one (rows x cols) tile pair, written to Ps / Ds: rows are what the block owns
 * (queries for dQ, keys for dK/dV), `rows_are_q` says which; s and dp hold the raw products */
__device__ __forceinline__ void p_ds(float (&s)[4][4], float (&dp)[4][4], const float *lse_t, const float *dr_t, int64_t r0,
                                     int64_t c0, int64_t n, bool causal, bool rows_are_q, float sc, float *Ps, float *Ds) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int ri = ty + 16 * i, cj = tx + 16 * j;
            const int64_t qi = rows_are_q ? r0 + ri : c0 + cj, kj = rows_are_q ? c0 + cj : r0 + ri;
            const int qt = rows_are_q ? ri : cj; /* the query's index in its tile (lse_t, dr_t) */
            float p = qi < n && kj < n && (!causal || kj <= qi) ? ct_vexpf(s[i][j] * sc - lse_t[qt]) : 0.0f;
            if (Ps) Ps[ri * (BR + 1) + cj] = p;
            Ds[ri * (BR + 1) + cj] = ct_k_attn_ds(p, dp[i][j], dr_t[qt], sc);
        }
}

template <int D, typename T>
__global__ void __launch_bounds__(NT) dkv_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr,
                                            T *dk, T *dv, int64_t n, bool causal, float sc, int64_t G) {
    extern __shared__ float sm[];
    const int L = D + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float *Ks = sm, *Vs = Ks + BR * L, *Qs = Vs + BR * L, *Gs = Qs + BR * L, *Ps = Gs + BR * L, *Ds = Ps + BR * (BR + 1);
    float *lse_t = Ds + BR * (BR + 1), *dr_t = lse_t + BR;
    const int64_t h = blockIdx.y, base = h * n * D, k0 = (int64_t)blockIdx.x * BR;
    const int64_t kb = (int64_t)blockIdx.y / G * n * D; /* the key/value head of this query head */
    load_tile<D>(Ks, k + kb, k0, n);
    load_tile<D>(Vs, v + kb, k0, n);
    float ak[4][D / 16], av[4][D / 16];
    zero(ak);
    zero(av);
    for (int64_t q0 = causal ? k0 : 0; q0 < n; q0 += BR) {
        __syncthreads(); /* the previous tile's products are done with Qs, Gs, Ps, Ds */
        load_tile<D>(Qs, q + base, q0, n);
        load_tile<D>(Gs, g + base, q0, n);
        load_rows(lse_t, dr_t, lse + h * n, dr + h * n, q0, n);
        __syncthreads();
        float s[4][4], dp[4][4];
        zero(s);
        zero(dp);
        mm<D, 4>(s, Ks, L, 1, Qs, L, 1);  /* S^T: keys x queries */
        mm<D, 4>(dp, Vs, L, 1, Gs, L, 1); /* dP^T = V dO^T */
        p_ds(s, dp, lse_t, dr_t, k0, q0, n, causal, false, sc, Ps, Ds);
        __syncthreads();
        mm<BR, D / 16>(av, Ps, BR + 1, 1, Gs, 1, L); /* dV += P^T dO */
        mm<BR, D / 16>(ak, Ds, BR + 1, 1, Qs, 1, L); /* dK += dS^T Q */
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t kj = k0 + ty + 16 * i;
        if (kj >= n) continue;
#pragma unroll
        for (int j = 0; j < D / 16; j++) {
            st(&dk[base + kj * D + tx + 16 * j], ak[i][j]);
            st(&dv[base + kj * D + tx + 16 * j], av[i][j]);
        }
    }
}

template <int D, typename T>
__global__ void __launch_bounds__(NT) dq_k(const T *q, const T *k, const T *v, const T *g, const float *lse, const float *dr,
                                           T *dq, int64_t n, bool causal, float sc, int64_t G) {
    extern __shared__ float sm[];
    const int L = D + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float *Qs = sm, *Gs = Qs + BR * L, *Ks = Gs + BR * L, *Vs = Ks + BR * L, *Ds = Vs + BR * L;
    float *lse_t = Ds + BR * (BR + 1), *dr_t = lse_t + BR;
    const int64_t h = blockIdx.y, base = h * n * D, q0 = (int64_t)blockIdx.x * BR;
    const int64_t kb = (int64_t)blockIdx.y / G * n * D; /* the key/value head of this query head */
    load_tile<D>(Qs, q + base, q0, n);
    load_tile<D>(Gs, g + base, q0, n);
    load_rows(lse_t, dr_t, lse + h * n, dr + h * n, q0, n);
    float aq[4][D / 16];
    zero(aq);
    const int64_t kend = causal ? (q0 + BR < n ? q0 + BR : n) : n;
    for (int64_t k0 = 0; k0 < kend; k0 += BR) {
        __syncthreads();
        load_tile<D>(Ks, k + kb, k0, n);
        load_tile<D>(Vs, v + kb, k0, n);
        __syncthreads();
        float s[4][4], dp[4][4];
        zero(s);
        zero(dp);
        mm<D, 4>(s, Qs, L, 1, Ks, L, 1);  /* S: queries x keys */
        mm<D, 4>(dp, Gs, L, 1, Vs, L, 1); /* dP = dO V^T */
        p_ds(s, dp, lse_t, dr_t, q0, k0, n, causal, true, sc, NULL, Ds);
        __syncthreads();
        mm<BR, D / 16>(aq, Ds, BR + 1, 1, Ks, 1, L); /* dQ += dS K */
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t qi = q0 + ty + 16 * i;
        if (qi >= n) continue;
#pragma unroll
        for (int j = 0; j < D / 16; j++) st(&dq[base + qi * D + tx + 16 * j], aq[i][j]);
    }
}

#endif
