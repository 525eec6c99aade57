/* The one rule for "am I distributed, and which rank": every entry point (ct_dist_init,
 * `ctrain train`, `ctrain bench`) asks ct_dist_detect. A launcher's pair of variables is
 * read together (rank and size from the same launcher), in this order:
 *   RANK/WORLD_SIZE (ctrain run, torchrun, ct_spawn)  >  OMPI_COMM_WORLD_* (Open MPI's mpirun)
 *   >  PMI_RANK/PMI_SIZE (MPICH's hydra)  >  SLURM_PROCID/SLURM_NTASKS (srun).
 * A world of one while another launcher's variables say this process is one of several is an
 * error: `mpirun -np 2` with WORLD_SIZE=1 exported used to run two independent one-rank jobs
 * writing one output directory. */
#include "distributed/dist_internal.h"
#include "ctrain/config.h"

#include <stdio.h>

typedef struct {
    const char *launcher;
    ct_config_var rank, size, lrank, lsize; /* CT_CFG_COUNT_: none */
} source;

static const source SOURCES[] = {
    {"env", CT_CFG_RANK, CT_CFG_WORLD_SIZE, CT_CFG_LOCAL_RANK, CT_CFG_LOCAL_WORLD_SIZE},
    {"mpirun", CT_CFG_OMPI_RANK, CT_CFG_OMPI_SIZE, CT_CFG_OMPI_LOCAL_RANK, CT_CFG_OMPI_LOCAL_SIZE},
    {"pmi", CT_CFG_PMI_RANK, CT_CFG_PMI_SIZE, CT_CFG_COUNT_, CT_CFG_MPI_LOCALNRANKS},
    {"slurm", CT_CFG_SLURM_PROCID, CT_CFG_SLURM_NTASKS, CT_CFG_SLURM_LOCALID, CT_CFG_SLURM_NTASKS_PER_NODE},
    /* only a local size: what srun laid out (also without --ntasks-per-node); never chosen,
     * having no rank or size */
    {"slurm", CT_CFG_COUNT_, CT_CFG_COUNT_, CT_CFG_COUNT_, CT_CFG_SLURM_STEP_TASKS_PER_NODE},
};
#define NSOURCES (int)(sizeof SOURCES / sizeof SOURCES[0])

/* v's value into *out when set (a bad value is an error naming it); *out unchanged otherwise. */
static ct_status read_var(ct_config_var v, int *out, int *was_set) {
    *was_set = 0;
    if (v == CT_CFG_COUNT_ || !ct_config_is_set(v)) return CT_OK;
    ct_status st = ct_config_check(v);
    if (st) return st;
    *out = (int)ct_config_int(v);
    *was_set = 1;
    return CT_OK;
}

static const char *var_name(ct_config_var v) { return ct_config_info_of(v)->name; }

ct_status ct_dist_detect(ct_dist_world *out) {
    ct_dist_world w = {0, 1, 0, 1, "none", NULL, NULL};
    int chosen = -1, set_r = 0, set_s = 0;
    ct_status st;
    for (int i = 0; i < NSOURCES && chosen < 0; i++) {
        const source *s = &SOURCES[i];
        int r = 0, n = 1;
        if ((st = read_var(s->rank, &r, &set_r)) || (st = read_var(s->size, &n, &set_s))) return st;
        if (!set_r && !set_s) continue;
        chosen = i;
        w.rank = r;
        w.world_size = n;
        w.launcher = s->launcher;
        w.rank_var = var_name(s->rank);
        w.world_var = var_name(s->size);
        if (w.rank >= w.world_size)
            return ct_error(CT_ERR_INVALID, "%s=%d is not below %s=%d%s", w.rank_var, w.rank, w.world_var, w.world_size,
                            set_s ? "" : " (unset)");
        /* local rank and size: the same launcher's, else any launcher's, else the whole world */
        int lr = -1, ls = -1, set;
        if ((st = read_var(s->lrank, &lr, &set)) || (st = read_var(s->lsize, &ls, &set))) return st;
        for (int j = 0; j < NSOURCES && (lr < 0 || ls < 0); j++) {
            if (lr < 0 && (st = read_var(SOURCES[j].lrank, &lr, &set))) return st;
            if (ls < 0 && (st = read_var(SOURCES[j].lsize, &ls, &set))) return st;
        }
        w.local_world_size = ls >= 1 && ls <= n ? ls : n;
        w.local_rank = lr >= 0 && lr < w.local_world_size ? lr : w.rank % w.local_world_size;
    }
    if (w.world_size > 1) { *out = w; return CT_OK; }
    /* A world of one: refuse it when a multi-process launcher started this process. Slurm's
     * SLURM_NTASKS is the allocation's, also seen by a batch script's single process, so
     * for Slurm only a task other than the first (SLURM_PROCID > 0) proves a multi-task step. */
    for (int i = 0; i < NSOURCES; i++) {
        if (i == chosen) continue;
        if (SOURCES[i].rank == CT_CFG_SLURM_PROCID &&
            !(ct_config_is_set(CT_CFG_SLURM_PROCID) && ct_config_int(CT_CFG_SLURM_PROCID) > 0))
            continue;
        int n = 1, set;
        if ((st = read_var(SOURCES[i].size, &n, &set))) return st;
        if (set && n > 1)
            return ct_error(CT_ERR_INVALID,
                            "%s=%d but %s=%d: a launcher (%s) started %d processes, and each would run alone as rank 0 of "
                            "1 (writing the same output directory); unset %s so that they form one job",
                            w.world_var ? w.world_var : "WORLD_SIZE", w.world_size, var_name(SOURCES[i].size), n,
                            SOURCES[i].launcher, n, w.world_var ? w.world_var : "WORLD_SIZE");
    }
    if (ct_config_is_set(CT_CFG_PMIX_RANK) && ct_config_int(CT_CFG_PMIX_RANK) > 0)
        return ct_error(CT_ERR_INVALID,
                        "PMIX_RANK=%ld: a PMIx launcher started this process as one of several, but no world size is "
                        "known (no OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS or WORLD_SIZE)",
                        ct_config_int(CT_CFG_PMIX_RANK));
    *out = w;
    return CT_OK;
}
