/* test_wlink.c — the real tangram-worker process against a ZMQ_ROUTER in
 * the test: Hello with the layout and rank 0's comm group on connect, a
 * plan before the CommSetup refused, CommSetup answered with CommReady ok
 * (a bad one with ok = false and exit 6, none in time: exit 6), a plan for
 * a short prompt
 * (pages from a local kv_pool / kv_seq reservation, as the router does)
 * answered with the greedy token gw_engine_generate gives, heartbeats
 * arriving (also from the heartbeat thread's "beat-0" connection, with the
 * worker's pid), a wrong-version plan answered with ok = false, Shutdown ->
 * exit 0, router silence after it spoke -> exit 3 within
 * the timeout, garbage -> exit 4.
 * Skipped when tangram-worker or tangram-make-model is not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "gpu_worker/engine/gw_engine.h"
#include "gpu_worker/serve/gw_wlink.h"
#include "tests/support/tt_support.h"

#define PAGE 8
#define CHUNK 16

static char tmpdir[256];
static char model_dir[300];
static char worker_exe[512];
static char errbuf[512];

static int setup(void **state)
{
    (void)state;
    if (!tt_program("tangram-worker", worker_exe, sizeof(worker_exe))) {
        fprintf(stderr, "test_wlink: %s is not built\n", worker_exe);
        return -1;
    }
    if (tt_tmpdir_make("tg_test_wlink.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/m", tmpdir);
    const char *const args[] = {"--arch", "qwen3", "--hidden", "64",
        "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim",
        "16", "--ffn", "128", "--seed", "5", NULL};
    int rc = tt_make_model(dir, args);
    if (rc != 0)
        return -1;
    snprintf(model_dir, sizeof(model_dir), "%s", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

struct router {
    void *ctx, *sock;
    char endpoint[400];
    pid_t pid;
    int n_beat;        /* heartbeats from the beat connection "beat-0" */
};

static void router_start_setup(struct router *r, int timeout_ms,
                               const char *setup_ms)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->endpoint, sizeof(r->endpoint), "ipc://%s/r-%d-%d.sock", tmpdir,
             (int)getpid(), timeout_ms);
    r->ctx = zmq_ctx_new();
    r->sock = zmq_socket(r->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof(linger));
    assert_int_equal(zmq_bind(r->sock, r->endpoint), 0);
    char tmo[32];
    snprintf(tmo, sizeof(tmo), "%d", timeout_ms);
    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        if (setup_ms != NULL)
            setenv("TANGRAM_COMM_SETUP_TIMEOUT_MS", setup_ms, 1);
        execl(worker_exe, worker_exe, "--model", model_dir, "--router",
              r->endpoint, "--page-size", "8", "--prefill-chunk", "16",
              "--kv-pages", "256", "--max-num-seqs", "4", "--heartbeat-ms",
              "50", "--router-timeout-ms", tmo, "--threads", "1",
              "--log-level", "err", (char *)NULL);
        _exit(127);
    }
}

static void router_start(struct router *r, int timeout_ms)
{
    router_start_setup(r, timeout_ms, NULL);
}

/* Waits for the worker to exit within ms; returns its exit status, or -1
 * after killing it. */
