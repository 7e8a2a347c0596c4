/* gw_calibrate.c — per-head retention under global top-k (gw_calibrate.h). */
#include "gpu_worker/engine/gw_calibrate.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/chat/ct_template.h"
#include "common/profile/pf_identity.h"
#include "common/base/tg_err.h"
#include "common/base/tg_path.h"
#include "common/base/tg_grow.h"
#include "common/json/tg_json.h"
#include "common/tok/tok_tokenizer.h"
#include <stdio.h>

struct cand {
    float score;
    int32_t head;
    int32_t pos;
};

/* Orders by score descending, then head, then position ascending. */
static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->head != y->head)
        return x->head < y->head ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

int gw_calibrate_layer(const float *scores, int H, int N, double ratio,
                       int window, int n_sink, double *retention)
{
    size_t total = (size_t)H * (size_t)N;
    int64_t budget = (int64_t)ceil(ratio * (double)total);
    if (budget > (int64_t)total)
        budget = (int64_t)total;
    int w = window < N ? window : N;
    struct cand *c = malloc(total * sizeof(*c));
    if (c == NULL)
        return TG_ENOMEM;
    for (int h = 0; h < H; h++)
        for (int j = 0; j < N; j++) {
            struct cand *x = &c[(size_t)h * N + j];
            int forced = j >= N - w || j < n_sink;
            x->score = forced ? INFINITY : scores[(size_t)h * N + j];
            x->head = h;
            x->pos = j;
        }
    qsort(c, total, sizeof(*c), cand_cmp);
    for (int h = 0; h < H; h++)
        retention[h] = 0;
    /* Forced keys are kept even past the budget (they are at serving time). */
    for (size_t i = 0; i < total; i++)
        if ((int64_t)i < budget || isinf(c[i].score))
            retention[c[i].head] += 1.0;
    for (int h = 0; h < H; h++)
        retention[h] /= (double)N;
    free(c);
    return 0;
}

void gw_calibrate_on_scores(void *ud, int layer, const float *scores, int n,
                            int n_kv_heads)
{
    struct gw_calib_state *st = ud;
    int rc = gw_calibrate_layer(scores, n_kv_heads, n, st->ratio, st->window,
                                st->n_sink, st->cur + (size_t)layer * n_kv_heads);
    if (rc != 0)
        st->failed = rc;
}

/* Fills r's header for n_samples samples of engine e's model. */
static int retention_alloc(const struct gw_engine *e, int n_samples,
                           struct pf_retention *r, char *err, size_t errlen)
{
    const struct gw_model *m = &e->model;
    size_t LH = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    r->ratio = calloc((size_t)n_samples * LH, sizeof(double));
    if (r->ratio == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    r->samples = n_samples;
    r->num_layers = m->n_layers;
    r->num_kv_heads = m->n_kv_heads;
    r->head_dim = m->head_dim;
    return 0;
}

int gw_calibrate_run(struct gw_engine *e, struct gw_calib_state *st,
                     const int32_t *const *samples, const int *lens,
                     int n_samples, struct pf_retention *r,
                     gw_calib_progress_fn progress, void *progress_ud,
                     char *err, size_t errlen)
{
    size_t LH = (size_t)e->model.n_layers * (size_t)e->model.n_kv_heads;
    int rc0 = retention_alloc(e, n_samples, r, err, errlen);
    if (rc0 != 0)
        return rc0;
    r->target_ratio = st->ratio;
    for (int s = 0; s < n_samples; s++) {
        if (lens[s] > e->layout.prefill_chunk)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "sample %d has %d tokens, more than the chunk of %d",
                              s, lens[s], e->layout.prefill_chunk);
        st->cur = r->ratio + (size_t)s * LH;
        st->failed = 0;
        struct gw_gen_params gp = {.max_tokens = 0, .ignore_eos = 1};
        struct gw_gen_result res;
        int rc = gw_engine_generate(e, samples[s], lens[s], &gp, &res, err, errlen);
        gw_gen_result_free(&res);
        if (rc != 0)
            return rc;
        if (st->failed != 0)
            return tg_err_set(err, errlen, st->failed, "out of memory scoring sample %d", s);
        if (progress != NULL)
            progress(progress_ud, s + 1, n_samples, lens[s]);
    }
    return 0;
}

