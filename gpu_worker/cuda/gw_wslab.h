/*
 * gw_wslab.h — the CUDA runtime's weight slab: where every weight of a
 * model shard lives in one device allocation, and the upload op that
 * fills it from gw_load's slices. Plain C in every build, so the layout
 * and the conversion are unit-tested without a device: the runtime
 * supplies the copy (cudaMemcpyAsync from pinned buffers, gw_cuda.c),
 * tests a checksum.
 *
 * Layout, per layer in order: attn_norm, wq, wk, wv, (bq, bk, bv),
 * (q_norm, k_norm), wo, (bo), ffn_norm, w_gu, w_down; then embed,
 * final_norm, the LM head and inv_freq. Every tensor is bf16 except bo
 * and inv_freq (fp32); each starts at a multiple of 256 bytes. w_gu is
 * one (2F, hidden) operand: gate's F rows, then up's. The LM head is this
 * rank's vocabulary slice padded to lm_rows = Vp = ceil(V/T) rows (so
 * every rank's part of the logits all-gather has one size; rows past the
 * vocabulary stay as the slab was initialised, zero on the device); one
 * rank of a tied model shares the embedding instead (no LM head of its
 * own). Absent tensors (biases, norms, rank > 0's bo) take no bytes.
 *
 * Upload: gw_wslab_upload is a gw_load_sink upload function. Each slice
 * is converted into one of two bounce buffers in the slab's dtype (bf16
 * slices are copied as they are; fp16 and fp32 round to nearest even
 * through fp32; bo and inv_freq widen to fp32) in pieces of at most the
 * bounce size, and each piece goes to `copy` with its slab offset. The
 * buffers alternate; before one is rewritten, `wait` (when set) is asked
 * for it, so the copy may run asynchronously while the next piece is
 * converted. bf16 stays bf16 from the file to the slab: the device gets
 * the checkpoint's exact bits.
 *
 * Host memory of an upload: the two bounce buffers (the caller's) plus
 * gw_load's staging; nothing grows with the model.
 */
#ifndef GW_WSLAB_H
#define GW_WSLAB_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/model/gw_load.h"
#include "gpu_worker/model/gw_model.h"

#define GW_WSLAB_NONE UINT64_MAX /* offset of a tensor the slab lacks */
#define GW_WSLAB_INV_FREQ GW_W_COUNT /* the slab's one tensor no checkpoint
                                        holds: the RoPE table (fp32, d/2) */

struct gw_wslab {
    uint64_t bytes;      /* the slab */
    int n_layers;
    int lm_rows;         /* rows of the device LM head (Vp) */
    int lm_shared;       /* 1: the LM head is the embedding */
    uint64_t glob[GW_W_COUNT + 1]; /* byte offsets of the model-wide
                                      tensors (and GW_WSLAB_INV_FREQ) */
    uint64_t *layer;     /* (n_layers, GW_W_COUNT) byte offsets of the
                            layer kinds; GW_WSLAB_NONE where absent */
};

/* Lays out m's shard (its shape: gw_model_open is enough). Returns 0 or
 * TG_ENOMEM. Free with gw_wslab_free (safe on a zeroed slab). */
int gw_wslab_init(struct gw_wslab *s, const struct gw_model *m, char *err,
                  size_t errlen);
void gw_wslab_free(struct gw_wslab *s);

/* Byte offset of element 0 of (kind, layer) — GW_W_GATE and GW_W_UP are
 * the two halves of w_gu, GW_W_LM_HEAD of a shared head is the
 * embedding's — and its element size in *elem (2 for bf16, 4 for fp32);
 * GW_WSLAB_NONE when the slab has no such tensor. kind may be
 * GW_WSLAB_INV_FREQ. Pure. */
uint64_t gw_wslab_offset(const struct gw_wslab *s, int kind, int layer,
                         int *elem);

/* Whether a gw_load plan for this slab must list the tied LM head's rows
 * separately (gw_model_load_plan's tied_head): a tied model on T > 1
 * ranks. Pure. */
int gw_wslab_tied_head(const struct gw_model *m);

/* Where converted bytes go. copy(ctx, dst, src, bytes, buf) moves `bytes`
 * from bounce buffer `buf` (src points into it) to slab offset dst; it
 * may return before the move is done if wait(ctx, buf) (non-NULL) blocks
 * until the last move from buffer buf is. 0 or a negative code with the
 * reason in err. */
struct gw_wslab_copy {
    int (*copy)(void *ctx, uint64_t dst, const void *src, size_t bytes,
                int buf, char *err, size_t errlen);
    int (*wait)(void *ctx, int buf, char *err, size_t errlen);
    void *ctx;
};

/* One upload into a slab (the gw_load_sink's ctx). */
struct gw_wslab_upload {
    const struct gw_wslab *slab;
    struct gw_wslab_copy out;
    void *bounce[2];          /* the caller's buffers, bounce_bytes each
                                 (>= 4 bytes; pinned on CUDA) */
    size_t bounce_bytes;
    int next;                 /* the buffer the next piece fills */
    int busy[2];              /* a move from the buffer may be running */
    uint64_t copied;          /* bytes handed to copy */
};

/* gw_load_sink upload function (ctx: struct gw_wslab_upload). Returns 0,
 * TG_EINVAL (a destination the slab lacks, or a slice past its tensor),
 * TG_EUNSUPPORTED (a dtype other than BF16/F16/F32) or copy's / wait's
 * code. */
int gw_wslab_upload(void *ctx, const struct gw_load_slice *sl, char *err,
                    size_t errlen);

/* Waits for both buffers (wait, when set); call once the load is done.
 * Returns 0 or wait's code. */
int gw_wslab_upload_finish(struct gw_wslab_upload *u, char *err,
                           size_t errlen);

#endif /* GW_WSLAB_H */
