/* test_openai.c — request parsing of the OpenAI API module
 * (router/api/rt_openai.h): numbers beyond their ranges, body limits, valid
 * requests with their defaults and every field, the context fit check, and
 * /tokenize and /detokenize bodies. The table of invalid requests is in
 * test_openai_invalid.c, chat messages, tools and tool_choice in
 * test_openai_chat.c, responses and SSE frames in test_openai_resp.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai.h"
#include "tests/support/tt_openai.h"

/* The tables' short names of the endpoints. */
#define C TT_EP_COMPLETION
#define H TT_EP_CHAT
#define T TT_EP_TOKENIZE
#define D TT_EP_DETOKENIZE

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

/* Valid JSON numbers out of a field's range, integers beyond 64 bits
 * (which jansson alone refuses as malformed JSON) included, are 400
 * invalid_value naming the field; every other integer of the same request
 * keeps its exact value. */
static void test_big_numbers(void **state)
{
    (void)state;
    static const struct {
        enum tt_ep ep;
        const char *body;
        const char *param; /* "" = null */
        const char *msg;
    } big[] = {
        {C, "{\"prompt\":\"hi\",\"seed\":9223372036854775808}", "seed",
         "between -9223372036854775808 and 9223372036854775807, got "
         "9.2233720368547758e+18"},
        {H, "{" MSG ",\"seed\":18446744073709551616}", "seed",
         "got 1.8446744073709552e+19"},
        {C, "{\"prompt\":\"hi\",\"seed\":-9223372036854775809}", "seed",
         "between -9223372036854775808 and 9223372036854775807, got "
         "-9.2233720368547758e+18 (beyond 64 bits)"},
        {C, "{\"prompt\":\"hi\",\"seed\":1e19}", "seed", "got 1e+19"},
        {C, "{\"prompt\":\"hi\",\"max_tokens\":99999999999999999999999}",
         "max_tokens", "between 1 and 128, got 9.9999999999999992e+22"},
        {H, "{" MSG ",\"max_completion_tokens\":-99999999999999999999}",
         "max_completion_tokens", "between 1 and 128"},
        {C, "{\"prompt\":\"hi\",\"n\":99999999999999999999}", "n",
         "between 1 and"},
        {C, "{\"prompt\":\"hi\",\"best_of\":99999999999999999999}", "best_of",
         "got 1e+20"},
        {C, "{\"prompt\":\"hi\",\"top_k\":4294967296}", "top_k",
         "between -1 and 2147483647, got 4294967296"},
        {C, "{\"prompt\":\"hi\",\"logprobs\":99999999999999999999}", "logprobs",
         "between 0 and 20"},
        {H,
         "{" MSG ",\"logprobs\":true,\"top_logprobs\":"
         "18446744073709551616}",
         "top_logprobs", "between 0 and 20"},
        {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":99999999999999999999}}",
         "logit_bias.5", "[-100, 100]"},
        {C, "{\"prompt\":\"hi\",\"logit_bias\":{\"99999999999999999999\":1}}",
         "logit_bias.99999999999999999999", "is not a token id"},
        {C, "{\"prompt\":[5,99999999999999999999]}", "prompt[1]",
         "is not a token id"},
        {C, "{\"prompt\":[99999999999999999999]}", "prompt[0]",
         "is not a token id"},
        {C, "{\"prompt\":\"hi\",\"stop_token_ids\":[1e20]}",
         "stop_token_ids[0]", "is not a token id"},
        {D, "{\"tokens\":[1,-99999999999999999999]}", "tokens[1]",
         "is not a token id"},
        {T, "{\"prompt\":\"x\",\"seed\":99999999999999999999}", "", ""},
        /* not representable at all: named by line and column */
        {C, "{\"prompt\":\"hi\",\"temperature\":1e400}", "",
         "line 1 column 34 is out of range"},
        {C,
         "{\"prompt\":\"hi\",\"stop\":[\"a\"],\"user\":\"u\",\"x\":"
         "[10000000000000000000,10000000000000000000,10000000000000000000,"
         "10000000000000000000,10000000000000000000,10000000000000000000,"
         "10000000000000000000,10000000000000000000,10000000000000000000]}",
         "", "at most 8 integers"},
    };
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        struct rt_request_error e;
        memset(&e, 0, sizeof(e));
        int rc = tt_openai_parse(big[i].ep, big[i].body, strlen(big[i].body),
                                 &e);
        if (big[i].msg[0] == '\0') {
            /* a field /tokenize ignores: the request parses */
            assert_int_equal(rc, 0);
            continue;
        }
        if (rc != TG_ERANGE || rt_openai_http_status(e.kind) != 400 ||
            strcmp(e.code, "invalid_value") != 0 ||
            strcmp(e.param, big[i].param) != 0 ||
            strstr(e.message, big[i].msg) == NULL) {
            print_error("case %zu: %s\n  rc %d status %d code %s param '%s' "
                        "(want '%s')\n  message: %s\n  want: %s\n",
                        i, big[i].body, rc, rt_openai_http_status(e.kind),
                        e.code, e.param, big[i].param, e.message, big[i].msg);
            fail();
        }
    }

    /* The extremes of the seed's range, and a big integer elsewhere
     * (in a schema) beside exact ones. */
    struct rt_gen_request r;
    struct rt_request_error e;
    const char *b1 = "{\"prompt\":\"hi\",\"seed\":9223372036854775807}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b1, strlen(b1), &r, &e), 0);
    assert_true(r.q.opts.has_seed && r.q.sampling.seed == (uint64_t)INT64_MAX);
    rt_gen_request_free(&r);
    const char *b2 = "{\"prompt\":\"hi\",\"seed\":-9223372036854775808}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b2, strlen(b2), &r, &e), 0);
    assert_true(r.q.sampling.seed == (uint64_t)1 << 63);
    rt_gen_request_free(&r);
    const char *b3 = "{\"prompt\":\"hi\",\"response_format\":{\"type\":"
                     "\"json_schema\",\"json_schema\":{\"name\":\"n\","
                     "\"schema\":{\"enum\":[1,99999999999999999999]}}},"
                     "\"seed\":9007199254740993,"
                     "\"max_tokens\":7}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b3, strlen(b3), &r, &e), 0);
    assert_true(r.q.sampling.seed == 9007199254740993ull); /* 2^53 + 1 */
    assert_int_equal(r.q.opts.max_tokens, 7);
    rt_gen_request_free(&r);

    /* A later syntax error is placed in the body as sent. */
    const char *b4 = "{\"seed\":99999999999999999999,\n"
                     " \"a\":99999999999999999999, \"prompt\":\"hi\",}";
    memset(&e, 0, sizeof(e));
    assert_int_equal(tt_openai_parse(C, b4, strlen(b4), &e), TG_EFORMAT);
    assert_string_equal(e.code, "invalid_json");
    assert_non_null(strstr(e.message, "line 2 column 42"));
}

