/*
 * gw_trig.h — the pieces of decode-time compression `--decode-compress trig`
 * (DESIGN.md §4.9) that do not depend on a backend: per-head caps, the
 * trigonometric key score, the choice of survivors, and the order-preserving
 * compaction of a head's row on the CPU pool.
 *
 * Score of a stored (post-RoPE) key k of KV head h when the next position
 * to decode is t, from the calibration statistics re/im/abs (d/2 each) of
 * every query head q of h, w_f the rotary frequency of pair f (rope
 * scaling included), O = {1, 2, 4, ..., 2^16}:
 *   logit(q, o) = sum_f Re(qbar_f e^{i w_f (t+o)} conj(k_f))
 *                 + (abs_f - |qbar_f|) |k_f|,
 *   qbar_f = re_f + i im_f, k_f = k[f] + i k[f + d/2];
 *   score(k) = mean over the G query heads and the 17 offsets of
 *              logit(q, o) / sqrt(d).
 * Source: TriAttention's trigonometric estimate of a future query's logit
 * (rotating the mean pre-RoPE query to t+o and dotting with the stored key
 * equals the pre-RoPE form at distance t+o-j), with the norm correction
 * term; constants and offsets exactly as §4.9. Evaluated in double.
 *
 * Pure functions and host memory; any thread.
 */
#ifndef GW_TRIG_H
#define GW_TRIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_trig.h"
#include "common/profile/pf_profile.h"
#include "kernels/tg_ops.h"

#define GW_TRIG_N_OFFSETS 17        /* O = {2^0 .. 2^16} */
/* The option defaults and the cap rule are common/kv/kv_trig.h's (the
 * router's admission bound uses them too). */
#define GW_TRIG_BUDGET_DEFAULT KV_TRIG_BUDGET_DEFAULT
#define GW_TRIG_EVERY_DEFAULT KV_TRIG_EVERY_DEFAULT
#define GW_TRIG_WINDOW_DEFAULT KV_TRIG_WINDOW_DEFAULT
#define GW_TRIG_SINKS KV_TRIG_SINKS

/* Caps of one layer, §4.9: cap[h] = max(F, round(c * budget[h] /
 * mean_h budget)), F = 4 + window, round half away from zero; uniform:
 * every head c. budget (H) in (0, 1]; cap (H). Returns 0 or TG_EINVAL
 * (c < F, window < 0, H < 1, a budget outside (0, 1]). */
int gw_trig_caps(const double *budget, int H, int64_t c, int window,
                 int uniform, int32_t *cap);

/* gw_trig_caps with the denominator given (kv_trig_caps_mean): mean is mean_h budget over
 * the whole model's heads of the layer (a tensor-parallel rank holds only
 * some of them; pf_profile.budget_mean). Same returns. */
int gw_trig_caps_mean(const double *budget, int H, double mean, int64_t c,
                      int window, int uniform, int32_t *cap);

/* Statistics of one query head: re, im, abs, each (d/2). */
struct gw_trig_qstat {
    const float *re, *im, *abs;
};

/* Score of one stored key k (d) for the G query heads' statistics q
 * (G entries), next decode position t, rotary frequencies inv_freq (d/2).
 * Returns the score (double). */
double gw_trig_score(const struct gw_trig_qstat *q, int G, const float *k,
                     int d, const float *inv_freq, int64_t t);

/* The same score with the key-independent part folded once per head and
 * trigger: coef (3 * d/2 doubles) gets, for pair f, U_f = sum over q and o
 * of Re(qbar e^{i w_f (t+o)}), V_f = the Im part and N_f = 17 * sum over
 * q of (abs - |qbar|), all divided by G * 17 * sqrt(d); then
 * score(k) = sum_f U_f k_f.re + V_f k_f.im + N_f |k_f|
 * (gw_trig_score_coef). Equal to gw_trig_score up to rounding; O(d) per
 * key instead of O(17 G d) sines. Angles w_f (t+o) are formed in double
 * from the model's fp32 frequencies. */
void gw_trig_coef(const struct gw_trig_qstat *q, int G, int d,
                  const float *inv_freq, int64_t t, double *coef);
double gw_trig_score_coef(const double *coef, const float *k, int d);

