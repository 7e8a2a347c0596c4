/*
 * fuzz_profile.c — the calibrated profile (common/profile/pf_profile.c) on
 * untrusted JSON: the document is parsed as pf_profile_load parses a file
 * (tg_json_load_buf, duplicate keys refused) and checked by
 * pf_profile_from_json. A profile that loads must be usable by everything
 * built from it at start-up: its own validation, the split map
 * (pf_split_map) for a few CTA counts, the tensor-parallel layouts
 * (kv_layout_for_rank for every rank of each rank count that divides the
 * groups), the prompt reservation (kv_prompt_pages_compute), and a round trip
 * through pf_profile_to_json that loads again.
 */
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_prompt.h"
#include "common/profile/pf_profile.h"
#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"
#include "common/json/tg_json.h"
#include "tests/fuzz/fz_util.h"

static void layouts(const struct pf_profile *p)
{
    char err[512];
    for (int ranks = 1; ranks <= 8; ranks *= 2) {
        if (p->num_groups % ranks != 0)
            continue;
        for (int r = 0; r < ranks; r++) {
            struct kv_layout lay;
            struct pf_profile rp;
            size_t nh = (size_t)p->num_layers * (size_t)p->num_kv_heads /
                        (size_t)ranks;
            int *gh = malloc((nh ? nh : 1) * sizeof(int));
            if (!gh)
                fz_fail("out of memory");
            int rc = kv_layout_for_rank(&lay, &rp, gh, p, ranks, r, 16, 512,
                                        NULL, err, sizeof(err));
            if (rc == 0) {
                for (size_t i = 0; i < nh; i++)
                    if (gh[i] < 0 || gh[i] >= p->num_kv_heads)
                        fz_fail("global head %d out of range", gh[i]);
                kv_layout_free(&lay);
                pf_profile_free(&rp);
            } else if (rc != TG_EINVAL && rc != TG_ENOMEM) {
                fz_fail("kv_layout_for_rank: %d %s", rc, err);
            }
            free(gh);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    json_t *doc = NULL;
    if (tg_json_load_buf((const char *)data, size, &doc, err, sizeof(err)) !=
        0)
        return 0;
    struct pf_profile p;
    memset(&p, 0, sizeof(p));
    int rc = pf_profile_from_json(&p, doc, err, sizeof(err));
    json_decref(doc);
    if (rc != 0) {
        pf_profile_free(&p); /* must be safe on the failed load */
        return 0;
    }
    if (pf_profile_validate(&p, err, sizeof(err)) != 0)
        fz_fail("a loaded profile fails validation: %s", err);
    size_t lg = (size_t)p.num_layers * (size_t)p.num_groups;
    int *splits = malloc((lg ? lg : 1) * sizeof(int));
    if (!splits)
        fz_fail("out of memory");
    static const int ctas[] = {1, 7, 132};
    for (size_t i = 0; i < sizeof(ctas) / sizeof(ctas[0]); i++) {
        if (pf_split_map(&p, ctas[i], splits, err, sizeof(err)) != 0)
            continue;
        for (size_t k = 0; k < lg; k++)
            if (splits[k] < 1)
                fz_fail("split map entry %d < 1", splits[k]);
    }
    free(splits);
    layouts(&p);
    struct kv_prompt_pages pg;
    if (kv_prompt_pages_compute(&pg, &p, 1000, 64, 16, err, sizeof(err)) == 0) {
        if (pg.total_pages < 0 || pg.total_pages > pg.monolithic_pages)
            fz_fail("ragged pages %lld above monolithic %lld",
                    (long long)pg.total_pages,
                    (long long)pg.monolithic_pages);
        kv_prompt_pages_free(&pg);
    }
    json_t *out = NULL;
    if (pf_profile_to_json(&p, &out, err, sizeof(err)) == 0) {
        struct pf_profile q;
        memset(&q, 0, sizeof(q));
        if (pf_profile_from_json(&q, out, err, sizeof(err)) != 0)
            fz_fail("a saved profile does not load: %s", err);
        pf_profile_free(&q);
        json_decref(out);
    }
    pf_profile_free(&p);
    return 0;
}
