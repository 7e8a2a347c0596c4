/* gw_wlink.c — a worker's ZeroMQ link to the router (see gw_wlink.h). */
#if __has_include("worker.pb-c.h")
/* The generated protocol header lives in the build tree; a library target
 * without tg_proto's include directory compiles this file to nothing. */
#include "gpu_worker/gw_wlink.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/tg_err.h"
#include "common/tg_log.h"

void gw_wlink_close(struct gw_wlink *l)
{
    if (l->sock != NULL)
        zmq_close(l->sock);
    if (l->ctx != NULL)
        zmq_ctx_term(l->ctx);
    free(l->buf);
    memset(l, 0, sizeof(*l));
}

int gw_wlink_open(struct gw_wlink *l, const char *endpoint, int rank,
                  char *err, size_t errlen)
{
    memset(l, 0, sizeof(*l));
    l->rank = rank;
    int rc;
    l->ctx = zmq_ctx_new();
    if (l->ctx == NULL)
        return tg_err_set(err, errlen, TG_EIO, "zmq_ctx_new: %s",
                          zmq_strerror(errno));
    l->sock = zmq_socket(l->ctx, ZMQ_DEALER);
    if (l->sock == NULL) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_socket: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    char id[32];
    int n = snprintf(id, sizeof(id), "rank-%d", rank);
    int linger = 0;
    if (zmq_setsockopt(l->sock, ZMQ_ROUTING_ID, id, (size_t)n) != 0 ||
        zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_setsockopt: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    if (zmq_connect(l->sock, endpoint) != 0) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "cannot connect to router endpoint '%s': %s "
                        "(expected ipc:///path or tcp://host:port)",
                        endpoint, zmq_strerror(errno));
        goto fail;
    }
    return 0;
fail:
    gw_wlink_close(l);
    return rc;
}

int gw_wlink_send(struct gw_wlink *l, GwWorkerMessage *m, char *err,
                  size_t errlen)
{
    m->version = GW_PROTOCOL_VERSION;
    size_t n = tangram__worker__v1__worker_message__get_packed_size(m);
    if (n > l->buf_cap) {
        uint8_t *b = realloc(l->buf, n);
        if (b == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM,
                              "out of memory for a %zu-byte message", n);
        l->buf = b;
        l->buf_cap = n;
    }
    tangram__worker__v1__worker_message__pack(m, l->buf);
    if (zmq_send(l->sock, l->buf, n, 0) != (int)n)
        return tg_err_set(err, errlen, TG_EIO, "zmq_send: %s",
                          zmq_strerror(errno));
    return 0;
}

void gw_wlink_msg_free(GwWorkerMessage *m)
{
    if (m != NULL)
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
}

int gw_wlink_recv(struct gw_wlink *l, int timeout_ms, GwWorkerMessage **out,
                  char *err, size_t errlen)
{
    *out = NULL;
    zmq_pollitem_t it = {.socket = l->sock, .events = ZMQ_POLLIN};
    int r = zmq_poll(&it, 1, timeout_ms);
    if (r < 0 && errno == EINTR)
        return TG_EAGAIN; /* a signal: the caller checks its stop flag */
    if (r < 0)
        return tg_err_set(err, errlen, TG_EIO, "zmq_poll: %s",
                          zmq_strerror(errno));
    if (r == 0 || !(it.revents & ZMQ_POLLIN))
        return TG_EAGAIN;
    /* Keep the last frame of a multipart message: the payload. */
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    for (;;) {
        if (zmq_msg_recv(&msg, l->sock, 0) < 0) {
            int e = errno;
            zmq_msg_close(&msg);
            return tg_err_set(err, errlen, TG_EIO, "zmq_msg_recv: %s",
                              zmq_strerror(e));
        }
        if (!zmq_msg_more(&msg))
            break;
    }
    size_t n = zmq_msg_size(&msg);
    *out = tangram__worker__v1__worker_message__unpack(
        NULL, n, (const uint8_t *)zmq_msg_data(&msg));
    zmq_msg_close(&msg);
    if (*out == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "a %zu-byte message is not a WorkerMessage", n);
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int send_heartbeat(struct gw_wlink *l, char *err, size_t errlen)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = GW_PROTOCOL_VERSION;
    hb.seq = ++l->hb_seq;
    hb.time_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    hb.rank = l->rank;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    return gw_wlink_send(l, &m, err, errlen);
}

