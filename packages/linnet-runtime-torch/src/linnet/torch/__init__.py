"""linnet.torch: run Linnet models on PyTorch.

>>> from linnet.torch import load
>>> model = load("examples/llama/llama.linnet", config="toy")   # doctest: +SKIP
"""

from linnet.lang import LinnetError

from .context import Context
from .interpreter import run_graph
from .model import Model, load, random_weights

__version__ = "0.1.0"

__all__ = ["Context", "LinnetError", "Model", "__version__", "load", "random_weights", "run_graph"]
