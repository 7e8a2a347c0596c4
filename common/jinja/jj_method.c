/* jj_method.c — methods of str, dict and list values, the `loop` methods,
 * and the global functions (jj_internal.h): Jinja's range (limited to the
 * sandbox's MAX_RANGE of 100000 items), dict, namespace, and transformers'
 * raise_exception and strftime_now. Attribute names that Python types have
 * but this engine does not implement still resolve to a method, which fails
 * naming itself when called; methods that mutate lists and dicts are unsafe
 * in jinja2's ImmutableSandboxedEnvironment and resolve to an Undefined
 * that fails when used, as there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"

/* ---- method tables ----------------------------------------------------------- */

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith",
    "expandtabs", "find", "format", "format_map", "index", "isalnum",
    "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
    "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
    "join", "ljust", "lower", "lstrip", "maketrans", "partition",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
    "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith",
    "strip", "swapcase", "title", "translate", "upper", "zfill", NULL};

static const char *const DICT_METHODS[] = {"copy", "fromkeys", "get",
                                           "items", "keys", "values", NULL};
static const char *const DICT_UNSAFE[] = {"clear", "pop", "popitem",
                                          "setdefault", "update", NULL};
static const char *const LIST_METHODS[] = {"copy", "count", "index", NULL};
static const char *const TUPLE_METHODS[] = {"count", "index", NULL};
static const char *const LIST_UNSAFE[] = {"append", "clear", "extend",
                                          "insert", "pop", "remove",
                                          "reverse", "sort", NULL};

static const char *find_name(const char *const *names, const char *name)
{
    for (size_t i = 0; names[i] != NULL; i++)
        if (strcmp(names[i], name) == 0)
            return names[i];
    return NULL;
}

static int bound(struct jj_ctx *c, int line, struct jj_val self,
                 const char *name, struct jj_val *out)
{
    struct jj_func *fn = calloc(1, sizeof(*fn));
    struct jj_val *s = malloc(sizeof(*s));
    if (fn == NULL || s == NULL) {
        free(fn);
        free(s);
        return jj_oom(c, line);
    }
    fn->h.rc = 1;
    fn->h.type = JJ_FUNC;
    fn->kind = JJ_FN_METHOD;
    fn->name = name;
    *s = self;
    jj_ref(self);
    fn->self = s;
    out->t = JJ_FUNC;
    out->u.fn = fn;
    return 1;
}

int jj_method_lookup(struct jj_ctx *c, int line, struct jj_val v,
                     struct jj_str *name, struct jj_val *out)
{
    const char *n = name->s, *m = NULL;
    if (v.t == JJ_STR) {
        m = find_name(STR_METHODS, n);
    } else if (v.t == JJ_DICT) {
        m = find_name(DICT_METHODS, n);
        if (m == NULL && find_name(DICT_UNSAFE, n) != NULL) {
            *out = jj_undef_msg("access to a mutating method of a 'dict' "
                                "object is unsafe");
            out->u.un.name = NULL;
            return 1;
        }
    } else if (v.t == JJ_LIST && v.u.l->seq == JJ_SEQ_LIST) {
        m = find_name(LIST_METHODS, n);
        if (m == NULL && find_name(LIST_UNSAFE, n) != NULL) {
            *out = jj_undef_msg("access to a mutating method of a 'list' "
                                "object is unsafe");
            return 1;
        }
    } else if (v.t == JJ_LIST && v.u.l->seq == JJ_SEQ_TUPLE) {
        m = find_name(TUPLE_METHODS, n);
    }
    if (m == NULL)
        return 0;
    return bound(c, line, v, m, out);
}

/* ---- str methods ---------------------------------------------------------------- */


static int want_str(struct jj_ctx *c, int line, const char *m,
                    struct jj_val v)
{
    if (v.t == JJ_STR)
        return 0;
    return jj_fail(c, line, TG_EINVAL,
                   "TypeError: %s() argument must be str, not %s", m,
                   jj_type_name(v));
}

static bool affix(const struct jj_str *s, const struct jj_str *x, bool end)
{
    if (x->len > s->len)
        return false;
    return memcmp(s->s + (end ? s->len - x->len : 0), x->s, x->len) == 0;
}

/* Binds (first, start, end) for str.startswith / find and the like into
 * p / hv: positional only, the first required, start and end refused. */
