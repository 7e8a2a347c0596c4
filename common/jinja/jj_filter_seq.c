/* jj_filter_seq.c — Jinja's filters over sequences (jj_filter_internal.h):
 * map, select / reject (and the attr forms), sort, dictsort, unique, min,
 * max, sum, join, reverse, first and last, and the attribute getter they
 * share (make_attrgetter: dotted paths, integer parts, items first).
 * Filters that return generators in Jinja (map, select, reject, selectattr,
 * rejectattr, unique, items, reverse of a sequence) return single-pass
 * iterators here too, so `length` of them fails and `list` consumes them,
 * as in Python. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_filter_internal.h"
#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"

int jj__f_make_iter(struct jj_ctx *c, int line, struct jj_list *l,
                     struct jj_val *out)
{
    struct jj_iter *it = calloc(1, sizeof(*it));
    if (it == NULL) {
        jj_unref(jj_list_val(l));
        return jj_oom(c, line);
    }
    it->h.rc = 1;
    it->h.type = JJ_ITER;
    it->items = l;
    out->t = JJ_ITER;
    out->u.it = it;
    return 0;
}

static int push(struct jj_ctx *c, int line, struct jj_list *l,
                struct jj_val v)
{
    if (jj_list_push(l, v)) {
        jj_unref(v);
        return jj_oom(c, line);
    }
    return 0;
}

static int attr_get(struct jj_ctx *c, int line, struct jj_val item,
                    struct jj_val attribute, struct jj_val dflt,
                    struct jj_val *out)
{
    jj_ref(item);
    struct jj_val cur = item;
    if (attribute.t == JJ_NONE || attribute.t == JJ_UNDEF) {
        *out = cur;
        return 0;
    }
    if (attribute.t != JJ_STR) {
        int rc = jj_getitem(c, line, cur, attribute, out);
        jj_unref(cur);
        if (rc == 0 && dflt.t != JJ_NONE && dflt.t != JJ_UNDEF &&
            out->t == JJ_UNDEF) {
            jj_unref(*out);
            jj_ref(dflt);
            *out = dflt;
        }
        return rc;
    }
    const char *s = attribute.u.s->s;
    size_t len = attribute.u.s->len;
    size_t a = 0;
    for (;;) {
        size_t b = a;
        while (b < len && s[b] != '.')
            b++;
        bool digits = b > a;
        for (size_t i = a; i < b; i++)
            if (s[i] < '0' || s[i] > '9')
                digits = false;
        struct jj_val key;
        int rc;
        if (digits) {
            key = jj_int(strtoll(s + a, NULL, 10));
            rc = 0;
        } else {
            rc = jj_make_str(c, line, s + a, b - a, &key);
        }
        struct jj_val next;
        if (rc == 0)
            rc = jj_getitem(c, line, cur, key, &next);
        jj_unref(key);
        jj_unref(cur);
        if (rc)
            return rc;
        cur = next;
        if (dflt.t != JJ_NONE && dflt.t != JJ_UNDEF && cur.t == JJ_UNDEF) {
            jj_unref(cur);
            jj_ref(dflt);
            cur = dflt;
        }
        if (b >= len)
            break;
        a = b + 1;
    }
    *out = cur;
    return 0;
}

static int sort_key(struct jj_ctx *c, int line, struct jj_val v,
                    bool case_sensitive, struct jj_val *out)
{
    if (!case_sensitive && v.t == JJ_STR)
        return jj_text_case(c, line, v.u.s, JJ_CASE_LOWER, out);
    jj_ref(v);
    *out = v;
    return 0;
}

static int merge_sort(struct jj_ctx *c, int line, size_t *idx, size_t *tmp,
                      size_t n, const struct jj_val *keys, bool rev)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    int rc = merge_sort(c, line, idx, tmp, h, keys, rev);
    if (rc == 0)
        rc = merge_sort(c, line, idx + h, tmp, n - h, keys, rev);
    if (rc)
        return rc;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r;
        /* take from the right only when it sorts strictly first */
        if ((rc = rev ? jj_cmp3(c, line, keys[idx[i]], keys[idx[j]], &r)
                      : jj_cmp3(c, line, keys[idx[j]], keys[idx[i]], &r)))
            return rc;
        if (rev ? r < 0 : r < 0)
            tmp[k++] = idx[j++];
        else
            tmp[k++] = idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof(*idx));
    return 0;
}

