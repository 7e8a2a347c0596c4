/* gw_load.c — streaming weight loading (see gw_load.h). */
#include "gpu_worker/model/gw_load.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/base/tg_log.h"

static const char *const kind_names[GW_W_COUNT] = {
    [GW_W_EMBED] = "model.embed_tokens.weight",
    [GW_W_FINAL_NORM] = "model.norm.weight",
    [GW_W_LM_HEAD] = "lm_head.weight",
    [GW_W_ATTN_NORM] = "model.layers.%d.input_layernorm.weight",
    [GW_W_WQ] = "model.layers.%d.self_attn.q_proj.weight",
    [GW_W_WK] = "model.layers.%d.self_attn.k_proj.weight",
    [GW_W_WV] = "model.layers.%d.self_attn.v_proj.weight",
    [GW_W_BQ] = "model.layers.%d.self_attn.q_proj.bias",
    [GW_W_BK] = "model.layers.%d.self_attn.k_proj.bias",
    [GW_W_BV] = "model.layers.%d.self_attn.v_proj.bias",
    [GW_W_Q_NORM] = "model.layers.%d.self_attn.q_norm.weight",
    [GW_W_K_NORM] = "model.layers.%d.self_attn.k_norm.weight",
    [GW_W_WO] = "model.layers.%d.self_attn.o_proj.weight",
    [GW_W_BO] = "model.layers.%d.self_attn.o_proj.bias",
    [GW_W_FFN_NORM] = "model.layers.%d.post_attention_layernorm.weight",
    [GW_W_GATE] = "model.layers.%d.mlp.gate_proj.weight",
    [GW_W_UP] = "model.layers.%d.mlp.up_proj.weight",
    [GW_W_DOWN] = "model.layers.%d.mlp.down_proj.weight",
};

