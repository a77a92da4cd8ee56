#!/usr/bin/env python3
"""Two agents over ONE shared, compressed pool, each in its own thread.

Creates (or reuses: pools are content-addressed) a pool of a WikiText-2 article framed with the
model's own chat template, then two agents answer different questions side by side; the
document's KV cache exists once, in the daemon's pool, and both attend to it in place.

    POLYKV_ENDPOINT=ipc:///tmp/polykv.sock python3 two_agents.py --model SmolLM2.gguf
Prints one line per agent: "agent N: QUESTION -> ANSWER".
"""

import argparse
import os
import pathlib
import threading

import polykv

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default=os.environ.get("POLYKV_ENDPOINT"))
    ap.add_argument("--model", default=os.environ.get("POLYKV_SMOLLM2_GGUF"), required=False)
    ap.add_argument("--document", default=str(ROOT / "data/wikitext-2/robert_boulter.txt"))
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    if not args.model:
        ap.error("give --model (or set POLYKV_SMOLLM2_GGUF)")

    client = polykv.Client(args.endpoint)
    pool = client.create_pool(args.model, file=args.document,
                              chat_system="You answer questions about this article.")
    print(f"pool {pool.id[:12]}: {pool.tokens} tokens, {pool.total_bytes} bytes "
          f"({pool.effective_ratio:.2f}x smaller than bf16), codec {pool.codec}")

    questions = ["Who is the article about?", "Which play did he appear in in 2006?"]
    answers = [None] * len(questions)

    def run(i: int) -> None:
        agent = polykv.Agent(client, pool=pool.id, model=args.model, threads=1)
        answers[i] = agent.generate([{"role": "user", "content": questions[i]}],
                                    max_new_tokens=args.max_new_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (q, a) in enumerate(zip(questions, answers)):
        if a is None:
            return 1
        print(f"agent {i}: {q} -> {a.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
