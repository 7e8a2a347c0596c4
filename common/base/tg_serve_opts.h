/*
 * tg_serve_opts.h — the serving options of tangramd, the router and the
 * workers as one declarative tg_config table (DESIGN.md §5, §8.11), and the
 * struct it fills.
 *
 * Every flag is declared once, as one row. A row carries marks in its
 * flags saying which programs take it:
 *
 *   TG_SERVE_DAEMON  tangramd takes it (its --help, its start-up dump);
 *   TG_SERVE_ROUTER  tangram-router takes it;
 *   TG_SERVE_WORKER  tangram-worker takes it.
 *
 * A row marked for tangramd and a child is forwarded: tangramd hands its
 * value on to that child as "--name=value" (tg_serve_opts_forward), so
 * what the children receive is derived from the table, never listed by
 * hand. Every tangramd row goes to the router; a subset (model, layout,
 * pool and logging) also to the workers. A row marked for a child alone is
 * that process's own (the router's --ipc-endpoint and --notify-fd, a
 * worker's --router, --rank, --world-size, timeouts, --device ...):
 * tangramd sets those itself when it starts the child, or they keep their
 * defaults.
 *
 * Each flag `--name` is also read from the environment as TANGRAM_<NAME>
 * ('-' -> '_'; e.g. TANGRAM_HTTP_PORT, TANGRAM_API_KEY) by every program
 * that takes it. Precedence: flag > environment > default. The API key
 * (TG_CONFIG_SECRET) is never forwarded on a command line: tangramd passes
 * it to the router in TANGRAM_API_KEY.
 *
 * tangram-worker run by hand (tests, debugging) has no tangramd to plan its
 * memory, so three rows have a more cautious default in the worker's
 * table: --kv-memory 0.5 (of the available host memory), --heads-per-group
 * 1 and --kv-host-memory 0 (no host tier). tangramd always forwards all
 * three, so a served worker never sees them.
 */
#ifndef TG_SERVE_OPTS_H
#define TG_SERVE_OPTS_H

#include "common/base/tg_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Which program takes a row (marks of tg_config_entry.flags). */
#define TG_SERVE_DAEMON TG_CONFIG_MARK(0)
#define TG_SERVE_ROUTER TG_CONFIG_MARK(1)
#define TG_SERVE_WORKER TG_CONFIG_MARK(2)

/* --backend. Values are the indices of the choices "cpu", "cuda". */
enum tg_serve_backend {
    TG_SERVE_BACKEND_CPU = 0,
    TG_SERVE_BACKEND_CUDA = 1,
};

/* --cpu-weights. Values are the indices of the choices "auto", "f32",
 * "bf16", the order of gpu_worker/model/gw_model.h's enum gw_weights. */
enum tg_serve_cpu_weights {
    TG_SERVE_CPU_WEIGHTS_AUTO = 0,
    TG_SERVE_CPU_WEIGHTS_F32 = 1,
    TG_SERVE_CPU_WEIGHTS_BF16 = 2,
};

/* --decode-compress. Values are the indices of the choices "none",
 * "trig" (DESIGN.md §4.9). */
enum tg_decode_compress {
    TG_DECODE_COMPRESS_NONE = 0,
    TG_DECODE_COMPRESS_TRIG = 1,
};

/* Every serving option. A program's parse fills the fields of its own rows;
 * the others stay zero (NULL strings). */
