/* test_fields.c — the tables of the API's numeric request fields
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

/* The whole-number fields (rt_fields.h RT_INT_FIELDS): a value out of
 * range is refused by both front ends with the same sentence, a value in
 * range taken by both. */
static void test_int_fields_one_table(void **state)
{
    (void)state;
    static const struct rt_openai_cfg cfg = {.served_model = "tiny",
                                             .vocab_size = 1000};
    struct rt_grpc_call call;
    memset(&call, 0, sizeof(call));
    static char *stops[17] = {"a", "b", "c", "d", "e", "f", "g", "h", "i",
                              "j", "k", "l", "m", "n", "o", "p", "q"};
    const struct {
        const char *json; /* completions body members */
        int top_k_set, top_k, logprobs, max_set, max, min_set, min, n_stop;
        int ok;
        const char *param; /* the HTTP name; gRPC's is "sampling." it */
    } cases[] = {
        {"\"top_k\":-2", 1, -2, 0, 0, 0, 0, 0, 0, 0, "top_k"},
        {"\"top_k\":5", 1, 5, 0, 0, 0, 0, 0, 0, 1, NULL},
        {"\"top_k\":-1", 1, -1, 0, 0, 0, 0, 0, 0, 1, NULL},
        {"\"logprobs\":21", 0, 0, 21, 0, 0, 0, 0, 0, 0, "logprobs"},
        {"\"logprobs\":3", 0, 0, 3, 0, 0, 0, 0, 0, 1, NULL},
        {"\"max_tokens\":0", 0, 0, 0, 1, 0, 0, 0, 0, 0, "max_tokens"},
        {"\"max_tokens\":4,\"min_tokens\":5", 0, 0, 0, 1, 4, 1, 5, 0, 0,
         "min_tokens"},
        {"\"max_tokens\":4,\"min_tokens\":4", 0, 0, 0, 1, 4, 1, 4, 0, 1, NULL},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\","
         "\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]",
         0, 0, 0, 0, 0, 0, 0, 17, 0, "stop"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct rt_gen_request h, g;
        struct rt_request_error eh, eg;
        memset(&h, 0, sizeof(h));
        memset(&g, 0, sizeof(g));
        char body[256];
        snprintf(body, sizeof(body), "{\"prompt\":\"x\",%s}", cases[i].json);
        int rh = rt_openai_parse_completion(&cfg, body, strlen(body), &h, &eh);
        Tangram__V1__SamplingParams sp = TANGRAM__V1__SAMPLING_PARAMS__INIT;
        if (cases[i].top_k_set) {
            sp.top_k_opt_case = TANGRAM__V1__SAMPLING_PARAMS__TOP_K_OPT_TOP_K;
            sp.top_k = cases[i].top_k;
        }
        sp.logprobs = (uint32_t)cases[i].logprobs;
        if (cases[i].max_set) {
            sp.max_tokens_opt_case =
                TANGRAM__V1__SAMPLING_PARAMS__MAX_TOKENS_OPT_MAX_TOKENS;
            sp.max_tokens = (uint32_t)cases[i].max;
        }
        if (cases[i].min_set) {
            sp.min_tokens_opt_case =
                TANGRAM__V1__SAMPLING_PARAMS__MIN_TOKENS_OPT_MIN_TOKENS;
            sp.min_tokens = (uint32_t)cases[i].min;
        }
        sp.n_stop = (size_t)cases[i].n_stop;
        sp.stop = stops;
        Tangram__V1__GenerateRequest q = TANGRAM__V1__GENERATE_REQUEST__INIT;
        q.prompt = "x";
        q.sampling = &sp;
        int rg = rt_api_grpc_convert(&cfg, &q, &g, &eg, &call);
        if (cases[i].ok) {
            assert_int_equal(rh, 0);
            assert_int_equal(rg, 0);
            assert_int_equal(h.q.sampling.top_k, g.q.sampling.top_k);
            assert_int_equal(h.q.opts.logprobs, g.q.opts.logprobs);
            assert_int_equal(h.q.opts.min_tokens, g.q.opts.min_tokens);
        } else {
            char want[64];
            snprintf(want, sizeof(want), "sampling.%s", cases[i].param);
            assert_int_not_equal(rh, 0);
            assert_int_not_equal(rg, 0);
            assert_string_equal(eh.param, cases[i].param);
            assert_string_equal(eg.param, want);
            if (strcmp(cases[i].param, "min_tokens") != 0) /* names both */
                assert_string_equal(strchr(eh.message, ' '),
                                    strchr(eg.message, ' '));
        }
        rt_gen_request_free(&h);
        rt_gen_request_free(&g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields_one_table),
        cmocka_unit_test(test_int_fields_one_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
