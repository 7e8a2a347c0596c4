/*
 * rt_link.c — the router's ZeroMQ link to the workers, on the libuv loop.
 * See rt_link.h for the contract; the protocol is proto/worker.proto.
 *
 * Step accounting per rank: `owed` lists, oldest first, the step ids sent
 * to the rank and not yet answered. ZeroMQ keeps the order of messages
 * between two peers, so the only valid answer is owed[0]; anything else
 * means a message was lost, duplicated or invented, and the rank is
 * declared dead. Step ids may have gaps (the scheduler numbers empty
 * steps too). Normally a rank owes at most the step in flight; a step
 * completed early (another rank died) stays owed by the survivors until
 * their answers come and are dropped. A Hello clears the list: a
 * restarted worker owes nothing.
 */
#include "router/link/rt_link.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/link/rt_link_internal.h"
#include "worker.pb-c.h"

#define UNIX_PATH_MAX_BYTES 107 /* sun_path is 108 bytes with the NUL */

static void rank_identity(int rank, char *buf, size_t n)
{
    snprintf(buf, n, "rank-%d", rank);
}

/* Packs `msg` and sends it to the peer with routing id `id`. Returns 0 or
 * TG_EIO / TG_ENOMEM with detail in err. Never blocks. */
static int send_to(struct rt_link *link, const void *id, size_t idlen,
                   const wmsg_t *msg, char *err, size_t errlen)
{
    size_t n = tangram__worker__v1__worker_message__get_packed_size(msg);
    uint8_t stackbuf[512];
    uint8_t *buf = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!buf)
        return tg_err_set(err, errlen, TG_ENOMEM, "no memory for %zu bytes",
                          n);
    tangram__worker__v1__worker_message__pack(msg, buf);
    int rc = 0;
    if (zmq_send(link->sock, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(link->sock, buf, n, ZMQ_DONTWAIT) < 0)
        rc = tg_err_set(err, errlen, TG_EIO, "send failed: %s",
                        zmq_strerror(errno));
    if (buf != stackbuf)
        free(buf);
    return rc;
}

int rt_link__send_rank(struct rt_link *link, int rank, const wmsg_t *msg,
                       char *err, size_t errlen)
{
    char id[32];
    rank_identity(rank, id, sizeof id);
    return send_to(link, id, strlen(id), msg, err, errlen);
}

static void shutdown_msg(wmsg_t *m, Tangram__Worker__V1__Shutdown *sd,
                         const char *reason, int drain)
{
    tangram__worker__v1__worker_message__init(m);
    tangram__worker__v1__shutdown__init(sd);
    sd->version = PROTO_V1;
    sd->reason = (char *)(uintptr_t)(reason ? reason : "");
    sd->drain = drain ? 1 : 0;
    m->version = PROTO_V1;
    m->body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN;
    m->shutdown = sd;
}

/* Best effort: a peer that is gone cannot be told anything. */
static void send_shutdown_id(struct rt_link *link, const void *id,
                             size_t idlen, const char *reason, int drain)
{
    wmsg_t m;
    Tangram__Worker__V1__Shutdown sd;
    shutdown_msg(&m, &sd, reason, drain);
    char e[128];
    if (send_to(link, id, idlen, &m, e, sizeof e) < 0)
        log_debug("link: shutdown to %.*s not delivered: %s", (int)idlen,
                  (const char *)id, e);
}

static void send_shutdown(struct rt_link *link, int rank, const char *reason,
                          int drain)
{
    char id[32];
    rank_identity(rank, id, sizeof id);
    send_shutdown_id(link, id, strlen(id), reason, drain);
    link->ranks[rank].shutdown_sent = 1;
}

static void send_heartbeat(struct rt_link *link, int rank)
{
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    hb.version = PROTO_V1;
    hb.seq = ++link->hb_seq;
    hb.time_unix_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    hb.rank = -1;
    m.version = PROTO_V1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    char e[128];
    /* A failure here needs no action: the rank's deadline decides. */
    if (rt_link__send_rank(link, rank, &m, e, sizeof e) < 0)
        log_debug("link: heartbeat to rank %d: %s", rank, e);
}

static void kick_cb(uv_idle_t *h);


/* Schedules a drain (and pending deaths) on the next loop iteration: a
 * send may have consumed the ZMQ_FD edge of a message that arrived. */
void rt_link__kick(struct rt_link *link)
{
    if (link->kicking || link->closed)
        return;
    link->kicking = 1;
    uv_idle_start(&link->kick, kick_cb);
}

/* ---- steps and deaths -------------------------------------------------- */

/* Completes the step in flight: validates rank 0's tokens when ok, then
 * calls on_result once. The link may be closed when this returns. */
