/* rt_openai_req.c — parsing and validation of OpenAI-compatible request
 * bodies (rt_openai.h). Field names, defaults and ranges follow the OpenAI
 * API reference and vLLM's protocol.py; each check says where it deviates. */
#include "router/api/rt_openai.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/json/tg_json.h"
#include "common/tok/tok_tokenizer.h"
#include "router/api/rt_fields.h"
#include "router/api/rt_openai_internal.h"

/* ---- errors ------------------------------------------------------------ */

int rt_openai__fail(struct rt_request_error *e, int rc, enum rt_req_err kind,
                    const char *code, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_request_error_vset(e, kind, code, param, fmt, ap);
    va_end(ap);
    return rc;
}

int rt_openai__oom(struct rt_request_error *e)
{
    return rt_openai__fail(e, TG_ENOMEM, RT_REQ_ERR_INTERNAL, "internal_error",
                           NULL, "out of memory while parsing the request");
}

int rt_openai__bad_type(struct rt_request_error *e, const char *param,
                        const char *what)
{
    return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_type",
                           param, "'%s' must be %s", param, what);
}

int rt_openai__unsupported(struct rt_request_error *e, const char *param,
                           const char *what)
{
    return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                           "unsupported_parameter", param, "'%s': %s", param,
                           what);
}

/* ---- typed optional members -------------------------------------------
 * Each getter leaves *out untouched when the member is absent or null and
 * sets *present (when non-NULL) to whether it was given. `param` names the
 * field in errors. */

json_t *rt_openai__member(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

int rt_openai__get_bool(const json_t *obj, const char *key, const char *param,
                        bool *out, struct rt_request_error *e)
{
    json_t *v = rt_openai__member(obj, key);
    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return rt_openai__bad_type(e, param, "a boolean");
    *out = json_is_true(v);
    return 0;
}

/* The 400 for an integer field outside [lo, hi]; `got` is the value as
 * text. hi = INT32_MAX or INT64_MAX stands for "no upper bound" in the
 * message unless the value is above it or lo is INT64_MIN too. */
/* Integers: JSON integers, or reals with no fraction (pydantic's lax mode,
 * which vLLM uses, accepts 16.0 for an int field). An integral real
 * outside the 64-bit range (1e30, or an integer literal beyond 64 bits,
 * which tg_json_loadb_wide reads as a real) is a value out of range. */
static int get_int(const json_t *obj, const char *key, const char *param,
                   int64_t lo, int64_t hi, int64_t *out, bool *present,
                   struct rt_request_error *e)
{
    if (present != NULL)
        *present = false;
    json_t *v = rt_openai__member(obj, key);
    if (v == NULL)
        return 0;
    int64_t x;
    char got[48];
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d))
            return rt_openai__bad_type(e, param, "an integer");
        /* (-2^63, 2^63): the doubles that convert to int64_t exactly, less
         * -2^63, which is also what a literal just below it rounds to */
        if (d <= -0x1p63 || d >= 0x1p63) {
            snprintf(got, sizeof(got), "%.17g (beyond 64 bits)", d);
            return rt_int_check(d > 0 ? INT64_MAX : INT64_MIN, lo, hi, got,
                                param, e);
        }
        x = (int64_t)d;
    } else {
        return rt_openai__bad_type(e, param, "an integer");
    }
    int rc = rt_int_check(x, lo, hi, NULL, param, e);
    if (rc != 0)
        return rc;
    *out = x;
    if (present != NULL)
        *present = true;
    return 0;
}

/* Field f of the whole-number table (rt_fields.h) from obj[key] (named
 * `param`), its range's top lowered to cap (> 0) and its bottom to lo0
 * when lo0 < the table's. */
static int get_ifield(const json_t *obj, const char *key, enum rt_int_field f,
                      int64_t cap, int64_t lo0, int64_t *out, bool *present,
                      struct rt_request_error *e)
{
    int64_t lo, hi;
    rt_int_field_range(f, cap, &lo, &hi);
    return get_int(obj, key, key, lo0 < lo ? lo0 : lo, hi, out, present, e);
}

int rt_openai__get_int(const json_t *obj, const char *key, const char *param,
                       int64_t lo, int64_t hi, int64_t *out, bool *present,
                       struct rt_request_error *e)
{
    return get_int(obj, key, param, lo, hi, out, present, e);
}

