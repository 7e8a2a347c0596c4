/*
 * gm_regex.h — regular expressions (JSON Schema's dialect: ECMA-262 with
 * Unicode semantics) compiled into grammar IR: the strings a pattern
 * matches, as the content of a JSON string literal or as raw text.
 *
 * What a pattern may hold (ECMA-262 §22.2 with the u flag, as JSON Schema
 * 2020-12 §6.4 uses it): literals; `.` (any code point but the line
 * terminators \n \r U+2028 U+2029); classes `[a-z]`, `[^...]` (`[]`
 * matches nothing, `[^]` anything), with `\d \w \s \D \W \S` inside and
 * out (ASCII \d and \w; \s is ECMA's WhiteSpace and LineTerminator);
 * `\p{...}` / `\P{...}` of a General_Category (`L`, `Letter`, `Lu`, `Nd`,
 * ..., `gc=`/`General_Category=` prefixes; `Any`, `ASCII`, `Assigned`; also
 * `digit` for Nd); escapes `\t \n \v \f \r \0 \cX \xHH \uHHHH \u{H...}`
 * (a surrogate pair of \u escapes is one code point), `\/` and every other
 * ASCII punctuation escaped; groups `( )`, `(?: )`, `(?<name> )` (also
 * Python's `(?P<name> )`); alternation; quantifiers `* + ? {m} {m,}
 * {m,n}`, greedy or lazy (`*?`: the same strings); anchors `^ $` (input
 * start and end: no multiline flag), `\b \B` (word boundaries of \w);
 * lookaheads `(?= )` `(?! )`, anywhere except inside a repetition of
 * unbounded or large count (bounded ones are unrolled up to 16 times). A
 * `{` that does not open a quantifier, and a lone `}` or `]`, are literals
 * (Annex B), which ECMA's u mode would refuse.
 * Refused, naming the construct and its position (0-based, in code
 * points): back-references `\1`, `\k<name>` (no finite automaton can match
 * them: TG_EUNSUPPORTED), lookbehinds (TG_EUNSUPPORTED), lookaheads inside
 * an unbounded repetition (TG_EUNSUPPORTED), Unicode properties other
 * than the above (scripts, binary properties: TG_EUNSUPPORTED), and
 * syntax errors (TG_EFORMAT: unbalanced parentheses or brackets, a range
 * out of order, a quantifier with nothing to repeat, an unknown escape of
 * a letter). Patterns are UTF-8 (TG_EFORMAT otherwise).
 *
 * Semantics: matching is over the code points of the decoded string
 * (Unicode scalar values: a string never holds a lone surrogate, so a
 * pattern's lone surrogate escape matches nothing). Where \p or \P is
 * used, the strings generated hold only code points assigned in the
 * Unicode version of utf8proc (2.6: Unicode 13), so a validator of a newer
 * version, where an unassigned code point may have become a letter,
 * agrees with every generated string.
 *
 * How: each condition becomes a regular expression with intersection and
 * complement (a lookahead (?=A) followed by what the pattern and the rest
 * of the input must still match, C, is (A·Σ*) ∩ C; (?!A) is ¬(A·Σ*) ∩ C),
 * anchors and word boundaries are zero-width terms whose nullability
 * depends on the neighbouring characters, and Brzozowski derivatives
 * (Owens, Reppy and Turon, "Regular-expression derivatives reexamined",
 * 2009: similarity rules, character-class partitions) build a DFA over
 * code points, which is pruned of dead states and minimised (Moore). A
 * length range lo..hi (in code points, as JSON Schema's minLength and
 * maxLength count) is the product of the DFA with a counter (a bound
 * every string of the DFA meets anyway, e.g. maxLength 254 on an email,
 * is dropped first); when that product would exceed GM_REGEX_MAX_PRODUCT
 * states, the maximum is lowered (halved toward the minimum) until it
 * fits, so the strings written are shorter than the maximum allows (still
 * valid, as the schema compiler's cap on maxLength). The DFA is
 * written as IR: each state is an expression whose alternatives start with
 * disjoint byte classes (the JSON or UTF-8 encoding of its transitions as
 * a byte trie), a self-loop is a repetition, and a state that closes
 * another cycle is a rule (right-linear: each trip around such a cycle is
 * one call, e.g. one per label of `([a-z]+\.)+`). Size: the IR holds
 * about 2-4 expressions per byte-trie branch of each state (a `.`
 * transition is about 15, an ASCII class 2); a product with a length
 * range has at most (states × (hi + 1)) states, capped by
 * GM_REGEX_MAX_PRODUCT.
 *
 * Encodings: GM_RX_JSON writes each code point in the form a JSON string
 * literal needs: its own UTF-8 bytes where JSON allows them (U+0020 and
 * above, but `"` and `\`), `\"` and `\\`, `\b \t \n \f \r`, and `\u00XX`
 * (either case of hex digits) for the other control characters; no other
 * escape is generated (a `\/` or `\u0041` that a model writes is
 * refused). GM_RX_RAW writes the UTF-8 bytes of every code point.
 *
 * Limits: a pattern of at most GM_REGEX_MAX_PATTERN bytes, groups nested
 * at most GM_REGEX_MAX_NESTING deep, repetition counts up to
 * GM_REPEAT_MAX; at most `max_states` DFA states (before minimisation);
 * all of it bounded by the IR's deadline (gm_ir_set_deadline: TG_ETIMEDOUT
 * recorded in the IR). Thread: as the IR written to; the functions share
 * nothing else (the Unicode tables are built once, thread-safely).
 */
