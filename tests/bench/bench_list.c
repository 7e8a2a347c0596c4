/*
 * bench_list.c — the shared intrusive list (common/base/tg_list.h) against
 * the hand-written prev/next lists it replaced, side by side in one run:
 *
 *   fifo   the scheduler's queue of waiting requests: append at the back,
 *          take from the front, put a preempted one back at the front,
 *          walk it (router/core/rt_sched.c);
 *   lru    the caches' recency lists: a new entry at the front, a hit
 *          moved to the front, eviction from the back, a walk newest to
 *          oldest (router/core/rt_prefix.c, common/grammar/gm_cache.c).
 *
 *   bench-list [--quick]
 *
 * The hand-written lists are reproduced here as they were. Each cell is
 * the best of R runs (R = 5; --quick: 1, fewer operations); prints ns per
 * operation of each and the ratio ours / hand, and fails unless both give
 * the same checksum. Wall-clock ratios on a shared machine are noisy:
 * compare instruction counts (valgrind --tool=callgrind, the *_hand /
 * *_ours functions) for figures.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_list.h"

#define NOINLINE __attribute__((noinline))
#define N_ITEMS 4096

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct item {
    uint64_t id;
    struct item *prev, *next; /* hand */
    struct tg_list_node link; /* ours */
};

struct hand_list {
    struct item *head, *tail;
};

static void hand_unlink(struct hand_list *l, struct item *x)
{
    if (x->prev != NULL)
        x->prev->next = x->next;
    else
        l->head = x->next;
    if (x->next != NULL)
        x->next->prev = x->prev;
    else
        l->tail = x->prev;
    x->prev = x->next = NULL;
}

static void hand_push_back(struct hand_list *l, struct item *x)
{
    x->next = NULL;
    x->prev = l->tail;
    if (l->tail != NULL)
        l->tail->next = x;
    else
        l->head = x;
    l->tail = x;
}

static void hand_push_front(struct hand_list *l, struct item *x)
{
    x->prev = NULL;
    x->next = l->head;
    if (l->head != NULL)
        l->head->prev = x;
    else
        l->tail = x;
    l->head = x;
}

static uint32_t lcg(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*r >> 33);
}

/* ---- fifo ------------------------------------------------------------- */

static NOINLINE uint64_t fifo_hand(struct item *it, size_t ops)
{
    struct hand_list q = {0};
    uint64_t sum = 0, r = 7;
    for (size_t i = 0; i < N_ITEMS / 2; i++)
        hand_push_back(&q, &it[i]);
    for (size_t k = 0; k < ops; k++) {
        struct item *x = q.head;
        hand_unlink(&q, x);
        sum += x->id;
        if (lcg(&r) % 8 == 0)
            hand_push_front(&q, x); /* preempted: first again */
        else
            hand_push_back(&q, x); /* served; its slot queues a new one */
        if (k % 1024 == 0)
            for (const struct item *y = q.head; y != NULL; y = y->next)
                sum += y->id;
    }
    return sum;
}

static NOINLINE uint64_t fifo_ours(struct item *it, size_t ops)
{
    struct tg_list q = {0};
    uint64_t sum = 0, r = 7;
    for (size_t i = 0; i < N_ITEMS / 2; i++)
        tg_list_push_back(&q, &it[i].link);
    for (size_t k = 0; k < ops; k++) {
        struct item *x = TG_LIST_ENTRY(q.first, struct item, link);
        tg_list_remove(&q, &x->link);
        sum += x->id;
        if (lcg(&r) % 8 == 0)
            tg_list_push_front(&q, &x->link);
        else
            tg_list_push_back(&q, &x->link);
        if (k % 1024 == 0) {
            const struct tg_list_node *y;
            TG_LIST_FOREACH(y, &q)
            {
                sum += TG_LIST_ENTRY(y, struct item, link)->id;
            }
        }
    }
    return sum;
}

/* ---- lru -------------------------------------------------------------- */

