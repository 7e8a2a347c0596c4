/*
 * rt_grpc.h — the router's gRPC server (DESIGN.md §2, §5): HTTP/2 over
 * cleartext TCP with prior knowledge (h2c, RFC 9113 §3.3) on libuv, framed
 * by nghttp2, speaking the gRPC wire protocol of
 * https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md.
 *
 * What it does:
 * - Method table: exact paths "/package.Service/Method" -> handler. A call
 *   to a path not in the table (and admitted) gets grpc-status 12
 *   UNIMPLEMENTED in a trailers-only response.
 * - Request checks: :method must be POST (else HTTP 405), content-type
 *   "application/grpc" or "application/grpc+proto" (else HTTP 415) and
 *   "te: trailers" (else 3 INVALID_ARGUMENT); each answer is a complete
 *   gRPC status in trailers-only form. HTTP-level violations (pseudo
 *   headers, frame errors) are reset by nghttp2 itself, per stream.
 * - Admission: once a call's headers are complete, before its method is
 *   looked up, the admit callback (rt_grpc_server_on_admit; the router
 *   checks the API key there) may refuse it with a status, so a client
 *   without a key cannot tell real methods from unknown ones. Nothing of
 *   the request body is buffered before that.
 * - Messages: the 5-byte length prefix (compressed flag, big-endian u32
 *   length) is parsed and removed; handlers see raw protobuf bytes and
 *   pack/unpack themselves. A compressed message gets 12 UNIMPLEMENTED
 *   ("compression not supported"; we advertise grpc-accept-encoding
 *   identity); a message over max_message_bytes gets 8 RESOURCE_EXHAUSTED
 *   as soon as its prefix arrives (nothing more is buffered). Unary and
 *   server-streaming methods take exactly one request message (anything
 *   else gets 3 INVALID_ARGUMENT); bidirectional methods any number.
 * - Receive deadline: a unary or server-streaming request must be complete
 *   (END_STREAM) within recv_timeout_ms of its first HEADERS frame, and a
 *   bidirectional stream must deliver each message (or END_STREAM) within
 *   recv_timeout_ms of the previous one; else 4 DEADLINE_EXCEEDED and the
 *   stream is reset. A header block left unfinished that long closes the
 *   connection.
 * - grpc-timeout (1 to 8 digits and a unit H M S m u n) becomes a deadline
 *   measured from the request headers; when it passes, the call is
 *   cancelled (as below) and the client gets 4 DEADLINE_EXCEEDED; a call
 *   whose deadline passed before its handler would run gets it without
 *   running the handler. A malformed grpc-timeout gets 3 INVALID_ARGUMENT.
 * - Unary and server-streaming handlers run once the request stream ended
 *   (END_STREAM), with the one request message. They answer now or later:
 *   rt_grpc_call_send() any number of messages (at most one for
 *   RT_GRPC_UNARY), then rt_grpc_call_finish() with a status and message;
 *   grpc-message is percent-encoded per the spec. Finishing before any
 *   message is sent gives a trailers-only response.
 * - Bidirectional handlers run as soon as the call is admitted, without a
 *   message; they register rt_grpc_call_on_message() and get each request
 *   message as it arrives, then an end-of-input call.
 * - Many concurrent streams per connection, at most max_concurrent_streams
 *   (SETTINGS_MAX_CONCURRENT_STREAMS; nghttp2 refuses more with
 *   RST_STREAM REFUSED_STREAM); HTTP/2 flow control both ways (output the
 *   peer cannot take yet stays queued on the call and resumes when its
 *   window opens or the handler writes more).
 * - Connections (router/net/rt_conn.h, the set shared with the HTTP server):
 *   at most max_connections are open, at most max_connections_per_ip of
 *   one client address. A connection is idle while no call is in progress
 *   (dispatched to a handler and not finished) and no response frame of
 *   such a call went out; streams still waiting for their request, and
 *   the answers to streams refused or timed out before a handler took
 *   them, do not count as activity. A new connection at a limit takes the
 *   place of the oldest idle one (GOAWAY, then closed); when every
 *   connection has a call in progress it takes a place of the probe
 *   reserve (probe_reserve, rt_conn.h) if there is one, where it is served
 *   RT_GRPC_PROBE_METHOD (the health check a probe makes) and any other
 *   call ends with UNAVAILABLE; otherwise it is refused: SETTINGS and a
 *   GOAWAY ENHANCE_YOUR_CALM "connection limit", then closed, so clients
 *   see UNAVAILABLE and back off. An idle connection gets GOAWAY and is
 *   closed after idle_timeout_ms. Accepting pauses (never spins, never
 *   resets pending clients) while the process is out of descriptors.
 * - Body budget: with cfg.body_budget, each request message's announced
 *   length must fit what the budget has free when its prefix arrives, and
 *   the message is charged as its bytes arrive, before they are allocated
 *   (rt_conn_body_grow), so streams that announce large messages and send
 *   them slowly hold only what they sent; a message that does not fit
 *   ends its call with 14 UNAVAILABLE ("memory budget", retryable). The
 *   charge is given back
 *   when the handler of a unary or server-streaming call returns (the
 *   message is only valid during it) or a bidi message was delivered.
 * - Anything that is not HTTP/2 (bad preface, garbage) closes only that
 *   connection; other connections and streams are unaffected.
 * - Close: rt_grpc_server_close() ends every call with a status (14
 *   UNAVAILABLE "the server is shutting down" unless the handler finished
 *   it), sends GOAWAY, and closes each connection once its output is
 *   written or close_linger_ms passed.
 *
 * Call handles and cancellation (the rt_http contract). The handler
 * receives a `struct rt_grpc_call *`; the handle stays valid until
 * rt_grpc_call_finish() returned. If the call ends first — RST_STREAM from
 * the client, connection loss, deadline, server close:
 * - with a cancel callback set (rt_grpc_call_on_cancel), it fires exactly
 *   once; the handle must not be used after it returns. Inside the
 *   callback every response call returns TG_ECANCELED.
 * - without one, the handle becomes a "zombie": every response call
 *   returns TG_ECANCELED, and rt_grpc_call_finish() frees it.
 *   rt_grpc_server_free() frees zombies left over.
 *
 * Threading: everything — handlers, callbacks and every rt_grpc_* call —
 * runs on the thread of the server's uv loop. Library code: never prints.
 *
 * Implementation: rt_grpc.c (connections, nghttp2 glue, server, close),
 * rt_grpc_call.c (calls, framing, responses, encoders) and
 * rt_grpc_timer.c (deadlines, receive deadlines) sharing
 * rt_grpc_internal.h; rt_grpc_health.c (grpc.health.v1.Health);
 * rt_grpc_reflect.c (server reflection, rt_grpc_reflect.h).
 */
