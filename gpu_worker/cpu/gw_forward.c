/* gw_forward.c — forward pass with fused per-chunk compression (see .h). */
#include "gpu_worker/cpu/gw_forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

static void *xcalloc(size_t n, size_t size)
{
    return n == 0 ? calloc(1, 1) : calloc(n, size);
}

void gw_runtime_free(struct gw_runtime *rt)
{
    free(rt->pool);
    free(rt->x);
    free(rt->h);
    free(rt->q);
    free(rt->k);
    free(rt->v);
    free(rt->att);
    free(rt->gate);
    free(rt->up);
    free(rt->scores);
    free(rt->pos);
    free(rt->idx);
    free(rt->keep);
    free(rt->keep_rows);
    free(rt->kcap);
    free(rt->gp_scratch);
    free(rt->rows);
    free(rt->rows_pages);
    free(rt->lp_logits);
    free(rt->lg_local);
    free(rt->lg_all);
    gw_gvote_free(&rt->gv);
    gw_trig_work_free(&rt->trig);
    memset(rt, 0, sizeof(*rt));
}

int gw_runtime_init(struct gw_runtime *rt, const struct gw_model *model,
                    const struct kv_layout *layout, const struct tg_ops *ops,
                    struct tg_backend *be, int32_t n_pages,
                    const struct gw_forward_opts *opts, char *err, size_t errlen)
{
    memset(rt, 0, sizeof(*rt));
    if (layout->n_layers != model->n_layers ||
        layout->n_kv_heads != model->n_kv_heads ||
        layout->head_dim != model->head_dim || layout->heads_per_group <= 0 ||
        layout->n_groups * layout->heads_per_group != layout->n_kv_heads ||
        layout->page_size <= 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "KV layout (L=%d Hkv=%d d=%d H_p=%d groups=%d) does not "
                          "match the model (L=%d Hkv=%d d=%d)",
                          layout->n_layers, layout->n_kv_heads, layout->head_dim,
                          layout->heads_per_group, layout->n_groups,
                          model->n_layers, model->n_kv_heads, model->head_dim);
    if (opts->max_tokens <= 0 || n_pages <= 0)
        return tg_err_set(err, errlen, TG_EINVAL, "max_tokens and n_pages must be > 0");
    if (model->world > 1 && opts->comm == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "model shard of rank %d of %d needs a "
                          "communicator", model->rank, model->world);
    rt->model = model;
    rt->layout = layout;
    rt->ops = ops;
    rt->be = be;
    rt->opts = *opts;
    rt->n_pages = n_pages;

    size_t T = (size_t)opts->max_tokens;
    size_t page_floats = (size_t)layout->heads_per_group * 2 *
                         (size_t)layout->page_size * (size_t)layout->head_dim;
    size_t qd = (size_t)model->n_q_heads * (size_t)model->head_dim;
    size_t kd = (size_t)model->n_kv_heads * (size_t)model->head_dim;
    size_t G = (size_t)layout->n_groups;
    rt->pool = calloc((size_t)n_pages * page_floats, sizeof(float));
    rt->x = xcalloc(T * (size_t)model->hidden, sizeof(float));
    rt->h = xcalloc(T * (size_t)model->hidden, sizeof(float));
    rt->q = xcalloc(T * qd, sizeof(float));
    rt->k = xcalloc(T * kd, sizeof(float));
    rt->v = xcalloc(T * kd, sizeof(float));
    rt->att = xcalloc(T * qd, sizeof(float));
    rt->gate = xcalloc(T * (size_t)model->ffn, sizeof(float));
    rt->up = xcalloc(T * (size_t)model->ffn, sizeof(float));
    rt->scores = xcalloc(T * (size_t)model->n_kv_heads, sizeof(float));
    rt->pos = xcalloc(T, sizeof(int32_t));
    rt->idx = xcalloc(T * (size_t)model->n_kv_heads, sizeof(int32_t));
    rt->keep = xcalloc((size_t)model->n_kv_heads, sizeof(int32_t));
    rt->kcap = xcalloc((size_t)model->n_kv_heads, sizeof(int32_t));
    rt->keep_rows = xcalloc((size_t)layout->n_layers * (size_t)layout->n_groups,
                            sizeof(int32_t));
    rt->gp_scratch = xcalloc(G, sizeof(*rt->gp_scratch));
    rt->rows = xcalloc(T, sizeof(*rt->rows));
    rt->rows_pages = xcalloc(T * G, sizeof(*rt->rows_pages));
    /* Logits: every rank its (rows, Vp) slice, rank 0 the gathered
     * (T, rows, Vp) and the (rows, V) prompt-logprob block. */
    int v_first, v_count, vp;
    gw_model_vocab_slice(model, &v_first, &v_count, &vp);
    size_t world = model->world > 1 ? (size_t)model->world : 1;
    int root = model->world <= 1 || model->rank == 0;
    rt->lg_rows = opts->max_tokens < GW_LP_BLOCK ? opts->max_tokens : GW_LP_BLOCK;
    size_t slice = (size_t)rt->lg_rows * (size_t)vp;
    rt->lg_local = xcalloc(slice, sizeof(float));
    if (root) {
        rt->lp_logits = xcalloc((size_t)GW_LP_BLOCK * (size_t)model->vocab,
                                sizeof(float));
        rt->lg_all = xcalloc(world * slice, sizeof(float));
    }
    if (!rt->pool || !rt->x || !rt->h || !rt->q || !rt->k || !rt->v ||
        !rt->att || !rt->gate || !rt->up || !rt->scores || !rt->pos ||
        !rt->idx || !rt->keep || !rt->keep_rows || !rt->kcap || !rt->gp_scratch ||
        !rt->rows ||
        !rt->rows_pages || !rt->lg_local ||
        (root && (!rt->lp_logits || !rt->lg_all))) {
        size_t bytes = (size_t)n_pages * page_floats * sizeof(float);
        gw_runtime_free(rt);
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "cannot allocate the KV pool (%d pages, %zu bytes) "
                          "and activations for %zu tokens",
                          n_pages, bytes, T);
    }
    if (opts->method == TG_SCORE_GVOTE) {
        int rc = gw_gvote_init(&rt->gv, model, opts->max_tokens, &opts->gvote,
                               err, errlen);
        if (rc != 0) {
            gw_runtime_free(rt);
            return rc;
        }
    }
    return 0;
}