static NOINLINE uint64_t lru_hand(struct item *it, size_t ops)
{
    struct hand_list l = {0};
    uint64_t sum = 0, r = 11;
    char *in = calloc(N_ITEMS, 1);
    size_t n_in = 0;
    for (size_t k = 0; k < ops; k++) {
        uint32_t i = lcg(&r) % N_ITEMS;
        struct item *x = &it[i];
        if (in[i]) { /* a hit: most recent now */
            if (l.head != x) {
                hand_unlink(&l, x);
                hand_push_front(&l, x);
            }
        } else {
            hand_push_front(&l, x);
            in[i] = 1;
            if (++n_in > N_ITEMS / 2) { /* evict the least recent */
                struct item *old = l.tail;
                hand_unlink(&l, old);
                in[old - it] = 0;
                n_in--;
            }
        }
        sum += l.head->id + l.tail->id;
        if (k % 1024 == 0)
            for (const struct item *y = l.head; y != NULL; y = y->next)
                sum += y->id;
    }
    free(in);
    return sum;
}

static NOINLINE uint64_t lru_ours(struct item *it, size_t ops)
{
    struct tg_list l = {0};
    uint64_t sum = 0, r = 11;
    char *in = calloc(N_ITEMS, 1);
    size_t n_in = 0;
    for (size_t k = 0; k < ops; k++) {
        uint32_t i = lcg(&r) % N_ITEMS;
        struct item *x = &it[i];
        if (in[i]) {
            tg_list_move_front(&l, &x->link);
        } else {
            tg_list_push_front(&l, &x->link);
            in[i] = 1;
            if (++n_in > N_ITEMS / 2) {
                struct item *old = TG_LIST_ENTRY(l.last, struct item, link);
                tg_list_remove(&l, &old->link);
                in[old - it] = 0;
                n_in--;
            }
        }
        sum += TG_LIST_ENTRY(l.first, struct item, link)->id +
               TG_LIST_ENTRY(l.last, struct item, link)->id;
        if (k % 1024 == 0) {
            const struct tg_list_node *y;
            TG_LIST_FOREACH(y, &l)
            {
                sum += TG_LIST_ENTRY(y, struct item, link)->id;
            }
        }
    }
    free(in);
    return sum;
}

struct cell {
    const char *name;
    double hand, ours, ops;
    uint64_t sum_hand, sum_ours;
};

static void run(struct cell *c, const char *name,
                uint64_t (*hand)(struct item *, size_t),
                uint64_t (*ours)(struct item *, size_t), size_t ops, int reps)
{
    struct item *it = calloc(N_ITEMS, sizeof(*it));
    if (it == NULL)
        exit(1);
    for (size_t i = 0; i < N_ITEMS; i++)
        it[i].id = i * 2654435761u;
    c->name = name;
    c->ops = (double)ops;
    c->hand = c->ours = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        c->sum_hand = hand(it, ops);
        double t1 = now();
        c->sum_ours = ours(it, ops);
        double t2 = now();
        c->hand = t1 - t0 < c->hand ? t1 - t0 : c->hand;
        c->ours = t2 - t1 < c->ours ? t2 - t1 : c->ours;
    }
    free(it);
}

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: bench-list [--quick]\n");
            return 2;
        }
    }
    int reps = quick ? 1 : 5;
    size_t ops = quick ? 100000 : 10000000;
    struct cell cells[2];
    run(&cells[0], "fifo", fifo_hand, fifo_ours, ops, reps);
    run(&cells[1], "lru", lru_hand, lru_ours, ops, reps);
    printf("%-6s %12s %12s %10s\n", "case", "hand ns/op", "ours ns/op",
           "ours/hand");
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        const struct cell *c = &cells[i];
        printf("%-6s %12.2f %12.2f %10.3f\n", c->name, 1e9 * c->hand / c->ops,
               1e9 * c->ours / c->ops, c->ours / c->hand);
        if (c->sum_hand != c->sum_ours) {
            fprintf(stderr, "bench-list: %s: checksums differ\n", c->name);
            bad = 1;
        }
    }
    return bad;
}
