/* test_model_load.c — streaming weight loading (gpu_worker/model/gw_load.h) on
 * small generated checkpoints:
 *   - host fp32 weights (the CPU backend's sink) equal the mapped file's
 *     tensors converted by st_tensor_read_f32, bit for bit, for bf16,
 *     fp16 and fp32 checkpoints, tied and untied, with the smallest
 *     staging buffer (every large tensor crosses it in many slices); the
 *     staging never grows and every tensor byte is read exactly once;
 *   - a sharded checkpoint (model.safetensors.index.json, 3 shards, the
 *     tensors in another order, fp32 q/k/v/o biases added) loads the same
 *     weights as the single file, plus the biases;
 *   - the device weight slab's upload (gw_wslab.h: the CUDA path without
 *     the device copy) checksums equal to an independent plain read of
 *     every tensor, for whole models, tensor-parallel ranks with permuted
 *     heads (rows, columns, the ffn range, the vocabulary slice of an
 *     untied head and of a tied one, o_proj's bias only on rank 0) and
 *     tiny bounce buffers; feeding the slab from host weights gives the
 *     same sums as feeding it from the file;
 *   - a missing tensor is named, a file truncated after it was opened is
 *     a TG_EIO naming the file, a model without host weights is refused by
 *     the CPU backend.
 * Models come from $TANGRAM_BIN/tangram-make-model (a failure when it is
 * not built) with a 1001-token tokenizer the test writes, so they are
 * small yet wider than the smallest staging. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model/st_safetensors.h"
#include "common/model/st_writer.h"
#include "common/base/tg_err.h"
#include "gpu_worker/backend/gw_backend.h"
#include "gpu_worker/model/gw_load.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/cuda/gw_wslab.h"
#include "tests/support/tt_support.h"
#include "tests/support/tt_wsum.h"

static char tmpdir[256];
static char bf16_dir[300], fp16_dir[300], fp32_dir[300], shard_dir[300];
static char errbuf[512];

/* A copy of src's tensors (their order reversed) in n shards with an index,
 * src's config, plus, with bias, fp32 q/k/v/o biases of every layer and
 * attention_bias set; `drop` (or NULL) is left out. */
static int reshard(const char *src, const char *dst, int n, int bias,
                   const char *drop)
{
    char path[512];
    struct st_model st;
    if (st_model_open(&st, src, errbuf, sizeof(errbuf)) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (cfg == NULL)
        return -1;
    int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    int H = (int)json_integer_value(json_object_get(cfg, "hidden_size"));
    int Hq = (int)json_integer_value(json_object_get(cfg, "num_attention_heads"));
    int Hkv = (int)json_integer_value(json_object_get(cfg, "num_key_value_heads"));
    int d = (int)json_integer_value(json_object_get(cfg, "head_dim"));
    if (bias)
        json_object_set_new(cfg, "attention_bias", json_true());
    snprintf(path, sizeof(path), "%s/config.json", dst);
    if (json_dump_file(cfg, path, JSON_INDENT(2)) != 0)
        return -1;
    json_decref(cfg);
    struct st_writer *w = calloc((size_t)n, sizeof(*w));
    json_t *map = json_object();
    for (int i = 0; i < n; i++)
        st_writer_init(&w[i]);
    int rc = 0, k = 0;
    for (size_t i = st.n_tensors; i-- > 0 && rc == 0;) {
        const struct st_tensor *t = st.tensors[i];
        if (drop != NULL && strcmp(t->name, drop) == 0)
            continue;
        int s = k++ % n;
        rc = st_writer_add(&w[s], t->name, t->dtype, t->rank, t->shape, t->data,
                           errbuf, sizeof(errbuf));
        char fn[64];
        snprintf(fn, sizeof(fn), "model-%05d-of-%05d.safetensors", s + 1, n);
        json_object_set_new(map, t->name, json_string(fn));
    }
    /* Biases: fp32, values from a fixed stream. */
    size_t nb = (size_t)L * (size_t)(Hq * d + 2 * Hkv * d + H);
    float *bvals = malloc(nb * sizeof(float));
    struct tt_xrng r = {0x5eed};
    for (size_t i = 0; i < nb; i++)
        bvals[i] = tt_xrng_sym(&r);
    float *bp = bvals;
    static const char *const names[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int l = 0; bias && l < L && rc == 0; l++) {
        int64_t len[4] = {(int64_t)Hq * d, (int64_t)Hkv * d, (int64_t)Hkv * d, H};
        for (int j = 0; j < 4 && rc == 0; j++) {
            char name[128], fn[64];
            snprintf(name, sizeof(name), "model.layers.%d.self_attn.%s.bias", l,
                     names[j]);
            int s = k++ % n;
            rc = st_writer_add(&w[s], name, ST_DTYPE_F32, 1, &len[j], bp, errbuf,
                               sizeof(errbuf));
            bp += len[j];
            snprintf(fn, sizeof(fn), "model-%05d-of-%05d.safetensors", s + 1, n);
            json_object_set_new(map, name, json_string(fn));
        }
    }
    for (int i = 0; i < n && rc == 0; i++) {
        snprintf(path, sizeof(path), "%s/model-%05d-of-%05d.safetensors", dst,
                 i + 1, n);
        rc = st_writer_write(&w[i], path, errbuf, sizeof(errbuf));
    }
    json_t *idx = json_pack("{s:{s:s}, s:o}", "metadata", "format", "pt",
                            "weight_map", map);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dst);
    if (rc == 0 && json_dump_file(idx, path, JSON_INDENT(2)) != 0)
        rc = -1;
    json_decref(idx);
    for (int i = 0; i < n; i++)
        st_writer_free(&w[i]);
    free(w);
    free(bvals);
    st_model_close(&st);
    return rc == 0 ? 0 : -1;
}

