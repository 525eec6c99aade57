/* Private to src/cuda: cuBLASLt and cuDNN, loaded on first use by gemm.c and cudnn.c; the op
 * entries (ops.c, ops_more.c, ops_llama.c, ops_attention.c, conv.c). */
#ifndef CT_CUDA_INTERNAL_H
#define CT_CUDA_INTERNAL_H
#include <stdbool.h>
#include <stddef.h>

/* cublasLtGetVersion(), or 0 when cuBLASLt cannot be loaded */
size_t ct_cuda_cublaslt_version(void);
/* "cuda:N" of the current device, "cuda:?" when there is none (runtime.c; for CT_GPU_CHECK's
 * messages) */
void ct_cuda_dev_str(char *buf, size_t n);
/* why cuDNN cannot be loaded ("cuDNN: cannot load libcudnn.so.9: ..."), or NULL once it is */
const char *ct_cuda_cudnn_load_error(void);
/* Releases the cuDNN handles and workspaces (the allocator keeps the memory). */
void ct_cuda_cudnn_shutdown(void);
/* fills the op table's device column with the CUDA forwards and backwards (ops.c) */
void ct_cuda_register_ops_(void);
/* the conv2d and pooling rows of it (conv.c) */
void ct_cuda_register_conv_ops_(void);
/* the rest of the column: bias_add, softmax, log_softmax, mse_loss, attention, cast (ops_more.c) */
void ct_cuda_register_ops_more_(void);
/* CTRAIN_CUDA_LOWP_GRADS: whether the ops declare low-precision activation gradients */
bool ct_cuda_lowp_grads_(void);
/* Llama's rows: rms_norm, rope, repeat_kv (ops_llama.c) */
void ct_cuda_register_ops_llama_(void);
/* the fused attentions: flash_attention and flash_attention_qkv (ops_attention.c) */
void ct_cuda_register_ops_attention_(void);
#endif