static int bind_sub_range(struct jj_ctx *c, int line, const char *m,
                          const char *first, const struct jj_val *args,
                          size_t nargs, size_t nkw, struct jj_val *p,
                          bool *hv)
{
    const char *const pn[] = {first, "start", "end"};
    int rc = jj_bind_args(c, line, m, pn, 3, args, nargs, NULL, NULL, 0, p,
                          hv);
    if (rc != 0)
        return rc;
    if (nkw > 0)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: %s() takes no keyword arguments", m);
    if (hv[1] || hv[2])
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: %s() with start or end", m);
    if (!hv[0])
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: %s() takes at least 1 argument", m);
    return 0;
}

static int str_method(struct jj_ctx *c, int line, const char *m,
                      struct jj_str *s, const struct jj_val *args,
                      size_t nargs, const char *const *kwnames,
                      const struct jj_val *kwvals, size_t nkw,
                      struct jj_val *out)
{
    int rc;
    struct jj_val p[3];
    bool hv[3];
    if (s->markup)
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: the method '%s' of a Markup string", m);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if ((rc = bind_sub_range(c, line, m, "prefix", args, nargs, nkw, p,
                                 hv)))
            return rc;
        bool end = m[0] == 'e', r = false;
        if (p[0].t == JJ_STR) {
            r = affix(s, p[0].u.s, end);
        } else if (p[0].t == JJ_LIST && p[0].u.l->seq == JJ_SEQ_TUPLE) {
            for (size_t i = 0; i < p[0].u.l->n; i++) {
                if ((rc = want_str(c, line, m, p[0].u.l->v[i])))
                    return rc;
                r = r || affix(s, p[0].u.l->v[i].u.s, end);
            }
        } else {
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s first arg must be str or a tuple of "
                           "str, not %s",
                           m, jj_type_name(p[0]));
        }
        *out = jj_bool(r);
        return 0;
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        static const char *const pn[] = {"sep", "maxsplit"};
        if ((rc = jj_bind_args(c, line, m, pn, 2, args, nargs, kwnames,
                               kwvals, nkw, p, hv)))
            return rc;
        struct jj_str *sep = NULL;
        if (hv[0] && p[0].t != JJ_NONE) {
            if ((rc = want_str(c, line, m, p[0])))
                return rc;
            sep = p[0].u.s;
        }
        int64_t maxsplit = -1;
        if (hv[1]) {
            if (!jj_is_intlike(p[1]))
                return jj_fail(c, line, TG_EINVAL,
                               "TypeError: maxsplit must be an integer");
            maxsplit = jj_as_int(p[1]);
        }
        return jj_text_split(c, line, s, sep, maxsplit, m[0] == 'r', out);
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        static const char *const pn[] = {"chars"};
        if ((rc = jj_bind_args(c, line, m, pn, 1, args, nargs, NULL, NULL, 0,
                               p, hv)))
            return rc;
        if (nkw > 0)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s() takes no keyword arguments", m);
        if (hv[0] && p[0].t != JJ_NONE && p[0].t != JJ_STR)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s arg must be None or str", m);
        return jj_text_strip(c, line, s,
                             hv[0] && p[0].t == JJ_STR ? p[0].u.s : NULL,
                             m[0] == 'l'   ? JJ_STRIP_LEFT
                             : m[0] == 'r' ? JJ_STRIP_RIGHT
                                           : JJ_STRIP_BOTH,
                             out);
    }
    static const struct {
        const char *name;
        enum jj_case how;
    } cases[] = {{"upper", JJ_CASE_UPPER},
                 {"lower", JJ_CASE_LOWER},
                 {"title", JJ_CASE_TITLE},
                 {"capitalize", JJ_CASE_CAPITALIZE},
                 {"swapcase", JJ_CASE_SWAP}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(m, cases[i].name)) {
            if (nargs > 0 || nkw > 0)
                return jj_fail(c, line, TG_EINVAL,
                               "TypeError: %s() takes no arguments", m);
            return jj_text_case(c, line, s, cases[i].how, out);
        }
    if (!strcmp(m, "replace")) {
        static const char *const pn[] = {"old", "new", "count"};
        if ((rc = jj_bind_args(c, line, m, pn, 3, args, nargs, kwnames,
                               kwvals, nkw, p, hv)))
            return rc;
        if (!hv[0] || !hv[1])
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: replace expected at least 2 "
                           "arguments");
        if ((rc = want_str(c, line, m, p[0])) ||
            (rc = want_str(c, line, m, p[1])))
            return rc;
        if (hv[2] && !jj_is_intlike(p[2]))
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: replace() count must be an integer");
        return jj_text_replace(c, line, s, p[0].u.s, p[1].u.s,
                               hv[2] ? jj_as_int(p[2]) : -1, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") ||
        !strcmp(m, "rindex") || !strcmp(m, "count")) {
        if ((rc = bind_sub_range(c, line, m, "sub", args, nargs, nkw, p,
                                 hv)))
            return rc;
        if ((rc = want_str(c, line, m, p[0])))
            return rc;
        if (!strcmp(m, "count")) {
            *out = jj_int(jj_text_count(s, p[0].u.s));
            return 0;
        }
        int64_t at = jj_text_find(s, p[0].u.s, m[0] == 'r');
        if (at < 0 && strstr(m, "index") != NULL)
            return jj_fail(c, line, TG_EINVAL,
                           "ValueError: substring not found");
        *out = jj_int(at);
        return 0;
    }
    if (!strcmp(m, "join")) {
        if (nargs != 1 || nkw > 0)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: join() takes exactly one argument");
        struct jj_list *items;
        if ((rc = jj_iterate(c, line, args[0], &items)))
            return rc;
        struct tg_buf b = {0};
        for (size_t i = 0; i < items->n && rc == 0; i++) {
            if (items->v[i].t != JJ_STR) {
                rc = jj_fail(c, line, TG_EINVAL,
                             "TypeError: sequence item %zu: expected str "
                             "instance, %s found",
                             i, jj_type_name(items->v[i]));
                break;
            }
            if ((i > 0 && tg_buf_append(&b, s->s, s->len)) ||
                tg_buf_append(&b, items->v[i].u.s->s, items->v[i].u.s->len))
                rc = jj_oom(c, line);
            else if (b.len > c->lim.max_output)
                rc = jj_fail(c, line, TG_ETOOBIG,
                             "join exceeds the output limit of %zu bytes",
                             c->lim.max_output);
        }
        jj_unref(jj_list_val(items));
        if (rc) {
            tg_buf_free(&b);
            return rc;
        }
        return jj_buf_to_val(c, line, &b, out);
    }
    if (!strcmp(m, "splitlines")) {
        static const char *const pn[] = {"keepends"};
        if ((rc = jj_bind_args(c, line, m, pn, 1, args, nargs, kwnames,
                               kwvals, nkw, p, hv)))
            return rc;
        return jj_text_splitlines(c, line, s, hv[0] && jj_truthy(p[0]), out);
    }
    if (!strncmp(m, "is", 2) && strcmp(m, "isidentifier") != 0 &&
        strcmp(m, "isprintable") != 0 && strcmp(m, "istitle") != 0) {
        if (nargs > 0 || nkw > 0)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s() takes no arguments", m);
        bool r;
        if (!strcmp(m, "isascii")) {
            r = s->ascii;
        } else if (jj_text_is(s, m, &r) != 0) {
            return jj_fail(c, line, TG_EUNSUPPORTED,
                           "unsupported: %s() of this text", m);
        }
        *out = jj_bool(r);
        return 0;
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        if (nargs != 1 || nkw > 0)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s() takes exactly one argument", m);
        if ((rc = want_str(c, line, m, args[0])))
            return rc;
        bool end = m[6] == 's';
        const struct jj_str *x = args[0].u.s;
        if (x->len > 0 && affix(s, x, end))
            return jj_make_str(c, line, s->s + (end ? 0 : x->len),
                               s->len - x->len, out);
        return jj_make_str(c, line, s->s, s->len, out);
    }
    if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        if (nargs != 1 || nkw > 0)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s() takes exactly one argument", m);
        if ((rc = want_str(c, line, m, args[0])))
            return rc;
        const struct jj_str *sep = args[0].u.s;
        if (sep->len == 0)
            return jj_fail(c, line, TG_EINVAL, "ValueError: empty separator");
        bool right = m[0] == 'r';
        const char *hit = NULL;
        if (!right) {
            hit = sep->len <= s->len ? memmem(s->s, s->len, sep->s, sep->len)
                                     : NULL;
        } else if (sep->len <= s->len) {
            for (size_t i = s->len - sep->len + 1; i-- > 0;)
                if (memcmp(s->s + i, sep->s, sep->len) == 0) {
                    hit = s->s + i;
                    break;
                }
        }
        struct jj_list *t = jj_list_new(3, JJ_SEQ_TUPLE);
        if (t == NULL)
            return jj_oom(c, line);
        size_t at = hit ? (size_t)(hit - s->s) : 0;
        const char *parts[3];
        size_t lens[3];
        if (hit) {
            parts[0] = s->s;
            lens[0] = at;
            parts[1] = sep->s;
            lens[1] = sep->len;
            parts[2] = s->s + at + sep->len;
            lens[2] = s->len - at - sep->len;
        } else if (!right) {
            parts[0] = s->s;
            lens[0] = s->len;
            parts[1] = parts[2] = "";
            lens[1] = lens[2] = 0;
        } else {
            parts[0] = parts[1] = "";
            lens[0] = lens[1] = 0;
            parts[2] = s->s;
            lens[2] = s->len;
        }
        for (int i = 0; i < 3; i++) {
            if ((rc = jj_make_str(c, line, parts[i], lens[i], &t->v[i]))) {
                jj_unref(jj_list_val(t));
                return rc;
            }
            t->n++;
        }
        *out = jj_list_val(t);
        return 0;
    }
    return jj_fail(c, line, TG_EUNSUPPORTED,
                   "unsupported string method '%s'", m);
}

