/*
 * td_supervisor.h — the process supervisor of tangramd (DESIGN.md §2,
 * §5): starts the router and the T = --tp workers, restarts what dies,
 * drains on SIGTERM, talks to systemd.
 *
 * Process model. tangramd spawns `tangram-router` and `tangram-worker`
 * rank 0..T-1 with libuv (uv_spawn); they stay in tangramd's process group
 * and every exit path of td_sup_run waits until all of them are reaped.
 * Residual risk: if tangramd itself is SIGKILLed (or aborts on a TG_ASSERT)
 * nothing kills its children here. Mitigations: under systemd the unit's
 * control group is killed as a whole (KillMode=control-group); workers exit
 * when the router goes silent (heartbeats); and the ROUTER MUST EXIT WHEN ITS
 * NOTIFY PIPE CLOSES — see the contract below.
 *
 * Router contract (fd 3 of the router, the "notify pipe", a stream socket).
 * The router writes newline-terminated words:
 *   "READY"             every rank is up; tangramd sends READY=1 and
 *                       STATUS=serving to systemd (repeatable: after a
 *                       restart the router says READY again)
 *   "NOTREADY <reason>" a rank is down; tangramd sets STATUS=not ready: ...
 *   "WATCHDOG"          the router's loop is alive; write it at least once
 *                       per second. Once one came, a router silent for
 *                       longer than --router-stall-ms (checked every
 *                       TD_STALL_CHECK_MS, lines waiting in the pipe
 *                       counting as spoken) is stopped or stuck: tangramd
 *                       logs why, counts it, SIGKILLs it, and restarts it
 *                       with the workers as after a crash (below). tangramd
 *                       pings systemd's watchdog only while these keep
 *                       coming within WATCHDOG_USEC (or no router runs), so
 *                       a hung router that tangramd does not end (--router-
 *                       stall-ms 0, or not below WATCHDOG_USEC: warned at
 *                       start) gets the unit restarted.
 *   "DRAINED"           the drain after SIGTERM finished (the router then
 *                       exits).
 * Lines longer than TD_NOTIFY_LINE_MAX bytes are discarded. The router must
 * watch fd 3 for readability: end-of-file there means tangramd is gone, and
 * the router must then exit (its workers follow when heartbeats stop).
 *
 * Start-up. A child that exits before the router's first READY (a model,
 * profile, tokenizer, flag or port it cannot use fails the same way every
 * time) is not restarted: every other child is stopped and td_sup_run
 * returns TG_ESTARTUP with "<child> exited with status N before the server
 * was ready: <its last stderr line>" in err and in systemd's STATUS=.
 * Children's stderr goes through tangramd (a pipe per child, copied to
 * tangramd's stderr as it arrives) so that line is known.
 *
 * Restart policy (after the first READY). With --tp 1 a worker that exits
 * is restarted after a
 * backoff of 100 ms doubling to 10 s, reset once the process had run 60 s
 * (td_backoff_next); the router detects the dead rank on its own. With
 * --tp T > 1 the workers form one all-reduce group (DESIGN.md §4.7) that
 * cannot survive the loss of a member: when any worker exits, the others
 * get SIGTERM (SIGKILL after 5 s), and once all are gone and the group's
 * backoff (same schedule, the dead worker's uptime) has passed, all T
 * start again. The group's communicator is not tangramd's business: worker
 * rank 0 names it and the router hands the name to every rank
 * (proto/worker.proto CommSetup), so every incarnation gets a new one. On
 * the CPU backend the name is a POSIX shared-memory segment
 * "/tangram-<rank 0 pid>-<random>" that rank 0 removes when it exits; one
 * killed by a signal cannot, so whenever tangramd reaps worker rank 0 it
 * removes /dev/shm/tangram-<that pid>-* (td_sup_shm_forget). A router
 * that exits unexpectedly brings everything down: the workers get SIGTERM
 * (SIGKILL after 5 s), and router and workers start again after the
 * router's backoff, since the router's page accounting is gone and the
 * workers' KV is stale.
 *
 * Signals. SIGTERM/SIGINT: STOPPING=1; SIGTERM to the router (it answers new
 * requests 503 and finishes running ones within --shutdown-timeout); after
 * it exits, or shutdown-timeout + 5 s, SIGTERM to the workers; SIGKILL to
 * whatever is left 5 s later; then td_sup_run returns 0. A second
 * SIGTERM/SIGINT during the drain SIGKILLs every child at once and
 * td_sup_run returns TG_ECANCELED. SIGHUP is logged and ignored.
 *
 * Children inherit tangramd's environment minus NOTIFY_SOCKET,
 * WATCHDOG_USEC and WATCHDOG_PID (only tangramd talks to systemd). Secret
 * options (--api-key) never go on a command line: the router gets them as
 * TANGRAM_<NAME> in its environment; workers do not get them at all.
 */
