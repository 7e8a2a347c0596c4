/*
 * gw_mem.h — sizing a worker's memory at start-up (issue: "weights, KV pool
 * sized by --kv-memory, pinned staging buffers; out-of-memory at start-up
 * is a clear error naming the numbers").
 *
 * A worker needs, in this order: its weights, its activation scratch
 * (sized for the largest prefill chunk and decode batch, the logits and
 * the kernels' workspaces), a fixed reserve for what the runtime allocates
 * behind our back (CUDA context, cuBLASLt, NCCL buffers, CUDA graphs), and
 * the KV pool. gw_mem_plan turns --kv-pages / --kv-memory into a page
 * count against the memory the device (or host) reports:
 *   - kv_pages > 0: exactly that many pages;
 *   - kv_memory in bytes: floor(bytes / page_bytes) pages;
 *   - kv_memory as a fraction f: f of what is left after weights,
 *     activations and reserve (vLLM's gpu_memory_utilization applies its
 *     fraction to the whole device instead; ours never double-counts the
 *     weights, so "0.9" means 90% of the memory the pool can have).
 * The plan fails with TG_ENOMEM, before anything big is allocated, when
 * the total exceeds the free memory, naming every term in MiB; it never
 * rounds a pool down silently.
 *
 * Pure functions (no device access): the CUDA worker passes
 * cudaMemGetInfo's numbers, tests pass made-up ones. Any thread.
 */
#ifndef GW_MEM_H
#define GW_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_config.h"

/* What one rank needs besides the KV pool, in bytes. */
struct gw_mem_need {
    uint64_t weights;     /* the rank's weights as stored on the device */
    uint64_t activations; /* scratch, logits, workspaces, staging */
    uint64_t reserve;     /* runtime overhead kept free (context, graphs) */
    uint64_t page_bytes;  /* one [H_p][2][P][d] page, > 0 */
};

/* The outcome of gw_mem_plan. */
struct gw_mem_plan {
    int64_t pages;        /* pool pages, 1 .. INT32_MAX */
    uint64_t pool_bytes;  /* pages * page_bytes */
    uint64_t total_bytes; /* weights + activations + reserve + pool */
    uint64_t free_after;  /* device free memory left after all of it */
};

/* Plans the pool for a device (or host) with `dev_free` bytes free and
 * `dev_total` bytes in all; `where` names it in messages ("GPU 0 (NVIDIA
 * H200)"). kv_pages > 0 overrides kv_memory. Returns 0 with *out filled,
 * TG_EINVAL (a fraction outside (0, 1], page_bytes 0, fewer than one page
 * or more than INT32_MAX pages) or TG_ENOMEM (the total exceeds dev_free;
 * the message lists weights, activations, reserve, pool and free memory in
 * MiB and says which flag to lower). */
int gw_mem_plan(struct gw_mem_plan *out, const struct gw_mem_need *need,
                int64_t kv_pages, const struct tg_config_amount *kv_memory,
                uint64_t dev_free, uint64_t dev_total, const char *where,
                char *err, size_t errlen);

#endif /* GW_MEM_H */
