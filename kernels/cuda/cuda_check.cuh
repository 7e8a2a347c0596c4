// cuda_check.cuh — one generic check macro with instances for CUDA, cuBLAS
// and NCCL (ggml's CUDA_CHECK_GEN pattern). The _TRY form returns a TG_E*
// code from the enclosing function; the _CHECK form aborts (start-up only).
// TG_CUDA_LAUNCH_TRY() goes after every kernel launch.
#ifndef TG_CUDA_CHECK_CUH
#define TG_CUDA_CHECK_CUH

#include <cstdio>
#include <cstdlib>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "common/base/tg_err.h"

#define TG__GPU_TRY_GEN(expr, ok, strfn, code)                              \
    do {                                                                    \
        auto tg__st = (expr);                                               \
        if (tg__st != (ok)) {                                               \
            fprintf(stderr, "tangram: %s failed: %s (%s:%d)\n", #expr,     \
                    strfn(tg__st), __FILE__, __LINE__);                     \
            return (code);                                                  \
        }                                                                   \
    } while (0)

#define TG__GPU_CHECK_GEN(expr, ok, strfn)                                  \
    do {                                                                    \
        auto tg__st = (expr);                                               \
        if (tg__st != (ok)) {                                               \
            fprintf(stderr, "tangram: fatal: %s failed: %s (%s:%d)\n",     \
                    #expr, strfn(tg__st), __FILE__, __LINE__);              \
            abort();                                                        \
        }                                                                   \
    } while (0)

#define TG_CUDA_TRY(expr) TG__GPU_TRY_GEN(expr, cudaSuccess, cudaGetErrorString, TG_EDEVICE)
#define TG_CUDA_CHECK(expr) TG__GPU_CHECK_GEN(expr, cudaSuccess, cudaGetErrorString)
#define TG_CUDA_LAUNCH_TRY() TG_CUDA_TRY(cudaGetLastError())
// cuBLAS and cuBLASLt share cublasStatus_t; the Lt string function keeps
// callers that only link cublasLt self-sufficient.
#define TG_CUBLAS_TRY(expr) TG__GPU_TRY_GEN(expr, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString, TG_EDEVICE)
#define TG_CUBLAS_CHECK(expr) TG__GPU_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString)

#endif // TG_CUDA_CHECK_CUH
