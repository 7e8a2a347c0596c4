/* tg_serve_opts.c — the one table of serving options (tg_serve_opts.h). */
#include "common/base/tg_serve_opts.h"
#include "common/base/tg_err.h"

#include <pthread.h>
#include <string.h>

#define OFF(f, ctype) TG_CONFIG_OFFSET(struct tg_serve_opts, f, ctype)

static const char *const backend_choices[] = {"cpu", "cuda", NULL};
/* Same order as enum tg_log_format / enum tg_log_level in common/base/tg_log.h,
 * so the stored index is the enum value. */
static const char *const log_format_choices[] = {"text", "json", NULL};
/* In the order of enum gm_ws (common/grammar/gm_json.h). */
static const char *const ws_choices[] = {"compact", "none", "pretty", "free",
                                         NULL};
static const char *const log_level_choices[] = {"err", "warn", "info",
                                                "debug", NULL};
static const char *const onoff_choices[] = {"off", "on", NULL};
static const char *const cpu_weights_choices[] = {"auto", "f32", "bf16", NULL};
/* Same order as enum tg_decode_compress. */
static const char *const decode_compress_choices[] = {"none", "trig", NULL};

/* tangramd's rows come first, in the order of its --help (and of the flags
 * it forwards); then the router's own; then the worker's own. Laid out by
 * hand, a few fields a line: clang-format would give every field a line. */
