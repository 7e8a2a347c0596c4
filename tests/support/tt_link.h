/*
 * tt_link.h — a fake worker rank and a router-side fixture for the tests
 * of rt_link (test_link.c, test_link_faults.c). A fake is a ZeroMQ DEALER
 * with routing id "rank-<r>" that says Hello, heartbeats and answers plans
 * as told; the fixture owns a uv loop, an rt_link bound to a fresh ipc (or
 * given) endpoint, up to three fakes and records of the link's callbacks.
 * The fakes are serviced between non-blocking turns of the uv loop on the
 * same thread (TT_PUMP_UNTIL), so no test needs threads. Timeouts are small
 * (heartbeat 15 ms, deadline 120 ms) so a test runs in well under a second.
 * Test code only: failures are cmocka assertions, single thread.
 */
#ifndef TT_LINK_H
#define TT_LINK_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <uv.h>

#include "router/link/rt_link.h"
#include "router/core/rt_sched.h"
#include "worker.pb-c.h"

#define TT_LINK_HB_MS 15     /* router heartbeat period, ms */
#define TT_LINK_DEAD_MS 120  /* silence after which a rank is dead, ms */
#define TT_LINK_STALL_MS 1000 /* a beat's stalled_ms beyond this kills */
#define TT_LINK_L 2          /* layers of the fixture's layout */
#define TT_LINK_G 2          /* KV groups per layer */
#define TT_LINK_VOCAB 1000   /* vocabulary size */

/* How a fake answers the plans it receives. */
enum tt_answer {
    TT_ANSWER_OK,
    TT_ANSWER_FAIL,        /* ok = false, "boom" */
    TT_ANSWER_WRONG_ID,    /* step id + 5 */
    TT_ANSWER_NONE,        /* the test answers by hand */
    TT_ANSWER_EXTRA,       /* rank 0: a token for every entry, sampled or not */
    TT_ANSWER_VOCAB,       /* rank 0: token ids outside the vocabulary */
    TT_ANSWER_SLOT_ERROR,  /* rank 0: a SlotError ("bad top_p") for the
                              first sampled entry, tokens for the rest */
    TT_ANSWER_SLOT_TWICE,  /* rank 0: as OK, plus a SlotError for the
                              first sampled entry (answered twice) */
    TT_ANSWER_HEADS,       /* as OK, plus head lengths for every prefill
                              entry's slot: TT_LINK_HEADS values
                              100 * rank + slot * 10 + k */
    TT_ANSWER_HEADS_COUNT, /* as HEADS with one value too few */
    TT_ANSWER_HEADS_SLOT,  /* as HEADS for slot 9, which has no entry */
    TT_ANSWER_PLP,         /* rank 0: as OK, plus a PromptLogprobs record
                              for every entry that asked (value -0.5 -
                              position, rank 1 + position, alternatives
                              ids 10 + k) */
    TT_ANSWER_PLP_SHORT,   /* as PLP with one value too few */
    TT_ANSWER_PLP_NONE,    /* as OK: the records are missing */
};

#define TT_LINK_HEADS (TT_LINK_L * TT_LINK_G) /* KV heads x L (H_p = 1) */

/* How a fake answers a CommSetup. */
enum tt_comm {
    TT_COMM_OK = 0,        /* CommReady ok at once */
    TT_COMM_FAIL,          /* CommReady ok = false, "no group" */
    TT_COMM_NONE,          /* never answers */
};

/* One fake worker rank; zeroed when closed. */
struct tt_fake {
    void *sock;
    int rank;
    int silent;             /* no heartbeats, no answers */
    enum tt_answer answer;
    enum tt_comm comm;
    int n_setup;            /* CommSetups received */
    char setup_id[64];      /* comm_id of the last one (text) */
    char setup_kind[16];
    uint32_t setup_world;
    int n_hb, n_plans, n_shutdown, last_drain;
    char last_reason[256];
    Tangram__Worker__V1__WorkerMessage *plan; /* last plan received (owned) */
    /* GrammarCommands received: how many, and the last one's prepares
     * (ids, specs) and releases (at most TT_LINK_GMAX each) */
    int n_gcmd, n_gprep, n_grel;
    uint64_t gprep_id[8];
    char gprep_spec[8][64];
    uint64_t grel[8];
    uint64_t hb_seq;
    uint64_t last_hb_ms;
};

/* Hello fields that differ from the fixture's layout; 0 keeps the default
 * (world 2, head_dim 8, 64 pages, the fake's own rank; rank 0 names the
 * group "fake-group-<pid>", kind "shm"). */
struct tt_hello_opts {
    uint32_t world_size, head_dim, pages_total, hello_rank;
    const char *comm_id;   /* NULL: the default; "": none */
    int per_head;          /* LayoutSummary.per_head_lens */
};

/* The router side: loop, link, fakes and what the callbacks saw. */
struct tt_link_env {
    uv_loop_t loop;
    struct rt_link link;
    void *zctx;
    char endpoint[256];
    struct tt_fake fk[3];
    int n_fakes;
    /* callback records */
    int n_result, n_ready, n_dead, dead_rank;
    uint64_t res_step;
    int res_ok;
    char res_error[512];
    int32_t res_tokens[16];
    char res_entry_error[16][64]; /* entries[i].error, "" when NULL */
    int32_t res_n;
    size_t res_top0;
    uint32_t res_top_id1;
    int64_t res_plp_first[16];     /* entries[i].plp: first position, or -1 */
    int64_t res_plp_n[16];         /* its values */
    float res_plp_lp_last[16];     /* its last value */
    uint32_t res_plp_top_last[16]; /* its last position's last id */
    double res_seconds;
    int32_t res_n_heads;          /* head-length reports */
    int64_t res_heads_sum;        /* sum of all their values */
    int32_t res_heads_rank_mask;  /* bit r: rank r reported */
    int n_gready;                 /* on_grammar answers, all calls */
    struct {
        uint64_t id;
        int ok, busy;
        char error[64];
    } gready[8]; /* the first 8 */
    uint64_t t_dead;
};

