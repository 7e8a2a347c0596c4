/*
 * gw_grammar.h — structured outputs on worker rank 0 (DESIGN.md §4.11):
 * one matcher of common/grammar per constrained slot, next to the sampler,
 * and the token mask of the slot's next draw.
 *
 * A constrained request's fresh entries carry its spec text and the
 * tokens it generated before (gw_entry.grammar, grammar_tokens: a restart
 * after preemption replays them, a fork starts from the spec). Its
 * grammar comes from one process-wide gm_cache keyed by the spec text,
 * so a schema seen before costs a lookup. The lookup (a first-seen
 * schema's compile: 0.05 s to the 10 s limit) runs as a job on the
 * compile pool: GW_GRAMMAR_POOL threads taking the jobs in FIFO order, at
 * most GW_GRAMMAR_QUEUE of them waiting (one more fails its request at
 * once: "too many output constraints compiling"), a job whose slot was
 * cleared before it started dropped unrun. It overlaps the request's
 * prefill and the other requests' steps; the slot's first draw waits for
 * it only if it is still queued or running then (counted in
 * gw_grammar_stats). Identical specs in flight compile once (the cache
 * makes the second job wait for the first's compile).
 *
 * The vocabulary (the model directory's tokenizer read and its trie
 * built: about 1 s and 10 MB at Qwen3's 151,669 ids) is loaded on the
 * pool too, never on the step path: gw_grammar_preload queues it at
 * start-up, and failing that the first compile job loads it; every job
 * waits for it. A vocabulary that cannot be loaded fails the constrained
 * requests with the reason (logged once), never the worker.
 *
 * A spec that fails to compile, or replayed tokens it rejects, fail that
 * request alone (gw_grammar_slot_error; the worker turns it into a slot
 * error at the draw), never the worker.
 *
 * Per step: the draw asks for the slot's mask (gw_grammar_slot_mask),
 * the mask is applied to the logits before sampling and log-probabilities,
 * and the drawn token is accepted (gw_grammar_slot_accept), which makes
 * the mask stale. gw_grammar_prepare computes the stale masks; the worker
 * calls it right after the step's result is sent, so the masks of step
 * s + 1 are computed while the router plans that step. A mask still stale
 * when a draw needs it is computed there and counted as a wait
 * (gw_grammar_stats). When the document is complete and EOS was drawn
 * (the router may keep a request going, e.g. min_tokens), the mask allows
 * the EOS ids only.
 *
 * Triggered specs (strict tools under tool_choice "auto"): the slot is
 * free — no mask, no cost — until the trigger shows in the accepted
 * tokens' bytes (gw_callwatch.h); then the matcher starts on the bytes
 * from the trigger's first byte to the end of that token and the mask
 * applies from the next draw; when the call is complete (only EOS could
 * follow) the slot is free again, unless the spec is anchored (the
 * constraint then holds to the end). A token whose bytes after the
 * trigger the grammar rejects (e.g. one token holding "<tool_call>"
 * and a wrong next byte) fails the request with that reason: the call
 * could not be kept strict, and the output is never let through
 * unchecked. Replayed tokens run the same machine.
 *
 * Threads: the worker's main thread calls every function; the pool's
 * threads touch only their jobs, the vocabulary (while loading it) and
 * the cache. A compile's token-mask stage runs on OpenMP threads, capped
 * at max(1, (cores - 1) / GW_GRAMMAR_POOL) each, so a full pool's compiles
 * leave the step loop a core.
 */
#ifndef GW_GRAMMAR_H
#define GW_GRAMMAR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_cache.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_vocab.h"
#include "gpu_worker/gw_callwatch.h"

#define GW_GRAMMAR_ERR_MAX 384

/* Compile threads of a worker: two keep a slow schema from holding up
 * every other new schema without letting a flood of them take the cores
 * the step loop needs. */
#define GW_GRAMMAR_POOL 2
/* Compile jobs waiting for a pool thread: past this, a new constrained
 * request fails at once rather than wait behind ~GW_GRAMMAR_QUEUE / 2
 * compiles of up to 10 s each. */
#define GW_GRAMMAR_QUEUE 64

struct gw_gjob; /* gw_grammar.c: one job of the compile pool */

struct gw_gslot {
    struct gw_gjob *job; /* the grammar being fetched, or NULL */
    uint32_t *replay;    /* (n_replay) tokens to accept once it is */
    size_t n_replay, cap_replay;
    int on; /* constrained: m and mask are live */
    struct gm_matcher m;
    uint32_t *mask;               /* (words) of the next draw */
    int ready;                    /* mask is of m's present state */
    /* A triggered spec (watch.trigger set): free text, unconstrained and
     * without a mask, while free_text; the trigger in the sampled bytes
     * starts m on them (gw_callwatch.h). */
    struct gw_callwatch watch;
    int free_text;
    char err[GW_GRAMMAR_ERR_MAX]; /* non-empty: the request fails */
};

struct gw_grammar_stats {
    uint64_t draws;         /* constrained draws (the worker counts them) */
    uint64_t masks;         /* masks computed */
    double mask_s;          /* seconds computing them */
    uint64_t waits;         /* of which computed when a draw needed them */
    double wait_s;          /* seconds the draws waited */
    uint64_t compiles;      /* grammars fetched on the pool */
    uint64_t compile_waits; /* of which a draw waited for */
    double compile_wait_s;  /* seconds it waited */
    uint64_t cancelled;     /* jobs dropped unrun: slot cleared */
    uint64_t rejected;      /* requests failed: the queue was full */
};