static void test_body_too_large(void **state)
{
    (void)state;
    size_t n = tt_openai_cfg.max_body_bytes + 1;
    char *body = malloc(n + 1);
    assert_non_null(body);
    memset(body, ' ', n);
    memcpy(body, "{\"prompt\":\"hi\"}", 15);
    body[n] = '\0';
    struct rt_request_error e;
    assert_int_equal(tt_openai_parse(C, body, n, &e), TG_ETOOBIG);
    assert_int_equal(rt_openai_http_status(e.kind), 413);
    assert_string_equal(e.code, "request_too_large");
    assert_non_null(strstr(e.message, "exceeds the limit of 4096 bytes"));
    /* The same body one byte shorter is accepted (trailing whitespace). */
    assert_int_equal(tt_openai_parse(C, body, n - 1, &e), 0);
    free(body);
}

static void test_prompt_ids_over_context(void **state)
{
    (void)state;
    char body[2048] = "{\"prompt\":[";
    for (int i = 0; i < 128; i++)
        snprintf(body + strlen(body), sizeof(body) - strlen(body), "%s%d",
                 i ? "," : "", i);
    strcat(body, "]}");
    struct rt_request_error e;
    assert_int_equal(tt_openai_parse(C, body, strlen(body), &e), TG_ETOOBIG);
    assert_int_equal(rt_openai_http_status(e.kind), 400);
    assert_string_equal(e.param, "prompt");
    assert_string_equal(e.code, "context_length_exceeded");
    assert_non_null(strstr(e.message, "the prompt has 128 tokens"));
}

