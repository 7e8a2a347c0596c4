/* td_preflight.c — tangramd's checks before any child starts
 * (td_preflight.h). */
#include "daemon/td_preflight.h"

#include "common/model/mc_model_config.h"
#include "common/profile/pf_profile.h"
#include "common/profile/pf_split.h"
#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "common/base/tg_path.h"
#include "common/base/tg_hostmem.h"
#include "common/base/tg_log.h"
#include "common/tok/tok_tokenizer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB ((int64_t)1 << 20)

int td_preflight_listen(const char *host, int port, const char *what,
                        char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    /* The router listens on numeric addresses only (uv_ip4_addr /
     * uv_ip6_addr), so that is what --host must be. */
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        len = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        len = sizeof *v6;
    } else {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--host '%s' is not an IPv4 or IPv6 address", host);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return tg_err_set(err, errlen, TG_EBUSY, "socket: %s",
                          strerror(errno));
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = 0;
    if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 1) != 0)
        rc = tg_err_set(err, errlen, TG_EBUSY,
                        "cannot listen on %s port %d (%s): %s", host, port,
                        what, strerror(errno));
    close(fd);
    return rc;
}

/* Sums the parameters of every tensor, of the input embedding, of the
 * matrices (rank 2) and of the bf16 matrices. */
static void count_params(const struct st_model *m, struct td_preflight *out)
{
    out->weight_params = out->embed_params = 0;
    out->matrix_params = out->bf16_matrix_params = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const struct st_tensor *t = m->tensors[i];
        out->weight_params += (int64_t)t->numel;
        if (t->rank == 2) {
            out->matrix_params += (int64_t)t->numel;
            if (t->dtype == ST_DTYPE_BF16)
                out->bf16_matrix_params += (int64_t)t->numel;
        }
        if (strcmp(t->name, "model.embed_tokens.weight") == 0)
            out->embed_params = (int64_t)t->numel;
    }
}

static int check_model(const struct tg_serve_opts *o, struct mc_model_config *mc,
                       struct td_preflight *out, char *err, size_t errlen)
{
    struct stat st;
    if (stat(o->model, &st) != 0 || !S_ISDIR(st.st_mode))
        return tg_err_set(err, errlen, TG_ENOENT,
                          "--model '%s' is not a directory", o->model);
    char path[4096], why[768];
    TG_TRY(tg_path_fmt(path, sizeof path, err, errlen, "%s/config.json",
                       o->model));
    int rc = mc_model_config_load(mc, path, why, sizeof why);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "%s: %s", path, why);
    TG_TRY(tg_path_fmt(path, sizeof path, err, errlen, "%s/tokenizer.json",
                       o->model));
    struct tok_tokenizer tok;
    memset(&tok, 0, sizeof tok);
    rc = tok_tokenizer_load(&tok, path, err, errlen); /* names the file */
    tok_tokenizer_free(&tok);
    if (rc != 0)
        return rc;
    struct st_model m;
    memset(&m, 0, sizeof m);
    rc = st_model_open(&m, o->model, why, sizeof why);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "weights of %s: %s", o->model, why);
    count_params(&m, out);
    st_model_close(&m);
    return 0;
}

static int check_profile(const struct tg_serve_opts *o,
                         const struct mc_model_config *mc, char *err,
                         size_t errlen)
{
    struct pf_profile p;
    struct pf_tp_plan plan;
    memset(&plan, 0, sizeof plan);
    char why[768], warn[768];
    int rc = pf_profile_for_model(&p, o->profile, mc,
                                  (int)o->heads_per_group, o->profile_force,
                                  warn, sizeof warn, why, sizeof why);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "--profile: %s", why);
    if (warn[0] != '\0')
        log_warn("--profile: %s", warn);
    rc = pf_tp_assign(&plan, &p, (int)o->tp, why, sizeof why);
    pf_tp_free(&plan);
    pf_profile_free(&p);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "--tp %lld with this profile: %s",
                          (long long)o->tp, why);
    return 0;
}

/* CPU backend: every rank holds its share of the weights, each the whole
 * input embedding; the pools come out of what is left. The matrices are
 * bf16 (2 bytes) as the worker will keep them (gw_model.h: --cpu-weights
 * bf16, or auto with every matrix bf16 in the checkpoint), else fp32. */
static int plan_cpu_memory(const struct tg_serve_opts *o,
                           struct td_preflight *out, char *err, size_t errlen)
{
    int64_t T = o->tp;
    int bf16 = o->cpu_weights == TG_SERVE_CPU_WEIGHTS_BF16 ||
               (o->cpu_weights == TG_SERVE_CPU_WEIGHTS_AUTO &&
                out->bf16_matrix_params == out->matrix_params);
    int64_t es = bf16 ? 2 : 4;
    int64_t other = out->weight_params - out->matrix_params;
    out->cpu_weight_bytes = es * (out->matrix_params - out->embed_params +
                                  T * out->embed_params) +
                            (int64_t)sizeof(float) * other;
    struct tg_hostmem hm;
    int rc = tg_hostmem_read(&hm, err, errlen);
    if (rc != 0)
        return rc;
    out->host_available = hm.available;
    /* The host tiers (§4.10) come out of host memory first: a --kv-memory
     * fraction is of what they leave. */
    int64_t tiers = T * (int64_t)o->kv_host_memory;
    rc = tg_hostmem_tier_check(&hm, (int64_t)o->kv_host_memory, (int)T,
                               out->cpu_weight_bytes, err, errlen);
    if (rc != 0)
        return rc;
    return tg_hostmem_kv_bytes(&hm, &o->kv_memory, (int)T,
                               out->cpu_weight_bytes + tiers,
                               &out->kv_bytes_per_rank, err, errlen);
}

/* CUDA backend: the host tiers are pinned host memory of every rank. */
static int plan_host_tier(const struct tg_serve_opts *o,
                          struct td_preflight *out, char *err, size_t errlen)
{
    if (o->kv_host_memory == 0)
        return 0;
    struct tg_hostmem hm;
    int rc = tg_hostmem_read(&hm, err, errlen);
    if (rc != 0)
        return rc;
    out->host_available = hm.available;
    return tg_hostmem_tier_check(&hm, (int64_t)o->kv_host_memory, (int)o->tp,
                                 0, err, errlen);
}

int td_preflight_run(const struct tg_serve_opts *o, struct td_preflight *out,
                     char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    struct mc_model_config mc;
    int rc = check_model(o, &mc, out, err, errlen);
    if (rc == 0)
        rc = check_profile(o, &mc, err, errlen);
    if (rc != 0)
        return rc;
    if (o->http_port == o->grpc_port)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--http-port and --grpc-port are both %lld",
                          (long long)o->http_port);
    rc = td_preflight_listen(o->host, (int)o->http_port, "--http-port", err,
                             errlen);
    if (rc == 0)
        rc = td_preflight_listen(o->host, (int)o->grpc_port, "--grpc-port",
                                 err, errlen);
    if (rc != 0)
        return rc;
    if (o->backend == TG_SERVE_BACKEND_CPU)
        return plan_cpu_memory(o, out, err, errlen);
    return plan_host_tier(o, out, err, errlen);
}
