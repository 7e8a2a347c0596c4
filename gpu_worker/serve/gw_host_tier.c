/* gw_host_tier.c — a worker rank's host tier: the slab, the FIFO of copy
 * ops and the copy thread (see gw_host_tier.h). */
#include "gpu_worker/serve/gw_host_tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "common/base/tg_hostmem.h"

struct gw_tier_job {
    struct gw_tier_job *next;
    uint64_t id;
    int to_host;
    int n;
    int32_t *dev, *host;   /* (n) */
    void *fence;           /* the backend's, consumed by the copy */
    int failed;
    char error[GW_TIER_ERROR_MAX];
};

static void job_free(struct gw_backend *be, struct gw_tier_job *j)
{
    if (j->fence != NULL)
        be->ops->tier_fence_drop(be, j->fence);
    free(j->dev);
    free(j->host);
    free(j);
}

static void signal_done(struct gw_host_tier *t)
{
    uint64_t one = 1;
    ssize_t w = write(t->efd, &one, sizeof(one));
    (void)w; /* the counter only saturates, it never blocks a reader */
}

/* Locked: pops the oldest queued job, or NULL on stop. */
static struct gw_tier_job *next_job(struct gw_host_tier *t)
{
    while (!t->stop && t->head == NULL)
        pthread_cond_wait(&t->cv, &t->mu);
    if (t->stop)
        return NULL;
    struct gw_tier_job *j = t->head;
    t->head = j->next;
    if (t->head == NULL)
        t->tail = NULL;
    j->next = NULL;
    return j;
}

static void *copy_thread(void *arg)
{
    struct gw_host_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        struct gw_tier_job *j = next_job(t);
        if (j == NULL)
            break;
        t->busy = 1;
        pthread_mutex_unlock(&t->mu);
        if (!j->failed) {
            void *fence = j->fence;
            j->fence = NULL; /* consumed, whatever happens */
            if (t->be->ops->tier_copy(t->be, t->base, j->to_host, j->dev,
                                      j->host, j->n, fence, j->error,
                                      sizeof(j->error)) != 0)
                j->failed = 1;
        }
        pthread_mutex_lock(&t->mu);
        if (!j->failed)
            t->n_copied += j->n;
        if (t->done_tail != NULL)
            t->done_tail->next = j;
        else
            t->done_head = j;
        t->done_tail = j;
        t->busy = 0;
        signal_done(t);
        pthread_cond_broadcast(&t->cv); /* a drain may wait */
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int gw_host_tier_init(struct gw_host_tier *t, struct gw_backend *be,
                      uint64_t bytes, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    t->be = be;
    t->efd = -1;
    t->page_bytes = be->page_bytes;
    int rc;
    /* The eventfd and the lists exist without a tier too: ops sent to a
     * worker without one are reported failed the same way. */
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "eventfd: %s", strerror(errno));
        goto fail;
    }
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "cannot create a mutex");
        goto fail;
    }
    if (pthread_cond_init(&t->cv, NULL) != 0) {
        pthread_mutex_destroy(&t->mu);
        rc = tg_err_set(err, errlen, TG_EIO, "cannot create a condition");
        goto fail;
    }
    t->sync_init = 1;
    if (bytes == 0)
        return 0;
    uint64_t pages = bytes / (uint64_t)be->page_bytes;
    if (pages < 1 || pages > INT32_MAX) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "--kv-host-memory %llu bytes gives %llu pages of "
                        "%lld bytes; it needs 1 .. %d", (unsigned long long)bytes,
                        (unsigned long long)pages, (long long)be->page_bytes,
                        INT32_MAX);
        goto fail;
    }
    t->n_pages = (int32_t)pages;
    size_t slab = (size_t)pages * (size_t)be->page_bytes;
    struct tg_hostmem hm;
    rc = tg_hostmem_read(&hm, err, errlen);
    if (rc == 0)
        rc = tg_hostmem_tier_check(&hm, (int64_t)slab, 1, 0, err, errlen);
    if (rc == 0)
        rc = be->ops->tier_alloc(be, slab, &t->base, err, errlen);
    if (rc != 0)
        goto fail;
    int e = pthread_create(&t->thread, NULL, copy_thread, t);
    if (e != 0) {
        rc = tg_err_set(err, errlen, TG_EIO,
                        "cannot start the host tier's copy thread: %s",
                        strerror(e));
        goto fail;
    }
    t->running = 1;
    return 0;
fail:
    gw_host_tier_free(t);
    return rc;
}

