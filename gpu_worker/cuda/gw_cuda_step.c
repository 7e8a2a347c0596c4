/* gw_cuda_step.c — the CUDA forward pass's pieces: per-call block tables,
 * the bounded stream wait, and one layer's blocks (see gw_cuda.h and
 * gw_cuda_internal.h). */
#include "gpu_worker/cuda/gw_cuda.h"

#ifdef TANGRAM_CUDA
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kv/kv_budget.h"
#include "gpu_worker/cuda/gw_cuda_internal.h"
#include "kernels/cuda/compress.h"
#include "kernels/cuda/decode_append.h"
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_table_dev.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/prefill_attn.h"
#include "kernels/cuda/sample.h"
#include "kernels/cuda/score_qa.h"
#include "kernels/cuda/vocab_unshard.h"

int gw_cuda__op_fail(char *err, size_t errlen, int rc, const char *what,
                     int layer)
{
    if (err != NULL && err[0] != '\0')
        return rc; /* keep the entry's own message */
    return tg_err_set(err, errlen, rc, "CUDA %s of layer %d failed (%s)",
                      what, layer, tg_strerror(rc));
}

/* ---- block tables ------------------------------------------------------ */

/* Copies t's staged pinned mirrors to the device: everything when
 * n_scatter < 0, else the counts and the n_scatter changed ids. */
static int table_send(struct gw_cuda *c, struct gw_cuda_table *t,
                      int64_t rows, int64_t ids, int64_t n_scatter, char *err,
                      size_t errlen)
{
    cudaStream_t st = STREAM(c);
    GW_CU_TRY(cudaMemcpyAsync(t->indptr, t->h_indptr, (size_t)(rows + 1) * 4,
                       cudaMemcpyHostToDevice, st));
    GW_CU_TRY(cudaMemcpyAsync(t->npages, t->h_npages, (size_t)rows * 4,
                       cudaMemcpyHostToDevice, st));
    GW_CU_TRY(cudaMemcpyAsync(t->lens, t->h_lens, (size_t)rows * 4,
                       cudaMemcpyHostToDevice, st));
    if (n_scatter < 0) {
        if (ids > 0)
            GW_CU_TRY(cudaMemcpyAsync(t->indices, t->h_indices, (size_t)ids * 4,
                               cudaMemcpyHostToDevice, st));
        return 0;
    }
    if (n_scatter > 0) {
        GW_CU_TRY(cudaMemcpyAsync(c->sc_pos, c->h_sc_pos, (size_t)n_scatter * 4,
                           cudaMemcpyHostToDevice, st));
        GW_CU_TRY(cudaMemcpyAsync(c->sc_val, c->h_sc_val, (size_t)n_scatter * 4,
                           cudaMemcpyHostToDevice, st));
        GW_OP_TRY(tg_cuda_kv_table_dev_scatter(t->indices, c->sc_pos, c->sc_val,
                                               (int32_t)n_scatter, c->stream),
                  "block table update", 0);
    }
    return 0;
}

/* The table of one prefill chunk's sequence: kv_table_build of its rows
 * (dense: one sequence, read once), then sent whole. */
int gw_cuda__table_prefill(struct gw_cuda *c, const struct gw_seq *seq,
                           char *err, size_t errlen)
{
    if (seq->kv == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "a CUDA prefill needs the sequence's kv_seq");
    const struct kv_seq *one[1] = {seq->kv};
    int rc = kv_table_build(&c->pre_kv, c->layout, one, 1, err, errlen);
    int64_t n = 0;
    if (rc == 0)
        rc = gw_cuda_table_stage(&c->pre, &c->pre_kv, NULL, NULL, 0, &n, err,
                                 errlen);
    if (rc != 0)
        return rc;
    return table_send(c, &c->pre, c->pre_kv.n_rows, c->pre_kv.n_slots, -1,
                      err, errlen);
}

/* The decode table of a batch of B rows (n_seq real sequences, then
 * padding): kv_table_refresh brings the host CSR up to date (in place
 * when only pages were appended or a slot was laid out again in its
 * region, else a rebuild), and only what changed goes to the device. The
 * caller invalidates the table when the step then fails, so a device copy
 * that may have missed an update is never trusted. */
