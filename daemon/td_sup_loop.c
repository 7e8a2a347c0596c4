/* td_sup_loop.c — the libuv loop of the tangramd supervisor: spawning,
 * restarts, signals, drain and systemd notification (td_supervisor.h). */
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "daemon/td_supervisor.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <uv.h>

enum phase {
    PH_RUNNING = 0,   /* serving, or starting up */
    PH_RESTART_ALL,   /* the router died: workers stopping, then all anew */
    PH_DRAIN_ROUTER,  /* SIGTERM sent to the router; waiting for it */
    PH_DRAIN_WORKERS, /* SIGTERM sent to the workers; SIGKILL after grace */
    PH_KILLED,        /* everything got SIGKILL; waiting to reap */
    PH_DONE,          /* handles closing; the loop ends */
};

struct sup;

/* One spawned process; heap-allocated per spawn because a uv_process_t
 * must be closed (asynchronously) before its memory is reused. */
struct run {
    uv_process_t proc;
    struct child *c;
};

/* The stderr pipe of one child run: what the child writes is copied to
 * tangramd's stderr as it arrives (so the log keeps every line), and the
 * last complete line is kept in the child for the start-up failure
 * message. Freed by its close callback, which comes after EOF (the child
 * and everything it started have closed the pipe). */
struct err_pipe {
    uv_pipe_t pipe;
    struct child *c;
    char line[TD_CHILD_LINE_MAX];
    size_t len;
};

/* The notify pipe of one router run; freed by its close callback. */
struct notify_conn {
    uv_pipe_t pipe;
    struct sup *s;
    char line[TD_NOTIFY_LINE_MAX];
    size_t len;
    bool overflow; /* discarding the rest of an over-long line */
};

struct child {
    struct sup *s;
    int rank;              /* -1 = the router */
    struct run *run;       /* NULL when not running */
    uint64_t started_ms;   /* uv_now at spawn */
    struct td_backoff backoff;
    uv_timer_t restart;    /* fires when the backoff has passed */
    bool restart_init;     /* restart timer initialized (needs a close) */
    char **argv;
    size_t argc;
    char last_line[TD_CHILD_LINE_MAX]; /* last stderr line, NUL-terminated */
};

struct sup {
    uv_loop_t loop;
    const struct tg_serve_opts *o;
    const struct td_sup_paths *paths;
    enum phase phase;
    int result;                /* td_sup_run's return value */
    struct child router;
    struct child *workers;     /* (tp) */
    size_t nworkers;           /* initialized entries of workers */
    char **router_env, **worker_env;
    size_t router_nenv, worker_nenv;
    struct notify_conn *notify;
    bool router_due;           /* RESTART_ALL: router backoff has passed */
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t phase_timer;    /* drain / kill deadlines */
    uv_timer_t watchdog;       /* systemd watchdog pings */
    uint64_t wd_ms;            /* WATCHDOG_USEC in ms; 0 = disabled */
    uint64_t last_router_wd;   /* uv_now of the last router WATCHDOG */
    uv_timer_t stall_timer;    /* --router-stall-ms checks (on_stall_tick) */
    bool router_wd_seen;       /* this router run has sent a WATCHDOG */
    bool router_stall_killed;  /* this router run was killed for a stall */
    uint64_t router_stalls;    /* routers killed for a stall since start */
    bool group_stopping;       /* tp > 1: a worker exited, the others are
                                  being stopped for a group restart */
    bool group_due;            /* group_stopping: its backoff has passed */
    struct td_backoff group_backoff;
    uv_timer_t group_timer;    /* the group restart's backoff */
    uv_timer_t group_kill;     /* SIGKILL deadline of the stopping group */
    int stage;                 /* set-up reached: 0 nothing, 1 loop and
                                  restart timers, 2 every handle */
    bool ever_ready;           /* the router said READY at least once */
    struct child *failed;      /* the child whose exit before the first
                                  READY failed the start-up, or NULL */
    char failed_what[64];      /* how it ended ("exited with status 1") */
};

static void start_all(struct sup *s);
static void spawn_worker_or_retry(struct child *c);

static const char *child_name(const struct child *c, char *buf, size_t len)
{
    if (c->rank < 0)
        snprintf(buf, len, "router");
    else
        snprintf(buf, len, "worker rank %d", c->rank);
    return buf;
}

