"""Linnet's own kernels as the planner's candidates, measured like any backend's.

Under numerics "fast", a bound op's call (``op rms_norm ... kernel rms_norm_rows``) and a
span op's claim over several calls (``linear(rms_norm(x, nw, eps), w)`` claimed by a span
op, see :mod:`linnet.lang.check.spans`) are regions of :class:`KernelPaths`, the built-in
backend ``linnet-kernels``. Its executable for a region is the generated PyTorch of those
steps with the kernel launched; the generated source it is timed against (and that the plan
runs wherever it is not faster by the margin) is the same steps without kernels. So a kernel
runs in a plan only where it measured faster, exactly as a plugin's region does, and
``plan.explain()`` lists each kernel region beside the others.

>>> from linnet.backends import Target
>>> KernelPaths().probe(Target("cpu")) is None   # kernels launch on CUDA (or interpreted)
True
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from linnet.backends import (
    Capabilities,
    ExecutableMeta,
    Options,
    Region,
    RegionError,
    Target,
    region_kind,
)
from linnet.lang import LinnetError
from linnet.lang import __version__ as lang_version
from linnet.lang.check.kernel_cases import binding_name
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.spans import spans_for, std_spans
from linnet.lang.emit.python_rules import launch_args
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.graph import Call, Graph
from linnet.lang.ir.stepsets import indexed
from linnet.lang.passes.slices import slice_steps
from linnet.lang.passes.spans import closed

from .home import import_source

NAME = "linnet-kernels"


def triton_available() -> bool:
    """Whether Triton is installed, without importing it: Triton decorates its own library
    in the mode TRITON_INTERPRET says when first imported, so a probe must not be the first
    import (a later interpreter run in the same process would then fail)."""
    return importlib.util.find_spec("triton") is not None


def kernel_calls(graph: Graph) -> list[Call]:
    """The calls of ``graph`` whose kernel applies and whose values stay inside them except
    their results (the emitter launches only those): bound ops' own calls and span calls."""
    out = []
    for c in graph.calls:
        a = c.attributes
        if (
            c.kind != "op"
            or not a.get("kernel")
            or not a.get("kernel_applies")
            or c.stop <= c.start
        ):
            continue
        results = a.get("results") or []
        if any(not isinstance(r, str) for r in results):
            continue
        if closed(graph, c.start, c.stop, results):
            out.append(c)
    return out


def with_arguments(region: Region, call: Call) -> Region:
    """``region`` taking each tensor argument of ``call`` as an input: the kernel reads the
    call's arguments, where the steps may read only values made from them before the region
    (decode attention's steps read masks of `pos` that lowering hoisted out of the layers, not
    `pos`), and the emitter launches a kernel only where its arguments are in scope."""
    import dataclasses

    missing = tuple(a for a in launch_args(call) if a.startswith("%") and a not in region.inputs)
    if not missing:
        return region
    wider = dataclasses.replace(region, inputs=tuple(region.inputs) + missing)
    return dataclasses.replace(wider, kind=region_kind(wider))


def own_calls(graph: Graph, regions: Sequence[Region]) -> Graph:
    """A view of ``graph`` whose bound calls over exactly a region's steps are the region's
    own call alone: other span ops' claims of the same steps are left out, so the emitter
    launches the kernel of the region's op (the graph itself is not changed)."""
    import copy

    spans = {(min(r.steps), max(r.steps) + 1): r.index for r in regions}
    view = copy.copy(graph)
    view.calls = [
        c
        for c in graph.calls
        if not (
            c.attributes.get("kernel")
            and (c.start, c.stop) in spans
            and spans[(c.start, c.stop)] != c.index
        )
    ]
    return view


class KernelExecutable:
    """A region's steps as generated PyTorch that launches the region's kernel."""

    def __init__(
        self,
        fn: Any,
        region: Region,
        inputs: list[str],
        outputs: list[str],
        parameters: list[str],
        states: list[str],
        kernel: str,
    ):
        self.fn = fn
        self.region = region
        self.kernel = kernel
        self._inputs = [list(region.inputs).index(v) for v in inputs]
        self._outputs = [outputs.index(v) for v in region.outputs]
        self._parameters = parameters
        self._states = states
        self.meta = ExecutableMeta(tuple(region.inputs), tuple(region.outputs), 0)

    def prepare(self, context: Any) -> None:
        """Nothing to lay out: the kernel reads the model's own weights."""

    def execute(self, inputs: list[Any], outputs: list[Any], context: Any) -> list[Any]:
        """Run the region's steps, launching its kernel; the outputs in the region's order."""
        args = [inputs[i] for i in self._inputs]
        params = context.parameters
        states = context.states
        res = self.fn(
            *args, *[params[p] for p in self._parameters], *[states[s] for s in self._states]
        )
        res = list(res) if isinstance(res, tuple | list) else [res]
        return [res[i] for i in self._outputs]


class Unbuilt:
    """A region whose kernel could not be written: the planner's check runs it once and the
    candidate fails with the kernel's coded error as its reason."""

    def __init__(self, error: LinnetError):
        self.error = error
        self.meta = ExecutableMeta((), (), 0)

    def prepare(self, context: Any) -> None:
        """Nothing to prepare."""

    def execute(self, inputs: list[Any], outputs: list[Any], context: Any) -> list[Any]:
        """Raise the error that stopped the kernel being written."""
        raise self.error


