/*
 * cpu_sample.c — log-probabilities and token sampling on the CPU.
 *
 * logprobs: log_softmax(x)[t] = x[t] - max - log(sum_j exp(x[j] - max)), the
 * sum accumulated in double.
 *
 * sample follows vLLM's sampler order (vllm/model_executor/layers/sampler.py
 * and vllm/v1/sample/): penalties, temperature, top-k, top-p, min-p, draw.
 *   1. repetition penalty over the ids in prompt U output (each id once):
 *      x > 0 ? x / p : x * p   (Keskar et al. 2019, CTRL);
 *      then x -= frequency * count_out(id) + presence * [count_out(id) > 0].
 *   2. temperature < 1e-5 (vLLM's _SAMPLING_EPS) is greedy: argmax of the
 *      penalised logits, ties to the lower id; no random number is drawn.
 *      Otherwise x /= temperature.
 *   3. top-k (k > 0, k < V): the k best ids in (logit desc, id asc) order —
 *      exactly k, so top-k = 1 is greedy even with tied logits (vLLM keeps
 *      every id tied with the k-th; we break the tie by id, deterministic).
 *   4. top-p (< 1): the smallest prefix of the candidates sorted by
 *      probability (desc, id asc) whose cumulative probability (double)
 *      reaches top_p; at least one token.
 *   5. min-p (> 0): drop candidates with p < min_p * p_max, i.e.
 *      x < x_max + log(min_p) in logit space (renormalisation-invariant).
 *   6. draw u ~ U[0,1) from splitmix64 on *rng, walk the candidates'
 *      cumulative weights exp(x - x_max) until it exceeds u * Z.
 * The generator is splitmix64 (Steele, Lea & Flood 2014, "Fast splittable
 * pseudorandom number generators"): one 64-bit state word, *rng, advanced by
 * the golden-ratio increment per draw; u = (z >> 11) * 2^-53.
 * *lp and the top logprobs are log_softmax of the RAW logits, before
 * penalties and temperature, as vLLM's default logprobs mode ("raw_logprobs")
 * reports them. The caller's logits are left unmodified (penalties and
 * scaling happen in the backend's candidate buffer).
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

#define SAMPLE_GREEDY_EPS 1e-5f

/* Returns max and log-sum-exp of x[0..n) (sum in double). NaN entries make
 * the result NaN, as log_softmax would. */
static double row_lse(const float *x, int n, float *max_out)
{
    float mx = -INFINITY;
    for (int j = 0; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    if (mx == -INFINITY || mx == INFINITY) {
        *max_out = mx;
        return mx;
    }
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++)
        s += exp((double)x[j] - mx);
    *max_out = mx;
    return mx + log(s);
}

int cpu__logprobs(struct tg_backend *b, const float *logits, int n, int vocab,
                  const int32_t *target, float *lp)
{
    if (logits == NULL || target == NULL || lp == NULL || n < 0 || vocab < 1)
        return TG_EINVAL;
    for (int i = 0; i < n; i++)
        if (target[i] < 0 || target[i] >= vocab)
            return TG_EINVAL;
    int par = n > 1 && (size_t)n * (size_t)vocab >= CPU_PAR_MIN_WORK;
#pragma omp parallel for num_threads(b->n_threads) if (par) schedule(static)
    for (int i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * (size_t)vocab;
        float mx;
        double lse = row_lse(x, vocab, &mx);
        lp[i] = (float)((double)x[target[i]] - lse);
    }
    return 0;
}

/* Inserts (v, id) into the sorted top list ids/vals of *n entries (at
 * most k), in (v desc, id asc) order; NaN values were mapped to -inf. */
static void top_insert(int32_t *ids, float *vals, int *n, int k, float v,
                       int32_t id)
{
    int at = *n;
    while (at > 0 &&
           (v > vals[at - 1] || (v == vals[at - 1] && id < ids[at - 1])))
        at--;
    if (at >= k)
        return;
    int last = *n < k ? *n : k - 1;
    for (int j = last; j > at; j--) {
        ids[j] = ids[j - 1];
        vals[j] = vals[j - 1];
    }
    ids[at] = id;
    vals[at] = v;
    if (*n < k)
        (*n)++;
}

