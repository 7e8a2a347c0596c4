/* pf_build.c — profile from retention samples; head grouping (pf_build.h). */
#include "common/profile/pf_build.h"
#include "common/profile/pf_identity.h"
#include "common/base/tg_err.h"
#include "common/json/tg_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- retention file ---------------------------------------------------- */

void pf_retention_free(struct pf_retention *r)
{
    if (r == NULL)
        return;
    free(r->architecture);
    free(r->model_identity);
    free(r->method);
    free(r->ratio);
    memset(r, 0, sizeof(*r));
}

static int read_sample(struct pf_retention *r, const json_t *smp, int s,
                       char *err, size_t errlen)
{
    int L = r->num_layers, H = r->num_kv_heads;
    if (!json_is_array(smp))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "samples[%d]: expected an array of %d layers", s, L);
    if (json_array_size(smp) != (size_t)L)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "samples[%d]: expected %d layers (model.num_layers), "
                          "found %zu", s, L, json_array_size(smp));
    char ctx[64];
    for (int l = 0; l < L; l++) {
        snprintf(ctx, sizeof(ctx), "samples[%d][%d]", s, l);
        size_t row = (size_t)s * (size_t)L + (size_t)l;
        double *dst = r->ratio + row * (size_t)H;
        int rc = tg_json_read_doubles(json_array_get(smp, (size_t)l), ctx,
                                      (size_t)H, 0.0, 1.0, dst, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int pf_retention_from_json(struct pf_retention *r, const json_t *doc,
                           char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    if (!json_is_object(doc))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "(root): expected a JSON object");
    const char *s, *arch, *method, *identity = NULL;
    int64_t version, L, H, d;
    double ratio;
    json_t *model, *samples;
    int rc = tg_json_get_string(doc, "format", "", &s, err, errlen);
    if (rc != 0)
        return rc;
    if (strcmp(s, PF_RETENTION_FORMAT) != 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "format: expected \"%s\", found \"%s\"",
                          PF_RETENTION_FORMAT, s);
    rc = tg_json_get_int(doc, "version", "", 0, INT32_MAX, &version, err,
                         errlen);
    if (rc != 0)
        return rc;
    if (version != PF_RETENTION_VERSION)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "version: unsupported version %lld (expected %d)",
                          (long long)version, PF_RETENTION_VERSION);
    if ((rc = tg_json_get_object(doc, "model", "", &model, err, errlen)) != 0 ||
        (rc = tg_json_get_string(model, "architecture", "model", &arch, err,
                                 errlen)) != 0 ||
        (rc = tg_json_get_int(model, "num_layers", "model", 1, PF_MAX_LAYERS,
                              &L, err, errlen)) != 0 ||
        (rc = tg_json_get_int(model, "num_kv_heads", "model", 1, PF_MAX_HEADS,
                              &H, err, errlen)) != 0 ||
        (rc = tg_json_get_int(model, "head_dim", "model", 1, PF_MAX_HEAD_DIM,
                              &d, err, errlen)) != 0 ||
        (rc = tg_json_get_string(doc, "method", "", &method, err, errlen)) != 0 ||
        (rc = tg_json_get_double(doc, "target_ratio", "", 0.0, 1.0, &ratio,
                                 err, errlen)) != 0 ||
        (json_object_get(model, "identity") != NULL &&
         (rc = tg_json_get_string(model, "identity", "model", &identity, err,
                                  errlen)) != 0) ||
        (rc = tg_json_get_array(doc, "samples", "", -1, &samples, err,
                                errlen)) != 0)
        return rc;
    if (method[0] == '\0')
        return tg_err_set(err, errlen, TG_EFORMAT, "method: empty string");
    if (identity != NULL && !pf_identity_valid(identity))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "model.identity: \"%.80s\" is not \"sha256:\" and "
                          "64 lowercase hex digits", identity);
    if (!(ratio > 0.0))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "target_ratio: %g is out of range (0, 1]", ratio);
    size_t S = json_array_size(samples);
    if (S < 1 || S > PF_MAX_SAMPLES)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "samples: %zu samples, expected 1 to %d", S,
                          PF_MAX_SAMPLES);
    r->num_layers = (int)L;
    r->num_kv_heads = (int)H;
    r->head_dim = (int)d;
    r->samples = (int)S;
    r->target_ratio = ratio;
    r->architecture = strdup(arch);
    r->model_identity = identity != NULL ? strdup(identity) : NULL;
    r->method = strdup(method);
    r->ratio = malloc(S * (size_t)L * (size_t)H * sizeof(double));
    if (r->architecture == NULL || r->method == NULL || r->ratio == NULL ||
        (identity != NULL && r->model_identity == NULL)) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "retention: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < S; i++) {
        rc = read_sample(r, json_array_get(samples, i), (int)i, err, errlen);
        if (rc != 0)
            goto fail;
    }
    return 0;
