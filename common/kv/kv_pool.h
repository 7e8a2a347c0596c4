/*
 * kv_pool.h — one rank's pool of equal-size KV pages (DESIGN.md §4.5).
 *
 * A page holds [H_p][2][P][d] elements of one (layer, group); every
 * (layer, group) table of the rank draws from the same pool, so the pool
 * only deals in page ids 0 .. n_total-1. The router keeps one pool per rank
 * for accounting; a worker keeps the same ids for its physical slab.
 *
 * Free pages form a stack of int32 ids. The stack grows downward inside a
 * fixed array: the free ids are stack[n_total - n_free .. n_total), top
 * first. Popping n pages is one contiguous read from the top and pushing n
 * pages one contiguous write below it, so admission takes all of a
 * request's pages with a single memcpy. Popping n pages one at a time
 * yields exactly the same ids in the same order as one pop of n (the
 * benchmark baseline relies on that), and pushing ids[0..n) at once equals
 * pushing ids[n-1], ..., ids[0] one at a time.
 *
 * The pool also aggregates the "monolithic" page count of the requests it
 * serves (maintained by kv_seq.c): the pages an all-heads layout, where
 * every (layer, group) of a request is as long as its longest one, would
 * need. The server reports kv_pages_reclaimed_ratio = 1 - used/monolithic.
 *
 * Shared pages (parallel samples, DESIGN.md §4.5, docs/API.md `n`): a
 * page taken once may gain more owners through kv_pool_ref; each owner
 * gives it back with an ordinary push, and the page returns to the free
 * stack only when its last owner pushes it. refs[id] counts the owners
 * beyond the first (0 for a page with one owner, and for every free page),
 * so pop never touches it. n_shared counts the pages with refs > 0: while
 * it is 0, push is the single memcpy above; otherwise push walks its ids,
 * dropping one reference from a shared page and stacking the others (in
 * the same order a plain push would). Pages used (n_total - n_free) counts
 * distinct pages, however many owners they have.
 *
 * Debug tracking (a bitmap of pages in use) catches double frees and
 * foreign ids at push time: a page pushed more times than it has owners
 * is a double free. It is off by default because it costs a pass over
 * every id, and tests switch it on.
 *
 * Not thread-safe: one owner (the router loop, or a worker) per pool.
 */
#ifndef KV_POOL_H
#define KV_POOL_H

#include <stddef.h>
#include <stdint.h>

struct kv_pool {
    int32_t n_total;    /* pages in the pool */
    int32_t n_free;     /* pages on the free stack */
    int32_t high_water; /* most pages ever in use at once */
    int32_t *stack;     /* (n_total) free ids at [n_total - n_free, n_total) */
    uint64_t *in_use;   /* (ceil(n_total / 64)) bit set = page taken; NULL
                           unless debug tracking is on */
    int64_t mono_pages; /* monolithic-layout pages of the live requests, in
                           H_p-head page units (kept by kv_seq.c) */
    int32_t *refs;      /* (n_total) owners beyond the first of each page
                           taken; 0 for free pages */
    int32_t n_shared;   /* pages with refs > 0 */
};

/* Initialises `pool` with `n_pages` free pages (ids 0..n_pages-1; the first
 * pop returns 0, 1, 2, ...). n_pages in [0, INT32_MAX]. Returns 0,
 * TG_EINVAL or TG_ENOMEM; on failure the pool is zeroed and safe to free.
 * The caller owns the storage of `pool`. */
int kv_pool_init(struct kv_pool *pool, int32_t n_pages, char *err,
                 size_t errlen);

/* Releases the pool's memory. Safe on a zeroed or failed-init pool. */
void kv_pool_free(struct kv_pool *pool);

/* Takes `n` pages in one operation and copies their ids to out[0..n).
 * Returns 0, TG_EINVAL (n < 0) or TG_ENOSPC when fewer than n pages are
 * free, in which case nothing is taken and out is untouched. */
int kv_pool_pop(struct kv_pool *pool, int32_t n, int32_t *out);

/* Takes `n` pages like kv_pool_pop but copies nothing: returns a pointer to
 * their n ids inside the pool's stack, valid until the next push on this
 * pool (the caller copies them where they belong). Returns NULL, taking
 * nothing, when n < 0 or fewer than n pages are free. */
const int32_t *kv_pool_pop_view(struct kv_pool *pool, int32_t n);

/* Gives up one ownership of each of the `n` pages ids[0..n): a page with
 * other owners loses one reference and stays taken; a page with a single
 * owner goes back to the free stack (in one copy when no page of the pool
 * is shared). The ids must have come from this pool and be in use.
 * Returns 0, or TG_EINVAL when more pages would be free than exist; with
 * debug tracking on also TG_EINVAL for an id out of range, a page already
 * free (double free) or an id repeated within ids. On failure nothing
 * changes. */
int kv_pool_push(struct kv_pool *pool, int32_t n, const int32_t *ids);

/* Adds one owner to each of the `n` pages ids[0..n), which must be taken
 * (the new owner gives each back with kv_pool_push like any page; an id
 * listed twice gains two owners). The pool's counters do not move: a
 * shared page is one page used. Returns 0, or TG_EINVAL (n < 0, an id out
 * of range, a page at INT32_MAX owners, or with debug tracking on a free
 * page); on failure nothing changes. Costs one pass over the ids. */
int kv_pool_ref(struct kv_pool *pool, int32_t n, const int32_t *ids);

/* Owners of page `id`: 0 when it is free (known only with debug tracking
 * on; otherwise a free page reads 1), else 1 + its extra references.
 * For tests and checks. */
int32_t kv_pool_owners(const struct kv_pool *pool, int32_t id);

/* Pages with more than one owner. */
int32_t kv_pool_n_shared(const struct kv_pool *pool);

/* Counters. kv_pool_n_used = n_total - n_free. */
int32_t kv_pool_n_total(const struct kv_pool *pool);
int32_t kv_pool_n_free(const struct kv_pool *pool);
int32_t kv_pool_n_used(const struct kv_pool *pool);
int32_t kv_pool_high_water(const struct kv_pool *pool);

/* Returns 1 - used / monolithic for the live requests (0 when no request
 * holds pages): the fraction of an all-heads layout's pages that ragged
 * paging saves. */
double kv_pool_reclaimed_ratio(const struct kv_pool *pool);

/* Switches debug tracking on: builds the in-use bitmap from the current
 * free stack, after which push checks every id. Idempotent. Returns 0 or
 * TG_ENOMEM. Not for the hot path. */
int kv_pool_debug_track(struct kv_pool *pool, char *err, size_t errlen);

/* Checks the pool's invariants without changing it: free count in range,
 * every free id in range and on the stack once, high-water mark >= used,
 * and (with tracking on) the bitmap marks exactly the pages not on the
 * stack, no free page holds references and n_shared matches the pages
 * that do. Returns 0, TG_EINTERNAL naming the first violation, or TG_ENOMEM.
 * For tests and debugging; O(n_total). */
int kv_pool_validate(const struct kv_pool *pool, char *err, size_t errlen);

#endif /* KV_POOL_H */
