/*
 * test_gw_trig.c — decode-time compression pieces (DESIGN.md §4.9): caps
 * per head (non-uniform, floor F, half-away rounding, uniform), the
 * trigonometric score against a direct evaluation (rotate the query to
 * t+o with RoPE and dot it with the stored key), survivor choice (window
 * always, ties to the earlier slot) and order-preserving compaction whose
 * source and destination ranges overlap across pages.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/base/tg_err.h"
#include "gpu_worker/model/gw_trig.h"

static void test_caps(void **state)
{
    (void)state;
    double b[4] = {0.2, 0.6, 1.0, 0.2};
    int32_t cap[4];
    assert_int_equal(gw_trig_caps(b, 4, 100, 32, 0, cap), 0);
    assert_int_equal(cap[0], 40);
    assert_int_equal(cap[1], 120);
    assert_int_equal(cap[2], 200);
    assert_int_equal(cap[3], 40);
    assert_int_equal(gw_trig_caps(b, 4, 50, 32, 0, cap), 0);
    assert_int_equal(cap[0], 36); /* 20 below F = 4 + 32 */
    assert_int_equal(cap[2], 100);
    assert_int_equal(gw_trig_caps(b, 4, 50, 32, 1, cap), 0);
    for (int h = 0; h < 4; h++)
        assert_int_equal(cap[h], 50);
    double half[2] = {0.25, 0.75};
    assert_int_equal(gw_trig_caps(half, 2, 37, 0, 0, cap), 0);
    assert_int_equal(cap[0], 19); /* 18.5 rounds away from zero */
    assert_int_equal(cap[1], 56); /* 55.5 */
    assert_int_equal(gw_trig_caps(b, 4, 35, 32, 0, cap), TG_EINVAL);
    double zero[1] = {0.0};
    assert_int_equal(gw_trig_caps(zero, 1, 100, 32, 0, cap), TG_EINVAL);
}

/* NeoX RoPE of x (d) at position p, in double. */
static void rope(const double *x, double *out, int d, const float *inv, int64_t p)
{
    int h = d / 2;
    for (int f = 0; f < h; f++) {
        double a = (double)inv[f] * (double)p;
        out[f] = x[f] * cos(a) - x[f + h] * sin(a);
        out[f + h] = x[f + h] * cos(a) + x[f] * sin(a);
    }
}

static void test_score_matches_rotated_dot(void **state)
{
    (void)state;
    enum { D = 8, H = D / 2, G = 2 };
    float inv[H] = {1.0f, 0.1f, 0.01f, 0.001f};
    float re[G][H], im[G][H], ab[G][H];
    double x[G][D];
    float k[D] = {0.3f, -1.2f, 0.5f, 2.0f, -0.7f, 0.1f, 1.5f, -0.4f};
    for (int g = 0; g < G; g++)
        for (int j = 0; j < D; j++)
            x[g][j] = sin(1.7 * j + g) * (1.0 + g);
    struct gw_trig_qstat q[G];
    for (int g = 0; g < G; g++) {
        for (int f = 0; f < H; f++) {
            re[g][f] = (float)x[g][f];
            im[g][f] = (float)x[g][f + H];
            ab[g][f] = (float)hypot((float)x[g][f], (float)x[g][f + H]);
            x[g][f] = re[g][f];
            x[g][f + H] = im[g][f];
        }
        q[g] = (struct gw_trig_qstat){re[g], im[g], ab[g]};
    }
    int64_t t = 1000;
    double want = 0.0;
    for (int g = 0; g < G; g++)
        for (int o = 0; o <= 16; o++) {
            double r[D];
            rope(x[g], r, D, inv, t + ((int64_t)1 << o));
            for (int j = 0; j < D; j++)
                want += r[j] * k[j];
        }
    want /= (double)G * 17.0 * sqrt((double)D);
    double got = gw_trig_score(q, G, k, D, inv, t);
    /* abs == |qbar| up to float rounding of the statistics. */
    assert_true(fabs(got - want) < 1e-5 * (1.0 + fabs(want)));
    /* The norm term: abs one above |qbar| adds sum_f |k_f| / sqrt(d). */
    for (int g = 0; g < G; g++)
        for (int f = 0; f < H; f++)
            ab[g][f] += 1.0f;
    double kn = 0.0;
    for (int f = 0; f < H; f++)
        kn += hypot(k[f], k[f + H]);
    double got2 = gw_trig_score(q, G, k, D, inv, t);
    assert_true(fabs(got2 - got - kn / sqrt((double)D)) < 1e-5);
}

