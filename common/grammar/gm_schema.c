/* gm_schema.c — the JSON Schema subset compiled into grammar IR
 * (gm_schema.h). Every schema object becomes one rule (memoized by its
 * address, so a $ref target is compiled once and recursion is a rule
 * calling itself). */
#include "common/grammar/gm_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_format.h"
#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_schema_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/base/tg_hmap.h"

enum kw {
    KW_ANNOT = 0, /* ignored */
    KW_DEFS,      /* $defs / definitions: containers, ignored here */
    KW_TYPE,
    KW_OBJECT,
    KW_ARRAY,
    KW_STRING,
    KW_NUMBER,
    KW_ENUM,
    KW_COMB,
    KW_REF,
    KW_COUNT
};

static const struct {
    const char *name;
    enum kw kind;
} keywords[] = {
    {"title", KW_ANNOT},
    {"description", KW_ANNOT},
    {"default", KW_ANNOT},
    {"examples", KW_ANNOT},
    {"$comment", KW_ANNOT},
    {"$schema", KW_ANNOT},
    {"$id", KW_ANNOT},
    {"$anchor", KW_ANNOT},
    {"$dynamicAnchor", KW_ANNOT},
    {"$recursiveAnchor", KW_ANNOT},
    {"$vocabulary", KW_ANNOT},
    {"contentMediaType", KW_ANNOT},
    {"contentEncoding", KW_ANNOT},
    {"contentSchema", KW_ANNOT},
    {"deprecated", KW_ANNOT},
    {"readOnly", KW_ANNOT},
    {"writeOnly", KW_ANNOT},
    {"discriminator", KW_ANNOT},
    {"$defs", KW_DEFS},
    {"definitions", KW_DEFS},
    {"type", KW_TYPE},
    {"properties", KW_OBJECT},
    {"required", KW_OBJECT},
    {"additionalProperties", KW_OBJECT},
    {"minProperties", KW_OBJECT},
    {"maxProperties", KW_OBJECT},
    {"propertyNames", KW_OBJECT},
    {"patternProperties", KW_OBJECT},
    {"items", KW_ARRAY},
    {"prefixItems", KW_ARRAY},
    {"additionalItems", KW_ARRAY},
    {"minItems", KW_ARRAY},
    {"maxItems", KW_ARRAY},
    {"contains", KW_ARRAY},
    {"minContains", KW_ARRAY},
    {"maxContains", KW_ARRAY},
    {"uniqueItems", KW_ARRAY},
    {"minLength", KW_STRING},
    {"maxLength", KW_STRING},
    {"pattern", KW_STRING},
    {"$gm:patterns", KW_STRING},
    {"format", KW_ANNOT},
    {"minimum", KW_NUMBER},
    {"maximum", KW_NUMBER},
    {"exclusiveMinimum", KW_NUMBER},
    {"exclusiveMaximum", KW_NUMBER},
    {"multipleOf", KW_NUMBER},
    {"enum", KW_ENUM},
    {"const", KW_ENUM},
    {"anyOf", KW_COMB},
    {"oneOf", KW_COMB},
    {"allOf", KW_COMB},
    {"not", KW_COMB},
    {"if", KW_COMB},
    {"then", KW_COMB},
    {"else", KW_COMB},
    {"unevaluatedProperties", KW_COMB},
    {"unevaluatedItems", KW_COMB},
    {"dependentRequired", KW_COMB},
    {"dependentSchemas", KW_COMB},
    {"$ref", KW_REF},
};

void gm_schema_opts_default(struct gm_schema_opts *o)
{
    o->max_depth = GM_SCHEMA_MAX_DEPTH;
    o->max_count = GM_SCHEMA_MAX_COUNT;
}

/* "#" + the current pointer. */
static const char *where(struct gm__sc *c)
{
    return c->path;
}

