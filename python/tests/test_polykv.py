"""The polykv package against a real polykvd and a real SmolLM2 pool (see conftest.py)."""

from __future__ import annotations

import json
import math
import subprocess
import threading

import pytest

import polykv

QUESTION = "Who is the article about?"
QUESTION2 = "Which television series did he appear in?"


def ask(q):
    return [{"role": "user", "content": q}]


def test_list_and_info(client, pool, model_path):
    assert pool.created in (True, False)
    assert len(pool.id) == 64
    ids = [p.id for p in client.list_pools()]
    assert pool.id in ids
    info = client.pool_info(pool.id)
    assert info.id == pool.id
    assert info.codec == pool.codec and pool.codec != ""
    assert info.model == model_path
    assert info.layers == 30 and info.kv_heads == 3 and info.head_dim == 64
    assert info.tokens > 1000
    assert info.total_bytes < info.bf16_bytes


def test_create_is_content_addressed(client, pool, model_path):
    from conftest import ARTICLE, INSTRUCTION
    again = client.create_pool(model_path, text=ARTICLE.read_text(), chat_system=INSTRUCTION)
    assert again.id == pool.id
    assert again.created is False


def test_pool_document_uses_the_model_template(agent, pool):
    # SmolLM2's GGUF template renders a system turn as ChatML: the pool starts with it.
    text = agent.decode(agent.document_ids())
    assert text.startswith("<|im_start|>system\nYou answer questions about this article.\n\n")
    assert text.endswith("<|im_end|>\n")
    assert agent.render_chat(ask("Hi?")) == (
        "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n")


def test_generate_equals_cli_agent(agent, pool, model_path, cli, endpoint):
    c = agent.complete(ask(QUESTION), max_new_tokens=32)
    out = subprocess.run(
        [cli, "agent", "--pool", pool.id, "--model", model_path, "--prompt", QUESTION, "--chat",
         "--max-new-tokens", "32", "--json", "--endpoint", endpoint],
        check=True, capture_output=True, text=True)
    ref = json.loads(out.stdout.strip().splitlines()[-1])
    assert c.prompt_ids == ref["prompt_ids"]
    assert c.token_ids == ref["answer_ids"]
    assert c.text == ref["answer"]
    assert c.text.strip() != ""
    assert c.finish_reason in ("eos", "length")
    assert c.stats["new_tokens"] == len(c.token_ids)
    assert c.codec == pool.codec and c.attend == "in-place"


def test_stream_yields_the_same_answer(agent):
    full = agent.complete(ask(QUESTION), max_new_tokens=24)
    s = agent.stream(ask(QUESTION), max_new_tokens=24)
    pieces = list(s)
    assert len(pieces) > 1
    assert "".join(pieces) == full.text
    assert s.completion.token_ids == full.token_ids
    toks = list(agent.stream(ask(QUESTION), max_new_tokens=24, tokens=True))
    assert toks == full.token_ids


def test_stop_string_cuts_the_answer(agent):
    full = agent.complete(ask(QUESTION), max_new_tokens=32, stop_at_eos=False)
    assert len(full.text) > 12
    stop = full.text[6:10]
    cut = full.text[: full.text.index(stop)]
    c = agent.complete(ask(QUESTION), max_new_tokens=32, stop=[stop], stop_at_eos=False)
    assert c.text == cut
    assert c.finish_reason == "stop"
    assert len(c.token_ids) < len(full.token_ids)
    assert c.token_ids == full.token_ids[: len(c.token_ids)]
    streamed = "".join(agent.stream(ask(QUESTION), max_new_tokens=32, stop=stop,
                                    stop_at_eos=False))
    assert streamed == cut


def test_stream_cancel_stops_generation(agent):
    s = agent.stream(ask(QUESTION), max_new_tokens=200, stop_at_eos=False, tokens=True)
    first = [next(s) for _ in range(3)]
    s.cancel()
    rest = list(s)
    assert s.completion.finish_reason == "cancelled"
    assert len(first) + len(rest) == len(s.completion.token_ids)
    assert len(s.completion.token_ids) < 200


def test_sampling_is_seeded(agent):
    a = agent.complete(ask(QUESTION), max_new_tokens=16, temperature=0.9, seed=7)
    b = agent.complete(ask(QUESTION), max_new_tokens=16, temperature=0.9, seed=7)
    assert a.token_ids == b.token_ids


