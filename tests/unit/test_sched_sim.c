/* test_sched_sim.c — randomized simulations of the router's scheduler
 * (rt_sched): hundreds of requests with random prompt lengths, budgets,
 * multi-turn continuations, session ids, stops and aborts, checked after
 * every step against an independent model: pages used == pages of live
 * sequences + stored entries, no page owned twice (the scheduler's own
 * check and a mirror of the workers' block tables built only from the
 * page-table deltas), the per-step token budget, at most one chunk per
 * request per step, exact chunk boundaries, strict FIFO admission with
 * preempted requests back at the front, progress kept across preemption,
 * events and usage counts, and every page back in the pools at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "router/core/rt_sched.h"

static char err[256];

#define P 4  /* page size */
#define C 8  /* prefill chunk */

/* L = 2 layers x G = 2 groups; budgets mixed or all 1 (full KV). A window
 * of 2 and one sink keep the compression visible at these small sizes. */
static void make_layout(struct kv_layout *lay, int full)
{
    const double mixed[4] = {1.0, 0.5, 0.25, 0.75};
    const double ones[4] = {1.0, 1.0, 1.0, 1.0};
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    assert_int_equal(kv_layout_init(lay, 2, 2, 1, 4, P, C, &rule,
                                    full ? ones : mixed, err, sizeof(err)),
                     0);
}

static void validate(struct rt_sched *s)
{
    int rc = rt_sched_validate(s, err, sizeof(err));
    if (rc != 0)
        fail_msg("validate: %s", err);
}

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    /* xorshift64* (Vigna 2016) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dULL) >> 32) % n;
}

enum { M_PENDING, M_WAITING, M_RUNNING, M_DONE };

struct model_req {
    int state;
    int32_t *tokens;     /* (cap) prompt + generated, as the test knows it */
    int64_t n_tokens, n_prompt, cap;
    int32_t max_tokens;
    int32_t generated;
    int64_t next_pos;    /* running: where its next chunk must start */
    int64_t admit_order; /* running: admission counter */
    int admitted;
    int64_t cached;      /* cached_prompt_tokens seen at first admission */
    int64_t bpos[64];    /* chunk boundaries committed since admission */
    int nb;
    char session[16];
    int has_session;
};

struct sim {
    struct rt_sched s;
    struct kv_layout lay;
    int T;
    int32_t pages;
    int max_seqs;
    int n_req;
    struct model_req *req;    /* (n_req) indexed by id */
    int64_t *queue;           /* model FIFO of ids */
    int64_t q_len;
    int32_t ***mirror;        /* [slot][rank * rows + row] -> ids */
    int32_t **mirror_len;     /* [slot][rank * rows + row] */
    int64_t admit_counter;
    /* stored sequences the scheduler may reuse (token keys) */
    int32_t **keys;
    int64_t *key_len;
    int64_t n_keys;
    int64_t preemptions_seen;
    int64_t tokens_total;
    int recent[8];            /* ring of recently finished conversations */
    int n_recent;
};

static void queue_remove(struct sim *m, int64_t id)
{
    for (int64_t i = 0; i < m->q_len; i++)
        if (m->queue[i] == id) {
            memmove(&m->queue[i], &m->queue[i + 1],
                    (size_t)(m->q_len - i - 1) * sizeof(int64_t));
            m->q_len--;
            return;
        }
    fail_msg("request %lld not in the model queue", (long long)id);
}

static void queue_push_front(struct sim *m, int64_t id)
{
    memmove(&m->queue[1], &m->queue[0], (size_t)m->q_len * sizeof(int64_t));
    m->queue[0] = id;
    m->q_len++;
}

static void mirror_clear(struct sim *m, int32_t slot)
{
    int rows = m->T * m->s.rows;
    for (int w = 0; w < rows; w++)
        m->mirror_len[slot][w] = 0;
}

static void add_key(struct sim *m, const int32_t *t, int64_t n)
{
    m->keys[m->n_keys] = malloc((size_t)n * sizeof(int32_t));
    assert_non_null(m->keys[m->n_keys]);
    memcpy(m->keys[m->n_keys], t, (size_t)n * sizeof(int32_t));
    m->key_len[m->n_keys++] = n;
}

