/* gw_model.c — Hugging Face checkpoint -> fp32 weights (see gw_model.h). */
#include "gpu_worker/gw_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/st_safetensors.h"
#include "common/tg_err.h"

void gw_model_free(struct gw_model *m)
{
    free(m->slab);
    free(m->layers);
    free(m->inv_freq);
    memset(m, 0, sizeof(*m));
}

void gw_model_vocab_slice(const struct gw_model *m, int *first, int *count,
                          int *per_rank)
{
    int T = m->world > 1 ? m->world : 1, r = m->world > 1 ? m->rank : 0;
    int64_t vp = ((int64_t)m->vocab + T - 1) / T;
    int64_t f = (int64_t)r * vp, n = (int64_t)m->vocab - f;
    *per_rank = (int)vp;
    *first = (int)(f < m->vocab ? f : m->vocab);
    *count = (int)(n < 0 ? 0 : n < vp ? n : vp);
}

/* Which part of a tensor a rank keeps: all of it, blocks of `blk` rows,
 * blocks of `blk` columns of every row (blocks listed in keep order), or
 * the `blk` rows starting at row `first`. */
enum pick { PICK_ALL, PICK_ROWS, PICK_COLS, PICK_RANGE };

struct sel {
    enum pick pick;
    int64_t blk;          /* rows or columns per block */
    const int32_t *block; /* (n_blk) block indices in the source */
    int n_blk;
    int64_t first;        /* PICK_RANGE: first row */
};

static const struct sel SEL_ALL = {PICK_ALL, 0, NULL, 0, 0};

/* One tensor to load: its HF name, the checkpoint's shape, the part kept
 * and where it goes. */
struct want {
    char name[128];
    int64_t rows, cols; /* source shape; cols 0 for a vector of `rows` */
    struct sel sel;
    float **dst;
};

/* Floats the kept part takes. */
static int64_t want_numel(const struct want *w)
{
    int64_t cols = w->cols > 0 ? w->cols : 1;
    switch (w->sel.pick) {
    case PICK_RANGE:
        return w->sel.blk * cols;
    case PICK_ROWS:
        return (int64_t)w->sel.n_blk * w->sel.blk * cols;
    case PICK_COLS:
        return w->rows * (int64_t)w->sel.n_blk * w->sel.blk;
    default:
        return w->rows * cols;
    }
}

/* Appends a wanted tensor to the list (capacity is computed up front). */
static void add(struct want *list, int *n, float **dst, int64_t rows,
                int64_t cols, const char *fmt, int layer)
{
    struct want *w = &list[(*n)++];
    snprintf(w->name, sizeof(w->name), fmt, layer);
    w->rows = rows;
    w->cols = cols;
    w->sel = SEL_ALL;
    w->dst = dst;
}

/* add() keeping only the part `sel` of the tensor. */
static void add_sel(struct want *list, int *n, float **dst, int64_t rows,
                    int64_t cols, struct sel sel, const char *fmt, int layer)
{
    add(list, n, dst, rows, cols, fmt, layer);
    list[*n - 1].sel = sel;
}

/* Reads the kept part of t into dst (fp32). Returns 0 or nonzero. */
static int read_part(const struct st_tensor *t, const struct want *w, float *dst)
{
    const struct sel *s = &w->sel;
    if (s->pick == PICK_ALL)
        return st_tensor_read_f32(t, 0, st_tensor_rows(t), dst, NULL, 0);
    if (s->pick == PICK_RANGE)
        return s->blk == 0 ? 0
                           : st_tensor_read_f32(t, (uint64_t)s->first,
                                                (uint64_t)(s->first + s->blk),
                                                dst, NULL, 0);
    if (s->pick == PICK_ROWS) {
        int64_t row_len = w->cols > 0 ? w->cols : 1;
        for (int k = 0; k < s->n_blk; k++) {
            uint64_t b = (uint64_t)s->block[k] * (uint64_t)s->blk;
            if (st_tensor_read_f32(t, b, b + (uint64_t)s->blk,
                                   dst + (size_t)k * (size_t)(s->blk * row_len),
                                   NULL, 0) != 0)
                return 1;
        }
        return 0;
    }
    /* Columns: convert a batch of whole rows, then gather the blocks. */
    enum { BATCH = 32 };
    size_t cols = (size_t)w->cols, kept = (size_t)s->n_blk * (size_t)s->blk;
    float *tmp = malloc((size_t)BATCH * cols * sizeof(float));
    if (tmp == NULL)
        return 1;
    int bad = 0;
    for (int64_t r0 = 0; r0 < w->rows && !bad; r0 += BATCH) {
        int64_t m = w->rows - r0 < BATCH ? w->rows - r0 : BATCH;
        if (st_tensor_read_f32(t, (uint64_t)r0, (uint64_t)(r0 + m), tmp, NULL, 0) != 0) {
            bad = 1;
            break;
        }
        for (int64_t i = 0; i < m; i++) {
            float *out = dst + (size_t)(r0 + i) * kept;
            const float *in = tmp + (size_t)i * cols;
            for (int k = 0; k < s->n_blk; k++)
                memcpy(out + (size_t)k * (size_t)s->blk,
                       in + (size_t)s->block[k] * (size_t)s->blk,
                       (size_t)s->blk * sizeof(float));
        }
    }
    free(tmp);
    return bad;
}