static int dict_method(struct jj_ctx *c, int line, const char *m,
                       struct jj_dict *d, struct jj_val self,
                       const struct jj_val *args, size_t nargs,
                       const char *const *kwnames,
                       const struct jj_val *kwvals, size_t nkw,
                       struct jj_val *out)
{
    (void)kwnames;
    (void)kwvals;
    if (nkw > 0)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: %s() takes no keyword arguments", m);
    if (!strcmp(m, "get")) {
        if (nargs < 1 || nargs > 2)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: get expected 1 or 2 arguments, got "
                           "%zu",
                           nargs);
        if (!jj_hashable(args[0]))
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: unhashable type: '%s'",
                           jj_type_name(args[0]));
        const struct jj_val *v = jj_dict_get(d, args[0]);
        *out = v != NULL ? *v : nargs == 2 ? args[1] : jj_none();
        jj_ref(*out);
        return 0;
    }
    if (nargs > 0)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: %s() takes no arguments", m);
    if (!strcmp(m, "copy")) {
        struct jj_dict *r = jj_dict_new(d->n);
        if (r == NULL)
            return jj_oom(c, line);
        for (size_t i = 0; i < d->n; i++) {
            jj_ref(d->k[i]);
            jj_ref(d->v[i]);
            if (jj_dict_append(r, d->k[i], d->v[i])) {
                jj_unref(d->k[i]);
                jj_unref(d->v[i]);
                jj_unref(jj_dict_val(r));
                return jj_oom(c, line);
            }
        }
        *out = jj_dict_val(r);
        return 0;
    }
    uint8_t seq = !strcmp(m, "items")  ? JJ_SEQ_ITEMS
                  : !strcmp(m, "keys") ? JJ_SEQ_KEYS
                  : !strcmp(m, "values") ? JJ_SEQ_VALUES
                                         : 0;
    if (seq == 0)
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported dict method '%s'", m);
    (void)self;
    struct jj_list *l = jj_list_new(d->n, seq);
    if (l == NULL)
        return jj_oom(c, line);
    for (size_t i = 0; i < d->n; i++) {
        if (seq == JJ_SEQ_ITEMS) {
            struct jj_list *t = jj_list_new(2, JJ_SEQ_TUPLE);
            if (t == NULL) {
                jj_unref(jj_list_val(l));
                return jj_oom(c, line);
            }
            jj_ref(d->k[i]);
            jj_ref(d->v[i]);
            t->v[0] = d->k[i];
            t->v[1] = d->v[i];
            t->n = 2;
            l->v[l->n++] = jj_list_val(t);
        } else {
            struct jj_val x = seq == JJ_SEQ_KEYS ? d->k[i] : d->v[i];
            jj_ref(x);
            l->v[l->n++] = x;
        }
    }
    *out = jj_list_val(l);
    return 0;
}

