/*
 * gw_evaluate_out.c — `tangram-profile evaluate`'s report (gw_evaluate.h):
 * the table, the JSON and the SVG picture of a gw_eval_result.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "gpu_worker/engine/gw_evaluate.h"

static double ratio(double a, double b)
{
    return b != 0 ? a / b : 0.0;
}

double gw_eval_nll(const struct gw_eval_acc *a)
{
    return ratio(a->nll, (double)a->tokens);
}

double gw_eval_dnll(const struct gw_eval_acc *a)
{
    return ratio(a->nll - a->nll_full, (double)a->tokens);
}

double gw_eval_saved(const struct gw_eval_acc *a)
{
    return a->pages_full > 0 ? 1.0 - a->pages / a->pages_full : 0.0;
}

static double top1(const struct gw_eval_acc *a)
{
    return ratio((double)a->top1_agree, (double)a->tokens);
}

static double kl(const struct gw_eval_acc *a)
{
    return ratio(a->kl, (double)a->tokens);
}

static double greedy(const struct gw_eval_acc *a)
{
    return ratio((double)a->greedy, (double)a->turns);
}

/* ---- table -------------------------------------------------------------- */

static void row(FILE *f, const char *what, const struct gw_eval_acc *a)
{
    fprintf(f,
            "  %-6s %6lld %8lld %8.4f %+9.5f %7.4f %6.2f%% %9.2e %8.1f "
            "%6.1f%% %7.2f\n",
            what, (long long)a->turns, (long long)a->tokens, gw_eval_nll(a),
            gw_eval_dnll(a), exp(gw_eval_dnll(a)), 100.0 * top1(a), kl(a),
            ratio(a->pages, (double)a->turns), 100.0 * gw_eval_saved(a),
            greedy(a));
}

void gw_eval_print(const struct gw_eval_result *r, FILE *f)
{
    fprintf(f,
            "%d conversations read, %d skipped%s; greedy continuation %d "
            "tokens; KL exact over %d ids (%.1f MiB of full KV's rows)\n",
            r->conversations, r->skipped,
            r->interrupted ? " (INTERRUPTED: partial results)" : "",
            r->continuation, r->vocab, (double)r->row_bytes / 1048576.0);
    for (int i = 0; i < r->n_profiles; i++) {
        const struct gw_eval_profile *p = &r->profiles[i];
        fprintf(f,
                "\n%s (target ratio %.3g, %d conversations; %lld tokens run "
                "in %.1f s, %.0f tokens/s",
                i == 0 ? "full KV" : p->path, p->target_ratio, p->conversations,
                (long long)p->prefilled, p->seconds,
                ratio((double)p->prefilled, p->seconds));
        fprintf(f, ", %.1f s of it the KL's rows", p->kl_seconds);
        if (p->calibrated > 0)
            fprintf(f, "; calibrated in %.1f s", p->calib_seconds);
        fprintf(f, ")\n");
        fprintf(f, "  %-6s %6s %8s %8s %9s %7s %7s %9s %8s %7s %7s\n", "turn",
                "turns", "tokens", "NLL", "dNLL", "PPLx", "top1", "KL", "pages",
                "saved", "greedy");
        for (int t = 0; t < p->n_turn; t++) {
            char what[16];
            snprintf(what, sizeof(what), "%d", t + 1);
            row(f, what, &p->turn[t]);
        }
        row(f, "all", &p->all);
    }
}

/* ---- JSON --------------------------------------------------------------- */

static json_t *acc_json(const struct gw_eval_acc *a)
{
    return json_pack("{s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                     "turns", (json_int_t)a->turns, "tokens",
                     (json_int_t)a->tokens, "nll", gw_eval_nll(a), "nll_full",
                     ratio(a->nll_full, (double)a->tokens), "delta_nll",
                     gw_eval_dnll(a), "ppl_ratio", exp(gw_eval_dnll(a)),
                     "top1_agreement", top1(a), "kl", kl(a), "pages",
                     ratio(a->pages, (double)a->turns), "memory_saved",
                     gw_eval_saved(a), "greedy_agreement", greedy(a));
}

