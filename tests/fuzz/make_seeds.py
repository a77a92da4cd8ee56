#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into corpus/<target>/ (small, valid or nearly
valid inputs; libFuzzer mutates from there). Run from anywhere; the output is committed."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- protocol: one frame per message type, replies, progress, errors ----------------------
def frame(**kw):
    j = {"magic": "PKV1", "version": 1}
    j.update(kw)
    return json.dumps(j, separators=(",", ":"))


out("fuzz_protocol", "ping", frame(type="PING", id=1))
out("fuzz_protocol", "list", frame(type="LIST", id=2))
out("fuzz_protocol", "stats", frame(type="STATS", id=3, pool_id="3fa2" * 4))
out("fuzz_protocol", "create_text", frame(type="CREATE_POOL", id=4, model="m.gguf",
                                          document="A\u0000B caf\u00e9", document_bytes=8,
                                          codec="k8v3", key_scale="tensor", add_bos=True,
                                          norm_correction=False, progress=True))
out("fuzz_protocol", "create_ids", frame(type="CREATE_POOL", id=5, model="/m", token_ids=[1, 2, 3, 500],
                                         codec="none"))
out("fuzz_protocol", "attach", frame(type="ATTACH", id=6, pool_id="ab" * 32, client_pid=42))
out("fuzz_protocol", "renew", frame(type="RENEW", id=7, lease_id="cd" * 16))
out("fuzz_protocol", "detach", frame(type="DETACH", id=8, lease_id="cd" * 16))
out("fuzz_protocol", "evict", frame(type="EVICT", id=9, pool_id="ab" * 8, force=True))
pool = {"id": "ab" * 32, "model": "m", "model_fingerprint": "f" * 64, "codec": "k8v3",
        "backend": "host", "tokens": 40, "layers": 5, "kv_heads": 4, "head_dim": 8,
        "total_bytes": 18432, "key_codes": 6400, "key_scales": 20, "value_codes": 2400,
        "value_norms": 3200, "overhead": 6412, "bf16_bytes": 25600, "effective_ratio": 1.39,
        "leases": 1, "created_unix_ms": 1700000000000, "prefill_ms": 1.5, "encode_ms": 2.5,
        "publish_ms": 0.1}
out("fuzz_protocol", "attach_reply", frame(type="ATTACH", id=6, ok=True, instance="e" * 32,
                                           pool=pool, lease_id="cd" * 16,
                                           lease_expires_unix_ms=1700000030000, lease_ms=30000,
                                           memory={"backend": "host", "transport": "memfd",
                                                   "fd_socket": "/run/polykv/control.sock.fds",
                                                   "shm_name": "", "size": 18432}))
out("fuzz_protocol", "cuda_reply", frame(type="ATTACH", id=6, ok=True, pool=pool, lease_id="x",
                                         lease_ms=1,
                                         memory={"backend": "cuda", "size": 4096,
                                                 "cuda": {"version": 1, "handle": "00" * 64,
                                                          "offset": 0, "size": 4096,
                                                          "device_uuid": "11" * 16}}))
out("fuzz_protocol", "list_reply", frame(type="LIST", id=2, ok=True, pools=[pool, pool],
                                         memory_used=1, memory_cap=2, model_cache_bytes=3,
                                         model_cache_models=1, model_cache_capacity=2,
                                         creates_queued=0, creates_running=1,
                                         create_queue_capacity=8))
out("fuzz_protocol", "progress", frame(type="PROGRESS", id=4, instance="e" * 32, stage="prefill",
                                       done=512, total=2048, heartbeat=True))
out("fuzz_protocol", "error", frame(type="ATTACH", id=6, ok=False, code="NOT_FOUND",
                                    error="unknown pool ab"))
out("fuzz_protocol", "bad_version", '{"magic":"PKV1","version":18446744073709551615,"type":"PING","id":1}')
out("fuzz_protocol", "truncated", '{"magic":"PKV1","version":1,"type":"PING","id":3')

# ---- GGUF ----------------------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def arr(etype, items):
    body = b"".join(gstr(x) if etype == STR else struct.pack(
        {U32: "<I", I32: "<i", F32: "<f"}[etype], x) for x in items)
    return struct.pack("<IQ", etype, len(items)) + body


def gguf(kvs, tensors=(), alignment=32):
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    infos, datas, off = b"", b"", 0
    for name, dims, ttype, data in tensors:
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(
            struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, off)
        pad = (-len(data)) % alignment
        datas += data + b"\0" * pad
        off += len(data) + pad
    body = head + infos
    body += b"\0" * ((-len(body)) % alignment)
    return body + datas


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


byte_tokens = bytes_to_unicode()
gpt2_tokens = byte_tokens + ["he", "ll", "hell", "hello", "\u0120w", "\u0120wo", "<|endoftext|>"]
gpt2_merges = ["h e", "l l", "he ll", "hell o", "\u0120 w", "\u0120w o"]
gpt2 = [kv("general.architecture", STR, gstr("llama")),
        kv("tokenizer.ggml.model", STR, gstr("gpt2")),
        kv("tokenizer.ggml.pre", STR, gstr("gpt-2")),
        kv("tokenizer.ggml.tokens", ARR, arr(STR, gpt2_tokens)),
        kv("tokenizer.ggml.token_type", ARR, arr(I32, [1] * (len(gpt2_tokens) - 1) + [3])),
        kv("tokenizer.ggml.merges", ARR, arr(STR, gpt2_merges)),
        kv("tokenizer.ggml.bos_token_id", U32, struct.pack("<I", len(gpt2_tokens) - 1)),
        kv("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", len(gpt2_tokens) - 1))]
