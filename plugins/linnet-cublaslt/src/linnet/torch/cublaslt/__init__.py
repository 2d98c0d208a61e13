"""linnet.torch.cublaslt: a Linnet backend for linear calls, by cuBLASLt (nvmath-python).

It takes ``std.nn.linear::linear`` calls (bias-free), and sibling calls that read the same
input (q, k and v; gate and up) as one product over weights that ``context.join`` lays out
one after another. Linnet finds it through the ``linnet.backends`` entry point of the
``linnet-cublaslt`` distribution; nothing in Linnet imports it by name.

>>> from linnet.torch.cublaslt import CublasLt
>>> plan = model.plan_for("decode", [token, pos], backends=[CublasLt()])  # doctest: +SKIP
>>> print(plan.explain())                                                # doctest: +SKIP

Importing this module does not import nvmath-python: that happens when a CUDA target is
probed, so that CPU-only installs (without the ``cu12``/``cu13`` extra) work.
"""

from ._backend import (
    BANDWIDTHS,
    DEFAULT_BANDWIDTH,
    LAUNCH_SECONDS,
    WORKSPACE_BYTES,
    CublasLt,
    __version__,
    bandwidth_of,
)
from ._executable import LinearGemm
from ._graph import (
    DTYPES,
    LINEAR,
    GemmSpec,
    LinearCall,
    find_regions,
    linear_calls,
    sibling_groups,
    spec_for,
)

__all__ = [
    "BANDWIDTHS",
    "DEFAULT_BANDWIDTH",
    "DTYPES",
    "LAUNCH_SECONDS",
    "LINEAR",
    "WORKSPACE_BYTES",
    "CublasLt",
    "GemmSpec",
    "LinearCall",
    "LinearGemm",
    "__version__",
    "bandwidth_of",
    "find_regions",
    "linear_calls",
    "sibling_groups",
    "spec_for",
]
