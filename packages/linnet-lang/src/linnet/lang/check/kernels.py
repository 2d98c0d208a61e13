"""Builtins and kernels: `iota`, `fill`, `program_id`, `load`, `store`, masks and
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
from linnet.lang.ir.primitives import BINARY_FUNCTIONS, UNARY_FUNCTIONS
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const, FuncRef, Poison, Tensor


class Kernels(EvaluatorBase):
    """The Evaluator's kernels (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def builtin_call(self, name: str, expr: A.Call, frame: Frame) -> Any:
        if name in KERNEL_BUILTINS and not frame.in_kernel:
            raise fail("E0501", f"`{name}` is only available inside a `kernel`", expr.span,
                       "outside a kernel",
                       help=("ops work on whole tensors; index variables take the place of "
                             "program ids: `let y[r, c] = x[r, c] * 2.0`"
                             if name == "program_id" else
                             "ops read and write tensors with index notation: "
                             "`let y[i] = x[i]`"))
        if name in UNARY_FUNCTIONS or name in BINARY_FUNCTIONS or name == "select":
            args = [self.value(a, frame) for a in expr.args]
            return self.builtin_elementwise(name, args, expr, frame, labelled=False)
        if name == "iota":
            dtype = self.generic_dtype(expr, frame, "i32")
            if len(expr.args) != 1:
                raise fail("E0371", "`iota` takes one argument (its length)", expr.span)
            n = self.eval_dim(expr.args[0], frame)
            frame.tile_sizes.append((n, expr.args[0].span))
            self.check_tile(n, expr.args[0].span, frame)
            return self.builder.emit("iota", [], (n,), dtype,
                                     {"shape": [self.concrete(n)], "axis": 0, "dtype": dtype},
                                     span=expr.span)
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
                c = value if value.dtype == dtype or not DT.is_concrete(dtype) else \
                    self.builder.emit("convert", [value.ref], (), dtype, {"dtype": dtype},
                                      span=expr.args[0].span)
            elif isinstance(value, Const):
                c = self.constant(value, dtype, expr.args[0].span)
            else:
                raise fail("E0523", f"`fill` takes a scalar value, not {self.describe(value)}",
                           expr.args[0].span, "not a scalar",
                           help="a tile already has its shape: use it as it is, or reduce it "
                                "to a scalar first (`max[c] v[c]`)")
            return self.builder.emit("broadcast", [c.ref], dims, dtype,
                                     {"shape": [self.concrete(d) for d in dims]}, span=expr.span)
        if name == "program_id":
            if len(expr.args) != 1:
                raise fail("E0371", "`program_id` takes one argument (the grid axis)", expr.span)
            axis = self.value(expr.args[0], frame)
            grid = len(frame.func.grid or []) if frame.func else 0
            if not (isinstance(axis, Const) and axis.known and isinstance(axis.value, Dim)
                    and 0 <= (axis.value.value or 0) < max(grid, 1)):
                grid_exprs = (frame.func.grid or []) if frame.func else []
                raise fail("E0504", f"`program_id` axis must be an integer below the grid's "
                           f"{grid} ax{'is' if grid == 1 else 'es'}", expr.args[0].span,
                           "bad axis", help="a one-axis grid has only `program_id(0)`"
                           if grid <= 1 else f"grid axes are numbered from 0 to {grid - 1}",
                           secondary=[(grid_exprs[0].span.to(grid_exprs[-1].span), "the grid")]
                           if grid_exprs else [])
            return Tensor("%?", (), "i32", kind="tile")
        if name == "load":
            return self.kernel_load(expr, frame)
        if name == "store":
            return self.kernel_store(expr, frame)
        raise fail("E0432", f"cannot call `{name}`", expr.span)

    def generic_dtype(self, expr: A.Call, frame: Frame, default: str) -> str:
        if not expr.generic_args:
            return default
        g = expr.generic_args[0]
        name = g.name if isinstance(g, A.Name | A.ScalarType) else ""
        return self.eval_dtype(A.Name(name, g.span), frame)

    def kernel_binding_attrs(self, decl: A.FuncDecl, frame: Frame) -> dict[str, Any]:
        assert decl.kernel is not None
        kdecl = self.resolve_global(decl.module, decl.kernel.name, decl.kernel.span)  # type: ignore[arg-type]
        if not isinstance(kdecl, FuncRef):
            return {}
        kenv = {}
        for g, a in zip(kdecl.decl.generics, decl.kernel.args):
            v = self.generic_value(g, a, frame)
            kenv[g.name] = v.value if isinstance(v, Dim) else v
        kframe = Frame(kdecl.decl.module, {k: (Dim.const(v) if isinstance(v, int) else v)  # type: ignore[arg-type]
                                           for k, v in kenv.items()})
        holds = True
        for clause in kdecl.decl.where:
            c = self.value(clause, kframe)
            holds = holds and bool(isinstance(c, Const) and c.value)
        return {"kernel": kdecl.decl.qualified_name, "kernel_generics": kenv,
                "kernel_applies": holds}

    def check_tile(self, n: Dim, span: Span, frame: Frame) -> None:
        if frame.in_kernel and n.value is not None and not is_pow2(n.value):
            raise fail("E0505", f"tile size {n.value} is not a power of two", span,
                       "tile size", help=f"use {1 << max(0, (n.value - 1).bit_length())} and "
                       "mask the extra lanes")

    def memory_index(self, target: A.Expr, frame: Frame, what: str) -> tuple[Tensor, tuple]:
        if not isinstance(target, A.Index) or not isinstance(target.base, A.Name):
            raise fail("E0506", f"the first argument of `{what}` is a tensor parameter with "
                       "indices", target.span, "expected `x[i, j]`",
                       help=f"write `{what}(x[row, cols], ...)`")
        base = frame.lookup_local(target.base.name)
        allowed = frame.tensor_params if what == "load" else set(frame.results)
        if target.base.name not in allowed or not isinstance(base, Tensor):
            which = "tensor parameters" if what == "load" else "the kernel's named results"
            raise fail("E0507", f"`{what}` works on {which}; `{target.base.name}` is not one",
                       target.base.span, "not allowed here",
                       help=("tensor parameters are read-only: store into a named result "
                             f"(`-> {', '.join(frame.results) or 'y'}: Tensor[...]`)"
                             if what == "store" and target.base.name in frame.tensor_params else
                             "tiles live in registers; compute with them directly"))
        if len(target.indices) != base.rank:
            raise fail("E0303", index_count(f"`{target.base.name}`", base.rank,
                                            len(target.indices)), target.span, type_str(base),
                       help="give one index per dimension")
        shape: tuple[Dim, ...] = ()
        for idx in target.indices:
            v = self.value(idx, frame)
            if isinstance(v, Const):
                continue
            if not isinstance(v, Tensor) or not (DT.is_int(v.dtype)):
                raise fail("E0382", "a kernel index is an integer or an integer tile", idx.span,
                           "not an integer")
            shape = shape + v.shape
        return base, shape

    def kernel_load(self, expr: A.Call, frame: Frame) -> Tensor:
        if not 1 <= len(expr.args) <= 3:
            raise fail("E0371", "`load` takes x[...], then an optional mask and other value",
                       expr.span)
        base, shape = self.memory_index(expr.args[0], frame, "load")
        self.kernel_mask(expr.args[1:2], shape, frame)
        if len(expr.args) == 3:
            self.kernel_other(expr.args[2], base.dtype, shape, frame)
        return Tensor("%?", shape, base.dtype, kind="tile")

    def kernel_other(self, arg: A.Expr, dtype: str, shape: tuple, frame: Frame) -> None:
        """`load`'s `other`: a scalar or a tile that broadcasts to the loaded tile, of a
        dtype the loaded values can take (it fills the masked-off lanes)."""
        v = self.value(arg, frame)
        if isinstance(v, Poison):  # already reported where it was made
            return
        if isinstance(v, Const):
            fits = (v.dtype == "bool") == (dtype == "bool") and not (
                v.dtype in ("float", *DT.FLOATS) and not DT.is_float(dtype))
            if not fits:
                raise fail("E0524", f"`load`'s other value is {v.dtype} but the loaded tile "
                           f"is {dtype}", arg.span, f"{v.dtype} here",
                           help="`other` fills the lanes the mask leaves out: give a value "
                                f"of the tensor's dtype ({dtype})")
            return
        if not isinstance(v, Tensor):
            raise fail("E0524", f"`load`'s other value is {self.describe(v)}, not a scalar "
                       "or a tile", arg.span, "not a value",
                       help=f"give a number (`0.0`) or a tile of {dtype}")
        if v.dtype != dtype:
            raise fail("E0524", f"`load`'s other value is {v.dtype} but the loaded tile is "
                       f"{dtype}", arg.span, f"{v.dtype} here",
                       help=f"convert it: `(...) as {dtype}`")
        if not broadcasts(v.shape, shape):
            raise fail("E0524", f"`load`'s other value has shape {shape_str(v.shape)}, which "
                       f"does not broadcast to the loaded tile's {shape_str(shape)}",
                       arg.span, "shape differs",
                       help="give a scalar, or a tile of the loaded tile's shape")

    def kernel_store(self, expr: A.Call, frame: Frame) -> None:
        if not 2 <= len(expr.args) <= 3:
            raise fail("E0371", "`store` takes y[...], a value and an optional mask", expr.span)
        base, shape = self.memory_index(expr.args[0], frame, "store")
        value = self.value(expr.args[1], frame)
        if isinstance(value, Tensor):
            if value.dtype != base.dtype:
                raise fail("E0508", f"storing {value.dtype} into a {base.dtype} result",
                           expr.args[1].span, f"{value.dtype} here",
                           help=f"convert explicitly: `(...) as {base.dtype}`")
            if value.shape and value.shape != shape:
                raise fail("E0509", f"storing a tile of shape {shape_str(value.shape)} at "
                           f"positions of shape {shape_str(shape)}", expr.args[1].span,
                           "shape differs")
        self.kernel_mask(expr.args[2:3], shape, frame)
        assert isinstance(expr.args[0], A.Index) and isinstance(expr.args[0].base, A.Name)
        frame.stored_results.add(expr.args[0].base.name)
        return None

    def kernel_mask(self, args: list[A.Expr], shape: tuple, frame: Frame) -> None:
        if not args:
            return
        m = self.value(args[0], frame)
        if isinstance(m, Tensor | Const) and m.dtype != "bool":
            raise fail("E0353", "a mask must be bool", args[0].span, f"{m.dtype} here",
                       help="compare: `cols < C`")
        if isinstance(m, Tensor) and not broadcasts(m.shape, shape):
            raise fail("E0525", f"a mask of shape {shape_str(m.shape)} does not broadcast to "
                       f"the tile's shape {shape_str(shape)}", args[0].span, "mask shape",
                       help="build the mask from the same index tiles as the access: "
                            "`cols < C` for `x[row, cols]`")


def broadcasts(have: tuple, want: tuple) -> bool:
    """Whether a tile of shape ``have`` broadcasts to ``want`` (numpy's rule, from the
    right: equal dims or 1).

    >>> broadcasts((), (Dim.const(4),)), broadcasts((Dim.const(2),), (Dim.const(4),))
    (True, False)
    """
    if len(have) > len(want):
        return False
    return all(h == w or h == Dim.const(1) for h, w in zip(reversed(have), reversed(want)))
