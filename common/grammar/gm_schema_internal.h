/*
 * gm_schema_internal.h — what gm_schema.c and gm_schema_excl.c share: JSON
 * type bits, local $ref resolution, and the exclusivity test of oneOf
 * alternatives. Internal to common/grammar.
 */
#ifndef GM_SCHEMA_INTERNAL_H
#define GM_SCHEMA_INTERNAL_H

#include <jansson.h>

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
 * against schema `b` (both in the document `root`, $refs resolved there);
 * 0 when that could not be proven; TG_ETIMEDOUT past `deadline`
 * (CLOCK_MONOTONIC seconds, 0: none). Conservative: a 1 is always
 * right. */
int gm__schema_exclusive(const json_t *root, const json_t *a, const json_t *b,
                         double deadline);

#endif /* GM_SCHEMA_INTERNAL_H */
