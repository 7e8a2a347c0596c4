/* pf_trig.c — decode-time compression statistics of a profile (see
 * pf_trig.h, DESIGN.md §4.9). */
#include "common/profile/pf_trig.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/json/tg_json.h"

static const char *const names[3] = {"re", "im", "abs"};

static float **field(struct pf_trig *t, int k)
{
    return k == 0 ? &t->re : k == 1 ? &t->im : &t->abs;
}

static const float *cfield(const struct pf_trig *t, int k)
{
    return k == 0 ? t->re : k == 1 ? t->im : t->abs;
}

void pf_trig_free(struct pf_trig *t)
{
    if (t == NULL)
        return;
    free(t->re);
    free(t->im);
    free(t->abs);
    memset(t, 0, sizeof(*t));
}

int pf_trig_init(struct pf_trig *t, int num_layers, int num_q_heads,
                 int head_dim, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    if (num_layers < 1 || num_q_heads < 1 || num_q_heads > (1 << 20) ||
        head_dim < 2 || head_dim % 2 != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig: bad shape (L=%d Hq=%d d=%d; d must be even)",
                          num_layers, num_q_heads, head_dim);
    size_t n = (size_t)num_layers * (size_t)num_q_heads *
               (size_t)(head_dim / 2);
    t->num_q_heads = num_q_heads;
    t->half = head_dim / 2;
    for (int k = 0; k < 3; k++) {
        *field(t, k) = calloc(n, sizeof(float));
        if (*field(t, k) == NULL) {
            pf_trig_free(t);
            return tg_err_set(err, errlen, TG_ENOMEM, "trig: out of memory");
        }
    }
    return 0;
}

int pf_trig_validate(const struct pf_trig *t, int num_layers,
                     int num_kv_heads, int head_dim, char *err,
                     size_t errlen)
{
    if (t->num_q_heads == 0)
        return 0;
    if (num_kv_heads < 1 || t->num_q_heads < num_kv_heads ||
        t->num_q_heads % num_kv_heads != 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "trig: %d query heads are not a multiple of the %d "
                          "KV heads", t->num_q_heads, num_kv_heads);
    if (head_dim % 2 != 0 || t->half != head_dim / 2)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "trig: %d pairs per head, head_dim %d needs %d",
                          t->half, head_dim, head_dim / 2);
    if (t->re == NULL || t->im == NULL || t->abs == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT, "trig: not initialized");
    size_t per = (size_t)t->half;
    for (int l = 0; l < num_layers; l++)
        for (int q = 0; q < t->num_q_heads; q++)
            for (int k = 0; k < 3; k++) {
                const float *v = cfield(t, k) +
                                 ((size_t)l * (size_t)t->num_q_heads +
                                  (size_t)q) * per;
                for (size_t f = 0; f < per; f++)
                    if (!isfinite(v[f]) || (k == 2 && v[f] < 0.0f))
                        return tg_err_set(
                            err, errlen, TG_ERANGE,
                            "trig.layers[%d].%s[%d][%zu]: %g is %s", l,
                            names[k], q, f, (double)v[f],
                            isfinite(v[f]) ? "negative (a mean modulus)"
                                           : "not finite");
            }
    return 0;
}

/* Reads one (Hq x d/2) array of arrays; Hq given or (when *hq is 0)
 * taken from this array. */
static int read_matrix(const json_t *arr, const char *ctx, int *hq, int half,
                       int H, float **dst, int num_layers, int l, char *err,
                       size_t errlen)
{
    if (!json_is_array(arr))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: expected an array of query heads", ctx);
    size_t n = json_array_size(arr);
    if (*hq == 0) {
        if (n < (size_t)H || n % (size_t)H != 0 || n > (1u << 20))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: %zu query heads are not a positive "
                              "multiple of the %d KV heads", ctx, n, H);
        *hq = (int)n;
    } else if (n != (size_t)*hq) {
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: expected %d query heads, found %zu", ctx, *hq,
                          n);
    }
    if (*dst == NULL) {
        *dst = calloc((size_t)num_layers * (size_t)*hq * (size_t)half,
                      sizeof(float));
        if (*dst == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "trig: out of memory");
    }
    double *tmp = malloc((size_t)half * sizeof(double));
    if (tmp == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "trig: out of memory");
    int rc = 0;
    char ectx[160];
    for (int q = 0; q < *hq && rc == 0; q++) {
        snprintf(ectx, sizeof(ectx), "%s[%d]", ctx, q);
        /* Range checks (finite, abs >= 0) follow in pf_trig_validate, with
         * the value's path. */
        rc = tg_json_read_doubles(json_array_get(arr, (size_t)q), ectx,
                                  (size_t)half, -HUGE_VAL, HUGE_VAL, tmp, err,
                                  errlen);
        float *o = *dst + ((size_t)l * (size_t)*hq + (size_t)q) * (size_t)half;
        for (int f = 0; f < half && rc == 0; f++)
            o[f] = (float)tmp[f];
    }
    free(tmp);
    return rc;
}