/* A field of the table (rt_fields.h): its range checked on the double as
 * sent, the value stored in the sampler's single precision (where it may
 * become 0 or infinity, which rt_openai_check_sampling refuses). */
static int get_field(const json_t *obj, enum rt_field f, struct tg_sampling *sp,
                     struct rt_request_error *e)
{
    const char *key = rt_fields[f].name;
    json_t *v = rt_openai__member(obj, key);
    if (v == NULL)
        return 0;
    if (!json_is_number(v))
        return rt_openai__bad_type(e, key, "a number");
    double x = json_number_value(v);
    int rc = rt_field_check(f, x, "", e);
    if (rc == 0)
        *rt_field_of(f, sp) = (float)x;
    return rc;
}

/* A string member copied into *out (malloc'd); max_bytes 0 = no limit. */
int rt_openai__get_str(const json_t *obj, const char *key, const char *param,
                       size_t max_bytes, char **out, struct rt_request_error *e)
{
    json_t *v = rt_openai__member(obj, key);
    if (v == NULL)
        return 0;
    if (!json_is_string(v))
        return rt_openai__bad_type(e, param, "a string");
    size_t n = json_string_length(v);
    if (max_bytes > 0 && n > max_bytes)
        return rt_openai__fail(
            e, TG_ERANGE, RT_REQ_ERR_INVALID, "invalid_value", param,
            "'%s' is longer than %zu bytes", param, max_bytes);
    char *s = strndup(json_string_value(v), n);
    if (s == NULL)
        return rt_openai__oom(e);
    free(*out);
    *out = s;
    return 0;
}

/* ---- common pieces ----------------------------------------------------- */

int rt_openai__load_body(const struct rt_openai_cfg *cfg, const char *body,
                         size_t len, json_t **root, struct rt_request_error *e)
{
    *root = NULL;
    if (cfg->max_body_bytes > 0 && len > cfg->max_body_bytes)
        return rt_openai__fail(
            e, TG_ETOOBIG, RT_REQ_ERR_TOO_LARGE, "request_too_large", NULL,
            "request body of %zu bytes exceeds the limit of %zu bytes", len,
            cfg->max_body_bytes);
    if (body == NULL || len == 0)
        return rt_openai__fail(
            e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_json", NULL,
            "the request body is empty; expected a JSON object");
    json_error_t je;
    /* No JSON_ALLOW_NUL: a "\u0000" in a string is rejected here, so every
     * string we copy is an ordinary C string. */
    json_t *doc = tg_json_loadb_wide(body, len, 0, &je);
    if (doc == NULL && json_error_code(&je) == json_error_numeric_overflow)
        /* Valid JSON that cannot be held: a real beyond a double, or more
         * integers beyond 64 bits than tg_json_loadb_wide reads. Fewer of
         * those reach the fields' own range checks, which name them. */
        return rt_openai__fail(
            e, TG_ERANGE, RT_REQ_ERR_INVALID, "invalid_value", NULL,
            "the number at line %d column %d is out of range: %s (a number "
            "must fit a double, and at most %d integers may be outside the "
            "64-bit range)",
            je.line, je.column, je.text, TG_JSON_MAX_WIDE);
    if (doc == NULL)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_json", NULL,
                               "malformed JSON at line %d column %d: %s",
                               je.line, je.column, je.text);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_json", NULL,
                               "the request body must be a JSON object");
    }
    *root = doc;
    return 0;
}

/* "model" is optional as in vLLM (absent = the served model); a different
 * name is 404 model_not_found, as OpenAI answers. */
int rt_openai__parse_model(const struct rt_openai_cfg *cfg, const json_t *root,
                           char **out, struct rt_request_error *e)
{
    TG_ASSERT(cfg->served_model != NULL);
    json_t *v = rt_openai__member(root, "model");
    const char *name = cfg->served_model;
    if (v != NULL) {
        if (!json_is_string(v))
            return rt_openai__bad_type(e, "model", "a string");
        name = json_string_value(v);
        if (strcmp(name, cfg->served_model) != 0)
            return rt_openai__fail(
                e, TG_ENOTFOUND, RT_REQ_ERR_NOT_FOUND, "model_not_found",
                "model",
                "The model '%.100s' does not exist; this server "
                "serves '%.100s'",
                name, cfg->served_model);
    }
    *out = strdup(name);
    return *out != NULL ? 0 : rt_openai__oom(e);
}

