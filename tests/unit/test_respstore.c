/* test_respstore.c — the store of responses held for later turns
 * (router/core/rt_respstore.h):
 *   - ids: "resp_" + 32 hex digits, two draws differ;
 *   - put / get / delete, a reference outliving the entry's removal, item
 *     lookups, hits and misses counted;
 *   - scopes: another API key or session sees nothing (get, item, delete);
 *   - bounds: max_entries and max_bytes evict the least recently used
 *     (a get refreshes), an entry larger than max_bytes is refused;
 *   - TTL: an entry as old as ttl_s is gone (a fake clock);
 *   - the database: entries, their scope and the scope key survive a
 *     reopen; a delete does too; a reopen with smaller bounds keeps the
 *     newest; expired rows are dropped; a runner that defers its jobs
 *     reports the commit through the callback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_metrics.h"
#include "router/core/rt_respstore.h"
#include "tests/support/tt_support.h"

static int64_t fake_now = 1000000;

static int64_t clock_now(void)
{
    return fake_now;
}

/* A new entry of n tokens (values base..), its response text `resp` and
 * one output item id "<id>_item". */
static struct rt_resp_entry *entry(const char *id,
                                   const struct rt_resp_scope *sc, int64_t n,
                                   int32_t base, const char *resp)
{
    struct rt_resp_entry *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    snprintf(e->id, sizeof(e->id), "%s", id);
    e->scope = *sc;
    e->created = fake_now;
    e->n_tokens = n;
    e->tokens = malloc((size_t)n * sizeof(int32_t) + 1);
    for (int64_t i = 0; i < n; i++)
        e->tokens[i] = base + (int32_t)i;
    e->response = strdup(resp);
    e->items = strdup("[{\"type\":\"message\"}]");
    e->item_ids = calloc(1, sizeof(char *));
    char item[RT_RESP_ID_MAX + 8];
    snprintf(item, sizeof(item), "%s_item", id);
    e->item_ids[0] = strdup(item);
    e->n_item_ids = 1;
    return e;
}

static int present(struct rt_respstore *st, const char *id,
                   const struct rt_resp_scope *sc)
{
    struct rt_resp_entry *e;
    int rc = rt_respstore_get(st, id, sc, &e);
    if (rc == 0)
        rt_respstore_unref(st, e);
    return rc == 0;
}

static struct rt_respstore_config cfg(int64_t entries, uint64_t bytes,
                                      int64_t ttl, const char *db)
{
    struct rt_respstore_config c = {entries, bytes, ttl, db, clock_now};
    return c;
}

static void open_store(struct rt_respstore *st, struct rt_respstore_config c,
                       struct rt_metrics_registry *reg)
{
    char err[256] = "";
    int rc = rt_respstore_init(st, &c, reg, NULL, err, sizeof(err));
    if (rc != 0)
        fail_msg("init: %s", err);
}

static void test_ids(void **state)
{
    (void)state;
    char a[RT_RESP_ID_MAX], b[RT_RESP_ID_MAX];
    assert_int_equal(rt_respstore_new_id("resp", a), 0);
    assert_int_equal(rt_respstore_new_id("resp", b), 0);
    assert_int_equal(strlen(a), 5 + 32);
    assert_memory_equal(a, "resp_", 5);
    assert_int_equal(strspn(a + 5, "0123456789abcdef"), 32);
    assert_string_not_equal(a, b);
    assert_int_equal(rt_respstore_new_id("msg", a), 0);
    assert_memory_equal(a, "msg_", 4);
}

