/*
 * tt_model.h — synthetic models and profiles for the end-to-end benchmarks
 * (tests/bench/bench_cpu_model.c, bench_cuda_model.c): a reproducible
 * random stream, a Llama- or Qwen3-shaped model with random weights built
 * in host memory (no files), skewed per-head budgets of a given mean, and
 * the TANGRAM profile those budgets make (clustered into groups of H_p with
 * common/profile/pf_build.h, as a calibrated profile would be, DESIGN.md §4.2).
 *
 * Test code only. A struct tt_rng is one stream: callers that draw from
 * one stream in a fixed order get the same numbers on every run. Single
 * thread per rng; the other functions are pure apart from their outputs.
 */
#ifndef TT_MODEL_H
#define TT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/mc_model_config.h"
#include "common/profile/pf_profile.h"
#include "gpu_worker/model/gw_model.h"

#define TT_RNG_SEED 0x9e3779b97f4a7c15ull /* the default (non-zero) seed */

/* xorshift64 state (Marsaglia 2003, "Xorshift RNGs"). */
struct tt_rng {
    uint64_t state; /* never 0 */
};

/* Seeds *r; seed 0 (which xorshift cannot leave) means TT_RNG_SEED. */
void tt_rng_init(struct tt_rng *r, uint64_t seed);

/* Returns the next value of the stream, uniform in [0, 1) with 53 bits. */
double tt_rng_uniform(struct tt_rng *r);

/* Returns a standard normal value (Box-Muller, one uniform pair per call;
 * the first uniform is kept away from 0 for the log). */
double tt_rng_normal(struct tt_rng *r);

/* Writes n values uniform in [-a, a] to x, in order from the stream. */
void tt_fill_uniform(struct tt_rng *r, float *x, size_t n, double a);

/* The shape of a synthetic decoder. arch selects the flavour:
 * MC_ARCH_QWEN3 has per-head q/k RMSNorm (rope_theta 1e6, eps 1e-6);
 * MC_ARCH_LLAMA has Llama-3.1 RoPE scaling (theta 5e5, factor 8, low 1,
 * high 4, original 8192 positions; eps 1e-5; Meta's config.json values).
 * No other architecture is built. */
struct tt_shape {
    enum mc_arch arch;
    int L;      /* layers */
    int hidden; /* model width */
    int Hq;     /* query heads */
    int Hkv;    /* KV heads (divides Hq) */
    int d;      /* head dimension (even) */
    int ffn;    /* SwiGLU width */
    int vocab;  /* V */
    int tied;   /* lm_head shares the embedding */
};

/* Returns the parameters of the model tt_model_init_random builds:
 * embedding, per layer two norms, q/k/v/o, (q/k norms), gate/up/down, the
 * final norm and, untied, the LM head. Pure. */
size_t tt_model_param_count(const struct tt_shape *s);

/* Builds a single-rank model of shape *s in one fp32 slab, laid out the
 * way gw_model_load carves a checkpoint. Matrix entries are uniform with
 * standard deviation 0.02 (the usual initializer range: a = 0.02 sqrt 3),
 * drawn from r in a fixed order (embedding, then per layer q, k, v, o,
 * gate, up, down, then an untied LM head); norm weights are 1. Returns 0,
 * TG_EINVAL (a shape the config validation rejects, or an architecture
 * other than Llama / Qwen3; detail in err) or TG_ENOMEM; on failure *m is
 * left freed. The caller owns *m (gw_model_free). */
int tt_model_init_random(struct gw_model *m, const struct tt_shape *s,
                         struct tt_rng *r, char *err, size_t errlen);

/* Frees the weight slab of *m and clears every tensor pointer, keeping the
 * sizes and the config (and the RoPE table): once a device runtime holds
 * its own copy, a benchmark need not keep gigabytes of host weights.
 * gw_model_free stays safe afterwards. */
void tt_model_drop_weights(struct gw_model *m);

/* Writes n head budgets to b with a log-normal spread (exp of a standard
 * normal), scaled so the mean of the budgets clipped to [1/1024, 1] is
 * `target`: a few heads keep most keys, most keep few, as calibrated
 * profiles show (TANGRAM, Kim et al.: per-head retention is strongly
 * non-uniform). The clipped mean is non-decreasing in the scale, so
 * bisection (100 rounds) finds it. Draws n normals from r. Returns 0,
 * TG_EINVAL (n < 1, target outside [1/1024, 1]) or TG_ENOMEM. */
int tt_skewed_budgets(struct tt_rng *r, double *b, int n, double target);

/* Initializes *p for L layers of H KV heads of dimension d in groups of
 * H_p. budgets == NULL: the full-KV profile (pf_profile_init_full).
 * Otherwise budgets holds (L, H) head budgets: the profile is the one a
 * calibration with standard deviation 0 would give (mean = budget,
 * method "snapkv", alpha 2, 50 samples, target_ratio `target`), heads
 * clustered by budget into groups of H_p (pf_profile_regroup,
 * PF_GROUPING_CLUSTERED). `architecture` is the HF class name recorded in
 * the profile. Returns 0 or the pf_* error (detail in err); on failure *p
 * is left freed. The caller owns *p (pf_profile_free). */
int tt_profile_from_budgets(struct pf_profile *p, const char *architecture,
                            int L, int H, int d, int H_p,
                            const double *budgets, double target, char *err,
                            size_t errlen);

#endif /* TT_MODEL_H */