static bool workers_alive(const struct sup *s)
{
    for (size_t i = 0; i < s->nworkers; i++)
        if (s->workers[i].run != NULL)
            return true;
    return false;
}

static void signal_child(struct child *c, int sig)
{
    if (c->run != NULL)
        uv_process_kill(&c->run->proc, sig); /* ESRCH: exiting already */
}

static void signal_workers(struct sup *s, int sig)
{
    for (size_t i = 0; i < s->nworkers; i++)
        signal_child(&s->workers[i], sig);
}

static void stop_worker_restarts(struct sup *s)
{
    for (size_t i = 0; i < s->nworkers; i++)
        if (s->workers[i].restart_init)
            uv_timer_stop(&s->workers[i].restart);
}

static void stop_restarts(struct sup *s)
{
    if (s->router.restart_init)
        uv_timer_stop(&s->router.restart);
    stop_worker_restarts(s);
    s->router_due = false;
    if (s->stage >= 2) {
        uv_timer_stop(&s->group_timer);
        uv_timer_stop(&s->group_kill);
    }
    s->group_stopping = false;
    s->group_due = false;
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void close_notify(struct sup *s);

static void close_timers(struct sup *s)
{
    if (s->router.restart_init)
        close_handle((uv_handle_t *)&s->router.restart);
    for (size_t i = 0; i < s->nworkers; i++)
        if (s->workers[i].restart_init)
            close_handle((uv_handle_t *)&s->workers[i].restart);
}

/* Ends the loop once nothing runs: closes every loop-level handle. */
static void maybe_finish(struct sup *s)
{
    if ((s->phase != PH_DRAIN_WORKERS && s->phase != PH_KILLED) ||
        s->router.run != NULL || workers_alive(s))
        return;
    s->phase = PH_DONE;
    close_handle((uv_handle_t *)&s->sig_term);
    close_handle((uv_handle_t *)&s->sig_int);
    close_handle((uv_handle_t *)&s->sig_hup);
    close_handle((uv_handle_t *)&s->phase_timer);
    close_handle((uv_handle_t *)&s->watchdog);
    close_handle((uv_handle_t *)&s->stall_timer);
    close_handle((uv_handle_t *)&s->group_timer);
    close_handle((uv_handle_t *)&s->group_kill);
    close_timers(s);
    close_notify(s);
}

static void kill_all(struct sup *s)
{
    stop_restarts(s);
    uv_timer_stop(&s->phase_timer);
    s->phase = PH_KILLED;
    signal_child(&s->router, SIGKILL);
    signal_workers(s, SIGKILL);
    maybe_finish(s);
}

static void on_kill_deadline(uv_timer_t *t)
{
    struct sup *s = t->data;
    log_warn("children still running %u ms after SIGTERM: sending SIGKILL",
             TD_KILL_GRACE_MS);
    if (s->phase == PH_RESTART_ALL) {
        signal_workers(s, SIGKILL);
        return;
    }
    kill_all(s); /* a drain that needed SIGKILL still returns 0 */
}

static void drain_workers(struct sup *s)
{
    s->phase = PH_DRAIN_WORKERS;
    log_info("stopping workers");
    signal_workers(s, SIGTERM);
    uv_timer_stop(&s->phase_timer);
    uv_timer_start(&s->phase_timer, on_kill_deadline, TD_KILL_GRACE_MS, 0);
    maybe_finish(s);
}

static void on_router_drain_deadline(uv_timer_t *t)
{
    struct sup *s = t->data;
    log_warn("router did not finish draining within shutdown-timeout + "
             "5 s; stopping the workers");
    drain_workers(s);
}

/* ---- notify pipe --------------------------------------------------------- */

static void on_notify_closed(uv_handle_t *h)
{
    free(h->data);
}

static void close_notify(struct sup *s)
{
    if (s->notify == NULL)
        return;
    uv_handle_t *h = (uv_handle_t *)&s->notify->pipe;
    uv_read_stop((uv_stream_t *)h);
    if (!uv_is_closing(h))
        uv_close(h, on_notify_closed);
    s->notify = NULL; /* the close callback frees it */
}

static void handle_line(struct sup *s, const char *line, size_t len)
{
    enum td_notify_kind kind;
    const char *reason;
    size_t rlen;
    if (td_notify_parse(line, len, &kind, &reason, &rlen) != 0) {
        log_warn("router notify pipe: unknown line '%.*s'",
                 (int)(len > 80 ? 80 : len), line);
        return;
    }
    char msg[TD_NOTIFY_LINE_MAX + 64];
    switch (kind) {
    case TD_NOTIFY_READY:
        if (s->phase != PH_RUNNING)
            return;
        s->ever_ready = true;
        log_info("all ranks ready: serving");
        sd_notify(0, "READY=1\nSTATUS=serving");
        return;
    case TD_NOTIFY_NOTREADY:
        log_warn("router not ready: %.*s", (int)rlen, reason);
        snprintf(msg, sizeof msg, "STATUS=not ready: %.*s", (int)rlen,
                 reason);
        sd_notify(0, msg);
        return;
    case TD_NOTIFY_WATCHDOG:
        s->last_router_wd = uv_now(&s->loop);
        s->router_wd_seen = true;
        return;
    case TD_NOTIFY_DRAINED:
        log_info("router drained");
        sd_notify(0, "STATUS=drained");
        return;
    }
}

static void on_notify_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)h;
    (void)hint;
    static char space[4096]; /* one loop thread; consumed before reuse */
    *buf = uv_buf_init(space, sizeof space);
}

