/*
 * rt_prefix.h — the multi-turn session cache of compressed KV
 * (DESIGN.md §1, §5 "Multi-turn reuse").
 *
 * When a request finishes, its KV pages stay allocated: its kv_seq on every
 * rank moves into an entry of this cache, keyed by the token sequence whose
 * KV the pages hold (prompt + output except the last sampled token, which
 * was never fed back) and, optionally, by a session id. The next turn of the
 * conversation re-sends the whole history; the scheduler finds the longest
 * stored sequence that is a proper prefix of the new prompt, takes the
 * entry's kv_seqs over (positions continue) and only prefills the new
 * suffix as a new turn (kv_seq_reserve_prompt at start_pos = stored length).
 * A session id, when given, selects its entry directly if that entry is a
 * prefix of the prompt.
 *
 * Scopes: every entry carries the 64-bit scope of the request that stored
 * it (the router derives it from the caller's API key and session, see
 * rt_server.c), and insert, match and rewind only ever see entries of the
 * caller's own scope. So a client can neither learn that another scope
 * holds a prefix (no cached_tokens, no timing difference) nor take its
 * entry over or replace it. Scope 0 is an ordinary scope (tests, callers
 * without isolation).
 *
 * Entries form an LRU list (most recent first); under page pressure the
 * scheduler evicts from the least recent end before it preempts running
 * work. A stored entry is never shared: taking it removes it, so each page
 * has exactly one owner (a running request, a cache entry or its pool).
 *
 * The host tier (DESIGN.md §4.10, rt_prefix_tier_init): an entry is either
 * on the device (its seqs hold ids of the device pools) or on the host (the
 * same seqs, rows and heads, holding ids of the host pools: the scheduler
 * moved them with kv_seq_move_pages and told the cache with
 * rt_prefix_set_on_host). Both kinds stay in the one LRU list and match
 * alike; device eviction (rt_prefix_evict_lru, rt_prefix_oldest_device)
 * only ever picks device entries, host eviction (rt_prefix_evict_host_lru)
 * host entries, so the host tier is LRU over the entries it holds. Every
 * function that gives pages back gives a host entry's to the host pools.
 *
 * Matching is O(prompt + entries): the prompt's prefix hashes (64-bit
 * FNV-1a over the token ids) are computed once, every entry's stored hash
 * is compared against the prefix hash of its own length, and only equal
 * hashes are confirmed with a memcmp.
 *
 * Not thread-safe: owned by the scheduler (the router loop thread).
 */
#ifndef RT_PREFIX_H
#define RT_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_list.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"

/* The chunk boundaries of a sequence: positions where its compressed KV
 * is a complete state (a prefill chunk was just committed), with every
 * row's token count there. Compressed rows cannot be cut at an arbitrary
 * position (a chunk's selection depends on the whole chunk), but they can
 * be rewound to any of these. A sequence with per-head lengths (an
 * adaptive method, kv_seq.h) records every head's length too, and a
 * rewind restores them (kv_seq_rewind_heads): a head appends at its own
 * end in position order, so cutting it to its length at the boundary is
 * exactly its state there. */
struct rt_prefix_bounds {
    int64_t *pos;    /* (n) positions, increasing */
    int32_t *rows;   /* (n, width) row tokens at each position */
    int32_t *heads;  /* (n, hwidth) head tokens at each position, or NULL
                        for sequences without per-head lengths */
    int32_t n, cap;
    int32_t width;   /* n_ranks * rows */
    int32_t hwidth;  /* n_ranks * heads per rank, or 0 */
};

/* Appends a boundary at `pos` with the seqs' (n_ranks) written counts
 * (and head lengths when the seqs keep them).
 * A boundary at or below the last one replaces the tail from there.
 * Returns 0 or TG_ENOMEM (the list is unchanged). */
int rt_prefix_bounds_push(struct rt_prefix_bounds *b, int64_t pos,
                          const struct kv_seq *seqs, int n_ranks);

/* Empties the list and frees it; safe on a zeroed one. */
void rt_prefix_bounds_free(struct rt_prefix_bounds *b);

