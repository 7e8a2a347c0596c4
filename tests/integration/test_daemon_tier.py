#!/usr/bin/python3
"""Integration test: the host-memory tier of stored conversations
(--kv-host-memory, DESIGN.md §4.10) through the real tangramd on the CPU
backend, with a non-uniform profile (so a conversation prefilled again
from scratch would not even give the same output: chunks of a new turn
start at the turn, not at position 0).

- Offload and restore, --tp 1 and --tp 2: with a 1 MiB device pool two
  conversations are stored, fillers push them out of the device pool
  (tangram_kv_offloads_total, host pages in use on every rank), and their
  next turns are restored (tangram_kv_restores_total, restored bytes a
  multiple of the page bytes, the restore latency histogram, usage's
  cached tokens = the stored history). The restored turns' outputs, over
  gRPC (token ids) and HTTP (text), equal those of a daemon whose pool is
  large enough that nothing is ever offloaded. The KV-usage gauge stays
  device pages only while the host holds pages.
- Rewind on a restored entry: a third prompt that keeps only the first
  turn (another answer) reuses the KV up to that turn's chunk boundary,
  again equal to the never-offloaded daemon.
- Scopes: another session's prompt over a stored history gets nothing
  restored and no cached tokens; the owner's session does.
- Host-tier eviction: a host tier of one conversation's pages keeps the
  newer one (restored) and drops the older (tangram_kv_host_drops_total
  {reason="lru"}; its next turn is prefilled, cached 0).
- A worker killed while conversations sit in the host tier: the router
  drops them (host_drops{reason="worker_lost"}, host pages 0 after the
  restart), nothing is restored, and the next turn is served from scratch,
  equal to tangram-generate.
- Tier off (--kv-host-memory 0): the same pressure drops instead (no
  offload, no cached tokens).
- A tier larger than the host's memory: tangramd refuses to start, naming
  --kv-host-memory and the numbers.

Fails (never skips) when an input is missing. About two minutes on two
cores (six short daemon runs).
"""
import json
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()
BACKEND = []      # extra tangramd flags (test_daemon_cuda_tier.py: cuda)
ELEM = 4          # bytes of a KV element: fp32 on the CPU, bf16 on CUDA
SEED = 7
OUT = 16          # answer tokens per turn
N1 = 100          # first user turn, tokens
CHUNK = 64
MODEL_ARGS = ["--layers", "4", "--head-dim", "64"]  # 8 KiB fp32 pages at H_p 1


def ids(k, n):
    return [(i * (37 + 2 * k) + 11 * k + 5) % 3000 + 100 for i in range(n)]


def grpc_gen(grpc, pb, d, prompt, session=None):
    """Token ids of a greedy Generate (with the session id), or None."""
    ch = grpc.insecure_channel(d.grpc_target)
    gen = ch.unary_stream("/tangram.v1.Generation/Generate",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.GenerateResponse.FromString)
    req = pb.GenerateRequest(prompt_token_ids=prompt)
    if session:
        req.session_id = session
    req.sampling.CopyFrom(pb.SamplingParams(max_tokens=OUT, temperature=0.0,
                                            seed=SEED))
    out = []
    try:
        for m in gen(req, timeout=300):
            out += list(m.token_ids)
        return out
    except grpc.RpcError:
        return None
    finally:
        ch.close()


def http_gen(d, prompt, session=None):
    """(text, cached_tokens) of a greedy completion, or (None, None)."""
    body = {"model": "model", "prompt": prompt, "max_tokens": OUT,
            "temperature": 0, "seed": SEED}
    hdrs = {"X-Session-Id": session} if session else None
    st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                         headers=hdrs, timeout=300)
    j = du.json_of(raw)
    if st != 200 or j is None:
        print("       HTTP %s: %s" % (st, raw[:300]), flush=True)
        return None, None
    return (j["choices"][0]["text"],
            (j["usage"].get("prompt_tokens_details") or {}).get(
                "cached_tokens", 0))


def m(d, name, **labels):
    s = du.fetch_metrics(d.base_url) or {}
    v = du.metric(s, name, **labels)
    return v if v is not None else -1


def host_used(d, T):
    return [m(d, "tangram_kv_host_pages_used", rank=str(r)) for r in range(T)]


def push_out(grpc, pb, d, want, base, fillers=0):
    """At least `fillers` filler conversations (stored too), then more
    until `want` offloads happened; returns True when they did. Six
    fillers move every older device entry out (the pools of these tests
    hold at most three conversations)."""
    for k in range(40):
        if k >= fillers and m(d, "tangram_kv_offloads_total") >= want:
            return True
        if grpc_gen(grpc, pb, d, ids(base + k, N1)) is None:
            return False
    return m(d, "tangram_kv_offloads_total") >= want


