"""Elementwise typing: result dtypes and shapes of elementwise primitives (one rule per
primitive in :data:`TYPING_RULES`), constants, broadcasting and casts.

>>> TYPING_RULES["lt"].result("bf16"), TYPING_RULES["add"].result("bf16")
('bool', 'bf16')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import OPERATOR_SYMBOLS, EvaluatorBase, Frame, fail, shape_str
from linnet.lang.diagnostics.core import Span
from linnet.lang.ir import bits
from linnet.lang.ir.elementwise import SPELLINGS
from linnet.lang.ir.primitives import BINARY_FUNCTIONS, UNARY_FUNCTIONS, Primitive
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import POISON, Const, Poison, Tensor


@dataclass(frozen=True)
class TypingRule:
    """How the checker types one elementwise primitive, once its operands' common dtype is
    known (tensors promote, literals are weak: see :mod:`linnet.lang.tensors.dtypes`).

    ``check(dtype, args, span)`` raises the coded error for operands the primitive rejects;
    ``result(dtype)`` is the result's dtype; ``condition``: the first operand is a bool
    condition, outside the promotion (`select`); ``convert``: operands of another dtype are
    converted to the common one (logic takes bools as they are).
    """

    check: Callable[[str, list[Any], Span], None]
    result: Callable[[str], str]
    condition: bool = False
    convert: bool = True


def _same(dtype: str) -> str:
    return dtype


def _bool(dtype: str) -> str:
    return "bool"


def _any_dtype(dtype: str, args: list[Any], span: Span) -> None:
    """`==` and `!=` compare any two tensors of one dtype, bools too."""


def _no_bool(prim: str) -> Callable[[str, list[Any], Span], None]:
    def check(dtype: str, args: list[Any], span: Span) -> None:
        if dtype == "bool":
            raise fail(
                "E0355",
                f"cannot apply `{OPERATOR_SYMBOLS.get(prim, prim)}` to bool tensors",
                span,
                "bool operand",
                help="convert first: `(x as f32)`",
            )

    return check


def _floating(prim: str) -> Callable[[str, list[Any], Span], None]:
    no_bool = _no_bool(prim)

    def check(dtype: str, args: list[Any], span: Span) -> None:
        no_bool(dtype, args, span)
        # A generic dtype (`T`) is checked where it is bound, when lowering.
        if not DT.is_float(dtype) and DT.is_concrete(dtype):
            raise fail(
                "E0356",
                f"`{prim}` needs a floating-point operand, found {dtype}",
                span,
                f"{dtype} here",
                help="convert first: `(x as f32)`",
            )

    return check


def _logical(prim: str) -> Callable[[str, list[Any], Span], None]:
    def check(dtype: str, args: list[Any], span: Span) -> None:
        if dtype != "bool":
            raise fail(
                "E0354",
                f"`{OPERATOR_SYMBOLS.get(prim, prim)}` needs bool operands, found {dtype}",
                span,
                "not bool",
                help="compare values first (`a < b`)",
            )

    return check


def _select_condition(dtype: str, args: list[Any], span: Span) -> None:
    c = args[0]
    if isinstance(c, Tensor) and c.dtype != "bool":
        raise fail(
            "E0353",
            "the condition of `select` must be bool",
            span,
            f"this is {c.dtype}",
            help="compare something: `select(j <= p, a, b)`",
        )


def _arithmetic(prim: str) -> TypingRule:
    return TypingRule(_no_bool(prim), _same)


def _division(prim: str) -> TypingRule:
    """`/` and `%`: an integer divisor that is a constant zero is E0350 here, as it is when
    both operands are constants (at run time `a / 0` is 0 and `a % 0` is `a`:
    linnet.lang.ir.edges)."""
    no_bool = _no_bool(prim)

    def check(dtype: str, args: list[Any], span: Span) -> None:
        no_bool(dtype, args, span)
        divisor = args[1] if len(args) > 1 else None
        if (
            (DT.is_int(dtype) or dtype == "int")
            and isinstance(divisor, Const)
            and divisor.known
            and not isinstance(divisor.value, bool)
            and (divisor.value.exact if isinstance(divisor.value, Dim) else divisor.value) == 0
        ):
            raise fail(
                "E0350",
                f"integer `{OPERATOR_SYMBOLS.get(prim, prim)}` by a constant zero",
                span,
                "the divisor is 0 here",
                help="divide by a nonzero constant; where a divisor tensor holds 0 at "
                "run time, `a / 0` is 0 and `a % 0` is `a` (docs/language.md, "
                "edge values)",
            )

    return TypingRule(check, _same)


def _transcendental(prim: str) -> TypingRule:
    return TypingRule(_floating(prim), _same)


def _comparison(prim: str) -> TypingRule:
    return TypingRule(_no_bool(prim), _bool)


def _logic(prim: str) -> TypingRule:
    return TypingRule(_logical(prim), _bool, convert=False)


def _from_row(p: Primitive) -> TypingRule:
    """The typing of a row of linnet.lang.ir.elementwise: comparisons give bool, logic takes
    and gives bool, math on floats only unless the primitive's row allows integers."""
    if p.comparison:
        return _comparison(p.name)
    if p.logical:
        return _logic(p.name)
    return _arithmetic(p.name) if p.ints else _transcendental(p.name)


