/* pf_profile.c — the profile struct, its checks and its JSON form
 * (pf_profile.h, DESIGN.md §4.2). */
#include "common/profile/pf_profile.h"
#include "common/profile/pf_identity.h"
#include "common/base/tg_err.h"
#include "common/json/tg_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int pf_grouping_parse(const char *s, enum pf_grouping *out)
{
    if (s != NULL && strcmp(s, "clustered") == 0) {
        *out = PF_GROUPING_CLUSTERED;
        return 0;
    }
    if (s != NULL && strcmp(s, "adjacent") == 0) {
        *out = PF_GROUPING_ADJACENT;
        return 0;
    }
    return TG_EINVAL;
}

const char *pf_grouping_name(enum pf_grouping g)
{
    return g == PF_GROUPING_ADJACENT ? "adjacent" : "clustered";
}

static int check_sizes(int L, int H, int d, int hp, char *err, size_t errlen)
{
    if (L < 1 || L > PF_MAX_LAYERS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "model.num_layers: %d is out of range [1, %d]", L,
                          PF_MAX_LAYERS);
    if (H < 1 || H > PF_MAX_HEADS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "model.num_kv_heads: %d is out of range [1, %d]", H,
                          PF_MAX_HEADS);
    if (d < 1 || d > PF_MAX_HEAD_DIM)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "model.head_dim: %d is out of range [1, %d]", d,
                          PF_MAX_HEAD_DIM);
    if (hp < 1 || hp > H)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "heads_per_group: %d is out of range [1, %d]", hp, H);
    if (H % hp != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "heads_per_group: %d does not divide num_kv_heads %d",
                          hp, H);
    return 0;
}

int pf_profile_init(struct pf_profile *p, const char *architecture,
                    const char *method, int num_layers, int num_kv_heads,
                    int head_dim, int heads_per_group, char *err,
                    size_t errlen)
{
    memset(p, 0, sizeof(*p));
    int rc = check_sizes(num_layers, num_kv_heads, head_dim, heads_per_group,
                         err, errlen);
    if (rc != 0)
        return rc;
    size_t lh = (size_t)num_layers * (size_t)num_kv_heads;
    size_t lg = (size_t)num_layers * (size_t)(num_kv_heads / heads_per_group);
    p->num_layers = num_layers;
    p->num_kv_heads = num_kv_heads;
    p->head_dim = head_dim;
    p->heads_per_group = heads_per_group;
    p->num_groups = num_kv_heads / heads_per_group;
    p->target_ratio = 1.0;
    p->grouping = PF_GROUPING_CLUSTERED;
    p->architecture = strdup(architecture != NULL ? architecture : "");
    if (p->architecture == NULL)
        goto nomem;
    p->method = strdup(method != NULL ? method : "");
    if (p->method == NULL)
        goto nomem;
    p->mean = calloc(lh, sizeof(double));
    if (p->mean == NULL)
        goto nomem;
    p->std = calloc(lh, sizeof(double));
    if (p->std == NULL)
        goto nomem;
    p->budget = calloc(lh, sizeof(double));
    if (p->budget == NULL)
        goto nomem;
    p->groups = malloc(lh * sizeof(int));
    if (p->groups == NULL)
        goto nomem;
    p->group_budget = calloc(lg, sizeof(double));
    if (p->group_budget == NULL)
        goto nomem;
    p->budget_mean = calloc((size_t)num_layers, sizeof(double));
    if (p->budget_mean == NULL)
        goto nomem;
    for (size_t i = 0; i < lh; i++)
        p->groups[i] = (int)(i % (size_t)num_kv_heads);
    return 0;
nomem:
    pf_profile_free(p);
    return tg_err_set(err, errlen, TG_ENOMEM, "profile: out of memory");
}

int pf_profile_init_full(struct pf_profile *p, int num_layers,
                         int num_kv_heads, int head_dim, int heads_per_group,
                         char *err, size_t errlen)
{
    int rc = pf_profile_init(p, "", "none", num_layers, num_kv_heads,
                             head_dim, heads_per_group, err, errlen);
    if (rc != 0)
        return rc;
    size_t lh = (size_t)num_layers * (size_t)num_kv_heads;
    for (size_t i = 0; i < lh; i++) {
        p->mean[i] = 1.0;
        p->budget[i] = 1.0;
    }
    /* All budgets are equal, so the clustered order (budget, head) is the
     * head order: adjacent groups are also the clustered ones. */
    rc = pf_profile_finish(p, err, errlen);
    if (rc != 0)
        pf_profile_free(p);
    return rc;
}