/* Fills a row view of `seq` at layer l. gp receives n_groups pointers. */
static void seq_rows(const struct gw_runtime *rt, const struct gw_seq *seq,
                     int l, const int32_t **gp, struct tg_kv_rows *r)
{
    const struct kv_layout *lay = rt->layout;
    size_t base = (size_t)l * (size_t)lay->n_groups;
    for (int g = 0; g < lay->n_groups; g++)
        gp[g] = seq->pages[base + (size_t)g];
    r->pool = rt->pool;
    r->heads_per_group = lay->heads_per_group;
    r->page_size = lay->page_size;
    r->head_dim = lay->head_dim;
    r->n_kv_heads = lay->n_kv_heads;
    r->head_group = lay->head_group + (size_t)l * (size_t)lay->n_kv_heads;
    r->head_slot = lay->head_slot + (size_t)l * (size_t)lay->n_kv_heads;
    r->group_pages = gp;
    r->group_len = seq->len + base;
    r->head_len = seq->hlen != NULL
                      ? seq->hlen + (size_t)l * (size_t)lay->n_kv_heads
                      : NULL;
}

/* Records the absolute positions of what head h of layer l appended: cnt
 * entries at its old length, chunk index idx[t] (NULL: t) + start. */
static void log_slots(const struct kv_layout *lay, struct gw_seq *seq, int l,
                      const struct tg_kv_rows *r, const int32_t *idx, int n,
                      const int32_t *cnt, int64_t start)
{
    if (seq->slot_pos == NULL)
        return;
    for (int h = 0; h < lay->n_kv_heads; h++) {
        int64_t base = r->head_len != NULL ? r->head_len[h]
                                           : r->group_len[r->head_group[h]];
        int32_t *sp = seq->slot_pos +
                      ((size_t)l * (size_t)lay->n_kv_heads + (size_t)h) *
                          (size_t)seq->slot_cap;
        for (int t = 0; t < cnt[h] && base + t < seq->slot_cap; t++)
            sp[base + t] = (int32_t)(start + (idx != NULL
                                                  ? idx[(size_t)h * n + t]
                                                  : t));
    }
}

