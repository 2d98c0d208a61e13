"""Kernel instances and backward bodies as the graph holds them (issue 39): what the
emitters read where a bound op's call launches its kernel, so that nothing after lowering
reads the syntax tree.

A lowering-time pass (:func:`linnet.lang.check.kernel_instances.record_kernels`, which may
read the program) fills two tables of a :class:`~linnet.lang.ir.graph.Graph`:

* ``graph.kernels``: :func:`instance_key` of a bound call -> :class:`KernelInstance`, the
  tile programs its launch runs (one per kernel of a chain, lowered once, the last one's
  state writes redirected), whether they keep scratch buffers, and the error that launching
  them would be (a kernel that does not lower, or accesses out of bounds for these shapes);
* ``graph.backwards``: :func:`backward_key` of a bound call -> :class:`BackwardBody`, the
  lowered graph of the launch's backward pass (the op's grad clause, or its body run again)
  or why it has none, and what E0545/E0561 say about the op.

Both live in memory beside the graph's steps: the graph's JSON format (docs/graph-format.md)
does not carry them, since tile programs and backward graphs are remade from the source.

>>> from linnet.lang.ir.graph import Call
>>> call = Call("m::double", "op", 0, 1, 0, attributes={
...     "kernel": "m::double_k", "kernel_generics": {"N": 4}, "kernel_applies": True,
...     "args": ["%x", 2.0], "results": ["%y"]})
>>> instance_key(call.attributes)
"(('m::double_k', (('N', 4),)),), (None, 2.0), ()"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.graph import Graph, ValueType, kernel_stages
from linnet.lang.ir.tiles import TileKernel


def instance_key(attributes: dict[str, Any]) -> str:
    """The key of the kernel instance a bound call launches, from its attributes alone:
    its kernels and generics (:func:`~linnet.lang.ir.graph.kernel_stages`), the literal
    (scalar) arguments by position, and the results it writes into states.

    >>> instance_key({"kernel": "m::k", "kernel_generics": {}, "args": ["%x"]})
    "(('m::k', ()),), (None,), ()"
    """
    stages = tuple((name, tuple(sorted(gen.items()))) for name, gen in kernel_stages(attributes))
    literals = tuple(None if isinstance(a, str) else a for a in attributes.get("args") or [])
    writes = tuple(redirections(attributes))
    return f"{stages!r}, {literals!r}, {writes!r}"


def redirections(attributes: dict[str, Any]) -> list[tuple[int, ...]]:
    """What :func:`~linnet.lang.ir.tiles.redirect_stores` is asked for a bound call's state
    writes (``writes``: passes/spans.py's ``state_writes``): ``(result, positions)`` for a
    dense cache's write at ``[b, at[b]]``, ``(result, positions, pages)`` for a paged one's
    at ``[page[b], at[b]]``.

    >>> redirections({"writes": [{"result": 1, "positions": 8, "page": None, "pages": 0},
    ...                          {"result": 2, "positions": 4, "page": "%page", "pages": 6}]})
    [(1, 8), (2, 4, 6)]
    """
    return [
        (w["result"], w["positions"], w["pages"])
        if w.get("page")
        else (w["result"], w["positions"])
        for w in attributes.get("writes") or []
    ]


def value_type(graph: Graph, ref: str) -> ValueType:
    """A value's type: a step's result or input (``%x``), a parameter or state (``@w``).

    >>> g = Graph("e", "m", values={"%x": ValueType((2,), "f32")})
    >>> value_type(g, "%x").shape
    (2,)
    """
    if ref.startswith("@"):
        path = ref[1:]
        return graph.parameters[path] if path in graph.parameters else graph.states[path]
    return graph.values[ref]


def backward_key(graph: Graph, attributes: dict[str, Any], callee: str) -> str:
    """The key of a bound call's backward body: the op, its kernel instance and the types
    of its arguments (literals as themselves).

    >>> g = Graph("e", "m", values={"%x": ValueType((2,), "f32")})
    >>> backward_key(g, {"kernel": "m::k", "args": ["%x"]}, "m::op").startswith("'m::op'")
    True
    """
    args = [
        repr(value_type(graph, a)) if isinstance(a, str) else repr(a)
        for a in attributes.get("args") or []
    ]
    return f"{callee!r}, {instance_key(attributes)}, {args!r}"


@dataclass
class OpInfo:
    """What the emitters say about the op a bound call calls (E0545, E0561): its names,
    its tensor parameters' names and its grad clause's incoming gradients' names (empty
    without a clause)."""

    name: str
    qualified_name: str
    tensor_params: list[str]
    grad_names: list[str]
    has_grad: bool


@dataclass
class KernelInstance:
    """The tile programs one bound call's launch runs (see the module docstring).
    ``error``: the coded error launching it would be; ``kernels`` is then empty."""

    key: str
    kernels: list[TileKernel] = field(default_factory=list)
    scratch: bool = False
    error: LinnetError | None = None
    op: OpInfo | None = None

    def launched(self) -> list[TileKernel]:
        """The tile programs, or the recorded error raised (where a launch is written).

        >>> KernelInstance("k").launched()
        []
        """
        if self.error is not None:
            raise LinnetError(self.error.diagnostics)
        return self.kernels


@dataclass
class BackwardBody:
    """A bound call's backward pass, lowered once: ``graph`` (entry name ``entry``; with a
    grad clause it takes the tensor arguments, then one incoming gradient per result, and
    returns one gradient per tensor argument; without one it is the op's body, run again
    under autograd), or ``cause``, the first diagnostic of the lowering that failed, with
    E0545's ``advice`` (message, help). ``arg_types``, ``scalars`` and ``result_types`` are
    the call's, as the backward was lowered for them."""

    op: OpInfo
    arg_types: list[tuple[tuple[int, ...], str]]
    scalars: dict[str, Any]
    result_types: list[tuple[tuple[int, ...], str]]
    uses_grad_clause: bool = False
    graph: Graph | None = None
    entry: str = ""
    cause: Diagnostic | None = None
    advice: tuple[str, str] = ("", "")


__all__ = [
    "BackwardBody",
    "KernelInstance",
    "OpInfo",
    "backward_key",
    "instance_key",
    "redirections",
    "value_type",
]
