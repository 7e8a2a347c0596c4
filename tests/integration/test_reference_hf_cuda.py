#!/usr/bin/python3
"""The outside reference on a GPU: Hugging Face transformers (PyTorch) loads
the models tangram-make-model generates and checks `tangram-generate
--backend cuda` against them (label gpu).

Models (TANGRAM_HF_MODELS, comma-separated; default
"tiny-qwen3,tiny-llama,qwen3-8b:2,llama3.1-8b:2"): a tiny Qwen3 and a tiny
Llama (hidden 256, head_dim 64: the CUDA kernels take 64 and 128), and
2-layer models of the Qwen3-8B and Llama-3.1-8B shapes (the real
config.json of data/configs: 32 query / 8 KV heads, head_dim 128, the real
RoPE theta and Llama-3 scaling; ":N" sets the depth). For each, with full
KV and a prompt of 200 ids run in chunks of 128 (so prefill crosses a
chunk and many pages):

1. transformers in fp32 is the reference: AutoModelForCausalLM.
   from_pretrained(dir, dtype / torch_dtype = float32), the checkpoint's
   bf16 weights exactly, fp32 math (TF32 off). transformers in bf16 is the
   peer: what a bf16 implementation of the same model achieves.
2. `tangram-generate --backend cpu` (fp32) must give the reference's prompt
   log-probabilities within CPU_TOL = 5e-3 nat at every position: both
   compute in fp32 from the same weights, so this only fails when
   transformers reads the checkpoint differently (names, RoPE, norms,
   tying), which would void the GPU comparison.
3. `tangram-generate --backend cuda` (bf16 weights and KV, fp32
   accumulation): its prompt log-probabilities may be off the reference by
   at most 2 x the bf16 peer's own error + 0.02 nat on average over the
   positions, and 2 x the peer's largest + 0.1 nat at the worst position
   (the peer's error, measured on the same positions, is what bf16 costs;
   the slack covers a different summation order).
4. Greedy continuation of 32 tokens: tangram's CUDA tokens must equal the
   reference's until they first differ, and they may differ only at a step
   whose reference top-2 log-probability gap is below NEAR = max(0.05,
   2 x tangram's worst prompt error from 3): there bf16 rounding may pick
   the other token, and from there on the two paths are not comparable.
   How many tokens agreed is reported.
5. Teacher-forced over the reference's continuation (`--forced-ids`): the
   32 decode-step log-probabilities meet the bounds of 3 against the
   reference's, so decode attention over the pages is compared at every
   step whatever greedy did.

Skips (exit 77) only for: no NVIDIA GPU (nvidia-smi -L lists none) — a
failure instead when TANGRAM_REQUIRE_GPU=1, as on the GPU round — or no
torch / transformers in this Python (TANGRAM_PYTHON), always a skip; the
message says which. A missing program or model file is a failure.

--self-check (by hand, any machine, no GPU or transformers needed): the
project's numpy reference (tests/reference/tangram_ref.py, float64) stands
in for both transformers runs and tangram runs --backend cpu where the
test says cuda, on the tiny models only; every comparison and rule above
runs, so the script itself is exercised without a GPU.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import daemon_util as du  # noqa: E402

SKIP = 77
PROMPT_LEN = 200
CHUNK = 128
GEN = 32
CPU_TOL = 5e-3
MEAN_SLACK, MAX_SLACK = 0.02, 0.1
NEAR_MIN = 0.05

TINY = ["--hidden", "256", "--layers", "2", "--heads", "8", "--kv-heads",
        "4", "--head-dim", "64", "--ffn", "512", "--dtype", "bf16"]
DEFAULT_MODELS = "tiny-qwen3,tiny-llama,qwen3-8b:2,llama3.1-8b:2"
SHAPES = {"qwen3-8b": "Qwen--Qwen3-8B",
          "llama3.1-8b": "meta-llama--Llama-3.1-8B-Instruct"}


def model_spec(name):
    """(make-model flags, tokenizer) of one TANGRAM_HF_MODELS entry."""
    base, _, depth = name.partition(":")
    if base == "tiny-qwen3":
        return ["--arch", "qwen3", "--seed", "5"] + TINY, "qwen3"
    if base == "tiny-llama":
        return ["--arch", "llama", "--seed", "6", "--rope-theta", "500000",
                "--rope-scaling-llama3", "8"] + TINY, "llama3"
    if base in SHAPES:
        return du.shape_args(du.config_path(SHAPES[base]),
                             layers=int(depth or 2), seed=7)
    raise RuntimeError("unknown model %r (tiny-qwen3, tiny-llama, "
                       "qwen3-8b[:N], llama3.1-8b[:N])" % name)


def tangram(model, ids, backend, extra):
    """tangram-generate --json with full KV; raises with its stderr."""
    cmd = [du.prog("tangram-generate"), "--model", model, "--profile", "none",
           "--prompt-ids", json.dumps(ids), "--prefill-chunk", str(CHUNK),
           "--backend", backend, "--json", "--ignore-eos"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError("tangram-generate --backend %s failed (rc %d): %s"
                           % (backend, p.returncode, p.stderr[-1500:]))
    return json.loads(p.stdout)


def errors(got, ref):
    """(mean, max) |got - ref| over positions where both are numbers."""
    d = [abs(a - b) for a, b in zip(got, ref)
         if isinstance(a, float) and b is not None and math.isfinite(a)]
    if not d:
        return float("inf"), float("inf")
    return sum(d) / len(d), max(d)


# ---- the references -------------------------------------------------------

class HFReference:
    """transformers on the GPU: fp32 (the reference) or bf16 (the peer)."""

    def __init__(self, torch, transformers, model_dir, dtype):
        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        want = torch.float32 if dtype == "fp32" else torch.bfloat16
        m = du.hf_from_pretrained(transformers, torch, model_dir, want)
        self.model = m.to("cuda").eval()
        self.name = "transformers %s %s" % (transformers.__version__, dtype)

    def logprobs(self, ids):
        """[None, log P(ids[i] | ids[<i]) ...] from one forward pass."""
        t = self.torch
        with t.no_grad():
            x = t.tensor([ids], device="cuda")
            lg = self.model(input_ids=x).logits[0].float()
            lp = t.log_softmax(lg, dim=-1)
            tgt = x[0, 1:]
            got = lp[:-1].gather(1, tgt[:, None])[:, 0]
        return [None] + [float(v) for v in got.cpu()]

    def greedy(self, ids, n):
        """n greedy tokens (eos not special) and each step's top-2 gap."""
        t = self.torch
        toks, gaps = [], []
        with t.no_grad():
            out = self.model(input_ids=t.tensor([ids], device="cuda"),
                             use_cache=True)
            for _ in range(n):
                lp = t.log_softmax(out.logits[0, -1].float(), dim=-1)
                top = t.topk(lp, 2)
                tok = int(top.indices[0])
                toks.append(tok)
                gaps.append(float(top.values[0] - top.values[1]))
                out = self.model(input_ids=t.tensor([[tok]], device="cuda"),
                                 past_key_values=out.past_key_values,
                                 use_cache=True)
        return toks, gaps

    def close(self):
        del self.model
        self.torch.cuda.empty_cache()


