"""What a set of a graph's steps reads, makes and computes: the one analysis behind slices
(:mod:`linnet.lang.passes.slices`, the functions of generated source) and linnet-plan's regions
(``linnet.backends.Region``, the steps a backend runs).

:func:`step_set` gives a set's inputs, outputs, parameters and states; :func:`fingerprint`
hashes what it computes with value names and parameter paths abstracted, so that every
layer's slice or region has one fingerprint (``Slice.kind`` and ``Region.kind`` are it);
:func:`check_runs_at_first` says whether steps apart may run together where the first one
stands (operands made in time, no state read or written out of order).

>>> from linnet.lang.ir.graph import Graph, Step, ValueType
>>> g = Graph("e", "m", inputs=["%x"], outputs=["%z"], values={
...     "%x": ValueType((2,), "f32"), "%y": ValueType((2,), "f32"), "%z": ValueType((2,), "f32")},
...     parameters={"w": ValueType((2,), "f32")})
>>> g.steps = [Step("mul", ["%x", "@w"], ["%y"]), Step("exp", ["%y"], ["%z"])]
>>> s = step_set(g, [0])
>>> s.inputs, s.outputs, s.parameters
(('%x',), ('%y',), ('w',))
>>> fingerprint(g, s) == fingerprint(g, step_set(g, [0]))
True
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.ir.graph import Graph, ValueType


class StepSetError(ValueError):
    """Steps that cannot run together where the first of them stands (see
    :func:`check_runs_at_first`). linnet-plan's ``RegionError`` is a subclass."""


@dataclass(frozen=True)
class StepSet:
    """Steps of one graph, in the order they run, and what they exchange with the rest.

    ``inputs``: SSA values the steps read that no earlier step of the set made, in first-use
    order. ``outputs``: values the steps make that a step outside the set, or the entry,
    uses. ``parameters`` and ``states``: the paths read (or, for states, written), in
    first-use order.
    """

    steps: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    parameters: tuple[str, ...]
    states: tuple[str, ...]


@dataclass
class _Index:
    """What the analyses read of a whole graph, made once (see :func:`indexed`)."""

    graph: Graph
    producer: dict[str, int]  # value -> the step that makes it
    users: dict[str, list[int]]  # value -> the steps that read it
    outputs: frozenset[str]
    inputs: frozenset[str]
    calls_at: dict[int, list[tuple[int, Any]]]  # first step -> (order in graph.calls, call)
    prefixes: list[str]  # the repeated blocks' iterations' paths with a dot, longest first
    depth: int = 1
    memo: dict[Any, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: Graph) -> _Index:
        producer: dict[str, int] = {}
        users: dict[str, list[int]] = {}
        for i, step in enumerate(graph.steps):
            for r in step.results:
                producer[r] = i
            for o in step.operands:
                users.setdefault(o, []).append(i)
        calls_at: dict[int, list[tuple[int, Any]]] = {}
        for n, c in enumerate(graph.calls):
            if c.kind != "entry" and c.start < c.stop:
                calls_at.setdefault(c.start, []).append((n, c))
        prefixes = sorted(
            {c.path + "." for c in graph.calls if c.iteration is not None and c.path},
            key=len,
            reverse=True,
        )
        return cls(
            graph,
            producer,
            users,
            frozenset(graph.outputs),
            frozenset(graph.inputs),
            calls_at,
            prefixes,
        )

    def made_before(self, value: str, step: int) -> bool:
        return value in self.inputs or self.producer.get(value, step) < step


_INDEXES: dict[int, _Index] = {}
_LOCK = threading.Lock()


@contextmanager
def indexed(graph: Graph) -> Iterator[Graph]:
    """Within the block, :func:`step_set`, :func:`fingerprint`, :func:`check_runs_at_first`
    and :func:`block_prefix` read ``graph`` through an index made once (which step makes
    and which steps read each value, the calls by first step): for a caller that analyses
    thousands of step sets of one graph it does not change (a plan's candidate regions,
    each backend's and every layer's). Without it each analysis reads the whole graph.
    The graph must not change inside the block. Blocks may nest.

    >>> from linnet.lang.ir.graph import Graph
    >>> with indexed(Graph("e", "m")) as g:
    ...     step_set(g, []).outputs
    ()
    """
    with _LOCK:
        found = _INDEXES.get(id(graph))
        if found is not None and found.graph is graph:
            found.depth += 1
        else:
            _INDEXES[id(graph)] = _Index.of(graph)
    try:
        yield graph
    finally:
        with _LOCK:
            found = _INDEXES[id(graph)]
            found.depth -= 1
            if not found.depth:
                del _INDEXES[id(graph)]