/* A token id array `arr` at path `param` into a malloc'd int32 array. */
int rt_openai__read_ids(const struct rt_openai_cfg *cfg, const json_t *arr,
                        const char *param, size_t max_n, int32_t **out,
                        size_t *n_out, struct rt_request_error *e)
{
    size_t n = json_array_size(arr);
    if (max_n > 0 && n > max_n)
        return rt_openai__fail(
            e, TG_ERANGE, RT_REQ_ERR_INVALID, "invalid_value", param,
            "'%s' has %zu entries; at most %zu are allowed", param, n, max_n);
    int64_t hi =
        cfg->vocab_size > 0 ? (int64_t)cfg->vocab_size - 1 : (int64_t)INT32_MAX;
    int32_t *ids = NULL;
    if (n > 0) {
        ids = malloc(n * sizeof(*ids));
        if (ids == NULL)
            return rt_openai__oom(e);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        char p[128];
        snprintf(p, sizeof(p), "%.96s[%zu]", param, i);
        if (!json_is_integer(x)) {
            free(ids);
            double d = json_is_real(x) ? json_real_value(x) : 0.5;
            /* 1e30, or an integer literal beyond 64 bits read as a real */
            if (d == floor(d) && (d < 0 || d > (double)hi))
                return rt_openai__fail(
                    e, TG_ERANGE, RT_REQ_ERR_INVALID, "invalid_value", p,
                    "'%s' = %.17g is not a token id (valid: 0..%" PRId64 ")", p,
                    d, hi);
            return rt_openai__bad_type(e, p, "an integer token id");
        }
        json_int_t v = json_integer_value(x);
        if (v < 0 || v > hi) {
            free(ids);
            return rt_openai__fail(
                e, TG_ERANGE, RT_REQ_ERR_INVALID, "invalid_value", p,
                "'%s' = %lld is not a token id (valid: 0..%" PRId64 ")", p,
                (long long)v, hi);
        }
        ids[i] = (int32_t)v;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

/* Fields that name features we do not implement: rejected, never ignored. */
static int reject_unsupported(const json_t *root, enum rt_endpoint ep,
                              struct rt_gen_request *out,
                              struct rt_request_error *e)
{
    int rc;
    int64_t x = 1;
    /* n: parallel samples of one prompt (docs/API.md "n"), at most
     * RT_OPENAI_MAX_N; the server also bounds it by --max-num-seqs. */
    if ((rc = get_ifield(root, "n", RT_INT_FIELD_N, 0, 1, &x, NULL, e)))
        return rc;
    out->q.n = (int32_t)x;
    /* best_of = n is the same request; more would need the choices ranked
     * by their log-probabilities, which this server does not do. */
    if ((rc = get_int(root, "best_of", "best_of", INT64_MIN, INT64_MAX, &x,
                      NULL, e)))
        return rc;
    if (x != out->q.n)
        return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                               "unsupported_value", "best_of",
                               "'best_of' must equal 'n' (%d; got %" PRId64
                               "): ranking extra samples is not supported",
                               (int)out->q.n, x);
    bool echo = false;
    if ((rc = rt_openai__get_bool(root, "echo", "echo", &echo, e)))
        return rc;
    if (echo && ep == RT_ENDPOINT_CHAT)
        return rt_openai__unsupported(e, "echo",
                                      "echo is a /v1/completions parameter");
    if (rt_openai__member(root, "suffix") != NULL)
        return rt_openai__unsupported(e, "suffix", "suffix is not supported");
    int frc = rt_openai_parse_response_format(root, &out->q.grammar, e);
    if (frc == 0)
        frc = rt_openai_parse_structured(root, &out->q.grammar, e);
    if (frc != 0)
        return frc;
    if (ep != RT_ENDPOINT_CHAT)
        return 0;
    if (rt_openai__member(root, "functions") != NULL)
        return rt_openai__unsupported(e, "functions", "function calling is not supported");
    if (rt_openai__member(root, "function_call") != NULL)
        return rt_openai__unsupported(e, "function_call",
                           "function calling is not supported");
    if (rt_openai__member(root, "chat_template") != NULL)
        return rt_openai__unsupported(e, "chat_template",
                           "custom chat templates are not accepted; the "
                           "model's own template is used");
    return 0;
}

void rt_gen_request_defaults(struct rt_gen_request *r)
{
    r->q.sampling = TG_SAMPLING_OFF;
    rt_fields_defaults(&r->q.sampling); /* OpenAI's temperature 1 */
    memset(&r->q.opts, 0, sizeof(r->q.opts));
    r->q.opts.max_tokens = -1;
    r->q.opts.skip_special_tokens = true;
    r->q.opts.logprobs = -1;
    r->echo_top = -1;
    r->prompt_top = -1;
}

int rt_openai_check_sampling(const struct tg_sampling *sp, int32_t vocab,
                             const char *prefix, struct rt_request_error *e)
{
    const char *field = NULL;
    char msg[256];
    int rc = tg_sampling_check(sp, vocab, &field, msg, sizeof(msg));
    if (rc == 0)
        return 0;
    char param[64];
    snprintf(param, sizeof(param), "%s%s", prefix, field);
    return rt_openai__fail(e, rc, RT_REQ_ERR_INVALID, "invalid_value", param,
                           "%s", msg);
}

void rt_gen_request_free(struct rt_gen_request *r)
{
    free(r->model);
    free(r->echo_text);
    for (size_t i = 0; i < r->n_batch; i++)
        rt_request_free(&r->batch[i]);
    free(r->batch);
    rt_request_free(&r->q);
    memset(r, 0, sizeof(*r));
}

static int parse_stop(const json_t *root, struct rt_gen_opts *s,
                      struct rt_request_error *e)
{
    json_t *v = rt_openai__member(root, "stop");
    if (v == NULL)
        return 0;
    size_t n;
    if (json_is_string(v))
        n = 1;
    else if (json_is_array(v))
        n = json_array_size(v);
    else
        return rt_openai__bad_type(e, "stop",
                                   "a string or an array of strings");
    int rc = rt_int_count_check(RT_INT_FIELD_STOP, n, "stop", e);
    if (rc != 0)
        return rc;
    if (n == 0)
        return 0;
    s->stop = calloc(n, sizeof(*s->stop));
    if (s->stop == NULL)
        return rt_openai__oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_string(v) ? v : json_array_get(v, i);
        char p[64];
        if (json_is_string(v))
            snprintf(p, sizeof(p), "stop");
        else
            snprintf(p, sizeof(p), "stop[%zu]", i);
        if (!json_is_string(x))
            return rt_openai__bad_type(e, p, "a string");
        size_t len = json_string_length(x);
        if (len == 0)
            return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                   "invalid_value", p,
                                   "'%s' must not be an empty string", p);
        if (len > RT_OPENAI_MAX_STOP_BYTES)
            return rt_openai__fail(
                e, TG_ERANGE, RT_REQ_ERR_INVALID, "invalid_value", p,
                "'%s' is longer than %d bytes", p, RT_OPENAI_MAX_STOP_BYTES);
        s->stop[i] = strndup(json_string_value(x), len);
        if (s->stop[i] == NULL)
            return rt_openai__oom(e);
        s->n_stop = i + 1;
    }
    return 0;
}

