#!/usr/bin/python3
"""tangram-profile calibrate --method gvote (DESIGN.md §4.2, §4.8 and the
choices after it; docs/PROFILES.md) on the tiny qwen3 model (2 layers, 2 KV
heads), samples of 100-260 prompt ids cut into chunks of 64.

1. S = 0 (deterministic), p = 0.5: for every sample the retention file's
   r[s][l][h] equals (keys head h of layer l keeps over all the sample's
   chunks) / (sample tokens) as the independent numpy reference
   tests/reference/gvote_ref.py computes it with no profile (k_cap = n);
   a mismatch is tolerated (and reported) only where the reference saw a
   nucleus boundary within 1e-5 (fp32 may cut there). The profile's mean
   and std are the population statistics of those reference ratios
   (1e-12), budgets and groups are profile_ref.build_profile's, method is
   "gvote", target_ratio the mean of all ratios, samples the count.
2. S = 8 (the default): every ratio is in (0, 1], is a whole number of
   keys over the sample length, keeps at least every chunk's forced keys,
   and on layer 0 (whose queries and keys do not depend on the history)
   at least the S = 0 reference's keys; two runs with --seed 5 write
   identical retention files and profiles; sample i equals
   tangram-generate --method gvote --seed 5+i --dump-kept with no profile
   (the documented seed of each sample); with --trig the same retention
   and a trig object of both layers.
3. The gvote profile at work: tangram-generate with --method snapkv keeps
   exactly the §4.3 reservation (profile_ref.turn_tokens), with --method
   gvote at most it; tangramd with the profile and --method gvote, and
   with --method snapkv, answers a greedy completion with tangram-generate's
   text.
4. Bad flags are usage errors (exit 2) whose message names the flag:
   --ratio with gvote, no --ratio with snapkv, gvote flags with snapkv,
   out-of-range --gvote-p / --gvote-samples / --gvote-future /
   --prefill-chunk / --seed, an unknown --method.

Fails, naming it, when a program or the tokenizer is missing.
"""
import json
import math
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

sys.path.insert(0, os.path.join(du.SOURCE, "tests", "reference"))
import gvote_ref as gr  # noqa: E402
import profile_ref as pr  # noqa: E402
import tangram_ref as tr  # noqa: E402

C = du.Checker()
CHUNK = 64
P = 0.5
GAP_TOL = 1e-5
SEED = 5
LENS = (100, 130, 171, 200, 259)


def sample_ids(i, n):
    return [(j * (31 + 2 * i) + 7 * i + 3) % 3000 + 100 for j in range(n)]


def run(args, timeout=300):
    return subprocess.run(args, capture_output=True, text=True,
                          timeout=timeout)


def calibrate(model, samples, out, extra):
    r = run([du.prog("tangram-profile"), "calibrate", "--model", model,
             "--samples", samples, "--method", "gvote", "--heads-per-group",
             "1", "--prefill-chunk", str(CHUNK), "--gvote-p", str(P),
             "-o", out] + extra)
    return r


def forced_total(n):
    return sum(pr.chunk_forced(off, min(CHUNK, n - off))
               for off in range(0, n, CHUNK))


def pop_stats(xs):
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def exact_case(model, samples, work, ref_counts, gaps):
    out = os.path.join(work, "s0.json")
    r = calibrate(model, samples, out, ["--gvote-samples", "0"])
    if not C.check(r.returncode == 0, "S=0: calibrate --method gvote runs",
                   r.stderr[-800:]):
        return None
    C.check("sample %d/%d" % (len(LENS), len(LENS)) in r.stderr,
            "S=0: progress on stderr", r.stderr[-300:])
    ret = json.load(open(os.path.join(work, "s0.retention.json")))
    prof = json.load(open(out))
    try:
        S, L, H = pr.check_retention(ret)
    except pr.ProfileError as e:
        C.check(False, "S=0: the retention file is well formed", str(e))
        return None
    C.check((S, ret["method"]) == (len(LENS), "gvote"),
            "S=0: retention has %d samples of method gvote" % len(LENS),
            (S, ret["method"]))
    exact, unexplained = True, 0
    for s, n in enumerate(LENS):
        for l in range(L):
            for h in range(H):
                got = ret["samples"][s][l][h] * n
                want = ref_counts[s][l][h]
                if abs(got - want) < 1e-6:
                    continue
                exact = False
                if gaps[s] >= GAP_TOL:
                    unexplained += 1
                print("%s: sample %d layer %d head %d keeps %.3f keys, the "
                      "reference %d (gap %.2g)" %
                      ("note" if gaps[s] < GAP_TOL else "FAIL", s, l, h, got,
                       want, gaps[s]))
    C.check(unexplained == 0, "S=0: every retention sample equals the "
            "reference's kept / tokens (or sits at a nucleus boundary)",
            unexplained)
    if not exact and unexplained == 0:
        print("note: a nucleus boundary within %g made a count differ; the "
              "statistics are checked against the file" % GAP_TOL)
    ratios = ([[[ref_counts[s][l][h] / n for h in range(H)]
                for l in range(L)] for s, n in enumerate(LENS)]
              if exact else ret["samples"])
    ok = True
    for l in range(L):
        for h in range(H):
            m, sd = pop_stats([ratios[s][l][h] for s in range(S)])
            a = prof["layers"][l]
            if abs(a["mean"][h] - m) > 1e-12 or abs(a["std"][h] - sd) > 1e-12:
                ok = False
                C.check(False, "S=0: layer %d head %d mean/std %r/%r, the "
                        "reference %r/%r" % (l, h, a["mean"][h], a["std"][h],
                                             m, sd))
    C.check(ok, "S=0: the profile's mean and std are the population "
            "statistics of the reference's ratios (1e-12)")
    want = pr.build_profile(dict(ret, samples=ratios), 2.0, 1, "clustered")
    C.check(all(a["groups"] == b["groups"] and
                all(abs(x - y) <= 1e-12 for x, y in zip(a["budget"],
                                                        b["budget"]))
                for a, b in zip(prof["layers"], want["layers"])),
            "S=0: budgets and groups are profile_ref.build_profile's")
    flat = [x for smp in ratios for lay in smp for x in lay]
    C.check(prof["method"] == "gvote" and prof["samples"] == S and
            abs(prof["target_ratio"] - sum(flat) / len(flat)) < 1e-12 and
            abs(ret["target_ratio"] - prof["target_ratio"]) < 1e-15,
            "S=0: the profile records method gvote, %d samples and "
            "target_ratio = the mean of all ratios" % S,
            (prof["method"], prof["samples"], prof["target_ratio"]))
    return out