static void complete_step(struct rt_link *link, int ok, const char *error)
{
    wmsg_t *r0 = link->rank0_result;
    link->rank0_result = NULL;
    char verr[512] = "";
    int32_t n = link->n_entries;
    for (int32_t i = 0; i < n; i++) {
        struct rt_link_token *t = &link->res_tokens[i];
        memset(t, 0, sizeof *t);
        t->sampled = link->entry_sample[i];
        t->slot = link->entry_slot[i];
        t->token = -1;
        link->res_ids[i] = -1;
    }
    if (ok) {
        const Tangram__Worker__V1__StepResult *sr = r0 ? r0->result : NULL;
        int32_t want = 0, got = 0;
        for (int32_t i = 0; i < n; i++)
            want += link->entry_sample[i];
        for (size_t k = 0; sr && k < sr->n_sampled && !verr[0]; k++) {
            const Tangram__Worker__V1__SampledToken *st = sr->sampled[k];
            int32_t i = 0;
            while (i < n && !(link->entry_sample[i] &&
                              link->entry_slot[i] == st->slot))
                i++;
            if (i == n || link->res_tokens[i].token >= 0)
                snprintf(verr, sizeof verr,
                         "rank 0: token for slot %" PRIu32
                         ", which was not to be sampled (or twice)",
                         st->slot);
            else if (st->token_id > INT32_MAX ||
                     (link->cfg.layout.vocab_size &&
                      st->token_id >= link->cfg.layout.vocab_size))
                snprintf(verr, sizeof verr,
                         "rank 0: token %" PRIu32 " for slot %" PRIu32
                         " outside the vocabulary",
                         st->token_id, st->slot);
            else if (st->n_top_ids != st->n_top_logprobs)
                snprintf(verr, sizeof verr,
                         "rank 0: slot %" PRIu32 " has %zu top ids but %zu "
                         "top logprobs",
                         st->slot, st->n_top_ids, st->n_top_logprobs);
            else {
                struct rt_link_token *t = &link->res_tokens[i];
                t->token = (int32_t)st->token_id;
                t->logprob = st->logprob;
                t->n_top = st->n_top_ids;
                t->top_ids = st->top_ids;
                t->top_logprobs = st->top_logprobs;
                link->res_ids[i] = t->token;
                got++;
            }
        }
        for (size_t k = 0; sr && k < sr->n_slot_errors && !verr[0]; k++) {
            const Tangram__Worker__V1__SlotError *se = sr->slot_errors[k];
            int32_t i = 0;
            while (i < n && !(link->entry_sample[i] &&
                              link->entry_slot[i] == se->slot))
                i++;
            if (i == n || link->res_tokens[i].token >= 0 ||
                link->res_tokens[i].error != NULL)
                snprintf(verr, sizeof verr,
                         "rank 0: slot error for slot %" PRIu32
                         ", which was not to be sampled (or answered twice)",
                         se->slot);
            else {
                link->res_tokens[i].error =
                    se->error != NULL && se->error[0] ? se->error
                                                      : "sampling failed";
                got++;
            }
        }
        if (!verr[0] && got != want)
            snprintf(verr, sizeof verr,
                     "rank 0 returned %d of %d sampled tokens", (int)got,
                     (int)want);
        if (!verr[0])
            rt_link__plp_result(link, sr, verr, sizeof verr);
        if (verr[0]) {
            ok = 0;
            error = verr;
            for (int32_t i = 0; i < n; i++) {
                link->res_tokens[i].token = -1;
                link->res_tokens[i].n_top = 0;
                link->res_tokens[i].error = NULL;
                link->res_tokens[i].plp = NULL;
                link->res_ids[i] = -1;
            }
        }
    }
    struct rt_link_result res = {
        .step_id = link->inflight,
        .ok = ok,
        .error = ok ? "" : error,
        .n_entries = n,
        .entries = link->res_tokens,
        .tokens = link->res_ids,
        .step_seconds = link->step_seconds,
        .host_seconds = link->host_seconds,
    };
    if (ok)
        rt_link__heads_result(link, &res);
    if (!ok)
        log_warn("link: step %" PRIu64 " failed: %s", res.step_id,
                 res.error);
    link->inflight = 0;
    link->n_answered = 0;
    link->failed = 0;
    link->n_results++;
    link->cfg.on_result(link->cfg.ud, &res);
    if (r0)
        tangram__worker__v1__worker_message__free_unpacked(r0, NULL);
}

/* Declares an alive rank dead: Shutdown to it (unless `tell` is 0: its
 * routing id already belongs to a new incarnation), the step in flight
 * fails, then on_dead. The link may be closed when this returns. */
