#!/usr/bin/env bash
# test_profile_cli.sh — tangram-profile end to end: generate a retention file,
# build profiles, and check build / splits / pages / tp / show output against
# an independent Python implementation of DESIGN.md §4.2, §4.3, §4.6, §4.7.
# Also checks that bad input gives a non-zero exit and a message naming it.
set -u

BIN="${TANGRAM_BIN:-$(dirname "$0")/../../build/bin}/tangram-profile"
if [ ! -x "$BIN" ]; then
    echo "FAIL: $BIN not built" >&2
    exit 1
fi
PY=${TANGRAM_PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 1
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# ---- a retention file: 40 samples, 4 layers, 8 KV heads ----------------------
$PY - <<'EOF'
import json, random
random.seed(7)
S, L, H = 40, 4, 8
base = [[random.random() ** 2 for _ in range(H)] for _ in range(L)]
samples = [[[min(1.0, max(0.0, round(base[l][h] + random.gauss(0, 0.05), 4)))
             for h in range(H)] for l in range(L)] for _ in range(S)]
samples[0][1][2] = 1.0            # clamps exercise
for s in range(S):                # two identical heads: a budget tie
    samples[s][2][5] = samples[s][2][1]
doc = {"format": "tangram-retention", "version": 1,
       "model": {"architecture": "Qwen3ForCausalLM", "num_layers": L,
                 "num_kv_heads": H, "head_dim": 128},
       "method": "snapkv", "target_ratio": 0.25, "samples": samples}
json.dump(doc, open("ret.json", "w"))
EOF

# ---- build ------------------------------------------------------------------
"$BIN" build --retention ret.json --heads-per-group 2 -o prof.json || fail "build"
"$BIN" build --retention ret.json --alpha 1.5 --heads-per-group 4 \
    --grouping adjacent -o adj.json || fail "build adjacent"
"$BIN" build --retention ret.json --heads-per-group 2 -o - > stdout.json || fail "build -o -"

# ---- outputs of the other commands ------------------------------------------
"$BIN" splits --profile prof.json --n-cta 132 > splits132.json || fail "splits 132"
"$BIN" splits --profile prof.json --n-cta 7 > splits7.json || fail "splits 7"
"$BIN" splits --profile adj.json --n-cta 64 > splits_adj.json || fail "splits adj"
"$BIN" pages --profile prof.json --tokens 3000 > pages3000.json || fail "pages"
"$BIN" pages --profile prof.json --tokens 777 --page-size 32 --prefill-chunk 100 \
    > pages777.json || fail "pages 777"
"$BIN" pages --profile adj.json --tokens 0 > pages0.json || fail "pages 0"
"$BIN" tp --profile prof.json --ranks 2 > tp2.json || fail "tp 2"
"$BIN" show --profile prof.json > show.txt || fail "show"

$PY - <<'EOF' || fails=$((fails + 1))
import json, math, sys

def load(p):
    return json.load(open(p))

ret = load("ret.json")
S = len(ret["samples"]); L = 4; H = 8
bad = []

def check(cond, what):
    if not cond:
        bad.append(what)

def stats(vals):
    m = math.fsum(vals) / len(vals)
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in vals) / len(vals))
    return m, sd

def regroup(budget, hp, grouping):
    order = list(range(len(budget)))
    if grouping == "clustered":
        order.sort(key=lambda h: (budget[h], h))
    return [order[i:i + hp] for i in range(0, len(order), hp)]

def check_profile(path, alpha, hp, grouping):
    p = load(path)
    check(p["format"] == "tangram-profile" and p["version"] == 1, path + " header")
    check(p["model"] == ret["model"], path + " model")
    check(p["method"] == "snapkv" and p["target_ratio"] == 0.25, path + " method")
    check(p["alpha"] == alpha and p["samples"] == S, path + " alpha/samples")
    check(p["heads_per_group"] == hp and p["grouping"] == grouping, path + " grouping")
    check(len(p["layers"]) == L, path + " layers")
    for l, lay in enumerate(p["layers"]):
        for h in range(H):
            m, sd = stats([ret["samples"][s][l][h] for s in range(S)])
            b = max(1 / 1024, min(1.0, m + alpha * sd))
            check(abs(lay["mean"][h] - m) < 1e-12, f"{path} mean[{l}][{h}]")
            check(abs(lay["std"][h] - sd) < 1e-12, f"{path} std[{l}][{h}]")
            check(abs(lay["budget"][h] - b) < 1e-12, f"{path} budget[{l}][{h}]")
        # grouping rule applied to the file's own budgets: exact
        check(lay["groups"] == regroup(lay["budget"], hp, grouping),
              f"{path} groups[{l}] {lay['groups']}")
    return p

