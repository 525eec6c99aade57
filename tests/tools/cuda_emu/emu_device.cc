// An emulated GPU for the GPU tests (tests/scripts/cuda_emu_device.sh): the CUDA runtime calls
// of src/cuda's C files on host memory (every stream synchronous), runtime.c's device queries
// and error texts, and cuBLASLt's GEMM as a plain loop, so that tests/gpu's programs run the
// real op entries (src/cuda/ops.c, ops_more.c), allocator, device hooks and the emulated
// kernels of src/cuda/*.cu end to end on the CPU, on "cuda:0". What it cannot stand in for is
// left out: cuDNN (conv2d and average pooling fail as ops without a kernel), timing. NCCL is
// emu_nccl.cc's, whose queued work keeps a stream busy (cudaStreamQuery, cudaStreamSynchronize).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h> // crt/: the C API below

extern "C" {
#include "ctrain/core.h"
#include "ctrain/tensor.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"
#include "ops/kmath.h"
}
// emu_runtime.cc
float ct_emu_half_to_float(uint16_t h);
uint16_t ct_emu_float_to_half(float f);

// ---- the runtime API (crt/cuda_runtime_api.h) ----
static int dummy_event, last_device;
static const size_t kTotal = (size_t)8 << 30;
// cudaMalloc's blocks (start -> bytes), so that cudaPointerGetAttributes tells device memory
static std::mutex blocks_mu;
static std::map<uintptr_t, size_t> blocks;

extern "C" {
// emu_nccl.cc, where it is linked: whether a stream has collective work queued, and a wait
// for it (a null stream: every stream)
__attribute__((weak)) int ct_emu_nccl_busy(void *stream);
__attribute__((weak)) void ct_emu_nccl_wait(void *stream);

cudaError_t cudaGetDeviceCount(int *n) { return *n = 1, cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? (last_device = d, cudaSuccess) : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int *d) { return *d = last_device, cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t) { return "emulated error"; }
const char *cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d != 0) return 101;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "emulated (host threads)");
    p->totalGlobalMem = kTotal, p->major = 9, p->minor = 0, p->multiProcessorCount = 1;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { return *f = kTotal / 2, *t = kTotal, cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { return *v = 13000, cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { return *v = 13000, cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) {
    const size_t b = (n + 255) & ~(size_t)255;
    *p = aligned_alloc(256, b ? b : 256);
    if (!*p) return 2;
    std::lock_guard<std::mutex> g(blocks_mu);
    blocks[(uintptr_t)*p] = b;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    {
        std::lock_guard<std::mutex> g(blocks_mu);
        blocks.erase((uintptr_t)p);
    }
    return free(p), cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
    return *p ? cudaSuccess : 2;
}
cudaError_t cudaFreeHost(void *p) { return free(p), cudaSuccess; }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
    std::lock_guard<std::mutex> g(blocks_mu);
    auto it = blocks.upper_bound((uintptr_t)p);
    const bool dev = it != blocks.begin() && (uintptr_t)p < std::prev(it)->first + std::prev(it)->second;
    a->type = dev ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    a->device = dev ? 0 : -1;
    a->devicePointer = dev ? (void *)p : nullptr;
    a->hostPointer = dev ? nullptr : (void *)p;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k) {
    (void)k;
    if (n) memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) { return cudaMemcpy(d, s, n, k); }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) { return memset(p, v, n), cudaSuccess; }
cudaError_t cudaMemset(void *p, int v, size_t n) { return memset(p, v, n), cudaSuccess; }
// kernels run at their launch, so a stream is only ever busy with emu_nccl.cc's work: each
// stream is an object of its own, for that to tell them apart
cudaError_t cudaStreamCreate(cudaStream_t *s) { return *s = new int(0), cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (ct_emu_nccl_wait) ct_emu_nccl_wait(s);
    return delete (int *)s, cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return ct_emu_nccl_busy && ct_emu_nccl_busy(s) ? cudaErrorNotReady : cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (ct_emu_nccl_wait) ct_emu_nccl_wait(s);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    if (ct_emu_nccl_wait) ct_emu_nccl_wait(nullptr);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return *e = &dummy_event, cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }

