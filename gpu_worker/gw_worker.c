/* gw_worker.c — one worker rank's plan execution (see gw_worker.h). */
#if __has_include("worker.pb-c.h")
/* The generated protocol header lives in the build tree; a library target
 * without tg_proto's include directory compiles this file to nothing. */
#include "gpu_worker/gw_worker.h"

#ifdef TANGRAM_CUDA
#include "kernels/cuda/nccl_comm.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/kv/kv_budget.h"
#include "common/tg_hostmem.h"
#include "common/tg_err.h"
#include "gpu_worker/gw_engine.h"
#include "common/kv/kv_layout.h"
#include "gpu_worker/gw_worker_internal.h"

/* splitmix64's state increment (Steele, Lea & Flood 2014): the state after
 * k draws is seed + k * GOLDEN, the sampler's rule in cpu_sample.c. */
#define GOLDEN 0x9E3779B97F4A7C15ull

static void slot_free(struct gw_wslot *s, int rows)
{
    if (s->pages != NULL)
        for (int r = 0; r < rows; r++)
            free(s->pages[r]);
    free(s->pages);
    free(s->n_pages);
    free(s->cap);
    free(s->len);
    free(s->hist);
    memset(s, 0, sizeof(*s));
}

void gw_worker_free(struct gw_worker *w)
{
    if (w->slots != NULL)
        for (int i = 0; i < w->max_slots; i++)
            slot_free(&w->slots[i], w->rows);
    free(w->slots);
    free(w->logits);
    free(w->seqs);
    free(w->seq_ptrs);
    free(w->ids);
    free(w->sim_n);
    free(w->sim_len);
    free(w->sim_pos);
    free(w->sim_active);
    free(w->sim_stamp);
    free(w->touched);
    free(w->entry_of);
    free(w->tok);
    free(w->tok_ptrs);
    free(w->serr);
    free(w->serr_ptrs);
    free(w->serr_text);
    free(w->top_ids);
    free(w->top_lps);
    free(w->top_tmp);
    free(w->pre_mark);
    free(w->pre_row);
    free(w->pre_tok);
    free(w->pre_lp);
    free(w->pre_top_ids);
    free(w->pre_top_lps);
    free(w->dev_params);
    gw_runtime_free(&w->rt);
#ifdef TANGRAM_CUDA
    /* a group that lost a peer is aborted first, or freeing the runtime
     * would wait for NCCL kernels that never finish */
    if (w->peers_lost)
        tg_nccl_abort(w->nccl);
    gw_cuda_free(&w->cu);
    tg_nccl_free(w->nccl);
#endif
    gw_comm_free(&w->comm);
    tg_backend_cpu_free(w->be);
    kv_layout_free(&w->layout);
    pf_profile_free(&w->profile);
    gw_model_free(&w->model);
    memset(w, 0, sizeof(*w));
}

/* Pool pages from --kv-pages, else --kv-memory (tg_hostmem.h): a
 * fraction is this rank's share (1 / world_size) of the host memory
 * available now (after this rank's weights were loaded) less the system
 * reserve; bytes must fit in that memory. tangramd passes bytes it planned
 * for all ranks together, so the check here only guards a worker started
 * by hand. */
