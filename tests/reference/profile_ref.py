#!/usr/bin/python3
"""profile_ref.py - independent reference of `tangram-profile` semantics.

Executable form of DESIGN.md 4.2 (profile building: budgets and head
groups), 4.6 (the static split map, paper Algorithm 1) and the page
reservation of 4.3/4.5. Plain Python floats (IEEE double) throughout; no
code is shared with the C side.

    profile_ref.py build --retention F --alpha A --heads-per-group N
                         [--grouping clustered|adjacent] [-o OUT]
    profile_ref.py splits --profile P --n-cta N
    profile_ref.py pages --profile P --tokens N [--page-size 16]
                         [--prefill-chunk 512]

Definitions (exact):
  budget[l][h] = max(1/1024, min(1, mean + alpha * std)), mean and the
      population std (divide by S) over the S samples of retention[l][h].
  clustered groups: heads sorted by (budget asc, head index asc), H_p
      consecutive per group, in that order; adjacent: 0..H_p-1, H_p..
  b[l][g] = max budget over the group.
  splits: Omega = sum_h B[l][h], tau = Omega / N_CTA, Phi = sum of B over
      the group, S = max(1, round_half_away_from_zero(Phi / tau)).
  pages: tokens(l, g) = sum over chunks of min(n, max(ceil(b n), f)), f the
      snapkv forced keys of the chunk (last min(32, n) keys plus keys at
      absolute position < 4); pages = ceil(tokens / P);
      monolithic = ceil(max tokens / P) * number of groups over all layers.
"""

import argparse
import json
import math
import sys

MIN_BUDGET = 1.0 / 1024.0
SNAPKV_WINDOW = 32
SINK_TOKENS = 4


class ProfileError(Exception):
    """Malformed input; the message names the field."""


def _is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and \
        math.isfinite(x)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------

def check_retention(ret):
    """Validates a tangram-retention document; returns (S, L, H)."""
    if not isinstance(ret, dict) or ret.get("format") != "tangram-retention":
        raise ProfileError("retention: format must be \"tangram-retention\"")
    if ret.get("version") != 1:
        raise ProfileError("retention: version must be 1")
    samples = ret.get("samples")
    if not isinstance(samples, list) or not samples:
        raise ProfileError("retention: samples must be a non-empty list")
    first = samples[0]
    if not isinstance(first, list) or not first or \
            not isinstance(first[0], list) or not first[0]:
        raise ProfileError("retention: samples[0] must be a non-empty "
                           "[L][H] array")
    S, L, H = len(samples), len(first), len(first[0])
    for s, smp in enumerate(samples):
        if not isinstance(smp, list) or len(smp) != L:
            raise ProfileError(f"retention: samples[{s}] must have {L} layers")
        for li, row in enumerate(smp):
            if not isinstance(row, list) or len(row) != H:
                raise ProfileError(f"retention: samples[{s}][{li}] must have "
                                   f"{H} heads")
            for h, x in enumerate(row):
                if not _is_num(x) or not 0.0 <= x <= 1.0:
                    raise ProfileError(f"retention: samples[{s}][{li}][{h}] "
                                       f"= {x!r} is not a ratio in [0, 1]")
    model = ret.get("model", {})
    if not isinstance(model, dict):
        raise ProfileError("retention: model must be an object")
    if model.get("num_layers", L) != L or model.get("num_kv_heads", H) != H:
        raise ProfileError("retention: model.num_layers/num_kv_heads do not "
                           "match the samples")
    return S, L, H


def head_stats(values):
    """Mean and population std (two-pass, divide by S) of a list."""
    s = len(values)
    mean = sum(values) / s
    var = sum((x - mean) * (x - mean) for x in values) / s
    return mean, math.sqrt(var)


def head_budget(mean, std, alpha):
    return max(MIN_BUDGET, min(1.0, mean + alpha * std))