int pf_trig_from_json(struct pf_trig *t, const json_t *obj, int num_layers,
                      int num_kv_heads, int head_dim, char *err,
                      size_t errlen)
{
    memset(t, 0, sizeof(*t));
    if (!json_is_object(obj))
        return tg_err_set(err, errlen, TG_EFORMAT, "trig: expected an object");
    if (head_dim % 2 != 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "trig: head_dim %d is odd (RoPE pairs need an even "
                          "one)", head_dim);
    json_t *layers;
    int rc = tg_json_get_array(obj, "layers", "trig", num_layers, &layers, err,
                               errlen);
    if (rc != 0)
        return rc;
    int hq = 0, half = head_dim / 2;
    char ctx[80];
    for (int l = 0; l < num_layers && rc == 0; l++) {
        json_t *lo = json_array_get(layers, (size_t)l);
        snprintf(ctx, sizeof(ctx), "trig.layers[%d]", l);
        if (!json_is_object(lo)) {
            rc = tg_err_set(err, errlen, TG_EFORMAT, "%s: expected an object",
                            ctx);
            break;
        }
        for (int k = 0; k < 3 && rc == 0; k++) {
            json_t *arr;
            rc = tg_json_get_array(lo, names[k], ctx, -1, &arr, err, errlen);
            if (rc != 0)
                break;
            char actx[128];
            snprintf(actx, sizeof(actx), "%s.%s", ctx, names[k]);
            rc = read_matrix(arr, actx, &hq, half, num_kv_heads, field(t, k),
                             num_layers, l, err, errlen);
        }
    }
    if (rc == 0) {
        t->num_q_heads = hq;
        t->half = half;
        rc = pf_trig_validate(t, num_layers, num_kv_heads, head_dim, err,
                              errlen);
    }
    if (rc != 0)
        pf_trig_free(t);
    return rc;
}

json_t *pf_trig_to_json(const struct pf_trig *t, int num_layers)
{
    json_t *o = json_object(), *layers = json_array();
    int bad = o == NULL || layers == NULL;
    size_t per = (size_t)t->half;
    for (int l = 0; l < num_layers && !bad; l++) {
        json_t *lo = json_object();
        bad |= json_array_append_new(layers, lo) != 0;
        for (int k = 0; k < 3 && !bad; k++) {
            json_t *m = json_array();
            bad |= json_object_set_new(lo, names[k], m) != 0;
            for (int q = 0; q < t->num_q_heads && !bad; q++) {
                json_t *row = json_array();
                bad |= json_array_append_new(m, row) != 0;
                const float *v = cfield(t, k) +
                                 ((size_t)l * (size_t)t->num_q_heads +
                                  (size_t)q) * per;
                for (size_t f = 0; f < per && !bad; f++)
                    bad |= json_array_append_new(row,
                                                 json_real((double)v[f])) != 0;
            }
        }
    }
    if (!bad) {
        bad |= json_object_set_new(o, "layers", layers) != 0;
        layers = NULL;
    }
    json_decref(layers);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int pf_trig_rank(struct pf_trig *out, const struct pf_trig *whole,
                 int num_layers, int num_kv_heads, int heads_rank,
                 const int *global_head, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (whole->num_q_heads == 0)
        return 0;
    int G = whole->num_q_heads / num_kv_heads;
    int rc = pf_trig_init(out, num_layers, heads_rank * G, whole->half * 2,
                          err, errlen);
    if (rc != 0)
        return rc;
    size_t per = (size_t)whole->half;
    for (int l = 0; l < num_layers; l++)
        for (int i = 0; i < heads_rank; i++) {
            int gh = global_head[(size_t)l * (size_t)heads_rank + (size_t)i];
            if (gh < 0 || gh >= num_kv_heads) {
                pf_trig_free(out);
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "trig: rank head maps to model head %d of "
                                  "%d", gh, num_kv_heads);
            }
            for (int j = 0; j < G; j++) {
                size_t src = ((size_t)l * (size_t)whole->num_q_heads +
                              (size_t)gh * (size_t)G + (size_t)j) * per;
                size_t dst = ((size_t)l * (size_t)out->num_q_heads +
                              (size_t)i * (size_t)G + (size_t)j) * per;
                for (int k = 0; k < 3; k++)
                    memcpy(*field(out, k) + dst, cfield(whole, k) + src,
                           per * sizeof(float));
            }
        }
    return 0;
}