static void declare_dead(struct rt_link *link, int rank, const char *reason,
                         int tell)
{
    struct rt_link_rank *k = &link->ranks[rank];
    if (k->state != RANK_ALIVE)
        return;
    k->state = RANK_DEAD;
    k->kill_pending = 0;
    k->setup_sent = 0;
    k->comm_ready = 0;
    link->ready = 0;
    link->n_deaths++;
    snprintf(link->last_error, sizeof link->last_error, "rank %d died: %s",
             rank, reason);
    log_err("link: %s", link->last_error);
    if (tell) {
        send_shutdown(link, rank, reason, 0);
        rt_link__pidwatch_kill(link, rank);
    }
    if (link->inflight) {
        char e[256];
        snprintf(e, sizeof e, "rank %d died: %s", rank, reason);
        complete_step(link, 0, e);
        if (link->closed)
            return;
    }
    if (link->cfg.on_dead)
        link->cfg.on_dead(link->cfg.ud, rank);
    if (!link->cfg.shared_fate)
        return;
    /* The survivors would wait in an all-reduce for a peer that is gone
     * (their own timeout ends that too, but only after seconds): end the
     * whole group now. Each of them recurses at most once more, finding
     * no alive rank left. */
    char why[200];
    snprintf(why, sizeof why, "rank %d of its tensor-parallel group died",
             rank);
    for (int r = 0; r < link->cfg.world_size && !link->closed; r++)
        if (link->ranks[r].state == RANK_ALIVE)
            declare_dead(link, r, why, 1);
}

void rt_link__declare_dead(struct rt_link *link, int rank, const char *reason)
{
    declare_dead(link, rank, reason, 1);
}

void rt_link__declare_exited(struct rt_link *link, int rank)
{
    declare_dead(link, rank, "its process exited", 0);
}

/* ---- receiving --------------------------------------------------------- */

/* A message from a rank that is not alive: tell it once to go away, so a
 * stray worker (refused, declared dead, or never registered) exits and
 * its supervisor starts a clean one. */
static void stray(struct rt_link *link, int rank, const char *what)
{
    struct rt_link_rank *k = &link->ranks[rank];
    log_debug("link: %s from rank %d, which is not registered", what, rank);
    if (!k->shutdown_sent)
        send_shutdown(link, rank, "not registered: send Hello first", 0);
}

static int check_hello(const struct rt_link *link, int rank,
                       const Tangram__Worker__V1__Hello *h, char *why,
                       size_t n)
{
    const struct rt_link_layout *e = &link->cfg.layout;
    const Tangram__Worker__V1__LayoutSummary *l = h->layout;
    if (link->shut)
        return snprintf(why, n, "router is shutting down"), -1;
    if (h->version != PROTO_V1)
        return snprintf(why, n, "protocol version %" PRIu32 ", expected %d",
                        h->version, (int)PROTO_V1), -1;
    if (h->rank != (uint32_t)rank)
        return snprintf(why, n, "Hello says rank %" PRIu32
                        " on the connection of rank %d", h->rank, rank), -1;
    if (h->world_size != (uint32_t)link->cfg.world_size)
        return snprintf(why, n, "world_size %" PRIu32 ", expected %d",
                        h->world_size, link->cfg.world_size), -1;
    if (!l)
        return snprintf(why, n, "Hello without a layout"), -1;
#define CHECK_FIELD(f, ef)                                                 \
    if (l->f != e->ef)                                                     \
        return snprintf(why, n, #f " %" PRIu32 ", expected %" PRIu32,      \
                        l->f, e->ef), -1;
    CHECK_FIELD(num_layers, num_layers)
    CHECK_FIELD(groups_per_layer, groups_per_layer)
    CHECK_FIELD(heads_per_group, heads_per_group)
    CHECK_FIELD(page_size, page_size)
    CHECK_FIELD(head_dim, head_dim)
    CHECK_FIELD(vocab_size, vocab_size)
#undef CHECK_FIELD
    if (link->per_head >= 0 && (int)l->per_head_lens != link->per_head)
        return snprintf(why, n, "per_head_lens %d, the group's is %d",
                        (int)l->per_head_lens, link->per_head), -1;
    if (h->pages_total < e->pages_total)
        return snprintf(why, n, "pages_total %" PRIu32
                        ", the router counts %" PRIu32,
                        h->pages_total, e->pages_total), -1;
    if (h->host_pages_total < e->host_pages_total)
        return snprintf(why, n, "host_pages_total %" PRIu32
                        ", the router counts %" PRIu32 " (--kv-host-memory)",
                        h->host_pages_total, e->host_pages_total), -1;
    if (rank == 0 && h->comm_id.len > RT_LINK_COMM_ID_MAX)
        return snprintf(why, n, "comm_id of %zu bytes (at most %d)",
                        h->comm_id.len, RT_LINK_COMM_ID_MAX), -1;
    if (rank == 0 && h->comm_id.len == 0 && link->cfg.world_size > 1)
        return snprintf(why, n, "rank 0 names no communicator group "
                        "(comm_id) for its %d ranks", link->cfg.world_size),
               -1;
    return 0;
}

