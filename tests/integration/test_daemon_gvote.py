#!/usr/bin/python3
"""tangramd --method gvote (DESIGN.md §4.8) on the CPU backend, end to end,
against tangram-generate --method gvote on the same model, profile and
flags.

The tiny qwen3 model (2 KV heads) with a skewed profile built by
tangram-profile (H_p = 1, so every head is its own group and gvote's kept
counts move pages), --prefill-chunk 64, --gvote-p 0.5 so that chunks keep
less than their reservation. For S = 0 and S = 8 (--gvote-samples), one
daemon each:
  * greedy completions of distinct 150-token prompts (ids) with a fixed
    seed, two over HTTP (/v1/completions) and two over gRPC (Generate),
    equal tangram-generate's output: the text and token count over HTTP,
    the token ids over gRPC;
  * tangram_kv_pages_released_total (summed over ranks) grows by exactly
    the sum of tangram-generate's kv.pages_released for those prompts, and
    that sum is > 0 for S = 0 (the test can see pages go back);
  * once the requests ended, every page in use is a stored multi-turn
    entry's (tangram_kv_pages_used == tangram_kv_pages_cached per rank).
On the S = 0 daemon a conversation goes on: turn 2 re-sends turn 1's prompt
and answer plus new ids (same X-Session-Id); tangram-generate cannot run a
conversation (it would re-compress the history in other chunks), so the
check is that it is served, reuses the stored gvote KV (usage
cached_tokens = turn 1's 157 fed-back positions, and
tangram_cached_prompt_tokens_total grows by them) and leaves no running
page. A third turn that leaves the conversation inside turn 1's answer
rewinds the stored KV to the end of turn 1's prompt (a chunk boundary;
the heads restored there): it is served and reuses those 150 positions.
With --tp 2 (one head per rank): the same token ids as tangram-generate over
gRPC and HTTP, released pages reported by both ranks' counters summing to
tangram-generate's, and no running page at the end.

Fails, naming it, when a program, the tokenizer, grpcio, protobuf or protoc
is missing. About 30 s.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()
CHUNK = 64
GVOTE_P = "0.5"
SEED = 7
MAX_TOKENS = 8
N_PROMPT = 150


def prompt_ids(k):
    """A distinct prompt of N_PROMPT ids per k (no stored entry of one is
    a long prefix of another's, so no request reuses another's KV)."""
    return [(i * (37 + 2 * k) + 11 * k + 5) % 3000 + 100
            for i in range(N_PROMPT)]


def generate(model, prof, ids, samples):
    """tangram-generate --method gvote: (token ids, pages released) or
    (None, reason)."""
    r = subprocess.run(
        [du.prog("tangram-generate"), "--model", model, "--profile", prof,
         "--prompt-ids", json.dumps(ids), "--max-tokens", str(MAX_TOKENS),
         "--temperature", "0", "--seed", str(SEED), "--prefill-chunk",
         str(CHUNK), "--method", "gvote", "--gvote-p", GVOTE_P,
         "--gvote-samples", str(samples), "--json"],
        capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, r.stderr[-500:]
    j = json.loads(r.stdout)
    return j, j["kv"]["pages_released"]


def detokenize(d, ids):
    st, _, raw = du.http("POST", d.base_url + "/detokenize",
                         {"model": "model", "tokens": ids})
    j = du.json_of(raw)
    return j.get("prompt") if st == 200 and j else None


def http_complete(d, ids, session=None):
    hdrs = {"X-Session-Id": session} if session else None
    st, _, raw = du.http("POST", d.base_url + "/v1/completions",
                         {"model": "model", "prompt": ids,
                          "max_tokens": MAX_TOKENS, "temperature": 0,
                          "seed": SEED}, headers=hdrs, timeout=120)
    j = du.json_of(raw)
    return st, j, raw


def load_protos(out_dir):
    return du.load_tangram_pb2(out_dir)


def grpc_generate(grpc, pb, d, ids):
    """Token ids of a greedy Generate, or None with the status."""
    return du.grpc_generate_ids(grpc, pb, d.grpc_target, ids, MAX_TOKENS,
                                SEED, timeout=120)


def metrics(d, T):
    return du.kv_page_metrics(d.base_url, T)


def no_running_pages(d, T, name):
    m = metrics(d, T)
    C.check(du.only_cached_pages(m),
            "%s: after the requests every page in use is a stored entry's "
            "(used == cached per rank)" % name, m)


def serve_case(grpc, pb, model, prof, work, name, samples, tp, first_k):
    """Runs the four (HTTP, gRPC) comparisons on one daemon; returns the
    daemon still running (the caller stops it) or None."""
    d = du.Daemon(model, work, profile=prof, args=[
        "--method", "gvote", "--gvote-p", GVOTE_P, "--gvote-samples",
        str(samples), "--tp", str(tp), "--heads-per-group", "1",
        "--prefill-chunk", str(CHUNK)])
    if not C.check(d.start(), "%s: tangramd --method gvote ready" % name,
                   d.log_text()[-3000:]):
        d.stop()
        return None
    m0 = metrics(d, tp)
    want_released = 0
    for k in range(first_k, first_k + 4):
        ids = prompt_ids(k)
        ref, rel = generate(model, prof, ids, samples)
        if not C.check(ref is not None, "%s: tangram-generate prompt %d" %
                       (name, k), rel):
            continue
        want_released += rel
        if k % 2 == 0:
            st, j, raw = http_complete(d, ids)
            ok = st == 200 and j is not None
            C.check(ok and j["choices"][0]["text"] == ref["text"] and
                    j["usage"]["completion_tokens"] == len(ref["token_ids"]),
                    "%s: HTTP completion %d equals tangram-generate" %
                    (name, k), (st, raw[:400], ref["text"]))
        else:
            got, why = grpc_generate(grpc, pb, d, ids)
            C.check(got == ref["token_ids"],
                    "%s: gRPC Generate %d equals tangram-generate token for "
                    "token" % (name, k), (got, why, ref["token_ids"]))
    m1 = metrics(d, tp)
    if C.check(m0 is not None and m1 is not None, "%s: metrics" % name):
        C.check(m1["released"] - m0["released"] == want_released,
                "%s: tangram_kv_pages_released_total grew by "
                "tangram-generate's kv.pages_released (%d)" %
                (name, want_released), (m0, m1))
        if samples == 0:
            C.check(want_released > 0, "%s: gvote gave pages back" % name,
                    want_released)
        if tp > 1:
            C.check(all(v is not None for v in m1["released_ranks"]),
                    "%s: every rank has its released counter" % name, m1)
    no_running_pages(d, tp, name)
    return d


def multi_turn(d, model, prof, name):
    ids = prompt_ids(40)
    ref, _ = generate(model, prof, ids, 0)
    st, j, raw = http_complete(d, ids, session="conv-1")
    if not C.check(st == 200 and j is not None and ref is not None and
                   j["choices"][0]["text"] == ref["text"],
                   "%s: turn 1 equals tangram-generate" % name, raw[:300]):
        return
    out = ref["token_ids"]
    m0 = metrics(d, 1)
    turn2 = ids + out + [(7 * i + 3) % 3000 + 100 for i in range(20)]
    st, j, raw = http_complete(d, turn2, session="conv-1")
    held = N_PROMPT + len(out) - 1  # the last answer token was never fed
    ok = st == 200 and j is not None
    C.check(ok and j["usage"]["completion_tokens"] >= 1,
            "%s: turn 2 served" % name, raw[:300])
    C.check(ok and (j["usage"].get("prompt_tokens_details") or {})
            .get("cached_tokens") == held,
            "%s: turn 2 reuses the stored gvote KV (%d cached tokens)" %
            (name, held), raw[:300])
    m1 = metrics(d, 1)
    C.check(m0 and m1 and m1["cached_tokens"] - m0["cached_tokens"] == held,
            "%s: tangram_cached_prompt_tokens_total grew by %d" %
            (name, held), (m0, m1))
    # Leaves the conversation inside turn 1's answer: the stored entry is
    # rewound to its last boundary there, the end of turn 1's prompt (its
    # last chunk), with its heads.
    turn3 = ids + out[:2] + [(11 * i + 9) % 3000 + 100 for i in range(30)]
    st, j, raw = http_complete(d, turn3, session="conv-1")
    ok = st == 200 and j is not None
    C.check(ok and j["usage"]["completion_tokens"] >= 1,
            "%s: turn 3 (rewound conversation) served" % name, raw[:300])
    C.check(ok and (j["usage"].get("prompt_tokens_details") or {})
            .get("cached_tokens") == N_PROMPT,
            "%s: turn 3 reuses the KV up to turn 1's last chunk (%d)" %
            (name, N_PROMPT), raw[-300:])
    # Parallel samples fork their leader's reservation, which gvote
    # shrinks after each chunk: refused, naming the parameter.
    st, _, raw = du.http("POST", d.base_url + "/v1/completions",
                         {"model": "model", "prompt": ids, "max_tokens": 4,
                          "n": 2}, timeout=60)
    j = du.json_of(raw)
    C.check(st == 400 and j is not None and
            j.get("error", {}).get("param") == "n" and
            "gvote" in j.get("error", {}).get("message", ""),
            "%s: n = 2 under gvote is a 400 naming n and the method" % name,
            raw[:300])
    no_running_pages(d, 1, name + " multi-turn")
    C.check("failed" not in d.log_text(),
            "%s: no step failed (no malformed head lengths)" % name,
            d.log_text()[-2000:])


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
    work = du.scratch_dir("tggvote")
    try:
        pb = load_protos(work)
        if not C.check(pb is not None, "protoc generates tangram_pb2"):
            return C.summary()
        model = du.make_model(os.path.join(work, "model"))
        prof = du.make_skewed_profile(work, 2, 2, 16, 5, heads_per_group=1,
                                      low=0.05)
        for name, samples, tp, k in (("S=0", 0, 1, 0), ("S=8", 8, 1, 10),
                                     ("tp2", 0, 2, 20)):
            sub = os.path.join(work, name)
            os.makedirs(sub)
            d = serve_case(grpc, pb, model, prof, sub, name, samples, tp, k)
            if d is None:
                continue
            try:
                if name == "S=0":
                    multi_turn(d, model, prof, name)
            finally:
                d.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
