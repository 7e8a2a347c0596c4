/* gm_schema_merge.c — allOf, and keywords beside $ref, anyOf and oneOf
 * (an implicit allOf in draft 2020-12), compiled by merging the parts
 * into one schema (gm_schema_internal.h).
 *
 * A schema that needs it is rewritten before it is compiled:
 *   - its parts: its own assertion keywords, each allOf element, the
 *     target of its $ref (resolved from where the $ref sits), its anyOf
 *     or oneOf; the parts' own allOf and $refs are opened the same way
 *     (to a depth bound: a $ref cycle through allOf is refused);
 *   - the plain parts are merged keyword by keyword into one object M
 *     (below); boolean parts: false makes everything false, true adds
 *     nothing;
 *   - an anyOf part distributes: anyOf of allOf[M, alternative] — the
 *     new allOf objects are merged lazily when they are compiled, so two
 *     anyOf parts cost their product only as far as it is generated;
 *   - a oneOf part distributes the same way once its alternatives are
 *     proven exclusive as written (a subset of exclusive sets stays
 *     exclusive), and is then generated as anyOf.
 * Merging two plain objects is exact for every keyword the compiler
 * knows: type sets intersect; enum/const intersect; counts and bounds
 * tighten (minimum and exclusiveMinimum each keep their larger value);
 * multipleOf integers take their lcm; required unions; properties,
 * items, contains, propertyNames, additionalProperties and prefixItems
 * positions become allOf of the two — where one side lacks a property,
 * its additionalProperties (or "anything") stands in, so a property one
 * part closes off stays closed. Two different patterns, or formats,
 * cannot be held by one string schema and are refused, as are
 * patternProperties beside the other part's additionalProperties, and
 * every keyword the compiler does not know.
 * The made schemas live as long as the compile (gm__schema_own).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_schema_internal.h"

#define MERGE_DEPTH 16

/* Keywords that do not constrain (kept from the first part only). */
static int annotation(const char *k)
{
    static const char *const a[] = {
        "title",         "description",      "default",
        "examples",      "$comment",         "$schema",
        "$id",           "$anchor",          "deprecated",
        "readOnly",      "writeOnly",        "discriminator",
        "$defs",         "definitions",      "$dynamicAnchor",
        "$vocabulary",   "contentMediaType", "contentEncoding",
        "contentSchema", "$recursiveAnchor"};
    for (size_t i = 0; i < sizeof a / sizeof *a; i++)
        if (strcmp(k, a[i]) == 0)
            return 1;
    return k[0] == 'x' && k[1] == '-';
}

static int is_comb(const char *k)
{
    return strcmp(k, "allOf") == 0 || strcmp(k, "anyOf") == 0 ||
           strcmp(k, "oneOf") == 0 || strcmp(k, "$ref") == 0;
}

/* Keywords opened or applied by the merge even when alone. */
static int merge_only(const char *k)
{
    return strcmp(k, "allOf") == 0 || strcmp(k, "if") == 0 ||
           strcmp(k, "then") == 0 || strcmp(k, "else") == 0 ||
           strcmp(k, "unevaluatedProperties") == 0 ||
           strcmp(k, "unevaluatedItems") == 0 ||
           strcmp(k, "dependentSchemas") == 0 ||
           strcmp(k, "dependentRequired") == 0;
}

int gm__schema_needs_merge(const json_t *s)
{
    if (!json_is_object(s))
        return 0;
    int comb = 0, other = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if (merge_only(k))
            return 1;
        if (is_comb(k))
            comb++;
        else if (!annotation(k))
            other = 1;
    }
    return comb > 1 || (comb == 1 && other);
}

/* ---- merging two plain objects ------------------------------------------ */

static json_t *allof2(const json_t *a, const json_t *b)
{
    if (a == NULL || json_is_true(a))
        return b != NULL ? json_incref((json_t *)b) : json_true();
    if (b == NULL || json_is_true(b))
        return json_incref((json_t *)a);
    return json_pack("{s[OO]}", "allOf", (json_t *)a, (json_t *)b);
}

