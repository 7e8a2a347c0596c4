/* gw_layout.c — profile -> ragged KV layout (see gw_layout.h). */
#include "gpu_worker/gw_layout.h"

#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"

void gw_layout_free(struct gw_kv_layout *lay)
{
    free(lay->head_group);
    free(lay->head_slot);
    kv_layout_free(&lay->kv);
    memset(lay, 0, sizeof(*lay));
}

int gw_layout_from_profile(struct gw_kv_layout *lay, const struct pf_profile *p,
                           int page_size, int prefill_chunk,
                           const struct kv_forced_rule *rule, char *err,
                           size_t errlen)
{
    memset(lay, 0, sizeof(*lay));
    if (page_size <= 0 || page_size > 4096)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page size %d outside [1, 4096]", page_size);
    if (p->num_groups > GW_MAX_GROUPS)
        return tg_err_set(err, errlen, TG_EINVAL, "%d groups per layer (max %d)",
                          p->num_groups, GW_MAX_GROUPS);
    size_t L = (size_t)p->num_layers, H = (size_t)p->num_kv_heads;
    size_t G = (size_t)p->num_groups;
    lay->head_group = malloc(L * H * sizeof(int32_t));
    lay->head_slot = malloc(L * H * sizeof(int32_t));
    if (!lay->head_group || !lay->head_slot) {
        gw_layout_free(lay);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    int rc = kv_layout_init(&lay->kv, p->num_layers, p->num_groups,
                            p->heads_per_group, p->head_dim, page_size,
                            prefill_chunk, rule, p->group_budget, err, errlen);
    if (rc != 0) {
        gw_layout_free(lay);
        return rc;
    }
    lay->n_kv_heads = p->num_kv_heads;
    lay->compress = 0;
    for (size_t l = 0; l < L; l++) {
        for (size_t g = 0; g < G; g++) {
            const int *heads = pf_profile_group(p, (int)l, (int)g);
            for (int j = 0; j < p->heads_per_group; j++) {
                lay->head_group[l * H + (size_t)heads[j]] = (int32_t)g;
                lay->head_slot[l * H + (size_t)heads[j]] = j;
            }
            if (lay->kv.group_budget[l * G + g] < 1.0)
                lay->compress = 1;
        }
    }
    return 0;
}
