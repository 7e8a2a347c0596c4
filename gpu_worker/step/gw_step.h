/*
 * gw_step.h — the one step loop: what drives the model through a backend,
 * whoever calls it. A worker rank runs the router's plans through it
 * (gpu_worker/serve/gw_worker.h); in-process generation runs its one
 * request through it as a one-slot worker (gpu_worker/engine/gw_engine.h).
 *
 * The step holds the request slots: per slot a mirror of the request's
 * rows (a kv_seq filled by page id, kv_seq.h: the page ids its caller
 * hands in and the tokens the forward pass wrote), its position, its
 * token history (penalties) and its turn's decode state. The caller owns
 * which pages a slot holds: it clears and starts slots (gw_step_slot_clear,
 * gw_step_slot_start) and appends or cuts their rows' ids (kv_seq_row_*
 * on slots[i].kv) before a step; whatever it checks before a step is its
 * own (a worker validates the router's plan first, gw_worker_check.c; the
 * engine checks its arguments and keeps its own page accounting, which
 * the slot mirrors). A step (gw_step_run) then runs the plan's entries
 * (gw_plan.h) through the backend (gpu_worker/backend/gw_backend.h):
 *   1. every PREFILL entry, one by one in plan order;
 *   2. every FORK entry once its source's last chunk has run: the pages of
 *      its rows that differ from the source's (the private copies of the
 *      partly filled last pages) get the source's content, it takes the
 *      source's position and token history, and rank 0 gives it a copy of
 *      the source's logits row to draw from with its own seed;
 *   3. every DECODE entry as one batch;
 *   4. with decode-time compression (DESIGN.md §4.9, cfg.trig), the slots
 *      whose decode append made their turn's decoded count a multiple of
 *      beta, compacted together through the backend's `compact`.
 * and rank 0 draws (gw_step_draw_all, or gw_step_draw for one entry).
 *
 * Logits rows: the sampled prefill and fork entries take rows 0 .. n_pf - 1
 * in plan order, the decode batch rows n_pf .. n_pf + nd - 1; at most one
 * entry per slot (the caller's invariant), so they fit the backend's
 * (max_slots, V) rows. Every rank knows which entries sample (the same
 * plan), so all take part in the logits of exactly those. With `announce`
 * rank 0 tells the backend the decode batch's draws before it runs, so a
 * backend can draw them where the logits are (the CUDA backend on the
 * device).
 *
 * Draws (rank 0): the RNG index of a draw is the tokens the request
 * sampled before (the slot's position - num_prompt_tokens, at least 0), so
 * a request drawn through plans draws what an in-process generation draws,
 * and a recompute after preemption (fresh, re-prefilling prompt + output)
 * continues the stream. Penalties see the slot's prompt tokens and the
 * output tokens it was fed since its last fresh start (positions
 * [start_pos, pos)); tokens of adopted stored KV (a fresh entry with
 * start_pos > 0) are not known to the step and do not count — a
 * documented limit. The caller's gate (cfg.hooks) may refuse a draw (a
 * slot error fails that request alone) and give it a token mask (bit i of
 * mask[i >> 5]: structured outputs); a masked draw's alternatives end at
 * the first id the mask removed. Its accept hook sees every token drawn.
 *
 * Per-head lengths (cfg.per_head: an adaptive method, gw_method_per_head,
 * or decode-time compression) live in each slot's kv_seq heads; after a
 * prefill chunk of an adaptive method (cfg.per_head_prefill) and after a
 * compaction the step lists the slot's heads in `hrep` for the caller to
 * report or account.
 *
 * Single-threaded: the caller's step thread (the backends use OpenMP or
 * a CUDA stream inside).
 */
#ifndef GW_STEP_H
#define GW_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_seq.h"
#include "gpu_worker/backend/gw_backend.h"
#include "gpu_worker/model/gw_seq.h"
#include "gpu_worker/model/gw_trig.h"
#include "gpu_worker/step/gw_plan.h"
#include "gpu_worker/step/gw_progress.h"

