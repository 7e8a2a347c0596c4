/*
 * gm_schema.h — a JSON Schema subset compiled into grammar IR rules whose
 * documents are valid against the schema.
 *
 * Supported (everything else is refused, naming the keyword and its JSON
 * pointer, e.g. `unsupported keyword "pattern" at #/properties/zip`):
 *   type          a name or a list of names: object, array, string,
 *                 number, integer, boolean, null
 *   properties, required, additionalProperties (false or true; a schema
 *                 there is refused)
 *   items (one schema; the array form is refused), minItems, maxItems
 *   minLength, maxLength (in code points, as JSON Schema counts)
 *   enum, const   (with `type` alongside at most: values of other types
 *                 are dropped)
 *   anyOf, oneOf  (alone, with annotations only); oneOf alternatives must
 *                 be provably exclusive (see below)
 *   $ref          local only ("#", "#/$defs/x", "#/definitions/x", any
 *                 JSON pointer into the document), recursion allowed;
 *                 with annotations alongside only
 *   $defs, definitions (containers), and the annotations title,
 *   description, default, examples, $comment, $schema, $id, deprecated,
 *   readOnly, writeOnly, discriminator, and any "x-..." extension.
 *   Boolean schemas: true (anything), false (nothing).
 * What is generated:
 *   - objects list their properties in the order of `properties`, then
 *     required names that `properties` lacks (any value); optional
 *     properties may be left out; no other property is ever generated
 *     (valid whether additionalProperties is false or not). An object
 *     schema with neither properties nor required, not closed by
 *     additionalProperties: false, is any JSON object.
 *   - without `type`, the type follows from the keywords present
 *     (properties -> object, items -> array, minLength -> string, ...);
 *     with none, any JSON value.
 *   - enum/const values are written in compact JSON (jansson), UTF-8.
 *   - oneOf: the alternatives are generated as anyOf, so they must be
 *     exclusive: for every pair, no document generated from one may be
 *     valid against the other. Proven when they differ in type, when one
 *     is a const/enum whose values the other rejects, when strings or
 *     arrays have disjoint length ranges, or when objects differ in a
 *     required property (exclusive values, or a property one requires
 *     that the other cannot hold). Otherwise the schema is refused: use
 *     anyOf when overlap is meant.
 * Limits (gm_schema_opts): nesting depth of the schema, maxLength and
 * maxItems above `max_count` are treated as max_count (a shorter document
 * is still valid), minLength/minItems above it are refused.
 *
 * Errors (returned, message in err): TG_EUNSUPPORTED (a keyword or form
 * outside the subset), TG_EFORMAT (a malformed schema: a keyword of the
 * wrong type, an unknown type name, a $ref that does not resolve),
 * TG_ETOOBIG (a limit), TG_EINVAL (a schema no document satisfies, when
 * it is seen here; the automaton compiler finds the others), TG_ENOMEM.
 * Thread: as the IR written to.
 */
#ifndef GM_SCHEMA_H
#define GM_SCHEMA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_json.h"

#define GM_SCHEMA_MAX_DEPTH 32   /* default nesting limit */
#define GM_SCHEMA_MAX_COUNT 1024 /* default minLength/maxItems cap */

struct gm_schema_opts {
    int max_depth;      /* nesting of subschemas (objects, arrays, anyOf) */
    uint32_t max_count; /* cap of the counts above */
};

/* Fills *o with the defaults above. */
void gm_schema_opts_default(struct gm_schema_opts *o);

/* Compiles `schema` (borrowed; $ref pointers resolve against it) into
 * rules of j->ir and writes to *rule the rule of a JSON value valid
 * against it (no surrounding whitespace; gm_json_document adds it).
 * Returns 0 or a negative code with the message in err (also recorded
 * as the IR's error). */
int gm_schema_compile(struct gm_json *j, const json_t *schema,
                      const struct gm_schema_opts *o, int32_t *rule,
                      char *err, size_t errlen);

#endif /* GM_SCHEMA_H */
