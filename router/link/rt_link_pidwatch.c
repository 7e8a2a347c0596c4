/*
 * rt_link_pidwatch.c — the router's watch of same-host worker processes
 * through pidfds (rt_link_internal.h): a killed worker is noticed the
 * moment its process exits instead of after the heartbeat deadline, and a
 * rank declared dead while its process lives on is killed so that the
 * supervisor restarts it. The router loop's thread only.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/base/tg_log.h"
#include "router/link/rt_link_internal.h"

static void pidwatch_closed(uv_handle_t *h)
{
    struct rt_link_pidwatch *pw = h->data;
    close(pw->fd);
    free(pw);
}

void rt_link__pidwatch_stop(struct rt_link *link, int rank)
{
    struct rt_link_pidwatch *pw = link->ranks[rank].pw;
    if (pw == NULL)
        return;
    link->ranks[rank].pw = NULL;
    pw->link = NULL;
    uv_close((uv_handle_t *)&pw->poll, pidwatch_closed);
}

static void pidwatch_cb(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    struct rt_link_pidwatch *pw = h->data;
    struct rt_link *link = pw->link;
    if (link == NULL)
        return;
    int rank = pw->rank;
    rt_link__pidwatch_stop(link, rank);
    rt_link__declare_exited(link, rank);
}

void rt_link__pidwatch_start(struct rt_link *link, int rank, uint32_t pid)
{
    rt_link__pidwatch_stop(link, rank);
    /* Only another process of this host: a worker never shares the
     * router's pid or is its parent (in-process fakes in tests do). */
    if (pid == 0 || (pid_t)pid == getpid() || (pid_t)pid == getppid() ||
        strncmp(link->endpoint, "ipc://", 6) != 0)
        return;
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0)
        return;
    struct rt_link_pidwatch *pw = calloc(1, sizeof(*pw));
    if (pw == NULL || uv_poll_init(link->loop, &pw->poll, fd) != 0) {
        free(pw);
        close(fd);
        return;
    }
    pw->link = link;
    pw->rank = rank;
    pw->fd = fd;
    pw->poll.data = pw;
    uv_poll_start(&pw->poll, UV_READABLE, pidwatch_cb);
    link->ranks[rank].pw = pw;
#endif
}

void rt_link__pidwatch_kill(struct rt_link *link, int rank)
{
#ifdef SYS_pidfd_send_signal
    struct rt_link_pidwatch *pw = link->ranks[rank].pw;
    if (pw != NULL && syscall(SYS_pidfd_send_signal, pw->fd, SIGKILL, NULL, 0) == 0)
        log_warn("link: killed the process of rank %d (pid %" PRIu32 ")", rank,
                 link->ranks[rank].pid);
#else
    (void)link;
    (void)rank;
#endif
}
