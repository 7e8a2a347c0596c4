#!/usr/bin/python3
"""A small mutation check of the admission and budget code: each mutant is
one deliberate bug of a kind that once passed every test (an admission
check dropping a term, a page count off by a term, a nucleus measured over
the wrong set, a closed form that skips a case). The script builds each
mutant and runs the unit tests that must catch it; a mutant that every
one of them passes has *survived*, and the run fails naming it.

How: the project's files (git's tracked and untracked-but-not-ignored
files) are mirrored into WORK/src (only changed files are rewritten, so a
rerun rebuilds little), configured once into WORK/build (CPU only, Debug,
ccache when installed), the tests are built and must pass unmutated (the
baseline), then for each mutant: its file is patched (the original text
must occur exactly once, so a mutant that no longer applies fails the run
instead of silently testing nothing), the tests are rebuilt and run (each
with a time limit; a hang counts as caught), and the file is restored.

Usage: tests/mutation/mutate.py [--work DIR] [--only NAME ...] [--list]
  --work DIR  scratch folder (default: build-mutation in the source tree)
  --only N    run only the named mutants
  --list      print the mutants and the tests that must catch them
Exit status: 0 when every mutant was caught, 1 otherwise (or when the
baseline fails, a mutant does not apply or the build breaks).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

SCHED = "router/core/rt_sched.c"
ADMIT = ["test_sched_admit", "test_sched_fork", "test_sched_trig",
         "test_sched", "test_sched_prefix"]

# (name, file, original text, mutated text, tests that must catch it)
MUTANTS = [
    ("slots-ignore-samples", SCHED,
     "if (s->n_running + 1 + req->n_sibs > s->cfg.max_num_seqs)",
     "if (s->n_running + 1 > s->cfg.max_num_seqs)", ADMIT),
    ("trig-bound-one-sample", SCHED,
     "int64_t dec = (1 + (int64_t)req->n_sibs) *",
     "int64_t dec = (int64_t)1 *", ADMIT),
    ("trig-headroom-dropped", SCHED,
     "                      rt_sched__trig_headroom(s, r);",
     "                      0;", ADMIT),
    ("sample-pages-not-checked", SCHED,
     "if (need + sib_pages + dec > spare)",
     "if (need + dec > spare)", ADMIT),
    ("sample-pages-forgotten", SCHED,
     "const int64_t sib_pages = (int64_t)req->n_sibs * s->rows;",
     "const int64_t sib_pages = 0;", ADMIT),
    ("reused-prefix-counted-twice", SCHED,
     "(m != NULL && !restore ? m->seqs[r].used_pages : 0);\n",
     "2 * (m != NULL && !restore ? m->seqs[r].used_pages : 0);\n", ADMIT),
    ("reused-prefix-taken-as-spare", SCHED,
     "(m != NULL && !restore ? m->seqs[r].used_pages : 0);\n",
     "0;\n", ADMIT),
    ("keep-floor-not-ceil", "common/kv/kv_budget.c",
     "int64_t k = (int64_t)ceil(budget * (double)n);",
     "int64_t k = (int64_t)floor(budget * (double)n);",
     ["test_split", "test_kv_pool", "test_sched"]),
    ("forced-keys-dropped", "common/kv/kv_budget.c",
     "    if (k < forced)\n        k = forced;\n", "",
     ["test_split", "test_kv_pool", "test_sched"]),
    ("sinks-not-forced", "common/kv/kv_budget.c",
     "    return w + sinks;", "    return w + 0 * sinks;",
     ["test_split", "test_kv_pool", "test_sched"]),
    ("closed-form-skips-sinks", "common/kv/kv_prompt.c",
     "while (off < n && off < rule->n_sink) {",
     "while (off < n && off < 0) {", ["test_split"]),
    ("closed-form-uncompressed", "common/kv/kv_prompt.c",
     "    int64_t kept = 0, off = 0;\n    while (off < n && off < rule",
     "    if (n > 0)\n        return n;\n"
     "    int64_t kept = 0, off = 0;\n    while (off < n && off < rule",
     ["test_split"]),
    ("trig-bound-without-beta", "common/kv/kv_trig.c",
     "return kv_decode_bound(max_tokens, cap, t->every);",
     "return kv_decode_bound(max_tokens, cap, 0);",
     ["test_sched_trig", "test_sched_admit"]),
    ("top-p-over-the-vocabulary", "kernels/cpu/cpu_sample.c",
     "        for (int j = 0; j < nc; j++)\n"
     "            z += exp((double)pr[j].v - m);\n"
     "        double cum = 0.0, need",
     "        for (int j = 0; j < vocab; j++)\n"
     "            z += exp((double)pr[j].v - m);\n"
     "        double cum = 0.0, need",
     ["test_cpu_sample"]),
]

TEST_TIMEOUT = 120  # seconds per test binary; these run in well under 5


def log(msg):
    print(msg, flush=True)


def project_files():
    r = subprocess.run(["git", "-C", SRC, "ls-files", "-z", "--cached",
                        "--others", "--exclude-standard"],
                       capture_output=True, check=True)
    return [f for f in r.stdout.decode().split("\0") if f]


def mirror(dst):
    """Copies every project file into dst, rewriting only those whose bytes
    differ (their mtimes then tell ninja what to rebuild)."""
    for rel in project_files():
        src = os.path.join(SRC, rel)
        if not os.path.isfile(src):
            continue  # deleted in the work tree, not yet in git
        out = os.path.join(dst, rel)
        with open(src, "rb") as f:
            data = f.read()
        try:
            with open(out, "rb") as f:
                if f.read() == data:
                    continue
        except OSError:
            os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(data)
        shutil.copymode(src, out)


def run(cmd, cwd=None, timeout=None):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def configure(src, build):
    if os.path.exists(os.path.join(build, "build.ninja")):
        return True
    cmd = ["cmake", "-S", src, "-B", build, "-G", "Ninja",
           "-DCMAKE_BUILD_TYPE=Debug", "-DTANGRAM_CUDA=OFF",
           "-DTANGRAM_PYTHON=" + sys.executable]
    if shutil.which("ccache"):
        cmd.append("-DCMAKE_C_COMPILER_LAUNCHER=ccache")
    r = run(cmd)
    if r.returncode != 0:
        log("FAIL configure:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    return r.returncode == 0


def build_tests(build, tests):
    jobs = os.environ.get("TANGRAM_MUTATION_JOBS", "2")
    r = run(["cmake", "--build", build, "-j", jobs, "--target"] + tests)
    return r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def failing_tests(build, tests):
    """Runs each test binary; returns [(name, why)] of those that failed."""
    out = []
    env = dict(os.environ, TANGRAM_SOURCE=SRC,
               TANGRAM_DATA=os.path.join(SRC, "data"))
    for t in tests:
        exe = os.path.join(build, "tests", t)
        try:
            r = subprocess.run([exe], capture_output=True, text=True,
                               timeout=TEST_TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            out.append((t, "timed out after %d s" % TEST_TIMEOUT))
            continue
        if r.returncode != 0:
            lines = [ln for ln in (r.stdout + r.stderr).splitlines()
                     if "FAILED" in ln or "ERROR" in ln or "fail" in ln
                     or "Error" in ln]
            out.append((t, "exit %d: %s" % (r.returncode,
                                            " | ".join(lines[:3])[:300])))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=os.path.join(SRC, "build-mutation"))
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    mutants = [m for m in MUTANTS if not a.only or m[0] in a.only]
    if a.only and len(mutants) != len(a.only):
        known = {m[0] for m in MUTANTS}
        log("FAIL unknown mutant(s): %s" %
            ", ".join(n for n in a.only if n not in known))
        return 1
    if a.list:
        for name, path, _, _, tests in mutants:
            log("%-30s %-26s %s" % (name, path, " ".join(tests)))
        return 0
    t0 = time.time()
    src = os.path.join(a.work, "src")
    build = os.path.join(a.work, "build")
    os.makedirs(src, exist_ok=True)
    mirror(src)
    if not configure(src, build):
        return 1
    tests = sorted({t for m in mutants for t in m[4]})
    ok, out = build_tests(build, tests)
    if not ok:
        log("FAIL the unmutated tests do not build:\n" + out)
        return 1
    bad = failing_tests(build, tests)
    if bad:
        log("FAIL baseline: the unmutated tests fail: %s" % bad)
        return 1
    log("baseline: %d tests pass unmutated (%.0f s)" %
        (len(tests), time.time() - t0))
    survived, broken = [], []
    for name, path, old, new, mtests in mutants:
        t1 = time.time()
        f = os.path.join(src, path)
        with open(f) as fh:
            orig = fh.read()
        if orig.count(old) != 1:
            log("FAIL %s: its text occurs %d times in %s (the code changed; "
                "update the mutant)" % (name, orig.count(old), path))
            broken.append(name)
            continue
        try:
            with open(f, "w") as fh:
                fh.write(orig.replace(old, new))
            ok, out = build_tests(build, mtests)
            if not ok:
                log("FAIL %s: the mutant does not build:\n%s" % (name, out))
                broken.append(name)
                continue
            caught = failing_tests(build, mtests)
        finally:
            with open(f, "w") as fh:
                fh.write(orig)
        if caught:
            log("caught   %-30s (%.0f s) by %s" %
                (name, time.time() - t1,
                 "; ".join("%s: %s" % c for c in caught)))
        else:
            log("SURVIVED %-30s (%.0f s): %s all pass" %
                (name, time.time() - t1, " ".join(mtests)))
            survived.append(name)
    # Leave the build matching the sources again.
    build_tests(build, tests)
    log("%d mutants, %d caught, %d survived, %d did not apply/build "
        "(%.0f s)" % (len(mutants), len(mutants) - len(survived) -
                      len(broken), len(survived), len(broken),
                      time.time() - t0))
    return 1 if survived or broken else 0


if __name__ == "__main__":
    sys.exit(main())
