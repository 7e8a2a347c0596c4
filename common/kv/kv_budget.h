/*
 * kv_budget.h — the exact reservation math of DESIGN.md §4.3.
 *
 * A turn's new tokens are cut into chunks of exactly C tokens counted from
 * the start of the turn (the last chunk may be shorter). For a chunk of n
 * tokens a head of group (l, g) with budget b keeps
 *     k = min(n, max(ceil(b * n), f))        (b * n in double precision)
 * keys, where f is the number of forced keys in the chunk. With snapkv the
 * forced keys are the chunk's last W = min(window, n) keys and every key at
 * absolute position < n_sink. A budget of 1 (full KV) keeps every key.
 * Decode tokens are appended uncompressed. Pages hold P tokens.
 *
 * Pure functions of their arguments; any thread.
 */
#ifndef KV_BUDGET_H
#define KV_BUDGET_H

#include <stdint.h>

#define KV_SNAPKV_WINDOW 32 /* w of §4.4 */
#define KV_SINK_TOKENS 4    /* keys at absolute position < 4 are forced */

/* Which keys of a chunk are kept regardless of score. */
struct kv_forced_rule {
    int window; /* last min(window, n) keys of the chunk; 0 for none */
    int n_sink; /* keys at absolute position < n_sink */
};

/* The snapkv rule of §4.4: window 32, sinks 4. */
struct kv_forced_rule kv_forced_rule_snapkv(void);

/* Returns the number of forced keys in a chunk of `n` tokens whose first
 * token sits at absolute position `start` (the union of the window and the
 * sinks, each key counted once). n >= 0, start >= 0. */
int64_t kv_chunk_forced(int64_t start, int64_t n,
                        const struct kv_forced_rule *rule);

/* Returns k = min(n, max(ceil(budget * n), forced)) for one chunk.
 * budget in (0, 1]; budget >= 1 keeps all n. */
int64_t kv_chunk_keep(int64_t n, double budget, int64_t forced);

/* Returns the keys a head of budget `budget` keeps of a turn of `n_new`
 * tokens starting at absolute position `start`, cut into chunks of `chunk`
 * tokens from the start of the turn (sum of kv_chunk_keep over chunks).
 * chunk >= 1. */
int64_t kv_turn_keep(int64_t start, int64_t n_new, int64_t chunk,
                     double budget, const struct kv_forced_rule *rule);

/* Decode tokens a group must reserve under decode-time compression
 * (DESIGN.md §4.9): min(max_tokens, cap_max + every), cap_max the largest
 * cap of the group's heads and `every` the trigger period beta (a head
 * holds at most its cap right after a trigger and grows by beta until the
 * next). All arguments >= 0. */
static inline int64_t kv_decode_bound(int64_t max_tokens, int64_t cap_max,
                                      int64_t every)
{
    int64_t b = cap_max + every;
    return max_tokens < b ? max_tokens : b;
}

/* Returns ceil(tokens / page_size): pages needed to hold `tokens` tokens. */
static inline int64_t kv_pages_for(int64_t tokens, int64_t page_size)
{
    return (tokens + page_size - 1) / page_size;
}

#endif /* KV_BUDGET_H */
