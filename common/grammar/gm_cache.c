/* gm_cache.c — the thread-safe compile cache (gm_cache.h). */
#include "common/grammar/gm_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "common/base/tg_hmap.h"

#define ERR_BYTES 256

struct gm__centry {
    struct tg_list_node lru; /* in c->lru while in the index */
    uint64_t hash;
    char *key;
    size_t len;
    int ready;                   /* 0 while being compiled */
    int waiters;                 /* threads waiting for it */
    int doomed;                  /* a transient failure: dropped once read */
    int code;                    /* compile result */
    struct gm_grammar *g;        /* code == 0: one reference held */
    char err[ERR_BYTES];
    size_t bytes;
};

/* The index: a slot is an entry pointer (NULL empty) keyed by its spec;
 * entries keep their hash, so growing needs no context. */
struct spec_key {
    const char *spec;
    size_t len;
    uint64_t hash;
};

static inline int entry_probe(const void *slot, const void *key)
{
    const struct gm__centry *e = *(struct gm__centry *const *)slot;
    const struct spec_key *k = key;
    if (e == NULL)
        return TG_HMAP_EMPTY;
    return e->hash == k->hash && e->len == k->len &&
                   memcmp(e->key, k->spec, k->len) == 0
               ? TG_HMAP_HIT
               : TG_HMAP_MISS;
}

static int entry_empty(const void *slot)
{
    return *(struct gm__centry *const *)slot == NULL;
}

static uint64_t entry_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return (*(struct gm__centry *const *)slot)->hash;
}

static const struct tg_hmap_type entry_type = {
    .esize = sizeof(struct gm__centry *),
    .empty_byte = 0,
    .probe = entry_probe,
    .is_empty = entry_empty,
    .hash = entry_hash,
};

static struct gm__centry *entry_of(struct tg_list_node *n)
{
    return n != NULL ? TG_LIST_ENTRY(n, struct gm__centry, lru) : NULL;
}

int gm_cache_init(struct gm_cache *c, const struct gm_vocab *v,
                  const struct gm_limits *lim, size_t max_entries,
                  size_t max_bytes)
{
    memset(c, 0, sizeof(*c));
    c->vocab = v;
    if (lim != NULL)
        c->lim = *lim;
    else
        gm_limits_default(&c->lim);
    c->max_entries = max_entries ? max_entries : 1;
    c->max_bytes = max_bytes;
    if (tg_hmap_init(&c->index, &entry_type, NULL, 128) != 0)
        return TG_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return 0;
}

static void entry_free(struct gm__centry *e)
{
    gm_grammar_unref(e->g);
    free(e->key);
    free(e);
}

void gm_cache_free(struct gm_cache *c)
{
    if (c->index.slots == NULL)
        return;
    struct tg_list_node *n, *next;
    TG_LIST_FOREACH_SAFE(n, next, &c->lru)
    {
        entry_free(entry_of(n));
    }
    tg_hmap_free(&c->index);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    memset(c, 0, sizeof(*c));
}

/* Takes e out of the index and the LRU list (it stays allocated). */
static void unlink_entry(struct gm_cache *c, struct gm__centry *e)
{
    struct spec_key k = {e->key, e->len, e->hash};
    struct gm__centry **slot = tg_hmap_find(&c->index, &entry_type, e->hash,
                                            &k);
    TG_ASSERT(slot != NULL && *slot == e);
    tg_hmap_del(&c->index, &entry_type, slot);
    tg_list_remove(&c->lru, &e->lru);
}

/* Evicts ready entries from the LRU tail while over a limit (keep one). */
static void evict(struct gm_cache *c, const struct gm__centry *keep)
{
    struct gm__centry *e = entry_of(c->lru.last);
    while (e != NULL && (c->st.entries > c->max_entries ||
                         (c->max_bytes != 0 && c->st.bytes > c->max_bytes))) {
        struct gm__centry *prev = entry_of(e->lru.prev);
        if (e->ready && e != keep) {
            unlink_entry(c, e);
            c->st.entries--;
            c->st.bytes -= e->bytes;
            c->st.evictions++;
            entry_free(e);
        }
        e = prev;
    }
}

static int answer(struct gm__centry *e, struct gm_grammar **out, char *err,
                  size_t errlen)
{
    if (e->code != 0) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "%s", e->err);
        return e->code;
    }
    *out = gm_grammar_ref(e->g);
    return 0;
}

int gm_cache_get(struct gm_cache *c, const char *spec, size_t len,
                 struct gm_grammar **out, char *err, size_t errlen)
{
    *out = NULL;
    struct spec_key k = {spec, len, tg_hash_bytes(spec, len)};
    pthread_mutex_lock(&c->mu);
    struct gm__centry **slot = tg_hmap_find(&c->index, &entry_type, k.hash, &k);
    struct gm__centry *e = slot != NULL ? *slot : NULL;
    if (e != NULL) {
        if (!e->ready) {
            c->st.waits++;
            e->waiters++;
            while (!e->ready)
                pthread_cond_wait(&c->cv, &c->mu);
            e->waiters--;
        } else {
            c->st.hits++;
        }
        int rc = answer(e, out, err, errlen);
        if (e->doomed) {
            if (e->waiters == 0)
                entry_free(e);
        } else {
            tg_list_move_front(&c->lru, &e->lru);
        }
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    c->st.misses++;
    e = calloc(1, sizeof(*e));
    char *key = malloc(len ? len : 1);
    slot = e != NULL && key != NULL
               ? tg_hmap_put(&c->index, &entry_type, k.hash, &k, NULL)
               : NULL;
    if (slot == NULL) {
        pthread_mutex_unlock(&c->mu);
        free(e);
        free(key);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (len > 0)
        memcpy(key, spec, len);
    e->key = key;
    e->len = len;
    e->hash = k.hash;
    *slot = e;
    tg_list_push_front(&c->lru, &e->lru);
    c->st.entries++;
    pthread_mutex_unlock(&c->mu);

    struct gm_grammar *g = NULL;
    char msg[ERR_BYTES] = "";
    int code = gm_spec_compile(spec, len, c->vocab, &c->lim, &g, msg,
                               sizeof msg);

    pthread_mutex_lock(&c->mu);
    e->code = code;
    e->g = g;
    snprintf(e->err, sizeof e->err, "%s", msg);
    e->bytes = g != NULL ? gm_grammar_stats(g)->bytes : len + sizeof(*e);
    e->ready = 1;
    c->st.bytes += e->bytes;
    if (code != 0)
        c->st.failures++;
    int rc = answer(e, out, err, errlen);
    if (code == TG_ENOMEM || code == TG_ETIMEDOUT) {
        /* may pass next time: not remembered */
        unlink_entry(c, e);
        c->st.entries--;
        c->st.bytes -= e->bytes;
        e->doomed = 1;
        if (e->waiters == 0)
            entry_free(e);
    }
    evict(c, NULL);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void gm_cache_stats(struct gm_cache *c, struct gm_cache_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
