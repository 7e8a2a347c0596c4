/*
 * jj_internal.h — internals shared by the jj_*.c files of the Jinja-subset
 * engine (public API: jj_template.h). Not for other modules.
 *
 * Layers, one file each:
 *   jj_lex.c     template text -> tokens (Jinja2 3.1's lexer rules with
 *                trim_blocks, lstrip_blocks and whitespace control)
 *   jj_parse.c   tokens -> AST (Jinja2's grammar), frame analysis
 *   jj_value.c   values: strings, lists, dicts, namespaces; refcounts;
 *                truthiness, equality, ordering; JSON -> value
 *   jj_pystr.c   Python str()/repr() of values, float repr, json.dumps
 *   jj_text.c    UTF-8 and Python's str methods (strip, split, case, ...)
 *   jj_eval.c    statements, scopes, loops, macros, limits
 *   jj_expr.c    expressions: operators, attribute and item access, calls
 *   jj_filter.c  filters and tests
 *   jj_method.c  methods of str / dict / list and the global functions
 *
 * Value conventions: a struct jj_val is passed by value; heap payloads are
 * reference counted. Functions that produce a value write a NEW reference to
 * *out; arguments are borrowed. Objects marked immortal (template constants)
 * are never counted, so a compiled template is read-only while rendering.
 * Every fallible function returns 0 or a negative TG_E* code and records the
 * message in the render context (jj_fail).
 */
#ifndef JJ_INTERNAL_H
#define JJ_INTERNAL_H

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_hmap.h"
#include "common/jinja/jj_template.h"

/* ---- values ----------------------------------------------------------- */

enum jj_type {
    JJ_UNDEF = 0, /* Jinja's default Undefined */
    JJ_NONE,
    JJ_BOOL,
    JJ_INT,   /* Python int, limited to int64 (overflow is an error) */
    JJ_FLOAT, /* Python float */
    JJ_STR,   /* UTF-8, immutable; may carry the Markup flag */
    JJ_LIST,  /* list, tuple, dict views, range (struct jj_list.seq) */
    JJ_DICT,  /* insertion-ordered, immutable once built (the sandbox) */
    JJ_NS,    /* jinja2.utils.Namespace (the only mutable object) */
    JJ_FUNC,  /* macro, global function or bound method */
    JJ_ITER,  /* single-pass iterator (generators, dict_itemiterator) */
    JJ_LOOP,  /* the `loop` variable of a for loop */
};

enum jj_seq {
    JJ_SEQ_LIST = 0,
    JJ_SEQ_TUPLE,
    JJ_SEQ_ITEMS,  /* dict.items() view */
    JJ_SEQ_KEYS,   /* dict.keys() view */
    JJ_SEQ_VALUES, /* dict.values() view */
    JJ_SEQ_RANGE,  /* range(start, stop, step), materialized */
};

/* Header of every heap object. */
struct jj_obj {
    int32_t rc;
    uint8_t type;     /* enum jj_type */
    uint8_t immortal; /* template constant: never counted or freed */
};

struct jj_str {
    struct jj_obj h;
    uint8_t markup; /* markupsafe.Markup (from safe / escape) */
    uint8_t ascii;  /* every byte < 0x80 */
    size_t len;     /* bytes */
    size_t ncp;     /* code points */
    char s[];       /* len bytes + NUL */
};

struct jj_val;

struct jj_list {
    struct jj_obj h;
    uint8_t seq; /* enum jj_seq */
    size_t n, cap;
    struct jj_val *v;
    int64_t r_start, r_stop, r_step; /* JJ_SEQ_RANGE: for repr */
};

struct jj_dict {
    struct jj_obj h;
    size_t n, cap;
    struct jj_val *k, *v;
    struct tg_hmap index; /* uint32_t slots: entry + 1, 0 = empty; no slots
                             (zeroed) for small dicts */
};

struct jj_ns {
    struct jj_obj h;
    struct jj_dict *attrs;
    struct jj_ns *next_all; /* the render's list of namespaces */
};

enum jj_func_kind {
    JJ_FN_MACRO = 0,
    JJ_FN_GLOBAL, /* range, dict, namespace, raise_exception, ... */
    JJ_FN_METHOD, /* a method bound to `self` */
};

struct jj_node;

struct jj_func {
    struct jj_obj h;
    uint8_t kind;                /* enum jj_func_kind */
    const char *name;            /* static or AST-owned */
    const struct jj_node *macro; /* JJ_FN_MACRO */
    struct jj_val *self;         /* JJ_FN_METHOD: owned reference */
};

