/* gw_backend_cuda.c — the worker runtime on the CUDA backend: the device
 * forward pass of gw_cuda.h (split map from the occupancy API, §4.6), the
 * NCCL group of a tensor-parallel rank, and decode rows drawn on the
 * device when every draw of the batch can be (gw_backend.h). In a build
 * without CUDA, gw_backend_cuda_new refuses with a clear message. */
#include "gpu_worker/backend/gw_backend.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/profile/pf_split.h"
#include "common/base/tg_log.h"
#include "gpu_worker/cuda/gw_cuda.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/nccl_comm.h"

#define NCCL_KIND "nccl" /* the Hello's comm_kind of CUDA ranks */

struct cuda_backend {
    struct gw_backend base;       /* first: the interface's view */
    struct gw_cuda cu;
    struct tg_nccl *nccl;         /* T > 1, once joined; owned */
    uint8_t nccl_id[TG_NCCL_ID_BYTES]; /* rank 0 of T > 1: the group's */
    int device;
    int lost;                     /* a collective failed */
    /* decode rows drawn on the device by the last decode (rank 0) */
    int dev_first;                /* its first row; -1: none drawn */
    int dev_n;                    /* rows drawn */
    int dev_top;                  /* alternatives per row */
    struct tg_cuda_sample_params *dev_params; /* (max_slots) */
    int32_t *dev_tok;             /* (max_slots) */
    float *dev_lp;                /* (max_slots) */
    int32_t *dev_bad;             /* (max_slots) first non-finite id, -1 */
    float *dev_bad_val;           /* (max_slots) its logit */
    int32_t *dev_top_ids;         /* (max_slots, GW_CUDA_MAX_TOP) */
    float *dev_top_lps;           /* (max_slots, GW_CUDA_MAX_TOP) */
    uint8_t *dev_drawn;           /* (max_slots) by decode row */
    const struct tg_sampling **dev_bias; /* (max_slots) by decode row: the
                                            row's sampling when it has a
                                            logit bias, else NULL */
    const uint32_t **dev_masks; /* (max_slots) by decode row: the draw's
                                     token mask, or NULL */
};

static void cuda_comm_id(const struct gw_backend *b, const uint8_t **id,
                         size_t *len)
{
    const struct cuda_backend *c = (const struct cuda_backend *)b;
    int named = b->cfg.rank == 0 && b->cfg.world_size > 1;
    *id = named ? c->nccl_id : NULL;
    *len = named ? TG_NCCL_ID_BYTES : 0;
}

/* The NCCL group of rank 0's unique id (T > 1; one rank needs no
 * communicator, its collectives are no-ops). */
static int cuda_comm_join(struct gw_backend *b, const struct gw_comm_setup *cs,
                          char *err, size_t errlen)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    const struct gw_backend_cfg *o = &b->cfg;
    if (o->world_size <= 1)
        return 0;
    if (strcmp(cs->kind, NCCL_KIND) != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "CommSetup of kind '%.32s': the CUDA backend joins "
                          "'%s' groups", cs->kind, NCCL_KIND);
    if (cs->id_len != TG_NCCL_ID_BYTES)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "CommSetup: a %zu-byte comm id is not an NCCL "
                          "unique id (%d bytes)", cs->id_len,
                          TG_NCCL_ID_BYTES);
    int rc = tg_nccl_init(&c->nccl, cs->id, o->rank, o->world_size, c->device,
                          o->comm_timeout_ms > 0 ? o->comm_timeout_ms
                                                 : GW_BACKEND_COMM_TIMEOUT_MS,
                          err, errlen);
    if (rc == 0)
        c->cu.opts.nccl = c->nccl;
    return rc;
}

static int cuda_comm_failed(struct gw_backend *b)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    /* NCCL's errors are sticky in tg_nccl: a failed communicator means
     * the same as a failed shared-memory group. */
    if (c->nccl != NULL && tg_nccl_check(c->nccl, NULL, 0) != 0)
        c->lost = 1;
    return c->lost;
}

static int cuda_prefill(struct gw_backend *b, struct gw_seq *seq,
                        const int32_t *ids, int n,
                        const struct gw_prefill_out *out, char *err,
                        size_t errlen)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    int rc = gw_cuda_prefill(&c->cu, seq, ids, n, out, err, errlen);
    if (rc == TG_ETIMEDOUT)
        c->lost = 1;
    return rc;
}

/* The CUDA sampler's block for one row, the one place it is built from
 * the sampling value: the filters and temperature (penalties and bias are
 * applied apart, device_draws and dev_bias), the request's seed as the
 * Philox key and the index of the token drawn as its subsequence. */
