#!/usr/bin/python3
"""What the prompt's log-probabilities cost over the API (docs/
PERFORMANCE.md "Prompt log-probabilities"): the real tangramd on the tiny
qwen3 model (CPU backend, default test flags of daemon_util.Daemon), a
prompt of N token ids (argument, default 1000), max_tokens 1, greedy;
per variant the median of 3 requests (distinct prompts, so nothing is
reused), wall time of the whole HTTP request:
plain, echo + logprobs 1 (lm-evaluation-harness's request),
prompt_logprobs 5, echo + logprobs 20.

Run from the source tree with a build: TANGRAM_BIN=build/bin
TANGRAM_DATA=data python3 tests/bench/bench_prompt_logprobs.py 1000
"""
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "integration"))
import daemon_util as du  # noqa: E402

VARIANTS = (("plain", {}), ("echo+logprobs 1", {"echo": True, "logprobs": 1}),
            ("prompt_logprobs 5", {"prompt_logprobs": 5}),
            ("echo+logprobs 20", {"echo": True, "logprobs": 20}))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory() as w:
        m = du.make_model(os.path.join(w, "m"))
        d = du.Daemon(m, w)
        if not d.start():
            print(d.log_text()[-2000:])
            return 1
        try:
            for k in range(3):  # warm-up
                du.http("POST", d.base_url + "/v1/completions",
                        {"model": "m", "prompt": [100 + k] * 8,
                         "max_tokens": 1})
            for vi, (name, extra) in enumerate(VARIANTS):
                ts, size = [], 0
                for r in range(3):
                    ids = [(i * 37 + 11 * r + 101 * vi) % 3000 + 100
                           for i in range(n)]
                    body = dict({"model": "m", "prompt": ids,
                                 "max_tokens": 1, "temperature": 0}, **extra)
                    t = time.time()
                    st, _, raw = du.http("POST", d.base_url +
                                         "/v1/completions", body, timeout=600)
                    ts.append(time.time() - t)
                    if st != 200:
                        print(name, st, raw[:300])
                        return 1
                    size = len(raw)
                med = statistics.median(ts)
                print("%-18s prompt %d: median %.3f s (%.0f prompt tokens/s), "
                      "body %d bytes" % (name, n, med, n / med, size),
                      flush=True)
        finally:
            d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
