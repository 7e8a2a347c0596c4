/*
 * rt_conn.h — the connection layer under both of the router's servers
 * (rt_http: HTTP/1.1; rt_grpc: HTTP/2), written once: the listening
 * socket, the set of a server's open connections with the limits that
 * govern it, and the router-wide budget of buffered request bodies.
 *
 * Listener. A socket of our own (socket, bind, listen), polled by libuv
 * (uv_poll_t) and accepted with accept4(2), at most RT_CONN_ACCEPT_BURST
 * per wake-up so that a flood of connects cannot hold the loop. libuv's
 * own uv_listen is not used because of what it does when accept(2) runs
 * out of descriptors (EMFILE, ENFILE) or memory (ENOBUFS, ENOMEM): it
 * accepts and resets every pending connection with a spare descriptor and
 * offers no way to stop accepting, so one port flooded makes every other
 * client of the process, /health included, get a reset. Here accepting
 * pauses instead: the pending connections wait in the kernel's backlog,
 * one warning names the cause and the open connections, the oldest idle
 * connection of the set is closed to free a descriptor, and a timer
 * resumes accepting after RT_CONN_PAUSE_MIN_MS (doubling up to
 * RT_CONN_PAUSE_MAX_MS while it keeps failing). The first accept that
 * works again logs how long accepting was paused.
 *
 * Set. Every open connection of one server, each in one state the owner
 * keeps up to date (enum rt_conn_state). A connection that arrives while
 * its client address holds max_connections_per_ip, or while the set holds
 * max_connections, takes the place of another of that address (or of the
 * set): the oldest idle one (one whose client's bytes wait unread in the
 * kernel is not idle: it becomes a head arriving), else the slowest
 * incomplete head (fewest head bytes per millisecond since its first byte:
 * a trickling slowloris head loses to any client that sends its head in
 * one piece), else the slowest incomplete body (fewest body bytes per
 * millisecond since the end of its head: a trickling upload loses to any
 * client that uploads at the speed of its link); young connections
 * (RT_CONN_FRESH_MS) come after all of those, in the same order; when
 * every connection is busy the newcomer is refused (the owner answers it:
 * 503, GOAWAY) and closed. The per-address check runs
 * first, so an address at its own limit gives up one of its own before
 * anyone else's. An idle connection is closed after idle_timeout_ms (one
 * timer per set: the idle list is kept in the order connections went
 * idle).
 *
 * Probe reserve. Beyond both caps the set keeps probe_reserve places for
 * health probes, so that /health and the gRPC health check are answered
 * however the clients load the table (every connection busy streaming, or
 * an address at its own cap). A newcomer the caps would refuse takes one
 * of them instead (at most probe_per_ip of one address; when they are all
 * taken, the oldest idle one or the slowest head among them gives way,
 * bytes already waiting in the kernel counting as arrived, so a probe whose
 * request is on its way beats a silent connection): rt_conn.probe tells the
 * owner, which serves such a connection only a probe (its health routes)
 * and answers anything else as it would have answered the refusal,
 * counting it with rt_conn_probe_refused(). Probe places count towards
 * neither cap.
 *
 * Budget. One account of the request body bytes the router holds, shared
 * by both servers (struct rt_conn_budget). A server checks at the start of
 * a body that its announced length fits what is free now (else it refuses
 * the request before reading any of it: HTTP 503, gRPC UNAVAILABLE), then
 * takes what it allocates as the bytes arrive (rt_conn_body_grow: never
 * much more than what arrived), so a client that announces a large body
 * and sends it slowly holds only what it sent; a take that fails midway
 * refuses the request the same way. A body taken out of its server for
 * work elsewhere carries its charge with it (struct rt_conn_body) until
 * freed.
 *
 * The owner embeds struct rt_conn in its connection object and gives the
 * set five callbacks (struct rt_conn_ops): create a connection object,
 * start serving an admitted one, refuse one over a limit, evict one, and
 * close one when the set closes. The set lists every connection from its
 * creation until the owner releases it (rt_conn_release, from the last
 * close callback of the connection's handles): those are the server's
 * connections, closing ones included, and closing the set closes them all
 * and completes once every one was released. The owner closes its
 * connections itself; rt_conn_leave() takes a closing connection out of
 * the limits at once (the counts and lists of the set see it gone).
 *
 * Threading: everything runs on the thread of the set's uv loop. The set
 * logs (tg_log) the accept pauses and nothing else.
 */
#ifndef RT_CONN_H
#define RT_CONN_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

