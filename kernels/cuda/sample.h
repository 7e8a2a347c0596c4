/*
 * sample.h — log-probabilities, greedy argmax, top-K logprobs and seeded
 * top-k/top-p/min-p/temperature sampling over fp32 logits on the device.
 *
 * The semantics are those of the CPU reference (kernels/cpu/cpu_sample.c,
 * vLLM's sampler order): temperature, then top-k, then top-p, then min-p,
 * then one draw; greedy (temperature < 1e-5) is the argmax with ties to
 * the lower id; NaN logits never win a selection (they count as -inf).
 * Log-probabilities are log_softmax of the RAW logits (before temperature),
 * reductions in fp32 (the CPU sums in double; the difference is ~1e-6
 * relative).
 *
 * Random numbers: one uniform per sampled row from Philox4x32-10 (Salmon,
 * Moraes, Dror & Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3")
 * via cuRAND's curand_init(seed, subsequence = step, offset = 0); the first
 * 32-bit output x gives u = x * 2^-32 in [0, 1). The draw depends only
 * on (logits row, parameters, seed, step): never on the row's position in
 * the batch, on other rows, or on the launch configuration, so a request
 * replays exactly given its seed and the index of the token being drawn.
 * The CPU backend uses splitmix64, so CPU and CUDA draws agree in
 * distribution, not token for token.
 *
 * Sampling with top-k or top-p sorts each row (cub radix sort, stable, in
 * chunks of rows so the scratch stays bounded); rows with neither are
 * drawn in id order without sorting. The scratch lives in a sampler object
 * created once per worker.
 *
 * The header is plain C without CUDA types: streams are void * (NULL = the
 * default stream). Functions need a CUDA build (TANGRAM_CUDA) and a device.
 * Errors: TG_EINVAL for bad arguments, TG_ENOMEM, TG_EDEVICE from the CUDA
 * runtime. Device-side data (logits, target ids) cannot be checked by the
 * host; out-of-range ids give NaN results, as documented per function.
 */
#ifndef TG_CUDA_SAMPLE_H
#define TG_CUDA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sampling parameters of one row (host memory; 32 bytes, same layout in C
 * and CUDA C++). */
struct tg_cuda_sample_params {
    float temperature; /* >= 0, finite; < 1e-5 = greedy */
    int32_t top_k;     /* <= 0 or >= vocab: disabled; else exactly k ids */
    float top_p;       /* (0, 1]; 1 = disabled */
    float min_p;       /* [0, 1]; 0 = disabled */
    uint64_t seed;     /* Philox key: the request's seed */
    uint64_t step;     /* Philox subsequence: index of the token drawn */
};

/* Rows sorted per radix-sort pass: bounds the sampler's scratch to
 * 24 bytes * TG_CUDA_SAMPLE_SORT_ROWS * vocab plus cub's temporary storage. */
#define TG_CUDA_SAMPLE_SORT_ROWS 32

struct tg_cuda_sampler; /* opaque: device scratch reserved once */

/* lp[i] = log_softmax(logits[i, :])[target[i]] on `stream`.
 * logits device (n, vocab) fp32; target device (n) int32; lp device (n)
 * fp32. A target outside [0, vocab) gives lp = NaN. A row whose maximum is
 * +-inf gives lse = that maximum (as the CPU op). n == 0 is a no-op.
 * Returns 0 once queued, TG_EINVAL or TG_EDEVICE. Any thread. */
int tg_cuda_logprobs(const float *logits, int n, int vocab,
                     const int32_t *target, float *lp, void *stream);

/* ids[i] = argmax_j logits[i, j], ties to the lower id, NaN as -inf (an
 * all-NaN or all -inf row gives 0). logits device (n, vocab) fp32; ids
 * device (n) int32. Returns 0 once queued, TG_EINVAL or TG_EDEVICE. Any
 * thread. */
int tg_cuda_argmax(const float *logits, int n, int vocab, int32_t *ids,
                   void *stream);

/* first[i] = the smallest j with logits[i, j] NaN or +-inf, or -1 when the
 * row is finite (a row that cannot be sampled: the worker fails its
 * request, as the CPU backend's host sampler does), and value[i] =
 * logits[i, first[i]] (0 for a finite row). logits device (n, vocab)
 * fp32; first device (n) int32; value device (n) fp32. Returns 0 once
 * queued, TG_EINVAL or TG_EDEVICE. Any thread. */
