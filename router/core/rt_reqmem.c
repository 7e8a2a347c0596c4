/* rt_reqmem.c — the request memory budget and the estimate of a JSON
 * body's cost (see rt_reqmem.h). */
#include "router/core/rt_reqmem.h"

#include <string.h>

#include "common/base/tg_err.h"

void rt_reqmem_init(struct rt_reqmem *m, size_t limit)
{
    memset(m, 0, sizeof(*m));
    m->limit = limit;
}

static int fits(const struct rt_reqmem *m, size_t cost)
{
    return m->limit == 0 || cost <= m->limit - m->used;
}

static void charge(struct rt_reqmem *m, size_t cost)
{
    m->used += cost;
    if (m->used > m->peak)
        m->peak = m->used;
}

int rt_reqmem_take(struct rt_reqmem *m, size_t cost)
{
    if (m->limit && cost > m->limit) {
        m->refused++;
        return TG_ETOOBIG;
    }
    /* Those waiting came first. */
    if (m->head != NULL || !fits(m, cost)) {
        m->refused++;
        return TG_EAGAIN;
    }
    charge(m, cost);
    return 0;
}

int rt_reqmem_wait(struct rt_reqmem *m, struct rt_reqmem_waiter *w)
{
    w->waiting = 0;
    if (m->limit && w->cost > m->limit) {
        m->refused++;
        return TG_ETOOBIG;
    }
    if (m->head == NULL && fits(m, w->cost)) {
        charge(m, w->cost);
        return 0;
    }
    w->waiting = 1;
    w->next = NULL;
    w->prev = m->tail;
    if (m->tail)
        m->tail->next = w;
    else
        m->head = w;
    m->tail = w;
    m->n_waiting++;
    m->waited++;
    return TG_EAGAIN;
}

void rt_reqmem_cancel(struct rt_reqmem *m, struct rt_reqmem_waiter *w)
{
    if (!w->waiting)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        m->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        m->tail = w->prev;
    w->prev = w->next = NULL;
    w->waiting = 0;
    m->n_waiting--;
    /* Those behind it may fit now. */
    rt_reqmem_give(m, 0);
}

void rt_reqmem_give(struct rt_reqmem *m, size_t n)
{
    TG_ASSERT(n <= m->used);
    m->used -= n;
    /* A go that gives back starts the next ones from this loop, not from a
     * nested one. */
    if (m->starting)
        return;
    m->starting = 1;
    struct rt_reqmem_waiter *w;
    while ((w = m->head) != NULL && fits(m, w->cost)) {
        m->head = w->next;
        if (m->head)
            m->head->prev = NULL;
        else
            m->tail = NULL;
        w->prev = w->next = NULL;
        w->waiting = 0;
        m->n_waiting--;
        charge(m, w->cost);
        w->go(w);
    }
    m->starting = 0;
}

/* ---- the estimate -------------------------------------------------------- */

/* Unicode White_Space, the set the tokenizer's pre-tokenizers split on
 * (common/tok/tok_encode.c). */