static int is_key(const struct sim *m, const int32_t *t, int64_t n)
{
    for (int64_t k = 0; k < m->n_keys; k++)
        if (m->key_len[k] == n &&
            memcmp(m->keys[k], t, (size_t)n * sizeof(int32_t)) == 0)
            return 1;
    return 0;
}

/* Creates request `id`: a fresh prompt, or the next turn of a finished
 * conversation (its full history plus a few new tokens). */
static void make_request(struct sim *m, int id)
{
    struct model_req *r = &m->req[id];
    memset(r, 0, sizeof(*r));
    r->max_tokens = 1 + (int32_t)rnd(16);
    int64_t n = 0;
    int32_t *base = NULL;
    int64_t base_len = 0;
    if (m->n_recent > 0 && rnd(10) < 5) {
        /* A recent conversation, so its KV may still be stored. */
        int k = m->n_recent < 8 ? m->n_recent : 8;
        int prev = m->recent[rnd((uint32_t)k)];
        if (m->req[prev].n_tokens < 60) {
            base = m->req[prev].tokens;
            base_len = m->req[prev].n_tokens;
            if (m->req[prev].has_session && rnd(2)) {
                memcpy(r->session, m->req[prev].session, 16);
                r->has_session = 1;
            }
        }
    }
    n = base_len + 1 + rnd(base_len > 0 ? 10 : 50);
    r->cap = n + r->max_tokens;
    r->tokens = malloc((size_t)r->cap * sizeof(int32_t));
    assert_non_null(r->tokens);
    if (base_len > 0)
        memcpy(r->tokens, base, (size_t)base_len * sizeof(int32_t));
    for (int64_t i = base_len; i < n; i++)
        r->tokens[i] = (int32_t)rnd(1000);
    r->n_tokens = r->n_prompt = n;
    if (!r->has_session && rnd(3) == 0) {
        snprintf(r->session, sizeof(r->session), "sess-%d", id);
        r->has_session = 1;
    }
    r->state = M_PENDING;
}