fail:
    pf_retention_free(r);
    return rc;
}

int pf_retention_load(struct pf_retention *r, const char *path, char *err,
                      size_t errlen)
{
    memset(r, 0, sizeof(*r));
    json_t *doc;
    int rc = tg_json_load_file(path, &doc, err, errlen);
    if (rc != 0)
        return rc;
    rc = pf_retention_from_json(r, doc, err, errlen);
    json_decref(doc);
    return rc;
}

/* ---- statistics -------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Neumaier's compensated sum (Neumaier 1974, "Rundungsfehleranalyse einiger
 * Verfahren zur Summation endlicher Summen"): keeps the rounding error of
 * every addition in c and adds it back at the end. */
static double sum_compensated(const double *v, int n)
{
    double s = 0.0, c = 0.0;
    for (int i = 0; i < n; i++) {
        double t = s + v[i];
        if (fabs(s) >= fabs(v[i]))
            c += (s - t) + v[i];
        else
            c += (v[i] - t) + s;
        s = t;
    }
    return s + c;
}

int pf_stats_compute(const double *x, int samples, size_t stride, int H,
                     double *mean, double *std)
{
    double *col = malloc((size_t)(samples > 0 ? samples : 1) * sizeof(double));
    if (col == NULL)
        return TG_ENOMEM;
    for (int h = 0; h < H; h++) {
        if (samples <= 0) {
            mean[h] = std[h] = 0.0;
            continue;
        }
        for (int s = 0; s < samples; s++)
            col[s] = x[(size_t)s * stride + (size_t)h];
        qsort(col, (size_t)samples, sizeof(double), cmp_double);
        double m = sum_compensated(col, samples) / (double)samples;
        for (int s = 0; s < samples; s++) {
            double dev = col[s] - m;
            col[s] = dev * dev;
        }
        qsort(col, (size_t)samples, sizeof(double), cmp_double);
        mean[h] = m;
        std[h] = sqrt(sum_compensated(col, samples) / (double)samples);
    }
    free(col);
    return 0;
}

double pf_budget_from_stats(double mean, double std, double alpha)
{
    double b = mean + alpha * std;
    if (!(b <= 1.0)) /* also catches NaN */
        b = 1.0;
    if (b < PF_BUDGET_MIN)
        b = PF_BUDGET_MIN;
    return b;
}

/* ---- grouping ---------------------------------------------------------- */

struct head_key {
    double budget;
    int head;
};

static int cmp_head_key(const void *a, const void *b)
{
    const struct head_key *x = a, *y = b;
    if (x->budget != y->budget)
        return x->budget < y->budget ? -1 : 1;
    return (x->head > y->head) - (x->head < y->head);
}

int pf_layer_group(const double *budget, int H, int heads_per_group,
                   enum pf_grouping grouping, int *groups, char *err,
                   size_t errlen)
{
    if (H < 1 || heads_per_group < 1 || heads_per_group > H ||
        H % heads_per_group != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "heads_per_group: %d does not divide num_kv_heads %d",
                          heads_per_group, H);
    if (grouping == PF_GROUPING_ADJACENT) {
        for (int h = 0; h < H; h++)
            groups[h] = h;
        return 0;
    }
    struct head_key *keys = malloc((size_t)H * sizeof(*keys));
    if (keys == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "grouping: out of memory");
    for (int h = 0; h < H; h++) {
        keys[h].budget = budget[h];
        keys[h].head = h;
    }
    /* The key (budget, head) is a total order, so qsort's instability
     * cannot change the result. */
    qsort(keys, (size_t)H, sizeof(*keys), cmp_head_key);
    for (int i = 0; i < H; i++)
        groups[i] = keys[i].head;
    free(keys);
    return 0;
}

int pf_profile_regroup(struct pf_profile *p, int heads_per_group,
                       enum pf_grouping grouping, char *err, size_t errlen)
{
    int H = p->num_kv_heads, L = p->num_layers;
    if (H < 1 || heads_per_group < 1 || heads_per_group > H ||
        H % heads_per_group != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "heads_per_group: %d does not divide num_kv_heads %d",
                          heads_per_group, H);
    int G = H / heads_per_group;
    int *groups = malloc((size_t)L * (size_t)H * sizeof(int));
    double *gb = malloc((size_t)L * (size_t)G * sizeof(double));
    int rc = 0;
    if (groups == NULL || gb == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "grouping: out of memory");
        goto fail;
    }
    for (int l = 0; l < L; l++) {
        size_t off = (size_t)l * (size_t)H;
        rc = pf_layer_group(p->budget + off, H, heads_per_group, grouping,
                            groups + off, err, errlen);
        if (rc != 0)
            goto fail;
    }
    free(p->groups);
    free(p->group_budget);
    p->groups = groups;
    p->group_budget = gb;
    p->heads_per_group = heads_per_group;
    p->num_groups = G;
    p->grouping = grouping;
    return pf_profile_finish(p, err, errlen);
