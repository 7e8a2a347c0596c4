/* gw_cuda_run.c — the CUDA forward pass: prefill chunks with fused
 * compression, decode steps with CUDA graphs per batch bucket, and
 * sampling on the device (see gw_cuda.h). */
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
#include "kernels/cuda/logit_mask.h"
#include "kernels/cuda/sample.h"
#include "kernels/cuda/score_qa.h"
#include "kernels/cuda/vocab_unshard.h"

/* §4.3 steps 3-5 for layer l of a chunk of seq: the keep of each head
 * (its group's row of keep_rows), scoring and top-k when that is below n,
 * the append. With gvote (§4.8) the selection runs on the host per head
 * within that keep, each head appends at its own length, and keep_rows'
 * row becomes how much the group's longest head grew. With per-head
 * lengths what each head appended goes to c->hkeep. */
static int layer_compress(struct gw_cuda *c, const struct gw_seq *seq, int l,
                          int n, int64_t start, int32_t *keep_rows, char *err,
                          size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct kv_layout *lay = c->layout;
    int G = lay->n_groups, Hkv = md->n_kv_heads;
    const int32_t *hg = lay->head_group + (size_t)l * (size_t)Hkv;
    const int32_t *hs = lay->head_slot + (size_t)l * (size_t)Hkv;
    int32_t keep[TG_CUDA_COMPRESS_MAX_KV_HEADS];
    int all = 1;
    for (int h = 0; h < Hkv; h++) {
        keep[h] = keep_rows[(size_t)l * (size_t)G + (size_t)hg[h]];
        all &= keep[h] == n;
    }
    size_t r0 = (size_t)l * (size_t)G;
    struct tg_cuda_compress_dst dst = {
        .pool = c->pool,
        .n_pages = (int64_t)c->n_pages,
        .heads_per_group = lay->heads_per_group,
        .page_size = lay->page_size,
        .head_dim = md->head_dim,
        .n_kv_heads = Hkv,
        .n_groups = G,
        .head_group = hg,
        .head_slot = hs,
        .indptr = c->pre.indptr + r0,
        .indices = c->pre.indices,
        .npages = c->pre.npages + r0,
        .lens = c->pre.lens + r0,
        .head_lens = c->opts.per_head ? c->hl_pre + (size_t)l * (size_t)Hkv
                                      : NULL,
        .fault = c->fault_d,
    };
    if (c->opts.method == TG_SCORE_GVOTE) {
        TG_TRY(gw_cuda__gvote_select(c, seq, l, n, start, keep, err, errlen));
        GW_OP_TRY(tg_cuda_compress_kv_append(&dst, c->k, c->v, n, c->idx, keep,
                                             c->stream),
                  "KV append", l);
        int32_t *krow = keep_rows + r0;
        const int32_t *hl = seq->hlen + (size_t)l * (size_t)Hkv;
        const int32_t *glen = seq->len + r0;
        for (int g = 0; g < G; g++)
            krow[g] = 0;
        for (int h = 0; h < Hkv; h++) {
            int32_t grow = hl[h] + keep[h] - glen[hg[h]];
            if (grow > krow[hg[h]])
                krow[hg[h]] = grow;
            c->hkeep[(size_t)l * (size_t)Hkv + (size_t)h] = keep[h];
        }
        return 0;
    }
    if (c->opts.per_head)
        for (int h = 0; h < Hkv; h++)
            c->hkeep[(size_t)l * (size_t)Hkv + (size_t)h] = keep[h];
    if (all && c->opts.on_scores == NULL) {
        GW_OP_TRY(tg_cuda_compress_kv_append(&dst, c->k, c->v, n, NULL, keep,
                                             c->stream),
                  "KV append", l);
        return 0;
    }
    struct tg_cuda_compress_chunk ch = {
        .q = c->q, .k = c->k, .v = c->v, .n = n,
        .n_q_heads = md->n_q_heads, .n_kv_heads = Hkv,
        .head_dim = md->head_dim, .start = start,
        .window = lay->rule.window, .n_sink = lay->rule.n_sink,
        .scale = 1.0f / sqrtf((float)md->head_dim),
    };
    GW_OP_TRY(tg_cuda_score_qa_score(c->opts.method, &ch, c->scores, c->cmp_ws,
                                     c->cmp_ws_bytes, c->stream),
              "key scoring", l);
    if (c->opts.on_scores != NULL) {
        /* calibration scores every chunk, as the CPU forward pass does */
        TG_TRY(gw_cuda__on_scores(c, l, n, err, errlen));
        if (all) {
            GW_OP_TRY(tg_cuda_compress_kv_append(&dst, c->k, c->v, n, NULL,
                                                 keep, c->stream),
                      "KV append", l);
            return 0;
        }
    }
    GW_OP_TRY(tg_cuda_compress_select_topk(c->scores, n, Hkv, keep, start,
                                           lay->rule.window, lay->rule.n_sink,
                                           c->idx, c->stream),
              "top-k selection", l);
    GW_OP_TRY(tg_cuda_compress_kv_append(&dst, c->k, c->v, n, c->idx, keep,
                                         c->stream),
              "KV append", l);
    return 0;
}

