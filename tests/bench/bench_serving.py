#!/usr/bin/python3
"""bench_serving — multi-turn serving load benchmark of the real tangramd
(CPU or CUDA backend): full KV vs calibrated per-head profiles, same KV
memory, one invocation (DESIGN.md §7).

Client semantics follow vLLM's benchmarks/multi_turn (benchmark_serving_
multi_turn): every conversation is a list of user turns; turn k re-sends the
whole history (all earlier user turns and the server's answers) plus the new
user turn, waits for the complete answer, then sends turn k + 1 right away.
Conversations start by a Poisson process of --request-rate conversations per
second (exponential gaps, deterministic seed) and run concurrently.
Measured per request (one turn): TTFT (send to the first generated token),
ITL (gaps between streamed token messages), TPOT ((e2e - TTFT) / (output
tokens - 1)), e2e latency; per run: request throughput and output token
throughput over the wall time from the first send to the last answer, and
the cached prompt token fraction (usage.cached_prompt_tokens / prompt
tokens, i.e. how much of each re-sent history the server did not prefill
again). Percentiles use linear interpolation between order statistics
(numpy's default), as vLLM does.

Transport: gRPC (tangram.v1.Generation/Generate, h2c) with token-id prompts.
The history must be re-sent as the exact token ids the server produced: the
multi-turn cache matches stored token sequences, and a random-weight
model's output text does not re-tokenize to the same ids (partial UTF-8
characters, non-canonical merges), so an HTTP client re-sending text would
measure 0 % reuse. The HTTP API does not return token ids; gRPC does. Each
streamed GenerateResponse carries the tokens of one scheduler step, so ITL
is per token. The messages are hand-encoded protobuf (only python3-grpcio is
needed, no generated stubs).

Synthetic data: user turns are random words from a fixed list (seeded),
wrapped as "User: ...\\nAssistant:" and tokenized by the server's Tokenize
RPC; answers have a fixed length (ignore_eos, max_tokens), greedy.

Runs: (1) full KV (no profile) and (2) one profile per target ratio of
--targets (default 0.25), each calibrated on the fly by `tangram-profile
calibrate` (same --backend) over a few synthetic samples; all with the same
--kv-memory, the same conversations and the same arrival times. Prints them
side by side with the ratios (profile / full); --json FILE writes
everything ("full", "profile" for the first target, "profiles" by target).
Per run also: the daemon's start-up time (start to /health 200), the
worker's peak host RSS (VmHWM), its memory-plan and pool log lines, the
batch held (tangram_num_requests_running sampled every 0.25 s: mean and
peak) and one HTTP /v1/completions request after the load (HTTP and gRPC
both served).

Model: --shape NAME[:LAYERS] takes the shape of a real config.json of
data/configs (e.g. Qwen--Qwen3-8B, meta-llama--Llama-3.1-8B-Instruct;
LAYERS: a shallower model of the same width), else the small default below.
--backend cuda serves it from one GPU (bf16); the GPU round runs
`--backend cuda --shape Qwen--Qwen3-8B --targets 0.5,0.25`.

Workload `--workload tier` (the host-memory tier, DESIGN.md §4.10): more
conversations than the device pool holds (their final histories take at
least 4x the pool's pages, under the profile too) with think time between
turns (exponential, seeded: the user reads and types), so stored
conversations are pushed off the device before they return. Four runs side
by side, same conversations, arrival and think times: full KV and the
profile, each with the tier off (--kv-host-memory 0: evicted history is
prefilled again) and on. Reported per run: TTFT of returning turns (turn
2+; p50, p99, mean), prefill tokens (prompt tokens not served from stored
KV) and the tokens saved, throughput, offloads, restores, the mean restore
latency, and at the end the conversations the host tier holds, its MiB in
use and conversations per GiB of host memory; and the ratio of the
histories' pages (device-cached plus host pages at the end of the tier-on
run, nothing dropped) to the pool.

Usage: bench_serving.py [--bin DIR] [--quick] [--workload chat|tier]
                        [--json FILE] [options]
--quick: the tiny model, 3 conversations of 2 turns, a few seconds (with
--workload tier: 6 conversations of 2 turns on a 1 MiB pool).
Exit status: 0, or 1 on any failed request, daemon problem or missing input
(programs not built, python3-grpcio not installed; named on stderr).
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import daemon_util as du  # noqa: E402

WORDS = ("the of and to in is was for on that with as by at from his it an "
         "were are which this be or has had not but first one their its new "
         "after who they two her she been other when time during there into "
         "school more may years over only year most would world city some "
         "where between later three state such then national used made known "
         "under many university united while part season team these american "
         "than film second born south became states war through being "
         "including both before north high however people family early "
         "history album area them series against until since district county "
         "name work life group music following number company several four "
         "called played released career league game government house each "
         "based day same won use station club international town located "
         "population general college east found age march end september "
         "began home public church line june river member system place").split()

# Model shapes: big enough that decode is not trivially fast, small enough
# for a benchmark run on two cores.
FULL_MODEL = ["--arch", "qwen3", "--hidden", "256", "--layers", "4",
              "--heads", "8", "--kv-heads", "4", "--head-dim", "32",
              "--ffn", "512", "--dtype", "bf16", "--seed", "1"]


# ---- protobuf (proto3 wire format, the few fields we use) ----------------------

def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num, wire, payload):
    return _varint((num << 3) | wire) + payload


def _bytes_field(num, data):
    return _field(num, 2, _varint(len(data)) + data)


def encode_generate(prompt_ids, max_tokens, session_id):
    """tangram.v1.GenerateRequest{prompt_token_ids, session_id,
    sampling{max_tokens, temperature = 0, ignore_eos}}."""
    sampling = (_field(1, 0, _varint(max_tokens)) +
                _field(2, 5, struct.pack("<f", 0.0)) +
                _field(9, 0, _varint(1)))
    packed = b"".join(_varint(t) for t in prompt_ids)
    return (_bytes_field(3, packed) + _bytes_field(5, session_id.encode()) +
            _bytes_field(6, sampling))


def encode_tokenize(text):
    """tangram.v1.TokenizeRequest{text, add_special_tokens = false}."""
    return _bytes_field(1, text.encode()) + _field(3, 0, _varint(0))


def _read_varint(buf, pos):
    shift = v = 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, pos
        shift += 7


def decode_fields(buf):
    """[(field number, wire type, value)] of one message; value is an int
    (varint, fixed32/64 as raw int) or bytes (length-delimited)."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, pos = _read_varint(buf, pos)
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            v, pos = bytes(buf[pos:pos + n]), pos + n
        elif wire == 5:
            v, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        elif wire == 1:
            v, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        else:
            raise ValueError("wire type %d" % wire)
        out.append((num, wire, v))
    return out