int32_t gm__schema_fail(struct gm__sc *c, int code, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gm_ir_fail(c->ir, code, "%s at %s", msg, where(c));
}

/* Appends "/seg" (escaped as a JSON pointer) and returns the old length
 * for path_pop. A pointer too long for the buffer ends in "...". */
size_t gm__schema_path_push(struct gm__sc *c, const char *seg, size_t n)
{
    size_t old = c->plen;
    size_t cap = sizeof c->path - 4;
    if (c->plen >= cap)
        return old;
    c->path[c->plen++] = '/';
    for (size_t i = 0; i < n && c->plen < cap; i++) {
        char ch = seg[i];
        if (ch == '~' || ch == '/') {
            c->path[c->plen++] = '~';
            ch = ch == '~' ? '0' : '1';
        }
        if (c->plen < cap)
            c->path[c->plen++] = ch;
    }
    if (c->plen >= cap)
        memcpy(c->path + cap, "...", 4), c->plen = cap + 3;
    c->path[c->plen] = '\0';
    return old;
}

size_t gm__schema_path_index(struct gm__sc *c, size_t i)
{
    char tmp[24];
    int k = snprintf(tmp, sizeof tmp, "%zu", i);
    return gm__schema_path_push(c, tmp, (size_t)k);
}

void gm__schema_path_pop(struct gm__sc *c, size_t old)
{
    c->plen = old;
    c->path[old] = '\0';
}

/* ---- memo: schema address -> rule ------------------------------------ */

static uint64_t memo_hash(const json_t *s)
{
    return tg_hash_u64((uint64_t)(uintptr_t)s);
}

static inline int memo_probe(const void *slot, const void *key)
{
    const json_t *s = ((const struct gm__memo *)slot)->s;
    return s == key ? TG_HMAP_HIT : s == NULL ? TG_HMAP_EMPTY : TG_HMAP_MISS;
}

static int memo_empty(const void *slot)
{
    return ((const struct gm__memo *)slot)->s == NULL;
}

static uint64_t memo_slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return memo_hash(((const struct gm__memo *)slot)->s);
}

static const struct tg_hmap_type memo_type = {
    .esize = sizeof(struct gm__memo),
    .empty_byte = 0,
    .probe = memo_probe,
    .is_empty = memo_empty,
    .hash = memo_slot_hash,
};

static int32_t memo_get(const struct gm__sc *c, const json_t *s)
{
    const struct gm__memo *m = tg_hmap_find(&c->memo, &memo_type, memo_hash(s), s);
    return m != NULL ? m->rule : -1;
}

static int memo_put(struct gm__sc *c, const json_t *s, int32_t rule)
{
    struct gm__memo *m = tg_hmap_put(&c->memo, &memo_type, memo_hash(s), s, NULL);
    if (m == NULL)
        return TG_ENOMEM;
    m->s = s;
    m->rule = rule;
    return 0;
}

/* ---- keywords ---------------------------------------------------------- */

struct kws {
    int has[KW_COUNT];
    const char *first[KW_COUNT]; /* first keyword of each kind */
};

static int kw_kind(const char *k, size_t kl)
{
    for (size_t i = 0; i < sizeof keywords / sizeof *keywords; i++)
        if (strlen(keywords[i].name) == kl &&
            memcmp(keywords[i].name, k, kl) == 0)
            return (int)keywords[i].kind;
    if (kl >= 2 && k[0] == 'x' && k[1] == '-')
        return KW_ANNOT;
    return -1;
}

/* A count keyword's value: a non-negative integer, also written as a
 * number with a zero fraction ("maxLength": 2.0 is valid JSON Schema). */
static int is_count(const json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) >= 0;
    double d = json_is_real(v) ? json_real_value(v) : -1;
    return d >= 0 && d == floor(d) && d <= 9.0e18;
}

static json_int_t count_of(const json_t *v)
{
    return json_is_integer(v) ? json_integer_value(v)
                              : (json_int_t)json_real_value(v);
}

