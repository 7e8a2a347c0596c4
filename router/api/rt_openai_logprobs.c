/*
 * rt_openai_logprobs.c — the prompt's log-probabilities over the OpenAI
 * API (rt_openai_internal.h): completions "echo" with "logprobs" (the
 * prompt's positions at the front of the logprobs object, as legacy
 * OpenAI and vLLM answer them, the shape lm-evaluation-harness reads),
 * vLLM's "prompt_logprobs", and max_tokens 0 (score the prompt, generate
 * nothing). The values come from the core (struct rt_prompt_lps of
 * router/core/rt_request.h).
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai_internal.h"

static void put(json_t *obj, const char *key, json_t *v, int *bad)
{
    if (json_object_set_new(obj, key, v) != 0)
        *bad = 1;
}

static void push(json_t *arr, json_t *v, int *bad)
{
    if (json_array_append_new(arr, v) != 0)
        *bad = 1;
}

/* echo on completions asks for the prompt, so max_tokens 0 makes sense
 * there (the prompt, scored when logprobs is given, and no output); so
 * does prompt_logprobs on either endpoint. */
int rt_openai__zero_max_ok(const json_t *root, const struct rt_gen_request *r)
{
    if (r->endpoint == RT_ENDPOINT_COMPLETIONS &&
        json_is_true(rt_openai__member(root, "echo")))
        return 1;
    return rt_openai__member(root, "prompt_logprobs") != NULL;
}

int rt_openai__parse_prompt_lp(const json_t *root, struct rt_gen_request *r,
                               bool max_zero, struct rt_request_error *e)
{
    int64_t x = -1;
    bool present = false;
    int rc = rt_openai__get_int(root, "prompt_logprobs", "prompt_logprobs", 0,
                                RT_PROMPT_LPS_MAX_TOP, &x, &present, e);
    if (rc != 0)
        return rc;
    r->prompt_top = present ? (int32_t)x : -1;
    r->echo_top = r->echo && r->q.opts.logprobs >= 0 ? r->q.opts.logprobs : -1;
    /* A batch is answered as one body whose choices are its prompts (the
     * HTTP front end, rt_api_http.c): not as a stream, and one choice
     * per prompt. */
    if (r->n_batch > 0 && r->stream)
        return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                               "unsupported_value", "stream",
                               "'prompt' holds %zu prompts: a batch of "
                               "prompts is answered whole; send stream: "
                               "false, or one prompt per request",
                               r->n_batch + 1);
    if (r->n_batch > 0 && r->q.n > 1)
        return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                               "unsupported_value", "n",
                               "'prompt' holds %zu prompts: a batch of "
                               "prompts takes n = 1 (one choice per prompt)",
                               r->n_batch + 1);
    bool want = r->prompt_top >= 0 || r->echo_top >= 0;
    if (!want && !max_zero)
        return 0;
    const char *what = want ? "the prompt's log-probabilities" : "max_tokens 0";
    const char *param = r->prompt_top >= 0 ? "prompt_logprobs"
                        : want             ? "echo"
                                           : r->q.max_tokens_param;
    /* Values are computed for one prompt and returned whole: a stream
     * would hold them back to the end anyway, and n > 1 would compute
     * them once per choice. */
    if (r->stream)
        return rt_openai__fail(
            e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID, "unsupported_value", param,
            "%s cannot be streamed; send stream: false", what);
    if (r->q.n > 1)
        return rt_openai__fail(
            e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID, "unsupported_value", param,
            "%s: only with n = 1 (got n = %d)", what, (int)r->q.n);
    if (!want)
        return 0;
    r->q.opts.prompt_lp = true;
    r->q.opts.prompt_top = r->prompt_top > r->echo_top ? r->prompt_top
                                                       : r->echo_top;
    return 0;
}

/* Alternatives of position p that were computed (ids >= 0), at most k. */
static int32_t top_count(const struct rt_prompt_lps *p, int64_t pos, int32_t k)
{
    int32_t n = 0;
    while (n < k && n < p->k && p->top_ids[(size_t)pos * p->k + n] >= 0)
        n++;
    return n;
}

void rt_openai__echo_entries(struct rt_resp_ctx *c, json_t *off, json_t *lps,
                             json_t *toks, json_t *tops, int *bad)
{
    const struct rt_prompt_lps *p = c->plp;
    for (int64_t i = 0; i < p->n && !*bad; i++) {
        size_t len;
        const char *s = rt_openai__token_bytes(c, c->prompt_ids[i], &len);
        int64_t cp = 0;
        push(toks, rt_openai__string_lossy(s, len, &cp), bad);
        push(off, json_integer(c->text_offset), bad);
        c->text_offset += cp;
        /* Nothing predicts the first token; a position the core did not
         * fill (never, once the request finished) is null too. */
        if (i == 0 || i > p->have) {
            push(lps, json_null(), bad);
            push(tops, json_null(), bad);
            continue;
        }
        push(lps, rt_openai__logprob_json(p->lp[i]), bad);
        int32_t k = top_count(p, i, c->echo_top);
        if (k == 0) {
            push(tops, json_null(), bad);
            continue;
        }
        json_t *d = json_object();
        for (int32_t t = 0; t < k && !*bad; t++) {
            size_t at = (size_t)i * (size_t)p->k + (size_t)t;
            const char *ts = rt_openai__token_bytes(c, p->top_ids[at], &len);
            json_t *key = rt_openai__string_lossy(ts, len, NULL);
            if (key == NULL) {
                *bad = 1;
                break;
            }
            put(d, json_string_value(key),
                rt_openai__logprob_json(p->top_lps[at]), bad);
            json_decref(key);
        }
        push(tops, d, bad);
    }
}

/* {"logprob", "rank", "decoded_token"} under the id's decimal key. */
static void plp_entry(const struct rt_resp_ctx *c, json_t *d, int32_t id,
                      float lp, int32_t rank, int *bad)
{
    char key[16];
    snprintf(key, sizeof(key), "%" PRId32, id);
    if (json_object_get(d, key) != NULL)
        return;
    size_t len;
    const char *s = rt_openai__token_bytes(c, id, &len);
    json_t *o = json_object();
    put(o, "logprob", rt_openai__logprob_json(lp), bad);
    put(o, "rank", json_integer(rank), bad);
    put(o, "decoded_token", rt_openai__string_lossy(s, len, NULL), bad);
    put(d, key, o, bad);
}

/* vLLM's shape: [null, {"<id>": {"logprob", "rank", "decoded_token"}},
 * ...]: per prompt position the prompt's own token with its rank, then
 * the prompt_top most likely ids (ranks 1, 2, ...). */
json_t *rt_openai__prompt_logprobs(const struct rt_resp_ctx *c)
{
    const struct rt_prompt_lps *p = c->plp;
    json_t *a = json_array();
    int bad = a == NULL;
    for (int64_t i = 0; i < p->n && !bad; i++) {
        if (i == 0 || i > p->have) {
            push(a, json_null(), &bad);
            continue;
        }
        json_t *d = json_object();
        plp_entry(c, d, c->prompt_ids[i], p->lp[i], p->rank[i], &bad);
        int32_t k = top_count(p, i, c->prompt_top);
        for (int32_t t = 0; t < k && !bad; t++) {
            size_t at = (size_t)i * (size_t)p->k + (size_t)t;
            plp_entry(c, d, p->top_ids[at], p->top_lps[at], t + 1, &bad);
        }
        push(a, d, &bad);
    }
    if (bad) {
        json_decref(a);
        return NULL;
    }
    return a;
}
