/* gm_schema_obj.c — objects of a JSON Schema (gm_schema_internal.h):
 * properties, required, additionalProperties (true, false or a schema),
 * minProperties, maxProperties, propertyNames.
 *
 * What is generated: the listed properties in the order of `properties`,
 * then the required names `properties` lacks (their values follow
 * additionalProperties), each optional one may be left out; then, when
 * additionalProperties is a schema, any number of other members whose
 * keys differ from every listed name and whose values follow it. Such a
 * key is written in the canonical JSON form (one spelling per code
 * point: printable ASCII as itself, '"' and '\' and control characters
 * escaped one fixed way, the rest as UTF-8), so "differs from a listed
 * name" holds on the decoded strings that validators compare; where it
 * leaves a listed name's prefix it does so on an ASCII character (a
 * subset of the keys, never a wrong one). With additionalProperties true
 * or absent no other member is generated (valid either way).
 *
 * propertyNames: listed names are checked against it (an optional one
 * that fails is left out, a required one makes the schema unsatisfiable);
 * other members' keys come from its enum/const, or are bounded by its
 * minLength/maxLength. Other keywords there are refused.
 *
 * minProperties counts the listed members only (two other members could
 * share a key, and a JSON object keeps one of them), maxProperties every
 * member: a counting automaton over the listed properties, then a bounded
 * repeat of the others.
 */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_schema_internal.h"

struct prop {
    const char *name;
    size_t len;
    const json_t *schema; /* NULL: any value */
    int required;
    int unlisted; /* required but not in properties */
};

/* ---- code points and the canonical key form ----------------------------- */

/* Decodes one UTF-8 code point (valid input: jansson's strings). */
static uint32_t next_cp(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    uint32_t c = u[*i];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (*i + k > n)
        k = n - *i;
    if (k > 1) {
        c &= k == 2 ? 0x1F : k == 3 ? 0x0F : 0x07;
        for (size_t j = 1; j < k; j++)
            c = c << 6 | (u[*i + j] & 0x3F);
    }
    *i += k;
    return c;
}

static size_t cp_count(const char *s, size_t n)
{
    size_t i = 0, k = 0;
    while (i < n) {
        next_cp(s, n, &i);
        k++;
    }
    return k;
}

/* The canonical JSON spelling of code point c into out (NUL-terminated);
 * returns its length. */
static size_t canon(uint32_t c, char *out)
{
    static const char hex[] = "0123456789abcdef";
    if (c == '"' || c == '\\') {
        out[0] = '\\';
        out[1] = (char)c;
        out[2] = '\0';
        return 2;
    }
    if (c < 0x20) {
        const char *sh = c == '\b'   ? "\\b"
                         : c == '\f' ? "\\f"
                         : c == '\n' ? "\\n"
                         : c == '\r' ? "\\r"
                         : c == '\t' ? "\\t"
                                     : NULL;
        if (sh != NULL) {
            memcpy(out, sh, 3);
            return 2;
        }
        memcpy(out, "\\u00", 4);
        out[4] = hex[c >> 4];
        out[5] = hex[c & 15];
        out[6] = '\0';
        return 6;
    }
    if (c < 0x80) {
        out[0] = (char)c;
        out[1] = '\0';
        return 1;
    }
    size_t k = c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    for (size_t j = k; j-- > 1;) {
        out[j] = (char)(0x80 | (c & 0x3F));
        c >>= 6;
    }
    out[0] = (char)(k == 2 ? 0xC0 | c : k == 3 ? 0xE0 | c : 0xF0 | c);
    out[k] = '\0';
    return k;
}

/* Canonical characters (the shared parts built once per key set). */
struct canon_set {
    int32_t esc;   /* the escapes of '"', '\' and the controls */
    int32_t multi; /* well-formed multi-byte UTF-8 */
    int32_t any;   /* any canonical character */
};

static int is_escaped(unsigned c)
{
    return c < 0x20 || c == '"' || c == '\\';
}

/* The alternatives of the escapes of ASCII codes not in `not` (NULL:
 * all). */
