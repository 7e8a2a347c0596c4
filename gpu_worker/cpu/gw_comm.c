/* gw_comm.c — shared-memory all-reduce of the CPU backend (see gw_comm.h). */
#include "gpu_worker/cpu/gw_comm.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/base/tg_err.h"

#define LINE 64 /* cache line: each polled counter gets its own */
#define MAGIC_LIVE 0x314d4d4f434754ull /* "TGCOMM1" */
#define MAGIC_DEAD 0x444145444d4d4f43ull /* superseded by a newer rank 0 */
#define SPIN_ITERS 256
#define YIELD_ITERS 2048
#define SLEEP_NS 50000L

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2,
               "cross-process counters need lock-free 64-bit atomics");

/* Per-rank counters; written only by their rank except ack (rank 0). */
struct rank_ctl {
    _Atomic uint64_t join;   /* token rank r registered with (0: none) */
    _Atomic uint64_t ack;    /* rank 0's echo of join */
    char pad0[LINE - 16];
    _Atomic uint64_t arrive; /* last call whose operand is in the slot */
    char pad1[LINE - 8];
    _Atomic uint64_t depart; /* last call whose slots the rank has read */
    char pad2[LINE - 8];
};

struct gw_comm_shm {
    _Atomic uint64_t magic; /* 0 while rank 0 writes, then MAGIC_LIVE */
    uint64_t world;         /* T */
    uint64_t max_floats;    /* floats per slot */
    uint64_t nonce;         /* this incarnation of the segment */
    _Atomic uint64_t aborted; /* a rank gave up or left: fail fast */
    char pad[LINE - 40];
    struct rank_ctl ctl[GW_COMM_MAX_RANKS];
    float slots[];          /* (world, max_floats) */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ns(long ns)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
    nanosleep(&ts, NULL);
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A nonzero random 64-bit value (tokens must not repeat across restarts). */
static uint64_t random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        /* splitmix64 finalizer (Steele, Lea & Flood 2014) as a mixer */
        v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
            ((uint64_t)getpid() << 17);
        v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
        v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
        v ^= v >> 31;
    }
    return v != 0 ? v : 1;
}

static size_t header_bytes(void)
{
    return sizeof(struct gw_comm_shm);
}

void gw_comm_free(struct gw_comm *c)
{
    if (c->shm != NULL) {
        /* All ranks make the same calls, so a rank leaving means the group
         * is over: peers still waiting (a failed step) give up at once. */
        atomic_store_explicit(&c->shm->aborted, 1, memory_order_release);
        munmap(c->shm, c->map_bytes);
    }
    if (c->rank == 0 && c->world > 1 && c->name[0] != '\0')
        shm_unlink(c->name);
    memset(c, 0, sizeof(*c));
}

/* Marks a segment an earlier incarnation left under `name` as dead so a
 * peer that opened it reopens, then removes the name. */
static void supersede_old(const char *name)
{
    int fd = shm_open(name, O_RDWR, 0);
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && (size_t)st.st_size >= header_bytes()) {
            void *p = mmap(NULL, header_bytes(), PROT_READ | PROT_WRITE,
                           MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) {
                struct gw_comm_shm *h = p;
                atomic_store_explicit(&h->magic, MAGIC_DEAD, memory_order_release);
                atomic_store_explicit(&h->aborted, 1, memory_order_release);
                munmap(p, header_bytes());
            }
        }
        close(fd);
    }
    shm_unlink(name);
}

