/* The CUDA backend of core's device layer: streams per device, the device hooks (memory
 * from the caching allocator, copies and fills on the compute stream), and registration
 * with core and the op table when the program starts. Registering calls nothing in the
 * CUDA runtime, so a CPU-only run of the same binary never loads a GPU or needs a driver.
 * Static links keep this object through `-Wl,-u,ct_cuda_register` (Makefile, ctrain.pc). */
#include <pthread.h>

#include "core/kernel.h"
#include "ctrain/tensor.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

#define MAX_DEV 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t streams[MAX_DEV][2];
static _Atomic int64_t host_waits; /* ct_cuda_host_waits */
static _Atomic int64_t uploads;    /* ct_cuda_uploads */

int64_t ct_cuda_host_waits(void) { return host_waits; }
int64_t ct_cuda_uploads(void) { return uploads; }
/* the host waits for s: every such wait of the device hooks goes through here, and is counted */
static ct_status wait_for(cudaStream_t s, const char *op) {
    host_waits++;
    return CT_GPU_CHECK(cuda, op, cudaStreamSynchronize(s));
}

ct_status ct_cuda_stream(int dev, ct_cuda_stream_kind kind, cudaStream_t *out) {
    *out = NULL;
    if (dev < 0 || dev >= MAX_DEV) return ct_error(CT_ERR_INVALID, "cuda stream: device %d out of range", dev);
    pthread_mutex_lock(&mu);
    ct_status st = CT_OK;
    if (!streams[dev][kind]) {
        int prev = 0;
        st = CT_GPU_CHECK(cuda, "stream", cudaGetDevice(&prev));
        if (st == CT_OK) st = CT_GPU_CHECK(cuda, "stream", cudaSetDevice(dev));
        if (st == CT_OK) st = CT_GPU_CHECK(cuda, "stream", cudaStreamCreateWithFlags(&streams[dev][kind], cudaStreamNonBlocking));
        if (st == CT_OK) (void)cudaSetDevice(prev);
    }
    *out = streams[dev][kind];
    pthread_mutex_unlock(&mu);
    return st;
}

static ct_status compute(int dev, const char *op, cudaStream_t *s) {
    CT_GPU_TRY(cuda, op, cudaSetDevice(dev));
    return ct_cuda_stream(dev, CT_CUDA_COMPUTE, s);
}

static ct_status h_copy(int dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind) {
    cudaStream_t s;
    ct_status st = compute(dev, "copy", &s);
    if (st != CT_OK || bytes == 0) return st;
    enum cudaMemcpyKind k = kind == CT_COPY_H2D ? cudaMemcpyHostToDevice : kind == CT_COPY_D2H ? cudaMemcpyDeviceToHost
                                                                                               : cudaMemcpyDeviceToDevice;
    if (kind == CT_COPY_H2D) uploads++;
    CT_GPU_TRY(cuda, "copy", cudaMemcpyAsync(dst, src, bytes, k, s));
    /* the host reads what it asked for: wait (host-to-device from pageable memory is staged
     * before the call returns, so the caller's buffer may be reused at once) */
    return kind == CT_COPY_D2H ? wait_for(s, "copy to host") : CT_OK;
}

static ct_status h_zero(int dev, void *p, size_t bytes) {
    cudaStream_t s;
    ct_status st = compute(dev, "zero", &s);
    if (st != CT_OK || bytes == 0) return st;
    return CT_GPU_CHECK(cuda, "zero", cudaMemsetAsync(p, 0, bytes, s));
}

static ct_status h_sync(int dev) {
    cudaStream_t s;
    ct_status st = compute(dev, "sync", &s);
    return st != CT_OK ? st : wait_for(s, "sync");
}

static ct_status h_optim(int dev, ct_device_optim kind, const void *k, float *p, const float *g, float *s0, float *s1,
                         float *s2, int64_t n) {
    cudaStream_t s;
    ct_status st = compute(dev, "optimizer", &s);
    if (st != CT_OK || n == 0) return st;
    return kind == CT_DEV_OPTIM_SGD ? ct_cuda_sgd(s, k, p, g, s0, n) : ct_cuda_adamw(s, k, p, g, s0, s1, s2, n);
}

static ct_status h_host_alloc(int dev, size_t bytes, void **out) {
    *out = NULL;
    /* dev current first: the allocation would otherwise open a context on GPU 0 in every rank */
    CT_GPU_TRY(cuda, "pinned host memory", cudaSetDevice(dev));
    CT_GPU_TRY(cuda, "pinned host memory", cudaHostAlloc(out, bytes, cudaHostAllocPortable));
    return CT_OK;
}

static void h_host_free(void *p) { (void)cudaFreeHost(p); }

