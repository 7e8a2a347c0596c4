/* gw_wslab.c — the device weight slab's layout and upload op (see
 * gw_wslab.h). */
#include "gpu_worker/cuda/gw_wslab.h"

#include <stdlib.h>
#include <string.h>

#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"

static uint64_t align256(uint64_t b)
{
    return (b + 255) & ~(uint64_t)255;
}

void gw_wslab_free(struct gw_wslab *s)
{
    free(s->layer);
    memset(s, 0, sizeof(*s));
}

int gw_wslab_tied_head(const struct gw_model *m)
{
    return m->tied && m->world > 1;
}

/* Places a tensor of `bytes` at the end of the slab. */
static uint64_t place(struct gw_wslab *s, uint64_t bytes)
{
    uint64_t off = s->bytes;
    s->bytes += align256(bytes);
    return off;
}

int gw_wslab_init(struct gw_wslab *s, const struct gw_model *m, char *err,
                  size_t errlen)
{
    memset(s, 0, sizeof(*s));
    const struct mc_model_config *c = &m->cfg;
    uint64_t H = (uint64_t)m->hidden, d = (uint64_t)m->head_dim;
    uint64_t qd = (uint64_t)m->n_q_heads * d, kd = (uint64_t)m->n_kv_heads * d;
    uint64_t F = (uint64_t)m->ffn;
    int L = m->n_layers;
    s->n_layers = L;
    s->layer = malloc((size_t)(L > 0 ? L : 1) * GW_W_COUNT * sizeof(uint64_t));
    if (s->layer == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < (size_t)L * GW_W_COUNT; i++)
        s->layer[i] = GW_WSLAB_NONE;
    for (int i = 0; i <= GW_W_COUNT; i++)
        s->glob[i] = GW_WSLAB_NONE;
    for (int l = 0; l < L; l++) {
        uint64_t *o = s->layer + (size_t)l * GW_W_COUNT;
        o[GW_W_ATTN_NORM] = place(s, H * 2);
        o[GW_W_WQ] = place(s, qd * H * 2);
        o[GW_W_WK] = place(s, kd * H * 2);
        o[GW_W_WV] = place(s, kd * H * 2);
        if (c->qkv_bias) {
            o[GW_W_BQ] = place(s, qd * 2);
            o[GW_W_BK] = place(s, kd * 2);
            o[GW_W_BV] = place(s, kd * 2);
        }
        if (c->qk_norm) {
            o[GW_W_Q_NORM] = place(s, d * 2);
            o[GW_W_K_NORM] = place(s, d * 2);
        }
        o[GW_W_WO] = place(s, H * qd * 2);
        if (c->o_bias && m->rank == 0)
            o[GW_W_BO] = place(s, H * 4);
        o[GW_W_FFN_NORM] = place(s, H * 2);
        o[GW_W_GATE] = place(s, 2 * F * H * 2);
        o[GW_W_UP] = o[GW_W_GATE] + F * H * 2;
        o[GW_W_DOWN] = place(s, H * F * 2);
    }
    int first, count, vp;
    gw_model_vocab_slice(m, &first, &count, &vp);
    s->lm_rows = vp;
    s->glob[GW_W_EMBED] = place(s, (uint64_t)m->vocab * H * 2);
    s->glob[GW_W_FINAL_NORM] = place(s, H * 2);
    s->lm_shared = m->tied && m->world <= 1;
    s->glob[GW_W_LM_HEAD] = s->lm_shared ? s->glob[GW_W_EMBED]
                                         : place(s, (uint64_t)vp * H * 2);
    s->glob[GW_WSLAB_INV_FREQ] = place(s, d / 2 * 4);
    return 0;
}

uint64_t gw_wslab_offset(const struct gw_wslab *s, int kind, int layer,
                         int *elem)
{
    *elem = kind == GW_W_BO || kind == GW_WSLAB_INV_FREQ ? 4 : 2;
    if (kind < 0 || kind > GW_WSLAB_INV_FREQ)
        return GW_WSLAB_NONE;
    if (kind < GW_W_FIRST_LAYER_KIND || kind == GW_WSLAB_INV_FREQ)
        return s->glob[kind];
    if (s->layer == NULL || layer < 0 || layer >= s->n_layers)
        return GW_WSLAB_NONE;
    return s->layer[(size_t)layer * GW_W_COUNT + (size_t)kind];
}

int gw_wslab_upload(void *ctx, const struct gw_load_slice *sl, char *err,
                    size_t errlen)
{
    struct gw_wslab_upload *u = ctx;
    const struct gw_load_tensor *t = sl->t;
    int elem;
    uint64_t base = gw_wslab_offset(u->slab, (int)t->kind, t->layer, &elem);
    if (base == GW_WSLAB_NONE || sl->offset + sl->n > t->numel ||
        (t->kind == GW_W_LM_HEAD && u->slab->lm_shared))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "weight slab: no room for %s [%llu, +%llu)", t->name,
                          (unsigned long long)sl->offset,
                          (unsigned long long)sl->n);
    if (sl->dtype != ST_DTYPE_BF16 && sl->dtype != ST_DTYPE_F16 &&
        sl->dtype != ST_DTYPE_F32)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "tensor %s: cannot upload %s", t->name,
                          st_dtype_name(sl->dtype));
    size_t in_es = st_dtype_size(sl->dtype);
    size_t per = u->bounce_bytes / (size_t)elem;
    const uint8_t *src = sl->data;
    for (uint64_t done = 0; done < sl->n;) {
        size_t k = sl->n - done < per ? (size_t)(sl->n - done) : per;
        int b = u->next;
        if (u->busy[b] && u->out.wait != NULL)
            TG_TRY(u->out.wait(u->out.ctx, b, err, errlen));
        if (elem == 2)
            st_convert_bf16(sl->dtype, src + done * in_es, k, u->bounce[b]);
        else
            st_convert_f32(sl->dtype, src + done * in_es, k, u->bounce[b]);
        TG_TRY(u->out.copy(u->out.ctx,
                           base + (sl->offset + done) * (uint64_t)elem,
                           u->bounce[b], k * (size_t)elem, b, err, errlen));
        u->busy[b] = 1;
        u->next = 1 - b;
        u->copied += k * (uint64_t)elem;
        done += k;
    }
    return 0;
}

int gw_wslab_upload_finish(struct gw_wslab_upload *u, char *err,
                           size_t errlen)
{
    for (int b = 0; b < 2; b++) {
        if (u->busy[b] && u->out.wait != NULL)
            TG_TRY(u->out.wait(u->out.ctx, b, err, errlen));
        u->busy[b] = 0;
    }
    return 0;
}