#define GW_STEP_MAX_TOP GW_BACKEND_MAX_TOP /* alternatives per token */
#define GW_STEP_ERROR_MAX 256              /* bytes of one slot error text */

/* The persistent state of one request slot. */
struct gw_slot {
    int active;           /* started, not cleared since */
    int64_t pos;          /* next position (tokens processed) */
    int32_t num_prompt;   /* the request's prompt length (penalties) */
    struct kv_seq kv;     /* its rows: page ids and tokens written */
    const int32_t **rowp; /* (rows) row pointers into kv's slab, set
                              before each forward call */
    int32_t *hist;        /* (hist_cap) tokens at positions
                              [hist_from, pos) */
    int64_t hist_from;    /* first position whose token is known */
    int64_t hist_cap;
    int32_t *dstart; /* (L, Hkv) with trig: first slot of each
                              head's decode region of the current turn
                              (its length when the turn's prefill ended,
                              or when its fork copied the source) */
    int64_t dbase;   /* with trig: position where the current
                              turn's decode began; a decode append that
                              leaves pos - dbase a multiple of beta
                              triggers a compaction */
};

/* The caller's say over rank 0's draws; NULL functions: every draw is
 * made, none is masked. */
struct gw_step_hooks {
    /* Why slot's next draw cannot be made (a slot error), or NULL with
     * *mask its token mask (NULL: none), which stays valid until the
     * draw's token is accepted. Called when the draw is announced and
     * again when it is made. */
    const char *(*gate)(void *ud, uint32_t slot, const uint32_t **mask);
    /* Token drawn for slot (masked: its draw had a mask): why it cannot
     * stand (a slot error), or NULL. */
    const char *(*accept)(void *ud, uint32_t slot, int32_t token, int masked);
    void *ud;
};

struct gw_step_cfg {
    struct gw_backend *be;          /* borrowed; outlives the step */
    const struct kv_layout *layout; /* borrowed: the rank's */
    const struct gw_trig_cfg *trig; /* borrowed decode-time compression,
                                       or NULL */
    int per_head;                   /* slots keep per-head lengths */
    int per_head_prefill;           /* prefill chunks report their
                                       slot's heads (an adaptive method) */
    int max_slots;                  /* slots, logits rows */
    int max_tokens;                 /* max(prefill chunk, max_slots) */
    int rank;                       /* rank 0 draws */
    struct gw_step_hooks hooks;
};

struct gw_step {
    struct gw_step_cfg cfg;
    int rows;                 /* L * G */
    struct gw_slot *slots;    /* (max_slots) */
    struct gw_seq *seqs;      /* (max_slots) forward views */
    struct gw_seq **seq_ptrs; /* (max_slots) the decode batch */
    int32_t *ids;             /* (max_tokens) token scratch */
    int32_t *row;             /* (max_slots) logits row of each entry
                                     of the last run, or -1 */
    int32_t *cp_src, *cp_dst; /* (rows) page copies of a fork */
    struct gw_draw *draws;    /* (max_slots) announced draws */
    /* results of the last run and draws, reused by every step */
    struct gw_head_lens *hrep; /* (max_slots) slots whose heads moved
                                     in ways the caller cannot predict */
    int n_hrep;
    struct gw_prompt_lps *plps; /* (max_slots) rank 0: the last run's
                                     prefill entries with prompt_lp,
                                     in plan order */
    int n_plps;
    int32_t *lp_tgt;              /* (max_tokens) a chunk's targets */
    float *plp_f;                 /* the last run's values: lp and the
                                     alternatives' log-probabilities */
    int32_t *plp_i;               /* its ranks and alternatives' ids */
    size_t plp_cap_f, plp_cap_i;  /* grown by gw_step_reserve to what
                                     the plan's chunks ask, at most
                                     (1 + GW_PROMPT_MAX_TOP) values per
                                     token */
    int n_compacted;              /* slots the last run compacted */
    double compact_s;             /* seconds of the last run's
                                     compaction */
    struct gw_token *tok;         /* (max_slots) gw_step_draw_all's */
    int32_t *top_ids;             /* (max_slots, GW_STEP_MAX_TOP) */
    float *top_lps;               /* (max_slots, GW_STEP_MAX_TOP) */
    struct gw_slot_error *serr;   /* (max_slots) */
    char *serr_text;              /* (max_slots, GW_STEP_ERROR_MAX) */
    size_t n_tok, n_serr;         /* of the last gw_step_draw_all */
    double backend_s;             /* seconds inside the backend's calls
                                     since the caller last zeroed it */
    struct gw_progress *progress; /* optional, borrowed: marked after
                                     every backend call (gw_progress.h) */
};

