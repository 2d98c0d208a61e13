"""The validity flag of an exported entry: one pass over a graph.

An ONNX or StableHLO model cannot raise. Where the runtimes reject an input before anything
runs (a token id past the vocabulary, E0780; a prompt longer than the cache, E0782) or stop
at an index computed out of range (E0781), an exported model would read or write somewhere
else: onnxruntime wraps -1 to the last row, XLA clamps or skips. :func:`with_validity`
appends to a graph the steps that compute, from the very index values the model uses, one
bool: every index that must be in range (every ``take`` and ``gather`` whose bounds are not
``zero``, every ``scatter`` position; the indices :mod:`linnet.lang.passes.bounds` checks) is
within its axis. The exporters return it as the model's last output, ``linnet.valid``, after
the states (docs/export.md, "Checking inputs"); :mod:`linnet.lang.export_checks` turns a
false one into the runtimes' coded error.

It is computed from the indices themselves, not from the input ranges found at export time,
so it stays exact where those ranges change with a symbolic dim (an ONNX prefill exported
for 8 tokens and run with 129 into a cache of 128).

>>> from linnet.lang import Program, lower
>>> prog = Program.from_text('''
... model M<V: Dim> {
...     param t: Tensor[V; f32]
...     entry get(i: Tensor[2; i32]) -> Tensor[2; f32] {
...         let out[k] = self.t[i[k]]
...         return out
...     }
... }''')
>>> g, flag = with_validity(lower(prog, "get", {"i": [2]}, {"V": 4}))
>>> flag, g.values[flag]
('%linnet.valid', ValueType(shape=(), dtype='bool'))
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from linnet.lang.ir.graph import Graph, Step, ValueType

FLAG = "%linnet.valid"
"""The flag's SSA name (no source value has a dot in its name)."""


@dataclass(frozen=True)
class IndexUse:
    """Index ``ref`` is a position along ``axis`` (size ``size``) of ``target`` in ``step``."""

    step: int
    ref: str
    target: str
    axis: int
    size: int


def index_uses(graph: Graph) -> list[IndexUse]:
    """Every index that must be in range: those of ``take``/``gather`` without ``bounds =
    zero`` and every ``scatter`` position (the uses :func:`~linnet.lang.passes.bounds.input_bounds`
    checks), with the size of the axis each one indexes.

    >>> index_uses(Graph("e", "m"))
    []
    """
    out = []
    for i, step in enumerate(graph.steps):
        if step.op == "take" and step.attributes.get("bounds") != "zero":
            data, ref = step.operands
            axis = step.attributes.get("axis", 0)
            out.append(IndexUse(i, ref, data, axis, _shape(graph, data)[axis]))
        elif (
            step.op == "gather" and step.attributes.get("bounds") != "zero"
        ) or step.op == "scatter":
            data = step.operands[0]
            refs = step.operands[1:] if step.op == "gather" else step.operands[2:]
            shape = _shape(graph, data)
            out += [IndexUse(i, ref, data, axis, shape[axis]) for axis, ref in enumerate(refs)]
    return out


def with_validity(graph: Graph) -> tuple[Graph, str]:
    """A copy of ``graph`` with steps appended that compute :data:`FLAG`: true when every
    index of :func:`index_uses` is within its axis (``0 <= min`` and ``max < size``).
    Returns the graph and the flag's ref (not an output: an exporter places it)."""
    out = copy.copy(graph)  # keeps what an exporter set on it (graph.symbolic)
    out.steps, out.values = list(graph.steps), dict(graph.values)
    builder = _Builder(out)
    flag = None
    fixed = _fixed(graph)
    seen: set[tuple[str, int]] = set()
    for use in index_uses(graph):
        if use.ref in fixed or (use.ref, use.size) in seen:
            continue  # the same value against the same size; or one check_static proves
        seen.add((use.ref, use.size))
        vt = graph.values[use.ref]
        axes = list(range(len(vt.shape)))
        smallest = builder.reduce(use.ref, "min", axes) if axes else use.ref
        largest = builder.reduce(use.ref, "max", axes) if axes else use.ref
        low = builder.step("ge", [smallest, builder.constant(0, vt.dtype)], "bool")
        high = builder.step("lt", [largest, builder.constant(use.size, vt.dtype)], "bool")
        ok = builder.step("and", [low, high], "bool")
        flag = ok if flag is None else builder.step("and", [flag, ok], "bool")
    if flag is None:
        flag = builder.constant(True, "bool")
    last = out.steps[-1]  # made here: named the flag
    last.results = [FLAG]
    out.values[FLAG] = out.values.pop(flag)
    return out, FLAG


class _Builder:
    """Appends steps to a graph, each with a fresh `%linnet.check.N` result."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.count = 0

    def step(self, op: str, operands: list[str], dtype: str, attributes: dict | None = None) -> str:
        self.count += 1
        result = f"%linnet.check.{self.count}"
        self.graph.steps.append(
            Step(op, operands, [result], dict(attributes or {}), loc="linnet.valid")
        )
        self.graph.values[result] = ValueType((), dtype)  # every check is a scalar
        return result

    def constant(self, value: object, dtype: str) -> str:
        return self.step("constant", [], dtype, {"value": value, "dtype": dtype})

    def reduce(self, ref: str, kind: str, axes: list[int]) -> str:
        dtype = self.graph.values[ref].dtype
        identity = math.inf if kind == "min" else -math.inf
        return self.step(
            "reduce",
            [ref],
            dtype,
            {"kind": kind, "axes": axes, "accumulate": dtype, "identity": identity},
        )


def _fixed(graph: Graph) -> set[str]:
    """The values made from constants and iotas alone, with no symbolic size among their
    steps' numbers: the same at every call, so an index among them is in range if export's
    ``check_static`` (E0782) passed. An iota of a symbolic length L is not fixed: a call at
    another L reaches other positions."""
    out: set[str] = set()
    for step in graph.steps:
        if (
            all(o in out for o in step.operands)
            and not _symbolic(step.attributes)
            and step.op not in ("take", "gather", "scatter", "scatter_add")
            and step.results
            and not any(_symbolic(graph.values[r].shape) for r in step.results)
        ):
            out.update(step.results)
    return out


def _symbolic(x: object) -> bool:
    """Whether ``x`` holds a symbolic size (a SymInt of linnet.lang.export)."""
    if hasattr(x, "poly"):
        return True
    if isinstance(x, list | tuple):
        return any(_symbolic(v) for v in x)
    if isinstance(x, dict):
        return any(_symbolic(v) for v in x.values())
    return False


def _shape(graph: Graph, ref: str) -> tuple[int, ...]:
    if ref.startswith("@"):
        path = ref[1:]
        table = graph.states if path in graph.states else graph.parameters
        return table[path].shape
    return graph.values[ref].shape
