/* Dtype names and conversions. f16/bf16 rounding is round-to-nearest-even, as PyTorch's.
 * Bulk f32<->f16 uses F16C when the CPU has it (checked once at run time). */
#include "ctrain/core.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include <strings.h>

static const struct { const char *name, *st, *alt; size_t size; } dt_info[CT_DTYPE_COUNT_] = {
    [CT_F32] = {"f32", "F32", "float32", 4},  [CT_F16] = {"f16", "F16", "float16", 2},
    [CT_BF16] = {"bf16", "BF16", "bfloat16", 2}, [CT_F64] = {"f64", "F64", "float64", 8},
    [CT_I32] = {"i32", "I32", "int32", 4},    [CT_I64] = {"i64", "I64", "int64", 8},
    [CT_U8] = {"u8", "U8", "uint8", 1},       [CT_I8] = {"i8", "I8", "int8", 1},
};

size_t ct_dtype_size(ct_dtype dt) {
    CT_CHECK((unsigned)dt < CT_DTYPE_COUNT_, "bad dtype %d", (int)dt);
    return dt_info[dt].size;
}
const char *ct_dtype_name(ct_dtype dt) { return (unsigned)dt < CT_DTYPE_COUNT_ ? dt_info[dt].name : "?"; }
const char *ct_dtype_safetensors_name(ct_dtype dt) { return (unsigned)dt < CT_DTYPE_COUNT_ ? dt_info[dt].st : "?"; }
bool ct_dtype_is_float(ct_dtype dt) { return dt == CT_F32 || dt == CT_F16 || dt == CT_BF16 || dt == CT_F64; }

ct_status ct_dtype_parse(const char *s, ct_dtype *out) {
    for (int i = 0; i < CT_DTYPE_COUNT_; i++) {
        if (!strcasecmp(s, dt_info[i].name) || !strcmp(s, dt_info[i].st) || !strcasecmp(s, dt_info[i].alt)) {
            *out = (ct_dtype)i;
            return CT_OK;
        }
    }
    if (!strcasecmp(s, "fp32") || !strcasecmp(s, "float")) { *out = CT_F32; return CT_OK; }
    if (!strcasecmp(s, "fp16") || !strcasecmp(s, "half")) { *out = CT_F16; return CT_OK; }
    if (!strcasecmp(s, "double") || !strcasecmp(s, "fp64")) { *out = CT_F64; return CT_OK; }
    return ct_error(CT_ERR_INVALID, "unknown dtype '%s' (expected f32, f16, bf16, f64, i32, i64, u8, i8)", s);
}

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t ct_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float ct_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* Branch-light IEEE half conversion (after Maratyszcza's FP16 library), RNE. */
uint16_t ct_f32_to_f16(float f) {
    const float scale_to_inf = u2f(0x77800000u), scale_to_zero = u2f(0x08800000u);
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    uint32_t w = f2u(f), shl1 = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1 & 0xff000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = u2f((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f2u(base);
    uint32_t exp_bits = (bits >> 13) & 0x00007c00u, mant_bits = bits & 0x00000fffu;
    uint32_t nonsign = exp_bits + mant_bits;
    return (uint16_t)((sign >> 16) | (shl1 > 0xff000000u ? 0x7e00u : nonsign));
}
float ct_f16_to_f32(uint16_t h) {
    uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    const uint32_t exp_offset = 0xe0u << 23;
    const float exp_scale = u2f(0x7800000u);
    float normalized = u2f((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    float denormalized = u2f((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    uint32_t result = sign | (two_w < denormalized_cutoff ? f2u(denormalized) : f2u(normalized));
    return u2f(result);
}

__attribute__((target("f16c,avx"))) static void f32_to_f16_f16c(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = ct_f32_to_f16(s[i]);
}
__attribute__((target("f16c,avx"))) static void f16_to_f32_f16c(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = ct_f16_to_f32(s[i]);
}

/* F16C read from CPUID: clang 14 (the fuzzing build) rejects "f16c" in __builtin_cpu_supports */
static int have_f16c(void) {
    static int v = -1;
    unsigned a, b, c, d;
    if (v < 0) v = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 1 : 0;
    return v;
}

double ct_elem_get(const void *p, ct_dtype dt, size_t i) {
    switch (dt) {
    case CT_F32: return ((const float *)p)[i];
    case CT_F16: return ct_f16_to_f32(((const uint16_t *)p)[i]);
    case CT_BF16: return ct_bf16_to_f32(((const uint16_t *)p)[i]);
    case CT_F64: return ((const double *)p)[i];
    case CT_I32: return ((const int32_t *)p)[i];
    case CT_I64: return (double)((const int64_t *)p)[i];
    case CT_U8: return ((const uint8_t *)p)[i];
    case CT_I8: return ((const int8_t *)p)[i];
    default: CT_FATAL("bad dtype %d", (int)dt);
    }
}
void ct_elem_set(void *p, ct_dtype dt, size_t i, double v) {
    switch (dt) {
    case CT_F32: ((float *)p)[i] = (float)v; break;
    case CT_F16: ((uint16_t *)p)[i] = ct_f32_to_f16((float)v); break;
    case CT_BF16: ((uint16_t *)p)[i] = ct_f32_to_bf16((float)v); break;
    case CT_F64: ((double *)p)[i] = v; break;
    case CT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case CT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case CT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case CT_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    default: CT_FATAL("bad dtype %d", (int)dt);
    }
}

void ct_convert(void *dst, ct_dtype ddt, const void *src, ct_dtype sdt, size_t n) {
    if (ddt == sdt) { memmove(dst, src, n * ct_dtype_size(sdt)); return; }
    if (sdt == CT_F32 && ddt == CT_F16 && have_f16c()) { f32_to_f16_f16c(dst, src, n); return; }
    if (sdt == CT_F16 && ddt == CT_F32 && have_f16c()) { f16_to_f32_f16c(dst, src, n); return; }
    if (sdt == CT_F32 && ddt == CT_BF16) {
        /* ct_f32_to_bf16 inline and branch-free, so that the loop vectorises (autocast
         * converts every low-precision op's output) */
        const uint32_t *s = src; uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = s[i], r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
            d[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
        }
        return;
    }
    if (sdt == CT_BF16 && ddt == CT_F32) {
        const uint16_t *s = src; uint32_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
        return;
    }
    if (sdt == CT_I64 && ddt == CT_I32) {
        const int64_t *s = src; int32_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = (int32_t)s[i];
        return;
    }
    for (size_t i = 0; i < n; i++) ct_elem_set(dst, ddt, i, ct_elem_get(src, sdt, i));
}
