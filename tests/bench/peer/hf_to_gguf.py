#!/usr/bin/python3
"""hf_to_gguf — a Qwen3 Hugging Face model folder (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json; what
tangram-make-model writes) as one GGUF file that llama.cpp loads as
architecture `qwen3`, so the CPU peer benchmark runs both engines on the
same weights.

Written from the GGUF format as llama.cpp documents it (format version 3,
32-byte alignment, little-endian): metadata keys `general.*`, `qwen3.*`
(block count, widths, head counts, head dimension as attention.key_length /
value_length, RoPE base, RMSNorm epsilon) and `tokenizer.ggml.*` (model
"gpt2", pre-tokenizer "qwen2", every token string with its type, the BPE
merges, bos / eos / padding ids), then one tensor per weight under
llama.cpp's names (token_embd, blk.N.attn_q ..., output_norm, output).

Weights are not permuted: Qwen3 uses NEOX-style (rotate-half) RoPE, which
is the order of the checkpoint's q/k rows; llama.cpp's own converter
permutes q/k only for the interleaved-RoPE (llama) family. The agreement
test (tests/integration/test_cpu_peer_agree.py) checks this by comparing
greedy tokens and log-probabilities with tangram.

A checkpoint matrix [rows, cols] is a GGUF tensor of dims (cols, rows)
with the same bytes. 1-D tensors (norms) are always F32; matrices are F32
or BF16 (--dtype; BF16 from an F32 checkpoint rounds to nearest even, as
tangram's --cpu-weights bf16 does). A tied checkpoint gets no output
tensor (llama.cpp reuses token_embd).

--permute-qk writes q/k in the interleaved-RoPE row order (what a llama
converter does): a wrong file on purpose, the agreement test's negative
control, which must then disagree with tangram.

Usage: hf_to_gguf.py MODEL_DIR OUT.gguf [--dtype f32|bf16] [--permute-qk]
Exit 1 with a message for a model it cannot convert (not qwen3, RoPE
scaling, missing tensor, unknown dtype).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

ALIGN = 32
# GGUF metadata value types.
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64 = \
    4, 5, 6, 7, 8, 9, 10
# GGML tensor types.
GGML_F32, GGML_BF16 = 0, 30
# llama.cpp token types.
TOK_NORMAL, TOK_CONTROL, TOK_USER, TOK_UNUSED = 1, 3, 4, 5
# general.file_type: all F32 / mostly BF16.
FTYPE = {"f32": 0, "bf16": 32}


class ConvertError(Exception):
    pass


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        return out + struct.pack("<I", value)
    if vtype == T_INT32:
        return out + struct.pack("<i", value)
    if vtype == T_FLOAT32:
        return out + struct.pack("<f", value)
    if vtype == T_BOOL:
        return out + struct.pack("<B", 1 if value else 0)
    if vtype == T_STRING:
        return out + gstr(value)
    raise ValueError(vtype)


def kv_array(key, etype, values):
    out = [gstr(key), struct.pack("<IIQ", T_ARRAY, etype, len(values))]
    if etype == T_STRING:
        out.extend(gstr(v) for v in values)
    elif etype == T_INT32:
        out.append(np.asarray(values, dtype="<i4").tobytes())
    else:
        raise ValueError(etype)
    return b"".join(out)


def read_safetensors(path):
    """(header dict, data offset) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def load_tensor(mm, base, info):
    """The tensor as float32 (F32/BF16/F16 checkpoints)."""
    a, b = info["data_offsets"]
    raw = mm[base + a:base + b]
    shape = info["shape"]
    dt = info["dtype"]
    if dt == "F32":
        return raw.view("<f4").reshape(shape)
    if dt == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(
            np.float32).reshape(shape)
    if dt == "F16":
        return raw.view("<f2").astype(np.float32).reshape(shape)
    raise ConvertError("tensor dtype %s is not supported" % dt)


