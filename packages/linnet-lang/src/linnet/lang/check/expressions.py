"""Positional (whole-tensor) expressions: literals, names, operators, fields,
`if` expressions and block values."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.config_lists import list_used_as_value
from linnet.lang.check.const_tensors import materialize
from linnet.lang.check.core import EvaluatorBase, Frame, IndexVar, fail
from linnet.lang.check.hints import did_you_mean
from linnet.lang.ir.primitives import BINARY_OPERATORS
from linnet.lang.syntax.walk import walk
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import (
    BlockArray,
    BlockInst,
    Const,
    ConstList,
    ConstTensor,
    FuncRef,
    Poison,
    Tensor,
)


class Expressions(EvaluatorBase):
    """The Evaluator's expressions (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def value(self, expr: A.Expr, frame: Frame, statement: bool = False) -> Any:
        if isinstance(expr, A.IntLit):
            return Const(Dim.const(expr.value), "int")
        if isinstance(expr, A.FloatLit):
            return Const(expr.value, "float")
        if isinstance(expr, A.BoolLit):
            return Const(expr.value, "bool")
        if isinstance(expr, A.Name):
            v = self.lookup(frame, expr.name, expr.span)
            if isinstance(v, ConstList):
                raise list_used_as_value(expr.name, expr.span)
            if isinstance(v, IndexVar):
                raise fail(
                    "E0330",
                    f"index variable `{expr.name}` used outside index notation",
                    expr.span,
                    "an index variable",
                    help="use it inside `let y[...] = ...` or a reduction",
                )
            if frame.in_kernel and expr.name in frame.tensor_params and not frame.memory_access:
                raise fail(
                    "E0503",
                    f"tensor parameter `{expr.name}` is used outside `load`/`store`",
                    expr.span,
                    "read directly",
                    help=f"read it with `load({expr.name}[...])`",
                )
            return v
        if isinstance(expr, A.Unary):
            x = self.value(expr.operand, frame)
            return self.elementwise("neg" if expr.op == "-" else "not", [x], expr.span, frame)
        if isinstance(expr, A.Binary):
            a = self.value(expr.left, frame)
            b = self.value(expr.right, frame)
            return self.elementwise(BINARY_OPERATORS[expr.op], [a, b], expr.span, frame)
        if isinstance(expr, A.Cast):
            return self.cast(self.value(expr.operand, frame), expr, frame)
        if isinstance(expr, A.Call):
            return self.call(expr, frame, statement)
        if isinstance(expr, A.Field):
            return self.field(expr, frame)
        if isinstance(expr, A.Index):
            base = (
                self.value(expr.base, frame)
                if not isinstance(expr.base, A.Name) or expr.base.name not in frame.tensor_params
                else frame.lookup_local(expr.base.name)
            )
            if isinstance(base, BlockArray):
                if len(expr.indices) != 1:
                    raise fail("E0331", "repeated blocks take one index", expr.span)
                i = self.eval_dim(expr.indices[0], frame)
                if i.value is None:
                    return base.items[0]
                if not 0 <= i.value < len(base.items):
                    raise fail(
                        "E0332",
                        f"block index {i.value} is out of range 0..{len(base.items)}",
                        expr.indices[0].span,
                        "out of range",
                    )
                return base.items[i.value]
            if any(isinstance(i, A.Slice) for i in expr.indices):
                return self.slice(expr, base, frame)
            return self.whole(expr, frame)
        if isinstance(expr, A.Reduce):
            return self.whole(expr, frame)
        if isinstance(expr, A.IfExpr):
            return self.if_expr(expr, frame)
        if isinstance(expr, A.Tuple):
            raise fail(
                "E0333",
                "a parenthesised list is only allowed as a composite index",
                expr.span,
                "not a value",
                help="composite indices look like `x[(h, d)]`",
            )
        if isinstance(expr, A.RangeExpr):
            raise fail("E0334", "a range is only allowed in a `for` loop", expr.span)
        if isinstance(expr, A.Slice):
            raise fail(
                "E0343",
                "a range slice is only allowed as a whole index of a tensor",
                expr.span,
                "a range inside an expression",
                help="slice in its own statement: `let part = x[0..N, ..]`, then use `part`",
            )
        raise fail("E0335", "unsupported expression", getattr(expr, "span", None))

    def whole(self, expr: A.Expr, frame: Frame) -> Any:
        """An index-notation expression used as a whole value: it may not leave free indices."""
        if not frame.order and not frame.ivars:
            frame.order = []
        self.infer_ranges(expr, frame)
        v = self.lab(expr, frame)
        if isinstance(v, Tensor) and v.labels:
            free = ", ".join(f"`{x}`" for x in v.labels)
            raise fail(
                "E0305",
                f"index variable{'s' if len(v.labels) > 1 else ''} {free} not bound",
                expr.span,
                "free index here",
                help=f"name the result's indices: `let y[{', '.join(v.labels)}] = ...`, "
                "or reduce them with `sum[...]`",
            )
        if isinstance(v, Tensor):
            return v.relabel(None)
        return v

    def if_expr(self, expr: A.IfExpr, frame: Frame) -> Any:
        per_element = [
            n
            for n in walk(expr.condition)
            if isinstance(n, A.Name)
            and n.name in frame.ivars
            and frame.lookup_local(n.name) is None
        ]
        if per_element:
            raise fail(
                "E0336",
                "an `if` condition must be a compile-time bool",
                expr.condition.span,
                f"depends on index `{per_element[0].name}`",
                help="`if` picks one branch for the whole tensor; choose per element with "
                f"`select`: {self.select_hint(expr)}",
            )
        cond = self.value(expr.condition, frame)
        if not isinstance(cond, Const) or cond.dtype != "bool":
            raise fail(
                "E0336",
                "an `if` condition must be a compile-time bool",
                expr.condition.span,
                "not known before running",
                help="use `select(cond, a, b)` for values that depend on tensors",
            )
        if cond.value is None and not self.lowering:
            then = self.block_value(expr.then, frame)
            if expr.otherwise is not None:
                self.block_value(expr.otherwise, frame) if isinstance(
                    expr.otherwise, A.Block
                ) else self.if_expr(expr.otherwise, frame)
            return then
        if cond.value:
            return self.block_value(expr.then, frame)
        if expr.otherwise is None:
            return None
        if isinstance(expr.otherwise, A.IfExpr):
            return self.if_expr(expr.otherwise, frame)
        return self.block_value(expr.otherwise, frame)

    def block_value(self, block: A.Block, frame: Frame) -> Any:
        frame.scopes.append({})
        try:
            stmts = block.statements
            for stmt in stmts[:-1]:
                self.statement(stmt, frame)
            if stmts and isinstance(stmts[-1], A.ExprStmt):
                return self.value(stmts[-1].expr, frame)
            if stmts:
                self.statement(stmts[-1], frame)
            return None
        finally:
            frame.scopes.pop()

    def field(self, expr: A.Field, frame: Frame) -> Any:
        base = self.value(expr.base, frame)
        if isinstance(base, Poison):
            return base
        if isinstance(base, BlockInst):
            if expr.name in base.members:
                member = base.members[expr.name]
                if isinstance(member, ConstTensor):
                    return materialize(self, member, expr.span)
                return member
            method = base.decl.method(expr.name)
            if method is not None:
                return FuncRef(method, base)
            for m in base.decl.members:
                if m.name == expr.name:
                    raise fail(
                        "E0340",
                        f"`{expr.name}` is not present in this configuration",
                        expr.span,
                        "absent member",
                        help=f"`{expr.name}` is declared with an `if` condition that is false here",
                        secondary=[(m.span, "declared here")],
                    )
            names = list(base.members) + [m.name for m in base.decl.methods]
            raise fail(
                "E0341",
                f"block `{base.decl.name}` has no member `{expr.name}`",
                expr.span,
                "unknown member",
                help=did_you_mean(expr.name, names, f"members are: {', '.join(names) or 'none'}"),
                secondary=[(base.decl.name_span, f"`{base.decl.name}` declared here")],
            )
        raise fail(
            "E0342",
            f"only blocks have members; this is {self.describe(base)}",
            expr.span,
            "not a block",
        )
