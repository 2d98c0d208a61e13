"""Statements: function bodies, `let`, assignment, `for` loops over ranges and
repeated blocks."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.core import EvaluatorBase, Fail, Frame, fail, type_str
from linnet.lang.check.instantiate import run_loop
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.syntax.walk import walk
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import POISON, BlockArray, Const, Poison, Tensor


class Statements(EvaluatorBase):
    """The Evaluator's statements (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def run_body(self, block: A.Block, frame: Frame) -> None:
        for stmt in block.statements:
            if frame.returned is not None:
                raise fail(
                    "E0310",
                    "unreachable statement after `return`",
                    stmt.span,
                    "never runs",
                    help="`return` must be the last statement",
                )
            try:
                self.statement(stmt, frame)
            except Fail as f:
                if f.diag.code != "E0000":
                    self.errors.append(f.diag)
                if isinstance(stmt, A.Let):
                    for name in stmt.names or [stmt.name]:
                        frame.bind(name, POISON)
                elif (
                    isinstance(stmt, A.Assign)
                    and isinstance(stmt.target, A.Name)
                    and frame.lookup_local(stmt.target.name) is None
                ):
                    frame.bind(stmt.target.name, POISON)  # E0312: later uses stay quiet
                elif isinstance(stmt, A.Return) and frame.returned is None:
                    frame.returned = [POISON] * len(stmt.values)
                if self.lowering:
                    raise
            finally:
                frame.reset_statement()

    def statement(self, stmt: A.Stmt, frame: Frame) -> None:
        if self.poisoned(stmt, frame):
            if isinstance(stmt, A.Return):
                # One poisoned value per result: a count mismatch (E0441) would be noise.
                frame.returned = [POISON] * max(1, len(stmt.values))
            raise Fail(Diagnostic("E0000", "depends on an earlier error"))
        if isinstance(stmt, A.Let):
            if stmt.names is not None:
                self.unpack(stmt, frame)
            elif stmt.binders is None:
                v = self.value(stmt.value, frame)
                if isinstance(v, Tensor) and v.kind == "value":
                    v = self.builder.rename_last(
                        v, stmt.name, force=isinstance(stmt.value, A.Call | A.IfExpr)
                    )
                if isinstance(v, tuple):
                    raise fail(
                        "E0347",
                        f"this call returns {len(v)} values, bound to one name",
                        stmt.value.span,
                        f"{len(v)} results",
                        help=f"unpack them: `let ({', '.join(f'r{i}' for i in range(len(v)))})"
                        f" = ...`",
                    )
                frame.bind(stmt.name, v)
            else:
                frame.bind(stmt.name, self.index_let(stmt, frame))
        elif isinstance(stmt, A.Return):
            frame.return_exprs = list(stmt.values)
            frame.returned = [self.value(v, frame) for v in stmt.values]
        elif isinstance(stmt, A.ExprStmt):
            v = self.value(stmt.expr, frame, statement=True)
            if isinstance(v, Tensor) and not frame.in_kernel:
                raise fail(
                    "E0311",
                    "this value is computed and then dropped",
                    stmt.span,
                    "result unused",
                    help="bind it with `let name = ...`",
                )
        elif isinstance(stmt, A.Assign):
            self.assign(stmt, frame)
        elif isinstance(stmt, A.For):
            self.for_loop(stmt, frame)

    def unpack(self, stmt: A.Let, frame: Frame) -> None:
        """`let (q, k, v) = f(x)`: each result of a call that returns several, in order."""
        assert stmt.names is not None
        v = self.value(stmt.value, frame)
        if isinstance(v, Poison):
            raise Fail(Diagnostic("E0000", "poisoned"))
        got = len(v) if isinstance(v, tuple) else 1
        if not isinstance(v, tuple) or got != len(stmt.names):
            what = (
                f"a call that returns {got} values"
                if isinstance(v, tuple)
                else f"{self.describe(v)}, one value"
            )
            raise fail(
                "E0348",
                f"{len(stmt.names)} names unpack {what}",
                stmt.name_span,
                f"{len(stmt.names)} names",
                help="unpack a call that returns several results (`return a, b`), with "
                "one name per result",
            )
        for name, item in zip(stmt.names, v):
            frame.bind(name, item)

    def poisoned(self, stmt: A.Stmt, frame: Frame) -> bool:
        """Whether the statement reads a variable whose definition already failed."""
        if self.lowering:
            return False  # lowering stops at its first error: nothing is ever poisoned
        exprs: list[Any] = []
        if isinstance(stmt, A.Let | A.Assign):
            exprs.append(stmt.value)
        elif isinstance(stmt, A.Return):
            exprs.extend(stmt.values)
        elif isinstance(stmt, A.ExprStmt):
            exprs.append(stmt.expr)
        return any(
            isinstance(n, A.Name) and isinstance(frame.lookup_local(n.name), Poison)
            for e in exprs
            for n in walk(e)
        )

    def assign(self, stmt: A.Assign, frame: Frame) -> None:
        target = stmt.target
        if isinstance(target, A.Name):
            old = frame.lookup_local(target.name)
            if old is None:
                raise fail(
                    "E0312",
                    f"cannot assign to `{target.name}`: it is not a variable",
                    target.span,
                    "not declared",
                    help=f"declare it first: `let {target.name} = ...`",
                )
            new = self.value(stmt.value, frame)
            if (
                isinstance(old, Tensor)
                and isinstance(new, Tensor)
                and (old.shape != new.shape or old.dtype != new.dtype)
                and not frame.in_kernel
            ):
                raise fail(
                    "E0313",
                    f"`{target.name}` changes type: {type_str(old)} before, {type_str(new)} now",
                    stmt.value.span,
                    "new value",
                    help="a variable keeps one type; use a new name",
                )
            for scope in reversed(frame.scopes):
                if target.name in scope:
                    scope[target.name] = new
                    break
            return
        if isinstance(target, A.Index):
            self.state_write(target, stmt.value, stmt.span, frame)
            return
        raise fail(
            "E0112",
            "cannot assign to this expression",
            target.span,
            "not assignable",
            help="assign to a variable, or write into a state with indices",
        )

    def for_loop(self, stmt: A.For, frame: Frame) -> None:
        it = stmt.iterable
        if isinstance(it, A.RangeExpr):
            lo = self.value(it.start, frame)
            hi = self.value(it.stop, frame)
            if frame.in_kernel:  # a loop of the tile graph (check/kernels.py, ir/tiles.py)
                self.kernel_loop(stmt, lo, hi, frame)
                return
            if frame.in_kernel or not self.lowering:
                var: Any = (
                    Tensor("%?", (), "i32")
                    if frame.in_kernel
                    else Const(Dim.symbol(stmt.var), "int")
                )
                frame.scopes.append({stmt.var: var})
                try:
                    self.run_body(stmt.body, frame)
                finally:
                    frame.scopes.pop()
                return
            if not (isinstance(lo, Const) and isinstance(hi, Const) and lo.known and hi.known):
                raise fail(
                    "E0320",
                    "loop bounds must be known when lowering",
                    it.span,
                    "not a compile-time range",
                    help="outside kernels, loops are unrolled: use integers and dims",
                )
            stop = hi.value.value + (1 if it.inclusive else 0)
            values = [Const(Dim.const(i), "int") for i in range(lo.value.value, stop)]
        else:
            arr = self.value(it, frame)
            if isinstance(arr, Poison):
                return
            if not isinstance(arr, BlockArray):
                raise fail(
                    "E0321",
                    "a `for` loop runs over a range (`0..N`) or repeated blocks",
                    it.span,
                    "not iterable",
                    help="tensors are not iterated: use index notation (`let y[i] = ...`) "
                    "or a reduction (`sum[i] x[i]`)"
                    if isinstance(arr, Tensor)
                    else "declare repeated blocks as `block layers: [Layer<...>; N]`",
                )
            values = list(arr.items)  # type: ignore[arg-type]

        def run_one(v: Any) -> None:
            frame.scopes.append({stmt.var: v})
            try:
                self.run_body(stmt.body, frame)
            finally:
                frame.scopes.pop()

        if isinstance(it, A.RangeExpr):
            for v in values:
                run_one(v)
            return
        # Repeated blocks: lower one element, instantiate it for the others (check/instantiate).
        run_loop(self, stmt, frame, arr, run_one)
