/* Dynamic int8 linear, as torch.ao.quantization.quantize_dynamic's Linear on x86 (fbgemm):
 *  - weights: MinMaxObserver(qint8, symmetric) then quantize_per_tensor (or per channel):
 *    scale = max(|min|, |max|) / 127.5 (f32, at least FLT_EPSILON), q = clamp(rint(w * (1/scale)), -128, 127);
 *  - activations, per call over the whole input: ChooseQuantizationParams(min(x, 0), max(x, 0),
 *    0, 255, reduce_range) -> [0, 127], then fbgemm's QuantizeAvx2: q = clamp(rint(x * (1/scale)) + zp, 0, 255);
 *  - u8 x s8 GEMM with int32 accumulation (qgemm_simd.c);
 *  - fbgemm's requantizeForFloatAvx2: y = fma(float(acc - zp * colsum), sa * sw, bias).
 * The integer part is exact, so only the f32 steps above can round, and they are PyTorch's. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/qgemm.h"
#include "ops/op_table.h"

/* ---------------------------------------------------------------- kernels ---- */

bool ct_qkernel_available(ct_qkernel k) {
    __builtin_cpu_init();
    switch (k) {
    case CT_QK_SCALAR: return true;
    case CT_QK_AVX2: return ct_cpu_capability() >= CT_CPU_AVX2; /* capped by CTRAIN_CPU_CAPABILITY */
    case CT_QK_VNNI:
        return ct_cpu_capability() == CT_CPU_AVX512 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    default: return false;
    }
}

ct_qkernel ct_qkernel_best(void) {
    static int best = -1;
    int b = __atomic_load_n(&best, __ATOMIC_RELAXED);
    if (b < 0) {
        b = ct_qkernel_available(CT_QK_VNNI) ? CT_QK_VNNI : ct_qkernel_available(CT_QK_AVX2) ? CT_QK_AVX2 : CT_QK_SCALAR;
        __atomic_store_n(&best, b, __ATOMIC_RELAXED);
    }
    return (ct_qkernel)b;
}

const char *ct_qkernel_name(ct_qkernel k) {
    static const char *names[] = {"scalar", "avx2", "avx512-vnni"};
    return (int)k >= 0 && k < CT_QK_COUNT ? names[k] : "?";
}

const char *ct_qgemm_kernel_name(void) { return ct_qkernel_name(ct_qkernel_best()); }

void ct_qtile_scalar(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc, int mr) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < QG_NB; j++) {
            const int8_t *bp = b + (j / QG_NP) * kp * QG_NP + (j % QG_NP) * 4;
            int32_t s = 0;
            for (int64_t k = 0; k < kp; k += 4, bp += 4 * QG_NP)
                for (int t = 0; t < 4; t++) s += (int32_t)a[i * lda + k + t] * bp[t];
            c[i * ldc + j] = s;
        }
}

static ct_qtile_fn tile_fn(ct_qkernel k) {
    CT_CHECK(ct_qkernel_available(k), "int8 GEMM: kernel %s not supported by this CPU", ct_qkernel_name(k));
    return k == CT_QK_VNNI ? ct_qtile_vnni : k == CT_QK_AVX2 ? ct_qtile_avx2 : ct_qtile_scalar;
}

/* Row blocks of RB rows keep A (RB x K) and one two-panel slice of B (K x 32) in L2 together. */
#define RB (QG_MR * 8)

/* The driver: tiles of RB rows x QG_NB columns, spread over threads; `epi` (may be NULL)
 * turns each finished int32 tile into the caller's output while it is still in L1. */
typedef void (*tile_epilogue)(void *arg, int64_t r0, int64_t nr, int64_t c0, int64_t nc, const int32_t *t, int64_t ldt);

static void qgemm_drive(ct_qkernel k, int64_t M, const uint8_t *A, const ct_qweight *w, tile_epilogue epi, void *arg) {
    ct_qtile_fn fn = tile_fn(k);
    int64_t nrb = (M + RB - 1) / RB, ncb = w->np / QG_NB, units = nrb * ncb;
    /* tiny products are not worth waking the thread team */
    int nt = (double)M * (double)w->np * (double)w->kp < 2e5 ? 1 : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t u = 0; u < units; u++) {
        int64_t rb = u % nrb, cb = u / nrb; /* neighbours share the B slice */
        int64_t r0 = rb * RB, nr = M - r0 < RB ? M - r0 : RB;
        int32_t tile[RB * QG_NB] __attribute__((aligned(64)));
        const int8_t *b = w->packed + cb * QG_NB * w->kp;
        for (int64_t i = 0; i < nr; i += QG_MR)
            fn(w->kp, A + (r0 + i) * w->kp, w->kp, b, tile + i * QG_NB, QG_NB, nr - i < QG_MR ? (int)(nr - i) : QG_MR);
        int64_t c0 = cb * QG_NB, nc = w->out - c0 < QG_NB ? w->out - c0 : QG_NB;
        epi(arg, r0, nr, c0, nc, tile, QG_NB);
    }
}

