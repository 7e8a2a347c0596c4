/*
 * rt_conn.c — the connection layer of the router's servers (see
 * rt_conn.h): the listener with its accept pauses, the set of open
 * connections with its limits and eviction, the idle deadline, and the
 * request body budget.
 *
 * Lists of a set: `open` holds every connection the owner created and has
 * not released (closing ones included: the set's close completes when it
 * is empty); `live` holds every connection in the set; an idle
 * connection is also on the idle list, appended when it goes idle, so the
 * list is ordered by `since` and its head is both the one to evict first
 * and the next idle deadline (one timer for the set); a connection whose
 * head is arriving is on the heads list, one whose body is arriving on the
 * bodies list, each searched for the slowest when one must give way (at
 * most max_connections entries, only at the cap). Connections in the
 * probe reserve are on the same lists, flagged (rt_conn.probe): the caps
 * and their evictions skip them, the reserve's own considers only them.
 */
#include "router/net/rt_conn.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"

void rt_conn_config_default(struct rt_conn_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_connections = 4096;
    cfg->max_connections_per_ip = 256;
    cfg->idle_timeout_ms = 60000;
    cfg->backlog = 511;
}

/* ---- lists ------------------------------------------------------------- */

/* The list of the connections in `state` (heads or bodies), or NULL. */
static struct rt_conn **progress_list(struct rt_conn_set *set, int state)
{
    if (state == RT_CONN_HEAD)
        return &set->heads;
    if (state == RT_CONN_BODY)
        return &set->bodies;
    return NULL;
}

static void state_unlink(struct rt_conn *c)
{
    struct rt_conn_set *set = c->set;
    struct rt_conn **list = progress_list(set, c->state);
    if (c->state == RT_CONN_IDLE) {
        if (c->sprev)
            c->sprev->snext = c->snext;
        else
            set->idle_head = c->snext;
        if (c->snext)
            c->snext->sprev = c->sprev;
        else
            set->idle_tail = c->sprev;
    } else if (list) {
        if (c->sprev)
            c->sprev->snext = c->snext;
        else
            *list = c->snext;
        if (c->snext)
            c->snext->sprev = c->sprev;
    }
    c->sprev = c->snext = NULL;
}

static void on_idle_timer(uv_timer_t *t);

/* Arms the idle timer for the deadline of the oldest idle connection,
 * unless it is armed already (it then fires no later than that). */
static void idle_arm(struct rt_conn_set *set)
{
    uint32_t ms = set->cfg.idle_timeout_ms;
    if (ms == 0 || set->closing || !set->idle_head ||
        uv_is_active((uv_handle_t *)&set->idle_timer))
        return;
    uint64_t now = uv_now(set->loop);
    uint64_t due = set->idle_head->since + ms;
    uv_timer_start(&set->idle_timer, on_idle_timer, due > now ? due - now : 0,
                   0);
}

static void on_idle_timer(uv_timer_t *t)
{
    struct rt_conn_set *set = t->data;
    uint64_t now = uv_now(set->loop);
    struct rt_conn *c;
    while ((c = set->idle_head) != NULL &&
           now - c->since >= set->cfg.idle_timeout_ms) {
        rt_conn_leave(c);
        set->stats.idle_timeouts++;
        set->ops->evict(c, RT_CONN_EVICT_IDLE_TIMEOUT);
    }
    idle_arm(set);
}

void rt_conn_state_set(struct rt_conn *c, int state)
{
    struct rt_conn_set *set = c->set;
    if (!set || c->state == state || state == RT_CONN_NEW)
        return;
    state_unlink(c);
    c->state = state;
    c->since = uv_now(set->loop);
    c->bytes = 0;
    if (state != RT_CONN_IDLE)
        c->used = 1;
    struct rt_conn **list = progress_list(set, state);
    if (state == RT_CONN_IDLE) {
        c->sprev = set->idle_tail;
        if (set->idle_tail)
            set->idle_tail->snext = c;
        else
            set->idle_head = c;
        set->idle_tail = c;
        idle_arm(set);
    } else if (list) {
        c->snext = *list;
        if (*list)
            (*list)->sprev = c;
        *list = c;
    }
}

