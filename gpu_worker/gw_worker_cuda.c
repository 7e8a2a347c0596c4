/* gw_worker_cuda.c — the CUDA backend's part of a worker: set-up, the
 * NCCL join, and sampling decode rows on the device (see
 * gw_worker_internal.h). */
#if __has_include("worker.pb-c.h")
/* Like gw_worker.c: compiled only with the generated protocol headers. */
#include "gpu_worker/gw_worker_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"

#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/pf_split.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/nccl_comm.h"
_Static_assert(GW_NCCL_ID_BYTES == TG_NCCL_ID_BYTES, "NCCL unique id size");
#endif

#define ENTRY_DECODE TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE

/* The CUDA backend: the split map from the occupancy API's N_CTA and the
 * rank's profile (pf_split_map, §4.6), then gw_cuda_init, which plans the
 * device memory (weights, activations, pool from kv_pages / kv_memory) and
 * fails with the numbers when it does not fit. Rank 0 of T > 1 also draws
 * the NCCL unique id it announces in its Hello. */
int gw__worker_cuda_init(struct gw_worker *w, const struct gw_worker_opts *o,
                         char *err, size_t errlen)
{
#ifdef TANGRAM_CUDA
    int ndev = 0, rc;
    if (tg_cuda_device_count(&ndev) != 0 || ndev < 1)
        return tg_err_set(err, errlen, TG_ENODEV,
                          "--backend cuda: no CUDA device is usable here (no "
                          "NVIDIA driver or no GPU); use --backend cpu");
    w->device = o->device >= 0 ? o->device : o->rank;
    if (w->device >= ndev)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank %d would use CUDA device %d, but %d are "
                          "visible; give --device or set "
                          "CUDA_VISIBLE_DEVICES", o->rank, w->device, ndev);
    int n_cta = 0;
    if (cudaSetDevice(w->device) != cudaSuccess)
        return tg_err_set(err, errlen, TG_EDEVICE, "cannot use CUDA device %d",
                          w->device);
    rc = tg_cuda_decode_attn_n_cta(w->model.n_q_heads / w->model.n_kv_heads,
                                   w->model.head_dim, &n_cta);
    if (rc == TG_EINVAL)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports head_dim 64 and 128 with "
                          "1..16 query heads per KV head (the model has "
                          "head_dim %d, %d per KV head)", w->model.head_dim,
                          w->model.n_q_heads / w->model.n_kv_heads);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "cannot size decode attention on "
                          "CUDA device %d", w->device);
    int *splits = malloc((size_t)w->rows * sizeof(int));
    if (splits == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    rc = pf_split_map(&w->profile, n_cta, splits, err, errlen);
    if (rc == 0) {
        struct gw_cuda_opts co = {
            .device = w->device, .method = w->method,
            .max_chunk = o->prefill_chunk, .max_seqs = o->max_slots,
            .kv_pages = o->kv_pages, .kv_memory = o->kv_memory,
            .graphs = o->cuda_graphs, .splits = splits,
            .step_timeout_ms = o->step_timeout_ms,
        };
        rc = gw_cuda_init(&w->cu, &w->model, &w->layout, &co, err, errlen);
    }
    free(splits);
    if (rc != 0)
        return rc;
    w->cu.n_cta = n_cta;
    w->n_pages = w->cu.n_pages;
    /* Sampling stays on the host (gw_cuda.h): rank 0's sample_entry runs
     * tg_ops_cpu.sample, which needs a CPU backend for its scratch. */
    rc = tg_backend_cpu_new(o->n_threads, &w->be);
    if (rc != 0)
        return tg_err_set(err, errlen, rc,
                          "cannot create the host sampler's CPU backend");
    if (o->rank == 0) {
        size_t S = (size_t)w->max_slots, K = GW_CUDA_MAX_TOP;
        w->pre_mark = calloc(S, sizeof(uint64_t));
        w->pre_row = calloc(S, sizeof(int32_t));
        w->pre_tok = calloc(S, sizeof(int32_t));
        w->pre_lp = calloc(S, sizeof(float));
        w->pre_top_ids = calloc(S * K, sizeof(int32_t));
        w->pre_top_lps = calloc(S * K, sizeof(float));
        w->dev_params = calloc(S, sizeof(*w->dev_params));
        if (!w->pre_mark || !w->pre_row || !w->pre_tok || !w->pre_lp ||
            !w->pre_top_ids || !w->pre_top_lps || !w->dev_params)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (o->rank == 0 && o->world_size > 1)
        rc = tg_nccl_unique_id(w->nccl_id, err, errlen);
    return rc;
#else
    (void)w;
    (void)o;
    return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                      "--backend cuda: this build has no CUDA backend");
#endif
}

/* A CommSetup for the CUDA backend: the NCCL group of rank 0's unique id
 * (T > 1; one rank needs no communicator, its collectives are no-ops). */
