/* kv_budget.c — reservation math of DESIGN.md §4.3 (see kv_budget.h). */
#include "common/kv/kv_budget.h"

#include <math.h>

struct kv_forced_rule kv_forced_rule_snapkv(void)
{
    struct kv_forced_rule r = {KV_SNAPKV_WINDOW, KV_SINK_TOKENS};
    return r;
}

int64_t kv_chunk_forced(int64_t start, int64_t n,
                        const struct kv_forced_rule *rule)
{
    if (n <= 0)
        return 0;
    int64_t w = rule->window < n ? rule->window : n;
    if (w < 0)
        w = 0;
    /* Window: absolute positions [start + n - w, start + n). Sinks: the
     * chunk's positions below n_sink, i.e. [start, min(start + n, n_sink)),
     * minus those already in the window. */
    int64_t win_lo = start + n - w;
    int64_t sink_hi = rule->n_sink < start + n ? rule->n_sink : start + n;
    int64_t sinks = 0;
    if (sink_hi > start) {
        int64_t hi = sink_hi < win_lo ? sink_hi : win_lo;
        sinks = hi > start ? hi - start : 0;
    }
    return w + sinks;
}

int64_t kv_chunk_keep(int64_t n, double budget, int64_t forced)
{
    if (n <= 0)
        return 0;
    if (budget >= 1.0)
        return n;
    int64_t k = (int64_t)ceil(budget * (double)n);
    if (k < forced)
        k = forced;
    return k < n ? k : n;
}

int64_t kv_turn_keep(int64_t start, int64_t n_new, int64_t chunk,
                     double budget, const struct kv_forced_rule *rule)
{
    int64_t kept = 0;
    for (int64_t off = 0; off < n_new; off += chunk) {
        int64_t n = n_new - off < chunk ? n_new - off : chunk;
        kept += kv_chunk_keep(n, budget, kv_chunk_forced(start + off, n, rule));
    }
    return kept;
}