static void test_select(void **state)
{
    (void)state;
    double s[7] = {0.5, 0.9, 0.5, 0.1, 0.9, 3.0, -1.0};
    uint8_t keep[7];
    /* window 2 keeps slots 5, 6; then 0.9 at 1 and 4 (ties: earlier). */
    assert_int_equal(gw_trig_select(s, 7, 4, 2, keep), 0);
    uint8_t want[7] = {0, 1, 0, 0, 1, 1, 1};
    assert_memory_equal(keep, want, 7);
    assert_int_equal(gw_trig_select(s, 7, 5, 2, keep), 0);
    uint8_t want5[7] = {1, 1, 0, 0, 1, 1, 1}; /* 0.5 at 0 before 2 */
    assert_memory_equal(keep, want5, 7);
    assert_int_equal(gw_trig_select(s, 7, 1, 2, keep), TG_EINVAL);
    assert_int_equal(gw_trig_select(s, 7, 8, 2, keep), TG_EINVAL);
}

static void test_compact_overlapping(void **state)
{
    (void)state;
    enum { P = 4, D = 2, HP = 2, NPG = 4 };
    float pool[NPG * HP * 2 * P * D];
    /* The row uses pages 3, 0, 2 (scattered) for 12 slots. */
    int32_t pages[3] = {3, 0, 2};
    const int32_t *gp[1] = {pages};
    int32_t hg[2] = {0, 0}, hs[2] = {0, 1}, glen[1] = {12}, hlen[2] = {12, 12};
    struct tg_kv_rows r = {.pool = pool, .heads_per_group = HP,
                           .page_size = P, .head_dim = D, .n_kv_heads = 2,
                           .head_group = hg, .head_slot = hs,
                           .group_pages = gp, .group_len = glen,
                           .head_len = hlen};
    size_t pf = (size_t)HP * 2 * P * D;
    /* K of slot t of head h = (100 h + t, -t), V = (t, 1000 + t). */
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 12; t++) {
            float *kp = pool + (size_t)pages[t / P] * pf +
                        ((size_t)h * 2) * P * D + (size_t)(t % P) * D;
            float *vp = kp + (size_t)P * D;
            kp[0] = 100.0f * h + t;
            kp[1] = -(float)t;
            vp[0] = (float)t;
            vp[1] = 1000.0f + t;
        }
    /* Region: slots 2..11 of head 0; survivors 3, 4, 7, 10, 11 slide to
     * 2..6 — slot 3's destination 2, slot 4's 3 (a survivor's source). */
    uint8_t keep[10] = {0, 1, 1, 0, 0, 1, 0, 0, 1, 1};
    float scratch[2 * 10 * D];
    assert_int_equal(gw_trig_compact_head(&r, 0, 2, 10, keep, scratch), 5);
    int want[7] = {0, 1, 3, 4, 7, 10, 11};
    for (int j = 0; j < 7; j++) {
        float *kp = pool + (size_t)pages[j / P] * pf + (size_t)(j % P) * D;
        float *vp = kp + (size_t)P * D;
        assert_true(kp[0] == (float)want[j] && kp[1] == -(float)want[j]);
        assert_true(vp[0] == (float)want[j] && vp[1] == 1000.0f + want[j]);
    }
    /* Head 1 (same pages, other slot) is untouched. */
    for (int t = 0; t < 12; t++) {
        float *kp = pool + (size_t)pages[t / P] * pf + 2 * P * D +
                    (size_t)(t % P) * D;
        assert_true(kp[0] == 100.0f + t);
    }
    /* A region past the head's length is refused. */
    assert_int_equal(gw_trig_compact_head(&r, 0, 5, 10, keep, scratch),
                     TG_EINVAL);
}

/* The folded score (coefficients once per head) equals the direct one. */
static void test_coef_matches_direct(void **state)
{
    (void)state;
    enum { D = 16, H = D / 2, G = 3 };
    float inv[H], re[G][H], im[G][H], ab[G][H], k[D];
    for (int f = 0; f < H; f++)
        inv[f] = powf(10000.0f, -(float)(2 * f) / D);
    struct gw_trig_qstat q[G];
    for (int g = 0; g < G; g++) {
        for (int f = 0; f < H; f++) {
            re[g][f] = (float)sin(0.3 * f + g);
            im[g][f] = (float)cos(1.1 * f - g);
            ab[g][f] = (float)hypot(re[g][f], im[g][f]) + 0.25f * g;
        }
        q[g] = (struct gw_trig_qstat){re[g], im[g], ab[g]};
    }
    double coef[3 * H];
    for (int64_t t = 0; t < 70000; t += 6997) {
        gw_trig_coef(q, G, D, inv, t, coef);
        for (int trial = 0; trial < 5; trial++) {
            for (int j = 0; j < D; j++)
                k[j] = (float)sin(0.7 * j * (trial + 1) + (double)t);
            double a = gw_trig_score(q, G, k, D, inv, t);
            double b = gw_trig_score_coef(coef, k, D);
            assert_true(fabs(a - b) <= 1e-12 * (1.0 + fabs(a)));
        }
    }
}

/* A rank's caps from the whole model's mean equal the whole model's. */
static void test_caps_mean(void **state)
{
    (void)state;
    double b[4] = {0.2, 0.6, 0.4, 0.8};
    int32_t whole[4], part[2];
    assert_int_equal(gw_trig_caps(b, 4, 100, 8, 0, whole), 0);
    assert_int_equal(gw_trig_caps_mean(b + 2, 2, 0.5, 100, 8, 0, part), 0);
    assert_int_equal(part[0], whole[2]);
    assert_int_equal(part[1], whole[3]);
    assert_int_equal(gw_trig_caps_mean(b, 2, 0.0, 100, 8, 0, part), TG_EINVAL);
}

