/* test_hostmem.c — host memory reading and the CPU backend's KV pool plan
 * (common/base/tg_hostmem.h): /proc/meminfo and cgroup parsing, the reserve,
 * fractions shared by ranks, bytes that do not fit refused with every
 * number named, and the real reader on this machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_hostmem.h"

#define GIB ((int64_t)1 << 30)
#define MIB ((int64_t)1 << 20)

static char err[512];

static const char meminfo[] = "MemTotal:       24576000 kB\n"
                              "MemFree:         1000000 kB\n"
                              "MemAvailable:   20480000 kB\n"
                              "Buffers:           12345 kB\n";

static void test_parse(void **state)
{
    (void)state;
    struct tg_hostmem hm;
    assert_int_equal(tg_hostmem_parse(&hm, meminfo, NULL, NULL, err,
                                      sizeof err), 0);
    assert_int_equal(hm.total, (int64_t)24576000 * 1024);
    assert_int_equal(hm.available, (int64_t)20480000 * 1024);
    assert_int_equal(hm.cgroup_limited, 0);
    /* "max": no limit. */
    assert_int_equal(tg_hostmem_parse(&hm, meminfo, "max\n", "123\n", err,
                                      sizeof err), 0);
    assert_int_equal(hm.cgroup_limited, 0);
    /* A cgroup limit of 8 GiB with 3 GiB used: 5 GiB of room. */
    char lim[32], use[32];
    snprintf(lim, sizeof lim, "%lld\n", (long long)(8 * GIB));
    snprintf(use, sizeof use, "%lld\n", (long long)(3 * GIB));
    assert_int_equal(tg_hostmem_parse(&hm, meminfo, lim, use, err,
                                      sizeof err), 0);
    assert_int_equal(hm.total, 8 * GIB);
    assert_int_equal(hm.available, 5 * GIB);
    assert_int_equal(hm.cgroup_limited, 1);
    /* cgroup v1's "no limit" is a huge number. */
    assert_int_equal(tg_hostmem_parse(&hm, meminfo, "9223372036854771712\n",
                                      "5\n", err, sizeof err), 0);
    assert_int_equal(hm.cgroup_limited, 0);
    /* Usage above the limit leaves no room, not a negative one. */
    assert_int_equal(tg_hostmem_parse(&hm, meminfo, "1000\n", "2000\n", err,
                                      sizeof err), 0);
    assert_int_equal(hm.available, 0);
    /* Missing fields and garbage are named. */
    assert_int_equal(tg_hostmem_parse(&hm, "MemTotal: 10 kB\n", NULL, NULL,
                                      err, sizeof err), TG_EFORMAT);
    assert_non_null(strstr(err, "MemAvailable"));
    assert_int_equal(tg_hostmem_parse(&hm, "", NULL, NULL, err, sizeof err),
                     TG_EFORMAT);
    assert_non_null(strstr(err, "MemTotal"));
    assert_int_equal(tg_hostmem_parse(&hm, meminfo, "lots\n", "1\n", err,
                                      sizeof err), TG_EFORMAT);
    assert_int_equal(tg_hostmem_parse(&hm, meminfo, "100\n", "x\n", err,
                                      sizeof err), TG_EFORMAT);
}

static void test_reserve(void **state)
{
    (void)state;
    struct tg_hostmem hm = {.total = 8 * GIB, .available = 6 * GIB};
    assert_int_equal(tg_hostmem_reserve(&hm), GIB); /* floor */
    hm.total = 100 * GIB;
    assert_int_equal(tg_hostmem_reserve(&hm), 5 * GIB); /* 5% */
    hm.total = 2048 * GIB;
    assert_int_equal(tg_hostmem_reserve(&hm), 16 * GIB); /* cap */
}

static void test_kv_bytes(void **state)
{
    (void)state;
    struct tg_hostmem hm = {.total = 64 * GIB, .available = 40 * GIB};
    /* reserve 64/20 = 3.2 GiB; weights 4 GiB: usable 32.8 GiB. */
    int64_t usable = 40 * GIB - 4 * GIB - 64 * GIB / 20;
    struct tg_config_amount f = {.is_fraction = true, .fraction = 0.9};
    int64_t out = 0;
    /* The default fraction is shared: more ranks, smaller pools, the same
     * total (never T times the host). */
    for (int T = 1; T <= 8; T *= 2) {
        assert_int_equal(tg_hostmem_kv_bytes(&hm, &f, T, 4 * GIB, &out, err,
                                             sizeof err), 0);
        assert_true(out == (int64_t)((double)usable * 0.9 / T));
        assert_true(out * T <= usable);
    }
    /* Bytes per rank: fit, or refused naming every number. */
    struct tg_config_amount b = {.is_fraction = false,
                                 .bytes = (uint64_t)(8 * GIB)};
    assert_int_equal(tg_hostmem_kv_bytes(&hm, &b, 4, 4 * GIB, &out, err,
                                         sizeof err), 0);
    assert_int_equal(out, 8 * GIB);
    assert_int_equal(tg_hostmem_kv_bytes(&hm, &b, 5, 4 * GIB, &out, err,
                                         sizeof err), TG_ENOMEM);
    assert_non_null(strstr(err, "8192 MiB per rank x 5"));
    assert_non_null(strstr(err, "40960 MiB available"));
    assert_non_null(strstr(err, "4096 MiB for the weights"));
    assert_non_null(strstr(err, "--kv-memory"));
    /* Nothing left at all (weights larger than the host). */
    assert_int_equal(tg_hostmem_kv_bytes(&hm, &f, 1, 50 * GIB, &out, err,
                                         sizeof err), TG_ENOMEM);
    assert_non_null(strstr(err, "no host memory is left"));
    /* A cgroup-limited host says so. */
    hm.cgroup_limited = 1;
    assert_int_equal(tg_hostmem_kv_bytes(&hm, &f, 1, 50 * GIB, &out, err,
                                         sizeof err), TG_ENOMEM);
    assert_non_null(strstr(err, "cgroup limit"));
    /* Bad arguments. */
    f.fraction = 1.5;
    assert_int_equal(tg_hostmem_kv_bytes(&hm, &f, 1, 0, &out, err,
                                         sizeof err), TG_EINVAL);
    f.fraction = 0.5;
    assert_int_equal(tg_hostmem_kv_bytes(&hm, &f, 0, 0, &out, err,
                                         sizeof err), TG_EINVAL);
}

static void test_read_this_host(void **state)
{
    (void)state;
    struct tg_hostmem hm;
    assert_int_equal(tg_hostmem_read(&hm, err, sizeof err), 0);
    assert_true(hm.total > 64 * MIB);
    assert_true(hm.available > 0 && hm.available <= hm.total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_kv_bytes),
        cmocka_unit_test(test_read_this_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
