/* jj_value.c — template values (jj_internal.h): reference counting,
 * strings, lists, dicts with Python key equality, truthiness, equality and
 * ordering with Python's rules, iteration and len(), and the conversion of
 * jansson JSON into values. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- undefined ----------------------------------------------------------- */

struct jj_val jj_undef_named(struct jj_str *name, const char *obj)
{
    struct jj_val v = {.t = JJ_UNDEF};
    v.u.un.name = name;
    v.u.un.obj = obj;
    if (name != NULL && !name->h.immortal)
        name->h.rc++;
    return v;
}

struct jj_val jj_undef_msg(const char *msg)
{
    struct jj_val v = {.t = JJ_UNDEF};
    v.u.un.msg = msg;
    return v;
}

/* ---- reference counting -------------------------------------------------- */

static struct jj_obj *obj_of(struct jj_val v)
{
    switch (v.t) {
    case JJ_STR:
    case JJ_LIST:
    case JJ_DICT:
    case JJ_NS:
    case JJ_FUNC:
    case JJ_ITER:
    case JJ_LOOP:
        return v.u.o;
    case JJ_UNDEF:
        return v.u.un.name != NULL ? &v.u.un.name->h : NULL;
    default:
        return NULL;
    }
}

void jj_ref(struct jj_val v)
{
    struct jj_obj *o = obj_of(v);
    if (o != NULL && !o->immortal)
        o->rc++;
}

static void obj_free(struct jj_obj *o);

static void obj_release(struct jj_obj *o)
{
    if (o == NULL || o->immortal)
        return;
    if (--o->rc > 0)
        return;
    obj_free(o);
}

void jj_unref(struct jj_val v)
{
    obj_release(obj_of(v));
}

static void list_release_items(struct jj_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        jj_unref(l->v[i]);
    free(l->v);
}

static void obj_free(struct jj_obj *o)
{
    switch (o->type) {
    case JJ_LIST: {
        struct jj_list *l = (struct jj_list *)o;
        list_release_items(l);
        break;
    }
    case JJ_DICT: {
        struct jj_dict *d = (struct jj_dict *)o;
        for (size_t i = 0; i < d->n; i++) {
            jj_unref(d->k[i]);
            jj_unref(d->v[i]);
        }
        free(d->k);
        free(d->v);
        tg_hmap_free(&d->index);
        break;
    }
    case JJ_NS: {
        /* Namespaces are owned by the render context's list (they can form
         * cycles); the context frees them at the end of the render. */
        return;
    }
    case JJ_FUNC: {
        struct jj_func *f = (struct jj_func *)o;
        if (f->self != NULL) {
            jj_unref(*f->self);
            free(f->self);
        }
        break;
    }
    case JJ_ITER: {
        struct jj_iter *it = (struct jj_iter *)o;
        obj_release(&it->items->h);
        break;
    }
    case JJ_LOOP: {
        struct jj_loop *lp = (struct jj_loop *)o;
        obj_release(&lp->items->h);
        if (lp->last_changed != NULL) {
            jj_unref(*lp->last_changed);
            free(lp->last_changed);
        }
        break;
    }
    default:
        break;
    }
    free(o);
}

/* ---- strings ------------------------------------------------------------- */

struct jj_str *jj_str_new(const char *s, size_t len)
{
    struct jj_str *js = malloc(sizeof(*js) + len + 1);
    if (js == NULL)
        return NULL;
    js->h.rc = 1;
    js->h.type = JJ_STR;
    js->h.immortal = 0;
    js->markup = 0;
    js->len = len;
    if (len > 0)
        memcpy(js->s, s, len);
    js->s[len] = '\0';
    bool ascii = true;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80) {
            ascii = false;
            break;
        }
    js->ascii = ascii;
    js->ncp = ascii ? len : jj_utf8_count(s, len);
    return js;
}

struct jj_str *jj_str_cstr(const char *s)
{
    return jj_str_new(s, strlen(s));
}

struct jj_val jj_str_val(struct jj_str *s)
{
    struct jj_val v = {.t = JJ_STR};
    v.u.s = s;
    return v;
}