/* Connections accepted per wake-up of the listener, at most. */
#define RT_CONN_ACCEPT_BURST 64
/* Accepting pauses this long after the first failure for want of
 * descriptors or memory, doubling while it keeps failing, to at most
 * RT_CONN_PAUSE_MAX_MS. */
#define RT_CONN_PAUSE_MIN_MS 50
#define RT_CONN_PAUSE_MAX_MS 2000
/* Young connections give way last: a new one that has sent nothing yet
 * (its request may be on its way: a probe connects, then sends) and a head
 * or body that started less than this long ago (its rate says nothing
 * yet) are chosen only when no older connection can give way. */
#define RT_CONN_FRESH_MS 250
/* A body's buffer grows from this many bytes (rt_conn_body_grow). */
#define RT_CONN_BODY_STEP 4096u

struct rt_conn;
struct rt_conn_set;

/* What a connection is doing, as its owner says. */
enum rt_conn_state {
    RT_CONN_NEW = 0, /* accepted, not started yet (in no list) */
    RT_CONN_IDLE,    /* nothing in progress: connected and silent,
                        keep-alive between requests, an HTTP/2
                        connection without a call in a handler's hands,
                        a lingering close. First to give way; closed
                        after idle_timeout_ms. */
    RT_CONN_HEAD,    /* a request head is arriving (`bytes` so far):
                        gives way, slowest first, when nothing is idle */
    RT_CONN_BODY,    /* a request body is arriving (`bytes` so far):
                        gives way, slowest first, when nothing is idle
                        and no head is arriving */
    RT_CONN_BUSY,    /* a request past its body is served or answered
                        (or a call is in a handler's hands): never closed
                        by the set */
};

/* Why the set refuses a new connection (rt_conn_ops.refuse). */
enum rt_conn_refuse {
    RT_CONN_REFUSE_OPEN = 0,  /* libuv would not take the socket: no
                                 answer is possible */
    RT_CONN_REFUSE_MAX,       /* max_connections, none gave way */
    RT_CONN_REFUSE_PER_IP,    /* max_connections_per_ip, none gave way */
};

/* Why the set closes a connection (rt_conn_ops.evict). */
enum rt_conn_evict {
    RT_CONN_EVICT_IDLE = 0,     /* idle, made room for a new connection */
    RT_CONN_EVICT_HEAD,         /* slowest incomplete head, made room */
    RT_CONN_EVICT_IDLE_TIMEOUT, /* idle for idle_timeout_ms */
    RT_CONN_EVICT_NO_FD,        /* idle, closed to free a descriptor when
                                   accepting ran out of them */
    RT_CONN_EVICT_BODY,         /* slowest incomplete body, made room */
};

struct rt_conn_config {
    uint32_t max_connections;        /* open connections (0 = no limit) */
    uint32_t max_connections_per_ip; /* open connections of one client
                                        address (0 = no limit) */
    uint32_t idle_timeout_ms;        /* idle connections are closed after
                                        this (0 = never) */
    uint32_t probe_reserve;          /* places beyond the caps for health
                                        probes (0 = none) */
    uint32_t probe_per_ip;           /* of them, at most this many of one
                                        client address (0 = no limit) */
    int backlog;                     /* listen(2) backlog (> 0) */
};

/* Counters of a set since init, for metrics. Readable by callers. */
struct rt_conn_stats {
    uint64_t accepted;        /* admitted and started */
    uint64_t rejected_max;    /* refused: max_connections, none gave way */
    uint64_t rejected_per_ip; /* refused: max_connections_per_ip */
    uint64_t evicted_idle;    /* idle connections closed to make room */
    uint64_t evicted_head;    /* slow heads closed to make room */
    uint64_t evicted_body;    /* slow bodies closed to make room */
    uint64_t probe_admitted;  /* admitted into the probe reserve */
    uint64_t idle_timeouts;   /* closed by idle_timeout_ms */
    uint64_t accept_pauses;   /* accepting paused: no descriptor/memory */
};

/* The owner's side of a set. Each callback runs on the loop thread, from
 * the set's own callbacks (never inside an rt_conn_* call of the owner,
 * except rt_conn_set_adopt). */