/* log_softmax(row)[t] in double on the host (the T > 1 prompt path),
 * with, when rank is not NULL, t's rank (1 + the ids more likely; NaN
 * never is) and the k most likely ids (logit desc, id asc, NaN last)
 * with their values computed as t's is. */
static float host_logprob(const float *row, int V, int t, int32_t *rank, int k,
                          int32_t *top_ids, float *top_lps)
{
    float mx = row[0];
    for (int j = 1; j < V; j++)
        mx = row[j] > mx ? row[j] : mx;
    double s = 0.0;
    for (int j = 0; j < V; j++)
        s += exp((double)row[j] - (double)mx);
    double ls = log(s);
    if (rank != NULL) {
        int32_t above = 0;
        for (int j = 0; j < V; j++)
            above += row[j] > row[t] || (isnan(row[t]) && !isnan(row[j]));
        *rank = above + 1;
        int have = 0;
        for (int j = 0; j < V; j++) {
            float v = isnan(row[j]) ? -INFINITY : row[j];
            int at = have;
            while (at > 0 &&
                   v > (isnan(row[top_ids[at - 1]]) ? -INFINITY
                                                    : row[top_ids[at - 1]]))
                at--;
            if (at >= k)
                continue;
            for (int q = (have < k ? have : k - 1); q > at; q--)
                top_ids[q] = top_ids[q - 1];
            top_ids[at] = j;
            have += have < k;
        }
        for (int q = 0; q < k; q++)
            top_lps[q] = (float)((double)row[top_ids[q]] - (double)mx - ls);
    }
    return (float)((double)row[t] - (double)mx - ls);
}

/* Rank 0, one world: the block's ranks and alternatives on the device
 * (tg_cuda_logprobs' and tg_cuda_topk_logprobs' reductions are the same,
 * so a target's value equals its own entry among the alternatives). */
static int prompt_top_dev(struct gw_cuda *c, int i0, int m,
                          const struct gw_prefill_out *out, char *err,
                          size_t errlen)
{
    const struct gw_model *md = c->model;
    int V = md->vocab, K = out->n_top;
    cudaStream_t st = STREAM(c);
    GW_OP_TRY(tg_cuda_token_rank(c->logits, m, V, c->tgt_d, c->rank_d, st),
              "prompt ranks", md->n_layers);
    GW_CU_TRY(cudaMemcpyAsync(c->p_rank, c->rank_d, (size_t)m * 4,
                              cudaMemcpyDeviceToHost, st));
    if (K > 0) {
        GW_OP_TRY(tg_cuda_topk_logprobs(c->logits, m, V, K, c->ptop_ids_d,
                                        c->ptop_lps_d, st),
                  "prompt alternatives", md->n_layers);
        GW_CU_TRY(cudaMemcpyAsync(c->p_ptop_ids, c->ptop_ids_d,
                                  (size_t)m * K * 4, cudaMemcpyDeviceToHost,
                                  st));
        GW_CU_TRY(cudaMemcpyAsync(c->p_ptop_lps, c->ptop_lps_d,
                                  (size_t)m * K * 4, cudaMemcpyDeviceToHost,
                                  st));
    }
    GW_WAIT_TRY(c);
    for (int i = 0; i < m; i++) {
        if (out->lp_targets[i0 + i] < 0)
            continue;
        out->rank[i0 + i] = c->p_rank[i];
        memcpy(out->top_ids + (size_t)(i0 + i) * K,
               c->p_ptop_ids + (size_t)i * K, (size_t)K * 4);
        memcpy(out->top_lps + (size_t)(i0 + i) * K,
               c->p_ptop_lps + (size_t)i * K, (size_t)K * 4);
    }
    return 0;
}

