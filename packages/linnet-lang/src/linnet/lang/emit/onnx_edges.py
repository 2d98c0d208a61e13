"""The ONNX emitter's rules where ONNX's operators differ from Linnet at edge values
(:mod:`linnet.lang.ir.edges`): integer ``/`` and ``%`` (ONNX truncates, and onnxruntime
fails on a zero divisor), float ``%`` (exact, with Python's sign), float-to-integer ``Cast``
(undefined out of range) and ``ReduceMax``/``ReduceMin`` (onnxruntime skips NaN).

Each rule takes the step and the emitter's :class:`~linnet.lang.emit.onnx.Scope` and
returns the result's value, as the rules of :data:`linnet.lang.emit.onnx_rules.RULES` do.

>>> sorted(RULES)
['convert', 'div', 'rem']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from linnet.lang.ir.edges import FLOAT_BITS, INT_RANGES, constant_of, saturation
from linnet.lang.ir.graph import Graph, Step


class Scope(Protocol):
    """What these rules and :mod:`.onnx_shapes`'s use of :class:`linnet.lang.emit.onnx.Scope`
    (the emitter imports both: a type of their own keeps them out of an import cycle)."""

    graph: Graph

    def op(self, *args: Any, **kwargs: Any) -> Any: ...
    def const(self, *args: Any, **kwargs: Any) -> Any: ...
    def cast(self, *args: Any, **kwargs: Any) -> Any: ...
    def dtype(self, *args: Any, **kwargs: Any) -> Any: ...
    def get(self, *args: Any, **kwargs: Any) -> Any: ...
    def ints(self, *args: Any, **kwargs: Any) -> Any: ...
    def range(self, *args: Any, **kwargs: Any) -> Any: ...
    def shape(self, *args: Any, **kwargs: Any) -> Any: ...


_INTS = set(INT_RANGES)


def _out(s: Step, n: Scope) -> str:
    return n.graph.values[s.results[0]].dtype


def _safe_divisor(s: Step, n: Scope, b: Any, dt: str) -> tuple[Any, Any, Any]:
    """``(zero, minus_one, divisor)``: where the divisor is 0 and where it is -1 (None when
    it cannot be: a constant, or unsigned), and the divisor with 1 there, so that no integer
    division by zero runs, nor ``MIN / -1`` (onnxruntime's Div dies of SIGFPE on it)."""
    value = constant_of(n.graph, s.operands[1])
    if isinstance(value, int) and value not in (0, -1):
        return None, None, b
    zero = n.op("Equal", [b, n.const(0, dt)])
    minus = None if dt == "u8" else n.op("Equal", [b, n.const(-1, dt)])
    special = zero if minus is None else n.op("Or", [zero, minus])
    return zero, minus, n.op("Where", [special, n.const(1, dt), b])


def _div(s: Step, n: Scope) -> Any:
    dt = _out(s, n)
    a, b = (n.get(o, dt) for o in s.operands)
    if dt not in _INTS:
        return n.op("Div", [a, b], hint=s.results[0])
    zero_divisor, minus_one, b = _safe_divisor(s, n, b, dt)
    # ONNX's integer Div truncates; Linnet's rounds toward -inf: one less where the
    # remainder is nonzero and the operands' signs differ.
    q = n.op("Div", [a, b])
    r = n.op("Sub", [a, n.op("Mul", [q, b])])
    zero = n.const(0, dt)
    inexact = n.op("Not", [n.op("Equal", [r, zero])])
    signs = n.op("Xor", [n.op("Less", [r, zero]), n.op("Less", [b, zero])])
    fix = n.cast(n.op("And", [inexact, signs]), "bool", dt)
    if zero_divisor is None:
        return n.op("Sub", [q, fix], hint=s.results[0])
    out = n.op("Sub", [q, fix])
    if minus_one is not None:  # a / -1 is -a, wrapping (MIN / -1 is MIN)
        out = n.op("Where", [minus_one, n.op("Sub", [zero, a]), out])
    return n.op("Where", [zero_divisor, zero, out], hint=s.results[0])


def _rem(s: Step, n: Scope) -> Any:
    dt = _out(s, n)
    a, b = (n.get(o, dt) for o in s.operands)
    if dt in _INTS:  # fmod=0: the result takes the divisor's sign, as torch.remainder
        zero_divisor, _, safe = _safe_divisor(s, n, b, dt)  # a % -1 is a % 1: 0
        r = n.op("Mod", [a, safe], {"fmod": 0})
        if zero_divisor is None:
            return n.op("Identity", [r], hint=s.results[0])
        return n.op("Where", [zero_divisor, a, r], hint=s.results[0])
    # C's fmod (exact), then moved to the divisor's sign where they differ: Python's `%`
    # (`a - floor(a / b) * b` is NaN for an infinite b, and rounds).
    r = n.op("Mod", [a, b], {"fmod": 1})
    zero = n.const(0, dt)
    fix = n.op(
        "And",
        [
            n.op("Not", [n.op("Equal", [r, zero])]),
            n.op("Xor", [n.op("Less", [r, zero]), n.op("Less", [b, zero])]),
        ],
    )
    return n.op("Where", [fix, n.op("Add", [r, b]), r], hint=s.results[0])


def _convert(s: Step, n: Scope) -> Any:
    """Float to integer: NaN is 0, the rest truncated and saturated (ONNX's Cast leaves
    values out of range undefined: onnxruntime gives the smallest integer)."""
    src, dst = n.dtype(s.operands[0]), s.attributes["dtype"]
    x = n.get(s.operands[0])
    if dst not in _INTS or src not in FLOAT_BITS:
        return n.op("Identity", [n.cast(x, src, dst)], hint=s.results[0])
    compute, lo, top, smallest, largest = saturation(src, dst)
    w = n.cast(x, src, compute)
    low, high = n.const(lo, compute), n.const(top, compute)
    inside = n.op("And", [n.op("GreaterOrEqual", [w, low]), n.op("Less", [w, high])])
    kept = n.cast(n.op("Where", [inside, w, n.const(0.0, compute)]), compute, dst)
    under = n.op("Where", [n.op("Less", [w, low]), n.const(smallest, dst), kept])
    return n.op(
        "Where",
        [n.op("GreaterOrEqual", [w, high]), n.const(largest, dst), under],
        hint=s.results[0],
    )


def nan_through(n: Scope, x: Any, reduced: Any, dtype: str, axes: Any) -> Any:
    """``reduced`` (a ReduceMax or ReduceMin of float ``x`` over ``axes``) with NaN where a
    reduced element is NaN: onnxruntime's reductions skip NaN, torch's and XLA's do not."""
    nan = n.cast(n.op("IsNaN", [x]), "bool", dtype)
    seen = n.cast(n.op("ReduceMax", [nan, axes], {"keepdims": 0}), dtype, "bool")
    return n.op("Where", [seen, n.const(float("nan"), dtype), reduced])


RULES: dict[str, Callable[[Step, Scope], Any]] = {"div": _div, "rem": _rem, "convert": _convert}
"""The rules that replace ONNX's own operators (merged into linnet.lang.emit.onnx_rules.RULES)."""