int gw_cuda__table_decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                          int n_seq, int B, char *err, size_t errlen)
{
    for (int s = 0; s < B; s++) {
        if (s < n_seq && seqs[s]->kv == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "a CUDA decode needs each sequence's kv_seq");
        c->dec_seqs[s] = s < n_seq ? seqs[s]->kv : NULL;
    }
    struct kv_table *k = &c->dec_kv;
    int rc = k->slack > 0 ? kv_table_refresh(k, c->layout, c->dec_seqs, B,
                                             err, errlen)
                          : kv_table_build_padded(k, c->layout, c->dec_seqs,
                                                  B, GW_CUDA_ROW_SLACK, err,
                                                  errlen);
    int64_t n = 0;
    if (rc == 0)
        rc = gw_cuda_table_stage(&c->dec, k, c->h_sc_pos, c->h_sc_val,
                                 c->dec.cap_rows, &n, err, errlen);
    if (rc != 0) {
        kv_table_invalidate(k);
        return rc;
    }
    if (n < 0)
        c->table_builds++;
    else {
        c->table_deltas++;
        c->table_scattered += n;
    }
    return table_send(c, &c->dec, k->n_rows, k->n_slots, n, err, errlen);
}

/* ---- waiting for the stream ------------------------------------------ */

/* Waits for the stream. With T > 1 an NCCL kernel spinning on a dead or
 * out-of-step peer would block cudaStreamSynchronize forever, so the wait
 * polls instead (naps of 10 us growing to 1 ms, so a step that is nearly
 * done is not rounded up to a whole millisecond): each time it checks the
 * communicator's async error, and after opts.step_timeout_ms (default
 * 120 s) it gives up; both abort the communicator (the spinning kernels
 * then return) and fail with TG_ETIMEDOUT, for the worker to exit and the
 * group to restart. */
int gw_cuda__wait_stream(struct gw_cuda *c, char *err, size_t errlen)
{
    cudaStream_t st = STREAM(c);
    if (c->model->world <= 1 || c->opts.nccl == NULL) {
        GW_CU_TRY(cudaStreamSynchronize(st));
        return 0;
    }
    int limit = c->opts.step_timeout_ms > 0 ? c->opts.step_timeout_ms : 120000;
    struct timespec t0, now;
    long nap_ns = 10000; /* 10 us doubling to 1 ms: a short wait stays short */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t e = cudaStreamQuery(st);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return tg_err_set(err, errlen, TG_EDEVICE, "stream: %s",
                              cudaGetErrorString(e));
        char why[256] = "";
        int rc = tg_nccl_check(c->opts.nccl, why, sizeof(why));
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t ms = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                     (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (rc != 0 || ms > limit) {
            tg_nccl_abort(c->opts.nccl);
            cudaStreamSynchronize(st); /* the aborted kernels drain */
            cudaGetLastError();
            return tg_err_set(err, errlen, TG_ETIMEDOUT,
                              "rank %d of %d: %s; the NCCL group is aborted",
                              c->model->rank, c->model->world,
                              rc != 0 ? why : "a step waited past the step "
                                              "timeout (a peer is gone or out "
                                              "of step)");
        }
        struct timespec nap = {0, nap_ns};
        nanosleep(&nap, NULL);
        nap_ns = nap_ns < 1000000 ? 2 * nap_ns : 1000000;
    }
}

/* ---- layer pieces ------------------------------------------------------ */

int gw_cuda__allreduce(struct gw_cuda *c, size_t n, int l, const char *what,
                       char *err, size_t errlen)
{
    if (c->model->world <= 1)
        return 0;
    if (c->opts.nccl == NULL)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "rank %d of %d has not joined its NCCL group",
                          c->model->rank, c->model->world);
    int rc = tg_nccl_allreduce_sum(c->opts.nccl, c->part, n, 0, c->stream,
                                   err, errlen);
    if (rc != 0)
        return tg_err_set(err, errlen, rc,
                          "all-reduce after %s of layer %d failed (%s): a "
                          "tensor-parallel peer is gone or out of step",
                          what, l, tg_strerror(rc));
    return 0;
}

