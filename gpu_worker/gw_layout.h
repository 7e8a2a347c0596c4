/*
 * gw_layout.h — builds a rank's ragged KV layout (struct gw_kv_layout)
 * from a profile: which group and page slot each KV head uses per layer,
 * and every group's budget.
 */
#ifndef GW_LAYOUT_H
#define GW_LAYOUT_H

#include <stddef.h>

#include "common/pf_profile.h"
#include "gpu_worker/gw_forward.h"

/* Fills *lay from profile p (borrowed) with page size `page_size` tokens,
 * prefill chunks of `prefill_chunk` tokens and the forced-key rule of the
 * scoring method.
 * Head h of layer l goes to the group listing it, at the slot of its
 * position in that list. Returns 0, TG_EINVAL (page size, too many groups)
 * or TG_ENOMEM; on failure *lay is left freed. The caller owns *lay. */
int gw_layout_from_profile(struct gw_kv_layout *lay, const struct pf_profile *p,
                           int page_size, int prefill_chunk,
                           const struct kv_forced_rule *rule, char *err,
                           size_t errlen);

/* Frees what gw_layout_from_profile allocated; safe on a zeroed layout. */
void gw_layout_free(struct gw_kv_layout *lay);

#endif /* GW_LAYOUT_H */