out("fuzz_gguf", "gpt2_vocab.gguf", gguf(gpt2))
spm_tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + \
    ["\u2581", "\u2581h", "\u2581he", "llo", "\u2581hello", "o", "l", "e", "h"]
spm = [kv("tokenizer.ggml.model", STR, gstr("llama")),
       kv("tokenizer.ggml.tokens", ARR, arr(STR, spm_tokens)),
       kv("tokenizer.ggml.scores", ARR, arr(F32, [0.0] * 3 + [-1000.0] * 256 +
                                            [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -9.0])),
       kv("tokenizer.ggml.token_type", ARR, arr(I32, [2, 3, 3] + [6] * 256 + [1] * 9)),
       kv("tokenizer.ggml.bos_token_id", U32, struct.pack("<I", 1)),
       kv("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", 2)),
       kv("tokenizer.ggml.add_bos_token", BOOL, b"\x01")]
out("fuzz_gguf", "spm_vocab.gguf", gguf(spm))
f32 = struct.pack("<8f", *[0.5 * i for i in range(8)])
f16 = struct.pack("<8e", *[0.25 * i for i in range(8)])
q8_0 = struct.pack("<e", 0.1) + bytes(range(32))                        # 32 values
q4_0 = struct.pack("<e", 0.2) + bytes(range(16))                        # 32 values
q4_k = bytes(range(144))                                                # 256 values
tensors = [("a.f32", [8], 0, f32), ("b.f16", [4, 2], 1, f16), ("c.q8_0", [32], 8, q8_0),
           ("d.q4_0", [32], 2, q4_0), ("e.q4_k", [256], 12, q4_k)]
meta = [kv("general.alignment", U32, struct.pack("<I", 32)),
        kv("general.name", STR, gstr("seed")),
        kv("some.f64", F64, struct.pack("<d", 1.5)), kv("some.i64", I64, struct.pack("<q", -7)),
        kv("some.u8", U8, b"\x07"), kv("some.i16", I16, struct.pack("<h", -3)),
        kv("some.nested", ARR, struct.pack("<IQ", ARR, 1) + arr(I32, [1, 2]))]
out("fuzz_gguf", "tensors.gguf", gguf(meta, tensors))
whole = gguf(gpt2[:3], tensors[:2])
out("fuzz_gguf", "truncated.gguf", whole[: len(whole) // 2])
for name in ("ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"):
    with open(os.path.join(DATA, "tokenizer", name), "rb") as f:
        out("fuzz_gguf", name + ".head", f.read(4096))

# ---- safetensors ---------------------------------------------------------------------------
def safetensors(entries, metadata=None):
    header, data, off = {}, b"", 0
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


out("fuzz_safetensors", "f32.safetensors",
    safetensors([("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                 ("b", "F32", [2], struct.pack("<2f", 5, 6))], {"format": "pt"}))
out("fuzz_safetensors", "bf16_f16.safetensors",
    safetensors([("x", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
                 ("y", "F16", [1, 2], struct.pack("<2e", 1.0, -2.0)),
                 ("z", "I64", [1], struct.pack("<q", 3))]))
out("fuzz_safetensors", "empty_shape.safetensors", safetensors([("s", "F32", [], struct.pack("<f", 7))]))
bad = safetensors([("w", "F32", [2], struct.pack("<2f", 1, 2))])
out("fuzz_safetensors", "truncated.safetensors", bad[:-3])
with open(os.path.join(DATA, "models", "stories260K", "model.safetensors"), "rb") as f:
    head = f.read(8)
    (n,) = struct.unpack("<Q", head)
    out("fuzz_safetensors", "stories260K.header", head + f.read(n))

# ---- tokenizer text ------------------------------------------------------------------------
for name in ("ggml-vocab-gpt-2.gguf.inp", "ggml-vocab-llama-spm.gguf.inp"):
    with open(os.path.join(DATA, "tokenizer", name), "rb") as f:
        parts = f.read().split(b"\n__ggml_vocab_test__\n")
    for i, p in enumerate(parts[:40]):
        if p:
            out("fuzz_tokenizer", "%s.%02d" % (name.split(".")[0], i), p)
out("fuzz_tokenizer", "chat", "<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n")
out("fuzz_tokenizer", "mixed", "caf\u00e9 \u65e5\u672c\u8a9e \U0001f600 \t\n  12345 don't <|endoftext|>")
out("fuzz_tokenizer", "invalid_utf8", b"caf\xe9 \xff\xfe \xc0\xaf")

# ---- tokenizer.json ------------------------------------------------------------------------
vocab = {t: i for i, t in enumerate(gpt2_tokens[:-1])}
tj = {"version": "1.0",
      "added_tokens": [{"id": len(gpt2_tokens) - 1, "content": "<|endoftext|>", "special": True}],
      "normalizer": None,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
      "model": {"type": "BPE", "vocab": vocab, "merges": gpt2_merges}}
out("fuzz_tokenizer_json", "bytelevel.json", json.dumps(tj))
tj2 = dict(tj)
tj2["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}
out("fuzz_tokenizer_json", "digits.json", json.dumps(tj2))
tj3 = dict(tj)
tj3["model"] = {"type": "BPE", "vocab": vocab, "merges": [m.split(" ") for m in gpt2_merges]}
out("fuzz_tokenizer_json", "merges_as_pairs.json", json.dumps(tj3))
out("fuzz_tokenizer_json", "unigram.json", '{"model": {"type": "Unigram", "vocab": []}}')
