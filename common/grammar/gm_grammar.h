/*
 * gm_grammar.h — a compiled grammar: the pushdown automaton over bytes
 * and its token-mask caches for one vocabulary, immutable and shared by
 * reference count.
 *
 * Compiling runs four stages, each bounded by struct gm_limits:
 *   1. the constraint (a spec, gm_spec.h, or an IR built by hand) is
 *      written as grammar IR (gm_ir.h);
 *   2. the IR becomes an epsilon-free NFA per rule with call edges — a
 *      pushdown automaton over bytes; unproductive alternatives are
 *      dropped, a start rule without any document and left recursion are
 *      refused;
 *   3. nodes are grouped into classes that behave alike on every byte
 *      string as long as the longest token (bounded bisimulation), so the
 *      positions of a long maxLength string that are further than a
 *      token from its bounds share one cache, and a class that agrees
 *      with an earlier one on shorter strings walks only the longer
 *      tokens;
 *   4. for each class, the vocabulary trie is walked once from one of its
 *      nodes, with the stack below the node's rule unknown: tokens that
 *      stay inside are accepted or rejected for good (XGrammar's
 *      "context-independent" tokens, its adaptive token mask cache, Dong
 *      et al. 2024 §3.1); tokens that leave the rule keep only their
 *      suffix after the rule's end, filtered by the bytes that may follow
 *      the rule anywhere (its "context expansion", §3.2), and are decided
 *      per step against the real stack (gm_matcher.h).
 *
 * Threads: compile on any thread; a compiled grammar is read-only and
 * may be used by any number of matchers on any threads at once. The
 * vocabulary is borrowed and must outlive every grammar compiled with it.
 */
#ifndef GM_GRAMMAR_H
#define GM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_ir.h"
#include "common/grammar/gm_vocab.h"

/* What one compile may take. Exceeding one is TG_ETOOBIG (sizes) or
 * TG_ETIMEDOUT (time), naming the limit; a server answers both with 400. */
struct gm_limits {
    size_t max_spec_bytes; /* the spec's JSON text (gm_spec.h) */
    int max_depth;         /* nesting of a JSON Schema */
    uint32_t max_count;    /* min/maxLength, min/maxItems cap (gm_schema.h) */
    size_t max_exprs;      /* IR expressions and operands */
    size_t max_nodes;      /* automaton nodes */
    size_t max_cache_bytes; /* memory of the token-mask caches */
    double max_compile_s;  /* wall time of a compile */
    int ws_indent;         /* JSON whitespace bound (gm_json.h) */
    int threads;           /* threads of the cache stage, 0: OpenMP's
                              default (OMP_NUM_THREADS or the cores) */
};

#define GM_LIMIT_SPEC_BYTES (256u * 1024u)
#define GM_LIMIT_EXPRS 500000u
#define GM_LIMIT_NODES 1000000u
#define GM_LIMIT_CACHE_BYTES (512u << 20)
#define GM_LIMIT_COMPILE_S 10.0

/* Fills *l with the defaults: GM_LIMIT_*, GM_SCHEMA_MAX_DEPTH,
 * GM_SCHEMA_MAX_COUNT, GM_WS_INDENT_DEFAULT, threads 0. */
void gm_limits_default(struct gm_limits *l);

struct gm_grammar_stats {
    size_t n_exprs;      /* IR size */
    int32_t n_rules;
    int32_t n_nodes;     /* automaton */
    size_t n_edges, n_calls;
    int32_t n_classes;   /* token-cache classes (stage 3) */
    size_t n_uncertain;  /* suffix-trie nodes over all classes */
    size_t cache_bytes;  /* memory of the token caches */
    size_t bytes;        /* memory of the whole grammar */
    uint32_t min_doc_bytes; /* the shortest document */
    double t_ir_s, t_pda_s, t_sig_s, t_cache_s; /* seconds per stage */
};

struct gm_grammar; /* opaque */

/* Compiles the IR `ir` (its start rule set) for vocabulary v. On success
 * *out is a new grammar with one reference (release with
 * gm_grammar_unref). Returns 0 or TG_EINVAL (no document satisfies the
 * grammar; a left-recursive rule), TG_ETOOBIG, TG_ETIMEDOUT, TG_ENOMEM,
 * with detail in err. `lim` NULL: defaults. Any thread. */
int gm_grammar_compile_ir(const struct gm_ir *ir, const struct gm_vocab *v,
                          const struct gm_limits *lim,
                          struct gm_grammar **out, char *err, size_t errlen);

/* Adds a reference and returns g. Any thread. */
struct gm_grammar *gm_grammar_ref(struct gm_grammar *g);

/* Drops a reference; the last one frees the grammar. NULL is a no-op. */
void gm_grammar_unref(struct gm_grammar *g);

/* Sizes and timings of g (borrowed). */
const struct gm_grammar_stats *gm_grammar_stats(const struct gm_grammar *g);

#endif /* GM_GRAMMAR_H */
