/* td_supervisor.c — helpers of the tangramd supervisor: restart backoff,
 * notify-line parsing, child command lines and environment, runtime
 * directory (td_supervisor.h). The libuv loop is in td_sup_loop.c. */
#include "daemon/td_supervisor.h"
#include "common/base/tg_err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/tg_log.h"

#define SOCK_NAME "workers.sock"
#define DIR_PREFIX "tangramd."     /* + mkdtemp's six characters */
#define LOCK_NAME "tangramd.lock"  /* the owner's pid, locked by it */
#define LOCK_TMP ".tangramd.lock.tmp" /* the lock file before it is held */
#define SUN_PATH_MAX 107 /* sizeof(sockaddr_un.sun_path) - 1 on Linux */

uint64_t td_backoff_next(struct td_backoff *b, uint64_t uptime_ms)
{
    if (uptime_ms >= TD_BACKOFF_RESET_MS)
        b->next_ms = 0;
    uint64_t delay = b->next_ms != 0 ? b->next_ms : TD_BACKOFF_MIN_MS;
    b->next_ms = delay >= TD_BACKOFF_MAX_MS / 2 ? TD_BACKOFF_MAX_MS
                                                : delay * 2;
    return delay;
}

int td_notify_parse(const char *line, size_t len, enum td_notify_kind *kind,
                    const char **reason, size_t *reason_len)
{
    static const struct {
        const char *word;
        enum td_notify_kind kind;
        bool has_reason;
    } words[] = {
        {"READY", TD_NOTIFY_READY, false},
        {"NOTREADY", TD_NOTIFY_NOTREADY, true},
        {"WATCHDOG", TD_NOTIFY_WATCHDOG, false},
        {"DRAINED", TD_NOTIFY_DRAINED, false},
    };
    if (len > 0 && line[len - 1] == '\r')
        len--;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t wl = strlen(words[i].word);
        if (len < wl || memcmp(line, words[i].word, wl) != 0)
            continue;
        if (len == wl) {
            *kind = words[i].kind;
            *reason = NULL;
            *reason_len = 0;
            return 0;
        }
        if (!words[i].has_reason || line[wl] != ' ')
            continue; /* "READYX", "READY now": not this word */
        *kind = words[i].kind;
        *reason = line + wl + 1;
        *reason_len = len - wl - 1;
        return 0;
    }
    return TG_EFORMAT;
}

static int push(char ***argv, size_t *argc, const char *s, char *err,
                size_t errlen)
{
    if (tg_config_argv_push(argv, argc, s) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    return 0;
}

int td_sup_router_argv(const struct tg_serve_opts *o, const char *bin,
                       const char *endpoint, char ***argv, size_t *argc,
                       char *err, size_t errlen)
{
    int rc = push(argv, argc, bin, err, errlen);
    if (rc == 0)
        rc = tg_serve_opts_forward(o, TG_SERVE_ROUTER, argv, argc, err,
                                   errlen);
    /* td_options_parse turns "none" into NULL, which to_argv leaves out;
     * say it explicitly so the child cannot fall back on another default. */
    if (rc == 0 && o->profile == NULL)
        rc = push(argv, argc, "--profile=none", err, errlen);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", TD_NOTIFY_FD);
    const char *tail[] = {"--ipc-endpoint", endpoint, "--notify-fd", fd};
    for (size_t i = 0; rc == 0 && i < 4; i++)
        rc = push(argv, argc, tail[i], err, errlen);
    return rc;
}

int td_sup_worker_argv(const struct tg_serve_opts *o, const char *bin,
                       int rank, const char *endpoint, char ***argv,
                       size_t *argc, char *err, size_t errlen)
{
    if (rank < 0 || rank >= o->tp)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "worker rank %d outside [0, %lld)", rank,
                          (long long)o->tp);
    char r[24], t[24];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(t, sizeof t, "%lld", (long long)o->tp);
    const char *head[] = {bin, "--rank", r, "--world-size", t,
                          "--router", endpoint};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof head / sizeof head[0]; i++)
        rc = push(argv, argc, head[i], err, errlen);
    if (rc == 0)
        rc = tg_serve_opts_forward(o, TG_SERVE_WORKER, argv, argc, err,
                                   errlen);
    if (rc == 0 && o->profile == NULL)
        rc = push(argv, argc, "--profile=none", err, errlen);
    /* The worker beats at the period the router's deadline counts in
     * (5 periods of silence kill it). */
    char hb[40];
    snprintf(hb, sizeof hb, "--heartbeat-ms=%lld",
             (long long)o->worker_heartbeat_ms);
    if (rc == 0)
        rc = push(argv, argc, hb, err, errlen);
    return rc;
}