/* Sampling fields shared by both endpoints (OpenAI names plus vLLM's
 * extensions: top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
 * stop_token_ids, skip_special_tokens, include_stop_str_in_output). */
static int cmp_bias(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* logit_bias (OpenAI): {"<token id>": bias}, bias in [-100, 100], added to
 * the token's logit before sampling (vLLM's semantics: keys are decimal
 * token ids, values numbers). Ids must be below the vocabulary, each id
 * once ("7" and "07" name the same token); entries come out sorted by id.
 * {} and null mean none. */
static int parse_logit_bias(const struct rt_openai_cfg *cfg, const json_t *root,
                            struct tg_sampling *s, struct rt_request_error *e)
{
    json_t *v = rt_openai__member(root, "logit_bias");
    if (v == NULL)
        return 0;
    if (!json_is_object(v))
        return rt_openai__bad_type(e, "logit_bias",
                                   "an object of token id -> bias");
    size_t n = json_object_size(v);
    if (n == 0)
        return 0;
    if (n > RT_OPENAI_MAX_LOGIT_BIAS)
        return rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                               "invalid_value", "logit_bias",
                               "'logit_bias' has %zu entries; at most %d are "
                               "allowed",
                               n, RT_OPENAI_MAX_LOGIT_BIAS);
    /* ids and values side by side, to sort by id. */
    struct { int32_t id; float val; } *tmp = malloc(n * sizeof(*tmp));
    if (tmp == NULL)
        return rt_openai__oom(e);
    size_t i = 0;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(v, key, val) {
        char p[128];
        snprintf(p, sizeof(p), "logit_bias.%.64s", key);
        char *end = NULL;
        errno = 0;
        long long id = key[0] >= '0' && key[0] <= '9' ? strtoll(key, &end, 10)
                                                      : -1;
        int64_t hi = cfg->vocab_size > 0 ? (int64_t)cfg->vocab_size - 1
                                         : INT32_MAX;
        if (id < 0 || end == NULL || *end != '\0' || errno != 0 || id > hi) {
            rc = rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                                 "invalid_value", p,
                                 "logit_bias key '%.64s' is not a token id "
                                 "(valid: 0..%" PRId64 ")",
                                 key, hi);
            break;
        }
        if (!json_is_number(val)) {
            rc = rt_openai__bad_type(e, p, "a number");
            break;
        }
        double b = json_number_value(val);
        if (!(b >= -100.0 && b <= 100.0)) {
            rc = rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                                 "invalid_value", p,
                                 "logit_bias values must be in [-100, 100] "
                                 "(got %g for token %lld)",
                                 b, id);
            break;
        }
        tmp[i].id = (int32_t)id;
        tmp[i].val = (float)b;
        i++;
    }
    if (rc == 0) {
        /* The id is the first member: sorting the pairs by it is sorting
         * the ids (ties cannot stay: they are refused just below). */
        qsort(tmp, n, sizeof(*tmp), cmp_bias);
        for (i = 1; i < n && rc == 0; i++)
            if (tmp[i].id == tmp[i - 1].id)
                rc = rt_openai__fail(e, TG_EINVAL, RT_REQ_ERR_INVALID,
                                     "invalid_value", "logit_bias",
                                     "'logit_bias' names token %d twice",
                                     (int)tmp[i].id);
    }
    if (rc == 0) {
        int32_t *ids = malloc(n * sizeof(*ids));
        float *vals = malloc(n * sizeof(*vals));
        if (ids == NULL || vals == NULL) {
            free(ids);
            free(vals);
            rc = rt_openai__oom(e);
        } else {
            for (i = 0; i < n; i++) {
                ids[i] = tmp[i].id;
                vals[i] = tmp[i].val;
            }
            s->bias_ids = ids;
            s->bias_vals = vals;
            s->n_bias = (int32_t)n;
        }
    }
    free(tmp);
    return rc;
}