/* Q/K/V projections, optional q/k norm and RoPE for m rows of rt->h;
 * prefill chunks (layer l >= 0) show their pre-RoPE queries to the
 * on_queries hook. */
static int qkv(struct gw_runtime *rt, const struct gw_layer *w, int m, int l)
{
    const struct gw_model *md = rt->model;
    const struct tg_ops *o = rt->ops;
    int d = md->head_dim;
    TG_TRY(gw_model_gemm(md, o, rt->be, rt->h, w->wq, w->bq, m,
                         md->n_q_heads * d, md->hidden, rt->q));
    TG_TRY(gw_model_gemm(md, o, rt->be, rt->h, w->wk, w->bk, m,
                         md->n_kv_heads * d, md->hidden, rt->k));
    TG_TRY(gw_model_gemm(md, o, rt->be, rt->h, w->wv, w->bv, m,
                         md->n_kv_heads * d, md->hidden, rt->v));
    if (w->q_norm != NULL) {
        TG_TRY(o->rmsnorm(rt->be, rt->q, w->q_norm, m * md->n_q_heads, d, md->norm_eps, rt->q));
        TG_TRY(o->rmsnorm(rt->be, rt->k, w->k_norm, m * md->n_kv_heads, d, md->norm_eps, rt->k));
    }
    if (l >= 0 && rt->opts.on_queries != NULL)
        rt->opts.on_queries(rt->opts.on_queries_ud, l, rt->q, m,
                            md->n_q_heads, d);
    TG_TRY(o->rope(rt->be, rt->q, m, md->n_q_heads, d, rt->pos, md->inv_freq));
    TG_TRY(o->rope(rt->be, rt->k, m, md->n_kv_heads, d, rt->pos, md->inv_freq));
    return 0;
}

/* Sums the ranks' partial (m, hidden) outputs of a row-parallel layer in
 * rt->h; nothing to do on one rank. */
static int reduce_partial(struct gw_runtime *rt, size_t hm, int l,
                          const char *what, char *err, size_t errlen)
{
    if (rt->opts.comm == NULL)
        return 0;
    int rc = gw_comm_allreduce_sum(rt->opts.comm, rt->h, hm);
    if (rc != 0)
        return tg_err_set(err, errlen, rc,
                          "all-reduce after %s of layer %d failed (%s): a "
                          "tensor-parallel peer is gone or out of step",
                          what, l, tg_strerror(rc));
    return 0;
}

/* Output projection, residual, and the SwiGLU MLP block for m rows of
 * layer l. With tensor parallelism o_proj and down_proj are row-parallel:
 * their GEMMs give this rank's partial sums, all-reduced before the
 * residual adds (rank 0's shard alone holds o_proj's bias). */
