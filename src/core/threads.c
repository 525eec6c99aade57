/* Thread count for kernels and the BLAS, and facts about the machine for `ctrain env`.
 * OpenMP and OpenBLAS get the same count so they never oversubscribe each other. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/config.h"
#include "ctrain/core.h"
#include "ctrain/tensor.h"
#include "core/kernel.h"

void ct_set_num_threads(int n) {
    if (n < 1) n = 1;
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
    long local = ct_config_int(CT_CFG_LOCAL_WORLD_SIZE);
    if (local < 1) local = 1;
    long n = cores / local;
    return n < 1 ? 1 : (int)n;
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
