/* test_proto.c — the protobuf-c code generated from the .proto files: every
 * message of tangram.v1, grpc.health.v1 and tangram.worker.v1 round-trips
 * (pack, unpack, compare fields, repack to identical bytes); "unset" and
 * "zero" stay distinct for the optional fields; garbage, truncated and
 * mistyped input is rejected; unknown fields are skipped; sizes of large
 * messages are exact and bounded; every unpacked allocation is freed.
 * The structured outputs' side channel (GrammarCommand, GrammarReport in
 * the envelope, PlanEntry.grammar_prepare) round-trips with 64-bit ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "health.pb-c.h"
#include "tangram.pb-c.h"
#include "worker.pb-c.h"

/* ---- helpers ----------------------------------------------------------- */

/* An allocator that counts live blocks, to prove free_unpacked frees all. */
static long live_blocks;

static void *count_alloc(void *ud, size_t size)
{
    (void)ud;
    void *p = malloc(size);
    if (p)
        live_blocks++;
    return p;
}

static void count_free(void *ud, void *p)
{
    (void)ud;
    if (p)
        live_blocks--;
    free(p);
}

static ProtobufCAllocator counting = {count_alloc, count_free, NULL};

/* Packs `msg`, checks the size is what get_packed_size said, unpacks with
 * the counting allocator, repacks and checks identical bytes. Returns the
 * unpacked copy (free with free_unpacked + &counting). */
static ProtobufCMessage *round_trip(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n ? n : 1);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(msg, buf), n);
    ProtobufCMessage *out =
        protobuf_c_message_unpack(msg->descriptor, &counting, n, buf);
    assert_non_null(out);
    assert_int_equal(protobuf_c_message_get_packed_size(out), n);
    uint8_t *again = malloc(n ? n : 1);
    assert_non_null(again);
    assert_int_equal(protobuf_c_message_pack(out, again), n);
    assert_memory_equal(buf, again, n);
    free(buf);
    free(again);
    return out;
}

static void release(ProtobufCMessage *m)
{
    protobuf_c_message_free_unpacked(m, &counting);
    assert_int_equal(live_blocks, 0);
}

static uint8_t *pack_alloc(const ProtobufCMessage *msg, size_t *n)
{
    *n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(*n ? *n : 1);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(msg, buf), *n);
    return buf;
}

/* ---- tangram.v1 ---------------------------------------------------------- */

static void test_generate_request(void **state)
{
    (void)state;
    Tangram__V1__ChatMessage m0 = TANGRAM__V1__CHAT_MESSAGE__INIT;
    Tangram__V1__ChatMessage m1 = TANGRAM__V1__CHAT_MESSAGE__INIT;
    m0.role = "system";
    m0.content = "You are terse.";
    m1.role = "user";
    m1.content = "héllo — 世界"; /* multi-byte UTF-8 survives */
    Tangram__V1__ChatMessage *msgs[] = {&m0, &m1};
    char *stops[] = {"\n\n", "END"};
    uint32_t stop_ids[] = {2, 151643};
    uint32_t ids[] = {0, 1, 127, 128, 16383, 16384, UINT32_MAX};

    Tangram__V1__SamplingParams sp = TANGRAM__V1__SAMPLING_PARAMS__INIT;
    sp.max_tokens_opt_case = TANGRAM__V1__SAMPLING_PARAMS__MAX_TOKENS_OPT_MAX_TOKENS;
    sp.max_tokens = 64;
    sp.temperature_opt_case =
        TANGRAM__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
    sp.temperature = 0.0f; /* set to zero: greedy, not "default" */
    sp.top_p_opt_case = TANGRAM__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P;
    sp.top_p = 0.9f;
    sp.top_k_opt_case = TANGRAM__V1__SAMPLING_PARAMS__TOP_K_OPT_TOP_K;
    sp.top_k = -1;
    sp.min_p_opt_case = TANGRAM__V1__SAMPLING_PARAMS__MIN_P_OPT_MIN_P;
    sp.min_p = 0.05f;
    sp.seed_opt_case = TANGRAM__V1__SAMPLING_PARAMS__SEED_OPT_SEED;
    sp.seed = UINT64_MAX;
    sp.n_stop = 2;
    sp.stop = stops;
    sp.n_stop_token_ids = 2;
    sp.stop_token_ids = stop_ids;
    sp.ignore_eos = 1;
    sp.logprobs = 5;
    sp.presence_penalty = -2.0f;
    sp.frequency_penalty = 1.5f;
    sp.repetition_penalty_opt_case =
        TANGRAM__V1__SAMPLING_PARAMS__REPETITION_PENALTY_OPT_REPETITION_PENALTY;
    sp.repetition_penalty = 1.1f;
    sp.min_tokens_opt_case =
        TANGRAM__V1__SAMPLING_PARAMS__MIN_TOKENS_OPT_MIN_TOKENS;
    sp.min_tokens = 3;

    Tangram__V1__GenerateRequest req = TANGRAM__V1__GENERATE_REQUEST__INIT;
    req.request_id = "req-1";
    req.prompt = "Once upon a time";
    req.n_prompt_token_ids = sizeof(ids) / sizeof(ids[0]);
    req.prompt_token_ids = ids;
    req.n_messages = 2;
    req.messages = msgs;
    req.session_id = "conv-42";
    req.sampling = &sp;

    Tangram__V1__GenerateRequest *o =
        (Tangram__V1__GenerateRequest *)round_trip(&req.base);
    assert_string_equal(o->request_id, "req-1");
    assert_string_equal(o->prompt, "Once upon a time");
    assert_int_equal(o->n_prompt_token_ids, 7);
    assert_memory_equal(o->prompt_token_ids, ids, sizeof(ids));
    assert_int_equal(o->n_messages, 2);
    assert_string_equal(o->messages[0]->role, "system");
    assert_string_equal(o->messages[1]->content, "héllo — 世界");
    assert_string_equal(o->session_id, "conv-42");
    const Tangram__V1__SamplingParams *s = o->sampling;
    assert_non_null(s);
    assert_int_equal(s->max_tokens_opt_case,
                     TANGRAM__V1__SAMPLING_PARAMS__MAX_TOKENS_OPT_MAX_TOKENS);
    assert_int_equal(s->max_tokens, 64);
    assert_int_equal(s->temperature_opt_case,
                     TANGRAM__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE);
    assert_true(s->temperature == 0.0f);
    assert_true(s->top_p == 0.9f);
    assert_int_equal(s->top_k, -1);
    assert_true(s->min_p == 0.05f);
    assert_true(s->seed == UINT64_MAX);
    assert_int_equal(s->n_stop, 2);
    assert_string_equal(s->stop[0], "\n\n");
    assert_string_equal(s->stop[1], "END");
    assert_int_equal(s->n_stop_token_ids, 2);
    assert_int_equal(s->stop_token_ids[1], 151643);
    assert_true(s->ignore_eos);
    assert_int_equal(s->logprobs, 5);
    assert_true(s->presence_penalty == -2.0f);
    assert_true(s->frequency_penalty == 1.5f);
    assert_true(s->repetition_penalty == 1.1f);
    assert_int_equal(s->min_tokens, 3);
    release(&o->base);
}

