/*
 * gm_internal.h — the data the engine's files share: the pushdown
 * automaton compiled from the IR, stacks of return nodes, the walker that
 * steps sets of configurations over bytes, the per-class token-mask
 * caches, and the compiled grammar. Internal to common/grammar.
 *
 * The automaton (gm_pda.c): every rule is an epsilon-free NFA over bytes.
 * A node has byte edges (a 256-bit class -> target node) and call edges
 * (enter rule R at its entry node; when R ends, continue at `ret`). A
 * node is `final` when its rule may end there. Calls always enter a
 * non-nullable entry (a nullable rule gets an entry that is not final
 * plus a bypass at the call site), so every call consumes a byte and the
 * closure below terminates once left recursion is refused.
 *
 * A configuration is (node, stack): the stack holds the return nodes of
 * the calls in progress. Stacks live in a graph-structured stack (GSS,
 * Tomita's device for generalized LR parsing): a vertex stands for "rule
 * R was entered at byte position p" and has links (ret, parent), one per
 * way R was called there: continue at `ret` with stack `parent` when R
 * ends. A configuration points at one vertex, so it stands for every
 * stack the vertex's links spell. Two calls of R at the same position
 * share the vertex whatever called them; that is sound because what R
 * reads from p on does not depend on its caller (the completion step of
 * Earley's parser, Earley 1970, groups items by rule and origin the same
 * way). So an ambiguous grammar (alternatives that read alike, nested)
 * keeps a few configurations per byte instead of one per stack, which
 * would double with every level of nesting.
 *
 * The walker builds the vertices of the calls it makes inside one byte
 * string ("local" vertices, at most one per (rule, depth)) above a "base"
 * that belongs to someone else: the matcher's GSS, or GM__BOUNDARY, the
 * frame of the rule a token-cache walk starts in, whose popping is only
 * recorded (the token then depends on the stack below: "uncertain"). The
 * matcher turns the local vertices its new configurations use into
 * vertices of its own after each token.
 */
#ifndef GM_INTERNAL_H
#define GM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/grammar/gm_grammar.h"
#include "common/grammar/gm_ir.h"
#include "common/grammar/gm_vocab.h"

#define GM__EMPTY (-1)    /* the empty stack */
#define GM__BOUNDARY (-2) /* base of a token-cache walk (see above) */

/* ---- the automaton ------------------------------------------------------ */

struct gm__edge {
    int32_t to;
    uint32_t cls; /* index into gm__pda.cls */
};

struct gm__call {
    int32_t rule;  /* callee */
    int32_t entry; /* its entry node */
    int32_t ret;   /* where the caller continues */
};

struct gm__node {
    uint32_t e0, ne; /* byte edges edge[e0 .. e0 + ne) */
    uint32_t c0, nc; /* call edges call[c0 .. c0 + nc) */
    int32_t rule;
    uint8_t final;
    uint8_t simple;  /* nc == 0 and not final: its closure is itself */
    int32_t dense;   /* its row of gm__pda.dense (256 targets), or -1 */
};

struct gm__pda {
    struct gm__node *node;
    int32_t n_node;
    struct gm__edge *edge;
    size_t n_edge;
    struct gm__call *call;
    size_t n_call;
    uint8_t (*cls)[32]; /* interned byte sets */
    size_t n_cls;
    int32_t *dense; /* n_dense rows of 256 targets (-1 none) */
    size_t n_dense;
    int32_t n_rule;
    char **rule_name;      /* (n_rule) copies of the IR's names */
    int32_t *rule_entry;   /* (n_rule) non-nullable entry, -1 if unused */
    uint8_t (*follow)[32]; /* (n_rule) bytes that may follow the rule */
    int32_t root_rule;
    int32_t start;     /* the root rule's start node (may be final) */
    uint32_t *minfin;  /* (n_node) fewest bytes to the end of its rule */
    int32_t *sig;      /* (n_node) token-cache class */
    int32_t n_sig;
    int32_t *sig_donor; /* (n_sig) an earlier class that agrees with it on
                           tokens shorter than sig_skip bytes, or -1 */
    uint16_t *sig_skip; /* (n_sig) */
};

