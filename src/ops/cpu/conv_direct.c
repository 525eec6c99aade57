/* Direct stride-1 conv2d forward on AVX-512: see conv_direct.h. Each 14 x 32 register tile
 * (one output row's pixels x output channels) runs the K = C*kh*kw products in order, K
 * blocks of CT_SGEMM_KC as the GEMM kernel does (C = acc for the first block, acc + C after
 * it), then goes out to NCHW through 16x16 transposes with the bias. The 14 values
 * broadcast per k are input pixels off[k] + 0..13 of the padded sample (off[k] is kernel
 * offset k's shift), the 32-wide vectors the packed weights [k][32]. */
#include "ops/cpu/conv_direct.h"

#include <omp.h>
#include <stdbool.h>
#include <string.h>

#include "ops/cpu/avx512.h"
#include "ops/cpu/sgemm.h"

#define TP 14 /* output pixels per tile (along a row) */
#define TO 32 /* output channels per tile: two vectors */
#define KB CT_SGEMM_KC

static int64_t up16(int64_t n) { return (n + 15) / 16 * 16; }
static int64_t ntiles_o(const ct_conv_direct_geom *g) { return (g->O + TO - 1) / TO; }
static int64_t k_of(const ct_conv_direct_geom *g) { return g->C * g->kh * g->kw; }
/* padded sample, plus slack: the last tile of a row reads up to TP - 1 pixels past it */
static int64_t xpad_floats(const ct_conv_direct_geom *g) {
    return up16(g->C * (g->H + 2 * g->p) * (g->W + 2 * g->p) + TP + 2);
}

/* per thread: the padded sample, and with an epilogue its channel tile's output planes */
static int64_t thread_floats(const ct_conv_direct_geom *g, bool epi) { return xpad_floats(g) + (epi ? up16(TO * g->OH * g->OW) : 0); }

size_t ct_conv_direct_scratch(const ct_conv_direct_geom *g, int nthreads, bool epi) {
    int64_t K = k_of(g);
    return (size_t)(up16(ntiles_o(g) * K * TO) + up16(K) + (nthreads < 1 ? 1 : nthreads) * thread_floats(g, epi));
}

void ct_conv_direct_prep(const ct_conv_direct_geom *g, const float *w, float *scratch) {
    int64_t K = k_of(g), nt = ntiles_o(g), Hp = g->H + 2 * g->p, Wp = g->W + 2 * g->p;
    float *wp = scratch;
    /* every step, in the serial part of the forward (the other threads waiting): in parallel
     * where big (the CNN's second layer: 51k strided reads) */
#pragma omp parallel for collapse(2) schedule(static) if (nt * K * TO >= (1 << 15))
    for (int64_t t = 0; t < nt; t++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t c = 0; c < TO; c++) {
                int64_t o = t * TO + c;
                wp[(t * K + k) * TO + c] = o < g->O ? w[o * K + k] : 0.0f;
            }
    int32_t *off = (int32_t *)(scratch + up16(nt * K * TO));
    for (int64_t k = 0; k < K; k++) {
        int64_t c = k / (g->kh * g->kw), ki = (k / g->kw) % g->kh, kj = k % g->kw;
        off[k] = (int32_t)(c * Hp * Wp + ki * Wp + kj);
    }
}

/* acc[i][..] = sum over steps s < n of a_s[i] w[s][0..TO), a_s = a + off[s] (or a + s * os
 * without off), in order: the GEMM kernel's multiply-adds with the roles of its operands
 * swapped (the same products) */