static void on_notify_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct notify_conn *nc = st->data;
    struct sup *s = nc->s;
    if (nread < 0) { /* EOF or error: the router closed fd 3 or died */
        if (s->notify == nc)
            close_notify(s);
        else if (!uv_is_closing((uv_handle_t *)st))
            uv_close((uv_handle_t *)st, on_notify_closed);
        return;
    }
    for (ssize_t i = 0; i < nread; i++) {
        char ch = buf->base[i];
        if (ch == '\n') {
            if (nc->overflow)
                log_warn("router notify pipe: line over %u bytes dropped",
                         TD_NOTIFY_LINE_MAX);
            else
                handle_line(s, nc->line, nc->len);
            nc->len = 0;
            nc->overflow = false;
        } else if (nc->len < sizeof nc->line) {
            nc->line[nc->len++] = ch;
        } else {
            nc->overflow = true;
        }
    }
}

/* ---- children's stderr ---------------------------------------------------- */

static void on_err_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_err_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)h;
    (void)hint;
    static char space[8192]; /* one loop thread; consumed before reuse */
    *buf = uv_buf_init(space, sizeof space);
}

/* Keeps the line just completed as the child's last line (empty lines
 * are not kept). */
static void err_line_done(struct err_pipe *ep)
{
    size_t n = ep->len;
    while (n > 0 && (ep->line[n - 1] == '\r' || ep->line[n - 1] == ' '))
        n--;
    if (n > 0 && ep->c != NULL) {
        memcpy(ep->c->last_line, ep->line, n);
        ep->c->last_line[n] = '\0';
    }
    ep->len = 0;
}

static void on_err_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct err_pipe *ep = st->data;
    if (nread < 0) { /* EOF: the child is gone */
        if (ep->len > 0)
            err_line_done(ep);
        uv_close((uv_handle_t *)st, on_err_closed);
        return;
    }
    /* Relay as is: the lines are already formatted by the child's logger.
     * A short write (a full stderr) loses text rather than stall the loop
     * that supervises everything. */
    ssize_t off = 0;
    while (off < nread) {
        ssize_t w = write(STDERR_FILENO, buf->base + off, (size_t)(nread - off));
        if (w <= 0)
            break;
        off += w;
    }
    for (ssize_t i = 0; i < nread; i++) {
        char ch = buf->base[i];
        if (ch == '\n')
            err_line_done(ep);
        else if (ep->len < sizeof ep->line - 1)
            ep->line[ep->len++] = ch;
    }
}

/* ---- spawning -------------------------------------------------------------
 */

static void on_run_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_child_exit(uv_process_t *p, int64_t status, int term_signal);

