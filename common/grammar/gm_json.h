/*
 * gm_json.h — JSON (RFC 8259) written in the grammar IR: whitespace,
 * strings (optionally of min..max characters), numbers, integers, the
 * literals, "any JSON value" and "any JSON object". The schema compiler
 * (gm_schema.h) and the tool-call builder (gm_tool.h) build on these.
 *
 * What the grammars produce is always valid UTF-8 and valid JSON:
 * - string: '"' char* '"' where a char is one Unicode scalar value:
 *   a printable ASCII byte other than '"' and '\' (DEL included), a
 *   well-formed UTF-8 sequence of 2-4 bytes (Unicode Table 3-7: no
 *   overlongs, no surrogates, nothing above U+10FFFF), a two-byte escape
 *   (\" \\ \/ \b \f \n \r \t), \uXXXX of a non-surrogate, or a
 *   surrogate pair \uD8xx-\uDBxx followed by \uDCxx-\uDFxx. A lone
 *   surrogate escape is never produced, so every char is exactly one code
 *   point of the decoded string and "length" means what JSON Schema's
 *   minLength/maxLength count.
 * - number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; integer: the
 *   same without fraction and exponent; with at most GM_JSON_INT_DIGITS
 *   integer digits, GM_JSON_FRAC_DIGITS fraction digits and
 *   GM_JSON_EXP_DIGITS exponent digits, so every number generated is a
 *   finite double (below 1e117 in magnitude): a reader in JavaScript or
 *   C never gets Infinity.
 * - whitespace between tokens follows a policy (enum gm_ws), always
 *   bounded so a model cannot pad forever:
 *     GM_WS_NONE     no whitespace at all;
 *     GM_WS_COMPACT  (the default) at most one space after ':' and ',',
 *                    nothing elsewhere, nothing around the document: what
 *                    a user of an API expects (OpenAI returns compact
 *                    JSON);
 *     GM_WS_PRETTY   every gap empty, one space, or one newline and at
 *                    most `indent` spaces or tabs (the shape of a
 *                    pretty-printed document; the idea is llama.cpp's
 *                    json.gbnf "ws" rule), also around the document;
 *     GM_WS_FREE     every gap at most `indent` characters of JSON
 *                    whitespace (space, tab, CR, LF) in any order.
 *
 * A struct gm_json memoizes the shared rules it adds to one IR, so every
 * string of a schema refers to the same rule (which the token-mask cache
 * then computes once). Thread: as the IR it writes to.
 */
#ifndef GM_JSON_H
#define GM_JSON_H

#include <stdint.h>

#include "common/grammar/gm_ir.h"

#define GM_WS_INDENT_DEFAULT 20 /* spaces/tabs after a newline */
#define GM_JSON_LEN_BOUNDS 16   /* length-bounded string rules kept */
#define GM_JSON_INT_DIGITS 18   /* integer digits of a number */
#define GM_JSON_FRAC_DIGITS 17  /* fraction digits: a double's precision */
#define GM_JSON_EXP_DIGITS 2    /* exponent digits */

enum gm_ws { GM_WS_COMPACT = 0, GM_WS_NONE, GM_WS_PRETTY, GM_WS_FREE };

/* The policy named `name` ("compact", "none", "pretty", "free"): 0 and
 * *ws set, or TG_EINVAL. */
int gm_ws_parse(const char *name, enum gm_ws *ws);
/* The name of a policy. */
const char *gm_ws_name(enum gm_ws ws);

struct gm_json {
    struct gm_ir *ir; /* borrowed */
    enum gm_ws policy;
    int ws_indent;
    int32_t ws;     /* expression, -1 until first use */
    int32_t ws_sep; /* expression after ':' and ',', -1 until first use */
    int32_t chr;    /* one string character, expression */
    int32_t string, number, integer, value, object, array; /* rules */
    struct {
        uint32_t min, max;
        int32_t rule;
    } bounded[GM_JSON_LEN_BOUNDS];
    int n_bounded;
};

/* Prepares `j` to add JSON rules to `ir` (borrowed) with whitespace
 * policy `ws` and its bound `ws_indent` (GM_WS_INDENT_DEFAULT; < 0 is
 * GM_WS_NONE whatever `ws` says). */
void gm_json_init(struct gm_json *j, struct gm_ir *ir, enum gm_ws ws,
                  int ws_indent);

/* Each returns an expression or rule id of j->ir, or a negative code (the
 * IR's sticky error). Rules are created on first use. */
/* The gap between tokens other than after ':' and ',': after '{' and '[',
 * before ':', ',', '}' and ']', around the document. */
int32_t gm_json_ws(struct gm_json *j);            /* expression */
/* The gap after ':' and ','. */
int32_t gm_json_ws_sep(struct gm_json *j);        /* expression */
int32_t gm_json_string(struct gm_json *j);        /* rule */
/* A string of min..max characters (max = GM_REPEAT_INF: no bound). */
int32_t gm_json_string_len(struct gm_json *j, uint32_t min, uint32_t max);
int32_t gm_json_number(struct gm_json *j);        /* rule */
int32_t gm_json_integer(struct gm_json *j);       /* rule */
int32_t gm_json_value(struct gm_json *j);         /* rule: any value */
int32_t gm_json_object(struct gm_json *j);        /* rule: any object */

/* A whole document: ws `rule` ws, set as the IR's start rule. Returns 0 or
 * the IR's error. */
int gm_json_document(struct gm_json *j, int32_t rule);

#endif /* GM_JSON_H */
