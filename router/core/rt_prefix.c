/* rt_prefix.c — LRU cache of finished sequences' compressed KV for
 * multi-turn reuse (see rt_prefix.h). */
#include "router/core/rt_prefix.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* 64-bit FNV-1a (Fowler, Noll, Vo): offset basis and prime from the
 * published parameters; each token id is mixed in as one 32-bit unit. */
#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t hash_step(uint64_t h, int32_t tok)
{
    return (h ^ (uint32_t)tok) * FNV_PRIME;
}

static uint64_t hash_tokens(const int32_t *tokens, int64_t n)
{
    uint64_t h = FNV_OFFSET;
    for (int64_t i = 0; i < n; i++)
        h = hash_step(h, tokens[i]);
    return h;
}

void rt_prefix_bounds_free(struct rt_prefix_bounds *b)
{
    free(b->pos);
    free(b->rows);
    free(b->heads);
    memset(b, 0, sizeof(*b));
}

int rt_prefix_bounds_push(struct rt_prefix_bounds *b, int64_t pos,
                          const struct kv_seq *seqs, int n_ranks)
{
    int32_t rows = seqs[0].n_rows;
    int32_t width = n_ranks * rows;
    int32_t heads = seqs[0].head_len != NULL ? seqs[0].n_heads : 0;
    int32_t hwidth = n_ranks * heads;
    if (b->n > 0 && (b->width != width || b->hwidth != hwidth))
        return TG_EINVAL;
    int32_t n = b->n;
    while (n > 0 && b->pos[n - 1] >= pos)
        n--; /* a rewound sequence grows again from an earlier point */
    if (n == b->cap) {
        /* One capacity for all: an element of rows is `width` ids, of
         * heads `hwidth` lengths; cap moves once all have grown. */
        int32_t c1 = b->cap, c2 = c1, c3 = c1;
        if (TG_GROW(b->pos, &c1, (int64_t)n + 1) ||
            tg_grow_i32((void **)&b->rows, &c2, (int64_t)n + 1,
                        (size_t)width * sizeof(int32_t)) ||
            (hwidth > 0 && tg_grow_i32((void **)&b->heads, &c3, (int64_t)n + 1,
                                       (size_t)hwidth * sizeof(int32_t))))
            return TG_ENOMEM;
        b->cap = c1;
    }
    if (hwidth > 0 && b->heads == NULL &&
        (b->heads = malloc((size_t)b->cap * (size_t)hwidth *
                           sizeof(int32_t))) == NULL)
        return TG_ENOMEM;
    b->width = width;
    b->hwidth = hwidth;
    for (int r = 0; r < n_ranks && hwidth > 0; r++)
        memcpy(b->heads + (size_t)n * hwidth + (size_t)r * heads,
               seqs[r].head_len, (size_t)heads * sizeof(int32_t));
    b->pos[n] = pos;
    for (int r = 0; r < n_ranks; r++)
        memcpy(b->rows + (size_t)n * width + (size_t)r * rows, seqs[r].filled,
               (size_t)rows * sizeof(int32_t));
    b->n = n + 1;
    return 0;
}