/* Spawns c; returns 0 or a negative libuv code (logged). */
static int spawn_child(struct child *c)
{
    struct sup *s = c->s;
    TG_ASSERT(c->run == NULL);
    char name[32];
    struct run *r = calloc(1, sizeof *r);
    struct notify_conn *nc = NULL;
    if (r == NULL)
        return UV_ENOMEM;
    r->c = c;
    r->proc.data = r;
    struct err_pipe *ep = calloc(1, sizeof *ep);
    if (ep == NULL || uv_pipe_init(&s->loop, &ep->pipe, 0) != 0) {
        free(ep);
        free(r);
        return UV_ENOMEM;
    }
    ep->pipe.data = ep;
    ep->c = c;
    c->last_line[0] = '\0';
    uv_stdio_container_t stdio[TD_NOTIFY_FD + 1] = {
        {.flags = UV_IGNORE},
        {.flags = UV_INHERIT_FD, .data.fd = 1},
        /* Flags are from the child's side: it writes its stderr. */
        {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE,
         .data.stream = (uv_stream_t *)&ep->pipe},
        {.flags = UV_IGNORE},
    };
    int nstdio = 3;
    if (c->rank < 0) {
        close_notify(s); /* the previous run's, if still open */
        nc = calloc(1, sizeof *nc);
        if (nc == NULL) {
            uv_close((uv_handle_t *)&ep->pipe, on_err_closed);
            free(r);
            return UV_ENOMEM;
        }
        nc->s = s;
        nc->pipe.data = nc;
        int rc = uv_pipe_init(&s->loop, &nc->pipe, 0);
        if (rc != 0) {
            free(nc);
            uv_close((uv_handle_t *)&ep->pipe, on_err_closed);
            free(r);
            return rc;
        }
        /* Flags are from the child's side: the router writes. */
        stdio[TD_NOTIFY_FD].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
        stdio[TD_NOTIFY_FD].data.stream = (uv_stream_t *)&nc->pipe;
        nstdio = TD_NOTIFY_FD + 1;
    }
    uv_process_options_t opt = {
        .exit_cb = on_child_exit,
        .file = c->argv[0],
        .args = c->argv,
        .env = c->rank < 0 ? s->router_env : s->worker_env,
        .stdio_count = nstdio,
        .stdio = stdio,
    };
    int rc = uv_spawn(&s->loop, &r->proc, &opt);
    if (rc != 0) {
        log_err("cannot start %s (%s): %s", child_name(c, name, sizeof name),
                c->argv[0], uv_strerror(rc));
        uv_close((uv_handle_t *)&r->proc, on_run_closed);
        uv_close((uv_handle_t *)&ep->pipe, on_err_closed);
        if (nc != NULL)
            uv_close((uv_handle_t *)&nc->pipe, on_notify_closed);
        return rc;
    }
    if (uv_read_start((uv_stream_t *)&ep->pipe, on_err_alloc, on_err_read) !=
        0) {
        /* Nothing reads it: the child's writes would fill the pipe. */
        log_err("cannot read the stderr of %s",
                child_name(c, name, sizeof name));
        uv_close((uv_handle_t *)&ep->pipe, on_err_closed);
    }
    c->run = r;
    c->started_ms = uv_now(&s->loop);
    log_info("started %s, pid %d", child_name(c, name, sizeof name),
             r->proc.pid);
    if (nc != NULL) {
        s->notify = nc;
        s->last_router_wd = c->started_ms; /* grace until its loop runs */
        s->router_wd_seen = false;
        s->router_stall_killed = false;
        rc = uv_read_start((uv_stream_t *)&nc->pipe, on_notify_alloc,
                           on_notify_read);
        if (rc != 0) {
            log_err("cannot read the router notify pipe: %s",
                    uv_strerror(rc));
            close_notify(s);
        }
    }
    return 0;
}

static void on_worker_restart(uv_timer_t *t)
{
    struct child *c = t->data;
    if (c->s->phase == PH_RUNNING && !c->s->group_stopping)
        spawn_worker_or_retry(c);
}

static void schedule_worker(struct child *c, uint64_t uptime_ms)
{
    uint64_t d = td_backoff_next(&c->backoff, uptime_ms);
    log_info("restarting worker rank %d in %llu ms", c->rank,
             (unsigned long long)d);
    uv_timer_start(&c->restart, on_worker_restart, d, 0);
}

static void spawn_worker_or_retry(struct child *c)
{
    if (spawn_child(c) != 0)
        schedule_worker(c, 0);
}

static void on_router_restart(uv_timer_t *t)
{
    struct sup *s = ((struct child *)t->data)->s;
    if (s->phase != PH_RESTART_ALL)
        return;
    s->router_due = true;
    if (!workers_alive(s))
        start_all(s);
}

static void schedule_router(struct sup *s, uint64_t uptime_ms)
{
    uint64_t d = td_backoff_next(&s->router.backoff, uptime_ms);
    log_info("restarting router and all workers in %llu ms",
             (unsigned long long)d);
    s->router_due = false;
    uv_timer_start(&s->router.restart, on_router_restart, d, 0);
}