/* One layer of a sequence: heads over their caps keep the window plus the
 * best-scored, in order, their slot positions move with them; a head at
 * its cap is untouched. */
static void test_compact_layer(void **state)
{
    (void)state;
    enum { P = 4, D = 4, HP = 2, NPG = 8, HK = 2, G = 1, N = 20 };
    float pool[NPG * HP * 2 * P * D];
    int32_t pages[5] = {6, 1, 4, 0, 3};
    const int32_t *gp[1] = {pages};
    int32_t hg[HK] = {0, 0}, hs[HK] = {0, 1}, glen[1] = {N};
    int32_t hlen[HK] = {N, 14}, dstart[HK] = {5, 5};
    struct tg_kv_rows r = {.pool = pool, .heads_per_group = HP,
                           .page_size = P, .head_dim = D, .n_kv_heads = HK,
                           .head_group = hg, .head_slot = hs,
                           .group_pages = gp, .group_len = glen,
                           .head_len = hlen};
    size_t pf = (size_t)HP * 2 * P * D;
    int32_t slot_pos[HK * N];
    for (int h = 0; h < HK; h++)
        for (int t = 0; t < N; t++) {
            float *kp = pool + (size_t)pages[t / P] * pf +
                        ((size_t)hs[h] * 2) * P * D + (size_t)(t % P) * D;
            for (int j = 0; j < D; j++)
                kp[j] = (float)sin(0.9 * t + 0.37 * j + h);
            kp[(size_t)P * D] = (float)(1000 + t); /* V[0] tags the slot */
            slot_pos[h * N + t] = 500 + t;
        }
    float inv[D / 2] = {1.0f, 0.01f};
    float st_re[HK * G * D / 2] = {0.5f, -0.2f, 0.1f, 0.3f};
    float st_im[HK * G * D / 2] = {0.1f, 0.4f, -0.6f, 0.2f};
    float st_ab[HK * G * D / 2] = {0.9f, 0.5f, 0.7f, 0.4f};
    struct pf_trig stats = {.num_q_heads = HK * G, .half = D / 2,
                            .re = st_re, .im = st_im, .abs = st_ab};
    int32_t cap[HK] = {9, 9}, gcap[1] = {9};
    struct gw_trig_cfg c = {.every = 4, .window = 3, .n_layers = 1,
                            .n_kv_heads = HK, .group = G, .head_dim = D,
                            .n_groups = 1, .cap = cap, .group_cap = gcap,
                            .stats = &stats, .inv_freq = inv};
    /* Expected survivors of head 0: the direct score of every region slot
     * but the window, top 6, ties earlier. */
    struct gw_trig_qstat q0 = {st_re, st_im, st_ab};
    double sc[N];
    int n0 = N - 5;
    for (int i = 0; i < n0; i++) {
        int t = 5 + i;
        float *kp = pool + (size_t)pages[t / P] * pf + (size_t)(t % P) * D;
        sc[i] = gw_trig_score(&q0, 1, kp, D, inv, 777);
    }
    uint8_t want[N];
    assert_int_equal(gw_trig_select(sc, n0, 9, 3, want), 0);
    struct gw_trig_work w = {0};
    assert_int_equal(gw_trig_compact_layer(&c, 0, &r, hlen, dstart, 777,
                                           slot_pos, N, &w), 1);
    assert_int_equal(hlen[0], 5 + 9);
    assert_int_equal(hlen[1], 14); /* region 9 = cap: untouched */
    int m = 0;
    for (int i = 0; i < n0; i++) {
        if (!want[i])
            continue;
        int t = 5 + m++, src = 5 + i;
        float *kp = pool + (size_t)pages[t / P] * pf + (size_t)(t % P) * D;
        assert_true(kp[(size_t)P * D] == (float)(1000 + src));
        assert_int_equal(slot_pos[t], 500 + src);
    }
    assert_int_equal(m, 9);
    for (int t = 0; t < 5; t++)
        assert_int_equal(slot_pos[t], 500 + t); /* the prompt stays */
    for (int t = 0; t < 14; t++)
        assert_int_equal(slot_pos[N + t], 500 + t);
    /* head_len must be the lengths it updates. */
    int32_t other[HK] = {N, 14};
    assert_int_equal(gw_trig_compact_layer(&c, 0, &r, other, dstart, 777,
                                           NULL, 0, &w), TG_EINVAL);
    gw_trig_work_free(&w);
    gw_trig_work_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_score_matches_rotated_dot),
        cmocka_unit_test(test_select),
        cmocka_unit_test(test_compact_overlapping),
        cmocka_unit_test(test_coef_matches_direct),
        cmocka_unit_test(test_caps_mean),
        cmocka_unit_test(test_compact_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