int jj_make_str(struct jj_ctx *c, int line, const char *s, size_t len,
                struct jj_val *out)
{
    if (c != NULL && len > c->lim.max_output)
        return jj_fail(c, line, TG_ETOOBIG,
                       "a string of %zu bytes exceeds the output limit of "
                       "%zu bytes",
                       len, c->lim.max_output);
    struct jj_str *js = jj_str_new(s, len);
    if (js == NULL)
        return c != NULL ? jj_oom(c, line) : TG_ENOMEM;
    *out = jj_str_val(js);
    return 0;
}

/* ---- lists --------------------------------------------------------------- */

struct jj_list *jj_list_new(size_t cap, uint8_t seq)
{
    struct jj_list *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->h.rc = 1;
    l->h.type = JJ_LIST;
    l->seq = seq;
    if (cap > 0) {
        l->v = malloc(cap * sizeof(*l->v));
        if (l->v == NULL) {
            free(l);
            return NULL;
        }
        l->cap = cap;
    }
    return l;
}

int jj_list_push(struct jj_list *l, struct jj_val v)
{
    if (TG_GROW(l->v, &l->cap, l->n + 1))
        return TG_ENOMEM;
    l->v[l->n++] = v;
    return 0;
}

struct jj_val jj_list_val(struct jj_list *l)
{
    struct jj_val v = {.t = JJ_LIST};
    v.u.l = l;
    return v;
}

/* ---- dicts ---------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static uint64_t hash_val(struct jj_val k)
{
    switch (k.t) {
    case JJ_STR: {
        uint64_t h = 0xcbf29ce484222325ULL;
        for (size_t i = 0; i < k.u.s->len; i++)
            h = (h ^ (unsigned char)k.u.s->s[i]) * 0x100000001b3ULL;
        return h;
    }
    case JJ_BOOL:
        return mix64((uint64_t)k.u.b);
    case JJ_INT:
        return mix64((uint64_t)k.u.i);
    case JJ_FLOAT: {
        double f = k.u.f;
        if (f == floor(f) && f >= -9.2e18 && f <= 9.2e18)
            return mix64((uint64_t)(int64_t)f);
        uint64_t bits;
        memcpy(&bits, &f, sizeof bits);
        return mix64(bits);
    }
    case JJ_LIST: {
        uint64_t h = 0x345678;
        for (size_t i = 0; i < k.u.l->n; i++)
            h = mix64(h ^ hash_val(k.u.l->v[i]));
        return h;
    }
    default:
        return 0x9e3779b97f4a7c15ULL;
    }
}

bool jj_hashable(struct jj_val v)
{
    switch (v.t) {
    case JJ_STR:
    case JJ_BOOL:
    case JJ_INT:
    case JJ_FLOAT:
    case JJ_NONE:
    case JJ_UNDEF:
        return true;
    case JJ_LIST:
        if (v.u.l->seq != JJ_SEQ_TUPLE)
            return false;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!jj_hashable(v.u.l->v[i]))
                return false;
        return true;
    default:
        return false;
    }
}

struct jj_dict *jj_dict_new(size_t cap)
{
    struct jj_dict *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->h.rc = 1;
    d->h.type = JJ_DICT;
    if (cap > 0) {
        d->k = malloc(cap * sizeof(*d->k));
        d->v = malloc(cap * sizeof(*d->v));
        if (d->k == NULL || d->v == NULL) {
            free(d->k);
            free(d->v);
            free(d);
            return NULL;
        }
        d->cap = cap;
    }
    return d;
}

/* Dicts of at least this many entries get a hash index over their keys;
 * smaller ones are searched linearly. */
#define DICT_INDEX_MIN 16

/* The index: a slot is entry + 1 (0 empty); a lookup's key is the dict
 * and the value sought; the map's ctx is the dict, whose keys rehashing
 * reads. */
struct index_key {
    const struct jj_dict *d;
    struct jj_val k;
};

static inline int index_probe(const void *slot, const void *key)
{
    uint32_t e = *(const uint32_t *)slot;
    const struct index_key *q = key;
    if (e == 0)
        return TG_HMAP_EMPTY;
    return jj_equal(q->d->k[e - 1], q->k) ? TG_HMAP_HIT : TG_HMAP_MISS;
}

static int index_empty(const void *slot)
{
    return *(const uint32_t *)slot == 0;
}

