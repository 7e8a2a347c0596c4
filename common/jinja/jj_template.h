/*
 * jj_template.h — a Jinja-subset template engine for Hugging Face chat
 * templates, byte-for-byte compatible with jinja2 3.1 configured the way
 * transformers' apply_chat_template configures it: an immutable sandbox,
 * trim_blocks and lstrip_blocks, the loop-controls extension (break,
 * continue), transformers' `tojson` (json.dumps with ensure_ascii=False),
 * the globals raise_exception() and strftime_now(), its {% generation %}
 * tag, and Jinja's default Undefined.
 *
 * Covered: output, if/elif/else, for (with `if` filter, else, loop.*),
 * set (also block set, tuple unpacking and namespace attributes), macro
 * (defaults, varargs, kwargs), filter blocks, break/continue, raw blocks,
 * comments and whitespace control; every expression form of Jinja (literals,
 * arithmetic, comparisons, `in`, `is` tests, filters, calls, attribute and
 * item access, slicing, inline if); the common filters, tests, str / dict /
 * list methods and the globals range, dict, namespace. Values print as
 * Python prints them (True, None, list and dict reprs, float repr).
 *
 * Not covered, and always an error naming the construct and its line, never
 * a different output: template inheritance and includes (extends, block,
 * include, import, from), call blocks, `with`, recursive loops, macros
 * defined inside loops or macros, string % formatting, str.format, and a
 * few filters (wordwrap, urlize, ...). A filter, test or tag that Jinja
 * itself does not know fails at parse time, as in Jinja; one that Jinja
 * knows but this engine lacks fails when it is evaluated (a template may
 * use it in a branch it never takes); jj_template_unsupported() names the
 * first such use so that a server can warn at start-up.
 *
 * Limits (struct jj_limits) bound the output, the work (steps: statements,
 * expressions, loop iterations, calls) and the macro nesting, so a hostile
 * template or a huge input fails with an error naming the limit instead of
 * hanging or exhausting memory. Parsing bounds the template size and the
 * nesting of expressions and blocks.
 *
 * Thread: a parsed template is immutable; any number of threads may render
 * it at once. jj_vars objects are not shared between threads while being
 * modified.
 */
#ifndef JJ_TEMPLATE_H
#define JJ_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* jansson's value (json_t): the header needs only its name. */
struct json_t;
struct jj_template;
struct jj_vars;

/* Largest template source accepted by jj_template_parse, in bytes. */
#define JJ_MAX_TEMPLATE_BYTES (4u << 20)
/* Deepest nesting of expressions and blocks accepted by the parser. */
#define JJ_MAX_PARSE_DEPTH 200

struct jj_limits {
    size_t max_output;  /* bytes of the rendered text and of any one string
                           built while rendering; 0 = JJ_DEFAULT_MAX_OUTPUT */
    uint64_t max_steps; /* units of work; 0 = JJ_DEFAULT_MAX_STEPS */
    int max_depth;      /* macro call nesting; 0 = JJ_DEFAULT_MAX_DEPTH */
};
#define JJ_DEFAULT_MAX_OUTPUT (64u << 20)
#define JJ_DEFAULT_MAX_STEPS 50000000ull
#define JJ_DEFAULT_MAX_DEPTH 100

struct jj_render_opts {
    struct jj_limits limits;
    /* The local time strftime_now() formats; NULL = the current local time
     * at the start of the render. */
    const struct tm *now;
};

/* Parses template source src[0..len) into *out (caller frees with
 * jj_template_free). Returns 0; TG_EFORMAT for a syntax error (Jinja's
 * TemplateSyntaxError) or a filter / test Jinja does not know;
 * TG_EUNSUPPORTED for a construct this engine lacks that Jinja would reject
 * only when rendering, or a tag it lacks (extends, include, ...);
 * TG_ETOOBIG over JJ_MAX_TEMPLATE_BYTES or JJ_MAX_PARSE_DEPTH; TG_ENOMEM.
 * Messages read "chat template line N: ...". Any thread. */
int jj_template_parse(const char *src, size_t len, struct jj_template **out,
                      char *err, size_t errlen);

/* Frees t; NULL is fine. */
void jj_template_free(struct jj_template *t);

/* Returns "" or a description of the first construct in t that this engine
 * cannot evaluate ("line 12: filter 'wordwrap'"); rendering fails only if
 * that construct is reached. The string lives as long as t. */
const char *jj_template_unsupported(const struct jj_template *t);

/* Template variables: a name -> JSON value map (JSON null becomes None). */
struct jj_vars *jj_vars_new(void);
void jj_vars_free(struct jj_vars *v);
/* Sets `name` to a JSON value; the object takes its own reference (the
 * value must not be modified afterwards). Returns 0 or TG_ENOMEM. */
int jj_vars_set_json(struct jj_vars *v, const char *name, struct json_t *value);
int jj_vars_set_str(struct jj_vars *v, const char *name, const char *s);
int jj_vars_set_bool(struct jj_vars *v, const char *name, bool b);
/* Removes `name` (no-op when absent). */
void jj_vars_unset(struct jj_vars *v, const char *name);

/* Renders t with variables `vars` (NULL = none) and options `opt` (NULL =
 * defaults) into *out, a malloc'd NUL-terminated string of *out_len bytes
 * the caller frees (may hold NUL bytes when a variable does). Returns 0;
 * TG_EINVAL when the template fails the way Jinja would (raise_exception,
 * an undefined value used, a type error; the message says which);
 * TG_EUNSUPPORTED for a construct this engine lacks; TG_ETOOBIG when a
 * limit is reached (the message names it); TG_ENOMEM. On failure *out is
 * NULL. Any thread. */
int jj_render(const struct jj_template *t, const struct jj_vars *vars,
              const struct jj_render_opts *opt, char **out, size_t *out_len,
              char *err, size_t errlen);

/* The bounds [*a, *b) of the n bytes of UTF-8 at s that Python's
 * str.strip() keeps: whitespace as str.isspace() defines it cut from both
 * ends (an ill-formed byte is not whitespace). For callers that post-process
 * a rendered template the way transformers does. Any thread. */
void jj_py_strip(const char *s, size_t n, size_t *a, size_t *b);

/* Writes Python's json.dumps(v, ensure_ascii=ensure_ascii) of the JSON
 * value v (default separators ", " and ": ", key order kept, floats as
 * Python's repr) into *out, a malloc'd NUL-terminated string of *len bytes
 * the caller frees. Returns 0, TG_ENOMEM, or TG_ETOOBIG past
 * JJ_DEFAULT_MAX_OUTPUT. Any thread. */
int jj_json_dumps_py(const struct json_t *v, bool ensure_ascii, char **out,
                     size_t *len);

#endif /* JJ_TEMPLATE_H */
