/* Small deterministic RNGs. Counter-based (a pure function of key and index), so results
 * never depend on thread count or on the order elements are visited. */
#ifndef CT_RNG_H
#define CT_RNG_H
#include <math.h>
#include <stdint.h>

/* host and device (CUDA kernels draw the same streams, ops/kmath.h) */
#ifdef __CUDACC__
#define CT_RNG_HD __host__ __device__
#else
#define CT_RNG_HD
#endif

CT_RNG_HD static inline uint64_t ct_mix64(uint64_t z) { /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0,1) with 24 random bits, for element `i` of stream `key`. */
CT_RNG_HD static inline float ct_rand_uniform(uint64_t key, uint64_t i) {
    return (float)(ct_mix64(key + 0x9e3779b97f4a7c15ull * (i + 1)) >> 40) * (1.0f / 16777216.0f);
}
static inline double ct_rand_uniform_d(uint64_t key, uint64_t i) {
    return (double)(ct_mix64(key + 0x9e3779b97f4a7c15ull * (i + 1)) >> 11) * (1.0 / 9007199254740992.0);
}
/* Standard normal (Box–Muller on two counters). */
static inline double ct_rand_normal(uint64_t key, uint64_t i) {
    double u1 = ct_rand_uniform_d(key, 2 * i), u2 = ct_rand_uniform_d(key, 2 * i + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
#endif