#ifndef TD_SUPERVISOR_H
#define TD_SUPERVISOR_H

#include "daemon/td_options.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_BACKOFF_MIN_MS 100u     /* first restart delay */
#define TD_BACKOFF_MAX_MS 10000u   /* the delay doubles up to this */
#define TD_BACKOFF_RESET_MS 60000u /* an uptime this long resets it */
#define TD_KILL_GRACE_MS 5000u     /* SIGTERM -> SIGKILL grace */
#define TD_NOTIFY_LINE_MAX 1024u   /* longest notify line kept, bytes */
#define TD_NOTIFY_FD 3             /* the notify pipe in the router */
#define TD_CHILD_LINE_MAX 512u     /* last stderr line kept per child */
#define TD_STALL_CHECK_MS \
    250u /* how often the router's silence is
                                      checked against --router-stall-ms */

/* Restart backoff of one process. Zero-initialize. */
struct td_backoff {
    uint64_t next_ms; /* delay of the next restart; 0 = TD_BACKOFF_MIN_MS */
};

/* Returns the delay in ms before restarting a process that ran uptime_ms
 * and advances *b: 100, 200, 400 ... capped at 10000; an uptime of at least
 * TD_BACKOFF_RESET_MS starts over at 100. Thread: any, one *b at a time. */
uint64_t td_backoff_next(struct td_backoff *b, uint64_t uptime_ms);

/* The words of the router's notify pipe. */
enum td_notify_kind {
    TD_NOTIFY_READY = 0,
    TD_NOTIFY_NOTREADY = 1,
    TD_NOTIFY_WATCHDOG = 2,
    TD_NOTIFY_DRAINED = 3,
};

/* Parses one notify line line[0..len) (without its '\n'; a trailing '\r'
 * is ignored). On success sets *kind and, for NOTREADY, *reason and *reason_len
 * to the text after the word and one space (possibly empty; NULL/0 for the
 * other words). Returns 0, or TG_EFORMAT for an unknown word or text after
 * a word that takes none. Thread: any. */
int td_notify_parse(const char *line, size_t len, enum td_notify_kind *kind,
                    const char **reason, size_t *reason_len);

/* Appends the router's command line to *argv and *argc (the tg_config_argv
 * array convention of common/base/tg_config.h: start from NULL/0, free with
 * tg_config_argv_free): bin, every row of the serving table marked for
 * tangramd and the router except secret ones as "--name=value"
 * (tg_serve_opts_forward; profile NULL as "--profile=none"), then
 * "--ipc-endpoint ENDPOINT --notify-fd 3". Returns 0, TG_EINVAL or
 * TG_ENOMEM with detail in err. Thread: any. */
int td_sup_router_argv(const struct tg_serve_opts *o, const char *bin,
                       const char *endpoint, char ***argv, size_t *argc,
                       char *err, size_t errlen);

/* Appends worker `rank`'s command line: bin, "--rank R --world-size T
 * --router ENDPOINT", then every row marked for tangramd and the worker
 * (today --model --profile --backend --heads-per-group --page-size
 * --prefill-chunk --max-num-seqs --kv-memory --log-format --log-level) as
 * "--name=value" (profile NULL as "--profile=none"). Returns 0, TG_EINVAL
 * (rank outside [0, tp)) or TG_ENOMEM with detail in err. Thread: any. */
int td_sup_worker_argv(const struct tg_serve_opts *o, const char *bin,
                       int rank, const char *endpoint, char ***argv,
                       size_t *argc, char *err, size_t errlen);

/* Removes the shared-memory segments a worker rank 0 with process id `pid`
 * may have left: every entry "tangram-<pid>-*" of `shm_dir` (NULL:
 * "/dev/shm", where Linux keeps POSIX shared memory). Returns the number
 * removed (0 when none or the directory is missing), or TG_EIO when an
 * entry could not be removed (detail in err; the others are still tried).
 * Call it only once that process is reaped: the name carries its pid, so
 * no live group is touched. Thread: any. */
