/* kv_pool.c — per-rank page pool: a downward-growing stack of free page
 * ids with bulk pop/push (see kv_pool.h). */
#include "common/kv/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

static size_t bitmap_words(int32_t n) { return ((size_t)n + 63) / 64; }

static int bit_get(const uint64_t *bits, int32_t i)
{
    return (int)((bits[(size_t)i >> 6] >> (i & 63)) & 1u);
}

static void bit_set(uint64_t *bits, int32_t i)
{
    bits[(size_t)i >> 6] |= (uint64_t)1 << (i & 63);
}

static void bit_clear(uint64_t *bits, int32_t i)
{
    bits[(size_t)i >> 6] &= ~((uint64_t)1 << (i & 63));
}

int kv_pool_init(struct kv_pool *pool, int32_t n_pages, char *err,
                 size_t errlen)
{
    memset(pool, 0, sizeof(*pool));
    if (n_pages < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_pool: page count %d is negative", (int)n_pages);
    /* One extra slot so a zero-page pool still has a valid array. */
    pool->stack = malloc(((size_t)n_pages + 1) * sizeof(int32_t));
    if (pool->stack == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_pool: cannot allocate a stack of %d pages",
                          (int)n_pages);
    /* calloc: untouched pages of a large pool cost nothing until shared. */
    pool->refs = calloc((size_t)n_pages + 1, sizeof(int32_t));
    if (pool->refs == NULL) {
        free(pool->stack);
        pool->stack = NULL;
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_pool: cannot allocate the reference counts of "
                          "%d pages", (int)n_pages);
    }
    for (int32_t i = 0; i < n_pages; i++)
        pool->stack[i] = i;
    pool->n_total = n_pages;
    pool->n_free = n_pages;
    return 0;
}

void kv_pool_free(struct kv_pool *pool)
{
    free(pool->stack);
    free(pool->in_use);
    free(pool->refs);
    memset(pool, 0, sizeof(*pool));
}

const int32_t *kv_pool_pop_view(struct kv_pool *pool, int32_t n)
{
    if (n < 0 || n > pool->n_free)
        return NULL;
    const int32_t *top = pool->stack + (pool->n_total - pool->n_free);
    pool->n_free -= n;
    int32_t used = pool->n_total - pool->n_free;
    if (used > pool->high_water)
        pool->high_water = used;
    if (pool->in_use != NULL)
        for (int32_t i = 0; i < n; i++)
            bit_set(pool->in_use, top[i]);
    return top;
}

int kv_pool_pop(struct kv_pool *pool, int32_t n, int32_t *out)
{
    if (n < 0)
        return TG_EINVAL;
    const int32_t *ids = kv_pool_pop_view(pool, n);
    if (ids == NULL)
        return TG_ENOSPC;
    if (n > 0)
        memcpy(out, ids, (size_t)n * sizeof(int32_t));
    return 0;
}

/* With tracking on: every id must be in range, in use, and appear once.
 * Clears the bits as it goes and restores them if an id fails, so a
 * rejected push leaves the bitmap unchanged. A shared page's bit is set
 * again by the caller once the push stands (it stays taken). */
static int track_push(struct kv_pool *pool, int32_t n, const int32_t *ids)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= pool->n_total || !bit_get(pool->in_use, id)) {
            for (int32_t j = 0; j < i; j++)
                bit_set(pool->in_use, ids[j]);
            return TG_EINVAL;
        }
        bit_clear(pool->in_use, id);
    }
    return 0;
}

/* Push while some page of the pool is shared: shared pages lose one
 * reference, the others are stacked in the order of ids, exactly where a
 * plain push of just them would put them. */
static void push_shared(struct kv_pool *pool, int32_t n, const int32_t *ids)
{
    int32_t back = 0;
    for (int32_t i = 0; i < n; i++)
        back += pool->refs[ids[i]] == 0;
    pool->n_free += back;
    int32_t *dst = pool->stack + (pool->n_total - pool->n_free);
    for (int32_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (pool->refs[id] == 0) {
            *dst++ = id;
            continue;
        }
        if (--pool->refs[id] == 0)
            pool->n_shared--;
        if (pool->in_use != NULL)
            bit_set(pool->in_use, id); /* still taken by its other owners */
    }
}

int kv_pool_push(struct kv_pool *pool, int32_t n, const int32_t *ids)
{
    if (n < 0 || n > pool->n_total - pool->n_free)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (pool->in_use != NULL) {
        int rc = track_push(pool, n, ids);
        if (rc != 0)
            return rc;
    }
    if (pool->n_shared > 0) {
        push_shared(pool, n, ids);
        return 0;
    }
    pool->n_free += n;
    memcpy(pool->stack + (pool->n_total - pool->n_free), ids,
           (size_t)n * sizeof(int32_t));
    return 0;
}

