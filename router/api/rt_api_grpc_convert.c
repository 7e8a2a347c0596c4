/* rt_api_grpc_convert.c — a tangram.v1.GenerateRequest into the parsed
 * request both front ends hand to the core (rt_api_grpc.h): the prompt
 * forms, the chat and its tools, structured outputs, the session and the
 * sampling fields from the table the HTTP API parses from (rt_fields.h).
 * Any thread. */
#include "router/api/rt_api_grpc.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/json/tg_json.h"
#include "router/api/rt_api.h"
#include "router/api/rt_api_grpc_internal.h"
#include "router/api/rt_fields.h"
#include "router/api/rt_openai_chat.h"

/* GenerateRequest -> rt_gen_request with the OpenAI defaults
 * (rt_api_grpc.h). */
int rt_api_grpc_convert(const struct rt_openai_cfg *cfg,
                        const Tangram__V1__GenerateRequest *q,
                        struct rt_gen_request *g, struct rt_request_error *e,
                        const struct rt_grpc_call *call)
{
    int forms = (q->prompt != NULL && q->prompt[0] != '\0') +
                (q->n_prompt_token_ids > 0) + (q->n_messages > 0);
    if (forms != 1) {
        rt_request_error_set(
            e, RT_REQ_ERR_INVALID, "invalid_value", "prompt",
            "give exactly one of prompt, prompt_token_ids and messages");
        return TG_EINVAL;
    }
    if (q->n_messages == 0 &&
        (q->n_tools > 0 || (q->tool_choice && q->tool_choice[0]))) {
        rt_request_error_set(
            e, RT_REQ_ERR_INVALID, "invalid_value", "tools",
            "tools and tool_choice apply to chats (messages) only");
        return TG_EINVAL;
    }
    memset(g, 0, sizeof(*g));
    struct tg_sampling *sp = &g->q.sampling;
    struct rt_gen_opts *o = &g->q.opts;
    rt_gen_request_defaults(g);
    g->q.max_tokens_param = "sampling.max_tokens";
    /* response_format and structured_outputs as the OpenAI parser reads
     * them; so_root lives until the whitespace policy is applied */
    json_t *so_root = json_object();
    if (so_root == NULL)
        goto nomem;
    static const char *const texts[] = {"response_format",
                                        "structured_outputs"};
    for (int k = 0; k < 2; k++) {
        const char *t = k == 0 ? q->response_format : q->structured_outputs;
        if (t == NULL || t[0] == '\0')
            continue;
        json_error_t je;
        json_t *v = tg_json_loadb_wide(t, strlen(t), 0, &je);
        if (v == NULL) {
            json_decref(so_root);
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value",
                                 texts[k], "%s is not JSON: %s", texts[k],
                                 je.text);
            return TG_EINVAL;
        }
        if (json_object_set_new(so_root, texts[k], v) != 0) {
            json_decref(so_root);
            goto nomem;
        }
    }
    int ws = 0;
    {
        int rc = rt_openai_parse_response_format(so_root, &g->q.grammar, e);
        if (rc == 0)
            rc = rt_openai_parse_structured(so_root, &g->q.grammar, e);
        if (rc == 0)
            rc = rt_openai_structured_ws(cfg, so_root, &ws, e);
        json_decref(so_root);
        if (rc == 0 && q->n_messages == 0) /* no tools: applied now */
            rc = rt_openai_structured_apply_ws(ws, &g->q.grammar, e);
        if (rc != 0) {
            if (rc == TG_ENOMEM && e->kind == RT_REQ_ERR_NONE)
                goto nomem;
            return rc;
        }
    }
    g->model = strdup(cfg->served_model);
    if (g->model == NULL)
        goto nomem;
    if (q->n_messages > 0) {
        g->endpoint = RT_ENDPOINT_CHAT;
        g->q.is_chat = true;
        g->q.chat.add_generation_prompt = true;
        bool par = q->parallel_tool_calls;
        struct rt_tool_sel sel;
        int rc = rt_api_grpc__chat(q->messages, q->n_messages, q->tools,
                                   q->n_tools, &g->q.chat, e);
        if (rc == 0)
            rc = rt_api_grpc__tool_sel(
                q->tool_choice,
                q->parallel_tool_calls_opt_case ==
                        TANGRAM__V1__GENERATE_REQUEST__PARALLEL_TOOL_CALLS_OPT_PARALLEL_TOOL_CALLS
                    ? &par
                    : NULL,
                g->q.chat.tools, &sel, e);
        if (rc == 0)
            rc = rt_openai_tool_grammar(cfg, g->q.chat.tools, &sel,
                                        &g->q.grammar, &g->q.grammar_param, e);
        if (rc == 0)
            rc = rt_openai_structured_apply_ws(ws, &g->q.grammar, e);
        if (rc != 0)
            return rc;
        g->tool_choice = sel.choice;
    } else if (q->n_prompt_token_ids > 0) {
        g->endpoint = RT_ENDPOINT_COMPLETIONS;
        g->q.add_special_tokens = true;
        g->q.prompt_ids = malloc(q->n_prompt_token_ids * sizeof(int32_t));
        if (g->q.prompt_ids == NULL)
            goto nomem;
        for (size_t i = 0; i < q->n_prompt_token_ids; i++) {
            if (q->prompt_token_ids[i] > INT32_MAX) {
                rt_request_error_set(
                    e, RT_REQ_ERR_INVALID, "invalid_value", "prompt_token_ids",
                    "prompt_token_ids[%zu] is not a token id", i);
                return TG_EINVAL;
            }
            g->q.prompt_ids[i] = (int32_t)q->prompt_token_ids[i];
        }
        g->q.n_prompt_ids = q->n_prompt_token_ids;
    } else {
        g->endpoint = RT_ENDPOINT_COMPLETIONS;
        g->q.add_special_tokens = true;
        g->q.prompt = strdup(q->prompt);
        if (g->q.prompt == NULL)
            goto nomem;
        g->q.prompt_len = strlen(q->prompt);
    }
    /* The x-session-id metadata is checked like HTTP's X-Session-Id; the
     * session_id field wins. An empty session_id is proto3's "unset". */
    {
        int rc = rt_api_session(&g->q, q->session_id, "session_id",
                                rt_grpc_call_header(call, "x-session-id"),
                                rt_grpc_call_header_count(call, "x-session-id"),
                                "x-session-id", e);
        if (rc != 0)
            return rc;
    }
    if (q->request_id != NULL && q->request_id[0] != '\0' &&
        (g->q.request_id = strdup(q->request_id)) == NULL)
        goto nomem;
    if (q->prompt_logprobs_opt_case) {
        if (q->prompt_logprobs > RT_PROMPT_LPS_MAX_TOP) {
            rt_request_error_set(
                e, RT_REQ_ERR_INVALID, "invalid_value", "prompt_logprobs",
                "prompt_logprobs must be at most %d", RT_PROMPT_LPS_MAX_TOP);
            return TG_EINVAL;
        }
        o->prompt_lp = true;
        o->prompt_top = (int32_t)q->prompt_logprobs;
    }
    const Tangram__V1__SamplingParams *p = q->sampling;
    if (p == NULL)
        return rt_openai_check_sampling(sp, cfg->vocab_size, "sampling.", e);