static int send_result(struct gw_wlink *l, GwStepResult *res, char *err,
                       size_t errlen)
{
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT;
    m.result = res;
    return gw_wlink_send(l, &m, err, errlen);
}

/* Answers a plan whose envelope or body has the wrong version. */
static int reject_plan(struct gw_wlink *l, const GwBatchPlan *p,
                       uint32_t version, char *err, size_t errlen)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "protocol version %u, this worker speaks %u",
             version, GW_PROTOCOL_VERSION);
    GwStepResult res = TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    res.version = GW_PROTOCOL_VERSION;
    res.step_id = p->step_id;
    res.rank = (uint32_t)l->rank;
    res.ok = 0;
    res.error = msg;
    return send_result(l, &res, err, errlen);
}

/* Joins the group of a CommSetup and answers CommReady. Returns -1 to
 * keep serving, else the exit status. */
static int on_comm_setup(struct gw_wlink *l, struct gw_worker *w,
                         const GwCommSetup *cs)
{
    char why[512] = "", err[256];
    int rc = gw_worker_comm_join(w, cs, why, sizeof(why));
    GwCommReady cr = TANGRAM__WORKER__V1__COMM_READY__INIT;
    cr.version = GW_PROTOCOL_VERSION;
    cr.rank = (uint32_t)l->rank;
    cr.ok = rc == 0;
    cr.error = rc == 0 ? (char *)"" : why;
    if (rc == 0)
        log_info("joined the communicator group (%s, world size %d)",
                 w->world_size > 1 ? w->comm.name : "one rank",
                 w->world_size);
    else
        log_err("cannot join the communicator group: %s", why);
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_READY;
    m.comm_ready = &cr;
    if (gw_wlink_send(l, &m, err, sizeof(err)) != 0) {
        log_err("%s", err);
        return GW_WLINK_EXIT_ERROR;
    }
    /* A rank that cannot join is useless to its group: leave, so the
     * supervisor restarts the group (the router saw the reason). */
    return rc == 0 ? -1 : GW_WLINK_EXIT_COMM;
}

/* Handles one message from the router. Returns -1 to keep serving, else
 * the exit status. */
static int handle(struct gw_wlink *l, struct gw_worker *w, GwWorkerMessage *m)
{
    char err[256];
    int rc;
    const GwBatchPlan *plan =
        m->body_case == TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN ? m->plan
                                                                       : NULL;
    uint32_t version = m->version;
    if (version == GW_PROTOCOL_VERSION && plan != NULL)
        version = plan->version;
    if (version != GW_PROTOCOL_VERSION) {
        log_err("message with protocol version %u (body %d), this worker "
                "speaks %u", version, (int)m->body_case, GW_PROTOCOL_VERSION);
        if (plan == NULL)
            return GW_WLINK_EXIT_PROTOCOL;
        rc = reject_plan(l, plan, version, err, sizeof(err));
        if (rc != 0) {
            log_err("%s", err);
            return GW_WLINK_EXIT_ERROR;
        }
        return -1;
    }
    switch (m->body_case) {
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN: {
        GwStepResult res;
        rc = gw_worker_step(w, plan, &res);
        if (rc != 0)
            log_err("step %llu: %s", (unsigned long long)plan->step_id,
                    res.error);
        else
            log_debug("step %llu: %zu entries, %zu sampled, %.3f ms",
                      (unsigned long long)plan->step_id, plan->n_entries,
                      res.n_sampled, res.step_seconds * 1e3);
        if (send_result(l, &res, err, sizeof(err)) != 0) {
            log_err("%s", err);
            return GW_WLINK_EXIT_ERROR;
        }
        return -1;
    }
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN:
        log_info("shutdown from the router (%s%s)",
                 m->shutdown->reason != NULL ? m->shutdown->reason : "",
                 m->shutdown->drain ? ", drain" : "");
        return GW_WLINK_EXIT_OK;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT:
        log_debug("router heartbeat %llu",
                  (unsigned long long)m->heartbeat->seq);
        return -1;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_SETUP:
        return on_comm_setup(l, w, m->comm_setup);
    default:
        log_warn("ignoring a message of body %d from the router",
                 (int)m->body_case);
        return -1;
    }
}

