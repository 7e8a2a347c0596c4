/*
 * tg_buf.h — the one growable byte/string buffer of tangram: append bytes,
 * characters, strings or printf-formatted text, reserve room, and steal
 * the result as a malloc'ed string.
 *
 * A zeroed struct tg_buf is an empty buffer (no init call). Once anything
 * was appended or reserved, data[len] is a NUL, so data is a C string
 * whenever the bytes hold no NUL of their own; tg_buf_str gives "" for a
 * buffer that never allocated. Capacity grows by doubling (tg_grow), so
 * appending is amortised O(1); the fast path of an append is inline.
 *
 * Failure is sticky: the first append that fails (out of memory, a size
 * that overflows, a printf format error) marks the buffer failed, and
 * every later append does nothing and fails too. A builder can therefore
 * append without checking each call and check once at the end
 * (tg_buf_failed, or tg_buf_steal returning NULL); the bytes already in the
 * buffer stay as they were, never a text with a piece missing in the
 * middle. tg_buf_reset clears the mark.
 *
 *     struct tg_buf b = {0};
 *     tg_buf_printf(&b, "HTTP/1.1 %d %s\r\n", status, reason);
 *     tg_buf_append(&b, headers, headers_len);
 *     tg_buf_puts(&b, "\r\n");
 *     if (tg_buf_failed(&b)) ...
 *     char *s = tg_buf_steal(&b, &len);   (b is empty again)
 *
 * Ownership: the buffer owns data until tg_buf_steal hands it to the
 * caller (who frees it) or tg_buf_free releases it. Pointers into data
 * are valid until the next append or reserve.
 *
 * Thread-safety: none of its own; one thread at a time per buffer.
 */
#ifndef TG_BUF_H
#define TG_BUF_H

#include <stddef.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tg_buf {
    char *data; /* (cap) bytes; data[0..len) in use, data[len] == '\0';
                   NULL until the first append or reserve */
    size_t len; /* bytes in use, the terminator excluded */
    size_t cap; /* bytes allocated, the terminator's included */
    int failed; /* an append failed: later ones do nothing (sticky) */
};

/* Makes room for `extra` more bytes (and the terminator) without moving
 * data again. Returns 0 or TG_ENOMEM (marks the buffer failed). */
int tg_buf_reserve(struct tg_buf *b, size_t extra);

/* The slow path of the appends: grows, then appends. */
int tg_buf__append_slow(struct tg_buf *b, const void *p, size_t n);

/* Appends n bytes at p (not NULL, even for n == 0: tg_buf_str gives ""
 * for an empty buffer). Returns 0 or TG_ENOMEM (also when the buffer had
 * already failed). */
static inline int tg_buf_append(struct tg_buf *b, const void *p, size_t n)
{
    if (b->failed || n >= b->cap - b->len)
        return tg_buf__append_slow(b, p, n);
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

/* Appends one byte. */
static inline int tg_buf_putc(struct tg_buf *b, char c)
{
    if (b->failed || b->cap - b->len < 2)
        return tg_buf__append_slow(b, &c, 1);
    b->data[b->len++] = c;
    b->data[b->len] = '\0';
    return 0;
}

/* Appends the C string s (without its terminator). */
static inline int tg_buf_puts(struct tg_buf *b, const char *s)
{
    return tg_buf_append(b, s, strlen(s));
}

/* Appends printf-formatted text, however long. Returns 0, TG_ENOMEM or
 * TG_EINVAL (a format error); either failure marks the buffer failed. */
int tg_buf_printf(struct tg_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* 1 when an append failed since the buffer was zeroed or reset. */
static inline int tg_buf_failed(const struct tg_buf *b)
{
    return b->failed;
}

/* The text, "" for a buffer that never allocated. Valid until the next
 * append, reserve, steal or free. */
static inline const char *tg_buf_str(const struct tg_buf *b)
{
    return b->data != NULL ? b->data : "";
}

/* Cuts the buffer to its first `len` bytes (len <= b->len). */
void tg_buf_truncate(struct tg_buf *b, size_t len);

/* Empties the buffer and clears a failure, keeping the storage. */
void tg_buf_reset(struct tg_buf *b);

/* Hands the bytes over: a malloc'ed, NUL-terminated string the caller
 * frees ("" allocated for an empty buffer), its length in *len (len may
 * be NULL). The buffer is zeroed either way. NULL when the buffer had
 * failed (its bytes are freed) or "" could not be allocated. */
char *tg_buf_steal(struct tg_buf *b, size_t *len);

/* Frees the storage and zeroes the buffer. Safe on a zeroed buffer. */
void tg_buf_free(struct tg_buf *b);

#ifdef __cplusplus
}
#endif

#endif /* TG_BUF_H */
