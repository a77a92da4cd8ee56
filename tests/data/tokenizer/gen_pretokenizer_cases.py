#!/usr/bin/env python3
"""Writes tests/data/tokenizer/pretokenizer_cases.json: reference pre-tokens and token ids for
every byte-level BPE pre-tokenizer family PolyKV implements, computed by Hugging Face
`tokenizers` (the library these models' tokenizer.json files are made for).

For each family, the HF pre-tokenizer is a Sequence of Split(Regex(pattern), "isolated") for
the family's regex list (llama.cpp's list for that tokenizer.ggml.pre value, written with the
tokenizer.json originals where llama.cpp rewrote a pattern for std::regex) followed by
ByteLevel(use_regex=False). Token ids come from one small byte-level BPE vocabulary trained
here on the test strings and a WikiText-2 excerpt with whole lines as words, so merges cross
word boundaries and the ids depend on where each family splits.

Run at test-data generation time only (CI never runs it, it needs no network once installed):
    python3 -m venv /tmp/tk && /tmp/tk/bin/pip install tokenizers==0.23.3
    /tmp/tk/bin/python tests/data/tokenizer/gen_pretokenizer_cases.py
"""
import json
import os

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
DIGIT = r"\p{N}"
BLOOM = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"
GPT4O = r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
DS_CJK = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"
CJK_KANA = r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+"
DSV3_MAIN = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
DS_LETTERS = (
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}"
    r"\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}"
    r"\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}"
    r"\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}"
    r"\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}"
    r"\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}"
    r"\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}"
    r"\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}"
    r"\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}"
    r"\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}"
    r"\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}"
    r"\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}"
    r"\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}"
    r"\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}"
    r"\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}"
    r"\x{1E900}-\x{1E943}]+"
)

