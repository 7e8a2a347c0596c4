/*
 * gw_worker.h — one worker rank's plan execution (DESIGN.md §2), without
 * any I/O and without knowing its backend: the model, the plan check and
 * the application of the router's plans of a tangram-worker process.
 * gw_wlink.h moves the messages and decodes them into the plain structs of
 * gw_plan.h; the slots and the step itself are the step loop's
 * (gpu_worker/step/gw_step.h, which in-process generation runs too); the
 * compute goes through the runtime interface of gw_backend.h.
 *
 * The router owns page accounting; the worker keeps, per request slot, a
 * mirror of the request's rows (a kv_seq filled by page id, kv_seq.h): the
 * page ids the router handed it (grown and cut by page deltas) and the
 * tokens physically written to each row. A plan is applied as:
 *   1. `frees`: the listed slots are dropped;
 *   2. every entry with `fresh`: its slot is cleared (rows emptied, row
 *      lengths from row_lens or 0, position = start_pos, token history
 *      restarted at start_pos);
 *   3. `deltas` in order: cut the row to truncate_to pages when set, then
 *      append page_ids;
 *   4. the step loop runs the entries (gw_step_run: every PREFILL entry,
 *      one by one, the forks, then all DECODE entries as one batch);
 *   5. rank 0 only: every entry with `sample` draws one token
 *      (gw_step_draw_all).
 * An adaptive method (gvote, gw_method_per_head) keeps per-head lengths in
 * every slot (kv_seq heads, announced in the Hello): a fresh entry sets
 * them from its head_lens (checked: one per KV head, rows = their longest
 * heads; without them every head holds its row), the forward pass moves
 * them, and after each prefill chunk every rank reports the slot's heads
 * in its result (gw_result.head_lens). The router commits them and cuts the
 * rows it shrank with truncate_to in the slot's next deltas; until then the
 * slot's rows keep their stale tail ids, which nothing reads.
 * Decode-time compression (trig, DESIGN.md §4.9, CPU backend): slots keep
 * per-head lengths too, and each slot knows where its current turn's
 * decode began (dbase, set when a turn's last prefill chunk runs or a
 * fork copies its source) and where each head's decode region starts
 * (dstart, the head lengths at that moment). After the decode batch, every
 * slot whose append made pos - dbase a multiple of beta is compacted
 * through the backend's `compact` (heads over their caps keep their caps,
 * §4.9), and every rank reports those slots' head lengths in its result;
 * the router applies them (kv_seq_compact_rows) and cuts the rows with
 * truncate_to in the slot's next deltas, as for gvote.
 * The whole plan is validated before step 1 touches anything (slots,
 * layers, groups and page ids in range, positions equal to the slot's,
 * chunk sizes, token ids, rows holding at most what their pages can), so a
 * bad plan yields an error result and leaves the worker unchanged and
 * usable. The router is trusted not to hand one page to two rows (that
 * would mix data, never corrupt memory). Sampling parameters are the one
 * thing a client chooses: the plan check is the worker's trust boundary
 * for them, where rank 0 runs the one check (tg_sampling_check: finite, in
 * range, at most GW_WORKER_MAX_LOGPROBS alternatives) once per sampled
 * entry; what runs after it (the step loop, the samplers) only asserts.
 * An entry whose sampling fails the check, or whose draw cannot be made,
 * gets a slot error instead of a token while the step and every other
 * entry go on (its KV was written like the others'; the router ends that
 * request alone). Draws follow gw_step.h (the RNG index, the penalties'
 * history); structured outputs gate each draw with its slot's mask and
 * accept each token (gw_grammar.h).
 *
 * Tensor parallelism (DESIGN.md §4.7): rank r of T loads the profile and
 * layout kv_layout_for_rank gives it (gw_rank_load), its model
 * shard and its backend (gw_worker_init, no communication). Rank 0's
 * backend also names the communicator group, announced in its Hello; the
 * router relays it to every rank in a CommSetup once all T said Hello, and
 * each rank joins (gw_worker_comm_join) and answers CommReady. One rank
 * goes the same way (its join needs no peer). No plan runs before the
 * join. Every rank runs every plan (the router sends each the same entries
 * with its own page deltas), so their collectives pair up: all-reduces
 * after o_proj and down_proj, and the gather of the vocab-parallel logits
 * for exactly the entries that sample (each rank knows them from the
 * plan). Rank 0 samples; the others answer without tokens. A collective
 * that times out (a peer died or failed the plan) fails the step with
 * TG_ETIMEDOUT and marks the worker's peers as lost (peers_lost, and
 * *opts.peer_lost_flag): the process should exit with
 * GW_WORKER_EXIT_PEERS_LOST for the supervisor to restart the group.
 *
 * The host tier of stored conversations (DESIGN.md §4.10): `tier`
 * (gw_host_tier.h, --kv-host-memory, its pages announced in the Hello)
 * copies pages between the pool and host memory on a thread of its own
 * when the router's TierCommand asks (gw_wlink_tier.c); plans never touch
 * the pages of a copy in flight (the router holds them), so steps run as
 * if the tier did not exist.
 *
 * Single-threaded: one owner thread per worker (backends use OpenMP or a
 * CUDA stream inside), plus the host tier's copy thread.
 */
