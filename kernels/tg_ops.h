/*
 * tg_ops.h — the op table of the CPU reference backend (DESIGN.md §6).
 *
 * The CPU forward pass (gpu_worker/cpu/gw_forward.c) calls only these ops, and
 * kernels/cpu/ implements them in fp32 with OpenMP and BLAS. The CUDA
 * forward pass (gpu_worker/cuda/gw_cuda*.c) does not go through this table: it
 * calls the kernels of kernels/cuda/ directly, because they fuse and store
 * differently (bf16 weights and pages, fused Q/K norm and RoPE, one append
 * for a whole decode batch, CUDA graphs over fixed device addresses); each
 * of those kernels is tested against the CPU op here that it replaces.
 * What makes the two backends interchangeable for the worker is the
 * runtime interface one level up, gpu_worker/backend/gw_backend.h.
 * Pointers are host memory; activations are fp32 row-major unless a field
 * says otherwise.
 *
 * Every op returns 0 or a negative TG_E* code (TG_EINVAL for bad shapes).
 * Ops never log and never allocate per call on the hot path beyond the
 * scratch owned by the backend context. One backend context per thread.
 *
 * Notation: n tokens in a chunk, Hq query heads, Hkv KV heads, G = Hq/Hkv
 * (query head q reads KV head q / G), d head_dim, P page size (tokens),
 * H_p heads per group (page), V vocabulary size.
 */
#ifndef TG_OPS_H
#define TG_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_sampling.h" /* struct tg_sampling */