void rt_conn_probe_refused(struct rt_conn *c)
{
    if (c->probe == RT_CONN_REFUSE_MAX && c->home)
        c->home->stats.rejected_max++;
    else if (c->probe == RT_CONN_REFUSE_PER_IP && c->home)
        c->home->stats.rejected_per_ip++;
    c->probe = -c->probe; /* counted; still in the reserve */
}

void rt_conn_touch(struct rt_conn *c)
{
    if (!c->set || c->state != RT_CONN_IDLE)
        return;
    /* Back to the tail: the list stays ordered by `since`. */
    state_unlink(c);
    c->state = RT_CONN_NEW;
    rt_conn_state_set(c, RT_CONN_IDLE);
}

void rt_conn_leave(struct rt_conn *c)
{
    struct rt_conn_set *set = c->set;
    if (!set)
        return;
    state_unlink(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        set->live = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    set->n_live--;
    if (c->probe)
        set->n_probe--;
    c->set = NULL;
}

/* ---- limits ------------------------------------------------------------ */

static int same_peer(const struct rt_conn *a, const struct rt_conn *b)
{
    return memcmp(a->peer, b->peer, sizeof(a->peer)) == 0;
}

/* Whether k is one of the connections a limit looks at: of the main
 * table or of the probe reserve (`probe`), of c's address when `mine`. */
static int in_scope(const struct rt_conn *k, const struct rt_conn *c, int mine,
                    int probe)
{
    return (k->probe != 0) == (probe != 0) && (!mine || same_peer(k, c));
}

/* Connections of the main table (or of the reserve, `probe`) from c's
 * client address, c included when it is counted there. */
static size_t peer_count(const struct rt_conn_set *set, const struct rt_conn *c,
                         int probe)
{
    size_t n = 0;
    for (const struct rt_conn *k = set->live; k; k = k->next)
        n += in_scope(k, c, 1, probe);
    return n;
}

/* Bytes waiting in the kernel for k (0 when it cannot say). */
static uint64_t kernel_pending(const struct rt_conn *k)
{
    uv_os_fd_t fd;
    int n = 0;
    if (uv_fileno((const uv_handle_t *)&k->tcp, &fd) != 0 ||
        ioctl(fd, FIONREAD, &n) != 0 || n < 0)
        return 0;
    return (uint64_t)n;
}

/* True while c is a new connection whose first request may still be on
 * its way (RT_CONN_FRESH_MS). */
static int fresh(const struct rt_conn_set *set, const struct rt_conn *c)
{
    return !c->used && uv_now(set->loop) - c->since < RT_CONN_FRESH_MS;
}

/* A head or body that started less than RT_CONN_FRESH_MS ago: its rate
 * says nothing yet (a whole head that arrived with its connection has
 * fewer bytes per millisecond than a longer one of the same age). */
static int young(const struct rt_conn_set *set, const struct rt_conn *c)
{
    return uv_now(set->loop) - c->since < RT_CONN_FRESH_MS;
}

/* The slowest connection of `list` (heads or bodies) in scope, of those
 * that are not young, or (`yng`) of those that are: fewest bytes per
 * millisecond of its age, the older one on a tie; in the probe reserve,
 * bytes waiting in the kernel count. Compared as
 * bytes_a * age_b < bytes_b * age_a, exact in 64 bits for any head or body
 * a server accepts. Connections that entered the state in the same loop
 * iteration share `since` (uv_now() is cached per iteration): the lists
 * are newest first, so the last of them in it, the first to have started,
 * is the older. */
static struct rt_conn *slowest(const struct rt_conn_set *set,
                               struct rt_conn *list, const struct rt_conn *c,
                               int mine, int probe, int yng)
{
    uint64_t now = uv_now(set->loop);
    struct rt_conn *best = NULL;
    uint64_t best_bytes = 0, best_age = 1;
    for (struct rt_conn *k = list; k; k = k->snext) {
        if (!in_scope(k, c, mine, probe) || young(set, k) != yng)
            continue;
        uint64_t age = now > k->since ? now - k->since : 1;
        uint64_t bytes = k->bytes + (probe ? kernel_pending(k) : 0);
        if (!best || bytes * best_age < best_bytes * age ||
            (bytes * best_age == best_bytes * age && k->since <= best->since)) {
            best = k;
            best_bytes = bytes;
            best_age = age;
        }
    }
    return best;
}

/* The oldest idle connection in scope, or NULL: of those that are not
 * fresh, or (`young`) of those that are. One whose client has sent bytes
 * the owner has not read yet (a request that arrived just after its
 * connection was accepted, in the same loop iteration) is not idle: it
 * becomes a head with those bytes, which makes it the fastest head, and
 * the search goes on. */
static struct rt_conn *oldest_idle(struct rt_conn_set *set,
                                   const struct rt_conn *c, int mine, int probe,
                                   int young)
{
    struct rt_conn *v = set->idle_head;
    while (v) {
        struct rt_conn *next = v->snext;
        if (in_scope(v, c, mine, probe) && fresh(set, v) == young) {
            uint64_t pending = kernel_pending(v);
            if (pending == 0)
                return v;
            rt_conn_state_set(v, RT_CONN_HEAD);
            v->bytes = pending;
        }
        v = next;
    }
    return NULL;
}

/* Closes a connection to make room for c: the oldest idle one, else the
 * slowest head, else the slowest body; only then the young ones: the
 * oldest fresh idle one, else the slowest young head, else the slowest
 * young body (of c's address when `mine`; of the probe reserve when
 * `probe`, which has no bodies of its own to lose). Returns 1, or 0 when
 * every candidate is busy. */
static int give_way(struct rt_conn_set *set, const struct rt_conn *c, int mine,
                    int probe)
{
    struct rt_conn *v = NULL;
    int why = RT_CONN_EVICT_IDLE;
    for (int yng = 0; yng <= 1 && !v; yng++) {
        v = oldest_idle(set, c, mine, probe, yng);
        why = RT_CONN_EVICT_IDLE;
        if (!v) {
            v = slowest(set, set->heads, c, mine, probe, yng);
            why = RT_CONN_EVICT_HEAD;
        }
        if (!v && !probe) {
            v = slowest(set, set->bodies, c, mine, probe, yng);
            why = RT_CONN_EVICT_BODY;
        }
    }
    if (!v)
        return 0;
    rt_conn_leave(v);
    if (why == RT_CONN_EVICT_IDLE)
        set->stats.evicted_idle++;
    else if (why == RT_CONN_EVICT_HEAD)
        set->stats.evicted_head++;
    else
        set->stats.evicted_body++;
    set->ops->evict(v, why);
    return 1;
}

/* c would be refused (why: RT_CONN_REFUSE_MAX or _PER_IP): it takes a
 * place of the probe reserve when one is free or can be freed. Returns 1
 * when it did. */
static int probe_admit(struct rt_conn_set *set, struct rt_conn *c, int why)
{
    const struct rt_conn_config *cfg = &set->cfg;
    if (cfg->probe_reserve == 0)
        return 0;
    c->probe = why;
    set->n_probe++;
    int fits = 1;
    /* Its own address's places first, then the reserve's. */
    if (cfg->probe_per_ip && peer_count(set, c, 1) > cfg->probe_per_ip)
        fits = give_way(set, c, 1, 1);
    if (fits && set->n_probe > cfg->probe_reserve)
        fits = give_way(set, c, 0, 1);
    if (!fits) {
        set->n_probe--;
        c->probe = 0;
        return 0;
    }
    set->stats.probe_admitted++;
    return 1;
}

static void peer_of(const struct sockaddr_storage *ss, uint8_t peer[16])
{
    memset(peer, 0, 16);
    if (ss->ss_family == AF_INET6) {
        memcpy(peer, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
    } else if (ss->ss_family == AF_INET) {
        peer[10] = peer[11] = 0xff;
        memcpy(peer + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    }
}

/* A connected socket joins the set: within the limits it is started,
 * else refused. `ss` is its peer (NULL: ask the socket). Returns 0 (fd is
 * the set's), TG_ENOMEM or TG_EIO (fd is still the caller's). */
static int admit(struct rt_conn_set *set, int fd,
                 const struct sockaddr_storage *ss)
{
    struct rt_conn *c = set->ops->create(set);
    if (!c)
        return TG_ENOMEM;
    c->home = set;
    c->oprev = NULL;
    c->onext = set->open;
    if (set->open)
        set->open->oprev = c;
    set->open = c;
    set->n_open++;
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        set->ops->refuse(c, RT_CONN_REFUSE_OPEN);
        return TG_EIO;
    }
    struct sockaddr_storage got;
    if (!ss) {
        int len = sizeof(got);
        memset(&got, 0, sizeof(got));
        uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&got, &len);
        ss = &got;
    }
    peer_of(ss, c->peer);
    c->set = set;
    c->probe = 0;
    c->used = 0;
    c->state = RT_CONN_NEW;
    c->since = uv_now(set->loop);
    c->prev = NULL;
    c->next = set->live;
    if (set->live)
        set->live->prev = c;
    set->live = c;
    set->n_live++;
    const struct rt_conn_config *cfg = &set->cfg;
    /* The address's own limit first: it gives up one of its own before
     * anyone else's goes for the total. */
    int why = 0;
    if (cfg->max_connections_per_ip &&
        peer_count(set, c, 0) > cfg->max_connections_per_ip &&
        !give_way(set, c, 1, 0))
        why = RT_CONN_REFUSE_PER_IP;
    else if (cfg->max_connections &&
             set->n_live - set->n_probe > cfg->max_connections &&
             !give_way(set, c, 0, 0))
        why = RT_CONN_REFUSE_MAX;
    if (why && !probe_admit(set, c, why)) {
        if (why == RT_CONN_REFUSE_PER_IP)
            set->stats.rejected_per_ip++;
        else
            set->stats.rejected_max++;
        rt_conn_leave(c);
        set->ops->refuse(c, why);
        return 0;
    }
    set->stats.accepted++;
    set->ops->start(c);
    return 0;
}

int rt_conn_set_adopt(struct rt_conn_set *set, int fd)
{
    if (!set->initialized || set->closing)
        return TG_EINVAL;
    return admit(set, fd, NULL);
}

/* ---- the listener ------------------------------------------------------ */

static void on_poll(uv_poll_t *h, int status, int events);

static void on_resume(uv_timer_t *t)
{
    struct rt_conn_set *set = t->data;
    set->paused = 0;
    if (!set->closing)
        uv_poll_start(&set->poll, UV_READABLE, on_poll);
}

/* libuv's text for errno value e ("address already in use"), the words
 * the servers' messages used when libuv did the socket calls. */
static const char *sys_error(int e)
{
    return uv_strerror(uv_translate_sys_error(e));
}

/* accept(2) failed for want of descriptors or memory, or unexpectedly:
 * stop accepting for a while (see rt_conn.h). */
static void accept_pause(struct rt_conn_set *set, int err)
{
    uv_poll_stop(&set->poll);
    set->paused = 1;
    set->stats.accept_pauses++;
    if (set->paused_since == 0) {
        set->paused_since = uv_now(set->loop) + 1;
        set->pause_ms = RT_CONN_PAUSE_MIN_MS;
        struct rlimit rl;
        unsigned long long lim = 0;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
            lim = (unsigned long long)rl.rlim_cur;
        log_warn("%s: cannot accept connections: %s (%zu open here, "
                 "open-file limit %llu); accepting paused, pending clients "
                 "wait in the backlog%s",
                 set->name, sys_error(err), set->n_live, lim,
                 err == EMFILE || err == ENFILE
                     ? "; raise LimitNOFILE / ulimit -n or lower the "
                       "connection limits"
                     : "");
    } else if (set->pause_ms < RT_CONN_PAUSE_MAX_MS) {
        set->pause_ms *= 2;
        if (set->pause_ms > RT_CONN_PAUSE_MAX_MS)
            set->pause_ms = RT_CONN_PAUSE_MAX_MS;
    }
    /* An idle connection holds a descriptor and nothing else. */
    if ((err == EMFILE || err == ENFILE) && set->idle_head) {
        struct rt_conn *c = set->idle_head;
        rt_conn_leave(c);
        set->stats.evicted_idle++;
        set->ops->evict(c, RT_CONN_EVICT_NO_FD);
    }
    uv_timer_start(&set->resume_timer, on_resume, set->pause_ms, 0);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct rt_conn_set *set = h->data;
    (void)status;
    (void)events;
    for (int i = 0; i < RT_CONN_ACCEPT_BURST && !set->closing &&
                    !set->paused;
         i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        memset(&ss, 0, sizeof(ss));
        int fd = accept4(set->fd, (struct sockaddr *)&ss, &sl,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return;
            /* The connection failed before we took it; Linux reports
             * pending network errors of the new socket here (accept(2),
             * NOTES): the next one may be fine. */
            if (e == EINTR || e == ECONNABORTED || e == EPROTO ||
                e == ENETDOWN || e == ENOPROTOOPT || e == EHOSTDOWN ||
                e == ENONET || e == EHOSTUNREACH || e == EOPNOTSUPP ||
                e == ENETUNREACH || e == EPERM)
                continue;
            accept_pause(set, e);
            return;
        }
        if (set->paused_since) {
            log_info("%s: accepting connections again after %llu ms",
                     set->name,
                     (unsigned long long)(uv_now(set->loop) + 1 -
                                          set->paused_since));
            set->paused_since = 0;
        }
        if (admit(set, fd, &ss) != 0)
            close(fd);
    }
}

void rt_conn_set_init(struct rt_conn_set *set, uv_loop_t *loop,
                      const struct rt_conn_config *cfg,
                      const struct rt_conn_ops *ops, void *ud,
                      const char *name)
{
    memset(set, 0, sizeof(*set));
    set->loop = loop;
    if (cfg)
        set->cfg = *cfg;
    else
        rt_conn_config_default(&set->cfg);
    if (set->cfg.backlog <= 0)
        set->cfg.backlog = 511;
    set->ops = ops;
    set->ud = ud;
    snprintf(set->name, sizeof(set->name), "%s", name ? name : "");
    set->fd = -1;
    /* uv_timer_init only links the handle into the loop: it cannot fail. */
    uv_timer_init(loop, &set->idle_timer);
    uv_timer_init(loop, &set->resume_timer);
    set->idle_timer.data = set;
    set->resume_timer.data = set;
    set->initialized = 1;
}

int rt_conn_set_listen(struct rt_conn_set *set, const char *host, int port,
                       char *err, size_t errlen)
{
    if (!set->initialized || set->closing || set->fd >= 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: not ready to listen", set->name);
    if (!host || port < 0 || port > 65535)
        return tg_err_set(err, errlen, TG_EINVAL, "%s: bad port %d",
                          set->name, port);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t sl;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) == 0) {
        sl = sizeof(struct sockaddr_in);
    } else if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) == 0) {
        sl = sizeof(struct sockaddr_in6);
    } else {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: '%s' is not an IP address", set->name, host);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    0);
    if (fd < 0)
        return tg_err_set(err, errlen, TG_EIO, "%s: socket: %s", set->name,
                          sys_error(errno));
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 ||
        listen(fd, set->cfg.backlog) != 0) {
        int e = errno;
        close(fd);
        return tg_err_set(err, errlen, TG_EIO, "%s: listen on %s:%d: %s",
                          set->name, host, port, sys_error(e));
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof(got);
    if (getsockname(fd, (struct sockaddr *)&got, &gl) != 0) {
        int e = errno;
        close(fd);
        return tg_err_set(err, errlen, TG_EIO, "%s: getsockname: %s",
                          set->name, sys_error(e));
    }
    set->port = got.ss_family == AF_INET6
                    ? ntohs(((struct sockaddr_in6 *)&got)->sin6_port)
                    : ntohs(((struct sockaddr_in *)&got)->sin_port);
    int rc = uv_poll_init_socket(set->loop, &set->poll, fd);
    if (rc != 0) {
        close(fd);
        return tg_err_set(err, errlen, TG_EIO, "%s: uv_poll_init: %s",
                          set->name, uv_strerror(rc));
    }
    set->poll.data = set;
    set->fd = fd;
    set->polling = 1;
    uv_poll_start(&set->poll, UV_READABLE, on_poll);
    return 0;
}

