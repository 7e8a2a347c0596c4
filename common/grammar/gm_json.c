/* gm_json.c — JSON in the grammar IR (gm_json.h). */
#include "common/grammar/gm_json.h"

#include <string.h>

#include "common/base/tg_err.h"

static const char *const ws_names[] = {
    [GM_WS_COMPACT] = "compact",
    [GM_WS_NONE] = "none",
    [GM_WS_PRETTY] = "pretty",
    [GM_WS_FREE] = "free",
};

int gm_ws_parse(const char *name, enum gm_ws *ws)
{
    for (size_t i = 0; name != NULL && i < sizeof ws_names / sizeof *ws_names;
         i++)
        if (strcmp(name, ws_names[i]) == 0) {
            *ws = (enum gm_ws)i;
            return 0;
        }
    return TG_EINVAL;
}

const char *gm_ws_name(enum gm_ws ws)
{
    return (unsigned)ws < sizeof ws_names / sizeof *ws_names ? ws_names[ws]
                                                             : "compact";
}

void gm_json_init(struct gm_json *j, struct gm_ir *ir, enum gm_ws ws,
                  int ws_indent)
{
    memset(j, 0, sizeof(*j));
    j->ir = ir;
    j->policy = ws_indent < 0 ? GM_WS_NONE : ws;
    j->ws_indent = ws_indent;
    j->ws = j->ws_sep = j->chr = -1;
    j->string = j->number = j->integer = -1;
    j->value = j->object = j->array = -1;
}

/* The bounded gap of the pretty and free policies. */
static int32_t wide_ws(struct gm_json *j)
{
    struct gm_ir *ir = j->ir;
    uint32_t n = (uint32_t)j->ws_indent;
    if (j->policy == GM_WS_FREE)
        return gm_ir_repeat(ir, gm_ir_chars(ir, " \t\r\n"), 0, n);
    int32_t alts[3] = {
        gm_ir_empty(ir), gm_ir_str(ir, " "),
        gm_ir_seq2(ir, gm_ir_str(ir, "\n"),
                   gm_ir_repeat(ir, gm_ir_chars(ir, " \t"), 0, n))};
    return gm_ir_alt(ir, alts, 3);
}

int32_t gm_json_ws(struct gm_json *j)
{
    if (j->ws < 0)
        j->ws = j->policy == GM_WS_COMPACT || j->policy == GM_WS_NONE
                    ? gm_ir_empty(j->ir)
                    : wide_ws(j);
    return j->ws;
}

int32_t gm_json_ws_sep(struct gm_json *j)
{
    if (j->ws_sep >= 0)
        return j->ws_sep;
    if (j->policy == GM_WS_NONE)
        j->ws_sep = gm_ir_empty(j->ir);
    else if (j->policy == GM_WS_COMPACT)
        j->ws_sep = gm_ir_opt(j->ir, gm_ir_str(j->ir, " "));
    else
        j->ws_sep = gm_json_ws(j);
    return j->ws_sep;
}

/* [0-9A-Fa-f] */
static int32_t hex(struct gm_ir *ir)
{
    return gm_ir_chars(ir, "0123456789ABCDEFabcdef");
}

/* One JSON string character (one code point of the decoded string). The
 * alternatives start with disjoint bytes, so the automaton stays
 * deterministic inside strings. */
