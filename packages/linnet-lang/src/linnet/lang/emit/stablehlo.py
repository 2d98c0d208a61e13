"""Graph → StableHLO MLIR text. Writes text only: this module imports no MLIR library
(:func:`verify` and :func:`run` import jax lazily, for tests and the conformance suite).

One module per lowered entry with a public ``@main``: its arguments are the entry's inputs,
then each state (the KV cache), then each parameter, named after them; it returns the entry's
outputs, then each state's value after the call, so a caller carries the cache from one call
to the next. Every std op the entry calls (``std.nn.linear::linear``) is a
``stablehlo.composite`` named ``linnet.std.nn.linear.linear`` whose decomposition is a private
function holding the op's body (nested as the calls nest, one function per callee and body:
the layers share theirs), so a compiler can match the op or inline the body. Operations are
written in MLIR's generic form, each with its source location (``loc("llama.linnet:45")``),
and a comment with the ``.linnet`` line heads each group of steps.

Every primitive has a rule in :data:`RULES` (``tests/test_coverage.py`` checks it). A step
with no rule, or a dtype StableHLO lacks, is error E0940 / E0941 naming the step and its
source line.

``erf`` is CHLO's ``chlo.erf`` (as JAX writes it); a portable text (``portable=``, for
:func:`linnet.lang.emit.stablehlo_portable.serialize`) holds StableHLO operations only.

>>> from linnet.lang.emit.stablehlo import RULES
>>> from linnet.lang.ir.primitives import PRIMITIVES
>>> sorted(set(PRIMITIVES) - set(RULES))  # collectives: an exported graph is one rank's
['all_gather', 'all_reduce']
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from linnet.lang import __version__
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.emit import stablehlo_edges, stablehlo_portable
from linnet.lang.emit.stablehlo_edges import compare as _cmp
from linnet.lang.export_checks import mlir_attribute
from linnet.lang.ir.graph import Call, Graph, Step

MLIR_DTYPES = {"f64": "f64", "f32": "f32", "f16": "f16", "bf16": "bf16", "i64": "i64",
               "i32": "i32", "i16": "i16", "i8": "i8", "u8": "ui8", "bool": "i1"}
_FLOATS = {"f64", "f32", "f16", "bf16"}
_INTS = {"i64", "i32", "i16", "i8", "u8"}
# IEEE bit patterns of +inf and NaN (MLIR writes non-finite float constants in hex).
_INF_BITS = {"f64": (0x7FF0000000000000, 0x7FF8000000000000, 16),
             "f32": (0x7F800000, 0x7FC00000, 8), "f16": (0x7C00, 0x7E00, 4),
             "bf16": (0x7F80, 0x7FC0, 4)}
_SIGN = {"f64": 1 << 63, "f32": 1 << 31, "f16": 1 << 15, "bf16": 1 << 15}
_INT_RANGE = {"i64": (-(2**63), 2**63 - 1), "i32": (-(2**31), 2**31 - 1),
              "i16": (-(2**15), 2**15 - 1), "i8": (-128, 127), "u8": (0, 255)}


def where(graph: Graph, index: int, step: Step) -> str:
    """How an error names a step: its index, op and source line."""
    return f"step {index} ({step.op}) of `{graph.model}.{graph.entry}` at {step.loc or '?'}"


def _ints(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def _array(values: Sequence[int]) -> str:
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in values) if values else "") + ">"


def scalar_literal(value: Any, dtype: str) -> str:
    """A constant's element as MLIR writes it in ``dense<...>``.

    >>> scalar_literal(float("-inf"), "f32"), scalar_literal(0.5, "f32"), scalar_literal(1, "bool")
    ('0xFF800000', '5.000000000e-01', 'true')
    """
    if dtype == "bool":
        return "true" if value else "false"
    if dtype in _INTS:
        return str(int(value))
    v = float(value)
    if math.isfinite(v):
        return f"{v:.9e}" if dtype != "f64" else repr(v) if "e" in repr(v) or "." in repr(v) \
            else f"{v:.1f}"
    inf, nan, width = _INF_BITS[dtype]
    bits = nan if math.isnan(v) else inf | (_SIGN[dtype] if v < 0 else 0)
    return f"0x{bits:0{width}X}"


# ---------------------------------------------------------------- one function's text
@dataclass
class Scope:
    graph: Graph
    lines: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # graph ref -> SSA name
    types: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # SSA -> type
    names: set[str] = field(default_factory=set)
    step: int = 0
    current: Step | None = None
    loc: str = ""
    portable: bool = False  # StableHLO operations only (stablehlo_portable): no chlo.erf

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^0-9A-Za-z_]", "_", hint.lstrip("%@")) or "v"
        if base[0].isdigit():
            base = "v" + base
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return "%" + name

    def ref_type(self, ref: str) -> tuple[tuple[int, ...], str]:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].shape, table[path].dtype
        v = self.graph.values[ref]
        return v.shape, v.dtype

    def ty(self, ssa_or_shape: Any, dtype: str | None = None) -> str:
        if dtype is None:
            shape, dtype = self.types[ssa_or_shape]
        else:
            shape = ssa_or_shape
        if dtype not in MLIR_DTYPES:
            at = where(self.graph, self.step, self.current) if self.current else "this graph"
            raise LinnetError(Diagnostic(
                "E0941", f"{at} uses dtype `{dtype}`, which StableHLO export does not support",
                help=f"convert to one of {', '.join(MLIR_DTYPES)} before this step, or run "
                     "the model with the PyTorch runtime"))
        dims = "".join(f"{d}x" for d in shape)
        return f"tensor<{dims}{MLIR_DTYPES[dtype]}>"

    def op(self, name: str, operands: list[str], shape: Sequence[int], dtype: str,
           attrs: str = "", region: str = "", hint: str = "") -> str:
        """Append one operation (generic form); returns its result's SSA name."""
        out = self.fresh(hint or name.rsplit(".", 1)[-1])
        self.types[out] = (tuple(shape), dtype)
        ins = ", ".join(self.ty(o) for o in operands)
        text = f'{out} = "{name}"({", ".join(operands)})'
        if region:
            text += f" ({region})"
        if attrs:
            text += f" {{{attrs}}}"
        text += f" : ({ins}) -> {self.ty(out)}"
        if self.loc:
            text += f' loc("{_escape(self.loc)}")'
        self.lines.append(text)
        return out

    def get(self, ref: str, dtype: str | None = None, shape: Sequence[int] | None = None) -> str:
        """A graph operand's SSA value, converted to ``dtype`` and broadcast to ``shape``."""
        v = self.env[ref]
        return self.coerce(v, dtype, shape)

    def coerce(self, v: str, dtype: str | None = None, shape: Sequence[int] | None = None) -> str:
        have_shape, have = self.types[v]
        if dtype is not None and dtype != have:
            v = self.op("stablehlo.convert", [v], have_shape, dtype)
        if shape is not None and tuple(shape) != have_shape:
            v = self.broadcast(v, shape)
        return v

    def broadcast(self, v: str, shape: Sequence[int]) -> str:
        """numpy broadcasting of ``v`` to ``shape`` (axes aligned on the right)."""
        have_shape, dtype = self.types[v]
        offset = len(shape) - len(have_shape)
        dims = list(range(offset, len(shape)))
        return self.op("stablehlo.broadcast_in_dim", [v], shape, dtype,
                       f"broadcast_dimensions = {_array(dims)}")

    def const(self, value: Any, dtype: str, hint: str = "c") -> str:
        lit = scalar_literal(value, dtype)
        return self.op("stablehlo.constant", [], (), dtype,
                       f"value = dense<{lit}> : {self.ty((), dtype)}", hint=hint)

    def reshape(self, v: str, shape: Sequence[int]) -> str:
        if tuple(shape) == self.types[v][0]:
            return v
        return self.op("stablehlo.reshape", [v], shape, self.types[v][1])


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


