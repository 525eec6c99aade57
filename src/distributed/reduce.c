/* Element-wise reduction kernels for the collectives. Plain loops that GCC vectorises at
 * -O3 -march=native; f16/bf16 go through f32 in blocks (F16C when available) and round
 * once per pass. Callers fix the order of passes by rank, so results never depend on timing. */
#include "distributed/dist_internal.h"

#include <immintrin.h>
#include <string.h>

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y) ((y) < (x) ? (y) : (x))
#define OP_MAX(x, y) ((y) > (x) ? (y) : (x))

/* Two loop copies so the inner loop has no branch on o2. */
#define KERNEL(T, OPM)                                                                       \
    do {                                                                                     \
        T *restrict_o1 = (T *)o1;                                                            \
        const T *pa = (const T *)a, *pb = (const T *)b;                                      \
        if (o2) {                                                                            \
            T *q = (T *)o2;                                                                  \
            if (div > 1) for (size_t i = 0; i < n; i++) { T r = (T)(OPM(pa[i], pb[i]) / (T)div); restrict_o1[i] = r; q[i] = r; } \
            else for (size_t i = 0; i < n; i++) { T r = OPM(pa[i], pb[i]); restrict_o1[i] = r; q[i] = r; } \
        } else {                                                                             \
            if (div > 1) for (size_t i = 0; i < n; i++) restrict_o1[i] = (T)(OPM(pa[i], pb[i]) / (T)div); \
            else for (size_t i = 0; i < n; i++) restrict_o1[i] = OPM(pa[i], pb[i]);          \
        }                                                                                    \
    } while (0)

#define BY_OP(T)                                                                   \
    switch (op) {                                                                  \
    case CT_RED_SUM: case CT_RED_AVG: KERNEL(T, OP_SUM); break;                    \
    case CT_RED_PROD: KERNEL(T, OP_PROD); break;                                   \
    case CT_RED_MIN: KERNEL(T, OP_MIN); break;                                     \
    case CT_RED_MAX: KERNEL(T, OP_MAX); break;                                     \
    default: break;                                                                \
    }

static void reduce_native(ct_dtype dt, ct_reduce_op op, void *o1, void *o2, const void *a, const void *b, size_t n,
                          int div) {
    switch (dt) {
    case CT_F32: BY_OP(float); break;
    case CT_F64: BY_OP(double); break;
    case CT_I32: BY_OP(int32_t); break;
    case CT_I64: BY_OP(int64_t); break;
    default: break;
    }
}

/* ---- 16-bit floats through f32 ---- */
static inline void bf16_load(float *d, const uint16_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(&d[i], &u, 4);
    }
}
static inline void bf16_store(uint16_t *d, const float *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &s[i], 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) d[i] = (uint16_t)((u >> 16) | 0x40);
        else d[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
static inline void f16_load(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < n; i++) d[i] = ct_f16_to_f32(s[i]);
}
static inline void f16_store(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) d[i] = ct_f32_to_f16(s[i]);
}

static void reduce_half(ct_dtype dt, ct_reduce_op op, void *o1, void *o2, const void *a, const void *b, size_t n,
                        int div) {
    enum { BLK = 512 };
    float fa[BLK], fb[BLK], fo[BLK];
    const uint16_t *pa = a, *pb = b;
    uint16_t *p1 = o1, *p2 = o2;
    for (size_t off = 0; off < n; off += BLK) {
        size_t m = n - off < BLK ? n - off : BLK;
        if (dt == CT_BF16) { bf16_load(fa, pa + off, m); bf16_load(fb, pb + off, m); }
        else { f16_load(fa, pa + off, m); f16_load(fb, pb + off, m); }
        reduce_native(CT_F32, op, fo, NULL, fa, fb, m, div);
        if (dt == CT_BF16) { bf16_store(p1 + off, fo, m); if (p2) bf16_store(p2 + off, fo, m); }
        else { f16_store(p1 + off, fo, m); if (p2) f16_store(p2 + off, fo, m); }
    }
}

void ct_reduce2(ct_dtype dt, ct_reduce_op op, void *o1, void *o2, const void *a, const void *b, size_t n, int div) {
    if (!n) return;
    if (op != CT_RED_AVG) div = 0;
    if (dt == CT_F16 || dt == CT_BF16) reduce_half(dt, op, o1, o2, a, b, n, div);
    else reduce_native(dt, op, o1, o2, a, b, n, div);
}

void ct_reduce_scale(ct_dtype dt, void *o, size_t n, int div) {
    if (div <= 1 || !n) return;
    switch (dt) {
    case CT_F32: { float *p = o; for (size_t i = 0; i < n; i++) p[i] /= (float)div; break; }
    case CT_F64: { double *p = o; for (size_t i = 0; i < n; i++) p[i] /= (double)div; break; }
    case CT_I32: { int32_t *p = o; for (size_t i = 0; i < n; i++) p[i] /= div; break; }
    case CT_I64: { int64_t *p = o; for (size_t i = 0; i < n; i++) p[i] /= div; break; }
    case CT_F16: case CT_BF16: {
        enum { BLK = 512 };
        float f[BLK];
        uint16_t *p = o;
        for (size_t off = 0; off < n; off += BLK) {
            size_t m = n - off < BLK ? n - off : BLK;
            if (dt == CT_BF16) bf16_load(f, p + off, m); else f16_load(f, p + off, m);
            for (size_t i = 0; i < m; i++) f[i] /= (float)div;
            if (dt == CT_BF16) bf16_store(p + off, f, m); else f16_store(p + off, f, m);
        }
        break;
    }
    default: break;
    }
}
