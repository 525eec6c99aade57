/* conv2d (direct, implicit GEMM or im2col + sgemm), max_pool2d (and fused relu_max_pool2d),
 * avg_pool2d (count_include_pad=True), NCHW.
 *
 * conv2d is a GEMM over a chunk of samples at once, col [C*kh*kw, nb*OH*OW] (bigger GEMMs
 * than one per sample: small images give tiny per-sample GEMMs). At stride 1 on the own
 * AVX-512 GEMM, col is never stored: the forward, the weight gradient, and for C >= 16
 * the input gradient run the direct kernels of conv_direct.c (each GEMM's products in its
 * order, read in place from padded copies; for C < 16 the weight gradient's operands are
 * packed per sample into a cache-resident ring); elsewhere im2col materialises col and
 * the input gradient goes through it (dcol = W^T dY, col2im). All give the same values to
 * the same multiply-adds, hence the same bits. The chunk size depends only on the shapes,
 * so the summation order of the weight gradient — and every bit of the result — is the
 * same for any thread count. */
#include <math.h>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#include <string.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/conv_direct.h"
#include "ops/kmath.h"

#define COL_BUDGET (1 << 20) /* floats per im2col chunk (4 MiB) */
#define DCOL_BUDGET (1 << 18) /* floats per dcol block of the input gradient (1 MiB: an L2) */
#define OUT_BUDGET (1 << 17)  /* floats of [O, nb*P] forward result per implicit-GEMM chunk (512 KiB) */

/* C = op(A) op(B) + beta C */
static inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C, float beta) {
    ct_sgemm(ta, tb, M, N, K, 1.0f, A, B, beta, C);
}

typedef struct {
    int64_t N, C, H, W, O, kh, kw, OH, OW, s, p;
} conv_geom;

/* Output columns [*o0, *o1) whose input column ow*s - p + kj falls inside [0, W): the rest
 * is padding. Lets the inner loops run branch-free (and vectorise for stride 1). */
static inline void valid_cols(const conv_geom *g, int64_t kj, int64_t *o0, int64_t *o1) {
    int64_t lo = g->p - kj, hi = g->W + g->p - kj; /* need lo <= ow*s < hi */
    int64_t a = lo <= 0 ? 0 : (lo + g->s - 1) / g->s;
    int64_t b = hi <= 0 ? 0 : (hi + g->s - 1) / g->s;
    *o0 = a < g->OW ? a : g->OW;
    *o1 = b < g->OW ? b : g->OW;
    if (*o1 < *o0) *o1 = *o0;
}

#ifdef __AVX512F__
static inline __mmask16 lanes16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }
#endif
#ifdef __AVX2__
/* CPUs without AVX-512 take the im2col path (no own GEMM): its rows, col2im's and the
 * pooling's run on these 8-lane masks (lanes [0, n), n clamped to [0, 8]); masked-off lanes
 * of a load are not read, as with the AVX-512 masks */
static inline __m256i lanes8(int64_t n) {
    int32_t k = n <= 0 ? 0 : n >= 8 ? 8 : (int32_t)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* d[ow] = xr[ow] for ow in [o0, o1), 0 for the rest of [0, n): one image row of im2col at
 * stride 1. xr may point before its row: only [o0, o1) is read (masked lanes are not). */
static inline void row_take(float *d, const float *xr, int64_t n, int64_t o0, int64_t o1) {
#ifdef __AVX512F__
    for (int64_t i = 0; i < n; i += 16)
        _mm512_mask_storeu_ps(d + i, lanes16(n - i), _mm512_maskz_loadu_ps(lanes16(o1 - i) & (__mmask16)~lanes16(o0 - i), xr + i));
#elif defined(__AVX2__)
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_maskload_ps(xr + i, _mm256_andnot_si256(lanes8(o0 - i), lanes8(o1 - i)));
        if (n - i >= 8) _mm256_storeu_ps(d + i, v);
        else _mm256_maskstore_ps(d + i, lanes8(n - i), v); /* the row's end: the next row may be another thread's */
    }
#else
    /* o0, o1 may lie outside [0, n) (a run wholly in the padding): clamp, as the masks do */
    o0 = o0 < 0 ? 0 : o0 > n ? n : o0;
    o1 = o1 < o0 ? o0 : o1 > n ? n : o1;
    for (int64_t ow = 0; ow < o0; ow++) d[ow] = 0.0f;
    for (int64_t ow = o0; ow < o1; ow++) d[ow] = xr[ow];
    for (int64_t ow = o1; ow < n; ow++) d[ow] = 0.0f;
#endif
}

/* d[0, n) += s[0, n). d must be readable and writable to d + n rounded up to 8 (col2im's
 * padded plane): on AVX2 whole vectors are stored and the lanes past n add -0.0f, which
 * leaves every value as it was (x + -0 is x, -0 and quiet NaNs included; no arithmetic made
 * a signalling NaN there); masked stores are slow on AMD CPUs, and the rows are short */
static inline void row_add(float *d, const float *s, int64_t n) {
#ifdef __AVX512F__
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = lanes16(n - i);
        _mm512_mask_storeu_ps(d + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + i), _mm512_maskz_loadu_ps(m, s + i)));
    }
#elif defined(__AVX2__)
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), _mm256_loadu_ps(s + i)));
    if (i < n) {
        __m256i m = lanes8(n - i);
        __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-0.0f), _mm256_maskload_ps(s + i, m), _mm256_castsi256_ps(m));
        _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), v));
    }
#else
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
#endif
}

#define PAD_PLANE 4096 /* floats: stride-1 planes up to 64x64 with their padding go through a local copy */

/* buf[(h + p) * Wp + w + p] = xp[h][w], zeros in the border of p, then 8 zeros: the plane with
 * its padding, which row_copy may read 8 floats past */
static void pad_plane(const conv_geom *g, const float *xp, float *buf) {
    int64_t Hp = g->H + 2 * g->p, Wp = g->W + 2 * g->p;
    memset(buf, 0, (size_t)(Hp * Wp + 8) * sizeof(float));
    for (int64_t h = 0; h < g->H; h++) {
        float *r = buf + (h + g->p) * Wp + g->p;
        const float *x = xp + h * g->W;
#if defined(__AVX2__)
        /* whole vectors (not a memcpy call per row of 14-28 floats): the zeros loaded past
         * the row land in its border or in the next row, which is written next; the last
         * row's reach into the bottom border is within the 8 spare floats */
        for (int64_t i = 0; i < g->W; i += 8) _mm256_storeu_ps(r + i, _mm256_maskload_ps(x + i, lanes8(g->W - i)));
#else
        memcpy(r, x, (size_t)g->W * sizeof(float));
#endif
    }
}

/* d[0, n) = s[0, n), s readable to s + n + 8. spill: d[n, n + 8) may be written too (the next
 * row of the same block, written after it); without, the tail takes a masked store. Whole
 * vectors otherwise: masked stores are slow on AMD CPUs, and the rows are short. */
static inline void row_copy(float *d, const float *s, int64_t n, bool spill) {
#if defined(__AVX2__)
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i);
        __asm__("" : "+x"(v)); /* else gcc makes this loop a memcpy call per row */
        _mm256_storeu_ps(d + i, v);
    }
    if (i < n && spill) _mm256_storeu_ps(d + i, _mm256_loadu_ps(s + i));
    else if (i < n) _mm256_maskstore_ps(d + i, lanes8(n - i), _mm256_loadu_ps(s + i));
#else
    (void)spill;
    memcpy(d, s, (size_t)n * sizeof(float));
#endif
}