int pf_profile_set_identity(struct pf_profile *p, const char *identity,
                            char *err, size_t errlen)
{
    if (identity != NULL && !pf_identity_valid(identity))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "model identity \"%.80s\" is not \"sha256:\" and "
                          "64 lowercase hex digits", identity);
    char *copy = NULL;
    if (identity != NULL && (copy = strdup(identity)) == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "profile: out of memory");
    free(p->model_identity);
    p->model_identity = copy;
    return 0;
}

int pf_profile_check_model(const struct pf_profile *p, const char *path,
                           const struct mc_model_config *mc, int force,
                           char *warn, size_t warnlen, char *err,
                           size_t errlen)
{
    if (warn != NULL && warnlen > 0)
        warn[0] = '\0';
    if (p->num_layers != mc->num_layers || p->num_kv_heads != mc->num_kv_heads ||
        p->head_dim != mc->head_dim)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "profile %s is for L=%d H=%d d=%d, the model has "
                          "L=%d H=%d d=%d", path, p->num_layers,
                          p->num_kv_heads, p->head_dim, mc->num_layers,
                          mc->num_kv_heads, mc->head_dim);
    char id[PF_IDENTITY_LEN + 1], desc[160];
    int rc = pf_identity_of_config(mc, id);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "cannot hash the model's config "
                          "(libsodium failed to start)");
    pf_identity_describe(mc, desc, sizeof(desc));
    if (p->model_identity == NULL) {
        if (warn != NULL)
            snprintf(warn, warnlen,
                     "profile %s records no model identity (it was made "
                     "before profiles carried one): it is not checked "
                     "against the model %s (%s); rebuild it "
                     "(tangram-profile calibrate, or build --model)", path,
                     id, desc);
        return 0;
    }
    if (strcmp(p->model_identity, id) == 0)
        return 0;
    if (force) {
        if (warn != NULL)
            snprintf(warn, warnlen,
                     "profile %s was made for model %s, not for this model "
                     "%s (%s); used anyway (--profile-force)", path,
                     p->model_identity, id, desc);
        return 0;
    }
    return tg_err_set(err, errlen, TG_EINVAL,
                      "profile %s was made for model %s (%s), but the model "
                      "is %s (%s): its budgets were measured on another model; "
                      "calibrate one for this model (tangram-profile "
                      "calibrate) or pass --profile-force to use it anyway",
                      path, p->model_identity, p->architecture, id, desc);
}

int pf_profile_for_model(struct pf_profile *p, const char *path,
                         const struct mc_model_config *mc,
                         int heads_per_group, int force, char *warn,
                         size_t warnlen, char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (warn != NULL && warnlen > 0)
        warn[0] = '\0';
    if (path == NULL || path[0] == '\0' || strcasecmp(path, "none") == 0)
        /* Without a profile the flag is a wish: a model with fewer KV
         * heads (or a non-divisor) gets the nearest layout that exists. */
        return pf_profile_init_full(
            p, mc->num_layers, mc->num_kv_heads, mc->head_dim,
            pf_full_heads_per_group(mc->num_kv_heads, heads_per_group), err,
            errlen);
    int rc = pf_profile_load(p, path, err, errlen);
    if (rc != 0)
        return rc;
    rc = pf_profile_check_model(p, path, mc, force, warn, warnlen, err,
                                errlen);
    if (rc != 0)
        pf_profile_free(p);
    return rc;
}

void pf_profile_free(struct pf_profile *p)
{
    if (p == NULL)
        return;
    free(p->architecture);
    free(p->model_identity);
    free(p->method);
    free(p->mean);
    free(p->std);
    free(p->budget);
    free(p->groups);
    free(p->group_budget);
    free(p->budget_mean);
    pf_trig_free(&p->trig);
    memset(p, 0, sizeof(*p));
}

const int *pf_profile_group(const struct pf_profile *p, int layer, int group)
{
    return p->groups + ((size_t)layer * (size_t)p->num_kv_heads +
                        (size_t)group * (size_t)p->heads_per_group);
}

