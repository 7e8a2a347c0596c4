/*
 * rt_respstore.h — stored responses: the conversations the server holds for
 * the OpenAI Responses API (`previous_response_id`, retrieve, delete,
 * input items) and the gRPC API's continuation of the same (docs/API.md
 * "Responses").
 *
 * An entry is one response a client asked to store: its id ("resp_" and 32
 * hex digits of 128 random bits from getrandom), the scope of the caller
 * that made it, its creation time, and what a later turn needs:
 *   tokens    the token ids of the whole conversation so far (the prompt
 *             the model saw and everything it generated), so the next turn
 *             is these ids plus the new input's, and the multi-turn KV cache
 *             (rt_prefix.h) holds exactly their KV;
 *   response  the Response object as retrieve returns it (JSON text);
 *   items     the input items of the conversation so far (a JSON array:
 *             every earlier turn's input and output, then this turn's
 *             input), what GET .../input_items lists and what re-rendering
 *             the history takes;
 *   meta      the front end's own notes (JSON text; opaque here);
 *   item_ids  the ids of the response's output items, which a later request
 *             may name with an `item_reference` (rt_respstore_item).
 * All of it is immutable once stored; a continued conversation is a new
 * entry, so evicting one turn never breaks another.
 *
 * Scopes: an entry is visible only to callers of the same scope, a 16-byte
 * keyed BLAKE2b of the caller's API key and session id (rt_respstore_scope).
 * A lookup from another scope answers exactly as for an id that does not
 * exist. The key is random per store: kept in the database when there is
 * one (so scopes survive a restart), else drawn at start.
 *
 * Bounds (docs/RELIABILITY.md "Stored responses"): at most `max_entries`
 * entries and `max_bytes` bytes (an entry's bytes: its ids, texts and a
 * fixed overhead); the least recently used (stored or read) go first, each
 * eviction logged and counted. An entry older than `ttl_s` seconds is never
 * returned and is dropped at the next operation. An entry larger than
 * max_bytes alone is refused.
 *
 * Durability (`--responses-db PATH`): every change is written to a SQLite
 * database in WAL mode (synchronous=NORMAL: a committed change survives the
 * process being killed; only a crash of the machine can lose the last ones)
 * by jobs on another thread (the runner), never on the loop thread, in
 * batches of one transaction each, in the order they were made. rt_respstore_put
 * and _delete report the commit through their callback, so a front end
 * answers only once the change is on disk. At start the database is read
 * back, newest first, within the bounds (expired and excess rows are
 * deleted).
 *
 * References: a lookup returns the entry with a reference; it stays valid
 * (possibly evicted meanwhile) until rt_respstore_unref.
 *
 * Thread: the loop thread, except the runner's `run` (the database only).
 */
#ifndef RT_RESPSTORE_H
#define RT_RESPSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_hmap.h"
#include "common/base/tg_list.h"
#include "router/core/rt_metrics.h"

#define RT_RESP_ID_MAX 64 /* bytes of an id, NUL included */
#define RT_RESP_SCOPE_BYTES 16

struct rt_resp_scope {
    uint8_t b[RT_RESP_SCOPE_BYTES];
};

struct rt_resp_entry {
    char id[RT_RESP_ID_MAX];
    struct rt_resp_scope scope;
    int64_t created; /* unix seconds */
    int32_t *tokens; /* (n_tokens) */
    int64_t n_tokens;
    char *response; /* NUL-terminated JSON texts */
    char *items;
    char *meta;      /* NULL = none */
    char **item_ids; /* (n_item_ids) */
    size_t n_item_ids;
    /* set by the store */
    size_t bytes;            /* what it counts against max_bytes */
    int refs;                /* the store's (while listed) and the callers' */
    int listed;              /* in the store's map and lists */
    struct tg_list_node lru; /* newest use first */
    struct tg_list_node age; /* oldest creation first */
};

/* How the store runs its database work off the loop thread: `submit`
 * queues run(arg) on another thread and then done(arg) on the loop thread
 * (done exactly once, also when run was skipped), returning 0, or nonzero
 * when it cannot (the store then runs both itself, on the loop).
 * rt_respstore_init's caller provides it (the router: its thread pool,
 * rt_server.h rt_pool_job); NULL runs everything on the loop thread. */
struct rt_respstore_runner {
    int (*submit)(void *ud, void (*run)(void *arg), void (*done)(void *arg),
                  void *arg);
    void *ud;
};

struct rt_respstore_config {
    int64_t max_entries;  /* >= 1 */
    uint64_t max_bytes;   /* >= 1 */
    int64_t ttl_s;        /* >= 1 */
    const char *db_path;  /* NULL or "": memory only */
    int64_t (*now)(void); /* unix seconds; NULL: time() (tests pass a
                             clock of their own) */
};

/* Why an entry left the store (the evicted counter's label). */
enum rt_resp_evict {
    RT_RESP_EVICT_ENTRIES = 0, /* over max_entries (LRU) */
    RT_RESP_EVICT_BYTES,       /* over max_bytes (LRU) */
    RT_RESP_EVICT_TTL,         /* older than ttl_s */
    RT_RESP_EVICT_COUNT,
};

