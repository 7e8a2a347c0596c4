/* tg_json.c — typed jansson access with field-naming errors (tg_json.h). */
#include "common/json/tg_json.h"
#include "common/base/tg_err.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *sep(const char *ctx)
{
    return (ctx != NULL && ctx[0] != '\0') ? "." : "";
}

static const char *nz(const char *ctx)
{
    return ctx != NULL ? ctx : "";
}

int tg_json_load_file(const char *path, json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        return tg_err_set(err, errlen, e == ENOENT ? TG_ENOENT : TG_EIO,
                          "%s: %s", path, strerror(e));
    }
    json_error_t je;
    json_t *doc = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (doc == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: invalid JSON at line %d column %d: %s", path,
                          je.line, je.column, je.text);
    *out = doc;
    return 0;
}

int tg_json_load_buf(const char *buf, size_t len, json_t **out, char *err,
                     size_t errlen)
{
    json_error_t je;
    *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (*out == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "invalid JSON at line %d column %d: %s", je.line,
                          je.column, je.text);
    return 0;
}

/* The integer literal that ends at byte `end` of buf[0..len): its first
 * byte (its '-' when negative), or SIZE_MAX when what ends there is not a
 * plain integer (a real such as 1e400, or no number at all). */
static size_t int_literal_start(const char *buf, size_t len, size_t end)
{
    if (end == 0 || end > len)
        return SIZE_MAX;
    if (end < len && strchr("0123456789.eE", buf[end]) != NULL &&
        buf[end] != '\0')
        return SIZE_MAX;
    size_t a = end;
    while (a > 0 && buf[a - 1] >= '0' && buf[a - 1] <= '9')
        a--;
    if (a == end)
        return SIZE_MAX;
    if (a > 0 && buf[a - 1] == '-')
        a--;
    if (a > 0 && buf[a - 1] != '\0' &&
        strchr("0123456789.eE+-", buf[a - 1]) != NULL)
        return SIZE_MAX;
    return a;
}

json_t *tg_json_loadb_wide(const char *buf, size_t len, size_t flags,
                           json_error_t *err)
{
    json_t *doc = json_loadb(buf, len, flags, err);
    if (doc != NULL || json_error_code(err) != json_error_numeric_overflow)
        return doc;
    /* jansson stops at the first literal its json_int_t cannot hold, with
     * the position just past it: append ".0" there (the same number as a
     * real) and parse again, up to TG_JSON_MAX_WIDE times. Literals come
     * in document order, so each insertion is after the previous ones. */
    char *copy = NULL;
    size_t n = len;
    size_t at[TG_JSON_MAX_WIDE];
    int line_of[TG_JSON_MAX_WIDE];
    int k = 0;
    while (doc == NULL && json_error_code(err) == json_error_numeric_overflow &&
           k < TG_JSON_MAX_WIDE && err->position >= 0) {
        const char *cur = copy != NULL ? copy : buf;
        size_t end = (size_t)err->position;
        if (int_literal_start(cur, n, end) == SIZE_MAX)
            break;
        if (copy == NULL) {
            copy = malloc(len + 2 * TG_JSON_MAX_WIDE);
            if (copy == NULL)
                break; /* err keeps jansson's overflow */
            memcpy(copy, buf, len);
        }
        memmove(copy + end + 2, copy + end, n - end);
        copy[end] = '.';
        copy[end + 1] = '0';
        n += 2;
        at[k] = end;
        line_of[k] = err->line;
        k++;
        doc = json_loadb(copy, n, flags, err);
    }
    free(copy);
    if (doc == NULL) {
        /* Where the error is in the caller's bytes: each ".0" inserted
         * before it moved it two bytes on (and two columns on its line). */
        int shift = 0, col_shift = 0;
        for (int i = 0; i < k; i++)
            if (err->position >= 0 && at[i] < (size_t)err->position) {
                shift += 2;
                if (line_of[i] == err->line)
                    col_shift += 2;
            }
        err->position -= shift;
        err->column -= col_shift;
    }
    return doc;
}

