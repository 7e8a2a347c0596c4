/* gw_cuda.c — the forward pass on the CUDA backend (see gw_cuda.h). */
#include "gpu_worker/cuda/gw_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kv/kv_budget.h"
#include "common/base/tg_err.h"

/* ---- decode batch buckets (every build) -------------------------------- */

int gw_cuda_buckets(int max_seqs, int *buckets, int cap)
{
    static const int small[] = {1, 2, 4, 8, 16, 24, 32, 48, 64};
    int n = 0;
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]) && n < cap; i++) {
        if (small[i] >= max_seqs)
            break;
        buckets[n++] = small[i];
    }
    for (int b = 96; b < max_seqs && n < cap; b += 32)
        buckets[n++] = b;
    if (max_seqs >= 1 && n < cap)
        buckets[n++] = max_seqs; /* the largest batch is always a bucket */
    else if (max_seqs >= 1 && n == cap)
        buckets[cap - 1] = max_seqs;
    return n;
}

int gw_cuda_bucket_of(const int *buckets, int n_buckets, int n)
{
    if (n < 1)
        return -1;
    for (int i = 0; i < n_buckets; i++)
        if (buckets[i] >= n)
            return i;
    return -1;
}

#ifdef TANGRAM_CUDA

#include <cuda_runtime.h>

#include "kernels/cuda/compress.h"
#include "kernels/cuda/decode_append.h"
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/prefill_attn.h"
#include "kernels/cuda/sample.h"
#include "kernels/cuda/score_qa.h"
#include "common/model/st_safetensors.h"
#include "gpu_worker/cuda/gw_cuda_internal.h"

static size_t align256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

/* ---- sizes ------------------------------------------------------------- */

struct sizes {
    size_t weights;      /* bytes of the weight slab */
    size_t act;          /* activations, workspaces, tables (device) */
    size_t pinned;       /* host staging */
};

/* Vocabulary rows of the LM head on this rank (gw_model_vocab_slice,
 * Megatron's vocab-parallel output layer): the device copy is padded to
 * Vp = ceil(V/T) rows so every rank's part of the all-gather has one size;
 * with one rank Vp = V. */
static int lm_rows_padded(const struct gw_model *m)
{
    int first, count, vp;
    gw_model_vocab_slice(m, &first, &count, &vp);
    return vp;
}

/* ---- allocation helpers ------------------------------------------------ */

int gw_cuda__dalloc(void **p, size_t bytes, const char *what, char *err,
                    size_t errlen)
{
    cudaError_t e = cudaMalloc(p, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return tg_err_set(err, errlen, e == cudaErrorMemoryAllocation
                                           ? TG_ENOMEM : TG_EDEVICE,
                          "cudaMalloc of %zu bytes for %s: %s", bytes, what,
                          cudaGetErrorString(e));
    }
    return 0;
}

int gw_cuda__halloc(void **p, size_t bytes, const char *what, char *err,
                    size_t errlen)
{
    cudaError_t e = cudaMallocHost(p, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "cudaMallocHost of %zu pinned bytes for %s: %s",
                          bytes, what, cudaGetErrorString(e));
    }
    return 0;
}


/* ---- weight upload ----------------------------------------------------- */

/* gw_wslab's copy on the runtime's stream: each bounce buffer's last copy
 * is an event, waited for before the buffer is converted into again. */
struct wcopy {
    cudaStream_t stream;
    char *base;          /* the device slab */
    cudaEvent_t ev[2];
};

static int wcopy_copy(void *ctx, uint64_t dst, const void *src, size_t bytes,
                      int buf, char *err, size_t errlen)
{
    struct wcopy *k = ctx;
    GW_CU_TRY(cudaMemcpyAsync(k->base + dst, src, bytes, cudaMemcpyHostToDevice,
                              k->stream));
    GW_CU_TRY(cudaEventRecord(k->ev[buf], k->stream));
    return 0;
}

