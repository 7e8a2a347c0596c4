#!/usr/bin/python3
"""tangramd --decode-compress trig (DESIGN.md §4.9) on the CPU backend, end
to end, against tangram-generate with the same trig flags and profile.

The tiny qwen3 model (2 KV heads) with a profile from `tangram-profile
calibrate --trig` (H_p = 1: every head its own group, so a compaction
frees pages per head), small caps (--decode-budget 12 --decode-every 8
--decode-window 4) and 64-token generations (several triggers each):
  * greedy completions of distinct prompts equal tangram-generate's output,
    two over HTTP (text, token count) and two over gRPC (token ids);
  * tangram_kv_pages_released_total grows by exactly the sum of
    tangram-generate's kv.decode_pages_released, which is > 0;
  * a request whose max_tokens would not fit the pool uncompressed (prompt +
    max_tokens beyond what --kv-memory 1MiB holds) is served under trig,
    and while it streams the pages in use (sampled from /metrics) never
    exceed its bound (prompt pages + min(max_tokens, cap + beta) per row);
    the same request without trig is refused (400);
  * afterwards every page in use is a stored multi-turn entry's;
  * multi-turn: turn 2 (turn 1's prompt and answer plus new ids, same
    X-Session-Id) is served and reuses the compacted stored KV
    (cached_tokens = turn 1's fed-back positions);
  * n = 2 with a seed: choice i equals an n = 1 run with seed + i;
  * --tp 2: the same token ids as tangram-generate over gRPC and HTTP, and
    released pages summing to tangram-generate's;
  * a worker SIGKILLed while two long trig generations compact loses only
    them: two queued requests are served after the restart, equal to
    tangram-generate, and every page in use is then a stored entry's;
  * start-up refusals: trig with a profile without statistics, with
    --profile none and no --trig-stats, and a budget below its floor, each
    a failed start naming the fix (the CUDA backend's trig is
    test_daemon_cuda_heads.py's, on a GPU).
Fails, naming it, when a program, grpcio, protobuf or protoc is missing.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()
CHUNK = 64
SEED = 7
MAX_TOKENS = 64
N_PROMPT = 40
BUDGET, EVERY, WINDOW = 12, 8, 4
PAGE = 16
TRIG = ["--decode-compress", "trig", "--decode-budget", str(BUDGET),
        "--decode-every", str(EVERY), "--decode-window", str(WINDOW)]


def prompt_ids(k, n=N_PROMPT):
    return [(i * (37 + 2 * k) + 11 * k + 5) % 3000 + 100 for i in range(n)]


def generate(model, prof, ids, max_tokens=MAX_TOKENS):
    r = subprocess.run(
        [du.prog("tangram-generate"), "--model", model, "--profile", prof,
         "--prompt-ids", json.dumps(ids), "--max-tokens", str(max_tokens),
         "--temperature", "0", "--seed", str(SEED), "--prefill-chunk",
         str(CHUNK), "--json"] + TRIG,
        capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, r.stderr[-500:]
    j = json.loads(r.stdout)
    return j, j["kv"]["decode_pages_released"]


def http_complete(d, ids, session=None, max_tokens=MAX_TOKENS, **extra):
    hdrs = {"X-Session-Id": session} if session else None
    body = {"model": "model", "prompt": ids, "max_tokens": max_tokens,
            "temperature": 0, "seed": SEED}
    body.update(extra)
    st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                         headers=hdrs, timeout=300)
    return st, du.json_of(raw), raw


def load_protos(out_dir):
    return du.load_tangram_pb2(out_dir)


def grpc_generate(grpc, pb, d, ids):
    """Token ids of a greedy Generate, or None with the status."""
    return du.grpc_generate_ids(grpc, pb, d.grpc_target, ids, MAX_TOKENS,
                                SEED, timeout=300)


def metrics(d, T):
    return du.kv_page_metrics(d.base_url, T)


def no_running_pages(d, T, name):
    m = metrics(d, T)
    C.check(du.only_cached_pages(m),
            "%s: after the requests every page in use is a stored entry's "
            "(used == cached per rank)" % name, m)


def row_bounds(prof, max_tokens):
    """Decode tokens each (layer, head) row of H_p = 1 may hold: the §4.9
    rule, min(max_tokens, cap + beta), cap = max(F, round(c b / mean))."""
    with open(prof) as f:
        layers = json.load(f)["layers"]
    out = []
    for layer in layers:
        b = layer["budget"]
        mean = sum(b) / len(b)
        for x in b:
            v = BUDGET * x / mean
            cap = max(4 + WINDOW, int(math.floor(v + 0.5)))
            out.append(min(max_tokens, cap + EVERY))
    return out


def serve_case(grpc, pb, model, prof, work, name, tp, first_k):
    d = du.Daemon(model, work, profile=prof, args=TRIG + [
        "--tp", str(tp), "--heads-per-group", "1",
        "--prefill-chunk", str(CHUNK)])
    if not C.check(d.start(), "%s: tangramd --decode-compress trig ready" %
                   name, d.log_text()[-3000:]):
        d.stop()
        return None
    m0 = metrics(d, tp)
    want = 0
    for k in range(first_k, first_k + 4):
        ids = prompt_ids(k)
        ref, rel = generate(model, prof, ids)
        if not C.check(ref is not None, "%s: tangram-generate prompt %d" %
                       (name, k), rel):
            continue
        want += rel
        if k % 2 == 0:
            st, j, raw = http_complete(d, ids)
            ok = st == 200 and j is not None
            C.check(ok and j["choices"][0]["text"] == ref["text"] and
                    j["usage"]["completion_tokens"] == len(ref["token_ids"]),
                    "%s: HTTP completion %d equals tangram-generate (%d "
                    "triggers)" % (name, k, ref["kv"]["decode_triggers"]),
                    (st, raw[:400], ref["text"]))
        else:
            got, why = grpc_generate(grpc, pb, d, ids)
            C.check(got == ref["token_ids"],
                    "%s: gRPC Generate %d equals tangram-generate token for "
                    "token" % (name, k), (got, why, ref["token_ids"]))
    m1 = metrics(d, tp)
    if C.check(m0 is not None and m1 is not None, "%s: metrics" % name):
        C.check(want > 0, "%s: tangram-generate's compactions gave pages "
                "back" % name, want)
        C.check(m1["released"] - m0["released"] == want,
                "%s: tangram_kv_pages_released_total grew by "
                "tangram-generate's kv.decode_pages_released (%d)" %
                (name, want), (m0, m1))
    no_running_pages(d, tp, name)
    return d


def long_bounded(d, prof, name):
    """A request the pool cannot hold uncompressed, served under the bound
    while /metrics is sampled."""
    m = metrics(d, 1)
    total = m["total"][0] if m else None
    if not C.check(total, "%s: pool size known" % name, m):
        return 0
    rows = len(row_bounds(prof, 1))
    # prompt + max_tokens beyond what the pool holds per row uncompressed
    n_tokens = (int(total) // rows) * PAGE + 64
    ids = prompt_ids(60, 20)
    max_tokens = n_tokens - len(ids)
    bound = sum(math.ceil((len(ids) + b) / PAGE)
                for b in row_bounds(prof, max_tokens))
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            mm = metrics(d, 1)
            if mm and mm["used"][0] is not None:
                running = mm["used"][0] - (mm["cached"][0] or 0)
                peak[0] = max(peak[0], running)
            time.sleep(0.05)
    t = threading.Thread(target=sample)
    t.start()
    st, j, raw = http_complete(d, ids, max_tokens=max_tokens,
                               ignore_eos=True, stream=False)
    done.set()
    t.join()
    C.check(st == 200 and j is not None and
            j["usage"]["completion_tokens"] == max_tokens,
            "%s: %d tokens (more than the pool holds uncompressed, %d pages) "
            "served under trig" % (name, max_tokens, int(total)), raw[:300])
    C.check(0 < peak[0] <= bound,
            "%s: running pages stayed within the bound (peak %d <= %d)" %
            (name, peak[0], bound), peak[0])
    return max_tokens


def multi_turn(d, model, prof, name):
    ids = prompt_ids(40)
    ref, _ = generate(model, prof, ids)
    st, j, raw = http_complete(d, ids, session="conv-1")
    if not C.check(st == 200 and j is not None and ref is not None and
                   j["choices"][0]["text"] == ref["text"],
                   "%s: turn 1 equals tangram-generate" % name, raw[:300]):
        return
    out = ref["token_ids"]
    turn2 = ids + out + [(7 * i + 3) % 3000 + 100 for i in range(20)]
    st, j, raw = http_complete(d, turn2, session="conv-1")
    held = N_PROMPT + len(out) - 1
    ok = st == 200 and j is not None
    C.check(ok and j["usage"]["completion_tokens"] >= 1,
            "%s: turn 2 of a compacted conversation served" % name, raw[:300])
    C.check(ok and (j["usage"].get("prompt_tokens_details") or {})
            .get("cached_tokens") == held,
            "%s: turn 2 reuses the stored compacted KV (%d cached tokens)" %
            (name, held), raw[:300])


def parallel(d, name):
    ids = prompt_ids(50)
    body = {"model": "model", "prompt": ids, "max_tokens": 24,
            "temperature": 1, "seed": 99, "n": 2, "ignore_eos": True}
    st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                         timeout=300)
    j = du.json_of(raw)
    if not C.check(st == 200 and j is not None and len(j["choices"]) == 2,
                   "%s: n = 2 under trig served" % name, raw[:300]):
        return
    got = [c["text"] for c in sorted(j["choices"], key=lambda c: c["index"])]
    want = []
    for i in range(2):
        b = dict(body, n=1, seed=99 + i)
        st, _, raw = du.http("POST", d.base_url + "/v1/completions", b,
                             timeout=300)
        jj = du.json_of(raw)
        want.append(jj["choices"][0]["text"] if st == 200 and jj else None)
    C.check(got == want, "%s: choice i equals n = 1 with seed + i" % name,
            (got, want))


def refusals(model, prof_plain, prof, work):
    cases = (("no-stats", prof_plain, TRIG, "calibrate --trig"),
             ("none", None, TRIG, "--trig-stats"),
             ("budget", prof, ["--decode-compress", "trig", "--decode-budget",
                               "5", "--decode-window", "4"],
              "--decode-budget"))
    for name, p, args, needle in cases:
        sub = os.path.join(work, "refuse-" + name)
        os.makedirs(sub)
        d = du.Daemon(model, sub, profile=p, args=args)
        started = d.start(timeout=30)
        log = d.log_text()
        d.stop()
        C.check(not started and needle in log,
                "refused at start-up (%s), naming %r" % (name, needle),
                log[-800:])


def worker_killed(model, prof, work):
    """SIGKILL of the worker while long trig generations compact: only the
    in-flight requests are lost. Two long requests run (--max-num-seqs 2)
    and trigger compactions every EVERY tokens; two more wait in the queue.
    The kill fails the two running ones; the queued two are admitted by
    the restarted worker and answer exactly what tangram-generate answers;
    afterwards every page in use is a stored entry's."""
    name = "worker killed"
    d = du.Daemon(model, work, profile=prof, args=TRIG + [
        "--heads-per-group", "1", "--prefill-chunk", str(CHUNK),
        "--max-num-seqs", "2"])
    if not C.check(d.start(), "%s: ready" % name, d.log_text()[-3000:]):
        d.stop()
        return
    try:
        res = {}

        def call(key, ids, max_tokens, **extra):
            res[key] = http_complete(d, ids, max_tokens=max_tokens, **extra)
        longs = [threading.Thread(target=call, args=(("long", k),
                                                     prompt_ids(70 + k),
                                                     30000),
                                  kwargs={"ignore_eos": True})
                 for k in range(2)]
        for t in longs:
            t.start()
        ok = du.wait_for(lambda: du.metric(du.fetch_metrics(d.base_url) or {},
                                           "tangram_num_requests_running") == 2,
                         20, 0.05)
        C.check(ok, "%s: two long requests running" % name)
        queued = [threading.Thread(target=call, args=(("queued", k),
                                                       prompt_ids(80 + k),
                                                       MAX_TOKENS))
                  for k in range(2)]
        for t in queued:
            t.start()
        ok = du.wait_for(lambda: du.metric(du.fetch_metrics(d.base_url) or {},
                                           "tangram_num_requests_waiting") == 2,
                         20, 0.05)
        C.check(ok, "%s: two requests queued behind them" % name)
        m0 = metrics(d, 1)
        # Compactions are running: released pages keep growing.
        ok = du.wait_for(lambda: (metrics(d, 1) or {"released": 0})["released"]
                         >= (m0["released"] if m0 else 0) + 8, 30, 0.05)
        C.check(ok, "%s: compactions gave pages back before the kill" % name)
        workers = d.child_pids("worker")
        if not C.check(len(workers) == 1, "%s: one worker" % name, workers):
            return
        os.kill(workers[0], 9)
        for t in longs + queued:
            t.join(300)
        for k in range(2):
            st, j, raw = res.get(("long", k), (None, None, b""))
            C.check(st is not None and st >= 500,
                    "%s: in-flight request %d ended with an error" % (name, k),
                    (st, raw[:300]))
        for k in range(2):
            ref, _ = generate(model, prof, prompt_ids(80 + k))
            st, j, raw = res.get(("queued", k), (None, None, b""))
            C.check(st == 200 and j is not None and ref is not None and
                    j["choices"][0]["text"] == ref["text"],
                    "%s: queued request %d served after the restart, equal "
                    "to tangram-generate" % (name, k), (st, raw[:300]))
        back = du.wait_for(lambda: d.health() == 200, 30, 0.05)
        C.check(back, "%s: /health back to 200" % name)
        no_running_pages(d, 1, name)
    finally:
        d.stop()