static void test_put_get_delete_scope(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_respstore st;
    open_store(&st, cfg(10, 1 << 20, 3600, NULL), &reg);
    struct rt_resp_scope a, b, a_sess;
    rt_respstore_scope(&st, "key-a", NULL, &a);
    rt_respstore_scope(&st, "key-b", NULL, &b);
    rt_respstore_scope(&st, "key-a", "s1", &a_sess);
    assert_memory_not_equal(a.b, b.b, sizeof(a.b));
    assert_memory_not_equal(a.b, a_sess.b, sizeof(a.b));
    /* Where the key ends and the session begins is part of the scope. */
    struct rt_resp_scope x, y;
    rt_respstore_scope(&st, "ab", "c", &x);
    rt_respstore_scope(&st, "a", "bc", &y);
    assert_memory_not_equal(x.b, y.b, sizeof(x.b));

    assert_int_equal(
        rt_respstore_put(&st, entry("r1", &a, 5, 7, "{}"), NULL, NULL), 0);
    struct rt_resp_entry *e;
    assert_int_equal(rt_respstore_get(&st, "r1", &a, &e), 0);
    assert_int_equal(e->n_tokens, 5);
    assert_int_equal(e->tokens[4], 11);
    rt_respstore_unref(&st, e);
    /* Other scopes see nothing: get, item, delete. */
    assert_int_equal(rt_respstore_get(&st, "r1", &b, &e), TG_ENOTFOUND);
    assert_null(e);
    assert_int_equal(rt_respstore_get(&st, "r1", &a_sess, &e), TG_ENOTFOUND);
    assert_int_equal(rt_respstore_item(&st, "r1_item", &b, &e), TG_ENOTFOUND);
    assert_int_equal(rt_respstore_delete(&st, "r1", &b, NULL, NULL),
                     TG_ENOTFOUND);
    assert_int_equal(rt_respstore_get(&st, "nope", &a, &e), TG_ENOTFOUND);
    assert_int_equal(rt_respstore_item(&st, "r1_item", &a, &e), 0);
    assert_string_equal(e->id, "r1");
    /* A reference outlives the delete. */
    assert_int_equal(rt_respstore_delete(&st, "r1", &a, NULL, NULL), 0);
    assert_int_equal(e->tokens[0], 7);
    assert_false(e->listed);
    rt_respstore_unref(&st, e);
    assert_false(present(&st, "r1", &a));
    assert_int_equal(rt_respstore_delete(&st, "r1", &a, NULL, NULL),
                     TG_ENOTFOUND);
    assert_int_equal(st.n_entries, 0);
    assert_int_equal(st.n_bytes, 0);
    /* hits: get, item, the delete's lookup; misses: the other 7. */
    assert_true(rt_metrics_series_value(st.m.hits) == 3.0);
    assert_true(rt_metrics_series_value(st.m.misses) == 7.0);
    assert_true(rt_metrics_series_value(st.m.stored) == 1.0);
    assert_true(rt_metrics_series_value(st.m.deleted) == 1.0);
    rt_respstore_free(&st);
    rt_metrics_registry_free(&reg);
}

static void test_bounds_lru(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_respstore st;
    open_store(&st, cfg(3, 1 << 20, 3600, NULL), &reg);
    struct rt_resp_scope a;
    rt_respstore_scope(&st, "k", NULL, &a);
    rt_respstore_put(&st, entry("r1", &a, 1, 0, "{}"), NULL, NULL);
    rt_respstore_put(&st, entry("r2", &a, 1, 0, "{}"), NULL, NULL);
    rt_respstore_put(&st, entry("r3", &a, 1, 0, "{}"), NULL, NULL);
    /* r1 read: r2 is now the least recently used. */
    assert_true(present(&st, "r1", &a));
    rt_respstore_put(&st, entry("r4", &a, 1, 0, "{}"), NULL, NULL);
    assert_int_equal(st.n_entries, 3);
    assert_false(present(&st, "r2", &a));
    assert_true(present(&st, "r1", &a));
    assert_true(present(&st, "r3", &a));
    assert_true(present(&st, "r4", &a));
    assert_true(rt_metrics_series_value(st.m.evicted[RT_RESP_EVICT_ENTRIES]) ==
                1.0);
    rt_respstore_free(&st);
    rt_metrics_registry_free(&reg);

    /* Bytes: each entry of 1000 tokens is 4000 bytes and more; three fit
     * in 14000 (about 4600 each), a fourth evicts the least recently used. */
    rt_metrics_registry_init(&reg);
    open_store(&st, cfg(100, 14000, 3600, NULL), &reg);
    rt_respstore_put(&st, entry("b1", &a, 1000, 0, "{}"), NULL, NULL);
    rt_respstore_put(&st, entry("b2", &a, 1000, 0, "{}"), NULL, NULL);
    rt_respstore_put(&st, entry("b3", &a, 1000, 0, "{}"), NULL, NULL);
    assert_int_equal(st.n_entries, 3);
    assert_true(present(&st, "b1", &a));
    rt_respstore_put(&st, entry("b4", &a, 1000, 0, "{}"), NULL, NULL);
    assert_false(present(&st, "b2", &a));
    assert_true(present(&st, "b1", &a));
    assert_true(st.n_bytes <= 14000);
    assert_true(rt_metrics_series_value(st.m.evicted[RT_RESP_EVICT_BYTES]) ==
                1.0);
    /* Larger than the whole bound: refused, nothing evicted. */
    assert_int_equal(
        rt_respstore_put(&st, entry("big", &a, 4000, 0, "{}"), NULL, NULL),
        TG_ETOOBIG);
    assert_int_equal(st.n_entries, 3);
    assert_false(present(&st, "big", &a));
    rt_respstore_free(&st);
    rt_metrics_registry_free(&reg);
}

