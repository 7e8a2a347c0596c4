/* gw_cuda_hooks.c — the calibration hooks of the CUDA forward pass (see
 * gw_cuda.h): a prefill chunk's key scores and its pre-RoPE queries,
 * brought to the host per layer for tangram-profile calibrate --backend
 * cuda. Nothing here runs in a worker (its hooks are NULL). */
#include "gpu_worker/cuda/gw_cuda.h"

#ifdef TANGRAM_CUDA
#include <stdlib.h>
#include <string.h>

#include "gpu_worker/cuda/gw_cuda_internal.h"
#include "kernels/cuda/elementwise.h"

/* The pinned staging and the fp32 host copy, sized for the largest chunk
 * once: (max_chunk, max(Hq * d bf16, Hkv fp32)) bytes. */
static int hook_buffers(struct gw_cuda *c, char *err, size_t errlen)
{
    const struct gw_model *md = c->model;
    size_t C = (size_t)c->opts.max_chunk;
    size_t qd = (size_t)md->n_q_heads * (size_t)md->head_dim;
    size_t q_bytes = C * qd * 2, s_bytes = C * (size_t)md->n_kv_heads * 4;
    size_t want = q_bytes > s_bytes ? q_bytes : s_bytes;
    if (c->p_hook == NULL) {
        TG_TRY(gw_cuda__halloc(&c->p_hook, want, "calibration staging", err,
                               errlen));
        c->p_hook_bytes = want;
    }
    if (c->hook_f32 == NULL && c->opts.on_queries != NULL) {
        c->hook_f32 = malloc(C * qd * sizeof(float));
        if (c->hook_f32 == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM,
                              "out of host memory for %zu calibration "
                              "queries", C * qd);
    }
    return 0;
}

/* bf16 bit pattern to fp32 (the top half of an IEEE binary32). */
static float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

int gw_cuda__on_queries(struct gw_cuda *c, int l, int m, char *err,
                        size_t errlen)
{
    const struct gw_model *md = c->model;
    const struct gw_cuda_layer *w = &c->layers[l];
    int d = md->head_dim, Hq = md->n_q_heads;
    size_t qd = (size_t)Hq * (size_t)d, bytes = (size_t)m * qd * 2;
    cudaStream_t st = STREAM(c);
    TG_TRY(hook_buffers(c, err, errlen));
    const uint16_t *src = c->q;
    if (w->q_norm != NULL) {
        /* The hook sees the normed queries before RoPE; the kernel fuses
         * the two, so a copy is normed and "rotated" at position 0 (angle
         * 0: cos 1, sin 0, the identity). c->att and c->tgt_d are free
         * until this layer's attention and the prompt logprobs. */
        GW_CU_TRY(cudaMemcpyAsync(c->att, c->q, bytes,
                                  cudaMemcpyDeviceToDevice, st));
        GW_CU_TRY(cudaMemsetAsync(c->tgt_d, 0, (size_t)m * 4, st));
        GW_OP_TRY(tg_cuda_elementwise_rope(
                      c->att, TG_CUDA_ELEMENTWISE_BF16, m, Hq, d, (int64_t)qd,
                      c->tgt_d, c->inv_freq, w->q_norm, md->norm_eps, st),
                  "calibration q norm", l);
        src = c->att;
    }
    GW_CU_TRY(cudaMemcpyAsync(c->p_hook, src, bytes, cudaMemcpyDeviceToHost,
                              st));
    GW_WAIT_TRY(c);
    const uint16_t *h = c->p_hook;
    for (size_t i = 0; i < (size_t)m * qd; i++)
        c->hook_f32[i] = bf16_to_f32(h[i]);
    c->opts.on_queries(c->opts.on_queries_ud, l, c->hook_f32, m, Hq, d);
    return 0;
}

int gw_cuda__on_scores(struct gw_cuda *c, int l, int n, char *err,
                       size_t errlen)
{
    int Hkv = c->model->n_kv_heads;
    TG_TRY(hook_buffers(c, err, errlen));
    GW_CU_TRY(cudaMemcpyAsync(c->p_hook, c->scores,
                              (size_t)Hkv * (size_t)n * 4,
                              cudaMemcpyDeviceToHost, STREAM(c)));
    GW_WAIT_TRY(c);
    c->opts.on_scores(c->opts.on_scores_ud, l, (const float *)c->p_hook, n,
                      Hkv);
    return 0;
}

void gw_cuda__hooks_free(struct gw_cuda *c)
{
    if (c->p_hook != NULL)
        cudaFreeHost(c->p_hook);
    free(c->hook_f32);
    c->p_hook = NULL;
    c->hook_f32 = NULL;
    c->p_hook_bytes = 0;
}

#endif /* TANGRAM_CUDA */