static int size_pool(const struct gw_worker_opts *o, int64_t page_bytes,
                     int32_t *out, char *err, size_t errlen)
{
    int64_t pages = o->kv_pages;
    if (pages <= 0) {
        struct tg_hostmem hm;
        int64_t bytes = 0;
        int rc = tg_hostmem_read(&hm, err, errlen);
        if (rc == 0)
            rc = tg_hostmem_kv_bytes(
                &hm, &o->kv_memory,
                o->kv_memory.is_fraction && o->world_size > 1 ? o->world_size
                                                              : 1,
                0, &bytes, err, errlen);
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

static int slot_init(struct gw_wslot *s, int rows)
{
    s->pages = calloc((size_t)rows, sizeof(*s->pages));
    s->n_pages = calloc((size_t)rows, sizeof(int32_t));
    s->cap = calloc((size_t)rows, sizeof(int32_t));
    s->len = calloc((size_t)rows, sizeof(int32_t));
    return s->pages && s->n_pages && s->cap && s->len ? 0 : TG_ENOMEM;
}

/* The CPU backend: pool from host RAM, OpenMP backend, gw_runtime. */
static int cpu_init(struct gw_worker *w, const struct gw_worker_opts *o,
                    int64_t page_bytes, char *err, size_t errlen)
{
    int rc;
    int maxt = w->max_tokens;
    rc = size_pool(o, page_bytes, &w->n_pages, err, errlen);
    if (rc != 0)
        return rc;
    int threads = o->n_threads;
    if (threads <= 0 && o->world_size > 1) {
        /* T rank processes share the host: all cores each would
         * oversubscribe it, and a descheduled thread stalls every
         * all-reduce. */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > o->world_size ? (int)(cores / o->world_size) : 1;
    }
    rc = tg_backend_cpu_new(threads, &w->be);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "cannot create the CPU backend");
    struct gw_forward_opts fo = {.method = w->method, .max_tokens = maxt,
                                 .comm = &w->comm};
    rc = gw_runtime_init(&w->rt, &w->model, &w->layout, &tg_ops_cpu, w->be,
                         w->n_pages, &fo, err, errlen);
    if (rc != 0)
        return rc;
    return 0;
}

int gw_worker_init(struct gw_worker *w, const struct gw_worker_opts *o,
                   char *err, size_t errlen)
{
    memset(w, 0, sizeof(*w));
#ifndef TANGRAM_CUDA
    if (o->backend == GW_WORKER_BACKEND_CUDA)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "--backend cuda: this build has no CUDA backend "
                          "(TANGRAM_CUDA not built); use --backend cpu");
#endif
    if (o->world_size < 1 || o->world_size > GW_COMM_MAX_RANKS ||
        o->rank < 0 || o->rank >= o->world_size)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--rank %d is outside [0, %d) (world size 1 .. %d)",
                          o->rank, o->world_size, GW_COMM_MAX_RANKS);
    if (o->max_slots < 1 || o->page_size < 1 || o->prefill_chunk < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "max slots, page size and prefill chunk must be "
                          ">= 1");
    int maxt = o->prefill_chunk > o->max_slots ? o->prefill_chunk : o->max_slots;
    int rc;
    /* The group is joined later (gw_worker_comm_join, after the Hello):
     * rank 0 only names it now, so the router can hand the name to all. */
    w->comm_timeout_ms = o->comm_timeout_ms;
    if (o->backend == GW_WORKER_BACKEND_CPU && o->rank == 0 &&
        gw_comm_new_id(w->comm_id, sizeof(w->comm_id)) != 0)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "cannot name the communicator group");
    w->peer_lost_flag = o->peer_lost_flag;
    w->backend = o->backend;
    struct gw_engine_opts eo = {
        .model_dir = o->model_dir,
        .profile_path = o->profile_path,
        .heads_per_group = o->heads_per_group,
        .page_size = o->page_size,
        .prefill_chunk = o->prefill_chunk,
        .method = o->method,
        .rank = o->rank,
        .world_size = o->world_size,
    };
    rc = gw_engine_load_parts(&w->model, &w->profile, &w->layout, &w->method,
                              &eo, err, errlen);
    if (rc != 0)
        goto fail;
    w->rank = o->rank;
    w->world_size = o->world_size;
    w->max_slots = o->max_slots;
    w->max_tokens = maxt;
    w->rows = w->model.n_layers * w->layout.n_groups;
    int64_t page_bytes;
    if (o->backend == GW_WORKER_BACKEND_CUDA) {
        rc = gw__worker_cuda_init(w, o, err, errlen);
        if (rc != 0)
            goto fail;
        page_bytes = kv_layout_page_elems(&w->layout) * 2; /* bf16 */
    } else {
        page_bytes = kv_layout_page_elems(&w->layout) * (int64_t)sizeof(float);
        rc = cpu_init(w, o, page_bytes, err, errlen);
        if (rc != 0)
            goto fail;
    }

    size_t S = (size_t)o->max_slots, R = (size_t)w->rows;
    size_t V = (size_t)w->model.vocab, K = GW_WORKER_MAX_LOGPROBS;
    w->slots = calloc(S, sizeof(*w->slots));
    /* Every rank computes a vocab slice; rank 0 gets the logits and
     * samples. */
    w->logits = w->rank == 0 ? malloc(S * V * sizeof(float)) : NULL;
    w->seqs = calloc(S, sizeof(*w->seqs));
    w->seq_ptrs = calloc(S, sizeof(*w->seq_ptrs));
    w->ids = malloc((size_t)maxt * sizeof(int32_t));
    w->sim_n = malloc(S * R * sizeof(int32_t));
    w->sim_len = malloc(S * R * sizeof(int32_t));
    w->sim_pos = malloc(S * sizeof(int64_t));
    w->sim_active = malloc(S * sizeof(int32_t));
    w->sim_stamp = calloc(S, sizeof(uint64_t));
    w->touched = malloc(S * sizeof(int32_t));
    w->entry_of = malloc(S * sizeof(int32_t));
    w->tok = calloc(S, sizeof(*w->tok));
    w->tok_ptrs = calloc(S, sizeof(*w->tok_ptrs));
    w->serr = calloc(S, sizeof(*w->serr));
    w->serr_ptrs = calloc(S, sizeof(*w->serr_ptrs));
    w->serr_text = calloc(S, GW_WORKER_SLOT_ERROR_MAX);
    w->top_ids = malloc(S * K * sizeof(uint32_t));
    w->top_lps = malloc(S * K * sizeof(float));
    w->top_tmp = malloc(K * sizeof(int32_t));
    if (!w->slots || (w->rank == 0 && !w->logits) || !w->seqs ||
        !w->seq_ptrs || !w->ids || !w->sim_n || !w->sim_len || !w->sim_pos || !w->sim_active ||
        !w->sim_stamp || !w->touched || !w->entry_of || !w->tok ||
        !w->tok_ptrs || !w->serr || !w->serr_ptrs || !w->serr_text ||
        !w->top_ids || !w->top_lps || !w->top_tmp) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory for %d slots",
                        o->max_slots);
        goto fail;
    }
    for (size_t i = 0; i < S; i++)
        if (slot_init(&w->slots[i], w->rows) != 0) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            goto fail;
        }

    /* The Hello's layout summary, fixed for the worker's life. */
    const char *prof = eo.profile_path == NULL ? "none" : eo.profile_path;
    snprintf(w->model_name, sizeof(w->model_name), "%s", o->model_dir);
    snprintf(w->profile_name, sizeof(w->profile_name), "%s", prof);
    GwLayoutSummary init = TANGRAM__WORKER__V1__LAYOUT_SUMMARY__INIT;
    w->summary = init;
    w->summary.num_layers = (uint32_t)w->model.n_layers;
    w->summary.num_kv_heads = (uint32_t)w->layout.n_kv_heads;
    w->summary.heads_per_group = (uint32_t)w->layout.heads_per_group;
    w->summary.groups_per_layer = (uint32_t)w->layout.n_groups;
    w->summary.page_size = (uint32_t)w->layout.page_size;
    w->summary.head_dim = (uint32_t)w->layout.head_dim;
    w->summary.page_bytes = (uint64_t)page_bytes;
    w->summary.profile = w->profile_name;
    w->summary.backend = o->backend == GW_WORKER_BACKEND_CUDA ? (char *)"cuda"
                                                              : (char *)"cpu";
    w->summary.model = w->model_name;
    w->summary.max_model_len = (uint32_t)w->model.max_positions;
    w->summary.vocab_size = (uint32_t)w->model.vocab;
    return 0;