struct rt_respstore_metrics {
    struct rt_metrics_series *stored;  /* counter: entries stored */
    struct rt_metrics_series *deleted; /* counter: deleted by clients */
    struct rt_metrics_series *evicted[RT_RESP_EVICT_COUNT]; /* counters */
    struct rt_metrics_series *hits;      /* counter: lookups found */
    struct rt_metrics_series *misses;    /* counter: lookups not found */
    struct rt_metrics_series *entries;   /* gauge */
    struct rt_metrics_series *bytes;     /* gauge */
    struct rt_metrics_series *db_errors; /* counter: failed commits */
};

struct rt_respstore__job;

struct rt_respstore {
    struct rt_respstore_config cfg;
    struct rt_respstore_runner runner;
    struct tg_hmap by_id;   /* id -> entry */
    struct tg_hmap by_item; /* output item id -> entry */
    struct tg_list lru;     /* newest use first */
    struct tg_list age;     /* oldest creation first */
    int64_t n_entries;
    uint64_t n_bytes;
    uint8_t key[32];               /* the scopes' hash key */
    struct rt_respstore_metrics m; /* handles in the caller's registry, or
                                      all NULL without one */
    void *db;                      /* sqlite3 *, or NULL */
    struct tg_list pending;        /* database ops not yet handed to a job */
    struct rt_respstore__job *job; /* the job in flight, or NULL */
    int64_t (*now)(void);          /* cfg.now or time() */
    int64_t loaded;                /* entries read back from the database */
};

/* Opens a store with `cfg` (copied; db_path too), its metrics registered
 * in `reg` (may be NULL: none) and database work run by `runner` (may be
 * NULL). With a database: opens or creates it (WAL), reads the entries
 * back (newest first, within the bounds), deletes what is expired or over
 * the bounds. Returns 0, TG_EINVAL (a bound < 1), TG_EIO (the database
 * cannot be opened, read or written: err names the path and SQLite's
 * reason) or TG_ENOMEM; on failure *st is released. Loop thread. */
int rt_respstore_init(struct rt_respstore *st,
                      const struct rt_respstore_config *cfg,
                      struct rt_metrics_registry *reg,
                      const struct rt_respstore_runner *runner, char *err,
                      size_t errlen);

/* Closes the store: changes not yet committed are written on the calling
 * thread (at exit, once no job is in flight: the router's drain waits
 * for its jobs), their callbacks called with the outcome, the database
 * closed and every entry released (references still held stay valid
 * until their unref). Safe on a zeroed store. */
void rt_respstore_free(struct rt_respstore *st);

/* A new entry id "resp_" + 32 hex digits of 128 bits from getrandom() into
 * id[RT_RESP_ID_MAX]; `prefix` other than "resp" for item ids ("msg",
 * "fc"). Returns 0 or TG_EIO (getrandom failed). Any thread. */
int rt_respstore_new_id(const char *prefix, char *id);

/* The scope of a caller with API key `key` (NULL or "": none) and session
 * id `session` (NULL: none) into *out. Loop thread. */
void rt_respstore_scope(const struct rt_respstore *st, const char *key,
                        const char *session, struct rt_resp_scope *out);

/* Called once on the loop thread when a change is committed (rc 0) or
 * failed (rc < 0: the change stays in memory, not on disk). */
typedef void (*rt_respstore_done_fn)(void *ud, int rc);

/* Stores `e` (calloc'd, with id, scope, created, tokens, response, items,
 * meta and item_ids filled and malloc'd; the store owns it on any return)
 * as the newest entry, evicting what the bounds need. An entry with the
 * same id is replaced. Returns 0 (stored; no database, `done` is not
 * called), TG_EAGAIN (stored; `done` follows once the database committed
 * it, possibly before this returns when the runner could not take the
 * job), TG_ETOOBIG (larger than max_bytes alone: not stored, freed) or
 * TG_ENOMEM. Loop thread. */
int rt_respstore_put(struct rt_respstore *st, struct rt_resp_entry *e,
                     rt_respstore_done_fn done, void *ud);

/* The entry `id` of scope `scope`, with a reference, into *out; it becomes
 * the most recently used. Returns 0 or TG_ENOTFOUND (absent, expired or of
 * another scope). Counts a hit or a miss. Loop thread. */
int rt_respstore_get(struct rt_respstore *st, const char *id,
                     const struct rt_resp_scope *scope,
                     struct rt_resp_entry **out);

/* The entry whose output holds item `item_id`, as rt_respstore_get. */
int rt_respstore_item(struct rt_respstore *st, const char *item_id,
                      const struct rt_resp_scope *scope,
                      struct rt_resp_entry **out);

/* Gives back a reference of rt_respstore_get / _item. Loop thread. */
void rt_respstore_unref(struct rt_respstore *st, struct rt_resp_entry *e);

/* Deletes entry `id` of scope `scope`. Returns TG_ENOTFOUND (as _get),
 * 0 (deleted; no database, `done` not called) or TG_EAGAIN (deleted from
 * memory; `done` follows the commit). Loop thread. */
int rt_respstore_delete(struct rt_respstore *st, const char *id,
                        const struct rt_resp_scope *scope,
                        rt_respstore_done_fn done, void *ud);

/* Drops expired entries now (every operation above does it too; the
 * metrics scrape calls it so the gauges are current). Loop thread. */
void rt_respstore_expire(struct rt_respstore *st);

/* Frees an entry that was never stored (its fields and itself when
 * `self`); safe on NULL. */
void rt_resp_entry_free(struct rt_resp_entry *e, int self);

#endif /* RT_RESPSTORE_H */
