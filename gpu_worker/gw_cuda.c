/* gw_cuda.c — the forward pass on the CUDA backend (see gw_cuda.h). */
#include "gpu_worker/gw_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_budget.h"
#include "common/tg_err.h"

/* ---- decode batch buckets (every build) -------------------------------- */

int gw_cuda_buckets(int max_seqs, int *buckets, int cap)
{
    static const int small[] = {1, 2, 4, 8, 16, 24, 32, 48, 64};
    int n = 0;
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]) && n < cap; i++) {
        if (small[i] >= max_seqs)
            break;
        buckets[n++] = small[i];
    }
    for (int b = 96; b < max_seqs && n < cap; b += 32)
        buckets[n++] = b;
    if (max_seqs >= 1 && n < cap)
        buckets[n++] = max_seqs; /* the largest batch is always a bucket */
    else if (max_seqs >= 1 && n == cap)
        buckets[cap - 1] = max_seqs;
    return n;
}

int gw_cuda_bucket_of(const int *buckets, int n_buckets, int n)
{
    if (n < 1)
        return -1;
    for (int i = 0; i < n_buckets; i++)
        if (buckets[i] >= n)
            return i;
    return -1;
}

#ifdef TANGRAM_CUDA

#include <cuda_runtime.h>

#include "kernels/cuda/compress.h"
#include "kernels/cuda/decode_append.h"
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/prefill_attn.h"
#include "kernels/cuda/sample.h"
#include "kernels/cuda/score_qa.h"
#include "common/st_safetensors.h"

#define CU(expr)                                                           \
    do {                                                                   \
        cudaError_t e__ = (expr);                                          \
        if (e__ != cudaSuccess)                                            \
            return tg_err_set(err, errlen, TG_EDEVICE, "%s: %s", #expr,    \
                              cudaGetErrorString(e__));                    \
    } while (0)

/* A kernel entry's failure: the entry printed the CUDA detail (or put it
 * in err); name the op and layer. */
#define OP(expr, what, layer)                                              \
    do {                                                                   \
        int rc__ = (expr);                                                 \
        if (rc__ != 0)                                                     \
            return op_fail(err, errlen, rc__, what, layer);                \
    } while (0)

static int op_fail(char *err, size_t errlen, int rc, const char *what,
                   int layer)
{
    if (err != NULL && err[0] != '\0')
        return rc; /* keep the entry's own message */
    return tg_err_set(err, errlen, rc, "CUDA %s of layer %d failed (%s)",
                      what, layer, tg_strerror(rc));
}

#define STREAM(c) ((cudaStream_t)(c)->stream)

static size_t align256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

/* ---- sizes ------------------------------------------------------------- */

struct sizes {
    size_t weights;      /* bytes of the weight slab */
    size_t act;          /* activations, workspaces, tables (device) */
    size_t pinned;       /* host staging */
};

static size_t weight_bytes(const struct gw_model *m, int lm_rows)
{
    size_t H = (size_t)m->hidden, d = (size_t)m->head_dim;
    size_t qd = (size_t)m->n_q_heads * d, kd = (size_t)m->n_kv_heads * d;
    size_t F = (size_t)m->ffn, b = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const struct gw_layer *w = &m->layers[l];
        b += align256(H * 2) * 2;                       /* norms */
        b += align256(qd * H * 2) + 2 * align256(kd * H * 2);
        if (w->bq != NULL)
            b += align256(qd * 2) + 2 * align256(kd * 2);
        if (w->q_norm != NULL)
            b += 2 * align256(d * 2);
        b += align256(H * qd * 2);                      /* wo */
        if (w->bo != NULL)
            b += align256(H * 4);
        b += align256(2 * F * H * 2) + align256(H * F * 2);
    }
    b += align256((size_t)m->vocab * H * 2);            /* embed */
    b += align256(H * 2);                               /* final norm */
    if (!(m->tied && m->world == 1))
        b += align256((size_t)lm_rows * H * 2);
    b += align256(d / 2 * 4);                           /* inv_freq */
    return b;
}

/* Vocabulary rows of the LM head on this rank (gw_model_vocab_slice,
 * Megatron's vocab-parallel output layer): the device copy is padded to
 * Vp = ceil(V/T) rows so every rank's part of the all-gather has one size;
 * with one rank Vp = V. */
static int lm_rows_padded(const struct gw_model *m)
{
    int first, count, vp;
    gw_model_vocab_slice(m, &first, &count, &vp);
    return vp;
}

static int lm_rows_held(const struct gw_model *m)
{
    int first, count, vp;
    gw_model_vocab_slice(m, &first, &count, &vp);
    return count;
}

/* ---- allocation helpers ------------------------------------------------ */

static int dalloc(void **p, size_t bytes, const char *what, char *err,
                  size_t errlen)
{
    cudaError_t e = cudaMalloc(p, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return tg_err_set(err, errlen, e == cudaErrorMemoryAllocation
                                           ? TG_ENOMEM : TG_EDEVICE,
                          "cudaMalloc of %zu bytes for %s: %s", bytes, what,
                          cudaGetErrorString(e));
    }
    return 0;
}

static int halloc(void **p, size_t bytes, const char *what, char *err,
                  size_t errlen)
{
    cudaError_t e = cudaMallocHost(p, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "cudaMallocHost of %zu pinned bytes for %s: %s",
                          bytes, what, cudaGetErrorString(e));
    }
    return 0;
}

#define DALLOC(field, bytes, what)                                          \
    do {                                                                    \
        int rc__ = dalloc((void **)&(field), (bytes), (what), err, errlen); \
        if (rc__ != 0)                                                      \
            return rc__;                                                    \
    } while (0)
#define HALLOC(field, bytes, what)                                          \
    do {                                                                    \
        int rc__ = halloc((void **)&(field), (bytes), (what), err, errlen); \
        if (rc__ != 0)                                                      \
            return rc__;                                                    \
    } while (0)

/* ---- weight upload ----------------------------------------------------- */

/* Carves tensors from the slab and fills them through a pinned bounce
 * buffer, converting fp32 to bf16 (round to nearest even) on the host. */
struct uploader {
    char *base;         /* device slab */
    size_t off, cap;
    uint16_t *bounce;   /* pinned, bounce_elems */
    size_t bounce_elems;
    cudaStream_t stream;
};

/* Carves one bf16 tensor of na + nb elements (b may be NULL with nb 0):
 * the elements of a, then those of b, then zeros up to n_total. */