int tg_json_dump_file(const json_t *doc, const char *path, char *err,
                      size_t errlen)
{
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (tmp == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    snprintf(tmp, n, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    int rc = 0;
    if (f == NULL) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    if (json_dumpf(doc, f, JSON_INDENT(1) | JSON_PRESERVE_ORDER |
                               JSON_REAL_PRECISION(17)) != 0 ||
        fputc('\n', f) == EOF) {
        fclose(f);
        unlink(tmp);
        rc = tg_err_set(err, errlen, TG_EIO, "%s: write failed", path);
        goto out;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", path, strerror(errno));
        unlink(tmp);
    }
out:
    free(tmp);
    return rc;
}

static int member(const json_t *obj, const char *key, const char *ctx,
                  json_t **v, char *err, size_t errlen)
{
    if (!json_is_object(obj))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s: expected an object",
                          ctx && ctx[0] ? ctx : "(root)");
    *v = json_object_get(obj, key);
    if (*v == NULL)
        return tg_err_set(err, errlen, TG_ENOTFOUND,
                          "%s%s%s: missing required field", nz(ctx), sep(ctx), key);
    return 0;
}

int tg_json_get_int(const json_t *obj, const char *key, const char *ctx,
                    int64_t lo, int64_t hi, int64_t *out, char *err,
                    size_t errlen)
{
    json_t *v;
    int rc = member(obj, key, ctx, &v, err, errlen);
    if (rc != 0)
        return rc;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9.0e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return tg_err_set(err, errlen, TG_EFORMAT, "%s%s%s: expected an integer",
                          nz(ctx), sep(ctx), key);
    }
    if (x < lo || x > hi)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "%s%s%s: %lld is out of range [%lld, %lld]", nz(ctx),
                          sep(ctx), key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

int tg_json_get_double(const json_t *obj, const char *key, const char *ctx,
                       double lo, double hi, double *out, char *err,
                       size_t errlen)
{
    json_t *v;
    int rc = member(obj, key, ctx, &v, err, errlen);
    if (rc != 0)
        return rc;
    if (!json_is_number(v))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s%s%s: expected a number",
                          nz(ctx), sep(ctx), key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "%s%s%s: %g is out of range [%g, %g]", nz(ctx),
                          sep(ctx), key, x, lo, hi);
    *out = x;
    return 0;
}

int tg_json_get_string(const json_t *obj, const char *key, const char *ctx,
                       const char **out, char *err, size_t errlen)
{
    json_t *v;
    int rc = member(obj, key, ctx, &v, err, errlen);
    if (rc != 0)
        return rc;
    if (!json_is_string(v))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s%s%s: expected a string",
                          nz(ctx), sep(ctx), key);
    *out = json_string_value(v);
    return 0;
}

int tg_json_get_bool(const json_t *obj, const char *key, const char *ctx,
                     int *out, char *err, size_t errlen)
{
    json_t *v;
    int rc = member(obj, key, ctx, &v, err, errlen);
    if (rc != 0)
        return rc;
    if (!json_is_boolean(v))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s%s%s: expected true or false",
                          nz(ctx), sep(ctx), key);
    *out = json_is_true(v);
    return 0;
}

int tg_json_get_array(const json_t *obj, const char *key, const char *ctx,
                      long want_len, json_t **out, char *err, size_t errlen)
{
    json_t *v;
    int rc = member(obj, key, ctx, &v, err, errlen);
    if (rc != 0)
        return rc;
    if (!json_is_array(v))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s%s%s: expected an array",
                          nz(ctx), sep(ctx), key);
    if (want_len >= 0 && (long)json_array_size(v) != want_len)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s%s%s: expected %ld elements, found %zu", nz(ctx),
                          sep(ctx), key, want_len, json_array_size(v));
    *out = v;
    return 0;
}

int tg_json_get_object(const json_t *obj, const char *key, const char *ctx,
                       json_t **out, char *err, size_t errlen)
{
    json_t *v;
    int rc = member(obj, key, ctx, &v, err, errlen);
    if (rc != 0)
        return rc;
    if (!json_is_object(v))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s%s%s: expected an object",
                          nz(ctx), sep(ctx), key);
    *out = v;
    return 0;
}

int tg_json_read_doubles(const json_t *arr, const char *ctx, size_t n,
                         double lo, double hi, double *out, char *err,
                         size_t errlen)
{
    if (!json_is_array(arr))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s: expected an array", nz(ctx));
    if (json_array_size(arr) != n)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: expected %zu elements, found %zu", nz(ctx), n,
                          json_array_size(arr));
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_number(v))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s[%zu]: expected a number", nz(ctx), i);
        double x = json_number_value(v);
        if (!(x >= lo && x <= hi))
            return tg_err_set(err, errlen, TG_ERANGE,
                              "%s[%zu]: %g is out of range [%g, %g]", nz(ctx), i,
                              x, lo, hi);
        out[i] = x;
    }
    return 0;
}

json_t *tg_json_doubles(const double *v, size_t n)
{
    json_t *a = json_array();
    if (a == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (json_array_append_new(a, json_real(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}
