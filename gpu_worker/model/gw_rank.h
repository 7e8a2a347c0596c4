/*
 * gw_rank.h — the parts of one tensor-parallel rank that every user of a
 * model builds the same way (a worker rank, gpu_worker/serve/gw_worker.h;
 * in-process generation and calibration, gpu_worker/engine/): the rank's
 * profile and page layout (kv_layout_for_rank, as the router builds it,
 * so their page math agrees), its model shard with its heads in that
 * order, the scoring method, and its decode-time compression caps.
 *
 * Not thread-safe for the same parts; nothing is shared between calls.
 */
#ifndef GW_RANK_H
#define GW_RANK_H

#include <stddef.h>

#include "common/kv/kv_layout.h"
#include "common/profile/pf_profile.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/model/gw_trig.h"
#include "kernels/tg_ops.h"

/* What names a rank's parts. */
struct gw_rank_opts {
    const char *model_dir;    /* Hugging Face model directory */
    const char *profile_path; /* profile JSON; NULL or "none" = full KV */
    int profile_force;        /* use a profile made for another model
                                 (pf_profile_check_model) with a warning */
    int heads_per_group;      /* H_p when there is no profile */
    int page_size;            /* P tokens */
    int prefill_chunk;        /* C tokens */
    const char *method;       /* NULL: the profile's (snapkv for none) */
    int rank;                 /* 0 .. world_size - 1 */
    int world_size;           /* T; <= 1: one rank */
    int no_host_weights;      /* the model's shape (gw_model_open) without
                                 host weights, for a backend that streams
                                 the checkpoint into its own memory (CUDA) */
    enum gw_weights weights;  /* the host weights' format (gw_model.h;
                                 AUTO when 0) */
};

/* Parses "snapkv" / "keydiff" / "expected_attention" / "gvote" into *out.
 * Returns 0 or TG_EINVAL. */
int gw_method_parse(const char *s, enum tg_score_method *out);

/* The parts every user of a model builds the same way, for rank o->rank
 * of o->world_size (T; one code path for T = 1): reads the model's config
 * at o->model_dir, loads the profile at o->profile_path (NULL or "none":
 * full KV with pf_full_heads_per_group(H, o->heads_per_group) heads per
 * group) and checks they match, assigns groups to ranks (pf_tp_assign)
 * and makes *profile the rank's profile (pf_profile_rank; with T = 1 the
 * whole profile with heads renumbered in group order), loads the rank's
 * model shard whose heads follow that order (gw_model_load_shard; only
 * gw_model_open's shape with o->no_host_weights),
 * resolves the scoring method (o->method, else the profile's, snapkv for
 * none) and builds the page layout for o->page_size and o->prefill_chunk.
 * Router and worker build rank profiles the same way, so their page math
 * agrees. Returns 0 or an error naming the problem (TG_EINVAL for a T
 * that does not divide the groups, heads or ffn); on failure every part
 * is left freed (zeroed). The caller frees the parts with kv_layout_free,
 * pf_profile_free and gw_model_free. */
int gw_rank_load(struct gw_model *model, struct pf_profile *profile,
                 struct kv_layout *layout, enum tg_score_method *method,
                 const struct gw_rank_opts *o, char *err, size_t errlen);

/* gw_rank_load that also hands over the (L, Hkv/T) model KV head of each
 * of the rank's heads in *global_head (malloc'd, the caller frees it;
 * NULL on failure). */
int gw_rank_load_map(struct gw_model *model, struct pf_profile *profile,
                     struct kv_layout *layout, enum tg_score_method *method,
                     int **global_head, const struct gw_rank_opts *o, char *err,
                     size_t errlen);

/* Decode-time compression of a rank (§4.9) as every user builds it:
 * statistics from stats_path (a profile file of the same model, heads
 * renumbered to the rank by global_head; its statistics go into *own) or
 * else the rank profile's own, then gw_trig_cfg_init. Missing
 * statistics are a TG_EINVAL naming the fix. *c borrows the statistics
 * (*own or the profile's) and m's frequencies. */
int gw_rank_trig_init(struct gw_trig_cfg *c, struct pf_trig *own,
                      const struct gw_trig_opts *o, const char *stats_path,
                      const struct pf_profile *profile,
                      const struct kv_layout *layout, const struct gw_model *m,
                      const int *global_head, char *err, size_t errlen);

#endif /* GW_RANK_H */