/* col[k][j*P + oh*OW + ow] = x[n0+j][c][oh*s - p + ki][ow*s - p + kj] (0 outside), k = (c, ki, kj) */
static void im2col(const conv_geom *g, const float *x, int64_t n0, int64_t nb, float *col) {
    int64_t K = g->C * g->kh * g->kw, P = g->OH * g->OW, ld = nb * P;
    if (g->s == 1 && (g->H + 2 * g->p) * (g->W + 2 * g->p) + 8 <= PAD_PLANE) {
        /* each (sample, channel) plane padded once into a local copy; then every kernel
         * offset's rows are plain shifted copies of it, no clipping. Threads take (sample,
         * channel) pairs: their blocks of col are disjoint, and no row spills past its block */
        int64_t KK = g->kh * g->kw, Wp = g->W + 2 * g->p;
#pragma omp parallel for collapse(2) schedule(dynamic, 4) if (K * ld >= (1 << 15))
        for (int64_t c = 0; c < g->C; c++)
            for (int64_t j = 0; j < nb; j++) {
                float buf[PAD_PLANE];
                pad_plane(g, x + ((n0 + j) * g->C + c) * g->H * g->W, buf);
                for (int64_t kk = 0; kk < KK; kk++) {
                    int64_t ki = kk / g->kw, kj = kk % g->kw;
                    float *dst = col + (c * KK + kk) * ld + j * P;
                    for (int64_t oh = 0; oh < g->OH; oh++)
                        row_copy(dst + oh * g->OW, buf + (oh + ki) * Wp + kj, g->OW, oh + 1 < g->OH);
                }
            }
        return;
    }
#pragma omp parallel for schedule(dynamic, 8) if (K * ld >= (1 << 15))
    for (int64_t k = 0; k < K; k++) {
        int64_t c = k / (g->kh * g->kw), ki = (k / g->kw) % g->kh, kj = k % g->kw, o0, o1;
        valid_cols(g, kj, &o0, &o1);
        for (int64_t j = 0; j < nb; j++) {
            const float *xp = x + ((n0 + j) * g->C + c) * g->H * g->W;
            float *dst = col + k * ld + j * P;
            for (int64_t oh = 0; oh < g->OH; oh++) {
                int64_t ih = oh * g->s - g->p + ki;
                float *d = dst + oh * g->OW;
                if (ih < 0 || ih >= g->H) {
                    memset(d, 0, (size_t)g->OW * sizeof(float));
                    continue;
                }
                const float *xr = xp + ih * g->W - g->p + kj; /* xr[ow * s] is input column ow*s - p + kj */
                /* rows are short (14..28 floats): masked vectors, not a memcpy call per row */
                if (g->s == 1) {
                    row_take(d, xr, g->OW, o0, o1);
                    continue;
                }
                for (int64_t ow = 0; ow < o0; ow++) d[ow] = 0.0f;
                for (int64_t ow = o0; ow < o1; ow++) d[ow] = xr[ow * g->s];
                for (int64_t ow = o1; ow < g->OW; ow++) d[ow] = 0.0f;
            }
        }
    }
}

typedef struct {
    const conv_geom *g;
    const float *x;
    int64_t n0;
} col_src;

/* A stretch of im2col columns along one output row of one sample: cnt columns from (oh, ow),
 * landing at offset `at` of the row being built. */
typedef struct {
    const float *x;
    int64_t oh, ow;
    int cnt, at;
} col_run;

/* Cuts columns [q0, q0 + n) into runs along output rows; returns how many. */
static int col_runs(const col_src *cs, int64_t q0, int n, col_run *run) {
    const conv_geom *g = cs->g;
    int64_t P = g->OH * g->OW, HW = g->H * g->W;
    int nr = 0;
    for (int c = 0; c < n;) {
        int64_t q = q0 + c, j = q / P, r = q - j * P, oh = r / g->OW, ow = r - oh * g->OW;
        int cnt = (int)(g->OW - ow < n - c ? g->OW - ow : n - c);
        run[nr++] = (col_run){cs->x + (cs->n0 + j) * g->C * HW, oh, ow, cnt, c};
        c += cnt;
    }
    return nr;
}

/* One im2col row (kernel offset ch, ki, kj) over the runs into d, at stride 1: output column
 * ow reads input column ow - p + kj, valid for ow in [o0, o1); zeros elsewhere. */
static void col_row(const conv_geom *g, const col_run *run, int nr, int64_t ch, int64_t ki, int64_t kj, float *d) {
    int64_t HW = g->H * g->W;
    int64_t o0 = g->p - kj > 0 ? g->p - kj : 0, o1 = g->W + g->p - kj < g->OW ? g->W + g->p - kj : g->OW;
    for (int r = 0; r < nr; r++) {
        int64_t ih = run[r].oh - g->p + ki;
        if (ih < 0 || ih >= g->H) {
            memset(d + run[r].at, 0, (size_t)run[r].cnt * sizeof(float));
            continue;
        }
        const float *xr = run[r].x + ch * HW + ih * g->W - g->p + kj + run[r].ow;
        row_take(d + run[r].at, xr, run[r].cnt, o0 - run[r].ow, o1 - run[r].ow);
    }
}

/* (channel, ki, kj) of kernel offset k0, stepped by next_offset: no divisions per row */
static void offset_of(const conv_geom *g, int64_t k0, int64_t *ch, int64_t *ki, int64_t *kj) {
    int64_t KK = g->kh * g->kw;
    *ch = k0 / KK, *ki = (k0 / g->kw) % g->kh, *kj = k0 % g->kw;
}
static void next_offset(const conv_geom *g, int64_t *ch, int64_t *ki, int64_t *kj) {
    if (++*kj == g->kw) {
        *kj = 0;
        if (++*ki == g->kh) { *ki = 0; ++*ch; }
    }
}

/* The transposed im2col matrix, for the weight gradient dW += dY col^T (stride 1):
 * dst[k][c] = col[n0 + c][k0 + k], rows of col (kernel offsets) built along runs of one
 * output row into a local block, then transposed into the panel. */
static void pack_col_t(const void *arg, float *dst, int64_t n0, int n, int64_t k0, int64_t kc) {
    const col_src *cs = arg;
    col_run run[CT_SGEMM_KC];
    float rows[CT_SGEMM_NR * CT_SGEMM_KC];
    int nr = col_runs(cs, k0, (int)kc, run);
    int64_t ch, ki, kj;
    offset_of(cs->g, n0, &ch, &ki, &kj);
    for (int i = 0; i < n; i++) {
        col_row(cs->g, run, nr, ch, ki, kj, rows + i * kc);
        next_offset(cs->g, &ch, &ki, &kj);
    }
    ct_sgemm_pack_rows(dst, rows, kc, n, kc);
}

/* dx[n0+j][c][ih][iw] += dcol[k][j*P + ...]; threads split (sample, channel) pairs, each
 * owning its plane of dx, kernel offsets in fixed order: deterministic (any schedule).
 * fresh: dx is not zeroed yet; each plane is visited once, so it starts from +0 here. */