static int parse_sampling(const struct rt_openai_cfg *cfg, const json_t *root,
                          struct rt_gen_request *r, struct rt_request_error *e)
{
    struct rt_gen_opts *s = &r->q.opts;
    struct tg_sampling *sp = &r->q.sampling;
    rt_gen_request_defaults(r);
    bool chat = r->endpoint == RT_ENDPOINT_CHAT;
    int rc;
    int64_t x;
    bool present;

    /* OpenAI: chat max_tokens defaults to the room left in the context,
     * legacy completions to 16. max_completion_tokens is the newer chat
     * name and wins when both are sent (vLLM does the same). */
    s->max_tokens = chat ? -1 : 16;
    r->q.max_tokens_param = "max_tokens";
    int64_t max_hi = cfg->max_model_len > 0 ? cfg->max_model_len : INT32_MAX;
    const char *mkey = "max_tokens";
    if (chat && rt_openai__member(root, "max_completion_tokens") != NULL)
        mkey = "max_completion_tokens";
    /* 0 (score the prompt, generate nothing) only where the prompt's
     * log-probabilities can be asked for (rt_openai_logprobs.c). */
    bool max_zero = false;
    if ((rc = get_ifield(root, mkey, RT_INT_FIELD_MAX_TOKENS, max_hi,
                         rt_openai__zero_max_ok(root, r) ? 0 : 1, &x, &present,
                         e)))
        return rc;
    if (present) {
        s->max_tokens = (int32_t)x;
        r->q.max_tokens_param = mkey;
        max_zero = x == 0;
    }
    if ((rc = get_ifield(root, "min_tokens", RT_INT_FIELD_MIN_TOKENS, max_hi, 0,
                         &x, &present, e)))
        return rc;
    if (present) {
        if ((rc = rt_min_tokens_check(x, s->max_tokens, "min_tokens",
                                      r->q.max_tokens_param, e)))
            return rc;
        s->min_tokens = (int32_t)x;
    }

