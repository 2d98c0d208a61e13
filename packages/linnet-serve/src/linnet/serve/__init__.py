"""linnet.serve: serve Linnet models to many users: :class:`Engine` (a paged KV cache's
pages, continuous batching, preemption, a prefix cache, streaming) and `linnet serve`, an
OpenAI-compatible server (:mod:`linnet.serve.server`).

>>> from linnet.serve import Engine
>>> Engine.load("model.gguf", kv_pages=256).generate([[1, 2, 3]], max_tokens=4)  # doctest: +SKIP
[[17, 9, 9, 30]]

Names are imported on first use: `linnet serve --help` imports no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine
    from .request import Request, SamplingParams

__version__ = "0.1.0"

_LAZY = {"Engine": ".engine", "Request": ".request", "SamplingParams": ".request"}

__all__ = ["Engine", "Request", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