static void col2im_add(const conv_geom *g, const float *dcol, int64_t n0, int64_t nb, float *dx, bool fresh) {
    int64_t P = g->OH * g->OW, ld = nb * P, KK = g->kh * g->kw;
    int64_t Hp = g->H + 2 * g->p, Wp = g->W + 2 * g->p;
    bool padded = g->s == 1 && Hp * Wp + 8 <= PAD_PLANE; /* 8: row_add's last vector */
#pragma omp parallel for collapse(2) schedule(dynamic, 4) if (g->C * KK * ld >= (1 << 15))
    for (int64_t j = 0; j < nb; j++)
        for (int64_t c = 0; c < g->C; c++) {
            float *xp = dx + ((n0 + j) * g->C + c) * g->H * g->W;
            if (padded) {
                /* the plane with its padding border in a local buffer: every kernel offset is a
                 * plain shifted add, no clipping; the border (padding) is dropped. Each element
                 * still gets its terms in kernel-offset order, starting from dx: same bits. */
                float buf[PAD_PLANE];
                memset(buf, 0, (size_t)(Hp * Wp + 8) * sizeof(float));
                if (!fresh)
                    for (int64_t h = 0; h < g->H; h++) memcpy(buf + (h + g->p) * Wp + g->p, xp + h * g->W, (size_t)g->W * sizeof(float));
                for (int64_t kk = 0; kk < KK; kk++) {
                    int64_t ki = kk / g->kw, kj = kk % g->kw;
                    const float *src = dcol + (c * KK + kk) * ld + j * P;
                    for (int64_t oh = 0; oh < g->OH; oh++) row_add(buf + (oh + ki) * Wp + kj, src + oh * g->OW, g->OW);
                }
                for (int64_t h = 0; h < g->H; h++) memcpy(xp + h * g->W, buf + (h + g->p) * Wp + g->p, (size_t)g->W * sizeof(float));
                continue;
            }
            if (fresh) memset(xp, 0, (size_t)(g->H * g->W) * sizeof(float));
            for (int64_t kk = 0; kk < KK; kk++) {
                int64_t ki = kk / g->kw, kj = kk % g->kw, o0, o1;
                valid_cols(g, kj, &o0, &o1);
                const float *src = dcol + (c * KK + kk) * ld + j * P;
                for (int64_t oh = 0; oh < g->OH; oh++) {
                    int64_t ih = oh * g->s - g->p + ki;
                    if (ih < 0 || ih >= g->H) continue;
                    float *xr = xp + ih * g->W - g->p + kj;
                    const float *sr = src + oh * g->OW;
                    if (g->s == 1) {
#pragma omp simd
                        for (int64_t ow = o0; ow < o1; ow++) xr[ow] += sr[ow];
                    } else {
                        for (int64_t ow = o0; ow < o1; ow++) xr[ow * g->s] += sr[ow];
                    }
                }
            }
        }
}

/* dst [O, nb*P] = dY of samples [n0, n0 + nb) (stored [nb, O, P]): the layout of the
 * forward GEMM, for the explicit GEMMs of backward */
static void gather_dy(const conv_geom *g, const float *G, int64_t n0, int64_t nb, float *dst) {
    int64_t P = g->OH * g->OW;
#pragma omp parallel for collapse(2) schedule(dynamic, 16) if (nb * g->O * P >= (1 << 15))
    for (int64_t o = 0; o < g->O; o++)
        for (int64_t j = 0; j < nb; j++) memcpy(dst + o * nb * P + j * P, G + ((n0 + j) * g->O + o) * P, (size_t)P * sizeof(float));
}

/* Sums of the m planes of P floats at g, into out: each plane in PS_LANES lanes (lane l adds
 * elements l, l + PS_LANES, ... in order; the last P % PS_LANES go into lane 0), the lanes
 * then added in order to +0 — the order of conv2d's earlier `omp simd` reduction as GCC
 * vectorises it with 512-bit vectors (the build's -mprefer-vector-width=512), spelled out
 * so that the bias gradient has the same bits wherever it is summed (conv2d's backward, or
 * the fused pool backward while each plane is in cache), and several planes at a time
 * give independent add chains. */
#define PS_LANES 16
static inline void plane_sums_m(const float *g, int64_t P, int m, float *out) {
    float acc[4][PS_LANES] = {{0}};
    int64_t Pv = P - P % PS_LANES;
    for (int64_t q = 0; q < Pv; q += PS_LANES)
        for (int j = 0; j < m; j++)
            for (int l = 0; l < PS_LANES; l++) acc[j][l] += g[j * P + q + l];
    for (int j = 0; j < m; j++) {
        for (int64_t q = Pv; q < P; q++) acc[j][0] += g[j * P + q];
        float s = 0.0f;
        for (int l = 0; l < PS_LANES; l++) s += acc[j][l];
        out[j] = s;
    }
}
static void plane_sums(const float *g, int64_t P, int64_t n, float *out) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) plane_sums_m(g + j * P, P, 4, out + j);
    for (; j < n; j++) plane_sums_m(g + j * P, P, 1, out + j);
}

static int64_t chunk_of(const conv_geom *g) {
    int64_t per = g->C * g->kh * g->kw * g->OH * g->OW;
    int64_t nb = per ? COL_BUDGET / per : g->N;
    if (nb < 1) nb = 1;
    return nb < g->N ? nb : g->N;
}

static conv_geom conv_setup(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, int stride, int padding) {
    conv_geom g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[2], w->shape[3], 0, 0, stride, padding};
    ct_check_conv2d(x, w, b, stride, padding, &g.OH, &g.OW);
    return g;
}

/* The forward's chunk of samples per GEMM, and whether the direct kernel takes the full
 * chunks (imp_full) and the last one (imp_last): stride 1 where the own GEMM runs
 * (conv_direct.h); elsewhere col and (when several samples share a GEMM) its [O, nb*P]
 * result. */
static int64_t fw_plan(const conv_geom *g, bool *imp_full, bool *imp_last) {
    int64_t K = g->C * g->kh * g->kw, P = g->OH * g->OW, nbmax = chunk_of(g);
    if (g->s == 1 && g->N > 0 && g->O * P > 0) {
        /* no col to hold: chunks small enough that the GEMM's [O, nb*P] result is still in
         * cache when it is copied out (each output sums over K alone, so the chunking of
         * the forward does not change any bit) */
        int64_t nbo = OUT_BUDGET / (g->O * P);
        nbo = nbo < 1 ? 1 : nbo < g->N ? nbo : g->N;
        if (ct_sgemm_own_takes(g->O, nbo * P, K) && ct_sgemm_own_takes(g->O, ((g->N - 1) % nbo + 1) * P, K)) nbmax = nbo;
    }
    int64_t nblast = g->N ? (g->N - 1) % nbmax + 1 : 0;
    *imp_full = g->s == 1 && ct_sgemm_own_takes(g->O, nbmax * P, K);
    *imp_last = g->s == 1 && ct_sgemm_own_takes(g->O, nblast * P, K);
    return nbmax;
}

static float *direct_prep(ct_ctx *ctx, const ct_conv_direct_geom *dg, const float *w, int nthreads, bool epi) {
    float *s = ct_ctx_alloc(ctx, ct_conv_direct_scratch(dg, nthreads, epi) * sizeof(float));
    ct_conv_direct_prep(dg, w, s);
    return s;
}

/* The weight-gradient plan of ct_bw_conv2d at stride 1: the direct kernel (conv_direct.h)
 * where the own GEMM would take every chunk. */
static bool dw_direct(const conv_geom *g) {
    int64_t K = g->C * g->kh * g->kw, P = g->OH * g->OW, nbmax = chunk_of(g), nblast = g->N ? (g->N - 1) % nbmax + 1 : 0;
    return g->s == 1 && ct_sgemm_own_takes(g->O, K, nbmax * P) && ct_sgemm_own_takes(g->O, K, nblast * P);
}
/* Where conv2d's backward can take its output gradient G from the fused 2x2 pooling's
 * gradient directly (unpool_fill): no input gradient to compute (checked by the caller),
 * the few-channel direct weight gradient, which reads G channels-last anyway. */
