/*
 * tt_sched.h — a small scheduler fixture shared by the rt_sched tests
 * (test_sched*.c): a 2-layer x 2-group page layout with mixed or full
 * budgets (and its per-head variant with decode-time compression caps),
 * configurations with tracking on, submission with fixed user data, and a
 * driver that plans and completes steps with predictable sampled tokens. Test code only: failures are cmocka
 * assertions, single thread.
 */
#ifndef TT_SCHED_H
#define TT_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_trig.h"
#include "router/core/rt_sched.h"

#define TT_SCHED_PAGE 4  /* page size, tokens */
#define TT_SCHED_CHUNK 8 /* prefill chunk, tokens */

/* Initialises lay with L = 2 layers x G = 2 groups of one head (d = 4),
 * page TT_SCHED_PAGE, chunk TT_SCHED_CHUNK; budgets {1, 0.5, 0.25, 0.75}
 * or, when `full`, all 1 (full KV). A window of 2 and one sink keep the
 * compression visible at these small sizes. The caller frees lay with
 * kv_layout_free. */
void tt_sched_layout(struct kv_layout *lay, int full);

/* tt_sched_layout(lay, 0) with head maps: 2 KV heads per layer, each its
 * own group (head h in group h), for per-head lengths. With it a prompt of
 * 16 tokens takes 4 + 2 + 2 + 3 = 11 pages. The caller frees lay with
 * kv_layout_free. */
void tt_sched_head_layout(struct kv_layout *lay);

/* Decode-time compression caps over tt_sched_head_layout: cap 5 for every
 * head (and group), beta 4, window 1, so a row's decode bound is
 * min(max_tokens, 9) tokens: ceil(9 / TT_SCHED_PAGE) = 3 pages per row,
 * 12 per request once max_tokens >= 9. The caller frees t with
 * kv_trig_free. */
void tt_sched_trig_caps(struct kv_trig *t);

/* Returns a scheduler configuration over `lay` (may be NULL when the test
 * sets layouts) for T ranks of `pages` pages each, at most `seqs` running
 * sequences, `batched` tokens a step and `queued` waiting requests, with
 * debug tracking on. */
struct rt_sched_config tt_sched_cfg(const struct kv_layout *lay, int T,
                                    int32_t pages, int seqs, int batched,
                                    int queued);

/* Submits request `id` with prompt[0 .. n), `max_tokens`, `session` (may
 * be NULL) and user data id + 1000. Returns rt_sched_submit's code, its
 * detail in err. */
int tt_sched_submit(struct rt_sched *s, uint64_t id, const int32_t *prompt,
                    int64_t n, int32_t max_tokens, const char *session,
                    char *err, size_t errlen);

/* Submits request `id` as a parallel sample of the waiting request
 * `leader` (rt_sched_request.fork_of) with the leader's prompt[0 .. n)
 * and its own `max_tokens`, user data id + 1000. Returns rt_sched_submit's
 * code, its detail in err. */
int tt_sched_submit_sample(struct rt_sched *s, uint64_t id, uint64_t leader,
                           const int32_t *prompt, int64_t n,
                           int32_t max_tokens, char *err, size_t errlen);

/* Writes t[i] = base + i for i < n. */
void tt_sched_fill(int32_t *t, int64_t n, int32_t base);

/* Fails the test, with the detail, unless rt_sched_validate accepts s. */
void tt_sched_validate(struct rt_sched *s);

/* Plans and completes steps, sampling token 7000 + step for every entry,
 * until request `id` has ended or `max_steps` passed, validating after
 * each call; returns the final event's finish reason (RT_SCHED_END_NONE
 * if it did not end) and copies that event to *last (may be NULL). */
enum rt_sched_end tt_sched_run_until_done(struct rt_sched *s,
                                          struct rt_step *st, uint64_t id,
                                          int max_steps,
                                          struct rt_sched_event *last);

/* Runs request `id` (prompt t[0 .. n)) alone with max_tokens 2 to its end
 * and writes the two sampled tokens to t[n], t[n + 1]:
 * tt_sched_run_until_done samples 7000 + step, the prefill takes
 * ceil(n / TT_SCHED_CHUNK) steps and the decode one more. Its stored
 * sequence is then t[0 .. n + 1). t needs room for n + 2 tokens. */
void tt_sched_finish_turn(struct rt_sched *s, struct rt_step *st, uint64_t id,
                          int32_t *t, int64_t n, const char *session);

#endif /* TT_SCHED_H */