static int attn_out_and_mlp(struct gw_runtime *rt, const struct gw_layer *w,
                            int l, int m, char *err, size_t errlen)
{
    const struct gw_model *md = rt->model;
    const struct tg_ops *o = rt->ops;
    size_t hm = (size_t)m * (size_t)md->hidden;
    TG_TRY(gw_model_gemm(md, o, rt->be, rt->att, w->wo, w->bo, m, md->hidden,
                         md->n_q_heads * md->head_dim, rt->h));
    TG_TRY(reduce_partial(rt, hm, l, "o_proj", err, errlen));
    TG_TRY(o->add(rt->be, rt->x, rt->h, hm));
    TG_TRY(o->rmsnorm(rt->be, rt->x, w->ffn_norm, m, md->hidden, md->norm_eps, rt->h));
    TG_TRY(gw_model_gemm(md, o, rt->be, rt->h, w->w_gate, NULL, m, md->ffn,
                         md->hidden, rt->gate));
    TG_TRY(gw_model_gemm(md, o, rt->be, rt->h, w->w_up, NULL, m, md->ffn,
                         md->hidden, rt->up));
    TG_TRY(o->silu_mul(rt->be, rt->gate, rt->up, (size_t)m * (size_t)md->ffn, rt->gate));
    TG_TRY(gw_model_gemm(md, o, rt->be, rt->gate, w->w_down, NULL, m,
                         md->hidden, md->ffn, rt->h));
    TG_TRY(reduce_partial(rt, hm, l, "down_proj", err, errlen));
    TG_TRY(o->add(rt->be, rt->x, rt->h, hm));
    return 0;
}

/* Checks that a sharded model's communicator is joined for its rank. */
static int comm_check(const struct gw_runtime *rt, char *err, size_t errlen)
{
    const struct gw_model *md = rt->model;
    if (md->world <= 1)
        return 0;
    const struct gw_comm *c = rt->opts.comm;
    if (c->world != md->world || c->rank != md->rank)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "model shard of rank %d of %d needs a joined "
                          "communicator of that rank and size (have rank %d "
                          "of %d)", md->rank, md->world, c->rank, c->world);
    return 0;
}

static int is_root(const struct gw_runtime *rt)
{
    return rt->model->world <= 1 || rt->model->rank == 0;
}

/* Logits of m rows of rt->x starting at row `first`, vocab-parallel (see
 * gw_forward.h): per block of lg_rows rows every rank computes its slice
 * (mb, Vp) with -INFINITY in the columns past V, the slices are gathered
 * on rank 0 as (T, mb, Vp) and transposed into out (m, V), row-major.
 * out is written on rank 0 only (NULL elsewhere). */
static int final_logits(struct gw_runtime *rt, int first, int m, float *out,
                        char *err, size_t errlen)
{
    const struct gw_model *md = rt->model;
    int v_first, v_count, vp;
    gw_model_vocab_slice(md, &v_first, &v_count, &vp);
    int T = md->world > 1 ? md->world : 1;
    size_t V = (size_t)md->vocab, P = (size_t)vp;
    for (int b0 = 0; b0 < m; b0 += rt->lg_rows) {
        int mb = m - b0 < rt->lg_rows ? m - b0 : rt->lg_rows;
        float *xr = rt->x + (size_t)(first + b0) * (size_t)md->hidden;
        float *loc = rt->lg_local;
        if (v_count > 0) {
            TG_TRY(rt->ops->rmsnorm(rt->be, xr, md->final_norm, mb, md->hidden,
                                 md->norm_eps, rt->h));
            TG_TRY(gw_model_gemm(md, rt->ops, rt->be, rt->h, md->lm_head, NULL,
                                 mb, v_count, md->hidden, loc));
        }
        if (v_count < vp) {
            /* (mb, count) -> (mb, Vp): move rows back to front so none is
             * overwritten before it moved, padding each with -inf. */
            for (int i = mb - 1; i >= 0; i--) {
                float *dst = loc + (size_t)i * P;
                memmove(dst, loc + (size_t)i * (size_t)v_count,
                        (size_t)v_count * sizeof(float));
                for (size_t j = (size_t)v_count; j < P; j++)
                    dst[j] = -INFINITY;
            }
        }
        /* One rank (no comm, in-process generation) gathers by copying. */
        struct gw_comm alone = {.world = 1};
        struct gw_comm *c = rt->opts.comm != NULL ? rt->opts.comm : &alone;
        int rc = gw_comm_gather(c, loc, (size_t)mb * P, rt->lg_all);
        if (rc != 0)
            return tg_err_set(err, errlen, rc,
                              "gathering the logits slices failed (%s): a "
                              "tensor-parallel peer is gone or out of step",
                              tg_strerror(rc));
        if (!is_root(rt))
            continue;
        for (int r = 0; r < T; r++) {
            size_t c0 = (size_t)r * P;
            size_t cn = c0 >= V ? 0 : (V - c0 < P ? V - c0 : P);
            for (int i = 0; i < mb && cn > 0; i++)
                memcpy(out + (size_t)(b0 + i) * V + c0,
                       rt->lg_all + ((size_t)r * (size_t)mb + (size_t)i) * P,
                       cn * sizeof(float));
        }
    }
    return 0;
}