CT_AVX512 static inline __attribute__((always_inline)) void tile_sum(const float *a, const int32_t *off, int64_t os, const float *w,
                                                                     int64_t n, __m512 acc[TP][2]) {
#pragma GCC unroll 14
    for (int i = 0; i < TP; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t s = 0; s < n; s++) {
        const float *as = a + (off ? off[s] : s * os);
        /* opaque to the optimiser, so the 14 loads below are as + constant offsets (gcc
         * otherwise keeps an index register per load, spilling) */
        __asm__("" : "+r"(as));
        __m512 b0 = _mm512_loadu_ps(w + s * TO), b1 = _mm512_loadu_ps(w + s * TO + 16);
#pragma GCC unroll 14
        for (int i = 0; i < TP; i++) {
            __m512 ai = _mm512_set1_ps(as[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
}

/* T[i][0..TO) = sum_k x[off[k] + i] wp[k][..] for the TP pixels i, in K blocks */
CT_AVX512 static void tile(const float *xa, const int32_t *off, const float *wp, int64_t K, float *T) {
    for (int64_t pc = 0; pc < K; pc += KB) {
        __m512 acc[TP][2];
        tile_sum(xa, off + pc, 0, wp + pc * TO, K - pc < KB ? K - pc : KB, acc);
#pragma GCC unroll 14
        for (int i = 0; i < TP; i++)
            for (int v = 0; v < 2; v++) {
                __m512 r = acc[i][v];
                if (pc > 0) r = _mm512_add_ps(r, _mm512_loadu_ps(T + i * TO + 16 * v));
                _mm512_storeu_ps(T + i * TO + 16 * v, r);
            }
    }
}

/* y[c * P + i] = T[i][c] (+ b[c], or + 0.0f where add0) for pixels i < mr, channels c < no:
 * the additions of conv.c's copy-out, in its operand order */
CT_AVX512 static void store_tile(const float *T, int mr, int no, float *y, int64_t P, const float *b, bool add0) {
    __mmask16 m = (__mmask16)((1u << mr) - 1);
    for (int v = 0; v < 2 && 16 * v < no; v++) {
        __m512 r[16];
        for (int i = 0; i < 16; i++) r[i] = i < TP ? _mm512_loadu_ps(T + i * TO + 16 * v) : _mm512_setzero_ps();
        ct_tr16(r);
        for (int c = 0; c < 16 && 16 * v + c < no; c++) {
            __m512 o = r[c];
            if (b) o = _mm512_add_ps(o, _mm512_set1_ps(b[16 * v + c]));
            else if (add0) o = _mm512_add_ps(o, _mm512_setzero_ps());
            _mm512_mask_storeu_ps(y + (16 * v + c) * P, m, o);
        }
    }
}

/* n planes h x w into the interior of zeroed planes Hd x Wd at (top, left) (the border
 * stays zero) */
static void pad_planes(const float *src, int64_t n, int64_t h, int64_t w, float *dst, int64_t Hd, int64_t Wd, int64_t top, int64_t left) {
    for (int64_t c = 0; c < n; c++)
        for (int64_t r = 0; r < h; r++) memcpy(dst + (c * Hd + r + top) * Wd + left, src + (c * h + r) * w, (size_t)w * sizeof(float));
}

/* Runs fn(arg, item, buf, &have) for items [0, n) on up to nthreads threads (dynamic: any
 * schedule gives the same bits, the items writing disjoint outputs), each thread with its
 * own zeroed buffer of bsz floats at bufs; have (-1 at first) is fn's note of which sample
 * the buffer holds. */
typedef void (*item_fn)(const void *arg, int64_t item, float *buf, int64_t *have);
static void run_items(int nthreads, int64_t n, float *bufs, int64_t bsz, item_fn fn, const void *arg) {
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && n > 1)
    {
        float *buf = bufs + omp_get_thread_num() * bsz;
        int64_t have = -1;
        memset(buf, 0, (size_t)bsz * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n; it++) fn(arg, it, buf, &have);
    }
}

typedef struct {
    const ct_conv_direct_geom *g;
    const float *wp, *x, *b;
    const int32_t *off;
    int64_t nb, chunk;
    float *y;
    ct_conv_direct_epi epi;
    void *epi_arg;
} fw_args;

/* item (sample j, channel tile t): every output row's tiles */
static void fw_item(const void *arg, int64_t it, float *xp, int64_t *have) {
    const fw_args *f = arg;
    const ct_conv_direct_geom *g = f->g;
    int64_t K = k_of(g), nt = ntiles_o(g), P = g->OH * g->OW, Hp = g->H + 2 * g->p, Wp = g->W + 2 * g->p;
    int64_t j = it / nt, t = it % nt, c0 = t * TO;
    if (j != *have) {
        pad_planes(f->x + j * g->C * g->H * g->W, g->C, g->H, g->W, xp, Hp, Wp, g->p, g->p);
        *have = j;
    }
    int64_t s0 = j - j % f->chunk;
    bool add0 = (f->nb - s0 < f->chunk ? f->nb - s0 : f->chunk) > 1;
    int no = (int)(g->O - c0 < TO ? g->O - c0 : TO);
    /* with an epilogue the tile's planes go to the thread's buffer (after the padded
     * sample), still in cache when the epilogue reads them */
    float T[TP * TO], *yt = f->epi ? xp + xpad_floats(g) : f->y + (j * g->O + c0) * P;
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow += TP) {
            int mr = (int)(g->OW - ow < TP ? g->OW - ow : TP);
            tile(xp + oh * Wp + ow, f->off, f->wp + t * K * TO, K, T);
            store_tile(T, mr, no, yt + oh * g->OW + ow, P, f->b ? f->b + c0 : NULL, add0);
        }
    if (f->epi) f->epi(f->epi_arg, j, c0, no, yt);
}

void ct_conv_direct_fw_epi(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *b, int64_t nb,
                           int64_t chunk, float *y, ct_conv_direct_epi epi, void *epi_arg) {
    int64_t K = k_of(g), nt = ntiles_o(g);
    fw_args f = {g, scratch, x, b, (const int32_t *)(scratch + up16(nt * K * TO)), nb, chunk < 1 ? 1 : chunk, y, epi, epi_arg};
    run_items(nthreads, nb * nt, scratch + up16(nt * K * TO) + up16(K), thread_floats(g, epi != NULL), fw_item, &f);
}
void ct_conv_direct_fw(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *b, int64_t nb,
                       int64_t chunk, float *y) {
    ct_conv_direct_fw_epi(g, scratch, nthreads, x, b, nb, chunk, y, NULL, NULL);
}

/* ---- weight gradient ----
 * scratch: dW as [O][KK][C] | dY of the chunk packed [o panel][q][TP] | x channels-last
 * padded [nb][Hp][Wp][C] | each pixel q's offset in it (int32) */
static int64_t npan_o(const ct_conv_direct_geom *g) { return (g->O + TP - 1) / TP; }
static int64_t dw_part(const ct_conv_direct_geom *g, int64_t nb, int i) {
    int64_t Q = nb * g->OH * g->OW, Hp = g->H + 2 * g->p, Wp = g->W + 2 * g->p;
    int64_t sz[4] = {up16(g->O * k_of(g)), up16(npan_o(g) * Q * TP), up16(nb * Hp * Wp * g->C), up16(Q)};
    int64_t at = 0;
    for (int j = 0; j < i; j++) at += sz[j];
    return at;
}
size_t ct_conv_direct_dw_scratch(const ct_conv_direct_geom *g, int64_t nbmax) { return (size_t)dw_part(g, nbmax, 4); }

void ct_conv_direct_dw_layout(const ct_conv_direct_geom *g, float *dw, float *scratch, bool to_scratch) {
    int64_t KK = g->kh * g->kw;
#pragma omp parallel for schedule(static) if (g->O * g->C * KK >= (1 << 15)) /* as ct_conv_direct_prep */
    for (int64_t o = 0; o < g->O; o++)
        for (int64_t c = 0; c < g->C; c++)
            for (int64_t kk = 0; kk < KK; kk++) {
                float *a = &dw[(o * g->C + c) * KK + kk], *b = &scratch[(o * KK + kk) * g->C + c];
                if (to_scratch) *b = *a;
                else *a = *b;
            }
}

/* t[i][c] += sum over the kc pixels q of a[q][i] x[qo[q] + c], i < mr, c < 16 * nv (lanes
 * m0, m1; nv = 1: the first vector only); each row's block sum added as the GEMM's store
 * does (acc + C) */
CT_AVX512 static inline __attribute__((always_inline)) void dw_tile_mr(int mr, int nv, int64_t kc, const float *a, const float *xb,
                                                                       const int32_t *qo, __mmask16 m0, __mmask16 m1, float *t,
                                                                       int64_t ldt, bool a_by_q) {
    __m512 acc[TP][2];
#pragma GCC unroll 14
    for (int i = 0; i < TP; i++)
        if (i < mr) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t q = 0; q < kc; q++) {
        const float *xq = xb + qo[q];
        __m512 b0 = _mm512_maskz_loadu_ps(m0, xq), b1 = nv > 1 ? _mm512_maskz_loadu_ps(m1, xq + 16) : b0;
#pragma GCC unroll 14
        for (int i = 0; i < TP; i++)
            if (i < mr) {
                __m512 ai = _mm512_set1_ps(a_by_q ? a[qo[q] + i] : a[q * TP + i]);
                acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
                if (nv > 1) acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
            }
    }
#pragma GCC unroll 14
    for (int i = 0; i < TP; i++)
        if (i < mr) {
            _mm512_mask_storeu_ps(t + i * ldt, m0, _mm512_add_ps(acc[i][0], _mm512_maskz_loadu_ps(m0, t + i * ldt)));
            if (nv > 1)
                _mm512_mask_storeu_ps(t + i * ldt + 16, m1, _mm512_add_ps(acc[i][1], _mm512_maskz_loadu_ps(m1, t + i * ldt + 16)));
        }
}
CT_AVX512 static void dw_tile14(int64_t kc, const float *a, const float *xb, const int32_t *qo, __mmask16 m0, __mmask16 m1, float *t,
                                int64_t ldt) {
    dw_tile_mr(TP, 2, kc, a, xb, qo, m0, m1, t, ldt, false);
}
CT_AVX512 static void dw_tile8(int64_t kc, const float *a, const float *xb, const int32_t *qo, __mmask16 m0, __mmask16 m1, float *t,
                               int64_t ldt) {
    dw_tile_mr(8, 2, kc, a, xb, qo, m0, m1, t, ldt, false);
}
CT_AVX512 static void dw_tile_any(int mr, int64_t kc, const float *a, const float *xb, const int32_t *qo, __mmask16 m0, __mmask16 m1,
                                  float *t, int64_t ldt) {
    dw_tile_mr(mr, 2, kc, a, xb, qo, m0, m1, t, ldt, false);
}

/* sample j's dY [O][P] into the panels: dyp[(panel * Q + j * P + p) * TP + i] = dY[o0 + i][p],
 * 16 pixels at a time through a transpose */
CT_AVX512 static void pack_dy(const ct_conv_direct_geom *g, const float *dys, int64_t j, int64_t Q, float *dyp) {
    int64_t P = g->OH * g->OW;
    for (int64_t pn = 0; pn < npan_o(g); pn++) {
        int64_t o0 = pn * TP;
        int rows = (int)(g->O - o0 < TP ? g->O - o0 : TP);
        for (int64_t p0 = 0; p0 < P; p0 += 16) {
            int n = (int)(P - p0 < 16 ? P - p0 : 16);
            __mmask16 m = (__mmask16)((1u << n) - 1);
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = i < rows ? _mm512_maskz_loadu_ps(m, dys + (o0 + i) * P + p0) : _mm512_setzero_ps();
            ct_tr16(r);
            float *d = dyp + (pn * Q + j * P + p0) * TP;
            for (int qq = 0; qq < n; qq++) _mm512_mask_storeu_ps(d + qq * TP, (__mmask16)((1u << TP) - 1), r[qq]);
        }
    }
}

void ct_conv_direct_dw(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *dy, int64_t nb) {
    int64_t KK = g->kh * g->kw, C = g->C, P = g->OH * g->OW, Q = nb * P, Hp = g->H + 2 * g->p, Wp = g->W + 2 * g->p;
    int64_t nct = (C + TO - 1) / TO, items = KK * nct, npan = npan_o(g);
    float *dwp = scratch, *dyp = scratch + dw_part(g, nb, 1), *xn = scratch + dw_part(g, nb, 2);
    int32_t *qoff = (int32_t *)(scratch + dw_part(g, nb, 3));
    if (nthreads < 1) nthreads = 1;
    int64_t nsplit = nthreads > 1 ? (items < nthreads ? items : nthreads) : 0, nwhole = items - nsplit;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        /* per sample: the channels-last padded copy, the pixels' offsets, dY into panels */
#pragma omp for schedule(dynamic, 1)
        for (int64_t j = 0; j < nb; j++) {
            float *xs = xn + j * Hp * Wp * C;
            memset(xs, 0, (size_t)(Hp * Wp * C) * sizeof(float));
            for (int64_t c = 0; c < C; c++)
                for (int64_t h = 0; h < g->H; h++)
                    for (int64_t w = 0; w < g->W; w++) xs[((h + g->p) * Wp + w + g->p) * C + c] = x[((j * C + c) * g->H + h) * g->W + w];
            for (int64_t oh = 0; oh < g->OH; oh++)
                for (int64_t ow = 0; ow < g->OW; ow++) qoff[j * P + oh * g->OW + ow] = (int32_t)(((j * Hp + oh) * Wp + ow) * C);
            pack_dy(g, dy + j * g->O * P, j, Q, dyp);
        }
        /* items (kernel offset, 32 channels) own disjoint columns of dW: any schedule. The
         * last nsplit go a panel of output channels at a time, so that the threads end
         * together (the CNN's second layer has 25 items: 13 and 12 on 2 threads). */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < nwhole + nsplit * npan; it++) {
            int64_t u = it < nwhole ? it : nwhole + (it - nwhole) / npan;
            int64_t pn0 = it < nwhole ? 0 : (it - nwhole) % npan, pn1 = it < nwhole ? npan : pn0 + 1;
            int64_t kk = u / nct, c0 = (u % nct) * TO, ki = kk / g->kw, kj = kk % g->kw;
            int64_t nc = C - c0 < TO ? C - c0 : TO;
            __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xFFFF : (1u << nc) - 1);
            __mmask16 m1 = (__mmask16)(nc >= 32 ? 0xFFFF : nc <= 16 ? 0 : (1u << (nc - 16)) - 1);
            const float *xb = xn + (ki * Wp + kj) * C + c0;
            for (int64_t pc = 0; pc < Q; pc += KB) {
                int64_t kc = Q - pc < KB ? Q - pc : KB;
                for (int64_t pn = pn0; pn < pn1; pn++) {
                    int64_t o0 = pn * TP;
                    int mr = (int)(g->O - o0 < TP ? g->O - o0 : TP);
                    const float *a = dyp + (pn * Q + pc) * TP;
                    float *t = dwp + (o0 * KK + kk) * C + c0;
                    if (mr == TP) dw_tile14(kc, a, xb, qoff + pc, m0, m1, t, KK * C);
                    else if (mr == 8) dw_tile8(kc, a, xb, qoff + pc, m0, m1, t, KK * C);
                    else dw_tile_any(mr, kc, a, xb, qoff + pc, m0, m1, t, KK * C);
                }
            }
        }
    }
}

