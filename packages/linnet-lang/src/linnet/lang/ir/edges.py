"""What each primitive gives at edge values: one rule per case, shared by every runtime.

docs/language.md ("Edge values") states the rules; this module is their one definition in
code. The interpreter (``linnet.torch.interpreter``), the emitters (PyTorch, JAX, ONNX,
StableHLO) and constant folding (:mod:`linnet.lang.check.folding`) each implement them, and
the conformance suite's ``edges`` cases (``linnet.torch.conformance``) run every runtime on
the values below and compare them with the interpreter.

* ``max``/``min`` (elementwise and the reductions) propagate NaN, as ``torch.maximum``,
  ``jnp.maximum`` and IEEE 754-2019's ``maximum`` do (onnxruntime's ``ReduceMax`` does not:
  the ONNX emitter adds the NaN back).
* Float to integer (``x as i32``): NaN is 0; other values are truncated toward zero and
  saturate at the type's ends (``inf as i32`` is 2147483647, ``-300.0 as u8`` is 0): what
  XLA does; C, PyTorch and ONNX leave it undefined. Integer to a narrower integer wraps
  (two's complement), as every runtime does.
* ``floor`` is IEEE's: -1 for every x in (-1, 0), subnormals included (XLA's CPU flushes
  subnormals to zero, so the JAX and StableHLO emitters read the sign from the bits).
* Integer ``/`` rounds toward -inf and ``%`` takes the divisor's sign; by zero, ``a / 0`` is 0
  and ``a % 0`` is ``a``, so that ``a == (a / b) * b + a % b`` holds for every b; the most
  negative value divided by -1 wraps to itself (its remainder is 0). A divisor that is a
  constant zero is error E0350 when the model is checked.
* Float ``%`` is Python's ``math.fmod`` moved to the divisor's sign: ``x % 0.0`` is NaN,
  ``-5.5 % inf`` is inf.

>>> int_div(7, 0), int_rem(7, 0), int_div(-7, 2), int_rem(-7, 2)
(0, 7, -4, 1)
>>> float_to_int(float("nan"), "i32"), float_to_int(float("inf"), "i32"), float_to_int(-2.7, "u8")
(0, 2147483647, 0)
"""

from __future__ import annotations

import math
from typing import Any