static bool unpool_ok(const conv_geom *g, int kernel, int pool_stride, int pool_padding) {
    return kernel == 2 && pool_stride == 2 && pool_padding == 0 && g->OH % 2 == 0 && g->OW % 2 == 0 && g->C < 16 && dw_direct(g);
}

static void pool_bw_planes(const float *G, const float *Y, const int32_t *arg, float *gx, int64_t planes, int64_t HW, int64_t OH,
                           int64_t OW, bool relu, bool fresh, bool exact2x2, float *sums);

typedef struct {
    const float *g, *y; /* the pooled gradient and output [N, O, OP] */
    const int32_t *arg;
    int64_t n0, O, OP, P;
    float *sums; /* [N, O] or NULL */
} unpool_args;

/* Sample n0 + j's conv-output gradient as the fused 2x2 pool backward writes it (0.0f + g
 * where a positive output's input won, +0 elsewhere: pool2x2_bw_plane's bits), channel o in
 * [o0, o1) of pixel p at dst[poff[p] + o] for the weight gradient, and (take) each of those
 * planes' sum as plane_sums adds it (lane p % 16, the tail into lane 0, then the lanes in
 * order), for the bias gradient. */
static void unpool_fill(void *a, int64_t j, float *dst, const int32_t *poff, int64_t o0, int64_t o1, bool take) {
    const unpool_args *u = a;
    int64_t P = u->P, OP = u->OP, Pv = P - P % PS_LANES, s = u->n0 + j;
#ifdef __AVX512F__
    /* records hold O rounded up to 32 floats; 16 winners a scatter (distinct pixels) */
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t p = 0; p < P; p++)
        for (int64_t o = o0; o < o1; o += 16) _mm512_storeu_ps(dst + poff[p] + o, zero);
    for (int64_t o = o0; o < o1; o++) {
        int64_t pl = (s * u->O + o) * OP;
        for (int64_t q = 0; q < OP; q += 16) {
            __mmask16 m = lanes16(OP - q);
            m &= _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, u->y + pl + q), zero, _CMP_GT_OQ);
            __m512i at = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, _mm512_maskz_loadu_epi32(m, u->arg + pl + q), poff, 4);
            __m512 v = _mm512_add_ps(zero, _mm512_maskz_loadu_ps(m, u->g + pl + q));
            _mm512_mask_i32scatter_ps(dst, m, _mm512_add_epi32(at, _mm512_set1_epi32((int32_t)o)), v, 4);
        }
    }
#else
    for (int64_t p = 0; p < P; p++) memset(dst + poff[p] + o0, 0, (size_t)(o1 - o0) * sizeof(float));
    for (int64_t o = o0; o < o1; o++) {
        int64_t pl = (s * u->O + o) * OP;
        for (int64_t q = 0; q < OP; q++)
            if (u->y[pl + q] > 0) dst[poff[u->arg[pl + q]] + o] = 0.0f + u->g[pl + q];
    }
#endif
    if (!u->sums || !take) return;
    for (int64_t oc = o0; oc < o1; oc += 32) {
        int no = (int)(o1 - oc < 32 ? o1 - oc : 32);
        float acc[PS_LANES][32] = {{0}};
        for (int64_t p = 0; p < P; p++) {
            float *ac = acc[p < Pv ? p % PS_LANES : 0];
            const float *d = dst + poff[p] + oc;
            for (int c = 0; c < 32; c++) ac[c] += c < no ? d[c] : 0.0f;
        }
        for (int c = 0; c < no; c++) {
            float sum = 0.0f;
            for (int l = 0; l < PS_LANES; l++) sum += acc[l][c];
            u->sums[s * u->O + oc + c] = sum;
        }
    }
}

static ct_node *conv_record(ct_ctx *ctx, ct_tensor *y, ct_tensor *x, ct_tensor *w, ct_tensor *b, int stride, int padding) {
    ct_node *nd = ct_record(ctx, CT_OP_CONV2D, y, b ? 3 : 2, (ct_tensor *[]){x, w, b});
    if (nd) {
        nd->i[0] = stride;
        nd->i[1] = padding;
    }
    return nd;
}

ct_tensor *ct_conv2d(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, int stride, int padding) {
    CT_DEV_DISPATCH(ctx, CT_OP_CONV2D, .in = {x, w, b}, .i = {stride, padding});
    CT_AUTOCAST(ctx, CT_OP_CONV2D, 3, ((ct_tensor **[]){&x, &w, &b}), ct_conv2d(ctx, x, w, b, stride, padding));
    conv_geom g = conv_setup(x, w, b, stride, padding);
    int64_t K = g.C * g.kh * g.kw, P = g.OH * g.OW;
    bool imp_full, imp_last;
    int64_t nbmax = fw_plan(&g, &imp_full, &imp_last);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){g.N, g.O, g.OH, g.OW});
    float *Y = y->data;
    const float *Wt = w->data, *B = b ? b->data : NULL;
    /* where the implicit GEMM would run: the direct kernel, its products in its order */
    ct_conv_direct_geom dg = {g.C, g.H, g.W, g.O, g.kh, g.kw, g.p, g.OH, g.OW};
    int dnt = omp_get_max_threads();
    float *dsc = imp_full || imp_last ? direct_prep(ctx, &dg, Wt, dnt, false) : NULL;
    bool all_direct = imp_full && imp_last;
    if (all_direct) ct_conv_direct_fw(&dg, dsc, dnt, x->data, B, g.N, nbmax, Y);
    float *col = all_direct ? NULL : ct_ctx_alloc(ctx, (size_t)(K * nbmax * P + 1) * sizeof(float));
    float *tmp = nbmax > 1 && !all_direct ? ct_ctx_alloc(ctx, (size_t)(g.O * nbmax * P) * sizeof(float)) : NULL;
    for (int64_t n0 = 0; n0 < g.N && !all_direct; n0 += nbmax) {
        int64_t nb = g.N - n0 < nbmax ? g.N - n0 : nbmax;
        float *out = nb == 1 ? Y + n0 * g.O * P : tmp;
        if (nb == nbmax ? imp_full : imp_last) {
            ct_conv_direct_fw(&dg, dsc, dnt, (const float *)x->data + n0 * g.C * g.H * g.W, B, nb, nb, Y + n0 * g.O * P);
            continue;
        }
        im2col(&g, x->data, n0, nb, col);
        gemm(false, false, g.O, nb * P, K, Wt, col, out, 0.0f);
        if (nb == 1) {
            if (B)
                for (int64_t o = 0; o < g.O; o++)
                    for (int64_t q = 0; q < P; q++) Y[(n0 * g.O + o) * P + q] += B[o];
        } else {
#pragma omp parallel for collapse(2) schedule(dynamic, 16) if (nb * g.O * P >= (1 << 15))
            for (int64_t j = 0; j < nb; j++)
                for (int64_t o = 0; o < g.O; o++) {
                    float *dst = Y + ((n0 + j) * g.O + o) * P;
                    const float *src = tmp + o * nb * P + j * P;
                    float bv = B ? B[o] : 0.0f;
                    for (int64_t q = 0; q < P; q++) dst[q] = src[q] + bv;
                }
        }
    }
    conv_record(ctx, y, x, w, b, stride, padding);
    return y;
}

/* db += each output channel's gradient summed over the batch: the planes' sums (taken by
 * the fused pool backward or unpool_fill where sums, else here) added in double */
