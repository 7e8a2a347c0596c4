/* gw_backend_cpu.c — the worker runtime on the CPU backend: the forward
 * pass of gw_forward.h over kernels/cpu, a pool in host memory sized by
 * tg_hostmem.h, and the shared-memory group of gw_comm.h (gw_backend.h). */
#include "gpu_worker/backend/gw_backend.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "common/base/tg_hostmem.h"
#include "common/base/tg_log.h"
#include "gpu_worker/cpu/gw_comm.h"
#include "gpu_worker/cpu/gw_forward.h"

struct cpu_backend {
    struct gw_backend base;      /* first: the interface's view */
    struct tg_backend *be;       /* the forward pass's ops context */
    struct gw_runtime rt;
    struct gw_comm comm;         /* zeroed until joined */
    char comm_id[GW_COMM_ID_MAX]; /* rank 0: the group it named */
};

/* Pool pages from kv_pages, else kv_memory (tg_hostmem.h): a fraction is
 * this rank's share (1 / world size) of the host memory available now
 * (after this rank's weights were loaded) less the system reserve and the
 * ranks' host tiers (§4.10); bytes must fit in that memory. tangramd
 * passes bytes it planned for all ranks together, so the check here only
 * guards a worker started by hand. */
static int size_pool(const struct gw_backend_cfg *o, int64_t page_bytes,
                     int32_t *out, char *err, size_t errlen)
{
    int64_t pages = o->kv_pages;
    if (pages <= 0) {
        struct tg_hostmem hm;
        int64_t bytes = 0;
        int rc = tg_hostmem_read(&hm, err, errlen);
        int ranks = o->kv_memory.is_fraction && o->world_size > 1
                        ? o->world_size
                        : 1;
        if (rc == 0)
            rc = tg_hostmem_kv_bytes(&hm, &o->kv_memory, ranks,
                                     (int64_t)ranks * o->host_tier_bytes,
                                     &bytes, err, errlen);
        if (rc != 0)
            return rc;
        pages = bytes / page_bytes;
        if (pages > INT32_MAX)
            pages = INT32_MAX;
    }
    if (pages < 1 || pages > INT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "the KV pool would hold %lld pages of %lld bytes; "
                          "it needs 1 .. %d", (long long)pages,
                          (long long)page_bytes, INT32_MAX);
    *out = (int32_t)pages;
    return 0;
}

static void cpu_comm_id(const struct gw_backend *b, const uint8_t **id,
                        size_t *len)
{
    const struct cpu_backend *c = (const struct cpu_backend *)b;
    *id = (const uint8_t *)c->comm_id;
    *len = strlen(c->comm_id);
}

/* The shared-memory all-reduce group, with slots that hold one
 * (max_tokens, hidden) partial sum and one block of logits slices in one
 * piece. */
static int cpu_comm_join(struct gw_backend *b, const struct gw_comm_setup *cs,
                         char *err, size_t errlen)
{
    struct cpu_backend *c = (struct cpu_backend *)b;
    const struct gw_backend_cfg *o = &b->cfg;
    char name[GW_COMM_ID_MAX + 1] = "";
    if (o->world_size > 1) {
        if (strcmp(cs->kind, GW_COMM_KIND) != 0)
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "CommSetup of kind '%.32s': the CPU backend "
                              "joins '%s' groups", cs->kind, GW_COMM_KIND);
        if (cs->id_len == 0 || cs->id_len > GW_COMM_ID_MAX ||
            memchr(cs->id, '\0', cs->id_len) != NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "CommSetup: a %zu-byte comm id is not a "
                              "shared-memory name (1 .. %d bytes, no NUL)",
                              cs->id_len, GW_COMM_ID_MAX);
        memcpy(name, cs->id, cs->id_len);
        name[cs->id_len] = '\0';
    }
    int v_first, v_count, vp;
    gw_model_vocab_slice(o->model, &v_first, &v_count, &vp);
    size_t floats = (size_t)o->max_tokens * (size_t)o->model->hidden;
    size_t lg = (size_t)c->rt.lg_rows * (size_t)vp;
    if (lg > floats)
        floats = lg;
    return gw_comm_init(&c->comm, o->world_size > 1 ? name : NULL, o->rank,
                        o->world_size, floats, o->comm_timeout_ms, err,
                        errlen);
}

