/*
 * gm_schema_internal.h — what gm_schema.c and gm_schema_excl.c share: JSON
 * type bits, local $ref resolution, and the exclusivity test of oneOf
 * alternatives. Internal to common/grammar.
 */
#ifndef GM_SCHEMA_INTERNAL_H
#define GM_SCHEMA_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_hmap.h"
#include "common/grammar/gm_json.h"
#include "common/grammar/gm_schema.h"

/* JSON types as sets. A number is INT when its value is integral (1, 1.0,
 * 1e2: what JSON Schema's "integer" accepts) and FRAC otherwise; the
 * "number" type is INT | FRAC. */
#define GM__T_OBJECT 0x01u
#define GM__T_ARRAY 0x02u
#define GM__T_STRING 0x04u
#define GM__T_INT 0x08u
#define GM__T_FRAC 0x10u
#define GM__T_BOOL 0x20u
#define GM__T_NULL 0x40u
#define GM__T_ALL 0x7fu

/* The type set of a type name ("number" -> INT | FRAC), 0 when unknown. */
unsigned gm__schema_type_bits(const char *name);

/* The type set of `type` (a name or a list of names); 0 when malformed. */
unsigned gm__schema_type_of(const json_t *type);

/* The type set a JSON value belongs to (one bit). */
unsigned gm__schema_value_type(const json_t *v);

/* The value `ref` points to in `root`: "#" or "#/a/b" (a JSON pointer in
 * a URI fragment: %XX decoded, then ~1 -> '/', ~0 -> '~'); NULL when it
 * does not resolve. */
const json_t *gm__schema_pointer(const json_t *root, const char *ref);

/* 1 when `a` and `b` are equal as JSON Schema compares instances
 * (numbers by value, 1 == 1.0; true != 1), else 0. */
int gm__schema_equal(const json_t *a, const json_t *b);

/* 1 when no document gm_schema_compile generates from schema `a` is valid
 * against schema `b` (both in c's document, $refs resolved there);
 * 0 when that could not be proven; TG_ETIMEDOUT past `deadline`
 * (CLOCK_MONOTONIC seconds, 0: none). Conservative: a 1 is always
 * right. */
struct gm__sc;
int gm__schema_exclusive(const struct gm__sc *c, const json_t *a,
                         const json_t *b, double deadline);

/* ---- the compiler's state (gm_schema.c), shared by its keyword files */

struct gm__memo {
    const json_t *s;
    int32_t rule;
};

struct gm__refs; /* gm_schema_ref.c */

struct gm__sc {
    struct gm_json *j;
    struct gm_ir *ir;
    const json_t *root;
    struct gm__refs *refs; /* the document's resources */
    json_t *owned;         /* schemas made while compiling (an array) */
    struct gm_schema_opts o;
    struct tg_hmap memo; /* struct gm__memo slots, keyed by schema address */
    char path[512]; /* JSON pointer of the schema being compiled */
    size_t plen;
    int depth;
    int32_t never;
};

/* Records failure `code` with a printf message followed by " at " and the
 * JSON pointer being compiled, in the IR; returns the IR's code. */
int32_t gm__schema_fail(struct gm__sc *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The JSON pointer: push a segment (returns the old length), push an array
 * index, pop back to a length. */
size_t gm__schema_path_push(struct gm__sc *c, const char *seg, size_t n);
size_t gm__schema_path_index(struct gm__sc *c, size_t i);
void gm__schema_path_pop(struct gm__sc *c, size_t old);

/* Keeps schema v (a new reference, taken; NULL: out of memory) alive
 * until the compile ends and returns it, or NULL. */
const json_t *gm__schema_own(struct gm__sc *c, json_t *v);

/* The rule of subschema s (compiled once per schema object, memoized by
 * its address), or a code. */
int32_t gm__schema_sub(struct gm__sc *c, const json_t *s);

/* The bounds of count keywords kmin/kmax of s (absent: 0 and
 * GM_REPEAT_INF; above the cap: a max capped, a min refused). Returns 0
 * or a code. */
int32_t gm__schema_counts(struct gm__sc *c, const json_t *s, const char *kmin,
                          const char *kmax, uint32_t *lo, uint32_t *hi);

/* ---- strings (gm_schema.c) ------------------------------------------------ */

#define GM__SCHEMA_RX_MAX 16 /* conditions on one string */

struct gm_rx_item;
/* The regex conditions of s's string keywords (pattern, the merged
 * patterns of allOf, a format the engine knows) into it[0..*n). Returns 0
 * or a code (recorded). */
int gm__schema_string_items(struct gm__sc *c, const json_t *s,
                            struct gm_rx_item *it, size_t cap, size_t *n);

/* ---- objects (gm_schema_obj.c) ------------------------------------------ */

/* The expression of the objects valid against s's object keywords
 * (properties, required, additionalProperties, minProperties,
 * maxProperties, propertyNames), or a code. */
int32_t gm__schema_object(struct gm__sc *c, const json_t *s);

/* ---- arrays (gm_schema_arr.c) -------------------------------------------- */

/* The expression of the arrays valid against s's array keywords
 * (prefixItems, items, additionalItems, minItems, maxItems, contains,
 * minContains, maxContains, uniqueItems), or a code. */
int32_t gm__schema_array(struct gm__sc *c, const json_t *s);

/* ---- allOf and keywords beside combinators (gm_schema_merge.c) ------------ */

/* 1 when s has allOf, or $ref/anyOf/oneOf beside assertion keywords or
 * each other: it is compiled as gm__schema_merge(s). */
int gm__schema_needs_merge(const json_t *s);

/* A schema equivalent to s with allOf and the implicit allOf of its
 * combinators opened and merged (owned by c), or NULL with the failure
 * recorded. */
const json_t *gm__schema_merge(struct gm__sc *c, const json_t *s);

/* "not": *rest = s without it (owned by c); 1 when no document generated
 * from *rest can be valid against it (gm__schema_exclusive) or s has
 * none, 0 when that could not be proven, or a code. */
int gm__schema_not_proven(struct gm__sc *c, const json_t *s,
                          const json_t **rest);

/* ---- references (gm_schema_ref.c) ---------------------------------------- */

/* Indexes c->root's resources ($id) by base URI and every subschema by
 * its resource. Returns 0 or a code (recorded in the IR). */
int gm__schema_refs_build(struct gm__sc *c);
void gm__schema_refs_free(struct gm__sc *c);

/* The schema that `ref` (a $ref's value) in schema `from` points to,
 * resolved against from's resource; NULL with the reason in why. */
const json_t *gm__schema_resolve(const struct gm__sc *c, const json_t *from,
                                 const char *ref, char *why, size_t whylen);

/* ---- numbers (gm_schema_num.c) ---------------------------------------- */

/* The expression of the JSON numbers of type set `types` (GM__T_INT,
 * GM__T_FRAC or both) valid against s's numeric keywords (minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum, multipleOf), or a code
 * (recorded in the IR, naming the keyword). */
int32_t gm__schema_number(struct gm__sc *c, const json_t *s, unsigned types);

#endif /* GM_SCHEMA_INTERNAL_H */
