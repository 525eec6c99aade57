/* Open MPI baseline for bench/allreduce.sh: in-place MPI_Allreduce (f32 sum), max time over
 * ranks. Usage: mpirun -np 2 mpi_allreduce BYTES... ; "mpi_allreduce init" only initialises. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc > 1 && !strcmp(argv[1], "init")) { MPI_Barrier(MPI_COMM_WORLD); MPI_Finalize(); return 0; }
    for (int a = 1; a < argc; a++) {
        size_t bytes = strtoull(argv[a], NULL, 10), cnt = bytes / 4;
        float *b = calloc(cnt ? cnt : 1, 4);
        int iters = (int)((64u << 20) / bytes);
        if (iters < 20) iters = 20;
        if (iters > 20000) iters = 20000;
        for (int i = 0; i < 5; i++) MPI_Allreduce(MPI_IN_PLACE, b, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, b, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (!rank) printf("mpi %zu %.3f %.3f\n", bytes, tmax * 1e6, 2.0 * (n - 1) / n * (double)bytes / tmax / 1e9);
        free(b);
    }
    MPI_Finalize();
    return 0;
}
