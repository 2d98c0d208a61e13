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
from linnet.lang.ir import bits
from linnet.lang.ir.elementwise import SPELLINGS, compiled, spelled
from linnet.lang.ir.primitives import Primitive
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const

FoldRule = Callable[[list[Const], Span | None, dict[str, Any]], Const]


def _divides_by_zero(span: Span | None) -> Exception:
    return fail("E0350", "constant arithmetic divides by zero", span, "the divisor is 0 here")


def _rule(
    exact: Callable[..., Any],
    *,
    on_ints: Callable[..., Any] | None = None,
    symbolic: Callable[..., Dim] | None = None,
    boolean: bool = False,
    real: bool = False,
) -> FoldRule:
    """A folding rule for a scalar primitive.

    ``exact`` computes on known Python values; ``on_ints`` instead when every operand is an
    integer (integer division); ``symbolic`` on dims some of which are symbols (`N + 1`);
    ``boolean`` for a bool result (comparisons, logic); ``real`` when the result of integer
    operands is still a float (`exp(1)`).
    """

    def fold(args: list[Const], span: Span | None, attrs: dict[str, Any]) -> Const:
        if (
            symbolic is not None
            and all(isinstance(a.value, Dim) for a in args)
            and any(not a.known for a in args)
        ):
            try:
                return Const(symbolic(*(a.value for a in args)), "int")
            except ZeroDivisionError:
                raise _divides_by_zero(span) from None
        if any(not a.known for a in args):
            kind = (
                "bool" if boolean else ("int" if all(a.dtype == "int" for a in args) else "float")
            )
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
        return Const(
            Dim.const(E.float_to_int(v.value, dtype if dtype in E.INT_RANGES else "i64")), dtype
        )
    raw: Any = v.value.value if isinstance(v.value, Dim) else v.value  # known: not None
    ix = int(raw)
    return Const(Dim.const(E.wrap_int(ix, dtype) if dtype in E.INT_RANGES else ix), dtype)


def _fold_bitcast(args: list[Const], span: Span | None, attrs: dict[str, Any]) -> Const:
    """The bits of a compile-time scalar read as ``attrs["dtype"]`` (the checker has made sure
    the widths agree; a literal is read as i32 or f32, :data:`linnet.lang.ir.bits.WEAK`)."""
    (v,), dtype = args, attrs["dtype"]
    if not v.known or not DT.is_concrete(dtype):
        return Const(Dim.symbol(f"?{id(span)}") if DT.is_int(dtype) else None, dtype)
    src = bits.WEAK.get(v.dtype, v.dtype)
    raw: Any = v.value.exact if isinstance(v.value, Dim) else v.value
    out = bits.bitcast_scalar(raw, src, dtype)
    return Const(Dim.const(int(out)), dtype) if DT.is_int(dtype) else Const(float(out), dtype)


def _spelled(text: str, p: Primitive) -> FoldRule:
    """A rule from the ``python`` column of linnet.lang.ir.elementwise: a bool result for
    comparisons and logic, a float for float-only math of integers (`exp(1)`), and the same
    text on symbolic dims where the row says so (`N + 1`)."""
    exact = compiled(text, p.arity or 0, {"math": math})
    return _rule(
        exact,
        symbolic=exact if SPELLINGS[p.name].dims else None,
        boolean=p.bool_result,
        real=not p.ints,
    )


FOLDING_RULES: dict[str, FoldRule] = spelled(
    "python",
    _spelled,
    {
        "floor": _rule(E.floor, on_ints=lambda x: x),
        "div": _rule(
            lambda x, y: float(x) / float(y),
            on_ints=lambda x, y: x // y,
            symbolic=lambda x, y: x / y,
        ),
        "rem": _rule(lambda x, y: x % y),
        "maximum": _rule(lambda x, y: E.nan_extreme(x, y, "max")),  # NaN propagates
        "minimum": _rule(lambda x, y: E.nan_extreme(x, y, "min")),
        "select": _fold_select,
        "convert": _fold_convert,
        "bitcast": _fold_bitcast,
    },
)
"""The elementwise math spelled in :data:`linnet.lang.ir.elementwise.SPELLINGS` (its
``python`` column), and the rules written here."""

# Compile-time scalars are rank 0 and only ever meet elementwise primitives: the checker
# never folds a constant tensor, an iota, a shape change, a reduction, a gather or a state
# write (those are only emitted for tensors).
EXPECTED_MISSING: frozenset[str] = frozenset(
    {
        "constant",
        "iota",
        "reshape",
        "transpose",
        "broadcast",
        "reduce",
        "contract",
        "take",
        "gather",
        "scatter",
        "slice",
        "scatter_add",  # made only by the reverse pass (linnet.lang.grad), on tensors
        "all_reduce",
        "all_gather",  # made only by the sharding pass (linnet.lang.passes.shard)
    }
)


class Folding(EvaluatorBase):
    """The Evaluator's folding (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def const_fold(
        self, prim: str, args: list[Const], span: Span, attrs: dict[str, Any] | None = None
    ) -> Const:
        """Fold ``prim`` over compile-time scalars by its row of :data:`FOLDING_RULES`."""
        return FOLDING_RULES[prim](args, span, attrs or {})
