"""Constant folding of compile-time scalars."""

from __future__ import annotations

from typing import Any

import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import EvaluatorBase, fail
from linnet.lang.diagnostics.core import Span
from linnet.lang.ir.primitives import COMPARISON_PRIMITIVES, UNARY_FUNCTIONS
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const


class Folding(EvaluatorBase):
    """The Evaluator's folding (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def const_fold(self, prim: str, args: list[Const], span: Span) -> Const:
        if all(isinstance(a.value, Dim) for a in args) and prim in ("add", "sub", "mul", "div",
                                                                      "neg") and \
                any(not a.known for a in args):
            x = args[0].value
            y = args[1].value if len(args) > 1 else None
            try:
                out = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                       "div": lambda: x / y, "neg": lambda: -x}[prim]()
            except ZeroDivisionError:
                raise fail("E0350", "constant arithmetic divides by zero", span,
                           "the divisor is 0 here") from None
            return Const(out, "int")
        if any(not a.known for a in args):
            kind = "bool" if prim in COMPARISON_PRIMITIVES | {"and", "or", "not"} else (
                "int" if all(a.dtype == "int" for a in args) else "float")
            return Const(Dim.symbol(f"?{id(span)}") if kind == "int" else None, kind)
        vals = [a.value.exact if isinstance(a.value, Dim) else a.value for a in args]
        ints = all(a.dtype in ("int", *DT.INTS) for a in args)
        try:
            import math
            table = {
                "neg": lambda x: -x, "not": lambda x: not x, "add": lambda x, y: x + y,
                "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
                "div": (lambda x, y: x // y) if ints else (lambda x, y: float(x) / float(y)),
                "rem": lambda x, y: x % y, "pow": lambda x, y: x ** y,
                "maximum": max, "minimum": min, "lt": lambda x, y: x < y,
                "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y,
                "eq": lambda x, y: x == y, "ne": lambda x, y: x != y,
                "and": lambda x, y: bool(x and y), "or": lambda x, y: bool(x or y),
                "exp": math.exp, "log": math.log, "sqrt": math.sqrt,
                "rsqrt": lambda x: 1 / math.sqrt(x), "sin": math.sin, "cos": math.cos,
                "tanh": math.tanh, "abs": abs, "erf": math.erf, "floor": math.floor,
                "sigmoid": lambda x: 1 / (1 + math.exp(-x)),
            }
            fn: Any = table[prim]
            out = fn(*vals)
        except ZeroDivisionError:
            raise fail("E0350", "constant arithmetic divides by zero", span,
                       "the divisor is 0 here") from None
        except (ValueError, OverflowError) as exc:
            raise fail("E0350", f"constant arithmetic fails: {exc}", span, "here") from None
        if isinstance(out, bool):
            return Const(out, "bool")
        if ints and prim not in UNARY_FUNCTIONS - {"abs", "floor"}:
            return Const(Dim.const(int(out)), "int")
        return Const(float(out), "float")