struct rt_conn_ops {
    /* A new connection object: allocated, its `tcp` initialised on the
     * set's loop (uv_tcp_init) with tcp.data set as the owner wants, and
     * everything the owner closes with it ready. Returns NULL when out of
     * memory (the socket is then closed). */
    struct rt_conn *(*create)(struct rt_conn_set *set);
    /* c is admitted: serve it (start reading). */
    void (*start)(struct rt_conn *c);
    /* c is refused (why: enum rt_conn_refuse): answer it if the protocol
     * has an answer, without blocking (uv_try_write), and close it. c is
     * not in the set. */
    void (*refuse)(struct rt_conn *c, int why);
    /* Close c now (why: enum rt_conn_evict). c has left the set. */
    void (*evict)(struct rt_conn *c, int why);
    /* The set is closing (rt_conn_set_close): close c, at once or after a
     * graceful end, unless it is closing already. Called for every
     * connection not yet released, closing ones included; must not
     * release any connection before it returns. */
    void (*close)(struct rt_conn *c);
};

/* One connection, embedded in the owner's connection object. The owner
 * reads `tcp`, `peer`, `state` and `probe`, keeps `bytes` and sets `used`;
 * the rest is the set's. */
struct rt_conn {
    uv_tcp_t tcp;                  /* the socket (tcp.data: the owner's) */
    struct rt_conn_set *set;       /* NULL once it left the set */
    struct rt_conn_set *home;      /* the set it was made for; NULL once
                                      released */
    struct rt_conn *oprev, *onext; /* home->open */
    struct rt_conn *prev, *next;   /* set->live */
    struct rt_conn *sprev, *snext; /* the set's idle or head list */
    uint8_t peer[16];              /* client address, IPv4 mapped into
                                      IPv6 (zero when unknown) */
    int state;                     /* enum rt_conn_state */
    uint64_t since;                /* uv_now() when it entered `state` */
    uint64_t bytes;                /* RT_CONN_HEAD, RT_CONN_BODY: bytes of
                                      the head or body so far, kept by the
                                      owner */
    int used;                      /* it carried a request or a call (set
                                      by the owner, and on any state but
                                      RT_CONN_IDLE): no longer fresh */
    int probe;                     /* 0, or it holds a place of the probe
                                      reserve: the enum rt_conn_refuse the
                                      caps would have answered it with */
};

/* The connections of one server and its listener. The caller owns the
 * storage; fields are private to rt_conn.c except where a comment says a
 * caller may read them. */
struct rt_conn_set {
    uv_loop_t *loop;
    struct rt_conn_config cfg;
    const struct rt_conn_ops *ops;
    void *ud;                      /* the owner's (readable) */
    char name[16];                 /* "HTTP", "gRPC": in log lines */
    int fd;                        /* listening socket, -1 without */
    uv_poll_t poll;                /* readiness of fd */
    uv_timer_t idle_timer;         /* the idle deadline of idle_head */
    uv_timer_t resume_timer;       /* ends an accept pause */
    struct rt_conn *open;          /* readable: every connection created
                                      and not yet released (onext) */
    size_t n_open;                 /* readable: their count, closing ones
                                      included */
    struct rt_conn *live;          /* every connection in the set */
    struct rt_conn *idle_head, *idle_tail; /* RT_CONN_IDLE, by `since` */
    struct rt_conn *heads;         /* RT_CONN_HEAD */
    struct rt_conn *bodies;        /* RT_CONN_BODY */
    size_t n_live;                 /* readable: connections in the set,
                                      probe places included */
    size_t n_probe;                /* readable: of them, in the probe
                                      reserve */
    struct rt_conn_stats stats;    /* readable */
    uint32_t pause_ms;             /* the next pause */
    uint64_t paused_since;         /* uv_now() of the first failure of the
                                      current run of pauses; 0 = none */
    int port;                      /* readable: bound port after listen */
    int polling, paused, closing, handles_open, initialized;
    void (*on_closed)(struct rt_conn_set *set);
};

/* The router-wide account of buffered request body bytes (see "Budget"
 * above). Loop thread only. */
struct rt_conn_budget {
    size_t limit;                  /* bytes; 0 = no limit */
    size_t used;                   /* readable: bytes held now */
    size_t peak;                   /* readable: most bytes held at once */
    uint64_t refused;              /* readable: takes refused */
};

/* A request body taken out of its server (rt_http_req_take_body), with
 * its charge against the budget; free it with rt_conn_body_free() on the
 * loop thread. Any thread may read it meanwhile. */
struct rt_conn_body {
    char *data;                    /* (len) + NUL, malloc'ed; never NULL
                                      once taken */
    size_t len;
    size_t charged;                /* bytes taken from `budget` */
    struct rt_conn_budget *budget; /* NULL: none */
};

/* Fills `cfg` with max_connections 4096, max_connections_per_ip 256,
 * idle_timeout_ms 60000, no probe reserve, backlog 511. */
void rt_conn_config_default(struct rt_conn_config *cfg);

