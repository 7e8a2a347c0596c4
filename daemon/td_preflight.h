/*
 * td_preflight.h — what tangramd checks before it starts any child, so a
 * configuration that cannot serve fails within seconds with a message that
 * names the problem, instead of children failing (or a restart loop).
 *
 * Checked, in order: the model directory; its config.json (mc_ parser);
 * tokenizer.json (the real tokenizer loader); every safetensors header and
 * data size (st_model_open); the profile against the model's shape and
 * --tp (pf_profile_for_model, pf_tp_assign: what the router and the
 * workers will build); the HTTP and gRPC listen addresses (the host
 * resolves, the two ports differ, and each can be bound now); and, on the
 * CPU backend, the KV pools against host memory (tg_hostmem.h): the
 * weights of all ranks are estimated from the safetensors headers at fp32
 * (what the CPU backend holds), each rank's pool is resolved to bytes, and
 * an explicit size that cannot fit is refused.
 *
 * What passes here can still fail in a child (a tensor with the wrong
 * shape, a GPU that is missing): tangramd then stops at the first child
 * that exits before the server was ever ready (td_supervisor.h). A port
 * can also be taken between this check and the router's listen; the router
 * then exits with the error, with the same effect.
 */
#ifndef TD_PREFLIGHT_H
#define TD_PREFLIGHT_H

#include "daemon/td_options.h"

#include <stddef.h>
#include <stdint.h>

struct td_preflight {
    int64_t weight_params;     /* parameters in the safetensors files */
    int64_t embed_params;      /* of which the input embedding (each CPU
                                  rank holds it whole) */
    int64_t matrix_params;     /* of which in matrices (rank-2 tensors:
                                  embedding, projections, LM head) */
    int64_t bf16_matrix_params; /* of those, stored bf16 */
    int64_t cpu_weight_bytes;   /* CPU backend: host weights of all ranks
                                  (estimate): the matrices 2 bytes each
                                  where --cpu-weights keeps them bf16,
                                  else 4; norms and biases 4 */
    int64_t kv_bytes_per_rank; /* CPU backend: the resolved pool; 0 on CUDA
                                  (the worker plans device memory) */
    int64_t host_available;    /* CPU backend: bytes available at the check */
};

/* Runs every check above for options *o. On success fills *out and
 * returns 0; otherwise returns the first failure's code with a message
 * naming the file, flag or number in err. Reads files and binds sockets
 * (closed again) only; takes about as long as loading the tokenizer.
 * Thread: any. */
int td_preflight_run(const struct tg_serve_opts *o, struct td_preflight *out,
                     char *err, size_t errlen);

/* Checks that host:port can be bound for listening now (name resolution,
 * EADDRINUSE, EACCES), with SO_REUSEADDR as the router's listeners use.
 * `what` names the flag in the message ("--http-port"). Returns 0, or
 * TG_EINVAL (the host does not resolve to a local address) or TG_EBUSY
 * (the address cannot be bound) with the reason. Thread: any. */
int td_preflight_listen(const char *host, int port, const char *what,
                        char *err, size_t errlen);

#endif /* TD_PREFLIGHT_H */
