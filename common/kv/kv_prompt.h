/*
 * kv_prompt.h — the page reservation of a prompt under ragged vs monolithic
 * paging (DESIGN.md §4.3, §4.5): what chunked compression keeps of each
 * (layer, group) of a profile, in pages. Used by the profile tool's
 * reports and its tests; the same math as the router's admission
 * (kv_budget.h).
 *
 * Pure functions of their inputs; any thread.
 */
#ifndef KV_PROMPT_H
#define KV_PROMPT_H

#include "common/profile/pf_profile.h"

#include <stddef.h>
#include <stdint.h>

/* Prompt reservation of one request under ragged paging. */
struct kv_prompt_pages {
    int64_t *tokens;          /* (L, G) tokens group (l, g) keeps */
    int64_t *pages;           /* (L, G) ceil(tokens / P) */
    int64_t total_pages;      /* sum of pages */
    int64_t monolithic_pages; /* ceil(max tokens / P) * L * G */
};

/* Computes, for every (layer, group) of *p, the tokens kept by chunked
 * compression (kv_turn_keep with the snapkv forced rule and budget
 * b[l][g]) of n_tokens new tokens starting at position 0 in chunks of
 * `chunk`, their pages of `page_size` tokens, the total, and what a
 * monolithic layout (every group as long as the longest) would take.
 * n_tokens >= 0, chunk >= 1, page_size >= 1, else TG_EINVAL. Returns 0,
 * TG_EINVAL or TG_ENOMEM; on failure *out is left freed. The caller owns
 * *out (kv_prompt_pages_free). */
int kv_prompt_pages_compute(struct kv_prompt_pages *out,
                            const struct pf_profile *p, int64_t n_tokens,
                            int64_t chunk, int64_t page_size, char *err,
                            size_t errlen);

/* Releases what *pg owns and zeroes it; safe on a zeroed or freed object. */
void kv_prompt_pages_free(struct kv_prompt_pages *pg);

#endif /* KV_PROMPT_H */