static int wcopy_wait(void *ctx, int buf, char *err, size_t errlen)
{
    struct wcopy *k = ctx;
    GW_CU_TRY(cudaEventSynchronize(k->ev[buf]));
    return 0;
}

/* The device address of (kind, layer) in the slab, or NULL. */
static void *slab_at(const struct gw_cuda *c, int kind, int layer)
{
    int elem;
    uint64_t off = gw_wslab_offset(&c->ws, kind, layer, &elem);
    return off == GW_WSLAB_NONE ? NULL : (char *)c->wslab + off;
}

/* Points the runtime's tensors into the slab. */
static void carve_weights(struct gw_cuda *c)
{
    const struct gw_model *m = c->model;
    for (int l = 0; l < m->n_layers; l++) {
        struct gw_cuda_layer *g = &c->layers[l];
        g->attn_norm = slab_at(c, GW_W_ATTN_NORM, l);
        g->wq = slab_at(c, GW_W_WQ, l);
        g->wk = slab_at(c, GW_W_WK, l);
        g->wv = slab_at(c, GW_W_WV, l);
        g->bq = slab_at(c, GW_W_BQ, l);
        g->bk = slab_at(c, GW_W_BK, l);
        g->bv = slab_at(c, GW_W_BV, l);
        g->q_norm = slab_at(c, GW_W_Q_NORM, l);
        g->k_norm = slab_at(c, GW_W_K_NORM, l);
        g->wo = slab_at(c, GW_W_WO, l);
        g->bo = slab_at(c, GW_W_BO, l);
        g->ffn_norm = slab_at(c, GW_W_FFN_NORM, l);
        g->w_gu = slab_at(c, GW_W_GATE, l);
        g->w_down = slab_at(c, GW_W_DOWN, l);
    }
    c->embed = slab_at(c, GW_W_EMBED, 0);
    c->final_norm = slab_at(c, GW_W_FINAL_NORM, 0);
    c->lm_head = slab_at(c, GW_W_LM_HEAD, 0);
    c->inv_freq = slab_at(c, GW_WSLAB_INV_FREQ, 0);
}

/* Streams the weights into the slab (gw_load -> gw_wslab_upload -> the
 * stream): from the checkpoint, or from host weights the model holds. */
static int stream_weights(struct gw_cuda *c, struct gw_wslab_upload *up,
                          char *err, size_t errlen)
{
    const struct gw_model *m = c->model;
    struct gw_load_plan plan;
    TG_TRY(gw_model_load_plan(&plan, m, gw_wslab_tied_head(m), err, errlen));
    struct gw_load_sink sink = {.upload = gw_wslab_upload, .ctx = up};
    int rc;
    if (m->slab != NULL) {
        rc = gw_model_run_host(&plan, m, 0, &sink, &c->load, err, errlen);
    } else if (m->dir == NULL) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "the model has neither host weights nor a checkpoint");
    } else {
        struct st_model st;
        rc = st_model_open(&st, m->dir, err, errlen);
        if (rc == 0)
            rc = gw_load_plan_bind(&plan, &st, err, errlen);
        if (rc == 0)
            rc = gw_load_run(&plan, &st, 0, &sink, &c->load, err, errlen);
        st_model_close(&st);
    }
    gw_load_plan_free(&plan);
    return rc;
}

