/* Address ranges whose memory comes and goes (tensor.h's ct_device_reserve, the device hooks
 * vm_*): CUDA's virtual memory management. A range of addresses is reserved once; each granule
 * (cuMemGetAllocationGranularity, 2 MiB on current GPUs) gets an allocation of its own, mapped
 * and unmapped alone, so that a sharded unit's memory goes back to the driver while the
 * tensors that point into it keep their addresses (src/train/fsdp.c).
 *
 * The driver API is reached through cudaGetDriverEntryPointByVersion, not linked, so the
 * library keeps needing only cudart. One allocation per granule, because cuMemUnmap takes a
 * whole mapping: with one allocation per unit the boundaries would be fixed at reservation.
 * The handle is released right after it is mapped (the mapping keeps the memory alive), so an
 * unmap is what frees it. A granule mapped again is zeroed on the compute stream: backward adds
 * into gradients, and a gather may write fewer bytes than the granule holds. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "core/kernel.h"
#include "ctrain/tensor.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

typedef CUresult (*fn_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*fn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*fn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*fn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*fn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*fn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*fn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*fn_errstr)(CUresult, const char **);

static struct {
    fn_granularity granularity;
    fn_reserve reserve;
    fn_addr_free addr_free;
    fn_create create;
    fn_release release;
    fn_map map;
    fn_unmap unmap;
    fn_access access;
    fn_errstr errstr;
    ct_status status;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void load(void) {
    struct {
        const char *name;
        void **slot;
    } want[] = {{"cuMemGetAllocationGranularity", (void **)&drv.granularity},
                {"cuMemAddressReserve", (void **)&drv.reserve},
                {"cuMemAddressFree", (void **)&drv.addr_free},
                {"cuMemCreate", (void **)&drv.create},
                {"cuMemRelease", (void **)&drv.release},
                {"cuMemMap", (void **)&drv.map},
                {"cuMemUnmap", (void **)&drv.unmap},
                {"cuMemSetAccess", (void **)&drv.access},
                {"cuGetErrorString", (void **)&drv.errstr}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        cudaError_t e = cudaGetDriverEntryPointByVersion(want[i].name, want[i].slot, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*want[i].slot) {
            drv.status = ct_error(CT_ERR_UNSUPPORTED, "cuda virtual memory: the driver has no %s (cuda error %d, query %d)",
                                  want[i].name, (int)e, (int)q);
            return;
        }
    }
    drv.status = CT_OK;
}

static ct_status loaded(void) {
    pthread_once(&drv_once, load);
    return drv.status == CT_OK ? CT_OK : ct_error(drv.status, "cuda virtual memory unavailable (see the first error)");
}

static ct_status check(CUresult r, const char *call, int dev) {
    if (r == CUDA_SUCCESS) return CT_OK;
    const char *s = NULL;
    if (drv.errstr) (void)drv.errstr(r, &s);
    return ct_error(r == CUDA_ERROR_OUT_OF_MEMORY ? CT_ERR_NOMEM : CT_ERR_SYSTEM, "cuda:%d: %s failed: %s (CUresult %d)", dev, call,
                    s ? s : "unknown error", (int)r);
}

/* the reserved ranges, and which of their granules are mapped */
typedef struct {
    uintptr_t base;
    size_t size, g;
    int dev;
    unsigned char *mapped;
} range;
#define MAX_RANGES 64
static range ranges[MAX_RANGES];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static range *find(const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < MAX_RANGES; i++)
        if (ranges[i].size && a >= ranges[i].base && a + bytes <= ranges[i].base + ranges[i].size) return &ranges[i];
    return NULL;
}