/* Checks one planned step against the model and the workers' mirror. */
static void check_plan(struct sim *m, struct rt_step *st, int64_t budget,
                       const struct rt_sched_stats *before)
{
    const int64_t rows = m->s.rows;
    const struct kv_layout *lay = &m->lay;
    validate(&m->s);

    /* Requests ended while planning. */
    for (int32_t i = 0; i < st->n_events; i++) {
        const struct rt_sched_event *ev = &st->events[i];
        assert_true(ev->finish == RT_SCHED_END_KV);
        assert_int_equal(ev->token, -1);
        struct model_req *r = &m->req[ev->id];
        assert_true(r->generated > 0); /* only outgrown preempted ones */
        assert_int_equal(ev->completion_tokens, r->generated);
        if (r->state == M_RUNNING)
            m->preemptions_seen++; /* preempted, then could never fit */
        else
            queue_remove(m, (int64_t)ev->id);
        r->state = M_DONE;
    }

    /* Preempted: running in the model, now waiting or freshly admitted. */
    int64_t victims[64], n_vict = 0;
    for (int id = 0; id < m->n_req; id++) {
        struct model_req *r = &m->req[id];
        if (r->state != M_RUNNING)
            continue;
        struct rt_sched_req_info info;
        assert_int_equal(rt_sched_req_info(&m->s, (uint64_t)id, &info), 0);
        int fresh = 0;
        for (int32_t i = 0; i < st->n_entries; i++)
            if (st->entries[i].id == (uint64_t)id && st->entries[i].fresh)
                fresh = 1;
        if (info.state == RT_SCHED_WAITING || fresh)
            victims[n_vict++] = id;
    }
    /* Newest admission first, each pushed to the front. */
    for (int64_t a = 0; a < n_vict; a++)
        for (int64_t b = a + 1; b < n_vict; b++)
            if (m->req[victims[b]].admit_order >
                m->req[victims[a]].admit_order) {
                int64_t t = victims[a];
                victims[a] = victims[b];
                victims[b] = t;
            }
    for (int64_t a = 0; a < n_vict; a++) {
        queue_push_front(m, victims[a]);
        m->req[victims[a]].state = M_WAITING;
    }
    m->preemptions_seen += n_vict;
    struct rt_sched_stats after;
    rt_sched_get_stats(&m->s, &after);
    assert_int_equal(after.preemptions - before->preemptions,
                     m->preemptions_seen);
    m->preemptions_seen = 0;

    /* Entries: budget, distinct requests and slots, exact ranges. */
    int64_t sum = 0;
    int32_t admitted = 0;
    for (int32_t i = 0; i < st->n_entries; i++) {
        const struct rt_step_entry *e = &st->entries[i];
        sum += e->n;
        for (int32_t j = 0; j < i; j++) {
            assert_true(st->entries[j].id != e->id);
            assert_true(st->entries[j].slot != e->slot);
        }
        assert_true(e->slot >= 0 && e->slot < m->max_seqs);
        struct model_req *r = &m->req[e->id];
        assert_memory_equal(e->tokens, r->tokens + e->pos,
                            (size_t)e->n * sizeof(int32_t));
        struct rt_sched_req_info info;
        assert_int_equal(rt_sched_req_info(&m->s, e->id, &info), 0);
        assert_int_equal(info.slot, e->slot);
        if (e->fresh) {
            /* FIFO: admissions are the model queue's head, in order. */
            assert_true(admitted < m->q_len);
            assert_int_equal(m->queue[admitted], (int64_t)e->id);
            admitted++;
            assert_int_equal(e->kind, RT_STEP_PREFILL);
            assert_int_equal(r->state, M_WAITING);
            r->state = M_RUNNING;
            r->admit_order = m->admit_counter++;
            r->next_pos = e->pos;
            /* A reused history is a stored sequence of the same tokens. */
            assert_int_equal(info.turn_start, e->pos);
            if (e->pos > 0)
                assert_true(is_key(m, r->tokens, e->pos));
            if (!r->admitted) {
                r->admitted = 1;
                r->cached = e->pos;
            }
            assert_int_equal(info.cached_prompt_tokens, r->cached);
            mirror_clear(m, e->slot);
            r->nb = 0;
        }
        assert_int_equal(r->state, M_RUNNING);
        if (e->kind == RT_STEP_PREFILL) {
            /* Exactly C tokens from the turn start, the last shorter;
             * contiguous with the previous chunk. */
            assert_int_equal(e->pos, r->next_pos);
            assert_int_equal((e->pos - info.turn_start) % C, 0);
            int64_t left = r->n_tokens - e->pos;
            assert_int_equal(e->n, left < C ? left : C);
            assert_int_equal(e->sample, e->n == left);
            r->next_pos = e->pos + e->n;
        } else {
            assert_int_equal(e->pos, r->n_tokens - 1);
            assert_int_equal(e->n, 1);
            assert_int_equal(e->sample, 1);
        }
    }
    for (int32_t i = 0; i < admitted; i++)
        m->queue[i] = -1;
    memmove(m->queue, m->queue + admitted,
            (size_t)(m->q_len - admitted) * sizeof(int64_t));
    m->q_len -= admitted;
    assert_int_equal(sum, st->n_tokens);
    assert_true(sum <= budget);
    m->tokens_total += sum;

    /* Workers' block tables from deltas only. */
    for (int32_t i = 0; i < st->n_released; i++)
        mirror_clear(m, st->released[i]);
    for (int64_t d = 0; d < st->n_deltas; d++) {
        const struct rt_step_delta *dl = &st->deltas[d];
        const struct rt_step_entry *e = &st->entries[dl->entry];
        assert_true(d >= e->delta_begin && d < e->delta_end);
        int64_t w = (int64_t)dl->rank * rows + dl->row;
        assert_int_equal(dl->first, m->mirror_len[e->slot][w]);
        assert_true(dl->n > 0);
        memcpy(m->mirror[e->slot][w] + dl->first, st->delta_ids + dl->off,
               (size_t)dl->n * sizeof(int32_t));
        m->mirror_len[e->slot][w] += dl->n;
    }
    for (int32_t i = 0; i < st->n_entries; i++) {
        const struct rt_step_entry *e = &st->entries[i];
        for (int rk = 0; rk < m->T; rk++) {
            const struct kv_seq *q = rt_sched_req_seq(&m->s, e->id, rk);
            assert_non_null(q);
            for (int64_t w = 0; w < rows; w++) {
                int32_t n = 0;
                const int32_t *ids = kv_seq_row_ids(
                    q, lay, (int)(w / lay->n_groups), (int)(w % lay->n_groups),
                    &n);
                assert_int_equal(m->mirror_len[e->slot][rk * rows + w], n);
                assert_memory_equal(m->mirror[e->slot][rk * rows + w], ids,
                                    (size_t)n * sizeof(int32_t));
            }
        }
    }
    /* No page in two live slots of the mirror; pages used add up. */
    uint8_t *seen = calloc((size_t)m->pages, 1);
    assert_non_null(seen);
    for (int rk = 0; rk < m->T; rk++) {
        memset(seen, 0, (size_t)m->pages);
        int64_t live_pages = 0;
        for (int32_t sl = 0; sl < m->max_seqs; sl++)
            for (int64_t w = 0; w < rows; w++) {
                int64_t k = (int64_t)rk * rows + w;
                for (int32_t j = 0; j < m->mirror_len[sl][k]; j++) {
                    int32_t id = m->mirror[sl][k][j];
                    assert_true(id >= 0 && id < m->pages);
                    assert_int_equal(seen[id], 0);
                    seen[id] = 1;
                }
            }
        for (int id = 0; id < m->n_req; id++) {
            const struct kv_seq *q = rt_sched_req_seq(&m->s, (uint64_t)id, rk);
            if (q != NULL)
                live_pages += q->used_pages;
        }
        struct rt_sched_pages rp;
        rt_sched_rank_pages(&m->s, rk, &rp);
        assert_int_equal(rp.used, live_pages + rp.cached);
    }
    free(seen);
}