double pf_profile_group_budget(const struct pf_profile *p, int layer,
                               int group)
{
    return p->group_budget[(size_t)layer * (size_t)p->num_groups +
                           (size_t)group];
}

/* Checks that the G x H_p heads of one layer partition 0..H-1. `seen` has
 * H entries of scratch. */
static int check_partition(const int *heads, int H, int layer, char *seen,
                           char *err, size_t errlen)
{
    memset(seen, 0, (size_t)H);
    for (int i = 0; i < H; i++) {
        int h = heads[i];
        if (h < 0 || h >= H)
            return tg_err_set(err, errlen, TG_ERANGE,
                              "layers[%d].groups: head %d is out of range "
                              "[0, %d]", layer, h, H - 1);
        if (seen[h])
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "layers[%d].groups: head %d appears twice",
                              layer, h);
        seen[h] = 1;
    }
    return 0;
}

static int check_values(const double *v, int H, int layer, const char *name,
                        double lo, double hi, char *err, size_t errlen)
{
    for (int h = 0; h < H; h++)
        if (!(v[h] >= lo && v[h] <= hi))
            return tg_err_set(err, errlen, TG_ERANGE,
                              "layers[%d].%s[%d]: %g is out of range [%g, %g]",
                              layer, name, h, v[h], lo, hi);
    return 0;
}

int pf_profile_validate(const struct pf_profile *p, char *err, size_t errlen)
{
    int rc = check_sizes(p->num_layers, p->num_kv_heads, p->head_dim,
                         p->heads_per_group, err, errlen);
    if (rc != 0)
        return TG_ERANGE;
    if (p->num_groups != p->num_kv_heads / p->heads_per_group)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "profile: num_groups %d != H/H_p", p->num_groups);
    if (p->architecture == NULL || p->method == NULL || p->mean == NULL ||
        p->std == NULL || p->budget == NULL || p->groups == NULL ||
        p->group_budget == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT, "profile: not initialized");
    rc = pf_trig_validate(&p->trig, p->num_layers, p->num_kv_heads,
                          p->head_dim, err, errlen);
    if (rc != 0)
        return rc;
    if (!(p->target_ratio > 0.0 && p->target_ratio <= 1.0))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "target_ratio: %g is out of range (0, 1]",
                          p->target_ratio);
    if (!(p->alpha >= 0.0 && isfinite(p->alpha)))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "alpha: %g must be a finite number >= 0", p->alpha);
    if (p->samples < 0)
        return tg_err_set(err, errlen, TG_ERANGE, "samples: %d is negative",
                          p->samples);
    int H = p->num_kv_heads, G = p->num_groups, hp = p->heads_per_group;
    char *seen = malloc((size_t)H);
    if (seen == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "profile: out of memory");
    for (int l = 0; l < p->num_layers && rc == 0; l++) {
        size_t off = (size_t)l * (size_t)H;
        rc = check_values(p->mean + off, H, l, "mean", 0.0, 1.0, err, errlen);
        if (rc == 0)
            rc = check_values(p->std + off, H, l, "std", 0.0, 1.0, err, errlen);
        if (rc == 0)
            rc = check_values(p->budget + off, H, l, "budget", PF_BUDGET_MIN,
                              1.0, err, errlen);
        if (rc == 0)
            rc = check_partition(p->groups + off, H, l, seen, err, errlen);
        for (int g = 0; g < G && rc == 0; g++) {
            const int *heads = pf_profile_group(p, l, g);
            double mx = 0.0;
            for (int j = 0; j < hp; j++)
                mx = fmax(mx, p->budget[off + (size_t)heads[j]]);
            if (pf_profile_group_budget(p, l, g) != mx)
                rc = tg_err_set(err, errlen, TG_EFORMAT,
                                "layers[%d].groups[%d]: group budget %g is not "
                                "the max member budget %g",
                                l, g, pf_profile_group_budget(p, l, g), mx);
        }
    }
    free(seen);
    return rc;
}