/* ---- input gradient ----
 * scratch: W packed [channel tile][kk][O][32] | per thread dY of a sample padded by kh-1
 * rows and kw-1 columns each side, so every shifted read stays inside */
static int64_t dyq_floats(const ct_conv_direct_geom *g) {
    return up16(g->O * (g->OH + 2 * (g->kh - 1)) * (g->OW + 2 * (g->kw - 1)) + TP + 2);
}
static int64_t nct_of(const ct_conv_direct_geom *g) { return (g->C + TO - 1) / TO; }
size_t ct_conv_direct_dx_scratch(const ct_conv_direct_geom *g, int nthreads) {
    return (size_t)(up16(nct_of(g) * g->kh * g->kw * g->O * TO) + (nthreads < 1 ? 1 : nthreads) * dyq_floats(g));
}
void ct_conv_direct_dx_prep(const ct_conv_direct_geom *g, const float *w, float *scratch) {
    int64_t KK = g->kh * g->kw, nct = nct_of(g);
#pragma omp parallel for collapse(2) schedule(static) if (nct * KK * g->O * TO >= (1 << 15)) /* as ct_conv_direct_prep */
    for (int64_t t = 0; t < nct; t++)
        for (int64_t kk = 0; kk < KK; kk++)
            for (int64_t o = 0; o < g->O; o++)
                for (int64_t c = 0; c < TO; c++) {
                    int64_t ch = t * TO + c;
                    scratch[((t * KK + kk) * g->O + o) * TO + c] = ch < g->C ? w[(o * g->C + ch) * KK + kk] : 0.0f;
                }
}

