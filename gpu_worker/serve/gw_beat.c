/* gw_beat.c — the heartbeat thread (gw_beat.h). */
#include "gpu_worker/serve/gw_beat.h"

#if __has_include("worker.pb-c.h")
/* The generated protocol header lives in the build tree; a library target
 * without tg_proto's include directory compiles this file to nothing. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/tg_err.h"
#include "gpu_worker/serve/gw_worker.h"
#include "worker.pb-c.h"

/* Beats queued towards an unreachable router before new ones are dropped:
 * an old beat has no value once a newer one exists. */
#define BEAT_SNDHWM 4

/* Packs and sends one Heartbeat without blocking. */
static void beat_send(struct gw_beat *b)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t stalled = gw_progress_stalled_ms(b->prog, gw_progress_now_ms());
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = GW_PROTOCOL_VERSION;
    hb.seq = ++b->seq;
    hb.time_unix_ns =
        (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    hb.rank = b->rank;
    hb.pid = b->pid;
    hb.step_id = atomic_load_explicit(&b->prog->step, memory_order_acquire);
    hb.stalled_ms = stalled > UINT32_MAX ? UINT32_MAX : (uint32_t)stalled;
    Tangram__Worker__V1__WorkerMessage m =
        TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = GW_PROTOCOL_VERSION;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    uint8_t buf[128]; /* a Heartbeat envelope is under 64 bytes */
    size_t n = tangram__worker__v1__worker_message__get_packed_size(&m);
    if (n > sizeof buf) {
        b->n_dropped++;
        return;
    }
    tangram__worker__v1__worker_message__pack(&m, buf);
    if (zmq_send(b->sock, buf, n, ZMQ_DONTWAIT) == (int)n)
        b->n_sent++;
    else
        b->n_dropped++; /* not connected yet, or the queue is full */
}

static void *beat_main(void *arg)
{
    struct gw_beat *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->stop) {
        pthread_mutex_unlock(&b->mu);
        beat_send(b);
        pthread_mutex_lock(&b->mu);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += b->period_ms / 1000;
        until.tv_nsec += (long)(b->period_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!b->stop &&
               pthread_cond_timedwait(&b->cv, &b->mu, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int gw_beat_start(struct gw_beat *b, void *zctx, const char *endpoint,
                  int rank, int period_ms, const struct gw_progress *prog,
                  char *err, size_t errlen)
{
    memset(b, 0, sizeof(*b));
    if (zctx == NULL || endpoint == NULL || prog == NULL || period_ms < 1 ||
        rank < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "beat: context, endpoint, progress, a rank >= 0 "
                          "and a period >= 1 ms are required");
    b->rank = rank;
    b->period_ms = period_ms;
    b->pid = (uint32_t)getpid();
    b->prog = prog;
    b->sock = zmq_socket(zctx, ZMQ_DEALER);
    if (b->sock == NULL)
        return tg_err_set(err, errlen, TG_EIO, "beat: zmq_socket: %s",
                          zmq_strerror(errno));
    char id[32];
    int n = snprintf(id, sizeof(id), "beat-%d", rank);
    int linger = 0, hwm = BEAT_SNDHWM;
    if (zmq_setsockopt(b->sock, ZMQ_ROUTING_ID, id, (size_t)n) != 0 ||
        zmq_setsockopt(b->sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_setsockopt(b->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
        zmq_connect(b->sock, endpoint) != 0) {
        int rc = tg_err_set(err, errlen, TG_EIO, "beat: socket to '%s': %s",
                            endpoint, zmq_strerror(errno));
        zmq_close(b->sock);
        b->sock = NULL;
        return rc;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&b->mu, NULL);
    /* pthread_create orders the socket's set-up before the thread's first
     * use of it: the socket changes threads once, as ZeroMQ allows. */
    int e = pthread_create(&b->thread, NULL, beat_main, b);
    if (e != 0) {
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        zmq_close(b->sock);
        b->sock = NULL;
        return tg_err_set(err, errlen, TG_EIO, "beat: pthread_create: %s",
                          strerror(e));
    }
    b->running = 1;
    return 0;
}

void gw_beat_stop(struct gw_beat *b)
{
    if (!b->running)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL); /* orders its last use before close */
    zmq_close(b->sock);
    b->sock = NULL;
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    b->running = 0;
}

#endif