/* Checks every keyword of s: known, and of the right JSON type. */
static int scan(struct gm__sc *c, const json_t *s, struct kws *k)
{
    memset(k, 0, sizeof(*k));
    const char *key;
    size_t kl;
    json_t *v;
    void *tmp;
    json_object_keylen_foreach_safe((json_t *)s, tmp, key, kl, v)
    {
        int kind = kw_kind(key, kl);
        if (kind < 0)
            return gm__schema_fail(c, TG_EUNSUPPORTED,
                                   "unsupported keyword \"%.*s\"",
                                   (int)(kl > 64 ? 64 : kl), key);
        k->has[kind] = 1;
        if (k->first[kind] == NULL)
            k->first[kind] = key;
        int ok = 1;
        if (strcmp(key, "type") == 0)
            ok = gm__schema_type_of(v) != 0;
        else if (strcmp(key, "properties") == 0 ||
                 strcmp(key, "$defs") == 0 ||
                 strcmp(key, "definitions") == 0)
            ok = json_is_object(v);
        else if (strcmp(key, "required") == 0) {
            ok = json_is_array(v);
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) ok &= json_is_string(x);
        } else if (strcmp(key, "additionalProperties") == 0 ||
                   strcmp(key, "propertyNames") == 0) {
            ok = json_is_boolean(v) || json_is_object(v);
        } else if (strcmp(key, "patternProperties") == 0) {
            ok = json_is_object(v);
        } else if (strcmp(key, "minProperties") == 0 ||
                   strcmp(key, "maxProperties") == 0) {
            ok = is_count(v);
        } else if (strcmp(key, "items") == 0) {
            ok = json_is_object(v) || json_is_boolean(v) || json_is_array(v);
        } else if (strcmp(key, "prefixItems") == 0) {
            ok = json_is_array(v);
        } else if (strcmp(key, "additionalItems") == 0 ||
                   strcmp(key, "contains") == 0) {
            ok = json_is_object(v) || json_is_boolean(v);
        } else if (strcmp(key, "uniqueItems") == 0) {
            ok = json_is_boolean(v);
        } else if (strcmp(key, "minContains") == 0 ||
                   strcmp(key, "maxContains") == 0) {
            ok = is_count(v);
        } else if (strcmp(key, "minItems") == 0 ||
                   strcmp(key, "maxItems") == 0 ||
                   strcmp(key, "minLength") == 0 ||
                   strcmp(key, "maxLength") == 0)
            ok = is_count(v);
        else if (strcmp(key, "enum") == 0)
            ok = json_is_array(v);
        else if (strcmp(key, "anyOf") == 0 || strcmp(key, "oneOf") == 0 ||
                 strcmp(key, "allOf") == 0)
            ok = json_is_array(v) && json_array_size(v) > 0;
        else if (strcmp(key, "pattern") == 0 || strcmp(key, "format") == 0)
            ok = json_is_string(v);
        else if (strcmp(key, "$gm:patterns") == 0)
            ok = json_is_array(v);
        else if (strcmp(key, "$ref") == 0)
            ok = json_is_string(v);
        if (!ok)
            return gm__schema_fail(c, TG_EFORMAT, "malformed \"%s\"", key);
    }
    return 0;
}

/* The first keyword of s that is neither an annotation nor one of the
 * kinds in `allowed` (a bit per enum kw), or NULL. */
static const char *other_kw(const struct kws *k, unsigned allowed)
{
    allowed |= 1u << KW_ANNOT | 1u << KW_DEFS;
    for (int i = 0; i < KW_COUNT; i++)
        if (k->has[i] && !(allowed & (1u << i)))
            return k->first[i];
    return NULL;
}

/* ---- pieces ------------------------------------------------------------ */