static uint64_t index_hash(const void *slot, void *ctx)
{
    const struct jj_dict *d = ctx;
    return hash_val(d->k[*(const uint32_t *)slot - 1]);
}

static const struct tg_hmap_type index_type = {
    .esize = sizeof(uint32_t),
    .empty_byte = 0,
    .probe = index_probe,
    .is_empty = index_empty,
    .hash = index_hash,
};

/* Enters entry i (its key not yet in the index). */
static int index_put(struct jj_dict *d, size_t i)
{
    struct index_key q = {d, d->k[i]};
    uint32_t *slot = tg_hmap_put(&d->index, &index_type, hash_val(d->k[i]), &q,
                                 NULL);
    if (slot == NULL)
        return TG_ENOMEM;
    *slot = (uint32_t)(i + 1);
    return 0;
}

static int index_build(struct jj_dict *d)
{
    if (tg_hmap_init(&d->index, &index_type, d, d->n) != 0)
        return TG_ENOMEM;
    for (size_t i = 0; i < d->n; i++)
        if (index_put(d, i) != 0)
            return TG_ENOMEM;
    return 0;
}

/* Out of line: inlined, its loop's registers would be saved on every
 * lookup of the small dicts that have no index. */
static __attribute__((noinline)) long index_find(const struct jj_dict *d,
                                                 struct jj_val k)
{
    struct index_key q = {d, k};
    const uint32_t *slot = tg_hmap_find(&d->index, &index_type, hash_val(k),
                                        &q);
    return slot != NULL ? (long)*slot - 1 : -1;
}

static long dict_find(const struct jj_dict *d, struct jj_val k)
{
    if (d->index.slots != NULL)
        return index_find(d, k);
    for (size_t i = 0; i < d->n; i++)
        if (jj_equal(d->k[i], k))
            return (long)i;
    return -1;
}

int jj_dict_append(struct jj_dict *d, struct jj_val k, struct jj_val v)
{
    if (d->n >= UINT32_MAX - 1)
        return TG_ENOMEM;
    /* Keys and values share one capacity: it moves once both have grown. */
    size_t cap_k = d->cap, cap_v = d->cap;
    if (TG_GROW(d->k, &cap_k, d->n + 1) || TG_GROW(d->v, &cap_v, d->n + 1))
        return TG_ENOMEM;
    d->cap = cap_k;
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    int rc = 0;
    if (d->index.slots != NULL)
        rc = index_put(d, d->n - 1);
    else if (d->n >= DICT_INDEX_MIN)
        rc = index_build(d);
    if (rc != 0)
        tg_hmap_free(&d->index); /* fall back to linear search */
    return 0;
}

int jj_dict_set(struct jj_dict *d, struct jj_val k, struct jj_val v)
{
    long i = dict_find(d, k);
    if (i >= 0) {
        jj_unref(k);
        jj_unref(d->v[i]);
        d->v[i] = v;
        return 0;
    }
    return jj_dict_append(d, k, v);
}

const struct jj_val *jj_dict_get(const struct jj_dict *d, struct jj_val k)
{
    long i = dict_find(d, k);
    return i >= 0 ? &d->v[i] : NULL;
}

struct jj_val jj_dict_val(struct jj_dict *d)
{
    struct jj_val v = {.t = JJ_DICT};
    v.u.d = d;
    return v;
}

/* ---- Python semantics ----------------------------------------------------- */

bool jj_truthy(struct jj_val v)
{
    switch (v.t) {
    case JJ_UNDEF:
    case JJ_NONE:
        return false;
    case JJ_BOOL:
        return v.u.b != 0;
    case JJ_INT:
        return v.u.i != 0;
    case JJ_FLOAT:
        return v.u.f != 0.0;
    case JJ_STR:
        return v.u.s->len > 0;
    case JJ_LIST:
        return v.u.l->n > 0;
    case JJ_DICT:
        return v.u.d->n > 0;
    case JJ_LOOP:
        return v.u.lp->items->n > 0;
    default:
        return true;
    }
}

static bool is_num(struct jj_val v)
{
    return v.t == JJ_BOOL || v.t == JJ_INT || v.t == JJ_FLOAT;
}

