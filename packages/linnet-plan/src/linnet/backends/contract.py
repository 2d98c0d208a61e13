"""The backend contract, version :data:`CONTRACT`.

A backend is an object with ``name``, ``version``, ``contract`` and four methods
(``probe``, ``match``, ``compile``, ``estimate_cost``; optionally ``compile_regions``).
Executables have ``meta``, ``prepare(context)`` and ``execute(inputs, outputs, context)``.
See docs/backends.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from linnet.lang.ir.graph import Graph, ValueType

CONTRACT = 1
"""The contract version this host implements. A backend declares the one it was written for;
a different one is skipped (see :func:`linnet.backends.skipped`)."""


@dataclass(frozen=True)
class Target:
    """Where a plan runs: ``kind`` is ``"cuda"`` or ``"cpu"``; ``capability`` is the CUDA
    compute capability (``(9, 0)`` on Hopper) or None."""

    kind: str
    device: str = ""
    name: str = ""
    capability: tuple[int, int] | None = None
    framework: str = "torch"
    versions: tuple[tuple[str, str], ...] = ()

    def key(self) -> str:
        """What timings depend on: the device model and the framework's versions."""
        return json.dumps([self.kind, self.name, self.capability, self.framework,
                           list(self.versions)])


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do on a target (returned by ``probe``; None declines)."""

    dtypes: tuple[str, ...] = ()
    notes: str = ""


@dataclass(frozen=True)
class Cost:
    """A backend's own estimate: ``seconds`` per run and ``bytes`` moved."""

    seconds: float
    bytes: int = 0


@dataclass(frozen=True)
class ExecutableMeta:
    """What an executable declares about itself. ``holds``: bytes it keeps beyond the
    model's weights (converted weights, workspaces); the plan's ``memory=`` budget counts it.

    >>> ExecutableMeta((), ()).holds
    0
    """

    inputs: tuple = ()
    outputs: tuple = ()
    holds: int = 0


@dataclass(frozen=True)
class Options:
    """Planning options. ``margin``: the fraction of the generated source's time a backend
    must save to take a region (2% by default)."""

    margin: float = 0.02
    measure: bool = True
    memory: int | None = None
    compile: str | bool | None = None
    warmup: int = 3
    repeat: int = 20
    tolerance: float = 0.01
    extra: dict = field(default_factory=dict)


class RegionError(ValueError):
    """A backend described a region that cannot run where it stands."""


@dataclass(frozen=True, eq=False)
class Region:
    """Steps of a graph that one executable runs. Build with :meth:`of` or :meth:`of_steps`.

    ``inputs`` are the values the region reads that earlier steps made; parameters and
    states are addressed by path (an executable reads ``context.parameters[path]``).
    ``outputs`` are the values it makes that later steps (or the entry) use. Regions of one
    ``kind`` compute the same thing on different parameters and share one timing.
    """

    graph: Graph
    steps: tuple[int, ...]
    index: int | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    parameters: tuple[str, ...]
    states: tuple[str, ...]
    kind: str
    callee: str = ""
    path: str = ""

    @property
    def start(self) -> int:
        """The step where the region runs."""
        return self.steps[0]

    @property
    def stop(self) -> int:
        """One past the region's last step."""
        return self.steps[-1] + 1

    @property
    def writes_state(self) -> bool:
        return any(self.graph.steps[i].op == "scatter" for i in self.steps)

    def value_type(self, name: str) -> ValueType:
        return self.graph.values[name]

    def overlaps(self, other: Region) -> bool:
        return bool(set(self.steps) & set(other.steps))

    def __repr__(self) -> str:
        what = self.callee.rsplit("::", 1)[-1] if self.callee else "steps"
        where = f" {self.path}" if self.path else ""
        return f"Region({what}{where} @{self.start}, {len(self.steps)} steps)"

    @classmethod
    def of(cls, graph: Graph, start: int, stop: int, index: int | None = None) -> Region:
        """The steps ``start..stop`` (stop exclusive), e.g. one call's span.

        >>> # Region.of(graph, call.start, call.stop, call.index)
        """
        if not 0 <= start < stop <= len(graph.steps):
            raise RegionError(f"steps {start}..{stop} are not a non-empty range of a graph with "
                              f"{len(graph.steps)} steps")
        return cls.of_steps(graph, range(start, stop), index)

    @classmethod
    def of_steps(cls, graph: Graph, steps: Iterable[int], index: int | None = None) -> Region:
        """Steps apart that run together where the first stands (q, k and v, say).

        Every step's operands must exist at the first step: made before it, or by an
        earlier step of the region. States order steps too: running the region at its first
        step moves each of its steps before the steps between that it skips, so a step that
        reads a state may not move before a skipped step that writes it (a KV cache read
        across the scatter that fills it), and a step that writes a state (a scatter) may not
        move before a skipped step that reads or writes it. Such a region raises
        :class:`RegionError` naming the state and both steps.

        >>> # Region.of_steps(graph, [q.start, k.start, v.start], q.index)
        """
        chosen = tuple(sorted(set(steps)))
        if not chosen:
            raise RegionError("a region needs at least one step")
        if chosen[0] < 0 or chosen[-1] >= len(graph.steps):
            raise RegionError(f"step {chosen[-1]} is outside the graph")
        first = chosen[0]
        inside = set(chosen)
        made_before = set(graph.inputs)
        for step in graph.steps[:first]:
            made_before.update(step.results)
        made_inside: list[str] = []
        inputs: list[str] = []
        parameters: list[str] = []
        states: list[str] = []
        for i in chosen:
            step = graph.steps[i]
            for o in step.operands:
                if o.startswith("@"):
                    path = o[1:]
                    bucket = states if path in graph.states else parameters
                    if path not in bucket:
                        bucket.append(path)
                elif o in made_inside:
                    continue
                elif o in made_before:
                    if o not in inputs:
                        inputs.append(o)
                else:
                    raise RegionError(
                        f"step {i} reads {o}, made by step {graph.producers().get(o)} which is "
                        f"not in the region and runs after its first step {first}")
            made_inside.extend(step.results)
        _check_state_order(graph, chosen)
        used_later: set[str] = set(graph.outputs)
        for j, step in enumerate(graph.steps):
            if j in inside or j < first:
                continue
            used_later.update(step.operands)
        outputs = tuple(r for r in made_inside if r in used_later)
        call = _enclosing_call(graph, chosen, index)
        region = cls(graph, chosen, index, tuple(inputs), outputs, tuple(parameters),
                     tuple(states), "", call.callee if call else "", call.path if call else "")
        object.__setattr__(region, "kind", region_kind(region))
        return region


