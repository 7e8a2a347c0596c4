/* tg_hostmem.c — host memory and the CPU backend's KV pool (tg_hostmem.h). */
#include "common/base/tg_hostmem.h"
#include "common/base/tg_err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB ((int64_t)1 << 30)
#define MIB ((int64_t)1 << 20)

/* The value of "Key:   N kB" in meminfo text, in bytes; -1 when absent. */
static int64_t meminfo_field(const char *text, const char *key)
{
    size_t klen = strlen(key);
    for (const char *p = text; p != NULL && *p != '\0';) {
        if (strncmp(p, key, klen) == 0 && p[klen] == ':') {
            char *end = NULL;
            errno = 0;
            long long kb = strtoll(p + klen + 1, &end, 10);
            if (errno != 0 || end == p + klen + 1 || kb < 0)
                return -1;
            return (int64_t)kb * 1024;
        }
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return -1;
}

/* A cgroup file holding a byte count or "max": 1 with *v set, 0 for "max"
 * (no limit), -1 when unreadable. */
static int cg_number(const char *text, int64_t *v)
{
    while (*text == ' ' || *text == '\t')
        text++;
    if (strncmp(text, "max", 3) == 0)
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(text, &end, 10);
    if (errno != 0 || end == text)
        return -1;
    /* cgroup v1 reports "no limit" as a huge page-aligned number. */
    if (n >= (unsigned long long)INT64_MAX / 2)
        return 0;
    *v = (int64_t)n;
    return 1;
}

int tg_hostmem_parse(struct tg_hostmem *out, const char *meminfo,
                     const char *cg_limit, const char *cg_usage, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof(*out));
    int64_t total = meminfo_field(meminfo, "MemTotal");
    int64_t avail = meminfo_field(meminfo, "MemAvailable");
    if (total <= 0 || avail < 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "/proc/meminfo has no readable %s",
                          total <= 0 ? "MemTotal" : "MemAvailable");
    out->total = total;
    out->available = avail < total ? avail : total;
    if (cg_limit != NULL) {
        int64_t limit = 0, usage = 0;
        int lim = cg_number(cg_limit, &limit);
        if (lim < 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "the cgroup memory limit is not a number");
        if (lim > 0) {
            if (cg_usage == NULL || cg_number(cg_usage, &usage) != 1)
                return tg_err_set(err, errlen, TG_EFORMAT,
                                  "the cgroup memory usage is not a number");
            int64_t room = limit > usage ? limit - usage : 0;
            if (limit < out->total) {
                out->total = limit;
                out->cgroup_limited = 1;
            }
            if (room < out->available) {
                out->available = room;
                out->cgroup_limited = 1;
            }
        }
    }
    return 0;
}

/* Reads a small text file into buf; returns 0 or -1. */
static int slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return -1;
    buf[n] = '\0';
    return 0;
}

int tg_hostmem_read(struct tg_hostmem *out, char *err, size_t errlen)
{
    static char meminfo[16384];
    char lim[64], use[64];
    if (slurp("/proc/meminfo", meminfo, sizeof meminfo) != 0)
        return tg_err_set(err, errlen, TG_EIO, "cannot read /proc/meminfo: %s",
                          strerror(errno));
    /* cgroup v2 first, then v1; neither present: no limit. */
    const char *l = NULL, *u = NULL;
    if (slurp("/sys/fs/cgroup/memory.max", lim, sizeof lim) == 0 &&
        slurp("/sys/fs/cgroup/memory.current", use, sizeof use) == 0) {
        l = lim;
        u = use;
    } else if (slurp("/sys/fs/cgroup/memory/memory.limit_in_bytes", lim,
                     sizeof lim) == 0 &&
               slurp("/sys/fs/cgroup/memory/memory.usage_in_bytes", use,
                     sizeof use) == 0) {
        l = lim;
        u = use;
    }
    return tg_hostmem_parse(out, meminfo, l, u, err, errlen);
}

int64_t tg_hostmem_reserve(const struct tg_hostmem *hm)
{
    int64_t r = hm->total / 20;
    if (r < GIB)
        r = GIB;
    if (r > 16 * GIB)
        r = 16 * GIB;
    return r;
}

int tg_hostmem_kv_bytes(const struct tg_hostmem *hm,
                        const struct tg_config_amount *amt, int ranks,
                        int64_t other_bytes, int64_t *out, char *err,
                        size_t errlen)
{
    *out = 0;
    if (ranks < 1)
        return tg_err_set(err, errlen, TG_EINVAL, "%d ranks", ranks);
    if (amt->is_fraction && (!(amt->fraction > 0.0) || amt->fraction > 1.0))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--kv-memory fraction %g is outside (0, 1]",
                          amt->fraction);
    int64_t reserve = tg_hostmem_reserve(hm);
    int64_t usable = hm->available - other_bytes - reserve;
    const char *where = hm->cgroup_limited ? " (cgroup limit)" : "";
    if (usable <= 0)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "no host memory is left for the KV pool: %" PRId64
                          " MiB available%s, %" PRId64 " MiB for the weights, "
                          "%" PRId64 " MiB kept for the system; use a smaller "
                          "model or a larger host",
                          hm->available / MIB, where, other_bytes / MIB,
                          reserve / MIB);
    if (amt->is_fraction) {
        *out = (int64_t)((double)usable * amt->fraction / (double)ranks);
        if (*out < 1)
            *out = 1;
        return 0;
    }
    if (amt->bytes > (uint64_t)INT64_MAX ||
        (int64_t)amt->bytes > usable / ranks)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "--kv-memory %" PRIu64 " MiB per rank x %d rank(s) "
                          "does not fit: %" PRId64 " MiB of host memory are "
                          "usable for KV (%" PRId64 " MiB available%s, %" PRId64
                          " MiB for the weights, %" PRId64 " MiB kept for the "
                          "system); lower --kv-memory or give a fraction",
                          amt->bytes / (uint64_t)MIB, ranks, usable / MIB,
                          hm->available / MIB, where, other_bytes / MIB,
                          reserve / MIB);
    *out = (int64_t)amt->bytes;
    return 0;
}

int tg_hostmem_tier_check(const struct tg_hostmem *hm, int64_t tier_bytes,
                          int ranks, int64_t other_bytes, char *err,
                          size_t errlen)
{
    if (ranks < 1 || tier_bytes < 0 || other_bytes < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "host tier of %" PRId64 " bytes x %d ranks",
                          tier_bytes, ranks);
    if (tier_bytes == 0)
        return 0;
    int64_t reserve = tg_hostmem_reserve(hm);
    int64_t usable = hm->available - other_bytes - reserve;
    if (usable < 0)
        usable = 0;
    if (tier_bytes <= usable / ranks)
        return 0;
    return tg_err_set(err, errlen, TG_ENOMEM,
                      "--kv-host-memory %" PRId64 " MiB per rank x %d "
                      "rank(s) does not fit: %" PRId64 " MiB of host memory "
                      "are usable (%" PRId64 " MiB available%s, %" PRId64
                      " MiB for weights and pools, %" PRId64 " MiB kept for "
                      "the system); lower --kv-host-memory (0 turns the tier "
                      "off)", tier_bytes / MIB, ranks, usable / MIB,
                      hm->available / MIB,
                      hm->cgroup_limited ? " (cgroup limit)" : "",
                      other_bytes / MIB, reserve / MIB);
}
