#!/usr/bin/python3
"""Self-consistency of the numpy references in tests/reference/.

Needs nothing from the C build. Writes tiny random Hugging Face models
(Qwen3 fp32, Qwen2 bf16 with q/k/v bias in two shards, Llama bf16 with
Llama-3 rope_scaling and tied embeddings) with its own safetensors writer
and checks that
  * the safetensors reader matches the format's published sample files;
  * plain causal attention equals a slow per-token loop implementation
    written independently here (complex-number RoPE, scalar softmax);
  * without a profile, chunked prefill (C = 3, 7, 64) equals unchunked;
  * a profile of budgets 1 equals no profile;
  * with low budgets, the retained history per head equals the closed-form
    reservation of profile_ref, keeps every forced key, and only chunks
    after the first change their prompt log-probabilities;
  * greedy decoding equals teacher-forced argmax (no profile) and a decode
    step equals a 1-token chunk (with a profile);
  * pooling, forced keys, top-k ties and the profile math on hand-made data;
  * trig_ref's near-tie branches: select(flip=True) swaps exactly the
    boundary pair, branches() yields the reference's own run first and then
    distinct flip sets, and a flipped run equals the own run up to the
    flipped trigger and differs after it.
"""

import cmath
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

SRC = os.environ.get("TANGRAM_SOURCE",
                     os.path.dirname(os.path.dirname(os.path.dirname(
                         os.path.abspath(__file__)))))
DATA = os.environ.get("TANGRAM_DATA", os.path.join(SRC, "data"))
REF = os.path.join(SRC, "tests", "reference")
sys.path.insert(0, REF)

import itertools  # noqa: E402

import profile_ref as pr  # noqa: E402
import tangram_ref as tr  # noqa: E402
import trig_ref  # noqa: E402


# --------------------------------------------------------------------------
# tiny safetensors writer and model factory
# --------------------------------------------------------------------------

