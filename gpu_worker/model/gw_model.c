/* gw_model.c — a model shard's shape, and its checkpoint streamed into
 * host fp32 weights (see gw_model.h). */
#include "gpu_worker/model/gw_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "common/base/tg_path.h"

static void drop_weights(struct gw_model *m)
{
    free(m->slab);
    m->slab = NULL;
    m->slab_elems = 0;
    m->slab_bytes = 0;
    m->wtype = TG_WTYPE_F32;
    m->embed = m->final_norm = m->lm_head = NULL;
    if (m->layers != NULL)
        memset(m->layers, 0, (size_t)m->n_layers * sizeof(*m->layers));
}

void gw_model_free(struct gw_model *m)
{
    free(m->slab);
    free(m->layers);
    free(m->inv_freq);
    free(m->dir);
    free(m->head_map);
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

const char *const gw_weights_choices[4] = {"auto", "f32", "bf16", NULL};

int gw_weights_parse(const char *s, enum gw_weights *out)
{
    for (int i = 0; i < 3; i++)
        if (s != NULL && strcmp(s, gw_weights_choices[i]) == 0) {
            *out = (enum gw_weights)i;
            return 0;
        }
    return TG_EINVAL;
}

int gw_wkind_is_matrix(enum gw_wkind kind)
{
    switch (kind) {
    case GW_W_EMBED:
    case GW_W_LM_HEAD:
    case GW_W_WQ:
    case GW_W_WK:
    case GW_W_WV:
    case GW_W_WO:
    case GW_W_GATE:
    case GW_W_UP:
    case GW_W_DOWN: return 1;
    default: return 0;
    }
}

/* The layer fields of each per-layer kind. */
#define LAYER_FIELDS(X)          \
    X(GW_W_ATTN_NORM, attn_norm) \
    X(GW_W_WQ, wq)               \
    X(GW_W_WK, wk)               \
    X(GW_W_WV, wv)               \
    X(GW_W_BQ, bq)               \
    X(GW_W_BK, bk)               \
    X(GW_W_BV, bv)               \
    X(GW_W_Q_NORM, q_norm)       \
    X(GW_W_K_NORM, k_norm)       \
    X(GW_W_WO, wo)               \
    X(GW_W_BO, bo)               \
    X(GW_W_FFN_NORM, ffn_norm)   \
    X(GW_W_GATE, w_gate)         \
    X(GW_W_UP, w_up)             \
    X(GW_W_DOWN, w_down)

/* The array m holds for destination (kind, layer), or NULL. */
static void *slot_get(const struct gw_model *m, enum gw_wkind kind, int layer)
{
    switch (kind) {
    case GW_W_EMBED: return m->embed;
    case GW_W_FINAL_NORM: return m->final_norm;
    case GW_W_LM_HEAD: return m->lm_head;
    default: break;
    }
    if (m->layers == NULL || layer < 0 || layer >= m->n_layers)
        return NULL;
    const struct gw_layer *w = &m->layers[layer];
    switch (kind) {
#define GET(k, f) \
    case k: return w->f;
        LAYER_FIELDS(GET)
#undef GET
    default: return NULL;
    }
}

/* Points destination (kind, layer) of m at p; 0, or -1 for no such
 * field. */
static int slot_set(struct gw_model *m, enum gw_wkind kind, int layer, void *p)
{
    switch (kind) {
    case GW_W_EMBED: m->embed = p; return 0;
    case GW_W_FINAL_NORM: m->final_norm = p; return 0;
    case GW_W_LM_HEAD: m->lm_head = p; return 0;
    default: break;
    }
    if (m->layers == NULL || layer < 0 || layer >= m->n_layers)
        return -1;
    struct gw_layer *w = &m->layers[layer];
    switch (kind) {
#define SET(k, f) \
    case k: w->f = p; return 0;
        LAYER_FIELDS(SET)
#undef SET
    default: return -1;
    }
}

const void *gw_model_weight_any(const struct gw_model *m, enum gw_wkind kind,
                                int layer, enum tg_wtype *wt)
{
    if ((unsigned)kind >= GW_W_COUNT)
        return NULL;
    *wt = gw_wkind_is_matrix(kind) ? m->wtype : TG_WTYPE_F32;
    return slot_get(m, kind, layer);
}

const float *gw_model_weight(const struct gw_model *m, enum gw_wkind kind,
                             int layer)
{
    enum tg_wtype wt;
    const void *p = gw_model_weight_any(m, kind, layer, &wt);
    return wt == TG_WTYPE_F32 ? p : NULL;
}

int gw_model_gemm(const struct gw_model *m, const struct tg_ops *ops,
                  struct tg_backend *be, const float *x, const void *w,
                  const float *bias, int rows, int n, int k, float *y)
{
    if (m->wtype == TG_WTYPE_BF16)
        return ops->gemm_bf16(be, x, w, bias, rows, n, k, y);
    return ops->gemm(be, x, w, bias, rows, n, k, y);
}

int gw_model_embed(const struct gw_model *m, const struct tg_ops *ops,
                   struct tg_backend *be, const int32_t *ids, int n, float *out)
{
    if (m->wtype == TG_WTYPE_BF16)
        return ops->embedding_bf16(be, m->embed, m->vocab, m->hidden, ids, n,
                                   out);
    return ops->embedding(be, m->embed, m->vocab, m->hidden, ids, n, out);
}

/* Checks the shard against the config and stores its head map. */
static int shard_map(struct gw_model *m, const struct gw_shard *sh, char *err,
                     size_t errlen)
{
    const struct mc_model_config *c = &m->cfg;
    int H = c->num_kv_heads, Hl = m->n_kv_heads;
    if (sh->kv_heads == NULL)
        return 0; /* one rank, model order */
    m->head_map = malloc((size_t)c->num_layers * (size_t)Hl * sizeof(int32_t) + 1);
    if (m->head_map == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (int l = 0; l < c->num_layers; l++) {
        uint64_t seen[(GW_MODEL_MAX_KV_HEADS + 63) / 64] = {0};
        for (int i = 0; i < Hl; i++) {
            int g = sh->kv_heads[(size_t)l * (size_t)Hl + (size_t)i];
            if (g < 0 || g >= H || (seen[g / 64] >> (g % 64)) & 1u)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "shard of rank %d: layer %d local head %d "
                                  "maps to KV head %d (model has %d; each "
                                  "once)", sh->rank, l, i, g, H);
            seen[g / 64] |= 1ull << (g % 64);
            m->head_map[(size_t)l * (size_t)Hl + (size_t)i] = g;
        }
    }
    return 0;
}

int gw_model_load(struct gw_model *m, const char *dir, char *err, size_t errlen)
{
    return gw_model_load_shard(m, dir, NULL, err, errlen);
}

int gw_model_open(struct gw_model *m, const char *dir,
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
    int rc = tg_path_fmt(path, sizeof(path), err, errlen, "%s/config.json",
                         dir);
    if (rc == 0)
        rc = mc_model_config_load(&m->cfg, path, err, errlen);
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
    m->weights = sh->weights;
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
    m->layers = calloc((size_t)c->num_layers, sizeof(*m->layers));
    m->inv_freq = calloc((size_t)c->head_dim / 2 + 1, sizeof(float));
    m->dir = strdup(dir);
    if (!m->layers || !m->inv_freq || !m->dir) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto fail;
    }
    rc = shard_map(m, sh, err, errlen);
    if (rc != 0)
        goto fail;
    rc = mc_rope_inv_freq(c, m->inv_freq);
    if (rc != 0) {
        tg_err_set(err, errlen, rc, "%s: cannot compute RoPE frequencies", path);
        goto fail;
    }
    return 0;
fail:
    gw_model_free(m);
    return rc;
}