struct jj_iter {
    struct jj_obj h;
    struct jj_list *items; /* owned; the remaining items are [pos, n) */
    size_t pos;
};

struct jj_loop {
    struct jj_obj h;
    struct jj_list *items; /* owned: the (filtered) sequence iterated */
    size_t i;              /* index0 of the current item */
    int depth;             /* 1 for the outermost loop */
    struct jj_val *last_changed; /* loop.changed() memory, NULL = none */
};

struct jj_val {
    uint8_t t; /* enum jj_type */
    union {
        int b;
        int64_t i;
        double f;
        struct jj_obj *o;
        struct jj_str *s;
        struct jj_list *l;
        struct jj_dict *d;
        struct jj_ns *ns;
        struct jj_func *fn;
        struct jj_iter *it;
        struct jj_loop *lp;
        /* Undefined: what was missing, for the error raised when it is
         * used. name (a reference, may be NULL) is the variable, attribute
         * or key; obj (static) the owner's type ("dict object") or NULL for
         * a variable; msg (static) a complete message instead. */
        struct {
            struct jj_str *name;
            const char *obj;
            const char *msg;
        } un;
    } u;
};

/* An int or a bool (Python's bool is an int), and its value. */
static inline bool jj_is_intlike(struct jj_val v)
{
    return v.t == JJ_INT || v.t == JJ_BOOL;
}
static inline int64_t jj_as_int(struct jj_val v)
{
    return v.t == JJ_BOOL ? v.u.b : v.u.i;
}

/* ---- AST ---------------------------------------------------------------- */

enum jj_node_type {
    /* statements */
    JJ_N_DATA = 1,   /* literal text: sval */
    JJ_N_OUTPUT,     /* {{ a }}: a */
    JJ_N_IF,         /* a = test, body, els (elif chains nest in els) */
    JJ_N_FOR,        /* a = target, b = iter, c = filter, body, els */
    JJ_N_SET,        /* a = target, b = value */
    JJ_N_SET_BLOCK,  /* a = target, c = filter chain or NULL, body */
    JJ_N_MACRO,      /* sval = name, kids = params, kids2 = defaults */
    JJ_N_BREAK,
    JJ_N_CONTINUE,
    JJ_N_FILTER_BLOCK, /* c = filter chain applied to the body */
    JJ_N_SCOPE_BLOCK,  /* body rendered in a child scope ({% generation %}) */
    /* expressions */
    JJ_N_CONST,   /* cval */
    JJ_N_NAME,    /* sval */
    JJ_N_NSREF,   /* sval . sval2 (assignment target only) */
    JJ_N_GETATTR, /* a . sval */
    JJ_N_GETITEM, /* a [ b ] */
    JJ_N_SLICE,   /* a : b : c (each may be NULL) */
    JJ_N_CALL,    /* a ( kids , kwnames = kwvals ) */
    JJ_N_FILTER,  /* a | sval ( args ) ; a NULL in a filter block */
    JJ_N_TEST,    /* a is sval ( args ) */
    JJ_N_NOT,
    JJ_N_NEG,
    JJ_N_POS,
    JJ_N_BINOP,   /* a op b; op = enum jj_op */
    JJ_N_AND,
    JJ_N_OR,
    JJ_N_CONCAT,  /* kids joined with ~ */
    JJ_N_COMPARE, /* a then (ops[i], kids[i]) chained */
    JJ_N_COND,    /* b if a else c (c may be NULL) */
    JJ_N_LIST,    /* kids */
    JJ_N_TUPLE,   /* kids */
    JJ_N_DICT,    /* kids = keys, kids2 = values */
};

enum jj_op {
    JJ_OP_ADD = 1,
    JJ_OP_SUB,
    JJ_OP_MUL,
    JJ_OP_DIV,
    JJ_OP_FLOORDIV,
    JJ_OP_MOD,
    JJ_OP_POW,
    JJ_OP_EQ,
    JJ_OP_NE,
    JJ_OP_LT,
    JJ_OP_LE,
    JJ_OP_GT,
    JJ_OP_GE,
    JJ_OP_IN,
    JJ_OP_NOTIN,
};