/* Compiles the IR (root set) into *p (zeroed). Checks: the start rule is
 * productive, no rule is left-recursive, at most max_nodes nodes, done by
 * `deadline` (gm__now() seconds, 0: none; TG_ETIMEDOUT). Returns 0 or a
 * code with detail in err. */
int gm__pda_build(struct gm__pda *p, const struct gm_ir *ir, size_t max_nodes,
                  double deadline, char *err, size_t errlen);
void gm__pda_free(struct gm__pda *p);

/* Splits the nodes into classes of equal token-mask caches: nodes whose
 * behaviour (edges, calls, where the rule may end and what may follow it)
 * agrees on every byte string up to `depth` bytes — bounded bisimulation
 * by partition refinement (Moore's algorithm, `depth` rounds at most).
 * Fills p->sig / p->n_sig, and p->sig_donor / p->sig_skip from the
 * history of the splits. Returns 0, TG_ENOMEM or TG_ETIMEDOUT (past
 * `deadline`, gm__now() seconds; 0 = none). */
int gm__sig_build(struct gm__pda *p, int depth, double deadline);

/* Seconds on CLOCK_MONOTONIC. */
double gm__now(void);

/* ---- stacks --------------------------------------------------------------- */

/* A stack value: a vertex of the base GSS (>= 0), GM__EMPTY,
 * GM__BOUNDARY, or local vertex k of a walker, GM__LOCAL(k). */
#define GM__LOCAL(k) (-3 - (int32_t)(k))
#define GM__IS_LOCAL(s) ((s) <= -3)
#define GM__LOCAL_ID(s) (-3 - (s))

struct gm__link {
    int32_t ret;    /* node to continue at */
    int32_t parent; /* the stack below: a vertex or GM__EMPTY */
};

/* A vertex of the matcher's GSS; its links are contiguous. */
struct gm__vtx {
    int32_t l0, nl; /* links l[l0 .. l0 + nl) */
    uint32_t rest;  /* fewest bytes to empty the stack from any link */
};

struct gm__gss {
    struct gm__vtx *v;
    int32_t n_v, cap_v;
    struct gm__link *l;
    int32_t n_l, cap_l;
};

void gm__gss_free(struct gm__gss *g);
/* Makes *dst (zeroed or freed) a copy of src. Returns 0 or TG_ENOMEM
 * (dst unchanged). */
int gm__gss_copy(struct gm__gss *dst, const struct gm__gss *src);

/* A set of keys of three int32 with a value each, cleared in O(1) by an
 * epoch (open addressing, stamps): the walker's sets of configurations,
 * vertices and links, each alive for one set's construction. */
struct gm__kset {
    int32_t (*key)[4]; /* key[0..2], value key[3] */
    uint32_t *stamp;
    uint32_t mask, epoch;
    size_t n; /* keys of the current epoch */
};

int gm__kset_init(struct gm__kset *k);
void gm__kset_free(struct gm__kset *k);
/* Twice the slots, the keys of the current epoch kept: 0 or TG_ENOMEM. */
int gm__kset_grow(struct gm__kset *k);

/* Empties the set (nothing to do when it is empty). */
static inline void gm__kset_clear(struct gm__kset *k)
{
    if (k->n == 0)
        return;
    if (++k->epoch == 0) {
        memset(k->stamp, 0, ((size_t)k->mask + 1) * sizeof(*k->stamp));
        k->epoch = 1;
    }
    k->n = 0;
}

