/* gm_schema_excl.c — local $ref resolution, JSON Schema equality and the
 * proof that oneOf alternatives are exclusive (gm_schema_internal.h).
 *
 * oneOf is generated as alternation, so a document generated from one
 * alternative must fail every other one, or it would fail the oneOf. The
 * test here is "every document generated from a is invalid against b":
 * `gen` below is what the compiler generates (types inferred from
 * keywords, only listed properties), `val` what validation accepts
 * (anything a keyword does not forbid). It answers 1 only with a proof. */
#include "common/grammar/gm_schema_internal.h"
#include "common/grammar/gm_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 24 /* nested proofs and $ref hops before giving up */

unsigned gm__schema_type_bits(const char *name)
{
    static const struct {
        const char *name;
        unsigned bits;
    } names[] = {
        {"object", GM__T_OBJECT},
        {"array", GM__T_ARRAY},
        {"string", GM__T_STRING},
        {"integer", GM__T_INT},
        {"number", GM__T_INT | GM__T_FRAC},
        {"boolean", GM__T_BOOL},
        {"null", GM__T_NULL},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i].name) == 0)
            return names[i].bits;
    return 0;
}

unsigned gm__schema_type_of(const json_t *type)
{
    if (json_is_string(type))
        return gm__schema_type_bits(json_string_value(type));
    if (!json_is_array(type) || json_array_size(type) == 0)
        return 0;
    unsigned bits = 0;
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t)
    {
        unsigned b = json_is_string(t) ? gm__schema_type_bits(json_string_value(t))
                                       : 0;
        if (b == 0)
            return 0;
        bits |= b;
    }
    return bits;
}

unsigned gm__schema_value_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return GM__T_OBJECT;
    case JSON_ARRAY:
        return GM__T_ARRAY;
    case JSON_STRING:
        return GM__T_STRING;
    case JSON_INTEGER:
        return GM__T_INT;
    case JSON_REAL: {
        double d = json_real_value(v);
        return isfinite(d) && floor(d) == d ? GM__T_INT : GM__T_FRAC;
    }
    case JSON_TRUE:
    case JSON_FALSE:
        return GM__T_BOOL;
    case JSON_NULL:
        return GM__T_NULL;
    }
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

const json_t *gm__schema_pointer(const json_t *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const char *p = ref + 1;
    if (*p == '\0')
        return root;
    if (*p != '/')
        return NULL;
    const json_t *cur = root;
    size_t cap = strlen(p) + 1;
    char *tok = malloc(cap);
    if (tok == NULL)
        return NULL;
    while (*p == '/' && cur != NULL) {
        p++;
        /* the URI fragment's percent-decoding first (RFC 3986), then the
         * pointer's ~1 and ~0 (RFC 6901), in that order */
        size_t n = 0;
        while (*p != '\0' && *p != '/') {
            int c = (unsigned char)*p++;
            if (c == '%' && hexval(p[0]) >= 0 && hexval(p[1]) >= 0) {
                c = hexval(p[0]) * 16 + hexval(p[1]);
                p += 2;
            }
            tok[n++] = (char)c;
        }
        size_t w = 0;
        for (size_t r = 0; r < n; r++) {
            if (tok[r] == '~' && r + 1 < n &&
                (tok[r + 1] == '0' || tok[r + 1] == '1')) {
                tok[w++] = tok[r + 1] == '0' ? '~' : '/';
                r++;
            } else {
                tok[w++] = tok[r];
            }
        }
        n = w;
        tok[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_getn(cur, tok, n);
        } else if (json_is_array(cur)) {
            char *end;
            if (n == 0 || (n > 1 && tok[0] == '0') || tok[0] < '0' ||
                tok[0] > '9') {
                cur = NULL;
                break;
            }
            unsigned long long k = strtoull(tok, &end, 10);
            cur = *end == '\0' && k < json_array_size(cur)
                      ? json_array_get(cur, (size_t)k)
                      : NULL;
        } else {
            cur = NULL;
        }
    }
    free(tok);
    return *p == '\0' ? cur : NULL;
}

