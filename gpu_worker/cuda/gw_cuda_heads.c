/* gw_cuda_heads.c — per-head lengths on the CUDA backend (see gw_cuda.h):
 * the head counts each call uploads, gvote's per-head selection of a
 * prefill chunk (run on the host, DESIGN.md §4.8) and decode-time
 * compaction with the kernels of kernels/cuda/trig.h (§4.9). */
#include "gpu_worker/cuda/gw_cuda.h"

#ifdef TANGRAM_CUDA
#include <stdlib.h>
#include <string.h>

#include "common/model/st_safetensors.h"
#include "gpu_worker/cuda/gw_cuda_internal.h"
#include "kernels/cuda/compress.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/trig.h"

/* Slots one trig launch round scores at most (a float score and an int32
 * survivor each): 128 MiB of workspace. A batch whose regions need more
 * runs in several rounds. */
#define TRIG_MAX_SLOTS ((int64_t)1 << 24)

static size_t align256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

/* The longest decode region one head can hold at a trigger: its cap plus
 * the `every` tokens decoded since the last trigger. */
static int64_t trig_item_bound(const struct gw_trig_cfg *t)
{
    int32_t mx = 0;
    for (size_t i = 0; i < (size_t)t->n_layers * (size_t)t->n_kv_heads; i++)
        mx = t->cap[i] > mx ? t->cap[i] : mx;
    return (int64_t)mx + t->every;
}

static void trig_sizes(const struct gw_cuda *c, int64_t *items, int64_t *slots)
{
    const struct gw_model *m = c->model;
    int64_t n = (int64_t)c->opts.max_seqs * m->n_layers * m->n_kv_heads;
    int64_t bound = trig_item_bound(c->opts.trig);
    int64_t s = n * bound < TRIG_MAX_SLOTS ? n * bound : TRIG_MAX_SLOTS;
    *items = n;
    *slots = s > bound ? s : bound;
}

size_t gw_cuda__heads_bytes(const struct gw_cuda *c, size_t *pinned)
{
    const struct gw_model *m = c->model;
    size_t LH = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    size_t S = (size_t)c->opts.max_seqs, C = (size_t)c->opts.max_chunk;
    size_t b = 0, p = 0;
    *pinned = 0;
    if (!c->opts.per_head)
        return 0;
    b += align256(LH * 4) + align256(S * LH * 4);
    p += LH * 4 + S * LH * 4;
    if (c->opts.method == TG_SCORE_GVOTE) {
        size_t qd = (size_t)m->n_q_heads * m->head_dim;
        size_t kd = (size_t)m->n_kv_heads * m->head_dim;
        size_t ns = (size_t)c->opts.gvote.samples;
        p += C * ((size_t)m->hidden + qd + kd) * 2 + (size_t)m->n_kv_heads * C * 4;
        b += align256(ns * (size_t)m->hidden * 2) + align256(ns * qd * 4);
        p += ns * (size_t)m->hidden * 2 + ns * qd * 4;
    }
    if (c->opts.trig != NULL) {
        int64_t items, slots;
        trig_sizes(c, &items, &slots);
        size_t st = (size_t)m->n_layers * (size_t)m->n_q_heads *
                    (size_t)(m->head_dim / 2) * 4;
        b += 3 * align256(st);
        b += align256((size_t)items * sizeof(struct tg_cuda_trig_item));
        b += 2 * align256((size_t)slots * 4);
        p += (size_t)items * sizeof(struct tg_cuda_trig_item);
    }
    *pinned = p;
    return b;
}

/* Widens n bf16 values. */
static void widen(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = st_bf16_to_f32(src[i]);
}

/* gvote's synthetic-query buffers and the host copies of each layer's q
 * bias and q_norm, read back from the slab (uploaded before this runs). */
