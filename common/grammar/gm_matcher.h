/*
 * gm_matcher.h — one constrained generation: the state of the pushdown
 * automaton after the tokens generated so far, the token mask of the
 * next step, and rollback.
 *
 * State: a set of heads (node, stack), the stack a vertex of the
 * matcher's graph-structured stack (gm_internal.h), which stands for
 * every stack its links spell (several heads when alternatives share a
 * prefix, e.g. anyOf branches that start alike; one vertex, not one head
 * per stack, when such alternatives nest, so the heads stay few however
 * deep the nesting). A head never sits at the end of a rule with nothing
 * left to read there: it is replaced by the heads the rule returns to, so
 * every head has bytes to read, and "the document may end here" is a flag
 * (can_end).
 *
 * Work: each accept and mask call is bounded by a budget
 * (gm_matcher_set_budget): work units (one per configuration, stack
 * vertex or link visited, and per 16 words of cached mask ORed) and wall
 * time. A call over either fails with TG_ETIMEDOUT and leaves the state
 * as it was, so a server fails that one request instead of stalling its
 * batch.
 *
 * The mask of a step (gm_matcher_fill_mask): for every head, OR the
 * tokens its class accepts whatever the stack (precomputed,
 * gm_grammar.h), then walk the head's suffix trie of "uncertain" tokens
 * from the configurations its real stack returns to; EOS ids where the
 * document may end. Special tokens and ids outside the vocabulary are
 * never set. gm_matcher_fill_mask_naive computes the same mask by
 * feeding every token's bytes to a copy of the state (no caches, no
 * trie): the test oracle, thousands of times slower.
 *
 * Serving (the recommended placement, see common/grammar/README.md):
 * the router compiles or checks the request's constraint (gm_spec.h,
 * gm_cache.h) and sends its spec once with the request; worker rank 0
 * keeps one matcher per sequence (n > 1: one per choice, each
 * gm_matcher_init'ed or gm_matcher_copy'ed from the prompt's) next to
 * the sampler. After sampling token t of step s it calls
 * gm_matcher_accept_token(t) and gm_matcher_fill_mask for step s + 1 on
 * the host while the device runs the forward pass of step s + 1 (the
 * mask depends only on tokens up to t), then applies the mask to the
 * logits before sampling and logprobs (a logit whose bit is 0 becomes
 * -inf). When max_tokens ends the output while !gm_matcher_can_end, the
 * finish reason is "length" (gm_matcher_min_bytes_left says how much was
 * missing).
 *
 * Threads: a matcher is used by one thread at a time; matchers of one
 * grammar may run on different threads at once.
 */
#ifndef GM_MATCHER_H
#define GM_MATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_grammar.h"
#include "common/grammar/gm_internal.h"

struct gm_matcher_state { /* one entry of the history */
    size_t h0, nh;         /* heads log[h0 .. h0 + nh) */
    int32_t nv, nl;        /* the GSS's vertices and links then */
    uint8_t can_end, done; /* done: EOS accepted */
};

/* The work budget of one call by default: about 0.1 s on a 2020s core,
 * thousands of times what a JSON Schema grammar takes per token
 * (docs/PERFORMANCE.md). */
#define GM_MATCHER_WORK_DEFAULT 4000000u

/* Fields are private (read through the functions below). */
struct gm_matcher {
    struct gm_grammar *g; /* one reference held */
    struct gm__gss gss;
    struct gm__cfg *log; /* heads of every state, in order */
    size_t n_log, cap_log;
    struct gm_matcher_state *hist; /* hist[0] initial .. hist[n_tokens] */
    size_t n_hist, cap_hist;
    struct gm__walker w;
    struct gm__cfg *tmp; /* scratch heads */
    size_t n_tmp, cap_tmp;
    int64_t *pairs; /* scratch (class, stack) of the mask */
    size_t cap_pairs;
    int32_t *lmap; /* scratch: walker vertex -> GSS vertex */
    size_t cap_lmap;
    int32_t *todo; /* scratch: vertices being moved to the GSS */
    size_t cap_todo;
    struct gm__kset seen; /* scratch: heads of the state being built */
    uint64_t budget_work; /* per call, 0: none */
    double budget_s;      /* per call, 0: none */
    uint64_t last_work;   /* the last call's */
};