static int upload_weights(struct gw_cuda *c, char *err, size_t errlen)
{
    const struct gw_model *m = c->model;
    DALLOC(c->wslab, c->ws.bytes, "weights");
    c->layers = calloc((size_t)m->n_layers, sizeof(*c->layers));
    if (c->layers == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
    carve_weights(c);
    struct wcopy k = {.stream = STREAM(c), .base = c->wslab};
    struct gw_wslab_upload up = {.slab = &c->ws,
                                 .out = {wcopy_copy, wcopy_wait, &k},
                                 .bounce_bytes = GW_CUDA_BOUNCE_BYTES};
    int rc = 0, n_ev = 0;
    /* Padding rows of the LM head stay zero: cleared on the same stream
     * as the copies, so it is ordered before them. */
    GW_CU_TRY(cudaMemsetAsync(c->wslab, 0, c->ws.bytes, STREAM(c)));
    for (int b = 0; b < 2 && rc == 0; b++) {
        rc = gw_cuda__halloc(&up.bounce[b], GW_CUDA_BOUNCE_BYTES,
                             "the weight upload", err, errlen);
        if (rc == 0 && cudaEventCreateWithFlags(&k.ev[b], cudaEventDisableTiming) ==
                           cudaSuccess)
            n_ev++;
        else if (rc == 0)
            rc = tg_err_set(err, errlen, TG_EDEVICE, "cudaEventCreate failed");
    }
    if (rc == 0)
        rc = stream_weights(c, &up, err, errlen);
    /* Waits for the copies even after a failure: the bounce buffers are
     * freed below. */
    int rc2 = gw_wslab_upload_finish(&up, err, errlen);
    if (rc == 0)
        rc = rc2;
    if (rc == 0 &&
        cudaMemcpyAsync(c->inv_freq, m->inv_freq, (size_t)m->head_dim / 2 * 4,
                        cudaMemcpyHostToDevice, STREAM(c)) != cudaSuccess)
        rc = tg_err_set(err, errlen, TG_EDEVICE, "cannot upload inv_freq");
    if (cudaStreamSynchronize(STREAM(c)) != cudaSuccess && rc == 0)
        rc = tg_err_set(err, errlen, TG_EDEVICE, "weight upload: %s",
                        cudaGetErrorString(cudaGetLastError()));
    for (int b = 0; b < n_ev; b++)
        cudaEventDestroy(k.ev[b]);
    for (int b = 0; b < 2; b++)
        if (up.bounce[b] != NULL)
            cudaFreeHost(up.bounce[b]);
    return rc;
}

/* ---- init / free ------------------------------------------------------- */

void gw_cuda_free(struct gw_cuda *c)
{
    if (c->stream != NULL)
        cudaStreamSynchronize(STREAM(c));
    for (int i = 0; i < GW_CUDA_MAX_BUCKETS; i++)
        if (c->graph_exec[i] != NULL)
            cudaGraphExecDestroy((cudaGraphExec_t)c->graph_exec[i]);
    if (c->splits != NULL) {
        tg_cuda_split_map_free(c->splits);
        free(c->splits);
    }
    void *dev[] = {
        c->wslab,       c->head_group, c->head_slot,   c->pool,
        c->x,           c->part,       c->h,           c->q,
        c->att,         c->k,          c->v,           c->gu,
        c->mlp,         c->logits,     c->gathered,    c->scores,
        c->idx,         c->cmp_ws,     c->dec_ws,      c->ids_d,
        c->pos_d,       c->tgt_d,      c->lp_d,        c->fault_d,
        c->rank_d,      c->ptop_ids_d, c->ptop_lps_d,  c->dec.indptr,
        c->dec.indices, c->dec.npages, c->dec.lens,    c->pre.indptr,
        c->pre.indices, c->pre.npages, c->pre.lens,    c->sc_pos,
        c->sc_val,      c->full,       c->s_tok,       c->s_lp,
        c->s_bad,       c->s_bad_val,  c->s_top_ids,   c->s_top_lps,
        c->s_bias_rows, c->s_bias_ids, c->s_bias_vals, c->s_mask_rows,
        c->s_masks};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i] != NULL)
            cudaFree(dev[i]);
    void *pin[] = {
        c->dec.h_indptr, c->dec.h_indices, c->dec.h_npages, c->dec.h_lens,
        c->pre.h_indptr, c->pre.h_indices, c->pre.h_npages, c->pre.h_lens,
        c->h_sc_pos,     c->h_sc_val,      c->p_ids,        c->p_pos,
        c->p_fault,      c->p_logits,      c->p_lp,         c->p_tok,
        c->p_top_ids,    c->p_slp,         c->p_top_lps,    c->p_bad,
        c->p_bad_val,    c->p_bias_rows,   c->p_bias_ids,   c->p_bias_vals,
        c->p_mask_rows,  c->p_masks,       c->p_rank,       c->p_ptop_ids,
        c->p_ptop_lps};
    for (size_t i = 0; i < sizeof(pin) / sizeof(pin[0]); i++)
        if (pin[i] != NULL)
            cudaFreeHost(pin[i]);
    gw_cuda__heads_free(c);
    gw_cuda__hooks_free(c);
    tg_cuda_gemm_free(c->gemm);
    tg_cuda_sampler_free(c->sampler);
    if (c->stream != NULL)
        cudaStreamDestroy(STREAM(c));
    if (c->tier_stream != NULL)
        cudaStreamDestroy((cudaStream_t)c->tier_stream);
    free(c->layers);
    free(c->lp_host);
    free(c->dec_seqs);
    free(c->keep_rows);
    kv_table_free(&c->dec_kv);
    kv_table_free(&c->pre_kv);
    gw_wslab_free(&c->ws);
    memset(c, 0, sizeof(*c));
}

