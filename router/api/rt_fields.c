/* rt_fields.c — the table of the API's numeric sampling fields and its
 * range check (rt_fields.h). */
#include "router/api/rt_fields.h"

#include <inttypes.h>
#include <stdio.h>

#include "common/base/tg_err.h"

/* In the order of enum rt_field: both come from RT_FIELDS. */
const struct rt_field_spec rt_fields[RT_FIELD_COUNT] = {
#define RT_FIELD_ROW(id, nm, l, lopen, h, d, member) \
    {.name = nm, .lo = l, .hi = h, .lo_open = lopen, .def = d},
    RT_FIELDS(RT_FIELD_ROW)
#undef RT_FIELD_ROW
};

int rt_field_check(enum rt_field f, double x, const char *prefix,
                   struct rt_request_error *e)
{
    const struct rt_field_spec *s = &rt_fields[f];
    if ((s->lo_open ? x > s->lo : x >= s->lo) && x <= s->hi)
        return 0;
    char param[96];
    snprintf(param, sizeof(param), "%s%s", prefix, s->name);
    if (s->hi == DBL_MAX)
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", param,
                             "'%s' must be %s %g, got %g", param,
                             s->lo_open ? "greater than" : "at least", s->lo,
                             x);
    else
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", param,
                             "'%s' must be in %c%g, %g], got %g", param,
                             s->lo_open ? '(' : '[', s->lo, s->hi, x);
    return TG_ERANGE;
}

float *rt_field_of(enum rt_field f, struct tg_sampling *sp)
{
    switch (f) {
#define RT_FIELD_CASE(id, nm, l, lopen, h, d, member) \
    case RT_FIELD_##id: return &sp->member;
        RT_FIELDS(RT_FIELD_CASE)
#undef RT_FIELD_CASE
    default: return NULL;
    }
}

void rt_fields_defaults(struct tg_sampling *sp)
{
    for (int f = 0; f < RT_FIELD_COUNT; f++)
        *rt_field_of((enum rt_field)f, sp) = (float)rt_fields[f].def;
}

const struct rt_int_field_spec rt_int_fields[RT_INT_FIELD_COUNT] = {
#define RT_INT_FIELD_ROW(id, nm, l, h, d) \
    {.name = nm, .lo = l, .hi = h, .def = d},
    RT_INT_FIELDS(RT_INT_FIELD_ROW)
#undef RT_INT_FIELD_ROW
};

void rt_int_field_range(enum rt_int_field f, int64_t cap, int64_t *lo,
                        int64_t *hi)
{
    *lo = rt_int_fields[f].lo;
    *hi = rt_int_fields[f].hi;
    if (cap > 0 && cap < *hi)
        *hi = cap;
}

int rt_int_check(int64_t x, int64_t lo, int64_t hi, const char *got,
                 const char *param, struct rt_request_error *e)
{
    if (got == NULL && x >= lo && x <= hi)
        return 0;
    char buf[32];
    if (got == NULL) {
        snprintf(buf, sizeof(buf), "%" PRId64, x);
        got = buf;
    }
    if (x < lo && lo != INT64_MIN && (hi == INT64_MAX || hi == INT32_MAX))
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", param,
                             "'%s' must be at least %" PRId64 ", got %s", param,
                             lo, got);
    else
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", param,
                             "'%s' must be between %" PRId64 " and %" PRId64
                             ", got %s",
                             param, lo, hi, got);
    return TG_ERANGE;
}

int rt_int_count_check(enum rt_int_field f, size_t n, const char *param,
                       struct rt_request_error *e)
{
    if ((int64_t)n <= rt_int_fields[f].hi)
        return 0;
    rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", param,
                         "'%s' has %zu entries; at most %" PRId64
                         " are allowed",
                         param, n, rt_int_fields[f].hi);
    return TG_ERANGE;
}

int rt_min_tokens_check(int64_t min_tokens, int64_t max_tokens,
                        const char *min_param, const char *max_param,
                        struct rt_request_error *e)
{
    if (max_tokens <= 0 || min_tokens <= max_tokens)
        return 0;
    rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", min_param,
                         "'%s' (%" PRId64 ") must not exceed '%s' (%" PRId64
                         ")",
                         min_param, min_tokens, max_param, max_tokens);
    return TG_ERANGE;
}
