/*
 * fuzz_worker.c — what a worker takes from the network (with tcp://
 * endpoints the router's messages cross hosts): WorkerMessage envelopes
 * of proto/worker.proto unpacked, checked and dispatched as the worker's
 * link does (gpu_worker/serve/gw_wlink.c), BatchPlans decoded into struct
 * gw_plan (gw_wlink_decode_plan) and run by gw_worker_step on a tiny
 * Qwen3-shaped model with a compressing profile (CPU backend), whose
 * validation must turn every bad plan into an error result that changes
 * nothing; the result is encoded and packed as the link sends it
 * (gw_wlink_encode_result). CommSetup goes to gw_worker_comm_join (the
 * worker has joined already, so it is refused), Shutdown ends the
 * sequence.
 *
 * Input layout: up to 4 messages, each a little-endian u16 length and
 * that many bytes of WorkerMessage (a short last one takes what is
 * left). One worker serves every input (building one loads the model and
 * its tokenizer, far too slow per input); between inputs it is brought
 * back to its state after start so that no input depends on the ones
 * before: a plan of the harness frees every active slot, and the step
 * counter (w->last_step) is rewound to 0, the one field the harness
 * writes. The model and profile are made once in a scratch directory by
 * tangram-make-model ($TANGRAM_BIN, default the build tree's bin/).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "gpu_worker/serve/gw_wlink.h"
#include "gpu_worker/serve/gw_worker.h"
#include "tests/fuzz/fz_util.h"
#include "tests/support/tt_support.h"

static char dir[256], model_dir[320], profile_path[320];
static struct gw_worker_opts opts;

static void setup(void)
{
    fz_env_defaults();
    fz_scratch_dir("fuzz_worker.", dir, sizeof(dir));
    snprintf(model_dir, sizeof(model_dir), "%s/m", dir);
    const char *const args[] = {"--arch", "qwen3", "--hidden", "32",
        "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim",
        "8", "--ffn", "64", "--seed", "5", NULL};
    if (tt_make_model(model_dir, args) != 0)
        fz_fail("tangram-make-model failed (is it built? cmake --build "
                "... --target fuzz)");
    /* Budgets below 1 and one head per group: ragged rows. */
    const double b[4] = {0.5, 1.0, 0.25, 0.75};
    snprintf(profile_path, sizeof(profile_path), "%s/profile.json", dir);
    if (tt_write_profile(profile_path, "Qwen3ForCausalLM", 2, 2, 8, 1, b,
                         NULL, 0.6) != 0)
        fz_fail("cannot write the profile");
    opts = (struct gw_worker_opts){
        .model_dir = model_dir, .profile_path = profile_path,
        .heads_per_group = 1, .page_size = 4, .prefill_chunk = 8,
        .kv_pages = 64, .max_slots = 4, .rank = 0, .world_size = 1,
        .n_threads = 1};
}

static void worker_open(struct gw_worker *w)
{
    char err[512];
    if (gw_worker_init(w, &opts, err, sizeof(err)) != 0)
        fz_fail("gw_worker_init: %s", err);
    struct gw_hello_info h;
    gw_worker_hello(w, &h);
    struct gw_comm_setup cs = {.version = GW_PROTOCOL_VERSION,
                               .world_size = 1, .kind = "shm",
                               .id = h.comm_id, .id_len = h.comm_id_len};
    if (gw_worker_comm_join(w, &cs, err, sizeof(err)) != 0)
        fz_fail("gw_worker_comm_join: %s", err);
}

