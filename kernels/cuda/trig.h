/*
 * trig.h — decode-time compression on the device (DESIGN.md §4.9): the
 * trigonometric score of a head's decode region and the order-preserving
 * compaction of the survivors, each one launch for a whole batch.
 *
 * Both ops work on "items": one KV head h of one row (sequence, layer,
 * group) of a device CSR block table (struct tg_cuda_kv_csr's indptr /
 * indices, rows as kv_table builds them), whose decode region is the n
 * slots [first, first + n) of that head. The pages are the CPU backend's
 * layout (kernels/tg_ops.h): a page is [H_p][2][P][d] bf16, K then V for
 * each slot, slot t of the head at page indices[indptr[row] + t / P],
 * offset t % P.
 *
 * Score (TriAttention's trigonometric estimate of a future query's logit,
 * constants and offsets of §4.9; CPU reference gw_trig_score in
 * gpu_worker/model/gw_trig.c). For a key k, next decode position t, the G query
 * heads q of h (rank-local query heads h*G .. h*G + G - 1) with statistics
 * re, im, abs (d/2 each) and O = {2^0 .. 2^16}:
 *   score(k) = 1/(G |O| sqrt(d)) * sum_f [ kx_f U_f + ky_f V_f + A_f |k_f| ]
 *   U_f + i V_f = sum_{q, o} (re_qf + i im_qf) e^{i w_f (t + o)},
 *   A_f = |O| sum_q (abs_qf - |re_qf + i im_qf|),
 * kx_f = k[f], ky_f = k[f + d/2]. The sum over (q, o) does not depend on
 * the key, so one CTA per item builds U, V, A once (angles reduced in
 * double: w_f (t + o) reaches 1e5 rad) and then scores its n keys with one
 * d-element dot product each, in fp32 with the K row widened from bf16.
 * This is the same sum as the CPU reference reordered; the scores agree to
 * fp32 rounding, not bit for bit (survivor choice happens on the host from
 * these scores, gw_trig_select).
 *
 * Compaction (CPU reference gw_trig_compact_head). An item's survivors are
 * src[0 .. n_keep) (region-relative slots, strictly ascending, < n); the
 * i-th moves, K and V, to slot first + i. Since a survivor's destination
 * may be an earlier survivor's source, a CTA reads survivors in chunks of
 * TG_CUDA_TRIG_CHUNK into shared memory, synchronises, and only then
 * writes them; chunks go in ascending order, and every source of a later
 * chunk lies past every destination of the chunk being written (src[j] >=
 * j > i for any destination first + i of the chunk), so survivors are
 * always read before anything overwrites them. Items must not share a
 * (row, head) (each head's region is compacted once per trigger); the
 * rows' shrinking and the pages freed are the caller's (kv_seq).
 *
 * A trigger is three launches for the whole batch: score, select (below),
 * compact; the caller knows the new lengths without reading anything back
 * (each head keeps min(region, cap)).
 *
 * Faults. An item whose row, slot range or a page id it would touch is out
 * of range is skipped and *fault is set to 1 (when fault != NULL); the
 * flag is never cleared here.
 *
 * The header is plain C (bf16 as uint16_t bits, streams as void *, NULL =
 * the default stream); the functions exist only in CUDA builds
 * (TANGRAM_CUDA). Errors: TG_EINVAL (bad arguments, detail in err),
 * TG_EDEVICE (launch error). Asynchronous; neither allocates nor
 * synchronises, so both can be captured in a CUDA graph.
 */
#ifndef TG_CUDA_TRIG_H
#define TG_CUDA_TRIG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TG_CUDA_TRIG_OFFSETS 17 /* O = {2^0 .. 2^16}, §4.9 */
#define TG_CUDA_TRIG_CHUNK 32   /* survivors staged per compaction round */