/* The close of a set completes once its handles are closed and the owner
 * released every connection. */
static void close_check(struct rt_conn_set *set)
{
    if (!set->closing || set->handles_open > 0 || set->n_open > 0 ||
        !set->on_closed)
        return;
    void (*cb)(struct rt_conn_set *) = set->on_closed;
    set->on_closed = NULL;
    cb(set);
}

static void on_set_handle_closed(uv_handle_t *h)
{
    struct rt_conn_set *set = h->data;
    if (--set->handles_open > 0)
        return;
    if (set->fd >= 0)
        close(set->fd);
    set->fd = -1;
    close_check(set);
}

void rt_conn_set_close(struct rt_conn_set *set,
                       void (*on_closed)(struct rt_conn_set *set))
{
    if (!set->initialized || set->closing)
        return;
    set->closing = 1;
    set->on_closed = on_closed;
    set->handles_open = 2 + (set->polling ? 1 : 0);
    uv_close((uv_handle_t *)&set->idle_timer, on_set_handle_closed);
    uv_close((uv_handle_t *)&set->resume_timer, on_set_handle_closed);
    if (set->polling)
        uv_close((uv_handle_t *)&set->poll, on_set_handle_closed);
    /* The owner releases a connection only from a close callback, never
     * inside ops->close: the list holds still under this walk. */
    for (struct rt_conn *c = set->open; c; c = c->onext)
        set->ops->close(c);
}