static int gvote_proj_alloc(struct gw_cuda *c, char *err, size_t errlen)
{
    const struct gw_model *m = c->model;
    size_t S = (size_t)c->opts.gvote.samples, H = (size_t)m->hidden;
    size_t qd = (size_t)m->n_q_heads * m->head_dim, d = (size_t)m->head_dim;
    size_t L = (size_t)m->n_layers;
    if (S > 0) {
        DALLOC(c->gv_xs_d, S * H * 2, "gvote synthetic queries");
        DALLOC(c->gv_qs_d, S * qd * 4, "gvote synthetic queries");
        HALLOC(c->p_gv_xs, S * H * 2, "gvote synthetic queries");
        HALLOC(c->p_gv_qs, S * qd * 4, "gvote synthetic queries");
    }
    int has_b = c->layers[0].bq != NULL, has_n = c->layers[0].q_norm != NULL;
    size_t per = (has_b ? qd : 0) + (has_n ? d : 0);
    c->gv_w = calloc(L, sizeof(*c->gv_w));
    c->gv_small = malloc(L * per * sizeof(float) + 1);
    uint16_t *tmp = malloc((per > 0 ? per : 1) * 2);
    if (c->gv_w == NULL || c->gv_small == NULL || tmp == NULL) {
        free(tmp);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
    }
    for (size_t l = 0; l < L && per > 0; l++) {
        const struct gw_cuda_layer *g = &c->layers[l];
        float *dst = c->gv_small + l * per;
        cudaError_t e = cudaSuccess;
        if (has_b) {
            e = cudaMemcpy(tmp, g->bq, qd * 2, cudaMemcpyDeviceToHost);
            widen(tmp, dst, qd);
            c->gv_w[l].bq = dst;
            dst += qd;
        }
        if (has_n && e == cudaSuccess) {
            e = cudaMemcpy(tmp, g->q_norm, d * 2, cudaMemcpyDeviceToHost);
            widen(tmp, dst, d);
            c->gv_w[l].q_norm = dst;
        }
        if (e != cudaSuccess) {
            free(tmp);
            return tg_err_set(err, errlen, TG_EDEVICE,
                              "gvote: reading layer %zu's q bias / norm: %s",
                              l, cudaGetErrorString(e));
        }
    }
    free(tmp);
    return 0;
}

/* The statistics in the rank's query-head order, as gw_trig_cfg holds
 * them, uploaded once. */
static int trig_upload_stats(struct gw_cuda *c, char *err, size_t errlen)
{
    const struct gw_model *m = c->model;
    const struct gw_trig_cfg *t = c->opts.trig;
    const struct pf_trig *st = t->stats;
    if (st == NULL || st->num_q_heads != m->n_q_heads ||
        st->half != m->head_dim / 2 || t->n_layers != m->n_layers ||
        t->n_kv_heads != m->n_kv_heads ||
        t->group != m->n_q_heads / m->n_kv_heads)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode compression is configured for another "
                          "shape than the model's rank");
    size_t bytes = (size_t)m->n_layers * (size_t)m->n_q_heads *
                   (size_t)st->half * 4;
    DALLOC(c->trig_re, bytes, "trig statistics");
    DALLOC(c->trig_im, bytes, "trig statistics");
    DALLOC(c->trig_abs, bytes, "trig statistics");
    GW_CU_TRY(cudaMemcpy(c->trig_re, st->re, bytes, cudaMemcpyHostToDevice));
    GW_CU_TRY(cudaMemcpy(c->trig_im, st->im, bytes, cudaMemcpyHostToDevice));
    GW_CU_TRY(cudaMemcpy(c->trig_abs, st->abs, bytes, cudaMemcpyHostToDevice));
    return 0;
}

