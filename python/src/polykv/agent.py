"""polykv.Agent: an agent of one pool (PooledAgent): generate, stream, score."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, Union

from . import _polykv
from .client import AttachedPool, Client

Message = dict  # {"role": "user" | "assistant" | "system", "content": str}
Prompt = Union[str, Sequence[Message], Sequence[int]]


@dataclass
class Completion:
    """One generation: `text` (cut before a stop string), `token_ids` (every generated token,
    the one that completed a stop string included), `finish_reason` ("eos", "length", "stop"
    or "cancelled"), `prompt_ids` (as fed after the document) and `stats` (the C++ agent's
    AgentStats: ttft_ms, generation_ms, tokens_per_s, new_tokens, ...)."""

    text: str
    token_ids: list
    finish_reason: str
    prompt_ids: list = field(default_factory=list)
    codec: str = ""
    attend: str = ""
    stats: dict = field(default_factory=dict)

    @staticmethod
    def _from(d: dict) -> "Completion":
        return Completion(
            text=d["text"].decode("utf-8", errors="replace"),
            token_ids=list(d["token_ids"]),
            finish_reason=d["finish_reason"],
            prompt_ids=list(d["prompt_ids"]),
            codec=d["codec"],
            attend=d["attend"],
            stats=dict(d["stats"]),
        )


class Stream:
    """Iterator over a generation as it happens: yields text pieces (str; whole UTF-8
    characters, never part of a stop string), or token ids when made with tokens=True.
    `cancel()` (or `close()`, or leaving a `with` block) stops the generation at the next
    token. After the end, `completion` holds the Completion."""

    def __init__(self, raw, tokens: bool):
        self._raw = raw
        self._tokens = tokens
        self.completion: Optional[Completion] = None

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        while True:
            try:
                tok, piece = next(self._raw)
            except StopIteration:
                r = self._raw.result()
                if r is not None:
                    self.completion = Completion._from(r)
                raise
            if self._tokens:
                if tok >= 0:
                    return tok
                continue
            if piece:
                return piece.decode("utf-8", errors="replace")

    @property
    def text(self) -> str:
        """The whole answer (consumes the rest of the stream)."""
        for _ in self:
            pass
        return self.completion.text if self.completion else ""

    def cancel(self) -> None:
        self._raw.cancel()

    close = cancel

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()
        for _ in self:  # drain: the agent is free again when this returns
            pass


class Agent:
    """An agent that answers after the document of pool `pool`, attending to the shared,
    compressed pool in place (nothing of the document is copied or prefilled again).

    `client_or_endpoint`: a Client, an endpoint string ("ipc:///path", "tcp://host:port") or
    None ($POLYKV_ENDPOINT / the default socket). `model`: the pool's model (.gguf or HF
    folder); None = the path the pool was created with. `threads`: compute threads (0 = all
    cores). `attend`: "in-place" (default) or "decompressed". `device`: where the agent
    computes, "cpu" (default) or "cuda" / "cuda:N" (the model on that GPU, attending in place
    to a pool the daemon keeps in CUDA memory; without a usable GPU the constructor raises
    FailedPreconditionError, in a build without CUDA UnimplementedError: never a CPU run).
    `allow_copy`: a CPU agent may read a pool that lies in CUDA memory by copying it to the
    host (logged with its cost on stderr); without it such a pool raises
    FailedPreconditionError, as does a host pool for a cuda agent. The model loads once; each
    generate() attaches the pool, answers, detaches. One generation at a time per Agent
    (others wait); use one Agent per thread to run agents side by side."""

    def __init__(
        self,
        client_or_endpoint: Union[Client, str, None] = None,
        *,
        pool: str,
        model: Optional[str] = None,
        threads: int = 0,
        attend: str = "in-place",
        timeout_ms: int = 5000,
        device: str = "cpu",
        allow_copy: bool = False,
    ):
        if isinstance(client_or_endpoint, Client):
            self.client = client_or_endpoint
        else:
            self.client = Client(client_or_endpoint, timeout_ms)
        if model is None:
            model = self.client.pool_info(pool).model
        self.model = os.fspath(model)
        self._raw = _polykv.Agent(self.client.endpoint, self.model, pool, threads, attend,
                                  timeout_ms, device, allow_copy)

    @property
    def pool(self) -> str:
        return self._raw.pool

    @property
    def device(self) -> str:
        """Where the agent computes: "cpu" or "cuda:N"."""
        return self._raw.device

    # ---- text ----
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS; special tokens such as <|im_start|> are parsed)."""
        return self._raw.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._raw.decode(list(ids)).decode("utf-8", errors="replace")

    def render_chat(self, messages: Sequence[Message]) -> str:
        """The prompt text for `messages` after the pool's system turn, rendered with the
        model's own chat template and ending with the assistant generation prompt (what
        `polykv-cli agent --chat` feeds)."""
        pairs = []
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise TypeError("messages must be dicts with 'role' and 'content'")
            pairs.append((str(m["role"]), str(m["content"])))
        return self._raw.render_chat(pairs)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """Token ids for a prompt: text as is, a list of messages through the chat template,
        or token ids."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        prompt = list(prompt)
        if prompt and all(isinstance(t, int) for t in prompt):
            return prompt
        return self.encode(self.render_chat(prompt))

    # ---- generation ----
    @staticmethod
    def _args(max_new_tokens, temperature, top_p, seed, stop, stop_at_eos):
        a = _polykv.GenArgs()
        a.max_new_tokens = int(max_new_tokens)
        a.temperature = float(temperature)
        a.top_p = float(top_p)
        a.seed = int(seed)
        a.stop_at_eos = bool(stop_at_eos)
        if isinstance(stop, str):
            stop = [stop]
        a.stop = list(stop or [])
        return a

    def complete(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 0.95,
        seed: int = 0,
        stop: Union[str, Sequence[str], None] = None,
        stop_at_eos: bool = True,
    ) -> Completion:
        """Generates an answer after the pool's document. `prompt`: text (fed as is), a list
        of {"role", "content"} messages (rendered with the model's chat template) or token
        ids. temperature <= 0: greedy; else softmax(logits / T), top-p, seeded by `seed`.
        Generation ends at end-of-generation tokens (unless stop_at_eos=False), after
        max_new_tokens, or when a `stop` string appears (the text is cut before it).
        Raises polykv.Error subclasses (NotFoundError: pool evicted, ...)."""
        ids = self.prompt_ids(prompt)
        args = self._args(max_new_tokens, temperature, top_p, seed, stop, stop_at_eos)
        return Completion._from(self._raw.generate(ids, args))

    def generate(self, prompt: Prompt, **kwargs) -> str:
        """complete(prompt, **kwargs).text"""
        return self.complete(prompt, **kwargs).text

    def stream(
        self,
        prompt: Prompt,
        *,
        tokens: bool = False,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 0.95,
        seed: int = 0,
        stop: Union[str, Sequence[str], None] = None,
        stop_at_eos: bool = True,
    ) -> Stream:
        """As complete(), but returns at once with a Stream that yields text pieces (or token
        ids with tokens=True) while the model generates on a worker thread."""
        ids = self.prompt_ids(prompt)
        args = self._args(max_new_tokens, temperature, top_p, seed, stop, stop_at_eos)
        return Stream(self._raw.stream(ids, args), tokens)

    # ---- scoring and the pool ----
    def score(self, tokens: Union[str, Sequence[int]],
              targets: Optional[Sequence[int]] = None) -> list[float]:
        """Log-probabilities (natural log) after the pool's document. With `targets`: log
        p(targets[i] | document, tokens[:i+1]) for each i (len(targets) == len(tokens)).
        Without: tokens[1:] scored given the tokens before them (len(tokens) - 1 values).
        A str is encoded first."""
        if isinstance(tokens, str):
            tokens = self.encode(tokens)
        tokens = [int(t) for t in tokens]
        if targets is None:
            if len(tokens) < 2:
                raise ValueError("score: need at least 2 tokens (or give targets)")
            tokens, targets = tokens[:-1], tokens[1:]
        return self._raw.score(tokens, [int(t) for t in targets], 512)

    def document_ids(self) -> list[int]:
        """Token ids the agent attends to: the pool's document (parent chain first)."""
        return self._raw.pool_token_ids()

    def attach(self) -> AttachedPool:
        """Attaches the agent's pool through its client (its bytes: .memoryview())."""
        return self.client.attach(self.pool)
