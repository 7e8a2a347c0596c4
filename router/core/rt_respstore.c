/* rt_respstore.c — stored responses in memory: the id and item maps, the
 * LRU and age lists, the bounds, scopes and metrics (see rt_respstore.h).
 * The database side is rt_respstore_db.c. Loop thread. */
#include "router/core/rt_respstore.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/core/rt_respstore_internal.h"

/* Bytes an entry costs beyond its ids and texts: the struct, its slots in
 * the maps and the allocator's headers, rounded up. */
#define ENTRY_OVERHEAD 512u

static int64_t default_now(void)
{
    return (int64_t)time(NULL);
}

/* ---- maps ---------------------------------------------------------------- */

/* A slot of either map: the key (borrowed from the entry) and the entry. */
struct slot {
    const char *key;
    struct rt_resp_entry *e;
};

static int slot_probe(const void *slot, const void *key)
{
    const struct slot *s = slot;
    if (s->key == NULL)
        return TG_HMAP_EMPTY;
    return strcmp(s->key, key) == 0 ? TG_HMAP_HIT : TG_HMAP_MISS;
}

static int slot_empty(const void *slot)
{
    return ((const struct slot *)slot)->key == NULL;
}

static uint64_t key_hash(const char *k)
{
    return tg_hash_bytes(k, strlen(k));
}

static uint64_t slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return key_hash(((const struct slot *)slot)->key);
}

static const struct tg_hmap_type slot_type = {
    sizeof(struct slot), 0, slot_probe, slot_empty, slot_hash};

static struct slot *map_find(struct tg_hmap *m, const char *key)
{
    return tg_hmap_find(m, &slot_type, key_hash(key), key);
}

static void map_del(struct tg_hmap *m, const char *key)
{
    struct slot *s = map_find(m, key);
    if (s != NULL)
        tg_hmap_del(m, &slot_type, s);
}

/* ---- entries ------------------------------------------------------------- */

void rt_resp_entry_free(struct rt_resp_entry *e, int self)
{
    if (e == NULL)
        return;
    free(e->tokens);
    free(e->response);
    free(e->items);
    free(e->meta);
    for (size_t i = 0; i < e->n_item_ids; i++)
        free(e->item_ids[i]);
    free(e->item_ids);
    if (self)
        free(e);
    else
        memset(e, 0, sizeof(*e));
}

size_t rt_respstore__entry_bytes(const struct rt_resp_entry *e)
{
    size_t n = ENTRY_OVERHEAD + (size_t)e->n_tokens * sizeof(int32_t);
    n += e->response != NULL ? strlen(e->response) : 0;
    n += e->items != NULL ? strlen(e->items) : 0;
    n += e->meta != NULL ? strlen(e->meta) : 0;
    for (size_t i = 0; i < e->n_item_ids; i++)
        n += strlen(e->item_ids[i]) + 1 + sizeof(struct slot) * 2;
    return n;
}

void rt_respstore_unref(struct rt_respstore *st, struct rt_resp_entry *e)
{
    (void)st;
    if (e != NULL && --e->refs == 0)
        rt_resp_entry_free(e, 1);
}

void rt_respstore__ref(struct rt_resp_entry *e)
{
    e->refs++;
}

static void gauges(struct rt_respstore *st)
{
    if (st->m.entries != NULL)
        rt_metrics_gauge_set(st->m.entries, (double)st->n_entries);
    if (st->m.bytes != NULL)
        rt_metrics_gauge_set(st->m.bytes, (double)st->n_bytes);
}

/* Takes e out of the maps and lists (the store's reference goes). With
 * `db`, its row is deleted too. */
static void unlist(struct rt_respstore *st, struct rt_resp_entry *e, int db)
{
    if (!e->listed)
        return;
    map_del(&st->by_id, e->id);
    for (size_t i = 0; i < e->n_item_ids; i++) {
        struct slot *s = map_find(&st->by_item, e->item_ids[i]);
        if (s != NULL && s->e == e)
            tg_hmap_del(&st->by_item, &slot_type, s);
    }
    tg_list_remove(&st->lru, &e->lru);
    tg_list_remove(&st->age, &e->age);
    st->n_entries--;
    st->n_bytes -= e->bytes;
    e->listed = 0;
    if (db && st->db != NULL)
        rt_respstore__db_delete(st, e->id, NULL, NULL);
    rt_respstore_unref(st, e);
}

static const char *const evict_names[RT_RESP_EVICT_COUNT] = {
    [RT_RESP_EVICT_ENTRIES] = "entries",
    [RT_RESP_EVICT_BYTES] = "bytes",
    [RT_RESP_EVICT_TTL] = "ttl",
};