static void bias_grad(const conv_geom *g, const float *G, const float *sums, float *db) {
    int64_t P = g->OH * g->OW;
#pragma omp parallel for schedule(dynamic, 4) if (!sums && g->N * g->O * P >= (1 << 15))
    for (int64_t o = 0; o < g->O; o++) {
        double s = 0;
        for (int64_t i = 0; i < g->N; i++) {
            float part;
            if (sums) part = sums[i * g->O + o];
            else plane_sums(G + (i * g->O + o) * P, P, 1, &part);
            s += part;
        }
        db[o] += (float)s;
    }
}

void ct_bw_conv2d(ct_ctx *ctx, ct_node *n) {
    ct_tensor *x = n->in[0], *w = n->in[1];
    conv_geom g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[2], w->shape[3],
                   n->out->shape[2], n->out->shape[3], n->i[0], n->i[1]};
    int64_t K = g.C * g.kh * g.kw, P = g.OH * g.OW, nbmax = chunk_of(&g);
    const float *G = n->out->grad->data, *Wt = w->data;
    bool dx_fresh;
    float *dx = ct_grad_acc_fresh(ctx, x, &dx_fresh), *dw = ct_grad_acc(ctx, w);
    float *db = n->nin > 2 ? ct_grad_acc(ctx, n->in[2]) : NULL;
    /* the planes' sums, where the fused pool backward took them while writing G */
    float *sums = n->saved_t[0] ? n->saved_t[0]->data : NULL;
    /* G is the fused pooling's gradient (bw_max_pool handed it on): scattered straight into
     * the few-channel weight gradient's packing where that is all there is to compute, else
     * written out as the pool backward would have written it */
    unpool_args ua = {0};
    bool unpool = false;
    if (n->i[2]) {
        const ct_tensor *py = n->saved_t[1];
        int64_t OP = py->shape[2] * py->shape[3];
        ua = (unpool_args){G, py->data, n->saved, 0, g.O, OP, P, sums};
        unpool = !dx && dw && g.C < 16 && dw_direct(&g);
        if (!unpool) {
            float *Gd = ct_ctx_alloc(ctx, (size_t)(g.N * g.O * P) * sizeof(float));
            pool_bw_planes(G, py->data, n->saved, Gd, g.N * g.O, P, py->shape[2], py->shape[3], true, true, true, sums);
            G = Gd;
        }
    }
    if (db && !unpool) bias_grad(&g, G, sums, db);
    if (!dx && !dw) return;
    ct_conv_direct_geom dg = {g.C, g.H, g.W, g.O, g.kh, g.kw, g.p, g.OH, g.OW};
    int dnt = omp_get_max_threads();
    /* the input gradient by the direct kernel where the dcol GEMM would run on the own
     * kernel in one K block (its sums, added as col2im adds them) */
    bool dx_dir = dx && g.s == 1 && g.C >= 16 && g.O <= CT_SGEMM_KC && ct_sgemm_own_takes(K, P, g.O);
    if (dx_dir) {
        float *s = ct_ctx_alloc(ctx, ct_conv_direct_dx_scratch(&dg, dnt) * sizeof(float));
        ct_conv_direct_dx_prep(&dg, Wt, s);
        ct_conv_direct_dx(&dg, s, dnt, G, g.N, dx, dx_fresh);
        dx = NULL;
    }
    /* the weight gradient of the implicit GEMM by the direct kernel where it takes every
     * chunk (its products in its order), into dW laid out [O, kh*kw, C] meanwhile */
    bool dw_dir = dw && dw_direct(&g);
    bool dw_few = g.C < 16; /* the output channels as the vectors (conv_direct.h) */
    float *col = dx || (dw && !dw_dir) ? ct_ctx_alloc(ctx, (size_t)(K * nbmax * P + 1) * sizeof(float)) : NULL;
    float *tmp = NULL, *dtmp = NULL;
    /* samples per dcol block: about DCOL_BUDGET floats, but at least 256 columns */
    int64_t sub = DCOL_BUDGET / (K * P > 0 ? K * P : 1);
    if (sub * P < 256) sub = (256 + P - 1) / P;
    if (sub < 1) sub = 1;
    size_t dsz = dw_few ? ct_conv_direct_dws_scratch(&dg, nbmax, dnt) : ct_conv_direct_dw_scratch(&dg, nbmax);
    float *dsc = dw_dir ? ct_ctx_alloc(ctx, dsz * sizeof(float)) : NULL;
    if (dw_dir) (dw_few ? ct_conv_direct_dws_layout : ct_conv_direct_dw_layout)(&dg, dw, dsc, true);
    for (int64_t n0 = 0; n0 < g.N; n0 += nbmax) {
        int64_t nb = g.N - n0 < nbmax ? g.N - n0 : nbmax;
        /* dY of the chunk as the GEMMs' [O, nb*P]: read in place where the GEMM takes it in
         * segments (the implicit weight gradient) or where nb == 1, else gathered */
        const float *gy = G + n0 * g.O * P;
        bool dw_imp = dw && g.s == 1 && ct_sgemm_own_takes(g.O, K, nb * P);
        if (nb > 1 && dw && !dw_imp) {
            if (!tmp) tmp = ct_ctx_alloc(ctx, (size_t)(g.O * nbmax * P) * sizeof(float));
            gather_dy(&g, G, n0, nb, tmp);
            gy = tmp;
        }
        if (dw) { /* dW += dY col^T; stride 1 on the own GEMM: col^T packed straight from x (same bits) */
            if (dw_dir) {
                const float *xc = (const float *)x->data + n0 * g.C * g.H * g.W;
                ua.n0 = n0;
                if (unpool) ct_conv_direct_dws_fill(&dg, dsc, dnt, xc, NULL, nb, unpool_fill, &ua);
                else (dw_few ? ct_conv_direct_dws : ct_conv_direct_dw)(&dg, dsc, dnt, xc, gy, nb);
            } else if (dw_imp) {
                col_src cs = {&g, x->data, n0};
                ct_sgemm_implicit_b_seg(g.O, K, nb * P, gy, P, P, g.O * P, pack_col_t, &cs, 1.0f, dw, K);
            } else {
                im2col(&g, x->data, n0, nb, col);
                gemm(false, true, g.O, K, nb * P, gy, col, dw, 1.0f);
            }
        }
        if (dx) /* dcol = W^T dY, a few samples at a time so dcol is still in cache for col2im
                 * (each dcol element sums over O alone, and col2im works per sample: any split
                 * gives the same bits, as does where the block's dY is read from) */
            for (int64_t s0 = 0; s0 < nb; s0 += sub) {
                int64_t sb = nb - s0 < sub ? nb - s0 : sub;
                const float *bs = gy + s0 * P;
                int64_t ldb = nb * P;
                if (gy != tmp && sb == 1) {
                    bs = G + (n0 + s0) * g.O * P;
                    ldb = P;
                } else if (gy != tmp) {
                    if (!dtmp) dtmp = ct_ctx_alloc(ctx, (size_t)(g.O * sub * P) * sizeof(float));
                    gather_dy(&g, G, n0 + s0, sb, dtmp);
                    bs = dtmp;
                    ldb = sb * P;
                }
                ct_sgemm_ld(true, false, K, sb * P, g.O, 1.0f, Wt, K, bs, ldb, 0.0f, col, sb * P);
                col2im_add(&g, col, n0 + s0, sb, dx, dx_fresh);
            }
    }
    if (dw_dir) (dw_few ? ct_conv_direct_dws_layout : ct_conv_direct_dw_layout)(&dg, dw, dsc, false);
    if (db && unpool) bias_grad(&g, G, sums, db); /* the sums unpool_fill took */
}

/* ---- pooling ---- */
typedef struct {
    int64_t N, C, H, W, OH, OW, k, s, p;
} pool_geom;

/* Input rows [h0, h1) and columns [w0, w1) under output (oh, ow), clipped to the image
 * (padding contributes nothing to max pooling and zeros to average pooling). */