class NumpyReference:
    """--self-check: tests/reference/tangram_ref.py (float64, full KV)."""

    def __init__(self, model_dir):
        sys.path.insert(0, os.path.join(du.SOURCE or os.path.join(
            HERE, "..", ".."), "tests", "reference"))
        import tangram_ref
        self.ref = tangram_ref
        self.model = tangram_ref.load_model(model_dir)
        self.name = "numpy reference (float64)"

    def logprobs(self, ids):
        r = self.ref.run(self.model, ids, prefill_chunk=len(ids))
        return list(r["prompt_logprobs"])

    def greedy(self, ids, n):
        r = self.ref.run(self.model, ids, prefill_chunk=len(ids),
                         max_tokens=n, ignore_eos=True)
        # a top-2 logit gap is the top-2 log-probability gap
        return list(r["token_ids"]), list(r["top2_margins"])

    def close(self):
        pass


# ---- one model ------------------------------------------------------------

def check_model(C, name, work, make_ref, device_backend):
    args, tok = model_spec(name)
    mdir = os.path.join(work, name.replace(":", "-"))
    t0 = time.time()
    du.make_model_args(mdir, args, tokenizer=tok)
    with open(os.path.join(mdir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ids = du.random_ids(vocab, PROMPT_LEN, 11)
    print("%s: model made in %.1f s" % (name, time.time() - t0), flush=True)

    ref = make_ref(mdir, "fp32")
    want = ref.logprobs(ids)
    cont, gaps = ref.greedy(ids, GEN)
    forced_ref = ref.logprobs(ids + cont)[len(ids):]
    ref_name = ref.name
    ref.close()
    peer = make_ref(mdir, "bf16")
    peer_lp = peer.logprobs(ids)
    peer_forced = peer.logprobs(ids + cont)[len(ids):]
    peer.close()
    p_mean, p_max = errors(peer_lp, want)
    f_mean, f_max = errors(peer_forced, forced_ref)
    print("%s: %s; bf16 peer vs reference: prompt mean %.4f max %.4f, "
          "continuation mean %.4f max %.4f" % (name, ref_name, p_mean, p_max,
                                               f_mean, f_max), flush=True)

    cpu = tangram(mdir, ids, "cpu", ["--max-tokens", "0",
                                     "--prompt-logprobs"])
    c_mean, c_max = errors(cpu["prompt_logprobs"], want)
    C.check(c_max <= CPU_TOL,
            "%s: tangram cpu (fp32) prompt logprobs within %g of the "
            "reference (mean %.2e, max %.2e)" % (name, CPU_TOL, c_mean, c_max))

    t1 = time.time()
    dev = tangram(mdir, ids, device_backend,
                  ["--max-tokens", str(GEN), "--prompt-logprobs",
                   "--timing"])
    t_dev = time.time() - t1
    g_mean, g_max = errors(dev["prompt_logprobs"], want)
    lim_mean, lim_max = 2 * p_mean + MEAN_SLACK, 2 * p_max + MAX_SLACK
    C.check(g_mean <= lim_mean and g_max <= lim_max,
            "%s: tangram %s prompt logprobs: mean %.4f (<= %.4f), max %.4f "
            "(<= %.4f)" % (name, device_backend, g_mean, lim_mean, g_max,
                           lim_max))

    near = max(NEAR_MIN, 2 * g_max)
    got = dev["token_ids"]
    compared, ok = 0, True
    for i, (a, b) in enumerate(zip(got, cont)):
        if a != b:
            # the paths part here: allowed only at a near-tie
            ok = gaps[i] < near
            break
        compared += 1
    C.check(ok and len(got) == GEN,
            "%s: greedy %d tokens: the first %d equal (a difference is "
            "allowed only where the reference's top-2 gap < %.3f)"
            % (name, GEN, compared, near),
            "tangram %s\nreference %s\ngaps %s" % (
                got, cont, ["%.3f" % g for g in gaps]))

    forced = tangram(mdir, ids, device_backend,
                     ["--forced-ids", json.dumps(cont)])
    lim_mean = 2 * f_mean + MEAN_SLACK
    lim_max = 2 * f_max + MAX_SLACK
    d_mean, d_max = errors(forced["forced_logprobs"], forced_ref)
    C.check(d_mean <= lim_mean and d_max <= lim_max,
            "%s: teacher-forced %d decode steps: mean %.4f (<= %.4f), max "
            "%.4f (<= %.4f)" % (name, GEN, d_mean, lim_mean, d_max, lim_max))
    tm = dev.get("timing", {})
    print("%s: tangram %s run %.1f s (prefill %.1f tok/s, decode %.1f tok/s "
          "in process)" % (name, device_backend, t_dev,
                           tm.get("prefill_tokens_per_second", 0),
                           tm.get("decode_tokens_per_second", 0)), flush=True)
    shutil.rmtree(mdir, ignore_errors=True)


def main():
    self_check = "--self-check" in sys.argv[1:]
    missing = du.missing_inputs(programs=("tangram-generate",
                                          "tangram-make-model"))
    if missing:
        return du.fail_missing(missing)
    names = os.environ.get("TANGRAM_HF_MODELS", DEFAULT_MODELS).split(",")
    if self_check:
        names = [n for n in names if n.startswith("tiny")]

        def make_ref(mdir, dtype):
            return NumpyReference(mdir)
        backend = "cpu"
    else:
        if du.gpu_count() == 0:
            if os.environ.get("TANGRAM_REQUIRE_GPU") == "1":
                print("FAIL: no NVIDIA GPU (nvidia-smi -L lists none) and "
                      "TANGRAM_REQUIRE_GPU=1")
                return 1
            print("skipped: no NVIDIA GPU (nvidia-smi -L lists none)")
            return SKIP
        try:
            import torch
            import transformers
        except ImportError as e:
            print("skipped: no transformers/torch in %s (%s)"
                  % (sys.executable, e))
            return SKIP
        if not torch.cuda.is_available():
            print("FAIL: nvidia-smi lists a GPU but torch %s sees none"
                  % torch.__version__)
            return 1

        def make_ref(mdir, dtype):
            return HFReference(torch, transformers, mdir, dtype)
        backend = "cuda"
    C = du.Checker()
    work = du.scratch_dir("tg_hf_ref.")
    try:
        for name in names:
            try:
                check_model(C, name.strip(), work, make_ref, backend)
            except (RuntimeError, OSError, ValueError) as e:
                C.check(False, "%s: ran" % name, e)
        return C.summary()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