def random_case(model, samples, work, ref_counts):
    outs = []
    for k in range(2):
        out = os.path.join(work, "s8_%d.json" % k)
        r = calibrate(model, samples, out, ["--seed", str(SEED)])
        if not C.check(r.returncode == 0, "S=8: calibrate run %d" % k,
                       r.stderr[-800:]):
            return
        outs.append(out)
    rets = [open(os.path.join(work, "s8_%d.retention.json" % k)).read()
            for k in range(2)]
    profs = [open(o).read() for o in outs]
    C.check(rets[0] == rets[1] and profs[0] == profs[1],
            "S=8: two runs with --seed %d write identical files" % SEED)
    ret = json.loads(rets[0])
    bad = []
    for s, n in enumerate(LENS):
        for l, lay in enumerate(ret["samples"][s]):
            for h, x in enumerate(lay):
                k = x * n
                if not (0 < x <= 1) or abs(k - round(k)) > 1e-6:
                    bad.append(("range/whole", s, l, h, x))
                elif round(k) < forced_total(n):
                    bad.append(("forced", s, l, h, round(k)))
                elif l == 0 and round(k) < ref_counts[s][0][h]:
                    bad.append(("layer 0 below S=0", s, h, round(k)))
    C.check(not bad, "S=8: every ratio is whole keys in (0, 1], keeps the "
            "forced keys, and layer 0 keeps at least the S=0 reference's",
            bad[:5])
    # The documented seed: sample i is a request of seed SEED + i.
    same = True
    for s, n in enumerate(LENS):
        g = run([du.prog("tangram-generate"), "--model", model, "--profile",
                 "none", "--method", "gvote", "--gvote-p", str(P),
                 "--prefill-chunk", str(CHUNK), "--seed", str(SEED + s),
                 "--prompt-ids", json.dumps(sample_ids(s, n)),
                 "--max-tokens", "0", "--dump-kept", "--json"])
        if g.returncode != 0:
            same = False
            C.check(False, "tangram-generate --dump-kept sample %d" % s,
                    g.stderr[-500:])
            continue
        kept = json.loads(g.stdout)["kept_positions"]
        got = [[round(x * n) for x in lay] for lay in ret["samples"][s]]
        want = [[len(h) for h in lay] for lay in kept]
        if got != want:
            same = False
            C.check(False, "S=8: sample %d kept %s, tangram-generate --seed "
                    "%d %s" % (s, got, SEED + s, want))
    C.check(same, "S=8: sample i keeps what tangram-generate --method gvote "
            "--seed %d+i keeps" % SEED)
    # --trig rides along: the same retention, plus the statistics.
    out = os.path.join(work, "s8_trig.json")
    r = calibrate(model, samples, out, ["--seed", str(SEED), "--trig"])
    ok = r.returncode == 0
    if ok:
        t = json.load(open(out)).get("trig", {}).get("layers", [])
        same_ret = open(os.path.join(work, "s8_trig.retention.json")).read() \
            == rets[0]
    C.check(ok and len(t) == 2 and same_ret,
            "S=8: --trig with gvote writes the statistics of both layers and "
            "the same retention", r.stderr[-500:])


def generate(model, prof, ids, method):
    r = run([du.prog("tangram-generate"), "--model", model, "--profile", prof,
             "--method", method, "--prefill-chunk", str(CHUNK),
             "--prompt-ids", json.dumps(ids), "--max-tokens", "6",
             "--temperature", "0", "--seed", "3", "--json"])
    return json.loads(r.stdout) if r.returncode == 0 else r.stderr[-500:]


