/* tg_grow.c — the growable-array helper (tg_grow.h). */
#include "common/base/tg_grow.h"

#include <stdlib.h>

#include "common/base/tg_err.h"

/* Grows to at least need elements, doubling, never past max_cap elements
 * (the capacity type's range; the byte size is checked here). */
static int tg_grow__to(void **p, size_t *cap, size_t need, size_t elem,
                       size_t max_cap)
{
    if (elem == 0)
        return TG_EINVAL;
    if (need <= *cap)
        return 0;
    if (max_cap > SIZE_MAX / elem)
        max_cap = SIZE_MAX / elem;
    if (need > max_cap)
        return TG_ENOMEM;
    size_t c = *cap > 0 ? *cap : TG_GROW_MIN;
    while (c < need)
        c = c > max_cap / 2 ? max_cap : c * 2;
    if (c > max_cap)
        c = max_cap;
    void *np = realloc(*p, c * elem);
    if (np == NULL)
        return TG_ENOMEM;
    *p = np;
    *cap = c;
    return 0;
}

int tg_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    return tg_grow__to(p, cap, need, elem, SIZE_MAX);
}

int tg_grow_i64(void **p, int64_t *cap, int64_t need, size_t elem)
{
    if (*cap < 0 || need < 0)
        return TG_EINVAL;
    size_t c = (size_t)*cap;
    int rc = tg_grow__to(p, &c, (size_t)need, elem, (size_t)INT64_MAX);
    if (rc == 0)
        *cap = (int64_t)c;
    return rc;
}

int tg_grow_i32(void **p, int32_t *cap, int64_t need, size_t elem)
{
    if (*cap < 0 || need < 0)
        return TG_EINVAL;
    if (need > INT32_MAX)
        return TG_ENOMEM;
    size_t c = (size_t)*cap;
    int rc = tg_grow__to(p, &c, (size_t)need, elem, (size_t)INT32_MAX);
    if (rc == 0)
        *cap = (int32_t)c;
    return rc;
}
