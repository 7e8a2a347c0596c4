/*
 * pf_profile.h — the calibrated budget profile of DESIGN.md §4.2.
 *
 * A profile says, for every (layer l, KV head h), the budget ratio B[l][h]
 * that budget reservation (§4.3) uses, and how the heads of each layer are
 * grouped into pages of H_p heads (ragged paging). It is the static input of
 * three later stages: page reservation at admission (router), the split map
 * of the decode kernel (pf_split.h) and the tensor-parallel head assignment
 * (pf_split.h).
 *
 * On disk it is JSON:
 *   { "format": "tangram-profile", "version": 1,
 *     "model": {"architecture", "num_layers": L, "num_kv_heads": H,
 *               "head_dim": d, "identity": "sha256:<hex>"},
 *     "method": "snapkv", "target_ratio": r, "alpha": 2.0, "samples": S,
 *     "heads_per_group": H_p, "grouping": "clustered"|"adjacent",
 *     "layers": [ {"mean": [H], "std": [H], "budget": [H],
 *                  "groups": [[h, ...], ...]} x L ],
 *     "trig": {...} }    // optional, pf_trig.h (§4.9)
 * Loading checks every field and names the offending one in the error
 * ("layers[3].groups: head 5 appears twice"). Group budgets
 * b[l][g] = max(B[l][h] for h in group) are derived on load, never stored.
 *
 * "model.identity" (optional; pf_identity.h) names the model the profile
 * was made for: tangram-profile calibrate writes it, build copies it from
 * the retention file or takes it from --model; pf_profile_check_model
 * compares it with the model served. A profile without one (made before
 * identities existed) loads and is used with a warning.
 *
 * "No profile" (`--profile none`) is the full-KV profile: every budget 1
 * (pf_profile_init_full).
 *
 * A struct pf_profile is plain data owned by the caller; after init/load it
 * is read-only and may be shared by threads.
 */
#ifndef PF_PROFILE_H
#define PF_PROFILE_H

#include <jansson.h>
#include <stddef.h>

#include "common/model/mc_model_config.h"
#include "common/profile/pf_trig.h"

#define PF_PROFILE_FORMAT "tangram-profile"
#define PF_PROFILE_VERSION 1
/* Smallest budget a head may have (§4.2): never reserve zero pages. */
#define PF_BUDGET_MIN (1.0 / 1024.0)
/* Upper limits that keep every product (L * H, S * L * H) far from int
 * overflow; real models are orders of magnitude below them. */
#define PF_MAX_LAYERS 4096
#define PF_MAX_HEADS 4096
#define PF_MAX_HEAD_DIM 65536

/* How heads of a layer are gathered into groups of H_p. */
enum pf_grouping {
    PF_GROUPING_CLUSTERED = 0, /* sort by (budget, head) asc., H_p at a time */
    PF_GROUPING_ADJACENT = 1,  /* heads 0..H_p-1, H_p..2H_p-1, ... (ablation) */
};

struct pf_profile {
    char *architecture;      /* model.architecture, owned */
    char *model_identity;    /* model.identity ("sha256:<hex>", owned), or
                                NULL when the file has none */
    char *method;            /* scoring method name, owned ("none" for full) */
    int num_layers;          /* L */
    int num_kv_heads;        /* H */
    int head_dim;            /* d */
    int heads_per_group;     /* H_p, divides H */
    int num_groups;          /* G = H / H_p, per layer */
    int samples;             /* calibration samples S (0 for full KV) */
    double target_ratio;     /* method's average keep ratio, (0, 1] */
    double alpha;            /* B = min(1, mean + alpha * std) */
    enum pf_grouping grouping;
    double *mean;            /* (L, H) mean retention ratio */
    double *std;             /* (L, H) population std of the retention */
    double *budget;          /* (L, H) budget ratio in [1/1024, 1] */
    int *groups;             /* (L, G, H_p) head indices, groups in order */
    double *group_budget;    /* (L, G) max budget of the group's heads */
    double *budget_mean;     /* (L) mean budget over the whole model's KV
                                heads of each layer, the denominator of
                                the decode caps (§4.9); pf_profile_finish
                                computes it, pf_profile_rank keeps the
                                whole model's so a rank's caps agree */
    struct pf_trig trig;     /* optional "trig" statistics (§4.9);
                                trig.num_q_heads 0 when absent */
};

/* Parses "clustered" / "adjacent" into *out. Returns 0 or TG_EINVAL. */
int pf_grouping_parse(const char *s, enum pf_grouping *out);

/* Returns the static name of `g` ("clustered", "adjacent"). */
const char *pf_grouping_name(enum pf_grouping g);

/* Initializes *p for L layers of H heads of dimension d grouped by H_p:
 * copies `architecture` and `method`, allocates the arrays zeroed (groups
 * adjacent, budgets 0 — the caller fills them in and then calls
 * pf_profile_finish). Returns 0, TG_EINVAL (bad sizes, H_p not dividing H)
 * or TG_ENOMEM; on failure *p is left freed. The caller owns *p and must
 * call pf_profile_free. Any thread. */
