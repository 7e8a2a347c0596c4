#!/usr/bin/python3
"""Keeps tests/bench/bench_serving.py from rotting: runs it with --quick
against the real tangramd (tiny model, full KV then a calibrated profile) and
checks its exit status, its side-by-side table and its JSON results: every
request answered with all its tokens, both daemons stopped cleanly,
latencies and throughputs positive and ordered (p50 <= p90 <= p99), and the
second turns reusing the first turn's KV (cached prompt tokens > 0, as the
history is re-sent token for token). The quick turns are shorter than the
snapkv window (32 forced keys), so the profile saves nothing here and only
consistency is checked; the savings show in the full run
(docs/PERFORMANCE.md). Then the host-tier workload (`--workload tier
--quick`: six conversations of two turns with think time on a 1 MiB pool,
tier off and on for full KV and the profile): every request answered,
offloads and restores only where the tier is on, returning turns reusing
their history there, no tier failure, and the
host tier's table rows. Fails naming the input when the daemon or
python3-grpcio is missing. About 6 s plus a minute.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402


def main():
    missing = du.missing_inputs(modules=[("grpc", "python3-grpcio")])
    if missing:
        return du.fail_missing(missing)
    script = os.path.join(du.SOURCE or os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "..", ".."), "tests", "bench", "bench_serving.py")
    ck = du.Checker()
    with tempfile.TemporaryDirectory(prefix="tg-bench-quick-") as tmp:
        out_json = os.path.join(tmp, "r.json")
        p = subprocess.run([sys.executable, script, "--quick", "--bin", du.BIN,
                            "--data", du.DATA, "--json", out_json],
                           capture_output=True, text=True, timeout=300)
        print(p.stdout)
        ck.check(p.returncode == 0, "bench_serving --quick exits 0",
                 p.stderr[-3000:])
        for label in ("full KV", "profile 0.25", "TTFT p99 (ms)", "ITL p50 (ms)",
                      "TPOT mean (ms)", "request throughput (req/s)",
                      "output throughput (tok/s)", "cached prompt fraction",
                      "host work of a step (%)"):
            ck.check(label in p.stdout, "table shows '%s'" % label)
        try:
            with open(out_json) as f:
                res = json.load(f)
        except (OSError, ValueError) as e:
            ck.check(False, "JSON results written", e)
            return ck.summary()
        for name in ("full", "profile"):
            a = res.get(name) or {}
            n = 3 * 2  # conversations x turns of --quick
            ck.check(a.get("requests") == n and a.get("failed") == 0,
                     "%s: %d requests, none failed" % (name, n),
                     (a.get("requests"), a.get("failed"), a.get("errors")))
            ck.check(a.get("daemon_ok") is True, "%s: daemon stopped cleanly" % name)
            ck.check(a.get("output_tokens") == n * 8,
                     "%s: every answer has its 8 tokens" % name, a.get("output_tokens"))
            for key in ("request_throughput", "output_throughput", "wall_s"):
                v = a.get(key)
                ck.check(isinstance(v, (int, float)) and v > 0 and math.isfinite(v),
                         "%s: %s positive" % (name, key), v)
            hs = (a.get("host_share_router"), a.get("host_share_worker"))
            ck.check(all(isinstance(v, float) and 0 < v < 1 for v in hs) and
                     sum(hs) <= 1,
                     "%s: host work of a step, router and worker shares in "
                     "(0, 1)" % name, hs)
            for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
                s = a.get(key) or {}
                vals = [s.get(k) for k in ("p50", "p90", "p99", "mean")]
                good = all(isinstance(v, (int, float)) and v > 0 for v in vals)
                ck.check(good and s["p50"] <= s["p90"] <= s["p99"],
                         "%s: %s percentiles positive and ordered" % (name, key), s)
            ck.check(a.get("ttft_s", {}).get("p50", 1e9) <= a.get("e2e_s", {}).get(
                "p50", 0), "%s: TTFT below e2e" % name)
            ck.check(a.get("cached_prompt_tokens", 0) > 0 and
                     0 < a.get("cached_fraction", 0) < 1,
                     "%s: second turns reuse cached KV" % name,
                     (a.get("cached_prompt_tokens"), a.get("cached_fraction")))
            ck.check(a.get("preemptions") == 0, "%s: no preemption at this size"
                     % name, a.get("preemptions"))
        tier_workload(ck, script, tmp)
    return ck.summary()


def tier_workload(ck, script, tmp):
    out_json = os.path.join(tmp, "tier.json")
    p = subprocess.run([sys.executable, script, "--quick", "--workload",
                        "tier", "--bin", du.BIN, "--data", du.DATA, "--json",
                        out_json], capture_output=True, text=True, timeout=500)
    print(p.stdout)
    ck.check(p.returncode == 0, "bench_serving --workload tier --quick exits 0",
             p.stderr[-3000:])
    for label in ("full KV, off", "prof, on", "returning-turn TTFT p99 (ms)",
                  "prefill tokens saved", "conversations per GiB host",
                  "restore latency mean (ms)", "histories / pool (pages)"):
        ck.check(label in p.stdout, "tier table shows '%s'" % label)
    try:
        with open(out_json) as f:
            runs = json.load(f)["runs"]
    except (OSError, ValueError, KeyError) as e:
        ck.check(False, "tier JSON results written", e)
        return
    for name in ("full-off", "full-on", "profile-off", "profile-on"):
        a = runs.get(name) or {}
        on = name.endswith("-on")
        ck.check(a.get("requests") == 12 and a.get("failed") == 0 and
                 a.get("daemon_ok") is True,
                 "tier %s: 12 requests, none failed, clean stop" % name,
                 (a.get("requests"), a.get("failed"), a.get("errors")))
        ck.check((a.get("offloads", 0) > 0 and a.get("restores", 0) > 0) == on,
                 "tier %s: offloads and restores only with the tier on" % name,
                 (a.get("offloads"), a.get("restores")))
        if on:
            ck.check(a.get("cached_prompt_tokens", 0) > 0,
                     "tier %s: returning turns reuse their history" % name,
                     a.get("cached_prompt_tokens"))
        ck.check(a.get("tier_failures") == 0, "tier %s: no failed copy" % name)
        if on:
            ck.check(a.get("conversations_per_gib", 0) > 0,
                     "tier %s: conversations per GiB measured" % name)


if __name__ == "__main__":
    sys.exit(main())