def make_groups(budgets, hp, grouping):
    """Head groups of one layer (lists of head indices, in group order)."""
    H = len(budgets)
    if grouping == "adjacent":
        order = list(range(H))
    elif grouping == "clustered":
        order = sorted(range(H), key=lambda h: (budgets[h], h))
    else:
        raise ProfileError(f"unknown grouping {grouping!r}")
    return [order[i:i + hp] for i in range(0, H, hp)]


def build_profile(ret, alpha, heads_per_group, grouping="clustered"):
    """Returns the profile dict of DESIGN 4.2 built from retention `ret`."""
    S, L, H = check_retention(ret)
    if not _is_num(alpha) or alpha < 0:
        raise ProfileError("alpha must be a finite number >= 0")
    if not _is_int(heads_per_group) or heads_per_group < 1 or \
            H % heads_per_group:
        raise ProfileError(f"heads per group {heads_per_group} must divide "
                           f"the {H} KV heads")
    samples = ret["samples"]
    layers = []
    for li in range(L):
        means, stds, budgets = [], [], []
        for h in range(H):
            m, sd = head_stats([float(samples[s][li][h]) for s in range(S)])
            means.append(m)
            stds.append(sd)
            budgets.append(head_budget(m, sd, float(alpha)))
        layers.append({"mean": means, "std": stds, "budget": budgets,
                       "groups": make_groups(budgets, heads_per_group,
                                             grouping)})
    model = dict(ret.get("model", {}))
    model.setdefault("num_layers", L)
    model.setdefault("num_kv_heads", H)
    return {
        "format": "tangram-profile", "version": 1,
        "model": model,
        "method": ret.get("method", "snapkv"),
        "target_ratio": ret.get("target_ratio"),
        "alpha": float(alpha),
        "samples": S,
        "heads_per_group": heads_per_group,
        "grouping": grouping,
        "layers": layers,
    }


# --------------------------------------------------------------------------
# profile access
# --------------------------------------------------------------------------

def check_profile(prof):
    """Validates a profile document; returns (L, H)."""
    if not isinstance(prof, dict) or prof.get("format") != "tangram-profile" \
            or prof.get("version") != 1:
        raise ProfileError("profile: not a tangram-profile version 1 document")
    layers = prof.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ProfileError("profile: layers must be a non-empty list")
    H = None
    for li, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise ProfileError(f"profile: layers[{li}] is not an object")
        budget = layer.get("budget")
        if not isinstance(budget, list) or not budget or \
                (H is not None and len(budget) != H):
            raise ProfileError(f"profile: layers[{li}].budget has a bad "
                               "length")
        H = len(budget)
        for h, b in enumerate(budget):
            if not _is_num(b) or not 0.0 < b <= 1.0:
                raise ProfileError(f"profile: layers[{li}].budget[{h}] = "
                                   f"{b!r} is not in (0, 1]")
        groups = layer.get("groups")
        if not isinstance(groups, list) or not groups or any(
                not isinstance(g, list) or not g for g in groups):
            raise ProfileError(f"profile: layers[{li}].groups must be a list "
                               "of non-empty lists")
        flat = [h for g in groups for h in g]
        if any(not _is_int(h) for h in flat) or sorted(flat) != list(range(H)):
            raise ProfileError(f"profile: layers[{li}].groups do not "
                               f"partition heads 0..{H - 1}")
    return len(layers), H


def group_budgets(prof):
    """b[l][g] = max budget over group g of layer l."""
    check_profile(prof)
    return [[max(layer["budget"][h] for h in g) for g in layer["groups"]]
            for layer in prof["layers"]]


# --------------------------------------------------------------------------
# splits (DESIGN 4.6)
# --------------------------------------------------------------------------

def round_half_away(x):
    """round() with halves away from zero, exact for every double (no
    x + 0.5 rounding trap: x - floor(x) is exact)."""
    if x < 0:
        return -round_half_away(-x)
    f = math.floor(x)
    return int(f) + (1 if x - f >= 0.5 else 0)


