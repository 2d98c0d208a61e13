"""Constant folding of compile-time scalars: one rule per primitive in :data:`FOLDING_RULES`.

A rule takes the operands (:class:`~linnet.lang.tensors.values.Const`), the span to blame and
the step's attributes (``{"dtype": ...}`` for ``convert``), and returns the folded constant:

>>> from linnet.lang.tensors.dims import Dim
>>> from linnet.lang.tensors.values import Const
>>> FOLDING_RULES["add"]([Const(Dim.const(2), "int"), Const(Dim.const(3), "int")], None, {})
Const(value=Dim(5), dtype='int')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import linnet.lang.ir.edges as E
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import EvaluatorBase, fail
from linnet.lang.diagnostics.core import Span
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const

FoldRule = Callable[[list[Const], Span | None, dict[str, Any]], Const]


def _divides_by_zero(span: Span | None) -> Exception:
    return fail("E0350", "constant arithmetic divides by zero", span, "the divisor is 0 here")


def _rule(exact: Callable[..., Any], *, on_ints: Callable[..., Any] | None = None,
          symbolic: Callable[..., Dim] | None = None, boolean: bool = False,
          real: bool = False) -> FoldRule:
    """A folding rule for a scalar primitive.

    ``exact`` computes on known Python values; ``on_ints`` instead when every operand is an
    integer (integer division); ``symbolic`` on dims some of which are symbols (`N + 1`);
    ``boolean`` for a bool result (comparisons, logic); ``real`` when the result of integer
    operands is still a float (`exp(1)`).
    """
    def fold(args: list[Const], span: Span | None, attrs: dict[str, Any]) -> Const:
        if symbolic is not None and all(isinstance(a.value, Dim) for a in args) and \
                any(not a.known for a in args):
            try:
                return Const(symbolic(*(a.value for a in args)), "int")
            except ZeroDivisionError:
                raise _divides_by_zero(span) from None
        if any(not a.known for a in args):
            kind = "bool" if boolean else (
                "int" if all(a.dtype == "int" for a in args) else "float")
            return Const(Dim.symbol(f"?{id(span)}") if kind == "int" else None, kind)
        vals = [a.value.exact if isinstance(a.value, Dim) else a.value for a in args]
        ints = all(a.dtype in ("int", *DT.INTS) for a in args)
        fn = on_ints if ints and on_ints is not None else exact
        try:
            out = fn(*vals)
        except ZeroDivisionError:
            raise _divides_by_zero(span) from None
        except (ValueError, OverflowError) as exc:
            raise fail("E0350", f"constant arithmetic fails: {exc}", span, "here") from None
        if isinstance(out, bool):
            return Const(out, "bool")
        if ints and not real:
            return Const(Dim.const(int(out)), "int")
        return Const(float(out), "float")
    return fold


def _fold_select(args: list[Const], span: Span | None, attrs: dict[str, Any]) -> Const:
    # A condition unknown in the checker picks the first branch: both have been checked.
    c, x, y = args
    if c.known:
        return x if c.value else y
    return x


def _fold_convert(args: list[Const], span: Span | None, attrs: dict[str, Any]) -> Const:
    (v,), dtype = args, attrs["dtype"]
    if not v.known:
        return Const(v.value, dtype)
    if dtype == "bool":
        return Const(bool(v.value if not isinstance(v.value, Dim) else v.value.value), "bool")
    if DT.is_float(dtype):
        fx: Any = v.value.exact if isinstance(v.value, Dim) else v.value
        return Const(float(fx), dtype)
    # The runtimes' rules (linnet.lang.ir.edges): a float saturates (NaN is 0), an integer
    # wraps into a narrower type.
    if isinstance(v.value, float):
        return Const(Dim.const(E.float_to_int(v.value, dtype if dtype in E.INT_RANGES
                                              else "i64")), dtype)
    raw: Any = v.value.value if isinstance(v.value, Dim) else v.value  # known: not None
    ix = int(raw)
    return Const(Dim.const(E.wrap_int(ix, dtype) if dtype in E.INT_RANGES else ix), dtype)


FOLDING_RULES: dict[str, FoldRule] = {
    "neg": _rule(lambda x: -x, symbolic=lambda x: -x),
    "not": _rule(lambda x: not x, boolean=True),
    "exp": _rule(math.exp, real=True),
    "log": _rule(math.log, real=True),
    "sqrt": _rule(math.sqrt, real=True),
    "rsqrt": _rule(lambda x: 1 / math.sqrt(x), real=True),
    "sin": _rule(math.sin, real=True),
    "cos": _rule(math.cos, real=True),
    "tanh": _rule(math.tanh, real=True),
    "sigmoid": _rule(lambda x: 1 / (1 + math.exp(-x)), real=True),
    "erf": _rule(math.erf, real=True),
    "abs": _rule(abs),
    "floor": _rule(E.floor, on_ints=lambda x: x),
    "add": _rule(lambda x, y: x + y, symbolic=lambda x, y: x + y),
    "sub": _rule(lambda x, y: x - y, symbolic=lambda x, y: x - y),
    "mul": _rule(lambda x, y: x * y, symbolic=lambda x, y: x * y),
    "div": _rule(lambda x, y: float(x) / float(y), on_ints=lambda x, y: x // y,
                 symbolic=lambda x, y: x / y),
    "rem": _rule(lambda x, y: x % y),
    "pow": _rule(lambda x, y: x ** y),
    "maximum": _rule(lambda x, y: E.nan_extreme(x, y, "max")),  # NaN propagates
    "minimum": _rule(lambda x, y: E.nan_extreme(x, y, "min")),
    "lt": _rule(lambda x, y: x < y, boolean=True),
    "le": _rule(lambda x, y: x <= y, boolean=True),
    "gt": _rule(lambda x, y: x > y, boolean=True),
    "ge": _rule(lambda x, y: x >= y, boolean=True),
    "eq": _rule(lambda x, y: x == y, boolean=True),
    "ne": _rule(lambda x, y: x != y, boolean=True),
    "and": _rule(lambda x, y: bool(x and y), boolean=True),
    "or": _rule(lambda x, y: bool(x or y), boolean=True),
    "select": _fold_select,
    "convert": _fold_convert,
}

# Compile-time scalars are rank 0 and only ever meet elementwise primitives: the checker
# never folds a constant tensor, an iota, a shape change, a reduction, a gather or a state
# write (those are only emitted for tensors).
EXPECTED_MISSING: frozenset[str] = frozenset({
    "constant", "iota", "reshape", "transpose", "broadcast", "reduce", "contract", "take",
    "gather", "scatter", "slice",
    "scatter_add",  # made only by the reverse pass (linnet.lang.grad), on tensors
    "all_reduce", "all_gather",  # made only by the sharding pass (linnet.lang.ir.shard)
})


class Folding(EvaluatorBase):
    """The Evaluator's folding (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def const_fold(self, prim: str, args: list[Const], span: Span,
                   attrs: dict[str, Any] | None = None) -> Const:
        """Fold ``prim`` over compile-time scalars by its row of :data:`FOLDING_RULES`."""
        return FOLDING_RULES[prim](args, span, attrs or {})