prof = check_profile("prof.json", 2.0, 2, "clustered")
adj = check_profile("adj.json", 1.5, 4, "adjacent")
check(load("stdout.json") == prof, "build -o - differs from the file")
# the tie: heads 1 and 5 of layer 2 have identical samples
b2 = prof["layers"][2]["budget"]
check(b2[1] == b2[5], "tie budgets differ")
flat = [h for g in prof["layers"][2]["groups"] for h in g]
check(flat.index(1) < flat.index(5), "tie not broken by head index")

def round_half_away(x):
    i = math.floor(x)
    return i + 1 if x - i >= 0.5 else i

def splits(p, n_cta):
    out = []
    for lay in p["layers"]:
        B = lay["budget"]
        omega = 0.0
        for h in range(len(B)):
            omega += B[h]
        tau = omega / n_cta
        row = []
        for g in lay["groups"]:
            phi = 0.0
            for h in g:
                phi += B[h]
            row.append(max(1, round_half_away(phi / tau)))
        out.append(row)
    return out

for f, p, n in (("splits132.json", prof, 132), ("splits7.json", prof, 7),
                ("splits_adj.json", adj, 64)):
    got = load(f)
    check(got == {"n_cta": n, "splits": splits(p, n)}, f"{f}: {got}")

def forced(start, n, window=32, n_sink=4):
    if n <= 0:
        return 0
    w = min(window, n)
    win_lo = start + n - w
    sink_hi = min(n_sink, start + n)
    sinks = max(0, min(sink_hi, win_lo) - start) if sink_hi > start else 0
    return w + sinks

def turn_keep(n_new, chunk, b):
    kept = 0
    for off in range(0, n_new, chunk):
        n = min(chunk, n_new - off)
        if b >= 1.0:
            kept += n
        else:
            kept += min(n, max(math.ceil(b * n), forced(off, n)))
    return kept

