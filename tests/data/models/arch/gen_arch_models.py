#!/usr/bin/env python3
"""Writes the tiny randomly initialized test checkpoints of tests/unit/model/arch_models_test.cc
and the logits a plain numpy reference (f64, Hugging Face semantics) computes for them.

    pip install gguf numpy && python3 tests/data/models/arch/gen_arch_models.py

Outputs (committed, so CI needs neither package), next to this script:
  llama3.gguf       general.architecture llama: GQA, q/k/v/o biases, Llama 3.1 RoPE scaling
                    as llama.cpp stores it (rope_freqs.weight), Q/K rows and biases permuted as
                    llama.cpp's convert script does, F32/F16/BF16 tensors, separate output.
  llama3_hf/        the same weights as a HF LlamaForCausalLM folder: attention_bias, rope_scaling
                    {rope_type: llama3, ...}; BF16 matrices, F16 biases, F32 norms.
  qwen2.gguf        general.architecture qwen2: q/k/v biases, GQA, rope theta 1e6, tied
                    embeddings, HF row order (llama.cpp does not permute qwen2).
  qwen2_hf/         the same weights as Qwen2ForCausalLM, all BF16 (as Qwen ships them), with
                    use_sliding_window false (its sliding_window must then be ignored).
  qwen2_yarn.gguf   qwen2 weights with qwen2.rope.scaling.type yarn (factor 4, original 256).
                    The HF form (qwen2_hf weights + rope_scaling {type: yarn}) is written by the
                    test from "config" in the expected file.
  mistral_hf/       MistralForCausalLM with sliding_window 12: logits within the window; the
                    runtime must refuse position 13.
  mistral.gguf      the same as general.architecture llama with llama.attention.sliding_window.
  expected_logits.json  per case: the file, the expected ModelConfig fields, and the logits
                    [tokens][vocab] of the token list for every position.

Every weight is k * 2^-9 (|k| <= 127), norms 1 + k/128, biases k * 2^-8: exact in F32, F16
and BF16, so each file stores the same values whatever its tensor types, and the GGUF and HF
forms of one model share expected logits.
"""
import json
import math
import os
import struct

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
V, D, H, KV, HD, F, L = 64, 64, 4, 2, 16, 96, 2
TOKENS = [1, 17, 5, 42, 42, 9, 63, 0, 30, 17, 2, 55]


# ---------------------------------------------------------------------------------------------
# Weights
def make_weights(seed, qkv_bias, o_bias, tied):
    rng = np.random.default_rng(seed)
    mat = lambda r, c: rng.integers(-127, 128, size=(r, c)).astype(np.float64) * 2.0**-9
    norm = lambda n: 1.0 + rng.integers(-32, 33, size=n).astype(np.float64) / 128
    bias = lambda n: rng.integers(-127, 128, size=n).astype(np.float64) * 2.0**-8
    w = {"embed": mat(V, D), "layers": [], "norm": norm(D)}
    for _ in range(L):
        lw = {"attn_norm": norm(D), "q": mat(H * HD, D), "k": mat(KV * HD, D), "v": mat(KV * HD, D),
              "o": mat(D, H * HD), "ffn_norm": norm(D), "gate": mat(F, D), "up": mat(F, D),
              "down": mat(D, F)}
        if qkv_bias:
            lw.update(q_bias=bias(H * HD), k_bias=bias(KV * HD), v_bias=bias(KV * HD))
        if o_bias:
            lw["o_bias"] = bias(D)
        w["layers"].append(lw)
    w["output"] = w["embed"] if tied else mat(V, D)
    return w


# ---------------------------------------------------------------------------------------------
# Reference forward pass (Hugging Face semantics, f64)
def inv_freq(cfg):
    d, base = HD, cfg["theta"]
    f = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = cfg.get("rope")
    attn = 1.0
    if rs is None:
        return f, attn
    if rs["type"] == "llama3":  # transformers _compute_llama3_parameters
        orig, lo, hi, s = rs["original"], rs["low"], rs["high"], rs["factor"]
        wavelen = 2 * math.pi / f
        out = np.where(wavelen > orig / lo, f / s, f)
        smooth = (orig / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / s + smooth * out
        medium = ~(wavelen < orig / hi) & ~(wavelen > orig / lo)
        return np.where(medium, smoothed, out), attn
    if rs["type"] == "yarn":  # transformers _compute_yarn_parameters (truncate, betas 32/1)
        s, orig = rs["factor"], rs["original"]
        corr = lambda rot: d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), d - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
        extrapolation = 1 - ramp
        return f / s * (1 - extrapolation) + f * extrapolation, 0.1 * math.log(s) + 1.0
    raise ValueError(rs)