def main():
    missing = du.missing_inputs(
        programs=("tangramd", "tangram-router", "tangram-worker",
                  "tangram-make-model", "tangram-profile",
                  "tangram-generate"),
        modules=(("grpc", "python3-grpcio"),
                 ("google.protobuf", "python3-protobuf")),
        tools=("protoc",))
    if missing:
        return du.fail_missing(missing)
    import grpc
    work = du.scratch_dir("tgtrig")
    try:
        pb = load_protos(work)
        if not C.check(pb is not None, "protoc generates tangram_pb2"):
            return C.summary()
        model = du.make_model(os.path.join(work, "model"))
        samples = os.path.join(work, "samples.jsonl")
        with open(samples, "w") as f:
            for k in range(4):
                f.write(json.dumps({"prompt_ids": prompt_ids(100 + k, 90)})
                        + "\n")
        prof = os.path.join(work, "trig.json")
        plain = os.path.join(work, "plain.json")
        for out, extra in ((prof, ["--trig"]), (plain, [])):
            r = subprocess.run(
                [du.prog("tangram-profile"), "calibrate", "--model", model,
                 "--ratio", "0.4", "--samples", samples, "--heads-per-group",
                 "1", "--threads", "1", "-o", out] + extra,
                capture_output=True, text=True, timeout=300)
            if not C.check(r.returncode == 0, "tangram-profile calibrate %s" %
                           " ".join(extra), r.stderr[-500:]):
                return C.summary()
        for name, tp, k in (("tp1", 1, 0), ("tp2", 2, 20)):
            sub = os.path.join(work, name)
            os.makedirs(sub)
            d = serve_case(grpc, pb, model, prof, sub, name, tp, k)
            if d is None:
                continue
            try:
                if tp == 1:
                    multi_turn(d, model, prof, name)
                    parallel(d, name)
                    no_running_pages(d, 1, name + " after turns and n = 2")
                C.check("failed" not in d.log_text(),
                        "%s: no step failed (no malformed head lengths)" %
                        name, d.log_text()[-2000:])
            finally:
                d.stop()
        # The bounded reservation on a pool of 1 MiB.
        sub = os.path.join(work, "small")
        os.makedirs(sub)
        d = du.Daemon(model, sub, profile=prof, args=TRIG + [
            "--heads-per-group", "1", "--kv-memory", "1MiB"])
        if C.check(d.start(), "small pool: ready", d.log_text()[-2000:]):
            try:
                mt = long_bounded(d, prof, "small pool")
                no_running_pages(d, 1, "small pool")
            finally:
                d.stop()
            if mt:
                sub = os.path.join(work, "small-plain")
                os.makedirs(sub)
                d = du.Daemon(model, sub, profile=prof, args=[
                    "--heads-per-group", "1", "--kv-memory", "1MiB"])
                if C.check(d.start(), "small pool without trig: ready"):
                    try:
                        st, j, raw = http_complete(d, prompt_ids(60, 20),
                                                   max_tokens=mt)
                        C.check(st == 400,
                                "without trig the same request is refused "
                                "(400)", raw[:300])
                    finally:
                        d.stop()
        else:
            d.stop()
        sub = os.path.join(work, "killed")
        os.makedirs(sub)
        worker_killed(model, prof, sub)
        refusals(model, plain, prof, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
