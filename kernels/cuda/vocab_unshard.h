/*
 * vocab_unshard.h — reassembling vocab-parallel logits on the device.
 *
 * With T tensor-parallel ranks each rank computes the logits of its
 * vocabulary slice (gw_model_vocab_slice: Vp = ceil(V/T) rows of the LM
 * head, rank r holding ids r*Vp .. r*Vp + Vp - 1, the last ranks padded
 * past V), and an NCCL all-gather stacks the slices rank by rank:
 * gathered (T, rows, Vp). This op writes the model-order logits
 *     out[i, r*Vp + j] = gathered[r, i, j]   for r*Vp + j < V,
 * dropping the padding columns, so the device sampler sees (rows, V).
 * The host does the same reorder when it copies logits back (gw_cuda.c).
 *
 * Plain C header (streams as void *, NULL = the default stream); the
 * function exists in CUDA builds (TANGRAM_CUDA). Never allocates or
 * synchronises (capturable). Any thread.
 */
#ifndef TG_CUDA_VOCAB_UNSHARD_H
#define TG_CUDA_VOCAB_UNSHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues the reorder above. gathered: device fp32 (T, rows, Vp); out:
 * device fp32 (rows, V), not overlapping gathered. T >= 1, rows >= 0,
 * 1 <= V <= T * Vp, Vp >= 1, rows * V < 2^31. rows == 0 queues nothing.
 * Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_vocab_unshard(const float *gathered, int T, int rows, int Vp,
                          int V, float *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_VOCAB_UNSHARD_H */