/* Norm (adding the previous block's partial sum from layer 1 on), Q/K/V
 * and RoPE with the fused q/k norm for m rows of layer l. */
int gw_cuda__layer_qkv(struct gw_cuda *c, int l, int m, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_cuda_layer *w = &c->layers[l];
    int d = md->head_dim, H = md->hidden;
    void *st = c->stream;
    GW_OP_TRY(tg_cuda_elementwise_rmsnorm(
                  c->x, TG_CUDA_ELEMENTWISE_F32, l > 0 ? c->part : NULL,
                  TG_CUDA_ELEMENTWISE_F32, w->attn_norm, m, H, md->norm_eps,
                  c->h, TG_CUDA_ELEMENTWISE_BF16, st),
              "attention norm", l);
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, c->h, w->wq, w->bq, m, md->n_q_heads * d, H,
                         c->q, TG_CUDA_GEMM_BF16, st), "q_proj", l);
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, c->h, w->wk, w->bk, m, md->n_kv_heads * d, H,
                         c->k, TG_CUDA_GEMM_BF16, st), "k_proj", l);
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, c->h, w->wv, w->bv, m, md->n_kv_heads * d, H,
                         c->v, TG_CUDA_GEMM_BF16, st), "v_proj", l);
    if (c->hook_rows > 0) /* a calibration chunk, never a capture */
        TG_TRY(gw_cuda__on_queries(c, l, m, err, errlen));
    GW_OP_TRY(tg_cuda_elementwise_rope(
                  c->q, TG_CUDA_ELEMENTWISE_BF16, m, md->n_q_heads, d,
                  (int64_t)md->n_q_heads * d, c->pos_d, c->inv_freq, w->q_norm,
                  md->norm_eps, st),
              "q rope", l);
    GW_OP_TRY(tg_cuda_elementwise_rope(
                  c->k, TG_CUDA_ELEMENTWISE_BF16, m, md->n_kv_heads, d,
                  (int64_t)md->n_kv_heads * d, c->pos_d, c->inv_freq, w->k_norm,
                  md->norm_eps, st),
              "k rope", l);
    return 0;
}

/* o_proj (fp32 partial, all-reduced), residual + FFN norm, and the SwiGLU
 * MLP whose down_proj partial is left in c->part for the next norm. */
int gw_cuda__layer_out_mlp(struct gw_cuda *c, int l, int m, char *err,
                           size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_cuda_layer *w = &c->layers[l];
    int H = md->hidden, F = md->ffn;
    void *st = c->stream;
    size_t hm = (size_t)m * (size_t)H;
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, c->att, w->wo, w->bo, m, H,
                         md->n_q_heads * md->head_dim, c->part,
                         TG_CUDA_GEMM_F32, st), "o_proj", l);
    int rc = gw_cuda__allreduce(c, hm, l, "o_proj", err, errlen);
    if (rc != 0)
        return rc;
    GW_OP_TRY(tg_cuda_elementwise_rmsnorm(c->x, TG_CUDA_ELEMENTWISE_F32,
                                          c->part, TG_CUDA_ELEMENTWISE_F32,
                                          w->ffn_norm, m, H, md->norm_eps, c->h,
                                          TG_CUDA_ELEMENTWISE_BF16, st),
              "ffn norm", l);
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, c->h, w->w_gu, NULL, m, 2 * F, H, c->gu,
                         TG_CUDA_GEMM_BF16, st), "gate/up_proj", l);
    GW_OP_TRY(tg_cuda_elementwise_silu_mul(
                  c->gu, c->gu + F, TG_CUDA_ELEMENTWISE_BF16, m, F,
                  2 * (int64_t)F, c->mlp, TG_CUDA_ELEMENTWISE_BF16, F, st),
              "silu_mul", l);
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, c->mlp, w->w_down, NULL, m, H, F, c->part,
                         TG_CUDA_GEMM_F32, st), "down_proj", l);
    return gw_cuda__allreduce(c, hm, l, "down_proj", err, errlen);
}

