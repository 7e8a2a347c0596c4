/* gm_grammar.c — compiling an IR into a grammar with token-mask caches,
 * and the grammar's reference count (gm_grammar.h). */
#include "common/grammar/gm_grammar.h"

#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_internal.h"
#include "common/grammar/gm_json.h"
#include "common/grammar/gm_schema.h"
#include "common/base/tg_err.h"

void gm_limits_default(struct gm_limits *l)
{
    l->max_spec_bytes = GM_LIMIT_SPEC_BYTES;
    l->max_depth = GM_SCHEMA_MAX_DEPTH;
    l->max_count = GM_SCHEMA_MAX_COUNT;
    l->max_exprs = GM_LIMIT_EXPRS;
    l->max_nodes = GM_LIMIT_NODES;
    l->max_cache_bytes = GM_LIMIT_CACHE_BYTES;
    l->max_compile_s = GM_LIMIT_COMPILE_S;
    l->ws_indent = GM_WS_INDENT_DEFAULT;
    l->threads = 0;
}

static void grammar_free(struct gm_grammar *g)
{
    gm__pda_free(&g->pda);
    free(g->tc);
    free(g->tc_ids);
    free(g->tc_words);
    free(g->sfx);
    free(g->sfx_ids);
    free(g);
}

int gm_grammar_compile_ir(const struct gm_ir *ir, const struct gm_vocab *v,
                          const struct gm_limits *lim,
                          struct gm_grammar **out, char *err, size_t errlen)
{
    struct gm_limits dl;
    if (lim == NULL) {
        gm_limits_default(&dl);
        lim = &dl;
    }
    double deadline = lim->max_compile_s > 0 ? gm__now() + lim->max_compile_s
                                             : 0;
    return gm__grammar_compile(ir, v, lim, deadline, out, err, errlen);
}

int gm__grammar_compile(const struct gm_ir *ir, const struct gm_vocab *v,
                        const struct gm_limits *lim, double deadline,
                        struct gm_grammar **out, char *err, size_t errlen)
{
    struct gm_limits dl;
    if (lim == NULL) {
        gm_limits_default(&dl);
        lim = &dl;
    }
    *out = NULL;
    if (ir->err != 0)
        return gm_ir_error(ir, err, errlen);
    double t0 = gm__now();
    if (deadline > 0 && t0 > deadline)
        return tg_err_set(err, errlen, TG_ETIMEDOUT,
                          "grammar compile took longer than its limit of "
                          "%.3g s",
                          lim->max_compile_s);
    struct gm_grammar *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "grammar: out of memory");
    atomic_init(&g->refs, 1);
    g->vocab = v;
    int rc = gm__pda_build(&g->pda, ir, lim->max_nodes, deadline, err, errlen);
    double t1 = gm__now();
    if (rc == 0) {
        rc = gm__sig_build(&g->pda, v->max_len + 1, deadline);
        if (rc == TG_ETIMEDOUT)
            tg_err_set(err, errlen, rc,
                       "grammar compile took longer than its limit of %.3g s",
                       lim->max_compile_s);
        else if (rc != 0)
            tg_err_set(err, errlen, rc, "grammar: out of memory");
    }
    double t2 = gm__now();
    if (rc == 0)
        rc = gm__tcache_build(g, deadline, lim->threads, lim->max_cache_bytes,
                              err, errlen);
    double t3 = gm__now();
    if (rc != 0) {
        grammar_free(g);
        return rc;
    }
    struct gm_grammar_stats *s = &g->stats;
    s->n_exprs = ir->n_expr + ir->n_items;
    s->n_rules = g->pda.n_rule;
    s->n_nodes = g->pda.n_node;
    s->n_edges = g->pda.n_edge;
    s->n_calls = g->pda.n_call;
    s->n_classes = g->pda.n_sig;
    s->min_doc_bytes = g->pda.minfin[g->pda.start];
    const struct gm__pda *p = &g->pda;
    s->bytes = sizeof(*g) + s->cache_bytes +
               (size_t)p->n_node * (sizeof(*p->node) + 2 * sizeof(int32_t)) +
               p->n_edge * sizeof(*p->edge) + p->n_call * sizeof(*p->call) +
               p->n_cls * 32 + p->n_dense * 256 * sizeof(int32_t) +
               (size_t)p->n_rule * (32 + sizeof(int32_t) + 16);
    s->t_pda_s = t1 - t0;
    s->t_sig_s = t2 - t1;
    s->t_cache_s = t3 - t2;
    *out = g;
    return 0;
}

struct gm_grammar *gm_grammar_ref(struct gm_grammar *g)
{
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
    return g;
}

void gm_grammar_unref(struct gm_grammar *g)
{
    if (g == NULL)
        return;
    if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1)
        grammar_free(g);
}

const struct gm_grammar_stats *gm_grammar_stats(const struct gm_grammar *g)
{
    return &g->stats;
}
