/* tg_list.c — the out-of-line helpers of the intrusive list (tg_list.h);
 * the list operations themselves are inline in the header. */
#include "common/base/tg_list.h"

#include "common/base/tg_err.h"

size_t tg_list_count(const struct tg_list *l)
{
    size_t n = 0;
    for (const struct tg_list_node *x = l->first; x != NULL; x = x->next)
        n++;
    return n;
}

int tg_list_check(const struct tg_list *l, size_t max_nodes)
{
    if ((l->first == NULL) != (l->last == NULL))
        return TG_EINTERNAL;
    const struct tg_list_node *prev = NULL;
    size_t steps = 0;
    for (const struct tg_list_node *x = l->first; x != NULL; x = x->next) {
        if (x->prev != prev || ++steps > max_nodes)
            return TG_EINTERNAL;
        prev = x;
    }
    return prev == l->last ? 0 : TG_EINTERNAL;
}
