/*
 * tg_hostmem.h — how much host memory this process may use, and the KV
 * pool of the CPU backend that follows from it.
 *
 * The host's memory is /proc/meminfo's MemTotal and MemAvailable (the
 * kernel's estimate of what can be allocated without swapping), lowered to
 * the control group's limit when one is set (cgroup v2 memory.max minus
 * memory.current, or cgroup v1 memory.limit_in_bytes minus
 * memory.usage_in_bytes): in a container the limit, not the host, is what
 * an allocation runs into.
 *
 * The CPU backend's KV pools come out of that memory, after the weights and
 * a reserve kept for the system and the processes' other allocations:
 *   usable  = available - other_bytes - reserve,
 *   reserve = min(max(1 GiB, total / 20), 16 GiB);
 * a fraction f of --kv-memory gives each of the R ranks f * usable / R, and
 * bytes b per rank must satisfy R * b <= usable. So the default (0.9)
 * leaves the host healthy at any --tp, and an explicit size that cannot fit
 * is refused at start rather than met by the OOM killer mid-request.
 *
 * Pure functions plus one reader of /proc and /sys; any thread.
 */
#ifndef TG_HOSTMEM_H
#define TG_HOSTMEM_H

#include <stdint.h>
#include <stddef.h>

#include "common/base/tg_config.h"

struct tg_hostmem {
    int64_t total;      /* bytes: MemTotal, or the cgroup limit if lower */
    int64_t available;  /* bytes: MemAvailable, or the cgroup's room if
                           lower */
    int cgroup_limited; /* 1 when the cgroup limit set either value */
};

/* Parses the text of /proc/meminfo and, when non-NULL, the cgroup's limit
 * and usage files ("max" = no limit) into *out. Returns 0, or TG_EFORMAT
 * naming what is missing (MemTotal / MemAvailable, or an unreadable
 * number). */
int tg_hostmem_parse(struct tg_hostmem *out, const char *meminfo,
                     const char *cg_limit, const char *cg_usage, char *err,
                     size_t errlen);

/* Reads this process's host memory (see the top of this file). Returns 0,
 * or TG_EIO when /proc/meminfo cannot be read, or tg_hostmem_parse's
 * codes. */
int tg_hostmem_read(struct tg_hostmem *out, char *err, size_t errlen);

/* Bytes kept for the system: min(max(1 GiB, total / 20), 16 GiB). */
int64_t tg_hostmem_reserve(const struct tg_hostmem *hm);

/* The KV pool of each of `ranks` CPU ranks for --kv-memory *amt, with
 * other_bytes (the weights of all ranks, and anything else to be
 * allocated) still to come out of hm->available. Sets *out (bytes per
 * rank) and returns 0, or TG_ENOMEM with a message naming every number and
 * the flag to lower when nothing is usable or the bytes asked for do not
 * fit, or TG_EINVAL for ranks < 1 or a fraction outside (0, 1]. */
int tg_hostmem_kv_bytes(const struct tg_hostmem *hm,
                        const struct tg_config_amount *amt, int ranks,
                        int64_t other_bytes, int64_t *out, char *err,
                        size_t errlen);

/* The host-memory tier of stored conversations (--kv-host-memory,
 * DESIGN.md §4.10): checks that `ranks` tiers of tier_bytes each fit what
 * is usable, available - other_bytes - reserve, with other_bytes (weights,
 * CPU pools) still to come out of hm->available. Returns 0 (also for
 * tier_bytes 0), or TG_ENOMEM naming every number and the flag to lower,
 * or TG_EINVAL for ranks < 1 or negative bytes. */
int tg_hostmem_tier_check(const struct tg_hostmem *hm, int64_t tier_bytes,
                          int ranks, int64_t other_bytes, char *err,
                          size_t errlen);

#endif /* TG_HOSTMEM_H */
