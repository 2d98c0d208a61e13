"""The ONNX emitter's rule per primitive (:data:`RULES`; ``tests/test_coverage.py`` checks
that every primitive has one) and which attributes of each may be symbolic.

>>> from linnet.lang.ir.primitives import PRIMITIVES
>>> sorted(set(PRIMITIVES) - set(RULES))  # collectives (one rank's graph), and bitcast
['all_gather', 'all_reduce', 'bitcast']
"""

from __future__ import annotations

from typing import Any

from linnet.lang.emit import onnx_edges, onnx_shapes
from linnet.lang.emit.onnx_scope import _INTS, Rule, Scope, _dtype
from linnet.lang.ir.elementwise import Formula, composed, spelled
from linnet.lang.ir.graph import Step
from linnet.lang.ir.primitives import Category, Primitive, in_category


def _out(s: Step, n: Scope) -> str:
    return n.graph.values[s.results[0]].dtype


def _unary(op_type: str) -> Rule:
    def rule(s: Step, n: Scope) -> Any:
        return n.op(op_type, [n.get(s.operands[0], _out(s, n))], hint=s.results[0])

    return rule


def _binary(op_type: str, compare: bool = False) -> Rule:
    def rule(s: Step, n: Scope) -> Any:
        a, b = s.operands
        # Comparisons and logic read operands of one dtype; arithmetic computes in the result's.
        want = (n.dtype(a) if n.dtype(a) == n.dtype(b) else "f32") if compare else _out(s, n)
        return n.op(op_type, [n.get(a, want), n.get(b, want)], hint=s.results[0])

    return rule


def _spelled(text: str, p: Primitive) -> Rule:
    """A rule of the ``onnx`` column of linnet.lang.ir.elementwise: one operator on the
    operands (comparisons and logic read operands of one dtype, arithmetic the result's),
    or a composition of operators computed in the result's dtype."""
    tree = composed(text)
    if tree is None:
        return _unary(text) if p.arity == 1 else _binary(text, compare=p.bool_result)

    def rule(s: Step, n: Scope) -> Any:
        dt = _out(s, n)

        def build(f: Formula, hint: str = "") -> Any:
            if f[0] == "ref":
                return n.get(s.operands["xy".index(f[1])], dt)
            if f[0] == "const":
                return n.const(f[1], dt)
            return n.op(f[1], [build(a) for a in f[2]], hint=hint)

        return build(tree, s.results[0])

    return rule


def _floor(s: Step, n: Scope) -> Any:
    x = n.get(s.operands[0], _out(s, n))
    if _out(s, n) in _INTS:  # an integer is its own floor
        return n.op("Identity", [x], hint=s.results[0])
    return n.op("Floor", [x], hint=s.results[0])


def _ne(s: Step, n: Scope) -> Any:
    return n.op("Not", [_binary("Equal", compare=True)(s, n)], hint=s.results[0])


def _select(s: Step, n: Scope) -> Any:
    c, a, b = s.operands
    dt = _out(s, n)
    return n.op("Where", [n.get(c, "bool"), n.get(a, dt), n.get(b, dt)], hint=s.results[0])


def _constant(s: Step, n: Scope) -> Any:
    _dtype(n.ir, s.attributes["dtype"], n)
    return n.const(s.attributes["value"], s.attributes["dtype"], hint=s.results[0])


def _transpose(s: Step, n: Scope) -> Any:
    return n.op(
        "Transpose", [n.get(s.operands[0])], {"perm": list(s.attributes["perm"])}, hint=s.results[0]
    )


_REDUCE = {
    "sum": "ReduceSum",
    "mean": "ReduceMean",
    "max": "ReduceMax",
    "min": "ReduceMin",
    "prod": "ReduceProd",
}


def _reduce(s: Step, n: Scope) -> Any:
    kind, axes = s.attributes["kind"], list(s.attributes["axes"])
    src = s.operands[0]
    # max and min compare in the operand's dtype; the others accumulate in `accumulate`.
    x = n.get(src) if kind in ("max", "min") else n.get(src, s.attributes["accumulate"])
    if not axes:
        out = n.op("Identity", [x])
    else:
        out = n.op(_REDUCE[kind], [x, n.ints(axes, "axes")], {"keepdims": 0})
        if kind in ("max", "min") and n.dtype(src) not in _INTS | {"bool"}:
            out = onnx_edges.nan_through(n, x, out, n.dtype(src), n.ints(axes, "axes"))
    have = n.dtype(src) if kind in ("max", "min") else s.attributes["accumulate"]
    return n.op("Identity", [n.cast(out, have, _out(s, n))], hint=s.results[0])


