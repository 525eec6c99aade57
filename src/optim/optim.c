/* SGD and AdamW over a ct_params store's flat buffers, PyTorch's formulas to the bit.
 *
 * PyTorch's CPU kernels (AVX2 build, checked by tests/torch/gen_optim.py's fixtures) fuse
 * some of the update into FMAs: `a.add_(b, alpha=s)` is fma(b, s, a) and
 * `a.addcmul_(b, c, value=s)` is fma(s * b, c, a), while `addcdiv_` is a + (s * b) / c
 * and `x / scalar` is a true division. Python-float hyper-parameters are combined in double
 * and rounded to float once, as a Python float scalar reaches the kernel. This file is
 * compiled with -std=c11 (no implicit contraction), so the fmaf() calls below are exactly
 * where PyTorch fuses and nowhere else. */
#include "ctrain/optim.h"
#include "core/kernel.h" /* device hooks: the fused pass on a GPU */
#include "ops/kmath.h"   /* the per-element updates, shared with the CUDA kernels */

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2_FMA 1
#endif

enum { K_SGD = 0, K_ADAMW = 1 };
#define MAX_STATE 3
/* below this many floats a parallel region costs more than the loop */
#define PAR_MIN 32768

typedef struct { size_t begin, end; double wd; } seg;

struct ct_optim {
    int kind;
    ct_params *p;
    size_t n;
    ct_sgd_opts sgd;
    ct_adamw_opts adam;
    double *wd;          /* per parameter index; buffers ignored */
    seg *segs;           /* runs of equal weight decay covering [0, n) */
    int nseg;
    bool segs_dirty;
    int nstate;
    float *state[MAX_STATE];
    const char *state_name[MAX_STATE];
    int64_t step;
    ct_device dev;                /* the store's device at creation: state buffers live there */
    const ct_device_hooks *hooks; /* its backend; NULL on the CPU */
    ct_status status;             /* first failure of a step on a device, or of a shard's sync */
    bool state_external[MAX_STATE];
    bool sharded, average;        /* ct_optim_set_shard / ct_optim_set_average */
    bool released;                /* ct_optim_release_state: a template, it cannot step */
    ct_optim_shard shard;
};

ct_sgd_opts ct_sgd_default_opts(void) {
    return (ct_sgd_opts){.momentum = 0, .dampening = 0, .weight_decay = 0, .nesterov = false,
                         .maximize = false, .decay_only_ndim_ge2 = false};
}

ct_adamw_opts ct_adamw_default_opts(void) {
    return (ct_adamw_opts){.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2,
                           .amsgrad = false, .maximize = false, .decay_only_ndim_ge2 = false};
}

/* Buffers (state without gradient) live outside the flat parameter buffer. */
static bool is_trainable(const ct_params *p, int i) { return !ct_params_is_buffer(p, i) && ct_numel(ct_params_get(p, i)) > 0; }

/* a state buffer on d (hooks h, NULL on the CPU): 64-byte aligned on the host, as optim_new's */
static ct_status state_alloc(ct_device d, const ct_device_hooks *h, size_t bytes, float **out) {
    *out = NULL;
    if (h) return h->alloc(d.index, bytes, (void **)out);
    if (posix_memalign((void **)out, 64, bytes)) {
        *out = NULL;
        return ct_error(CT_ERR_NOMEM, "optimizer: cannot allocate %zu bytes of state on the host", bytes);
    }
    return CT_OK;
}

static void state_free(const ct_device_hooks *h, float *p) {
    if (h) h->free(p);
    else free(p);
}

