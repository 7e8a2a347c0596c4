/* tg_config_help.c — the --help text and the JSON dump of a declarative
 * configuration table (tg_config.h). */
#include "common/base/tg_config.h"
#include "common/base/tg_config_internal.h"
#include "common/base/tg_err.h"

#include <stdlib.h>
#include <string.h>

#define HELP_WIDTH 120   /* total width --help wraps to */
#define HELP_MIN_WRAP 40 /* narrowest help column beside the other columns */
#define HELP_BELOW_INDENT 6 /* indent of help put under its row */

/* ---- help ------------------------------------------------------------- */

enum { COL_FLAG, COL_ENV, COL_TYPE, COL_DEF, COL_RANGE, NCOLS };

struct help_row {
    char col[NCOLS][160];
    const char *help;
};

static void help_row_fill(const struct tg_config_entry *e, struct help_row *r)
{
    const char *meta = e->metavar != NULL ? e->metavar
                                          : tg_config__types[e->type].metavar;
    char choices[128];
    if (e->type == TG_CONFIG_ENUM && meta == NULL) {
        tg_config__format_range(e, choices, sizeof choices);
        meta = choices;
    }
    char alias[8] = "";
    if (e->short_flag != 0)
        snprintf(alias, sizeof alias, "-%c, ", e->short_flag);
    if (e->type == TG_CONFIG_BOOL)
        snprintf(r->col[COL_FLAG], sizeof r->col[0], "%s--[no-]%s", alias,
                 e->name);
    else
        snprintf(r->col[COL_FLAG], sizeof r->col[0], "%s--%s %s", alias,
                 e->name, meta);
    if (tg_config_env_name(e, r->col[COL_ENV], sizeof r->col[0]) != 0)
        r->col[COL_ENV][0] = '\0';
    snprintf(r->col[COL_TYPE], sizeof r->col[0], "%s", tg_config__types[e->type].name);
    if (e->def == NULL)
        snprintf(r->col[COL_DEF], sizeof r->col[0], "%s",
                 (e->flags & TG_CONFIG_REQUIRED) ? "(required)" : "(none)");
    else if (e->def[0] == '\0')
        snprintf(r->col[COL_DEF], sizeof r->col[0], "\"\"");
    else
        snprintf(r->col[COL_DEF], sizeof r->col[0], "%s", e->def);
    tg_config__format_range(e, r->col[COL_RANGE], sizeof r->col[0]);
    r->help = e->help != NULL ? e->help : "";
}

/* Writes `text` word-wrapped to `width` columns; continuation lines are
 * indented by `indent` spaces. */
static void write_wrapped(FILE *out, const char *text, size_t indent,
                          size_t width)
{
    const char *p = text;
    bool first = true;
    while (*p != '\0') {
        size_t left = strlen(p), take = left;
        if (left > width) {
            take = width;
            while (take > 0 && p[take] != ' ')
                take--;
            if (take == 0) /* one word longer than the column */
                take = strcspn(p, " ");
        }
        if (!first)
            fprintf(out, "\n%*s", (int)indent, "");
        fwrite(p, 1, take, out);
        first = false;
        p += take;
        while (*p == ' ')
            p++;
    }
    fputc('\n', out);
}

