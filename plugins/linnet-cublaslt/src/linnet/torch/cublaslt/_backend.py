"""The backend: probe, match, compile, estimate_cost (contract 1)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from typing import Any

import torch
from linnet.backends import Capabilities, Cost, Options, Region, Target

from ._common import INSTALL
from ._executable import LinearGemm
from ._graph import GemmSpec, LinearCall, find_regions, linear_calls, spec_for

__version__ = "0.1.0"

WORKSPACE_BYTES = 32 * 2**20
"""The cuBLASLt workspace each device's executables share (they run one after another)."""

BANDWIDTHS: tuple[tuple[str, float], ...] = (
    ("GH200", 3.6e12),
    ("H200", 4.18e12),  # measured copy bandwidth on the lent H200 (shared/design/GPU.md)
    ("H100 PCIe", 1.7e12),
    ("H100", 2.9e12),
    ("H800", 2.9e12),
    ("B200", 6.5e12),
    ("A100", 1.7e12),
    ("A800", 1.7e12),
    ("L40", 0.75e12),
    ("A10", 0.5e12),
    ("L4", 0.25e12),
)
"""Device memory bandwidth (bytes/s) by device name, about 85% of the data sheet's; the
first entry whose key is in the target's name counts."""

DEFAULT_BANDWIDTH = 1.0e12
LAUNCH_SECONDS = 5e-6
"""A GEMM's fixed cost beyond streaming its bytes, inside a CUDA graph (single GEMMs on the
H200 measure about 5 us over their bandwidth floor)."""


def bandwidth_of(target: Target) -> float:
    """The memory bandwidth that :meth:`CublasLt.estimate_cost` assumes for ``target``."""
    name = target.name or ""
    for key, value in BANDWIDTHS:
        if key in name:
            return value
    return DEFAULT_BANDWIDTH