static int sort_by(struct jj_ctx *c, int line, struct jj_list *items,
                   struct jj_val *keys, bool rev, struct jj_val *out)
{
    size_t n = items->n;
    size_t *idx = malloc((n + 1) * sizeof(*idx));
    size_t *tmp = malloc((n + 1) * sizeof(*tmp));
    int rc = idx && tmp ? 0 : jj_oom(c, line);
    for (size_t i = 0; rc == 0 && i < n; i++)
        idx[i] = i;
    if (rc == 0)
        rc = merge_sort(c, line, idx, tmp, n, keys, rev);
    struct jj_list *r = rc == 0 ? jj_list_new(n, JJ_SEQ_LIST) : NULL;
    if (rc == 0 && r == NULL)
        rc = jj_oom(c, line);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        jj_ref(items->v[idx[i]]);
        r->v[r->n++] = items->v[idx[i]];
    }
    for (size_t i = 0; i < n; i++)
        jj_unref(keys[i]);
    free(idx);
    free(tmp);
    if (rc == 0)
        *out = jj_list_val(r);
    return rc;
}

static int run_test(struct jj_ctx *c, struct jj_scope *sc, int line,
                    struct jj_val name, struct jj_val v,
                    const struct jj_val *args, size_t nargs,
                    const char *const *kwnames, const struct jj_val *kwvals,
                    size_t nkw, bool *res)
{
    if (name.t == JJ_UNDEF) {
        *res = jj_truthy(v);
        return 0;
    }
    if (name.t != JJ_STR)
        return jj_fail(c, line, TG_EINVAL, "TemplateRuntimeError: No test "
                                           "named %s",
                       jj_type_name(name));
    int tid = jj_test_id(name.u.s->s);
    if (tid == -2)
        return jj_fail(c, line, TG_EINVAL,
                       "TemplateRuntimeError: No test named '%s'",
                       name.u.s->s);
    return jj_apply_test(c, sc, line, tid, name.u.s->s, v, args, nargs,
                         kwnames, kwvals, nkw, res);
}

int jj__f_select_reject(struct jj_ctx *c, struct jj_scope *sc, int line,
                         struct jj_val v, const struct jj_val *args,
                         size_t nargs, const char *const *kwnames,
                         const struct jj_val *kwvals, size_t nkw,
                         bool attr, bool keep, struct jj_val *out)
{
    if (attr && nargs == 0)
        return jj_fail(c, line, TG_EINVAL,
                       "FilterArgumentError: Missing parameter for attribute "
                       "name");
    size_t off = attr ? 1 : 0;
    struct jj_val test = nargs > off ? args[off] : jj_undef();
    const struct jj_val *targs = nargs > off + 1 ? args + off + 1 : NULL;
    size_t ntargs = nargs > off + 1 ? nargs - off - 1 : 0;
    struct jj_list *items;
    int rc = jj_iterate(c, line, v, &items);
    if (rc)
        return rc;
    struct jj_list *r = jj_list_new(0, JJ_SEQ_LIST);
    if (r == NULL) {
        jj_unref(jj_list_val(items));
        return jj_oom(c, line);
    }
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        struct jj_val x;
        if (attr)
            rc = attr_get(c, line, items->v[i], args[0], jj_none(), &x);
        else {
            x = items->v[i];
            jj_ref(x);
        }
        bool ok = false;
        if (rc == 0) {
            rc = run_test(c, sc, line, test, x, targs, ntargs, kwnames,
                          kwvals, nkw, &ok);
            jj_unref(x);
        }
        if (rc == 0 && ok == keep) {
            jj_ref(items->v[i]);
            rc = push(c, line, r, items->v[i]);
        }
    }
    jj_unref(jj_list_val(items));
    if (rc) {
        jj_unref(jj_list_val(r));
        return rc;
    }
    return jj__f_make_iter(c, line, r, out);
}