#ifndef GW_WORKER_H
#define GW_WORKER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_seq.h"
#include "common/profile/pf_profile.h"
#include "common/base/tg_config.h"
#include "gpu_worker/serve/gw_grammar.h"
#include "gpu_worker/backend/gw_backend.h"
#include "gpu_worker/model/gw_seq.h"
#include "gpu_worker/serve/gw_host_tier.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/step/gw_plan.h"
#include "gpu_worker/step/gw_progress.h"
#include "gpu_worker/step/gw_step.h"

#define GW_PROTOCOL_VERSION 1u    /* PROTOCOL_VERSION_1 of worker.proto */
#define GW_WORKER_MAX_LOGPROBS GW_STEP_MAX_TOP     /* per sampled token */
#define GW_WORKER_SLOT_ERROR_MAX GW_STEP_ERROR_MAX /* one slot error text */
#define GW_WORKER_EXIT_PEERS_LOST 5 /* tangram-worker's status when an
                                       all-reduce timed out */

struct gw_worker_opts {
    const char *model_dir;      /* Hugging Face model directory */
    const char *profile_path;   /* profile JSON; NULL or "none" = full KV */
    int profile_force;          /* pf_profile_check_model's force */
    const char *method;         /* scoring method; NULL = the profile's */
    enum gw_backend_kind backend;
    int heads_per_group;        /* H_p without a profile */
    int page_size;              /* P tokens per page */
    int prefill_chunk;          /* C tokens per prefill chunk */
    int64_t kv_pages;           /* > 0: exactly this many pool pages */
    struct tg_config_amount kv_memory; /* used when kv_pages <= 0: bytes,
                                          or a fraction (gw_backend.h) */
    int max_slots;              /* request slots (router --max-num-seqs) */
    int rank;                   /* 0 .. world_size - 1; rank 0 samples */
    int world_size;             /* tensor-parallel ranks T */
    int comm_timeout_ms;        /* joining and every collective wait; <= 0:
                                   GW_BACKEND_COMM_TIMEOUT_MS */
    volatile sig_atomic_t *peer_lost_flag; /* optional: set to 1 when a
                                   collective fails (e.g. the serve loop's
                                   stop flag) */
    int n_threads;              /* <= 0: OpenMP default (with T > 1: the
                                   online cores / T) */
    enum gw_weights weights;    /* CPU backend: the host weights' format
                                   (gw_model.h; AUTO when 0) */
    int device;                 /* CUDA backend: device ordinal; < 0: the
                                   rank (one worker per GPU) */
    int cuda_graphs;            /* CUDA backend: capture decode graphs */
    int step_timeout_ms;        /* CUDA backend, T > 1: bound of a step's
                                   wait before the NCCL group is aborted;
                                   <= 0: 120 s */
    const struct gw_gvote_params *gvote; /* method gvote: NULL for the
                                   defaults of DESIGN.md §4.8 */
    const struct gw_trig_opts *trig; /* decode-time compression (§4.9);
                                   NULL or !enabled: none */
    const char *trig_stats_path; /* trig: statistics from this profile
                                   file; NULL or "": the profile's own */
    uint64_t kv_host_memory;    /* host tier of stored conversations
                                   (DESIGN.md §4.10), bytes; 0: none */
    uint64_t grammar_cache_bytes; /* rank 0: compiled grammars kept
                                   (gw_grammar.h); 0: its default */
    double grammar_compile_s;     /* rank 0: wall-time limit of one
                                     grammar compile, s; 0: its default */
};

