#!/usr/bin/python3
"""`cmake --install` (docs/DEPLOYMENT.md, cmake/tg_install.cmake): installs
the build tree of this test run into a temporary prefix and serves from
there.

1. Every program is installed into <prefix>/bin and executable, the router
   and the worker among them (a systemd install that copied tangramd alone
   failed at start: "tangram-router ... is not an executable file").
2. The systemd unit is in <prefix>/lib/systemd/system with ExecStart and
   its documentation link pointing into the prefix; the environment file,
   the shipped profiles and the docs are under <prefix>/share.
3. The installed tangram-make-model writes the quick start's tiny qwen3
   model (profiles/make-tiny.sh's flags); the installed tangramd serves it
   with the installed profile (its model identity matches), from a
   directory where nothing else of the build is: its router and worker are
   the installed ones, /health turns 200, a completion returns its tokens,
   and SIGTERM stops it with status 0.

Needs cmake on PATH (the build's own). About 20 s on two cores.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

ck = du.Checker()
PROGRAMS = ("tangramd", "tangram-router", "tangram-worker", "tangram-profile",
            "tangram-generate", "tangram-tokenize", "tangram-template",
            "tangram-make-model")
# profiles/make-tiny.sh's tiny-qwen3
TINY_QWEN3 = ["--arch", "qwen3", "--hidden", "128", "--layers", "4",
              "--heads", "8", "--kv-heads", "4", "--head-dim", "32",
              "--ffn", "384", "--tie", "--dtype", "bf16", "--seed", "7"]


def main():
    missing = du.missing_inputs(tools=("cmake",))
    if missing:
        return du.fail_missing(missing)
    build = os.path.dirname(os.path.abspath(du.BIN.rstrip("/")))
    work = du.scratch_dir("tg-install-")
    prefix = os.path.join(work, "prefix")
    try:
        r = subprocess.run(["cmake", "--install", build, "--prefix", prefix],
                           capture_output=True, text=True, timeout=300)
        if not ck.check(r.returncode == 0, "cmake --install into a temporary "
                        "prefix", r.stderr[-2000:] + r.stdout[-1000:]):
            return ck.summary()
        bindir = os.path.join(prefix, "bin")
        for p in PROGRAMS:
            path = os.path.join(bindir, p)
            ck.check(os.path.isfile(path) and os.access(path, os.X_OK),
                     "installed: bin/%s" % p)
        unit = os.path.join(prefix, "lib", "systemd", "system",
                            "tangramd.service")
        text = open(unit).read() if os.path.exists(unit) else ""
        ck.check("ExecStart=%s/tangramd\n" % bindir in text and
                 "Documentation=file://%s/share/doc/tangram/DEPLOYMENT.md"
                 % prefix in text and "/usr/local" not in
                 "\n".join(ln for ln in text.splitlines()
                           if not ln.startswith("#")),
                 "installed: the unit, pointing into the prefix",
                 [ln for ln in text.splitlines()
                  if ln.startswith(("ExecStart", "Documentation"))])
        share = os.path.join(prefix, "share")
        for rel in ("tangram/tangramd.env", "tangram/profiles/tiny-qwen3.json",
                    "tangram/profiles/tiny-llama.json",
                    "doc/tangram/DEPLOYMENT.md", "doc/tangram/README.md",
                    "doc/tangram/RELIABILITY.md"):
            ck.check(os.path.isfile(os.path.join(share, rel)),
                     "installed: share/%s" % rel)

        # Serve from the prefix only.
        model = os.path.join(work, "tiny-qwen3")
        r = subprocess.run([os.path.join(bindir, "tangram-make-model")] +
                           TINY_QWEN3 + ["--tokenizer", os.path.join(
                               du.DATA, "tokenizers", "qwen3"), "-o", model],
                           capture_output=True, text=True, timeout=120)
        if not ck.check(r.returncode == 0, "installed tangram-make-model "
                        "wrote the tiny model", r.stderr[-1000:]):
            return ck.summary()
        du.BIN = bindir  # the daemon and everything it starts: the prefix's
        d = du.Daemon(model, work, profile=os.path.join(
            share, "tangram", "profiles", "tiny-qwen3.json"))
        try:
            ok = d.start()
            if ck.check(ok, "installed tangramd serves with the installed "
                        "profile", d.log_text()[-2500:]):
                kids = [du.cmdline(c).split(" ")[0] for c in
                        du.children_of(d.proc.pid)]
                ck.check(sorted(kids) == sorted([
                    os.path.join(bindir, "tangram-router"),
                    os.path.join(bindir, "tangram-worker")]),
                    "its router and worker are the installed ones", kids)
                ck.check("model identity" not in d.log_text(),
                         "the installed profile's identity is the model's")
                st, _, data = du.http("POST", d.base_url + "/v1/completions",
                                      {"prompt": "Installed from a prefix",
                                       "max_tokens": 5, "ignore_eos": True},
                                      timeout=60)
                j = du.json_of(data) or {}
                ck.check(st == 200 and j.get("usage", {}).get(
                    "completion_tokens") == 5, "a completion returns its "
                    "tokens", (st, data[:300]))
            rc, left = d.stop()
            ck.check(rc == 0 and not left, "SIGTERM: exit 0, no child left",
                     (rc, left))
        finally:
            d.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ck.summary()


if __name__ == "__main__":
    sys.exit(main())