/* A tokenizer directory that tangram-make-model takes: VOCAB tokens (an
 * odd count, so two ranks' vocabulary slices differ and the last one is
 * padded on the device), eos the last. Small, so every tensor is quick
 * to write and to check, yet the embedding is still wider than the
 * smallest staging. */
#define VOCAB 1001
static char tok_dir[300];

static int write_tokenizer(void)
{
    snprintf(tok_dir, sizeof(tok_dir), "%s/tok", tmpdir);
    if (mkdir(tok_dir, 0700) != 0)
        return -1;
    json_t *vocab = json_object();
    for (int i = 0; i < VOCAB; i++) {
        char t[16];
        snprintf(t, sizeof(t), "t%d", i);
        json_object_set_new(vocab, t, json_integer(i));
    }
    json_t *tok = json_pack("{s:{s:s, s:o, s:[]}, s:[]}", "model", "type", "BPE",
                            "vocab", vocab, "merges", "added_tokens");
    json_t *cfg = json_pack("{s:n, s:s}", "bos_token", "eos_token", "t1000");
    char path[400];
    snprintf(path, sizeof(path), "%s/tokenizer.json", tok_dir);
    int rc = tok == NULL || json_dump_file(tok, path, 0) != 0;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", tok_dir);
    rc |= cfg == NULL || json_dump_file(cfg, path, 0) != 0;
    json_decref(tok);
    json_decref(cfg);
    return rc ? -1 : 0;
}

static int make_models(void **state)
{
    (void)state;
    if (tt_tmpdir_make("tg_test_model_load.", tmpdir, sizeof(tmpdir)) != 0 ||
        write_tokenizer() != 0)
        return -1;
    snprintf(bf16_dir, sizeof(bf16_dir), "%s/bf16", tmpdir);
    snprintf(fp16_dir, sizeof(fp16_dir), "%s/fp16", tmpdir);
    snprintf(fp32_dir, sizeof(fp32_dir), "%s/fp32", tmpdir);
    snprintf(shard_dir, sizeof(shard_dir), "%s/shards", tmpdir);
    /* The ffn is wide enough that a row of down_proj is 1 KiB: the
     * smallest staging reads it in several batches of rows. */
    const char *const a[] = {"--arch", "qwen3", "--hidden", "64", "--layers",
                             "2", "--heads", "8", "--kv-heads", "4",
                             "--head-dim", "16", "--ffn", "512", "--seed", "1",
                             "--tokenizer", tok_dir, NULL};
    const char *const b[] = {"--arch", "qwen2", "--hidden", "64", "--layers",
                             "2", "--heads", "4", "--kv-heads", "2", "--ffn",
                             "128", "--tie", "--dtype", "fp16", "--seed", "2",
                             "--tokenizer", tok_dir, NULL};
    const char *const c[] = {"--arch", "llama", "--hidden", "64", "--layers",
                             "2", "--heads", "4", "--kv-heads", "2", "--ffn",
                             "128", "--dtype", "fp32", "--seed", "3",
                             "--tokenizer", tok_dir, NULL};
    if (tt_make_model(bf16_dir, a) != 0 || tt_make_model(fp16_dir, b) != 0 ||
        tt_make_model(fp32_dir, c) != 0) {
        fprintf(stderr, "test_model_load: tangram-make-model failed\n");
        return -1;
    }
    if (mkdir(shard_dir, 0700) != 0 || reshard(fp32_dir, shard_dir, 3, 1, NULL) != 0) {
        fprintf(stderr, "test_model_load: cannot write the shards: %s\n", errbuf);
        return -1;
    }
    return 0;
}