def _index(graph: Graph) -> _Index | None:
    found = _INDEXES.get(id(graph))
    return found if found is not None and found.graph is graph else None


def made_before(graph: Graph, start: int) -> Any:
    """A test of whether a value exists before step ``start`` runs (a graph input, or made
    by an earlier step), as a callable on the value's name.

    >>> from linnet.lang.ir.graph import Graph
    >>> made_before(Graph("e", "m", inputs=["%x"]), 0)("%x")
    True
    """
    index = _index(graph)
    if index is not None:
        return lambda value: index.made_before(value, start)
    made = set(graph.inputs)
    for step in graph.steps[:start]:
        made.update(step.results)
    return made.__contains__


def read_outside(graph: Graph, values: Iterable[str], lo: int, hi: int) -> bool:
    """Whether a step outside ``lo..hi`` reads any of ``values``.

    >>> from linnet.lang.ir.graph import Graph, Step
    >>> g = Graph("e", "m")
    >>> g.steps = [Step("neg", ["%x"], ["%y"]), Step("exp", ["%y"], ["%z"])]
    >>> read_outside(g, ["%y"], 0, 1), read_outside(g, ["%y"], 0, 2)
    (True, False)
    """
    wanted = set(values)
    if not wanted:
        return False
    index = _index(graph)
    if index is not None:
        return any(j < lo or j >= hi for v in wanted for j in index.users.get(v, ()))
    return any(not wanted.isdisjoint(s.operands) for s in graph.steps[:lo] + graph.steps[hi:])


def step_set(graph: Graph, steps: Iterable[int]) -> StepSet:
    """Analyse ``steps`` (run in the order given; a plan's slice may skip some).

    >>> # step_set(graph, range(call.start, call.stop)).outputs
    """
    order = tuple(steps)
    inside = set(order)
    made: set[str] = set()
    made_in_order: list[str] = []
    inputs: dict[str, None] = {}
    parameters: dict[str, None] = {}
    states: dict[str, None] = {}
    for i in order:
        step = graph.steps[i]
        for o in step.operands:
            if o.startswith("@"):
                path = o[1:]
                (states if path in graph.states else parameters).setdefault(path)
            elif o not in made:
                inputs.setdefault(o)
        made.update(step.results)
        made_in_order.extend(step.results)
    index = _index(graph)
    if index is not None:
        outputs = tuple(
            r
            for r in made_in_order
            if r in index.outputs or any(j not in inside for j in index.users.get(r, ()))
        )
        return StepSet(order, tuple(inputs), outputs, tuple(parameters), tuple(states))
    used_outside: set[str] = set(graph.outputs)
    for j, step in enumerate(graph.steps):
        if j not in inside:
            used_outside.update(step.operands)
    outputs = tuple(r for r in made_in_order if r in used_outside)
    return StepSet(order, tuple(inputs), outputs, tuple(parameters), tuple(states))


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


def check_runs_at_first(graph: Graph, chosen: Sequence[int]) -> None:
    """Raise :class:`StepSetError` unless the sorted steps ``chosen`` can run together where
    the first stands: every operand is a graph input, made before the first step, or made
    by an earlier step of the set; and no step moves across a skipped step in a way that
    reorders a state's reads and writes (a KV cache read moved before the scatter that
    fills it, or a scatter moved before a skipped read or write of its state).

    >>> # check_runs_at_first(graph, [q.start, k.start, v.start])
    """
    first = chosen[0]
    exists = made_before(graph, first)
    made_inside: set[str] = set()
    for i in chosen:
        step = graph.steps[i]
        for o in step.operands:
            if o.startswith("@") or o in made_inside or exists(o):
                continue
            raise StepSetError(
                f"step {i} reads {o}, made by step {graph.producers().get(o)} which is "
                f"not in the region and runs after its first step {first}"
            )
        made_inside.update(step.results)
    _check_state_order(graph, chosen)


