/* test_fields.c — the one table of the API's numeric sampling fields
 * (router/api/rt_fields.h), as both front ends parse from it: the OpenAI
 * body (rt_openai_parse_completion) and the gRPC GenerateRequest
 * (rt_api_grpc_convert). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_api_grpc.h"
#include "router/api/rt_fields.h"
#include "router/api/rt_openai.h"
#include "router/net/rt_grpc.h"
#include "tangram.pb-c.h"

/* Both front ends take the numeric sampling fields from one table
 * (rt_fields.h): the same value out of range is refused by each with the
 * same sentence (the gRPC field under "sampling."), one in range is
 * taken by each, and a field left out gets the table's default. */
static void test_fields_one_table(void **state)
{
    (void)state;
    static const struct rt_openai_cfg cfg = {.served_model = "tiny",
                                             .vocab_size = 1000};
    static const struct rt_grpc_header hdrs[] = {
        {":path", "/tangram.v1.Generation/Generate"}};
    struct rt_grpc_call call;
    memset(&call, 0, sizeof(call));
    call.path = hdrs[0].value;
    call.headers = hdrs;
    call.n_headers = 1;
    /* temperature's range is [0, 2] */
    const struct {
        double t;
        int ok;
    } temps[] = {{2.5, 0}, {-0.5, 0}, {1.5, 1}, {0.0, 1}, {NAN, 0}};
    for (size_t i = 0; i < sizeof(temps) / sizeof(temps[0]); i++) {
        double t = temps[i].t;
        int ok = temps[i].ok;
        struct rt_gen_request h, g;
        struct rt_request_error eh, eg;
        memset(&h, 0, sizeof(h));
        memset(&g, 0, sizeof(g));
        int rh = 0;
        if (!isnan(t)) { /* JSON has no NaN */
            char body[128];
            snprintf(body, sizeof(body),
                     "{\"prompt\":\"x\",\"temperature\":%g}", t);
            rh = rt_openai_parse_completion(&cfg, body, strlen(body), &h, &eh);
            assert_int_equal(rh == 0, ok);
        }
        Tangram__V1__SamplingParams sp = TANGRAM__V1__SAMPLING_PARAMS__INIT;
        sp.temperature_opt_case =
            TANGRAM__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
        sp.temperature = t;
        Tangram__V1__GenerateRequest q = TANGRAM__V1__GENERATE_REQUEST__INIT;
        q.prompt = "x";
        q.sampling = &sp;
        int rg = rt_api_grpc_convert(&cfg, &q, &g, &eg, &call);
        assert_int_equal(rg == 0, ok);
        if (ok) {
            assert_true(h.q.sampling.temperature == (float)t);
            assert_true(g.q.sampling.temperature == (float)t);
        } else {
            assert_int_equal(eg.kind, RT_REQ_ERR_INVALID);
            assert_string_equal(eg.param, "sampling.temperature");
            if (!isnan(t)) {
                assert_int_equal(rh, rg);
                assert_string_equal(eh.param, "temperature");
                /* the same sentence, the name aside */
                assert_string_equal(strchr(eh.message, ' '),
                                    strchr(eg.message, ' '));
            }
        }
        rt_gen_request_free(&h);
        rt_gen_request_free(&g);
    }
    /* Left out: the table's defaults on both sides. */
    struct rt_gen_request h, g;
    struct rt_request_error e;
    memset(&h, 0, sizeof(h));
    memset(&g, 0, sizeof(g));
    const char *b = "{\"prompt\":\"x\"}";
    assert_int_equal(rt_openai_parse_completion(&cfg, b, strlen(b), &h, &e), 0);
    Tangram__V1__GenerateRequest q = TANGRAM__V1__GENERATE_REQUEST__INIT;
    q.prompt = "x";
    assert_int_equal(rt_api_grpc_convert(&cfg, &q, &g, &e, &call), 0);
    for (int f = 0; f < RT_FIELD_COUNT; f++) {
        float want = (float)rt_fields[f].def;
        assert_true(*rt_field_of((enum rt_field)f, &h.q.sampling) == want);
        assert_true(*rt_field_of((enum rt_field)f, &g.q.sampling) == want);
    }
    rt_gen_request_free(&h);
    rt_gen_request_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields_one_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