/* ---- valid requests ---------------------------------------------------- */

static void test_completion_defaults(void **state)
{
    (void)state;
    const char *b = "{\"prompt\":\"Hello\"}";
    struct rt_gen_request r;
    struct rt_request_error e;
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e), 0);
    assert_int_equal(r.endpoint, RT_ENDPOINT_COMPLETIONS);
    assert_string_equal(r.model, "tiny");
    assert_string_equal(r.q.prompt, "Hello");
    assert_int_equal(r.q.prompt_len, 5);
    assert_null(r.q.prompt_ids);
    assert_null(r.q.chat.messages);
    assert_true(r.q.add_special_tokens);
    const struct tg_sampling *s = &r.q.sampling;
    const struct rt_gen_opts *o = &r.q.opts;
    assert_int_equal(o->max_tokens, 16);
    assert_int_equal(o->min_tokens, 0);
    assert_true(s->temperature == 1.0);
    assert_true(s->top_p == 1.0);
    assert_int_equal(s->top_k, 0);
    assert_true(s->min_p == 0.0);
    assert_false(o->has_seed);
    assert_true(s->presence_penalty == 0.0 && s->frequency_penalty == 0.0);
    assert_true(s->repetition_penalty == 1.0);
    assert_false(o->ignore_eos);
    assert_true(o->skip_special_tokens);
    assert_false(o->include_stop_str_in_output);
    assert_int_equal(o->n_stop, 0);
    assert_int_equal(o->n_stop_token_ids, 0);
    assert_int_equal(o->logprobs, -1);
    assert_false(r.stream);
    assert_false(r.include_usage);
    assert_null(r.q.user);
    assert_null(r.q.session_id);
    assert_null(r.q.request_id);
    rt_gen_request_free(&r);
    rt_gen_request_free(&r); /* safe twice: free zeroes */
}

/* tool_choice "required" and a named function become the spec of tool
 * calls in the template's format: all tools, or the named one only, once
 * with parallel_tool_calls false; response_format on top is refused.
 * Strict tools under "auto" become a triggered spec. */
