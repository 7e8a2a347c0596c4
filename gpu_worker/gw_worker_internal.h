/*
 * gw_worker_internal.h — the CUDA backend's part of a worker
 * (gw_worker_cuda.c), used by gw_worker.c. Not a public API; the owner
 * thread of the worker calls these.
 */
#ifndef GW_WORKER_INTERNAL_H
#define GW_WORKER_INTERNAL_H

#include "gpu_worker/gw_worker.h"

/* Sets up the CUDA backend of w (w->model, profile, layout, rows and
 * max_slots are loaded): device choice, split map from the occupancy
 * API's N_CTA (pf_split_map, §4.6), gw_cuda_init (memory plan, weights,
 * pool), the host sampler's CPU backend, the device sampling buffers of
 * rank 0, and rank 0's NCCL unique id when T > 1. Returns 0 or an error
 * with the reason (TG_ENODEV without a device, TG_EUNSUPPORTED for a
 * shape the kernels lack or a build without CUDA, TG_ENOMEM naming the
 * memory plan). */
int gw__worker_cuda_init(struct gw_worker *w, const struct gw_worker_opts *o,
                         char *err, size_t errlen);

/* Joins the NCCL group of a CommSetup (kind "nccl", 128-byte id; nothing
 * to join with one rank) and hands the communicator to the runtime. */
int gw__worker_join_nccl(struct gw_worker *w, const GwCommSetup *cs,
                         const char *kind, char *err, size_t errlen);

/* Checks the sampling parameters of the entry in `slot` as the sampler
 * will use them: temperature >= 0 and finite, top_p in (0, 1], min_p in
 * [0, 1], repetition_penalty > 0 and finite, presence and frequency
 * penalties finite, logprobs at most min(vocab, GW_WORKER_MAX_LOGPROBS).
 * NULL is the defaults. Returns 0 or TG_EINVAL naming the values. */
int gw__worker_check_sampling(const Tangram__Worker__V1__WorkerSampling *sp,
                              int vocab, char *err, size_t errlen,
                              uint32_t slot);

/* Whether rank 0 of the CUDA backend can sample this plan's decode rows
 * on the device: no decode entry that samples asks for penalties or more
 * than GW_CUDA_MAX_TOP top logprobs or has parameters
 * gw__worker_check_sampling refuses (those fail alone on the host path).
 * 0 on the CPU backend. */
int gw__worker_dev_sample_ok(const struct gw_worker *w,
                             const GwBatchPlan *plan);

/* After a decode kept its logits on the device: draws every decode row
 * (in plan order) with gw_cuda_sample, keyed by the request's seed and
 * the index of the token drawn (as sample_entry counts it), and keeps the
 * results for gw__worker_presampled. Returns 0 or the sampler's error. */
int gw__worker_dev_sample(struct gw_worker *w, const GwBatchPlan *plan,
                          char *err, size_t errlen);

/* Fills *out (and top_ids/top_lps, GW_WORKER_MAX_LOGPROBS each) with the
 * device draw of entry e of this plan and returns 1, or returns 0 when e
 * was not drawn on the device (the caller samples it on the host). */
int gw__worker_presampled(struct gw_worker *w, const GwBatchPlan *plan,
                          const GwPlanEntry *e, GwSampledToken *out,
                          uint32_t *top_ids, float *top_lps);

#endif /* GW_WORKER_INTERNAL_H */