fail:
    gw_worker_free(w);
    return rc;
}

void gw_worker_hello(struct gw_worker *w, GwHello *h)
{
    GwHello init = TANGRAM__WORKER__V1__HELLO__INIT;
    *h = init;
    h->version = GW_PROTOCOL_VERSION;
    h->rank = (uint32_t)w->rank;
    h->world_size = (uint32_t)w->world_size;
    h->pid = (uint32_t)getpid();
    h->pages_total = (uint32_t)w->n_pages;
    h->layout = &w->summary;
    if (w->backend == GW_WORKER_BACKEND_CUDA) {
        h->comm_kind = (char *)GW_NCCL_KIND;
        if (w->rank == 0 && w->world_size > 1) {
            h->comm_id.data = w->nccl_id;
            h->comm_id.len = GW_NCCL_ID_BYTES;
        }
    } else {
        h->comm_kind = (char *)GW_COMM_KIND;
        if (w->rank == 0) {
            h->comm_id.data = (uint8_t *)w->comm_id;
            h->comm_id.len = strlen(w->comm_id);
        }
    }
}

/* The CPU backend's group: the shared-memory all-reduce of gw_comm.h,
 * with slots that hold one (max_tokens, hidden) partial sum and one block
 * of logits slices in one piece. */
static int join_shm(struct gw_worker *w, const char *name, char *err,
                    size_t errlen)
{
    int v_first, v_count, vp;
    gw_model_vocab_slice(&w->model, &v_first, &v_count, &vp);
    size_t floats = (size_t)w->max_tokens * (size_t)w->model.hidden;
    size_t lg = (size_t)w->rt.lg_rows * (size_t)vp;
    if (lg > floats)
        floats = lg;
    return gw_comm_init(&w->comm, w->world_size > 1 ? name : NULL, w->rank,
                        w->world_size, floats, w->comm_timeout_ms, err,
                        errlen);
}

/* A CommSetup for the CPU backend: the shared-memory group it names. */
static int join_shm_setup(struct gw_worker *w, const GwCommSetup *cs,
                          const char *kind, char *err, size_t errlen)
{
    char name[GW_COMM_ID_MAX + 1] = "";
    if (w->world_size > 1) {
        if (strcmp(kind, GW_COMM_KIND) != 0)
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "CommSetup of kind '%.32s': the CPU backend "
                              "joins '%s' groups", kind, GW_COMM_KIND);
        if (cs->comm_id.len == 0 || cs->comm_id.len > GW_COMM_ID_MAX ||
            memchr(cs->comm_id.data, '\0', cs->comm_id.len) != NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "CommSetup: a %zu-byte comm id is not a "
                              "shared-memory name (1 .. %d bytes, no NUL)",
                              cs->comm_id.len, GW_COMM_ID_MAX);
        memcpy(name, cs->comm_id.data, cs->comm_id.len);
        name[cs->comm_id.len] = '\0';
    }
    return join_shm(w, name, err, errlen);
}

int gw_worker_comm_join(struct gw_worker *w, const GwCommSetup *cs, char *err,
                        size_t errlen)
{
    if (w->joined)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "CommSetup: the communicator group is joined "
                          "already");
    if (cs->version != GW_PROTOCOL_VERSION)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "CommSetup version %u, this worker speaks %u",
                          cs->version, GW_PROTOCOL_VERSION);
    if (cs->world_size != (uint32_t)w->world_size)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "CommSetup for world size %u, this worker is rank "
                          "%d of %d", cs->world_size, w->rank, w->world_size);
    /* One rank needs no peer, so it accepts any id (also none). */
    const char *kind = cs->comm_kind != NULL ? cs->comm_kind : "";
    int rc;
    if (w->backend == GW_WORKER_BACKEND_CUDA)
        rc = gw__worker_join_nccl(w, cs, kind, err, errlen);
    else
        rc = join_shm_setup(w, cs, kind, err, errlen);
    if (rc == 0)
        w->joined = 1;
    return rc;
}