int gw_cuda__heads_alloc(struct gw_cuda *c, char *err, size_t errlen)
{
    const struct gw_model *m = c->model;
    size_t LH = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    size_t S = (size_t)c->opts.max_seqs, C = (size_t)c->opts.max_chunk;
    if (!c->opts.per_head) {
        if (c->opts.method == TG_SCORE_GVOTE || c->opts.trig != NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "gvote and decode-time compression need "
                              "per-head lengths (opts.per_head)");
        return 0;
    }
    DALLOC(c->hl_pre, LH * 4, "head lengths");
    DALLOC(c->hl_dec, S * LH * 4, "head lengths");
    HALLOC(c->h_hl_pre, LH * 4, "head lengths");
    HALLOC(c->h_hl_dec, S * LH * 4, "head lengths");
    c->hkeep = calloc(LH, sizeof(*c->hkeep));
    if (c->hkeep == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
    if (c->opts.method == TG_SCORE_GVOTE) {
        if (c->opts.host_ops == NULL || c->opts.host_be == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "gvote on the CUDA backend needs the host ops");
        size_t H = (size_t)m->hidden;
        size_t qd = (size_t)m->n_q_heads * m->head_dim;
        size_t kd = (size_t)m->n_kv_heads * m->head_dim;
        TG_TRY(gw_gvote_init(&c->gv, m, c->opts.max_chunk, &c->opts.gvote,
                             err, errlen));
        HALLOC(c->p_gv, C * (H + qd + kd) * 2, "gvote staging");
        HALLOC(c->p_gv_idx, (size_t)m->n_kv_heads * C * 4, "gvote staging");
        c->gv_x = malloc(C * H * sizeof(float));
        c->gv_q = malloc(C * qd * sizeof(float));
        c->gv_k = malloc(C * kd * sizeof(float));
        if (c->gv_x == NULL || c->gv_q == NULL || c->gv_k == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
        TG_TRY(gvote_proj_alloc(c, err, errlen));
    }
    if (c->opts.trig != NULL) {
        TG_TRY(trig_upload_stats(c, err, errlen));
        int64_t items, slots;
        trig_sizes(c, &items, &slots);
        size_t ib = (size_t)items * sizeof(struct tg_cuda_trig_item);
        DALLOC(c->trig_items, ib, "trig items");
        HALLOC(c->p_trig_items, ib, "trig items");
        DALLOC(c->trig_score, (size_t)slots * 4, "trig scores");
        DALLOC(c->trig_src, (size_t)slots * 4, "trig survivors");
        c->trig_cap_items = items;
        c->trig_cap_slots = slots;
    }
    return 0;
}

void gw_cuda__heads_free(struct gw_cuda *c)
{
    void *dev[] = {c->hl_pre, c->hl_dec, c->trig_re, c->trig_im, c->trig_abs,
                   c->trig_items, c->trig_score, c->trig_src, c->gv_xs_d,
                   c->gv_qs_d};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i] != NULL)
            cudaFree(dev[i]);
    void *pin[] = {c->h_hl_pre, c->h_hl_dec, c->p_gv, c->p_gv_idx,
                   c->p_trig_items, c->p_gv_xs, c->p_gv_qs};
    for (size_t i = 0; i < sizeof(pin) / sizeof(pin[0]); i++)
        if (pin[i] != NULL)
            cudaFreeHost(pin[i]);
    gw_gvote_free(&c->gv);
    free(c->hkeep);
    free(c->gv_x);
    free(c->gv_q);
    free(c->gv_k);
    free(c->gv_w);
    free(c->gv_small);
}

/* ---- uploads ------------------------------------------------------------ */

int gw_cuda__heads_prefill(struct gw_cuda *c, const struct gw_seq *seq,
                           char *err, size_t errlen)
{
    if (!c->opts.per_head)
        return 0;
    if (seq->hlen == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "this runtime keeps per-head lengths: the sequence "
                          "needs gw_seq.hlen");
    size_t LH = (size_t)c->model->n_layers * (size_t)c->model->n_kv_heads;
    memcpy(c->h_hl_pre, seq->hlen, LH * 4);
    memset(c->hkeep, 0, LH * sizeof(*c->hkeep));
    GW_CU_TRY(cudaMemcpyAsync(c->hl_pre, c->h_hl_pre, LH * 4,
                              cudaMemcpyHostToDevice, STREAM(c)));
    return 0;
}

void gw_cuda__heads_advance(struct gw_cuda *c, struct gw_seq *seq)
{
    if (!c->opts.per_head)
        return;
    size_t LH = (size_t)c->model->n_layers * (size_t)c->model->n_kv_heads;
    for (size_t i = 0; i < LH; i++)
        seq->hlen[i] += c->hkeep[i];
}

