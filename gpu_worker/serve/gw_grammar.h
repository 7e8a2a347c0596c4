/*
 * gw_grammar.h — structured outputs on worker rank 0 (DESIGN.md §4.11):
 * the grammars the router prepared, one matcher of common/grammar per
 * constrained slot, next to the sampler, and the token mask of the slot's
 * next draw.
 *
 * Prepared grammars ("pins"). A constrained request enters no step before
 * its grammar is ready here: the router first sends a prepare (proto
 * GrammarCommand: an id and the spec text), gw_grammar_pin queues the
 * grammar's fetch (gm_cache_get: a cache hit in microseconds, a first-seen
 * schema's compile 0.05 s to the 10 s limit) as a job of the compile pool
 * and returns at once; when the job ends the pool thread puts it on a done
 * list and makes gw_grammar_fd readable, and the worker's loop collects
 * the outcome between steps (gw_grammar_take_ready) and reports it
 * (GrammarReport). A ready pin holds one reference to its grammar until
 * the router releases the id (gw_grammar_unpin); a failed one is reported
 * and forgotten. The pool: GW_GRAMMAR_POOL threads taking jobs in FIFO
 * order, at most GW_GRAMMAR_QUEUE waiting (a prepare past that is
 * reported failed at once with `busy` set: the router keeps fewer
 * outstanding, so this is its backstop); a pin released before its job
 * started drops the job unrun. Identical specs in flight compile once
 * (the cache makes the second job wait for the first's compile).
 *
 * A slot's start (a fresh plan entry naming a pin) is synchronous and
 * never waits: it builds the slot's matcher from the pinned grammar and
 * feeds it the replayed tokens. An entry whose pin is unknown or not
 * ready is a protocol error that fails that request alone
 * (gw_grammar_slot_error), never a wait. Nothing on the step path waits
 * for the pool.
 *
 * The vocabulary (the model directory's tokenizer read and its trie
 * built: about 1 s and 10 MB at Qwen3's 151,669 ids) is loaded on the
 * pool too, never on the step path: gw_grammar_preload queues it at
 * start-up, and failing that the first fetch loads it; every fetch waits
 * for it. A vocabulary that cannot be loaded fails the prepares with the
 * reason (logged once), never the worker.
 *
 * Replayed tokens the grammar rejects fail that request alone
 * (gw_grammar_slot_error; the worker turns it into a slot error at the
 * draw), never the worker.
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
 * unchecked. Replayed tokens run the same machine. The trigger is read
 * from the spec on the pool, with the grammar, so a slot's start parses
 * no JSON.
 *
 * Threads: the worker's main thread calls every function; the pool's
 * threads touch only their jobs, the done list, the vocabulary (while
 * loading it) and the cache. A compile's token-mask stage runs on OpenMP
 * threads, capped at max(1, (cores - 1) / GW_GRAMMAR_POOL) each, so a
 * full pool's compiles leave the step loop a core.
 */
#ifndef GW_GRAMMAR_H
#define GW_GRAMMAR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_cache.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_vocab.h"
#include "gpu_worker/serve/gw_callwatch.h"

#define GW_GRAMMAR_ERR_MAX 384

/* Compile threads of a worker: two keep a slow schema from holding up
 * every other new schema without letting a flood of them take the cores
 * the step loop needs. */
#define GW_GRAMMAR_POOL 2
/* The compile threads' nice value (their OpenMP threads inherit it): a
 * core both want goes to the step loop about 3 times in 4 (CFS weights
 * 1024 : 335), so a first-seen schema's compile takes mostly the cycles
 * the steps leave (on a GPU worker the host cores are mostly idle and
 * compiles run at full speed; on a CPU worker busy with steps they run
 * slower). Nice 10 (10 in 11) starved compiles past their 10 s wall-clock
 * limit on the loaded 2-core machine (docs/PERFORMANCE.md). */
#define GW_GRAMMAR_NICE 5
/* Fetch jobs waiting for a pool thread: past this, a prepare fails at
 * once (busy) rather than wait behind ~GW_GRAMMAR_QUEUE / 2 compiles of
 * up to 10 s each. The router's --max-grammar-compiles (default 64) keeps
 * no more than this outstanding. */
#define GW_GRAMMAR_QUEUE 64

struct gw_gjob; /* gw_grammar.c: one job of the compile pool */
struct gw_gpin; /* gw_grammar.c: one prepared grammar */

/* A prepare whose fetch ended (or that was refused at once): what the
 * GrammarReport says of it. */
struct gw_gready {
    uint64_t id;
    int ok;   /* pinned: the grammar is ready under id */
    int busy; /* !ok: the queue was full (retry later), not the spec */
    char error[GW_GRAMMAR_ERR_MAX]; /* !ok: why; "" when ok */
};

