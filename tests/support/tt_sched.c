/* tt_sched.c — the scheduler fixture of the rt_sched tests (see
 * tt_sched.h). */
#include "tests/support/tt_sched.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

static char err[256];

void tt_sched_layout(struct kv_layout *lay, int full)
{
    const double mixed[4] = {1.0, 0.5, 0.25, 0.75};
    const double ones[4] = {1.0, 1.0, 1.0, 1.0};
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    assert_int_equal(kv_layout_init(lay, 2, 2, 1, 4, TT_SCHED_PAGE,
                                    TT_SCHED_CHUNK, &rule,
                                    full ? ones : mixed, err, sizeof(err)),
                     0);
}

void tt_sched_head_layout(struct kv_layout *lay)
{
    tt_sched_layout(lay, 0);
    lay->n_kv_heads = 2;
    lay->head_group = malloc(4 * sizeof(int32_t));
    lay->head_slot = calloc(4, sizeof(int32_t));
    assert_non_null(lay->head_group);
    assert_non_null(lay->head_slot);
    for (int i = 0; i < 4; i++)
        lay->head_group[i] = i % 2;
}

void tt_sched_trig_caps(struct kv_trig *t)
{
    memset(t, 0, sizeof(*t));
    t->every = 4;
    t->window = 1;
    t->n_layers = 2;
    t->n_kv_heads = 2;
    t->n_groups = 2;
    t->cap = malloc(4 * sizeof(int32_t));
    t->group_cap = malloc(4 * sizeof(int32_t));
    assert_non_null(t->cap);
    assert_non_null(t->group_cap);
    for (int i = 0; i < 4; i++)
        t->cap[i] = t->group_cap[i] = 5;
    t->cap_max = 5;
}

struct rt_sched_config tt_sched_cfg(const struct kv_layout *lay, int T,
                                    int32_t pages, int seqs, int batched,
                                    int queued)
{
    struct rt_sched_config cfg = {
        .layout = lay,
        .n_ranks = T,
        .pages_per_rank = pages,
        .max_num_seqs = seqs,
        .max_batched_tokens = batched,
        .max_queued = queued,
        .debug_track = 1,
    };
    return cfg;
}

int tt_sched_submit(struct rt_sched *s, uint64_t id, const int32_t *prompt,
                    int64_t n, int32_t max_tokens, const char *session,
                    char *errbuf, size_t errlen)
{
    char rid[32];
    snprintf(rid, sizeof rid, "req-%llu", (unsigned long long)id);
    struct rt_sched_request rq = {
        .id = id,
        .request_id = rid,
        .sampling = {.temperature = 0.25f * (float)(id % 4),
                     .top_p = 1.0f,
                     .top_k = (int32_t)id,
                     .repetition_penalty = 1.0f,
                     .n_top = (int32_t)(id % 3),
                     .seed = 7000u + id},
        .prompt = prompt,
        .n_prompt = n,
        .max_tokens = max_tokens,
        .session_id = session,
        .user = (void *)(uintptr_t)(id + 1000),
    };
    return rt_sched_submit(s, &rq, errbuf, errlen);
}

int tt_sched_submit_sample(struct rt_sched *s, uint64_t id, uint64_t leader,
                           const int32_t *prompt, int64_t n,
                           int32_t max_tokens, char *errbuf, size_t errlen)
{
    struct rt_sched_request r = {
        .id = id,
        .request_id = "fork",
        .prompt = prompt,
        .n_prompt = n,
        .max_tokens = max_tokens,
        .user = (void *)(uintptr_t)(id + 1000),
        .fork_of = leader,
    };
    r.sampling.top_p = 1.0f;
    r.sampling.repetition_penalty = 1.0f;
    return rt_sched_submit(s, &r, errbuf, errlen);
}

void tt_sched_fill(int32_t *t, int64_t n, int32_t base)
{
    for (int64_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

void tt_sched_validate(struct rt_sched *s)
{
    int rc = rt_sched_validate(s, err, sizeof(err));
    if (rc != 0)
        fail_msg("validate: %s", err);
}

enum rt_sched_end tt_sched_run_until_done(struct rt_sched *s,
                                          struct rt_step *st, uint64_t id,
                                          int max_steps,
                                          struct rt_sched_event *last)
{
    int32_t toks[64];
    for (int k = 0; k < max_steps; k++) {
        assert_int_equal(rt_sched_plan(s, st, err, sizeof(err)), 0);
        tt_sched_validate(s);
        for (int32_t i = 0; i < st->n_events; i++)
            if (st->events[i].id == id) {
                if (last != NULL)
                    *last = st->events[i];
                return st->events[i].finish; /* ended while planning */
            }
        for (int32_t i = 0; i < st->n_entries; i++)
            toks[i] = 7000 + k;
        assert_int_equal(rt_sched_complete(s, st, toks, NULL, err,
                                           sizeof(err)), 0);
        tt_sched_validate(s);
        for (int32_t i = 0; i < st->n_events; i++)
            if (st->events[i].id == id &&
                st->events[i].finish != RT_SCHED_END_NONE) {
                if (last != NULL)
                    *last = st->events[i];
                return st->events[i].finish;
            }
    }
    return RT_SCHED_END_NONE;
}

void tt_sched_finish_turn(struct rt_sched *s, struct rt_step *st, uint64_t id,
                          int32_t *t, int64_t n, const char *session)
{
    assert_int_equal(tt_sched_submit(s, id, t, n, 2, session, err,
                                     sizeof(err)), 0);
    struct rt_sched_event ev;
    assert_int_equal(tt_sched_run_until_done(s, st, id, 20, &ev),
                     RT_SCHED_END_LENGTH);
    int32_t steps = (int32_t)((n + TT_SCHED_CHUNK - 1) / TT_SCHED_CHUNK);
    t[n] = 7000 + steps - 1;
    t[n + 1] = 7000 + steps;
}
