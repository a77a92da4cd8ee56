"""PolyKV from Python: many LLM agents sharing one compressed KV-cache pool.

    import polykv
    client = polykv.Client("ipc:///tmp/polykv.sock")
    pool = client.create_pool(model="SmolLM2.gguf", text=article, chat_system="Answer ...")
    agent = polykv.Agent(client, pool=pool.id)
    print(agent.generate([{"role": "user", "content": "Who is the article about?"}]))

Everything computes in the project's C++ libraries (libpolykv_client, PooledAgent); the GIL
is released while a model runs, so agents in several threads run side by side.
"""

from ._errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from .client import AttachedPool, Client, PoolInfo
from .agent import Agent, Completion, Stream

__version__ = "0.1.0"

__all__ = [
    "Agent", "AttachedPool", "Client", "Completion", "Error", "PoolInfo", "Stream",
    "AbortedError", "AlreadyExistsError", "CancelledError", "DataLossError",
    "DeadlineExceededError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "NotFoundError", "OutOfRangeError", "PermissionDeniedError",
    "ResourceExhaustedError", "UnavailableError", "UnimplementedError", "UnknownError",
]
