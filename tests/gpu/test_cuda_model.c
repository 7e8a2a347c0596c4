/* test_cuda_model.c — the whole model on the CUDA backend (gw_cuda.h)
 * against the CPU forward pass (gw_forward.h) on tiny generated models:
 *  - prompt log-probabilities of a 150-token prompt in chunks of 64, with
 *    and without a compressing profile, on Qwen3 (q/k norm, d 64, G 2),
 *    Llama (d 128, G 4) and Qwen2 (biases, tied embeddings): within bf16
 *    tolerance of the fp32 CPU values, and identical row lengths and
 *    positions; the logits after a chunk's last token (with and without
 *    prompt logprobs in the same call) within tolerance too;
 *  - batched decode of 3 sequences over 12 steps (teacher-forced with the
 *    CPU's greedy tokens; pages handed out as rows fill, so rows cross
 *    page boundaries; one step runs only 2 of the 3): log-softmax within
 *    tolerance, for the padded (bucket 4) and the unpadded batch,
 *    identical row lengths after every step, and the device block table
 *    rebuilt only when the batch changed (otherwise updated in place by
 *    scattering the changed ids: pages appended, also by a prefill chunk
 *    between two decode steps, or a sequence whose page lists were
 *    replaced laid out again in its region);
 *  - CUDA graphs: graph replays of the padded bucket give logits
 *    bit-identical to eager runs of the same padded batch, and the graph
 *    runtime really launched graphs (one eager warm-up step, then
 *    replays);
 *  - sampling on the device (gw_cuda_sample) of logits kept there: the
 *    greedy row is the argmax of the same logits copied to the host,
 *    log-probabilities and the top 5 match the host's log-softmax, and a
 *    top_k 5 draw is one of those five.
 *  - weights: a runtime made from the model's shape alone streams the
 *    checkpoint into a slab byte-identical to the one uploaded from host
 *    weights (and computes what the others compute, within tolerance);
 *  - per-head lengths (a profile of 2 heads per group): gvote (S = 0) and
 *    snapkv with decode-time compaction (trig caps, random statistics, a
 *    compaction after every 8th of 40 decode steps on both backends): the
 *    prompt's logprobs and the decode log-softmax within tolerance, every
 *    row as long as its longest head, head counts equal to the CPU's
 *    (snapkv, trig) and the same heads compacted in one launch round per
 *    trigger.
 * Without a device (or a CUDA build) it reports skipped (77) after
 * checking that gw_cuda_init says TG_ENODEV clearly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"
#include "gpu_worker/cuda/gw_cuda.h"
#include "gpu_worker/model/gw_rank.h"
#include "gpu_worker/cpu/gw_forward.h"
#include "common/kv/kv_layout.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include "kernels/cuda/decode_attn.h"
#endif

#define CHUNK 64
#define PROMPT 150
#define MAX_CTX 200
#define P 16
#define NSEQ 3
#define STEPS 12 /* crosses a page boundary (150 + 11 > 160) */
#define ODD_STEP 5 /* this step decodes sequences 0 and 2 only */
#define PF_STEP 3 /* before this step, a prefill chunk of PF_N tokens
                     (a new turn) extends sequence 0 between decodes */
#define PF_N 20   /* 150 + 20 + 13 decoded stay within MAX_CTX */
#define EPOCH_STEP 9 /* sequence 2's epoch changes (same pointer) */
#define NRT 3 /* CUDA runtimes compared: graphs, padded eager, eager */

#ifdef TANGRAM_CUDA
static char tmpdir[512];
static char q3_dir[600], ll_dir[600], q2_dir[600], q3_profile[640];

