"""python/examples/ run against the test daemon and model (they must exit 0 and answer)."""

import os
import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run_example(name, endpoint, model_path):
    env = dict(os.environ, POLYKV_ENDPOINT=endpoint, POLYKV_SMOLLM2_GGUF=model_path)
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_two_agents_example(endpoint, model_path, pool):
    lines = run_example("two_agents.py", endpoint, model_path)
    # The example frames the same article with the same instruction: the test's own pool.
    assert lines[0].startswith(f"pool {pool.id[:12]}: {pool.tokens} tokens")
    answers = [l for l in lines if l.startswith("agent ")]
    assert len(answers) == 2
    for l in answers:
        assert len(l.split(" -> ", 1)[1].strip()) > 0
    assert "Boulter" in answers[0]


def test_framework_adapter_example(endpoint, model_path, pool):
    lines = run_example("framework_adapter.py", endpoint, model_path)
    replies = [l for l in lines if l.startswith("assistant: ")]
    assert len(replies) == 2
    assert all(len(r) > len("assistant: ") for r in replies)