int tg_cuda_first_nonfinite(const float *logits, int n, int vocab,
                            int32_t *first, float *value, void *stream);

/* OpenAI logit_bias on the device: logits[rows[i], ids[i]] += scale *
 * vals[i] for i < n, one thread per entry. logits device (rows, vocab)
 * fp32; rows, ids, vals device (n). The entries of one row must name
 * distinct ids; an id outside [0, vocab) is skipped (the worker checked
 * them). scale 1 applies the bias, -1 takes it back off (so log-probs of
 * the raw logits can be read after a biased draw; x + b - b may differ
 * from x in the last bit). Returns 0 once queued, TG_EINVAL or TG_EDEVICE.
 * Any thread. */
int tg_cuda_logit_bias(float *logits, int vocab, const int32_t *rows,
                       const int32_t *ids, const float *vals, int n,
                       float scale, void *stream);

/* The k most likely ids of each row in (logit desc, id asc) order (NaN as
 * -inf) with their log_softmax values of the raw logits.
 * logits device (n, vocab) fp32; ids device (n, k) int32; lps device
 * (n, k) fp32. 1 <= k <= vocab; the cost is O(k * vocab) per row (meant for
 * the API's top logprobs, k <= 20). Returns 0 once queued, TG_EINVAL or
 * TG_EDEVICE. Any thread. */
int tg_cuda_topk_logprobs(const float *logits, int n, int vocab, int k,
                          int32_t *ids, float *lps, void *stream);

/* rank[i] = 1 + the ids j with logits[i, j] > logits[i, target[i]] (a NaN
 * logit is never greater; a NaN target ranks after every other id): the
 * target's place in the row, as the API's prompt log-probabilities report
 * it. logits device (n, vocab) fp32; target device (n) int32; rank device
 * (n) int32 (-1 for a target outside [0, vocab)). vocab < 2^24. Returns 0
 * once queued, TG_EINVAL or TG_EDEVICE. Any thread. */
int tg_cuda_token_rank(const float *logits, int n, int vocab,
                       const int32_t *target, int32_t *rank, void *stream);

/* Creates a sampler for rows of `vocab` logits, at most `max_rows` rows per
 * call, on the current device: device copies of the parameters, sort
 * buffers for min(max_rows, TG_CUDA_SAMPLE_SORT_ROWS) rows and cub's
 * temporary storage, all allocated here once. Stores it in *out (freed by
 * tg_cuda_sampler_free). Returns 0, TG_EINVAL (vocab < 1, max_rows < 1,
 * sizes over 2^31 elements), TG_ENOMEM or TG_EDEVICE, with detail in err. */
int tg_cuda_sampler_new(int vocab, int max_rows, struct tg_cuda_sampler **out,
                        char *err, size_t errlen);

/* Synchronises the device, then frees the sampler. Safe on NULL. */
void tg_cuda_sampler_free(struct tg_cuda_sampler *s);

/* Samples one token per row on `stream`: tokens[i] from logits[i, :] under
 * params[i] (see the file comment for the order and the generator), and,
 * when lps is non-NULL, lps[i] = log_softmax(logits[i, :])[tokens[i]] of
 * the raw logits. logits device (n, vocab) fp32, not modified; params host
 * (n), copied before return (the caller may reuse it at once); tokens
 * device (n) int32; lps device (n) fp32 or NULL. 0 <= n <= max_rows; vocab
 * must equal the sampler's. Each row's parameters come from a sampling
 * value tg_sampling_check accepted where it entered (the caller's trust
 * boundary): one out of its range is a caller's bug, which stops the
 * process (TG_ASSERT), never an input error. Returns 0 once queued,
 * TG_EINVAL (bad sizes, NULL pointers) or TG_EDEVICE. Not thread-safe: one
 * sampler per thread; calls on different streams must not overlap (they
 * share the scratch). */
int tg_cuda_sample(struct tg_cuda_sampler *s, const float *logits, int n,
                   int vocab, const struct tg_cuda_sample_params *params,
                   int32_t *tokens, float *lps, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_SAMPLE_H */