/* Device bytes of everything but the weights and the pool. */
static size_t act_bytes(const struct gw_cuda *c, int world, size_t *pinned)
{
    const struct gw_model *m = c->model;
    size_t R = (size_t)c->max_rows, H = (size_t)m->hidden;
    size_t qd = (size_t)m->n_q_heads * m->head_dim;
    size_t kd = (size_t)m->n_kv_heads * m->head_dim;
    size_t F = (size_t)m->ffn, LR = (size_t)c->logit_rows;
    size_t C = (size_t)c->opts.max_chunk, Hkv = (size_t)m->n_kv_heads;
    size_t b = 0;
    b += 2 * align256(R * H * 4) + align256(R * H * 2);
    b += 2 * align256(R * qd * 2) + 2 * align256(R * kd * 2);
    b += align256(R * 2 * F * 2) + align256(R * F * 2);
    b += align256(LR * (size_t)c->lm_rows * 4);
    if (world > 1)
        b += align256((size_t)world * LR * (size_t)c->lm_rows * 4);
    b += 2 * align256(Hkv * C * 4);
    b += align256(c->cmp_ws_bytes) + align256(c->dec_ws_bytes);
    b += 3 * align256(R * 4) + align256(GW_CUDA_LP_BLOCK * 4) + 256;
    if (m->rank == 0) /* prompt ranks and alternatives */
        b += align256(GW_CUDA_LP_BLOCK * 4) +
             2 * align256(GW_CUDA_LP_BLOCK * GW_PROMPT_MAX_TOP * 4);
    size_t tab = 3 * align256((size_t)(c->dec.cap_rows + 1) * 4) +
                 align256((size_t)c->dec.cap_ids * 4) +
                 3 * align256((size_t)(c->pre.cap_rows + 1) * 4) +
                 align256((size_t)c->pre.cap_ids * 4) +
                 2 * align256((size_t)c->dec.cap_rows * 4);
    b += tab;
    b += TG_CUDA_GEMM_WORKSPACE_DEFAULT;
    if (m->rank == 0) {
        /* the device sampler: sort buffers of up to 32 rows (sample.h) plus
         * cub's scratch, the unsharded logits (T > 1) and the outputs */
        size_t S = (size_t)c->opts.max_seqs, V = (size_t)m->vocab;
        size_t rows = S < TG_CUDA_SAMPLE_SORT_ROWS ? S : TG_CUDA_SAMPLE_SORT_ROWS;
        b += 24 * rows * V + 16 * V + ((size_t)16 << 20);
        if (world > 1)
            b += align256(LR * V * 4);
        b += 4 * align256(S * GW_CUDA_MAX_TOP * 4) + 2 * align256(S * 4);
    }
    size_t heads_pinned = 0;
    b += gw_cuda__heads_bytes(c, &heads_pinned);
    *pinned = tab + 2 * R * 4 + 4 + heads_pinned +
              (size_t)(world > 1 ? world : 0) * LR * (size_t)c->lm_rows * 4;
    return b;
}

