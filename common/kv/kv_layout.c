/* kv_layout.c — one rank's ragged KV layout (kv_layout.h). */
#include "common/kv/kv_layout.h"

#include <stdlib.h>
#include <string.h>

#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"

#define ROWS_MAX (1 << 24)

int kv_layout_init(struct kv_layout *layout, int n_layers, int n_groups,
                   int heads_per_group, int head_dim, int page_size,
                   int prefill_chunk, const struct kv_forced_rule *rule,
                   const double *group_budget, char *err, size_t errlen)
{
    memset(layout, 0, sizeof(*layout));
    if (n_layers < 1 || n_groups < 1 || heads_per_group < 1 || head_dim < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_layout: L=%d G=%d H_p=%d d=%d must all be >= 1",
                          n_layers, n_groups, heads_per_group, head_dim);
    if (page_size < 1 || prefill_chunk < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_layout: page size %d and prefill chunk %d must "
                          "be >= 1", page_size, prefill_chunk);
    if ((int64_t)n_layers * n_groups > ROWS_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_layout: %d x %d (layer, group) rows is too many",
                          n_layers, n_groups);
    if (rule == NULL || rule->window < 0 || rule->n_sink < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_layout: forced-key rule missing or negative");
    if (group_budget == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_layout: group budgets missing");
    size_t rows = (size_t)n_layers * (size_t)n_groups;
    for (size_t r = 0; r < rows; r++) {
        double b = group_budget[r];
        /* Written as !(b > 0) so NaN is rejected too. */
        if (!(b > 0.0) || b > 1.0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_layout: budget of layer %zu group %zu is %g, "
                              "outside (0, 1]",
                              r / (size_t)n_groups, r % (size_t)n_groups, b);
    }
    layout->group_budget = malloc(rows * sizeof(double));
    if (layout->group_budget == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_layout: cannot copy %zu budgets", rows);
    memcpy(layout->group_budget, group_budget, rows * sizeof(double));
    layout->n_layers = n_layers;
    layout->n_groups = n_groups;
    layout->heads_per_group = heads_per_group;
    layout->head_dim = head_dim;
    layout->page_size = page_size;
    layout->prefill_chunk = prefill_chunk;
    layout->rule = *rule;
    return 0;
}

void kv_layout_free(struct kv_layout *layout)
{
    free(layout->group_budget);
    free(layout->head_group);
    free(layout->head_slot);
    memset(layout, 0, sizeof(*layout));
}

int64_t kv_layout_page_elems(const struct kv_layout *layout)
{
    return (int64_t)layout->heads_per_group * 2 * layout->page_size *
           layout->head_dim;
}

int kv_layout_from_profile(struct kv_layout *layout,
                           const struct pf_profile *p, int page_size,
                           int prefill_chunk,
                           const struct kv_forced_rule *rule, char *err,
                           size_t errlen)
{
    memset(layout, 0, sizeof(*layout));
    if (page_size <= 0 || page_size > 4096)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page size %d outside [1, 4096]", page_size);
    if (p->num_groups > KV_MAX_GROUPS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%d groups per layer (max %d)", p->num_groups,
                          KV_MAX_GROUPS);
    int rc = kv_layout_init(layout, p->num_layers, p->num_groups,
                            p->heads_per_group, p->head_dim, page_size,
                            prefill_chunk, rule, p->group_budget, err, errlen);
    if (rc != 0)
        return rc;
    size_t L = (size_t)p->num_layers, H = (size_t)p->num_kv_heads;
    size_t G = (size_t)p->num_groups;
    layout->head_group = malloc(L * H * sizeof(int32_t));
    layout->head_slot = malloc(L * H * sizeof(int32_t));
    if (!layout->head_group || !layout->head_slot) {
        kv_layout_free(layout);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    layout->n_kv_heads = p->num_kv_heads;
    layout->compress = 0;
    for (size_t l = 0; l < L; l++) {
        for (size_t g = 0; g < G; g++) {
            const int *heads = pf_profile_group(p, (int)l, (int)g);
            for (int j = 0; j < p->heads_per_group; j++) {
                layout->head_group[l * H + (size_t)heads[j]] = (int32_t)g;
                layout->head_slot[l * H + (size_t)heads[j]] = j;
            }
            if (layout->group_budget[l * G + g] < 1.0)
                layout->compress = 1;
        }
    }
    return 0;
}

int kv_layout_for_rank(struct kv_layout *layout,
                       struct pf_profile *rank_profile, int *global_head,
                       const struct pf_profile *whole, int ranks, int rank,
                       int page_size, int prefill_chunk,
                       const struct kv_forced_rule *rule, char *err,
                       size_t errlen)
{
    memset(layout, 0, sizeof(*layout));
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rank %d is outside [0, %d)", rank, ranks);
    struct pf_tp_plan plan;
    struct pf_profile rp;
    memset(&plan, 0, sizeof(plan));
    memset(&rp, 0, sizeof(rp));
    int *heads = global_head;
    int rc = pf_tp_assign(&plan, whole, ranks, err, errlen);
    if (rc != 0)
        return rc;
    if (heads == NULL) {
        heads = malloc((size_t)whole->num_layers *
                       (size_t)plan.heads_per_rank * sizeof(int));
        if (heads == NULL) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            goto out;
        }
    }
    rc = pf_profile_rank(&rp, heads, whole, &plan, rank, err, errlen);
    if (rc == 0)
        rc = kv_layout_from_profile(layout, &rp, page_size, prefill_chunk,
                                    rule, err, errlen);
    if (rc == 0 && rank_profile != NULL) {
        *rank_profile = rp; /* handed over */
        memset(&rp, 0, sizeof(rp));
    }
out:
    if (heads != global_head)
        free(heads);
    pf_profile_free(&rp);
    pf_tp_free(&plan);
    return rc;
}
