/* gw_cuda_table.c — the host side of the CUDA runtime's block tables:
 * staging the CSR that common/kv/kv_table.c builds and refreshes into the
 * pinned mirrors the device copies come from (see gw_cuda.h). Pure host
 * code in every build, so the staging rules are unit-tested in CI
 * (test_gw_cuda_table). */
#include "gpu_worker/cuda/gw_cuda.h"

#include <string.h>

#include "common/base/tg_err.h"

int gw_cuda_table_stage(struct gw_cuda_table *t, const struct kv_table *k,
                        int32_t *sc_pos, int32_t *sc_val, int64_t sc_cap,
                        int64_t *n_scatter, char *err, size_t errlen)
{
    *n_scatter = 0;
    if (k->n_rows > t->cap_rows || k->n_slots > t->cap_ids)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "block table overflow (%lld rows / %lld ids, "
                          "capacity %lld / %lld)", (long long)k->n_rows,
                          (long long)k->n_slots, (long long)t->cap_rows,
                          (long long)t->cap_ids);
    size_t rows = (size_t)k->n_rows;
    memcpy(t->h_indptr, k->indptr, (rows + 1) * sizeof(int32_t));
    memcpy(t->h_npages, k->npages, rows * sizeof(int32_t));
    memcpy(t->h_lens, k->lens, rows * sizeof(int32_t));
    if (k->rebuilt || !k->track || k->n_dirty > sc_cap) {
        memcpy(t->h_indices, k->indices, (size_t)k->n_slots * sizeof(int32_t));
        *n_scatter = -1;
        return 0;
    }
    for (int64_t i = 0; i < k->n_dirty; i++) {
        sc_pos[i] = k->dirty[i];
        sc_val[i] = k->indices[k->dirty[i]];
        t->h_indices[k->dirty[i]] = sc_val[i]; /* the mirror stays whole */
    }
    *n_scatter = k->n_dirty;
    return 0;
}