static void test_ttl(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_respstore st;
    open_store(&st, cfg(10, 1 << 20, 60, NULL), &reg);
    struct rt_resp_scope a;
    rt_respstore_scope(&st, "k", NULL, &a);
    rt_respstore_put(&st, entry("old", &a, 1, 0, "{}"), NULL, NULL);
    fake_now += 30;
    rt_respstore_put(&st, entry("new", &a, 1, 0, "{}"), NULL, NULL);
    fake_now += 29;
    assert_true(present(&st, "old", &a)); /* 59 s old */
    fake_now += 1;
    assert_false(present(&st, "old", &a)); /* 60 s: gone */
    assert_true(present(&st, "new", &a));
    assert_true(rt_metrics_series_value(st.m.evicted[RT_RESP_EVICT_TTL]) ==
                1.0);
    assert_int_equal(st.n_entries, 1);
    fake_now += 30;
    rt_respstore_expire(&st);
    assert_int_equal(st.n_entries, 0);
    assert_true(rt_metrics_series_value(st.m.entries) == 0.0);
    rt_respstore_free(&st);
    rt_metrics_registry_free(&reg);
}

/* A runner that keeps its jobs until `flush` runs them (as the router's
 * pool would, later). */
struct defer {
    void (*run[8])(void *);
    void (*done[8])(void *);
    void *arg[8];
    int n;
};

static int defer_submit(void *ud, void (*run)(void *), void (*done)(void *),
                        void *arg)
{
    struct defer *d = ud;
    assert_true(d->n < 8);
    d->run[d->n] = run;
    d->done[d->n] = done;
    d->arg[d->n++] = arg;
    return 0;
}

static void flush(struct defer *d)
{
    while (d->n > 0) {
        void (*run)(void *) = d->run[0], (*done)(void *) = d->done[0];
        void *arg = d->arg[0];
        memmove(d->run, d->run + 1, (size_t)(d->n - 1) * sizeof(d->run[0]));
        memmove(d->done, d->done + 1, (size_t)(d->n - 1) * sizeof(d->done[0]));
        memmove(d->arg, d->arg + 1, (size_t)(d->n - 1) * sizeof(d->arg[0]));
        d->n--;
        run(arg);
        done(arg); /* may submit the next batch */
    }
}

static void on_done(void *ud, int rc)
{
    int *calls = ud;
    assert_int_equal(rc, 0);
    (*calls)++;
}

