/* gm_schema_ref.c — where a JSON Schema's $ref points (draft 2020-12
 * §8.2 and §9): the document's resources, their base URIs and anchors
 * (gm_schema_internal.h).
 *
 * A schema object with a string "$id" is a resource of its own (the root
 * always is one). Its base URI is its $id resolved against the base URI
 * of the resource around it (RFC 3986 §5.2, with dot segments removed).
 * A $ref is resolved against the base URI of the resource its schema
 * sits in — by its place in the document, however the compiler reached
 * it — and then names a resource by that URI, with a fragment that is a
 * JSON pointer into the resource ("#/$defs/x": RFC 3986 percent-decoding
 * first, then RFC 6901's ~1 and ~0) or the name of an "$anchor" in it.
 * Resources are only those in the document: a URI naming anything else
 * (another file, a metaschema) is refused by the caller, never fetched.
 *
 * The index walks only the places where a keyword holds a subschema, so
 * an "$id" inside an enum value or a property named "$id" is not taken
 * for an identifier.
 */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/grammar/gm_schema_internal.h"

/* Keywords whose value is a subschema, an array of them, or an object of
 * them. */
static const char *const one_kw[] = {"additionalProperties",
                                     "items",
                                     "not",
                                     "contains",
                                     "propertyNames",
                                     "if",
                                     "then",
                                     "else",
                                     "unevaluatedItems",
                                     "unevaluatedProperties",
                                     "additionalItems"};
static const char *const arr_kw[] = {"anyOf", "oneOf", "allOf", "prefixItems",
                                     "items"};
static const char *const map_kw[] = {"properties", "patternProperties", "$defs",
                                     "definitions", "dependentSchemas"};

/* ---- URIs ----------------------------------------------------------------- */

/* The parts of a URI reference (RFC 3986 §3), as lengths into it. */
struct uri {
    const char *s;
    size_t scheme, auth_at, auth, path_at, path, query_at, query;
    int has_scheme, has_auth, has_query;
};