static void on_hello(struct rt_link *link, int rank,
                     const Tangram__Worker__V1__Hello *h)
{
    struct rt_link_rank *k = &link->ranks[rank];
    char why[200];
    int bad = check_hello(link, rank, h, why, sizeof why);
    if (k->state == RANK_ALIVE && (!link->shut || link->inflight)) {
        /* It restarted: whatever it held (KV, steps) is gone. Its routing
         * id now names the new incarnation, so no Shutdown. */
        declare_dead(link, rank, "restarted (new Hello)", 0);
        if (link->closed)
            return;
    }
    if (bad) {
        link->n_refused++;
        snprintf(link->last_error, sizeof link->last_error,
                 "rank %d refused: %s", rank, why);
        log_err("link: %s", link->last_error);
        k->state = k->state == RANK_DEAD ? RANK_DEAD : RANK_DOWN;
        send_shutdown(link, rank, why, 0);
        return;
    }
    k->state = RANK_ALIVE;
    k->last_seen = uv_now(link->loop);
    k->n_owed = 0;
    k->pid = h->pid;
    k->pages_total = h->pages_total;
    k->host_pages = h->host_pages_total;
    k->page_bytes = h->layout->page_bytes;
    link->per_head = h->layout->per_head_lens ? 1 : 0;
    k->shutdown_sent = 0;
    k->kill_pending = 0;
    k->setup_sent = 0;
    k->comm_ready = 0;
    if (rank == 0) {
        if (h->comm_id.len > 0) /* data may be NULL when empty */
            memcpy(link->comm_id, h->comm_id.data, h->comm_id.len);
        link->comm_id_len = h->comm_id.len;
        snprintf(link->comm_kind, sizeof link->comm_kind, "%s",
                 h->comm_kind ? h->comm_kind : "");
    }
    rt_link__pidwatch_start(link, rank, h->pid);
    log_info("link: rank %d (pid %" PRIu32 ", %" PRIu32 " pages) is up", rank,
             h->pid, h->pages_total);
    send_heartbeat(link, rank); /* the worker's sign that it was accepted */
    rt_link__advance_group(link);
}

/* Takes ownership of `m`. */
static void on_step_result(struct rt_link *link, int rank, wmsg_t *m)
{
    struct rt_link_rank *k = &link->ranks[rank];
    const Tangram__Worker__V1__StepResult *sr = m->result;
    char why[200];
    if (sr->version != PROTO_V1 || sr->rank != (uint32_t)rank) {
        snprintf(why, sizeof why,
                 "StepResult with version %" PRIu32 " and rank %" PRIu32,
                 sr->version, sr->rank);
        goto protocol;
    }
    if (k->n_owed == 0 || sr->step_id != k->owed[0]) {
        if (k->n_owed == 0)
            snprintf(why, sizeof why,
                     "answered step %" PRIu64 " but owes none", sr->step_id);
        else
            snprintf(why, sizeof why,
                     "answered step %" PRIu64 ", expected step %" PRIu64,
                     sr->step_id, k->owed[0]);
        goto protocol;
    }
    k->n_owed--;
    memmove(k->owed, k->owed + 1, (size_t)k->n_owed * sizeof *k->owed);
    if (sr->step_id != link->inflight) {
        log_debug("link: rank %d answered abandoned step %" PRIu64, rank,
                  sr->step_id);
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
        return;
    }
    link->n_answered++;
    if (sr->step_seconds > link->step_seconds)
        link->step_seconds = sr->step_seconds;
    if (sr->host_seconds > link->host_seconds)
        link->host_seconds = sr->host_seconds;
    if (!sr->ok && !link->failed) {
        link->failed = 1;
        snprintf(link->step_error, sizeof link->step_error, "rank %d: %s",
                 rank, sr->error && sr->error[0] ? sr->error : "failed");
    } else if (sr->ok && !link->failed &&
               rt_link__collect_heads(link, rank, sr, why, sizeof why)) {
        link->failed = 1; /* malformed: the step fails like a !ok one */
        snprintf(link->step_error, sizeof link->step_error, "rank %d: %s",
                 rank, why);
    }
    if (rank == 0) {
        TG_ASSERT(link->rank0_result == NULL);
        link->rank0_result = m;
    } else {
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
    }
    if (link->n_answered == link->cfg.world_size)
        complete_step(link, !link->failed, link->step_error);
    return;
protocol:
    tangram__worker__v1__worker_message__free_unpacked(m, NULL);
    declare_dead(link, rank, why, 1);
}