int gm__schema_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b))
        return 0;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!gm__schema_equal(json_array_get(a, i), json_array_get(b, i)))
                return 0;
        return 1;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b))
            return 0;
        const char *k;
        size_t kl;
        json_t *v;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)a, tmp, k, kl, v)
        {
            const json_t *w = json_object_getn(b, k, kl);
            if (w == NULL || !gm__schema_equal(v, w))
                return 0;
        }
        return 1;
    }
    return json_equal(a, b);
}

/* Follows $ref hops (a schema whose only assertion is $ref). */
static const json_t *resolve(const struct gm__sc *c, const json_t *s)
{
    char why[256];
    for (int hop = 0; hop < MAX_DEPTH && json_is_object(s); hop++) {
        const json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r))
            return s;
        s = gm__schema_resolve(c, s, json_string_value(r), why, sizeof why);
    }
    return json_is_object(s) || json_is_boolean(s) ? s : NULL;
}

static const json_t *branches(const json_t *s)
{
    const json_t *b = json_object_get(s, "anyOf");
    if (b == NULL)
        b = json_object_get(s, "oneOf");
    return json_is_array(b) ? b : NULL;
}

static int has_any(const json_t *s, const char *const *kws)
{
    for (; *kws != NULL; kws++)
        if (json_object_get(s, *kws) != NULL)
            return 1;
    return 0;
}

static const char *const obj_kws[] = {"properties", "required",
                                      "additionalProperties", NULL};
static const char *const arr_kws[] = {"items", "minItems", "maxItems", NULL};
static const char *const str_kws[] = {"minLength", "maxLength", NULL};

/* The enum/const values of s as one array (new reference), or NULL. */
static json_t *values(const json_t *s)
{
    const json_t *c = json_object_get(s, "const");
    if (c != NULL)
        return json_pack("[O]", c);
    const json_t *e = json_object_get(s, "enum");
    return json_is_array(e) ? json_incref((json_t *)e) : NULL;
}

/* Types generated from a (resolved, no anyOf / enum). */
static unsigned gen_types(const json_t *a)
{
    if (json_is_boolean(a))
        return json_is_true(a) ? GM__T_ALL : 0;
    const json_t *t = json_object_get(a, "type");
    if (t != NULL)
        return gm__schema_type_of(t);
    unsigned bits = 0;
    if (has_any(a, obj_kws))
        bits |= GM__T_OBJECT;
    if (has_any(a, arr_kws))
        bits |= GM__T_ARRAY;
    if (has_any(a, str_kws))
        bits |= GM__T_STRING;
    return bits != 0 ? bits : GM__T_ALL;
}

/* Types validation admits by b's own "type" (resolved, no anyOf / enum). */
static unsigned val_types(const json_t *b)
{
    if (json_is_boolean(b))
        return json_is_true(b) ? GM__T_ALL : 0;
    const json_t *t = json_object_get(b, "type");
    return t != NULL ? gm__schema_type_of(t) : GM__T_ALL;
}