static void test_optional_unset_vs_zero(void **state)
{
    (void)state;
    /* Unset: nothing on the wire, NOT_SET after unpack. */
    Tangram__V1__SamplingParams sp = TANGRAM__V1__SAMPLING_PARAMS__INIT;
    assert_int_equal(protobuf_c_message_get_packed_size(&sp.base), 0);
    Tangram__V1__SamplingParams *o =
        (Tangram__V1__SamplingParams *)round_trip(&sp.base);
    assert_int_equal(o->temperature_opt_case,
                     TANGRAM__V1__SAMPLING_PARAMS__TEMPERATURE_OPT__NOT_SET);
    assert_int_equal(o->seed_opt_case,
                     TANGRAM__V1__SAMPLING_PARAMS__SEED_OPT__NOT_SET);
    release(&o->base);

    /* Set to zero: on the wire, and set after unpack. */
    sp.temperature_opt_case =
        TANGRAM__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
    sp.temperature = 0.0f;
    sp.seed_opt_case = TANGRAM__V1__SAMPLING_PARAMS__SEED_OPT_SEED;
    sp.seed = 0;
    assert_int_equal(protobuf_c_message_get_packed_size(&sp.base),
                     5 + 2); /* tag+fixed32, tag+varint(0) */
    o = (Tangram__V1__SamplingParams *)round_trip(&sp.base);
    assert_int_equal(o->temperature_opt_case,
                     TANGRAM__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE);
    assert_int_equal(o->seed_opt_case,
                     TANGRAM__V1__SAMPLING_PARAMS__SEED_OPT_SEED);
    assert_true(o->seed == 0);
    release(&o->base);

    /* The same for the worker's page-table truncation. */
    Tangram__Worker__V1__PageDelta d = TANGRAM__WORKER__V1__PAGE_DELTA__INIT;
    d.truncate_to_opt_case =
        TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO;
    d.truncate_to = 0;
    Tangram__Worker__V1__PageDelta *od =
        (Tangram__Worker__V1__PageDelta *)round_trip(&d.base);
    assert_int_equal(od->truncate_to_opt_case,
                     TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO);
    assert_int_equal(od->truncate_to, 0);
    release(&od->base);
}

static void test_generate_response(void **state)
{
    (void)state;
    Tangram__V1__TopLogprob t0 = TANGRAM__V1__TOP_LOGPROB__INIT;
    Tangram__V1__TopLogprob t1 = TANGRAM__V1__TOP_LOGPROB__INIT;
    t0.token_id = 11;
    t0.logprob = -0.25f;
    t0.text = " the";
    t1.token_id = 12;
    t1.logprob = -1.75f;
    t1.text = "<0xE4>";
    Tangram__V1__TopLogprob *tops[] = {&t0, &t1};
    Tangram__V1__TokenLogprob lp = TANGRAM__V1__TOKEN_LOGPROB__INIT;
    lp.token_id = 11;
    lp.logprob = -0.25f;
    lp.n_top = 2;
    lp.top = tops;
    lp.text = " the";
    Tangram__V1__TokenLogprob *lps[] = {&lp};
    Tangram__V1__Usage u = TANGRAM__V1__USAGE__INIT;
    u.prompt_tokens = 1000;
    u.completion_tokens = 17;
    u.cached_prompt_tokens = 960;
    uint32_t toks[] = {11};
    Tangram__V1__GenerateResponse r = TANGRAM__V1__GENERATE_RESPONSE__INIT;
    r.n_token_ids = 1;
    r.token_ids = toks;
    r.text = " the";
    r.n_logprobs = 1;
    r.logprobs = lps;
    r.finish_reason = TANGRAM__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    r.usage = &u;
    r.request_id = "req-1";
    Tangram__V1__GenerateResponse *o =
        (Tangram__V1__GenerateResponse *)round_trip(&r.base);
    assert_int_equal(o->n_token_ids, 1);
    assert_int_equal(o->token_ids[0], 11);
    assert_string_equal(o->text, " the");
    assert_int_equal(o->n_logprobs, 1);
    assert_int_equal(o->logprobs[0]->n_top, 2);
    assert_string_equal(o->logprobs[0]->top[1]->text, "<0xE4>");
    assert_true(o->logprobs[0]->top[1]->logprob == -1.75f);
    assert_int_equal(o->finish_reason,
                     TANGRAM__V1__FINISH_REASON__FINISH_REASON_LENGTH);
    assert_int_equal(o->usage->prompt_tokens, 1000);
    assert_int_equal(o->usage->completion_tokens, 17);
    assert_int_equal(o->usage->cached_prompt_tokens, 960);
    release(&o->base);

    /* A streaming chunk: finish_reason 0 and no usage cost nothing. */
    Tangram__V1__GenerateResponse c = TANGRAM__V1__GENERATE_RESPONSE__INIT;
    c.n_token_ids = 1;
    c.token_ids = toks;
    o = (Tangram__V1__GenerateResponse *)round_trip(&c.base);
    assert_int_equal(o->finish_reason,
                     TANGRAM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED);
    assert_null(o->usage);
    release(&o->base);
}

