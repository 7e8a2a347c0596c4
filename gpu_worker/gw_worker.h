/*
 * gw_worker.h — one worker rank's plan execution (DESIGN.md §2), without
 * any I/O: the model, the KV pool, the persistent block tables and the
 * sampler of a tangram-worker process. gw_wlink.h moves the messages.
 *
 * The router owns page accounting; the worker keeps, per request slot and
 * per (layer, group) row, the list of page ids the router handed it (grown
 * and cut by PageDelta records) and the tokens physically written to each
 * row. A BatchPlan is applied as:
 *   1. `frees`: the listed slots are dropped;
 *   2. every entry with `fresh`: its slot is cleared (page lists emptied,
 *      row lengths from row_lens or 0, position = start_pos, token
 *      history restarted at start_pos);
 *   3. `page_deltas` in order: cut the row to truncate_to pages when set,
 *      then append page_ids;
 *   4. every PREFILL entry, one by one (gw_forward_prefill), then all
 *      DECODE entries as one batch (gw_forward_decode);
 *   5. rank 0 only: every entry with `sample` draws one token.
 * The whole plan is validated before step 1 touches anything (slots,
 * layers, groups and page ids in range, positions equal to the slot's,
 * chunk sizes, token ids, rows holding at most what their pages can), so
 * a bad plan yields an error result and leaves the worker unchanged and
 * usable. Sampling parameters are the one thing a client chooses: rank 0
 * checks them when it draws (finite, in range, logprobs at most
 * GW_WORKER_MAX_LOGPROBS), and an entry whose draw cannot be made gets a
 * SlotError instead of a token while the step and every other entry go
 * on (its KV was written like the others'; the router ends that request
 * alone). The router is trusted not to hand one page
 * to two rows (that would mix data, never corrupt memory).
 *
 * Sampling (rank 0): struct tg_sampling from WorkerSampling and the CPU
 * sampler of kernels/tg_ops.h. The RNG state of a draw is
 * seed + k * 0x9E3779B97F4A7C15, k = tokens the request has sampled
 * before (= the slot's position - num_prompt_tokens, at least 0): the
 * splitmix64 state after k draws (Steele, Lea & Flood 2014), exactly what
 * gw_engine_generate's running state is, so a request sampled through
 * plans draws what an in-process generation draws, and a recompute after
 * preemption (fresh, re-prefilling prompt + output) continues the stream.
 * Penalties see the slot's prompt tokens and output tokens the worker was
 * given since the slot's last fresh start (positions [start_pos, pos));
 * tokens of adopted stored KV (a fresh entry with start_pos > 0) are not
 * known to the worker and do not count — a documented limit.
 * On the CUDA backend, a decode batch whose sampling entries use no
 * penalties and at most GW_CUDA_MAX_TOP top logprobs is drawn on the
 * device instead (gw_cuda_sample: the same vLLM order, a Philox draw keyed
 * by (seed, k) with the same k, log-probabilities of the raw logits), so
 * its logits never cross to the host; greedy rows give the same token as
 * the CPU sampler would on those logits, sampled rows the same
 * distribution but another stream of random numbers. Prefill rows and
 * rows with penalties use the CPU sampler on logits copied back.
 *
 * Tensor parallelism (DESIGN.md §4.7; the CPU backend's shared-memory
 * group stands in for NCCL in CI): rank r of T loads the
 * profile pf_profile_rank gives it (gw_engine_load_parts), its model
 * shard and its pool (gw_worker_init, no communication). Rank 0 also names
 * the communicator group (gw_comm_new_id) and announces it in its Hello;
 * the router relays it to every rank in a CommSetup once all T said
 * Hello, and each rank joins (gw_worker_comm_join) and answers CommReady.
 * One rank goes the same way (its join needs no peer). No plan runs
 * before the join. Every rank runs every plan (the router sends each the
 * same entries with its own page deltas), so their collectives pair up:
 * all-reduces after o_proj and down_proj, and the gather of the
 * vocab-parallel logits for exactly the entries that sample (each rank
 * knows them from the plan). Rank 0 samples; the others answer without
 * tokens. A collective that times out (a peer died or failed the plan) fails the
 * step with TG_ETIMEDOUT and marks the worker's peers as lost
 * (gw_worker.peers_lost, and *opts.peer_lost_flag): the process should
 * exit with GW_WORKER_EXIT_PEERS_LOST for the supervisor to restart the
 * group.
 *
 * Single-threaded: one owner thread per worker (the forward pass uses
 * OpenMP inside).
 */
