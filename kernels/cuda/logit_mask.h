/*
 * logit_mask.h — structured outputs' token masks applied to fp32 logits on
 * the device (DESIGN.md §4.11): for each masked row, every id whose bit is
 * 0 becomes -inf before sampling and log-probabilities, so neither can
 * name it. Bit j of a row's mask word j >> 5 (1u << (j & 31)) stands for
 * id j, the layout of common/grammar/gm_matcher.h and of the CPU op
 * (kernels/cpu/cpu_mask.c, the reference). Rows not listed are untouched,
 * so constrained and unconstrained rows share one batch.
 *
 * Plain C header (streams are void *; NULL = the default stream); needs a
 * CUDA build and a device. Errors: TG_EINVAL, TG_EDEVICE.
 */
#ifndef TG_CUDA_LOGIT_MASK_H
#define TG_CUDA_LOGIT_MASK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* logits (rows of `vocab` floats, device); rows[i] (device, n values) is
 * the row the i-th mask applies to, masks (device, n x words, words >=
 * (vocab + 31) / 32) its bits. Distinct rows, each within the logits (the
 * host cannot check device data). n = 0 is a no-op. */
int tg_cuda_logit_mask_apply(float *logits, int vocab, const int32_t *rows,
                             const uint32_t *masks, int words, int n,
                             void *stream);

#ifdef __cplusplus
}
#endif

#endif /* TG_CUDA_LOGIT_MASK_H */