#define RANGE(cond, field, ...)                                          \
    do {                                                                 \
        if (!(cond)) {                                                   \
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", \
                                 "sampling." field, __VA_ARGS__);        \
            return TG_EINVAL;                                            \
        }                                                                \
    } while (0)
    /* The whole-number fields from the table the HTTP API parses from
     * too (rt_fields.h). */
    int64_t lo, hi;
    int rc;
    if (p->max_tokens_opt_case) {
        /* 0 scores the prompt alone (one draw, dropped) */
        rt_int_field_range(RT_INT_FIELD_MAX_TOKENS, 0, &lo, &hi);
        if ((rc = rt_int_check(p->max_tokens, o->prompt_lp ? 0 : lo, hi, NULL,
                               "sampling.max_tokens", e)))
            return rc;
        o->max_tokens = p->max_tokens > 0 ? (int32_t)p->max_tokens : 1;
        o->prompt_only = p->max_tokens == 0;
    }
    if (p->min_tokens_opt_case) {
        rt_int_field_range(RT_INT_FIELD_MIN_TOKENS, 0, &lo, &hi);
        if ((rc = rt_int_check(p->min_tokens, lo, hi, NULL,
                               "sampling.min_tokens", e)))
            return rc;
        o->min_tokens = (int32_t)p->min_tokens;
        if ((rc = rt_min_tokens_check(
                 o->min_tokens, p->max_tokens_opt_case ? o->max_tokens : 0,
                 "sampling.min_tokens", "sampling.max_tokens", e)))
            return rc;
    }
    if (p->top_k_opt_case) {
        rt_int_field_range(RT_INT_FIELD_TOP_K, 0, &lo, &hi);
        if ((rc = rt_int_check(p->top_k, lo, hi, NULL, "sampling.top_k", e)))
            return rc;
        sp->top_k = p->top_k > 0 ? p->top_k : 0;
    }
    rt_int_field_range(RT_INT_FIELD_LOGPROBS, 0, &lo, &hi);
    if ((rc = rt_int_check(p->logprobs, lo, hi, NULL, "sampling.logprobs",
                           e)) ||
        (rc = rt_int_count_check(RT_INT_FIELD_STOP, p->n_stop, "sampling.stop",
                                 e)) ||
        (rc = rt_int_count_check(RT_INT_FIELD_STOP_TOKEN_IDS,
                                 p->n_stop_token_ids, "sampling.stop_token_ids",
                                 e)))
        return rc;
    /* The numeric sampling fields, ranges and all, from the table the
     * HTTP API parses from too (rt_fields.h). presence_penalty and
     * frequency_penalty are plain proto3 doubles: 0 when not sent. */
    const struct {
        enum rt_field f;
        bool sent;
        double x;
    } nums[] = {
        {RT_FIELD_TEMPERATURE, p->temperature_opt_case != 0, p->temperature},
        {RT_FIELD_TOP_P, p->top_p_opt_case != 0, p->top_p},
        {RT_FIELD_MIN_P, p->min_p_opt_case != 0, p->min_p},
        {RT_FIELD_PRESENCE_PENALTY, true, p->presence_penalty},
        {RT_FIELD_FREQUENCY_PENALTY, true, p->frequency_penalty},
        {RT_FIELD_REPETITION_PENALTY, p->repetition_penalty_opt_case != 0,
         p->repetition_penalty},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (!nums[i].sent)
            continue;
        rc = rt_field_check(nums[i].f, nums[i].x, "sampling.", e);
        if (rc != 0)
            return rc;
        *rt_field_of(nums[i].f, sp) = (float)nums[i].x;
    }
    if (p->seed_opt_case) {
        o->has_seed = true;
        sp->seed = (uint64_t)p->seed;
    }
    o->ignore_eos = p->ignore_eos;
    o->logprobs = p->logprobs > 0 ? (int32_t)p->logprobs : -1;
    sp->n_top = o->logprobs > 0 ? o->logprobs : 0;
    if (p->n_stop > 0) {
        o->stop = calloc(p->n_stop, sizeof(char *));
        if (o->stop == NULL)
            goto nomem;
        for (size_t i = 0; i < p->n_stop; i++) {
            RANGE(p->stop[i] != NULL && p->stop[i][0] != '\0', "stop",
                  "stop[%zu] is empty", i);
            RANGE(strlen(p->stop[i]) <= RT_OPENAI_MAX_STOP_BYTES, "stop",
                  "stop[%zu] is longer than %d bytes", i,
                  RT_OPENAI_MAX_STOP_BYTES);
            if ((o->stop[i] = strdup(p->stop[i])) == NULL)
                goto nomem;
            o->n_stop = i + 1;
        }
    }
    if (p->n_stop_token_ids > 0) {
        o->stop_token_ids = malloc(p->n_stop_token_ids * sizeof(int32_t));
        if (o->stop_token_ids == NULL)
            goto nomem;
        for (size_t i = 0; i < p->n_stop_token_ids; i++) {
            RANGE(p->stop_token_ids[i] < (uint32_t)cfg->vocab_size,
                  "stop_token_ids",
                  "stop_token_ids[%zu] = %u is not a token id (valid: "
                  "0..%d)",
                  i, p->stop_token_ids[i], cfg->vocab_size - 1);
            o->stop_token_ids[i] = (int32_t)p->stop_token_ids[i];
        }
        o->n_stop_token_ids = p->n_stop_token_ids;
    }
#undef RANGE
    return rt_openai_check_sampling(sp, cfg->vocab_size, "sampling.", e);
nomem:
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
    return TG_ENOMEM;
}
