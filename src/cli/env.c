/* ctrain env: what this build and machine can do (the tutorial's §2.1 check):
 * version, build options, CPU and SIMD level, cores, memory, BLAS, backends.
 * --check runs a real 2-rank all-reduce and reports correctness and bandwidth. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctrain/core.h"
#include "ctrain/dist.h"

static void mem_total(char *buf, size_t n) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    snprintf(buf, n, "%.1f GiB", (double)pages * (double)psz / (1024.0 * 1024 * 1024));
}

int cli_env(int argc, char **argv) {
    bool check = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: ctrain env [--check]\n  --check  run a 2-rank all-reduce on the shm backend and report its bandwidth\n");
            return 0;
        } else {
            fprintf(stderr, "ctrain env: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    char cpu[256], mem[64];
    ct_cpu_model(cpu, sizeof cpu);
    mem_total(mem, sizeof mem);
    printf("ctrain %s\n", CT_VERSION_STRING);
    printf("build:     C11, gcc %d.%d, %s\n", __GNUC__, __GNUC_MINOR__,
#ifdef __OPTIMIZE__
           "optimised"
#else
           "debug"
#endif
    );
    printf("cpu:       %s\n", cpu);
    printf("simd:      %s%s\n", ct_simd_level(), __builtin_cpu_supports("f16c") ? ", F16C" : "");
    printf("cores:     %ld online\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("memory:    %s\n", mem);
    printf("threads:   %d per process by default (OMP_NUM_THREADS or cores / local ranks)\n", ct_default_num_threads());
    printf("blas:      %s\n", ct_blas_info());
    printf("backends:  shm (yes, default on one machine)");
#ifdef CT_HAVE_MPI
    printf(", mpi (yes, Open MPI)");
#else
    printf(", mpi (not built: apt-get install libopenmpi-dev, then make)");
#endif
    printf(", nccl (not built: no CUDA backend in this build)\n");
    printf("cuda:      no devices usable by this build\n");
    if (check) {
        double bw = 0;
        char report[512] = "";
        ct_status st = ct_dist_selfcheck(2, &bw, report, sizeof report);
        printf("check:     %s\n", report[0] ? report : ct_last_error());
        if (st != CT_OK) {
            fprintf(stderr, "ctrain env: check failed: %s: %s\n", ct_status_str(st), ct_last_error());
            return 1;
        }
    }
    return 0;
}