/* T[i] += sum_o a[o * os + i] wv[o][..] for the pixels i in `valid` (one kernel offset's
 * dcol values, summed over o as the GEMM does, then added as col2im adds: T + dcol) */
CT_AVX512 static void dx_tile(const float *a, int64_t os, const float *wv, int64_t O, float *T, unsigned valid) {
    __m512 acc[TP][2];
    tile_sum(a, NULL, os, wv, O, acc);
#pragma GCC unroll 14
    for (int i = 0; i < TP; i++)
        if (valid >> i & 1u)
            for (int v = 0; v < 2; v++)
                _mm512_storeu_ps(T + i * TO + 16 * v, _mm512_add_ps(_mm512_loadu_ps(T + i * TO + 16 * v), acc[i][v]));
}

typedef struct {
    const ct_conv_direct_geom *g;
    const float *wq, *dy;
    float *dx;
    bool fresh;
} dx_args;

/* item (sample j, 32 input channels): every input row's tiles, kernel offsets in order */
static void dx_item(const void *arg, int64_t it, float *dq, int64_t *have) {
    const dx_args *d = arg;
    const ct_conv_direct_geom *g = d->g;
    int64_t KK = g->kh * g->kw, nct = nct_of(g), P = g->OH * g->OW, HW = g->H * g->W;
    int64_t Hq = g->OH + 2 * (g->kh - 1), Wq = g->OW + 2 * (g->kw - 1);
    int64_t j = it / nct, c0 = (it % nct) * TO;
    int nc = (int)(g->C - c0 < TO ? g->C - c0 : TO);
    if (j != *have) {
        pad_planes(d->dy + j * g->O * P, g->O, g->OH, g->OW, dq, Hq, Wq, g->kh - 1, g->kw - 1);
        *have = j;
    }
    float *dxs = d->dx + (j * g->C + c0) * HW, T[TP * TO];
    for (int64_t ih = 0; ih < g->H; ih++)
        for (int64_t iw = 0; iw < g->W; iw += TP) {
            int mr = (int)(g->W - iw < TP ? g->W - iw : TP);
            for (int i = 0; i < TP; i++)
                for (int c = 0; c < TO; c++) T[i * TO + c] = d->fresh || i >= mr || c >= nc ? 0.0f : dxs[c * HW + ih * g->W + iw + i];
            for (int64_t kk = 0; kk < KK; kk++) {
                int64_t ki = kk / g->kw, kj = kk % g->kw, oh = ih + g->p - ki;
                if (oh < 0 || oh >= g->OH) continue;
                unsigned valid = 0;
                for (int i = 0; i < mr; i++) {
                    int64_t ow = iw + i + g->p - kj;
                    if (ow >= 0 && ow < g->OW) valid |= 1u << i;
                }
                if (!valid) continue;
                dx_tile(dq + (oh + g->kh - 1) * Wq + iw + g->p - kj + g->kw - 1, Hq * Wq, d->wq + (it % nct * KK + kk) * g->O * TO, g->O,
                        T, valid);
            }
            store_tile(T, mr, nc, dxs + ih * g->W + iw, HW, NULL, false);
        }
}