int td_sup_shm_forget(const char *shm_dir, long pid, char *err,
                      size_t errlen)
{
    const char *dir = shm_dir != NULL ? shm_dir : "/dev/shm";
    char prefix[64];
    /* gw_comm_new_id's names: "/tangram-<pid>-<hex>" (gpu_worker/cpu/gw_comm.h) */
    int plen = snprintf(prefix, sizeof prefix, "tangram-%ld-", pid);
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0; /* no shared memory there, nothing left behind */
    int removed = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            removed++;
        else if (errno != ENOENT)
            rc = tg_err_set(err, errlen, TG_EIO, "cannot remove %s/%s: %s",
                            dir, e->d_name, strerror(errno));
    }
    closedir(d);
    return rc != 0 ? rc : removed;
}

/* True when "KEY=..." entry `kv` has key `key`. */
static bool env_has_key(const char *kv, const char *key)
{
    size_t kl = strlen(key);
    return strncmp(kv, key, kl) == 0 && kv[kl] == '=';
}

int td_sup_child_env(const struct tg_serve_opts *o, char **envp,
                     bool for_router, char ***env, size_t *n, char *err,
                     size_t errlen)
{
    static const char *const dropped[] = {"NOTIFY_SOCKET", "WATCHDOG_USEC",
                                          "WATCHDOG_PID"};
    size_t nt;
    const struct tg_config_entry *table = td_options_table(&nt);
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        bool drop = false;
        for (size_t k = 0; k < 3 && !drop; k++)
            drop = env_has_key(envp[i], dropped[k]);
        for (size_t k = 0; k < nt && !drop; k++) {
            char name[96];
            if ((table[k].flags & TG_CONFIG_SECRET) != 0 &&
                tg_config_env_name(&table[k], name, sizeof name) == 0)
                drop = env_has_key(envp[i], name);
        }
        if (!drop) {
            int rc = push(env, n, envp[i], err, errlen);
            if (rc != 0)
                return rc;
        }
    }
    for (size_t k = 0; for_router && k < nt; k++) {
        const struct tg_config_entry *e = &table[k];
        if ((e->flags & TG_CONFIG_SECRET) == 0 || e->type != TG_CONFIG_STRING)
            continue;
        const char *v = *(char *const *)((const char *)o + e->offset);
        char name[96];
        if (v == NULL || v[0] == '\0' ||
            tg_config_env_name(e, name, sizeof name) != 0)
            continue;
        size_t need = strlen(name) + strlen(v) + 2;
        char *kv = malloc(need);
        if (kv == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        snprintf(kv, need, "%s=%s", name, v);
        int rc = push(env, n, kv, err, errlen);
        free(kv);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static const char *env_get(char **envp, const char *key)
{
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++)
        if (env_has_key(envp[i], key))
            return envp[i] + strlen(key) + 1;
    return NULL;
}

/* Sets dst to the program: env override, else exe_dir/name; checks it. */
static int find_program(char *dst, size_t len, char **envp,
                        const char *env_key, const char *exe_dir,
                        const char *name, char *err, size_t errlen)
{
    const char *over = env_get(envp, env_key);
    int w;
    if (over != NULL && over[0] != '\0')
        w = snprintf(dst, len, "%s", over);
    else
        w = snprintf(dst, len, "%s/%s", exe_dir, name);
    if (w < 0 || (size_t)w >= len)
        return tg_err_set(err, errlen, TG_ETOOBIG, "path of %s too long",
                          name);
    struct stat st;
    if (stat(dst, &st) == 0 && !S_ISREG(st.st_mode))
        return tg_err_set(err, errlen, TG_ENOENT,
                          "%s '%s' is not a regular file", name, dst);
    if (access(dst, X_OK) != 0)
        return tg_err_set(err, errlen, TG_ENOENT,
                          "%s '%s' is not an executable file (%s)%s", name,
                          dst, strerror(errno),
                          over != NULL && over[0] != '\0'
                              ? ""
                              : "; build it next to tangramd or set the "
                                "environment variable");
    return 0;
}

/* Removes the plain entries of dir, then dir (a nested directory, which
 * none of ours has, makes the rmdir fail and leaves it). */
static void remove_dir(const char *dir)
{
    char path[PATH_MAX + 256];
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* True when `name` is what mkdtemp made of DIR_PREFIX "XXXXXX". */
static bool runtime_dir_name(const char *name)
{
    size_t pl = strlen(DIR_PREFIX);
    if (strncmp(name, DIR_PREFIX, pl) != 0 || strlen(name) != pl + 6)
        return false;
    for (const char *c = name + pl; *c != '\0'; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (*c >= '0' && *c <= '9')))
            return false;
    return true;
}

int td_sup_clean_stale_dirs(const char *base)
{
    DIR *d = opendir(base);
    if (d == NULL)
        return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!runtime_dir_name(de->d_name))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
            continue;
        char dir[PATH_MAX], lock[PATH_MAX + 32];
        if (snprintf(dir, sizeof dir, "%s/%s", base, de->d_name) >=
            (int)sizeof dir)
            continue;
        snprintf(lock, sizeof lock, "%s/%s", dir, LOCK_NAME);
        int fd = open(lock, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue; /* nothing proves it stale */
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            close(fd); /* its tangramd runs */
            continue;
        }
        char pid[32] = "?";
        ssize_t n = read(fd, pid, sizeof pid - 1);
        if (n > 0) {
            pid[n] = '\0';
            pid[strcspn(pid, "\n")] = '\0';
        }
        /* Held while removing: a second tangramd cleaning the same base
         * waits for nothing and finds the directory gone. */
        remove_dir(dir);
        close(fd);
        if (access(dir, F_OK) != 0) {
            removed++;
            log_info("removed stale runtime directory %s (its tangramd, pid "
                     "%s, is gone)", dir, pid);
        } else {
            log_warn("stale runtime directory %s (tangramd pid %s) could not "
                     "be removed: %s", dir, pid, strerror(errno));
        }
    }
    closedir(d);
    return removed;
}