static int32_t escapes(struct gm_ir *ir, const uint8_t * not )
{
    int32_t esc[40];
    size_t ne = 0;
    for (unsigned c = 0; c < 0x80; c++) {
        if (!is_escaped(c) || (not != NULL && ((not [c >> 3] >> (c & 7)) & 1)))
            continue;
        char e[8];
        canon(c, e);
        esc[ne++] = gm_ir_str(ir, e);
    }
    return gm_ir_alt(ir, esc, ne);
}

static void canon_init(struct gm_ir *ir, struct canon_set *cs)
{
    int32_t cont = gm_ir_range(ir, 0x80, 0xBF);
    uint8_t e1[32] = {0};
    for (unsigned c = 0xE1; c <= 0xEF; c++)
        if (c != 0xED)
            e1[c >> 3] |= (uint8_t)(1u << (c & 7));
    int32_t m[7] = {
        gm_ir_seq2(ir, gm_ir_range(ir, 0xC2, 0xDF), cont),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xE0, 0xE0),
                              gm_ir_range(ir, 0xA0, 0xBF), cont},
                  3),
        gm_ir_seq2(ir, gm_ir_class(ir, e1), gm_ir_repeat(ir, cont, 2, 2)),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xED, 0xED),
                              gm_ir_range(ir, 0x80, 0x9F), cont},
                  3),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xF0, 0xF0),
                              gm_ir_range(ir, 0x90, 0xBF),
                              gm_ir_repeat(ir, cont, 2, 2)},
                  3),
        gm_ir_seq2(ir, gm_ir_range(ir, 0xF1, 0xF3),
                   gm_ir_repeat(ir, cont, 3, 3)),
        gm_ir_seq(ir,
                  (int32_t[]){gm_ir_range(ir, 0xF4, 0xF4),
                              gm_ir_range(ir, 0x80, 0x8F),
                              gm_ir_repeat(ir, cont, 2, 2)},
                  3),
    };
    cs->multi = gm_ir_alt(ir, m, 7);
    cs->esc = escapes(ir, NULL);
    cs->any = -1;
}

/* A canonical character: printable ASCII but '"' and '\', the fixed
 * escapes, and well-formed multi-byte UTF-8 (gm_json's string characters
 * less the optional escapes). ASCII codes in `not` (may be NULL) are left
 * out; with `ascii_only`, every multi-byte character too. */
static int32_t canon_char(struct gm_ir *ir, struct canon_set *cs,
                          const uint8_t * not, int ascii_only)
{
    if (not == NULL && !ascii_only && cs->any >= 0)
        return cs->any;
    uint8_t plain[32] = {0};
    int esc_hit = 0;
    for (unsigned c = 0x20; c < 0x80; c++)
        if (!is_escaped(c) && (not == NULL || !((not [c >> 3] >> (c & 7)) & 1)))
            plain[c >> 3] |= (uint8_t)(1u << (c & 7));
    for (unsigned c = 0; not != NULL && c < 0x80; c++)
        esc_hit |= is_escaped(c) && ((not [c >> 3] >> (c & 7)) & 1);
    int32_t alts[3];
    size_t n = 0;
    alts[n++] = gm_ir_class(ir, plain);
    alts[n++] = esc_hit ? escapes(ir, not ) : cs->esc;
    if (!ascii_only)
        alts[n++] = cs->multi;
    int32_t e = gm_ir_alt(ir, alts, n);
    if (not == NULL && !ascii_only)
        cs->any = e;
    return e;
}

/* ---- keys that differ from a set of names ------------------------------ */

struct trie {
    uint32_t cp;         /* the code point into this node */
    int terminal;        /* a name ends here */
    size_t first, count; /* children: nodes[first .. first + count) */
};

struct keys {
    struct gm_ir *ir;
    struct canon_set cs;
    const char *const *name;
    const size_t *len;
    size_t n;
    uint32_t lo, hi; /* key length bounds in code points */
};

/* The body (after the opening quote, through the closing one) of
 * canonical strings of lo..hi code points that differ from every name
 * whose prefix of `depth` code points equals the current one; `idx`
 * lists those names, `pos` their byte offsets. */