static void evict(struct rt_respstore *st, struct rt_resp_entry *e,
                  enum rt_resp_evict why)
{
    int64_t age = st->now() - e->created;
    if (why == RT_RESP_EVICT_TTL)
        log_info("stored response %s expired (%" PRId64 " s old, "
                 "--responses-ttl %" PRId64 ")",
                 e->id, age, st->cfg.ttl_s);
    else
        log_info("stored response %s evicted, least recently used (%s "
                 "bound: %" PRId64 " entries, %" PRIu64 " bytes; "
                 "--responses-max-entries %" PRId64
                 ", --responses-max-bytes %" PRIu64 ")",
                 e->id, evict_names[why], st->n_entries, st->n_bytes,
                 st->cfg.max_entries, st->cfg.max_bytes);
    if (st->m.evicted[why] != NULL)
        rt_metrics_counter_inc(st->m.evicted[why]);
    unlist(st, e, 1);
}

void rt_respstore_expire(struct rt_respstore *st)
{
    if (st->cfg.ttl_s <= 0)
        return;
    int64_t now = st->now();
    struct rt_resp_entry *e;
    while ((e = TG_LIST_FIRST(&st->age, struct rt_resp_entry, age)) != NULL &&
           now - e->created >= st->cfg.ttl_s)
        evict(st, e, RT_RESP_EVICT_TTL);
    gauges(st);
    if (st->db != NULL)
        rt_respstore__db_kick(st);
}

/* Evicts least recently used entries other than `keep` until the bounds
 * hold. */
static void fit(struct rt_respstore *st, const struct rt_resp_entry *keep)
{
    for (;;) {
        enum rt_resp_evict why;
        if (st->n_entries > st->cfg.max_entries)
            why = RT_RESP_EVICT_ENTRIES;
        else if (st->n_bytes > st->cfg.max_bytes)
            why = RT_RESP_EVICT_BYTES;
        else
            break;
        struct rt_resp_entry *e = TG_LIST_LAST(&st->lru, struct rt_resp_entry,
                                               lru);
        if (e == keep)
            e = e->lru.prev != NULL
                    ? TG_LIST_ENTRY(e->lru.prev, struct rt_resp_entry, lru)
                    : NULL;
        if (e == NULL)
            break;
        evict(st, e, why);
    }
    gauges(st);
}

/* Lists e (refs: the store's) as the newest entry; a listed entry with the
 * same id is replaced. Returns 0 or TG_ENOMEM (e unchanged, not listed). */
int rt_respstore__list(struct rt_respstore *st, struct rt_resp_entry *e,
                       int newest)
{
    struct slot *old = map_find(&st->by_id, e->id);
    if (old != NULL)
        unlist(st, old->e, 0);
    if (tg_hmap_reserve(&st->by_id, tg_hmap_count(&st->by_id) + 1) != 0 ||
        tg_hmap_reserve(&st->by_item,
                        tg_hmap_count(&st->by_item) + e->n_item_ids) != 0)
        return TG_ENOMEM;
    struct slot *s = tg_hmap_put(&st->by_id, &slot_type, key_hash(e->id), e->id,
                                 NULL);
    s->key = e->id;
    s->e = e;
    for (size_t i = 0; i < e->n_item_ids; i++) {
        s = tg_hmap_put(&st->by_item, &slot_type, key_hash(e->item_ids[i]),
                        e->item_ids[i], NULL);
        s->key = e->item_ids[i];
        s->e = e;
    }
    e->bytes = rt_respstore__entry_bytes(e);
    e->refs = 1;
    e->listed = 1;
    if (newest) {
        tg_list_push_front(&st->lru, &e->lru);
        tg_list_push_back(&st->age, &e->age);
    } else { /* read back from the database, newest first */
        tg_list_push_back(&st->lru, &e->lru);
        tg_list_push_front(&st->age, &e->age);
    }
    st->n_entries++;
    st->n_bytes += e->bytes;
    return 0;
}

/* ---- the API --------------------------------------------------------------- */

static const char *const lookup_label = "result";
static const char *const lookup_values[2] = {"hit", "miss"};