/* A hand-made three-entry step with per-rank page deltas (see
 * tt_mini_step_make); the arrays back the pointers in s. */
struct tt_mini_step {
    struct rt_step s;
    struct rt_step_entry ent[3];
    struct rt_step_delta del[4];
    struct tg_sampling smp[3];
    char rid[3][16];
    int32_t row_lens[3 * TT_LINK_L * TT_LINK_G]; /* up to 3 ranks */
    int32_t head_lens[3 * TT_LINK_HEADS];        /* up to 3 ranks */
    int32_t ids[6];
    int32_t released[1];
    int32_t t0[3], t1[1], t2[2];
};

/* Returns CLOCK_MONOTONIC in milliseconds. */
uint64_t tt_now_ms(void);

/* Packs `m` and sends it on f's socket; asserts the send. */
void tt_fake_send(struct tt_fake *f,
                  const Tangram__Worker__V1__WorkerMessage *m);

/* Sends a Hello with the fixture's layout changed by `o` (may be NULL). */
void tt_fake_hello(struct tt_fake *f, const struct tt_hello_opts *o);

/* Zeroes f, connects a DEALER with routing id `id` to `endpoint` in zctx
 * and says Hello (with `o`, may be NULL) as rank `rank`. Release with
 * tt_fake_close. */
void tt_fake_open_id(struct tt_fake *f, void *zctx, const char *endpoint,
                     int rank, const char *id, const struct tt_hello_opts *o);

/* tt_fake_open_id with the routing id "rank-<rank>". */
void tt_fake_open(struct tt_fake *f, void *zctx, const char *endpoint,
                  int rank, const struct tt_hello_opts *o);

/* Closes the socket, frees the kept plan and zeroes f; safe on a zeroed
 * fake. */
void tt_fake_close(struct tt_fake *f);

/* Answers plan `p` according to f->answer: rank 0 samples token
 * 100 + slot for every entry with sample set, with two alternatives. */
void tt_fake_answer(struct tt_fake *f, const Tangram__Worker__V1__BatchPlan *p);

/* Sends a CommReady for f's rank with `ok` and `error`. */
void tt_fake_comm_ready(struct tt_fake *f, int ok, const char *error);

/* Sends one GrammarReport of one GrammarReady (as rank f->rank). */
void tt_fake_grammar_ready(struct tt_fake *f, uint64_t id, int ok, int busy,
                           const char *error);

/* Reads everything waiting on f's socket without blocking (counting
 * heartbeats and Shutdowns, keeping and answering plans, answering
 * CommSetups as f->comm says) and heartbeats every 5 ms unless silent; a
 * no-op on a closed fake. */
void tt_fake_service(struct tt_fake *f);

/* Returns the link configuration of a world of T ranks with the fixture's
 * layout, timeouts and callbacks recording into e (no endpoint set). */
struct rt_link_config tt_link_cfg(struct tt_link_env *e, int T);

/* Allocates a fixture whose link serves T ranks on `endpoint` (NULL: a
 * fresh ipc path under /tmp; a tcp wildcard is resolved into e->endpoint)
 * and a ZeroMQ context for the fakes. Free with tt_link_env_free. */
struct tt_link_env *tt_link_env_new(int T, const char *endpoint);

/* Closes the fakes and the link, runs the loop dry, asserts that no handle
 * is left and frees e. */
void tt_link_env_free(struct tt_link_env *e);

/* Runs the loop and services the fakes for `ms` milliseconds. */
void tt_link_pump(struct tt_link_env *e, int ms);

/* tt_link_env_new plus T fakes that said Hello; asserts the link became
 * ready exactly once. */
struct tt_link_env *tt_link_env_ready(int T);

/* Fills m with the step `step_id`: entry 0 prefills fresh slot 2 adopting
 * stored KV at pos 4 (last chunk); entry 1 decodes slot 0; entry 2 is the
 * first chunk of fresh slot 1. Rank 0 gets deltas (e0, row 3: 11 12) and
 * (e1, row 2: 13); rank 1 gets (e0, row 1: 21) and (e2, row 0: 22 23).
 * Slot 5 is freed. */
void tt_mini_step_make(struct tt_mini_step *m, uint64_t step_id);



/* Asserts that the plan fake f kept is the mini step `step_id` as its rank
 * must see it. */
void tt_mini_plan_check(const struct tt_fake *f, uint64_t step_id);

/* Sends mini step `id`, waits for its result and returns on_result's ok. */
int tt_link_round_trip(struct tt_link_env *e, uint64_t id);

/* Runs the loop and services the fakes until `cond` holds or `ms` pass;
 * evaluates to the final value of cond (a GNU statement expression). */
#define TT_PUMP_UNTIL(e, cond, ms)                                      \
    ({                                                                  \
        uint64_t t_end_ = tt_now_ms() + (ms);                           \
        while (!(cond) && tt_now_ms() < t_end_) {                       \
            uv_run(&(e)->loop, UV_RUN_NOWAIT);                          \
            for (int i_ = 0; i_ < 3; i_++)                              \
                tt_fake_service(&(e)->fk[i_]);                          \
            usleep(500);                                                \
        }                                                               \
        (cond);                                                         \
    })

#endif /* TT_LINK_H */
