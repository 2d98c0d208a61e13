"""The StableHLO emitter's rules where StableHLO's operations differ from Linnet at edge
values (:mod:`linnet.lang.ir.edges`): integer ``/`` and ``%`` (StableHLO truncates, and a
zero divisor gives XLA's -1 and the dividend), float-to-integer ``convert`` (implementation
defined out of range; explicit here so that every consumer, not only XLA, saturates) and
``floor`` (XLA's CPU flushes subnormals to zero: the sign is read off the bits).

Each rule takes the step and the emitter's :class:`~linnet.lang.emit.stablehlo.Scope` and
returns the result's SSA name, as the rules of :data:`linnet.lang.emit.stablehlo_rules.RULES` do.

>>> sorted(RULES)
['convert', 'div', 'floor', 'rem']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from linnet.lang.ir.edges import FLOAT_BITS, INT_RANGES, nonzero_constant, saturation
from linnet.lang.ir.graph import Graph, Step


class Scope(Protocol):
    """What these rules use of :class:`linnet.lang.emit.stablehlo.Scope` (the emitter imports
    this module: a type of its own keeps the two modules out of an import cycle)."""

    graph: Graph
    types: dict[str, tuple[tuple[int, ...], str]]

    def op(self, *args: Any, **kwargs: Any) -> Any: ...
    def const(self, *args: Any, **kwargs: Any) -> Any: ...
    def get(self, *args: Any, **kwargs: Any) -> Any: ...
    def broadcast(self, *args: Any, **kwargs: Any) -> Any: ...
    def coerce(self, *args: Any, **kwargs: Any) -> Any: ...


_INTS = set(INT_RANGES)


def _res(s: Step, n: Scope) -> tuple[tuple[int, ...], str]:
    v = n.graph.values[s.results[0]]
    return v.shape, v.dtype


def compare(n: Scope, a: str, b: str, direction: str) -> str:
    """``stablehlo.compare`` of two values of one type (``direction``: EQ, LT, ...)."""
    shape, dt = n.types[a]
    kind = "FLOAT" if dt in FLOAT_BITS else "UNSIGNED" if dt in ("u8", "bool") else "SIGNED"
    return n.op(
        "stablehlo.compare",
        [a, b],
        shape,
        "bool",
        f"comparison_direction = #stablehlo<comparison_direction {direction}>, "
        f"compare_type = #stablehlo<comparison_type {kind}>",
    )


def _full(n: Scope, value: Any, dt: str, shape: Any) -> str:
    return n.broadcast(n.const(value, dt), shape) if shape else n.const(value, dt)


def _logic(n: Scope, op: str, a: str, b: str) -> str:
    return n.op(f"stablehlo.{op}", [a, b], n.types[a][0], "bool")


def _select(n: Scope, c: str, a: str, b: str, hint: str = "") -> str:
    shape, dt = n.types[a]
    return n.op("stablehlo.select", [c, a, b], shape, dt, hint=hint)


def _safe_divisor(s: Step, n: Scope, b: str) -> tuple[str | None, str]:
    """``(zero, divisor)``: where the divisor is 0 (None for a nonzero constant) and the
    divisor with 1 there."""
    if nonzero_constant(n.graph, s.operands[1]):
        return None, b
    shape, dt = n.types[b]
    zero = compare(n, b, _full(n, 0, dt, shape), "EQ")
    return zero, _select(n, zero, _full(n, 1, dt, shape), b)


def _signs_differ(n: Scope, r: str, b: str) -> str:
    """Where remainder ``r`` is nonzero and its sign is not divisor ``b``'s."""
    shape, dt = n.types[r]
    zero = _full(n, 0, dt, shape)
    return _logic(
        n,
        "and",
        compare(n, r, zero, "NE"),
        _logic(n, "xor", compare(n, r, zero, "LT"), compare(n, b, zero, "LT")),
    )