static int metrics_init(struct rt_respstore *st,
                        struct rt_metrics_registry *reg, char *err,
                        size_t errlen)
{
    struct rt_respstore_metrics *m = &st->m;
    int rc = rt_metrics_single_add(
        reg, "tangram_responses_stored_total",
        "Responses stored for later turns (Responses API store, gRPC store).",
        RT_METRICS_COUNTER, NULL, 0, &m->stored, err, errlen);
    if (rc == 0)
        rc = rt_metrics_single_add(reg, "tangram_responses_deleted_total",
                                   "Stored responses deleted by their clients.",
                                   RT_METRICS_COUNTER, NULL, 0, &m->deleted,
                                   err, errlen);
    struct rt_metrics_family *f = NULL;
    const char *reason = "reason";
    if (rc == 0)
        rc = rt_metrics_family_add(
            reg, "tangram_responses_evicted_total",
            "Stored responses dropped by the store's bounds: least recently "
            "used over --responses-max-entries (entries) or "
            "--responses-max-bytes (bytes), or older than --responses-ttl "
            "(ttl).",
            RT_METRICS_COUNTER, 1, &reason, NULL, 0, &f, err, errlen);
    for (int i = 0; rc == 0 && i < RT_RESP_EVICT_COUNT; i++)
        rc = rt_metrics_series_add(f, &evict_names[i], &m->evicted[i], err,
                                   errlen);
    if (rc == 0)
        rc = rt_metrics_family_add(
            reg, "tangram_responses_lookups_total",
            "Lookups of stored responses (previous_response_id, retrieve, "
            "delete, input items, item references): found (hit) or not "
            "(miss: never stored, evicted, expired or of another scope).",
            RT_METRICS_COUNTER, 1, &lookup_label, NULL, 0, &f, err, errlen);
    if (rc == 0)
        rc = rt_metrics_series_add(f, &lookup_values[0], &m->hits, err, errlen);
    if (rc == 0)
        rc = rt_metrics_series_add(f, &lookup_values[1], &m->misses, err,
                                   errlen);
    if (rc == 0)
        rc = rt_metrics_single_add(reg, "tangram_responses_entries",
                                   "Stored responses held.", RT_METRICS_GAUGE,
                                   NULL, 0, &m->entries, err, errlen);
    if (rc == 0)
        rc = rt_metrics_single_add(
            reg, "tangram_responses_bytes",
            "Bytes the stored responses count against --responses-max-bytes.",
            RT_METRICS_GAUGE, NULL, 0, &m->bytes, err, errlen);
    if (rc == 0)
        rc = rt_metrics_single_add(
            reg, "tangram_responses_db_errors_total",
            "Commits of stored responses to --responses-db that failed (the "
            "change stays in memory only).",
            RT_METRICS_COUNTER, NULL, 0, &m->db_errors, err, errlen);
    return rc;
}

int rt_respstore_init(struct rt_respstore *st,
                      const struct rt_respstore_config *cfg,
                      struct rt_metrics_registry *reg,
                      const struct rt_respstore_runner *runner, char *err,
                      size_t errlen)
{
    memset(st, 0, sizeof(*st));
    st->now = default_now;
    if (cfg->max_entries < 1 || cfg->max_bytes < 1 || cfg->ttl_s < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "responses store: bounds must be at least 1");
    st->cfg = *cfg;
    st->cfg.db_path = NULL;
    if (cfg->now != NULL)
        st->now = cfg->now;
    if (runner != NULL)
        st->runner = *runner;
    int rc = 0;
    if (cfg->db_path != NULL && cfg->db_path[0] != '\0' &&
        (st->cfg.db_path = strdup(cfg->db_path)) == NULL)
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    if (rc == 0 && (tg_hmap_init(&st->by_id, &slot_type, NULL, 16) != 0 ||
                    tg_hmap_init(&st->by_item, &slot_type, NULL, 16) != 0))
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    if (rc == 0 && reg != NULL)
        rc = metrics_init(st, reg, err, errlen);
    if (rc == 0 && sodium_init() < 0)
        rc = tg_err_set(err, errlen, TG_EINTERNAL, "libsodium: init failed");
    if (rc == 0 && st->cfg.db_path == NULL &&
        getrandom(st->key, sizeof(st->key), 0) != (ssize_t)sizeof(st->key))
        rc = tg_err_set(err, errlen, TG_EIO, "getrandom failed");
    if (rc == 0 && st->cfg.db_path != NULL)
        rc = rt_respstore__db_open(st, err, errlen);
    if (rc != 0) {
        rt_respstore_free(st);
        return rc;
    }
    fit(st, NULL);
    return 0;
}

void rt_respstore_free(struct rt_respstore *st)
{
    if (st->db != NULL)
        rt_respstore__db_close(st);
    struct rt_resp_entry *e;
    while ((e = TG_LIST_FIRST(&st->lru, struct rt_resp_entry, lru)) != NULL)
        unlist(st, e, 0);
    tg_hmap_free(&st->by_id);
    tg_hmap_free(&st->by_item);
    free((char *)st->cfg.db_path);
    memset(st, 0, sizeof(*st));
}

