/*
 * gm_cache.h — compiled grammars by spec text (gm_spec.h), for one
 * vocabulary and one set of limits, shared by all requests of a process.
 *
 * gm_cache_get returns the grammar of a spec, compiling it on the first
 * request; a spec being compiled by another thread is waited for, not
 * compiled twice. Failures are remembered too (the same bad schema sent
 * again costs a lookup and gets the same message). Entries are evicted
 * least recently used first when the cache holds more than `max_entries`
 * entries or `max_bytes` bytes of grammars; an evicted grammar lives on
 * while matchers hold references to it.
 *
 * Threads: every function except init/free may be called from any
 * number of threads at once (one mutex; compiling runs outside it). The
 * router calls gm_cache_get from a worker thread, never its event loop.
 */
#ifndef GM_CACHE_H
#define GM_CACHE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_hmap.h"
#include "common/base/tg_list.h"
#include "common/grammar/gm_grammar.h"

struct gm_cache_stats {
    uint64_t hits, misses, waits, evictions, failures;
    size_t entries, bytes;
};

struct gm__centry; /* gm_cache.c */

struct gm_cache {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const struct gm_vocab *vocab; /* borrowed */
    struct gm_limits lim;
    size_t max_entries, max_bytes;
    struct tg_hmap index; /* struct gm__centry * slots, by spec */
    struct tg_list lru;   /* the indexed entries, most recent first */
    struct gm_cache_stats st;
};

/* Prepares *c for vocabulary v (borrowed, must outlive the cache) and
 * limits lim (copied; NULL: defaults). Returns 0 or TG_ENOMEM. */
int gm_cache_init(struct gm_cache *c, const struct gm_vocab *v,
                  const struct gm_limits *lim, size_t max_entries,
                  size_t max_bytes);

/* Drops every entry (grammars still referenced elsewhere live on) and
 * zeroes *c. No other thread may use the cache any more. */
void gm_cache_free(struct gm_cache *c);

/* Sets *out to the grammar of spec [spec, spec + len) with a new
 * reference for the caller (gm_grammar_unref it). Returns 0 or the
 * compile's code and message (gm_spec_compile), the same every time for
 * the same spec while it stays cached. */
int gm_cache_get(struct gm_cache *c, const char *spec, size_t len,
                 struct gm_grammar **out, char *err, size_t errlen);

/* A snapshot of the counters. */
void gm_cache_stats(struct gm_cache *c, struct gm_cache_stats *out);

#endif /* GM_CACHE_H */