static void apply_complete(struct sim *m, struct rt_step *st)
{
    int32_t tok[64];
    uint8_t stop[64];
    for (int32_t i = 0; i < st->n_entries; i++) {
        tok[i] = (int32_t)rnd(1000);
        stop[i] = rnd(20) == 0;
    }
    /* Random aborts between plan and complete. */
    for (int32_t i = 0; i < st->n_entries; i++)
        if (rnd(40) == 0) {
            uint64_t id = st->entries[i].id;
            if (m->req[id].state == M_RUNNING) {
                assert_int_equal(rt_sched_abort(&m->s, id), 0);
                m->req[id].state = M_DONE;
            }
        }
    assert_int_equal(rt_sched_complete(&m->s, st, tok, stop, err,
                                       sizeof(err)), 0);
    int32_t ev_i = 0;
    for (int32_t i = 0; i < st->n_entries; i++) {
        const struct rt_step_entry *e = &st->entries[i];
        struct model_req *r = &m->req[e->id];
        if (r->state == M_DONE)
            continue; /* aborted: no event */
        if (e->kind == RT_STEP_PREFILL && r->nb < 64)
            r->bpos[r->nb++] = e->pos + e->n; /* committed chunk */
        if (!e->sample)
            continue;
        assert_true(ev_i < st->n_events);
        const struct rt_sched_event *ev = &st->events[ev_i++];
        assert_int_equal(ev->id, e->id);
        assert_int_equal(ev->token, tok[i]);
        r->tokens[r->n_tokens++] = tok[i];
        r->generated++;
        assert_int_equal(ev->completion_tokens, r->generated);
        assert_int_equal(ev->cached_prompt_tokens, r->cached);
        if (stop[i])
            assert_int_equal(ev->finish, RT_SCHED_END_STOP);
        else if (r->generated == r->max_tokens)
            assert_int_equal(ev->finish, RT_SCHED_END_LENGTH);
        else
            assert_int_equal(ev->finish, RT_SCHED_END_NONE);
        if (ev->finish != RT_SCHED_END_NONE) {
            r->state = M_DONE;
            /* Stored KV covers everything but the last sampled token. */
            add_key(m, r->tokens, r->n_tokens - 1);
            /* ... and every chunk boundary it committed: a later prompt
             * sharing only part of it reuses up to one (rewound). */
            for (int b = 0; b < r->nb; b++)
                if (r->bpos[b] < r->n_tokens - 1)
                    add_key(m, r->tokens, r->bpos[b]);
            m->recent[m->n_recent++ % 8] = (int)e->id;
            struct rt_sched_req_info gone;
            assert_int_equal(rt_sched_req_info(&m->s, e->id, &gone),
                             TG_ENOTFOUND);
        }
    }
    assert_int_equal(ev_i, st->n_events);
    validate(&m->s);
}