static void test_db_reopen(void **state)
{
    (void)state;
    char dir[512], path[600];
    assert_int_equal(tt_tmpdir_make("respstore", dir, sizeof(dir)), 0);
    snprintf(path, sizeof(path), "%s/responses.db", dir);
    struct rt_respstore st;
    struct rt_resp_scope a, b;

    struct defer d = {0};
    struct rt_respstore_runner runner = {defer_submit, &d};
    struct rt_respstore_config c = cfg(10, 1 << 20, 3600, path);
    char err[256] = "";
    if (rt_respstore_init(&st, &c, NULL, &runner, err, sizeof(err)) != 0)
        fail_msg("init: %s", err);
    rt_respstore_scope(&st, "key-a", "s", &a);
    rt_respstore_scope(&st, "key-b", NULL, &b);
    int calls = 0;
    assert_int_equal(rt_respstore_put(&st, entry("d1", &a, 3, 100, "{\"x\":1}"),
                                      on_done, &calls),
                     TG_EAGAIN);
    /* Changes made while a commit is in flight wait for the next batch. */
    fake_now += 1;
    assert_int_equal(
        rt_respstore_put(&st, entry("d2", &b, 2, 200, "{}"), on_done, &calls),
        TG_EAGAIN);
    fake_now += 1;
    assert_int_equal(
        rt_respstore_put(&st, entry("d3", &a, 1, 300, "{}"), on_done, &calls),
        TG_EAGAIN);
    assert_int_equal(calls, 0);
    assert_int_equal(d.n, 1);
    flush(&d);
    assert_int_equal(calls, 3);
    assert_int_equal(rt_respstore_delete(&st, "d3", &a, on_done, &calls),
                     TG_EAGAIN);
    flush(&d);
    assert_int_equal(calls, 4);
    rt_respstore_free(&st);

    /* Reopened (a new process would be the same): d1 and d2 with their
     * tokens, texts and scopes; d3 stays deleted. */
    open_store(&st, c, NULL);
    assert_int_equal(st.loaded, 2);
    struct rt_resp_scope a2, b2;
    rt_respstore_scope(&st, "key-a", "s", &a2);
    rt_respstore_scope(&st, "key-b", NULL, &b2);
    assert_memory_equal(a.b, a2.b, sizeof(a.b));
    struct rt_resp_entry *e;
    assert_int_equal(rt_respstore_get(&st, "d1", &a2, &e), 0);
    assert_int_equal(e->n_tokens, 3);
    assert_int_equal(e->tokens[0], 100);
    assert_int_equal(e->tokens[2], 102);
    assert_string_equal(e->response, "{\"x\":1}");
    assert_string_equal(e->items, "[{\"type\":\"message\"}]");
    assert_int_equal(e->n_item_ids, 1);
    assert_string_equal(e->item_ids[0], "d1_item");
    rt_respstore_unref(&st, e);
    assert_int_equal(rt_respstore_get(&st, "d1", &b2, &e), TG_ENOTFOUND);
    assert_true(present(&st, "d2", &b2));
    assert_false(present(&st, "d3", &a2));
    assert_int_equal(rt_respstore_item(&st, "d1_item", &a2, &e), 0);
    rt_respstore_unref(&st, e);
    /* No runner: put commits before it returns. */
    calls = 0;
    fake_now += 1;
    assert_int_equal(
        rt_respstore_put(&st, entry("d4", &a2, 1, 400, "{}"), on_done, &calls),
        TG_EAGAIN);
    assert_int_equal(calls, 1);
    rt_respstore_free(&st);

    /* Smaller bounds: the newest entry stays, the rest are deleted from
     * the file too. */
    open_store(&st, cfg(1, 1 << 20, 3600, path), NULL);
    assert_int_equal(st.loaded, 1);
    assert_true(present(&st, "d4", &a2));
    rt_respstore_free(&st);
    open_store(&st, cfg(10, 1 << 20, 3600, path), NULL);
    assert_int_equal(st.loaded, 1);
    rt_respstore_free(&st);

    /* Expired while the server was down: dropped at open. */
    fake_now += 3600;
    open_store(&st, cfg(10, 1 << 20, 3600, path), NULL);
    assert_int_equal(st.loaded, 0);
    rt_respstore_free(&st);

    assert_int_equal(tt_tmpdir_remove(dir), 0);
}

static void test_db_bad_path(void **state)
{
    (void)state;
    struct rt_respstore st;
    struct rt_respstore_config c = cfg(10, 100, 10,
                                       "/nonexistent-dir/x/responses.db");
    char err[256] = "";
    assert_int_equal(rt_respstore_init(&st, &c, NULL, NULL, err, sizeof(err)),
                     TG_EIO);
    assert_non_null(strstr(err, "/nonexistent-dir/x/responses.db"));
    c = cfg(0, 100, 10, NULL);
    assert_int_equal(rt_respstore_init(&st, &c, NULL, NULL, err, sizeof(err)),
                     TG_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_put_get_delete_scope),
        cmocka_unit_test(test_bounds_lru),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_db_reopen),
        cmocka_unit_test(test_db_bad_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