static void h_mem(int dev, size_t *current, size_t *peak, size_t *reserved) {
    ct_cuda_mem_stats s;
    ct_cuda_mem_stats_get(dev, &s);
    *current = s.current;
    *peak = s.peak;
    *reserved = s.reserved;
}

static ct_status h_sumsq(int dev, const float *g, int64_t n, double *out) {
    cudaStream_t s;
    ct_status st = compute(dev, "clip_grad_norm", &s);
    int64_t nch = (n + CT_K_SUMSQ_CHUNK - 1) / CT_K_SUMSQ_CHUNK;
    double *part = NULL;
    if (st == CT_OK) st = ct_cuda_alloc(dev, sizeof(double) * (size_t)(nch + 1), (void **)&part);
    if (st == CT_OK) st = ct_cuda_sumsq(s, g, n, part + 1, part);
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, "clip_grad_norm", cudaMemcpyAsync(out, part, sizeof *out, cudaMemcpyDeviceToHost, s));
    if (st == CT_OK) st = wait_for(s, "clip_grad_norm");
    ct_cuda_free(part); /* after the wait: the allocator's blocks are for the compute stream */
    return st;
}

static ct_status h_scale(int dev, float *g, float coef, int64_t n, bool *nonfinite) {
    cudaStream_t s;
    ct_status st = compute(dev, "scale gradients", &s);
    int *flag = NULL, host = 0;
    if (st == CT_OK && nonfinite) st = ct_cuda_alloc(dev, sizeof(int), (void **)&flag);
    if (st == CT_OK && flag) st = CT_GPU_CHECK(cuda, "scale gradients", cudaMemsetAsync(flag, 0, sizeof(int), s));
    if (st == CT_OK) st = ct_cuda_scale_check(s, g, coef, n, flag);
    if (st == CT_OK && flag)
        st = CT_GPU_CHECK(cuda, "scale gradients", cudaMemcpyAsync(&host, flag, sizeof host, cudaMemcpyDeviceToHost, s));
    if (st == CT_OK && flag) st = wait_for(s, "scale gradients");
    ct_cuda_free(flag);
    if (nonfinite) *nonfinite = st != CT_OK || host != 0;
    return st;
}

/* autocast's conversions (src/ops/autocast.c): the cast kernels of pointwise.cu */
static ct_status h_convert(int dev, void *y, ct_dtype to, const void *x, ct_dtype from, int64_t n) {
    cudaStream_t s;
    ct_status st = compute(dev, "autocast", &s);
    return st != CT_OK || n == 0 ? st : ct_cuda_cast(s, x, ct_cuda_cast_type_of(from), y, ct_cuda_cast_type_of(to), n);
}
static ct_status h_round(int dev, float *g, ct_dtype dt, int64_t n) {
    cudaStream_t s;
    ct_status st = compute(dev, "autocast backward", &s);
    /* element-wise: in place is safe */
    return st != CT_OK || n == 0 ? st : ct_cuda_cast_bwd(s, g, ct_cuda_cast_type_of(dt), g, n);
}

static ct_status h_add(int dev, float *y, const float *x, int64_t n) {
    cudaStream_t s;
    ct_status st = compute(dev, "add", &s);
    return st != CT_OK || n == 0 ? st : ct_cuda_add(s, y, x, y, n, n);
}

static ct_status h_fill(int dev, float *y, float v, int64_t n) {
    cudaStream_t s;
    ct_status st = compute(dev, "fill", &s);
    return st != CT_OK || n == 0 ? st : ct_cuda_fill(s, y, v, n);
}

static const ct_device_hooks hooks = {
    .count = ct_cuda_device_count,
    .alloc = ct_cuda_alloc,
    .free = ct_cuda_free,
    .copy = h_copy,
    .zero = h_zero,
    .sync = h_sync,
    .optim = h_optim,
    .host_alloc = h_host_alloc,
    .host_free = h_host_free,
    .mem = h_mem,
    .sumsq = h_sumsq,
    .scale = h_scale,
    .convert = h_convert,
    .round = h_round,
    .add = h_add,
    .fill = h_fill,
    .vm_reserve = ct_cuda_vm_reserve,
    .vm_map = ct_cuda_vm_map,
    .vm_unmap = ct_cuda_vm_unmap,
    .vm_release = ct_cuda_vm_release,
    .info = ct_cuda_device_info_get,
    .versions = ct_cuda_versions,
    .check = ct_cuda_nccl_check,
    .current = ct_cuda_current_device,
};

void ct_cuda_register(void) {
    ct_device_register(CT_DEV_CUDA, &hooks);
    ct_cuda_register_ops_();
}

__attribute__((constructor)) static void register_at_start(void) { ct_cuda_register(); }