static int32_t chr(struct gm_json *j)
{
    struct gm_ir *ir = j->ir;
    if (j->chr >= 0)
        return j->chr;
    uint8_t plain[32] = {0};
    for (unsigned c = 0x20; c < 0x80; c++)
        if (c != '"' && c != '\\')
            plain[c >> 3] |= (uint8_t)(1u << (c & 7));
    int32_t cont = gm_ir_range(ir, 0x80, 0xBF);
    int32_t cont2 = gm_ir_repeat(ir, cont, 2, 2);
    int32_t cont3 = gm_ir_repeat(ir, cont, 3, 3);
    uint8_t e1[32] = {0};
    for (unsigned c = 0xE1; c <= 0xEF; c++)
        if (c != 0xED)
            e1[c >> 3] |= (uint8_t)(1u << (c & 7));
    int32_t utf8[] = {
        gm_ir_seq2(ir, gm_ir_range(ir, 0xC2, 0xDF), cont),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xE0, 0xE0),
                              gm_ir_range(ir, 0xA0, 0xBF), cont},
                  3),
        gm_ir_seq2(ir, gm_ir_class(ir, e1), cont2),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xED, 0xED),
                              gm_ir_range(ir, 0x80, 0x9F), cont},
                  3),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xF0, 0xF0),
                              gm_ir_range(ir, 0x90, 0xBF), cont2},
                  3),
        gm_ir_seq2(ir, gm_ir_range(ir, 0xF1, 0xF3), cont3),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xF4, 0xF4),
                              gm_ir_range(ir, 0x80, 0x8F), cont2},
                  3),
    };
    /* \u escapes: a non-surrogate, or a high surrogate then a low one.
     * Factored on the first hex digit so 'D' leads to one state. */
    int32_t h = hex(ir);
    int32_t hh = gm_ir_repeat(ir, h, 2, 2);
    int32_t d = gm_ir_chars(ir, "Dd");
    int32_t low = gm_ir_seq(
        ir, (int32_t[]){gm_ir_str(ir, "\\u"), d, gm_ir_chars(ir, "CDEFcdef"), hh},
        4);
    int32_t d_tail = gm_ir_alt2(
        ir, gm_ir_seq2(ir, gm_ir_range(ir, '0', '7'), hh),
        gm_ir_seq(ir, (int32_t[]){gm_ir_chars(ir, "89ABab"), hh, low}, 3));
    int32_t u_esc = gm_ir_alt2(
        ir,
        gm_ir_seq2(ir, gm_ir_chars(ir, "0123456789ABCEFabcef"),
                   gm_ir_repeat(ir, h, 3, 3)),
        gm_ir_seq2(ir, d, d_tail));
    int32_t esc = gm_ir_seq2(
        ir, gm_ir_str(ir, "\\"),
        gm_ir_alt2(ir, gm_ir_chars(ir, "\"\\/bfnrt"),
                   gm_ir_seq2(ir, gm_ir_str(ir, "u"), u_esc)));
    int32_t all[9];
    all[0] = gm_ir_class(ir, plain);
    memcpy(all + 1, utf8, sizeof utf8);
    all[8] = esc;
    j->chr = gm_ir_alt(ir, all, 9);
    return j->chr;
}

/* A rule "\"" chr{min,max} "\"". */
static int32_t string_rule(struct gm_json *j, const char *name, uint32_t min,
                           uint32_t max)
{
    struct gm_ir *ir = j->ir;
    int32_t r = gm_ir_rule(ir, name);
    int32_t q = gm_ir_str(ir, "\"");
    int32_t body = gm_ir_seq(
        ir, (int32_t[]){q, gm_ir_repeat(ir, chr(j), min, max), q}, 3);
    int rc = gm_ir_rule_define(ir, r, body);
    return rc != 0 ? rc : r;
}

int32_t gm_json_string(struct gm_json *j)
{
    if (j->string < 0)
        j->string = string_rule(j, "string", 0, GM_REPEAT_INF);
    return j->string;
}

int32_t gm_json_string_len(struct gm_json *j, uint32_t min, uint32_t max)
{
    if (min == 0 && max == GM_REPEAT_INF)
        return gm_json_string(j);
    for (int i = 0; i < j->n_bounded; i++)
        if (j->bounded[i].min == min && j->bounded[i].max == max)
            return j->bounded[i].rule;
    int32_t r = string_rule(j, "string-len", min, max);
    if (r >= 0 && j->n_bounded < GM_JSON_LEN_BOUNDS) {
        j->bounded[j->n_bounded].min = min;
        j->bounded[j->n_bounded].max = max;
        j->bounded[j->n_bounded++].rule = r;
    }
    return r;
}

/* -?(0|[1-9][0-9]{0,GM_JSON_INT_DIGITS-1}) */
static int32_t int_part(struct gm_ir *ir)
{
    int32_t digits = gm_ir_repeat(ir, gm_ir_range(ir, '0', '9'), 0,
                                  GM_JSON_INT_DIGITS - 1);
    return gm_ir_seq2(
        ir, gm_ir_opt(ir, gm_ir_str(ir, "-")),
        gm_ir_alt2(ir, gm_ir_str(ir, "0"),
                   gm_ir_seq2(ir, gm_ir_range(ir, '1', '9'), digits)));
}

