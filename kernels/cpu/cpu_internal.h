/*
 * cpu_internal.h — private glue of the CPU reference backend (kernels/cpu/).
 *
 * The backend context owns every buffer an op needs beyond its arguments:
 * one scratch slab per OpenMP thread (grown on demand, never shrunk, so the
 * steady state allocates nothing) and a zeroed token-count table for the
 * sampler's penalties. The op functions live in cpu_basic.c, cpu_attn.c,
 * cpu_score.c and cpu_sample.c; cpu_backend.c collects them into tg_ops_cpu.
 * Nothing here is visible outside kernels/cpu/.
 */
#ifndef CPU_INTERNAL_H
#define CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/tg_ops.h"

/* A (value, index) pair ordered by value descending, then index ascending:
 * the total order of every top-k in this backend (ties to the lower id). */
struct cpu_pair {
    float v;
    int32_t i;
};

struct tg_backend {
    int n_threads;          /* OpenMP team size of every parallel op */
    enum tg_cpu_isa isa;    /* level of the linear-layer kernels */
    int gemv_rows;          /* gemm: streaming kernels up to this many rows
                               of x (TG_CPU_GEMV_ROWS, measured in
                               docs/PERFORMANCE.md "CPU linear layers") */
    float *xsplit;          /* (xsplit_len) gemv's x in even/odd halves */
    size_t xsplit_len;
    void **scratch;         /* (n_threads) per-thread slabs, 64-byte aligned */
    size_t scratch_bytes;   /* current size of each slab */
    /* Vocabulary-sized buffers of the (serial) sampler. */
    struct cpu_pair *pairs; /* (vocab_len) candidate (logit, id) pairs */
    int32_t *counts;        /* (vocab_len) all zero between sample calls */
    uint8_t *seen;          /* (vocab_len) all zero between sample calls */
    size_t vocab_len;
};

/* Minimum work (multiply-adds or element moves) before an op opens an OpenMP
 * team: below this the fork/join costs more than it saves. */
#define CPU_PAR_MIN_WORK 32768

/* Runtime ISA dispatch of the backend's own loops: GCC compiles a function
 * marked CPU_CLONES once per level of enum tg_cpu_isa and the dynamic
 * loader's resolver calls the machine's (the same test as
 * tg_cpu_isa_detect). Other compilers build the baseline only. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_CLONES  \
    __attribute__(( \
        target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_CLONES
#endif

/* Ensures every per-thread slab holds at least `bytes`. Returns 0 or
 * TG_ENOMEM (the old slabs stay valid on failure). Not thread-safe: call
 * before opening a parallel region. */
int cpu__scratch_reserve(struct tg_backend *b, size_t bytes);

/* Returns the slab of OpenMP thread `tid` (< b->n_threads). */
void *cpu__scratch(struct tg_backend *b, int tid);

/* Ensures b->pairs, b->counts and b->seen hold `len` entries, counts and
 * seen zeroed. Returns 0 or TG_ENOMEM. */
int cpu__vocab_reserve(struct tg_backend *b, size_t len);

/* Returns nonzero when a ranks strictly before b in (v desc, i asc). */
static inline int cpu__pair_before(struct cpu_pair a, struct cpu_pair b)
{
    return a.v > b.v || (a.v == b.v && a.i < b.i);
}

/* Reorders a[0..n) so that a[0..k) are the k first pairs in the
 * (v desc, i asc) order, in no particular order among themselves
 * (quickselect, expected O(n)). Values must not be NaN. 0 <= k <= n. */
void cpu__select_first(struct cpu_pair *a, int n, int k);

/* Sorts a[0..n) in (v desc, i asc) order. */
void cpu__sort_pairs(struct cpu_pair *a, int n);

/* The ops, one per tg_ops slot (see kernels/tg_ops.h for the contracts). */
int cpu__embedding(struct tg_backend *b, const float *table, int vocab,
                   int hidden, const int32_t *ids, int n, float *out);
int cpu__rmsnorm(struct tg_backend *b, const float *x, const float *w, int n,
                 int dim, float eps, float *out);
int cpu__add(struct tg_backend *b, float *y, const float *x, size_t len);
int cpu__gemm(struct tg_backend *b, const float *x, const float *w,
              const float *bias, int m, int n, int k, float *y);
int cpu__gemm_bf16(struct tg_backend *b, const float *x, const uint16_t *w,
                   const float *bias, int m, int n, int k, float *y);
int cpu__embedding_bf16(struct tg_backend *b, const uint16_t *table, int vocab,
                        int hidden, const int32_t *ids, int n, float *out);

/* y (m, n) = x (m, k) W^T for 1 <= m <= TG_CPU_GEMV_ROWS_MAX, W (n, k) stored
 * as wt, with b's ISA level's kernels over b's threads (cpu_gemv.c).
 * Returns 0 or TG_ENOMEM. */
int cpu__gemv(struct tg_backend *b, const float *x, const void *w,
              enum tg_wtype wt, int m, int n, int k, float *y);

/* dst[i] = the fp32 value of bf16 src[i], i < n. */
void cpu__bf16_to_f32(const uint16_t *src, size_t n, float *dst);
int cpu__silu_mul(struct tg_backend *b, const float *gate, const float *up,
                  size_t len, float *out);
int cpu__rope(struct tg_backend *b, float *x, int n, int heads, int d,
              const int32_t *pos, const float *inv_freq);
int cpu__attn_chunk(struct tg_backend *b, const float *q, const float *k,
                    const float *v, int n, int n_q_heads,
                    const struct tg_kv_rows *hist, float scale, float *out);
int cpu__attn_decode(struct tg_backend *b, const float *q, int n_seq,
                     int n_q_heads, const struct tg_kv_rows *rows, float scale,
                     float *out);
int cpu__score(struct tg_backend *b, enum tg_score_method method,
               const float *q, const float *k, const float *v, int n,
               int n_q_heads, int n_kv_heads, int d, int window, float scale,
               float *scores);
int cpu__select_topk(struct tg_backend *b, const float *scores, int n,
                     int n_kv_heads, const int32_t *keep, int64_t start,
                     int window, int n_sink, int32_t *idx);
int cpu__kv_append(struct tg_backend *b, const struct tg_kv_rows *rows,
                   const float *k, const float *v, int n, const int32_t *idx,
                   const int32_t *n_keep);
int cpu__logprobs(struct tg_backend *b, const float *logits, int n, int vocab,
                  const int32_t *target, float *lp);
int cpu__logits_mask(struct tg_backend *b, float *logits, int vocab,
                     const uint32_t *mask);
int cpu__sample(struct tg_backend *b, float *logits, int vocab,
                const struct tg_sampling *sp,
                const struct tg_sample_history *hist, uint64_t *rng,
                int32_t *token, float *lp, int n_top, int32_t *top_ids,
                float *top_lps);

/* Checks the shape fields of a ragged row set (positive sizes, slots and
 * groups in range, non-negative lengths). Returns 0 or TG_EINVAL. */
int cpu__rows_check(const struct tg_kv_rows *r);

#endif /* CPU_INTERNAL_H */
