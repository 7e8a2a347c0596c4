/*
 * rt_fields.h — the tables of the API's numeric request fields: each
 * field's name, range and default, which both front ends parse from (the
 * OpenAI body's members, rt_openai_req.c; the gRPC SamplingParams fields
 * of the same names, rt_api_grpc.c), so a range is written once: the
 * sampler's real-valued parameters, and the whole numbers (lengths,
 * top_k, alternatives, choices, list sizes).
 *
 * The ranges are the API's: temperature [0, 2] and the penalties [-2, 2]
 * as in the OpenAI API reference; top_p (0, 1], min_p [0, 1] and
 * repetition_penalty > 0 as vLLM's SamplingParams checks them. They are
 * checked on the double as sent; the sampler's single precision may then
 * turn a value into 0 or infinity, which tg_sampling_check (the front
 * ends' check after parsing) refuses.
 *
 * Thread: constant data and pure functions; any thread.
 */
#ifndef RT_FIELDS_H
#define RT_FIELDS_H

#include <float.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/base/tg_sampling.h"
#include "router/api/rt_openai.h"
#include "router/core/rt_request.h"

/* X(ID, name, lo, lo_open, hi, default, member of struct tg_sampling):
 * the range is [lo, hi], or (lo, hi] when lo_open; hi DBL_MAX is none. */
#define RT_FIELDS(X)                                                     \
    X(TEMPERATURE, "temperature", 0.0, false, 2.0, 1.0, temperature)     \
    X(TOP_P, "top_p", 0.0, true, 1.0, 1.0, top_p)                        \
    X(MIN_P, "min_p", 0.0, false, 1.0, 0.0, min_p)                       \
    X(PRESENCE_PENALTY, "presence_penalty", -2.0, false, 2.0, 0.0,       \
      presence_penalty)                                                  \
    X(FREQUENCY_PENALTY, "frequency_penalty", -2.0, false, 2.0, 0.0,     \
      frequency_penalty)                                                 \
    X(REPETITION_PENALTY, "repetition_penalty", 0.0, true, DBL_MAX, 1.0, \
      repetition_penalty)

enum rt_field {
#define RT_FIELD_ENUM(id, name, lo, lo_open, hi, def, member) RT_FIELD_##id,
    RT_FIELDS(RT_FIELD_ENUM)
#undef RT_FIELD_ENUM
        RT_FIELD_COUNT /* the table's rows */
};

struct rt_field_spec {
    const char *name; /* the API's name of the field */
    double lo, hi;    /* the range (see lo_open) */
    bool lo_open;     /* lo itself is out of range */
    double def;       /* the value when the request leaves it out */
};

/* The table, indexed by enum rt_field. */
extern const struct rt_field_spec rt_fields[RT_FIELD_COUNT];

/* 0 when x is in field f's range; else TG_ERANGE with *e filled
 * (RT_REQ_ERR_INVALID, "invalid_value", param `prefix` + the field's
 * name, a message giving the range and x). NaN is out of every range. */
int rt_field_check(enum rt_field f, double x, const char *prefix,
                   struct rt_request_error *e);

/* The API's whole-number fields, the same table for both front ends:
 * X(ID, name, lo, hi, default). max_tokens is also bounded by the context
 * (the caller's cap) and may be 0 where the prompt's log-probabilities are
 * asked for (the prompt scored, nothing generated); the default -1 is "up
 * to the context" (completions default to 16, as OpenAI's). top_k -1 and
 * 0 disable it (vLLM). logprobs is the count of alternatives per token
 * (completions' logprobs, chat's top_logprobs, gRPC's logprobs), default
 * -1 none. stop and stop_token_ids are the counts of their lists. */
#define RT_INT_FIELDS(X)                                   \
    X(MAX_TOKENS, "max_tokens", 1, INT32_MAX, -1)          \
    X(MIN_TOKENS, "min_tokens", 0, INT32_MAX, 0)           \
    X(TOP_K, "top_k", -1, INT32_MAX, 0)                    \
    X(LOGPROBS, "logprobs", 0, RT_OPENAI_MAX_LOGPROBS, -1) \
    X(N, "n", 1, RT_OPENAI_MAX_N, 1)                       \
    X(STOP, "stop", 0, RT_OPENAI_MAX_STOP, 0)              \
    X(STOP_TOKEN_IDS, "stop_token_ids", 0, RT_OPENAI_MAX_STOP_TOKEN_IDS, 0)

enum rt_int_field {
#define RT_INT_FIELD_ENUM(id, name, lo, hi, def) RT_INT_FIELD_##id,
    RT_INT_FIELDS(RT_INT_FIELD_ENUM)
#undef RT_INT_FIELD_ENUM
        RT_INT_FIELD_COUNT /* the table's rows */
};

struct rt_int_field_spec {
    const char *name; /* the API's name of the field */
    int64_t lo, hi;   /* the range */
    int64_t def;      /* the value when the request leaves it out */
};

/* The table, indexed by enum rt_int_field. */
extern const struct rt_int_field_spec rt_int_fields[RT_INT_FIELD_COUNT];

/* Field f's range: [lo, hi] of the table, hi lowered to `cap` when
 * 0 < cap < hi (max_tokens and min_tokens: the context). */
void rt_int_field_range(enum rt_int_field f, int64_t cap, int64_t *lo,
                        int64_t *hi);

/* 0 when lo <= x <= hi; else TG_ERANGE with *e filled (RT_REQ_ERR_INVALID,
 * "invalid_value", `param`, "'param' must be between lo and hi, got x", or
 * "at least lo" when hi is the open end INT32_MAX or INT64_MAX). `got`,
 * when non-NULL, is how x reads in the message (a value beyond 64 bits). */
int rt_int_check(int64_t x, int64_t lo, int64_t hi, const char *got,
                 const char *param, struct rt_request_error *e);

/* 0 when a list of n entries fits field f's count (stop,
 * stop_token_ids); else TG_ERANGE with *e filled ("'param' has n entries;
 * at most hi are allowed"). */
int rt_int_count_check(enum rt_int_field f, size_t n, const char *param,
                       struct rt_request_error *e);

/* 0 unless min_tokens exceeds a set max_tokens (> 0); then TG_ERANGE with
 * *e filled naming min_param and max_param. */
int rt_min_tokens_check(int64_t min_tokens, int64_t max_tokens,
                        const char *min_param, const char *max_param,
                        struct rt_request_error *e);

/* The member of *sp that field f sets. */
float *rt_field_of(enum rt_field f, struct tg_sampling *sp);

/* Sets every field of the table in *sp to its default. */
void rt_fields_defaults(struct tg_sampling *sp);

#endif /* RT_FIELDS_H */
