/* rt_fields.c — the table of the API's numeric sampling fields and its
 * range check (rt_fields.h). */
#include "router/api/rt_fields.h"

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