static ct_status optim_new(ct_params *p, int kind, double wd, bool only_ge2, bool template_only, int nstate,
                           const char *const *names, ct_optim **out) {
    if (!p || (!ct_params_data(p) && !ct_params_is_deferred(p)))
        return ct_error(CT_ERR_INVALID, "optimizer: parameter store is NULL or not finalized");
    const ct_device_hooks *h = NULL;
    if (ct_params_device(p).type != CT_DEV_CPU && !(h = ct_device_hooks_get(ct_params_device(p), "optimizer")))
        return CT_ERR_UNSUPPORTED;
    if (h && !h->optim) return ct_error(CT_ERR_UNSUPPORTED, "optimizer: the device backend has no optimizer pass");
    ct_optim *o = calloc(1, sizeof *o);
    int np = ct_params_count(p);
    if (!o || !(o->wd = calloc((size_t)(np ? np : 1), sizeof(double)))) goto oom;
    /* room for the most runs there can be, so that a step never allocates */
    if (!(o->segs = malloc((size_t)(np + 1) * sizeof *o->segs))) goto oom;
    o->kind = kind;
    o->p = p;
    o->n = ct_params_numel(p);
    o->dev = ct_params_device(p);
    o->hooks = h;
    for (int i = 0; i < np; i++)
        o->wd[i] = (only_ge2 && ct_params_get(p, i)->ndim < 2) ? 0.0 : wd;
    o->segs_dirty = true;
    o->released = template_only;
    for (int k = 0; k < nstate; k++) {
        if (template_only) { /* named, no buffer */
            o->state_name[k] = names[k];
            o->nstate = k + 1;
            continue;
        }
        /* state buffers in the parameters' layout on their device, zeroed */
        size_t bytes = (o->n ? o->n : 16) * sizeof(float);
        ct_status st = state_alloc(o->dev, h, bytes, &o->state[k]);
        if (st == CT_OK && h) st = h->zero(o->dev.index, o->state[k], bytes);
        else if (st == CT_OK) memset(o->state[k], 0, o->n * sizeof(float));
        if (st != CT_OK) { o->nstate = k + 1; ct_optim_free(o); return st; }
        o->state_name[k] = names[k];
        o->nstate = k + 1;
    }
    *out = o;
    return CT_OK;
oom:
    ct_optim_free(o);
    return ct_error(CT_ERR_NOMEM, "optimizer: cannot allocate state for %zu parameters", ct_params_numel(p));
}

ct_status ct_optim_create_sgd(ct_params *p, const ct_sgd_opts *opts, ct_optim **out) {
    *out = NULL;
    ct_sgd_opts o = opts ? *opts : ct_sgd_default_opts();
    if (!(o.momentum >= 0) || !(o.weight_decay >= 0) || !isfinite(o.dampening))
        return ct_error(CT_ERR_INVALID, "sgd: momentum %g and weight_decay %g must be >= 0, dampening finite",
                        o.momentum, o.weight_decay);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
        return ct_error(CT_ERR_INVALID, "sgd: Nesterov momentum requires a momentum and zero dampening");
    static const char *const names[] = {"momentum_buffer"};
    ct_status st = optim_new(p, K_SGD, o.weight_decay, o.decay_only_ndim_ge2, o.template_only, o.momentum != 0 ? 1 : 0, names, out);
    if (st == CT_OK) (*out)->sgd = o;
    return st;
}

ct_status ct_optim_create_adamw(ct_params *p, const ct_adamw_opts *opts, ct_optim **out) {
    *out = NULL;
    ct_adamw_opts o = opts ? *opts : ct_adamw_default_opts();
    if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
        return ct_error(CT_ERR_INVALID, "adamw: betas (%g, %g) must be in [0, 1)", o.beta1, o.beta2);
    if (!(o.eps >= 0) || !(o.weight_decay >= 0))
        return ct_error(CT_ERR_INVALID, "adamw: eps %g and weight_decay %g must be >= 0", o.eps, o.weight_decay);
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    ct_status st = optim_new(p, K_ADAMW, o.weight_decay, o.decay_only_ndim_ge2, o.template_only, o.amsgrad ? 3 : 2, names, out);
    if (st == CT_OK) (*out)->adam = o;
    return st;
}

ct_status ct_optim_create_like(const ct_optim *like, ct_params *p, ct_optim **out) {
    ct_sgd_opts so = like->sgd;
    ct_adamw_opts ao = like->adam;
    so.template_only = ao.template_only = false;
    ct_status st = like->kind == K_SGD ? ct_optim_create_sgd(p, &so, out) : ct_optim_create_adamw(p, &ao, out);
    if (st == CT_OK) (*out)->step = like->step;
    return st;
}

void ct_optim_free(ct_optim *o) {
    if (!o) return;
    if (o->sharded && o->shard.detach) o->shard.detach(o->shard.user);
    for (int k = 0; k < MAX_STATE; k++)
        if (!o->state_external[k]) state_free(o->hooks, o->state[k]);
    free(o->wd);
    free(o->segs);
    free(o);
}

