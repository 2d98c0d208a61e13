"""A backend's executables checked against the generated source: one check, used where a
plan is made (``plan_for``, measured or not) and by ``conform``.

Each executable runs once on the values one run of the generated source recorded at its
region's inputs (``PlanBuilder.record_values``), and the generated source of the region's
steps runs on the same values. The region passes when the executable gives exactly the
region's outputs (count, ``torch.Tensor``, shape, dtype, device) and each output, and each
state the region writes (a kernel that stores k and v into the KV cache), is within
tolerance of the generated source's (:func:`compare`: NaN and infinities where the
reference has them, ``tolerance`` relative to the reference's scale, never below 4 units
of the dtype's rounding, integers exact). Both sides start from the same states, each on
copies of the states the region touches, so neither sees the other's writes and the
context checked from is left as it was.

>>> from linnet.torch.checking import compare
>>> compare(torch.tensor([1.0]), torch.tensor([1.001]), 0.01)[1] is None
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from linnet.backends import Region
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.slices import slice_steps

import torch

from .context import Context
from .interpreter import DTYPES

__all__ = [
    "Finding",
    "References",
    "check_candidate",
    "compare",
    "output_problem",
    "run_once",
    "same_device",
    "tolerance_for",
    "written_states",
]


@dataclass
class Finding:
    """One region run both ways. ``difference`` is the largest absolute difference between
    the backend's outputs and the generated source's, over every output and every state the
    region writes (None where nothing was compared: the backend failed before giving outputs
    that could be compared). ``passed`` is whether every one is within the bound (see
    :func:`~linnet.torch.planned.conform`); ``note`` says what failed, naming the output or
    the state.

    >>> f = Finding(region, 0.003, True)                              # doctest: +SKIP
    """

    region: Region
    difference: float | None
    passed: bool
    note: str = ""

    def __repr__(self) -> str:
        diff = "not compared" if self.difference is None else f"{self.difference:.3g}"
        note = f", note={self.note!r}" if self.note else ""
        return f"Finding({self.region!r}, difference={diff}, passed={self.passed}{note})"


def tolerance_for(dtype: torch.dtype, tolerance: float) -> float:
    """The relative tolerance that ``conform`` applies to an output of ``dtype``:
    ``tolerance``, but never below 4 units of the dtype's rounding (bf16: 0.031), which no
    reordered accumulation can promise to beat; 0 for integer and bool outputs (an index
    or a flag is right or wrong).

    >>> tolerance_for(torch.float32, 0.01), tolerance_for(torch.bfloat16, 0.01)
    (0.01, 0.03125)
    """
    if not dtype.is_floating_point:
        return 0.0
    return max(tolerance, 4 * torch.finfo(dtype).eps)


def compare(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> tuple[float, str | None]:
    """(the largest absolute difference, why ``got`` fails against ``want`` or None).

    Passed when ``max|got - want| <= tol * max(1, max|want|)`` over the finite values of
    ``want``, with ``tol = tolerance_for(want.dtype, tolerance)``, and ``got`` has NaN and
    infinities exactly where ``want`` has them (the same infinities); and, so that an output
    of small values (all below 1: the absolute bound admits zeros there) is compared too,
    ``|got - want|`` is within ``10 tol`` of ``|want|`` in the 2-norm (zeros are 1 away, a
    result 1.5 times too large 0.5: 10 tol is 0.1 in f32, 0.31 in bf16, far above any
    rounding of a reordered sum).

    >>> compare(torch.tensor([100.0]), torch.tensor([100.5]), 0.01)
    (0.5, None)
    >>> compare(torch.zeros(3), torch.tensor([0.004, -0.002, 0.003]), 0.01)[1]
    'differs by 1 of its size in the 2-norm (0.004 at most); the bound is 0.1'
    >>> compare(torch.tensor([float("nan")]), torch.tensor([1.0]), 0.01)[1]
    'has 1 NaN where the generated source has none'
    """
    if want.numel() == 0:
        return 0.0, None
    if not want.dtype.is_floating_point:
        diff = (
            (got.long() - want.long()).abs().max().item()
            if got.dtype != torch.bool
            else float((got != want).any().item())
        )
        return float(diff), (None if diff == 0 else f"differs by {diff} (exact values expected)")
    a, b = got.double(), want.double()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        extra = int((nan_a & ~nan_b).sum().item())
        if extra:
            return math.nan, (f"has {extra} NaN where the generated source has none")
        return math.nan, (
            f"has no NaN where the generated source has {int((nan_b & ~nan_a).sum().item())}"
        )
    inf_a, inf_b = torch.isinf(a), torch.isinf(b)
    if not torch.equal(inf_a, inf_b) or not torch.equal(a[inf_b], b[inf_b]):
        return (
            math.inf,
            "has infinities where the generated source has finite values, or the other way round",
        )
    finite = ~(nan_b | inf_b)
    if not bool(finite.any()):
        return 0.0, None
    diff = (a[finite] - b[finite]).abs().max().item()
    scale = max(1.0, b[finite].abs().max().item())
    tol = tolerance_for(want.dtype, tolerance)
    if diff > tol * scale:
        return diff, (
            f"differs by {diff:.3g}; the bound is {tol:.3g} x max(1, max|ref| = "
            f"{scale:.3g}) = {tol * scale:.3g}"
        )
    size = b[finite].norm().item()
    off = (a[finite] - b[finite]).norm().item()
    if size > 0 and off > 10 * tol * size:
        return diff, (
            f"differs by {off / size:.3g} of its size in the 2-norm ({diff:.3g} at "
            f"most); the bound is {10 * tol:.3g}"
        )
    return diff, None


def written_states(region: Region) -> list[str]:
    """The states ``region``'s steps write (`scatter`), in the order of their first write."""
    out: list[str] = []
    for i in region.steps:
        step = region.graph.steps[i]
        if step.op == "scatter" and step.operands[0][1:] not in out:
            out.append(step.operands[0][1:])
    return out