int rt_prefix_init(struct rt_prefix *pc, int n_ranks, char *err,
                   size_t errlen)
{
    memset(pc, 0, sizeof(*pc));
    if (n_ranks < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_prefix: %d ranks", n_ranks);
    pc->pages = calloc((size_t)n_ranks, sizeof(int64_t));
    if (pc->pages == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "rt_prefix: cannot allocate rank counters");
    pc->n_ranks = n_ranks;
    return 0;
}

static void unlink_entry(struct rt_prefix *pc, struct rt_prefix_entry *e)
{
    tg_list_remove(&pc->lru, &e->lru);
    pc->n_entries--;
    int64_t *held = e->on_host ? pc->host_pages : pc->pages;
    pc->n_host_entries -= e->on_host;
    for (int r = 0; r < pc->n_ranks; r++)
        held[r] -= e->seqs[r].used_pages;
}

static void free_entry(struct rt_prefix_entry *e)
{
    rt_prefix_bounds_free(&e->bounds);
    free(e->tokens);
    free(e->session);
    free(e->seqs);
    free(e);
}

/* Unlinks `e`, gives its pages back and frees it. */
static void drop_entry(struct rt_prefix *pc, struct kv_pool *pools,
                       struct rt_prefix_entry *e)
{
    unlink_entry(pc, e);
    struct kv_pool *own = e->on_host ? pc->host_pools : pools;
    for (int r = 0; r < pc->n_ranks; r++)
        kv_seq_free(&e->seqs[r], &own[r]);
    free_entry(e);
    pc->n_evictions++;
}

void rt_prefix_drop(struct rt_prefix *pc, struct kv_pool *pools,
                    struct rt_prefix_entry *e)
{
    drop_entry(pc, pools, e);
}

void rt_prefix_clear(struct rt_prefix *pc, struct kv_pool *pools)
{
    while (rt_prefix_oldest(pc) != NULL)
        drop_entry(pc, pools, rt_prefix_oldest(pc));
}

void rt_prefix_free(struct rt_prefix *pc, struct kv_pool *pools)
{
    TG_ASSERT(pools != NULL || rt_prefix_oldest(pc) == NULL);
    if (rt_prefix_oldest(pc) != NULL)
        rt_prefix_clear(pc, pools);
    free(pc->pages);
    free(pc->host_pages);
    free(pc->scratch);
    memset(pc, 0, sizeof(*pc));
}

int rt_prefix_insert(struct rt_prefix *pc, struct kv_pool *pools,
                     const int32_t *tokens, int64_t n_tokens, uint64_t scope,
                     const char *session, struct kv_seq *seqs, char *err,
                     size_t errlen)
{
    struct rt_prefix_bounds none = {0};
    return rt_prefix_insert_bounds(pc, pools, tokens, n_tokens, scope, session,
                                   seqs,
                                   &none, err, errlen);
}

int rt_prefix_insert_bounds(struct rt_prefix *pc, struct kv_pool *pools,
                            const int32_t *tokens, int64_t n_tokens,
                            uint64_t scope, const char *session,
                            struct kv_seq *seqs,
                            struct rt_prefix_bounds *bounds, char *err,
                            size_t errlen)
{
    if (n_tokens < 1 || tokens == NULL || seqs == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_prefix: cannot store %lld tokens",
                          (long long)n_tokens);
    for (int r = 0; r < pc->n_ranks; r++) {
        const struct kv_seq *q = &seqs[r];
        if (q->pos != n_tokens || q->committed != q->turn_len)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "rt_prefix: rank %d seq holds %lld positions "
                              "(%lld uncommitted), key has %lld tokens", r,
                              (long long)q->pos,
                              (long long)(q->turn_len - q->committed),
                              (long long)n_tokens);
    }
    struct rt_prefix_entry *e = calloc(1, sizeof(*e));
    if (e == NULL)
        goto oom;
    e->tokens = malloc((size_t)n_tokens * sizeof(int32_t));
    e->seqs = malloc((size_t)pc->n_ranks * sizeof(struct kv_seq));
    if (e->tokens == NULL || e->seqs == NULL)
        goto oom;
    if (session != NULL && (e->session = strdup(session)) == NULL)
        goto oom;
    memcpy(e->tokens, tokens, (size_t)n_tokens * sizeof(int32_t));
    e->n_tokens = n_tokens;
    e->hash = hash_tokens(tokens, n_tokens);
    e->scope = scope;
    /* Boundaries past the stored positions cannot be rewound to. */
    while (bounds->n > 0 && bounds->pos[bounds->n - 1] > n_tokens)
        bounds->n--;
    e->bounds = *bounds;
    memset(bounds, 0, sizeof(*bounds));

    /* One entry per session and per sequence within a scope: the newer
     * turn replaces the older one, whose KV no prompt of that scope would
     * prefer any more. Another scope's entries are never touched. */
    struct rt_prefix_entry *x = rt_prefix_newest(pc);
    while (x != NULL) {
        struct rt_prefix_entry *next = rt_prefix_older(x);
        if (x->scope != scope) {
            x = next;
            continue;
        }
        int same_session = session != NULL && x->session != NULL &&
                           strcmp(session, x->session) == 0;
        int same_tokens = x->n_tokens == n_tokens && x->hash == e->hash &&
                          memcmp(x->tokens, tokens,
                                 (size_t)n_tokens * sizeof(int32_t)) == 0;
        if (same_session || same_tokens)
            drop_entry(pc, pools, x);
        x = next;
    }

    memcpy(e->seqs, seqs, (size_t)pc->n_ranks * sizeof(struct kv_seq));
    memset(seqs, 0, (size_t)pc->n_ranks * sizeof(struct kv_seq));
    tg_list_push_front(&pc->lru, &e->lru);
    pc->n_entries++;
    for (int r = 0; r < pc->n_ranks; r++)
        pc->pages[r] += e->seqs[r].used_pages;
    return 0;
oom:
    if (e != NULL)
        free_entry(e);
    return tg_err_set(err, errlen, TG_ENOMEM,
                      "rt_prefix: cannot store an entry of %lld tokens",
                      (long long)n_tokens);
}

