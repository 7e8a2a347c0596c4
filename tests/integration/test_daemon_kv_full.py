#!/usr/bin/python3
"""Integration test: a KV pool smaller than the model's context.

Starts tangramd (CPU backend, the tiny qwen3 model, full KV) with
--kv-memory 1MiB, far less than the model's context needs, and checks:

- the advertised context (/v1/models max_model_len, gRPC ModelInfo is the
  same variable) is lowered to what one request can hold,
  floor(pages / (L * G)) * P with pages from tangram_kv_pages_capacity, and
  the router logs that it lowered it;
- a request whose prompt plus max_tokens is over that context is refused
  with 400 before it runs (it used to be admitted, preempted over and over,
  and ended early with finish_reason "length");
- a request that asks for exactly the advertised context runs to its own
  max_tokens and says "length" with every token it asked for; two of them
  at once share the pool by preemption and both still finish whole.

Fails (never skips) when the daemon is not built.
"""
import json
import os
import shutil
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

chk = du.Checker()
PAGE = 16


def complete(d, body):
    st, _, raw = du.http("POST", d.base_url + "/v1/completions",
                         json.dumps(body).encode(),
                         {"Content-Type": "application/json"}, timeout=300)
    return st, du.json_of(raw)


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdkvfull")
    d = None
    try:
        # 4 layers of 64-dim heads: 1 MiB holds 64 pages, 256 tokens.
        model = du.make_model(os.path.join(work, "tiny"),
                              ["--layers", "4", "--head-dim", "64"])
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        layers = cfg["num_hidden_layers"]
        kv_heads = cfg["num_key_value_heads"]
        ctx = cfg["max_position_embeddings"]
        d = du.Daemon(model, work, ["--kv-memory", "1MiB",
                                    "--heads-per-group", str(kv_heads)])
        ready = d.start()
        chk.check(ready, "tangramd starts with a 1 MiB pool",
                  d.log_text()[-3000:])
        if not ready:
            return chk.summary()
        m = du.fetch_metrics(d.base_url)
        pages = int(du.metric(m, "tangram_kv_pages_capacity", rank="0"))
        fit = pages // layers * PAGE  # one group per layer
        st, _, raw = du.http("GET", d.base_url + "/v1/models")
        advertised = du.json_of(raw)["data"][0]["max_model_len"]
        chk.check(fit < ctx and advertised == fit,
                  "max_model_len is what the pool holds for one request "
                  "(%d pages -> %d tokens; model context %d; advertised %s)"
                  % (pages, fit, ctx, advertised))
        chk.check("capped to %d" % fit in d.log_text(),
                  "the router logs that it lowered max_model_len")

        prompt = "one two three four"
        st, tk, raw = du.http("POST", d.base_url + "/tokenize",
                              json.dumps({"prompt": prompt}).encode(),
                              {"Content-Type": "application/json"})
        n_prompt = du.json_of(raw)["count"]
        st, j = complete(d, {"prompt": prompt, "ignore_eos": True,
                             "max_tokens": fit - n_prompt + 1})
        chk.check(st == 400 and du.is_openai_error(json.dumps(j).encode()),
                  "prompt + max_tokens one over the pool's context -> 400 "
                  "(%s %s)" % (st, j))

        want = fit - n_prompt
        results = [None, None]

        def run(i):
            results[i] = complete(d, {"prompt": prompt, "ignore_eos": True,
                                      "max_tokens": want})

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for i, res in enumerate(results):
            ok = res is not None and res[0] == 200
            ch = res[1]["choices"][0] if ok else {}
            got = res[1]["usage"]["completion_tokens"] if ok else None
            chk.check(ok and ch.get("finish_reason") == "length" and
                      got == want,
                      "request %d filling the whole context runs to its own "
                      "max_tokens %d (got %s, %s)" %
                      (i, want, got, ch.get("finish_reason")))
        m = du.fetch_metrics(d.base_url)
        pre = du.metric(m, "tangram_num_preemptions_total") or 0
        print("preemptions while sharing the pool: %s" % pre)
        rc, left = d.stop()
        d = None
        chk.check(rc == 0 and not left, "tangramd stops cleanly")
    finally:
        if d is not None:
            d.stop()
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