/* Exact comparison of an int with a float: -1, 0, 1, or 2 for NaN. */
static int cmp_int_float(int64_t i, double f)
{
    if (isnan(f))
        return 2;
    if (isinf(f))
        return f > 0 ? -1 : 1;
    double di = (double)i;
    if (di < f)
        return -1;
    if (di > f)
        return 1;
    /* equal as doubles: compare exactly through the integral part */
    if (f >= 9.2233720368547758e18)
        return -1;
    if (f < -9.2233720368547758e18)
        return 1;
    int64_t fi = (int64_t)f;
    if (i != fi)
        return i < fi ? -1 : 1;
    double frac = f - (double)fi;
    return frac > 0 ? -1 : frac < 0 ? 1 : 0;
}

/* -1, 0, 1 for numbers (2 when unordered: NaN). */
static int cmp_num(struct jj_val a, struct jj_val b)
{
    if (a.t != JJ_FLOAT && b.t != JJ_FLOAT) {
        int64_t x = a.t == JJ_BOOL ? a.u.b : a.u.i;
        int64_t y = b.t == JJ_BOOL ? b.u.b : b.u.i;
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.t == JJ_FLOAT && b.t == JJ_FLOAT) {
        if (isnan(a.u.f) || isnan(b.u.f))
            return 2;
        return a.u.f < b.u.f ? -1 : a.u.f > b.u.f ? 1 : 0;
    }
    if (a.t == JJ_FLOAT) {
        int r = cmp_int_float(b.t == JJ_BOOL ? b.u.b : b.u.i, a.u.f);
        return r == 2 ? 2 : -r;
    }
    return cmp_int_float(a.t == JJ_BOOL ? a.u.b : a.u.i, b.u.f);
}

static int cmp_str(const struct jj_str *a, const struct jj_str *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(a->s, b->s, n);
    if (r != 0)
        return r < 0 ? -1 : 1;
    return a->len < b->len ? -1 : a->len > b->len ? 1 : 0;
}

static bool seq_is_set_view(uint8_t seq)
{
    return seq == JJ_SEQ_ITEMS || seq == JJ_SEQ_KEYS;
}

bool jj_equal(struct jj_val a, struct jj_val b)
{
    if (is_num(a) && is_num(b))
        return cmp_num(a, b) == 0;
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JJ_UNDEF:
    case JJ_NONE:
        return true;
    case JJ_STR:
        return a.u.s->len == b.u.s->len &&
               memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case JJ_LIST: {
        const struct jj_list *x = a.u.l, *y = b.u.l;
        if (x == y)
            return true;
        if (seq_is_set_view(x->seq) || seq_is_set_view(y->seq)) {
            if (!seq_is_set_view(x->seq) || !seq_is_set_view(y->seq) ||
                x->n != y->n)
                return false;
            for (size_t i = 0; i < x->n; i++) {
                bool found = false;
                for (size_t j = 0; j < y->n && !found; j++)
                    found = jj_equal(x->v[i], y->v[j]);
                if (!found)
                    return false;
            }
            return true;
        }
        bool xt = x->seq == JJ_SEQ_TUPLE, yt = y->seq == JJ_SEQ_TUPLE;
        if (xt != yt || x->seq == JJ_SEQ_VALUES || y->seq == JJ_SEQ_VALUES ||
            (x->seq == JJ_SEQ_RANGE) != (y->seq == JJ_SEQ_RANGE) ||
            x->n != y->n)
            return false;
        for (size_t i = 0; i < x->n; i++)
            if (!jj_equal(x->v[i], y->v[i]))
                return false;
        return true;
    }
    case JJ_DICT: {
        const struct jj_dict *x = a.u.d, *y = b.u.d;
        if (x == y)
            return true;
        if (x->n != y->n)
            return false;
        for (size_t i = 0; i < x->n; i++) {
            const struct jj_val *v = jj_dict_get(y, x->k[i]);
            if (v == NULL || !jj_equal(x->v[i], *v))
                return false;
        }
        return true;
    }
    default:
        return a.u.o == b.u.o;
    }
}

