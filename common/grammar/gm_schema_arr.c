/* gm_schema_arr.c — arrays of a JSON Schema (gm_schema_internal.h):
 * prefixItems, items (a schema, false, or draft 2019-09's array of
 * schemas with additionalItems), minItems, maxItems, contains with
 * minContains and maxContains, uniqueItems.
 *
 * Element i is generated from prefixItems[i] while there is one (every
 * position of the prefix, when maxItems allows), then
 * from `items` (any value when absent, none when false). With `contains`,
 * the elements after the prefix start with minContains (default 1) of
 * `items` and `contains` together; every other element must provably not
 * match `contains` when maxContains is given (gm__schema_exclusive), or
 * the schema is refused: a stray match would break the maximum.
 * uniqueItems true is enforced only where it holds by construction (at
 * most one element); otherwise refused, as no automaton can compare
 * elements.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_schema_internal.h"

/* The rule of subschema v, compiled under the pointer seg[/index]. */
static int32_t sub_at(struct gm__sc *c, const json_t *v, const char *seg,
                      long index)
{
    size_t old = gm__schema_path_push(c, seg, strlen(seg));
    size_t old2 = index >= 0 ? gm__schema_path_index(c, (size_t)index) : old;
    int32_t r = gm__schema_sub(c, v);
    gm__schema_path_pop(c, old2);
    gm__schema_path_pop(c, old);
    return r;
}

/* A count keyword (absent: def). */
static uint32_t count_kw(const json_t *s, const char *k, uint32_t def)
{
    const json_t *v = json_object_get(s, k);
    if (v == NULL)
        return def;
    double d = json_number_value(v);
    return d > (double)GM_REPEAT_INF - 1 ? GM_REPEAT_INF - 1 : (uint32_t)d;
}

