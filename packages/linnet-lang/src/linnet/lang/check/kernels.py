"""Builtins and kernels: `iota`, `fill`, `bitcast`, `program_id`, `load`, `store`, masks and
tiles, and what a kernel binding records."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import (
    KERNEL_BUILTINS,
    EvaluatorBase,
    Frame,
    fail,
    index_count,
    is_pow2,
    shape_str,
    type_str,
)
from linnet.lang.diagnostics.core import Span
from linnet.lang.ir.graph import Step, ValueType
from linnet.lang.ir.primitives import BINARY_FUNCTIONS, UNARY_FUNCTIONS
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const, FuncRef, Poison, Tensor


class Kernels(EvaluatorBase):
    """The Evaluator's kernels (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def builtin_call(self, name: str, expr: A.Call, frame: Frame) -> Any:
        if name in KERNEL_BUILTINS and not frame.in_kernel:
            raise fail(
                "E0501",
                f"`{name}` is only available inside a `kernel`",
                expr.span,
                "outside a kernel",
                help=(
                    "ops work on whole tensors; index variables take the place of "
                    "program ids: `let y[r, c] = x[r, c] * 2.0`"
                    if name == "program_id"
                    else "ops read and write tensors with index notation: `let y[i] = x[i]`"
                ),
            )
        if name in UNARY_FUNCTIONS or name in BINARY_FUNCTIONS or name == "select":
            args = [self.value(a, frame) for a in expr.args]
            return self.builtin_elementwise(name, args, expr, frame, labelled=False)
        if name == "bitcast":
            return self.bitcast([self.value(a, frame) for a in expr.args], expr, frame)
        if name == "iota":
            dtype = self.generic_dtype(expr, frame, "i32")
            if len(expr.args) != 1:
                raise fail("E0371", "`iota` takes one argument (its length)", expr.span)
            n = self.eval_dim(expr.args[0], frame)
            frame.tile_sizes.append((n, expr.args[0].span))
            self.check_tile(n, expr.args[0].span, frame)
            return self.builder.emit(
                "iota",
                [],
                (n,),
                dtype,
                {"shape": [self.concrete(n)], "axis": 0, "dtype": dtype},
                span=expr.span,
            )
        if name == "fill":
            dtype = self.generic_dtype(expr, frame, "f32")
            if not expr.args:
                raise fail("E0371", "`fill` takes a value and then the tile's dims", expr.span)
            value = self.value(expr.args[0], frame)
            dims = tuple(self.eval_dim(a, frame) for a in expr.args[1:])
            for d, a in zip(dims, expr.args[1:]):
                frame.tile_sizes.append((d, a.span))
                self.check_tile(d, a.span, frame)
            if isinstance(value, Tensor) and not value.shape:
                # A scalar computed in the kernel (a reduction's result, say): broadcast it.
                c = (
                    value
                    if value.dtype == dtype or not DT.is_concrete(dtype)
                    else self.builder.emit(
                        "convert", [value.ref], (), dtype, {"dtype": dtype}, span=expr.args[0].span
                    )
                )
            elif isinstance(value, Const):
                c = self.constant(value, dtype, expr.args[0].span)
            else:
                raise fail(
                    "E0523",
                    f"`fill` takes a scalar value, not {self.describe(value)}",
                    expr.args[0].span,
                    "not a scalar",
                    help="a tile already has its shape: use it as it is, or reduce it "
                    "to a scalar first (`max[c] v[c]`)",
                )
            return self.builder.emit(
                "broadcast",
                [c.ref],
                dims,
                dtype,
                {"shape": [self.concrete(d) for d in dims]},
                span=expr.span,
            )
        if name == "program_id":
            if len(expr.args) != 1:
                raise fail("E0371", "`program_id` takes one argument (the grid axis)", expr.span)
            axis = self.value(expr.args[0], frame)
            grid = len(frame.func.grid or []) if frame.func else 0
            if not (
                isinstance(axis, Const)
                and axis.known
                and isinstance(axis.value, Dim)
                and 0 <= (axis.value.value or 0) < max(grid, 1)
            ):
                grid_exprs = (frame.func.grid or []) if frame.func else []
                raise fail(
                    "E0504",
                    f"`program_id` axis must be an integer below the grid's "
                    f"{grid} ax{'is' if grid == 1 else 'es'}",
                    expr.args[0].span,
                    "bad axis",
                    help="a one-axis grid has only `program_id(0)`"
                    if grid <= 1
                    else f"grid axes are numbered from 0 to {grid - 1}",
                    secondary=[(grid_exprs[0].span.to(grid_exprs[-1].span), "the grid")]
                    if grid_exprs
                    else [],
                )
            if self.lowering:  # lowering a kernel to its tile graph (ir/tiles.py)
                return self.builder.emit(
                    "program_id", [], (), "i32", {"axis": axis.value.value}, span=expr.span
                )
            return Tensor("%?", (), "i32", kind="tile")
        if name == "load":
            return self.kernel_load(expr, frame)
        if name == "store":
            return self.kernel_store(expr, frame)
        if name == "atomic_add":
            return self.kernel_atomic_add(expr, frame)
        raise fail("E0432", f"cannot call `{name}`", expr.span)

    def generic_dtype(self, expr: A.Call, frame: Frame, default: str) -> str:
        if not expr.generic_args:
            return default
        g = expr.generic_args[0]
        name = g.name if isinstance(g, A.Name | A.ScalarType) else ""
        return self.eval_dtype(A.Name(name, g.span), frame)

    def kernel_binding_attrs(self, decl: A.FuncDecl, frame: Frame) -> dict[str, Any]:
        """What a call of the bound op ``decl`` records: ``kernel`` and ``kernel_generics``
        (the kernel and its generics), ``kernel_applies`` (every `where` clause holds), and
        for a chain (`kernel a<...> then b<...>`) ``kernel_then``, the next kernel's
        ``{"kernel", "kernel_generics"}`` (with its own ``kernel_then`` in a longer chain:
        ir/graph.py's ``kernel_stages`` lists them)."""
        assert decl.kernel is not None
        first = self.kernel_stage(decl, decl.kernel, frame)
        if first is None:
            return {}
        (name, kenv, holds) = first
        attrs: dict[str, Any] = {"kernel": name, "kernel_generics": kenv, "kernel_applies": holds}
        into, step = attrs, decl.kernel.then
        while step is not None:
            found = self.kernel_stage(decl, step, frame)
            if found is None:
                return {}
            into["kernel_then"] = {"kernel": found[0], "kernel_generics": found[1]}
            attrs["kernel_applies"] = attrs["kernel_applies"] and found[2]
            into, step = into["kernel_then"], step.then
        return attrs

    def kernel_stage(
        self, decl: A.FuncDecl, binding: A.KernelBinding, frame: Frame
    ) -> tuple[str, dict[str, Any], bool] | None:
        """(qualified name, generics, where clause holds) of one kernel of a binding."""
        kdecl = self.resolve_global(decl.module, binding.name, binding.span)  # type: ignore[arg-type]
        if not isinstance(kdecl, FuncRef):
            return None
        kenv = {}
        for g, a in zip(kdecl.decl.generics, binding.args):
            v = self.generic_value(g, a, frame)
            kenv[g.name] = v.value if isinstance(v, Dim) else v
        kframe = Frame(
            kdecl.decl.module,  # type: ignore[arg-type]
            {k: (Dim.const(v) if isinstance(v, int) else v) for k, v in kenv.items()},
        )
        holds = True
        for clause in kdecl.decl.where:
            c = self.value(clause, kframe)
            holds = holds and bool(isinstance(c, Const) and c.value)
        return kdecl.decl.qualified_name, kenv, holds

    def kernel_loop(self, stmt: A.For, lo: Any, hi: Any, frame: Frame) -> None:
        """A `for` loop of a kernel being lowered to its tile graph (ir/tiles.py): one
        ``for`` step whose ``body`` holds the loop's steps. Names the body assigns that were
        bound before the loop are carried: the loop starts from their values (the step's
        operands), its body reads them as ``carried`` values and ends with ``yields``, and
        after it they are the step's results."""
        assert isinstance(stmt.iterable, A.RangeExpr)
        it = stmt.iterable
        step = self.value(it.step, frame) if it.step is not None else Const(Dim.const(1), "int")
        bounds = []
        for v, e in ((lo, it.start), (hi, it.stop), (step, it.step or it.stop)):
            if isinstance(v, Poison):
                return
            # Checking, a bound may be a dim still symbolic (`K / BK`); lowering, it is known.
            if not (
                isinstance(v, Const)
                and isinstance(v.value, Dim)
                and (v.value.value is not None or not self.lowering)
            ):
                what = (
                    "a value computed in the kernel" if isinstance(v, Tensor) else self.describe(v)
                )
                raise fail(
                    "E0530",
                    "a kernel's loop bounds must be known when the kernel is "
                    f"compiled; this is {what}",
                    e.span,
                    "not a compile-time integer",
                    help="loop over dims and generics (`for k in 0..K / BK`), and "
                    "mask the last partial tile",
                )
            bounds.append(v.value.value)
        if not self.lowering:
            self.check_kernel_loop(stmt, frame)
            return
        start, stop, stride = (b or 0 for b in bounds)  # known when lowering (above)
        stop += 1 if it.inclusive else 0
        g = self.builder.graph
        assert g is not None
        lets = set()
        carried_names = []
        for name, is_let in assigned_names(stmt.body):
            if is_let:
                lets.add(name)
            elif (
                name not in lets
                and name not in carried_names
                and frame.lookup_local(name) is not None
            ):
                carried_names.append(name)
        inits, args = [], []
        for name in carried_names:
            v = frame.lookup_local(name)
            if isinstance(v, Const):
                v = self.constant(
                    v,
                    "f32"
                    if v.dtype in ("float", *DT.FLOATS)
                    else ("bool" if v.dtype == "bool" else "i32"),
                    stmt.span,
                )
            if not isinstance(v, Tensor):
                raise fail(
                    "E0531",
                    f"`{name}` is assigned in a kernel loop but is "
                    f"{self.describe(v)}, not a value the loop can carry",
                    stmt.span,
                    "this loop",
                    help="carry numbers and tiles through a loop",
                )
            arg = self.builder.fresh(name.lstrip("_") or "carry")
            g.values[arg] = ValueType(tuple(self.concrete(d) for d in v.shape), v.dtype)
            inits.append(v)
            args.append(arg)
            rebind(frame, name, Tensor(arg, v.shape, v.dtype, kind="tile"))
        var = self.builder.fresh(stmt.var)
        g.values[var] = ValueType((), "i32")
        seen, key_of = dict(self.builder._seen), dict(self.builder._key_of)
        first_step, first_call = len(g.steps), len(g.calls)
        frame.scopes.append({stmt.var: Tensor(var, (), "i32", kind="tile")})
        try:
            self.run_body(stmt.body, frame)
            yields = []
            for name, init in zip(carried_names, inits):
                v = frame.lookup_local(name)
                if isinstance(v, Const):
                    v = self.constant(v, init.dtype, stmt.span)
                if not isinstance(v, Tensor) or v.shape != init.shape or v.dtype != init.dtype:
                    raise fail(
                        "E0531",
                        f"`{name}` changes type in a kernel loop: "
                        f"{type_str(init)} before it, {self.describe(v)} after",
                        stmt.span,
                        "this loop",
                        help=carry_help(init, v),
                    )
                yields.append(v.ref)
        finally:
            frame.scopes.pop()
        body = g.steps[first_step:]
        del g.steps[first_step:]
        del g.calls[first_call:]  # spans of steps that now live in the loop's body
        # A value made in the body exists only there: later steps must not share it.
        self.builder._seen, self.builder._key_of = seen, key_of
        self.builder._last_fresh = None
        results = []
        for name, init in zip(carried_names, inits):
            r = self.builder.fresh(name.lstrip("_") or "carry")
            g.values[r] = (
                g.values[init.ref]
                if init.ref in g.values
                else ValueType(tuple(self.concrete(d) for d in init.shape), init.dtype)
            )
            results.append(r)
            rebind(frame, name, Tensor(r, init.shape, init.dtype, kind="tile"))
        g.steps.append(
            Step(
                "for",
                [i.ref for i in inits],
                results,
                {
                    "var": var,
                    "start": start,
                    "stop": stop,
                    "step": stride,
                    "carried": args,
                    "yields": yields,
                    "body": body,
                },
                self.builder._loc(stmt.span),
            )
        )

    def check_kernel_loop(self, stmt: A.For, frame: Frame) -> None:
        """Checking a kernel's loop: its body once, and what it carries keeps its type."""
        before = {
            name: frame.lookup_local(name)
            for name, is_let in assigned_names(stmt.body)
            if not is_let and frame.lookup_local(name) is not None
        }
        frame.scopes.append({stmt.var: Tensor("%?", (), "i32", kind="tile")})
        try:
            self.run_body(stmt.body, frame)
            for name, init in before.items():
                v = frame.lookup_local(name)
                if (
                    isinstance(init, Tensor)
                    and isinstance(v, Tensor)
                    and (v.shape != init.shape or v.dtype != init.dtype)
                ):
                    raise fail(
                        "E0531",
                        f"`{name}` changes type in a kernel loop: "
                        f"{type_str(init)} before it, {type_str(v)} after",
                        stmt.span,
                        "this loop",
                        help=carry_help(init, v),
                    )
        finally:
            frame.scopes.pop()

    def check_tile(self, n: Dim, span: Span, frame: Frame) -> None:
        if frame.in_kernel and n.value is not None and not is_pow2(n.value):
            raise fail(
                "E0505",
                f"tile size {n.value} is not a power of two",
                span,
                "tile size",
                help=f"use {1 << max(0, (n.value - 1).bit_length())} and mask the extra lanes",
            )

    def memory_index(
        self, target: A.Expr, frame: Frame, what: str, refs: list[Any] | None = None
    ) -> tuple[Tensor, tuple]:
        """The tensor ``target`` reads or writes and the tile shape its indices make; with
        ``refs`` (lowering), each index is appended to it: a value's ref or an int."""
        if not isinstance(target, A.Index) or not isinstance(target.base, A.Name):
            raise fail(
                "E0506",
                f"the first argument of `{what}` is a tensor parameter with indices",
                target.span,
                "expected `x[i, j]`",
                help=f"write `{what}(x[row, cols], ...)`",
            )
        base = frame.lookup_local(target.base.name)
        allowed = (
            frame.tensor_params
            if what == "load"
            else frame.scratch
            if what == "atomic_add"
            else set(frame.results) | frame.scratch
        )
        if target.base.name not in allowed or not isinstance(base, Tensor):
            extra = " and scratch buffers" if frame.scratch else ""
            which = {
                "load": "tensor parameters" + extra,
                "atomic_add": "the kernel's scratch buffers",
            }.get(what, "the kernel's named results" + extra)
            if what == "atomic_add":
                raise fail(
                    "E0507",
                    f"`atomic_add` counts in {which}; `{target.base.name}` is not one",
                    target.base.span,
                    "not a scratch buffer",
                    help="declare the counters after the grid, zeroed at first and "
                    "kept between launches: `grid(G) scratch(count: Tensor[G; "
                    "i32])`; the program that sees the last count resets it",
                )
            raise fail(
                "E0507",
                f"`{what}` works on {which}; `{target.base.name}` is not one",
                target.base.span,
                "not allowed here",
                help=(
                    "tensor parameters are read-only: store into a named result "
                    f"(`-> {', '.join(frame.results) or 'y'}: Tensor[...]`)"
                    if what == "store" and target.base.name in frame.tensor_params
                    else "tiles live in registers; compute with them directly"
                ),
            )
        if len(target.indices) != base.rank:
            raise fail(
                "E0303",
                index_count(f"`{target.base.name}`", base.rank, len(target.indices)),
                target.span,
                type_str(base),
                help="give one index per dimension",
            )
        shape: tuple[Dim, ...] = ()
        for idx in target.indices:
            v = self.value(idx, frame)
            if isinstance(v, Const):
                if refs is not None:
                    refs.append(self.concrete(v.value) if isinstance(v.value, Dim) else v.value)
                continue
            if not isinstance(v, Tensor) or not (DT.is_int(v.dtype)):
                raise fail(
                    "E0382",
                    "a kernel index is an integer or an integer tile",
                    idx.span,
                    "not an integer",
                )
            shape = shape + v.shape
            if refs is not None:
                refs.append(v.ref)
        return base, shape

    def kernel_load(self, expr: A.Call, frame: Frame) -> Tensor:
        if not 1 <= len(expr.args) <= 3:
            raise fail(
                "E0371", "`load` takes x[...], then an optional mask and other value", expr.span
            )
        refs: list[Any] | None = [] if self.lowering else None
        base, shape = self.memory_index(expr.args[0], frame, "load", refs)
        mask = self.kernel_mask(expr.args[1:2], shape, frame)
        other = None
        if len(expr.args) == 3:
            other = self.kernel_other(expr.args[2], base.dtype, shape, frame)
        if refs is not None:
            op, operands, attrs = self.memory_step(base, refs, mask, other)
            return self.builder.emit(op, operands, shape, base.dtype, attrs, span=expr.span)
        return Tensor("%?", shape, base.dtype, kind="tile")

    def memory_step(
        self, base: Tensor, refs: list[Any], mask: Any, other: Any = None
    ) -> tuple[str, list[str], dict[str, Any]]:
        """A `load`'s step for the tile graph (op, operands, attributes): operands are the
        tensor, the index tiles, then the mask and `other` where they are tiles; the
        attributes say which operand is which (``index``: per axis an operand position or
        an int), and hold a constant mask or other."""
        operands = [base.ref]
        index: list[Any] = []
        for r in refs:
            if isinstance(r, str):
                index.append({"operand": len(operands)})
                operands.append(r)
            else:
                index.append(r)
        attrs: dict[str, Any] = {"index": index}
        for key, v in (("mask", mask), ("other", other)):
            if isinstance(v, Tensor):
                attrs[key] = {"operand": len(operands)}
                operands.append(v.ref)
            elif isinstance(v, Const) and v.value is not None:
                attrs[key] = v.value.value if isinstance(v.value, Dim) else v.value
        return "load", operands, attrs

    def kernel_other(self, arg: A.Expr, dtype: str, shape: tuple, frame: Frame) -> Any:
        """`load`'s `other`: a scalar or a tile that broadcasts to the loaded tile, of a
        dtype the loaded values can take (it fills the masked-off lanes)."""
        v = self.value(arg, frame)
        if isinstance(v, Poison):  # already reported where it was made
            return v
        if isinstance(v, Const):
            fits = (v.dtype == "bool") == (dtype == "bool") and not (
                v.dtype in ("float", *DT.FLOATS) and not DT.is_float(dtype)
            )
            if not fits:
                raise fail(
                    "E0524",
                    f"`load`'s other value is {v.dtype} but the loaded tile is {dtype}",
                    arg.span,
                    f"{v.dtype} here",
                    help="`other` fills the lanes the mask leaves out: give a value "
                    f"of the tensor's dtype ({dtype})",
                )
            return v
        if not isinstance(v, Tensor):
            raise fail(
                "E0524",
                f"`load`'s other value is {self.describe(v)}, not a scalar or a tile",
                arg.span,
                "not a value",
                help=f"give a number (`0.0`) or a tile of {dtype}",
            )
        if v.dtype != dtype:
            raise fail(
                "E0524",
                f"`load`'s other value is {v.dtype} but the loaded tile is {dtype}",
                arg.span,
                f"{v.dtype} here",
                help=f"convert it: `(...) as {dtype}`",
            )
        if not broadcasts(v.shape, shape):
            raise fail(
                "E0524",
                f"`load`'s other value has shape {shape_str(v.shape)}, which "
                f"does not broadcast to the loaded tile's {shape_str(shape)}",
                arg.span,
                "shape differs",
                help="give a scalar, or a tile of the loaded tile's shape",
            )
        return v

    def kernel_store(self, expr: A.Call, frame: Frame) -> None:
        if not 2 <= len(expr.args) <= 3:
            raise fail("E0371", "`store` takes y[...], a value and an optional mask", expr.span)
        refs: list[Any] | None = [] if self.lowering else None
        base, shape = self.memory_index(expr.args[0], frame, "store", refs)
        value = self.value(expr.args[1], frame)
        if isinstance(value, Tensor):
            if value.dtype != base.dtype:
                raise fail(
                    "E0508",
                    f"storing {value.dtype} into a {base.dtype} result",
                    expr.args[1].span,
                    f"{value.dtype} here",
                    help=f"convert explicitly: `(...) as {base.dtype}`",
                )
            if value.shape and value.shape != shape:
                raise fail(
                    "E0509",
                    f"storing a tile of shape {shape_str(value.shape)} at "
                    f"positions of shape {shape_str(shape)}",
                    expr.args[1].span,
                    "shape differs",
                )
        mask = self.kernel_mask(expr.args[2:3], shape, frame)
        assert isinstance(expr.args[0], A.Index) and isinstance(expr.args[0].base, A.Name)
        frame.stored_results.add(expr.args[0].base.name)
        if refs is not None:
            if isinstance(value, Const):
                value = self.constant(value, base.dtype, expr.args[1].span)
            _, operands, attrs = self.memory_step(base, refs, mask)
            attrs["value"] = {"operand": len(operands)}
            self.builder.effect("store", [*operands, value.ref], attrs, expr.span)
        return None

    def kernel_atomic_add(self, expr: A.Call, frame: Frame) -> Tensor:
        """`atomic_add(count[i, ...], v)`: adds the i32 scalar ``v`` to one element of a
        scratch buffer and returns the element's value before, as one indivisible step of the
        whole grid. It orders memory: what the program loaded and stored before it happens
        before what a program does after an `atomic_add` of the same element that returns
        a later count (acquire and release, at device scope). So the program that sees
        ``count`` reach the number of programs that add to it reads every other one's stores."""
        if len(expr.args) != 2:
            raise fail("E0371", "`atomic_add` takes count[...] and the i32 value to add", expr.span)
        refs: list[Any] | None = [] if self.lowering else None
        base, shape = self.memory_index(expr.args[0], frame, "atomic_add", refs)
        if shape or base.dtype != "i32":
            what = f"a tile of shape {shape_str(shape)}" if shape else f"{base.dtype}, not i32"
            raise fail(
                "E0547",
                f"`atomic_add` counts in one i32 element; this is {what}",
                expr.args[0].span,
                "not one i32 element",
                help="index every axis with a scalar (`count[b, h]`) of an i32 "
                "scratch buffer (`scratch(count: Tensor[B, H; i32])`)",
            )
        value = self.value(expr.args[1], frame)
        if not (
            (isinstance(value, Const) and value.dtype in ("int", "i32"))
            or (isinstance(value, Tensor) and not value.shape and value.dtype == "i32")
        ):
            raise fail(
                "E0547",
                f"`atomic_add` adds an i32 scalar, not {self.describe(value)}",
                expr.args[1].span,
                "not an i32 scalar",
                help="add a count: `1`",
            )
        if refs is None:
            return Tensor("%?", (), "i32", kind="tile")
        if isinstance(value, Const):
            value = self.constant(value, "i32", expr.args[1].span)
        _, operands, attrs = self.memory_step(base, refs, None)
        attrs["value"] = {"operand": len(operands)}
        return self.builder.emit(
            "atomic_add", [*operands, value.ref], (), "i32", attrs, span=expr.span
        )

    def kernel_mask(self, args: list[A.Expr], shape: tuple, frame: Frame) -> Any:
        if not args:
            return None
        m = self.value(args[0], frame)
        if isinstance(m, Tensor | Const) and m.dtype != "bool":
            raise fail(
                "E0353",
                "a mask must be bool",
                args[0].span,
                f"{m.dtype} here",
                help="compare: `cols < C`",
            )
        if isinstance(m, Tensor) and not broadcasts(m.shape, shape):
            raise fail(
                "E0525",
                f"a mask of shape {shape_str(m.shape)} does not broadcast to "
                f"the tile's shape {shape_str(shape)}",
                args[0].span,
                "mask shape",
                help="build the mask from the same index tiles as the access: "
                "`cols < C` for `x[row, cols]`",
            )
        return m