static int cpu_comm_failed(struct gw_backend *b)
{
    return ((struct cpu_backend *)b)->comm.failed;
}

static int cpu_prefill(struct gw_backend *b, struct gw_seq *seq,
                       const int32_t *ids, int n,
                       const struct gw_prefill_out *out, char *err,
                       size_t errlen)
{
    struct cpu_backend *c = (struct cpu_backend *)b;
    return gw_forward_prefill(&c->rt, seq, ids, n, out, err, errlen);
}

static int cpu_decode(struct gw_backend *b, struct gw_seq *const *seqs,
                      const int32_t *ids, int n, int first_row, float *logits,
                      const struct gw_draw *draws, int n_draws, char *err,
                      size_t errlen)
{
    (void)draws; /* drawn on the host by `sample` */
    (void)n_draws;
    struct cpu_backend *c = (struct cpu_backend *)b;
    return gw_forward_decode(&c->rt, seqs, ids, n, first_row >= 0, logits, err,
                             errlen);
}

static int cpu_sample(struct gw_backend *b, const struct gw_draw *d,
                      struct gw_token *out, int32_t *top_ids, float *top_lps,
                      char *err, size_t errlen)
{
    return gw_backend__host_sample(b, d, out, top_ids, top_lps, err, errlen);
}

static void cpu_free(struct gw_backend *b)
{
    struct cpu_backend *c = (struct cpu_backend *)b;
    gw_comm_free(&c->comm);
    gw_runtime_free(&c->rt);
    tg_backend_cpu_free(c->be);
    gw_backend__base_free(b);
    free(c);
}

static int cpu_copy_pages(struct gw_backend *b, const int32_t *src,
                          const int32_t *dst, int n, char *err,
                          size_t errlen)
{
    struct cpu_backend *c = (struct cpu_backend *)b;
    size_t elems = (size_t)kv_layout_page_elems(b->cfg.layout);
    for (int i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= b->n_pages || dst[i] < 0 ||
            dst[i] >= b->n_pages)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "page copy %d -> %d outside the pool of %d",
                              (int)src[i], (int)dst[i], (int)b->n_pages);
        memcpy(c->rt.pool + (size_t)dst[i] * elems,
               c->rt.pool + (size_t)src[i] * elems, elems * sizeof(float));
    }
    return 0;
}

static int cpu_compact(struct gw_backend *b, const struct gw_trig_cfg *tc,
                       struct gw_seq *const *seqs, int n, int64_t *heads,
                       char *err, size_t errlen)
{
    struct cpu_backend *c = (struct cpu_backend *)b;
    return gw_forward_trig(&c->rt, tc, seqs, n, heads, err, errlen);
}

/* The host tier on the CPU backend: the pool is host memory too, so the
 * "copy stream" is the tier's thread doing memcpy. */
static int cpu_tier_alloc(struct gw_backend *b, size_t bytes, void **base,
                          char *err, size_t errlen)
{
    (void)b;
    /* Untouched until a page is offloaded into it. */
    *base = malloc(bytes > 0 ? bytes : 1);
    if (*base == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "cannot allocate the %zu MiB host tier",
                          bytes >> 20);
    return 0;
}

static void cpu_tier_release(struct gw_backend *b, void *base)
{
    (void)b;
    free(base);
}

static int cpu_tier_fence(struct gw_backend *b, void **fence, char *err,
                          size_t errlen)
{
    (void)b;
    (void)err;
    (void)errlen;
    *fence = NULL; /* the step that wrote the pages has completed */
    return 0;
}

static void cpu_tier_fence_drop(struct gw_backend *b, void *fence)
{
    (void)b;
    (void)fence;
}

