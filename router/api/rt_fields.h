/*
 * rt_fields.h — the one table of the API's numeric sampling fields: each
 * field's name, range and default, which both front ends parse from (the
 * OpenAI body's members, rt_openai_req.c; the gRPC SamplingParams fields
 * of the same names, rt_api_grpc.c), so a range is written once.
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

#include "common/base/tg_sampling.h"
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

/* The member of *sp that field f sets. */
float *rt_field_of(enum rt_field f, struct tg_sampling *sp);

/* Sets every field of the table in *sp to its default. */
void rt_fields_defaults(struct tg_sampling *sp);

#endif /* RT_FIELDS_H */
