/*
 * gw_evaluate.c — `tangram-profile evaluate`'s run (gw_evaluate.h): the
 * conversations read and rendered, full KV's reference kept, each
 * profile compared with it.
 */
#include "gpu_worker/engine/gw_evaluate.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/base/tg_path.h"
#include "common/chat/ct_template.h"
#include "common/json/tg_json.h"
#include "common/profile/pf_profile.h"
#include "common/tok/tok_tokenizer.h"
#include "gpu_worker/engine/gw_calibrate.h"
#include "gpu_worker/engine/gw_engine.h"

/* One assistant turn as serving meets it: ids, the conversation up to
 * and through the reply rendered as its last message; the reply's tokens
 * are ids[begin, end), after ids[0, begin), the request the client sends
 * (the messages before it with the generation prompt). */
struct span {
    int32_t *ids;
    int begin, end;
};

/* A conversation, and full KV's reference for it. */
struct conv {
    struct span *turns;
    int n_turns;
    int64_t a0; /* its first assistant token's row in the rows file */
    /* full KV, per assistant token in turn order: */
    float *lp;     /* its log-probability */
    double *lse;   /* log-sum-exp of its logits row (the row is in the
                      rows file, at a0 + its index) */
    int32_t *top1; /* the most likely id (the lowest of equals) */
    /* per turn: */
    int32_t *greedy; /* (n_turns, continuation) */
    int *greedy_n;   /* tokens generated (an EOS stops it) */
    int64_t *pages;  /* pages held after the turn's continuation */
};

static void conv_free(struct conv *c)
{
    for (int i = 0; i < c->n_turns; i++)
        free(c->turns[i].ids);
    free(c->turns);
    free(c->lp);
    free(c->lse);
    free(c->top1);
    free(c->greedy);
    free(c->greedy_n);
    free(c->pages);
    memset(c, 0, sizeof(*c));
}

static int assistant_tokens(const struct conv *c)
{
    int t = 0;
    for (int i = 0; i < c->n_turns; i++)
        t += c->turns[i].end - c->turns[i].begin;
    return t;
}

void gw_eval_result_free(struct gw_eval_result *res)
{
    for (int i = 0; i < res->n_profiles; i++) {
        free(res->profiles[i].path);
        free(res->profiles[i].turn);
    }
    free(res->profiles);
    memset(res, 0, sizeof(*res));
}

/* ---- reading ------------------------------------------------------------ */

/* ShareGPT's {"conversations": [{"from", "value"}]} as OpenAI messages (a
 * new array), or messages itself (a new reference). */
static json_t *messages_of(json_t *doc, int line, char *err, size_t errlen)
{
    json_t *m = json_object_get(doc, "messages");
    if (json_is_array(m))
        return json_incref(m);
    json_t *c = json_object_get(doc, "conversations");
    if (!json_is_array(c)) {
        tg_err_set(err, errlen, TG_EFORMAT,
                   "line %d: expected \"messages\" (OpenAI) or "
                   "\"conversations\" (ShareGPT)",
                   line);
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; out != NULL && i < json_array_size(c); i++) {
        json_t *x = json_array_get(c, i);
        const char *from = json_string_value(json_object_get(x, "from"));
        json_t *val = json_object_get(x, "value");
        const char *role = NULL;
        if (from != NULL && (!strcmp(from, "human") || !strcmp(from, "user")))
            role = "user";
        else if (from != NULL &&
                 (!strcmp(from, "gpt") || !strcmp(from, "assistant")))
            role = "assistant";
        else if (from != NULL && !strcmp(from, "system"))
            role = "system";
        if (role == NULL || !json_is_string(val)) {
            json_decref(out);
            tg_err_set(err, errlen, TG_EFORMAT,
                       "line %d: conversations[%zu] needs \"from\" (human, "
                       "gpt or system) and a string \"value\"",
                       line, i);
            return NULL;
        }
        json_array_append_new(
            out, json_pack("{s:s, s:O}", "role", role, "content", val));
    }
    return out;
}

/* messages[0, n) rendered (with the generation prompt when gen) and
 * tokenized into *ids. */