/* Sets up max_slots empty slots for cfg (copied; its pointers borrowed).
 * Returns 0 or TG_ENOMEM with the reason in err; on failure *s is left
 * freed. */
int gw_step_init(struct gw_step *s, const struct gw_step_cfg *cfg, char *err,
                 size_t errlen);

/* Frees what the step owns; safe on a zeroed or half-built step. The
 * slots' page ids are the caller's: nothing goes back to a pool. */
void gw_step_free(struct gw_step *s);

/* Empties slot `slot` (rows, position, history; a new epoch, so cached
 * block tables are stale). */
void gw_step_slot_clear(struct gw_step *s, uint32_t slot);

/* Starts e's slot afresh (a new request, a restart after preemption,
 * adopted stored KV): cleared, position and history at e->start_pos, row
 * lengths from e->row_lens (or 0) and, with per-head lengths, head
 * lengths from e->head_lens (without them every head holds its row). The
 * caller checked e (one value per row or head, none beyond start_pos). */
void gw_step_slot_start(struct gw_step *s, const struct gw_entry *e);

/* Reserves the token history plan's entries will append and the room of
 * the prompt log-probabilities its chunks ask for, before anything
 * changes, so a failure leaves every slot as it was. Returns 0 or
 * TG_ENOMEM. */
int gw_step_reserve(struct gw_step *s, const struct gw_plan *plan);

/* Runs plan's entries (steps 1-4 at the top of this file) on slots the
 * caller prepared: started, holding the pages the entries need (the
 * forward passes check the room again: TG_ENOSPC), history reserved
 * (gw_step_reserve). Sets row[], hrep, plps (rank 0: a prefill entry
 * with prompt_lp gets the log-probabilities of the positions it
 * predicts; the caller checked prompt_top <= GW_PROMPT_MAX_TOP and
 * lp_next), n_compacted and compact_s. With
 * announce, rank 0 lets the backend draw the decode batch where its
 * logits are; without, every logits row is left on the host. Returns 0 or
 * the backend's code with the reason in err; a failure leaves the
 * involved slots for the caller to drop. */
int gw_step_run(struct gw_step *s, const struct gw_plan *plan, int announce,
                char *err, size_t errlen);

/* Rank 0, after gw_step_run: draws entry i's token from its logits row
 * with `sampling` (NULL: the entry's own, which the caller checked), past
 * the gate and then the accept hook. Returns 0 with *out set (its
 * alternatives in top_ids / top_lps, GW_STEP_MAX_TOP each), TG_EINVAL
 * with a hook's reason, or the backend's sample error (TG_ERANGE: a
 * non-finite logit), the reason in err. */
int gw_step_draw(struct gw_step *s, const struct gw_plan *plan, size_t i,
                 const struct tg_sampling *sampling, struct gw_token *out,
                 int32_t *top_ids, float *top_lps, char *err, size_t errlen);

/* Rank 0, after gw_step_run: every sampled entry, in plan order, gets a
 * token (tok[0 .. n_tok)) or a slot error that fails its request alone
 * (serr[0 .. n_serr)); valid until the next call. */
void gw_step_draw_all(struct gw_step *s, const struct gw_plan *plan);

#endif /* GW_STEP_H */