/* Prompt log-probabilities of a finished chunk of n rows (c->h holds the
 * final-normed rows), GW_CUDA_LP_BLOCK rows per LM-head GEMM. Blocks
 * without a target are skipped on every rank alike (the targets are the
 * same everywhere); results go to out->lp on rank 0. */
/* out->on_row for the rows of a block whose logits are in c->lp_host. */
static void rows_to_caller(const struct gw_cuda *c, int64_t start, int i0,
                           int m, const struct gw_prefill_out *out)
{
    int V = c->model->vocab;
    for (int i = 0; out->on_row != NULL && i < m; i++) {
        int64_t pos = start + i0 + i + 1;
        if (out->lp_targets[i0 + i] >= 0 && pos >= out->row_from)
            out->on_row(out->row_ud, pos, c->lp_host + (size_t)i * V, V);
    }
}

static int prompt_lp(struct gw_cuda *c, int64_t start, int n,
                     const struct gw_prefill_out *out, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    int V = md->vocab, rank0 = md->rank == 0;
    const int32_t *tg = out->lp_targets;
    cudaStream_t st = STREAM(c);
    /* Before the first collective: a failure here must not leave rank 0
     * one all-gather short of its peers. */
    if (rank0 && (md->world > 1 || out->on_row != NULL) && c->lp_host == NULL &&
        (c->lp_host = malloc((size_t)GW_CUDA_LP_BLOCK * (size_t)V * 4)) == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
    GW_WAIT_TRY(c); /* p_pos / p_ids are free again */
    for (int i0 = 0; i0 < n; i0 += GW_CUDA_LP_BLOCK) {
        int m = n - i0 < GW_CUDA_LP_BLOCK ? n - i0 : GW_CUDA_LP_BLOCK;
        int any = 0;
        for (int i = 0; i < m; i++)
            any |= tg[i0 + i] >= 0;
        if (!any)
            continue;
        int rc = gw_cuda__lm_head(c, i0, m, err, errlen);
        if (rc != 0)
            return rc;
        if (!rank0) {
            GW_WAIT_TRY(c);
        } else if (md->world <= 1) {
            /* The caller's whole rows first, before any reduction runs
             * over the logits; only blocks that reach row_from. */
            if (out->on_row != NULL && start + i0 + m >= out->row_from) {
                rc = gw_cuda__logits_to_host(c, m, m, c->lp_host, err, errlen);
                if (rc != 0)
                    return rc;
                rows_to_caller(c, start, i0, m, out);
            }
            for (int i = 0; i < m; i++)
                c->p_pos[i] = tg[i0 + i] >= 0 ? tg[i0 + i] : 0;
            GW_CU_TRY(cudaMemcpyAsync(c->tgt_d, c->p_pos, (size_t)m * 4,
                               cudaMemcpyHostToDevice, st));
            GW_OP_TRY(tg_cuda_logprobs(c->logits, m, V, c->tgt_d, c->lp_d, st),
               "prompt logprobs", md->n_layers);
            GW_CU_TRY(cudaMemcpyAsync(c->p_lp, c->lp_d, (size_t)m * 4,
                               cudaMemcpyDeviceToHost, st));
            GW_WAIT_TRY(c);
            for (int i = 0; i < m; i++)
                if (tg[i0 + i] >= 0)
                    out->lp[i0 + i] = c->p_lp[i];
            if (out->rank != NULL &&
                (rc = prompt_top_dev(c, i0, m, out, err, errlen)) != 0)
                return rc;
        } else {
            /* the gathered slices are reordered on the host anyway */
            rc = gw_cuda__logits_to_host(c, m, m, c->lp_host, err, errlen);
            if (rc != 0)
                return rc;
            rows_to_caller(c, start, i0, m, out);
            for (int i = 0; i < m; i++) {
                if (tg[i0 + i] < 0)
                    continue;
                size_t r = (size_t)(i0 + i);
                int K = out->n_top;
                out->lp[r] = host_logprob(
                    c->lp_host + (size_t)i * V, V, tg[i0 + i],
                    out->rank != NULL ? out->rank + r : NULL, K,
                    out->rank != NULL ? out->top_ids + r * K : NULL,
                    out->rank != NULL ? out->top_lps + r * K : NULL);
            }
        }
    }
    return 0;
}

int gw_cuda_prefill(struct gw_cuda *c, struct gw_seq *seq, const int32_t *ids,
                    int n, const struct gw_prefill_out *out, char *err,
                    size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct kv_layout *lay = c->layout;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (n <= 0 || n > c->opts.max_chunk)
        return tg_err_set(err, errlen, TG_EINVAL, "chunk of %d tokens (max %d)",
                          n, c->opts.max_chunk);
    int rc = gw_cuda__check_ids(c, ids, n, err, errlen);
    if (rc != 0)
        return rc;
    int want_last = out != NULL && out->want_logits;
    int want_lp = out != NULL && out->lp_targets != NULL;
    if (md->rank == 0 && ((want_last && out->last_logits == NULL) ||
                          (want_lp && out->lp == NULL) ||
                          (want_lp && out->rank != NULL &&
                           (out->n_top < 0 || out->n_top > GW_PROMPT_MAX_TOP ||
                            (out->n_top > 0 &&
                             (out->top_ids == NULL || out->top_lps == NULL))))))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank 0 needs the output buffers it asks for");
    int64_t start = seq->pos;
    int forced = 0;
    if ((rc = gw_chunk_plan(lay, seq, n, c->keep_rows, &forced, err,
                            errlen)) != 0)
        return rc;
    cudaStream_t st = STREAM(c);
    GW_WAIT_TRY(c); /* the pinned staging is ours again */
    for (int i = 0; i < n; i++) {
        c->p_ids[i] = ids[i];
        c->p_pos[i] = (int32_t)(start + i);
    }
    if ((rc = gw_cuda__table_prefill(c, seq, err, errlen)) != 0 ||
        (rc = gw_cuda__heads_prefill(c, seq, err, errlen)) != 0)
        return rc;
    GW_CU_TRY(cudaMemcpyAsync(c->ids_d, c->p_ids, (size_t)n * 4, cudaMemcpyHostToDevice, st));
    GW_CU_TRY(cudaMemcpyAsync(c->pos_d, c->p_pos, (size_t)n * 4, cudaMemcpyHostToDevice, st));
    GW_CU_TRY(cudaMemsetAsync(c->fault_d, 0, 4, st));
    GW_OP_TRY(tg_cuda_elementwise_embedding(c->embed, md->vocab, md->hidden,
                                            c->ids_d, n, c->x,
                                            TG_CUDA_ELEMENTWISE_F32, st),
              "embedding", 0);
    int G = lay->n_groups;
    for (int l = 0; l < md->n_layers; l++) {
        c->hook_rows = c->opts.on_queries != NULL ? n : 0;
        rc = gw_cuda__layer_qkv(c, l, n, err, errlen);
        c->hook_rows = 0;
        if (rc != 0)
            return rc;
        size_t r0 = (size_t)l * (size_t)G;
        struct tg_cuda_prefill_attn_args a = {
            .q = c->q, .k = c->k, .v = c->v, .n = n,
            .n_q_heads = md->n_q_heads, .n_kv_heads = md->n_kv_heads,
            .head_dim = md->head_dim, .pool = c->pool,
            .heads_per_group = lay->heads_per_group,
            .page_size = lay->page_size, .n_groups = G,
            .head_group = c->head_group + (size_t)l * (size_t)md->n_kv_heads,
            .head_slot = c->head_slot + (size_t)l * (size_t)md->n_kv_heads,
            .indptr = c->pre.indptr + r0, .indices = c->pre.indices,
            .lens = c->pre.lens + r0,
            .head_lens = c->opts.per_head
                             ? c->hl_pre + (size_t)l * (size_t)md->n_kv_heads
                             : NULL,
            .scale = 1.0f / sqrtf((float)md->head_dim),
            .out = c->att, .stream = c->stream,
        };
        GW_OP_TRY(tg_cuda_prefill_attn(&a, err, errlen), "prefill attention", l);
        if ((rc = layer_compress(c, seq, l, n, start, c->keep_rows, err,
                                 errlen)) != 0 ||
            (rc = gw_cuda__layer_out_mlp(c, l, n, err, errlen)) != 0)
            return rc;
    }
    if (want_last || want_lp) {
        if ((rc = gw_cuda__final_norm(c, n, err, errlen)) != 0)
            return rc;
        if (want_lp && (rc = prompt_lp(c, start, n, out, err, errlen)) != 0)
            return rc;
        if (want_last) {
            if ((rc = gw_cuda__lm_head(c, n - 1, 1, err, errlen)) != 0)
                return rc;
            if (md->rank == 0 &&
                (rc = gw_cuda__logits_to_host(c, 1, 1, out->last_logits, err, errlen)) != 0)
                return rc;
        }
    }
    if ((rc = gw_cuda__finish(c, err, errlen)) != 0)
        return rc;
    /* the device rows grew: mirror the kept counts on the host */
    gw_chunk_advance(seq, lay, c->keep_rows, n);
    gw_cuda__heads_advance(c, seq);
    return 0;
}

/* ---- decode ------------------------------------------------------------ */

/* The whole decode step of B (padded) sequences from the device inputs
 * (ids_d, pos_d, the table): embedding, every layer, final norm and LM
 * head. Only enqueues work on the stream, so it can be captured. */
static int decode_body(struct gw_cuda *c, int B, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct kv_layout *lay = c->layout;
    int G = lay->n_groups, LG = md->n_layers * G, Hkv = md->n_kv_heads;
    int rc;
    GW_OP_TRY(tg_cuda_elementwise_embedding(c->embed, md->vocab, md->hidden,
                                            c->ids_d, B, c->x,
                                            TG_CUDA_ELEMENTWISE_F32, c->stream),
              "embedding", 0);
    for (int l = 0; l < md->n_layers; l++) {
        if ((rc = gw_cuda__layer_qkv(c, l, B, err, errlen)) != 0)
            return rc;
        struct tg_cuda_kv_csr tab = {
            .indptr = c->dec.indptr, .indices = c->dec.indices,
            .lens = c->dec.lens, .n_rows = (int32_t)B * LG,
            .row_stride = LG, .row_offset = l * G,
            .head_lens = c->opts.per_head ? c->hl_dec : NULL,
            .head_stride = md->n_layers * Hkv, .head_offset = l * Hkv,
        };
        const int32_t *hg = c->head_group + (size_t)l * (size_t)Hkv;
        const int32_t *hs = c->head_slot + (size_t)l * (size_t)Hkv;
        struct tg_cuda_decode_append_args ap = {
            .k = c->k, .v = c->v, .n_seq = B, .n_kv_heads = Hkv,
            .head_dim = md->head_dim,
            .heads_per_group = lay->heads_per_group,
            .page_size = lay->page_size, .pool = c->pool,
            .n_pages = (int64_t)c->n_pages + 1, /* + the scratch page */
            .head_group = hg, .head_slot = hs, .table = tab,
            .fault = c->fault_d, .stream = c->stream,
        };
        GW_OP_TRY(tg_cuda_decode_append(&ap, err, errlen), "decode KV append", l);
        struct tg_cuda_decode_attn_args at = {
            .q = c->q, .pool = c->pool, .n_seq = B,
            .n_q_heads = md->n_q_heads, .n_kv_heads = Hkv, .n_groups = G,
            .heads_per_group = lay->heads_per_group,
            .page_size = lay->page_size, .head_dim = md->head_dim,
            .head_group = hg, .head_slot = hs, .table = tab,
            .splits = c->splits, .layer = l,
            .scale = 1.0f / sqrtf((float)md->head_dim),
            .ws = c->dec_ws, .ws_bytes = c->dec_ws_bytes, .out = c->att,
            .out_dtype = TG_CUDA_DECODE_OUT_BF16, .stream = c->stream,
        };
        GW_OP_TRY(tg_cuda_decode_attn(&at, err, errlen), "decode attention", l);
        if ((rc = gw_cuda__layer_out_mlp(c, l, B, err, errlen)) != 0)
            return rc;
    }
    if ((rc = gw_cuda__final_norm(c, B, err, errlen)) != 0)
        return rc;
    return gw_cuda__lm_head(c, 0, B, err, errlen);
}

/* Captures decode_body for bucket bi. A bucket that fails to capture is
 * marked and runs eagerly from then on; the reason stays in graph_error
 * for the worker to log once. */
static void capture(struct gw_cuda *c, int bi)
{
    cudaStream_t st = STREAM(c);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    char why[256] = "";
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        int rc = decode_body(c, c->bucket[bi], why, sizeof(why));
        e = cudaStreamEndCapture(st, &graph);
        if (rc != 0 && why[0] == '\0')
            snprintf(why, sizeof(why), "%s", tg_strerror(rc));
        if (rc != 0 && e == cudaSuccess)
            e = cudaErrorStreamCaptureInvalidated;
    }
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (e != cudaSuccess || exec == NULL) {
        cudaGetLastError(); /* clear the sticky-free error state */
        c->graph_failed[bi] = 1;
        snprintf(c->graph_error, sizeof(c->graph_error),
                 "decode graph of batch %d not captured (%s%s%s); that "
                 "bucket runs eagerly", c->bucket[bi], cudaGetErrorString(e),
                 why[0] ? ": " : "", why);
        return;
    }
    c->graph_exec[bi] = exec;
}

