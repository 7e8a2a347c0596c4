#!/usr/bin/python3
"""Independent float64 reference of `--method gvote` (DESIGN.md §4.8) with
S = 0 synthetic queries: per chunk and layer, after the chunk's attention,
every KV head keeps the union of its query heads' real nucleus sets (the
chunk's last query, softmax over the chunk's n keys, sorted descending with
ties to the earlier key, B = (number of prefix sums strictly below p) + 1,
at most n) and the forced keys of §4.4; when that union is larger than the
§4.3 keep count of the head's group (the reservation), the forced keys and
then the most-voted keys (ties: earlier) up to that count. Each head keeps
its own count; decode appends every head uncompressed.

With S > 0 the synthetic queries come from the C side's seeded generator,
so the reference does not replay them; `first_chunk_sets` gives what every
run must still contain: on the first chunk of a prompt (no history, so its
queries and keys do not depend on earlier compression) each head keeps
either the forced keys plus its real nucleus sets (when they fit) or
exactly the §4.3 count including the forced keys.

Shares no code with the C side; uses tangram_ref.py for the model math.

    gvote_ref.py --model DIR [--profile FILE|none] --prompt-ids JSON
                 [--prefill-chunk C] [--gvote-p P] [--forced-ids JSON] --json
prints {"prompt_logprobs", "kept_positions" [l][h] (absolute, sorted,
at the end), "forced_logprobs", "token_ids", "min_gap"}. min_gap is the
smallest distance of a nucleus prefix sum from p or of two probabilities
at the nucleus boundary (relative): below ~1e-5 fp32 may cut differently.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tangram_ref as tr  # noqa: E402


def nucleus(q0, k, d, p):
    """Real nucleus set of one query over the chunk's keys (n, d); returns
    (sorted index array, boundary gap)."""
    n = k.shape[0]
    s = k @ q0 / math.sqrt(d)
    a = np.exp(s - s.max())
    a = a / a.sum()
    order = np.lexsort((np.arange(n), -a))  # descending, ties earlier
    cs = np.cumsum(a[order])
    below = int(np.count_nonzero(cs < p))
    B = min(below + 1, n)
    gap = math.inf
    if B < n:
        # the prefix sum that crossed p, and the one before it
        gap = min(gap, abs(cs[B - 1] - p))
        if B >= 2:
            gap = min(gap, abs(p - cs[B - 2]))
        top = a[order[B - 1]]
        gap = min(gap, (top - a[order[B]]) / max(top, 1e-300))
    return order[:B], gap


def select(q_g, k_h, start, cap, p, d):
    """Kept chunk indices (ascending) of one KV head; q_g (G, d) last
    queries of its query heads; k_h (n, d)."""
    n = k_h.shape[0]
    votes = np.zeros(n, dtype=np.int64)
    gap = math.inf
    for g in range(q_g.shape[0]):
        idx, gg = nucleus(q_g[g], k_h, d, p)
        votes[idx] += 1
        gap = min(gap, gg)
    forced = tr.forced_mask(start, n)
    union = (votes > 0) | forced
    if int(union.sum()) <= cap:
        return np.nonzero(union)[0], gap
    rank = np.where(forced, np.inf, np.where(votes > 0, votes, -1.0))
    order = np.lexsort((np.arange(n), -rank))
    return np.sort(order[:cap]), gap


def _prefill_chunk(model, st, ids, start, head_budget, p):
    c = model.cfg
    n = len(ids)
    positions = np.arange(start, start + n)
    x = model.embed[np.asarray(ids)]
    G, d = c.group, c.head_dim
    f = int(tr.forced_mask(start, n).sum())
    for li, layer in enumerate(model.layers):
        q, k, v = tr._qkv(model, layer, x, positions)
        attn = np.zeros((n, c.n_heads, d))
        for h in range(c.n_kv_heads):
            q_g = q[:, h * G:(h + 1) * G, :].transpose(1, 0, 2)
            out = tr._attend(q_g, st.k[li][h], st.v[li][h], k[:, h], v[:, h], d)
            attn[:, h * G:(h + 1) * G, :] = out.transpose(1, 0, 2)
        x = tr._finish_layer(model, layer, x, attn)
        for h in range(c.n_kv_heads):
            cap = tr.keep_count(n, head_budget[li][h], f)
            keep, gap = select(q[n - 1, h * G:(h + 1) * G, :], k[:, h], start,
                               cap, p, d)
            st.min_gap = min(st.min_gap, gap)
            st.k[li][h] = np.concatenate([st.k[li][h], k[keep, h]])
            st.v[li][h] = np.concatenate([st.v[li][h], v[keep, h]])
            st.pos[li][h] = np.concatenate([st.pos[li][h], positions[keep]])
    return x


def run(model, ids, profile=None, prefill_chunk=512, p=0.95, forced_ids=()):
    c = model.cfg
    ids = [int(t) for t in ids]
    head_budget = tr.load_profile_budgets(profile, c)
    st = tr._State(c)
    hidden = [_prefill_chunk(model, st, ids[s:s + prefill_chunk], s,
                             head_budget, p)
              for s in range(0, len(ids), prefill_chunk)]
    hidden = np.concatenate(hidden)
    prompt_lp = [None]
    for r in range(0, len(ids), tr.LOGIT_BLOCK):
        blk = tr._logits(model, hidden[r:r + tr.LOGIT_BLOCK])
        lp = tr.log_softmax_rows(blk)
        for q in range(r + 1, min(r + tr.LOGIT_BLOCK + 1, len(ids))):
            prompt_lp.append(float(lp[q - 1 - r, ids[q]]))
        last = blk[-1]
    forced_lp = []
    cur = last
    pos = len(ids)
    for i, tok in enumerate(forced_ids):
        forced_lp.append(float(tr.log_softmax_rows(cur[None, :])[0, tok]))
        if i == len(forced_ids) - 1:
            break
        cur = tr._logits(model, tr._decode_token(model, st, int(tok),
                                                 pos)[None, :])[0]
        pos += 1
    return {
        "prompt_logprobs": prompt_lp,
        "forced_logprobs": forced_lp,
        "kept_positions": [[[int(x) for x in st.pos[li][h]]
                            for h in range(c.n_kv_heads)]
                           for li in range(c.n_layers)],
        "min_gap": st.min_gap,
    }


def first_chunk_sets(model, ids, profile=None, prefill_chunk=512, p=0.95):
    """For the first chunk of the prompt: per [layer][kv_head] a tuple
    (must, cap) — must = absolute positions of the forced keys and the
    real nucleus sets, cap = the §4.3 count — plus the smallest boundary
    gap. A run with any S keeps, of the first chunk, a superset of `must`
    when len(must) <= cap, else exactly `cap` keys including the forced."""
    c = model.cfg
    head_budget = tr.load_profile_budgets(profile, c)
    chunk = [int(t) for t in ids[:prefill_chunk]]
    n = len(chunk)
    positions = np.arange(n)
    x = model.embed[np.asarray(chunk)]
    G, d = c.group, c.head_dim
    forced = tr.forced_mask(0, n)
    f = int(forced.sum())
    out, gap = [], math.inf
    empty = np.zeros((0, d))
    for li, layer in enumerate(model.layers):
        q, k, v = tr._qkv(model, layer, x, positions)
        attn = np.zeros((n, c.n_heads, d))
        row = []
        for h in range(c.n_kv_heads):
            q_g = q[:, h * G:(h + 1) * G, :].transpose(1, 0, 2)
            attn[:, h * G:(h + 1) * G, :] = tr._attend(
                q_g, empty, empty, k[:, h], v[:, h], d).transpose(1, 0, 2)
            must = set(np.nonzero(forced)[0].tolist())
            for g in range(G):
                idx, gg = nucleus(q[n - 1, h * G + g], k[:, h], d, p)
                gap = min(gap, gg)
                must |= set(idx.tolist())
            row.append((sorted(must), tr.keep_count(n, head_budget[li][h], f),
                        sorted(np.nonzero(forced)[0].tolist())))
        out.append(row)
        x = tr._finish_layer(model, layer, x, attn)
    return out, gap


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", default="none")
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--gvote-p", type=float, default=0.95)
    ap.add_argument("--forced-ids", default="[]")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    model = tr.load_model(a.model)
    res = run(model, json.loads(a.prompt_ids), a.profile, a.prefill_chunk,
              a.gvote_p, json.loads(a.forced_ids))
    if not math.isfinite(res["min_gap"]):
        res["min_gap"] = None
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