/* ---- validation -------------------------------------------------------- */

/* The simulated state of slot s during validation: initialised from the
 * slot on first touch of this validation pass. */
static void sim_touch(struct gw_worker *w, uint32_t s)
{
    if (w->sim_stamp[s] == w->sim_serial)
        return;
    w->sim_stamp[s] = w->sim_serial;
    w->touched[w->n_touched++] = (int32_t)s;
    const struct gw_wslot *sl = &w->slots[s];
    size_t R = (size_t)w->rows;
    w->sim_active[s] = sl->active;
    w->sim_pos[s] = sl->pos;
    memcpy(w->sim_n + s * R, sl->n_pages, R * sizeof(int32_t));
    memcpy(w->sim_len + s * R, sl->len, R * sizeof(int32_t));
}

static void sim_clear(struct gw_worker *w, uint32_t s)
{
    size_t R = (size_t)w->rows;
    sim_touch(w, s);
    w->sim_active[s] = 0;
    w->sim_pos[s] = 0;
    memset(w->sim_n + s * R, 0, R * sizeof(int32_t));
    memset(w->sim_len + s * R, 0, R * sizeof(int32_t));
}

int gw__worker_check_sampling(const Tangram__Worker__V1__WorkerSampling *sp,
                              int vocab, char *err, size_t errlen,
                              uint32_t slot)
{
    if (sp == NULL)
        return 0;
    if (!(sp->temperature >= 0.0f) || isinf(sp->temperature) ||
        !(sp->top_p > 0.0f) || sp->top_p > 1.0f || !(sp->min_p >= 0.0f) ||
        sp->min_p > 1.0f || !(sp->repetition_penalty > 0.0f) ||
        isinf(sp->repetition_penalty) || !isfinite(sp->presence_penalty) ||
        !isfinite(sp->frequency_penalty))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u: bad sampling parameters (temperature %g, "
                          "top_p %g, min_p %g, repetition_penalty %g, "
                          "presence %g, frequency %g)", slot,
                          (double)sp->temperature, (double)sp->top_p,
                          (double)sp->min_p, (double)sp->repetition_penalty,
                          (double)sp->presence_penalty,
                          (double)sp->frequency_penalty);
    int kmax = vocab < GW_WORKER_MAX_LOGPROBS ? vocab : GW_WORKER_MAX_LOGPROBS;
    if (sp->logprobs > (uint32_t)kmax)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u: %u logprobs asked, at most %d", slot,
                          sp->logprobs, kmax);
    return 0;
}

static int check_entry(struct gw_worker *w, size_t i, const GwPlanEntry *e,
                       char *err, size_t errlen)
{
    const struct gw_model *m = &w->model;
    const char *rid = e->request_id != NULL ? e->request_id : "";
    if (e->slot >= (uint32_t)w->max_slots)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "entry %zu (request '%s'): unknown slot %u (the "
                          "worker has %d)", i, rid, e->slot, w->max_slots);
    uint32_t s = e->slot;
    if (w->entry_of[s] >= 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "entry %zu (request '%s'): slot %u already has "
                          "entry %d in this plan", i, rid, s, w->entry_of[s]);
    w->entry_of[s] = (int32_t)i;
    size_t n = e->n_token_ids;
    if (e->kind == TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL) {
        if (n < 1 || n > (size_t)w->layout.prefill_chunk)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): prefill chunk of %zu "
                              "tokens, allowed 1 .. %d", s, rid, n,
                              w->layout.prefill_chunk);
    } else if (e->kind == TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE) {
        if (n != 1)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): a decode entry has "
                              "one token, got %zu", s, rid, n);
    } else {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): unknown entry kind %d", s,
                          rid, (int)e->kind);
    }
    for (size_t t = 0; t < n; t++)
        if (e->token_ids[t] >= (uint32_t)m->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): token %u at index %zu "
                              "is outside the vocabulary [0, %d)", s, rid,
                              e->token_ids[t], t, m->vocab);
    if ((uint64_t)e->start_pos + n > (uint64_t)m->max_positions)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): positions up to %llu "
                          "exceed the model's context of %d", s, rid,
                          (unsigned long long)e->start_pos + n,
                          m->max_positions);
    if (e->n_row_lens != 0 && (!e->fresh || e->n_row_lens != (size_t)w->rows))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): row_lens needs fresh and "
                          "%d values, got %zu", s, rid, w->rows,
                          e->n_row_lens);
    sim_touch(w, s);
    if (e->fresh) {
        sim_clear(w, s);
        w->sim_active[s] = 1;
        w->sim_pos[s] = e->start_pos;
        for (size_t r = 0; r < e->n_row_lens; r++) {
            if (e->row_lens[r] > e->start_pos)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "slot %u (request '%s'): row %zu holds %u "
                                  "tokens, more than start_pos %u", s, rid,
                                  r, e->row_lens[r], e->start_pos);
            w->sim_len[(size_t)s * (size_t)w->rows + r] =
                (int32_t)e->row_lens[r];
        }
    } else if (!w->sim_active[s]) {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): the slot is not assigned "
                          "(no fresh entry since it was freed)", s, rid);
    } else if ((int64_t)e->start_pos != w->sim_pos[s]) {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): entry starts at position "
                          "%u, the slot is at %lld", s, rid, e->start_pos,
                          (long long)w->sim_pos[s]);
    }
    /* Sampling parameters are the request's own: rank 0 checks them when
     * it draws, and a bad one fails only that request (a SlotError). */
    return 0;
}

