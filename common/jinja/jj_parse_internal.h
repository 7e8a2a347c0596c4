/*
 * jj_parse_internal.h — state and token helpers shared by the parser files
 * (jj_parse.c, jj_parse_expr.c, jj_frame.c). Not for other modules.
 * Helpers fail with a message "chat template line N: ..." in P->err and
 * return the code; node and string allocations live in the parse arena.
 */
#ifndef JJ_PARSE_INTERNAL_H
#define JJ_PARSE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jinja/jj_internal.h"

struct parser {
    struct jj_token *t;
    size_t n, i;
    void *arena;
    struct jj_template *tmpl;
    int depth;
    int in_loop;  /* for-loop nesting (break / continue) */
    int in_frame; /* inside a loop or macro body (no macro definitions) */
    char *err;
    size_t errlen;
};

struct nvec {
    struct jj_node **v;
    size_t n, cap;
};

enum tuple_mode { TUPLE_FULL = 0, TUPLE_NO_COND, TUPLE_SIMPLE };

/* Growable node vectors; nvec_done moves one into the arena (NULL
 * terminated, *n = count) and frees the vector. */
int jj__p_nvec_push(struct nvec *v, struct jj_node *x);
struct jj_node **jj__p_nvec_done(struct parser *P, struct nvec *v,
                                 size_t *n);

int jj__p_pfail(struct parser *P, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int jj__p_poom(struct parser *P);
/* "expected <wanted>, got <current token>" (or "unexpected ..."). */
int jj__p_unexpected(struct parser *P, const char *wanted);

struct jj_token *jj__p_cur(struct parser *P);
struct jj_token *jj__p_look(struct parser *P);
void jj__p_advance(struct parser *P);
bool jj__p_is_name(const struct jj_token *t, const char *name);
bool jj__p_is_op(const struct jj_token *t, uint8_t op);
int jj__p_expect_op(struct parser *P, uint8_t op);
int jj__p_expect_type(struct parser *P, uint8_t type, const char *what);
int jj__p_expect_name(struct parser *P, const char *name);

/* A zeroed arena node; NULL when out of memory. */
struct jj_node *jj__p_node(struct parser *P, uint8_t type, int line);
/* An immortal string owned by the template; NULL when out of memory. */
struct jj_str *jj__p_const_str(struct parser *P, const char *s, size_t len);
/* Records the first construct Jinja knows that this engine lacks. */
void jj__p_note_unsupported(struct parser *P, int line, const char *what,
                            const char *name);
/* Counts one nesting level against JJ_MAX_PARSE_DEPTH (the caller
 * decrements P->depth when done). */
int jj__p_enter(struct parser *P);

/* jj_parse_expr.c: Jinja's parse_expression, parse_tuple (with extra end
 * name `extra_end` or NULL), parse_primary, and parse_filter (a chain of
 * |filters applied to *n; start_inline for {% filter %}). */
int jj__parse_expression(struct parser *P, bool with_condexpr,
                         struct jj_node **out);
int jj__parse_tuple(struct parser *P, enum tuple_mode mode,
                    const char *extra_end, bool explicit_parens,
                    struct jj_node **out);
int jj__parse_primary(struct parser *P, struct jj_node **out);
int jj__parse_filter(struct parser *P, struct jj_node **n, bool start_inline);

/* jj_frame.c: the frame analysis of the whole template (fills the
 * `missing` lists of the root, loops, macros and blocks). */
int jj__analyze_frames(struct parser *P, struct jj_node *root);

#endif /* JJ_PARSE_INTERNAL_H */