def to_bf16(x):
    """float32 -> bf16 bits, round to nearest even (NaN kept a NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u >> 16) & 1) + 0x7FFF
    out = ((u + r) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def tokenizer_arrays(model_dir, n_vocab):
    """(tokens, types, merges, specials) of tokenizer.json for n_vocab ids;
    ids the tokenizer lacks become unused [PAD<id>] entries."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    m = tj.get("model", {})
    if m.get("type") != "BPE":
        raise ConvertError("tokenizer.json model type %r, not BPE"
                           % m.get("type"))
    tokens = [None] * n_vocab
    types = [TOK_UNUSED] * n_vocab
    for s, i in m["vocab"].items():
        if i >= n_vocab:
            raise ConvertError("token id %d >= vocab_size %d" % (i, n_vocab))
        tokens[i] = s
        types[i] = TOK_NORMAL
    by_content = {}
    for t in tj.get("added_tokens", []):
        i = t["id"]
        if i >= n_vocab:
            raise ConvertError("added token id %d >= vocab_size %d"
                               % (i, n_vocab))
        tokens[i] = t["content"]
        types[i] = TOK_CONTROL if t.get("special") else TOK_USER
        by_content[t["content"]] = i
    for i in range(n_vocab):
        if tokens[i] is None:
            tokens[i] = "[PAD%d]" % i
    merges = [" ".join(p) if isinstance(p, list) else p
              for p in m.get("merges", [])]
    return tokens, types, merges, by_content


def special_ids(model_dir, cfg, by_content):
    """bos, eos and padding ids: tokenizer_config.json's tokens where set,
    else config.json's ids."""
    tc = {}
    p = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            tc = json.load(f)

    def content(v):
        return v.get("content") if isinstance(v, dict) else v

    def first(v):
        return v[0] if isinstance(v, list) else v
    out = {}
    for name, cfg_key in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                          ("padding", "pad_token_id")):
        c = content(tc.get(name[:3] + "_token" if name != "padding"
                           else "pad_token"))
        if c is not None and c in by_content:
            out[name] = by_content[c]
        elif cfg.get(cfg_key) is not None:
            out[name] = first(cfg[cfg_key])
    if "padding" not in out and "eos" in out:
        out["padding"] = out["eos"]
    return out, bool(tc.get("add_bos_token", False))


def permute_qk(x, n_head):
    """Rows of each head from rotate-half order (first half, second half)
    to interleaved pairs (0, hd/2, 1, hd/2 + 1, ...)."""
    rows, cols = x.shape
    hd = rows // n_head
    return x.reshape(n_head, 2, hd // 2, cols).swapaxes(1, 2).reshape(
        rows, cols)