static int32_t except(struct keys *k, const size_t *idx, const size_t *pos,
                      size_t m, uint32_t depth)
{
    struct gm_ir *ir = k->ir;
    int32_t alts[4];
    size_t na = 0;
    int ended = 0; /* one of the names ends here */
    for (size_t i = 0; i < m; i++)
        ended |= pos[i] == k->len[idx[i]];
    if (!ended && depth >= k->lo && depth <= k->hi)
        alts[na++] = gm_ir_str(ir, "\"");
    if (depth >= k->hi)
        return na > 0 ? alts[0] : gm_ir_alt(ir, NULL, 0);
    /* the next code points of the names that go on */
    size_t *nidx = malloc((m + 1) * sizeof(*nidx));
    size_t *npos = malloc((m + 1) * sizeof(*npos));
    uint32_t *cps = malloc((m + 1) * sizeof(*cps));
    if (nidx == NULL || npos == NULL || cps == NULL) {
        free(nidx);
        free(npos);
        free(cps);
        return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    }
    size_t nc = 0;
    uint8_t not [32] = {0};
    int non_ascii = 0;
    for (size_t i = 0; i < m; i++) {
        if (pos[i] == k->len[idx[i]])
            continue;
        size_t p = pos[i];
        uint32_t cp = next_cp(k->name[idx[i]], k->len[idx[i]], &p);
        size_t j = 0;
        while (j < nc && cps[j] != cp)
            j++;
        if (j == nc)
            cps[nc++] = cp;
        if (cp < 0x80)
            not [cp >> 3] |= (uint8_t)(1u << (cp & 7));
        else
            non_ascii = 1;
    }
    /* leave the names: another character, then any tail */
    uint32_t tlo = k->lo > depth + 1 ? k->lo - depth - 1 : 0;
    uint32_t thi = k->hi == GM_REPEAT_INF ? GM_REPEAT_INF : k->hi - depth - 1;
    int32_t any = canon_char(ir, &k->cs, NULL, 0);
    int32_t leave = gm_ir_seq(
        ir,
        (int32_t[]){canon_char(ir, &k->cs, not, non_ascii),
                    gm_ir_repeat(ir, any, tlo, thi), gm_ir_str(ir, "\"")},
        3);
    /* or follow each of them */
    int32_t *follow = malloc((nc + 1) * sizeof(*follow));
    if (follow == NULL) {
        free(nidx);
        free(npos);
        free(cps);
        return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    }
    for (size_t j = 0; j < nc; j++) {
        size_t mm = 0;
        for (size_t i = 0; i < m; i++) {
            if (pos[i] == k->len[idx[i]])
                continue;
            size_t p = pos[i];
            if (next_cp(k->name[idx[i]], k->len[idx[i]], &p) != cps[j])
                continue;
            nidx[mm] = idx[i];
            npos[mm++] = p;
        }
        char e[8];
        canon(cps[j], e);
        follow[j] = gm_ir_seq2(ir, gm_ir_str(ir, e),
                               except(k, nidx, npos, mm, depth + 1));
    }
    alts[na++] = leave;
    if (nc > 0)
        alts[na++] = gm_ir_alt(ir, follow, nc);
    free(follow);
    free(nidx);
    free(npos);
    free(cps);
    return gm_ir_alt(ir, alts, na);
}

/* The JSON string literal of a key of lo..hi code points differing from
 * every names[i]. */