    /* The numeric sampling fields, ranges and all, from the one table. */
    for (int f = 0; f < RT_FIELD_COUNT; f++)
        if ((rc = get_field(root, (enum rt_field)f, sp, e)))
            return rc;

    /* vLLM: top_k -1 (and, since 0.8, 0) disables; otherwise >= 1. */
    if ((rc = get_ifield(root, "top_k", RT_INT_FIELD_TOP_K, 0, 0, &x, &present,
                         e)))
        return rc;
    if (present)
        sp->top_k = x <= 0 ? 0 : (int32_t)x;

    if ((rc = get_int(root, "seed", "seed", INT64_MIN, INT64_MAX, &x,
                      &s->has_seed, e)))
        return rc;
    if (s->has_seed)
        sp->seed = (uint64_t)x; /* the bits of the signed seed as sent */

    if ((rc = rt_openai__get_bool(root, "ignore_eos", "ignore_eos",
                                  &s->ignore_eos, e)) ||
        (rc = rt_openai__get_bool(root, "skip_special_tokens",
                                  "skip_special_tokens",
                                  &s->skip_special_tokens, e)) ||
        (rc = rt_openai__get_bool(root, "include_stop_str_in_output",
                                  "include_stop_str_in_output",
                                  &s->include_stop_str_in_output, e)))
        return rc;

    if ((rc = parse_stop(root, s, e)) ||
        (rc = parse_logit_bias(cfg, root, sp, e)))
        return rc;
    json_t *v = rt_openai__member(root, "stop_token_ids");
    if (v != NULL) {
        if (!json_is_array(v))
            return rt_openai__bad_type(e, "stop_token_ids",
                                       "an array of token ids");
        if ((rc = rt_openai__read_ids(
                 cfg, v, "stop_token_ids", RT_OPENAI_MAX_STOP_TOKEN_IDS,
                 &s->stop_token_ids, &s->n_stop_token_ids, e)))
            return rc;
    }

    /* Logprobs: completions take an int 0..20 (alternatives per token);
     * chat takes a bool plus top_logprobs 0..20, and vLLM rejects
     * top_logprobs > 0 without logprobs=true. */
    if (!chat) {
        if ((rc = get_ifield(root, "logprobs", RT_INT_FIELD_LOGPROBS, 0, 0, &x,
                             &present, e)))
            return rc;
        if (present)
            s->logprobs = (int32_t)x;
    } else {
        bool want = false;
        int64_t top = 0;
        if ((rc = rt_openai__get_bool(root, "logprobs", "logprobs", &want,
                                      e)) ||
            (rc = get_ifield(root, "top_logprobs", RT_INT_FIELD_LOGPROBS, 0, 0,
                             &top, NULL, e)))
            return rc;
        if (top > 0 && !want)
            return rt_openai__fail(
                e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_value",
                "top_logprobs",
                "'top_logprobs' requires 'logprobs' to be true");
        if (want)
            s->logprobs = (int32_t)top;
    }
    sp->n_top = s->logprobs > 0 ? s->logprobs : 0;
    if (max_zero) { /* prompt_only: one draw, dropped */
        s->prompt_only = true;
        s->max_tokens = 1;
    }
    return 0;
}

