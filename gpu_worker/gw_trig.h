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

#include "kernels/tg_ops.h"

#define GW_TRIG_N_OFFSETS 17        /* O = {2^0 .. 2^16} */
#define GW_TRIG_BUDGET_DEFAULT 2048 /* --decode-budget c */
#define GW_TRIG_EVERY_DEFAULT 128   /* --decode-every beta */
#define GW_TRIG_WINDOW_DEFAULT 32   /* --decode-window W_d */
#define GW_TRIG_SINKS 4             /* F = 4 + W_d */

/* Caps of one layer, §4.9: cap[h] = max(F, round(c * budget[h] /
 * mean_h budget)), F = 4 + window, round half away from zero; uniform:
 * every head c. budget (H) in (0, 1]; cap (H). Returns 0 or TG_EINVAL
 * (c < F, window < 0, H < 1, a budget outside (0, 1]). */
int gw_trig_caps(const double *budget, int H, int64_t c, int window,
                 int uniform, int32_t *cap);

/* Statistics of one query head: re, im, abs, each (d/2). */
struct gw_trig_qstat {
    const float *re, *im, *abs;
};

/* Score of one stored key k (d) for the G query heads' statistics q
 * (G entries), next decode position t, rotary frequencies inv_freq (d/2).
 * Returns the score (double). */
double gw_trig_score(const struct gw_trig_qstat *q, int G, const float *k,
                     int d, const float *inv_freq, int64_t t);

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

#endif /* GW_TRIG_H */
