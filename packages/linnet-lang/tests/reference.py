"""A NumPy reference interpreter for the graph format (a test helper; not shipped).

:func:`run_graph` runs a :class:`~linnet.lang.ir.graph.Graph` step by step with one rule per
primitive in :data:`REFERENCE_RULES`, each written from the primitive's row in
:mod:`linnet.lang.ir.primitives`. ``tests/test_coverage.py`` walks ``PRIMITIVES`` and fails when
a primitive has no rule here (``scatter``, in :data:`EXPECTED_MISSING`, is run by
:func:`run_graph` itself).

It is deliberately strict, so that it finds lowering bugs rather than papering over them:

* every result is checked against the shape and dtype the graph declares for it;
* elementwise operands have equal rank (rank-0 operands broadcast freely) and one dtype
  (``select``'s condition is bool);
* an ``unchecked`` index outside its axis, or a ``scatter`` position outside the state, raises
  :class:`GraphRunError` (the program promised it would not happen).

Element types: ``bf16`` has no NumPy type; it is run as ``float32`` (no rounding to 8 bits of
mantissa), so bf16 graphs are compared at f32 precision. Every other dtype maps to its NumPy
namesake.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from linnet.lang.ir.bits import WIDTHS
from linnet.lang.ir.edges import float_to_int
from linnet.lang.ir.elementwise import compiled, spelled
from linnet.lang.ir.graph import Graph, Step
from linnet.lang.ir.primitives import Primitive

NUMPY_DTYPES: dict[str, Any] = {
    "bf16": np.float32,  # no bfloat16 in NumPy: run at f32 precision
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "bool": np.bool_,
}


class GraphRunError(Exception):
    """A graph the reference interpreter cannot run: a malformed step or an undefined read."""


def np_dtype(dtype: str) -> np.dtype:
    try:
        return np.dtype(NUMPY_DTYPES[dtype])
    except KeyError:
        raise GraphRunError(f"unknown dtype {dtype!r}") from None


# ==================================================================== rules
Rule = Callable[[list[np.ndarray], dict[str, Any], Step], np.ndarray]


def _same_dtype(step: Step, xs: list[np.ndarray]) -> None:
    dtypes = {x.dtype for x in xs}
    if len(dtypes) > 1:
        raise GraphRunError(f"{step.op}: operands of different dtypes {sorted(map(str, dtypes))}")


def _broadcast_operands(step: Step, xs: list[np.ndarray]) -> None:
    ranks = {x.ndim for x in xs if x.ndim > 0}
    if len(ranks) > 1:
        raise GraphRunError(f"{step.op}: operands of different ranks {[list(x.shape) for x in xs]}")
    try:
        np.broadcast_shapes(*(x.shape for x in xs))
    except ValueError:
        raise GraphRunError(
            f"{step.op}: shapes do not broadcast {[list(x.shape) for x in xs]}"
        ) from None


def _unary(fn: Callable[[np.ndarray], np.ndarray], floats_only: bool = True) -> Rule:
    def rule(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
        (x,) = xs
        if floats_only and not np.issubdtype(x.dtype, np.floating):
            raise GraphRunError(f"{step.op} of a {x.dtype} tensor")
        return np.asarray(fn(x)).astype(x.dtype, copy=False)

    return rule


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], result: str | None = None) -> Rule:
    def rule(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
        _broadcast_operands(step, xs)
        _same_dtype(step, xs)
        x, y = xs
        out = np.asarray(fn(x, y))
        return out.astype(np.bool_ if result == "bool" else x.dtype, copy=False)

    return rule


def _erf(x: np.ndarray) -> np.ndarray:
    flat = np.fromiter((math.erf(float(v)) for v in x.reshape(-1)), dtype=np.float64, count=x.size)
    return flat.reshape(x.shape)


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        # Rounds toward -inf; x / 0 is 0 (linnet.lang.ir.edges).
        with np.errstate(divide="ignore", over="ignore"):
            return np.where(y == 0, 0, np.floor_divide(x, np.where(y == 0, 1, y))).astype(
                np.result_type(x, y)
            )
    return np.true_divide(x, y)


def _rem(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The divisor's sign, as Python's % and torch.remainder; an integer x % 0 is x."""
    if np.issubdtype(x.dtype, np.integer):
        return np.where(y == 0, x, np.remainder(x, np.where(y == 0, 1, y))).astype(
            np.result_type(x, y)
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.remainder(x, y)


def _logical(fn: Callable[..., np.ndarray]) -> Rule:
    def rule(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
        if any(x.dtype != np.bool_ for x in xs):
            raise GraphRunError(f"{step.op} of non-bool operands")
        if len(xs) > 1:
            _broadcast_operands(step, xs)
        return np.asarray(fn(*xs))

    return rule


def _neg(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    (x,) = xs
    if x.dtype == np.bool_:
        raise GraphRunError("neg of a bool tensor")
    return np.negative(x)


def _select(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    c, x, y = xs
    if c.dtype != np.bool_:
        raise GraphRunError(f"select: condition is {c.dtype}, not bool")
    _broadcast_operands(step, xs)
    _same_dtype(step, [x, y])
    return np.where(c, x, y)


def _convert(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    (x,) = xs
    # Float to integer: NaN is 0, the rest truncates toward zero and saturates
    # (linnet.lang.ir.edges); integers wrap; anything to bool is `!= 0`.
    want = np_dtype(attrs["dtype"])
    if np.issubdtype(x.dtype, np.floating) and np.issubdtype(want, np.integer):
        flat = [float_to_int(float(v), attrs["dtype"]) for v in x.reshape(-1)]
        return np.array(flat, dtype=want).reshape(x.shape)
    return x.astype(want)


def _bitcast(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    """The same bits read as ``attrs["dtype"]`` (``ndarray.view``). A bf16 is held as float32
    here: read as 16 bits, it is rounded to bf16 first (to nearest, ties to even, as the
    runtimes convert; a NaN stays a quiet NaN), and 16 bits read as bf16 are the upper half
    of a float32."""
    (x,) = xs
    dst = attrs["dtype"]
    if x.dtype == np.float32 and WIDTHS[dst] == 16:  # a bf16 operand
        word = x.view(np.uint32)
        rounded = (word + np.uint32(0x7FFF) + ((word >> 16) & np.uint32(1))) >> 16
        x = np.where(np.isnan(x), (word >> 16) | np.uint32(0x40), rounded).astype(np.uint16)
    if dst == "bf16":
        half = x.view(np.uint16).astype(np.uint32)
        return (half << np.uint32(16)).view(np.float32)
    if WIDTHS[dst] != x.dtype.itemsize * 8:
        raise GraphRunError(f"bitcast: a {x.dtype} operand is not {WIDTHS[dst]} bits wide")
    return x.view(np_dtype(dst))


def _constant(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    return np.array(attrs["value"], dtype=np_dtype(attrs["dtype"]))


def _iota(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    shape = tuple(attrs["shape"])
    axis = attrs.get("axis", 0)
    dtype = np_dtype(attrs.get("dtype", "i32"))
    if not 0 <= axis < len(shape):
        raise GraphRunError(f"iota: axis {axis} of a rank-{len(shape)} shape")
    line = np.arange(shape[axis], dtype=dtype)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(line.reshape(view), shape).copy()


def _reshape(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    (x,) = xs
    shape = tuple(attrs["shape"])
    if math.prod(shape) != x.size:
        raise GraphRunError(f"reshape of {list(x.shape)} to {list(shape)}")
    return x.reshape(shape)


def _transpose(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    (x,) = xs
    perm = list(attrs["perm"])
    if sorted(perm) != list(range(x.ndim)):
        raise GraphRunError(f"transpose: perm {perm} of a rank-{x.ndim} tensor")
    return np.transpose(x, perm)


def _broadcast(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    (x,) = xs
    shape = tuple(attrs["shape"])
    if x.ndim not in (0, len(shape)) or any(a not in (1, b) for a, b in zip(x.shape, shape)):
        raise GraphRunError(f"broadcast of {list(x.shape)} to {list(shape)}")
    return np.broadcast_to(x, shape).copy()


def _slice(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    (x,) = xs
    starts, limits = list(attrs["starts"]), list(attrs["limits"])
    if (
        len(starts) != x.ndim
        or len(limits) != x.ndim
        or any(not 0 <= a <= b <= n for a, b, n in zip(starts, limits, x.shape))
    ):
        raise GraphRunError(f"slice {starts}..{limits} of {list(x.shape)}")
    return x[tuple(slice(a, b) for a, b in zip(starts, limits))].copy()


def _reduce(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    (x,) = xs
    kind = attrs["kind"]
    axes = tuple(attrs["axes"])
    if any(not 0 <= a < x.ndim for a in axes) or len(set(axes)) != len(axes):
        raise GraphRunError(f"reduce: axes {list(axes)} of a rank-{x.ndim} tensor")
    acc = np_dtype(attrs["accumulate"])
    out_shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    count = math.prod(x.shape[a] for a in axes)
    if kind in ("max", "min"):
        out_dtype = x.dtype  # max/min keep the operand's type
        if count == 0:
            return np.full(out_shape, attrs.get("identity", 0), dtype=out_dtype)
        fn = np.max if kind == "max" else np.min
        return np.asarray(fn(x.astype(acc), axis=axes)).astype(out_dtype)
    a = x.astype(acc)
    if kind == "sum":
        out = np.sum(a, axis=axes, dtype=acc)
    elif kind == "prod":
        out = np.prod(a, axis=axes, dtype=acc)
    elif kind == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.sum(a, axis=axes, dtype=acc) / np.asarray(count, dtype=acc)
    else:
        raise GraphRunError(f"reduce: unknown kind {kind!r}")
    return np.asarray(out).astype(acc)


def _contract(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    a, b = xs
    acc = np_dtype(attrs["accumulate"])
    spec = attrs["spec"]
    ins, _, _ = spec.partition("->")
    sa, _, sb = ins.partition(",")
    if len(sa) != a.ndim or len(sb) != b.ndim:
        raise GraphRunError(f"contract: spec {spec!r} for ranks {a.ndim} and {b.ndim}")
    return np.asarray(np.einsum(spec, a.astype(acc), b.astype(acc))).astype(acc)


def _bounds_mask(idx: np.ndarray, size: int, bounds: str, op: str) -> np.ndarray:
    """Whether each index is inside ``0..size``; ``unchecked`` indices must all be."""
    inside = (idx >= 0) & (idx < size)
    if bounds == "unchecked":
        if not inside.all():
            bad = idx[~inside].reshape(-1)[:5].tolist()
            raise GraphRunError(f"{op}: unchecked index out of range 0..{size}: {bad}")
    elif bounds != "zero":
        raise GraphRunError(f"{op}: unknown bounds {bounds!r}")
    return inside


def _check_index(op: str, idx: np.ndarray) -> None:
    if not np.issubdtype(idx.dtype, np.integer):
        raise GraphRunError(f"{op}: index of dtype {idx.dtype}")


def _take(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    x, idx = xs
    _check_index("take", idx)
    axis = attrs["axis"]
    if not 0 <= axis < x.ndim:
        raise GraphRunError(f"take: axis {axis} of a rank-{x.ndim} tensor")
    inside = _bounds_mask(idx, x.shape[axis], attrs.get("bounds", "unchecked"), "take")
    safe = np.where(inside, idx, 0).astype(np.int64)
    if x.shape[axis] == 0:
        out_shape = x.shape[:axis] + idx.shape + x.shape[axis + 1 :]
        return np.zeros(out_shape, dtype=x.dtype)
    out = np.take(x, safe, axis=axis)
    mask = inside.reshape((1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1))
    return np.where(mask, out, np.zeros((), dtype=x.dtype)).astype(x.dtype)


def _gather(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    x, *indices = xs
    k = attrs["indexed_axes"]
    if k != len(indices) or k > x.ndim:
        raise GraphRunError(
            f"gather: {len(indices)} index operands for indexed_axes={k} of a rank-{x.ndim} tensor"
        )
    for ix in indices:
        _check_index("gather", ix)
    if len({ix.ndim for ix in indices}) > 1:
        raise GraphRunError(
            f"gather: index operands of different ranks {[list(i.shape) for i in indices]}"
        )
    try:
        ishape = np.broadcast_shapes(*(ix.shape for ix in indices))
    except ValueError:
        raise GraphRunError("gather: index shapes do not broadcast") from None
    bounds = attrs.get("bounds", "unchecked")
    inside = np.ones(ishape, dtype=bool)
    safe = []
    for axis, ix in enumerate(indices):
        ok = _bounds_mask(ix, x.shape[axis], bounds, "gather")
        inside = inside & ok
        safe.append(np.where(ok, ix, 0).astype(np.int64))
    if any(x.shape[a] == 0 for a in range(k)):
        return np.zeros(ishape + x.shape[k:], dtype=x.dtype)
    out = x[tuple(safe)]
    mask = inside.reshape(ishape + (1,) * (x.ndim - k))
    return np.where(mask, out, np.zeros((), dtype=x.dtype)).astype(x.dtype)


def _scatter_add(xs: list[np.ndarray], attrs: dict[str, Any], step: Step) -> np.ndarray:
    x, value, *indices = xs
    k = attrs["indexed_axes"]
    if k != len(indices) or k > x.ndim:
        raise GraphRunError(
            f"scatter_add: {len(indices)} positions for indexed_axes={k} of a rank-{x.ndim} tensor"
        )
    for ix in indices:
        _check_index("scatter_add", ix)
    if value.dtype != x.dtype:
        raise GraphRunError(f"scatter_add: {value.dtype} value into a {x.dtype} tensor")
    out = x.copy()
    if not indices:
        return (out + value).astype(x.dtype)
    ishape = np.broadcast_shapes(*(ix.shape for ix in indices))
    if value.shape != tuple(ishape) + x.shape[k:]:
        raise GraphRunError(
            f"scatter_add: value of shape {list(value.shape)} for positions of shape {list(ishape)}"
        )
    bounds = attrs.get("bounds", "unchecked")
    inside = np.ones(ishape, dtype=bool)
    for axis, ix in enumerate(indices):
        inside = inside & _bounds_mask(ix, x.shape[axis], bounds, "scatter_add")
    pos = tuple(np.broadcast_to(ix, ishape)[inside].astype(np.int64) for ix in indices)
    np.add.at(out, pos, value[inside])
    return out


def _one_process(xs: list, attrs: dict, step: Step) -> Any:
    raise GraphRunError(f"`{step.op}` needs {attrs['world']} ranks; run_graph runs one")


def _spelled(text: str, p: Primitive) -> Rule:
    """A rule from the ``numpy`` column of linnet.lang.ir.elementwise: logic on bools, math
    on floats unless the primitive's row allows integers, comparisons giving bool."""
    fn = compiled(text, p.arity or 0, {"np": np})
    if p.logical:
        return _logical(fn)
    if p.arity == 1:
        return _unary(fn, floats_only=not p.ints)
    return _binary(fn, "bool" if p.comparison else None)


REFERENCE_RULES: dict[str, Rule] = spelled(
    "numpy",
    _spelled,
    {
        "neg": _neg,
        "erf": _unary(_erf),
        "floor": _unary(np.floor),
        "div": _binary(_div),
        "rem": _binary(_rem),
        "select": _select,
        "convert": _convert,
        "bitcast": _bitcast,
        "constant": _constant,
        "iota": _iota,
        "reshape": _reshape,
        "transpose": _transpose,
        "broadcast": _broadcast,
        "reduce": _reduce,
        "contract": _contract,
        "take": _take,
        "gather": _gather,
        "scatter_add": _scatter_add,
        "slice": _slice,
        # "scatter" writes a state; run_graph handles it (see _scatter)
        # One process: a rank's collectives are run by tests/test_shard.py's lockstep runner.
        "all_reduce": _one_process,
        "all_gather": _one_process,
    },
)
RULES = REFERENCE_RULES  # the name tests/test_reference.py imports
STATE_RULES = {"scatter"}
# A scatter replaces a state rather than making a value: run_graph runs it with _scatter,
# which takes the states table, not a rule of REFERENCE_RULES' signature.
EXPECTED_MISSING: frozenset[str] = frozenset(STATE_RULES)


def _scatter(step: Step, xs: list[np.ndarray], states: dict[str, np.ndarray]) -> None:
    if not step.operands or not step.operands[0].startswith("@"):
        raise GraphRunError("scatter: the first operand must be a @state path")
    path = step.operands[0][1:]
    if path not in states:
        raise GraphRunError(f"scatter into `{path}`, which is not a state")
    state = states[path]
    value, *indices = xs[1:]
    k = step.attributes.get("indexed_axes", len(indices))
    if k != len(indices) or k > state.ndim:
        raise GraphRunError(
            f"scatter: {len(indices)} positions for indexed_axes={k} of a rank-{state.ndim} state"
        )
    for ix in indices:
        _check_index("scatter", ix)
    if len({ix.ndim for ix in indices}) > 1:
        raise GraphRunError(
            f"scatter: positions of different ranks {[list(i.shape) for i in indices]}"
        )
    try:
        ishape = np.broadcast_shapes(*(ix.shape for ix in indices)) if indices else ()
    except ValueError:
        raise GraphRunError("scatter: position shapes do not broadcast") from None
    want = tuple(ishape) + state.shape[k:]
    if value.shape != want:
        raise GraphRunError(
            f"scatter: value of shape {list(value.shape)} for positions of shape {list(want)}"
        )
    if value.dtype != state.dtype:
        raise GraphRunError(f"scatter: {value.dtype} value into a {state.dtype} state")
    for axis, ix in enumerate(indices):
        _bounds_mask(ix, state.shape[axis], "unchecked", "scatter")
    new = state.copy()  # earlier reads of the state keep the old value
    new[tuple(ix.astype(np.int64) for ix in indices)] = value
    states[path] = new


# ==================================================================== driver
def run_graph(
    graph: Graph,
    inputs: dict[str, np.ndarray],
    params: dict[str, np.ndarray],
    states: dict[str, np.ndarray],
) -> list[np.ndarray]:
    """Run ``graph`` and return its outputs.

    ``inputs`` is keyed by input name (``token``, or ``%token``), ``params`` and ``states`` by
    path (``model.norm.weight``). ``scatter`` steps replace entries of ``states``: after the
    call it holds the states the graph leaves behind.
    """
    env: dict[str, np.ndarray] = {}
    for ref in graph.inputs:
        name = ref[1:]
        if ref in inputs:
            given = inputs[ref]
        elif name in inputs:
            given = inputs[name]
        else:
            raise GraphRunError(f"input `{name}` was not given")
        vt = graph.values[ref]
        arr = np.asarray(given)
        if tuple(arr.shape) != tuple(vt.shape):
            raise GraphRunError(
                f"input `{name}` has shape {list(arr.shape)}, the graph expects {list(vt.shape)}"
            )
        env[ref] = arr.astype(np_dtype(vt.dtype))
    for table, what in ((graph.parameters, params), (graph.states, states)):
        for path, vt in table.items():
            if path not in what:
                raise GraphRunError(f"`{path}` was not given")
            arr = np.asarray(what[path])
            if tuple(arr.shape) != tuple(vt.shape):
                raise GraphRunError(
                    f"`{path}` has shape {list(arr.shape)}, the graph expects {list(vt.shape)}"
                )
            what[path] = arr.astype(np_dtype(vt.dtype), copy=False)

    def read(ref: str) -> np.ndarray:
        if ref.startswith("@"):
            path = ref[1:]
            if path in graph.states:
                return states[path]
            if path in graph.parameters:
                return params[path]
            raise GraphRunError(f"`{ref}` is neither a parameter nor a state of the graph")
        if ref not in env:
            raise GraphRunError(f"`{ref}` is read before it is defined")
        return env[ref]

    for i, step in enumerate(graph.steps):
        try:
            xs = [read(o) for o in step.operands]
            if step.op in STATE_RULES:
                _scatter(step, xs, states)
                continue
            rule = REFERENCE_RULES.get(step.op)
            if rule is None:
                raise GraphRunError(f"no rule for primitive `{step.op}`")
            with np.errstate(all="ignore"):
                out = np.asarray(rule(xs, step.attributes, step))
            if len(step.results) != 1:
                raise GraphRunError(f"{step.op} has {len(step.results)} results")
            (res,) = step.results
            vt = graph.values.get(res)
            if vt is None:
                raise GraphRunError(f"no type for `{res}` in graph.values")
            if tuple(out.shape) != tuple(vt.shape):
                raise GraphRunError(
                    f"computed shape {list(out.shape)}, the graph declares {list(vt.shape)}"
                )
            if out.dtype != np_dtype(vt.dtype):
                raise GraphRunError(f"computed dtype {out.dtype}, the graph declares {vt.dtype}")
            env[res] = out
        except GraphRunError as exc:
            raise GraphRunError(
                f"step {i} ({step.op} {', '.join(step.operands)} -> "
                f"{', '.join(step.results)}; {step.loc}): {exc}"
            ) from None
    return [np.array(read(o)) for o in graph.outputs]


def random_arrays(table: dict, rng: np.random.Generator, scale: float = 1.0) -> dict:
    """Random values for ``graph.parameters`` (or ``graph.inputs`` types): normal floats,
    small non-negative integers, random bools."""
    out = {}
    for path, vt in table.items():
        dt = np_dtype(vt.dtype)
        if dt == np.bool_:
            out[path] = rng.random(vt.shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            out[path] = rng.integers(0, 4, size=vt.shape).astype(dt)
        else:
            out[path] = (rng.standard_normal(vt.shape) * scale).astype(dt)
    return out


def zero_states(graph: Graph) -> dict[str, np.ndarray]:
    return {path: np.zeros(vt.shape, dtype=np_dtype(vt.dtype)) for path, vt in graph.states.items()}