static int parse_stream(const json_t *root, struct rt_gen_request *r,
                        struct rt_request_error *e)
{
    int rc;
    if ((rc = rt_openai__get_bool(root, "stream", "stream", &r->stream, e)))
        return rc;
    json_t *so = rt_openai__member(root, "stream_options");
    if (so == NULL)
        return 0;
    if (!json_is_object(so))
        return rt_openai__bad_type(e, "stream_options", "an object");
    /* OpenAI and vLLM both refuse stream_options on a non-streaming
     * request rather than ignore it. */
    if (!r->stream)
        return rt_openai__fail(
            e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_value",
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true");
    if ((rc = rt_openai__get_bool(so, "include_usage",
                                  "stream_options.include_usage",
                                  &r->include_usage, e)) ||
        (rc = rt_openai__get_bool(so, "continuous_usage_stats",
                                  "stream_options.continuous_usage_stats",
                                  &r->continuous_usage, e)))
        return rc;
    return 0;
}

int rt_openai_check_id(const char *v, size_t n, const char *param,
                       struct rt_request_error *e)
{
    if (n == 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", param, "%s must not be empty",
                               param);
    if (n > RT_OPENAI_MAX_ID_BYTES)
        return rt_openai__fail(e, TG_EINVAL, RT_REQ_ERR_INVALID,
                               "invalid_value", param,
                               "%s is %zu bytes; at most %d are allowed", param,
                               n, RT_OPENAI_MAX_ID_BYTES);
    if (!tok_utf8_valid(v, n, NULL))
        return rt_openai__fail(e, TG_EINVAL, RT_REQ_ERR_INVALID,
                               "invalid_value", param, "%s is not valid UTF-8",
                               param);
    return 0;
}

/* Identity fields: user (OpenAI), request_id (vLLM), session_id (ours;
 * the X-Session-Id header is the router's other way to set it). */
static int parse_ids(const json_t *root, struct rt_gen_request *r,
                     struct rt_request_error *e)
{
    int rc;
    if ((rc = rt_openai__get_str(root, "user", "user", RT_OPENAI_MAX_ID_BYTES,
                                 &r->q.user, e)) ||
        (rc = rt_openai__get_str(root, "request_id", "request_id",
                                 RT_OPENAI_MAX_ID_BYTES, &r->q.request_id,
                                 e)) ||
        (rc = rt_openai__get_str(root, "session_id", "session_id",
                                 RT_OPENAI_MAX_ID_BYTES, &r->q.session_id, e)))
        return rc;
    if (r->q.session_id != NULL && r->q.session_id[0] == '\0')
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "session_id",
                               "'session_id' must not be empty");
    return 0;
}

/* ---- completions prompt ------------------------------------------------ */

/* prompt: a string, an array of token ids, or a batch of those (["text",
 * ...] or [[ids], ...], at most RT_OPENAI_MAX_BATCH): the first goes to
 * r->q, the others to r->batch, each answered as a choice of its own. */
static int parse_prompt(const struct rt_openai_cfg *cfg, const json_t *root,
                        struct rt_gen_request *r, struct rt_request_error *e)
{
    json_t *v = rt_openai__member(root, "prompt");
    if (v == NULL)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter", "prompt",
                               "'prompt' is required");
    if (!json_is_array(v) || json_array_size(v) == 0 ||
        json_is_number(json_array_get(v, 0)))
        return rt_openai__prompt_value(cfg, v, "prompt", &r->q, e);
    size_t n = json_array_size(v);
    if (n > RT_OPENAI_MAX_BATCH)
        return rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                               "invalid_value", "prompt",
                               "'prompt' holds %zu prompts; at most %d are "
                               "allowed in one request",
                               n, RT_OPENAI_MAX_BATCH);
    int rc = rt_openai__prompt_value(cfg, json_array_get(v, 0), "prompt[0]",
                                     &r->q, e);
    if (rc != 0 || n == 1)
        return rc;
    r->batch = calloc(n - 1, sizeof(*r->batch));
    if (r->batch == NULL)
        return rt_openai__oom(e);
    for (size_t i = 1; i < n; i++) {
        char p[32];
        snprintf(p, sizeof(p), "prompt[%zu]", i);
        r->n_batch = i;
        if ((rc = rt_openai__prompt_value(cfg, json_array_get(v, i), p,
                                          &r->batch[i - 1], e)) != 0)
            return rc;
    }
    return 0;
}

