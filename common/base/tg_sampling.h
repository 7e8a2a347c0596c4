/*
 * tg_sampling.h — how one request's tokens are drawn: the sampler's
 * parameters as one value, from the router's front ends (which fill it
 * from the API's fields) through the scheduler, the plan on the wire
 * (proto/worker.proto WorkerSampling) and the worker's entry, to the CPU
 * sampler (kernels/tg_ops.h) and the CUDA sampler's per-row block
 * (kernels/cuda/sample.h, built from it in gpu_worker/backend/gw_backend_cuda.c).
 *
 * The order the samplers apply them is vLLM's (DESIGN.md §5): logit bias
 * and penalties on the raw logits, then temperature, top-k, top-p, min-p,
 * one draw. Values are single precision because that is what the samplers
 * compute with: a value the API accepts as a double can become 0 or
 * infinity here (top_p 1e-300), which tg_sampling_check refuses.
 *
 * Request-level stop conditions (max_tokens, stop strings, ignore_eos ...)
 * are not the sampler's and live in the request.
 *
 * tg_sampling_check is the one definition of a usable value. It runs once
 * at each trust boundary: the router's front ends right after parsing,
 * the worker on every plan (gpu_worker/serve/gw_worker_check.c) and
 * in-process generation on its arguments (gpu_worker/engine/gw_engine.c).
 * Past a boundary the value is trusted: the samplers only assert it.
 *
 * Thread: plain data and a pure function; any thread.
 */
#ifndef TG_SAMPLING_H
#define TG_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Alternatives one draw may return with its token (the workers' bound;
 * the OpenAI API allows at most 20, rt_openai.h). */
#define TG_SAMPLING_MAX_TOP 64

struct tg_sampling {
    float temperature;        /* finite, >= 0; 0 = greedy (argmax, ties to
                                 the lower id; the samplers treat < 1e-5
                                 as greedy) */
    int32_t top_k;            /* <= 0: off; else the k most likely ids */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* finite, > 0; 1 = off; prompt + output ids */
    float presence_penalty;   /* finite; 0 = off; output ids only */
    float frequency_penalty;  /* finite; 0 = off; output ids only */
    uint64_t seed;            /* the request's RNG seed: a draw depends on
                                 (logits, parameters, seed, token index) */
    int32_t n_top;            /* alternatives returned per token,
                                 0 .. min(vocab, TG_SAMPLING_MAX_TOP) */
    /* OpenAI logit_bias: bias_vals[i] is added to the logit of
     * bias_ids[i] with the penalties, before temperature and the filters;
     * reported log-probabilities stay those of the raw logits. Ids
     * strictly ascending (so distinct) in [0, vocab), values finite. The
     * arrays belong to whoever filled the value (the router's request
     * allocates them: tg_sampling_bias_copy / tg_sampling_bias_free; the
     * worker's point into the plan message); everyone else borrows. */
    const int32_t *bias_ids; /* (n_bias) */
    const float *bias_vals;  /* (n_bias) */
    int32_t n_bias;          /* >= 0; 0 = none (the arrays may be NULL) */
};

/* The sampling that changes nothing: greedy, every filter and penalty
 * off, no alternatives, no bias, seed 0. The one place these "off" values
 * are written; a request's API defaults (OpenAI's temperature 1) are the
 * front ends'. */
#define TG_SAMPLING_OFF                               \
    ((struct tg_sampling){.temperature = 0.0f,        \
                          .top_k = 0,                 \
                          .top_p = 1.0f,              \
                          .min_p = 0.0f,              \
                          .repetition_penalty = 1.0f, \
                          .presence_penalty = 0.0f,   \
                          .frequency_penalty = 0.0f})

/* Checks *s against the bounds above. vocab > 0 also bounds the bias ids
 * and n_top by the vocabulary; vocab <= 0 checks them without it. Returns
 * 0, or TG_EINVAL with *field (when non-NULL) set to the offending
 * parameter's API name, a static string ("temperature", "top_p", "min_p",
 * "repetition_penalty", "presence_penalty", "frequency_penalty",
 * "logprobs", "logit_bias"), and msg (when non-NULL, cap > 0) set to a
 * sentence naming the parameter and its value. */
int tg_sampling_check(const struct tg_sampling *s, int32_t vocab,
                      const char **field, char *msg, size_t cap);

/* Makes dst's bias arrays copies of src's (malloc'd, dst owns them; the
 * rest of dst untouched). n_bias 0 copies nothing and leaves the arrays
 * NULL. Returns 0, or TG_ENOMEM with dst's bias empty. */
int tg_sampling_bias_copy(struct tg_sampling *dst,
                          const struct tg_sampling *src);

/* Frees bias arrays s owns (from tg_sampling_bias_copy or a front end's
 * parse) and empties them. Safe on an empty bias. */
void tg_sampling_bias_free(struct tg_sampling *s);

#ifdef __cplusplus
}
#endif
#endif /* TG_SAMPLING_H */