int gw_calibrate_gvote_run(struct gw_engine *e, uint64_t seed,
                           const int32_t *const *samples, const int *lens,
                           int n_samples, struct pf_retention *r,
                           gw_calib_progress_fn progress, void *progress_ud,
                           char *err, size_t errlen)
{
    if (e->method != TG_SCORE_GVOTE)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "gvote calibration needs an engine running gvote");
    const struct pf_profile *pp = &e->profile;
    for (size_t i = 0; i < (size_t)pp->num_layers * (size_t)pp->num_kv_heads;
         i++)
        if (pp->budget[i] != 1.0)
            /* A budget below 1 would cap the votes with a reservation;
             * calibration measures what gvote keeps on its own. */
            return tg_err_set(err, errlen, TG_EINVAL,
                              "gvote calibration needs a profile-less "
                              "engine (every budget 1)");
    int rc = retention_alloc(e, n_samples, r, err, errlen);
    if (rc != 0)
        return rc;
    const int L = e->model.n_layers, H = e->model.n_kv_heads;
    const size_t LH = (size_t)L * (size_t)H;
    double sum = 0.0;
    for (int s = 0; s < n_samples; s++) {
        /* Each sample is a request of its own seed, as a served request
         * is; seed + s keeps the run a function of the flags. */
        struct gw_gen_params gp = {.max_tokens = 0,
                                   .ignore_eos = 1,
                                   .sampling = {.seed = seed + (uint64_t)s},
                                   .head_counts = 1};
        struct gw_gen_result res;
        rc = gw_engine_generate(e, samples[s], lens[s], &gp, &res, err,
                                errlen);
        if (rc == 0 && res.kept_n == NULL)
            rc = tg_err_set(err, errlen, TG_EINTERNAL,
                            "sample %d: the engine reported no head lengths",
                            s);
        double *row = r->ratio + (size_t)s * LH;
        /* kept_n is in model head order, the retention file's. With no
         * decode it holds what the sample's chunks kept, all of them. */
        for (size_t i = 0; rc == 0 && i < LH; i++) {
            int32_t k = res.kept_n[i];
            if (k < 1 || k > lens[s]) {
                rc = tg_err_set(err, errlen, TG_EINTERNAL,
                                "sample %d: layer %d head %d kept %d of %d "
                                "keys", s, (int)(i / (size_t)H),
                                (int)(i % (size_t)H), k, lens[s]);
                break;
            }
            row[i] = (double)k / (double)lens[s];
            sum += row[i];
        }
        gw_gen_result_free(&res);
        if (rc != 0)
            return rc;
        if (progress != NULL)
            progress(progress_ud, s + 1, n_samples, lens[s]);
    }
    /* The mean of ratios in (0, 1] lies in (0, 1]; the clamp only guards
     * the last ulp of the division. */
    double mean = sum / ((double)n_samples * (double)LH);
    r->target_ratio = mean > 1.0 ? 1.0 : mean;
    return 0;
}

/* Tokenizes one JSONL sample into ids. */
static int sample_ids(const struct tok_tokenizer *tok, const struct ct_template *tmpl,
                      const json_t *doc, int line, struct tok_ids *ids,
                      char *err, size_t errlen)
{
    json_t *v;
    ids->n = 0;
    if ((v = json_object_get(doc, "prompt_ids")) != NULL) {
        if (!json_is_array(v))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "line %d: prompt_ids must be an array", line);
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *x = json_array_get(v, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= tok_vocab_size(tok))
                return tg_err_set(err, errlen, TG_EFORMAT,
                                  "line %d: prompt_ids[%zu] is not a token id",
                                  line, i);
            if (TG_GROW(ids->v, &ids->cap, ids->n + 1))
                return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            ids->v[ids->n++] = (int32_t)json_integer_value(x);
        }
        return 0;
    }
    if ((v = json_object_get(doc, "text")) != NULL) {
        if (!json_is_string(v))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "line %d: text must be a string", line);
        return tok_encode(tok, NULL, json_string_value(v), json_string_length(v),
                          TOK_ENCODE_ADD_SPECIAL, ids, err, errlen);
    }
    if ((v = json_object_get(doc, "messages")) != NULL) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "line %d: messages must be a non-empty array", line);
        /* The model's own chat template renders the conversation as it
         * is, without a generation prompt (a sample is a whole text). */
        struct ct_render_opts co = {.add_generation_prompt = false};
        char *text = NULL;
        size_t len = 0;
        int rc = ct_template_render(tmpl, v, NULL, &co, &text, &len, err,
                                    errlen);
        if (rc != 0)
            return rc;
        /* The rendered template already holds BOS where the model wants it. */
        rc = tok_encode(tok, NULL, text, len, 0, ids, err, errlen);
        free(text);
        return rc;
    }
    return tg_err_set(err, errlen, TG_EFORMAT,
                      "line %d: expected \"text\", \"messages\" or \"prompt_ids\"",
                      line);
}