json_t *gw_eval_json(const struct gw_eval_result *r)
{
    json_t *doc = json_pack("{s:s, s:i, s:i, s:i, s:b, s:i, s:i, s:I}",
                            "format", "tangram-evaluate", "version", 1,
                            "conversations", r->conversations, "skipped",
                            r->skipped, "interrupted", r->interrupted,
                            "continuation", r->continuation, "vocab", r->vocab,
                            "row_bytes", (json_int_t)r->row_bytes);
    json_t *ps = json_array();
    int bad = doc == NULL || ps == NULL;
    for (int i = 0; !bad && i < r->n_profiles; i++) {
        const struct gw_eval_profile *p = &r->profiles[i];
        json_t *turns = json_array();
        for (int t = 0; turns != NULL && t < p->n_turn; t++)
            if (json_array_append_new(turns, acc_json(&p->turn[t])) != 0)
                bad = 1;
        json_t *o = json_pack(
            "{s:s, s:b, s:f, s:o, s:f, s:i, s:I, s:f, s:f, s:o, s:o}",
            "profile", p->path, "full_kv", i == 0, "target_ratio",
            p->target_ratio, "calibrated_ratio",
            p->calibrated > 0 ? json_real(p->calibrated) : json_null(),
            "calibration_seconds", p->calib_seconds, "conversations",
            p->conversations, "tokens_run", (json_int_t)p->prefilled, "seconds",
            p->seconds, "kl_seconds", p->kl_seconds, "all", acc_json(&p->all),
            "turns", turns);
        if (o == NULL || json_array_append_new(ps, o) != 0)
            bad = 1;
    }
    if (bad || json_object_set_new(doc, "profiles", ps) != 0) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

/* ---- SVG ---------------------------------------------------------------- */

static const char *const COLORS[] = {"#444444", "#d62728", "#1f77b4",
                                     "#2ca02c", "#ff7f0e", "#9467bd",
                                     "#8c564b", "#e377c2"};
#define N_COLORS (sizeof(COLORS) / sizeof(COLORS[0]))

/* A plot area: x0, y0 its top-left corner in pixels, w x h, and the data
 * ranges it maps. */
struct area {
    double x0, y0, w, h, xmin, xmax, ymin, ymax;
};

static double px(const struct area *a, double x)
{
    return a->x0 + a->w * ratio(x - a->xmin, a->xmax - a->xmin);
}

static double py(const struct area *a, double y)
{
    return a->y0 + a->h - a->h * ratio(y - a->ymin, a->ymax - a->ymin);
}

/* Escapes the XML specials of s into buf. */
static const char *xml(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (; *s != '\0' && o + 7 < cap; s++) {
        const char *rep = *s == '<'   ? "&lt;"
                          : *s == '>' ? "&gt;"
                          : *s == '&' ? "&amp;"
                          : *s == '"' ? "&quot;"
                                      : NULL;
        if (rep != NULL) {
            memcpy(buf + o, rep, strlen(rep));
            o += strlen(rep);
        } else {
            buf[o++] = *s;
        }
    }
    buf[o] = '\0';
    return buf;
}

static void axes(FILE *f, const struct area *a, const char *title,
                 const char *xlabel, const char *ylabel, int xticks_int)
{
    fprintf(f,
            "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' "
            "stroke='#888'/>\n",
            a->x0, a->y0, a->w, a->h);
    fprintf(f,
            "<text x='%.1f' y='%.1f' text-anchor='middle' font-size='14' "
            "font-weight='bold'>%s</text>\n",
            a->x0 + a->w / 2, a->y0 - 12, title);
    fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle'>%s</text>\n",
            a->x0 + a->w / 2, a->y0 + a->h + 36, xlabel);
    fprintf(f,
            "<text transform='translate(%.1f,%.1f) rotate(-90)' "
            "text-anchor='middle'>%s</text>\n",
            a->x0 - 56, a->y0 + a->h / 2, ylabel);
    if (a->ymin < 0) /* no loss: a gain shows below this line */
        fprintf(f,
                "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' stroke='#888' "
                "stroke-dasharray='4 3'/>\n",
                a->x0, a->x0 + a->w, py(a, 0), py(a, 0));
    for (int i = 0; i <= 4; i++) { /* x: 0..100 % or turns 1..T */
        double x = a->xmin + (a->xmax - a->xmin) * i / 4.0;
        if (!xticks_int || fabs(x - round(x)) < 1e-9)
            fprintf(f,
                    "<text x='%.1f' y='%.1f' text-anchor='middle' "
                    "font-size='11'>%.0f</text>\n",
                    px(a, x), a->y0 + a->h + 16, x);
    }
    /* y: a round step (1, 2 or 5 x 10^k) giving at most 6 lines, at its
     * multiples, so 0 is one of them and the labels stay short. */
    double span = a->ymax - a->ymin, step = pow(10, floor(log10(span / 4)));
    if (span / step > 20)
        step *= 5;
    else if (span / step > 8)
        step *= 2;
    for (double k = ceil(a->ymin / step); k * step <= a->ymax; k++) {
        double y = fabs(k) < 0.5 ? 0.0 : k * step;
        fprintf(f,
                "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' "
                "stroke='#eee'/>\n<text x='%.1f' y='%.1f' text-anchor='end' "
                "font-size='11'>%.3g</text>\n",
                a->x0, a->x0 + a->w, py(a, y), py(a, y), a->x0 - 4,
                py(a, y) + 4, y);
    }
}