const char *jj_type_name(struct jj_val v)
{
    switch (v.t) {
    case JJ_UNDEF: return "Undefined";
    case JJ_NONE: return "NoneType";
    case JJ_BOOL: return "bool";
    case JJ_INT: return "int";
    case JJ_FLOAT: return "float";
    case JJ_STR: return v.u.s->markup ? "Markup" : "str";
    case JJ_LIST:
        switch (v.u.l->seq) {
        case JJ_SEQ_TUPLE: return "tuple";
        case JJ_SEQ_ITEMS: return "dict_items";
        case JJ_SEQ_KEYS: return "dict_keys";
        case JJ_SEQ_VALUES: return "dict_values";
        case JJ_SEQ_RANGE: return "range";
        default: return "list";
        }
    case JJ_DICT: return "dict";
    case JJ_NS: return "Namespace";
    case JJ_FUNC:
        return v.u.fn->kind == JJ_FN_MACRO ? "Macro"
               : v.u.fn->kind == JJ_FN_METHOD ? "builtin_function_or_method"
                                              : "function";
    case JJ_ITER: return "generator";
    case JJ_LOOP: return "LoopContext";
    default: return "object";
    }
}

static const char *op_sym(int op)
{
    switch (op) {
    case JJ_OP_LT: return "<";
    case JJ_OP_LE: return "<=";
    case JJ_OP_GT: return ">";
    default: return ">=";
    }
}

int jj_order(struct jj_ctx *c, int line, int op, struct jj_val a,
             struct jj_val b, bool *res)
{
    if (a.t == JJ_UNDEF)
        return jj_undef_error(c, line, a);
    if (b.t == JJ_UNDEF)
        return jj_undef_error(c, line, b);
    int r;
    if (is_num(a) && is_num(b)) {
        r = cmp_num(a, b);
        if (r == 2) {
            *res = false;
            return 0;
        }
    } else if (a.t == JJ_STR && b.t == JJ_STR) {
        r = cmp_str(a.u.s, b.u.s);
    } else if (a.t == JJ_LIST && b.t == JJ_LIST &&
               (a.u.l->seq == JJ_SEQ_LIST || a.u.l->seq == JJ_SEQ_TUPLE) &&
               a.u.l->seq == b.u.l->seq) {
        const struct jj_list *x = a.u.l, *y = b.u.l;
        size_t n = x->n < y->n ? x->n : y->n;
        for (size_t i = 0; i < n; i++) {
            if (jj_equal(x->v[i], y->v[i]))
                continue;
            return jj_order(c, line, op, x->v[i], y->v[i], res);
        }
        r = x->n < y->n ? -1 : x->n > y->n ? 1 : 0;
    } else {
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: '%s' not supported between instances of "
                       "'%s' and '%s'",
                       op_sym(op), jj_type_name(a), jj_type_name(b));
    }
    switch (op) {
    case JJ_OP_LT: *res = r < 0; break;
    case JJ_OP_LE: *res = r <= 0; break;
    case JJ_OP_GT: *res = r > 0; break;
    default: *res = r >= 0; break;
    }
    return 0;
}

int jj_cmp3(struct jj_ctx *c, int line, struct jj_val a, struct jj_val b,
            int *res)
{
    bool lt;
    int rc = jj_order(c, line, JJ_OP_LT, a, b, &lt);
    if (rc)
        return rc;
    if (lt) {
        *res = -1;
        return 0;
    }
    rc = jj_order(c, line, JJ_OP_LT, b, a, &lt);
    if (rc)
        return rc;
    *res = lt ? 1 : 0;
    return 0;
}

/* ---- JSON -> values ------------------------------------------------------- */

