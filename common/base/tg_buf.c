/* tg_buf.c — growth, formatting and hand-over of the byte buffer
 * (tg_buf.h); the appends' fast paths are inline in the header. */
#include "common/base/tg_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* The room tg_buf_printf makes before its first try. */
#define TG_BUF_PRINTF_ROOM 64

static int fail(struct tg_buf *b, int code)
{
    b->failed = 1;
    return code;
}

int tg_buf_reserve(struct tg_buf *b, size_t extra)
{
    if (b->failed)
        return TG_ENOMEM;
    if (extra >= SIZE_MAX - b->len)
        return fail(b, TG_ENOMEM);
    if (tg_grow((void **)&b->data, &b->cap, b->len + extra + 1, 1) != 0)
        return fail(b, TG_ENOMEM);
    /* Terminated even when nothing gets appended (fresh storage). */
    b->data[b->len] = '\0';
    return 0;
}

int tg_buf__append_slow(struct tg_buf *b, const void *p, size_t n)
{
    int rc = tg_buf_reserve(b, n);
    if (rc != 0)
        return rc;
    if (n > 0)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int tg_buf_printf(struct tg_buf *b, const char *fmt, ...)
{
    if (b->failed)
        return TG_ENOMEM;
    /* First into the room there is (at least a line's worth, so most
     * texts take one pass); when the text is longer, once more into room
     * made for exactly it. */
    if (b->cap - b->len < TG_BUF_PRINTF_ROOM &&
        tg_buf_reserve(b, TG_BUF_PRINTF_ROOM) != 0)
        return TG_ENOMEM;
    size_t room = b->cap - b->len;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->data + b->len, room, fmt, ap);
    va_end(ap);
    if (k < 0) {
        if (b->data != NULL)
            b->data[b->len] = '\0';
        return fail(b, TG_EINVAL);
    }
    if ((size_t)k >= room) {
        int rc = tg_buf_reserve(b, (size_t)k);
        if (rc != 0) {
            if (b->data != NULL) /* the first try wrote past the text */
                b->data[b->len] = '\0';
            return rc;
        }
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)k + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)k;
    return 0;
}

void tg_buf_truncate(struct tg_buf *b, size_t len)
{
    TG_ASSERT(len <= b->len);
    b->len = len;
    if (b->data != NULL)
        b->data[len] = '\0';
}

void tg_buf_reset(struct tg_buf *b)
{
    b->failed = 0;
    tg_buf_truncate(b, 0);
}

char *tg_buf_steal(struct tg_buf *b, size_t *len)
{
    char *s = b->data;
    size_t n = b->len;
    if (b->failed) {
        free(s);
        s = NULL;
        n = 0;
    } else if (s == NULL) {
        s = malloc(1);
        if (s != NULL)
            s[0] = '\0';
    }
    memset(b, 0, sizeof(*b));
    if (len != NULL)
        *len = s != NULL ? n : 0;
    return s;
}

void tg_buf_free(struct tg_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}