/* A rule with no alternative: no document. */
static int32_t never(struct gm__sc *c)
{
    if (c->never < 0) {
        int32_t r = gm_ir_rule(c->ir, "never");
        int rc = gm_ir_rule_define(c->ir, r, gm_ir_alt(c->ir, NULL, 0));
        c->never = rc != 0 ? rc : r;
    }
    return c->never;
}

struct text {
    char *s;
    size_t n, cap;
    int oom;
};

static void text_put(struct text *t, const char *p, size_t k)
{
    if (t->oom || tg_grow((void **)&t->s, &t->cap, t->n + k + 1, 1) != 0) {
        t->oom = 1;
        return;
    }
    memcpy(t->s + t->n, p, k);
    t->n += k;
    t->s[t->n] = '\0';
}

/* Appends the compact JSON text of v: reals as the shortest text that
 * reads back as the same double (3.14, not jansson's 17 digits
 * 3.1400000000000001, which a model should not have to write), the rest
 * as jansson writes it. */
static void text_of(const json_t *v, struct text *t)
{
    if (json_is_real(v)) {
        char num[48];
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 1e17) {
            snprintf(num, sizeof num, "%.0f", d); /* 1e3 as 1000 */
        } else {
            for (int p = 1; p <= 17; p++) {
                snprintf(num, sizeof num, "%.*g", p, d);
                if (strtod(num, NULL) == d)
                    break;
            }
            /* "2.5e-07" as "2.5e-7", "1e+300" as "1e300" */
            char *e = strchr(num, 'e');
            if (e != NULL) {
                char *q = e + 1, *w = e + 1;
                if (*q == '+')
                    q++;
                else if (*q == '-')
                    *w++ = *q++;
                while (*q == '0' && q[1] != '\0')
                    q++;
                memmove(w, q, strlen(q) + 1);
            }
        }
        text_put(t, num, strlen(num));
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        text_put(t, "[", 1);
        json_array_foreach(v, i, x)
        {
            if (i > 0)
                text_put(t, ",", 1);
            text_of(x, t);
        }
        text_put(t, "]", 1);
    } else if (json_is_object(v)) {
        const char *key;
        size_t kl, i = 0;
        json_t *x;
        void *tmp;
        text_put(t, "{", 1);
        json_object_keylen_foreach_safe((json_t *)v, tmp, key, kl, x)
        {
            if (i++ > 0)
                text_put(t, ",", 1);
            json_t *k = json_stringn(key, kl);
            if (k == NULL)
                t->oom = 1;
            text_of(k, t);
            json_decref(k);
            text_put(t, ":", 1);
            text_of(x, t);
        }
        text_put(t, "}", 1);
    } else if (v != NULL) {
        char *p = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (p == NULL)
            t->oom = 1;
        else
            text_put(t, p, strlen(p));
        free(p);
    }
}

/* The compact JSON text of v (new, free it), or NULL. */
static char *compact(const json_t *v)
{
    struct text t = {0};
    text_of(v, &t);
    if (t.oom || t.s == NULL) {
        free(t.s);
        return NULL;
    }
    return t.s;
}

static int value_in_types(const json_t *v, unsigned types)
{
    return (gm__schema_value_type(v) & types) != 0;
}

/* A pattern error of gm_regex as the schema's failure (the IR's own
 * failures are recorded already). */
static int32_t regex_fail(struct gm__sc *c, int32_t rc, const char *err)
{
    if (c->ir->err != 0)
        return c->ir->err;
    return gm__schema_fail(c, rc, "%s", err);
}

/* Whether string value v satisfies s's string keywords (lengths,
 * pattern, format): 1, 0, or a code. */
