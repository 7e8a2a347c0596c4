#!/usr/bin/python3
"""OpenAI request parameters against the real tangramd, through the official
OpenAI Node client (npm `openai`, tests/integration/clients/
openai_params.mjs) and raw HTTP:

- logit_bias: +100 on a token makes every generated token that token
  (greedy and sampled, completions and chat, streamed and not); -100 on the
  greedy first token changes it; ids outside the vocabulary and values
  outside [-100, 100] are 400 naming the entry.
- echo (completions): the text starts with the prompt and continues with
  what the same request without echo generates; streamed the same; usage
  unchanged; echo with logprobs streamed is 400 (the prompt's
  log-probabilities are test_daemon_prompt_logprobs.py's); a prompt sent as token ids is
  echoed decoded.
- a response_format schema with an unsupported keyword and n = 17 (over
  the limit of 16) are 400
  with the parameter named.
- top_k / top_p (raw HTTP): top_k 1 at temperature 1 is greedy; with top_k
  3 and top_p 0.5 every sampled token is in the nucleus of the
  renormalised top 3, rebuilt from the returned raw logprobs.

Fails, naming them, when node/npm or the daemon are missing.
"""
import json
import math
import os
import shutil
import subprocess
import sys

import daemon_util as du

KEY = "sk-tangram-params"
MODEL = "tiny"
PROMPT = "The quick brown fox"
chk = du.Checker()


def post(d, path, body):
    st, _, raw = du.http("POST", d.base_url + path, body,
                         headers={"Authorization": "Bearer " + KEY})
    return st, du.json_of(raw), raw.decode(errors="replace")


def ids_of(d, text):
    st, j, raw = post(d, "/tokenize", {"model": MODEL, "prompt": text,
                                       "add_special_tokens": False})
    assert st == 200, raw
    return j["tokens"]


def text_of(d, ids):
    st, j, raw = post(d, "/detokenize", {"model": MODEL, "tokens": ids})
    assert st == 200, raw
    return j["prompt"]


def complete(d, **kw):
    body = dict({"model": MODEL, "prompt": PROMPT, "max_tokens": 4,
                 "temperature": 0, "ignore_eos": True}, **kw)
    return post(d, "/v1/completions", body)


def t_http(d, force):
    """Raw HTTP: what the Node client cannot send or see."""
    st, j, raw = complete(d, logit_bias={str(force): 100}, logprobs=0)
    chk.check(st == 200, "logit_bias with logprobs: 200", raw[:300])
    if st == 200:
        lp = j["choices"][0]["logprobs"]["token_logprobs"]
        # Raw logprobs: a forced token keeps its unbiased probability,
        # which on a 151k vocabulary is far below 1.
        chk.check(all(x < -1.0 for x in lp),
                  "logprobs stay those of the raw logits under a +100 bias",
                  lp)
    ids = ids_of(d, PROMPT)
    st, j, raw = complete(d, prompt=ids, echo=True)
    st2, j2, raw2 = complete(d, prompt=ids)
    chk.check(st == 200 and st2 == 200 and
              j["choices"][0]["text"] == text_of(d, ids) +
              j2["choices"][0]["text"],
              "echo of a prompt sent as token ids is the decoded prompt",
              raw[:300])
    st, j, raw = complete(d, logit_bias={"5": 100, "05": 1})
    chk.check(st == 400 and j["error"]["param"] == "logit_bias",
              "logit_bias naming one token twice -> 400", raw[:300])
    st, j, raw = post(d, "/v1/chat/completions",
                      {"model": MODEL, "max_tokens": 2, "echo": True,
                       "messages": [{"role": "user", "content": "hi"}]})
    chk.check(st == 400 and j["error"]["param"] == "echo",
              "chat echo -> 400 naming echo", raw[:300])


def t_top_k(d):
    """top_k and top_p through the daemon (raw HTTP, completions):
    top_k 1 at temperature 1 is the greedy output; with temperature 1,
    top_k 3 and top_p 0.5 every sampled token lies in the nucleus of the
    top 3 renormalised (vLLM's order: top-p sees the softmax of what top-k
    left), rebuilt from the returned raw top-3 logprobs (at temperature 1
    without penalties they are the logits the sampler filters). A nucleus
    measured over the whole vocabulary would keep all three here, the
    vocabulary being large and the tiny model's distribution flat."""
    st, g, raw = complete(d, max_tokens=12)
    st1, k1, raw1 = complete(d, max_tokens=12, temperature=1.0, top_k=1,
                             seed=3)
    chk.check(st == 200 and st1 == 200 and
              k1["choices"][0]["text"] == g["choices"][0]["text"],
              "top_k 1 at temperature 1 is greedy", (raw[:200], raw1[:200]))
    st, j, raw = complete(d, max_tokens=48, temperature=1.0, top_k=3,
                          top_p=0.5, seed=11, logprobs=3)
    if not chk.check(st == 200, "top_k 3, top_p 0.5: 200", raw[:300]):
        return
    lp = j["choices"][0]["logprobs"]
    outside, judged = [], 0
    for i, (chosen, tops) in enumerate(zip(lp["token_logprobs"],
                                           lp["top_logprobs"])):
        vals = sorted((tops or {}).values(), reverse=True)
        if len(vals) != 3:
            continue  # two of the top 3 print alike (lossy bytes)
        w = [math.exp(v - vals[0]) for v in vals]
        cum, kept = 0.0, 3
        for n, x in enumerate(w):
            cum += x / sum(w)
            if abs(cum - 0.5) < 1e-4:
                kept = None  # too close to the edge to judge
                break
            if cum >= 0.5:
                kept = n + 1
                break
        if kept is None:
            continue
        judged += 1
        if chosen < vals[kept - 1] - 1e-5:
            outside.append((i, chosen, vals, kept))
    chk.check(judged >= 24 and not outside,
              "top_k 3, top_p 0.5: every sampled token is in the nucleus of "
              "the renormalised top 3 (%d steps judged)" % judged, outside)