const char *gw_wkind_name(enum gw_wkind k)
{
    return (unsigned)k < GW_W_COUNT ? kind_names[k] : "?";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- plan -------------------------------------------------------------- */

void gw_load_plan_free(struct gw_load_plan *p)
{
    free(p->t);
    free(p->idx);
    memset(p, 0, sizeof(*p));
}

int gw_load_plan_alloc(struct gw_load_plan *p, int cap, size_t n_idx, char *err,
                       size_t errlen)
{
    memset(p, 0, sizeof(*p));
    p->t = calloc((size_t)(cap > 0 ? cap : 1), sizeof(*p->t));
    p->idx = malloc((n_idx > 0 ? n_idx : 1) * sizeof(int32_t));
    if (p->t == NULL || p->idx == NULL) {
        gw_load_plan_free(p);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    p->cap = cap;
    return 0;
}

void gw_load_plan_add(struct gw_load_plan *p, enum gw_wkind kind, int layer,
                      int64_t rows, int64_t cols, struct gw_load_sel sel)
{
    TG_ASSERT(p->n < p->cap && (unsigned)kind < GW_W_COUNT);
    struct gw_load_tensor *w = &p->t[p->n++];
    /* The format strings are the constant table above. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(w->name, sizeof(w->name), kind_names[kind], layer);
#pragma GCC diagnostic pop
    w->kind = kind;
    w->layer = kind >= GW_W_FIRST_LAYER_KIND ? layer : -1;
    w->rows = rows;
    w->cols = cols;
    w->sel = sel;
    switch (sel.pick) {
    case GW_PICK_RANGE:
        w->out_rows = sel.blk;
        w->out_cols = cols;
        break;
    case GW_PICK_ROWS:
        w->out_rows = (int64_t)sel.n_blk * sel.blk;
        w->out_cols = cols;
        break;
    case GW_PICK_COLS:
        w->out_rows = rows;
        w->out_cols = (int64_t)sel.n_blk * sel.blk;
        break;
    default:
        w->out_rows = rows;
        w->out_cols = cols;
        break;
    }
    w->numel = (uint64_t)w->out_rows * (uint64_t)(w->out_cols > 0 ? w->out_cols : 1);
    p->numel += w->numel;
}

static int check_shape(const struct st_tensor *t, const struct gw_load_tensor *w,
                       const char *dir, char *err, size_t errlen)
{
    int ok = w->cols > 0 ? (t->rank == 2 && t->shape[0] == w->rows &&
                            t->shape[1] == w->cols)
                         : (t->rank == 1 && t->shape[0] == w->rows);
    if (ok)
        return 0;
    char got[96] = "";
    size_t n = 0;
    for (int i = 0; i < t->rank && n < sizeof(got) - 24; i++)
        n += (size_t)snprintf(got + n, sizeof(got) - n, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    if (w->cols > 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor %s has shape [%s], expected [%lld, %lld]",
                          dir, w->name, got, (long long)w->rows,
                          (long long)w->cols);
    return tg_err_set(err, errlen, TG_EFORMAT,
                      "%s: tensor %s has shape [%s], expected [%lld]", dir,
                      w->name, got, (long long)w->rows);
}

int gw_load_plan_bind(struct gw_load_plan *p, const struct st_model *st,
                      char *err, size_t errlen)
{
    const char *dir = st->dir != NULL ? st->dir : "checkpoint";
    /* An untied model without lm_head.weight is an error on every rank; a
     * tied model may still ship one (some exporters write it). */
    if (!p->tied && st_model_find(st, kind_names[GW_W_LM_HEAD]) == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: missing tensor lm_head.weight "
                          "(tie_word_embeddings is false)", dir);
    for (int i = 0; i < p->n; i++) {
        struct gw_load_tensor *w = &p->t[i];
        const struct st_tensor *t = st_model_find(st, w->name);
        if (t == NULL)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: missing tensor %s", dir, w->name);
        TG_TRY(check_shape(t, w, dir, err, errlen));
        if (t->dtype != ST_DTYPE_BF16 && t->dtype != ST_DTYPE_F16 &&
            t->dtype != ST_DTYPE_F32)
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "%s: tensor %s has dtype %s (bf16, fp16 or "
                              "fp32 needed)", dir, w->name,
                              st_dtype_name(t->dtype));
        w->src = t;
    }
    return 0;
}

/* ---- streaming ---------------------------------------------------------- */

/* One read and the slice it becomes: `bytes` at src_off of the tensor's
 * file (from its data region) into a staging half, handed to the sink as
 * elements [out_el, out_el + n) of the kept layout; a column split's
 * piece is whole rows whose kept columns are gathered first. */
struct piece {
    const struct gw_load_tensor *t;
    const struct st_file *f;
    uint64_t src_off;
    size_t bytes;
    uint64_t out_el, n;
    int gather;
    int last;          /* the tensor's last piece */
};

struct pieces {
    struct piece *v;
    size_t n, cap;
};

static int push(struct pieces *ps, struct piece pc)
{
    if (TG_GROW(ps->v, &ps->cap, ps->n + 1))
        return TG_ENOMEM;
    ps->v[ps->n++] = pc;
    return 0;
}

/* n elements from element src_el of t, to out_el onwards, in pieces of at
 * most `half` bytes. */
static int plan_run(struct pieces *ps, const struct gw_load_tensor *t,
                    const struct st_file *f, size_t half, uint64_t src_el,
                    uint64_t out_el, uint64_t n)
{
    size_t es = st_dtype_size(t->src->dtype);
    uint64_t per = half / es;
    while (n > 0) {
        uint64_t k = n < per ? n : per;
        struct piece pc = {.t = t, .f = f, .src_off = t->src->offset + src_el * es,
                           .bytes = (size_t)(k * es), .out_el = out_el, .n = k};
        TG_TRY(push(ps, pc));
        src_el += k;
        out_el += k;
        n -= k;
    }
    return 0;
}

/* The pieces of one tensor (see gw_load.h: runs of rows as they lie in the
 * file; a column split in batches of whole rows that fill half a half). */
static int plan_tensor(struct pieces *ps, const struct gw_load_tensor *t,
                       const struct st_file *f, size_t half)
{
    size_t first = ps->n;
    const struct gw_load_sel *s = &t->sel;
    uint64_t row_len = (uint64_t)(t->cols > 0 ? t->cols : 1);
    switch (s->pick) {
    case GW_PICK_COLS: {
        size_t es = st_dtype_size(t->src->dtype);
        size_t row_b = (size_t)t->cols * es;
        uint64_t kept = (uint64_t)t->out_cols;
        int64_t batch = (int64_t)(half / 2 / row_b);
        for (int64_t r0 = 0; r0 < t->rows; r0 += batch) {
            int64_t m = t->rows - r0 < batch ? t->rows - r0 : batch;
            struct piece pc = {.t = t, .f = f,
                               .src_off = t->src->offset + (uint64_t)r0 * row_b,
                               .bytes = (size_t)m * row_b,
                               .out_el = (uint64_t)r0 * kept,
                               .n = (uint64_t)m * kept, .gather = 1};
            TG_TRY(push(ps, pc));
        }
        break;
    }
    case GW_PICK_RANGE:
        TG_TRY(plan_run(ps, t, f, half, (uint64_t)s->first * row_len, 0, t->numel));
        break;
    case GW_PICK_ROWS: {
        /* Blocks that follow each other in the file are read as one. */
        uint64_t blk_el = (uint64_t)s->blk * row_len;
        for (int k = 0; k < s->n_blk;) {
            int e = k + 1;
            while (e < s->n_blk && s->block[e] == s->block[e - 1] + 1)
                e++;
            TG_TRY(plan_run(ps, t, f, half, (uint64_t)s->block[k] * blk_el,
                            (uint64_t)k * blk_el, (uint64_t)(e - k) * blk_el));
            k = e;
        }
        break;
    }
    default:
        TG_TRY(plan_run(ps, t, f, half, 0, 0, t->numel));
        break;
    }
    if (ps->n > first)
        ps->v[ps->n - 1].last = 1;
    return 0;
}

/* Entry order for reading: shard, then offset in the shard. */
struct order {
    const struct gw_load_tensor *t;
    size_t file;
};

static int cmp_order(const void *a, const void *b)
{
    const struct order *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->t->src->offset != y->t->src->offset)
        return x->t->src->offset < y->t->src->offset ? -1 : 1;
    return x->t < y->t ? -1 : x->t > y->t; /* the same source twice */
}