/* Log-probabilities of targets[i] (>= 0) after chunk row i, computed in
 * blocks of GW_LP_BLOCK rows so the (rows, V) logits never get large.
 * Every rank runs the same blocks (targets are known everywhere); lp is
 * written on rank 0. */
static int prompt_logprobs(struct gw_runtime *rt, int64_t start, int n,
                           const struct gw_prefill_out *po, char *err,
                           size_t errlen)
{
    const struct gw_model *md = rt->model;
    const int32_t *targets = po->lp_targets;
    float *lp = po->lp;
    int K = po->rank != NULL ? po->n_top : 0;
    for (int i0 = 0; i0 < n; i0 += GW_LP_BLOCK) {
        int m = n - i0 < GW_LP_BLOCK ? n - i0 : GW_LP_BLOCK;
        int any = 0;
        int32_t tgt[GW_LP_BLOCK];
        for (int i = 0; i < m; i++) {
            tgt[i] = targets[i0 + i] >= 0 ? targets[i0 + i] : 0;
            any |= targets[i0 + i] >= 0;
        }
        if (!any)
            continue;
        TG_TRY(final_logits(rt, i0, m, rt->lp_logits, err, errlen));
        if (!is_root(rt))
            continue;
        for (int i = 0; po->on_row != NULL && i < m; i++) {
            int64_t pos = start + i0 + i + 1;
            if (targets[i0 + i] >= 0 && pos >= po->row_from)
                po->on_row(po->row_ud, pos,
                           rt->lp_logits + (size_t)i * (size_t)md->vocab,
                           md->vocab);
        }
        float out[GW_LP_BLOCK];
        if (po->rank == NULL) {
            TG_TRY(rt->ops->logprobs(rt->be, rt->lp_logits, m, md->vocab, tgt,
                                     out));
        } else {
            /* The same values with ranks and alternatives (the API's
             * prompt log-probabilities); the block's own scratch. */
            int32_t rk[GW_LP_BLOCK], ti[GW_LP_BLOCK * GW_PROMPT_MAX_TOP];
            float tv[GW_LP_BLOCK * GW_PROMPT_MAX_TOP];
            TG_TRY(rt->ops->logprobs_top(rt->be, rt->lp_logits, m, md->vocab,
                                         tgt, K, out, rk, ti, tv));
            for (int i = 0; i < m; i++) {
                if (targets[i0 + i] < 0)
                    continue;
                po->rank[i0 + i] = rk[i];
                memcpy(po->top_ids + (size_t)(i0 + i) * (size_t)K,
                       ti + (size_t)i * (size_t)K, (size_t)K * sizeof(int32_t));
                memcpy(po->top_lps + (size_t)(i0 + i) * (size_t)K,
                       tv + (size_t)i * (size_t)K, (size_t)K * sizeof(float));
            }
        }
        for (int i = 0; i < m; i++)
            if (targets[i0 + i] >= 0)
                lp[i0 + i] = out[i];
    }
    return 0;
}

/* §4.8 for layer l of a chunk: per-head selection within the group's §4.3
 * keep (the reservation), append at each head's own length, then
 * keep_rows[l][g] becomes how much the group's longest head grew, so
 * gw_chunk_advance moves seq->len to the longest head. rt->h still holds
 * the layer's normed input (q_proj's input rows). */