/* Runs one plan as the link does; returns 0 to go on. */
static void run_plan(struct gw_wlink *l, struct gw_worker *w,
                     const GwBatchPlan *bp)
{
    struct gw_plan gp;
    struct gw_result gr;
    if (gw_wlink_decode_plan(l, bp, &gp) != 0)
        fz_fail("gw_wlink_decode_plan: out of memory");
    uint64_t before = w->last_step;
    int rc = gw_worker_step(w, &gp, &gr);
    /* FZ_VERBOSE=1 shows what each plan of a seed does. */
    if (getenv("FZ_VERBOSE"))
        fprintf(stderr, "step %llu: %s %s (%zu tokens)\n",
                (unsigned long long)bp->step_id, rc == 0 ? "ran" : "refused",
                gr.error ? gr.error : "", gr.n_tokens);
    if (rc != 0 && gr.ok)
        fz_fail("a failed step reported ok");
    if (rc != 0 && gr.error[0] == '\0')
        fz_fail("a failed step without an error text");
    if (rc == 0 && w->last_step != bp->step_id)
        fz_fail("a step ran but the last step id is %llu, not %llu",
                (unsigned long long)w->last_step,
                (unsigned long long)bp->step_id);
    if (rc != 0 && w->last_step != before && w->last_step != bp->step_id)
        fz_fail("a refused plan moved the step id");
    for (size_t i = 0; i < gr.n_tokens; i++)
        if (gr.tokens[i].token < 0 ||
            gr.tokens[i].token >= w->model.cfg.vocab_size)
            fz_fail("sampled token %d outside the vocabulary",
                    (int)gr.tokens[i].token);
    Tangram__Worker__V1__StepResult res;
    if (gw_wlink_encode_result(l, &gr, &res) != 0)
        fz_fail("gw_wlink_encode_result: out of memory");
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = GW_PROTOCOL_VERSION;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT;
    m.result = &res;
    size_t sz = tangram__worker__v1__worker_message__get_packed_size(&m);
    uint8_t *buf = malloc(sz + 1);
    if (!buf)
        fz_fail("out of memory");
    if (tangram__worker__v1__worker_message__pack(&m, buf) != sz)
        fz_fail("packed size");
    free(buf);
}

/* One message as gw_wlink's dispatch takes it; returns 1 at Shutdown or
 * at a message that ends the worker's loop. */
static int handle(struct gw_wlink *l, struct gw_worker *w,
                  const uint8_t *p, size_t n)
{
    GwWorkerMessage *m = tangram__worker__v1__worker_message__unpack(NULL, n, p);
    if (!m)
        return 1; /* GW_WLINK_EXIT_PROTOCOL */
    int stop = 0;
    const GwBatchPlan *plan =
        m->body_case == TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN
            ? m->plan
            : NULL;
    uint32_t version = m->version;
    if (version == 0 && plan)
        version = plan->version;
    if (version != GW_PROTOCOL_VERSION) {
        stop = plan == NULL;
    } else if (plan) {
        run_plan(l, w, plan);
    } else if (m->body_case ==
               TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_SETUP) {
        char why[512];
        const Tangram__Worker__V1__CommSetup *s = m->comm_setup;
        struct gw_comm_setup cs = {
            .version = s->version, .world_size = s->world_size,
            .kind = s->comm_kind ? s->comm_kind : "",
            .id = s->comm_id.data, .id_len = s->comm_id.len};
        if (gw_worker_comm_join(w, &cs, why, sizeof(why)) == 0)
            fz_fail("a second CommSetup was accepted");
    } else if (m->body_case ==
               TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN) {
        stop = 1;
    }
    tangram__worker__v1__worker_message__free_unpacked(m, NULL);
    return stop;
}

/* Frees every active slot with a plan of step 1 and rewinds the step
 * counter: the worker is as after start. */
static void worker_reset(struct gw_worker *w)
{
    uint32_t frees[64];
    size_t n = 0;
    for (int i = 0; i < w->max_slots && n < 64; i++)
        if (w->step.slots[i].active)
            frees[n++] = (uint32_t)i;
    w->last_step = 0;
    if (n > 0) {
        struct gw_plan p = {.version = GW_PROTOCOL_VERSION, .step_id = 1,
                            .frees = frees, .n_frees = n};
        struct gw_result r;
        if (gw_worker_step(w, &p, &r) != 0)
            fz_fail("the reset plan failed: %s", r.error);
    }
    w->last_step = 0;
    for (int i = 0; i < w->max_slots; i++)
        if (w->step.slots[i].active)
            fz_fail("slot %d still active after the reset", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct gw_worker w;
    static struct gw_wlink l; /* the codec only: no socket */
    static int ready;
    if (!ready) {
        setup();
        worker_open(&w);
        ready = 1;
    }
    size_t off = 0;
    for (int k = 0; k < 4 && off + 2 <= size; k++) {
        size_t n = (size_t)data[off] | (size_t)data[off + 1] << 8;
        off += 2;
        if (n > size - off)
            n = size - off;
        if (handle(&l, &w, data + off, n))
            break;
        off += n;
    }
    worker_reset(&w);
    return 0;
}
