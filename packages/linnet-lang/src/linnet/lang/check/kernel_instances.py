"""The lowering-time pass that records in a graph what its bound calls launch (issue 39):
``graph.kernels`` and ``graph.backwards`` (:mod:`linnet.lang.ir.kernels`), so that the
emitters, which write the launches, read the graph alone and never the program.

For each call of an op bound to a kernel whose `where` clause holds (``kernel_applies``),
over steps, with results that are values, :func:`record_kernels` lowers once per instance
(:func:`~linnet.lang.ir.kernels.instance_key`):

* its kernels (a chain's every stage) to tile programs, with the scalar arguments the call
  passes, the last one's results that the call writes into states stored there
  (:func:`~linnet.lang.ir.tiles.redirect_stores`), and checks their accesses for these
  shapes (E0548, E0549); an error is kept in the instance and raised where a launch of it
  is written, never earlier (an emitter may run the op's body there instead);
* with ``backwards``, the launch's backward pass (its grad clause or its body, lowered for
  the call's types: :func:`~linnet.lang.check.kernel_backward.backward_body`).

The emitters launch kernels where the graph holds an instance for the call: a graph with
none recorded runs every op's body, as ``emit_torch`` without a program did.

>>> from linnet.lang import Program, lower
>>> prog = Program.from_text('''
... kernel double_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
...     let i = iota<i32>(N)
...     store(y[i], load(x[i]) * 2.0)
... }
... pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel double_k<N> {
...     let y[i] = x[i] * 2.0
...     return y
... }
... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return double(x) } }''')
>>> g = record_kernels(lower(prog, "run", {"x": [4]}), prog)
>>> [k.name for i in g.kernels.values() for k in i.kernels], len(g.backwards)
(['main::double_k'], 1)
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Iterator
from typing import Any, overload

import linnet.lang.syntax.tree as A
from linnet.lang.check.kernel_access import raise_access_faults
from linnet.lang.check.kernel_backward import backward_body, op_info
from linnet.lang.check.tile_lowering import find_kernel, lower_kernel
from linnet.lang.diagnostics.core import LinnetError
from linnet.lang.ir.graph import Call, Graph, kernel_stages
from linnet.lang.ir.kernels import (
    KernelInstance,
    backward_key,
    instance_key,
    redirections,
    value_type,
)
from linnet.lang.ir.tiles import redirect_stores
from linnet.lang.pipeline import Numerics
from linnet.lang.syntax.program import Program

# The entry name a backward body is lowered with; the emitter names each one it writes.
BACKWARD_ENTRY = "linnet_backward"


def bound_calls(graph: Graph) -> Iterator[Call]:
    """The calls of ``graph`` whose kernel a launch may run: bound, the clause true, over
    steps, every result a value.

    >>> list(bound_calls(Graph("e", "m")))
    []
    """
    for call in graph.calls:
        a = call.attributes
        if (
            a.get("kernel")
            and a.get("kernel_applies")
            and call.stop > call.start
            and all(isinstance(r, str) for r in a.get("results") or [])
        ):
            yield call


def kernel_arguments(call_args: list[Any], kernel: A.FuncDecl) -> dict[str, Any]:
    """The scalar arguments a call passes to the kernel's scalar parameters (by position).

    >>> kernel_arguments(["%x", 0.5], A.FuncDecl.__new__(A.FuncDecl))  # doctest: +SKIP
    """
    return {
        p.name: a
        for p, a in zip(kernel.params, call_args)
        if not isinstance(a, str) and a is not None
    }


def _find_op(program: Program, qualified: str) -> A.FuncDecl | None:
    module, _, short = qualified.rpartition("::")
    mod = program.module(module)
    item = mod.find(short) if mod is not None else None
    return item if isinstance(item, A.FuncDecl) else None


def instance(program: Program, call: Call, key: str) -> KernelInstance:
    """The :class:`~linnet.lang.ir.kernels.KernelInstance` ``call`` launches (its errors
    kept, not raised)."""
    found = KernelInstance(key)
    op = _find_op(program, call.callee)
    found.op = op_info(op) if op is not None else None
    args = call.attributes.get("args") or []
    try:
        decls = [
            (name, gen, find_kernel(program, name)) for name, gen in kernel_stages(call.attributes)
        ]
        found.scratch = any(decl.scratch for _, _, decl in decls)
        kernels = [
            lower_kernel(program, name, gen, kernel_arguments(args, decl))
            for name, gen, decl in decls
        ]
        # The last stage makes the op's results: those the call writes into states, it
        # stores there.
        writes = redirections(call.attributes)
        if writes:
            kernels[-1] = redirect_stores(kernels[-1], writes)
        # Never written where it would index out of bounds or race for these shapes.
        raise_access_faults(program, kernels, f"`{call.callee}` at {call.loc}")
        found.kernels = kernels
    except LinnetError as err:
        found.error = err
    return found


# The instances each program's calls launched, by callee and instance key: a plan emits a
# module for each backend's regions and each op, every one a copy of one graph with its
# kernels recorded again (hundreds of lowerings of the same instances for a 32-layer model).
# Keyed by the program's modules too (another module, or another set, lowers another way).
_LOWERED: weakref.WeakKeyDictionary[Program, dict[Any, KernelInstance]] = (
    weakref.WeakKeyDictionary()
)
_LOWERED_LOCK = threading.Lock()


def lowered(program: Program, call: Call, key: str) -> KernelInstance:
    """:func:`instance`, once per program, callee and instance key (what the instance
    depends on); later calls get the same :class:`KernelInstance` (errors included, with
    the place of the first call that launched it).

    >>> # lowered(program, call, instance_key(call.attributes)).kernels
    """
    with _LOWERED_LOCK:
        memo = _LOWERED.setdefault(program, {})
    modules = tuple((name, id(m)) for name, m in program.modules.items())
    where = (modules, call.callee, key)
    found = memo.get(where)
    if found is None:
        found = memo[where] = instance(program, call, key)
    return found


def record_kernels(graph: Graph, program: Program, backwards: bool = True) -> Graph:
    """Record in ``graph`` (in place; returned) every kernel instance its bound calls
    launch and, with ``backwards``, their backward passes (see the module docstring). An
    instance already recorded is not lowered again. The tables are replaced, not added to,
    so that a shallow copy (``copy.copy``: a claimed graph, a plan's view) recorded leaves
    the graph it was copied from as it was.

    >>> record_kernels(Graph("e", "m"), Program.from_text("")).kernels
    {}
    """
    graph.kernels, graph.backwards = dict(graph.kernels), dict(graph.backwards)
    for call in bound_calls(graph):
        key = instance_key(call.attributes)
        if key not in graph.kernels:
            graph.kernels[key] = lowered(program, call, key)
        if not backwards:
            continue
        bkey = backward_key(graph, call.attributes, call.callee)
        if bkey in graph.backwards:
            continue
        op = _find_op(program, call.callee)
        if op is None:
            continue
        arg_types: list[tuple[tuple[int, ...], str]] = []
        scalars: dict[str, Any] = {}
        for p, a in zip(op.params, call.attributes.get("args") or []):
            if isinstance(p.type, A.TensorType):
                vt = value_type(graph, a)
                arg_types.append((tuple(vt.shape), vt.dtype))
            else:
                scalars[p.name] = a
        result_types = [
            (tuple(value_type(graph, r).shape), value_type(graph, r).dtype)
            for r in call.attributes.get("results") or []
        ]
        graph.backwards[bkey] = backward_body(
            program, op, arg_types, result_types, scalars, BACKWARD_ENTRY
        )
    return graph


@overload
def with_kernels(
    graphs: Graph, program: Program | None, numerics: str = ..., backwards: bool = ...
) -> Graph: ...
@overload
def with_kernels(
    graphs: list[Graph], program: Program | None, numerics: str = ..., backwards: bool = ...
) -> list[Graph]: ...
def with_kernels(
    graphs: Graph | list[Graph],
    program: Program | None,
    numerics: str = "fast",
    backwards: bool = True,
) -> Graph | list[Graph]:
    """``graphs`` (one graph or a list) as shallow copies with their kernel instances
    recorded (:func:`record_kernels`) where kernels may launch: a ``program`` given and
    ``numerics`` "fast" (E0713 for a value that is neither "exact" nor "fast"). Elsewhere
    they are returned as they are, and every op's body runs. The graphs given are left as
    they are: a runtime's cached graph, which a plan's slices are emitted from, launches
    nothing. What callers of ``emit_torch`` and ``emit_jax`` do where they once passed the
    program.

    >>> g = Graph("e", "m")
    >>> with_kernels(g, None) is g, with_kernels(g, Program.from_text("")) is g
    (True, False)
    """
    if program is None or Numerics.parse(numerics) != Numerics.FAST:
        return graphs
    if isinstance(graphs, Graph):
        return record_kernels(copy.copy(graphs), program, backwards)
    return [record_kernels(copy.copy(g), program, backwards) for g in graphs]


__all__ = [
    "BACKWARD_ENTRY",
    "bound_calls",
    "instance",
    "kernel_arguments",
    "record_kernels",
    "with_kernels",
]
