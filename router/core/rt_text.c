/* rt_text.c — incremental text, stop strings, hold-back (see rt_text.h). */
#include "router/core/rt_text.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

void rt_text_free(struct rt_text *t)
{
    for (int i = 0; i < t->n_stops; i++)
        free(t->stops[i]);
    free(t->stops);
    tg_buf_free(&t->out);
    memset(t, 0, sizeof(*t));
}

int rt_text_init(struct rt_text *t, const struct tok_tokenizer *tok,
                 const char *const *stops, int n_stops)
{
    memset(t, 0, sizeof(*t));
    tok_stream_init(&t->ts, tok, TOK_DECODE_SKIP_SPECIAL);
    if (n_stops > 0) {
        t->stops = calloc((size_t)n_stops, sizeof(char *));
        if (t->stops == NULL)
            return TG_ENOMEM;
    }
    for (int i = 0; i < n_stops; i++) {
        size_t n = strlen(stops[i]);
        if (n == 0) {
            rt_text_free(t);
            return TG_EINVAL;
        }
        t->stops[i] = strdup(stops[i]);
        if (t->stops[i] == NULL) {
            rt_text_free(t);
            return TG_ENOMEM;
        }
        t->n_stops = i + 1;
        if (n > t->max_stop)
            t->max_stop = n;
    }
    return 0;
}

/* Finds the earliest stop string that ends at or after byte `from` of
 * text[0..len); returns its start or -1. */
static long find_stop(const struct rt_text *t, const char *text, size_t len,
                      size_t from)
{
    long best = -1;
    size_t lo = from > t->max_stop ? from - t->max_stop + 1 : 0;
    for (int i = 0; i < t->n_stops; i++) {
        size_t n = strlen(t->stops[i]);
        if (n > len)
            continue;
        for (size_t p = lo; p + n <= len; p++) {
            if (best >= 0 && (long)p >= best)
                break;
            if (memcmp(text + p, t->stops[i], n) == 0) {
                best = (long)p;
                break;
            }
        }
    }
    return best;
}

int rt_text_push(struct rt_text *t, int32_t token, int *hit)
{
    *hit = 0;
    if (t->stopped)
        return 0;
    size_t before = t->out.len;
    int rc = tok_stream_put(&t->ts, token, &t->out, NULL, 0);
    if (rc != 0)
        return rc;
    if (t->n_stops > 0 && t->out.len > before) {
        long at = find_stop(t, t->out.data, t->out.len, before);
        if (at >= 0) {
            tg_buf_truncate(&t->out, (size_t)at);
            t->stopped = 1;
            *hit = 1;
            if (t->emitted > t->out.len) /* cannot happen: hold-back */
                t->emitted = t->out.len;
        }
    }
    return 0;
}

int rt_text_finish(struct rt_text *t)
{
    if (t->stopped)
        return 0;
    return tok_stream_finish(&t->ts, &t->out, NULL, 0);
}

size_t rt_text_ready(const struct rt_text *t, int final)
{
    if (final || t->stopped || t->n_stops == 0)
        return t->out.len;
    /* Hold back the longest tail that could still grow into a stop string. */
    size_t hold = 0;
    for (int i = 0; i < t->n_stops; i++) {
        size_t n = strlen(t->stops[i]);
        size_t k = n - 1 < t->out.len ? n - 1 : t->out.len;
        for (; k > hold; k--) {
            if (memcmp(t->out.data + t->out.len - k, t->stops[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    size_t ready = t->out.len - hold;
    return ready > t->emitted ? ready : t->emitted;
}

void rt_text_mark(struct rt_text *t, size_t upto)
{
    if (upto > t->emitted && upto <= t->out.len)
        t->emitted = upto;
}