struct gw_gslot {
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

/* The default bound of the compiled grammars a worker caches (a nested
 * order schema takes ~9 MB at Qwen3's vocabulary, docs/PERFORMANCE.md). */
#define GW_GRAMMAR_CACHE_BYTES ((size_t)256 << 20)

/* The budget of one slot's matching work per token: its mask and its
 * accept each (gm_matcher_set_budget). A few microseconds and ~100 work
 * units is usual; the bound is ~10,000 times that, and a request over it
 * fails alone with the reason, so a grammar too ambiguous to follow costs
 * the batch at most one such step per request. */
#define GW_GRAMMAR_TOKEN_WORK 1000000u
#define GW_GRAMMAR_TOKEN_S 0.05

struct gw_grammar_stats {
    uint64_t draws;     /* constrained draws (the worker counts them) */
    uint64_t masks;     /* masks computed */
    double mask_s;      /* seconds computing them */
    uint64_t waits;     /* of which computed when a draw needed them */
    double wait_s;      /* seconds the draws waited */
    uint64_t prepares;  /* pins asked for */
    uint64_t fetched;   /* fetches ended on the pool */
    double fetch_s;     /* their seconds, queue wait excluded */
    uint64_t failed;    /* prepares reported failed (busy included) */
    uint64_t cancelled; /* jobs dropped unrun: released before they ran */
    uint64_t rejected;  /* prepares refused: the queue was full */
    uint64_t unpinned;  /* slot starts naming no ready pin (failed) */
    uint64_t over_budget; /* requests failed: a token's matching work
                             was over GW_GRAMMAR_TOKEN_WORK / _S */
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
    size_t cache_bytes;  /* the cache's bound */
    uint64_t token_work; /* a slot's matcher budget per call (init:
                            GW_GRAMMAR_TOKEN_WORK; tests lower it before
                            a slot starts) */
    double token_s;      /* (init: GW_GRAMMAR_TOKEN_S) */
    double compile_s;    /* wall-time limit of one compile, seconds
                            (init: GM_LIMIT_COMPILE_S; the worker sets
                            --grammar-compile-timeout before
                            gw_grammar_preload) */
    struct gm_vocab v;
    struct gm_cache cache;
    struct gw_gslot *slots; /* (max_slots) */
    int max_slots;
    struct gw_gpin **pins; /* (n_pins) by increasing id; main thread */
    size_t n_pins, cap_pins;
    struct gw_gready *refused; /* (n_refused) prepares failed at once,
                                  not yet taken; main thread */
    size_t n_refused, cap_refused;
    int efd; /* eventfd: readable after a fetch ended */
    struct gw_grammar_stats st;
    /* The compile pool. */
    pthread_mutex_t pool_mu; /* guards the fields below and loaded */
    pthread_cond_t pool_cv;  /* a job queued, hold or stop changed, a
                                vocabulary load ended */
    pthread_t threads[GW_GRAMMAR_POOL];
    int n_threads;                   /* started */
    struct gw_gjob *q_head, *q_tail; /* waiting jobs, oldest first */
    struct gw_gjob *d_head, *d_tail; /* ended prepares, oldest first */
    int queued;                      /* jobs in the queue */
    int running;                     /* jobs on pool threads */
    int loading;                     /* a pool thread loads the vocabulary */
    int hold;        /* the threads take no job (gw_grammar_hold) */
    int stop;        /* the threads end (free) */
    int abandoned;   /* gw_grammar_shutdown left *g to running threads */
    int omp_threads; /* of one compile's token-mask stage */
    /* Test hook, NULL unless set before the first job: called on a pool
     * thread, under pool_mu (it must not call gw_grammar), as the thread
     * takes a prepare's job, with the jobs running then (this one too). */
    void (*on_job)(void *arg, uint64_t pin, int running);
    void *on_job_arg;
};

/* Prepares *g for max_slots slots of a model with `vocab` logits per row
 * whose tokenizer lies in model_dir (copied; read on the pool, see
 * gw_grammar_preload), makes the eventfd and starts the pool's threads.
 * cache_bytes bounds the compiled grammars the cache keeps (0:
 * GW_GRAMMAR_CACHE_BYTES); one grammar's token-mask caches may take half
 * of it at most (a bigger one fails its compile, naming the limit).
 * Returns 0, TG_ENOMEM, TG_EIO (no eventfd) or TG_EAGAIN (no thread to be
 * had). */
int gw_grammar_init(struct gw_grammar *g, const char *model_dir, int vocab,
                    int max_slots, size_t cache_bytes);

/* For a process about to exit: stops the pool and waits at most `ms`
 * for its threads. Returns 0 when they all ended (everything is then
 * freed, as by gw_grammar_free), or TG_EBUSY when one still runs (a
 * vocabulary load, seconds on a loaded machine, or a compile, bounded by
 * its 10 s limit): its threads are detached and *g is left to them
 * (marked abandoned: a later gw_grammar_free does nothing), so *g must
 * stay allocated until the process exits. Either way the exit does not
 * wait for them. */
int gw_grammar_shutdown(struct gw_grammar *g, int ms);

/* Queues the vocabulary's load on the pool (the worker's start-up: the
 * first prepare then finds it loaded). Returns 0 or TG_ENOMEM. */
int gw_grammar_preload(struct gw_grammar *g);

/* hold 1: the pool's threads take no new job until called with 0 (jobs
 * running go on). For tests: prepares stay outstanding meanwhile. */
void gw_grammar_hold(struct gw_grammar *g, int hold);

/* Frees everything, waiting for the jobs running (the compile limit
 * bounds them; queued ones are dropped); safe on a zeroed or half-built
 * *g. */
void gw_grammar_free(struct gw_grammar *g);

/* The router's prepare `id` of spec [spec, spec + len) (copied): queues
 * the grammar's fetch on the pool and returns at once. Its outcome comes
 * out of gw_grammar_take_ready exactly once, also when it is refused
 * here: an id already pinned or being fetched, the vocabulary failed to
 * load, GW_GRAMMAR_QUEUE jobs already waiting (busy), or no memory. */
void gw_grammar_pin(struct gw_grammar *g, uint64_t id, const char *spec,
                    size_t len);

/* The router releases `id`: a ready pin drops its grammar reference
 * (matchers built from it keep theirs); a fetch not started yet is
 * dropped from the queue, a running one finishes on its thread and is
 * then freed; no outcome of it is taken afterwards. Unknown ids (failed
 * ones, already reported and forgotten) are ignored. */
void gw_grammar_unpin(struct gw_grammar *g, uint64_t id);

/* Up to `cap` outcomes of prepares not taken yet into out (the refusals
 * first, then fetches in the order they ended); a failed prepare is
 * forgotten once taken. Never waits. Returns how many. Resets the
 * eventfd: call it until it returns fewer than cap. */
size_t gw_grammar_take_ready(struct gw_grammar *g, struct gw_gready *out,
                             size_t cap);

/* The eventfd that becomes readable when a fetch ended (poll it with the
 * link's socket), or -1 on a zeroed *g (ranks other than 0). */
int gw_grammar_fd(const struct gw_grammar *g);

/* Pins held (ready or being fetched). */
size_t gw_grammar_pins(const struct gw_grammar *g);

/* The slot is unconstrained from now on (freed, or a fresh entry without
 * a constraint). */
void gw_grammar_slot_clear(struct gw_grammar *g, uint32_t slot);

/* The slot starts the constraint of ready pin `pin` after the n tokens it
 * generated before: its matcher is built from the pinned grammar and
 * accepts them, here and now. `spec` (len bytes, may be NULL) is the
 * plan entry's spec text, which must be the pin's. Returns 0, or the
 * failure's code with the reason kept for gw_grammar_slot_error:
 * TG_EPROTO (no ready pin of that id, or another spec: the router's
 * error, which fails this request alone), TG_EINVAL (a replayed token the
 * grammar rejects), TG_ENOMEM. Never waits for the pool. */
int gw_grammar_slot_start(struct gw_grammar *g, uint32_t slot, uint64_t pin,
                          const char *spec, size_t len, const uint32_t *tokens,
                          size_t n);

/* The reason the slot's request fails, or NULL. */
const char *gw_grammar_slot_error(struct gw_grammar *g, uint32_t slot);

/* The mask of the slot's next draw ((vocab + 31) / 32 words at least,
 * valid until the slot's next accept, start or clear), or NULL when the
 * slot is unconstrained or failed. Computes it when stale (a wait). */
const uint32_t *gw_grammar_slot_mask(struct gw_grammar *g, uint32_t slot);

/* Accepts the token drawn for the slot (no-op when unconstrained).
 * Returns 0 or TG_EINVAL with the reason kept (the token breaks the
 * constraint: the mask was not applied). */
int gw_grammar_slot_accept(struct gw_grammar *g, uint32_t slot, int32_t token);

/* Computes every stale mask of a constrained slot (after a step). */
void gw_grammar_prepare(struct gw_grammar *g);

/* Logs the statistics (info): draws, masks and their mean time, how long
 * draws waited for masks in all and per draw, prepares, fetches and their
 * mean time, failures, cancelled, refused and unprepared starts. Nothing
 * when no prepare was asked for. */
void gw_grammar_log_stats(const struct gw_grammar *g);

#endif /* GW_GRAMMAR_H */