def conversation(grpc, pb, d):
    """First turns of conversations A and B on daemon d (gRPC, sessions
    alice and bob): (a1, b1, {"a1": ids, "b1": ids})."""
    a1, b1 = ids(1, N1), ids(2, N1)
    out = {"a1": grpc_gen(grpc, pb, d, a1, "alice"),
           "b1": grpc_gen(grpc, pb, d, b1, "bob")}
    return a1, b1, out


def turn_two(a1, b1, out):
    a2 = a1 + out["a1"] + ids(11, 30)
    b2 = b1 + out["b1"] + ids(12, 30)
    return a2, b2


def serve(model, prof, work, name, args):
    sub = os.path.join(work, name)
    os.makedirs(sub, exist_ok=True)
    d = du.Daemon(model, sub, profile=prof,
                  args=BACKEND + ["--heads-per-group", "1", "--prefill-chunk",
                                  str(CHUNK)] + args)
    if not C.check(d.start(), "%s: tangramd ready" % name,
                   d.log_text()[-3000:]):
        d.stop()
        return None
    return d


def reference(grpc, pb, model, prof, work, tp):
    """The never-offloaded outputs: a pool large enough for everything."""
    d = serve(model, prof, work, "ref-tp%d" % tp,
              ["--tp", str(tp), "--kv-memory", "32MiB"])
    if d is None:
        return None
    try:
        a1, b1, out = conversation(grpc, pb, d)
        if out["a1"] is None or out["b1"] is None:
            C.check(False, "reference tp%d: first turns served" % tp)
            return None
        a2, b2 = turn_two(a1, b1, out)
        out["a2"] = grpc_gen(grpc, pb, d, a2, "alice")
        out["b2"], out["b2_cached"] = http_gen(d, b2, "bob")
        # A third turn keeping only A's first turn: rewound.
        a3 = a1 + ids(13, 20)
        out["a3"], out["a3_cached"] = http_gen(d, a3, "alice")
        C.check(m(d, "tangram_kv_offloads_total") == 0,
                "reference tp%d: nothing offloaded" % tp)
        return out
    finally:
        d.stop()