class KernelPaths:
    """The built-in backend ``linnet-kernels``: regions where a Linnet kernel would run
    (bound ops' calls and span ops' claims) under numerics "fast", each compiled to the
    generated PyTorch that launches it. The planner adds it on its own (``plan_for(...,
    kernels=True)``, the default); it is not an entry-point plugin.

    ``program`` is the model's :class:`~linnet.lang.Program` (span ops and kernels it defines
    are found there as well as in the std library); ``sources`` the source texts for the
    generated files' line comments.

    >>> paths = KernelPaths()
    >>> paths.name
    'linnet-kernels'
    """

    name = NAME
    version = lang_version
    contract = 1

    def __init__(
        self, program: Any = None, sources: dict[str, str] | None = None, label: str = "kernels"
    ):
        spans = std_spans() if program is None else spans_for(program)
        self.program = spans.program_for(program) if program is not None else None
        self.sources = dict(sources or {})
        # Timings are cached per version: the kernels' own text is part of it, so that an
        # edited kernel (a user's, or std's between releases) is timed again.
        texts = sorted(
            m.source.text
            for m in (self.program.modules.values() if self.program is not None else [])
        )
        digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]
        self.version = f"{lang_version}+{digest}"
        self.label = label
        self.last_reason: str | None = None

    def probe(self, target: Target) -> Capabilities | None:
        """Capabilities where Triton launches kernels: CUDA with Triton importable, or the CPU
        under ``TRITON_INTERPRET=1`` (tests); None elsewhere (reason in ``last_reason``)."""
        reason = None
        if target.framework != "torch":
            reason = f"kernels launch from generated PyTorch, not {target.framework}"
        elif not triton_available():
            reason = "Triton is not importable"
        elif target.kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            reason = (
                f"kernels launch on CUDA devices (or on the CPU under "
                f"TRITON_INTERPRET=1); this target is {target.kind}"
            )
        self.last_reason = reason
        if reason is not None:
            return None
        return Capabilities(("f32", "f16", "bf16"), "Linnet tile kernels through Triton")

    def match(self, graph: Graph, target: Target) -> list[Region]:
        """One region per call whose kernel applies (see :func:`kernel_calls`): a span op's
        claim and the bound calls inside it are both regions; the planner keeps at most one
        of two overlapping regions, the one that saves more."""
        out = []
        for c in kernel_calls(graph):
            try:
                out.append(with_arguments(Region.of(graph, c.start, c.stop, c.index), c))
            except RegionError:
                continue
        return out

    def compile(self, region: Region, target: Target, options: Options) -> KernelExecutable:
        """The executable for one region (see :meth:`compile_regions`)."""
        return self.compile_regions([region], target, options)[0]

    def compile_regions(
        self, regions: Sequence[Region], target: Target, options: Options
    ) -> list[Any]:
        """One generated module for every region (one function per kind of region). The
        functions are not torch.compiled, whatever the plan's ``compile``: a region is the
        kernel's launch and the views around it, nothing inductor would fuse, and compiling
        each kind would add its compile time to planning; timings and ``Captured`` run them in
        CUDA graphs, where the host's launch cost is not paid."""
        if not regions:
            return []
        try:
            return self._compile(regions, target)
        except LinnetError as exc:
            if len(regions) == 1:
                return [Unbuilt(exc)]
        # One kernel that does not lower (a user's kernel with an op Triton has no rule for,
        # say) fails its own regions, not every kernel region of the plan.
        out: list[Any] = []
        for r in regions:
            out += self.compile_regions([r], target, options)
        return out

    def _compile(self, regions: Sequence[Region], target: Target) -> list[Any]:
        """One module per op whose kernel the regions launch: several span ops may claim
        the same steps (`linear_gemv`, `linear_split`, ...), and the emitter launches the
        longest bound call at a step, the first of equals; each module's graph keeps, of the
        bound calls over a region's steps, only the region's own (:func:`own_calls`)."""
        graph = regions[0].graph
        by_op: dict[str, list[int]] = {}
        calls: dict[int | None, Call] = {c.index: c for c in graph.calls}
        for i, r in enumerate(regions):
            call = calls.get(r.index)
            by_op.setdefault(call.callee if call is not None else "", []).append(i)
        out: list[Any] = [None] * len(regions)
        for members in by_op.values():
            chosen = [regions[i] for i in members]
            view = own_calls(graph, chosen)
            with indexed(view):  # a copy of the graph: every layer's regions read it
                slices = [
                    slice_steps(view, list(r.steps), f"kernel_{i}") for i, r in enumerate(chosen)
                ]
            for r, sl in zip(chosen, slices):  # the call's arguments too (with_arguments)
                sl.inputs += [v for v in r.inputs if v not in sl.inputs]
            device = target.device or ("cuda" if target.kind == "cuda" else "cpu")
            view = with_kernels(view, self.program, backwards=False)
            text = emit_torch(
                view,
                self.sources,
                numerics="fast",
                origin=graph.model,
                slices=[slices],
                device=str(device),
            )
            module = import_source(text, f"linnet_plan_{self.label}")
            meta = module.ENTRIES[graph.entry]["slices"]
            for i, r, sl, m in zip(members, chosen, slices, meta):
                fn = getattr(module, m["function"])
                call = calls.get(r.index)
                kernel = binding_name(call.attributes) if call is not None else ""
                out[i] = KernelExecutable(
                    fn,
                    r,
                    list(sl.inputs),
                    list(sl.outputs),
                    list(sl.parameters),
                    list(sl.states),
                    kernel,
                )
        return out

    def estimate_cost(self, region: Region, target: Target) -> None:
        """No estimate: kernel regions are measured (with ``measure=False`` the largest
        regions go first)."""
        return None


__all__ = ["NAME", "KernelExecutable", "KernelPaths", "Unbuilt", "kernel_calls"]
