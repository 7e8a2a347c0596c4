/*
 * tok_decode.c — ids -> text (tok_tokenizer.h): lossy UTF-8 assembly,
 * the streaming decoder, and the growable id array shared by tok_*.c.
 */
#include "common/tok/tok_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

#include <stdlib.h>
#include <string.h>

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

void tok_ids_free(struct tok_ids *ids)
{
    free(ids->v);
    memset(ids, 0, sizeof(*ids));
}

int tok__ids_reserve(struct tok_ids *ids, size_t extra)
{
    if (extra > SIZE_MAX / 8 - ids->n)
        return TG_ENOMEM;
    return TG_GROW(ids->v, &ids->cap, ids->n + extra);
}

int tok__utf8_seq(const uint8_t *p, size_t n)
{
    uint8_t b = p[0];
    if (b < 0x80)
        return 1;
    /* Well-formed sequences, Unicode Table 3-7: the second byte's range
     * depends on the lead byte, later ones are always 80..BF. */
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b == 0xE0) {
        need = 2;
        lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
        need = 2;
    } else if (b == 0xED) {
        need = 2;
        hi = 0x9F;
    } else if (b == 0xF0) {
        need = 3;
        lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
        need = 3;
    } else if (b == 0xF4) {
        need = 3;
        hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n)
            return 0;
        if (p[i] < lo || p[i] > hi)
            return -i;
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

int tok_utf8_valid(const char *s, size_t n, size_t *bad)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        int r = tok__utf8_seq(p + i, n - i);
        if (r <= 0) {
            if (bad != NULL)
                *bad = i;
            return 0;
        }
        i += (size_t)r;
    }
    return 1;
}

/* Appends p[0..n) to out with ill-formed subsequences replaced by U+FFFD.
 * When !final an incomplete tail is left unconsumed; *used gets the bytes
 * consumed. Returns 0 or TG_ENOMEM. */
static int append_lossy(struct tg_buf *out, const uint8_t *p, size_t n,
                        int final, size_t *used)
{
    size_t i = 0;
    while (i < n) {
        size_t rest = n - i, good;
        if (tok_utf8_valid((const char *)p + i, rest, &good))
            good = rest;
        if (good > 0) {
            if (tg_buf_append(out, p + i, good) != 0)
                return TG_ENOMEM;
            i += good;
            continue;
        }
        int r = tok__utf8_seq(p + i, rest);
        if (r == 0 && !final)
            break;
        if (tg_buf_append(out, REPLACEMENT, 3) != 0)
            return TG_ENOMEM;
        i += r == 0 ? rest : (size_t)-r;
    }
    *used = i;
    return 0;
}

/* Returns the bytes of id for decoding, or NULL when skipped. */
static const uint8_t *id_bytes(const struct tok_tokenizer *tok, int32_t id,
                               unsigned flags, size_t *len)
{
    if (id < 0 || id >= tok->n_ids || tok->str[id].len == UINT32_MAX)
        return NULL;
    if ((flags & TOK_DECODE_SKIP_SPECIAL) && (tok->flags[id] & TOK__F_SPECIAL))
        return NULL;
    *len = tok->raw[id].len;
    return (const uint8_t *)tok->arena + tok->raw[id].off;
}

int tok_decode(const struct tok_tokenizer *tok, const int32_t *ids, size_t n,
               unsigned flags, struct tg_buf *out, char *err, size_t errlen)
{
    size_t start = out->len, total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (id_bytes(tok, ids[i], flags, &len) != NULL)
            total += len;
    }
    if (tg_buf_reserve(out, total) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *b = id_bytes(tok, ids[i], flags, &len);
        if (b != NULL) {
            memcpy(out->data + out->len, b, len);
            out->len += len;
        }
    }
    out->data[out->len] = '\0';
    if (tok_utf8_valid(out->data + start, total, NULL))
        return 0;
    /* Rare: some bytes are ill-formed; redo that region lossily. */
    uint8_t *raw = malloc(total);
    if (raw == NULL)
        goto oom;
    memcpy(raw, out->data + start, total);
    tg_buf_truncate(out, start);
    size_t used;
    int rc = append_lossy(out, raw, total, 1, &used);
    free(raw);
    if (rc == 0)
        return 0;
oom:
    tg_buf_truncate(out, start);
    out->failed = 1;
    return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
}

void tok_stream_init(struct tok_stream *s, const struct tok_tokenizer *tok,
                     unsigned flags)
{
    memset(s, 0, sizeof(*s));
    s->tok = tok;
    s->flags = flags;
}

int tok_stream_put(struct tok_stream *s, int32_t id, struct tg_buf *out,
                   char *err, size_t errlen)
{
    size_t len;
    const uint8_t *b = id_bytes(s->tok, id, s->flags, &len);
    if (b == NULL || len == 0)
        return 0;
    /* The held tail (< 4 bytes) goes in front of the new bytes. */
    uint8_t local[256], *buf = local;
    size_t n = s->npend + len;
    if (n > sizeof(local)) {
        buf = malloc(n);
        if (buf == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    memcpy(buf, s->pend, s->npend);
    memcpy(buf + s->npend, b, len);
    size_t start = out->len, used;
    int rc = append_lossy(out, buf, n, 0, &used);
    if (rc == 0) {
        TG_ASSERT(n - used < sizeof(s->pend));
        s->npend = (uint8_t)(n - used);
        memcpy(s->pend, buf + used, s->npend);
    } else {
        tg_buf_truncate(out, start);
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (buf != local)
        free(buf);
    return rc;
}

int tok_stream_finish(struct tok_stream *s, struct tg_buf *out, char *err,
                      size_t errlen)
{
    if (s->npend == 0)
        return 0;
    size_t used;
    if (append_lossy(out, s->pend, s->npend, 1, &used) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    s->npend = 0;
    return 0;
}
