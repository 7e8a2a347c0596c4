#!/usr/bin/python3
"""tangram_ref.py - independent numpy reference of TANGRAM's model math.

This file is the executable form of DESIGN.md sections 4.1, 4.3 and 4.4:
a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) read straight from a
Hugging Face model directory, run over a prompt cut into prefill chunks of
C tokens, with the chunk-fused snapkv compression of every (layer, KV head)
driven by a tangram profile, followed by greedy decoding. Everything is
computed in float64 so that the C implementation (fp32, bf16 weights) can be
checked against it with tight tolerances.

It shares no code with the C side and only needs numpy. Use it as a module
(load_model, load_profile_budgets, run) or from the command line:

    tangram_ref.py --model DIR [--profile FILE|none] --prompt-ids '[1,2,3]'
                   [--prefill-chunk C] [--max-tokens N] [--ignore-eos] --json

Formula sources (facts, not code, carried over):
  * RMSNorm: Zhang & Sennrich 2019, x * rsqrt(mean(x^2) + eps) * w.
  * RoPE: Su et al. 2021, in the "NeoX" half-rotation layout used by Hugging
    Face transformers (rotate_half over the two halves of the head).
  * Llama-3 frequency scaling: transformers' _compute_llama3_parameters
    (factor, low_freq_factor, high_freq_factor, original max positions).
  * SwiGLU: Shazeer 2020, down(silu(gate(x)) * up(x)).
  * snapkv scoring: Li et al. 2024 (SnapKV) as pinned down in DESIGN 4.4.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

SNAPKV_WINDOW = 32  # w of DESIGN 4.4
SINK_TOKENS = 4     # keys at absolute position < 4 are always kept
POOL_WIDTH = 5      # 1-D average pooling width (zero padding 2 each side)
LOGIT_BLOCK = 64    # rows of the lm_head product computed at once (memory)

SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM",
                   "Qwen2ForCausalLM", "Qwen3ForCausalLM")

# safetensors dtype name -> numpy dtype (little endian). BF16 is special.
_ST_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
_ST_SIZES = {"BF16": 2, "F64": 8, "F32": 4, "F16": 2, "I64": 8, "I32": 4,
             "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
             "BOOL": 1}


class RefError(Exception):
    """Bad input (model directory, profile, prompt); the message says which."""


# --------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------

def bf16_to_f32(raw_u16):
    """bf16 bit patterns (uint16 array) -> float32: the 16 bits become the
    high half of an IEEE binary32 (bf16 is truncated binary32)."""
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path):
    """Returns {name: ndarray} for every tensor of the file at `path`.

    Format: 8-byte little-endian header length N, N bytes of JSON header
    {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"},
    then the data block; offsets are relative to the data block. Float
    tensors come back as float64, integer ones in their own type.
    Raises RefError on a malformed file."""
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    if blob.size < 8:
        raise RefError(f"{path}: shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", bytes(blob[:8]))
    if hlen > blob.size - 8 or hlen > (100 << 20):
        raise RefError(f"{path}: header length {hlen} exceeds the file")
    try:
        header = json.loads(bytes(blob[8:8 + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RefError(f"{path}: bad JSON header: {e}") from None
    if not isinstance(header, dict):
        raise RefError(f"{path}: header is not a JSON object")
    data = blob[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = info["dtype"]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise RefError(f"{path}: tensor {name}: bad header entry") from None
        if dtype not in _ST_SIZES:
            raise RefError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if any(s < 0 for s in shape) or not 0 <= begin <= end <= data.size \
                or end - begin != count * _ST_SIZES[dtype]:
            raise RefError(f"{path}: tensor {name}: data_offsets "
                           f"[{begin}, {end}] do not fit shape {shape} {dtype}")
        raw = data[begin:end]
        if dtype == "BF16":
            arr = bf16_to_f32(raw.view("<u2")).astype(np.float64)
        else:
            arr = raw.view(_ST_DTYPES[dtype])
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float64)
            else:
                arr = np.array(arr)
        out[name] = arr.reshape(shape)
    return out


def load_weights(model_dir):
    """Reads model.safetensors, or every shard named by
    model.safetensors.index.json, into one {name: float64 array} dict."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            try:
                wmap = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError):
                raise RefError(f"{index}: no weight_map") from None
        weights = {}
        for shard in sorted(set(wmap.values())):
            part = read_safetensors(os.path.join(model_dir, shard))
            for name, arr in part.items():
                if wmap.get(name) == shard:
                    weights[name] = arr
        missing = [n for n in wmap if n not in weights]
        if missing:
            raise RefError(f"{index}: tensors missing from their shard: "
                           f"{missing[:3]}")
        return weights
    if os.path.exists(single):
        return read_safetensors(single)
    raise RefError(f"{model_dir}: neither model.safetensors nor "
                   "model.safetensors.index.json")


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------

