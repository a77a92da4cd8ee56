#!/usr/bin/env python3
"""Decode speed of a Python agent (polykv.Agent) vs the CLI agent (`polykv-cli agent`), same
run, same pool, same question, greedy, a fixed number of new tokens (end-of-generation
ignored). Starts its own polykvd from the build folder on a private socket.

    python3 python/bench/bench_agent_decode.py --build-dir build --model SmolLM2.gguf

Decode tok/s = (new tokens - 1) / (generation time - prompt + first token time): the steady
per-token rate. For the CLI and Python `complete` it comes from the agent's own stats; for
Python `stream` also from Python's clock (first to last token received by the iterator, so
the binding's per-token path is inside the measurement). Prints a table with the CLI as the
baseline and each figure's ratio to it: of the medians, and the median of per-rep ratios to
the adjacent CLI run (target: within 5%)."""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import time

import polykv

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUESTION = "Who is the article about?"


def decode_rate(stats):
    n = stats["new_tokens"]
    t = (stats["generation_ms"] - stats["prompt_first_token_ms"]) / 1000
    return (n - 1) / t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=str(ROOT / "build"))
    ap.add_argument("--model", default=os.environ.get("POLYKV_SMOLLM2_GGUF"))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    ap.add_argument("--codec", default="k8v3")
    args = ap.parse_args()
    build = pathlib.Path(args.build_dir)
    cli = str(build / "cli" / "polykv-cli")
    work = tempfile.mkdtemp(prefix="polykv-bench-")
    ep = f"ipc://{work}/control.sock"
    daemon = subprocess.Popen([str(build / "daemon" / "polykvd"), "--endpoint", ep, "--backend",
                               "host"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            try:
                client = polykv.Client(ep, timeout_ms=500)
                break
            except polykv.Error:
                time.sleep(0.2)
        else:
            raise SystemExit("polykvd did not start")
        pool = client.create_pool(args.model, file=ROOT / "data/wikitext-2/robert_boulter.txt",
                                  chat_system="You answer questions about this article.",
                                  codec=args.codec)
        agent = polykv.Agent(client, pool=pool.id, model=args.model, threads=args.threads)
        msgs = [{"role": "user", "content": QUESTION}]
        kw = dict(max_new_tokens=args.new_tokens, stop_at_eos=False)
        rows = {"cli agent (stats)": [], "python complete (stats)": [],
                "python stream (stats)": [], "python stream (python clock)": []}
        answers = set()
        agent.complete(msgs, **kw)  # warm the page cache
        def run_cli():
            out = subprocess.run([cli, "agent", "--pool", pool.id, "--model", args.model,
                                  "--prompt", QUESTION, "--chat", "--ignore-eos",
                                  "--max-new-tokens", str(args.new_tokens), "--threads",
                                  str(args.threads), "--json", "--endpoint", ep],
                                 check=True, capture_output=True, text=True)
            ref = json.loads(out.stdout.strip().splitlines()[-1])
            rows["cli agent (stats)"].append(decode_rate(ref["stats"]))
            answers.add(tuple(ref["answer_ids"]))

        def run_complete():
            c = agent.complete(msgs, **kw)
            rows["python complete (stats)"].append(decode_rate(c.stats))
            answers.add(tuple(c.token_ids))

        def run_stream():
            s = agent.stream(msgs, tokens=True, **kw)
            stamps = []
            for _tok in s:
                stamps.append(time.perf_counter())
            rows["python stream (stats)"].append(decode_rate(s.completion.stats))
            rows["python stream (python clock)"].append((len(stamps) - 1) /
                                                        (stamps[-1] - stamps[0]))
            answers.add(tuple(s.completion.token_ids))

        # Interleaved, and the order rotates every rep, so load that drifts and whatever the
        # previous run leaves behind hit every variant alike.
        order = [run_cli, run_complete, run_stream]
        for rep in range(args.reps):
            for fn in order[rep % 3:] + order[: rep % 3]:
                fn()
        base = statistics.median(rows["cli agent (stats)"])
        print(f"pool {pool.id[:12]} ({pool.codec}, {pool.tokens} document tokens), "
              f"{args.new_tokens} new tokens greedy, {args.reps} reps, threads "
              f"{args.threads or os.cpu_count()}; identical answers: {len(answers) == 1}")
        print(f"{'figure':30} {'decode tok/s (median)':>22} {'min':>7} {'max':>7} "
              f"{'vs CLI':>7} {'paired':>7}")
        cli_xs = rows["cli agent (stats)"]
        for name, xs in rows.items():
            # paired: median over reps of this rep's figure / the CLI's figure of the same rep
            # (adjacent runs: robust to load that drifts during the benchmark).
            paired = statistics.median(x / c for x, c in zip(xs, cli_xs))
            print(f"{name:30} {statistics.median(xs):22.1f} {min(xs):7.1f} {max(xs):7.1f} "
                  f"{statistics.median(xs) / base:7.3f} {paired:7.3f}")
        return 0 if len(answers) == 1 else 1
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
