/*
 * gm_regex_internal.h — what the files of gm_regex share (gm_regex.h):
 * code point sets (gm_regex_set.c), the parsed pattern (gm_regex_parse.c),
 * terms, derivatives and the DFA (gm_regex_dfa.c), written as IR by
 * gm_regex.c. Internal to common/grammar; the tests and fuzzers read the
 * DFA through gm__rx_dfa_run.
 */
#ifndef GM_REGEX_INTERNAL_H
#define GM_REGEX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_internal.h"
#include "common/grammar/gm_regex.h"

#define GM__CP_MAX 0x10FFFFu

/* ---- code point sets -------------------------------------------------- */

/* A set of code points as sorted, disjoint, non-adjacent ranges
 * r[i][0] <= r[i][1] (after gm__cset_norm; appends leave it unsorted). */
struct gm__cset {
    uint32_t (*r)[2];
    size_t n, cap;
};

void gm__cset_free(struct gm__cset *s);
/* Appends [lo, hi] (lo > hi: nothing). 0 or TG_ENOMEM. */
int gm__cset_add(struct gm__cset *s, uint32_t lo, uint32_t hi);
/* Sorts and merges the ranges. */
void gm__cset_norm(struct gm__cset *s);
/* *s |= *a (then normalised). */
int gm__cset_union(struct gm__cset *s, const struct gm__cset *a);
/* *s = [0, GM__CP_MAX] minus *s (s normalised). */
int gm__cset_invert(struct gm__cset *s);
/* *s &= *a (both normalised). */
int gm__cset_and(struct gm__cset *s, const struct gm__cset *a);
/* 1 when c is in normalised s. */
int gm__cset_has(const struct gm__cset *s, uint32_t c);
/* *dst (zeroed or freed) = copy of src. */
int gm__cset_copy(struct gm__cset *dst, const struct gm__cset *src);

/* Appends one of ECMA's classes: 'd' 'w' 's' (ASCII digits, word
 * characters, WhiteSpace and LineTerminator) or '.' (everything but the
 * line terminators); the upper-case letters are the complements. */
int gm__cset_class(struct gm__cset *s, char which);
/* Appends the code points of Unicode property `name` (n bytes: a General
 * Category name or alias, with or without "gc="/"General_Category=",
 * "Any", "ASCII", "Assigned", "digit"); negated when neg. Returns 0,
 * TG_ENOTFOUND (a name it does not know) or TG_ENOMEM. */
int gm__cset_property(struct gm__cset *s, const char *name, size_t n, int neg);
/* Appends every scalar value assigned in utf8proc's Unicode version. */
int gm__cset_assigned(struct gm__cset *s);

/* ---- the parsed pattern --------------------------------------------------- */

enum gm__rxa_kind {
    GM__RXA_EMPTY = 0,
    GM__RXA_SET, /* a: set index */
    GM__RXA_SEQ, /* kids kid[a .. a + n) */
    GM__RXA_ALT, /* kids kid[a .. a + n) */
    GM__RXA_REP, /* a: the repeated node; min, max (GM_REPEAT_INF) */
    GM__RXA_BOL, /* ^ */
    GM__RXA_EOL, /* $ */
    GM__RXA_WB,  /* \b */
    GM__RXA_NWB, /* \B */
    GM__RXA_LOOK /* a: the lookahead's body; neg: (?! ) */
};

struct gm__rxa {
    uint8_t kind, neg;
    uint8_t look; /* a lookahead is inside (or is this node) */
    uint32_t pos; /* code point offset in the pattern */
    uint32_t min, max;
    int32_t a, n;
};

struct gm__rx_pat {
    struct gm__rxa *node;
    size_t n_node, cap_node;
    int32_t *kid;
    size_t n_kid, cap_kid;
    struct gm__cset *set;
    size_t n_set, cap_set;
    int32_t root;
    uint8_t uses_wb;   /* \b or \B */
    uint8_t uses_prop; /* \p or \P */
};

/* Parses pattern [s, s + len) into *p (zeroed). Returns 0 or TG_EFORMAT,
 * TG_EUNSUPPORTED, TG_ETOOBIG, TG_ENOMEM with the message in err. */
int gm__rx_parse(struct gm__rx_pat *p, const char *s, size_t len, char *err,
                 size_t errlen);
void gm__rx_pat_free(struct gm__rx_pat *p);

/* ---- terms and the DFA ------------------------------------------------------- */

enum gm__rxt_kind {
    GM__RXT_NONE = 0, /* no string */
    GM__RXT_EPS,      /* the empty string */
    GM__RXT_SET,      /* one code point of set a */
    GM__RXT_CAT,      /* a then b (a is never a CAT) */
    GM__RXT_OR,       /* a or b (b: the rest of a sorted chain) */
    GM__RXT_AND,      /* a and b (likewise) */
    GM__RXT_NOT,      /* not a */
    GM__RXT_REP,      /* a, b: index of its (min, max) */
    GM__RXT_BOL,
    GM__RXT_EOL,
    GM__RXT_WB,
    GM__RXT_NWB,
};