/* Returns the rank named by routing id "rank-<r>" (the worker's main
 * connection) or "beat-<r>" (its heartbeat thread's; *beat set to 1), or
 * -1. */
static int parse_identity(const struct rt_link *link, const char *id,
                          size_t n, int *beat)
{
    *beat = n >= 5 && memcmp(id, "beat-", 5) == 0;
    if (n < 6 || n > 12 || (!*beat && memcmp(id, "rank-", 5) != 0))
        return -1;
    long r = 0;
    for (size_t i = 5; i < n; i++) {
        if (id[i] < '0' || id[i] > '9' || (i == 5 && id[i] == '0' && n > 6))
            return -1;
        r = r * 10 + (id[i] - '0');
    }
    return r < link->cfg.world_size ? (int)r : -1;
}

/* A Heartbeat of alive rank `rank` (either connection): records what it
 * says of the compute thread and declares the rank dead when that thread
 * has made no progress for longer than stall_ms. */
static void on_heartbeat(struct rt_link *link, int rank,
                         const Tangram__Worker__V1__Heartbeat *hb)
{
    struct rt_link_rank *k = &link->ranks[rank];
    k->busy_step = hb->step_id;
    k->stalled_ms = hb->stalled_ms;
    if (hb->stalled_ms <= link->cfg.stall_ms)
        return;
    char why[160];
    if (hb->step_id != 0)
        snprintf(why, sizeof why,
                 "no progress for %" PRIu32 " ms in step %" PRIu64
                 " (stall deadline %" PRIu32 " ms): its compute thread is "
                 "wedged", hb->stalled_ms, hb->step_id, link->cfg.stall_ms);
    else
        snprintf(why, sizeof why,
                 "its main thread made no progress for %" PRIu32
                 " ms between steps (stall deadline %" PRIu32 " ms)",
                 hb->stalled_ms, link->cfg.stall_ms);
    declare_dead(link, rank, why, 1);
}

/* A message on a beat connection: a Heartbeat of the incarnation whose
 * Hello was accepted keeps the rank alive; anything else is dropped
 * without an answer (nothing is ever sent to a beat connection, and a
 * stray beat's process is told to go through its main connection). */
static void handle_beat(struct rt_link *link, int rank, const uint8_t *data,
                        size_t len)
{
    struct rt_link_rank *k = &link->ranks[rank];
    wmsg_t *m = tangram__worker__v1__worker_message__unpack(NULL, len, data);
    if (m == NULL || m->version != PROTO_V1 ||
        m->body_case != TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT ||
        m->heartbeat->rank != rank) {
        log_debug("link: malformed message on the beat connection of rank "
                  "%d dropped", rank);
    } else if (k->state == RANK_ALIVE && m->heartbeat->pid == k->pid) {
        k->last_seen = uv_now(link->loop);
        on_heartbeat(link, rank, m->heartbeat);
    }
    if (m != NULL)
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
}

static void handle(struct rt_link *link, const char *id, size_t idlen,
                   const uint8_t *data, size_t len)
{
    int beat = 0;
    int rank = parse_identity(link, id, idlen, &beat);
    if (rank >= 0 && beat) {
        handle_beat(link, rank, data, len);
        return;
    }
    wmsg_t *m = tangram__worker__v1__worker_message__unpack(NULL, len, data);
    if (rank < 0) {
        /* Not one of our ranks: a Hello is refused so the worker exits. */
        if (m && m->body_case ==
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO) {
            link->n_refused++;
            snprintf(link->last_error, sizeof link->last_error,
                     "peer '%.*s' refused: not a rank of a world of %d",
                     (int)(idlen > 40 ? 40 : idlen), id,
                     link->cfg.world_size);
            log_err("link: %s", link->last_error);
            send_shutdown_id(link, id, idlen, "unknown rank", 0);
        } else {
            log_warn("link: message from unknown peer '%.*s' dropped",
                     (int)(idlen > 40 ? 40 : idlen), id);
        }
        if (m)
            tangram__worker__v1__worker_message__free_unpacked(m, NULL);
        return;
    }
    struct rt_link_rank *k = &link->ranks[rank];
    if (k->state == RANK_ALIVE)
        k->last_seen = uv_now(link->loop);
    char why[160];
    if (!m || m->version != PROTO_V1) {
        if (m)
            snprintf(why, sizeof why, "message of protocol version %" PRIu32,
                     m->version);
        else
            snprintf(why, sizeof why, "unparsable message (%zu bytes)", len);
        if (m)
            tangram__worker__v1__worker_message__free_unpacked(m, NULL);
        if (k->state == RANK_ALIVE)
            declare_dead(link, rank, why, 1);
        else
            stray(link, rank, why);
        return;
    }
    switch (m->body_case) {
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO:
        on_hello(link, rank, m->hello);
        break;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT:
        if (k->state != RANK_ALIVE)
            stray(link, rank, "heartbeat");
        else
            on_heartbeat(link, rank, m->heartbeat);
        break;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT:
        if (k->state != RANK_ALIVE) {
            stray(link, rank, "step result");
            break;
        }
        on_step_result(link, rank, m);
        return; /* ownership taken */
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_READY:
        if (k->state != RANK_ALIVE)
            stray(link, rank, "CommReady");
        else
            rt_link__on_comm_ready(link, rank, m->comm_ready);
        break;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_TIER_REPORT:
        if (k->state != RANK_ALIVE)
            stray(link, rank, "TierReport");
        else
            rt_link__on_tier_report(link, rank, m->tier_report);
        break;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_REPORT:
        if (k->state != RANK_ALIVE)
            stray(link, rank, "GrammarReport");
        else
            rt_link__on_grammar_report(link, rank, m->grammar_report);
        break;
    default:
        snprintf(why, sizeof why, "unexpected message (body %d)",
                 (int)m->body_case);
        if (k->state == RANK_ALIVE)
            declare_dead(link, rank, why, 1);
        else
            stray(link, rank, why);
        break;
    }
    tangram__worker__v1__worker_message__free_unpacked(m, NULL);
}