def t_node(d, force, ban):
    root, why = du.node_clients(["openai_params.mjs"])
    if root is None:
        chk.check(False, "the OpenAI Node client is available", why)
        return
    r = subprocess.run(["node", os.path.join(root, "openai_params.mjs"),
                        d.base_url + "/v1", MODEL,
                        json.dumps({"force": force, "ban": ban})],
                       capture_output=True, text=True, timeout=180, cwd=root,
                       env=dict(os.environ, OPENAI_API_KEY=KEY))
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not chk.check(r.returncode == 0 and isinstance(j, dict) and
                     "error" not in j, "node: every request returned",
                     r.stdout[-1500:] + r.stderr[-800:]):
        return
    want4 = text_of(d, [force] * 4)
    chk.check(j["forced"]["text"] == want4,
              "node: logit_bias +100 forces every token (greedy)",
              (j["forced"], want4))
    chk.check(j["forced_stream"]["text"] == want4 and
              j["forced_stream"]["usage"]["completion_tokens"] == 4,
              "node: the same streamed", j["forced_stream"])
    chk.check(j["forced_hot"]["text"] == want4,
              "node: logit_bias +100 forces every token at temperature 1",
              j["forced_hot"])
    chk.check(j["chat_forced"]["content"] == text_of(d, [force] * 3),
              "node: logit_bias on a chat completion", j["chat_forced"])
    plain1 = text_of(d, ids_of(d, j["plain"]["text"])[:1])
    chk.check(not j["banned"]["text"].startswith(plain1) or plain1 == "",
              "node: logit_bias -100 on the greedy token changes it",
              (j["banned"], j["plain"], plain1))
    chk.check(j["plain"]["text"] != j["forced"]["text"],
              "node: without the bias the text differs", j["plain"])

    e = j["echo"]
    chk.check(e["text"] == PROMPT + j["plain"]["text"] and
              e["usage"] == j["plain"]["usage"],
              "node: echo = prompt + the same completion, same usage",
              (e, j["plain"]))
    chk.check(j["echo_stream"]["text"] == e["text"] and
              j["echo_stream"]["usage"]["prompt_tokens"] ==
              e["usage"]["prompt_tokens"],
              "node: echo streamed starts with the prompt too",
              j["echo_stream"])
    for k, param, what in (
            ("echo_logprobs", "echo", "echo with logprobs streamed"),
            ("json_schema", "response_format.json_schema.schema",
             "response_format schema with an unsupported keyword"),
            ("bias_range", "logit_bias.99999999",
             "logit_bias outside the vocabulary"),
            ("bias_value", "logit_bias.%d" % force, "logit_bias value 150"),
            ("n17", "n", "n = 17")):
        x = j[k]
        chk.check(x["threw"] and x["status"] == 400 and x["bad_request"] and
                  x["param"] == param,
                  "node: %s -> BadRequestError naming %s" % (what, param), x)


def main():
    missing = du.missing_inputs(tools=["node", "npm"])
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdparams")
    d = None
    try:
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, work, api_key=KEY)
        ready = d.start()
        chk.check(ready, "tangramd starts", d.log_text()[-3000:])
        if ready:
            force = ids_of(d, " the")[0]
            st, j, raw = complete(d, max_tokens=1)
            chk.check(st == 200, "a greedy completion", raw[:300])
            ban = ids_of(d, j["choices"][0]["text"]) if st == 200 else []
            t_http(d, force)
            t_top_k(d)
            t_node(d, force, ban or [0])
    finally:
        if d is not None:
            rc, left = d.stop()
            chk.check(rc == 0 and not left, "tangramd exits 0 on SIGTERM")
            san = d.sanitizer_reports()
            chk.check(not san, "no sanitizer report in the daemon's log",
                      "\n".join(san[:10]))
            if chk.failures:
                print("---- tangramd log (tail) ----")
                print(d.log_text()[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