static inline void pool_window(const pool_geom *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0,
                               int64_t *w1) {
    int64_t hs = oh * g->s - g->p, ws = ow * g->s - g->p;
    *h1 = hs + g->k < g->H ? hs + g->k : g->H;
    *w1 = ws + g->k < g->W ? ws + g->k : g->W;
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
}

static pool_geom pool_setup(const char *op, const ct_tensor *x, int kernel, int stride, int padding) {
    pool_geom g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], 0, 0, kernel, 0, padding};
    int s = stride;
    ct_check_pool2d(op, x, kernel, &s, padding, &g.OH, &g.OW);
    g.s = s;
    return g;
}

#ifdef __AVX512F__
/* One output row of 2x2 / stride 2 pooling, 16 outputs a vector: the same selections as
 * the scalar loop in max_pool_plane, lane by lane. */
static void pool2x2_row(const float *r0, const float *r1, float *y, int32_t *a, int64_t OW, int32_t base, int32_t w, bool relu) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t o = 0; o < OW; o += 16) {
        int64_t rem = OW - o;
        __mmask16 m = lanes16(rem), m0 = lanes16(2 * rem), m1 = lanes16(2 * rem - 16);
        __m512 a0 = _mm512_maskz_loadu_ps(m0, r0 + 2 * o), a1 = _mm512_maskz_loadu_ps(m1, r0 + 2 * o + 16);
        __m512 b0 = _mm512_maskz_loadu_ps(m0, r1 + 2 * o), b1 = _mm512_maskz_loadu_ps(m1, r1 + 2 * o + 16);
        __m512 v[4] = {_mm512_permutex2var_ps(a0, ie, a1), _mm512_permutex2var_ps(a0, io, a1),
                       _mm512_permutex2var_ps(b0, ie, b1), _mm512_permutex2var_ps(b0, io, b1)};
        if (relu) /* max_ps(v, 0) is v > 0 ? v : 0, NaN included */
            for (int i = 0; i < 4; i++) v[i] = _mm512_max_ps(v[i], zero);
        __m512i i0 = _mm512_add_epi32(_mm512_set1_epi32(base + (int32_t)(2 * o)), ie);
        __m512i off[4] = {i0, _mm512_add_epi32(i0, _mm512_set1_epi32(1)), _mm512_add_epi32(i0, _mm512_set1_epi32(w)),
                          _mm512_add_epi32(i0, _mm512_set1_epi32(w + 1))};
        __m512 mx = v[0];
        __m512i am = off[0];
        for (int i = 1; i < 4; i++) {
            __mmask16 t = _mm512_cmp_ps_mask(v[i], mx, _CMP_GT_OQ) |
                          (_mm512_cmp_ps_mask(v[i], v[i], _CMP_UNORD_Q) & _mm512_cmp_ps_mask(mx, mx, _CMP_ORD_Q));
            mx = _mm512_mask_mov_ps(mx, t, v[i]);
            am = _mm512_mask_mov_epi32(am, t, off[i]);
        }
        _mm512_mask_storeu_ps(y + o, m, mx);
        _mm512_mask_storeu_epi32(a + o, m, am);
    }
}
#elif defined(__AVX2__)
/* The same, 8 outputs a vector */
static void pool2x2_row(const float *r0, const float *r1, float *y, int32_t *a, int64_t OW, int32_t base, int32_t w, bool relu) {
    const __m256i ie = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t o = 0; o < OW; o += 8) {
        int64_t rem = OW - o;
        __m256i m0 = lanes8(2 * rem), m1 = lanes8(2 * rem - 8);
        __m256 a0 = _mm256_maskload_ps(r0 + 2 * o, m0), a1 = _mm256_maskload_ps(r0 + 2 * o + 8, m1);
        __m256 b0 = _mm256_maskload_ps(r1 + 2 * o, m0), b1 = _mm256_maskload_ps(r1 + 2 * o + 8, m1);
        /* shuffle_ps picks evens (odds) within each 128-bit half; permute4x64 puts the halves in order */
#define CT_EVENS_(x, y) _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0x88)), 0xD8))
#define CT_ODDS_(x, y) _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0xDD)), 0xD8))
        __m256 v[4] = {CT_EVENS_(a0, a1), CT_ODDS_(a0, a1), CT_EVENS_(b0, b1), CT_ODDS_(b0, b1)};
#undef CT_EVENS_
#undef CT_ODDS_
        if (relu) /* max_ps(v, 0) is v > 0 ? v : 0, NaN included */
            for (int i = 0; i < 4; i++) v[i] = _mm256_max_ps(v[i], zero);
        __m256i i0 = _mm256_add_epi32(_mm256_set1_epi32(base + (int32_t)(2 * o)), ie);
        __m256i off[4] = {i0, _mm256_add_epi32(i0, _mm256_set1_epi32(1)), _mm256_add_epi32(i0, _mm256_set1_epi32(w)),
                          _mm256_add_epi32(i0, _mm256_set1_epi32(w + 1))};
        __m256 mx = v[0];
        __m256i am = off[0];
        for (int i = 1; i < 4; i++) {
            __m256 t = _mm256_or_ps(_mm256_cmp_ps(v[i], mx, _CMP_GT_OQ),
                                    _mm256_and_ps(_mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q), _mm256_cmp_ps(mx, mx, _CMP_ORD_Q)));
            mx = _mm256_blendv_ps(mx, v[i], t);
            am = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(am), _mm256_castsi256_ps(off[i]), t));
        }
        __m256i m = lanes8(rem);
        if (rem >= 8) {
            _mm256_storeu_ps(y + o, mx);
            _mm256_storeu_si256((__m256i *)(a + o), am);
        } else {
            _mm256_maskstore_ps(y + o, m, mx);
            _mm256_maskstore_epi32(a + o, m, am);
        }
    }
}
#endif

/* Max over each window of one plane (relu: of max(x, 0), ctrain's ReLU, which maps NaN to
 * 0), first maximum in scan order wins; without relu a NaN wins and stays (PyTorch's rule).
 * arg: the winner's offset in the plane, for backward. */
static void max_pool_plane(const pool_geom *g, const float *xp, float *yp, int32_t *ap, bool relu) {
    if (g->k == 2 && g->s == 2 && g->p == 0) {
        /* the CNN's pooling: branch-free selects over the four values (vectorises) */
        for (int64_t oh = 0; oh < g->OH; oh++) {
            const float *r0 = xp + 2 * oh * g->W, *r1 = r0 + g->W;
            float *y = yp + oh * g->OW;
            int32_t *a = ap + oh * g->OW, base = (int32_t)(2 * oh * g->W), w = (int32_t)g->W;
#if defined(__AVX512F__) || defined(__AVX2__)
            pool2x2_row(r0, r1, y, a, g->OW, base, w, relu);
            continue;
#endif
            for (int64_t ow = 0; ow < g->OW; ow++) {
                float v0 = r0[2 * ow], v1 = r0[2 * ow + 1], v2 = r1[2 * ow], v3 = r1[2 * ow + 1];
                if (relu) {
                    v0 = v0 > 0 ? v0 : 0.0f; v1 = v1 > 0 ? v1 : 0.0f;
                    v2 = v2 > 0 ? v2 : 0.0f; v3 = v3 > 0 ? v3 : 0.0f;
                }
                int32_t i = (int32_t)(2 * ow);
                float m = v0;
                int32_t am = i;
                /* take v when larger, or when v is NaN and m is not yet */
                bool t1 = v1 > m || (v1 != v1 && m == m); m = t1 ? v1 : m; am = t1 ? i + 1 : am;
                bool t2 = v2 > m || (v2 != v2 && m == m); m = t2 ? v2 : m; am = t2 ? i + w : am;
                bool t3 = v3 > m || (v3 != v3 && m == m); m = t3 ? v3 : m; am = t3 ? i + w + 1 : am;
                y[ow] = m;
                a[ow] = base + am;
            }
        }
        return;
    }
    /* the general window: the CUDA kernel's function (ops/kmath.h) */
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++)
            yp[oh * g->OW + ow] = ct_k_max_pool_at(xp, g->H, g->W, g->k, g->s, g->p, oh, ow, relu, ap + oh * g->OW + ow);
}