static int setup(void **state)
{
    (void)state;
    if (tt_tmpdir_make("tg_test_cuda_model.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    snprintf(q3_dir, sizeof(q3_dir), "%s/q3", tmpdir);
    snprintf(ll_dir, sizeof(ll_dir), "%s/ll", tmpdir);
    snprintf(q2_dir, sizeof(q2_dir), "%s/q2", tmpdir);
    const char *const q3[] = {"--arch", "qwen3", "--hidden", "256", "--layers",
        "2", "--heads", "8", "--kv-heads", "4", "--head-dim", "64", "--ffn",
        "384", "--seed", "11", NULL};
    const char *const ll[] = {"--arch", "llama", "--hidden", "512", "--layers",
        "2", "--heads", "8", "--kv-heads", "2", "--head-dim", "128", "--ffn",
        "512", "--seed", "12", "--tokenizer", NULL, NULL};
    const char *const q2[] = {"--arch", "qwen2", "--hidden", "256", "--layers",
        "2", "--heads", "4", "--kv-heads", "4", "--head-dim", "64", "--ffn",
        "256", "--seed", "13", "--tie", NULL};
    char tok[600];
    tt_data_path("tokenizers/llama3", tok, sizeof(tok));
    const char *ll2[sizeof(ll) / sizeof(ll[0])];
    memcpy(ll2, ll, sizeof(ll));
    ll2[17] = tok;
    int rc = tt_make_model(q3_dir, q3);
    if (rc == 0)
        rc = tt_make_model(ll_dir, ll2);
    if (rc == 0)
        rc = tt_make_model(q2_dir, q2);
    if (rc != 0)
        return -1;
    /* compressing profile, 2 heads per group, budgets permute the heads */
    const double b[8] = {0.9, 0.3, 0.6, 0.2, 0.5, 0.55, 1.0, 0.25};
    const int groups[8] = {3, 1, 2, 0, 3, 0, 1, 2};
    snprintf(q3_profile, sizeof(q3_profile), "%s/q3.json", tmpdir);
    return tt_write_profile(q3_profile, "Qwen3ForCausalLM", 2, 4, 64, 2, b,
                            groups, 0.5);
}

static int teardown(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

/* One sequence's rows over a fixed slice of shuffled pool pages, held as
 * a worker holds them: a kv_seq mirror filled by page id (kv_seq.h), whose
 * counts the forward passes advance and whose slab the CUDA decode table
 * is built from. */
struct seqbuf {
    struct kv_seq kv;
    int32_t **ids;          /* (rows) the ids each row is handed, in order */
    const int32_t **pages;  /* (rows) row pointers into kv's slab */
    struct gw_seq seq;
};

/* Re-points the forward view after pages were appended (the slab may
 * move). */
static void seq_view(struct seqbuf *s, int rows)
{
    for (int r = 0; r < rows; r++)
        s->pages[r] = s->kv.ids + s->kv.off[r];
    s->seq.len = s->kv.filled;
    s->seq.n_pages = s->kv.n_pages;
    s->seq.pages = s->pages;
    s->seq.kv = &s->kv;
}

static void seq_make(struct seqbuf *s, const struct kv_layout *lay, int rows,
                     int per_row, const int32_t *perm, int first_row)
{
    char err[256];
    memset(s, 0, sizeof(*s));
    assert_int_equal(kv_seq_init(&s->kv, lay, err, sizeof(err)), 0);
    s->ids = calloc((size_t)rows, sizeof(*s->ids));
    s->pages = calloc((size_t)rows, sizeof(*s->pages));
    assert_non_null(s->ids);
    assert_non_null(s->pages);
    for (int r = 0; r < rows; r++) {
        s->ids[r] = malloc((size_t)per_row * sizeof(int32_t));
        assert_non_null(s->ids[r]);
        for (int i = 0; i < per_row; i++)
            s->ids[r][i] = perm[(size_t)(first_row + r) * per_row + i];
    }
    s->seq.pos = 0;
    seq_view(s, rows); /* rows get pages as they fill (seq_grow) */
}

/* Gives every row the pages for `add` more tokens (an upper bound for a
 * prefill chunk, which keeps at most all of them), as the router hands
 * pages out while a sequence grows. */
static void seq_grow(struct seqbuf *s, int rows, int per_row, int add)
{
    for (int r = 0; r < rows; r++) {
        int need = (s->kv.filled[r] + add + P - 1) / P;
        if (need > per_row)
            need = per_row;
        int have = s->kv.n_pages[r];
        if (need > have)
            assert_int_equal(kv_seq_row_append(&s->kv, r, s->ids[r] + have,
                                               need - have), 0);
    }
    seq_view(s, rows);
}

/* As if the router had replaced row 0's page list with the same pages: a
 * cut and the same ids again, which renews the epoch. */
static void seq_renew(struct seqbuf *s, int rows)
{
    int n = s->kv.n_pages[0];
    int32_t filled = s->kv.filled[0];
    assert_true(n > 0);
    assert_int_equal(kv_seq_row_cut(&s->kv, 0, n - 1), 0);
    assert_int_equal(kv_seq_row_append(&s->kv, 0, s->ids[0] + n - 1, 1), 0);
    s->kv.filled[0] = filled;
    seq_view(s, rows);
}

static void seq_drop(struct seqbuf *s, int rows)
{
    for (int r = 0; r < rows; r++)
        free(s->ids[r]);
    free(s->ids);
    free(s->pages);
    kv_seq_clear(&s->kv); /* a mirror: the ids are not a pool's */
    kv_seq_free(&s->kv, NULL);
}

static float max_abs_lsm_diff(const float *a, const float *b, int V)
{
    double ma = a[0], mb = b[0], sa = 0, sb = 0;
    for (int j = 1; j < V; j++) {
        ma = a[j] > ma ? a[j] : ma;
        mb = b[j] > mb ? b[j] : mb;
    }
    for (int j = 0; j < V; j++) {
        sa += exp(a[j] - ma);
        sb += exp(b[j] - mb);
    }
    double la = ma + log(sa), lb = mb + log(sb), worst = 0;
    for (int j = 0; j < V; j++) {
        double d = fabs((a[j] - la) - (b[j] - lb));
        worst = d > worst ? d : worst;
    }
    return (float)worst;
}

static int argmax(const float *x, int V)
{
    int best = 0;
    for (int j = 1; j < V; j++)
        if (x[j] > x[best])
            best = j;
    return best;
}

static void run_case(const char *dir, const char *profile, int hp, float tol)
{
    char err[512] = "";
    struct gw_model model = {0};
    struct pf_profile prof = {0};
    struct kv_layout lay = {0};
    enum tg_score_method method;
    struct gw_rank_opts ro = {.model_dir = dir,
                              .profile_path = profile,
                              .heads_per_group = hp,
                              .page_size = P,
                              .prefill_chunk = CHUNK,
                              .rank = 0,
                              .world_size = 1};
    int *heads = NULL;
    int rc = gw_rank_load_map(&model, &prof, &lay, &method, &heads, &ro, err,
                              sizeof(err));
    if (rc != 0)
        fail_msg("load %s: %s", dir, err);
    /* cu[2] gets the shape alone: its runtime streams the checkpoint into
     * its slab (what a CUDA worker does), the others upload host weights */
    struct gw_model shape;
    struct gw_shard sh = {.rank = 0, .world = 1, .kv_heads = heads};
    if (gw_model_open(&shape, dir, &sh, err, sizeof(err)) != 0)
        fail_msg("shape of %s: %s", dir, err);
    free(heads);
    int L = model.n_layers, G = lay.n_groups, rows = L * G;
    int per_row = (MAX_CTX + P - 1) / P;
    int32_t n_pages = rows * per_row * NSEQ;
    int32_t *perm = malloc((size_t)n_pages * sizeof(int32_t));
    for (int32_t i = 0; i < n_pages; i++)
        perm[i] = i;
    uint64_t st = 0x1234567;
    for (int32_t i = n_pages - 1; i > 0; i--) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t)((st >> 33) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }

    struct tg_backend *be = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &be), 0);
    struct gw_runtime rt;
    struct gw_forward_opts fo = {.method = method, .max_tokens = CHUNK};
    rc = gw_runtime_init(&rt, &model, &lay, &tg_ops_cpu, be, n_pages, &fo, err,
                         sizeof(err));
    if (rc != 0)
        fail_msg("cpu runtime: %s", err);

    int n_cta = 0;
    assert_int_equal(tg_cuda_decode_attn_n_cta(model.n_q_heads / model.n_kv_heads,
                                               model.head_dim, &n_cta), 0);
    int *splits = malloc((size_t)rows * sizeof(int));
    assert_int_equal(pf_split_map(&prof, n_cta, splits, err, sizeof(err)), 0);
    /* cu[0]: graphs (NSEQ = 3 runs in bucket 4, one padding row);
     * cu[1]: graphs on but every bucket marked failed, so each step runs
     * decode_body eagerly at the same padded batch: its logits must be
     * bit-identical to the graph's (same kernels, shapes and addresses);
     * cu[2]: graphs off, the unpadded eager batch of NSEQ rows (other GEMM
     * shapes, so compared with the CPU within tolerance only). */
    struct gw_cuda cu[NRT];
    for (int gi = 0; gi < NRT; gi++) {
        struct gw_cuda_opts co = {.device = 0, .method = method,
                                  .max_chunk = CHUNK, .max_seqs = 4,
                                  .kv_pages = n_pages,
                                  .reserve_bytes = (uint64_t)256 << 20,
                                  .graphs = gi < 2, .splits = splits};
        rc = gw_cuda_init(&cu[gi], gi == 2 ? &shape : &model, &lay, &co, err,
                          sizeof(err));
        if (rc != 0)
            fail_msg("cuda runtime: %s", err);
    }
    /* Streamed from the file or uploaded from host fp32, the slab holds
     * the same bytes (bf16 kept bit for bit, padding zero). */
    assert_int_equal(cu[0].ws.bytes, cu[2].ws.bytes);
    assert_int_equal(cu[2].load.n_files, 1);
    assert_int_equal(cu[0].load.n_files, 0);
    {
        size_t nb = (size_t)cu[0].ws.bytes;
        void *a = malloc(nb), *b = malloc(nb);
        tt_cuda_to_host(a, cu[0].wslab, nb);
        tt_cuda_to_host(b, cu[2].wslab, nb);
        assert_memory_equal(a, b, nb);
        free(a);
        free(b);
    }
    for (int b = 0; b < cu[1].n_buckets; b++)
        cu[1].graph_failed[b] = 1;

    int V = model.vocab;
    struct seqbuf cs[NSEQ], gs[NRT][NSEQ];
    int32_t prompt[NSEQ][PROMPT];
    float *lp_c = malloc(PROMPT * sizeof(float));
    float *lp_g[NRT];
    for (int gi = 0; gi < NRT; gi++)
        lp_g[gi] = malloc(PROMPT * sizeof(float));
    float *last_c = malloc((size_t)V * sizeof(float));
    float *last_g = malloc((size_t)V * sizeof(float));
    float worst_lp = 0, worst_last = 0;
    for (int s = 0; s < NSEQ; s++) {
        seq_make(&cs[s], &lay, rows, per_row, perm, s * rows);
        for (int gi = 0; gi < NRT; gi++)
            seq_make(&gs[gi][s], &lay, rows, per_row, perm, s * rows);
        for (int i = 0; i < PROMPT; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            prompt[s][i] = (int32_t)((st >> 33) % (uint64_t)V);
        }
        for (int i0 = 0; i0 < PROMPT; i0 += CHUNK) {
            int n = PROMPT - i0 < CHUNK ? PROMPT - i0 : CHUNK;
            int32_t tgt[CHUNK];
            for (int i = 0; i < n; i++)
                tgt[i] = i0 + i + 1 < PROMPT ? prompt[s][i0 + i + 1] : -1;
            /* The logits after the chunk's last token (what the worker
             * samples from): sequence 0 asks for them together with the
             * prompt logprobs (c->h must survive the logprob blocks),
             * sequence 1 alone on its middle chunk, sequence 2 never. */
            int lp_on = !(s == 1 && i0 == CHUNK);
            int last_on = s == 0 || (s == 1 && i0 == CHUNK);
            struct gw_prefill_out oc = {
                .want_logits = last_on, .last_logits = last_c,
                .lp_targets = lp_on ? tgt : NULL, .lp = lp_c + i0};
            seq_grow(&cs[s], rows, per_row, n);
            for (int gi = 0; gi < NRT; gi++)
                seq_grow(&gs[gi][s], rows, per_row, n);
            rc = gw_forward_prefill(&rt, &cs[s].seq, prompt[s] + i0, n, &oc,
                                    err, sizeof(err));
            if (rc != 0)
                fail_msg("cpu prefill: %s", err);
            for (int gi = 0; gi < NRT; gi++) {
                struct gw_prefill_out og = {
                    .want_logits = last_on, .last_logits = last_g,
                    .lp_targets = lp_on ? tgt : NULL, .lp = lp_g[gi] + i0};
                rc = gw_cuda_prefill(&cu[gi], &gs[gi][s].seq, prompt[s] + i0, n,
                                     &og, err, sizeof(err));
                if (rc != 0)
                    fail_msg("cuda prefill: %s", err);
                if (last_on) {
                    float d = max_abs_lsm_diff(last_c, last_g, V);
                    worst_last = d > worst_last ? d : worst_last;
                }
                /* identical kept counts (the lens the device appended at) */
                for (int r = 0; r < rows; r++)
                    assert_int_equal(cs[s].kv.filled[r], gs[gi][s].kv.filled[r]);
                assert_true(cs[s].seq.pos == gs[gi][s].seq.pos);
            }
            if (!lp_on)
                continue;
            for (int i = 0; i < n && i0 + i + 1 < PROMPT; i++)
                for (int gi = 0; gi < NRT; gi++) {
                    float d = fabsf(lp_c[i0 + i] - lp_g[gi][i0 + i]);
                    if (!(d <= worst_lp)) /* NaN counts as the worst */
                        worst_lp = isnan(d) ? INFINITY : d;
                }
        }
    }
    printf("# %s %s: worst prompt logprob difference %.4g, worst last-token "
           "log-softmax difference %.4g (tolerance %.3g)\n", dir,
           profile ? "profile" : "full KV", worst_lp, worst_last, tol);
    assert_true(worst_lp <= tol);
    assert_true(worst_last <= tol);

    /* batched decode, teacher-forced with the CPU's greedy tokens */
    float *lc = malloc((size_t)NSEQ * V * sizeof(float));
    float *lg[NRT];
    for (int gi = 0; gi < NRT; gi++)
        lg[gi] = malloc((size_t)NSEQ * V * sizeof(float));
    int32_t ids[NSEQ];
    for (int s = 0; s < NSEQ; s++)
        ids[s] = prompt[s][PROMPT - 1];
    float worst_dec = 0;
    for (int step = 0; step < STEPS; step++) {
        if (step == PF_STEP) {
            /* a new turn of sequence 0 between two decode steps: its rows
             * grow (lengths and pages) while the decode batch stays the
             * same, so the next decode must update the cached table in
             * place with the pages this chunk appended */
            int32_t chunk[PF_N];
            chunk[0] = ids[0];
            for (int i = 1; i < PF_N; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                chunk[i] = (int32_t)((st >> 33) % (uint64_t)V);
            }
            struct gw_prefill_out oc = {.want_logits = 1,
                                        .last_logits = last_c};
            seq_grow(&cs[0], rows, per_row, PF_N);
            if (gw_forward_prefill(&rt, &cs[0].seq, chunk, PF_N, &oc, err,
                                   sizeof(err)) != 0)
                fail_msg("cpu prefill between decodes: %s", err);
            for (int gi = 0; gi < NRT; gi++) {
                struct gw_prefill_out og = {.want_logits = 1,
                                            .last_logits = last_g};
                seq_grow(&gs[gi][0], rows, per_row, PF_N);
                if (gw_cuda_prefill(&cu[gi], &gs[gi][0].seq, chunk, PF_N,
                                    &og, err, sizeof(err)) != 0)
                    fail_msg("cuda prefill between decodes: %s", err);
                float d = max_abs_lsm_diff(last_c, last_g, V);
                if (!(d <= worst_dec))
                    worst_dec = isnan(d) ? INFINITY : d;
                for (int r = 0; r < rows; r++)
                    assert_int_equal(cs[0].kv.filled[r], gs[gi][0].kv.filled[r]);
                assert_true(cs[0].seq.pos == gs[gi][0].seq.pos);
            }
            ids[0] = argmax(last_c, V);
        }
        if (step == EPOCH_STEP) /* as if its page lists were replaced */
            for (int gi = 0; gi < NRT; gi++)
                seq_renew(&gs[gi][2], rows);
        /* every step but ODD_STEP decodes all sequences; ODD_STEP only 0
         * and 2 (a smaller bucket, and a changed batch: the device block
         * table is rebuilt, then rebuilt again for the next step) */
        int pick[NSEQ], nb = 0;
        for (int s = 0; s < NSEQ; s++)
            if (step != ODD_STEP || s != 1)
                pick[nb++] = s;
        struct gw_seq *cp[NSEQ], *gp[NRT][NSEQ];
        int32_t bid[NSEQ];
        for (int b = 0; b < nb; b++) {
            int s = pick[b];
            bid[b] = ids[s];
            seq_grow(&cs[s], rows, per_row, 1);
            cp[b] = &cs[s].seq;
            for (int gi = 0; gi < NRT; gi++) {
                seq_grow(&gs[gi][s], rows, per_row, 1);
                gp[gi][b] = &gs[gi][s].seq;
            }
        }
        if (gw_forward_decode(&rt, cp, bid, nb, 1, lc, err, sizeof(err)) != 0)
            fail_msg("cpu decode: %s", err);
        for (int gi = 0; gi < NRT; gi++)
            if (gw_cuda_decode(&cu[gi], gp[gi], bid, nb, 1, lg[gi], err,
                               sizeof(err)) != 0)
                fail_msg("cuda decode: %s", err);
        /* graph replay == eager run of the same padded batch, bit for bit */
        assert_memory_equal(lg[0], lg[1], (size_t)nb * V * sizeof(float));
        for (int b = 0; b < nb; b++) {
            int s = pick[b];
            for (int gi = 0; gi < NRT; gi += 2) {
                float d = max_abs_lsm_diff(lc + (size_t)b * V,
                                           lg[gi] + (size_t)b * V, V);
                if (!(d <= worst_dec))
                    worst_dec = isnan(d) ? INFINITY : d;
            }
            ids[s] = argmax(lc + (size_t)b * V, V);
            for (int gi = 0; gi < NRT; gi++) {
                for (int r = 0; r < rows; r++) {
                    assert_int_equal(cs[s].kv.filled[r], gs[gi][s].kv.filled[r]);
                    assert_int_equal(cs[s].kv.n_pages[r], gs[gi][s].kv.n_pages[r]);
                }
                assert_true(cs[s].seq.pos == gs[gi][s].seq.pos);
            }
        }
    }
    /* one more step: cu[0] keeps its logits on the device and samples
     * there; cu[1] (bit-identical logits) copies them to the host */
    {
        struct gw_seq *gp0[NSEQ], *gp1[NSEQ];
        for (int s = 0; s < NSEQ; s++) {
            seq_grow(&gs[0][s], rows, per_row, 1);
            seq_grow(&gs[1][s], rows, per_row, 1);
            gp0[s] = &gs[0][s].seq;
            gp1[s] = &gs[1][s].seq;
        }
        if (gw_cuda_decode(&cu[0], gp0, ids, NSEQ, 1, NULL, err,
                           sizeof(err)) != 0 ||
            gw_cuda_decode(&cu[1], gp1, ids, NSEQ, 1, lg[1], err,
                           sizeof(err)) != 0)
            fail_msg("cuda decode for sampling: %s", err);
        assert_int_equal(cu[0].dev_rows, NSEQ);
        struct tg_cuda_sample_params sp[NSEQ] = {
            {.temperature = 0.0f, .top_p = 1.0f, .seed = 1, .step = 0},
            {.temperature = 0.8f, .top_k = 5, .top_p = 1.0f, .seed = 2,
             .step = 3},
            {.temperature = 1.0f, .top_p = 0.9f, .seed = 3, .step = 7},
        };
        int32_t tok[NSEQ], top_ids[NSEQ * 5], bad[NSEQ];
        float lp[NSEQ], top_lps[NSEQ * 5], bad_val[NSEQ];
        if (gw_cuda_sample(&cu[0], NSEQ, sp, NULL, NULL, 5, tok, lp, top_ids,
                           top_lps, bad, bad_val, err, sizeof(err)) != 0)
            fail_msg("device sampling: %s", err);
        assert_int_equal(cu[0].dev_rows, 0); /* one sampling per decode */
        for (int s = 0; s < NSEQ; s++)
            assert_int_equal(bad[s], -1); /* finite rows */
        for (int s = 0; s < NSEQ; s++) {
            const float *row = lg[1] + (size_t)s * V;
            double mx = row[0], sum = 0;
            for (int j = 1; j < V; j++)
                mx = row[j] > mx ? row[j] : mx;
            for (int j = 0; j < V; j++)
                sum += exp(row[j] - mx);
            double lse = mx + log(sum);
            assert_true(tok[s] >= 0 && tok[s] < V);
            assert_true(fabs(lp[s] - (row[tok[s]] - lse)) < 1e-4);
            assert_int_equal(top_ids[s * 5], argmax(row, V));
            for (int k = 0; k < 5; k++) {
                assert_true(fabs(top_lps[s * 5 + k] -
                                 (row[top_ids[s * 5 + k]] - lse)) < 1e-4);
                if (k > 0)
                    assert_true(top_lps[s * 5 + k] <= top_lps[s * 5 + k - 1]);
            }
        }
        assert_int_equal(tok[0], argmax(lg[1], V)); /* greedy */
        int in_top = 0; /* top_k 5: the draw is one of the five */
        for (int k = 0; k < 5; k++)
            in_top |= top_ids[5 + k] == tok[1];
        assert_true(in_top);
    }
    printf("# decode: worst log-softmax difference %.4g; graph launches %lld, "
           "eager steps %lld%s%s\n", worst_dec, (long long)cu[0].graph_launches,
           (long long)cu[0].eager_steps, cu[0].graph_error[0] ? "; " : "",
           cu[0].graph_error);
    assert_true(worst_dec <= tol);
    /* the first step of the bucket runs eagerly and captures; the rest
     * replay the graph */
    /* STEPS decode steps plus the device-sampling step: bucket 4 runs
     * STEPS of them (the first eagerly), bucket 2 the ODD_STEP (eagerly) */
    assert_int_equal(cu[0].graph_launches, STEPS - 1);
    assert_int_equal(cu[0].eager_steps, 2);
    assert_int_equal(cu[1].graph_launches, 0);
    assert_int_equal(cu[1].eager_steps, STEPS + 1);
    /* block tables (kv_table_refresh): built at the first step, at
     * ODD_STEP (a batch of another size) and after it; at EPOCH_STEP the
     * renewed sequence's slot is laid out again in its own region and
     * sent as a scatter like every other step (PF_STEP too, which only
     * appended); the rows did cross a page boundary (something was
     * scattered). cu[2] has no device-sampling step. */
    for (int gi = 0; gi < NRT; gi++) {
        int steps = gi < 2 ? STEPS + 1 : STEPS;
        assert_int_equal(cu[gi].table_builds, 3);
        assert_int_equal(cu[gi].table_deltas, steps - 3);
        assert_true(cu[gi].table_scattered > 0);
    }
    assert_int_equal(cu[2].graph_launches, 0);
    assert_int_equal(cu[2].eager_steps, STEPS);

    for (int s = 0; s < NSEQ; s++) {
        seq_drop(&cs[s], rows);
        for (int gi = 0; gi < NRT; gi++)
            seq_drop(&gs[gi][s], rows);
    }
    free(lc);
    free(lp_c);
    free(last_c);
    free(last_g);
    for (int gi = 0; gi < NRT; gi++) {
        free(lg[gi]);
        free(lp_g[gi]);
        gw_cuda_free(&cu[gi]);
    }
    free(splits);
    gw_runtime_free(&rt);
    tg_backend_cpu_free(be);
    free(perm);
    kv_layout_free(&lay);
    pf_profile_free(&prof);
    gw_model_free(&shape);
    gw_model_free(&model);
}