int32_t gm_json_integer(struct gm_json *j)
{
    struct gm_ir *ir = j->ir;
    if (j->integer >= 0)
        return j->integer;
    int32_t r = gm_ir_rule(ir, "integer");
    int rc = gm_ir_rule_define(ir, r, int_part(ir));
    j->integer = rc != 0 ? rc : r;
    return j->integer;
}

int32_t gm_json_number(struct gm_json *j)
{
    struct gm_ir *ir = j->ir;
    if (j->number >= 0)
        return j->number;
    int32_t r = gm_ir_rule(ir, "number");
    int32_t digit = gm_ir_range(ir, '0', '9');
    int32_t frac = gm_ir_opt(
        ir, gm_ir_seq2(ir, gm_ir_str(ir, "."),
                       gm_ir_repeat(ir, digit, 1, GM_JSON_FRAC_DIGITS)));
    int32_t exp = gm_ir_opt(
        ir,
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_chars(ir, "eE"),
                              gm_ir_opt(ir, gm_ir_chars(ir, "+-")),
                              gm_ir_repeat(ir, digit, 1, GM_JSON_EXP_DIGITS)},
                  3));
    int rc = gm_ir_rule_define(
        ir, r, gm_ir_seq(ir, (int32_t[]){int_part(ir), frac, exp}, 3));
    j->number = rc != 0 ? rc : r;
    return j->number;
}

/* Declares value, object and array together: they refer to each other. */
static int any_rules(struct gm_json *j)
{
    struct gm_ir *ir = j->ir;
    if (j->value >= 0)
        return 0;
    int32_t value = gm_ir_rule(ir, "value");
    int32_t object = gm_ir_rule(ir, "object");
    int32_t array = gm_ir_rule(ir, "array");
    int32_t ws = gm_json_ws(j), sep = gm_json_ws_sep(j);
    int32_t v = gm_ir_ref(ir, value);
    int32_t alts[7] = {gm_ir_ref(ir, object),
                       gm_ir_ref(ir, array),
                       gm_ir_ref(ir, gm_json_string(j)),
                       gm_ir_ref(ir, gm_json_number(j)),
                       gm_ir_str(ir, "true"),
                       gm_ir_str(ir, "false"),
                       gm_ir_str(ir, "null")};
    gm_ir_rule_define(ir, value, gm_ir_alt(ir, alts, 7));
    /* member = string ws ":" ws value ws */
    int32_t member = gm_ir_seq(ir,
                               (int32_t[]){gm_ir_ref(ir, gm_json_string(j)), ws,
                                           gm_ir_str(ir, ":"), sep, v, ws},
                               6);
    int32_t more_m = gm_ir_repeat(
        ir, gm_ir_seq(ir, (int32_t[]){gm_ir_str(ir, ","), sep, member}, 3), 0,
        GM_REPEAT_INF);
    gm_ir_rule_define(
        ir, object,
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_str(ir, "{"), ws,
                              gm_ir_opt(ir, gm_ir_seq2(ir, member, more_m)),
                              gm_ir_str(ir, "}")},
                  4));
    int32_t item = gm_ir_seq2(ir, v, ws);
    int32_t more_i = gm_ir_repeat(
        ir, gm_ir_seq(ir, (int32_t[]){gm_ir_str(ir, ","), sep, item}, 3), 0,
        GM_REPEAT_INF);
    int rc = gm_ir_rule_define(
        ir, array,
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_str(ir, "["), ws,
                              gm_ir_opt(ir, gm_ir_seq2(ir, item, more_i)),
                              gm_ir_str(ir, "]")},
                  4));
    if (rc != 0)
        return rc;
    j->value = value;
    j->object = object;
    j->array = array;
    return 0;
}

int32_t gm_json_value(struct gm_json *j)
{
    int rc = any_rules(j);
    return rc != 0 ? rc : j->value;
}

int32_t gm_json_object(struct gm_json *j)
{
    int rc = any_rules(j);
    return rc != 0 ? rc : j->object;
}

int gm_json_document(struct gm_json *j, int32_t rule)
{
    struct gm_ir *ir = j->ir;
    int32_t ws = gm_json_ws(j);
    int32_t doc = gm_ir_rule(ir, "document");
    int rc = gm_ir_rule_define(
        ir, doc, gm_ir_seq(ir, (int32_t[]){ws, gm_ir_ref(ir, rule), ws}, 3));
    if (rc != 0)
        return rc;
    return gm_ir_root_set(ir, doc);
}