/* Creates the lock file of a fresh private directory already held: it is
 * locked under a temporary name and renamed into place, so a cleaner that
 * finds LOCK_NAME always finds it locked while its tangramd lives. */
static int lock_runtime_dir(struct td_sup_paths *p, char *err, size_t errlen)
{
    char tmp[PATH_MAX + 32], path[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s/%s", p->runtime_dir, LOCK_TMP);
    snprintf(path, sizeof path, "%s/%s", p->runtime_dir, LOCK_NAME);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                  0600);
    if (fd < 0)
        return tg_err_set(err, errlen, TG_EIO, "cannot create %s: %s", tmp,
                          strerror(errno));
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || write(fd, pid, (size_t)n) != n ||
        rename(tmp, path) != 0) {
        int e = errno;
        close(fd);
        return tg_err_set(err, errlen, TG_EIO, "cannot lock %s: %s", path,
                          strerror(e));
    }
    p->lock_fd = fd;
    p->locked = true;
    return 0;
}

static int make_runtime_dir(struct td_sup_paths *p, char **envp, char *err,
                            size_t errlen)
{
    const char *rd = env_get(envp, "RUNTIME_DIRECTORY");
    if (rd != NULL && rd[0] != '\0') {
        /* systemd passes one directory per RuntimeDirectory= entry,
         * separated by ':'; the first one is ours. */
        size_t l = strcspn(rd, ":");
        if (l >= sizeof p->runtime_dir)
            return tg_err_set(err, errlen, TG_ETOOBIG,
                              "RUNTIME_DIRECTORY is too long");
        memcpy(p->runtime_dir, rd, l);
        p->runtime_dir[l] = '\0';
        if (access(p->runtime_dir, W_OK | X_OK) != 0) {
            int e = errno;
            p->runtime_dir[0] = '\0';
            return tg_err_set(err, errlen, TG_ENOENT,
                              "RUNTIME_DIRECTORY '%.*s' is not a writable "
                              "directory (%s)", (int)l, rd, strerror(e));
        }
        p->own_dir = false;
        return 0;
    }
    const char *tmp = env_get(envp, "TMPDIR");
    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    int w = snprintf(p->runtime_dir, sizeof p->runtime_dir,
                     "%s/tangramd.XXXXXX", tmp);
    if (w < 0 || (size_t)w >= sizeof p->runtime_dir) {
        p->runtime_dir[0] = '\0';
        return tg_err_set(err, errlen, TG_ETOOBIG, "TMPDIR is too long");
    }
    td_sup_clean_stale_dirs(tmp);
    if (mkdtemp(p->runtime_dir) == NULL) {
        int e = errno;
        p->runtime_dir[0] = '\0';
        return tg_err_set(err, errlen, TG_EIO,
                          "cannot create a runtime directory under '%s': %s",
                          tmp, strerror(e));
    }
    p->own_dir = true;
    int rc = lock_runtime_dir(p, err, errlen);
    if (rc != 0) {
        remove_dir(p->runtime_dir);
        p->runtime_dir[0] = '\0';
        p->own_dir = false;
    }
    return rc;
}

