/*
 * tangram-worker — one worker rank of the daemon (DESIGN.md §2): loads the
 * model, sizes its KV pool, connects to the router over ZeroMQ and runs
 * plans until told to stop (gpu_worker/serve/gw_wlink.h has the loop).
 *
 *   tangram-worker --model DIR --router ipc:///run/tangram/w.sock
 *       [--profile FILE|none] [--backend cpu|cuda] [--rank R]
 *       [--world-size T] [--kv-pages N | --kv-memory 0.5|8GiB] ...
 *
 * The T ranks of one daemon form a communicator group (a shared-memory
 * all-reduce on the CPU backend, gpu_worker/cpu/gw_comm.h; an NCCL
 * communicator on the CUDA backend, whose unique id rank 0 draws) that
 * rank 0 names in its Hello and the router hands to every rank in a CommSetup
 * (proto/worker.proto); nothing on the command line names it. The flags are
 * the rows of the serving table marked for the worker
 * (common/base/tg_serve_opts.h): those tangramd forwards (model, profile,
 * backend, layout, pool, logging) and the worker's own (--router, --rank,
 * --world-size, timeouts, --device ...). Every flag is also read from
 * TANGRAM_<NAME>. Exit status: 0 after a Shutdown (or
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
#include <time.h>

#include "common/base/tg_config.h"
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "common/base/tg_serve_opts.h"
#include "gpu_worker/serve/gw_wlink.h"
#include "gpu_worker/serve/gw_worker.h"

_Static_assert((int)GW_WEIGHTS_AUTO == TG_SERVE_CPU_WEIGHTS_AUTO &&
                   (int)GW_WEIGHTS_F32 == TG_SERVE_CPU_WEIGHTS_F32 &&
                   (int)GW_WEIGHTS_BF16 == TG_SERVE_CPU_WEIGHTS_BF16,
               "--cpu-weights is cast to enum gw_weights");

extern char **environ;

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

int main(int argc, char **argv)
{
    size_t n_table = 0;
    const struct tg_config_entry *table =
        tg_serve_opts_table(TG_SERVE_WORKER, &n_table);
    struct tg_serve_opts opt = {0};
    char err[512];
    struct tg_config_cli cli = {
        .usage = "usage: tangram-worker --model DIR --router ENDPOINT [options]",
        .help_out = stdout};
    int rc = tg_config_parse_cli(table, n_table, &opt, &cli, argc, argv,
                                 environ, err, sizeof(err));
    if (rc == TG_EDONE) {
        tg_serve_opts_free(&opt);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "tangram-worker: %s\n", err);
        tg_serve_opts_free(&opt);
        return 2;
    }
    tg_log_init("worker", (int)opt.rank, (enum tg_log_level)opt.log_level,
                (enum tg_log_format)opt.log_format);

    struct gw_gvote_params gvote = {.p = opt.gvote_p,
                                    .samples = (int)opt.gvote_samples,
                                    .future = (int)opt.gvote_future};
    struct gw_trig_opts trig = {
        .enabled = opt.decode_compress == TG_DECODE_COMPRESS_TRIG,
        .budget = opt.decode_budget,
        .uniform = opt.decode_budget_uniform,
        .every = (int)opt.decode_every,
        .window = (int)opt.decode_window};
    struct gw_worker_opts wo = {
        .model_dir = opt.model,
        .profile_path = opt.profile,
        .profile_force = opt.profile_force,
        .method = opt.method,
        .backend = opt.backend == TG_SERVE_BACKEND_CUDA ? GW_BACKEND_CUDA
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
        .weights = (enum gw_weights)opt.cpu_weights,
        .device = (int)opt.device,
        .cuda_graphs = opt.cuda_graphs == 1,
        .step_timeout_ms = (int)opt.step_timeout_ms,
        .gvote = &gvote,
        .trig = &trig,
        .trig_stats_path = opt.trig_stats,
        .kv_host_memory = opt.kv_host_memory,
        .grammar_cache_bytes = opt.grammar_cache_memory,
        .grammar_compile_s = opt.grammar_compile_timeout,
    };
    /* static: a compile thread still running at exit keeps using the
     * worker's grammar state until the process ends (gw_grammar_shutdown) */
    static struct gw_worker w;
    struct gw_wlink link = {0};
    int status = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = gw_worker_init(&w, &wo, err, sizeof(err));
    if (rc != 0) {
        log_err("cannot start: %s", err);
        goto out;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char loaded[160];
    gw_load_stats_format(&w.be->load, loaded, sizeof(loaded));
    log_info("started in %.2f s; weights into the %s backend: %s",
             (double)(t1.tv_sec - t0.tv_sec) +
                 (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
             w.be->ops->name, loaded);
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
    /* A vocabulary load or a compile never holds up the exit: a router
     * waiting for this worker (a restart, a drain) gets it at once. */
    int running = 0;
    if (w.rank == 0) {
        /* Logged before the shutdown, which frees what it counts. */
        gw_grammar_log_stats(&w.gram);
        running = gw_grammar_shutdown(&w.gram, 100) == TG_EBUSY;
    }
    /* A pool thread still running uses w.gram until the process ends:
     * then w is left whole (gw_worker_free would zero it under the
     * thread), and what it holds stays reachable from this static for
     * the leak checkers; the exit returns it all. */
    if (!running)
        gw_worker_free(&w);
    tg_serve_opts_free(&opt);
    return status;
}