void ct_conv_direct_dx(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *dy, int64_t nb, float *dx, bool fresh) {
    dx_args d = {g, scratch, dy, dx, fresh};
    int64_t nct = nct_of(g);
    run_items(nthreads, nb * nct, scratch + up16(nct * g->kh * g->kw * g->O * TO), dyq_floats(g), dx_item, &d);
}

/* ---- weight gradient for few input channels (C < 16: a CNN's first layer) ----
 * The GEMM dW += dY col^T with the roles of the channels-last kernel above swapped: the
 * vectors are 32 output channels of dY, the 14 broadcast values per pixel 14 of col^T's
 * K = C*kh*kw columns; dW accumulates as dW^T [o tile][K][32]. Each output still sums the
 * chunk's pixels in order, in KB blocks added to dW (dw_tile_mr), so the products and sums
 * are the GEMM's. The operands are packed sample by sample, per pixel a record of dY's O
 * channels (rounded up to 32) and the K columns (rounded up to 14), into a per-thread ring
 * of RING pixels, and each block runs as soon as its pixels are in: the packed operands
 * stay in cache instead of going to memory for the whole chunk.
 * scratch: dW^T | off[k] (int32) | per thread: padded sample, ring, each pixel's record
 * offset in the ring (int32) */
#define RING(P) (KB + (P))
static int64_t nkp_of(const ct_conv_direct_geom *g) { return (k_of(g) + TP - 1) / TP; }
static int64_t rec_of(const ct_conv_direct_geom *g) { return ntiles_o(g) * TO + nkp_of(g) * TP; }
static int64_t dws_thread(const ct_conv_direct_geom *g, int64_t nb) {
    int64_t P = g->OH * g->OW;
    return xpad_floats(g) + up16(RING(P) * rec_of(g)) + up16(nb * P);
}
static int64_t dws_head(const ct_conv_direct_geom *g) { return up16(ntiles_o(g) * k_of(g) * TO) + up16(k_of(g)); }
size_t ct_conv_direct_dws_scratch(const ct_conv_direct_geom *g, int64_t nbmax, int nthreads) {
    return (size_t)(dws_head(g) + (nthreads < 1 ? 1 : nthreads) * dws_thread(g, nbmax));
}