int rt_respstore_new_id(const char *prefix, char *id)
{
    uint8_t r[16];
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
        return TG_EIO;
    size_t n = (size_t)snprintf(id, RT_RESP_ID_MAX, "%.16s_", prefix);
    for (int i = 0; i < 16; i++)
        n += (size_t)snprintf(id + n, RT_RESP_ID_MAX - n, "%02x", r[i]);
    return 0;
}

void rt_respstore_scope(const struct rt_respstore *st, const char *key,
                        const char *session, struct rt_resp_scope *out)
{
    crypto_generichash_state h;
    crypto_generichash_init(&h, st->key, sizeof(st->key), sizeof(out->b));
    const char *k = key != NULL ? key : "";
    /* Length-prefixed fields: no two (key, session) pairs hash alike by
     * where one ends and the other begins. */
    uint64_t n = strlen(k);
    crypto_generichash_update(&h, (const uint8_t *)&n, sizeof(n));
    crypto_generichash_update(&h, (const uint8_t *)k, n);
    uint8_t has = session != NULL;
    crypto_generichash_update(&h, &has, 1);
    if (session != NULL) {
        n = strlen(session);
        crypto_generichash_update(&h, (const uint8_t *)&n, sizeof(n));
        crypto_generichash_update(&h, (const uint8_t *)session, n);
    }
    crypto_generichash_final(&h, out->b, sizeof(out->b));
}

int rt_respstore_put(struct rt_respstore *st, struct rt_resp_entry *e,
                     rt_respstore_done_fn done, void *ud)
{
    rt_respstore_expire(st);
    if (rt_respstore__entry_bytes(e) > st->cfg.max_bytes) {
        log_warn("response %s not stored: its %zu bytes exceed "
                 "--responses-max-bytes %" PRIu64,
                 e->id, rt_respstore__entry_bytes(e), st->cfg.max_bytes);
        rt_resp_entry_free(e, 1);
        return TG_ETOOBIG;
    }
    memset(&e->lru, 0, sizeof(e->lru));
    memset(&e->age, 0, sizeof(e->age));
    if (rt_respstore__list(st, e, 1) != 0) {
        rt_resp_entry_free(e, 1);
        return TG_ENOMEM;
    }
    if (st->m.stored != NULL)
        rt_metrics_counter_inc(st->m.stored);
    int rc = 0;
    if (st->db != NULL) {
        rc = rt_respstore__db_put(st, e, done, ud);
        if (rc == 0)
            rc = TG_EAGAIN;
    }
    fit(st, e);
    if (st->db != NULL)
        rt_respstore__db_kick(st);
    return rc;
}

static int lookup(struct rt_respstore *st, struct tg_hmap *m, const char *key,
                  const struct rt_resp_scope *scope, struct rt_resp_entry **out)
{
    rt_respstore_expire(st);
    struct slot *s = map_find(m, key);
    /* Another scope's entry answers as no entry at all. */
    if (s == NULL || memcmp(s->e->scope.b, scope->b, sizeof(scope->b)) != 0) {
        if (st->m.misses != NULL)
            rt_metrics_counter_inc(st->m.misses);
        *out = NULL;
        return TG_ENOTFOUND;
    }
    struct rt_resp_entry *e = s->e;
    if (st->m.hits != NULL)
        rt_metrics_counter_inc(st->m.hits);
    tg_list_remove(&st->lru, &e->lru);
    tg_list_push_front(&st->lru, &e->lru);
    e->refs++;
    *out = e;
    return 0;
}

int rt_respstore_get(struct rt_respstore *st, const char *id,
                     const struct rt_resp_scope *scope,
                     struct rt_resp_entry **out)
{
    return lookup(st, &st->by_id, id, scope, out);
}

int rt_respstore_item(struct rt_respstore *st, const char *item_id,
                      const struct rt_resp_scope *scope,
                      struct rt_resp_entry **out)
{
    return lookup(st, &st->by_item, item_id, scope, out);
}

int rt_respstore_delete(struct rt_respstore *st, const char *id,
                        const struct rt_resp_scope *scope,
                        rt_respstore_done_fn done, void *ud)
{
    struct rt_resp_entry *e;
    int rc = rt_respstore_get(st, id, scope, &e);
    if (rc != 0)
        return rc;
    unlist(st, e, 0);
    rt_respstore_unref(st, e);
    if (st->m.deleted != NULL)
        rt_metrics_counter_inc(st->m.deleted);
    gauges(st);
    if (st->db == NULL)
        return 0;
    rc = rt_respstore__db_delete(st, id, done, ud);
    if (rc != 0)
        return rc;
    rt_respstore__db_kick(st);
    return TG_EAGAIN;
}