/* ---- the tensor-parallel worker group ----------------------------------- */

/* Group restart: every worker gone and the backoff over. */
static void maybe_group_start(struct sup *s)
{
    if (s->group_stopping && !workers_alive(s))
        uv_timer_stop(&s->group_kill); /* nobody left to kill */
    if (!s->group_stopping || !s->group_due || workers_alive(s) ||
        s->phase != PH_RUNNING)
        return;
    s->group_stopping = false;
    s->group_due = false;
    uv_timer_stop(&s->group_kill);
    for (size_t i = 0; i < s->nworkers; i++)
        spawn_worker_or_retry(&s->workers[i]);
}

static void on_group_due(uv_timer_t *t)
{
    struct sup *s = t->data;
    s->group_due = true;
    maybe_group_start(s);
}

static void on_group_kill(uv_timer_t *t)
{
    struct sup *s = t->data;
    if (!s->group_stopping || s->phase != PH_RUNNING || !workers_alive(s))
        return;
    log_warn("workers still running %u ms after SIGTERM: sending SIGKILL",
             TD_KILL_GRACE_MS);
    signal_workers(s, SIGKILL);
}

/* A worker of a tp > 1 group exited while serving: its peers would block
 * in their next all-reduce, so the whole group stops and starts again
 * together (its new rank 0 names a new communicator, td_supervisor.h). */
static void group_lost(struct sup *s, const struct child *c, uint64_t uptime)
{
    if (!s->group_stopping) {
        s->group_stopping = true;
        s->group_due = false;
        stop_worker_restarts(s);
        uint64_t d = td_backoff_next(&s->group_backoff, uptime);
        log_info("worker rank %d is gone: stopping its tensor-parallel "
                 "group; restarting all %zu workers in %llu ms", c->rank,
                 s->nworkers, (unsigned long long)d);
        sd_notify(0, "STATUS=a worker died; restarting the worker group");
        signal_workers(s, SIGTERM);
        uv_timer_start(&s->group_kill, on_group_kill, TD_KILL_GRACE_MS, 0);
        uv_timer_start(&s->group_timer, on_group_due, d, 0);
    }
    maybe_group_start(s);
}

/* RESTART_ALL with the workers down and the backoff over: start again. */
static void start_all(struct sup *s)
{
    s->phase = PH_RUNNING;
    s->router_due = false;
    uv_timer_stop(&s->phase_timer);
    sd_notify(0, "STATUS=starting router and workers");
    if (spawn_child(&s->router) != 0) {
        s->phase = PH_RESTART_ALL;
        schedule_router(s, 0);
        return;
    }
    for (size_t i = 0; i < s->nworkers; i++)
        spawn_worker_or_retry(&s->workers[i]);
}

static void log_exit(struct child *c, int64_t status, int sig)
{
    char name[32];
    child_name(c, name, sizeof name);
    char what[64];
    if (sig != 0)
        snprintf(what, sizeof what, "killed by signal %d (%s)", sig,
                 strsignal(sig));
    else
        snprintf(what, sizeof what, "exited with status %lld",
                 (long long)status);
    /* During a drain or a restart of everything, exits are expected. */
    if (c->s->phase == PH_RUNNING)
        log_warn("%s (pid %d) %s", name, c->run->proc.pid, what);
    else
        log_info("%s (pid %d) %s", name, c->run->proc.pid, what);
}

/* A child ended before the server was ever ready: a bad model, profile,
 * flag or port fails the same way on every restart, so tangramd stops
 * everything and td_sup_run returns TG_ESTARTUP with the child's last
 * stderr line. Crashes after the first READY keep the restarts. */
static void startup_failed(struct sup *s, struct child *c, int64_t status,
                           int sig)
{
    char name[32];
    if (sig != 0)
        snprintf(s->failed_what, sizeof s->failed_what,
                 "was killed by signal %d", sig);
    else
        snprintf(s->failed_what, sizeof s->failed_what,
                 "exited with status %lld", (long long)status);
    s->failed = c;
    log_err("%s %s before the server was ready: start-up failed, not "
            "restarting", child_name(c, name, sizeof name), s->failed_what);
    stop_restarts(s);
    uv_timer_stop(&s->phase_timer);
    s->phase = PH_DRAIN_WORKERS; /* maybe_finish ends the loop from here */
    signal_child(&s->router, SIGTERM);
    signal_workers(s, SIGTERM);
    uv_timer_start(&s->phase_timer, on_kill_deadline, TD_KILL_GRACE_MS, 0);
    s->result = TG_ESTARTUP;
    maybe_finish(s);
}

