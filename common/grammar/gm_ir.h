/*
 * gm_ir.h — the grammar IR: named rules whose bodies are expressions over
 * bytes. Everything the engine constrains (JSON documents, JSON Schema,
 * tool-call wrappers) is first written in this form, then compiled into a
 * pushdown automaton over bytes (gm_grammar.h).
 *
 * Expressions (each has an id, an int32 >= 0):
 *   empty            the empty string
 *   bytes "abc"      a literal byte string (any bytes, NUL included)
 *   class [set]      one byte from a 256-bit set ([] = nothing)
 *   seq(a, b, ...)   a then b then ...
 *   alt(a, b, ...)   any one of them (alt() of nothing matches nothing)
 *   repeat(a,m,M)    a repeated m..M times (M = GM_REPEAT_INF: unbounded)
 *   ref(rule)        the body of a rule (rules may be recursive, but not
 *                    left-recursive: the compiler refuses a rule that can
 *                    reach itself without consuming a byte)
 * Expressions form a DAG: an id may be used any number of times (the
 * compiler shares the automaton of a shared tail).
 *
 * Errors are sticky: a builder call that fails (out of memory, a limit,
 * a bad argument) returns a negative TG_E* code and records the first
 * failure in the IR; every builder call given a negative id returns that
 * id again, so a chain of calls is checked once, at gm_ir_root_set or by
 * gm_ir_error. Limits: at most `max_exprs` expressions (gm_ir_init) and
 * repeat counts up to GM_REPEAT_MAX.
 *
 * Ownership: the IR owns everything built in it. Thread: one thread at a
 * time; a finished IR is read-only and may be read by any thread.
 */
#ifndef GM_IR_H
#define GM_IR_H

#include <stddef.h>
#include <stdint.h>

#define GM_REPEAT_INF UINT32_MAX /* repeat(a, m, GM_REPEAT_INF) = a{m,} */
#define GM_REPEAT_MAX 65536u     /* largest finite repeat count */

enum gm_expr_kind {
    GM_EXPR_EMPTY = 0,
    GM_EXPR_BYTES,  /* off, n: bytes[off..off+n) */
    GM_EXPR_CLASS,  /* off: class index */
    GM_EXPR_SEQ,    /* off, n: items[off..off+n) */
    GM_EXPR_ALT,    /* off, n: items[off..off+n) */
    GM_EXPR_REPEAT, /* sub, min, max */
    GM_EXPR_REF,    /* off: rule id */
};

struct gm_expr {
    uint8_t kind;     /* enum gm_expr_kind */
    uint32_t off, n;  /* see the kinds */
    int32_t sub;      /* REPEAT: the repeated expression */
    uint32_t min, max;
};

struct gm_rule {
    char *name; /* owned, NUL-terminated */
    int32_t body; /* expression id; -1 until gm_ir_rule_define */
};

/* The IR. Zero it, then gm_ir_init; fields are read-only outside gm_ir.c
 * (the compiler reads them). */
struct gm_ir {
    struct gm_expr *expr;
    size_t n_expr, cap_expr;
    int32_t *items; /* SEQ / ALT operands */
    size_t n_items, cap_items;
    uint8_t *bytes; /* literal bytes */
    size_t n_bytes, cap_bytes;
    uint8_t (*cls)[32]; /* byte sets: bit b of cls[i][b >> 3] is 1 << (b & 7) */
    size_t n_cls, cap_cls;
    struct gm_rule *rule;
    size_t n_rule, cap_rule;
    int32_t root;     /* the start rule, -1 until gm_ir_root_set */
    size_t max_exprs; /* limit on n_expr + n_items */
    double deadline;  /* CLOCK_MONOTONIC seconds, 0: none */
    int err;          /* first failure, 0 none */
    char errmsg[512];
};

/* Prepares `ir` (zeroed or freed) with a limit of `max_exprs` expressions
 * plus operands (0: no limit beyond memory). Cannot fail. */
void gm_ir_init(struct gm_ir *ir, size_t max_exprs);

/* Sets the wall-clock deadline of the building (CLOCK_MONOTONIC seconds,
 * 0: none): past it a builder call fails with TG_ETIMEDOUT (read every
 * 1,024 expressions), so a producer's loop that keeps building cannot
 * run past the compile limit. */
void gm_ir_set_deadline(struct gm_ir *ir, double deadline);

