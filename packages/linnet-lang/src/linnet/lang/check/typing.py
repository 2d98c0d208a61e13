"""Elementwise typing: result dtypes and shapes of elementwise primitives, constants,
broadcasting and casts."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import OPERATOR_SYMBOLS, EvaluatorBase, Frame, fail, shape_str
from linnet.lang.diagnostics.core import Span
from linnet.lang.ir.primitives import BINARY_FUNCTIONS, COMPARISON_PRIMITIVES, UNARY_FUNCTIONS
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import POISON, Const, Poison, Tensor


class Typing(EvaluatorBase):
    """The Evaluator's typing (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def elementwise(self, prim: str, args: list[Any], span: Span, frame: Frame,
                    labelled: bool = False) -> Any:
        if any(isinstance(a, Poison) for a in args):
            return POISON
        for a in args:
            if not isinstance(a, Tensor | Const):
                raise fail("E0351", f"cannot compute with {self.describe(a)}", span,
                           "not a number or tensor")
        if all(isinstance(a, Const) for a in args):
            if prim == "select":
                c, x, y = args
                if c.known:
                    return x if c.value else y
                return x
            return self.const_fold(prim, args, span)
        tensors = [a for a in args if isinstance(a, Tensor)]
        # Types: tensors promote, literals are weak.
        operand_args = args[1:] if prim == "select" else args
        dtype = None
        for a in operand_args:
            if isinstance(a, Tensor):
                if dtype is None:
                    dtype = a.dtype
                else:
                    p = DT.promote(dtype, a.dtype)
                    if p is None:
                        raise fail("E0352", f"cannot mix element types `{dtype}` and `{a.dtype}`",
                                   span, "mixed here",
                                   help=f"convert one explicitly: `(...) as {dtype}`")
                    dtype = p
        if dtype is None:  # select(tensor_cond, const, const)
            dtype = "f32" if any(isinstance(a, Const) and a.dtype == "float" for a in args) \
                else "i32"
        if any(isinstance(a, Const) and a.dtype == "float" for a in operand_args) and (
                DT.is_int(dtype) or dtype == "bool"):
            dtype = "f32"
        if prim == "select":
            c = args[0]
            if isinstance(c, Tensor) and c.dtype != "bool":
                raise fail("E0353", "the condition of `select` must be bool", span,
                           f"this is {c.dtype}", help="compare something: `select(j <= p, a, b)`")
        elif prim in ("and", "or", "not"):
            if dtype != "bool":
                raise fail("E0354", f"`{OPERATOR_SYMBOLS.get(prim, prim)}` needs bool operands, "
                           f"found {dtype}", span,
                           "not bool", help="compare values first (`a < b`)")
        elif dtype == "bool" and prim not in ("eq", "ne"):
            raise fail("E0355", f"cannot apply `{OPERATOR_SYMBOLS.get(prim, prim)}` to bool "
                       "tensors", span, "bool operand",
                       help="convert first: `(x as f32)`")
        elif prim in UNARY_FUNCTIONS | {"pow"} and not DT.is_float(dtype) and DT.is_concrete(
                dtype) and prim not in ("abs",):
            raise fail("E0356", f"`{prim}` needs a floating-point operand, found {dtype}", span,
                       f"{dtype} here", help="convert first: `(x as f32)`")
        result_dtype = "bool" if prim in COMPARISON_PRIMITIVES | {"and", "or", "not"} else dtype
        # Convert tensors whose dtype differs from the common one.
        operands: list[Tensor] = []
        for i, a in enumerate(args):
            want = "bool" if (prim == "select" and i == 0) else dtype
            if isinstance(a, Tensor):
                if a.dtype != want and prim not in ("and", "or", "not"):
                    a = self.builder.emit("convert", [a.ref], a.shape, want, {"dtype": want},
                                          span=span, labels=a.labels)
                operands.append(a)
            else:
                operands.append(self.constant(a, want, span))
        if labelled or any(t.labels for t in tensors):
            union = self.union_labels([t for t in operands if t.labels is not None], frame)
            aligned = [self.align(t, union, span) for t in operands]
            shape = tuple(self.label_dim(frame, lab) for lab in union)
            return self.builder.emit(prim, [t.ref for t in aligned], shape, result_dtype,
                                     span=span, labels=union)
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
                raise fail("E0358", f"{value} is not an integer", span, "fractional constant",
                           help="use an integer here, or convert the tensor to a float type")
            value = int(value)
        return self.builder.emit("constant", [], (), dtype, {"value": value, "dtype": dtype},
                                 span=span, labels=labels)

    def broadcast_shapes(self, shapes: list[tuple[Dim, ...]], span: Span) -> tuple[Dim, ...]:
        rank = max(len(s) for s in shapes)
        nonscalar = [s for s in shapes if len(s) > 0]
        if any(len(s) != rank for s in nonscalar):
            raise fail("E0360", "shapes of different rank: " + " and ".join(
                shape_str(s) for s in nonscalar), span, "ranks differ",
                help="use index notation to say how axes line up: `let y[r, c] = a[r, c] + "
                     "b[c]`")
        out = []
        for axis in range(rank):
            dims = {s[axis] for s in nonscalar} - {Dim.const(1)}
            if len(dims) > 1:
                raise fail("E0361", "shape mismatch: " + " and ".join(
                    shape_str(s) for s in nonscalar) + f" differ at axis {axis}", span,
                    "shapes differ", help="operands of an elementwise operation must have the "
                    "same shape; use index notation to broadcast or transpose")
            out.append(dims.pop() if dims else Dim.const(1))
        return tuple(out)

    def cast(self, v: Any, expr: A.Cast, frame: Frame) -> Any:
        dtype = self.eval_dtype(expr.dtype, frame)
        if isinstance(v, Poison):
            return v
        if isinstance(v, Const):
            if not v.known:
                return Const(v.value, dtype)
            if dtype == "bool":
                return Const(bool(v.value if not isinstance(v.value, Dim) else v.value.value),
                             "bool")
            if DT.is_float(dtype):
                fx: Any = v.value.exact if isinstance(v.value, Dim) else v.value
                return Const(float(fx), dtype)
            ix: Any = v.value.value if isinstance(v.value, Dim) else int(v.value)
            return Const(Dim.const(int(ix)), dtype)
        if not isinstance(v, Tensor):
            raise fail("E0362", f"cannot convert {self.describe(v)}", expr.span)
        if v.dtype == dtype:
            return v
        return self.builder.emit("convert", [v.ref], v.shape, dtype, {"dtype": dtype},
                                 span=expr.span, labels=v.labels)

    def builtin_elementwise(self, name: str, args: list[Any], expr: A.Call, frame: Frame,
                            labelled: bool) -> Any:
        want = 1 if name in UNARY_FUNCTIONS else (3 if name == "select" else 2)
        if len(args) != want:
            raise fail("E0371", f"`{name}` takes {want} argument{'s' if want > 1 else ''}, "
                       f"got {len(args)}", expr.span, "wrong number of arguments")
        prim = BINARY_FUNCTIONS.get(name, name)
        return self.elementwise(prim, args, expr.span, frame, labelled=labelled)
