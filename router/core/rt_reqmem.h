/*
 * rt_reqmem.h — the router's budget of request memory: what a request's
 * body becomes between its parse and its tokens.
 *
 * A body's bytes are bounded by the body budget (router/net/rt_conn.h),
 * but what they turn into costs far more: the parsed JSON (jansson spends
 * 50 to 200 bytes on each value, so eight megabytes of `[1,1,...]` or of
 * tiny chat messages become hundreds of megabytes), the request's copies
 * of its messages, the rendered chat, and the tokenizer's scratch (its BPE
 * merge keeps about 60 bytes for each byte of the longest word). This
 * budget (--max-request-memory) bounds all of it together: before a large
 * body is parsed, its cost is estimated from one pass over its bytes
 * (rt_reqmem_json_estimate: an upper bound from the counts of values,
 * containers and string bytes, and the longest runs of whitespace and of
 * other characters inside strings, which bound the longest word), and that
 * much is taken from the budget until the request's prompt is tokenized
 * (or it fails or ends); a request whose cost is more than the whole
 * budget is refused (too large), one that does not fit now waits its turn in
 * arrival order (rt_reqmem_wait) or is refused with a retry (gRPC:
 * rt_reqmem_take). So the memory the router spends on requests before the
 * scheduler takes them is bounded by the budget, however many large
 * requests arrive at once; the constants of the estimate are measured
 * (docs/RELIABILITY.md, "Memory after parsing").
 *
 * Threading: loop thread only, except rt_reqmem_json_scan and
 * rt_reqmem_json_estimate, which read only their input (any thread).
 */
#ifndef RT_REQMEM_H
#define RT_REQMEM_H

#include <stddef.h>
#include <stdint.h>

/* What a JSON body holds, counted without parsing it (rt_reqmem_json_scan).
 * Bytes of strings are their decoded bytes (escapes resolved). */
struct rt_reqmem_json {
    size_t bytes;  /* the body's bytes */
    size_t values; /* every value: objects, arrays, strings (keys
                      included), numbers, literals */
    size_t objects;
    size_t arrays;
    size_t members;      /* object members */
    size_t string_bytes; /* bytes of every string, keys included */
    size_t ws_run;       /* longest run of whitespace inside one string */
    size_t word_run;     /* longest run of other characters inside one
                            string */
};

/* A request waiting for the budget (rt_reqmem_wait). The owner embeds it,
 * sets `cost` and `go`, and keeps it in place until `go` ran or it
 * cancelled. */
struct rt_reqmem_waiter {
    size_t cost;                            /* bytes it needs */
    void (*go)(struct rt_reqmem_waiter *w); /* charged: go on (loop) */
    struct rt_reqmem_waiter *prev, *next;   /* internal */
    int waiting;                            /* internal */
};

struct rt_reqmem {
    size_t limit;     /* bytes; 0 = no limit */
    size_t used;      /* readable: bytes charged now */
    size_t peak;      /* readable: most charged at once */
    uint64_t refused; /* readable: requests refused (too costly for the
                         whole budget, or no room for a caller that
                         does not wait) */
    uint64_t waited;  /* readable: requests that waited for room */
    size_t n_waiting; /* readable: waiting now */
    struct rt_reqmem_waiter *head, *tail; /* FIFO of waiters */
    int starting; /* rt_reqmem_give is starting waiters */
};

/* Estimate constants, bytes (measured; docs/RELIABILITY.md). Per JSON
 * value (jansson's node, its place in its container and what the request
 * copies of it), extra per object (its hash table), per array (its first
 * table) and per member (the key's pair and buckets); per string byte
 * (jansson's copy, the request's copies, the rendered chat); per byte the
 * tokenizer reads (pieces, normalized text, ids); per byte of the longest
 * word (BPE's symbols and heap); the template's text around each message,
 * bytes. */
#define RT_REQMEM_PER_VALUE 80
#define RT_REQMEM_PER_OBJECT 224
#define RT_REQMEM_PER_ARRAY 32
#define RT_REQMEM_PER_MEMBER 48
#define RT_REQMEM_PER_STRING_BYTE 6
#define RT_REQMEM_PER_TEXT_BYTE 12
#define RT_REQMEM_PER_WORD_BYTE 64
#define RT_REQMEM_TEMPLATE_BYTES 32

/* A budget of `limit` bytes (0 = no limit). */
void rt_reqmem_init(struct rt_reqmem *m, size_t limit);

/* Takes `cost` bytes now. Returns 0, TG_EAGAIN (no room now) or
 * TG_ETOOBIG (more than the whole budget); both failures are counted in
 * m->refused. */
int rt_reqmem_take(struct rt_reqmem *m, size_t cost);

/* Takes w->cost bytes now (returns 0; w->go is not called), or queues w
 * behind the requests already waiting (returns TG_EAGAIN; w->go runs from
 * a later rt_reqmem_give once the bytes are taken for it), or returns
 * TG_ETOOBIG (more than the whole budget; counted in m->refused). */
int rt_reqmem_wait(struct rt_reqmem *m, struct rt_reqmem_waiter *w);

/* Takes w out of the queue (its owner gave up). No-op when it is not
 * waiting. */
void rt_reqmem_cancel(struct rt_reqmem *m, struct rt_reqmem_waiter *w);

/* Gives `n` bytes back, then takes room for the waiters in arrival order
 * while the first fits, calling each one's go (which may take, give or
 * wait again). */
void rt_reqmem_give(struct rt_reqmem *m, size_t n);

/* Counts what the JSON text p[0..n) holds (see struct rt_reqmem_json) in
 * one pass, without allocating. Malformed input is counted as far as it
 * looks like JSON (the parser refuses it later; the counts stay an upper
 * bound of what it parses first). Any thread. */
void rt_reqmem_json_scan(const char *p, size_t n, struct rt_reqmem_json *out);

/* Adds one string value of n bytes (UTF-8, no escapes) to *j: its bytes
 * and runs, as the scan counts a string of the body; for requests that
 * arrive in another form (gRPC) and become JSON. Any thread. */
void rt_reqmem_json_string(struct rt_reqmem_json *j, const char *s, size_t n);

/* Adds the counts of *k to *j (runs: the longer). Any thread. */
void rt_reqmem_json_add(struct rt_reqmem_json *j,
                        const struct rt_reqmem_json *k);

/* The bytes a request of this body may take at most from its parse to
 * its tokens (see the top; the RT_REQMEM_* constants). Any thread. */
size_t rt_reqmem_json_estimate(const struct rt_reqmem_json *j);

#endif /* RT_REQMEM_H */