static int up_cat(struct uploader *u, const float *a, size_t na,
                  const float *b, size_t nb, size_t n_total, uint16_t **dst,
                  char *err, size_t errlen)
{
    size_t bytes = align256(n_total * 2);
    if (na + nb > n_total || u->off + bytes > u->cap)
        return tg_err_set(err, errlen, TG_EINVAL, "weight slab overflow");
    *dst = (uint16_t *)(u->base + u->off);
    u->off += bytes;
    for (size_t i = 0; i < n_total; i += u->bounce_elems) {
        size_t m = n_total - i < u->bounce_elems ? n_total - i : u->bounce_elems;
        for (size_t j = 0; j < m; j++) {
            size_t e = i + j;
            float x = e < na ? a[e] : e < na + nb ? b[e - na] : 0.0f;
            u->bounce[j] = st_f32_to_bf16(x);
        }
        CU(cudaMemcpyAsync(*dst + i, u->bounce, m * 2, cudaMemcpyHostToDevice,
                           u->stream));
        CU(cudaStreamSynchronize(u->stream)); /* the bounce is reused */
    }
    return 0;
}

static int up_bf16(struct uploader *u, const float *src, size_t n,
                   uint16_t **dst, char *err, size_t errlen)
{
    return up_cat(u, src, n, NULL, 0, n, dst, err, errlen);
}

static int up_f32(struct uploader *u, const float *src, size_t n, float **dst,
                  char *err, size_t errlen)
{
    size_t bytes = align256(n * 4);
    if (u->off + bytes > u->cap)
        return tg_err_set(err, errlen, TG_EINVAL, "weight slab overflow");
    *dst = (float *)(u->base + u->off);
    u->off += bytes;
    CU(cudaMemcpy(*dst, src, n * 4, cudaMemcpyHostToDevice));
    return 0;
}

static int upload_weights(struct gw_cuda *c, size_t slab_bytes, char *err,
                          size_t errlen)
{
    const struct gw_model *m = c->model;
    size_t H = (size_t)m->hidden, d = (size_t)m->head_dim;
    size_t qd = (size_t)m->n_q_heads * d, kd = (size_t)m->n_kv_heads * d;
    size_t F = (size_t)m->ffn;
    struct uploader u = {.cap = slab_bytes, .bounce_elems = (size_t)8 << 20,
                         .stream = STREAM(c)};
    DALLOC(c->wslab, slab_bytes, "weights");
    u.base = c->wslab;
    HALLOC(u.bounce, u.bounce_elems * 2, "the weight upload");
    int rc = 0;
    c->layers = calloc((size_t)m->n_layers, sizeof(*c->layers));
    if (c->layers == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
        goto out;
    }
    for (int l = 0; l < m->n_layers && rc == 0; l++) {
        const struct gw_layer *w = &m->layers[l];
        struct gw_cuda_layer *g = &c->layers[l];
        if ((rc = up_bf16(&u, w->attn_norm, H, &g->attn_norm, err, errlen)) ||
            (rc = up_bf16(&u, w->wq, qd * H, &g->wq, err, errlen)) ||
            (rc = up_bf16(&u, w->wk, kd * H, &g->wk, err, errlen)) ||
            (rc = up_bf16(&u, w->wv, kd * H, &g->wv, err, errlen)))
            break;
        if (w->bq != NULL &&
            ((rc = up_bf16(&u, w->bq, qd, &g->bq, err, errlen)) ||
             (rc = up_bf16(&u, w->bk, kd, &g->bk, err, errlen)) ||
             (rc = up_bf16(&u, w->bv, kd, &g->bv, err, errlen))))
            break;
        if (w->q_norm != NULL &&
            ((rc = up_bf16(&u, w->q_norm, d, &g->q_norm, err, errlen)) ||
             (rc = up_bf16(&u, w->k_norm, d, &g->k_norm, err, errlen))))
            break;
        if ((rc = up_bf16(&u, w->wo, H * qd, &g->wo, err, errlen)))
            break;
        if (w->bo != NULL && (rc = up_f32(&u, w->bo, H, &g->bo, err, errlen)))
            break;
        if ((rc = up_bf16(&u, w->ffn_norm, H, &g->ffn_norm, err, errlen)))
            break;
        /* gate rows then up rows: one (2F, hidden) GEMM operand */
        if ((rc = up_cat(&u, w->w_gate, F * H, w->w_up, F * H, 2 * F * H,
                         &g->w_gu, err, errlen)))
            break;
        if (rc == 0)
            rc = up_bf16(&u, w->w_down, H * F, &g->w_down, err, errlen);
    }
    if (rc != 0)
        goto out;
    if ((rc = up_bf16(&u, m->embed, (size_t)m->vocab * H, &c->embed, err, errlen)) ||
        (rc = up_bf16(&u, m->final_norm, H, &c->final_norm, err, errlen)))
        goto out;
    if (m->tied && m->world == 1) {
        c->lm_head = c->embed;
    } else {
        /* the rank's vocabulary slice, zero rows past the vocabulary */
        size_t have = (size_t)lm_rows_held(m);
        if ((rc = up_cat(&u, m->lm_head, have * H, NULL, 0,
                         (size_t)c->lm_rows * H, &c->lm_head, err, errlen)))
            goto out;
    }
    rc = up_f32(&u, m->inv_freq, d / 2, &c->inv_freq, err, errlen);
out:
    cudaFreeHost(u.bounce);
    return rc;
}

/* ---- init / free ------------------------------------------------------- */

void gw_cuda_free(struct gw_cuda *c)
{
    if (c->stream != NULL)
        cudaStreamSynchronize(STREAM(c));
    for (int i = 0; i < GW_CUDA_MAX_BUCKETS; i++)
        if (c->graph_exec[i] != NULL)
            cudaGraphExecDestroy((cudaGraphExec_t)c->graph_exec[i]);
    if (c->splits != NULL) {
        tg_cuda_split_map_free(c->splits);
        free(c->splits);
    }
    void *dev[] = {c->wslab, c->head_group, c->head_slot, c->pool, c->x,
                   c->part, c->h, c->q, c->att, c->k, c->v, c->gu, c->mlp,
                   c->logits, c->gathered, c->scores, c->idx, c->cmp_ws,
                   c->dec_ws, c->ids_d, c->pos_d, c->tgt_d, c->lp_d,
                   c->fault_d, c->t_indptr, c->t_indices, c->t_npages,
                   c->t_lens};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i] != NULL)
            cudaFree(dev[i]);
    void *pin[] = {c->p_indptr, c->p_indices, c->p_npages, c->p_lens,
                   c->p_ids, c->p_pos, c->p_fault, c->p_logits, c->p_lp};
    for (size_t i = 0; i < sizeof(pin) / sizeof(pin[0]); i++)
        if (pin[i] != NULL)
            cudaFreeHost(pin[i]);
    tg_cuda_gemm_free(c->gemm);
    if (c->stream != NULL)
        cudaStreamDestroy(STREAM(c));
    free(c->layers);
    free(c->lp_host);
    memset(c, 0, sizeof(*c));
}

