/* ctrain/config.h — every environment variable ctrain reads or sets, in one table.
 *
 *   if (ct_config_load() != CT_OK) {                  // validate them all at start-up
 *       fprintf(stderr, "%s\n", ct_last_error());     // CTRAIN_TIMEOUT='abc': expected a number of seconds > 0
 *       return 2;
 *   }
 *   double timeout = ct_config_float(CT_CFG_TIMEOUT); // 300 unless CTRAIN_TIMEOUT says otherwise
 *   if (ct_config_is_set(CT_CFG_RANK)) ...            // present and not empty
 *   ct_config_set("RANK", "3");                       // environment and cache (a fork()ed child sees it)
 *
 * Each variable has a type, a default, a valid range or set of choices and a line of help
 * (`ctrain env --vars` prints them; docs/environment.md is generated from the same table).
 * Values are parsed once, on first use; a program that changes the environment itself with
 * setenv() is still seen, because an entry is parsed again when its text has changed.
 * An empty value counts as unset.
 *
 * Bad values: ct_config_load() and ct_config_check() return CT_ERR_INVALID with a message
 * naming the variable, its value and what was expected. The typed accessors never fail:
 * for a bad value they return the default and print one warning. The ctrain command calls
 * ct_config_load() before any subcommand, so a bad value never gets that far.
 * Asking for a variable with the wrong type, or an id outside the table, is a programmer
 * error (CT_CHECK).
 */
#ifndef CTRAIN_CONFIG_H
#define CTRAIN_CONFIG_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CT_CFG_STRING, /* any text */
    CT_CFG_INT,    /* decimal integer in [min, max] */
    CT_CFG_FLOAT,  /* number in [min, max] (or (min, max] with CT_CFG_ABOVE_MIN) */
    CT_CFG_BOOL,   /* 1/true/on/yes or 0/false/off/no/none */
    CT_CFG_CHOICE, /* one of `choices`, case-insensitive */
    CT_CFG_BYTES,  /* a size in bytes, optional k or M suffix, in [min, max] */
} ct_config_type;

/* flags */
#define CT_CFG_LAUNCHER 1u  /* set by `ctrain run` / ct_spawn for the workers */
#define CT_CFG_LIST 2u      /* int: a trailing ",..." or "(...)" is ignored (OpenMP lists, Slurm's 2(x3)) */
#define CT_CFG_ABOVE_MIN 4u /* float: min itself is not allowed */
#define CT_CFG_SECRET 8u    /* never printed (ctrain env --vars shows "(hidden)") */

typedef enum {
    /* logging */
    CT_CFG_DEBUG, CT_CFG_DEBUG_SUBSYS,
    /* process groups */
    CT_CFG_BACKEND, CT_CFG_TIMEOUT, CT_CFG_FINGERPRINT, CT_CFG_BIND, CT_CFG_STORE_TOKEN, CT_CFG_STORE_TOKEN_FILE,
    CT_CFG_STORE_HOSTED,
    CT_CFG_RUN_ID, CT_CFG_RESTART_COUNT, CT_CFG_GRACE, CT_CFG_PREEMPT_SIGNALS,
    CT_CFG_SHM_SPIN_US, CT_CFG_SHM_CHUNK, CT_CFG_SHM_SMALL, CT_CFG_SHM_CMA, CT_CFG_GLOO_IFADDR, CT_CFG_GLOO_LOOP_NICE,
    CT_CFG_HIER_ALLREDUCE, CT_CFG_HIER_CHAIN_CHUNK, CT_CFG_HIER_CHAIN_EARLY,
    /* DDP */
    CT_CFG_DDP_BUCKET_MB, CT_CFG_DDP_FIRST_BUCKET_MB, CT_CFG_DDP_ZERO_COPY, CT_CFG_DDP_SHARD_OPTIM, CT_CFG_DDP_SHARD_HIER,
    /* kernels and threads */
    CT_CFG_CPU_CAPABILITY, CT_CFG_GEMM, CT_CFG_GEMM_BF16, CT_CFG_CUDA_MATMUL, CT_CFG_CUDA_ATTENTION, CT_CFG_CUDA_LOWP_GRADS, CT_CFG_DEVICE_PROFILE, CT_CFG_OMP_NUM_THREADS,
    /* paths */
    CT_CFG_DATA_DIR, CT_CFG_OUTPUT_DIR, CT_CFG_PATH, CT_CFG_XDG_RUNTIME_DIR, CT_CFG_RUNTIME_DIR, CT_CFG_HOME,
    /* torchrun's worker environment */
    CT_CFG_RANK, CT_CFG_WORLD_SIZE, CT_CFG_LOCAL_RANK, CT_CFG_LOCAL_WORLD_SIZE, CT_CFG_MASTER_ADDR,
    CT_CFG_MASTER_PORT, CT_CFG_GROUP_RANK, CT_CFG_GROUP_WORLD_SIZE, CT_CFG_ROLE_RANK, CT_CFG_ROLE_WORLD_SIZE,
    CT_CFG_ROLE_NAME, CT_CFG_TORCHELASTIC_RESTART_COUNT, CT_CFG_TORCHELASTIC_MAX_RESTARTS,
    CT_CFG_TORCHELASTIC_RUN_ID, CT_CFG_TORCHELASTIC_USE_AGENT_STORE,
    /* other launchers: mpirun, MPICH/PMI, Slurm */
    CT_CFG_OMPI_RANK, CT_CFG_OMPI_SIZE, CT_CFG_OMPI_LOCAL_RANK, CT_CFG_OMPI_LOCAL_SIZE, CT_CFG_PMI_RANK,
    CT_CFG_PMI_SIZE, CT_CFG_MPI_LOCALNRANKS, CT_CFG_SLURM_PROCID, CT_CFG_SLURM_NTASKS,
    CT_CFG_SLURM_NTASKS_PER_NODE, CT_CFG_SLURM_LOCALID, CT_CFG_PMIX_RANK, CT_CFG_SLURM_STEP_TASKS_PER_NODE,
    CT_CFG_SLURM_STEP_NUM_NODES,
    CT_CFG_COUNT_
} ct_config_var;

