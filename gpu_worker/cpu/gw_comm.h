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
 * Gather of call k onto rank 0 (the vocab-parallel LM head's logits
 * slices, Megatron-LM's vocab-parallel output layer, Shoeybi et al. 2019)
 * uses the same slots and counters, so it interleaves freely with the
 * all-reduce:
 *   1. every rank waits until every depart >= k-1, copies its operand into
 *      its slot and stores arrive[r] = k;
 *   2. rank 0 waits until every arrive >= k, copies the slots into recv in
 *      rank order and stores depart[0] = k; a rank r > 0 reads nothing: it
 *      waits until depart[0] >= k and stores depart[r] = k.
 * So no slot is overwritten before rank 0 has read it, and no rank returns
 * (and perhaps leaves the group, which marks it over) while a slower peer
 * has yet to arrive. A missing rank 0 or peer gives TG_ETIMEDOUT in the
 * same call.
 *
 * Group ids. Rank 0 names the group (gw_comm_new_id: "/tangram-<pid>-<random
 * hex>", its own pid so a restarted rank 0 never meets the segment of a
 * killed predecessor); the router relays the name to every rank (proto/
 * worker.proto CommSetup) before any of them calls gw_comm_init. A rank 0
 * killed by a signal leaves /dev/shm/tangram-<pid>-*; tangramd removes it
 * when it reaps that worker (td_supervisor.h).
 *
 * With world = 1 there is no segment, the all-reduce is a no-op and the
 * gather a copy. One thread per comm; one comm per rank process.
 */
#ifndef GW_COMM_H
#define GW_COMM_H

#include <stddef.h>
#include <stdint.h>

#define GW_COMM_MAX_RANKS 64         /* tangram-worker --world-size max */
#define GW_COMM_DEFAULT_TIMEOUT_MS 5000
#define GW_COMM_ID_MAX 64            /* bytes of a gw_comm_new_id name */
#define GW_COMM_KIND "shm"           /* the group kind of this backend, as
                                        Hello.comm_kind names it */

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

/* Gathers n floats of every rank onto rank 0: recv (T, n) receives rank
 * r's send at recv + r * n. recv is required on rank 0 and ignored (may be
 * NULL) on the others; send and recv must not overlap except that with
 * world 1 send == recv is allowed. Every rank must make the same sequence
 * of collective calls (all-reduces and gathers) with the same n; n larger
 * than max_floats is gathered in pieces. Returns 0, TG_EINVAL (rank 0
 * without recv) or TG_ETIMEDOUT as gw_comm_allreduce_sum (recv is then
 * unspecified). With world 1 it copies send into recv. */
int gw_comm_gather(struct gw_comm *c, const float *send, size_t n, float *recv);

/* Writes a fresh group id for the caller as rank 0 into out:
 * "/tangram-<pid>-<16 hex digits of randomness>", a POSIX shared-memory
 * name (GW_COMM_ID_MAX bytes with the NUL are enough). Returns 0 or
 * TG_ETOOBIG when outlen is too small (out is then ""). Thread-safe. */
int gw_comm_new_id(char *out, size_t outlen);

/* Unmaps the segment; rank 0 also unlinks its name. Safe on a zeroed or
 * freed comm; zeroes *c. */
void gw_comm_free(struct gw_comm *c);

#endif /* GW_COMM_H */