#ifndef GW_WORKER_H
#define GW_WORKER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/pf_profile.h"
#include "common/tg_config.h"
#include "gpu_worker/gw_comm.h"
#include "gpu_worker/gw_cuda.h"
#include "gpu_worker/gw_forward.h"
#include "gpu_worker/gw_model.h"
#include "worker.pb-c.h"

/* Short names for the generated protocol types (proto/worker.proto). */
typedef Tangram__Worker__V1__Hello GwHello;
typedef Tangram__Worker__V1__LayoutSummary GwLayoutSummary;
typedef Tangram__Worker__V1__BatchPlan GwBatchPlan;
typedef Tangram__Worker__V1__PlanEntry GwPlanEntry;
typedef Tangram__Worker__V1__PageDelta GwPageDelta;
typedef Tangram__Worker__V1__StepResult GwStepResult;
typedef Tangram__Worker__V1__SampledToken GwSampledToken;
typedef Tangram__Worker__V1__SlotError GwSlotError;
typedef Tangram__Worker__V1__CommSetup GwCommSetup;
typedef Tangram__Worker__V1__CommReady GwCommReady;

#define GW_NCCL_ID_BYTES 128    /* sizeof(ncclUniqueId) (TG_NCCL_ID_BYTES) */
#define GW_NCCL_KIND "nccl"     /* Hello/CommSetup comm_kind of CUDA ranks */
#define GW_PROTOCOL_VERSION 1u   /* PROTOCOL_VERSION_1 of worker.proto */
#define GW_WORKER_MAX_LOGPROBS 64 /* top alternatives per sampled token */
#define GW_WORKER_SLOT_ERROR_MAX 256 /* bytes of one SlotError text */
#define GW_WORKER_EXIT_PEERS_LOST 5 /* tangram-worker's status when an
                                       all-reduce timed out */

enum gw_worker_backend {
    GW_WORKER_BACKEND_CPU = 0,
    GW_WORKER_BACKEND_CUDA = 1,
};

struct gw_worker_opts {
    const char *model_dir;      /* Hugging Face model directory */
    const char *profile_path;   /* profile JSON; NULL or "none" = full KV */
    const char *method;         /* scoring method; NULL = the profile's */
    enum gw_worker_backend backend;
    int heads_per_group;        /* H_p without a profile */
    int page_size;              /* P tokens per page */
    int prefill_chunk;          /* C tokens per prefill chunk */
    int64_t kv_pages;           /* > 0: exactly this many pool pages */
    struct tg_config_amount kv_memory; /* used when kv_pages <= 0: bytes,
                                          or a fraction of the available
                                          host RAM (the --kv-memory
                                          semantics) */
    int max_slots;              /* request slots (router --max-num-seqs) */
    int rank;                   /* 0 .. world_size - 1; rank 0 samples */
    int world_size;             /* tensor-parallel ranks T */
    int comm_timeout_ms;        /* joining and every collective wait; <= 0:
                                   the default of gw_comm.h */
    volatile sig_atomic_t *peer_lost_flag; /* optional: set to 1 when an
                                   all-reduce fails (e.g. the serve loop's
                                   stop flag) */
    int n_threads;              /* <= 0: OpenMP default (with T > 1: the
                                   online cores / T) */
    int device;                 /* CUDA backend: device ordinal; < 0: the
                                   rank (one worker per GPU) */
    int cuda_graphs;            /* CUDA backend: capture decode graphs */
    int step_timeout_ms;        /* CUDA backend, T > 1: bound of a step's
                                   wait before the NCCL group is aborted;
                                   <= 0: 120 s */
};