static int create_segment(struct gw_comm *c, int64_t deadline, char *err,
                          size_t errlen)
{
    supersede_old(c->name);
    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return tg_err_set(err, errlen, TG_EIO, "shm_open(%s): %s", c->name,
                          strerror(errno));
    if (ftruncate(fd, (off_t)c->map_bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(c->name);
        return tg_err_set(err, errlen, TG_EIO, "ftruncate(%s, %zu): %s",
                          c->name, c->map_bytes, strerror(e));
    }
    void *p = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(c->name);
        return tg_err_set(err, errlen, TG_EIO, "mmap(%s, %zu): %s", c->name,
                          c->map_bytes, strerror(e));
    }
    c->shm = p;
    struct gw_comm_shm *h = c->shm;
    h->world = (uint64_t)c->world;
    h->max_floats = (uint64_t)c->max_floats;
    h->nonce = random_u64();
    atomic_store_explicit(&h->magic, MAGIC_LIVE, memory_order_release);

    /* Echo every peer's token: a peer returns only once rank 0 has seen
     * it on this very segment. */
    int waiting = c->world - 1;
    uint64_t acked[GW_COMM_MAX_RANKS] = {0};
    for (unsigned it = 0; waiting > 0; it++) {
        for (int r = 1; r < c->world; r++) {
            if (acked[r])
                continue;
            uint64_t tok = atomic_load_explicit(&h->ctl[r].join, memory_order_acquire);
            if (tok != 0) {
                atomic_store_explicit(&h->ctl[r].ack, tok, memory_order_release);
                acked[r] = 1;
                waiting--;
            }
        }
        if (waiting == 0)
            break;
        if (now_ms() >= deadline) {
            int missing = 0;
            for (int r = 1; r < c->world && !missing; r++)
                if (!acked[r])
                    missing = r;
            return tg_err_set(err, errlen, TG_ETIMEDOUT,
                              "all-reduce group %s: rank %d (and %d more) did "
                              "not join within the timeout", c->name, missing,
                              waiting - 1);
        }
        sleep_ns(it < 100 ? 100000L : 1000000L);
    }
    return 0;
}

/* One attempt of rank r > 0 to join: 1 = try again, 0 = joined, < 0 =
 * error. *why records the latest reason for waiting. */
static int try_join(struct gw_comm *c, uint64_t token, int64_t deadline,
                    char *why, size_t whylen, char *err, size_t errlen)
{
    int fd = shm_open(c->name, O_RDWR, 0);
    if (fd < 0) {
        if (errno == ENOENT) {
            snprintf(why, whylen, "rank 0 has not created %s", c->name);
            return 1;
        }
        return tg_err_set(err, errlen, TG_EIO, "shm_open(%s): %s", c->name,
                          strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < header_bytes()) {
        close(fd);
        snprintf(why, whylen, "%s has no header yet", c->name);
        return 1;
    }
    size_t len = (size_t)st.st_size;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return tg_err_set(err, errlen, TG_EIO, "mmap(%s): %s", c->name,
                          strerror(errno));
    struct gw_comm_shm *h = p;
    uint64_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
    int again = 1;
    if (magic != MAGIC_LIVE) {
        snprintf(why, whylen, "%s has no live header", c->name);
    } else if (h->world != (uint64_t)c->world ||
               h->max_floats != (uint64_t)c->max_floats) {
        snprintf(why, whylen,
                 "%s is for world size %llu with %llu floats per slot, this "
                 "rank has %d and %zu", c->name, (unsigned long long)h->world,
                 (unsigned long long)h->max_floats, c->world, c->max_floats);
    } else if (len < c->map_bytes) {
        snprintf(why, whylen, "%s holds %zu bytes, expected %zu", c->name, len,
                 c->map_bytes);
    } else {
        atomic_store_explicit(&h->ctl[c->rank].join, token, memory_order_release);
        snprintf(why, whylen, "rank 0 did not acknowledge on %s", c->name);
        for (unsigned it = 0; now_ms() < deadline; it++) {
            if (atomic_load_explicit(&h->ctl[c->rank].ack, memory_order_acquire) ==
                token) {
                again = 0;
                break;
            }
            if (atomic_load_explicit(&h->magic, memory_order_acquire) != MAGIC_LIVE)
                break; /* a newer rank 0 superseded this segment */
            sleep_ns(it < 100 ? 100000L : 1000000L);
        }
    }
    if (again) {
        munmap(p, len);
        return 1;
    }
    c->shm = h;
    c->map_bytes = len;
    return 0;
}

static int valid_name(const char *name)
{
    if (name == NULL || name[0] != '/')
        return 0;
    size_t n = strlen(name);
    return n >= 2 && n <= 250 && strchr(name + 1, '/') == NULL;
}

int gw_comm_init(struct gw_comm *c, const char *name, int rank, int world,
                 size_t max_floats, int timeout_ms, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    if (world < 1 || world > GW_COMM_MAX_RANKS || rank < 0 || rank >= world)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "all-reduce: rank %d of world size %d (world 1 .. "
                          "%d)", rank, world, GW_COMM_MAX_RANKS);
    if (max_floats < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "all-reduce: slots need at least one float");
    c->rank = rank;
    c->world = world;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : GW_COMM_DEFAULT_TIMEOUT_MS;
    c->max_floats = max_floats;
    if (world == 1)
        return 0;
    if (!valid_name(name)) {
        memset(c, 0, sizeof(*c));
        return tg_err_set(err, errlen, TG_EINVAL,
                          "all-reduce: '%s' is not a shared-memory name (one "
                          "leading '/', no other, 2 .. 250 characters)",
                          name != NULL ? name : "(null)");
    }
    if (max_floats > (SIZE_MAX / 2 - header_bytes()) / sizeof(float) / (size_t)world) {
        memset(c, 0, sizeof(*c));
        return tg_err_set(err, errlen, TG_EINVAL,
                          "all-reduce: %zu floats per slot is too large",
                          max_floats);
    }
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->map_bytes = header_bytes() + (size_t)world * max_floats * sizeof(float);
    int64_t deadline = now_ms() + c->timeout_ms;
    int rc;
    if (rank == 0) {
        rc = create_segment(c, deadline, err, errlen);
    } else {
        uint64_t token = random_u64();
        char why[400] = "";
        for (unsigned it = 0;; it++) {
            rc = try_join(c, token, deadline, why, sizeof(why), err, errlen);
            if (rc <= 0)
                break;
            if (now_ms() >= deadline) {
                rc = tg_err_set(err, errlen, TG_ETIMEDOUT,
                                "all-reduce rank %d: no group to join within "
                                "%d ms: %s", rank, c->timeout_ms, why);
                break;
            }
            sleep_ns(it < 100 ? 100000L : 1000000L);
        }
    }
    if (rc != 0)
        gw_comm_free(c);
    return rc;
}