int gw__worker_join_nccl(struct gw_worker *w, const GwCommSetup *cs,
                         const char *kind, char *err, size_t errlen)
{
    if (w->world_size <= 1)
        return 0;
    if (strcmp(kind, GW_NCCL_KIND) != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "CommSetup of kind '%.32s': the CUDA backend joins "
                          "'%s' groups", kind, GW_NCCL_KIND);
    if (cs->comm_id.len != GW_NCCL_ID_BYTES)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "CommSetup: a %zu-byte comm id is not an NCCL "
                          "unique id (%d bytes)", cs->comm_id.len,
                          GW_NCCL_ID_BYTES);
#ifdef TANGRAM_CUDA
    int rc = tg_nccl_init(&w->nccl, cs->comm_id.data, w->rank, w->world_size,
                          w->device, w->comm_timeout_ms > 0
                                         ? w->comm_timeout_ms
                                         : GW_COMM_DEFAULT_TIMEOUT_MS,
                          err, errlen);
    if (rc == 0)
        w->cu.opts.nccl = w->nccl;
    return rc;
#else
    return tg_err_set(err, errlen, TG_EUNSUPPORTED, "no CUDA in this build");
#endif
}

/* ---- sampling decode rows on the device ------------------------------- */

int gw__worker_dev_sample_ok(const struct gw_worker *w,
                             const GwBatchPlan *plan)
{
#ifdef TANGRAM_CUDA
    if (w->backend != GW_WORKER_BACKEND_CUDA || w->rank != 0 ||
        w->cu.sampler == NULL || w->dev_params == NULL)
        return 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        const Tangram__Worker__V1__WorkerSampling *ws = e->sampling;
        if (e->kind != ENTRY_DECODE || !e->sample || ws == NULL)
            continue;
        if (ws->repetition_penalty != 1.0f || ws->presence_penalty != 0.0f ||
            ws->frequency_penalty != 0.0f || ws->logprobs > GW_CUDA_MAX_TOP ||
            gw__worker_check_sampling(ws, w->model.vocab, NULL, 0,
                                      e->slot) != 0)
            return 0;
    }
    return 1;
#else
    (void)w;
    (void)plan;
    return 0;
#endif
}

int gw__worker_dev_sample(struct gw_worker *w, const GwBatchPlan *plan,
                          char *err, size_t errlen)
{
#ifdef TANGRAM_CUDA
    int n = 0, top = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        if (e->kind != ENTRY_DECODE)
            continue;
        const Tangram__Worker__V1__WorkerSampling *ws = e->sampling;
        struct gw_wslot *sl = &w->slots[e->slot];
        /* the index of the token drawn, as sample_entry counts it */
        int64_t np = sl->num_prompt;
        sl->n_sampled = sl->pos > np ? sl->pos - np : 0;
        struct tg_cuda_sample_params p = {
            .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
            .seed = e->seed, .step = (uint64_t)sl->n_sampled,
        };
        if (ws != NULL && e->sample) {
            p.temperature = ws->temperature;
            p.top_k = ws->top_k;
            p.top_p = ws->top_p;
            p.min_p = ws->min_p;
            if ((int)ws->logprobs > top)
                top = (int)ws->logprobs;
        }
        w->dev_params[n] = p;
        w->pre_row[e->slot] = n;
        w->pre_mark[e->slot] = e->sample ? plan->step_id : 0;
        n++;
    }
    w->pre_top = top;
    int rc = gw_cuda_sample(&w->cu, n, w->dev_params, top, w->pre_tok,
                            w->pre_lp, w->pre_top_ids, w->pre_top_lps, err,
                            errlen);
    if (rc != 0)
        for (int i = 0; i < w->max_slots; i++)
            w->pre_mark[i] = 0;
    return rc;
#else
    (void)w;
    (void)plan;
    return tg_err_set(err, errlen, TG_EUNSUPPORTED, "no CUDA in this build");
#endif
}

int gw__worker_presampled(struct gw_worker *w, const GwBatchPlan *plan,
                          const GwPlanEntry *e, GwSampledToken *out,
                          uint32_t *top_ids, float *top_lps)
{
    if (w->pre_mark == NULL || e->kind != ENTRY_DECODE ||
        w->pre_mark[e->slot] != plan->step_id)
        return 0;
    w->pre_mark[e->slot] = 0;
    int r = w->pre_row[e->slot], top = w->pre_top;
    int K = e->sampling != NULL ? (int)e->sampling->logprobs : 0;
    if (K > top)
        K = top; /* cannot happen: top is the largest K of the plan */
    for (int k = 0; k < K; k++) {
        top_ids[k] = (uint32_t)w->pre_top_ids[(size_t)r * top + k];
        top_lps[k] = w->pre_top_lps[(size_t)r * top + k];
    }
    GwSampledToken init = TANGRAM__WORKER__V1__SAMPLED_TOKEN__INIT;
    *out = init;
    out->slot = e->slot;
    out->token_id = (uint32_t)w->pre_tok[r];
    out->logprob = w->pre_lp[r];
    out->n_top_ids = (size_t)K;
    out->top_ids = K > 0 ? top_ids : NULL;
    out->n_top_logprobs = (size_t)K;
    out->top_logprobs = K > 0 ? top_lps : NULL;
    return 1;
}

#endif /* worker.pb-c.h */