/* Receives until the socket would block (ZMQ_FD is edge-triggered). */
static void drain(struct rt_link *link)
{
    while (!link->closed) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, link->sock, ZMQ_DONTWAIT) < 0) {
            int e = errno;
            zmq_msg_close(&id);
            if (e == EINTR)
                continue;
            if (e != EAGAIN)
                log_err("link: receive failed: %s", zmq_strerror(e));
            break;
        }
        if (!zmq_msg_more(&id)) {
            zmq_msg_close(&id);
            continue; /* an empty envelope: nothing to do */
        }
        zmq_msg_init(&body);
        int rc = zmq_msg_recv(&body, link->sock, ZMQ_DONTWAIT);
        /* Parts of one message arrive together; extra parts are junk. */
        while (rc >= 0 && zmq_msg_more(&body)) {
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            rc = zmq_msg_recv(&extra, link->sock, ZMQ_DONTWAIT);
            zmq_msg_close(&extra);
            if (rc >= 0 && !zmq_msg_more(&extra))
                break;
        }
        if (rc >= 0)
            handle(link, zmq_msg_data(&id), zmq_msg_size(&id),
                   zmq_msg_data(&body), zmq_msg_size(&body));
        zmq_msg_close(&body);
        zmq_msg_close(&id);
    }
}

/* ---- loop callbacks ---------------------------------------------------- */

static void poll_cb(uv_poll_t *h, int status, int events)
{
    (void)events;
    struct rt_link *link = h->data;
    if (status < 0)
        log_err("link: poll error: %s", uv_strerror(status));
    drain(link);
}

static void kick_cb(uv_idle_t *h)
{
    struct rt_link *link = h->data;
    uv_idle_stop(h);
    link->kicking = 0;
    for (int r = 0; r < link->cfg.world_size && !link->closed; r++)
        if (link->ranks[r].kill_pending) {
            char why[160];
            memcpy(why, link->ranks[r].kill_reason, sizeof why);
            link->ranks[r].kill_pending = 0;
            declare_dead(link, r, why, 1);
        }
    drain(link);
}

static void timer_cb(uv_timer_t *h)
{
    struct rt_link *link = h->data;
    /* Messages that queued while the loop was busy count first. */
    drain(link);
    uint64_t now = uv_now(link->loop);
    int beat = now >= link->next_beat;
    if (beat)
        link->next_beat = now + link->cfg.heartbeat_ms;
    for (int r = 0; r < link->cfg.world_size && !link->closed; r++) {
        struct rt_link_rank *k = &link->ranks[r];
        if (k->state != RANK_ALIVE)
            continue;
        /* After shutdown only a step in flight still needs the deadline:
         * workers leaving on our Shutdown are not deaths. */
        if (now - k->last_seen > link->cfg.dead_ms &&
            (!link->shut || link->inflight)) {
            char why[96];
            snprintf(why, sizeof why, "no message for %" PRIu64 " ms",
                     now - k->last_seen);
            declare_dead(link, r, why, 1);
            continue;
        }
        if (k->setup_sent && !k->comm_ready && !link->shut &&
            now - k->setup_at > link->cfg.comm_setup_ms) {
            char why[96];
            snprintf(why, sizeof why,
                     "no CommReady within %" PRIu32 " ms of its CommSetup",
                     link->cfg.comm_setup_ms);
            declare_dead(link, r, why, 1);
            continue;
        }
        if (!link->shut && beat)
            send_heartbeat(link, r);
    }
    if (!link->closed)
        drain(link);
}