struct rt_prefix_entry {
    struct tg_list_node lru;       /* in rt_prefix.lru (newest first) */
    int32_t *tokens;               /* (n_tokens) token ids whose KV is held */
    int64_t n_tokens;              /* == seqs[r].pos on every rank */
    uint64_t hash;                 /* FNV-1a of tokens */
    uint64_t scope;                /* isolation scope of its owner */
    char *session;                 /* owned copy, or NULL */
    struct kv_seq *seqs;           /* (n_ranks) owned, pages from pools[r]
                                      (host_pools[r] when on_host) */
    struct rt_prefix_bounds bounds; /* owned: where it may be rewound */
    int on_host;                   /* 1: in the host tier (§4.10) */
    uint64_t offload_op;           /* on the host: the scheduler's op still
                                      copying it there, or 0 once done */
};

struct rt_prefix {
    int n_ranks;                   /* T */
    struct tg_list lru;            /* the entries, newest first */
    int64_t n_entries;
    int64_t *pages;                /* (n_ranks) pages held by all entries */
    int64_t n_evictions;           /* entries dropped (LRU, replacement) */
    uint64_t *scratch;             /* (scratch_cap) prefix hashes */
    int64_t scratch_cap;
    /* the host tier (rt_prefix_tier_init), NULL / 0 without one */
    struct kv_pool *host_pools;    /* (n_ranks) borrowed */
    int64_t *host_pages;           /* (n_ranks) pages held by host entries */
    int64_t n_host_entries;
    int64_t n_host_evictions;      /* host entries dropped by
                                      rt_prefix_evict_host_lru */
};

/* The LRU order: the newest and oldest entries, and an entry's older and
 * newer neighbours; NULL past the ends. */
static inline struct rt_prefix_entry *
rt_prefix_newest(const struct rt_prefix *pc)
{
    return TG_LIST_FIRST(&pc->lru, struct rt_prefix_entry, lru);
}

static inline struct rt_prefix_entry *
rt_prefix_oldest(const struct rt_prefix *pc)
{
    return TG_LIST_LAST(&pc->lru, struct rt_prefix_entry, lru);
}

static inline struct rt_prefix_entry *
rt_prefix_older(const struct rt_prefix_entry *e)
{
    return e->lru.next != NULL
               ? TG_LIST_ENTRY(e->lru.next, struct rt_prefix_entry, lru)
               : NULL;
}

static inline struct rt_prefix_entry *
rt_prefix_newer(const struct rt_prefix_entry *e)
{
    return e->lru.prev != NULL
               ? TG_LIST_ENTRY(e->lru.prev, struct rt_prefix_entry, lru)
               : NULL;
}

/* Initialises an empty cache for `n_ranks` >= 1 ranks. Returns 0, TG_EINVAL
 * or TG_ENOMEM (the cache is zeroed then). The caller owns `pc`. */
int rt_prefix_init(struct rt_prefix *pc, int n_ranks, char *err,
                   size_t errlen);

/* Returns every entry's pages to pools[0 .. n_ranks) and frees the cache.
 * Safe on a zeroed or failed-init cache (pools may be NULL then). */
void rt_prefix_free(struct rt_prefix *pc, struct kv_pool *pools);

/* Stores a finished sequence of scope `scope` as the newest entry.
 * seqs[0 .. n_ranks) are moved in (the caller's structs are zeroed on success and keep ownership
 * on failure); every seq must hold exactly positions [0, n_tokens) with its
 * prefill committed, and tokens[0 .. n_tokens) (copied) are the ids of
 * those positions. session may be NULL. An existing entry with the same
 * session id or the same token sequence is replaced (its pages go back to
 * pools). Returns 0, TG_EINVAL (n_tokens < 1 or a seq that does not match)
 * or TG_ENOMEM. */
int rt_prefix_insert(struct rt_prefix *pc, struct kv_pool *pools,
                     const int32_t *tokens, int64_t n_tokens, uint64_t scope,
                     const char *session, struct kv_seq *seqs, char *err,
                     size_t errlen);

/* Finds the entry of scope `scope` to reuse for a prompt
 * tokens[0 .. n_tokens): the entry of `session` (may be NULL) when its sequence is a proper prefix of the
 * prompt, else the longest stored sequence that is a proper prefix (shorter
 * than the prompt, so at least one token is left to prefill), the newest on
 * a tie. *out is that entry (borrowed until the next insert, take, evict or
 * clear) or NULL. Does not change the LRU order. Returns 0 or TG_ENOMEM. */
/* rt_prefix_insert that also stores the sequence's chunk boundaries
 * (*bounds is moved into the entry and zeroed). With them, a later prompt
 * that shares only a prefix of the stored sequence (a client that
 * re-tokenizes the answer differently, a template that drops reasoning)
 * still reuses the KV up to the last boundary inside the shared prefix
 * (rt_prefix_match_rewind). */
