/* gw_rank.c — a rank's profile, layout, model shard, method and
 * decode-time compression caps (see gw_rank.h). */
#include "gpu_worker/model/gw_rank.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "common/base/tg_path.h"
#include "common/kv/kv_trig.h"

int gw_method_parse(const char *s, enum tg_score_method *out)
{
    if (strcmp(s, "snapkv") == 0)
        *out = TG_SCORE_SNAPKV;
    else if (strcmp(s, "keydiff") == 0)
        *out = TG_SCORE_KEYDIFF;
    else if (strcmp(s, "expected_attention") == 0)
        *out = TG_SCORE_EXPECTED_ATTENTION;
    else if (strcmp(s, "gvote") == 0)
        *out = TG_SCORE_GVOTE;
    else
        return TG_EINVAL;
    return 0;
}

int gw_rank_load(struct gw_model *model, struct pf_profile *profile,
                 struct kv_layout *layout, enum tg_score_method *method,
                 const struct gw_rank_opts *o, char *err, size_t errlen)
{
    int *map = NULL;
    int rc = gw_rank_load_map(model, profile, layout, method, &map, o, err,
                              errlen);
    free(map);
    return rc;
}

int gw_rank_load_map(struct gw_model *model, struct pf_profile *profile,
                     struct kv_layout *layout, enum tg_score_method *method,
                     int **global_head_out, const struct gw_rank_opts *o,
                     char *err, size_t errlen)
{
    *global_head_out = NULL;
    memset(model, 0, sizeof(*model));
    memset(profile, 0, sizeof(*profile));
    memset(layout, 0, sizeof(*layout));
    int T = o->world_size > 1 ? o->world_size : 1;
    if (o->rank < 0 || o->rank >= T)
        return tg_err_set(err, errlen, TG_EINVAL, "rank %d is outside [0, %d)",
                          o->rank, T);
    struct mc_model_config cfg;
    char path[4096];
    int rc = tg_path_fmt(path, sizeof(path), err, errlen, "%s/config.json",
                         o->model_dir);
    if (rc == 0)
        rc = mc_model_config_load(&cfg, path, err, errlen);
    if (rc != 0)
        return rc;
    int full = o->profile_path == NULL || strcmp(o->profile_path, "none") == 0;
    struct pf_profile whole = {0};
    int *global_head = NULL;
    char warn[768];
    rc = pf_profile_for_model(&whole, full ? NULL : o->profile_path, &cfg,
                              o->heads_per_group, o->profile_force, warn,
                              sizeof(warn), err, errlen);
    if (rc != 0)
        goto fail;
    if (warn[0] != '\0')
        log_warn("%s", warn);

    const char *name = o->method;
    if (name == NULL)
        name = full ? "snapkv" : whole.method;
    if (gw_method_parse(name, method) != 0) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "unknown scoring method '%s' (snapkv, keydiff, "
                        "expected_attention, gvote)",
                        name);
        goto fail;
    }
    /* §4.7: the rank's groups, its heads in group order and its layout,
     * built as the router builds it (kv_layout_for_rank). Every method
     * forces the same keys (window + sinks), so the reservation math of
     * §4.3 holds for all of them. */
    global_head = malloc((size_t)cfg.num_layers * (size_t)cfg.num_kv_heads *
                         sizeof(int));
    if (global_head == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto fail;
    }
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    rc = kv_layout_for_rank(layout, profile, global_head, &whole, T, o->rank,
                            o->page_size, o->prefill_chunk, &rule, err, errlen);
    if (rc != 0)
        goto fail;
    struct gw_shard sh = {.rank = o->rank,
                          .world = T,
                          .kv_heads = global_head,
                          .weights = o->weights};
    rc = o->no_host_weights
             ? gw_model_open(model, o->model_dir, &sh, err, errlen)
             : gw_model_load_shard(model, o->model_dir, &sh, err, errlen);
    if (rc != 0)
        goto fail;
    *global_head_out = global_head;
    pf_profile_free(&whole);
    return 0;
fail:
    free(global_head);
    pf_profile_free(&whole);
    kv_layout_free(layout);
    pf_profile_free(profile);
    gw_model_free(model);
    return rc;
}

int gw_rank_trig_init(struct gw_trig_cfg *c, struct pf_trig *own,
                      const struct gw_trig_opts *o, const char *stats_path,
                      const struct pf_profile *profile,
                      const struct kv_layout *layout, const struct gw_model *m,
                      const int *global_head, char *err, size_t errlen)
{
    memset(own, 0, sizeof(*own));
    const struct pf_trig *stats = &profile->trig;
    if (stats_path != NULL && stats_path[0] != '\0') {
        /* Statistics of another profile file (a profile-less run has
         * none of its own): the same model shape, heads renumbered to
         * the rank's order. */
        struct pf_profile sp;
        int rc = pf_profile_load(&sp, stats_path, err, errlen);
        if (rc != 0)
            return rc;
        if (sp.num_layers != m->n_layers || sp.head_dim != m->head_dim ||
            sp.num_kv_heads != m->n_kv_heads * (m->world > 1 ? m->world : 1)) {
            pf_profile_free(&sp);
            return tg_err_set(err, errlen, TG_EINVAL,
                              "trig statistics file %s is for L=%d H=%d "
                              "d=%d, not this model",
                              stats_path, sp.num_layers, sp.num_kv_heads,
                              sp.head_dim);
        }
        if (sp.trig.num_q_heads == 0) {
            pf_profile_free(&sp);
            return tg_err_set(err, errlen, TG_EINVAL,
                              "%s has no trig statistics (tangram-profile "
                              "calibrate --trig)",
                              stats_path);
        }
        rc = pf_trig_rank(own, &sp.trig, m->n_layers, sp.num_kv_heads,
                          layout->n_kv_heads, global_head, err, errlen);
        pf_profile_free(&sp);
        if (rc != 0)
            return rc;
        stats = own;
    } else if (stats->num_q_heads == 0) {
        return tg_err_set(
            err, errlen, TG_EINVAL, "%s",
            kv_trig_no_stats_reason(strcmp(profile->method, "none") == 0));
    }
    int rc = gw_trig_cfg_init(c, o, profile, layout, stats, m->n_q_heads,
                              m->inv_freq, err, errlen);
    if (rc != 0)
        pf_trig_free(own);
    return rc;
}