static void close_cb(uv_handle_t *h)
{
    struct rt_link *link = h->data;
    link->n_handles--;
}

/* ---- public API -------------------------------------------------------- */

int rt_link_default_endpoint(const char *runtime_dir, char *out,
                             size_t outlen, char *err, size_t errlen)
{
    const char *dir = runtime_dir ? runtime_dir : RT_LINK_RUNTIME_DIR_DEFAULT;
    size_t path = strlen(dir) + 1 + strlen(RT_LINK_SOCKET_NAME);
    if (path > UNIX_PATH_MAX_BYTES)
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "socket path under '%s' is longer than %d bytes",
                          dir, UNIX_PATH_MAX_BYTES);
    int n = snprintf(out, outlen, "ipc://%s/%s", dir, RT_LINK_SOCKET_NAME);
    if (n < 0 || (size_t)n >= outlen)
        return tg_err_set(err, errlen, TG_ETOOBIG, "endpoint too long");
    return 0;
}

static int check_config(const struct rt_link_config *c, char *err,
                        size_t errlen)
{
    if (c->world_size < 1 || c->world_size > RT_LINK_MAX_RANKS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "world_size %d outside [1, %d]", c->world_size,
                          RT_LINK_MAX_RANKS);
    if (!c->on_result)
        return tg_err_set(err, errlen, TG_EINVAL, "on_result is required");
    const struct rt_link_layout *l = &c->layout;
    if (!l->num_layers || !l->groups_per_layer || !l->heads_per_group ||
        !l->page_size || !l->head_dim || !l->pages_total)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "layout: num_layers, groups_per_layer, "
                          "heads_per_group, page_size, head_dim and "
                          "pages_total must be >= 1");
    if ((uint64_t)l->num_layers * l->groups_per_layer > (1u << 24))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "layout: num_layers * groups_per_layer too large");
    if (c->dead_ms && c->dead_ms <= c->heartbeat_ms)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "dead_ms %" PRIu32 " must exceed heartbeat_ms %"
                          PRIu32, c->dead_ms, c->heartbeat_ms);
    return 0;
}

