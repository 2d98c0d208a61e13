"""linnet.jax: run Linnet models on JAX, through generated ``jax.numpy`` source.

>>> from linnet.jax import load, load_function
>>> model = load("examples/llama/llama.linnet", weights="toy.safetensors",
...              config="toy")                                       # doctest: +SKIP

Nothing here imports torch. jax itself is imported on first use of a name below, not with
the package: `linnet.jax.cli` (the `linnet run --runtime jax` registration) must import fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from linnet.lang import LinnetError

if TYPE_CHECKING:
    from .model import Function, Model, load, load_function, load_source, random_weights
    from .weights import load_safetensors, save_safetensors

__version__ = "0.1.0"

_LAZY = {
    "Function": ".model",
    "Model": ".model",
    "load": ".model",
    "load_function": ".model",
    "load_source": ".model",
    "random_weights": ".model",
    "load_safetensors": ".weights",
    "save_safetensors": ".weights",
}

__all__ = [
    "Function",
    "LinnetError",
    "Model",
    "__version__",
    "load",
    "load_function",
    "load_safetensors",
    "load_source",
    "random_weights",
    "save_safetensors",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