static CUmemAllocationProp prop_of(int dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

/* granules [i, j) of r mapped where they are not; zeroed on the compute stream */
static ct_status map_granules(range *r, size_t i, size_t j) {
    CUmemAllocationProp prop = prop_of(r->dev);
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    cudaStream_t s;
    CT_GPU_TRY(cuda, "map", cudaSetDevice(r->dev)); /* the driver's calls act on its context */
    ct_status st = ct_cuda_stream(r->dev, CT_CUDA_COMPUTE, &s);
    for (size_t k = i; k < j && st == CT_OK; k++) {
        if (r->mapped[k]) continue;
        CUdeviceptr a = (CUdeviceptr)(r->base + k * r->g);
        CUmemGenericAllocationHandle h;
        if ((st = check(drv.create(&h, r->g, &prop, 0), "cuMemCreate", r->dev)) != CT_OK) break;
        st = check(drv.map(a, r->g, 0, h, 0), "cuMemMap", r->dev);
        (void)drv.release(h); /* the mapping holds the memory now; unmapping frees it */
        if (st == CT_OK && (st = check(drv.access(a, r->g, &acc, 1), "cuMemSetAccess", r->dev)) != CT_OK) (void)drv.unmap(a, r->g);
        if (st == CT_OK) st = CT_GPU_CHECK(cuda, "map", cudaMemsetAsync((void *)a, 0, r->g, s));
        if (st == CT_OK) r->mapped[k] = 1, ct_cuda_mem_mapped_(r->dev, (int64_t)r->g);
    }
    return st;
}

/* granules [i, j) of r unmapped where mapped, after the device's queued work on them */
static ct_status unmap_granules(range *r, size_t i, size_t j) {
    bool any = false;
    for (size_t k = i; k < j; k++) any = any || r->mapped[k];
    if (!any) return CT_OK;
    CT_GPU_TRY(cuda, "unmap", cudaSetDevice(r->dev));
    CT_GPU_TRY(cuda, "unmap", cudaDeviceSynchronize()); /* kernels and collectives may still read it */
    ct_status st = CT_OK;
    for (size_t k = i; k < j; k++) {
        if (!r->mapped[k]) continue;
        ct_status u = check(drv.unmap((CUdeviceptr)(r->base + k * r->g), r->g), "cuMemUnmap", r->dev);
        if (u == CT_OK) r->mapped[k] = 0, ct_cuda_mem_mapped_(r->dev, -(int64_t)r->g);
        else if (st == CT_OK) st = u;
    }
    return st;
}

ct_status ct_cuda_vm_reserve(int dev, size_t bytes, void **base, size_t *granule) {
    *base = NULL;
    ct_status st = loaded();
    if (st != CT_OK) return st;
    /* the driver calls act on the calling thread's current context: dev's primary one */
    CT_GPU_TRY(cuda, "reserve", cudaSetDevice(dev));
    CT_GPU_TRY(cuda, "reserve", cudaFree(NULL));
    CUmemAllocationProp prop = prop_of(dev);
    size_t g = 0;
    if ((st = check(drv.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity", dev)) != CT_OK)
        return st;
    size_t size = (bytes + g - 1) / g * g;
    if (!size) size = g;
    pthread_mutex_lock(&mu);
    range *r = NULL;
    for (int i = 0; i < MAX_RANGES && !r; i++)
        if (!ranges[i].size) r = &ranges[i];
    if (!r) st = ct_error(CT_ERR_NOMEM, "cuda:%d: more than %d reserved address ranges", dev, MAX_RANGES);
    unsigned char *mapped = r ? calloc(size / g, 1) : NULL;
    if (r && !mapped) st = ct_error(CT_ERR_NOMEM, "out of memory");
    CUdeviceptr a = 0;
    if (st == CT_OK) st = check(drv.reserve(&a, size, g, 0, 0), "cuMemAddressReserve", dev);
    if (st == CT_OK) {
        *r = (range){.base = (uintptr_t)a, .size = size, .g = g, .dev = dev, .mapped = mapped};
        st = map_granules(r, 0, size / g);
        if (st != CT_OK) { /* nothing half-made stays */
            (void)unmap_granules(r, 0, size / g);
            (void)drv.addr_free(a, size);
            *r = (range){0};
        }
    }
    if (st != CT_OK) free(mapped);
    pthread_mutex_unlock(&mu);
    if (st == CT_OK) *base = (void *)a, *granule = g;
    return st;
}

static ct_status map_or_unmap(int dev, void *p, size_t bytes, bool map) {
    if (!bytes) return CT_OK;
    pthread_mutex_lock(&mu);
    range *r = find(p, bytes);
    CT_CHECK(r && r->dev == dev && ((uintptr_t)p - r->base) % r->g == 0 && bytes % r->g == 0,
             "ct_device_%smap(%p, %zu): not whole granules of a range reserved on cuda:%d", map ? "" : "un", p, bytes, dev);
    size_t i = ((uintptr_t)p - r->base) / r->g, j = i + bytes / r->g;
    ct_status st = map ? map_granules(r, i, j) : unmap_granules(r, i, j);
    pthread_mutex_unlock(&mu);
    return st;
}
ct_status ct_cuda_vm_map(int dev, void *p, size_t bytes) { return map_or_unmap(dev, p, bytes, true); }
ct_status ct_cuda_vm_unmap(int dev, void *p, size_t bytes) { return map_or_unmap(dev, p, bytes, false); }

void ct_cuda_vm_release(int dev, void *base, size_t bytes) {
    (void)bytes;
    pthread_mutex_lock(&mu);
    range *r = find(base, 1);
    CT_CHECK(r && r->base == (uintptr_t)base && r->dev == dev, "ct_device_unreserve(%p): no range reserved there on cuda:%d", base, dev);
    if (unmap_granules(r, 0, r->size / r->g) != CT_OK) CT_LOG_WARN_("cuda", "unreserve: %s", ct_last_error());
    ct_status st = check(drv.addr_free((CUdeviceptr)r->base, r->size), "cuMemAddressFree", dev);
    if (st != CT_OK) CT_LOG_WARN_("cuda", "unreserve: %s", ct_last_error());
    free(r->mapped);
    *r = (range){0};
    pthread_mutex_unlock(&mu);
}