static int string_value_ok(struct gm__sc *c, const json_t *s, const json_t *v)
{
    uint32_t lo, hi;
    int32_t rc = gm__schema_counts(c, s, "minLength", "maxLength", &lo, &hi);
    if (rc < 0)
        return rc;
    struct gm_rx_item it[GM__SCHEMA_RX_MAX];
    size_t n = 0;
    if ((rc = gm__schema_string_items(c, s, it, GM__SCHEMA_RX_MAX, &n)) < 0)
        return rc;
    char err[384];
    int r = gm_regex_test(it, n, lo, hi == GM_REPEAT_INF ? GM_REPEAT_INF : hi,
                          json_string_value(v), json_string_length(v), err,
                          sizeof err);
    return r < 0 ? regex_fail(c, r, err) : r;
}

static int32_t enum_expr(struct gm__sc *c, const json_t *s, const struct kws *k)
{
    const char *o = other_kw(k,
                             1u << KW_ENUM | 1u << KW_TYPE | 1u << KW_STRING);
    if (o != NULL)
        return gm__schema_fail(
            c, TG_EUNSUPPORTED, "\"%s\" alongside \"%s\" is not supported",
            json_object_get(s, "const") ? "const" : "enum", o);
    const json_t *type = json_object_get(s, "type");
    unsigned types = type != NULL ? gm__schema_type_of(type) : GM__T_ALL;
    const json_t *cv = json_object_get(s, "const");
    const json_t *ev = json_object_get(s, "enum");
    json_t *vals = json_array();
    if (vals == NULL)
        return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    size_t i;
    const json_t *x;
    if (cv != NULL) {
        int in = ev == NULL;
        if (ev != NULL)
            json_array_foreach(ev, i, x) in |= gm__schema_equal(x, cv);
        if (in)
            json_array_append(vals, (json_t *)cv);
    } else {
        /* Values equal as JSON Schema compares them but written apart
         * (1 and 1.0, keys in another order) both stay: each text is a
         * valid way to write the value. Equal texts count once in the
         * trie. */
        json_array_foreach(ev, i, x) json_array_append(vals, (json_t *)x);
    }
    /* the values' texts as one trie of literals */
    size_t n = json_array_size(vals), m = 0;
    char **txt = calloc(n ? n : 1, sizeof(*txt));
    size_t *len = calloc(n ? n : 1, sizeof(*len));
    int32_t e = 0;
    if (txt == NULL || len == NULL)
        e = gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    json_array_foreach(vals, i, x)
    {
        if (e < 0 || !value_in_types(x, types))
            continue;
        if (json_is_string(x) && k->has[KW_STRING]) {
            /* string keywords beside the enum keep the values they allow */
            int ok = string_value_ok(c, s, x);
            if (ok < 0) {
                e = ok;
                break;
            }
            if (!ok)
                continue;
        }
        if ((txt[m] = compact(x)) == NULL) {
            e = gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
            break;
        }
        len[m] = strlen(txt[m]);
        m++;
    }
    if (e == 0)
        e = m == 0
                ? gm__schema_fail(
                      c, TG_EINVAL,
                      "no value of \"enum\"/\"const\" fits the schema: "
                      "no document satisfies it")
                : gm_ir_literals(c->ir, (const char *const *)txt, len, NULL, m);
    for (size_t t = 0; txt != NULL && t < m; t++)
        free(txt[t]);
    free(txt);
    free(len);
    json_decref(vals);
    return e;
}

/* The two bounds of a count pair, capped by max_count. */
int32_t gm__schema_counts(struct gm__sc *c, const json_t *s, const char *kmin,
                          const char *kmax, uint32_t *lo, uint32_t *hi)
{
    const json_t *a = json_object_get(s, kmin);
    const json_t *b = json_object_get(s, kmax);
    json_int_t mn = a != NULL ? count_of(a) : 0;
    json_int_t mx = b != NULL ? count_of(b) : -1;
    if (mn > (json_int_t)c->o.max_count)
        return gm__schema_fail(c, TG_ETOOBIG,
                               "\"%s\" %lld is over the limit %u", kmin,
                               (long long)mn, c->o.max_count);
    if (mx >= 0 && mx < mn)
        return gm__schema_fail(c, TG_EINVAL,
                               "\"%s\" %lld is below \"%s\" %lld: no document "
                               "satisfies it",
                               kmax, (long long)mx, kmin, (long long)mn);
    *lo = (uint32_t)mn;
    if (mx < 0)
        *hi = GM_REPEAT_INF;
    else
        *hi = mx > (json_int_t)c->o.max_count ? c->o.max_count : (uint32_t)mx;
    return 0;
}