class Config:
    """The fields of config.json the math needs."""

    def __init__(self, cfg):
        archs = cfg.get("architectures") or []
        if not archs or archs[0] not in SUPPORTED_ARCHS:
            raise RefError(f"unsupported architectures {archs}")
        self.arch = archs[0]
        try:
            self.hidden = int(cfg["hidden_size"])
            self.n_layers = int(cfg["num_hidden_layers"])
            self.n_heads = int(cfg["num_attention_heads"])
            self.ffn = int(cfg["intermediate_size"])
            self.vocab = int(cfg["vocab_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise RefError(f"config.json: missing or bad {e}") from None
        self.n_kv_heads = int(cfg.get("num_key_value_heads") or self.n_heads)
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise RefError("num_attention_heads is not a multiple of "
                           "num_key_value_heads")
        self.group = self.n_heads // self.n_kv_heads  # G query heads per KV head
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.rope_scaling = cfg.get("rope_scaling")
        self.tie = bool(cfg.get("tie_word_embeddings", False))
        eos = cfg.get("eos_token_id")
        if eos is None:
            self.eos = []
        elif isinstance(eos, list):
            self.eos = [int(e) for e in eos]
        else:
            self.eos = [int(eos)]
        self.qk_norm = self.arch == "Qwen3ForCausalLM"
        if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
            raise RefError(f"hidden_act {cfg.get('hidden_act')} is not "
                           "supported (SwiGLU needs silu)")
        if cfg.get("mlp_bias"):
            raise RefError("mlp_bias is not supported")


def rope_inv_freq(cfg):
    """Returns inv_freq[i] = theta^(-2i/d), i < d/2, with the config's
    rope_scaling applied (float64)."""
    d = cfg.head_dim
    inv = cfg.theta ** (-(np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rs["factor"])
    if kind != "llama3":
        raise RefError(f"rope_scaling type {kind} is not supported")
    # transformers' _compute_llama3_parameters: wavelengths longer than
    # old_ctx/low_freq_factor are divided by `factor`, shorter than
    # old_ctx/high_freq_factor kept, and the band between interpolated
    # linearly in old_ctx/wavelen.
    factor = float(rs["factor"])
    lo = float(rs["low_freq_factor"])
    hi = float(rs["high_freq_factor"])
    old_ctx = float(rs["original_max_position_embeddings"])
    wavelen = 2.0 * math.pi / inv
    out = np.where(wavelen > old_ctx / lo, inv / factor, inv)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1.0 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old_ctx / hi) & ~(wavelen > old_ctx / lo)
    return np.where(medium, smoothed, out)


class Model:
    """Config + float64 weights. Attribute names follow HF's tensor names."""

    def __init__(self, model_dir):
        path = os.path.join(model_dir, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                self.cfg = Config(json.load(f))
        except (OSError, ValueError) as e:
            raise RefError(f"{path}: {e}") from None
        c = self.cfg
        w = load_weights(model_dir)
        qd, kd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

        def get(name, shape, required=True):
            if name not in w:
                if required:
                    raise RefError(f"{model_dir}: tensor {name} missing")
                return None
            if tuple(w[name].shape) != tuple(shape):
                raise RefError(f"{model_dir}: tensor {name} has shape "
                               f"{list(w[name].shape)}, expected {list(shape)}")
            return w[name]

        self.embed = get("model.embed_tokens.weight", (c.vocab, c.hidden))
        if c.tie:
            self.lm_head = self.embed
        else:
            self.lm_head = get("lm_head.weight", (c.vocab, c.hidden))
        self.norm = get("model.norm.weight", (c.hidden,))
        self.layers = []
        bias_required = c.arch == "Qwen2ForCausalLM"
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            m = p + "mlp."
            layer = {
                "in_norm": get(p + "input_layernorm.weight", (c.hidden,)),
                "post_norm": get(p + "post_attention_layernorm.weight",
                                 (c.hidden,)),
                "wq": get(a + "q_proj.weight", (qd, c.hidden)),
                "wk": get(a + "k_proj.weight", (kd, c.hidden)),
                "wv": get(a + "v_proj.weight", (kd, c.hidden)),
                "wo": get(a + "o_proj.weight", (c.hidden, qd)),
                "bq": get(a + "q_proj.bias", (qd,), bias_required),
                "bk": get(a + "k_proj.bias", (kd,), bias_required),
                "bv": get(a + "v_proj.bias", (kd,), bias_required),
                "bo": get(a + "o_proj.bias", (c.hidden,), False),
                "q_norm": get(a + "q_norm.weight", (c.head_dim,), c.qk_norm),
                "k_norm": get(a + "k_norm.weight", (c.head_dim,), c.qk_norm),
                "wg": get(m + "gate_proj.weight", (c.ffn, c.hidden)),
                "wu": get(m + "up_proj.weight", (c.ffn, c.hidden)),
                "wd": get(m + "down_proj.weight", (c.hidden, c.ffn)),
            }
            self.layers.append(layer)
        self.inv_freq = rope_inv_freq(c)


def load_model(model_dir):
    """Returns a Model read from the HF directory `model_dir` (RefError on
    malformed input)."""
    return Model(model_dir)


def rmsnorm(x, w, eps):
    """x * rsqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def apply_rope(x, positions, inv_freq):
    """x: (n, heads, d); positions: (n,) absolute. NeoX layout: the head is
    split into halves [x1, x2] and rotated as (x1 cos - x2 sin,
    x2 cos + x1 sin) with angle position * inv_freq[i]."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax_rows(s):
    """Softmax over the last axis; -inf entries get probability 0."""
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def log_softmax_rows(s):
    """log(softmax(s)) over the last axis (two passes, one temporary)."""
    m = np.max(s, axis=-1, keepdims=True)
    e = s - m
    np.exp(e, out=e)
    lse = m + np.log(np.sum(e, axis=-1, keepdims=True))
    return s - lse


# --------------------------------------------------------------------------
# Compression (DESIGN 4.3 steps 3-4, 4.4 snapkv)
# --------------------------------------------------------------------------

def pool_avg5(s):
    """1-D average pooling of width 5, stride 1, zero padding 2 on each
    side, divisor always 5 (count_include_pad). Output length = len(s)."""
    n = len(s)
    padded = np.concatenate([np.zeros(2), np.asarray(s, np.float64),
                             np.zeros(2)])
    acc = np.zeros(n)
    for off in range(POOL_WIDTH):
        acc = acc + padded[off:off + n]
    return acc / POOL_WIDTH


def forced_mask(start, n, window=SNAPKV_WINDOW, n_sink=SINK_TOKENS):
    """Boolean (n,) mask of the chunk's forced keys: its last min(window, n)
    keys and every key at absolute position start + j < n_sink."""
    w = min(window, n)
    j = np.arange(n)
    return (j >= n - w) | (start + j < n_sink)


def snapkv_raw_scores(q_win, k_chunk, q_offset):
    """Unpooled snapkv scores of one KV head.

    q_win: (G, W, d) the last W queries of the chunk for the G query heads
    of this KV head (after RoPE); k_chunk: (n, d) the chunk's keys (after
    RoPE); q_offset = n - W, the chunk index of the first window query.
    A[g][i][j] = softmax_j(q_{g,i} . k_j / sqrt(d)) with j <= q_offset + i;
    returns s[j] = mean over g, i of A[g][i][j] (shape (n,))."""
    g, w, d = q_win.shape
    n = k_chunk.shape[0]
    logits = np.einsum("gid,jd->gij", q_win, k_chunk) / math.sqrt(d)
    causal = np.arange(n)[None, :] <= (q_offset + np.arange(w))[:, None]
    logits = np.where(causal[None, :, :], logits, -np.inf)
    a = softmax_rows(logits)
    return a.sum(axis=(0, 1)) / (g * w)


def snapkv_scores(q_win, k_chunk, start):
    """Pooled snapkv scores of one KV head's chunk keys with forced keys at
    +inf (DESIGN 4.4); `start` is the chunk's first absolute position."""
    n = k_chunk.shape[0]
    w = q_win.shape[1]
    s = pool_avg5(snapkv_raw_scores(q_win, k_chunk, n - w))
    s[forced_mask(start, n)] = np.inf
    return s


def keep_count(n, budget, forced):
    """k = min(n, max(ceil(budget * n), forced)); budget >= 1 keeps all."""
    if budget >= 1.0:
        return n
    return min(n, max(math.ceil(budget * n), forced))


def select_top(scores, k):
    """Indices of the k highest scores, ties to the earlier index, returned
    in ascending (position) order; also the relative score gap between the
    last kept and the first dropped key (inf when nothing finite decides).
    """
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    keep = np.sort(order[:k])
    gap = math.inf
    if 0 < k < len(scores):
        last, first_out = scores[order[k - 1]], scores[order[k]]
        if math.isfinite(last):
            gap = (last - first_out) / max(abs(last), 1e-300)
    return keep, gap


# --------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------

def load_profile_budgets(profile, cfg):
    """Returns head_budget[l][h]: the budget b[l][g] of the group of KV head
    h (max over the group's heads, DESIGN 4.2), as a list of float lists.
    `profile` is a path, a parsed dict, or None / "none" (all ones)."""
    L, H = cfg.n_layers, cfg.n_kv_heads
    if profile is None or profile == "none":
        return [[1.0] * H for _ in range(L)]
    if isinstance(profile, str):
        try:
            with open(profile, encoding="utf-8") as f:
                profile = json.load(f)
        except (OSError, ValueError) as e:
            raise RefError(f"profile {profile}: {e}") from None
    if not isinstance(profile, dict) or \
            profile.get("format") != "tangram-profile" or \
            profile.get("version") != 1:
        raise RefError("profile: not a tangram-profile version 1 document")
    model = profile.get("model") or {}
    for key, want in (("num_layers", L), ("num_kv_heads", H),
                      ("head_dim", cfg.head_dim)):
        if key in model and model[key] != want:
            raise RefError(f"profile: model.{key} = {model[key]}, the model "
                           f"has {want}")
    layers = profile.get("layers")
    if not isinstance(layers, list) or len(layers) != L:
        raise RefError(f"profile: layers must be a list of {L} entries")
    out = []
    for li, layer in enumerate(layers):
        budget = layer.get("budget") if isinstance(layer, dict) else None
        groups = layer.get("groups") if isinstance(layer, dict) else None
        if not isinstance(budget, list) or len(budget) != H:
            raise RefError(f"profile: layers[{li}].budget must have {H} "
                           "entries")
        for h, b in enumerate(budget):
            if isinstance(b, bool) or not isinstance(b, (int, float)) or \
                    not 0.0 < b <= 1.0:
                raise RefError(f"profile: layers[{li}].budget[{h}] = {b} "
                               "is not in (0, 1]")
        if not isinstance(groups, list) or not groups:
            raise RefError(f"profile: layers[{li}].groups missing")
        seen = []
        hb = [None] * H
        for gi, grp in enumerate(groups):
            if not isinstance(grp, list) or not grp or any(
                    isinstance(h, bool) or not isinstance(h, int) or
                    not 0 <= h < H for h in grp):
                raise RefError(f"profile: layers[{li}].groups[{gi}] is not "
                               "a list of head indices")
            gb = max(float(budget[h]) for h in grp)
            for h in grp:
                hb[h] = gb
            seen.extend(grp)
        if sorted(seen) != list(range(H)):
            raise RefError(f"profile: layers[{li}].groups do not partition "
                           f"heads 0..{H - 1}")
        out.append(hb)
    return out


# --------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------

class _State:
    """Retained history of every (layer, KV head): keys after RoPE, values,
    absolute positions."""

    def __init__(self, cfg):
        d = cfg.head_dim
        self.k = [[np.zeros((0, d)) for _ in range(cfg.n_kv_heads)]
                  for _ in range(cfg.n_layers)]
        self.v = [[np.zeros((0, d)) for _ in range(cfg.n_kv_heads)]
                  for _ in range(cfg.n_layers)]
        self.pos = [[np.zeros(0, dtype=np.int64)
                     for _ in range(cfg.n_kv_heads)]
                    for _ in range(cfg.n_layers)]
        self.min_gap = math.inf


def _qkv(model, layer, x, positions):
    c = model.cfg
    n = x.shape[0]
    h = rmsnorm(x, layer["in_norm"], c.eps)
    q = h @ layer["wq"].T
    k = h @ layer["wk"].T
    v = h @ layer["wv"].T
    if layer["bq"] is not None:
        q = q + layer["bq"]
        k = k + layer["bk"]
        v = v + layer["bv"]
    q = q.reshape(n, c.n_heads, c.head_dim)
    k = k.reshape(n, c.n_kv_heads, c.head_dim)
    v = v.reshape(n, c.n_kv_heads, c.head_dim)
    if c.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
        q = rmsnorm(q, layer["q_norm"], c.eps)
        k = rmsnorm(k, layer["k_norm"], c.eps)
    q = apply_rope(q, positions, model.inv_freq)
    k = apply_rope(k, positions, model.inv_freq)
    return q, k, v


def _finish_layer(model, layer, x, attn):
    """Output projection + residual, then the SwiGLU MLP + residual."""
    c = model.cfg
    o = attn.reshape(x.shape[0], c.n_heads * c.head_dim) @ layer["wo"].T
    if layer["bo"] is not None:
        o = o + layer["bo"]
    x = x + o
    h = rmsnorm(x, layer["post_norm"], c.eps)
    return x + (silu(h @ layer["wg"].T) * (h @ layer["wu"].T)) @ layer["wd"].T


def _attend(q_g, hist_k, hist_v, k_new, v_new, d):
    """q_g: (G, n, d) queries of one KV head; the n new keys/values are at
    consecutive positions after all history; query i sees the whole
    history and new keys 0..i. Returns (G, n, d)."""
    n = k_new.shape[0]
    m = hist_k.shape[0]
    keys = np.concatenate([hist_k, k_new])
    vals = np.concatenate([hist_v, v_new])
    s = np.einsum("gid,jd->gij", q_g, keys) / math.sqrt(d)
    visible = np.ones((n, m + n), dtype=bool)
    visible[:, m:] = np.arange(n)[None, :] <= np.arange(n)[:, None]
    s = np.where(visible[None], s, -np.inf)
    return np.einsum("gij,jd->gid", softmax_rows(s), vals)


def _prefill_chunk(model, st, ids, start, head_budget):
    """Runs one chunk through every layer (DESIGN 4.3 steps 1-5); returns
    the final hidden states (n, hidden) before the last norm."""
    c = model.cfg
    n = len(ids)
    positions = np.arange(start, start + n)
    x = model.embed[np.asarray(ids)]
    G, d = c.group, c.head_dim
    for li, layer in enumerate(model.layers):
        q, k, v = _qkv(model, layer, x, positions)
        attn = np.zeros((n, c.n_heads, d))
        for h in range(c.n_kv_heads):
            q_g = q[:, h * G:(h + 1) * G, :].transpose(1, 0, 2)
            out = _attend(q_g, st.k[li][h], st.v[li][h], k[:, h], v[:, h], d)
            attn[:, h * G:(h + 1) * G, :] = out.transpose(1, 0, 2)
        x = _finish_layer(model, layer, x, attn)
        # Steps 3-5: compress this layer's chunk keys; they only affect
        # later chunks (this chunk's attention above used all of them).
        for h in range(c.n_kv_heads):
            b = head_budget[li][h]
            if b >= 1.0:
                keep = np.arange(n)
            else:
                f = int(forced_mask(start, n).sum())
                kk = keep_count(n, b, f)
                w = min(SNAPKV_WINDOW, n)
                q_win = q[n - w:, h * G:(h + 1) * G, :].transpose(1, 0, 2)
                scores = snapkv_scores(q_win, k[:, h], start)
                keep, gap = select_top(scores, kk)
                st.min_gap = min(st.min_gap, gap)
            st.k[li][h] = np.concatenate([st.k[li][h], k[keep, h]])
            st.v[li][h] = np.concatenate([st.v[li][h], v[keep, h]])
            st.pos[li][h] = np.concatenate([st.pos[li][h], positions[keep]])
    return x


def _decode_token(model, st, token, pos):
    """One decode token at absolute position `pos`: appended to every head
    uncompressed, attends to the whole retained history. Returns (hidden,)."""
    c = model.cfg
    x = model.embed[np.asarray([token])]
    G, d = c.group, c.head_dim
    for li, layer in enumerate(model.layers):
        q, k, v = _qkv(model, layer, x, np.asarray([pos]))
        attn = np.zeros((1, c.n_heads, d))
        for h in range(c.n_kv_heads):
            q_g = q[:, h * G:(h + 1) * G, :].transpose(1, 0, 2)
            out = _attend(q_g, st.k[li][h], st.v[li][h], k[:, h], v[:, h], d)
            attn[:, h * G:(h + 1) * G, :] = out.transpose(1, 0, 2)
            st.k[li][h] = np.concatenate([st.k[li][h], k[:, h]])
            st.v[li][h] = np.concatenate([st.v[li][h], v[:, h]])
            st.pos[li][h] = np.append(st.pos[li][h], pos)
        x = _finish_layer(model, layer, x, attn)
    return x[0]


def _logits(model, hidden):
    """hidden: (n, hidden) -> logits (n, vocab), computed in row blocks."""
    c = model.cfg
    out = np.empty((hidden.shape[0], c.vocab))
    for r in range(0, hidden.shape[0], LOGIT_BLOCK):
        h = rmsnorm(hidden[r:r + LOGIT_BLOCK], model.norm, c.eps)
        out[r:r + LOGIT_BLOCK] = h @ model.lm_head.T
    return out


def run(model, prompt_ids, profile=None, prefill_chunk=512, max_tokens=0,
        ignore_eos=False, want_logits=False):
    """Runs the TANGRAM semantics over `prompt_ids` and greedy decoding.

    `profile`: None / "none" (full KV), a path or a parsed profile dict.
    Returns a dict with prompt_token_ids, prompt_logprobs ([None, ...],
    float64 log-softmax), token_ids (greedy; stops after an eos id of
    config.json unless ignore_eos), kept_tokens[l][h] (retained history
    length after the prompt), kept_positions[l][h] (their absolute
    positions), top2_margins (top-1 minus top-2 logit of each generated
    step), min_select_gap (smallest relative score gap at any top-k
    boundary; inf when no selection was score-decided), and with
    want_logits the prompt logits (n, vocab) and generation logits."""
    c = model.cfg
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise RefError("the prompt is empty")
    if any(not 0 <= t < c.vocab for t in ids):
        raise RefError(f"prompt token id out of range [0, {c.vocab})")
    if prefill_chunk < 1:
        raise RefError("prefill chunk must be >= 1")
    head_budget = load_profile_budgets(profile, c)
    st = _State(c)
    hidden = []
    for start in range(0, len(ids), prefill_chunk):
        chunk = ids[start:start + prefill_chunk]
        hidden.append(_prefill_chunk(model, st, chunk, start, head_budget))
    hidden = np.concatenate(hidden)
    # Log-softmax block by block: (n, vocab) float64 temporaries would be
    # hundreds of MB for a 150k vocabulary.
    prompt_lp = [None]
    logits = [] if want_logits else None
    for r in range(0, len(ids), LOGIT_BLOCK):
        blk = _logits(model, hidden[r:r + LOGIT_BLOCK])
        if want_logits:
            logits.append(blk)
        lp = log_softmax_rows(blk)
        for p in range(r + 1, min(r + LOGIT_BLOCK + 1, len(ids))):
            prompt_lp.append(float(lp[p - 1 - r, ids[p]]))
        last = blk[-1]
    kept = [[int(st.k[li][h].shape[0]) for h in range(c.n_kv_heads)]
            for li in range(c.n_layers)]
    kept_pos = [[[int(p) for p in st.pos[li][h]] for h in range(c.n_kv_heads)]
                for li in range(c.n_layers)]
    gen, margins, gen_logits = [], [], []
    cur = last
    pos = len(ids)
    for step in range(max_tokens):
        tok = int(np.argmax(cur))  # first maximum on exact ties
        top2 = np.partition(cur, cur.size - 2)[-2:] if cur.size > 1 \
            else np.array([-np.inf, cur[0]])
        margins.append(float(top2[1] - top2[0]))
        if want_logits:
            gen_logits.append(cur)
        gen.append(tok)
        if (tok in c.eos and not ignore_eos) or step == max_tokens - 1:
            break
        cur = _logits(model, _decode_token(model, st, tok, pos)[None, :])[0]
        pos += 1
    res = {
        "prompt_token_ids": ids,
        "prompt_logprobs": prompt_lp,
        "token_ids": gen,
        "kept_tokens": kept,
        "kept_positions": kept_pos,
        "top2_margins": margins,
        "min_select_gap": st.min_gap,
    }
    if want_logits:
        res["prompt_logits"] = np.concatenate(logits)
        res["gen_logits"] = gen_logits
    return res


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def _parse_ids(text):
    try:
        ids = json.loads(text)
    except ValueError as e:
        raise RefError(f"--prompt-ids: not JSON: {e}") from None
    if not isinstance(ids, list) or any(
            isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise RefError("--prompt-ids: expected a JSON list of integers")
    return ids


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="numpy reference of the TANGRAM model math "
                    "(DESIGN.md 4.1, 4.3, 4.4)")
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--profile", default="none",
                    help="tangram-profile JSON file, or none (full KV)")
    ap.add_argument("--prompt-ids", required=True,
                    help="JSON list of prompt token ids")
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--kept-positions", action="store_true",
                    help="also print the retained positions per head")
    ap.add_argument("--json", action="store_true",
                    help="print the result as one JSON object (default)")
    args = ap.parse_args(argv)
    try:
        if args.max_tokens < 0:
            raise RefError("--max-tokens must be >= 0")
        model = load_model(args.model)
        res = run(model, _parse_ids(args.prompt_ids), args.profile,
                  args.prefill_chunk, args.max_tokens, args.ignore_eos)
    except (RefError, OSError) as e:
        print(f"tangram_ref: {e}", file=sys.stderr)
        return 2
    out = {k: res[k] for k in ("prompt_token_ids", "prompt_logprobs",
                               "token_ids", "kept_tokens", "top2_margins")}
    gap = res["min_select_gap"]
    out["min_select_gap"] = gap if math.isfinite(gap) else None
    if args.kept_positions:
        out["kept_positions"] = res["kept_positions"]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