typedef struct { int32_t *C; int64_t ldc; } s32_arg;
static void store_s32(void *arg, int64_t r0, int64_t nr, int64_t c0, int64_t nc, const int32_t *t, int64_t ldt) {
    s32_arg *s = arg;
    for (int64_t i = 0; i < nr; i++) memcpy(s->C + (r0 + i) * s->ldc + c0, t + i * ldt, (size_t)nc * sizeof *t);
}

void ct_qgemm_s32(ct_qkernel k, int64_t M, const uint8_t *A, const ct_qweight *w, int32_t *C) {
    s32_arg s = {C, w->out};
    qgemm_drive(k, M, A, w, store_s32, &s);
}

/* ---------------------------------------------------------------- quantization ---- */

/* PyTorch's quant_utils::ChooseQuantizationParams (preserve_sparsity and power-of-two scale
 * off): the scale in double, rounded to f32 at the end; the zero point from the end point
 * with the smaller rounding error, computed with the double scale. */
ct_qparams ct_choose_qparams(float min, float max, int32_t qmin, int32_t qmax, bool reduce_range) {
    const float small = 6.1e-5f; /* SMALL_SCALE_THRESHOLD: the smallest normal fp16 */
    if (reduce_range) { qmin /= 2; qmax /= 2; }
    min = fminf(min, 0.f);
    max = fmaxf(max, 0.f);
    double scale = ((double)max - min) / (qmax - qmin);
    if ((float)scale == 0.0f || isinf(1.0f / (float)scale)) scale = 0.1;
    if (scale < small) {
        float org = (float)scale;
        scale = small;
        if (min == 0.0f) max = small * (qmax - qmin);
        else if (max == 0.0f) min = -small * (qmax - qmin);
        else { float amp = small / org; min *= amp; max *= amp; }
    }
    double zmin = qmin - min / scale, zmax = qmax - max / scale;
    double emin = fabs((double)qmin) - fabs(min / scale), emax = fabs((double)qmax) - fabs(max / scale);
    double z0 = emin < emax ? zmin : zmax;
    int32_t zp = z0 < qmin ? qmin : z0 > qmax ? qmax : (int32_t)nearbyint(z0);
    return (ct_qparams){(float)scale, zp};
}

/* ---------------------------------------------------------------- weights ---- */

static void *zalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (p) memset(p, 0, (n + 63) / 64 * 64);
    return p;
}

void ct_qweight_free(ct_qweight *w) {
    if (!w) return;
    free(w->q); free(w->packed); free(w->colsum); free(w->scales);
    free(w);
}

/* everything but q's values and the scales' values */
static ct_status qweight_alloc(int64_t out, int64_t in, int64_t nscales, ct_qweight **res) {
    *res = NULL;
    if (out <= 0 || in <= 0 || (nscales != 1 && nscales != out))
        return ct_error(CT_ERR_INVALID, "int8 weight: bad shape [%lld, %lld] with %lld scales", (long long)out, (long long)in,
                        (long long)nscales);
    ct_qweight *w = calloc(1, sizeof *w);
    if (!w) return ct_error(CT_ERR_NOMEM, "out of memory for an int8 weight");
    w->out = out; w->in = in; w->nscales = nscales;
    w->kp = (in + 3) / 4 * 4;
    w->np = (out + QG_NB - 1) / QG_NB * QG_NB;
    w->q = zalloc((size_t)(out * in));
    w->packed = zalloc((size_t)(w->np * w->kp));
    w->colsum = zalloc((size_t)w->np * sizeof(int32_t));
    w->scales = zalloc((size_t)nscales * sizeof(float));
    if (!w->q || !w->packed || !w->colsum || !w->scales) {
        ct_qweight_free(w);
        return ct_error(CT_ERR_NOMEM, "out of memory for an int8 weight [%lld, %lld]", (long long)out, (long long)in);
    }
    *res = w;
    return CT_OK;
}

