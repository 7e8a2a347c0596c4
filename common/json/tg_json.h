/*
 * tg_json.h — typed access to jansson documents with errors that name the
 * field ("layers[3].budget[2]: expected a number").
 *
 * All getters take `ctx`, the path of `obj` in the document ("" for the
 * root), and write a message naming ctx.key into err on failure. They
 * return 0, TG_ENOTFOUND when a required key is missing, or TG_EFORMAT /
 * TG_ERANGE for wrong types and values. References returned are borrowed
 * from `obj` (jansson semantics). Any thread, one document per thread.
 */
#ifndef TG_JSON_H
#define TG_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Parses the file at `path` into *out (new reference, caller decrefs).
 * Errors name the file, line and column. Returns 0, TG_ENOENT, TG_EIO or
 * TG_EFORMAT. */
int tg_json_load_file(const char *path, json_t **out, char *err, size_t errlen);

/* Parses a NUL-free buffer of `len` bytes (same contract as above). */
int tg_json_load_buf(const char *buf, size_t len, json_t **out, char *err,
                     size_t errlen);

/* Writes `doc` to `path` atomically (temp file + rename), indented, keys in
 * insertion order, ending with a newline. Returns 0 or TG_EIO. */
int tg_json_dump_file(const json_t *doc, const char *path, char *err,
                      size_t errlen);

/* Required members of object `obj`. Integers must be JSON integers (or
 * numbers with no fraction) within [lo, hi]. */
int tg_json_get_int(const json_t *obj, const char *key, const char *ctx,
                    int64_t lo, int64_t hi, int64_t *out, char *err,
                    size_t errlen);
int tg_json_get_double(const json_t *obj, const char *key, const char *ctx,
                       double lo, double hi, double *out, char *err,
                       size_t errlen);
/* *out is borrowed from obj and lives as long as the document. */
int tg_json_get_string(const json_t *obj, const char *key, const char *ctx,
                       const char **out, char *err, size_t errlen);
int tg_json_get_bool(const json_t *obj, const char *key, const char *ctx,
                     int *out, char *err, size_t errlen);
/* An array member; when want_len >= 0 its length must equal want_len. */
int tg_json_get_array(const json_t *obj, const char *key, const char *ctx,
                      long want_len, json_t **out, char *err, size_t errlen);
int tg_json_get_object(const json_t *obj, const char *key, const char *ctx,
                       json_t **out, char *err, size_t errlen);

/* Reads array `arr` (path `ctx`) of exactly n numbers within [lo, hi] into
 * out[0..n). Returns 0, TG_EFORMAT or TG_ERANGE naming the element. */
int tg_json_read_doubles(const json_t *arr, const char *ctx, size_t n,
                         double lo, double hi, double *out, char *err,
                         size_t errlen);

/* Returns a new JSON array of the n doubles (NULL when out of memory). */
json_t *tg_json_doubles(const double *v, size_t n);

#endif /* TG_JSON_H */
