#!/usr/bin/python3
"""bench_peer_generate — tangram-generate against Hugging Face transformers'
generate on the same model, the same device and the same shape, side by
side in one run (DESIGN.md §7).

Model: tangram-make-model with the shape of bench-cuda-model (the real
Llama-3.1-8B config.json of data/configs: hidden 4096, 32 query / 8 KV
heads, head_dim 128, SwiGLU 14336, Llama-3 RoPE scaling; --layers N for a
shallower model of the same width, default the full 32), random bf16
weights, written once into --workdir. Workload: one sequence, a prompt of
--prompt random ids (default 8192, bench-cuda-model's prefill prompt),
then --new greedy tokens (default 128, eos ignored).

tangram: `tangram-generate --backend cuda --timing --profile none
--prefill-chunk 2048` (full KV; the in-process engine over the CUDA
runtime a worker uses, decode graphs on); its JSON gives the prefill and
decode wall seconds. transformers: from_pretrained(dtype bfloat16) on the
same GPU, default attention; prefill time = a forward pass over the prompt
with the cache, decode time = generate(min_new_tokens = max_new_tokens =
--new, greedy) minus one prefill, each the median of --reps runs after a
warm-up. Printed: prefill tokens/s, decode tokens/s (new tokens / decode
time), the ratios tangram / transformers, and the load times.

Without a GPU it runs on the CPU where it can (--backend cpu, and
transformers on the CPU when installed), at the --quick shape. Without
transformers the peer's column says so.

Usage: bench_peer_generate.py [--quick] [--bin DIR] [--layers N]
       [--prompt N] [--new N] [--reps N] [--workdir DIR] [--json FILE]
--quick: 2 layers, a 512-token prompt, 32 new tokens.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import daemon_util as du  # noqa: E402

SHAPE = "meta-llama--Llama-3.1-8B-Instruct"


def run_tangram(model, ids, new, backend):
    cmd = [du.prog("tangram-generate"), "--model", model, "--profile", "none",
           "--prompt-ids", json.dumps(ids), "--max-tokens", str(new),
           "--ignore-eos", "--prefill-chunk", "2048", "--backend", backend,
           "--timing", "--json"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    if p.returncode != 0:
        return {"error": "tangram-generate --backend %s failed (rc %d): %s"
                % (backend, p.returncode, p.stderr[-800:])}
    t = json.loads(p.stdout)["timing"]
    return {"prefill_s": t["prefill_seconds"], "decode_s": t["decode_seconds"],
            "prefill_tps": len(ids) / t["prefill_seconds"],
            "decode_tps": (new - 1) / t["decode_seconds"]
            if t["decode_seconds"] > 0 else float("nan"),
            "wall_s": wall,
            "load_s": wall - t["prefill_seconds"] - t["decode_seconds"]}


def run_transformers(model, ids, new, reps, dev):
    try:
        import torch
        import transformers
    except ImportError as e:
        return {"error": "no transformers/torch in %s (%s)"
                % (sys.executable, e)}
    t0 = time.time()
    m = du.hf_from_pretrained(transformers, torch, model, torch.bfloat16)
    m = m.to(dev).eval()
    load = time.time() - t0
    x = torch.tensor([ids], device=dev)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def timed(f):
        sync()
        t = time.perf_counter()
        f()
        sync()
        return time.perf_counter() - t

    def prefill():
        with torch.no_grad():
            m(input_ids=x, use_cache=True)

    def gen():
        with torch.no_grad():
            m.generate(x, do_sample=False, max_new_tokens=new,
                       min_new_tokens=new, pad_token_id=0)
    prefill()  # warm-up
    gen()
    pre = sorted(timed(prefill) for _ in range(reps))[reps // 2]
    full = sorted(timed(gen) for _ in range(reps))[reps // 2]
    dec = max(full - pre, 1e-9)
    out = {"prefill_s": pre, "decode_s": dec,
           "prefill_tps": len(ids) / pre, "decode_tps": (new - 1) / dec,
           "load_s": load, "version": transformers.__version__}
    m = None  # frees the weights before the cache is emptied
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bin", default=os.environ.get("TANGRAM_BIN", "build/bin"))
    ap.add_argument("--data", default=os.environ.get("TANGRAM_DATA", os.path.join(
        HERE, "..", "..", "data")))
    ap.add_argument("--layers", type=int, default=0,
                    help="model depth (0: the config's, 32)")
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    du.BIN, du.DATA = a.bin, a.data
    gpu = du.gpu_count() > 0
    if a.quick or not gpu:
        a.layers, a.prompt, a.new = 2, 512, 32
    missing = du.missing_inputs(programs=("tangram-generate",
                                          "tangram-make-model"))
    if missing:
        return du.fail_missing(missing)
    work = a.workdir or tempfile.mkdtemp(prefix="tg-peer-gen-")
    try:
        args, tok = du.shape_args(du.config_path(SHAPE), layers=a.layers or None,
                                  seed=3)
        model = os.path.join(work, "llama-8b-%s" % (a.layers or "full"))
        t0 = time.time()
        if not os.path.exists(os.path.join(model, "model.safetensors")):
            du.make_model_args(model, args, tokenizer=tok)
        made = time.time() - t0
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        ids = du.random_ids(vocab, a.prompt, 12345)
        backend = "cuda" if gpu else "cpu"
        tg = run_tangram(model, ids, a.new, backend)
        hf = run_transformers(model, ids, a.new, a.reps,
                              "cuda" if gpu else "cpu")
        print("Llama-3.1-8B shape, %s layers, prompt %d, %d new tokens, batch "
              "1, %s; model written in %.1f s" % (a.layers or "32", a.prompt,
                                                 a.new, backend, made))
        print("%-24s %16s %16s %10s" % ("", "tangram", "transformers",
                                        "ratio"))
        for key, label in (("prefill_tps", "prefill tokens/s"),
                           ("decode_tps", "decode tokens/s"),
                           ("prefill_s", "prefill s"), ("decode_s", "decode s"),
                           ("load_s", "load s")):
            x, y = tg.get(key), hf.get(key)
            r = "%.2fx" % (x / y) if x and y else "-"
            print("%-24s %16s %16s %10s" % (
                label, "%.2f" % x if x is not None else "-",
                "%.2f" % y if y is not None else "-", r))
        for name, res in (("tangram", tg), ("transformers", hf)):
            if "error" in res:
                print("%s: %s" % (name, res["error"]))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"tangram": tg, "transformers": hf,
                           "args": vars(a)}, f, indent=1)
        return 1 if "error" in tg else 0
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