int rt_openai__prompt_value(const struct rt_openai_cfg *cfg, const json_t *v,
                            const char *param, struct rt_request *q,
                            struct rt_request_error *e)
{
    if (json_is_string(v)) {
        size_t n = json_string_length(v);
        if (n == 0)
            return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                   "invalid_value", param,
                                   "'%s' must not be empty", param);
        q->prompt = strndup(json_string_value(v), n);
        if (q->prompt == NULL)
            return rt_openai__oom(e);
        q->prompt_len = n;
        return 0;
    }
    if (!json_is_array(v))
        return rt_openai__bad_type(
            e, param,
            strcmp(param, "prompt") == 0
                ? "a string, an array of token ids or an array of those"
                : "a string or an array of token ids");
    if (json_array_size(v) == 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", param, "'%s' must not be empty",
                               param);
    int rc = rt_openai__read_ids(cfg, v, param, 0, &q->prompt_ids,
                                 &q->n_prompt_ids, e);
    if (rc)
        return rc;
    if (cfg->max_model_len > 0 && q->n_prompt_ids >= (size_t)cfg->max_model_len)
        return rt_openai__fail(
            e, TG_ETOOBIG, RT_REQ_ERR_INVALID, "context_length_exceeded", param,
            "the prompt has %zu tokens; this model's context is %d "
            "tokens, which must also hold at least one generated "
            "token",
            q->n_prompt_ids, (int)cfg->max_model_len);
    return 0;
}

/* ---- entry points ------------------------------------------------------ */

static int parse_gen(const struct rt_openai_cfg *cfg, enum rt_endpoint ep,
                     const char *body, size_t len, struct rt_gen_request *out,
                     struct rt_request_error *e)
{
    memset(out, 0, sizeof(*out));
    out->endpoint = ep;
    out->q.n = 1;
    json_t *root;
    int rc = rt_openai__load_body(cfg, body, len, &root, e);
    if (rc)
        return rc;
    if ((rc = rt_openai__parse_model(cfg, root, &out->model, e)) ||
        (rc = reject_unsupported(root, ep, out, e)))
        goto fail;
    out->q.is_chat = ep == RT_ENDPOINT_CHAT;
    if (ep == RT_ENDPOINT_CHAT) {
        out->q.add_special_tokens = false;
        struct rt_tool_sel sel;
        if ((rc = rt_openai_chat_parse_messages(root, &out->q.chat, e)) ||
            (rc = rt_openai_chat_parse_tools(root, &out->q.chat, &sel, e)) ||
            (rc = rt_openai_tool_grammar(cfg, out->q.chat.tools, &sel,
                                         &out->q.grammar, &out->q.grammar_param,
                                         e)) ||
            (rc = rt_openai__parse_chat_opts(root, &out->q.chat, e)))
            goto fail;
        out->tool_choice = sel.choice;
    } else {
        out->q.add_special_tokens = true;
        if ((rc = parse_prompt(cfg, root, out, e)) ||
            (rc = rt_openai__get_bool(root, "echo", "echo", &out->echo, e)))
            goto fail;
    }
    if ((rc = rt_openai_structured_whitespace(cfg, root, &out->q.grammar, e)))
        goto fail;
    if ((rc = rt_openai__get_bool(root, "add_special_tokens",
                                  "add_special_tokens",
                                  &out->q.add_special_tokens, e)) ||
        (rc = parse_sampling(cfg, root, out, e)) ||
        (rc = parse_stream(root, out, e)) || (rc = parse_ids(root, out, e)))
        goto fail;
    if ((rc = rt_openai__parse_prompt_lp(root, out, out->q.opts.prompt_only,
                                         e)))
        goto fail;
    if ((rc = rt_openai_check_sampling(&out->q.sampling, cfg->vocab_size, "",
                                       e)) != 0)
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    rt_gen_request_free(out);
    out->endpoint = ep;
    return rc;
}

int rt_openai_parse_completion(const struct rt_openai_cfg *cfg,
                               const char *body, size_t len,
                               struct rt_gen_request *out,
                               struct rt_request_error *e)
{
    return parse_gen(cfg, RT_ENDPOINT_COMPLETIONS, body, len, out, e);
}

int rt_openai_parse_chat(const struct rt_openai_cfg *cfg, const char *body,
                         size_t len, struct rt_gen_request *out,
                         struct rt_request_error *e)
{
    return parse_gen(cfg, RT_ENDPOINT_CHAT, body, len, out, e);
}