static int decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                  const int32_t *ids, int n_seq, int want_logits,
                  float *logits, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct kv_layout *lay = c->layout;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (n_seq <= 0 || n_seq > c->opts.max_seqs)
        return tg_err_set(err, errlen, TG_EINVAL, "decode batch of %d (max %d)",
                          n_seq, c->opts.max_seqs);
    int rc = gw_cuda__check_ids(c, ids, n_seq, err, errlen);
    if (rc != 0)
        return rc;
    c->dev_rows = 0;
    int32_t one[KV_MAX_GROUPS];
    for (int g = 0; g < lay->n_groups; g++)
        one[g] = 1;
    for (int s = 0; s < n_seq; s++)
        for (int l = 0; l < lay->n_layers; l++)
            if ((rc = gw_seq_room(c->layout, seqs[s], l, one, err, errlen)) != 0)
                return rc;
    int bi = -1, B = n_seq;
    if (c->opts.graphs) {
        bi = gw_cuda_bucket_of(c->bucket, c->n_buckets, n_seq);
        if (bi >= 0)
            B = c->bucket[bi];
    }
    cudaStream_t st = STREAM(c);
    GW_WAIT_TRY(c);
    int LG = md->n_layers * lay->n_groups;
    for (int s = 0; s < B; s++) {
        c->p_ids[s] = s < n_seq ? ids[s] : 0;
        c->p_pos[s] = s < n_seq ? (int32_t)seqs[s]->pos : 0;
    }
    if ((rc = gw_cuda__table_decode(c, seqs, n_seq, B, err, errlen)) != 0 ||
        (rc = gw_cuda__heads_decode(c, seqs, n_seq, B, err, errlen)) != 0)
        return rc;
    GW_CU_TRY(cudaMemcpyAsync(c->ids_d, c->p_ids, (size_t)B * 4, cudaMemcpyHostToDevice, st));
    GW_CU_TRY(cudaMemcpyAsync(c->pos_d, c->p_pos, (size_t)B * 4, cudaMemcpyHostToDevice, st));
    GW_CU_TRY(cudaMemsetAsync(c->fault_d, 0, 4, st));
    if (bi >= 0 && c->graph_exec[bi] != NULL) {
        GW_CU_TRY(cudaGraphLaunch((cudaGraphExec_t)c->graph_exec[bi], st));
        c->graph_launches++;
    } else {
        if ((rc = decode_body(c, B, err, errlen)) != 0)
            return rc;
        c->eager_steps++;
    }
    if (want_logits && md->rank == 0 && logits != NULL &&
        (rc = gw_cuda__logits_to_host(c, B, n_seq, logits, err, errlen)) != 0)
        return rc;
    if (want_logits && md->rank == 0 && logits == NULL && md->world > 1)
        GW_OP_TRY(tg_cuda_vocab_unshard(c->gathered, md->world, B, c->lm_rows,
                                 md->vocab, c->full, c->stream),
           "logits unshard", md->n_layers);
    if ((rc = gw_cuda__finish(c, err, errlen)) != 0)
        return rc;
    if (want_logits && md->rank == 0 && logits == NULL)
        c->dev_rows = n_seq; /* kept on the device for gw_cuda_sample */
    /* First use of a bucket ran eagerly (settling cuBLASLt's plans and
     * any lazy kernel setup); capture it now for the next steps. Capture
     * records without running, so the step's results stand. */
    if (bi >= 0 && c->graph_exec[bi] == NULL && !c->graph_failed[bi])
        capture(c, bi);
    for (int s = 0; s < n_seq; s++) {
        for (int r = 0; r < LG; r++)
            seqs[s]->len[r] += 1;
        if (c->opts.per_head)
            for (int i = 0; i < md->n_layers * md->n_kv_heads; i++)
                seqs[s]->hlen[i] += 1;
        seqs[s]->pos += 1;
    }
    return 0;
}