/* Prepares *m (zeroed or freed) at the start of a document of grammar g
 * (a reference is taken). Returns 0 or TG_ENOMEM. */
int gm_matcher_init(struct gm_matcher *m, struct gm_grammar *g);

/* Bounds each later accept and mask call to `work` units (0: no bound)
 * and `seconds` of wall time (0: no bound); see "Work" above. Init sets
 * GM_MATCHER_WORK_DEFAULT units and no time bound; copies keep it. */
void gm_matcher_set_budget(struct gm_matcher *m, uint64_t work, double seconds);

/* The work units the last accept or mask call took (for statistics). */
uint64_t gm_matcher_last_work(const struct gm_matcher *m);

/* Releases m (and its grammar reference) and zeroes it. Safe on zeroed. */
void gm_matcher_free(struct gm_matcher *m);

/* Makes *dst (zeroed or freed) an independent copy of src, history
 * included. Returns 0 or TG_ENOMEM (dst zeroed). */
int gm_matcher_copy(struct gm_matcher *dst, const struct gm_matcher *src);

/* Back to the start of the document (history dropped). */
void gm_matcher_reset(struct gm_matcher *m);

/* Accepts token `id`: its bytes, or an EOS id where the document may end.
 * Returns 0; TG_EINVAL when the grammar rejects it (state unchanged);
 * TG_EDONE when EOS was accepted already; TG_ETIMEDOUT over the budget
 * or TG_ENOMEM (state unchanged). */
int gm_matcher_accept_token(struct gm_matcher *m, int32_t id);

/* Accepts n bytes (e.g. text generated before the constraint started, or
 * a trigger). 0 bytes is a no-op; otherwise one history entry, like a
 * token. Same returns. */
int gm_matcher_accept_bytes(struct gm_matcher *m, const void *bytes,
                            size_t n);

/* Undoes the last n accepted tokens / byte strings. Returns 0 or
 * TG_ERANGE (fewer were accepted; nothing undone). */
int gm_matcher_rollback(struct gm_matcher *m, size_t n);

/* Tokens (and byte strings) accepted since init or reset. */
size_t gm_matcher_n_accepted(const struct gm_matcher *m);

/* 1 when the document may end here (EOS would be accepted), else 0. */
int gm_matcher_can_end(const struct gm_matcher *m);

/* 1 when EOS was accepted, or the document is complete and nothing may
 * follow (only EOS is allowed), else 0. */
int gm_matcher_is_finished(const struct gm_matcher *m);

/* The fewest bytes that complete the document from here (0 when it may
 * end). */
uint32_t gm_matcher_min_bytes_left(const struct gm_matcher *m);

/* Writes the mask of the next token into mask[0..n_words): bit i of
 * mask[i >> 5] (1u << (i & 31)) is 1 when token i is allowed. n_words
 * must be at least gm_vocab_mask_words of the grammar's vocabulary (a
 * model's logit row may be wider: the extra bits are 0). Returns 0,
 * TG_EINVAL (n_words too small), TG_EDONE (EOS accepted: all zero),
 * TG_ETIMEDOUT (over the budget) or TG_ENOMEM. Takes microseconds
 * (docs/PERFORMANCE.md). */
int gm_matcher_fill_mask(struct gm_matcher *m, uint32_t *mask,
                         size_t n_words);

/* The same mask by brute force over the whole vocabulary (test oracle). */
int gm_matcher_fill_mask_naive(struct gm_matcher *m, uint32_t *mask,
                               size_t n_words);

#endif /* GM_MATCHER_H */