static void test_small_rpcs(void **state)
{
    (void)state;
    Tangram__V1__ChatMessage m = TANGRAM__V1__CHAT_MESSAGE__INIT;
    m.role = "user";
    m.content = "hi";
    Tangram__V1__ChatMessage *ms[] = {&m};
    Tangram__V1__TokenizeRequest tq = TANGRAM__V1__TOKENIZE_REQUEST__INIT;
    tq.n_messages = 1;
    tq.messages = ms;
    tq.add_special_tokens_opt_case =
        TANGRAM__V1__TOKENIZE_REQUEST__ADD_SPECIAL_TOKENS_OPT_ADD_SPECIAL_TOKENS;
    tq.add_special_tokens = 0;
    Tangram__V1__TokenizeRequest *otq =
        (Tangram__V1__TokenizeRequest *)round_trip(&tq.base);
    assert_int_equal(otq->n_messages, 1);
    assert_int_equal(
        otq->add_special_tokens_opt_case,
        TANGRAM__V1__TOKENIZE_REQUEST__ADD_SPECIAL_TOKENS_OPT_ADD_SPECIAL_TOKENS);
    assert_false(otq->add_special_tokens);
    assert_int_equal(
        otq->add_generation_prompt_opt_case,
        TANGRAM__V1__TOKENIZE_REQUEST__ADD_GENERATION_PROMPT_OPT__NOT_SET);
    release(&otq->base);

    uint32_t ids[] = {1, 2, 3};
    Tangram__V1__TokenizeResponse tr = TANGRAM__V1__TOKENIZE_RESPONSE__INIT;
    tr.n_token_ids = 3;
    tr.token_ids = ids;
    tr.count = 3;
    tr.max_model_len = 4096;
    Tangram__V1__TokenizeResponse *otr =
        (Tangram__V1__TokenizeResponse *)round_trip(&tr.base);
    assert_int_equal(otr->count, 3);
    assert_int_equal(otr->max_model_len, 4096);
    assert_memory_equal(otr->token_ids, ids, sizeof(ids));
    release(&otr->base);

    Tangram__V1__ModelInfoRequest mq = TANGRAM__V1__MODEL_INFO_REQUEST__INIT;
    ProtobufCMessage *omq = round_trip(&mq.base);
    release(omq);

    Tangram__V1__ModelInfoResponse mr = TANGRAM__V1__MODEL_INFO_RESPONSE__INIT;
    mr.model = "tiny-llama";
    mr.max_model_len = 2048;
    mr.vocab_size = 32000;
    mr.num_layers = 4;
    mr.num_kv_heads = 8;
    mr.head_dim = 64;
    mr.page_size = 16;
    mr.heads_per_group = 2;
    mr.profile = "none";
    mr.tensor_parallel = 2;
    mr.backend = "cpu";
    Tangram__V1__ModelInfoResponse *omr =
        (Tangram__V1__ModelInfoResponse *)round_trip(&mr.base);
    assert_string_equal(omr->model, "tiny-llama");
    assert_int_equal(omr->vocab_size, 32000);
    assert_int_equal(omr->heads_per_group, 2);
    assert_int_equal(omr->tensor_parallel, 2);
    assert_string_equal(omr->backend, "cpu");
    release(&omr->base);

    Tangram__V1__AbortRequest aq = TANGRAM__V1__ABORT_REQUEST__INIT;
    aq.request_id = "req-9";
    Tangram__V1__AbortRequest *oaq =
        (Tangram__V1__AbortRequest *)round_trip(&aq.base);
    assert_string_equal(oaq->request_id, "req-9");
    release(&oaq->base);
    Tangram__V1__AbortResponse ar = TANGRAM__V1__ABORT_RESPONSE__INIT;
    ar.found = 1;
    Tangram__V1__AbortResponse *oar =
        (Tangram__V1__AbortResponse *)round_trip(&ar.base);
    assert_true(oar->found);
    release(&oar->base);
}

static void test_health(void **state)
{
    (void)state;
    Grpc__Health__V1__HealthCheckRequest q =
        GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    q.service = "tangram.v1.Generation";
    Grpc__Health__V1__HealthCheckRequest *oq =
        (Grpc__Health__V1__HealthCheckRequest *)round_trip(&q.base);
    assert_string_equal(oq->service, "tangram.v1.Generation");
    release(&oq->base);

    static const int statuses[] = {
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__UNKNOWN,
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING,
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN,
    };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(statuses[i], i); /* the public spec's numbers */
        Grpc__Health__V1__HealthCheckResponse r =
            GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        r.status = statuses[i];
        Grpc__Health__V1__HealthCheckResponse *o =
            (Grpc__Health__V1__HealthCheckResponse *)round_trip(&r.base);
        assert_int_equal(o->status, statuses[i]);
        release(&o->base);
    }
    /* The wire form of SERVING is exactly field 1, varint 1. */
    Grpc__Health__V1__HealthCheckResponse r =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    uint8_t b[8];
    assert_int_equal(grpc__health__v1__health_check_response__pack(&r, b), 2);
    assert_int_equal(b[0], 0x08);
    assert_int_equal(b[1], 0x01);
    /* The service descriptors name the methods clients call. */
    assert_string_equal(grpc__health__v1__health__descriptor.name,
                        "grpc.health.v1.Health");
    assert_string_equal(tangram__v1__generation__descriptor.name,
                        "tangram.v1.Generation");
    assert_int_equal(tangram__v1__generation__descriptor.n_methods, 4);
    assert_non_null(protobuf_c_service_descriptor_get_method_by_name(
        &tangram__v1__generation__descriptor, "Generate"));
    assert_non_null(protobuf_c_service_descriptor_get_method_by_name(
        &grpc__health__v1__health__descriptor, "Check"));
}

/* ---- tangram.worker.v1 -------------------------------------------------- */