static int list_method(struct jj_ctx *c, int line, const char *m,
                       struct jj_list *l, const struct jj_val *args,
                       size_t nargs, size_t nkw, struct jj_val *out)
{
    if (nkw > 0)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: %s() takes no keyword arguments", m);
    if (!strcmp(m, "copy")) {
        if (nargs > 0)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: copy() takes no arguments");
        struct jj_list *r = jj_list_new(l->n, JJ_SEQ_LIST);
        if (r == NULL)
            return jj_oom(c, line);
        for (size_t i = 0; i < l->n; i++) {
            jj_ref(l->v[i]);
            r->v[r->n++] = l->v[i];
        }
        *out = jj_list_val(r);
        return 0;
    }
    if (nargs != 1)
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: %s() with %zu arguments", m, nargs);
    int64_t count = 0;
    for (size_t i = 0; i < l->n; i++)
        if (jj_equal(l->v[i], args[0])) {
            if (!strcmp(m, "index")) {
                *out = jj_int((int64_t)i);
                return 0;
            }
            count++;
        }
    if (!strcmp(m, "index"))
        return jj_fail(c, line, TG_EINVAL, "ValueError: value is not in %s",
                       l->seq == JJ_SEQ_TUPLE ? "tuple" : "list");
    *out = jj_int(count);
    return 0;
}

