/*
 * gw_callwatch.h — the free-text side of a triggered constraint
 * (common/grammar/gm_spec.h "triggered"): watches the bytes a slot
 * generates while unconstrained for the trigger that starts a tool call
 * (Hermes' "<tool_call>", or Llama-3 JSON's "{" as the output's first
 * non-space byte), across token boundaries. gw_grammar runs the slot's
 * state machine around it: free (this watch, no mask) → constrained (a
 * matcher fed the bytes from the trigger's first byte on, the mask from
 * the next draw) → free again once the call is complete (not anchored).
 *
 * Bytes: a token may hold text before the trigger, the trigger's end
 * (its start in earlier tokens), or bytes after it; the watch keeps the
 * last trigger-length - 1 bytes of free text, so a trigger split over
 * any number of tokens is found, and hands out the bytes from the
 * trigger's first byte to the end of the token that completed it.
 *
 * Threads: one watch is used by one thread.
 */
#ifndef GW_CALLWATCH_H
#define GW_CALLWATCH_H

#include <stddef.h>
#include <stdint.h>

struct gw_callwatch {
    char *trigger; /* owned, n bytes, n >= 1 */
    size_t n;
    int anchored; /* the trigger counts only at the output's start */
    int dead;     /* anchored, and the output started otherwise */
    size_t seen;  /* anchored: trigger bytes matched so far */
    uint8_t *buf; /* (cap) the kept tail, then the token's bytes */
    size_t n_tail, cap;
};

/* Watches for trigger[0..n) (copied; n >= 1). Returns 0, TG_EINVAL
 * (n 0) or TG_ENOMEM. */
int gw_callwatch_init(struct gw_callwatch *w, const char *trigger, size_t n,
                      int anchored);

/* Frees and zeroes; safe on a zeroed one. */
void gw_callwatch_free(struct gw_callwatch *w);

/* Forgets the free text seen (after a call ended: what follows is new
 * free text; an anchored watch stays as it is). */
void gw_callwatch_reset(struct gw_callwatch *w);

/* Takes the free-text bytes [b, b + len) of one token. Returns 1 when
 * they complete the trigger: *call, *n_call are the bytes from the
 * trigger's first byte to the end of b (borrowed until the next call);
 * 0 when not (yet); TG_ENOMEM. After 1 the caller constrains the slot
 * and calls reset before watching again. */
int gw_callwatch_feed(struct gw_callwatch *w, const uint8_t *b, size_t len,
                      const uint8_t **call, size_t *n_call);

#endif /* GW_CALLWATCH_H */