# (tokenizer.ggml.pre name, regex list, ignore_merges) -- one entry per distinct regex list
# (names sharing a list are checked by the C++ test through their first name).
FAMILIES = [
    ("default", [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], False),
    ("gpt-2", [GPT2], False),
    ("smollm", [DIGIT, GPT2], False),
    ("llama3", [LLAMA3], True),
    ("dbrx", [LLAMA3], False),
    ("falcon", [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"], False),
    ("deepseek-llm", [r"[\r\n]", DS_LETTERS,
                      r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
                      r"\s+$", DS_CJK, r"\p{N}+"], False),
    ("deepseek-coder", [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DS_CJK, DIGIT], False),
    ("deepseek-v3", [r"\p{N}{1,3}", CJK_KANA, DSV3_MAIN], False),
    ("qwen2", [QWEN2], False),
    ("qwen35", [r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""], False),
    ("bloom", [BLOOM], False),
    ("viking", [BLOOM, DIGIT], False),
    ("tekken", [r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""], True),
    ("chameleon", ["<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
                   DIGIT, r"[\p{P}!-/:-@\[-`{-~]", GPT2], False),
    ("gpt-4o", [GPT4O], False),
    ("tiny_aya", [r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O], False),
    ("jais-2", [r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"""], False),
    ("exaone-moe", [r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"""], False),
    ("spark2_5", [r"\p{N}{1,3}", CJK_KANA,
                  r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+""",
                  DIGIT], False),
    ("youtu", [r"[\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
               r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""], True),
    ("superbpe", [r"\p{N}+", r"(?=(\d{3})+(?!\d))"], False),
    ("bailingmoe", [r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""], False),
    ("seed-coder", [r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"""], False),
    ("ufakzeka", [r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""], False),
    ("afmoe", [r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
               r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{F900}-\x{FAFF}\x{3040}-\x{309F}\x{30A0}-\x{30FF}"
               r"\x{FF65}-\x{FF9F}\x{2F00}-\x{2FDF}\x{E00}-\x{E7F}\x{E80}-\x{EFF}\x{1780}-\x{17FF}"
               r"\x{1000}-\x{109F}\x{AA60}-\x{AA7F}\x{A9E0}-\x{A9FF}\x{AC00}-\x{D7AF}\x{1100}-\x{11FF}]+",
               DSV3_MAIN], False),
    ("laguna", [r"[^\n]+|[\n]+", QWEN2], False),
    ("minicpm5", [r"\p{N}{1,3}", r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""], True),
]

# Digits, CJK, emoji, whitespace runs, contractions, code, scripts, marks, punctuation.
STRINGS = [
    "Hello world! I'm here, you'RE there; don't-stop. It's OK'LL",
    "1234567 + 89 = 1234656, 3.14159; 12 345; \u0661\u0662\u0663\u0664 \u2167 \u00bd",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u6587\u672c\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "emoji \U0001F999\U0001F680\U0001F636\u200d\U0001F32B\ufe0f \U0001F469\U0001F3FD\u200d\U0001F4BB \u2705 flags \U0001F1EB\U0001F1F7!",
    "a  b   c\t\td\n\n  e \r\n f    ",
    "def f(x):\n    return x+=1 if (a<b) else {'k': [1,2]}  # ~tilde `code` $5 ^_^ |pipe|",
    "camelCaseWord HTTPServer McDonald's \u00c9COLE na\u00efve caf\u00e9 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "e\u0301 combining Z\u0351\u0364 marks; \uff46\uff55\uff4c\uff4c \uff21\uff22\uff23\uff11\uff12\uff13\uff01",
    "<sentinel:12>IMGIMGABZ x\u00a0y\u2003z\u3000end\u2028line",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0e9e\u0eb2\u0eaa\u0eb2 \u1797\u17b6\u179f\u17b6 \u1019\u103c\u1014\u103a\u1019\u102c \u0939\u093f\u0928\u094d\u0926\u0940 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "What's up?! ... \u201cquotes\u201d \u2014 dash \u2013 \u2018single\u2019 \u2026 \u00bfQu\u00e9? \u00a1S\u00ed!",
    "x = 1_000_000; y=0x1F; z = a/b//c \\ path/to/file.txt\n\n\n",
    "   leading spaces and trailing   \n",
    " ",
    "\n",
]


# Random strings over an alphabet of edge cases, checked as piece lengths (code points).
RANDOM_ALPHABET = list("aZkSsTtlLrReEvVdDmM0189 _-.,!?'\"()[]{}<>=+*/\\|~`^$#@%&:;") + [
    "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "\u2003", "\u0301", "\u0308", "\u00e9", "\u00c9",
    "\u00df", "\u01c5", "\u65e5", "\u672c", "\u306e", "\u30c6", "\u30fc", "\ud55c", "\u3131", "\u3105",
    "\u3001", "\u3002", "\uff0c", "\uff01", "\u2026", "\u201c", "\u201d", "\u2014", "\u0663", "\u0661",
    "\u2167", "\u00bd", "\u00b2", "\U0001F999", "\U0001F1EB", "\u200d", "\u03a9", "\u03c9", "\u017f",
    "\u212a", "\u210c", "\u0e01", "\u17b6", "\u094d", "\u0915", "\u2102", "\uff21\uff22", "\uff46",
    "\u0967", "IMGIMG", "Z", "<sentinel:", "123", "4567", "\u2028", "\x0b", "\x1c"]
N_RANDOM = 150


def random_strings():
    import random
    rng = random.Random(14)
    return ["".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(0, 30)))
            for _ in range(N_RANDOM)]


def make_pre(regexes):
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def train_vocab():
    wiki = open(os.path.join(ROOT, "data", "wikitext-2", "wiki.test.raw"), encoding="utf-8").read()
    lines = [l for l in wiki[:40000].split("\n") if l.strip()] + STRINGS * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return vocab, merges


def main():
    vocab, merges = train_vocab()
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    out = {
        "generator": "tests/data/tokenizer/gen_pretokenizer_cases.py, tokenizers " + tokenizers.__version__,
        "tokens": tokens,
        "merges": merges,
        "strings": STRINGS,
        "families": [],
        "random_strings": random_strings(),
    }
    for name, regexes, ignore_merges in FAMILIES:
        pre = make_pre(regexes)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                                   ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        fam = {"name": name, "ignore_merges": ignore_merges,
               "pre_tokenizer": json.loads(tok.to_str())["pre_tokenizer"], "pieces": [], "ids": []}
        for s in STRINGS:
            pieces = [s[a:b] for _, (a, b) in pre.pre_tokenize_str(s)]
            assert "".join(pieces) == s, (name, s, pieces)
            fam["pieces"].append(pieces)
            ids = tok.encode(s, add_special_tokens=False).ids
            assert tok.decode(ids) == s, (name, s)
            fam["ids"].append(ids)
        fam["random_lengths"] = [[b - a for _, (a, b) in pre.pre_tokenize_str(r)]
                                 for r in out["random_strings"]]
        out["families"].append(fam)
    path = os.path.join(HERE, "pretokenizer_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, os.path.getsize(path), "bytes,", len(FAMILIES), "families,",
          len(STRINGS), "strings")


if __name__ == "__main__":
    main()
