"""An example Linnet backend: each ``std.nn.linear::linear`` call, run by
``torch.nn.functional.linear``.

Copy this package to start your own backend (see README.md). Linnet finds it through the
``linnet.backends`` entry point in pyproject.toml; ``linnet backends`` lists it.

>>> from linnet.backends import Target
>>> ExampleLinear().probe(Target("cpu")) is not None
True
"""

from __future__ import annotations

from typing import Any

from linnet.backends import (
    Capabilities,
    Cost,
    ExecutableMeta,
    Options,
    Region,
    Target,
)

__version__ = "0.1.0"

LINEAR = "std.nn.linear::linear"
"""The callee this backend takes: y[n, o] = sum_i x[n, i] * w[o, i], w stored [out, in]."""


class ExampleLinear:
    """Runs every linear call of a graph with ``torch.nn.functional.linear``."""

    name = "example-linear"
    version = __version__  # timings are cached per backend version: bump it when kernels change
    # The backend contract this was written for, as a literal: a host implementing another
    # contract version lists this backend under `skipped()` instead of calling methods it may
    # not have. Never write `contract = CONTRACT` (the host's own number): that claims every
    # future contract too. Raise it only after porting to the new contract.
    contract = 1

    def probe(self, target: Target) -> Capabilities | None:
        """Whether this backend runs on ``target``; None declines it."""
        if self.decline_reason(target) is not None:
            return None
        return Capabilities(dtypes=("f32", "f16", "bf16"), notes="torch.nn.functional.linear")

    def decline_reason(self, target: Target) -> str | None:
        """Why ``probe`` declines ``target``, or None where it accepts it. Optional, but
        `linnet backends` and `plan.explain()` show this sentence: say what is missing and
        how to get it (no CUDA device, your library not installed and its install command,
        a compute capability too low). Ask whether a library is installed with
        ``importlib.util.find_spec``, without importing it."""
        if target.kind not in ("cpu", "cuda"):
            return (
                f"torch.nn.functional.linear runs on CPU and CUDA devices; this target is "
                f"{target.kind}"
            )
        return None

    def match(self, graph: Any, target: Target) -> list[Region]:
        """The regions this backend can run: one per linear call."""
        return [
            Region.of(graph, call.start, call.stop, call.index)
            for call in graph.semantic_calls(LINEAR)
            if call.stop > call.start
        ]

    def compile(self, region: Region, target: Target, options: Options) -> LinearCall:
        """An executable for one region. The weight is a parameter, read by path when it runs."""
        return LinearCall(region.parameters[0])

    def estimate_cost(self, region: Region, target: Target) -> Cost | None:
        """None: a measured plan times the region instead."""
        return None


class LinearCall:
    """One linear call: ``execute`` returns the region's outputs, in order."""

    def __init__(self, weight: str) -> None:
        self.weight = weight
        self.meta = ExecutableMeta()  # holds no memory beyond the model's weights

    def prepare(self, context: Any) -> None:
        """Host-side work before a step or a CUDA graph replay: none here."""

    def execute(self, inputs: list[Any], outputs: list[Any], context: Any) -> list[Any]:
        # Imported here, not at the top, so that finding backends (`linnet backends`) does not
        # import torch.
        from torch.nn import functional

        return [functional.linear(inputs[0], context.parameters[self.weight])]