int gm__schema_string_items(struct gm__sc *c, const json_t *s,
                            struct gm_rx_item *it, size_t cap, size_t *n)
{
    *n = 0;
    const json_t *pat = json_object_get(s, "pattern");
    const json_t *more = json_object_get(s, "$gm:patterns");
    const json_t *fmt = json_object_get(s, "format");
    if (pat != NULL && !json_is_string(pat))
        return gm__schema_fail(c, TG_EFORMAT, "malformed \"pattern\"");
    if (pat != NULL)
        it[(*n)++] = (struct gm_rx_item){.text = json_string_value(pat),
                                         .len = json_string_length(pat),
                                         .kind = GM_RX_SEARCH};
    size_t i;
    const json_t *x;
    json_array_foreach(more, i, x)
    {
        if (!json_is_string(x) || *n == cap)
            return gm__schema_fail(c, TG_EFORMAT, "malformed \"pattern\"");
        it[(*n)++] = (struct gm_rx_item){.text = json_string_value(x),
                                         .len = json_string_length(x),
                                         .kind = GM_RX_SEARCH};
    }
    /* a format this engine knows is enforced; another is what 2020-12
     * makes every format by default, an annotation */
    if (json_is_string(fmt) && *n < cap &&
        gm_format_item(json_string_value(fmt), json_string_length(fmt),
                       &it[*n]) == 0)
        (*n)++;
    return 0;
}

static int32_t string_expr(struct gm__sc *c, const json_t *s)
{
    uint32_t lo, hi;
    int32_t rc = gm__schema_counts(c, s, "minLength", "maxLength", &lo, &hi);
    if (rc < 0)
        return rc;
    struct gm_rx_item it[GM__SCHEMA_RX_MAX];
    size_t n = 0;
    if ((rc = gm__schema_string_items(c, s, it, GM__SCHEMA_RX_MAX, &n)) < 0)
        return rc;
    if (n == 0)
        return gm_ir_ref(c->ir, gm_json_string_len(c->j, lo, hi));
    char err[384];
    int32_t r = gm_regex_json_string_items(c->ir, it, n, lo, hi, err,
                                           sizeof err);
    if (r < 0)
        return regex_fail(c, r, err);
    return gm_ir_ref(c->ir, r);
}

static int32_t ref_expr(struct gm__sc *c, const json_t *s, const struct kws *k)
{
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    const char *o = other_kw(k, 1u << KW_REF);
    if (o != NULL)
        return gm__schema_fail(c, TG_EUNSUPPORTED,
                               "\"$ref\" alongside \"%s\" is not supported", o);
    char why[320];
    const json_t *t = gm__schema_resolve(c, s, ref, why, sizeof why);
    if (t == NULL)
        return gm__schema_fail(c,
                               strstr(why, "not a resource") != NULL
                                   ? TG_EUNSUPPORTED
                                   : TG_EFORMAT,
                               "%s", why);
    /* The target is compiled under the reference's text. */
    char saved[sizeof c->path];
    size_t saved_len = c->plen;
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref);
    c->plen = strlen(c->path);
    int32_t r = gm__schema_sub(c, t);
    memcpy(c->path, saved, sizeof saved);
    c->plen = saved_len;
    return gm_ir_ref(c->ir, r);
}