int gw_cuda__heads_decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                          int n_seq, int B, char *err, size_t errlen)
{
    if (!c->opts.per_head)
        return 0;
    size_t LH = (size_t)c->model->n_layers * (size_t)c->model->n_kv_heads;
    for (int s = 0; s < B; s++) {
        int32_t *dst = c->h_hl_dec + (size_t)s * LH;
        if (s >= n_seq) {
            /* padding: one token on the scratch page, as its rows say */
            for (size_t i = 0; i < LH; i++)
                dst[i] = 1;
            continue;
        }
        if (seqs[s]->hlen == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "this runtime keeps per-head lengths: every "
                              "sequence needs gw_seq.hlen");
        for (size_t i = 0; i < LH; i++)
            dst[i] = seqs[s]->hlen[i] + 1; /* counts the step's token */
    }
    GW_CU_TRY(cudaMemcpyAsync(c->hl_dec, c->h_hl_dec, (size_t)B * LH * 4,
                              cudaMemcpyHostToDevice, STREAM(c)));
    return 0;
}

/* ---- gvote ------------------------------------------------------------- */

/* gw_gvote_proj on the device: the S synthetic inputs as bf16 (as the
 * device's own activations are) times layer l's q_proj, fp32 out. */
struct gvote_proj_ctx {
    struct gw_cuda *c;
    char *err;
    size_t errlen;
};

static int gvote_proj_run(void *ctx, int l, const float *xs, int S, float *qs)
{
    struct gvote_proj_ctx *pc = ctx;
    struct gw_cuda *c = pc->c;
    char *err = pc->err;
    size_t errlen = pc->errlen;
    const struct gw_model *m = c->model;
    size_t H = (size_t)m->hidden, qd = (size_t)m->n_q_heads * m->head_dim;
    size_t n = (size_t)S * H;
    for (size_t i = 0; i < n; i++)
        c->p_gv_xs[i] = st_f32_to_bf16(xs[i]);
    cudaStream_t st = STREAM(c);
    GW_CU_TRY(cudaMemcpyAsync(c->gv_xs_d, c->p_gv_xs, n * 2,
                              cudaMemcpyHostToDevice, st));
    GW_OP_TRY(tg_cuda_gemm_bf16(c->gemm, c->gv_xs_d, c->layers[l].wq, NULL, S,
                                (int)qd, (int)H, c->gv_qs_d, TG_CUDA_GEMM_F32,
                                c->stream),
              "gvote q_proj", l);
    GW_CU_TRY(cudaMemcpyAsync(c->p_gv_qs, c->gv_qs_d, (size_t)S * qd * 4,
                              cudaMemcpyDeviceToHost, st));
    GW_WAIT_TRY(c);
    memcpy(qs, c->p_gv_qs, (size_t)S * qd * 4);
    return 0;
}

int gw_cuda__gvote_select(struct gw_cuda *c, const struct gw_seq *seq, int l,
                          int n, int64_t start, int32_t *keep, char *err,
                          size_t errlen)
{
    const struct gw_model *m = c->model;
    size_t H = (size_t)m->hidden, N = (size_t)n;
    size_t qd = (size_t)m->n_q_heads * m->head_dim;
    size_t kd = (size_t)m->n_kv_heads * m->head_dim;
    int Hkv = m->n_kv_heads;
    cudaStream_t st = STREAM(c);
    /* c->h still holds the layer's normed input (q_proj's rows); q and k
     * are rotated. Back to the host in bf16, widened there. */
    uint16_t *ph = c->p_gv, *pq = ph + N * H, *pk = pq + N * qd;
    GW_CU_TRY(cudaMemcpyAsync(ph, c->h, N * H * 2, cudaMemcpyDeviceToHost, st));
    GW_CU_TRY(cudaMemcpyAsync(pq, c->q, N * qd * 2, cudaMemcpyDeviceToHost, st));
    GW_CU_TRY(cudaMemcpyAsync(pk, c->k, N * kd * 2, cudaMemcpyDeviceToHost, st));
    GW_WAIT_TRY(c);
    widen(ph, c->gv_x, N * H);
    widen(pq, c->gv_q, N * qd);
    widen(pk, c->gv_k, N * kd);
    int32_t kcap[TG_CUDA_COMPRESS_MAX_KV_HEADS];
    memcpy(kcap, keep, (size_t)Hkv * sizeof(*kcap));
    struct gvote_proj_ctx pc = {.c = c, .err = err, .errlen = errlen};
    struct gw_gvote_proj proj = {.run = gvote_proj_run, .ctx = &pc};
    if (errlen > 0)
        err[0] = '\0';
    struct gw_gvote_chunk ch = {
        .w = &c->gv_w[l], .proj = &proj, .x = c->gv_x, .q = c->gv_q,
        .k = c->gv_k, .n = n, .start = start, .layer = l, .seed = seq->seed,
        .rule = &c->layout->rule, .kcap = kcap};
    int rc = gw_gvote_select(&c->gv, m, c->opts.host_ops, c->opts.host_be, &ch,
                             keep, c->p_gv_idx);
    if (rc != 0 && errlen > 0 && err[0] != '\0')
        return rc; /* the projection said why */
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "gvote selection of layer %d "
                          "failed (%s)", l, tg_strerror(rc));
    GW_CU_TRY(cudaMemcpyAsync(c->idx, c->p_gv_idx, (size_t)Hkv * N * 4,
                              cudaMemcpyHostToDevice, st));
    return 0;
}