int td_sup_shm_forget(const char *shm_dir, long pid, char *err,
                      size_t errlen);

/* Appends a child's environment: envp (NULL-terminated "KEY=VALUE"; NULL
 * for none) without NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID and without
 * the TANGRAM_<NAME> variables of secret options; for the router
 * (for_router true) those variables are then added with tangramd's
 * effective values when non-empty. Returns 0 or TG_ENOMEM. Thread: any. */
int td_sup_child_env(const struct tg_serve_opts *o, char **envp,
                     bool for_router, char ***env, size_t *n, char *err,
                     size_t errlen);

/* Where the children are and where they meet. */
struct td_sup_paths {
    char router_bin[PATH_MAX];  /* tangram-router */
    char worker_bin[PATH_MAX];  /* tangram-worker */
    char runtime_dir[PATH_MAX]; /* holds workers.sock; "" = none yet */
    bool own_dir;               /* we made runtime_dir (mkdtemp): remove it */
    bool locked;                /* own_dir: lock_fd holds its lock */
    int lock_fd;                /* <runtime_dir>/tangramd.lock, flock'ed */
    char endpoint[PATH_MAX + 32]; /* "ipc://<runtime_dir>/workers.sock" */
};

/* Fills *p from envp (NULL-terminated, usually `environ`): the programs are
 * TANGRAM_ROUTER_BIN / TANGRAM_WORKER_BIN when set, else tangram-router /
 * tangram-worker in `exe_dir` (the directory of the tangramd binary; NULL
 * reads /proc/self/exe); both must be executable. The runtime directory is
 * the first entry of RUNTIME_DIRECTORY (systemd) when set, else a new
 * private mkdtemp directory "tangramd.XXXXXX" under TMPDIR or /tmp, which
 * holds "tangramd.lock" (this process's pid), locked (flock, exclusive)
 * from its creation until td_sup_paths_cleanup or the process's end;
 * before making it, the stale directories of tangramds that are gone are
 * removed from that base (td_sup_clean_stale_dirs). The
 * socket path must fit an AF_UNIX address (107 bytes). Returns 0,
 * TG_ENOENT (a program or directory missing / not executable), TG_ETOOBIG
 * (path too long) or TG_EIO, with a clear message in err; on failure
 * nothing is left on disk. Thread: any. */
int td_sup_paths_init(struct td_sup_paths *p, char **envp,
                      const char *exe_dir, char *err, size_t errlen);

/* Removes what td_sup_paths_init and the children left: workers.sock, and
 * when own_dir every entry of the directory and the directory itself, then
 * lets its lock go. Safe on a zeroed *p and twice. Thread: any. */
void td_sup_paths_cleanup(struct td_sup_paths *p);

/* Removes the runtime directories under `base` that a tangramd made and
 * that provably outlived it (it was SIGKILLed, or the machine lost power
 * with /tmp kept): entries named "tangramd.XXXXXX" (six characters) that
 * are directories of this user (not links) holding a "tangramd.lock" that
 * nobody holds locked. The lock proves it: its tangramd held it until it
 * ended, and the lock died with it. A directory without that file (made
 * by an older tangramd, or half-made) or whose lock is held is left alone.
 * Each removal (the directory's plain entries, then the directory) is
 * logged with the pid the lock file names. Returns the number of
 * directories removed (0 when base cannot be read). Thread: any. */
int td_sup_clean_stale_dirs(const char *base);

/* Runs the supervisor until it is told to stop: spawns the router and the
 * workers with environment built from envp (td_sup_child_env), handles
 * signals, restarts and systemd notification (sd_notify; a no-op without
 * NOTIFY_SOCKET) on its own libuv loop. Returns only once every child is
 * reaped: 0 after a drain on SIGTERM/SIGINT, TG_ECANCELED when a second
 * signal cut the drain short, TG_ESTARTUP when a child ended before the
 * server was first ready (see Start-up above), or another negative TG_E*
 * code when set-up failed (detail in err; children already started are
 * killed first). Logs with
 * tg_log. Thread: the process's only thread that handles signals; one call
 * at a time per process (it owns SIGTERM, SIGINT and SIGHUP while it runs).
 */
int td_sup_run(const struct tg_serve_opts *o, const struct td_sup_paths *p,
               char **envp, char *err, size_t errlen);

#endif /* TD_SUPERVISOR_H */