static int loop_method(struct jj_ctx *c, int line, const char *m,
                       struct jj_loop *lp, const struct jj_val *args,
                       size_t nargs, size_t nkw, struct jj_val *out)
{
    if (nkw > 0)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: loop.%s() takes no keyword arguments", m);
    if (!strcmp(m, "cycle")) {
        if (nargs == 0)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: no items for cycling given");
        *out = args[lp->i % nargs];
        jj_ref(*out);
        return 0;
    }
    /* changed(*value) */
    struct jj_list *now = jj_list_new(nargs, JJ_SEQ_TUPLE);
    if (now == NULL)
        return jj_oom(c, line);
    for (size_t i = 0; i < nargs; i++) {
        jj_ref(args[i]);
        now->v[now->n++] = args[i];
    }
    struct jj_val nv = jj_list_val(now);
    if (lp->last_changed != NULL && jj_equal(*lp->last_changed, nv)) {
        jj_unref(nv);
        *out = jj_bool(0);
        return 0;
    }
    if (lp->last_changed == NULL) {
        lp->last_changed = malloc(sizeof(*lp->last_changed));
        if (lp->last_changed == NULL) {
            jj_unref(nv);
            return jj_oom(c, line);
        }
    } else {
        jj_unref(*lp->last_changed);
    }
    *lp->last_changed = nv;
    *out = jj_bool(1);
    return 0;
}

int jj_method_call(struct jj_ctx *c, int line, const struct jj_func *fn,
                   const struct jj_val *args, size_t nargs,
                   const char *const *kwnames, const struct jj_val *kwvals,
                   size_t nkw, struct jj_val *out)
{
    struct jj_val self = *fn->self;
    switch (self.t) {
    case JJ_STR:
        return str_method(c, line, fn->name, self.u.s, args, nargs, kwnames,
                          kwvals, nkw, out);
    case JJ_DICT:
        return dict_method(c, line, fn->name, self.u.d, self, args, nargs,
                           kwnames, kwvals, nkw, out);
    case JJ_LIST:
        return list_method(c, line, fn->name, self.u.l, args, nargs, nkw,
                           out);
    case JJ_LOOP:
        return loop_method(c, line, fn->name, self.u.lp, args, nargs, nkw,
                           out);
    default:
        return jj_fail(c, line, TG_EINTERNAL, "bad method receiver");
    }
}

/* ---- globals ------------------------------------------------------------------- */

#define GLOBAL(var, nm)                                                     \
    static struct jj_func var = {                                           \
        .h = {.rc = 1, .type = JJ_FUNC, .immortal = 1},                     \
        .kind = JJ_FN_GLOBAL,                                               \
        .name = nm,                                                         \
    }