static void test_worker_hello_heartbeat_shutdown(void **state)
{
    (void)state;
    Tangram__Worker__V1__LayoutSummary l =
        TANGRAM__WORKER__V1__LAYOUT_SUMMARY__INIT;
    l.num_layers = 32;
    l.num_kv_heads = 4;
    l.heads_per_group = 2;
    l.groups_per_layer = 2;
    l.page_size = 16;
    l.head_dim = 128;
    l.page_bytes = 2ull * 2 * 16 * 128 * 2;
    l.profile = "llama3-8b-rho0.3";
    l.backend = "cuda";
    l.model = "/models/llama";
    l.max_model_len = 131072;
    l.vocab_size = 128256;
    Tangram__Worker__V1__Hello h = TANGRAM__WORKER__V1__HELLO__INIT;
    h.version = TANGRAM__WORKER__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
    h.rank = 1;
    h.world_size = 2;
    h.pid = 4242;
    h.pages_total = 123456;
    h.layout = &l;
    Tangram__Worker__V1__Hello *oh =
        (Tangram__Worker__V1__Hello *)round_trip(&h.base);
    assert_int_equal(oh->version, 1);
    assert_int_equal(oh->rank, 1);
    assert_int_equal(oh->world_size, 2);
    assert_int_equal(oh->pid, 4242);
    assert_int_equal(oh->pages_total, 123456);
    assert_int_equal(oh->layout->num_layers, 32);
    assert_int_equal(oh->layout->page_bytes, 16384);
    assert_string_equal(oh->layout->profile, "llama3-8b-rho0.3");
    assert_int_equal(oh->layout->vocab_size, 128256);
    release(&oh->base);

    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = 1;
    hb.seq = 1ull << 40;
    hb.time_unix_ns = 1700000000123456789ull;
    hb.rank = -1; /* from the router: a negative int32 */
    Tangram__Worker__V1__Heartbeat *ohb =
        (Tangram__Worker__V1__Heartbeat *)round_trip(&hb.base);
    assert_true(ohb->seq == 1ull << 40);
    assert_true(ohb->time_unix_ns == 1700000000123456789ull);
    assert_int_equal(ohb->rank, -1);
    release(&ohb->base);

    Tangram__Worker__V1__Shutdown sd = TANGRAM__WORKER__V1__SHUTDOWN__INIT;
    sd.version = 1;
    sd.reason = "SIGTERM";
    sd.drain = 1;
    Tangram__Worker__V1__Shutdown *osd =
        (Tangram__Worker__V1__Shutdown *)round_trip(&sd.base);
    assert_string_equal(osd->reason, "SIGTERM");
    assert_true(osd->drain);
    release(&osd->base);
}

/* A plan with prefill and decode entries, deltas with and without
 * truncation, and frees. */
static void test_worker_plan(void **state)
{
    (void)state;
    uint32_t chunk[100];
    for (int i = 0; i < 100; i++)
        chunk[i] = (uint32_t)(i * 977);
    uint32_t one = 31999;
    Tangram__Worker__V1__WorkerSampling ws =
        TANGRAM__WORKER__V1__WORKER_SAMPLING__INIT;
    ws.temperature = 0.7f;
    ws.top_p = 0.95f;
    ws.top_k = 40;
    ws.min_p = 0.01f;
    ws.presence_penalty = 0.5f;
    ws.frequency_penalty = -0.5f;
    ws.repetition_penalty = 1.2f;
    ws.n_top = 3;
    Tangram__Worker__V1__PlanEntry e0 = TANGRAM__WORKER__V1__PLAN_ENTRY__INIT;
    e0.slot = 0;
    e0.request_id = "a";
    e0.kind = TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL;
    e0.n_token_ids = 100;
    e0.token_ids = chunk;
    e0.start_pos = 512;
    e0.sampling = &ws;
    e0.seed = 1234;
    e0.sample = 1;
    e0.last_chunk = 1;
    e0.num_prompt_tokens = 612;
    Tangram__Worker__V1__PlanEntry e1 = TANGRAM__WORKER__V1__PLAN_ENTRY__INIT;
    e1.slot = 7;
    e1.request_id = "b";
    e1.kind = TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE;
    e1.n_token_ids = 1;
    e1.token_ids = &one;
    e1.start_pos = 4095;
    e1.sampling = &ws;
    e1.sample = 1;
    Tangram__Worker__V1__PlanEntry *entries[] = {&e0, &e1};
    uint32_t pages[] = {0, 5, 999999};
    Tangram__Worker__V1__PageDelta d0 = TANGRAM__WORKER__V1__PAGE_DELTA__INIT;
    d0.slot = 0;
    d0.layer = 31;
    d0.group = 3;
    d0.n_page_ids = 3;
    d0.page_ids = pages;
    Tangram__Worker__V1__PageDelta d1 = TANGRAM__WORKER__V1__PAGE_DELTA__INIT;
    d1.slot = 7;
    d1.layer = 2;
    d1.group = 1;
    d1.truncate_to_opt_case =
        TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO;
    d1.truncate_to = 4;
    Tangram__Worker__V1__PageDelta *deltas[] = {&d0, &d1};
    uint32_t frees[] = {3, 4};
    Tangram__Worker__V1__BatchPlan p = TANGRAM__WORKER__V1__BATCH_PLAN__INIT;
    p.version = 1;
    p.step_id = 77;
    p.n_entries = 2;
    p.entries = entries;
    p.n_page_deltas = 2;
    p.page_deltas = deltas;
    p.n_frees = 2;
    p.frees = frees;
    Tangram__Worker__V1__BatchPlan *o =
        (Tangram__Worker__V1__BatchPlan *)round_trip(&p.base);
    assert_int_equal(o->version, 1);
    assert_int_equal(o->step_id, 77);
    assert_int_equal(o->n_entries, 2);
    const Tangram__Worker__V1__PlanEntry *oe = o->entries[0];
    assert_int_equal(oe->kind,
                     TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL);
    assert_int_equal(oe->n_token_ids, 100);
    assert_memory_equal(oe->token_ids, chunk, sizeof(chunk));
    assert_int_equal(oe->start_pos, 512);
    assert_true(oe->seed == 1234);
    assert_true(oe->sample && oe->last_chunk);
    assert_int_equal(oe->num_prompt_tokens, 612);
    assert_true(oe->sampling->temperature == 0.7f);
    assert_int_equal(oe->sampling->top_k, 40);
    assert_true(oe->sampling->frequency_penalty == -0.5f);
    assert_true(oe->sampling->repetition_penalty == 1.2f);
    assert_int_equal(oe->sampling->n_top, 3);
    oe = o->entries[1];
    assert_int_equal(oe->kind,
                     TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE);
    assert_int_equal(oe->slot, 7);
    assert_int_equal(oe->token_ids[0], 31999);
    assert_false(oe->last_chunk);
    assert_int_equal(o->n_page_deltas, 2);
    assert_int_equal(o->page_deltas[0]->layer, 31);
    assert_int_equal(o->page_deltas[0]->page_ids[2], 999999);
    assert_int_equal(o->page_deltas[0]->truncate_to_opt_case,
                     TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT__NOT_SET);
    assert_int_equal(o->page_deltas[1]->n_page_ids, 0);
    assert_int_equal(o->page_deltas[1]->truncate_to, 4);
    assert_int_equal(o->n_frees, 2);
    assert_int_equal(o->frees[1], 4);
    release(&o->base);
}