def forward(w, cfg, tokens):
    n = len(tokens)
    eps = cfg["eps"]
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    f, attn = inv_freq(cfg)
    ang = np.outer(np.arange(n, dtype=np.float64), f)
    cos = np.cos(np.concatenate([ang, ang], 1)) * attn
    sin = np.sin(np.concatenate([ang, ang], 1)) * attn
    rot = lambda x: np.concatenate([-x[..., HD // 2:], x[..., :HD // 2]], -1)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    masked = j > i
    if cfg.get("window"):
        masked |= i - j >= cfg["window"]
    x = w["embed"][tokens]
    for lw in w["layers"]:
        h = rms(x, lw["attn_norm"])
        q = h @ lw["q"].T + lw.get("q_bias", 0)
        k = h @ lw["k"].T + lw.get("k_bias", 0)
        v = h @ lw["v"].T + lw.get("v_bias", 0)
        q = q.reshape(n, H, HD).transpose(1, 0, 2)
        k = k.reshape(n, KV, HD).transpose(1, 0, 2)
        v = v.reshape(n, KV, HD).transpose(1, 0, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)  # repeat_kv
        s = q @ k.transpose(0, 2, 1) / math.sqrt(HD)
        s = np.where(masked, -np.inf, s)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(n, H * HD)
        x = x + o @ lw["o"].T + lw.get("o_bias", 0)
        h = rms(x, lw["ffn_norm"])
        g, u = h @ lw["gate"].T, h @ lw["up"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ lw["down"].T
    return rms(x, w["norm"]) @ w["output"].T


# ---------------------------------------------------------------------------------------------
# Writers
def bf16_bits(a):
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    assert np.all(b & 0xFFFF == 0), "value not exact in bf16"
    return (b >> 16).astype(np.uint16)


def typed(a, t):
    """(numpy array, safetensors dtype) holding `a` exactly in type t = f32 | f16 | bf16."""
    if t == "f32":
        return np.ascontiguousarray(a, dtype=np.float32), "F32"
    if t == "f16":
        h = np.ascontiguousarray(a, dtype=np.float16)
        assert np.array_equal(h.astype(np.float64), a), "value not exact in f16"
        return h, "F16"
    return bf16_bits(a), "BF16"


def write_safetensors(path, tensors):
    """tensors: list of (name, array f64, type). Minimal writer (numpy has no bf16)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a, t in tensors:
        arr, dt = typed(a, t)
        raw = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def hf_tensors(w, types):
    """HF names; types: dict role -> f32/f16/bf16 (default bf16)."""
    t = lambda role: types.get(role, "bf16")
    out = [("model.embed_tokens.weight", w["embed"], t("embed"))]
    for l, lw in enumerate(w["layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", lw["attn_norm"], t("norm")),
                (p + "post_attention_layernorm.weight", lw["ffn_norm"], t("norm"))]
        for r in "qkvo":
            out.append((p + f"self_attn.{r}_proj.weight", lw[r], t("matrix")))
            if r + "_bias" in lw:
                out.append((p + f"self_attn.{r}_proj.bias", lw[r + "_bias"], t("bias")))
        for r in ("gate", "up", "down"):
            out.append((p + f"mlp.{r}_proj.weight", lw[r], t("matrix")))
    out.append(("model.norm.weight", w["norm"], t("norm")))
    if w["output"] is not w["embed"]:
        out.append(("lm_head.weight", w["output"], t("matrix")))
    return out


def permute(a, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (rows for interleaved RoPE)."""
    return a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


def write_gguf(path, arch, w, cfg, types, permute_qk, extra=None, rope_freqs=None):
    """types: dict (layer or -1, role) or role -> f32/f16/bf16; biases and norms stay F32 as
    llama.cpp writes 1-D tensors."""
    g = gguf.GGUFWriter(path, arch)
    g.add_block_count(L)
    g.add_context_length(cfg["context"])
    g.add_embedding_length(D)
    g.add_feed_forward_length(F)
    g.add_head_count(H)
    g.add_head_count_kv(KV)
    g.add_rope_freq_base(cfg["theta"])
    g.add_layer_norm_rms_eps(cfg["eps"])
    if arch == "llama":
        g.add_rope_dimension_count(HD)
        g.add_vocab_size(V)
    g.add_uint32("tokenizer.ggml.bos_token_id", 1)
    g.add_uint32("tokenizer.ggml.eos_token_id", 2)
    for fn in (extra or []):
        fn(g)

    def add(name, a, t):
        arr, _ = typed(a, t)
        if t == "bf16":
            g.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            g.add_tensor(name, arr)

    add("token_embd.weight", w["embed"], types.get("embed", "f32"))
    if rope_freqs is not None:
        g.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
             "up": "ffn_up", "down": "ffn_down"}
    for l, lw in enumerate(w["layers"]):
        b = f"blk.{l}."
        add(b + "attn_norm.weight", lw["attn_norm"], "f32")
        add(b + "ffn_norm.weight", lw["ffn_norm"], "f32")
        for r, n in names.items():
            a = lw[r]
            if permute_qk and r in "qk":
                a = permute(a, H if r == "q" else KV)
            add(b + n + ".weight", a, types.get((l, r), types.get("matrix", "f16")))
            if r + "_bias" in lw:
                bb = lw[r + "_bias"]
                if permute_qk and r in "qk":
                    bb = permute(bb, H if r == "q" else KV)
                add(b + n + ".bias", bb, "f32")
    add("output_norm.weight", w["norm"], "f32")
    if w["output"] is not w["embed"]:
        add("output.weight", w["output"], types.get("output", "f32"))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def llama3_rope_freqs(theta, rope):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: per-frequency divisors."""
    f = 1.0 / theta ** (np.arange(0, HD, 2, dtype=np.float64) / HD)
    orig, lo, hi, s = rope["original"], rope["low"], rope["high"], rope["factor"]
    out = []
    for freq in f:
        wavelen = 2 * math.pi / freq
        if wavelen < orig / hi:
            out.append(1.0)
        elif wavelen > orig / lo:
            out.append(s)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / s + smooth))
    return out


def hf_config(model_type, cls, cfg, **extra):
    c = {"architectures": [cls], "model_type": model_type, "hidden_size": D,
         "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
         "num_key_value_heads": KV, "head_dim": HD, "vocab_size": V,
         "max_position_embeddings": cfg["context"], "rms_norm_eps": cfg["eps"],
         "rope_theta": cfg["theta"], "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
         "initializer_range": 0.02, "use_cache": True, "attention_dropout": 0.0,
         "torch_dtype": "bfloat16", "transformers_version": "4.46.0"}
    if model_type == "qwen2":
        del c["head_dim"]  # Qwen2Config has none (hidden_size / num_attention_heads)
    c.update(extra)
    return c


def write_hf(folder, config, tensors):
    os.makedirs(os.path.join(HERE, folder), exist_ok=True)
    with open(os.path.join(HERE, folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(HERE, folder, "model.safetensors"), tensors)


def main():
    cases = []

    def case(name, path, cfg, w, expect, config=None):
        logits = forward(w, cfg, TOKENS)
        c = {"name": name, "path": path, "expect": expect,
             "logits": [[float(f"{v:.9g}") for v in row] for row in logits]}
        if config is not None:
            c["config"] = config
        cases.append(c)
        return logits

    # Llama 3.1-style: GQA, q/k/v/o biases, llama3 RoPE scaling.
    llama = make_weights(1, qkv_bias=True, o_bias=True, tied=False)
    rope3 = {"type": "llama3", "factor": 8.0, "low": 1.0, "high": 4.0, "original": 64}
    lcfg = {"theta": 500000.0, "eps": 1e-5, "context": 1024, "rope": rope3}
    ref = forward(llama, lcfg, TOKENS)
    plain = forward(llama, dict(lcfg, rope=None), TOKENS)
    assert np.abs(ref - plain).max() > 1e-2, "llama3 scaling has no visible effect"
    write_gguf(os.path.join(HERE, "llama3.gguf"), "llama", llama, lcfg,
               {"embed": "f32", "matrix": "f16", (1, "gate"): "bf16", (1, "up"): "bf16",
                (1, "down"): "bf16", (0, "o"): "f32", "output": "f32"},
               permute_qk=True, rope_freqs=llama3_rope_freqs(lcfg["theta"], rope3))
    expect = {"architecture": "llama", "rope_scaling": "freq_factors", "qkv_bias": True,
              "o_bias": True, "tied_embeddings": False, "sliding_window": 0,
              "rope_theta": lcfg["theta"], "max_positions": 1024}
    case("llama3_gguf", "llama3.gguf", lcfg, llama, expect)
    write_hf("llama3_hf", hf_config("llama", "LlamaForCausalLM", lcfg, attention_bias=True,
                                    mlp_bias=False, tie_word_embeddings=False, pretraining_tp=1,
                                    rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 64}),
             hf_tensors(llama, {"embed": "bf16", "matrix": "bf16", "bias": "f16", "norm": "f32"}))
    case("llama3_hf", "llama3_hf", lcfg, llama, dict(expect, rope_scaling="llama3"))

    # Qwen2: q/k/v biases, GQA, theta 1e6, tied embeddings.
    qwen = make_weights(2, qkv_bias=True, o_bias=False, tied=True)
    qcfg = {"theta": 1000000.0, "eps": 1e-6, "context": 1024}
    write_gguf(os.path.join(HERE, "qwen2.gguf"), "qwen2", qwen, qcfg,
               {"embed": "f16", "matrix": "f16"}, permute_qk=False)
    expect = {"architecture": "qwen2", "rope_scaling": "none", "qkv_bias": True, "o_bias": False,
              "tied_embeddings": True, "sliding_window": 0, "rope_theta": qcfg["theta"],
              "max_positions": 1024}
    case("qwen2_gguf", "qwen2.gguf", qcfg, qwen, expect)
    qwen_hf_config = hf_config("qwen2", "Qwen2ForCausalLM", qcfg, tie_word_embeddings=True,
                               use_sliding_window=False, sliding_window=4096,
                               max_window_layers=L, rope_scaling=None)
    write_hf("qwen2_hf", qwen_hf_config, hf_tensors(qwen, {}))
    case("qwen2_hf", "qwen2_hf", qcfg, qwen, expect)

    # Qwen2 + YaRN.
    ycfg = dict(qcfg, rope={"type": "yarn", "factor": 4.0, "original": 256})
    assert np.abs(forward(qwen, ycfg, TOKENS) - forward(qwen, qcfg, TOKENS)).max() > 1e-2
    write_gguf(os.path.join(HERE, "qwen2_yarn.gguf"), "qwen2", qwen, ycfg,
               {"embed": "f16", "matrix": "f16"}, permute_qk=False,
               extra=[lambda g: g.add_rope_scaling_type(gguf.RopeScalingType.YARN),
                      lambda g: g.add_rope_scaling_factor(4.0),
                      lambda g: g.add_rope_scaling_orig_ctx_len(256)])
    expect_y = dict(expect, rope_scaling="yarn")
    case("qwen2_yarn_gguf", "qwen2_yarn.gguf", ycfg, qwen, expect_y)
    case("qwen2_yarn_hf", "qwen2_hf", ycfg, qwen, expect_y,
         config=dict(qwen_hf_config, rope_scaling={"type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 256}))

    # Mistral with a sliding window of 12 (= len(TOKENS)): full attention inside it.
    mistral = make_weights(3, qkv_bias=False, o_bias=False, tied=False)
    mcfg = {"theta": 10000.0, "eps": 1e-5, "context": 1024, "window": 12}
    write_hf("mistral_hf", hf_config("mistral", "MistralForCausalLM", mcfg, sliding_window=12,
                                     tie_word_embeddings=False),
             hf_tensors(mistral, {"embed": "f16", "matrix": "f16", "norm": "f16"}))
    expect = {"architecture": "mistral", "rope_scaling": "none", "qkv_bias": False,
              "o_bias": False, "tied_embeddings": False, "sliding_window": 12,
              "rope_theta": mcfg["theta"], "max_positions": 1024}
    case("mistral_hf", "mistral_hf", mcfg, mistral, expect)
    write_gguf(os.path.join(HERE, "mistral.gguf"), "llama", mistral, mcfg,
               {"embed": "f16", "matrix": "f16", "output": "f16"}, permute_qk=True,
               extra=[lambda g: g.add_sliding_window(12)])
    case("mistral_gguf", "mistral.gguf", mcfg, mistral, dict(expect, architecture="llama"))

    with open(os.path.join(HERE, "expected_logits.json"), "w") as f:
        json.dump({"generator": "gen_arch_models.py", "tokens": TOKENS, "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