void ct_conv_direct_dws_layout(const ct_conv_direct_geom *g, float *dw, float *scratch, bool to_scratch) {
    int64_t K = k_of(g), nto = ntiles_o(g);
    for (int64_t t = 0; t < nto; t++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t c = 0; c < TO; c++) {
                int64_t o = t * TO + c;
                float *s = &scratch[(t * K + k) * TO + c];
                if (to_scratch) *s = o < g->O ? dw[o * K + k] : 0.0f;
                else if (o < g->O) dw[o * K + k] = *s;
            }
}

/* 16 rows (i < nrows, n floats each) transposed: lane i of dst + doff[qq] gets row i's
 * element qq, for qq < n (lanes under smask stored) */
CT_AVX512 static void tr_rows(const float *const *rows, int nrows, int n, float *dst, const int32_t *doff, __mmask16 smask) {
    __mmask16 m = (__mmask16)((1u << n) - 1);
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = i < nrows ? _mm512_maskz_loadu_ps(m, rows[i]) : _mm512_setzero_ps();
    ct_tr16(r);
    for (int qq = 0; qq < n; qq++) _mm512_mask_storeu_ps(dst + doff[qq], smask, r[qq]);
}

/* sample j into the ring (records at ring + qo[p]): col^T's panels [kp0, kp1) from the
 * padded sample xp, and (dys not NULL) dY [O][P]'s channels [o0, o1) (o0 a multiple of 16) */