static int render(const struct tok_tokenizer *tok, const struct ct_template *t,
                  json_t *msgs, size_t n, int gen, struct tok_ids *ids,
                  char *err, size_t errlen)
{
    json_t *part = json_array();
    if (part == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        json_array_append(part, json_array_get(msgs, i));
    struct ct_render_opts co = {.add_generation_prompt = gen != 0};
    char *text = NULL;
    size_t len = 0;
    int rc = ct_template_render(t, part, NULL, &co, &text, &len, err, errlen);
    json_decref(part);
    ids->n = 0;
    if (rc == 0) /* the template holds BOS where the model wants it */
        rc = tok_encode(tok, NULL, text, len, 0, ids, err, errlen);
    free(text);
    return rc;
}

static int is_prefix(const struct tok_ids *a, const struct tok_ids *full)
{
    return a->n <= full->n &&
           memcmp(a->v, full->v, a->n * sizeof(int32_t)) == 0;
}

/* One conversation: each assistant turn rendered as the last message
 * and located by rendering the messages before it with the generation
 * prompt (the request serving would get); 1 when it has no usable turn
 * (skipped), or when a turn's request is not a prefix of its rendering
 * (a template that renders a reply differently from what it prompts). */
static int conv_read(const struct tok_tokenizer *tok,
                     const struct ct_template *t, json_t *msgs, int max_tokens,
                     struct conv *c, char *err, size_t errlen)
{
    struct tok_ids a = {0}, b = {0};
    size_t n = json_array_size(msgs);
    int rc = 0, cap = 0, skip = 0;
    for (size_t i = 1; rc == 0 && i < n; i++) {
        const char *role = json_string_value(
            json_object_get(json_array_get(msgs, i), "role"));
        if (role == NULL || strcmp(role, "assistant") != 0)
            continue;
        rc = render(tok, t, msgs, i, 1, &a, err, errlen);
        if (rc == 0)
            rc = render(tok, t, msgs, i + 1, 0, &b, err, errlen);
        if (rc != 0)
            break;
        if (!is_prefix(&a, &b) || a.n >= b.n) {
            skip = 1;
            break;
        }
        if ((int64_t)b.n > max_tokens)
            break;
        if (TG_GROW(c->turns, &cap, c->n_turns + 1)) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        struct span *sp = &c->turns[c->n_turns];
        sp->ids = malloc(b.n * sizeof(int32_t));
        if (sp->ids == NULL) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        memcpy(sp->ids, b.v, b.n * sizeof(int32_t));
        sp->begin = (int)a.n;
        sp->end = (int)b.n;
        c->n_turns++;
    }
    tok_ids_free(&a);
    tok_ids_free(&b);
    if (rc != 0)
        return rc;
    return skip || c->n_turns == 0 ? 1 : 0;
}

static int read_data(const struct gw_eval_opts *o, struct conv **out, int *n,
                     struct gw_eval_result *res, char *err, size_t errlen)
{
    char path[4096];
    TG_TRY(tg_path_fmt(path, sizeof(path), err, errlen, "%s/tokenizer.json",
                       o->model_dir));
    struct tok_tokenizer tok = {0};
    TG_TRY(tok_tokenizer_load(&tok, path, err, errlen));
    struct ct_template t;
    int rc = ct_template_load_dir(&t, o->model_dir, err, errlen);
    if (rc != 0) {
        tok_tokenizer_free(&tok);
        return rc;
    }
    FILE *f = fopen(o->data_path, "r");
    if (f == NULL)
        rc = tg_err_set(err, errlen, TG_ENOENT, "%s: cannot open",
                        o->data_path);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int lineno = 0, cap = 0;
    while (rc == 0 && (got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (got == 0)
            continue;
        if (o->max_conversations > 0 &&
            res->conversations >= o->max_conversations)
            break;
        json_t *doc = NULL, *msgs = NULL;
        char jerr[256];
        if (tg_json_load_buf(line, (size_t)got, &doc, jerr, sizeof(jerr)) !=
                0 ||
            !json_is_object(doc)) {
            rc = tg_err_set(err, errlen, TG_EFORMAT, "%s line %d: %s",
                            o->data_path, lineno,
                            doc == NULL ? jerr : "expected an object");
        } else if ((msgs = messages_of(doc, lineno, err, errlen)) == NULL) {
            rc = TG_EFORMAT;
        }
        json_decref(doc);
        if (rc != 0)
            break;
        res->conversations++;
        if (TG_GROW(*out, &cap, *n + 1)) {
            json_decref(msgs);
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        struct conv *c = &(*out)[*n];
        memset(c, 0, sizeof(*c));
        char cerr[512];
        int s = conv_read(&tok, &t, msgs, o->max_tokens, c, cerr, sizeof(cerr));
        json_decref(msgs);
        if (s < 0) {
            rc = tg_err_set(err, errlen, s, "%s line %d: %s", o->data_path,
                            lineno, cerr);
            conv_free(c);
            break;
        }
        if (s == 1) {
            res->skipped++;
            conv_free(c);
            continue;
        }
        (*n)++;
    }
    free(line);
    if (f != NULL)
        fclose(f);
    ct_template_free(&t);
    tok_tokenizer_free(&tok);
    if (rc == 0 && *n == 0)
        rc = tg_err_set(err, errlen, TG_EFORMAT,
                        "%s: no conversation with an assistant turn to score "
                        "(%d read, %d skipped)",
                        o->data_path, res->conversations, res->skipped);
    return rc;
}

/* ---- scoring ------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* log-sum-exp of a logits row in double, and its most likely id (the
 * lowest of equals; NaN never is). */
static void row_stats(const float *row, int V, double *lse, int32_t *top)
{
    float mx = -INFINITY;
    int32_t at = 0;
    for (int i = 0; i < V; i++)
        if (row[i] > mx) {
            mx = row[i];
            at = i;
        }
    double s = 0;
    for (int i = 0; i < V; i++)
        s += exp((double)row[i] - (double)mx);
    *lse = (double)mx + log(s);
    *top = at;
}

/* KL(P || Q) = sum_i p_i (log p_i - log q_i) over the whole vocabulary,
 * with log p_i = f_i - lse_f and log q_i = g_i - lse_g from the raw
 * logits rows f (full KV) and g (the profile); ids P gives no mass
 * contribute nothing. */
static double kl_exact(const float *f, double lse_f, const float *g,
                       double lse_g, int V)
{
    double kl = 0;
    for (int i = 0; i < V; i++) {
        double lp = (double)f[i] - lse_f;
        if (!(lp > -INFINITY))
            continue;
        kl += exp(lp) * (lp - ((double)g[i] - lse_g));
    }
    return kl;
}

/* Full KV's rows file: row r (the conversation's a0 + the assistant
 * token's index) at byte r x 4V. */
static int rows_io(int fd, void *buf, size_t n, int64_t row, int write_it)
{
    off_t off = (off_t)(row * (int64_t)n);
    for (size_t done = 0; done < n;) {
        ssize_t k = write_it ? pwrite(fd, (const char *)buf + done, n - done,
                                      off + (off_t)done)
                             : pread(fd, (char *)buf + done, n - done,
                                     off + (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? errno : EIO;
        done += (size_t)k;
    }
    return 0;
}

/* What a turn's logits rows meet (the engine's prompt_rows callback). */
struct turn_rows {
    const struct gw_eval_opts *o;
    struct conv *c;
    const struct span *sp;
    int ref, profile;
    int64_t a_turn; /* the turn's first assistant token, index in c */
    int fd;         /* the rows file */
    float *buf;     /* (V) full KV's row read back */
    struct gw_eval_acc *one;
    int io_err;   /* errno of a failed read or write */
    double *kl_s; /* the profile's seconds in here */
};

static void on_row(void *ud, int64_t pos, const float *row, int V)
{
    struct turn_rows *x = ud;
    if (x->io_err != 0 || pos < x->sp->begin || pos >= x->sp->end)
        return;
    double t0 = now_s();
    int64_t ai = x->a_turn + (pos - x->sp->begin);
    double lse;
    int32_t top;
    row_stats(row, V, &lse, &top);
    size_t bytes = (size_t)V * sizeof(float);
    if (x->ref) {
        x->c->lse[ai] = lse;
        x->c->top1[ai] = top;
        x->io_err = rows_io(x->fd, (void *)row, bytes, x->c->a0 + ai, 1);
        *x->kl_s += now_s() - t0;
        return;
    }
    if ((x->io_err = rows_io(x->fd, x->buf, bytes, x->c->a0 + ai, 0)) != 0)
        return;
    double kl = kl_exact(x->buf, x->c->lse[ai], row, lse, V);
    x->one->kl += kl;
    x->one->top1_agree += top == x->c->top1[ai];
    *x->kl_s += now_s() - t0;
    if (x->o->on_token != NULL)
        x->o->on_token(x->o->on_token_ud, x->profile, x->sp->ids, (int)pos, kl);
}

static int grow_turns(struct gw_eval_profile *p, int n)
{
    if (n <= p->n_turn)
        return 0;
    struct gw_eval_acc *t = realloc(p->turn, (size_t)n * sizeof(*t));
    if (t == NULL)
        return TG_ENOMEM;
    memset(t + p->n_turn, 0, (size_t)(n - p->n_turn) * sizeof(*t));
    p->turn = t;
    p->n_turn = n;
    return 0;
}

static void acc_add(struct gw_eval_acc *d, const struct gw_eval_acc *s)
{
    d->turns += s->turns;
    d->tokens += s->tokens;
    d->nll += s->nll;
    d->nll_full += s->nll_full;
    d->top1_agree += s->top1_agree;
    d->kl += s->kl;
    d->pages += s->pages;
    d->pages_full += s->pages_full;
    d->greedy += s->greedy;
}

/* One conversation through engine e, turn by turn: the turn's rendering
 * teacher-forced (its reply scored over the compressed KV of everything
 * before it, in the serving chunks; its logits rows met with full KV's
 * in the rows file fd), then a greedy continuation from the turn's
 * request. ref: record full KV's reference into c and fd; otherwise
 * compare with it into p (profile index pi, buf one row of scratch). */
static int run_conv(struct gw_engine *e, const struct gw_eval_opts *o,
                    struct conv *c, int ref, int pi, struct gw_eval_profile *p,
                    int fd, float *buf, char *err, size_t errlen)
{
    int G = o->continuation, A = assistant_tokens(c), rc = 0;
    if (ref) {
        c->lp = malloc(((size_t)A + 1) * sizeof(float));
        c->lse = malloc(((size_t)A + 1) * sizeof(double));
        c->top1 = malloc(((size_t)A + 1) * sizeof(int32_t));
        c->greedy = malloc(((size_t)c->n_turns * (size_t)G + 1) *
                           sizeof(int32_t));
        c->greedy_n = calloc((size_t)c->n_turns, sizeof(int));
        c->pages = calloc((size_t)c->n_turns, sizeof(int64_t));
        if (!c->lp || !c->lse || !c->top1 || !c->greedy || !c->greedy_n ||
            !c->pages)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    } else if (grow_turns(p, c->n_turns) != 0) {
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    int a = 0;
    for (int t = 0; rc == 0 && t < c->n_turns; t++) {
        const struct span *sp = &c->turns[t];
        struct gw_eval_acc one = {.turns = 1};
        struct turn_rows rows = {.o = o,
                                 .c = c,
                                 .sp = sp,
                                 .ref = ref,
                                 .profile = pi,
                                 .a_turn = a,
                                 .fd = fd,
                                 .buf = buf,
                                 .one = &one,
                                 .kl_s = &p->kl_seconds};
        struct gw_gen_params gp = {.max_tokens = 0,
                                   .sampling = TG_SAMPLING_OFF,
                                   .prompt_logprobs = 1,
                                   .prompt_rows = on_row,
                                   .prompt_rows_ud = &rows,
                                   .prompt_rows_from = sp->begin};
        struct gw_gen_result r;
        rc = gw_engine_generate(e, sp->ids, sp->end, &gp, &r, err, errlen);
        if (rc == 0 && rows.io_err != 0)
            rc = tg_err_set(err, errlen, TG_EIO,
                            "full KV's logits rows (temporary file): %s",
                            strerror(rows.io_err));
        one.pages = (double)r.pages_used;
        for (int q = sp->begin; rc == 0 && q < sp->end; q++, a++) {
            if (ref) {
                c->lp[a] = r.prompt_lp[q];
                continue;
            }
            one.tokens++;
            one.nll -= r.prompt_lp[q];
            one.nll_full -= c->lp[a];
        }
        gw_gen_result_free(&r);
        p->prefilled += sp->end;
        /* The reply's first G tokens, greedy, from the turn's request. */
        struct gw_gen_params gg = {.max_tokens = G,
                                   .sampling = TG_SAMPLING_OFF};
        struct gw_gen_result cr;
        int agree = 0;
        if (rc == 0 && G > 0) {
            rc = gw_engine_generate(e, sp->ids, sp->begin, &gg, &cr, err,
                                    errlen);
            p->prefilled += sp->begin + cr.n_tokens;
            if (rc == 0 && ref) {
                memcpy(c->greedy + (size_t)t * G, cr.tokens,
                       (size_t)cr.n_tokens * sizeof(int32_t));
                c->greedy_n[t] = cr.n_tokens;
            } else if (rc == 0) {
                int m = cr.n_tokens < c->greedy_n[t] ? cr.n_tokens
                                                     : c->greedy_n[t];
                while (agree < m &&
                       cr.tokens[agree] == c->greedy[(size_t)t * G + agree])
                    agree++;
                /* both stopped at the same EOS: the whole reply agrees */
                if (agree == m && cr.n_tokens == c->greedy_n[t])
                    agree = G;
            }
            gw_gen_result_free(&cr);
        }
        if (rc != 0)
            break;
        if (ref) {
            c->pages[t] = (int64_t)one.pages;
            continue;
        }
        one.pages_full = (double)c->pages[t];
        one.greedy = agree;
        acc_add(&p->turn[t], &one);
        acc_add(&p->all, &one);
    }
    return rc;
}

static int engine_for(const struct gw_eval_opts *o, const char *profile,
                      int64_t max_context, struct gw_engine *e, char *err,
                      size_t errlen)
{
    struct gw_engine_opts eo = {
        .model_dir = o->model_dir,
        .profile_path = profile,
        .heads_per_group = o->heads_per_group,
        .page_size = o->page_size,
        .prefill_chunk = o->prefill_chunk,
        .max_context = max_context,
        .n_threads = o->n_threads,
        .backend = o->backend,
    };
    return gw_engine_init(e, &eo, err, errlen);
}

/* The run's temporary folder: full KV's rows file (unlinked at once, so
 * it goes with the process) and the calibrated profiles. */
struct scratch {
    char dir[4096];
    int fd;
    char **files; /* (n_files) to remove at the end */
    int n_files;
};

static int scratch_open(struct scratch *w, const struct gw_eval_opts *o,
                        char *err, size_t errlen)
{
    const char *base = o->tmp_dir;
    if (base == NULL || *base == '\0')
        base = getenv("TMPDIR");
    if (base == NULL || *base == '\0')
        base = "/tmp";
    TG_TRY(tg_path_fmt(w->dir, sizeof(w->dir), err, errlen,
                       "%s/tangram-evaluate-XXXXXX", base));
    if (mkdtemp(w->dir) == NULL) {
        int e = errno;
        w->dir[0] = '\0';
        return tg_err_set(err, errlen, TG_EIO,
                          "cannot make a temporary folder in %s: %s", base,
                          strerror(e));
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/rows", w->dir);
    w->fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (w->fd < 0)
        return tg_err_set(err, errlen, TG_EIO, "%s: cannot create: %s", path,
                          strerror(errno));
    unlink(path);
    return 0;
}

static void scratch_close(struct scratch *w)
{
    if (w->fd >= 0)
        close(w->fd);
    for (int i = 0; i < w->n_files; i++) {
        unlink(w->files[i]);
        free(w->files[i]);
    }
    free(w->files);
    if (w->dir[0] != '\0')
        rmdir(w->dir);
}

/* Checks that the rows of `tokens` assistant tokens fit in the folder. */
static int scratch_room(const struct scratch *w, int64_t tokens, int V,
                        char *err, size_t errlen)
{
    struct statvfs sv;
    double need = (double)tokens * (double)V * 4.0;
    if (statvfs(w->dir, &sv) != 0)
        return 0; /* unknown: the writes will tell */
    double have = (double)sv.f_bavail * (double)sv.f_frsize;
    if (need <= have)
        return 0;
    return tg_err_set(err, errlen, TG_ENOSPC,
                      "the exact KL needs full KV's logits rows on disk: %lld "
                      "assistant tokens x %d ids x 4 bytes = %.2f GiB in %s, "
                      "which has %.2f GiB free (--tmp-dir or TMPDIR another "
                      "folder, or fewer conversations)",
                      (long long)tokens, V, need / 1073741824.0, w->dir,
                      have / 1073741824.0);
}

/* Calibrates the profile of ratio r (as `tangram-profile calibrate
 * --ratio r` with the run's samples, method, alpha, H_p, backend and
 * threads) into a file of the scratch folder, named in *path (owned by
 * w). */
static int calibrate_ratio(const struct gw_eval_opts *o, struct scratch *w,
                           double r, const char **path, char *err,
                           size_t errlen)
{
    char file[4200];
    snprintf(file, sizeof(file), "%s/ratio-%d.json", w->dir, w->n_files);
    char **f = realloc(w->files, ((size_t)w->n_files + 1) * sizeof(char *));
    if (f == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    w->files = f;
    if ((f[w->n_files] = strdup(file)) == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    *path = f[w->n_files++];
    struct gw_calib_opts co = {
        .model_dir = o->model_dir,
        .samples_path = o->samples_path != NULL ? o->samples_path
                                                : o->data_path,
        .method = o->calib_method != NULL ? o->calib_method : "snapkv",
        .ratio = r,
        .alpha = o->calib_alpha,
        .heads_per_group = o->heads_per_group,
        .grouping = PF_GROUPING_CLUSTERED,
        .max_sample_tokens = o->backend == GW_BACKEND_CUDA
                                 ? GW_BACKEND_CUDA_MAX_CHUNK
                                 : 4096,
        .n_threads = o->n_threads,
        .backend = o->backend,
    };
    struct pf_retention ret;
    struct pf_profile prof;
    int rc = gw_calibrate_files(&co, &ret, &prof, err, errlen);
    if (rc != 0)
        return rc; /* both left freed */
    rc = pf_profile_save(&prof, *path, err, errlen);
    pf_retention_free(&ret);
    pf_profile_free(&prof);
    return rc;
}

/* Full KV compared with itself: its own row of the report. */
static int full_rows(struct gw_eval_profile *p, const struct conv *cv,
                     int continuation)
{
    for (int i = 0; i < p->conversations; i++)
        if (grow_turns(p, cv[i].n_turns) != 0)
            return TG_ENOMEM;
    for (int i = 0; i < p->conversations; i++) {
        int a = 0;
        for (int t = 0; t < cv[i].n_turns; t++) {
            struct gw_eval_acc one = {.turns = 1};
            for (int q = cv[i].turns[t].begin; q < cv[i].turns[t].end;
                 q++, a++) {
                one.tokens++;
                one.nll -= cv[i].lp[a];
                one.top1_agree++;
            }
            one.nll_full = one.nll;
            one.pages = one.pages_full = (double)cv[i].pages[t];
            one.greedy = continuation;
            acc_add(&p->turn[t], &one);
            acc_add(&p->all, &one);
        }
    }
    return 0;
}

static int profiles_init(const struct gw_eval_opts *o,
                         struct gw_eval_result *res, char *err, size_t errlen)
{
    res->n_profiles = o->n_profiles + o->n_ratios + 1;
    res->profiles = calloc((size_t)res->n_profiles, sizeof(*res->profiles));
    if (res->profiles == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (int i = 0; i < res->n_profiles; i++) {
        struct gw_eval_profile *p = &res->profiles[i];
        char label[128];
        const char *pp = label;
        if (i == 0) {
            pp = "none";
        } else if (i <= o->n_profiles) {
            pp = o->profiles[i - 1];
        } else {
            p->calibrated = o->ratios[i - 1 - o->n_profiles];
            snprintf(label, sizeof(label), "ratio %g (%s)", p->calibrated,
                     o->calib_method != NULL ? o->calib_method : "snapkv");
        }
        if ((p->path = strdup(pp)) == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        p->target_ratio = 1.0;
    }
    return 0;
}

int gw_evaluate_run(const struct gw_eval_opts *o, struct gw_eval_result *res,
                    char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    if (o->continuation < 0 || o->continuation > 256 || o->n_profiles < 0 ||
        o->n_ratios < 0 || o->n_profiles + o->n_ratios < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "need a continuation of 0 .. 256 tokens and at "
                          "least one profile or ratio");
    for (int i = 0; i < o->n_ratios; i++)
        if (!(o->ratios[i] > 0 && o->ratios[i] <= 1))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "ratio %g is outside (0, 1]", o->ratios[i]);
    res->continuation = o->continuation;
    TG_TRY(profiles_init(o, res, err, errlen));
    struct scratch w = {.fd = -1};
    struct conv *cv = NULL;
    float *buf = NULL;
    int n = 0, rc = scratch_open(&w, o, err, errlen);
    if (rc == 0)
        rc = read_data(o, &cv, &n, res, err, errlen);
    int64_t max_context = 0, tokens = 0;
    for (int i = 0; i < n; i++) {
        cv[i].a0 = tokens;
        tokens += assistant_tokens(&cv[i]);
        for (int t = 0; t < cv[i].n_turns; t++)
            if (cv[i].turns[t].end + o->continuation > max_context)
                max_context = cv[i].turns[t].end + o->continuation;
    }
    for (int pi = 0; rc == 0 && pi < res->n_profiles; pi++) {
        struct gw_eval_profile *p = &res->profiles[pi];
        const char *file = p->path;
        char eerr[1024];
        if (o->stop != NULL && *o->stop) {
            res->interrupted = 1;
            break;
        }
        if (p->calibrated > 0) {
            double t0 = now_s();
            rc = calibrate_ratio(o, &w, p->calibrated, &file, eerr,
                                 sizeof(eerr));
            p->calib_seconds = now_s() - t0;
            if (rc != 0) {
                rc = tg_err_set(err, errlen, rc, "calibrating %s: %s", p->path,
                                eerr);
                break;
            }
        }
        struct gw_engine e;
        rc = engine_for(o, file, max_context, &e, eerr, sizeof(eerr));
        if (rc != 0) {
            rc = tg_err_set(err, errlen, rc, "%s: %s", p->path, eerr);
            break;
        }
        if (pi == 0) {
            res->vocab = e.model.vocab;
            rc = scratch_room(&w, tokens, res->vocab, err, errlen);
            buf = malloc((size_t)res->vocab * sizeof(float));
            if (rc == 0 && buf == NULL)
                rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        } else {
            p->target_ratio = e.profile.target_ratio;
        }
        double t0 = now_s();
        for (int i = 0; rc == 0 && i < n; i++) {
            if (o->stop != NULL && *o->stop) {
                res->interrupted = 1;
                break;
            }
            rc = run_conv(&e, o, &cv[i], pi == 0, pi, p, w.fd, buf, eerr,
                          sizeof(eerr));
            if (rc != 0) {
                rc = tg_err_set(err, errlen, rc, "%s, conversation %d: %s",
                                p->path, i + 1, eerr);
                break;
            }
            p->conversations++;
            if (pi == 0)
                res->row_bytes = (cv[i].a0 + assistant_tokens(&cv[i])) *
                                 (int64_t)res->vocab * 4;
            if (o->progress != NULL)
                o->progress(o->progress_ud, pi, res->n_profiles, i + 1, n);
        }
        p->seconds = now_s() - t0;
        gw_engine_free(&e);
        if (rc == 0 && pi == 0 && full_rows(p, cv, o->continuation) != 0)
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        if (res->interrupted)
            break;
    }
    free(buf);
    scratch_close(&w);
    for (int i = 0; i < n; i++)
        conv_free(&cv[i]);
    free(cv);
    return rc;
}
