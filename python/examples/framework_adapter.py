#!/usr/bin/env python3
"""PolyKV behind the interface agent frameworks call: a function of a list of chat messages
that returns the assistant's text (the shape of an OpenAI-style `chat(messages) -> str`
backend, a LangChain/AutoGen custom model, ...).

The shared document lives in one compressed pool; every call renders the conversation with
the model's own chat template after the pool's system turn and answers from the pool, so many
framework agents can share the document without holding its KV cache each.

    POLYKV_ENDPOINT=ipc:///tmp/polykv.sock python3 framework_adapter.py --model SmolLM2.gguf
"""

import argparse
import os
import pathlib
from typing import Callable, Dict, List

import polykv

ROOT = pathlib.Path(__file__).resolve().parents[2]
Messages = List[Dict[str, str]]


def make_chat_backend(endpoint: str, model: str, document: str, instruction: str,
                      **sampling) -> Callable[[Messages], str]:
    """Publishes `document` as a pool (once: pools are content-addressed) and returns
    chat(messages) -> str for an agent framework. `sampling`: max_new_tokens, temperature,
    top_p, seed, stop (Agent.complete's keywords)."""
    client = polykv.Client(endpoint)
    pool = client.create_pool(model, text=document, chat_system=instruction)
    agent = polykv.Agent(client, pool=pool.id, model=model)

    def chat(messages: Messages) -> str:
        # The system turn is the pool's; the framework's own system message, if any, would
        # be a second one: keep only user / assistant turns.
        turns = [m for m in messages if m.get("role") in ("user", "assistant")]
        return agent.generate(turns, **sampling).strip()

    return chat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default=os.environ.get("POLYKV_ENDPOINT"))
    ap.add_argument("--model", default=os.environ.get("POLYKV_SMOLLM2_GGUF"))
    ap.add_argument("--document", default=str(ROOT / "data/wikitext-2/robert_boulter.txt"))
    args = ap.parse_args()
    if not args.model:
        ap.error("give --model (or set POLYKV_SMOLLM2_GGUF)")

    chat = make_chat_backend(args.endpoint, args.model, pathlib.Path(args.document).read_text(),
                             "You answer questions about this article.", max_new_tokens=32,
                             stop=["\n\n"])
    # What a framework does: keep the conversation, call the backend for each turn.
    history: Messages = [{"role": "system", "content": "You are a research assistant."},
                         {"role": "user", "content": "Who is the article about?"}]
    reply = chat(history)
    print(f"assistant: {reply}")
    history += [{"role": "assistant", "content": reply},
                {"role": "user", "content": "What is his profession?"}]
    reply2 = chat(history)
    print(f"assistant: {reply2}")
    return 0 if reply and reply2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