INT_RANGES: dict[str, tuple[int, int]] = {
    "i8": (-(2**7), 2**7 - 1),
    "i16": (-(2**15), 2**15 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u8": (0, 255),
}
"""The smallest and largest value of each integer dtype."""

FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
"""Each float dtype's width: the signed integer a value is bitcast to (floor's sign test)."""


def wrap_int(value: int, dtype: str) -> int:
    """``value`` wrapped into ``dtype`` (two's complement), as an integer narrows.

    >>> wrap_int(300, "i8"), wrap_int(-1, "u8"), wrap_int(2 ** 31, "i32")
    (44, 255, -2147483648)
    """
    lo, hi = INT_RANGES[dtype]
    span = hi - lo + 1
    return (value - lo) % span + lo


def int_div(a: int, b: int, dtype: str | None = None) -> int:
    """Integer ``a / b``: rounded toward -inf; 0 when ``b`` is 0; wrapped into ``dtype``
    (``MIN / -1`` is ``MIN``).

    >>> int_div(-7, 2), int_div(5, 0), int_div(-2 ** 31, -1, "i32")
    (-4, 0, -2147483648)
    """
    if b == 0:
        return 0
    q = a // b
    return wrap_int(q, dtype) if dtype in INT_RANGES else q


def int_rem(a: int, b: int) -> int:
    """Integer ``a % b``: the divisor's sign; ``a`` when ``b`` is 0.

    >>> int_rem(-7, 2), int_rem(7, -2), int_rem(7, 0)
    (1, -1, 7)
    """
    return a if b == 0 else a % b


def float_rem(a: float, b: float) -> float:
    """Float ``a % b``: ``math.fmod`` (exact) moved to the divisor's sign; NaN for ``b == 0``
    or an infinite ``a``.

    >>> float_rem(-7.5, 2.0), float_rem(5.5, float("inf")), float_rem(-5.5, float("inf"))
    (0.5, 5.5, inf)
    """
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    r = math.fmod(a, b)
    if r != 0 and (r < 0) != (b < 0):
        r += b
    return r


def float_to_int(x: float, dtype: str) -> int:
    """``x as dtype`` for a float ``x``: NaN is 0, else truncated toward zero and clamped to
    the dtype's range.

    >>> float_to_int(3e9, "i32"), float_to_int(-1e20, "i64"), float_to_int(-2.7, "i8")
    (2147483647, -9223372036854775808, -2)
    """
    lo, hi = INT_RANGES[dtype]
    if math.isnan(x):
        return 0
    if x >= hi + 1:
        return hi
    if x < lo:
        return lo
    return max(lo, min(hi, int(x)))


def saturation(src: str, dst: str) -> tuple[str, float, float, int, int]:
    """How an emitter converts float dtype ``src`` to integer dtype ``dst``:
    ``(compute, lo, top, smallest, largest)``. Values ``lo <= x < top`` (``compute`` holds
    both ends exactly: f32 at least) convert by truncation; at or past ``top`` they give
    ``largest``, below ``lo`` ``smallest``, NaN 0.

    >>> saturation("bf16", "i32")
    ('f32', -2147483648.0, 2147483648.0, -2147483648, 2147483647)
    """
    lo, hi = INT_RANGES[dst]
    compute = "f64" if src == "f64" else "f32"  # 2**63 is exact in f32; 2**31 is not in f16
    return compute, float(lo), float(hi + 1), lo, hi


def nan_extreme(a: Any, b: Any, kind: str) -> Any:
    """``max(a, b)`` (``kind`` "max") or ``min``, NaN if either is NaN (Python's ``max``
    depends on the order of its arguments).

    >>> nan_extreme(float("nan"), 1.0, "max"), nan_extreme(1.0, float("nan"), "min")
    (nan, nan)
    """
    for v in (a, b):
        if isinstance(v, float) and math.isnan(v):
            return math.nan
    return max(a, b) if kind == "max" else min(a, b)


def floor(x: float) -> float:
    """IEEE floor of a float: ``floor(-1e-45)`` is -1.0, ``floor(-0.0)`` is -0.0, infinities
    and NaN are themselves.

    >>> floor(-1e-45), floor(-0.0), floor(float("inf"))
    (-1.0, -0.0, inf)
    """
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    return float(math.floor(x))


def constant_of(graph: Any, ref: str, producers: dict[str, int] | None = None) -> Any:
    """The value of ``ref`` when a ``constant`` step makes it (a literal), else None: an
    emitter leaves out the division-by-zero guard for a known nonzero divisor.
    ``producers``: ``graph.producers()``, where the caller keeps it.

    >>> from linnet.lang.ir.graph import Graph, Step
    >>> g = Graph("e", "m", steps=[Step("constant", [], ["%c"], {"value": 4, "dtype": "i32"})])
    >>> constant_of(g, "%c"), constant_of(g, "%x")
    (4, None)
    """
    at = (graph.producers() if producers is None else producers).get(ref)
    if at is None or graph.steps[at].op != "constant":
        return None
    return graph.steps[at].attributes.get("value")


def nonzero_constant(graph: Any, ref: str, producers: dict[str, int] | None = None) -> bool:
    """Whether ``ref`` is a constant other than 0 (a division by it needs no guard).

    >>> from linnet.lang.ir.graph import Graph, Step
    >>> g = Graph("e", "m", steps=[Step("constant", [], ["%c"], {"value": 4, "dtype": "i32"})])
    >>> nonzero_constant(g, "%c"), nonzero_constant(g, "%x")
    (True, False)
    """
    value = constant_of(graph, ref, producers)
    return isinstance(value, int | float) and value != 0