int rt_link_init(struct rt_link *link, uv_loop_t *loop,
                 const struct rt_link_config *cfg, char *err, size_t errlen)
{
    memset(link, 0, sizeof *link);
    link->per_head = -1;
    if (!loop || !cfg)
        return tg_err_set(err, errlen, TG_EINVAL, "loop and cfg required");
    int rc = check_config(cfg, err, errlen);
    if (rc)
        return rc;
    link->loop = loop;
    link->cfg = *cfg;
    if (!link->cfg.heartbeat_ms)
        link->cfg.heartbeat_ms = RT_LINK_HEARTBEAT_MS_DEFAULT;
    if (!link->cfg.dead_ms)
        link->cfg.dead_ms = link->cfg.heartbeat_ms * RT_LINK_DEAD_FACTOR_DEFAULT;
    if (link->cfg.dead_ms <= link->cfg.heartbeat_ms) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "dead_ms must exceed heartbeat_ms");
        goto fail;
    }
    if (!link->cfg.linger_ms)
        link->cfg.linger_ms = RT_LINK_LINGER_MS_DEFAULT;
    if (!link->cfg.comm_setup_ms)
        link->cfg.comm_setup_ms = RT_LINK_COMM_SETUP_MS_DEFAULT;
    if (!link->cfg.stall_ms)
        link->cfg.stall_ms = RT_LINK_STALL_MS_DEFAULT;
    link->cfg.endpoint = NULL;
    link->cfg.runtime_dir = NULL;
    if (cfg->endpoint) {
        if (strncmp(cfg->endpoint, "ipc://", 6) != 0 &&
            strncmp(cfg->endpoint, "tcp://", 6) != 0) {
            rc = tg_err_set(err, errlen, TG_EINVAL,
                            "endpoint '%s': only ipc:// and tcp:// are "
                            "supported", cfg->endpoint);
            goto fail;
        }
        if (strlen(cfg->endpoint) >= sizeof link->endpoint ||
            (!strncmp(cfg->endpoint, "ipc://", 6) &&
             strlen(cfg->endpoint + 6) > UNIX_PATH_MAX_BYTES)) {
            rc = tg_err_set(err, errlen, TG_EINVAL, "endpoint too long");
            goto fail;
        }
        snprintf(link->endpoint, sizeof link->endpoint, "%s", cfg->endpoint);
    } else {
        rc = rt_link_default_endpoint(cfg->runtime_dir, link->endpoint,
                                      sizeof link->endpoint, err, errlen);
        if (rc)
            goto fail;
    }

    link->ranks = calloc((size_t)cfg->world_size, sizeof *link->ranks);
    if (!link->ranks) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "no memory for ranks");
        goto fail;
    }
    link->zctx = zmq_ctx_new();
    if (!link->zctx) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_ctx_new: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    link->sock = zmq_socket(link->zctx, ZMQ_ROUTER);
    if (!link->sock) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_socket: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    int one = 1, linger = (int)link->cfg.linger_ms;
    if (zmq_setsockopt(link->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
        zmq_setsockopt(link->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one) ||
        zmq_setsockopt(link->sock, ZMQ_LINGER, &linger, sizeof linger)) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_setsockopt: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(link->sock, link->endpoint) < 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "bind %s: %s", link->endpoint,
                        zmq_strerror(errno));
        goto fail;
    }
    size_t eplen = sizeof link->endpoint;
    if (zmq_getsockopt(link->sock, ZMQ_LAST_ENDPOINT, link->endpoint,
                       &eplen) < 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "ZMQ_LAST_ENDPOINT: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    int fd = -1;
    size_t fdlen = sizeof fd;
    if (zmq_getsockopt(link->sock, ZMQ_FD, &fd, &fdlen) < 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "ZMQ_FD: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    /* uv_poll_init registers nothing when it fails; after it nothing can
     * fail, so no handle ever needs an asynchronous close on this path. */
    int uerr = uv_poll_init(loop, &link->poll, fd);
    if (uerr) {
        rc = tg_err_set(err, errlen, TG_EIO, "uv_poll_init: %s",
                        uv_strerror(uerr));
        goto fail;
    }
    uv_timer_init(loop, &link->timer);
    uv_idle_init(loop, &link->kick);
    link->poll.data = link->timer.data = link->kick.data = link;
    link->n_handles = 3;
    TG_ASSERT(uv_poll_start(&link->poll, UV_READABLE, poll_cb) == 0);
    /* Deadlines are checked at a finer grain than heartbeats are sent, so
     * a silent rank is found within RT_LINK_TICK_MS_MAX of dead_ms. */
    uint64_t tick = link->cfg.heartbeat_ms < RT_LINK_TICK_MS_MAX
                        ? link->cfg.heartbeat_ms
                        : RT_LINK_TICK_MS_MAX;
    link->next_beat = uv_now(loop) + link->cfg.heartbeat_ms;
    TG_ASSERT(uv_timer_start(&link->timer, timer_cb, tick, tick) == 0);
    link->initialized = 1;
    log_info("link: listening on %s for %d rank(s)", link->endpoint,
             link->cfg.world_size);
    rt_link__kick(link); /* peers may have connected between bind and poll */
    return 0;
fail:
    if (link->sock)
        zmq_close(link->sock);
    if (link->zctx)
        zmq_ctx_term(link->zctx);
    free(link->ranks);
    memset(link, 0, sizeof *link);
    return rc;
}

int rt_link_shutdown(struct rt_link *link, int drain_step,
                     const char *reason)
{
    if (!link || !link->initialized || link->closed)
        return TG_EINVAL;
    const char *why = reason ? reason : "router shutdown";
    for (int r = 0; r < link->cfg.world_size; r++)
        if (link->ranks[r].state == RANK_ALIVE)
            send_shutdown(link, r, why, drain_step);
    link->shut = 1;
    link->ready = 0;
    log_info("link: shutdown sent (%s%s)", why, drain_step ? ", drain" : "");
    rt_link__kick(link);
    return 0;
}

void rt_link_close(struct rt_link *link)
{
    if (!link || !link->initialized || link->closed)
        return;
    link->closed = 1;
    for (int r = 0; link->ranks != NULL && r < link->cfg.world_size; r++)
        rt_link__pidwatch_stop(link, r);
    uv_close((uv_handle_t *)&link->poll, close_cb);
    uv_close((uv_handle_t *)&link->timer, close_cb);
    uv_close((uv_handle_t *)&link->kick, close_cb);
    if (link->rank0_result)
        tangram__worker__v1__worker_message__free_unpacked(
            link->rank0_result, NULL);
    link->rank0_result = NULL;
    /* The poll handle is closed (uv_close stops it at once), so zmq may
     * close its descriptor now. ZMQ_LINGER bounds the flush. */
    zmq_close(link->sock);
    zmq_ctx_term(link->zctx);
    link->sock = link->zctx = NULL;
    free(link->ranks);
    free(link->entry_slot);
    free(link->entry_sample);
    free(link->res_tokens);
    free(link->res_ids);
    free(link->entry_plp);
    link->entry_plp = NULL;
    rt_link__heads_free(link);
    link->ranks = NULL;
    link->entry_slot = NULL;
    link->entry_sample = NULL;
    link->res_tokens = NULL;
    link->res_ids = NULL;
    link->cap_entries = link->n_entries = 0;
    link->inflight = 0;
    link->ready = 0;
}
