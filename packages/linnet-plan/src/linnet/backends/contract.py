"""The backend contract, version :data:`CONTRACT`.

A backend is an object with ``name``, ``version``, ``contract`` and four methods
(``probe``, ``match``, ``compile``, ``estimate_cost``; optionally ``compile_regions``, and
``decline_reason``: :class:`ExplainsDeclines`). Executables have ``meta``,
``prepare(context)`` and ``execute(inputs, outputs, context)``. See docs/backends.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from linnet.lang.ir.graph import Graph, ValueType
from linnet.lang.ir.stepsets import (
    StepSet,
    StepSetError,
    check_runs_at_first,
    fingerprint,
    step_set,
)
from linnet.lang.ir.stepsets import state_effects as state_effects  # moved there; re-exported

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
        return json.dumps(
            [self.kind, self.name, self.capability, self.framework, list(self.versions)]
        )


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do on a target (returned by ``probe``; None declines, and the
    optional ``decline_reason(target)`` says why: :class:`ExplainsDeclines`)."""

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
    ``algorithm``: where a backend offers several executables for one region (two
    algorithms: ``match`` returns the region once for each, ``compile`` gives each its
    executable), a name that tells this one apart; each is timed, cached and decided on its
    own (the planner otherwise tells them apart by class, then by order).

    >>> ExecutableMeta((), ()).holds
    0
    >>> ExecutableMeta(algorithm="split-k").algorithm
    'split-k'
    """

    inputs: tuple = ()
    outputs: tuple = ()
    holds: int = 0
    algorithm: str = ""


@dataclass(frozen=True)
class Options:
    """Planning options. ``margin``: the fraction of the generated source's time a backend
    must save to take a region (2% by default). ``captured``: the plan will run as one
    captured CUDA graph (``Captured``), so regions and slices are timed inside one, where the
    host's launch costs are not paid; False: it will run item by item from the host
    (``plan.run``, a prefill), so each is charged its host time beside its device time."""

    margin: float = 0.02
    measure: bool = True
    memory: int | None = None
    compile: str | bool | None = None
    captured: bool = True
    warmup: int = 3
    repeat: int = 20
    tolerance: float = 0.01
    extra: dict = field(default_factory=dict)


class RegionError(StepSetError):
    """A backend described a region that cannot run where it stands (a ``ValueError``)."""


@dataclass(frozen=True, eq=False)
class Region:
    """Steps of a graph that one executable runs. Build with :meth:`of` or :meth:`of_steps`.

    ``inputs`` are the values the region reads that earlier steps made; parameters and
    states are addressed by path (an executable reads ``context.parameters[path]``).
    ``outputs`` are the values it makes that later steps (or the entry) use. Regions of one
    ``kind`` compute the same thing on different parameters and share one timing; the kind
    is the fingerprint of the steps (``linnet.lang.ir.stepsets``), which generated source's
    slices over the same steps carry too.
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
        what = (
            self.callee.rsplit("::", 1)[-1]
            if isinstance(self.callee, str) and self.callee
            else "steps"
        )
        where = f" {self.path}" if isinstance(self.path, str) and self.path else ""
        try:  # a region a backend built by hand may hold anything: its repr never raises
            return f"Region({what}{where} @{self.start}, {len(self.steps)} steps)"
        except Exception:
            return f"Region({what}{where}, steps={self.steps!r:.40})"

    @classmethod
    def of(cls, graph: Graph, start: int, stop: int, index: int | None = None) -> Region:
        """The steps ``start..stop`` (stop exclusive), e.g. one call's span.

        >>> # Region.of(graph, call.start, call.stop, call.index)
        """
        if not 0 <= start < stop <= len(graph.steps):
            raise RegionError(
                f"steps {start}..{stop} are not a non-empty range of a graph with "
                f"{len(graph.steps)} steps"
            )
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
        try:
            check_runs_at_first(graph, chosen)
        except StepSetError as exc:
            raise RegionError(str(exc)) from None
        analysed = step_set(graph, chosen)
        call = _enclosing_call(graph, chosen, index)
        return cls(
            graph,
            chosen,
            index,
            analysed.inputs,
            analysed.outputs,
            analysed.parameters,
            analysed.states,
            fingerprint(graph, analysed),
            call.callee if call else "",
            call.path if call else "",
        )


def _enclosing_call(graph: Graph, steps: Sequence[int], index: int | None) -> Any:
    if index is not None:
        for call in graph.calls:
            if call.index == index:
                return call
    best = None
    for call in graph.calls:
        if (
            call.start <= steps[0]
            and steps[-1] < call.stop
            and call.kind != "entry"
            and (best is None or call.depth > best.depth)
        ):
            best = call
    return best


def region_kind(region: Region) -> str:
    """What the region computes, as a hash: the fingerprint
    (:func:`linnet.lang.ir.stepsets.fingerprint`) of its steps, inputs, outputs,
    parameters and states, with value names and parameter paths abstracted (each layer's
    q/k/v share one kind). A slice of generated source over the same steps has this kind too.

    >>> # region_kind(region) == region.kind   (what Region.of gives)
    """
    return fingerprint(
        region.graph,
        StepSet(
            region.steps,
            tuple(region.inputs),
            tuple(region.outputs),
            tuple(region.parameters),
            tuple(region.states),
        ),
    )


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


@runtime_checkable
class ExplainsDeclines(Protocol):
    """The optional part of contract 1 that says why ``probe`` declines a target.

    ``decline_reason(target)`` returns a sentence for the user (no CUDA device here, the
    library is not installed and how to install it, the GPU's compute capability is too
    low), or None where ``probe`` accepts the target. Linnet asks it only after ``probe``
    returned None, and shows the sentence in ``linnet backends`` and in a plan's "backends
    not used". A backend without it still meets contract 1 (its declines are listed without
    a reason), and a host that predates it never calls it, so adding it needs no new
    contract version. One that raises, or returns something other than a string or None, is
    shown as such in place of the reason; it never breaks planning.

    >>> class Gpu:
    ...     def probe(self, target):
    ...         return None if self.decline_reason(target) else Capabilities()
    ...     def decline_reason(self, target):
    ...         if target.kind != "cuda":
    ...             return f"runs on CUDA devices only; this target is {target.kind}"
    ...         return None
    >>> isinstance(Gpu(), ExplainsDeclines), Gpu().probe(Target("cpu"))
    (True, None)
    """

    def decline_reason(self, target: Target) -> str | None: ...
