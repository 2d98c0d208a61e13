"""Name resolution: globals, `use` imports, constants, local lookup, and
the dims, dtypes and tensor types that annotations name."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.const_tensors import materialize
from linnet.lang.check.core import (
    BUILTINS,
    MAX_DEPTH,
    NEGATIVE_HELP,
    EvaluatorBase,
    Fail,
    Frame,
    IndexVar,
    fail,
)
from linnet.lang.check.hints import did_you_mean
from linnet.lang.diagnostics.core import Diagnostic, Span
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import (
    POISON,
    Builtin,
    Const,
    ConstTensor,
    DType,
    FuncRef,
    Poison,
)


class Names(EvaluatorBase):
    """The Evaluator's names (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def resolve_global(self, module: A.Module, name: str, span: Span) -> Any:
        item = module.find(name)
        if item is None:
            for use in module.uses:
                for imported, name_span in use.names:
                    if imported != name:
                        continue
                    target = self.program.module(".".join(use.module))
                    if target is None:
                        return POISON
                    item = target.find(name)
                    if (item is None or not getattr(item, "public", True)) and span != name_span:
                        return POISON  # reported at the `use` itself
                    if item is None:
                        public = [
                            str(getattr(i, "name", ""))
                            for i in target.items
                            if getattr(i, "public", False)
                        ]
                        raise fail(
                            "E0202",
                            f"`{name}` is not in module `{'.'.join(use.module)}`",
                            span,
                            "not found there",
                            help=did_you_mean(
                                name,
                                public,
                                f"`{'.'.join(use.module)}` "
                                "exports: " + (", ".join(sorted(public)) or "nothing"),
                                cutoff=0.8,
                            ),
                        )
                    if not getattr(item, "public", True):
                        raise fail(
                            "E0203",
                            f"`{name}` is private to `{'.'.join(use.module)}`",
                            span,
                            "private item",
                            help=f"mark it `pub` in `{'.'.join(use.module)}`",
                            secondary=[
                                (getattr(item, "name_span", item.span), "declared without `pub`")
                            ],
                        )
        if item is None:
            return None
        if isinstance(item, A.FuncDecl):
            return FuncRef(item)
        if isinstance(item, A.BlockDecl):
            return item
        if isinstance(item, A.Const):
            return self.const_value(item, module, span)
        return None

    def const_value(self, item: A.Const, module: A.Module, span: Span) -> Any:
        """A constant's value; a constant defined through itself is E0206, not a recursion."""
        for k, (c, _) in enumerate(self.const_stack):
            if c is item:
                cycle = [c.name for c, _ in self.const_stack[k:]] + [item.name]
                raise fail(
                    "E0206",
                    f"constant `{item.name}` is defined in terms of itself: "
                    + " -> ".join(f"`{n}`" for n in cycle),
                    span,
                    "used here",
                    help="give one of them a value that does not refer back",
                    secondary=[
                        (c.span, f"`{c.name}` defined here") for c, _ in self.const_stack[k:]
                    ][:4],
                )
        cached = self.const_cache.get(id(item))
        if cached is not None and cached[0] is item:
            return cached[1]
        if len(self.const_stack) >= MAX_DEPTH:
            chain = [c for c, _ in self.const_stack]
            for c in chain:  # reported once, here, not again for every constant of the chain
                self.const_cache[id(c)] = (c, POISON)
            raise fail(
                "E0209",
                f"constant `{chain[0].name}` is defined through more than "
                f"{MAX_DEPTH} other constants",
                span,
                "the limit is reached here",
                help="define some of them directly, with fewer steps between",
                secondary=[(chain[0].span, f"`{chain[0].name}` defined here")],
            )
        self.const_stack.append((item, span))
        try:
            value = self.value(item.value, Frame(module, {}))
        except Fail:
            # A cycle or a chain too long is reported once, for the first constant in it.
            for c, _ in self.const_stack:
                self.const_cache[id(c)] = (c, POISON)
            raise
        finally:
            self.const_stack.pop()
        if isinstance(value, Const):  # scalars only: their value never depends on the caller
            self.const_cache[id(item)] = (item, value)
        return value

    def lookup(self, frame: Frame, name: str, span: Span) -> Any:
        local = frame.lookup_local(name)
        if local is not None:
            if frame.in_kernel and frame.results.get(name) is local:
                # `store` reaches its target through `lookup_local`; any other use reads it.
                raise fail(
                    "E0528",
                    f"kernel result `{name}` is read; results appear only in `store`",
                    span,
                    "read here",
                    help="keep the value in a tile (`let t = ...`) and use the tile; "
                    f"write the result with `store({name}[...], t)`",
                )
            return local
        if name in frame.ivars:
            return IndexVar(name)
        if name in frame.env:
            v = frame.env[name]
            if isinstance(v, Dim):
                return Const(v, "int")
            if isinstance(v, str):
                return DType(v)
            if isinstance(v, ConstTensor):
                return materialize(self, v, span)
            return v
        if name == "self":
            if frame.owner is None:
                raise fail(
                    "E0204",
                    "`self` is only defined in a block's methods",
                    span,
                    "no block here",
                    help="read parameters inside a block's `fn`",
                )
            return frame.owner
        g = self.resolve_global(frame.module, name, span)
        if g is not None:
            return g
        if name in BUILTINS:
            return Builtin(name)
        if name in DT.DTYPES:
            return DType(name)
        help = "declare it with `let`, or import it with `use`"
        if self.suggestions_left > 0:
            # A did-you-mean costs time linear in the names in scope: give it to the first
            # errors only, so that thousands of unknown names stay linear.
            self.suggestions_left -= 1
            candidates = (
                list(frame.local_names())
                + list(frame.ivars)
                + list(frame.env)
                + frame.module.item_names
                + [n for u in frame.module.uses for n, _ in u.names]
                + sorted(BUILTINS)
            )
            help = did_you_mean(name, candidates, help)
        if name in ("sum", "max", "min", "mean", "prod"):
            raise fail(
                "E0201",
                f"`{name}` is a reduction, not a function",
                span,
                "called like a function",
                help=f"name the reduced index: `{name}[i] x[i]`",
            )
        raise fail("E0201", f"unknown name `{name}`", span, "not defined here", help=help)

    def resolve_quiet(self, frame: Frame, name: str) -> Any:
        try:
            return self.resolve_global(frame.module, name, Span(frame.module.source, 0, 0)) or (
                Builtin(name) if name in BUILTINS else None
            )
        except Fail:
            return None

    def eval_dim(self, expr: A.Expr, frame: Frame) -> Dim:
        v = self.value(expr, frame)
        if isinstance(v, Const) and isinstance(v.value, Dim):
            return v.value
        if isinstance(v, Poison):
            raise Fail(Diagnostic("E0000", "poisoned"))
        raise fail(
            "E0401",
            "a dimension must be a compile-time integer",
            expr.span,
            "not an integer dimension",
            help="dimensions are written with `Dim` generics, integers, `+ - * /`",
        )

    def eval_dtype(self, name: A.Name, frame: Frame) -> str:
        if name.name in DT.DTYPES:
            return name.name
        v = frame.env.get(name.name)
        if isinstance(v, str):
            return v
        if name.name in frame.env:
            raise fail(
                "E0402",
                f"`{name.name}` is a dimension, not an element type",
                name.span,
                "expected a dtype",
                help="element types are f32, bf16, f16, i32, bool, ... or a `DType` generic",
            )
        raise fail(
            "E0403",
            f"unknown element type `{name.name}`",
            name.span,
            "not a dtype",
            help=did_you_mean(name.name, DT.DTYPES, "element types are " + ", ".join(DT.DTYPES)),
        )

    def tensor_type(self, typ: A.TypeExpr, frame: Frame) -> tuple[tuple[Dim, ...], str]:
        if isinstance(typ, A.TensorType):
            dims = tuple(self.eval_dim(d, frame) for d in typ.dims)
            for d, expr in zip(dims, typ.dims):
                if d.value is not None and d.value < 0:
                    raise fail(
                        "E0619",
                        f"`{self.src(expr)}` = {d.value} is a negative size",
                        expr.span,
                        f"= {d.value}",
                        help=NEGATIVE_HELP,
                    )
            return dims, self.eval_dtype(typ.dtype, frame)
        if isinstance(typ, A.ScalarType):
            return (), self.eval_dtype(A.Name(typ.name, typ.span), frame)
        raise fail("E0404", "expected a tensor or scalar type", typ.span, "this is a block type")