static int check_delta(struct gw_worker *w, size_t i, const GwPageDelta *d,
                       char *err, size_t errlen)
{
    const struct kv_layout *kv = &w->layout;
    if (d->slot >= (uint32_t)w->max_slots || d->layer >= (uint32_t)kv->n_layers ||
        d->group >= (uint32_t)kv->n_groups)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page delta %zu: (slot %u, layer %u, group %u) "
                          "outside (%d, %d, %d)", i, d->slot, d->layer,
                          d->group, w->max_slots, kv->n_layers, kv->n_groups);
    sim_touch(w, d->slot);
    if (!w->sim_active[d->slot])
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page delta %zu: slot %u is not assigned", i,
                          d->slot);
    size_t r = (size_t)d->slot * (size_t)w->rows +
               (size_t)d->layer * (size_t)kv->n_groups + d->group;
    int64_t n = w->sim_n[r];
    if (d->truncate_to_opt_case ==
        TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO) {
        if ((int64_t)d->truncate_to > n)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "page delta %zu: truncate_to %u but slot %u "
                              "layer %u group %u holds %lld pages", i,
                              d->truncate_to, d->slot, d->layer, d->group,
                              (long long)n);
        n = d->truncate_to;
    }
    for (size_t k = 0; k < d->n_page_ids; k++)
        if (d->page_ids[k] >= (uint32_t)w->n_pages)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "page delta %zu: page id %u outside the pool of "
                              "%d pages", i, d->page_ids[k], w->n_pages);
    n += (int64_t)d->n_page_ids;
    if (n > w->n_pages)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page delta %zu: a row of %lld pages exceeds the "
                          "pool of %d", i, (long long)n, w->n_pages);
    w->sim_n[r] = (int32_t)n;
    return 0;
}

/* The tokens a prefill chunk keeps in row (l, g): gw_chunk_keep's rule,
 * from the worker's own layout (w->rt exists on the CPU backend only). */
static int64_t chunk_keep(const struct gw_worker *w, int l, int g,
                          int64_t start, int64_t n)
{
    const struct kv_layout *kv = &w->layout;
    double b = kv->group_budget[(size_t)l * (size_t)kv->n_groups + (size_t)g];
    return kv_chunk_keep(n, b, kv_chunk_forced(start, n, &kv->rule));
}

/* Rows must hold what they store, and the entries must have room for what
 * they add (the forward pass checks too, but only after earlier entries
 * ran; checking here keeps a rejected plan from changing anything). */
static int check_room(struct gw_worker *w, const GwBatchPlan *plan,
                      char *err, size_t errlen)
{
    const struct kv_layout *kv = &w->layout;
    size_t R = (size_t)w->rows;
    for (int t = 0; t < w->n_touched; t++) {
        size_t s = (size_t)w->touched[t];
        if (!w->sim_active[s])
            continue;
        int e = w->entry_of[s];
        const GwPlanEntry *en = e >= 0 ? plan->entries[e] : NULL;
        for (int l = 0; l < kv->n_layers; l++)
            for (int g = 0; g < kv->n_groups; g++) {
                size_t r = (size_t)l * (size_t)kv->n_groups + (size_t)g;
                int64_t len = w->sim_len[s * R + r], add = 0;
                if (en != NULL)
                    add = en->kind == TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE
                              ? 1
                              : chunk_keep(w, l, g, en->start_pos,
                                           (int64_t)en->n_token_ids);
                int64_t have = w->sim_n[s * R + r];
                if (kv_pages_for(len, kv->page_size) > have ||
                    kv_pages_for(len + add, kv->page_size) > have)
                    return tg_err_set(
                        err, errlen, TG_ENOSPC,
                        "slot %zu layer %d group %d: %lld + %lld tokens need "
                        "%lld pages, the row has %lld", s, l, g,
                        (long long)len, (long long)add,
                        (long long)kv_pages_for(len + add, kv->page_size),
                        (long long)have);
            }
    }
    return 0;
}

static int check_plan(struct gw_worker *w, const GwBatchPlan *plan, char *err,
                      size_t errlen)
{
    if (plan->version != GW_PROTOCOL_VERSION)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "plan version %u, this worker speaks %u",
                          plan->version, GW_PROTOCOL_VERSION);
    if (plan->step_id <= w->last_step)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "step id %llu is not above the last step %llu",
                          (unsigned long long)plan->step_id,
                          (unsigned long long)w->last_step);
    w->sim_serial++;
    w->n_touched = 0;
    for (int s = 0; s < w->max_slots; s++)
        w->entry_of[s] = -1;
    for (size_t i = 0; i < plan->n_frees; i++) {
        if (plan->frees[i] >= (uint32_t)w->max_slots)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "frees[%zu]: unknown slot %u (the worker has "
                              "%d)", i, plan->frees[i], w->max_slots);
        sim_clear(w, plan->frees[i]);
    }
    int rc;
    /* Fresh entries are applied before the deltas, so validate all entries
     * (which performs the fresh clears) first. */
    for (size_t i = 0; i < plan->n_entries; i++) {
        if (plan->entries[i] == NULL)
            return tg_err_set(err, errlen, TG_EINVAL, "entry %zu is empty", i);
        if ((rc = check_entry(w, i, plan->entries[i], err, errlen)) != 0)
            return rc;
    }
    for (size_t i = 0; i < plan->n_page_deltas; i++) {
        if (plan->page_deltas[i] == NULL)
            return tg_err_set(err, errlen, TG_EINVAL, "page delta %zu is empty",
                              i);
        if ((rc = check_delta(w, i, plan->page_deltas[i], err, errlen)) != 0)
            return rc;
    }
    return check_room(w, plan, err, errlen);
}

