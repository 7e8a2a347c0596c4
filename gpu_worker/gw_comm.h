/*
 * gw_comm.h — the CPU backend's tensor-parallel all-reduce: T worker
 * processes on one host share a POSIX shared-memory segment and sum float
 * vectors (DESIGN.md §4.7: "the CPU backend uses a shared-memory
 * all-reduce"). It stands in for NCCL so the multi-rank logic (sharded
 * weights, partial sums after o_proj and down_proj) runs in CI.
 *
 * Segment: a header (world size, slot capacity, nonce, per-rank counters
 * on their own cache lines) followed by T slots of max_floats floats.
 * Rank 0 creates it (after marking any segment left under the same name
 * by an earlier incarnation as dead, so a peer that opened the old one
 * notices and reopens) and publishes a fresh nonce; rank r > 0 opens it,
 * retrying until a header for the same world size and slot capacity is
 * there, and registers with a token of its own that rank 0 echoes back —
 * so every rank knows all T are present when gw_comm_init returns.
 *
 * All-reduce of call k (k = 1, 2, ..) on rank r, two phases with C11
 * atomic generation counters per rank (monotonic, never reset):
 *   1. wait until every rank's depart >= k-1 (all finished reading the
 *      slots of call k-1), copy x into slot r, store arrive[r] = k;
 *   2. wait until every arrive >= k, sum slots 0..T-1 in that order into
 *      x, store depart[r] = k.
 * Every rank adds the same operands in the same order, so all ranks get
 * bit-identical results (no -ffast-math in this project). Waits spin
 * briefly, then sched_yield, then sleep 50 us, and give up with
 * TG_ETIMEDOUT after timeout_ms; a rank that gives up marks the segment
 * aborted so its peers give up at once instead of waiting their own
 * timeout. A failed comm stays failed (its peers are gone or out of step).
 *
 * With world = 1 there is no segment and the all-reduce is a no-op.
 * One thread per comm; one comm per rank process.
 */
#ifndef GW_COMM_H
#define GW_COMM_H

#include <stddef.h>
#include <stdint.h>

#define GW_COMM_MAX_RANKS 64         /* tangram-worker --world-size max */
#define GW_COMM_DEFAULT_TIMEOUT_MS 5000

struct gw_comm_shm; /* the mapped segment's layout, private to gw_comm.c */

struct gw_comm {
    int rank;                  /* 0 .. world - 1 */
    int world;                 /* T; 0 on a zeroed comm */
    int timeout_ms;            /* bound of every wait */
    int failed;                /* an earlier call timed out or aborted */
    size_t max_floats;         /* floats per slot (larger n is chunked) */
    uint64_t calls;            /* chunk all-reduces done (generation) */
    char name[256];            /* shm name ("/tangram-..."), rank 0 unlinks */
    struct gw_comm_shm *shm;   /* mapping, owned; NULL when world == 1 */
    size_t map_bytes;
};

/* Joins the group `name` (a POSIX shm name: one leading '/', no other '/',
 * at most 250 characters) as `rank` of `world`, with slots of max_floats
 * floats (>= 1; the same on every rank) and waits bounded by timeout_ms
 * (<= 0: GW_COMM_DEFAULT_TIMEOUT_MS). world == 1 needs no name (may be
 * NULL) and maps nothing. Rank 0 creates the segment and waits for every
 * other rank to register; other ranks wait for rank 0's header. Returns 0,
 * TG_EINVAL (bad rank, world, size or name), TG_ETIMEDOUT (a peer did not
 * arrive in time, or the header found is for another world size or slot
 * capacity — the message says which), TG_EIO (shm_open, ftruncate or
 * mmap failed, with errno's text) or TG_ENOMEM; on failure *c is left
 * freed. The caller owns *c (gw_comm_free). */
int gw_comm_init(struct gw_comm *c, const char *name, int rank, int world,
                 size_t max_floats, int timeout_ms, char *err, size_t errlen);

/* Replaces x[0 .. n) on every rank by the sum over ranks of their x, added
 * in rank order 0..T-1 (bit-identical on all ranks). Every rank must make
 * the same sequence of calls with the same n. n larger than max_floats is
 * reduced in pieces. Returns 0, or TG_ETIMEDOUT when a peer did not arrive
 * within the timeout (or a peer gave up, or an earlier call failed); x is
 * then unspecified. A no-op returning 0 when world == 1 or n == 0. */
int gw_comm_allreduce_sum(struct gw_comm *c, float *x, size_t n);

/* Unmaps the segment; rank 0 also unlinks its name. Safe on a zeroed or
 * freed comm; zeroes *c. */
void gw_comm_free(struct gw_comm *c);

#endif /* GW_COMM_H */