static int remove_models(void **state)
{
    (void)state;
    tt_tmpdir_remove(tmpdir);
    return 0;
}

/* Every host tensor of m equals its checkpoint tensor read through the
 * mapping (whole-model loads only): fp32 exactly, bf16 matrices (m->wtype)
 * as the checkpoint's values rounded to nearest even (bit for bit what a
 * bf16 checkpoint stores). */
static void check_host_against_mapped(const struct gw_model *m)
{
    struct gw_load_plan plan;
    struct st_model st;
    assert_int_equal(gw_model_load_plan(&plan, m, 0, errbuf, sizeof(errbuf)),
                     0);
    assert_int_equal(st_model_open(&st, m->dir, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(gw_load_plan_bind(&plan, &st, errbuf, sizeof(errbuf)), 0);
    for (int i = 0; i < plan.n; i++) {
        const struct gw_load_tensor *t = &plan.t[i];
        assert_true(t->sel.pick == GW_PICK_ALL ||
                    (t->sel.pick == GW_PICK_RANGE && t->sel.first == 0 &&
                     t->sel.blk == t->rows)); /* one rank's whole head */
        float *want = tt_xmalloc(t->numel * sizeof(float));
        assert_int_equal(st_tensor_read_f32(t->src, 0, st_tensor_rows(t->src),
                                            want, errbuf, sizeof(errbuf)), 0);
        enum tg_wtype wt;
        const void *got = gw_model_weight_any(m, t->kind, t->layer, &wt);
        assert_non_null(got);
        assert_int_equal(wt,
                         gw_wkind_is_matrix(t->kind) ? m->wtype : TG_WTYPE_F32);
        if (wt == TG_WTYPE_BF16) {
            assert_null(gw_model_weight(m, t->kind, t->layer));
            const uint16_t *h = got;
            for (uint64_t e = 0; e < t->numel; e++)
                if (h[e] != st_f32_to_bf16(want[e]))
                    fail_msg("%s[%llu]: host bf16 %#x, checkpoint %g", t->name,
                             (unsigned long long)e, h[e], (double)want[e]);
        } else if (memcmp(got, want, t->numel * sizeof(float)) != 0) {
            fail_msg("%s: host weights differ from the checkpoint", t->name);
        }
        free(want);
    }
    if (m->tied)
        assert_ptr_equal(m->lm_head, m->embed);
    st_model_close(&st);
    gw_load_plan_free(&plan);
}

/* Every checkpoint dtype into every host format: auto keeps a bf16
 * checkpoint's matrices bf16 and makes the others fp32; f32 and bf16 are
 * what they say. */
static void test_host_matches_mapped(void **state)
{
    (void)state;
    const char *dirs[] = {bf16_dir, fp16_dir, fp32_dir, shard_dir};
    const enum gw_weights fmts[] = {GW_WEIGHTS_AUTO, GW_WEIGHTS_F32,
                                    GW_WEIGHTS_BF16};
    for (size_t i = 0; i < TT_COUNT(dirs); i++) {
        for (size_t f = 0; f < TT_COUNT(fmts); f++) {
            struct gw_model m;
            struct gw_shard sh = {.rank = 0, .world = 1, .weights = fmts[f]};
            assert_int_equal(
                gw_model_open(&m, dirs[i], &sh, errbuf, sizeof(errbuf)), 0);
            assert_null(m.slab);
            assert_null(m.layers[0].wq);
            assert_int_equal(gw_model_load_weights(&m, GW_LOAD_STAGING_MIN,
                                                   errbuf, sizeof(errbuf)),
                             0);
            enum tg_wtype want = fmts[f] == GW_WEIGHTS_BF16 ||
                                         (fmts[f] == GW_WEIGHTS_AUTO && i == 0)
                                     ? TG_WTYPE_BF16
                                     : TG_WTYPE_F32;
            assert_int_equal(m.wtype, want);
            check_host_against_mapped(&m);
            /* The staging stayed what was asked; every tensor byte was
             * read once (bf16 / fp16: 2 bytes per element, fp32: 4). */
            assert_int_equal(m.load.staging, GW_LOAD_STAGING_MIN);
            uint64_t es = i < 2 ? 2 : 4; /* bf16, fp16; fp32 (biases too) */
            assert_int_equal(m.load.elems, m.slab_elems);
            assert_int_equal(m.load.bytes, (uint64_t)m.slab_elems * es);
            assert_int_equal(m.load.n_files, i == 3 ? 3 : 1);
            /* bf16 matrices, the bulk of the weights, take 2 bytes each. */
            if (want == TG_WTYPE_BF16)
                assert_true(m.slab_bytes < m.slab_elems * 3);
            else
                assert_true(m.slab_bytes >= m.slab_elems * 4);
            gw_model_free(&m);
        }
    }
    enum gw_weights w;
    assert_int_equal(gw_weights_parse("bf16", &w), 0);
    assert_int_equal(w, GW_WEIGHTS_BF16);
    assert_int_equal(gw_weights_parse("auto", &w), 0);
    assert_int_equal(w, GW_WEIGHTS_AUTO);
    assert_int_equal(gw_weights_parse("f32", &w), 0);
    assert_int_equal(w, GW_WEIGHTS_F32);
    assert_int_equal(gw_weights_parse("fp8", &w), TG_EINVAL);
}

/* The sharded copy holds the single file's weights plus the biases. */
static void test_sharded_equals_single(void **state)
{
    (void)state;
    struct gw_model a, b;
    assert_int_equal(gw_model_load(&a, fp32_dir, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(gw_model_load(&b, shard_dir, errbuf, sizeof(errbuf)), 0);
    assert_null(a.layers[0].bq);
    assert_non_null(b.layers[0].bq);
    assert_non_null(b.layers[1].bo);
    size_t H = (size_t)a.hidden, QD = (size_t)a.n_q_heads * a.head_dim;
    size_t KD = (size_t)a.n_kv_heads * a.head_dim, F = (size_t)a.ffn;
    assert_memory_equal(a.embed, b.embed, (size_t)a.vocab * H * 4);
    assert_memory_equal(a.lm_head, b.lm_head, (size_t)a.vocab * H * 4);
    for (int l = 0; l < a.n_layers; l++) {
        const struct gw_layer *x = &a.layers[l], *y = &b.layers[l];
        assert_memory_equal(x->attn_norm, y->attn_norm, H * 4);
        assert_memory_equal(x->wq, y->wq, QD * H * 4);
        assert_memory_equal(x->wk, y->wk, KD * H * 4);
        assert_memory_equal(x->wv, y->wv, KD * H * 4);
        assert_memory_equal(x->wo, y->wo, H * QD * 4);
        assert_memory_equal(x->ffn_norm, y->ffn_norm, H * 4);
        assert_memory_equal(x->w_gate, y->w_gate, F * H * 4);
        assert_memory_equal(x->w_up, y->w_up, F * H * 4);
        assert_memory_equal(x->w_down, y->w_down, H * F * 4);
    }
    assert_memory_equal(a.final_norm, b.final_norm, (size_t)a.hidden * 4);
    gw_model_free(&a);
    gw_model_free(&b);
}

/* Streams rank `rank` of `world` of dir (heads permuted per layer when
 * world > 1) into a checksum slab and compares with the plain-read
 * reference; bounce buffers of `bounce` bytes. */
static void slab_case(const char *dir, int world, int rank, size_t bounce,
                      int from_host)
{
    struct gw_model shape;
    assert_int_equal(gw_model_open(&shape, dir, NULL, errbuf, sizeof(errbuf)), 0);
    int L = shape.n_layers, H = shape.n_kv_heads, Hl = H / world;
    gw_model_free(&shape);
    /* Rank r holds heads r, r + T, ...: in that order in even layers
     * (blocks apart in the file, or the identity when T = 1), backwards
     * in odd ones. */
    int *map = tt_xmalloc((size_t)L * (size_t)Hl * sizeof(int));
    for (int l = 0; l < L; l++)
        for (int i = 0; i < Hl; i++)
            map[l * Hl + i] = rank + (l % 2 == 0 ? i : Hl - 1 - i) * world;
    /* Host weights handed to a sink are fp32 (gw_model_run_host). */
    struct gw_shard sh = {.rank = rank,
                          .world = world,
                          .kv_heads = map,
                          .weights = GW_WEIGHTS_F32};
    struct gw_model m;
    if (from_host)
        assert_int_equal(gw_model_load_shard(&m, dir, &sh, errbuf, sizeof(errbuf)), 0);
    else
        assert_int_equal(gw_model_open(&m, dir, &sh, errbuf, sizeof(errbuf)), 0);
    struct gw_wslab slab;
    struct gw_load_plan plan;
    struct st_model st;
    assert_int_equal(gw_wslab_init(&slab, &m, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(gw_model_load_plan(&plan, &m, gw_wslab_tied_head(&m),
                                        errbuf, sizeof(errbuf)),
                     0);
    assert_int_equal(st_model_open(&st, dir, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(gw_load_plan_bind(&plan, &st, errbuf, sizeof(errbuf)), 0);
    struct tt_wsum got, want;
    assert_int_equal(tt_wsum_init(&got, &slab, &plan), 0);
    assert_int_equal(tt_wsum_init(&want, &slab, &plan), 0);
    void *b0 = tt_xmalloc(bounce), *b1 = tt_xmalloc(bounce);
    struct gw_wslab_upload up = {.slab = &slab,
                                 .out = {tt_wsum_copy, NULL, &got},
                                 .bounce = {b0, b1},
                                 .bounce_bytes = bounce};
    struct gw_load_sink sink = {.upload = gw_wslab_upload, .ctx = &up};
    struct gw_load_stats stats;
    int rc = from_host
                 ? gw_model_run_host(&plan, &m, GW_LOAD_STAGING_MIN, &sink,
                                     &stats, errbuf, sizeof(errbuf))
                 : gw_load_run(&plan, &st, GW_LOAD_STAGING_MIN, &sink, &stats,
                               errbuf, sizeof(errbuf));
    if (rc != 0)
        fail_msg("%s rank %d/%d: %s", dir, rank, world, errbuf);
    assert_int_equal(gw_wslab_upload_finish(&up, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(tt_wsum_reference(&want, &st), 0);
    if (tt_wsum_diff(&got, &want) != 0)
        fail_msg("%s rank %d/%d%s: the slab differs from the checkpoint", dir,
                 rank, world, from_host ? " (from host weights)" : "");
    assert_int_equal(got.bytes, want.bytes);
    assert_int_equal(up.copied, got.bytes);
    assert_int_equal(stats.n_tensors, plan.n);
    /* What the plan says about this rank. */
    int has_bo = 0, has_head = 0;
    for (int i = 0; i < plan.n; i++) {
        has_bo |= plan.t[i].kind == GW_W_BO;
        has_head |= plan.t[i].kind == GW_W_LM_HEAD;
    }
    assert_int_equal(has_bo, m.cfg.o_bias && rank == 0);
    assert_int_equal(has_head, !(m.tied && world == 1));
    free(b0);
    free(b1);
    tt_wsum_free(&got);
    tt_wsum_free(&want);
    st_model_close(&st);
    gw_load_plan_free(&plan);
    gw_wslab_free(&slab);
    gw_model_free(&m);
    free(map);
}

static void test_slab_matches_reference(void **state)
{
    (void)state;
    slab_case(bf16_dir, 1, 0, 4096, 0);
    slab_case(bf16_dir, 2, 1, 4096, 0);
    slab_case(bf16_dir, 2, 0, (size_t)1 << 20, 0);
    slab_case(fp16_dir, 1, 0, 4096, 0); /* tied: the head is the embedding */
    slab_case(fp16_dir, 2, 0, 4096, 0); /* tied, T > 1: rows of the embedding */
    slab_case(fp16_dir, 2, 1, 4096, 0);
    slab_case(shard_dir, 2, 0, 4096, 0); /* fp32, sharded, o_proj bias */
    slab_case(shard_dir, 2, 1, 4096, 0);
}

/* A model whose weights are already on the host feeds the slab the same
 * bytes as the checkpoint (bf16 widened to fp32 rounds back exactly). */
static void test_slab_from_host(void **state)
{
    (void)state;
    slab_case(bf16_dir, 1, 0, 4096, 1);
    slab_case(bf16_dir, 2, 1, 4096, 1);
    slab_case(fp16_dir, 2, 1, 65536, 1);
}

static void test_slab_layout(void **state)
{
    (void)state;
    struct gw_model m;
    assert_int_equal(gw_model_open(&m, bf16_dir, NULL, errbuf, sizeof(errbuf)), 0);
    struct gw_wslab s;
    assert_int_equal(gw_wslab_init(&s, &m, errbuf, sizeof(errbuf)), 0);
    int e;
    uint64_t gate = gw_wslab_offset(&s, GW_W_GATE, 1, &e);
    uint64_t up = gw_wslab_offset(&s, GW_W_UP, 1, &e);
    assert_int_equal(e, 2);
    assert_int_equal(up - gate, (uint64_t)m.ffn * (uint64_t)m.hidden * 2);
    assert_int_equal(gate % 256, 0);
    assert_int_equal(gw_wslab_offset(&s, GW_W_BQ, 0, &e), GW_WSLAB_NONE);
    assert_int_equal(gw_wslab_offset(&s, GW_W_WQ, 2, &e), GW_WSLAB_NONE);
    assert_int_not_equal(gw_wslab_offset(&s, GW_W_Q_NORM, 0, &e), GW_WSLAB_NONE);
    assert_int_not_equal(gw_wslab_offset(&s, GW_WSLAB_INV_FREQ, 0, &e),
                         GW_WSLAB_NONE);
    assert_int_equal(e, 4);
    assert_int_equal(s.lm_rows, m.vocab);
    assert_true(s.glob[GW_W_LM_HEAD] != s.glob[GW_W_EMBED]); /* untied */
    assert_true(s.bytes >= s.glob[GW_WSLAB_INV_FREQ] + (uint64_t)m.head_dim / 2 * 4);
    gw_wslab_free(&s);
    gw_model_free(&m);
}

static void test_errors(void **state)
{
    (void)state;
    char dir[300], path[400];
    struct gw_model m;
    /* A tensor the index does not list. */
    snprintf(dir, sizeof(dir), "%s/missing", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(reshard(bf16_dir, dir, 2, 0,
                             "model.layers.1.mlp.up_proj.weight"), 0);
    assert_int_equal(gw_model_load(&m, dir, errbuf, sizeof(errbuf)), TG_EFORMAT);
    assert_non_null(strstr(errbuf, "missing tensor model.layers.1.mlp.up_proj.weight"));
    assert_null(m.slab);
    /* A file cut short after the checkpoint was opened and checked. */
    snprintf(dir, sizeof(dir), "%s/cut", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(reshard(bf16_dir, dir, 1, 0, NULL), 0);
    assert_int_equal(gw_model_open(&m, dir, NULL, errbuf, sizeof(errbuf)), 0);
    struct gw_load_plan plan;
    struct st_model st;
    assert_int_equal(gw_model_load_plan(&plan, &m, 0, errbuf, sizeof(errbuf)),
                     0);
    assert_int_equal(st_model_open(&st, dir, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(gw_load_plan_bind(&plan, &st, errbuf, sizeof(errbuf)), 0);
    snprintf(path, sizeof(path), "%s/model-00001-of-00001.safetensors", dir);
    assert_int_equal(truncate(path, 4096), 0);
    struct tt_wsum sum;
    struct gw_wslab slab;
    assert_int_equal(gw_wslab_init(&slab, &m, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(tt_wsum_init(&sum, &slab, &plan), 0);
    char b0[4096], b1[4096];
    struct gw_wslab_upload up = {.slab = &slab,
                                 .out = {tt_wsum_copy, NULL, &sum},
                                 .bounce = {b0, b1}, .bounce_bytes = 4096};
    struct gw_load_sink sink = {.upload = gw_wslab_upload, .ctx = &up};
    assert_int_equal(gw_load_run(&plan, &st, 0, &sink, NULL, errbuf, sizeof(errbuf)),
                     TG_EIO);
    assert_non_null(strstr(errbuf, path));
    tt_wsum_free(&sum);
    gw_wslab_free(&slab);
    st_model_close(&st);
    gw_load_plan_free(&plan);
    /* The CPU backend computes with host weights: a shape alone is refused. */
    struct gw_backend *b = NULL;
    struct gw_backend_cfg bc = {.model = &m, .max_slots = 1, .max_tokens = 1};
    assert_int_equal(gw_backend_new(GW_BACKEND_CPU, &bc, &b, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_null(b);
    assert_non_null(strstr(errbuf, "host weights"));
    gw_model_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_matches_mapped),
        cmocka_unit_test(test_sharded_equals_single),
        cmocka_unit_test(test_slab_layout),
        cmocka_unit_test(test_slab_matches_reference),
        cmocka_unit_test(test_slab_from_host),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, make_models, remove_models);
}
