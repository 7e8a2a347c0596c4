/*
 * gw_engine.h — in-process generation: one model, one backend, one KV pool
 * and the page accounting of a single rank in one object. Used by
 * tangram-generate and tangram-profile calibrate (no daemon, no IPC).
 *
 * The engine is a router and a one-slot worker in one process: a
 * sequence's pages are reserved exactly at admission (kv_seq, §4.3) in the
 * engine's pool, and the worker's step loop (gpu_worker/step/gw_step.h,
 * the code that runs the daemon's plans) fills them chunk by chunk
 * through the backend (gw_backend.h: the CPU forward pass or the CUDA
 * runtime): every prefill chunk and every decode token is a one-entry
 * plan of slot 0, whose rows mirror the accounting (a pool-less kv_seq,
 * as a worker keeps), brought up to date after every reservation,
 * release and compaction as a router's page deltas bring a worker's.
 * After every step it checks that the physical fill equals the accounting
 * (they are computed by different code, so this catches drift). The
 * arguments of gw_engine_generate are the in-process trust boundary:
 * its sampling gets the one check there (tg_sampling_check).
 * Single-threaded use per engine.
 */
#ifndef GW_ENGINE_H
#define GW_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_pool.h"
#include "common/profile/pf_profile.h"
#include "gpu_worker/backend/gw_backend.h"
#include "gpu_worker/model/gw_seq.h"
#include "gpu_worker/step/gw_step.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/model/gw_rank.h"

struct gw_engine_opts {
    const char *model_dir;     /* Hugging Face model directory */
    const char *profile_path;  /* profile JSON; NULL or "none" = full KV */
    int profile_force;         /* use a profile made for another model
                                  (pf_profile_check_model) with a warning */
    int heads_per_group;       /* H_p when there is no profile */
    int page_size;             /* P tokens */
    int prefill_chunk;         /* C tokens */
    const char *method;        /* NULL: the profile's (snapkv for none) */
    const struct gw_gvote_params *gvote; /* method gvote: NULL for the
                                            defaults of §4.8 */
    int64_t max_context;       /* tokens one sequence may reach (pool size) */
    int n_threads;             /* <= 0: OpenMP default */
    gw_on_scores_fn on_scores; /* optional, see gw_seq.h; scores are
                                  in the rank profile's head order, which
                                  is the model's for a profile-less run */
    void *on_scores_ud;
    const struct gw_trig_opts *trig; /* decode-time compression (§4.9);
                                        NULL or !enabled: none */
    const char *trig_stats_path; /* profile file whose "trig" statistics
                                    score decode keys; NULL: the profile's
                                    own (a profile-less run needs one) */
    gw_on_queries_fn on_queries; /* optional, see gw_seq.h (model head
                                    order for a profile-less run) */
    void *on_queries_ud;
    int world_size;               /* T; <= 1: one rank (all it runs) */
    enum gw_backend_kind backend; /* GW_BACKEND_CPU (the zero value) or
                                     GW_BACKEND_CUDA: the runtime the
                                     forward pass runs on */
    int device;                /* CUDA device ordinal (< 0: 0) */
    enum gw_weights weights;   /* CPU backend: the host weights' format
                                  (gw_model.h; AUTO when 0) */
};

struct gw_engine {
    struct gw_model model;
    struct pf_profile profile;
    struct kv_layout layout;
    enum gw_backend_kind backend;
    struct gw_backend *bk;     /* owned: the forward pass and its KV pool
                                  (exactly the pages of `pool`), one slot,
                                  logits row 0 */
    struct kv_pool pool;       /* the accounting's page ids */
    int64_t max_context;
    enum tg_score_method method;
    int *global_head;          /* (L, Hkv) model KV head of each of the
                                  rank's heads (which are in group order) */
    struct gw_trig_cfg trig;   /* decode-time compression; cap NULL: off */
    struct pf_trig trig_stats; /* statistics from trig_stats_path, rank
                                  order (else the profile's are used) */
    struct gw_step step;       /* the step loop of a one-slot worker
                                  (gw_step.h); slot 0 mirrors the
                                  accounting of the generation running */
};

/* Loads the model and profile, checks they match, sizes the KV pool for
 * one sequence of max_context tokens and creates the backend of
 * o->backend over it (gw_backend_new: a CUDA backend refuses with
 * TG_ENODEV where no device is usable, TG_EUNSUPPORTED in a build without
 * CUDA or for a shape its kernels lack, each naming the fix). With
 * o->trig enabled it checks the options and the statistics and computes
 * the caps (gw_trig_cfg_init, a clear TG_EINVAL when the statistics are
 * missing). In-process generation runs one rank: o->world_size > 1 is
 * TG_EINVAL. Returns 0 or an error naming the problem (file, field,
 * sizes); on failure *e is left freed. */
int gw_engine_init(struct gw_engine *e, const struct gw_engine_opts *o,
                   char *err, size_t errlen);