int cpu__logprobs_top(struct tg_backend *b, const float *logits, int n,
                      int vocab, const int32_t *target, int k, float *lp,
                      int32_t *rank, int32_t *top_ids, float *top_lps)
{
    if (logits == NULL || target == NULL || lp == NULL || rank == NULL ||
        n < 0 || vocab < 1 || k < 0 || k > vocab ||
        (k > 0 && (top_ids == NULL || top_lps == NULL)))
        return TG_EINVAL;
    for (int i = 0; i < n; i++)
        if (target[i] < 0 || target[i] >= vocab)
            return TG_EINVAL;
    int par = n > 1 && (size_t)n * (size_t)vocab >= CPU_PAR_MIN_WORK;
#pragma omp parallel for num_threads(b->n_threads) if (par) schedule(static)
    for (int i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * (size_t)vocab;
        float mx;
        double lse = row_lse(x, vocab, &mx);
        float xt = x[target[i]];
        lp[i] = (float)((double)xt - lse);
        int32_t above = 0;
        for (int j = 0; j < vocab; j++)
            above += x[j] > xt || (isnan(xt) && !isnan(x[j]));
        rank[i] = above + 1;
        if (k == 0)
            continue;
        int32_t *ti = top_ids + (size_t)i * (size_t)k;
        float *tv = top_lps + (size_t)i * (size_t)k;
        int have = 0;
        for (int j = 0; j < vocab; j++) {
            float v = isnan(x[j]) ? -INFINITY : x[j];
            if (have == k && v <= tv[k - 1])
                continue; /* ids ascend: a tie never moves in */
            top_insert(ti, tv, &have, k, v, j);
        }
        for (int t = 0; t < k; t++)
            tv[t] = (float)((double)x[ti[t]] - lse);
    }
    return 0;
}

static uint64_t splitmix64(uint64_t *s)
{
    /* Constants of the reference splitmix64 (Vigna, prng.di.unimi.it). */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s)
{
    return (double)(splitmix64(s) >> 11) * 0x1.0p-53;
}

/* Applies the penalties of step 1 to pr[id].v (pr still in id order). */
static void apply_penalties(struct tg_backend *b, struct cpu_pair *pr,
                            const struct tg_sampling *sp,
                            const struct tg_sample_history *hist)
{
    int32_t *cnt = b->counts;
    uint8_t *seen = b->seen;
    for (int t = 0; t < hist->n_output; t++) {
        cnt[hist->output[t]]++;
        seen[hist->output[t]] = 1;
    }
    for (int t = 0; t < hist->n_prompt; t++)
        seen[hist->prompt[t]] = 1;
    float rp = sp->repetition_penalty;
    /* Visit each distinct id once: seen 1 -> 2 when processed, then clear
     * every touched entry so the tables are zero for the next call. */
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *ids = pass == 0 ? hist->prompt : hist->output;
        int m = pass == 0 ? hist->n_prompt : hist->n_output;
        for (int t = 0; t < m; t++) {
            int id = ids[t];
            if (seen[id] != 1)
                continue;
            seen[id] = 2;
            float x = pr[id].v;
            if (rp != 1.0f)
                x = x > 0.0f ? x / rp : x * rp;
            int c = cnt[id];
            x -= sp->frequency_penalty * (float)c;
            if (c > 0)
                x -= sp->presence_penalty;
            pr[id].v = x;
        }
    }
    for (int t = 0; t < hist->n_prompt; t++)
        seen[hist->prompt[t]] = 0;
    for (int t = 0; t < hist->n_output; t++) {
        seen[hist->output[t]] = 0;
        cnt[hist->output[t]] = 0;
    }
}

/* Index in pr[0..n) of the first pair in (v desc, i asc) order. */
static int best_of(const struct cpu_pair *pr, int n)
{
    int best = 0;
    for (int j = 1; j < n; j++)
        if (cpu__pair_before(pr[j], pr[best]))
            best = j;
    return best;
}