static int cpu_tier_copy(struct gw_backend *b, void *base, int to_host,
                         const int32_t *dev, const int32_t *host, int n,
                         void *fence, char *err, size_t errlen)
{
    (void)fence;
    (void)err;
    (void)errlen;
    struct cpu_backend *c = (struct cpu_backend *)b;
    size_t bytes = (size_t)b->page_bytes;
    char *pool = (char *)c->rt.pool, *slab = base;
    for (int i = 0; i < n; i++) {
        char *d = pool + (size_t)dev[i] * bytes;
        char *h = slab + (size_t)host[i] * bytes;
        if (to_host)
            memcpy(h, d, bytes);
        else
            memcpy(d, h, bytes);
    }
    return 0;
}

static const struct gw_backend_ops cpu_ops = {
    .name = "cpu",
    .comm_kind = GW_COMM_KIND,
    .comm_id = cpu_comm_id,
    .comm_join = cpu_comm_join,
    .comm_failed = cpu_comm_failed,
    .prefill = cpu_prefill,
    .decode = cpu_decode,
    .sample = cpu_sample,
    .copy_pages = cpu_copy_pages,
    .compact = cpu_compact,
    .tier_alloc = cpu_tier_alloc,
    .tier_release = cpu_tier_release,
    .tier_fence = cpu_tier_fence,
    .tier_fence_drop = cpu_tier_fence_drop,
    .tier_copy = cpu_tier_copy,
    .free = cpu_free,
};

int gw_backend_cpu_new(const struct gw_backend_cfg *cfg,
                       struct gw_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    struct cpu_backend *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    struct gw_backend *b = &c->base;
    b->ops = &cpu_ops;
    int rc = gw_backend__base_init(b, cfg, err, errlen);
    if (rc != 0)
        goto fail;
    if (cfg->model->slab == NULL) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "the CPU backend computes with the model's host "
                        "weights, and none are loaded");
        goto fail;
    }
    b->load = cfg->model->load;
    /* The group is joined later (after the Hello): rank 0 only names it
     * now, so the router can hand the name to every rank. */
    if (cfg->rank == 0 && gw_comm_new_id(c->comm_id, sizeof(c->comm_id)) != 0) {
        rc = tg_err_set(err, errlen, TG_EINTERNAL,
                        "cannot name the communicator group");
        goto fail;
    }
    b->page_bytes = kv_layout_page_elems(cfg->layout) * (int64_t)sizeof(float);
    rc = size_pool(cfg, b->page_bytes, &b->n_pages, err, errlen);
    if (rc != 0)
        goto fail;
    int threads = cfg->n_threads;
    if (threads <= 0 && cfg->world_size > 1) {
        /* T rank processes share the host: all cores each would
         * oversubscribe it, and a descheduled thread stalls every
         * all-reduce. */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > cfg->world_size ? (int)(cores / cfg->world_size) : 1;
    }
    rc = tg_backend_cpu_new(threads, &c->be);
    if (rc != 0) {
        rc = tg_err_set(err, errlen, rc, "cannot create the CPU backend");
        goto fail;
    }
    /* Which kernels this machine runs, for anyone comparing speeds. */
    log_info("CPU backend: kernels at ISA level %s, %s weight matrices",
             tg_cpu_isa_name(tg_backend_cpu_isa(c->be)),
             cfg->model->wtype == TG_WTYPE_BF16 ? "bf16" : "fp32");
    struct gw_forward_opts fo = {.method = cfg->method,
                                 .gvote = cfg->gvote,
                                 .max_tokens = cfg->max_tokens,
                                 .on_scores = cfg->on_scores,
                                 .on_scores_ud = cfg->on_scores_ud,
                                 .on_queries = cfg->on_queries,
                                 .on_queries_ud = cfg->on_queries_ud,
                                 .comm = &c->comm};
    rc = gw_runtime_init(&c->rt, cfg->model, cfg->layout, &tg_ops_cpu, c->be,
                         b->n_pages, &fo, err, errlen);
    if (rc != 0)
        goto fail;
    *out = b;
    return 0;
fail:
    cpu_free(b);
    return rc;
}