static int is_ws(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The runs of whitespace and of other characters of the string being
 * scanned. */
struct runs {
    size_t ws, word;
};

static void add_char(struct rt_reqmem_json *j, struct runs *r, uint32_t cp,
                     size_t bytes)
{
    j->string_bytes += bytes;
    if (is_ws(cp)) {
        r->ws += bytes;
        r->word = 0;
        if (r->ws > j->ws_run)
            j->ws_run = r->ws;
    } else {
        r->word += bytes;
        r->ws = 0;
        if (r->word > j->word_run)
            j->word_run = r->word;
    }
}

/* Bytes of the UTF-8 encoding of cp. */
static size_t utf8_len(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* Scans the inside of a string from p[i]: of a JSON text (`json`: after
 * its quote, escapes resolved, up to its closing quote) or raw UTF-8 (to
 * n). Returns the index after the closing quote (or n). */
static size_t scan_string(const char *p, size_t n, size_t i, int json,
                          struct rt_reqmem_json *j)
{
    struct runs r = {0, 0};
    while (i < n) {
        unsigned char c = (unsigned char)p[i];
        if (json && c == '"')
            return i + 1;
        if (json && c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            i += 2;
            uint32_t cp = (uint32_t)(unsigned char)e;
            if (e == 'u') {
                cp = 0;
                for (int k = 0; k < 4 && i < n && hexval(p[i]) >= 0; k++, i++)
                    cp = cp << 4 | (uint32_t)hexval(p[i]);
            } else if (e == 'n') {
                cp = '\n';
            } else if (e == 't') {
                cp = '\t';
            } else if (e == 'r') {
                cp = '\r';
            } else if (e == 'f') {
                cp = '\f';
            } else if (e == 'b') {
                cp = '\b';
            }
            add_char(j, &r, cp, utf8_len(cp));
            continue;
        }
        /* A UTF-8 sequence: its code point for the whitespace test. */
        size_t len = c < 0x80    ? 1
                     : c >= 0xF0 ? 4
                     : c >= 0xE0 ? 3
                     : c >= 0xC0 ? 2
                                 : 1;
        uint32_t cp = len == 1 ? c : (uint32_t)(c & (0x7F >> len));
        size_t k = 1;
        for (; k < len && i + k < n && ((unsigned char)p[i + k] & 0xC0) == 0x80;
             k++)
            cp = cp << 6 | ((unsigned char)p[i + k] & 0x3F);
        add_char(j, &r, cp, k);
        i += k;
    }
    return n;
}

void rt_reqmem_json_string(struct rt_reqmem_json *j, const char *s, size_t n)
{
    j->values++;
    scan_string(s, n, 0, 0, j);
}

void rt_reqmem_json_add(struct rt_reqmem_json *j,
                        const struct rt_reqmem_json *k)
{
    j->bytes += k->bytes;
    j->values += k->values;
    j->objects += k->objects;
    j->arrays += k->arrays;
    j->members += k->members;
    j->string_bytes += k->string_bytes;
    if (k->ws_run > j->ws_run)
        j->ws_run = k->ws_run;
    if (k->word_run > j->word_run)
        j->word_run = k->word_run;
}

void rt_reqmem_json_scan(const char *p, size_t n, struct rt_reqmem_json *out)
{
    memset(out, 0, sizeof(*out));
    out->bytes = n;
    int in_scalar = 0;
    size_t i = 0;
    while (i < n) {
        char c = p[i];
        if (c == '"') {
            out->values++;
            in_scalar = 0;
            i = scan_string(p, n, i + 1, 1, out);
            continue;
        }
        int scalar_char = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                          (c >= 'A' && c <= 'Z') || c == '-' || c == '+' ||
                          c == '.';
        if (scalar_char && !in_scalar)
            out->values++;
        in_scalar = scalar_char;
        if (c == '{') {
            out->values++;
            out->objects++;
        } else if (c == '[') {
            out->values++;
            out->arrays++;
        } else if (c == ':') {
            out->members++;
        }
        i++;
    }
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a + b < a ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

size_t rt_reqmem_json_estimate(const struct rt_reqmem_json *j)
{
    /* The parsed JSON and the request's copies of it. */
    uint64_t e = sat_mul(j->values, RT_REQMEM_PER_VALUE);
    e = sat_add(e, sat_mul(j->objects, RT_REQMEM_PER_OBJECT));
    e = sat_add(e, sat_mul(j->arrays, RT_REQMEM_PER_ARRAY));
    e = sat_add(e, sat_mul(j->members, RT_REQMEM_PER_MEMBER));
    e = sat_add(e, sat_mul(j->string_bytes, RT_REQMEM_PER_STRING_BYTE));
    /* What the tokenizer reads: every string, and the template's text
     * around each message (an object), at most. */
    uint64_t text = sat_add(j->string_bytes,
                            sat_mul(j->objects, RT_REQMEM_TEMPLATE_BYTES));
    e = sat_add(e, sat_mul(text, RT_REQMEM_PER_TEXT_BYTE));
    /* BPE's scratch for the longest word: a pre-tokenizer's piece is at
     * most a run of whitespace and the run of other characters beside
     * it, with what the template puts around a message. */
    uint64_t word = sat_add(sat_add(j->ws_run, j->word_run),
                            RT_REQMEM_TEMPLATE_BYTES);
    e = sat_add(e, sat_mul(word, RT_REQMEM_PER_WORD_BYTE));
    return e > SIZE_MAX ? SIZE_MAX : (size_t)e;
}