struct jj_node {
    uint8_t type;        /* enum jj_node_type */
    uint8_t op;          /* JJ_N_BINOP */
    uint8_t flag;        /* NOT for a negated test; macro uses varargs... */
    int line;            /* 1-based template line */
    struct jj_node *a, *b, *c;
    struct jj_node **body, **els; /* statement lists (NULL-terminated) */
    struct jj_node **kids, **kids2;
    size_t n_body, n_els, n_kids, n_kids2;
    uint8_t *ops;          /* JJ_N_COMPARE: n_kids operators */
    const char **kwnames;  /* JJ_N_CALL / FILTER / TEST keyword names */
    struct jj_node **kwvals;
    size_t n_kw;
    const char *sval, *sval2;
    struct jj_str *sname;  /* immortal string of sval (names, attributes) */
    struct jj_val cval;    /* JJ_N_CONST: immortal value */
    int fid;               /* JJ_N_FILTER / JJ_N_TEST: builtin id, -1 =
                              known to Jinja but not supported here */
    /* Frame analysis (JJ_N_FOR body, JJ_N_MACRO body, root): names whose
     * first reference in the frame is a store with no enclosing reference;
     * Jinja binds them to "missing" (undefined) when the frame starts. */
    const char **missing;
    size_t n_missing;
    const char **missing_els; /* JJ_N_FOR: the else block's frame */
    size_t n_missing_els;
};

/* Macro flags (node->flag). */
#define JJ_MACRO_VARARGS 1u
#define JJ_MACRO_KWARGS 2u

struct jj_template {
    struct jj_node *root; /* JJ_N_SCOPE_BLOCK holding the statements */
    void *arena;          /* every node and AST string */
    struct jj_obj **consts; /* immortal objects to free with the template */
    size_t n_consts, cap_consts;
    char unsupported[256]; /* first construct the engine lacks, "" = none */
};

/* ---- tokens ------------------------------------------------------------ */

enum jj_tok {
    JJ_T_EOF = 0,
    JJ_T_DATA,
    JJ_T_VAR_BEGIN,
    JJ_T_VAR_END,
    JJ_T_BLOCK_BEGIN,
    JJ_T_BLOCK_END,
    JJ_T_NAME,
    JJ_T_STRING,
    JJ_T_INT,
    JJ_T_FLOAT,
    JJ_T_OP, /* sub = enum jj_tok_op */
};

enum jj_tok_op {
    JJ_TO_ADD = 1, JJ_TO_SUB, JJ_TO_DIV, JJ_TO_FLOORDIV, JJ_TO_MUL,
    JJ_TO_MOD, JJ_TO_POW, JJ_TO_TILDE, JJ_TO_LBRACKET, JJ_TO_RBRACKET,
    JJ_TO_LPAREN, JJ_TO_RPAREN, JJ_TO_LBRACE, JJ_TO_RBRACE, JJ_TO_EQ,
    JJ_TO_NE, JJ_TO_GT, JJ_TO_GTEQ, JJ_TO_LT, JJ_TO_LTEQ, JJ_TO_ASSIGN,
    JJ_TO_DOT, JJ_TO_COLON, JJ_TO_PIPE, JJ_TO_COMMA, JJ_TO_SEMICOLON,
};

struct jj_token {
    uint8_t type; /* enum jj_tok */
    uint8_t op;   /* enum jj_tok_op for JJ_T_OP */
    int line;
    const char *s; /* DATA / NAME / STRING: decoded text (arena) */
    size_t len;
    int64_t i;     /* JJ_T_INT */
    double f;      /* JJ_T_FLOAT */
};

/* Tokenizes src (len bytes, NUL not required) into *toks (arena-allocated,
 * terminated by JJ_T_EOF). Returns 0, TG_EFORMAT (syntax error, message
 * "chat template line N: ..." in err), TG_EUNSUPPORTED or TG_ENOMEM. */
int jj__lex(void *arena, const char *src, size_t len, struct jj_token **toks,
            size_t *n_toks, char *err, size_t errlen);

/* ---- arena ------------------------------------------------------------- */

void *jj__arena_new(void);
void *jj__arena_alloc(void *arena, size_t n); /* zeroed, NULL on OOM */
char *jj__arena_strndup(void *arena, const char *s, size_t n);
void jj__arena_free(void *arena);

/* ---- render context ------------------------------------------------------ */

struct jj_scope;

