#!/usr/bin/python3
"""The prompt's log-probabilities over the API (docs/API.md "Prompt
log-probabilities") against the real tangramd on the CPU backend, checked
against `tangram-generate --prompt-logprobs` (the offline engine, same
chunked compressed prefill, DESIGN.md §4.3) on the tiny qwen3 model:

- lm-evaluation-harness's loglikelihood request (what its
  local-completions model sends: the context + continuation as token ids,
  echo true, logprobs 1, max_tokens 1, temperature 0): token_logprobs
  has one entry per prompt token plus the generated one, null first;
  tokens / text_offset / top_logprobs line up; the values at positions
  1 .. n-1 equal tangram-generate's within 1e-4 nat (the same kernels;
  the bound only absorbs a different thread split), for --profile none
  and for a compressing profile (ratio 0.5, prefill chunk 64, so the
  later chunks read the compressed KV of the earlier ones: a prompt of
  150 ids is three chunks); the harness's own arithmetic (sum of
  token_logprobs[ctxlen:-1], greedy = every token equals its top-1) gives
  the reference's sum. The compressing profile's values differ from full
  KV's somewhere (the test can tell the two apart).
- loglikelihood_rolling's shape (max_tokens 0): n entries, finish_reason
  "length", no completion tokens, the text is the prompt.
- vLLM's prompt_logprobs: k: null first, then per position a dict keyed
  by token id holding the prompt token (its logprob equal to
  token_logprobs', its rank) and the k most likely ids (ranks 1..k, the
  top one's value equal to top_logprobs' best).
- A text prompt and a chat request with prompt_logprobs are scored too.
- A batch of prompts (lm-evaluation-harness's batches: "prompt" a list of
  id lists) with echo + logprobs: one choice per prompt, index i for
  prompt i, each with its own prompt's reference values; usage sums the
  prompts. A batch of two texts is answered too.
- Refusals (400 naming the parameter): echo + logprobs with stream, with
  n = 2; prompt_logprobs above 20; a batch with stream, with n = 2.
- The official OpenAI Node client (tests/integration/clients/
  openai_echo.mjs): completions.create with echo and logprobs (max_tokens
  1 and 0) parses the answer, with the reference's values.
- gRPC: Generate with prompt_logprobs 2 and max_tokens 0 (and 1): the
  final message holds positions 1..n-1 with the reference's values, ranks
  and at most 2 alternatives; max_tokens 0 without it is INVALID_ARGUMENT.
- The same request twice: equal values (a prompt's stored KV is never
  adopted for scoring: the second is computed again, cached_tokens 0).

Fails, naming it, when a program is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()
CHUNK = 64
# Same kernels on both sides; the worker may split threads differently.
TOL = 1e-4


def prompt_ids(k, n):
    return [(i * (37 + 2 * k) + 11 * k + 5) % 3000 + 100 for i in range(n)]


def generate(model, prof, ids, extra=None):
    r = subprocess.run(
        [du.prog("tangram-generate"), "--model", model, "--profile", prof,
         "--prompt-ids", json.dumps(ids), "--max-tokens", "0",
         "--prompt-logprobs", "--prefill-chunk", str(CHUNK),
         "--heads-per-group", "1", "--json"] + (extra or []),
        capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None, r.stderr[-500:]
    return json.loads(r.stdout)["prompt_logprobs"], None


def post(d, path, body):
    st, _, raw = du.http("POST", d.base_url + path, body, timeout=300)
    return st, du.json_of(raw), raw.decode(errors="replace")


def complete(d, **kw):
    body = dict({"model": "model", "temperature": 0}, **kw)
    return post(d, "/v1/completions", body)


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def check_loglikelihood(d, name, ids, ref):
    n = len(ids)
    st, j, raw = complete(d, prompt=ids, echo=True, logprobs=1, max_tokens=1)
    if not C.check(st == 200 and j, "%s: echo + logprobs 1 answered 200" %
                   name, raw[:500]):
        return None
    ch = j["choices"][0]
    lp = ch["logprobs"]
    C.check(len(lp["token_logprobs"]) == n + 1 and
            len(lp["tokens"]) == n + 1 and len(lp["text_offset"]) == n + 1
            and len(lp["top_logprobs"]) == n + 1,
            "%s: one entry per prompt token and the generated one" % name,
            {k: len(v) for k, v in lp.items()})
    C.check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None,
            "%s: the first token has no log-probability" % name)
    C.check(all(a <= b for a, b in zip(lp["text_offset"],
                                       lp["text_offset"][1:])),
            "%s: text_offset never decreases" % name, lp["text_offset"])
    got = lp["token_logprobs"][1:n]
    diff = max_diff(got, ref[1:])
    C.check(diff <= TOL, "%s: prompt log-probabilities equal "
            "tangram-generate's (max |diff| %.2g <= %g)" % (name, diff, TOL))
    tops = lp["top_logprobs"][1:n]
    C.check(all(len(t) == 1 and max(t.values()) >= v - 1e-6
                for t, v in zip(tops, got)),
            "%s: each position's top-1 is at least the prompt token's" % name)
    # lm-evaluation-harness's arithmetic for a context of half the prompt.
    ctx = n // 2
    s = sum(lp["token_logprobs"][ctx:-1])
    want = sum(ref[ctx:])
    C.check(abs(s - want) <= TOL * n, "%s: the harness's continuation sum "
            "%.6f equals the reference's %.6f" % (name, s, want))
    greedy = all(tok == max(t, key=t.get) for tok, t in
                 zip(lp["tokens"][ctx:-1], lp["top_logprobs"][ctx:-1]))
    ref_greedy = all(abs(t_v - max(t.values())) <= 1e-6
                     for t_v, t in zip(lp["token_logprobs"][ctx:-1],
                                       lp["top_logprobs"][ctx:-1]))
    C.check(greedy == ref_greedy, "%s: is_greedy by text agrees with the "
            "values" % name)
    C.check(j["usage"]["completion_tokens"] == 1 and
            j["usage"]["prompt_tokens"] == n and
            j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
            "%s: usage (no stored KV adopted)" % name, j["usage"])
    return got


def check_rolling(d, name, ids, ref):
    n = len(ids)
    st, j, raw = complete(d, prompt=ids, echo=True, logprobs=0, max_tokens=0)
    if not C.check(st == 200 and j, "%s: max_tokens 0 answered 200" % name,
                   raw[:500]):
        return
    ch = j["choices"][0]
    lp = ch["logprobs"]
    C.check(len(lp["token_logprobs"]) == n, "%s: max_tokens 0 gives n "
            "entries" % name, len(lp["token_logprobs"]))
    C.check(ch["finish_reason"] == "length" and
            j["usage"]["completion_tokens"] == 0,
            "%s: finish length, no completion tokens" % name,
            (ch["finish_reason"], j["usage"]))
    C.check(max_diff(lp["token_logprobs"][1:], ref[1:]) <= TOL,
            "%s: rolling values equal the reference" % name)
    st, dj, _ = post(d, "/detokenize", {"model": "model", "tokens": ids})
    C.check(st == 200 and ch["text"] == dj.get("prompt"),
            "%s: the text is the prompt" % name)
    C.check(all(t is None for t in lp["top_logprobs"]),
            "%s: logprobs 0: no alternatives" % name)


def check_vllm(d, name, ids, ref):
    n = len(ids)
    st, j, raw = complete(d, prompt=ids, prompt_logprobs=3, max_tokens=1,
                          logprobs=1)
    if not C.check(st == 200 and j, "%s: prompt_logprobs 3 answered 200" %
                   name, raw[:500]):
        return
    pl = j["choices"][0].get("prompt_logprobs")
    if not C.check(isinstance(pl, list) and len(pl) == n and pl[0] is None,
                   "%s: prompt_logprobs has n entries, null first" % name,
                   str(pl)[:300]):
        return
    ok_tok, ok_top, ok_rank = True, True, True
    for i in range(1, n):
        e = pl[i]
        mine = e.get(str(ids[i]))
        if mine is None or abs(mine["logprob"] - ref[i]) > TOL:
            ok_tok = False
        ranked = sorted(e.values(), key=lambda v: v["rank"])
        if [v["rank"] for v in ranked if v is not mine][:3] != [1, 2, 3] and \
                mine is not None and mine["rank"] > 3:
            ok_top = False
        best = max(v["logprob"] for v in e.values())
        if mine is not None and (mine["rank"] == 1) != (
                mine["logprob"] >= best - 1e-6):
            ok_rank = False
    C.check(ok_tok, "%s: prompt_logprobs hold each prompt token with the "
            "reference's value" % name)
    C.check(ok_top, "%s: prompt_logprobs hold the top 3 (ranks 1..3)" % name)
    C.check(ok_rank, "%s: rank 1 exactly where the prompt token is the most "
            "likely" % name)


def check_batch(d, name, pairs):
    """pairs: [(ids, ref)] answered in one request, in order."""
    prompts = [p for p, _ in pairs]
    st, j, raw = complete(d, prompt=prompts, echo=True, logprobs=1,
                          max_tokens=1)
    if not C.check(st == 200 and j and len(j.get("choices", [])) ==
                   len(pairs), "%s: a batch of %d prompts answered with one "
                   "choice each" % (name, len(pairs)), raw[:500]):
        return
    ok_index, ok_vals = True, True
    for k, (ch, (ids, ref)) in enumerate(zip(j["choices"], pairs)):
        n = len(ids)
        lp = ch["logprobs"]["token_logprobs"]
        ok_index &= ch["index"] == k
        ok_vals &= (len(lp) == n + 1 and lp[0] is None and
                    max_diff(lp[1:n], ref[1:]) <= TOL)
    C.check(ok_index, "%s: the batch's choices carry index 0..%d in prompt "
            "order" % (name, len(pairs) - 1),
            [c["index"] for c in j["choices"]])
    C.check(ok_vals, "%s: each prompt of the batch scored with its own "
            "reference values" % name)
    C.check(j["usage"]["prompt_tokens"] == sum(len(p) for p in prompts) and
            j["usage"]["completion_tokens"] == len(pairs),
            "%s: the batch's usage sums its prompts" % name, j["usage"])
    st, j, raw = complete(d, prompt=["The quick brown fox", "Lorem ipsum"],
                          max_tokens=2)
    C.check(st == 200 and j and [c["index"] for c in j["choices"]] == [0, 1]
            and all(isinstance(c["text"], str) for c in j["choices"]),
            "%s: a batch of two texts answered" % name, raw[:400])


def check_refusals(d, ids):
    cases = [
        ("stream", dict(prompt=ids, echo=True, logprobs=1, max_tokens=1,
                        stream=True), "echo"),
        ("n = 2", dict(prompt=ids, echo=True, logprobs=1, max_tokens=1, n=2),
         "echo"),
        ("prompt_logprobs 21", dict(prompt=ids, prompt_logprobs=21,
                                    max_tokens=1), "prompt_logprobs"),
        ("a batch streamed", dict(prompt=[ids, ids], echo=True, logprobs=1,
                                  max_tokens=1, stream=True), "stream"),
        ("a batch with n = 2", dict(prompt=[ids, ids], max_tokens=1, n=2),
         "n"),
        ("max_tokens 0 without echo", dict(prompt=ids, max_tokens=0),
         "max_tokens"),
    ]
    for what, body, param in cases:
        st, j, raw = complete(d, **body)
        C.check(st == 400 and j and j["error"].get("param") == param,
                "refused: %s (400 naming %s)" % (what, param), raw[:300])


def check_node(d, ids, ref):
    root, why = du.node_clients(["openai_echo.mjs"])
    if root is None:
        C.check(False, "the OpenAI Node client is available", why)
        return
    r = subprocess.run(["node", os.path.join(root, "openai_echo.mjs"),
                        d.base_url + "/v1", "model", json.dumps(ids)],
                       capture_output=True, text=True, timeout=300, cwd=root)
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not C.check(r.returncode == 0 and isinstance(j, dict) and
                   "error" not in j, "node: completions.create with echo and "
                   "logprobs returned", r.stdout[-1500:] + r.stderr[-800:]):
        return
    n = len(ids)
    one, zero = j["one"], j["zero"]
    C.check(len(one["token_logprobs"]) == n + 1 and
            one["token_logprobs"][0] is None and
            max_diff(one["token_logprobs"][1:n], ref[1:]) <= TOL and
            len(one["tokens"]) == n + 1 and len(one["text_offset"]) == n + 1,
            "node: echo + logprobs parsed with the reference's values")
    C.check(len(zero["token_logprobs"]) == n and
            zero["finish_reason"] == "length" and
            zero["usage"]["completion_tokens"] == 0,
            "node: max_tokens 0 parsed", {k: zero[k] for k in
                                          ("finish_reason", "usage")})


def check_grpc(d, name, ids, ref, work):
    try:
        import grpc
    except ImportError:
        C.check(False, "Python module grpc (Debian package python3-grpcio)")
        return
    pb = du.load_tangram_pb2(work)
    if not C.check(pb is not None, "protoc generates tangram_pb2"):
        return
    ch = grpc.insecure_channel(d.grpc_target)
    gen = ch.unary_stream("/tangram.v1.Generation/Generate",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.GenerateResponse.FromString)
    try:
        for mt in (0, 1):
            req = pb.GenerateRequest(prompt_token_ids=ids, prompt_logprobs=2)
            req.sampling.CopyFrom(pb.SamplingParams(max_tokens=mt,
                                                    temperature=0.0))
            msgs = list(gen(req, timeout=300))
            last = msgs[-1]
            pl = list(last.prompt_logprobs)
            got = [x.logprob for x in pl]
            C.check(len(pl) == len(ids) - 1 and
                    [x.token_id for x in pl] == ids[1:] and
                    max_diff(got, ref[1:]) <= TOL and
                    all(x.rank >= 1 and len(x.top) == 2 for x in pl) and
                    all(x.rank > 1 or x.top[0].logprob == x.logprob
                        for x in pl) and
                    sum(len(m.token_ids) for m in msgs) == mt and
                    last.usage.completion_tokens == mt,
                    "%s: gRPC prompt_logprobs with max_tokens %d" % (name, mt),
                    (len(pl), len(ids), [len(m.token_ids) for m in msgs]))
        req = pb.GenerateRequest(prompt_token_ids=ids)
        req.sampling.CopyFrom(pb.SamplingParams(max_tokens=0))
        try:
            list(gen(req, timeout=60))
            C.check(False, "gRPC max_tokens 0 without prompt_logprobs is "
                    "refused")
        except grpc.RpcError as e:
            C.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                    "gRPC max_tokens 0 without prompt_logprobs is "
                    "INVALID_ARGUMENT", e.details())
    except grpc.RpcError as e:
        C.check(False, "%s: gRPC Generate" % name, "%s %s" % (e.code(),
                                                             e.details()))
    finally:
        ch.close()


def serve(model, prof, name, work, ids, ref, others):
    d = du.Daemon(model, work, profile=prof, args=[
        "--heads-per-group", "1", "--prefill-chunk", str(CHUNK)])
    if not C.check(d.start(), "%s: tangramd ready" % name,
                   d.log_text()[-3000:]):
        d.stop()
        return None
    try:
        got = check_loglikelihood(d, name, ids, ref)
        again = check_loglikelihood(d, name + " (again)", ids, ref)
        C.check(got is not None and got == again, "%s: the same request "
                "twice gives the same values" % name)
        check_rolling(d, name, ids, ref)
        check_vllm(d, name, ids, ref)
        for k, (oids, oref) in enumerate(others):
            check_loglikelihood(d, "%s prompt %d" % (name, k), oids, oref)
        check_batch(d, name, [(ids, ref)] + list(others))
        check_grpc(d, name, ids, ref, work)
        if prof == "none":
            check_node(d, ids, ref)
            check_refusals(d, ids)
            st, j, raw = complete(d, prompt="The quick brown fox jumps",
                                  echo=True, logprobs=2, max_tokens=0)
            C.check(st == 200 and j and j["choices"][0]["text"] ==
                    "The quick brown fox jumps" and
                    j["choices"][0]["logprobs"]["token_logprobs"][0] is None
                    and all(isinstance(x, float) for x in
                            j["choices"][0]["logprobs"]["token_logprobs"][1:]),
                    "text prompt: echoed and scored", raw[:400])
            st, j, raw = post(d, "/v1/chat/completions", {
                "model": "model", "max_tokens": 1, "prompt_logprobs": 1,
                "messages": [{"role": "user", "content": "Hi there"}]})
            pl = (j or {}).get("prompt_logprobs")
            C.check(st == 200 and isinstance(pl, list) and len(pl) ==
                    j["usage"]["prompt_tokens"] and pl[0] is None and
                    all(isinstance(x, dict) for x in pl[1:]),
                    "chat: prompt_logprobs beside the choices", raw[:400])
        d.check_alive(C)
    finally:
        d.stop_checked(C)
    return got


def main():
    missing = du.missing_inputs(du.ALL_PROGRAMS)
    if missing:
        return du.fail_missing(missing)
    with tempfile.TemporaryDirectory() as work:
        model = du.make_model(os.path.join(work, "model"))
        prof = du.make_skewed_profile(work, 2, 2, 16, 5)
        ids = prompt_ids(0, 150)
        others = [prompt_ids(1, 70), prompt_ids(2, 9)]
        full = {}
        for name, p in (("full KV", "none"), ("ratio 0.5", prof)):
            ref, err = generate(model, p, ids)
            if not C.check(ref is not None, "%s: tangram-generate "
                           "--prompt-logprobs" % name, err):
                continue
            oth = []
            for o in others:
                r, err = generate(model, p, o)
                if C.check(r is not None, "%s: tangram-generate" % name, err):
                    oth.append((o, r))
            full[name] = ref
            wd = os.path.join(work, name.replace(" ", ""))
            os.makedirs(wd)
            serve(model, p, name, wd, ids, ref, oth)
        if len(full) == 2:
            C.check(max_diff(full["full KV"][1:], full["ratio 0.5"][1:]) >
                    1e-3, "the compressing profile moves the values (the "
                    "test tells it from full KV)")
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