/* ---- decode-time compaction --------------------------------------------- */

/* Queues score, select and compact for the staged items and waits (the
 * pinned items are reused by the next round). */
static int trig_round(struct gw_cuda *c, const struct gw_trig_cfg *tc,
                      int n_items, int32_t n_rows, char *err, size_t errlen)
{
    if (n_items == 0)
        return 0;
    const struct gw_model *m = c->model;
    const struct kv_layout *lay = c->layout;
    cudaStream_t st = STREAM(c);
    GW_CU_TRY(cudaMemcpyAsync(c->trig_items, c->p_trig_items,
                              (size_t)n_items * sizeof(struct tg_cuda_trig_item),
                              cudaMemcpyHostToDevice, st));
    struct tg_cuda_trig_pages pg = {
        .pool = c->pool, .n_pages = c->n_pages,
        .heads_per_group = lay->heads_per_group, .page_size = lay->page_size,
        .head_dim = m->head_dim, .indptr = c->dec.indptr,
        .indices = c->dec.indices, .n_rows = n_rows};
    const struct tg_cuda_trig_item *items = c->trig_items;
    struct tg_cuda_trig_score_args sa = {
        .pg = pg, .items = items, .n_items = n_items,
        .n_q_per_kv = tc->group, .n_q_heads = m->n_q_heads,
        .n_layers = m->n_layers, .re = c->trig_re, .im = c->trig_im,
        .abs = c->trig_abs, .inv_freq = c->inv_freq, .score = c->trig_score,
        .fault = c->fault_d, .stream = c->stream};
    GW_OP_TRY(tg_cuda_trig_score(&sa, err, errlen), "trig score", 0);
    struct tg_cuda_trig_select_args se = {
        .items = items, .n_items = n_items, .window = tc->window,
        .score = c->trig_score, .src = c->trig_src, .fault = c->fault_d,
        .stream = c->stream};
    GW_OP_TRY(tg_cuda_trig_select(&se, err, errlen), "trig select", 0);
    struct tg_cuda_trig_compact_args ca = {
        .pg = pg, .items = items, .n_items = n_items, .src = c->trig_src,
        .fault = c->fault_d, .stream = c->stream};
    GW_OP_TRY(tg_cuda_trig_compact(&ca, err, errlen), "trig compaction", 0);
    c->trig_rounds++;
    GW_WAIT_TRY(c);
    return 0;
}

