"""linnet.torch: run Linnet models on PyTorch.

>>> from linnet.torch import load
>>> model = load("examples/llama/llama.linnet", config="toy")   # doctest: +SKIP

The names below are imported on first use, not with the package: `linnet.torch.cli` (the
`linnet run` and `linnet plan` registrations) and plugins' `linnet.torch.<name>` subpackages
must import without importing torch, so that listing commands and finding backends stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Other distributions add subpackages here (`linnet.torch.cublaslt`, `linnet.torch.flashinfer`)
# from their own folders, installed or editable: every `linnet/torch` folder on sys.path counts.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from linnet.lang import LinnetError

if TYPE_CHECKING:
    from .context import Context
    from .interpreter import run_graph
    from .loading import load
    from .model import Model, random_weights

__version__ = "0.1.0"

_LAZY = {
    "Context": ".context",
    "run_graph": ".interpreter",
    "Model": ".model",
    "load": ".loading",
    "random_weights": ".model",
}

__all__ = ["Context", "LinnetError", "Model", "__version__", "load", "random_weights", "run_graph"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
