/* The backend table: every backend ctrain knows, in the order `ctrain env` lists them, with
 * whether this build has it (the only place the CT_HAVE_* macros decide that), what its
 * groups can do, whether its ranks meet through the store, and how ct_dist_init builds a
 * world group on it. ct_dist_init (pg.c) looks the requested name up here; code outside
 * src/distributed asks ct_pg_caps or ct_dist_backend_find instead of comparing names. */
#include "distributed/dist_internal.h"

#include <string.h>

static ct_status create_shm(ct_pg *pg, const ct_backend_args *a) {
    (void)a;
    pg->be = &ct_shm_backend;
    return ct_shm_create(pg, &pg->impl);
}

/* Per optional backend: X_BUILT, its creator, and WITH_X(...) keeping what names its symbols
 * (the vtable, the creator) only where it is built. */
#if CT_HAVE_MPI
#define MPI_BUILT true
#define WITH_MPI(...) __VA_ARGS__
static ct_status create_mpi(ct_pg *pg, const ct_backend_args *a) {
    (void)a;
    pg->be = &ct_mpi_backend;
    return ct_mpi_create(pg, &pg->impl);
}
#else
#define MPI_BUILT false
#define WITH_MPI(...)
#endif

#if CT_HAVE_GLOO
#define GLOO_BUILT true
#define WITH_GLOO(...) __VA_ARGS__
/* shm on each machine and gloo between one leader per machine where that splits the job
 * (hier.c decides the same way on every rank); flat gloo otherwise */
static ct_status create_gloo(ct_pg *pg, const ct_backend_args *a) {
    if (a->hier != CT_HIER_OFF) return ct_hier_init(pg, &ct_gloo_backend, ct_gloo_create, a->hier == CT_HIER_FORCE);
    pg->be = &ct_gloo_backend;
    return ct_gloo_create(pg, &pg->impl);
}
#else
#define GLOO_BUILT false
#define WITH_GLOO(...)
#endif

/* hier over gloo needs no MPI, but only a job that met through the store gets it: ct_dist_init
 * asks the gloo entry for that (CT_HIER_FORCE). This entry is hier under mpirun: shm on each
 * machine, MPI between one leader per machine (hier.c). */
#if CT_HAVE_MPI || CT_HAVE_GLOO
#define HIER_BUILT true
#define WITH_HIER(...) __VA_ARGS__
static ct_status create_hier(ct_pg *pg, const ct_backend_args *a) {
#if CT_HAVE_MPI
    return ct_hier_init(pg, &ct_mpi_backend, ct_mpi_create, a->hier != CT_HIER_AUTO);
#else
    (void)pg, (void)a;
    return ct_error(CT_ERR_UNSUPPORTED, "%s", ct_backend_table[CT_BE_HIER].unbuilt);
#endif
}
#else
#define HIER_BUILT false
#define WITH_HIER(...)
#endif

#if CT_HAVE_CUDA
#define NCCL_BUILT true
#define WITH_NCCL(...) __VA_ARGS__
static ct_status create_nccl(ct_pg *pg, const ct_backend_args *a) {
    pg->be = &ct_nccl_backend;
    return ct_nccl_create(pg, a->local_rank, &pg->impl);
}
#else
#define NCCL_BUILT false
#define WITH_NCCL(...)
#endif

/* `unbuilt` is ct_dist_init's error (users and tests match it); `missing` is ctrain env's */
const ct_backend_desc ct_backend_table[CT_BE_COUNT] = {
    [CT_BE_SHM] = {.pub = {"shm", true, CT_PG_CAP_SHARED_MEMORY, "default on one machine", ""},
                   .needs_store = true, .vt = &ct_shm_backend, .create = create_shm},
    [CT_BE_MPI] = {.pub = {"mpi", MPI_BUILT, CT_PG_CAP_MULTI_MACHINE, "Open MPI, under mpirun",
                           "apt-get install libopenmpi-dev, then make"},
                   .unbuilt = "this build has no MPI backend (install libopenmpi-dev and rebuild)",
                   WITH_MPI(.vt = &ct_mpi_backend, .create = create_mpi)},
    [CT_BE_GLOO] = {.pub = {"gloo", GLOO_BUILT, CT_PG_CAP_MULTI_MACHINE, "TCP between machines without mpirun",
                            "apt-get install libgloo-dev, then make"},
                    .needs_store = true, .unbuilt = "this build has no gloo backend (install libgloo-dev and rebuild)",
                    WITH_GLOO(.vt = &ct_gloo_backend, .create = create_gloo)},
    [CT_BE_HIER] = {.pub = {"hier", HIER_BUILT, CT_PG_CAP_MULTI_MACHINE | CT_PG_CAP_SHARED_MEMORY, "shm inside machines, mpi or gloo between",
                            "needs mpi or gloo"},
                    .unbuilt = "this build has no MPI backend for hier (install libopenmpi-dev and rebuild)",
                    WITH_HIER(.vt = &ct_hier_backend, .create = create_hier)},
    /* rendezvous through the store as shm; may span machines */
    [CT_BE_NCCL] = {.pub = {"nccl", NCCL_BUILT, CT_PG_CAP_DEVICE_BUFFERS | CT_PG_CAP_MULTI_MACHINE,
                            "for GPU buffers: CTRAIN_BACKEND=nccl", "no CUDA toolkit found at build time"},
                    .needs_store = true,
                    .unbuilt = "this build has no NCCL backend (build with the CUDA toolkit installed)",
                    WITH_NCCL(.vt = &ct_nccl_backend, .create = create_nccl)},
};

const ct_backend_desc *ct_backend_find(const char *name) {
    for (int i = 0; name && i < CT_BE_COUNT; i++)
        if (!strcmp(name, ct_backend_table[i].pub.name)) return &ct_backend_table[i];
    return NULL;
}

const ct_dist_backend *ct_dist_backend_at(int i) {
    return i >= 0 && i < CT_BE_COUNT ? &ct_backend_table[i].pub : NULL;
}

const ct_dist_backend *ct_dist_backend_find(const char *name) {
    const ct_backend_desc *d = ct_backend_find(name);
    return d ? &d->pub : NULL;
}

unsigned ct_pg_caps(const ct_pg *pg) {
    for (int i = 0; pg && pg->be && i < CT_BE_COUNT; i++)
        if (ct_backend_table[i].vt == pg->be) return ct_backend_table[i].pub.caps;
    return 0;
}
