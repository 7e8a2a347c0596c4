/* test_gprep.c — the router's table of grammars prepared on worker rank 0
 * (router/core/rt_gprep.h), the bookkeeping that keeps a constrained
 * request out of the scheduler until its grammar is ready:
 *   - a new spec waits (UNSENT, then PENDING once sent) and is ready only
 *     after rank 0's answer; requests with the same spec share one record
 *     and one prepare; a ready spec is used at once (no wait, no prepare);
 *   - admission: max_pending prepares outstanding, one more is refused
 *     (nothing held) while joining an outstanding one is not; an answer
 *     frees the place;
 *   - release: the last holder of a pending prepare releases its id (the
 *     worker cancels the compile), of an unsent one sends nothing; the
 *     late answer of a released id is ignored;
 *   - kept grammars: idle ready records stay up to `keep`, least recently
 *     used released first, and a kept one serves the next request;
 *   - a failed answer keeps its reason; the next request with that spec
 *     makes a new prepare; its holders' puts release nothing;
 *   - a lost worker: idle records forgotten, unsent releases dropped, held
 *     ones prepared again under new ids, oldest first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_gprep.h"

static const char A[] = "{\"type\":\"json_object\"}";
static const char B[] = "{\"type\":\"json_value\"}";
static const char C[] = "{\"type\":\"json_schema\",\"schema\":{}}";
static const char D[] = "{\"type\":\"json_schema\",\"schema\":{\"type\":1}}";

/* Takes what is to send and marks it sent; returns the prepares' count
 * and copies their ids (and the releases) out. */
static int32_t send_all(struct rt_gpreps *t, uint64_t *ids, uint64_t *rel,
                        int32_t *n_rel)
{
    const struct rt_link_gprep *p;
    const uint64_t *r;
    int32_t n = rt_gpreps_take(t, &p, &r, n_rel);
    assert_true(n >= 0);
    for (int32_t i = 0; i < n; i++)
        ids[i] = p[i].id;
    for (int32_t i = 0; i < *n_rel; i++)
        rel[i] = r[i];
    rt_gpreps_sent(t);
    return n;
}

static void test_wait_share_ready(void **state)
{
    (void)state;
    struct rt_gpreps t;
    rt_gpreps_init(&t, 4, 0);
    struct rt_gprep *p, *q;
    assert_int_equal(rt_gpreps_acquire(&t, A, &p), TG_EAGAIN);
    assert_int_equal(p->state, RT_GPREP_UNSENT);
    assert_int_equal(rt_gpreps_acquire(&t, A, &q), TG_EAGAIN);
    assert_ptr_equal(p, q); /* joined */
    assert_int_equal(p->refs, 2);
    uint64_t ids[8], rel[8];
    int32_t nr;
    assert_int_equal(send_all(&t, ids, rel, &nr), 1);
    assert_int_equal(nr, 0);
    assert_true(ids[0] == p->id);
    assert_int_equal(p->state, RT_GPREP_PENDING);
    assert_int_equal(send_all(&t, ids, rel, &nr), 0); /* nothing new */
    /* Not ready before the answer; an answer for another id is ignored. */
    assert_null(rt_gpreps_answer(&t, p->id + 100, 1, 0, ""));
    assert_ptr_equal(rt_gpreps_answer(&t, p->id, 1, 0, ""), p);
    assert_int_equal(p->state, RT_GPREP_READY);
    assert_null(rt_gpreps_answer(&t, p->id, 1, 0, "")); /* twice: ignored */
    assert_int_equal(rt_gpreps_acquire(&t, A, &q), 0);  /* ready: no wait */
    assert_ptr_equal(p, q);
    struct rt_gprep_stats st;
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.prepares, 1);
    assert_int_equal(st.joined, 1);
    assert_int_equal(st.ready_hits, 1);
    assert_int_equal(st.pending, 0);
    /* keep 0: the last put of a ready record releases it. */
    rt_gpreps_put(&t, p);
    rt_gpreps_put(&t, p);
    rt_gpreps_put(&t, p);
    assert_int_equal(send_all(&t, ids, rel, &nr), 0);
    assert_int_equal(nr, 1);
    assert_true(rel[0] == 1);
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.records, 0);
    rt_gpreps_free(&t);
}