static void test_qwen3_full(void **state)
{
    (void)state;
    run_case(q3_dir, NULL, 2, 0.05f);
}

static void test_qwen3_profile(void **state)
{
    (void)state;
    /* near-tied key scores may select different keys under bf16 */
    run_case(q3_dir, q3_profile, 2, 0.1f);
}

static void test_llama_full(void **state)
{
    (void)state;
    run_case(ll_dir, NULL, 1, 0.05f);
}

static void test_qwen2_tied_bias(void **state)
{
    (void)state;
    run_case(q2_dir, NULL, 4, 0.05f);
}

/* ---- per-head lengths: gvote and decode-time compaction ---------------- */

#define HSTEPS 40    /* decode steps of a per-head case */
#define TRIG_EVERY 8 /* trig's beta there (budget 12, window 4) */

/* Gives a seqbuf per-head lengths (as a worker slot keeps them). */
static void seq_heads(struct seqbuf *s, const struct kv_layout *lay)
{
    char err[256];
    if (kv_seq_heads_enable(&s->kv, lay, err, sizeof(err)) != 0)
        fail_msg("kv_seq_heads_enable: %s", err);
    s->seq.hlen = s->kv.head_len;
    s->seq.seed = 7;
}

/* Every head within its row, every row as long as its longest head. */
static void check_heads(const struct seqbuf *s, const struct kv_layout *lay)
{
    int L = lay->n_layers, G = lay->n_groups, H = lay->n_kv_heads;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++) {
            int32_t mx = 0;
            for (int h = 0; h < H; h++)
                if (lay->head_group[l * H + h] == g &&
                    s->kv.head_len[l * H + h] > mx)
                    mx = s->kv.head_len[l * H + h];
            assert_int_equal(s->kv.filled[l * G + g], mx);
        }
}