fail:
    free(groups);
    free(gb);
    return rc;
}

int pf_profile_build(struct pf_profile *out, const struct pf_retention *r,
                     double alpha, int heads_per_group,
                     enum pf_grouping grouping, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!(alpha >= 0.0 && isfinite(alpha)))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "alpha: %g must be a finite number >= 0", alpha);
    if (r->samples < 1 || r->ratio == NULL)
        return tg_err_set(err, errlen, TG_EINVAL, "retention: no samples");
    int rc = pf_profile_init(out, r->architecture, r->method, r->num_layers,
                             r->num_kv_heads, r->head_dim, heads_per_group, err,
                             errlen);
    if (rc != 0)
        return rc;
    out->samples = r->samples;
    out->target_ratio = r->target_ratio;
    out->alpha = alpha;
    out->grouping = grouping;
    if (r->model_identity != NULL &&
        (rc = pf_profile_set_identity(out, r->model_identity, err,
                                      errlen)) != 0)
        goto fail;
    int H = r->num_kv_heads;
    size_t stride = (size_t)r->num_layers * (size_t)H;
    for (int l = 0; l < r->num_layers; l++) {
        size_t off = (size_t)l * (size_t)H;
        if (pf_stats_compute(r->ratio + off, r->samples, stride, H,
                             out->mean + off, out->std + off) != 0) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "build: out of memory");
            goto fail;
        }
        for (int h = 0; h < H; h++)
            out->budget[off + (size_t)h] = pf_budget_from_stats(
                out->mean[off + (size_t)h], out->std[off + (size_t)h], alpha);
        rc = pf_layer_group(out->budget + off, H, heads_per_group, grouping,
                            out->groups + off, err, errlen);
        if (rc != 0)
            goto fail;
    }
    rc = pf_profile_finish(out, err, errlen);
    if (rc == 0)
        return 0;
fail:
    pf_profile_free(out);
    return rc;
}

int pf_retention_to_json(const struct pf_retention *r, json_t **out,
                         char *err, size_t errlen)
{
    *out = NULL;
    json_t *doc = json_object();
    json_t *model = json_object();
    json_t *samples = json_array();
    int ok = doc && model && samples;
    if (ok) {
        json_object_set_new(model, "architecture",
                            json_string(r->architecture ? r->architecture : ""));
        json_object_set_new(model, "num_layers", json_integer(r->num_layers));
        json_object_set_new(model, "num_kv_heads", json_integer(r->num_kv_heads));
        json_object_set_new(model, "head_dim", json_integer(r->head_dim));
        if (r->model_identity != NULL)
            json_object_set_new(model, "identity",
                                json_string(r->model_identity));
    }
    size_t LH = (size_t)r->num_layers * (size_t)r->num_kv_heads;
    for (int s = 0; ok && s < r->samples; s++) {
        json_t *layers = json_array();
        ok = layers != NULL && json_array_append_new(samples, layers) == 0;
        for (int l = 0; ok && l < r->num_layers; l++) {
            json_t *heads = tg_json_doubles(r->ratio + (size_t)s * LH +
                                                (size_t)l * (size_t)r->num_kv_heads,
                                            (size_t)r->num_kv_heads);
            ok = heads != NULL && json_array_append_new(layers, heads) == 0;
        }
    }
    if (!ok) {
        json_decref(doc);
        json_decref(model);
        json_decref(samples);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    json_object_set_new(doc, "format", json_string(PF_RETENTION_FORMAT));
    json_object_set_new(doc, "version", json_integer(PF_RETENTION_VERSION));
    json_object_set_new(doc, "model", model);
    json_object_set_new(doc, "method", json_string(r->method ? r->method : ""));
    json_object_set_new(doc, "target_ratio", json_real(r->target_ratio));
    json_object_set_new(doc, "samples", samples);
    *out = doc;
    return 0;
}

int pf_retention_save(const struct pf_retention *r, const char *path,
                      char *err, size_t errlen)
{
    json_t *doc;
    int rc = pf_retention_to_json(r, &doc, err, errlen);
    if (rc != 0)
        return rc;
    rc = tg_json_dump_file(doc, path, err, errlen);
    json_decref(doc);
    return rc;
}