def test_score_log_probs(agent, pool, model_path, cli, endpoint):
    c = agent.complete(ask(QUESTION), max_new_tokens=12, stop_at_eos=False)
    seq = c.prompt_ids + c.token_ids
    lp = agent.score(seq)
    assert len(lp) == len(seq) - 1
    assert all(x <= 0 and math.isfinite(x) for x in lp)
    # Greedy tokens are the argmax: no other token scores higher at their positions.
    n = len(c.token_ids)
    inputs = seq[:-1]
    answer_lp = lp[-n:]
    vocab = 49152
    for shift in (1, 7):
        alt = [(t + shift) % vocab for t in seq[1:]]
        alt_lp = agent.score(inputs, alt)[-n:]
        assert all(a >= b for a, b in zip(answer_lp, alt_lp))
    # The same numbers as polykv-cli agent --score-ids (mean NLL of the continuation).
    out = subprocess.run(
        [cli, "agent", "--pool", pool.id, "--model", model_path, "--score-ids",
         ",".join(map(str, seq)), "--endpoint", endpoint],
        check=True, capture_output=True, text=True)
    ref = json.loads(out.stdout.strip().splitlines()[-1])
    assert ref["scored"] == len(lp)
    assert -sum(lp) / len(lp) == pytest.approx(ref["mean_nll"], rel=1e-9, abs=1e-9)


def test_two_agents_in_two_threads(client, pool, model_path, agent):
    want = [agent.generate(ask(q), max_new_tokens=20) for q in (QUESTION, QUESTION2)]
    agents = [polykv.Agent(client, pool=pool.id, model=model_path, threads=1) for _ in range(2)]
    got = [None, None]
    errors = []

    def run(i, q):
        try:
            got[i] = agents[i].generate(ask(q), max_new_tokens=20)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, q))
               for i, q in enumerate((QUESTION, QUESTION2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert got == want
    assert got[0] != got[1]


def test_pool_bytes_memoryview(client, pool, agent):
    with client.attach(pool.id) as p:
        mv = p.memoryview()
        assert mv.readonly
        assert mv.format == "B"
        assert mv.nbytes == pool.total_bytes
        assert bytes(mv[:8]) == b"PKVPOOL1"
        with pytest.raises(TypeError):
            mv[0] = 0
        assert p.token_ids() == agent.document_ids()
        assert p.info.tokens == len(p.token_ids())
        mv.release()
    assert not p.attached
    with pytest.raises(polykv.FailedPreconditionError):
        p.memoryview()


def test_errors_carry_status(client, model_path, pool, agent):
    with pytest.raises(polykv.NotFoundError) as e:
        client.pool_info("0" * 64)
    assert e.value.code == 5 and e.value.code_name == "NOT_FOUND"
    assert isinstance(e.value, polykv.Error)
    with pytest.raises(polykv.UnavailableError) as e:
        polykv.Client("ipc:///nonexistent/polykv.sock", timeout_ms=200)
    assert e.value.code == 14 and "nonexistent" in e.value.message
    with pytest.raises(polykv.InvalidArgumentError) as e:
        agent.complete(ask(QUESTION), temperature=0.5, top_p=2.0)
    assert e.value.code == 3 and isinstance(e.value, ValueError)
    ghost = polykv.Agent(client, pool="f" * 64, model=model_path)
    with pytest.raises(polykv.NotFoundError):
        ghost.generate("hello")
    with pytest.raises(polykv.NotFoundError):
        next(iter(ghost.stream("hello")))


def test_device_is_chosen_and_never_falls_back(client, pool, model_path, agent):
    with pytest.raises(polykv.InvalidArgumentError) as e:
        polykv.Agent(client, pool=pool.id, model=model_path, device="tpu")
    assert "tpu" in e.value.message
    assert agent.device == "cpu"
    # A cuda agent never runs on the CPU: refused when made without a usable GPU (or CUDA in
    # the build); on a GPU host it is made, and this host pool is refused when it generates.
    try:
        gpu = polykv.Agent(client, pool=pool.id, model=model_path, device="cuda")
    except (polykv.FailedPreconditionError, polykv.UnimplementedError) as e:
        assert "cuda" in e.message.lower()
    else:
        assert gpu.device == "cuda:0"
        with pytest.raises(polykv.FailedPreconditionError) as e:
            gpu.generate("hello")
        assert pool.id[:16] in e.value.message
    # allow_copy matters only for a pool in CUDA memory: on this host pool the same answer.
    copying = polykv.Agent(client, pool=pool.id, model=model_path, device="cpu", allow_copy=True)
    want = agent.complete(ask(QUESTION), max_new_tokens=8)
    got = copying.complete(ask(QUESTION), max_new_tokens=8)
    assert got.token_ids == want.token_ids and got.attend == "in-place"


def test_evict(client, model_path):
    small = client.create_pool(model_path, token_ids=[1, 2, 3, 4, 5, 6, 7, 8], codec="none")
    assert small.created
    assert small.id in [p.id for p in client.list_pools()]
    client.evict(small.id)
    assert small.id not in [p.id for p in client.list_pools()]
    with pytest.raises(polykv.NotFoundError):
        client.evict(small.id)