_BY_HAND: dict[str, TypingRule] = {
    # Floats only in the source, though a graph may hold them for integers (an integer's
    # floor is itself; `pow` folds integers exactly).
    "floor": _transcendental("floor"),
    "pow": _transcendental("pow"),
    "eq": TypingRule(_any_dtype, _bool),  # bools compare for equality too
    "ne": TypingRule(_any_dtype, _bool),
    "div": _division("div"),
    "rem": _division("rem"),
    "select": TypingRule(_select_condition, _same, condition=True),
}

TYPING_RULES: dict[str, TypingRule] = {
    name: _from_row(row.primitive) for name, row in SPELLINGS.items() if name not in _BY_HAND
} | _BY_HAND
"""The typing of each elementwise primitive: derived from its row for the elementwise math
of :data:`linnet.lang.ir.elementwise.SPELLINGS`, written here for the others and for those
whose source typing differs from their row."""

# Typed where the checker builds them, not from operand dtypes alone: `convert` by
# Typing.cast (its result is the `as` target, and every dtype converts to every other);
# `bitcast` by Typing.bitcast (its result is the `bitcast<T>` target, of the operand's width);
# `constant` by Typing.constant (the literal takes the dtype it meets); the others by index
# notation and the kernel builtins, whose result shapes come from the statement's labels and
# whose dtypes from the accumulator (check/indexing.py, reductions.py, binders.py,
# kernels.py); `slice` by Indexing.slice (its shape comes from the ranges).
EXPECTED_MISSING: frozenset[str] = frozenset(
    {
        "convert",
        "bitcast",
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
        # Made only by the reverse pass (linnet.lang.grad), never by source the checker types.
        "scatter_add",
        # Made only by the sharding pass (linnet.lang.passes.shard) on lowered graphs.
        "all_reduce",
        "all_gather",
    }
)


def _bitcast_help(src: str, dtype: str, literal: str | None) -> str:
    """How to fix a bitcast of ``src`` to ``dtype`` (``literal``: the operand's source text,
    where it is a number literal).

    >>> print(_bitcast_help("i32", "f16", "1"))
    give the literal a type of f16's width: `bitcast<f16>(1 as i16)`
    """
    if dtype == "bool":
        return "compare instead: `x != 0`"
    if src == "bool":
        return f"convert a bool with `as` instead: `c as {dtype}` is 1 or 0"
    if literal is not None:
        kin = [
            d
            for d, w in bits.WIDTHS.items()
            if w == bits.WIDTHS[dtype] and DT.is_int(d) == DT.is_int(src) and d != "bf16"
        ]
        if kin:
            text = literal if literal.replace(".", "").isdigit() else f"({literal})"
            return (
                f"give the literal a type of {dtype}'s width: "
                f"`bitcast<{dtype}>({text} as {kin[0]})`"
            )
    fits = " or ".join(bits.partners(src))
    return (
        f"{src}'s bits read as {fits} only (the same width); to convert the value: `x as {dtype}`"
    )