#ifndef RT_GRPC_H
#define RT_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "router/net/rt_conn.h"

struct rt_grpc_call;
struct rt_grpc_conn;
struct rt_grpc_inmsg;
struct rt_grpc_server;

/* gRPC status codes (doc/statuscodes.md of the gRPC repository). */
enum rt_grpc_status {
    RT_GRPC_OK = 0,
    RT_GRPC_CANCELLED = 1,
    RT_GRPC_UNKNOWN = 2,
    RT_GRPC_INVALID_ARGUMENT = 3,
    RT_GRPC_DEADLINE_EXCEEDED = 4,
    RT_GRPC_NOT_FOUND = 5,
    RT_GRPC_ALREADY_EXISTS = 6,
    RT_GRPC_PERMISSION_DENIED = 7,
    RT_GRPC_RESOURCE_EXHAUSTED = 8,
    RT_GRPC_FAILED_PRECONDITION = 9,
    RT_GRPC_ABORTED = 10,
    RT_GRPC_OUT_OF_RANGE = 11,
    RT_GRPC_UNIMPLEMENTED = 12,
    RT_GRPC_INTERNAL = 13,
    RT_GRPC_UNAVAILABLE = 14,
    RT_GRPC_DATA_LOSS = 15,
    RT_GRPC_UNAUTHENTICATED = 16,
};

