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

/* At most this many integers out of the 64-bit range are widened by one
 * tg_json_loadb_wide call (each costs a parse of the buffer up to it). */
#define TG_JSON_MAX_WIDE 8

/* Parses `len` bytes like json_loadb(buf, len, flags, err), except that an
 * integer literal outside jansson's json_int_t (64 bits: above 2^63 - 1 or
 * below -2^63), which json_loadb refuses as malformed, is read as a real of
 * the same value rounded to a double: it is valid JSON, and the caller's
 * range check then names the field it is in. At most TG_JSON_MAX_WIDE are
 * widened; past that, and for a real literal outside the double range
 * (1e400), NULL with json_error_code(err) == json_error_numeric_overflow.
 * On failure err's line, column and position are those of `buf` as given.
 * Returns a new reference or NULL; `buf` is never written (a widened parse
 * works on a copy). Any thread. */
json_t *tg_json_loadb_wide(const char *buf, size_t len, size_t flags,
                           json_error_t *err);

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