static inline uint32_t gm__key_hash(int32_t a, int32_t b, int32_t c)
{
    uint64_t h = (uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uint32_t)b * 0xC2B2AE3D27D4EB4Full;
    h ^= (uint64_t)(uint32_t)c * 0x165667B19E3779F9ull;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

/* Finds (a, b, c): 0 and its value in *val; else adds it with value `val0`
 * and returns 1 (*val = val0); TG_ENOMEM. Inline: the walker's every
 * configuration goes through it. */
static inline int gm__kset_put(struct gm__kset *k, int32_t a, int32_t b,
                               int32_t c, int32_t val0, int32_t *val)
{
    if ((k->n + 1) * 2 > (size_t)k->mask + 1 && gm__kset_grow(k) != 0)
        return TG_ENOMEM;
    uint32_t h = gm__key_hash(a, b, c) & k->mask;
    while (k->stamp[h] == k->epoch) {
        const int32_t *x = k->key[h];
        if (x[0] == a && x[1] == b && x[2] == c) {
            *val = x[3];
            return 0;
        }
        h = (h + 1) & k->mask;
    }
    k->stamp[h] = k->epoch;
    k->key[h][0] = a;
    k->key[h][1] = b;
    k->key[h][2] = c;
    k->key[h][3] = val0;
    k->n++;
    *val = val0;
    return 1;
}

/* ---- the walker ------------------------------------------------------------ */

struct gm__cfg {
    int32_t node;
    int32_t stk; /* a stack value (above) */
};

#define GM__POPPED 1u  /* a config left the boundary frame (cache walks) */
#define GM__CAN_END 2u /* a config finished the document */

/* A local link, in its vertex's list. */
struct gm__llink {
    int32_t ret, parent, next; /* next: the vertex's next link, or -1 */
};

/* Sets of configurations by depth: set d holds the closed configurations
 * after d bytes; its first kern[d] entries are the kernel (the targets of
 * the byte edges taken, before closure). The local vertices and links
 * made by set d's closure follow those of the sets before it (lv_end,
 * ll_end), so computing set d + 1 again (a trie walk backing up) drops
 * those of the sets after d at once.
 *
 * Work: every configuration, vertex or link added counts one unit; past
 * work_limit (0: none), or past `deadline` (gm__now() seconds, 0: none;
 * read every 4,096 units), a step or start fails with TG_ETIMEDOUT. The
 * caller resets `work`. */
struct gm__walker {
    const struct gm__pda *p;
    const struct gm__gss *base; /* vertices >= 0 of stacks, or NULL */
    struct gm__cfg *cfg;
    size_t n_cfg, cap_cfg;
    size_t *off;    /* (max_depth + 2) set d = cfg[off[d] .. off[d + 1]) */
    size_t *kern;   /* (max_depth + 1) */
    uint8_t *flags; /* (max_depth + 1) GM__POPPED | GM__CAN_END */
    int max_depth;
    int32_t *lv_first; /* local vertex -> its first link, or -1 */
    size_t n_lv, cap_lv;
    struct gm__llink *ll;
    size_t n_ll, cap_ll;
    size_t *lv_end, *ll_end; /* (max_depth + 1) counts after set d */
    struct gm__kset cset;    /* the configurations of the set being built */
    struct gm__kset vset;    /* its vertices (by rule) and links */
    uint64_t work, work_limit;
    double deadline;
    int naive; /* no fast path: the oracle steps plainly */
};

int gm__walk_init(struct gm__walker *w, const struct gm__pda *p,
                  int max_depth);
void gm__walk_free(struct gm__walker *w);

/* Set 0 = the closure of c[0..n) over the `base` GSS (NULL when the
 * configs use GM__BOUNDARY or GM__EMPTY only). Forgets the local
 * vertices. Returns 0, TG_ENOMEM or TG_ETIMEDOUT. */
int gm__walk_start(struct gm__walker *w, const struct gm__cfg *c, size_t n,
                   const struct gm__gss *base);

/* One unit of work: 0, or TG_ETIMEDOUT once past the limit or the
 * deadline (for the callers' own work, counted with the walk's). */
static inline int gm__walk_spend(struct gm__walker *w)
{
    w->work++;
    if (w->work_limit > 0 && w->work > w->work_limit)
        return TG_ETIMEDOUT;
    if ((w->work & 4095) == 0 && w->deadline > 0 && gm__now() > w->deadline)
        return TG_ETIMEDOUT;
    return 0;
}

/* gm__walk_step without its fast path. */
int gm__walk_step_general(struct gm__walker *w, int d, uint8_t b);

/* Set d + 1 = the closure of set d after byte b (d < max_depth). Returns
 * 1 when it is not empty, 0 when empty, TG_ENOMEM or TG_ETIMEDOUT. Inline
 * for its fast path: one configuration at a node with a dense row whose
 * target needs no closure (inside strings and literals), the step of
 * almost every trie node a token-cache walk visits. A closed set of one
 * configuration reads only that node's byte edges. */
static inline int gm__walk_step(struct gm__walker *w, int d, uint8_t b)
{
    size_t s0 = w->off[d], s1 = w->off[d + 1];
    if (!w->naive && s1 - s0 == 1 && s1 < w->cap_cfg) {
        const struct gm__cfg *c = &w->cfg[s0];
        const struct gm__node *n = &w->p->node[c->node];
        int32_t t = -2;
        if (n->dense >= 0) {
            t = w->p->dense[(size_t)n->dense * 256 + b];
        } else if (n->ne == 1) {
            const struct gm__edge *e = &w->p->edge[n->e0];
            t = (w->p->cls[e->cls][b >> 3] >> (b & 7)) & 1 ? e->to : -1;
        }
        if (t != -2) {
            w->flags[d + 1] = 0;
            w->lv_end[d + 1] = w->lv_end[d];
            w->ll_end[d + 1] = w->ll_end[d];
            if (t < 0) {
                w->n_cfg = s1;
                w->kern[d + 1] = 0;
                w->off[d + 2] = s1;
                return 0;
            }
            if (w->p->node[t].simple) {
                w->cfg[s1] = (struct gm__cfg){.node = t, .stk = c->stk};
                w->n_cfg = s1 + 1;
                w->kern[d + 1] = 1;
                w->off[d + 2] = s1 + 1;
                return 1;
            }
        }
    }
    return gm__walk_step_general(w, d, b);
}

/* Set d's size. */
static inline size_t gm__walk_size(const struct gm__walker *w, int d)
{
    return w->off[d + 1] - w->off[d];
}

/* ---- token-mask caches ------------------------------------------------------- */

#define GM__TC_LIST 0   /* accepted ids listed */
#define GM__TC_BITMAP 1 /* accepted ids as a bitmap of mask words */

/* The cache of one class: tokens accepted whatever the stack below
 * ("context-independent", XGrammar's term), and a trie of the suffixes of
 * the tokens that leave the rule ("uncertain"): each is accepted exactly
 * when its suffix (the bytes after the rule ends) is accepted from the
 * configurations the real stack pops to. */
struct gm__tcache {
    uint8_t kind;
    uint32_t n_acc; /* accepted tokens */
    size_t acc;     /* LIST: ids at tc_ids[acc]; BITMAP: words at
                       tc_words[acc] */
    int32_t sfx0;   /* its suffix trie: nodes sfx[sfx0 .. sfx0 + n_sfx) */
    int32_t n_sfx;
};

/* One node of a suffix trie, in preorder. */
struct gm__sfx {
    uint8_t byte;
    uint16_t depth; /* 1 for a child of the root */
    int32_t end;    /* index after its subtree (absolute) */
    uint32_t tok0, tok1; /* ids sfx_ids[tok0 .. tok1) end here */
};

/* ---- the compiled grammar ------------------------------------------------- */

struct gm_grammar {
    atomic_int refs;
    const struct gm_vocab *vocab; /* borrowed */
    struct gm__pda pda;
    struct gm__tcache *tc; /* (pda.n_sig) */
    int32_t *tc_ids;
    size_t n_tc_ids;
    uint32_t *tc_words;
    size_t n_tc_words;
    struct gm__sfx *sfx;
    size_t n_sfx;
    int32_t *sfx_ids;
    size_t n_sfx_ids;
    struct gm_grammar_stats stats;
};

/* gm_grammar_compile_ir with an absolute deadline (gm__now() seconds, 0:
 * none) instead of one counted from the call: gm_spec_compile's limit
 * covers the spec's parsing and IR too. */
int gm__grammar_compile(const struct gm_ir *ir, const struct gm_vocab *v,
                        const struct gm_limits *lim, double deadline,
                        struct gm_grammar **out, char *err, size_t errlen);

/* Builds g->tc and the suffix tries for every class of g->pda over
 * g->vocab, the classes spread over `threads` OpenMP threads (0: the
 * OpenMP default). Returns 0, TG_ENOMEM, TG_ETOOBIG (the caches would
 * take more than max_bytes; 0: no limit) or TG_ETIMEDOUT (past
 * `deadline`). */
int gm__tcache_build(struct gm_grammar *g, double deadline, int threads,
                     size_t max_bytes, char *err, size_t errlen);

/* ORs the accepted tokens of class `sig` into mask. */
void gm__tcache_apply(const struct gm_grammar *g, int32_t sig,
                      uint32_t *mask);

#endif /* GM_INTERNAL_H */