/* ---- application ------------------------------------------------------- */

static void slot_clear(struct gw_wslot *s, int rows)
{
    s->active = 0;
    s->pos = 0;
    s->num_prompt = 0;
    s->hist_from = 0;
    s->n_sampled = 0;
    memset(s->n_pages, 0, (size_t)rows * sizeof(int32_t));
    memset(s->len, 0, (size_t)rows * sizeof(int32_t));
}

/* Grows row r of slot s to hold n page ids. */
static int row_reserve(struct gw_wslot *s, int r, int64_t n)
{
    if (n <= s->cap[r])
        return 0;
    int64_t cap = s->cap[r] > 0 ? s->cap[r] : 4;
    while (cap < n)
        cap *= 2;
    int32_t *p = realloc(s->pages[r], (size_t)cap * sizeof(int32_t));
    if (p == NULL)
        return TG_ENOMEM;
    s->pages[r] = p;
    s->cap[r] = (int32_t)cap;
    return 0;
}

static int hist_reserve(struct gw_wslot *s, int64_t n)
{
    if (n <= s->hist_cap)
        return 0;
    int64_t cap = s->hist_cap > 0 ? s->hist_cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *p = realloc(s->hist, (size_t)cap * sizeof(int32_t));
    if (p == NULL)
        return TG_ENOMEM;
    s->hist = p;
    s->hist_cap = cap;
    return 0;
}

/* Reserves everything the plan will append before anything changes, so an
 * allocation failure also leaves the worker as it was. */
static int reserve_all(struct gw_worker *w, const GwBatchPlan *plan)
{
    size_t R = (size_t)w->rows;
    for (int t = 0; t < w->n_touched; t++) {
        size_t s = (size_t)w->touched[t];
        for (size_t r = 0; r < R; r++)
            if (row_reserve(&w->slots[s], (int)r, w->sim_n[s * R + r]) != 0)
                return TG_ENOMEM;
    }
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        struct gw_wslot *sl = &w->slots[e->slot];
        int64_t from = e->fresh ? e->start_pos : sl->hist_from;
        if (hist_reserve(sl, (int64_t)e->start_pos + (int64_t)e->n_token_ids -
                                 from) != 0)
            return TG_ENOMEM;
    }
    return 0;
}

static void apply_plan(struct gw_worker *w, const GwBatchPlan *plan)
{
    /* a new epoch whenever a slot's page lists are replaced or cut, so a
     * device block table cached from them is not reused */
    for (size_t i = 0; i < plan->n_frees; i++) {
        slot_clear(&w->slots[plan->frees[i]], w->rows);
        w->slots[plan->frees[i]].epoch = ++w->epoch_next;
    }
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        struct gw_wslot *sl = &w->slots[e->slot];
        if (e->fresh) {
            slot_clear(sl, w->rows);
            sl->epoch = ++w->epoch_next;
            sl->active = 1;
            sl->pos = e->start_pos;
            sl->hist_from = e->start_pos;
            for (size_t r = 0; r < e->n_row_lens; r++)
                sl->len[r] = (int32_t)e->row_lens[r];
        }
        sl->num_prompt = (int32_t)(e->num_prompt_tokens > INT32_MAX
                                       ? INT32_MAX
                                       : e->num_prompt_tokens);
    }
    for (size_t i = 0; i < plan->n_page_deltas; i++) {
        const GwPageDelta *d = plan->page_deltas[i];
        struct gw_wslot *sl = &w->slots[d->slot];
        int r = (int)(d->layer * (uint32_t)w->layout.n_groups + d->group);
        if (d->truncate_to_opt_case ==
            TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO) {
            sl->n_pages[r] = (int32_t)d->truncate_to;
            sl->epoch = ++w->epoch_next;
        }
        for (size_t k = 0; k < d->n_page_ids; k++)
            sl->pages[r][sl->n_pages[r]++] = (int32_t)d->page_ids[k];
    }
}

static struct gw_seq *seq_view(struct gw_worker *w, uint32_t slot)
{
    struct gw_wslot *sl = &w->slots[slot];
    struct gw_seq *q = &w->seqs[slot];
    q->pos = sl->pos;
    q->len = sl->len;
    q->pages = (const int32_t *const *)sl->pages;
    q->n_pages = sl->n_pages;
    q->epoch = sl->epoch;
    return q;
}