/* Reads the samples file into arrays of token ids. */
static int read_samples(const struct gw_calib_opts *o, const struct tok_tokenizer *tok,
                        int32_t ***out, int **lens, int *n_out, int *max_len,
                        char *err, size_t errlen)
{
    FILE *f = fopen(o->samples_path, "r");
    if (f == NULL)
        return tg_err_set(err, errlen, TG_ENOENT, "%s: cannot open",
                          o->samples_path);
    struct ct_template tmpl_store, *tmpl = &tmpl_store;
    char terr[512];
    if (ct_template_load_dir(tmpl, o->model_dir, terr, sizeof(terr)) != 0)
        tmpl = NULL; /* only chat samples need it; they report the error */
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int n = 0, lineno = 0, rc = 0, alloc = 0;
    struct tok_ids ids = {0};
    *out = NULL;
    *lens = NULL;
    *max_len = 0;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (got == 0)
            continue;
        json_t *doc;
        rc = tg_json_load_buf(line, (size_t)got, &doc, err, errlen);
        if (rc != 0) {
            char tmp[512];
            snprintf(tmp, sizeof(tmp), "%s", err);
            rc = tg_err_set(err, errlen, rc, "%s line %d: %s", o->samples_path,
                            lineno, tmp);
            break;
        }
        if (!json_is_object(doc)) {
            json_decref(doc);
            rc = tg_err_set(err, errlen, TG_EFORMAT, "%s line %d: expected an object",
                            o->samples_path, lineno);
            break;
        }
        if (json_object_get(doc, "messages") != NULL && tmpl == NULL) {
            json_decref(doc);
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s line %d: chat messages need a chat template: %s",
                            o->samples_path, lineno, terr);
            break;
        }
        rc = sample_ids(tok, tmpl, doc, lineno, &ids, err, errlen);
        json_decref(doc);
        if (rc != 0)
            break;
        if (ids.n == 0)
            continue;
        /* Samples and lengths share one capacity. */
        int32_t cap_out = alloc, cap_lens = alloc;
        if (TG_GROW(*out, &cap_out, (int64_t)n + 1) ||
            TG_GROW(*lens, &cap_lens, (int64_t)n + 1)) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        alloc = cap_out;
        int len = ids.n > (size_t)o->max_sample_tokens ? o->max_sample_tokens : (int)ids.n;
        (*out)[n] = malloc((size_t)len * sizeof(int32_t));
        if ((*out)[n] == NULL) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        memcpy((*out)[n], ids.v, (size_t)len * sizeof(int32_t));
        (*lens)[n] = len;
        if (len > *max_len)
            *max_len = len;
        n++;
    }
    free(line);
    if (tmpl != NULL)
        ct_template_free(tmpl);
    tok_ids_free(&ids);
    fclose(f);
    *n_out = n;
    if (rc == 0 && n == 0)
        rc = tg_err_set(err, errlen, TG_EFORMAT, "%s: no samples", o->samples_path);
    return rc;
}

