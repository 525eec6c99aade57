/* Generation for the kinds that can (ct_model_kind_ops.forward_cached): a key/value cache
 * so that each new token costs one row through the model and O(T) attention instead of a
 * full forward over the context, and the generation loop (greedy, temperature, top-k) on
 * top of it.
 *
 * Past the context length the window slides: the context becomes the last x_max_len tokens
 * at positions 0 .., as a full forward over them sees it (nanoGPT crops the same way), so
 * every cached key changes and each token then costs a forward over that window. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/kv_cache.h"

ct_status ct_model_cache_create(const ct_model *m, ct_kv_cache **out) {
    *out = NULL;
    if (!m->kind->forward_cached)
        return ct_error(CT_ERR_UNSUPPORTED, "KV cache: a %s does not generate", m->kind->info.name);
    ct_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return ct_error(CT_ERR_NOMEM, "out of memory for the KV cache");
    m->kind->kv_shape(&m->cfg, &c->L, &c->H, &c->D);
    c->cap = (int)ct_model_batch_of(&m->cfg).x_max_len;
    size_t n = (size_t)c->L * (size_t)c->H * (size_t)c->cap * (size_t)c->D;
    c->k = malloc(n * sizeof(float));
    c->v = malloc(n * sizeof(float));
    if (!c->k || !c->v) {
        ct_kv_cache_free(c);
        return ct_error(CT_ERR_NOMEM, "out of memory for the KV cache (%zu MB)", 2 * n * sizeof(float) >> 20);
    }
    *out = c;
    return CT_OK;
}

void ct_kv_cache_free(ct_kv_cache *c) {
    if (!c) return;
    free(c->k);
    free(c->v);
    free(c);
}

void ct_kv_cache_reset(ct_kv_cache *c) { c->len = 0; }
int ct_kv_cache_len(const ct_kv_cache *c) { return c->len; }

void ct_kv_attend_(ct_kv_cache *c, int layer, const float *q_rows, int ld_q, int Hq, const float *k_rows, const float *v_rows, int ld_kv,
                   float *y, int t, float *scores) {
    int H = c->H, D = c->D, C = Hq * D, len = c->len, group = Hq / H;
    size_t lay = (size_t)layer * (size_t)H * (size_t)c->cap * (size_t)D;
    for (int i = 0; i < t; i++)
        for (int h = 0; h < H; h++) {
            size_t at = lay + ((size_t)h * (size_t)c->cap + (size_t)(len + i)) * (size_t)D;
            memcpy(c->k + at, k_rows + (size_t)i * ld_kv + h * D, sizeof(float) * (size_t)D);
            memcpy(c->v + at, v_rows + (size_t)i * ld_kv + h * D, sizeof(float) * (size_t)D);
        }
    const float scale = 1.0f / sqrtf((float)D);
    int total = len + t;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)t * (size_t)total * (size_t)C > 65536)
    for (int h = 0; h < Hq; h++)
        for (int i = 0; i < t; i++) {
            const float *q = q_rows + (size_t)i * ld_q + h * D;
            size_t kv = lay + (size_t)(h / group) * (size_t)c->cap * (size_t)D;
            const float *K = c->k + kv, *V = c->v + kv;
            float *s = scores + ((size_t)h * (size_t)t + (size_t)i) * (size_t)total, mx = -INFINITY;
            int n = len + i + 1; /* causal: keys 0 .. its own position */
            for (int j = 0; j < n; j++) {
                float d = 0;
                for (int e = 0; e < D; e++) d += q[e] * K[(size_t)j * D + e];
                s[j] = d * scale;
                if (s[j] > mx) mx = s[j];
            }
            float sum = 0;
            for (int j = 0; j < n; j++) sum += (s[j] = expf(s[j] - mx));
            float *o = y + (size_t)i * C + h * D;
            for (int e = 0; e < D; e++) o[e] = 0;
            for (int j = 0; j < n; j++) {
                float w = s[j] / sum;
                for (int e = 0; e < D; e++) o[e] += w * V[(size_t)j * D + e];
            }
        }
}

ct_tensor *ct_model_forward_cached(ct_ctx *ctx, ct_model *m, ct_kv_cache *c, ct_tensor *tokens) {
    CT_CHECK(m->kind->forward_cached, "ct_model_forward_cached: a %s does not generate", m->kind->info.name);
    CT_CHECK(tokens->ndim == 2 && tokens->shape[0] == 1 && (tokens->dtype == CT_I32 || tokens->dtype == CT_I64),
             "ct_model_forward_cached: expected [1, T] i32/i64 tokens, got %d dims of %s", tokens->ndim, ct_dtype_name(tokens->dtype));
    int64_t t = tokens->shape[1];
    CT_CHECK(t >= 1 && c->len + t <= c->cap, "ct_model_forward_cached: %lld cached + %lld new tokens exceed the context %d",
             (long long)c->len, (long long)t, c->cap);
    bool was = ct_set_grad_enabled(ctx, false);
    ct_tensor *logits = m->kind->forward_cached(ctx, m, c, tokens);
    ct_set_grad_enabled(ctx, was);
    return logits;
}