void rt_conn_release(struct rt_conn *c)
{
    struct rt_conn_set *set = c->home;
    if (!set)
        return;
    rt_conn_leave(c);
    if (c->oprev)
        c->oprev->onext = c->onext;
    else
        set->open = c->onext;
    if (c->onext)
        c->onext->oprev = c->oprev;
    c->oprev = c->onext = NULL;
    c->home = NULL;
    set->n_open--;
    close_check(set);
}

/* ---- the body budget --------------------------------------------------- */

int rt_conn_budget_take(struct rt_conn_budget *b, size_t n)
{
    if (!b)
        return 0;
    if (b->limit && n > b->limit - b->used) {
        b->refused++;
        return TG_EAGAIN;
    }
    b->used += n;
    if (b->used > b->peak)
        b->peak = b->used;
    return 0;
}

void rt_conn_budget_give(struct rt_conn_budget *b, size_t n)
{
    if (!b)
        return;
    TG_ASSERT(n <= b->used);
    b->used -= n;
}

int rt_conn_budget_fits(struct rt_conn_budget *b, size_t n)
{
    if (!b || !b->limit || n <= b->limit - b->used)
        return 1;
    b->refused++;
    return 0;
}

size_t rt_conn_body_grow(size_t cap, size_t need, size_t total, size_t max)
{
    size_t end = total ? total : max;
    size_t want = cap < RT_CONN_BODY_STEP / 2 ? RT_CONN_BODY_STEP : 2 * cap;
    if (end && want > end)
        want = end;
    return want > need ? want : need;
}

void rt_conn_body_free(struct rt_conn_body *b)
{
    free(b->data);
    rt_conn_budget_give(b->budget, b->charged);
    memset(b, 0, sizeof(*b));
}