static int gvote_layer(struct gw_runtime *rt, struct gw_seq *seq, int l,
                       const struct gw_layer *w, const struct tg_kv_rows *rows,
                       int n, int64_t start)
{
    const struct kv_layout *lay = rt->layout;
    const int Hkv = lay->n_kv_heads, G = lay->n_groups;
    int32_t *krow = rt->keep_rows + (size_t)l * (size_t)G;
    int32_t *hl = seq->hlen + (size_t)l * (size_t)Hkv;
    int32_t *cap = rt->kcap;
    for (int h = 0; h < Hkv; h++)
        cap[h] = krow[rows->head_group[h]];
    struct gw_gvote_chunk c = {
        .w = w, .x = rt->h, .q = rt->q, .k = rt->k, .n = n, .start = start,
        .layer = l, .seed = seq->seed, .rule = &lay->rule, .kcap = cap};
    TG_TRY(gw_gvote_select(&rt->gv, rt->model, rt->ops, rt->be, &c, rt->keep,
                           rt->idx));
    log_slots(lay, seq, l, rows, rt->idx, n, rt->keep, start);
    TG_TRY(rt->ops->kv_append(rt->be, rows, rt->k, rt->v, n, rt->idx,
                              rt->keep));
    const int32_t *glen = seq->len + (size_t)l * (size_t)G;
    for (int g = 0; g < G; g++)
        krow[g] = 0;
    for (int h = 0; h < Hkv; h++) {
        int g = rows->head_group[h];
        hl[h] += rt->keep[h];
        if (hl[h] - glen[g] > krow[g])
            krow[g] = hl[h] - glen[g];
    }
    return 0;
}

