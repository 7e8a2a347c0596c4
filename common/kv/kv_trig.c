/* kv_trig.c — caps and decode bound of §4.9 (see kv_trig.h). */
#include "common/kv/kv_trig.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/base/tg_err.h"

int kv_trig_opts_check(const struct kv_trig_opts *o, char *err,
                       size_t errlen)
{
    int64_t F = KV_TRIG_SINKS + (int64_t)o->window;
    if (o->window < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--decode-window must be >= 0 (got %d)", o->window);
    if (o->budget < F || o->budget > INT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--decode-budget %lld must be at least F = 4 + "
                          "--decode-window = %lld (sinks and the window "
                          "always stay)", (long long)o->budget, (long long)F);
    if (o->every < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--decode-every must be >= 1 (got %d)", o->every);
    return 0;
}

int kv_trig_caps_mean(const double *budget, int H, double mean, int64_t c,
                      int window, int uniform, int32_t *cap)
{
    int64_t F = KV_TRIG_SINKS + (int64_t)window;
    if (H < 1 || window < 0 || c < F || c > INT32_MAX || !(mean > 0.0))
        return TG_EINVAL;
    for (int h = 0; h < H; h++)
        if (!(budget[h] > 0.0 && budget[h] <= 1.0))
            return TG_EINVAL;
    for (int h = 0; h < H; h++) {
        if (uniform) {
            cap[h] = (int32_t)c;
            continue;
        }
        /* round(): half away from zero, as C's round() does. */
        double r = round((double)c * budget[h] / mean);
        if (r > (double)INT32_MAX)
            r = (double)INT32_MAX;
        cap[h] = (int32_t)(r < (double)F ? (double)F : r);
    }
    return 0;
}

void kv_trig_free(struct kv_trig *t)
{
    if (t == NULL)
        return;
    free(t->cap);
    free(t->group_cap);
    memset(t, 0, sizeof(*t));
}

int kv_trig_init(struct kv_trig *t, const struct kv_trig_opts *o,
                 const struct pf_profile *p, const struct kv_layout *lay,
                 char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    int rc = kv_trig_opts_check(o, err, errlen);
    if (rc != 0)
        return rc;
    const int L = lay->n_layers, H = lay->n_kv_heads, G = lay->n_groups;
    if (p->num_layers != L || p->num_kv_heads != H || lay->head_group == NULL ||
        p->budget_mean == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode caps: the profile (L=%d H=%d) does not fit "
                          "the layout (L=%d H=%d) or lacks head maps",
                          p->num_layers, p->num_kv_heads, L, H);
    t->every = o->every;
    t->window = o->window;
    t->n_layers = L;
    t->n_kv_heads = H;
    t->n_groups = G;
    t->cap = malloc((size_t)L * (size_t)H * sizeof(int32_t));
    t->group_cap = calloc((size_t)L * (size_t)G, sizeof(int32_t));
    if (t->cap == NULL || t->group_cap == NULL) {
        kv_trig_free(t);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    for (int l = 0; l < L; l++) {
        int32_t *cap = t->cap + (size_t)l * (size_t)H;
        rc = kv_trig_caps_mean(p->budget + (size_t)l * (size_t)H, H,
                               p->budget_mean[l], o->budget, o->window,
                               o->uniform, cap);
        if (rc != 0) {
            kv_trig_free(t);
            return tg_err_set(err, errlen, rc, "decode caps of layer %d", l);
        }
        for (int h = 0; h < H; h++) {
            int32_t *gc = t->group_cap + (size_t)l * (size_t)G +
                          (size_t)lay->head_group[(size_t)l * (size_t)H +
                                                  (size_t)h];
            if (cap[h] > *gc)
                *gc = cap[h];
            if (cap[h] > t->cap_max)
                t->cap_max = cap[h];
        }
    }
    return 0;
}

int64_t kv_trig_row_bound(const struct kv_trig *t, int l, int g,
                          int64_t max_tokens)
{
    int64_t cap = t->group_cap[(size_t)l * (size_t)t->n_groups + (size_t)g];
    return kv_decode_bound(max_tokens, cap, t->every);
}

int64_t kv_trig_decode_pages(const struct kv_trig *t, int page_size,
                             int64_t max_tokens)
{
    int64_t pages = 0;
    for (int l = 0; l < t->n_layers; l++)
        for (int g = 0; g < t->n_groups; g++)
            pages += kv_pages_for(kv_trig_row_bound(t, l, g, max_tokens),
                                  page_size);
    return pages;
}

const char *kv_trig_no_stats_reason(int profile_none)
{
    return profile_none
               ? "--decode-compress trig: --profile none has no trig "
                 "statistics; name a profile that has them with --trig-stats"
               : "--decode-compress trig: the profile has no \"trig\" "
                 "statistics; calibrate it with tangram-profile calibrate "
                 "--trig (or name another with --trig-stats)";
}