int td_sup_paths_init(struct td_sup_paths *p, char **envp,
                      const char *exe_dir, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    char self[PATH_MAX];
    if (exe_dir == NULL) {
        ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
        if (l <= 0)
            return tg_err_set(err, errlen, TG_EIO,
                              "cannot read /proc/self/exe: %s",
                              strerror(errno));
        self[l] = '\0';
        char *slash = strrchr(self, '/');
        if (slash == NULL)
            return tg_err_set(err, errlen, TG_EIO,
                              "/proc/self/exe is not a path: %s", self);
        *slash = '\0';
        exe_dir = slash == self ? "/" : self;
    }
    int rc = find_program(p->router_bin, sizeof p->router_bin, envp,
                          "TANGRAM_ROUTER_BIN", exe_dir, "tangram-router",
                          err, errlen);
    if (rc == 0)
        rc = find_program(p->worker_bin, sizeof p->worker_bin, envp,
                          "TANGRAM_WORKER_BIN", exe_dir, "tangram-worker",
                          err, errlen);
    if (rc == 0)
        rc = make_runtime_dir(p, envp, err, errlen);
    if (rc != 0)
        return rc;
    size_t sock_len = strlen(p->runtime_dir) + 1 + strlen(SOCK_NAME);
    if (sock_len > SUN_PATH_MAX) {
        rc = tg_err_set(err, errlen, TG_ETOOBIG,
                        "socket path %s/%s is %zu bytes, over the %d bytes "
                        "of an AF_UNIX address; set TMPDIR to a shorter "
                        "directory", p->runtime_dir, SOCK_NAME, sock_len,
                        SUN_PATH_MAX);
        td_sup_paths_cleanup(p);
        return rc;
    }
    snprintf(p->endpoint, sizeof p->endpoint, "ipc://%s/%s", p->runtime_dir,
             SOCK_NAME);
    return 0;
}

void td_sup_paths_cleanup(struct td_sup_paths *p)
{
    if (p->runtime_dir[0] == '\0')
        return;
    char path[PATH_MAX + 256];
    if (!p->own_dir) {
        snprintf(path, sizeof path, "%s/%s", p->runtime_dir, SOCK_NAME);
        unlink(path);
    } else {
        /* A private directory: whatever the children left in it goes
         * (sockets, the lock file); nothing nests there. The lock goes
         * last, once the directory is gone. */
        remove_dir(p->runtime_dir);
    }
    if (p->locked)
        close(p->lock_fd);
    p->locked = false;
    p->runtime_dir[0] = '\0';
    p->endpoint[0] = '\0';
    p->own_dir = false;
}