/* 1 when the deadline has passed (TG_ETIMEDOUT is then recorded), else
 * 0: for the producers' own loops that build nothing. */
int gm_ir_late(struct gm_ir *ir);

/* Releases everything and zeroes *ir. Safe on a zeroed IR. */
void gm_ir_free(struct gm_ir *ir);

/* Returns the first recorded failure (0 none) and copies its message into
 * err[0..errlen). */
int gm_ir_error(const struct gm_ir *ir, char *err, size_t errlen);

/* Records failure `code` with a printf message unless one is recorded
 * already; returns the recorded code (negative). For the IR's producers
 * (gm_json, gm_schema, gm_tool), so one error travels with the IR. */
int gm_ir_fail(struct gm_ir *ir, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- rules ---------------------------------------------------------- */

/* Declares a rule named `name` (copied; names need not be unique, they
 * only label the printed grammar) and returns its id, or a negative code.
 * Its body is set later with gm_ir_rule_define (so rules may refer to each
 * other before they are defined). */
int32_t gm_ir_rule(struct gm_ir *ir, const char *name);

/* Sets the body of `rule` to `body`. Returns 0 or the (negative) code of
 * the first failure; a rule defined twice is TG_EINVAL. */
int gm_ir_rule_define(struct gm_ir *ir, int32_t rule, int32_t body);

/* Makes `rule` the start rule and checks the IR: every referenced rule is
 * defined. Returns 0 or the first failure's code (detail: gm_ir_error). */
int gm_ir_root_set(struct gm_ir *ir, int32_t rule);

/* ---- expressions ---------------------------------------------------- */

int32_t gm_ir_empty(struct gm_ir *ir);
/* A literal of n bytes (copied); n == 0 is empty. */
int32_t gm_ir_bytes(struct gm_ir *ir, const void *s, size_t n);
/* A NUL-terminated literal. */
int32_t gm_ir_str(struct gm_ir *ir, const char *s);
/* One byte of the 256-bit set `set` (copied). */
int32_t gm_ir_class(struct gm_ir *ir, const uint8_t set[32]);
/* One byte in [lo, hi] (lo > hi: nothing). */
int32_t gm_ir_range(struct gm_ir *ir, unsigned lo, unsigned hi);
/* One byte among the NUL-terminated list `chars` (each byte of it). */
int32_t gm_ir_chars(struct gm_ir *ir, const char *chars);
/* items[0..n) in order / any one of them. n == 0: empty / nothing. */
int32_t gm_ir_seq(struct gm_ir *ir, const int32_t *items, size_t n);
int32_t gm_ir_alt(struct gm_ir *ir, const int32_t *items, size_t n);
/* Two-operand shorthands. */
int32_t gm_ir_seq2(struct gm_ir *ir, int32_t a, int32_t b);
int32_t gm_ir_alt2(struct gm_ir *ir, int32_t a, int32_t b);
/* `sub` min..max times; max = GM_REPEAT_INF for no bound. min > max or a
 * count over GM_REPEAT_MAX is TG_ERANGE. */
int32_t gm_ir_repeat(struct gm_ir *ir, int32_t sub, uint32_t min,
                     uint32_t max);
/* sub or nothing: repeat(sub, 0, 1). */
int32_t gm_ir_opt(struct gm_ir *ir, int32_t sub);
/* The body of `rule`. */
int32_t gm_ir_ref(struct gm_ir *ir, int32_t rule);

/* Any one of n literals s[i] (len[i] bytes), each followed by its own
 * continuation cont[i] (cont NULL: nothing follows), written as a trie:
 * literals that share a prefix share its expression, so the automaton
 * does not keep one head per literal while they agree (an enum of 1000
 * strings, tools whose names start alike). A literal given twice counts
 * once (the first continuation). Returns the expression or a code; more
 * than 4096 nested branchings is TG_ETOOBIG. */
int32_t gm_ir_literals(struct gm_ir *ir, const char *const *s,
                       const size_t *len, const int32_t *cont, size_t n);

/* Writes the IR as text, one rule a line in a GBNF-like notation
 * (`name ::= "lit" [a-z] ( x | y ) z{1,3}`), the start rule first, into a
 * new NUL-terminated string *out (caller frees) of *len bytes. For tests,
 * debugging and docs. Returns 0 or TG_ENOMEM. */
int gm_ir_format(const struct gm_ir *ir, char **out, size_t *len);

#endif /* GM_IR_H */