static int check_shape(const struct gw_model *m, const struct kv_layout *lay,
                       const struct gw_cuda_opts *o, char *err, size_t errlen)
{
    int d = m->head_dim, Hkv = m->n_kv_heads;
    if (d != 64 && d != 128)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports head_dim 64 and 128 (the "
                          "model has %d)", d);
    if (Hkv < 1 || m->n_q_heads % Hkv != 0 || m->n_q_heads / Hkv > 16)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports 1..16 query heads per KV "
                          "head (Hq %d, Hkv %d)", m->n_q_heads, Hkv);
    if (lay->heads_per_group > 16 || Hkv > TG_CUDA_COMPRESS_MAX_KV_HEADS)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports at most 16 heads per group "
                          "and %d KV heads per rank (have %d and %d)",
                          TG_CUDA_COMPRESS_MAX_KV_HEADS, lay->heads_per_group,
                          Hkv);
    if (o->max_chunk < 1 || o->max_chunk > TG_CUDA_COMPRESS_MAX_CHUNK)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--prefill-chunk %d: the CUDA backend compresses "
                          "chunks of 1..%d tokens",
                          o->max_chunk, TG_CUDA_COMPRESS_MAX_CHUNK);
    if (o->max_seqs < 1 || o->splits == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "max_seqs must be >= 1 and a split map given");
    if (m->vocab < 1 || lay->n_layers != m->n_layers ||
        lay->n_kv_heads != Hkv || lay->head_dim != d)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "KV layout does not match the model");
    return 0;
}

