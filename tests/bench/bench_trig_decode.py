#!/usr/bin/python3
"""bench_trig_decode — decode-time compression `--decode-compress trig`
(DESIGN.md §4.9) on the CPU backend, in process (tangram-generate), one
long-generation request with and without compression, same model, prompt
and profile, measured side by side in one invocation (DESIGN.md §7).

Per run: pages held at the peak and at the end (kv.pages_peak,
kv.pages_used), decode throughput (generated tokens / wall time of the
decode forward steps), and, with trig, the compaction cost per trigger
(scoring, survivor choice, compaction and the page accounting) as a share
of one decode step. "Requests that fit concurrently" at the same KV memory
is the pool (--kv-pages, default: what the uncompressed request needs at
its peak) divided by one request's peak pages. The baseline passes
--decode-compress trig with beta 2^20 and a cap of 2^30 (never triggers)
so that it reports its decode time and runs the same per-head-length
attention; its pages are those of an uncompressed run: the peak is what a
scheduler must be able to give every admitted request (§4.9's bound).

Model: tangram-make-model's random Qwen3-shaped decoder (--hidden 256,
--layers 4, --heads 8, --kv-heads 4, --head-dim 64, --ffn 512, bf16), the
profile from `tangram-profile calibrate --trig` over 4 random samples
(ratio 0.25, H_p 2). Default workload: prompt 2,048 ids, 8,192 generated
(--ignore-eos), c = 2,048, beta = 128, W_d = 32, P = 16.

    bench_trig_decode.py [--prompt 2048] [--gen 8192] [--budget 2048]
                         [--every 128] [--window 32] [--threads 2]
                         [--quick]
--quick: prompt 256, 512 generated, c 64, beta 32, W_d 8 (a smoke run).
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("TANGRAM_SOURCE",
                     os.path.dirname(os.path.dirname(os.path.dirname(
                         os.path.abspath(__file__)))))
DATA = os.environ.get("TANGRAM_DATA", os.path.join(SRC, "data"))
BIN = os.environ.get("TANGRAM_BIN", os.path.join(SRC, "build", "bin"))
MAKE = os.path.join(BIN, "tangram-make-model")
PROF = os.path.join(BIN, "tangram-profile")
GEN = os.path.join(BIN, "tangram-generate")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd[:3])} ...: {r.stderr.strip()[-400:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--gen", type=int, default=8192)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--every", type=int, default=128)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.prompt, a.gen, a.budget, a.every, a.window = 256, 512, 64, 32, 8
    for prog in (MAKE, PROF, GEN):
        if not os.access(prog, os.X_OK):
            print(f"FAIL: {prog} is not built")
            return 1
    rnd = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        mdir = os.path.join(tmp, "m")
        run([MAKE, "--arch", "qwen3", "--hidden", "256", "--layers", "4",
             "--heads", "8", "--kv-heads", "4", "--head-dim", "64", "--ffn",
             "512", "--dtype", "bf16", "--tokenizer",
             os.path.join(DATA, "tokenizers", "qwen3"), "--seed", "9",
             "-o", mdir])
        samples = os.path.join(tmp, "s.jsonl")
        with open(samples, "w") as f:
            for _ in range(4):
                f.write(json.dumps({"prompt_ids": [
                    rnd.randrange(100, 20000) for _ in range(512)]}) + "\n")
        prof = os.path.join(tmp, "p.json")
        run([PROF, "calibrate", "--model", mdir, "--ratio", "0.25",
             "--samples", samples, "--heads-per-group", "2", "--trig",
             "--threads", str(a.threads), "-o", prof])
        ids = [rnd.randrange(100, 20000) for _ in range(a.prompt)]
        base = [GEN, "--model", mdir, "--profile", prof, "--prompt-ids",
                json.dumps(ids), "--max-tokens", str(a.gen), "--ignore-eos",
                "--threads", str(a.threads), "--json"]
        res = {}
        for name, extra in (("none", []), ("trig", [
                "--decode-compress", "trig", "--decode-budget",
                str(a.budget), "--decode-every", str(a.every),
                "--decode-window", str(a.window)])):
            t0 = time.monotonic()
            out = json.loads(run(base + extra + (
                [] if extra else ["--decode-compress", "trig",
                                  "--decode-every", str(1 << 20),
                                  "--decode-budget", str(1 << 30)])))
            out["wall"] = time.monotonic() - t0
            res[name] = out
    n, t = res["none"], res["trig"]
    steps = a.gen - 1
    pool = n["kv"]["pages_peak"]
    print(f"bench_trig_decode: prompt {a.prompt}, {a.gen} generated, "
          f"c={a.budget} beta={a.every} W_d={a.window}, threads {a.threads}")
    print(f"{'':24s}{'none':>12s}{'trig':>12s}{'trig/none':>12s}")

    def row(label, x, y, fmt="{:12.0f}"):
        ratio = y / x if x else float("nan")
        print(f"{label:24s}" + fmt.format(x) + fmt.format(y) +
              f"{ratio:12.3f}")
    row("pages peak", n["kv"]["pages_peak"], t["kv"]["pages_peak"])
    row("pages at end", n["kv"]["pages_used"], t["kv"]["pages_used"])
    dn = steps / n["timing"]["decode_seconds"]
    dt = steps / t["timing"]["decode_seconds"]
    row("decode tokens/s", dn, dt, "{:12.1f}")
    en = a.gen / n["wall"]
    et = a.gen / t["wall"]
    row("end-to-end tokens/s", en, et, "{:12.1f}")
    row(f"requests in {pool} pages", pool // n["kv"]["pages_peak"],
        pool // t["kv"]["pages_peak"])
    trig_n = t["kv"]["decode_triggers"]
    per_trigger = t["timing"]["compact_seconds"] / max(trig_n, 1)
    per_step = t["timing"]["decode_seconds"] / steps
    print(f"triggers {trig_n}, pages released {t['kv']['decode_pages_released']}"
          f", compaction {per_trigger * 1e3:.2f} ms per trigger = "
          f"{per_trigger / per_step:.3f} of a decode step "
          f"({per_step * 1e3:.2f} ms), "
          f"{t['timing']['compact_seconds'] / t['timing']['decode_seconds']:.4f}"
          " of decode time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
