/*
 * gw_calibrate.h — offline calibration of per-head retention (DESIGN.md
 * §1.1, §4.2): run each sample through the model with full KV, score every
 * key of the whole context with the scoring method, apply the paper's
 * non-uniform compression (per layer, keep the global top ceil(r * H * N)
 * keys over all heads' scores) and record each head's retention
 * kept_h / N. Forced keys (the last-window keys and the sinks of §4.4) are
 * always kept, as they are at serving time.
 *
 * gvote (§4.8) has no scores to rank: its calibration runs gvote itself
 * with no reservation cap (a profile-less engine, budget 1: k_cap = n) in
 * the serving chunks of §4.3, and records each head's total kept keys
 * over the sample's chunks divided by the sample's tokens.
 */
#ifndef GW_CALIBRATE_H
#define GW_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/profile/pf_build.h"
#include "gpu_worker/engine/gw_engine.h"
#include "gpu_worker/model/gw_gvote.h"

/* Global top-ceil(ratio*H*N) selection over one layer's scores (H, N)
 * with forced keys counted as kept; writes kept[h] / N to retention[h].
 * Ties (equal scores) go to the lower head, then the lower position.
 * Returns 0 or TG_ENOMEM. Pure; any thread. */
int gw_calibrate_layer(const float *scores, int H, int N, double ratio,
                       int window, int n_sink, double *retention);

/* Runs `n_samples` token sequences (samples[i] of lens[i] tokens) through
 * engine `e` (built with full KV, prefill_chunk >= the longest sample and
 * on_scores wired to gw_calibrate_on_scores with `state`) and fills r
 * (S, L, H). progress, when non-NULL, is called after every sample.
 * Returns 0 or the first error. */
struct gw_calib_state {
    double ratio;      /* target keep ratio r in (0, 1] */
    int window;        /* forced window w */
    int n_sink;        /* forced sinks */
    double *cur;       /* (L, H) retention of the sample being run */
    int n_kv_heads;
    int failed;        /* TG_ENOMEM inside the callback */
};

void gw_calibrate_on_scores(void *ud, int layer, const float *scores, int n,
                            int n_kv_heads);

typedef void (*gw_calib_progress_fn)(void *ud, int done, int total, int n_tokens);

int gw_calibrate_run(struct gw_engine *e, struct gw_calib_state *st,
                     const int32_t *const *samples, const int *lens,
                     int n_samples, struct pf_retention *r,
                     gw_calib_progress_fn progress, void *progress_ud,
                     char *err, size_t errlen);

/* gvote's calibration: runs the samples through engine `e` (method gvote,
 * built without a profile so every head's k_cap is the chunk length, and
 * with max_context >= the longest sample), sample s with request seed
 * seed + s (wrapping; the seed of its synthetic queries' streams), no
 * decode, and fills r (S, L, H) with r[s][l][h] = (keys head h of layer l
 * kept over all the sample's chunks) / (the sample's tokens), which lies
 * in (0, 1] (every chunk keeps its forced keys). r->target_ratio becomes
 * the mean of all the ratios (gvote has no target; the profile records
 * what it kept on average). progress as for gw_calibrate_run. Returns 0
 * or the first error (TG_EINVAL when e does not run gvote,
 * TG_EINTERNAL when a count falls outside [1, tokens]); r is left for the
 * caller to free in every case. */
int gw_calibrate_gvote_run(struct gw_engine *e, uint64_t seed,
                           const int32_t *const *samples, const int *lens,
                           int n_samples, struct pf_retention *r,
                           gw_calib_progress_fn progress, void *progress_ud,
                           char *err, size_t errlen);

/* The whole `tangram-profile calibrate` pipeline. */
struct gw_calib_opts {
    const char *model_dir;     /* model with tokenizer.json (+ chat template) */
    const char *samples_path;  /* JSONL: {"text"} | {"messages"} | {"prompt_ids"} */
    const char *method;        /* scoring method name, or "gvote" */
    double ratio;              /* scoring methods: target keep ratio r;
                                  gvote: must be 0 (gvote has no target) */
    struct gw_gvote_params gvote; /* gvote: p, S, n_f of §4.8 */
    int prefill_chunk;         /* gvote: chunk length C of §4.3 (>= 1);
                                  scoring methods: must be 0 (they score
                                  a sample as one chunk) */
    uint64_t seed;             /* gvote: sample s runs with request seed
                                  seed + s */
    double alpha;              /* B = min(1, mean + alpha * std) */
    int heads_per_group;       /* H_p */
    enum pf_grouping grouping;
    int max_sample_tokens;     /* longer samples are cut to this */
    int n_threads;
    enum gw_backend_kind backend; /* forward pass of the runs (CUDA:
                                     scoring methods take samples of at
                                     most GW_BACKEND_CUDA_MAX_CHUNK tokens,
                                     one chunk each) */
    int trig;                  /* also record the decode-time statistics
                                  of §4.9 into the profile's "trig" */
    gw_calib_progress_fn progress;
    void *progress_ud;
};

/* Accumulators of the §4.9 statistics over the calibration samples'
 * pre-RoPE queries: every query row of every sample (all prompt
 * positions) counts once; sums are in double, in sample then position
 * order, and the means divide by the row count at the end. */
struct gw_calib_trig {
    int n_layers, n_q_heads, half;
    double *sre, *sim, *sabs;  /* (L, Hq, d/2) sums */
    int64_t *rows;             /* (L) query rows seen per layer */
    int failed;                /* a shape mismatch inside the callback */
};

/* gw_on_queries_fn of calibration: adds the chunk's queries to the sums
 * of `ud` (a struct gw_calib_trig). */
void gw_calibrate_on_queries(void *ud, int layer, const float *q, int n,
                             int n_q_heads, int head_dim);

/* Reads and tokenizes every sample (chat messages are rendered with the
 * model's chat template), runs them (gw_calibrate_run, or for gvote
 * gw_calibrate_gvote_run), and builds the
 * profile (with o->trig also its "trig" statistics, pf_trig.h). *r and
 * *p are filled for the caller to save and free (both
 * also after a failure, when they are left freed). Errors name the sample
 * line. Returns 0 or a TG_E* code. */
int gw_calibrate_files(const struct gw_calib_opts *o, struct pf_retention *r,
                       struct pf_profile *p, char *err, size_t errlen);

#endif /* GW_CALIBRATE_H */