static int alloc_runtime(struct gw_cuda *c, int world, char *err,
                         size_t errlen)
{
    const struct gw_model *m = c->model;
    size_t R = (size_t)c->max_rows, H = (size_t)m->hidden;
    size_t qd = (size_t)m->n_q_heads * m->head_dim;
    size_t kd = (size_t)m->n_kv_heads * m->head_dim;
    size_t F = (size_t)m->ffn, LR = (size_t)c->logit_rows;
    size_t C = (size_t)c->opts.max_chunk, Hkv = (size_t)m->n_kv_heads;
    size_t L = (size_t)m->n_layers;
    size_t page_elems = (size_t)kv_layout_page_elems(c->layout);
    DALLOC(c->pool, ((size_t)c->n_pages + 1) * page_elems * 2, "the KV pool");
    DALLOC(c->x, R * H * 4, "activations");
    DALLOC(c->part, R * H * 4, "activations");
    DALLOC(c->h, R * H * 2, "activations");
    DALLOC(c->q, R * qd * 2, "activations");
    DALLOC(c->att, R * qd * 2, "activations");
    DALLOC(c->k, R * kd * 2, "activations");
    DALLOC(c->v, R * kd * 2, "activations");
    DALLOC(c->gu, R * 2 * F * 2, "activations");
    DALLOC(c->mlp, R * F * 2, "activations");
    DALLOC(c->logits, LR * (size_t)c->lm_rows * 4, "logits");
    if (world > 1) {
        DALLOC(c->gathered, (size_t)world * LR * (size_t)c->lm_rows * 4,
               "gathered logits");
        HALLOC(c->p_logits, (size_t)world * LR * (size_t)c->lm_rows * 4,
               "gathered logits");
    }
    DALLOC(c->scores, Hkv * C * 4, "chunk scores");
    DALLOC(c->idx, Hkv * C * 4, "chunk selections");
    DALLOC(c->cmp_ws, c->cmp_ws_bytes, "the scoring workspace");
    if (c->dec_ws_bytes > 0)
        DALLOC(c->dec_ws, c->dec_ws_bytes, "decode split partials");
    DALLOC(c->ids_d, R * 4, "token ids");
    DALLOC(c->pos_d, R * 4, "positions");
    DALLOC(c->tgt_d, R * 4, "targets");
    DALLOC(c->lp_d, GW_CUDA_LP_BLOCK * 4, "log-probabilities");
    DALLOC(c->fault_d, 4, "the fault flag");
    struct gw_cuda_table *tabs[2] = {&c->dec, &c->pre};
    for (int i = 0; i < 2; i++) {
        struct gw_cuda_table *t = tabs[i];
        size_t rb = (size_t)(t->cap_rows + 1) * 4, ib = (size_t)t->cap_ids * 4;
        DALLOC(t->indptr, rb, "a block table");
        DALLOC(t->npages, rb, "a block table");
        DALLOC(t->lens, rb, "a block table");
        DALLOC(t->indices, ib, "a block table");
        HALLOC(t->h_indptr, rb, "a block table");
        HALLOC(t->h_npages, rb, "a block table");
        HALLOC(t->h_lens, rb, "a block table");
        HALLOC(t->h_indices, ib, "a block table");
    }
    DALLOC(c->sc_pos, (size_t)c->dec.cap_rows * 4, "table updates");
    DALLOC(c->sc_val, (size_t)c->dec.cap_rows * 4, "table updates");
    HALLOC(c->h_sc_pos, (size_t)c->dec.cap_rows * 4, "table updates");
    HALLOC(c->h_sc_val, (size_t)c->dec.cap_rows * 4, "table updates");
    c->dec_seqs = calloc((size_t)c->opts.max_seqs, sizeof(*c->dec_seqs));
    c->keep_rows = calloc((size_t)c->layout->n_layers *
                              (size_t)c->layout->n_groups,
                          sizeof(*c->keep_rows));
    if (c->dec_seqs == NULL || c->keep_rows == NULL ||
        kv_table_init(&c->dec_kv, c->dec.cap_rows, 0, err, errlen) != 0 ||
        kv_table_init(&c->pre_kv, c->pre.cap_rows, 0, err, errlen) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
    /* Decode rows count the token the step appends; padding rows of a
     * graph bucket point at the scratch page past the pool. */
    kv_table_set_rows(&c->dec_kv, 1, c->n_pages);
    kv_table_track(&c->dec_kv, 1);
    HALLOC(c->p_ids, R * 4, "token ids");
    HALLOC(c->p_pos, R * 4, "positions");
    HALLOC(c->p_fault, 4, "the fault flag");
    HALLOC(c->p_lp, GW_CUDA_LP_BLOCK * 4, "log-probabilities");
    if (m->rank == 0) {
        size_t S = (size_t)c->opts.max_seqs, K = GW_CUDA_MAX_TOP;
        int rc = tg_cuda_sampler_new(m->vocab, c->opts.max_seqs, &c->sampler,
                                     err, errlen);
        if (rc != 0)
            return rc;
        if (world > 1)
            DALLOC(c->full, LR * (size_t)m->vocab * 4, "unsharded logits");
        size_t PB = GW_CUDA_LP_BLOCK, PK = GW_PROMPT_MAX_TOP;
        DALLOC(c->rank_d, PB * 4, "prompt ranks");
        DALLOC(c->ptop_ids_d, PB * PK * 4, "prompt alternatives");
        DALLOC(c->ptop_lps_d, PB * PK * 4, "prompt alternatives");
        HALLOC(c->p_rank, PB * 4, "prompt ranks");
        HALLOC(c->p_ptop_ids, PB * PK * 4, "prompt alternatives");
        HALLOC(c->p_ptop_lps, PB * PK * 4, "prompt alternatives");
        DALLOC(c->s_tok, S * 4, "sampled tokens");
        DALLOC(c->s_lp, S * 4, "sampled tokens");
        DALLOC(c->s_bad, S * 4, "sampled tokens");
        DALLOC(c->s_bad_val, S * 4, "sampled tokens");
        DALLOC(c->s_top_ids, S * K * 4, "top logprobs");
        DALLOC(c->s_top_lps, S * K * 4, "top logprobs");
        HALLOC(c->p_tok, S * 4, "sampled tokens");
        HALLOC(c->p_slp, S * 4, "sampled tokens");
        HALLOC(c->p_bad, S * 4, "sampled tokens");
        HALLOC(c->p_bad_val, S * 4, "sampled tokens");
        HALLOC(c->p_top_ids, S * K * 4, "top logprobs");
        HALLOC(c->p_top_lps, S * K * 4, "top logprobs");
        DALLOC(c->s_bias_rows, GW_CUDA_MAX_BIAS * 4, "logit bias");
        DALLOC(c->s_bias_ids, GW_CUDA_MAX_BIAS * 4, "logit bias");
        DALLOC(c->s_bias_vals, GW_CUDA_MAX_BIAS * 4, "logit bias");
        HALLOC(c->p_bias_rows, GW_CUDA_MAX_BIAS * 4, "logit bias");
        HALLOC(c->p_bias_ids, GW_CUDA_MAX_BIAS * 4, "logit bias");
        HALLOC(c->p_bias_vals, GW_CUDA_MAX_BIAS * 4, "logit bias");
        c->mask_words = (m->vocab + 31) / 32;
        DALLOC(c->s_mask_rows, S * 4, "token masks");
        DALLOC(c->s_masks, S * (size_t)c->mask_words * 4, "token masks");
        HALLOC(c->p_mask_rows, S * 4, "token masks");
        HALLOC(c->p_masks, S * (size_t)c->mask_words * 4, "token masks");
    }
    /* head maps (L, Hkv) */
    DALLOC(c->head_group, L * Hkv * 4, "head maps");
    DALLOC(c->head_slot, L * Hkv * 4, "head maps");
    GW_CU_TRY(cudaMemcpy(c->head_group, c->layout->head_group, L * Hkv * 4,
                         cudaMemcpyHostToDevice));
    GW_CU_TRY(cudaMemcpy(c->head_slot, c->layout->head_slot, L * Hkv * 4,
                         cudaMemcpyHostToDevice));
    GW_CU_TRY(cudaMemset(c->pool, 0, ((size_t)c->n_pages + 1) * page_elems * 2));
    return gw_cuda__heads_alloc(c, err, errlen);
}

int gw_cuda_init(struct gw_cuda *c, const struct gw_model *model,
                 const struct kv_layout *layout,
                 const struct gw_cuda_opts *opts, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    int rc = check_shape(model, layout, opts, err, errlen);
    if (rc != 0)
        return rc;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        cudaGetLastError();
        return tg_err_set(err, errlen, TG_ENODEV,
                          "--backend cuda: no CUDA device is usable here "
                          "(no NVIDIA driver or no GPU)");
    }
    if (opts->device < 0 || opts->device >= ndev)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "CUDA device %d does not exist (%d present)",
                          opts->device, ndev);
    c->model = model;
    c->layout = layout;
    c->opts = *opts;
    c->opts.splits = NULL; /* not kept: uploaded below */
    GW_CU_TRY(cudaSetDevice(opts->device));
    cudaStream_t st;
    GW_CU_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    c->stream = st;

    int world = model->world > 1 ? model->world : 1;
    int LG = model->n_layers * layout->n_groups;
    c->max_rows = opts->max_chunk > opts->max_seqs ? opts->max_chunk : opts->max_seqs;
    c->logit_rows = opts->max_seqs > GW_CUDA_LP_BLOCK ? opts->max_seqs : GW_CUDA_LP_BLOCK;
    c->lm_rows = lm_rows_padded(model);
    c->dec.cap_rows = (int64_t)opts->max_seqs * LG;
    c->pre.cap_rows = LG;
    int G = model->n_q_heads / model->n_kv_heads;
    c->cmp_ws_bytes = tg_cuda_score_qa_workspace_bytes(
        opts->method, opts->max_chunk, model->n_q_heads, model->n_kv_heads,
        model->head_dim, layout->rule.window);
    if (c->cmp_ws_bytes == 0)
        c->cmp_ws_bytes = 256;

    /* split map: device offsets, and the decode workspace for its max */
    c->splits = calloc(1, sizeof(*c->splits));
    if (c->splits == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
        goto fail;
    }
    rc = tg_cuda_split_map_init(c->splits, opts->splits, model->n_layers,
                                layout->n_groups, err, errlen);
    if (rc != 0)
        goto fail;
    int max_split = 1;
    for (int l = 0; l < model->n_layers; l++)
        if (c->splits->max[l] > max_split)
            max_split = c->splits->max[l];
    c->dec_ws_bytes = tg_cuda_decode_attn_ws_bytes(opts->max_seqs,
                                                   model->n_q_heads,
                                                   model->head_dim, max_split);
    (void)G;

    /* memory plan against what the device has free now */
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        rc = tg_err_set(err, errlen, TG_EDEVICE, "cudaMemGetInfo failed");
        goto fail;
    }
    struct cudaDeviceProp prop;
    char where[320];
    if (cudaGetDeviceProperties(&prop, opts->device) == cudaSuccess)
        snprintf(where, sizeof(where), "GPU %d (%s)", opts->device, prop.name);
    else
        snprintf(where, sizeof(where), "GPU %d", opts->device);
    rc = gw_wslab_init(&c->ws, model, err, errlen); /* the weights' bytes */
    if (rc != 0)
        goto fail;
    size_t page_bytes = (size_t)kv_layout_page_elems(layout) * 2;
    /* the pool's page ids are < the pool: an upper bound of the ids one
     * call's table holds, plus one scratch id per padded row */
    struct gw_mem_need need = {
        .weights = c->ws.bytes,
        .reserve = opts->reserve_bytes > 0 ? opts->reserve_bytes
                                           : ((uint64_t)1 << 30),
        .page_bytes = page_bytes,
    };
    /* activations depend on the tables' id capacity, which depends on the
     * pool: plan with a first bound, then re-plan with the pool's. Ids of
     * one call's rows are distinct pool pages, plus per decode row one
     * scratch id (padding) and GW_CUDA_ROW_SLACK spare slots. */
    c->dec.cap_ids = c->dec.cap_rows * (1 + GW_CUDA_ROW_SLACK);
    c->pre.cap_ids = 1;
    for (int pass = 0; pass < 2; pass++) {
        size_t pinned = 0;
        need.activations = act_bytes(c, world, &pinned) + page_bytes;
        rc = gw_mem_plan(&c->mem, &need, opts->kv_pages, &opts->kv_memory,
                         free_b, total_b, where, err, errlen);
        if (rc != 0)
            goto fail;
        c->dec.cap_ids = c->mem.pages + c->dec.cap_rows * (1 + GW_CUDA_ROW_SLACK);
        c->pre.cap_ids = c->mem.pages;
    }
    c->n_pages = (int32_t)c->mem.pages;

    rc = tg_cuda_gemm_new(0, &c->gemm, err, errlen);
    if (rc == 0)
        rc = upload_weights(c, err, errlen);
    if (rc == 0)
        rc = alloc_runtime(c, world, err, errlen);
    if (rc != 0)
        goto fail;
    c->n_buckets = gw_cuda_buckets(opts->max_seqs, c->bucket,
                                   GW_CUDA_MAX_BUCKETS);
    /* the pool's memset and the uploads ran on the legacy stream, which a
     * non-blocking stream does not wait for */
    if (cudaDeviceSynchronize() != cudaSuccess) {
        rc = tg_err_set(err, errlen, TG_EDEVICE, "cudaDeviceSynchronize: %s",
                        cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    return 0;
fail:
    gw_cuda_free(c);
    return rc;
}

#endif /* TANGRAM_CUDA */