def _uints(wire, v):
    """A repeated uint32 field's values, packed or not."""
    if wire == 0:
        return [v]
    vals, pos = [], 0
    while pos < len(v):
        x, pos = _read_varint(v, pos)
        vals.append(x)
    return vals


def decode_generate(buf):
    """(token_ids, finish_reason, usage dict or None) of a GenerateResponse."""
    ids, finish, usage = [], 0, None
    for num, wire, v in decode_fields(buf):
        if num == 1:
            ids += _uints(wire, v)
        elif num == 4:
            finish = v
        elif num == 5:
            usage = {"prompt_tokens": 0, "completion_tokens": 0,
                     "cached_prompt_tokens": 0}
            names = {1: "prompt_tokens", 2: "completion_tokens",
                     3: "cached_prompt_tokens"}
            for n2, _, v2 in decode_fields(v):
                if n2 in names:
                    usage[names[n2]] = v2
    return ids, finish, usage


def decode_tokenize(buf):
    ids = []
    for num, wire, v in decode_fields(buf):
        if num == 1:
            ids += _uints(wire, v)
    return ids


# ---- workload ------------------------------------------------------------------

def make_conversations(seed, n_conv, turns, lo, hi):
    """n_conv conversations of `turns` user messages of lo..hi words each."""
    rng = random.Random(seed)
    return [["User: " + " ".join(rng.choice(WORDS)
                                 for _ in range(rng.randint(lo, hi))) +
             "\nAssistant:" for _ in range(turns)] for _ in range(n_conv)]


def arrival_times(seed, n_conv, rate):
    """Start offsets (s) of a Poisson process of `rate` per second; the first
    conversation starts at 0."""
    rng = random.Random(seed + 7919)
    t, out = 0.0, []
    for i in range(n_conv):
        out.append(t)
        t += rng.expovariate(rate) if rate > 0 else 0.0
    return out


