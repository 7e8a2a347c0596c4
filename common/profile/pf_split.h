/*
 * pf_split.h — what a profile fixes ahead of time: the decode split map
 * (DESIGN.md §4.6) and the tensor-parallel head assignment (§4.7).
 *
 * The page reservation of a prompt under a profile is kv/kv_prompt.h (it
 * uses the paging math, and kv/ depends on profiles, not the reverse).
 *
 * Split map, TANGRAM Algorithm 1 (Kim et al., arXiv 2606.06302): for layer
 * l with Omega = sum_h B[l][h] (head order) and tau = Omega / N_CTA,
 *   Phi[l][g] = sum of B[l][h] over the group's heads (listed order),
 *   S[l][g]   = max(1, round(Phi[l][g] / tau))   round half away from zero,
 * so each group gets CTAs in proportion to its share of the layer's work.
 *
 * TP assignment: per layer the groups, in profile order (budget ascending
 * for a clustered profile), are dealt to T ranks in snake order
 * 0, 1, .., T-1, T-1, .., 0, 0, 1, .. so the total budget per rank is
 * balanced (never worse than round-robin on a clustered profile, whose
 * groups are sorted). Requires (H / H_p) % T == 0.
 *
 * Pure functions of their inputs; any thread.
 */
#ifndef PF_SPLIT_H
#define PF_SPLIT_H

#include "common/profile/pf_profile.h"

#include <stddef.h>
#include <stdint.h>

/* Computes S[l][g] for one layer: `budget` has H entries, `groups` G * H_p
 * head indices, `splits` receives G counts (each >= 1). n_cta >= 1.
 * Returns 0 or TG_EINVAL (n_cta < 1, a sum of budgets that is not positive). */
int pf_split_layer(const double *budget, int H, const int *groups,
                   int heads_per_group, int n_cta, int *splits, char *err,
                   size_t errlen);

/* Computes the split map of every layer of *p into splits[L * G]
 * (layer-major, groups in profile order). Returns 0 or TG_EINVAL. */
int pf_split_map(const struct pf_profile *p, int n_cta, int *splits,
                 char *err, size_t errlen);

/* Heads of each TP rank, built by pf_tp_assign. */
struct pf_tp_plan {
    int ranks;            /* T */
    int num_layers;       /* L */
    int groups_per_rank;  /* G / T */
    int heads_per_rank;   /* H / T */
    int *groups;          /* (T, L, G/T) profile group indices, deal order */
    int *heads;           /* (T, L, H/T) head indices, ascending */
    double *rank_budget;  /* (T, L) sum of B[l][h] over the rank's heads */
};

/* Initializes *plan with the snake-order assignment of the groups of *p to
 * `ranks` ranks. Returns 0, TG_EINVAL (ranks < 1, or G not a multiple of
 * ranks — the message says which numbers) or TG_ENOMEM; on failure *plan
 * is left freed. The caller owns *plan (pf_tp_free). */
int pf_tp_assign(struct pf_tp_plan *plan, const struct pf_profile *p,
                 int ranks, char *err, size_t errlen);

/* Releases what *plan owns and zeroes it; safe on a zeroed or freed plan. */
void pf_tp_free(struct pf_tp_plan *plan);

/* Returns the H/T heads of `rank` in `layer`, ascending (borrowed). */
const int *pf_tp_heads(const struct pf_tp_plan *plan, int rank, int layer);

/* Returns the G/T profile group indices of `rank` in `layer` (borrowed). */
const int *pf_tp_groups(const struct pf_tp_plan *plan, int rank, int layer);

/* Builds the profile one tensor-parallel rank serves: its H/T KV heads of
 * every layer, renumbered locally, with its G/T groups. Local groups are the
 * rank's groups in pf_tp_groups order; local heads are those groups' heads
 * concatenated in that order (group j holds local heads j*H_p ..
 * (j+1)*H_p-1). global_head[l * (H/T) + i] receives the model's KV head of
 * local head i in layer l (caller-provided, L * H/T ints): the worker
 * gathers that head's weights (and its G query heads) in this order, and
 * the router reserves pages with the rank profile's group budgets — so
 * both sides agree by construction. *out is a full profile (caller frees
 * it with pf_profile_free). With ranks = 1 it equals *p up to renumbering
 * (which is the identity for the groups' own order). Returns 0, TG_EINVAL
 * or TG_ENOMEM. */
int pf_profile_rank(struct pf_profile *out, int *global_head,
                    const struct pf_profile *p, const struct pf_tp_plan *plan,
                    int rank, char *err, size_t errlen);

#endif /* PF_SPLIT_H */
