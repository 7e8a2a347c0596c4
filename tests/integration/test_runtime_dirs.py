#!/usr/bin/python3
"""Stale runtime directories (docs/RELIABILITY.md, "Stale runtime
directories"): tangramd keeps its worker socket in a private directory
tangramd.XXXXXX under TMPDIR, holding tangramd.lock (its pid, locked with
flock for its whole life). A SIGKILLed tangramd cannot remove it; the next
tangramd started with the same TMPDIR finds the lock free and removes it.
Checked with the real daemon (CPU backend, the tiny model):

1. tangramd SIGKILLed: its router and worker exit by themselves and its
   runtime directory stays behind (with its lock file naming its pid).
2. A second tangramd on the same TMPDIR removes that directory at start
   (its log names it and the dead pid) and serves from a directory of its
   own.
3. A third tangramd started beside the second leaves the second's
   directory alone (its lock is held) while the second keeps serving.
4. Both stopped: no tangramd.* directory is left.

About 20 s on two cores.
"""
import glob
import os
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

ck = du.Checker()


def runtime_dirs(work):
    return sorted(glob.glob(os.path.join(work, "tangramd.*")))


def daemon(model, work, name):
    d = du.Daemon(model, work)
    d.log_path = os.path.join(work, name + ".log")
    return d


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tg-rundirs-")
    ds = []
    try:
        model = du.make_model(os.path.join(work, "model"))
        d1 = daemon(model, work, "d1")
        ds.append(d1)
        if not ck.check(d1.start(), "first tangramd started",
                        d1.log_text()[-2000:]):
            return ck.summary()
        first = runtime_dirs(work)
        ck.check(len(first) == 1, "one runtime directory", first)
        lock_pid = None
        try:
            with open(os.path.join(first[0], "tangramd.lock")) as f:
                lock_pid = f.read().strip()
        except (OSError, IndexError):
            pass
        ck.check(lock_pid == str(d1.proc.pid),
                 "its tangramd.lock names tangramd's pid", (lock_pid,
                                                            d1.proc.pid))
        d1.note_children()
        children = set(d1.children)
        d1.proc.send_signal(signal.SIGKILL)
        d1.proc.wait(timeout=10)
        gone = du.wait_for(lambda: not any(du.alive(c) for c in children),
                           20, 0.1)
        ck.check(gone, "SIGKILL: router and worker exited by themselves")
        ck.check(runtime_dirs(work) == first, "SIGKILL: the runtime "
                 "directory stayed behind", runtime_dirs(work))

        d2 = daemon(model, work, "d2")
        ds.append(d2)
        ck.check(d2.start(), "second tangramd started", d2.log_text()[-2000:])
        ck.check(first and not os.path.exists(first[0]),
                 "the second removed the stale directory", runtime_dirs(work))
        said = [ln for ln in d2.log_text().splitlines()
                if "removed stale runtime directory" in ln]
        ck.check(said and first[0] in said[0] and
                 "pid %s" % lock_pid in said[0],
                 "its log names the directory and the dead pid", said)
        second = runtime_dirs(work)
        ck.check(len(second) == 1, "the second serves from its own "
                 "directory", second)

        d3 = daemon(model, work, "d3")
        ds.append(d3)
        ck.check(d3.start(), "third tangramd started beside the second",
                 d3.log_text()[-2000:])
        ck.check(second and os.path.exists(second[0]) and
                 len(runtime_dirs(work)) == 2,
                 "the live second's directory was left alone",
                 runtime_dirs(work))
        st, _, data = du.http("POST", d2.base_url + "/v1/completions",
                              {"prompt": "still here", "max_tokens": 3},
                              timeout=60)
        ck.check(st == 200, "the second still serves", (st, data[:200]))
        for d in (d3, d2):
            rc, left = d.stop()
            ck.check(rc == 0 and not left, "stopped: exit 0, no child left",
                     (rc, left))
        ck.check(runtime_dirs(work) == [], "no runtime directory left",
                 runtime_dirs(work))
    finally:
        for d in ds:
            d.stop()
        if ck.failures:
            for name in ("d1", "d2", "d3"):
                path = os.path.join(work, name + ".log")
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        print("---- %s ----\n%s" % (name, f.read()[-2000:]))
        shutil.rmtree(work, ignore_errors=True)
    return ck.summary()


if __name__ == "__main__":
    sys.exit(main())