def percentile(xs, p):
    """Linear interpolation between order statistics (numpy's default)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def summarize(xs):
    return {"mean": sum(xs) / len(xs) if xs else float("nan"),
            "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "p99": percentile(xs, 99), "n": len(xs)}


class Client:
    """gRPC calls over one channel (thread-safe)."""

    def __init__(self, target):
        import grpc
        self.grpc = grpc
        self.channel = grpc.insecure_channel(target)
        ident = lambda b: b  # noqa: E731 - raw bytes in and out
        self.generate = self.channel.unary_stream(
            "/tangram.v1.Generation/Generate", request_serializer=ident,
            response_deserializer=ident)
        self.tokenize = self.channel.unary_unary(
            "/tangram.v1.Generation/Tokenize", request_serializer=ident,
            response_deserializer=ident)

    def close(self):
        self.channel.close()


def run_turn(client, prompt_ids, max_tokens, session, timeout):
    """One streamed Generate. Returns a result dict (error set on failure)."""
    res = {"prompt_ids": len(prompt_ids), "out": [], "ttft": None, "itl": [],
           "e2e": None, "usage": None, "error": None, "finish": 0}
    t0 = time.perf_counter()
    last = None
    try:
        for msg in client.generate(encode_generate(prompt_ids, max_tokens, session),
                                   timeout=timeout):
            now = time.perf_counter()
            ids, finish, usage = decode_generate(msg)
            if ids:
                if last is None:
                    res["ttft"] = now - t0
                else:
                    res["itl"].append(now - last)
                last = now
                res["out"] += ids
            if usage is not None:
                res["usage"] = usage
            if finish:
                res["finish"] = finish
    except Exception as e:  # noqa: BLE001 - any RPC failure is a result
        res["error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    res["e2e"] = time.perf_counter() - t0
    if res["error"] is None and (res["ttft"] is None or res["usage"] is None or
                                 len(res["out"]) != max_tokens):
        res["error"] = "incomplete answer: %d tokens, usage %s, finish %d" % (
            len(res["out"]), res["usage"], res["finish"])
    return res


def think_times(seed, n_conv, turns, mean):
    """Pauses (s) before turn k >= 1 of every conversation: exponential with
    `mean` (0: none), seeded, the same for every run."""
    rng = random.Random(seed + 104729)
    return [[rng.expovariate(1.0 / mean) if mean > 0 and k > 0 else 0.0
             for k in range(turns)] for _ in range(n_conv)]


def run_load(client, convs, starts, max_tokens, timeout, thinks=None):
    """Replays the conversations (ids of every user turn) concurrently,
    pausing thinks[c][k] seconds before turn k of conversation c.
    Returns (list of turn results, wall seconds)."""
    results = []
    lock = threading.Lock()
    t_begin = time.perf_counter()

    def conversation(ci):
        delay = t_begin + starts[ci] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        history = []
        for k, user_ids in enumerate(convs[ci]):
            if thinks is not None and thinks[ci][k] > 0:
                time.sleep(thinks[ci][k])
            history = history + user_ids
            r = run_turn(client, history, max_tokens, "conv-%d" % ci, timeout)
            r["conv"], r["turn"] = ci, k
            with lock:
                results.append(r)
            if r["error"] is not None:
                return
            history = history + r["out"]

    threads = [threading.Thread(target=conversation, args=(i,), daemon=True)
               for i in range(len(convs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t_begin


def ratio(a, b):
    """a / b, NaN where b is zero or either is NaN."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