/* Contexts of nullability: the character before a position (start of
 * input, a word character, another) and after it (end of input, word,
 * other); bit p * 3 + q of a term's mask is set when it matches the empty
 * string there. */
enum { GM__P_START = 0, GM__P_WORD = 1, GM__P_OTHER = 2 };
enum { GM__Q_END = 0, GM__Q_WORD = 1, GM__Q_OTHER = 2 };
#define GM__NULL_ALL 0x1FFu

struct gm__rxt {
    uint8_t kind;
    uint16_t null; /* nullability mask */
    int32_t a, b;
};

struct gm__rx {
    struct gm__rxt *t;
    size_t n_t, cap_t;
    struct gm__kset cons; /* (kind, a, b) -> term */
    struct gm__cset *set; /* interned sets (normalised, within alpha) */
    size_t n_set, cap_set;
    struct gm__kset setk; /* (hash, hash, n ranges) -> set */
    uint32_t (*rp)[2];    /* repetition bounds */
    size_t n_rp, cap_rp;
    struct gm__kset rpk;
    struct gm__kset memo;  /* derivatives: (term, p, c) -> term */
    struct gm__cset alpha; /* the alphabet */
    int32_t all;           /* set index of alpha */
    int32_t top;           /* term: every string */
    int wb;                /* word contexts are told apart */
    int depth;             /* of the derivative's recursion */
    uint32_t max_states;
    double deadline; /* gm__now() seconds, 0: none */
    int err;
    char errmsg[256];
};

/* One transition: code points [lo, hi] -> state `to`. */
struct gm__rx_tr {
    uint32_t lo, hi;
    int32_t to;
};

/* A DFA over code points: state s has transitions tr[t0[s] .. t0[s + 1])
 * sorted by lo; states are live (an accepting state is reachable). */
struct gm__rx_dfa {
    int32_t n, start;
    uint8_t *accept;
    size_t *t0;
    struct gm__rx_tr *tr;
    size_t n_tr;
};

/* Prepares *rx; `alpha_assigned` restricts the alphabet to assigned code
 * points (patterns using \p). 0 or TG_ENOMEM. */
int gm__rx_init(struct gm__rx *rx, int alpha_assigned, uint32_t max_states,
                double deadline);
void gm__rx_free(struct gm__rx *rx);

/* The term of a parsed pattern as a condition of `kind` (GM_RX_SEARCH or
 * GM_RX_FULL); the term of a literal text; the complement; the
 * intersection; a negative code (message in rx->errmsg) on failure. */
int32_t gm__rx_pattern(struct gm__rx *rx, const struct gm__rx_pat *p, int kind);
int32_t gm__rx_literal(struct gm__rx *rx, const char *s, size_t len);
int32_t gm__rx_not(struct gm__rx *rx, int32_t a);
/* The derivative of term t by code point c in context p (GM__P_*). */
int32_t gm__rx_deriv(struct gm__rx *rx, int32_t t, int p, uint32_t c);
int32_t gm__rx_and(struct gm__rx *rx, int32_t a, int32_t b);

/* The minimal DFA of term `t` (dead states removed; n == 0 when no string
 * matches). 0 or TG_ETOOBIG (max_states), TG_ETIMEDOUT, TG_ENOMEM, with
 * the message in rx->errmsg. */
int gm__rx_dfa_build(struct gm__rx *rx, int32_t t, struct gm__rx_dfa *d);
void gm__rx_dfa_free(struct gm__rx_dfa *d);

/* Removes the states from which no accepting state is reachable (and the
 * transitions into them), renumbering the rest in order; no live start:
 * *d is emptied (n == 0). 0 or TG_ENOMEM. */
int gm__rx_dfa_prune(struct gm__rx_dfa *d);

/* 1 when the DFA accepts code points cp[0..n), else 0. */
int gm__rx_dfa_run(const struct gm__rx_dfa *d, const uint32_t *cp, size_t n);

/* Decodes one UTF-8 code point of s[0..n) (well-formed per Unicode Table
 * 3-7) into *cp; returns its length, or 0 when malformed. */
size_t gm__utf8_dec(const unsigned char *s, size_t n, uint32_t *cp);

/* One code point of set s (normalised; surrogates and anything above
 * U+10FFFF ignored) written in encoding enc (enum gm_rx_enc), as a new
 * expression of ir whose alternatives start with disjoint byte classes;
 * or the IR's error. */
int32_t gm__rx_set_expr(struct gm_ir *ir, const struct gm__cset *s, int enc);

/* Compiles items into a DFA (the first half of gm_regex_expr), for the
 * tests and fuzzers. Same returns as gm_regex_expr. */
int gm__rx_compile(const struct gm_rx_item *items, size_t n,
                   uint32_t max_states, double deadline, struct gm__rx_dfa *d,
                   char *err, size_t errlen);

#endif /* GM_REGEX_INTERNAL_H */
