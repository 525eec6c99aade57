/* Private to src/cuda: cuBLASLt, loaded on first use by gemm.c; the op entries (ops.c, ops_more.c). */
#ifndef CT_CUDA_INTERNAL_H
#define CT_CUDA_INTERNAL_H
#include <stddef.h>

/* cublasLtGetVersion(), or 0 when cuBLASLt cannot be loaded */
size_t ct_cuda_cublaslt_version(void);
/* cublasLtGetStatusString(code), or a generic text when cuBLASLt cannot be loaded */
const char *ct_cuda_cublaslt_status(int code);
/* fills the op table's device column with the CUDA forwards and backwards (ops.c) */
void ct_cuda_register_ops_(void);
/* the rest of the column: bias_add, softmax, log_softmax, mse_loss, attention, cast (ops_more.c) */
void ct_cuda_register_ops_more_(void);
#endif