int jj__f_do_map(struct jj_ctx *c, struct jj_scope *sc, int line,
                  struct jj_val v, const struct jj_val *args, size_t nargs,
                  const char *const *kwnames, const struct jj_val *kwvals,
                  size_t nkw, struct jj_val *out)
{
    struct jj_val attribute = jj_undef(), dflt = jj_none();
    bool by_attr = false;
    if (nargs == 0) {
        for (size_t k = 0; k < nkw; k++) {
            if (!strcmp(kwnames[k], "attribute")) {
                attribute = kwvals[k];
                by_attr = true;
            } else if (!strcmp(kwnames[k], "default")) {
                dflt = kwvals[k];
            } else {
                return jj_fail(c, line, TG_EINVAL,
                               "FilterArgumentError: Unexpected keyword "
                               "argument '%s'",
                               kwnames[k]);
            }
        }
        if (!by_attr)
            return jj_fail(c, line, TG_EINVAL,
                           "FilterArgumentError: map requires a filter "
                           "argument");
    }
    int fid = -2;
    if (!by_attr) {
        if (args[0].t != JJ_STR)
            return jj_fail(c, line, TG_EINVAL,
                           "TemplateRuntimeError: No filter named %s",
                           jj_type_name(args[0]));
        fid = jj_filter_id(args[0].u.s->s);
        if (fid == -2)
            return jj_fail(c, line, TG_EINVAL,
                           "TemplateRuntimeError: No filter named '%s'",
                           args[0].u.s->s);
    }
    struct jj_list *items;
    int rc = jj_iterate(c, line, v, &items);
    if (rc)
        return rc;
    struct jj_list *r = jj_list_new(items->n, JJ_SEQ_LIST);
    if (r == NULL) {
        jj_unref(jj_list_val(items));
        return jj_oom(c, line);
    }
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        struct jj_val x;
        if (by_attr)
            rc = attr_get(c, line, items->v[i], attribute, dflt, &x);
        else
            rc = jj_apply_filter(c, sc, line, fid, args[0].u.s->s,
                                 items->v[i], args + 1, nargs - 1, kwnames,
                                 kwvals, nkw, &x);
        if (rc == 0)
            r->v[r->n++] = x;
    }
    jj_unref(jj_list_val(items));
    if (rc) {
        jj_unref(jj_list_val(r));
        return rc;
    }
    return jj__f_make_iter(c, line, r, out);
}

int jj__f_do_first_last(struct jj_ctx *c, int line, struct jj_val v,
                         bool last, struct jj_val *out)
{
    if (last && v.t == JJ_ITER)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: 'generator' object is not reversible");
    if (!last && v.t == JJ_ITER) {
        struct jj_iter *it = v.u.it;
        if (it->pos < it->items->n) {
            *out = it->items->v[it->pos++];
            jj_ref(*out);
        } else {
            *out = jj_undef_msg("No first item, sequence was empty.");
        }
        return 0;
    }
    if (v.t != JJ_UNDEF && v.t != JJ_STR && v.t != JJ_LIST &&
        v.t != JJ_DICT)
        return jj_fail(c, line, TG_EINVAL, "TypeError: '%s' object is not %s",
                       jj_type_name(v), last ? "reversible" : "iterable");
    struct jj_list *items;
    int rc = jj_iterate(c, line, v, &items);
    if (rc)
        return rc;
    if (items->n == 0) {
        *out = jj_undef_msg(last ? "No last item, sequence was empty."
                                 : "No first item, sequence was empty.");
    } else {
        *out = items->v[last ? items->n - 1 : 0];
        jj_ref(*out);
    }
    jj_unref(jj_list_val(items));
    return 0;
}

