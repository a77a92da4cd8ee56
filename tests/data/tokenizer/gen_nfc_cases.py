#!/usr/bin/env python3
"""Writes tests/data/tokenizer/nfc_cases.json: [input, NFC(input)] pairs for the NFC
normalizer (tokenizer.json "normalizer": {"type": "NFC"}), from the PyPI unicodedata2 15.1.0
backport (the Unicode version of model/src/unicode_nfc.cc). Covers every code point with a
canonical decomposition (as itself and decomposed), Hangul syllables and jamo, and random
sequences of starters and combining marks. Where HF tokenizers' own NFC is installed, the
script reports how many cases it normalizes differently (Unicode version differences).

    python3 -m venv /tmp/ud && /tmp/ud/bin/pip install unicodedata2==15.1.0 tokenizers
    /tmp/ud/bin/python tests/data/tokenizer/gen_nfc_cases.py
"""
import json
import os
import random

import unicodedata2 as ud

assert ud.unidata_version == "15.1.0", ud.unidata_version
HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    inputs = []
    for cp in range(0x110000):
        c = chr(cp)
        d = ud.decomposition(c)
        if d and not d.startswith("<"):
            inputs.append(c)
            inputs.append(ud.normalize("NFD", c))
    # Hangul: LV, LVT, jamo sequences, a syllable followed by a trailing jamo.
    inputs += ["\uac00", "\uac01", "\ud7a3", "\u1100\u1161", "\u1100\u1161\u11a8",
               "\uac00\u11a8", "\u1100\u1100\u1161", "\u1161\u11a8", "\uac01\u11a8"]
    pool = (list("aeiouAOUnczsk ") + ["\u0300", "\u0301", "\u0302", "\u0303", "\u0308",
            "\u0323", "\u0327", "\u031b", "\u0345", "\u05b0", "\u093c", "\u0915", "\u0958",
            "\u212b", "\u2126", "\u00e9", "\u1100", "\u1161", "\u11a8", "\uac00", "\u0391",
            "\u03b9", "\u1f00", "\u0f71", "\u0f72", "\u0f73", "\U0001d15e", "\U0001d165",
            "\u3099", "\u304b", "\u30cf", "\u309a"])
    rng = random.Random(14)
    for _ in range(600):
        inputs.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
    cases = [[s, ud.normalize("NFC", s)] for s in inputs]
    try:
        from tokenizers import normalizers
        hf = normalizers.NFC()
        differ = sum(1 for s, n in cases if hf.normalize_str(s) != n)
        print("HF tokenizers NFC differs on", differ, "of", len(cases), "cases")
    except ImportError:
        pass
    path = os.path.join(HERE, "nfc_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"unicode": ud.unidata_version, "cases": cases}, f, ensure_ascii=True,
                  separators=(",", ":"))
        f.write("\n")
    print("wrote", path, len(cases), "cases", os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
