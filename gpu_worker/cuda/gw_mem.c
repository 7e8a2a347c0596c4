/* gw_mem.c — start-up memory plan of a worker (see gw_mem.h). */
#include "gpu_worker/cuda/gw_mem.h"

#include <string.h>

#include "common/base/tg_err.h"

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

int gw_mem_plan(struct gw_mem_plan *out, const struct gw_mem_need *need,
                int64_t kv_pages, const struct tg_config_amount *kv_memory,
                uint64_t dev_free, uint64_t dev_total, const char *where,
                char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (where == NULL)
        where = "the device";
    if (need->page_bytes == 0)
        return tg_err_set(err, errlen, TG_EINVAL, "page size of 0 bytes");
    uint64_t fixed = need->weights + need->activations + need->reserve;
    if (fixed < need->weights) /* wrapped */
        return tg_err_set(err, errlen, TG_EINVAL, "memory sizes overflow");
    if (fixed > dev_free)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "%s: the model does not fit before any KV cache: "
                          "weights %.1f MiB + activations %.1f MiB + runtime "
                          "reserve %.1f MiB = %.1f MiB, but only %.1f MiB of "
                          "%.1f MiB are free; use more tensor-parallel ranks "
                          "(--tp), a smaller --prefill-chunk or "
                          "--max-num-seqs",
                          where, mib(need->weights), mib(need->activations),
                          mib(need->reserve), mib(fixed), mib(dev_free),
                          mib(dev_total));
    uint64_t left = dev_free - fixed;
    int64_t pages;
    const char *flag;
    if (kv_pages > 0) {
        pages = kv_pages;
        flag = "--kv-pages";
    } else if (kv_memory != NULL && kv_memory->is_fraction) {
        double f = kv_memory->fraction;
        if (!(f > 0.0) || f > 1.0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--kv-memory fraction %g is outside (0, 1]", f);
        pages = (int64_t)((double)left * f / (double)need->page_bytes);
        flag = "--kv-memory";
    } else if (kv_memory != NULL) {
        pages = (int64_t)(kv_memory->bytes / need->page_bytes);
        flag = "--kv-memory";
    } else {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "neither --kv-pages nor --kv-memory is set");
    }
    if (pages < 1 || pages > INT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: the KV pool would hold %lld pages of %llu "
                          "bytes; it needs 1 .. %d (%s)",
                          where, (long long)pages,
                          (unsigned long long)need->page_bytes, INT32_MAX, flag);
    uint64_t pool = (uint64_t)pages * need->page_bytes;
    if (pool > left)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "%s: out of memory for the KV pool: %s asks for "
                          "%lld pages = %.1f MiB, but after weights %.1f MiB, "
                          "activations %.1f MiB and runtime reserve %.1f MiB "
                          "only %.1f MiB of %.1f MiB are free; lower %s (at "
                          "most %llu pages fit)",
                          where, flag, (long long)pages, mib(pool),
                          mib(need->weights), mib(need->activations),
                          mib(need->reserve), mib(left), mib(dev_total), flag,
                          (unsigned long long)(left / need->page_bytes));
    out->pages = pages;
    out->pool_bytes = pool;
    out->total_bytes = fixed + pool;
    out->free_after = left - pool;
    return 0;
}