def tier_case(grpc, pb, model, prof, work, tp, ref, kill=True):
    """Offload, restore (gRPC and HTTP), rewind, scopes and (kill, tp 1) a
    worker killed, against the reference outputs `ref`."""
    name = "tier tp%d" % tp
    d = serve(model, prof, work, "tier-tp%d" % tp,
              ["--tp", str(tp), "--kv-memory", "1MiB"])
    if d is None or ref is None:
        return
    try:
        page_bytes = 1 * 2 * 16 * 64 * ELEM  # H_p x K,V x P x d x element
        C.check(all(m(d, "tangram_kv_host_pages_capacity", rank=str(r)) ==
                    (2 << 30) // page_bytes for r in range(tp)),
                "%s: the default 2 GiB host tier on every rank" % name,
                [m(d, "tangram_kv_host_pages_capacity", rank=str(r))
                 for r in range(tp)])
        a1, b1, out = conversation(grpc, pb, d)
        C.check(out["a1"] == ref["a1"] and out["b1"] == ref["b1"],
                "%s: first turns equal the reference" % name)
        if not C.check(push_out(grpc, pb, d, 2, 100),
                       "%s: fillers move A and B to the host tier "
                       "(tangram_kv_offloads_total >= 2)" % name,
                       d.log_text()[-2000:]):
            return
        used = host_used(d, tp)
        C.check(all(u > 0 for u in used),
                "%s: host pages in use on every rank" % name, used)
        s = du.fetch_metrics(d.base_url) or {}
        dev_used = sum(du.metric(s, "tangram_kv_pages_used", rank=str(r))
                       for r in range(tp))
        dev_total = sum(du.metric(s, "tangram_kv_pages_capacity", rank=str(r))
                        for r in range(tp))
        perc = du.metric(s, "tangram_kv_cache_usage_perc")
        C.check(perc is not None and abs(perc - dev_used / dev_total) < 1e-9,
                "%s: kv_cache_usage_perc counts device pages only (%s = "
                "%s / %s)" % (name, perc, dev_used, dev_total))
        a2, b2 = turn_two(a1, b1, out)
        r0 = m(d, "tangram_kv_restores_total")
        got = grpc_gen(grpc, pb, d, a2, "alice")
        C.check(m(d, "tangram_kv_restores_total") == r0 + 1,
                "%s: A's second turn restored" % name)
        C.check(got is not None and got == ref["a2"],
                "%s: gRPC output after a restore equals the never-offloaded "
                "output" % name, (got, ref["a2"]))
        text, cached = http_gen(d, b2, "bob")
        C.check(m(d, "tangram_kv_restores_total") == r0 + 2,
                "%s: B's second turn restored" % name)
        C.check(text is not None and text == ref["b2"],
                "%s: HTTP output after a restore equals the never-offloaded "
                "output" % name, (text, ref["b2"]))
        held = N1 + OUT - 1
        C.check(cached == held and ref["b2_cached"] == held,
                "%s: usage counts the restored history as cached (%d)" %
                (name, held), (cached, ref["b2_cached"]))
        rb = m(d, "tangram_kv_restored_bytes_total")
        C.check(rb > 0 and rb % page_bytes == 0,
                "%s: restored bytes counted in whole pages" % name, rb)
        C.check(m(d, "tangram_kv_restore_seconds_count") == r0 + 2,
                "%s: the restore latency histogram saw both" % name)
        # A, restored and stored again, goes out again; a prompt keeping
        # only its first turn rewinds it to that turn's chunk boundary.
        C.check(push_out(grpc, pb, d, m(d, "tangram_kv_offloads_total") + 2,
                         200, fillers=6), "%s: A and B offloaded again" % name)
        r1 = m(d, "tangram_kv_restores_total")
        text, cached = http_gen(d, a1 + ids(13, 20), "alice")
        C.check(m(d, "tangram_kv_restores_total") == r1 + 1,
                "%s: the restored-and-stored entry came back from the host "
                "again, rewound" % name)
        C.check(text is not None and text == ref["a3"] and
                cached == ref["a3_cached"] and 0 < cached <= N1,
                "%s: rewind to a chunk boundary of a restored entry, equal "
                "to the never-offloaded daemon (%s cached)" % (name, cached),
                (text, ref["a3"], cached, ref["a3_cached"]))
        # Scopes: mallory's prompt over bob's stored history gets nothing;
        # bob's own gets it back.
        push_out(grpc, pb, d, m(d, "tangram_kv_offloads_total") + 2, 300,
                 fillers=6)
        r1 = m(d, "tangram_kv_restores_total")
        text, cached = http_gen(d, b2 + ids(14, 5), "mallory")
        C.check(text is not None and cached == 0 and
                m(d, "tangram_kv_restores_total") == r1,
                "%s: another session restores nothing of bob's" % name,
                (cached, r1))
        text, cached = http_gen(d, b2 + ids(14, 5), "bob")
        C.check(text is not None and cached >= N1,
                "%s: bob's own session reuses it (%s cached)" % (name, cached))
        if tp == 1 and kill:
            worker_killed(grpc, pb, d, model, prof, a2, name)
    finally:
        d.stop()


def worker_killed(grpc, pb, d, model, prof, a2, name):
    """SIGKILL of the worker with conversations in the host tier."""
    ok = push_out(grpc, pb, d, m(d, "tangram_kv_offloads_total") + 2, 400,
                  fillers=6)
    before = host_used(d, 1)[0]
    C.check(ok and before > 0, "%s: conversations in the host tier before "
            "the kill" % name, before)
    workers = d.child_pids("worker")
    if not C.check(len(workers) == 1, "%s: one worker" % name, workers):
        return
    os.kill(workers[0], signal.SIGKILL)
    back = du.wait_for(lambda: d.child_pids("worker") not in ([], workers)
                       and d.health() == 200, 60, 0.1)
    C.check(back, "%s: the worker restarted and /health is 200" % name)
    C.check(du.wait_for(lambda: m(d, "tangram_kv_host_drops_total",
                                  reason="worker_lost") > 0, 10, 0.1),
            "%s: the lost tier's conversations are dropped "
            "(host_drops{worker_lost})" % name)
    C.check(host_used(d, 1)[0] == 0, "%s: no host pages in use after the "
            "restart" % name)
    r0 = m(d, "tangram_kv_restores_total")
    a3 = a2 + ids(15, 10)
    text, cached = http_gen(d, a3, "alice")
    ref = subprocess.run(
        [du.prog("tangram-generate"), "--model", model, "--profile", prof,
         "--prompt-ids", json.dumps(a3), "--max-tokens", str(OUT),
         "--temperature", "0", "--seed", str(SEED), "--prefill-chunk",
         str(CHUNK), "--json"], capture_output=True, text=True, timeout=120)
    want = json.loads(ref.stdout)["text"] if ref.returncode == 0 else None
    C.check(text is not None and cached == 0 and text == want and
            m(d, "tangram_kv_restores_total") == r0,
            "%s: the next turn is prefilled from scratch (no restore of "
            "pages that no longer exist), equal to tangram-generate" % name,
            (cached, text, want))


def host_eviction(grpc, pb, model, work):
    """Full KV, H_p 2: a conversation of 115 tokens holds 8 pages of each
    of 4 rows (16 KiB pages); a 48-page host tier holds one, not two."""
    name = "host eviction"
    page = 2 * 2 * 16 * 64 * 4
    sub = os.path.join(work, "evict")
    os.makedirs(sub)
    d = du.Daemon(model, sub, args=["--kv-memory", "1MiB",
                                    "--kv-host-memory", str(48 * page)])
    if not C.check(d.start(), "%s: ready" % name, d.log_text()[-2000:]):
        d.stop()
        return
    try:
        C.check(m(d, "tangram_kv_host_pages_capacity", rank="0") == 48,
                "%s: a 48-page host tier" % name)
        a1, b1 = ids(21, N1), ids(22, N1)
        oa = grpc_gen(grpc, pb, d, a1, "a")
        ob = grpc_gen(grpc, pb, d, b1, "b")
        C.check(oa is not None and ob is not None, "%s: first turns" % name)
        if oa is None or ob is None:
            return
        ok = push_out(grpc, pb, d, 2, 500)
        C.check(ok and m(d, "tangram_kv_host_drops_total", reason="lru") >= 1,
                "%s: offloading B dropped A from the host tier "
                "(host_drops{lru})" % name)
        _, cb = http_gen(d, b1 + ob + ids(23, 10), "b")
        C.check(cb == N1 + OUT - 1 and m(d, "tangram_kv_restores_total") == 1,
                "%s: B (the newer) restored" % name, cb)
        _, ca = http_gen(d, a1 + oa + ids(24, 10), "a")
        C.check(ca == 0 and m(d, "tangram_kv_restores_total") == 1,
                "%s: A (the older) fell out: prefilled, nothing cached" %
                name, ca)
    finally:
        d.stop()


def tier_off(grpc, pb, model, prof, work):
    name = "tier off"
    d = serve(model, prof, work, "off", ["--kv-memory", "1MiB",
                                         "--kv-host-memory", "0"])
    if d is None:
        return
    try:
        C.check(m(d, "tangram_kv_host_pages_capacity", rank="0") == 0,
                "%s: no host pages" % name)
        a1 = ids(1, N1)
        o1 = grpc_gen(grpc, pb, d, a1, "alice")
        for k in range(6):
            grpc_gen(grpc, pb, d, ids(600 + k, N1))
        _, cached = http_gen(d, a1 + (o1 or []) + ids(11, 30), "alice")
        C.check(m(d, "tangram_kv_offloads_total") == 0 and cached == 0,
                "%s: pressure drops the stored conversation (no offload, "
                "nothing cached)" % name, cached)
    finally:
        d.stop()


def refused(model, work):
    """A tier the host cannot hold fails tangramd at start, naming the
    flag and the numbers (fail fast, not at the first offload)."""
    sub = os.path.join(work, "too-big")
    os.makedirs(sub)
    d = du.Daemon(model, sub, args=["--kv-host-memory", "1024TiB"])
    started = d.start(timeout=30)
    rc, _ = d.stop()
    log = d.log_text()
    C.check(not started and "--kv-host-memory" in log and "MiB" in log,
            "a host tier larger than the host is refused at start-up "
            "(rc %s)" % rc, log[-800:])


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
    work = du.scratch_dir("tgtier")
    try:
        pb = du.load_tangram_pb2(work)
        if not C.check(pb is not None, "protoc generates tangram_pb2"):
            return C.summary()
        model = du.make_model(os.path.join(work, "model"), MODEL_ARGS)
        prof = du.make_skewed_profile(work, 4, 2, 64, seed=3,
                                      heads_per_group=1)
        for tp in (1, 2):
            ref = reference(grpc, pb, model, prof, work, tp)
            tier_case(grpc, pb, model, prof, work, tp, ref)
        host_eviction(grpc, pb, model, work)
        tier_off(grpc, pb, model, prof, work)
        refused(model, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