int gw_cuda_decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                   const int32_t *ids, int n_seq, int want_logits,
                   float *logits, char *err, size_t errlen)
{
    int rc = decode(c, seqs, ids, n_seq, want_logits, logits, err, errlen);
    /* A step that failed may have left the device table short of the
     * update the host table holds: rebuild it next time. */
    if (rc != 0)
        kv_table_invalidate(&c->dec_kv);
    return rc;
}

/* ---- sampling on the device -------------------------------------------- */

/* Flattens the rows' logit bias into the pinned buffers (row, id, value
 * triples). Returns the entry count, or -1 over GW_CUDA_MAX_BIAS. */
static int gather_bias(struct gw_cuda *c, int n,
                       const struct tg_sampling *const *bias)
{
    int m = 0;
    for (int i = 0; bias != NULL && i < n; i++) {
        const struct tg_sampling *sp = bias[i];
        if (sp == NULL || sp->n_bias <= 0)
            continue;
        if (sp->n_bias > GW_CUDA_MAX_BIAS - m)
            return -1;
        for (int k = 0; k < sp->n_bias; k++, m++) {
            c->p_bias_rows[m] = i;
            c->p_bias_ids[m] = sp->bias_ids[k];
            c->p_bias_vals[m] = sp->bias_vals[k];
        }
    }
    return m;
}