def _contract(s: Step, n: Scope) -> Any:
    acc = s.attributes["accumulate"]
    a, b = (n.get(o, acc) for o in s.operands)
    out = n.op("Einsum", [a, b], {"equation": s.attributes["spec"]})
    return n.op("Identity", [n.cast(out, acc, _out(s, n))], hint=s.results[0])


def _index(n: Scope, ref: str, size: int, zero: bool) -> tuple[Any, Any]:
    """An index as int64, clamped into the axis, and the bool mask of the positions inside
    it (None when reads are unchecked). An index that must be in range is clamped too:
    ONNX's Gather would count -1 from the end and ScatterND fail or write outside; a caller
    reads the model's `linnet.valid` output (linnet.lang.ir.validity) to know."""
    idx = n.get(ref, "i64")
    lo, hi = n.const(0, "i64"), n.const(size - 1, "i64")
    if not zero:
        return n.op("Max", [n.op("Min", [idx, hi]), lo]), None
    valid = n.op("And", [n.op("GreaterOrEqual", [idx, lo]), n.op("LessOrEqual", [idx, hi])])
    return n.op("Max", [n.op("Min", [idx, hi]), lo]), valid


def _masked(n: Scope, s: Step, out: Any, valid: Any, have: list[int], view: list[int]) -> Any:
    """Zero where ``valid`` (of shape ``have``, reshaped to ``view``) is false."""
    mask = onnx_shapes.reshape(n, valid, have, view)
    return n.op("Where", [mask, out, n.const(0, _out(s, n))], hint=s.results[0])


def _take(s: Step, n: Scope) -> Any:
    x, ref = s.operands
    axis, zero = s.attributes["axis"], s.attributes["bounds"] == "zero"
    shape, ishape = n.shape(x), n.shape(ref)
    idx, valid = _index(n, ref, shape[axis], zero)
    out = n.op("Gather", [n.get(x), idx], {"axis": axis})
    if valid is None:
        return n.op("Identity", [out], hint=s.results[0])
    view = [1] * axis + list(ishape) + [1] * (len(shape) - axis - 1)
    return _masked(n, s, out, valid, list(ishape), view)


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> list[int]:
    rank = max((len(sh) for sh in shapes), default=0)
    out = [1] * rank
    for sh in shapes:
        for i, d in enumerate((1,) * (rank - len(sh)) + tuple(sh)):
            out[i] = max(out[i], d)
    return out


def _stacked(
    n: Scope, refs: list[str], sizes: tuple[int, ...], zero: bool
) -> tuple[Any, Any, list[int]]:
    """Indices broadcast together and stacked on a last axis (GatherND's and ScatterND's
    form), the mask of positions inside every axis, and the broadcast shape."""
    common = _broadcast_shape([n.shape(r) for r in refs])
    parts, valid = [], None
    for a, ref in enumerate(refs):
        idx, ok = _index(n, ref, sizes[a], zero)
        idx = onnx_shapes.expand(n, idx, n.shape(ref), common)
        parts.append(n.op("Unsqueeze", [idx, n.ints([-1], "axes")]))
        if ok is not None:
            ok = onnx_shapes.expand(n, ok, n.shape(ref), common)
            valid = ok if valid is None else n.op("And", [valid, ok])
    stacked = parts[0] if len(parts) == 1 else n.op("Concat", parts, {"axis": -1})
    return stacked, valid, common


def _gather(s: Step, n: Scope) -> Any:
    x, *refs = s.operands
    shape, zero = n.shape(x), s.attributes["bounds"] == "zero"
    if not refs:
        return n.op("Identity", [n.get(x)], hint=s.results[0])
    idx, valid, common = _stacked(n, refs, shape, zero)
    out = n.op("GatherND", [n.get(x), idx])
    if valid is None:
        return n.op("Identity", [out], hint=s.results[0])
    return _masked(n, s, out, valid, common, common + [1] * (len(shape) - len(refs)))