int kv_pool_ref(struct kv_pool *pool, int32_t n, const int32_t *ids)
{
    if (n < 0 || (n > 0 && ids == NULL))
        return TG_EINVAL;
    /* Validate everything first: all or nothing. A page listed k <= n
     * times gains k owners, so a page within n owners of INT32_MAX is
     * refused (conservative, and unreachable in practice). */
    for (int32_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= pool->n_total)
            return TG_EINVAL;
        if (pool->in_use != NULL && !bit_get(pool->in_use, id))
            return TG_EINVAL;
        if (pool->refs[id] >= INT32_MAX - 1 - n)
            return TG_EINVAL;
    }
    for (int32_t i = 0; i < n; i++)
        if (pool->refs[ids[i]]++ == 0)
            pool->n_shared++;
    return 0;
}

int32_t kv_pool_owners(const struct kv_pool *pool, int32_t id)
{
    if (id < 0 || id >= pool->n_total)
        return 0;
    if (pool->in_use != NULL && !bit_get(pool->in_use, id))
        return 0;
    return 1 + pool->refs[id];
}

int32_t kv_pool_n_shared(const struct kv_pool *pool)
{
    return pool->n_shared;
}

int32_t kv_pool_n_total(const struct kv_pool *pool) { return pool->n_total; }

int32_t kv_pool_n_free(const struct kv_pool *pool) { return pool->n_free; }

int32_t kv_pool_n_used(const struct kv_pool *pool)
{
    return pool->n_total - pool->n_free;
}

int32_t kv_pool_high_water(const struct kv_pool *pool)
{
    return pool->high_water;
}

double kv_pool_reclaimed_ratio(const struct kv_pool *pool)
{
    if (pool->mono_pages <= 0)
        return 0.0;
    return 1.0 - (double)kv_pool_n_used(pool) / (double)pool->mono_pages;
}

int kv_pool_debug_track(struct kv_pool *pool, char *err, size_t errlen)
{
    if (pool->in_use != NULL)
        return 0;
    size_t words = bitmap_words(pool->n_total);
    uint64_t *bits = malloc((words ? words : 1) * sizeof(uint64_t));
    if (bits == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_pool: cannot allocate the debug bitmap");
    /* Everything in use, then clear the free ids. */
    memset(bits, 0xff, (words ? words : 1) * sizeof(uint64_t));
    const int32_t *free_ids = pool->stack + (pool->n_total - pool->n_free);
    for (int32_t i = 0; i < pool->n_free; i++)
        bit_clear(bits, free_ids[i]);
    pool->in_use = bits;
    return 0;
}

int kv_pool_validate(const struct kv_pool *pool, char *err, size_t errlen)
{
    if (pool->n_total < 0 || pool->n_free < 0 || pool->n_free > pool->n_total)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "kv_pool: free count %d outside [0, %d]",
                          (int)pool->n_free, (int)pool->n_total);
    if (pool->high_water < kv_pool_n_used(pool))
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "kv_pool: high-water mark %d below used %d",
                          (int)pool->high_water, (int)kv_pool_n_used(pool));
    size_t words = bitmap_words(pool->n_total);
    uint64_t *seen = calloc(words ? words : 1, sizeof(uint64_t));
    if (seen == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_pool: cannot allocate the check bitmap");
    int rc = 0;
    const int32_t *free_ids = pool->stack + (pool->n_total - pool->n_free);
    for (int32_t i = 0; i < pool->n_free && rc == 0; i++) {
        int32_t id = free_ids[i];
        if (id < 0 || id >= pool->n_total)
            rc = tg_err_set(err, errlen, TG_EINTERNAL,
                            "kv_pool: free slot %d holds id %d out of range",
                            (int)i, (int)id);
        else if (bit_get(seen, id))
            rc = tg_err_set(err, errlen, TG_EINTERNAL,
                            "kv_pool: page %d is free twice", (int)id);
        else
            bit_set(seen, id);
    }
    int32_t shared = 0;
    for (int32_t id = 0; id < pool->n_total && rc == 0; id++) {
        if (pool->refs[id] < 0)
            rc = tg_err_set(err, errlen, TG_EINTERNAL,
                            "kv_pool: page %d has %d references", (int)id,
                            (int)pool->refs[id]);
        else if (pool->refs[id] > 0 && bit_get(seen, id))
            rc = tg_err_set(err, errlen, TG_EINTERNAL,
                            "kv_pool: page %d is free but keeps %d "
                            "references", (int)id, (int)pool->refs[id]);
        shared += pool->refs[id] > 0;
    }
    if (rc == 0 && shared != pool->n_shared)
        rc = tg_err_set(err, errlen, TG_EINTERNAL,
                        "kv_pool: %d pages are shared, the count says %d",
                        (int)shared, (int)pool->n_shared);
    if (rc == 0 && pool->in_use != NULL) {
        for (int32_t id = 0; id < pool->n_total; id++) {
            if (bit_get(seen, id) == bit_get(pool->in_use, id)) {
                rc = tg_err_set(err, errlen, TG_EINTERNAL,
                                "kv_pool: page %d is %s but the bitmap says "
                                "otherwise",
                                (int)id, bit_get(seen, id) ? "free" : "taken");
                break;
            }
        }
    }
    free(seen);
    return rc;
}