int cpu__sample(struct tg_backend *b, float *logits, int vocab,
                const struct tg_sampling *sp,
                const struct tg_sample_history *hist, uint64_t *rng,
                int32_t *token, float *lp, int n_top, int32_t *top_ids,
                float *top_lps)
{
    if (logits == NULL || sp == NULL || token == NULL || vocab < 1 ||
        n_top < 0 || n_top > vocab ||
        (n_top > 0 && (top_ids == NULL || top_lps == NULL)))
        return TG_EINVAL;
    /* The value was checked once where it entered (tg_sampling_check: a
     * worker's plan check, in-process generation's arguments, the
     * router's front ends); a bad one here is the caller's bug. */
    TG_ASSERT(tg_sampling_check(sp, vocab, NULL, NULL, 0) == 0);
    int greedy = sp->temperature < SAMPLE_GREEDY_EPS;
    if (!greedy && rng == NULL)
        return TG_EINVAL;
    if (hist != NULL) {
        if (hist->n_prompt < 0 || hist->n_output < 0 ||
            (hist->n_prompt > 0 && hist->prompt == NULL) ||
            (hist->n_output > 0 && hist->output == NULL))
            return TG_EINVAL;
        for (int t = 0; t < hist->n_prompt; t++)
            if (hist->prompt[t] < 0 || hist->prompt[t] >= vocab)
                return TG_EINVAL;
        for (int t = 0; t < hist->n_output; t++)
            if (hist->output[t] < 0 || hist->output[t] >= vocab)
                return TG_EINVAL;
    }
    if (cpu__vocab_reserve(b, (size_t)vocab) != 0)
        return TG_ENOMEM;
    struct cpu_pair *pr = b->pairs;

    /* Raw distribution: log_softmax of the logits as given. */
    float mx0;
    double lse0 = row_lse(logits, vocab, &mx0);
    for (int j = 0; j < vocab; j++) {
        pr[j].v = isnan(logits[j]) ? -INFINITY : logits[j];
        pr[j].i = j;
    }
    if (n_top > 0) {
        cpu__select_first(pr, vocab, n_top);
        cpu__sort_pairs(pr, n_top);
        for (int t = 0; t < n_top; t++) {
            top_ids[t] = pr[t].i;
            top_lps[t] = (float)((double)logits[pr[t].i] - lse0);
        }
        for (int j = 0; j < vocab; j++) {
            pr[j].v = isnan(logits[j]) ? -INFINITY : logits[j];
            pr[j].i = j;
        }
    }

    int penalise = hist != NULL && (hist->n_prompt > 0 || hist->n_output > 0) &&
                   (sp->repetition_penalty != 1.0f ||
                    sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f);
    if (penalise)
        apply_penalties(b, pr, sp, hist);
    /* logit_bias (OpenAI; vLLM adds it to the logits before its sampler's
     * penalties and temperature): pr is still in id order here. */
    for (int k = 0; k < sp->n_bias; k++)
        pr[sp->bias_ids[k]].v += sp->bias_vals[k];

    int nc = vocab;
    int32_t chosen;
    if (greedy) {
        chosen = pr[best_of(pr, nc)].i;
        goto done;
    }
    if (sp->temperature != 1.0f) {
        float inv = 1.0f / sp->temperature;
        for (int j = 0; j < nc; j++)
            pr[j].v *= inv;
    }
    if (sp->top_k > 0 && sp->top_k < nc) {
        cpu__select_first(pr, nc, sp->top_k);
        nc = sp->top_k;
    }
    if (sp->top_p < 1.0f) {
        cpu__sort_pairs(pr, nc);
        float m = pr[0].v;
        if (m == -INFINITY || m == INFINITY) {
            chosen = pr[0].i; /* degenerate: no finite weights to draw from */
            goto done;
        }
        double z = 0.0;
        for (int j = 0; j < nc; j++)
            z += exp((double)pr[j].v - m);
        double cum = 0.0, need = (double)sp->top_p * z;
        int keep = nc;
        for (int j = 0; j < nc; j++) {
            cum += exp((double)pr[j].v - m);
            if (cum >= need) {
                keep = j + 1;
                break;
            }
        }
        nc = keep;
    }
    int bi = best_of(pr, nc);
    float m = pr[bi].v;
    if (m == -INFINITY || m == INFINITY) {
        chosen = pr[bi].i;
        goto done;
    }
    if (sp->min_p > 0.0f) {
        double floor_x = (double)m + log((double)sp->min_p);
        int o = 0;
        for (int j = 0; j < nc; j++)
            if ((double)pr[j].v >= floor_x)
                pr[o++] = pr[j];
        nc = o; /* the maximum always survives: log(min_p) <= 0 */
    }
    {
        double z = 0.0;
        for (int j = 0; j < nc; j++)
            z += exp((double)pr[j].v - m);
        double u = uniform01(rng) * z, cum = 0.0;
        chosen = -1;
        for (int j = 0; j < nc; j++) {
            double w = exp((double)pr[j].v - m);
            cum += w;
            if (w > 0.0) {
                chosen = pr[j].i;
                if (u < cum)
                    break;
            }
        }
        /* Rounding can leave u >= cum; the last positive weight takes it. */
        TG_ASSERT(chosen >= 0);
    }
done:
    *token = chosen;
    if (lp != NULL)
        *lp = (float)((double)logits[chosen] - lse0);
    return 0;
}