int tg_config__help(const struct tg_config_entry *table, size_t n,
                    const char *usage, bool show_env, FILE *out)
{
    static const char *const heads[NCOLS] = {"FLAG", "ENVIRONMENT", "TYPE",
                                             "DEFAULT", "RANGE"};
    struct help_row *rows = calloc(n + 1, sizeof *rows);
    if (rows == NULL)
        return TG_ENOMEM;
    for (size_t i = 0; i < n; i++)
        help_row_fill(&table[i], &rows[i]);
    struct help_row *hr = &rows[n];
    snprintf(hr->col[COL_FLAG], sizeof hr->col[0], "--help, -h");
    hr->help = "Print this help and exit.";

    size_t w[NCOLS];
    for (int c = 0; c < NCOLS; c++) {
        if (c == COL_ENV && !show_env) { /* the column is left out */
            w[c] = 0;
            continue;
        }
        w[c] = strlen(heads[c]);
        for (size_t i = 0; i <= n; i++) {
            size_t l = strlen(rows[i].col[c]);
            if (l > w[c])
                w[c] = l;
        }
    }
    /* Each row is " " then " col " per column, so the help column starts
     * here. When the columns leave too little room, the help sentence goes
     * on its own line under the row instead. */
    size_t helpcol = 1;
    for (int c = 0; c < NCOLS; c++)
        helpcol += w[c] != 0 ? w[c] + 2 : 0;
    bool below = helpcol + HELP_MIN_WRAP > HELP_WIDTH;
    size_t indent = below ? HELP_BELOW_INDENT : helpcol;
    size_t wrap = HELP_WIDTH - indent;
    if (usage != NULL)
        fprintf(out, "%s\n\n", usage);
    if (show_env)
        fprintf(out, "Each flag can also be set by the environment variable "
                     "shown; a flag wins over\nthe environment, which wins "
                     "over the default.\n\n");
    struct help_row head = {.help = "DESCRIPTION"};
    for (int c = 0; c < NCOLS; c++)
        snprintf(head.col[c], sizeof head.col[c], "%s", heads[c]);
    for (size_t i = 0; i <= n + 1; i++) {
        const struct help_row *r = i == 0 ? &head : &rows[i - 1];
        char line[NCOLS * 162 + 2];
        size_t off = 0;
        line[off++] = ' ';
        for (int c = 0; c < NCOLS; c++)
            if (w[c] != 0)
                off += (size_t)snprintf(line + off, sizeof line - off,
                                        " %-*s ", (int)w[c], r->col[c]);
        if (below) { /* no trailing blanks; help on the next line */
            while (off > 0 && line[off - 1] == ' ')
                off--;
            line[off] = '\0';
            fprintf(out, "%s\n", line);
            if (i == 0)
                continue;
            fprintf(out, "%*s", (int)indent, "");
        } else {
            fputs(line, out);
        }
        write_wrapped(out, r->help, indent, wrap);
    }
    free(rows);
    fflush(out);
    return ferror(out) ? TG_EIO : 0;
}

int tg_config_help(const struct tg_config_entry *table, size_t n,
                   const char *usage, FILE *out)
{
    return tg_config__help(table, n, usage, true, out);
}

/* ---- JSON dump -------------------------------------------------------- */

static json_t *value_json(const struct tg_config_entry *e, const void *dst)
{
    const void *f = (const char *)dst + e->offset;
    switch (e->type) {
    case TG_CONFIG_BOOL: return json_boolean(*(const bool *)f);
    case TG_CONFIG_INT: return json_integer((json_int_t)*(const int64_t *)f);
    case TG_CONFIG_DOUBLE: return json_real(*(const double *)f);
    case TG_CONFIG_STRING: {
        const char *s = *(char *const *)f;
        if (e->flags & TG_CONFIG_SECRET)
            return json_string(s != NULL && s[0] != '\0' ? "***" : "");
        return s != NULL ? json_string(s) : json_null();
    }
    case TG_CONFIG_SIZE:
        /* json_int_t is 64-bit signed; sizes beyond 2^63 do not occur in
         * practice, clamp rather than wrap. */
        return json_integer((json_int_t)(*(const uint64_t *)f > INT64_MAX
                                             ? INT64_MAX
                                             : *(const uint64_t *)f));
    case TG_CONFIG_SIZE_FRAC: {
        const struct tg_config_amount *a = f;
        if (a->is_fraction)
            return json_real(a->fraction);
        return json_integer(
            (json_int_t)(a->bytes > INT64_MAX ? INT64_MAX : a->bytes));
    }
    case TG_CONFIG_ENUM: {
        int v = *(const int *)f;
        for (int i = 0; e->choices != NULL && e->choices[i] != NULL; i++)
            if (i == v)
                return json_string(e->choices[i]);
        return json_integer(v);
    }
    }
    return json_null();
}

json_t *tg_config_dump_json(const struct tg_config_entry *table, size_t n,
                            const void *dst)
{
    json_t *obj = json_object();
    if (obj == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *v = value_json(&table[i], dst);
        if (v == NULL || json_object_set_new(obj, table[i].name, v) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}