// ---- runtime.c: the checks' messages and the device queries ----
static ct_status check(int code, const char *lib, const char *call, const char *op) {
    if (code == 0) return CT_OK;
    return ct_error(code == 2 ? CT_ERR_NOMEM : CT_ERR_SYSTEM, "%s on cuda:0: %s failed: %s error %d (emulated)", op, call, lib, code);
}
ct_status ct_gpu_check_cuda(int code, const char *call, const char *op) { return check(code, "cuda", call, op); }
ct_status ct_gpu_check_cublas(int code, const char *call, const char *op) { return check(code, "cublas", call, op); }
ct_status ct_gpu_check_cudnn(int code, const char *call, const char *op) { return check(code, "cudnn", call, op); }
// as runtime.c's: in progress is a non-blocking communicator's success; a remote error a peer's
ct_status ct_gpu_check_nccl(int code, const char *call, const char *op) {
    if (code == 0 || code == 7) return CT_OK;
    return ct_error(code == 6 ? CT_ERR_PEER : code == 4 || code == 5 ? CT_ERR_INVALID : CT_ERR_SYSTEM,
                    "%s on cuda:0: %s failed: nccl error %d (emulated)", op, call, code);
}
ct_status ct_cuda_device_count(int *n) { return *n = 1, CT_OK; }
ct_status ct_cuda_set_device(int dev, const char *op) { return check(cudaSetDevice(dev), "cuda", "cudaSetDevice(dev)", op); }
ct_status ct_cuda_current_device(int *dev) { return check(cudaGetDevice(dev), "cuda", "cudaGetDevice(dev)", "current device"); }
ct_status ct_cuda_device_info_get(int dev, ct_device_info *out) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return ct_error(CT_ERR_INVALID, "cuda:%d: no such device", dev);
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->total_bytes = p.totalGlobalMem, out->free_bytes = p.totalGlobalMem / 2;
    out->cc_major = p.major, out->cc_minor = p.minor, out->sm_count = p.multiProcessorCount;
    return CT_OK;
}

// ---- what the emulated device does not have ----
size_t ct_cuda_cublaslt_version(void) { return 0; }
size_t ct_cuda_cudnn_version(void) { return 0; }
const char *ct_cuda_cudnn_load_error(void) { return "no cuDNN on the emulated device"; }
void ct_cuda_cudnn_shutdown(void) {}
void ct_cuda_register_conv_ops_(void) {} // conv2d and the poolings: no kernel here
void ct_cuda_versions(char *buf, size_t n) { snprintf(buf, n, "emulated device (no driver, cuBLASLt, NCCL or cuDNN)"); }
ct_status ct_cuda_nccl_check(char *report, size_t len) {
    snprintf(report, len, "no NCCL on the emulated device");
    return ct_error(CT_ERR_UNSUPPORTED, "no NCCL on the emulated device");
}
void ct_cuda_gemm_shutdown(void) {}