int pf_profile_finish(struct pf_profile *p, char *err, size_t errlen)
{
    if (p->groups == NULL || p->budget == NULL || p->group_budget == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT, "profile: not initialized");
    int H = p->num_kv_heads, hp = p->heads_per_group;
    for (int l = 0; l < p->num_layers; l++) {
        double sum = 0.0;
        for (int h = 0; h < H; h++)
            sum += p->budget[(size_t)l * (size_t)H + (size_t)h];
        if (p->budget_mean != NULL)
            p->budget_mean[l] = sum / (double)H;
        for (int g = 0; g < p->num_groups; g++) {
            const int *heads = pf_profile_group(p, l, g);
            double mx = 0.0;
            for (int j = 0; j < hp; j++) {
                int h = heads[j];
                if (h >= 0 && h < H)
                    mx = fmax(mx, p->budget[(size_t)l * (size_t)H + (size_t)h]);
            }
            p->group_budget[(size_t)l * (size_t)p->num_groups + (size_t)g] = mx;
        }
    }
    return pf_profile_validate(p, err, errlen);
}

/* ---- loading ---------------------------------------------------------- */

static int read_groups(struct pf_profile *p, const json_t *layer, int l,
                       char *seen, char *err, size_t errlen)
{
    char ctx[64];
    snprintf(ctx, sizeof(ctx), "layers[%d]", l);
    json_t *arr;
    int rc = tg_json_get_array(layer, "groups", ctx, p->num_groups, &arr, err,
                               errlen);
    if (rc != 0)
        return rc;
    int H = p->num_kv_heads, hp = p->heads_per_group;
    int *out = p->groups + (size_t)l * (size_t)H;
    for (int g = 0; g < p->num_groups; g++) {
        json_t *grp = json_array_get(arr, (size_t)g);
        if (!json_is_array(grp))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "layers[%d].groups[%d]: expected an array of "
                              "head indices", l, g);
        if (json_array_size(grp) != (size_t)hp)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "layers[%d].groups[%d]: expected %d heads "
                              "(heads_per_group), found %zu",
                              l, g, hp, json_array_size(grp));
        for (int j = 0; j < hp; j++) {
            json_t *v = json_array_get(grp, (size_t)j);
            if (!json_is_integer(v))
                return tg_err_set(err, errlen, TG_EFORMAT,
                                  "layers[%d].groups[%d][%d]: expected an "
                                  "integer head index", l, g, j);
            json_int_t h = json_integer_value(v);
            if (h < 0 || h >= H)
                return tg_err_set(err, errlen, TG_ERANGE,
                                  "layers[%d].groups[%d][%d]: head %lld is out "
                                  "of range [0, %d]",
                                  l, g, j, (long long)h, H - 1);
            out[g * hp + j] = (int)h;
        }
    }
    return check_partition(out, H, l, seen, err, errlen);
}

static int read_layer(struct pf_profile *p, const json_t *layer, int l,
                      char *seen, char *err, size_t errlen)
{
    char ctx[64], actx[80];
    snprintf(ctx, sizeof(ctx), "layers[%d]", l);
    if (!json_is_object(layer))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s: expected an object",
                          ctx);
    static const char *const names[3] = {"mean", "std", "budget"};
    double *dst[3];
    size_t off = (size_t)l * (size_t)p->num_kv_heads;
    dst[0] = p->mean + off;
    dst[1] = p->std + off;
    dst[2] = p->budget + off;
    for (int k = 0; k < 3; k++) {
        json_t *arr;
        int rc = tg_json_get_array(layer, names[k], ctx, p->num_kv_heads, &arr,
                                   err, errlen);
        if (rc != 0)
            return rc;
        snprintf(actx, sizeof(actx), "%s.%s", ctx, names[k]);
        rc = tg_json_read_doubles(arr, actx, (size_t)p->num_kv_heads,
                                  k == 2 ? PF_BUDGET_MIN : 0.0, 1.0, dst[k],
                                  err, errlen);
        if (rc != 0)
            return rc;
    }
    return read_groups(p, layer, l, seen, err, errlen);
}