static int is_prefix(const struct rt_prefix_entry *e, const int32_t *tokens,
                     int64_t n_tokens, const uint64_t *prefix_hash)
{
    return e->n_tokens < n_tokens && prefix_hash[e->n_tokens] == e->hash &&
           memcmp(e->tokens, tokens, (size_t)e->n_tokens * sizeof(int32_t)) ==
               0;
}

int rt_prefix_match(struct rt_prefix *pc, const int32_t *tokens,
                    int64_t n_tokens, uint64_t scope, const char *session,
                    struct rt_prefix_entry **out)
{
    *out = NULL;
    if (pc->n_entries == 0 || n_tokens < 2)
        return 0;
    if (pc->scratch_cap < n_tokens) {
        uint64_t *h = realloc(pc->scratch, (size_t)n_tokens * sizeof(*h));
        if (h == NULL)
            return TG_ENOMEM;
        pc->scratch = h;
        pc->scratch_cap = n_tokens;
    }
    /* scratch[i] = hash of tokens[0 .. i); an entry is a proper prefix
     * only when shorter than the prompt, so indices < n_tokens suffice. */
    uint64_t *ph = pc->scratch;
    ph[0] = FNV_OFFSET;
    for (int64_t i = 1; i < n_tokens; i++)
        ph[i] = hash_step(ph[i - 1], tokens[i - 1]);

    struct rt_prefix_entry *best = NULL;
    for (struct rt_prefix_entry *e = rt_prefix_newest(pc); e != NULL;
         e = rt_prefix_older(e)) {
        if (e->scope != scope || !is_prefix(e, tokens, n_tokens, ph))
            continue;
        if (session != NULL && e->session != NULL &&
            strcmp(session, e->session) == 0) {
            best = e; /* the session's own entry wins outright */
            break;
        }
        if (best == NULL || e->n_tokens > best->n_tokens)
            best = e;
    }
    *out = best;
    return 0;
}

/* Returns the tokens `e` can give a prompt of n tokens: the last boundary
 * not beyond their common prefix (and short of the prompt, so that at
 * least one token is prefilled); *which gets that boundary's index. */
static int64_t reusable(const struct rt_prefix_entry *e, const int32_t *tokens,
                        int64_t n, int32_t *which)
{
    int64_t lim = e->n_tokens < n - 1 ? e->n_tokens : n - 1;
    int64_t lcp = 0;
    while (lcp < lim && e->tokens[lcp] == tokens[lcp])
        lcp++;
    for (int32_t i = e->bounds.n - 1; i >= 0; i--) {
        if (e->bounds.pos[i] <= lcp) {
            *which = i;
            return e->bounds.pos[i];
        }
    }
    return 0;
}

int rt_prefix_match_rewind(struct rt_prefix *pc, struct kv_pool *pools,
                           const struct kv_layout *const *layouts,
                           const int32_t *tokens, int64_t n_tokens,
                           uint64_t scope, const char *session,
                           struct rt_prefix_entry **out)
{
    int rc = rt_prefix_match(pc, tokens, n_tokens, scope, session, out);
    if (rc != 0 || *out != NULL || pc->n_entries == 0 || n_tokens < 2)
        return rc;
    struct rt_prefix_entry *best = NULL;
    int64_t best_n = 0;
    int32_t best_i = -1;
    for (struct rt_prefix_entry *e = rt_prefix_newest(pc); e != NULL;
         e = rt_prefix_older(e)) {
        if (e->scope != scope)
            continue;
        int32_t i = -1;
        int64_t got = reusable(e, tokens, n_tokens, &i);
        if (got <= 0)
            continue;
        int own = session != NULL && e->session != NULL &&
                  strcmp(session, e->session) == 0;
        /* Pages are never shared, so rewinding consumes the entry: only
         * worth it for the conversation's own entry, or when at least half
         * of it is reused (the same conversation with a re-tokenized
         * answer), not to save a few tokens of someone else's. */
        if (!own && got * 2 < e->n_tokens)
            continue;
        if (own) {
            best = e;
            best_n = got;
            best_i = i;
            break;
        }
        if (got > best_n) {
            best = e;
            best_n = got;
            best_i = i;
        }
    }
    if (best == NULL)
        return 0;
    /* Every rank has the same rows (L * G/T); only budgets differ. */
    int32_t rows = layouts[0]->n_layers * layouts[0]->n_groups;
    int32_t heads = best->bounds.hwidth / pc->n_ranks;
    int64_t *held = best->on_host ? pc->host_pages : pc->pages;
    struct kv_pool *own = best->on_host ? pc->host_pools : pools;
    for (int r = 0; r < pc->n_ranks; r++) {
        held[r] -= best->seqs[r].used_pages;
        const int32_t *ht =
            heads > 0 ? best->bounds.heads +
                            (size_t)best_i * best->bounds.hwidth +
                            (size_t)r * (size_t)heads
                      : NULL;
        rc = kv_seq_rewind_heads(&best->seqs[r], layouts[r], &own[r], best_n,
                                 best->bounds.rows +
                                     (size_t)best_i * best->bounds.width +
                                     (size_t)r * (size_t)rows,
                                 ht, NULL, 0);
        held[r] += best->seqs[r].used_pages;
        /* The boundary was recorded from these very seqs: a refusal is a
         * broken invariant. */
        TG_ASSERT(rc == 0);
    }
    best->n_tokens = best_n;
    best->hash = hash_tokens(best->tokens, best_n);
    best->bounds.n = best_i + 1;
    *out = best;
    return 0;
}