def aggregate(results, wall, metrics):
    ok = [r for r in results if r["error"] is None]
    ttft = [r["ttft"] for r in ok]
    itl = [x for r in ok for x in r["itl"]]
    tpot = [(r["e2e"] - r["ttft"]) / (len(r["out"]) - 1) for r in ok
            if len(r["out"]) > 1]
    e2e = [r["e2e"] for r in ok]
    prompt = sum(r["usage"]["prompt_tokens"] for r in ok)
    cached = sum(r["usage"]["cached_prompt_tokens"] for r in ok)
    out_tok = sum(r["usage"]["completion_tokens"] for r in ok)
    later = [r for r in ok if r["turn"] > 0]
    later_prompt = sum(r["usage"]["prompt_tokens"] for r in later)
    later_cached = sum(r["usage"]["cached_prompt_tokens"] for r in later)
    histories = {}
    for r in ok:  # the longest history of each conversation
        n = r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
        histories[r["conv"]] = max(histories.get(r["conv"], 0), n)

    def m(name, **labels):
        v = du.metric(metrics, name, **labels) if metrics else None
        return v if v is not None else float("nan")
    return {
        "requests": len(results), "failed": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if r["error"]})[:5],
        "wall_s": wall,
        "request_throughput": len(ok) / wall if wall > 0 else float("nan"),
        "output_throughput": out_tok / wall if wall > 0 else float("nan"),
        "prompt_tokens": prompt, "cached_prompt_tokens": cached,
        "output_tokens": out_tok,
        "cached_fraction": cached / prompt if prompt else float("nan"),
        "cached_fraction_later_turns":
            later_cached / later_prompt if later_prompt else float("nan"),
        "ttft_s": summarize(ttft), "tpot_s": summarize(tpot),
        "itl_s": summarize(itl), "e2e_s": summarize(e2e),
        "preemptions": m("tangram_num_preemptions_total"),
        "kv_pages_capacity": m("tangram_kv_pages_capacity", rank="0"),
        "kv_pages_used_end": m("tangram_kv_pages_used", rank="0"),
        "kv_pages_cached_end": m("tangram_kv_pages_cached", rank="0"),
        "ttft_returning_s": summarize([r["ttft"] for r in later]),
        "prefill_tokens": prompt - cached,
        "history_tokens": sum(histories.values()),
        "offloads": m("tangram_kv_offloads_total"),
        "restores": m("tangram_kv_restores_total"),
        "host_drops": m("tangram_kv_host_drops_total", reason="lru"),
        "tier_failures": (m("tangram_kv_tier_failures_total", op="offload") +
                          m("tangram_kv_tier_failures_total", op="restore")),
        "restore_mean_s": (m("tangram_kv_restore_seconds_sum") /
                           m("tangram_kv_restore_seconds_count")
                           if m("tangram_kv_restore_seconds_count") > 0
                           else float("nan")),
        "host_pages_total": m("tangram_kv_host_pages_capacity", rank="0"),
        "host_pages_used_end": m("tangram_kv_host_pages_used", rank="0"),
        "host_conversations_end": m("tangram_kv_host_conversations"),
        # Host work per step (router: planning, encoding, result handling;
        # worker: its step outside the backend's calls) over the steps'
        # wall time, from the router's counters.
        "step_s": m("tangram_step_seconds_total"),
        "host_share_router": ratio(m("tangram_step_router_host_seconds_total"),
                                   m("tangram_step_seconds_total")),
        "host_share_worker": ratio(m("tangram_step_worker_host_seconds_total"),
                                   m("tangram_step_seconds_total")),
    }


# ---- runs ----------------------------------------------------------------------

def calibrate(model, work, target, hp, n_samples, words, backend):
    """The profile of `target` for the model, calibrated now unless the
    work directory (--workdir, kept between runs) holds it already."""
    out = os.path.join(work, "profile-%.2f-hp%d.json" % (target, hp))
    if os.path.exists(out):
        return out
    samples = os.path.join(work, "calib.jsonl")
    rng = random.Random(12345)
    with open(samples, "w") as f:
        for _ in range(n_samples):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS)
                                                 for _ in range(words))}) + "\n")
    cmd = [du.prog("tangram-profile"), "calibrate", "--model", model,
           "--ratio", str(target), "--samples", samples,
           "--heads-per-group", str(hp), "--backend", backend, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("calibration failed: " + r.stderr[-2000:])
    return out


class BatchSampler:
    """Samples tangram_num_requests_running every `period` seconds in a
    thread while the load runs: the batch the server holds."""

    def __init__(self, base_url, period=0.25):
        self.base_url, self.period = base_url, period
        self.vals, self.stop_ev = [], threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop_ev.wait(self.period):
            try:
                v = du.metric(du.fetch_metrics(self.base_url),
                              "tangram_num_requests_running")
            except Exception:  # noqa: BLE001 - a missed sample is no result
                v = None
            if v is not None:
                self.vals.append(v)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.t.join()

    def summary(self):
        v = self.vals
        return {"mean": sum(v) / len(v) if v else float("nan"),
                "max": max(v) if v else float("nan"), "samples": len(v)}


def worker_rss(d):
    """Peak and current host RSS (bytes) of the daemon's worker processes,
    from /proc (VmHWM, VmRSS), summed over the workers."""
    hwm = rss = 0
    for pid in d.child_pids("worker"):
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm += int(line.split()[1]) * 1024
                    elif line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return hwm, rss


def http_check(d):
    """One non-streamed /v1/completions request: True when it is served."""
    body = json.dumps({"model": "model", "prompt": "The quick brown fox",
                       "max_tokens": 4, "temperature": 0}).encode()
    st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                         {"Content-Type": "application/json"}, timeout=120)
    j = du.json_of(raw)
    return st == 200 and bool(j) and "choices" in j


def plan_lines(d):
    """The worker's start-up lines about memory: the CUDA memory plan and
    the pool its Hello announced."""
    return [ln for ln in d.log_text().splitlines()
            if "memory plan" in ln or "hello sent" in ln or "loaded" in ln][-6:]