/* clang-format off */
static const struct tg_config_entry table[] = {
    {.name = "model", .type = TG_CONFIG_STRING, .def = NULL,
     .offset = OFF(model, char *), .metavar = "DIR",
     .flags = TG_CONFIG_REQUIRED | TG_SERVE_DAEMON | TG_SERVE_ROUTER |
              TG_SERVE_WORKER,
     .help = "Hugging Face model directory (config.json, *.safetensors, "
             "tokenizer.json)."},
    {.name = "profile", .type = TG_CONFIG_STRING, .def = "none",
     .offset = OFF(profile, char *), .metavar = "FILE|none",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Calibrated tangram profile (JSON); none keeps full KV for "
             "every head."},
    {.name = "profile-force", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(profile_force, bool),
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Serve a profile whose model identity is not the model's (made "
             "for another model of the same shape), with a warning, instead "
             "of refusing to start."},
    {.name = "backend", .type = TG_CONFIG_ENUM, .def = "cpu",
     .offset = OFF(backend, int), .choices = backend_choices,
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Kernel backend of the workers."},
    {.name = "cpu-weights", .type = TG_CONFIG_ENUM, .def = "auto",
     .offset = OFF(cpu_weights, int), .choices = cpu_weights_choices,
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "CPU backend: the weight matrices in host memory. auto keeps a "
             "bf16 checkpoint's bf16 (exact, half the bytes a decode step "
             "reads) and makes fp16/fp32 ones fp32; f32 or bf16 (rounded to "
             "nearest even) whatever the checkpoint holds."},
    {.name = "tp", .type = TG_CONFIG_INT, .def = "1", .min = 1, .max = 64,
     .offset = OFF(tp, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Tensor-parallel ranks (one worker process per rank)."},
    {.name = "host", .type = TG_CONFIG_STRING, .def = "127.0.0.1",
     .offset = OFF(host, char *), .metavar = "ADDR",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Address the HTTP and gRPC servers listen on."},
    {.name = "http-port", .type = TG_CONFIG_INT, .def = "8000", .min = 1,
     .max = 65535, .offset = OFF(http_port, int64_t), .metavar = "PORT",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Port of the OpenAI-compatible HTTP API."},
    {.name = "grpc-port", .type = TG_CONFIG_INT, .def = "50051", .min = 1,
     .max = 65535, .offset = OFF(grpc_port, int64_t), .metavar = "PORT",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Port of the gRPC API (HTTP/2 cleartext)."},
    {.name = "heads-per-group", .type = TG_CONFIG_INT, .def = "4", .min = 1,
     .max = 128, .offset = OFF(heads_per_group, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "KV heads per page group (H_p); a profile fixes its own."},
    {.name = "page-size", .type = TG_CONFIG_INT, .def = "16", .min = 1,
     .max = 1024, .offset = OFF(page_size, int64_t), .metavar = "TOKENS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Tokens per KV page (P)."},
    {.name = "prefill-chunk", .type = TG_CONFIG_INT, .def = "512", .min = 1,
     .max = 1048576, .offset = OFF(prefill_chunk, int64_t),
     .metavar = "TOKENS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Prefill chunk length C; compression runs per chunk."},
    /* The compression method and gvote's parameters (DESIGN.md §4.8; the
     * ranges are gpu_worker/gw_gvote.h's). Only the workers use them; the
     * router learns from their Hello whether the method keeps per-head
     * lengths. */
    {.name = "method", .type = TG_CONFIG_STRING, .offset = OFF(method, char *),
     .metavar = "NAME",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Scoring method of prefill compression: snapkv, keydiff, "
             "expected_attention or gvote (adaptive per-request budgets "
             "inside the reservation). "
             "Default: the profile's (snapkv without one)."},
    {.name = "gvote-p", .type = TG_CONFIG_DOUBLE, .def = "0.95", .min = 1e-9,
     .max = 1, .offset = OFF(gvote_p, double), .metavar = "P",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "gvote: attention mass of the real query's nucleus."},
    {.name = "gvote-samples", .type = TG_CONFIG_INT, .def = "8", .min = 0,
     .max = 256, .offset = OFF(gvote_samples, int64_t), .metavar = "S",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "gvote: synthetic queries per query head (0: deterministic)."},
    {.name = "gvote-future", .type = TG_CONFIG_INT, .def = "32", .min = 1,
     .max = 65536, .offset = OFF(gvote_future, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "gvote: future positions averaged into the synthetic queries' "
             "rotation."},
    /* Decode-time compression (DESIGN.md §4.9; the cap rule is
     * common/kv/kv_trig.h's). The workers compact; the router needs the
     * caps for its admission bound and to check the workers' reports. */
    {.name = "decode-compress", .type = TG_CONFIG_ENUM, .def = "none",
     .offset = OFF(decode_compress, int), .choices = decode_compress_choices,
     .metavar = "MODE",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Decode-time compression: none, or trig (every --decode-every "
             "decoded tokens, heads over their cap keep their best KV by "
             "the profile's trig statistics)."},
    {.name = "decode-budget", .type = TG_CONFIG_INT, .def = "2048",
     .min = 1, .max = 2147483647.0, .offset = OFF(decode_budget, int64_t),
     .metavar = "TOKENS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "trig: decode KV per head c (scaled per head by the profile's "
             "budgets); at least 4 + --decode-window."},
    {.name = "decode-budget-uniform", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(decode_budget_uniform, bool),
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "trig: every head keeps --decode-budget (no per-head scaling)."},
    {.name = "decode-every", .type = TG_CONFIG_INT, .def = "128", .min = 1,
     .max = 1048576, .offset = OFF(decode_every, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "trig: decoded tokens between compactions (beta)."},
    {.name = "decode-window", .type = TG_CONFIG_INT, .def = "32", .min = 0,
     .max = 1048576, .offset = OFF(decode_window, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "trig: latest decoded entries always kept (W_d)."},
    {.name = "trig-stats", .type = TG_CONFIG_STRING, .def = "",
     .offset = OFF(trig_stats, char *), .metavar = "FILE",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "trig: take the statistics from this profile file of the same "
             "model (needed with --profile none; overrides the profile's "
             "own)."},
    {.name = "max-num-seqs", .type = TG_CONFIG_INT, .def = "256", .min = 1,
     .max = 65536, .offset = OFF(max_num_seqs, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Most requests running in one step (a worker's request "
             "slots)."},
    {.name = "max-batched-tokens", .type = TG_CONFIG_INT, .def = "0",
     .min = 0, .max = 16777216, .offset = OFF(max_batched_tokens, int64_t),
     .metavar = "TOKENS", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Most tokens (decode plus prefill chunks) in one step; 0 picks "
             "the backend's: 2048 on cpu, 8192 on cuda (at least "
             "--prefill-chunk and --max-num-seqs)."},
    {.name = "kv-memory", .type = TG_CONFIG_SIZE_FRAC, .def = "0.9",
     .min = 1048576, .max = 1125899906842624.0,
     .offset = OFF(kv_memory, struct tg_config_amount),
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "KV pool per rank, bytes (8GiB) or a fraction (0.9, 90%). CUDA: "
             "of the GPU's free memory after weights and activations. CPU: "
             "of the host memory available at start after the fp32 weights "
             "and a system reserve (5% of RAM, 1-16 GiB), shared by all --tp "
             "ranks, so the default leaves the host healthy at any --tp; "
             "bytes that do not fit are refused at start."},
    /* The host-memory tier of stored conversations (DESIGN.md §4.10).
     * Only the workers allocate it; the router learns each rank's pages
     * from its Hello. */
    {.name = "kv-host-memory", .type = TG_CONFIG_SIZE, .def = "2GiB",
     .min = 0, .max = 1125899906842624.0,
     .offset = OFF(kv_host_memory, uint64_t), .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Host-memory tier per rank for stored conversations: the KV "
             "the device pool would evict is copied here (pinned memory on "
             "CUDA) and copied back when the conversation returns, instead "
             "of being prefilled again; least recently used first out. 0 "
             "turns it off. Checked at start against the host's available "
             "memory; on the CPU backend it comes out of that memory before "
             "a --kv-memory fraction is taken."},
    {.name = "max-queued", .type = TG_CONFIG_INT, .def = "1024", .min = 1,
     .max = 16777216, .offset = OFF(max_queued, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Waiting requests beyond which new ones get 429."},
    /* Matched to the worker's compile queue (GW_GRAMMAR_QUEUE): past it
     * a compile would wait behind ~32 others per compile thread. */
    {.name = "max-grammar-compiles", .type = TG_CONFIG_INT, .def = "64",
     .min = 1, .max = 64, .offset = OFF(max_grammar_compiles, int64_t),
     .metavar = "N", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Output constraints (response_format schemas, strict tools) "
             "whose grammar worker rank 0 is still compiling or has queued "
             "to compile, at most; a request needing one more gets 429 "
             "grammar_queue_full with Retry-After before it is queued. A "
             "grammar already prepared costs nothing here. At most the "
             "worker's compile queue (64)."},
    {.name = "structured-whitespace", .type = TG_CONFIG_ENUM,
     .def = "compact", .offset = OFF(structured_whitespace, int),
     .choices = ws_choices, .metavar = "POLICY",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Whitespace in JSON that structured outputs generate, unless "
             "the request's structured_outputs.whitespace says otherwise: "
             "compact (at most one space after ':' and ','), none, pretty "
             "(newlines and indents, at most 20) or free (any JSON "
             "whitespace, at most 20 characters a gap)."},
    {.name = "grammar-compile-timeout", .type = TG_CONFIG_DOUBLE,
     .def = "10", .min = 0.1, .max = 600.0,
     .offset = OFF(grammar_compile_timeout, double), .metavar = "SECONDS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Wall time one output constraint's grammar may take to compile "
             "on worker rank 0 (beside the steps, on the compile pool); past "
             "it the request fails with 400 naming the limit. Raise it on a "
             "machine whose cores are shared (a compile slows with the "
             "load)."},
    {.name = "grammar-cache-memory", .type = TG_CONFIG_SIZE,
     .def = "256MiB", .min = 16777216.0, .max = 68719476736.0,
     .offset = OFF(grammar_cache_memory, uint64_t), .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Compiled grammars of output constraints that worker rank 0 "
             "keeps for reuse, in bytes (least recently used out first); "
             "one grammar may take half of it at most, a bigger one fails "
             "its request with 400 naming the limit."},
    {.name = "tokenizer-threads", .type = TG_CONFIG_INT, .def = "4", .min = 1,
     .max = 1024, .offset = OFF(tokenizer_threads, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Threads of the router's pool that render and tokenize "
             "prompts off the event loop (libuv's UV_THREADPOOL_SIZE, set "
             "before the loop starts)."},
    {.name = "api-key", .type = TG_CONFIG_STRING, .def = "",
     .offset = OFF(api_key, char *), .metavar = "KEY",
     .flags = TG_CONFIG_SECRET | TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Require 'Authorization: Bearer KEY'; empty disables. Prefer "
             "the environment variable (not visible in ps)."},
    {.name = "log-format", .type = TG_CONFIG_ENUM, .def = "text",
     .offset = OFF(log_format, int), .choices = log_format_choices,
     .metavar = "FORMAT",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Log line format on stderr."},
    {.name = "log-level", .type = TG_CONFIG_ENUM, .def = "info",
     .offset = OFF(log_level, int), .choices = log_level_choices,
     .metavar = "LEVEL",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER,
     .help = "Most verbose level logged."},
    {.name = "shutdown-timeout", .type = TG_CONFIG_DOUBLE, .def = "30",
     .min = 0, .max = 86400, .offset = OFF(shutdown_timeout, double),
     .metavar = "SECONDS", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "On SIGTERM, how long in-flight requests may finish before "
             "they are cut."},
    {.name = "served-model-name", .type = TG_CONFIG_STRING, .def = "",
     .offset = OFF(served_model_name, char *), .metavar = "NAME",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Model id in the API, at most 255 bytes; empty uses the model "
             "directory's name."},
    {.name = "max-model-len", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 16777216, .offset = OFF(max_model_len, int64_t),
     .metavar = "TOKENS", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Context limit (prompt plus output); 0 uses the model's."},
    {.name = "worker-heartbeat-ms", .type = TG_CONFIG_INT, .def = "1000",
     .min = 10, .max = 600000, .offset = OFF(worker_heartbeat_ms, int64_t),
     .metavar = "MS", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Router/worker heartbeat period (the workers beat from a "
             "thread of their own, also during long steps); a worker silent "
             "for 5 periods is declared dead."},
    {.name = "worker-stall-ms", .type = TG_CONFIG_INT, .def = "60000",
     .min = 1000, .max = 86400000, .offset = OFF(worker_stall_ms, int64_t),
     .metavar = "MS", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "A worker that keeps beating but whose compute thread makes no "
             "progress for this long (inside one prefill chunk, decode batch "
             "or draw) is declared dead and restarted."},
    /* tangramd's alone; the router takes it as it takes every tangramd
     * row, and has no use for it. */
    {.name = "router-stall-ms", .type = TG_CONFIG_INT, .def = "15000",
     .min = 0, .max = 86400000, .offset = OFF(router_stall_ms, int64_t),
     .metavar = "MS", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "tangramd kills a router whose event loop has reported nothing "
             "for this long (stopped, or stuck) and restarts it with its "
             "workers, as after a crash; 0 = never. At least 2000 (the "
             "router reports every second)."},
    /* HTTP front end limits (router/net/rt_http.h, docs/DEPLOYMENT.md). */
    {.name = "http-max-connections", .type = TG_CONFIG_INT, .def = "4096",
     .min = 16, .max = 1048576, .offset = OFF(http_max_connections, int64_t),
     .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Open HTTP connections; at the limit the oldest idle one, "
             "else the slowest incomplete request head, is closed for a "
             "new one, else the new one gets 503."},
    {.name = "http-max-connections-per-ip", .type = TG_CONFIG_INT,
     .def = "256", .min = 0, .max = 1048576,
     .offset = OFF(http_max_connections_per_ip, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Open HTTP connections of one client address (its own idle "
             "or slowest ones give way first); 0 = no limit. Behind a proxy "
             "every client has the proxy's address: raise it or set 0."},
    {.name = "http-header-timeout", .type = TG_CONFIG_DOUBLE, .def = "10",
     .min = 0.1, .max = 3600, .offset = OFF(http_header_timeout, double),
     .metavar = "SECONDS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "A request line and headers must arrive within this of their "
             "first byte (408 otherwise)."},
    {.name = "http-body-timeout", .type = TG_CONFIG_DOUBLE, .def = "60",
     .min = 0.1, .max = 86400, .offset = OFF(http_body_timeout, double),
     .metavar = "SECONDS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "A request body must arrive within this of the end of its "
             "head (408 otherwise)."},
    {.name = "http-min-body-rate", .type = TG_CONFIG_SIZE, .def = "16KiB",
     .min = 0, .max = 1073741824.0,
     .offset = OFF(http_min_body_rate, uint64_t), .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Bytes per second a request body must arrive at, in every "
             "5 s from the end of its head (or the rest of it, when less is "
             "left); a slower upload gets 408 and is closed, so a trickling "
             "client holds neither a connection nor body memory for the "
             "whole --http-body-timeout. 0 = no minimum."},
    {.name = "http-idle-timeout", .type = TG_CONFIG_DOUBLE, .def = "60",
     .min = 0.1, .max = 86400, .offset = OFF(http_idle_timeout, double),
     .metavar = "SECONDS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "A keep-alive connection without a request is closed after "
             "this."},
    {.name = "http-send-timeout", .type = TG_CONFIG_DOUBLE, .def = "60",
     .min = 0.1, .max = 86400, .offset = OFF(http_send_timeout, double),
     .metavar = "SECONDS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "A client that reads none of its response (or stream) for "
             "this long is cut off and its request aborted."},
    {.name = "http-max-body", .type = TG_CONFIG_SIZE, .def = "8MiB",
     .min = 4096, .max = 1073741824.0, .offset = OFF(http_max_body, uint64_t),
     .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Largest request body (413 beyond); only read once the API "
             "key was checked."},
    {.name = "metrics-auth", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(metrics_auth, bool),
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Require the API key for /metrics too (by default scrapers "
             "read it without one)."},
    /* Stored responses of the Responses API (router/core/rt_respstore.h,
     * docs/API.md "Responses"). */
    {.name = "responses-db", .type = TG_CONFIG_STRING, .def = "",
     .offset = OFF(responses_db, char *), .metavar = "PATH",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "SQLite database (WAL) that keeps the stored responses of "
             "/v1/responses (their items and token ids, not their KV), so a "
             "restart or a router crash loses no conversation; empty keeps "
             "them in memory only."},
    {.name = "responses-max-entries", .type = TG_CONFIG_INT, .def = "10000",
     .min = 1, .max = 100000000, .offset = OFF(responses_max_entries, int64_t),
     .metavar = "N", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Stored responses held at most; the least recently used go "
             "first (logged, tangram_responses_evicted_total)."},
    {.name = "responses-max-bytes", .type = TG_CONFIG_SIZE, .def = "1GiB",
     .min = 65536, .max = 1125899906842624.0,
     .offset = OFF(responses_max_bytes, uint64_t), .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Bytes of stored responses held at most (token ids, items, "
             "texts); the least recently used go first."},
    {.name = "responses-ttl", .type = TG_CONFIG_DOUBLE, .def = "2592000",
     .min = 1, .max = 3153600000.0, .offset = OFF(responses_ttl, double),
     .metavar = "SECONDS", .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "A stored response older than this is gone (404), default 30 "
             "days as OpenAI keeps them."},
    {.name = "responses-rerender", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(responses_rerender, bool),
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "previous_response_id re-renders the whole conversation with "
             "the chat template (as transformers does) instead of continuing "
             "the stored token ids with the rendering of the new input."},
    {.name = "grpc-recv-timeout", .type = TG_CONFIG_DOUBLE, .def = "30",
     .min = 0.001, .max = 3600, .offset = OFF(grpc_recv_timeout, double),
     .metavar = "SECONDS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "A gRPC request must arrive within this long of its headers "
             "(each message, on a streaming call); else DEADLINE_EXCEEDED."},
    {.name = "grpc-idle-timeout", .type = TG_CONFIG_DOUBLE, .def = "300",
     .min = 0, .max = 86400, .offset = OFF(grpc_idle_timeout, double),
     .metavar = "SECONDS",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Close a gRPC connection with no call in progress and no "
             "response sent for this long; 0 never."},
    {.name = "grpc-max-streams", .type = TG_CONFIG_INT, .def = "100",
     .min = 1, .max = 65536, .offset = OFF(grpc_max_streams, int64_t),
     .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Concurrent streams per gRPC connection "
             "(SETTINGS_MAX_CONCURRENT_STREAMS); more are refused."},
    {.name = "grpc-max-message", .type = TG_CONFIG_SIZE, .def = "4MiB",
     .min = 1024, .max = 268435456.0,
     .offset = OFF(grpc_max_message, uint64_t), .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Largest gRPC request message; larger ones get "
             "RESOURCE_EXHAUSTED."},
    {.name = "grpc-max-connections", .type = TG_CONFIG_INT, .def = "1024",
     .min = 16, .max = 1048576, .offset = OFF(grpc_max_connections, int64_t),
     .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Open gRPC connections; at the limit the oldest idle one (no "
             "call in progress) gets GOAWAY for a new one, else the new one "
             "is refused with GOAWAY."},
    {.name = "grpc-max-connections-per-ip", .type = TG_CONFIG_INT,
     .def = "64", .min = 0, .max = 1048576,
     .offset = OFF(grpc_max_connections_per_ip, int64_t), .metavar = "N",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Open gRPC connections of one client address (its own idle "
             "ones give way first); 0 = no limit."},
    {.name = "max-body-memory", .type = TG_CONFIG_SIZE, .def = "256MiB",
     .min = 1048576.0, .max = 1099511627776.0,
     .offset = OFF(max_body_memory, uint64_t), .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "Request bodies (HTTP bodies, gRPC messages) the router holds "
             "at once, charged as their bytes arrive; a request whose "
             "announced body does not fit what is free gets 503 (gRPC "
             "UNAVAILABLE) before its body is read, one that stops fitting "
             "as it arrives gets it then. At least --http-max-body and "
             "--grpc-max-message."},
    {.name = "max-request-memory", .type = TG_CONFIG_SIZE, .def = "1GiB",
     .min = 16777216.0, .max = 1099511627776.0,
     .offset = OFF(max_request_memory, uint64_t), .metavar = "BYTES",
     .flags = TG_SERVE_DAEMON | TG_SERVE_ROUTER,
     .help = "What large requests (bodies over 16 KiB, gRPC messages) may "
             "cost the router at once between their parse and their tokens: "
             "parsed JSON, rendered chat and tokenizer scratch, 10 to 100 "
             "times a body's bytes, estimated from one pass over the body "
             "before it is parsed. An HTTP request that does not fit waits "
             "its turn with its body; a gRPC call gets UNAVAILABLE (retry); "
             "one that would need more than this gets 413 "
             "(RESOURCE_EXHAUSTED)."},

    /* ---- the router's own ---- */
    {.name = "ipc-endpoint", .type = TG_CONFIG_STRING,
     .offset = OFF(ipc_endpoint, char *), .metavar = "ENDPOINT",
     .flags = TG_SERVE_ROUTER,
     .help = "ZeroMQ endpoint the workers connect to (ipc:// or tcp://)."},
    {.name = "notify-fd", .type = TG_CONFIG_INT, .def = "-1", .min = -1,
     .max = 65535, .offset = OFF(notify_fd, int64_t), .metavar = "FD",
     .flags = TG_SERVE_ROUTER,
     .help = "Pipe to tangramd for state lines (-1: none)."},

    /* ---- a worker's own ---- */
    {.name = "router", .type = TG_CONFIG_STRING, .offset = OFF(router, char *),
     .metavar = "ENDPOINT", .flags = TG_CONFIG_REQUIRED | TG_SERVE_WORKER,
     .help = "Router endpoint: ipc:///path or tcp://host:port."},
    {.name = "rank", .type = TG_CONFIG_INT, .def = "0", .min = 0, .max = 63,
     .offset = OFF(rank, int64_t), .metavar = "R", .flags = TG_SERVE_WORKER,
     .help = "This worker's tensor-parallel rank."},
    {.name = "world-size", .type = TG_CONFIG_INT, .def = "1", .min = 1,
     .max = 64, .offset = OFF(world_size, int64_t), .metavar = "T",
     .flags = TG_SERVE_WORKER, .help = "Tensor-parallel ranks."},
    /* Longer than the router's dead-worker deadline (5 x the heartbeat):
     * a peer that is gone or stopped is found by the router, which
     * restarts the group; this bound is the fallback for a router that is
     * gone too, and must not end a rank that waits for a slow but live
     * peer on a loaded machine. */
    {.name = "comm-timeout-ms", .type = TG_CONFIG_INT, .def = "30000",
     .min = 100, .max = 3600000, .offset = OFF(comm_timeout_ms, int64_t),
     .metavar = "MS", .flags = TG_SERVE_WORKER,
     .help = "Longest wait for the other ranks (joining, each all-reduce) "
             "before giving up with exit status 6 (join) or 5."},
    {.name = "comm-setup-timeout-ms", .type = TG_CONFIG_INT,
     .def = "300000", .min = 100, .max = 86400000,
     .offset = OFF(comm_setup_timeout_ms, int64_t), .metavar = "MS",
     .flags = TG_SERVE_WORKER,
     .help = "Longest wait after the Hello for the router's CommSetup (it "
             "comes once every rank has loaded) before exiting with "
             "status 6."},
    {.name = "kv-pages", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 2147483647.0, .offset = OFF(kv_pages, int64_t),
     .flags = TG_SERVE_WORKER,
     .help = "KV pool pages; 0 sizes the pool from --kv-memory."},
    {.name = "heartbeat-ms", .type = TG_CONFIG_INT, .def = "1000", .min = 1,
     .max = 3600000, .offset = OFF(heartbeat_ms, int64_t), .metavar = "MS",
     .flags = TG_SERVE_WORKER, .help = "Period of the worker's heartbeats."},
    {.name = "router-timeout-ms", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 86400000, .offset = OFF(router_timeout_ms, int64_t),
     .metavar = "MS", .flags = TG_SERVE_WORKER,
     .help = "Router silence after which the worker exits with status 3 "
             "(0 = 10 x heartbeat-ms, at least 10 s)."},
    {.name = "threads", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 1024, .offset = OFF(threads, int64_t), .flags = TG_SERVE_WORKER,
     .help = "CPU threads (0 = all)."},
    {.name = "device", .type = TG_CONFIG_INT, .def = "-1", .min = -1,
     .max = 1023, .offset = OFF(device, int64_t), .flags = TG_SERVE_WORKER,
     .help = "CUDA device of this rank (-1 = the rank: one worker per GPU)."},
    {.name = "cuda-graphs", .type = TG_CONFIG_ENUM, .def = "on",
     .offset = OFF(cuda_graphs, int), .choices = onoff_choices,
     .flags = TG_SERVE_WORKER,
     .help = "Capture decode steps as CUDA graphs per batch-size bucket."},
    {.name = "step-timeout-ms", .type = TG_CONFIG_INT, .def = "120000",
     .min = 1000, .max = 86400000, .offset = OFF(step_timeout_ms, int64_t),
     .metavar = "MS", .flags = TG_SERVE_WORKER,
     .help = "CUDA backend with T > 1: a step waiting longer aborts the NCCL "
             "group (a peer is gone) and the worker exits for a restart."},
};
/* clang-format on */

#define NROWS (sizeof table / sizeof table[0])

/* The worker run by hand has no tangramd to plan its memory or pick its
 * layout (tg_serve_opts.h): its own default and help for these rows.
 * tangramd always forwards both. */
static const struct {
    const char *name, *def, *help;
} worker_alone[] = {
    {"heads-per-group", "1", "Heads per page group without a profile."},
    {"kv-memory", "0.5",
     "KV pool: a fraction of the available host memory (0.5, 50%) or "
     "bytes (8GiB)."},
    {"kv-host-memory", "0",
     "Host-memory tier of stored conversations, bytes (0: none; tangramd "
     "passes its own, 2GiB by default)."},
};

/* Index into `tables` of each program; the last holds every row. */
enum { T_DAEMON, T_ROUTER, T_WORKER, T_ALL, NTABLES };

static struct tg_config_entry tables[NTABLES][NROWS];
static size_t ntables[NTABLES];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void)
{
    static const unsigned marks[T_ALL] = {TG_SERVE_DAEMON, TG_SERVE_ROUTER,
                                          TG_SERVE_WORKER};
    for (size_t i = 0; i < NROWS; i++) {
        for (int t = 0; t < T_ALL; t++)
            if (table[i].flags & marks[t])
                tables[t][ntables[t]++] = table[i];
        tables[T_ALL][ntables[T_ALL]++] = table[i];
    }
    for (size_t k = 0; k < sizeof worker_alone / sizeof worker_alone[0];
         k++) {
        size_t i = 0;
        while (i < ntables[T_WORKER] &&
               strcmp(tables[T_WORKER][i].name, worker_alone[k].name) != 0)
            i++;
        TG_ASSERT(i < ntables[T_WORKER]); /* names a worker row */
        tables[T_WORKER][i].def = worker_alone[k].def;
        tables[T_WORKER][i].help = worker_alone[k].help;
    }
}

const struct tg_config_entry *tg_serve_opts_table(unsigned who, size_t *n)
{
    int t = who == TG_SERVE_DAEMON   ? T_DAEMON
            : who == TG_SERVE_ROUTER ? T_ROUTER
            : who == TG_SERVE_WORKER ? T_WORKER
                                     : T_ALL;
    TG_ASSERT(who == 0 || t != T_ALL);
    pthread_once(&tables_once, build_tables);
    *n = ntables[t];
    return tables[t];
}

int tg_serve_opts_forward(const struct tg_serve_opts *o, unsigned child,
                          char ***argv, size_t *argc, char *err,
                          size_t errlen)
{
    if (child != TG_SERVE_ROUTER && child != TG_SERVE_WORKER)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "forwarding to mark 0x%x: not a child program",
                          child);
    for (size_t i = 0; i < NROWS; i++) {
        const struct tg_config_entry *e = &table[i];
        if (!(e->flags & TG_SERVE_DAEMON) || !(e->flags & child))
            continue;
        int rc = tg_config_to_argv(e, 1, o, NULL, TG_CONFIG_SECRET, argv,
                                   argc, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void tg_serve_opts_free(struct tg_serve_opts *o)
{
    tg_config_free(table, NROWS, o);
}

void tg_serve_opts_resolve(struct tg_serve_opts *o)
{
    if (o->max_batched_tokens > 0)
        return;
    int64_t b = o->backend == TG_SERVE_BACKEND_CUDA
                    ? TG_SERVE_BATCHED_TOKENS_CUDA
                    : TG_SERVE_BATCHED_TOKENS_CPU;
    if (b < o->prefill_chunk)
        b = o->prefill_chunk;
    if (b < o->max_num_seqs)
        b = o->max_num_seqs;
    o->max_batched_tokens = b;
}