static void on_child_exit(uv_process_t *p, int64_t status, int term_signal)
{
    struct run *r = p->data;
    struct child *c = r->c;
    struct sup *s = c->s;
    uint64_t uptime = uv_now(&s->loop) - c->started_ms;
    log_exit(c, status, term_signal);
    if (c->rank == 0) {
        /* Rank 0 owns its group's shared memory; killed, it leaves it. */
        char err[256];
        int n = td_sup_shm_forget(NULL, (long)p->pid, err, sizeof err);
        if (n < 0)
            log_warn("worker rank 0 (pid %d): %s", p->pid, err);
        else if (n > 0)
            log_info("removed %d shared-memory segment(s) worker rank 0 "
                     "(pid %d) left", n, p->pid);
    }
    c->run = NULL;
    uv_close((uv_handle_t *)p, on_run_closed);
    if (!s->ever_ready && s->phase == PH_RUNNING && s->failed == NULL) {
        startup_failed(s, c, status, term_signal);
        return;
    }
    if (c->rank >= 0) {
        if (s->phase == PH_RUNNING && s->nworkers > 1)
            group_lost(s, c, uptime);
        else if (s->phase == PH_RUNNING)
            schedule_worker(c, uptime);
        else if (s->phase == PH_RESTART_ALL && !workers_alive(s)) {
            /* Nobody is left to SIGKILL: without this the deadline fires
             * during a router backoff longer than the grace and warns
             * about children that are gone. */
            uv_timer_stop(&s->phase_timer);
            if (s->router_due)
                start_all(s);
        }
        maybe_finish(s);
        return;
    }
    switch (s->phase) {
    case PH_RUNNING:
        /* The router's page accounting is gone and the workers' KV is
         * stale: everything starts over. */
        s->phase = PH_RESTART_ALL;
        sd_notify(0, "STATUS=router died; restarting");
        stop_restarts(s);
        signal_workers(s, SIGTERM);
        uv_timer_stop(&s->phase_timer);
        uv_timer_start(&s->phase_timer, on_kill_deadline, TD_KILL_GRACE_MS,
                       0);
        schedule_router(s, uptime);
        break;
    case PH_DRAIN_ROUTER:
        drain_workers(s);
        break;
    default:
        maybe_finish(s);
        break;
    }
}

/* ---- signals and watchdog ----------------------------------------------- */

static void on_stop_signal(uv_signal_t *h, int signum)
{
    struct sup *s = h->data;
    const char *sig = signum == SIGINT ? "SIGINT" : "SIGTERM";
    if (s->phase == PH_DONE || s->phase == PH_KILLED)
        return;
    if (s->phase == PH_DRAIN_ROUTER || s->phase == PH_DRAIN_WORKERS) {
        log_warn("second %s during drain: killing every child", sig);
        kill_all(s);
        s->result = TG_ECANCELED;
        return;
    }
    log_info("%s: draining (shutdown-timeout %.3g s)", sig,
             s->o->shutdown_timeout);
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    stop_restarts(s);
    uv_timer_stop(&s->phase_timer);
    if (s->router.run == NULL) {
        drain_workers(s);
        return;
    }
    s->phase = PH_DRAIN_ROUTER;
    signal_child(&s->router, SIGTERM);
    double ms = (s->o->shutdown_timeout + 5.0) * 1000.0;
    uv_timer_start(&s->phase_timer, on_router_drain_deadline, (uint64_t)ms,
                   0);
}

static void on_hup(uv_signal_t *h, int signum)
{
    (void)h;
    (void)signum;
    log_warn("SIGHUP: reload not supported; ignored");
}

static void on_watchdog_tick(uv_timer_t *t)
{
    struct sup *s = t->data;
    uint64_t now = uv_now(&s->loop);
    /* Ping only while the router proves its loop alive; when no router
     * runs (restart backoff, drain) tangramd itself is in control. */
    bool alive = s->router.run == NULL || s->phase != PH_RUNNING ||
                 now - s->last_router_wd <= s->wd_ms;
    if (alive)
        sd_notify(0, "WATCHDOG=1");
    else
        log_warn("router sent no WATCHDOG for %llu ms: not pinging systemd",
                 (unsigned long long)(now - s->last_router_wd));
}