/* Device bytes of everything but the weights and the pool. */
static size_t act_bytes(const struct gw_cuda *c, int world, size_t *pinned)
{
    const struct gw_model *m = c->model;
    size_t R = (size_t)c->max_rows, H = (size_t)m->hidden;
    size_t qd = (size_t)m->n_q_heads * m->head_dim;
    size_t kd = (size_t)m->n_kv_heads * m->head_dim;
    size_t F = (size_t)m->ffn, LR = (size_t)c->logit_rows;
    size_t C = (size_t)c->opts.max_chunk, Hkv = (size_t)m->n_kv_heads;
    size_t b = 0;
    b += 2 * align256(R * H * 4) + align256(R * H * 2);
    b += 2 * align256(R * qd * 2) + 2 * align256(R * kd * 2);
    b += align256(R * 2 * F * 2) + align256(R * F * 2);
    b += align256(LR * (size_t)c->lm_rows * 4);
    if (world > 1)
        b += align256((size_t)world * LR * (size_t)c->lm_rows * 4);
    b += 2 * align256(Hkv * C * 4);
    b += align256(c->cmp_ws_bytes) + align256(c->dec_ws_bytes);
    b += 3 * align256(R * 4) + align256(GW_CUDA_LP_BLOCK * 4) + 256;
    b += 3 * align256((size_t)(c->cap_rows + 1) * 4) +
         align256((size_t)c->cap_ids * 4);
    b += TG_CUDA_GEMM_WORKSPACE_DEFAULT;
    *pinned = 3 * (size_t)(c->cap_rows + 1) * 4 + (size_t)c->cap_ids * 4 +
              2 * R * 4 + 4 +
              (size_t)(world > 1 ? world : 0) * LR * (size_t)c->lm_rows * 4;
    return b;
}

static int check_shape(const struct gw_model *m, const struct gw_kv_layout *lay,
                       const struct gw_cuda_opts *o, char *err, size_t errlen)
{
    int d = m->head_dim, Hkv = m->n_kv_heads;
    if (d != 64 && d != 128)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports head_dim 64 and 128 (the "
                          "model has %d)", d);
    if (Hkv < 1 || m->n_q_heads % Hkv != 0 || m->n_q_heads / Hkv > 16)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports 1..16 query heads per KV "
                          "head (Hq %d, Hkv %d)", m->n_q_heads, Hkv);
    if (lay->kv.heads_per_group > 16 || Hkv > CMP_MAX_KV_HEADS)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda supports at most 16 heads per group "
                          "and %d KV heads per rank (have %d and %d)",
                          CMP_MAX_KV_HEADS, lay->kv.heads_per_group, Hkv);
    if (o->max_chunk < 1 || o->max_chunk > CMP_MAX_CHUNK)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--prefill-chunk %d: the CUDA backend compresses "
                          "chunks of 1..%d tokens", o->max_chunk,
                          CMP_MAX_CHUNK);
    if (o->max_seqs < 1 || o->splits == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "max_seqs must be >= 1 and a split map given");
    if (m->vocab < 1 || lay->kv.n_layers != m->n_layers ||
        lay->n_kv_heads != Hkv || lay->kv.head_dim != d)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "KV layout does not match the model");
    return 0;
}

static int alloc_runtime(struct gw_cuda *c, int world, char *err,
                         size_t errlen)
{
    const struct gw_model *m = c->model;
    size_t R = (size_t)c->max_rows, H = (size_t)m->hidden;
    size_t qd = (size_t)m->n_q_heads * m->head_dim;
    size_t kd = (size_t)m->n_kv_heads * m->head_dim;
    size_t F = (size_t)m->ffn, LR = (size_t)c->logit_rows;
    size_t C = (size_t)c->opts.max_chunk, Hkv = (size_t)m->n_kv_heads;
    size_t L = (size_t)m->n_layers;
    size_t page_elems = (size_t)kv_layout_page_elems(&c->layout->kv);
    DALLOC(c->pool, ((size_t)c->n_pages + 1) * page_elems * 2, "the KV pool");
    DALLOC(c->x, R * H * 4, "activations");
    DALLOC(c->part, R * H * 4, "activations");
    DALLOC(c->h, R * H * 2, "activations");
    DALLOC(c->q, R * qd * 2, "activations");
    DALLOC(c->att, R * qd * 2, "activations");
    DALLOC(c->k, R * kd * 2, "activations");
    DALLOC(c->v, R * kd * 2, "activations");
    DALLOC(c->gu, R * 2 * F * 2, "activations");
    DALLOC(c->mlp, R * F * 2, "activations");
    DALLOC(c->logits, LR * (size_t)c->lm_rows * 4, "logits");
    if (world > 1) {
        DALLOC(c->gathered, (size_t)world * LR * (size_t)c->lm_rows * 4,
               "gathered logits");
        HALLOC(c->p_logits, (size_t)world * LR * (size_t)c->lm_rows * 4,
               "gathered logits");
    }
    DALLOC(c->scores, Hkv * C * 4, "chunk scores");
    DALLOC(c->idx, Hkv * C * 4, "chunk selections");
    DALLOC(c->cmp_ws, c->cmp_ws_bytes, "the scoring workspace");
    if (c->dec_ws_bytes > 0)
        DALLOC(c->dec_ws, c->dec_ws_bytes, "decode split partials");
    DALLOC(c->ids_d, R * 4, "token ids");
    DALLOC(c->pos_d, R * 4, "positions");
    DALLOC(c->tgt_d, R * 4, "targets");
    DALLOC(c->lp_d, GW_CUDA_LP_BLOCK * 4, "log-probabilities");
    DALLOC(c->fault_d, 4, "the fault flag");
    DALLOC(c->t_indptr, (size_t)(c->cap_rows + 1) * 4, "the block table");
    DALLOC(c->t_npages, (size_t)(c->cap_rows + 1) * 4, "the block table");
    DALLOC(c->t_lens, (size_t)(c->cap_rows + 1) * 4, "the block table");
    DALLOC(c->t_indices, (size_t)c->cap_ids * 4, "the block table");
    HALLOC(c->p_indptr, (size_t)(c->cap_rows + 1) * 4, "the block table");
    HALLOC(c->p_npages, (size_t)(c->cap_rows + 1) * 4, "the block table");
    HALLOC(c->p_lens, (size_t)(c->cap_rows + 1) * 4, "the block table");
    HALLOC(c->p_indices, (size_t)c->cap_ids * 4, "the block table");
    HALLOC(c->p_ids, R * 4, "token ids");
    HALLOC(c->p_pos, R * 4, "positions");
    HALLOC(c->p_fault, 4, "the fault flag");
    HALLOC(c->p_lp, GW_CUDA_LP_BLOCK * 4, "log-probabilities");
    /* head maps (L, Hkv) */
    DALLOC(c->head_group, L * Hkv * 4, "head maps");
    DALLOC(c->head_slot, L * Hkv * 4, "head maps");
    CU(cudaMemcpy(c->head_group, c->layout->head_group, L * Hkv * 4,
                  cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->head_slot, c->layout->head_slot, L * Hkv * 4,
                  cudaMemcpyHostToDevice));
    CU(cudaMemset(c->pool, 0, ((size_t)c->n_pages + 1) * page_elems * 2));
    return 0;
}