/* One sequence with per-head lengths on both backends, q3 with the
 * 2-heads-per-group profile: gvote (S = 0) or snapkv with trig (random
 * statistics). The prompt's logprobs and HSTEPS teacher-forced decode
 * steps (graphs on; with trig a compaction after every TRIG_EVERY-th on
 * both sides) within tol; head counts exactly the CPU's where they are
 * determined by lengths alone (snapkv, trig), checked for consistency
 * under gvote (its bf16 inputs may tip a near-tie of the nucleus). */
static void run_heads_case(int gvote, int trig, float tol)
{
    char err[512] = "";
    struct gw_model model = {0};
    struct pf_profile prof = {0};
    struct kv_layout lay = {0};
    enum tg_score_method method;
    struct gw_gvote_params gp = gw_gvote_params_default();
    gp.samples = 0;
    struct gw_rank_opts ro = {.model_dir = q3_dir,
                              .profile_path = q3_profile,
                              .page_size = P,
                              .prefill_chunk = CHUNK,
                              .method = gvote ? "gvote" : NULL,
                              .world_size = 1};
    if (gw_rank_load(&model, &prof, &lay, &method, &ro, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    int L = model.n_layers, G = lay.n_groups, H = lay.n_kv_heads;
    int rows = L * G, per_row = (MAX_CTX + P - 1) / P, V = model.vocab;
    int32_t n_pages = rows * per_row;
    int32_t *perm = malloc((size_t)n_pages * sizeof(int32_t));
    for (int32_t i = 0; i < n_pages; i++)
        perm[i] = n_pages - 1 - i;
    struct tg_backend *be = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &be), 0);
    struct gw_runtime rt;
    struct gw_forward_opts fo = {.method = method, .gvote = gp,
                                 .max_tokens = CHUNK};
    if (gw_runtime_init(&rt, &model, &lay, &tg_ops_cpu, be, n_pages, &fo, err,
                        sizeof(err)) != 0)
        fail_msg("cpu runtime: %s", err);
    struct pf_trig stats = {0};
    struct gw_trig_cfg tc = {0};
    uint64_t st = 0x5eed;
    if (trig) {
        assert_int_equal(pf_trig_init(&stats, L, model.n_q_heads,
                                      model.head_dim, err, sizeof(err)), 0);
        size_t n = (size_t)L * model.n_q_heads * (size_t)(model.head_dim / 2);
        for (size_t i = 0; i < n; i++) {
            double u[3];
            for (int k = 0; k < 3; k++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                u[k] = (double)(st >> 11) / 9007199254740992.0;
            }
            stats.re[i] = (float)(2 * u[0] - 1);
            stats.im[i] = (float)(2 * u[1] - 1);
            stats.abs[i] = (float)(hypot(stats.re[i], stats.im[i]) + 0.5 * u[2]);
        }
        struct gw_trig_opts to = {.enabled = 1, .budget = 12,
                                  .every = TRIG_EVERY, .window = 4};
        if (gw_trig_cfg_init(&tc, &to, &prof, &lay, &stats, model.n_q_heads,
                             model.inv_freq, err, sizeof(err)) != 0)
            fail_msg("trig cfg: %s", err);
    }
    int n_cta = 0;
    assert_int_equal(tg_cuda_decode_attn_n_cta(model.n_q_heads / model.n_kv_heads,
                                               model.head_dim, &n_cta), 0);
    int *splits = malloc((size_t)rows * sizeof(int));
    assert_int_equal(pf_split_map(&prof, n_cta, splits, err, sizeof(err)), 0);
    struct gw_cuda cu;
    struct gw_cuda_opts co = {.device = 0, .method = method,
                              .max_chunk = CHUNK, .max_seqs = 4,
                              .kv_pages = n_pages,
                              .reserve_bytes = (uint64_t)256 << 20,
                              .graphs = 1, .splits = splits, .per_head = 1,
                              .gvote = gp, .host_ops = &tg_ops_cpu,
                              .host_be = be, .trig = trig ? &tc : NULL};
    if (gw_cuda_init(&cu, &model, &lay, &co, err, sizeof(err)) != 0)
        fail_msg("cuda runtime: %s", err);

    struct seqbuf cs, gs;
    seq_make(&cs, &lay, rows, per_row, perm, 0);
    seq_make(&gs, &lay, rows, per_row, perm, 0);
    seq_heads(&cs, &lay);
    seq_heads(&gs, &lay);
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((st >> 33) % (uint64_t)V);
    }
    float lp_c[PROMPT], lp_g[PROMPT], worst_lp = 0, worst_dec = 0;
    float *lc = malloc((size_t)V * sizeof(float));
    float *lg = malloc((size_t)V * sizeof(float));
    int head_diff = 0;
    for (int i0 = 0; i0 < PROMPT; i0 += CHUNK) {
        int n = PROMPT - i0 < CHUNK ? PROMPT - i0 : CHUNK;
        int32_t tgt[CHUNK];
        for (int i = 0; i < n; i++)
            tgt[i] = i0 + i + 1 < PROMPT ? prompt[i0 + i + 1] : -1;
        struct gw_prefill_out oc = {.want_logits = 1, .last_logits = lc,
                                    .lp_targets = tgt, .lp = lp_c + i0};
        struct gw_prefill_out og = {.want_logits = 1, .last_logits = lg,
                                    .lp_targets = tgt, .lp = lp_g + i0};
        seq_grow(&cs, rows, per_row, n);
        seq_grow(&gs, rows, per_row, n);
        if (gw_forward_prefill(&rt, &cs.seq, prompt + i0, n, &oc, err,
                               sizeof(err)) != 0)
            fail_msg("cpu prefill: %s", err);
        if (gw_cuda_prefill(&cu, &gs.seq, prompt + i0, n, &og, err,
                            sizeof(err)) != 0)
            fail_msg("cuda prefill: %s", err);
        for (int i = 0; i < n && i0 + i + 1 < PROMPT; i++) {
            float d = fabsf(lp_c[i0 + i] - lp_g[i0 + i]);
            if (!(d <= worst_lp))
                worst_lp = isnan(d) ? INFINITY : d;
        }
        check_heads(&gs, &lay);
        for (int i = 0; i < L * H; i++) {
            head_diff += cs.kv.head_len[i] != gs.kv.head_len[i];
            if (!gvote)
                assert_int_equal(cs.kv.head_len[i], gs.kv.head_len[i]);
        }
    }
    /* The decode region starts after the prompt (the worker's dstart). */
    int32_t *ds_c = malloc((size_t)L * H * sizeof(int32_t));
    int32_t *ds_g = malloc((size_t)L * H * sizeof(int32_t));
    memcpy(ds_c, cs.kv.head_len, (size_t)L * H * sizeof(int32_t));
    memcpy(ds_g, gs.kv.head_len, (size_t)L * H * sizeof(int32_t));
    cs.seq.dstart = ds_c;
    gs.seq.dstart = ds_g;
    int32_t id = argmax(lc, V);
    int64_t compacted = 0;
    for (int step = 0; step < HSTEPS; step++) {
        seq_grow(&cs, rows, per_row, 1);
        seq_grow(&gs, rows, per_row, 1);
        struct gw_seq *cp = &cs.seq, *gq = &gs.seq;
        if (gw_forward_decode(&rt, &cp, &id, 1, 1, lc, err, sizeof(err)) != 0)
            fail_msg("cpu decode: %s", err);
        if (gw_cuda_decode(&cu, &gq, &id, 1, 1, lg, err, sizeof(err)) != 0)
            fail_msg("cuda decode: %s", err);
        float d = max_abs_lsm_diff(lc, lg, V);
        if (!(d <= worst_dec))
            worst_dec = isnan(d) ? INFINITY : d;
        id = argmax(lc, V);
        if (trig && (step + 1) % TRIG_EVERY == 0) {
            int64_t hc = 0, hg = 0;
            if (gw_forward_trig(&rt, &tc, &cp, 1, &hc, err, sizeof(err)) != 0)
                fail_msg("cpu compaction: %s", err);
            if (gw_cuda_compact(&cu, &tc, &gq, 1, &hg, err, sizeof(err)) != 0)
                fail_msg("cuda compaction: %s", err);
            assert_int_equal(hc, hg);
            compacted += hg;
        }
        check_heads(&gs, &lay);
        for (int i = 0; i < L * H && !gvote; i++)
            assert_int_equal(cs.kv.head_len[i], gs.kv.head_len[i]);
    }
    printf("# per-head %s: worst prompt logprob difference %.4g, worst decode "
           "log-softmax difference %.4g (tolerance %.3g); heads whose counts "
           "differ from the CPU's %d; heads compacted %lld in %lld rounds\n",
           gvote ? "gvote" : "trig", worst_lp, worst_dec, tol, head_diff,
           (long long)compacted, (long long)cu.trig_rounds);
    assert_true(worst_lp <= tol);
    assert_true(worst_dec <= tol);
    if (trig) {
        assert_true(compacted > 0);
        /* one round per trigger that compacted: the batch in one go */
        assert_true(cu.trig_rounds > 0 && cu.trig_rounds <= HSTEPS / TRIG_EVERY);
    }
    free(ds_c);
    free(ds_g);
    free(lc);
    free(lg);
    seq_drop(&cs, rows);
    seq_drop(&gs, rows);
    gw_cuda_free(&cu);
    free(splits);
    gw_trig_cfg_free(&tc);
    pf_trig_free(&stats);
    gw_runtime_free(&rt);
    tg_backend_cpu_free(be);
    free(perm);
    kv_layout_free(&lay);
    pf_profile_free(&prof);
    gw_model_free(&model);
}

