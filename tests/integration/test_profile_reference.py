#!/usr/bin/python3
"""tangram-profile (C) against tests/reference/profile_ref.py (numpy-free
Python reference of DESIGN.md 4.2, 4.3 and 4.6).

Random retention files (various S, L, H, H_p, alpha, both groupings),
including heads whose budget clamps to 1 and to 1/1024, heads with equal
budgets (clustering ties go to the lower head index) and dyadic budgets
that put exact .5 ties into the split map (round half away from zero).
For each, `tangram-profile build -o` must give the reference's mean, std
and budgets within 1e-12 and the same groups; `splits` and `pages` must
match exactly, on the C-built and on the reference-built profile file.
Malformed inputs must make the program exit non-zero.

Fails, naming it, when tangram-profile is not built.
"""

import fractions
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("TANGRAM_SOURCE",
                     os.path.dirname(os.path.dirname(os.path.dirname(
                         os.path.abspath(__file__)))))
BIN = os.environ.get("TANGRAM_BIN", os.path.join(SRC, "build", "bin"))
sys.path.insert(0, os.path.join(SRC, "tests", "reference"))

import profile_ref as pr  # noqa: E402

PROG = os.path.join(BIN, "tangram-profile")
TOL = 1e-12

failures = []
checks = 0


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, file=sys.stderr)