static int64_t count_kw(const json_t *s, const char *kw, int64_t dflt)
{
    const json_t *v = json_object_get(s, kw);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

static size_t code_points(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            k++;
    return k;
}

static int in_list(const json_t *arr, const char *k, size_t kl)
{
    size_t i;
    const json_t *v;
    json_array_foreach(arr, i, v)
    {
        if (json_is_string(v) && json_string_length(v) == kl &&
            memcmp(json_string_value(v), k, kl) == 0)
            return 1;
    }
    return 0;
}

/* A proof's context: the document, and its deadline (CLOCK_MONOTONIC
 * seconds, 0: none), read every 256 steps; once past it every step
 * answers "not proven" and the caller reports the time-out. */
struct excl {
    const struct gm__sc *root;
    double deadline;
    unsigned ticks;
    int late;
};

static int late(struct excl *x)
{
    if (!x->late && x->deadline > 0 && (++x->ticks & 255) == 0 &&
        gm__now() > x->deadline)
        x->late = 1;
    return x->late;
}

/* 1 when the instance v is certainly invalid against b. */
static int value_excl(struct excl *cx, const json_t *b, const json_t *v,
                      int depth)
{
    const struct gm__sc *root = cx->root;
    if (late(cx))
        return 0;
    if (depth > MAX_DEPTH || (b = resolve(root, b)) == NULL)
        return 0;
    if (json_is_boolean(b))
        return json_is_false(b);
    const json_t *br = branches(b);
    if (br != NULL) {
        size_t i;
        const json_t *x;
        json_array_foreach(br, i, x)
        {
            if (!value_excl(cx, x, v, depth + 1))
                return 0;
        }
        return 1;
    }
    const json_t *c = json_object_get(b, "const");
    if (c != NULL && !gm__schema_equal(c, v))
        return 1;
    const json_t *e = json_object_get(b, "enum");
    if (json_is_array(e)) {
        int found = 0;
        size_t i;
        const json_t *y;
        json_array_foreach(e, i, y)
        {
            if (late(cx))
                return 0;
            found |= gm__schema_equal(y, v);
        }
        if (!found)
            return 1;
    }
    if ((val_types(b) & gm__schema_value_type(v)) == 0)
        return 1;
    if (json_is_object(v)) {
        const json_t *req = json_object_get(b, "required");
        const json_t *props = json_object_get(b, "properties");
        const json_t *addl = json_object_get(b, "additionalProperties");
        size_t i;
        const json_t *x;
        if (json_is_array(req))
            json_array_foreach(req, i, x)
            {
                if (json_is_string(x) &&
                    json_object_getn(v, json_string_value(x),
                                     json_string_length(x)) == NULL)
                    return 1;
            }
        const char *k;
        size_t kl;
        json_t *w;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)v, tmp, k, kl, w)
        {
            const json_t *ps =
                json_is_object(props) ? json_object_getn(props, k, kl) : NULL;
            if (ps != NULL) {
                if (value_excl(cx, ps, w, depth + 1))
                    return 1;
            } else if (json_is_false(addl)) {
                return 1;
            }
        }
    }
    if (json_is_string(v)) {
        int64_t n = (int64_t)code_points(json_string_value(v),
                                         json_string_length(v));
        if (n < count_kw(b, "minLength", 0) ||
            n > count_kw(b, "maxLength", INT64_MAX))
            return 1;
    }
    if (json_is_array(v)) {
        int64_t n = (int64_t)json_array_size(v);
        if (n < count_kw(b, "minItems", 0) ||
            n > count_kw(b, "maxItems", INT64_MAX))
            return 1;
        const json_t *items = json_object_get(b, "items");
        if (items != NULL) {
            size_t i;
            const json_t *x;
            json_array_foreach(v, i, x)
            {
                if (value_excl(cx, items, x, depth + 1))
                    return 1;
            }
        }
    }
    return 0;
}

static int gen_excl(struct excl *cx, const json_t *a, const json_t *b,
                    int depth);

/* Objects generated from a (typed object) against b's object keywords. */
static int object_excl(struct excl *cx, const json_t *a, const json_t *b,
                       int depth)
{
    const json_t *ap = json_object_get(a, "properties");
    const json_t *ar = json_object_get(a, "required");
    const json_t *aa = json_object_get(a, "additionalProperties");
    const json_t *bp = json_object_get(b, "properties");
    const json_t *br = json_object_get(b, "required");
    const json_t *ba = json_object_get(b, "additionalProperties");
    if (ap == NULL && ar == NULL && !json_is_false(aa))
        return 0; /* a is any object */
    size_t i;
    const json_t *x;
    if (json_is_array(ar))
        json_array_foreach(ar, i, x)
        {
            if (!json_is_string(x))
                continue;
            const char *k = json_string_value(x);
            size_t kl = json_string_length(x);
            const json_t *bs =
                json_is_object(bp) ? json_object_getn(bp, k, kl) : NULL;
            if (bs == NULL) {
                if (json_is_false(ba))
                    return 1;
                continue;
            }
            const json_t *as =
                json_is_object(ap) ? json_object_getn(ap, k, kl) : NULL;
            if (gen_excl(cx, as != NULL ? as : json_true(), bs, depth + 1))
                return 1;
        }
    if (json_is_array(br))
        json_array_foreach(br, i, x)
        {
            if (!json_is_string(x))
                continue;
            const char *k = json_string_value(x);
            size_t kl = json_string_length(x);
            if ((!json_is_object(ap) || json_object_getn(ap, k, kl) == NULL) &&
                !(json_is_array(ar) && in_list(ar, k, kl)))
                return 1; /* a never generates a property b requires */
        }
    return 0;
}