def to_bf16_bits(a):
    """float -> bf16 bit patterns, round to nearest even."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def write_safetensors(path, tensors, dtype):
    """Writes {name: array} as `dtype` (F32, F16, BF16); returns the stored
    values as float64 arrays (what a reader must get back)."""
    header, blobs, stored, off = {}, [], {}, 0
    for name, arr in tensors.items():
        arr = np.asarray(arr, np.float64)
        if dtype == "BF16":
            bits = to_bf16_bits(arr)
            raw = bits.astype("<u2").tobytes()
            stored[name] = (bits.astype(np.uint32) << 16).view(
                np.float32).astype(np.float64)
        else:
            npd = {"F32": "<f4", "F16": "<f2"}[dtype]
            raw = arr.astype(npd).tobytes()
            stored[name] = arr.astype(npd).astype(np.float64)
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for raw in blobs:
            f.write(raw)
    return stored


def make_model(path, arch, dtype, seed, tie=False, rope_scaling=None,
               shards=1, hidden=32, layers=2, heads=4, kv=2, head_dim=16,
               ffn=48, vocab=97, theta=10000.0):
    """Writes a random model directory; returns (config dict, stored
    weights dict)."""
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    qd, kd = heads * head_dim, kv * head_dim

    def mat(*shape, s=0.3):
        return rng.normal(0.0, s, shape)

    w = {"model.embed_tokens.weight": mat(vocab, hidden, s=1.0),
         "model.norm.weight": 1.0 + mat(hidden, s=0.1)}
    if not tie:
        w["lm_head.weight"] = mat(vocab, hidden, s=0.5)
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1.0 + mat(hidden, s=0.1)
        w[p + "post_attention_layernorm.weight"] = 1.0 + mat(hidden, s=0.1)
        w[p + "self_attn.q_proj.weight"] = mat(qd, hidden)
        w[p + "self_attn.k_proj.weight"] = mat(kd, hidden)
        w[p + "self_attn.v_proj.weight"] = mat(kd, hidden)
        w[p + "self_attn.o_proj.weight"] = mat(hidden, qd, s=0.2)
        if arch == "Qwen2ForCausalLM":
            w[p + "self_attn.q_proj.bias"] = mat(qd, s=0.5)
            w[p + "self_attn.k_proj.bias"] = mat(kd, s=0.5)
            w[p + "self_attn.v_proj.bias"] = mat(kd, s=0.5)
        if arch == "Qwen3ForCausalLM":
            w[p + "self_attn.q_norm.weight"] = 1.0 + mat(head_dim, s=0.2)
            w[p + "self_attn.k_norm.weight"] = 1.0 + mat(head_dim, s=0.2)
        w[p + "mlp.gate_proj.weight"] = mat(ffn, hidden)
        w[p + "mlp.up_proj.weight"] = mat(ffn, hidden)
        w[p + "mlp.down_proj.weight"] = mat(hidden, ffn, s=0.2)
    cfg = {"architectures": [arch], "hidden_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": head_dim,
           "intermediate_size": ffn, "vocab_size": vocab,
           "rms_norm_eps": 1e-6, "rope_theta": theta,
           "rope_scaling": rope_scaling, "tie_word_embeddings": tie,
           "eos_token_id": [vocab - 1]}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    names = list(w)
    stored = {}
    if shards == 1:
        stored = write_safetensors(os.path.join(path, "model.safetensors"),
                                   w, dtype)
    else:
        wmap = {}
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: w[n] for n in names[s::shards]}
            stored.update(write_safetensors(os.path.join(path, fn), part,
                                            dtype))
            wmap.update({n: fn for n in part})
        with open(os.path.join(path, "model.safetensors.index.json"),
                  "w") as f:
            json.dump({"metadata": {}, "weight_map": wmap}, f)
    return cfg, stored


def write_profile(path, cfg, budgets, hp, grouping="clustered"):
    """A tangram-profile file with the given [L][H] budgets."""
    layers = []
    for row in budgets:
        layers.append({"mean": list(row), "std": [0.0] * len(row),
                       "budget": list(row),
                       "groups": pr.make_groups(list(row), hp, grouping)})
    prof = {"format": "tangram-profile", "version": 1,
            "model": {"architecture": cfg["architectures"][0],
                      "num_layers": cfg["num_hidden_layers"],
                      "num_kv_heads": cfg["num_key_value_heads"],
                      "head_dim": cfg["head_dim"]},
            "method": "snapkv", "target_ratio": 0.25, "alpha": 2.0,
            "samples": 1, "heads_per_group": hp, "layers": layers}
    with open(path, "w") as f:
        json.dump(prof, f)
    return prof


# --------------------------------------------------------------------------
# slow independent forward (plain causal attention, no compression)
# --------------------------------------------------------------------------

def naive_inv_freq(cfg):
    d = cfg["head_dim"]
    out = []
    rs = cfg.get("rope_scaling")
    for i in range(d // 2):
        f = cfg["rope_theta"] ** (-2.0 * i / d)
        if rs:
            wl = 2 * math.pi / f
            old = rs["original_max_position_embeddings"]
            lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
            if wl < old / hi:
                pass                      # high frequency: unchanged
            elif wl > old / lo:
                f = f / rs["factor"]      # low frequency: interpolated
            else:                         # band between: blend
                a = (old / wl - lo) / (hi - lo)
                f = (1 - a) * f / rs["factor"] + a * f
        out.append(f)
    return out


def naive_logprobs(cfg, w, ids):
    H, KV, d = (cfg["num_attention_heads"], cfg["num_key_value_heads"],
                cfg["head_dim"])
    G, eps = H // KV, cfg["rms_norm_eps"]
    inv = naive_inv_freq(cfg)
    qwen3 = cfg["architectures"][0] == "Qwen3ForCausalLM"

    def norm(v, g):
        r = 1.0 / math.sqrt(sum(t * t for t in v) / len(v) + eps)
        return np.array([v[i] * r * g[i] for i in range(len(v))])

    def rope(v, p):
        out = np.array(v, dtype=np.float64)
        for i in range(d // 2):
            z = complex(v[i], v[i + d // 2]) * cmath.exp(1j * p * inv[i])
            out[i], out[i + d // 2] = z.real, z.imag
        return out

    xs = [w["model.embed_tokens.weight"][t].copy() for t in ids]
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        ks, vs, outs = [], [], []
        for pos, x in enumerate(xs):
            h = norm(x, w[p + "input_layernorm.weight"])
            q = w[p + "self_attn.q_proj.weight"].dot(h)
            k = w[p + "self_attn.k_proj.weight"].dot(h)
            v = w[p + "self_attn.v_proj.weight"].dot(h)
            if p + "self_attn.q_proj.bias" in w:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            qh = [q[i * d:(i + 1) * d] for i in range(H)]
            kh = [k[i * d:(i + 1) * d] for i in range(KV)]
            if qwen3:
                qh = [norm(t, w[p + "self_attn.q_norm.weight"]) for t in qh]
                kh = [norm(t, w[p + "self_attn.k_norm.weight"]) for t in kh]
            ks.append([rope(t, pos) for t in kh])
            vs.append([v[i * d:(i + 1) * d] for i in range(KV)])
            att = []
            for qi in range(H):
                qr = rope(qh[qi], pos)
                kvh = qi // G
                sc = [float(qr.dot(ks[j][kvh])) / math.sqrt(d)
                      for j in range(pos + 1)]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                tot = sum(e)
                att.append(sum(e[j] / tot * vs[j][kvh]
                               for j in range(pos + 1)))
            outs.append(np.concatenate(att))
        new = []
        for x, a in zip(xs, outs):
            x = x + w[p + "self_attn.o_proj.weight"].dot(a)
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            g = w[p + "mlp.gate_proj.weight"].dot(h)
            u = w[p + "mlp.up_proj.weight"].dot(h)
            act = np.array([gi / (1 + math.exp(-gi)) * ui
                            for gi, ui in zip(g, u)])
            new.append(x + w[p + "mlp.down_proj.weight"].dot(act))
        xs = new
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    lps = [None]
    for pos in range(1, len(ids)):
        lg = head.dot(norm(xs[pos - 1], w["model.norm.weight"]))
        m = max(lg)
        lse = m + math.log(sum(math.exp(t - m) for t in lg))
        lps.append(lg[ids[pos]] - lse)
    return lps


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0,
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}

MODELS = {
    "qwen3": dict(arch="Qwen3ForCausalLM", dtype="F32", seed=11),
    "qwen2": dict(arch="Qwen2ForCausalLM", dtype="BF16", seed=12, shards=2),
    "llama": dict(arch="LlamaForCausalLM", dtype="BF16", seed=13, tie=True,
                  rope_scaling=LLAMA3_SCALING, theta=500000.0),
}


def max_lp_diff(a, b):
    return max(abs(x - y) for x, y in zip(a[1:], b[1:]))


class Fixture:
    tmp = None
    models = {}


def setUpModule():
    Fixture.tmp = tempfile.TemporaryDirectory(prefix="tg-refself-")
    for name, kw in MODELS.items():
        d = os.path.join(Fixture.tmp.name, name)
        cfg, stored = make_model(d, **kw)
        Fixture.models[name] = (d, cfg, stored, tr.load_model(d))


def tearDownModule():
    Fixture.tmp.cleanup()


def prompt(n, vocab, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


class TestSafetensors(unittest.TestCase):
    def test_samples(self):
        sd = os.path.join(DATA, "safetensors_samples")
        self.assertTrue(os.path.isdir(sd), "project data missing: " + sd)
        overall = tr.read_safetensors(os.path.join(sd, "overall.safetensors"))
        self.assertEqual(sorted(overall), sorted("BHIbdefhi"))
        for name, arr in overall.items():
            one = tr.read_safetensors(os.path.join(sd, name + ".safetensors"))
            np.testing.assert_array_equal(one[name], arr)
            self.assertEqual(arr.shape, (6,))
        # The float samples hold the same six small values in each width.
        np.testing.assert_array_equal(overall["e"], overall["d"])
        np.testing.assert_array_equal(overall["f"], overall["d"])

    def test_bf16_bits(self):
        bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0000, 0x3EAB], np.uint16)
        got = tr.bf16_to_f32(bits)
        self.assertEqual(list(got[:4]), [1.0, -2.0, math.inf, 0.0])
        self.assertAlmostEqual(float(got[4]), 0.333984375, places=12)

    def test_roundtrip_and_malformed(self):
        rng = np.random.default_rng(5)
        t = {"a": rng.normal(size=(3, 5)), "b": rng.normal(size=(7,))}
        with tempfile.TemporaryDirectory() as d:
            for dt in ("F32", "F16", "BF16"):
                p = os.path.join(d, dt + ".safetensors")
                stored = write_safetensors(p, t, dt)
                got = tr.read_safetensors(p)
                for n in t:
                    np.testing.assert_array_equal(got[n], stored[n])
                    np.testing.assert_allclose(got[n], t[n], rtol=1e-2,
                                               atol=1e-2)
            bad = os.path.join(d, "bad.safetensors")
            with open(os.path.join(d, "F32.safetensors"), "rb") as f:
                blob = f.read()
            for cut in (blob[:5], blob[:20], blob[:-4]):
                with open(bad, "wb") as f:
                    f.write(cut)
                with self.assertRaises(tr.RefError):
                    tr.read_safetensors(bad)


class TestPieces(unittest.TestCase):
    def test_pool(self):
        np.testing.assert_allclose(tr.pool_avg5([5, 0, 0, 0, 0, 0, 0]),
                                   [1, 1, 1, 0, 0, 0, 0])
        np.testing.assert_allclose(tr.pool_avg5([0, 0, 0, 10, 0, 0, 0]),
                                   [0, 2, 2, 2, 2, 2, 0])
        np.testing.assert_allclose(tr.pool_avg5([1.0]), [0.2])
        np.testing.assert_allclose(tr.pool_avg5([1.0, 2.0]), [0.6, 0.6])
        np.testing.assert_allclose(tr.pool_avg5([1, 2, 3, 4, 5, 6]),
                                   [6 / 5, 10 / 5, 15 / 5, 20 / 5, 18 / 5,
                                    15 / 5])

    def test_forced(self):
        m = tr.forced_mask(0, 40)
        self.assertEqual(list(np.nonzero(m)[0]), [0, 1, 2, 3] +
                         list(range(8, 40)))
        self.assertEqual(int(tr.forced_mask(2, 40).sum()), 34)
        self.assertEqual(int(tr.forced_mask(100, 40).sum()), 32)
        self.assertTrue(tr.forced_mask(0, 10).all())
        self.assertEqual(int(tr.forced_mask(3, 33).sum()), 33)
        self.assertEqual(int(tr.forced_mask(1, 40).sum()), 35)
        for start in (0, 1, 2, 3, 4, 5, 30, 512):
            for n in (1, 2, 4, 5, 31, 32, 33, 35, 36, 37, 100, 512):
                self.assertEqual(int(tr.forced_mask(start, n).sum()),
                                 pr.chunk_forced(start, n), (start, n))

    def test_keep_count(self):
        self.assertEqual(tr.keep_count(100, 0.25, 36), 36)
        self.assertEqual(tr.keep_count(200, 0.25, 36), 50)
        self.assertEqual(tr.keep_count(100, 0.07, 0), 8)  # 0.07*100 > 7 in double
        self.assertEqual(tr.keep_count(64, 0.25, 0), 16)
        self.assertEqual(tr.keep_count(10, 1.0, 0), 10)
        self.assertEqual(tr.keep_count(10, 0.5, 12), 10)
        for n in (1, 7, 33, 64, 100, 512):
            for b in (1 / 1024, 0.1, 0.3, 0.5, 0.77, 0.999, 1.0):
                for f in (0, 4, 32, 36):
                    self.assertEqual(tr.keep_count(n, b, f),
                                     pr.chunk_keep(n, b, f))

    def test_select_ties(self):
        keep, gap = tr.select_top(np.array([1.0, 3.0, 3.0, 2.0, 3.0]), 2)
        self.assertEqual(list(keep), [1, 2])
        self.assertEqual(gap, 0.0)
        inf = math.inf
        keep, gap = tr.select_top(np.array([inf, 0.0, 5.0, 5.0, inf]), 3)
        self.assertEqual(list(keep), [0, 2, 4])
        keep, _ = tr.select_top(np.array([inf, 0.0, 5.0, 5.0, inf]), 4)
        self.assertEqual(list(keep), [0, 2, 3, 4])
        keep, gap = tr.select_top(np.array([0.5, 0.1, 0.4, 0.2]), 2)
        self.assertEqual(list(keep), [0, 2])
        self.assertAlmostEqual(gap, 0.5)
        keep, gap = tr.select_top(np.array([inf, inf, 0.3]), 2)
        self.assertEqual((list(keep), gap), ([0, 1], inf))
        keep, gap = tr.select_top(np.zeros(6), 3)
        self.assertEqual(list(keep), [0, 1, 2])

    def test_snapkv_scores_naive(self):
        rng = np.random.default_rng(3)
        G, n, d, W = 3, 45, 8, 32
        q = rng.normal(size=(G, W, d))
        k = rng.normal(size=(n, d))
        got = tr.snapkv_raw_scores(q, k, n - W)
        want = np.zeros(n)
        for g in range(G):
            for i in range(W):
                p = n - W + i
                e = [math.exp(q[g, i].dot(k[j]) / math.sqrt(d))
                     for j in range(p + 1)]
                for j in range(p + 1):
                    want[j] += e[j] / sum(e) / (G * W)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
        self.assertAlmostEqual(float(got.sum()), 1.0, places=12)
        full = tr.snapkv_scores(q, k, start=2)
        self.assertTrue(np.isinf(full[[0, 1]]).all())
        self.assertTrue(np.isinf(full[n - W:]).all())
        self.assertTrue(np.isfinite(full[2:n - W]).all())
        np.testing.assert_allclose(full[2:n - W],
                                   tr.pool_avg5(want)[2:n - W], rtol=1e-12)

    def test_llama3_inv_freq(self):
        cfg = dict(head_dim=16, rope_theta=500000.0,
                   rope_scaling=LLAMA3_SCALING)
        c = tr.Config({"architectures": ["LlamaForCausalLM"],
                       "hidden_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 4, "intermediate_size": 8,
                       "vocab_size": 8, **cfg})
        got = tr.rope_inv_freq(c)
        np.testing.assert_allclose(got, naive_inv_freq(cfg), rtol=1e-14)
        wl = 2 * math.pi / (500000.0 ** (-np.arange(0, 16, 2) / 16))
        # all three bands are exercised by this configuration
        self.assertTrue((wl < 16).any() and (wl > 64).any() and
                        ((wl >= 16) & (wl <= 64)).any())


class TestModel(unittest.TestCase):
    def test_naive_forward(self):
        for name in MODELS:
            d, cfg, stored, model = Fixture.models[name]
            ids = prompt(12, cfg["vocab_size"], 1)
            want = naive_logprobs(cfg, stored, ids)
            got = tr.run(model, ids, None, prefill_chunk=5)["prompt_logprobs"]
            self.assertIsNone(got[0])
            self.assertLess(max_lp_diff(got, want), 1e-9, name)

    def test_chunking_without_profile(self):
        for name in MODELS:
            d, cfg, stored, model = Fixture.models[name]
            ids = prompt(150, cfg["vocab_size"], 2)
            full = tr.run(model, ids, None, prefill_chunk=100000)
            for c in (3, 7, 64):
                r = tr.run(model, ids, "none", prefill_chunk=c)
                self.assertLess(max_lp_diff(r["prompt_logprobs"],
                                            full["prompt_logprobs"]),
                                1e-9, (name, c))
                self.assertEqual(r["kept_tokens"],
                                 [[150] * cfg["num_key_value_heads"]] *
                                 cfg["num_hidden_layers"])

    def test_budget_one_equals_none(self):
        d, cfg, stored, model = Fixture.models["qwen3"]
        L, H = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
        with tempfile.TemporaryDirectory() as t:
            p = os.path.join(t, "ones.json")
            write_profile(p, cfg, [[1.0] * H] * L, 1)
            ids = prompt(120, cfg["vocab_size"], 3)
            a = tr.run(model, ids, p, prefill_chunk=40, max_tokens=4,
                       ignore_eos=True)
            b = tr.run(model, ids, None, prefill_chunk=40, max_tokens=4,
                       ignore_eos=True)
        self.assertEqual(a["prompt_logprobs"], b["prompt_logprobs"])
        self.assertEqual(a["token_ids"], b["token_ids"])
        self.assertEqual(a["min_select_gap"], math.inf)

    def test_low_budget_profile(self):
        rng = np.random.default_rng(4)
        for name in MODELS:
            d, cfg, stored, model = Fixture.models[name]
            L, H = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
            n, C = 200, 80
            ids = prompt(n, cfg["vocab_size"], 5)
            none = tr.run(model, ids, None, prefill_chunk=C)
            for hp in (1, 2):
                budgets = rng.uniform(0.02, 0.8, (L, H)).tolist()
                with tempfile.TemporaryDirectory() as t:
                    p = os.path.join(t, "low.json")
                    prof = write_profile(p, cfg, budgets, hp)
                    r = tr.run(model, ids, p, prefill_chunk=C)
                gb = pr.group_budgets(prof)
                for li in range(L):
                    for gi, grp in enumerate(prof["layers"][li]["groups"]):
                        want = pr.turn_tokens(n, gb[li][gi], C)
                        for h in grp:
                            self.assertEqual(r["kept_tokens"][li][h], want,
                                             (name, hp, li, h))
                            pos = r["kept_positions"][li][h]
                            self.assertEqual(pos, sorted(set(pos)))
                            for s in range(0, n, C):
                                e = min(n, s + C)
                                forced = set(range(max(s, e - 32), e)) | \
                                    set(range(s, min(e, 4)))
                                self.assertTrue(forced <= set(pos))
                self.assertTrue(any(r["kept_tokens"][li][h] < n
                                    for li in range(L) for h in range(H)))
                lp, lp0 = r["prompt_logprobs"], none["prompt_logprobs"]
                # compression only affects chunks after the first
                self.assertEqual(lp[1:C + 1], lp0[1:C + 1])
                self.assertGreater(max(abs(a - b) for a, b in
                                       zip(lp[C + 1:], lp0[C + 1:])), 1e-6)
                self.assertLess(r["min_select_gap"], math.inf)

    def test_small_chunks_keep_everything(self):
        # chunks of <= 32 tokens are all window (forced): no key is dropped
        d, cfg, stored, model = Fixture.models["qwen2"]
        L, H = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
        ids = prompt(90, cfg["vocab_size"], 10)
        with tempfile.TemporaryDirectory() as t:
            p = os.path.join(t, "p.json")
            write_profile(p, cfg, [[0.1] * H] * L, 1)
            for c in (16, 32):
                a = tr.run(model, ids, p, prefill_chunk=c, max_tokens=3,
                           ignore_eos=True)
                b = tr.run(model, ids, None, prefill_chunk=c, max_tokens=3,
                           ignore_eos=True)
                self.assertEqual(a["prompt_logprobs"], b["prompt_logprobs"])
                self.assertEqual(a["token_ids"], b["token_ids"])
                self.assertEqual(a["kept_tokens"], [[90] * H] * L)
            a = tr.run(model, ids, p, prefill_chunk=33)
            self.assertLess(a["kept_tokens"][0][0], 90)

    def test_greedy_teacher_forced(self):
        d, cfg, stored, model = Fixture.models["llama"]
        ids = prompt(40, cfg["vocab_size"], 6)
        r = tr.run(model, ids, None, prefill_chunk=16, max_tokens=6,
                   ignore_eos=True)
        self.assertEqual(len(r["token_ids"]), 6)
        full = tr.run(model, ids + r["token_ids"][:-1], None,
                      prefill_chunk=16, want_logits=True)
        am = np.argmax(full["prompt_logits"][len(ids) - 1:], axis=1)
        self.assertEqual([int(t) for t in am], r["token_ids"])
        self.assertEqual(len(r["top2_margins"]), 6)
        self.assertTrue(all(m >= 0 for m in r["top2_margins"]))

    def test_decode_is_one_token_chunk(self):
        d, cfg, stored, model = Fixture.models["qwen2"]
        L, H = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
        ids = prompt(100, cfg["vocab_size"], 7)
        budgets = [[0.2, 0.4]] * L
        with tempfile.TemporaryDirectory() as t:
            p = os.path.join(t, "p.json")
            write_profile(p, cfg, budgets, 1)
            r = tr.run(model, ids, p, prefill_chunk=64, max_tokens=4,
                       ignore_eos=True, want_logits=True)
            hb = tr.load_profile_budgets(p, model.cfg)
        st = tr._State(model.cfg)
        for s in range(0, len(ids), 64):
            tr._prefill_chunk(model, st, ids[s:s + 64], s, hb)
        pos = len(ids)
        for i, tok in enumerate(r["token_ids"][:-1]):
            hid = tr._prefill_chunk(model, st, [tok], pos + i, hb)
            lg = tr._logits(model, hid)[0]
            np.testing.assert_allclose(lg, r["gen_logits"][i + 1],
                                       rtol=1e-10, atol=1e-10)

    def test_eos(self):
        d, cfg, stored, model = Fixture.models["qwen3"]
        ids = prompt(20, cfg["vocab_size"], 8)
        first = tr.run(model, ids, None, max_tokens=1)["token_ids"][0]
        old = model.cfg.eos
        try:
            model.cfg.eos = [first]
            self.assertEqual(tr.run(model, ids, None, max_tokens=5)
                             ["token_ids"], [first])
            self.assertEqual(len(tr.run(model, ids, None, max_tokens=5,
                                        ignore_eos=True)["token_ids"]), 5)
        finally:
            model.cfg.eos = old
        self.assertEqual(tr.run(model, ids, None, max_tokens=0)["token_ids"],
                         [])

    def test_bad_inputs(self):
        d, cfg, stored, model = Fixture.models["qwen3"]
        L, H = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
        with self.assertRaises(tr.RefError):
            tr.run(model, [], None)
        with self.assertRaises(tr.RefError):
            tr.run(model, [cfg["vocab_size"]], None)
        good = write_profile(os.path.join(Fixture.tmp.name, "g.json"), cfg,
                             [[0.5] * H] * L, 1)
        bads = []
        b = json.loads(json.dumps(good))
        b["layers"][0]["groups"] = [[0], [0]]
        bads.append(b)
        b = json.loads(json.dumps(good))
        b["layers"][1]["budget"][0] = 0.0
        bads.append(b)
        b = json.loads(json.dumps(good))
        b["layers"] = b["layers"][:1]
        bads.append(b)
        b = json.loads(json.dumps(good))
        b["model"]["num_kv_heads"] = H + 1
        bads.append(b)
        b = json.loads(json.dumps(good))
        b["format"] = "something"
        bads.append(b)
        for b in bads:
            with self.assertRaises(tr.RefError):
                tr.load_profile_budgets(b, model.cfg)
        os.remove(os.path.join(d, "config.json"))
        try:
            with self.assertRaises(tr.RefError):
                tr.load_model(d)
        finally:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)

    def test_cli(self):
        d, cfg, stored, model = Fixture.models["llama"]
        ids = prompt(50, cfg["vocab_size"], 9)
        out = subprocess.run(
            [sys.executable, os.path.join(REF, "tangram_ref.py"), "--model", d,
             "--prompt-ids", json.dumps(ids), "--prefill-chunk", "20",
             "--max-tokens", "3", "--ignore-eos", "--json"],
            capture_output=True, text=True, check=True)
        got = json.loads(out.stdout)
        want = tr.run(model, ids, None, 20, 3, True)
        self.assertEqual(got["prompt_token_ids"], ids)
        self.assertIsNone(got["prompt_logprobs"][0])
        self.assertEqual(got["prompt_logprobs"], want["prompt_logprobs"])
        self.assertEqual(got["token_ids"], want["token_ids"])
        self.assertEqual(got["kept_tokens"], want["kept_tokens"])
        bad = subprocess.run(
            [sys.executable, os.path.join(REF, "tangram_ref.py"), "--model", d,
             "--prompt-ids", "[1, \"x\"]", "--json"],
            capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("prompt-ids", bad.stderr)


class TestProfileRef(unittest.TestCase):
    def retention(self, samples):
        return {"format": "tangram-retention", "version": 1,
                "model": {"architecture": "Qwen3ForCausalLM"},
                "method": "snapkv", "target_ratio": 0.25, "samples": samples}

    def test_build(self):
        ret = self.retention([[[0.1, 0.5, 0.9, 0.0, 0.5, 0.3]],
                              [[0.3, 0.5, 1.0, 0.0, 0.5, 0.3]]])
        p = pr.build_profile(ret, 2.0, 2)
        lay = p["layers"][0]
        np.testing.assert_allclose(lay["mean"], [0.2, 0.5, 0.95, 0, 0.5, 0.3])
        np.testing.assert_allclose(lay["std"], [0.1, 0, 0.05, 0, 0, 0],
                                   atol=1e-15)
        self.assertEqual(lay["std"][1], 0.0)
        np.testing.assert_allclose(lay["budget"],
                                   [0.4, 0.5, 1.0, 1 / 1024, 0.5, 0.3])
        self.assertEqual(lay["budget"][2], 1.0)       # clamped to 1
        self.assertEqual(lay["budget"][3], 1 / 1024)  # clamped to 1/1024
        # (budget asc, index asc); heads 1 and 4 tie exactly at 0.5
        self.assertEqual(lay["groups"], [[3, 5], [0, 1], [4, 2]])
        self.assertEqual(p["samples"], 2)
        self.assertEqual(p["model"]["num_kv_heads"], 6)
        adj = pr.build_profile(ret, 2.0, 3, "adjacent")
        self.assertEqual(adj["layers"][0]["groups"], [[0, 1, 2], [3, 4, 5]])
        for bad in (lambda: pr.build_profile(ret, 2.0, 4),
                    lambda: pr.build_profile(self.retention([]), 2.0, 1),
                    lambda: pr.build_profile(self.retention(
                        [[[0.1, 0.2]], [[0.1]]]), 2.0, 1),
                    lambda: pr.build_profile(self.retention(
                        [[[0.1, 1.5]]]), 2.0, 1),
                    lambda: pr.build_profile(dict(ret, format="x"), 2.0, 1)):
            with self.assertRaises(pr.ProfileError):
                bad()

    def test_splits(self):
        self.assertEqual([pr.round_half_away(x) for x in
                          (0.5, 1.5, 2.5, 0.49999999999999994, 2.4999999,
                           -2.5, 3.0)], [1, 2, 3, 0, 2, -3, 3])
        ret = self.retention([[[0.125, 0.375, 0.25, 0.25]]])
        p = pr.build_profile(ret, 2.0, 2)
        self.assertEqual(p["layers"][0]["groups"], [[0, 2], [3, 1]])
        # Omega = 1, tau = 1/4: Phi/tau = 1.5 -> 2 and 2.5 -> 3 (not even)
        self.assertEqual(pr.split_map(p, 4), [[2, 3]])
        self.assertEqual(pr.split_map(p, 1), [[1, 1]])
        p1 = pr.build_profile(ret, 2.0, 1)
        self.assertEqual(pr.split_map(p1, 4), [[1, 1, 1, 2]])  # .5 -> 1
        self.assertEqual(pr.split_map(p1, 8), [[1, 2, 2, 3]])

    def test_pages(self):
        ret = self.retention([[[0.25, 1.0], [0.25, 1.0]]])
        p = pr.build_profile(ret, 2.0, 1)
        got = pr.pages(p, 100)
        self.assertEqual(got["tokens"], [[36, 100], [36, 100]])
        self.assertEqual(got["pages"], [[3, 7], [3, 7]])
        self.assertEqual(got["total_pages"], 20)
        self.assertEqual(got["monolithic_pages"], 28)
        # chunks 64 + 36: 36 + 36 (window 32 + 4 sinks, then 32 >= 9)
        got = pr.pages(p, 100, page_size=1, prefill_chunk=64)
        self.assertEqual(got["tokens"][0], [36 + 32, 100])
        got = pr.pages(p, 1000, page_size=16, prefill_chunk=512)
        self.assertEqual(got["tokens"][0], [128 + 122, 1000])

    def test_cli(self):
        ret = self.retention(np.random.default_rng(1).uniform(
            0, 1, (5, 3, 4)).tolist())
        with tempfile.TemporaryDirectory() as t:
            rp, pp = os.path.join(t, "r.json"), os.path.join(t, "p.json")
            with open(rp, "w") as f:
                json.dump(ret, f)
            cli = [sys.executable, os.path.join(REF, "profile_ref.py")]
            subprocess.run(cli + ["build", "--retention", rp, "--alpha", "1.5",
                                  "--heads-per-group", "2", "-o", pp],
                           check=True)
            with open(pp) as f:
                prof = json.load(f)
            self.assertEqual(prof, pr.build_profile(ret, 1.5, 2))
            out = subprocess.run(cli + ["splits", "--profile", pp,
                                        "--n-cta", "132"],
                                 check=True, capture_output=True, text=True)
            self.assertEqual(json.loads(out.stdout),
                             {"n_cta": 132,
                              "splits": pr.split_map(prof, 132)})
            out = subprocess.run(cli + ["pages", "--profile", pp, "--tokens",
                                        "700", "--prefill-chunk", "100"],
                                 check=True, capture_output=True, text=True)
            self.assertEqual(json.loads(out.stdout),
                             pr.pages(prof, 700, 16, 100))
            bad = subprocess.run(cli + ["build", "--retention", rp,
                                        "--heads-per-group", "3"],
                                 capture_output=True, text=True)
            self.assertEqual(bad.returncode, 2)


class TestTrigRef(unittest.TestCase):
    def test_select_flip(self):
        sc = [0.9, 0.5, 0.7, 0.6, 0.1, 0.0, 0.0]   # last 2: the window
        keep, gap = trig_ref.select(sc, 4, 2)
        self.assertEqual(list(keep), [0, 2, 5, 6])
        self.assertAlmostEqual(gap, (0.7 - 0.6) / 0.7)
        keep, gap2 = trig_ref.select(sc, 4, 2, flip=True)
        self.assertEqual(list(keep), [0, 3, 5, 6])
        self.assertEqual(gap, gap2)
        # Nothing to decide: everything or only the window kept.
        for cap in (2, 7):
            a, g = trig_ref.select(sc, cap, 2)
            b, _ = trig_ref.select(sc, cap, 2, flip=True)
            self.assertEqual(list(a), list(b))
            self.assertEqual(g, math.inf)

    def test_branches(self):
        d, cfg, stored, model = Fixture.models["qwen3"]
        c = model.cfg
        cal = trig_ref.calibrate(model, [prompt(30, cfg["vocab_size"], 21)])
        stats = [{k: cal[k][li] for k in ("re", "im", "abs")}
                 for li in range(c.n_layers)]
        ids = prompt(20, cfg["vocab_size"], 22)
        forced = prompt(21, cfg["vocab_size"], 23)
        every = 4
        args = (model, ids, None, stats, 8, forced, 12, every, 4, False)
        own = trig_ref.run(*args)
        # Every decided selection counts as a tie at tie_tol = inf.
        runs = list(itertools.islice(trig_ref.branches(*args, math.inf), 4))
        self.assertEqual(runs[0]["flips"], [])
        self.assertEqual(runs[0]["kept_positions"], own["kept_positions"])
        self.assertEqual(runs[0]["forced_logprobs"], own["forced_logprobs"])
        self.assertEqual(own["ties"], [])
        ties = [tuple(t[:3]) for t in runs[0]["ties"]]
        self.assertGreater(len(ties), 1)
        self.assertEqual(runs[1]["flips"], [ties[0]])
        seen = set()
        for r in runs[1:]:
            fl = tuple(r["flips"])
            self.assertNotIn(fl, seen)
            seen.add(fl)
            self.assertTrue(set(fl) <= {tuple(t[:3]) for t in r["ties"]})
            # Log-probabilities up to the first flipped trigger are the
            # own run's; the decision changes what the next steps see.
            cut = fl[0][0] * every + 1
            self.assertEqual(r["forced_logprobs"][:cut],
                             own["forced_logprobs"][:cut])
            self.assertGreater(max(abs(a - b) for a, b in zip(
                r["forced_logprobs"][cut:], own["forced_logprobs"][cut:])),
                0.0)


if __name__ == "__main__":
    prog = unittest.main(exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