/* Runs one simulation and returns its final counters in *out. */
static void run_sim(uint64_t seed, int T, int32_t pages, int max_seqs,
                    int batched, int queued, int n_req, int full,
                    struct rt_sched_stats *out)
{
    struct sim m;
    memset(&m, 0, sizeof(m));
    rng_state = seed;
    m.T = T;
    m.pages = pages;
    m.max_seqs = max_seqs;
    m.n_req = n_req;
    make_layout(&m.lay, full);
    struct rt_sched_config cfg = {
        .layout = &m.lay,
        .n_ranks = T,
        .pages_per_rank = pages,
        .max_num_seqs = max_seqs,
        .max_batched_tokens = batched,
        .max_queued = queued,
        .debug_track = 1,
    };
    assert_int_equal(rt_sched_init(&m.s, &cfg, err, sizeof(err)), 0);
    m.req = calloc((size_t)n_req, sizeof(struct model_req));
    m.queue = calloc((size_t)n_req, sizeof(int64_t));
    m.keys = calloc(66 * (size_t)n_req, sizeof(int32_t *));
    m.key_len = calloc(66 * (size_t)n_req, sizeof(int64_t));
    m.mirror = calloc((size_t)max_seqs, sizeof(int32_t **));
    m.mirror_len = calloc((size_t)max_seqs, sizeof(int32_t *));
    assert_true(m.req && m.queue && m.keys && m.key_len && m.mirror &&
                m.mirror_len);
    int64_t cells = (int64_t)T * m.s.rows;
    for (int sl = 0; sl < max_seqs; sl++) {
        m.mirror[sl] = calloc((size_t)cells, sizeof(int32_t *));
        m.mirror_len[sl] = calloc((size_t)cells, sizeof(int32_t));
        for (int64_t w = 0; w < cells; w++)
            m.mirror[sl][w] = malloc((size_t)pages * sizeof(int32_t));
    }
    struct rt_step st;
    rt_step_init(&st);
    int next = 0, done = 0, too_big = 0, busy = 0;
    int64_t guard = 0;
    while (done < n_req) {
        assert_true(++guard < 200000);
        /* Arrivals: a few per step, retried while the queue is full. */
        /* Bursts now and then fill the queue; the mean stays near the
         * service rate so that conversations continue while stored. */
        int arrivals = rnd(12) == 0 ? 6 : rnd(3) == 0;
        for (int a = 0; a < arrivals && next < n_req; a++) {
            struct model_req *r = &m.req[next];
            if (r->tokens == NULL)
                make_request(&m, next);
            struct rt_sched_request rq = {
                .id = (uint64_t)next,
                .prompt = r->tokens,
                .n_prompt = r->n_tokens,
                .max_tokens = r->max_tokens,
                .session_id = r->has_session ? r->session : NULL,
            };
            int rc = rt_sched_submit(&m.s, &rq, err, sizeof(err));
            if (rc == TG_EBUSY) {
                busy++;
                break;
            }
            if (rc == TG_ETOOBIG) {
                int64_t need = 0;
                assert_int_equal(kv_seq_prompt_pages(NULL, &m.lay, 0,
                                                     r->n_tokens, &need, err,
                                                     sizeof(err)), 0);
                assert_true(need > pages);
                r->state = M_DONE;
                too_big++;
            } else {
                assert_int_equal(rc, 0);
                r->state = M_WAITING;
                m.queue[m.q_len++] = next;
            }
            next++;
        }
        /* Random aborts of queued requests. */
        if (m.q_len > 0 && rnd(30) == 0) {
            int64_t id = m.queue[rnd((uint32_t)m.q_len)];
            assert_int_equal(rt_sched_abort(&m.s, (uint64_t)id), 0);
            queue_remove(&m, id);
            m.req[id].state = M_DONE;
        }
        struct rt_sched_stats before;
        rt_sched_get_stats(&m.s, &before);
        assert_int_equal(rt_sched_plan(&m.s, &st, err, sizeof(err)), 0);
        check_plan(&m, &st, batched, &before);
        apply_complete(&m, &st);
        done = 0;
        for (int id = 0; id < next; id++)
            done += m.req[id].state == M_DONE;
        if (next < n_req)
            done = 0;
    }
    struct rt_sched_stats stats;
    rt_sched_get_stats(&m.s, &stats);
    assert_int_equal(stats.running, 0);
    assert_int_equal(stats.waiting, 0);
    /* Everything back in the pools once the stored entries are dropped. */
    rt_sched_drop_cache(&m.s);
    for (int r = 0; r < T; r++) {
        struct rt_sched_pages rp;
        rt_sched_rank_pages(&m.s, r, &rp);
        assert_int_equal(rp.used, 0);
        assert_int_equal(rp.monolithic, 0);
    }
    validate(&m.s);
    print_message("seed %llu: %d requests, %lld steps, %lld preemptions, "
                  "%lld cached prompt tokens, %d too big, %d busy\n",
                  (unsigned long long)seed, n_req, (long long)stats.steps,
                  (long long)stats.preemptions,
                  (long long)stats.cached_prompt_tokens, too_big, busy);
    /* Every run must see a full queue; the callers check the rest. */
    assert_true(busy > 0);
    *out = stats;

