/*
 * rt_gprep.h — the grammars the router has asked worker rank 0 to prepare
 * (DESIGN.md §4.11 "Serving"): which spec texts are prepared under which
 * id, which are still compiling, how many may be outstanding, and what to
 * send next. Pure bookkeeping, no I/O: the server (rt_server_grammar.c)
 * sends what rt_gpreps_take hands out and feeds the answers back.
 *
 * A record is one spec text prepared on the worker group under one id
 * (ids increase from 1 and are never reused). Requests with the same spec
 * share its record: a request takes a reference (rt_gpreps_acquire, or
 * rt_gpreps_ref for a parallel sample of a request that holds one) and
 * gives it back when it ends, however it ends (rt_gpreps_put). A record
 * is
 *   UNSENT   made, not sent yet (or again, after the worker was lost);
 *   PENDING  sent, rank 0 has not answered;
 *   READY    rank 0 holds the grammar under the id;
 *   FAILED   rank 0 answered that it cannot (the reason kept); forgotten
 *            there, it lives here until its holders let go, and a new
 *            request with that spec makes a new record.
 * Admission: UNSENT and PENDING records are the compile work outstanding
 * on the worker group; a request whose spec would need one more than
 * max_pending is refused at once (TG_EBUSY: the caller answers 429 before
 * the request is queued). A spec with a live record costs no new work: a
 * READY one is used at once, a PENDING one joined.
 *
 * Kept grammars: a READY record whose last holder let go stays (idle) for
 * the next request with its spec, up to `keep` of them, least recently
 * used evicted first (its release then goes to the worker), so a schema
 * used again and again is prepared once and never queues behind other
 * compiles. A record that is not READY is released as soon as its last
 * holder lets go: a PENDING one's release cancels the compile if it has
 * not started.
 *
 * Sending: rt_gpreps_take lists the UNSENT records and the ids released
 * since the last send; once the caller has sent them it calls
 * rt_gpreps_sent (which makes them PENDING). Nothing is lost when a send
 * cannot happen yet (the workers are down): the next take lists them
 * again.
 *
 * Loop thread of the router; not thread-safe.
 */
#ifndef RT_GPREP_H
#define RT_GPREP_H

#include <stddef.h>
#include <stdint.h>

#include "router/link/rt_link.h"

enum rt_gprep_state {
    RT_GPREP_UNSENT = 0,
    RT_GPREP_PENDING,
    RT_GPREP_READY,
    RT_GPREP_FAILED,
};

#define RT_GPREP_ERR_MAX 384

struct rt_gprep {
    uint64_t id;   /* on the worker group it was last sent to */
    uint64_t hash; /* of spec (FNV-1a) */
    char *spec;    /* owned, NUL-terminated */
    size_t len;
    enum rt_gprep_state state;
    int32_t refs;                 /* holders (requests) */
    uint64_t used;                /* idle READY: when its last holder let go */
    int busy;                     /* FAILED: the worker's queue was full */
    char error[RT_GPREP_ERR_MAX]; /* FAILED: why */
};

/* Totals since start (the metrics follow them). */
struct rt_gprep_stats {
    uint64_t prepares;   /* records made (specs sent to prepare) */
    uint64_t failed;     /* answered failed */
    uint64_t refused;    /* acquires refused: max_pending outstanding */
    uint64_t ready_hits; /* acquires of a READY record (no wait) */
    uint64_t joined;     /* acquires that joined an outstanding record */
    int32_t pending;     /* outstanding now (UNSENT + PENDING) */
    int32_t idle;        /* READY records kept without holders now */
    int32_t records;     /* live records now */
};

struct rt_gpreps {
    struct rt_gprep **v; /* (n) live records, in no order */
    int32_t n, cap;
    uint64_t next_id;
    uint64_t clock;      /* stamps of idle records */
    int32_t max_pending; /* >= 1 */
    int32_t keep;        /* idle READY records kept, >= 0 */
    int32_t n_pending, n_unsent, n_idle;
    uint64_t *rel; /* (n_rel) ids released, not yet sent */
    int32_t n_rel, cap_rel;
    struct rt_link_gprep *out; /* (cap_out) take's list */
    struct rt_gprep **out_rec; /* (cap_out_rec) its records */
    int32_t n_out, cap_out, cap_out_rec;
    struct rt_gprep_stats st;
};

/* An empty table: at most max_pending (>= 1) records outstanding, `keep`
 * (>= 0) idle READY records kept. No allocation. */
void rt_gpreps_init(struct rt_gpreps *t, int32_t max_pending, int32_t keep);

/* Frees every record (held ones too: call it when no request is left)
 * and the lists. Safe on a zeroed table. */
void rt_gpreps_free(struct rt_gpreps *t);

/* A reference for a new request to the record of spec (NUL-terminated):
 * the live one with that text (not FAILED), else a new UNSENT one.
 * Returns 0 with *out READY (submit the request now), TG_EAGAIN with *out
 * UNSENT or PENDING (the request waits for rt_gpreps_answer), TG_EBUSY
 * when a new record would make more than max_pending outstanding (*out
 * NULL, nothing held: refuse the request), or TG_ENOMEM. */
int rt_gpreps_acquire(struct rt_gpreps *t, const char *spec,
                      struct rt_gprep **out);

/* One more reference to a live record (a parallel sample of a request
 * that holds it). */
void rt_gpreps_ref(struct rt_gprep *p);

/* A holder lets go of p (a request ended, whatever ended it). The last
 * one: a READY record is kept idle (or released when more than `keep`
 * are idle), any other is forgotten (a PENDING one released). */
void rt_gpreps_put(struct rt_gpreps *t, struct rt_gprep *p);

/* What to send now: *prep the UNSENT records (n returned) and *rel the
 * ids released since the last rt_gpreps_sent (*n_rel). Valid until the
 * next call on t. Returns the number of prepares (0 with *n_rel 0:
 * nothing to send), or TG_ENOMEM. */
int32_t rt_gpreps_take(struct rt_gpreps *t, const struct rt_link_gprep **prep,
                       const uint64_t **rel, int32_t *n_rel);

/* The caller sent the last take: its records are PENDING, its releases
 * gone. */
void rt_gpreps_sent(struct rt_gpreps *t);

/* Rank 0 answered prepare `id`: ok (READY), or not with the reason
 * (FAILED; busy: its queue was full). Returns the record, whose waiting
 * holders the caller then submits or fails; NULL for an id that is not
 * PENDING (released meanwhile, or from before the worker was lost:
 * ignore it). */
struct rt_gprep *rt_gpreps_answer(struct rt_gpreps *t, uint64_t id, int ok,
                                  int busy, const char *error);

/* The worker group was lost, and with it every grammar rank 0 held: idle
 * records are forgotten, the releases not sent yet dropped, and every
 * record with holders (FAILED ones aside) becomes UNSENT under a new id,
 * to be prepared on the next group (the caller fails or re-holds the
 * requests that held them). */
void rt_gpreps_lost(struct rt_gpreps *t);

/* Fills *out. */
void rt_gpreps_stats(const struct rt_gpreps *t, struct rt_gprep_stats *out);

#endif /* RT_GPREP_H */