int gw_cuda_init(struct gw_cuda *c, const struct gw_model *model,
                 const struct gw_kv_layout *layout,
                 const struct gw_cuda_opts *opts, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    int rc = check_shape(model, layout, opts, err, errlen);
    if (rc != 0)
        return rc;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        cudaGetLastError();
        return tg_err_set(err, errlen, TG_ENODEV,
                          "--backend cuda: no CUDA device is usable here "
                          "(no NVIDIA driver or no GPU)");
    }
    if (opts->device < 0 || opts->device >= ndev)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "CUDA device %d does not exist (%d present)",
                          opts->device, ndev);
    c->model = model;
    c->layout = layout;
    c->opts = *opts;
    c->opts.splits = NULL; /* not kept: uploaded below */
    CU(cudaSetDevice(opts->device));
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    c->stream = st;

    int world = model->world > 1 ? model->world : 1;
    int LG = model->n_layers * layout->kv.n_groups;
    c->max_rows = opts->max_chunk > opts->max_seqs ? opts->max_chunk : opts->max_seqs;
    c->logit_rows = opts->max_seqs > GW_CUDA_LP_BLOCK ? opts->max_seqs : GW_CUDA_LP_BLOCK;
    c->lm_rows = lm_rows_padded(model);
    c->cap_rows = (int64_t)opts->max_seqs * LG;
    int G = model->n_q_heads / model->n_kv_heads;
    c->cmp_ws_bytes = cmp_qa_workspace_bytes(opts->method, opts->max_chunk,
                                             model->n_q_heads,
                                             model->n_kv_heads,
                                             model->head_dim,
                                             layout->kv.rule.window);
    if (c->cmp_ws_bytes == 0)
        c->cmp_ws_bytes = 256;

    /* split map: device offsets, and the decode workspace for its max */
    c->splits = calloc(1, sizeof(*c->splits));
    if (c->splits == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
        goto fail;
    }
    rc = tg_cuda_split_map_init(c->splits, opts->splits, model->n_layers,
                                layout->kv.n_groups, err, errlen);
    if (rc != 0)
        goto fail;
    int max_split = 1;
    for (int l = 0; l < model->n_layers; l++)
        if (c->splits->max[l] > max_split)
            max_split = c->splits->max[l];
    c->dec_ws_bytes = tg_cuda_decode_attn_ws_bytes(opts->max_seqs,
                                                   model->n_q_heads,
                                                   model->head_dim, max_split);
    (void)G;

    /* memory plan against what the device has free now */
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        rc = tg_err_set(err, errlen, TG_EDEVICE, "cudaMemGetInfo failed");
        goto fail;
    }
    struct cudaDeviceProp prop;
    char where[320];
    if (cudaGetDeviceProperties(&prop, opts->device) == cudaSuccess)
        snprintf(where, sizeof(where), "GPU %d (%s)", opts->device, prop.name);
    else
        snprintf(where, sizeof(where), "GPU %d", opts->device);
    size_t page_bytes = (size_t)kv_layout_page_elems(&layout->kv) * 2;
    /* the pool's page ids are < the pool: an upper bound of the ids one
     * call's table holds, plus one scratch id per padded row */
    size_t slab = weight_bytes(model, c->lm_rows);
    struct gw_mem_need need = {
        .weights = slab,
        .reserve = opts->reserve_bytes > 0 ? opts->reserve_bytes
                                           : ((uint64_t)1 << 30),
        .page_bytes = page_bytes,
    };
    /* activations depend on cap_ids, which depends on the pool: plan with
     * the table bound of the pool the bytes would give, then re-plan */
    c->cap_ids = c->cap_rows;
    for (int pass = 0; pass < 2; pass++) {
        size_t pinned = 0;
        need.activations = act_bytes(c, world, &pinned) + page_bytes;
        rc = gw_mem_plan(&c->mem, &need, opts->kv_pages, &opts->kv_memory,
                         free_b, total_b, where, err, errlen);
        if (rc != 0)
            goto fail;
        c->cap_ids = c->mem.pages + c->cap_rows;
    }
    c->n_pages = (int32_t)c->mem.pages;

    rc = tg_cuda_gemm_new(0, &c->gemm, err, errlen);
    if (rc == 0)
        rc = upload_weights(c, slab, err, errlen);
    if (rc == 0)
        rc = alloc_runtime(c, world, err, errlen);
    if (rc != 0)
        goto fail;
    c->n_buckets = gw_cuda_buckets(opts->max_seqs, c->bucket,
                                   GW_CUDA_MAX_BUCKETS);
    /* the pool's memset and the uploads ran on the legacy stream, which a
     * non-blocking stream does not wait for */
    if (cudaDeviceSynchronize() != cudaSuccess) {
        rc = tg_err_set(err, errlen, TG_EDEVICE, "cudaDeviceSynchronize: %s",
                        cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    return 0;
fail:
    gw_cuda_free(c);
    return rc;
}

/* ---- block tables ------------------------------------------------------ */

/* Appends the rows of `seq` (L * n_groups, layer-major) to the pinned
 * table at row r0 / id slot *at, with lens plus `add` tokens. */
static int table_put_seq(struct gw_cuda *c, const struct gw_seq *seq,
                         int64_t r0, int64_t *at, int add, char *err,
                         size_t errlen)
{
    int LG = c->model->n_layers * c->layout->kv.n_groups;
    for (int r = 0; r < LG; r++) {
        int32_t np = seq->n_pages[r];
        if (np < 0 || *at + np > c->cap_ids)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "block table overflow (%lld ids, capacity %lld)",
                              (long long)(*at + np), (long long)c->cap_ids);
        c->p_indptr[r0 + r] = (int32_t)*at;
        c->p_npages[r0 + r] = np;
        c->p_lens[r0 + r] = seq->len[r] + add;
        const int32_t *pg = seq->pages[r];
        for (int32_t i = 0; i < np; i++) {
            if (pg[i] < 0 || pg[i] >= c->n_pages)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "page id %d outside the pool [0, %d)",
                                  pg[i], c->n_pages);
            c->p_indices[*at + i] = pg[i];
        }
        *at += np;
    }
    return 0;
}

/* A padding sequence: every row one token on the scratch page. */
static void table_put_pad(struct gw_cuda *c, int64_t r0, int64_t *at)
{
    int LG = c->model->n_layers * c->layout->kv.n_groups;
    for (int r = 0; r < LG; r++) {
        c->p_indptr[r0 + r] = (int32_t)*at;
        c->p_npages[r0 + r] = 1;
        c->p_lens[r0 + r] = 1;
        c->p_indices[(*at)++] = c->n_pages; /* the scratch page */
    }
}