int rt_prefix_insert_bounds(struct rt_prefix *pc, struct kv_pool *pools,
                            const int32_t *tokens, int64_t n_tokens,
                            uint64_t scope, const char *session, struct kv_seq *seqs,
                            struct rt_prefix_bounds *bounds, char *err,
                            size_t errlen);

/* rt_prefix_match, and when no entry is a proper prefix of `tokens`, the
 * entry with the most reusable tokens: the last boundary not beyond its
 * common prefix with `tokens`. Rewinding consumes the entry (pages are not
 * shared), so only the session's own entry, or one at least half reused,
 * qualifies (the session's entry wins). That entry is rewound in place (the tail pages go back to the
 * pools at once, kv_seq_rewind, rank r with layouts[r], its own layout
 * of n_ranks entries; a host entry's to the host pools) and returned.
 * Returns 0 or TG_ENOMEM. */
int rt_prefix_match_rewind(struct rt_prefix *pc, struct kv_pool *pools,
                           const struct kv_layout *const *layouts,
                           const int32_t *tokens, int64_t n_tokens,
                           uint64_t scope, const char *session,
                           struct rt_prefix_entry **out);

int rt_prefix_match(struct rt_prefix *pc, const int32_t *tokens,
                    int64_t n_tokens, uint64_t scope, const char *session,
                    struct rt_prefix_entry **out);

/* Removes entry `e` and moves its seqs into seqs_out[0 .. n_ranks) (which
 * the caller then owns, with the pages; whatever seqs_out held is
 * overwritten, so it must be zeroed or already freed). */
void rt_prefix_take(struct rt_prefix *pc, struct rt_prefix_entry *e,
                    struct kv_seq *seqs_out);

/* rt_prefix_take that also moves the entry's boundaries to *bounds_out
 * (whatever it held is freed). */
void rt_prefix_take_bounds(struct rt_prefix *pc, struct rt_prefix_entry *e,
                           struct kv_seq *seqs_out,
                           struct rt_prefix_bounds *bounds_out);

/* Evicts the least recently stored device entry other than `keep` (may be
 * NULL), returning its pages to pools. Returns 1 when an entry was
 * evicted, 0 when there was none. */
int rt_prefix_evict_lru(struct rt_prefix *pc, struct kv_pool *pools,
                        const struct rt_prefix_entry *keep);

/* Drops entry `e` (its pages to pools, or to the host pools for a host
 * entry). */
void rt_prefix_drop(struct rt_prefix *pc, struct kv_pool *pools,
                    struct rt_prefix_entry *e);

/* Evicts every entry (device entries' pages to pools, host entries' to the
 * host pools). */
void rt_prefix_clear(struct rt_prefix *pc, struct kv_pool *pools);

/* Returns the device pages held by all entries on `rank`. */
int64_t rt_prefix_pages(const struct rt_prefix *pc, int rank);

/* ---- the host tier (DESIGN.md §4.10) ---------------------------------- */

/* Gives the cache a host tier: host_pools[0 .. n_ranks) (borrowed, must
 * outlive the cache) take the pages of entries on the host. Returns 0 or
 * TG_ENOMEM (no tier then). */
int rt_prefix_tier_init(struct rt_prefix *pc, struct kv_pool *host_pools,
                        char *err, size_t errlen);

/* The least recently stored device entry other than `keep`, or NULL. */
struct rt_prefix_entry *rt_prefix_oldest_device(
    const struct rt_prefix *pc, const struct rt_prefix_entry *keep);

/* Device entry `e`, whose seqs the caller just moved to the host pools
 * (kv_seq_move_pages on every rank), is now on the host; its place in the
 * LRU list stays. */
void rt_prefix_set_on_host(struct rt_prefix *pc, struct rt_prefix_entry *e);

/* Drops the least recently stored host entry other than `keep` (may be
 * NULL; its pages to the host pools). Returns 1 when one was dropped, 0
 * when there was none. */
int rt_prefix_evict_host_lru(struct rt_prefix *pc,
                             const struct rt_prefix_entry *keep);

/* Drops every host entry (their pages to the host pools) and returns how
 * many there were. */
int64_t rt_prefix_clear_host(struct rt_prefix *pc);

/* Returns the host pages held by host entries on `rank` (0 without a
 * tier). */
int64_t rt_prefix_host_pages(const struct rt_prefix *pc, int rank);

#endif /* RT_PREFIX_H */
