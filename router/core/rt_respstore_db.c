/* rt_respstore_db.c — stored responses on disk (--responses-db): a SQLite
 * database in WAL mode, written by jobs off the loop thread, one
 * transaction per batch of changes, in order (see rt_respstore.h).
 *
 * Tables: meta(k, v) holds the schema version and the scopes' hash key
 * (32 random bytes made when the database is created, so the scopes of
 * stored entries survive a restart); responses(id, scope, created, tokens,
 * response, items, meta, item_ids) one row per entry (tokens as 32-bit
 * little-endian ids, item_ids joined with newlines).
 *
 * At most one job is in flight: changes made meanwhile wait in the store's
 * pending list and go with the next job when it ends, so the database
 * sees them in the order they were made. The connection is used by one
 * thread at a time: the loop thread at open and close (no job in flight
 * then), a pool thread while a job runs. */
#include <inttypes.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/core/rt_respstore_internal.h"

#define SCHEMA_VERSION 1
/* How long a statement waits for a lock another process holds (a second
 * router on the same file is a configuration error; this only lets a
 * checkpoint by a tool finish) before the commit fails. */
#define BUSY_MS 2000

struct db {
    sqlite3 *h;
    sqlite3_stmt *put, *del, *begin, *commit, *rollback;
};

/* One queued change. */
struct op {
    struct tg_list_node link;
    struct rt_resp_entry *e; /* put: a reference; NULL for a delete */
    char id[RT_RESP_ID_MAX];
    rt_respstore_done_fn done;
    void *ud;
};

struct rt_respstore__job {
    struct rt_respstore *st;
    struct tg_list ops;
    int rc;
    char err[256];
};

static struct db *db_of(const struct rt_respstore *st)
{
    return st->db;
}

/* ---- jobs ---------------------------------------------------------------- */