def profile_at_work(model, prof_path, work):
    prof = json.load(open(prof_path))
    ids = sample_ids(9, 190)
    want = [[pr.turn_tokens(len(ids), b, CHUNK) for b in lay]
            for lay in pr.group_budgets(prof)]
    refs = {}
    for method in ("snapkv", "gvote"):
        g = generate(model, prof_path, ids, method)
        if not C.check(isinstance(g, dict), "tangram-generate --profile "
                       "(gvote) --method %s runs" % method, g):
            continue
        refs[method] = g
        got = g["kv"]["prompt_tokens_kept"]
        if method == "snapkv":
            C.check(got == want, "snapkv under the gvote profile keeps the "
                    "§4.3 reservation exactly", (got, want))
        else:
            C.check(all(a <= b for ra, rb in zip(got, want)
                        for a, b in zip(ra, rb)),
                    "gvote under its profile keeps at most the reservation",
                    (got, want))
    for method in ("gvote", "snapkv"):
        if method not in refs:
            continue
        sub = os.path.join(work, "d_" + method)
        os.makedirs(sub)
        d = du.Daemon(model, sub, profile=prof_path,
                      args=["--method", method, "--heads-per-group", "1",
                            "--prefill-chunk", str(CHUNK)])
        try:
            if not C.check(d.start(), "tangramd --profile (gvote) --method %s"
                           " ready" % method, d.log_text()[-2000:]):
                continue
            st, _, raw = du.http("POST", d.base_url + "/v1/completions",
                                 {"model": "model", "prompt": ids,
                                  "max_tokens": 6, "temperature": 0,
                                  "seed": 3}, timeout=120)
            j = du.json_of(raw)
            C.check(st == 200 and j is not None and
                    j["choices"][0]["text"] == refs[method]["text"],
                    "tangramd --method %s with the gvote profile answers "
                    "tangram-generate's text" % method,
                    (st, raw[:300], refs[method]["text"]))
        finally:
            d.stop()


def bad_flags(model, samples, work):
    out = os.path.join(work, "bad.json")
    base = [du.prog("tangram-profile"), "calibrate", "--model", model,
            "--samples", samples, "-o", out]
    cases = [
        (["--method", "gvote", "--ratio", "0.3"], "--ratio does not apply"),
        (["--method", "snapkv"], "--ratio is required"),
        (["--ratio", "0.3", "--gvote-p", "0.5"],
         "--gvote-p applies to --method gvote only"),
        (["--ratio", "0.3", "--prefill-chunk", "64"],
         "--prefill-chunk applies to --method gvote only"),
        (["--ratio", "0.3", "--seed", "4"], "--seed applies"),
        (["--method", "gvote", "--gvote-p", "0"], "--gvote-p"),
        (["--method", "gvote", "--gvote-p", "1.5"], "--gvote-p"),
        (["--method", "gvote", "--gvote-samples", "257"], "--gvote-samples"),
        (["--method", "gvote", "--gvote-samples", "-1"], "--gvote-samples"),
        (["--method", "gvote", "--gvote-future", "0"], "--gvote-future"),
        (["--method", "gvote", "--prefill-chunk", "0"], "--prefill-chunk"),
        (["--method", "gvote", "--seed", "-2"], "--seed"),
        (["--method", "gvote", "--gvote-p", "abc"], "--gvote-p"),
        (["--method", "gvotes"], "unknown method 'gvotes'"),
    ]
    for extra, needle in cases:
        r = run(base + extra, timeout=60)
        C.check(r.returncode == 2 and needle in r.stderr and
                not os.path.exists(out),
                "calibrate %s is a usage error naming %r" %
                (" ".join(extra), needle), (r.returncode, r.stderr[-300:]))


def main():
    missing = du.missing_inputs(programs=du.ALL_PROGRAMS)
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgcalgv")
    try:
        model = du.make_model(os.path.join(work, "model"))
        samples = os.path.join(work, "s.jsonl")
        with open(samples, "w") as f:
            for i, n in enumerate(LENS):
                f.write(json.dumps({"prompt_ids": sample_ids(i, n)}) + "\n")
        m = tr.load_model(model)
        ref_counts, gaps = [], []
        for i, n in enumerate(LENS):
            res = gr.run(m, sample_ids(i, n), None, CHUNK, P)
            ref_counts.append([[len(h) for h in lay]
                               for lay in res["kept_positions"]])
            gaps.append(res["min_gap"])
        C.check(any(c < n for cnt, n in zip(ref_counts, LENS)
                    for lay in cnt for c in lay),
                "the reference keeps fewer keys than the sample has "
                "(p = %g compresses)" % P, ref_counts)
        prof = exact_case(model, samples, work, ref_counts, gaps)
        random_case(model, samples, work, ref_counts)
        if prof is not None:
            profile_at_work(model, prof, work)
        bad_flags(model, samples, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
