/* The CUDA runtime's C API as the emulated device gives it (tests/scripts/cuda_emu_device.sh):
 * the calls src/cuda's C files make, with device memory as host memory and every stream
 * synchronous (emu_device.cc defines them). Types match cuda_emu.h's, which the emulated
 * kernels see. */
#ifndef CT_CUDA_EMU_CRT_H
#define CT_CUDA_EMU_CRT_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef int cudaError_t;
enum {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100, cudaErrorInvalidDevice = 101, cudaErrorNotReady = 600
};
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
typedef enum cudaMemcpyKind cudaMemcpyKind;
enum { cudaStreamNonBlocking = 1, cudaHostAllocPortable = 1, cudaEventDisableTiming = 2 };
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
};
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st);
cudaError_t cudaMemset(void *p, int v, size_t n);
/* device memory is what cudaMalloc returned (and pointers into it); the rest is host memory */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
/* cudaErrorNotReady while collective work of the emulated NCCL is queued on s */
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
#ifdef __cplusplus
}
#endif
#endif