def output_problem(
    got: Any, names: Sequence[str], graph: Graph, device: torch.device
) -> str | None:
    """Why ``got`` (what an executable's ``execute`` returned) is not the outputs ``names``
    of ``graph`` on ``device``, or None: a list (or tuple) of one torch.Tensor per output,
    each of the declared shape and dtype, on the plan's device."""
    count = f"{len(names)} output{'s' if len(names) != 1 else ''} ({', '.join(names)})"
    if not isinstance(got, list | tuple):
        return f"execute returned a {type(got).__name__}, not a list of the region's {count}"
    if len(got) != len(names):
        return f"execute returned {len(got)} values; the region has {count}"
    for k, (name, value) in enumerate(zip(names, got)):
        vt = graph.values[name]
        what = f"output {k} ({name})"
        if not isinstance(value, torch.Tensor):
            return f"{what} is a {type(value).__name__}, not a torch.Tensor"
        if tuple(value.shape) != tuple(vt.shape):
            return f"{what} has shape {list(value.shape)}; the region declares {list(vt.shape)}"
        want = DTYPES.get(vt.dtype)
        if value.dtype != want:
            return f"{what} is {value.dtype}; the region declares {vt.dtype} ({want})"
        if not same_device(value.device, device):
            return f"{what} is on {value.device}; the plan runs on {device}"
    return None