def pages(p, tokens, P=16, C=512):
    tok, pg = [], []
    for lay in p["layers"]:
        gb = [max(lay["budget"][h] for h in g) for g in lay["groups"]]
        t = [turn_keep(tokens, C, b) for b in gb]
        tok.append(t)
        pg.append([-(-x // P) for x in t])
    ngroups = sum(len(r) for r in tok)
    mx = max(max(r) for r in tok)
    return {"tokens": tok, "pages": pg, "total_pages": sum(map(sum, pg)),
            "monolithic_pages": -(-mx // P) * ngroups}

check(load("pages3000.json") == pages(prof, 3000), "pages 3000")
check(load("pages777.json") == pages(prof, 777, 32, 100), "pages 777")
check(load("pages0.json") == pages(adj, 0), "pages 0")
p3 = load("pages3000.json")
check(p3["total_pages"] <= p3["monolithic_pages"], "ragged > monolithic")

tp = load("tp2.json")
check(tp["ranks"] == 2 and len(tp["heads"]) == 2, "tp shape")
for l, lay in enumerate(prof["layers"]):
    G = len(lay["groups"])
    want = [[], []]
    for i in range(G):
        rnd, pos = divmod(i, 2)
        want[pos if rnd % 2 == 0 else 1 - pos].append(i)
    for r in range(2):
        check(tp["groups"][r][l] == want[r], f"tp groups rank {r} layer {l}")
        heads = sorted(h for g in want[r] for h in lay["groups"][g])
        check(tp["heads"][r][l] == heads, f"tp heads rank {r} layer {l}")
        s = sum(lay["budget"][h] for h in heads)
        check(abs(tp["rank_budget"][r][l] - s) < 1e-12, "tp rank budget")
    check(sorted(tp["heads"][0][l] + tp["heads"][1][l]) == list(range(H)),
          "tp heads not a partition")

show = open("show.txt").read()
for needle in ("layer 3", "budgets:", "groups:", "reclaimable", "32768", "monolithic"):
    check(needle in show, "show lacks " + needle)

if bad:
    print("FAIL:", *bad[:20], sep="\n  ", file=sys.stderr)
    sys.exit(1)
EOF

# ---- bad input: non-zero exit, message on stderr naming the problem ---------
expect_fail() { # expect_fail NEEDLE CMD...
    local needle=$1
    shift
    if "$@" > out.txt 2> err.txt; then
        fail "succeeded: $*"
    elif ! grep -qF -- "$needle" err.txt; then
        fail "stderr of '$*' lacks '$needle': $(cat err.txt)"
    fi
    if [ -s out.txt ]; then
        fail "stdout not empty on error: $*"
    fi
}

$PY - <<'EOF'
import json
p = json.load(open("prof.json"))
p["layers"][0]["budget"][1] = 2.0
json.dump(p, open("bad_budget.json", "w"))
p = json.load(open("prof.json"))
p["layers"][3]["groups"][1][0] = p["layers"][3]["groups"][0][0]
json.dump(p, open("bad_groups.json", "w"))
p = json.load(open("prof.json"))
p["heads_per_group"] = 3
json.dump(p, open("bad_hpg.json", "w"))
p = json.load(open("prof.json"))
p["model"]["num_kv_heads"] = "8"
json.dump(p, open("bad_type.json", "w"))
r = json.load(open("ret.json"))
r["model"]["num_layers"] = 4.5
json.dump(r, open("bad_ret.json", "w"))
r = json.load(open("ret.json"))
r["samples"][3][2][1] = "x"
json.dump(r, open("bad_ret2.json", "w"))
EOF
printf '{"format": "tangram-profile", ' > truncated.json

expect_fail "missing.json" "$BIN" splits --profile missing.json --n-cta 4
expect_fail "truncated.json" "$BIN" splits --profile truncated.json --n-cta 4
expect_fail "layers[0].budget[1]" "$BIN" pages --profile bad_budget.json --tokens 10
expect_fail "appears twice" "$BIN" show --profile bad_groups.json
expect_fail "heads_per_group" "$BIN" splits --profile bad_hpg.json --n-cta 4
expect_fail "model.num_kv_heads" "$BIN" splits --profile bad_type.json --n-cta 4
expect_fail "model.num_layers" "$BIN" build --retention bad_ret.json --heads-per-group 2 -o x.json
expect_fail "samples[3][2][1]" "$BIN" build --retention bad_ret2.json --heads-per-group 2 -o x.json
expect_fail "heads_per_group" "$BIN" build --retention ret.json --heads-per-group 3 -o x.json
expect_fail "--retention" "$BIN" build --heads-per-group 2 -o x.json
expect_fail "--alpha" "$BIN" build --retention ret.json --alpha -1 --heads-per-group 2 -o x.json
expect_fail "--grouping" "$BIN" build --retention ret.json --grouping random --heads-per-group 2 -o x.json
expect_fail "--n-cta" "$BIN" splits --profile prof.json --n-cta 0
expect_fail "--n-cta" "$BIN" splits --profile prof.json --n-cta -3
expect_fail "--n-cta" "$BIN" splits --profile prof.json --n-cta 12abc
expect_fail "--n-cta" "$BIN" splits --profile prof.json
expect_fail "--tokens" "$BIN" pages --profile prof.json --tokens -1
expect_fail "--page-size" "$BIN" pages --profile prof.json --tokens 5 --page-size 0
expect_fail "--prefill-chunk" "$BIN" pages --profile prof.json --tokens 5 --prefill-chunk x
expect_fail "3 ranks" "$BIN" tp --profile prof.json --ranks 3
expect_fail "unknown flag '--bogus'" "$BIN" splits --profile prof.json --n-cta 4 --bogus
expect_fail "unknown option '-x'" "$BIN" splits --profile prof.json --n-cta 4 -x
expect_fail "unexpected argument" "$BIN" splits --profile prof.json --n-cta 4 extra
expect_fail "unknown command" "$BIN" frobnicate
[ -e x.json ] && fail "a failed build left x.json"

# ---- help ---------------------------------------------------------------------
for c in build show splits pages tp; do
    "$BIN" "$c" --help > help.txt 2>&1 || fail "$c --help exit status"
    grep -q "usage: tangram-profile $c" help.txt || fail "$c --help text"
    grep -q -- "--profile P\|--retention FILE" help.txt || fail "$c --help lacks its flags"
done
"$BIN" build --help | grep -q -- "-o, --output OUT" || fail "build --help lacks -o"
"$BIN" --help | grep -q "splits" || fail "top-level --help"

if [ "$fails" -ne 0 ]; then
    echo "$fails failure(s)" >&2
    exit 1
fi
echo "test_profile_cli: ok"