def tool(*args):
    """Runs tangram-profile; returns (rc, stdout, stderr)."""
    p = subprocess.run([PROG] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def tool_json(what, *args):
    rc, out, err = tool(*args)
    if rc != 0:
        fail(f"{what}: tangram-profile {' '.join(map(str, args))} exited "
             f"{rc}: {err.strip()[:300]}")
        return None
    try:
        return json.loads(out)
    except ValueError as e:
        fail(f"{what}: stdout is not JSON ({e}): {out[:200]!r}")
        return None


def close_lists(a, b):
    if not isinstance(a, list) or len(a) != len(b):
        return False
    return all(isinstance(x, (int, float)) and abs(x - y) <= TOL
               for x, y in zip(a, b))


def compare_profile(what, got, want):
    global checks
    checks += 1
    for key in ("format", "version", "heads_per_group", "samples", "method",
                "model"):
        if got.get(key) != want[key]:
            fail(f"{what}: {key} = {got.get(key)!r}, reference "
                 f"{want[key]!r}")
    for key in ("alpha", "target_ratio"):
        g = got.get(key)
        if not isinstance(g, (int, float)) or abs(g - want[key]) > TOL:
            fail(f"{what}: {key} = {g!r}, reference {want[key]!r}")
    gl = got.get("layers")
    if not isinstance(gl, list) or len(gl) != len(want["layers"]):
        fail(f"{what}: layers has the wrong length")
        return
    for li, (g, w) in enumerate(zip(gl, want["layers"])):
        for key in ("mean", "std", "budget"):
            if not close_lists(g.get(key), w[key]):
                fail(f"{what}: layers[{li}].{key} = {g.get(key)} differs from "
                     f"the reference {w[key]} (tolerance {TOL})")
        if g.get("groups") != w["groups"]:
            fail(f"{what}: layers[{li}].groups = {g.get('groups')}, "
                 f"reference {w['groups']} (budgets {w['budget']})")


def random_retention(rng, case):
    S = int(rng.choice([1, 2, 3, 7, 50]))
    L = int(rng.choice([1, 2, 4]))
    H = int(rng.choice([1, 2, 4, 8, 12]))
    x = rng.uniform(0.0, 1.0, (S, L, H))
    if rng.random() < 0.5:
        x = np.round(x, 3)
    for li in range(L):
        for h in range(H):
            r = rng.random()
            if r < 0.1:
                x[:, li, h] = 1.0                      # budget 1 exactly
            elif r < 0.2:
                x[:, li, h] = rng.uniform(0.85, 1.0, S)  # clamps via alpha
            elif r < 0.3:
                x[:, li, h] = 0.0                      # 1/1024
            elif r < 0.35:
                x[:, li, h] = 0.0002                   # below 1/1024
            elif r < 0.45 and h > 0:
                x[:, li, h] = x[:, li, int(rng.integers(0, h))]  # equal
            elif r < 0.5:
                x[:, li, h] = rng.uniform(0.0, 0.3)    # constant: std 0
    ret = {"format": "tangram-retention", "version": 1,
           "model": {"architecture": "Qwen3ForCausalLM", "num_layers": L,
                     "num_kv_heads": H, "head_dim": 128},
           "method": "snapkv", "target_ratio": float(rng.choice([0.1, 0.25,
                                                                  0.5])),
           "samples": x.tolist()}
    divisors = [d for d in range(1, H + 1) if H % d == 0]
    hp = int(rng.choice(divisors))
    alpha = float(rng.choice([0.0, 0.5, 1.0, 2.0, 3.25]))
    grouping = "adjacent" if case % 4 == 3 else "clustered"
    return ret, alpha, hp, grouping


def dyadic_retention(rng):
    """S = 1 (std 0) and budgets in multiples of 1/8: every tau = Omega / N
    for N a power of two is exact, so Phi / tau hits exact halves."""
    L, H = int(rng.choice([1, 2, 3])), int(rng.choice([2, 4, 8]))
    x = rng.integers(1, 9, (1, L, H)) / 8.0
    ret = {"format": "tangram-retention", "version": 1,
           "model": {"architecture": "LlamaForCausalLM", "num_layers": L,
                     "num_kv_heads": H, "head_dim": 64},
           "method": "snapkv", "target_ratio": 0.25, "samples": x.tolist()}
    return ret, 2.0, int(rng.choice([1, 2])), "clustered"


def half_ties(prof, n_cta):
    """Number of groups whose exact Phi / tau is k + 1/2."""
    n = 0
    for layer in prof["layers"]:
        om = sum(fractions.Fraction(b) for b in layer["budget"])
        for g in layer["groups"]:
            phi = sum(fractions.Fraction(layer["budget"][h]) for h in g)
            if (phi * n_cta / om).denominator == 2:
                n += 1
    return n


def check_splits_pages(what, path, prof, rng, n_ctas):
    global checks
    for n_cta in n_ctas:
        got = tool_json(f"{what} splits n_cta={n_cta}", "splits", "--profile",
                        path, "--n-cta", n_cta)
        want = {"n_cta": n_cta, "splits": pr.split_map(prof, n_cta)}
        checks += 1
        if got is not None and (got.get("n_cta") != n_cta or
                                got.get("splits") != want["splits"]):
            fail(f"{what}: splits n_cta={n_cta}: {got}, reference {want}")
    for _ in range(3):
        tokens = int(rng.choice([1, 3, 4, 5, 31, 32, 33, 36, 37, 100, 511,
                                 512, 513, 1000, 2049, 5000]))
        psz = int(rng.choice([16, 16, 1, 7, 32]))
        chunk = int(rng.choice([512, 512, 16, 33, 64, 1000]))
        got = tool_json(f"{what} pages", "pages", "--profile", path,
                        "--tokens", tokens, "--page-size", psz,
                        "--prefill-chunk", chunk)
        want = pr.pages(prof, tokens, psz, chunk)
        checks += 1
        if got is None:
            continue
        for key in ("tokens", "pages", "total_pages", "monolithic_pages"):
            if got.get(key) != want[key]:
                fail(f"{what}: pages tokens={tokens} P={psz} C={chunk}: "
                     f"{key} = {got.get(key)}, reference {want[key]}")


def run_case(tmp, name, ret, alpha, hp, grouping, rng, n_ctas):
    rp = os.path.join(tmp, name + ".retention.json")
    cp = os.path.join(tmp, name + ".c.json")
    pp = os.path.join(tmp, name + ".ref.json")
    with open(rp, "w") as f:
        json.dump(ret, f)
    want = pr.build_profile(ret, alpha, hp, grouping)
    with open(pp, "w") as f:
        json.dump(want, f)
    what = f"{name} (S={len(ret['samples'])} L={len(ret['samples'][0])} " \
           f"H={len(ret['samples'][0][0])} H_p={hp} alpha={alpha} {grouping})"
    rc, out, err = tool("build", "--retention", rp, "--alpha", repr(alpha),
                        "--heads-per-group", hp, "--grouping", grouping,
                        "-o", cp)
    if rc != 0:
        fail(f"{what}: build exited {rc}: {err.strip()[:300]}")
        return
    try:
        with open(cp) as f:
            got = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{what}: build -o wrote no readable JSON: {e}")
        return
    compare_profile(what, got, want)
    check_splits_pages(what + " [C-built]", cp, want, rng, n_ctas)
    check_splits_pages(what + " [ref-built]", pp, want, rng, n_ctas[:2])


def expect_error(what, *args):
    global checks
    checks += 1
    rc, out, err = tool(*args)
    if rc == 0:
        fail(f"malformed input accepted ({what}): exit 0, stdout {out[:200]!r}")
    elif not err.strip():
        fail(f"malformed input ({what}): exit {rc} but nothing on stderr")


def malformed(tmp):
    good = {"format": "tangram-retention", "version": 1,
            "model": {"architecture": "Qwen3ForCausalLM", "num_layers": 1,
                      "num_kv_heads": 4, "head_dim": 64},
            "method": "snapkv", "target_ratio": 0.25,
            "samples": [[[0.1, 0.2, 0.3, 0.4]], [[0.2, 0.2, 0.3, 0.5]]]}

    def write(name, doc):
        p = os.path.join(tmp, name)
        with open(p, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        return p

    gp = write("bad-good.json", good)
    expect_error("heads per group 3 does not divide 4", "build",
                 "--retention", gp, "--alpha", "2", "--heads-per-group", "3",
                 "-o", os.path.join(tmp, "x.json"))
    expect_error("heads per group 0", "build", "--retention", gp, "--alpha",
                 "2", "--heads-per-group", "0", "-o",
                 os.path.join(tmp, "x.json"))
    for name, doc in (
            ("format", dict(good, format="tangram-profile")),
            ("empty samples", dict(good, samples=[])),
            ("ragged samples", dict(good, samples=[[[0.1, 0.2, 0.3, 0.4]],
                                                   [[0.1, 0.2, 0.3]]])),
            ("non-number", dict(good, samples=[[[0.1, "x", 0.3, 0.4]]])),
            ("truncated JSON", json.dumps(good)[:40])):
        p = write("bad-" + name.replace(" ", "_") + ".json", doc)
        expect_error(f"retention: {name}", "build", "--retention", p,
                     "--alpha", "2", "--heads-per-group", "2", "-o",
                     os.path.join(tmp, "x.json"))
    expect_error("missing retention file", "build", "--retention",
                 os.path.join(tmp, "nope.json"), "--alpha", "2",
                 "--heads-per-group", "2", "-o", os.path.join(tmp, "x.json"))
    prof = pr.build_profile(good, 2.0, 2)
    pp = write("bad-prof-good.json", prof)
    expect_error("n-cta 0", "splits", "--profile", pp, "--n-cta", "0")
    bad = json.loads(json.dumps(prof))
    bad["layers"][0]["groups"] = [[0, 1], [1, 2]]
    bp = write("bad-prof-groups.json", bad)
    expect_error("groups do not partition the heads", "splits", "--profile",
                 bp, "--n-cta", "8")
    expect_error("groups do not partition the heads", "pages", "--profile",
                 bp, "--tokens", "100")
    bad = json.loads(json.dumps(prof))
    bad["layers"][0]["budget"][1] = 0.0
    expect_error("budget 0", "pages", "--profile",
                 write("bad-prof-b0.json", bad), "--tokens", "100")
    expect_error("page size 0", "pages", "--profile", pp, "--tokens", "100",
                 "--page-size", "0")


def main():
    if not os.access(PROG, os.X_OK):
        print(f"FAIL: {PROG} is not built")
        return 1
    rng = np.random.default_rng(20261120)
    ties = 0
    with tempfile.TemporaryDirectory(prefix="tg-profref-") as tmp:
        for case in range(24):
            ret, alpha, hp, grouping = random_retention(rng, case)
            n_ctas = [int(n) for n in rng.choice([1, 3, 7, 64, 132, 264, 1000],
                                                 3, replace=False)]
            run_case(tmp, f"random{case}", ret, alpha, hp, grouping, rng,
                     n_ctas)
        for case in range(16):
            ret, alpha, hp, grouping = dyadic_retention(rng)
            prof = pr.build_profile(ret, alpha, hp, grouping)
            n_ctas = [1, 2, 4, 8, 16, 32]
            ties += sum(half_ties(prof, n) for n in n_ctas)
            run_case(tmp, f"dyadic{case}", ret, alpha, hp, grouping, rng,
                     n_ctas)
        malformed(tmp)
    if ties == 0:
        fail("the dyadic cases produced no exact .5 tie in the split map")
    print(f"{checks} comparisons, {ties} exact .5 split ties, "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