static void test_n_and_sample_copy(void **state)
{
    (void)state;
    struct rt_gen_request r, c;
    struct rt_request_error e;
    const char *b0 = "{\"prompt\":\"Hello\"}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b0, strlen(b0), &r, &e), 0);
    assert_int_equal(r.q.n, 1);
    rt_gen_request_free(&r);
    const char *b1 = "{\"prompt\":\"Hello\",\"n\":16,\"best_of\":16}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b1, strlen(b1), &r, &e), 0);
    assert_int_equal(r.q.n, 16);
    rt_gen_request_free(&r);
    const char *b2 = "{" MSG ",\"n\":3.0,\"best_of\":null,\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true},"
                     "\"stop\":[\"x\",\"yz\"],\"stop_token_ids\":[5,6],"
                     "\"logit_bias\":{\"7\":-1.5},\"seed\":42,"
                     "\"max_tokens\":9,\"temperature\":0.5,\"logprobs\":true,"
                     "\"top_logprobs\":2,\"user\":\"u1\","
                     "\"session_id\":\"s1\",\"tools\":[{\"type\":\"function\","
                     "\"function\":{\"name\":\"f\"}}],"
                     "\"response_format\":{\"type\":\"json_object\"}}";
    assert_int_equal(
        rt_openai_parse_chat(&tt_openai_cfg, b2, strlen(b2), &r, &e), 0);
    assert_int_equal(r.q.n, 3);
    /* response_format: the spec text of any JSON object (gm_spec.h). */
    assert_non_null(r.q.grammar);
    assert_non_null(strstr(r.q.grammar, "json_object"));
    memset(&c, 0, sizeof(c));
    assert_int_equal(rt_request_copy_sample(&r.q, &c.q), 0);
    assert_non_null(c.q.grammar);
    assert_ptr_not_equal(c.q.grammar, r.q.grammar);
    assert_string_equal(c.q.grammar, r.q.grammar);
    /* What a sample needs, as deep copies (or a reference to the tools);
     * the API's own part (endpoint, stream options, echo text) is the
     * front end's copy (rt_api_gen_attach_sample)... */
    assert_true(c.q.is_chat);
    assert_int_equal(c.q.n, 1);
    assert_int_equal(c.q.opts.n_stop, 2);
    assert_string_equal(c.q.opts.stop[1], "yz");
    assert_ptr_not_equal(c.q.opts.stop, r.q.opts.stop);
    assert_ptr_not_equal(c.q.opts.stop[0], r.q.opts.stop[0]);
    assert_int_equal(c.q.opts.n_stop_token_ids, 2);
    assert_int_equal(c.q.opts.stop_token_ids[1], 6);
    assert_ptr_not_equal(c.q.opts.stop_token_ids, r.q.opts.stop_token_ids);
    assert_int_equal(c.q.sampling.n_bias, 1);
    assert_int_equal(c.q.sampling.bias_ids[0], 7);
    assert_true(c.q.sampling.bias_vals[0] == -1.5f);
    assert_true(c.q.opts.has_seed && c.q.sampling.seed == 42);
    assert_int_equal(c.q.opts.max_tokens, 9);
    assert_true(c.q.sampling.temperature == 0.5);
    assert_int_equal(c.q.opts.logprobs, 2);
    assert_string_equal(c.q.user, "u1");
    assert_ptr_equal(c.q.chat.tools, r.q.chat.tools);
    /* ... and nothing of the prompt or the session. */
    assert_null(c.q.chat.messages);
    assert_null(c.q.prompt);
    assert_null(c.q.session_id);
    /* Each frees its own. */
    rt_gen_request_free(&r);
    assert_string_equal(c.q.opts.stop[0], "x");
    assert_int_equal((int)c.q.chat.tools->n, 1);
    rt_gen_request_free(&c);
}

static void test_completion_all_fields(void **state)
{
    (void)state;
    const char *b =
        "{\"model\":\"tiny\",\"prompt\":[1,2,999],\"max_tokens\":32.0,"
        "\"min_tokens\":2,\"temperature\":0,\"top_p\":0.9,\"top_k\":40,"
        "\"min_p\":0.05,\"seed\":-7,\"presence_penalty\":-2,"
        "\"frequency_penalty\":1.5,\"repetition_penalty\":1.1,"
        "\"stop\":\"END\",\"stop_token_ids\":[7,8],\"ignore_eos\":true,"
        "\"skip_special_tokens\":false,\"include_stop_str_in_output\":true,"
        "\"logprobs\":5,\"stream\":true,\"stream_options\":{\"include_usage\":"
        "true,\"continuous_usage_stats\":true},\"user\":\"u1\","
        "\"session_id\":\"conv-9\",\"request_id\":\"r-1\",\"n\":1,"
        "\"best_of\":null,\"echo\":false,\"suffix\":null,\"logit_bias\":{},"
        "\"response_format\":{\"type\":\"text\"},"
        "\"unknown_field\":{\"deep\":[1,2,{\"x\":null}]},\"add_special_"
        "tokens\":"
        "false}";
    struct rt_gen_request r;
    struct rt_request_error e;
    int rc = rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e);
    if (rc)
        print_error("%s (param %s)\n", e.message, e.param);
    assert_int_equal(rc, 0);
    assert_null(r.q.prompt);
    assert_int_equal(r.q.n_prompt_ids, 3);
    assert_int_equal(r.q.prompt_ids[2], 999);
    assert_false(r.q.add_special_tokens);
    const struct tg_sampling *s = &r.q.sampling;
    const struct rt_gen_opts *o = &r.q.opts;
    assert_int_equal(o->max_tokens, 32);
    assert_int_equal(o->min_tokens, 2);
    assert_true(s->temperature == 0.0);
    assert_true(s->top_p == 0.9f);
    assert_int_equal(s->top_k, 40);
    assert_true(s->min_p == 0.05f);
    assert_true(o->has_seed);
    assert_true(s->seed == (uint64_t)(int64_t)-7);
    assert_true(s->presence_penalty == -2.0);
    assert_true(s->frequency_penalty == 1.5);
    assert_true(s->repetition_penalty == 1.1f);
    assert_int_equal(o->n_stop, 1);
    assert_string_equal(o->stop[0], "END");
    assert_int_equal(o->n_stop_token_ids, 2);
    assert_int_equal(o->stop_token_ids[1], 8);
    assert_true(o->ignore_eos);
    assert_false(o->skip_special_tokens);
    assert_true(o->include_stop_str_in_output);
    assert_int_equal(o->logprobs, 5);
    assert_int_equal(s->n_top, 5);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_true(r.continuous_usage);
    assert_string_equal(r.q.user, "u1");
    assert_string_equal(r.q.session_id, "conv-9");
    assert_string_equal(r.q.request_id, "r-1");
    assert_string_equal(r.q.max_tokens_param, "max_tokens");
    rt_gen_request_free(&r);
}