/* The router's loop writes WATCHDOG every second (rt_server.c's tick).
 * Silence past --router-stall-ms means that loop is stopped (SIGSTOP) or
 * stuck, and every client waits as long as it lasts: the router is killed,
 * and its exit restarts it with the workers as after a crash
 * (on_child_exit). Armed once this run's loop has spoken, so the router's
 * own start-up (tokenizer, template) is not counted. */
static void on_stall_tick(uv_timer_t *t)
{
    struct sup *s = t->data;
    uint64_t silent = uv_now(&s->loop) - s->last_router_wd;
    if (s->phase != PH_RUNNING || s->router.run == NULL || !s->router_wd_seen ||
        s->router_stall_killed || silent <= (uint64_t)s->o->router_stall_ms)
        return;
    /* Lines waiting in the pipe are not silence: tangramd itself may have
     * been slow (libuv runs due timers before it reads). */
    uv_os_fd_t fd;
    int pending = 0;
    if (s->notify != NULL &&
        uv_fileno((uv_handle_t *)&s->notify->pipe, &fd) == 0 &&
        ioctl(fd, FIONREAD, &pending) == 0 && pending > 0)
        return;
    s->router_stall_killed = true;
    s->router_stalls++;
    log_err("router (pid %d) sent no WATCHDOG for %llu ms (--router-stall-ms "
            "%lld): its event loop is stopped or stuck; killing it to restart "
            "the router and the workers (router stall %llu since tangramd "
            "started)",
            s->router.run->proc.pid, (unsigned long long)silent,
            (long long)s->o->router_stall_ms,
            (unsigned long long)s->router_stalls);
    char msg[160];
    snprintf(msg, sizeof msg,
             "STATUS=router stalled for %llu ms; restarting (stall %llu)",
             (unsigned long long)silent, (unsigned long long)s->router_stalls);
    sd_notify(0, msg);
    signal_child(&s->router, SIGKILL); /* a stopped process dies too */
}

/* ---- set-up and tear-down ----------------------------------------------- */

static int init_child(struct sup *s, struct child *c, int rank, char *err,
                      size_t errlen)
{
    c->s = s;
    c->rank = rank;
    int rc = rank < 0 ? td_sup_router_argv(s->o, s->paths->router_bin,
                                           s->paths->endpoint, &c->argv,
                                           &c->argc, err, errlen)
                      : td_sup_worker_argv(s->o, s->paths->worker_bin, rank,
                                           s->paths->endpoint, &c->argv,
                                           &c->argc, err, errlen);
    if (rc != 0)
        return rc;
    uv_timer_init(&s->loop, &c->restart);
    c->restart.data = c;
    c->restart_init = true;
    return 0;
}