/* The two staging halves, filled by the reader thread and emptied by the
 * caller's thread (the sink), one piece each at a time. */
struct pipe2 {
    const struct pieces *ps;
    uint8_t *half[2];
    size_t half_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t filled[2];   /* pieces read into half b: index + 1, 0 = free */
    int stop;           /* the sink failed: the reader leaves */
    int rc;             /* the reader's failure */
    char err[512];
};

/* Reads piece i into half b (gathering a column split's kept columns). */
static int read_piece(struct pipe2 *q, const struct piece *pc, uint8_t *buf,
                      char *err, size_t errlen)
{
    if (!pc->gather)
        return st_file_pread(pc->f, pc->src_off, buf, pc->bytes, err, errlen);
    const struct gw_load_tensor *t = pc->t;
    const struct gw_load_sel *s = &t->sel;
    size_t es = st_dtype_size(t->src->dtype);
    size_t row_b = (size_t)t->cols * es, blk_b = (size_t)s->blk * es;
    size_t kept_b = (size_t)t->out_cols * es, rows = pc->bytes / row_b;
    uint8_t *in = buf + q->half_bytes / 2; /* rows in the upper part */
    TG_TRY(st_file_pread(pc->f, pc->src_off, in, pc->bytes, err, errlen));
    for (size_t i = 0; i < rows; i++)
        for (int k = 0; k < s->n_blk; k++)
            memcpy(buf + i * kept_b + (size_t)k * blk_b,
                   in + i * row_b + (size_t)s->block[k] * blk_b, blk_b);
    return 0;
}