int gw_wlink_serve(struct gw_wlink *l, struct gw_worker *w,
                   const struct gw_wlink_opts *o)
{
    char err[256];
    int hb = o->heartbeat_ms > 0 ? o->heartbeat_ms : 1000;
    int64_t timeout = o->router_timeout_ms > 0 ? o->router_timeout_ms
                                               : 10 * (int64_t)hb;
    GwHello hello;
    gw_worker_hello(w, &hello);
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO;
    m.hello = &hello;
    if (gw_wlink_send(l, &m, err, sizeof(err)) != 0) {
        log_err("%s", err);
        return GW_WLINK_EXIT_ERROR;
    }
    log_info("hello sent: %u pages of %llu bytes, %d slots%s%s",
             hello.pages_total,
             (unsigned long long)hello.layout->page_bytes, w->max_slots,
             w->rank == 0 ? ", comm group " : "",
             w->rank == 0 ? w->comm_id : "");
    int64_t last_rx = now_ms(), next_hb = last_rx + hb;
    int64_t setup_ms = o->comm_setup_timeout_ms > 0
                           ? o->comm_setup_timeout_ms
                           : GW_WLINK_SETUP_TIMEOUT_MS_DEFAULT;
    int64_t setup_by = last_rx + setup_ms;
    for (;;) {
        if (o->stop != NULL && *o->stop) {
            log_info("stop requested");
            return GW_WLINK_EXIT_OK;
        }
        int64_t now = now_ms();
        if (!w->joined && now >= setup_by) {
            log_err("no CommSetup from the router within %lld ms of the "
                    "Hello (are all %d ranks up?); exiting",
                    (long long)setup_ms, w->world_size);
            return GW_WLINK_EXIT_COMM;
        }
        if (now - last_rx >= timeout) {
            log_err("no message from the router for %lld ms; exiting",
                    (long long)(now - last_rx));
            return GW_WLINK_EXIT_TIMEOUT;
        }
        if (now >= next_hb) {
            if (send_heartbeat(l, err, sizeof(err)) != 0) {
                log_err("%s", err);
                return GW_WLINK_EXIT_ERROR;
            }
            next_hb = now + hb;
        }
        int64_t wait = next_hb - now;
        if (last_rx + timeout - now < wait)
            wait = last_rx + timeout - now;
        if (!w->joined && setup_by - now < wait)
            wait = setup_by - now;
        if (wait < 0)
            wait = 0;
        GwWorkerMessage *in;
        int rc = gw_wlink_recv(l, (int)wait, &in, err, sizeof(err));
        if (rc == TG_EAGAIN)
            continue;
        if (rc == TG_EIO) {
            log_err("%s", err);
            return GW_WLINK_EXIT_ERROR;
        }
        last_rx = now_ms();
        if (rc == TG_EFORMAT) {
            log_err("unparsable message from the router: %s", err);
            return GW_WLINK_EXIT_PROTOCOL;
        }
        int status = handle(l, w, in);
        gw_wlink_msg_free(in);
        if (status >= 0)
            return status;
    }
}

#endif
