// The tiled flash attention kernels (src/cuda/attention_tiled_kernels.cuh) run on the CPU:
// each CUDA thread of a block is a host thread, __syncthreads a barrier, a warp shuffle a
// write to shared slots between two barriers; blocks run one after another. Checks the
// kernels' tiling, masking and indexing against the row functions of ops/kmath.h (which
// tests/unit/test_kmath.c checks against the CPU op) where no GPU is. f32 only; the bf16
// instances differ in their loads and stores alone.
//
//   cuda_emu_attention T D causal     prints the normwise errors; exit 1 above 1e-5
#include <pthread.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ops/kmath.h"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__

namespace {
struct emu_dim {
    unsigned x, y, z;
};
thread_local emu_dim threadIdx;
emu_dim blockIdx;
pthread_barrier_t bar;
float slot[256];
void __syncthreads() { pthread_barrier_wait(&bar); }
// every thread of the block takes part in each shuffle (the kernels call them uniformly)
float __shfl_xor_sync(unsigned, float v, int o) {
    slot[threadIdx.x] = v;
    __syncthreads();
    float r = slot[threadIdx.x ^ (unsigned)o];
    __syncthreads();
    return r;
}
float sm[64 * 1024]; // the blocks' dynamic shared memory ("extern __shared__ float sm[]")

enum { BR = 64, NT = 256 };
inline float ld(float x) { return x; }
inline void st(float *p, float x) { *p = x; }

#include "cuda/attention_tiled_kernels.cuh"

template <typename F> void launch(unsigned gx, unsigned gy, F kernel) {
    for (unsigned y = 0; y < gy; y++)
        for (unsigned x = 0; x < gx; x++) {
            blockIdx = {x, y, 0};
            std::vector<std::thread> th;
            for (unsigned t = 0; t < NT; t++)
                th.emplace_back([t, &kernel] {
                    threadIdx = {t, 0, 0};
                    kernel();
                });
            for (auto &t : th) t.join();
        }
}

double normwise(const std::vector<float> &a, const std::vector<float> &b) {
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); i++) d += (double)(a[i] - b[i]) * (a[i] - b[i]), n += (double)b[i] * b[i];
    return std::sqrt(d / (n > 0 ? n : 1));
}

template <int D> int run(int64_t T, bool causal) {
    const int64_t BH = 2, n = BH * T * D;
    std::vector<float> q(n), k(n), v(n), g(n);
    uint64_t r = 12345;
    auto rnd = [&r] {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((r >> 40) / 16777216.0 * 2 - 1);
    };
    for (int64_t i = 0; i < n; i++) q[i] = 2 * rnd(), k[i] = 2 * rnd(), v[i] = rnd(), g[i] = rnd();
    const float sc = 1.0f / std::sqrt((float)D);
    // reference: the row functions, one row at a time
    std::vector<float> o_r(n), lse_r(BH * T), dr(BH * T), dq_r(n), dk_r(n), dv_r(n);
    for (int64_t h = 0; h < BH; h++) {
        const float *Q = &q[h * T * D], *K = &k[h * T * D], *V = &v[h * T * D], *G = &g[h * T * D];
        for (int64_t i = 0; i < T; i++) {
            ct_k_attn_fwd_row_f32(Q + i * D, K, V, causal ? i + 1 : T, D, D, sc, &o_r[(h * T + i) * D], &lse_r[h * T + i]);
            float s = 0;
            for (int c = 0; c < D; c++) s = fmaf(G[i * D + c], o_r[(h * T + i) * D + c], s);
            dr[h * T + i] = s;
        }
        for (int64_t i = 0; i < T; i++)
            ct_k_attn_dq_row_f32(Q + i * D, G + i * D, K, V, causal ? i + 1 : T, D, D, sc, lse_r[h * T + i], dr[h * T + i],
                                 &dq_r[(h * T + i) * D]);
        for (int64_t j = 0; j < T; j++)
            ct_k_attn_dkv_row_f32(K + j * D, V + j * D, Q, G, &lse_r[h * T], &dr[h * T], causal ? j : 0, T, D, D, sc,
                                  &dk_r[(h * T + j) * D], &dv_r[(h * T + j) * D]);
    }
    // the tiled kernels, emulated
    std::vector<float> o(n), lse(BH * T), dq(n), dk(n), dv(n);
    const unsigned gx = (unsigned)((T + BR - 1) / BR), gy = (unsigned)BH;
    launch(gx, gy, [&] { fwd_k<D, float>(q.data(), k.data(), v.data(), o.data(), lse.data(), T, causal, sc, 1); });
    launch(gx, gy, [&] {
        dkv_k<D, float>(q.data(), k.data(), v.data(), g.data(), lse_r.data(), dr.data(), dk.data(), dv.data(), T, causal, sc, 1);
    });
    launch(gx, gy, [&] { dq_k<D, float>(q.data(), k.data(), v.data(), g.data(), lse_r.data(), dr.data(), dq.data(), T, causal, sc, 1); });
    const double e[5] = {normwise(o, o_r), normwise(lse, lse_r), normwise(dq, dq_r), normwise(dk, dk_r), normwise(dv, dv_r)};
    const char *nm[5] = {"O", "lse", "dQ", "dK", "dV"};
    int bad = 0;
    printf("T=%lld D=%d causal=%d:", (long long)T, D, (int)causal);
    for (int i = 0; i < 5; i++) {
        printf(" %s %.2e", nm[i], e[i]);
        bad |= !(e[i] <= 1e-5);
    }
    printf("%s\n", bad ? "  FAIL (> 1e-5)" : "");
    return bad;
}
} // namespace

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: cuda_emu_attention T D causal\n");
        return 2;
    }
    int64_t T = atoll(argv[1]);
    int D = atoi(argv[2]);
    bool causal = atoi(argv[3]) != 0;
    if (pthread_barrier_init(&bar, NULL, NT) != 0) return 2;
    if (T < 1 || (D != 32 && D != 64)) {
        fprintf(stderr, "T >= 1, D 32 or 64\n");
        return 2;
    }
    return D == 64 ? run<64>(T, causal) : run<32>(T, causal);
}