struct jj_ctx {
    const struct jj_template *tmpl;
    const void *rvars;       /* the template variables (jj_eval.c) */
    struct jj_limits lim;
    struct tm now;           /* what strftime_now() formats */
    /* output of the innermost capture (macro body, set block, top level) */
    struct tg_buf out;
    size_t total_out;        /* bytes produced by the whole render */
    uint64_t steps;
    int depth;               /* macro / block nesting */
    struct jj_scope *root;   /* the template's top-level scope */
    struct jj_ns *all_ns;    /* every namespace created, freed at the end */
    int code;                /* first failure */
    int line;
    char *err;
    size_t errlen;
};

/* Records a failure at template line `line` (0 = unknown) and returns code.
 * The first failure wins; the message reads "chat template line N: ...". */
int jj_fail(struct jj_ctx *c, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int jj_oom(struct jj_ctx *c, int line);

/* Counts one unit of work against lim.max_steps. */
int jj_step(struct jj_ctx *c, int line);

/* ---- value API (jj_value.c) --------------------------------------------- */

static inline struct jj_val jj_none(void)
{
    struct jj_val v = {.t = JJ_NONE};
    return v;
}
static inline struct jj_val jj_undef(void)
{
    struct jj_val v = {.t = JJ_UNDEF};
    return v;
}
static inline struct jj_val jj_bool(int b)
{
    struct jj_val v = {.t = JJ_BOOL};
    v.u.b = b != 0;
    return v;
}
static inline struct jj_val jj_int(int64_t i)
{
    struct jj_val v = {.t = JJ_INT};
    v.u.i = i;
    return v;
}
static inline struct jj_val jj_float(double f)
{
    struct jj_val v = {.t = JJ_FLOAT};
    v.u.f = f;
    return v;
}

/* An Undefined naming what was missing (name copied by reference). */
struct jj_val jj_undef_named(struct jj_str *name, const char *obj);
struct jj_val jj_undef_msg(const char *msg);

void jj_ref(struct jj_val v);
void jj_unref(struct jj_val v);

/* Strings. NULL on out of memory. */
struct jj_str *jj_str_new(const char *s, size_t len);
struct jj_str *jj_str_cstr(const char *s);
struct jj_val jj_str_val(struct jj_str *s); /* steals s */
/* Creates a string value from bytes; *out untouched and TG_ENOMEM on
 * failure (reported in c). */
int jj_make_str(struct jj_ctx *c, int line, const char *s, size_t len,
                struct jj_val *out);

/* Lists: n preallocated slots (n = 0 allowed), all Undefined. */
struct jj_list *jj_list_new(size_t cap, uint8_t seq);
int jj_list_push(struct jj_list *l, struct jj_val v); /* steals v */
struct jj_val jj_list_val(struct jj_list *l);         /* steals l */

/* Dicts. jj_dict_set steals k and v and replaces an equal key's value in
 * place (Python dict order). */
struct jj_dict *jj_dict_new(size_t cap);
int jj_dict_set(struct jj_dict *d, struct jj_val k, struct jj_val v);
/* Appends without looking for an equal key (the caller guarantees that
 * keys are distinct, e.g. a JSON object). */
int jj_dict_append(struct jj_dict *d, struct jj_val k, struct jj_val v);
/* Borrowed value of key k, or NULL. Keys compare by Python equality. */
const struct jj_val *jj_dict_get(const struct jj_dict *d, struct jj_val k);
struct jj_val jj_dict_val(struct jj_dict *d);

/* Hashability of a dict key (str, int, float, bool, None, tuple of such). */
bool jj_hashable(struct jj_val v);

/* Python semantics. */
bool jj_truthy(struct jj_val v);
bool jj_equal(struct jj_val a, struct jj_val b);
/* Python a < b (op = JJ_OP_LT / LE / GT / GE). *res gets the result; a
 * TypeError for unorderable types is reported in c. */
int jj_order(struct jj_ctx *c, int line, int op, struct jj_val a,
             struct jj_val b, bool *res);
/* Three-way comparison used by sort: -1, 0, 1. */
int jj_cmp3(struct jj_ctx *c, int line, struct jj_val a, struct jj_val b,
            int *res);

/* Python type name for messages ("str", "dict", "int", ...). */
const char *jj_type_name(struct jj_val v);

/* Converts a jansson value into a new value (JSON null -> None). */
int jj_from_json(struct jj_ctx *c, const void *json, struct jj_val *out);

/* Materializes any iterable into a new list of its items (str -> chars,
 * dict -> keys, iterator -> consumed rest, Undefined -> empty). Raises a
 * TypeError for non-iterables. */
int jj_iterate(struct jj_ctx *c, int line, struct jj_val v,
               struct jj_list **out);

/* Length of a sized value (str in code points); TypeError otherwise. */
int jj_len(struct jj_ctx *c, int line, struct jj_val v, int64_t *n);

/* ---- text (jj_text.c) -------------------------------------------------- */

/* Decodes one UTF-8 code point at s[0..n), storing its byte length; ill
 * formed bytes decode as themselves (length 1). */
uint32_t jj_utf8_next(const char *s, size_t n, size_t *adv);
size_t jj_utf8_put(uint32_t cp, char *out); /* returns bytes written */
/* Number of code points of s[0..len). */
size_t jj_utf8_count(const char *s, size_t len);
/* Byte offset of code point index cp (clamped to len). */
size_t jj_utf8_offset(const struct jj_str *s, size_t cp);

/* Python str.isspace() for one code point. */
bool jj_py_isspace(uint32_t cp);

/* Text is built in struct tg_buf (common/base/tg_buf.h). Moves the bytes
 * of b into a new string value (the buffer is freed). */
int jj_buf_to_val(struct jj_ctx *c, int line, struct tg_buf *b,
                  struct jj_val *out);

/* Python string operations on s; results are new values. */
enum jj_strip { JJ_STRIP_BOTH = 0, JJ_STRIP_LEFT, JJ_STRIP_RIGHT };
int jj_text_strip(struct jj_ctx *c, int line, struct jj_str *s,
                  const struct jj_str *chars, enum jj_strip how,
                  struct jj_val *out);
enum jj_case {
    JJ_CASE_LOWER = 0,
    JJ_CASE_UPPER,
    JJ_CASE_TITLE,      /* str.title() */
    JJ_CASE_CAPITALIZE, /* str.capitalize() */
    JJ_CASE_SWAP,
    JJ_CASE_JTITLE,     /* Jinja's title filter */
};
int jj_text_case(struct jj_ctx *c, int line, struct jj_str *s,
                 enum jj_case how, struct jj_val *out);
int jj_text_replace(struct jj_ctx *c, int line, struct jj_str *s,
                    struct jj_str *old, struct jj_str *new_, int64_t count,
                    struct jj_val *out);
/* str.split / rsplit (sep NULL = runs of whitespace). */
int jj_text_split(struct jj_ctx *c, int line, struct jj_str *s,
                  struct jj_str *sep, int64_t maxsplit, bool right,
                  struct jj_val *out);
int jj_text_splitlines(struct jj_ctx *c, int line, struct jj_str *s,
                       bool keepends, struct jj_val *out);
/* str.find / rfind / count in code points. */
int64_t jj_text_find(const struct jj_str *s, const struct jj_str *sub,
                     bool right);
int64_t jj_text_count(const struct jj_str *s, const struct jj_str *sub);
/* Python predicates: isdigit, isalpha, isalnum, isspace, islower, isupper. */
int jj_text_is(const struct jj_str *s, const char *what, bool *res);
/* Slicing in code points (Python semantics; step != 0). */
int jj_text_slice(struct jj_ctx *c, int line, struct jj_str *s, int64_t start,
                  int64_t stop, int64_t step, struct jj_val *out);
/* markupsafe.escape of s into a Markup string. */
int jj_text_escape(struct jj_ctx *c, int line, struct jj_str *s,
                   struct jj_val *out);

/* ---- str / repr / json (jj_pystr.c) ------------------------------------- */

/* Appends Python's str(v) (repr = false) or repr(v) to b. Values whose
 * Python text would hold a memory address (functions, iterators) are an
 * error naming them. */
int jj_pystr(struct jj_ctx *c, int line, struct jj_val v, bool repr,
             struct tg_buf *b);
/* str(v) as a new string value (strings are returned as they are). */
int jj_to_str(struct jj_ctx *c, int line, struct jj_val v, struct jj_val *out);
/* Python float repr ("1.0", "1e+16", "inf") into buf (>= 32 bytes). */
void jj_float_repr(double f, char *buf, size_t cap);

struct jj_json_opts {
    bool ensure_ascii;
    bool sort_keys;
    bool indent_set;   /* indent given (not None) */
    const char *indent; /* the indent string when indent_set */
    size_t indent_len;
    const char *item_sep, *key_sep; /* separators */
    size_t item_sep_len, key_sep_len;
};
/* Python json.dumps(v, ...) into b. */
int jj_json_dumps(struct jj_ctx *c, int line, struct jj_val v,
                  const struct jj_json_opts *o, struct tg_buf *b);

/* ---- evaluation (jj_eval.c / jj_expr.c) ---------------------------------- */

int jj_eval(struct jj_ctx *c, struct jj_scope *sc, const struct jj_node *n,
            struct jj_val *out);
/* Calls callee with positional args and keyword args. */
int jj_call(struct jj_ctx *c, int line, struct jj_val callee,
            const struct jj_val *args, size_t nargs,
            const char *const *kwnames, const struct jj_val *kwvals,
            size_t nkw, struct jj_val *out);
/* Jinja's sandboxed getattr / getitem (environment.getattr / getitem). */
int jj_getattr(struct jj_ctx *c, int line, struct jj_val obj,
               struct jj_str *name, struct jj_val *out);
int jj_getitem(struct jj_ctx *c, int line, struct jj_val obj,
               struct jj_val key, struct jj_val *out);
/* Binary operators of enum jj_op (arithmetic, comparisons, in). */
int jj_binop(struct jj_ctx *c, int line, int op, struct jj_val a,
             struct jj_val b, struct jj_val *out);
/* Fails with the UndefinedError of u. */
int jj_undef_error(struct jj_ctx *c, int line, struct jj_val u);
/* Renders a macro call: binds args in a new scope below the root. */
int jj_call_macro(struct jj_ctx *c, int line, const struct jj_func *fn,
                  const struct jj_val *args, size_t nargs,
                  const char *const *kwnames, const struct jj_val *kwvals,
                  size_t nkw, struct jj_val *out);
/* Looks up a variable through the scope chain, the template variables and
 * the globals. */
int jj_lookup(struct jj_ctx *c, struct jj_scope *sc, const struct jj_node *n,
              struct jj_val *out);

/* ---- filters, tests, methods -------------------------------------------- */

/* Builtin ids for parse-time resolution: >= 0 supported, -1 known to Jinja
 * but not implemented, -2 unknown to Jinja (a compile error there too). */
int jj_filter_id(const char *name);
int jj_test_id(const char *name);
int jj_apply_filter(struct jj_ctx *c, struct jj_scope *sc, int line, int fid,
                    const char *name, struct jj_val v,
                    const struct jj_val *args, size_t nargs,
                    const char *const *kwnames, const struct jj_val *kwvals,
                    size_t nkw, struct jj_val *out);
int jj_apply_test(struct jj_ctx *c, struct jj_scope *sc, int line, int tid,
                  const char *name, struct jj_val v,
                  const struct jj_val *args, size_t nargs,
                  const char *const *kwnames, const struct jj_val *kwvals,
                  size_t nkw, bool *res);

/* Attribute lookup of a method name on str / dict / list: returns 1 and a
 * bound method value in *out when `name` is a Python attribute of v's type
 * (unsafe ones give an Undefined that fails when used), 0 when it is not. */
int jj_method_lookup(struct jj_ctx *c, int line, struct jj_val v,
                     struct jj_str *name, struct jj_val *out);
int jj_method_call(struct jj_ctx *c, int line, const struct jj_func *fn,
                   const struct jj_val *args, size_t nargs,
                   const char *const *kwnames, const struct jj_val *kwvals,
                   size_t nkw, struct jj_val *out);
/* Global functions (range, dict, namespace, raise_exception, ...): returns
 * 1 and a function value when `name` is one. */
int jj_global_lookup(const char *name, struct jj_val *out);
int jj_global_call(struct jj_ctx *c, int line, const struct jj_func *fn,
                   const struct jj_val *args, size_t nargs,
                   const char *const *kwnames, const struct jj_val *kwvals,
                   size_t nkw, struct jj_val *out);

/* Binds Python-style arguments to parameter names: positional first, then
 * keywords by name. out[i] is borrowed (Undefined type with u.un.msg NULL
 * and have[i] false when not given). Fails with a TypeError naming fname
 * for unknown keywords, duplicates or too many positionals. */
int jj_bind_args(struct jj_ctx *c, int line, const char *fname,
                 const char *const *params, size_t nparams,
                 const struct jj_val *args, size_t nargs,
                 const char *const *kwnames, const struct jj_val *kwvals,
                 size_t nkw, struct jj_val *out, bool *have);

#endif /* JJ_INTERNAL_H */
