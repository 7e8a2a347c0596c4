/*
 * tangram-worker — one worker rank of the daemon (DESIGN.md §2): loads the
 * model, sizes its KV pool, connects to the router over ZeroMQ and runs
 * plans until told to stop (gpu_worker/gw_wlink.h has the loop).
 *
 *   tangram-worker --model DIR --router ipc:///run/tangram/w.sock
 *       [--profile FILE|none] [--backend cpu|cuda] [--rank R]
 *       [--world-size T] [--kv-pages N | --kv-memory 0.5|8GiB] ...
 *
 * The T ranks of one daemon form a communicator group (a shared-memory
 * all-reduce on the CPU backend, gpu_worker/gw_comm.h; an NCCL
 * communicator on the CUDA backend, whose unique id rank 0 draws) that
 * rank 0 names in its Hello and the router hands to every rank in a CommSetup
 * (proto/worker.proto); nothing on the command line names it. Every flag
 * is also read from TANGRAM_<NAME>. Exit status: 0 after a Shutdown (or
 * SIGTERM/SIGINT), 1 on a start-up or socket failure, 2 on bad flags, 3
 * when the router went silent, 4 on an unparsable message, 5 when an
 * all-reduce timed out (a tensor-parallel peer is gone; the failed
 * StepResult is sent first), 6 when no CommSetup came in time or joining
 * the group failed (the failed CommReady is sent first).
 * The process name contains "worker" so supervisors and operators can
 * find it.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tg_config.h"
#include "common/tg_err.h"
#include "common/tg_log.h"
#include "gpu_worker/gw_wlink.h"
#include "gpu_worker/gw_worker.h"

extern char **environ;

struct worker_options {
    char *model;
    char *profile;
    char *method;
    int backend;
    int64_t rank;
    int64_t world_size;
    int64_t comm_timeout_ms;
    int64_t comm_setup_timeout_ms;
    char *router;
    int64_t page_size;
    int64_t prefill_chunk;
    int64_t heads_per_group;
    int64_t kv_pages;
    struct tg_config_amount kv_memory;
    int64_t max_num_seqs;
    int64_t heartbeat_ms;
    int64_t router_timeout_ms;
    int log_format;
    int log_level;
    int64_t threads;
    int64_t device;
    int cuda_graphs;
    int64_t step_timeout_ms;
};

static const char *const backends[] = {"cpu", "cuda", NULL};
static const char *const onoff[] = {"off", "on", NULL};
static const char *const formats[] = {"text", "json", NULL};
static const char *const levels[] = {"err", "warn", "info", "debug", NULL};

#define OFF(f, t) TG_CONFIG_OFFSET(struct worker_options, f, t)
static const struct tg_config_entry table[] = {
    {.name = "model", .type = TG_CONFIG_STRING, .offset = OFF(model, char *),
     .metavar = "DIR", .flags = TG_CONFIG_REQUIRED,
     .help = "Hugging Face model directory."},
    {.name = "profile", .type = TG_CONFIG_STRING, .def = "none",
     .offset = OFF(profile, char *), .metavar = "FILE|none",
     .help = "Tangram profile; none keeps full KV."},
    {.name = "method", .type = TG_CONFIG_STRING, .offset = OFF(method, char *),
     .help = "Scoring method (default: the profile's)."},
    {.name = "backend", .type = TG_CONFIG_ENUM, .def = "cpu",
     .offset = OFF(backend, int), .choices = backends,
     .help = "Compute backend."},
    {.name = "rank", .type = TG_CONFIG_INT, .def = "0", .min = 0, .max = 63,
     .offset = OFF(rank, int64_t), .help = "This worker's tensor-parallel rank."},
    {.name = "world-size", .type = TG_CONFIG_INT, .def = "1", .min = 1,
     .max = 64, .offset = OFF(world_size, int64_t),
     .help = "Tensor-parallel ranks."},
    {.name = "comm-timeout-ms", .type = TG_CONFIG_INT, .def = "5000",
     .min = 100, .max = 3600000, .offset = OFF(comm_timeout_ms, int64_t),
     .help = "Longest wait for the other ranks (joining, each all-reduce) "
             "before giving up with exit status 6 (join) or 5."},
    {.name = "comm-setup-timeout-ms", .type = TG_CONFIG_INT,
     .def = "300000", .min = 100, .max = 86400000,
     .offset = OFF(comm_setup_timeout_ms, int64_t),
     .help = "Longest wait after the Hello for the router's CommSetup (it "
             "comes once every rank has loaded) before exiting with "
             "status 6."},
    {.name = "router", .type = TG_CONFIG_STRING, .offset = OFF(router, char *),
     .metavar = "ENDPOINT", .flags = TG_CONFIG_REQUIRED,
     .help = "Router endpoint: ipc:///path or tcp://host:port."},
    {.name = "page-size", .type = TG_CONFIG_INT, .def = "16", .min = 1,
     .max = 1024, .offset = OFF(page_size, int64_t), .metavar = "TOKENS",
     .help = "Tokens per KV page."},
    {.name = "prefill-chunk", .type = TG_CONFIG_INT, .def = "512", .min = 1,
     .max = 1 << 20, .offset = OFF(prefill_chunk, int64_t),
     .metavar = "TOKENS", .help = "Prefill chunk length C."},
    {.name = "heads-per-group", .type = TG_CONFIG_INT, .def = "1", .min = 1,
     .max = 128, .offset = OFF(heads_per_group, int64_t),
     .help = "Heads per page group without a profile."},
    {.name = "kv-pages", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 2147483647.0, .offset = OFF(kv_pages, int64_t),
     .help = "KV pool pages; 0 sizes the pool from --kv-memory."},
    {.name = "kv-memory", .type = TG_CONFIG_SIZE_FRAC, .def = "0.5",
     .min = 1048576, .max = 1125899906842624.0,
     .offset = OFF(kv_memory, struct tg_config_amount),
     .help = "KV pool: a fraction of the available host memory (0.5, 50%) "
             "or bytes (8GiB)."},
    {.name = "max-num-seqs", .type = TG_CONFIG_INT, .def = "256", .min = 1,
     .max = 65536, .offset = OFF(max_num_seqs, int64_t),
     .help = "Request slots (the router's running requests per step)."},
    {.name = "heartbeat-ms", .type = TG_CONFIG_INT, .def = "1000", .min = 1,
     .max = 3600000, .offset = OFF(heartbeat_ms, int64_t),
     .help = "Period of the worker's heartbeats."},
    {.name = "router-timeout-ms", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 86400000, .offset = OFF(router_timeout_ms, int64_t),
     .help = "Router silence after which the worker exits with status 3 "
             "(0 = 10 x heartbeat-ms)."},
    {.name = "log-format", .type = TG_CONFIG_ENUM, .def = "text",
     .offset = OFF(log_format, int), .choices = formats,
     .help = "Log line format."},
    {.name = "log-level", .type = TG_CONFIG_ENUM, .def = "info",
     .offset = OFF(log_level, int), .choices = levels, .help = "Log level."},
    {.name = "threads", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 1024, .offset = OFF(threads, int64_t),
     .help = "CPU threads (0 = all)."},
    {.name = "device", .type = TG_CONFIG_INT, .def = "-1", .min = -1,
     .max = 1023, .offset = OFF(device, int64_t),
     .help = "CUDA device of this rank (-1 = the rank: one worker per GPU)."},
    {.name = "cuda-graphs", .type = TG_CONFIG_ENUM, .def = "on",
     .offset = OFF(cuda_graphs, int), .choices = onoff,
     .help = "Capture decode steps as CUDA graphs per batch-size bucket."},
    {.name = "step-timeout-ms", .type = TG_CONFIG_INT, .def = "120000",
     .min = 1000, .max = 86400000, .offset = OFF(step_timeout_ms, int64_t),
     .help = "CUDA backend with T > 1: a step waiting longer aborts the NCCL "
             "group (a peer is gone) and the worker exits for a restart."},
};
#undef OFF
#define N_TABLE (sizeof(table) / sizeof(table[0]))

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

int main(int argc, char **argv)
{
    struct worker_options opt = {0};
    char err[512];
    struct tg_config_cli cli = {
        .usage = "usage: tangram-worker --model DIR --router ENDPOINT [options]",
        .help_out = stdout};
    int rc = tg_config_parse_cli(table, N_TABLE, &opt, &cli, argc, argv,
                                 environ, err, sizeof(err));
    if (rc == TG_EDONE) {
        tg_config_free(table, N_TABLE, &opt);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "tangram-worker: %s\n", err);
        tg_config_free(table, N_TABLE, &opt);
        return 2;
    }
    tg_log_init("worker", (int)opt.rank, (enum tg_log_level)opt.log_level,
                (enum tg_log_format)opt.log_format);

    struct gw_worker_opts wo = {
        .model_dir = opt.model,
        .profile_path = opt.profile,
        .method = opt.method,
        .backend = opt.backend == 1 ? GW_BACKEND_CUDA
                                    : GW_BACKEND_CPU,
        .heads_per_group = (int)opt.heads_per_group,
        .page_size = (int)opt.page_size,
        .prefill_chunk = (int)opt.prefill_chunk,
        .kv_pages = opt.kv_pages,
        .kv_memory = opt.kv_memory,
        .max_slots = (int)opt.max_num_seqs,
        .rank = (int)opt.rank,
        .world_size = (int)opt.world_size,
        .comm_timeout_ms = (int)opt.comm_timeout_ms,
        /* a lost peer ends the serve loop after the failed StepResult */
        .peer_lost_flag = &stop_flag,
        .n_threads = (int)opt.threads,
        .device = (int)opt.device,
        .cuda_graphs = opt.cuda_graphs == 1,
        .step_timeout_ms = (int)opt.step_timeout_ms,
    };
    struct gw_worker w;
    struct gw_wlink link = {0};
    int status = 1;
    rc = gw_worker_init(&w, &wo, err, sizeof(err));
    if (rc != 0) {
        log_err("cannot start: %s", err);
        goto out;
    }
    rc = gw_wlink_open(&link, opt.router, (int)opt.rank, err, sizeof(err));
    if (rc != 0) {
        log_err("%s", err);
        goto out;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    log_info("rank %d/%d connected to %s (model %s, profile %s)",
             (int)opt.rank, (int)opt.world_size, opt.router, opt.model,
             opt.profile);
    struct gw_wlink_opts lo = {.heartbeat_ms = (int)opt.heartbeat_ms,
                               .router_timeout_ms = (int)opt.router_timeout_ms,
                               .stop = &stop_flag,
                               .comm_setup_timeout_ms =
                                   (int)opt.comm_setup_timeout_ms};
    status = gw_wlink_serve(&link, &w, &lo);
    if (w.peers_lost) {
        log_err("a tensor-parallel peer is gone (all-reduce timed out)");
        status = GW_WORKER_EXIT_PEERS_LOST;
    }
    log_info("exiting with status %d", status);
out:
    gw_wlink_close(&link);
    gw_worker_free(&w);
    tg_config_free(table, N_TABLE, &opt);
    return status;
}
