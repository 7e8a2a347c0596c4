/* test_profile_trig.c — the optional "trig" statistics of a profile
 * (DESIGN.md §4.9, common/profile/pf_trig.h): round trip through the file, shape
 * and value checks with the field named, absence, and the rank copy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/profile/pf_profile.h"
#include "common/profile/pf_split.h"
#include "common/profile/pf_trig.h"
#include "common/base/tg_err.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define L 2
#define H 2
#define D 8
#define HQ 4

/* A valid profile document of L layers, H heads, d = D, with or without
 * trig statistics of HQ query heads (values from the indices). */
static json_t *doc_with(int with_trig)
{
    json_t *layers = json_array();
    for (int l = 0; l < L; l++)
        json_array_append_new(
            layers, json_pack("{s:[f,f],s:[f,f],s:[f,f],s:[[i],[i]]}", "mean",
                              0.5, 0.25, "std", 0.0, 0.0, "budget", 0.5, 0.25,
                              "groups", 1, 0));
    json_t *doc = json_pack(
        "{s:s,s:i,s:{s:s,s:i,s:i,s:i},s:s,s:f,s:f,s:i,s:i,s:o}", "format",
        "tangram-profile", "version", 1, "model", "architecture", "X",
        "num_layers", L, "num_kv_heads", H, "head_dim", D, "method", "snapkv",
        "target_ratio", 0.25, "alpha", 2.0, "samples", 3, "heads_per_group", 1,
        "layers", layers);
    if (!with_trig)
        return doc;
    json_t *tl = json_array();
    for (int l = 0; l < L; l++) {
        json_t *lo = json_object();
        const char *names[3] = {"re", "im", "abs"};
        for (int k = 0; k < 3; k++) {
            json_t *m = json_array();
            for (int q = 0; q < HQ; q++) {
                json_t *row = json_array();
                for (int f = 0; f < D / 2; f++)
                    json_array_append_new(
                        row, json_real((k == 2 ? 1.0 : -0.5) +
                                       0.125 * (l * 100 + q * 10 + f)));
                json_array_append_new(m, row);
            }
            json_object_set_new(lo, names[k], m);
        }
        json_array_append_new(tl, lo);
    }
    json_object_set_new(doc, "trig", json_pack("{s:o}", "layers", tl));
    return doc;
}

static json_t *trig_at(json_t *doc, int l, const char *name, int q)
{
    json_t *t = json_object_get(doc, "trig");
    json_t *lo = json_array_get(json_object_get(t, "layers"), (size_t)l);
    return q < 0 ? json_object_get(lo, name)
                 : json_array_get(json_object_get(lo, name), (size_t)q);
}

static void roundtrip(void **state)
{
    (void)state;
    char err[256], path[] = "/tmp/test_profile_trig_XXXXXX";
    json_t *doc = doc_with(1);
    struct pf_profile p;
    assert_int_equal(pf_profile_from_json(&p, doc, err, sizeof(err)), 0);
    assert_int_equal(p.trig.num_q_heads, HQ);
    assert_int_equal(p.trig.half, D / 2);
    /* Value of layer 1, query head 3, pair 2 of abs. */
    size_t at = ((size_t)1 * HQ + 3) * (D / 2) + 2;
    assert_true(p.trig.abs[at] == (float)(1.0 + 0.125 * 132));
    assert_true(p.trig.re[at] == (float)(-0.5 + 0.125 * 132));
    assert_true(fabs(p.budget_mean[0] - 0.375) < 1e-15);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(pf_profile_save(&p, path, err, sizeof(err)), 0);
    struct pf_profile back;
    assert_int_equal(pf_profile_load(&back, path, err, sizeof(err)), 0);
    unlink(path);
    assert_int_equal(back.trig.num_q_heads, HQ);
    size_t n = (size_t)L * HQ * (D / 2);
    assert_memory_equal(back.trig.re, p.trig.re, n * sizeof(float));
    assert_memory_equal(back.trig.im, p.trig.im, n * sizeof(float));
    assert_memory_equal(back.trig.abs, p.trig.abs, n * sizeof(float));
    pf_profile_free(&back);
    pf_profile_free(&p);
    json_decref(doc);
}

static void absent(void **state)
{
    (void)state;
    char err[256];
    json_t *doc = doc_with(0);
    struct pf_profile p;
    assert_int_equal(pf_profile_from_json(&p, doc, err, sizeof(err)), 0);
    assert_int_equal(p.trig.num_q_heads, 0);
    assert_null(p.trig.re);
    json_t *out;
    assert_int_equal(pf_profile_to_json(&p, &out, err, sizeof(err)), 0);
    assert_null(json_object_get(out, "trig"));
    json_decref(out);
    pf_profile_free(&p);
    json_decref(doc);
}