def same_device(a: torch.device, b: torch.device) -> bool:
    """``a`` and ``b`` are one device ("cuda" standing for the current CUDA device)."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device()
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)


def run_once(
    executable: Any, region: Region, env: dict[str, Any], context: Context
) -> tuple[str | None, Any]:
    """(None, what ``execute`` returned) after one ``prepare`` and one ``execute`` on the
    values ``env`` recorded, or (why it raised, None)."""
    try:
        executable.prepare(context)
    except Exception as exc:
        return f"prepare raised {type(exc).__name__}: {exc}", None
    try:
        return None, executable.execute(
            [env[v] for v in region.inputs],
            [region.graph.values[o] for o in region.outputs],
            context,
        )
    except Exception as exc:
        return f"execute raised {type(exc).__name__}: {exc}", None


class References:
    """The generated source of regions' steps, the reference each executable is checked
    against: the op bodies without kernels (as a plan's slices run them), uncompiled, one
    function per kind of steps (every layer's q/k/v share one), emitted together for the
    regions :meth:`emit` is given. ``builder`` is the plan's ``PlanBuilder`` (its ``graph``
    and ``emit``).

    >>> refs = References(builder); refs.emit([c.region for c in candidates])  # doctest: +SKIP
    """

    def __init__(self, builder: Any):
        self.builder = builder
        self.functions: dict[str, Any] = {}

    def emit(self, regions: Sequence[Region]) -> None:
        """One module with a function for each kind of ``regions``' steps not emitted yet."""
        wanted: dict[str, Any] = {}
        for r in regions:
            sl = slice_steps(self.builder.graph, list(r.steps), "reference")
            if sl.kind not in self.functions and sl.kind not in wanted:
                wanted[sl.kind] = sl
        if not wanted:
            return
        slices = list(wanted.values())
        module = self.builder.emit(slices, "reference")
        rows = module.ENTRIES[self.builder.graph.entry]["slices"]
        for sl, row in zip(slices, rows):
            self.functions[sl.kind] = getattr(module, row["function"])

    def outputs(self, region: Region, env: dict[str, Any], context: Context) -> dict[str, Any]:
        """The generated source's values of ``region``'s steps' outputs, by name, run on the
        recorded ``env`` and ``context``'s parameters and states (which it writes)."""
        sl = slice_steps(self.builder.graph, list(region.steps), "reference")
        if sl.kind not in self.functions:
            self.emit([region])
        fn = self.functions[sl.kind]
        params, states = context._params, context.states
        got = fn(
            *[env[v] for v in sl.inputs],
            *[params[p] for p in sl.parameters],
            *[states[p] for p in sl.states],
        )
        return dict(zip(sl.outputs, got))


def copy_for(base: Context, region: Region) -> Context:
    """A context like ``base`` (its parameters, step inputs and host inputs) with copies of
    the states ``region`` touches; the other states are ``base``'s own. One region's check
    writes only its copies: each side of the check starts from ``base``'s states, and a
    state the region writes is compared as each side left it."""
    states = region.states if isinstance(region.states, tuple | list) else ()
    ctx = base.scratch(only=[*states, *written_states(region)])
    ctx.inputs, ctx.host_inputs = base.inputs, base.host_inputs
    return ctx


def check_candidate(
    executable: Any,
    region: Region,
    env: dict[str, Any],
    base: Context,
    references: References,
    tolerance: float,
    device: torch.device,
) -> Finding:
    """Run ``executable`` once on the recorded values and the generated source of
    ``region``'s steps once on the same, each on its own copies of ``base``'s states (see
    :func:`copy_for`); the finding compares every output and every state the region writes
    (see the module). The reference runs first: an executable that writes its inputs in
    place cannot change what it is compared with. Call it under the model's numerics mode
    and ``torch.inference_mode()``, as a plan runs.

    >>> finding = check_candidate(c.executable, c.region, env, base, refs, 0.01, device)  # doctest: +SKIP
    """
    reference_ctx = copy_for(base, region)
    want = references.outputs(region, env, reference_ctx)
    mine = copy_for(base, region)
    problem, got = run_once(executable, region, env, mine)
    if problem is None:
        problem = output_problem(got, region.outputs, region.graph, device)
    if problem is not None:
        return Finding(region, None, False, problem)
    worst, notes = 0.0, []
    # The outputs, then each state the region writes (a KV cache), as the two runs left it.
    pairs = [
        (f"output {k} ({name})", value, want.get(name))
        for k, (name, value) in enumerate(zip(region.outputs, got))
    ]
    pairs += [
        (f"state {name}", mine.states[name], reference_ctx.states[name])
        for name in written_states(region)
    ]
    for what, value, reference in pairs:
        if reference is None:  # region_problem keeps this from happening
            notes.append(f"{what} is not one the generated steps make")
            continue
        diff, why = compare(value, reference, tolerance)
        worst = math.nan if math.isnan(diff) or math.isnan(worst) else max(worst, diff)
        if why is not None:
            notes.append(f"{what} {why}")
    return Finding(region, worst, not notes, "; ".join(notes))