def broadcasts(have: tuple, want: tuple) -> bool:
    """Whether a tile of shape ``have`` broadcasts to ``want`` (numpy's rule, from the
    right: equal dims or 1).

    >>> broadcasts((), (Dim.const(4),)), broadcasts((Dim.const(2),), (Dim.const(4),))
    (True, False)
    """
    if len(have) > len(want):
        return False
    return all(h == w or h == Dim.const(1) for h, w in zip(reversed(have), reversed(want)))


def assigned_names(block: A.Block) -> list[tuple[str, bool]]:
    """The names a block binds, in order: ``(name, True)`` for a `let`, ``(name, False)``
    for an assignment, nested loops included (what a kernel loop carries)."""
    out: list[tuple[str, bool]] = []
    for stmt in block.statements:
        if isinstance(stmt, A.Let):
            out.append((stmt.name, True))
        elif isinstance(stmt, A.Assign) and isinstance(stmt.target, A.Name):
            out.append((stmt.target.name, False))
        elif isinstance(stmt, A.For):
            out.extend(assigned_names(stmt.body))
    return out


def rebind(frame: Frame, name: str, value: Any) -> None:
    """Set ``name`` in the innermost scope that binds it."""
    for scope in reversed(frame.scopes):
        if name in scope:
            scope[name] = value
            return
    frame.bind(name, value)


def carry_help(before: Tensor, after: Any) -> str:
    """E0531's help: what keeps a loop-carried value's type."""
    head = "a value carried from one iteration to the next keeps its shape and dtype: "
    if isinstance(after, Tensor) and after.shape == before.shape:
        return head + f"convert it (`... as {before.dtype}`)"
    return head + "give a value of another shape a new name (`let total = ...`)"
