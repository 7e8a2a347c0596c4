/*
 * kv_seq_internal.h — what kv_seq.c (rows) shares with kv_seq_heads.c
 * (per-head lengths). Not for other modules: they use kv_seq.h.
 */
#ifndef KV_SEQ_INTERNAL_H
#define KV_SEQ_INTERNAL_H

#include <stdint.h>

#include "common/kv/kv_seq.h"

/* Tokens §4.3 keeps of a turn of n_new tokens at start, chunked by
 * `chunk` from the turn start, at budget b (kv_turn_keep in closed form). */
int64_t kv_seq__turn_keep(int64_t start, int64_t n_new, int64_t chunk,
                          double budget, const struct kv_forced_rule *rule);

/* Checks that the next n positions of the reserved turn may be committed:
 * 1 <= n <= what is pending, ending on a chunk boundary of the turn (a
 * multiple of C from its start) or at its end. Returns 0 or TG_EINVAL. */
int kv_seq__check_commit(const struct kv_seq *seq,
                         const struct kv_layout *layout, int64_t n,
                         char *err, size_t errlen);

/* kv_seq_commit_kept without its refusal of a seq with heads (the caller
 * keeps head_len in step itself). */
int kv_seq__commit_rows(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t n,
                        const int32_t *filled_after, int64_t *released,
                        char *err, size_t errlen);

/* kv_seq_rewind without its refusal of a seq with heads. */
int kv_seq__rewind_rows(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t pos,
                        const int32_t *row_tokens, char *err, size_t errlen);

/* kv_seq_commit's step for the heads: the n positions at `at` add their
 * row's §4.3 keep to every head. */
void kv_seq__heads_commit(struct kv_seq *seq, const struct kv_layout *layout,
                          int64_t at, int64_t n);

/* A fresh epoch from the process-wide counter (kv_seq.c). */
uint64_t kv_seq__next_epoch(void);

#endif /* KV_SEQ_INTERNAL_H */