static int sup_init(struct sup *s, const struct tg_serve_opts *o,
                    const struct td_sup_paths *p, char **envp, char *err,
                    size_t errlen)
{
    s->o = o;
    s->paths = p;
    int rc = uv_loop_init(&s->loop);
    if (rc != 0)
        return tg_err_set(err, errlen, TG_EIO, "uv_loop_init: %s",
                          uv_strerror(rc));
    s->stage = 1; /* the loop itself */
    rc = td_sup_child_env(o, envp, true, &s->router_env, &s->router_nenv,
                          err, errlen);
    if (rc == 0)
        rc = td_sup_child_env(o, envp, false, &s->worker_env,
                              &s->worker_nenv, err, errlen);
    if (rc != 0)
        return rc;
    s->workers = calloc((size_t)o->tp, sizeof *s->workers);
    if (s->workers == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    s->nworkers = (size_t)o->tp; /* zeroed entries are safe to free */
    rc = init_child(s, &s->router, -1, err, errlen);
    for (size_t i = 0; rc == 0 && i < s->nworkers; i++)
        rc = init_child(s, &s->workers[i], (int)i, err, errlen);
    if (rc != 0)
        return rc;
    uv_signal_init(&s->loop, &s->sig_term);
    uv_signal_init(&s->loop, &s->sig_int);
    uv_signal_init(&s->loop, &s->sig_hup);
    uv_timer_init(&s->loop, &s->phase_timer);
    uv_timer_init(&s->loop, &s->watchdog);
    uv_timer_init(&s->loop, &s->stall_timer);
    uv_timer_init(&s->loop, &s->group_timer);
    uv_timer_init(&s->loop, &s->group_kill);
    s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
    s->phase_timer.data = s->watchdog.data = s->stall_timer.data = s;
    s->group_timer.data = s->group_kill.data = s;
    s->stage = 2; /* loop-level handles exist and need closing */
    rc = uv_signal_start(&s->sig_term, on_stop_signal, SIGTERM);
    if (rc == 0)
        rc = uv_signal_start(&s->sig_int, on_stop_signal, SIGINT);
    if (rc == 0)
        rc = uv_signal_start(&s->sig_hup, on_hup, SIGHUP);
    if (rc != 0)
        return tg_err_set(err, errlen, TG_EIO, "uv_signal_start: %s",
                          uv_strerror(rc));
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        s->wd_ms = usec / 1000 > 0 ? usec / 1000 : 1;
        /* systemd advises pinging at half the interval (sd_watchdog_enabled
         * man page). */
        uint64_t every = s->wd_ms / 2 > 0 ? s->wd_ms / 2 : 1;
        uv_timer_start(&s->watchdog, on_watchdog_tick, every, every);
        log_info("systemd watchdog every %llu ms",
                 (unsigned long long)s->wd_ms);
    }
    if (o->router_stall_ms > 0) {
        uv_timer_start(&s->stall_timer, on_stall_tick, TD_STALL_CHECK_MS,
                       TD_STALL_CHECK_MS);
        if (s->wd_ms > 0 && (uint64_t)o->router_stall_ms >= s->wd_ms)
            log_warn("--router-stall-ms %lld is not below systemd's "
                     "watchdog (%llu ms): a stalled router stops the pings "
                     "and systemd restarts the whole service first",
                     (long long)o->router_stall_ms,
                     (unsigned long long)s->wd_ms);
    }
    return 0;
}

/* Closes whatever handles remain and releases memory; the loop is run
 * until every close callback has fired. */
static void sup_free(struct sup *s)
{
    if (s->stage == 0)
        return;
    if (s->stage >= 2) {
        s->phase = PH_KILLED; /* maybe_finish closes only then */
        maybe_finish(s);
    } else {
        close_timers(s);
    }
    close_notify(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&s->loop);
    TG_ASSERT(rc == 0);
    tg_config_argv_free(s->router.argv, s->router.argc);
    for (size_t i = 0; i < s->nworkers; i++)
        tg_config_argv_free(s->workers[i].argv, s->workers[i].argc);
    free(s->workers);
    tg_config_argv_free(s->router_env, s->router_nenv);
    tg_config_argv_free(s->worker_env, s->worker_nenv);
}

int td_sup_run(const struct tg_serve_opts *o, const struct td_sup_paths *p,
               char **envp, char *err, size_t errlen)
{
    struct sup s;
    memset(&s, 0, sizeof s);
    int rc = sup_init(&s, o, p, envp, err, errlen);
    if (rc != 0) {
        sup_free(&s);
        return rc;
    }
    log_info("runtime directory %s, endpoint %s", p->runtime_dir,
             p->endpoint);
    sd_notify(0, "STATUS=starting router and workers");
    int src = spawn_child(&s.router);
    for (size_t i = 0; src == 0 && i < s.nworkers; i++)
        src = spawn_child(&s.workers[i]);
    if (src != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "cannot start the children: %s",
                        uv_strerror(src));
        kill_all(&s);
        uv_run(&s.loop, UV_RUN_DEFAULT); /* reap them */
        sup_free(&s);
        return rc;
    }
    uv_run(&s.loop, UV_RUN_DEFAULT);
    rc = s.result;
    if (rc == TG_ESTARTUP && s.failed != NULL) {
        /* Every stderr pipe reached EOF before the loop ended, so the
         * failed child's last line is its last word. */
        char name[32], status[TD_CHILD_LINE_MAX + 160];
        child_name(s.failed, name, sizeof name);
        tg_err_set(err, errlen, TG_ESTARTUP,
                   "%s %s before the server was ready%s%s", name,
                   s.failed_what, s.failed->last_line[0] ? ": " : "",
                   s.failed->last_line);
        snprintf(status, sizeof status, "STATUS=start-up failed: %s %s%s%s",
                 name, s.failed_what, s.failed->last_line[0] ? ": " : "",
                 s.failed->last_line);
        sd_notify(0, status);
    }
    sup_free(&s);
    return rc;
}
