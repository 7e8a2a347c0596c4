#!/usr/bin/python3
"""tangramd fails fast on a configuration that cannot serve.

Each case starts the real tangramd with one thing wrong and requires: an
exit within the hang guard (60 s; it takes about a second) with status 2
(bad options) or 3 (start-up failed), a message on stderr naming the
problem, no router or worker left running, and no assertion or core dump.
Cases: a missing model directory, a truncated safetensors file, a garbage
safetensors header, a bad config.json, a bad tokenizer.json, a profile for
another model shape, --max-queued 0, the HTTP port in use, the gRPC port in
use, equal ports, a bad --host, a KV pool larger than the host, and a
tensor whose shape disagrees with config.json (which only the worker sees:
tangramd stops when that child exits before the server was ready, with
the worker's error). Also: tangram-router alone on a port in use exits 1
with "address already in use" rather than aborting. Restarts after the
server was ready are covered by test_daemon_faults.py.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

chk = du.Checker()
GUARD = 60  # seconds: a hang, not a speed, fails the test


def copy_model(src, dst, edit=None):
    shutil.copytree(src, dst)
    if edit:
        edit(dst)
    return dst


def run(args, env_extra=None):
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.update(env_extra or {})
    p = subprocess.Popen([du.prog("tangramd")] + args, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=GUARD)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, err
    return p.returncode, err


def leftovers(err):
    """Router/worker pids the log says were started and are still alive."""
    pids = []
    for line in err.splitlines():
        if "started " in line and ", pid " in line:
            try:
                pid = int(line.rsplit(", pid ", 1)[1].split()[0])
            except ValueError:
                continue
            if du.alive(pid):
                pids.append(pid)
    return pids


def expect(name, args, want_rc, needle, env_extra=None):
    rc, err = run(args, env_extra)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    ok = rc == want_rc and needle in err
    chk.check(ok, "%s: exits %s naming '%s' (rc %s)" % (name, want_rc,
                                                          needle, rc),
              last[:600])
    chk.check("TG_ASSERT" not in err and "assertion" not in err.lower() and
              rc is not None and rc >= 0,
              "%s: no assertion, no signal" % name, err[-800:])
    left = leftovers(err)
    chk.check(not left, "%s: no child left running (%s)" % (name, left))
    for pid in left:
        os.kill(pid, signal.SIGKILL)


def write_profile(path, layers, kv_heads, head_dim):
    doc = {"format": "tangram-profile", "version": 1,
           "model": {"architecture": "Qwen3ForCausalLM",
                     "num_layers": layers, "num_kv_heads": kv_heads,
                     "head_dim": head_dim},
           "method": "snapkv", "target_ratio": 0.5, "alpha": 2.0,
           "samples": 1, "heads_per_group": 1,
           "layers": [{"mean": [0.5] * kv_heads, "std": [0.0] * kv_heads,
                       "budget": [0.5] * kv_heads,
                       "groups": [[h] for h in range(kv_heads)]}
                      for _ in range(layers)]}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgstart")
    try:
        model = du.make_model(os.path.join(work, "model"))
        base = ["--host", "127.0.0.1"]

        def ports():
            return ["--http-port", str(du.free_port()), "--grpc-port",
                    str(du.free_port())]

        expect("missing model dir",
               base + ports() + ["--model", os.path.join(work, "nope")], 3,
               "is not a directory")

        def truncate(d):
            p = os.path.join(d, "model.safetensors")
            with open(p, "r+b") as f:
                f.truncate(os.path.getsize(p) // 2)
        m = copy_model(model, os.path.join(work, "trunc"), truncate)
        expect("truncated safetensors", base + ports() + ["--model", m], 3,
               "past the end of the data region")

        def garbage_header(d):
            p = os.path.join(d, "model.safetensors")
            with open(p, "r+b") as f:
                f.seek(8)
                f.write(b"{\"oops\": ")
        m = copy_model(model, os.path.join(work, "hdr"), garbage_header)
        expect("bad safetensors header", base + ports() + ["--model", m], 3,
               "model.safetensors")

        def bad_config(d):
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write("{\"architectures\": [\"LlamaForCausalLM\"],")
        m = copy_model(model, os.path.join(work, "cfg"), bad_config)
        expect("bad config.json", base + ports() + ["--model", m], 3,
               "config.json")

        def bad_tokenizer(d):
            with open(os.path.join(d, "tokenizer.json"), "w") as f:
                f.write("{\"model\": {\"type\": \"BPE\"")
        m = copy_model(model, os.path.join(work, "tok"), bad_tokenizer)
        expect("bad tokenizer.json", base + ports() + ["--model", m], 3,
               "tokenizer.json")

        prof = write_profile(os.path.join(work, "other.json"), 3, 2, 16)
        expect("profile of another shape",
               base + ports() + ["--model", model, "--profile", prof], 3,
               "profile")

        expect("--max-queued 0",
               base + ports() + ["--model", model, "--max-queued", "0"], 2,
               "--max-queued")

        for which in ("--http-port", "--grpc-port"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                s.listen(1)
                taken = str(s.getsockname()[1])
                p = ports()
                p[p.index(which) + 1] = taken
                expect("%s in use" % which, base + p + ["--model", model], 3,
                       "Address already in use")

        port = str(du.free_port())
        expect("equal ports", base + ["--model", model, "--http-port", port,
                                      "--grpc-port", port], 3,
               "both " + port)
        expect("bad --host",
               ["--host", "tangram.invalid"] + ports() + ["--model", model],
               3, "--host 'tangram.invalid'")
        expect("KV pool larger than the host",
               base + ports() + ["--model", model, "--kv-memory", "64TiB"],
               3, "does not fit")
        # The memory plan counts the weights as the CPU worker will hold
        # them: this bf16 checkpoint's matrices (the bulk: a 151669 x 64
        # embedding) take 2 bytes each under auto and bf16, 4 under f32
        # (no host tier, whose bytes the message would add).
        mib = {}
        for w in ("auto", "f32", "bf16"):
            rc, err = run(base + ports() + ["--model", model, "--kv-memory",
                                            "64TiB", "--kv-host-memory", "0",
                                            "--cpu-weights", w])
            m = re.search(r"(\d+) MiB for the weights", err)
            chk.check(rc == 3 and m is not None,
                      "--cpu-weights %s: the plan names the weights" % w,
                      err[-600:])
            mib[w] = int(m.group(1)) if m else -1
        chk.check(mib["auto"] == mib["bf16"] and mib["bf16"] > 0 and
                  1.8 * mib["bf16"] <= mib["f32"] <= 2.2 * mib["bf16"],
                  "weights planned at 2 bytes (auto, bf16) and 4 (f32) per "
                  "matrix element", str(mib))

        def wrong_ffn(d):
            p = os.path.join(d, "config.json")
            with open(p) as f:
                c = json.load(f)
            c["intermediate_size"] = c["intermediate_size"] + 32
            with open(p, "w") as f:
                json.dump(c, f)
        m = copy_model(model, os.path.join(work, "ffn"), wrong_ffn)
        expect("tensor shape the worker refuses",
               base + ports() + ["--model", m], 3,
               "worker rank 0 exited with status 1 before the server was "
               "ready")
        rc, err = run(base + ports() + ["--model", m])
        chk.check("mlp" in (err.strip().splitlines() or [""])[-1] and
                  "expected" in err.strip().splitlines()[-1],
                  "the worker's own error ends tangramd's output", err[-600:])

        # The router alone: a port in use is a message, not an abort.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            taken = str(s.getsockname()[1])
            r = subprocess.run(
                [du.prog("tangram-router"), "--model", model, "--http-port",
                 taken, "--grpc-port", str(du.free_port()),
                 "--ipc-endpoint", "ipc://" + os.path.join(work, "r.sock")],
                capture_output=True, text=True, timeout=GUARD)
            chk.check(r.returncode == 1 and
                      "address already in use" in r.stderr and
                      "TG_ASSERT" not in r.stderr,
                      "tangram-router on a port in use exits 1 with the "
                      "reason (rc %s)" % r.returncode, r.stderr[-600:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