static struct tg_cuda_sample_params device_params(const struct tg_sampling *sp,
                                                  uint64_t index)
{
    return (struct tg_cuda_sample_params){.temperature = sp->temperature,
                                          .top_k = sp->top_k,
                                          .top_p = sp->top_p,
                                          .min_p = sp->min_p,
                                          .seed = sp->seed,
                                          .step = index};
}

/* Rank 0 draws a decode batch on the device when every draw can be: no
 * penalties, at most GW_CUDA_MAX_TOP alternatives, at most
 * GW_CUDA_MAX_BIAS logit-bias entries in all; then its (n, V) logits never
 * cross to the host. */
static int device_draws(const struct cuda_backend *c, const struct gw_draw *d,
                        int n_draws)
{
    if (c->base.cfg.rank != 0 || c->cu.sampler == NULL || n_draws <= 0)
        return 0;
    int64_t n_bias = 0;
    for (int i = 0; i < n_draws; i++) {
        const struct tg_sampling *sp = d[i].sampling;
        if (sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f ||
            sp->frequency_penalty != 0.0f || sp->n_top > GW_CUDA_MAX_TOP)
            return 0;
        n_bias += sp->n_bias > 0 ? sp->n_bias : 0;
    }
    return n_bias <= GW_CUDA_MAX_BIAS;
}

static int cuda_decode(struct gw_backend *b, struct gw_seq *const *seqs,
                       const int32_t *ids, int n, int first_row, float *logits,
                       const struct gw_draw *draws, int n_draws, char *err,
                       size_t errlen)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    int dev = first_row >= 0 && device_draws(c, draws, n_draws);
    c->dev_first = -1;
    /* Without a host row the logits stay on the device for the draws. */
    int rc = gw_cuda_decode(&c->cu, seqs, ids, n, first_row >= 0,
                            dev ? NULL : logits, err, errlen);
    if (rc == TG_ETIMEDOUT)
        c->lost = 1;
    if (rc != 0 || !dev)
        return rc;
    /* Every decode row is drawn (rows nobody asks for greedily); the
     * asked ones are handed out by cuda_sample. */
    int top = 0;
    memset(c->dev_drawn, 0, (size_t)n);
    memset(c->dev_bias, 0, (size_t)n * sizeof(*c->dev_bias));
    const struct tg_sampling off = TG_SAMPLING_OFF;
    memset(c->dev_masks, 0, (size_t)n * sizeof(*c->dev_masks));
    for (int i = 0; i < n; i++)
        c->dev_params[i] = device_params(&off, 0);
    for (int i = 0; i < n_draws; i++) {
        int r = draws[i].row - first_row;
        if (r < 0 || r >= n)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "draw for row %d outside the decode rows",
                              draws[i].row);
        const struct tg_sampling *sp = draws[i].sampling;
        c->dev_params[r] = device_params(sp, draws[i].index);
        c->dev_drawn[r] = 1;
        if (sp->n_bias > 0)
            c->dev_bias[r] = sp;
        c->dev_masks[r] = draws[i].mask;
        if (sp->n_top > top)
            top = sp->n_top;
    }
    rc = gw_cuda_sample(&c->cu, n, c->dev_params, c->dev_bias, c->dev_masks,
                        top, c->dev_tok, c->dev_lp, c->dev_top_ids,
                        c->dev_top_lps, c->dev_bad, c->dev_bad_val, err,
                        errlen);
    if (rc != 0)
        return rc;
    c->dev_first = first_row;
    c->dev_n = n;
    c->dev_top = top;
    return 0;
}

static int cuda_sample(struct gw_backend *b, const struct gw_draw *d,
                       struct gw_token *out, int32_t *top_ids, float *top_lps,
                       char *err, size_t errlen)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    int r = d->row - c->dev_first;
    if (c->dev_first < 0 || r < 0 || r >= c->dev_n || !c->dev_drawn[r])
        return gw_backend__host_sample(b, d, out, top_ids, top_lps, err,
                                       errlen);
    c->dev_drawn[r] = 0; /* handed out once */
    if (c->dev_bad[r] >= 0)
        return gw_backend__nonfinite(d->slot, c->dev_bad[r],
                                     c->dev_bad_val[r], err, errlen);
    int K = d->sampling->n_top;
    for (int k = 0; k < K; k++) {
        top_ids[k] = c->dev_top_ids[(size_t)r * c->dev_top + k];
        top_lps[k] = c->dev_top_lps[(size_t)r * c->dev_top + k];
    }
    out->slot = d->slot;
    out->token = c->dev_tok[r];
    out->logprob = c->dev_lp[r];
    out->n_top = K;
    out->top_ids = top_ids;
    out->top_lps = top_lps;
    return 0;
}