int pf_profile_init(struct pf_profile *p, const char *architecture,
                    const char *method, int num_layers, int num_kv_heads,
                    int head_dim, int heads_per_group, char *err,
                    size_t errlen);

/* Initializes *p as the full-KV profile ("none"): every budget and mean 1,
 * std 0, samples 0, alpha 0, target_ratio 1, method "none", adjacent (=
 * clustered, all budgets being equal) groups. Same contract as
 * pf_profile_init. */
int pf_profile_init_full(struct pf_profile *p, int num_layers,
                         int num_kv_heads, int head_dim, int heads_per_group,
                         char *err, size_t errlen);

/* Returns the heads per group a full-KV layout of H heads uses when
 * `wanted` are asked for: the largest divisor of H not above `wanted`
 * (groups must partition the heads), at least 1. */
int pf_full_heads_per_group(int num_kv_heads, int wanted);

/* Releases everything *p owns and zeroes it. Safe on a zeroed, half-built
 * or already freed profile. */
void pf_profile_free(struct pf_profile *p);

/* Recomputes group_budget from budget and groups, then checks the whole
 * profile (pf_profile_validate). Call after filling arrays by hand.
 * Returns 0 or the validation error. */
int pf_profile_finish(struct pf_profile *p, char *err, size_t errlen);

/* Checks the invariants of a profile in memory: sizes, H_p | H, budgets in
 * [1/1024, 1], mean/std in [0, 1], every layer's groups a partition of
 * 0..H-1 into G lists of H_p heads, group_budget = max of members. Errors
 * name the field as it appears in the file. Returns 0 or TG_EFORMAT /
 * TG_ERANGE. Read-only; any thread. */
int pf_profile_validate(const struct pf_profile *p, char *err, size_t errlen);

/* Fills *p from the parsed document `doc` (borrowed). Every field is
 * checked with a message naming it; "grouping" may be absent (then
 * "clustered", the DESIGN.md §4.2 example omits it). Returns 0,
 * TG_ENOTFOUND (missing field), TG_EFORMAT, TG_ERANGE or TG_ENOMEM; on
 * failure *p is left freed. */
int pf_profile_from_json(struct pf_profile *p, const json_t *doc, char *err,
                         size_t errlen);

/* Loads and validates the profile file at `path` (pf_profile_from_json).
 * Also TG_ENOENT / TG_EIO for unreadable files, TG_EFORMAT for bad JSON. */
int pf_profile_load(struct pf_profile *p, const char *path, char *err,
                    size_t errlen);

/* Sets (a copy of) p's model identity; NULL clears it. Returns 0, TG_EINVAL
 * (not an identity, pf_identity_valid) or TG_ENOMEM. */
int pf_profile_set_identity(struct pf_profile *p, const char *identity,
                            char *err, size_t errlen);

/* Checks that profile p (loaded from `path`, for messages) fits the model
 * mc: the same num_layers, num_kv_heads and head_dim (else TG_EINVAL naming
 * both shapes), and the same model identity (pf_identity.h). An identity
 * that differs is TG_EINVAL naming both identities and the way out, unless
 * `force`: then 0 with a warning in warn. A profile without an identity is
 * accepted with a warning in warn. warn (may be NULL) gets "" when there is
 * nothing to say; the caller logs it. Any thread. */
int pf_profile_check_model(const struct pf_profile *p, const char *path,
                           const struct mc_model_config *mc, int force,
                           char *warn, size_t warnlen, char *err,
                           size_t errlen);

/* The profile a whole model is served with, as the router, every worker
 * rank, tangram-generate and tangramd's start-up checks all build it: path
 * NULL, "" or "none" (any case) gives the full-KV profile of mc's
 * num_layers x num_kv_heads x head_dim with
 * pf_full_heads_per_group(H, heads_per_group) heads per group; otherwise
 * the file at path, which must fit mc (pf_profile_check_model with `force`
 * and `warn`). Returns 0 or pf_profile_load's / pf_profile_init_full's /
 * pf_profile_check_model's codes; on failure *p is left freed. Any
 * thread. */
int pf_profile_for_model(struct pf_profile *p, const char *path,
                         const struct mc_model_config *mc,
                         int heads_per_group, int force, char *warn,
                         size_t warnlen, char *err, size_t errlen);

/* Builds the JSON document of *p in the file format above; *out is a new
 * reference the caller decrefs. Returns 0 or TG_ENOMEM. */
int pf_profile_to_json(const struct pf_profile *p, json_t **out, char *err,
                       size_t errlen);

/* Writes *p to `path` atomically (temp file + rename). Returns 0, TG_EIO or
 * TG_ENOMEM. */
int pf_profile_save(const struct pf_profile *p, const char *path, char *err,
                    size_t errlen);

/* Returns the H_p head indices of group g of layer l (borrowed). */
const int *pf_profile_group(const struct pf_profile *p, int layer, int group);

/* Returns b[l][g], the budget every head of group g of layer l keeps. */
double pf_profile_group_budget(const struct pf_profile *p, int layer,
                               int group);

#endif /* PF_PROFILE_H */