static int32_t keys_except(struct gm_ir *ir, const char *const *names,
                           const size_t *lens, size_t n, uint32_t lo,
                           uint32_t hi)
{
    struct keys k = {
        .ir = ir, .name = names, .len = lens, .n = n, .lo = lo, .hi = hi};
    canon_init(ir, &k.cs);
    size_t *idx = malloc((n + 1) * sizeof(*idx));
    size_t *pos = calloc(n + 1, sizeof(*pos));
    if (idx == NULL || pos == NULL) {
        free(idx);
        free(pos);
        return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    int32_t body = except(&k, idx, pos, n, 0);
    free(idx);
    free(pos);
    return gm_ir_seq2(ir, gm_ir_str(ir, "\""), body);
}

/* ---- propertyNames --------------------------------------------------------- */

struct pnames {
    int any;          /* no constraint */
    int none;         /* false: no key at all */
    const json_t *en; /* enum/const values, or NULL */
    uint32_t lo, hi;  /* length bounds */
    struct gm_rx_item it[GM__SCHEMA_RX_MAX]; /* pattern, format */
    size_t n_it;
    int en_listed; /* the enum's names were made listed members */
};

static int32_t read_pnames(struct gm__sc *c, const json_t *s, struct pnames *p)
{
    memset(p, 0, sizeof(*p));
    p->hi = GM_REPEAT_INF;
    const json_t *n = json_object_get(s, "propertyNames");
    if (n == NULL || json_is_true(n)) {
        p->any = 1;
        return 0;
    }
    if (json_is_false(n)) {
        p->none = 1;
        return 0;
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)n, k, v)
    {
        if (strcmp(k, "type") == 0) {
            if (!(gm__schema_type_of(v) & GM__T_STRING))
                p->none = 1; /* keys are strings */
        } else if (strcmp(k, "enum") == 0 && json_is_array(v)) {
            p->en = v;
        } else if (strcmp(k, "const") == 0) {
            json_t *one = json_pack("[O]", (json_t *)v);
            p->en = gm__schema_own(c, one);
            if (p->en == NULL)
                return gm_ir_fail(c->ir, TG_ENOMEM, "out of memory");
        } else if (strcmp(k, "pattern") == 0 || strcmp(k, "format") == 0 ||
                   strcmp(k, "$gm:patterns") == 0) {
            continue; /* read below, all together */
        } else if (strcmp(k, "minLength") == 0 && json_is_number(v)) {
            p->lo = (uint32_t)json_number_value(v);
        } else if (strcmp(k, "maxLength") == 0 && json_is_number(v)) {
            double d = json_number_value(v);
            p->hi = d > 1e9 ? GM_REPEAT_INF : (uint32_t)d;
        } else if (strcmp(k, "title") != 0 && strcmp(k, "description") != 0 &&
                   strcmp(k, "$comment") != 0) {
            return gm__schema_fail(c, TG_EUNSUPPORTED,
                                   "\"propertyNames\" with \"%s\" is not "
                                   "supported (type, enum, const, "
                                   "minLength, maxLength, pattern and "
                                   "format are)",
                                   k);
        }
    }
    return gm__schema_string_items(c, n, p->it, GM__SCHEMA_RX_MAX, &p->n_it);
}

/* 1 when key [name, name + len) is valid against p, 0 when not, or a
 * regex code (message in err). */
static int pname_ok(const struct pnames *p, const char *name, size_t len)
{
    char err[256];
    if (!p->none && !p->any && p->n_it > 0) {
        int r = gm_regex_test(p->it, p->n_it, 0, GM_REPEAT_INF, name, len, err,
                              sizeof err);
        if (r <= 0)
            return r;
    }
    if (p->none)
        return 0;
    if (p->any)
        return 1;
    if (p->en != NULL) {
        size_t i;
        const json_t *x;
        int in = 0;
        json_array_foreach(p->en, i, x)
            in |= json_is_string(x) && json_string_length(x) == len &&
                  memcmp(json_string_value(x), name, len) == 0;
        if (!in)
            return 0;
    }
    size_t n = cp_count(name, len);
    return n >= p->lo && (p->hi == GM_REPEAT_INF || n <= p->hi);
}

/* ---- the object ------------------------------------------------------------- */

/* "name" ws ":" sep value ws, the value's rule given. */
static int32_t member(struct gm__sc *c, int32_t key, int32_t val)
{
    struct gm_ir *ir = c->ir;
    int32_t ws = gm_json_ws(c->j);
    return gm_ir_seq(ir,
                     (int32_t[]){key, ws, gm_ir_str(ir, ":"),
                                 gm_json_ws_sep(c->j), gm_ir_ref(ir, val), ws},
                     6);
}

