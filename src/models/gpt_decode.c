/* GPT inference: a key/value cache so that each new token costs one row through the model
 * and O(T) attention instead of a full forward over the context, and the generation loop
 * (greedy, temperature, top-k) on top of it.
 *
 * Positions are absolute (learned wpe), so once the sequence is longer than block_size the
 * window slides and every cached key changes: from there each token is a forward over the
 * last block_size tokens, as without the cache (nanoGPT crops the same way). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt_internal.h"

struct ct_gpt_cache {
    int L, H, D, cap, len;
    float *k, *v; /* [L][H][cap][D] */
};

ct_status ct_gpt_cache_create(const ct_model *m, ct_gpt_cache **out) {
    *out = NULL;
    if (m->cfg.kind != CT_MODEL_GPT) return ct_error(CT_ERR_INVALID, "KV cache: the model is a %s, not a GPT", m->kind->info.name);
    ct_gpt_cache *c = calloc(1, sizeof *c);
    if (!c) return ct_error(CT_ERR_NOMEM, "out of memory for the KV cache");
    c->L = m->cfg.gpt.n_layer;
    c->H = m->cfg.gpt.n_head;
    c->D = m->cfg.gpt.n_embd / c->H;
    c->cap = m->cfg.gpt.block_size;
    size_t n = (size_t)c->L * (size_t)c->cap * (size_t)m->cfg.gpt.n_embd;
    c->k = malloc(n * sizeof(float));
    c->v = malloc(n * sizeof(float));
    if (!c->k || !c->v) {
        ct_gpt_cache_free(c);
        return ct_error(CT_ERR_NOMEM, "out of memory for the KV cache (%zu MB)", 2 * n * sizeof(float) >> 20);
    }
    *out = c;
    return CT_OK;
}

void ct_gpt_cache_free(ct_gpt_cache *c) {
    if (!c) return;
    free(c->k);
    free(c->v);
    free(c);
}

void ct_gpt_cache_reset(ct_gpt_cache *c) { c->len = 0; }
int ct_gpt_cache_len(const ct_gpt_cache *c) { return c->len; }

/* Causal attention of t new rows of qkv [t, 3C] against the cache (after appending their keys
 * and values): y [t, C] in merged-head layout, as ct_merge_heads gives. */