static int table_upload(struct gw_cuda *c, int64_t rows, int64_t ids,
                        char *err, size_t errlen)
{
    c->p_indptr[rows] = (int32_t)ids;
    cudaStream_t st = STREAM(c);
    CU(cudaMemcpyAsync(c->t_indptr, c->p_indptr, (size_t)(rows + 1) * 4,
                       cudaMemcpyHostToDevice, st));
    CU(cudaMemcpyAsync(c->t_npages, c->p_npages, (size_t)rows * 4,
                       cudaMemcpyHostToDevice, st));
    CU(cudaMemcpyAsync(c->t_lens, c->p_lens, (size_t)rows * 4,
                       cudaMemcpyHostToDevice, st));
    if (ids > 0)
        CU(cudaMemcpyAsync(c->t_indices, c->p_indices, (size_t)ids * 4,
                           cudaMemcpyHostToDevice, st));
    return 0;
}

/* ---- layer pieces ------------------------------------------------------ */

static int allreduce(struct gw_cuda *c, size_t n, int l, const char *what,
                     char *err, size_t errlen)
{
    if (c->model->world <= 1)
        return 0;
    if (c->opts.nccl == NULL)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "rank %d of %d has not joined its NCCL group",
                          c->model->rank, c->model->world);
    int rc = tg_nccl_allreduce_sum(c->opts.nccl, c->part, n, 0, c->stream,
                                   err, errlen);
    if (rc != 0)
        return tg_err_set(err, errlen, rc,
                          "all-reduce after %s of layer %d failed (%s): a "
                          "tensor-parallel peer is gone or out of step",
                          what, l, tg_strerror(rc));
    return 0;
}

/* Norm (adding the previous block's partial sum from layer 1 on), Q/K/V
 * and RoPE with the fused q/k norm for m rows of layer l. */
static int layer_qkv(struct gw_cuda *c, int l, int m, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_cuda_layer *w = &c->layers[l];
    int d = md->head_dim, H = md->hidden;
    void *st = c->stream;
    OP(ew_rmsnorm(c->x, EW_DTYPE_F32, l > 0 ? c->part : NULL, EW_DTYPE_F32,
                  w->attn_norm, m, H, md->norm_eps, c->h, EW_DTYPE_BF16, st),
       "attention norm", l);
    OP(tg_cuda_gemm_bf16(c->gemm, c->h, w->wq, w->bq, m, md->n_q_heads * d, H,
                         c->q, TG_CUDA_GEMM_BF16, st), "q_proj", l);
    OP(tg_cuda_gemm_bf16(c->gemm, c->h, w->wk, w->bk, m, md->n_kv_heads * d, H,
                         c->k, TG_CUDA_GEMM_BF16, st), "k_proj", l);
    OP(tg_cuda_gemm_bf16(c->gemm, c->h, w->wv, w->bv, m, md->n_kv_heads * d, H,
                         c->v, TG_CUDA_GEMM_BF16, st), "v_proj", l);
    OP(ew_rope(c->q, EW_DTYPE_BF16, m, md->n_q_heads, d,
               (int64_t)md->n_q_heads * d, c->pos_d, c->inv_freq, w->q_norm,
               md->norm_eps, st), "q rope", l);
    OP(ew_rope(c->k, EW_DTYPE_BF16, m, md->n_kv_heads, d,
               (int64_t)md->n_kv_heads * d, c->pos_d, c->inv_freq, w->k_norm,
               md->norm_eps, st), "k rope", l);
    return 0;
}

/* o_proj (fp32 partial, all-reduced), residual + FFN norm, and the SwiGLU
 * MLP whose down_proj partial is left in c->part for the next norm. */
static int layer_out_mlp(struct gw_cuda *c, int l, int m, char *err,
                         size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_cuda_layer *w = &c->layers[l];
    int H = md->hidden, F = md->ffn;
    void *st = c->stream;
    size_t hm = (size_t)m * (size_t)H;
    OP(tg_cuda_gemm_bf16(c->gemm, c->att, w->wo, w->bo, m, H,
                         md->n_q_heads * md->head_dim, c->part,
                         TG_CUDA_GEMM_F32, st), "o_proj", l);
    int rc = allreduce(c, hm, l, "o_proj", err, errlen);
    if (rc != 0)
        return rc;
    OP(ew_rmsnorm(c->x, EW_DTYPE_F32, c->part, EW_DTYPE_F32, w->ffn_norm, m,
                  H, md->norm_eps, c->h, EW_DTYPE_BF16, st), "ffn norm", l);
    OP(tg_cuda_gemm_bf16(c->gemm, c->h, w->w_gu, NULL, m, 2 * F, H, c->gu,
                         TG_CUDA_GEMM_BF16, st), "gate/up_proj", l);
    OP(ew_silu_mul(c->gu, c->gu + F, EW_DTYPE_BF16, m, F, 2 * (int64_t)F,
                   c->mlp, EW_DTYPE_BF16, F, st), "silu_mul", l);
    OP(tg_cuda_gemm_bf16(c->gemm, c->mlp, w->w_down, NULL, m, H, F, c->part,
                         TG_CUDA_GEMM_F32, st), "down_proj", l);
    return allreduce(c, hm, l, "down_proj", err, errlen);
}

/* The last block's residual add and the final norm of m rows into c->h. */
static int final_norm(struct gw_cuda *c, int m, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    OP(ew_rmsnorm(c->x, EW_DTYPE_F32, c->part, EW_DTYPE_F32, c->final_norm, m,
                  md->hidden, md->norm_eps, c->h, EW_DTYPE_BF16, c->stream),
       "final norm", md->n_layers);
    return 0;
}

/* LM head of m rows of c->h starting at row `first`: c->logits (m,
 * lm_rows), and with T > 1 the all-gather into c->gathered (T, m,
 * lm_rows). Enqueued only (capturable). */
static int lm_head(struct gw_cuda *c, int first, int m, char *err,
                   size_t errlen)
{
    const struct gw_model *md = c->model;
    const uint16_t *h = c->h + (size_t)first * (size_t)md->hidden;
    OP(tg_cuda_gemm_bf16(c->gemm, h, c->lm_head, NULL, m, c->lm_rows,
                         md->hidden, c->logits, TG_CUDA_GEMM_F32, c->stream),
       "lm_head", md->n_layers);
    if (md->world > 1) {
        if (c->opts.nccl == NULL)
            return tg_err_set(err, errlen, TG_EPROTO,
                              "rank %d of %d has not joined its NCCL group",
                              md->rank, md->world);
        int rc = tg_nccl_allgather(c->opts.nccl, c->logits, c->gathered,
                                   (size_t)m * (size_t)c->lm_rows, 0,
                                   c->stream, err, errlen);
        if (rc != 0)
            return tg_err_set(err, errlen, rc,
                              "all-gather of the logits failed (%s)",
                              tg_strerror(rc));
    }
    return 0;
}

/* Copies the first m of the `rows` rows of logits lm_head produced to
 * host `out` (m, V) and synchronises. With T > 1 the gathered (T, rows,
 * Vp) slices are reordered (rank r's column j is vocabulary id
 * r * Vp + j). */