int gw_eval_svg(const struct gw_eval_result *r, const char *path, char *err,
                size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return tg_err_set(err, errlen, TG_EIO, "%s: cannot write", path);
    /* Ranges: dNLL from 0 up, memory saved 0..100 %, turns 1..T. */
    double ymax = 1e-3;
    int T = 1;
    for (int i = 0; i < r->n_profiles; i++) {
        const struct gw_eval_profile *p = &r->profiles[i];
        double d = gw_eval_dnll(&p->all);
        ymax = d > ymax ? d : ymax;
        for (int t = 0; t < p->n_turn; t++) {
            d = gw_eval_dnll(&p->turn[t]);
            ymax = d > ymax ? d : ymax;
        }
        T = p->n_turn > T ? p->n_turn : T;
    }
    ymax *= 1.1;
    double ymin = 0;
    for (int i = 0; i < r->n_profiles; i++) /* a gain shows below 0 */
        for (int t = -1; t < r->profiles[i].n_turn; t++) {
            const struct gw_eval_acc *a = t < 0 ? &r->profiles[i].all
                                                : &r->profiles[i].turn[t];
            double d = gw_eval_dnll(a) * 1.1;
            ymin = d < ymin ? d : ymin;
        }
    struct area left = {80, 50, 380, 300, 0, 100, ymin, ymax};
    struct area right = {560, 50, 380, 300, 1, T > 1 ? T : 2, ymin, ymax};
    fprintf(f,
            "<svg xmlns='http://www.w3.org/2000/svg' width='1000' "
            "height='%d' font-family='sans-serif' font-size='12'>\n"
            "<rect width='100%%' height='100%%' fill='white'/>\n",
            440 + 18 * r->n_profiles);
    axes(f, &left, "Quality loss against memory saved", "KV memory saved (%)",
         "mean NLL increase (nat/token)", 0);
    axes(f, &right, "Quality loss by turn", "assistant turn",
         "mean NLL increase (nat/token)", 1);
    char buf[512];
    for (int i = 0; i < r->n_profiles; i++) {
        const struct gw_eval_profile *p = &r->profiles[i];
        const char *col = COLORS[(size_t)i % N_COLORS];
        double x = px(&left, 100.0 * gw_eval_saved(&p->all));
        double y = py(&left, gw_eval_dnll(&p->all));
        fprintf(f, "<circle cx='%.1f' cy='%.1f' r='5' fill='%s'/>\n", x, y,
                col);
        fprintf(f,
                "<polyline fill='none' stroke='%s' stroke-width='2' "
                "points='",
                col);
        for (int t = 0; t < p->n_turn; t++)
            fprintf(f, "%.1f,%.1f ", px(&right, t + 1.0),
                    py(&right, gw_eval_dnll(&p->turn[t])));
        fprintf(f, "'/>\n");
        for (int t = 0; t < p->n_turn; t++)
            fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>\n",
                    px(&right, t + 1.0), py(&right, gw_eval_dnll(&p->turn[t])),
                    col);
        double ly = 420 + 18 * i;
        fprintf(f,
                "<rect x='80' y='%.1f' width='12' height='12' fill='%s'/>\n"
                "<text x='98' y='%.1f'>%s: target ratio %.3g, memory saved "
                "%.1f%%, dNLL %+.4f, PPL x%.4f, top-1 %.2f%%, "
                "KL %.4f</text>\n",
                ly - 10, col, ly,
                xml(i == 0 ? "full KV" : p->path, buf, sizeof(buf)),
                p->target_ratio, 100.0 * gw_eval_saved(&p->all),
                gw_eval_dnll(&p->all), exp(gw_eval_dnll(&p->all)),
                100.0 * top1(&p->all), kl(&p->all));
    }
    fprintf(f, "</svg>\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return tg_err_set(err, errlen, TG_EIO, "%s: write failed", path);
    return 0;
}

/* ---- the command's output ---------------------------------------------- */

void gw_eval_progress_bar(void *ud, int pi, int np, int done, int total)
{
    (void)ud;
    int w = 30, fill = total > 0 ? done * w / total : w;
    fprintf(stderr, "\rtangram-profile evaluate: profile %d/%d [%.*s%*s] %d/%d",
            pi + 1, np, fill, "##############################", w - fill, "",
            done, total);
    if (done == total)
        fputc('\n', stderr);
}

int gw_eval_write(const struct gw_eval_result *r, const char *json_path,
                  const char *plot_path, FILE *table, char *err, size_t errlen)
{
    int to_stdout = json_path != NULL && strcmp(json_path, "-") == 0;
    if (!to_stdout)
        gw_eval_print(r, table);
    if (json_path != NULL) {
        json_t *doc = gw_eval_json(r);
        int rc = doc == NULL ? -1
                 : to_stdout ? json_dumpf(doc, stdout, JSON_INDENT(2))
                             : json_dump_file(doc, json_path, JSON_INDENT(2));
        json_decref(doc);
        if (rc != 0)
            return tg_err_set(err, errlen, TG_EIO,
                              "cannot write the JSON to %s", json_path);
        if (to_stdout)
            fputc('\n', stdout);
    }
    if (plot_path != NULL)
        return gw_eval_svg(r, plot_path, err, errlen);
    return 0;
}