struct tg_serve_opts {
    /* ---- tangramd's options, all forwarded to the router ---- */
    char *model;              /* Hugging Face model directory (required);
                                 also the workers' */
    char *profile;            /* profile JSON path; "none" = full KV (tangramd
                                 turns it into NULL); also the workers' */
    bool profile_force;       /* serve a profile made for another model
                                 (its identity differs), with a warning;
                                 also the workers' */
    int backend;              /* enum tg_serve_backend; also the workers' */
    int64_t tp;               /* tensor-parallel ranks, 1..64 */
    char *host;               /* address the HTTP and gRPC servers bind */
    int64_t http_port;        /* OpenAI-compatible HTTP API, 1..65535 */
    int64_t grpc_port;        /* gRPC API (h2c), 1..65535 */
    int64_t heads_per_group;  /* H_p of DESIGN §1.2, heads per page group;
                                 also the workers' */
    int64_t page_size;        /* P, tokens per page; also the workers' */
    int64_t prefill_chunk;    /* C of DESIGN §4.3, tokens per prefill chunk;
                                 also the workers' */
    char *method;             /* scoring method; NULL = the profile's; the
                                 workers' (the router takes it to be
                                 forwarded, and ignores it) */
    double gvote_p;           /* gvote's nucleus mass (§4.8); the workers' */
    int64_t gvote_samples;    /* gvote's synthetic queries S */
    int64_t gvote_future;     /* gvote's future positions n_f */
    int decode_compress;      /* enum tg_decode_compress (§4.9); router
                                 and workers */
    int64_t decode_budget;    /* trig: c, tokens per head */
    bool decode_budget_uniform; /* trig: every head c */
    int64_t decode_every;     /* trig: beta */
    int64_t decode_window;    /* trig: W_d */
    char *trig_stats;         /* trig: statistics from another profile
                                 file; "" = the profile's own */
    int64_t max_num_seqs;     /* running requests per step (the workers'
                                 request slots) */
    int64_t max_batched_tokens; /* tokens per step (decode + chunks); 0 =
                                   the backend's default until
                                   tg_serve_opts_resolve */
    struct tg_config_amount kv_memory; /* KV pool per rank: a fraction of
                                          the free device (or host) memory,
                                          or bytes; also the workers' */
    uint64_t kv_host_memory;  /* host tier per rank, bytes; 0 = off
                                 (DESIGN.md §4.10); the workers' */
    int64_t max_queued;       /* waiting requests before 429 */
    int structured_whitespace;     /* JSON constraints' whitespace by default:
                                  0 compact, 1 none, 2 pretty, 3 free
                                  (common/grammar/gm_json.h enum gm_ws) */
    double grammar_compile_timeout; /* worker rank 0: wall-time limit of
                                       one grammar compile, seconds */
    uint64_t grammar_cache_memory; /* worker rank 0: bytes of compiled
                                 grammars its cache keeps (DESIGN.md
                                 §4.11) */
    int64_t max_grammar_compiles; /* output constraints' grammars pending
                                 on worker rank 0 before 429 (DESIGN.md
                                 §4.11) */
    int64_t tokenizer_threads; /* router: libuv thread pool size, the
                                  prompts' render + tokenize workers */
    char *api_key;            /* bearer key; "" = no authentication
                                 (secret: environment only for children) */
    int log_format;           /* enum tg_log_format (text=0, json=1); also
                                 the workers' */
    int log_level;            /* enum tg_log_level (err=0 .. debug=3); also
                                 the workers' */
    double shutdown_timeout;  /* seconds a drain may take before in-flight
                                 requests are cut */
    char *served_model_name;  /* model id in the API; tangramd defaults it
                                 to the last path component of model */
    int64_t max_model_len;    /* context limit in tokens; 0 = the model's */
    int64_t worker_heartbeat_ms; /* router<->worker heartbeat period, ms;
                                    tangramd hands it to the workers as
                                    their --heartbeat-ms */
    int64_t worker_stall_ms;  /* a worker whose compute thread shows no
                                 progress for longer is declared dead, ms */
    int64_t router_stall_ms;  /* tangramd: a router whose loop reports
                                 nothing for longer is killed and restarted,
                                 ms; 0 = never */
    /* HTTP front end limits (router/net/rt_http.h; docs/DEPLOYMENT.md) */
    int64_t http_max_connections; /* open HTTP connections */
    int64_t http_max_connections_per_ip; /* per client address; 0 = off */
    double http_header_timeout;  /* seconds for a request head */
    double http_body_timeout;    /* seconds for a request body */
    uint64_t http_min_body_rate; /* bytes per second a body must arrive at
                                    (every 5 s); 0 = no minimum */
    double http_idle_timeout;    /* seconds a keep-alive connection idles */
    double http_send_timeout;    /* seconds a response may make no progress
                                    (a client that stopped reading) */
    uint64_t http_max_body;      /* bytes of a request body */
    bool metrics_auth;           /* /metrics needs the API key too */
    char *responses_db;          /* stored responses' SQLite file; "" =
                                    memory only */
    int64_t responses_max_entries; /* stored responses held at most */
    uint64_t responses_max_bytes;  /* their bytes at most */
    double responses_ttl;          /* seconds a stored response lives */
    bool responses_rerender;       /* previous_response_id re-renders the
                                    history instead of continuing its ids */
    /* gRPC front end limits (router/net/rt_grpc.h; docs/DEPLOYMENT.md) */
    double grpc_recv_timeout; /* seconds a gRPC request (each message of a
                                 streaming request) may take to arrive */
    double grpc_idle_timeout; /* seconds before an idle gRPC connection is
                                 closed; 0 = never */
    int64_t grpc_max_streams; /* concurrent streams per gRPC connection */
    uint64_t grpc_max_message; /* bytes of one gRPC request message */
    int64_t grpc_max_connections; /* open gRPC connections */
    int64_t grpc_max_connections_per_ip; /* per client address; 0 = off */
    uint64_t max_body_memory;  /* bytes of request bodies (HTTP and gRPC)
                                  the router holds at once */
    uint64_t max_request_memory; /* bytes large requests may take between
                                    their parse and their tokens (an
                                    estimate, router/core/rt_reqmem.h) */