static int logits_to_host(struct gw_cuda *c, int rows, int m, float *out,
                          char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    size_t V = (size_t)md->vocab, Vp = (size_t)c->lm_rows;
    cudaStream_t st = STREAM(c);
    if (md->world <= 1) {
        CU(cudaMemcpyAsync(out, c->logits, (size_t)m * V * 4,
                           cudaMemcpyDeviceToHost, st));
        CU(cudaStreamSynchronize(st));
        return 0;
    }
    size_t T = (size_t)md->world;
    CU(cudaMemcpyAsync(c->p_logits, c->gathered, T * (size_t)rows * Vp * 4,
                       cudaMemcpyDeviceToHost, st));
    CU(cudaStreamSynchronize(st));
    for (size_t r = 0; r < T; r++) {
        size_t lo = r * Vp;
        if (lo >= V)
            break;
        size_t cols = V - lo < Vp ? V - lo : Vp;
        for (size_t i = 0; i < (size_t)m; i++)
            memcpy(out + i * V + lo, c->p_logits + (r * (size_t)rows + i) * Vp,
                   cols * 4);
    }
    return 0;
}

/* Synchronises and turns a set fault flag into an error. */
static int finish(struct gw_cuda *c, char *err, size_t errlen)
{
    cudaStream_t st = STREAM(c);
    CU(cudaMemcpyAsync(c->p_fault, c->fault_d, 4, cudaMemcpyDeviceToHost, st));
    CU(cudaStreamSynchronize(st));
    if (*c->p_fault != 0)
        return tg_err_set(err, errlen, TG_EDEVICE,
                          "a KV append found no page for a kept token (the "
                          "block table and the row lengths disagree)");
    return 0;
}

/* ---- prefill ----------------------------------------------------------- */

static int room(const struct gw_cuda *c, const struct gw_seq *seq, int l,
                const int32_t *add, char *err, size_t errlen)
{
    const struct gw_kv_layout *lay = c->layout;
    size_t base = (size_t)l * (size_t)lay->kv.n_groups;
    for (int g = 0; g < lay->kv.n_groups; g++) {
        int64_t need = kv_pages_for((int64_t)seq->len[base + g] + add[g],
                                    lay->kv.page_size);
        if (need > seq->n_pages[base + g])
            return tg_err_set(err, errlen, TG_ENOSPC,
                              "layer %d group %d needs %lld pages, holds %d", l,
                              g, (long long)need, seq->n_pages[base + g]);
    }
    return 0;
}

static int check_ids(const struct gw_cuda *c, const int32_t *ids, int n,
                     char *err, size_t errlen)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->model->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "token id %d outside the vocabulary [0, %d)",
                              ids[i], c->model->vocab);
    return 0;
}

/* Chunk compression of layer l (§4.3 steps 3-5): keep[h] per head; all
 * kept -> plain append; else score, select, append the selection. */
static int layer_compress(struct gw_cuda *c, int l, int n, int64_t start,
                          int forced, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_kv_layout *lay = c->layout;
    int G = lay->kv.n_groups, Hkv = md->n_kv_heads;
    const int32_t *hg = lay->head_group + (size_t)l * (size_t)Hkv;
    const int32_t *hs = lay->head_slot + (size_t)l * (size_t)Hkv;
    int32_t keep[CMP_MAX_KV_HEADS];
    int all = 1;
    for (int h = 0; h < Hkv; h++) {
        double b = lay->kv.group_budget[(size_t)l * (size_t)G + (size_t)hg[h]];
        keep[h] = (int32_t)kv_chunk_keep(n, b, forced);
        all &= keep[h] == n;
    }
    size_t r0 = (size_t)l * (size_t)G;
    struct cmp_dst dst = {
        .pool = c->pool,
        .n_pages = (int64_t)c->n_pages,
        .heads_per_group = lay->kv.heads_per_group,
        .page_size = lay->kv.page_size,
        .head_dim = md->head_dim,
        .n_kv_heads = Hkv,
        .n_groups = G,
        .head_group = hg,
        .head_slot = hs,
        .indptr = c->t_indptr + r0,
        .indices = c->t_indices,
        .npages = c->t_npages + r0,
        .lens = c->t_lens + r0,
        .fault = c->fault_d,
    };
    if (all) {
        OP(cmp_kv_append(&dst, c->k, c->v, n, NULL, keep, c->stream),
           "KV append", l);
        return 0;
    }
    struct cmp_chunk ch = {
        .q = c->q, .k = c->k, .v = c->v, .n = n,
        .n_q_heads = md->n_q_heads, .n_kv_heads = Hkv,
        .head_dim = md->head_dim, .start = start,
        .window = lay->kv.rule.window, .n_sink = lay->kv.rule.n_sink,
        .scale = 1.0f / sqrtf((float)md->head_dim),
    };
    OP(cmp_score(c->opts.method, &ch, c->scores, c->cmp_ws, c->cmp_ws_bytes,
                 c->stream), "key scoring", l);
    OP(cmp_select_topk(c->scores, n, Hkv, keep, start, lay->kv.rule.window,
                       lay->kv.rule.n_sink, c->idx, c->stream),
       "top-k selection", l);
    OP(cmp_kv_append(&dst, c->k, c->v, n, c->idx, keep, c->stream),
       "KV append", l);
    return 0;
}

/* log_softmax(row)[t] in double on the host (the T > 1 prompt path). */
static float host_logprob(const float *row, int V, int t)
{
    float mx = row[0];
    for (int j = 1; j < V; j++)
        mx = row[j] > mx ? row[j] : mx;
    double s = 0.0;
    for (int j = 0; j < V; j++)
        s += exp((double)row[j] - (double)mx);
    return (float)((double)row[t] - (double)mx - log(s));
}

/* Prompt log-probabilities of a finished chunk of n rows (c->h holds the
 * final-normed rows), GW_CUDA_LP_BLOCK rows per LM-head GEMM. Blocks
 * without a target are skipped on every rank alike (the targets are the
 * same everywhere); results go to out->lp on rank 0. */