/* echo with logprobs and prompt_logprobs ask the core for the prompt's
 * values (the larger count of alternatives); max_tokens 0 scores the
 * prompt and generates nothing (one draw, dropped). */
static void test_prompt_logprobs(void **state)
{
    (void)state;
    struct rt_gen_request r;
    struct rt_request_error e;
    const char *b = "{\"prompt\":[1,2,3],\"echo\":true,\"logprobs\":1,"
                    "\"max_tokens\":1}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e), 0);
    assert_true(r.q.opts.prompt_lp);
    assert_int_equal(r.q.opts.prompt_top, 1);
    assert_int_equal(r.echo_top, 1);
    assert_int_equal(r.prompt_top, -1);
    assert_false(r.q.opts.prompt_only);
    assert_int_equal(r.q.opts.max_tokens, 1);
    rt_gen_request_free(&r);
    b = "{\"prompt\":[[1,2,3]],\"echo\":true,\"logprobs\":2,"
        "\"prompt_logprobs\":5,\"max_tokens\":0}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e), 0);
    assert_true(r.q.opts.prompt_lp);
    assert_int_equal(r.q.opts.prompt_top, 5);
    assert_int_equal(r.echo_top, 2);
    assert_int_equal(r.prompt_top, 5);
    assert_true(r.q.opts.prompt_only);
    assert_int_equal(r.q.opts.max_tokens, 1);
    rt_gen_request_free(&r);
    /* echo alone with max_tokens 0: the prompt, nothing scored */
    b = "{\"prompt\":\"hi\",\"echo\":true,\"max_tokens\":0}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e), 0);
    assert_false(r.q.opts.prompt_lp);
    assert_true(r.q.opts.prompt_only);
    rt_gen_request_free(&r);
    /* chat: prompt_logprobs, max_tokens 0 allowed with it */
    b = "{" MSG ",\"prompt_logprobs\":0,\"max_tokens\":0}";
    assert_int_equal(rt_openai_parse_chat(&tt_openai_cfg, b, strlen(b), &r, &e),
                     0);
    assert_true(r.q.opts.prompt_lp);
    assert_int_equal(r.q.opts.prompt_top, 0);
    assert_int_equal(r.echo_top, -1);
    assert_int_equal(r.prompt_top, 0);
    assert_true(r.q.opts.prompt_only);
    rt_gen_request_free(&r);
    /* neither: nothing asked */
    b = "{\"prompt\":\"hi\",\"logprobs\":1}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e), 0);
    assert_false(r.q.opts.prompt_lp);
    assert_int_equal(r.echo_top, -1);
    rt_gen_request_free(&r);
}

