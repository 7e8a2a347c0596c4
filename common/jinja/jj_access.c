/* jj_access.c — the sandboxed attribute and item access of
 * jinja2.sandbox (jj_internal.h): an attribute first tries a method of the
 * type, then an item; an item first tries the item, then an attribute; a
 * miss is an Undefined that fails only when used. Loop variables
 * (loop.index, loop.first ...) are attributes of the loop object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"

static const char *owner_name(struct jj_val v)
{
    switch (v.t) {
    case JJ_DICT: return "dict object";
    case JJ_STR: return "str object";
    case JJ_LIST:
        return v.u.l->seq == JJ_SEQ_TUPLE ? "tuple object"
               : v.u.l->seq == JJ_SEQ_RANGE ? "range object"
                                             : "list object";
    case JJ_NONE: return "NoneType object";
    case JJ_INT: return "int object";
    case JJ_BOOL: return "bool object";
    case JJ_FLOAT: return "float object";
    case JJ_NS: return "jinja2.utils.Namespace object";
    case JJ_LOOP: return "jinja2.runtime.LoopContext object";
    case JJ_FUNC: return "function object";
    default: return "object";
    }
}

static bool numeric_attr(const char *n)
{
    static const char *const names[] = {
        "real", "imag", "numerator", "denominator", "conjugate",
        "bit_length", "bit_count", "as_integer_ratio", "is_integer", "hex",
        "fromhex", "to_bytes", "from_bytes", NULL};
    for (size_t i = 0; names[i] != NULL; i++)
        if (strcmp(n, names[i]) == 0)
            return true;
    return false;
}

static int loop_attr(struct jj_ctx *c, int line, struct jj_val lv,
                     struct jj_str *name, struct jj_val *out)
{
    const struct jj_loop *lp = lv.u.lp;
    const char *n = name->s;
    size_t i = lp->i, len = lp->items->n;
    if (!strcmp(n, "index"))
        *out = jj_int((int64_t)i + 1);
    else if (!strcmp(n, "index0"))
        *out = jj_int((int64_t)i);
    else if (!strcmp(n, "revindex"))
        *out = jj_int((int64_t)(len - i));
    else if (!strcmp(n, "revindex0"))
        *out = jj_int((int64_t)(len - i - 1));
    else if (!strcmp(n, "first"))
        *out = jj_bool(i == 0);
    else if (!strcmp(n, "last"))
        *out = jj_bool(i + 1 == len);
    else if (!strcmp(n, "length"))
        *out = jj_int((int64_t)len);
    else if (!strcmp(n, "depth"))
        *out = jj_int(lp->depth);
    else if (!strcmp(n, "depth0"))
        *out = jj_int(lp->depth - 1);
    else if (!strcmp(n, "previtem")) {
        if (i == 0) {
            *out = jj_undef_msg("there is no previous item");
        } else {
            *out = lp->items->v[i - 1];
            jj_ref(*out);
        }
    } else if (!strcmp(n, "nextitem")) {
        if (i + 1 >= len) {
            *out = jj_undef_msg("there is no next item");
        } else {
            *out = lp->items->v[i + 1];
            jj_ref(*out);
        }
    } else if (!strcmp(n, "cycle") || !strcmp(n, "changed")) {
        struct jj_func *fn = calloc(1, sizeof(*fn));
        struct jj_val *self = malloc(sizeof(*self));
        if (fn == NULL || self == NULL) {
            free(fn);
            free(self);
            return jj_oom(c, line);
        }
        fn->h.rc = 1;
        fn->h.type = JJ_FUNC;
        fn->kind = JJ_FN_METHOD;
        fn->name = n[1] == 'y' ? "cycle" : "changed";
        *self = lv;
        jj_ref(lv);
        fn->self = self;
        out->t = JJ_FUNC;
        out->u.fn = fn;
    } else {
        *out = jj_undef_named(name, owner_name(lv));
    }
    return 0;
}

int jj_getattr(struct jj_ctx *c, int line, struct jj_val obj,
               struct jj_str *name, struct jj_val *out)
{
    if (name->len >= 2 && name->s[0] == '_' && name->s[1] == '_')
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: access to the attribute '%s'", name->s);
    if (obj.t == JJ_UNDEF)
        return jj_undef_error(c, line, obj);
    int rc;
    switch (obj.t) {
    case JJ_DICT:
    case JJ_STR:
    case JJ_LIST:
        rc = jj_method_lookup(c, line, obj, name, out);
        if (rc < 0)
            return rc;
        if (rc == 1)
            return 0;
        if (obj.t == JJ_DICT) {
            const struct jj_val *v = jj_dict_get(obj.u.d, jj_str_val(name));
            if (v != NULL) {
                *out = *v;
                jj_ref(*out);
                return 0;
            }
        }
        break;
    case JJ_NS: {
        const struct jj_val *v =
            jj_dict_get(obj.u.ns->attrs, jj_str_val(name));
        if (v != NULL) {
            *out = *v;
            jj_ref(*out);
            return 0;
        }
        break;
    }
    case JJ_LOOP:
        return loop_attr(c, line, obj, name, out);
    case JJ_INT:
    case JJ_FLOAT:
    case JJ_BOOL:
        if (numeric_attr(name->s))
            return jj_fail(c, line, TG_EUNSUPPORTED,
                           "unsupported: the number attribute '%s'", name->s);
        break;
    case JJ_FUNC:
    case JJ_ITER:
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: the attribute '%s' of a %s", name->s,
                       jj_type_name(obj));
    default:
        break;
    }
    *out = jj_undef_named(name, owner_name(obj));
    return 0;
}

/* Python index normalization; false when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out)
{
    if (i < 0)
        i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n)
        return false;
    *out = (size_t)i;
    return true;
}

int jj_getitem(struct jj_ctx *c, int line, struct jj_val obj,
               struct jj_val key, struct jj_val *out)
{
    if (obj.t == JJ_UNDEF)
        return jj_undef_error(c, line, obj);
    size_t idx;
    switch (obj.t) {
    case JJ_DICT:
        if (jj_hashable(key)) {
            const struct jj_val *v = jj_dict_get(obj.u.d, key);
            if (v != NULL) {
                *out = *v;
                jj_ref(*out);
                return 0;
            }
        }
        break;
    case JJ_LIST:
        if (obj.u.l->seq != JJ_SEQ_LIST && obj.u.l->seq != JJ_SEQ_TUPLE &&
            obj.u.l->seq != JJ_SEQ_RANGE)
            break;
        if (jj_is_intlike(key) && norm_index(jj_as_int(key), obj.u.l->n, &idx)) {
            *out = obj.u.l->v[idx];
            jj_ref(*out);
            return 0;
        }
        break;
    case JJ_STR:
        if (jj_is_intlike(key) &&
            norm_index(jj_as_int(key), obj.u.s->ncp, &idx)) {
            size_t a = jj_utf8_offset(obj.u.s, idx), adv;
            jj_utf8_next(obj.u.s->s + a, obj.u.s->len - a, &adv);
            int rc = jj_make_str(c, line, obj.u.s->s + a, adv, out);
            if (rc == 0)
                out->u.s->markup = obj.u.s->markup;
            return rc;
        }
        break;
    default:
        break;
    }
    /* a string key falls back to an attribute */
    if (key.t == JJ_STR &&
        !(key.u.s->len >= 2 && key.u.s->s[0] == '_' && key.u.s->s[1] == '_')) {
        if (obj.t == JJ_DICT || obj.t == JJ_STR || obj.t == JJ_LIST) {
            int rc = jj_method_lookup(c, line, obj, key.u.s, out);
            if (rc != 0)
                return rc < 0 ? rc : 0;
        } else if (obj.t == JJ_NS || obj.t == JJ_LOOP) {
            return jj_getattr(c, line, obj, key.u.s, out);
        }
    }
    *out = jj_undef_named(key.t == JJ_STR ? key.u.s : NULL, owner_name(obj));
    return 0;
}