static int32_t comb_expr(struct gm__sc *c, const json_t *s, const struct kws *k)
{
    const json_t *any = json_object_get(s, "anyOf");
    const json_t *one = json_object_get(s, "oneOf");
    if (any != NULL && one != NULL)
        return gm__schema_fail(
            c, TG_EUNSUPPORTED,
            "\"anyOf\" together with \"oneOf\" is not supported");
    const char *kw = any != NULL ? "anyOf" : "oneOf";
    const json_t *arr = any != NULL ? any : one;
    const char *o = other_kw(k, 1u << KW_COMB);
    if (o != NULL)
        return gm__schema_fail(c, TG_EUNSUPPORTED,
                               "\"%s\" alongside \"%s\" is not supported", kw,
                               o);
    size_t n = json_array_size(arr);
    int32_t *alts = malloc(n * sizeof(*alts));
    if (alts == NULL)
        return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    int32_t rc = 0;
    for (size_t i = 0; i < n && rc >= 0; i++) {
        size_t old = gm__schema_path_push(c, kw, strlen(kw));
        size_t old2 = gm__schema_path_index(c, i);
        int32_t r = gm__schema_sub(c, json_array_get(arr, i));
        gm__schema_path_pop(c, old2);
        gm__schema_path_pop(c, old);
        alts[i] = gm_ir_ref(c->ir, r);
        rc = alts[i];
    }
    for (size_t i = 0; rc >= 0 && one != NULL && i < n; i++)
        for (size_t j = 0; rc >= 0 && j < n; j++) {
            int ex = i == j ? 1
                            : gm__schema_exclusive(c, json_array_get(arr, i),
                                                   json_array_get(arr, j),
                                                   c->ir->deadline);
            if (ex == TG_ETIMEDOUT) {
                gm_ir_late(c->ir);
                rc = c->ir->err;
                break;
            }
            if (ex)
                continue;
            rc = gm__schema_fail(
                c, TG_EUNSUPPORTED,
                "\"oneOf\" alternatives %zu and %zu may both hold "
                "(exclusive ones differ in type, const/enum or a "
                "required property; use \"anyOf\" for overlap)",
                i, j);
        }
    int32_t e = rc < 0 ? rc : gm_ir_alt(c->ir, alts, n);
    free(alts);
    return e;
}

static int32_t body_expr(struct gm__sc *c, const json_t *s, const struct kws *k)
{
    struct gm_ir *ir = c->ir;
    if (k->has[KW_REF])
        return ref_expr(c, s, k);
    if (k->has[KW_COMB])
        return comb_expr(c, s, k);
    if (k->has[KW_ENUM])
        return enum_expr(c, s, k);
    unsigned types = 0;
    if (k->has[KW_TYPE]) {
        types = gm__schema_type_of(json_object_get(s, "type"));
    } else {
        if (k->has[KW_OBJECT])
            types |= GM__T_OBJECT;
        if (k->has[KW_ARRAY])
            types |= GM__T_ARRAY;
        if (k->has[KW_STRING])
            types |= GM__T_STRING;
        if (k->has[KW_NUMBER])
            types |= GM__T_INT | GM__T_FRAC;
        if (types == 0)
            return gm_ir_ref(ir, gm_json_value(c->j));
    }
    int32_t alts[7];
    size_t n = 0;
    if (types & GM__T_OBJECT)
        alts[n++] = gm__schema_object(c, s);
    if (types & GM__T_ARRAY)
        alts[n++] = gm__schema_array(c, s);
    if (types & GM__T_STRING)
        alts[n++] = string_expr(c, s);
    if (types & (GM__T_FRAC | GM__T_INT))
        alts[n++] = gm__schema_number(c, s, types & (GM__T_FRAC | GM__T_INT));
    if (types & GM__T_BOOL)
        alts[n++] = gm_ir_alt2(ir, gm_ir_str(ir, "true"),
                               gm_ir_str(ir, "false"));
    if (types & GM__T_NULL)
        alts[n++] = gm_ir_str(ir, "null");
    for (size_t i = 0; i < n; i++)
        if (alts[i] < 0)
            return alts[i];
    return gm_ir_alt(ir, alts, n);
}