struct dp {
    struct gm__sc *c;
    const struct prop *p;
    size_t n;
    const int32_t *mem; /* (n) member expressions */
    int32_t extra;      /* an extra member, -1: none */
    uint32_t mn, mx;    /* listed members at least / members at most */
    uint32_t cap;       /* counts kept exactly up to here */
    int32_t *memo;      /* (n + 1) x (cap + 1) x 2 */
};

/* The members from listed index i on, c listed written, first: none
 * written yet (no comma before the next). */
static int32_t dp_expr(struct dp *d, size_t i, uint32_t c, int first)
{
    struct gm_ir *ir = d->c->ir;
    size_t slot = (i * (d->cap + 1) + c) * 2 + (size_t)first;
    if (d->memo[slot] != INT32_MIN)
        return d->memo[slot];
    int32_t comma = gm_ir_seq2(ir, gm_ir_str(ir, ","), gm_json_ws_sep(d->c->j));
    int32_t e;
    if (i == d->n) {
        /* the others: c members so far, at most mx in all */
        if (c < d->mn) {
            e = gm_ir_alt(ir, NULL, 0);
        } else if (d->extra < 0 || (d->mx != GM_REPEAT_INF && c >= d->mx)) {
            e = gm_ir_empty(ir);
        } else {
            uint32_t room = d->mx == GM_REPEAT_INF ? GM_REPEAT_INF : d->mx - c;
            if (first) {
                int32_t more = gm_ir_repeat(
                    ir, gm_ir_seq2(ir, comma, d->extra), 0,
                    room == GM_REPEAT_INF ? GM_REPEAT_INF : room - 1);
                e = gm_ir_opt(ir, gm_ir_seq2(ir, d->extra, more));
            } else {
                e = gm_ir_repeat(ir, gm_ir_seq2(ir, comma, d->extra), 0, room);
            }
        }
    } else {
        int32_t alts[2];
        size_t na = 0;
        if (d->mx == GM_REPEAT_INF || c < d->mx) {
            uint32_t c2 = c + 1 > d->cap ? d->cap : c + 1;
            int32_t m = first ? d->mem[i] : gm_ir_seq2(ir, comma, d->mem[i]);
            alts[na++] = gm_ir_seq2(ir, m, dp_expr(d, i + 1, c2, 0));
        }
        if (!d->p[i].required)
            alts[na++] = dp_expr(d, i + 1, c, first);
        e = gm_ir_alt(ir, alts, na);
    }
    d->memo[slot] = e;
    return e;
}

