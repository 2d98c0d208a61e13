"""The result type of every primitive: one rule per primitive in :data:`SHAPE_RULES`.

A rule takes a :class:`~linnet.lang.ir.graph.Step` and its operands' types (parameters and
states included) and returns the :class:`Expected` type of its result: the shape, and the
dtype where the operands and attributes determine it (a comparison is bool, ``convert``
makes ``attributes.dtype``, arithmetic keeps its operands' common dtype). A step whose
attributes do not fit its operands (a slice past the axis, a transpose's perm of another
rank) raises :class:`ShapeProblem` saying why. :func:`~linnet.lang.ir.verify.verify`
compares every step's declared result type against its rule (E0685), so a pass (grad,
shard) that makes a wrong type is caught where it makes it, not by the emitter or at run
time. ``tests/test_coverage.py`` checks that every primitive has a rule.

>>> from linnet.lang.ir.graph import Step, ValueType
>>> f32 = ValueType((2, 1), "f32")
>>> expected(Step("add", ["%a", "%b"], ["%c"]), [f32, ValueType((2, 3), "f32")])
Expected(shape=(2, 3), dtype='f32')
>>> expected(Step("lt", ["%a", "%b"], ["%c"]), [f32, f32]).dtype
'bool'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from linnet.lang.ir import bits
from linnet.lang.ir.graph import Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES, Category


class Expected(NamedTuple):
    """A step's result type as its rule derives it; ``dtype`` None: not determined by the
    operands and attributes (the declared dtype is taken as it is)."""

    shape: tuple[int, ...] | None
    dtype: str | None


class ShapeProblem(Exception):
    """A step's attributes or operands do not fit together (the message says how)."""


ShapeRule = Callable[[Step, list[ValueType]], Expected | None]