/* How many messages a method takes and sends. */
enum rt_grpc_kind {
    RT_GRPC_UNARY = 0,         /* one request, exactly one response
                                  message, then OK */
    RT_GRPC_SERVER_STREAM = 1, /* one request, any number of responses */
    RT_GRPC_BIDI_STREAM = 2,   /* any number of requests, delivered as
                                  they arrive, and of responses */
};

/* What rt_grpc_server_on_event() reports, for metrics. */
enum rt_grpc_event {
    RT_GRPC_EVENT_CONN_OPEN = 0,   /* a connection was accepted */
    RT_GRPC_EVENT_CONN_CLOSE,      /* ... and is closed (each open once) */
    RT_GRPC_EVENT_IDLE_CLOSE,      /* closed by idle_timeout_ms */
    RT_GRPC_EVENT_RECV_TIMEOUT,    /* a stream ended by recv_timeout_ms */
    RT_GRPC_EVENT_DEADLINE,        /* a call ended by its grpc-timeout */
    RT_GRPC_EVENT_REFUSED_STREAM,  /* a stream over max_concurrent_streams
                                      refused (RST_STREAM REFUSED_STREAM) */
    RT_GRPC_EVENT_TOO_LARGE,       /* a message over max_message_bytes */
    RT_GRPC_EVENT_BUDGET,          /* a message refused: the body budget
                                      was full */
    RT_GRPC_EVENT_COUNT,
};

/* Called once per call on the loop thread; `ud` is the method's user
 * data. Unary and server-streaming methods: once the request is complete,
 * with call->msg set. Bidirectional methods: once the call is admitted,
 * with no message (call->msg NULL); the handler sets
 * rt_grpc_call_on_message() to receive them. The handler must eventually
 * call rt_grpc_call_finish() (now or later) unless the call is cancelled
 * first and a cancel callback took it. */
typedef void (*rt_grpc_handler_fn)(struct rt_grpc_call *call, void *ud);

/* Bidirectional calls: called for each request message in order (`msg`
 * non-NULL, `len` bytes without the prefix, valid during the call only;
 * an empty message has len 0), then once with msg NULL when the client
 * half-closed its side. Not called any more once the call is finishing or
 * cancelled. `ud` is the value given to rt_grpc_call_on_message(). */
typedef void (*rt_grpc_message_fn)(struct rt_grpc_call *call,
                                   const uint8_t *msg, size_t len, void *ud);

/* Decides whether a call may go on, once its headers are complete and its
 * method is known (call->path, rt_grpc_call_header() usable; no message
 * yet). Returns RT_GRPC_OK, or the status to refuse the call with after
 * writing a message into msg[0..msglen) (NUL-terminated). */
typedef int (*rt_grpc_admit_fn)(const struct rt_grpc_call *call, void *ud,
                                char *msg, size_t msglen);

/* Reports one event (enum rt_grpc_event); must not call back into the
 * server. */
typedef void (*rt_grpc_event_fn)(int event, void *ud);

/* Called once when an unfinished call ends early (see top); `ud` is the
 * value given to rt_grpc_call_on_cancel(). `status` says why:
 * RT_GRPC_CANCELLED (client reset or connection loss, server close) or
 * RT_GRPC_DEADLINE_EXCEEDED. */
typedef void (*rt_grpc_cancel_fn)(struct rt_grpc_call *call, int status,
                                  void *ud);

/* Called once by rt_grpc_server_close() when every handle is closed. */
typedef void (*rt_grpc_closed_fn)(void *ud);

