/* kv_seq_move.c — a sequence's pages from one pool to another: the host
 * tier's offload and restore of stored conversations (see kv_seq.h). */
#include <string.h>

#include "common/kv/kv_seq.h"
#include "common/kv/kv_seq_internal.h"
#include "common/base/tg_err.h"

int kv_seq_move_pages(struct kv_seq *seq, struct kv_pool *from,
                      struct kv_pool *to, int32_t *old_ids, int32_t *new_ids,
                      char *err, size_t errlen)
{
    if (from == NULL || to == NULL || from == to ||
        (seq->used_pages > 0 && old_ids == NULL))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: a move needs two distinct pools and room "
                          "for the old ids");
    if (seq->committed < seq->turn_len)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: move while the turn's prefill is pending");
    if (seq->used_pages > INT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL, "kv_seq: %lld pages",
                          (long long)seq->used_pages);
    int32_t n = (int32_t)seq->used_pages;
    const int32_t *fresh = kv_pool_pop_view(to, n);
    if (fresh == NULL)
        return tg_err_set(err, errlen, TG_ENOSPC,
                          "kv_seq: the target pool has %d free pages, the "
                          "sequence holds %d", (int)kv_pool_n_free(to),
                          (int)n);
    int64_t k = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int32_t *row = seq->ids + seq->off[r];
        int32_t np = seq->n_pages[r];
        if (np == 0)
            continue;
        memcpy(old_ids + k, row, (size_t)np * sizeof(int32_t));
        memcpy(row, fresh + k, (size_t)np * sizeof(int32_t));
        if (new_ids != NULL)
            memcpy(new_ids + k, fresh + k, (size_t)np * sizeof(int32_t));
        k += np;
    }
    TG_ASSERT(k == n); /* used_pages is the sum of the rows' pages */
    from->mono_pages -= seq->mono_pages;
    to->mono_pages += seq->mono_pages;
    seq->epoch = kv_seq__next_epoch();
    return 0;
}