static void test_admission(void **state)
{
    (void)state;
    struct rt_gpreps t;
    rt_gpreps_init(&t, 2, 0);
    struct rt_gprep *a, *b, *c, *x;
    assert_int_equal(rt_gpreps_acquire(&t, A, &a), TG_EAGAIN);
    assert_int_equal(rt_gpreps_acquire(&t, B, &b), TG_EAGAIN);
    assert_int_equal(rt_gpreps_acquire(&t, C, &c), TG_EBUSY);
    assert_null(c);
    assert_int_equal(rt_gpreps_acquire(&t, A, &x), TG_EAGAIN); /* joins */
    uint64_t ids[8], rel[8];
    int32_t nr;
    assert_int_equal(send_all(&t, ids, rel, &nr), 2);
    assert_true(ids[0] < ids[1]); /* oldest first */
    assert_int_equal(rt_gpreps_acquire(&t, C, &c), TG_EBUSY);
    assert_non_null(rt_gpreps_answer(&t, a->id, 1, 0, ""));
    assert_int_equal(rt_gpreps_acquire(&t, C, &c), TG_EAGAIN);
    struct rt_gprep_stats st;
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.refused, 2);
    assert_int_equal(st.pending, 2);
    rt_gpreps_put(&t, a);
    rt_gpreps_put(&t, x);
    rt_gpreps_put(&t, b);
    rt_gpreps_put(&t, c);
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.records, 0);
    rt_gpreps_free(&t);
}

static void test_release(void **state)
{
    (void)state;
    struct rt_gpreps t;
    rt_gpreps_init(&t, 4, 0);
    struct rt_gprep *a, *b;
    uint64_t ids[8], rel[8];
    int32_t nr;
    /* Unsent: forgotten, nothing to tell the worker. */
    assert_int_equal(rt_gpreps_acquire(&t, A, &a), TG_EAGAIN);
    rt_gpreps_put(&t, a);
    assert_int_equal(send_all(&t, ids, rel, &nr), 0);
    assert_int_equal(nr, 0);
    /* Pending (a request aborted while its grammar compiles): its id is
     * released, the place freed, the late answer ignored. */
    assert_int_equal(rt_gpreps_acquire(&t, B, &b), TG_EAGAIN);
    assert_int_equal(send_all(&t, ids, rel, &nr), 1);
    uint64_t id = b->id;
    rt_gpreps_put(&t, b);
    struct rt_gprep_stats st;
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.pending, 0);
    assert_int_equal(send_all(&t, ids, rel, &nr), 0);
    assert_int_equal(nr, 1);
    assert_true(rel[0] == id);
    assert_null(rt_gpreps_answer(&t, id, 1, 0, ""));
    /* A release not sent yet stays listed until it is. */
    assert_int_equal(rt_gpreps_acquire(&t, C, &a), TG_EAGAIN);
    assert_int_equal(send_all(&t, ids, rel, &nr), 1);
    rt_gpreps_put(&t, a);
    const struct rt_link_gprep *p;
    const uint64_t *r;
    assert_int_equal(rt_gpreps_take(&t, &p, &r, &nr), 0);
    assert_int_equal(nr, 1);
    assert_int_equal(rt_gpreps_take(&t, &p, &r, &nr), 0); /* not sent */
    assert_int_equal(nr, 1);
    rt_gpreps_sent(&t);
    assert_int_equal(rt_gpreps_take(&t, &p, &r, &nr), 0);
    assert_int_equal(nr, 0);
    rt_gpreps_free(&t);
}

static struct rt_gprep *ready(struct rt_gpreps *t, const char *spec)
{
    struct rt_gprep *p;
    uint64_t ids[8], rel[8];
    int32_t nr;
    int rc = rt_gpreps_acquire(t, spec, &p);
    if (rc == 0)
        return p;
    assert_int_equal(rc, TG_EAGAIN);
    send_all(t, ids, rel, &nr);
    assert_ptr_equal(rt_gpreps_answer(t, p->id, 1, 0, ""), p);
    return p;
}

