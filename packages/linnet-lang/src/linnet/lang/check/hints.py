"""Hints for messages: how values are described, which indices would fit, swapped
indices, and source text of expressions."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.core import EvaluatorBase, Frame, type_str
from linnet.lang.diagnostics.core import Span
from linnet.lang.tensors.values import BlockArray, BlockInst, Builtin, Const, DType, FuncRef, Tensor


def did_you_mean(name: str, candidates: Iterable[str], otherwise: str, cutoff: float = 0.6) -> str:
    """A help line naming the candidate closest to a misspelt ``name``, else ``otherwise``.

    >>> did_you_mean("f23", ["f32", "i32"], "element types are ...")
    'did you mean `f32`?'
    >>> did_you_mean("zzz", ["f32"], "element types are ...")
    'element types are ...'
    >>> did_you_mean("h", ["H", "D"], "")
    'did you mean `H`?'
    """
    names = list(candidates)
    close = difflib.get_close_matches(name, names, n=1, cutoff=cutoff)
    # A name in the wrong case (`h` for `H`) is too short for difflib to call close.
    close = close or [c for c in names if c.lower() == name.lower()][:1]
    return f"did you mean `{close[0]}`?" if close else otherwise


class Hints(EvaluatorBase):
    """The Evaluator's hints (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def describe(self, v: Any) -> str:
        if isinstance(v, Tensor):
            return f"a tensor {type_str(v)}"
        if isinstance(v, Const):
            return f"a constant ({v.dtype})"
        if isinstance(v, FuncRef):
            return f"the {v.decl.kind} `{v.decl.name}`"
        if isinstance(v, BlockArray):
            return "a list of blocks"
        if isinstance(v, BlockInst):
            return f"a `{v.decl.name}` block"
        if isinstance(v, A.BlockDecl):
            return f"the block type `{v.name}`"
        if isinstance(v, DType):
            return f"the element type `{v.name}`"
        if isinstance(v, Builtin):
            return f"the function `{v.name}`"
        return type(v).__name__.lower()

    def select_hint(self, expr: A.IfExpr) -> str:
        """`if c { a } else { b }` spelled as `select(c, a, b)` when both arms are one value."""
        arms = [expr.then, expr.otherwise]
        if all(
            isinstance(b, A.Block)
            and len(b.statements) == 1
            and isinstance(b.statements[0], A.ExprStmt)
            for b in arms
        ):
            a, b = (self.src(arm.statements[0].expr) for arm in arms)  # type: ignore[union-attr]
            return f"`select({self.src(expr.condition)}, {a}, {b})`"
        return "`select(cond, a, b)`"

    def suggest_indices(self, v: Tensor, frame: Frame) -> str:
        """Index variables of this statement that fit ``v``'s axes (`i0`, ... where none do)."""
        used: list[str] = []
        for k, d in enumerate(v.shape):
            fits = [
                n
                for n in list(frame.order) + list(frame.ivars)
                if frame.ivars.get(n) == d and n not in used
            ]
            used.append(fits[0] if fits else f"i{k}")
        return ", ".join(used)

    def swap_hint(self, expr: A.Index, flat: list, shape: list, axis: int, frame: Frame) -> str:
        """`x[c, r]` where `x[r, c]` fits: suggest the swap (plain indices only)."""
        if len(flat) != len(expr.indices):
            return ""
        d = frame.ivars[flat[axis][1]]
        for j, (kind, other) in enumerate(flat):
            if j != axis and kind == "var" and frame.ivars[other] == shape[axis] and d == shape[j]:
                texts = [self.src(i) for i in expr.indices]
                texts[axis], texts[j] = texts[j], texts[axis]
                return (
                    f"the indices look swapped: `{other}` ranges over {shape[axis]}; write "
                    f"`{self.src(expr.base)}[{', '.join(texts)}]`"
                )
        return ""

    def binding_notes(self, dexpr: A.Expr, env: dict, generic_names: dict) -> list:
        return []

    def src(self, expr: A.Expr) -> str:
        s = expr.span
        return s.source.text[s.start : s.stop]

    def arg_span(self, expr: A.Call, p: A.Param, decl: A.FuncDecl) -> Span:
        i = decl.params.index(p)
        return expr.args[i].span if i < len(expr.args) else expr.span
