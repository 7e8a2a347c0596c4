/*
 * tt_wsum.h — a test sink for the device weight slab (gpu_worker/cuda/gw_wslab.h):
 * the CUDA runtime's upload path with the device copy replaced by a
 * checksum, and the same checksum computed independently from plain reads
 * of the checkpoint.
 *
 * The checksum of a slab tensor is the sum, over every 2-byte unit u at
 * slab byte offset p that the tensor covers, of splitmix64's finalizer of
 * (p << 16 | u): it depends on every byte and its place, not on how the
 * bytes were cut into copies or in which order they came. One sum per
 * entry of the load plan (gate and up are separate entries inside w_gu).
 *
 * The reference reads every tensor whole (pread of its byte range into a
 * buffer of its size), picks the kept elements one by one from the
 * selection's index formula and converts each to the slab's type
 * (st_f32_to_bf16 / fp32) — none of gw_load's runs, batches or slices.
 *
 * Test code only; one thread per object.
 */
#ifndef TT_WSUM_H
#define TT_WSUM_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/st_safetensors.h"
#include "gpu_worker/model/gw_load.h"
#include "gpu_worker/cuda/gw_wslab.h"

struct tt_wsum {
    const struct gw_wslab *slab;
    const struct gw_load_plan *plan;
    int n;              /* plan entries */
    uint64_t *lo, *hi;  /* (n) slab byte range of each entry */
    int *by_lo;         /* (n) entries sorted by lo */
    uint64_t *sum;      /* (n) */
    uint64_t bytes;     /* bytes summed */
    int stray;          /* bytes that fell outside every entry */
};

/* Sets up empty sums for the plan's entries in the slab. Returns 0 or -1
 * (out of memory, or an entry the slab lacks). */
int tt_wsum_init(struct tt_wsum *w, const struct gw_wslab *slab,
                 const struct gw_load_plan *plan);
void tt_wsum_free(struct tt_wsum *w);

/* Adds the bytes src[0, bytes) at slab offset dst (bytes even). */
void tt_wsum_add(struct tt_wsum *w, uint64_t dst, const void *src,
                 size_t bytes);

/* gw_wslab_copy's copy (ctx: struct tt_wsum): tt_wsum_add, synchronous. */
int tt_wsum_copy(void *ctx, uint64_t dst, const void *src, size_t bytes,
                 int buf, char *err, size_t errlen);

/* Fills w (fresh from tt_wsum_init) from plain reads of the bound plan's
 * tensors in st. Returns 0 or -1 (the reason on stderr). */
int tt_wsum_reference(struct tt_wsum *w, const struct st_model *st);

/* Compares two sums entry by entry, printing the first difference (with
 * the tensor's name). Returns the number of entries that differ. */
int tt_wsum_diff(const struct tt_wsum *a, const struct tt_wsum *b);

#endif /* TT_WSUM_H */
