/* Thread count for kernels and the BLAS, and facts about the machine for `ctrain env`.
 * OpenMP and OpenBLAS get the same count so they never oversubscribe each other. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ctrain/config.h"
#include "ctrain/core.h"
#include "ctrain/tensor.h"
#include "core/kernel.h"

/* What Debian's OpenBLAS mallocs per thread when its thread count is set (blas_memory_alloc) */
#define BLAS_BYTES_PER_THREAD ((uint64_t)128 << 20)
#define AS_RESERVE ((uint64_t)1 << 30)

/* Address space in use now (VmSize), 0 if unknown. */
static uint64_t vm_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

int ct_max_num_threads(char *why, size_t cap) {
    if (why && cap) why[0] = 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return CT_MAX_THREADS;
    uint64_t lim = (uint64_t)rl.rlim_cur, used = vm_bytes() + AS_RESERVE;
    uint64_t n = lim > used ? (lim - used) / BLAS_BYTES_PER_THREAD : 0;
    if (n < 1) n = 1; /* one thread is what any BLAS call needs anyway */
    if (n >= CT_MAX_THREADS) return CT_MAX_THREADS;
    if (why && cap)
        snprintf(why, cap, "the address-space limit (ulimit -v) of %.1f GiB leaves room for the 128 MiB OpenBLAS reserves per "
                 "thread for %d threads", (double)lim / (double)(1u << 30), (int)n);
    return (int)n;
}

void ct_set_num_threads(int n) {
    if (n < 1) n = 1;
    char why[256];
    int max = ct_max_num_threads(why, sizeof why);
    if (n > max) {
        CT_LOG_WARN_("threads", "%d threads asked, %d used: %s", n, max, why[0] ? why : "the most ctrain runs");
        n = max;
    }
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    /* GEMM workspace for n threads; short of memory, GEMMs use fewer threads (same bits) */
    if (ct_kernel_reserve(n) != CT_OK) CT_LOG_WARN_("threads", "%s; GEMMs run on fewer threads", ct_last_error());
}
int ct_get_num_threads(void) { return omp_get_max_threads(); }

static ct_kernel_reserve_fn reserve_fn; /* set by the kernels at load time, before main */
void ct_kernel_register_reserve(ct_kernel_reserve_fn fn) { reserve_fn = fn; }
ct_status ct_kernel_reserve(int nthreads) { return reserve_fn ? reserve_fn(nthreads) : CT_OK; }

int ct_default_num_threads(void) {
    long e = ct_config_int(CT_CFG_OMP_NUM_THREADS); /* 0 when unset */
    if (e > 0) return (int)e;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* ranks on this machine, from the launcher that set them (the order of ct_dist_detect) */
    static const ct_config_var LOCAL[] = {CT_CFG_LOCAL_WORLD_SIZE, CT_CFG_OMPI_LOCAL_SIZE, CT_CFG_MPI_LOCALNRANKS,
                                          CT_CFG_SLURM_NTASKS_PER_NODE};
    long local = 0;
    for (size_t i = 0; i < sizeof LOCAL / sizeof LOCAL[0] && local < 1; i++) local = ct_config_int(LOCAL[i]);
    if (local < 1) local = 1;
    long n = cores / local;
    return n < 1 ? 1 : (int)n;
}

ct_cpu_level ct_cpu_capability(void) {
    static int lv = -1; /* read once: kernels ask per call */
    int v = __atomic_load_n(&lv, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
        v = avx512 ? CT_CPU_AVX512 : avx2 ? CT_CPU_AVX2 : CT_CPU_BASELINE;
        int cap = ct_config_choice(CT_CFG_CPU_CAPABILITY); /* auto|avx2|none */
        if (cap == 1 && v > CT_CPU_AVX2) v = CT_CPU_AVX2;
        if (cap == 2) v = CT_CPU_BASELINE;
        __atomic_store_n(&lv, v, __ATOMIC_RELAXED);
    }
    return (ct_cpu_level)v;
}

const char *ct_simd_level(void) {
    if (__builtin_cpu_supports("avx512f")) return __builtin_cpu_supports("avx512bw") ? "AVX-512 (F, BW)" : "AVX-512F";
    if (__builtin_cpu_supports("avx2")) return __builtin_cpu_supports("fma") ? "AVX2 + FMA" : "AVX2";
    if (__builtin_cpu_supports("avx")) return "AVX";
    if (__builtin_cpu_supports("sse4.2")) return "SSE4.2";
    return "baseline x86-64";
}

void ct_cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

const char *ct_blas_info(void) {
    static char buf[256];
    snprintf(buf, sizeof buf, "OpenBLAS (%s; core %s; %d threads)", openblas_get_config(), openblas_get_corename(), openblas_get_num_threads());
    return buf;
}
