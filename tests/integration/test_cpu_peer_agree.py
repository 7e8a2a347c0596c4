#!/usr/bin/python3
"""tangram's CPU backend against llama.cpp (node-llama-cpp's prebuilt CPU
build, tests/bench/peer) on the same weights: the tiny qwen3 model (bf16
checkpoint) converted by tests/bench/peer/hf_to_gguf.py to an F32 GGUF.

- Greedy decode of 16 tokens from three prompts of token ids (5, 40 and
  130 ids; the last spans several KV pages): llama.cpp's tokens equal
  tangram-generate's (`--ignore-eos`, full KV, bf16 weights kept: exactly
  the values of the F32 file), or first differ right after a step whose
  top two were within 2 * TOL (du.greedy_agrees: a near tie may go either
  way under a different summation order).
- At every step both sides' log-probability of the chosen token, and of
  each of tangram's top 5, agree within TOL = 1e-3 nat. Why this bound:
  the weights are identical and llama.cpp's KV cache is set to F32 (its
  default F16 would round K/V by ~5e-4 relative), so the two differ only
  in summation order over fp32 (GEMV, attention, the 151,669-way
  log-sum-exp); seen here: ~1e-5. A wrong layout is far outside it:
- Negative control: the same conversion with --permute-qk (q/k rows in
  llama's interleaved-RoPE order, the mistake the converter must not
  make for qwen3) must NOT agree within TOL. This shows the check can
  fail, and that qwen3 needs no q/k permutation.
- Two sequences decoded together in one llama.cpp context give each the
  tokens it got alone (what bench_cpu_peer.py's multi-sequence column
  relies on).

Fails, naming it, when node/npm, the npm packages (installed from
tests/bench/peer/package-lock.json into the build tree), numpy or a
program is missing. About 20 s on 2 cores after the first install.
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench", "peer"))
import daemon_util as du  # noqa: E402

C = du.Checker()
TOL = 1e-3
NEW = 16


def prompts():
    return [[(i * 7919 + 13 * k + 101) % 150000 + 10 for i in range(n)]
            for k, n in enumerate((5, 40, 130))]


def compare(name, ref, got):
    """ref: tangram's run; got: llama's one sequence (tokens, logprobs).
    Returns the largest |difference| of the compared log-probabilities
    over the steps whose contexts are the same (up to and including the
    first step where the chosen tokens differ)."""
    worst = 0.0
    for i, (a, b) in enumerate(zip(ref["tokens"], got["tokens"])):
        if i > 0 and ref["tokens"][i - 1] != got["tokens"][i - 1]:
            break  # the contexts differ from here on
        r, g = ref["logprobs"][i], got["logprobs"][i]
        ours = dict((x["token_id"], x["logprob"]) for x in r["top_logprobs"])
        ours[a] = r["logprob"]
        theirs = dict((t, v) for t, v in g["top"])
        theirs[b] = g["logprob"]
        for t in ours.keys() & theirs.keys():
            worst = max(worst, abs(ours[t] - theirs[t]))
    return worst


def main():
    missing = du.missing_inputs(programs=["tangram-generate",
                                          "tangram-make-model"],
                                modules=[("numpy", "python3-numpy")],
                                tools=["node", "npm"])
    if missing:
        return du.fail_missing(missing)
    import peer
    work = du.scratch_dir("cpu-peer-agree")
    try:
        return run(peer, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(peer, work):
    model = du.make_model(os.path.join(work, "tiny"))
    root, why = peer.install()
    if root is None:
        C.missing("node-llama-cpp (tests/bench/peer)", why)
        return C.summary()
    gguf = os.path.join(work, "tiny.gguf")
    bad = os.path.join(work, "tiny-permuted.gguf")
    for out, perm in ((gguf, False), (bad, True)):
        err = peer.convert(model, out, "f32", permute=perm)
        if not C.check(err is None, "hf_to_gguf.py writes %s"
                       % os.path.basename(out), err):
            return C.summary()

    ps = prompts()
    refs, alone = [], []
    for k, ids in enumerate(ps):
        ref = peer.run_tangram(model, ids, NEW, 1, logprobs=5)
        if not C.check("error" not in ref, "tangram-generate, prompt %d"
                       % len(ids), ref.get("error")):
            return C.summary()
        refs.append(ref)

    for k, ids in enumerate(ps):
        name = "prompt of %d ids" % len(ids)
        got = peer.run_llama(root, gguf, [ids], NEW, 1, top=5,
                             kv_type="F32")
        if not C.check("error" not in got, "llama.cpp loads the GGUF and "
                       "decodes (%s)" % name, got.get("error")):
            return C.summary()
        seq = {"tokens": got["tokens"][0], "logprobs": got["logprobs"][0]}
        alone.append(seq["tokens"])
        ref_top = [dict((a["token_id"], a["logprob"])
                        for a in s["top_logprobs"])
                   for s in refs[k]["logprobs"]]
        C.check(du.greedy_agrees(refs[k]["tokens"], ref_top, seq["tokens"],
                                 2 * TOL),
                "%s: llama.cpp's greedy tokens equal tangram's" % name,
                {"tangram": refs[k]["tokens"], "llama": seq["tokens"]})
        same = sum(1 for _ in zip(refs[k]["tokens"], seq["tokens"]))
        worst = compare(name, refs[k], seq)
        C.check(worst <= TOL, "%s: log-probabilities agree (max |diff| "
                "%.2g <= %g nat over %d steps)" % (name, worst, TOL, same))

        bad_run = peer.run_llama(root, bad, [ids], NEW, 1, top=5,
                                 kv_type="F32")
        if C.check("error" not in bad_run, "llama.cpp runs the permuted "
                   "GGUF (%s)" % name, bad_run.get("error")):
            bseq = {"tokens": bad_run["tokens"][0],
                    "logprobs": bad_run["logprobs"][0]}
            bworst = compare(name, refs[k], bseq)
            diverged = bseq["tokens"] != refs[k]["tokens"]
            C.check(diverged or bworst > TOL,
                    "%s: q/k permuted as for llama disagrees (max |diff| "
                    "%.2g, tokens differ: %s)" % (name, bworst, diverged))

    both = peer.run_llama(root, gguf, ps[:2], NEW, 1, kv_type="F32")
    if C.check("error" not in both, "llama.cpp decodes two sequences in one "
               "context", both.get("error")):
        for k in range(2):
            C.check(both["tokens"][k] == alone[k], "sequence %d of 2 gets "
                    "the tokens it gets alone" % k,
                    {"together": both["tokens"][k], "alone": alone[k]})
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