void ct_optim_release_state(ct_optim *o) {
    CT_CHECK(!o->sharded, "ct_optim_release_state: the optimizer steps a shard");
    for (int k = 0; k < o->nstate; k++) {
        if (!o->state_external[k]) state_free(o->hooks, o->state[k]);
        o->state[k] = NULL;
        o->state_external[k] = false;
    }
    o->released = true;
}

bool ct_optim_is_template(const ct_optim *o) { return o->released; }
const char *ct_optim_kind(const ct_optim *o) { return o->kind == K_SGD ? "sgd" : "adamw"; }
ct_params *ct_optim_params(const ct_optim *o) { return o->p; }
int64_t ct_optim_steps(const ct_optim *o) { return o->step; }
ct_status ct_optim_status(const ct_optim *o) { return o->status; }
ct_device ct_optim_device(const ct_optim *o) { return o->dev; }

ct_status ct_optim_to(ct_optim *o, ct_device dev) {
    char b1[32], b2[32];
    if (ct_device_eq(o->dev, dev)) return CT_OK;
    if (o->sharded || o->state_external[0])
        return ct_error(CT_ERR_INVALID, "ct_optim_to: the optimizer's state is shared by the ranks (ct_ddp_shard_optimizer)");
    if (o->dev.type != CT_DEV_CPU && dev.type != CT_DEV_CPU)
        return ct_error(CT_ERR_UNSUPPORTED, "ct_optim_to: %s to %s: move through the CPU", ct_device_str(o->dev, b1, sizeof b1),
                        ct_device_str(dev, b2, sizeof b2));
    const ct_device_hooks *h = NULL;
    if (dev.type != CT_DEV_CPU && !(h = ct_device_hooks_get(dev, "ct_optim_to"))) return CT_ERR_UNSUPPORTED;
    if (h && !h->optim) return ct_error(CT_ERR_UNSUPPORTED, "ct_optim_to: the device backend has no optimizer pass");
    const ct_device_hooks *gpu = h ? h : o->hooks;
    int gi = h ? dev.index : o->dev.index;
    size_t bytes = (o->n ? o->n : 16) * sizeof(float);
    float *ns[MAX_STATE] = {0};
    ct_status st = CT_OK;
    for (int k = 0; k < o->nstate && st == CT_OK; k++) {
        st = state_alloc(dev, h, bytes, &ns[k]);
        if (st == CT_OK) st = gpu->copy(gi, ns[k], o->state[k], bytes, h ? CT_COPY_H2D : CT_COPY_D2H);
    }
    if (st != CT_OK) { /* the state stays where it was */
        for (int k = 0; k < o->nstate; k++) state_free(h, ns[k]);
        return st;
    }
    for (int k = 0; k < o->nstate; k++) {
        state_free(o->hooks, o->state[k]);
        o->state[k] = ns[k];
    }
    o->dev = dev;
    o->hooks = h;
    return CT_OK;
}
void ct_optim_set_steps(ct_optim *o, int64_t steps) {
    CT_CHECK(steps >= 0, "ct_optim_set_steps: negative step count %lld", (long long)steps);
    o->step = steps;
}

void ct_optim_set_weight_decay(ct_optim *o, int i, double wd) {
    CT_CHECK(i >= 0 && i < ct_params_count(o->p), "ct_optim_set_weight_decay: parameter index %d out of range", i);
    CT_CHECK(wd >= 0, "ct_optim_set_weight_decay: negative weight decay %g", wd);
    o->wd[i] = wd;
    o->segs_dirty = true;
}

double ct_optim_weight_decay(const ct_optim *o, int i) {
    CT_CHECK(i >= 0 && i < ct_params_count(o->p), "ct_optim_weight_decay: parameter index %d out of range", i);
    return o->wd[i];
}

/* Runs of equal weight decay over the flat buffer. Each parameter owns [its offset, the
 * next parameter's offset): its padding rides along (always zero, and stays zero). */
static void build_segs(ct_optim *o) {
    int np = ct_params_count(o->p);
    seg *s = o->segs; /* np + 1 entries, allocated with the optimizer */
    int ns = 0;
    for (int i = 0; i < np; i++) { /* trainable offsets increase with the index */
        if (!is_trainable(o->p, i)) continue;
        size_t off = ct_params_offset(o->p, i);
        if (ns == 0) {
            s[ns++] = (seg){0, 0, o->wd[i]};
        } else if (o->wd[i] != s[ns - 1].wd) {
            s[ns - 1].end = off;
            s[ns++] = (seg){off, 0, o->wd[i]};
        }
    }
    if (ns == 0) s[ns++] = (seg){0, 0, 0};
    s[ns - 1].end = o->n;
    o->nseg = ns;
    o->segs_dirty = false;
}

