/* gm_cache.c — the thread-safe compile cache (gm_cache.h). */
#include "common/grammar/gm_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"

#define ERR_BYTES 256

struct gm__centry {
    struct gm__centry *next;             /* bucket chain */
    struct gm__centry *prev_lru, *next_lru;
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

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
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
    c->n_bucket = 256;
    c->bucket = calloc(c->n_bucket, sizeof(*c->bucket));
    if (c->bucket == NULL)
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
    if (c->bucket == NULL)
        return;
    for (struct gm__centry *e = c->lru_head; e != NULL;) {
        struct gm__centry *n = e->next_lru;
        entry_free(e);
        e = n;
    }
    free(c->bucket);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    memset(c, 0, sizeof(*c));
}

static void lru_unlink(struct gm_cache *c, struct gm__centry *e)
{
    if (e->prev_lru != NULL)
        e->prev_lru->next_lru = e->next_lru;
    else
        c->lru_head = e->next_lru;
    if (e->next_lru != NULL)
        e->next_lru->prev_lru = e->prev_lru;
    else
        c->lru_tail = e->prev_lru;
    e->prev_lru = e->next_lru = NULL;
}

static void lru_front(struct gm_cache *c, struct gm__centry *e)
{
    e->next_lru = c->lru_head;
    e->prev_lru = NULL;
    if (c->lru_head != NULL)
        c->lru_head->prev_lru = e;
    c->lru_head = e;
    if (c->lru_tail == NULL)
        c->lru_tail = e;
}

static void unlink_bucket(struct gm_cache *c, struct gm__centry *e)
{
    struct gm__centry **pp = &c->bucket[e->hash & (c->n_bucket - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
}

/* Grows the bucket array when the table is over load 1. */
static void maybe_rehash(struct gm_cache *c)
{
    if (c->st.entries < c->n_bucket)
        return;
    size_t n = c->n_bucket * 2;
    struct gm__centry **b = calloc(n, sizeof(*b));
    if (b == NULL)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < c->n_bucket; i++)
        for (struct gm__centry *e = c->bucket[i]; e != NULL;) {
            struct gm__centry *next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    free(c->bucket);
    c->bucket = b;
    c->n_bucket = n;
}

/* Evicts ready entries from the LRU tail while over a limit (keep one). */
static void evict(struct gm_cache *c, const struct gm__centry *keep)
{
    struct gm__centry *e = c->lru_tail;
    while (e != NULL && (c->st.entries > c->max_entries ||
                         (c->max_bytes != 0 && c->st.bytes > c->max_bytes))) {
        struct gm__centry *prev = e->prev_lru;
        if (e->ready && e != keep) {
            lru_unlink(c, e);
            unlink_bucket(c, e);
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
    uint64_t h = hash_bytes(spec, len);
    pthread_mutex_lock(&c->mu);
    struct gm__centry *e = c->bucket[h & (c->n_bucket - 1)];
    while (e != NULL &&
           !(e->hash == h && e->len == len && memcmp(e->key, spec, len) == 0))
        e = e->next;
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
            lru_unlink(c, e);
            lru_front(c, e);
        }
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    c->st.misses++;
    e = calloc(1, sizeof(*e));
    char *key = malloc(len ? len : 1);
    if (e == NULL || key == NULL) {
        pthread_mutex_unlock(&c->mu);
        free(e);
        free(key);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (len > 0)
        memcpy(key, spec, len);
    e->key = key;
    e->len = len;
    e->hash = h;
    e->next = c->bucket[h & (c->n_bucket - 1)];
    c->bucket[h & (c->n_bucket - 1)] = e;
    lru_front(c, e);
    c->st.entries++;
    maybe_rehash(c);
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
        lru_unlink(c, e);
        unlink_bucket(c, e);
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