static int prompt_lp(struct gw_cuda *c, int n, const struct gw_prefill_out *out,
                     char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    int V = md->vocab, rank0 = md->rank == 0;
    const int32_t *tg = out->lp_targets;
    cudaStream_t st = STREAM(c);
    CU(cudaStreamSynchronize(st)); /* p_pos / p_ids are free again */
    for (int i0 = 0; i0 < n; i0 += GW_CUDA_LP_BLOCK) {
        int m = n - i0 < GW_CUDA_LP_BLOCK ? n - i0 : GW_CUDA_LP_BLOCK;
        int any = 0;
        for (int i = 0; i < m; i++)
            any |= tg[i0 + i] >= 0;
        if (!any)
            continue;
        int rc = lm_head(c, i0, m, err, errlen);
        if (rc != 0)
            return rc;
        if (!rank0) {
            CU(cudaStreamSynchronize(st));
        } else if (md->world <= 1) {
            for (int i = 0; i < m; i++)
                c->p_pos[i] = tg[i0 + i] >= 0 ? tg[i0 + i] : 0;
            CU(cudaMemcpyAsync(c->tgt_d, c->p_pos, (size_t)m * 4,
                               cudaMemcpyHostToDevice, st));
            OP(tg_cuda_logprobs(c->logits, m, V, c->tgt_d, c->lp_d, st),
               "prompt logprobs", md->n_layers);
            CU(cudaMemcpyAsync(c->p_lp, c->lp_d, (size_t)m * 4,
                               cudaMemcpyDeviceToHost, st));
            CU(cudaStreamSynchronize(st));
            for (int i = 0; i < m; i++)
                if (tg[i0 + i] >= 0)
                    out->lp[i0 + i] = c->p_lp[i];
        } else {
            /* the gathered slices are reordered on the host anyway */
            if (c->lp_host == NULL &&
                (c->lp_host = malloc((size_t)GW_CUDA_LP_BLOCK * (size_t)V * 4)) == NULL)
                return tg_err_set(err, errlen, TG_ENOMEM, "out of host memory");
            rc = logits_to_host(c, m, m, c->lp_host, err, errlen);
            if (rc != 0)
                return rc;
            for (int i = 0; i < m; i++)
                if (tg[i0 + i] >= 0)
                    out->lp[i0 + i] = host_logprob(c->lp_host + (size_t)i * V,
                                                   V, tg[i0 + i]);
        }
    }
    return 0;
}

int gw_cuda_prefill(struct gw_cuda *c, struct gw_seq *seq, const int32_t *ids,
                    int n, const struct gw_prefill_out *out, char *err,
                    size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_kv_layout *lay = c->layout;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (n <= 0 || n > c->opts.max_chunk)
        return tg_err_set(err, errlen, TG_EINVAL, "chunk of %d tokens (max %d)",
                          n, c->opts.max_chunk);
    int rc = check_ids(c, ids, n, err, errlen);
    if (rc != 0)
        return rc;
    int want_last = out != NULL && out->want_logits;
    int want_lp = out != NULL && out->lp_targets != NULL;
    if (md->rank == 0 && ((want_last && out->last_logits == NULL) ||
                          (want_lp && out->lp == NULL)))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank 0 needs the output buffers it asks for");
    int64_t start = seq->pos;
    int forced = (int)kv_chunk_forced(start, n, &lay->kv.rule);
    int32_t addp[GW_MAX_GROUPS];
    for (int l = 0; l < lay->kv.n_layers; l++) {
        for (int g = 0; g < lay->kv.n_groups; g++)
            addp[g] = (int32_t)kv_chunk_keep(
                n, lay->kv.group_budget[(size_t)l * lay->kv.n_groups + g], forced);
        if ((rc = room(c, seq, l, addp, err, errlen)) != 0)
            return rc;
    }
    cudaStream_t st = STREAM(c);
    CU(cudaStreamSynchronize(st)); /* the pinned staging is ours again */
    for (int i = 0; i < n; i++) {
        c->p_ids[i] = ids[i];
        c->p_pos[i] = (int32_t)(start + i);
    }
    int64_t at = 0;
    int LG = md->n_layers * lay->kv.n_groups;
    if ((rc = table_put_seq(c, seq, 0, &at, 0, err, errlen)) != 0 ||
        (rc = table_upload(c, LG, at, err, errlen)) != 0)
        return rc;
    CU(cudaMemcpyAsync(c->ids_d, c->p_ids, (size_t)n * 4, cudaMemcpyHostToDevice, st));
    CU(cudaMemcpyAsync(c->pos_d, c->p_pos, (size_t)n * 4, cudaMemcpyHostToDevice, st));
    CU(cudaMemsetAsync(c->fault_d, 0, 4, st));
    OP(ew_embedding(c->embed, md->vocab, md->hidden, c->ids_d, n, c->x,
                    EW_DTYPE_F32, st), "embedding", 0);
    int G = lay->kv.n_groups;
    for (int l = 0; l < md->n_layers; l++) {
        if ((rc = layer_qkv(c, l, n, err, errlen)) != 0)
            return rc;
        size_t r0 = (size_t)l * (size_t)G;
        struct tg_cuda_prefill_attn_args a = {
            .q = c->q, .k = c->k, .v = c->v, .n = n,
            .n_q_heads = md->n_q_heads, .n_kv_heads = md->n_kv_heads,
            .head_dim = md->head_dim, .pool = c->pool,
            .heads_per_group = lay->kv.heads_per_group,
            .page_size = lay->kv.page_size, .n_groups = G,
            .head_group = c->head_group + (size_t)l * (size_t)md->n_kv_heads,
            .head_slot = c->head_slot + (size_t)l * (size_t)md->n_kv_heads,
            .indptr = c->t_indptr + r0, .indices = c->t_indices,
            .lens = c->t_lens + r0,
            .scale = 1.0f / sqrtf((float)md->head_dim),
            .out = c->att, .stream = c->stream,
        };
        OP(tg_cuda_prefill_attn(&a, err, errlen), "prefill attention", l);
        if ((rc = layer_compress(c, l, n, start, forced, err, errlen)) != 0 ||
            (rc = layer_out_mlp(c, l, n, err, errlen)) != 0)
            return rc;
    }
    if (want_last || want_lp) {
        if ((rc = final_norm(c, n, err, errlen)) != 0)
            return rc;
        if (want_lp && (rc = prompt_lp(c, n, out, err, errlen)) != 0)
            return rc;
        if (want_last) {
            if ((rc = lm_head(c, n - 1, 1, err, errlen)) != 0)
                return rc;
            if (md->rank == 0 &&
                (rc = logits_to_host(c, 1, 1, out->last_logits, err, errlen)) != 0)
                return rc;
        }
    }
    if ((rc = finish(c, err, errlen)) != 0)
        return rc;
    /* the device rows grew: mirror the kept counts on the host */
    for (int l = 0; l < md->n_layers; l++)
        for (int g = 0; g < G; g++)
            seq->len[(size_t)l * G + g] += (int32_t)kv_chunk_keep(
                n, lay->kv.group_budget[(size_t)l * G + g], forced);
    seq->pos += n;
    (void)LG;
    return 0;
}

/* ---- decode ------------------------------------------------------------ */

/* The whole decode step of B (padded) sequences from the device inputs
 * (ids_d, pos_d, the table): embedding, every layer, final norm and LM
 * head. Only enqueues work on the stream, so it can be captured. */
