/* The first step of a store rendezvous: every rank says what job it thinks it is in (world
 * size, machines, ranks per machine) before any backend meets. Two nodes started with a
 * different --nproc-per-node or --nnodes used to reach Gloo with different sizes and fail
 * inside it (`sizeof(impl_) == bytes.size()`); here they fail with one line naming both
 * nodes' values. The wait for everyone's declaration also names every rank that never came. */
#include "distributed/dist_internal.h"
#include "ctrain/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ct_rank_ranges(const int *ranks, int n, char *out, size_t on) {
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < n && o + 24 < on; i++) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        if (j > i) o += (size_t)snprintf(out + o, on - o, "%s%d-%d", o ? ", " : "", ranks[i], ranks[j]);
        else o += (size_t)snprintf(out + o, on - o, "%s%d", o ? ", " : "", ranks[i]);
        i = j;
    }
    if (o + 24 >= on && on > 4) snprintf(out + on - 5, 5, "...");
}

typedef struct {
    int world, nnodes, nproc, node; /* nnodes and node: -1 when the launcher did not say */
    char host[64];
} decl;

static void decl_text(const decl *d, char *out, size_t n) {
    char nodes[32] = "?";
    if (d->nnodes > 0) snprintf(nodes, sizeof nodes, "%d", d->nnodes);
    snprintf(out, n, "--nnodes %s --nproc-per-node %d (world size %d)", nodes, d->nproc, d->world);
}

static void decl_node(const decl *d, int rank, char *out, size_t n) {
    if (d->node >= 0) snprintf(out, n, "node %d (%s, rank %d)", d->node, d->host, rank);
    else snprintf(out, n, "rank %d (%s)", rank, d->host);
}

static int decl_parse(const char *s, decl *d) {
    return sscanf(s, "%d %d %d %d %63s", &d->world, &d->nnodes, &d->nproc, &d->node, d->host) == 5;
}

ct_status ct_rdzv_check(ct_pg *pg, double timeout) {
    decl me = {.world = pg->size, .nproc = pg->local_size, .nnodes = -1, .node = -1};
    if (ct_config_is_set(CT_CFG_GROUP_WORLD_SIZE) && ct_config_check(CT_CFG_GROUP_WORLD_SIZE) == CT_OK)
        me.nnodes = (int)ct_config_int(CT_CFG_GROUP_WORLD_SIZE);
    if (ct_config_is_set(CT_CFG_GROUP_RANK) && ct_config_check(CT_CFG_GROUP_RANK) == CT_OK)
        me.node = (int)ct_config_int(CT_CFG_GROUP_RANK);
    if (gethostname(me.host, sizeof me.host - 1) || !me.host[0]) snprintf(me.host, sizeof me.host, "?");
    for (char *c = me.host; *c; c++) if (*c == ' ') *c = '_';
    char val[160], key[128], bad[128];
    snprintf(val, sizeof val, "%d %d %d %d %s", me.world, me.nnodes, me.nproc, me.node, me.host);
    snprintf(bad, sizeof bad, "%sdecl/mismatch", pg->prefix);
    ct_status st;
    if (pg->rank != 0) { /* rank 0's declaration is the job's */
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "%sdecl/0", pg->prefix);
        if ((st = ct_store_get(pg->store, key, timeout, &v, &len)))
            return ct_error(st, "rendezvous: rank 0 never declared itself after %.0f s: %s", timeout, ct_last_error());
        char ref[160];
        snprintf(ref, sizeof ref, "%.*s", (int)(len < sizeof ref ? len : sizeof ref - 1), (const char *)v);
        free(v);
        decl r0 = {0};
        if (!decl_parse(ref, &r0)) return ct_error(CT_ERR_FORMAT, "rendezvous: rank 0's declaration '%s'", ref);
        if (r0.world != me.world || r0.nproc != me.nproc || (r0.nnodes > 0 && me.nnodes > 0 && r0.nnodes != me.nnodes)) {
            char a[96], b[96], an[128], bn[128], line[600];
            decl_text(&me, a, sizeof a);
            decl_text(&r0, b, sizeof b);
            decl_node(&me, pg->rank, an, sizeof an);
            decl_node(&r0, 0, bn, sizeof bn);
            snprintf(line, sizeof line, "the nodes disagree about the job: %s was started with %s, %s with %s; "
                     "start every node with the same --nnodes and --nproc-per-node", an, a, bn, b);
            ct_store_set(pg->store, bad, line, strlen(line)); /* the others stop waiting with the same line */
            return ct_error(CT_ERR_MISMATCH, "%s", line);
        }
    }
    snprintf(key, sizeof key, "%sdecl/%d", pg->prefix, pg->rank);
    if ((st = ct_store_set(pg->store, key, val, strlen(val)))) return st;

    /* everyone's declaration, in short waits so that a mismatch found elsewhere ends this one */
    int n = pg->size;
    char (*keys)[96] = calloc((size_t)n, sizeof *keys);
    const char **kp = calloc((size_t)n, sizeof *kp);
    int *miss = calloc((size_t)n, sizeof *miss);
    if (!keys || !kp || !miss) { free(keys); free(kp); free(miss); return ct_error(CT_ERR_NOMEM, "rendezvous keys"); }
    for (int r = 0; r < n; r++) {
        snprintf(keys[r], sizeof keys[r], "%sdecl/%d", pg->prefix, r);
        kp[r] = keys[r];
    }
    double deadline = ct_time_now() + timeout;
    for (;;) {
        double left = deadline - ct_time_now();
        st = ct_store_wait(pg->store, kp, n, left < 0.25 ? (left > 0.01 ? left : 0.01) : 0.25);
        if (st != CT_ERR_TIMEOUT) {
            if (st) st = ct_error(st, "rendezvous: %s", ct_last_error());
            break;
        }
        bool mism = false;
        if (ct_store_check(pg->store, bad, &mism) == CT_OK && mism) {
            void *v = NULL;
            size_t len = 0;
            if (ct_store_get(pg->store, bad, 1, &v, &len) == CT_OK) {
                st = ct_error(CT_ERR_MISMATCH, "%.*s", (int)len, (const char *)v);
                free(v);
                break;
            }
        }
        if (ct_time_now() < deadline) continue;
        int nm = 0;
        for (int r = 0; r < n; r++) {
            bool there = true;
            if (ct_store_check(pg->store, keys[r], &there) == CT_OK && !there) miss[nm++] = r;
        }
        char list[400];
        ct_rank_ranges(miss, nm, list, sizeof list);
        st = ct_error(CT_ERR_TIMEOUT, "rendezvous: %d of %d ranks never joined after %.0f s: rank(s) %s (not started, "
                      "or cannot reach the store)", nm, n, timeout, nm ? list : "?");
        break;
    }
    free(keys);
    free(kp);
    free(miss);
    return st;
}