GLOBAL(G_RANGE, "range");
GLOBAL(G_DICT, "dict");
GLOBAL(G_NAMESPACE, "namespace");
GLOBAL(G_RAISE, "raise_exception");
GLOBAL(G_STRFTIME, "strftime_now");
GLOBAL(G_LIPSUM, "lipsum");
GLOBAL(G_CYCLER, "cycler");
GLOBAL(G_JOINER, "joiner");

int jj_global_lookup(const char *name, struct jj_val *out)
{
    static struct jj_func *const all[] = {&G_RANGE,  &G_DICT,   &G_NAMESPACE,
                                          &G_RAISE,  &G_STRFTIME, &G_LIPSUM,
                                          &G_CYCLER, &G_JOINER};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(all[i]->name, name) == 0) {
            out->t = JJ_FUNC;
            out->u.fn = all[i];
            return 1;
        }
    return 0;
}

/* dict(*args, **kwargs) into a new dict. */
static int build_dict(struct jj_ctx *c, int line, const char *fname,
                      const struct jj_val *args, size_t nargs,
                      const char *const *kwnames,
                      const struct jj_val *kwvals, size_t nkw,
                      struct jj_dict **out)
{
    if (nargs > 1)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: %s expected at most 1 argument, got %zu",
                       fname, nargs);
    struct jj_dict *d = jj_dict_new(0);
    if (d == NULL)
        return jj_oom(c, line);
    int rc = 0;
    if (nargs == 1 && args[0].t == JJ_DICT) {
        const struct jj_dict *s = args[0].u.d;
        for (size_t i = 0; i < s->n && rc == 0; i++) {
            jj_ref(s->k[i]);
            jj_ref(s->v[i]);
            if (jj_dict_set(d, s->k[i], s->v[i]))
                rc = jj_oom(c, line);
        }
    } else if (nargs == 1) {
        struct jj_list *items;
        if ((rc = jj_iterate(c, line, args[0], &items)) == 0) {
            for (size_t i = 0; i < items->n && rc == 0; i++) {
                struct jj_val it = items->v[i];
                if (it.t != JJ_LIST || it.u.l->n != 2 ||
                    !jj_hashable(it.u.l->v[0])) {
                    rc = jj_fail(c, line, TG_EINVAL,
                                 "TypeError: cannot convert %s sequence "
                                 "element #%zu to a key-value pair",
                                 fname, i);
                    break;
                }
                jj_ref(it.u.l->v[0]);
                jj_ref(it.u.l->v[1]);
                if (jj_dict_set(d, it.u.l->v[0], it.u.l->v[1]))
                    rc = jj_oom(c, line);
            }
            jj_unref(jj_list_val(items));
        }
    }
    for (size_t k = 0; k < nkw && rc == 0; k++) {
        struct jj_val key;
        if ((rc = jj_make_str(c, line, kwnames[k], strlen(kwnames[k]),
                              &key)))
            break;
        jj_ref(kwvals[k]);
        if (jj_dict_set(d, key, kwvals[k]))
            rc = jj_oom(c, line);
    }
    if (rc) {
        jj_unref(jj_dict_val(d));
        return rc;
    }
    *out = d;
    return 0;
}

#define JJ_MAX_RANGE 100000

static int do_range(struct jj_ctx *c, int line, const struct jj_val *args,
                    size_t nargs, size_t nkw, struct jj_val *out)
{
    if (nkw > 0)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: range() takes no keyword arguments");
    if (nargs < 1 || nargs > 3)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: range expected 1 to 3 arguments, got %zu",
                       nargs);
    for (size_t i = 0; i < nargs; i++)
        if (!jj_is_intlike(args[i])) {
            if (args[i].t == JJ_UNDEF)
                return jj_undef_error(c, line, args[i]);
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: '%s' object cannot be interpreted as "
                           "an integer",
                           jj_type_name(args[i]));
        }
    int64_t start = 0, stop, step = 1;
    if (nargs == 1) {
        stop = jj_as_int(args[0]);
    } else {
        start = jj_as_int(args[0]);
        stop = jj_as_int(args[1]);
        if (nargs == 3)
            step = jj_as_int(args[2]);
    }
    if (step == 0)
        return jj_fail(c, line, TG_EINVAL,
                       "ValueError: range() arg 3 must not be zero");
    int64_t n = 0;
    if (step > 0 && start < stop)
        n = (int64_t)(((__int128)stop - start - 1) / step + 1);
    else if (step < 0 && start > stop)
        n = (int64_t)(((__int128)start - stop - 1) / (-(__int128)step) + 1);
    if (n > JJ_MAX_RANGE)
        return jj_fail(c, line, TG_ETOOBIG,
                       "OverflowError: Range too big. The sandbox blocks "
                       "ranges larger than MAX_RANGE (%d).",
                       JJ_MAX_RANGE);
    struct jj_list *l = jj_list_new((size_t)n, JJ_SEQ_RANGE);
    if (l == NULL)
        return jj_oom(c, line);
    for (int64_t i = 0; i < n; i++)
        l->v[l->n++] = jj_int(start + i * step);
    l->r_start = start;
    l->r_stop = stop;
    l->r_step = step;
    *out = jj_list_val(l);
    return 0;
}