void gw_calibrate_on_queries(void *ud, int layer, const float *q, int n,
                             int n_q_heads, int head_dim)
{
    struct gw_calib_trig *t = ud;
    if (layer < 0 || layer >= t->n_layers || n_q_heads != t->n_q_heads ||
        head_dim != 2 * t->half) {
        t->failed = 1;
        return;
    }
    const int half = t->half;
    size_t base = (size_t)layer * (size_t)n_q_heads * (size_t)half;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_q_heads; h++) {
            /* Rotate-half pairing: z_f = x_f + i x_{f + d/2}. */
            const float *x = q + ((size_t)i * (size_t)n_q_heads + (size_t)h) *
                                     (size_t)head_dim;
            size_t o = base + (size_t)h * (size_t)half;
            for (int f = 0; f < half; f++) {
                double a = x[f], b = x[f + half];
                t->sre[o + (size_t)f] += a;
                t->sim[o + (size_t)f] += b;
                t->sabs[o + (size_t)f] += sqrt(a * a + b * b);
            }
        }
    t->rows[layer] += n;
}

static void trig_free(struct gw_calib_trig *t)
{
    free(t->sre);
    free(t->sim);
    free(t->sabs);
    free(t->rows);
    memset(t, 0, sizeof(*t));
}

/* The means of the sums into p->trig (the profile's query heads are the
 * model's: calibration runs without a profile, heads in model order). */
static int trig_finish(const struct gw_calib_trig *t, struct pf_profile *p,
                       char *err, size_t errlen)
{
    if (t->failed)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "trig calibration saw queries of an unexpected "
                          "shape");
    int rc = pf_trig_init(&p->trig, t->n_layers, t->n_q_heads, 2 * t->half,
                          err, errlen);
    if (rc != 0)
        return rc;
    size_t per = (size_t)t->n_q_heads * (size_t)t->half;
    for (int l = 0; l < t->n_layers; l++) {
        if (t->rows[l] < 1) {
            pf_trig_free(&p->trig);
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "trig calibration saw no query of layer %d", l);
        }
        double inv = 1.0 / (double)t->rows[l];
        for (size_t i = (size_t)l * per; i < (size_t)(l + 1) * per; i++) {
            p->trig.re[i] = (float)(t->sre[i] * inv);
            p->trig.im[i] = (float)(t->sim[i] * inv);
            p->trig.abs[i] = (float)(t->sabs[i] * inv);
        }
    }
    return pf_profile_validate(p, err, errlen);
}