int32_t gm__schema_array(struct gm__sc *c, const json_t *s)
{
    struct gm_ir *ir = c->ir;
    uint32_t lo, hi;
    int32_t rc = gm__schema_counts(c, s, "minItems", "maxItems", &lo, &hi);
    if (rc < 0)
        return rc;
    const json_t *prefix = json_object_get(s, "prefixItems");
    const json_t *items = json_object_get(s, "items");
    const json_t *rest = items;
    const char *rest_kw = "items";
    if (json_is_array(items)) { /* 2019-09 tuple form */
        if (prefix != NULL)
            return gm__schema_fail(c, TG_EFORMAT,
                                   "\"items\" as an array next to "
                                   "\"prefixItems\"");
        prefix = items;
        rest = json_object_get(s, "additionalItems");
        rest_kw = "additionalItems";
    } else if (json_object_get(s, "additionalItems") != NULL &&
               prefix == NULL) {
        rest = items; /* additionalItems applies only after an items array */
    }
    size_t k = json_is_array(prefix) ? json_array_size(prefix) : 0;
    int rest_none = json_is_false(rest);
    /* Tuples are generated whole where the bounds allow: a shorter array
     * is valid JSON Schema, but clients that check with the schema's
     * source (zod's tuple()) want every position. */
    if (k > 0 && lo < k && (hi == GM_REPEAT_INF || hi >= k))
        lo = (uint32_t)k;
    if (rest_none && hi > k)
        hi = (uint32_t)k;
    if (lo > hi)
        return gm__schema_fail(c, TG_EINVAL,
                               "at least %u items are required but at most "
                               "%u are allowed: no document satisfies it",
                               lo, hi);
    const json_t *uq = json_object_get(s, "uniqueItems");
    if (json_is_true(uq) && hi > 1)
        return gm__schema_fail(c, TG_EUNSUPPORTED,
                               "\"uniqueItems\": true is not supported (no "
                               "grammar compares elements) unless "
                               "maxItems is at most 1");
    const json_t *cont = json_object_get(s, "contains");
    uint32_t cmin = 0, cmax = GM_REPEAT_INF;
    if (cont != NULL) {
        cmin = count_kw(s, "minContains", 1);
        cmax = json_object_get(s, "maxContains") != NULL
                   ? count_kw(s, "maxContains", 0)
                   : GM_REPEAT_INF;
        if (cmin > cmax)
            return gm__schema_fail(c, TG_EINVAL,
                                   "\"minContains\" is above \"maxContains\": "
                                   "no document satisfies it");
        if (json_is_false(cont) && cmin > 0)
            return gm__schema_fail(c, TG_EINVAL,
                                   "\"contains\": false with a minimum: no "
                                   "document satisfies it");
    }
    int32_t ws = gm_json_ws(c->j), sep = gm_json_ws_sep(c->j);
    int32_t comma = gm_ir_seq2(ir, gm_ir_str(ir, ","), sep);
    /* element expressions: prefix[i] and the rest */
    int32_t *pe = k > 0 ? malloc(k * sizeof(*pe)) : NULL;
    if (k > 0 && pe == NULL)
        return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < k && rc >= 0; i++) {
        rc = sub_at(c, json_array_get(prefix, i),
                    json_is_array(items) ? "items" : "prefixItems", (long)i);
        pe[i] = rc >= 0 ? gm_ir_seq2(ir, gm_ir_ref(ir, rc), ws) : rc;
    }
    int32_t re = -1; /* the rest's element, -1: none */
    if (rc >= 0 && !rest_none) {
        rc = rest == NULL ? gm_json_value(c->j) : sub_at(c, rest, rest_kw, -1);
        re = rc >= 0 ? gm_ir_seq2(ir, gm_ir_ref(ir, rc), ws) : rc;
    }
    /* contains: its elements, and the others' proof when bounded */
    int32_t ce = -1;
    if (rc >= 0 && cont != NULL && cmax != GM_REPEAT_INF) {
        /* every element not made to match contains must provably not */
        for (size_t i = 0; i <= k && rc >= 0; i++) {
            const json_t *o = i < k ? json_array_get(prefix, i) : rest;
            if (i == k && rest_none)
                break;
            int ex = o == NULL ? 0
                               : gm__schema_exclusive(c, o, cont, ir->deadline);
            if (ex == TG_ETIMEDOUT) {
                gm_ir_late(ir);
                rc = ir->err;
            } else if (!ex) {
                rc = gm__schema_fail(
                    c, TG_EUNSUPPORTED,
                    "\"maxContains\": elements of %s may also match "
                    "\"contains\", which would break the maximum",
                    i < k ? "prefixItems" : rest_kw);
            }
        }
    }
    if (rc >= 0 && cont != NULL && cmin > 0) {
        if (k > 0) {
            /* the contains elements come after the prefix */
            if (lo < k + cmin)
                lo = (uint32_t)k + cmin;
        } else if (lo < cmin) {
            lo = cmin;
        }
        if (lo > hi || rest_none)
            rc = gm__schema_fail(c, TG_EUNSUPPORTED,
                                 "\"contains\" needs %u more element(s) than "
                                 "the array may hold here",
                                 cmin);
        if (rc >= 0) {
            /* both the rest's schema and contains: their conjunction */
            json_t *both = rest != NULL
                               ? json_pack("{s[OO]}", "allOf", (json_t *)rest,
                                           (json_t *)cont)
                               : json_incref((json_t *)cont);
            const json_t *owned = gm__schema_own(c, both);
            rc = owned == NULL ? gm_ir_fail(ir, TG_ENOMEM, "out of memory")
                               : sub_at(c, owned, "contains", -1);
            ce = rc >= 0 ? gm_ir_seq2(ir, gm_ir_ref(ir, rc), ws) : rc;
        }
    }
    if (rc < 0) {
        free(pe);
        return rc;
    }
    /* Build from the end: tail(i) = the elements from index i on, i
     * written already. After the prefix: `cmin` contains elements, then
     * the rest's. */
    uint32_t kk = (uint32_t)k;
    int32_t tail;
    {
        uint32_t done = kk + (ce >= 0 ? cmin : 0);
        uint32_t rlo = lo > done ? lo - done : 0;
        uint32_t rhi = hi == GM_REPEAT_INF ? GM_REPEAT_INF
                                           : (hi > done ? hi - done : 0);
        if (re < 0 || rhi == 0) {
            tail = rlo == 0 ? gm_ir_empty(ir) : gm_ir_alt(ir, NULL, 0);
        } else if (done == 0) {
            int32_t more = gm_ir_repeat(
                ir, gm_ir_seq2(ir, comma, re), rlo > 0 ? rlo - 1 : 0,
                rhi == GM_REPEAT_INF ? GM_REPEAT_INF : rhi - 1);
            tail = gm_ir_seq2(ir, re, more);
            if (rlo == 0)
                tail = gm_ir_opt(ir, tail);
        } else {
            tail = gm_ir_repeat(ir, gm_ir_seq2(ir, comma, re), rlo, rhi);
        }
        if (ce >= 0) {
            /* cmin contains elements first (kk + cmin <= hi checked) */
            int32_t cs = kk == 0 ? gm_ir_seq2(ir, ce,
                                              gm_ir_repeat(
                                                  ir, gm_ir_seq2(ir, comma, ce),
                                                  cmin - 1, cmin - 1))
                                 : gm_ir_repeat(ir, gm_ir_seq2(ir, comma, ce),
                                                cmin, cmin);
            tail = gm_ir_seq2(ir, cs, tail);
        }
    }
    for (uint32_t i = kk; i-- > 0;) {
        if (i >= hi) { /* no element i: the array ends before it */
            tail = i >= lo ? gm_ir_empty(ir) : gm_ir_alt(ir, NULL, 0);
            continue;
        }
        /* element i (with a comma after the first) then the tail, or the
         * array ends here when i >= lo */
        int32_t el = i == 0 ? pe[i] : gm_ir_seq2(ir, comma, pe[i]);
        int32_t go = gm_ir_seq2(ir, el, tail);
        tail = i >= lo ? gm_ir_alt2(ir, gm_ir_empty(ir), go) : go;
    }
    free(pe);
    return gm_ir_seq(
        ir, (int32_t[]){gm_ir_str(ir, "["), ws, tail, gm_ir_str(ir, "]")}, 4);
}