/* ---- the shard's load plan ------------------------------------------------ */

static int is_identity(const int32_t *b, int n, int total)
{
    if (n != total)
        return 0;
    for (int i = 0; i < n; i++)
        if (b[i] != i)
            return 0;
    return 1;
}

int gw_model_load_plan(struct gw_load_plan *p, const struct gw_model *m,
                       int tied_head, char *err, size_t errlen)
{
    const struct mc_model_config *c = &m->cfg;
    int L = m->n_layers, T = m->world > 1 ? m->world : 1;
    int Hl = m->n_kv_heads, Hq = m->n_q_heads, G = Hq / (Hl > 0 ? Hl : 1);
    int64_t H = m->hidden, F = (int64_t)m->ffn * T, d = m->head_dim;
    int64_t QD = (int64_t)Hq * T * d, KD = (int64_t)Hl * T * d;
    size_t nkv = (size_t)L * (size_t)Hl, nq = (size_t)L * (size_t)Hq;
    /* At most 16 entries per layer and 4 model-wide ones; block indices:
     * KV heads (L, Hl), query heads (L, Hq), the ffn block. */
    TG_TRY(gw_load_plan_alloc(p, 16 * L + 4, nkv + nq + 1, err, errlen));
    int32_t *kvidx = p->idx, *qidx = p->idx + nkv, *fidx = qidx + nq;
    for (size_t i = 0; i < nkv; i++) {
        int g = m->head_map != NULL ? m->head_map[i] : (int)(i % (size_t)Hl);
        kvidx[i] = g;
        for (int j = 0; j < G; j++)
            qidx[i * (size_t)G + (size_t)j] = g * G + j;
    }
    fidx[0] = m->rank;
    p->tied = m->tied;
    const struct gw_load_sel all = {GW_PICK_ALL, 0, NULL, 0, 0};
    gw_load_plan_add(p, GW_W_EMBED, 0, m->vocab, H, all);
    for (int l = 0; l < L; l++) {
        const int32_t *qb = qidx + (size_t)l * (size_t)Hq;
        const int32_t *kb = kvidx + (size_t)l * (size_t)Hl;
        struct gw_load_sel q = {GW_PICK_ROWS, d, qb, Hq, 0};
        struct gw_load_sel kv = {GW_PICK_ROWS, d, kb, Hl, 0};
        struct gw_load_sel o = {GW_PICK_COLS, d, qb, Hq, 0};
        struct gw_load_sel fr = {GW_PICK_ROWS, m->ffn, fidx, 1, 0};
        struct gw_load_sel fc = {GW_PICK_COLS, m->ffn, fidx, 1, 0};
        if (is_identity(kb, Hl, c->num_kv_heads))
            q = kv = o = all; /* whole model, model order */
        if (T == 1)
            fr = fc = all;
        gw_load_plan_add(p, GW_W_ATTN_NORM, l, H, 0, all);
        gw_load_plan_add(p, GW_W_WQ, l, QD, H, q);
        gw_load_plan_add(p, GW_W_WK, l, KD, H, kv);
        gw_load_plan_add(p, GW_W_WV, l, KD, H, kv);
        if (c->qkv_bias) {
            gw_load_plan_add(p, GW_W_BQ, l, QD, 0, q);
            gw_load_plan_add(p, GW_W_BK, l, KD, 0, kv);
            gw_load_plan_add(p, GW_W_BV, l, KD, 0, kv);
        }
        if (c->qk_norm) {
            gw_load_plan_add(p, GW_W_Q_NORM, l, d, 0, all);
            gw_load_plan_add(p, GW_W_K_NORM, l, d, 0, all);
        }
        gw_load_plan_add(p, GW_W_WO, l, H, QD, o);
        /* The bias joins the all-reduced sum once: rank 0 adds it. */
        if (c->o_bias && m->rank == 0)
            gw_load_plan_add(p, GW_W_BO, l, H, 0, all);
        gw_load_plan_add(p, GW_W_FFN_NORM, l, H, 0, all);
        gw_load_plan_add(p, GW_W_GATE, l, F, H, fr);
        gw_load_plan_add(p, GW_W_UP, l, F, H, fr);
        gw_load_plan_add(p, GW_W_DOWN, l, H, F, fc);
    }
    gw_load_plan_add(p, GW_W_FINAL_NORM, 0, H, 0, all);
    int v_first, v_count, v_per;
    gw_model_vocab_slice(m, &v_first, &v_count, &v_per);
    if (v_count > 0 && (!m->tied || tied_head)) {
        struct gw_load_sel vs = {GW_PICK_RANGE, v_count, NULL, 0, v_first};
        gw_load_plan_add(p, GW_W_LM_HEAD, 0, m->vocab, H, vs);
        if (m->tied) /* the rows come from the embedding */
            snprintf(p->t[p->n - 1].name, sizeof(p->t[0].name), "%s",
                     gw_wkind_name(GW_W_EMBED));
    }
    return 0;
}