/* Initialises `set` on `loop` (its timers; the listener comes with
 * rt_conn_set_listen) with a copy of `cfg`, the owner's `ops` (must
 * outlive the set) and `ud`. `name` (copied, 15 bytes kept) names the set
 * in log lines. Cannot fail. Loop thread. */
void rt_conn_set_init(struct rt_conn_set *set, uv_loop_t *loop,
                      const struct rt_conn_config *cfg,
                      const struct rt_conn_ops *ops, void *ud,
                      const char *name);

/* Binds `host` (IPv4 or IPv6 literal) and `port` (0 = any free port; read
 * the result in set->port), listens and starts accepting. Returns 0,
 * TG_EINVAL (bad address or port, already listening, closing) or TG_EIO
 * (socket, bind or listen failed; detail in err). Loop thread. */
int rt_conn_set_listen(struct rt_conn_set *set, const char *host, int port,
                       char *err, size_t errlen);

/* Takes `fd`, a connected stream socket, as if the listener had accepted
 * it: the same limits, then the owner's start. It exists for the fuzzing
 * harnesses, which feed a server over a socketpair without a listener.
 * Returns 0 (the set owns fd: it is the connection's, or closed), or
 * TG_EINVAL (closing), TG_ENOMEM (create failed) or TG_EIO (libuv refused
 * the descriptor) with fd still the caller's. Loop thread. */
int rt_conn_set_adopt(struct rt_conn_set *set, int fd);

/* Stops accepting (the listening socket is closed), closes the set's
 * handles and asks the owner to close every connection (ops->close);
 * `on_closed(set)` (may be NULL) runs from the loop once the handles are
 * closed and every connection was released. Calling it twice is a no-op.
 * Loop thread. */
void rt_conn_set_close(struct rt_conn_set *set,
                       void (*on_closed)(struct rt_conn_set *set));

/* The owner is closing `c`: it leaves the set (lists and counts) now.
 * Safe to call again, and on a connection that never joined one. */
void rt_conn_leave(struct rt_conn *c);

/* The owner is done with `c` (its handles are closed; it frees it next):
 * c leaves the set if it had not, and its set's list of connections; a
 * closing set whose last connection this was completes its close
 * (on_closed runs before this returns, so call it after the last use of
 * the owner's server, and free c after). Safe to call again. Loop
 * thread. */
void rt_conn_release(struct rt_conn *c);

/* Sets c's state (enum rt_conn_state other than RT_CONN_NEW). Entering a
 * state starts its clock (`since`; `bytes` back to 0); setting the state it
 * has changes nothing. No-op once c left its set. */
void rt_conn_state_set(struct rt_conn *c, int state);

/* The owner refused the request of a connection in the probe reserve (it
 * was not a probe): counted as the refusal the caps would have made
 * (rejected_max or rejected_per_ip). No-op on other connections and
 * twice. */
void rt_conn_probe_refused(struct rt_conn *c);

/* An idle connection did something that restarts its idle clock (a
 * response frame still going out). No-op in other states. */
void rt_conn_touch(struct rt_conn *c);

/* Takes n bytes from budget `b` (NULL: no budget, always succeeds).
 * Returns 0, or TG_EAGAIN when it would go over the limit (counted in
 * b->refused; nothing taken). Loop thread. */
int rt_conn_budget_take(struct rt_conn_budget *b, size_t n);

/* Gives n bytes back to `b` (NULL: no-op). Loop thread. */
void rt_conn_budget_give(struct rt_conn_budget *b, size_t n);

/* True when n more bytes fit in `b` now (NULL: always); a body of n
 * announced bytes is admitted by it before it is read, and taken as it
 * arrives. When false the refusal is counted in b->refused. Loop
 * thread. */
int rt_conn_budget_fits(struct rt_conn_budget *b, size_t n);

/* Buffer bytes to hold before a body's next `need` bytes (need > cap):
 * at least need, the whole body when it is small (total, its announced
 * length, at most RT_CONN_BODY_STEP; 0 = unknown), else doubling from
 * RT_CONN_BODY_STEP, never past total (nor past `max` when total is
 * unknown). So what a body is charged is at most twice what arrived, or
 * RT_CONN_BODY_STEP. */
size_t rt_conn_body_grow(size_t cap, size_t need, size_t total, size_t max);

/* Frees b->data and gives its charge back; *b is zeroed. Safe on a zeroed
 * body and twice. Loop thread. */
void rt_conn_body_free(struct rt_conn_body *b);

#endif /* RT_CONN_H */