/* Waits until *v >= want. Returns 0 or TG_ETIMEDOUT (deadline passed, or
 * a peer gave up). */
static int wait_ge(struct gw_comm *c, _Atomic uint64_t *v, uint64_t want,
                   int64_t deadline)
{
    for (unsigned it = 0;; it++) {
        if (atomic_load_explicit(v, memory_order_acquire) >= want)
            return 0;
        if (atomic_load_explicit(&c->shm->aborted, memory_order_acquire) != 0)
            /* the peer's release orders its counters before the flag */
            return atomic_load_explicit(v, memory_order_acquire) >= want
                       ? 0
                       : TG_ETIMEDOUT;
        if (it < SPIN_ITERS) {
            cpu_relax();
            continue;
        }
        if (it < YIELD_ITERS)
            sched_yield();
        else
            sleep_ns(SLEEP_NS);
        if ((it & 31) == 0 && now_ms() >= deadline)
            return TG_ETIMEDOUT;
    }
}

static int reduce_chunk(struct gw_comm *c, float *x, size_t n)
{
    struct gw_comm_shm *h = c->shm;
    uint64_t k = ++c->calls;
    int64_t deadline = now_ms() + c->timeout_ms;
    int T = c->world, rc = 0;
    /* Phase 1: nobody still reads call k-1's slots; publish our operand. */
    for (int j = 0; j < T && rc == 0; j++)
        rc = wait_ge(c, &h->ctl[j].depart, k - 1, deadline);
    if (rc != 0)
        return rc;
    float *mine = h->slots + (size_t)c->rank * c->max_floats;
    memcpy(mine, x, n * sizeof(float));
    atomic_store_explicit(&h->ctl[c->rank].arrive, k, memory_order_release);
    /* Phase 2: every operand is there; sum in rank order. */
    for (int j = 0; j < T && rc == 0; j++)
        rc = wait_ge(c, &h->ctl[j].arrive, k, deadline);
    if (rc != 0)
        return rc;
    memcpy(x, h->slots, n * sizeof(float));
    for (int j = 1; j < T; j++) {
        const float *s = h->slots + (size_t)j * c->max_floats;
        for (size_t i = 0; i < n; i++)
            x[i] += s[i]; /* per element: ((s0 + s1) + s2) + .. */
    }
    atomic_store_explicit(&h->ctl[c->rank].depart, k, memory_order_release);
    return 0;
}