    rt_step_free(&st);
    rt_sched_free(&m.s);
    for (int sl = 0; sl < max_seqs; sl++) {
        for (int64_t w = 0; w < cells; w++)
            free(m.mirror[sl][w]);
        free(m.mirror[sl]);
        free(m.mirror_len[sl]);
    }
    for (int id = 0; id < n_req; id++)
        free(m.req[id].tokens);
    for (int64_t k = 0; k < m.n_keys; k++)
        free(m.keys[k]);
    free(m.mirror);
    free(m.mirror_len);
    free(m.keys);
    free(m.key_len);
    free(m.queue);
    free(m.req);
    kv_layout_free(&m.lay);
}

/* Tight pools: page pressure, preemption, evictions. */
static void test_random_tight(void **state)
{
    (void)state;
    struct rt_sched_stats a, b, c;
    run_sim(1, 2, 72, 6, 24, 10, 400, 0, &a);
    run_sim(7, 2, 60, 5, 16, 6, 300, 0, &b);
    run_sim(99, 1, 48, 4, 12, 5, 300, 1, &c); /* full KV, some too big */
    assert_true(a.preemptions > 0 && b.preemptions > 0 && c.preemptions > 0);
    assert_true(a.cache_evictions > 0 && b.cache_evictions > 0);
}

/* Roomier pools: conversations continue while their KV is stored. */
static void test_random_multi_turn(void **state)
{
    (void)state;
    struct rt_sched_stats a, b;
    run_sim(12345, 3, 256, 8, 32, 12, 400, 0, &a);
    run_sim(4242, 2, 160, 6, 24, 10, 300, 0, &b);
    assert_true(a.cached_prompt_tokens > 0 && b.cached_prompt_tokens > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_tight),
        cmocka_unit_test(test_random_multi_turn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