static void test_worker_result(void **state)
{
    (void)state;
    uint32_t tids[] = {5, 6, 7};
    float tlps[] = {-0.1f, -2.5f, -3.0f};
    Tangram__Worker__V1__SampledToken s0 =
        TANGRAM__WORKER__V1__SAMPLED_TOKEN__INIT;
    s0.slot = 0;
    s0.token_id = 5;
    s0.logprob = -0.1f;
    s0.n_top_ids = 3;
    s0.top_ids = tids;
    s0.n_top_logprobs = 3;
    s0.top_logprobs = tlps;
    Tangram__Worker__V1__SampledToken s1 =
        TANGRAM__WORKER__V1__SAMPLED_TOKEN__INIT;
    s1.slot = 7;
    s1.token_id = 0;
    s1.logprob = -INFINITY;
    Tangram__Worker__V1__SampledToken *ss[] = {&s0, &s1};
    Tangram__Worker__V1__StepResult r = TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    r.version = 1;
    r.step_id = 77;
    r.rank = 0;
    r.ok = 1;
    r.n_sampled = 2;
    r.sampled = ss;
    r.step_seconds = 0.0125;
    Tangram__Worker__V1__StepResult *o =
        (Tangram__Worker__V1__StepResult *)round_trip(&r.base);
    assert_true(o->ok);
    assert_int_equal(o->step_id, 77);
    assert_int_equal(o->n_sampled, 2);
    assert_memory_equal(o->sampled[0]->top_ids, tids, sizeof(tids));
    assert_memory_equal(o->sampled[0]->top_logprobs, tlps, sizeof(tlps));
    assert_true(isinf(o->sampled[1]->logprob) && o->sampled[1]->logprob < 0);
    assert_true(o->step_seconds == 0.0125);
    release(&o->base);

    /* An error ack from another rank. */
    Tangram__Worker__V1__StepResult e = TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    e.version = 1;
    e.step_id = 78;
    e.rank = 3;
    e.ok = 0;
    e.error = "CUDA error: out of memory";
    o = (Tangram__Worker__V1__StepResult *)round_trip(&e.base);
    assert_false(o->ok);
    assert_int_equal(o->rank, 3);
    assert_string_equal(o->error, "CUDA error: out of memory");
    release(&o->base);
}

/* Every body of the envelope survives, and the case says which. */
static void test_worker_envelope(void **state)
{
    (void)state;
    Tangram__Worker__V1__Hello h = TANGRAM__WORKER__V1__HELLO__INIT;
    h.version = 1;
    h.rank = 2;
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = 1;
    hb.seq = 9;
    Tangram__Worker__V1__BatchPlan p = TANGRAM__WORKER__V1__BATCH_PLAN__INIT;
    p.version = 1;
    p.step_id = 3;
    Tangram__Worker__V1__StepResult r = TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    r.version = 1;
    r.step_id = 3;
    r.ok = 1;
    Tangram__Worker__V1__Shutdown s = TANGRAM__WORKER__V1__SHUTDOWN__INIT;
    s.version = 1;
    s.reason = "bye";
    for (int k = 0; k < 6; k++) {
        Tangram__Worker__V1__WorkerMessage m =
            TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
        m.version = 1;
        switch (k) {
        case 0: m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY__NOT_SET; break;
        case 1: m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO; m.hello = &h; break;
        case 2: m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT; m.heartbeat = &hb; break;
        case 3: m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN; m.plan = &p; break;
        case 4: m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT; m.result = &r; break;
        default: m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN; m.shutdown = &s; break;
        }
        Tangram__Worker__V1__WorkerMessage *o =
            (Tangram__Worker__V1__WorkerMessage *)round_trip(&m.base);
        assert_int_equal(o->version, 1);
        assert_int_equal(o->body_case, m.body_case);
        switch (k) {
        case 1: assert_int_equal(o->hello->rank, 2); break;
        case 2: assert_int_equal(o->heartbeat->seq, 9); break;
        case 3: assert_int_equal(o->plan->step_id, 3); break;
        case 4: assert_true(o->result->ok); break;
        case 5: assert_string_equal(o->shutdown->reason, "bye"); break;
        default: break;
        }
        release(&o->base);
    }
    /* An empty sub-message is still "set" (its tag is on the wire). */
    Tangram__Worker__V1__Shutdown empty = TANGRAM__WORKER__V1__SHUTDOWN__INIT;
    Tangram__Worker__V1__WorkerMessage m =
        TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN;
    m.shutdown = &empty;
    Tangram__Worker__V1__WorkerMessage *o =
        (Tangram__Worker__V1__WorkerMessage *)round_trip(&m.base);
    assert_int_equal(o->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN);
    release(&o->base);
}

/* The grammar side channel: prepares (id, spec) and releases to rank 0,
 * its answers back, both in the envelope; a plan entry's prepare id. Ids
 * are 64-bit: one above 2^32 survives. */
