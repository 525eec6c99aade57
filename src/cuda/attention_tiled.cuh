/* The tiled flash attention kernels (attention_tiled.cu) for attention.cu, which picks them
 * for head dims they fit with CTRAIN_CUDA_ATTENTION=tiled. Arguments as ct_cuda_attention
 * and ct_cuda_attention_bwd (dr computed by the caller), G: query heads per key/value head. */
#ifndef CT_CUDA_ATTENTION_TILED_CUH
#define CT_CUDA_ATTENTION_TILED_CUH
#include "cuda/cuda.h"

bool ct_cuda_attention_tiled_fits(int D);
ct_status ct_cuda_attention_tiled(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                                  float *lse, int64_t BH, int64_t T, int D, bool causal, int64_t G);
ct_status ct_cuda_attention_tiled_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                      const void *dO, const float *lse, const float *dr, void *dq, void *dk, void *dv,
                                      int64_t BH, int64_t T, int D, bool causal, int64_t G);

/* The tensor-core kernels (attention_tc.cu), for bf16/f16 and head dims 32, 64 and 128 with
 * CTRAIN_CUDA_ATTENTION=tc. */
bool ct_cuda_attention_tc_fits(ct_cuda_dtype dt, int D);
ct_status ct_cuda_attention_tc(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o, float *lse,
                               int64_t BH, int64_t T, int D, bool causal, int64_t G);
ct_status ct_cuda_attention_tc_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, const void *dO,
                                   const float *lse, const float *dr, void *dq, void *dk, void *dv, int64_t BH, int64_t T, int D,
                                   bool causal, int64_t G);

/* The register-tile tensor-core kernels (attention_mma.cu: mma.sync), for bf16/f16 and head
 * dims 32 and 64 with CTRAIN_CUDA_ATTENTION=mma. */
bool ct_cuda_attention_mma_fits(ct_cuda_dtype dt, int D);
ct_status ct_cuda_attention_mma(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o, float *lse,
                                int64_t BH, int64_t T, int D, bool causal, int64_t G);
ct_status ct_cuda_attention_mma_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, const void *dO,
                                    const float *lse, const float *dr, void *dq, void *dk, void *dv, int64_t BH, int64_t T, int D,
                                    bool causal, int64_t G);
#endif
