/* rt_server_trig.c — the router's start-up of decode-time compression
 * (`--decode-compress trig`, DESIGN.md §4.9): its conditions, checked
 * before any worker starts so that a misconfiguration is one clear line,
 * and every rank's caps for the scheduler (see rt_server.h). */
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_trig.h"
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/core/rt_server_internal.h"

/* The statistics trig scores with: --trig-stats names a profile file of
 * the same model, else the profile's own. Only their presence and shape
 * matter here; the workers load them. */
static int check_stats(const struct rt_server *s, char *err, size_t errlen)
{
    const struct tg_serve_opts *o = s->opts;
    const struct mc_model_config *mc = &s->mc;
    if (o->trig_stats != NULL && o->trig_stats[0] != '\0') {
        struct pf_profile sp;
        int rc = pf_profile_load(&sp, o->trig_stats, err, errlen);
        if (rc != 0)
            return rc;
        int ok = sp.trig.num_q_heads == mc->num_heads &&
                 sp.num_layers == mc->num_layers &&
                 sp.num_kv_heads == mc->num_kv_heads &&
                 sp.trig.half == mc->head_dim / 2;
        int have = sp.trig.num_q_heads > 0;
        char warn[768];
        int idr = ok ? pf_profile_check_model(&sp, o->trig_stats, mc,
                                              o->profile_force, warn,
                                              sizeof(warn), err, errlen)
                     : 0;
        pf_profile_free(&sp);
        if (idr != 0)
            return idr;
        if (ok && warn[0] != '\0')
            log_warn("--trig-stats: %s", warn);
        if (!have)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--trig-stats %s has no trig statistics "
                              "(tangram-profile calibrate --trig)",
                              o->trig_stats);
        if (!ok)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--trig-stats %s is not for this model (L=%d, "
                              "%d query heads, %d KV heads, d=%d)",
                              o->trig_stats, mc->num_layers, mc->num_heads,
                              mc->num_kv_heads, mc->head_dim);
        return 0;
    }
    if (s->profile.trig.num_q_heads == 0)
        return tg_err_set(err, errlen, TG_EINVAL, "%s",
                          kv_trig_no_stats_reason(
                              strcmp(s->profile.method, "none") == 0));
    return 0;
}

int rt_server__trig_init(struct rt_server *s, char *err, size_t errlen)
{
    const struct tg_serve_opts *o = s->opts;
    if (o->decode_compress != TG_DECODE_COMPRESS_TRIG)
        return 0;
    struct kv_trig_opts ko = {.enabled = 1,
                              .budget = o->decode_budget,
                              .uniform = o->decode_budget_uniform,
                              .every = (int)o->decode_every,
                              .window = (int)o->decode_window};
    int rc = kv_trig_opts_check(&ko, err, errlen);
    if (rc == 0)
        rc = check_stats(s, err, errlen);
    if (rc != 0)
        return rc;
    const int T = (int)o->tp;
    s->rank_trig = calloc((size_t)T, sizeof(s->rank_trig[0]));
    s->rank_trig_ptrs = calloc((size_t)T, sizeof(s->rank_trig_ptrs[0]));
    if (s->rank_trig == NULL || s->rank_trig_ptrs == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    for (int r = 0; r < T && rc == 0; r++) {
        /* The rank's own profile (its heads' budgets over the whole
         * model's means), exactly as its worker computes its caps. */
        struct kv_layout lay;
        struct pf_profile rp;
        rc = kv_layout_for_rank(&lay, &rp, NULL, &s->profile, T, r,
                                (int)o->page_size, (int)o->prefill_chunk,
                                &rule, err, errlen);
        if (rc != 0)
            break;
        rc = kv_trig_init(&s->rank_trig[r], &ko, &rp, &lay, err, errlen);
        s->rank_trig_ptrs[r] = &s->rank_trig[r];
        kv_layout_free(&lay);
        pf_profile_free(&rp);
    }
    return rc;
}

void rt_server__trig_free(struct rt_server *s)
{
    for (int64_t r = 0; s->rank_trig != NULL && r < s->opts->tp; r++)
        kv_trig_free(&s->rank_trig[r]);
    free(s->rank_trig);
    free(s->rank_trig_ptrs);
    s->rank_trig = NULL;
    s->rank_trig_ptrs = NULL;
}
