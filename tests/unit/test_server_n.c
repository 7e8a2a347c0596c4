/* test_server_n.c — when the router refuses n parallel samples of one
 * request (rt_server_check_n in router/core/rt_server_req.c): n <= 1 always
 * passes; n above --max-num-seqs is a 400 naming n and the flag; n > 1
 * under the gvote scoring method (given by --method, else by the
 * profile) is a 400 naming n and the method, since gvote's rows shrink by
 * what the worker keeps after each chunk and a sample forks the rows as
 * reserved. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_server_internal.h"

static void test_check_n(void **state)
{
    (void)state;
    struct tg_serve_opts o;
    memset(&o, 0, sizeof(o));
    o.max_num_seqs = 4;
    struct rt_server s;
    memset(&s, 0, sizeof(s));
    s.opts = &o;
    char snapkv[] = "snapkv", gvote[] = "gvote", empty[] = "";
    s.profile.method = snapkv;
    struct rt_request_error e;
    memset(&e, 0, sizeof(e));
    assert_int_equal(rt_server_check_n(&s, 0, &e), 0);
    assert_int_equal(rt_server_check_n(&s, 1, &e), 0);
    assert_int_equal(rt_server_check_n(&s, 4, &e), 0);
    assert_int_equal(rt_server_check_n(&s, 5, &e), TG_EUNSUPPORTED);
    assert_int_equal(e.kind, RT_REQ_ERR_INVALID);
    assert_string_equal(e.param, "n");
    assert_non_null(strstr(e.message, "--max-num-seqs 4"));
    /* gvote from the profile, and from --method over the profile. */
    s.profile.method = gvote;
    assert_int_equal(rt_server_check_n(&s, 1, &e), 0);
    memset(&e, 0, sizeof(e));
    assert_int_equal(rt_server_check_n(&s, 2, &e), TG_EUNSUPPORTED);
    assert_int_equal(e.kind, RT_REQ_ERR_INVALID);
    assert_string_equal(e.param, "n");
    assert_non_null(strstr(e.message, "gvote"));
    o.method = snapkv;
    assert_int_equal(rt_server_check_n(&s, 2, &e), 0);
    s.profile.method = snapkv;
    o.method = gvote;
    assert_int_equal(rt_server_check_n(&s, 3, &e), TG_EUNSUPPORTED);
    assert_non_null(strstr(e.message, "--method gvote"));
    /* An empty --method means the profile's. */
    o.method = empty;
    assert_int_equal(rt_server_check_n(&s, 3, &e), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_n),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