int gw_forward_prefill(struct gw_runtime *rt, struct gw_seq *seq,
                       const int32_t *ids, int n,
                       const struct gw_prefill_out *out, char *err,
                       size_t errlen)
{
    const struct gw_model *md = rt->model;
    const struct kv_layout *lay = rt->layout;
    const struct tg_ops *o = rt->ops;
    if (n <= 0 || n > rt->opts.max_tokens)
        return tg_err_set(err, errlen, TG_EINVAL, "chunk of %d tokens (max %d)",
                          n, rt->opts.max_tokens);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= md->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "token id %d outside the vocabulary [0, %d)",
                              ids[i], md->vocab);
        rt->pos[i] = (int32_t)(seq->pos + i);
    }
    TG_TRY(comm_check(rt, err, errlen));
    if (out != NULL && is_root(rt) &&
        ((out->want_logits && out->last_logits == NULL) ||
         (out->lp_targets != NULL && out->lp == NULL) ||
         (out->rank != NULL &&
          (out->n_top < 0 || out->n_top > GW_PROMPT_MAX_TOP ||
           (out->n_top > 0 && (out->top_ids == NULL || out->top_lps == NULL))))))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank 0 asked for logits without an output buffer");
    int64_t start = seq->pos;
    if (rt->opts.method == TG_SCORE_GVOTE && seq->hlen == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "gvote needs per-head lengths (gw_seq.hlen)");
    int forced = 0;
    int rc = gw_chunk_plan(lay, seq, n, rt->keep_rows, &forced, err, errlen);
    if (rc != 0)
        return rc;

    float scale = 1.0f / sqrtf((float)md->head_dim);
    TG_TRY(gw_model_embed(md, o, rt->be, ids, n, rt->x));
    for (int l = 0; l < md->n_layers; l++) {
        const struct gw_layer *w = &md->layers[l];
        struct tg_kv_rows rows;
        seq_rows(rt, seq, l, rt->gp_scratch, &rows);
        TG_TRY(o->rmsnorm(rt->be, rt->x, w->attn_norm, n, md->hidden, md->norm_eps, rt->h));
        TG_TRY(qkv(rt, w, n, l));
        TG_TRY(o->attn_chunk(rt->be, rt->q, rt->k, rt->v, n, md->n_q_heads, &rows,
                          scale, rt->att));

        /* Compression of this layer's chunk keys (§4.3 steps 3-5). */
        const int32_t *krow = rt->keep_rows + (size_t)l * lay->n_groups;
        if (rt->opts.method == TG_SCORE_GVOTE) {
            TG_TRY(gvote_layer(rt, seq, l, w, &rows, n, start));
        } else {
            int all = 1;
            for (int h = 0; h < lay->n_kv_heads; h++) {
                rt->keep[h] = krow[rows.head_group[h]];
                if (rt->keep[h] != n)
                    all = 0;
            }
            int score = !all || rt->opts.on_scores != NULL;
            if (score) {
                TG_TRY(o->score(rt->be, rt->opts.method, rt->q, rt->k, rt->v, n,
                             md->n_q_heads, md->n_kv_heads, md->head_dim,
                             rt->layout->rule.window, scale, rt->scores));
                if (rt->opts.on_scores != NULL)
                    rt->opts.on_scores(rt->opts.on_scores_ud, l, rt->scores, n,
                                       md->n_kv_heads);
            }
            if (all) {
                log_slots(lay, seq, l, &rows, NULL, n, rt->keep, start);
                TG_TRY(o->kv_append(rt->be, &rows, rt->k, rt->v, n, NULL, rt->keep));
            } else {
                TG_TRY(o->select_topk(rt->be, rt->scores, n, md->n_kv_heads, rt->keep,
                                   start, rt->layout->rule.window,
                                   rt->layout->rule.n_sink, rt->idx));
                log_slots(lay, seq, l, &rows, rt->idx, n, rt->keep, start);
                TG_TRY(o->kv_append(rt->be, &rows, rt->k, rt->v, n, rt->idx, rt->keep));
            }
            /* Heads of unequal lengths (a compacted decode region of an
             * earlier turn) appended at their own ends; every head of a
             * group kept the same count, so the row grows as the §4.3
             * keep says. */
            if (seq->hlen != NULL)
                for (int h = 0; h < lay->n_kv_heads; h++)
                    seq->hlen[(size_t)l * (size_t)lay->n_kv_heads + (size_t)h] +=
                        rt->keep[h];
        }
        TG_TRY(attn_out_and_mlp(rt, w, l, n, err, errlen));
    }
    /* Each layer appended at its rows' old lengths; they grow now. */
    gw_chunk_advance(seq, lay, rt->keep_rows, n);
    if (out != NULL && out->lp_targets != NULL)
        TG_TRY(prompt_logprobs(rt, start, n, out, err, errlen));
    if (out != NULL && out->want_logits)
        TG_TRY(final_logits(rt, n - 1, 1, out->last_logits, err, errlen));
    return 0;
}