void gw_host_tier_free(struct gw_host_tier *t)
{
    if (t->be == NULL) { /* zeroed: never initialised */
        t->efd = -1;
        return;
    }
    if (t->running) {
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->thread, NULL);
    }
    for (struct gw_tier_job *lists[2] = {t->head, t->done_head}, **l = lists;
         l < lists + 2; l++)
        for (struct gw_tier_job *j = *l, *next; j != NULL; j = next) {
            next = j->next;
            job_free(t->be, j);
        }
    if (t->sync_init) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
    }
    if (t->base != NULL)
        t->be->ops->tier_release(t->be, t->base);
    if (t->efd >= 0)
        close(t->efd);
    memset(t, 0, sizeof(*t));
    t->efd = -1;
}

/* Why op ids cannot run, or NULL. */
static const char *check_ids(const struct gw_host_tier *t,
                             const uint32_t *dev, size_t n_dev,
                             const uint32_t *host, size_t n_host, char *why,
                             size_t n)
{
    if (t->n_pages == 0)
        return snprintf(why, n, "this worker has no host tier "
                        "(--kv-host-memory 0)"), why;
    if (n_dev != n_host || n_dev > INT32_MAX)
        return snprintf(why, n, "%zu device pages for %zu host pages",
                        n_dev, n_host), why;
    for (size_t i = 0; i < n_dev; i++)
        if (dev[i] >= (uint32_t)t->be->n_pages ||
            host[i] >= (uint32_t)t->n_pages)
            return snprintf(why, n, "page %u -> %u outside the pool (%d) or "
                            "the host tier (%d)", dev[i], host[i],
                            (int)t->be->n_pages, (int)t->n_pages), why;
    return NULL;
}

int gw_host_tier_submit(struct gw_host_tier *t, uint64_t id, int to_host,
                        const uint32_t *dev, size_t n_dev,
                        const uint32_t *host, size_t n_host)
{
    struct gw_tier_job *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return TG_ENOMEM;
    j->id = id;
    j->to_host = to_host;
    const char *bad = check_ids(t, dev, n_dev, host, n_host, j->error,
                                sizeof(j->error));
    if (bad != NULL) {
        j->failed = 1;
    } else {
        j->n = (int)n_dev;
        j->dev = malloc((n_dev > 0 ? n_dev : 1) * sizeof(int32_t));
        j->host = malloc((n_dev > 0 ? n_dev : 1) * sizeof(int32_t));
        if (j->dev == NULL || j->host == NULL) {
            job_free(t->be, j);
            return TG_ENOMEM;
        }
        for (size_t i = 0; i < n_dev; i++) { /* checked < INT32_MAX */
            j->dev[i] = (int32_t)dev[i];
            j->host[i] = (int32_t)host[i];
        }
        if (t->be->ops->tier_fence(t->be, &j->fence, j->error,
                                   sizeof(j->error)) != 0)
            j->failed = 1;
    }
    pthread_mutex_lock(&t->mu);
    if (t->running) {
        /* Refused ones too, so reports keep the order of submission. */
        if (t->tail != NULL)
            t->tail->next = j;
        else
            t->head = j;
        t->tail = j;
        pthread_cond_broadcast(&t->cv);
    } else {
        /* No tier, no thread: refused (check_ids), done at once. */
        TG_ASSERT(j->failed);
        if (t->done_tail != NULL)
            t->done_tail->next = j;
        else
            t->done_head = j;
        t->done_tail = j;
        signal_done(t);
    }
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int gw_host_tier_fd(const struct gw_host_tier *t)
{
    return t->efd;
}

size_t gw_host_tier_take(struct gw_host_tier *t, struct gw_tier_done *out,
                         size_t cap)
{
    if (t->efd < 0)
        return 0;
    uint64_t cnt;
    ssize_t r = read(t->efd, &cnt, sizeof(cnt)); /* resets the counter */
    (void)r;
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    while (n < cap && t->done_head != NULL) {
        struct gw_tier_job *j = t->done_head;
        t->done_head = j->next;
        if (t->done_head == NULL)
            t->done_tail = NULL;
        out[n].id = j->id;
        out[n].ok = !j->failed;
        snprintf(out[n].error, sizeof(out[n].error), "%s",
                 j->failed ? j->error : "");
        n++;
        job_free(t->be, j);
    }
    if (t->done_head != NULL)
        signal_done(t); /* more than cap: poll again */
    pthread_mutex_unlock(&t->mu);
    return n;
}

void gw_host_tier_drain(struct gw_host_tier *t)
{
    if (!t->running)
        return;
    pthread_mutex_lock(&t->mu);
    while (t->head != NULL || t->busy)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}