static json_t *type_names(unsigned bits)
{
    json_t *a = json_array();
    if ((bits & (GM__T_INT | GM__T_FRAC)) == (GM__T_INT | GM__T_FRAC))
        json_array_append_new(a, json_string("number"));
    else if (bits & GM__T_INT)
        json_array_append_new(a, json_string("integer"));
    static const struct {
        unsigned bit;
        const char *name;
    } t[] = {{GM__T_OBJECT, "object"},
             {GM__T_ARRAY, "array"},
             {GM__T_STRING, "string"},
             {GM__T_BOOL, "boolean"},
             {GM__T_NULL, "null"}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (bits & t[i].bit)
            json_array_append_new(a, json_string(t[i].name));
    return a;
}

static unsigned long long gcd(unsigned long long a, unsigned long long b)
{
    while (b != 0) {
        unsigned long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

struct mrg {
    struct gm__sc *c;
    const char *why; /* a refusal's keyword, NULL while fine */
    int never;       /* the parts contradict: no document */
};

/* Sets out[k] = merge of a's and b's values of keyword k (both present). */
static int merge_kw(struct mrg *m, json_t *out, const char *k, const json_t *a,
                    const json_t *b, const json_t *pa, const json_t *pb)
{
    json_t *v = NULL;
    if (strcmp(k, "type") == 0) {
        unsigned t = gm__schema_type_of(a) & gm__schema_type_of(b);
        /* integer within number: the intersection keeps integer */
        if (t == 0)
            m->never = 1;
        v = type_names(t);
    } else if (strcmp(k, "const") == 0) {
        if (!gm__schema_equal(a, b))
            m->never = 1;
        v = json_incref((json_t *)a);
    } else if (strcmp(k, "enum") == 0) {
        v = json_array();
        size_t i, j;
        const json_t *x, *y;
        json_array_foreach(a, i, x)
        {
            json_array_foreach(b, j, y)
            {
                if (gm__schema_equal(x, y)) {
                    json_array_append(v, (json_t *)x);
                    break;
                }
            }
        }
        if (json_array_size(v) == 0)
            m->never = 1;
    } else if (strcmp(k, "minimum") == 0 || strcmp(k, "minLength") == 0 ||
               strcmp(k, "minItems") == 0 || strcmp(k, "minProperties") == 0 ||
               strcmp(k, "minContains") == 0 ||
               (strcmp(k, "exclusiveMinimum") == 0 && json_is_number(a) &&
                json_is_number(b))) {
        v = json_incref(
            (json_t *)(json_number_value(a) >= json_number_value(b) ? a : b));
    } else if (strcmp(k, "maximum") == 0 || strcmp(k, "maxLength") == 0 ||
               strcmp(k, "maxItems") == 0 || strcmp(k, "maxProperties") == 0 ||
               strcmp(k, "maxContains") == 0 ||
               (strcmp(k, "exclusiveMaximum") == 0 && json_is_number(a) &&
                json_is_number(b))) {
        v = json_incref(
            (json_t *)(json_number_value(a) <= json_number_value(b) ? a : b));
    } else if (strcmp(k, "multipleOf") == 0) {
        double x = json_number_value(a), y = json_number_value(b);
        if (x == floor(x) && y == floor(y) && x > 0 && y > 0 && x < 1e9 &&
            y < 1e9) {
            unsigned long long p = (unsigned long long)x,
                               q = (unsigned long long)y;
            v = json_integer((json_int_t)(p / gcd(p, q) * q));
        } else if (x == y) {
            v = json_incref((json_t *)a);
        } else {
            m->why = "multipleOf";
        }
    } else if (strcmp(k, "required") == 0) {
        v = json_deep_copy(a);
        size_t i;
        const json_t *x;
        json_array_foreach(b, i, x) json_array_append(v, (json_t *)x);
    } else if (strcmp(k, "not") == 0) {
        /* not A and not B: not (A or B) */
        v = json_pack("{s[OO]}", "anyOf", (json_t *)a, (json_t *)b);
    } else if (strcmp(k, "unevaluatedProperties") == 0 ||
               strcmp(k, "unevaluatedItems") == 0) {
        v = allof2(a, b);
    } else if (strcmp(k, "dependentRequired") == 0 ||
               strcmp(k, "dependentSchemas") == 0) {
        int req = k[9] == 'R';
        v = json_deep_copy(a);
        const char *key;
        const json_t *x;
        json_object_foreach((json_t *)b, key, x)
        {
            const json_t *y = json_object_get(v, key);
            if (y == NULL) {
                json_object_set(v, key, (json_t *)x);
            } else if (req) {
                json_t *both = json_deep_copy(y);
                json_array_extend(both, (json_t *)x);
                json_object_set_new(v, key, both);
            } else {
                json_object_set_new(v, key, allof2(y, x));
            }
        }
    } else if (strcmp(k, "uniqueItems") == 0) {
        v = json_boolean(json_is_true(a) || json_is_true(b));
    } else if (strcmp(k, "items") == 0 || strcmp(k, "contains") == 0 ||
               strcmp(k, "propertyNames") == 0 ||
               strcmp(k, "additionalItems") == 0) {
        if (json_is_array(a) || json_is_array(b))
            m->why = "items as an array";
        else
            v = allof2(a, b);
    } else if (strcmp(k, "pattern") == 0 || strcmp(k, "$gm:patterns") == 0) {
        return 0; /* gathered by merge2 */
    } else if (strcmp(k, "format") == 0) {
        if (json_equal((json_t *)a, (json_t *)b))
            v = json_incref((json_t *)a);
        else
            m->why = k;
    } else if (strcmp(k, "properties") == 0 ||
               strcmp(k, "additionalProperties") == 0 ||
               strcmp(k, "prefixItems") == 0 ||
               strcmp(k, "patternProperties") == 0) {
        return 0; /* merged together with their companions (merge2) */
    } else {
        m->why = k;
    }
    (void)pa;
    (void)pb;
    if (v == NULL && m->why == NULL)
        m->why = "out of memory";
    if (v != NULL)
        json_object_set_new(out, k, v);
    return 0;
}

/* The object keywords of a and b together: a property one side lacks
 * gets that side's additionalProperties (anything when absent). */
static void merge_object(struct mrg *m, json_t *out, const json_t *a,
                         const json_t *b)
{
    const json_t *pa = json_object_get(a, "properties");
    const json_t *pb = json_object_get(b, "properties");
    const json_t *xa = json_object_get(a, "additionalProperties");
    const json_t *xb = json_object_get(b, "additionalProperties");
    const json_t *ta = json_object_get(a, "patternProperties");
    const json_t *tb = json_object_get(b, "patternProperties");
    if ((ta != NULL && xb != NULL) || (tb != NULL && xa != NULL)) {
        m->why = "patternProperties beside another part's "
                 "additionalProperties";
        return;
    }
    if (pa != NULL || pb != NULL) {
        json_t *props = json_object();
        const char *k;
        const json_t *v;
        if (pa != NULL)
            json_object_foreach((json_t *)pa, k, v)
            {
                const json_t *w = pb != NULL ? json_object_get(pb, k) : NULL;
                json_object_set_new(props, k, allof2(v, w != NULL ? w : xb));
            }
        if (pb != NULL)
            json_object_foreach((json_t *)pb, k, v)
            {
                if (pa != NULL && json_object_get(pa, k) != NULL)
                    continue;
                json_object_set_new(props, k, allof2(xa, v));
            }
        json_object_set_new(out, "properties", props);
    }
    if (xa != NULL || xb != NULL)
        json_object_set_new(out, "additionalProperties", allof2(xa, xb));
    if (ta != NULL || tb != NULL) {
        json_t *pp = ta != NULL ? json_deep_copy(ta) : json_object();
        const char *k;
        const json_t *v;
        if (tb != NULL)
            json_object_foreach((json_t *)tb, k, v)
            {
                const json_t *w = json_object_get(pp, k);
                json_object_set_new(pp, k, allof2(w, v));
            }
        json_object_set_new(out, "patternProperties", pp);
    }
}

/* prefixItems position by position; past one side's prefix, its items. */
static void merge_prefix(struct mrg *m, json_t *out, const json_t *a,
                         const json_t *b)
{
    const json_t *pa = json_object_get(a, "prefixItems");
    const json_t *pb = json_object_get(b, "prefixItems");
    if (pa == NULL && pb == NULL)
        return;
    if (json_is_array(json_object_get(a, "items")) ||
        json_is_array(json_object_get(b, "items"))) {
        m->why = "items as an array beside prefixItems";
        return;
    }
    size_t na = json_array_size(pa), nb = json_array_size(pb);
    size_t n = na > nb ? na : nb;
    const json_t *ia = json_object_get(a, "items");
    const json_t *ib = json_object_get(b, "items");
    json_t *p = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(p, allof2(i < na ? json_array_get(pa, i) : ia,
                                        i < nb ? json_array_get(pb, i) : ib));
    json_object_set_new(out, "prefixItems", p);
}

/* a and b (objects without combinators) as one object; NULL when out of
 * memory. */
static json_t *merge2(struct mrg *m, const json_t *a, const json_t *b)
{
    json_t *out = json_object();
    if (out == NULL)
        return NULL;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)a, k, v)
    {
        if (annotation(k))
            continue;
        const json_t *w = json_object_get(b, k);
        if (w == NULL)
            json_object_set((json_t *)out, k, (json_t *)v);
        else
            merge_kw(m, out, k, v, w, a, b);
    }
    json_object_foreach((json_t *)b, k, v)
    {
        if (!annotation(k) && json_object_get(a, k) == NULL)
            json_object_set((json_t *)out, k, (json_t *)v);
    }
    /* draft-04 boolean exclusive bounds cannot be merged apart from their
     * minimum/maximum */
    if (json_is_boolean(json_object_get(a, "exclusiveMinimum")) ||
        json_is_boolean(json_object_get(b, "exclusiveMinimum")) ||
        json_is_boolean(json_object_get(a, "exclusiveMaximum")) ||
        json_is_boolean(json_object_get(b, "exclusiveMaximum")))
        if (json_object_get(a, "minimum") != NULL ||
            json_object_get(a, "maximum") != NULL)
            if (json_object_get(b, "minimum") != NULL ||
                json_object_get(b, "maximum") != NULL)
                m->why = "draft-04 boolean exclusiveMinimum/Maximum";
    /* the companions: properties with additionalProperties, prefixItems
     * with items (items itself was merged above) */
    /* patterns: every one must match; one in "pattern", the others in
     * "$gm:patterns" */
    json_t *pats = json_array();
    for (int side = 0; side < 2 && pats != NULL; side++) {
        const json_t *o = side == 0 ? a : b;
        const json_t *p1 = json_object_get(o, "pattern");
        const json_t *more = json_object_get(o, "$gm:patterns");
        if (json_is_string(p1))
            json_array_append(pats, (json_t *)p1);
        if (json_is_array(more))
            json_array_extend(pats, (json_t *)more);
    }
    json_object_del(out, "pattern");
    json_object_del(out, "$gm:patterns");
    if (pats != NULL && json_array_size(pats) > 0) {
        json_object_set(out, "pattern", json_array_get(pats, 0));
        json_array_remove(pats, 0);
        if (json_array_size(pats) > 0)
            json_object_set(out, "$gm:patterns", pats);
    }
    json_decref(pats);
    json_object_del(out, "properties");
    json_object_del(out, "additionalProperties");
    json_object_del(out, "patternProperties");
    json_object_del(out, "prefixItems");
    merge_object(m, out, a, b);
    merge_prefix(m, out, a, b);
    return out;
}

/* ---- the rewrite -------------------------------------------------------- */

struct parts {
    const json_t *plain[64]; /* objects without combinators */
    size_t n_plain;
    const json_t *comb[16]; /* {anyOf} / {oneOf} objects (as written) */
    size_t n_comb;
    int never;
};

static int32_t collect(struct gm__sc *c, const json_t *s, struct parts *p,
                       int depth);
static const json_t *merge_depth(struct gm__sc *c, const json_t *s, int depth);

/* unevaluatedProperties / unevaluatedItems see the evaluation of their
 * own schema only: a part that has them is brought to its own merged form
 * first (where they are applied), then taken as a part. */
static int32_t collect_part(struct gm__sc *c, const json_t *s, struct parts *p,
                            int depth)
{
    if (json_is_object(s) &&
        (json_object_get(s, "unevaluatedProperties") != NULL ||
         json_object_get(s, "unevaluatedItems") != NULL)) {
        const json_t *m = merge_depth(c, s, depth + 1);
        if (m == NULL)
            return c->ir->err != 0 ? c->ir->err : TG_EINTERNAL;
        return collect(c, m, p, depth + 1);
    }
    return collect(c, s, p, depth);
}

/* Adds the parts of s to p (opening allOf and $ref), depth-bounded.
 * Returns 0 or a code (recorded). */
static int32_t collect(struct gm__sc *c, const json_t *s, struct parts *p,
                       int depth)
{
    if (depth > MERGE_DEPTH)
        return gm__schema_fail(c, TG_EUNSUPPORTED,
                               "allOf/$ref nested deeper than %d levels "
                               "(a $ref cycle through allOf?)",
                               MERGE_DEPTH);
    if (json_is_true(s))
        return 0;
    if (json_is_false(s)) {
        p->never = 1;
        return 0;
    }
    if (!json_is_object(s))
        return gm__schema_fail(c, TG_EFORMAT,
                               "a schema must be an object or a boolean");
    json_t *rest = json_object();
    if (rest == NULL || gm__schema_own(c, rest) == NULL)
        return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    const char *k;
    const json_t *v;
    int32_t rc = 0;
    json_object_foreach((json_t *)s, k, v)
    {
        if (strcmp(k, "allOf") == 0) {
            if (!json_is_array(v) || json_array_size(v) == 0)
                return gm__schema_fail(c, TG_EFORMAT, "malformed \"allOf\"");
            size_t i;
            const json_t *x;
            json_array_foreach(v, i, x)
            {
                if ((rc = collect_part(c, x, p, depth + 1)) < 0)
                    return rc;
            }
        } else if (strcmp(k, "$ref") == 0) {
            if (!json_is_string(v))
                return gm__schema_fail(c, TG_EFORMAT, "malformed \"$ref\"");
            char why[320];
            const json_t *t = gm__schema_resolve(c, s, json_string_value(v),
                                                 why, sizeof why);
            if (t == NULL)
                return gm__schema_fail(c,
                                       strstr(why, "not a resource") != NULL
                                           ? TG_EUNSUPPORTED
                                           : TG_EFORMAT,
                                       "%s", why);
            if ((rc = collect_part(c, t, p, depth + 1)) < 0)
                return rc;
        } else if (strcmp(k, "if") == 0) {
            /* if/then/else: (if and then) or (not if and else) */
            const json_t *t = json_object_get(s, "then");
            const json_t *e = json_object_get(s, "else");
            if (t == NULL && e == NULL)
                continue;
            if (p->n_comb == sizeof p->comb / sizeof *p->comb)
                return gm__schema_fail(c, TG_ETOOBIG,
                                       "too many anyOf/oneOf under one allOf");
            json_t *one = json_pack(
                "{s[{s[OO]}{s[{sO}O]}]}", "anyOf", "allOf", (json_t *)v,
                t != NULL ? (json_t *)t : json_true(), "allOf", "not",
                (json_t *)v, e != NULL ? (json_t *)e : json_true());
            if (one == NULL || gm__schema_own(c, one) == NULL)
                return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
            p->comb[p->n_comb++] = one;
        } else if (strcmp(k, "then") == 0 || strcmp(k, "else") == 0) {
            continue; /* with "if" */
        } else if (strcmp(k, "anyOf") == 0 || strcmp(k, "oneOf") == 0) {
            if (p->n_comb == sizeof p->comb / sizeof *p->comb)
                return gm__schema_fail(c, TG_ETOOBIG,
                                       "too many anyOf/oneOf under one allOf");
            json_t *one = json_pack("{sO}", k, (json_t *)v);
            if (one == NULL || gm__schema_own(c, one) == NULL)
                return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
            p->comb[p->n_comb++] = one;
        } else if (!annotation(k)) {
            json_object_set(rest, k, (json_t *)v);
        }
    }
    if (json_object_size(rest) > 0) {
        if (p->n_plain == sizeof p->plain / sizeof *p->plain)
            return gm__schema_fail(c, TG_ETOOBIG,
                                   "too many parts under one allOf");
        p->plain[p->n_plain++] = rest;
    }
    return 0;
}

/* Applies M's own unevaluatedProperties / unevaluatedItems (M plain,
 * merged: its properties and items are everything its subtree evaluates):
 * as additionalProperties / items where those are absent, dropped where
 * present (nothing is left unevaluated then). */
static void apply_unevaluated(json_t *m)
{
    const json_t *up = json_object_get(m, "unevaluatedProperties");
    if (up != NULL) {
        if (json_object_get(m, "additionalProperties") == NULL)
            json_object_set(m, "additionalProperties", (json_t *)up);
        json_object_del(m, "unevaluatedProperties");
    }
    const json_t *ui = json_object_get(m, "unevaluatedItems");
    if (ui != NULL) {
        /* past a 2019-09 items array, additionalItems evaluates */
        const char *rest = json_is_array(json_object_get(m, "items"))
                               ? "additionalItems"
                               : "items";
        if (json_object_get(m, rest) == NULL)
            json_object_set(m, rest, (json_t *)ui);
        json_object_del(m, "unevaluatedItems");
    }
}

static int has_name(const json_t *arr, const char *k)
{
    size_t i;
    const json_t *x;
    json_array_foreach(arr, i,
                       x) if (json_is_string(x) &&
                              strcmp(json_string_value(x), k) == 0) return 1;
    return 0;
}

int gm__schema_not_proven(struct gm__sc *c, const json_t *s,
                          const json_t **rest)
{
    const json_t *n = json_object_get(s, "not");
    *rest = s;
    if (n == NULL)
        return 1;
    json_t *r = json_deep_copy(s);
    if (r == NULL || gm__schema_own(c, r) == NULL)
        return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    json_object_del(r, "not");
    *rest = r;
    if (json_is_false(n))
        return 1;
    if (json_is_true(n))
        return 0;
    int ex = gm__schema_exclusive(c, r, n, c->ir->deadline);
    if (ex == TG_ETIMEDOUT) {
        gm_ir_late(c->ir);
        return c->ir->err;
    }
    return ex ? 1 : 0;
}

static const json_t *merge_depth(struct gm__sc *c, const json_t *s, int depth)
{
    struct parts p;
    memset(&p, 0, sizeof p);
    if (collect(c, s, &p, depth) < 0)
        return NULL;
    if (p.never)
        return json_false();
    struct mrg m = {.c = c};
    json_t *acc = json_object();
    if (acc == NULL || gm__schema_own(c, acc) == NULL) {
        gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
        return NULL;
    }
    json_t *cur = acc;
    for (size_t i = 0; i < p.n_plain; i++) {
        json_t *next = merge2(&m, cur, p.plain[i]);
        if (next == NULL || gm__schema_own(c, next) == NULL) {
            gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
            return NULL;
        }
        cur = next;
        if (m.why != NULL) {
            gm__schema_fail(c, TG_EUNSUPPORTED,
                            "allOf: \"%s\" in two parts cannot be merged "
                            "into one schema",
                            m.why);
            return NULL;
        }
    }
    if (m.never)
        return json_false();
    /* dependencies: a required trigger applies them; an optional one is
     * never generated (properties[a] = false), a subset of the valid */
    const json_t *dr = json_object_get(cur, "dependentRequired");
    const json_t *ds = json_object_get(cur, "dependentSchemas");
    if (dr != NULL || ds != NULL) {
        json_t *req = json_object_get(cur, "required");
        json_t *props = json_object_get(cur, "properties");
        json_t *extra = json_array(); /* dependent schemas that apply */
        if (extra == NULL || gm__schema_own(c, extra) == NULL) {
            gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
            return NULL;
        }
        for (int pass = 0; pass < 2; pass++) {
            const json_t *map = pass == 0 ? dr : ds;
            const char *k;
            const json_t *v;
            if (!json_is_object(map))
                continue;
            json_object_foreach((json_t *)map, k, v)
            {
                if (req != NULL && has_name(req, k)) {
                    if (pass == 0) {
                        size_t i;
                        const json_t *x;
                        json_array_foreach(v, i, x)
                        {
                            if (json_is_string(x) &&
                                !has_name(req, json_string_value(x)))
                                json_array_append(req, (json_t *)x);
                        }
                    } else {
                        json_array_append(extra, (json_t *)v);
                    }
                } else {
                    if (props == NULL) {
                        props = json_object();
                        json_object_set_new(cur, "properties", props);
                    }
                    json_object_set_new(props, k, json_false());
                }
            }
        }
        json_object_del(cur, "dependentRequired");
        json_object_del(cur, "dependentSchemas");
        if (json_array_size(extra) > 0 || p.n_comb > 0) {
            /* merge again with the schemas that apply (and the
             * combinators, which go along) */
            json_t *all = json_array();
            json_array_append(all, cur);
            json_array_extend(all, extra);
            for (size_t k = 0; k < p.n_comb; k++)
                json_array_append(all, (json_t *)p.comb[k]);
            const json_t *again = gm__schema_own(
                c, json_pack("{so}", "allOf", all));
            if (again == NULL) {
                gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
                return NULL;
            }
            if (json_array_size(extra) > 0 || p.n_comb > 0)
                return merge_depth(c, again, depth + 1);
        }
    }
    if (p.n_comb == 0) {
        apply_unevaluated(cur);
        return cur;
    }
    /* distribute the first anyOf/oneOf over the rest; the others stay in
     * each branch's allOf and are opened when it is merged */
    const json_t *first = p.comb[0];
    int one = json_object_get(first, "oneOf") != NULL;
    const json_t *alts = json_object_get(first, one ? "oneOf" : "anyOf");
    if (!json_is_array(alts) || json_array_size(alts) == 0) {
        gm__schema_fail(c, TG_EFORMAT, "malformed \"%s\"",
                        one ? "oneOf" : "anyOf");
        return NULL;
    }
    size_t n = json_array_size(alts);
    if (one) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                if (i == j)
                    continue;
                int ex = gm__schema_exclusive(c, json_array_get(alts, i),
                                              json_array_get(alts, j),
                                              c->ir->deadline);
                if (ex == TG_ETIMEDOUT) {
                    gm_ir_late(c->ir);
                    return NULL;
                }
                if (!ex) {
                    gm__schema_fail(c, TG_EUNSUPPORTED,
                                    "\"oneOf\" alternatives %zu and %zu may "
                                    "both hold (exclusive ones differ in type, "
                                    "const/enum or a required property; use "
                                    "\"anyOf\" for overlap)",
                                    i, j);
                    return NULL;
                }
            }
    }
    json_t *out = json_array();
    const json_t *res = gm__schema_own(c, json_pack("{so}", "anyOf", out));
    if (res == NULL) {
        gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *parts = json_array();
        json_array_append(parts, cur);
        json_array_append(parts, json_array_get(alts, i));
        for (size_t k = 1; k < p.n_comb; k++)
            json_array_append(parts, (json_t *)p.comb[k]);
        const json_t *branch = gm__schema_own(
            c, json_pack("{so}", "allOf", parts));
        if (branch == NULL) {
            gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
            return NULL;
        }
        /* the branch's own form now: a branch whose "not" cannot be
         * proven away (if/then/else's else) is left out, a subset */
        const json_t *bm = merge_depth(c, branch, depth + 1);
        if (bm == NULL)
            return NULL;
        if (json_is_false(bm))
            continue;
        const json_t *rest;
        int ok = json_is_object(bm) ? gm__schema_not_proven(c, bm, &rest) : 1;
        if (ok < 0)
            return NULL;
        if (ok)
            json_array_append(out, (json_t *)bm);
    }
    if (json_array_size(out) == 0) {
        gm__schema_fail(c, TG_EUNSUPPORTED,
                        "no alternative can be generated: each has a \"not\" "
                        "(or the \"else\" of an \"if\") that could not be "
                        "proven to exclude the rest of its schema");
        return NULL;
    }
    return res;
}

const json_t *gm__schema_merge(struct gm__sc *c, const json_t *s)
{
    return merge_depth(c, s, 0);
}