/* Loads doc, expects rc and an error mentioning `needle`. */
static void expect_bad(json_t *doc, int rc, const char *needle)
{
    char err[256] = "";
    struct pf_profile p;
    int got = pf_profile_from_json(&p, doc, err, sizeof(err));
    if (got != rc || strstr(err, needle) == NULL)
        fail_msg("want %d with \"%s\", got %d: %s", rc, needle, got, err);
    assert_null(p.trig.re);
    json_decref(doc);
}

static void bad_shapes(void **state)
{
    (void)state;
    json_t *d = doc_with(1);
    /* 3 query heads over 2 KV heads. */
    json_array_remove(trig_at(d, 0, "re", -1), 0);
    expect_bad(d, TG_EFORMAT, "not a positive multiple");
    d = doc_with(1);
    json_array_remove(trig_at(d, 1, "im", -1), 0);
    expect_bad(d, TG_EFORMAT, "trig.layers[1].im: expected 4 query heads");
    d = doc_with(1);
    json_array_remove(trig_at(d, 1, "abs", 2), 0);
    expect_bad(d, TG_EFORMAT, "trig.layers[1].abs[2]: expected 4 elements");
    d = doc_with(1);
    json_array_remove(json_object_get(json_object_get(d, "trig"), "layers"), 1);
    expect_bad(d, TG_EFORMAT, "trig.layers");
    d = doc_with(1);
    json_object_del(json_array_get(json_object_get(json_object_get(d, "trig"),
                                                   "layers"), 0), "abs");
    expect_bad(d, TG_ENOTFOUND, "abs");
    d = doc_with(1);
    json_object_set_new(d, "trig", json_string("x"));
    expect_bad(d, TG_EFORMAT, "trig: expected an object");
    d = doc_with(1);
    json_array_set_new(trig_at(d, 0, "re", 1), 0, json_string("1"));
    expect_bad(d, TG_EFORMAT, "trig.layers[0].re[1][0]: expected a number");
}

static void bad_values(void **state)
{
    (void)state;
    json_t *d = doc_with(1);
    json_array_set_new(trig_at(d, 1, "abs", 3), 2, json_real(-0.25));
    expect_bad(d, TG_ERANGE, "trig.layers[1].abs[3][2]");
    /* Negative means are fine. */
    d = doc_with(1);
    json_array_set_new(trig_at(d, 1, "re", 3), 2, json_real(-7.0));
    char err[256];
    struct pf_profile p;
    assert_int_equal(pf_profile_from_json(&p, d, err, sizeof(err)), 0);
    pf_profile_free(&p);
    json_decref(d);
    /* A non-finite value set in memory fails validation, naming it. */
    d = doc_with(1);
    assert_int_equal(pf_profile_from_json(&p, d, err, sizeof(err)), 0);
    p.trig.im[((size_t)0 * HQ + 1) * (D / 2) + 3] = NAN;
    assert_int_equal(pf_profile_validate(&p, err, sizeof(err)), TG_ERANGE);
    assert_non_null(strstr(err, "trig.layers[0].im[1][3]"));
    pf_profile_free(&p);
    json_decref(d);
}

static void rank_copy(void **state)
{
    (void)state;
    char err[256];
    json_t *doc = doc_with(1);
    struct pf_profile p;
    assert_int_equal(pf_profile_from_json(&p, doc, err, sizeof(err)), 0);
    /* Heads swapped: the rank's head 0 is model head 1 (its query heads
     * 2 and 3). */
    int gh[L * H] = {1, 0, 1, 0};
    struct pf_trig r;
    assert_int_equal(pf_trig_rank(&r, &p.trig, L, H, H, gh, err, sizeof(err)),
                     0);
    assert_int_equal(r.num_q_heads, HQ);
    for (int l = 0; l < L; l++)
        for (int q = 0; q < HQ; q++) {
            int src = (q < 2 ? q + 2 : q - 2);
            assert_memory_equal(r.re + ((size_t)l * HQ + q) * (D / 2),
                                p.trig.re + ((size_t)l * HQ + src) * (D / 2),
                                (D / 2) * sizeof(float));
        }
    pf_trig_free(&r);
    /* A rank of one head keeps its two query heads. */
    int one[L] = {1, 1};
    assert_int_equal(pf_trig_rank(&r, &p.trig, L, H, 1, one, err, sizeof(err)),
                     0);
    assert_int_equal(r.num_q_heads, 2);
    assert_memory_equal(r.abs, p.trig.abs + 2 * (D / 2), (D / 2) * sizeof(float));
    pf_trig_free(&r);
    pf_trig_free(&r); /* safe twice */
    pf_profile_free(&p);
    json_decref(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(roundtrip),  cmocka_unit_test(absent),
        cmocka_unit_test(bad_shapes), cmocka_unit_test(bad_values),
        cmocka_unit_test(rank_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