/* The last block's residual add and the final norm of m rows into c->h. */
int gw_cuda__final_norm(struct gw_cuda *c, int m, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    GW_OP_TRY(tg_cuda_elementwise_rmsnorm(
                  c->x, TG_CUDA_ELEMENTWISE_F32, c->part,
                  TG_CUDA_ELEMENTWISE_F32, c->final_norm, m, md->hidden,
                  md->norm_eps, c->h, TG_CUDA_ELEMENTWISE_BF16, c->stream),
              "final norm", md->n_layers);
    return 0;
}

/* LM head of m rows of c->h starting at row `first`: c->logits (m,
 * lm_rows), and with T > 1 the all-gather into c->gathered (T, m,
 * lm_rows). Enqueued only (capturable). */
int gw_cuda__lm_head(struct gw_cuda *c, int first, int m, char *err,
                     size_t errlen)
{
    const struct gw_model *md = c->model;
    const uint16_t *h = c->h + (size_t)first * (size_t)md->hidden;
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, h, c->lm_head, NULL, m, c->lm_rows,
                         md->hidden, c->logits, TG_CUDA_GEMM_F32, c->stream),
       "lm_head", md->n_layers);
    if (md->world > 1) {
        if (c->opts.nccl == NULL)
            return tg_err_set(err, errlen, TG_EPROTO,
                              "rank %d of %d has not joined its NCCL group",
                              md->rank, md->world);
        int rc = tg_nccl_allgather(c->opts.nccl, c->logits, c->gathered,
                                   (size_t)m * (size_t)c->lm_rows, 0,
                                   c->stream, err, errlen);
        if (rc != 0)
            return tg_err_set(err, errlen, rc,
                              "all-gather of the logits failed (%s)",
                              tg_strerror(rc));
    }
    return 0;
}

/* Copies the first m of the `rows` rows of logits lm_head produced to
 * host `out` (m, V) and synchronises. With T > 1 the gathered (T, rows,
 * Vp) slices are reordered (rank r's column j is vocabulary id
 * r * Vp + j). */
int gw_cuda__logits_to_host(struct gw_cuda *c, int rows, int m, float *out,
                            char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    size_t V = (size_t)md->vocab, Vp = (size_t)c->lm_rows;
    cudaStream_t st = STREAM(c);
    if (md->world <= 1) {
        GW_CU_TRY(cudaMemcpyAsync(out, c->logits, (size_t)m * V * 4,
                           cudaMemcpyDeviceToHost, st));
        GW_WAIT_TRY(c);
        return 0;
    }
    size_t T = (size_t)md->world;
    GW_CU_TRY(cudaMemcpyAsync(c->p_logits, c->gathered, T * (size_t)rows * Vp * 4,
                       cudaMemcpyDeviceToHost, st));
    GW_WAIT_TRY(c);
    for (size_t r = 0; r < T; r++) {
        size_t lo = r * Vp;
        if (lo >= V)
            break;
        size_t cols = V - lo < Vp ? V - lo : Vp;
        for (size_t i = 0; i < (size_t)m; i++)
            memcpy(out + i * V + lo, c->p_logits + (r * (size_t)rows + i) * Vp,
                   cols * 4);
    }
    return 0;
}

/* Synchronises and turns a set fault flag into an error. */
int gw_cuda__finish(struct gw_cuda *c, char *err, size_t errlen)
{
    cudaStream_t st = STREAM(c);
    GW_CU_TRY(cudaMemcpyAsync(c->p_fault, c->fault_d, 4, cudaMemcpyDeviceToHost, st));
    GW_WAIT_TRY(c);
    if (*c->p_fault != 0)
        return tg_err_set(err, errlen, TG_EDEVICE,
                          "a KV append found no page for a kept token (the "
                          "block table and the row lengths disagree)");
    return 0;
}

/* ---- prefill ----------------------------------------------------------- */

int gw_cuda__check_ids(const struct gw_cuda *c, const int32_t *ids, int n,
                       char *err, size_t errlen)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->model->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "token id %d outside the vocabulary [0, %d)",
                              ids[i], c->model->vocab);
    return 0;
}

/* Chunk compression of layer l (§4.3 steps 3-5): keep[h] per head; all
 * kept -> plain append; else score, select, append the selection. */

#endif /* TANGRAM_CUDA */