static int step_done(sqlite3_stmt *s)
{
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Little-endian ids into a new buffer of n * 4 bytes (NULL: out of memory;
 * n 0 gives a 1-byte buffer). */
static uint8_t *tokens_blob(const int32_t *t, int64_t n)
{
    uint8_t *b = malloc((size_t)n * 4 + 1);
    for (int64_t i = 0; b != NULL && i < n; i++) {
        uint32_t v = (uint32_t)t[i];
        b[4 * i] = (uint8_t)v;
        b[4 * i + 1] = (uint8_t)(v >> 8);
        b[4 * i + 2] = (uint8_t)(v >> 16);
        b[4 * i + 3] = (uint8_t)(v >> 24);
    }
    return b;
}

static char *join_ids(char *const *ids, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(ids[i]) + 1;
    char *s = malloc(len), *p = s;
    for (size_t i = 0; s != NULL && i < n; i++) {
        size_t k = strlen(ids[i]);
        memcpy(p, ids[i], k);
        p += k;
        *p++ = '\n';
    }
    if (s != NULL)
        *p = '\0';
    return s;
}

static int write_put(struct db *d, const struct rt_resp_entry *e)
{
    uint8_t *blob = tokens_blob(e->tokens, e->n_tokens);
    char *ids = join_ids(e->item_ids, e->n_item_ids);
    if (blob == NULL || ids == NULL) {
        free(blob);
        free(ids);
        return SQLITE_NOMEM;
    }
    sqlite3_stmt *s = d->put;
    sqlite3_bind_text(s, 1, e->id, -1, SQLITE_STATIC);
    sqlite3_bind_blob(s, 2, e->scope.b, sizeof(e->scope.b), SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, e->created);
    sqlite3_bind_blob64(s, 4, blob, (sqlite3_uint64)e->n_tokens * 4,
                        SQLITE_STATIC);
    sqlite3_bind_text(s, 5, e->response, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 6, e->items, -1, SQLITE_STATIC);
    if (e->meta != NULL)
        sqlite3_bind_text(s, 7, e->meta, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 7);
    sqlite3_bind_text(s, 8, ids, -1, SQLITE_STATIC);
    int rc = step_done(s);
    sqlite3_clear_bindings(s);
    free(blob);
    free(ids);
    return rc;
}

static int write_del(struct db *d, const char *id)
{
    sqlite3_bind_text(d->del, 1, id, -1, SQLITE_STATIC);
    int rc = step_done(d->del);
    sqlite3_clear_bindings(d->del);
    return rc;
}

/* The job's batch as one transaction (a pool thread, or the loop at
 * close). */
static void job_run(void *arg)
{
    struct rt_respstore__job *j = arg;
    struct db *d = db_of(j->st);
    int rc = step_done(d->begin);
    struct tg_list_node *n;
    for (n = j->ops.first; rc == SQLITE_OK && n != NULL; n = n->next) {
        struct op *o = TG_LIST_ENTRY(n, struct op, link);
        rc = o->e != NULL ? write_put(d, o->e) : write_del(d, o->id);
    }
    if (rc == SQLITE_OK)
        rc = step_done(d->commit);
    if (rc != SQLITE_OK) {
        snprintf(j->err, sizeof(j->err), "%s", sqlite3_errmsg(d->h));
        step_done(d->rollback);
        j->rc = TG_EIO;
    }
}

/* The job ended (loop thread): every change's callback, then the next
 * batch. */
static void job_done(void *arg)
{
    struct rt_respstore__job *j = arg;
    struct rt_respstore *st = j->st;
    st->job = NULL;
    if (j->rc != 0) {
        log_err("--responses-db %s: a commit failed: %s (the changes stay in "
                "memory only)",
                st->cfg.db_path, j->err);
        if (st->m.db_errors != NULL)
            rt_metrics_counter_inc(st->m.db_errors);
    }
    struct tg_list_node *n;
    while ((n = j->ops.first) != NULL) {
        tg_list_remove(&j->ops, n);
        struct op *o = TG_LIST_ENTRY(n, struct op, link);
        if (o->done != NULL)
            o->done(o->ud, j->rc);
        if (o->e != NULL)
            rt_respstore_unref(st, o->e);
        free(o);
    }
    free(j);
    rt_respstore__db_kick(st);
}

void rt_respstore__db_kick(struct rt_respstore *st)
{
    if (st->db == NULL || st->job != NULL || tg_list_empty(&st->pending))
        return;
    struct rt_respstore__job *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return; /* retried with the next change */
    j->st = st;
    j->ops = st->pending;
    memset(&st->pending, 0, sizeof(st->pending));
    st->job = j;
    if (st->runner.submit != NULL &&
        st->runner.submit(st->runner.ud, job_run, job_done, j) == 0)
        return;
    job_run(j);
    job_done(j);
}

static int queue(struct rt_respstore *st, struct rt_resp_entry *e,
                 const char *id, rt_respstore_done_fn done, void *ud)
{
    struct op *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return TG_ENOMEM;
    if (e != NULL) {
        rt_respstore__ref(e);
        o->e = e;
    }
    snprintf(o->id, sizeof(o->id), "%s", id);
    o->done = done;
    o->ud = ud;
    tg_list_push_back(&st->pending, &o->link);
    return 0;
}

int rt_respstore__db_put(struct rt_respstore *st, struct rt_resp_entry *e,
                         rt_respstore_done_fn done, void *ud)
{
    return queue(st, e, e->id, done, ud);
}

int rt_respstore__db_delete(struct rt_respstore *st, const char *id,
                            rt_respstore_done_fn done, void *ud)
{
    return queue(st, NULL, id, done, ud);
}

/* ---- open, read back, close ------------------------------------------------ */

static int fail(struct rt_respstore *st, sqlite3 *h, char *err, size_t errlen,
                const char *what)
{
    return tg_err_set(err, errlen, TG_EIO, "--responses-db %s: %s: %s",
                      st->cfg.db_path, what,
                      h != NULL ? sqlite3_errmsg(h) : "out of memory");
}

static int exec(sqlite3 *h, const char *sql)
{
    return sqlite3_exec(h, sql, NULL, NULL, NULL);
}

/* The scopes' key: read, or made and written when the database is new. */
static int scope_key(struct rt_respstore *st, sqlite3 *h, char *err,
                     size_t errlen)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(h, "SELECT v FROM meta WHERE k = 'scope_key'", -1,
                           &s, NULL) != SQLITE_OK)
        return fail(st, h, err, errlen, "reading the scope key");
    int found = 0;
    if (sqlite3_step(s) == SQLITE_ROW &&
        sqlite3_column_bytes(s, 0) == (int)sizeof(st->key)) {
        memcpy(st->key, sqlite3_column_blob(s, 0), sizeof(st->key));
        found = 1;
    }
    sqlite3_finalize(s);
    if (found)
        return 0;
    if (getrandom(st->key, sizeof(st->key), 0) != (ssize_t)sizeof(st->key))
        return tg_err_set(err, errlen, TG_EIO, "getrandom failed");
    if (sqlite3_prepare_v2(h,
                           "INSERT OR REPLACE INTO meta(k, v) VALUES "
                           "('scope_key', ?1)",
                           -1, &s, NULL) != SQLITE_OK)
        return fail(st, h, err, errlen, "writing the scope key");
    sqlite3_bind_blob(s, 1, st->key, sizeof(st->key), SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return fail(st, h, err, errlen, "writing the scope key");
    return 0;
}