/* Block indices of one layer on this rank: KV heads, their query heads
 * and the ffn range; `all` when they are the whole tensor in order (then
 * nothing is gathered and the load is exactly the unsharded one). */
struct layer_sel {
    struct sel q, kv, o, ffn_rows, ffn_cols;
};

static int is_identity(const int32_t *b, int n, int total)
{
    if (n != total)
        return 0;
    for (int i = 0; i < n; i++)
        if (b[i] != i)
            return 0;
    return 1;
}

/* Checks the shard against the config and fills the index arrays:
 * qidx (L, Hq/T), kvidx (L, Hkv/T), fidx[0] = rank. */
static int shard_check(const struct mc_model_config *c, const struct gw_shard *sh,
                       int32_t *qidx, int32_t *kvidx, char *err, size_t errlen)
{
    int T = sh->world, H = c->num_kv_heads, Hq = c->num_heads;
    int G = Hq / H, Hl = H / T;
    for (int l = 0; l < c->num_layers; l++) {
        uint64_t seen[(GW_MODEL_MAX_KV_HEADS + 63) / 64] = {0};
        for (int i = 0; i < Hl; i++) {
            int g = sh->kv_heads != NULL ? sh->kv_heads[(size_t)l * (size_t)Hl + (size_t)i] : i;
            if (g < 0 || g >= H || (seen[g / 64] >> (g % 64)) & 1u)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "shard of rank %d: layer %d local head %d "
                                  "maps to KV head %d (model has %d; each "
                                  "once)", sh->rank, l, i, g, H);
            seen[g / 64] |= 1ull << (g % 64);
            kvidx[(size_t)l * (size_t)Hl + (size_t)i] = g;
            for (int j = 0; j < G; j++)
                qidx[((size_t)l * (size_t)Hl + (size_t)i) * (size_t)G + (size_t)j] =
                    g * G + j;
        }
    }
    return 0;
}

static int check_shape(const struct st_tensor *t, const struct want *w,
                       char *err, size_t errlen)
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
                          "tensor %s has shape [%s], expected [%lld, %lld]",
                          w->name, got, (long long)w->rows, (long long)w->cols);
    return tg_err_set(err, errlen, TG_EFORMAT,
                      "tensor %s has shape [%s], expected [%lld]", w->name, got,
                      (long long)w->rows);
}

int gw_model_load(struct gw_model *m, const char *dir, char *err, size_t errlen)
{
    return gw_model_load_shard(m, dir, NULL, err, errlen);
}

