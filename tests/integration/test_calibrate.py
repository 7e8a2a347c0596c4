#!/usr/bin/python3
"""tangram-profile calibrate end to end, and the calibrated profile at work.

1. Calibrates a tiny generated model on a few text, chat and id samples.
   The retention file must be well formed, and for every sample and layer
   the mean retention over heads must equal the global top-ceil(r*H*N)
   share plus the forced keys that fell outside it: between r and
   r + forced/N (the paper's non-uniform method, DESIGN.md §1.1).
2. The profile must equal what profile_ref.build_profile makes of the
   retention file (budgets and groups).
3. tangram-generate with the calibrated profile must keep exactly the
   prompt tokens of §4.3 per (layer, group) (profile_ref.turn_tokens), fewer
   than full KV, and agree with the numpy reference on prompt
   log-probabilities (1e-3).
Exit 77 when the programs are not built.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("TANGRAM_SOURCE", os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
DATA = os.environ.get("TANGRAM_DATA", os.path.join(SRC, "data"))
BIN = os.environ.get("TANGRAM_BIN", os.path.join(SRC, "build", "bin"))
sys.path.insert(0, os.path.join(SRC, "tests", "reference"))
import profile_ref as pr  # noqa: E402
import tangram_ref as tr  # noqa: E402

MAKE = os.path.join(BIN, "tangram-make-model")
PROF = os.path.join(BIN, "tangram-profile")
GEN = os.path.join(BIN, "tangram-generate")
RATIO = 0.3


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit("FAIL: %s\nstdout: %s\nstderr: %s" % (" ".join(args), p.stdout, p.stderr))
    return p


def main():
    for prog in (MAKE, PROF, GEN):
        if not os.access(prog, os.X_OK):
            print("FAIL: %s is not built" % prog)
            return 1
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m")
        run([MAKE, "--arch", "qwen3", "--hidden", "64", "--layers", "2", "--heads", "8",
             "--kv-heads", "4", "--head-dim", "16", "--ffn", "128", "--tie",
             "--tokenizer", os.path.join(DATA, "tokenizers/qwen3"),
             "--dtype", "bf16", "--seed", "11", "-o", model])
        samples = os.path.join(tmp, "s.jsonl")
        words = ("the cache grows with every turn of the conversation while "
                 "memory limits how many users a server can hold at once").split()
        with open(samples, "w") as f:
            for i in range(6):
                text = " ".join(words[(i + j) % len(words)] for j in range(220 + 40 * i))
                f.write(json.dumps({"text": text}) + "\n")
            f.write(json.dumps({"messages": [
                {"role": "user", "content": "How does paging work?"},
                {"role": "assistant", "content": " ".join(words)}]}) + "\n")
            f.write(json.dumps({"prompt_ids": list(range(1000, 1300))}) + "\n")
        out = os.path.join(tmp, "p.json")
        ret_path = os.path.join(tmp, "r.json")
        p = run([PROF, "calibrate", "--model", model, "--ratio", str(RATIO),
                 "--samples", samples, "--heads-per-group", "2",
                 "--retention-out", ret_path, "-o", out])
        if "sample 8/8" not in p.stderr:
            print("FAIL: no progress on stderr: %r" % p.stderr[-300:])
            failures += 1
        ret = json.load(open(ret_path))
        pr.check_retention(ret)
        assert ret["format"] == "tangram-retention" and len(ret["samples"]) == 8
        # Token counts of the samples, for the bound check.
        lens = []
        for line in open(samples):
            d = json.loads(line)
            if "prompt_ids" in d:
                lens.append(len(d["prompt_ids"]))
            else:
                lens.append(None)
        for s, sample in enumerate(ret["samples"]):
            for l, heads in enumerate(sample):
                m = sum(heads) / len(heads)
                if m < RATIO - 1e-9:
                    print("FAIL: sample %d layer %d keeps %.4f < r" % (s, l, m))
                    failures += 1
                if lens[s] is not None:
                    n = lens[s]
                    forced = pr.chunk_forced(0, n)
                    if m > RATIO + forced / n + 1.0 / n + 1e-9:
                        print("FAIL: sample %d layer %d keeps %.4f > r + forced" % (s, l, m))
                        failures += 1
        prof = json.load(open(out))
        ref = pr.build_profile(ret, 2.0, 2, "clustered")
        for l, (a, b) in enumerate(zip(prof["layers"], ref["layers"])):
            if a["groups"] != b["groups"] or any(
                    abs(x - y) > 1e-12 for x, y in zip(a["budget"], b["budget"])):
                print("FAIL: layer %d of the profile differs from profile_ref" % l)
                failures += 1

        # The calibrated profile at work: exact §4.3 reservation and the math.
        ids = [(i * 7919) % 50000 + 100 for i in range(700)]
        for chunk in (128, 512):
            g = json.loads(run([GEN, "--model", model, "--profile", out, "--prompt-ids",
                                json.dumps(ids), "--prompt-logprobs", "--max-tokens", "2",
                                "--prefill-chunk", str(chunk), "--json"]).stdout)
            gb = pr.group_budgets(prof)
            want = [[pr.turn_tokens(len(ids), b, chunk) for b in layer] for layer in gb]
            got = g["kv"]["prompt_tokens_kept"]
            if got != want:
                print("FAIL: chunk %d kept %s, §4.3 says %s" % (chunk, got, want))
                failures += 1
            if max(max(r) for r in got) >= len(ids):
                print("FAIL: the profile kept every token")
                failures += 1
            r = tr.run(tr.load_model(model), ids, profile=out, prefill_chunk=chunk,
                       max_tokens=2)
            worst = max(abs(a - b) for a, b in zip(g["prompt_logprobs"][1:],
                                                   r["prompt_logprobs"][1:]))
            print("chunk %d: kept %s, max |lp - ref| = %.2e" % (chunk, got, worst))
            if worst > 1e-3:
                print("FAIL: prompt log-probabilities differ from the reference")
                failures += 1
        failures += check_cuda_refusals(tmp, model, samples)
    print("%d passed, %d failed" % (1 if failures == 0 else 0, 1 if failures else 0))
    return 1 if failures else 0


def have_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def check_cuda_refusals(tmp, model, samples):
    """calibrate --backend cuda where it cannot run: exit 1 with the
    reason and no output file. A sample longer than the device's largest
    scored chunk is refused first, naming the flag that fixes it; then the
    runs themselves: no device or driver, a build without CUDA, or (on a
    GPU) the tiny model's head_dim 16. Returns the failure count."""
    failures = 0
    out = os.path.join(tmp, "cuda.json")
    why = ("no CUDA device is usable", "no CUDA backend", "head_dim 64 and 128")
    p = subprocess.run([PROF, "calibrate", "--model", model, "--ratio", "0.3",
                        "--samples", samples, "--heads-per-group", "2",
                        "--backend", "cuda", "-o", out],
                       capture_output=True, text=True)
    if p.returncode != 1 or not any(w in p.stderr for w in why) or \
            os.path.exists(out):
        print("FAIL: calibrate --backend cuda did not refuse clearly (rc %d): "
              "%s" % (p.returncode, p.stderr[-400:]))
        failures += 1
    if not have_gpu() and "use --backend cpu" not in p.stderr:
        print("FAIL: without a GPU the refusal does not name the fix: %s"
              % p.stderr[-400:])
        failures += 1
    long_samples = os.path.join(tmp, "long.jsonl")
    with open(long_samples, "w") as f:
        f.write(json.dumps({"prompt_ids": [1000 + i % 500
                                           for i in range(2100)]}) + "\n")
    p = subprocess.run([PROF, "calibrate", "--model", model, "--ratio", "0.3",
                        "--samples", long_samples, "--heads-per-group", "2",
                        "--backend", "cuda", "-o", out],
                       capture_output=True, text=True)
    if p.returncode != 1 or "--max-sample-tokens 2048" not in p.stderr or \
            os.path.exists(out):
        print("FAIL: a 2100-token sample on --backend cuda is not refused "
              "with --max-sample-tokens 2048 (rc %d): %s"
              % (p.returncode, p.stderr[-400:]))
        failures += 1
    if failures == 0:
        print("calibrate --backend cuda refuses clearly: %s"
              % p.stderr.strip().splitlines()[-1])
    return failures


if __name__ == "__main__":
    sys.exit(main())