int jj__f_do_minmax(struct jj_ctx *c, int line, struct jj_val v, bool max,
                     const struct jj_val *args, size_t nargs,
                     const char *const *kwnames, const struct jj_val *kwvals,
                     size_t nkw, struct jj_val *out)
{
    int rc;
    BIND(max ? "max" : "min", "case_sensitive", "attribute");
    bool cs = hv[0] && jj_truthy(p[0]);
    struct jj_list *items;
    if ((rc = jj_iterate(c, line, v, &items)))
        return rc;
    if (items->n == 0) {
        jj_unref(jj_list_val(items));
        *out = jj_undef_msg("No aggregated item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    struct jj_val bestkey = jj_undef();
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        struct jj_val a, k;
        if ((rc = attr_get(c, line, items->v[i], hv[1] ? p[1] : jj_none(),
                           jj_none(), &a)))
            break;
        rc = sort_key(c, line, a, cs, &k);
        jj_unref(a);
        if (rc)
            break;
        if (i == 0) {
            bestkey = k;
            continue;
        }
        bool better;
        rc = jj_order(c, line, max ? JJ_OP_GT : JJ_OP_LT, k, bestkey,
                      &better);
        if (rc == 0 && better) {
            jj_unref(bestkey);
            bestkey = k;
            best = i;
        } else {
            jj_unref(k);
        }
    }
    jj_unref(bestkey);
    if (rc == 0) {
        *out = items->v[best];
        jj_ref(*out);
    }
    jj_unref(jj_list_val(items));
    return rc;
}

int jj__f_do_sort(struct jj_ctx *c, int line, struct jj_val v,
                   const struct jj_val *args, size_t nargs,
                   const char *const *kwnames, const struct jj_val *kwvals,
                   size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("sort", "reverse", "case_sensitive", "attribute");
    bool rev = hv[0] && jj_truthy(p[0]);
    bool cs = hv[1] && jj_truthy(p[1]);
    if (hv[2] && p[2].t == JJ_STR && memchr(p[2].u.s->s, ',', p[2].u.s->len))
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: sort by several attributes");
    struct jj_list *items;
    if ((rc = jj_iterate(c, line, v, &items)))
        return rc;
    struct jj_val *keys = calloc(items->n + 1, sizeof(*keys));
    if (keys == NULL) {
        jj_unref(jj_list_val(items));
        return jj_oom(c, line);
    }
    size_t nk = 0;
    for (; nk < items->n && rc == 0; nk++) {
        struct jj_val a;
        if ((rc = attr_get(c, line, items->v[nk], hv[2] ? p[2] : jj_none(),
                           jj_none(), &a)))
            break;
        rc = sort_key(c, line, a, cs, &keys[nk]);
        jj_unref(a);
    }
    if (rc == 0)
        rc = sort_by(c, line, items, keys, rev, out);
    else
        for (size_t i = 0; i < nk; i++)
            jj_unref(keys[i]);
    free(keys);
    jj_unref(jj_list_val(items));
    return rc;
}

int jj__f_do_dictsort(struct jj_ctx *c, int line, struct jj_val v,
                       const struct jj_val *args, size_t nargs,
                       const char *const *kwnames,
                       const struct jj_val *kwvals, size_t nkw,
                       struct jj_val *out)
{
    int rc;
    BIND("dictsort", "case_sensitive", "by", "reverse");
    bool cs = hv[0] && jj_truthy(p[0]);
    int pos = 0;
    if (hv[1]) {
        if (p[1].t == JJ_STR && !strcmp(p[1].u.s->s, "value"))
            pos = 1;
        else if (!(p[1].t == JJ_STR && !strcmp(p[1].u.s->s, "key")))
            return jj_fail(c, line, TG_EINVAL,
                           "FilterArgumentError: You can only sort by either "
                           "'key' or 'value'");
    }
    bool rev = hv[2] && jj_truthy(p[2]);
    if (v.t != JJ_DICT)
        return jj_fail(c, line, TG_EINVAL,
                       "AttributeError: '%s' object has no attribute 'items'",
                       jj_type_name(v));
    const struct jj_dict *d = v.u.d;
    struct jj_list *items = jj_list_new(d->n, JJ_SEQ_LIST);
    struct jj_val *keys = calloc(d->n + 1, sizeof(*keys));
    if (items == NULL || keys == NULL) {
        if (items)
            jj_unref(jj_list_val(items));
        free(keys);
        return jj_oom(c, line);
    }
    rc = 0;
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        struct jj_list *t = jj_list_new(2, JJ_SEQ_TUPLE);
        if (t == NULL) {
            rc = jj_oom(c, line);
            break;
        }
        jj_ref(d->k[i]);
        jj_ref(d->v[i]);
        t->v[0] = d->k[i];
        t->v[1] = d->v[i];
        t->n = 2;
        items->v[items->n++] = jj_list_val(t);
        rc = sort_key(c, line, pos ? d->v[i] : d->k[i], cs, &keys[i]);
    }
    if (rc == 0)
        rc = sort_by(c, line, items, keys, rev, out);
    else
        for (size_t i = 0; i < items->n; i++)
            jj_unref(keys[i]);
    free(keys);
    jj_unref(jj_list_val(items));
    return rc;
}

