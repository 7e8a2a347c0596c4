/*
 * kv_trig.h — the caps and reservation bound of decode-time compression
 * `--decode-compress trig` (DESIGN.md §4.9), shared by the router (its
 * admission bound and its check of the workers' compaction reports) and
 * the workers (which heads a trigger compacts): one rule, computed by one
 * function on both sides.
 *
 *   C[l][h] = max(F, round(c * budget[l][h] / mean_h budget[l][h]))
 *   F = 4 + W_d (the sinks and the window always stay), round() half away
 *   from zero; --decode-budget-uniform gives every head c. The mean is over
 *   the whole model's heads of the layer (pf_profile.budget_mean), so a
 *   tensor-parallel rank's caps equal the single-rank ones.
 *   A group's decode KV holds at most min(max_tokens, max cap of its heads
 *   + beta) tokens (kv_decode_bound): a head holds at most its cap right
 *   after a trigger and grows by beta until the next.
 *
 * Pure computation; built once, read-only after: any thread.
 */
#ifndef KV_TRIG_H
#define KV_TRIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "common/profile/pf_profile.h"

#define KV_TRIG_BUDGET_DEFAULT 2048 /* --decode-budget c */
#define KV_TRIG_EVERY_DEFAULT 128   /* --decode-every beta */
#define KV_TRIG_WINDOW_DEFAULT 32   /* --decode-window W_d */
#define KV_TRIG_SINKS 4             /* F = 4 + W_d */

/* Options of `--decode-compress` as the flags give them. */
struct kv_trig_opts {
    int enabled;             /* --decode-compress trig */
    int64_t budget;          /* c, --decode-budget */
    int uniform;             /* --decode-budget-uniform */
    int every;               /* beta, --decode-every */
    int window;              /* W_d, --decode-window */
};

/* The start-up refusal of trig without statistics, naming the fix:
 * profile_none is 1 for --profile none. A static string. */
const char *kv_trig_no_stats_reason(int profile_none);

/* Checks o: window >= 0, F = 4 + window <= budget <= INT32_MAX,
 * every >= 1. Returns 0 or TG_EINVAL with a message naming the flag. */
int kv_trig_opts_check(const struct kv_trig_opts *o, char *err,
                       size_t errlen);

/* Caps of one layer: budget (H values in (0, 1]), mean = mean_h budget of
 * the whole model's layer (> 0), c, window, uniform; cap gets H values.
 * Returns 0 or TG_EINVAL (c < F, window < 0, H < 1, a bad budget). */
int kv_trig_caps_mean(const double *budget, int H, double mean, int64_t c,
                      int window, int uniform, int32_t *cap);

/* One rank's caps. */
struct kv_trig {
    int every;               /* beta */
    int window;              /* W_d */
    int n_layers, n_kv_heads, n_groups; /* L, Hkv and G of the rank */
    int32_t *cap;            /* (L, Hkv) caps, rank head order; owned */
    int32_t *group_cap;      /* (L, G) largest cap of each group; owned */
    int32_t cap_max;         /* largest cap of the rank */
};

/* Builds the caps of the rank whose profile is p (pf_profile_rank's, or
 * the whole model's with one rank; p->budget_mean the whole model's
 * per-layer means) and layout lay (with head maps), after checking o
 * (kv_trig_opts_check). Returns 0, TG_EINVAL or TG_ENOMEM; t is zeroed on
 * failure. */
int kv_trig_init(struct kv_trig *t, const struct kv_trig_opts *o,
                 const struct pf_profile *p, const struct kv_layout *lay,
                 char *err, size_t errlen);

/* Frees what t owns; safe on a zeroed one. */
void kv_trig_free(struct kv_trig *t);

/* Decode tokens row (l, g) of a request with `max_tokens` decode tokens
 * left can hold at most: kv_decode_bound(max_tokens, group cap, beta). */
int64_t kv_trig_row_bound(const struct kv_trig *t, int l, int g,
                          int64_t max_tokens);

/* Pages a request's rows may take on top of what they hold at the end of
 * its turn's prefill, for at most max_tokens decode tokens: the sum over
 * rows of ceil(kv_trig_row_bound / P) (a row of a tokens holding a + x
 * needs at most ceil(a / P) + ceil(x / P) pages). */
int64_t kv_trig_decode_pages(const struct kv_trig *t, int page_size,
                             int64_t max_tokens);

/* The decode region of head h (dstart..len) after a trigger: its cap when
 * longer, else unchanged. The exact rule the workers apply; the router
 * predicts and checks the workers' reports with it. */
static inline int32_t kv_trig_head_after(const struct kv_trig *t, int l,
                                         int h, int32_t dstart, int32_t len)
{
    int32_t cap = t->cap[(size_t)l * (size_t)t->n_kv_heads + (size_t)h];
    return len - dstart > cap ? dstart + cap : len;
}

#endif /* KV_TRIG_H */