static void qweight_pack(ct_qweight *w) {
    for (int64_t n = 0; n < w->out; n++) {
        int8_t *panel = w->packed + (n / QG_NP) * w->kp * QG_NP + (n % QG_NP) * 4;
        int32_t s = 0;
        for (int64_t k = 0; k < w->in; k++) {
            int8_t v = w->q[n * w->in + k];
            panel[(k / 4) * 4 * QG_NP + k % 4] = v;
            s += v;
        }
        w->colsum[n] = s;
    }
}

ct_status ct_qweight_from_int8(const int8_t *q, int64_t out, int64_t in, const float *scales, int64_t nscales, ct_qweight **res) {
    ct_status st = qweight_alloc(out, in, nscales, res);
    if (st != CT_OK) return st;
    memcpy((*res)->q, q, (size_t)(out * in));
    memcpy((*res)->scales, scales, (size_t)nscales * sizeof(float));
    qweight_pack(*res);
    return CT_OK;
}

/* MinMaxObserver / PerChannelMinMaxObserver (qint8, symmetric): max(-min(x, 0), max(x, 0)) / 127.5
 * in f32, floored at FLT_EPSILON; quantize_per_tensor (fbgemm, non-legacy) rounds x * (1/scale). */
static float sym_scale(const float *w, int64_t n) {
    float lo = 0.f, hi = 0.f;
    for (int64_t i = 0; i < n; i++) { lo = fminf(lo, w[i]); hi = fmaxf(hi, w[i]); }
    float s = fmaxf(-lo, hi) / 127.5f;
    return fmaxf(s, FLT_EPSILON);
}

static int8_t q8(float v, float inv) {
    float r = rintf(v * inv);
    return (int8_t)(r < -128.f ? -128 : r > 127.f ? 127 : (int)r);
}

ct_status ct_qweight_quantize(const float *wf, int64_t out, int64_t in, bool per_channel, ct_qweight **res) {
    ct_status st = qweight_alloc(out, in, per_channel ? out : 1, res);
    if (st != CT_OK) return st;
    ct_qweight *w = *res;
    if (!per_channel) w->scales[0] = sym_scale(wf, out * in);
    for (int64_t n = 0; n < out; n++) {
        if (per_channel) w->scales[n] = sym_scale(wf + n * in, in);
        float inv = 1.0f / w->scales[per_channel ? n : 0];
        for (int64_t k = 0; k < in; k++) w->q[n * in + k] = q8(wf[n * in + k], inv);
    }
    qweight_pack(w);
    return CT_OK;
}

const int8_t *ct_qweight_int8(const ct_qweight *w) { return w->q; }
const float *ct_qweight_scales(const ct_qweight *w, int64_t *nscales) {
    if (nscales) *nscales = w->nscales;
    return w->scales;
}
int64_t ct_qweight_out(const ct_qweight *w) { return w->out; }
int64_t ct_qweight_in(const ct_qweight *w) { return w->in; }
size_t ct_qweight_bytes(const ct_qweight *w) { return (size_t)(w->out * w->in) + (size_t)w->nscales * (sizeof(float) + sizeof(int64_t)); }

/* ---------------------------------------------------------------- the linear ---- */

size_t ct_qlinear_abuf_bytes(int64_t M, const ct_qweight *w) {
    int64_t mp = (M + QG_MR - 1) / QG_MR * QG_MR;
    return (size_t)(mp * w->kp);
}

typedef struct { const ct_qweight *w; const float *bias; float *y; int32_t zp; float mult; float sa; } deq_arg;

/* fbgemm's requantizeForFloatAvx2: float(acc - zp_a * colsum) * (sa * sw) + bias. Its
 * _mm256_mul_ps and _mm256_add_ps are contracted into one FMA by the compiler that builds
 * PyTorch (GCC, -mfma): with two roundings a quarter of the outputs differed from PyTorch's
 * by an ulp, with fmaf every output of tests/unit/test_quant.c is bit-identical. */
