#!/usr/bin/env python3
"""ctest eval_post_semantic: scripts/eval_post.py's all-MiniLM-L6-v2 (numpy forward pass,
tokenizers and pure-Python WordPiece) against published figures and HF tokenizers, and its
--semantic step on a hand-written answers.jsonl. Run by tests/python/eval_python.sh with the
venv of scripts/install-eval-deps.sh; a missing package is a failure, not a skip."""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "eval_post.py")
sys.path.insert(0, os.path.dirname(SCRIPT))

try:
    import numpy as np
    import all_minilm_l6_v2
    from tokenizers import Tokenizer
    import eval_post
except ImportError as e:
    print(f"FAIL: {sys.executable} lacks an eval package ({e}): run "
          "'bash scripts/install-eval-deps.sh' and pass its python as POLYKV_EVAL_PYTHON",
          file=sys.stderr)
    sys.exit(1)

# The sentence-transformers model card's example for all-MiniLM-L6-v2
# (model.similarity(embeddings, embeddings)).
SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
PUBLISHED = [[1.0000, 0.6660, 0.1046],
             [0.6660, 1.0000, 0.1411],
             [0.1046, 0.1411, 1.0000]]

# Strings for WordPiece vs HF tokenizers. Every character here is assigned in the Unicode
# versions of both Python's unicodedata and tokenizers' tables (they differ on ~500 code
# points added since Unicode 10, e.g. U+061D, U+2E43..U+2E5D, U+0898..U+089F).
TOKENIZER_STRINGS = [
    "",
    "Hello, World!",
    "Café naïve résumé Ångström İstanbul Straße",
    "The year 1999 had 3.14159 and 1,000,000 items; 2nd 42km",
    "日本語のテキスト和中文混合 한국어 \U00020000\U0002B920\uF900",
    "ΟΔΟΣ Σίσυφος",  # no final-sigma rule: tokenizers lowercases per char
    "soft\u00adhyphen zero\u200bwidth nul\x00byte repl\ufffdchar bell\x07 nel\x85 vt\x0bff\x0c",
    "tabs\tnewlines\nreturns\r nbsp\u00a0ideographic\u3000line\u2028sep",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    "a" * 100 + " " + "b" * 101,  # max_input_chars_per_word = 100: the second is [UNK]
    "don't stop—\"quoted\" (parens) [brackets] {braces} <tags> #hash @at $5 ~tilde ^caret `tick`",
    "¿Qué? ¡Sí! «guillemets» „low“ ‘single’ … •",
    "emoji 😀👍 🏳️\u200d🌈 e\u0301 ﬁ ① ² Ｆｕｌｌｗｉｄｔｈ１２３",
    "x" * 300 + " word" * 300,  # longer than max_seq_length 256: truncated, [SEP] kept
]


def zip_bytes(name):
    with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as z:
        return z.read(name)


class MiniLMTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = eval_post.MiniLM()

    def test_uses_hf_tokenizers(self):
        self.assertEqual(self.model.tokenizer_name, "tokenizers")

    def test_published_similarities(self):
        e = np.stack([self.model.embed(s) for s in SENTENCES])
        self.assertEqual(e.shape, (3, 384))
        np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-6)
        sim = e @ e.T
        for name, m in (("ours", sim), ("published", PUBLISHED)):
            print(f"cosine similarity ({name}): [" + ", ".join(
                "[" + ", ".join(f"{x:.4f}" for x in row) + "]" for row in m) + "]")
        np.testing.assert_allclose(sim, np.array(PUBLISHED), atol=5e-4, rtol=0)

    def test_wordpiece_matches_tokenizers(self):
        tj = zip_bytes("tokenizer.json")
        hf = Tokenizer.from_str(tj.decode())
        hf.no_padding()
        hf.no_truncation()
        wp = eval_post.WordPiece(json.loads(tj))
        for s in TOKENIZER_STRINGS:
            with self.subTest(text=s[:50]):
                want = eval_post._truncate(hf.encode(s).ids)
                got = wp.encode(s)
                self.assertEqual(got, want)
                self.assertLessEqual(len(got), eval_post.MAX_SEQ)
        self.assertEqual(wp.encode(""), [101, 102])
        self.assertEqual(len(wp.encode(TOKENIZER_STRINGS[-1])), eval_post.MAX_SEQ)
        self.assertEqual(wp.encode(TOKENIZER_STRINGS[-1])[-1], 102)


class SemanticStepTest(unittest.TestCase):
    def test_semantic_csv(self):
        full = "Robert Boulter is an English film, television and theatre actor."
        rows = [
            {"codec": "paper", "spec": "k8t-v3", "question": "Who is Robert Boulter?",
             "full": full, "answer": full, "agreement": 1.0, "common_prefix": 14},
            {"codec": "default", "spec": "k7c-v3-e4x3-nc-n16", "question": "Who is Robert Boulter?",
             "full": full, "answer": "Robert Boulter is an English actor of film, TV and stage.",
             "agreement": 0.4, "common_prefix": 5},
            {"codec": "default", "spec": "k7c-v3-e4x3-nc-n16", "question": "Who wrote Herons?",
             "full": "Herons was written by Simon Stephens.",
             "answer": "The weather is lovely today.", "agreement": 0.0, "common_prefix": 0},
        ]
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "answers.jsonl"), "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            with open(os.path.join(out, "report.md"), "w") as f:
                f.write("# polykv-cli eval\n")
            p = subprocess.run([sys.executable, SCRIPT, "--out", out, "--semantic"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(os.path.join(out, "semantic.csv"), newline="") as f:
                got = list(csv.DictReader(f))
                self.assertEqual(list(got[0].keys()),
                                 ["codec", "spec", "question", "cosine", "identical"])
            print("semantic.csv:", [(r["codec"], r["cosine"], r["identical"]) for r in got])
            self.assertEqual(len(got), 3)
            self.assertEqual((got[0]["codec"], got[0]["spec"]), ("paper", "k8t-v3"))
            self.assertEqual(got[0]["cosine"], "1.0000")
            self.assertEqual(got[0]["identical"], "1")
            self.assertEqual(got[1]["identical"], "0")
            self.assertGreater(float(got[1]["cosine"]), 0.8)  # a paraphrase
            self.assertLess(float(got[1]["cosine"]), 1.0)
            self.assertLess(float(got[2]["cosine"]), 0.3)  # an unrelated answer
            with open(os.path.join(out, "report.md")) as f:
                report = f.read()
            self.assertIn("## Semantic similarity of answers to full-precision answers", report)
            self.assertIn("| paper (k8t-v3) | 1 | 1.0000 | 1.0000 |", report)


if __name__ == "__main__":
    unittest.main(verbosity=2)