static int from_json(struct jj_ctx *c, const json_t *j, struct jj_val *out)
{
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = jj_none();
        return 0;
    case JSON_TRUE:
        *out = jj_bool(1);
        return 0;
    case JSON_FALSE:
        *out = jj_bool(0);
        return 0;
    case JSON_INTEGER:
        *out = jj_int((int64_t)json_integer_value(j));
        return 0;
    case JSON_REAL:
        *out = jj_float(json_real_value(j));
        return 0;
    case JSON_STRING:
        return jj_make_str(c, 0, json_string_value(j), json_string_length(j),
                           out);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        struct jj_list *l = jj_list_new(n, JJ_SEQ_LIST);
        if (l == NULL)
            return jj_oom(c, 0);
        for (size_t i = 0; i < n; i++) {
            struct jj_val v;
            int rc = from_json(c, json_array_get(j, i), &v);
            if (rc) {
                jj_unref(jj_list_val(l));
                return rc;
            }
            l->v[l->n++] = v;
        }
        *out = jj_list_val(l);
        return 0;
    }
    case JSON_OBJECT: {
        struct jj_dict *d = jj_dict_new(json_object_size(j));
        if (d == NULL)
            return jj_oom(c, 0);
        const char *key;
        json_t *val;
        void *it = json_object_iter((json_t *)j);
        for (; it != NULL; it = json_object_iter_next((json_t *)j, it)) {
            key = json_object_iter_key(it);
            val = json_object_iter_value(it);
            struct jj_val k, v;
            int rc = jj_make_str(c, 0, key, strlen(key), &k);
            if (rc == 0 && (rc = from_json(c, val, &v)) != 0)
                jj_unref(k);
            if (rc == 0 && jj_dict_append(d, k, v) != 0) {
                jj_unref(k);
                jj_unref(v);
                rc = jj_oom(c, 0);
            }
            if (rc) {
                jj_unref(jj_dict_val(d));
                return rc;
            }
        }
        *out = jj_dict_val(d);
        return 0;
    }
    }
    return jj_fail(c, 0, TG_EINVAL, "unknown JSON value");
}

int jj_from_json(struct jj_ctx *c, const void *json, struct jj_val *out)
{
    return from_json(c, json, out);
}

/* ---- iteration and len ------------------------------------------------------ */

int jj_iterate(struct jj_ctx *c, int line, struct jj_val v,
               struct jj_list **out)
{
    struct jj_list *l;
    switch (v.t) {
    case JJ_UNDEF:
        l = jj_list_new(0, JJ_SEQ_LIST);
        break;
    case JJ_LIST:
        if (!v.u.l->h.immortal)
            v.u.l->h.rc++;
        *out = v.u.l;
        return 0;
    case JJ_STR: {
        const struct jj_str *s = v.u.s;
        l = jj_list_new(s->ncp, JJ_SEQ_LIST);
        for (size_t i = 0; l != NULL && i < s->len;) {
            size_t adv;
            jj_utf8_next(s->s + i, s->len - i, &adv);
            struct jj_val ch;
            int rc = jj_make_str(c, line, s->s + i, adv, &ch);
            if (rc) {
                jj_unref(jj_list_val(l));
                return rc;
            }
            ch.u.s->markup = s->markup;
            l->v[l->n++] = ch;
            i += adv;
        }
        break;
    }
    case JJ_DICT: {
        const struct jj_dict *d = v.u.d;
        l = jj_list_new(d->n, JJ_SEQ_LIST);
        for (size_t i = 0; l != NULL && i < d->n; i++) {
            jj_ref(d->k[i]);
            l->v[l->n++] = d->k[i];
        }
        break;
    }
    case JJ_ITER: {
        struct jj_iter *it = v.u.it;
        size_t n = it->items->n - it->pos;
        l = jj_list_new(n, JJ_SEQ_LIST);
        for (size_t i = 0; l != NULL && i < n; i++) {
            jj_ref(it->items->v[it->pos + i]);
            l->v[l->n++] = it->items->v[it->pos + i];
        }
        if (l != NULL)
            it->pos = it->items->n;
        break;
    }
    default:
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: '%s' object is not iterable",
                       jj_type_name(v));
    }
    if (l == NULL)
        return jj_oom(c, line);
    *out = l;
    return 0;
}

int jj_len(struct jj_ctx *c, int line, struct jj_val v, int64_t *n)
{
    switch (v.t) {
    case JJ_UNDEF:
        *n = 0;
        return 0;
    case JJ_STR:
        *n = (int64_t)v.u.s->ncp;
        return 0;
    case JJ_LIST:
        *n = (int64_t)v.u.l->n;
        return 0;
    case JJ_DICT:
        *n = (int64_t)v.u.d->n;
        return 0;
    case JJ_LOOP:
        *n = (int64_t)v.u.lp->items->n;
        return 0;
    default:
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: object of type '%s' has no len()",
                       jj_type_name(v));
    }
}
