/* kv_prompt.c — a prompt's page reservation under a profile (kv_prompt.h). */
#include "common/kv/kv_prompt.h"
#include "common/kv/kv_budget.h"
#include "common/base/tg_err.h"

#include <stdlib.h>
#include <string.h>

/* Largest prompt kv_prompt_pages_compute accepts: keeps every sum of tokens
 * over all groups of a model far below INT64_MAX. */
#define KV_PROMPT_MAX_TOKENS ((int64_t)1 << 40)
/* Above this many chunks the closed form below replaces the chunk loop. */
#define KV_PROMPT_LOOP_CHUNKS ((int64_t)1 << 16)

/* Equals kv_turn_keep(0, n, chunk, budget, rule) without visiting every
 * chunk: only chunks that start below the sink boundary differ from the
 * others; all later full chunks keep the same count. */
static int64_t turn_keep(int64_t n, int64_t chunk, double budget,
                         const struct kv_forced_rule *rule)
{
    if (n / chunk <= KV_PROMPT_LOOP_CHUNKS)
        return kv_turn_keep(0, n, chunk, budget, rule);
    int64_t kept = 0, off = 0;
    while (off < n && off < rule->n_sink) {
        int64_t m = n - off < chunk ? n - off : chunk;
        kept += kv_chunk_keep(m, budget, kv_chunk_forced(off, m, rule));
        off += m;
    }
    int64_t full = (n - off) / chunk;
    if (full > 0)
        kept += full * kv_chunk_keep(chunk, budget,
                                     kv_chunk_forced(off, chunk, rule));
    off += full * chunk;
    if (off < n)
        kept += kv_chunk_keep(n - off, budget,
                              kv_chunk_forced(off, n - off, rule));
    return kept;
}

void kv_prompt_pages_free(struct kv_prompt_pages *pg)
{
    if (pg == NULL)
        return;
    free(pg->tokens);
    free(pg->pages);
    memset(pg, 0, sizeof(*pg));
}

int kv_prompt_pages_compute(struct kv_prompt_pages *out,
                            const struct pf_profile *p, int64_t n_tokens,
                            int64_t chunk, int64_t page_size, char *err,
                            size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (n_tokens < 0 || n_tokens > KV_PROMPT_MAX_TOKENS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tokens: %lld is out of range [0, %lld]",
                          (long long)n_tokens, (long long)KV_PROMPT_MAX_TOKENS);
    if (chunk < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_chunk: %lld must be at least 1",
                          (long long)chunk);
    if (page_size < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page_size: %lld must be at least 1",
                          (long long)page_size);
    size_t n = (size_t)p->num_layers * (size_t)p->num_groups;
    out->tokens = malloc((n ? n : 1) * sizeof(int64_t));
    out->pages = malloc((n ? n : 1) * sizeof(int64_t));
    if (out->tokens == NULL || out->pages == NULL) {
        kv_prompt_pages_free(out);
        return tg_err_set(err, errlen, TG_ENOMEM, "pages: out of memory");
    }
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    int64_t max_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t t = turn_keep(n_tokens, chunk, p->group_budget[i], &rule);
        out->tokens[i] = t;
        out->pages[i] = kv_pages_for(t, page_size);
        out->total_pages += out->pages[i];
        if (t > max_tokens)
            max_tokens = t;
    }
    out->monolithic_pages = kv_pages_for(max_tokens, page_size) * (int64_t)n;
    return 0;
}
