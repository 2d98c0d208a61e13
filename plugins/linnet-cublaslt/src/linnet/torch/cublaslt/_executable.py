"""The executable: one linear call, or sibling calls as one product, on cuBLASLt.

``prepare(context)`` does the host work, once per context: it finds the weights (a sibling
group asks ``context.join`` for them laid out one after another, and copies them together
once if the context cannot), gets the problem's :class:`~._nvmath.GemmPlan` (planned and
autotuned the first time the backend sees the problem) and, the first time, allocates the
output buffer and a staging buffer for the input. ``execute`` then launches one GEMM into the
output buffer and returns the callers' results as views of it, in the region's order: no
allocation, no synchronisation, so that a captured CUDA graph records it.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from linnet.backends import ExecutableMeta

from ._common import A_ALIGNMENT, TORCH_TYPES
from ._graph import GemmSpec

log = logging.getLogger("linnet.torch.cublaslt")


@dataclass
class _Bound:
    """What one context gives an executable: the weight (kept alive while the context
    lives), its address, and the plan for its alignment."""

    weight: torch.Tensor
    pointer: int
    plan: Any


class LinearGemm:
    """Runs ``spec`` (see :class:`~._graph.GemmSpec`) for one region.

    ``kernel`` is ``"cublaslt"`` on CUDA targets; ``"torch"`` (``torch.matmul`` into the same
    buffers) is the reference used on other targets, which lets the plumbing be tested on
    the CPU. ``copied`` counts the bytes of weights this executable had to copy together
    because ``context.join`` declined.
    """

    def __init__(
        self,
        backend: Any,
        spec: GemmSpec,
        device: torch.device,
        kernel: str,
        holds: int,
        declared_copy: int = 0,
        label: str = "",
    ):
        self.spec = spec
        self.device = device
        self.kernel = kernel
        self.label = label
        self.meta = ExecutableMeta((), (), holds=holds)
        self.copied = 0
        self.declared_copy = declared_copy  # bytes of copied weights ``holds`` counts
        self._backend = backend
        self._bound: weakref.WeakKeyDictionary[Any, _Bound] = weakref.WeakKeyDictionary()
        self._strong: tuple[Any, _Bound] | None = None  # a context that takes no weak reference
        self._out: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._stage: torch.Tensor | None = None

    # ------------------------------------------------------------ contract
    def prepare(self, context: Any) -> None:
        if self._lookup(context) is None:
            self._prepare(context)

    def execute(self, inputs: list[Any], outputs: list[Any], context: Any) -> list[Any]:
        bound = self._lookup(context)
        if bound is None:
            bound = self._prepare(context)
        x = inputs[0]
        if not x.is_contiguous() or x.data_ptr() % A_ALIGNMENT:
            assert self._stage is not None
            self._stage.copy_(x)
            x = self._stage
        if self.spec.fresh:  # a result the entry returns: a new tensor each run
            assert self._out is not None
            out = torch.empty_like(self._out)
            views = self._split(out)
        else:
            out, views = self._out, self._views  # type: ignore[assignment]
        if bound.plan is not None:
            bound.plan.launch(
                x.data_ptr(),
                bound.pointer,
                out.data_ptr(),
                torch.cuda.current_stream(self.device).cuda_stream,
            )
        else:
            torch.matmul(x, bound.weight.t(), out=out)
        return list(views)

    # ------------------------------------------------------------ host work
    def _lookup(self, context: Any) -> _Bound | None:
        try:
            return self._bound.get(context)
        except TypeError:
            held = self._strong
            return held[1] if held is not None and held[0] is context else None

    def _prepare(self, context: Any) -> _Bound:
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{self.label or 'cublaslt'}: prepare(context) must run before a CUDA graph is "
                "captured (it plans, and may join or copy weights); it ran inside a capture"
            )
        weight = self._weight(context)
        plan = (
            self._backend._gemm_plan(self.spec, self.device, weight)
            if self.kernel == "cublaslt"
            else None
        )
        if self._out is None:
            self._allocate()
        bound = _Bound(weight, weight.data_ptr(), plan)
        try:
            self._bound[context] = bound
        except TypeError:
            self._strong = (context, bound)
        return bound

    def _weight(self, context: Any) -> torch.Tensor:
        spec = self.spec
        if len(spec.weights) == 1:
            weight = context.parameters[spec.weights[0]]
        else:
            join = getattr(context, "join", None)
            weight = join(list(spec.weights)) if join is not None else None
            if weight is None:
                weight = torch.cat([context.parameters[p] for p in spec.weights])
                self._copied(weight, "context.join declined to lay them out together")
        if weight.device != self.device:
            raise ValueError(
                f"{self.label}: weights are on {weight.device}, the plan runs on {self.device}"
            )
        if tuple(weight.shape) != (spec.n, spec.k) or weight.dtype != TORCH_TYPES[spec.dtype]:
            raise ValueError(
                f"{self.label}: weights are {list(weight.shape)} {weight.dtype}; "
                f"expected {[spec.n, spec.k]} {spec.dtype}"
            )
        if not weight.is_contiguous():
            weight = weight.contiguous()
            self._copied(weight, "the weight is not contiguous")
        return weight

    def _copied(self, weight: torch.Tensor, why: str) -> None:
        size = weight.numel() * weight.element_size()
        self.copied = max(self.copied, size)
        if size > self.declared_copy:
            log.warning(
                "%s: copied %d bytes of weights (%s), which its declared holds did not count",
                self.label,
                size,
                why,
            )
            self.meta = ExecutableMeta((), (), holds=self.meta.holds + size - self.declared_copy)
            self.declared_copy = size

    def _allocate(self) -> None:
        spec = self.spec
        dtype = TORCH_TYPES[spec.dtype]
        self._out = torch.empty((spec.m, spec.n), dtype=dtype, device=self.device)
        self._views = self._split(self._out)
        self._stage = torch.empty((spec.m, spec.k), dtype=dtype, device=self.device)

    def _split(self, out: torch.Tensor) -> list[torch.Tensor]:
        spec = self.spec
        if len(spec.sizes) == 1:
            return [out for _ in spec.outputs]
        columns = [out[:, at : at + size] for at, size in zip(spec.offsets, spec.sizes)]
        return [columns[i] for i in spec.outputs]

    def __repr__(self) -> str:
        return f"LinearGemm({self.label or self.spec.describe()}, {self.kernel})"