static void test_logit_bias_and_echo(void **state)
{
    (void)state;
    const char *b = "{\"prompt\":\"hi\",\"echo\":true,\"logit_bias\":"
                    "{\"999\":-100,\"3\":2.5,\"0\":100}}";
    struct rt_gen_request r;
    struct rt_request_error e;
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e), 0);
    assert_true(r.echo);
    assert_null(r.echo_text); /* the front end fills it */
    assert_int_equal(r.q.sampling.n_bias, 3);
    /* sorted by id */
    assert_int_equal(r.q.sampling.bias_ids[0], 0);
    assert_int_equal(r.q.sampling.bias_ids[1], 3);
    assert_int_equal(r.q.sampling.bias_ids[2], 999);
    assert_true(r.q.sampling.bias_vals[0] == 100.0f);
    assert_true(r.q.sampling.bias_vals[1] == 2.5f);
    assert_true(r.q.sampling.bias_vals[2] == -100.0f);
    rt_gen_request_free(&r);
    /* chat takes logit_bias too; an empty map is none */
    b = "{" MSG ",\"logit_bias\":{\"42\":-100}}";
    assert_int_equal(rt_openai_parse_chat(&tt_openai_cfg, b, strlen(b), &r, &e),
                     0);
    assert_int_equal(r.q.sampling.n_bias, 1);
    assert_int_equal(r.q.sampling.bias_ids[0], 42);
    assert_false(r.echo);
    rt_gen_request_free(&r);
    b = "{\"prompt\":\"hi\",\"logit_bias\":{},\"echo\":false}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b, strlen(b), &r, &e), 0);
    assert_int_equal(r.q.sampling.n_bias, 0);
    assert_null(r.q.sampling.bias_ids);
    rt_gen_request_free(&r);
}

static void test_completion_prompt_forms(void **state)
{
    (void)state;
    struct rt_gen_request r;
    struct rt_request_error e;
    const char *b1 = "{\"prompt\":[\"one prompt\"],\"top_k\":-1,"
                     "\"stop\":[\"a\",\"bb\"],\"logprobs\":0,\"seed\":null}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b1, strlen(b1), &r, &e), 0);
    assert_string_equal(r.q.prompt, "one prompt");
    assert_int_equal(r.q.sampling.top_k, 0);
    assert_int_equal(r.q.opts.n_stop, 2);
    assert_string_equal(r.q.opts.stop[1], "bb");
    assert_int_equal(r.q.opts.logprobs, 0);
    assert_false(r.q.opts.has_seed);
    rt_gen_request_free(&r);

    const char *b2 = "{\"prompt\":[[5,6]],\"stop\":[],\"top_k\":0}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b2, strlen(b2), &r, &e), 0);
    assert_null(r.q.prompt);
    assert_int_equal(r.q.n_prompt_ids, 2);
    assert_int_equal(r.q.prompt_ids[0], 5);
    assert_int_equal(r.q.opts.n_stop, 0);
    assert_int_equal(r.q.sampling.top_k, 0);
    rt_gen_request_free(&r);

    /* UTF-8 and escapes come through byte-exact. */
    const char *b3 = "{\"prompt\":\"caf\\u00e9 \\ud83d\\ude00\\n\"}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b3, strlen(b3), &r, &e), 0);
    assert_string_equal(r.q.prompt, "caf\xC3\xA9 \xF0\x9F\x98\x80\n");
    rt_gen_request_free(&r);

    /* A batch: the first prompt in q, the others in batch, each in its
     * own form; the options are q's, shared. */
    const char *b4 = "{\"prompt\":[\"first\",[7,8,9]],\"echo\":true,"
                     "\"logprobs\":2,\"max_tokens\":0}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b4, strlen(b4), &r, &e), 0);
    assert_string_equal(r.q.prompt, "first");
    assert_int_equal(r.n_batch, 1);
    assert_null(r.batch[0].prompt);
    assert_int_equal(r.batch[0].n_prompt_ids, 3);
    assert_int_equal(r.batch[0].prompt_ids[2], 9);
    assert_int_equal(r.echo_top, 2);
    assert_true(r.q.opts.prompt_lp && r.q.opts.prompt_only);
    rt_gen_request_free(&r);
}

