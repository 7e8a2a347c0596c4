/* pf_split.c — split map and TP assignment of a profile (pf_split.h). */
#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- split map (Algorithm 1) ------------------------------------------ */

int pf_split_layer(const double *budget, int H, const int *groups,
                   int heads_per_group, int n_cta, int *splits, char *err,
                   size_t errlen)
{
    if (n_cta < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "n_cta: %d must be at least 1", n_cta);
    if (H < 1 || heads_per_group < 1 || H % heads_per_group != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "heads_per_group: %d does not divide num_kv_heads %d",
                          heads_per_group, H);
    /* Exactly as Algorithm 1 writes it: Omega in head order, tau = Omega /
     * N_CTA, then Phi / tau, so an outside reference gets the same bits. */
    double omega = 0.0;
    for (int h = 0; h < H; h++)
        omega += budget[h];
    if (!(omega > 0.0))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "budgets: layer total %g is not positive", omega);
    double tau = omega / (double)n_cta;
    int G = H / heads_per_group;
    for (int g = 0; g < G; g++) {
        double phi = 0.0;
        for (int j = 0; j < heads_per_group; j++)
            phi += budget[groups[g * heads_per_group + j]];
        double s = round(phi / tau); /* half away from zero (C99 round) */
        /* phi <= omega, so s <= n_cta fits an int. */
        splits[g] = s < 1.0 ? 1 : (int)s;
    }
    return 0;
}

int pf_split_map(const struct pf_profile *p, int n_cta, int *splits,
                 char *err, size_t errlen)
{
    int H = p->num_kv_heads, G = p->num_groups;
    for (int l = 0; l < p->num_layers; l++) {
        int rc = pf_split_layer(p->budget + (size_t)l * (size_t)H, H,
                                p->groups + (size_t)l * (size_t)H,
                                p->heads_per_group, n_cta,
                                splits + (size_t)l * (size_t)G, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- tensor parallelism ------------------------------------------------ */

void pf_tp_free(struct pf_tp_plan *plan)
{
    if (plan == NULL)
        return;
    free(plan->groups);
    free(plan->heads);
    free(plan->rank_budget);
    memset(plan, 0, sizeof(*plan));
}

const int *pf_tp_heads(const struct pf_tp_plan *plan, int rank, int layer)
{
    return plan->heads + ((size_t)rank * (size_t)plan->num_layers +
                          (size_t)layer) * (size_t)plan->heads_per_rank;
}

const int *pf_tp_groups(const struct pf_tp_plan *plan, int rank, int layer)
{
    return plan->groups + ((size_t)rank * (size_t)plan->num_layers +
                           (size_t)layer) * (size_t)plan->groups_per_rank;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int pf_tp_assign(struct pf_tp_plan *plan, const struct pf_profile *p,
                 int ranks, char *err, size_t errlen)
{
    memset(plan, 0, sizeof(*plan));
    int L = p->num_layers, H = p->num_kv_heads, G = p->num_groups;
    int hp = p->heads_per_group;
    if (ranks < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tp: %d ranks, expected at least 1", ranks);
    if (G % ranks != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tp: %d head groups per layer (num_kv_heads %d / "
                          "heads_per_group %d) cannot be dealt evenly to %d "
                          "ranks", G, H, hp, ranks);
    plan->ranks = ranks;
    plan->num_layers = L;
    plan->groups_per_rank = G / ranks;
    plan->heads_per_rank = H / ranks;
    size_t tl = (size_t)ranks * (size_t)L;
    plan->groups = malloc(tl * (size_t)plan->groups_per_rank * sizeof(int));
    plan->heads = malloc(tl * (size_t)plan->heads_per_rank * sizeof(int));
    plan->rank_budget = calloc(tl, sizeof(double));
    if (plan->groups == NULL || plan->heads == NULL ||
        plan->rank_budget == NULL) {
        pf_tp_free(plan);
        return tg_err_set(err, errlen, TG_ENOMEM, "tp: out of memory");
    }
    for (int l = 0; l < L; l++) {
        const double *b = p->budget + (size_t)l * (size_t)H;
        for (int i = 0; i < G; i++) {
            /* Snake: even rounds deal 0..T-1, odd rounds T-1..0. */
            int round_no = i / ranks, pos = i % ranks;
            int r = (round_no % 2 == 0) ? pos : ranks - 1 - pos;
            int *gr = (int *)pf_tp_groups(plan, r, l);
            gr[round_no] = i;
            int *hd = (int *)pf_tp_heads(plan, r, l);
            const int *heads = pf_profile_group(p, l, i);
            for (int j = 0; j < hp; j++)
                hd[round_no * hp + j] = heads[j];
        }
        for (int r = 0; r < ranks; r++) {
            int *hd = (int *)pf_tp_heads(plan, r, l);
            qsort(hd, (size_t)plan->heads_per_rank, sizeof(int), cmp_int);
            double sum = 0.0;
            for (int j = 0; j < plan->heads_per_rank; j++)
                sum += b[hd[j]];
            plan->rank_budget[(size_t)r * (size_t)L + (size_t)l] = sum;
        }
    }
    return 0;
}

int pf_profile_rank(struct pf_profile *out, int *global_head,
                    const struct pf_profile *p, const struct pf_tp_plan *plan,
                    int rank, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (rank < 0 || rank >= plan->ranks || plan->num_layers != p->num_layers)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tp: rank %d of %d does not fit the plan", rank,
                          plan->ranks);
    int L = p->num_layers, hp = p->heads_per_group;
    int Hr = plan->heads_per_rank, Gr = plan->groups_per_rank;
    int rc = pf_profile_init(out, p->architecture, p->method, L, Hr, p->head_dim,
                             hp, err, errlen);
    if (rc != 0)
        return rc;
    out->samples = p->samples;
    out->target_ratio = p->target_ratio;
    out->alpha = p->alpha;
    out->grouping = p->grouping;
    size_t H = (size_t)p->num_kv_heads;
    for (int l = 0; l < L; l++) {
        const int *gr = pf_tp_groups(plan, rank, l);
        for (int j = 0; j < Gr; j++) {
            const int *heads = pf_profile_group(p, l, gr[j]);
            for (int k = 0; k < hp; k++) {
                int local = j * hp + k, g = heads[k];
                size_t src = (size_t)l * H + (size_t)g;
                size_t dst = (size_t)l * (size_t)Hr + (size_t)local;
                out->mean[dst] = p->mean[src];
                out->std[dst] = p->std[src];
                out->budget[dst] = p->budget[src];
                out->groups[((size_t)l * (size_t)Gr + (size_t)j) * (size_t)hp + (size_t)k] = local;
                global_head[dst] = g;
            }
        }
    }
    rc = pf_trig_rank(&out->trig, &p->trig, L, p->num_kv_heads, Hr,
                      global_head, err, errlen);
    if (rc == 0)
        rc = pf_profile_finish(out, err, errlen);
    /* Decode caps divide by the whole model's mean budget (§4.9). */
    if (rc == 0)
        memcpy(out->budget_mean, p->budget_mean, (size_t)L * sizeof(double));
    if (rc != 0)
        pf_profile_free(out);
    return rc;
}