    /* ---- the router's own (tangramd sets them) ---- */
    char *ipc_endpoint;       /* ZeroMQ endpoint the workers connect to */
    int64_t notify_fd;        /* pipe to tangramd, -1 = none */

    /* ---- a worker's own ---- */
    char *router;             /* the router's endpoint (tangramd: its
                                 ipc_endpoint) */
    int64_t rank;             /* tensor-parallel rank, 0..63 */
    int64_t world_size;       /* tensor-parallel ranks T (tangramd: --tp) */
    int64_t comm_timeout_ms;  /* longest wait for the other ranks */
    int64_t comm_setup_timeout_ms; /* longest wait for the CommSetup */
    int64_t kv_pages;         /* > 0: exactly this many pool pages */
    int64_t heartbeat_ms;     /* period of the worker's heartbeats */
    int64_t router_timeout_ms; /* router silence before exit 3; 0 = 10 x
                                  heartbeat_ms, at least 10 s */
    int64_t threads;          /* CPU threads, 0 = all */
    int cpu_weights;          /* enum tg_serve_cpu_weights: the CPU
                                 backend's weight matrices in host memory
                                 (tangramd: also its memory plan) */
    int64_t device;           /* CUDA device, -1 = the rank */
    int cuda_graphs;          /* 0 = off, 1 = on */
    int64_t step_timeout_ms;  /* CUDA, T > 1: bound of a step's wait */
};

/* The rows that program `who` takes (TG_SERVE_DAEMON, TG_SERVE_ROUTER or
 * TG_SERVE_WORKER), in table order, with the worker's own defaults applied
 * for TG_SERVE_WORKER (see the top of this file); who == 0 gives every row.
 * Sets *n. The array is static and read-only; built on first use. Thread:
 * any. */
const struct tg_config_entry *tg_serve_opts_table(unsigned who, size_t *n);

/* Appends to *argv (tg_config_to_argv conventions: "--name=value", a NULL
 * string left out) the value in *o of every row marked for both tangramd
 * and `child` (TG_SERVE_ROUTER or TG_SERVE_WORKER), in table order, except
 * secrets. Returns 0, TG_EINVAL (child is not one of the two) or
 * TG_ENOMEM, with detail in err; on failure *argv keeps what was appended.
 * Thread: any. */
int tg_serve_opts_forward(const struct tg_serve_opts *o, unsigned child,
                          char ***argv, size_t *argc, char *err,
                          size_t errlen);

/* Step budgets of --max-batched-tokens 0 (auto), by backend: what one
 * step of that backend computes in well under a second for the models it
 * serves (docs/RELIABILITY.md, "Liveness": the CPU number is measured). */
#define TG_SERVE_BATCHED_TOKENS_CPU 2048
#define TG_SERVE_BATCHED_TOKENS_CUDA 8192

/* Resolves the values that depend on others: --max-batched-tokens 0 becomes
 * the backend's budget above, raised to --prefill-chunk and --max-num-seqs
 * (a chunk runs in one step; every running request decodes in one). Call
 * after a parse, before the options are used or forwarded. Thread: any. */
void tg_serve_opts_resolve(struct tg_serve_opts *o);

/* Frees every string of *o and sets it to NULL. Safe on a zeroed struct,
 * after a failed parse, and twice. */
void tg_serve_opts_free(struct tg_serve_opts *o);

#endif /* TG_SERVE_OPTS_H */
