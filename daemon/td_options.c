/* td_options.c — the tangramd option table (td_options.h). */
#include "daemon/td_options.h"
#include "common/tg_err.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define OFF(f, ctype) TG_CONFIG_OFFSET(struct td_options, f, ctype)

static const char *const backend_choices[] = {"cpu", "cuda", NULL};
/* Same order as enum tg_log_format / enum tg_log_level in common/tg_log.h,
 * so the stored index is the enum value. */
static const char *const log_format_choices[] = {"text", "json", NULL};
static const char *const log_level_choices[] = {"err", "warn", "info",
                                                "debug", NULL};

static const struct tg_config_entry table[] = {
    {.name = "model", .type = TG_CONFIG_STRING, .def = NULL,
     .offset = OFF(model, char *), .metavar = "DIR",
     .flags = TG_CONFIG_REQUIRED,
     .help = "Hugging Face model directory (config.json, *.safetensors, "
             "tokenizer.json)."},
    {.name = "profile", .type = TG_CONFIG_STRING, .def = "none",
     .offset = OFF(profile, char *), .metavar = "FILE|none",
     .help = "Calibrated tangram profile (JSON); none keeps full KV for "
             "every head."},
    {.name = "backend", .type = TG_CONFIG_ENUM, .def = "cpu",
     .offset = OFF(backend, int), .choices = backend_choices,
     .help = "Kernel backend of the workers."},
    {.name = "tp", .type = TG_CONFIG_INT, .def = "1", .min = 1, .max = 64,
     .offset = OFF(tp, int64_t), .metavar = "N",
     .help = "Tensor-parallel ranks (one worker process per rank)."},
    {.name = "host", .type = TG_CONFIG_STRING, .def = "127.0.0.1",
     .offset = OFF(host, char *), .metavar = "ADDR",
     .help = "Address the HTTP and gRPC servers listen on."},
    {.name = "http-port", .type = TG_CONFIG_INT, .def = "8000", .min = 1,
     .max = 65535, .offset = OFF(http_port, int64_t), .metavar = "PORT",
     .help = "Port of the OpenAI-compatible HTTP API."},
    {.name = "grpc-port", .type = TG_CONFIG_INT, .def = "50051", .min = 1,
     .max = 65535, .offset = OFF(grpc_port, int64_t), .metavar = "PORT",
     .help = "Port of the gRPC API (HTTP/2 cleartext)."},
    {.name = "heads-per-group", .type = TG_CONFIG_INT, .def = "4", .min = 1,
     .max = 128, .offset = OFF(heads_per_group, int64_t), .metavar = "N",
     .help = "KV heads per page group (H_p); a profile fixes its own."},
    {.name = "page-size", .type = TG_CONFIG_INT, .def = "16", .min = 1,
     .max = 1024, .offset = OFF(page_size, int64_t), .metavar = "TOKENS",
     .help = "Tokens per KV page (P)."},
    {.name = "prefill-chunk", .type = TG_CONFIG_INT, .def = "512", .min = 1,
     .max = 1048576, .offset = OFF(prefill_chunk, int64_t),
     .metavar = "TOKENS",
     .help = "Prefill chunk length C; compression runs per chunk."},
    {.name = "max-num-seqs", .type = TG_CONFIG_INT, .def = "256", .min = 1,
     .max = 65536, .offset = OFF(max_num_seqs, int64_t), .metavar = "N",
     .help = "Most requests running in one step."},
    {.name = "max-batched-tokens", .type = TG_CONFIG_INT, .def = "8192",
     .min = 1, .max = 16777216, .offset = OFF(max_batched_tokens, int64_t),
     .metavar = "TOKENS",
     .help = "Most tokens (decode plus prefill chunks) in one step."},
    {.name = "kv-memory", .type = TG_CONFIG_SIZE_FRAC, .def = "0.9",
     .min = 1048576, .max = 1125899906842624.0,
     .offset = OFF(kv_memory, struct tg_config_amount),
     .help = "KV pool per rank, bytes (8GiB) or a fraction (0.9, 90%). CUDA: "
             "of the GPU's free memory after weights and activations. CPU: "
             "of the host memory available at start after the fp32 weights "
             "and a system reserve (5% of RAM, 1-16 GiB), shared by all --tp "
             "ranks, so the default leaves the host healthy at any --tp; "
             "bytes that do not fit are refused at start."},
    {.name = "max-queued", .type = TG_CONFIG_INT, .def = "1024", .min = 1,
     .max = 16777216, .offset = OFF(max_queued, int64_t), .metavar = "N",
     .help = "Waiting requests beyond which new ones get 429."},
    {.name = "api-key", .type = TG_CONFIG_STRING, .def = "",
     .offset = OFF(api_key, char *), .metavar = "KEY",
     .flags = TG_CONFIG_SECRET,
     .help = "Require 'Authorization: Bearer KEY'; empty disables. Prefer "
             "the environment variable (not visible in ps)."},
    {.name = "log-format", .type = TG_CONFIG_ENUM, .def = "text",
     .offset = OFF(log_format, int), .choices = log_format_choices,
     .metavar = "FORMAT",
     .help = "Log line format on stderr."},
    {.name = "log-level", .type = TG_CONFIG_ENUM, .def = "info",
     .offset = OFF(log_level, int), .choices = log_level_choices,
     .metavar = "LEVEL",
     .help = "Most verbose level logged."},
    {.name = "shutdown-timeout", .type = TG_CONFIG_DOUBLE, .def = "30",
     .min = 0, .max = 86400, .offset = OFF(shutdown_timeout, double),
     .metavar = "SECONDS",
     .help = "On SIGTERM, how long in-flight requests may finish before "
             "they are cut."},
    {.name = "served-model-name", .type = TG_CONFIG_STRING, .def = "",
     .offset = OFF(served_model_name, char *), .metavar = "NAME",
     .help = "Model id in the API; empty uses the model directory's name."},
    {.name = "max-model-len", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 16777216, .offset = OFF(max_model_len, int64_t),
     .metavar = "TOKENS",
     .help = "Context limit (prompt plus output); 0 uses the model's."},
    {.name = "worker-heartbeat-ms", .type = TG_CONFIG_INT, .def = "1000",
     .min = 10, .max = 600000, .offset = OFF(worker_heartbeat_ms, int64_t),
     .metavar = "MS",
     .help = "Router/worker heartbeat period; a peer silent for several "
             "periods is declared dead."},
    /* HTTP front end limits (router/rt_http.h, docs/DEPLOYMENT.md). */
    {.name = "http-max-connections", .type = TG_CONFIG_INT, .def = "4096",
     .min = 16, .max = 1048576, .offset = OFF(http_max_connections, int64_t),
     .metavar = "N",
     .help = "Open HTTP connections; at the limit the oldest idle one is "
             "closed for a new one, else the new one gets 503."},
    {.name = "http-max-connections-per-ip", .type = TG_CONFIG_INT,
     .def = "0", .min = 0, .max = 1048576,
     .offset = OFF(http_max_connections_per_ip, int64_t), .metavar = "N",
     .help = "Open HTTP connections of one client address; 0 = no limit "
             "(behind a proxy every client has the proxy's address)."},
    {.name = "http-header-timeout", .type = TG_CONFIG_DOUBLE, .def = "10",
     .min = 0.1, .max = 3600, .offset = OFF(http_header_timeout, double),
     .metavar = "SECONDS",
     .help = "A request line and headers must arrive within this of their "
             "first byte (408 otherwise)."},
    {.name = "http-body-timeout", .type = TG_CONFIG_DOUBLE, .def = "60",
     .min = 0.1, .max = 86400, .offset = OFF(http_body_timeout, double),
     .metavar = "SECONDS",
     .help = "A request body must arrive within this of the end of its "
             "head (408 otherwise)."},
    {.name = "http-idle-timeout", .type = TG_CONFIG_DOUBLE, .def = "60",
     .min = 0.1, .max = 86400, .offset = OFF(http_idle_timeout, double),
     .metavar = "SECONDS",
     .help = "A keep-alive connection without a request is closed after "
             "this."},
    {.name = "http-send-timeout", .type = TG_CONFIG_DOUBLE, .def = "60",
     .min = 0.1, .max = 86400, .offset = OFF(http_send_timeout, double),
     .metavar = "SECONDS",
     .help = "A client that reads none of its response (or stream) for "
             "this long is cut off and its request aborted."},
    {.name = "http-max-body", .type = TG_CONFIG_SIZE, .def = "8MiB",
     .min = 4096, .max = 1073741824.0, .offset = OFF(http_max_body, uint64_t),
     .metavar = "BYTES",
     .help = "Largest request body (413 beyond); only read once the API "
             "key was checked."},
    {.name = "metrics-auth", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(metrics_auth, bool),
     .help = "Require the API key for /metrics too (by default scrapers "
             "read it without one)."},
    {.name = "grpc-recv-timeout", .type = TG_CONFIG_DOUBLE, .def = "30",
     .min = 0.001, .max = 3600, .offset = OFF(grpc_recv_timeout, double),
     .metavar = "SECONDS",
     .help = "A gRPC request must arrive within this long of its headers "
             "(each message, on a streaming call); else DEADLINE_EXCEEDED."},
    {.name = "grpc-idle-timeout", .type = TG_CONFIG_DOUBLE, .def = "300",
     .min = 0, .max = 86400, .offset = OFF(grpc_idle_timeout, double),
     .metavar = "SECONDS",
     .help = "Close a gRPC connection with no call in progress and no "
             "response sent for this long; 0 never."},
    {.name = "grpc-max-streams", .type = TG_CONFIG_INT, .def = "100",
     .min = 1, .max = 65536, .offset = OFF(grpc_max_streams, int64_t),
     .metavar = "N",
     .help = "Concurrent streams per gRPC connection "
             "(SETTINGS_MAX_CONCURRENT_STREAMS); more are refused."},
    {.name = "grpc-max-message", .type = TG_CONFIG_SIZE, .def = "4MiB",
     .min = 1024, .max = 268435456.0,
     .offset = OFF(grpc_max_message, uint64_t), .metavar = "BYTES",
     .help = "Largest gRPC request message; larger ones get "
             "RESOURCE_EXHAUSTED."},
};