struct rt_grpc_config {
    size_t max_message_bytes;    /* request message payload bytes; over ->
                                    RESOURCE_EXHAUSTED (default 4 MiB,
                                    min 16) */
    uint32_t max_concurrent_streams; /* SETTINGS_MAX_CONCURRENT_STREAMS
                                    (default 100, min 1) */
    uint32_t window_bytes;       /* receive window per stream and per
                                    connection (default 1 MiB, 65535 ..
                                    2^31-1) */
    size_t max_header_bytes;     /* request header bytes (names + values);
                                    over -> RESOURCE_EXHAUSTED (default
                                    16384, min 256) */
    uint32_t idle_timeout_ms;    /* close a connection without a call in
                                    progress and without response data
                                    sent for this long (default 300000;
                                    0 = never) */
    uint32_t recv_timeout_ms;    /* receive deadline of a request (see
                                    top; default 30000, min 1) */
    uint32_t close_linger_ms;    /* at server close, how long a connection
                                    may take to write its last responses
                                    (default 1000) */
    int backlog;                 /* listen(2) backlog (default 511) */
    uint32_t max_connections;    /* open connections (default 1024; 0 = no
                                    limit) */
    uint32_t max_connections_per_ip; /* open connections of one client
                                    address (default 64; 0 = no limit) */
    uint32_t probe_reserve;          /* connections beyond both caps that serve
                                        only RT_GRPC_PROBE_METHOD, for health
                                        probes under any load (default 16;
                                        0 = none) */
    uint32_t probe_per_ip;           /* of them, at most this many of one
                                        client address (default 4; 0 = no
                                        limit) */
    struct rt_conn_budget *body_budget; /* the account request messages
                                    are charged to (shared with other
                                    servers; must outlive this one); NULL:
                                    none */
};

/* One request metadata entry, both strings NUL-terminated, name lower
 * case as HTTP/2 requires. */
struct rt_grpc_header {
    const char *name;
    const char *value;
};

struct rt_grpc_method {
    char *path;                  /* "/pkg.Service/Method" (owned copy) */
    enum rt_grpc_kind kind;
    rt_grpc_handler_fn handler;
    void *ud;
};

/* The server. The caller owns the storage; fields are private to
 * rt_grpc*.c except where a comment says a caller may read them. */
struct rt_grpc_server {
    uv_loop_t *loop;
    struct rt_grpc_config cfg;
    struct rt_conn_set set;      /* the listener and the connections with
                                    their limits; readable: set.port (bound
                                    after listen), set.n_live, set.n_open
                                    (closing ones included), set.stats
                                    (accepted, refused, evicted, idle
                                    timeouts) */
    uv_idle_t flush_idle;        /* flushes connections written to outside
                                    their read callback */
    uv_timer_t deadline_timer;   /* fires at the earliest call deadline */
    uv_timer_t health_timer;     /* polls the health of Watch streams */
    uint64_t deadline_armed;     /* loop ms it is armed for; 0 = idle */
    struct rt_grpc_method *methods; /* (n_methods) */
    size_t n_methods, cap_methods;
    struct rt_grpc_conn *flush;  /* singly linked list to flush */
    struct rt_grpc_call *zombies;/* doubly linked detached handles */
    void *health;                /* state of rt_grpc_health_register() */
    void *reflection;            /* state of rt_grpc_reflect_register() */
    rt_grpc_admit_fn admit;
    void *admit_ud;
    rt_grpc_event_fn on_event;
    void *event_ud;
    uint64_t next_conn_id;
    uint64_t n_calls;            /* readable: calls dispatched to handlers */
    uint64_t n_cancels;          /* readable: calls cancelled after
                                    dispatch (client, deadline, close) */
    int live_handles, closing, initialized;
    int handles_closing;         /* the server's own handles are closing */
    rt_grpc_closed_fn on_closed;
    void *on_closed_ud;
};

/* A call, also its response handle. The public fields are read-only and
 * valid while the handle is; the rest is private to rt_grpc*.c. */
struct rt_grpc_call {
    const char *path;            /* ":path", e.g. "/tangram.v1.Generation/
                                    Generate" */
    const uint8_t *msg;          /* (msg_len) request message bytes without
                                    the 5-byte prefix; NULL when empty.
                                    Valid during the handler call only */
    size_t msg_len;
    const struct rt_grpc_header *headers; /* (n_headers) in arrival order,
                                    pseudo headers included */
    size_t n_headers;
    uint64_t deadline_ms;        /* uv_now() value of the deadline;
                                    0 = none */
    uint64_t conn_id;            /* the connection's number, unique in the
                                    server's life (never 0): identifies the
                                    client's connection after it is gone */