int jj__f_do_unique(struct jj_ctx *c, int line, struct jj_val v,
                     const struct jj_val *args, size_t nargs,
                     const char *const *kwnames, const struct jj_val *kwvals,
                     size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("unique", "case_sensitive", "attribute");
    bool cs = hv[0] && jj_truthy(p[0]);
    struct jj_list *items;
    if ((rc = jj_iterate(c, line, v, &items)))
        return rc;
    struct jj_list *r = jj_list_new(0, JJ_SEQ_LIST);
    struct jj_dict *seen = jj_dict_new(0);
    if (r == NULL || seen == NULL)
        rc = jj_oom(c, line);
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        struct jj_val a, k;
        if ((rc = attr_get(c, line, items->v[i], hv[1] ? p[1] : jj_none(),
                           jj_none(), &a)))
            break;
        rc = sort_key(c, line, a, cs, &k);
        jj_unref(a);
        if (rc)
            break;
        if (!jj_hashable(k)) {
            rc = jj_fail(c, line, TG_EINVAL, "TypeError: unhashable type: "
                                             "'%s'",
                         jj_type_name(k));
            jj_unref(k);
            break;
        }
        if (jj_dict_get(seen, k) != NULL) {
            jj_unref(k);
            continue;
        }
        if (jj_dict_set(seen, k, jj_none())) {
            jj_unref(k);
            rc = jj_oom(c, line);
            break;
        }
        jj_ref(items->v[i]);
        rc = push(c, line, r, items->v[i]);
    }
    jj_unref(jj_list_val(items));
    if (seen != NULL)
        jj_unref(jj_dict_val(seen));
    if (rc) {
        if (r != NULL)
            jj_unref(jj_list_val(r));
        return rc;
    }
    return jj__f_make_iter(c, line, r, out);
}

int jj__f_do_sum(struct jj_ctx *c, int line, struct jj_val v,
                  const struct jj_val *args, size_t nargs,
                  const char *const *kwnames, const struct jj_val *kwvals,
                  size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("sum", "attribute", "start");
    struct jj_val acc = hv[1] ? p[1] : jj_int(0);
    if (acc.t == JJ_STR)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: sum() can't sum strings [use "
                       "''.join(seq) instead]");
    jj_ref(acc);
    struct jj_list *items;
    if ((rc = jj_iterate(c, line, v, &items))) {
        jj_unref(acc);
        return rc;
    }
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        struct jj_val a, r;
        if ((rc = attr_get(c, line, items->v[i], hv[0] ? p[0] : jj_none(),
                           jj_none(), &a)))
            break;
        rc = jj_binop(c, line, JJ_OP_ADD, acc, a, &r);
        jj_unref(a);
        if (rc == 0) {
            jj_unref(acc);
            acc = r;
        }
    }
    jj_unref(jj_list_val(items));
    if (rc) {
        jj_unref(acc);
        return rc;
    }
    *out = acc;
    return 0;
}

int jj__f_do_join(struct jj_ctx *c, int line, struct jj_val v,
                   const struct jj_val *args, size_t nargs,
                   const char *const *kwnames, const struct jj_val *kwvals,
                   size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("join", "d", "attribute");
    struct jj_list *items;
    if ((rc = jj_iterate(c, line, v, &items)))
        return rc;
    struct tg_buf b = {0}, sep = {0};
    if (hv[0] && (rc = jj_pystr(c, line, p[0], false, &sep))) {
        jj_unref(jj_list_val(items));
        return rc;
    }
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        struct jj_val a;
        if ((rc = attr_get(c, line, items->v[i], hv[1] ? p[1] : jj_none(),
                           jj_none(), &a)))
            break;
        if (i > 0 && sep.len > 0 && tg_buf_append(&b, sep.data, sep.len))
            rc = jj_oom(c, line);
        if (rc == 0)
            rc = jj_pystr(c, line, a, false, &b);
        jj_unref(a);
        if (rc == 0 && b.len > c->lim.max_output)
            rc = jj_fail(c, line, TG_ETOOBIG,
                         "join exceeds the output limit of %zu bytes",
                         c->lim.max_output);
    }
    jj_unref(jj_list_val(items));
    tg_buf_free(&sep);
    if (rc) {
        tg_buf_free(&b);
        return rc;
    }
    return jj_buf_to_val(c, line, &b, out);
}

int jj__f_do_reverse(struct jj_ctx *c, int line, struct jj_val v,
                      struct jj_val *out)
{
    if (v.t == JJ_STR)
        return jj_text_slice(c, line, v.u.s, (int64_t)v.u.s->ncp - 1,
                             -(int64_t)v.u.s->ncp - 1, -1, out);
    struct jj_list *items;
    int rc = jj_iterate(c, line, v, &items);
    if (rc)
        return rc;
    struct jj_list *r = jj_list_new(items->n, JJ_SEQ_LIST);
    if (r == NULL) {
        jj_unref(jj_list_val(items));
        return jj_oom(c, line);
    }
    for (size_t i = items->n; i-- > 0;) {
        jj_ref(items->v[i]);
        r->v[r->n++] = items->v[i];
    }
    jj_unref(jj_list_val(items));
    /* reversed() of a sequence is an iterator; of a generator, a list */
    if (v.t == JJ_ITER) {
        *out = jj_list_val(r);
        return 0;
    }
    return jj__f_make_iter(c, line, r, out);
}