int32_t gm__schema_object(struct gm__sc *c, const json_t *s)
{
    struct gm_ir *ir = c->ir;
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    int closed = json_is_false(addl);
    int extras = json_is_object(addl);
    uint32_t mn = 0, mx = GM_REPEAT_INF;
    int32_t rc = gm__schema_counts(c, s, "minProperties", "maxProperties", &mn,
                                   &mx);
    if (rc < 0)
        return rc;
    struct pnames pn;
    if ((rc = read_pnames(c, s, &pn)) < 0)
        return rc;
    const json_t *pp = json_object_get(s, "patternProperties");
    size_t n_pp = pp != NULL ? json_object_size(pp) : 0;
    if (n_pp > GM__SCHEMA_RX_MAX)
        return gm__schema_fail(c, TG_ETOOBIG, "more than %d patternProperties",
                               GM__SCHEMA_RX_MAX);
    struct gm_rx_item pat[GM__SCHEMA_RX_MAX];
    const json_t *pat_schema[GM__SCHEMA_RX_MAX];
    {
        size_t k = 0;
        const char *key;
        size_t kl;
        json_t *v;
        void *tmp;
        if (pp != NULL)
            json_object_keylen_foreach_safe((json_t *)pp, tmp, key, kl, v)
            {
                pat[k] = (struct gm_rx_item){
                    .text = key, .len = kl, .kind = GM_RX_SEARCH};
                pat_schema[k++] = v;
            }
    }
    if (props == NULL && req == NULL && !closed && !extras && mn == 0 &&
        mx == GM_REPEAT_INF && pn.any && n_pp == 0)
        return gm_ir_ref(ir, gm_json_object(c->j));
    size_t n_props = props != NULL ? json_object_size(props) : 0;
    size_t n_req = req != NULL ? json_array_size(req) : 0;
    size_t n_en = extras && pn.en != NULL ? json_array_size(pn.en) : 0;
    struct prop *p = calloc(n_props + n_req + n_en + 1, sizeof(*p));
    int32_t *mem = malloc((n_props + n_req + n_en + 1) * sizeof(*mem));
    if (p == NULL || mem == NULL) {
        free(p);
        free(mem);
        return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    }
    size_t n = 0;
    if (props != NULL) {
        const char *key;
        size_t kl;
        json_t *v;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)props, tmp, key, kl, v)
        {
            p[n].name = key;
            p[n].len = kl;
            p[n].schema = v;
            n++;
        }
    }
    size_t i;
    const json_t *x;
    if (req != NULL)
        json_array_foreach(req, i, x)
        {
            const char *k = json_string_value(x);
            size_t kl = json_string_length(x);
            size_t at = 0;
            while (at < n &&
                   !(p[at].len == kl && memcmp(p[at].name, k, kl) == 0))
                at++;
            int by_pattern = 0;
            for (size_t j = 0; at == n && j < n_pp; j++) {
                char err[256];
                by_pattern |= gm_regex_test(&pat[j], 1, 0, GM_REPEAT_INF, k, kl,
                                            err, sizeof err) == 1;
            }
            if (at == n) {
                if (closed && !by_pattern) {
                    rc = gm__schema_fail(
                        c, TG_EINVAL,
                        "required property \"%.*s\" is not in \"properties\" "
                        "and additionalProperties is false: no document "
                        "satisfies it",
                        (int)(kl > 64 ? 64 : kl), k);
                    break;
                }
                p[n].name = k;
                p[n].len = kl;
                p[n].schema = extras ? addl : NULL;
                p[n].unlisted = 1;
                n++;
            }
            p[at].required = 1;
        }
    /* Other members whose keys propertyNames enumerates are generated as
     * listed ones, each once and all of them: distinct keys for certain,
     * and the whole set that a client's record over an enum (zod's
     * z.record(z.enum(...), ...)) wants. */
    for (size_t q = 0; rc >= 0 && q < n_en; q++) {
        const json_t *x2 = json_array_get(pn.en, q);
        if (!json_is_string(x2))
            continue;
        const char *nm = json_string_value(x2);
        size_t nl = json_string_length(x2);
        int dup = 0;
        for (size_t k2 = 0; k2 < n; k2++)
            dup |= p[k2].len == nl && memcmp(p[k2].name, nm, nl) == 0;
        if (dup)
            continue;
        p[n] = (struct prop){
            .name = nm, .len = nl, .schema = addl, .required = 1, .unlisted = 1};
        n++;
    }
    if (n_en > 0)
        pn.en_listed = 1;
    /* propertyNames on the listed names: drop the optional ones it
     * refuses, fail on a required one */
    size_t w = 0;
    for (size_t k = 0; rc >= 0 && k < n; k++) {
        int ok = pname_ok(&pn, p[k].name, p[k].len);
        if (ok < 0) {
            rc = gm__schema_fail(c, ok,
                                 "\"propertyNames\": its pattern or "
                                 "format cannot be compiled");
        } else if (ok) {
            p[w++] = p[k];
        } else if (p[k].required) {
            rc = gm__schema_fail(c, TG_EINVAL,
                                 "required property \"%.*s\" is not valid "
                                 "against \"propertyNames\": no document "
                                 "satisfies it",
                                 (int)(p[k].len > 64 ? 64 : p[k].len),
                                 p[k].name);
        }
    }
    n = w;
    /* the listed members */
    for (size_t k = 0; rc >= 0 && k < n; k++) {
        json_t *kj = json_stringn(p[k].name, p[k].len);
        char *kt = kj != NULL ? json_dumps(kj, JSON_ENCODE_ANY) : NULL;
        json_decref(kj);
        if (kt == NULL) {
            rc = gm_ir_fail(ir, TG_ENOMEM, "out of memory");
            break;
        }
        int32_t key = gm_ir_str(ir, kt);
        free(kt);
        /* patternProperties whose pattern the name matches apply too; a
         * name matched by one is not additional */
        json_t *all = n_pp > 0 ? json_array() : NULL;
        for (size_t j = 0; rc >= 0 && j < n_pp; j++) {
            char err[256];
            int m = gm_regex_test(&pat[j], 1, 0, GM_REPEAT_INF, p[k].name,
                                  p[k].len, err, sizeof err);
            if (m < 0)
                rc = gm__schema_fail(c, m, "patternProperties: %s", err);
            else if (m)
                json_array_append(all, (json_t *)pat_schema[j]);
        }
        if (rc < 0) {
            json_decref(all);
            break;
        }
        if (all != NULL && json_array_size(all) > 0) {
            if (p[k].schema != NULL && !(p[k].unlisted && extras))
                json_array_append(all, (json_t *)p[k].schema);
            const json_t *both = gm__schema_own(
                c, json_pack("{so}", "allOf", all));
            if (both == NULL) {
                rc = gm_ir_fail(ir, TG_ENOMEM, "out of memory");
                break;
            }
            p[k].schema = both;
            p[k].unlisted = 0;
        } else {
            json_decref(all);
        }
        int32_t val;
        if (p[k].schema == NULL) {
            val = gm_json_value(c->j);
        } else {
            int listed = props != NULL &&
                         json_object_getn(props, p[k].name, p[k].len) != NULL;
            size_t old = gm__schema_path_push(
                c, listed ? "properties" : "additionalProperties",
                listed ? 10 : 20);
            size_t old2 = listed ? gm__schema_path_push(c, p[k].name, p[k].len)
                                 : old;
            val = gm__schema_sub(c, p[k].schema);
            gm__schema_path_pop(c, old2);
            gm__schema_path_pop(c, old);
        }
        mem[k] = val < 0 ? val : member(c, key, val);
        if (mem[k] < 0)
            rc = mem[k];
    }
    /* the others */
    int32_t extra = -1;
    int rx_keys = n_pp > 0 || pn.n_it > 0;
    if (rc >= 0 && (extras || n_pp > 0) && !pn.none && !rx_keys &&
        !pn.en_listed) {
        size_t old = gm__schema_path_push(c, "additionalProperties", 20);
        int32_t val = gm__schema_sub(c, addl);
        gm__schema_path_pop(c, old);
        int32_t key = -1;
        const char **names = malloc((n + 1) * sizeof(*names));
        size_t *lens = malloc((n + 1) * sizeof(*lens));
        if (names == NULL || lens == NULL) {
            key = gm_ir_fail(ir, TG_ENOMEM, "out of memory");
        } else {
            for (size_t k = 0; k < n; k++) {
                names[k] = p[k].name;
                lens[k] = p[k].len;
            }
            if (pn.en != NULL) {
                /* the enum's names that are not listed */
                int32_t alts[256];
                size_t na = 0;
                json_array_foreach(pn.en, i, x)
                {
                    if (!json_is_string(x) || na == 256 ||
                        pname_ok(&pn, json_string_value(x),
                                 json_string_length(x)) <= 0)
                        continue;
                    int dup = 0;
                    for (size_t k = 0; k < n; k++)
                        dup |= lens[k] == json_string_length(x) &&
                               memcmp(names[k], json_string_value(x),
                                      lens[k]) == 0;
                    char *t = dup ? NULL : json_dumps(x, JSON_ENCODE_ANY);
                    if (t != NULL)
                        alts[na++] = gm_ir_str(ir, t);
                    free(t);
                }
                key = na > 0 ? gm_ir_alt(ir, alts, na) : -1;
            } else {
                key = keys_except(ir, names, lens, n, pn.lo, pn.hi);
            }
        }
        free(names);
        free(lens);
        if (val < 0)
            rc = val;
        else if (key < -1)
            rc = key;
        else if (key >= 0)
            extra = member(c, key, val);
    } else if (rc >= 0 && (extras || n_pp > 0) && !pn.none) {
        /* keys by their regex conditions: for pattern j, matching it and
         * no other pattern (a key two patterns match is not generated)
         * and no listed name; for additionalProperties, matching no
         * pattern; propertyNames' conditions on all of them */
        size_t cap = n_pp + n + pn.n_it + 1;
        struct gm_rx_item *it = malloc(cap * sizeof(*it));
        int32_t groups[GM__SCHEMA_RX_MAX + 1];
        size_t ng = 0;
        if (it == NULL)
            rc = gm_ir_fail(ir, TG_ENOMEM, "out of memory");
        for (size_t g = 0; rc >= 0 && g <= n_pp; g++) {
            if (g == n_pp && !extras)
                break;
            size_t k = 0;
            for (size_t j = 0; j < n_pp; j++) {
                it[k] = pat[j];
                it[k++].negate = j != g;
            }
            for (size_t q = 0; q < n; q++)
                it[k++] = (struct gm_rx_item){.text = p[q].name,
                                              .len = p[q].len,
                                              .kind = GM_RX_LITERAL,
                                              .negate = 1};
            for (size_t q = 0; q < pn.n_it; q++)
                it[k++] = pn.it[q];
            char err[384];
            int32_t key = gm_regex_json_string_items(ir, it, k, pn.lo, pn.hi,
                                                     err, sizeof err);
            if (key == TG_EINVAL && ir->err == 0)
                continue; /* no such key: nothing to generate */
            if (key < 0) {
                rc = ir->err != 0 ? ir->err
                                  : gm__schema_fail(c, key, "%s", err);
                break;
            }
            const json_t *vs = g < n_pp ? pat_schema[g] : addl;
            size_t old = gm__schema_path_push(
                c, g < n_pp ? "patternProperties" : "additionalProperties",
                g < n_pp ? 17 : 20);
            size_t old2 = g < n_pp
                              ? gm__schema_path_push(c, pat[g].text, pat[g].len)
                              : old;
            int32_t val = gm__schema_sub(c, vs);
            gm__schema_path_pop(c, old2);
            gm__schema_path_pop(c, old);
            if (val < 0) {
                rc = val;
                break;
            }
            groups[ng++] = member(c, gm_ir_ref(ir, key), val);
        }
        free(it);
        if (rc >= 0 && ng > 0)
            extra = gm_ir_alt(ir, groups, ng);
    }
    if (rc >= 0 && mn > n)
        rc = gm__schema_fail(c, TG_EUNSUPPORTED,
                             "\"minProperties\" %u is more than the %zu "
                             "listed properties (other members cannot be "
                             "kept distinct)",
                             mn, n);
    int32_t body = rc;
    if (rc >= 0) {
        struct dp d = {.c = c,
                       .p = p,
                       .n = n,
                       .mem = mem,
                       .extra = extra,
                       .mn = mn,
                       .mx = mx};
        d.cap = mx != GM_REPEAT_INF ? (mx > (uint32_t)n ? (uint32_t)n : mx)
                                    : mn;
        size_t cells = (n + 1) * ((size_t)d.cap + 1) * 2;
        d.memo = malloc(cells * sizeof(*d.memo));
        if (d.memo == NULL) {
            body = gm_ir_fail(ir, TG_ENOMEM, "out of memory");
        } else {
            for (size_t k = 0; k < cells; k++)
                d.memo[k] = INT32_MIN;
            body = dp_expr(&d, 0, 0, 1);
            free(d.memo);
        }
    }
    free(p);
    free(mem);
    if (body < 0)
        return body;
    int32_t ws = gm_json_ws(c->j);
    return gm_ir_seq(
        ir, (int32_t[]){gm_ir_str(ir, "{"), ws, body, gm_ir_str(ir, "}")}, 4);
}
