/*
 * gw_cuda_internal.h — what the files of the CUDA forward pass share
 * (gw_cuda.c: set-up and weights; gw_cuda_step.c: block tables, waits and
 * the layer pieces; gw_cuda_run.c: prefill, decode, graphs, sampling;
 * gw_cuda_heads.c: per-head lengths, gvote, decode-time compaction).
 * Not part of the public API (see gw_cuda.h). CUDA builds only.
 */
#ifndef GW_CUDA_INTERNAL_H
#define GW_CUDA_INTERNAL_H

#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/base/tg_err.h"
#include "gpu_worker/cuda/gw_cuda.h"

/* Checked calls of the CUDA forward pass: prefixed instances of the one
 * generic check TG__TRY_GEN (common/base/tg_err.h, DESIGN.md §8.5). Each
 * returns from the enclosing function, which has `char *err, size_t
 * errlen` in scope for the detail. */

/* A CUDA runtime call: TG_EDEVICE, naming the call and the CUDA error. */
#define GW_CU_TRY(expr)                                                    \
    TG__TRY_GEN(cudaError_t, expr, cudaSuccess,                            \
                tg_err_set(err, errlen, TG_EDEVICE, "%s: %s", #expr,       \
                           cudaGetErrorString(tg__st)))

/* A kernel entry's failure: the entry printed the CUDA detail (or put it
 * in err); name the op and layer. */
#define GW_OP_TRY(expr, what, layer)                                       \
    TG__TRY_GEN(int, expr, 0,                                              \
                gw_cuda__op_fail(err, errlen, tg__st, what, layer))

/* Names the failed op and layer unless the entry filled err already. */
int gw_cuda__op_fail(char *err, size_t errlen, int rc, const char *what,
                     int layer);

#define STREAM(c) ((cudaStream_t)(c)->stream)

/* A bounded wait for the stream (gw_cuda__wait_stream): its code. */
#define GW_WAIT_TRY(c) TG_TRY(gw_cuda__wait_stream((c), err, errlen))

/* cudaMalloc / cudaMallocHost of `bytes` (1 when 0) for `what`: 0, or
 * TG_ENOMEM / TG_EDEVICE naming the size and the purpose (*p NULL). */
int gw_cuda__dalloc(void **p, size_t bytes, const char *what, char *err,
                    size_t errlen);
int gw_cuda__halloc(void **p, size_t bytes, const char *what, char *err,
                    size_t errlen);

/* Device / pinned host allocation of a field, returning the failure from
 * the enclosing function (TG_TRY). */
#define DALLOC(field, bytes, what)                                          \
    TG_TRY(gw_cuda__dalloc((void **)&(field), (bytes), (what), err, errlen))
#define HALLOC(field, bytes, what)                                          \
    TG_TRY(gw_cuda__halloc((void **)&(field), (bytes), (what), err, errlen))

/* Block tables: the host CSR (kv_table) staged in pinned mirrors and
 * copied, whole or by the ids that changed, to the device. */
int gw_cuda__table_prefill(struct gw_cuda *c, const struct gw_seq *seq,
                           char *err, size_t errlen);
int gw_cuda__table_decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                          int n_seq, int B, char *err, size_t errlen);
/* Stream wait bounded by the NCCL group's health (T > 1). */
int gw_cuda__wait_stream(struct gw_cuda *c, char *err, size_t errlen);
/* Layer pieces for m rows (enqueue only, capturable). */
int gw_cuda__allreduce(struct gw_cuda *c, size_t n, int l, const char *what,
                       char *err, size_t errlen);
int gw_cuda__layer_qkv(struct gw_cuda *c, int l, int m, char *err,
                       size_t errlen);
int gw_cuda__layer_out_mlp(struct gw_cuda *c, int l, int m, char *err,
                           size_t errlen);
int gw_cuda__final_norm(struct gw_cuda *c, int m, char *err, size_t errlen);
int gw_cuda__lm_head(struct gw_cuda *c, int first, int m, char *err,
                     size_t errlen);
/* Logits to the host (rank 0), waits; the fault check, waits. */
int gw_cuda__logits_to_host(struct gw_cuda *c, int rows, int m, float *out,
                            char *err, size_t errlen);
int gw_cuda__finish(struct gw_cuda *c, char *err, size_t errlen);
/* Per-head lengths, gvote and decode-time compaction (gw_cuda_heads.c).
 * heads_bytes: device bytes (and *pinned host bytes) they need, for the
 * memory plan; heads_alloc / heads_free: their buffers (free is safe on
 * a half-built runtime). heads_prefill uploads seq's head counts before
 * a chunk and clears hkeep; heads_advance adds hkeep to seq->hlen once
 * the chunk is done. heads_decode uploads a batch's counts plus its token
 * (padding rows 1). gvote_select brings layer l's normed input, queries
 * and keys back, runs gw_gvote_select on the host with keep[h] as the
 * head's cap in and its kept count out, and uploads the chosen indices
 * to c->idx. All no-ops (0) without opts.per_head except gvote_select. */
size_t gw_cuda__heads_bytes(const struct gw_cuda *c, size_t *pinned);
int gw_cuda__heads_alloc(struct gw_cuda *c, char *err, size_t errlen);
void gw_cuda__heads_free(struct gw_cuda *c);
int gw_cuda__heads_prefill(struct gw_cuda *c, const struct gw_seq *seq,
                           char *err, size_t errlen);
void gw_cuda__heads_advance(struct gw_cuda *c, struct gw_seq *seq);
int gw_cuda__heads_decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                          int n_seq, int B, char *err, size_t errlen);
int gw_cuda__gvote_select(struct gw_cuda *c, const struct gw_seq *seq, int l,
                          int n, int64_t start, int32_t *keep, char *err,
                          size_t errlen);
/* Calibration hooks (gw_cuda_hooks.c): on_queries shows the m rows of
 * layer l's queries, normed and not yet rotated (layer_qkv calls it
 * between the projections and RoPE while c->hook_rows > 0); on_scores
 * shows layer l's chunk scores c->scores (Hkv, n). Both wait for the
 * stream. hooks_free is safe on a half-built runtime. */
int gw_cuda__on_queries(struct gw_cuda *c, int l, int m, char *err,
                        size_t errlen);
int gw_cuda__on_scores(struct gw_cuda *c, int l, int n, char *err,
                       size_t errlen);
void gw_cuda__hooks_free(struct gw_cuda *c);
/* Checks before anything is queued. */
int gw_cuda__check_ids(const struct gw_cuda *c, const int32_t *ids, int n,
                       char *err, size_t errlen);

#endif /* TANGRAM_CUDA */
#endif /* GW_CUDA_INTERNAL_H */