def _div(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    a, b = (n.get(o, dt, shape) for o in s.operands)
    if dt not in _INTS:
        return n.op("stablehlo.divide", [a, b], shape, dt, hint=s.results[0])
    zero_divisor, b = _safe_divisor(s, n, b)
    # StableHLO's integer divide truncates; Linnet's rounds toward -inf: one less where the
    # remainder is nonzero and the operands' signs differ.
    q = n.op("stablehlo.divide", [a, b], shape, dt)
    r = n.op("stablehlo.remainder", [a, b], shape, dt)
    one = n.op("stablehlo.convert", [_signs_differ(n, r, b)], shape, dt)
    floored = n.op(
        "stablehlo.subtract", [q, one], shape, dt, hint="" if zero_divisor else s.results[0]
    )
    if zero_divisor is None:
        return floored
    return _select(n, zero_divisor, _full(n, 0, dt, shape), floored, s.results[0])


def _rem(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    a, b = (n.get(o, dt, shape) for o in s.operands)
    zero_divisor = None
    if dt in _INTS:
        zero_divisor, b = _safe_divisor(s, n, b)
    # StableHLO's remainder takes the dividend's sign; Linnet's the divisor's (Python, torch):
    # add the divisor where the remainder is nonzero and the signs differ.
    r = n.op("stablehlo.remainder", [a, b], shape, dt)
    moved = n.op("stablehlo.add", [r, b], shape, dt)
    out = _select(n, _signs_differ(n, r, b), moved, r, "" if zero_divisor else s.results[0])
    if zero_divisor is None:
        return out
    return _select(n, zero_divisor, a, out, s.results[0])


def _convert(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    x = n.get(s.operands[0])
    src = n.types[x][1]
    if src in FLOAT_BITS and dt == "bool":  # nonzero is true, as torch's .to(torch.bool)
        return n.op(
            "stablehlo.compare",
            [x, _full(n, 0.0, src, shape)],
            shape,
            "bool",
            "comparison_direction = #stablehlo<comparison_direction NE>, "
            "compare_type = #stablehlo<comparison_type FLOAT>",
            hint=s.results[0],
        )
    if src not in FLOAT_BITS or dt not in _INTS:
        return n.op("stablehlo.convert", [x], shape, dt, hint=s.results[0])
    # Float to integer: NaN is 0, the rest truncated and saturated at the type's ends.
    compute, lo, top, smallest, largest = saturation(src, dt)
    w = n.coerce(x, compute)
    low, high = _full(n, lo, compute, shape), _full(n, top, compute, shape)
    inside = _logic(n, "and", compare(n, w, low, "GE"), compare(n, w, high, "LT"))
    kept = n.op(
        "stablehlo.convert", [_select(n, inside, w, _full(n, 0.0, compute, shape))], shape, dt
    )
    under = _select(n, compare(n, w, low, "LT"), _full(n, smallest, dt, shape), kept)
    return _select(n, compare(n, w, high, "GE"), _full(n, largest, dt, shape), under, s.results[0])


def _floor(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    x = n.get(s.operands[0], dt, shape)
    if dt in _INTS:  # an integer is its own floor
        return x
    floored = n.op("stablehlo.floor", [x], shape, dt)
    # A subnormal below zero floors to -1; XLA's CPU reads it as -0.0 (flush to zero), so
    # the sign comes from the bits: negative and not -0.0, with a floor of 0.
    bits = f"i{FLOAT_BITS[dt]}"
    word = n.op("stablehlo.bitcast_convert", [x], shape, bits)
    below = _logic(
        n,
        "and",
        compare(n, word, _full(n, 0, bits, shape), "LT"),
        compare(n, word, _full(n, -(2 ** (FLOAT_BITS[dt] - 1)), bits, shape), "NE"),
    )
    tiny = _logic(n, "and", below, compare(n, floored, _full(n, 0.0, dt, shape), "EQ"))
    return _select(n, tiny, _full(n, -1.0, dt, shape), floored, s.results[0])


RULES: dict[str, Callable[[Step, Scope], Any]] = {
    "div": _div,
    "rem": _rem,
    "convert": _convert,
    "floor": _floor,
}
"""The rules that replace StableHLO's own operations (in linnet.lang.emit.stablehlo_rules.RULES)."""