/* Records the tokens an entry fed (positions start_pos ..). */
static void hist_add(struct gw_wslot *sl, const GwPlanEntry *e)
{
    int64_t at = (int64_t)e->start_pos - sl->hist_from;
    for (size_t t = 0; t < e->n_token_ids; t++)
        sl->hist[at + (int64_t)t] = (int32_t)e->token_ids[t];
}

static int sample_entry(struct gw_worker *w, const GwPlanEntry *e,
                        float *logits, GwSampledToken *out, uint32_t *top_ids,
                        float *top_lps, char *err, size_t errlen)
{
    struct gw_wslot *sl = &w->slots[e->slot];
    const Tangram__Worker__V1__WorkerSampling *ws = e->sampling;
    struct tg_sampling sp = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f,
                             .min_p = 0.0f, .repetition_penalty = 1.0f};
    int K = 0;
    if (ws != NULL) {
        sp.temperature = ws->temperature;
        sp.top_k = ws->top_k;
        sp.top_p = ws->top_p;
        sp.min_p = ws->min_p;
        sp.repetition_penalty = ws->repetition_penalty;
        sp.presence_penalty = ws->presence_penalty;
        sp.frequency_penalty = ws->frequency_penalty;
        K = (int)ws->logprobs;
    }
    /* Known history: positions [hist_from, pos); the prompt is positions
     * [0, num_prompt), the output what follows. */
    int64_t np = sl->num_prompt;
    int64_t p_end = np < sl->pos ? np : sl->pos;
    int64_t o_beg = np > sl->hist_from ? np : sl->hist_from;
    struct tg_sample_history h = {
        .prompt = sl->hist,
        .n_prompt = p_end > sl->hist_from ? (int)(p_end - sl->hist_from) : 0,
        .output = sl->hist + (o_beg - sl->hist_from),
        .n_output = sl->pos > o_beg ? (int)(sl->pos - o_beg) : 0,
    };
    sl->n_sampled = sl->pos > np ? sl->pos - np : 0;
    uint64_t rng = e->seed + (uint64_t)sl->n_sampled * GOLDEN;
    int32_t tok;
    float lp;
    int rc = tg_ops_cpu.sample(w->be, logits, w->model.vocab, &sp, &h, &rng,
                               &tok, &lp, K, w->top_tmp, top_lps);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "slot %u: sampling failed",
                          e->slot);
    for (int k = 0; k < K; k++)
        top_ids[k] = (uint32_t)w->top_tmp[k];
    GwSampledToken init = TANGRAM__WORKER__V1__SAMPLED_TOKEN__INIT;
    *out = init;
    out->slot = e->slot;
    out->token_id = (uint32_t)tok;
    out->logprob = lp;
    out->n_top_ids = (size_t)K;
    out->top_ids = K > 0 ? top_ids : NULL;
    out->n_top_logprobs = (size_t)K;
    out->top_logprobs = K > 0 ? top_lps : NULL;
    return 0;
}

/* Logits rows: the sampled prefill entries take rows 0 .. n_pf - 1 in plan
 * order, the decode batch rows n_pf .. n_pf + nd - 1; both together are at
 * most one row per slot (validated), so they fit the (max_slots, V)
 * buffer. row[i] is entry i's row or -1. */
/* The backend's forward pass: one chunk of w->ids for seq. */
static int fwd_prefill(struct gw_worker *w, struct gw_seq *q, int n,
                       const struct gw_prefill_out *po, char *err,
                       size_t errlen)
{
#ifdef TANGRAM_CUDA
    if (w->backend == GW_WORKER_BACKEND_CUDA)
        return gw_cuda_prefill(&w->cu, q, w->ids, n, po, err, errlen);
#endif
    return gw_forward_prefill(&w->rt, q, w->ids, n, po, err, errlen);
}

/* The backend's decode of the nd sequences in w->seq_ptrs / w->ids. */
static int fwd_decode(struct gw_worker *w, int nd, int want_logits,
                      float *logits, char *err, size_t errlen)
{
#ifdef TANGRAM_CUDA
    if (w->backend == GW_WORKER_BACKEND_CUDA)
        return gw_cuda_decode(&w->cu, w->seq_ptrs, w->ids, nd, want_logits,
                              logits, err, errlen);
#endif
    return gw_forward_decode(&w->rt, w->seq_ptrs, w->ids, nd, want_logits,
                             logits, err, errlen);
}