/* A segment on the parameters' GPU: one fused kernel (the same element update); a failure
 * is kept for ct_optim_status (the step itself returns nothing) */
static void device_pass(ct_optim *o, ct_device_optim kind, const void *k, float *P, const float *G, float *s0, float *s1,
                        float *s2, long n) {
    ct_status st = o->hooks->optim(o->dev.index, kind, k, P, G, s0, s1, s2, n);
    if (st != CT_OK && o->status == CT_OK) o->status = st;
}

/* Elements [0, n) of P/G/B (B NULL without momentum) by ops/kmath.h's element update, the one
 * the CUDA kernel runs too. Elementwise and exactly rounded (fmaf), so any split or
 * vectorisation gives the same bits; the two loops let the compiler drop the buffer test. */
static void sgd_kernel(const ct_k_sgd *k, float *restrict P, const float *restrict G, float *restrict B, long n) {
    if (!B) {
        for (long i = 0; i < n; i++) ct_k_sgd_elem(k, P + i, G[i], NULL);
        return;
    }
    for (long i = 0; i < n; i++) ct_k_sgd_elem(k, P + i, G[i], B + i);
}

/* The averaged gradient of elements [i, i + m) of the flat buffer: the shm all-reduce's
 * order and arithmetic (src/distributed/shm_shared.c), so the same bits as the reduced
 * buffer the step would otherwise read. A true division, as there. */
#define AVG_CHUNK 1024
static void average_grads(const ct_optim_shard *s, size_t i, long m, float *restrict out) {
    const float *g0 = s->grads[0] + i, *g1 = s->grads[1] + i;
    if (s->ngrads == 2) {
        for (long j = 0; j < m; j++) out[j] = (g0[j] + g1[j]) / 2.0f;
        return;
    }
    for (long j = 0; j < m; j++) out[j] = g0[j] + g1[j];
    for (int r = 2; r < s->ngrads - 1; r++) {
        const float *g = s->grads[r] + i;
        for (long j = 0; j < m; j++) out[j] = out[j] + g[j];
    }
    const float *gl = s->grads[s->ngrads - 1] + i;
    const float d = (float)s->ngrads;
    for (long j = 0; j < m; j++) out[j] = (out[j] + gl[j]) / d;
}

/* Each thread runs sgd_kernel on a contiguous share (what schedule(static) would give it);
 * averaging, a chunk at a time through an L1-sized buffer. */
static void sgd_range(ct_optim *o, size_t b, size_t e, double wd, double lr) {
    const ct_k_sgd k = ct_k_sgd_consts(o->sgd.momentum, o->sgd.dampening, wd, o->sgd.nesterov, o->sgd.maximize, lr,
                                       o->step == 0);
    float *P = ct_params_data(o->p) + b;
    const float *G = ct_params_grad(o->p) + b;
    float *B = o->nstate ? o->state[0] + b : NULL;
    long n = (long)(e - b);
    if (o->hooks) { device_pass(o, CT_DEV_OPTIM_SGD, &k, P, G, B, NULL, NULL, n); return; }
    const bool avg = o->average;
#pragma omp parallel if (n > PAR_MIN)
    {
        long nt = omp_get_num_threads(), t = omp_get_thread_num();
        long lo = n * t / nt, hi = n * (t + 1) / nt;
        if (!avg) sgd_kernel(&k, P + lo, G + lo, B ? B + lo : NULL, hi - lo);
        else {
            _Alignas(64) float g[AVG_CHUNK];
            for (long c = lo; c < hi; c += AVG_CHUNK) {
                long m = hi - c < AVG_CHUNK ? hi - c : AVG_CHUNK;
                average_grads(&o->shard, b + (size_t)c, m, g);
                sgd_kernel(&k, P + c, g, B ? B + c : NULL, m);
            }
        }
    }
}

/* The AdamW update: ops/kmath.h's element update (shared with the CUDA kernel); the AVX2 loop
 * below computes the same operations in the same order (IEEE sqrt, division and FMA are
 * exactly rounded in both), so both paths give the same bits. GCC does not vectorize sqrtf
 * without -fno-math-errno, hence the intrinsics. */
