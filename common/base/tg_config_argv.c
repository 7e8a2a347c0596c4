/* tg_config_argv.c — options back to "--name=value" flags (tg_config.h). */
#include "common/base/tg_config.h"
#include "common/base/tg_err.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

int tg_config_argv_push(char ***argv, size_t *argc, const char *s)
{
    char *copy = strdup(s);
    if (copy == NULL)
        return TG_ENOMEM;
    /* +2: the new entry and the terminating NULL. */
    char **v = realloc(*argv, (*argc + 2) * sizeof *v);
    if (v == NULL) {
        free(copy);
        return TG_ENOMEM;
    }
    v[*argc] = copy;
    v[*argc + 1] = NULL;
    *argv = v;
    (*argc)++;
    return 0;
}

void tg_config_argv_free(char **argv, size_t argc)
{
    if (argv == NULL)
        return;
    for (size_t i = 0; i < argc; i++)
        free(argv[i]);
    free(argv);
}

/* Shortest "%.*g" rendering of x that strtod reads back exactly (at most 17
 * significant digits always suffice for an IEEE double). */
static void format_double(double x, char *buf, size_t len)
{
    /* A whole number reads as one ("10", not %g's shortest "1e+01"). */
    if (x > -1e15 && x < 1e15 && x == (double)(int64_t)x) {
        snprintf(buf, len, "%" PRId64, (int64_t)x);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

/* A fraction in (0, 1] in plain positional notation: the SIZE_FRAC syntax
 * has no exponent form ("1e-05" would be rejected). Digits are added until
 * the text reads back to the same double; a fraction so small that even
 * 340 places do not suffice cannot occur (the parser rejects 0). */
static void format_fraction(double f, char *buf, size_t len)
{
    for (int prec = 1; prec <= 340; prec++) {
        snprintf(buf, len, "%.*f", prec, f);
        if (strtod(buf, NULL) == f)
            return;
    }
}

static bool name_selected(const char *name, const char *const *only)
{
    if (only == NULL)
        return true;
    for (size_t i = 0; only[i] != NULL; i++)
        if (strcmp(only[i], name) == 0)
            return true;
    return false;
}

/* Formats the value of e in src into buf; *omit is set for a NULL string. */
static int format_value(const struct tg_config_entry *e, const void *src,
                        char *buf, size_t len, bool *omit, char *err,
                        size_t errlen)
{
    const void *f = (const char *)src + e->offset;
    *omit = false;
    switch (e->type) {
    case TG_CONFIG_BOOL:
        snprintf(buf, len, "%s", *(const bool *)f ? "true" : "false");
        return 0;
    case TG_CONFIG_INT:
        snprintf(buf, len, "%" PRId64, *(const int64_t *)f);
        return 0;
    case TG_CONFIG_DOUBLE:
        format_double(*(const double *)f, buf, len);
        return 0;
    case TG_CONFIG_SIZE:
        snprintf(buf, len, "%" PRIu64, *(const uint64_t *)f);
        return 0;
    case TG_CONFIG_SIZE_FRAC: {
        const struct tg_config_amount *a = f;
        if (a->is_fraction)
            format_fraction(a->fraction, buf, len);
        else /* the "B" unit keeps 0 and 1 byte from reading as fractions */
            snprintf(buf, len, "%" PRIu64 "B", a->bytes);
        return 0;
    }
    case TG_CONFIG_ENUM: {
        int v = *(const int *)f;
        for (int i = 0; e->choices != NULL && e->choices[i] != NULL; i++)
            if (i == v) {
                snprintf(buf, len, "%s", e->choices[i]);
                return 0;
            }
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--%s: value %d is not an index of its choices",
                          e->name, v);
    }
    case TG_CONFIG_STRING: /* handled by the caller (unbounded length) */
        *omit = *(char *const *)f == NULL;
        return 0;
    }
    return tg_err_set(err, errlen, TG_EINVAL, "--%s: unknown type %d",
                      e->name, (int)e->type);
}

int tg_config_to_argv(const struct tg_config_entry *table, size_t n,
                      const void *src, const char *const *only,
                      unsigned skip_flags, char ***argv, size_t *argc,
                      char *err, size_t errlen)
{
    for (size_t k = 0; only != NULL && only[k] != NULL; k++) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            found = strcmp(table[i].name, only[k]) == 0;
        if (!found)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "no option named '%s' in the table", only[k]);
    }
    for (size_t i = 0; i < n; i++) {
        const struct tg_config_entry *e = &table[i];
        if ((e->flags & skip_flags) != 0 || !name_selected(e->name, only))
            continue;
        char val[400]; /* the longest fraction of format_fraction fits */
        bool omit;
        int rc = format_value(e, src, val, sizeof val, &omit, err, errlen);
        if (rc != 0)
            return rc;
        if (omit)
            continue;
        const char *text = val;
        if (e->type == TG_CONFIG_STRING)
            text = *(char *const *)((const char *)src + e->offset);
        size_t need = strlen(e->name) + strlen(text) + 4; /* "--" "=" NUL */
        char *flag = malloc(need);
        if (flag == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        snprintf(flag, need, "--%s=%s", e->name, text);
        rc = tg_config_argv_push(argv, argc, flag);
        free(flag);
        if (rc != 0)
            return tg_err_set(err, errlen, rc, "out of memory");
    }
    return 0;
}