def serve_and_run(name, model, work, profile, daemon_args, conv_texts, starts,
                  max_tokens, timeout, thinks=None):
    """Starts tangramd, tokenizes the conversations, replays them, stops.
    Returns the aggregate dict (with 'daemon_ok')."""
    wdir = os.path.join(work, name)
    os.makedirs(wdir, exist_ok=True)
    d = du.Daemon(model, wdir, args=daemon_args, profile=profile)
    client = None
    try:
        t0 = time.time()
        if not d.start(timeout=600):
            raise RuntimeError("%s: tangramd did not start:\n%s" %
                               (name, d.log_text()[-3000:]))
        startup = time.time() - t0
        d.note_children()
        client = Client(d.grpc_target)
        convs = [[decode_tokenize(client.tokenize(encode_tokenize(t), timeout=30))
                  for t in turns] for turns in conv_texts]
        with BatchSampler(d.base_url) as bs:
            results, wall = run_load(client, convs, starts, max_tokens,
                                     timeout, thinks)
        metrics = du.fetch_metrics(d.base_url)
        agg = aggregate(results, wall, metrics)
        agg["batch_held"] = bs.summary()
        agg["startup_s"] = startup
        agg["worker_rss_peak"], agg["worker_rss"] = worker_rss(d)
        agg["http_ok"] = http_check(d)
        agg["startup_log"] = plan_lines(d)
        if not agg["http_ok"]:
            agg["errors"].append("HTTP /v1/completions failed")
    finally:
        if client is not None:
            client.close()
        rc, left = d.stop()
    agg["daemon_ok"] = rc == 0 and not left
    if not agg["daemon_ok"]:
        agg["errors"].append("tangramd exit %s, children left %s" % (rc, left))
    return agg


def fmt(v, scale=1.0, digits=1):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return "%.*f" % (digits, v * scale)


def report(full, profs, cfg):
    """The side-by-side table: full KV, then each profile with its ratio to
    full KV. profs: [(target, aggregate)]."""
    rows = [("requests (failed)", lambda a: "%d (%d)" % (a["requests"], a["failed"]), None),
            ("wall time (s)", lambda a: fmt(a["wall_s"], 1, 1), "wall_s"),
            ("request throughput (req/s)",
             lambda a: fmt(a["request_throughput"], 1, 3), "request_throughput"),
            ("output throughput (tok/s)",
             lambda a: fmt(a["output_throughput"], 1, 1), "output_throughput"),
            ("cached prompt fraction",
             lambda a: fmt(a["cached_fraction"], 100, 1) + " %", "cached_fraction"),
            ("  turns 2+ only",
             lambda a: fmt(a["cached_fraction_later_turns"], 100, 1) + " %",
             "cached_fraction_later_turns"),
            ("batch held, mean", lambda a: fmt(a["batch_held"]["mean"], 1, 1),
             ("batch_held", "mean")),
            ("batch held, peak", lambda a: fmt(a["batch_held"]["max"], 1, 0),
             ("batch_held", "max")),
            ("preemptions", lambda a: fmt(a["preemptions"], 1, 0), None),
            ("host work of a step (%)",
             lambda a: fmt(a["host_share_router"] + a["host_share_worker"],
                           100, 2), None),
            ("  router / worker (%)",
             lambda a: "%s / %s" % (fmt(a["host_share_router"], 100, 2),
                                    fmt(a["host_share_worker"], 100, 2)),
             None),
            ("KV pages (pool)", lambda a: fmt(a["kv_pages_capacity"], 1, 0), None),
            ("start-up (s)", lambda a: fmt(a["startup_s"], 1, 1), None),
            ("worker RSS peak (MiB)",
             lambda a: fmt(a["worker_rss_peak"], 1.0 / (1 << 20), 0), None),
            ("HTTP request served", lambda a: "yes" if a["http_ok"] else "NO",
             None)]
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"),
                       ("e2e_s", "E2E")):
        for stat in ("mean", "p50", "p90", "p99"):
            rows.append(("%s %s (ms)" % (label, stat),
                         (lambda k, s: lambda a: fmt(a[k][s], 1000, 1))(key, stat),
                         (key, stat)))
    print("\nServing benchmark (%s)" % cfg)
    head = "%-30s %14s" % ("", "full KV")
    for t, _ in profs:
        head += " %14s %8s" % ("profile %.2f" % t, "ratio")
    print(head)

    def val(a, key):
        return a[key] if isinstance(key, str) else a[key[0]][key[1]]
    for label, f, key in rows:
        line = "%-30s %14s" % (label, f(full))
        for _, prof in profs:
            ratio = "-"
            if key is not None:
                x, y = val(full, key), val(prof, key)
                if x and not math.isnan(x) and not math.isnan(y):
                    ratio = "%.2fx" % (y / x)
            line += " %14s %8s" % (f(prof), ratio)
        print(line)
    for name, a in [("full KV", full)] + [("profile %.2f" % t, p)
                                          for t, p in profs]:
        for ln in a.get("startup_log", []):
            print("  %s: %s" % (name, ln.strip()[:200]))