static void adamw_kernel(const ct_k_adamw *k, float *restrict P, const float *restrict G, float *restrict M,
                         float *restrict V, float *restrict VM, long lo, long hi) {
    long i = lo;
#ifdef HAVE_AVX2_FMA
    const __m256 gsign = _mm256_set1_ps(k->gsign), decay = _mm256_set1_ps(k->decay);
    const __m256 b1 = _mm256_set1_ps(k->b1), omb1 = _mm256_set1_ps(k->omb1);
    const __m256 b2 = _mm256_set1_ps(k->b2), omb2 = _mm256_set1_ps(k->omb2);
    const __m256 nstep = _mm256_set1_ps(k->nstep), bc2s = _mm256_set1_ps(k->bc2s), eps = _mm256_set1_ps(k->eps);
    for (; i + 8 <= hi; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(G + i), gsign);
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(P + i), decay);
        __m256 m = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(_mm256_loadu_ps(M + i), b1));
        __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(_mm256_loadu_ps(V + i), b2));
        _mm256_storeu_ps(M + i, m);
        _mm256_storeu_ps(V + i, v);
        if (VM) {
            __m256 mx = _mm256_loadu_ps(VM + i);
            __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, mx, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            v = _mm256_blendv_ps(mx, v, take);
            _mm256_storeu_ps(VM + i, v);
        }
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2s), eps);
        _mm256_storeu_ps(P + i, _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(nstep, m), denom)));
    }
#endif
    for (; i < hi; i++) ct_k_adamw_elem(k, P + i, G[i], M + i, V + i, VM ? VM + i : NULL);
}

static void adamw_range(ct_optim *o, size_t b, size_t e, double wd, double lr) {
    float *P = ct_params_data(o->p) + b;
    const float *G = ct_params_grad(o->p) + b;
    float *M = o->state[0] + b, *V = o->state[1] + b;
    float *VM = o->adam.amsgrad ? o->state[2] + b : NULL;
    const ct_k_adamw k = ct_k_adamw_consts(o->adam.beta1, o->adam.beta2, o->adam.eps, wd, lr, o->step,
                                           o->adam.maximize); /* step already incremented */
    const long n = (long)(e - b);
    if (o->hooks) { device_pass(o, CT_DEV_OPTIM_ADAMW, &k, P, G, M, V, VM, n); return; }
    const bool avg = o->average;
#pragma omp parallel if (n > PAR_MIN)
    {
        /* contiguous, 16-float aligned share per thread */
        long nt = omp_get_num_threads(), t = omp_get_thread_num();
        long per = ((n + nt - 1) / nt + 15) & ~15L;
        long lo = t * per < n ? t * per : n, hi = lo + per < n ? lo + per : n;
        if (!avg) adamw_kernel(&k, P, G, M, V, VM, lo, hi);
        else {
            _Alignas(64) float g[AVG_CHUNK];
            for (long c = lo; c < hi; c += AVG_CHUNK) {
                long m = hi - c < AVG_CHUNK ? hi - c : AVG_CHUNK;
                average_grads(&o->shard, b + (size_t)c, m, g);
                adamw_kernel(&k, P + c, g, M + c, V + c, VM ? VM + c : NULL, 0, m);
            }
        }
    }
}

void ct_optim_step(ct_optim *o, double lr) {
    CT_CHECK(ct_device_eq(ct_params_device(o->p), o->dev), "ct_optim_step: the parameters moved to another device after "
             "the optimizer was created (create it after ct_module_to / ct_params_to)");
    CT_CHECK(!o->released, "ct_optim_step: the optimizer's state was released (ct_optim_release_state)");
    if (o->segs_dirty) build_segs(o);
    /* sharded: this rank's share of each run of equal weight decay */
    size_t lo = o->sharded ? o->shard.lo : 0, hi = o->sharded ? o->shard.hi : o->n;
    if (o->kind == K_ADAMW) o->step++;
    for (int k = 0; k < o->nseg; k++) {
        size_t b = o->segs[k].begin > lo ? o->segs[k].begin : lo, e = o->segs[k].end < hi ? o->segs[k].end : hi;
        if (b >= e) continue;
        if (o->kind == K_ADAMW) adamw_range(o, b, e, o->segs[k].wd, lr);
        else sgd_range(o, b, e, o->segs[k].wd, lr);
    }
    if (o->kind == K_SGD) o->step++;
    o->average = false;
    if (o->sharded) {
        ct_status st = o->shard.sync(o->shard.user);
        if (st != CT_OK && o->status == CT_OK) o->status = st;
    }
}