class CublasLt:
    """Linear calls without a bias by cuBLASLt, and sibling linear calls (the ones that read
    the same input: q, k and v; gate and up) as one product over weights that
    ``context.join`` lays out one after another.

    One cuBLASLt GEMM is no faster than PyTorch's ``F.linear``; what it saves is the
    launches of siblings done one by one. A measured plan therefore usually gives this
    backend the sibling groups and declines the single linears (they do not save 2%).

    ``autotune``: iterations of ``nvmath`` autotuning per problem (0: cuBLASLt's heuristic
    choice). ``bandwidth``: bytes/s for :meth:`estimate_cost` (default: by device name).
    ``workspace``: bytes of the workspace each device's executables share.

    >>> from linnet.backends import Target
    >>> backend = CublasLt()
    >>> backend.probe(Target("cpu")) is None
    True
    >>> backend.last_reason.split("; nvmath-python")[0]
    'cuBLASLt runs on CUDA devices only; this target is cpu'
    """

    name = "cublaslt"
    version = __version__  # timings are cached per version: bump it when the kernels change
    contract = 1
    """The backend contract this was written for: a literal, not the host's ``CONTRACT``, so
    that a host implementing another version skips this backend (``linnet.backends.skipped()``
    says why) instead of running it."""

    def __init__(
        self, autotune: int = 5, bandwidth: float | None = None, workspace: int = WORKSPACE_BYTES
    ):
        self.autotune = autotune
        self.bandwidth = bandwidth
        self.workspace_bytes = workspace
        self.last_reason: str | None = None
        """Why the last :meth:`probe` declined its target (None when it accepted)."""
        self._plans: dict[tuple, Any] = {}
        self._handles: dict[int, Any] = {}
        self._workspaces: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------ probe
    def probe(self, target: Target) -> Capabilities | None:
        """Capabilities on a CUDA target with nvmath-python and cuBLASLt; None elsewhere,
        with the reason in :attr:`last_reason` (and from :meth:`decline_reason`)."""
        reason = self.decline_reason(target)
        self.last_reason = reason
        if reason is not None:
            return None
        from . import _nvmath

        return Capabilities(
            dtypes=self._dtypes(target),
            notes=f"bias-free linear calls and sibling groups by cuBLASLt ({_nvmath.status()[1]})",
        )

    def decline_reason(self, target: Target) -> str | None:
        """Why this backend cannot run on ``target``, or None when it can: every reason that
        applies (not a CUDA device, a compute capability below 7.0, nvmath-python not
        installed), so that one look says all that is missing. Never imports nvmath for a
        target it declines for another reason (it only asks whether nvmath is installed)."""
        reason = None
        if target.kind != "cuda":
            reason = f"cuBLASLt runs on CUDA devices only; this target is {target.kind}"
        elif target.framework != "torch":
            reason = f"this backend runs under PyTorch, not {target.framework}"
        elif target.capability is not None and tuple(target.capability) < (7, 0):
            major, minor = target.capability
            reason = (
                f"needs compute capability 7.0 or later; {target.name or 'this GPU'} "
                f"has {major}.{minor}"
            )
        if reason is not None:
            if not _nvmath_installed():
                reason += f"; nvmath-python is not installed either: {INSTALL}"
            return reason
        from . import _nvmath

        ok, note = _nvmath.status()
        return None if ok else note

    @staticmethod
    def _dtypes(target: Target) -> tuple[str, ...]:
        if target.capability is not None and tuple(target.capability) < (8, 0):
            return ("f32", "f16")
        return ("f32", "f16", "bf16")

    # ------------------------------------------------------------ match
    def match(self, graph: Any, target: Target) -> list[Region]:
        """Every sibling group (calls whose first argument is the same value) as one region
        over all its calls' steps, and every single bias-free linear call. The planner keeps
        at most one of two overlapping regions."""
        dtypes = self._dtypes(target)
        return [r for r in find_regions(graph) if r.graph.values[r.inputs[0]].dtype in dtypes]

    # ------------------------------------------------------------ compile
    def compile(self, region: Region, target: Target, options: Options) -> LinearGemm:
        """An executable for ``region`` (see :meth:`compile_regions`)."""
        return self.compile_regions([region], target, options)[0]

    def compile_regions(
        self, regions: Sequence[Region], target: Target, options: Options
    ) -> list[LinearGemm]:
        """Executables for ``regions``, together: the graph is read once, the workspace the
        device's executables share is split among them in ``holds``, and a group whose
        weights another group also joins (so that ``context.join`` will decline one of them)
        counts the copy it will make.

        Nothing runs on the device here: the first ``prepare`` plans and autotunes each
        problem (cuBLASLt needs the weights' addresses for that)."""
        device = _device(target)
        kernel = "cublaslt" if device.type == "cuda" else "torch"
        calls: dict[int, list[LinearCall]] = {}
        specs: list[GemmSpec] = []
        for region in regions:
            graph_calls = calls.setdefault(id(region.graph), linear_calls(region.graph))
            spec = spec_for(region, graph_calls)
            if spec is None:
                raise ValueError(
                    f"{region!r} is not a bias-free linear call, nor sibling linear "
                    "calls of one input, that this backend runs"
                )
            specs.append(spec)
        joined_by: dict[str, set[tuple[str, ...]]] = {}
        for spec in specs:
            if len(spec.weights) > 1:
                for path in spec.weights:
                    joined_by.setdefault(path, set()).add(spec.weights)
        share = (
            math.ceil(self.workspace_bytes / len(regions))
            if kernel == "cublaslt" and regions
            else 0
        )
        out = []
        for region, spec in zip(regions, specs):
            copy = (
                spec.weight_bytes
                if len(spec.weights) > 1 and any(len(joined_by[p]) > 1 for p in spec.weights)
                else 0
            )
            buffers = (spec.m * spec.n + spec.m * spec.k) * spec.itemsize
            label = f"cublaslt {region!r}: {spec.describe()}"
            out.append(LinearGemm(self, spec, device, kernel, buffers + copy + share, copy, label))
        return out

    # ------------------------------------------------------------ cost
    def estimate_cost(self, region: Region, target: Target) -> Cost | None:
        """Bytes moved (the weights, the input and the outputs) over the device's memory
        bandwidth, plus a launch: the floor a GEMM at small M cannot beat. None off CUDA."""
        if target.kind != "cuda":
            return None
        spec = spec_for(region)
        if spec is None:
            return None
        moved = spec.weight_bytes + spec.activation_bytes
        bandwidth = self.bandwidth or bandwidth_of(target)
        return Cost(moved / bandwidth + LAUNCH_SECONDS, moved)

    # ------------------------------------------------------------ plans (host work)
    def plans(self) -> list[Any]:
        """The cuBLASLt plans made so far, one per problem (M, N, K, dtype, alignment)."""
        return list(self._plans.values())

    def _gemm_plan(self, spec: GemmSpec, device: torch.device, weight: torch.Tensor) -> Any:
        from . import _nvmath

        key = (
            device.index,
            spec.dtype,
            spec.m,
            spec.n,
            spec.k,
            _nvmath.alignment(weight.data_ptr()),
            self.autotune,
        )
        plan = self._plans.get(key)
        if plan is None:
            ok, note = _nvmath.status()
            if not ok:
                raise RuntimeError(note)
            index = _index(device)
            if index not in self._handles:
                self._handles[index] = _nvmath.Handle(device)
            if index not in self._workspaces:
                self._workspaces[index] = torch.empty(
                    self.workspace_bytes, dtype=torch.uint8, device=device
                )
            plan = _nvmath.GemmPlan(
                self._handles[index],
                device,
                spec.dtype,
                spec.m,
                spec.n,
                spec.k,
                weight,
                self._workspaces[index],
                self.autotune,
            )
            self._plans[key] = plan
        return plan

    def close(self) -> None:
        """Destroy the cuBLASLt plans and handles now, and drop the workspaces. Executables
        this backend compiled must not run afterwards (without it, plans are destroyed when
        the last executable using them is garbage-collected)."""
        for plan in self._plans.values():
            plan.close()
        for handle in self._handles.values():
            handle.close()
        self._plans.clear()
        self._handles.clear()
        self._workspaces.clear()

    def __repr__(self) -> str:
        return f"CublasLt(version={self.version}, autotune={self.autotune})"


def _nvmath_installed() -> bool:
    """Whether nvmath-python is installed, asked of the import system without importing it
    (a broken install is found, and said, when a CUDA target is probed)."""
    try:
        return importlib.util.find_spec("nvmath") is not None
    except (ImportError, ValueError):  # a module in sys.modules without a spec
        return False


def _device(target: Target) -> torch.device:
    device = torch.device(target.device or target.kind)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else 0