static void dequant(void *arg, int64_t r0, int64_t nr, int64_t c0, int64_t nc, const int32_t *t, int64_t ldt) {
    const deq_arg *d = arg;
    const int32_t *cs = d->w->colsum + c0;
    float mult[QG_NB], bias[QG_NB];
    for (int64_t j = 0; j < nc; j++) {
        mult[j] = d->w->nscales == 1 ? d->mult : d->sa * d->w->scales[c0 + j];
        bias[j] = d->bias ? d->bias[c0 + j] : 0.f;
    }
    for (int64_t i = 0; i < nr; i++) {
        float *yr = d->y + (r0 + i) * d->w->out + c0;
        const int32_t *tr = t + i * ldt;
        for (int64_t j = 0; j < nc; j++) {
            float v = (float)(tr[j] - d->zp * cs[j]);
            yr[j] = d->bias ? fmaf(v, mult[j], bias[j]) : v * mult[j];
        }
    }
}

/* fbgemm's QuantizeAvx2 (non-legacy): round x * (1/scale) to nearest even, then add the zero
 * point; values past int32 (and NaN) saturate as its _mm256_min_ps / cvtps do. */
static void qrow_c(const float *x, int64_t n, float inv, int32_t zp, uint8_t *q) {
    for (int64_t i = 0; i < n; i++) {
        float t = x[i] * inv;
        t = t < 2147483520.f ? t : 2147483520.f;
        int64_t r = (int64_t)rintf(t > -2147483520.f ? t : -2147483520.f) + zp;
        q[i] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
    }
}

static void minmax_c(const float *x, int64_t n, float *lo, float *hi) {
    float a = 0.f, b = 0.f;
    for (int64_t i = 0; i < n; i++) { a = x[i] < a ? x[i] : a; b = x[i] > b ? x[i] : b; }
    *lo = a;
    *hi = b;
}

/* the SIMD versions (qgemm_simd.c) for any kernel but the scalar one, which stays plain C
 * throughout (the reference the others are tested against) */
static void quantize_rows(ct_qkernel k, const float *x, int64_t M, int64_t K, int64_t kp, ct_qparams qp, uint8_t *a) {
    float inv = 1.f / qp.scale;
    void (*row)(const float *, int64_t, float, int32_t, uint8_t *) = k == CT_QK_SCALAR ? qrow_c : ct_qrow_avx2;
#pragma omp parallel for schedule(static) if (M * K > (1 << 16))
    for (int64_t i = 0; i < M; i++) {
        row(x + i * K, K, inv, qp.zero_point, a + i * kp);
        memset(a + i * kp + K, 0, (size_t)(kp - K));
    }
}

void ct_qlinear_raw(ct_qkernel k, const float *x, int64_t M, const ct_qweight *w, const float *bias, float *y, uint8_t *abuf) {
    int64_t K = w->in, n = M * K;
    float lo, hi; /* fbgemm's FindMinMax, widened to 0 (as ChooseQuantizationParams does next) */
    (k == CT_QK_SCALAR ? minmax_c : ct_qminmax_avx2)(x, n, &lo, &hi);
    ct_qparams qp = ct_choose_qparams(lo, hi, 0, 255, true);
    quantize_rows(k, x, M, K, w->kp, qp, abuf);
    int64_t mp = (M + QG_MR - 1) / QG_MR * QG_MR;
    memset(abuf + M * w->kp, 0, (size_t)((mp - M) * w->kp));
    deq_arg d = {w, bias, y, qp.zero_point, qp.scale * w->scales[0], qp.scale};
    qgemm_drive(k, M, abuf, w, dequant, &d);
}

ct_tensor *ct_linear_dynamic_int8(ct_ctx *ctx, ct_tensor *x, const ct_qweight *w, const ct_tensor *b) {
    CT_CHECK_F32("linear_dynamic_int8", x);
    CT_CHECK_CONTIG("linear_dynamic_int8", x);
    char sx[96];
    CT_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] == w->in, "linear_dynamic_int8: input %s, weight [%lld, %lld]",
             ct_shape_str(x, sx, sizeof sx), (long long)w->out, (long long)w->in);
    CT_CHECK(!b || (b->dtype == CT_F32 && ct_numel(b) == w->out && ct_is_contiguous(b)),
             "linear_dynamic_int8: bias must be f32 [%lld]", (long long)w->out);
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = w->out;
    ct_tensor *y = ct_new(ctx, CT_F32, x->ndim, shape);
    int64_t M = ct_numel(x) / w->in;
    uint8_t *abuf = ct_ctx_alloc(ctx, ct_qlinear_abuf_bytes(M, w) + 64);
    ct_qlinear_raw(ct_qkernel_best(), ct_f32(x), M, w, b ? ct_f32(b) : NULL, ct_f32(y), abuf);
    return y; /* inference only: nothing recorded for backward (PyTorch's quantized Linear has none either) */
}