/* ---- sharded steps ---- */

void ct_optim_set_shard(ct_optim *o, const ct_optim_shard *s) {
    CT_CHECK(!s || (s->lo <= s->hi && s->hi <= o->n && s->sync && (!s->grads || s->ngrads >= 2)),
             "ct_optim_set_shard: share [%zu, %zu) of %zu floats, %d gradient sources", s ? s->lo : 0, s ? s->hi : 0, o->n,
             s ? s->ngrads : 0);
    o->sharded = s != NULL;
    if (s) o->shard = *s;
    else memset(&o->shard, 0, sizeof o->shard);
    o->average = false;
}

void ct_optim_set_average(ct_optim *o, bool on) {
    CT_CHECK(!on || (o->sharded && o->shard.grads), "ct_optim_set_average: the optimizer has no shard with gradient sources");
    o->average = on;
}

ct_status ct_optim_set_state_storage(ct_optim *o, int k, float *buf, bool copy) {
    CT_CHECK(k >= 0 && k < o->nstate, "ct_optim_set_state_storage: state %d of %d", k, o->nstate);
    if (o->hooks) return ct_error(CT_ERR_INVALID, "ct_optim_set_state_storage: the optimizer is on a device");
    float *own = NULL;
    if (!buf) {
        if (!o->state_external[k]) return CT_OK;
        ct_status st = state_alloc(o->dev, NULL, (o->n ? o->n : 16) * sizeof(float), &own);
        if (st != CT_OK) return st;
        buf = own;
        copy = true;
    }
    if (buf == o->state[k]) return CT_OK;
    if ((uintptr_t)buf % 64) return ct_error(CT_ERR_INVALID, "optimizer state storage %p is not 64-byte aligned", (void *)buf);
    if (copy) memcpy(buf, o->state[k], o->n * sizeof(float));
    if (!o->state_external[k]) state_free(NULL, o->state[k]);
    o->state[k] = buf;
    o->state_external[k] = own == NULL;
    return CT_OK;
}

/* ---- state ---- */

int ct_optim_state_count(const ct_optim *o) { return o->nstate; }

void ct_optim_state_buffer(const ct_optim *o, int i, const char **name, float **data, size_t *numel) {
    CT_CHECK(i >= 0 && i < o->nstate, "ct_optim_state_buffer: index %d out of range [0, %d)", i, o->nstate);
    if (name) *name = o->state_name[i];
    if (data) *data = o->state[i];
    if (numel) *numel = o->n;
}

int ct_optim_state_tensor_count(const ct_optim *o) {
    int trainable = 0, np = ct_params_count(o->p);
    for (int i = 0; i < np; i++) trainable += is_trainable(o->p, i);
    return 1 + o->nstate * trainable;
}

/* Tensor 0 is the step counter; then, per state buffer, one view per trainable parameter in
 * registration order (the order PyTorch's state_dict lists them). */
ct_optim_state_tensor ct_optim_state_tensor_at(ct_optim *o, int i) {
    CT_CHECK(i >= 0 && i < ct_optim_state_tensor_count(o), "ct_optim_state_tensor_at: index %d out of range [0, %d)", i,
             ct_optim_state_tensor_count(o));
    if (i == 0) return (ct_optim_state_tensor){.state = "step", .param = NULL, .dtype = CT_I64, .ndim = 0, .data = &o->step};
    int np = ct_params_count(o->p), k = 0;
    for (i--;; k++) {
        for (int p = 0; p < np; p++) {
            if (!is_trainable(o->p, p)) continue;
            if (i-- > 0) continue;
            const ct_tensor *t = ct_params_get(o->p, p);
            ct_optim_state_tensor v = {.state = o->state_name[k], .param = t->name, .dtype = CT_F32, .ndim = t->ndim,
                                       .data = o->state[k] + ct_params_offset(o->p, p)};
            memcpy(v.shape, t->shape, sizeof v.shape);
            return v;
        }
    }
}
