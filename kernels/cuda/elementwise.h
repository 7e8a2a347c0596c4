/*
 * elementwise.h — the memory-bound ops of the CUDA backend (DESIGN.md §6):
 * token embedding, RMSNorm with an optional fused residual add, NeoX RoPE
 * with an optional fused per-head RMSNorm (Qwen3 q_norm/k_norm), SiLU-mul,
 * and bf16 <-> fp32 conversion.
 *
 * Storage: weights (embedding table, norm weights) are bf16; activations
 * are bf16 or fp32, chosen per tensor with enum tg_cuda_elementwise_dtype, so
 * the residual stream may stay fp32 while GEMM outputs are bf16. All math is
 * fp32; a bf16 result is rounded once, to nearest even, when stored. The CPU
 * reference of each op is the matching fp32 op of kernels/tg_ops.h applied to
 * the same (bf16-rounded) inputs.
 *
 * The header is plain C without CUDA types: bf16 tensors are uint16_t bit
 * patterns (the top half of an IEEE binary32), streams are `void *` holding
 * a cudaStream_t (NULL = the legacy default stream). Every tensor pointer is
 * device memory aligned to its element size. Every entry checks its
 * arguments (TG_EINVAL: NULL pointer, negative or inconsistent size,
 * unknown dtype, misalignment, forbidden aliasing), returns 0 with nothing
 * launched when there is no work, and otherwise enqueues one kernel on the
 * stream and returns 0 or TG_EDEVICE (launch error). Results are ready when
 * the stream reaches that point. Entries never allocate and never
 * synchronise, so they can be captured in CUDA graphs. Any host thread, as
 * long as the buffers are not written concurrently.
 */
#ifndef TG_CUDA_ELEMENTWISE_H
#define TG_CUDA_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of an activation tensor. */
enum tg_cuda_elementwise_dtype {
    TG_CUDA_ELEMENTWISE_F32 = 0,  /* IEEE binary32 */
    TG_CUDA_ELEMENTWISE_BF16 = 1, /* bfloat16 as uint16_t bits */
};

/* out[i, :] = table[ids[i], :] for i < n, converted to out_dtype. A row
 * whose id is outside [0, vocab) is written as zeros (the ids are on the
 * device, so they are not checked on the host; the router validates token
 * ids before they get here).
 * table (vocab, hidden) bf16; ids (n) int32; out (n, hidden) out_dtype.
 * Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_elementwise_embedding(const uint16_t *table, int vocab, int hidden,
                                  const int32_t *ids, int n, void *out,
                                  enum tg_cuda_elementwise_dtype out_dtype,
                                  void *stream);

/* RMSNorm of n rows of length dim (HF LlamaRMSNorm):
 *     if residual != NULL:  x[i, :] += residual[i, :]   (stored in x_dtype)
 *     out[i, :] = x[i, :] * rsqrt(mean(x[i, :]^2) + eps) * w
 * The norm reads x as stored, i.e. after the add was rounded to x_dtype, so
 * a bf16 residual stream behaves exactly like an unfused add + norm.
 * x (n, dim) x_dtype, read and (with a residual) written; residual (n, dim)
 * res_dtype or NULL (res_dtype is then ignored); w (dim) bf16;
 * out (n, dim) out_dtype. out may equal x only when residual is NULL and
 * out_dtype == x_dtype; with a residual, out must not equal x or residual.
 * eps >= 0. Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_elementwise_rmsnorm(void *x, enum tg_cuda_elementwise_dtype x_dtype,
                                const void *residual,
                                enum tg_cuda_elementwise_dtype res_dtype,
                                const uint16_t *w, int n, int dim, float eps,
                                void *out,
                                enum tg_cuda_elementwise_dtype out_dtype,
                                void *stream);

/* NeoX RoPE in place, optionally preceded by a per-head RMSNorm over d (the
 * q_norm / k_norm of Qwen3: norm each head's d values with norm_w, then
 * rotate). For token i, head h, the row r = x + i * row_stride + h * d:
 *     if norm_w != NULL:  r = r * rsqrt(mean(r^2) + eps) * norm_w
 *     a_j = (float)pos[i] * inv_freq[j]         (fp32, as HF forms it)
 *     (r[j], r[j + d/2]) <- (r[j] cos a_j - r[j + d/2] sin a_j,
 *                            r[j + d/2] cos a_j + r[j] sin a_j),  j < d/2
 * The normalised values stay fp32 into the rotation (one rounding at the
 * store). row_stride lets q or k be rotated inside a fused QKV output
 * ((n, (Hq + 2 Hkv) d) with x pointing at the q or k columns).
 * x (n, row_stride) x_dtype, only the first heads * d of each row touched;
 * pos (n) int32 absolute positions; inv_freq (d/2) fp32 (Llama-3
 * rope_scaling is folded into this table by the caller); norm_w (d) bf16 or
 * NULL. d even and > 0, heads > 0, row_stride >= heads * d, eps >= 0.
 * Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_elementwise_rope(void *x, enum tg_cuda_elementwise_dtype x_dtype,
                             int n, int heads, int d, int64_t row_stride,
                             const int32_t *pos, const float *inv_freq,
                             const uint16_t *norm_w, float eps, void *stream);

/* SwiGLU activation on n rows of width columns:
 *     out[i, j] = silu(gate[i, j]) * up[i, j],  silu(g) = g / (1 + e^-g)
 * ld_in is the row stride (elements) of gate and up, ld_out that of out,
 * so a fused gate_up GEMM output (n, 2 * width) is used in place with
 * gate = y, up = y + width, ld_in = 2 * width.
 * gate, up (n, ld_in) in_dtype; out (n, ld_out) out_dtype.
 * ld_in >= width, ld_out >= width. out may equal gate (or up) only when
 * out_dtype == in_dtype and ld_out == ld_in (each element is read before it
 * is written by the same thread). Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_elementwise_silu_mul(const void *gate, const void *up,
                                 enum tg_cuda_elementwise_dtype in_dtype, int n,
                                 int width, int64_t ld_in, void *out,
                                 enum tg_cuda_elementwise_dtype out_dtype,
                                 int64_t ld_out, void *stream);

/* out[i] = bf16(in[i]), round to nearest even (NaN stays NaN, overflow
 * becomes infinity), as st_f32_to_bf16. in (len) fp32; out (len) bf16.
 * Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_elementwise_f32_to_bf16(const float *in, uint16_t *out, size_t len,
                                    void *stream);

/* out[i] = (float)in[i] (exact). in (len) bf16; out (len) fp32.
 * Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_elementwise_bf16_to_f32(const uint16_t *in, float *out, size_t len,
                                    void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_ELEMENTWISE_H */