static void test_worker_grammar(void **state)
{
    (void)state;
    const uint64_t big = ((uint64_t)1 << 40) + 5;
    Tangram__Worker__V1__GrammarPrepare gp[2] = {
        TANGRAM__WORKER__V1__GRAMMAR_PREPARE__INIT,
        TANGRAM__WORKER__V1__GRAMMAR_PREPARE__INIT};
    gp[0].id = 1;
    gp[0].spec = "{\"type\":\"json_object\"}";
    gp[1].id = big;
    gp[1].spec = "{\"type\":\"json_value\"}";
    Tangram__Worker__V1__GrammarPrepare *gpp[2] = {&gp[0], &gp[1]};
    uint64_t rel[3] = {7, big - 1, 0};
    Tangram__Worker__V1__GrammarCommand gc =
        TANGRAM__WORKER__V1__GRAMMAR_COMMAND__INIT;
    gc.version = 1;
    gc.n_prepare = 2;
    gc.prepare = gpp;
    gc.n_release = 3;
    gc.release = rel;
    Tangram__Worker__V1__WorkerMessage m =
        TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_COMMAND;
    m.grammar_command = &gc;
    Tangram__Worker__V1__WorkerMessage *o =
        (Tangram__Worker__V1__WorkerMessage *)round_trip(&m.base);
    assert_int_equal(o->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_COMMAND);
    const Tangram__Worker__V1__GrammarCommand *c = o->grammar_command;
    assert_int_equal(c->version, 1);
    assert_int_equal(c->n_prepare, 2);
    assert_true(c->prepare[1]->id == big);
    assert_string_equal(c->prepare[0]->spec, gp[0].spec);
    assert_string_equal(c->prepare[1]->spec, gp[1].spec);
    assert_int_equal(c->n_release, 3);
    assert_memory_equal(c->release, rel, sizeof(rel));
    release(&o->base);

    Tangram__Worker__V1__GrammarReady gr[2] = {
        TANGRAM__WORKER__V1__GRAMMAR_READY__INIT,
        TANGRAM__WORKER__V1__GRAMMAR_READY__INIT};
    gr[0].id = big;
    gr[0].ok = 1;
    gr[1].id = 2;
    gr[1].ok = 0;
    gr[1].busy = 1;
    gr[1].error = "too many output constraints compiling";
    Tangram__Worker__V1__GrammarReady *grp[2] = {&gr[0], &gr[1]};
    Tangram__Worker__V1__GrammarReport rep =
        TANGRAM__WORKER__V1__GRAMMAR_REPORT__INIT;
    rep.version = 1;
    rep.rank = 0;
    rep.n_ready = 2;
    rep.ready = grp;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_REPORT;
    m.grammar_report = &rep;
    o = (Tangram__Worker__V1__WorkerMessage *)round_trip(&m.base);
    assert_int_equal(o->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_REPORT);
    const Tangram__Worker__V1__GrammarReport *r = o->grammar_report;
    assert_int_equal(r->n_ready, 2);
    assert_true(r->ready[0]->id == big);
    assert_true(r->ready[0]->ok);
    assert_false(r->ready[0]->busy);
    assert_string_equal(r->ready[0]->error, "");
    assert_false(r->ready[1]->ok);
    assert_true(r->ready[1]->busy);
    assert_string_equal(r->ready[1]->error, gr[1].error);
    release(&o->base);

    Tangram__Worker__V1__PlanEntry e = TANGRAM__WORKER__V1__PLAN_ENTRY__INIT;
    e.fresh = 1;
    e.grammar = (char *)gp[0].spec;
    e.grammar_prepare = big;
    Tangram__Worker__V1__PlanEntry *oe = (Tangram__Worker__V1__PlanEntry *)
        round_trip(&e.base);
    assert_true(oe->grammar_prepare == big);
    assert_string_equal(oe->grammar, gp[0].spec);
    release(&oe->base);
}

/* ---- malformed input ----------------------------------------------------- */

static const ProtobufCMessageDescriptor *const all_descs[] = {
    &tangram__v1__chat_message__descriptor,
    &tangram__v1__sampling_params__descriptor,
    &tangram__v1__generate_request__descriptor,
    &tangram__v1__top_logprob__descriptor,
    &tangram__v1__token_logprob__descriptor,
    &tangram__v1__usage__descriptor,
    &tangram__v1__generate_response__descriptor,
    &tangram__v1__tokenize_request__descriptor,
    &tangram__v1__tokenize_response__descriptor,
    &tangram__v1__model_info_request__descriptor,
    &tangram__v1__model_info_response__descriptor,
    &tangram__v1__abort_request__descriptor,
    &tangram__v1__abort_response__descriptor,
    &grpc__health__v1__health_check_request__descriptor,
    &grpc__health__v1__health_check_response__descriptor,
    &tangram__worker__v1__layout_summary__descriptor,
    &tangram__worker__v1__hello__descriptor,
    &tangram__worker__v1__heartbeat__descriptor,
    &tangram__worker__v1__worker_sampling__descriptor,
    &tangram__worker__v1__plan_entry__descriptor,
    &tangram__worker__v1__page_delta__descriptor,
    &tangram__worker__v1__batch_plan__descriptor,
    &tangram__worker__v1__sampled_token__descriptor,
    &tangram__worker__v1__step_result__descriptor,
    &tangram__worker__v1__shutdown__descriptor,
    &tangram__worker__v1__grammar_prepare__descriptor,
    &tangram__worker__v1__grammar_command__descriptor,
    &tangram__worker__v1__grammar_ready__descriptor,
    &tangram__worker__v1__grammar_report__descriptor,
    &tangram__worker__v1__worker_message__descriptor,
};
#define N_DESCS (sizeof(all_descs) / sizeof(all_descs[0]))

static void expect_reject(const ProtobufCMessageDescriptor *d,
                          const uint8_t *b, size_t n)
{
    ProtobufCMessage *m = protobuf_c_message_unpack(d, &counting, n, b);
    if (m)
        fail_msg("%s accepted %zu malformed bytes", d->name, n);
    assert_int_equal(live_blocks, 0); /* nothing leaked on the way out */
}

