#!/usr/bin/python3
"""Independent float64 reference of decode-time compression
`--decode-compress trig` (DESIGN.md §4.9) on top of tangram_ref.py's model
math. Shares no code with the C side.

calibrate(model, samples): the statistics of `tangram-profile calibrate
--trig` — per layer and query head, over every prompt position of every
sample (each run alone with full KV), the pre-RoPE query (after q_norm)
paired rotate-half, z_f = x_f + i x_{f+d/2}: mean Re z, mean Im z,
mean |z|.

run(model, ids, ...): chunked prefill with snapkv compression (§4.3, from
tangram_ref), then teacher-forced decode; after the step whose append makes
the count of tokens decoded this turn a multiple of `every`, each head
whose decode region (the decode appends of this turn) is longer than its
cap keeps its cap: the last `window` always, the rest by the trigonometric
score for the next position t (ties: earlier slot), order preserved.
caps: C[l][h] = max(F, round_half_away(c * B[l][h] / mean_h B[l][h])),
F = 4 + window, B the profile's per-head budgets (1 without a profile);
uniform: every head c. Score of stored key k (post-RoPE) for query head q,
offsets O = {2^0..2^16}: mean over q, o of
  [sum_f Re(qbar_f e^{i w_f (t+o)} conj(k_f)) + (abs_f - |qbar_f|) |k_f|]
  / sqrt(d),
with w_f the model's RoPE frequencies rounded to fp32 (the C model keeps
them in fp32; the angles are formed in double on both sides).

    trig_ref.py --model DIR [--profile FILE|none] --stats FILE
                --prompt-ids JSON --forced-ids JSON [--prefill-chunk C]
                [--decode-budget c] [--decode-every B] [--decode-window W]
                [--uniform] [--tie-tol X] [--flip TRIGGER,LAYER,HEAD ...]
                --json
prints {"kept_positions" [l][h] (absolute, sorted, at the end),
"forced_logprobs", "triggers", "min_gap", "ties", "flips",
"prefill_min_gap"}: min_gap is the smallest relative score gap between the
last kept and first dropped key of any trigger (below ~1e-6 fp32 may choose
the other); ties lists [trigger, layer, head, gap] of every decode selection
whose gap is below --tie-tol (triggers count from 1); prefill_min_gap is the
smallest snapkv top-k boundary gap of the prefill.

Near-ties: the C side scores fp32 keys (their rounding depends on the BLAS
kernel), so where the float64 boundary gap is below fp32 noise (scores agree
to ~1e-7 relative) it may keep the first dropped key instead of the last
kept one. Such a decision changes what later steps attend to even when a
later trigger evicts both keys again. run(..., flips=...) takes the other
side of the named ties (swap the boundary pair), and branches() yields the
reference's own run first and then every combination of flipped ties, so a
test can accept exactly the runs that differ from the reference only in how
they decided a near-tie.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tangram_ref as tr  # noqa: E402

OFFSETS = [1 << i for i in range(17)]
SINKS = 4


def _pre_rope_qkv(model, layer, x):
    """q, k, v of the rows of x before RoPE (after q/k norm)."""
    c = model.cfg
    n = x.shape[0]
    h = tr.rmsnorm(x, layer["in_norm"], c.eps)
    q = h @ layer["wq"].T
    k = h @ layer["wk"].T
    v = h @ layer["wv"].T
    if layer["bq"] is not None:
        q, k, v = q + layer["bq"], k + layer["bk"], v + layer["bv"]
    q = q.reshape(n, c.n_heads, c.head_dim)
    k = k.reshape(n, c.n_kv_heads, c.head_dim)
    v = v.reshape(n, c.n_kv_heads, c.head_dim)
    if c.qk_norm:
        q = tr.rmsnorm(q, layer["q_norm"], c.eps)
        k = tr.rmsnorm(k, layer["k_norm"], c.eps)
    return q, k, v


def calibrate(model, samples):
    """Returns {"re", "im", "abs"}: each [L][Hq][d/2] float lists."""
    c = model.cfg
    half = c.head_dim // 2
    sre = np.zeros((c.n_layers, c.n_heads, half))
    sim = np.zeros_like(sre)
    sab = np.zeros_like(sre)
    rows = 0
    G, d = c.group, c.head_dim
    for ids in samples:
        n = len(ids)
        pos = np.arange(n)
        x = model.embed[np.asarray(ids)]
        empty = np.zeros((0, d))
        for li, layer in enumerate(model.layers):
            q, k, v = _pre_rope_qkv(model, layer, x)
            a, b = q[..., :half], q[..., half:]
            sre[li] += a.sum(axis=0)
            sim[li] += b.sum(axis=0)
            sab[li] += np.sqrt(a * a + b * b).sum(axis=0)
            q = tr.apply_rope(q, pos, model.inv_freq)
            k = tr.apply_rope(k, pos, model.inv_freq)
            attn = np.zeros((n, c.n_heads, d))
            for h in range(c.n_kv_heads):
                q_g = q[:, h * G:(h + 1) * G, :].transpose(1, 0, 2)
                attn[:, h * G:(h + 1) * G, :] = tr._attend(
                    q_g, empty, empty, k[:, h], v[:, h], d).transpose(1, 0, 2)
            x = tr._finish_layer(model, layer, x, attn)
        rows += n
    return {"re": (sre / rows).tolist(), "im": (sim / rows).tolist(),
            "abs": (sab / rows).tolist()}


def round_half_away(x):
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def caps(head_budgets, c, window, uniform):
    """C[l][h] of §4.9 from per-head budgets [l][h]."""
    F = SINKS + window
    out = []
    for b in head_budgets:
        mean = sum(b) / len(b)
        out.append([c if uniform else max(F, round_half_away(c * x / mean))
                    for x in b])
    return out


def head_budgets(profile, cfg):
    """Per-head (not group) budgets of a profile path / None."""
    if profile is None or profile == "none":
        return [[1.0] * cfg.n_kv_heads for _ in range(cfg.n_layers)]
    with open(profile, encoding="utf-8") as f:
        doc = json.load(f)
    return [[float(x) for x in layer["budget"]] for layer in doc["layers"]]


def scores(keys, stats_l, h, G, freq, t, d):
    """Score of each key (n, d) of KV head h for next position t."""
    half = d // 2
    kz = keys[:, :half] + 1j * keys[:, half:]          # (n, half)
    total = np.zeros(keys.shape[0])
    for g in range(G):
        qh = h * G + g
        qbar = np.asarray(stats_l["re"][qh]) + 1j * np.asarray(stats_l["im"][qh])
        ab = np.asarray(stats_l["abs"][qh])
        for o in OFFSETS:
            rot = qbar * np.exp(1j * freq * float(t + o))  # (half,)
            total += np.real(rot[None, :] * np.conj(kz)).sum(axis=1)
            total += ((ab - np.abs(qbar))[None, :] * np.abs(kz)).sum(axis=1)
    return total / (G * len(OFFSETS) * math.sqrt(d))


def select(score, cap, window, flip=False):
    """Kept indices (ascending) of a region of len(score) entries; also
    the relative gap at the boundary. flip: keep the first dropped entry
    instead of the last kept one (the other side of the boundary; the gap
    returned is the same)."""
    n = len(score)
    keep = set(range(n - window, n))
    m = n - window
    want = cap - window
    order = sorted(range(m), key=lambda i: (-score[i], i))
    gap = math.inf
    if 0 < want < m:
        a, b = score[order[want - 1]], score[order[want]]
        gap = abs(a - b) / max(abs(a), 1e-300)
        if flip:
            order[want - 1], order[want] = order[want], order[want - 1]
    keep |= set(order[:want])
    return np.asarray(sorted(keep)), gap


def run(model, ids, profile, stats, prefill_chunk, forced_ids, budget,
        every, window, uniform, flips=(), tie_tol=0.0):
    """The §4.9 run; `flips`: (trigger, layer, head) selections decided
    the other way (select(flip=True)); selections whose gap is below
    `tie_tol` are listed in the result's "ties"."""
    c = model.cfg
    flips = {tuple(f) for f in flips}
    ids = [int(t) for t in ids]
    st = tr._State(c)
    gb = tr.load_profile_budgets(profile, c)
    for s in range(0, len(ids), prefill_chunk):
        hidden = tr._prefill_chunk(model, st, ids[s:s + prefill_chunk], s, gb)
    cap = caps(head_budgets(profile, c), budget, window, uniform)
    dstart = [[st.k[li][h].shape[0] for h in range(c.n_kv_heads)]
              for li in range(c.n_layers)]
    freq = np.asarray(model.inv_freq, dtype=np.float32).astype(np.float64)
    # Teacher forcing: no step needs the previous step's logits, so the
    # final hidden states are kept and the lm_head runs over blocks of
    # them at the end (it is most of the time, one row at a time).
    hiddens = [hidden[-1]]
    triggers, min_gap, ties = 0, math.inf, []
    pos, decoded = len(ids), 0
    for i, tok in enumerate(forced_ids):
        if i == len(forced_ids) - 1:
            break
        hiddens.append(tr._decode_token(model, st, int(tok), pos))
        pos += 1
        decoded += 1
        if decoded % every != 0:
            continue
        triggers += 1
        for li in range(c.n_layers):
            for h in range(c.n_kv_heads):
                a = dstart[li][h]
                n = st.k[li][h].shape[0] - a
                if n <= cap[li][h]:
                    continue
                sc = scores(st.k[li][h][a:], stats[li], h, c.group, freq,
                            pos, c.head_dim)
                keep, gap = select(sc, cap[li][h], window,
                                   (triggers, li, h) in flips)
                min_gap = min(min_gap, gap)
                if gap < tie_tol:
                    ties.append([triggers, li, h, gap])
                for arr in ("k", "v", "pos"):
                    cur_arr = getattr(st, arr)[li][h]
                    getattr(st, arr)[li][h] = np.concatenate(
                        [cur_arr[:a], cur_arr[a:][keep]])
    forced_lp = []
    for r in range(0, len(forced_ids), tr.LOGIT_BLOCK):
        lp = tr.log_softmax_rows(tr._logits(
            model, np.stack(hiddens[r:r + tr.LOGIT_BLOCK])))
        forced_lp += [float(lp[j, int(t)]) for j, t in
                      enumerate(forced_ids[r:r + tr.LOGIT_BLOCK])]
    return {
        "kept_positions": [[[int(x) for x in st.pos[li][h]]
                            for h in range(c.n_kv_heads)]
                           for li in range(c.n_layers)],
        "forced_logprobs": forced_lp,
        "triggers": triggers,
        "min_gap": min_gap,
        "ties": ties,
        "flips": sorted(flips),
        "prefill_min_gap": st.min_gap,
    }