/* Chooses the survivors of a decode region of n > cap entries: the last
 * `window` always, the rest by score descending (ties: earlier slot).
 * keep (n) gets 1 for a survivor, 0 otherwise; exactly cap ones.
 * Returns 0, TG_EINVAL (cap < window, cap > n, window < 0) or
 * TG_ENOMEM. */
int gw_trig_select(const double *score, int n, int cap, int window,
                   uint8_t *keep);

/* Order-preserving compaction of head h's row in `rows` (CPU pool): of
 * the entries at slots [first, first + n) those with keep[i] set slide
 * forward to slots first, first + 1, ... in their order; slots before
 * `first` do not move. All survivors are read into `scratch` (2 * n * d
 * floats) before any is written, so overlapping source and destination
 * ranges are safe. Returns the number of survivors, or TG_EINVAL. The
 * caller shortens the head's length and gives back the freed tail pages. */
int gw_trig_compact_head(const struct tg_kv_rows *rows, int h, int first,
                         int n, const uint8_t *keep, float *scratch);

/* Decode-time compression of one rank (§4.9): the options, per-head caps
 * and the statistics of each KV head's query heads, in the rank's head
 * order. Built once (gw_trig_cfg_init), read-only after: any thread. */
struct gw_trig_cfg {
    int every;               /* beta: trigger period in decoded tokens */
    int window;              /* W_d: the region's last entries always kept */
    int n_layers, n_kv_heads, group, head_dim; /* L, Hkv, G = Hq/Hkv, d */
    int n_groups;            /* page groups per layer */
    int32_t *cap;            /* (L, Hkv) caps, owned */
    int32_t *group_cap;      /* (L, n_groups) largest cap of each group */
    const struct pf_trig *stats; /* borrowed: rank-order query heads */
    const float *inv_freq;   /* (d/2) borrowed: the model's frequencies */
};

/* Options of `--decode-compress` as the flags give them. */
struct gw_trig_opts {
    int enabled;             /* --decode-compress trig */
    int64_t budget;          /* c, --decode-budget */
    int uniform;             /* --decode-budget-uniform */
    int every;               /* beta, --decode-every */
    int window;              /* W_d, --decode-window */
};

/* Checks o (budget >= F = 4 + window, every >= 1, window >= 0) and that
 * `stats` holds statistics for the layout's query heads (Hq = G * Hkv of
 * the rank, half = d/2), then computes the caps of every (layer, head)
 * from the rank profile p's budgets over its whole-model mean
 * (budget_mean). stats and inv_freq are borrowed and must outlive c.
 * Returns 0, TG_EINVAL (naming the flag or the missing statistics) or
 * TG_ENOMEM; c is freed on failure. */
int gw_trig_cfg_init(struct gw_trig_cfg *c, const struct gw_trig_opts *o,
                     const struct pf_profile *p, const struct kv_layout *lay,
                     const struct pf_trig *stats, int n_q_heads,
                     const float *inv_freq, char *err, size_t errlen);

/* Frees what c owns; safe on a zeroed one. */
void gw_trig_cfg_free(struct gw_trig_cfg *c);

/* Scratch of gw_trig_compact_layer, grown on demand; one per thread. */
struct gw_trig_work {
    double *score, *coef;
    uint8_t *keep;
    float *kv;
    int32_t *pos;
    int cap_n;               /* entries the buffers hold */
};

void gw_trig_work_free(struct gw_trig_work *w);

/* Runs §4.9 on layer l of one sequence: every head h whose decode region
 * [dstart[h], hlen[h]) is longer than its cap keeps its cap (the last
 * `window` entries, the rest by score for the next decode position t,
 * ties to the earlier slot) and is compacted in order; hlen[h] becomes
 * dstart[h] + cap. rows views the layer (its head_len must be hlen).
 * slot_pos (Hkv, slot_cap) positions of the slots, or NULL: moved with
 * the survivors. Returns the number of heads compacted, or TG_ENOMEM /
 * TG_EINVAL. */
int gw_trig_compact_layer(const struct gw_trig_cfg *c, int l,
                          const struct tg_kv_rows *rows, int32_t *hlen,
                          const int32_t *dstart, int64_t t, int32_t *slot_pos,
                          int32_t slot_cap, struct gw_trig_work *w);

#endif /* GW_TRIG_H */