def split_map(prof, n_cta):
    """S[l][g] of paper Algorithm 1 for `n_cta` CTAs."""
    check_profile(prof)
    if not _is_int(n_cta) or n_cta < 1:
        raise ProfileError("n_cta must be an integer >= 1")
    out = []
    for layer in prof["layers"]:
        B = layer["budget"]
        omega = 0.0
        for b in B:
            omega += b
        tau = omega / n_cta
        row = []
        for g in layer["groups"]:
            phi = 0.0
            for h in g:
                phi += B[h]
            row.append(max(1, round_half_away(phi / tau)))
        out.append(row)
    return out


# --------------------------------------------------------------------------
# pages (DESIGN 4.3, 4.5)
# --------------------------------------------------------------------------

def chunk_forced(start, n, window=SNAPKV_WINDOW, n_sink=SINK_TOKENS):
    """|{last min(window, n) keys} U {keys at absolute position < n_sink}|
    for a chunk of n keys starting at absolute position `start`."""
    window_keys = set(range(start + n - min(window, n), start + n))
    sink_keys = set(range(start, min(start + n, n_sink)))
    return len(window_keys | sink_keys)


def chunk_keep(n, b, f):
    """min(n, max(ceil(b n), f)), b n in double precision."""
    if b >= 1.0:
        return n
    return min(n, max(math.ceil(b * n), f))


def turn_tokens(n_tokens, b, chunk, start=0):
    """Tokens a head of group budget b keeps of a turn of n_tokens."""
    total = 0
    for off in range(0, n_tokens, chunk):
        n = min(chunk, n_tokens - off)
        total += chunk_keep(n, b, chunk_forced(start + off, n))
    return total


def pages(prof, n_tokens, page_size=16, prefill_chunk=512):
    """The reservation of a request of n_tokens prompt tokens."""
    if not _is_int(n_tokens) or n_tokens < 0:
        raise ProfileError("tokens must be an integer >= 0")
    if not _is_int(page_size) or page_size < 1:
        raise ProfileError("page size must be an integer >= 1")
    if not _is_int(prefill_chunk) or prefill_chunk < 1:
        raise ProfileError("prefill chunk must be an integer >= 1")
    gb = group_budgets(prof)
    toks = [[turn_tokens(n_tokens, b, prefill_chunk) for b in row]
            for row in gb]
    pgs = [[-(-t // page_size) for t in row] for row in toks]
    n_groups = sum(len(row) for row in gb)
    max_tok = max(t for row in toks for t in row)
    return {"tokens": toks, "pages": pgs,
            "total_pages": sum(sum(row) for row in pgs),
            "monolithic_pages": -(-max_tok // page_size) * n_groups}


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def _load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ProfileError(f"{path}: {e}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description="reference of tangram-profile")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--retention", required=True)
    b.add_argument("--alpha", type=float, default=2.0)
    b.add_argument("--heads-per-group", type=int, required=True)
    b.add_argument("--grouping", choices=("clustered", "adjacent"),
                   default="clustered")
    b.add_argument("-o", "--output")
    s = sub.add_parser("splits")
    s.add_argument("--profile", required=True)
    s.add_argument("--n-cta", type=int, required=True)
    p = sub.add_parser("pages")
    p.add_argument("--profile", required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--prefill-chunk", type=int, default=512)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            out = build_profile(_load(args.retention), args.alpha,
                                args.heads_per_group, args.grouping)
        elif args.cmd == "splits":
            out = {"n_cta": args.n_cta,
                   "splits": split_map(_load(args.profile), args.n_cta)}
        else:
            out = pages(_load(args.profile), args.tokens, args.page_size,
                        args.prefill_chunk)
    except ProfileError as e:
        print(f"profile_ref: {e}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=2) + "\n"
    if args.cmd == "build" and args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
