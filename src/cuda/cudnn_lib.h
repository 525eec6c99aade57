/* Private to src/cuda: cuDNN's C API through a table of function pointers, loaded with dlopen
 * on first use (cudnn.c), like cuBLASLt (gemm.c): linking it would cost every process its
 * start-up, CPU-only runs included. conv.c calls it as
 *
 *   cudnnHandle_t h; void *ws;
 *   if (ct_cudnn_handle(dev, s, bytes, &h, &ws, "conv2d") != CT_OK) ...   // loads, creates
 *   CT_GPU_TRY(cudnn, "conv2d", ct_cudnn.cudnnConvolutionForward(h, ...));            */
#ifndef CT_CUDA_CUDNN_LIB_H
#define CT_CUDA_CUDNN_LIB_H
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stddef.h>

#include "ctrain/core.h"

#define CT_CUDNN_FNS(X)                                                                                                \
    X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream)                         \
    X(cudnnCreateTensorDescriptor) X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor)                       \
    X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor)                       \
    X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType)              \
    X(cudnnDestroyConvolutionDescriptor) X(cudnnGetConvolutionForwardAlgorithm_v7)                                     \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7) X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                    \
    X(cudnnConvolutionForward) X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)                       \
    X(cudnnConvolutionBackwardBias) X(cudnnAddTensor) X(cudnnCreatePoolingDescriptor) X(cudnnSetPooling2dDescriptor)   \
    X(cudnnDestroyPoolingDescriptor) X(cudnnPoolingForward) X(cudnnPoolingBackward)
#define CT_CUDNN_FIELD(f) __typeof__(&f) f;
typedef struct { CT_CUDNN_FNS(CT_CUDNN_FIELD) } ct_cudnn_fns;
#undef CT_CUDNN_FIELD
/* filled once ct_cudnn_ready() has returned CT_OK */
extern ct_cudnn_fns ct_cudnn;

/* CT_OK once cuDNN is loaded; else CT_ERR_UNSUPPORTED: "<op>: cuDNN: cannot load libcudnn.so.9: ..." */
ct_status ct_cudnn_ready(const char *op);
/* Opens `soname` (CT_CUDA_LIBDIR first, then the loader's search) into *f; on failure
 * CT_ERR_UNSUPPORTED with a message naming the library and what is missing. The loader
 * behind ct_cudnn_ready, exposed so a test can point it at a library that is not there. */
ct_status ct_cudnn_load_from(const char *soname, ct_cudnn_fns *f, const char *op);
/* Loads cuDNN (ct_cudnn_ready), then gives the device's handle (created on first use, on
 * stream s, the device's compute stream) and a workspace of at least `bytes` (from the
 * caching allocator, grown as needed). dev must be current. Failures name op. */
ct_status ct_cudnn_handle(int dev, cudaStream_t s, size_t bytes, cudnnHandle_t *h, void **ws, const char *op);
#endif
