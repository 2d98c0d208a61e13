"""Index notation, reductions: `sum[k] ...` and friends, and the contractions
(einsums) that a sum of products of plain reads becomes."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import EvaluatorBase, Frame, fail
from linnet.lang.ir.primitives import REDUCTION_IDENTITIES
from linnet.lang.syntax.walk import leaves, mentions, product_factors
from linnet.lang.tensors.values import POISON, Const, Poison, Tensor


class Reductions(EvaluatorBase):
    """The Evaluator's reductions (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def reduce(self, expr: A.Reduce, frame: Frame) -> Any:
        if frame.in_kernel and expr.kind == "prod":
            raise fail(
                "E0527",
                "`prod` over a tile is not supported yet",
                expr.span,
                "in a kernel",
                help="compute the product in the op's body, or as "
                "`exp(sum[c] log(v[c]))` where every element is positive",
            )
        names = []
        for b in expr.binders:
            for leaf in leaves(b):
                if leaf.name in frame.ivars and leaf.name not in frame.reduce_vars:
                    raise fail(
                        "E0306",
                        f"reduction variable `{leaf.name}` shadows an index variable",
                        leaf.span,
                        "already bound",
                        help="use a different name for the reduced index",
                    )
                names.append(leaf.name)
                if frame.ivars.get(leaf.name) is None:
                    raise fail(
                        "E0307",
                        f"cannot tell what `{leaf.name}` ranges over",
                        leaf.span,
                        "range unknown",
                        help=f"use `{leaf.name}` as a plain index of a tensor, or give "
                        f"its range: `{expr.kind}[{leaf.name}: N]`",
                    )
                self.label_key(frame, leaf.name)
        acc_name = expr.accumulate
        factors = product_factors(expr.body)
        dependent = [f for f in factors if mentions(f, set(names))]
        if (
            expr.kind == "sum"
            and len(dependent) == 2
            and all(self.is_plain_read(f, frame) for f in dependent)
        ):
            return self.contract(expr, names, factors, dependent, frame)
        body = self.lab(expr.body, frame)
        if isinstance(body, Poison):
            return body
        if isinstance(body, Const):
            body = self.constant(
                body, "f32" if body.dtype in ("float", "int") else body.dtype, expr.span, labels=()
            )
        return self.reduce_tensor(expr, body, names, acc_name, frame)

    def reduce_tensor(
        self, expr: A.Reduce, body: Tensor, names: list[str], acc_name: A.Name | None, frame: Frame
    ) -> Tensor:
        labels = body.labels or ()
        missing = [n for n in names if n not in labels]
        if missing:
            full = self.union_labels([body.relabel(labels + tuple(missing))], frame)
            aligned = self.align(body, full, expr.span)
            shape = tuple(self.label_dim(frame, lab) for lab in full)
            body = self.builder.emit(
                "broadcast",
                [aligned.ref],
                shape,
                body.dtype,
                {"shape": [self.concrete(d) for d in shape]},
                span=expr.span,
                labels=full,
            )
            labels = full
        axes = [i for i, lab in enumerate(labels) if lab in names]
        acc = (
            self.eval_dtype(acc_name, frame) if acc_name else DT.accumulator(expr.kind, body.dtype)
        )
        if body.dtype == "bool" and expr.kind in ("max", "min"):
            raise fail(
                "E0390",
                f"`{expr.kind}` over bool values",
                expr.span,
                "bool",
                help="convert to a number first",
            )
        out_dtype = body.dtype if expr.kind in ("max", "min") else acc
        keep = tuple(lab for lab in labels if lab not in names)
        shape = tuple(self.label_dim(frame, lab) for lab in keep)
        return self.builder.emit(
            "reduce",
            [body.ref],
            shape,
            out_dtype,
            {
                "kind": expr.kind,
                "axes": axes,
                "accumulate": acc,
                "identity": REDUCTION_IDENTITIES[expr.kind],
            },
            span=expr.span,
            labels=keep,
        )

    def is_plain_read(self, expr: A.Expr, frame: Frame) -> bool:
        if isinstance(expr, A.Cast):
            return self.is_plain_read(expr.operand, frame)
        if not isinstance(expr, A.Index):
            return False
        seen: set[str] = set()
        for idx in expr.indices:
            names = (
                [idx]
                if isinstance(idx, A.Name)
                else (idx.items if isinstance(idx, A.Tuple) else None)
            )
            if names is None:
                return False
            for n in names:
                if not isinstance(n, A.Name) or n.name not in frame.ivars or n.name in seen:
                    return False
                seen.add(n.name)
        return True

    def raw_read(self, expr: A.Expr, frame: Frame) -> Any:
        """A plain read without transposing to canonical order: einsum takes any order."""
        if isinstance(expr, A.Cast):
            return self.cast(self.raw_read(expr.operand, frame), expr, frame)
        assert isinstance(expr, A.Index)
        return self.read(expr, frame, canonical=False)

    def contract(
        self,
        expr: A.Reduce,
        names: list[str],
        factors: list[A.Expr],
        dependent: list[A.Expr],
        frame: Frame,
    ) -> Any:
        a = self.raw_read(dependent[0], frame)
        b = self.raw_read(dependent[1], frame)
        if isinstance(a, Poison) or isinstance(b, Poison):
            return POISON
        dtype = DT.promote(a.dtype, b.dtype)
        if dtype is None:
            raise fail(
                "E0352",
                f"cannot mix element types `{a.dtype}` and `{b.dtype}`",
                expr.body.span,
                "mixed here",
                help=f"convert one: `(...) as {a.dtype}`",
            )
        if a.dtype != dtype:
            a = self.builder.emit(
                "convert",
                [a.ref],
                a.shape,
                dtype,
                {"dtype": dtype},
                span=expr.span,
                labels=a.labels,
            )
        if b.dtype != dtype:
            b = self.builder.emit(
                "convert",
                [b.ref],
                b.shape,
                dtype,
                {"dtype": dtype},
                span=expr.span,
                labels=b.labels,
            )
        union = self.union_labels([a, b], frame)
        keep = tuple(lab for lab in union if lab not in names)
        letters = {lab: chr(ord("a") + i) for i, lab in enumerate(union)}
        spec = (
            "".join(letters[x] for x in a.labels)
            + ","
            + "".join(letters[x] for x in b.labels)
            + "->"
            + "".join(letters[x] for x in keep)
        )
        acc = (
            self.eval_dtype(expr.accumulate, frame)
            if expr.accumulate
            else DT.accumulator("sum", dtype)
        )
        shape = tuple(self.label_dim(frame, lab) for lab in keep)
        result: Any = self.builder.emit(
            "contract",
            [a.ref, b.ref],
            shape,
            acc,
            {"spec": spec, "accumulate": acc},
            span=expr.span,
            labels=keep,
        )
        for f in factors:
            if f is dependent[0] or f is dependent[1]:
                continue
            result = self.elementwise(
                "mul", [result, self.lab(f, frame)], expr.span, frame, labelled=True
            )
        return result