static void uri_split(const char *s, size_t n, struct uri *u)
{
    memset(u, 0, sizeof(*u));
    u->s = s;
    size_t i = 0;
    /* scheme: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":" */
    while (i < n && s[i] != ':' && s[i] != '/' && s[i] != '?' && s[i] != '#')
        i++;
    if (i < n && i > 0 && s[i] == ':' &&
        ((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'))) {
        u->has_scheme = 1;
        u->scheme = i;
        i++;
    } else {
        i = 0;
    }
    if (i + 1 < n && s[i] == '/' && s[i + 1] == '/') {
        u->has_auth = 1;
        u->auth_at = i + 2;
        i += 2;
        while (i < n && s[i] != '/' && s[i] != '?' && s[i] != '#')
            i++;
        u->auth = i - u->auth_at;
    }
    u->path_at = i;
    while (i < n && s[i] != '?' && s[i] != '#')
        i++;
    u->path = i - u->path_at;
    if (i < n && s[i] == '?') {
        u->has_query = 1;
        u->query_at = ++i;
        while (i < n && s[i] != '#')
            i++;
        u->query = i - u->query_at;
    }
}

struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom || tg_grow((void **)&b->s, &b->cap, b->n + n + 1, 1)) {
        b->oom = 1;
        return;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

/* RFC 3986 §5.2.4: removes "." and ".." segments from path[0..n). */
static void remove_dots(const char *path, size_t n, struct sbuf *out)
{
    char *in = malloc(n + 1);
    if (in == NULL) {
        out->oom = 1;
        return;
    }
    memcpy(in, path, n);
    in[n] = '\0';
    char *p = in;
    size_t start = out->n;
    while (*p) {
        if (strncmp(p, "../", 3) == 0)
            p += 3;
        else if (strncmp(p, "./", 2) == 0)
            p += 2;
        else if (strncmp(p, "/./", 3) == 0)
            p += 2;
        else if (strcmp(p, "/.") == 0)
            p[1] = '\0';
        else if (strncmp(p, "/../", 4) == 0 || strcmp(p, "/..") == 0) {
            if (p[3] == '\0')
                p[2] = '/', p += 2;
            else
                p += 3;
            while (out->n > start && out->s[out->n - 1] != '/')
                out->n--;
            if (out->n > start)
                out->n--;
            if (!out->oom && out->s != NULL)
                out->s[out->n] = '\0';
        } else if (strcmp(p, ".") == 0 || strcmp(p, "..") == 0) {
            p += strlen(p);
        } else {
            size_t k = *p == '/' ? 1 : 0;
            while (p[k] != '\0' && p[k] != '/')
                k++;
            put(out, p, k);
            p += k;
        }
    }
    free(in);
}

/* The target URI (without fragment) of reference ref[0..n) against base
 * (absolute or empty), RFC 3986 §5.2.2. A new string, or NULL. */
static char *uri_resolve(const char *base, const char *ref, size_t n)
{
    struct uri r, b;
    uri_split(ref, n, &r);
    uri_split(base, strlen(base), &b);
    struct sbuf o = {0};
    put(&o, "", 0);
    if (r.has_scheme) {
        put(&o, ref, r.scheme + 1);
        if (r.has_auth) {
            put(&o, "//", 2);
            put(&o, ref + r.auth_at, r.auth);
        }
        remove_dots(ref + r.path_at, r.path, &o);
        if (r.has_query) {
            put(&o, "?", 1);
            put(&o, ref + r.query_at, r.query);
        }
        return o.oom ? (free(o.s), NULL) : o.s;
    }
    if (b.has_scheme)
        put(&o, base, b.scheme + 1);
    if (r.has_auth) {
        put(&o, "//", 2);
        put(&o, ref + r.auth_at, r.auth);
        remove_dots(ref + r.path_at, r.path, &o);
    } else {
        if (b.has_auth) {
            put(&o, "//", 2);
            put(&o, base + b.auth_at, b.auth);
        }
        if (r.path == 0) {
            put(&o, base + b.path_at, b.path);
            if (!r.has_query && b.has_query) {
                put(&o, "?", 1);
                put(&o, base + b.query_at, b.query);
            }
        } else if (ref[r.path_at] == '/') {
            remove_dots(ref + r.path_at, r.path, &o);
        } else {
            /* merge: the base path up to its last '/', then the ref's */
            struct sbuf m = {0};
            if (b.has_auth && b.path == 0)
                put(&m, "/", 1);
            else {
                size_t k = b.path;
                while (k > 0 && base[b.path_at + k - 1] != '/')
                    k--;
                put(&m, base + b.path_at, k);
            }
            put(&m, ref + r.path_at, r.path);
            if (m.oom)
                o.oom = 1;
            else
                remove_dots(m.s, m.n, &o);
            free(m.s);
        }
    }
    if (r.has_query) {
        put(&o, "?", 1);
        put(&o, ref + r.query_at, r.query);
    }
    return o.oom ? (free(o.s), NULL) : o.s;
}

/* ---- the index -------------------------------------------------------------- */

struct gm__res {
    const json_t *root; /* the resource's schema */
    char *uri;          /* its base URI, no fragment ("" for a root
                           without $id) */
};

struct gm__refs {
    struct gm__res *res;
    size_t n_res, cap_res;
    /* schema address -> resource index, open addressing */
    const json_t **key;
    int32_t *val;
    size_t cap; /* a power of two */
    size_t n;
};

static size_t slot_of(const struct gm__refs *x, const json_t *s)
{
    uintptr_t h = (uintptr_t)s;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 7) & (x->cap - 1);
}

static int map_put(struct gm__refs *x, const json_t *s, int32_t r)
{
    if ((x->n + 1) * 2 > x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        const json_t **k = calloc(cap, sizeof(*k));
        int32_t *v = malloc(cap * sizeof(*v));
        if (k == NULL || v == NULL) {
            free(k);
            free(v);
            return TG_ENOMEM;
        }
        const json_t **ok = x->key;
        int32_t *ov = x->val;
        size_t oc = x->cap;
        x->key = k;
        x->val = v;
        x->cap = cap;
        for (size_t i = 0; i < oc; i++)
            if (ok[i] != NULL) {
                size_t j = slot_of(x, ok[i]);
                while (x->key[j] != NULL)
                    j = (j + 1) & (cap - 1);
                x->key[j] = ok[i];
                x->val[j] = ov[i];
            }
        free(ok);
        free(ov);
    }
    size_t j = slot_of(x, s);
    while (x->key[j] != NULL && x->key[j] != s)
        j = (j + 1) & (x->cap - 1);
    if (x->key[j] == NULL)
        x->n++;
    x->key[j] = s;
    x->val[j] = r;
    return 0;
}

static int32_t map_get(const struct gm__refs *x, const json_t *s)
{
    if (x->cap == 0)
        return 0;
    for (size_t j = slot_of(x, s); x->key[j] != NULL;
         j = (j + 1) & (x->cap - 1))
        if (x->key[j] == s)
            return x->val[j];
    return 0; /* the root's */
}

static int walk(struct gm__refs *x, const json_t *s, int32_t res, int depth);

static int walk_each(struct gm__refs *x, const json_t *v, int32_t res,
                     int depth)
{
    if (json_is_array(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e)
        {
            int rc = walk(x, e, res, depth + 1);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    return walk(x, v, res, depth + 1);
}

/* Records s (a schema) and its subschemas under resource res, or under a
 * new one when s has an $id. */
static int walk(struct gm__refs *x, const json_t *s, int32_t res, int depth)
{
    if (!json_is_object(s) || depth > 256)
        return 0;
    const json_t *id = json_object_get(s, "$id");
    const char *ids = json_is_string(id) ? json_string_value(id) : "";
    size_t n = strcspn(ids, "#");
    if (n > 0 && s != x->res[0].root) {
        char *uri = uri_resolve(x->res[res].uri, ids, n);
        if (uri == NULL || TG_GROW(x->res, &x->cap_res, x->n_res + 1)) {
            free(uri);
            return TG_ENOMEM;
        }
        x->res[x->n_res] = (struct gm__res){.root = s, .uri = uri};
        res = (int32_t)x->n_res++;
    }
    if (map_put(x, s, res) != 0)
        return TG_ENOMEM;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof one_kw / sizeof *one_kw; i++) {
        const json_t *v = json_object_get(s, one_kw[i]);
        if (json_is_object(v))
            rc = walk(x, v, res, depth + 1);
    }
    for (size_t i = 0; rc == 0 && i < sizeof arr_kw / sizeof *arr_kw; i++) {
        const json_t *v = json_object_get(s, arr_kw[i]);
        if (json_is_array(v))
            rc = walk_each(x, v, res, depth);
    }
    for (size_t i = 0; rc == 0 && i < sizeof map_kw / sizeof *map_kw; i++) {
        const json_t *m = json_object_get(s, map_kw[i]);
        const char *k;
        const json_t *v;
        if (json_is_object(m))
            json_object_foreach((json_t *)m, k, v)
            {
                if ((rc = walk(x, v, res, depth + 1)) != 0)
                    break;
            }
    }
    return rc;
}

int gm__schema_refs_build(struct gm__sc *c)
{
    struct gm__refs *x = calloc(1, sizeof(*x));
    if (x == NULL || TG_GROW(x->res, &x->cap_res, 1)) {
        free(x);
        return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    }
    const json_t *id = json_object_get(c->root, "$id");
    const char *ids = json_is_string(id) ? json_string_value(id) : "";
    x->res[0].root = c->root;
    x->res[0].uri = uri_resolve("", ids, strcspn(ids, "#"));
    x->n_res = 1;
    c->refs = x;
    if (x->res[0].uri == NULL || walk(x, c->root, 0, 0) != 0)
        return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
    return 0;
}

void gm__schema_refs_free(struct gm__sc *c)
{
    struct gm__refs *x = c->refs;
    if (x == NULL)
        return;
    for (size_t i = 0; i < x->n_res; i++)
        free(x->res[i].uri);
    free(x->res);
    free(x->key);
    free(x->val);
    free(x);
    c->refs = NULL;
}

/* The subschema of resource root r named by anchor `name`, not looking
 * into nested resources. */
static const json_t *find_anchor(const struct gm__refs *x, int32_t r,
                                 const json_t *s, const char *name, int depth)
{
    if (!json_is_object(s) || depth > 256)
        return NULL;
    if (s != x->res[r].root && map_get(x, s) != r)
        return NULL; /* another resource */
    const json_t *a = json_object_get(s, "$anchor");
    if (json_is_string(a) && strcmp(json_string_value(a), name) == 0)
        return s;
    const json_t *found = NULL;
    for (size_t i = 0; !found && i < sizeof one_kw / sizeof *one_kw; i++)
        found = find_anchor(x, r, json_object_get(s, one_kw[i]), name,
                            depth + 1);
    for (size_t i = 0; !found && i < sizeof arr_kw / sizeof *arr_kw; i++) {
        const json_t *v = json_object_get(s, arr_kw[i]);
        for (size_t k = 0; !found && json_is_array(v) && k < json_array_size(v);
             k++)
            found = find_anchor(x, r, json_array_get(v, k), name, depth + 1);
    }
    for (size_t i = 0; !found && i < sizeof map_kw / sizeof *map_kw; i++) {
        const json_t *m = json_object_get(s, map_kw[i]);
        const char *k;
        const json_t *v;
        if (json_is_object(m))
            json_object_foreach((json_t *)m, k, v)
            {
                if ((found = find_anchor(x, r, v, name, depth + 1)) != NULL)
                    break;
            }
    }
    return found;
}

const json_t *gm__schema_resolve(const struct gm__sc *c, const json_t *from,
                                 const char *ref, char *why, size_t whylen)
{
    const struct gm__refs *x = c->refs;
    int32_t r = map_get(x, from);
    const char *hash = strchr(ref, '#');
    size_t n = hash != NULL ? (size_t)(hash - ref) : strlen(ref);
    const char *frag = hash != NULL ? hash + 1 : "";
    int32_t target = r;
    if (n > 0) {
        char *uri = uri_resolve(x->res[r].uri, ref, n);
        if (uri == NULL) {
            snprintf(why, whylen, "out of memory");
            return NULL;
        }
        target = -1;
        for (size_t i = 0; i < x->n_res && target < 0; i++)
            if (strcmp(x->res[i].uri, uri) == 0)
                target = (int32_t)i;
        if (target < 0) {
            snprintf(why, whylen,
                     "$ref \"%.100s\" names %.100s, which is not a resource "
                     "of this schema: only references inside the document "
                     "are supported",
                     ref, uri);
            free(uri);
            return NULL;
        }
        free(uri);
    }
    const json_t *root = x->res[target].root;
    if (frag[0] == '\0')
        return root;
    if (frag[0] == '/') {
        char *p = malloc(strlen(frag) + 2);
        if (p == NULL) {
            snprintf(why, whylen, "out of memory");
            return NULL;
        }
        p[0] = '#';
        strcpy(p + 1, frag);
        const json_t *t = gm__schema_pointer(root, p);
        free(p);
        if (t == NULL)
            snprintf(why, whylen, "$ref \"%.100s\" does not resolve", ref);
        return t;
    }
    const json_t *t = find_anchor(x, target, root, frag, 0);
    if (t == NULL)
        snprintf(why, whylen, "$ref \"%.100s\": no \"$anchor\" \"%.60s\"", ref,
                 frag);
    return t;
}