static void test_qwen3_gvote(void **state)
{
    (void)state;
    run_heads_case(1, 0, 0.1f);
}

static void test_qwen3_trig(void **state)
{
    (void)state;
    run_heads_case(0, 1, 0.1f);
}
#endif

int main(void)
{
#ifndef TANGRAM_CUDA
    return tt_cuda_skip("built without CUDA");
#else
    if (!tt_cuda_have_device(NULL)) {
        /* the runtime must say so clearly instead of failing obscurely */
        struct gw_model m = {0};
        struct kv_layout lay = {0};
        m.head_dim = 64;
        m.n_q_heads = m.n_kv_heads = 1;
        m.vocab = 1;
        m.world = 1;
        lay.heads_per_group = 1;
        lay.n_kv_heads = 1;
        lay.head_dim = 64;
        int splits[1] = {1};
        struct gw_cuda_opts o = {.max_chunk = 16, .max_seqs = 1, .kv_pages = 1,
                                 .splits = splits};
        struct gw_cuda c;
        char err[256] = "";
        int rc = gw_cuda_init(&c, &m, &lay, &o, err, sizeof(err));
        printf("# without a device gw_cuda_init says: %s (%s)\n", err,
               tg_err_name(rc));
        if (rc != TG_ENODEV)
            return 1;
        return tt_cuda_skip("no CUDA device");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_full),
        cmocka_unit_test(test_qwen3_profile),
        cmocka_unit_test(test_llama_full),
        cmocka_unit_test(test_qwen2_tied_bias),
        cmocka_unit_test(test_qwen3_gvote),
        cmocka_unit_test(test_qwen3_trig),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
#endif
}