static const float *host_weight(const void *ud, enum gw_wkind kind, int layer)
{
    return gw_model_weight(ud, kind, layer);
}

int gw_model_run_host(const struct gw_load_plan *p, const struct gw_model *m,
                      size_t staging, const struct gw_load_sink *sink,
                      struct gw_load_stats *stats, char *err, size_t errlen)
{
    if (m->wtype != TG_WTYPE_F32)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "the model's host matrices are bf16; only fp32 "
                          "host weights can be handed to a sink");
    return gw_load_run_host(p, host_weight, m, staging, sink, stats, err,
                            errlen);
}

/* ---- the host sink: the arrays of m's slab ----------------------------- */

static int host_upload(void *ctx, const struct gw_load_slice *s, char *err,
                       size_t errlen)
{
    struct gw_model *m = ctx;
    enum tg_wtype wt;
    void *dst = (void *)gw_model_weight_any(m, s->t->kind, s->t->layer, &wt);
    if (dst == NULL || s->offset + s->n > s->t->numel)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "host weights: no room for %s [%llu, +%llu)",
                          s->t->name, (unsigned long long)s->offset,
                          (unsigned long long)s->n);
    const uint8_t *src = s->data;
    size_t es = st_dtype_size(s->dtype);
    /* Pieces of 64K elements over the OpenMP threads. */
    int64_t n = (int64_t)s->n, per = (int64_t)1 << 16, pieces = (n + per - 1) / per;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (pieces > 1)
    for (int64_t k = 0; k < pieces; k++) {
        int64_t a = k * per, cnt = n - a < per ? n - a : per;
        const uint8_t *from = src + (size_t)a * es;
        size_t at = (size_t)(s->offset + (uint64_t)a);
        if (wt == TG_WTYPE_BF16)
            bad |= st_convert_bf16(s->dtype, from, (size_t)cnt,
                                   (uint16_t *)dst + at) != 0;
        else
            bad |= st_convert_f32(s->dtype, from, (size_t)cnt,
                                  (float *)dst + at) != 0;
    }
    if (bad)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "tensor %s: cannot convert %s to %s", s->t->name,
                          st_dtype_name(s->dtype),
                          wt == TG_WTYPE_BF16 ? "bfloat16" : "float32");
    return 0;
}

