#!/usr/bin/python3
"""Profiles name the model they were made for (docs/PROFILES.md "Model
identity"): two tiny qwen3 models of the same shape (2 layers, 2 KV heads
of 16) that differ in their MLP width, so a profile of one loads for the
other shape-wise. Checked with the real programs:

1. tangram-profile identity prints each model's identity and the text it
   hashes (sha256 of that text, recomputed here with hashlib); the two
   differ.
2. build --model A writes A's identity into the profile; show prints it;
   build --model with a model of another shape, or with a retention file
   measured on another model, is refused.
3. Serving model B with A's profile is refused at start, naming both
   identities and --profile-force: by tangramd (exit status 3, start-up
   failed, before any child starts), tangram-router and tangram-worker run alone (exit 1,
   "cannot start"), and tangram-generate.
4. With --profile-force tangramd starts, logs the warning and serves a
   request; tangram-generate generates.
5. A profile without an identity (built without --model, as before
   identities existed) serves with a warning that it is not checked.
6. Model A with its own profile: no warning at all.

About 25 s on two cores.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

ck = du.Checker()


def run(args, timeout=120):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def retention(path, identity=None):
    model = {"architecture": "Qwen3ForCausalLM", "num_layers": 2,
             "num_kv_heads": 2, "head_dim": 16}
    if identity:
        model["identity"] = identity
    samples = [[[0.3 + 0.01 * ((s + l + h) % 5) for h in range(2)]
                for l in range(2)] for s in range(8)]
    with open(path, "w") as f:
        json.dump({"format": "tangram-retention", "version": 1,
                   "model": model, "method": "snapkv", "target_ratio": 0.3,
                   "samples": samples}, f)


def daemon_start_refused(model, prof, work):
    """tangramd with model and profile: (exit status or None, stderr+log)."""
    d = du.Daemon(model, work, profile=prof)
    d.log_path = os.path.join(work, "refused.log")
    ok = d.start(timeout=60)
    rc = d.proc.poll() if d.proc else None
    text = d.log_text()
    d.stop()
    return ok, rc, text


def main():
    missing = du.missing_inputs(programs=("tangramd", "tangram-router",
                                          "tangram-worker", "tangram-profile",
                                          "tangram-generate",
                                          "tangram-make-model"))
    if missing:
        return du.fail_missing(missing)
    P = du.prog("tangram-profile")
    work = du.scratch_dir("tg-identity-")
    try:
        a = du.make_model(os.path.join(work, "a"))
        b = du.make_model_args(os.path.join(work, "b"), du.TINY_MODEL_ARGS[
            :du.TINY_MODEL_ARGS.index("--ffn")] + ["--ffn", "96", "--dtype",
                                                   "bf16", "--seed", "1"])
        ids = {}
        for name, m in (("a", a), ("b", b)):
            rc, out, errs = run([P, "identity", "--model", m])
            j = du.json_of(out) or {}
            text = j.get("text", "")
            ids[name] = j.get("identity")
            ck.check(rc == 0 and ids[name] == "sha256:" + hashlib.sha256(
                text.encode()).hexdigest() and "hidden_size=64\n" in text,
                "identity of model %s: sha256 of its text" % name,
                (rc, out[:300], errs))
        ck.check(ids["a"] != ids["b"], "the two models' identities differ")

        retention(os.path.join(work, "ret.json"))
        prof_a = os.path.join(work, "a.json")
        rc, _, errs = run([P, "build", "--retention",
                           os.path.join(work, "ret.json"), "--heads-per-group",
                           "2", "--model", a, "-o", prof_a])
        doc = du.json_of(open(prof_a, "rb").read()) if rc == 0 else {}
        ck.check(rc == 0 and doc["model"].get("identity") == ids["a"],
                 "build --model writes the model's identity", (rc, errs))
        rc, out, _ = run([P, "show", "--profile", prof_a])
        ck.check(rc == 0 and ("model identity " + str(ids["a"])) in out,
                 "show prints the identity", out[:300])
        big = du.make_model_args(os.path.join(work, "c"), [
            "--arch", "qwen3", "--hidden", "64", "--layers", "3", "--heads",
            "4", "--kv-heads", "2", "--head-dim", "16", "--ffn", "128",
            "--seed", "1"])
        rc, _, errs = run([P, "build", "--retention",
                           os.path.join(work, "ret.json"), "--heads-per-group",
                           "2", "--model", big, "-o", os.path.join(work,
                                                                  "x.json")])
        ck.check(rc == 1 and "L=2 H=2 d=16" in errs and "L=3" in errs,
                 "build --model of another shape is refused", errs)
        retention(os.path.join(work, "ret_b.json"), ids["b"])
        rc, _, errs = run([P, "build", "--retention",
                           os.path.join(work, "ret_b.json"),
                           "--heads-per-group", "2", "--model", a, "-o",
                           os.path.join(work, "x.json")])
        ck.check(rc == 1 and "measured on model " + ids["b"] in errs,
                 "build --model A of a retention measured on B is refused",
                 errs)

        # Model B served with A's profile.
        ok, rc, text = daemon_start_refused(b, prof_a, work)
        ck.check(not ok and rc == 3 and ids["a"] in text and ids["b"] in text
                 and "--profile-force" in text and "started router" not in
                 text, "tangramd refuses the profile of another model at "
                 "start, naming both identities", (rc, text[-1200:]))
        rc, _, errs = run([du.prog("tangram-router"), "--model", b,
                           "--profile", prof_a, "--http-port",
                           str(du.free_port()), "--grpc-port",
                           str(du.free_port()), "--heads-per-group", "2",
                           "--ipc-endpoint",
                           "ipc://" + os.path.join(work, "r.sock")])
        ck.check(rc == 1 and "cannot start" in errs and ids["a"] in errs and
                 ids["b"] in errs, "tangram-router refuses it", (rc, errs[-600:]))
        rc, _, errs = run([du.prog("tangram-worker"), "--model", b,
                           "--profile", prof_a, "--router",
                           "ipc://" + os.path.join(work, "w.sock"),
                           "--kv-pages", "64"])
        ck.check(rc == 1 and "cannot start" in errs and ids["a"] in errs and
                 ids["b"] in errs, "tangram-worker refuses it",
                 (rc, errs[-600:]))
        gen = [du.prog("tangram-generate"), "--model", b, "--profile", prof_a,
               "--prompt-ids", "[1, 2, 3, 4, 5]", "--max-tokens", "2"]
        rc, _, errs = run(gen)
        ck.check(rc != 0 and ids["a"] in errs and ids["b"] in errs,
                 "tangram-generate refuses it", (rc, errs[-600:]))
        rc, out, errs = run(gen + ["--profile-force"])
        ck.check(rc == 0 and "used anyway" in errs,
                 "tangram-generate --profile-force generates, warning",
                 (rc, errs[-600:]))

        d = du.Daemon(b, work, profile=prof_a, args=["--profile-force"])
        d.log_path = os.path.join(work, "forced.log")
        try:
            ok = d.start()
            ck.check(ok and "used anyway (--profile-force)" in d.log_text(),
                     "tangramd --profile-force starts with a warning",
                     d.log_text()[-1500:])
            if ok:
                st, _, data = du.http("POST", d.base_url + "/v1/completions",
                                      {"prompt": "forced", "max_tokens": 3},
                                      timeout=60)
                ck.check(st == 200, "and serves", (st, data[:200]))
        finally:
            d.stop()

        prof_old = os.path.join(work, "old.json")
        rc, _, errs = run([P, "build", "--retention",
                           os.path.join(work, "ret.json"), "--heads-per-group",
                           "2", "-o", prof_old])
        d = du.Daemon(b, work, profile=prof_old)
        d.log_path = os.path.join(work, "old.log")
        try:
            ok = d.start()
            ck.check(rc == 0 and ok and "records no model identity" in
                     d.log_text(), "a profile without an identity serves "
                     "with a warning", d.log_text()[-1500:])
        finally:
            d.stop()

        d = du.Daemon(a, work, profile=prof_a)
        d.log_path = os.path.join(work, "own.log")
        try:
            ok = d.start()
            text = d.log_text()
            ck.check(ok and "records no model identity" not in text and
                     "was made for model" not in text, "model A with its own "
                     "profile: no identity warning", text[-1500:])
        finally:
            d.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ck.summary()


if __name__ == "__main__":
    sys.exit(main())
