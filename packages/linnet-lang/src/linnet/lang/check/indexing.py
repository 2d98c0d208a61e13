"""Index notation, reads: labelled tensors, positions, takes and gathers."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import EvaluatorBase, Fail, Frame, IndexVar, fail, type_str
from linnet.lang.diagnostics.core import Diagnostic, Span
from linnet.lang.ir.primitives import BINARY_FUNCTIONS, BINARY_OPERATORS, UNARY_FUNCTIONS
from linnet.lang.syntax.walk import walk
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Builtin, Const, Poison, Tensor


class Indexing(EvaluatorBase):
    """The Evaluator's indexing (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def label_key(self, frame: Frame, label: str) -> int:
        try:
            return frame.order.index(label)
        except ValueError:
            frame.order.append(label)
            return len(frame.order) - 1

    def union_labels(self, tensors: list[Tensor], frame: Frame) -> tuple[str, ...]:
        seen: set[str] = set()
        for t in tensors:
            seen.update(t.labels or ())
        return tuple(sorted(seen, key=lambda lab: self.label_key(frame, lab)))

    def label_dim(self, frame: Frame, label: str) -> Dim:
        d = frame.ivars.get(label)
        if d is None:
            raise Fail(Diagnostic("E0000", "unknown range"))
        return d

    def canonical(self, t: Tensor, frame: Frame, span: Span) -> Tensor:
        labels = t.labels or ()
        order = sorted(range(len(labels)), key=lambda i: self.label_key(frame, labels[i]))
        if order == list(range(len(labels))):
            return t
        return self.builder.emit(
            "transpose",
            [t.ref],
            tuple(t.shape[i] for i in order),
            t.dtype,
            {"perm": order},
            span=span,
            labels=tuple(labels[i] for i in order),
        )

    def align(self, t: Tensor, union: tuple[str, ...], span: Span) -> Tensor:
        """Reshape a canonical labelled tensor to the rank of ``union`` (size-1 where absent)."""
        labels = t.labels or ()
        if labels == union:
            return t
        if not labels and t.rank == 0:
            return t
        pos = {lab: i for i, lab in enumerate(labels)}
        shape = tuple(t.shape[pos[lab]] if lab in pos else Dim.const(1) for lab in union)
        return self.builder.emit(
            "reshape",
            [t.ref],
            shape,
            t.dtype,
            {"shape": [self.concrete(d) for d in shape]},
            span=span,
            labels=union,
        )

    def concrete(self, d: Dim) -> int | str:
        return d.value if d.value is not None else str(d)

    def lab(self, expr: A.Expr, frame: Frame) -> Any:
        """Evaluate inside index notation; tensors come back labelled."""
        if isinstance(expr, A.Name):
            v = self.lookup(frame, expr.name, expr.span)
            if isinstance(v, IndexVar):
                d = self.label_dim(frame, v.name)
                t = self.builder.emit(
                    "iota",
                    [],
                    (d,),
                    "i32",
                    {"shape": [self.concrete(d)], "axis": 0, "dtype": "i32"},
                    span=expr.span,
                    labels=(v.name,),
                )
                return t
            if isinstance(v, Tensor):
                if v.rank == 0:
                    return v.relabel(())
                raise fail(
                    "E0304",
                    f"tensor `{expr.name}` needs indices here",
                    expr.span,
                    f"{type_str(v)} without indices",
                    help=f"index it: `{expr.name}[{self.suggest_indices(v, frame)}]`",
                )
            if isinstance(v, Const | Poison):
                return v
            raise fail("E0351", f"cannot compute with {self.describe(v)}", expr.span)
        if isinstance(expr, A.IntLit | A.FloatLit | A.BoolLit):
            return self.value(expr, frame)
        if isinstance(expr, A.Unary):
            x = self.lab(expr.operand, frame)
            return self.elementwise(
                "neg" if expr.op == "-" else "not", [x], expr.span, frame, labelled=True
            )
        if isinstance(expr, A.Binary):
            a = self.lab(expr.left, frame)
            b = self.lab(expr.right, frame)
            return self.elementwise(
                BINARY_OPERATORS[expr.op], [a, b], expr.span, frame, labelled=True
            )
        if isinstance(expr, A.Cast):
            return self.cast(self.lab(expr.operand, frame), expr, frame)
        if isinstance(expr, A.Call):
            name = expr.callee.name if isinstance(expr.callee, A.Name) else ""
            callee = self.lookup(frame, name, expr.callee.span) if name else None
            if isinstance(callee, Builtin) and (
                name in UNARY_FUNCTIONS or name in BINARY_FUNCTIONS or name == "select"
            ):
                args = [self.lab(a, frame) for a in expr.args]
                return self.builtin_elementwise(name, args, expr, frame, labelled=True)
            if isinstance(callee, Builtin) and name == "bitcast":
                return self.bitcast([self.lab(a, frame) for a in expr.args], expr, frame)
            if frame.in_kernel:
                v = self.value(expr, frame)
                if isinstance(v, Tensor) and v.rank > 0:
                    # A tile has no index names: inside index notation it would not say
                    # which of its axes is which.
                    raise fail(
                        "E0304",
                        f"this {type_str(v)} tile needs indices here",
                        expr.span,
                        "a tile without indices",
                        help="name it first (`let t = " + self.src(expr) + "`), then "
                        "index it: `t[i, j]`",
                    )
                return v.relabel(()) if isinstance(v, Tensor) else v
            raise fail(
                "E0370",
                "only elementwise functions can be called inside index notation",
                expr.span,
                "a call on whole tensors",
                help="compute it in its own statement: `let t = f(x)`, then index `t`",
            )
        if isinstance(expr, A.Index):
            return self.read(expr, frame)
        if isinstance(expr, A.Reduce):
            return self.reduce(expr, frame)
        if isinstance(expr, A.IfExpr):
            return self.if_expr(expr, frame)
        if isinstance(expr, A.Field):
            v = self.field(expr, frame)
            if isinstance(v, Tensor) and v.rank > 0:
                raise fail(
                    "E0304",
                    "this tensor needs indices here",
                    expr.span,
                    f"{type_str(v)} without indices",
                    help="index it: `x[i, j]`",
                )
            return v.relabel(()) if isinstance(v, Tensor) else v
        if isinstance(expr, A.Tuple):
            raise fail(
                "E0333",
                "a composite index `(a, b)` is only allowed as a whole index "
                "of `x[...]`, not inside an expression",
                expr.span,
                help="split the axis with the composite itself: `x[n, (h, d + 1)]` is "
                "allowed, `x[n, (h, d) + 1]` is not",
            )
        return self.value(expr, frame)

    def positions(self, expr: A.Index, base: Tensor, frame: Frame) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        used: set[str] = set()
        for idx in expr.indices:
            if (
                isinstance(idx, A.Name)
                and idx.name in frame.ivars
                and idx.name not in used
                and frame.lookup_local(idx.name) is None
            ):
                out.append(("var", idx.name))
                used.add(idx.name)
            elif isinstance(idx, A.Tuple) and all(
                isinstance(i, A.Name) and i.name in frame.ivars and i.name not in used
                for i in idx.items
            ):
                names = [i.name for i in idx.items]  # type: ignore[union-attr]
                out.append(("composite", names))
                used.update(names)
            elif isinstance(idx, A.Tuple):
                # `gu[n, (0, f)]`: some parts are positions (constants, expressions): the
                # axis is split as for a composite, then those parts are read like any index.
                parts: list[tuple[str, Any]] = []
                for i in idx.items:
                    if (
                        isinstance(i, A.Name)
                        and i.name in frame.ivars
                        and i.name not in used
                        and frame.lookup_local(i.name) is None
                    ):
                        parts.append(("var", i.name))
                        used.add(i.name)
                    else:
                        parts.append(("expr", i))
                out.append(("mixed", parts))
            else:
                out.append(("expr", idx))
        return out

    def read(self, expr: A.Index, frame: Frame, canonical: bool = True) -> Any:
        base_expr = expr.base
        if (
            frame.in_kernel
            and isinstance(base_expr, A.Name)
            and base_expr.name in frame.tensor_params
            and not frame.memory_access
        ):
            raise fail(
                "E0503",
                f"tensor parameter `{base_expr.name}` is read outside `load`",
                expr.span,
                "direct read",
                help=f"read a tile with `load({self.src(expr)})`, with a mask where the "
                "tile runs past the tensor",
            )
        base = (
            self.value(base_expr, frame)
            if not (isinstance(base_expr, A.Name) and base_expr.name in frame.tensor_params)
            else frame.lookup_local(base_expr.name)
        )
        if isinstance(base, Poison):
            return base
        if not isinstance(base, Tensor):
            raise fail("E0380", f"cannot index {self.describe(base)}", expr.span, "not a tensor")
        if len(expr.indices) != base.rank:
            raise fail(
                "E0303",
                f"{self.name_of(base_expr)} has {base.rank} "
                f"dimension{'s' if base.rank != 1 else ''} but {len(expr.indices)} "
                f"ind{'ices' if len(expr.indices) != 1 else 'ex'}",
                expr.span,
                f"{type_str(base)}",
                help="give one index per dimension",
            )
        sliced = next((i for i in expr.indices if isinstance(i, A.Slice)), None)
        if sliced is not None:
            raise fail(
                "E0343",
                "a range slice is only allowed as a whole index of a tensor",
                sliced.span,
                "a range inside index notation",
                help="slice in its own statement: `let part = x[0..N, ..]`, then index "
                "`part[...]` (inside index notation, write the shift: "
                "`x[i + N, j]`)",
            )
        positions = self.positions(expr, base, frame)
        if frame.in_kernel and any(kind != "var" for kind, _ in positions):
            # Index notation on a tile only names its axes (`max[c] v[c]`); a computed or
            # composite index would slice, gather or reshape registers Triton cannot address.
            bad = next(i for i, (kind, _) in enumerate(positions) if kind != "var")
            raise fail(
                "E0526",
                f"{self.name_of(base_expr)} is a tile: it cannot be sliced, "
                "joined or gathered from",
                expr.indices[bad].span,
                "not one of the tile's own axes",
                help="index a tile only with index variables for all its axes "
                "(`max[c] v[c]`); to read other elements, `load` the memory "
                "instead: `load(x[row, cols + 1], mask)`",
            )
        # Composite indices split one axis into several.
        shape: list[Dim] = []
        flat: list[tuple[str, Any]] = []
        split = False
        for axis, (kind, what) in enumerate(positions):
            if kind == "mixed":
                dims_or_none = [self.label_dim(frame, w) if k == "var" else None for k, w in what]
                known = Dim.const(1)
                for d in dims_or_none:
                    if d is not None:
                        known = known * d
                unknown = [i for i, d in enumerate(dims_or_none) if d is None]
                if len(unknown) > 1:
                    raise fail(
                        "E0307",
                        "cannot tell the sizes of the computed parts of this composite index",
                        expr.indices[axis].span,
                        "more than one part without a range",
                        help="give all but one part a range: an index variable of a "
                        "known range, such as `(0, f)` where `f` has one",
                    )
                rest = base.shape[axis] / known
                mixed_dims = [d if d is not None else rest for d in dims_or_none]
                prod = Dim.const(1)
                for d in mixed_dims:
                    prod = prod * d
                if prod != base.shape[axis] or (
                    rest.value is None and rest.exact is not None and rest.exact.denominator != 1
                ):
                    raise fail(
                        "E0381",
                        f"composite index parts of sizes "
                        f"{' * '.join(str(d) for d in mixed_dims)} do not cover the "
                        f"axis of size {base.shape[axis]}",
                        expr.indices[axis].span,
                        f"axis of size {base.shape[axis]}",
                        help="the parts' ranges must multiply to the axis size",
                    )
                shape.extend(mixed_dims)
                flat.extend(what)
                split = True
            elif kind == "composite":
                dims = [self.label_dim(frame, n) for n in what]
                prod = Dim.const(1)
                for d in dims:
                    prod = prod * d
                if prod != base.shape[axis]:
                    parts = " * ".join(str(d) for d in dims)
                    covers = parts if parts == str(prod) else f"{parts} = {prod}"
                    raise fail(
                        "E0381",
                        f"composite index ({', '.join(what)}) covers "
                        f"{covers} elements, but the axis has {base.shape[axis]}",
                        expr.indices[axis].span,
                        f"axis of size {base.shape[axis]}",
                        help="the parts' ranges must multiply to the axis size",
                        secondary=[
                            (self.var_origin(frame, n), f"`{n}` ranges over {frame.ivars[n]} here")
                            for n in what
                        ],
                    )
                shape.extend(dims)
                flat.extend(("var", n) for n in what)
                split = True
            else:
                shape.append(base.shape[axis])
                flat.append((kind, what))
        for axis, (kind, what) in enumerate(flat):
            if kind == "var":
                d = self.label_dim(frame, what)
                if d != shape[axis]:
                    raise fail(
                        "E0301",
                        f"index `{what}` ranges over {d} but is used for an axis "
                        f"of size {shape[axis]}",
                        self.index_span(expr, axis, positions),
                        f"axis of size {shape[axis]}",
                        help=self.swap_hint(expr, flat, shape, axis, frame)
                        or (
                            f"an index variable ranges over one dimension: check the "
                            f"order of the indices here and where `{what}` got its range"
                        ),
                        secondary=[
                            (self.var_origin(frame, what), f"`{what}` ranges over {d} here")
                        ],
                    )
        t = base
        if split:
            t = self.builder.emit(
                "reshape",
                [base.ref],
                tuple(shape),
                base.dtype,
                {"shape": [self.concrete(d) for d in shape]},
                span=expr.span,
            )
        if all(kind == "var" for kind, _ in flat):
            labelled = Tensor(t.ref, tuple(shape), t.dtype, t.kind, tuple(what for _, what in flat))
            return self.canonical(labelled, frame, expr.span) if canonical else labelled
        computed = [i for i, (kind, _) in enumerate(flat) if kind == "expr"]
        if len(computed) == 1:
            taken = self.take(t, tuple(shape), flat, computed[0], expr, frame)
            if taken is not None:
                return taken
        return self.gather(t, tuple(shape), flat, expr, frame)

    def slice(self, expr: A.Index, base: Any, frame: Frame) -> Any:
        """`x[a..b, ..]`: a static range of every axis, bounds known when lowering (a `slice`
        step: a view in generated PyTorch, never a gather)."""
        if isinstance(base, Poison):
            return base
        if not isinstance(base, Tensor):
            raise fail("E0380", f"cannot index {self.describe(base)}", expr.span, "not a tensor")
        if frame.in_kernel:
            raise fail(
                "E0526",
                f"{self.name_of(expr.base)} cannot be sliced inside a kernel",
                expr.span,
                "a range slice",
                help="`load` the part you need: `load(x[row, cols + 1], mask)`",
            )
        if len(expr.indices) != base.rank:
            raise fail(
                "E0303",
                f"{self.name_of(expr.base)} has {base.rank} "
                f"dimension{'s' if base.rank != 1 else ''} but {len(expr.indices)} "
                f"ind{'ices' if len(expr.indices) != 1 else 'ex'}",
                expr.span,
                f"{type_str(base)}",
                help="give one range per dimension: `..` for a whole axis",
            )
        starts: list[Dim] = []
        stops: list[Dim] = []
        for axis, idx in enumerate(expr.indices):
            size = base.shape[axis]
            if not isinstance(idx, A.Slice):
                one = (
                    f"{idx.value}..{idx.value + 1}"
                    if isinstance(idx, A.IntLit)
                    else f"{self.src(idx)}..{self.src(idx)} + 1"
                )
                raise fail(
                    "E0344",
                    "a slice takes a range for every axis",
                    idx.span,
                    "not a range",
                    help=f"write `..` for the whole axis, or a range `{one}` for one position",
                )
            start = self.range_bound(idx.start, frame) if idx.start is not None else Dim.const(0)
            stop = self.range_bound(idx.stop, frame) if idx.stop is not None else size
            if idx.inclusive:
                stop = stop + 1
            self.check_range(start, stop, size, idx, expr, axis)
            starts.append(start)
            stops.append(stop)
        shape = tuple(b - a for a, b in zip(starts, stops))
        return self.builder.emit(
            "slice",
            [base.ref],
            shape,
            base.dtype,
            {
                "starts": [self.concrete(d) for d in starts],
                "limits": [self.concrete(d) for d in stops],
            },
            span=expr.span,
        )

    def range_bound(self, expr: A.Expr, frame: Frame) -> Dim:
        v = self.value(expr, frame)
        if isinstance(v, Poison):
            raise Fail(Diagnostic("E0000", "poisoned"))
        if isinstance(v, Const) and isinstance(v.value, Dim):
            return v.value
        raise fail(
            "E0345",
            "a slice's bounds must be integers known when lowering",
            expr.span,
            f"{self.describe(v)}",
            help="use integers, dims and `+ - * /` "
            "(`q[.., Q..Q + K]`); for positions that tensors give, index "
            "(`x[ids[n], d]`)",
        )

    def check_range(
        self, start: Dim, stop: Dim, size: Dim, idx: A.Slice, expr: A.Index, axis: int
    ) -> None:
        """Raise E0346 when a range is known to leave its axis (or to run backwards)."""

        def negative(d: Dim) -> bool:
            return d.value is not None and d.value < 0

        if negative(start) or negative(stop - start) or negative(size - stop):
            shown = f"{start}..{stop}"
            raise fail(
                "E0346",
                f"range {shown} is outside axis {axis} of "
                f"{self.name_of(expr.base)}, which has {size} elements",
                idx.span,
                f"axis of size {size}",
                help="a slice's range `a..b` needs 0 <= a <= b <= the axis size",
            )

    def index_tensor(self, what: A.Expr, frame: Frame) -> Any:
        v = self.lab(what, frame)
        if isinstance(v, Poison):
            return v
        if isinstance(v, Const):
            if v.dtype not in ("int", *DT.INTS):
                raise fail("E0382", "an index must be an integer", what.span, f"{v.dtype} here")
            return self.constant(v, "i32", what.span, labels=())
        if not DT.is_int(v.dtype):
            raise fail(
                "E0382",
                f"an index must be an integer, found {v.dtype}",
                what.span,
                "not an integer",
                help="convert it: `(x as i32)`",
            )
        return v

    def take(
        self,
        t: Tensor,
        shape: tuple[Dim, ...],
        flat: list[tuple[str, Any]],
        axis: int,
        expr: A.Index,
        frame: Frame,
    ) -> Tensor | None:
        """`x[i, f(j), k]`: one computed position whose indices are new is numpy's `take`."""
        what = flat[axis][1]
        others = {w for k, w in flat if k == "var"}
        if any(isinstance(n, A.Name) and n.name in others for n in walk(what)):
            return None
        idx = self.index_tensor(what, frame)
        if isinstance(idx, Poison):
            return idx  # type: ignore[return-value]
        labels = (
            tuple(w for _, w in flat[:axis])
            + tuple(idx.labels or ())
            + tuple(w for _, w in flat[axis + 1 :])
        )
        out_shape = shape[:axis] + idx.shape + shape[axis + 1 :]
        bounds = "unchecked" if self.reads_tensor(what, frame) else "zero"
        result = self.builder.emit(
            "take",
            [t.ref, idx.ref],
            out_shape,
            t.dtype,
            {"axis": axis, "bounds": bounds},
            span=expr.span,
            labels=labels,
        )
        return self.canonical(result, frame, expr.span)

    def gather(
        self,
        t: Tensor,
        shape: tuple[Dim, ...],
        flat: list[tuple[str, Any]],
        expr: A.Index,
        frame: Frame,
    ) -> Tensor:
        last_expr = max(i for i, (k, _) in enumerate(flat) if k == "expr")
        lead, trail = flat[: last_expr + 1], flat[last_expr + 1 :]
        indices: list[Any] = []
        # One position computed without reading a tensor reads 0 outside its axis, so the
        # whole gather is bounds "zero" (in-range data-dependent positions read the same).
        affine = False
        for _axis, (kind, what) in enumerate(lead):
            if kind == "var":
                d = self.label_dim(frame, what)
                indices.append(
                    self.builder.emit(
                        "iota",
                        [],
                        (d,),
                        "i32",
                        {"shape": [self.concrete(d)], "axis": 0, "dtype": "i32"},
                        span=expr.span,
                        labels=(what,),
                    )
                )
            else:
                if not self.reads_tensor(what, frame):
                    affine = True
                v = self.index_tensor(what, frame)
                if isinstance(v, Poison):
                    return v  # type: ignore[return-value]
                indices.append(v)
        trail_vars = {what for _, what in trail}
        index_labels = self.union_labels(indices, frame)
        if trail_vars & set(index_labels):
            raise fail(
                "E0383",
                "an index variable appears both in a computed index and as a plain index after it",
                expr.span,
                "ambiguous gather",
                help="reorder the computation, or compute the positions in a `let` first",
            )
        aligned = [self.align(ix, index_labels, expr.span) for ix in indices]
        # The graph's gather takes index tensors of one rank: constant positions too.
        aligned = [
            self.builder.emit(
                "reshape",
                [ix.ref],
                (Dim.const(1),) * len(index_labels),
                ix.dtype,
                {"shape": [1] * len(index_labels)},
                span=expr.span,
                labels=index_labels,
            )
            if ix.rank != len(index_labels)
            else ix
            for ix in aligned
        ]
        out_shape = tuple(self.label_dim(frame, lab) for lab in index_labels) + tuple(
            shape[len(lead) :]
        )
        labels = index_labels + tuple(what for _, what in trail)
        result = self.builder.emit(
            "gather",
            [t.ref] + [ix.ref for ix in aligned],
            out_shape,
            t.dtype,
            {"indexed_axes": len(lead), "bounds": "zero" if affine else "unchecked"},
            span=expr.span,
            labels=labels,
        )
        return self.canonical(result, frame, expr.span)

    def reads_tensor(self, expr: A.Expr, frame: Frame) -> bool:
        for node in walk(expr):
            if isinstance(node, A.Index):
                return True
            if isinstance(node, A.Name) and isinstance(frame.lookup_local(node.name), Tensor):
                return True
        return False

    def name_of(self, expr: A.Expr) -> str:
        if isinstance(expr, A.Name):
            return f"`{expr.name}`"
        if isinstance(expr, A.Field):
            return f"`{self.name_of(expr.base).strip('`')}.{expr.name}`"
        return "this tensor"

    def index_span(self, expr: A.Index, flat_axis: int, positions: list) -> Span:
        axis = 0
        for i, (kind, what) in enumerate(positions):
            width = len(what) if kind == "composite" else 1
            if flat_axis < axis + width:
                return expr.indices[i].span
            axis += width
        return expr.span

    def var_origin(self, frame: Frame, name: str) -> Span | None:
        return frame.var_spans.get(name)