static void test_fit(void **state)
{
    (void)state;
    struct rt_gen_request r;
    struct rt_request_error e;
    const char *b = "{" MSG "}";
    assert_int_equal(rt_openai_parse_chat(&tt_openai_cfg, b, strlen(b), &r, &e),
                     0);
    assert_int_equal(rt_request_fit(&r.q, 128, 100, &e), 0);
    assert_int_equal(r.q.opts.max_tokens, 28); /* the room left */
    assert_int_equal(rt_request_fit(&r.q, 128, 0, &e), TG_EFORMAT);
    assert_string_equal(e.param, "messages");
    assert_int_equal(rt_request_fit(&r.q, 128, 128, &e), TG_ETOOBIG);
    assert_string_equal(e.param, "messages");
    assert_string_equal(e.code, "context_length_exceeded");
    assert_int_equal(rt_openai_http_status(e.kind), 400);
    rt_gen_request_free(&r);

    const char *b2 = "{\"prompt\":\"x\",\"max_tokens\":16,\"min_tokens\":9}";
    assert_int_equal(
        rt_openai_parse_completion(&tt_openai_cfg, b2, strlen(b2), &r, &e), 0);
    assert_int_equal(rt_request_fit(&r.q, 128, 112, &e), 0);
    assert_int_equal(r.q.opts.max_tokens, 16);
    assert_int_equal(rt_request_fit(&r.q, 128, 113, &e), TG_ETOOBIG);
    assert_string_equal(e.param, "max_tokens");
    assert_non_null(strstr(e.message, "113 prompt tokens plus 16"));
    assert_int_equal(rt_request_fit(&r.q, 0, 100000, &e), 0); /* unchecked */
    rt_gen_request_free(&r);

    const char *b3 = "{" MSG ",\"min_tokens\":20}";
    assert_int_equal(
        rt_openai_parse_chat(&tt_openai_cfg, b3, strlen(b3), &r, &e), 0);
    assert_int_equal(rt_request_fit(&r.q, 128, 120, &e), TG_ERANGE);
    assert_string_equal(e.param, "min_tokens");
    rt_gen_request_free(&r);
}

static void test_tokenize_requests(void **state)
{
    (void)state;
    struct rt_tokenize_request t;
    struct rt_request_error e;
    const char *b1 = "{\"model\":\"tiny\",\"prompt\":\"\"}";
    assert_int_equal(
        rt_openai_parse_tokenize(&tt_openai_cfg, b1, strlen(b1), &t, &e), 0);
    assert_string_equal(t.prompt, "");
    assert_true(t.add_special_tokens);
    assert_false(t.return_token_strs);
    assert_null(t.chat.messages);
    rt_tokenize_request_free(&t);

    const char *b2 = "{" MSG ",\"return_token_strs\":true}";
    assert_int_equal(
        rt_openai_parse_tokenize(&tt_openai_cfg, b2, strlen(b2), &t, &e), 0);
    assert_null(t.prompt);
    assert_int_equal(t.chat.n_messages, 1);
    assert_string_equal(t.chat.messages[0].content, "hi");
    assert_false(t.add_special_tokens);
    assert_true(t.chat.add_generation_prompt);
    assert_true(t.return_token_strs);
    rt_tokenize_request_free(&t);

    struct rt_detokenize_request d;
    const char *b3 = "{\"tokens\":[]}";
    assert_int_equal(
        rt_openai_parse_detokenize(&tt_openai_cfg, b3, strlen(b3), &d, &e), 0);
    assert_int_equal(d.n_tokens, 0);
    assert_string_equal(d.model, "tiny");
    rt_detokenize_request_free(&d);
    const char *b4 = "{\"model\":null,\"tokens\":[0,999,3]}";
    assert_int_equal(
        rt_openai_parse_detokenize(&tt_openai_cfg, b4, strlen(b4), &d, &e), 0);
    assert_int_equal(d.n_tokens, 3);
    assert_int_equal(d.tokens[1], 999);
    rt_detokenize_request_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_big_numbers),
        cmocka_unit_test(test_body_too_large),
        cmocka_unit_test(test_prompt_ids_over_context),
        cmocka_unit_test(test_completion_defaults),
        cmocka_unit_test(test_n_and_sample_copy),
        cmocka_unit_test(test_completion_all_fields),
        cmocka_unit_test(test_logit_bias_and_echo),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_completion_prompt_forms),
        cmocka_unit_test(test_fit),
        cmocka_unit_test(test_tokenize_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
