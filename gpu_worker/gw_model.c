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

/* One tensor to load: its HF name, the expected shape and where it goes. */
struct want {
    char name[128];
    int64_t rows, cols; /* cols 0 for a vector of `rows` elements */
    float **dst;
};

static int64_t want_numel(const struct want *w)
{
    return w->cols > 0 ? w->rows * w->cols : w->rows;
}

/* Appends a wanted tensor to the list (capacity is computed up front). */
static void add(struct want *list, int *n, float **dst, int64_t rows,
                int64_t cols, const char *fmt, int layer)
{
    struct want *w = &list[(*n)++];
    snprintf(w->name, sizeof(w->name), fmt, layer);
    w->rows = rows;
    w->cols = cols;
    w->dst = dst;
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
    memset(m, 0, sizeof(*m));
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    int rc = mc_model_config_load(&m->cfg, path, err, errlen);
    if (rc != 0)
        return rc;
    const struct mc_model_config *c = &m->cfg;
    m->n_layers = c->num_layers;
    m->hidden = c->hidden_size;
    m->n_q_heads = c->num_heads;
    m->n_kv_heads = c->num_kv_heads;
    m->head_dim = c->head_dim;
    m->ffn = c->intermediate_size;
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
    m->layers = calloc((size_t)L, sizeof(*m->layers));
    m->inv_freq = calloc((size_t)d / 2 + 1, sizeof(float));
    list = calloc((size_t)(16 * L + 4), sizeof(*list));
    if (!m->layers || !m->inv_freq || !list) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto fail;
    }
    rc = mc_rope_inv_freq(c, m->inv_freq);
    if (rc != 0) {
        tg_err_set(err, errlen, rc, "%s: cannot compute RoPE frequencies", path);
        goto fail;
    }

    int n = 0;
    add(list, &n, &m->embed, c->vocab_size, H, "model.embed_tokens.weight", 0);
    for (int l = 0; l < (int)L; l++) {
        struct gw_layer *w = &m->layers[l];
        add(list, &n, &w->attn_norm, H, 0, "model.layers.%d.input_layernorm.weight", l);
        add(list, &n, &w->wq, QD, H, "model.layers.%d.self_attn.q_proj.weight", l);
        add(list, &n, &w->wk, KD, H, "model.layers.%d.self_attn.k_proj.weight", l);
        add(list, &n, &w->wv, KD, H, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->qkv_bias) {
            add(list, &n, &w->bq, QD, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add(list, &n, &w->bk, KD, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add(list, &n, &w->bv, KD, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (c->qk_norm) {
            add(list, &n, &w->q_norm, d, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add(list, &n, &w->k_norm, d, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        add(list, &n, &w->wo, H, QD, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->o_bias)
            add(list, &n, &w->bo, H, 0, "model.layers.%d.self_attn.o_proj.bias", l);
        add(list, &n, &w->ffn_norm, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add(list, &n, &w->w_gate, F, H, "model.layers.%d.mlp.gate_proj.weight", l);
        add(list, &n, &w->w_up, F, H, "model.layers.%d.mlp.up_proj.weight", l);
        add(list, &n, &w->w_down, H, F, "model.layers.%d.mlp.down_proj.weight", l);
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
    if (!m->tied)
        add(list, &n, &m->lm_head, c->vocab_size, H, "lm_head.weight", 0);

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
        if (st_tensor_read_f32(t, 0, st_tensor_rows(t), *list[i].dst, NULL, 0) != 0)
            bad |= 1;
    }
    if (bad) {
        rc = tg_err_set(err, errlen, TG_EFORMAT, "%s: cannot convert weights", dir);
        goto fail;
    }
    if (m->tied)
        m->lm_head = m->embed;
    st_model_close(&st);
    free(list);
    return 0;

fail:
    st_model_close(&st);
    free(list);
    gw_model_free(m);
    return rc;
}