int gw_model_load_shard(struct gw_model *m, const char *dir,
                        const struct gw_shard *sh, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    const struct gw_shard whole = {.rank = 0, .world = 1, .kv_heads = NULL};
    if (sh == NULL)
        sh = &whole;
    if (sh->world < 1 || sh->rank < 0 || sh->rank >= sh->world ||
        (sh->kv_heads == NULL && sh->world != 1))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "model shard: rank %d of %d%s", sh->rank, sh->world,
                          sh->kv_heads == NULL ? " without a head list" : "");
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    int rc = mc_model_config_load(&m->cfg, path, err, errlen);
    if (rc != 0)
        return rc;
    const struct mc_model_config *c = &m->cfg;
    int T = sh->world;
    if (c->num_kv_heads % T != 0 || c->num_heads % T != 0 ||
        c->intermediate_size % T != 0 || c->num_kv_heads > GW_MODEL_MAX_KV_HEADS) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "%s: %d KV heads, %d query heads and intermediate size "
                        "%d must all be multiples of the %d tensor-parallel "
                        "ranks (and at most %d KV heads)", path,
                        c->num_kv_heads, c->num_heads, c->intermediate_size, T,
                        GW_MODEL_MAX_KV_HEADS);
        memset(m, 0, sizeof(*m));
        return rc;
    }
    m->rank = sh->rank;
    m->world = T;
    m->n_layers = c->num_layers;
    m->hidden = c->hidden_size;
    m->n_q_heads = c->num_heads / T;
    m->n_kv_heads = c->num_kv_heads / T;
    m->head_dim = c->head_dim;
    m->ffn = c->intermediate_size / T;
    m->vocab = c->vocab_size;
    m->max_positions = (int)(c->max_position_embeddings > 0x7fffffff
                                 ? 0x7fffffff
                                 : c->max_position_embeddings);
    /* Sliding-window attention is not implemented; within the window it
     * equals full attention, so the usable context stops there. */
    if (c->sliding_window > 0 && c->sliding_window < m->max_positions)
        m->max_positions = (int)c->sliding_window;
    m->norm_eps = (float)c->rms_norm_eps;
    m->tied = c->tie_word_embeddings;

    struct st_model st = {0};
    struct want *list = NULL;
    int64_t L = c->num_layers, H = c->hidden_size, F = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim;
    int64_t KD = (int64_t)c->num_kv_heads * c->head_dim;
    int64_t d = c->head_dim;
    size_t nq = (size_t)L * (size_t)m->n_q_heads, nkv = (size_t)L * (size_t)m->n_kv_heads;
    int32_t *qidx = malloc((nq + 1) * sizeof(int32_t));
    int32_t *kvidx = malloc((nkv + 1) * sizeof(int32_t));
    int32_t fidx[1] = {sh->rank};
    m->layers = calloc((size_t)L, sizeof(*m->layers));
    m->inv_freq = calloc((size_t)d / 2 + 1, sizeof(float));
    list = calloc((size_t)(16 * L + 4), sizeof(*list));
    if (!m->layers || !m->inv_freq || !list || !qidx || !kvidx) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto fail;
    }
    rc = shard_check(c, sh, qidx, kvidx, err, errlen);
    if (rc != 0)
        goto fail;
    rc = mc_rope_inv_freq(c, m->inv_freq);
    if (rc != 0) {
        tg_err_set(err, errlen, rc, "%s: cannot compute RoPE frequencies", path);
        goto fail;
    }

    int n = 0;
    add(list, &n, &m->embed, c->vocab_size, H, "model.embed_tokens.weight", 0);
    for (int l = 0; l < (int)L; l++) {
        struct gw_layer *w = &m->layers[l];
        const int32_t *qb = qidx + (size_t)l * (size_t)m->n_q_heads;
        const int32_t *kb = kvidx + (size_t)l * (size_t)m->n_kv_heads;
        struct sel q = {PICK_ROWS, d, qb, m->n_q_heads, 0};
        struct sel kv = {PICK_ROWS, d, kb, m->n_kv_heads, 0};
        struct sel o = {PICK_COLS, d, qb, m->n_q_heads, 0};
        struct sel fr = {PICK_ROWS, m->ffn, fidx, 1, 0};
        struct sel fc = {PICK_COLS, m->ffn, fidx, 1, 0};
        if (is_identity(kb, m->n_kv_heads, c->num_kv_heads))
            q = kv = o = SEL_ALL; /* whole model, model order */
        if (T == 1)
            fr = fc = SEL_ALL;
        add(list, &n, &w->attn_norm, H, 0, "model.layers.%d.input_layernorm.weight", l);
        add_sel(list, &n, &w->wq, QD, H, q, "model.layers.%d.self_attn.q_proj.weight", l);
        add_sel(list, &n, &w->wk, KD, H, kv, "model.layers.%d.self_attn.k_proj.weight", l);
        add_sel(list, &n, &w->wv, KD, H, kv, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->qkv_bias) {
            add_sel(list, &n, &w->bq, QD, 0, q, "model.layers.%d.self_attn.q_proj.bias", l);
            add_sel(list, &n, &w->bk, KD, 0, kv, "model.layers.%d.self_attn.k_proj.bias", l);
            add_sel(list, &n, &w->bv, KD, 0, kv, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (c->qk_norm) {
            add(list, &n, &w->q_norm, d, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add(list, &n, &w->k_norm, d, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        add_sel(list, &n, &w->wo, H, QD, o, "model.layers.%d.self_attn.o_proj.weight", l);
        /* The bias joins the all-reduced sum once: rank 0 adds it. */
        if (c->o_bias && sh->rank == 0)
            add(list, &n, &w->bo, H, 0, "model.layers.%d.self_attn.o_proj.bias", l);
        add(list, &n, &w->ffn_norm, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add_sel(list, &n, &w->w_gate, F, H, fr, "model.layers.%d.mlp.gate_proj.weight", l);
        add_sel(list, &n, &w->w_up, F, H, fr, "model.layers.%d.mlp.up_proj.weight", l);
        add_sel(list, &n, &w->w_down, H, F, fc, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add(list, &n, &m->final_norm, H, 0, "model.norm.weight", 0);

    rc = st_model_open(&st, dir, err, errlen);
    if (rc != 0)
        goto fail;
    /* An untied model without lm_head.weight is an error; a tied model may
     * still ship one (some exporters write it) and then it must match. */
    int has_head = st_model_find(&st, "lm_head.weight") != NULL;
    if (!m->tied && !has_head) {
        rc = tg_err_set(err, errlen, TG_EFORMAT,
                        "%s: missing tensor lm_head.weight (tie_word_embeddings "
                        "is false)", dir);
        goto fail;
    }
    /* Vocab-parallel head: this rank's rows of lm_head (or, tied, of the
     * embedding, which stays whole for the input lookup). */
    int v_first, v_count, v_per;
    gw_model_vocab_slice(m, &v_first, &v_count, &v_per);
    if (!m->tied && v_count > 0) {
        struct sel vs = {PICK_RANGE, v_count, NULL, 0, v_first};
        add_sel(list, &n, &m->lm_head, c->vocab_size, H, vs, "lm_head.weight", 0);
    }

    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = st_model_find(&st, list[i].name);
        if (t == NULL) {
            rc = tg_err_set(err, errlen, TG_EFORMAT, "%s: missing tensor %s",
                            dir, list[i].name);
            goto fail;
        }
        rc = check_shape(t, &list[i], err, errlen);
        if (rc != 0)
            goto fail;
        if (t->dtype != ST_DTYPE_BF16 && t->dtype != ST_DTYPE_F16 &&
            t->dtype != ST_DTYPE_F32) {
            rc = tg_err_set(err, errlen, TG_EUNSUPPORTED,
                            "tensor %s has dtype %s (bf16, fp16 or fp32 needed)",
                            list[i].name, st_dtype_name(t->dtype));
            goto fail;
        }
        total += (size_t)want_numel(&list[i]);
    }
    m->slab = malloc(total * sizeof(float));
    if (m->slab == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM,
                        "cannot allocate %zu bytes for the weights", total * 4);
        goto fail;
    }
    m->slab_floats = total;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        *list[i].dst = m->slab + off;
        off += (size_t)want_numel(&list[i]);
    }
    /* Convert in parallel: tensors are independent. */
    int bad = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : bad)
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = st_model_find(&st, list[i].name);
        if (read_part(t, &list[i], *list[i].dst) != 0)
            bad |= 1;
    }
    if (bad) {
        rc = tg_err_set(err, errlen, TG_EFORMAT, "%s: cannot convert weights", dir);
        goto fail;
    }
    if (m->tied && v_count > 0)
        m->lm_head = m->embed + (size_t)v_first * (size_t)H;
    st_model_close(&st);
    free(list);
    free(qidx);
    free(kvidx);
    return 0;

fail:
    st_model_close(&st);
    free(list);
    free(qidx);
    free(kvidx);
    gw_model_free(m);
    return rc;
}
