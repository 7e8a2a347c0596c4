#!/usr/bin/python3
"""tangram-generate --method gvote (DESIGN.md §4.8) against the independent
numpy reference tests/reference/gvote_ref.py on tiny random models.

S = 0 (deterministic): for Qwen3 (bf16, H_p 2, random clustered profile),
Qwen2 (fp32, q/k/v bias, no profile) and Llama (bf16, H_p 2, profile), a
random prompt of 100-260 ids, chunks 16 and 64, p = 0.5 and 0.9, three
teacher-forced ids:
  * kept_positions[l][h] (--dump-kept) equal the reference's exactly;
  * prompt and forced log-probabilities agree within 1e-3;
  * a kept-set mismatch is tolerated (and reported) only when the
    reference saw a nucleus boundary within 1e-5 (fp32 may cut there).
S = 8: the reference cannot replay the C side's random stream, so the run
must satisfy the invariants of §4.8: of the first chunk (no history) each
head keeps every forced key, and either fills the §4.3 count (the union
with the synthetic votes overflowed) or holds its real nucleus sets (the
union fitted; it must fill the count when the real sets alone exceed
it); every chunk of
every head keeps at most the §4.3 count and all its forced keys.
For every run: the pages held at the end equal the pages the rows fill,
sum over (layer, group) of ceil(longest head of the group / P) (pages
freed = pages no longer filled), and a run with p = 0.5 gives pages back
(kv.pages_released > 0).

Fails, naming it, when tangram-make-model or tangram-generate is not built.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("TANGRAM_SOURCE",
                     os.path.dirname(os.path.dirname(os.path.dirname(
                         os.path.abspath(__file__)))))
DATA = os.environ.get("TANGRAM_DATA", os.path.join(SRC, "data"))
BIN = os.environ.get("TANGRAM_BIN", os.path.join(SRC, "build", "bin"))
sys.path.insert(0, os.path.join(SRC, "tests", "reference"))

import gvote_ref as gr  # noqa: E402
import profile_ref as pr  # noqa: E402
import tangram_ref as tr  # noqa: E402

MAKE = os.path.join(BIN, "tangram-make-model")
GEN = os.path.join(BIN, "tangram-generate")
LP_TOL = 1e-3
GAP_TOL = 1e-5
PAGE = 16
FORCED = [11, 22, 33]
SHAPE = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads",
         "2", "--head-dim", "16", "--ffn", "128"]
ARCHS = [
    # name, make-model args, tokenizer, H_p (None: no profile), seed
    ("qwen3", ["--arch", "qwen3", "--dtype", "bf16"], "qwen3", 2, 301),
    ("qwen2", ["--arch", "qwen2", "--dtype", "fp32"], "qwen3", None, 302),
    ("llama", ["--arch", "llama", "--dtype", "bf16"], "llama3", 2, 303),
]

failures, notes = [], []
checks = 0


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, file=sys.stderr)


def check(cond, msg):
    global checks
    checks += 1
    if not cond:
        fail(msg)
    return cond


def write_profile(path, cfg, hp, rng):
    layers = []
    for _ in range(cfg.n_layers):
        b = [float(x) for x in rng.uniform(0.1, 0.9, cfg.n_kv_heads)]
        layers.append({"mean": b, "std": [0.0] * len(b), "budget": b,
                       "groups": pr.make_groups(b, hp, "clustered")})
    prof = {"format": "tangram-profile", "version": 1,
            "model": {"architecture": cfg.arch, "num_layers": cfg.n_layers,
                      "num_kv_heads": cfg.n_kv_heads,
                      "head_dim": cfg.head_dim},
            "method": "snapkv", "target_ratio": 0.25, "alpha": 2.0,
            "samples": 1, "heads_per_group": hp, "layers": layers}
    with open(path, "w") as f:
        json.dump(prof, f)
    return prof


def generate(model_dir, profile, ids, chunk, p, samples):
    cmd = [GEN, "--model", model_dir, "--profile", profile, "--method",
           "gvote", "--gvote-p", str(p), "--gvote-samples", str(samples),
           "--prompt-ids", json.dumps(ids), "--prompt-logprobs",
           "--forced-ids", json.dumps(FORCED), "--dump-kept",
           "--prefill-chunk", str(chunk), "--page-size", str(PAGE),
           "--seed", "5", "--threads", "1", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"tangram-generate exited {r.returncode}: "
                           f"{r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def groups_of(prof, cfg):
    if prof is None:
        return [[[h] for h in range(cfg.n_kv_heads)]] * cfg.n_layers
    return [layer["groups"] for layer in prof["layers"]]


def check_pages(what, got, prof, cfg):
    kept = got["kept_positions"]
    want = sum(math.ceil(max(len(kept[li][h]) for h in grp) / PAGE)
               for li, groups in enumerate(groups_of(prof, cfg))
               for grp in groups)
    check(got["kv"]["pages_used"] == want,
          f"{what}: holds {got['kv']['pages_used']} pages, its rows fill "
          f"{want}")


def check_chunks(what, got, prof_path, cfg, n_prompt, chunk):
    """Every chunk of every head: at most the §4.3 count, all forced keys."""
    hb = tr.load_profile_budgets(prof_path, cfg)
    for li in range(cfg.n_layers):
        for h in range(cfg.n_kv_heads):
            pos = np.asarray(got["kept_positions"][li][h])
            for s in range(0, n_prompt, chunk):
                n = min(chunk, n_prompt - s)
                forced = s + np.nonzero(tr.forced_mask(s, n))[0]
                mine = pos[(pos >= s) & (pos < s + n)]
                cap = tr.keep_count(n, hb[li][h], len(forced))
                check(len(mine) <= cap,
                      f"{what}: layer {li} head {h} chunk at {s} keeps "
                      f"{len(mine)} > {cap}")
                check(set(forced.tolist()) <= set(mine.tolist()),
                      f"{what}: layer {li} head {h} chunk at {s} lost "
                      f"forced keys")


def run_arch(tmp, name, args, tok, hp, seed):
    mdir = os.path.join(tmp, name)
    r = subprocess.run([MAKE] + args + SHAPE + [
        "--tokenizer", os.path.join(DATA, "tokenizers", tok), "--seed",
        str(seed), "-o", mdir], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"{name}: tangram-make-model exited {r.returncode}: "
             f"{r.stderr.strip()[:300]}")
        return
    model = tr.load_model(mdir)
    cfg = model.cfg
    rng = np.random.default_rng(seed)
    prof, prof_path = None, "none"
    if hp is not None:
        prof_path = os.path.join(tmp, name + ".profile.json")
        prof = write_profile(prof_path, cfg, hp, rng)
    ids = [int(x) for x in rng.integers(0, min(cfg.vocab, 5000),
                                        int(rng.integers(100, 261)))]
    released = 0
    for chunk in (16, 64):
        for p in (0.5, 0.9):
            what = f"{name} chunk {chunk} p {p}"
            try:
                got = generate(mdir, prof_path, ids, chunk, p, 0)
            except (RuntimeError, ValueError) as e:
                fail(f"{what}: {e}")
                continue
            ref = gr.run(model, ids, prof_path, chunk, p, FORCED)
            released += got["kv"]["pages_released"]
            gap = ref["min_gap"]
            if got["kept_positions"] != ref["kept_positions"]:
                msg = f"{what} S=0: kept positions differ from the reference"
                if gap < GAP_TOL:
                    notes.append(msg + f"; tolerated: nucleus gap {gap:.2g}")
                    continue
                check(False, msg + f" (smallest nucleus gap {gap:.2g})")
                continue
            check(True, "")
            d = max(abs(a - b) for a, b in zip(got["prompt_logprobs"][1:],
                                               ref["prompt_logprobs"][1:]))
            check(d <= LP_TOL, f"{what} S=0: prompt logprob off by {d:.3g}")
            d = max(abs(a - b) for a, b in zip(got["forced_logprobs"],
                                               ref["forced_logprobs"]))
            check(len(got["forced_logprobs"]) == len(FORCED) and d <= LP_TOL,
                  f"{what} S=0: forced logprobs off by {d:.3g}")
            check(got["token_ids"] == FORCED,
                  f"{what}: token_ids {got['token_ids']} are not the forced "
                  "ids")
            check_pages(what + " S=0", got, prof, cfg)
        # S > 0: invariants.
        what = f"{name} chunk {chunk} S=8"
        try:
            got = generate(mdir, prof_path, ids, chunk, 0.5, 8)
        except (RuntimeError, ValueError) as e:
            fail(f"{what}: {e}")
            continue
        sets, gap = gr.first_chunk_sets(model, ids, prof_path, chunk, 0.5)
        n0 = min(chunk, len(ids))
        for li in range(cfg.n_layers):
            for h in range(cfg.n_kv_heads):
                mine = {x for x in got["kept_positions"][li][h] if x < n0}
                must, cap, forced = sets[li][h]
                # U holds must; U fits (all kept, fewer than cap or
                # exactly) or the cap is filled, forced keys first.
                ok = set(forced) <= mine and len(mine) <= cap and (
                    set(must) <= mine if len(must) <= cap and len(mine) < cap
                    else len(mine) == cap or set(must) <= mine)
                if not ok and gap < GAP_TOL:
                    notes.append(f"{what}: first chunk of layer {li} head "
                                 f"{h} tolerated (nucleus gap {gap:.2g})")
                    continue
                check(ok, f"{what}: first chunk of layer {li} head {h} "
                          f"keeps {sorted(mine)}, must hold {must} "
                          f"(cap {cap})")
        check_chunks(what, got, prof_path, cfg, len(ids), chunk)
        check_pages(what, got, prof, cfg)
    check(released > 0, f"{name}: gvote never gave a page back")


def main():
    for prog in (MAKE, GEN):
        if not os.access(prog, os.X_OK):
            print(f"FAIL: {prog} is not built")
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            run_arch(tmp, *arch)
    for n in notes:
        print("note:", n)
    print(f"{checks} checks, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