static void *reader_main(void *arg)
{
    struct pipe2 *q = arg;
    for (size_t i = 0; i < q->ps->n; i++) {
        int b = (int)(i % 2);
        pthread_mutex_lock(&q->mu);
        while (q->filled[b] != 0 && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        int stop = q->stop;
        pthread_mutex_unlock(&q->mu);
        if (stop)
            break;
        int rc = read_piece(q, &q->ps->v[i], q->half[b], q->err, sizeof(q->err));
        pthread_mutex_lock(&q->mu);
        if (rc != 0)
            q->rc = rc;
        else
            q->filled[b] = i + 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        if (rc != 0)
            break;
    }
    return NULL;
}

static void progress(const struct gw_load_stats *st, uint64_t total, double t0,
                     double *last_log)
{
    double t = now_s();
    if (t - *last_log < GW_LOAD_PROGRESS_S)
        return;
    *last_log = t;
    double gb = (double)st->bytes / 1e9;
    log_info("loading weights: %.0f%% (%.2f of %.2f GB), %.2f GB/s",
             total > 0 ? 100.0 * (double)st->bytes / (double)total : 100.0, gb,
             (double)total / 1e9, gb / (t - t0 > 0 ? t - t0 : 1));
}

/* Hands the pieces to the sink as the reader fills the halves. */
static int drain(struct pipe2 *q, const struct gw_load_sink *sink,
                 struct gw_load_stats *stats, uint64_t total, double t0,
                 char *err, size_t errlen)
{
    double last_log = t0;
    for (size_t i = 0; i < q->ps->n; i++) {
        int b = (int)(i % 2);
        pthread_mutex_lock(&q->mu);
        while (q->filled[b] != i + 1 && q->rc == 0)
            pthread_cond_wait(&q->cv, &q->mu);
        int rc = q->filled[b] == i + 1 ? 0 : q->rc;
        pthread_mutex_unlock(&q->mu);
        if (rc != 0)
            return tg_err_set(err, errlen, rc, "%s", q->err);
        const struct piece *pc = &q->ps->v[i];
        struct gw_load_slice sl = {.t = pc->t, .dtype = pc->t->src->dtype,
                                   .data = q->half[b], .offset = pc->out_el,
                                   .n = pc->n};
        TG_TRY(sink->upload(sink->ctx, &sl, err, errlen));
        stats->bytes += pc->bytes;
        stats->elems += pc->n;
        stats->n_tensors += pc->last;
        pthread_mutex_lock(&q->mu);
        q->filled[b] = 0;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        progress(stats, total, t0, &last_log);
    }
    return 0;
}

/* The start of a run: *stats zeroed, the staging size asked for (0: the
 * default) within its bounds. */
static size_t run_start(struct gw_load_stats *stats, size_t staging)
{
    memset(stats, 0, sizeof(*stats));
    size_t cap = staging > 0 ? staging : GW_LOAD_STAGING_DEFAULT;
    return cap < GW_LOAD_STAGING_MIN ? GW_LOAD_STAGING_MIN : cap;
}

int gw_load_run(const struct gw_load_plan *p, const struct st_model *st,
                size_t staging, const struct gw_load_sink *sink,
                struct gw_load_stats *stats, char *err, size_t errlen)
{
    struct gw_load_stats local;
    stats = stats != NULL ? stats : &local;
    size_t cap = run_start(stats, staging);
    double t0 = now_s();
    struct order *ord = calloc((size_t)(p->n > 0 ? p->n : 1), sizeof(*ord));
    uint8_t *seen = calloc(st->n_files > 0 ? st->n_files : 1, 1);
    struct pieces ps = {0};
    int rc = ord == NULL || seen == NULL
                 ? tg_err_set(err, errlen, TG_ENOMEM, "out of memory")
                 : 0;
    for (int i = 0; i < p->n && rc == 0; i++) {
        const struct gw_load_tensor *w = &p->t[i];
        const struct st_file *f = w->src != NULL ? st_model_file_of(st, w->src)
                                                 : NULL;
        if (f == NULL) {
            rc = tg_err_set(err, errlen, TG_EINVAL,
                            "tensor %s: the plan is not bound to this "
                            "checkpoint", w->name);
            break;
        }
        ord[i].t = w;
        ord[i].file = (size_t)(f - st->files);
        /* A column split reads whole rows: two of them per half (the rows
         * and their gathered columns). */
        size_t row_b = (size_t)w->cols * st_dtype_size(w->src->dtype);
        if (w->sel.pick == GW_PICK_COLS && cap < 4 * row_b)
            cap = 4 * row_b;
    }
    uint64_t total = 0;
    if (rc == 0) {
        qsort(ord, (size_t)p->n, sizeof(*ord), cmp_order);
        for (int i = 0; i < p->n && rc == 0; i++) {
            const struct st_file *f = &st->files[ord[i].file];
            if (!seen[ord[i].file]) {
                seen[ord[i].file] = 1;
                stats->n_files++;
            }
            if (plan_tensor(&ps, ord[i].t, f, cap / 2) != 0)
                rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < ps.n; i++)
            total += ps.v[i].bytes;
    }
    struct pipe2 q = {.ps = &ps, .half_bytes = cap / 2};
    uint8_t *buf = rc == 0 ? malloc(cap) : NULL;
    if (rc == 0 && buf == NULL)
        rc = tg_err_set(err, errlen, TG_ENOMEM,
                        "cannot allocate the %zu-byte staging buffer", cap);
    if (rc == 0) {
        q.half[0] = buf;
        q.half[1] = buf + cap / 2;
        pthread_mutex_init(&q.mu, NULL);
        pthread_cond_init(&q.cv, NULL);
        pthread_t th;
        if (pthread_create(&th, NULL, reader_main, &q) != 0) {
            rc = tg_err_set(err, errlen, TG_ENOMEM,
                            "cannot start the weight reader thread");
        } else {
            rc = drain(&q, sink, stats, total, t0, err, errlen);
            pthread_mutex_lock(&q.mu);
            q.stop = 1; /* a failed sink: the reader leaves */
            pthread_cond_broadcast(&q.cv);
            pthread_mutex_unlock(&q.mu);
            pthread_join(th, NULL);
        }
        pthread_cond_destroy(&q.cv);
        pthread_mutex_destroy(&q.mu);
    }
    free(buf);
    free(ps.v);
    free(ord);
    free(seen);
    stats->staging = cap;
    stats->seconds = now_s() - t0;
    return rc;
}

int gw_load_run_host(const struct gw_load_plan *p, gw_load_host_fn host,
                     const void *ud, size_t staging,
                     const struct gw_load_sink *sink,
                     struct gw_load_stats *stats, char *err, size_t errlen)
{
    struct gw_load_stats local;
    stats = stats != NULL ? stats : &local;
    size_t cap = run_start(stats, staging);
    double t0 = now_s();
    uint64_t per = cap / sizeof(float);
    int rc = 0;
    for (int i = 0; i < p->n && rc == 0; i++) {
        const struct gw_load_tensor *w = &p->t[i];
        const float *src = host(ud, w->kind, w->layer);
        if (src == NULL) {
            rc = tg_err_set(err, errlen, TG_EINVAL,
                            "the host weights have no %s", w->name);
            break;
        }
        for (uint64_t off = 0; off < w->numel && rc == 0; off += per) {
            uint64_t k = w->numel - off < per ? w->numel - off : per;
            struct gw_load_slice s = {.t = w, .dtype = ST_DTYPE_F32,
                                      .data = src + off, .offset = off, .n = k};
            rc = sink->upload(sink->ctx, &s, err, errlen);
            stats->bytes += k * sizeof(float);
            stats->elems += k;
        }
        stats->n_tensors += rc == 0;
    }
    stats->staging = 0;
    stats->seconds = now_s() - t0;
    return rc;
}

void gw_load_stats_format(const struct gw_load_stats *s, char *buf, size_t cap)
{
    double gb = (double)s->bytes / 1e9;
    int n = snprintf(buf, cap, "%.2f GB from %d file%s in %.2f s (%.2f GB/s",
                     gb, s->n_files, s->n_files == 1 ? "" : "s", s->seconds,
                     s->seconds > 0 ? gb / s->seconds : 0.0);
    if (n < 0 || (size_t)n >= cap)
        return;
    if (s->staging > 0)
        snprintf(buf + n, cap - (size_t)n, ", %zu MiB staging)",
                 s->staging >> 20);
    else
        snprintf(buf + n, cap - (size_t)n, ", from host memory)");
}