// ---- vmm.c's address ranges: host pages (granules of 4 KiB) behind PROT_NONE when unmapped, so
// that touching a released unit's memory faults as it does on a GPU ----
static const size_t kGranule = 4096;
// which granules of each range are mapped, counted into the allocator's figures as vmm.c does
static std::map<uintptr_t, std::vector<bool>> vm_pages;
static void vm_count(void *p, size_t bytes, bool map) {
    std::lock_guard<std::mutex> g(blocks_mu);
    auto it = vm_pages.upper_bound((uintptr_t)p);
    if (it == vm_pages.begin()) return;
    --it;
    int64_t delta = 0;
    for (size_t k = ((uintptr_t)p - it->first) / kGranule, n = bytes / kGranule; n-- && k < it->second.size(); k++)
        if (it->second[k] != map) it->second[k] = map, delta += map ? (int64_t)kGranule : -(int64_t)kGranule;
    if (delta) ct_cuda_mem_mapped_(0, delta);
}
ct_status ct_cuda_vm_reserve(int dev, size_t bytes, void **base, size_t *granule) {
    (void)dev;
    size_t size = (bytes + kGranule - 1) / kGranule * kGranule;
    if (!size) size = kGranule;
    void *m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return ct_error(CT_ERR_NOMEM, "cuda:0: cannot reserve %zu bytes (emulated)", size);
    {
        std::lock_guard<std::mutex> g(blocks_mu);
        blocks[(uintptr_t)m] = size;
        vm_pages[(uintptr_t)m] = std::vector<bool>(size / kGranule, false);
    }
    vm_count(m, size, true); // all mapped, as vmm.c's reserve
    *base = m, *granule = kGranule;
    return CT_OK;
}
static void vm_check(void *p, size_t bytes, const char *op) {
    if ((uintptr_t)p % kGranule || bytes % kGranule) {
        fprintf(stderr, "%s(%p, %zu): not whole granules (emulated)\n", op, p, bytes);
        abort();
    }
}
ct_status ct_cuda_vm_map(int dev, void *p, size_t bytes) {
    (void)dev;
    vm_check(p, bytes, "ct_cuda_vm_map");
    if (bytes && mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0) return ct_error(CT_ERR_SYSTEM, "map: mprotect failed (emulated)");
    if (bytes) memset(p, 0, bytes);
    vm_count(p, bytes, true);
    return CT_OK;
}
ct_status ct_cuda_vm_unmap(int dev, void *p, size_t bytes) {
    (void)dev;
    vm_check(p, bytes, "ct_cuda_vm_unmap");
    if (ct_emu_nccl_wait) ct_emu_nccl_wait(nullptr); // as vmm.c: after the device's queued work
    if (bytes) (void)madvise(p, bytes, MADV_DONTNEED);
    if (bytes && mprotect(p, bytes, PROT_NONE) != 0) return ct_error(CT_ERR_SYSTEM, "unmap: mprotect failed (emulated)");
    vm_count(p, bytes, false);
    return CT_OK;
}
void ct_cuda_vm_release(int dev, void *base, size_t bytes) {
    (void)dev, (void)bytes;
    size_t size = 0;
    {
        std::lock_guard<std::mutex> g(blocks_mu);
        auto it = blocks.find((uintptr_t)base);
        if (it != blocks.end()) size = it->second;
    }
    if (size) vm_count(base, size, false); // what is still mapped goes with the range
    std::lock_guard<std::mutex> g(blocks_mu);
    blocks.erase((uintptr_t)base);
    vm_pages.erase((uintptr_t)base);
    if (size) munmap(base, size);
}

// ---- cuBLASLt's GEMM: row-major, transposes, strided batches, f32 / bf16 / f16 operands with
// f32 sums (in k order), the bias and GELU epilogues ----
static float elem(const void *p, ct_cuda_dtype dt, int64_t i) {
    if (dt == CT_CUDA_BF16) return ct_k_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == CT_CUDA_F16) return ct_emu_half_to_float(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
static void put(void *p, ct_cuda_dtype dt, int64_t i, float v) {
    if (dt == CT_CUDA_BF16) ((uint16_t *)p)[i] = ct_k_f32_to_bf16(v);
    else if (dt == CT_CUDA_F16) ((uint16_t *)p)[i] = ct_emu_float_to_half(v);
    else ((float *)p)[i] = v;
}
ct_status ct_cuda_gemm(cudaStream_t, int, const ct_cuda_gemm_desc *d, const void *A, const void *B, void *C) {
    const ct_cuda_dtype cdt = d->c_f32 ? CT_CUDA_F32 : d->dt;
    const int64_t M = d->M, N = d->N, K = d->K;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                float s = 0;
                for (int64_t k = 0; k < K; k++) {
                    float a = elem(A, d->dt, b * M * K + (d->ta ? k * M + i : i * K + k));
                    float x = elem(B, d->dt, b * K * N + (d->tb ? j * K + k : k * N + j));
                    s = fmaf(a, x, s);
                }
                const int64_t at = b * M * N + i * N + j;
                float v = d->alpha * s + (d->beta != 0.0f ? d->beta * elem(C, cdt, at) : 0.0f);
                if (d->epi == CT_GEMM_EPI_BIAS || d->epi == CT_GEMM_EPI_BIAS_GELU) v += elem(d->bias, cdt, j);
                if (d->epi == CT_GEMM_EPI_GELU || d->epi == CT_GEMM_EPI_BIAS_GELU) v = ct_k_gelu_tanh(v);
                put(C, cdt, at, v);
            }
    return CT_OK;
}
}