    /* private */
    struct rt_grpc_conn *conn;   /* NULL once the stream is gone */
    struct rt_grpc_server *srv;
    struct rt_grpc_call *prev, *next; /* conn->calls or srv->zombies */
    struct rt_grpc_call *next_ready;  /* conn->ready queue */
    rt_grpc_handler_fn handler;  /* of the matched method; NULL before */
    void *handler_ud;
    int kind;                    /* enum rt_grpc_kind of the method */
    int32_t stream_id;
    uint64_t recv_deadline_ms;   /* uv_now() value by which the request (or
                                    the next message of a bidi call) must
                                    arrive; 0 = none */
    char *hbuf;                  /* header strings, NUL-separated */
    size_t hlen, hcap;
    size_t *hoffs;               /* (2 * cap_hdrs) name/value offsets */
    struct rt_grpc_header *hdrs; /* (n_hdrs), built when headers end */
    size_t n_hdrs, cap_hdrs;
    uint8_t prefix[5];           /* message prefix being assembled */
    size_t prefix_got;
    uint8_t *mbuf;               /* (mwant) payload being assembled */
    size_t mlen, mwant;
    size_t mcap;                 /* payload bytes allocated for the message
                                    being assembled (mbuf or in_cur) */
    size_t mcharged;             /* bytes of mbuf charged to the budget */
    int n_msgs;                  /* complete request messages */
    struct rt_grpc_inmsg *inq, *inq_tail; /* bidi: messages to deliver */
    size_t inq_bytes;
    struct rt_grpc_inmsg *in_cur;/* bidi: message being assembled */
    rt_grpc_message_fn on_message;
    void *message_ud;
    uint8_t *out;                /* framed output not yet taken by nghttp2 */
    size_t out_off, out_len, out_cap;
    char *fin_msg;               /* percent-encoded grpc-message or NULL */
    int fin_status;              /* grpc-status once finishing */
    int state;                   /* CS_* in rt_grpc_internal.h */
    int req_ended;               /* END_STREAM received */
    int headers_done;            /* the request header block is complete */
    int eos_pending;             /* bidi: end of input not yet delivered */
    int on_ready;                /* on conn->ready */
    int pinned;                  /* the server is delivering to it: not
                                    freed until unpinned */
    int hdr_overflow;            /* headers over max_header_bytes */
    int user_holds;              /* the handler owns the handle */
    int canceled;                /* handle cancelled (or zombie) */
    int in_cancel;
    int headers_sent;            /* response HEADERS submitted */
    int finishing;               /* final status set */
    int deferred;                /* data source returned DEFERRED */
    int n_sent;                  /* response messages queued */
    int is_zombie;               /* on srv->zombies */
    rt_grpc_cancel_fn on_cancel;
    void *cancel_ud;
};

/* Fills `cfg` with the defaults listed in struct rt_grpc_config. */
void rt_grpc_config_default(struct rt_grpc_config *cfg);

/* Initialises `srv` on `loop` with a copy of `cfg` (NULL = defaults).
 * Returns 0, TG_EINVAL (a limit out of range; detail in err) or
 * TG_ENOMEM. On failure `srv` is safe to pass to rt_grpc_server_free().
 * Loop thread. */
int rt_grpc_server_init(struct rt_grpc_server *srv, uv_loop_t *loop,
                        const struct rt_grpc_config *cfg, char *err,
                        size_t errlen);

/* Adds a method: calls whose :path equals `path` go to `handler` with
 * `ud`. The path is copied. Returns 0, TG_EINVAL (path not of the form
 * "/service/method", unknown kind, NULL handler), TG_EEXIST (path already
 * added) or TG_ENOMEM. Loop thread, before or after listening. */
int rt_grpc_method_add(struct rt_grpc_server *srv, const char *path,
                       enum rt_grpc_kind kind, rt_grpc_handler_fn handler,
                       void *ud, char *err, size_t errlen);