int gw_calibrate_files(const struct gw_calib_opts *o, struct pf_retention *r,
                       struct pf_profile *p, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    memset(p, 0, sizeof(*p));
    if (o->max_sample_tokens < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "the sample limit must be >= 1");
    enum tg_score_method method;
    if (o->method == NULL || gw_method_parse(o->method, &method) != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "unknown method '%s' (snapkv, keydiff, "
                          "expected_attention, gvote)",
                          o->method != NULL ? o->method : "(null)");
    const int gv = method == TG_SCORE_GVOTE;
    if (gv) {
        /* gvote votes instead of scoring: there is no global top-k to
         * size, so it runs itself in the serving chunks and its own
         * keep counts are the retention (gw_calibrate_gvote_run). */
        if (o->ratio != 0.0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--ratio does not apply to gvote: what it "
                              "keeps follows --gvote-p (the profile "
                              "records the mean it kept)");
        if (o->prefill_chunk < 1)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--prefill-chunk must be >= 1, got %d",
                              o->prefill_chunk);
        int prc = gw_gvote_params_check(&o->gvote, err, errlen);
        if (prc != 0)
            return prc;
    } else {
        if (!(o->ratio > 0 && o->ratio <= 1))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--ratio must be in (0, 1] for method %s",
                              o->method);
        if (o->prefill_chunk != 0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--prefill-chunk applies to gvote only (%s "
                              "scores a sample as one chunk)", o->method);
    }
    char path[4096];
    TG_TRY(tg_path_fmt(path, sizeof(path), err, errlen, "%s/tokenizer.json",
                       o->model_dir));
    struct tok_tokenizer tok = {0};
    int rc = tok_tokenizer_load(&tok, path, err, errlen);
    if (rc != 0)
        return rc;
    int32_t **samples = NULL;
    int *lens = NULL, n = 0, max_len = 0;
    struct gw_engine e = {0};
    struct gw_calib_trig trig = {0};
    rc = read_samples(o, &tok, &samples, &lens, &n, &max_len, err, errlen);
    if (rc != 0)
        goto out;
    if (o->backend == GW_BACKEND_CUDA && !gv &&
        max_len > GW_BACKEND_CUDA_MAX_CHUNK) {
        /* The device scores a chunk of at most GW_BACKEND_CUDA_MAX_CHUNK
         * keys, and a scoring method's calibration scores a sample as one
         * chunk. */
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "--backend cuda scores a sample as one chunk of at "
                        "most %d tokens; the longest sample has %d: give "
                        "--max-sample-tokens %d",
                        GW_BACKEND_CUDA_MAX_CHUNK, max_len,
                        GW_BACKEND_CUDA_MAX_CHUNK);
        goto out;
    }
    struct gw_calib_state st = {.ratio = o->ratio,
                                .window = KV_SNAPKV_WINDOW,
                                .n_sink = KV_SINK_TOKENS};
    struct gw_engine_opts eo = {
        .model_dir = o->model_dir,
        .profile_path = NULL, /* budget 1: gvote's k_cap is n */
        .heads_per_group = 1,
        .page_size = 16,
        /* Scoring methods: one chunk, scores over the whole context.
         * gvote: the serving chunks (a shorter chunk than C changes no
         * boundary of samples of at most max_len tokens). */
        .prefill_chunk = gv && o->prefill_chunk < max_len ? o->prefill_chunk
                                                          : max_len,
        .method = o->method,
        .gvote = gv ? &o->gvote : NULL,
        .max_context = max_len,
        .n_threads = o->n_threads,
        .on_scores = gv ? NULL : gw_calibrate_on_scores,
        .on_scores_ud = gv ? NULL : &st,
        .on_queries = o->trig ? gw_calibrate_on_queries : NULL,
        .on_queries_ud = &trig,
        .backend = o->backend,
    };
    rc = gw_engine_init(&e, &eo, err, errlen);
    if (rc != 0)
        goto out;
    if (o->trig) {
        const struct gw_model *m = &e.model;
        if (m->head_dim % 2 != 0) {
            rc = tg_err_set(err, errlen, TG_EINVAL,
                            "--trig needs an even head_dim (RoPE pairs), "
                            "the model has %d", m->head_dim);
            goto out;
        }
        size_t cnt = (size_t)m->n_layers * (size_t)m->n_q_heads *
                     (size_t)(m->head_dim / 2);
        trig.n_layers = m->n_layers;
        trig.n_q_heads = m->n_q_heads;
        trig.half = m->head_dim / 2;
        trig.sre = calloc(cnt, sizeof(double));
        trig.sim = calloc(cnt, sizeof(double));
        trig.sabs = calloc(cnt, sizeof(double));
        trig.rows = calloc((size_t)m->n_layers, sizeof(int64_t));
        if (!trig.sre || !trig.sim || !trig.sabs || !trig.rows) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            goto out;
        }
    }
    st.n_kv_heads = e.model.n_kv_heads;
    if (gv)
        rc = gw_calibrate_gvote_run(&e, o->seed,
                                    (const int32_t *const *)samples, lens, n,
                                    r, o->progress, o->progress_ud, err,
                                    errlen);
    else
        rc = gw_calibrate_run(&e, &st, (const int32_t *const *)samples, lens,
                              n, r, o->progress, o->progress_ud, err, errlen);
    if (rc != 0)
        goto out;
    r->architecture = strdup(mc_arch_name(e.model.cfg.arch));
    r->method = strdup(o->method);
    char id[PF_IDENTITY_LEN + 1];
    if (pf_identity_of_config(&e.model.cfg, id) != 0) {
        rc = tg_err_set(err, errlen, TG_EINTERNAL,
                        "cannot hash the model's config (libsodium failed "
                        "to start)");
        goto out;
    }
    /* The retention and the profile built from it name the model. */
    r->model_identity = strdup(id);
    if (r->architecture == NULL || r->method == NULL ||
        r->model_identity == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto out;
    }
    rc = pf_profile_build(p, r, o->alpha, o->heads_per_group, o->grouping, err,
                          errlen);
    if (rc == 0 && o->trig)
        rc = trig_finish(&trig, p, err, errlen);
out:
    trig_free(&trig);
    if (rc != 0) {
        pf_retention_free(r);
        pf_profile_free(p);
    }
    gw_engine_free(&e);
    for (int i = 0; i < n; i++)
        free(samples[i]);
    free(samples);
    free(lens);
    tok_tokenizer_free(&tok);
    return rc;
}
