/*
 * tg_list.h — the one intrusive doubly linked list of tangram.
 *
 * A list links nodes that live inside the caller's structs
 * (struct tg_list_node as a member): linking and unlinking never
 * allocate and never fail, removal is O(1) given the node, and one struct
 * may sit in several lists through several members. TG_LIST_ENTRY turns
 * a node back into its struct (TG_LIST_FIRST / TG_LIST_LAST: the struct at
 * an end, NULL for an empty list).
 *
 *     struct job {
 *         struct tg_list_node link;
 *         int id;
 *     };
 *     struct tg_list queue = {0};
 *     tg_list_push_back(&queue, &j->link);
 *     for (struct tg_list_node *n = queue.first; n != NULL; n = n->next) {
 *         struct job *x = TG_LIST_ENTRY(n, struct job, link);
 *         ...
 *     }
 *
 * The ends are NULL-terminated, not a circle through a sentinel: a zeroed
 * struct tg_list is an empty list and a zeroed node is an unlinked one, so
 * lists live in calloc'ed or memset structs without an init call, and a
 * struct holding a list may be copied or moved (no node points at the
 * list itself). The price is that unlinking takes the list as well as the
 * node.
 *
 * Ownership: the list owns nothing. The caller keeps each node alive
 * while it is linked and must unlink it (tg_list_remove) before freeing
 * or reusing it; removing a node resets its links to NULL.
 *
 * Thread-safety: none of its own; the caller serialises every use of a
 * list and of its nodes.
 */
#ifndef TG_LIST_H
#define TG_LIST_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tg_list_node {
    struct tg_list_node *prev; /* toward first; NULL at the front */
    struct tg_list_node *next; /* toward last; NULL at the back */
};

struct tg_list {
    struct tg_list_node *first; /* NULL when empty */
    struct tg_list_node *last;
};

/* The struct of type `type` whose member `member` is node `ptr` (not
 * NULL). Laid out by hand: clang-format 14 takes the cast for a call. */
/* clang-format off */
#define TG_LIST_ENTRY(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))
/* clang-format on */

/* The struct of the first (last) node of l, or NULL when l is empty. */
#define TG_LIST_FIRST(l, type, member) \
    ((type *)tg_list__entry((l)->first, offsetof(type, member)))
#define TG_LIST_LAST(l, type, member) \
    ((type *)tg_list__entry((l)->last, offsetof(type, member)))

static inline void *tg_list__entry(const struct tg_list_node *n, size_t off)
{
    return n == NULL ? NULL : (void *)((const char *)n - off);
}

static inline int tg_list_empty(const struct tg_list *l)
{
    return l->first == NULL;
}

/* Links n (unlinked) at the back. */
static inline void tg_list_push_back(struct tg_list *l, struct tg_list_node *n)
{
    n->next = NULL;
    n->prev = l->last;
    if (l->last != NULL)
        l->last->next = n;
    else
        l->first = n;
    l->last = n;
}

/* Links n (unlinked) at the front. */
static inline void tg_list_push_front(struct tg_list *l, struct tg_list_node *n)
{
    n->prev = NULL;
    n->next = l->first;
    if (l->first != NULL)
        l->first->prev = n;
    else
        l->last = n;
    l->first = n;
}

/* Links n (unlinked) just before `pos`, a node of l (NULL: at the back). */
static inline void tg_list_insert_before(struct tg_list *l,
                                         struct tg_list_node *pos,
                                         struct tg_list_node *n)
{
    if (pos == NULL) {
        tg_list_push_back(l, n);
        return;
    }
    n->next = pos;
    n->prev = pos->prev;
    if (pos->prev != NULL)
        pos->prev->next = n;
    else
        l->first = n;
    pos->prev = n;
}

/* Unlinks n, a node of l, and resets its links. */
static inline void tg_list_remove(struct tg_list *l, struct tg_list_node *n)
{
    if (n->prev != NULL)
        n->prev->next = n->next;
    else
        l->first = n->next;
    if (n->next != NULL)
        n->next->prev = n->prev;
    else
        l->last = n->prev;
    n->prev = n->next = NULL;
}

/* Unlinks and returns the first node, or NULL when l is empty. */
static inline struct tg_list_node *tg_list_pop_front(struct tg_list *l)
{
    struct tg_list_node *n = l->first;
    if (n != NULL)
        tg_list_remove(l, n);
    return n;
}

/* Moves n, a node of l, to the front (most-recent-first LRU lists). */
static inline void tg_list_move_front(struct tg_list *l, struct tg_list_node *n)
{
    if (l->first == n)
        return;
    tg_list_remove(l, n);
    tg_list_push_front(l, n);
}

/* Walks the nodes front to back (n: a struct tg_list_node * variable).
 * The body must not unlink n; use TG_LIST_FOREACH_SAFE for that. */
#define TG_LIST_FOREACH(n, l) \
    for ((n) = (l)->first; (n) != NULL; (n) = (n)->next)

/* The same, back to front. */
#define TG_LIST_FOREACH_REV(n, l) \
    for ((n) = (l)->last; (n) != NULL; (n) = (n)->prev)

/* Front to back, where the body may unlink (and free) n: `tmp` holds the
 * next node. */
#define TG_LIST_FOREACH_SAFE(n, tmp, l) \
    for ((n) = (l)->first; (n) != NULL && ((tmp) = (n)->next, 1); (n) = (tmp))

/* Nodes in l, by walking it: O(n). */
size_t tg_list_count(const struct tg_list *l);

/* Checks the links of l (first/last and every prev/next agree, no cycle
 * within `max_nodes` steps). Returns 0, or TG_EINTERNAL naming nothing
 * (for tests and assertions). */
int tg_list_check(const struct tg_list *l, size_t max_nodes);

#ifdef __cplusplus
}
#endif

#endif /* TG_LIST_H */