#ifndef GM_REGEX_H
#define GM_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_ir.h"

#define GM_REGEX_MAX_STATES 20000u       /* DFA states, default */
#define GM_REGEX_MAX_PRODUCT 30000u      /* states of DFA × length counter */
#define GM_REGEX_MAX_PATTERN (64u << 10) /* bytes of one pattern */
#define GM_REGEX_MAX_NESTING 200         /* groups and lookaheads */

/* What one condition on the string is. */
enum gm_rx_kind {
    GM_RX_SEARCH = 0, /* a pattern found anywhere in the string, as JSON
                         Schema's "pattern" (anchored only by ^ and $) */
    GM_RX_FULL,       /* a pattern matching the whole string (vLLM's and
                         Outlines' regex; Python's re.fullmatch) */
    GM_RX_LITERAL,    /* exactly this text (not a pattern) */
};

/* One condition: the string must satisfy it, or with `negate` must not. */
struct gm_rx_item {
    const char *text; /* the pattern or the literal, UTF-8, borrowed */
    size_t len;       /* bytes */
    uint8_t kind;     /* enum gm_rx_kind */
    uint8_t negate;
    const char *name; /* how messages call it (e.g. "format \"date\"");
                         NULL: `pattern "<text>"` */
};

/* How the strings are written. */
enum gm_rx_enc {
    GM_RX_JSON = 0, /* the content of a JSON string literal (no quotes) */
    GM_RX_RAW,      /* the text itself, UTF-8 */
};

struct gm_rx_opts {
    uint32_t min_len, max_len; /* code points; max GM_REPEAT_INF: none */
    uint8_t enc;               /* enum gm_rx_enc */
    uint32_t max_states;       /* 0: GM_REGEX_MAX_STATES */
};

/* The default options: any length, GM_RX_JSON, the default state limit. */
void gm_rx_opts_default(struct gm_rx_opts *o);

/* The strings that satisfy every item items[0..n) and have o->min_len ..
 * o->max_len code points, written in o->enc, as a new expression of ir
 * (n == 0: every string of the length range). Returns the expression id
 * (>= 0) or a negative code:
 *   TG_EFORMAT       a pattern's syntax (or not UTF-8)
 *   TG_EUNSUPPORTED  a construct refused above
 *   TG_ETOOBIG       a limit (pattern size, nesting, DFA states, product)
 *   TG_EINVAL        no string satisfies the items and lengths
 *   TG_ETIMEDOUT, TG_ENOMEM, and the IR's own failures.
 * The message goes to err, naming the construct and the position in the
 * pattern (items are numbered when there are several). Errors of the
 * patterns (everything but the IR's own failures: expression limit,
 * deadline, memory) are NOT recorded in the IR, so a caller adds its own
 * context (a schema pointer) with gm_ir_fail; when gm_ir_error(ir) is set,
 * the IR already carries the failure. o NULL: the defaults. */
int32_t gm_regex_expr(struct gm_ir *ir, const struct gm_rx_item *items,
                      size_t n, const struct gm_rx_opts *o, char *err,
                      size_t errlen);

/* A whole JSON string ("\"" content "\"") whose decoded value matches the
 * JSON Schema pattern [pattern, pattern + len) (GM_RX_SEARCH) and has
 * min_len..max_len code points, as a new rule of ir named "pattern".
 * Returns the rule id or a code, as gm_regex_expr. */
int32_t gm_regex_json_string(struct gm_ir *ir, const char *pattern, size_t len,
                             uint32_t min_len, uint32_t max_len, char *err,
                             size_t errlen);

/* The same for items[0..n) (e.g. patternProperties: a key matching one
 * pattern, none of the others and none of the listed names). */
int32_t gm_regex_json_string_items(struct gm_ir *ir,
                                   const struct gm_rx_item *items, size_t n,
                                   uint32_t min_len, uint32_t max_len,
                                   char *err, size_t errlen);

/* Whether the string [s, s + len) (UTF-8) satisfies items[0..n) and has
 * min_len..max_len code points: 1 yes, 0 no, or gm_regex_expr's codes
 * (message in err). For the schema compiler's literal names and values:
 * a property listed in `properties` against `propertyNames`, an enum or
 * const against `pattern`. Text that is not UTF-8 is 0. Compiles the
 * items each time (milliseconds for a format): batch the strings of one
 * condition with gm_regex_test_many. */
int gm_regex_test(const struct gm_rx_item *items, size_t n, uint32_t min_len,
                  uint32_t max_len, const char *s, size_t len, char *err,
                  size_t errlen);

/* The same for m strings s[i] of len[i] bytes at once: out[i] = 1 or 0;
 * returns 0 or a code. */
int gm_regex_test_many(const struct gm_rx_item *items, size_t n,
                       uint32_t min_len, uint32_t max_len, const char *const *s,
                       const size_t *len, size_t m, uint8_t *out, char *err,
                       size_t errlen);

/* Checks a pattern's syntax and support without building anything: 0 or
 * the code and message gm_regex_expr would give for its syntax
 * (TG_EFORMAT, TG_EUNSUPPORTED, TG_ETOOBIG). `kind` as in gm_rx_item. */
int gm_regex_check(const char *pattern, size_t len, int kind, char *err,
                   size_t errlen);

#endif /* GM_REGEX_H */