struct gw_grammar {
    char *model_dir; /* owned copy: its tokenizer gives the
                               vocabulary */
    int vocab;       /* the logits row's width */
    size_t words;    /* mask words: covers the row and the
                               tokenizer's ids */
    int loaded;      /* 1: v and cache ready; -1: loading failed
                               (load_err); under pool_mu */
    char load_err[GW_GRAMMAR_ERR_MAX];
    struct gm_vocab v;
    struct gm_cache cache;
    struct gw_gslot *slots; /* (max_slots) */
    int max_slots;
    struct gw_grammar_stats st;
    /* The compile pool. */
    pthread_mutex_t pool_mu; /* guards the fields below and loaded */
    pthread_cond_t pool_cv;  /* a job queued, hold or stop changed, a
                                vocabulary load ended */
    pthread_t threads[GW_GRAMMAR_POOL];
    int n_threads;                   /* started */
    struct gw_gjob *q_head, *q_tail; /* waiting jobs, oldest first */
    int queued;                      /* jobs in the queue */
    int running;                     /* jobs on pool threads */
    int loading;                     /* a pool thread loads the vocabulary */
    int hold;        /* the threads take no job (gw_grammar_hold) */
    int stop;        /* the threads end (free) */
    int omp_threads; /* of one compile's token-mask stage */
    /* Test hook, NULL unless set before the first job: called on a pool
     * thread, under pool_mu (it must not call gw_grammar), as the thread
     * takes a slot's job, with the jobs running then (this one too). */
    void (*on_job)(void *arg, uint32_t slot, int running);
    void *on_job_arg;
};

/* Prepares *g for max_slots slots of a model with `vocab` logits per row
 * whose tokenizer lies in model_dir (copied; read on the pool, see
 * gw_grammar_preload) and starts the pool's threads. Returns 0, TG_ENOMEM,
 * or TG_EAGAIN (no thread to be had). */
int gw_grammar_init(struct gw_grammar *g, const char *model_dir, int vocab,
                    int max_slots);

/* Queues the vocabulary's load on the pool (the worker's start-up: the
 * first constrained request then finds it loaded). Returns 0 or
 * TG_ENOMEM. */
int gw_grammar_preload(struct gw_grammar *g);

/* hold 1: the pool's threads take no new job until called with 0 (jobs
 * running go on). For tests and drains: a draw waiting for a held job
 * waits for the release. */
void gw_grammar_hold(struct gw_grammar *g, int hold);

/* Frees everything, waiting for the jobs running (the compile limit
 * bounds them; queued ones are dropped); safe on a zeroed or half-built
 * *g. */
void gw_grammar_free(struct gw_grammar *g);

/* The slot is unconstrained from now on (freed, or a fresh entry without
 * a constraint). Its job, if not started yet, is dropped from the queue;
 * if running, it finishes on its thread and is then freed. */
void gw_grammar_slot_clear(struct gw_grammar *g, uint32_t slot);

/* The slot starts the constraint of spec [spec, spec + len) (copied)
 * after the n tokens it generated before (copied): queues the grammar's
 * fetch on the pool and returns without waiting for it (nor for the
 * vocabulary). Returns 0, or the failure's code with the reason kept for
 * gw_grammar_slot_error: TG_EINVAL (the vocabulary failed to load),
 * TG_EBUSY (GW_GRAMMAR_QUEUE jobs already wait), TG_ENOMEM. A grammar
 * that does not compile, a vocabulary that fails to load meanwhile, or a
 * replayed token the grammar rejects, shows at gw_grammar_slot_error. */
int gw_grammar_slot_start(struct gw_grammar *g, uint32_t slot, const char *spec,
                          size_t len, const uint32_t *tokens, size_t n);

/* The reason the slot's request fails, or NULL; waits for the slot's
 * grammar first if it is still queued or being fetched. */
const char *gw_grammar_slot_error(struct gw_grammar *g, uint32_t slot);

/* The mask of the slot's next draw ((vocab + 31) / 32 words at least,
 * valid until the slot's next accept, start or clear), or NULL when the
 * slot is unconstrained or failed. Computes it when stale (a wait). */
const uint32_t *gw_grammar_slot_mask(struct gw_grammar *g, uint32_t slot);

/* Accepts the token drawn for the slot (no-op when unconstrained).
 * Returns 0 or TG_EINVAL with the reason kept (the token breaks the
 * constraint: the mask was not applied). */
int gw_grammar_slot_accept(struct gw_grammar *g, uint32_t slot, int32_t token);

/* Computes every stale mask of a constrained slot (after a step), taking
 * up the grammars fetched since (never waiting for one). */
void gw_grammar_prepare(struct gw_grammar *g);

/* Logs the statistics (info): draws, masks and their mean time, how long
 * draws waited for masks in all and per draw, grammars fetched, waited
 * for, cancelled and rejected. Nothing when no draw was constrained. */
void gw_grammar_log_stats(const struct gw_grammar *g);

#endif /* GW_GRAMMAR_H */
