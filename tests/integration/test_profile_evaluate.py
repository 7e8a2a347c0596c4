#!/usr/bin/python3
"""`tangram-profile evaluate` (docs/PROFILES.md "Choosing a profile") on the
tiny qwen3 model, CPU backend, prefill chunk 64, page size 4:

- conversations in the OpenAI messages shape and the ShareGPT
  `conversations` shape are read; one without an assistant turn is
  counted as skipped;
- full KV's own rows report zero differences (dNLL 0, top-1 agreement 1,
  KL 0, greedy agreement = the continuation, memory saved 0);
- a ratio-1.0 profile (every head's budget 1) equals full KV exactly;
- --ratio 1.0,0.5 (profiles calibrated in process on --samples): the
  ratio-1.0 one equals full KV exactly, the ratio-0.5 one equals, value
  for value, evaluating the profile file `tangram-profile calibrate
  --ratio 0.5` writes from the same samples (and saves memory);
- a ratio-0.5 profile's mean NLL per turn index equals an independent
  computation: each turn rendered with tangram-template (the messages
  through the reply; the messages before it with the generation prompt
  locate the reply), tokenized with tangram-tokenize, scored with
  tangram-generate --prompt-logprobs over the same chunks and profile;
  so does full KV's; it saves memory (> 0) and moves the values;
- --json and --plot write a report and an SVG with one point per profile;
- SIGINT during the run: exit status 130, the partial report written
  (interrupted true);
- usage errors: --plot of a .png, no --profile and no --ratio, a ratio
  outside (0, 1], --ratio with --method gvote.

Fails, naming it, when a program is missing.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()
CHUNK = 64
PAGE = 4
CONT = 4
WORDS = ("the cat sat on a mat and then went to see the old dog who lived "
         "near the river bank with many friends from town").split()


def sentence(k, n):
    return " ".join(WORDS[(k * 7 + i * 3) % len(WORDS)] for i in range(n))


def conversations():
    out = []
    for c in range(2):
        msgs = [{"role": "system", "content": "Be brief."}]
        for t in range(2):
            msgs.append({"role": "user", "content": sentence(c + t, 40)})
            msgs.append({"role": "assistant",
                         "content": sentence(c * 5 + t + 1, 48)})
        out.append({"messages": msgs})
    out.append({"conversations": [
        {"from": "human", "value": sentence(9, 40)},
        {"from": "gpt", "value": sentence(10, 40)}]})
    out.append({"messages": [{"role": "user", "content": "no reply"}]})
    return out


def as_messages(conv):
    if "messages" in conv:
        return conv["messages"]
    role = {"human": "user", "gpt": "assistant", "system": "system"}
    return [{"role": role[m["from"]], "content": m["value"]}
            for m in conv["conversations"]]


def ids_of(model, msgs, gen):
    args = [du.prog("tangram-template"), "--model", model]
    if not gen:
        args.append("--no-generation-prompt")
    r = subprocess.run(args, input=json.dumps({"messages": msgs}),
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("tangram-template: " + r.stderr)
    t = subprocess.run([du.prog("tangram-tokenize"), "--tokenizer", model],
                       input=r.stdout, capture_output=True, text=True,
                       timeout=60)
    if t.returncode != 0:
        raise RuntimeError("tangram-tokenize: " + t.stderr)
    return json.loads(t.stdout)


def independent(model, prof, convs):
    """Mean NLL of the assistant tokens per turn index, from
    tangram-generate's prompt log-probabilities."""
    sums, counts = {}, {}
    for conv in convs:
        msgs = as_messages(conv)
        turn = 0
        for i, m in enumerate(msgs):
            if m["role"] != "assistant" or i == 0:
                continue
            req = ids_of(model, msgs[:i], True)
            full = ids_of(model, msgs[:i + 1], False)
            if full[:len(req)] != req:
                raise RuntimeError("the request is not a prefix")
            r = subprocess.run(
                [du.prog("tangram-generate"), "--model", model, "--profile",
                 prof, "--prompt-ids", json.dumps(full), "--max-tokens", "0",
                 "--prompt-logprobs", "--prefill-chunk", str(CHUNK),
                 "--page-size", str(PAGE), "--json"],
                capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise RuntimeError("tangram-generate: " + r.stderr[-300:])
            lp = json.loads(r.stdout)["prompt_logprobs"]
            sums[turn] = sums.get(turn, 0.0) - sum(lp[len(req):len(full)])
            counts[turn] = counts.get(turn, 0) + len(full) - len(req)
            turn += 1
    return [sums[t] / counts[t] for t in sorted(sums)]


def write_full_profile(path):
    layers = [{"mean": [1.0, 1.0], "std": [0.0, 0.0], "budget": [1.0, 1.0],
               "groups": [[0], [1]]} for _ in range(2)]
    with open(path, "w") as f:
        json.dump({"format": "tangram-profile", "version": 1,
                   "model": {"architecture": "Qwen3ForCausalLM",
                             "num_layers": 2, "num_kv_heads": 2,
                             "head_dim": 16},
                   "method": "snapkv", "target_ratio": 1.0, "alpha": 2.0,
                   "samples": 1, "heads_per_group": 1, "layers": layers}, f)


def evaluate(model, data, profiles, out_json, plot=None, extra=None,
             chunk=CHUNK):
    cmd = [du.prog("tangram-profile"), "evaluate", "--model", model, "--data",
           data, "--prefill-chunk", str(chunk), "--page-size", str(PAGE),
           "--continuation", str(CONT), "--json", out_json]
    for p in profiles:
        cmd += ["--profile", p]
    if plot:
        cmd += ["--plot", plot]
    return cmd + (extra or [])


SAMPLE_KEYS = ("nll", "nll_full", "delta_nll", "tokens", "turns", "pages",
               "memory_saved", "greedy_agreement", "top1_agreement", "kl")


def check_ratios(model, data, w):
    """--ratio 1.0,0.5 beside the profile file `calibrate --ratio 0.5`
    writes from the same samples. Chunks of 128: of a chunk of 64, 36 keys
    are forced (the last 32 and 4 sinks), so every budget up to 0.56 would
    keep the same keys and hide a profile that differs."""
    samples = os.path.join(w, "samples.jsonl")
    with open(samples, "w") as f:
        for k in range(4):
            # 300 words: the 36 forced keys are a small part of each, so
            # the ratio, not the forced keys, decides the budgets.
            f.write(json.dumps({"text": sentence(20 + k, 300)}) + "\n")
    made = os.path.join(w, "cal05.json")
    r = subprocess.run([du.prog("tangram-profile"), "calibrate", "--model",
                        model, "--samples", samples, "--ratio", "0.5",
                        "--heads-per-group", "1", "-o", made],
                       capture_output=True, text=True, timeout=600)
    if not C.check(r.returncode == 0, "calibrate --ratio 0.5 exits 0",
                   r.stderr[-1000:]):
        return
    out = os.path.join(w, "ratios.json")
    r = subprocess.run(evaluate(model, data, [made], out,
                                extra=["--ratio", "1.0,0.5", "--samples",
                                       samples, "--heads-per-group", "1"],
                                chunk=128),
                       capture_output=True, text=True, timeout=1200)
    if not C.check(r.returncode == 0, "evaluate --ratio 1.0,0.5 exits 0",
                   r.stderr[-2000:]):
        return
    rep = json.load(open(out))
    names = [p["profile"] for p in rep["profiles"]]
    C.check(len(names) == 4 and names[2] == "ratio 1 (snapkv)" and
            names[3] == "ratio 0.5 (snapkv)" and
            rep["profiles"][3]["calibrated_ratio"] == 0.5 and
            rep["profiles"][3]["target_ratio"] == 0.5 and
            rep["profiles"][1]["calibrated_ratio"] is None,
            "--ratio adds one calibrated profile per ratio after the files",
            names)
    full, made_p, r1, r5 = rep["profiles"]

    def same(a, b):
        rows = [(a["all"], b["all"])] + list(zip(a["turns"], b["turns"]))
        return len(a["turns"]) == len(b["turns"]) and all(
            x[k] == y[k] for x, y in rows for k in SAMPLE_KEYS)
    C.check(same(r1, full) and r1["all"]["kl"] == 0 and
            r1["all"]["delta_nll"] == 0,
            "--ratio 1.0 equals full KV", r1["all"])
    C.check(same(r5, made_p) and r5["all"]["memory_saved"] > 0 and
            r5["all"]["kl"] > 0,
            "--ratio 0.5 equals the profile calibrate --ratio 0.5 writes "
            "(and saves memory)", (r5["all"], made_p["all"]))


def main():
    missing = du.missing_inputs(du.ALL_PROGRAMS + ("tangram-template",
                                                   "tangram-tokenize"))
    if missing:
        return du.fail_missing(missing)
    with tempfile.TemporaryDirectory() as w:
        model = du.make_model(os.path.join(w, "model"))
        half = du.make_skewed_profile(w, 2, 2, 16, 5)
        one = os.path.join(w, "ratio1.json")
        write_full_profile(one)
        convs = conversations()
        data = os.path.join(w, "conv.jsonl")
        with open(data, "w") as f:
            for c in convs:
                f.write(json.dumps(c) + "\n")
        out, svg = os.path.join(w, "r.json"), os.path.join(w, "r.svg")
        r = subprocess.run(evaluate(model, data, [one, half], out, svg),
                           capture_output=True, text=True, timeout=1200)
        if not C.check(r.returncode == 0, "evaluate exits 0",
                       r.stderr[-2000:]):
            return C.summary()
        C.check("full KV" in r.stdout and "dNLL" in r.stdout,
                "evaluate prints a table", r.stdout[:500])
        rep = json.load(open(out))
        C.check(rep["format"] == "tangram-evaluate" and
                rep["conversations"] == 4 and rep["skipped"] == 1 and
                not rep["interrupted"],
                "4 conversations read (ShareGPT too), 1 skipped",
                {k: rep[k] for k in ("conversations", "skipped")})
        full, p1, p5 = rep["profiles"]
        C.check(full["full_kv"] and len(full["turns"]) == 2 and
                full["all"]["delta_nll"] == 0 and
                full["all"]["top1_agreement"] == 1 and
                full["all"]["kl"] == 0 and
                full["all"]["greedy_agreement"] == CONT and
                full["all"]["memory_saved"] == 0,
                "full KV reports zero differences", full["all"])
        same = all(p1["turns"][t][k] == full["turns"][t][k]
                   for t in range(2) for k in ("nll", "tokens", "pages",
                                               "greedy_agreement",
                                               "top1_agreement"))
        C.check(same and p1["all"]["delta_nll"] == 0 and
                p1["all"]["kl"] == 0,
                "the ratio-1.0 profile equals full KV", p1["all"])
        C.check(p5["all"]["memory_saved"] > 0 and
                p5["all"]["delta_nll"] != 0 and
                p5["all"]["top1_agreement"] < 1,
                "the ratio-0.5 profile saves memory and moves the values",
                p5["all"])
        try:
            want5 = independent(model, half, convs)
            wantf = independent(model, "none", convs)
        except RuntimeError as e:
            C.check(False, "independent computation", str(e))
            return C.summary()
        got5 = [t["nll"] for t in p5["turns"]]
        gotf = [t["nll"] for t in full["turns"]]
        d = max(abs(a - b) for a, b in zip(got5 + gotf, want5 + wantf))
        C.check(len(got5) == len(want5) and d <= 1e-5,
                "mean NLL per turn equals tangram-generate's (max |diff| "
                "%.2g; %s vs %s)" % (d, got5, want5))
        txt = open(svg).read()
        C.check(txt.startswith("<svg") and txt.count("r='5'") == 3 and
                "ratio1.json" in txt, "the SVG has one point per profile")
        check_ratios(model, data, w)
        # usage errors
        r = subprocess.run(evaluate(model, data, [half], out,
                                    os.path.join(w, "x.png")),
                           capture_output=True, text=True, timeout=60)
        C.check(r.returncode == 2 and ".svg" in r.stderr,
                "--plot of a .png is a usage error", r.stderr[-300:])
        r = subprocess.run(evaluate(model, data, [], out),
                           capture_output=True, text=True, timeout=60)
        C.check(r.returncode == 2 and "profile" in r.stderr,
                "no --profile is a usage error", r.stderr[-300:])
        for bad, what in ((["--ratio", "1.5"], "a ratio above 1"),
                          (["--ratio", "0.5,x"], "a ratio that is no number"),
                          (["--ratio", "0.5", "--method", "gvote"],
                           "--ratio with gvote")):
            r = subprocess.run(evaluate(model, data, [], out, extra=bad),
                               capture_output=True, text=True, timeout=60)
            C.check(r.returncode == 2 and ("--ratio" in r.stderr or
                                           "--method" in r.stderr),
                    "%s is a usage error" % what, r.stderr[-300:])
        # SIGINT: partial results
        big = os.path.join(w, "big.jsonl")
        with open(big, "w") as f:
            for _ in range(12):
                for c in convs[:2]:
                    f.write(json.dumps(c) + "\n")
        pout = os.path.join(w, "partial.json")
        p = subprocess.Popen(evaluate(model, big, [half], pout),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        # Waits for the first finished conversation: the progress bar.
        seen, buf = False, ""
        t0 = time.time()
        while time.time() - t0 < 600 and not seen:
            ch = p.stderr.read(1)
            if not ch:
                break
            buf += ch
            seen = "] 1/24" in buf
        p.send_signal(signal.SIGINT)
        so, se = p.communicate(timeout=600)
        C.check(seen and p.returncode == 130, "SIGINT: exit status 130",
                (p.returncode, (buf + se)[-500:]))
        try:
            part = json.load(open(pout))
        except (OSError, ValueError) as e:
            part = {"error": str(e)}
        C.check(part.get("interrupted") is True and
                0 < part["profiles"][0]["conversations"] < 24,
                "SIGINT: the partial report is written", str(part)[:300])
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
