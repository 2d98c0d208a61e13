"""Generics: binding a callee's `Dim` and `DType` generics from its arguments, and
its `where` clauses."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.core import EvaluatorBase, Frame, fail, type_str
from linnet.lang.diagnostics.core import Span
from linnet.lang.syntax.walk import walk
from linnet.lang.tensors.dims import Dim, solve_for
from linnet.lang.tensors.values import Const, Tensor


class Generics(EvaluatorBase):
    """The Evaluator's generics (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def bind_generics(
        self, decl: A.FuncDecl, args: list[Any], expr: A.Call, frame: Frame, env: dict[str, Any]
    ) -> dict[str, Any]:
        generic_names = {g.name: g for g in decl.generics}
        if expr.generic_args:
            if len(expr.generic_args) > len(decl.generics):
                raise fail(
                    "E0445",
                    f"`{decl.name}` takes {len(decl.generics)} generic "
                    f"arguments, got {len(expr.generic_args)}",
                    expr.span,
                )
            for g, a in zip(decl.generics, expr.generic_args):
                env[g.name] = self.generic_value(g, a, frame)
        pending: list[tuple[A.Expr, Dim, A.Param, int]] = []
        for p, a in zip(decl.params, args):
            if isinstance(p.type, A.TensorType):
                if not isinstance(a, Tensor):
                    raise fail(
                        "E0446",
                        f"argument `{p.name}` of `{decl.name}` must be a tensor, "
                        f"got {self.describe(a)}",
                        self.arg_span(expr, p, decl),
                        "not a tensor",
                        secondary=[(p.span, "parameter declared here")],
                    )
                if len(p.type.dims) != a.rank:
                    raise fail(
                        "E0447",
                        f"argument `{p.name}` of `{decl.name}` has "
                        f"{a.rank} dimension{'s' if a.rank != 1 else ''}, expected "
                        f"{len(p.type.dims)}",
                        self.arg_span(expr, p, decl),
                        type_str(a),
                        secondary=[(p.span, "parameter declared here")],
                    )
                self.bind_dtype(p.type.dtype, a.dtype, env, generic_names, p, expr, decl)
                for axis, (dexpr, size) in enumerate(zip(p.type.dims, a.shape)):
                    pending.append((dexpr, size, p, axis))
            elif isinstance(p.type, A.ScalarType):
                if isinstance(a, Tensor) and a.rank == 0:
                    self.bind_dtype(
                        A.Name(p.type.name, p.type.span), a.dtype, env, generic_names, p, expr, decl
                    )
                elif not isinstance(a, Const):
                    raise fail(
                        "E0448",
                        f"argument `{p.name}` of `{decl.name}` must be a scalar "
                        f"{p.type.name}, got {self.describe(a)}",
                        self.arg_span(expr, p, decl),
                        "not a scalar",
                        secondary=[(p.span, "parameter declared here")],
                    )
        for _ in range(len(pending) + 1):
            progress = False
            for item in list(pending):
                dexpr, size, p, axis = item
                if (
                    isinstance(dexpr, A.Name)
                    and dexpr.name in generic_names
                    and dexpr.name not in env
                ):
                    env[dexpr.name] = size
                    pending.remove(item)
                    progress = True
                    continue
                unknown = {
                    n.name
                    for n in walk(dexpr)
                    if isinstance(n, A.Name) and n.name in generic_names and n.name not in env
                }
                if len(unknown) == 1:
                    (u,) = unknown
                    trial = Frame(decl.module or frame.module, {**env, u: Dim.symbol("?" + u)})
                    solved = solve_for(self.eval_dim(dexpr, trial), size, {"?" + u})
                    if solved is None:
                        continue
                    env[u] = solved[1]
                    pending.remove(item)
                    progress = True
                    continue
                if unknown:
                    continue
                want = self.eval_dim(dexpr, Frame(decl.module or frame.module, env))
                if want != size:
                    raise fail(
                        "E0449",
                        f"argument `{p.name}` of `{decl.name}`: axis {axis} has "
                        f"size {size}, expected {want}",
                        self.arg_span(expr, p, decl),
                        f"size {size}",
                        secondary=[
                            (dexpr.span, f"expected {want} here"),
                            *self.binding_notes(dexpr, env, generic_names),
                        ],
                        help="the argument's shape must match the parameter's type",
                    )
                pending.remove(item)
                progress = True
            if not progress:
                break
        if pending:
            dexpr, size, p, axis = pending[0]
            raise fail(
                "E0450",
                f"cannot infer the dims in `{self.src(dexpr)}` for `{decl.name}`",
                dexpr.span,
                "not inferable",
                help="name a generic on its own in some parameter's type, or pass it: "
                f"`{decl.name}<...>(...)`",
            )
        for g in decl.generics:
            if g.name not in env:
                if g.default is not None:
                    env[g.name] = self.generic_value(
                        g, g.default, Frame(decl.module or frame.module, env)
                    )
                    continue
                raise fail(
                    "E0451",
                    f"cannot infer generic `{g.name}` of `{decl.name}`",
                    expr.span,
                    "in this call",
                    secondary=[(g.span, "declared here")],
                    help=f"no argument's shape mentions `{g.name}`: pass the generics "
                    f"explicitly, `{decl.name}<"
                    f"{', '.join(gg.name for gg in decl.generics)}>(...)`, with the "
                    "sizes you mean",
                )
        return env

    def bind_dtype(
        self,
        want: A.Name,
        have: str,
        env: dict,
        generic_names: dict,
        p: A.Param,
        expr: A.Call,
        decl: A.FuncDecl,
    ) -> None:
        name = want.name
        if name in generic_names:
            if name not in env:
                env[name] = have
                return
            bound = env[name]
        else:
            bound = env.get(name, name)
        if bound != have:
            raise fail(
                "E0452",
                f"argument `{p.name}` of `{decl.name}` is {have}, expected {bound}",
                self.arg_span(expr, p, decl),
                f"{have} here",
                secondary=[(want.span, f"expects {bound}")],
                help=f"convert it explicitly: `(...) as {bound}`",
            )

    def generic_value(self, g: A.Generic, arg: Any, frame: Frame) -> Any:
        if g.kind == "DType":
            if isinstance(arg, A.Name | A.ScalarType):
                return self.eval_dtype(A.Name(arg.name, arg.span), frame)
            raise fail(
                "E0453", f"generic `{g.name}` is an element type", arg.span, "expected a dtype"
            )
        if isinstance(arg, A.ScalarType):
            arg = A.Name(arg.name, arg.span)
        return self.eval_dim(arg, frame)

    def check_where(
        self,
        decl: A.FuncDecl | A.BlockDecl,
        frame: Frame,
        span: Span,
        label: str = "called here",
        help: str = "call it with shapes that satisfy the clause",
    ) -> None:
        for clause in decl.where:
            v = self.value(clause, frame)
            if isinstance(v, Const) and v.dtype == "bool" and v.value is False:
                raise fail(
                    "E0460",
                    f"`where {self.src(clause)}` does not hold for `{decl.name}` here",
                    span,
                    label,
                    secondary=[(clause.span, "required here")],
                    notes=[self.where_values(clause, frame)],
                    help=help,
                )

    def where_values(self, clause: A.Expr, frame: Frame) -> str:
        names = sorted(
            {n.name for n in walk(clause) if isinstance(n, A.Name) and n.name in frame.env}
        )
        return "with " + ", ".join(f"{n} = {frame.env[n]}" for n in names)