#define NTABLE (sizeof table / sizeof table[0])

static const char usage[] =
    "usage: tangramd --model DIR [options]\n\n"
    "tangramd serves a Llama-family model over an OpenAI-compatible HTTP API "
    "and gRPC,\nwith per-head (non-uniform) KV-cache compression.";

const struct tg_config_entry *td_options_table(size_t *n)
{
    *n = NTABLE;
    return table;
}

/* Sets *dst to a fresh copy of s[0..len). */
static int replace_string(char **dst, const char *s, size_t len, char *err,
                          size_t errlen)
{
    char *copy = strndup(s, len);
    if (copy == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    free(*dst);
    *dst = copy;
    return 0;
}

static int normalize(struct td_options *o, char *err, size_t errlen)
{
    if (o->profile != NULL &&
        (o->profile[0] == '\0' || strcasecmp(o->profile, "none") == 0)) {
        free(o->profile);
        o->profile = NULL;
    }
    if (o->served_model_name == NULL || o->served_model_name[0] == '\0') {
        /* Last path component of --model, ignoring trailing slashes. */
        const char *m = o->model;
        size_t end = strlen(m);
        while (end > 1 && m[end - 1] == '/')
            end--;
        size_t start = end;
        while (start > 0 && m[start - 1] != '/')
            start--;
        if (start == end) /* "/" alone */
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--model '%s' has no directory name; set "
                              "--served-model-name", m);
        int rc = replace_string(&o->served_model_name, m + start,
                                end - start, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int cross_check(const struct td_options *o, char *err, size_t errlen)
{
    if (o->max_batched_tokens < o->prefill_chunk)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--max-batched-tokens (%lld) must be at least "
                          "--prefill-chunk (%lld): a chunk runs in one step",
                          (long long)o->max_batched_tokens,
                          (long long)o->prefill_chunk);
    if (o->max_batched_tokens < o->max_num_seqs)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--max-batched-tokens (%lld) must be at least "
                          "--max-num-seqs (%lld): every running request "
                          "decodes one token per step",
                          (long long)o->max_batched_tokens,
                          (long long)o->max_num_seqs);
    return 0;
}

int td_options_parse(struct td_options *o, int argc, char **argv,
                     char **envp, char *err, size_t errlen)
{
    int rc = tg_config_parse(table, NTABLE, o, argc, argv, envp, err, errlen);
    if (rc != 0)
        return rc;
    rc = normalize(o, err, errlen);
    if (rc != 0)
        return rc;
    return cross_check(o, err, errlen);
}

int td_options_help(FILE *out)
{
    return tg_config_help(table, NTABLE, usage, out);
}

json_t *td_options_dump_json(const struct td_options *o)
{
    return tg_config_dump_json(table, NTABLE, o);
}

void td_options_free(struct td_options *o)
{
    tg_config_free(table, NTABLE, o);
}