def _scatter(s: Step, n: Scope) -> None:
    state, value, *refs = s.operands
    shape, dt = n.shape(state), n.dtype(state)
    if not refs:
        new = n.op("Expand", [n.get(value, dt), n.ints(shape)], hint=state[1:])
    else:
        idx, _, common = _stacked(n, refs, shape, zero=False)
        updates = n.op("Expand", [n.get(value, dt), n.ints(common + list(shape[len(refs) :]))])
        new = n.op("ScatterND", [n.get(state), idx, updates], hint=state[1:])
    n.env[state] = new  # later reads of the state see this version
    return None


def _scatter_add(s: Step, n: Scope) -> Any:
    """A copy of the operand with the value added at the positions: ScatterND with
    ``reduction="add"`` (coinciding positions add up). Under bounds zero a position outside
    adds nothing: its index is clamped into the axis and its value masked to 0 (ScatterND
    would wrap a negative index), as emit/torch.py and emit/jax.py do."""
    x, value, *refs = s.operands
    dt, shape = _out(s, n), n.shape(x)
    v = n.get(value, dt)
    if not refs:
        return n.op("Add", [n.get(x, dt), v], hint=s.results[0])
    k = len(refs)
    idx, valid, common = _stacked(n, refs, shape, s.attributes["bounds"] == "zero")
    if valid is not None:
        mask = onnx_shapes.reshape(n, valid, common, common + [1] * (len(shape) - k))
        v = n.op("Where", [mask, v, n.const(0, dt)])
    updates = n.op("Expand", [v, n.ints(common + list(shape[k:]))])
    return n.op("ScatterND", [n.get(x, dt), idx, updates], {"reduction": "add"}, hint=s.results[0])


RULES: dict[str, Rule] = spelled(
    "onnx",
    _spelled,
    {
        "floor": _floor,
        "ne": _ne,
        "div": onnx_edges.RULES["div"],
        "rem": onnx_edges.RULES["rem"],
        "select": _select,
        "convert": onnx_edges.RULES["convert"],
        "constant": _constant,
        "iota": onnx_shapes.iota,
        "reshape": onnx_shapes.reshape_rule,
        "transpose": _transpose,
        "broadcast": onnx_shapes.broadcast_rule,
        "reduce": _reduce,
        "contract": _contract,
        "take": _take,
        "gather": _gather,
        "scatter": _scatter,
        "scatter_add": _scatter_add,
        "slice": onnx_shapes.slice_rule,
    },
)
"""One rule per primitive (``tests/test_coverage.py`` checks it covers the registry)."""

# A rank's graph (linnet.lang.passes.shard) is not exported: an ONNX model is one process's
# program. ONNX's BitCast arrived in opset 26; the models written here are opset 21 (what
# onnxruntime 1.20 runs), which has no way to read a tensor's bits as another type.
# E0930 names the step and its source line, with the reason below.
EXPECTED_MISSING: frozenset[str] = frozenset({"all_reduce", "all_gather", "bitcast"})
WHY_MISSING: dict[str, str] = {
    "bitcast": "ONNX opset 21, which this exporter writes, cannot read a tensor's bits as "
    "another type (ONNX's BitCast arrived in opset 26)",
}
"""Why a primitive of this language is not exported (E0930's note; the collectives are
never exported, see above)."""

_NONE: frozenset[str] = frozenset()
SYMBOLIC_ATTRIBUTES: dict[str, frozenset[str]] = {
    # Elementwise steps have no attribute a dim may change (convert's is a dtype).
    **{op: _NONE for op in in_category(Category.ELEMENTWISE) - EXPECTED_MISSING},
    "constant": frozenset({"value"}),  # `L as f32`: a size, cast (Scope.const)
    "iota": frozenset({"shape"}),  # Range(0, L) reshaped and expanded (_iota)
    "reshape": frozenset({"shape"}),
    "broadcast": frozenset({"shape"}),  # Scope.ints
    "slice": frozenset({"starts", "limits"}),  # Slice's starts and ends (Scope.ints)
    # The rest read their sizes off the operands' shapes (SymInts too); an attribute of theirs
    # (an axis, an einsum spec, a bounds mode) that changed with a dim would be a new graph.
    "transpose": _NONE,
    "reduce": _NONE,
    "contract": _NONE,
    "take": _NONE,
    "gather": _NONE,
    "scatter_add": _NONE,
    "scatter": _NONE,
}
"""Per primitive, the attributes whose numbers may be :class:`~linnet.lang.export.SymInt`s
(the rule computes them from the dims at run time): what
:func:`linnet.lang.export.symbolic_dims` lets change with a symbolic dim. Any other attribute
that changes is E0936, never a number fixed silently."""
