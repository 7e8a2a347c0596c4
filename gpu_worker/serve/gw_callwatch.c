/* gw_callwatch.c — the trigger watch of a triggered constraint
 * (gw_callwatch.h). */
#include "gpu_worker/serve/gw_callwatch.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

int gw_callwatch_init(struct gw_callwatch *w, const char *trigger, size_t n,
                      int anchored)
{
    memset(w, 0, sizeof(*w));
    if (trigger == NULL || n == 0)
        return TG_EINVAL;
    w->trigger = malloc(n);
    if (w->trigger == NULL)
        return TG_ENOMEM;
    memcpy(w->trigger, trigger, n);
    w->n = n;
    w->anchored = anchored != 0;
    return 0;
}

void gw_callwatch_free(struct gw_callwatch *w)
{
    free(w->trigger);
    free(w->buf);
    memset(w, 0, sizeof(*w));
}

void gw_callwatch_reset(struct gw_callwatch *w)
{
    w->n_tail = 0;
}

/* buf holds at least need bytes (its contents kept). */
static int grow(struct gw_callwatch *w, size_t need)
{
    if (need <= w->cap)
        return 0;
    uint8_t *nb = realloc(w->buf, need);
    if (nb == NULL)
        return TG_ENOMEM;
    w->buf = nb;
    w->cap = need;
    return 0;
}

static int is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Anchored: whitespace, then the trigger byte by byte; any other byte
 * first makes the whole output free. The bytes handed out are the
 * trigger (known) and the rest of this token, kept in buf. */
static int feed_anchored(struct gw_callwatch *w, const uint8_t *b, size_t len,
                         const uint8_t **call, size_t *n_call)
{
    for (size_t i = 0; i < len && !w->dead; i++) {
        if (w->seen == 0 && is_space(b[i]))
            continue;
        if (b[i] != (uint8_t)w->trigger[w->seen]) {
            w->dead = 1;
            break;
        }
        if (++w->seen < w->n)
            continue;
        size_t rest = len - i - 1, need = w->n + rest;
        if (grow(w, need) != 0)
            return TG_ENOMEM;
        memcpy(w->buf, w->trigger, w->n);
        memcpy(w->buf + w->n, b + i + 1, rest);
        *call = w->buf;
        *n_call = need;
        w->dead = 1; /* once: the constraint holds to the end */
        return 1;
    }
    return 0;
}

int gw_callwatch_feed(struct gw_callwatch *w, const uint8_t *b, size_t len,
                      const uint8_t **call, size_t *n_call)
{
    *call = NULL;
    *n_call = 0;
    if (w->anchored)
        return feed_anchored(w, b, len, call, n_call);
    size_t need = w->n_tail + len;
    if (grow(w, need) != 0)
        return TG_ENOMEM;
    if (len > 0)
        memcpy(w->buf + w->n_tail, b, len);
    /* The first occurrence that ends in this token: earlier ones were
     * found when their token came. */
    for (size_t p = 0; p + w->n <= need; p++) {
        if (memcmp(w->buf + p, w->trigger, w->n) == 0) {
            *call = w->buf + p;
            *n_call = need - p;
            w->n_tail = 0;
            return 1;
        }
    }
    size_t keep = w->n - 1 < need ? w->n - 1 : need;
    memmove(w->buf, w->buf + need - keep, keep);
    w->n_tail = keep;
    return 0;
}