/* Binds `host` (IPv4 or IPv6 literal) and `port` (0 = any free port; read
 * the result in srv->set.port) and starts accepting (rt_conn_set_listen).
 * Returns 0, TG_EINVAL (bad address, already listening, closing) or TG_EIO
 * (bind/listen failed, detail in err). Loop thread. */
int rt_grpc_server_listen(struct rt_grpc_server *srv, const char *host,
                          int port, char *err, size_t errlen);

/* Serves `fd`, a connected stream socket, as if the listener had accepted
 * it: the same HTTP/2 session, limits and calls (rt_conn_set_adopt). For
 * a caller that accepts or pairs sockets itself (socket activation, a
 * socketpair in a test or fuzzing harness). Returns 0 (the server owns fd
 * and closes it with the connection), TG_EINVAL (not initialised, or
 * closing), TG_ENOMEM or TG_EIO (libuv refused the descriptor; fd stays
 * the caller's). Loop thread. */
int rt_grpc_server_adopt(struct rt_grpc_server *srv, int fd);

/* Stops accepting and closes every connection, cancelling calls in flight
 * (their cancel callbacks run before this returns, with
 * RT_GRPC_CANCELLED). `on_closed(ud)` (may be NULL) is called from the
 * loop once every handle is closed; run the loop until then before
 * rt_grpc_server_free(). Calling it twice is a no-op. Loop thread. */
void rt_grpc_server_close(struct rt_grpc_server *srv,
                          rt_grpc_closed_fn on_closed, void *ud);

/* Frees methods, health state and zombie handles. Safe on a zeroed or
 * failed-init server, and after rt_grpc_server_close() completed; the
 * server must not have open handles otherwise (a broken invariant). */
void rt_grpc_server_free(struct rt_grpc_server *srv);

/* Returns the value of the first request header named `name` (ASCII
 * case-insensitive; pseudo headers such as ":authority" included), or
 * NULL. Valid while the handle is. */
const char *rt_grpc_call_header(const struct rt_grpc_call *call,
                                const char *name);

/* The number of request metadata entries named `name` (ASCII
 * case-insensitive). */
size_t rt_grpc_call_header_count(const struct rt_grpc_call *call,
                                 const char *name);

/* Sets the admission callback (NULL: every call is admitted). Loop
 * thread, before listening. */
void rt_grpc_server_on_admit(struct rt_grpc_server *srv, rt_grpc_admit_fn fn,
                             void *ud);

/* Sets the event callback (NULL: none). Loop thread, before listening. */
void rt_grpc_server_on_event(struct rt_grpc_server *srv, rt_grpc_event_fn fn,
                             void *ud);

/* Bidirectional calls: registers the message callback of `call`
 * (replacing a previous one); set it in the handler. Messages that arrived
 * before are delivered right after the handler returns. Messages queue up
 * to twice max_message_bytes while no callback takes them; beyond that the
 * call ends with RESOURCE_EXHAUSTED. */
void rt_grpc_call_on_message(struct rt_grpc_call *call, rt_grpc_message_fn fn,
                             void *ud);

/* Registers the cancel callback of `call` (replacing a previous one). Set
 * it before returning from the handler when finishing later. */
void rt_grpc_call_on_cancel(struct rt_grpc_call *call, rt_grpc_cancel_fn fn,
                            void *ud);

/* Queues one response message: the 5-byte prefix plus `len` bytes of `msg`
 * (copied; may be NULL when len is 0). Response headers go out with the
 * first message. Returns 0, TG_EINVAL (already finishing, a second
 * message on a unary call, len over 2^32-1), TG_ECANCELED (the call is
 * gone) or TG_ENOMEM. The handle stays valid. */
int rt_grpc_call_send(struct rt_grpc_call *call, const void *msg,
                      size_t len);