static int compact(struct gw_cuda *c, const struct gw_trig_cfg *tc,
                   struct gw_seq *const *seqs, int n, int64_t *heads,
                   char *err, size_t errlen)
{
    const struct kv_layout *lay = c->layout;
    const int L = lay->n_layers, H = lay->n_kv_heads, G = lay->n_groups;
    /* Every region is checked before anything moves: a refused batch
     * leaves the rows as they were. */
    for (int s = 0; s < n; s++)
        for (size_t i = 0; i < (size_t)L * (size_t)H; i++) {
            int32_t first = seqs[s]->dstart[i];
            int32_t len = seqs[s]->hlen[i] - first;
            if (len > tc->cap[i] && (first < 0 || len > c->trig_cap_slots))
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "decode region of %d slots at %d "
                                  "(workspace %lld)", (int)len, (int)first,
                                  (long long)c->trig_cap_slots);
        }
    GW_WAIT_TRY(c); /* the pinned staging is ours again */
    /* The batch's rows, numbered (s * L + l) * G + g as kv_table lays
     * them out; the next decode step refreshes the table for its batch. */
    TG_TRY(gw_cuda__table_decode(c, seqs, n, n, err, errlen));
    GW_CU_TRY(cudaMemsetAsync(c->fault_d, 0, 4, STREAM(c)));
    struct tg_cuda_trig_item *it = c->p_trig_items;
    int n_items = 0;
    int64_t used = 0;
    int32_t n_rows = (int32_t)n * L * G;
    for (int s = 0; s < n; s++) {
        const struct gw_seq *sq = seqs[s];
        for (int l = 0; l < L; l++) {
            const int32_t *hg = lay->head_group + (size_t)l * (size_t)H;
            const int32_t *hs = lay->head_slot + (size_t)l * (size_t)H;
            for (int h = 0; h < H; h++) {
                size_t i = (size_t)l * (size_t)H + (size_t)h;
                int32_t cap = tc->cap[i], first = sq->dstart[i];
                int32_t len = sq->hlen[i] - first;
                if (len <= cap)
                    continue;
                if (n_items == c->trig_cap_items ||
                    used + len > c->trig_cap_slots) {
                    TG_TRY(trig_round(c, tc, n_items, n_rows, err, errlen));
                    n_items = 0;
                    used = 0;
                }
                it[n_items++] = (struct tg_cuda_trig_item){
                    .row = (int32_t)(((int64_t)s * L + l) * G + hg[h]),
                    .head = h, .slot = hs[h], .layer = l, .first = first,
                    .n = len, .off = (int32_t)used, .n_keep = cap,
                    .t = sq->pos};
                used += len;
            }
        }
    }
    TG_TRY(trig_round(c, tc, n_items, n_rows, err, errlen));
    TG_TRY(gw_cuda__finish(c, err, errlen)); /* the fault flag */
    /* Every head over its cap now holds dstart + cap; a row is as long
     * as its longest head. */
    for (int s = 0; s < n; s++) {
        struct gw_seq *sq = seqs[s];
        for (int l = 0; l < L; l++) {
            int32_t *hl = sq->hlen + (size_t)l * (size_t)H;
            const int32_t *ds = sq->dstart + (size_t)l * (size_t)H;
            const int32_t *cap = tc->cap + (size_t)l * (size_t)H;
            const int32_t *hg = lay->head_group + (size_t)l * (size_t)H;
            int changed = 0;
            for (int h = 0; h < H; h++)
                if (hl[h] - ds[h] > cap[h]) {
                    hl[h] = ds[h] + cap[h];
                    changed = 1;
                    (*heads)++;
                }
            if (!changed)
                continue;
            int32_t *len = sq->len + (size_t)l * (size_t)G;
            for (int g = 0; g < G; g++)
                len[g] = 0;
            for (int h = 0; h < H; h++)
                if (hl[h] > len[hg[h]])
                    len[hg[h]] = hl[h];
        }
    }
    return 0;
}

int gw_cuda_compact(struct gw_cuda *c, const struct gw_trig_cfg *tc,
                    struct gw_seq *const *seqs, int n, int64_t *heads,
                    char *err, size_t errlen)
{
    const struct kv_layout *lay = c->layout;
    *heads = 0;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (c->opts.trig == NULL || c->trig_re == NULL || tc == NULL ||
        tc->n_layers != lay->n_layers || tc->n_kv_heads != lay->n_kv_heads)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode compression is not configured for this "
                          "runtime");
    if (n < 0 || n > c->opts.max_seqs)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "compaction of %d sequences (max %d)", n,
                          c->opts.max_seqs);
    if (n == 0)
        return 0;
    for (int s = 0; s < n; s++)
        if (seqs[s]->hlen == NULL || seqs[s]->dstart == NULL ||
            seqs[s]->kv == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "decode compression needs per-head lengths, "
                              "decode-region starts and the kv_seq");
    int rc = compact(c, tc, seqs, n, heads, err, errlen);
    if (rc != 0) {
        *heads = 0;
        /* the device table may have missed an update: rebuild next time */
        kv_table_invalidate(&c->dec_kv);
    }
    return rc;
}

#endif /* TANGRAM_CUDA */
