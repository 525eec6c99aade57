/* Private to src/train: ct_fsdp's layout, shared by the step (fsdp.c) and its sharded
 * checkpoints (fsdp_ckpt.c). */
#ifndef CT_TRAIN_FSDP_INTERNAL_H
#define CT_TRAIN_FSDP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "ctrain/fsdp.h"

typedef struct {
    int sidx;    /* parameter of S */
    int pidx;    /* its parameter of P */
    size_t goff; /* offset in P's flat buffers */
    size_t len;
    size_t loc;  /* offset inside this rank's shard of the unit */
} piece;

typedef struct {
    int first, last;   /* parameter indices (consecutive, trainable) */
    int nparams;
    size_t off, len;   /* range of P's flat buffers, in floats */
    size_t s;          /* shard length: len padded to n * s */
    piece *pieces;
    int npieces;
    bool root;         /* no numbered prefix: gathered all the time */
    bool gathered, in_order, reduced;
    bool data_off, grad_off; /* the whole granules inside its range of P's data / gradients unmapped */
    int depth, ready;
} unit;

struct ct_fsdp {
    ct_pg *pg;
    ct_params *P, *S;
    ct_device dev; /* where P (and so S and the staging) live */
    ct_optim *opt;
    ct_shard_mode mode;
    int n, me, nu;
    unit *u;
    int *unit_of;      /* per parameter of P: its unit, -1 for buffers */
    float *data, *grad;
    size_t numel, map_bytes;
    bool ranges;           /* data and grad are ranges of ours (ct_device_reserve), not P's own */
    size_t granule;        /* what ct_device_map / _unmap take */
    size_t mapped_bytes;   /* of the two ranges, mapped now (a device's measure) */
    float *stage, *send;   /* n * max s and max s floats */
    float *stage2, *send2; /* the same for the one prefetch in flight */
    ct_work *pend;         /* that prefetch's all-gather, of unit pend_unit */
    int pend_unit;
    ct_dtype gdt;          /* what gathers carry (ct_fsdp_set_param_dtype): CT_F32 or CT_BF16 */
    float *rs_in, *rs_out; /* with prefetch: the reduce-scatter in flight's (n * max s, max s) */
    ct_work *rs_pend;      /* that reduce-scatter, of unit rs_unit */
    int rs_unit;
    size_t maxs;           /* the largest unit's shard length */
    int *prev_order;       /* the last training forward's order: what forward prefetches */
    int nprev;
    bool prefetch;         /* ct_fsdp_set_prefetch */
    unsigned char *mc;     /* mincore's vector over one mapping */
    int *order;            /* units in the order this forward entered them */
    int norder;
    bool in_step, backward;
    ct_status status;      /* first failure of a collective inside a hook */
    size_t gathered_now;
    ct_fsdp_mem mem;
};

/* Rank r's part of unit u: [*a, *b) of P's flat buffers (empty past the unit's end). */
static inline void ct_fsdp_rank_range_(const unit *u, int r, size_t *a, size_t *b) {
    size_t end = u->off + u->len;
    *a = u->off + (size_t)r * u->s;
    *b = *a + u->s;
    if (*a > end) *a = end;
    if (*b > end) *b = end;
}
/* Collective: the units this mode keeps gathered (the root; every unit for CT_SHARD_OPTIM)
 * gathered again from the shards, after the shards changed outside a step. */
ct_status ct_fsdp_regather_(ct_fsdp *f);
/* The pages of every unit not gathered given back (after something wrote into P whole). */
void ct_fsdp_drop_released_(ct_fsdp *f);
/* P's gradients zeroed where they have memory (a failed or finished step's leftovers):
 * ct_params_zero_grad would write every gradient, the unmapped ones on a device too. */
void ct_fsdp_zero_grad_(ct_fsdp *f);
/* P's buffers (running statistics) where the host can read them: P's own on the CPU, a copy
 * (*own, freed by the caller, also on failure) from a device. */
ct_status ct_fsdp_host_buffers_(ct_fsdp *f, const float **out, float **own);
/* Collective: a whole (unsharded) checkpoint's weights, optimizer state and buffers into the
 * shards. On the CPU P is loaded whole on every rank for a moment (its pages are given back
 * after); on a device each piece is read from the file by its name, P untouched. */
struct ct_train_model;
ct_status ct_fsdp_load_whole_(ct_fsdp *f, const char *dir, const struct ct_train_model *m);

#endif