/* The persistent state of one request slot. */
struct gw_wslot {
    int active;            /* assigned by a fresh entry, not freed since */
    int64_t pos;           /* next position (tokens processed) */
    int32_t num_prompt;    /* the request's prompt length (penalties) */
    int32_t *len;          /* (rows) tokens written per (l, g) row */
    int32_t **pages;       /* (rows) -> (cap[r]) page ids of each row */
    int32_t *n_pages;      /* (rows) page ids in use per row */
    int32_t *cap;          /* (rows) capacity of pages[r] */
    int32_t *hist;         /* (hist_cap) tokens at positions
                              [hist_from, pos) */
    int64_t hist_from;     /* first position whose token is known */
    int64_t hist_cap;
    int64_t n_sampled;     /* tokens sampled before the latest draw */
    uint64_t epoch;        /* changed whenever a row's page list is
                              replaced or cut (gw_seq.epoch) */
};

struct gw_worker {
    struct gw_model model;
    struct pf_profile profile;
    struct gw_kv_layout layout;
    enum tg_score_method method;
    struct tg_backend *be;
    struct gw_comm comm;          /* all-reduce group (no-op for T = 1);
                                     zeroed until joined */
    struct gw_runtime rt;         /* CPU backend's forward pass */
    struct gw_cuda cu;            /* CUDA backend's forward pass */
    struct tg_nccl *nccl;         /* CUDA backend's group (T > 1), owned */
    uint8_t nccl_id[GW_NCCL_ID_BYTES]; /* rank 0: the group's unique id */
    int device;                   /* CUDA device ordinal */
    enum gw_worker_backend backend;
    int rank, world_size, max_slots;
    int max_tokens;               /* rows of one forward call:
                                     max(prefill chunk, max_slots) */
    int joined;                   /* gw_worker_comm_join succeeded */
    int comm_timeout_ms;
    char comm_id[GW_COMM_ID_MAX]; /* rank 0: the group it named; "" on
                                     other ranks */
    int peers_lost;               /* an all-reduce failed: exit */
    volatile sig_atomic_t *peer_lost_flag; /* borrowed, optional */
    int rows;                     /* L * G */
    int32_t n_pages;              /* pool pages */
    uint64_t epoch_next;          /* source of gw_wslot.epoch values */
    uint64_t last_step;           /* step id of the last accepted plan */
    struct gw_wslot *slots;       /* (max_slots) */
    float *logits;                /* (max_slots, V) per-entry logits;
                                     NULL on ranks > 0 */
    struct gw_seq *seqs;          /* (max_slots) forward views */
    struct gw_seq **seq_ptrs;     /* (max_slots) decode batch */
    int32_t *ids;                 /* (max(C, max_slots)) token scratch */
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
    int32_t *entry_of;            /* (max_slots) entry index or -1, then the
                                     logits row of each entry */
    /* result storage, reused by every step */
    GwSampledToken *tok;          /* (max_slots) */
    GwSampledToken **tok_ptrs;    /* (max_slots) */
    GwSlotError *serr;            /* (max_slots) per-request failures */
    GwSlotError **serr_ptrs;      /* (max_slots) */
    char *serr_text;              /* (max_slots, GW_WORKER_SLOT_ERROR_MAX) */
    uint32_t *top_ids;            /* (max_slots, GW_WORKER_MAX_LOGPROBS) */
    float *top_lps;               /* (max_slots, GW_WORKER_MAX_LOGPROBS) */
    int32_t *top_tmp;             /* (GW_WORKER_MAX_LOGPROBS) */
    /* CUDA rank 0: decode rows sampled on the device (gw_cuda_sample) */
    uint64_t *pre_mark;           /* (max_slots) step id of the slot's
                                     device draw, 0 = none */
    int32_t *pre_row;             /* (max_slots) its row in pre_* */
    int32_t *pre_tok;             /* (max_slots) by decode row */
    float *pre_lp;                /* (max_slots) */
    int32_t *pre_top_ids;         /* (max_slots, GW_CUDA_MAX_TOP) */
    float *pre_top_lps;           /* (max_slots, GW_CUDA_MAX_TOP) */
    int pre_top;                  /* top logprobs per row of the draw */
    struct tg_cuda_sample_params *dev_params; /* (max_slots) */
    char error[512];              /* StepResult.error of the last step */
    /* Hello storage */
    GwLayoutSummary summary;
    char model_name[256];
    char profile_name[256];
};