def state_effects(graph: Graph, index: int) -> tuple[set[str], set[str]]:
    """The states step ``index`` reads and writes, by path: a scatter writes the state it
    names first (in place: it reads no other value of it); any other ``@path`` operand that
    names a state is a read.

    >>> # reads, writes = state_effects(graph, 64)   # ({...}, {"model.layers.0....k_cache"})
    """
    step = graph.steps[index]
    reads: set[str] = set()
    writes: set[str] = set()
    for n, o in enumerate(step.operands):
        if o.startswith("@") and o[1:] in graph.states:
            (writes if step.op == "scatter" and n == 0 else reads).add(o[1:])
    return reads, writes


def _check_state_order(graph: Graph, chosen: Sequence[int]) -> None:
    """Raise RegionError where running ``chosen`` together at its first step would reorder
    a state's reads and writes against a step it skips."""
    if not graph.states or chosen[-1] - chosen[0] + 1 == len(chosen):
        return  # a contiguous range runs in its own order: nothing moves
    inside = set(chosen)
    # For each state, the last skipped step (between the region's first and the step at
    # hand) that reads it and the last that writes it.
    skipped_reads: dict[str, int] = {}
    skipped_writes: dict[str, int] = {}
    for i in range(chosen[0], chosen[-1] + 1):
        reads, writes = state_effects(graph, i)
        if i not in inside:
            skipped_reads.update((p, i) for p in reads)
            skipped_writes.update((p, i) for p in writes)
            continue
        for path in sorted(reads):
            if path in skipped_writes:
                j = skipped_writes[path]
                raise RegionError(
                    f"step {i} reads state {path}, which step {j} writes; step {j} is not in "
                    f"the region, so running the region at its first step {chosen[0]} would "
                    f"read {path} before step {j} writes it")
        for path in sorted(writes):
            hazard = [(j, "reads") for p, j in skipped_reads.items() if p == path]
            hazard += [(j, "writes") for p, j in skipped_writes.items() if p == path]
            if hazard:
                j, what = max(hazard)
                raise RegionError(
                    f"step {i} writes state {path}, which step {j} {what}; step {j} is not "
                    f"in the region, so running the region at its first step {chosen[0]} "
                    f"would write {path} before step {j} {what} it")


def _enclosing_call(graph: Graph, steps: Sequence[int], index: int | None) -> Any:
    if index is not None:
        for call in graph.calls:
            if call.index == index:
                return call
    best = None
    for call in graph.calls:
        if call.start <= steps[0] and steps[-1] < call.stop and call.kind != "entry" and (
                best is None or call.depth > best.depth):
            best = call
    return best


def region_kind(region: Region) -> str:
    """A hash of what the region computes: ops, attributes, shapes and dtypes, with value
    names and parameter paths abstracted (each layer's q/k/v share one kind)."""
    graph = region.graph
    names: dict[str, str] = {v: f"in{i}" for i, v in enumerate(region.inputs)}
    params = {p: f"p{i}" for i, p in enumerate(region.parameters + region.states)}

    def ref(o: str) -> str:
        if o.startswith("@"):
            return params[o[1:]]
        return names.setdefault(o, f"v{len(names)}")

    def table(path: str) -> ValueType:
        return graph.states[path] if path in graph.states else graph.parameters[path]

    parts: list[Any] = [region.callee]
    parts.append([[list(graph.values[v].shape), graph.values[v].dtype] for v in region.inputs])
    parts.append([[list(table(p).shape), table(p).dtype, p in graph.states]
                  for p in region.parameters + region.states])
    for i in region.steps:
        s = graph.steps[i]
        attrs = {k: v for k, v in s.attributes.items() if k != "path"}
        parts.append([s.op, [ref(o) for o in s.operands], [ref(r) for r in s.results],
                      attrs, [[list(graph.values[r].shape), graph.values[r].dtype]
                              for r in s.results]])
    parts.append([ref(o) for o in region.outputs])
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@runtime_checkable
class Executable(Protocol):
    meta: ExecutableMeta

    def prepare(self, context: Any) -> None: ...

    def execute(self, inputs: list[Any], outputs: list[Any], context: Any) -> list[Any]: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    version: str
    contract: int

    def probe(self, target: Target) -> Capabilities | None: ...

    def match(self, graph: Graph, target: Target) -> list[Region]: ...

    def compile(self, region: Region, target: Target, options: Options) -> Executable: ...

    def estimate_cost(self, region: Region, target: Target) -> Cost | None: ...