def branches(model, ids, profile, stats, prefill_chunk, forced_ids, budget,
             every, window, uniform, tie_tol):
    """Yields run()'s result for the reference's own decisions first, then,
    depth first, for every set of its near-ties (gap < tie_tol) decided the
    other way. A branch flips only ties after its last flip in (trigger,
    layer, head) order, so each set is produced once; a flip does not move
    the ties before it or beside it in its trigger (the heads' selections
    of one trigger do not depend on one another), but a branch lists the
    ties of its own later triggers. Each result is a fresh run (the
    caller stops when it has found what it wants)."""
    stack = [()]
    while stack:
        flips = stack.pop()
        res = run(model, ids, profile, stats, prefill_chunk, forced_ids,
                  budget, every, window, uniform, flips, tie_tol)
        yield res
        last = flips[-1] if flips else (0, -1, -1)
        stack.extend(reversed([flips + (tuple(t[:3]),) for t in res["ties"]
                               if tuple(t[:3]) > last]))


def load_stats(path, cfg):
    """The profile file's trig statistics as [l] dicts of [Hq][d/2]."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    layers = doc["trig"]["layers"]
    if len(layers) != cfg.n_layers:
        raise tr.RefError("trig statistics: wrong layer count")
    return layers


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", default="none")
    ap.add_argument("--stats", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--forced-ids", required=True)
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--decode-budget", type=int, default=2048)
    ap.add_argument("--decode-every", type=int, default=128)
    ap.add_argument("--decode-window", type=int, default=32)
    ap.add_argument("--uniform", action="store_true")
    ap.add_argument("--tie-tol", type=float, default=0.0)
    ap.add_argument("--flip", action="append", default=[],
                    help="TRIGGER,LAYER,HEAD: decide that selection the "
                         "other way (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    flips = []
    for f in a.flip:
        try:
            t, li, h = (int(x) for x in f.split(","))
        except ValueError:
            ap.error(f"--flip {f!r}: expected TRIGGER,LAYER,HEAD")
        flips.append((t, li, h))
    model = tr.load_model(a.model)
    res = run(model, json.loads(a.prompt_ids), a.profile,
              load_stats(a.stats, model.cfg), a.prefill_chunk,
              json.loads(a.forced_ids), a.decode_budget, a.decode_every,
              a.decode_window, a.uniform, flips, a.tie_tol)
    for key in ("min_gap", "prefill_min_gap"):
        if not math.isfinite(res[key]):
            res[key] = None
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
