"""linnet.torch: run Linnet models on PyTorch.

>>> from linnet.torch import load
>>> model = load("examples/llama/llama.linnet", config="toy")   # doctest: +SKIP
"""

# Other distributions add subpackages here (`linnet.torch.cublaslt`, `linnet.torch.flashinfer`)
# from their own folders, installed or editable: every `linnet/torch` folder on sys.path counts.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from linnet.lang import LinnetError

from .context import Context
from .interpreter import run_graph
from .model import Model, load, random_weights

__version__ = "0.1.0"

__all__ = ["Context", "LinnetError", "Model", "__version__", "load", "random_weights", "run_graph"]