/* Ends the call with `status` (0..16) and `message` (UTF-8, may be NULL
 * or empty; percent-encoded on the wire) after the queued messages. A
 * unary call finishing RT_GRPC_OK without a message is turned into
 * RT_GRPC_INTERNAL. The handle is freed before this returns, whatever the
 * result, except on TG_EINVAL (status out of range — then nothing
 * happened). Returns 0, TG_EINVAL, TG_ECANCELED (the call was gone) or
 * TG_ENOMEM (the stream is reset instead). */
int rt_grpc_call_finish(struct rt_grpc_call *call, int status,
                        const char *message);

/* rt_grpc_call_send() + rt_grpc_call_finish(RT_GRPC_OK) for a unary
 * answer. The handle is freed before this returns, whatever the result.
 * Returns 0, TG_ECANCELED, TG_EINVAL or TG_ENOMEM. */
int rt_grpc_call_reply(struct rt_grpc_call *call, const void *msg,
                       size_t len);

/* Response bytes queued on the call that the peer's flow-control window
 * did not take yet (0 when the call is gone); lets a streaming producer
 * apply backpressure. */
size_t rt_grpc_call_pending_bytes(const struct rt_grpc_call *call);

/* Parses a grpc-timeout value ("1*8DIGIT unit", unit one of H M S m u n)
 * into milliseconds, rounded up so that any positive timeout is at least
 * 1 ms. Returns 0 or TG_EFORMAT. Thread-safe. */
int rt_grpc_timeout_parse(const char *value, uint64_t *ms);

/* Percent-encodes `msg` for the grpc-message trailer: bytes outside
 * 0x20..0x7E and '%' become "%XX" (upper-case hex). Writes at most `cap`
 * bytes including the NUL into `out` (truncating on a whole escape) and
 * returns the length the full encoding needs (without the NUL), like
 * snprintf. Thread-safe. */
size_t rt_grpc_message_encode(const char *msg, char *out, size_t cap);

/* Returns the canonical name of a gRPC status ("OK", "NOT_FOUND" ...) or
 * "UNKNOWN" for a value outside 0..16. Thread-safe. */
const char *rt_grpc_status_name(int status);

/* ---- grpc.health.v1.Health ------------------------------------------- */

/* Serving states, numbered as HealthCheckResponse.ServingStatus. */
enum rt_grpc_health {
    RT_GRPC_HEALTH_SERVING = 1,
    RT_GRPC_HEALTH_NOT_SERVING = 2,
    RT_GRPC_HEALTH_UNKNOWN_SERVICE = 3, /* Check answers 5 NOT_FOUND,
                                           Watch sends SERVICE_UNKNOWN */
};

/* Reports the state of `service` ("" = the server as a whole); returns an
 * enum rt_grpc_health value. Loop thread. */
typedef int (*rt_grpc_health_fn)(const char *service, void *ud);

/* How often Watch streams re-read the state through the callback. */
#define RT_GRPC_HEALTH_POLL_MS 100

/* The one method a connection of the probe reserve is served (what
 * Kubernetes' grpc probe and grpc_health_probe call). */
#define RT_GRPC_PROBE_METHOD "/grpc.health.v1.Health/Check"

/* Registers "/grpc.health.v1.Health/Check" and "/grpc.health.v1.Health/
 * Watch" (doc/health-checking.md of the gRPC repository).
 * Check answers SERVING / NOT_SERVING from `fn`, 5 NOT_FOUND for a service
 * `fn` does not know; a malformed request gets INVALID_ARGUMENT.
 * Watch sends the current state at once (SERVICE_UNKNOWN for an unknown
 * service, without ending the stream), then every change, read from `fn`
 * every RT_GRPC_HEALTH_POLL_MS while Watch streams are open. At server
 * close each Watch stream gets NOT_SERVING (unless that was the last state
 * sent, or the service is unknown) and ends with 14 UNAVAILABLE "the
 * server is shutting down". Returns 0, TG_EINVAL (NULL fn), TG_EEXIST
 * (registered already) or TG_ENOMEM. Loop thread. */
int rt_grpc_health_register(struct rt_grpc_server *srv, rt_grpc_health_fn fn,
                            void *ud, char *err, size_t errlen);

#endif /* RT_GRPC_H */