static int run_plan(struct gw_worker *w, const GwBatchPlan *plan,
                    int32_t *row, char *err, size_t errlen)
{
    size_t V = (size_t)w->model.vocab;
    int rc, n_pf = 0, nd = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        row[i] = -1;
        if (e->kind == TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL &&
            e->sample)
            row[i] = n_pf++;
    }
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        if (e->kind != TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL)
            continue;
        struct gw_wslot *sl = &w->slots[e->slot];
        for (size_t t = 0; t < e->n_token_ids; t++)
            w->ids[t] = (int32_t)e->token_ids[t];
        /* Every rank knows which entries sample (same plan), so all
         * take part in the logits of exactly those. */
        struct gw_prefill_out po = {
            .want_logits = row[i] >= 0,
            .last_logits = row[i] >= 0 && w->logits != NULL
                               ? w->logits + (size_t)row[i] * V
                               : NULL};
        struct gw_seq *q = seq_view(w, e->slot);
        rc = fwd_prefill(w, q, (int)e->n_token_ids, &po, err, errlen);
        if (rc != 0)
            return rc;
        hist_add(sl, e);
        sl->pos = q->pos;
    }
    int d_sample = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        if (e->kind != TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE)
            continue;
        w->seq_ptrs[nd] = seq_view(w, e->slot);
        w->ids[nd] = (int32_t)e->token_ids[0];
        row[i] = n_pf + nd;
        d_sample |= e->sample != 0;
        nd++;
    }
    if (nd > 0) {
        /* rank 0 of the CUDA backend samples penalty-free decode batches
         * on the device: the (nd, V) logits never cross to the host */
        int dev = d_sample && gw__worker_dev_sample_ok(w, plan);
        rc = fwd_decode(w, nd, d_sample,
                        w->logits != NULL && !dev
                            ? w->logits + (size_t)n_pf * V : NULL,
                        err, errlen);
        if (rc != 0)
            return rc;
        for (size_t i = 0; i < plan->n_entries; i++) {
            const GwPlanEntry *e = plan->entries[i];
            if (e->kind != TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE)
                continue;
            struct gw_wslot *sl = &w->slots[e->slot];
            hist_add(sl, e);
            sl->pos = w->seqs[e->slot].pos;
        }
        if (dev && (rc = gw__worker_dev_sample(w, plan, err, errlen)) != 0)
            return rc;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int gw_worker_step(struct gw_worker *w, const GwBatchPlan *plan,
                   GwStepResult *out)
{
    GwStepResult init = TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    *out = init;
    out->version = GW_PROTOCOL_VERSION;
    out->step_id = plan->step_id;
    out->rank = (uint32_t)w->rank;
    out->error = w->error;
    w->error[0] = '\0';
    double t0 = now_s();
    char *err = w->error;
    size_t errlen = sizeof(w->error);
    int rc = w->joined ? check_plan(w, plan, err, errlen)
                       : tg_err_set(err, errlen, TG_EPROTO,
                                    "plan before the communicator group "
                                    "was joined (no CommSetup yet)");
    if (rc == 0 && reserve_all(w, plan) != 0)
        rc = tg_err_set(err, errlen, TG_ENOMEM,
                        "out of memory for the block tables");
    if (rc != 0)
        goto done;
    w->last_step = plan->step_id;
    apply_plan(w, plan);
    /* entry_of is free again after validation: reuse it as the row map. */
    int32_t *row = w->entry_of;
    rc = run_plan(w, plan, row, err, errlen);
    int comm_failed = w->comm.failed;
#ifdef TANGRAM_CUDA
    /* The CUDA backend's collectives are NCCL's: a failed communicator
     * (sticky in tg_nccl) means the same as a failed shared-memory one. */
    if (rc != 0 && w->nccl != NULL && tg_nccl_check(w->nccl, NULL, 0) != 0)
        comm_failed = 1;
#endif
    if (rc != 0 && comm_failed) {
        /* The peers are gone or out of step: nothing more can run. */
        w->peers_lost = 1;
        if (w->peer_lost_flag != NULL)
            *w->peer_lost_flag = 1;
    }
    if (rc != 0 || w->rank != 0)
        goto done;
    size_t V = (size_t)w->model.vocab, K = GW_WORKER_MAX_LOGPROBS;
    size_t n = 0, n_err = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const GwPlanEntry *e = plan->entries[i];
        if (!e->sample)
            continue;
        /* A draw that cannot be made fails only its own request: the
         * entry's KV is written like the others', so the step stands. */
        char *serr = w->serr_text + n_err * GW_WORKER_SLOT_ERROR_MAX;
        int src = gw__worker_check_sampling(e->sampling, w->model.vocab, serr,
                                            GW_WORKER_SLOT_ERROR_MAX, e->slot);
        if (src == 0 &&
            !gw__worker_presampled(w, plan, e, &w->tok[n], w->top_ids + n * K,
                                   w->top_lps + n * K))
            src = sample_entry(w, e, w->logits + (size_t)row[i] * V,
                               &w->tok[n], w->top_ids + n * K,
                               w->top_lps + n * K, serr,
                               GW_WORKER_SLOT_ERROR_MAX);
        if (src != 0) {
            GwSlotError sinit = TANGRAM__WORKER__V1__SLOT_ERROR__INIT;
            w->serr[n_err] = sinit;
            w->serr[n_err].slot = e->slot;
            w->serr[n_err].error = serr;
            w->serr_ptrs[n_err] = &w->serr[n_err];
            n_err++;
            continue;
        }
        w->tok_ptrs[n] = &w->tok[n];
        n++;
    }
    out->n_sampled = n;
    out->sampled = n > 0 ? w->tok_ptrs : NULL;
    out->n_slot_errors = n_err;
    out->slot_errors = n_err > 0 ? w->serr_ptrs : NULL;
done:
    out->ok = rc == 0;
    if (rc != 0) {
        out->n_sampled = 0;
        out->sampled = NULL;
        out->n_slot_errors = 0;
        out->slot_errors = NULL;
        if (w->error[0] == '\0')
            tg_err_set(err, errlen, rc, "%s", tg_strerror(rc));
    }
    out->step_seconds = now_s() - t0;
    return rc;
}

#endif