static void test_keep(void **state)
{
    (void)state;
    struct rt_gpreps t;
    rt_gpreps_init(&t, 8, 2);
    struct rt_gprep *a = ready(&t, A), *b = ready(&t, B), *c = ready(&t, C);
    uint64_t ida = a->id;
    uint64_t ids[8], rel[8];
    int32_t nr;
    rt_gpreps_put(&t, a);
    rt_gpreps_put(&t, b);
    assert_int_equal(send_all(&t, ids, rel, &nr), 0);
    assert_int_equal(nr, 0); /* two idle: kept */
    rt_gpreps_put(&t, c);    /* a third: the least recent (A) goes */
    assert_int_equal(send_all(&t, ids, rel, &nr), 0);
    assert_int_equal(nr, 1);
    assert_true(rel[0] == ida);
    /* B serves the next request at once, no prepare. */
    struct rt_gprep *p;
    assert_int_equal(rt_gpreps_acquire(&t, B, &p), 0);
    assert_ptr_equal(p, b);
    struct rt_gprep_stats st;
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.prepares, 3);
    assert_int_equal(st.idle, 1);
    rt_gpreps_put(&t, p);
    rt_gpreps_free(&t);
}

static void test_failed(void **state)
{
    (void)state;
    struct rt_gpreps t;
    rt_gpreps_init(&t, 4, 4);
    struct rt_gprep *a, *b, *n;
    uint64_t ids[8], rel[8];
    int32_t nr;
    assert_int_equal(rt_gpreps_acquire(&t, D, &a), TG_EAGAIN);
    assert_int_equal(rt_gpreps_acquire(&t, D, &b), TG_EAGAIN);
    send_all(&t, ids, rel, &nr);
    assert_ptr_equal(rt_gpreps_answer(&t, a->id, 0, 0, "bad type"), a);
    assert_int_equal(a->state, RT_GPREP_FAILED);
    assert_string_equal(a->error, "bad type");
    assert_false(a->busy);
    /* A new request: a new prepare, not the failure. */
    assert_int_equal(rt_gpreps_acquire(&t, D, &n), TG_EAGAIN);
    assert_ptr_not_equal(n, a);
    assert_true(n->id > a->id);
    rt_gpreps_put(&t, a);
    rt_gpreps_put(&t, b);
    rt_gpreps_put(&t, n);
    assert_int_equal(send_all(&t, ids, rel, &nr), 0);
    assert_int_equal(nr, 0); /* failed: the worker forgot it; n unsent */
    struct rt_gprep_stats st;
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.records, 0);
    rt_gpreps_free(&t);
}

static void test_lost(void **state)
{
    (void)state;
    struct rt_gpreps t;
    rt_gpreps_init(&t, 4, 4);
    struct rt_gprep *idle = ready(&t, A), *held = ready(&t, B), *pend;
    rt_gpreps_put(&t, idle);
    assert_int_equal(rt_gpreps_acquire(&t, C, &pend), TG_EAGAIN);
    uint64_t ids[8], rel[8];
    int32_t nr;
    send_all(&t, ids, rel, &nr);
    uint64_t old_held = held->id, old_pend = pend->id;
    rt_gpreps_lost(&t);
    assert_int_equal(held->state, RT_GPREP_UNSENT);
    assert_int_equal(pend->state, RT_GPREP_UNSENT);
    assert_true(held->id > old_pend && pend->id > old_pend);
    assert_null(rt_gpreps_answer(&t, old_pend, 1, 0, "")); /* old group */
    struct rt_gprep_stats st;
    rt_gpreps_stats(&t, &st);
    assert_int_equal(st.records, 2); /* the idle one is gone */
    assert_int_equal(st.pending, 2);
    assert_int_equal(send_all(&t, ids, rel, &nr), 2);
    assert_int_equal(nr, 0);
    assert_true(ids[0] == held->id && ids[1] == pend->id); /* oldest first */
    assert_true(old_held < old_pend);
    struct rt_gprep *p;
    assert_int_equal(rt_gpreps_acquire(&t, A, &p), TG_EAGAIN); /* anew */
    rt_gpreps_put(&t, p);
    rt_gpreps_put(&t, held);
    rt_gpreps_put(&t, pend);
    rt_gpreps_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_share_ready),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_keep),
        cmocka_unit_test(test_failed),
        cmocka_unit_test(test_lost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