/* One KV head's decode region in one table row. */
struct tg_cuda_trig_item {
    int32_t row;    /* CSR row holding the head (sequence, layer, group) */
    int32_t head;   /* rank-local KV head (its query heads h*G .. h*G+G-1) */
    int32_t slot;   /* the head's slot in the row's pages (0 .. H_p-1) */
    int32_t layer;  /* layer of the statistics (score only) */
    int32_t first;  /* first slot of the region */
    int32_t n;      /* slots in the region (score: keys scored) */
    int32_t off;    /* offset of the item's n scores in `score` and of its
                       survivors in `src` (room for n in each) */
    int32_t n_keep; /* select / compaction: survivors (<= n), the cap;
                       score: unused */
    int64_t t;      /* score: next decode position; compaction: unused */
};

/* Pages and table shared by both ops. Device pointers. */
struct tg_cuda_trig_pages {
    uint16_t *pool;          /* bf16 (n_pages, H_p, 2, P, d) */
    int64_t n_pages;
    int heads_per_group;     /* H_p */
    int page_size;           /* P */
    int head_dim;            /* d: even, <= 256 */
    const int32_t *indptr;   /* (n_rows + 1) */
    const int32_t *indices;  /* page ids */
    int32_t n_rows;
};

struct tg_cuda_trig_score_args {
    struct tg_cuda_trig_pages pg;
    const struct tg_cuda_trig_item *items; /* device (n_items) */
    int n_items;
    int n_q_per_kv;          /* G, 1..16 */
    int n_q_heads;           /* rank-local query heads per layer (Hq) */
    int n_layers;            /* layers of the statistics */
    const float *re, *im, *abs; /* device (n_layers, Hq, d/2) each */
    const float *inv_freq;   /* device (d/2) rotary frequencies w_f */
    float *score;            /* device: item i's scores at score[off ..
                                off + n) */
    int32_t *fault;          /* device (1) or NULL */
    void *stream;
};

/* Queues the scores of every item. Returns 0 (also for n_items == 0),
 * TG_EINVAL or TG_EDEVICE. */
int tg_cuda_trig_score(const struct tg_cuda_trig_score_args *a, char *err,
                       size_t errlen);

/* Survivor choice of §4.9 on the device (CPU reference gw_trig_select):
 * of an item's n slots the last `window` always survive, and of the other
 * n - window the n_keep - window with the highest scores (ties: earlier
 * slot; NaN counts as -inf), found by a 4-pass radix select on the scores'
 * order-preserving 32-bit keys, so nothing is sorted and n is not bounded
 * by shared memory. The survivors are written ascending to
 * src[off .. off + n_keep), the layout tg_cuda_trig_compact reads, so
 * score, select and compact chain on one stream with no host round trip.
 * An item with n_keep outside [window, n] is skipped with *fault set.
 * Given the same float scores the choice equals gw_trig_select's. */
struct tg_cuda_trig_select_args {
    const struct tg_cuda_trig_item *items; /* device (n_items); n_keep is
                                              the item's cap */
    int n_items;
    int window;              /* W_d >= 0 */
    const float *score;      /* device: item i's n scores at score[off ..] */
    int32_t *src;            /* device: item i's survivors at src[off ..] */
    int32_t *fault;          /* device (1) or NULL */
    void *stream;
};

/* Queues the choice for every item. Returns 0 (also for n_items == 0),
 * TG_EINVAL or TG_EDEVICE. */
int tg_cuda_trig_select(const struct tg_cuda_trig_select_args *a, char *err,
                        size_t errlen);

struct tg_cuda_trig_compact_args {
    struct tg_cuda_trig_pages pg;
    const struct tg_cuda_trig_item *items; /* device (n_items) */
    int n_items;
    const int32_t *src;      /* device: item i's survivors at src[off ..
                                off + n_keep), region-relative, ascending */
    int32_t *fault;          /* device (1) or NULL */
    void *stream;
};

/* Queues the compaction of every item, one launch. Returns 0 (also for
 * n_items == 0), TG_EINVAL or TG_EDEVICE. */
int tg_cuda_trig_compact(const struct tg_cuda_trig_compact_args *a,
                         char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* TG_CUDA_TRIG_H */