static int decode_body(struct gw_cuda *c, int B, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_kv_layout *lay = c->layout;
    int G = lay->kv.n_groups, LG = md->n_layers * G, Hkv = md->n_kv_heads;
    int rc;
    OP(ew_embedding(c->embed, md->vocab, md->hidden, c->ids_d, B, c->x,
                    EW_DTYPE_F32, c->stream), "embedding", 0);
    for (int l = 0; l < md->n_layers; l++) {
        if ((rc = layer_qkv(c, l, B, err, errlen)) != 0)
            return rc;
        struct tg_cuda_kv_csr tab = {
            .indptr = c->t_indptr, .indices = c->t_indices,
            .lens = c->t_lens, .n_rows = (int32_t)B * LG,
            .row_stride = LG, .row_offset = l * G,
        };
        const int32_t *hg = c->head_group + (size_t)l * (size_t)Hkv;
        const int32_t *hs = c->head_slot + (size_t)l * (size_t)Hkv;
        struct tg_cuda_decode_append_args ap = {
            .k = c->k, .v = c->v, .n_seq = B, .n_kv_heads = Hkv,
            .head_dim = md->head_dim,
            .heads_per_group = lay->kv.heads_per_group,
            .page_size = lay->kv.page_size, .pool = c->pool,
            .n_pages = (int64_t)c->n_pages + 1, /* + the scratch page */
            .head_group = hg, .head_slot = hs, .table = tab,
            .fault = c->fault_d, .stream = c->stream,
        };
        OP(tg_cuda_decode_append(&ap, err, errlen), "decode KV append", l);
        struct tg_cuda_decode_attn_args at = {
            .q = c->q, .pool = c->pool, .n_seq = B,
            .n_q_heads = md->n_q_heads, .n_kv_heads = Hkv, .n_groups = G,
            .heads_per_group = lay->kv.heads_per_group,
            .page_size = lay->kv.page_size, .head_dim = md->head_dim,
            .head_group = hg, .head_slot = hs, .table = tab,
            .splits = c->splits, .layer = l,
            .scale = 1.0f / sqrtf((float)md->head_dim),
            .ws = c->dec_ws, .ws_bytes = c->dec_ws_bytes, .out = c->att,
            .out_dtype = TG_CUDA_DECODE_OUT_BF16, .stream = c->stream,
        };
        OP(tg_cuda_decode_attn(&at, err, errlen), "decode attention", l);
        if ((rc = layer_out_mlp(c, l, B, err, errlen)) != 0)
            return rc;
    }
    if ((rc = final_norm(c, B, err, errlen)) != 0)
        return rc;
    return lm_head(c, 0, B, err, errlen);
}

/* Captures decode_body for bucket bi. A bucket that fails to capture is
 * marked and runs eagerly from then on; the reason stays in graph_error
 * for the worker to log once. */
static void capture(struct gw_cuda *c, int bi)
{
    cudaStream_t st = STREAM(c);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    char why[256] = "";
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        int rc = decode_body(c, c->bucket[bi], why, sizeof(why));
        e = cudaStreamEndCapture(st, &graph);
        if (rc != 0 && why[0] == '\0')
            snprintf(why, sizeof(why), "%s", tg_strerror(rc));
        if (rc != 0 && e == cudaSuccess)
            e = cudaErrorStreamCaptureInvalidated;
    }
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (e != cudaSuccess || exec == NULL) {
        cudaGetLastError(); /* clear the sticky-free error state */
        c->graph_failed[bi] = 1;
        snprintf(c->graph_error, sizeof(c->graph_error),
                 "decode graph of batch %d not captured (%s%s%s); that "
                 "bucket runs eagerly", c->bucket[bi], cudaGetErrorString(e),
                 why[0] ? ": " : "", why);
        return;
    }
    c->graph_exec[bi] = exec;
}

int gw_cuda_decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                   const int32_t *ids, int n_seq, int want_logits,
                   float *logits, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_kv_layout *lay = c->layout;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (n_seq <= 0 || n_seq > c->opts.max_seqs)
        return tg_err_set(err, errlen, TG_EINVAL, "decode batch of %d (max %d)",
                          n_seq, c->opts.max_seqs);
    int rc = check_ids(c, ids, n_seq, err, errlen);
    if (rc != 0)
        return rc;
    if (want_logits && md->rank == 0 && logits == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank 0 needs a logits buffer");
    int32_t one[GW_MAX_GROUPS];
    for (int g = 0; g < lay->kv.n_groups; g++)
        one[g] = 1;
    for (int s = 0; s < n_seq; s++)
        for (int l = 0; l < lay->kv.n_layers; l++)
            if ((rc = room(c, seqs[s], l, one, err, errlen)) != 0)
                return rc;
    int bi = -1, B = n_seq;
    if (c->opts.graphs) {
        bi = gw_cuda_bucket_of(c->bucket, c->n_buckets, n_seq);
        if (bi >= 0)
            B = c->bucket[bi];
    }
    cudaStream_t st = STREAM(c);
    CU(cudaStreamSynchronize(st));
    int LG = md->n_layers * lay->kv.n_groups;
    int64_t at = 0;
    for (int s = 0; s < B; s++) {
        if (s < n_seq) {
            c->p_ids[s] = ids[s];
            c->p_pos[s] = (int32_t)seqs[s]->pos;
            rc = table_put_seq(c, seqs[s], (int64_t)s * LG, &at, 1, err, errlen);
            if (rc != 0)
                return rc;
        } else {
            c->p_ids[s] = 0;
            c->p_pos[s] = 0;
            table_put_pad(c, (int64_t)s * LG, &at);
        }
    }
    if ((rc = table_upload(c, (int64_t)B * LG, at, err, errlen)) != 0)
        return rc;
    CU(cudaMemcpyAsync(c->ids_d, c->p_ids, (size_t)B * 4, cudaMemcpyHostToDevice, st));
    CU(cudaMemcpyAsync(c->pos_d, c->p_pos, (size_t)B * 4, cudaMemcpyHostToDevice, st));
    CU(cudaMemsetAsync(c->fault_d, 0, 4, st));
    if (bi >= 0 && c->graph_exec[bi] != NULL) {
        CU(cudaGraphLaunch((cudaGraphExec_t)c->graph_exec[bi], st));
        c->graph_launches++;
    } else {
        if ((rc = decode_body(c, B, err, errlen)) != 0)
            return rc;
        c->eager_steps++;
    }
    if (want_logits && md->rank == 0 &&
        (rc = logits_to_host(c, B, n_seq, logits, err, errlen)) != 0)
        return rc;
    if ((rc = finish(c, err, errlen)) != 0)
        return rc;
    /* First use of a bucket ran eagerly (settling cuBLASLt's plans and
     * any lazy kernel setup); capture it now for the next steps. Capture
     * records without running, so the step's results stand. */
    if (bi >= 0 && c->graph_exec[bi] == NULL && !c->graph_failed[bi])
        capture(c, bi);
    for (int s = 0; s < n_seq; s++) {
        for (int r = 0; r < LG; r++)
            seqs[s]->len[r] += 1;
        seqs[s]->pos += 1;
    }
    return 0;
}

#endif /* TANGRAM_CUDA */