static ct_node *pool_record(ct_ctx *ctx, int op, ct_tensor *y, ct_tensor *x, int32_t *arg, const pool_geom *g) {
    ct_node *nd = ct_record(ctx, op, y, 1, &x);
    if (nd) {
        nd->saved = arg;
        nd->i[0] = g->k; nd->i[1] = g->s; nd->i[2] = g->p; /* backward's 2x2 fast path looks */
    }
    return nd;
}

static ct_tensor *max_pool(ct_ctx *ctx, int op, ct_tensor *x, int kernel, int stride, int padding) {
    pool_geom g = pool_setup(ct_op_table[op].name, x, kernel, stride, padding);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){g.N, g.C, g.OH, g.OW});
    int64_t planes = g.N * g.C, HW = g.H * g.W, OP = g.OH * g.OW;
    /* argmax (offset in the input plane) per output, for backward */
    int32_t *arg = ct_ctx_alloc_keep(ctx, (size_t)(planes * OP + 1) * sizeof(int32_t));
    const float *X = x->data;
    float *Y = y->data;
    bool relu = op == CT_OP_RELU_MAX_POOL2D;
    /* planes are independent: any schedule gives the same bits; dynamic so a core taken
     * by another process does not hold the other thread at the join */
#pragma omp parallel for schedule(dynamic, 16) if (planes * OP * g.k * g.k >= (1 << 15))
    for (int64_t pl = 0; pl < planes; pl++) max_pool_plane(&g, X + pl * HW, Y + pl * OP, arg + pl * OP, relu);
    pool_record(ctx, op, y, x, arg, &g);
    return y;
}

ct_tensor *ct_max_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding) {
    CT_DEV_DISPATCH(ctx, CT_OP_MAX_POOL2D, .in = {x}, .i = {kernel, stride, padding});
    CT_AUTOCAST(ctx, CT_OP_MAX_POOL2D, 1, ((ct_tensor **[]){&x}), ct_max_pool2d(ctx, x, kernel, stride, padding));
    return max_pool(ctx, CT_OP_MAX_POOL2D, x, kernel, stride, padding);
}
ct_tensor *ct_relu_max_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding) {
    CT_DEV_DISPATCH(ctx, CT_OP_RELU_MAX_POOL2D, .in = {x}, .i = {kernel, stride, padding});
    CT_AUTOCAST(ctx, CT_OP_RELU_MAX_POOL2D, 1, ((ct_tensor **[]){&x}),
                ct_relu_max_pool2d(ctx, x, kernel, stride, padding));
    return max_pool(ctx, CT_OP_RELU_MAX_POOL2D, x, kernel, stride, padding);
}

/* ---- conv2d -> ReLU -> max_pool2d ----
 * Where the direct kernel runs the whole forward, each sample's block of conv output planes
 * is pooled by the thread that computed it, from its cache: the conv output (the biggest
 * tensor of a CNN) is never written to memory nor read back. The graph is the unfused
 * one — a conv2d node whose output is that tensor, unmaterialised (no data: neither
 * backward reads it), and a relu_max_pool2d node on it — so backward and every bit are
 * those of the two ops. */
typedef struct {
    const pool_geom *g;
    float *y;
    int32_t *arg;
} pool_epi_args;

static void pool_epi(void *a, int64_t j, int64_t c0, int no, const float *planes) {
    const pool_epi_args *e = a;
    int64_t P = e->g->H * e->g->W, OP = e->g->OH * e->g->OW;
    for (int c = 0; c < no; c++) {
        int64_t pl = j * e->g->C + c0 + c;
        max_pool_plane(e->g, planes + c * P, e->y + pl * OP, e->arg + pl * OP, true);
    }
}

ct_tensor *ct_conv2d_relu_max_pool2d(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, int stride, int padding, int kernel,
                                     int pool_stride, int pool_padding) {
    /* on a device or under autocast: the ops themselves (their dispatch and casts) */
    const ct_op_args on = {.in = {x, w, b}};
    bool fuse = !ct_op_on_device(&on) && ct_autocast_dtype(ctx) == CT_F32 && x->dtype == CT_F32 && w->dtype == CT_F32 &&
                (!b || b->dtype == CT_F32);
    conv_geom g = {0};
    bool imp_full = false, imp_last = false;
    int64_t nbmax = 0;
    if (fuse) {
        g = conv_setup(x, w, b, stride, padding);
        nbmax = fw_plan(&g, &imp_full, &imp_last);
    }
    if (!fuse || !imp_full || !imp_last)
        return ct_relu_max_pool2d(ctx, ct_conv2d(ctx, x, w, b, stride, padding), kernel, pool_stride, pool_padding);
    ct_tensor *c = ct_wrap(ctx, CT_F32, NULL, 4, (int64_t[]){g.N, g.O, g.OH, g.OW});
    pool_geom pg = pool_setup(ct_op_table[CT_OP_RELU_MAX_POOL2D].name, c, kernel, pool_stride, pool_padding);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){pg.N, pg.C, pg.OH, pg.OW});
    int32_t *arg = ct_ctx_alloc_keep(ctx, (size_t)(pg.N * pg.C * pg.OH * pg.OW + 1) * sizeof(int32_t));
    ct_conv_direct_geom dg = {g.C, g.H, g.W, g.O, g.kh, g.kw, g.p, g.OH, g.OW};
    int dnt = omp_get_max_threads();
    float *dsc = direct_prep(ctx, &dg, w->data, dnt, true);
    pool_epi_args e = {&pg, y->data, arg};
    ct_conv_direct_fw_epi(&dg, dsc, dnt, x->data, b ? b->data : NULL, g.N, nbmax, NULL, pool_epi, &e);
    ct_node *cn = conv_record(ctx, c, x, w, b, stride, padding);
    ct_node *pn = pool_record(ctx, CT_OP_RELU_MAX_POOL2D, y, c, arg, &pg);
    if (cn && pn && b && (b->flags & CT_TF_REQUIRES_GRAD)) /* the pool backward sums each plane of G for the bias gradient */
        cn->saved_t[0] = pn->saved_t[0] = ct_new(ctx, CT_F32, 2, (int64_t[]){g.N, g.O});
    if (cn && pn) { /* what conv2d's backward needs to scatter G itself (bw_max_pool decides) */
        cn->saved = arg;
        cn->saved_t[1] = y;
        pn->i[3] = unpool_ok(&g, kernel, pool_stride, pool_padding) && !(x->flags & CT_TF_REQUIRES_GRAD);
    }
    return y;
}

#ifdef __AVX512F__
/* A fresh plane's gradient under 2x2 / stride 2 pooling that covers it exactly: each input
 * gets at most one output's gradient, so it is written whole, row pair by row pair, without
 * zeroing first: 0.0f + g where it won (the memset-then-add of the scalar loop), else +0. */
