"""polykv.Client: a connection to polykvd (list, show, create, evict and attach pools)."""

from __future__ import annotations

import os
from typing import Callable, Iterable, Optional

from . import _polykv
from ._errors import Error


class PoolInfo(dict):
    """A pool's description (a dict whose keys are also attributes): id, codec, backend,
    model, layers, kv_heads, head_dim, tokens, total_bytes, bf16_bytes, effective_ratio,
    leases, ... as polykv_pool_info. create_pool's result also has `created` (False when an
    identical pool already existed)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class AttachedPool:
    """An attached pool: a lease (renewed in the background) and the pool's read-only
    mapping. `memoryview()` gives its bytes (PoolHeader first; layout in ipc/pool_layout.h)
    without a copy; the view must not be used after `detach()` (or the end of a `with`)."""

    def __init__(self, raw):
        self._raw = raw

    @property
    def info(self) -> PoolInfo:
        return PoolInfo(self._raw.info())

    def token_ids(self) -> list[int]:
        """Token ids of the pool's document."""
        return self._raw.token_ids()

    def memoryview(self) -> memoryview:
        """The whole pool as a read-only memoryview of bytes (format 'B'); host pools only
        (FailedPreconditionError for a cuda pool)."""
        try:
            return memoryview(self._raw)
        except BufferError as e:  # pybind11 wraps the library's error
            cause = e.__cause__ or e.__context__
            if isinstance(cause, Error):
                raise cause from None
            raise

    def verify(self) -> None:
        """Recomputes the payload checksum (DataLossError on mismatch)."""
        self._raw.verify()

    def detach(self) -> None:
        """Releases the lease and unmaps the pool (idempotent)."""
        self._raw.detach()

    @property
    def attached(self) -> bool:
        return self._raw.attached

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()


class Client:
    """A connection to polykvd at `endpoint` (None: $POLYKV_ENDPOINT or the default socket).
    `timeout_ms` bounds each request try. Raises UnavailableError when no daemon answers.
    Thread-safe (calls are serialised on the connection)."""

    def __init__(self, endpoint: Optional[str] = None, timeout_ms: int = 5000):
        self.endpoint = endpoint if endpoint is not None else os.environ.get("POLYKV_ENDPOINT", "")
        self.timeout_ms = timeout_ms
        self._raw = _polykv.Client(self.endpoint, timeout_ms)

    def ping(self) -> dict:
        """The daemon's version, pid, instance and pool memory use."""
        return self._raw.ping()

    def list_pools(self) -> list[PoolInfo]:
        """Every pool the daemon publishes."""
        return [PoolInfo(d) for d in self._raw.list_pools()]

    def pool_info(self, pool_id: str) -> PoolInfo:
        """One pool's description (NotFoundError for an unknown id)."""
        return PoolInfo(self._raw.pool_info(pool_id))

    def create_pool(
        self,
        model: str,
        text: Optional[str] = None,
        *,
        file: Optional[str | os.PathLike] = None,
        token_ids: Optional[Iterable[int]] = None,
        codec: str = "",
        chat_system: Optional[str] = None,
        add_bos: Optional[bool] = None,
        parent: str = "",
        key_scale: str = "tensor",
        norm_correction: bool = False,
        timeout_s: float = 600,
        progress: Optional[Callable[[str, int, int], None]] = None,
    ) -> PoolInfo:
        """Prefills a document with `model`, compresses its KV cache with `codec` ("" = the
        daemon's default; "k8v3", "none", ...) and publishes it; returns its PoolInfo (with
        `created`). Give exactly one of `text`, `file` (UTF-8) or `token_ids`.
        `chat_system`: frame the text as a system turn "chat_system\\n\\ntext" rendered with the
        model's own chat template (as `polykv-cli pools create --chat-system`), so agents can
        then ask with messages; BOS is then left to the template (add_bos defaults to False).
        `progress(stage, done, total)` is called while the daemon works."""
        given = sum(x is not None for x in (text, file, token_ids))
        if given != 1:
            raise ValueError("create_pool: give exactly one of text, file or token_ids")
        if file is not None:
            with open(file, encoding="utf-8") as f:
                text = f.read()
        o = _polykv.CreateOptions()
        o.model = model
        o.codec = codec
        o.key_scale = key_scale
        o.norm_correction = norm_correction
        o.parent = parent
        o.timeout_ms = int(timeout_s * 1000)
        if text is not None:
            if chat_system is not None:
                text = _polykv.chat_document(model, text, chat_system)
            o.document = text
        else:
            if chat_system is not None:
                raise ValueError("create_pool: chat_system needs text or file, not token_ids")
            o.token_ids = [int(t) for t in token_ids]
        o.add_bos = add_bos if add_bos is not None else chat_system is None
        info, created = self._raw.create_pool(o, progress)
        info = PoolInfo(info)
        info["created"] = created
        return info

    def evict(self, pool_id: str, force: bool = False) -> None:
        """Evicts a pool (`force`: even while agents hold leases)."""
        self._raw.evict(pool_id, force)

    def attach(self, pool_id: str) -> AttachedPool:
        """Attaches a pool: lease + read-only mapping (use as a context manager)."""
        return AttachedPool(self._raw.attach(pool_id))