/* ---- sampling ---- */
ct_generate_opts ct_generate_default_opts(void) {
    return (ct_generate_opts){.max_new_tokens = 100, .temperature = 1.0, .top_k = 0, .seed = 1337, .kv_cache = true};
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* temperature 0: the first largest logit; else softmax(logits / T) over the top_k largest
 * (all when 0; ties with the k-th are kept, as PyTorch's `logits < v[-1]` masking does) */
static int32_t sample(const float *logits, int V, double temp, int top_k, uint64_t *rng, float *sorted) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp == 0) return best;
    float thr = -INFINITY;
    if (top_k > 0 && top_k < V) {
        memcpy(sorted, logits, sizeof(float) * (size_t)V);
        qsort(sorted, (size_t)V, sizeof(float), cmp_desc);
        thr = sorted[top_k - 1];
    }
    double sum = 0, mx = logits[best] / temp;
    for (int i = 0; i < V; i++)
        if (logits[i] >= thr) sum += exp(logits[i] / temp - mx);
    double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (logits[i] < thr) continue;
        acc += exp(logits[i] / temp - mx);
        last = i;
        if (acc > u) return i;
    }
    return last; /* u rounded up to the sum */
}

ct_status ct_model_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_generate_opts *opts, int32_t *out,
                            ct_generate_stats *stats) {
    ct_generate_opts o = opts ? *opts : ct_generate_default_opts();
    if (stats) memset(stats, 0, sizeof *stats);
    if (!m->kind->info.generates || !m->kind->forward_cached)
        return ct_error(CT_ERR_INVALID, "the model is a %s: it cannot generate", m->kind->info.name);
    if (n_prompt < 1) return ct_error(CT_ERR_INVALID, "the prompt is empty (at least one token is needed)");
    if (o.max_new_tokens < 0 || !(o.temperature >= 0) || !isfinite(o.temperature) || o.top_k < 0)
        return ct_error(CT_ERR_INVALID, "generation: max_new_tokens %d and top_k %d must be >= 0, temperature %g finite and >= 0",
                        o.max_new_tokens, o.top_k, o.temperature);
    ct_model_batch mb = ct_model_batch_of(&m->cfg);
    int V = (int)mb.vocab, B = (int)mb.x_max_len;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return ct_error(CT_ERR_INVALID, "prompt token %d at position %d is outside the vocabulary [0, %d)", prompt[i], i, V);
    int total = n_prompt + o.max_new_tokens;
    int32_t *seq = malloc(sizeof *seq * (size_t)total);
    float *sorted = malloc(sizeof(float) * (size_t)V);
    ct_ctx *ctx = NULL;
    ct_kv_cache *cache = NULL;
    ct_status st = seq && sorted ? CT_OK : ct_error(CT_ERR_NOMEM, "out of memory for generation");
    if (st == CT_OK) st = ct_ctx_create(NULL, &ctx);
    if (st == CT_OK && o.kv_cache) st = ct_model_cache_create(m, &cache);
    if (st != CT_OK) {
        free(seq);
        free(sorted);
        ct_ctx_free(ctx);
        return st;
    }
    memcpy(seq, prompt, sizeof *seq * (size_t)n_prompt);
    ct_ctx_set_training(ctx, false);
    ct_set_grad_enabled(ctx, false);
    uint64_t rng = o.seed;
    int n = n_prompt, start = 0; /* the cache holds seq[start, start + len) */
    double t0 = ct_time_now();
    for (int k = 0; k < o.max_new_tokens; k++) {
        ct_tensor *logits;
        int rows;
        if (cache) {
            int feed = n - (start + cache->len);
            if (cache->len + feed > B) { /* the window slides: every position changes */
                ct_kv_cache_reset(cache);
                start = n > B ? n - B : 0;
                feed = n - start;
            }
            ct_tensor *x = ct_wrap(ctx, CT_I32, seq + n - feed, 2, (int64_t[]){1, feed});
            logits = ct_model_forward_cached(ctx, m, cache, x);
            rows = feed;
        } else {
            int w = n > B ? B : n;
            logits = ct_model_forward(ctx, m, ct_wrap(ctx, CT_I32, seq + n - w, 2, (int64_t[]){1, w}));
            rows = w;
        }
        int32_t tok = sample(ct_f32(logits) + (size_t)(rows - 1) * (size_t)V, V, o.temperature, o.top_k, &rng, sorted);
        ct_ctx_reset(ctx);
        seq[n++] = out[k] = tok;
        if (stats) stats->new_tokens = k + 1;
        if (o.on_token && !o.on_token(tok, o.user)) break;
    }
    if (stats) stats->seconds = ct_time_now() - t0;
    ct_kv_cache_free(cache);
    ct_ctx_free(ctx);
    free(seq);
    free(sorted);
    return CT_OK;
}