static int router_wait(struct router *r, int ms)
{
    for (int t = 0; t < ms; t += 10) {
        int st;
        pid_t p = waitpid(r->pid, &st, WNOHANG);
        if (p == r->pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    return -1;
}

static void router_stop(struct router *r)
{
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
}

/* Receives one message (identity + payload) within ms; NULL on timeout.
 * The worker's main connection is "rank-0"; its heartbeat thread's is
 * "beat-0", which carries heartbeats of the worker's pid only. */
static GwWorkerMessage *router_recv(struct router *r, int ms)
{
    zmq_pollitem_t it = {.socket = r->sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, ms) <= 0)
        return NULL;
    char id[64];
    int n = zmq_recv(r->sock, id, sizeof(id), 0);
    assert_int_equal(n, 6);
    int beat = memcmp(id, "beat-0", 6) == 0;
    if (!beat)
        assert_memory_equal(id, "rank-0", 6);
    zmq_msg_t m;
    zmq_msg_init(&m);
    assert_true(zmq_msg_recv(&m, r->sock, 0) >= 0);
    GwWorkerMessage *out = tangram__worker__v1__worker_message__unpack(
        NULL, zmq_msg_size(&m), zmq_msg_data(&m));
    zmq_msg_close(&m);
    assert_non_null(out);
    assert_int_equal(out->version, 1);
    if (beat) {
        assert_int_equal(out->body_case,
                         TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT);
        assert_int_equal(out->heartbeat->pid, (uint32_t)r->pid);
        r->n_beat++;
    }
    return out;
}

static void router_send_raw(struct router *r, const void *buf, size_t n)
{
    assert_int_equal(zmq_send(r->sock, "rank-0", 6, ZMQ_SNDMORE), 6);
    assert_int_equal(zmq_send(r->sock, buf, n, 0), (int)n);
}

static void router_send(struct router *r, GwWorkerMessage *m)
{
    size_t n = tangram__worker__v1__worker_message__get_packed_size(m);
    uint8_t *buf = malloc(n + 1);
    assert_non_null(buf);
    tangram__worker__v1__worker_message__pack(m, buf);
    router_send_raw(r, buf, n);
    free(buf);
}

/* Next non-heartbeat message; counts heartbeats. */
static GwWorkerMessage *next_msg(struct router *r, int ms, int *n_hb)
{
    for (;;) {
        GwWorkerMessage *m = router_recv(r, ms);
        if (m == NULL ||
            m->body_case != TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT)
            return m;
        assert_int_equal(m->heartbeat->rank, 0);
        (*n_hb)++;
        gw_wlink_msg_free(m);
    }
}

static void send_shutdown(struct router *r)
{
    Tangram__Worker__V1__Shutdown sd = TANGRAM__WORKER__V1__SHUTDOWN__INIT;
    sd.version = 1;
    sd.reason = (char *)"test";
    sd.drain = 1;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN;
    m.shutdown = &sd;
    router_send(r, &m);
}

static void send_comm_setup(struct router *r, uint32_t world, const char *id)
{
    Tangram__Worker__V1__CommSetup cs = TANGRAM__WORKER__V1__COMM_SETUP__INIT;
    cs.version = 1;
    cs.world_size = world;
    cs.comm_kind = (char *)"shm";
    cs.comm_id.data = (uint8_t *)id;
    cs.comm_id.len = strlen(id);
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_SETUP;
    m.comm_setup = &cs;
    router_send(r, &m);
}

/* The router silence after which the workers of the tests that do not
 * test it exit: this fake router sends no heartbeats, and a loaded machine
 * under ASan was seen to spend more than 3 s between two of its messages. */
#define PATIENT_MS 30000

static void test_plan_heartbeat_shutdown(void **state)
{
    (void)state;
    struct router r;
    router_start(&r, PATIENT_MS);
    int n_hb = 0;
    GwWorkerMessage *hello = next_msg(&r, 20000, &n_hb);
    assert_non_null(hello);
    assert_int_equal(hello->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO);
    assert_int_equal(hello->hello->rank, 0);
    assert_int_equal(hello->hello->world_size, 1);
    assert_int_equal(hello->hello->pages_total, 256);
    assert_int_equal(hello->hello->pid, (uint32_t)r.pid);
    assert_int_equal(hello->hello->layout->num_layers, 2);
    assert_int_equal(hello->hello->layout->page_size, PAGE);
    assert_string_equal(hello->hello->layout->backend, "cpu");
    /* Rank 0 names its group after its pid. */
    char prefix[64], comm_id[128];
    snprintf(prefix, sizeof(prefix), "/tangram-%d-", (int)r.pid);
    assert_string_equal(hello->hello->comm_kind, "shm");
    assert_true(hello->hello->comm_id.len > strlen(prefix) &&
                hello->hello->comm_id.len < sizeof(comm_id));
    memcpy(comm_id, hello->hello->comm_id.data, hello->hello->comm_id.len);
    comm_id[hello->hello->comm_id.len] = '\0';
    assert_memory_equal(comm_id, prefix, strlen(prefix));
    uint32_t pages_total = hello->hello->pages_total;
    gw_wlink_msg_free(hello);

    /* The reference token and the router-side page accounting. */
    struct gw_engine eng;
    struct gw_engine_opts eo = {.model_dir = model_dir, .heads_per_group = 1,
                                .page_size = PAGE, .prefill_chunk = CHUNK,
                                .max_context = 64, .n_threads = 1};
    assert_int_equal(gw_engine_init(&eng, &eo, errbuf, sizeof(errbuf)), 0);
    const int32_t prompt[6] = {101, 202, 303, 404, 505, 606};
    struct gw_gen_params gp = {.max_tokens = 1, .ignore_eos = 1,
                               .sampling = {.top_p = 1.0f,
                                            .repetition_penalty = 1.0f}};
    struct gw_gen_result ref;
    assert_int_equal(gw_engine_generate(&eng, prompt, 6, &gp, &ref, errbuf,
                                        sizeof(errbuf)), 0);
    const struct kv_layout *kv = &eng.layout;
    struct kv_pool pool;
    struct kv_seq seq = {0};
    assert_int_equal(kv_pool_init(&pool, (int32_t)pages_total, errbuf,
                                  sizeof(errbuf)), 0);
    assert_int_equal(kv_seq_init(&seq, kv, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&seq, kv, &pool, 0, 6, errbuf,
                                           sizeof(errbuf)), 0);
    int rows = kv->n_layers * kv->n_groups;
    GwPageDelta d[16], *dp[16];
    uint32_t ids[16][8];
    assert_true(rows <= 16);
    for (int l = 0; l < kv->n_layers; l++)
        for (int g = 0; g < kv->n_groups; g++) {
            int row = l * kv->n_groups + g;
            int32_t n;
            const int32_t *pg = kv_seq_row_ids(&seq, kv, l, g, &n);
            GwPageDelta init = TANGRAM__WORKER__V1__PAGE_DELTA__INIT;
            d[row] = init;
            d[row].slot = 2;
            d[row].layer = (uint32_t)l;
            d[row].group = (uint32_t)g;
            assert_true(n <= 8);
            for (int k = 0; k < n; k++)
                ids[row][k] = (uint32_t)pg[k];
            d[row].page_ids = ids[row];
            d[row].n_page_ids = (size_t)n;
            dp[row] = &d[row];
        }
    uint32_t toks[6];
    for (int i = 0; i < 6; i++)
        toks[i] = (uint32_t)prompt[i];
    Tangram__Worker__V1__WorkerSampling ws =
        TANGRAM__WORKER__V1__WORKER_SAMPLING__INIT;
    ws.top_p = 1.0f;
    ws.repetition_penalty = 1.0f;
    GwPlanEntry e = TANGRAM__WORKER__V1__PLAN_ENTRY__INIT, *ep = &e;
    e.slot = 2;
    e.request_id = (char *)"r1";
    e.kind = TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL;
    e.token_ids = toks;
    e.n_token_ids = 6;
    e.sampling = &ws;
    e.sample = 1;
    e.last_chunk = 1;
    e.num_prompt_tokens = 6;
    e.fresh = 1;
    GwBatchPlan bp = TANGRAM__WORKER__V1__BATCH_PLAN__INIT;
    bp.version = 1;
    bp.step_id = 1;
    bp.entries = &ep;
    bp.n_entries = 1;
    bp.page_deltas = dp;
    bp.n_page_deltas = (size_t)rows;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN;
    m.plan = &bp;
    /* Before the CommSetup no plan runs (and the refusal changes
     * nothing: the same step id is accepted afterwards). */
    router_send(&r, &m);
    GwWorkerMessage *res = next_msg(&r, 5000, &n_hb);
    assert_non_null(res);
    assert_int_equal(res->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT);
    assert_false(res->result->ok);
    assert_non_null(strstr(res->result->error, "CommSetup"));
    gw_wlink_msg_free(res);
    /* One rank joins at once (T = 1 takes the same path as T > 1). */
    send_comm_setup(&r, 1, comm_id);
    res = next_msg(&r, 5000, &n_hb);
    assert_non_null(res);
    assert_int_equal(res->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_READY);
    assert_true(res->comm_ready->ok);
    assert_int_equal(res->comm_ready->rank, 0);
    gw_wlink_msg_free(res);
    /* Joined: the same plan runs now. */
    router_send(&r, &m);
    res = next_msg(&r, 5000, &n_hb);
    assert_non_null(res);
    assert_int_equal(res->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT);
    assert_true(res->result->ok);
    assert_int_equal(res->result->step_id, 1);
    assert_int_equal(res->result->n_sampled, 1);
    assert_int_equal(res->result->sampled[0]->slot, 2);
    assert_int_equal(res->result->sampled[0]->token_id, ref.tokens[0]);
    assert_memory_equal(&res->result->sampled[0]->logprob, &ref.lps[0],
                        sizeof(float));
    gw_wlink_msg_free(res);

    /* A plan with another version gets ok = false, step id echoed. */
    bp.step_id = 2;
    bp.version = 9;
    bp.n_entries = 0;
    bp.n_page_deltas = 0;
    router_send(&r, &m);
    res = next_msg(&r, 5000, &n_hb);
    assert_non_null(res);
    assert_false(res->result->ok);
    assert_int_equal(res->result->step_id, 2);
    assert_non_null(strstr(res->result->error, "version"));
    gw_wlink_msg_free(res);

    /* Heartbeats keep coming (period 50 ms). */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int beats = 0;
    for (;;) {
        GwWorkerMessage *x = router_recv(&r, 100);
        if (x != NULL) {
            assert_int_equal(x->body_case,
                             TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT);
            beats++;
            gw_wlink_msg_free(x);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec >= 20 || beats >= 4) /* 20 s: loaded */
            break;
    }
    assert_true(beats >= 4);
    /* Some came from the heartbeat thread's own connection. */
    assert_true(r.n_beat >= 1);

    send_shutdown(&r);
    assert_int_equal(router_wait(&r, 5000), 0);
    router_stop(&r);
    kv_seq_free(&seq, &pool);
    kv_pool_free(&pool);
    gw_gen_result_free(&ref);
    gw_engine_free(&eng);
}

static void test_bad_comm_setup_exits_6(void **state)
{
    (void)state;
    struct router r;
    router_start(&r, PATIENT_MS);
    int n_hb = 0;
    GwWorkerMessage *hello = next_msg(&r, 20000, &n_hb);
    assert_non_null(hello);
    gw_wlink_msg_free(hello);
    /* A world size the worker was not started for: CommReady ok = false
     * with the reason, then exit 6. */
    send_comm_setup(&r, 2, "/tangram-test-none");
    GwWorkerMessage *res = next_msg(&r, 5000, &n_hb);
    assert_non_null(res);
    assert_int_equal(res->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_READY);
    assert_false(res->comm_ready->ok);
    assert_non_null(strstr(res->comm_ready->error, "world size 2"));
    gw_wlink_msg_free(res);
    assert_int_equal(router_wait(&r, 5000), 6);
    router_stop(&r);
}

static void test_no_comm_setup_exits_6(void **state)
{
    (void)state;
    struct router r;
    router_start_setup(&r, PATIENT_MS, "400");
    int n_hb = 0;
    GwWorkerMessage *hello = next_msg(&r, 20000, &n_hb);
    assert_non_null(hello);
    gw_wlink_msg_free(hello);
    /* Heartbeats flow while it waits; then it gives up. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    GwWorkerMessage *x = next_msg(&r, 1000, &n_hb);
    assert_null(x);
    assert_true(n_hb >= 3);
    int st = router_wait(&r, 15000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(st, 6);
    double el = (double)(t1.tv_sec - t0.tv_sec) +
                (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    /* The 1 s wait above plus 10 s of slack for a loaded machine; that
     * it was the 400 ms setup timeout (not the 3 s silence one) is the
     * exit status 6. */
    assert_true(el < 1.0 + 10.0);
    router_stop(&r);
}

static void test_router_silence_exits_3(void **state)
{
    (void)state;
    struct router r;
    router_start(&r, 300);
    int n_hb = 0;
    GwWorkerMessage *hello = next_msg(&r, 20000, &n_hb);
    assert_non_null(hello);
    gw_wlink_msg_free(hello);
    /* Silence counts once the router has spoken (before, it may still be
     * starting: the CommSetup deadline bounds that wait). */
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = 1;
    hb.rank = -1;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    router_send(&r, &m);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = router_wait(&r, 15000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(st, 3);
    double el = (double)(t1.tv_sec - t0.tv_sec) +
                (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    /* Its 300 ms silence timeout, later only by a loaded machine's delay
     * (10 s of slack); exit status 3 names the silence. */
    assert_true(el < 0.3 + 10.0);
    router_stop(&r);
}

static void test_garbage_exits_4(void **state)
{
    (void)state;
    struct router r;
    router_start(&r, PATIENT_MS);
    int n_hb = 0;
    GwWorkerMessage *hello = next_msg(&r, 20000, &n_hb);
    assert_non_null(hello);
    gw_wlink_msg_free(hello);
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99};
    router_send_raw(&r, junk, sizeof(junk));
    assert_int_equal(router_wait(&r, 5000), 4);
    router_stop(&r);
}

static void test_sigterm_exits_0(void **state)
{
    (void)state;
    struct router r;
    router_start(&r, PATIENT_MS);
    int n_hb = 0;
    GwWorkerMessage *hello = next_msg(&r, 20000, &n_hb);
    assert_non_null(hello);
    gw_wlink_msg_free(hello);
    kill(r.pid, SIGTERM);
    assert_int_equal(router_wait(&r, 5000), 0);
    router_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_heartbeat_shutdown),
        cmocka_unit_test(test_bad_comm_setup_exits_6),
        cmocka_unit_test(test_no_comm_setup_exits_6),
        cmocka_unit_test(test_router_silence_exits_3),
        cmocka_unit_test(test_garbage_exits_4),
        cmocka_unit_test(test_sigterm_exits_0),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