static int cuda_copy_pages(struct gw_backend *b, const int32_t *src,
                           const int32_t *dst, int n, char *err,
                           size_t errlen)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    return gw_cuda_copy_pages(&c->cu, src, dst, n, err, errlen);
}

static int cuda_compact(struct gw_backend *b, const struct gw_trig_cfg *tc,
                        struct gw_seq *const *seqs, int n, int64_t *heads,
                        char *err, size_t errlen)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    return gw_cuda_compact(&c->cu, tc, seqs, n, heads, err, errlen);
}

static int cuda_tier_alloc(struct gw_backend *b, size_t bytes, void **base,
                           char *err, size_t errlen)
{
    return gw_cuda_tier_alloc(&((struct cuda_backend *)b)->cu, bytes, base,
                              err, errlen);
}

static void cuda_tier_release(struct gw_backend *b, void *base)
{
    gw_cuda_tier_release(&((struct cuda_backend *)b)->cu, base);
}

static int cuda_tier_fence(struct gw_backend *b, void **fence, char *err,
                           size_t errlen)
{
    return gw_cuda_tier_fence(&((struct cuda_backend *)b)->cu, fence, err,
                              errlen);
}

static void cuda_tier_fence_drop(struct gw_backend *b, void *fence)
{
    gw_cuda_tier_fence_drop(&((struct cuda_backend *)b)->cu, fence);
}

static int cuda_tier_copy(struct gw_backend *b, void *base, int to_host,
                          const int32_t *dev, const int32_t *host, int n,
                          void *fence, char *err, size_t errlen)
{
    return gw_cuda_tier_copy(&((struct cuda_backend *)b)->cu, base, to_host,
                             dev, host, n, fence, err, errlen);
}

static void cuda_free(struct gw_backend *b)
{
    struct cuda_backend *c = (struct cuda_backend *)b;
    /* a group that lost a peer is aborted first, or freeing the runtime
     * would wait for NCCL kernels that never finish */
    if (c->lost && c->nccl != NULL)
        tg_nccl_abort(c->nccl);
    gw_cuda_free(&c->cu);
    tg_nccl_free(c->nccl);
    free(c->dev_params);
    free(c->dev_tok);
    free(c->dev_lp);
    free(c->dev_bad);
    free(c->dev_bad_val);
    free(c->dev_top_ids);
    free(c->dev_top_lps);
    free(c->dev_drawn);
    free(c->dev_bias);
    free(c->dev_masks);
    gw_backend__base_free(b);
    free(c);
}

static const struct gw_backend_ops cuda_ops = {
    .name = "cuda",
    .comm_kind = NCCL_KIND,
    .comm_id = cuda_comm_id,
    .comm_join = cuda_comm_join,
    .comm_failed = cuda_comm_failed,
    .prefill = cuda_prefill,
    .decode = cuda_decode,
    .sample = cuda_sample,
    .copy_pages = cuda_copy_pages,
    .compact = cuda_compact,
    .tier_alloc = cuda_tier_alloc,
    .tier_release = cuda_tier_release,
    .tier_fence = cuda_tier_fence,
    .tier_fence_drop = cuda_tier_fence_drop,
    .tier_copy = cuda_tier_copy,
    .free = cuda_free,
};

/* Device choice, the split map from the occupancy API's N_CTA and the
 * rank's profile (pf_split_map, §4.6), then gw_cuda_init, which plans the
 * device memory (weights, activations, pool from kv_pages / kv_memory) and
 * fails with the numbers when it does not fit. Rank 0 of T > 1 also draws
 * the NCCL unique id it announces in its Hello. */