# ---------------------------------------------------------------- primitive rules
Rule = Callable[[Step, Scope], Any]
"""``rule(step, scope)``: appends operations and returns the result's SSA name (None for a
state write, which rebinds ``@state`` in the scope itself)."""


def _res(s: Step, n: Scope) -> tuple[tuple[int, ...], str]:
    v = n.graph.values[s.results[0]]
    return v.shape, v.dtype


def _unary(name: str) -> Rule:
    def rule(s: Step, n: Scope) -> str:
        shape, dt = _res(s, n)
        return n.op(name, [n.get(s.operands[0], dt, shape)], shape, dt, hint=s.results[0])
    return rule


def _binary(name: str) -> Rule:
    def rule(s: Step, n: Scope) -> str:
        shape, dt = _res(s, n)
        a, b = (n.get(o, dt, shape) for o in s.operands)
        return n.op(name, [a, b], shape, dt, hint=s.results[0])
    return rule


def _compare(direction: str) -> Rule:
    def rule(s: Step, n: Scope) -> str:
        shape, _ = _res(s, n)
        a, b = s.operands
        da, db = n.ref_type(a)[1], n.ref_type(b)[1]
        dt = da if da == db else "f32"
        kind = "FLOAT" if dt in _FLOATS else "UNSIGNED" if dt in ("u8", "bool") else "SIGNED"
        return n.op("stablehlo.compare", [n.get(a, dt, shape), n.get(b, dt, shape)], shape,
                    "bool", f"comparison_direction = #stablehlo<comparison_direction "
                            f"{direction}>, compare_type = #stablehlo<comparison_type {kind}>",
                    hint=s.results[0])
    return rule


def _logic(name: str) -> Rule:
    def rule(s: Step, n: Scope) -> str:
        shape, _ = _res(s, n)
        args = [n.get(o, "bool", shape) for o in s.operands]
        return n.op(name, args, shape, "bool", hint=s.results[0])
    return rule


