"""What this backend takes from a graph: bias-free linear calls, and siblings among them.

Pure graph analysis (no torch, no nvmath). A linear call is ``std.nn.linear::linear``, whose
steps are one ``contract`` (``ac,bc->ab``, f32 accumulation) and, for 16-bit types, a
``convert`` back to the type. Siblings are linear calls whose first argument is the same
value (q, k and v read the normed hidden state; gate and up read theirs): they are found
through the graph's calls, never by parameter names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from linnet.backends import Region, RegionError

LINEAR = "std.nn.linear::linear"
"""The callee this backend takes: y[n, o] = sum_i x[n, i] * w[o, i], w stored [out, in]."""

DTYPES = {"f32": 4, "bf16": 2, "f16": 2}
"""The element types this backend runs, with their sizes in bytes."""


@dataclass(frozen=True)
class LinearCall:
    """One bias-free linear call: ``result = linear(x, @weight)``, shapes [M, K] x [N, K]."""

    index: int
    path: str
    start: int
    stop: int
    x: str
    weight: str
    result: str
    m: int
    k: int
    n: int
    dtype: str

    @property
    def steps(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True)
class GemmSpec:
    """What one executable computes: ``x @ [w_0; w_1; ...].T``, one product over the
    weights laid out one after another, split into the callers' results.

    ``outputs[i]`` is the position (in ``weights``) of the call whose result is the region's
    i-th output; ``fresh`` is true when a result is also an output of the entry, so that
    the executable makes a new tensor for it each run instead of reusing its buffer.
    """

    x: str
    m: int
    k: int
    dtype: str
    weights: tuple[str, ...]
    sizes: tuple[int, ...]
    results: tuple[str, ...]
    outputs: tuple[int, ...]
    fresh: bool

    @property
    def n(self) -> int:
        return sum(self.sizes)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def offsets(self) -> tuple[int, ...]:
        out, at = [], 0
        for size in self.sizes:
            out.append(at)
            at += size
        return tuple(out)

    @property
    def weight_bytes(self) -> int:
        return self.n * self.k * self.itemsize

    @property
    def activation_bytes(self) -> int:
        return (self.m * self.k + self.m * self.n) * self.itemsize

    def describe(self) -> str:
        parts = "+".join(str(s) for s in self.sizes)
        n = f"{self.n} ({parts})" if len(self.sizes) > 1 else str(self.n)
        return f"M={self.m} N={n} K={self.k} {self.dtype}"


def linear_calls(graph: Any) -> list[LinearCall]:
    """The graph's bias-free linear calls that this backend can run, in step order.

    Skipped: calls whose span is empty (lowering shared them with an earlier call), whose
    weight is not a parameter, whose types are not f32, bf16 or f16 throughout, or whose
    steps are not the product (and conversion) that ``std.nn.linear::linear`` lowers to.
    """
    out = []
    for call in graph.semantic_calls(LINEAR):
        found = _linear_call(graph, call)
        if found is not None:
            out.append(found)
    out.sort(key=lambda c: c.start)
    return out


def _linear_call(graph: Any, call: Any) -> LinearCall | None:
    if call.stop <= call.start:
        return None
    args = list(call.attributes.get("args") or [])
    results = list(call.attributes.get("results") or [])
    if len(args) != 2 or len(results) != 1:
        return None
    x, w = args
    (result,) = results
    if not isinstance(x, str) or not isinstance(w, str) or not w.startswith("@"):
        return None
    path = w[1:]
    if path not in graph.parameters or path in graph.states or x not in graph.values:
        return None
    steps = graph.steps[call.start : call.stop]
    first = steps[0]
    if first.op != "contract" or list(first.operands) != [x, w] or len(first.results) != 1:
        return None
    if first.attributes.get("spec") != "ac,bc->ab":
        return None
    if first.attributes.get("accumulate", "f32") != "f32":
        return None
    xt, wt = graph.values[x], graph.parameters[path]
    dtype = xt.dtype
    if dtype not in DTYPES or wt.dtype != dtype or len(xt.shape) != 2 or len(wt.shape) != 2:
        return None
    m, k = xt.shape
    n, k2 = wt.shape
    if k2 != k or min(m, n, k) < 1:
        return None
    if len(steps) == 1:
        if first.results[0] != result or dtype != "f32":
            return None
    elif len(steps) == 2:
        second = steps[1]
        if (
            second.op != "convert"
            or list(second.operands) != [first.results[0]]
            or list(second.results) != [result]
            or second.attributes.get("dtype") != dtype
        ):
            return None
    else:
        return None
    rt = graph.values.get(result)
    if rt is None or tuple(rt.shape) != (m, n) or rt.dtype != dtype:
        return None
    return LinearCall(call.index, call.path, call.start, call.stop, x, path, result, m, k, n, dtype)


def sibling_groups(calls: Sequence[LinearCall]) -> list[list[LinearCall]]:
    """Linear calls that read the same value (two or more), each group in step order.

    A weight read twice with the same input is kept once (lowering normally shares such
    calls already).
    """
    groups: dict[str, list[LinearCall]] = {}
    for call in calls:
        group = groups.setdefault(call.x, [])
        if all(other.weight != call.weight for other in group):
            group.append(call)
    return [g for g in groups.values() if len(g) > 1]


def find_regions(graph: Any) -> list[Region]:
    """Every region this backend claims: each sibling group as one region
    (``Region.of_steps`` over all its calls' steps), then every single linear call.
    Overlaps are the planner's to settle."""
    calls = linear_calls(graph)
    regions: list[Region] = []
    for group in sibling_groups(calls):
        steps = [i for call in group for i in call.steps]
        try:
            region = Region.of_steps(graph, steps, group[0].index)
        except RegionError:
            continue
        if spec_for(region, calls) is not None:
            regions.append(region)
    for call in calls:
        try:
            region = Region.of(graph, call.start, call.stop, call.index)
        except RegionError:
            continue
        if spec_for(region, calls) is not None:
            regions.append(region)
    regions.sort(key=lambda r: (r.start, -len(r.steps)))
    return regions


def spec_for(region: Region, calls: Sequence[LinearCall] | None = None) -> GemmSpec | None:
    """What ``region`` computes as one product, or None when it is not linear calls of one
    input that this backend can run (exactly their steps; outputs among their results)."""
    graph = region.graph
    if calls is None:
        calls = linear_calls(graph)
    steps = set(region.steps)
    inside = [c for c in calls if c.start in steps]
    if not inside:
        return None
    if {i for c in inside for i in c.steps} != steps:
        return None
    first = inside[0]
    if any(
        c.x != first.x or c.dtype != first.dtype or c.k != first.k or c.m != first.m for c in inside
    ):
        return None
    if len({c.weight for c in inside}) != len(inside) or tuple(region.inputs) != (first.x,):
        return None
    results = [c.result for c in inside]
    try:
        outputs = tuple(results.index(o) for o in region.outputs)
    except ValueError:
        return None  # the region hands on a value this backend does not make
    entry_outputs = set(graph.outputs)
    return GemmSpec(
        first.x,
        first.m,
        first.k,
        first.dtype,
        tuple(c.weight for c in inside),
        tuple(c.n for c in inside),
        tuple(results),
        outputs,
        any(o in entry_outputs for o in region.outputs),
    )