static void pool2x2_bw_plane(const float *gy, const float *yy, const int32_t *ap, float *gp, int64_t OH, int64_t OW, bool relu) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    const __m512i two = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512 zero = _mm512_setzero_ps();
    int32_t W = (int32_t)(2 * OW);
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t o = 0; o < OW; o += 16) {
            int64_t rem = OW - o;
            __mmask16 m = lanes16(rem), m0 = lanes16(2 * rem), m1 = lanes16(2 * rem - 16);
            int64_t q = oh * OW + o;
            __m512 g = _mm512_maskz_loadu_ps(m, gy + q);
            __m512i a = _mm512_maskz_loadu_epi32(m, ap + q);
            if (relu) m &= _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, yy + q), zero, _CMP_GT_OQ);
            __m512i p0 = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * oh) * W + (int32_t)(2 * o)), two);
            for (int r = 0; r < 2; r++) {
                __m512i pr = _mm512_add_epi32(p0, _mm512_set1_epi32(r * W));
                __m512 v0 = _mm512_maskz_add_ps(m & _mm512_cmpeq_epi32_mask(a, pr), zero, g);
                __m512 v1 = _mm512_maskz_add_ps(m & _mm512_cmpeq_epi32_mask(a, _mm512_add_epi32(pr, _mm512_set1_epi32(1))), zero, g);
                float *row = gp + (2 * oh + r) * W + 2 * o;
                _mm512_mask_storeu_ps(row, m0, _mm512_permutex2var_ps(v0, lo, v1));
                _mm512_mask_storeu_ps(row + 16, m1, _mm512_permutex2var_ps(v0, hi, v1));
            }
        }
}
#endif

/* gx[arg] += g per output (relu: only where the output is positive, as ReLU's backward
 * would pass it; everything else gets nothing, as it would get +0 there). fresh: the plane
 * is not zeroed yet (it is zeroed here, while in cache); exact2x2: non-overlapping 2x2
 * windows covering the input exactly. */
static void max_pool_bw_plane(const float *gy, const float *yy, const int32_t *ap, float *gp, int64_t HW, int64_t OH, int64_t OW,
                              bool relu, bool fresh, bool exact2x2) {
#ifdef __AVX512F__
    if (fresh && exact2x2) {
        pool2x2_bw_plane(gy, yy, ap, gp, OH, OW, relu);
        return;
    }
#endif
    (void)exact2x2;
    int64_t OP = OH * OW;
    if (fresh) memset(gp, 0, (size_t)HW * sizeof(float));
    if (relu) {
        for (int64_t q = 0; q < OP; q++)
            if (yy[q] > 0) gp[ap[q]] += gy[q];
    } else {
        for (int64_t q = 0; q < OP; q++) gp[ap[q]] += gy[q];
    }
}

static void pool_bw_planes(const float *G, const float *Y, const int32_t *arg, float *gx, int64_t planes, int64_t HW, int64_t OH,
                           int64_t OW, bool relu, bool fresh, bool exact2x2, float *sums) {
    /* blocks of 4 planes: their sums (when taken) as 4 independent add chains, from L1 */
#pragma omp parallel for schedule(dynamic, 4) if (planes * OH * OW >= (1 << 15))
    for (int64_t p0 = 0; p0 < planes; p0 += 4) {
        int64_t p1 = p0 + 4 < planes ? p0 + 4 : planes;
        for (int64_t pl = p0; pl < p1; pl++)
            max_pool_bw_plane(G + pl * OH * OW, Y + pl * OH * OW, arg + pl * OH * OW, gx + pl * HW, HW, OH, OW, relu, fresh, exact2x2);
        if (sums) plane_sums(gx + p0 * HW, HW, p1 - p0, sums + p0);
    }
}

static void bw_max_pool(ct_ctx *ctx, ct_node *n, bool relu) {
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    if (!gx) return;
    const ct_tensor *x = n->in[0], *y = n->out;
    int64_t planes = x->shape[0] * x->shape[1], HW = x->shape[2] * x->shape[3], OH = y->shape[2], OW = y->shape[3];
    const float *G = y->grad->data, *Y = y->data;
    const int32_t *arg = n->saved;
    /* fused after conv2d: each finished plane's sum, for conv2d's bias gradient */
    float *sums = n->saved_t[0] ? n->saved_t[0]->data : NULL;
    bool exact2x2 = n->i[0] == 2 && n->i[1] == 2 && n->i[2] == 0 && x->shape[2] == 2 * OH && x->shape[3] == 2 * OW;
    if (n->i[3] && relu && fresh && exact2x2) {
        /* fused after conv2d, whose weight gradient scatters G itself (unpool_fill): hand it
         * the pooled gradient (this node's is released once it returns), not G */
        memcpy(gx, G, (size_t)(planes * OH * OW) * sizeof(float));
        x->node->i[2] = 1;
        return;
    }
    pool_bw_planes(G, Y, arg, gx, planes, HW, OH, OW, relu, fresh, exact2x2, sums);
}
void ct_bw_max_pool2d(ct_ctx *ctx, ct_node *n) { bw_max_pool(ctx, n, false); }
void ct_bw_relu_max_pool2d(ct_ctx *ctx, ct_node *n) { bw_max_pool(ctx, n, true); }

ct_tensor *ct_avg_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding) {
    CT_DEV_DISPATCH(ctx, CT_OP_AVG_POOL2D, .in = {x}, .i = {kernel, stride, padding});
    CT_AUTOCAST(ctx, CT_OP_AVG_POOL2D, 1, ((ct_tensor **[]){&x}), ct_avg_pool2d(ctx, x, kernel, stride, padding));
    pool_geom g = pool_setup("avg_pool2d", x, kernel, stride, padding);
    ct_tensor *y = ct_new(ctx, CT_F32, 4, (int64_t[]){g.N, g.C, g.OH, g.OW});
    int64_t planes = g.N * g.C, HW = g.H * g.W, OP = g.OH * g.OW;
    /* count_include_pad=True, ceil_mode=False: every window counts k*k elements */
    float inv = 1.0f / (float)(g.k * g.k);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (planes * OP * g.k * g.k >= (1 << 15))
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = X + pl * HW;
        for (int64_t oh = 0; oh < g.OH; oh++)
            for (int64_t ow = 0; ow < g.OW; ow++) {
                int64_t h0, h1, w0, w1;
                pool_window(&g, oh, ow, &h0, &h1, &w0, &w1);
                float s = 0;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) s += xp[ih * g.W + iw];
                Y[pl * OP + oh * g.OW + ow] = s * inv;
            }
    }
    ct_node *nd = ct_record(ctx, CT_OP_AVG_POOL2D, y, 1, &x);
    if (nd) { nd->i[0] = g.k; nd->i[1] = g.s; nd->i[2] = g.p; }
    return y;
}
void ct_bw_avg_pool2d(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    const ct_tensor *x = n->in[0], *y = n->out;
    int64_t k = n->i[0], s = n->i[1], p = n->i[2];
    int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3], OH = y->shape[2], OW = y->shape[3];
    const float *G = y->grad->data;
    float inv = 1.0f / (float)(k * k);
#pragma omp parallel for if (planes * OH * OW * k * k >= (1 << 15))
    for (int64_t pl = 0; pl < planes; pl++) {
        float *xp = gx + pl * H * W;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0 = oh * s - p, w0 = ow * s - p;
                int64_t h1 = h0 + k < H ? h0 + k : H, w1 = w0 + k < W ? w0 + k : W;
                h0 = h0 < 0 ? 0 : h0;
                w0 = w0 < 0 ? 0 : w0;
                float gv = G[(pl * OH + oh) * OW + ow] * inv;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) xp[ih * W + iw] += gv;
            }
    }
}