int gw_comm_allreduce_sum(struct gw_comm *c, float *x, size_t n)
{
    if (c->world <= 1 || n == 0)
        return 0;
    if (c->failed || c->shm == NULL)
        return TG_ETIMEDOUT;
    for (size_t off = 0; off < n; off += c->max_floats) {
        size_t m = n - off < c->max_floats ? n - off : c->max_floats;
        int rc = reduce_chunk(c, x + off, m);
        if (rc != 0) {
            c->failed = 1;
            atomic_store_explicit(&c->shm->aborted, 1, memory_order_release);
            return rc;
        }
    }
    return 0;
}

/* One piece of a gather (see gw_comm.h): recv_off points at rank 0's
 * (T, n_total) buffer plus the piece's offset. */
static int gather_chunk(struct gw_comm *c, const float *send, size_t n,
                        float *recv_off, size_t n_total)
{
    struct gw_comm_shm *h = c->shm;
    uint64_t k = ++c->calls;
    int64_t deadline = now_ms() + c->timeout_ms;
    int T = c->world, rc = 0;
    for (int j = 0; j < T && rc == 0; j++)
        rc = wait_ge(c, &h->ctl[j].depart, k - 1, deadline);
    if (rc != 0)
        return rc;
    if (c->rank != 0) {
        float *mine = h->slots + (size_t)c->rank * c->max_floats;
        memcpy(mine, send, n * sizeof(float));
        atomic_store_explicit(&h->ctl[c->rank].arrive, k, memory_order_release);
        /* Return only once rank 0 has read every slot: a rank that left
         * earlier (its free marks the group over) would fail a slower
         * peer still on its way to this call. */
        rc = wait_ge(c, &h->ctl[0].depart, k, deadline);
        if (rc != 0)
            return rc;
        atomic_store_explicit(&h->ctl[c->rank].depart, k, memory_order_release);
        return 0;
    }
    memcpy(recv_off, send, n * sizeof(float)); /* rank 0's own row */
    atomic_store_explicit(&h->ctl[0].arrive, k, memory_order_release);
    for (int j = 1; j < T && rc == 0; j++)
        rc = wait_ge(c, &h->ctl[j].arrive, k, deadline);
    if (rc != 0)
        return rc;
    for (int j = 1; j < T; j++)
        memcpy(recv_off + (size_t)j * n_total,
               h->slots + (size_t)j * c->max_floats, n * sizeof(float));
    atomic_store_explicit(&h->ctl[0].depart, k, memory_order_release);
    return 0;
}

int gw_comm_gather(struct gw_comm *c, const float *send, size_t n, float *recv)
{
    if (c->rank == 0 && recv == NULL && n > 0)
        return TG_EINVAL;
    if (c->world <= 1) {
        if (n > 0 && recv != send)
            memcpy(recv, send, n * sizeof(float));
        return 0;
    }
    if (n == 0)
        return 0;
    if (c->failed || c->shm == NULL)
        return TG_ETIMEDOUT;
    for (size_t off = 0; off < n; off += c->max_floats) {
        size_t m = n - off < c->max_floats ? n - off : c->max_floats;
        int rc = gather_chunk(c, send + off, m,
                              c->rank == 0 ? recv + off : NULL, n);
        if (rc != 0) {
            c->failed = 1;
            atomic_store_explicit(&c->shm->aborted, 1, memory_order_release);
            return rc;
        }
    }
    return 0;
}

int gw_comm_new_id(char *out, size_t outlen)
{
    int w = snprintf(out, outlen, "/tangram-%ld-%016llx", (long)getpid(),
                     (unsigned long long)random_u64());
    if (w < 0 || (size_t)w >= outlen) {
        if (outlen > 0)
            out[0] = '\0';
        return TG_ETOOBIG;
    }
    return 0;
}