/* The body of a schema without allOf: its "not", when it has one, proven
 * to exclude the rest (which is what is generated). */
static int32_t plain_body(struct gm__sc *c, const json_t *s, struct kws *k)
{
    const json_t *rest = s;
    if (json_object_get(s, "not") != NULL) {
        int ok = gm__schema_not_proven(c, s, &rest);
        if (ok < 0)
            return ok;
        if (!ok)
            return gm__schema_fail(c, TG_EUNSUPPORTED,
                                   "\"not\": could not prove that what the "
                                   "rest of the schema generates never "
                                   "matches it");
    }
    int rc = scan(c, rest, k);
    return rc != 0 ? rc : body_expr(c, rest, k);
}

const json_t *gm__schema_own(struct gm__sc *c, json_t *v)
{
    if (v == NULL)
        return NULL;
    if (c->owned == NULL && (c->owned = json_array()) == NULL) {
        json_decref(v);
        return NULL;
    }
    return json_array_append_new(c->owned, v) == 0 ? v : NULL;
}

int32_t gm__schema_sub(struct gm__sc *c, const json_t *s)
{
    if (c->ir->err != 0)
        return c->ir->err;
    if (gm_ir_late(c->ir))
        return c->ir->err;
    if (json_is_true(s))
        return gm_json_value(c->j);
    if (json_is_false(s))
        return never(c);
    if (!json_is_object(s))
        return gm__schema_fail(c, TG_EFORMAT,
                               "a schema must be an object or a boolean");
    int32_t r = memo_get(c, s);
    if (r >= 0)
        return r;
    if (c->depth >= c->o.max_depth)
        return gm__schema_fail(c, TG_ETOOBIG,
                               "schema nested deeper than %d levels",
                               c->o.max_depth);
    struct kws k;
    int rc = scan(c, s, &k);
    if (rc != 0)
        return rc;
    r = gm_ir_rule(c->ir, c->path);
    if (r < 0)
        return r;
    if (memo_put(c, s, r) != 0)
        return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    c->depth++;
    int32_t body;
    if (gm__schema_needs_merge(s)) {
        /* compiled as its merged form, under this rule (recursion through
         * s finds the rule) */
        const json_t *m = gm__schema_merge(c, s);
        if (m == NULL)
            body = c->ir->err != 0 ? c->ir->err : TG_EINTERNAL;
        else if (json_is_boolean(m))
            body = gm_ir_ref(c->ir,
                             json_is_true(m) ? gm_json_value(c->j) : never(c));
        else
            body = plain_body(c, m, &k);
    } else {
        body = plain_body(c, s, &k);
    }
    c->depth--;
    rc = gm_ir_rule_define(c->ir, r, body);
    return rc != 0 ? rc : r;
}

int gm_schema_compile(struct gm_json *j, const json_t *schema,
                      const struct gm_schema_opts *o, int32_t *rule,
                      char *err, size_t errlen)
{
    struct gm__sc c;
    memset(&c, 0, sizeof c);
    c.j = j;
    c.ir = j->ir;
    c.root = schema;
    if (o != NULL)
        c.o = *o;
    else
        gm_schema_opts_default(&c.o);
    c.never = -1;
    strcpy(c.path, "#");
    c.plen = 1;
    if (tg_hmap_init(&c.memo, &memo_type, NULL, 32) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM, "grammar: out of memory");
    int32_t r = gm__schema_refs_build(&c);
    if (r == 0)
        r = gm__schema_sub(&c, schema);
    gm__schema_refs_free(&c);
    json_decref(c.owned);
    tg_hmap_free(&c.memo);
    if (r < 0 || c.ir->err != 0) {
        int code = gm_ir_error(c.ir, err, errlen);
        return code != 0 ? code : r;
    }
    *rule = r;
    return 0;
}