int pf_profile_from_json(struct pf_profile *p, const json_t *doc, char *err,
                         size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (!json_is_object(doc))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "(root): expected a JSON object");
    const char *s;
    int rc = tg_json_get_string(doc, "format", "", &s, err, errlen);
    if (rc != 0)
        return rc;
    if (strcmp(s, PF_PROFILE_FORMAT) != 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "format: expected \"%s\", found \"%s\"",
                          PF_PROFILE_FORMAT, s);
    int64_t version, L, H, d, hp, samples;
    rc = tg_json_get_int(doc, "version", "", 0, INT32_MAX, &version, err,
                         errlen);
    if (rc != 0)
        return rc;
    if (version != PF_PROFILE_VERSION)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "version: unsupported version %lld (expected %d)",
                          (long long)version, PF_PROFILE_VERSION);
    json_t *model;
    const char *arch, *method;
    const char *identity = NULL;
    if ((rc = tg_json_get_object(doc, "model", "", &model, err, errlen)) != 0 ||
        (rc = tg_json_get_string(model, "architecture", "model", &arch, err,
                                 errlen)) != 0 ||
        (rc = tg_json_get_int(model, "num_layers", "model", 1, PF_MAX_LAYERS,
                              &L, err, errlen)) != 0 ||
        (rc = tg_json_get_int(model, "num_kv_heads", "model", 1, PF_MAX_HEADS,
                              &H, err, errlen)) != 0 ||
        (rc = tg_json_get_int(model, "head_dim", "model", 1, PF_MAX_HEAD_DIM,
                              &d, err, errlen)) != 0 ||
        (rc = tg_json_get_string(doc, "method", "", &method, err, errlen)) != 0)
        return rc;
    if (method[0] == '\0')
        return tg_err_set(err, errlen, TG_EFORMAT, "method: empty string");
    if (json_object_get(model, "identity") != NULL) {
        rc = tg_json_get_string(model, "identity", "model", &identity, err,
                                errlen);
        if (rc != 0)
            return rc;
        if (!pf_identity_valid(identity))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.identity: \"%.80s\" is not \"sha256:\" "
                              "and 64 lowercase hex digits", identity);
    }
    double ratio, alpha;
    if ((rc = tg_json_get_double(doc, "target_ratio", "", 0.0, 1.0, &ratio, err,
                                 errlen)) != 0 ||
        (rc = tg_json_get_double(doc, "alpha", "", 0.0, 1.0e6, &alpha, err,
                                 errlen)) != 0 ||
        (rc = tg_json_get_int(doc, "samples", "", 0, INT32_MAX, &samples, err,
                              errlen)) != 0 ||
        (rc = tg_json_get_int(doc, "heads_per_group", "", 1, H, &hp, err,
                              errlen)) != 0)
        return rc;
    if (!(ratio > 0.0))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "target_ratio: %g is out of range (0, 1]", ratio);
    if (H % hp != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "heads_per_group: %lld does not divide "
                          "model.num_kv_heads %lld",
                          (long long)hp, (long long)H);
    enum pf_grouping grouping = PF_GROUPING_CLUSTERED;
    if (json_object_get(doc, "grouping") != NULL) {
        const char *gs;
        rc = tg_json_get_string(doc, "grouping", "", &gs, err, errlen);
        if (rc != 0)
            return rc;
        if (pf_grouping_parse(gs, &grouping) != 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "grouping: expected \"clustered\" or "
                              "\"adjacent\", found \"%s\"", gs);
    }
    json_t *layers;
    rc = tg_json_get_array(doc, "layers", "", (long)L, &layers, err, errlen);
    if (rc != 0)
        return rc;
    rc = pf_profile_init(p, arch, method, (int)L, (int)H, (int)d, (int)hp, err,
                         errlen);
    if (rc != 0)
        return rc;
    p->samples = (int)samples;
    p->target_ratio = ratio;
    p->alpha = alpha;
    p->grouping = grouping;
    if (identity != NULL &&
        (rc = pf_profile_set_identity(p, identity, err, errlen)) != 0)
        goto fail;
    char *seen = malloc((size_t)H);
    if (seen == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "profile: out of memory");
        goto fail;
    }
    for (int l = 0; l < (int)L && rc == 0; l++)
        rc = read_layer(p, json_array_get(layers, (size_t)l), l, seen, err,
                        errlen);
    free(seen);
    json_t *trig = json_object_get(doc, "trig");
    if (rc == 0 && trig != NULL)
        rc = pf_trig_from_json(&p->trig, trig, (int)L, (int)H, (int)d, err,
                               errlen);
    if (rc == 0)
        rc = pf_profile_finish(p, err, errlen);
    if (rc == 0)
        return 0;
fail:
    pf_profile_free(p);
    return rc;
}