def _select(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    c, a, b = s.operands
    return n.op("stablehlo.select", [n.get(c, "bool", shape), n.get(a, dt, shape),
                                     n.get(b, dt, shape)], shape, dt, hint=s.results[0])


def _constant(s: Step, n: Scope) -> str:
    return n.const(s.attributes["value"], s.attributes["dtype"], hint=s.results[0])


def _iota(s: Step, n: Scope) -> str:
    shape, axis = s.attributes["shape"], s.attributes["axis"]
    return n.op("stablehlo.iota", [], shape, s.attributes["dtype"],
                f"iota_dimension = {axis} : i64", hint=s.results[0])


def _reshape(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    return n.op("stablehlo.reshape", [n.get(s.operands[0])], shape, dt, hint=s.results[0])


def _transpose(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    return n.op("stablehlo.transpose", [n.get(s.operands[0])], shape, dt,
                f"permutation = {_array(s.attributes['perm'])}", hint=s.results[0])


def _broadcast(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    x = n.get(s.operands[0], dt)
    return n.op("stablehlo.broadcast_in_dim", [x], shape, dt,
                f"broadcast_dimensions = {_array(range(len(shape) - len(n.types[x][0]), len(shape)))}",
                hint=s.results[0])


def _identity(kind: str, dtype: str) -> Any:
    if kind in ("sum", "mean"):
        return 0
    if kind == "prod":
        return 1
    if dtype in _INTS:
        lo, hi = _INT_RANGE[dtype]
        return lo if kind == "max" else hi
    if dtype == "bool":
        return kind == "min"
    return -math.inf if kind == "max" else math.inf


_COMBINE = {"sum": "stablehlo.add", "mean": "stablehlo.add", "prod": "stablehlo.multiply",
            "max": "stablehlo.maximum", "min": "stablehlo.minimum"}


def reduce(n: Scope, x: str, axes: Sequence[int], kind: str, hint: str = "") -> str:
    """``kind`` (sum|max|min|prod) of ``x`` over ``axes``, in ``x``'s dtype."""
    shape, dt = n.types[x]
    out_shape = [d for i, d in enumerate(shape) if i not in set(axes)]
    init = n.const(_identity(kind, dt), dt)
    t = n.ty((), dt)
    # The region's names come from the scope: a function argument named `a` or `b` (the
    # bias of layer_norm) would otherwise be redefined inside it, which MLIR rejects.
    a, b, r = n.fresh("lhs"), n.fresh("rhs"), n.fresh(kind)
    region = (f'{{\n  ^bb0({a}: {t}, {b}: {t}):\n    {r} = "{_COMBINE[kind]}"({a}, {b}) : '
              f'({t}, {t}) -> {t}\n    "stablehlo.return"({r}) : ({t}) -> ()\n  }}')
    return n.op("stablehlo.reduce", [x, init], out_shape, dt,
                f"dimensions = {_array(sorted(axes))}", region, hint=hint)


def _reduce(s: Step, n: Scope) -> str:
    _, dt = _res(s, n)
    kind, axes = s.attributes["kind"], list(s.attributes["axes"])
    src = s.operands[0]
    x = n.get(src) if kind in ("max", "min") else n.get(src, s.attributes["accumulate"])
    if not axes:
        return n.coerce(x, dt)
    out = reduce(n, x, axes, kind)
    if kind == "mean":
        count = math.prod(n.types[x][0][a] for a in axes)
        acc = n.types[out][1]
        out = n.op("stablehlo.divide", [out, n.coerce(n.const(count, acc), None,
                                                      n.types[out][0])],
                   n.types[out][0], acc)
    return n.coerce(out, dt) if n.types[out][1] != dt else out


def contract(n: Scope, a: str, b: str, spec: str, hint: str = "") -> str:
    """einsum(``spec``) of two operands as ``stablehlo.dot_general`` and a transpose (letters
    only one operand has and the result lacks are summed first)."""
    lhs, _, out = spec.replace(" ", "").partition("->")
    la, lb = lhs.split(",")
    _, dt = n.types[a]
    for side in (0, 1):
        letters, other = (la, lb) if side == 0 else (lb, la)
        lonely = [i for i, c in enumerate(letters) if c not in other and c not in out]
        if lonely:
            v = a if side == 0 else b
            v = reduce(n, v, lonely, "sum")
            letters = "".join(c for i, c in enumerate(letters) if i not in lonely)
            if side == 0:
                a, la = v, letters
            else:
                b, lb = v, letters
    batch = [c for c in la if c in lb and c in out]
    contracting = [c for c in la if c in lb and c not in out]
    free_a = [c for c in la if c not in lb]
    free_b = [c for c in lb if c not in la]
    sa, sb = n.types[a][0], n.types[b][0]
    size = {c: sa[i] for i, c in enumerate(la)} | {c: sb[i] for i, c in enumerate(lb)}
    order = batch + free_a + free_b
    dims = (f"dot_dimension_numbers = #stablehlo.dot<"
            f"lhs_batching_dimensions = {_ints([la.index(c) for c in batch])}, "
            f"rhs_batching_dimensions = {_ints([lb.index(c) for c in batch])}, "
            f"lhs_contracting_dimensions = {_ints([la.index(c) for c in contracting])}, "
            f"rhs_contracting_dimensions = {_ints([lb.index(c) for c in contracting])}>, "
            "precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]")
    r = n.op("stablehlo.dot_general", [a, b], [size[c] for c in order], dt, dims,
             hint=hint if order == list(out) else "")
    if order == list(out):
        return r
    perm = [order.index(c) for c in out]
    return n.op("stablehlo.transpose", [r], [size[c] for c in out], dt,
                f"permutation = {_array(perm)}", hint=hint)


def _contract(s: Step, n: Scope) -> str:
    _, dt = _res(s, n)
    acc = s.attributes["accumulate"]
    a, b = (n.get(o, acc) for o in s.operands)
    out = contract(n, a, b, s.attributes["spec"], hint=s.results[0])
    return n.coerce(out, dt)


def _index(n: Scope, ref: str, size: int, zero: bool) -> tuple[str, str | None]:
    """An index as i64, clamped into the axis, and, where an out-of-range read gives zero,
    the bool mask of the positions inside it. An index that must be in range is clamped
    too: StableHLO leaves a scatter outside the operand to the implementation, and a
    caller reads the model's `linnet.valid` output (linnet.lang.ir.validity) to know."""
    idx = n.get(ref, "i64")
    shape = n.types[idx][0]
    lo = n.coerce(n.const(0, "i64"), None, shape)
    hi = n.coerce(n.const(size - 1, "i64"), None, shape)
    if not zero:
        return n.op("stablehlo.clamp", [lo, idx, hi], shape, "i64"), None
    return idx, n.op("stablehlo.and", [_cmp(n, idx, lo, "GE"), _cmp(n, idx, hi, "LE")],
                     shape, "bool")


def _masked(n: Scope, s: Step, out: str, valid: str, view: list[int]) -> str:
    shape, dt = _res(s, n)
    mask = n.broadcast(n.reshape(valid, view), shape)
    zero = n.broadcast(n.const(0, dt), shape)
    return n.op("stablehlo.select", [mask, out, zero], shape, dt, hint=s.results[0])


def _gather_attrs(offset: Sequence[int], collapsed: Sequence[int], start: Sequence[int],
                  ivd: int, sizes: Sequence[int]) -> str:
    return (f"dimension_numbers = #stablehlo.gather<offset_dims = {_ints(offset)}, "
            f"collapsed_slice_dims = {_ints(collapsed)}, start_index_map = {_ints(start)}, "
            f"index_vector_dim = {ivd}>, slice_sizes = {_array(sizes)}, "
            "indices_are_sorted = false")


def _take(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    x, ref = s.operands
    axis, zero = s.attributes["axis"], s.attributes["bounds"] == "zero"
    xshape = n.ref_type(x)[0]
    ishape = n.ref_type(ref)[0]
    idx, valid = _index(n, ref, xshape[axis], zero)
    offset = list(range(axis)) + list(range(axis + len(ishape), len(shape)))
    sizes = [1 if i == axis else d for i, d in enumerate(xshape)]
    out = n.op("stablehlo.gather", [n.get(x), idx], shape, dt,
               _gather_attrs(offset, [axis], [axis], len(ishape), sizes),
               hint=s.results[0] if valid is None else "")
    if valid is None:
        return out
    return _masked(n, s, out, valid, [1] * axis + list(ishape) + [1] * (len(xshape) - axis - 1))


def _slice(s: Step, n: Scope) -> str:
    """``stablehlo.slice``: static start and limit indices, strides of 1."""
    shape, dt = _res(s, n)
    rank = len(shape)
    attrs = (f"start_indices = {_array(s.attributes['starts'])}, "
             f"limit_indices = {_array(s.attributes['limits'])}, strides = {_array([1] * rank)}")
    return n.op("stablehlo.slice", [n.get(s.operands[0])], shape, dt, attrs, hint=s.results[0])


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> list[int]:
    rank = max((len(sh) for sh in shapes), default=0)
    out = [1] * rank
    for sh in shapes:
        for i, d in enumerate((1,) * (rank - len(sh)) + tuple(sh)):
            out[i] = max(out[i], d)
    return out


def _stacked(n: Scope, refs: list[str], sizes: Sequence[int], zero: bool
             ) -> tuple[str, str | None, list[int]]:
    """Indices broadcast together and stacked on a last axis, the mask of positions inside
    every axis (when out-of-range reads give zero), and the broadcast shape."""
    common = _broadcast_shape([n.ref_type(r)[0] for r in refs])
    parts, valid = [], None
    for a, ref in enumerate(refs):
        idx, ok = _index(n, ref, sizes[a], zero)
        idx = n.coerce(idx, None, common)
        parts.append(n.reshape(idx, [*common, 1]))
        if ok is not None:
            ok = n.coerce(ok, None, common)
            valid = ok if valid is None else n.op("stablehlo.and", [valid, ok], common, "bool")
    if len(parts) == 1:
        return parts[0], valid, common
    stacked = n.op("stablehlo.concatenate", parts, [*common, len(parts)], "i64",
                   f"dimension = {len(common)} : i64")
    return stacked, valid, common


def _gather(s: Step, n: Scope) -> str:
    shape, dt = _res(s, n)
    x, *refs = s.operands
    if not refs:
        return n.get(x)
    xshape = n.ref_type(x)[0]
    k = len(refs)
    idx, valid, common = _stacked(n, refs, xshape, s.attributes["bounds"] == "zero")
    offset = list(range(len(common), len(common) + len(xshape) - k))
    out = n.op("stablehlo.gather", [n.get(x), idx], shape, dt,
               _gather_attrs(offset, range(k), range(k), len(common),
                             [1] * k + list(xshape[k:])),
               hint=s.results[0] if valid is None else "")
    if valid is None:
        return out
    return _masked(n, s, out, valid, common + [1] * (len(xshape) - k))


def _scatter(s: Step, n: Scope) -> None:
    state, value, *refs = s.operands
    shape, dt = n.ref_type(state)
    hint = state[1:].rsplit(".", 1)[-1]
    if not refs:
        n.env[state] = n.get(value, dt, shape)
        return None
    k = len(refs)
    idx, _, common = _stacked(n, refs, shape, zero=False)
    updates = n.get(value, dt, [*common, *shape[k:]])
    t = n.ty((), dt)
    old, new = n.fresh("old"), n.fresh("new")  # never an argument's name (see reduce)
    region = (f'{{\n  ^bb0({old}: {t}, {new}: {t}):\n    "stablehlo.return"({new}) : ({t}) -> ()'
              "\n  }")
    attrs = (f"scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = "
             f"{_ints(range(len(common), len(common) + len(shape) - k))}, inserted_window_dims "
             f"= {_ints(range(k))}, scatter_dims_to_operand_dims = {_ints(range(k))}, "
             f"index_vector_dim = {len(common)}>, indices_are_sorted = false, "
             "unique_indices = false")
    n.env[state] = n.op("stablehlo.scatter", [n.get(state), idx, updates], shape, dt, attrs,
                        region, hint=hint)
    return None


def _scatter_add(s: Step, n: Scope) -> str:
    """A copy of the operand with the value added at the positions: ``stablehlo.scatter``
    with an add region (coinciding positions add up). Under bounds zero a position outside
    adds nothing: its index is clamped into the axes and its value masked to 0 (what a
    backend does with an index outside is implementation-defined), as emit/torch.py does."""
    shape, dt = _res(s, n)
    x, value, *refs = s.operands
    if not refs:
        return n.op("stablehlo.add", [n.get(x, dt, shape), n.get(value, dt, shape)], shape, dt,
                    hint=s.results[0])
    k = len(refs)
    idx, valid, common = _stacked(n, refs, shape, s.attributes["bounds"] == "zero")
    window = [*common, *shape[k:]]
    updates = n.get(value, dt, window)
    if valid is not None:
        where_ = [*common, k]
        lo = n.broadcast(n.const(0, "i64"), where_)
        top = n.op("stablehlo.constant", [], (k,), "i64",
                   f"value = dense<{_ints([d - 1 for d in shape[:k]])}> : {n.ty((k,), 'i64')}",
                   hint="top")
        idx = n.op("stablehlo.clamp", [lo, idx, n.broadcast(top, where_)], where_, "i64")
        mask = n.broadcast(n.reshape(valid, [*common, *[1] * (len(shape) - k)]), window)
        zero = n.broadcast(n.const(0, dt), window)
        updates = n.op("stablehlo.select", [mask, updates, zero], window, dt)
    t = n.ty((), dt)
    old, new, total = n.fresh("old"), n.fresh("new"), n.fresh("sum")  # names unused outside
    region = (f"{{\n  ^bb0({old}: {t}, {new}: {t}):\n"
              f'    {total} = "stablehlo.add"({old}, {new}) : ({t}, {t}) -> {t}\n'
              f'    "stablehlo.return"({total}) : ({t}) -> ()\n  }}')
    attrs = (f"scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = "
             f"{_ints(range(len(common), len(window)))}, inserted_window_dims "
             f"= {_ints(range(k))}, scatter_dims_to_operand_dims = {_ints(range(k))}, "
             f"index_vector_dim = {len(common)}>, indices_are_sorted = false, "
             "unique_indices = false")
    return n.op("stablehlo.scatter", [n.get(x, dt), idx, updates], shape, dt, attrs, region,
                hint=s.results[0])


def _erf(s: Step, n: Scope) -> str:
    """StableHLO has no erf: CHLO's (which XLA and IREE legalise) is the standard spelling,
    and what JAX itself emits; a portable artifact, which may hold no CHLO, computes it
    (:func:`linnet.lang.emit.stablehlo_portable.erf`)."""
    if not n.portable:
        return _unary("chlo.erf")(s, n)
    shape, dt = _res(s, n)
    return n.coerce(stablehlo_portable.erf(n, n.get(s.operands[0], dt, shape)), dt)


RULES: dict[str, Rule] = {
    "neg": _unary("stablehlo.negate"), "not": _unary("stablehlo.not"),
    "exp": _unary("stablehlo.exponential"), "log": _unary("stablehlo.log"),
    "sqrt": _unary("stablehlo.sqrt"), "rsqrt": _unary("stablehlo.rsqrt"),
    "sin": _unary("stablehlo.sine"), "cos": _unary("stablehlo.cosine"),
    "tanh": _unary("stablehlo.tanh"), "sigmoid": _unary("stablehlo.logistic"),
    "erf": _erf, "abs": _unary("stablehlo.abs"),
    "floor": stablehlo_edges.RULES["floor"],
    "add": _binary("stablehlo.add"), "sub": _binary("stablehlo.subtract"),
    "mul": _binary("stablehlo.multiply"), "div": stablehlo_edges.RULES["div"],
    "rem": stablehlo_edges.RULES["rem"],
    "pow": _binary("stablehlo.power"), "maximum": _binary("stablehlo.maximum"),
    "minimum": _binary("stablehlo.minimum"),
    "lt": _compare("LT"), "le": _compare("LE"), "gt": _compare("GT"), "ge": _compare("GE"),
    "eq": _compare("EQ"), "ne": _compare("NE"),
    "and": _logic("stablehlo.and"), "or": _logic("stablehlo.or"), "select": _select,
    "convert": stablehlo_edges.RULES["convert"], "constant": _constant, "iota": _iota,
    "reshape": _reshape, "transpose": _transpose, "broadcast": _broadcast,
    "reduce": _reduce, "contract": _contract, "take": _take, "gather": _gather,
    "scatter": _scatter, "scatter_add": _scatter_add, "slice": _slice,
}
"""One rule per primitive (``tests/test_coverage.py`` checks it covers the registry)."""

# A rank's graph (linnet.lang.ir.shard) is not exported: StableHLO's collectives need a
# replica mesh the export does not describe (E0940 names the step).
EXPECTED_MISSING: frozenset[str] = frozenset({"all_reduce", "all_gather"})


# ---------------------------------------------------------------- the emitter
def _std_name(callee: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.]", "_", callee.removeprefix("std.").replace("::", "."))


class StablehloEmitter:
    def __init__(self, graph: Graph, sources: Mapping[str, str] | None,
                 portable: tuple[int, int, int] | None = None) -> None:
        from linnet.lang.emit.onnx import std_op_calls

        self.graph = graph
        # A portable text (a target version): StableHLO operations only, and std ops as
        # func.call below the first version with composites (stablehlo_portable).
        self.portable = portable
        self.composites = portable is None or stablehlo_portable.composites_at(portable)
        self.sources = {k: v.splitlines() for k, v in (sources or graph.sources or {}).items()}
        self.calls = std_op_calls(graph)
        self.users = graph.users()
        self.functions: dict[tuple, str] = {}  # body key -> symbol
        self.symbols: set[str] = {"main"}
        self.texts: list[str] = []

    def comment(self, loc: str) -> str:
        user = loc.split("|", 1)[0]
        file, _, line = user.rpartition(":")
        lines = self.sources.get(file)
        text = ""
        if lines and line.isdigit() and 0 < int(line) <= len(lines):
            text = "  " + lines[int(line) - 1].strip()
        short = file.rsplit("/", 1)[-1]
        out = f"// {short}:{line}{text}"
        return out if len(out) <= 96 else out[:93].rstrip() + "..."

    def span(self, start: int, stop: int) -> tuple[list[str], list[str]]:
        defined: set[str] = set()
        reads: list[str] = []
        writes: list[str] = []
        outs: list[str] = []
        for st in self.graph.steps[start:stop]:
            for o in st.operands:
                if o not in defined and o not in reads:
                    reads.append(o)
            if st.op == "scatter" and st.operands[0] not in writes:
                writes.append(st.operands[0])
                defined.add(st.operands[0])
            defined.update(st.results)
            for r in st.results:
                if r in self.graph.outputs or any(u >= stop for u in self.users.get(r, [])):
                    outs.append(r)
        return reads, outs + writes

    def children(self, start: int, stop: int, owner: Call | None) -> dict[int, Call]:
        def contains(o: Call, c: Call) -> bool:
            return o.start <= c.start and c.stop <= o.stop and (
                o.stop - o.start > c.stop - c.start or o.depth < c.depth)

        mine = [c for c in self.calls if c is not owner and start <= c.start and c.stop <= stop
                and (owner is None or contains(owner, c))]
        return {c.start: c for c in mine if not any(o is not c and contains(o, c) for o in mine)}

    def body(self, scope: Scope, start: int, stop: int, owner: Call | None) -> None:
        inner = self.children(start, stop, owner)
        last = None
        i = start
        while i < stop:
            call = inner.get(i)
            step = self.graph.steps[i]
            loc = call.loc if call is not None and call.loc else step.loc
            if loc and loc != last:
                scope.lines.append(self.comment(loc))
                last = loc
            if call is not None:
                self.call(scope, call)
                i = call.stop
                continue
            scope.step, scope.current, scope.loc = i, step, step.loc
            rule = RULES.get(step.op)
            if rule is None:
                raise LinnetError(Diagnostic(
                    "E0940", f"{where(self.graph, i, step)}: primitive `{step.op}` has no "
                             "StableHLO rule",
                    help="run this model with the PyTorch runtime, or add the primitive to "
                         "linnet.lang.emit.stablehlo.RULES"))
            for r in step.results:  # a dtype StableHLO lacks is E0941, named at this step
                scope.ty(self.graph.values[r].shape, self.graph.values[r].dtype)
            out = rule(step, scope)
            if step.results:
                scope.env[step.results[0]] = out
            scope.current = None
            i += 1

    def call(self, scope: Scope, call: Call) -> None:
        reads, writes = self.span(call.start, call.stop)
        local: dict[str, str] = {r: f"in{k}" for k, r in enumerate(reads)}
        key_steps = []
        for j, st in enumerate(self.graph.steps[call.start:call.stop]):
            ops = tuple(local.get(o, o) for o in st.operands)
            types = tuple(scope.ref_type(o) for o in st.operands)
            for r in st.results:
                local[r] = f"v{j}"
            key_steps.append((st.op, repr(sorted(st.attributes.items())), ops, types))
        key = (call.callee, tuple(key_steps), tuple(local.get(w, w) for w in writes))
        symbol = self.functions.get(key) or self.function(call, reads, writes, key)
        args = [scope.env[r] for r in reads]
        out_types = [scope.ref_type(w) for w in writes]
        scope.step, scope.current, scope.loc = call.start, self.graph.steps[call.start], call.loc
        attrs = (f'name = "linnet.std.{_std_name(call.callee)}", composite_attributes = '
                 f'{{callee = "{_escape(call.callee)}", path = "{_escape(call.path)}"}}, '
                 f"decomposition = @{symbol}, version = 0 : i32")
        op = "stablehlo.composite"
        if not self.composites:  # an older target: a plain call of the decomposition
            scope.lines.append(f"// linnet.std.{_std_name(call.callee)} `{call.path}`")
            op, attrs = "func.call", f"callee = @{symbol}"
        names = [scope.fresh(w.rsplit(".", 1)[-1] if w.startswith("@") else w) for w in writes]
        ins = ", ".join(scope.ty(a) for a in args)
        outs = ", ".join(scope.ty(sh, dt) for sh, dt in out_types)
        if len(names) == 1:
            lhs = names[0]
        else:
            lhs = f"{names[0]}:{len(names)}"
        text = (f'{lhs} = "{op}"({", ".join(args)}) {{{attrs}}} : ({ins}) -> '
                f"({outs})")
        if call.loc:
            text += f' loc("{_escape(call.loc)}")'
        scope.lines.append(text)
        for j, (w, (sh, dt)) in enumerate(zip(writes, out_types)):
            ssa = names[0] if len(names) == 1 else f"{names[0]}#{j}"
            scope.types[ssa] = (tuple(sh), dt)
            scope.env[w] = ssa
        scope.current = None

    def function(self, call: Call, reads: list[str], writes: list[str], key: tuple) -> str:
        inner = Scope(self.graph, portable=self.portable is not None)
        params = []
        for ref in reads:
            hint = ref.rsplit(".", 1)[-1] if ref.startswith("@") else ref
            ssa = inner.fresh(hint)
            inner.env[ref] = ssa
            inner.types[ssa] = tuple(inner.ref_type(ref))  # type: ignore[assignment]
            params.append(f"{ssa}: {inner.ty(ssa)}")
        self.body(inner, call.start, call.stop, call)
        outs = [inner.env[w] for w in writes]
        base = _std_name(call.callee).replace(".", "_")
        symbol, k = base, 1
        while symbol in self.symbols:
            k += 1
            symbol = f"{base}_{k}"
        self.symbols.add(symbol)
        self.functions[key] = symbol
        self.texts.append(self.function_text(
            f"private @{symbol}", params, outs, inner,
            f"{call.callee}: first called for `{call.path}` at {call.loc or '?'}"))
        return symbol

    def function_text(self, head: str, params: list[str], outs: list[str], scope: Scope,
                      doc: str) -> str:
        results = ", ".join(scope.ty(o) for o in outs)
        lines = [f"  // {doc}", f"  func.func {head}({', '.join(params)}) -> ({results}) {{"]
        lines += ["    " + line.replace("\n", "\n    ") for line in scope.lines]
        lines.append(f'    "func.return"({", ".join(outs)}) : ({results}) -> ()')
        lines.append("  }")
        return "\n".join(lines)

    def module(self, flag: str | None = None, checks: Mapping[str, Any] | None = None) -> str:
        g = self.graph
        scope = Scope(g, portable=self.portable is not None)
        params = []
        for ref in [*g.inputs, *("@" + p for p in g.states), *("@" + p for p in g.parameters)]:
            ssa = scope.fresh(ref)
            scope.env[ref] = ssa
            scope.types[ssa] = tuple(scope.ref_type(ref))  # type: ignore[assignment]
            params.append(f"{ssa}: {scope.ty(ssa)}")
        self.body(scope, 0, len(g.steps), None)
        outs = [scope.env[r] for r in g.outputs] + [scope.env["@" + p] for p in g.states]
        outs += [scope.env[flag]] if flag else []
        main = self.function_text(
            "public @main", params, outs, scope,
            f"entry {g.model}.{g.entry}: arguments are its inputs, then its states, then its "
            "parameters; results its outputs, then its states after the call"
            + (", then linnet.valid" if flag else ""))
        header = [f"// StableHLO generated by linnet-lang {__version__} for {g.model}.{g.entry}.",
                  "// Arguments of @main, in order: "
                  + ", ".join(r.lstrip("%") for r in g.inputs)
                  + (", the states " + ", ".join(g.states) if g.states else "")
                  + ", then the parameters by path.",
                  f"module @{re.sub(r'[^0-9A-Za-z_]', '_', g.model + '_' + g.entry)}"
                  + (f" attributes {{{mlir_attribute(checks)}}}" if checks is not None else "")
                  + " {"]
        if flag:
            header.insert(2, "// The last result, linnet.valid, is false where an index left "
                             "its axis (docs/export.md).")
        return "\n".join([*header, *self.texts, main, "}"]) + "\n"


def emit_stablehlo(graph: Graph, sources: Mapping[str, str] | None = None,
                   validity: bool = True, portable: tuple[int, int, int] | None = None) -> str:
    """StableHLO MLIR text for one lowered entry (see the module docstring for its form).
    ``validity``: the last result is ``linnet.valid`` (:mod:`linnet.lang.export_checks`),
    what it checks in the module attribute ``linnet.valid``. ``portable``: a target version
    (``(1, 0, 0)``): the text StableHLO's serializer takes at it (erf from arithmetic, std
    ops as calls below 0.19.0; :mod:`linnet.lang.emit.stablehlo_portable`).

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }''')
    >>> text = emit_stablehlo(lower(prog, "run", {"x": [3]}))
    >>> "func.func public @main(%x: tensor<3xf32>)" in text
    True
    """
    if not validity:
        return StablehloEmitter(graph, sources, portable).module()
    from linnet.lang.export_checks import describe
    from linnet.lang.ir.validity import with_validity

    checked, flag = with_validity(graph)
    return StablehloEmitter(checked, sources, portable).module(flag, describe(graph))


def argument_order(graph: Graph) -> list[str]:
    """The names of ``@main``'s arguments, in order: inputs, states, parameters."""
    return [r.lstrip("%") for r in graph.inputs] + list(graph.states) + list(graph.parameters)


# ---------------------------------------------------------------- jax: verify and run
def _jax() -> Any:
    try:
        import jax  # noqa: F401
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib.mlir import ir
    except ImportError:
        raise LinnetError(Diagnostic(
            "E0942", "checking or running StableHLO needs jax, which is not installed",
            help="install it with `pip install 'linnet-lang[stablehlo]'`")) from None
    return jmlir, ir


def verify(text: str) -> None:
    """Parse and verify ``text`` with jaxlib's MLIR bindings (the StableHLO and CHLO dialects
    registered); a failure is an internal error (E0943).

    >>> verify(emit_stablehlo(graph))                                # doctest: +SKIP
    """
    jmlir, ir = _jax()
    with jmlir.make_ir_context():
        try:
            module = ir.Module.parse(text)
            ok = module.operation.verify()
        except Exception as exc:  # MLIRError: a diagnostic with the offending line
            raise LinnetError(Diagnostic(
                "E0943", f"the StableHLO text does not parse or verify: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}",
                help="this is a bug in linnet-lang's StableHLO emitter: please report it")
            ) from None
        if not ok:
            raise LinnetError(Diagnostic("E0943", "the StableHLO module does not verify",
                                         help="this is a bug in linnet-lang's StableHLO "
                                              "emitter: please report it"))


def compile_cpu(text: str) -> Callable[..., list[Any]]:
    """Compile ``text`` for JAX's CPU backend; returns ``run(*arrays) -> [numpy arrays]``.

    Uses jaxlib's compiler entry points (``jax._src.compiler.backend_compile_and_load``,
    private API, checked with the jax of uv.lock, 0.10.2); a jax without them is E0942.
    ``run``'s arguments follow :func:`argument_order`.
    """
    import numpy as np

    jmlir, ir = _jax()
    try:
        import jax
        import jax.extend.backend as jeb
        from jax._src import compiler
        from jax._src.lib import xla_client as xc

        backend = jeb.get_backend("cpu")
        device = backend.devices()[0]
        options = compiler.get_compile_options(1, 1, backend=backend)
        compile_and_load = compiler.backend_compile_and_load
    except (ImportError, AttributeError) as exc:
        raise LinnetError(Diagnostic(
            "E0942", f"this jax ({getattr(sys.modules.get('jax'), '__version__', '?')}) lacks "
                     f"the compiler entry points linnet-lang runs StableHLO with: {exc}",
            help="install the jax version linnet-lang is tested with (0.10.2), or run the "
                 "text with another StableHLO consumer (IREE)")) from None
    with jmlir.make_ir_context():
        module = ir.Module.parse(text)
        exe = compile_and_load(backend, module, xc.DeviceList((device,)), options, [])

    def run(*arrays: Any) -> list[Any]:
        bufs = [jax.device_put(np.asarray(a), device) for a in arrays]
        return [np.asarray(o) for o in exe.execute(bufs)]

    return run