def convert(model_dir, out_path, dtype, permute=False):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "qwen3":
        raise ConvertError("model_type %r: only qwen3 is converted"
                           % cfg.get("model_type"))
    if cfg.get("rope_scaling"):
        raise ConvertError("rope_scaling is not converted")
    if cfg.get("attention_bias"):
        raise ConvertError("attention_bias is not converted")
    hidden = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    n_vocab = cfg["vocab_size"]
    tied = bool(cfg.get("tie_word_embeddings", False))

    st_path = os.path.join(model_dir, "model.safetensors")
    header, base = read_safetensors(st_path)
    mm = np.memmap(st_path, dtype=np.uint8, mode="r")

    names = [("token_embd.weight", "model.embed_tokens.weight")]
    for i in range(layers):
        hf, g = "model.layers.%d." % i, "blk.%d." % i
        names += [(g + "attn_norm.weight", hf + "input_layernorm.weight"),
                  (g + "attn_q.weight", hf + "self_attn.q_proj.weight"),
                  (g + "attn_k.weight", hf + "self_attn.k_proj.weight"),
                  (g + "attn_v.weight", hf + "self_attn.v_proj.weight"),
                  (g + "attn_output.weight", hf + "self_attn.o_proj.weight"),
                  (g + "attn_q_norm.weight", hf + "self_attn.q_norm.weight"),
                  (g + "attn_k_norm.weight", hf + "self_attn.k_norm.weight"),
                  (g + "ffn_norm.weight",
                   hf + "post_attention_layernorm.weight"),
                  (g + "ffn_gate.weight", hf + "mlp.gate_proj.weight"),
                  (g + "ffn_up.weight", hf + "mlp.up_proj.weight"),
                  (g + "ffn_down.weight", hf + "mlp.down_proj.weight")]
    names.append(("output_norm.weight", "model.norm.weight"))
    if not tied:
        names.append(("output.weight", "lm_head.weight"))
    for _, hf in names:
        if hf not in header:
            raise ConvertError("model.safetensors has no %s" % hf)
    emb_shape = header["model.embed_tokens.weight"]["shape"]
    if emb_shape != [n_vocab, hidden]:
        raise ConvertError("embed_tokens %s, config says [%d, %d]"
                           % (emb_shape, n_vocab, hidden))

    tokens, types, merges, by_content = tokenizer_arrays(model_dir, n_vocab)
    specials, add_bos = special_ids(model_dir, cfg, by_content)

    meta = [
        kv("general.architecture", T_STRING, "qwen3"),
        kv("general.name", T_STRING,
           os.path.basename(os.path.abspath(model_dir))),
        kv("general.file_type", T_UINT32, FTYPE[dtype]),
        kv("general.alignment", T_UINT32, ALIGN),
        kv("qwen3.block_count", T_UINT32, layers),
        kv("qwen3.context_length", T_UINT32,
           cfg.get("max_position_embeddings", 32768)),
        kv("qwen3.embedding_length", T_UINT32, hidden),
        kv("qwen3.feed_forward_length", T_UINT32, cfg["intermediate_size"]),
        kv("qwen3.attention.head_count", T_UINT32, heads),
        kv("qwen3.attention.head_count_kv", T_UINT32, kv_heads),
        kv("qwen3.attention.key_length", T_UINT32, head_dim),
        kv("qwen3.attention.value_length", T_UINT32, head_dim),
        kv("qwen3.rope.freq_base", T_FLOAT32,
           float(cfg.get("rope_theta", 10000.0))),
        kv("qwen3.attention.layer_norm_rms_epsilon", T_FLOAT32,
           float(cfg.get("rms_norm_eps", 1e-6))),
        kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv("tokenizer.ggml.pre", T_STRING, "qwen2"),
        kv_array("tokenizer.ggml.tokens", T_STRING, tokens),
        kv_array("tokenizer.ggml.token_type", T_INT32, types),
        kv_array("tokenizer.ggml.merges", T_STRING, merges),
        kv("tokenizer.ggml.add_bos_token", T_BOOL, add_bos),
    ]
    for name in ("bos", "eos", "padding"):
        if name in specials:
            meta.append(kv("tokenizer.ggml.%s_token_id" % name, T_UINT32,
                           specials[name]))

    # Tensor infos: dims innermost first, offsets aligned in the data block.
    infos, plan, off = [], [], 0
    for gname, hf in names:
        shape = header[hf]["shape"]
        ggml_type = GGML_F32 if len(shape) == 1 or dtype == "f32" \
            else GGML_BF16
        nbytes = int(np.prod(shape)) * (4 if ggml_type == GGML_F32 else 2)
        infos.append(gstr(gname) + struct.pack("<I", len(shape)) +
                     struct.pack("<%dQ" % len(shape), *reversed(shape)) +
                     struct.pack("<IQ", ggml_type, off))
        plan.append((hf, ggml_type, off, nbytes))
        off += (nbytes + ALIGN - 1) // ALIGN * ALIGN

    head = struct.pack("<4sIQQ", b"GGUF", 3, len(names), len(meta)) + \
        b"".join(meta) + b"".join(infos)
    pad = (-len(head)) % ALIGN
    tmp = out_path + ".tmp%d" % os.getpid()
    try:
        with open(tmp, "wb") as f:
            f.write(head + b"\0" * pad)
            data0 = f.tell()
            for hf, ggml_type, toff, nbytes in plan:
                assert f.tell() == data0 + toff
                x = load_tensor(mm, base, header[hf])
                if permute and hf.endswith("q_proj.weight"):
                    x = permute_qk(x, heads)
                elif permute and hf.endswith("k_proj.weight"):
                    x = permute_qk(x, kv_heads)
                # Row blocks bound the memory of the 600 MB embeddings.
                step = max(1, (64 << 20) // max(1, x[0].nbytes if x.ndim > 1
                                                 else x.nbytes))
                rows = x.shape[0] if x.ndim > 1 else 1
                for r in range(0, rows, step):
                    blk = x[r:r + step] if x.ndim > 1 else x
                    if ggml_type == GGML_F32:
                        f.write(np.ascontiguousarray(blk, "<f4").tobytes())
                    else:
                        f.write(to_bf16(blk).astype("<u2").tobytes())
                f.write(b"\0" * ((-nbytes) % ALIGN))
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--permute-qk", action="store_true")
    a = ap.parse_args(argv)
    try:
        convert(a.model_dir, a.out, a.dtype, a.permute_qk)
    except (ConvertError, OSError, KeyError, ValueError) as e:
        print("hf_to_gguf: %s: %s" % (a.model_dir, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