TIER_RUNS = (("full-off", "full KV, off"), ("full-on", "full KV, on"),
             ("profile-off", "prof, off"), ("profile-on", "prof, on"))


def tier_derived(a, page_bytes):
    """Host MiB in use and conversations per GiB of host memory at the end
    of a run, and the histories' pages over the pool (device-cached plus
    host pages at the end; meaningful where nothing was dropped)."""
    used = a["host_pages_used_end"]
    a["host_mib_end"] = used * page_bytes / 2.0 ** 20 if used >= 0 else float("nan")
    a["conversations_per_gib"] = (a["host_conversations_end"] /
                                  (used * page_bytes / 2.0 ** 30)
                                  if used > 0 else float("nan"))
    pool = a["kv_pages_capacity"]
    a["histories_over_pool"] = ((a["kv_pages_cached_end"] + max(used, 0)) /
                                pool if pool and pool > 0 else float("nan"))


def report_tier(runs, cfg):
    """Four columns (tier off / on for full KV and the profile) and the
    on / off ratio of each."""
    def r(key, scale=1.0, digits=1, sub=None):
        return (key, sub, scale, digits)
    rows = [("requests (failed)", None),
            ("wall time (s)", r("wall_s")),
            ("request throughput (req/s)", r("request_throughput", 1, 3)),
            ("output throughput (tok/s)", r("output_throughput")),
            ("returning-turn TTFT p50 (ms)", r("ttft_returning_s", 1000, 1, "p50")),
            ("returning-turn TTFT p99 (ms)", r("ttft_returning_s", 1000, 1, "p99")),
            ("returning-turn TTFT mean (ms)", r("ttft_returning_s", 1000, 1, "mean")),
            ("prefill tokens", r("prefill_tokens", 1, 0)),
            ("prefill tokens saved", r("cached_prompt_tokens", 1, 0)),
            ("cached prompt fraction 2+ (%)", r("cached_fraction_later_turns", 100, 1)),
            ("preemptions", r("preemptions", 1, 0)),
            ("offloads", r("offloads", 1, 0)),
            ("restores", r("restores", 1, 0)),
            ("host drops (lru)", r("host_drops", 1, 0)),
            ("restore latency mean (ms)", r("restore_mean_s", 1000, 2)),
            ("host conversations (end)", r("host_conversations_end", 1, 0)),
            ("host MiB in use (end)", r("host_mib_end", 1, 2)),
            ("conversations per GiB host", r("conversations_per_gib", 1, 0)),
            ("KV pages (pool)", r("kv_pages_capacity", 1, 0)),
            ("histories / pool (pages)", r("histories_over_pool", 1, 2))]

    def val(a, spec):
        key, sub, _, _ = spec
        v = a[key] if sub is None else a[key][sub]
        return v

    print("\nHost-tier benchmark (%s)" % cfg)
    print("%-31s %12s %12s %12s %12s %8s %8s" % (
        "", "full KV, off", "full KV, on", "prof, off", "prof, on",
        "full", "prof"))
    for label, spec in rows:
        cells = []
        for name, _ in TIER_RUNS:
            a = runs[name]
            if spec is None:
                cells.append("%d (%d)" % (a["requests"], a["failed"]))
            else:
                cells.append(fmt(val(a, spec), spec[2], spec[3]))
        ratios = []
        for off, on in (("full-off", "full-on"), ("profile-off", "profile-on")):
            if spec is None:
                ratios.append("-")
                continue
            x, y = val(runs[off], spec), val(runs[on], spec)
            ok = isinstance(x, (int, float)) and isinstance(y, (int, float)) \
                and x and not math.isnan(x) and not math.isnan(y)
            ratios.append("%.2fx" % (y / x) if ok else "-")
        print("%-31s %12s %12s %12s %12s %8s %8s" % (
            (label,) + tuple(cells) + tuple(ratios)))
    print("(ratios: tier on / off)")


