/*
 * kv_layout.h — one rank's ragged KV layout (DESIGN.md §1.2, §4.5, §4.7):
 * L layers of G page groups of H_p heads each, the budget of every group,
 * the page and chunk sizes, the forced-key rule, and where each KV head of
 * the rank lives (its group and its slot inside the group's pages).
 *
 * The router's page accounting (kv_seq), the block tables (kv_table) and
 * the workers' forward passes all read the same struct, built by the same
 * function for a rank (kv_layout_for_rank): the profile's groups dealt to
 * the T ranks in snake order by budget (pf_tp_assign), the rank's own
 * profile (pf_profile_rank), then kv_layout_from_profile. So the pages the
 * router reserves for a rank are exactly the pages that rank fills.
 *
 * Pure computation; any thread; the caller owns every layout it builds and
 * frees it with kv_layout_free.
 */
#ifndef KV_LAYOUT_H
#define KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_budget.h"
#include "common/profile/pf_profile.h"

#define KV_PAGE_SIZE_DEFAULT 16      /* P, tokens per page */
#define KV_PREFILL_CHUNK_DEFAULT 512 /* C, tokens per prefill chunk */
#define KV_MAX_GROUPS 1024           /* groups per layer on one rank */

struct kv_layout {
    int n_layers;                /* L */
    int n_groups;                /* G, groups per layer on this rank */
    int heads_per_group;         /* H_p */
    int head_dim;                /* d */
    int page_size;               /* P, tokens per page */
    int prefill_chunk;           /* C, tokens per prefill chunk */
    struct kv_forced_rule rule;  /* forced keys of §4.4 */
    double *group_budget;        /* (L, G) b[l][g] in (0, 1]; owned */
    /* Where the rank's heads live; set by kv_layout_from_profile (zero /
     * NULL after kv_layout_init alone, which page accounting needs no
     * more than). Head h is the rank's local head index. */
    int n_kv_heads;              /* Hkv on this rank (= G * H_p) */
    int32_t *head_group;         /* (L, Hkv) group of each KV head; owned */
    int32_t *head_slot;          /* (L, Hkv) its slot in the group's pages;
                                    owned */
    int compress;                /* 0 when every budget is 1 (no scoring
                                    runs) */
};

/* Initialises `layout` for page accounting, copying group_budget (L * G
 * values, row-major by layer). Requires L, G, H_p, d, P, C >= 1,
 * L * G <= 2^24, every budget in (0, 1] (1 = full KV) and rule fields >= 0.
 * Leaves the head maps empty. Returns 0, TG_EINVAL naming the bad field, or
 * TG_ENOMEM; on failure the layout is zeroed. */
int kv_layout_init(struct kv_layout *layout, int n_layers, int n_groups,
                   int heads_per_group, int head_dim, int page_size,
                   int prefill_chunk, const struct kv_forced_rule *rule,
                   const double *group_budget, char *err, size_t errlen);

/* The layout of profile p (one rank's, or the whole model's with one
 * rank): kv_layout_init with p's group budgets, plus the head maps: head
 * h of layer l goes to the group listing it, at the slot of its position
 * in that list. P in [1, 4096], at most KV_MAX_GROUPS groups. Returns 0,
 * TG_EINVAL or TG_ENOMEM; on failure the layout is zeroed. */
int kv_layout_from_profile(struct kv_layout *layout,
                           const struct pf_profile *p, int page_size,
                           int prefill_chunk,
                           const struct kv_forced_rule *rule, char *err,
                           size_t errlen);

/* Rank `rank` of `ranks`: the snake assignment of whole's groups
 * (pf_tp_assign), the rank's profile (pf_profile_rank; into *rank_profile
 * when non-NULL, which the caller then frees with pf_profile_free) and its
 * layout (kv_layout_from_profile). global_head, when non-NULL, receives
 * the (L, Hkv on the rank) model head index of each local head, in group
 * order (the heads a worker's weight shard holds); the caller sizes it
 * L * whole->num_kv_heads / ranks. With ranks = 1 the layout is whole's.
 * Returns 0, TG_EINVAL (ranks, rank, or groups that do not split evenly,
 * named) or TG_ENOMEM; on failure nothing is left allocated. */
int kv_layout_for_rank(struct kv_layout *layout,
                       struct pf_profile *rank_profile, int *global_head,
                       const struct pf_profile *whole, int ranks, int rank,
                       int page_size, int prefill_chunk,
                       const struct kv_forced_rule *rule, char *err,
                       size_t errlen);

/* Releases what the layout owns. Safe on a zeroed layout and twice. */
void kv_layout_free(struct kv_layout *layout);

/* Returns the elements of one page, H_p * 2 * P * d. */
int64_t kv_layout_page_elems(const struct kv_layout *layout);

#endif /* KV_LAYOUT_H */
