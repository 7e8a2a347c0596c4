/*
 * score_qa.h — the query-agnostic chunk scoring methods on the device
 * (DESIGN.md §4.4), keydiff and expected_attention, plus
 * tg_cuda_score_qa_score, the one entry that routes all three methods
 * (snapkv goes to tg_cuda_compress_score_snapkv of compress.h): the
 * "score" step of the fused chunk compression.
 *
 * Semantics are exactly those of the CPU reference tg_ops_cpu.score
 * (kernels/cpu/cpu_score.c), per KV head h with query heads h*G .. h*G+G-1,
 * chunk of n keys, window W = min(window, n) (window <= 0: W = n):
 *
 *  keydiff (kvpress KeyDiffPress; Park et al. 2025, "KeyDiff"):
 *      a = 1/n sum_j k_j / ||k_j||,   score[j] = -cos(k_j, a)
 *    a zero key contributes 0 to a and scores 0, as does every key when
 *    a = 0. q and v are not read (q may be NULL).
 *
 *  expected_attention (kvpress ExpectedAttentionPress): for each query head
 *    the last W queries give mu and the population covariance Sigma; with
 *      z_j = mu.k_j * scale + 0.5 * scale^2 * k_j^T Sigma k_j,
 *      k^T Sigma k = 1/W sum_i ((q_i - mu).k)^2,
 *    score[j] = ||v_j|| * mean over the G query heads of softmax_j(z) over
 *    all n keys (the queries are used as given, after RoPE; see
 *    cpu_score.c for this documented simplification of kvpress).
 *
 * The device sums in fp32 (the CPU in double), in a fixed order, so the
 * scores are deterministic and match the CPU up to fp32 rounding: the test
 * (tests/gpu/test_cuda_score_qa.c) allows |gpu - cpu| <= 2e-5 for keydiff
 * (cosines, |score| <= 1) and <= 2e-5 |cpu| + 1e-7 max_j |cpu_h| for
 * expected_attention (an fp32 emulation of these kernels stays below
 * 3e-7 on the test's data). Forced keys are not applied here
 * (tg_cuda_compress_select_topk).
 *
 * Memory: q, k, v, scores and the workspace are device memory, with the
 * conventions of compress.h: bf16 as uint16_t bit patterns, q (n, Hq, d),
 * k and v (n, Hkv, d), scores fp32 (Hkv, n); streams are void * (NULL =
 * the default stream). The chunk's start, n_sink are not used by scoring;
 * scale is used by snapkv and expected_attention.
 *
 * Limits: those of compress.h (n <= TG_CUDA_COMPRESS_MAX_CHUNK, head_dim <=
 * TG_CUDA_COMPRESS_MAX_HEAD_DIM, n_kv_heads <= TG_CUDA_COMPRESS_MAX_KV_HEADS,
 * Hq a multiple of Hkv).
 *
 * Every call only queues kernels on `stream` (no allocation, no
 * synchronisation, so it can be captured in a CUDA graph) and returns 0,
 * TG_EINVAL (bad arguments, checked before anything is queued) or
 * TG_EDEVICE (a launch error, detail printed by cuda_check.cuh). The
 * functions exist only in CUDA builds (TANGRAM_CUDA). Any thread; calls on
 * one stream are ordered.
 */
#ifndef TG_CUDA_SCORE_QA_H
#define TG_CUDA_SCORE_QA_H

#include <stddef.h>

#include "kernels/cuda/compress.h"
#include "kernels/tg_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of device workspace tg_cuda_score_qa_score needs for `method` on a
 * chunk of n tokens (snapkv: tg_cuda_compress_workspace_bytes; keydiff:
 * per-tile partial anchors, Hkv * ceil(n / 64) * d floats; expected_attention:
 * query means, logits and softmax statistics, Hq * (d + n + 2) floats, each
 * part aligned to 256 bytes). Returns 0 when n <= 0, the shape is invalid or
 * the method unknown. Pure; any thread. */
size_t tg_cuda_score_qa_workspace_bytes(enum tg_score_method method, int n,
                                        int n_q_heads, int n_kv_heads,
                                        int head_dim, int window);

/* Writes the keydiff scores of chunk `c` to scores (device fp32 (Hkv, n))
 * using ws (ws_bytes >= tg_cuda_score_qa_workspace_bytes(TG_SCORE_KEYDIFF,
 * ...)). c->q and c->v are not read. n == 0 queues nothing. Returns 0,
 * TG_EINVAL or TG_EDEVICE. */
int tg_cuda_score_qa_keydiff(const struct tg_cuda_compress_chunk *c,
                             float *scores, void *ws, size_t ws_bytes,
                             void *stream);

/* Writes the expected_attention scores of chunk `c` (q, k and v all read)
 * to scores (device fp32 (Hkv, n)) using ws (ws_bytes >=
 * tg_cuda_score_qa_workspace_bytes(TG_SCORE_EXPECTED_ATTENTION, ...)). n == 0
 * queues nothing. Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_score_qa_expected_attention(const struct tg_cuda_compress_chunk *c,
                                        float *scores, void *ws,
                                        size_t ws_bytes, void *stream);

/* Routes to the scoring method: TG_SCORE_SNAPKV ->
 * tg_cuda_compress_score_snapkv, TG_SCORE_KEYDIFF -> tg_cuda_score_qa_keydiff,
 * TG_SCORE_EXPECTED_ATTENTION -> tg_cuda_score_qa_expected_attention, with the
 * same arguments (ws_bytes >= tg_cuda_score_qa_workspace_bytes(method, ...)).
 * Returns 0, TG_EINVAL (also for an unknown method) or TG_EDEVICE. */
int tg_cuda_score_qa_score(enum tg_score_method method,
                           const struct tg_cuda_compress_chunk *c,
                           float *scores, void *ws, size_t ws_bytes,
                           void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_SCORE_QA_H */