def _broadcast_shapes(step: Step, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """numpy broadcasting of operands of equal rank (rank 0 broadcasts to any)."""
    ranks = {len(s) for s in shapes if s}
    if len(ranks) > 1:
        raise ShapeProblem(f"has operands of different ranks {[list(s) for s in shapes]}")
    rank = ranks.pop() if ranks else 0
    out = []
    for a in range(rank):
        sizes = {s[a] for s in shapes if s and s[a] != 1}
        if len(sizes) > 1:
            raise ShapeProblem(
                f"has operands of shapes {[list(s) for s in shapes]}, which do not broadcast"
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _common(types: list[ValueType]) -> str | None:
    dtypes = {t.dtype for t in types}
    return dtypes.pop() if len(dtypes) == 1 else None


def _elementwise(step: Step, ops: list[ValueType]) -> Expected:
    prim = PRIMITIVES[step.op]
    shape = _broadcast_shapes(step, [t.shape for t in ops])
    if prim.bool_result:
        return Expected(shape, "bool")
    return Expected(shape, _common(ops))


def _select(step: Step, ops: list[ValueType]) -> Expected:
    if ops[0].dtype != "bool":
        raise ShapeProblem(f"has a condition of dtype {ops[0].dtype}, not bool")
    return Expected(_broadcast_shapes(step, [t.shape for t in ops]), _common(ops[1:]))


def _convert(step: Step, ops: list[ValueType]) -> Expected:
    return Expected(ops[0].shape, _attr_dtype(step))


def _bitcast(step: Step, ops: list[ValueType]) -> Expected:
    """The operand's shape, its bits read as ``attributes.dtype``: a type of its width."""
    dtype = _attr_dtype(step)
    why = bits.problem(ops[0].dtype, dtype or "?")
    if why is not None:
        raise ShapeProblem(f"reads {ops[0].dtype} bits as {dtype!r}: {why}")
    return Expected(ops[0].shape, dtype)


def _attr_dtype(step: Step) -> str | None:
    dtype = step.attributes.get("dtype")
    return dtype if isinstance(dtype, str) else None


def _ints(step: Step, key: str) -> list[int]:
    value = step.attributes.get(key)
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ShapeProblem(f"has no `{key}` list of integers (it has {value!r})")
    return list(value)


def _constant(step: Step, ops: list[ValueType]) -> Expected:
    return Expected((), _attr_dtype(step))


def _iota(step: Step, ops: list[ValueType]) -> Expected:
    shape = _ints(step, "shape")
    axis = step.attributes.get("axis", 0)
    if not isinstance(axis, int) or not 0 <= axis < len(shape):
        raise ShapeProblem(f"counts along axis {axis!r} of a rank-{len(shape)} shape")
    return Expected(tuple(shape), _attr_dtype(step))


def _reshape(step: Step, ops: list[ValueType]) -> Expected:
    shape = tuple(_ints(step, "shape"))
    if math.prod(shape) != math.prod(ops[0].shape):
        raise ShapeProblem(
            f"reshapes {list(ops[0].shape)} to {list(shape)}: the element counts differ"
        )
    return Expected(shape, ops[0].dtype)


def _transpose(step: Step, ops: list[ValueType]) -> Expected:
    perm, shape = _ints(step, "perm"), ops[0].shape
    if sorted(perm) != list(range(len(shape))):
        raise ShapeProblem(f"permutes by {perm} an operand of rank {len(shape)}")
    return Expected(tuple(shape[p] for p in perm), ops[0].dtype)


def _broadcast(step: Step, ops: list[ValueType]) -> Expected:
    shape, have = tuple(_ints(step, "shape")), ops[0].shape
    if len(have) not in (0, len(shape)) or any(a not in (1, b) for a, b in zip(have, shape)):
        raise ShapeProblem(f"broadcasts {list(have)} to {list(shape)}")
    return Expected(shape, ops[0].dtype)


def _slice(step: Step, ops: list[ValueType]) -> Expected:
    starts, limits, shape = _ints(step, "starts"), _ints(step, "limits"), ops[0].shape
    if (
        len(starts) != len(shape)
        or len(limits) != len(shape)
        or any(not 0 <= a <= b <= n for a, b, n in zip(starts, limits, shape))
    ):
        raise ShapeProblem(f"slices {starts}..{limits} out of an operand of shape {list(shape)}")
    return Expected(tuple(b - a for a, b in zip(starts, limits)), ops[0].dtype)


def _reduce(step: Step, ops: list[ValueType]) -> Expected:
    axes, shape = _ints(step, "axes"), ops[0].shape
    if len(set(axes)) != len(axes) or any(not 0 <= a < len(shape) for a in axes):
        raise ShapeProblem(f"reduces axes {axes} of an operand of rank {len(shape)}")
    out = tuple(d for a, d in enumerate(shape) if a not in axes)
    # max and min keep the operand's dtype; the others make their accumulator's.
    if step.attributes.get("kind") in ("max", "min"):
        return Expected(out, ops[0].dtype)
    acc = step.attributes.get("accumulate")
    return Expected(out, acc if isinstance(acc, str) else None)


def _contract(step: Step, ops: list[ValueType]) -> Expected:
    spec = step.attributes.get("spec")
    if not isinstance(spec, str) or spec.count("->") != 1 or spec.count(",") != 1:
        raise ShapeProblem(f"has spec {spec!r}, not `ab,bc->ac`")
    ins, result = spec.split("->")
    letters = ins.split(",")
    sizes: dict[str, int] = {}
    for lt, t in zip(letters, ops):
        if len(lt) != len(t.shape):
            raise ShapeProblem(
                f"has spec {spec!r} for operands of shapes {[list(o.shape) for o in ops]}"
            )
        for ch, d in zip(lt, t.shape):
            # einsum broadcasts a size-1 axis against its letter's other size.
            sizes[ch] = d if sizes.get(ch, 1) == 1 else sizes[ch]
    if any(ch not in sizes for ch in result):
        raise ShapeProblem(f"has spec {spec!r}: a result letter names no operand axis")
    acc = step.attributes.get("accumulate")
    return Expected(tuple(sizes[ch] for ch in result), acc if isinstance(acc, str) else None)


def _take(step: Step, ops: list[ValueType]) -> Expected:
    x, idx = ops
    axis = step.attributes.get("axis", 0)
    if not isinstance(axis, int) or not 0 <= axis < len(x.shape):
        raise ShapeProblem(f"takes along axis {axis!r} of an operand of rank {len(x.shape)}")
    return Expected(x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype)


def _positions(step: Step, x: ValueType, indices: list[ValueType]) -> tuple[int, ...]:
    """The broadcast shape of a gather's or scatter's index operands."""
    k = len(indices)
    if k > len(x.shape):
        raise ShapeProblem(f"indexes {k} axes of a rank-{len(x.shape)} tensor")
    return _broadcast_shapes(step, [t.shape for t in indices]) if indices else ()


def _gather(step: Step, ops: list[ValueType]) -> Expected:
    x, *indices = ops
    return Expected(_positions(step, x, indices) + x.shape[len(indices) :], x.dtype)


def _placed(step: Step, x: ValueType, value: ValueType, indices: list[ValueType]) -> None:
    """A scatter's or scatter-add's value has the shape its positions pick out of ``x``
    (without positions, the value is broadcast over all of ``x``)."""
    want = _positions(step, x, indices) + x.shape[len(indices) :]
    if indices and value.shape != want:
        raise ShapeProblem(
            f"places a value of shape {list(value.shape)} at positions of shape {list(want)}"
        )


def _scatter_add(step: Step, ops: list[ValueType]) -> Expected:
    x, value, *indices = ops
    _placed(step, x, value, indices)
    return Expected(x.shape, x.dtype)


def _scatter(step: Step, ops: list[ValueType]) -> None:
    state, value, *indices = ops
    _placed(step, state, value, indices)
    return None


def _all_reduce(step: Step, ops: list[ValueType]) -> Expected:
    return Expected(ops[0].shape, ops[0].dtype)


def _all_gather(step: Step, ops: list[ValueType]) -> Expected:
    axis, world, shape = step.attributes.get("axis"), step.attributes.get("world"), ops[0].shape
    if not isinstance(axis, int) or not 0 <= axis < len(shape) or not isinstance(world, int):
        raise ShapeProblem(
            f"gathers along axis {axis!r} over {world!r} ranks an operand of rank {len(shape)}"
        )
    out = list(shape)
    out[axis] *= world
    return Expected(tuple(out), ops[0].dtype)


SHAPE_RULES: dict[str, ShapeRule] = {
    # Every elementwise primitive broadcasts alike; only select's condition is special.
    **{name: _elementwise for name, p in PRIMITIVES.items() if p.category is Category.ELEMENTWISE},
    "select": _select,
    "convert": _convert,
    "bitcast": _bitcast,
    "constant": _constant,
    "iota": _iota,
    "reshape": _reshape,
    "transpose": _transpose,
    "broadcast": _broadcast,
    "slice": _slice,
    "reduce": _reduce,
    "contract": _contract,
    "take": _take,
    "gather": _gather,
    "scatter_add": _scatter_add,
    "scatter": _scatter,
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
}


def expected(step: Step, operands: list[ValueType]) -> Expected | None:
    """The result type ``step`` must declare, given its operands' types (None: it makes no
    result); raises :class:`ShapeProblem` where the step is malformed.

    >>> expected(Step("slice", ["%x"], ["%y"], {"starts": [1], "limits": [3]}),
    ...          [ValueType((4,), "f32")])
    Expected(shape=(2,), dtype='f32')
    """
    return SHAPE_RULES[step.op](step, operands)


def mismatch(step: Step, operands: list[ValueType], declared: Any) -> str | None:
    """Why ``declared`` (the result's type in ``graph.values``) is not the type ``step``
    makes from ``operands``; None where it is.

    >>> mismatch(Step("exp", ["%x"], ["%y"]), [ValueType((2,), "f32")], ValueType((3,), "f32"))
    'makes f32[3], but its operands and attributes make f32[2]'
    """
    try:
        want = expected(step, operands)
    except ShapeProblem as problem:
        return str(problem)
    if want is None or not isinstance(declared, ValueType):
        return None
    shape_ok = want.shape is None or tuple(declared.shape) == want.shape
    dtype_ok = want.dtype is None or declared.dtype == want.dtype
    if shape_ok and dtype_ok:
        return None
    shape = list(declared.shape if want.shape is None else want.shape)
    return (
        f"makes {declared.dtype}{list(declared.shape)}, but its operands and attributes make "
        f"{want.dtype or declared.dtype}{shape}"
    )
