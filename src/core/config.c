/* The configuration table: every environment variable ctrain reads or sets, parsed and
 * validated in one place. The only file that calls getenv/setenv/unsetenv. */
#include "ctrain/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NOMAX HUGE_VAL
#define L CT_CFG_LAUNCHER

static const ct_config_info table[CT_CFG_COUNT_] = {
    [CT_CFG_DEBUG] = {"CTRAIN_DEBUG", CT_CFG_CHOICE, "WARN", 0, 0, "ERROR|WARN|INFO|TRACE", NULL, 0,
                      "log level; lines carry the time and the rank"},
    [CT_CFG_DEBUG_SUBSYS] = {"CTRAIN_DEBUG_SUBSYS", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, 0,
                             "comma list of subsystems shown at INFO and TRACE (store, pg, shm, ddp, launcher...; default all)"},
    [CT_CFG_BACKEND] = {"CTRAIN_BACKEND", CT_CFG_CHOICE, NULL, 0, 0, "shm|mpi|gloo|hier|nccl", NULL, 0,
                        "process-group backend (default: shm on one machine; across machines hier when some machine has "
                        "several ranks, with mpi between machines under mpirun, else gloo; nccl: GPUs, CUDA builds)"},
    [CT_CFG_TIMEOUT] = {"CTRAIN_TIMEOUT", CT_CFG_FLOAT, "300", 0, NOMAX, NULL, "seconds", CT_CFG_ABOVE_MIN,
                        "how long a collective or the rendezvous may wait before failing"},
    [CT_CFG_FINGERPRINT] = {"CTRAIN_FINGERPRINT", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                            "check that all ranks issue the same collective (sequence, op, dtype, count)"},
    [CT_CFG_BIND] = {"CTRAIN_BIND", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                     "pin each local rank to its own share of the CPUs (shm backend)"},
    [CT_CFG_STORE_TOKEN] = {"CTRAIN_STORE_TOKEN", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, L | CT_CFG_SECRET,
                            "secret every client of the store proves it knows (challenge-response: it never crosses the "
                            "network): ctrain run makes one up for a single machine; on a multi-node job set it, or "
                            "CTRAIN_STORE_TOKEN_FILE, on every node (never on a command line, which every local user can "
                            "read); without it, ranks started from RANK/WORLD_SIZE share a random one through a 0600 file "
                            "(see XDG_RUNTIME_DIR)"},
    [CT_CFG_STORE_TOKEN_FILE] = {"CTRAIN_STORE_TOKEN_FILE", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, 0,
                                 "file holding the store secret, for ctrain run (as --rdzv-token-file) and for ranks "
                                 "started from RANK/WORLD_SIZE (CTRAIN_STORE_TOKEN wins when both are set): a regular file of this user, mode 0600 or stricter, 16 to 255 "
                                 "bytes, a trailing newline ignored"},
    [CT_CFG_STORE_HOSTED] = {"CTRAIN_STORE_HOSTED", CT_CFG_BOOL, "0", 0, 0, NULL, NULL, L,
                             "1: the launcher hosts the store; 0: rank 0 does"},
    [CT_CFG_RUN_ID] = {"CTRAIN_RUN_ID", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, L,
                       "job id; names the shared-memory segments of the run"},
    [CT_CFG_RESTART_COUNT] = {"CTRAIN_RESTART_COUNT", CT_CFG_INT, "0", 0, INT_MAX, NULL, NULL, L,
                              "restart attempt (0 the first); keeps the attempts' store keys apart"},
    [CT_CFG_GRACE] = {"CTRAIN_GRACE", CT_CFG_FLOAT, "5", 0, NOMAX, NULL, "seconds", CT_CFG_ABOVE_MIN,
                      "ct_spawn: delay between SIGTERM and SIGKILL when stopping the other ranks"},
    [CT_CFG_PREEMPT_SIGNALS] = {"CTRAIN_PREEMPT_SIGNALS", CT_CFG_STRING, "TERM,USR1", 0, 0, NULL, NULL, 0,
                                "signals that mean preemption (comma list of TERM, USR1, USR2, INT, HUP, XCPU, or none): "
                                "ctrain train finishes its step, the ranks agree on the step, save a checkpoint there "
                                "and exit 75; ctrain run forwards them and waits --preempt-grace seconds"},
    [CT_CFG_SHM_SPIN_US] = {"CTRAIN_SHM_SPIN_US", CT_CFG_FLOAT, NULL, 0, NOMAX, NULL, "microseconds", 0,
                            "shm backend: spin this long before sleeping (default: 4 measured futex wake-ups, 200 to "
                            "5000; 50 when ranks outnumber cores)"},
    [CT_CFG_SHM_CHUNK] = {"CTRAIN_SHM_CHUNK", CT_CFG_BYTES, NULL, 4096, (double)(1L << 30), NULL, NULL, 0,
                          "shm backend: chunk of a large all-reduce (must agree on all ranks; default 1M up to 4 "
                          "ranks, then 8M / (2 x ranks), at least 256k)"},
    [CT_CFG_SHM_SMALL] = {"CTRAIN_SHM_SMALL", CT_CFG_BYTES, "16k", 4096, (double)(1L << 30), NULL, NULL, 0,
                          "shm backend: largest message reduced in one copy-in step"},
    [CT_CFG_SHM_CMA] = {"CTRAIN_SHM_CMA", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                        "shm backend: all-reduce messages from 32 KiB (past CTRAIN_SHM_SMALL) by reading and writing the peers' "
                        "buffers directly (process_vm_readv; used when every rank may; must agree on all ranks; "
                        "unset: per message size, wherever it measures faster than the staged rounds)"},
    [CT_CFG_GLOO_IFADDR] = {"CTRAIN_GLOO_IFADDR", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, 0,
                            "gloo backend: this host's address for its connections (default: the one that reaches "
                            "MASTER_ADDR)"},
    [CT_CFG_GLOO_LOOP_NICE] = {"CTRAIN_GLOO_LOOP_NICE", CT_CFG_INT, "19", 0, 19, NULL, NULL, 0,
                               "gloo backend: nice value of Gloo's event-loop thread (0: the process's own). That loop "
                               "retries a busy connection without sleeping; where threads outnumber cores, at 19 it "
                               "lets the thread holding the connection run first (docs/multinode.md)"},
    [CT_CFG_HIER_ALLREDUCE] = {"CTRAIN_HIER_ALLREDUCE", CT_CFG_CHOICE, "auto", 0, 0, "auto|ordered|tree|rail", NULL,
                               0, "hier backend's all-reduce: ordered sums in world rank order (the same bits as one "
                               "machine; machines in turn: each link carries the buffer once per machine), tree "
                               "reduces every machine at once, rail splits the buffer over the local ranks and each "
                               "slice crosses the network on its own connection (a ring: 2(N-1)/N of it per link); "
                               "auto: ordered on 2 machines, rail on more (tree where their rank counts differ)"},
    [CT_CFG_HIER_CHAIN_CHUNK] = {"CTRAIN_HIER_CHAIN_CHUNK", CT_CFG_BYTES, NULL, 4096, (double)(1L << 30), NULL, NULL, 0,
                                 "sharded step across machines, ordered: the running sum goes to the next machine in "
                                 "chunks of this many bytes while the finished ones come back (must agree on all "
                                 "ranks; default: what the link carried in 4 ms, timed at the start, 256k to 8M)"},
    [CT_CFG_HIER_CHAIN_EARLY] = {"CTRAIN_HIER_CHAIN_EARLY", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                                 "sharded step across machines: each chunk of a share goes on to the next machine "
                                 "(ordered) or is all-reduced (rail) as soon as backward has finished it on every "
                                 "rank of this machine (0 on any rank: after backward)"},
    [CT_CFG_DDP_BUCKET_MB] = {"CTRAIN_DDP_BUCKET_MB", CT_CFG_FLOAT, "25", 0, 1e6, NULL, "MiB", CT_CFG_ABOVE_MIN,
                              "DDP gradient bucket size (PyTorch's bucket_cap_mb)"},
    [CT_CFG_DDP_FIRST_BUCKET_MB] = {"CTRAIN_DDP_FIRST_BUCKET_MB", CT_CFG_FLOAT, "1", 0, 1e6, NULL, "MiB",
                                    CT_CFG_ABOVE_MIN, "size of DDP's first bucket (the last gradients of backward)"},
    [CT_CFG_DDP_ZERO_COPY] = {"CTRAIN_DDP_ZERO_COPY", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                              "0: reduce gradients through staging slots instead of in place in shared memory"},
    [CT_CFG_DDP_SHARD_OPTIM] = {"CTRAIN_DDP_SHARD_OPTIM", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                                "0: every rank runs the whole optimizer step on its own copy of the parameters "
                                "instead of its share of one copy in shared memory (one copy per machine on the hier backend)"},
    [CT_CFG_DDP_SHARD_HIER] = {"CTRAIN_DDP_SHARD_HIER", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                               "0: across machines (hier backend), DDP's all-reduce overlapped with backward and a "
                               "whole optimizer step per rank, instead of the sharded step (one copy of the "
                               "parameters and state per machine; each rank sums its share over the machines "
                               "after backward)"},
    [CT_CFG_CPU_CAPABILITY] = {"CTRAIN_CPU_CAPABILITY", CT_CFG_CHOICE, "auto", 0, 0, "auto|avx2|none", NULL, 0,
                               "the most ctrain's hand-written CPU kernels use, as PyTorch's ATEN_CPU_CAPABILITY: "
                               "auto what the CPU has; avx2 no AVX-512 (nor AVX-512 BF16, VNNI, AMX): the kernels a CPU "
                               "without AVX-512 runs (AMD Zen 3); none neither AVX2 nor AVX-512 kernels (OpenBLAS and the "
                               "portable loops). Loops the compiler vectorised for -march keep their instructions"},
    [CT_CFG_GEMM] = {"CTRAIN_GEMM", CT_CFG_CHOICE, "auto", 0, 0, "auto|openblas|avx2", NULL, 0,
                     "f32 GEMMs: auto runs ctrain's own kernels, AVX-512 where the CPU has it, else AVX2 and FMA (the "
                     "same bits), OpenBLAS for tiny products; openblas: every f32 GEMM through OpenBLAS; avx2: the "
                     "AVX2 kernels even on an AVX-512 CPU (to compare them); docs/benchmarks.md"},
    [CT_CFG_GEMM_BF16] = {"CTRAIN_GEMM_BF16", CT_CFG_CHOICE, "auto", 0, 0, "auto|rounded|native|amx", NULL, 0,
                          "bf16 GEMMs: auto takes AMX-BF16 tiles where the CPU has them, else native on AMD, else "
                          "rounded: operands rounded to bf16 on the f32 kernel; native: AVX-512 BF16 vdpbf16ps "
                          "(slower than rounded on Intel, faster on AMD Zen 4); amx forces AMX (rounded where absent). Each path sums in its "
                          "own order (other bits). The fused attention on a bf16 qkv follows: AMX (bf16 tile products) "
                          "or, on the other paths, f32 kernels on the widened values; docs/bench/amp.md"},
    [CT_CFG_CUDA_MATMUL] = {"CTRAIN_CUDA_MATMUL", CT_CFG_CHOICE, "highest", 0, 0, "highest|high|medium", NULL, 0,
                            "f32 GEMMs on a GPU, as torch.set_float32_matmul_precision: highest computes in f32, "
                            "high on TF32 tensor cores, medium on bf16 tensor cores (f32 in and out, f32 "
                            "accumulation)"},
    [CT_CFG_CUDA_ATTENTION] = {"CTRAIN_CUDA_ATTENTION", CT_CFG_CHOICE, "tc", 0, 0, "rows|tiled|tc|mma", NULL, 0,
                               "fused attention on a GPU: tc takes the tensor-core (WMMA) kernels for bf16/f16 and "
                               "head dims 32, 64 and 128; mma the register-tile tensor-core (mma.sync) kernels for "
                               "bf16/f16 and head dims 32 and 64 (not yet run on a GPU), tc's beyond; tiled the "
                               "shared-memory tile kernels for head dims 32 and 64, rows one thread per query or "
                               "key row; where the chosen kernels do not fit, "
                               "tiled's or rows' (tc, tiled and rows checked on an H200; tc, then tiled, the fastest there)"},
    [CT_CFG_CUDA_LOWP_GRADS] = {"CTRAIN_CUDA_LOWP_GRADS", CT_CFG_BOOL, "1", 0, 0, NULL, NULL, 0,
                                "under bf16/fp16 autocast on a GPU, the gradients of bf16/f16 activations in that "
                                "type, as PyTorch holds them (the LM head's logits, the linears' inputs and outputs); "
                                "0: in f32, rounded to the same values (more memory and traffic, for comparing)"},
    [CT_CFG_DEVICE_PROFILE] = {"CTRAIN_DEVICE_PROFILE", CT_CFG_BOOL, "0", 0, 0, NULL, NULL, 0,
                               "1: wait for the device around every device op, forward and backward, and keep "
                               "each op's time (slows the step; for finding where a GPU step goes)"},
    [CT_CFG_OMP_NUM_THREADS] = {"OMP_NUM_THREADS", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, L | CT_CFG_LIST,
                                "threads per rank (default cores / local ranks; ctrain run sets that when unset)"},
    [CT_CFG_DATA_DIR] = {"CTRAIN_DATA_DIR", CT_CFG_STRING, "/usr/share/datasets/fashion-mnist", 0, 0, NULL, NULL, 0,
                         "default of ctrain train --data-dir"},
    [CT_CFG_OUTPUT_DIR] = {"CTRAIN_OUTPUT_DIR", CT_CFG_STRING, "output", 0, 0, NULL, NULL, 0,
                           "default of ctrain train --output-dir"},
    [CT_CFG_PATH] = {"PATH", CT_CFG_STRING, "/usr/bin:/bin", 0, 0, NULL, NULL, 0,
                     "where ctrain run looks for a program named without a slash"},
    [CT_CFG_XDG_RUNTIME_DIR] = {"XDG_RUNTIME_DIR", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, 0,
                                "private per-user directory; holds the store token of jobs started from RANK/WORLD_SIZE "
                                "(default /tmp/ctrain-<uid>)"},
    [CT_CFG_RUNTIME_DIR] = {"CTRAIN_RUNTIME_DIR", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, 0,
                            "private directory for the store token and launcher pid files, used instead of "
                            "$XDG_RUNTIME_DIR/ctrain or /tmp/ctrain-<uid> (created 0700; must be this user's with no "
                            "access for others); the same on every rank of a machine"},
    [CT_CFG_HOME] = {"HOME", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, 0,
                     "when /tmp/ctrain-<uid> exists but is not this user's private directory (another user made "
                     "it), $HOME/.cache/ctrain is used instead, with a warning"},
    [CT_CFG_RANK] = {"RANK", CT_CFG_INT, "0", 0, INT_MAX, NULL, NULL, L, "this process's global rank"},
    [CT_CFG_WORLD_SIZE] = {"WORLD_SIZE", CT_CFG_INT, "1", 1, INT_MAX, NULL, NULL, L, "number of ranks in the job"},
    [CT_CFG_LOCAL_RANK] = {"LOCAL_RANK", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, L,
                           "rank on this machine (default RANK)"},
    [CT_CFG_LOCAL_WORLD_SIZE] = {"LOCAL_WORLD_SIZE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, L,
                                 "ranks on this machine (default WORLD_SIZE)"},
    [CT_CFG_MASTER_ADDR] = {"MASTER_ADDR", CT_CFG_STRING, "127.0.0.1", 0, 0, NULL, NULL, L,
                            "host of the store (node 0's launcher, or rank 0)"},
    [CT_CFG_MASTER_PORT] = {"MASTER_PORT", CT_CFG_INT, "29500", 1, 65535, NULL, NULL, L, "port of the store"},
    [CT_CFG_GROUP_RANK] = {"GROUP_RANK", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, L,
                           "this machine's index (torchrun's; named when the nodes disagree about the job)"},
    [CT_CFG_GROUP_WORLD_SIZE] = {"GROUP_WORLD_SIZE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, L,
                                 "number of machines (torchrun's; checked to be the same on every node)"},
    [CT_CFG_ROLE_RANK] = {"ROLE_RANK", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, L,
                          "rank within the role (torchrun's; ctrain does not read it)"},
    [CT_CFG_ROLE_WORLD_SIZE] = {"ROLE_WORLD_SIZE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, L,
                                "ranks in the role (torchrun's; ctrain does not read it)"},
    [CT_CFG_ROLE_NAME] = {"ROLE_NAME", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, L,
                          "worker role, always default (torchrun's; ctrain does not read it)"},
    [CT_CFG_TORCHELASTIC_RESTART_COUNT] = {"TORCHELASTIC_RESTART_COUNT", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, L,
                                           "restart attempt (torchrun's): above 0, ctrain train resumes from the newest "
                                           "checkpoint; stands for CTRAIN_RESTART_COUNT when that is unset"},
    [CT_CFG_TORCHELASTIC_MAX_RESTARTS] = {"TORCHELASTIC_MAX_RESTARTS", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, L,
                                          "--max-restarts (torchrun's; ctrain does not read it)"},
    [CT_CFG_TORCHELASTIC_RUN_ID] = {"TORCHELASTIC_RUN_ID", CT_CFG_STRING, NULL, 0, 0, NULL, NULL, L,
                                    "job id (torchrun's; ctrain reads CTRAIN_RUN_ID)"},
    [CT_CFG_TORCHELASTIC_USE_AGENT_STORE] = {"TORCHELASTIC_USE_AGENT_STORE", CT_CFG_BOOL, NULL, 0, 0, NULL, NULL, L,
                                             "True: torchrun's agent hosts a PyTorch c10d TCPStore on MASTER_ADDR:"
                                             "MASTER_PORT and every rank joins it as a client (no token)"},
    [CT_CFG_OMPI_RANK] = {"OMPI_COMM_WORLD_RANK", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, 0,
                          "Open MPI's rank (used when RANK is unset)"},
    [CT_CFG_OMPI_SIZE] = {"OMPI_COMM_WORLD_SIZE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, 0,
                          "Open MPI's world size; without MASTER_PORT it selects the mpi or hier backend"},
    [CT_CFG_OMPI_LOCAL_RANK] = {"OMPI_COMM_WORLD_LOCAL_RANK", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, 0,
                                "Open MPI's local rank (used when LOCAL_RANK is unset)"},
    [CT_CFG_OMPI_LOCAL_SIZE] = {"OMPI_COMM_WORLD_LOCAL_SIZE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, 0,
                                "Open MPI's local size (used when LOCAL_WORLD_SIZE is unset)"},
    [CT_CFG_PMI_RANK] = {"PMI_RANK", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, 0, "MPICH/PMI rank"},
    [CT_CFG_PMI_SIZE] = {"PMI_SIZE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, 0, "MPICH/PMI world size"},
    [CT_CFG_MPI_LOCALNRANKS] = {"MPI_LOCALNRANKS", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, 0,
                                "MPICH's ranks on this machine"},
    [CT_CFG_SLURM_PROCID] = {"SLURM_PROCID", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, 0, "Slurm's rank"},
    [CT_CFG_SLURM_NTASKS] = {"SLURM_NTASKS", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, CT_CFG_LIST,
                             "Slurm's world size"},
    [CT_CFG_SLURM_NTASKS_PER_NODE] = {"SLURM_NTASKS_PER_NODE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, CT_CFG_LIST,
                                      "Slurm's ranks per machine"},
    [CT_CFG_SLURM_LOCALID] = {"SLURM_LOCALID", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, 0,
                              "Slurm's rank on this machine"},
    [CT_CFG_PMIX_RANK] = {"PMIX_RANK", CT_CFG_INT, NULL, 0, INT_MAX, NULL, NULL, 0,
                          "PMIx's rank (a PMIx launcher started this process as one of several)"},
    [CT_CFG_SLURM_STEP_TASKS_PER_NODE] = {"SLURM_STEP_TASKS_PER_NODE", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL,
                                          CT_CFG_LIST, "srun's ranks on the first machine of the step ('2(x2)': 2 on "
                                          "each of 2); ranks per machine when SLURM_NTASKS_PER_NODE is unset"},
    [CT_CFG_SLURM_STEP_NUM_NODES] = {"SLURM_STEP_NUM_NODES", CT_CFG_INT, NULL, 1, INT_MAX, NULL, NULL, 0,
                                     "srun's machine count; several without PMIx need MASTER_ADDR for the store"},
};
#undef L

typedef struct {
    long i;   /* int, bytes, bool (0/1), choice (index, -1 none) */
    double f; /* float */
} value;

typedef struct {
    char *raw;       /* copy of the text last parsed; NULL: unset or empty */
    const char *env; /* the environment's own string for raw */
    int bad, warned;
    value v;         /* parsed value; the default's when unset or bad */
} state;

static state st[CT_CFG_COUNT_];
static value dflt[CT_CFG_COUNT_];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

const ct_config_info *ct_config_info_of(ct_config_var v) {
    return (unsigned)v < CT_CFG_COUNT_ ? &table[v] : NULL;
}

int ct_config_find(const char *name) {
    for (int k = 0; name && k < CT_CFG_COUNT_; k++)
        if (!strcmp(table[k].name, name)) return k;
    return -1;
}

const char *ct_config_type_name(ct_config_type t) {
    static const char *n[] = {"string", "int", "float", "bool", "choice", "bytes"};
    return (unsigned)t < sizeof n / sizeof n[0] ? n[t] : "?";
}

void ct_config_expected(ct_config_var v, char *out, size_t n) {
    const ct_config_info *c = ct_config_info_of(v);
    CT_CHECK(c, "ct_config_expected: no configuration variable %d", (int)v);
    const char *u = c->unit ? " of " : "", *un = c->unit ? c->unit : "";
    switch (c->type) {
    case CT_CFG_STRING: snprintf(out, n, "any text"); break;
    case CT_CFG_BOOL: snprintf(out, n, "1, true, on, yes or 0, false, off, no, none"); break;
    case CT_CFG_CHOICE: {
        size_t o = (size_t)snprintf(out, n, "one of ");
        for (const char *p = c->choices; *p && o + 3 < n; p++) {
            if (*p == '|') o += (size_t)snprintf(out + o, n - o, ", ");
            else out[o++] = *p, out[o] = 0;
        }
        break;
    }
    case CT_CFG_INT:
    case CT_CFG_BYTES:
    case CT_CFG_FLOAT: {
        const char *what = c->type == CT_CFG_INT ? "an integer" : c->type == CT_CFG_BYTES ? "a size in bytes" : "a number";
        const char *sfx = c->type == CT_CFG_BYTES ? " (k and M suffixes allowed)"
                          : c->flags & CT_CFG_LIST ? " (a ',...' or '(...)' after it is ignored)" : "";
        const char *ge = c->flags & CT_CFG_ABOVE_MIN ? ">" : ">=";
        if (c->max == NOMAX || (c->type == CT_CFG_INT && c->max >= INT_MAX))
            snprintf(out, n, "%s%s%s %s %.15g%s", what, u, un, ge, c->min, sfx);
        else if (c->flags & CT_CFG_ABOVE_MIN)
            snprintf(out, n, "%s%s%s > %.15g and <= %.15g%s", what, u, un, c->min, c->max, sfx);
        else snprintf(out, n, "%s%s%s between %.15g and %.15g%s", what, u, un, c->min, c->max, sfx);
        break;
    }
    }
}

static int in_range(const ct_config_info *c, double x) {
    if (x != x) return 0;
    if (c->flags & CT_CFG_ABOVE_MIN ? !(x > c->min) : !(x >= c->min)) return 0;
    return x <= c->max;
}

/* 0 and *out on success, -1 when text is not a valid value of c. */
static int parse(const ct_config_info *c, const char *text, value *out) {
    value v = {0, 0};
    char *e;
    errno = 0;
    switch (c->type) {
    case CT_CFG_STRING: break;
    case CT_CFG_INT: {
        long x = strtol(text, &e, 10);
        if (e == text || errno || !(*e == 0 || ((c->flags & CT_CFG_LIST) && (*e == ',' || *e == '(')))) return -1;
        if (!in_range(c, (double)x)) return -1;
        v.i = x;
        break;
    }
    case CT_CFG_FLOAT:
        v.f = strtod(text, &e);
        if (e == text || *e || errno || !isfinite(v.f) || !in_range(c, v.f)) return -1;
        break;
    case CT_CFG_BYTES: {
        double x = strtod(text, &e);
        if (e == text || errno) return -1;
        if (*e == 'k' || *e == 'K') x *= 1024, e++;
        else if (*e == 'm' || *e == 'M') x *= 1024 * 1024, e++;
        if (*e || !in_range(c, x)) return -1;
        v.i = (long)x;
        break;
    }
    case CT_CFG_BOOL: {
        static const char *yes[] = {"1", "true", "on", "yes"}, *no[] = {"0", "false", "off", "no", "none"};
        v.i = -1;
        for (size_t k = 0; k < 4; k++) if (!strcasecmp(text, yes[k])) v.i = 1;
        for (size_t k = 0; k < 5; k++) if (!strcasecmp(text, no[k])) v.i = 0;
        if (v.i < 0) return -1;
        break;
    }
    case CT_CFG_CHOICE: {
        v.i = -1;
        size_t n = strlen(text);
        int k = 0;
        for (const char *p = c->choices; p; k++) {
            const char *bar = strchr(p, '|');
            size_t len = bar ? (size_t)(bar - p) : strlen(p);
            if (len == n && !strncasecmp(p, text, n)) { v.i = k; break; }
            p = bar ? bar + 1 : NULL;
        }
        if (v.i < 0) return -1;
        break;
    }
    }
    *out = v;
    return 0;
}

/* Brings entry k in line with the environment (called with mu held). */
static void refresh(int k) {
    state *s = &st[k];
    const char *e = getenv(table[k].name);
    if (e && !*e) e = NULL;
    if (!e && !s->raw) return;
    if (e && s->raw && !strcmp(e, s->raw)) { s->env = e; return; }
    free(s->raw);
    s->raw = e ? strdup(e) : NULL;
    s->env = s->raw ? e : NULL;
    s->warned = 0;
    s->bad = s->raw && parse(&table[k], s->raw, &s->v) != 0;
    if (!s->raw || s->bad) s->v = dflt[k];
}

static void lock(void) { pthread_mutex_lock(&mu); }
static void unlock(void) { pthread_mutex_unlock(&mu); }

static void init(void) {
    for (int k = 0; k < CT_CFG_COUNT_; k++) {
        dflt[k] = (value){table[k].type == CT_CFG_CHOICE ? -1 : 0, 0};
        /* a default that does not parse is a bug in the table (test_config checks them all) */
        if (table[k].dflt && parse(&table[k], table[k].dflt, &dflt[k])) CT_FATAL("bad default for %s", table[k].name);
        st[k].v = dflt[k];
    }
    /* a child forked while another thread held the lock would inherit it locked */
    pthread_atfork(lock, unlock, unlock);
    for (int k = 0; k < CT_CFG_COUNT_; k++) refresh(k);
}

/* Locks and refreshes entry v; checks that it exists and has one of the types wanted.
 * warn: a bad value is reported on stderr (once), for accessors that fall back silently. */
static state *enter(ct_config_var v, int types, int warn) {
    pthread_once(&once, init);
    CT_CHECK((unsigned)v < CT_CFG_COUNT_, "no configuration variable %d", (int)v);
    CT_CHECK(types & (1 << table[v].type), "%s is a %s, not read that way", table[v].name,
             ct_config_type_name(table[v].type));
    lock();
    refresh((int)v);
    state *s = &st[v];
    if (warn && s->bad && !s->warned) {
        char exp[160];
        ct_config_expected(v, exp, sizeof exp);
        fprintf(stderr, "ctrain: warning: %s='%.200s': expected %s; %s%s\n", table[v].name, s->raw, exp,
                table[v].dflt ? "using the default " : "ignoring it", table[v].dflt ? table[v].dflt : "");
        s->warned = 1;
    }
    return s;
}

#define ANY 0x3f
#define T(t) (1 << (t))

bool ct_config_is_set(ct_config_var v) {
    state *s = enter(v, ANY, 0);
    bool r = s->raw != NULL;
    unlock();
    return r;
}

const char *ct_config_str(ct_config_var v) {
    state *s = enter(v, ANY, 1);
    const char *r = s->raw && !s->bad ? s->env : table[v].dflt;
    unlock();
    return r;
}

long ct_config_int(ct_config_var v) {
    long r = enter(v, T(CT_CFG_INT) | T(CT_CFG_BYTES), 1)->v.i;
    unlock();
    return r;
}

double ct_config_float(ct_config_var v) {
    double r = enter(v, T(CT_CFG_FLOAT), 1)->v.f;
    unlock();
    return r;
}

bool ct_config_bool(ct_config_var v) {
    bool r = enter(v, T(CT_CFG_BOOL), 1)->v.i > 0;
    unlock();
    return r;
}

int ct_config_choice(ct_config_var v) {
    int r = (int)enter(v, T(CT_CFG_CHOICE), 1)->v.i;
    unlock();
    return r;
}

/* auto: one machine's bits where that costs little (2 machines); past that the ordered
 * chain's traffic grows with the machines and the rail's does not (docs/scaling.md) */
ct_hier_allreduce ct_config_hier_allreduce(int machines) {
    int mode = ct_config_choice(CT_CFG_HIER_ALLREDUCE); /* auto|ordered|tree|rail */
    return mode > 0 ? (ct_hier_allreduce)mode : machines <= 2 ? CT_HIER_ORDERED : CT_HIER_RAIL;
}

/* ct_error after the lock is released: it logs, and logging reads CTRAIN_DEBUG. */
static ct_status bad_value(ct_config_var v, const char *text) {
    char exp[160];
    ct_config_expected(v, exp, sizeof exp);
    return ct_error(CT_ERR_INVALID, "%s='%.200s': expected %s", table[v].name, text, exp);
}

ct_status ct_config_check(ct_config_var v) {
    state *s = enter(v, ANY, 0);
    char text[256] = "";
    int bad = s->bad;
    if (bad) snprintf(text, sizeof text, "%s", s->raw);
    s->warned = 1; /* the caller reports it */
    unlock();
    return bad ? bad_value(v, text) : CT_OK;
}

ct_status ct_config_load(void) {
    for (int k = 0; k < CT_CFG_COUNT_; k++) {
        ct_status r = ct_config_check((ct_config_var)k);
        if (r) return r;
    }
    return CT_OK;
}

ct_status ct_config_set(const char *name, const char *value_text) {
    int k = ct_config_find(name);
    if (k < 0) return ct_error(CT_ERR_INVALID, "%s is not in ctrain's configuration table", name ? name : "(null)");
    if (!value_text) value_text = "";
    value tmp;
    if (*value_text && parse(&table[k], value_text, &tmp)) return bad_value((ct_config_var)k, value_text);
    pthread_once(&once, init);
    lock();
    int rc = setenv(name, value_text, 1), err = errno;
    refresh(k);
    unlock();
    return rc ? ct_error(CT_ERR_NOMEM, "setenv %s: %s", name, strerror(err)) : CT_OK;
}

ct_status ct_config_unset(const char *name) {
    int k = ct_config_find(name);
    if (k < 0) return ct_error(CT_ERR_INVALID, "%s is not in ctrain's configuration table", name ? name : "(null)");
    pthread_once(&once, init);
    lock();
    unsetenv(name);
    refresh(k);
    unlock();
    return CT_OK;
}