typedef struct ct_config_info {
    const char *name;     /* "CTRAIN_TIMEOUT" */
    ct_config_type type;
    const char *dflt;     /* as text; NULL: none, or one the code derives (the help says how) */
    double min, max;      /* int, float, bytes */
    const char *choices;  /* choice: "ERROR|WARN|INFO|TRACE" */
    const char *unit;     /* float: "seconds", "MiB"; NULL: none */
    unsigned flags;       /* CT_CFG_LAUNCHER | CT_CFG_LIST | CT_CFG_ABOVE_MIN | CT_CFG_SECRET */
    const char *help;     /* one line */
} ct_config_info;

/* The table entry of v, or NULL outside [0, CT_CFG_COUNT_). */
const ct_config_info *ct_config_info_of(ct_config_var v);
/* The id of a variable name, or -1 when it is not in the table. */
int ct_config_find(const char *name);
/* "string", "int", "float", "bool", "choice", "bytes" */
const char *ct_config_type_name(ct_config_type t);
/* What a valid value looks like: "a number of seconds > 0", "one of shm, mpi". */
void ct_config_expected(ct_config_var v, char *out, size_t n);

/* Parses and validates every variable; CT_ERR_INVALID for the first bad one. */
ct_status ct_config_load(void);
/* CT_OK, or CT_ERR_INVALID when v is set to a bad value (the message names it). */
ct_status ct_config_check(ct_config_var v);

bool ct_config_is_set(ct_config_var v);       /* present and not empty (valid or not) */
/* The environment's text, else the default (NULL if none). Like getenv(), the pointer may
 * not survive the next change of that variable. */
const char *ct_config_str(ct_config_var v);
long ct_config_int(ct_config_var v);          /* int and bytes; 0 when unset without a default */
double ct_config_float(ct_config_var v);      /* 0 when unset without a default */
bool ct_config_bool(ct_config_var v);         /* false when unset without a default */
int ct_config_choice(ct_config_var v);        /* index into choices; -1 when unset without a default */
/* CTRAIN_HIER_ALLREDUCE for a job on `machines` machines, auto resolved (ordered on 2, rail on
 * more): the one place both the hier backend and the sharded step (ct_zero) take it from. */
typedef enum { CT_HIER_ORDERED = 1, CT_HIER_TREE, CT_HIER_RAIL } ct_hier_allreduce;
ct_hier_allreduce ct_config_hier_allreduce(int machines);

/* The only way ctrain changes its environment: validates the value, then updates the
 * process environment and the cache. CT_ERR_INVALID for a name outside the table or a bad
 * value (nothing changes then). An empty value unsets the variable in effect. */
ct_status ct_config_set(const char *name, const char *value);
ct_status ct_config_unset(const char *name);

#ifdef __cplusplus
}
#endif
#endif