#ifdef __cplusplus
extern "C" {
#endif

/* The ragged KV of one sequence at one layer: every KV head h lives in
 * group head_group[h] at slot head_slot[h] of that group's pages. A page is
 * [H_p][2][P][d] floats: for slot j, K rows at ((j*2+0)*P + t)*d and V rows
 * at ((j*2+1)*P + t)*d. Token t of a group's row sits in page
 * group_pages[g][t / P] at offset t % P. Without head_len all heads of a
 * group hold the same number of tokens, group_len[g]; with head_len
 * (adaptive budgets, DESIGN.md §4.8) head h holds its own first
 * head_len[h] <= group_len[head_group[h]] slots and the group's row is as
 * long as its longest head. Keys are stored after RoPE. */
struct tg_kv_rows {
    float *pool;                       /* (n_pages, H_p, 2, P, d) */
    int heads_per_group;               /* H_p */
    int page_size;                     /* P */
    int head_dim;                      /* d */
    int n_kv_heads;                    /* Hkv */
    const int32_t *head_group;         /* (Hkv) group of each KV head */
    const int32_t *head_slot;          /* (Hkv) slot within its group's page */
    const int32_t *const *group_pages; /* (n_groups) -> (ceil(len/P)) page ids */
    const int32_t *group_len;          /* (n_groups) tokens held per head */
    const int32_t *head_len;           /* (Hkv) tokens held by each head, or
                                          NULL: group_len of its group */
};

/* Query-side scoring methods for chunk compression (DESIGN.md §4.4). */
enum tg_score_method {
    TG_SCORE_SNAPKV = 0,             /* query-aware, window of last queries */
    TG_SCORE_KEYDIFF = 1,            /* query-agnostic key diversity */
    TG_SCORE_EXPECTED_ATTENTION = 2, /* query-agnostic expected attention */
    TG_SCORE_GVOTE = 3,              /* adaptive per-head budgets (§4.8):
                                        not a `score` op, the forward pass
                                        selects through gpu_worker/model/gw_gvote */
};

/* Token history a sampler needs for penalties (host memory). */
struct tg_sample_history {
    const int32_t *prompt; /* (n_prompt) */
    int n_prompt;
    const int32_t *output; /* (n_output) */
    int n_output;
};

/* How a weight matrix or table is stored. bf16 is the high half of an
 * fp32 value (round to nearest even when made from fp32); the ops that
 * take bf16 weights convert them exactly to fp32 and compute in fp32. */
enum tg_wtype {
    TG_WTYPE_F32 = 0,
    TG_WTYPE_BF16 = 1,
};

/* The instruction-set levels of the CPU backend's kernels, chosen at run
 * time for the machine (tg_cpu_isa_detect): each level has its own code
 * for the linear layers, and the backend's other loops are compiled once
 * per level (GCC's target_clones; the dynamic loader picks one). */
enum tg_cpu_isa {
    TG_CPU_ISA_GENERIC = 0, /* x86-64 baseline (SSE2), or not x86 */
    TG_CPU_ISA_AVX2 = 1,    /* x86-64-v3: AVX2, FMA */
    TG_CPU_ISA_AVX512 = 2,  /* x86-64-v4: AVX-512 F/BW/CD/DQ/VL */
};

struct tg_backend; /* opaque per-thread backend context */

struct tg_ops {
    const char *name; /* "cpu" (kernels/cpu/, the one table) */

    /* out[i,:] = table[ids[i],:]. table (V, hidden); out (n, hidden). */
    int (*embedding)(struct tg_backend *b, const float *table, int vocab,
                     int hidden, const int32_t *ids, int n, float *out);

    /* embedding with a bf16 table (V, hidden): each row converted to
     * fp32. */
    int (*embedding_bf16)(struct tg_backend *b, const uint16_t *table,
                          int vocab, int hidden, const int32_t *ids, int n,
                          float *out);

    /* out = x * rsqrt(mean(x^2) + eps) * w per row. x, out (n, dim); w (dim).
     * out may equal x. */
    int (*rmsnorm)(struct tg_backend *b, const float *x, const float *w, int n,
                   int dim, float eps, float *out);

    /* y[i] += x[i] for i < len. */
    int (*add)(struct tg_backend *b, float *y, const float *x, size_t len);

    /* y = x W^T (+ bias). x (m, k); w (n, k) row-major as in HF checkpoints;
     * bias (n) or NULL; y (m, n). Up to a few rows (a decode step) the
     * backend's own kernels stream W once; more rows go to BLAS sgemm, its
     * columns split over the backend's threads (OpenBLAS itself runs one
     * thread: one pool of threads, OpenMP's). Results agree with a
     * float64 product within fp32 rounding of a length-k sum; which
     * rounding depends on m and the ISA level, and on the streaming
     * kernels' rows (tests/unit/test_cpu_ops.c checks it) never on the
     * thread count or on the other rows of x. */
    int (*gemm)(struct tg_backend *b, const float *x, const float *w,
                const float *bias, int m, int n, int k, float *y);

    /* gemm with bf16 weights w (n, k): the same product over the exact
     * fp32 values of w (many rows: converted a block of rows at a time
     * into the thread's scratch for sgemm). */
    int (*gemm_bf16)(struct tg_backend *b, const float *x, const uint16_t *w,
                     const float *bias, int m, int n, int k, float *y);

    /* out = silu(gate) * up. gate, up, out (len); out may equal gate. */
    int (*silu_mul)(struct tg_backend *b, const float *gate, const float *up,
                    size_t len, float *out);

    /* NeoX RoPE in place: for each row (token i, head h) with angle
     * pos[i] * inv_freq[j], rotates the pairs (x[j], x[j + d/2]), j < d/2.
     * x (n, heads, d); pos (n); inv_freq (d/2). */
    int (*rope)(struct tg_backend *b, float *x, int n, int heads, int d,
                const int32_t *pos, const float *inv_freq);

    /* Attention of a prefill chunk: the query at chunk index i (absolute
     * position start + i) sees every history token of its KV head (hist,
     * may hold 0 tokens) and the chunk's keys 0..i. softmax in fp32 with
     * the given scale (1/sqrt(d)). q, out (n, Hq, d); k, v (n, Hkv, d). */
    int (*attn_chunk)(struct tg_backend *b, const float *q, const float *k,
                      const float *v, int n, int n_q_heads,
                      const struct tg_kv_rows *hist, float scale, float *out);

    /* Decode attention of n_seq sequences, one query token each, over each
     * sequence's rows (which already hold the new token). q, out
     * (n_seq, Hq, d); rows (n_seq). */
    int (*attn_decode)(struct tg_backend *b, const float *q, int n_seq,
                       int n_q_heads, const struct tg_kv_rows *rows,
                       float scale, float *out);

    /* Scores the chunk's n keys per KV head (higher = keep), DESIGN.md §4.4.
     * snapkv: window W = min(window, n) last queries, per KV head the mean
     * over its G query heads and W queries of softmax_j(q.k_j*scale) over the
     * chunk's causal keys, then average pooling (width 5, zero padding 2,
     * divisor 5). Forced keys are NOT applied here (see select_topk).
     * q (n, Hq, d); k, v (n, Hkv, d); scores (Hkv, n). */
    int (*score)(struct tg_backend *b, enum tg_score_method method,
                 const float *q, const float *k, const float *v, int n,
                 int n_q_heads, int n_kv_heads, int d, int window, float scale,
                 float *scores);

    /* Per KV head, selects the top keep[h] chunk indices by score, treating
     * forced keys (the chunk's last min(window, n) keys and keys at absolute
     * position start + i < n_sink) as +inf; ties go to the lower index.
     * Writes the kept indices of head h in ascending order to
     * idx[h * n .. h * n + keep[h]). scores (Hkv, n); keep (Hkv);
     * idx (Hkv, n). */
    int (*select_topk)(struct tg_backend *b, const float *scores, int n,
                       int n_kv_heads, const int32_t *keep, int64_t start,
                       int window, int n_sink, int32_t *idx);

    /* Appends chunk keys/values to each KV head's group row at offset
     * rows->group_len[g] (rows->head_len[h] when head_len is set; the
     * caller advances the lengths afterwards): head h appends
     * k[idx[h*n + t], h, :] for t < n_keep[h] (idx NULL: all n in order).
     * Without head_len the heads of a group must keep equal counts.
     * Pages for the new tokens must already be in group_pages.
     * k, v (n, Hkv, d). */
    int (*kv_append)(struct tg_backend *b, const struct tg_kv_rows *rows,
                     const float *k, const float *v, int n, const int32_t *idx,
                     const int32_t *n_keep);

    /* lp[i] = log_softmax(logits[i,:])[target[i]] in double-accumulated
     * fp32. logits (n, V); target (n); lp (n). */
    int (*logprobs)(struct tg_backend *b, const float *logits, int n,
                    int vocab, const int32_t *target, float *lp);

    /* Samples one token from logits (V) of one sequence: penalties, then
     * temperature, top-k, top-p, min-p (vLLM order), then a draw from
     * *rng (xoshiro/splitmix state, advanced). Greedy when temperature is
     * 0. *lp gets the log-probability of the chosen token under the
     * unmodified distribution (log_softmax of the raw logits); when
     * n_top > 0 the n_top most likely tokens of that distribution go to
     * top_ids/top_lps (descending, ties to lower id). logits may be
     * modified in place as scratch. Host memory. *sp must be a value
     * tg_sampling_check accepts for this vocabulary, checked once where
     * it entered (a bad one stops the process: TG_ASSERT); TG_EINVAL is
     * for bad arguments (sizes, pointers, a history id outside the
     * vocabulary). */
    int (*sample)(struct tg_backend *b, float *logits, int vocab,
                  const struct tg_sampling *sp,
                  const struct tg_sample_history *hist, uint64_t *rng,
                  int32_t *token, float *lp, int n_top, int32_t *top_ids,
                  float *top_lps);

    /* Structured outputs: sets logits[j] = -inf for every id j < vocab
     * whose bit in mask is 0 (bit j of mask[j >> 5], (vocab + 31) / 32
     * words), before sample so that the draw and its log-probabilities
     * see only the allowed ids. Host memory. 0 or TG_EINVAL. */
    int (*logits_mask)(struct tg_backend *b, float *logits, int vocab,
                       const uint32_t *mask);
};

/* The CPU reference backend (kernels/cpu/). */
extern const struct tg_ops tg_ops_cpu;

/* Creates a CPU backend context (scratch buffers, thread count; n_threads
 * <= 0 uses OpenMP's default) at the machine's ISA level
 * (tg_cpu_isa_detect). Sets OpenBLAS to one thread for the whole process:
 * every op runs on OpenMP's threads only, so the two pools never spin
 * against each other. Returns 0 or TG_ENOMEM; the caller frees it with
 * tg_backend_cpu_free (safe on NULL). */
int tg_backend_cpu_new(int n_threads, struct tg_backend **out);
void tg_backend_cpu_free(struct tg_backend *b);

/* The highest level this machine runs (cached after the first call;
 * thread-safe). */
enum tg_cpu_isa tg_cpu_isa_detect(void);

/* "generic", "avx2" or "avx512". */
const char *tg_cpu_isa_name(enum tg_cpu_isa isa);

/* The level of b's linear-layer kernels. */
enum tg_cpu_isa tg_backend_cpu_isa(const struct tg_backend *b);

/* gemm and gemm_bf16 take the streaming kernels up to `rows` rows of x
 * (default TG_CPU_GEMV_ROWS) and BLAS above; 0 .. TG_CPU_GEMV_ROWS_MAX
 * (benchmarks and tests compare the two paths). Returns 0 or TG_EINVAL. */
#define TG_CPU_GEMV_ROWS 32
#define TG_CPU_GEMV_ROWS_MAX 64
int tg_backend_cpu_set_gemv_rows(struct tg_backend *b, int rows);

/* Makes b's linear-layer kernels use `isa` (tests and benchmarks compare
 * the levels on one machine). Returns 0, or TG_EUNSUPPORTED when the
 * machine lacks it. The backend's other loops keep the machine's level. */
int tg_backend_cpu_set_isa(struct tg_backend *b, enum tg_cpu_isa isa);

#ifdef __cplusplus
}
#endif
#endif /* TG_OPS_H */
