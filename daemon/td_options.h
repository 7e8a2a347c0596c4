/*
 * td_options.h — every tangramd option (DESIGN.md §5) as one declarative
 * tg_config table, and the struct it fills.
 *
 * Each flag `--name` is also read from the environment as TANGRAM_<NAME>
 * ('-' -> '_'; e.g. TANGRAM_HTTP_PORT, TANGRAM_API_KEY, which keeps the key
 * out of `ps`). Precedence: flag > environment > default. After the table is
 * applied, td_options_parse normalizes a few values and checks the options
 * that constrain each other (see td_options_parse).
 */
#ifndef TD_OPTIONS_H
#define TD_OPTIONS_H

#include "common/tg_config.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* --backend. Values are the indices of the choices "cpu", "cuda". */
enum td_backend {
    TD_BACKEND_CPU = 0,
    TD_BACKEND_CUDA = 1,
};

struct td_options {
    char *model;              /* Hugging Face model directory (required) */
    char *profile;            /* profile JSON path; NULL = none (full KV) */
    int backend;              /* enum td_backend */
    int64_t tp;               /* tensor-parallel ranks, 1..64 */
    char *host;               /* address the HTTP and gRPC servers bind */
    int64_t http_port;        /* OpenAI-compatible HTTP API, 1..65535 */
    int64_t grpc_port;        /* gRPC API (h2c), 1..65535 */
    int64_t heads_per_group;  /* H_p of DESIGN §1.2, heads per page group */
    int64_t page_size;        /* P, tokens per page */
    int64_t prefill_chunk;    /* C of DESIGN §4.3, tokens per prefill chunk */
    int64_t max_num_seqs;     /* running requests per step */
    int64_t max_batched_tokens; /* tokens per step (decode + chunks) */
    struct tg_config_amount kv_memory; /* KV pool per rank: a fraction of
                                          the free device (or host) memory,
                                          or bytes */
    int64_t max_queued;       /* waiting requests before 429 */
    char *api_key;            /* bearer key; "" = no authentication */
    int log_format;           /* enum tg_log_format (text=0, json=1) */
    int log_level;            /* enum tg_log_level (err=0 .. debug=3) */
    double shutdown_timeout;  /* seconds a drain may take before in-flight
                                 requests are cut */
    char *served_model_name;  /* model id in the API; defaults to the last
                                 path component of model */
    int64_t max_model_len;    /* context limit in tokens; 0 = the model's */
    int64_t worker_heartbeat_ms; /* router<->worker heartbeat period, ms */
    /* HTTP front end limits (router/rt_http.h; docs/DEPLOYMENT.md) */
    int64_t http_max_connections; /* open HTTP connections */
    int64_t http_max_connections_per_ip; /* per client address; 0 = off */
    double http_header_timeout;  /* seconds for a request head */
    double http_body_timeout;    /* seconds for a request body */
    double http_idle_timeout;    /* seconds a keep-alive connection idles */
    double http_send_timeout;    /* seconds a response may make no progress
                                    (a client that stopped reading) */
    uint64_t http_max_body;      /* bytes of a request body */
    bool metrics_auth;           /* /metrics needs the API key too */
    double grpc_recv_timeout; /* seconds a gRPC request (each message of a
                                 streaming request) may take to arrive */
    double grpc_idle_timeout; /* seconds before an idle gRPC connection is
                                 closed; 0 = never */
    int64_t grpc_max_streams; /* concurrent streams per gRPC connection */
    uint64_t grpc_max_message; /* bytes of one gRPC request message */
};

/* The option table (static, read-only) and its length. */
const struct tg_config_entry *td_options_table(size_t *n);

/* Parses argv/envp into *o (see tg_config_parse for the syntax; envp is
 * `environ` in the daemon, NULL to ignore the environment). *o must be
 * zeroed or hold a previous parse. Afterwards: profile "none" (any case) or
 * "" becomes NULL; an empty served_model_name becomes the last component of
 * model ("/models/llama-3-8b/" -> "llama-3-8b"). Cross-checks:
 * max_batched_tokens >= prefill_chunk (a chunk must fit in one step) and
 * max_batched_tokens >= max_num_seqs (every running request may decode).
 * Positional arguments are rejected. --help / -h returns TG_EDONE and
 * writes nothing: the caller prints td_options_help(stdout) and exits 0.
 * Returns 0 or a negative TG_E* code with detail in err naming the flag or
 * environment variable. On every return *o may own strings: call
 * td_options_free. Thread: any, one *o at a time. */
int td_options_parse(struct td_options *o, int argc, char **argv,
                     char **envp, char *err, size_t errlen);

/* Writes tangramd's --help to `out`. Returns 0 or TG_EIO. */
int td_options_help(FILE *out);

/* Returns the effective options as a new JSON object (caller decrefs; the
 * API key is masked), for the start-up log line; NULL when out of memory. */
json_t *td_options_dump_json(const struct td_options *o);

/* Frees the strings of *o and sets them to NULL. Safe on a zeroed struct,
 * after a failed parse, and twice. */
void td_options_free(struct td_options *o);

#endif /* TD_OPTIONS_H */
