#!/usr/bin/env python3
"""Cross-checks expected_logits.json (gen_arch_models.py's own numpy reference) against
Hugging Face transformers running the committed checkpoints, in float64. Optional: CI does
not run it (it needs torch and transformers); run it after changing the generator.

    pip install torch transformers gguf numpy && python3 check_with_transformers.py

HF folders are loaded with AutoModelForCausalLM (the YaRN case writes qwen2_hf's weights
with the case's config.json into a temporary folder, as the C++ test does). GGUF files are
loaded through transformers' GGUF reader where it supports the architecture and metadata;
a GGUF case it cannot express (e.g. rope_freqs.weight, which transformers does not read) is
reported as skipped, not compared. Prints the max |logit difference| per case and exits 1
when any exceeds TOL.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
# transformers computes the RoPE angles in float32 even in a float64 model (rotary_emb casts
# to float): ~1e-7 relative on angles up to 11 rad, the rest of the model is float64.
TOL = 1e-5


def logits_of(model, tokens):
    with torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=False)
    return out.logits[0].double().numpy()


def main():
    exp = json.load(open(os.path.join(HERE, "expected_logits.json")))
    tokens = exp["tokens"]
    worst, failed = {}, False
    tmp = tempfile.mkdtemp()
    try:
        for c in exp["cases"]:
            path = os.path.join(HERE, c["path"])
            try:
                if path.endswith(".gguf"):
                    model = AutoModelForCausalLM.from_pretrained(
                        HERE, gguf_file=os.path.basename(path), dtype=torch.float64,
                        # no tokenizer in these files: transformers would guess the vocab
                        vocab_size=len(c["logits"][0]))
                    cfg = model.config
                    rope = getattr(cfg, "rope_parameters", None) or getattr(
                        cfg, "rope_scaling", None) or {}
                    lost = []
                    if c["expect"]["rope_scaling"] != "none" and rope.get(
                            "rope_type", rope.get("type", "default")) == "default":
                        lost.append(f"RoPE scaling ({c['expect']['rope_scaling']})")
                    if c["expect"]["o_bias"] and not getattr(cfg, "attention_bias", True):
                        lost.append("attention biases")
                    if lost:
                        print(f"{c['name']:18s} skipped: transformers' GGUF reader drops the "
                              + " and ".join(lost))
                        continue
                else:
                    if "config" in c:
                        d = os.path.join(tmp, c["name"])
                        os.makedirs(d)
                        shutil.copy(os.path.join(path, "model.safetensors"), d)
                        json.dump(c["config"], open(os.path.join(d, "config.json"), "w"))
                        path = d
                    model = AutoModelForCausalLM.from_pretrained(
                        path, dtype=torch.float64, attn_implementation="eager")
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{c['name']:18s} skipped: transformers cannot load it: "
                      f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                continue
            got = logits_of(model, tokens)
            ref = np.array(c["logits"], dtype=np.float64)
            d = float(np.abs(got - ref).max())
            worst[c["name"]] = d
            ok = d <= TOL
            failed |= not ok
            print(f"{c['name']:18s} max |transformers - expected| = {d:.3e} "
                  f"({'ok' if ok else 'MISMATCH'})")
    finally:
        shutil.rmtree(tmp)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"{len(worst)} cases compared")
    return 1 if failed or not worst else 0


if __name__ == "__main__":
    sys.exit(main())