struct gw_worker {
    struct gw_model model;
    struct pf_profile profile;    /* this rank's */
    struct kv_layout layout;      /* this rank's */
    enum tg_score_method method;
    int per_head;                 /* slots keep per-head lengths (kv_seq
                                     heads): an adaptive method or trig */
    int per_head_prefill;         /* the method is adaptive (gvote): every
                                     prefill chunk reports the heads */
    struct gw_trig_cfg trig;      /* decode-time compression (§4.9);
                                     cap == NULL: off */
    struct pf_trig trig_stats;    /* statistics of --trig-stats, or empty
                                     (trig borrows the profile's) */
    struct gw_backend *be;        /* the compute backend, owned */
    struct gw_host_tier tier;     /* the host tier (§4.10, gw_host_tier.h):
                                     the link submits the router's copy
                                     ops and reports them */
    int rank, world_size, max_slots;
    int max_tokens;               /* rows of one forward call:
                                     max(prefill chunk, max_slots) */
    int joined;                   /* gw_worker_comm_join succeeded */
    int peers_lost;               /* a collective failed: exit */
    volatile sig_atomic_t *peer_lost_flag; /* borrowed, optional */
    int rows;                     /* L * G */
    uint64_t last_step;           /* step id of the last accepted plan */
    struct gw_progress *progress; /* optional, borrowed (its link's): marked
                                     after every backend call of a step, so
                                     the heartbeat thread can tell a long
                                     step from a wedged one (gw_beat.h,
                                     gw_progress.h) */
    struct gw_step step;          /* the slots and the step loop
                                     (gpu_worker/step/gw_step.h) */
    /* validation scratch: the state the plan would leave, per slot */
    int32_t *sim_n;               /* (max_slots, rows) pages per row */
    int32_t *sim_len;             /* (max_slots, rows) tokens per row */
    int64_t *sim_pos;             /* (max_slots) position */
    int32_t *sim_active;          /* (max_slots) assigned */
    uint64_t *sim_stamp;          /* (max_slots) slot's sim_* valid when ==
                                     sim_serial */
    uint64_t sim_serial;          /* one per validation pass */
    int32_t *touched;             /* (max_slots) slots with valid sim_* */
    int n_touched;
    int32_t *entry_of;                   /* (max_slots) entry index or -1 */
    const struct gw_entry *plan_entries; /* the plan being validated */
    char *sp_bad;                 /* (max_slots, GW_WORKER_SLOT_ERROR_MAX)
                                     rank 0: the plan check's verdict on
                                     the sampling of each slot's sampled
                                     entry ("" = usable) */
    int32_t *row_max;             /* (rows) validation scratch */
    char error[512];              /* the result's error of the last step */
    struct gw_grammar gram;       /* rank 0: structured outputs' matchers
                                     and masks per slot (gw_grammar.h) */
    /* Hello storage */
    char model_name[256];
    char profile_name[256];
};

/* Builds the worker without talking to any peer: loads the rank's
 * profile, layout and model shard (gw_rank_load), creates the
 * backend (which sizes its pool and, on rank 0, names the communicator
 * group) and the per-slot tables. Returns 0, or TG_EINVAL /
 * TG_EUNSUPPORTED (a build without CUDA, a shape the kernels lack) /
 * TG_ENODEV / TG_ENOMEM (naming the numbers) / a loader's code with the
 * reason in err; on failure *w is left freed. The worker runs plans only
 * after gw_worker_comm_join. */
int gw_worker_init(struct gw_worker *w, const struct gw_worker_opts *o,
                   char *err, size_t errlen);

/* Frees everything the worker owns; safe on a zeroed or half-built
 * worker. */
void gw_worker_free(struct gw_worker *w);

/* Fills *h with what this rank announces: rank, world size, pool pages,
 * its layout, backend and model, and the communicator kind and (rank 0)
 * id. The strings and id point into *w and stay valid until
 * gw_worker_free. */
void gw_worker_hello(const struct gw_worker *w, struct gw_hello_info *h);

/* Joins the communicator group of a CommSetup from the router: checks its
 * version and world size, then lets the backend join the group it names
 * (with world size 1 any kind and id, also none, is accepted). Returns 0,
 * TG_EPROTO (joined already, or another protocol version), TG_EINVAL /
 * TG_EUNSUPPORTED (a setup this worker cannot join) or the backend's
 * codes, with the reason in err (for CommReady's error); the worker stays
 * unjoined on failure. */
int gw_worker_comm_join(struct gw_worker *w, const struct gw_comm_setup *cs,
                        char *err, size_t errlen);

/* Runs one plan (see the top of this file) and fills *out: step_id, rank,
 * ok, error, the tokens and slot errors (rank 0), step_seconds and
 * backend_seconds. Before
 * gw_worker_comm_join every plan fails with TG_EPROTO. With T > 1 every
 * rank must get every plan; a plan one rank rejects and another runs
 * leaves the others' collectives to time out (TG_ETIMEDOUT, peers_lost
 * set). out's arrays and strings point into *w and stay valid until the
 * next gw_worker_step or gw_worker_free. Returns 0 when the step ran, else
 * the negative code of the failure with out->ok false and out->error
 * naming the slot, entry or field. A plan rejected by validation
 * (including a step id not above the last accepted one) changes nothing;
 * a failure of the forward pass itself (which validation should make
 * impossible) leaves the involved slots for the router to free. */
int gw_worker_step(struct gw_worker *w, const struct gw_plan *plan,
                   struct gw_result *out);

/* Work that may follow a step once its result is on its way (rank 0):
 * the token masks of the constrained slots' next draws (gw_grammar.h),
 * computed while the router plans the next step. */
void gw_worker_after_step(struct gw_worker *w);

#endif /* GW_WORKER_H */
