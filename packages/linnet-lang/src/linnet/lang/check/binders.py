"""Index notation, statements: range inference of index variables, binders,
`let y[...] = ...` and state writes."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import EvaluatorBase, Fail, Frame, fail, index_count, type_str
from linnet.lang.diagnostics.core import Span
from linnet.lang.syntax.walk import leaves, mentions, walk
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const, Poison, Tensor


class Binders(EvaluatorBase):
    """The Evaluator's binders (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def infer_ranges(
        self, expr: A.Expr, frame: Frame, lhs_positions: A.Index | None = None
    ) -> None:
        """Give every index variable the dim it ranges over, from plain uses in reads."""
        spans = frame.var_spans
        for node in walk(expr):
            if isinstance(node, A.Reduce):
                for b in node.binders:
                    for leaf in leaves(b):
                        if leaf.name in frame.ivars and leaf.name not in frame.reduce_vars:
                            raise fail(
                                "E0306",
                                f"reduction variable `{leaf.name}` shadows an index variable",
                                leaf.span,
                                "already bound",
                                help="use a different name for the reduced index",
                            )
                        frame.ivars[leaf.name] = (
                            self.eval_dim(leaf.dim, frame) if leaf.dim is not None else None
                        )
                        frame.reduce_vars.add(leaf.name)
                        if leaf.dim is not None:
                            spans[leaf.name] = leaf.span
        for _ in range(3):
            changed = False
            targets = [n for n in walk(expr) if isinstance(n, A.Index)]
            if lhs_positions is not None:
                targets.append(lhs_positions)
            for node in targets:
                base = self.peek_tensor(node.base, frame)
                if (
                    base is not None
                    and len(node.indices) != base.rank
                    and node is not lhs_positions
                ):
                    raise fail(
                        "E0303",
                        index_count(self.name_of(node.base), base.rank, len(node.indices)),
                        node.span,
                        type_str(base),
                        help="give one index per dimension",
                    )
                if base is None or len(node.indices) != base.rank:
                    continue
                seen: set[str] = set()
                for axis, idx in enumerate(node.indices):
                    # A variable repeated in one read (`x[i, i]`) is a computed position the
                    # second time (see `positions`): only its first use gives its range.
                    if isinstance(idx, A.Name) and idx.name in seen:
                        continue
                    names = (
                        [idx]
                        if isinstance(idx, A.Name)
                        else (idx.items if isinstance(idx, A.Tuple) else [])
                    )
                    seen.update(n.name for n in names if isinstance(n, A.Name))
                    changed |= self.infer_position(
                        idx, base.shape[axis], frame, spans, weak=node is lhs_positions
                    )
            if not changed:
                break

    def infer_position(
        self, idx: A.Expr, size: Dim, frame: Frame, spans: dict, weak: bool = False
    ) -> bool:
        if (
            isinstance(idx, A.Name)
            and idx.name in frame.ivars
            and frame.lookup_local(idx.name) is None
        ):
            if frame.ivars[idx.name] is None:
                frame.ivars[idx.name] = size
                spans.setdefault(idx.name, idx.span)
                return True
            return False
        if isinstance(idx, A.Tuple) and all(
            isinstance(i, A.Name) and i.name in frame.ivars for i in idx.items
        ):
            unknown = [i for i in idx.items if frame.ivars[i.name] is None]  # type: ignore[union-attr]
            if len(unknown) == 1:
                known = Dim.const(1)
                for i in idx.items:
                    if i is not unknown[0]:
                        known = known * frame.ivars[i.name]  # type: ignore[union-attr,operator]
                frame.ivars[unknown[0].name] = size / known  # type: ignore[union-attr]
                spans.setdefault(unknown[0].name, unknown[0].span)  # type: ignore[union-attr]
                return True
        return False

    def peek_tensor(self, expr: A.Expr, frame: Frame) -> Tensor | None:
        """The tensor a read's base names, without emitting anything (None if not simple)."""
        if isinstance(expr, A.Name):
            v = frame.lookup_local(expr.name)
            return v if isinstance(v, Tensor) else None
        if isinstance(expr, A.Field):
            try:
                v = self.field(expr, frame)
            except Fail as f:
                if f.diag.code in ("E0340", "E0341", "E0342"):
                    raise  # the member itself is wrong: say so, not "range unknown"
                return None
            return v if isinstance(v, Tensor) else None
        return None

    def bind_binders(self, binders: list[A.IndexBinder], frame: Frame) -> list[str]:
        names: list[str] = []
        spans = frame.var_spans
        for b in binders:
            for leaf in leaves(b):
                if leaf.name in names:
                    raise fail(
                        "E0308",
                        f"index `{leaf.name}` appears twice on the left",
                        leaf.span,
                        "repeated",
                        help="each result axis needs its own index",
                    )
                if frame.lookup_local(leaf.name) is not None:
                    raise fail(
                        "E0309",
                        f"index `{leaf.name}` shadows a variable",
                        leaf.span,
                        "already a variable",
                        help="pick another index name",
                    )
                names.append(leaf.name)
                frame.ivars[leaf.name] = (
                    self.eval_dim(leaf.dim, frame) if leaf.dim is not None else None
                )
                if leaf.dim is not None:
                    spans[leaf.name] = leaf.span
        frame.order = list(names)
        return names

    def check_free_indices(self, stmt: A.Let, names: list[str], frame: Frame) -> None:
        """`let y[r] = x[r, c]`: a plain index that names nothing is a free index (E0305)."""
        reduced = {
            leaf.name
            for n in walk(stmt.value)
            if isinstance(n, A.Reduce)
            for b in n.binders
            for leaf in leaves(b)
        }
        for node in walk(stmt.value):
            if not isinstance(node, A.Index):
                continue
            for idx in node.indices:
                for n in idx.items if isinstance(idx, A.Tuple) else [idx]:
                    if (
                        not isinstance(n, A.Name)
                        or n.name in names
                        or n.name in reduced
                        or n.name in frame.ivars
                        or n.name in frame.env
                        or n.name == "self"
                        or n.name in DT.DTYPES
                        or frame.lookup_local(n.name) is not None
                        or self.resolve_quiet(frame, n.name) is not None
                    ):
                        continue
                    raise fail(
                        "E0305",
                        f"index `{n.name}` is not on the left-hand side",
                        n.span,
                        "free index",
                        help=f"add it to the result (`let {stmt.name}"
                        f"[{', '.join([*names, n.name])}] = ...`) or reduce over it "
                        f"(`sum[{n.name}] ...`)",
                    )

    def index_let(self, stmt: A.Let, frame: Frame) -> Any:
        assert stmt.binders is not None
        names = self.bind_binders(stmt.binders, frame)
        self.check_free_indices(stmt, names, frame)
        self.infer_ranges(stmt.value, frame)
        for b in stmt.binders:
            for leaf in leaves(b):
                if frame.ivars.get(leaf.name) is None:
                    help = (
                        f"use `{leaf.name}` as a plain index of a tensor on the right, or "
                        f"give its range: `let {stmt.name}[{leaf.name}: N]`"
                    )
                    called = [
                        n.base
                        for n in walk(stmt.value)
                        if isinstance(n, A.Index)
                        and isinstance(n.base, A.Call)
                        and mentions(n, {leaf.name})
                    ]
                    if called:
                        help = (
                            f"`{self.src(called[0])}` is indexed before its shape is known: "
                            f"bind it first (`let t = {self.src(called[0])}`), then index `t`"
                        )
                    raise fail(
                        "E0307",
                        f"cannot tell what `{leaf.name}` ranges over",
                        leaf.span,
                        "range unknown",
                        help=help,
                    )
        v = self.lab(stmt.value, frame)
        if isinstance(v, Poison):
            return v
        if isinstance(v, Const):
            dtype = {"float": "f32", "int": "i32", "bool": "bool"}.get(v.dtype, v.dtype)
            v = self.constant(v, dtype, stmt.value.span, labels=())
        free = [lab for lab in (v.labels or ()) if lab not in names]
        if free:
            raise fail(
                "E0305",
                f"index `{free[0]}` is not on the left-hand side",
                stmt.value.span,
                "free index here",
                help=f"add it to the result (`let {stmt.name}[{', '.join(names + free)}]`) "
                f"or reduce it (`sum[{free[0]}] ...`)",
            )
        full = tuple(names)
        shape = tuple(self.label_dim(frame, n) for n in names)
        if v.labels != full:
            aligned = self.align(v, full, stmt.span)
            if aligned.shape != shape:
                aligned = self.builder.emit(
                    "broadcast",
                    [aligned.ref],
                    shape,
                    v.dtype,
                    {"shape": [self.concrete(d) for d in shape]},
                    span=stmt.span,
                    labels=full,
                )
            v = aligned
        if any(b.parts for b in stmt.binders):
            merged: list[Dim] = []
            for b in stmt.binders:
                prod = Dim.const(1)
                for leaf in leaves(b):
                    prod = prod * frame.ivars[leaf.name]  # type: ignore[operator]
                merged.append(prod)
            v = self.builder.emit(
                "reshape",
                [v.ref],
                tuple(merged),
                v.dtype,
                {"shape": [self.concrete(d) for d in merged]},
                span=stmt.span,
            )
        v = v.relabel(None)
        return self.builder.rename_last(v, stmt.name)

    def state_write(self, target: A.Index, value: A.Expr, span: Span, frame: Frame) -> None:
        state = self.value(target.base, frame)
        if isinstance(state, Poison):
            return
        if not (isinstance(state, Tensor) and state.kind == "state"):
            raise fail(
                "E0420",
                f"only states can be written in place; {self.name_of(target.base)} "
                f"is {'a parameter' if isinstance(state, Tensor) and state.kind == 'param' else self.describe(state)}",
                target.span,
                "not a state",
                help="declare it in the block with `state name: Tensor[...]`, or bind a new "
                "value with `let`",
            )
        if len(target.indices) != state.rank:
            raise fail(
                "E0303",
                index_count(self.name_of(target.base), state.rank, len(target.indices)),
                target.span,
                type_str(state),
                help="give one index per dimension",
            )
        lhs_vars: list[str] = []
        for idx in target.indices:
            for node in walk(idx):
                if (
                    isinstance(node, A.Name)
                    and node.name not in lhs_vars
                    and frame.lookup_local(node.name) is None
                    and node.name not in frame.env
                    and self.resolve_quiet(frame, node.name) is None
                ):
                    lhs_vars.append(node.name)
                    frame.ivars[node.name] = None
        frame.order = list(lhs_vars)
        self.infer_ranges(value, frame)
        # Ranges also come from plain indices of reads inside positions (`self.s[p[l]] = ...`).
        self.infer_ranges(A.Tuple(list(target.indices), span), frame, lhs_positions=target)
        for n in lhs_vars:
            if frame.ivars[n] is None:
                raise fail(
                    "E0307",
                    f"cannot tell what `{n}` ranges over",
                    target.span,
                    "range unknown",
                    help="use it as a plain index on the right-hand side",
                )
        v = self.lab(value, frame)
        if isinstance(v, Poison):
            return
        if isinstance(v, Const):
            v = self.constant(v, state.dtype, value.span, labels=())
        if v.dtype != state.dtype:
            raise fail(
                "E0421",
                f"writing {v.dtype} values into a {state.dtype} state",
                value.span,
                f"{v.dtype} here",
                help=f"convert explicitly: `(...) as {state.dtype}`",
            )
        free = [lab for lab in (v.labels or ()) if lab not in lhs_vars]
        if free:
            raise fail(
                "E0305",
                f"index `{free[0]}` of the value is not used on the left",
                value.span,
                "free index",
                help="every index of the value must say where it is written",
            )
        # Trailing plain full-range axes stay slices; the rest are indexed.
        k = state.rank
        trailing: list[str] = []
        while k > 0:
            idx = target.indices[k - 1]
            if (
                isinstance(idx, A.Name)
                and idx.name in lhs_vars
                and idx.name not in trailing
                and frame.ivars[idx.name] == state.shape[k - 1]
                and lhs_vars[-1 - len(trailing)] == idx.name
                # `s[n, n]`, `s[n + 1, n]`: n also positions an earlier axis
                and not any(mentions(target.indices[j], {idx.name}) for j in range(k - 1))
            ):
                trailing.insert(0, idx.name)
                k -= 1
            else:
                break
        indices = []
        for axis in range(k):
            idx = target.indices[axis]
            iv = self.lab(idx, frame)
            if isinstance(iv, Const):
                iv = self.constant(iv, "i32", idx.span, labels=())
            if not isinstance(iv, Tensor) or not DT.is_int(iv.dtype):
                raise fail("E0382", "a state position must be an integer", idx.span)
            indices.append(iv)
        lead = tuple(lab for lab in lhs_vars if lab not in trailing)
        aligned_idx = [self.align(ix, lead, span) for ix in indices]
        # The graph's scatter takes positions of one rank: constant positions too.
        aligned_idx = [
            self.builder.emit(
                "reshape",
                [ix.ref],
                (Dim.const(1),) * len(lead),
                ix.dtype,
                {"shape": [1] * len(lead)},
                span=span,
                labels=lead,
            )
            if ix.rank != len(lead)
            else ix
            for ix in aligned_idx
        ]
        full = lead + tuple(trailing)
        shape = tuple(self.label_dim(frame, lab) for lab in full)
        vv = self.align(v, full, span)
        if vv.shape != shape:
            vv = self.builder.emit(
                "broadcast",
                [vv.ref],
                shape,
                vv.dtype,
                {"shape": [self.concrete(d) for d in shape]},
                span=span,
                labels=full,
            )
        self.builder.effect(
            "scatter",
            [state.ref, vv.ref] + [ix.ref for ix in aligned_idx],
            {"indexed_axes": k, "path": state.ref[1:]},
            span,
        )