def _chosen(prim: str, args: list[Any]) -> Tensor | None:
    """`select(c, a, b)` with c a known constant (LongRoPE's `seq > original_max` where the
    prompt's length is a dim): the operand it picks, where that is a tensor of the result's
    shape, labels and element type; else None (the select is emitted). Generated PyTorch's
    `torch.where` takes no Python bool for its condition."""
    if prim != "select" or not isinstance(args[0], Const) or not args[0].known:
        return None
    picked, other = (args[1], args[2]) if args[0].value else (args[2], args[1])
    if not isinstance(picked, Tensor):
        return None
    if isinstance(other, Tensor):
        same = (other.shape, other.labels, other.dtype) == (
            picked.shape,
            picked.labels,
            picked.dtype,
        )
        return picked if same else None
    if isinstance(other, Const) and other.dtype == "float" and not DT.is_float(picked.dtype):
        return None  # a float literal would make the result f32
    return picked


class Typing(EvaluatorBase):
    """The Evaluator's typing (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def elementwise(
        self, prim: str, args: list[Any], span: Span, frame: Frame, labelled: bool = False
    ) -> Any:
        if any(isinstance(a, Poison) for a in args):
            return POISON
        for a in args:
            if not isinstance(a, Tensor | Const):
                raise fail(
                    "E0351",
                    f"cannot compute with {self.describe(a)}",
                    span,
                    "not a number or tensor",
                )
        if all(isinstance(a, Const) for a in args):
            return self.const_fold(prim, args, span)
        chosen = _chosen(prim, args)
        if chosen is not None:
            return chosen
        tensors = [a for a in args if isinstance(a, Tensor)]
        # Types: tensors promote, literals are weak.
        rule = TYPING_RULES[prim]
        operand_args = args[1:] if rule.condition else args
        dtype = None
        for a in operand_args:
            if isinstance(a, Tensor):
                if dtype is None:
                    dtype = a.dtype
                else:
                    p = DT.promote(dtype, a.dtype)
                    if p is None:
                        raise fail(
                            "E0352",
                            f"cannot mix element types `{dtype}` and `{a.dtype}`",
                            span,
                            "mixed here",
                            help=f"convert one explicitly: `(...) as {dtype}`",
                        )
                    dtype = p
        if dtype is None:  # select(tensor_cond, const, const)
            dtype = (
                "f32" if any(isinstance(a, Const) and a.dtype == "float" for a in args) else "i32"
            )
        if any(isinstance(a, Const) and a.dtype == "float" for a in operand_args) and (
            DT.is_int(dtype) or dtype == "bool"
        ):
            dtype = "f32"
        rule.check(dtype, args, span)
        result_dtype = rule.result(dtype)
        # Convert tensors whose dtype differs from the common one.
        operands: list[Tensor] = []
        for i, a in enumerate(args):
            want = "bool" if (rule.condition and i == 0) else dtype
            if isinstance(a, Tensor):
                if a.dtype != want and rule.convert:
                    a = self.builder.emit(
                        "convert",
                        [a.ref],
                        a.shape,
                        want,
                        {"dtype": want},
                        span=span,
                        labels=a.labels,
                    )
                operands.append(a)
            else:
                operands.append(self.constant(a, want, span))
        if labelled or any(t.labels for t in tensors):
            union = self.union_labels([t for t in operands if t.labels is not None], frame)
            aligned = [self.align(t, union, span) for t in operands]
            shape = tuple(self.label_dim(frame, lab) for lab in union)
            return self.builder.emit(
                prim, [t.ref for t in aligned], shape, result_dtype, span=span, labels=union
            )
        shape = self.broadcast_shapes([t.shape for t in operands], span)
        return self.builder.emit(prim, [t.ref for t in operands], shape, result_dtype, span=span)

    def constant(self, c: Const, dtype: str, span: Span, labels: tuple = ()) -> Tensor:
        if not DT.is_concrete(dtype):  # a generic dtype in the checker: any literal fits
            return Tensor("%?", (), dtype, labels=labels)
        value = c.value
        if isinstance(value, Dim):
            if value.value is None and self.lowering:
                raise fail("E0357", "this constant is not known when lowering", span)
            value = value.value if value.value is not None else 0
        if value is None:
            value = 0.0
        if DT.is_float(dtype):
            value = float(value)
        elif dtype == "bool":
            value = bool(value)
        else:
            if isinstance(value, float) and not value.is_integer():
                raise fail(
                    "E0358",
                    f"{value} is not an integer",
                    span,
                    "fractional constant",
                    help="use an integer here, or convert the tensor to a float type",
                )
            value = int(value)
        return self.builder.emit(
            "constant", [], (), dtype, {"value": value, "dtype": dtype}, span=span, labels=labels
        )

    def broadcast_shapes(self, shapes: list[tuple[Dim, ...]], span: Span) -> tuple[Dim, ...]:
        rank = max(len(s) for s in shapes)
        nonscalar = [s for s in shapes if len(s) > 0]
        if any(len(s) != rank for s in nonscalar):
            raise fail(
                "E0360",
                "shapes of different rank: " + " and ".join(shape_str(s) for s in nonscalar),
                span,
                "ranks differ",
                help="use index notation to say how axes line up: `let y[r, c] = a[r, c] + b[c]`",
            )
        out = []
        for axis in range(rank):
            dims = {s[axis] for s in nonscalar} - {Dim.const(1)}
            if len(dims) > 1:
                raise fail(
                    "E0361",
                    "shape mismatch: "
                    + " and ".join(shape_str(s) for s in nonscalar)
                    + f" differ at axis {axis}",
                    span,
                    "shapes differ",
                    help="operands of an elementwise operation must have the "
                    "same shape; use index notation to broadcast or transpose",
                )
            out.append(dims.pop() if dims else Dim.const(1))
        return tuple(out)

    def cast(self, v: Any, expr: A.Cast, frame: Frame) -> Any:
        dtype = self.eval_dtype(expr.dtype, frame)
        if isinstance(v, Poison):
            return v
        if isinstance(v, Const):
            return self.const_fold("convert", [v], expr.span, {"dtype": dtype})
        if not isinstance(v, Tensor):
            raise fail("E0362", f"cannot convert {self.describe(v)}", expr.span)
        if v.dtype == dtype:
            return v
        return self.builder.emit(
            "convert", [v.ref], v.shape, dtype, {"dtype": dtype}, span=expr.span, labels=v.labels
        )

    def bitcast(self, args: list[Any], expr: A.Call, frame: Frame) -> Any:
        """`bitcast<T>(x)`: x's bits read as element type T, of x's width (E0691 otherwise).
        A number literal is read as i32 (a float one as f32), as nowhere else gives it a
        type; a generic dtype is checked where it is bound, when lowering."""
        if len(args) != 1:
            raise fail(
                "E0371",
                f"`bitcast` takes 1 argument, got {len(args)}",
                expr.span,
                "wrong number of arguments",
            )
        if len(expr.generic_args) != 1:
            raise fail(
                "E0691",
                "`bitcast` needs the one element type to read the bits as",
                expr.span,
                "no target type" if not expr.generic_args else "more than one type",
                help="name it: `bitcast<f32>(bits)`",
            )
        g = expr.generic_args[0]
        name = g.name if isinstance(g, A.Name | A.ScalarType) else ""
        dtype = self.eval_dtype(A.Name(name, g.span), frame)
        (v,) = args
        if isinstance(v, Poison):
            return v
        if not isinstance(v, Tensor | Const):
            raise fail("E0351", f"cannot bitcast {self.describe(v)}", expr.args[0].span)
        src = bits.WEAK.get(v.dtype, v.dtype) if isinstance(v, Const) else v.dtype
        why = bits.problem(src, dtype) if DT.is_concrete(src) and DT.is_concrete(dtype) else None
        if why is not None:
            literal = isinstance(v, Const) and src != v.dtype
            raise fail(
                "E0691",
                f"cannot bitcast {src} to {dtype}: {why}",
                expr.span,
                f"a number literal, read as {src}" if literal else f"the operand is {src}",
                help=_bitcast_help(src, dtype, self.src(expr.args[0]) if literal else None),
            )
        if isinstance(v, Const):
            return self.const_fold("bitcast", [v], expr.span, {"dtype": dtype})
        if v.dtype == dtype:
            return v
        return self.builder.emit(
            "bitcast", [v.ref], v.shape, dtype, {"dtype": dtype}, span=expr.span, labels=v.labels
        )

    def builtin_elementwise(
        self, name: str, args: list[Any], expr: A.Call, frame: Frame, labelled: bool
    ) -> Any:
        want = 1 if name in UNARY_FUNCTIONS else (3 if name == "select" else 2)
        if len(args) != want:
            raise fail(
                "E0371",
                f"`{name}` takes {want} argument{'s' if want > 1 else ''}, got {len(args)}",
                expr.span,
                "wrong number of arguments",
            )
        prim = BINARY_FUNCTIONS.get(name, name)
        return self.elementwise(prim, args, expr.span, frame, labelled=labelled)