void rt_prefix_take_bounds(struct rt_prefix *pc, struct rt_prefix_entry *e,
                           struct kv_seq *seqs_out,
                           struct rt_prefix_bounds *bounds_out)
{
    rt_prefix_bounds_free(bounds_out);
    *bounds_out = e->bounds;
    memset(&e->bounds, 0, sizeof(e->bounds));
    rt_prefix_take(pc, e, seqs_out);
}

void rt_prefix_take(struct rt_prefix *pc, struct rt_prefix_entry *e,
                    struct kv_seq *seqs_out)
{
    unlink_entry(pc, e);
    memcpy(seqs_out, e->seqs, (size_t)pc->n_ranks * sizeof(struct kv_seq));
    free_entry(e);
}

struct rt_prefix_entry *rt_prefix_oldest_device(
    const struct rt_prefix *pc, const struct rt_prefix_entry *keep)
{
    struct rt_prefix_entry *e = rt_prefix_oldest(pc);
    while (e != NULL && (e == keep || e->on_host))
        e = rt_prefix_newer(e);
    return e;
}

int rt_prefix_evict_lru(struct rt_prefix *pc, struct kv_pool *pools,
                        const struct rt_prefix_entry *keep)
{
    struct rt_prefix_entry *e = rt_prefix_oldest_device(pc, keep);
    if (e == NULL)
        return 0;
    drop_entry(pc, pools, e);
    return 1;
}

int rt_prefix_tier_init(struct rt_prefix *pc, struct kv_pool *host_pools,
                        char *err, size_t errlen)
{
    TG_ASSERT(pc->host_pools == NULL && host_pools != NULL);
    pc->host_pages = calloc((size_t)pc->n_ranks, sizeof(int64_t));
    if (pc->host_pages == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "rt_prefix: cannot allocate host counters");
    pc->host_pools = host_pools;
    return 0;
}

void rt_prefix_set_on_host(struct rt_prefix *pc, struct rt_prefix_entry *e)
{
    TG_ASSERT(pc->host_pools != NULL && !e->on_host);
    e->on_host = 1;
    pc->n_host_entries++;
    for (int r = 0; r < pc->n_ranks; r++) {
        pc->pages[r] -= e->seqs[r].used_pages;
        pc->host_pages[r] += e->seqs[r].used_pages;
    }
}

int rt_prefix_evict_host_lru(struct rt_prefix *pc,
                             const struct rt_prefix_entry *keep)
{
    struct rt_prefix_entry *e = rt_prefix_oldest(pc);
    while (e != NULL && (!e->on_host || e == keep))
        e = rt_prefix_newer(e);
    if (e == NULL)
        return 0;
    drop_entry(pc, NULL, e);
    pc->n_host_evictions++;
    return 1;
}

int64_t rt_prefix_clear_host(struct rt_prefix *pc)
{
    int64_t n = 0;
    for (struct rt_prefix_entry *e = rt_prefix_oldest(pc), *next; e != NULL;
         e = next) {
        next = rt_prefix_newer(e);
        if (e->on_host) {
            drop_entry(pc, NULL, e);
            n++;
        }
    }
    return n;
}

int64_t rt_prefix_host_pages(const struct rt_prefix *pc, int rank)
{
    TG_ASSERT(rank >= 0 && rank < pc->n_ranks);
    return pc->host_pages != NULL ? pc->host_pages[rank] : 0;
}

int64_t rt_prefix_pages(const struct rt_prefix *pc, int rank)
{
    TG_ASSERT(rank >= 0 && rank < pc->n_ranks);
    return pc->pages[rank];
}