/* Frees everything; safe on a zeroed or half-built engine. */
void gw_engine_free(struct gw_engine *e);

enum gw_finish {
    GW_FINISH_LENGTH = 0, /* max_tokens reached */
    GW_FINISH_STOP = 1,   /* an eos or stop id was sampled */
};

struct gw_gen_params {
    int max_tokens;            /* >= 0 */
    struct tg_sampling sampling; /* its seed and n_top (top-K logprobs
                                    per generated token) included */
    int prompt_logprobs;       /* compute log P(prompt[p] | prompt[<p]) */
    int prompt_top;            /* with prompt_logprobs, 0 .. GW_PROMPT_MAX_TOP;
                                  > 0: also every position's rank and
                                  that many alternatives (the worker's
                                  prompt_lp path, as the API asks it) */
    gw_logits_row_fn prompt_rows; /* with prompt_logprobs, optional: shown
                                  the raw logits row (vocab floats) that
                                  predicts each prompt position >=
                                  prompt_rows_from, in order, as the
                                  prefill computes it (on CUDA each such
                                  block comes to the host) */
    void *prompt_rows_ud;
    int prompt_rows_from;
    int ignore_eos;            /* do not stop at the model's eos ids */
    const int32_t *stop_ids;   /* extra stop ids (borrowed) */
    int n_stop;
    const int32_t *forced_ids; /* teacher-forced decode (borrowed): id t
                                  takes the place of sampled token t, no
                                  stop; needs max_tokens == n_forced */
    int n_forced;
    int dump_kept;             /* fill kept_pos / kept_n at the end (the
                                  CPU backend records positions; others:
                                  TG_EUNSUPPORTED) */
    int head_counts;           /* fill kept_n alone (every backend) */
};

struct gw_gen_result {
    int32_t *tokens;     /* (n_tokens) generated ids, a final eos included */
    float *lps;          /* (n_tokens) log-probability of each */
    int32_t *top_ids;    /* (n_tokens, n_top) */
    float *top_lps;      /* (n_tokens, n_top) */
    int n_tokens, n_top;
    float *prompt_lp;    /* (n_prompt) [0] is NaN; NULL unless asked */
    int32_t *prompt_rank;    /* (n_prompt) with prompt_top: 1 + the ids more
                             likely than prompt[p] there ([0] is 0) */
    int32_t *prompt_top_ids; /* (n_prompt, prompt_n_top) most likely
                                first; row 0 unused */
    float *prompt_top_lps;   /* likewise */
    int prompt_n_top;
    int n_prompt;
    enum gw_finish finish;
    int32_t *kept;       /* (L, G) prompt tokens held per row after prefill */
    int64_t pages_used;  /* pages the sequence held at the end */
    int64_t mono_pages;  /* pages an all-heads layout would hold */
    int64_t pages_released; /* pages gvote gave back after its chunks */
    int64_t pages_peak;  /* most pages the sequence held at once */
    int64_t decode_pages_released; /* pages decode-time compression gave
                                      back (§4.9) */
    int64_t decode_triggers;       /* compactions run */
    double prefill_seconds;        /* wall time of the prefill chunks
                                      (the forward pass and the page
                                      accounting after each) */
    double decode_seconds;         /* wall time of the decode forward
                                      steps */
    double compact_seconds;        /* wall time of the compactions (incl.
                                      the page accounting) */
    double prefill_cpu_seconds;    /* CPU time of the process (all its
                                      threads) over the prefill: beside
                                      the wall time, what a loaded
                                      machine does not inflate by
                                      descheduling */
    double decode_cpu_seconds;     /* the same over the decode steps
                                      (compactions included) */
    float *forced_lps;   /* (n_forced) log P(forced id t | all before) */
    int32_t *kept_n;     /* (L, Hkv) model head order: positions held at
                            the end (dump_kept, head_counts) */
    int32_t *kept_pos;   /* (L, Hkv, kept_cap) their sorted absolute
                            positions */
    int32_t kept_cap;
};

/* Generates for `prompt` (n_prompt >= 1 ids). Fills *res (caller frees
 * with gw_gen_result_free, also after a failure). Returns 0, TG_EINVAL
 * (bad ids, n_prompt + max_tokens > max_context, a sampling value
 * tg_sampling_check refuses: its message names the parameter),
 * TG_EUNSUPPORTED (dump_kept off the CPU backend), TG_ENOSPC, or a
 * backend error; the sequence's pages are back in the pool in every case.
 * Draws are the step loop's (gw_step.h: the request's RNG stream keyed by
 * seed and token index), so the CPU backend draws what a worker draws for
 * the same request. */
int gw_engine_generate(struct gw_engine *e, const int32_t *prompt,
                       int n_prompt, const struct gw_gen_params *p,
                       struct gw_gen_result *res, char *err, size_t errlen);

void gw_gen_result_free(struct gw_gen_result *r);

#endif /* GW_ENGINE_H */