static void test_garbage_rejected(void **state)
{
    (void)state;
    /* 0xff.. is field 31 (and larger) with wire type 7, which does not
     * exist; an unterminated varint; a length prefix past the end; a
     * 2^31 length; an 11-byte varint; wire type 3/4 (groups). */
    static const uint8_t ff[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0xff};
    static const uint8_t open_varint[] = {0x08, 0x80};
    static const uint8_t past_end[] = {0x0a, 0x05, 'a', 'b'};
    static const uint8_t huge_len[] = {0x0a, 0x80, 0x80, 0x80, 0x80, 0x08};
    static const uint8_t long_varint[] = {0x08, 0x80, 0x80, 0x80, 0x80, 0x80,
                                          0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    static const uint8_t zero_tag[] = {0x00, 0x01};
    static const uint8_t group[] = {0x0b, 0x0c};
    static const uint8_t wt7[] = {0x0f, 0x00};
    for (size_t i = 0; i < N_DESCS; i++) {
        const ProtobufCMessageDescriptor *d = all_descs[i];
        expect_reject(d, ff, sizeof(ff));
        expect_reject(d, open_varint, sizeof(open_varint));
        expect_reject(d, past_end, sizeof(past_end));
        expect_reject(d, huge_len, sizeof(huge_len));
        expect_reject(d, long_varint, sizeof(long_varint));
        expect_reject(d, zero_tag, sizeof(zero_tag));
        expect_reject(d, group, sizeof(group));
        expect_reject(d, wt7, sizeof(wt7));
    }

    /* Random bytes: never a crash, never a leak (acceptance is allowed
     * when the bytes happen to form valid fields). */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    uint8_t rnd[64];
    int rejected = 0, total = 0;
    for (int round = 0; round < 400; round++) {
        for (size_t j = 0; j < sizeof(rnd); j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            rnd[j] = (uint8_t)x;
        }
        for (size_t i = 0; i < N_DESCS; i++) {
            ProtobufCMessage *m = protobuf_c_message_unpack(
                all_descs[i], &counting, 1 + round % 64, rnd);
            total++;
            if (m)
                protobuf_c_message_free_unpacked(m, &counting);
            else
                rejected++;
            assert_int_equal(live_blocks, 0);
        }
    }
    assert_true(rejected > total * 9 / 10);
}

/* Wrong wire types for known fields are errors, not silent zeros. */
static void test_wrong_wire_type(void **state)
{
    (void)state;
    /* GenerateRequest.request_id (1, string) sent as a varint. */
    static const uint8_t a[] = {0x08, 0x01};
    expect_reject(&tangram__v1__generate_request__descriptor, a, sizeof(a));
    /* GenerateRequest.sampling (6, message) sent as fixed32. */
    static const uint8_t b[] = {0x35, 1, 2, 3, 4};
    expect_reject(&tangram__v1__generate_request__descriptor, b, sizeof(b));
    /* BatchPlan.step_id (2, uint64) sent as a length-delimited field. */
    static const uint8_t c[] = {0x12, 0x01, 0x05};
    expect_reject(&tangram__worker__v1__batch_plan__descriptor, c, sizeof(c));
    /* A nested SamplingParams whose body is garbage. */
    static const uint8_t d[] = {0x32, 0x02, 0xff, 0xff};
    expect_reject(&tangram__v1__generate_request__descriptor, d, sizeof(d));
    /* Packed token ids whose last varint is cut. */
    static const uint8_t e[] = {0x1a, 0x02, 0x01, 0x80};
    expect_reject(&tangram__v1__generate_request__descriptor, e, sizeof(e));
}

/* Cutting a message anywhere inside a field is rejected; cutting between
 * fields yields a shorter valid message. Either way nothing leaks. */
static void test_truncation(void **state)
{
    (void)state;
    uint32_t ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = (uint32_t)i * 1000u;
    Tangram__V1__SamplingParams sp = TANGRAM__V1__SAMPLING_PARAMS__INIT;
    sp.max_tokens_opt_case =
        TANGRAM__V1__SAMPLING_PARAMS__MAX_TOKENS_OPT_MAX_TOKENS;
    sp.max_tokens = 10;
    Tangram__V1__GenerateRequest req = TANGRAM__V1__GENERATE_REQUEST__INIT;
    req.request_id = "r";
    req.prompt = "a prompt that is long enough to cut in the middle";
    req.n_prompt_token_ids = 300;
    req.prompt_token_ids = ids;
    req.sampling = &sp;
    size_t n;
    uint8_t *buf = pack_alloc(&req.base, &n);
    /* Field boundaries: request_id (3 bytes), prompt (2 + 49). */
    size_t prompt_end = 3 + 2 + strlen(req.prompt);
    int accepted = 0;
    for (size_t cut = 0; cut < n; cut++) {
        ProtobufCMessage *m = protobuf_c_message_unpack(
            &tangram__v1__generate_request__descriptor, &counting, cut, buf);
        if (cut > 3 && cut < prompt_end)
            assert_null(m); /* inside the prompt string */
        if (m) {
            accepted++;
            protobuf_c_message_free_unpacked(m, &counting);
        }
        assert_int_equal(live_blocks, 0);
    }
    assert_true(accepted >= 3); /* 0, 3 and prompt_end are boundaries */
    free(buf);
}

/* Fields a newer peer adds are skipped by an older one (forward
 * compatibility of the version-carrying messages). */
static void test_unknown_fields_skipped(void **state)
{
    (void)state;
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = 1;
    hb.seq = 5;
    size_t n;
    uint8_t *buf = pack_alloc(&hb.base, &n);
    uint8_t ext[64];
    memcpy(ext, buf, n);
    /* field 99 varint 7, field 100 string "zz" */
    const uint8_t extra[] = {0x98, 0x06, 0x07, 0xa2, 0x06, 0x02, 'z', 'z'};
    memcpy(ext + n, extra, sizeof(extra));
    Tangram__Worker__V1__Heartbeat *o = tangram__worker__v1__heartbeat__unpack(
        &counting, n + sizeof(extra), ext);
    assert_non_null(o);
    assert_int_equal(o->version, 1);
    assert_int_equal(o->seq, 5);
    release(&o->base);
    free(buf);
}

/* ---- sizes ----------------------------------------------------------------- */

/* gRPC's default maximum message is 4 MiB; the largest requests and plans
 * we send must fit, and get_packed_size must be exact for them. */
static void test_sizes(void **state)
{
    (void)state;
    const size_t grpc_max = 4u << 20;
    /* A 128k-token prompt of ids near the top of a 152k vocabulary. */
    size_t np = 131072;
    uint32_t *ids = malloc(np * sizeof(*ids));
    assert_non_null(ids);
    for (size_t i = 0; i < np; i++)
        ids[i] = 151000u + (uint32_t)(i % 1000);
    Tangram__V1__GenerateRequest req = TANGRAM__V1__GENERATE_REQUEST__INIT;
    req.n_prompt_token_ids = np;
    req.prompt_token_ids = ids;
    size_t n;
    uint8_t *buf = pack_alloc(&req.base, &n);
    /* packed repeated: tag, length varint, 3 bytes per id below 2^21 */
    assert_int_equal(n, 1 + 3 + 3 * np);
    assert_true(n < grpc_max);
    Tangram__V1__GenerateRequest *o =
        tangram__v1__generate_request__unpack(&counting, n, buf);
    assert_non_null(o);
    assert_int_equal(o->n_prompt_token_ids, np);
    assert_memory_equal(o->prompt_token_ids, ids, np * sizeof(*ids));
    release(&o->base);
    free(buf);
    free(ids);

    /* A step of 256 decode requests with a new page for every one of 80
     * layers x 4 groups (worst-case page growth of one step). */
    enum { SLOTS = 256, LAYERS = 80, GROUPS = 4 };
    Tangram__Worker__V1__WorkerSampling ws =
        TANGRAM__WORKER__V1__WORKER_SAMPLING__INIT;
    ws.temperature = 1.0f;
    ws.top_p = 1.0f;
    ws.repetition_penalty = 1.0f;
    Tangram__Worker__V1__PlanEntry *ent = calloc(SLOTS, sizeof(*ent));
    Tangram__Worker__V1__PlanEntry **entp = calloc(SLOTS, sizeof(*entp));
    uint32_t *tok = calloc(SLOTS, sizeof(*tok));
    size_t nd = (size_t)SLOTS * LAYERS * GROUPS;
    Tangram__Worker__V1__PageDelta *del = calloc(nd, sizeof(*del));
    Tangram__Worker__V1__PageDelta **delp = calloc(nd, sizeof(*delp));
    uint32_t *pg = calloc(nd, sizeof(*pg));
    assert_true(ent && entp && tok && del && delp && pg);
    for (int s = 0; s < SLOTS; s++) {
        Tangram__Worker__V1__PlanEntry e = TANGRAM__WORKER__V1__PLAN_ENTRY__INIT;
        e.slot = (uint32_t)s;
        e.request_id = "cmpl-0123456789abcdef";
        e.kind = TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE;
        tok[s] = 100000u + (uint32_t)s;
        e.n_token_ids = 1;
        e.token_ids = &tok[s];
        e.start_pos = 100000;
        e.sampling = &ws;
        e.seed = 0xdeadbeefcafef00dull;
        e.sample = 1;
        e.num_prompt_tokens = 90000;
        ent[s] = e;
        entp[s] = &ent[s];
    }
    for (size_t k = 0; k < nd; k++) {
        Tangram__Worker__V1__PageDelta d = TANGRAM__WORKER__V1__PAGE_DELTA__INIT;
        d.slot = (uint32_t)(k / (LAYERS * GROUPS));
        d.layer = (uint32_t)(k / GROUPS % LAYERS);
        d.group = (uint32_t)(k % GROUPS);
        pg[k] = 4000000u - (uint32_t)k;
        d.n_page_ids = 1;
        d.page_ids = &pg[k];
        del[k] = d;
        delp[k] = &del[k];
    }
    Tangram__Worker__V1__BatchPlan p = TANGRAM__WORKER__V1__BATCH_PLAN__INIT;
    p.version = 1;
    p.step_id = 1ull << 33;
    p.n_entries = SLOTS;
    p.entries = entp;
    p.n_page_deltas = nd;
    p.page_deltas = delp;
    Tangram__Worker__V1__WorkerMessage m =
        TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN;
    m.plan = &p;
    buf = pack_alloc(&m.base, &n);
    assert_true(n < grpc_max);
    assert_true(n > nd * 8); /* each delta costs at least ~10 bytes */
    Tangram__Worker__V1__WorkerMessage *om =
        tangram__worker__v1__worker_message__unpack(&counting, n, buf);
    assert_non_null(om);
    assert_int_equal(om->plan->n_entries, SLOTS);
    assert_int_equal(om->plan->n_page_deltas, nd);
    assert_int_equal(om->plan->page_deltas[nd - 1]->layer, LAYERS - 1);
    assert_int_equal(om->plan->page_deltas[nd - 1]->page_ids[0],
                     4000000u - (uint32_t)(nd - 1));
    assert_int_equal(om->plan->entries[SLOTS - 1]->token_ids[0],
                     100000u + SLOTS - 1);
    release(&om->base);
    /* One byte short of the whole plan is rejected. */
    expect_reject(&tangram__worker__v1__worker_message__descriptor, buf,
                  n - 1);
    free(buf);
    free(ent);
    free(entp);
    free(tok);
    free(del);
    free(delp);
    free(pg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_request),
        cmocka_unit_test(test_optional_unset_vs_zero),
        cmocka_unit_test(test_generate_response),
        cmocka_unit_test(test_small_rpcs),
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_worker_hello_heartbeat_shutdown),
        cmocka_unit_test(test_worker_plan),
        cmocka_unit_test(test_worker_result),
        cmocka_unit_test(test_worker_envelope),
        cmocka_unit_test(test_worker_grammar),
        cmocka_unit_test(test_garbage_rejected),
        cmocka_unit_test(test_wrong_wire_type),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_unknown_fields_skipped),
        cmocka_unit_test(test_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