int gw_cuda_sample(struct gw_cuda *c, int n,
                   const struct tg_cuda_sample_params *params,
                   const struct tg_sampling *const *bias,
                   const uint32_t *const *masks, int n_top, int32_t *tokens,
                   float *lps, int32_t *top_ids, float *top_lps, int32_t *bad,
                   float *bad_val, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (c->sampler == NULL || n < 1 || n > c->dev_rows || n_top < 0 ||
        n_top > GW_CUDA_MAX_TOP || n_top > md->vocab ||
        (n_top > 0 && (top_ids == NULL || top_lps == NULL)) ||
        tokens == NULL || lps == NULL || params == NULL || bad == NULL ||
        bad_val == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "device sampling of %d rows (%d kept on the device, "
                          "%d top logprobs, max %d)", n, c->dev_rows, n_top,
                          GW_CUDA_MAX_TOP);
    float *logits = md->world > 1 ? c->full : c->logits;
    cudaStream_t st = STREAM(c);
    /* The raw logits, before any bias: a non-finite one makes the row
     * unusable whatever is drawn from it. */
    GW_OP_TRY(tg_cuda_first_nonfinite(logits, n, md->vocab, c->s_bad,
                                      c->s_bad_val, c->stream),
              "finiteness check", md->n_layers);
    GW_CU_TRY(cudaMemcpyAsync(c->p_bad, c->s_bad, (size_t)n * 4,
                              cudaMemcpyDeviceToHost, st));
    GW_CU_TRY(cudaMemcpyAsync(c->p_bad_val, c->s_bad_val, (size_t)n * 4,
                              cudaMemcpyDeviceToHost, st));
    int nm = 0;
    for (int i = 0; masks != NULL && i < n; i++) {
        if (masks[i] == NULL)
            continue;
        c->p_mask_rows[nm] = i;
        memcpy(c->p_masks + (size_t)nm * c->mask_words, masks[i],
               (size_t)c->mask_words * 4);
        nm++;
    }
    if (nm > 0) {
        GW_CU_TRY(cudaMemcpyAsync(c->s_mask_rows, c->p_mask_rows,
                                  (size_t)nm * 4, cudaMemcpyHostToDevice, st));
        GW_CU_TRY(cudaMemcpyAsync(c->s_masks, c->p_masks,
                                  (size_t)nm * c->mask_words * 4,
                                  cudaMemcpyHostToDevice, st));
        GW_OP_TRY(tg_cuda_logit_mask_apply(logits, md->vocab, c->s_mask_rows,
                                           c->s_masks, c->mask_words, nm,
                                           c->stream),
                  "token masks", md->n_layers);
    }
    int nb = gather_bias(c, n, bias);
    if (nb < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "more than %d logit-bias entries in one batch",
                          GW_CUDA_MAX_BIAS);
    if (nb > 0) {
        GW_CU_TRY(cudaMemcpyAsync(c->s_bias_rows, c->p_bias_rows, (size_t)nb * 4,
                           cudaMemcpyHostToDevice, st));
        GW_CU_TRY(cudaMemcpyAsync(c->s_bias_ids, c->p_bias_ids, (size_t)nb * 4,
                           cudaMemcpyHostToDevice, st));
        GW_CU_TRY(cudaMemcpyAsync(c->s_bias_vals, c->p_bias_vals, (size_t)nb * 4,
                           cudaMemcpyHostToDevice, st));
        GW_OP_TRY(tg_cuda_logit_bias(logits, md->vocab, c->s_bias_rows,
                              c->s_bias_ids, c->s_bias_vals, nb, 1.0f,
                              c->stream), "logit bias", md->n_layers);
    }
    GW_OP_TRY(tg_cuda_sample(c->sampler, logits, n, md->vocab, params, c->s_tok,
                      c->s_lp, c->stream), "sampling", md->n_layers);
    if (nb > 0) {
        /* Back to the raw logits: the chosen tokens' log-probabilities
         * (and the top logprobs below) are those of the raw logits, as
         * the CPU sampler reports them. */
        GW_OP_TRY(tg_cuda_logit_bias(logits, md->vocab, c->s_bias_rows,
                              c->s_bias_ids, c->s_bias_vals, nb, -1.0f,
                              c->stream), "logit bias", md->n_layers);
        GW_OP_TRY(tg_cuda_logprobs(logits, n, md->vocab, c->s_tok, c->s_lp,
                            c->stream), "log-probabilities", md->n_layers);
    }
    GW_CU_TRY(cudaMemcpyAsync(c->p_tok, c->s_tok, (size_t)n * 4,
                       cudaMemcpyDeviceToHost, st));
    GW_CU_TRY(cudaMemcpyAsync(c->p_slp, c->s_lp, (size_t)n * 4,
                       cudaMemcpyDeviceToHost, st));
    if (n_top > 0) {
        GW_OP_TRY(tg_cuda_topk_logprobs(logits, n, md->vocab, n_top, c->s_top_ids,
                                 c->s_top_lps, c->stream),
           "top logprobs", md->n_layers);
        GW_CU_TRY(cudaMemcpyAsync(c->p_top_ids, c->s_top_ids, (size_t)n * n_top * 4,
                           cudaMemcpyDeviceToHost, st));
        GW_CU_TRY(cudaMemcpyAsync(c->p_top_lps, c->s_top_lps, (size_t)n * n_top * 4,
                           cudaMemcpyDeviceToHost, st));
    }
    GW_CU_TRY(cudaStreamSynchronize(st)); /* rank 0 only: no collective here */
    memcpy(tokens, c->p_tok, (size_t)n * 4);
    memcpy(lps, c->p_slp, (size_t)n * 4);
    memcpy(bad, c->p_bad, (size_t)n * 4);
    memcpy(bad_val, c->p_bad_val, (size_t)n * 4);
    if (n_top > 0) {
        memcpy(top_ids, c->p_top_ids, (size_t)n * n_top * 4);
        memcpy(top_lps, c->p_top_lps, (size_t)n * n_top * 4);
    }
    c->dev_rows = 0; /* one sampling per decode */
    return 0;
}

int gw_cuda_copy_pages(struct gw_cuda *c, const int32_t *src,
                       const int32_t *dst, int n, char *err, size_t errlen)
{
    /* A page is [H_p][2][P][d] half-precision elements, contiguous in the
     * pool, so one device-to-device copy per page. */
    size_t bytes = (size_t)kv_layout_page_elems(c->layout) * 2;
    for (int i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= c->n_pages || dst[i] < 0 ||
            dst[i] >= c->n_pages)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "page copy %d -> %d outside the pool of %d",
                              (int)src[i], (int)dst[i], (int)c->n_pages);
        GW_CU_TRY(cudaMemcpyAsync((char *)c->pool + (size_t)dst[i] * bytes,
                                  (const char *)c->pool +
                                      (size_t)src[i] * bytes,
                                  bytes, cudaMemcpyDeviceToDevice,
                                  STREAM(c)));
    }
    GW_WAIT_TRY(c);
    return 0;
}

#endif /* TANGRAM_CUDA */