int gw_forward_decode(struct gw_runtime *rt, struct gw_seq *const *seqs,
                      const int32_t *ids, int n_seq, int want_logits,
                      float *logits, char *err, size_t errlen)
{
    const struct gw_model *md = rt->model;
    const struct kv_layout *lay = rt->layout;
    const struct tg_ops *o = rt->ops;
    if (n_seq <= 0 || n_seq > rt->opts.max_tokens)
        return tg_err_set(err, errlen, TG_EINVAL, "decode batch of %d (max %d)",
                          n_seq, rt->opts.max_tokens);
    TG_TRY(comm_check(rt, err, errlen));
    if (want_logits && logits == NULL && is_root(rt))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank 0 asked for logits without an output buffer");
    int32_t one[KV_MAX_GROUPS];
    TG_ASSERT(lay->n_groups <= KV_MAX_GROUPS);
    for (int g = 0; g < lay->n_groups; g++)
        one[g] = 1;
    for (int s = 0; s < n_seq; s++) {
        if (ids[s] < 0 || ids[s] >= md->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "token id %d outside the vocabulary [0, %d)",
                              ids[s], md->vocab);
        rt->pos[s] = (int32_t)seqs[s]->pos;
        for (int l = 0; l < lay->n_layers; l++) {
            int rc = gw_seq_room(rt->layout, seqs[s], l, one, err, errlen);
            if (rc != 0)
                return rc;
        }
    }
    float scale = 1.0f / sqrtf((float)md->head_dim);
    size_t kd = (size_t)md->n_kv_heads * (size_t)md->head_dim;
    TG_TRY(gw_model_embed(md, o, rt->be, ids, n_seq, rt->x));
    for (int l = 0; l < md->n_layers; l++) {
        const struct gw_layer *w = &md->layers[l];
        TG_TRY(o->rmsnorm(rt->be, rt->x, w->attn_norm, n_seq, md->hidden, md->norm_eps, rt->h));
        TG_TRY(qkv(rt, w, n_seq, -1));
        for (int s = 0; s < n_seq; s++) {
            const int32_t **gp = rt->rows_pages + (size_t)s * (size_t)lay->n_groups;
            seq_rows(rt, seqs[s], l, gp, &rt->rows[s]);
            for (int h = 0; h < md->n_kv_heads; h++)
                rt->keep[h] = 1;
            log_slots(lay, seqs[s], l, &rt->rows[s], NULL, 1, rt->keep,
                      seqs[s]->pos);
            TG_TRY(o->kv_append(rt->be, &rt->rows[s], rt->k + (size_t)s * kd,
                             rt->v + (size_t)s * kd, 1, NULL, rt->keep));
            int32_t *len = seqs[s]->len + (size_t)l * (size_t)lay->n_groups;
            for (int g = 0; g < lay->n_groups; g++)
                len[g] += 1;
            if (seqs[s]->hlen != NULL)
                for (int h = 0; h < md->n_kv_heads; h++)
                    seqs[s]->hlen[(size_t)l * (size_t)md->n_kv_heads + h] += 1;
        }
        TG_TRY(o->attn_decode(rt->be, rt->q, n_seq, md->n_q_heads, rt->rows, scale,
                           rt->att));
        TG_TRY(attn_out_and_mlp(rt, w, l, n_seq, err, errlen));
    }
    for (int s = 0; s < n_seq; s++)
        seqs[s]->pos += 1;
    return want_logits ? final_logits(rt, 0, n_seq, logits, err, errlen) : 0;
}

int gw_forward_trig(struct gw_runtime *rt, const struct gw_trig_cfg *c,
                    struct gw_seq *const *seqs, int n_seq, int64_t *heads,
                    char *err, size_t errlen)
{
    const struct kv_layout *lay = rt->layout;
    const int H = lay->n_kv_heads, G = lay->n_groups;
    *heads = 0;
    if (c == NULL || c->n_layers != lay->n_layers || c->n_kv_heads != H)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode compression is not configured for this "
                          "layout");
    for (int s = 0; s < n_seq; s++) {
        struct gw_seq *sq = seqs[s];
        if (sq->hlen == NULL || sq->dstart == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "decode compression needs per-head lengths and "
                              "decode-region starts");
        for (int l = 0; l < lay->n_layers; l++) {
            struct tg_kv_rows rows;
            seq_rows(rt, sq, l, rt->gp_scratch, &rows);
            int32_t *hl = sq->hlen + (size_t)l * (size_t)H;
            int32_t *sp = sq->slot_pos != NULL
                              ? sq->slot_pos + (size_t)l * (size_t)H *
                                                   (size_t)sq->slot_cap
                              : NULL;
            int n = gw_trig_compact_layer(c, l, &rows, hl,
                                          sq->dstart + (size_t)l * (size_t)H,
                                          sq->pos, sp, sq->slot_cap, &rt->trig);
            if (n < 0)
                return tg_err_set(err, errlen, n,
                                  "decode compaction of layer %d failed (%s)",
                                  l, tg_strerror(n));
            *heads += n;
            if (n == 0)
                continue;
            /* A group's row is as long as its longest head. */
            int32_t *len = sq->len + (size_t)l * (size_t)G;
            for (int g = 0; g < G; g++)
                len[g] = 0;
            for (int h = 0; h < H; h++) {
                int g = rows.head_group[h];
                if (hl[h] > len[g])
                    len[g] = hl[h];
            }
        }
    }
    return 0;
}