int pf_profile_load(struct pf_profile *p, const char *path, char *err,
                    size_t errlen)
{
    memset(p, 0, sizeof(*p));
    json_t *doc;
    int rc = tg_json_load_file(path, &doc, err, errlen);
    if (rc != 0)
        return rc;
    rc = pf_profile_from_json(p, doc, err, errlen);
    json_decref(doc);
    return rc;
}

/* ---- saving ----------------------------------------------------------- */

static json_t *layer_json(const struct pf_profile *p, int l)
{
    size_t off = (size_t)l * (size_t)p->num_kv_heads;
    size_t H = (size_t)p->num_kv_heads;
    json_t *o = json_object();
    json_t *groups = json_array();
    int bad = (o == NULL || groups == NULL);
    for (int g = 0; g < p->num_groups && !bad; g++) {
        const int *heads = pf_profile_group(p, l, g);
        json_t *grp = json_array();
        bad |= json_array_append_new(groups, grp) != 0;
        for (int j = 0; j < p->heads_per_group && !bad; j++)
            bad |= json_array_append_new(grp, json_integer(heads[j])) != 0;
    }
    if (!bad) {
        bad |= json_object_set_new(o, "mean", tg_json_doubles(p->mean + off, H));
        bad |= json_object_set_new(o, "std", tg_json_doubles(p->std + off, H));
        bad |= json_object_set_new(o, "budget",
                                   tg_json_doubles(p->budget + off, H));
        bad |= json_object_set_new(o, "groups", groups);
        groups = NULL; /* reference stolen, even on failure */
    }
    json_decref(groups);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int pf_profile_to_json(const struct pf_profile *p, json_t **out, char *err,
                       size_t errlen)
{
    *out = NULL;
    json_t *doc = json_object();
    json_t *model = json_object();
    json_t *layers = json_array();
    int bad = (doc == NULL || model == NULL || layers == NULL);
    if (!bad) {
        bad |= json_object_set_new(model, "architecture",
                                   json_string(p->architecture));
        bad |= json_object_set_new(model, "num_layers",
                                   json_integer(p->num_layers));
        bad |= json_object_set_new(model, "num_kv_heads",
                                   json_integer(p->num_kv_heads));
        bad |= json_object_set_new(model, "head_dim", json_integer(p->head_dim));
        if (p->model_identity != NULL)
            bad |= json_object_set_new(model, "identity",
                                       json_string(p->model_identity));
        for (int l = 0; l < p->num_layers && !bad; l++)
            bad |= json_array_append_new(layers, layer_json(p, l));
        bad |= json_object_set_new(doc, "format", json_string(PF_PROFILE_FORMAT));
        bad |= json_object_set_new(doc, "version",
                                   json_integer(PF_PROFILE_VERSION));
        bad |= json_object_set_new(doc, "model", model);
        model = NULL;
        bad |= json_object_set_new(doc, "method", json_string(p->method));
        bad |= json_object_set_new(doc, "target_ratio",
                                   json_real(p->target_ratio));
        bad |= json_object_set_new(doc, "alpha", json_real(p->alpha));
        bad |= json_object_set_new(doc, "samples", json_integer(p->samples));
        bad |= json_object_set_new(doc, "heads_per_group",
                                   json_integer(p->heads_per_group));
        bad |= json_object_set_new(doc, "grouping",
                                   json_string(pf_grouping_name(p->grouping)));
        bad |= json_object_set_new(doc, "layers", layers);
        layers = NULL;
        if (p->trig.num_q_heads > 0)
            bad |= json_object_set_new(doc, "trig",
                                       pf_trig_to_json(&p->trig,
                                                       p->num_layers));
    }
    json_decref(model);
    json_decref(layers);
    if (bad) {
        json_decref(doc);
        return tg_err_set(err, errlen, TG_ENOMEM, "profile: out of memory");
    }
    *out = doc;
    return 0;
}

int pf_profile_save(const struct pf_profile *p, const char *path, char *err,
                    size_t errlen)
{
    json_t *doc;
    int rc = pf_profile_to_json(p, &doc, err, errlen);
    if (rc != 0)
        return rc;
    rc = tg_json_dump_file(doc, path, err, errlen);
    json_decref(doc);
    return rc;
}

int pf_full_heads_per_group(int num_kv_heads, int wanted)
{
    int hp = wanted < num_kv_heads ? wanted : num_kv_heads;
    while (hp > 1 && num_kv_heads % hp != 0)
        hp--;
    return hp < 1 ? 1 : hp;
}