def run_tier(a, model, work, profile, daemon_args, conv_texts, starts,
             thinks, cfg, page_bytes):
    """The four runs of --workload tier; returns the exit status."""
    runs = {}
    for name, _ in TIER_RUNS:
        host = a.kv_host_memory if name.endswith("-on") else "0"
        runs[name] = serve_and_run(
            name, model, work, profile if name.startswith("profile") else None,
            daemon_args + ["--kv-host-memory", host], conv_texts, starts,
            a.max_tokens, a.timeout, thinks)
        tier_derived(runs[name], page_bytes)
    report_tier(runs, cfg)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": cfg, "args": vars(a), "page_bytes": page_bytes,
                       "runs": runs}, f, indent=1, default=str)
    bad = False
    for name, agg in runs.items():
        if agg["failed"] or not agg["daemon_ok"] or agg["tier_failures"] > 0:
            print("bench_serving: %s run: %d failed requests, %s tier "
                  "failures; %s" % (name, agg["failed"], agg["tier_failures"],
                                    agg["errors"]), file=sys.stderr)
            bad = True
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("TANGRAM_BIN", ""),
                    help="directory of tangramd and tools (TANGRAM_BIN)")
    ap.add_argument("--data", default=os.environ.get("TANGRAM_DATA", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")))
    ap.add_argument("--quick", action="store_true",
                    help="tiny model, 3 conversations of 2 turns")
    ap.add_argument("--num-conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--user-words", default="100,250",
                    help="words per user turn, lo,hi (about as many tokens)")
    ap.add_argument("--max-tokens", type=int, default=64,
                    help="answer length per turn (ignore_eos)")
    ap.add_argument("--request-rate", type=float, default=0.5,
                    help="conversation starts per second (Poisson)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kv-memory", default="12MiB",
                    help="KV pool of the worker, the same for both runs")
    ap.add_argument("--target", type=float, default=None,
                    help="one profile target ratio (same as --targets X)")
    ap.add_argument("--targets", default="0.25",
                    help="profile target ratios, comma-separated (each "
                         "calibrated on the fly)")
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                    help="the workers' backend (and calibration's)")
    ap.add_argument("--shape", default=None,
                    help="NAME[:LAYERS]: the shape of data/configs/"
                         "NAME_config.json (default: a small qwen3)")
    ap.add_argument("--heads-per-group", type=int, default=2)
    ap.add_argument("--calib-samples", type=int, default=8)
    ap.add_argument("--calib-words", type=int, default=300)
    ap.add_argument("--prefill-chunk", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=0,
                    help="the daemon's --max-num-seqs (0: its default)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="client timeout of one request (s)")
    ap.add_argument("--workdir", default=None, help="keep files here")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--workload", choices=("chat", "tier"), default="chat",
                    help="chat: full KV vs profile; tier: the host tier off "
                         "vs on for both (DESIGN.md §4.10), with the tier "
                         "workload's defaults below unless given")
    ap.add_argument("--think-time", type=float, default=None,
                    help="mean pause before each later turn, s (tier: 2)")
    ap.add_argument("--kv-host-memory", default="256MiB",
                    help="host tier per rank of the tier-on runs")
    a = ap.parse_args()
    given = {x.split("=")[0] for x in sys.argv[1:] if x.startswith("--")}

    def default(name, value):
        if "--" + name.replace("_", "-") not in given:
            setattr(a, name, value)
    if a.workload == "tier" and a.quick:
        for k, v in (("num_conversations", 6), ("turns", 2),
                     ("user_words", "20,40"), ("max_tokens", 8),
                     ("request_rate", 4.0), ("kv_memory", "1MiB"),
                     ("prefill_chunk", 64), ("think_time", 0.3),
                     ("timeout", 60.0)):
            default(k, v)
    elif a.workload == "tier":
        for k, v in (("num_conversations", 32), ("turns", 3),
                     ("user_words", "60,120"), ("max_tokens", 32),
                     ("request_rate", 1.0), ("kv_memory", "3MiB"),
                     ("prefill_chunk", 256), ("think_time", 2.0)):
            default(k, v)
    elif a.quick:
        a.num_conversations, a.turns, a.user_words = 3, 2, "10,20"
        a.max_tokens, a.request_rate, a.kv_memory = 8, 4.0, "4MiB"
        a.prefill_chunk, a.timeout = 64, 60.0
    if a.think_time is None:
        a.think_time = 0.0
    du.BIN = a.bin
    du.DATA = a.data
    missing = du.missing_inputs(
        programs=("tangramd", "tangram-router", "tangram-worker",
                  "tangram-make-model", "tangram-profile"),
        modules=[("grpc", "python3-grpcio")])
    if missing:
        return du.fail_missing(missing)
    lo, hi = (int(x) for x in a.user_words.split(","))
    targets = [a.target] if a.target is not None else [
        float(x) for x in a.targets.split(",")]
    work = a.workdir or tempfile.mkdtemp(prefix="tg-bench-serving-")
    os.makedirs(work, exist_ok=True)
    try:
        model = os.path.join(work, "model")
        hp = a.heads_per_group
        shape_name = "hidden-256/4-layer"
        t0 = time.time()
        if a.quick and a.workload == "tier":
            # 16 KiB pages: a 1 MiB pool of 64 holds about two of the
            # quick conversations, so the others go to the host tier.
            du.make_model(model, ["--layers", "4", "--head-dim", "64"])
            shape_name = "tiny, 4 layers, head dim 64"
        elif a.quick:
            du.make_model(model)
            shape_name = "tiny"
        elif not os.path.exists(os.path.join(model, "model.safetensors")):
            args, tok = FULL_MODEL, "qwen3"
            if a.shape:
                name, _, depth = a.shape.partition(":")
                args, tok = du.shape_args(du.config_path(name),
                                          layers=int(depth) if depth else None,
                                          seed=1)
                shape_name = a.shape
            r = subprocess.run(
                [du.prog("tangram-make-model")] + args +
                ["--tokenizer", os.path.join(a.data, "tokenizers", tok),
                 "-o", model], capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError("tangram-make-model: " + r.stderr)
        elif a.shape:
            shape_name = a.shape
        t_make = time.time() - t0
        with open(os.path.join(model, "config.json")) as f:
            mcfg = json.load(f)
        head_dim = mcfg.get("head_dim") or (mcfg["hidden_size"] //
                                            mcfg["num_attention_heads"])
        t0 = time.time()
        profiles = [(t, calibrate(model, work, t, hp,
                                  4 if a.quick else a.calib_samples,
                                  60 if a.quick else a.calib_words,
                                  a.backend)) for t in targets]
        t_cal = time.time() - t0
        conv_texts = make_conversations(a.seed, a.num_conversations, a.turns, lo, hi)
        starts = arrival_times(a.seed, a.num_conversations, a.request_rate)
        thinks = think_times(a.seed, a.num_conversations, a.turns,
                             a.think_time)
        extra = (["--max-num-seqs", str(a.max_num_seqs)]
                 if a.max_num_seqs > 0 else [])
        # The tier workload runs four daemons for many minutes on shared
        # cores: a long step must not read as a dead worker (5 beats).
        daemon_args = extra + ["--backend", a.backend,
                       "--kv-memory", a.kv_memory, "--heads-per-group", str(hp),
                       "--prefill-chunk", str(a.prefill_chunk),
                       "--max-batched-tokens", str(max(1024, a.prefill_chunk)),
                       "--worker-heartbeat-ms",
                       "4000" if a.workload == "tier" else "1000"]
        cfg = ("%s model, %s backend, %d conversations x %d turns, %s words "
               "per user turn, %d output tokens per turn, %.2f conversations/s, "
               "kv-memory %s, prefill-chunk %d, target=%s, model %.1f s, "
               "calibration %.1f s" %
               (shape_name, a.backend, a.num_conversations,
                a.turns, a.user_words, a.max_tokens, a.request_rate, a.kv_memory,
                a.prefill_chunk, ",".join("%.2f" % t for t in targets),
                t_make, t_cal))
        if a.workload == "tier":
            cfg = cfg.replace(" output tokens per turn,",
                              " output tokens per turn, think time %.1f s "
                              "(mean), host tier %s," % (a.think_time,
                                                         a.kv_host_memory))
            # K and V of a page group: H_p heads x 16 tokens x d, fp32 on
            # the CPU backend (bf16 on CUDA: half)
            elem = 2 if a.backend == "cuda" else 4
            return run_tier(a, model, work, profiles[0][1], daemon_args,
                            conv_texts, starts, thinks, cfg,
                            hp * 2 * 16 * head_dim * elem)
        full = serve_and_run("full", model, work, None, daemon_args, conv_texts,
                             starts, a.max_tokens, a.timeout)
        profs = [(t, serve_and_run("profile-%.2f" % t, model, work, path,
                                   daemon_args, conv_texts, starts,
                                   a.max_tokens, a.timeout))
                 for t, path in profiles]
        report(full, profs, cfg)
        out = {"config": cfg, "args": vars(a), "full": full,
               "profile": profs[0][1],
               "profiles": {"%.2f" % t: p for t, p in profs}}
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        bad = False
        for name, agg in [("full", full)] + [("profile %.2f" % t, p)
                                             for t, p in profs]:
            if agg["failed"] or not agg["daemon_ok"] or not agg["http_ok"]:
                print("bench_serving: %s run: %d failed requests; %s" %
                      (name, agg["failed"], agg["errors"]), file=sys.stderr)
                bad = True
        return 1 if bad else 0
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
