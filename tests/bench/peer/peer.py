"""peer — what tests/bench/bench_cpu_peer.py and
tests/integration/test_cpu_peer_agree.py share: installing node-llama-cpp,
converting a model folder to GGUF (hf_to_gguf.py), and one greedy run of
llama.cpp (llama_peer.mjs) or of tangram-generate on token-id prompts.

Every run returns a dict; on failure {"error": why}, never an exception
for a failed program. Callers put tests/integration on sys.path first
(daemon_util finds the programs and the build tree).
"""
import json
import os
import subprocess
import sys
import time

import daemon_util as du

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("TANGRAM_PYTHON") or sys.executable

# `npm install` with the committed lockfile rather than `npm ci`: npm ci
# insists that every optional platform build of node-llama-cpp (Windows,
# macOS, CUDA...) be resolvable, and registry mirrors may hold only some;
# install honours the lockfile's versions and hashes for what it installs.
# --omit=optional leaves out the CUDA/Vulkan builds (hundreds of MB; the
# CPU build is a direct dependency); --ignore-scripts skips
# node-llama-cpp's postinstall, which may download or compile llama.cpp.
NPM_INSTALL = ["npm", "install", "--no-save", "--omit=optional",
               "--ignore-scripts"]


def install():
    """(dir with node_modules and llama_peer.mjs, None) or (None, why)."""
    return du.node_packages(HERE, "bench-peer", ["llama_peer.mjs"],
                            os.path.join("@node-llama-cpp", "linux-x64"),
                            NPM_INSTALL)


def convert(model_dir, out, dtype="f32", permute=False):
    """Writes out (GGUF) unless it exists and is newer than the
    checkpoint; returns None or why it failed."""
    st = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(st):
        return None
    cmd = [PYTHON, os.path.join(HERE, "hf_to_gguf.py"), model_dir, out,
           "--dtype", dtype] + (["--permute-qk"] if permute else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return "hf_to_gguf.py failed (rc %d): %s" % (r.returncode,
                                                     r.stderr[-500:])
    return None


def run_llama(root, gguf, prompts, new, threads, top=0, kv_type="F16",
              timeout=1800):
    """llama_peer.mjs on `prompts` (lists of ids, decoded together as
    sequences of one context). Returns its JSON plus wall_s."""
    req = os.path.join(root, "request.%d.json" % os.getpid())
    with open(req, "w") as f:
        json.dump({"model": gguf, "threads": threads, "new": new,
                   "prompts": prompts, "top": top, "kv_type": kv_type}, f)
    t = time.time()
    try:
        p = subprocess.run(["node", os.path.join(root, "llama_peer.mjs"),
                            req], capture_output=True, text=True,
                           timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        return {"error": "llama_peer.mjs timed out after %d s" % timeout}
    finally:
        os.unlink(req)
    if p.returncode != 0:
        return {"error": "llama_peer.mjs failed (rc %d): %s"
                % (p.returncode, p.stderr[-800:])}
    out = json.loads(p.stdout)
    out["wall_s"] = time.time() - t
    return out


def run_tangram(model, ids, new, threads, weights="auto", logprobs=0,
                timeout=1800):
    """tangram-generate (CPU backend, full KV, greedy, eos ignored) on one
    prompt. Returns {"tokens", "logprobs" (its per-step list, when asked),
    "prefill_s", "decode_s", "prefill_cpu_s", "decode_cpu_s" (process CPU
    time), "wall_s", "cpu_weights"}."""
    cmd = [du.prog("tangram-generate"), "--model", model, "--profile",
           "none", "--prompt-ids", json.dumps(ids), "--max-tokens", str(new),
           "--ignore-eos", "--threads", str(threads), "--cpu-weights",
           weights, "--timing", "--json"]
    if logprobs:
        cmd += ["--logprobs", str(logprobs)]
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "tangram-generate timed out after %d s" % timeout}
    if p.returncode != 0:
        return {"error": "tangram-generate failed (rc %d): %s"
                % (p.returncode, p.stderr[-800:])}
    j = json.loads(p.stdout)
    return {"tokens": j["token_ids"], "logprobs": j.get("logprobs"),
            "prefill_s": j["timing"]["prefill_seconds"],
            "decode_s": j["timing"]["decode_seconds"],
            "prefill_cpu_s": j["timing"]["prefill_cpu_seconds"],
            "decode_cpu_s": j["timing"]["decode_cpu_seconds"],
            "wall_s": time.time() - t, "cpu_weights": j.get("cpu_weights")}