/* Builds the worker without talking to any peer: loads the rank's
 * profile and model shard (gw_engine_load_parts), sizes the pool from
 * kv_pages or kv_memory, creates the backend and the runtime and the
 * per-slot tables; rank 0 also names its communicator group (w->comm_id,
 * sent in its Hello). With the CUDA backend it sets up the device runtime
 * instead (gw_worker_internal.h: memory plan, weights, split map, rank
 * 0's NCCL unique id). Returns 0, or TG_EINVAL / TG_EUNSUPPORTED (a build
 * without CUDA, a shape the kernels lack) / TG_ENODEV / TG_ENOMEM (the
 * memory plan, naming the numbers) / a loader's code with the reason in
 * err; on failure *w is left freed. The
 * worker runs plans only after gw_worker_comm_join. */
int gw_worker_init(struct gw_worker *w, const struct gw_worker_opts *o,
                   char *err, size_t errlen);

/* Frees everything the worker owns; safe on a zeroed or half-built
 * worker. */
void gw_worker_free(struct gw_worker *w);

/* Fills *h (initialized by the caller with TANGRAM__WORKER__V1__HELLO__INIT
 * or not: every field is set) with version, rank, world size, pid, pool
 * pages, the LayoutSummary, comm_kind ("shm") and on rank 0 the comm_id it
 * named. h->layout, its strings and comm_id point into *w (or static
 * storage) and stay valid until gw_worker_free. */
void gw_worker_hello(struct gw_worker *w, GwHello *h);

/* Joins the communicator group of a CommSetup from the router: checks its
 * version, world size and kind ("shm"; with world size 1 any kind and id,
 * also none, is accepted), then joins the shared-memory group named by
 * comm_id as this rank (gw_comm_init; rank 0 creates it and waits for the
 * others, bounded by opts.comm_timeout_ms). Returns 0, TG_EPROTO (joined
 * already, or another protocol version), TG_EINVAL / TG_EUNSUPPORTED (a
 * setup this worker cannot join) or gw_comm_init's codes, with the reason
 * in err (for CommReady.error); the worker stays unjoined on failure. */
int gw_worker_comm_join(struct gw_worker *w, const GwCommSetup *cs, char *err,
                        size_t errlen);

/* Runs one plan (see the top of this file) and fills *out: version,
 * step_id, rank, ok, error, the sampled tokens and slot errors (rank 0)
 * and step_seconds.
 * Before gw_worker_comm_join every plan fails with TG_EPROTO.
 * With T > 1 every rank must get every plan; a plan one rank rejects and
 * another runs leaves the others' all-reduce to time out (TG_ETIMEDOUT,
 * peers_lost set).
 * out's arrays and strings point into *w and stay valid until the next
 * gw_worker_step or gw_worker_free. Returns 0 when the step ran, else the
 * negative code of the failure with out->ok false and out->error naming
 * the slot, entry or field. A plan rejected by validation (including a
 * step id not above the last accepted one) changes nothing; a failure of
 * the forward pass itself (which validation should make impossible)
 * leaves the involved slots for the router to free. */
int gw_worker_step(struct gw_worker *w, const GwBatchPlan *plan,
                   GwStepResult *out);

#endif /* GW_WORKER_H */