def _check_state_order(graph: Graph, chosen: Sequence[int]) -> None:
    if not graph.states or chosen[-1] - chosen[0] + 1 == len(chosen):
        return  # a contiguous range runs in its own order: nothing moves
    inside = set(chosen)
    # For each state, the last skipped step (between the set's first and the step at
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
                raise StepSetError(
                    f"step {i} reads state {path}, which step {j} writes; step {j} is not in "
                    f"the region, so running the region at its first step {chosen[0]} would "
                    f"read {path} before step {j} writes it"
                )
        for path in sorted(writes):
            hazard = [(j, "reads") for p, j in skipped_reads.items() if p == path]
            hazard += [(j, "writes") for p, j in skipped_writes.items() if p == path]
            if hazard:
                j, what = max(hazard)
                raise StepSetError(
                    f"step {i} writes state {path}, which step {j} {what}; step {j} is not "
                    f"in the region, so running the region at its first step {chosen[0]} "
                    f"would write {path} before step {j} {what} it"
                )


def fingerprint(graph: Graph, steps: StepSet) -> str:
    """What ``steps`` compute, as a 16-digit hash: each step's op, attributes and result
    types, the types of the inputs, parameters and states, and how values flow between
    them, with value names and parameter paths abstracted (by position of first use).
    Sets with one fingerprint compute the same thing from differently named values and
    weights (each layer's slice; each layer's q projection), so generated source has one
    function for them and a plan times them once.

    >>> # fingerprint(g, step_set(g, layer0)) == fingerprint(g, step_set(g, layer1))
    """
    index = _index(graph)
    if index is not None:
        if steps not in index.memo:
            index.memo[steps] = _fingerprint(graph, steps, index)
        return str(index.memo[steps])
    return _fingerprint(graph, steps, None)


def _fingerprint(graph: Graph, steps: StepSet, index: _Index | None) -> str:
    names: dict[str, str] = {v: f"in{i}" for i, v in enumerate(steps.inputs)}
    paths = {p: f"p{i}" for i, p in enumerate(steps.parameters + steps.states)}

    def ref(o: str) -> str:
        if o.startswith("@"):
            return paths[o[1:]]
        return names.setdefault(o, f"v{len(names)}")

    def typed(vt: ValueType) -> list[Any]:
        return [list(vt.shape), vt.dtype]

    parts: list[Any] = [[typed(graph.values[v]) for v in steps.inputs]]
    parts.append(
        [[*typed(graph.parameters[p]), False] for p in steps.parameters]
        + [[*typed(graph.states[p]), True] for p in steps.states]
    )
    for i in steps.steps:
        s = graph.steps[i]
        # A scatter's `path` names its state, which its first operand already says.
        attrs = {k: v for k, v in s.attributes.items() if k != "path"}
        parts.append(
            [
                s.op,
                [ref(o) for o in s.operands],
                [ref(r) for r in s.results],
                attrs,
                [typed(graph.values[r]) for r in s.results],
            ]
        )
    parts.append([ref(o) for o in steps.outputs])
    # The calls inside the set, by callee and place: emitters write a call's fused form
    # (SDPA for `causal_attention`, a masked SDPA for `window_attention`) from the call, not
    # from its steps, and two attention calls can lower to the same steps once their masks
    # (constants) are hoisted out: a global and a sliding-window layer must differ in kind.
    where = {i: k for k, i in enumerate(steps.steps)}
    if index is not None:
        starting = sorted((n, c) for i in steps.steps for n, c in index.calls_at.get(i, ()))
        calls = [c for _, c in starting]
    else:
        calls = [c for c in graph.calls if c.kind != "entry" and c.start < c.stop]
    parts.append(
        [
            [c.callee, where[c.start], c.stop - c.start]
            for c in calls
            if c.start in where and all(i in where for i in range(c.start, c.stop))
        ]
    )
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def block_prefix(graph: Graph, paths: Iterable[str]) -> str:
    """The path of the repeated-block iteration all ``paths`` lie in, with a trailing dot
    (``model.layers.3.``), or '' (read from the calls' ``iteration``, not from the paths'
    digits).

    >>> # block_prefix(graph, ["model.layers.3.mlp.up.weight"]) == "model.layers.3."
    """
    wanted = list(paths)
    if not wanted:
        return ""
    index = _index(graph)
    if index is not None:
        return next((p for p in index.prefixes if all(w.startswith(p) for w in wanted)), "")
    best = ""
    for call in graph.calls:
        if call.iteration is None or not call.path:
            continue
        candidate = call.path + "."
        if len(candidate) > len(best) and all(p.startswith(candidate) for p in wanted):
            best = candidate
    return best