static char *dup_col(sqlite3_stmt *s, int c)
{
    const unsigned char *t = sqlite3_column_text(s, c);
    return t != NULL ? strdup((const char *)t) : NULL;
}

/* An entry of the current row (NULL: out of memory or a malformed row). */
static struct rt_resp_entry *row_entry(sqlite3_stmt *s)
{
    struct rt_resp_entry *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    snprintf(e->id, sizeof(e->id), "%s",
             (const char *)sqlite3_column_text(s, 0));
    int ok = sqlite3_column_bytes(s, 1) == (int)sizeof(e->scope.b);
    if (ok)
        memcpy(e->scope.b, sqlite3_column_blob(s, 1), sizeof(e->scope.b));
    e->created = sqlite3_column_int64(s, 2);
    int nb = sqlite3_column_bytes(s, 3);
    const uint8_t *b = sqlite3_column_blob(s, 3);
    ok = ok && nb % 4 == 0;
    e->n_tokens = nb / 4;
    e->tokens = malloc((size_t)nb + 4);
    for (int64_t i = 0; ok && e->tokens != NULL && i < e->n_tokens; i++)
        e->tokens[i] = (int32_t)((uint32_t)b[4 * i] |
                                 (uint32_t)b[4 * i + 1] << 8 |
                                 (uint32_t)b[4 * i + 2] << 16 |
                                 (uint32_t)b[4 * i + 3] << 24);
    e->response = dup_col(s, 4);
    e->items = dup_col(s, 5);
    if (sqlite3_column_type(s, 6) != SQLITE_NULL)
        e->meta = dup_col(s, 6);
    const char *ids = (const char *)sqlite3_column_text(s, 7);
    for (const char *p = ids; ok && p != NULL && *p != '\0';) {
        const char *nl = strchr(p, '\n');
        size_t k = nl != NULL ? (size_t)(nl - p) : strlen(p);
        char **v = realloc(e->item_ids, (e->n_item_ids + 1) * sizeof(*v));
        if (v == NULL) {
            ok = 0;
            break;
        }
        e->item_ids = v;
        if ((v[e->n_item_ids] = strndup(p, k)) == NULL) {
            ok = 0;
            break;
        }
        e->n_item_ids++;
        p += k + (nl != NULL);
    }
    if (!ok || e->tokens == NULL || e->response == NULL || e->items == NULL) {
        rt_resp_entry_free(e, 1);
        return NULL;
    }
    return e;
}

/* Reads the entries back, newest first, within the bounds; rows expired,
 * over the bounds or unreadable are deleted. */
static int load(struct rt_respstore *st, struct db *d, char *err, size_t errlen)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(d->h,
                           "SELECT id, scope, created, tokens, response, "
                           "items, meta, item_ids FROM responses ORDER BY "
                           "created DESC, rowid DESC",
                           -1, &s, NULL) != SQLITE_OK)
        return fail(st, d->h, err, errlen, "reading the stored responses");
    int64_t now = st->now(), dropped = 0;
    char **gone = NULL;
    size_t n_gone = 0;
    int rc = 0, step;
    while ((step = sqlite3_step(s)) == SQLITE_ROW) {
        struct rt_resp_entry *e = NULL;
        int keep = now - sqlite3_column_int64(s, 2) < st->cfg.ttl_s &&
                   st->n_entries < st->cfg.max_entries;
        if (keep && (e = row_entry(s)) == NULL)
            keep = 0;
        if (keep &&
            st->n_bytes + rt_respstore__entry_bytes(e) > st->cfg.max_bytes)
            keep = 0;
        if (keep && rt_respstore__list(st, e, 0) != 0) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        if (keep) {
            st->loaded++;
            continue;
        }
        rt_resp_entry_free(e, 1);
        char **g = realloc(gone, (n_gone + 1) * sizeof(*g));
        if (g == NULL || (g[n_gone] = dup_col(s, 0)) == NULL) {
            gone = g != NULL ? g : gone;
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        gone = g;
        n_gone++;
    }
    if (rc == 0 && step != SQLITE_DONE && step != SQLITE_ROW)
        rc = fail(st, d->h, err, errlen, "reading the stored responses");
    sqlite3_finalize(s);
    if (rc == 0 && n_gone > 0) {
        int w = step_done(d->begin);
        for (size_t i = 0; w == SQLITE_OK && i < n_gone; i++)
            w = write_del(d, gone[i]);
        if (w == SQLITE_OK)
            w = step_done(d->commit);
        if (w != SQLITE_OK) {
            step_done(d->rollback);
            rc = fail(st, d->h, err, errlen, "deleting expired responses");
        }
        dropped = (int64_t)n_gone;
    }
    for (size_t i = 0; i < n_gone; i++)
        free(gone[i]);
    free(gone);
    if (rc == 0)
        log_info("--responses-db %s: %" PRId64 " stored responses read back, "
                 "%" PRId64 " expired or over the bounds deleted",
                 st->cfg.db_path, st->loaded, dropped);
    return rc;
}