static int do_strftime(struct jj_ctx *c, int line, const struct jj_val *args,
                       size_t nargs, size_t nkw, struct jj_val *out)
{
    if (nargs != 1 || nkw > 0)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: strftime_now() takes exactly one argument");
    if (args[0].t != JJ_STR)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: strftime() argument 1 must be str, not %s",
                       jj_type_name(args[0]));
    const struct jj_str *f = args[0].u.s;
    if (f->len == 0)
        return jj_make_str(c, line, "", 0, out);
    if (strstr(f->s, "%f") != NULL || memchr(f->s, '\0', f->len) != NULL)
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: strftime_now format with %%f or NUL");
    /* strftime returns 0 both when the result is empty and when it does
     * not fit; a sentinel character tells them apart */
    struct tg_buf fmt = {0};
    if (tg_buf_append(&fmt, f->s, f->len) || tg_buf_putc(&fmt, '|'))
        return jj_oom(c, line);
    for (size_t cap = 256; cap <= (1u << 20); cap *= 4) {
        char *buf = malloc(cap);
        if (buf == NULL)
            break;
        size_t n = strftime(buf, cap, fmt.data, &c->now);
        if (n > 0) {
            int rc = jj_make_str(c, line, buf, n - 1, out);
            free(buf);
            tg_buf_free(&fmt);
            return rc;
        }
        free(buf);
    }
    tg_buf_free(&fmt);
    return jj_fail(c, line, TG_ETOOBIG, "strftime_now output too large");
}

int jj_global_call(struct jj_ctx *c, int line, const struct jj_func *fn,
                   const struct jj_val *args, size_t nargs,
                   const char *const *kwnames, const struct jj_val *kwvals,
                   size_t nkw, struct jj_val *out)
{
    int rc;
    if (fn == &G_RANGE)
        return do_range(c, line, args, nargs, nkw, out);
    if (fn == &G_STRFTIME)
        return do_strftime(c, line, args, nargs, nkw, out);
    if (fn == &G_RAISE) {
        struct jj_val m = jj_undef();
        if (nargs >= 1 && (rc = jj_to_str(c, line, args[0], &m)))
            return rc;
        rc = jj_fail(c, line, TG_EINVAL, "raise_exception: %s",
                     m.t == JJ_STR ? m.u.s->s : "");
        jj_unref(m);
        return rc;
    }
    if (fn == &G_DICT) {
        struct jj_dict *d;
        if ((rc = build_dict(c, line, "dict", args, nargs, kwnames, kwvals,
                             nkw, &d)))
            return rc;
        *out = jj_dict_val(d);
        return 0;
    }
    if (fn == &G_NAMESPACE) {
        struct jj_dict *d;
        if ((rc = build_dict(c, line, "namespace", args, nargs, kwnames,
                             kwvals, nkw, &d)))
            return rc;
        struct jj_ns *ns = calloc(1, sizeof(*ns));
        if (ns == NULL) {
            jj_unref(jj_dict_val(d));
            return jj_oom(c, line);
        }
        /* owned by the render: freed with every other namespace at its end
         * (they may reference each other), so never counted */
        ns->h.rc = 1;
        ns->h.type = JJ_NS;
        ns->h.immortal = 1;
        ns->attrs = d;
        ns->next_all = c->all_ns;
        c->all_ns = ns;
        out->t = JJ_NS;
        out->u.ns = ns;
        return 0;
    }
    return jj_fail(c, line, TG_EUNSUPPORTED, "unsupported function '%s'",
                   fn->name);
}