CT_AVX512 static void dws_pack(const ct_conv_direct_geom *g, const float *dys, int64_t o0, int64_t o1, const float *xp, const int32_t *off,
                               int64_t kp0, int64_t kp1, float *ring, const int32_t *qo) {
    int64_t P = g->OH * g->OW, K = k_of(g), Wp = g->W + 2 * g->p, xo = ntiles_o(g) * TO;
    const float *rows[16];
    for (int64_t oc = o0; oc < o1 && dys; oc += 16) {
        int nr = (int)(o1 - oc < 16 ? o1 - oc : 16);
        for (int64_t p0 = 0; p0 < P; p0 += 16) {
            for (int i = 0; i < nr; i++) rows[i] = dys + (oc + i) * P + p0;
            tr_rows(rows, nr, (int)(P - p0 < 16 ? P - p0 : 16), ring + oc, qo + p0, 0xFFFF);
        }
    }
    for (int64_t kp = kp0; kp < kp1; kp++) {
        int64_t k0 = kp * TP;
        int nr = (int)(K - k0 < TP ? K - k0 : TP);
        for (int64_t oh = 0; oh < g->OH; oh++)
            for (int64_t ow = 0; ow < g->OW; ow += 16) {
                for (int i = 0; i < nr; i++) rows[i] = xp + off[k0 + i] + oh * Wp + ow;
                tr_rows(rows, nr, (int)(g->OW - ow < 16 ? g->OW - ow : 16), ring + xo + k0, qo + oh * g->OW + ow,
                        (__mmask16)((1u << TP) - 1));
            }
    }
}

/* one panel's tile: mr < TP rows, nv vectors (constants in each instance) */
CT_AVX512 static void dws_tile(int mr, int nv, int64_t kc, const float *a, const float *b, const int32_t *qo, __mmask16 m0, __mmask16 m1,
                               float *t) {
    if (nv > 1) {
        if (mr == TP) dw_tile_mr(TP, 2, kc, a, b, qo, m0, m1, t, TO, true);
        else dw_tile_mr(mr, 2, kc, a, b, qo, m0, m1, t, TO, true);
    } else {
        if (mr == TP) dw_tile_mr(TP, 1, kc, a, b, qo, m0, m1, t, TO, true);
        else dw_tile_mr(mr, 1, kc, a, b, qo, m0, m1, t, TO, true);
    }
}