static int cuda_setup(struct cuda_backend *c, char *err, size_t errlen)
{
    const struct gw_backend_cfg *o = &c->base.cfg;
    const struct gw_model *m = o->model;
    int ndev = 0, rc;
    if (tg_cuda_device_count(&ndev) != 0 || ndev < 1)
        return tg_err_set(err, errlen, TG_ENODEV,
                          "--backend cuda: no CUDA device is usable here (no "
                          "NVIDIA driver or no GPU); use --backend cpu");
    c->device = o->device >= 0 ? o->device : o->rank;
    if (c->device >= ndev)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank %d would use CUDA device %d, but %d are "
                          "visible; give --device or set "
                          "CUDA_VISIBLE_DEVICES", o->rank, c->device, ndev);
    if (cudaSetDevice(c->device) != cudaSuccess)
        return tg_err_set(err, errlen, TG_EDEVICE, "cannot use CUDA device %d",
                          c->device);
    int n_cta = 0;
    rc = tg_cuda_decode_attn_n_cta(m->n_q_heads / m->n_kv_heads, m->head_dim,
                                   &n_cta);
    if (rc == TG_EINVAL)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports head_dim 64 and 128 with "
                          "1..16 query heads per KV head (the model has "
                          "head_dim %d, %d per KV head)", m->head_dim,
                          m->n_q_heads / m->n_kv_heads);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "cannot size decode attention on "
                          "CUDA device %d", c->device);
    int rows = o->layout->n_layers * o->layout->n_groups;
    int *splits = malloc((size_t)rows * sizeof(int));
    if (splits == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    rc = pf_split_map(o->profile, n_cta, splits, err, errlen);
    if (rc == 0) {
        struct gw_cuda_opts co = {
            .device = c->device, .method = o->method,
            .max_chunk = o->layout->prefill_chunk,
            .max_seqs = o->max_slots,
            .kv_pages = o->kv_pages, .kv_memory = o->kv_memory,
            .graphs = o->cuda_graphs, .splits = splits,
            .step_timeout_ms = o->step_timeout_ms,
            .per_head = gw_method_per_head(o->method) || o->trig != NULL,
            .gvote = o->gvote, .host_ops = &tg_ops_cpu,
            .host_be = c->base.host, .trig = o->trig,
            .on_scores = o->on_scores, .on_scores_ud = o->on_scores_ud,
            .on_queries = o->on_queries, .on_queries_ud = o->on_queries_ud,
        };
        rc = gw_cuda_init(&c->cu, m, o->layout, &co, err, errlen);
    }
    free(splits);
    if (rc != 0)
        return rc;
    c->cu.n_cta = n_cta;
    c->base.load = c->cu.load;
    const struct gw_mem_plan *mp = &c->cu.mem;
    log_info("CUDA memory plan on device %d: %llu MiB in all, a KV pool of "
             "%lld pages (%llu MiB) included; %llu MiB left free", c->device,
             (unsigned long long)(mp->total_bytes >> 20), (long long)mp->pages,
             (unsigned long long)(mp->pool_bytes >> 20),
             (unsigned long long)(mp->free_after >> 20));
    c->base.n_pages = c->cu.n_pages;
    c->base.page_bytes = kv_layout_page_elems(o->layout) * 2; /* bf16 */
    if (o->rank == 0) {
        size_t S = (size_t)o->max_slots, K = GW_CUDA_MAX_TOP;
        c->dev_params = calloc(S, sizeof(*c->dev_params));
        c->dev_tok = calloc(S, sizeof(int32_t));
        c->dev_lp = calloc(S, sizeof(float));
        c->dev_bad = calloc(S, sizeof(int32_t));
        c->dev_bad_val = calloc(S, sizeof(float));
        c->dev_top_ids = calloc(S * K, sizeof(int32_t));
        c->dev_top_lps = calloc(S * K, sizeof(float));
        c->dev_drawn = calloc(S, 1);
        c->dev_bias = calloc(S, sizeof(*c->dev_bias));
        c->dev_masks = calloc(S, sizeof(*c->dev_masks));
        if (!c->dev_params || !c->dev_tok || !c->dev_lp || !c->dev_bad ||
            !c->dev_bad_val || !c->dev_top_ids || !c->dev_top_lps ||
            !c->dev_drawn || !c->dev_bias || !c->dev_masks)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (o->rank == 0 && o->world_size > 1)
        return tg_nccl_unique_id(c->nccl_id, err, errlen);
    return 0;
}

int gw_backend_cuda_new(const struct gw_backend_cfg *cfg,
                        struct gw_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    struct cuda_backend *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    c->base.ops = &cuda_ops;
    c->dev_first = -1;
    int rc = gw_backend__base_init(&c->base, cfg, err, errlen);
    if (rc == 0)
        rc = cuda_setup(c, err, errlen);
    if (rc != 0) {
        cuda_free(&c->base);
        return rc;
    }
    *out = &c->base;
    return 0;
}

#else /* no CUDA in this build */

int gw_backend_cuda_new(const struct gw_backend_cfg *cfg,
                        struct gw_backend **out, char *err, size_t errlen)
{
    (void)cfg;
    *out = NULL;
    return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                      "--backend cuda: this build has no CUDA backend "
                      "(TANGRAM_CUDA not built); use --backend cpu");
}

#endif