static void attend(ct_gpt_cache *c, int layer, const float *qkv, float *y, int t, float *scores) {
    int H = c->H, D = c->D, C = H * D, len = c->len;
    size_t lay = (size_t)layer * (size_t)H * (size_t)c->cap * (size_t)D;
    for (int i = 0; i < t; i++)
        for (int h = 0; h < H; h++) {
            size_t at = lay + ((size_t)h * (size_t)c->cap + (size_t)(len + i)) * (size_t)D;
            memcpy(c->k + at, qkv + (size_t)i * 3 * C + C + h * D, sizeof(float) * (size_t)D);
            memcpy(c->v + at, qkv + (size_t)i * 3 * C + 2 * C + h * D, sizeof(float) * (size_t)D);
        }
    const float scale = 1.0f / sqrtf((float)D);
    int total = len + t;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)t * (size_t)total * (size_t)C > 65536)
    for (int h = 0; h < H; h++)
        for (int i = 0; i < t; i++) {
            const float *q = qkv + (size_t)i * 3 * C + h * D;
            const float *K = c->k + lay + (size_t)h * (size_t)c->cap * (size_t)D, *V = c->v + lay + (size_t)h * (size_t)c->cap * (size_t)D;
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

ct_tensor *ct_gpt_forward_cached(ct_ctx *ctx, ct_model *m, ct_gpt_cache *c, ct_tensor *tokens) {
    CT_CHECK(m->cfg.kind == CT_MODEL_GPT, "ct_gpt_forward_cached: the model is a %s, not a GPT", m->kind->info.name);
    CT_CHECK(tokens->ndim == 2 && tokens->shape[0] == 1 && (tokens->dtype == CT_I32 || tokens->dtype == CT_I64),
             "ct_gpt_forward_cached: expected [1, T] i32/i64 tokens, got %d dims of %s", tokens->ndim, ct_dtype_name(tokens->dtype));
    int64_t t = tokens->shape[1];
    CT_CHECK(t >= 1 && c->len + t <= c->cap, "ct_gpt_forward_cached: %lld cached + %lld new tokens exceed block_size %d", (long long)c->len,
             (long long)t, c->cap);
    bool was = ct_set_grad_enabled(ctx, false);
    const ct_gpt *g = ct_gpt_of_(m);
    int64_t C = m->cfg.gpt.n_embd;
    ct_tensor *pos = ct_new(ctx, CT_I32, 1, &t);
    for (int64_t i = 0; i < t; i++) ((int32_t *)pos->data)[i] = (int32_t)(c->len + i);
    ct_tensor *x = ct_add(ctx, ct_embedding(ctx, g->wte->w, tokens), ct_embedding(ctx, g->wpe->w, pos));
    float *scores = ct_ctx_alloc(ctx, sizeof(float) * (size_t)c->H * (size_t)t * (size_t)(c->len + t));
    for (int l = 0; l < c->L; l++) {
        const ct_gpt_block *b = &g->h[l];
        /* projections through their modules: a quantized model's int8 Linears are used too */
        ct_tensor *qkv = ct_module_forward(ctx, b->attn.c_attn, ct_module_forward(ctx, b->ln_1, x));
        ct_tensor *y = ct_new(ctx, CT_F32, 3, (int64_t[]){1, t, C});
        attend(c, l, qkv->data, y->data, (int)t, scores);
        x = ct_add(ctx, x, ct_module_forward(ctx, b->attn.c_proj, y));
        x = ct_add(ctx, x, ct_module_forward(ctx, b->mlp.mod, ct_module_forward(ctx, b->ln_2, x)));
    }
    x = ct_module_forward(ctx, g->ln_f, x);
    c->len += (int)t;
    ct_tensor *logits = ct_module_forward(ctx, g->lm_head, x); /* tied to wte */
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

ct_status ct_gpt_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_generate_opts *opts, int32_t *out,
                          ct_generate_stats *stats) {
    ct_generate_opts o = opts ? *opts : ct_generate_default_opts();
    if (stats) memset(stats, 0, sizeof *stats);
    if (m->cfg.kind != CT_MODEL_GPT) return ct_error(CT_ERR_INVALID, "the model is a %s, not a GPT: it cannot generate", m->kind->info.name);
    if (n_prompt < 1) return ct_error(CT_ERR_INVALID, "the prompt is empty (at least one token is needed)");
    if (o.max_new_tokens < 0 || !(o.temperature >= 0) || !isfinite(o.temperature) || o.top_k < 0)
        return ct_error(CT_ERR_INVALID, "generation: max_new_tokens %d and top_k %d must be >= 0, temperature %g finite and >= 0",
                        o.max_new_tokens, o.top_k, o.temperature);
    int V = m->cfg.gpt.vocab_size, B = m->cfg.gpt.block_size;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return ct_error(CT_ERR_INVALID, "prompt token %d at position %d is outside the vocabulary [0, %d)", prompt[i], i, V);
    int total = n_prompt + o.max_new_tokens;
    int32_t *seq = malloc(sizeof *seq * (size_t)total);
    float *sorted = malloc(sizeof(float) * (size_t)V);
    ct_ctx *ctx = NULL;
    ct_gpt_cache *cache = NULL;
    ct_status st = seq && sorted ? CT_OK : ct_error(CT_ERR_NOMEM, "out of memory for generation");
    if (st == CT_OK) st = ct_ctx_create(NULL, &ctx);
    if (st == CT_OK && o.kv_cache) st = ct_gpt_cache_create(m, &cache);
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
                ct_gpt_cache_reset(cache);
                start = n > B ? n - B : 0;
                feed = n - start;
            }
            ct_tensor *x = ct_wrap(ctx, CT_I32, seq + n - feed, 2, (int64_t[]){1, feed});
            logits = ct_gpt_forward_cached(ctx, m, cache, x);
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
    ct_gpt_cache_free(cache);
    ct_ctx_free(ctx);
    free(seq);
    free(sorted);
    return CT_OK;
}
