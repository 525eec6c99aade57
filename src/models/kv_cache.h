/* Private to src/models/: the key/value cache the kinds that generate share (decode.c). */
#ifndef CT_KV_CACHE_H
#define CT_KV_CACHE_H
#include "models/model_internal.h"

/* batch 1: per layer, per key/value head, cap positions of D floats */
struct ct_kv_cache {
    int L, H, D, cap, len; /* H: key/value heads (grouped-query: fewer than the query heads) */
    float *k, *v;          /* [L][H][cap][D] */
};

/* Appends t rows of keys k and values v (row i at k + i * ld_kv, H heads of D side by side)
 * to layer's cache at positions len .., then y [t, Hq * D] = causal attention of the t
 * query rows (q + i * ld_q, Hq heads; query head h reads key/value head h / (Hq / H))
 * against positions 0 .. their own. scores: room for Hq * t * (len + t) floats. The caller
 * adds t to len after its last layer. */
void ct_kv_attend_(struct ct_kv_cache *c, int layer, const float *q, int ld_q, int Hq, const float *k, const float *v, int ld_kv,
                   float *y, int t, float *scores);
#endif