/* The matrices' element type for the bound plan p: m->weights, AUTO
 * keeping bf16 when every matrix of the checkpoint is bf16. */
static enum tg_wtype choose_wtype(const struct gw_model *m,
                                  const struct gw_load_plan *p)
{
    if (m->weights == GW_WEIGHTS_F32)
        return TG_WTYPE_F32;
    if (m->weights == GW_WEIGHTS_BF16)
        return TG_WTYPE_BF16;
    for (int i = 0; i < p->n; i++)
        if (gw_wkind_is_matrix(p->t[i].kind) &&
            p->t[i].src->dtype != ST_DTYPE_BF16)
            return TG_WTYPE_F32;
    return TG_WTYPE_BF16;
}

/* The slab of the weights. A decode step streams all of it, GBs through
 * 4 KiB pages each needing a TLB entry; a slab of at least 2 MiB is
 * 2 MiB-aligned and asks for transparent huge pages (the kernel's common
 * "madvise" mode gives them only to regions that ask). Best effort: where
 * THP is off the advice fails and the pages stay small. free() releases
 * either kind. */
static void *slab_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge)
        return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    size_t rounded = (bytes + huge - 1) & ~(huge - 1);
    void *p = NULL;
    if (posix_memalign(&p, huge, rounded) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

/* Bytes of entry e in a slab whose matrices are wt, each entry starting on
 * a 64-byte boundary. */
static size_t entry_bytes(const struct gw_load_tensor *e, enum tg_wtype wt)
{
    size_t es = gw_wkind_is_matrix(e->kind) && wt == TG_WTYPE_BF16 ? 2 : 4;
    return ((size_t)e->numel * es + 63) & ~(size_t)63;
}

int gw_model_load_weights(struct gw_model *m, size_t staging, char *err,
                          size_t errlen)
{
    if (m->dir == NULL || m->layers == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "the model has no checkpoint to load");
    drop_weights(m);
    memset(&m->load, 0, sizeof(m->load));
    struct gw_load_plan plan;
    struct st_model st = {0};
    int rc = gw_model_load_plan(&plan, m, 0, err, errlen);
    if (rc != 0)
        return rc;
    rc = st_model_open(&st, m->dir, err, errlen);
    if (rc == 0)
        rc = gw_load_plan_bind(&plan, &st, err, errlen);
    size_t bytes = 0;
    if (rc == 0) {
        m->wtype = choose_wtype(m, &plan);
        for (int i = 0; i < plan.n; i++)
            bytes += entry_bytes(&plan.t[i], m->wtype);
        m->slab = slab_alloc(bytes + 64);
        if (m->slab == NULL)
            rc = tg_err_set(err, errlen, TG_ENOMEM,
                            "cannot allocate %zu bytes for the weights", bytes);
    }
    if (rc == 0) {
        /* Carve the slab in plan order. */
        m->slab_elems = (size_t)plan.numel;
        m->slab_bytes = bytes;
        size_t off = 0;
        for (int i = 0; i < plan.n; i++) {
            int set = slot_set(m, plan.t[i].kind, plan.t[i].layer,
                               (char *)m->slab + off);
            TG_ASSERT(set == 0);
            off += entry_bytes(&plan.t[i], m->wtype);
        }
        struct gw_load_sink sink = {.upload = host_upload, .ctx = m};
        rc = gw_load_run(&plan, &st, staging, &sink, &m->load, err, errlen);
    }
    if (rc == 0 && m->tied) {
        int v_first, v_count, v_per;
        gw_model_vocab_slice(m, &v_first, &v_count, &v_per);
        size_t es = m->wtype == TG_WTYPE_BF16 ? 2 : 4;
        if (v_count > 0)
            m->lm_head = (char *)m->embed +
                         (size_t)v_first * (size_t)m->hidden * es;
    }
    st_model_close(&st);
    gw_load_plan_free(&plan);
    if (rc != 0) {
        drop_weights(m);
        memset(&m->load, 0, sizeof(m->load));
    }
    return rc;
}

int gw_model_load_shard(struct gw_model *m, const char *dir,
                        const struct gw_shard *sh, char *err, size_t errlen)
{
    int rc = gw_model_open(m, dir, sh, err, errlen);
    if (rc == 0)
        rc = gw_model_load_weights(m, 0, err, errlen);
    if (rc != 0)
        gw_model_free(m);
    return rc;
}