void ct_conv_direct_dws(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *dy, int64_t nb) {
    ct_conv_direct_dws_fill(g, scratch, nthreads, x, dy, nb, NULL, NULL);
}
void ct_conv_direct_dws_fill(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *dy, int64_t nb,
                             ct_conv_direct_dy_fn fill, void *fill_arg) {
    int64_t K = k_of(g), P = g->OH * g->OW, Q = nb * P, nto = ntiles_o(g), nkp = nkp_of(g), Hp = g->H + 2 * g->p, Wp = g->W + 2 * g->p;
    int64_t rs = rec_of(g), xo = nto * TO;
    float *dwT = scratch;
    int32_t *off = (int32_t *)(scratch + up16(nto * K * TO));
    for (int64_t k = 0; k < K; k++) {
        int64_t c = k / (g->kh * g->kw), ki = (k / g->kw) % g->kh, kj = k % g->kw;
        off[k] = (int32_t)(c * Hp * Wp + ki * Wp + kj);
    }
    if (nthreads < 1) nthreads = 1;
    /* An item: cw output channels x kpg panels, packing the samples' col^T panels and dY
     * channels it needs. One thread: 32 channels x every panel (each sample packed once
     * per 32 channels). More: 16 channels x every panel where that gives each thread an
     * item: the items are equal (K's panels are not: 14 and 11 columns at K = 25) and dY is
     * packed once (a panel per item packs or fills all of dY per panel); else 32 channels x
     * a panel. */
    int64_t cw = TO, kpg = nkp;
    if (nthreads > 1 && (g->O + 15) / 16 >= nthreads) cw = 16;
    else if (nthreads > 1) kpg = 1;
    int64_t npi = nkp / kpg, items = (g->O + cw - 1) / cw * npi;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        float *xp = scratch + dws_head(g) + omp_get_thread_num() * dws_thread(g, nb), *ring = xp + xpad_floats(g);
        int32_t *qo = (int32_t *)(ring + up16(RING(P) * rs));
        memset(xp, 0, (size_t)xpad_floats(g) * sizeof(float));
        for (int64_t q = 0; q < Q; q++) qo[q] = (int32_t)(q % RING(P) * rs);
        /* items own disjoint parts of dW: any schedule */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t c0 = it / npi * cw, kp0 = it % npi * kpg, no = g->O - c0 < cw ? g->O - c0 : cw;
            int nv = cw > 16 && no > 16 ? 2 : 1;
            __mmask16 m0 = (__mmask16)(no >= 16 ? 0xFFFF : (1u << no) - 1);
            __mmask16 m1 = (__mmask16)(no >= 32 ? 0xFFFF : no <= 16 ? 0 : (1u << (no - 16)) - 1);
            int64_t pc = 0;
            for (int64_t j = 0; j < nb; j++) {
                /* sample j's pixels go where no pixel of an unfinished block is: fewer than
                 * KB of those, then P new ones, in a ring of KB + P */
                pad_planes(x + j * g->C * g->H * g->W, g->C, g->H, g->W, xp, Hp, Wp, g->p, g->p);
                dws_pack(g, fill ? NULL : dy + j * g->O * P, c0, c0 + no, xp, off, kp0, kp0 + kpg, ring, qo + j * P);
                if (fill) fill(fill_arg, j, ring, qo + j * P, c0, c0 + no, kp0 == 0);
                for (; pc < Q && (pc + KB <= (j + 1) * P || j == nb - 1); pc += KB) {
                    int64_t kc = Q - pc < KB ? Q - pc : KB;
                    for (int64_t kp = kp0; kp < kp0 + kpg; kp++) {
                        int mr = (int)(K - kp * TP < TP ? K - kp * TP : TP);
                        dws_tile(mr, nv, kc, ring + xo + kp * TP, ring + c0, qo + pc, m0, m1, dwT + (c0 / TO * K + kp * TP) * TO + c0 % TO);
                    }
                }
            }
        }
    }
}