static void db_free(struct db *d)
{
    if (d == NULL)
        return;
    sqlite3_finalize(d->put);
    sqlite3_finalize(d->del);
    sqlite3_finalize(d->begin);
    sqlite3_finalize(d->commit);
    sqlite3_finalize(d->rollback);
    sqlite3_close(d->h);
    free(d);
}

int rt_respstore__db_open(struct rt_respstore *st, char *err, size_t errlen)
{
    struct db *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    int rc = sqlite3_open_v2(st->cfg.db_path, &d->h,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                 SQLITE_OPEN_FULLMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        rc = fail(st, d->h, err, errlen, "cannot open");
        db_free(d);
        return rc;
    }
    sqlite3_busy_timeout(d->h, BUSY_MS);
    sqlite3_stmt *s = NULL;
    /* journal_mode answers with the mode it set: a file system without
     * shared memory (some network mounts) stays in "delete". */
    int wal = sqlite3_prepare_v2(d->h, "PRAGMA journal_mode=WAL", -1, &s,
                                 NULL) == SQLITE_OK &&
              sqlite3_step(s) == SQLITE_ROW &&
              strcmp((const char *)sqlite3_column_text(s, 0), "wal") == 0;
    sqlite3_finalize(s);
    if (!wal || exec(d->h, "PRAGMA synchronous=NORMAL") != SQLITE_OK ||
        exec(d->h,
             "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v BLOB "
             "NOT NULL);"
             "CREATE TABLE IF NOT EXISTS responses(id TEXT PRIMARY KEY, "
             "scope BLOB NOT NULL, created INTEGER NOT NULL, tokens BLOB NOT "
             "NULL, response TEXT NOT NULL, items TEXT NOT NULL, meta TEXT, "
             "item_ids TEXT NOT NULL);"
             "INSERT OR IGNORE INTO meta(k, v) VALUES ('schema', 1);") !=
            SQLITE_OK) {
        rc = fail(st, d->h, err, errlen,
                  wal ? "cannot set up the tables"
                      : "cannot use write-ahead logging (WAL) on this file "
                        "system");
        db_free(d);
        return rc;
    }
    if (sqlite3_prepare_v2(d->h, "SELECT v FROM meta WHERE k = 'schema'", -1,
                           &s, NULL) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW &&
        sqlite3_column_int(s, 0) != SCHEMA_VERSION) {
        rc = tg_err_set(err, errlen, TG_EIO,
                        "--responses-db %s: schema version %d, this server "
                        "reads %d",
                        st->cfg.db_path, sqlite3_column_int(s, 0),
                        SCHEMA_VERSION);
        sqlite3_finalize(s);
        db_free(d);
        return rc;
    }
    sqlite3_finalize(s);
    if (sqlite3_prepare_v2(d->h,
                           "INSERT OR REPLACE INTO responses(id, scope, "
                           "created, tokens, response, items, meta, item_ids) "
                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                           -1, &d->put, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d->h, "DELETE FROM responses WHERE id = ?1", -1,
                           &d->del, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d->h, "BEGIN IMMEDIATE", -1, &d->begin, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(d->h, "COMMIT", -1, &d->commit, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d->h, "ROLLBACK", -1, &d->rollback, NULL) !=
            SQLITE_OK) {
        rc = fail(st, d->h, err, errlen, "cannot prepare its statements");
        db_free(d);
        return rc;
    }
    rc = scope_key(st, d->h, err, errlen);
    if (rc == 0)
        rc = load(st, d, err, errlen);
    if (rc != 0) {
        db_free(d);
        return rc;
    }
    st->db = d;
    return 0;
}

void rt_respstore__db_close(struct rt_respstore *st)
{
    struct db *d = db_of(st);
    if (st->job != NULL) {
        /* A job still runs on another thread: the connection and its
         * batch are left to it (the router's drain waits for its jobs, so
         * this happens only when the loop was cut short). */
        log_err("--responses-db %s: closed while a commit was in flight",
                st->cfg.db_path);
        st->db = NULL;
        return;
    }
    /* What is pending is written here, on the calling thread. */
    st->runner.submit = NULL;
    rt_respstore__db_kick(st);
    st->db = NULL;
    db_free(d);
}
