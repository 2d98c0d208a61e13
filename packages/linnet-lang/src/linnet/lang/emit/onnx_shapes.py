"""Reshapes in the form ONNX's static shape inference follows, for symbolic dims.

A model with symbolic dims (:func:`linnet.lang.export.symbolic_dims`) computes a reshape's
target from the dims at run time (``Concat(Mul(B, L), [64])``). Shape inference that reads no
values (``onnx.shape_inference`` inside a local function, onnxruntime's
``symbolic_shape_infer`` on a function call) cannot follow such a target: it gives the result
a fresh unknown dim, and the next ``Add`` of that with ``B*L`` is a conflict it cannot resolve
without ``auto_merge``. So a reshape says what it keeps where it can:

* one that only inserts or removes axes of size 1 (a reduction's result put back beside its
  operand, ``[B*L] -> [B*L, 1]``) is ``Squeeze``/``Unsqueeze`` with constant axes, which every
  shape inference carries the other dims through by name;
* one that keeps a symbolic dim at its axis (``[B, L, 64] -> [B, L, 4, 16]``) writes 0 there,
  ONNX's "copy the input's dim", so the target is a constant when every other dim is known.

Any other reshape keeps the computed target (onnxruntime's symbolic inference computes it in
the model's graph from the ``Shape`` of the inputs). ``Expand`` writes 1 where the operand has
the dim already (:func:`expand`), and an iota of length ``L`` in a function body is the
``Range(0, L)`` the function takes as an input (``Scope.range``), whose shape is ``L``.

The rules of the shape primitives (``iota``, ``reshape``, ``broadcast``, ``slice``) for
:data:`linnet.lang.emit.onnx_rules.RULES` are here too.

>>> unit_axes((2, 1, 3), (2, 3, 1))
([1], [2])
>>> unit_axes((2, 3), (3, 2)) is None
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linnet.lang.emit.onnx_edges import Scope
from linnet.lang.ir.graph import Step
from linnet.lang.tensors.poly import SymInt


def _key(d: Any) -> Any:
    return ("sym", SymInt.poly_of(d)) if isinstance(d, SymInt) else ("int", int(d))


def _unit(d: Any) -> bool:
    return _key(d) == ("int", 1)


def unit_axes(have: Sequence[int], want: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """``(squeeze, unsqueeze)``: the axes of size 1 to remove from ``have`` and then insert
    to get ``want``, when the reshape does nothing else; None otherwise."""
    if [_key(d) for d in have if not _unit(d)] != [_key(d) for d in want if not _unit(d)]:
        return None
    return [i for i, d in enumerate(have) if _unit(d)], [i for i, d in enumerate(want) if _unit(d)]


def reshape(n: Scope, x: Any, have: Sequence[int], want: Sequence[int], hint: str = "") -> Any:
    """``x`` (of shape ``have``) reshaped to ``want``, in the form shape inference follows
    (see the module docstring); ``hint`` names the result.

    >>> reshape(scope, value, (SymInt(6, L),), (SymInt(6, L), 1))      # doctest: +SKIP
    """
    axes = unit_axes(have, want)
    if axes is not None and (axes[0] or axes[1]):
        squeeze, unsqueeze = axes
        # Only where a dim is symbolic: a concrete reshape stays one Reshape node.
        if any(isinstance(d, SymInt) for d in want):
            if squeeze:
                x = n.op(
                    "Squeeze", [x, n.ints(squeeze, "axes")], hint=hint if not unsqueeze else ""
                )
            if unsqueeze:
                x = n.op("Unsqueeze", [x, n.ints(unsqueeze, "axes")], hint=hint)
            return x
    target = list(want)
    for i, d in enumerate(want):
        if isinstance(d, SymInt) and i < len(have) and _key(have[i]) == _key(d):
            target[i] = 0  # Reshape's "the input's dim": known by name without the value
    if any(isinstance(d, SymInt) for d in target):
        target = list(want)  # another dim is computed anyway: keep the plain target
    return n.op("Reshape", [x, n.ints(target)], hint=hint)


def expand(n: Scope, x: Any, have: Sequence[int], want: Sequence[int], hint: str = "") -> Any:
    """``Expand`` of ``x`` (of shape ``have``) to ``want``. ``Expand`` broadcasts both ways, so
    a dim ``x`` already has on its (right-aligned) axis is written 1: the target is then a
    constant, and shape inference keeps the dim's name, unless ``want`` adds a symbolic dim.

    >>> expand(scope, value, (SymInt(6, L), 1), (SymInt(6, L), 4))     # doctest: +SKIP
    """
    offset = len(want) - len(have)
    target = [
        1 if isinstance(d, SymInt) and i >= offset and _key(have[i - offset]) == _key(d) else d
        for i, d in enumerate(want)
    ]
    if any(isinstance(d, SymInt) for d in target):
        target = list(want)
    return n.op("Expand", [x, n.ints(target)], hint=hint)


# ---------------------------------------------------------------- the shape primitives' rules
def iota(s: Step, n: Scope) -> Any:
    """``iota``: a constant, or ``Range(0, size)`` for a symbolic size, then reshaped to
    its axis and expanded."""
    shape, axis, dt = s.attributes["shape"], s.attributes["axis"], s.attributes["dtype"]
    if isinstance(shape[axis], SymInt):  # Range(0, L, 1), made in int64 then cast
        (mono, coef), *more = shape[axis].poly
        if not more and coef == 1 and len(mono) == 1:  # the dim's own iota (Scope.range)
            line = n.range(mono[0])
        else:
            line = n.op(
                "Range",
                [n.const(0, "i64"), n.const(shape[axis], "i64"), n.const(1, "i64")],
                hint="iota",
            )
        line = n.cast(line, "i64", dt)
    else:
        line = n.const(list(range(shape[axis])), dt, hint="iota")
    if len(shape) == 1:
        return n.op("Identity", [line], hint=s.results[0])
    view = [1] * len(shape)
    view[axis] = shape[axis]
    line = reshape(n, line, [shape[axis]], view)
    return expand(n, line, view, shape, hint=s.results[0])


def reshape_rule(s: Step, n: Scope) -> Any:
    """``reshape``: :func:`reshape` of the operand."""
    return reshape(
        n, n.get(s.operands[0]), n.shape(s.operands[0]), s.attributes["shape"], hint=s.results[0]
    )


def broadcast_rule(s: Step, n: Scope) -> Any:
    """``broadcast``: :func:`expand` of the operand, in the result's dtype."""
    dt = n.graph.values[s.results[0]].dtype
    return expand(
        n,
        n.get(s.operands[0], dt),
        n.shape(s.operands[0]),
        s.attributes["shape"],
        hint=s.results[0],
    )


def slice_rule(s: Step, n: Scope) -> Any:
    """ONNX Slice over every axis (static starts and ends; steps of 1)."""
    rank = len(s.attributes["starts"])
    return n.op(
        "Slice",
        [
            n.get(s.operands[0]),
            n.ints(s.attributes["starts"], "starts"),
            n.ints(s.attributes["limits"], "ends"),
            n.ints(list(range(rank)), "axes"),
        ],
        hint=s.results[0],
    )
