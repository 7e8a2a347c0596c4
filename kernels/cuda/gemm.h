/*
 * gemm.h — bf16 GEMM with fp32 accumulation through cuBLASLt.
 *
 * Computes y = x W^T (+ bias) for the linear layers of the forward pass
 * (DESIGN.md §6): x (m, k) bf16 row-major activations, W (n, k) bf16
 * row-major exactly as Hugging Face checkpoints store nn.Linear weights,
 * y (m, n) bf16 or fp32 row-major (fp32 for the LM head, whose logits feed
 * the sampler). Products and sums are fp32 (CUBLAS_COMPUTE_32F).
 *
 * A context (struct tg_cuda_gemm, one per worker thread) owns the cuBLASLt
 * handle and one workspace reserved at creation, so the step path never
 * allocates device memory. The cuBLASLt heuristic answer (descriptors and
 * chosen algorithm) is cached per (m, n, k, output dtype, bias, pointer
 * alignment): each distinct shape pays for one heuristic query, then every
 * call is a cublasLtMatmul with cached descriptors.
 *
 * The header is plain C without CUDA types: streams are void * (NULL = the
 * default stream), device pointers are void * to bf16/fp32 data. The
 * functions need a CUDA build (TANGRAM_CUDA) and a device. Errors:
 * TG_EINVAL for bad arguments, TG_EUNSUPPORTED when cuBLASLt has no
 * algorithm for the shape, TG_ENOMEM for host memory, TG_EDEVICE from the
 * CUDA runtime or cuBLASLt.
 */
#ifndef TG_CUDA_GEMM_H
#define TG_CUDA_GEMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of the output (and bias). */
enum tg_cuda_gemm_dtype {
    TG_CUDA_GEMM_BF16 = 0, /* __nv_bfloat16, 2 bytes */
    TG_CUDA_GEMM_F32 = 1,  /* float, 4 bytes */
};

/* Default workspace: 32 MiB, what cuBLAS recommends for Hopper (sm_90);
 * Ampere needs less but gains nothing from a smaller one. */
#define TG_CUDA_GEMM_WORKSPACE_DEFAULT ((size_t)32 << 20)

struct tg_cuda_gemm; /* opaque: cuBLASLt handle, workspace, shape cache */

/* Creates a GEMM context on the current device: a cuBLASLt handle and a
 * device workspace of `workspace_bytes` (0 = TG_CUDA_GEMM_WORKSPACE_DEFAULT)
 * allocated once. Stores it in *out (the caller frees it with
 * tg_cuda_gemm_free). Returns 0, TG_EINVAL (out NULL), TG_ENOMEM or
 * TG_EDEVICE (no device, allocation failed), with detail in err. */
int tg_cuda_gemm_new(size_t workspace_bytes, struct tg_cuda_gemm **out,
                     char *err, size_t errlen);

/* Frees the context: synchronises the device so no queued GEMM still uses
 * the workspace, then releases descriptors, workspace and handle. Safe on
 * NULL. */
void tg_cuda_gemm_free(struct tg_cuda_gemm *g);

/* Enqueues y = x W^T (+ bias) on `stream`.
 *   x    device (m, k) bf16 row-major
 *   w    device (n, k) bf16 row-major (HF nn.Linear weight)
 *   bias device (n) of y_dtype, or NULL. A 16-byte aligned bias is fused
 *        as the cuBLASLt BIAS epilogue (added in fp32 before the output is
 *        rounded); a less aligned one is added by a second kernel (a bf16
 *        y is then rounded twice)
 *   y    device (m, n) y_dtype row-major; must not overlap x, w or bias
 * m == 0 or n == 0 is a no-op; k == 0 writes bias (or 0) to every row.
 * Pointers need only element alignment; the alignment is part of the
 * cache key, so misaligned views get algorithms that support them.
 * Returns 0 once the work is queued (results are ready when the stream
 * is), TG_EINVAL (NULL pointer, negative size, bad dtype), TG_EUNSUPPORTED,
 * TG_ENOMEM or TG_EDEVICE. Not thread-safe: one context per thread, and
 * calls on different streams must not run concurrently (they share the
 * workspace). */
int tg_cuda_gemm_bf16(struct tg_cuda_gemm *g, const void *x, const void *w,
                      const void *bias, int m, int n, int k, void *y,
                      enum tg_cuda_gemm_dtype y_dtype, void *stream);

/* Number of distinct shapes whose heuristic answer is cached (tests use
 * it to see that repeated shapes do not query again). Returns 0 for NULL. */
size_t tg_cuda_gemm_cached(const struct tg_cuda_gemm *g);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_GEMM_H */