/* 1 when ranges [alo, ahi] and [blo, bhi] do not meet. */
static int apart(int64_t alo, int64_t ahi, int64_t blo, int64_t bhi)
{
    return ahi < blo || bhi < alo;
}

static int gen_excl(struct excl *cx, const json_t *a, const json_t *b,
                    int depth)
{
    const struct gm__sc *root = cx->root;
    if (late(cx))
        return 0;
    if (depth > MAX_DEPTH)
        return 0;
    a = resolve(root, a);
    b = resolve(root, b);
    if (a == NULL || b == NULL)
        return 0;
    if (json_is_false(a) || json_is_false(b))
        return 1;
    if (json_is_true(b))
        return 0;
    const json_t *x;
    size_t i;
    const json_t *abr = json_is_object(a) ? branches(a) : NULL;
    if (abr != NULL) {
        json_array_foreach(abr, i, x)
        {
            if (!gen_excl(cx, x, b, depth + 1))
                return 0;
        }
        return 1;
    }
    const json_t *bbr = branches(b);
    if (bbr != NULL) {
        json_array_foreach(bbr, i, x)
        {
            if (!gen_excl(cx, a, x, depth + 1))
                return 0;
        }
        return 1;
    }
    json_t *av = json_is_object(a) ? values(a) : NULL;
    if (av != NULL) {
        const json_t *t = json_object_get(a, "type");
        unsigned keep = t != NULL ? gm__schema_type_of(t) : GM__T_ALL;
        int all = 1;
        json_array_foreach(av, i, x)
        {
            if ((gm__schema_value_type(x) & keep) != 0 &&
                !value_excl(cx, b, x, depth + 1)) {
                all = 0;
                break;
            }
        }
        json_decref(av);
        return all;
    }
    unsigned ga = gen_types(a);
    unsigned vb = val_types(b);
    json_t *bv = values(b);
    if (bv != NULL) {
        unsigned t = 0;
        json_array_foreach(bv, i, x) t |= gm__schema_value_type(x);
        json_decref(bv);
        vb &= t;
    }
    unsigned ov = ga & vb;
    if (ov == 0)
        return 1;
    if (ov == GM__T_OBJECT)
        return object_excl(cx, a, b, depth);
    if (ov == GM__T_STRING)
        return apart(count_kw(a, "minLength", 0),
                     count_kw(a, "maxLength", INT64_MAX),
                     count_kw(b, "minLength", 0),
                     count_kw(b, "maxLength", INT64_MAX));
    if (ov == GM__T_ARRAY) {
        if (apart(count_kw(a, "minItems", 0), count_kw(a, "maxItems", INT64_MAX),
                  count_kw(b, "minItems", 0), count_kw(b, "maxItems", INT64_MAX)))
            return 1;
        const json_t *ai = json_object_get(a, "items");
        const json_t *bi = json_object_get(b, "items");
        return count_kw(a, "minItems", 0) >= 1 && bi != NULL &&
               gen_excl(cx, ai != NULL ? ai : json_true(), bi, depth + 1);
    }
    return 0;
}

int gm__schema_exclusive(const struct gm__sc *root, const json_t *a,
                         const json_t *b, double deadline)
{
    struct excl cx = {.root = root, .deadline = deadline};
    int r = gen_excl(&cx, a, b, 0);
    return cx.late ? TG_ETIMEDOUT : r;
}
