"""One vector-Jacobian product (VJP) rule per primitive: :data:`VJP_RULES`.

A rule takes a forward step, the cotangent ``g`` of its result (a value of the result's shape
and dtype), a :class:`Tape` that appends backward steps to the graph, and ``needs``: which
operands want a gradient. It returns one entry per operand: the gradient's value (of that
operand's shape and dtype) or None. Every primitive has a rule (``tests/test_coverage.py``);
the ones nothing flows through (comparisons, logic, ``floor``, constants, integer reads,
``scatter``) have an explicit :func:`zero` rule, so a missing rule is a gap the coverage test
finds, never a silent zero.

The rules follow PyTorch's autograd conventions at the points where a function has no
derivative, so that ``tests/test_grad_rules.py`` can compare with ``torch.autograd`` exactly:
``abs`` has gradient 0 at 0, ``maximum``/``minimum`` split the gradient in half on ties,
``reduce max``/``min`` share it evenly among the tied elements, ``pow``'s exponent gradient is
0 where the base is 0 and the exponent non-negative.

>>> sorted(VJP_RULES) == sorted(PRIMITIVES)
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from linnet.lang.ir.elementwise import SPELLINGS, Formula, formula
from linnet.lang.ir.graph import Call, Graph, Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES

FLOATS = frozenset({"f16", "bf16", "f32", "f64"})


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


class Tape:
    """Appends backward steps to ``graph`` with fresh value names; ``loc`` is the source
    line of the forward step being differentiated (generated code names it in comments).

    >>> g = Graph("e", "m", values={"%x": ValueType((2,), "f32")})
    >>> t = Tape(g)
    >>> t.emit("neg", ["%x"], (2,), "f32")
    '%t.1'
    >>> g.steps[-1].op
    'neg'
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.loc = ""
        # Temporaries go on from the forward graph's `%t.N` (emitters name them after their
        # op, `mul_3`, as they do the forward's).
        numbers = [int(v[3:]) for v in graph.values if v.startswith("%t.") and v[3:].isdigit()]
        self._n = max(numbers, default=0)
        self._constants: dict[tuple, str] = {}
        self.made: dict[str, int] = {}  # each value the backward steps made -> its step
        self.calls: list[Call] = []  # calls differentiated by their grad clause (reverse.py)

    def fresh(self, hint: str = "") -> str:
        if hint:
            name, k = f"%{hint}", 1
            while name in self.graph.values:
                k += 1
                name = f"%{hint}.{k}"
            return name
        while True:
            self._n += 1
            name = f"%t.{self._n}"
            if name not in self.graph.values:
                return name

    def emit(
        self,
        op: str,
        operands: list[str],
        shape: tuple[int, ...],
        dtype: str,
        attrs: dict[str, Any] | None = None,
        hint: str = "",
    ) -> str:
        name = self.fresh(hint)
        self.made[name] = len(self.graph.steps)
        self.graph.values[name] = ValueType(tuple(shape), dtype)
        self.graph.steps.append(Step(op, list(operands), [name], dict(attrs or {}), self.loc))
        return name

    def type(self, ref: str) -> ValueType:
        if ref.startswith("@"):
            path = ref[1:]
            return self.graph.parameters.get(path) or self.graph.states[path]
        return self.graph.values[ref]

    def shape(self, ref: str) -> tuple[int, ...]:
        return self.type(ref).shape

    def dtype(self, ref: str) -> str:
        return self.type(ref).dtype

    # ------------------------------------------------------------ building blocks
    def renamable(self, ref: str) -> bool:
        """Whether ``ref`` is a backward value that may take another name (a shared
        constant may not: later rules look it up by its name)."""
        return ref in self.made and ref not in self._constants.values()

    def forget_constants(self) -> None:
        """Make constants afresh from here on (each layer's backward its own)."""
        self._constants.clear()

    def const(self, value: float | int | bool, dtype: str) -> str:
        """A rank-0 constant (one step per value and dtype in the whole backward pass)."""
        key = (repr(value), dtype)
        if key not in self._constants:
            self._constants[key] = self.emit(
                "constant", [], (), dtype, {"value": value, "dtype": dtype}
            )
        return self._constants[key]

    def binary(self, op: str, a: str, b: str) -> str:
        shape = _broadcast_shape(self.shape(a), self.shape(b))
        dtype = "bool" if PRIMITIVES[op].bool_result else self.dtype(a)
        return self.emit(op, [a, b], shape, dtype)

    def unary(self, op: str, a: str) -> str:
        return self.emit(op, [a], self.shape(a), self.dtype(a))

    def select(self, cond: str, a: str, b: str) -> str:
        shape = _broadcast_shape(self.shape(cond), _broadcast_shape(self.shape(a), self.shape(b)))
        return self.emit("select", [cond, a, b], shape, self.dtype(a))

    def convert(self, ref: str, dtype: str) -> str:
        if self.dtype(ref) == dtype:
            return ref
        return self.emit("convert", [ref], self.shape(ref), dtype, {"dtype": dtype})

    def reshape(self, ref: str, shape: tuple[int, ...]) -> str:
        if self.shape(ref) == tuple(shape):
            return ref
        return self.emit("reshape", [ref], tuple(shape), self.dtype(ref), {"shape": list(shape)})

    def transpose(self, ref: str, perm: list[int]) -> str:
        if list(perm) == list(range(len(perm))):
            return ref
        shape = self.shape(ref)
        return self.emit(
            "transpose", [ref], tuple(shape[p] for p in perm), self.dtype(ref), {"perm": list(perm)}
        )

    def broadcast(self, ref: str, shape: tuple[int, ...]) -> str:
        if self.shape(ref) == tuple(shape):
            return ref
        return self.emit("broadcast", [ref], tuple(shape), self.dtype(ref), {"shape": list(shape)})

    def reduce_sum(self, ref: str, axes: list[int], accumulate: str | None = None) -> str:
        if not axes:
            return ref
        shape = self.shape(ref)
        dtype = self.dtype(ref)
        acc = accumulate or ("f32" if dtype in ("f16", "bf16") else dtype)
        out = tuple(d for a, d in enumerate(shape) if a not in axes)
        return self.emit(
            "reduce",
            [ref],
            out,
            acc,
            {"kind": "sum", "axes": sorted(axes), "accumulate": acc, "identity": 0.0},
        )

    def zeros(self, shape: tuple[int, ...], dtype: str) -> str:
        return self.broadcast(self.const(0.0 if is_float(dtype) else 0, dtype), shape)

    def fit(self, g: str, shape: tuple[int, ...], dtype: str) -> str:
        """``g`` summed down to ``shape`` (the transpose of elementwise broadcasting: rank 0,
        or size-1 axes) and converted to ``dtype``."""
        have = self.shape(g)
        if have != tuple(shape):
            if not shape:
                g = self.reduce_sum(g, list(range(len(have))))
            else:
                axes = [a for a, (h, s) in enumerate(zip(have, shape)) if s == 1 and h != 1]
                g = self.reshape(self.reduce_sum(g, axes), tuple(shape))
        return self.convert(g, dtype)

    def keepdims(self, ref: str, full: tuple[int, ...], axes: list[int]) -> str:
        """A reduction's result (``full`` without ``axes``) broadcast back to ``full``."""
        kept = tuple(1 if a in axes else d for a, d in enumerate(full))
        return self.broadcast(self.reshape(ref, kept), full)


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a:
        return tuple(b)
    if not b:
        return tuple(a)
    return tuple(max(x, y) if min(x, y) == 1 else x for x, y in zip(a, b))


# ---------------------------------------------------------------- rules
Rule = Callable[[Step, str, Tape, list[bool]], list[str | None]]


def zero(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    """Nothing flows back: the primitive is constant almost everywhere (comparisons, logic,
    floor), has no operands (constants, iotas) or writes a state (scatter)."""
    return [None] * len(step.operands)


def _operand(t: Tape, step: Step, k: int) -> tuple[tuple[int, ...], str]:
    ref = step.operands[k]
    return t.shape(ref), t.dtype(ref)


def _unary(derivative: Callable[[Step, str, Tape], str]) -> Rule:
    """``dx = g * f'(x)``, with ``f'`` built from the step's operand and result."""

    def rule(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
        if not needs[0]:
            return [None]
        shape, dtype = _operand(t, step, 0)
        return [t.fit(t.binary("mul", g, derivative(step, step.results[0], t)), shape, dtype)]

    return rule


def _built(f: Formula, step: Step, t: Tape) -> str:
    """The steps of a derivative formula (linnet.lang.ir.elementwise.formula), operands
    left to right; numbers are constants of the result's dtype."""
    kind = f[0]
    if kind == "ref":
        return step.results[0] if f[1] == "out" else step.operands["xy".index(f[1])]
    if kind == "const":
        return t.const(f[1], t.dtype(step.results[0]))
    if kind == "neg":
        return t.unary("neg", _built(f[1], step, t))
    if kind == "call":
        args = [_built(a, step, t) for a in f[2]]
        return t.unary(f[1], args[0]) if len(args) == 1 else t.binary(f[1], *args)
    return t.binary(f[1], _built(f[2], step, t), _built(f[3], step, t))


def _spelled(derivative: tuple[str, ...]) -> Rule:
    """``d_k = g * df/d(operand k)`` from the ``derivative`` column of
    linnet.lang.ir.elementwise, for each operand that wants one; nothing for integers."""
    formulas = [formula(d) for d in derivative]

    def rule(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
        out: list[str | None] = [None] * len(step.operands)
        if not is_float(t.dtype(step.results[0])):
            return out
        for k, f in enumerate(formulas):
            if needs[k]:
                d = t.binary("mul", g, _built(f, step, t))
                out[k] = t.fit(d, *_operand(t, step, k))
        return out

    return rule


def _neg(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    return [t.unary("neg", g) if needs[0] else None]


def _d_rsqrt(s: Step, y: str, t: Tape) -> str:  # -x^(-3/2) / 2, as torch: -0.5 * y**3
    cube = t.binary("mul", t.binary("mul", y, y), y)
    return t.binary("mul", t.const(-0.5, t.dtype(y)), cube)


def _d_erf(s: Step, y: str, t: Tape) -> str:  # 2 / sqrt(pi) * exp(-x^2)
    x = s.operands[0]
    e = t.unary("exp", t.unary("neg", t.binary("mul", x, x)))
    return t.binary("mul", t.const(2.0 / math.sqrt(math.pi), t.dtype(y)), e)


def _d_abs(s: Step, y: str, t: Tape) -> str:  # sign(x), 0 at 0 (torch's sgn)
    x = s.operands[0]
    dt = t.dtype(x)
    zero_ = t.const(0.0, dt)
    neg = t.select(t.binary("lt", x, zero_), t.const(-1.0, dt), zero_)
    return t.select(t.binary("gt", x, zero_), t.const(1.0, dt), neg)


def _abs(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    if not is_float(t.dtype(step.operands[0])):
        return [None]
    return _unary(_d_abs)(step, g, t, needs)


def _add(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    return [t.fit(g, *_operand(t, step, k)) if needs[k] else None for k in range(2)]


def _sub(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    out: list[str | None] = [t.fit(g, *_operand(t, step, 0)) if needs[0] else None, None]
    if needs[1]:
        out[1] = t.fit(t.unary("neg", g), *_operand(t, step, 1))
    return out


def _mul(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    x, y = step.operands
    return [
        t.fit(t.binary("mul", g, y), *_operand(t, step, 0)) if needs[0] else None,
        t.fit(t.binary("mul", g, x), *_operand(t, step, 1)) if needs[1] else None,
    ]


def _div(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    x, y = step.operands
    if not is_float(t.dtype(x)):
        return [None, None]
    out: list[str | None] = [None, None]
    if needs[0]:
        out[0] = t.fit(t.binary("div", g, y), *_operand(t, step, 0))
    if needs[1]:  # -g * x / y^2, as torch
        num = t.unary("neg", t.binary("mul", g, x))
        out[1] = t.fit(t.binary("div", num, t.binary("mul", y, y)), *_operand(t, step, 1))
    return out


def _rem(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    x, y = step.operands
    if not is_float(t.dtype(x)):
        return [None, None]
    out: list[str | None] = [t.fit(g, *_operand(t, step, 0)) if needs[0] else None, None]
    if needs[1]:  # x - floor(x / y) * y: -g * floor(x / y), as torch
        q = t.unary("floor", t.binary("div", x, y))
        out[1] = t.fit(t.unary("neg", t.binary("mul", g, q)), *_operand(t, step, 1))
    return out


def _pow(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    x, y = step.operands
    dt = t.dtype(x)
    if not is_float(dt):
        return [None, None]
    zero_ = t.const(0.0, dt)
    out: list[str | None] = [None, None]
    if needs[0]:  # y * x^(y-1), and 0 where y == 0 (torch)
        d = t.binary("mul", y, t.binary("pow", x, t.binary("sub", y, t.const(1.0, dt))))
        d = t.select(t.binary("eq", y, zero_), zero_, d)
        out[0] = t.fit(t.binary("mul", g, d), *_operand(t, step, 0))
    if needs[1]:  # x^y log x, and 0 where x == 0 and y >= 0 (torch)
        d = t.binary("mul", step.results[0], t.unary("log", x))
        at0 = t.binary("and", t.binary("eq", x, zero_), t.binary("ge", y, zero_))
        d = t.select(at0, zero_, d)
        out[1] = t.fit(t.binary("mul", g, d), *_operand(t, step, 1))
    return out


def _extreme(winner: str) -> Rule:
    """maximum (winner ``gt``) and minimum (``lt``): the gradient goes to the operand that
    won, halved on ties (torch)."""

    def rule(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
        x, y = step.operands
        dt = t.dtype(x)
        if not is_float(dt):
            return [None, None]
        tie = t.select(t.binary("eq", x, y), t.const(0.5, dt), t.const(0.0, dt))
        w = t.select(t.binary(winner, x, y), t.const(1.0, dt), tie)
        out: list[str | None] = [None, None]
        if needs[0]:
            out[0] = t.fit(t.binary("mul", g, w), *_operand(t, step, 0))
        if needs[1]:
            out[1] = t.fit(
                t.binary("mul", g, t.binary("sub", t.const(1.0, dt), w)), *_operand(t, step, 1)
            )
        return out

    return rule


def _select(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    cond = step.operands[0]
    zero_ = t.const(0.0, t.dtype(g))
    out: list[str | None] = [None, None, None]
    if needs[1]:
        out[1] = t.fit(t.select(cond, g, zero_), *_operand(t, step, 1))
    if needs[2]:
        out[2] = t.fit(t.select(cond, zero_, g), *_operand(t, step, 2))
    return out


def _convert(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    if not needs[0] or not is_float(t.dtype(g)):
        return [None]  # a float converted to an integer or bool: constant almost everywhere
    return [t.convert(g, t.dtype(step.operands[0]))]


def _reshape(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    return [t.reshape(g, t.shape(step.operands[0])) if needs[0] else None]


def _transpose(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    perm = step.attributes["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [t.transpose(g, inverse) if needs[0] else None]


def _broadcast(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    return [t.fit(g, *_operand(t, step, 0)) if needs[0] else None]


def _slice(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    """The transpose of a static slice: ``g`` placed into zeros of the operand's shape at
    the sliced range. The positions are one iota per axis up to the last sliced one, shifted
    by its start (``scatter_add``; every position is inside, and none coincide), so the axes
    after it are whole and ``g`` is the scatter's value as it is."""
    x = step.operands[0]
    shape, dtype = t.shape(x), t.dtype(x)
    starts, limits = list(step.attributes["starts"]), list(step.attributes["limits"])
    if not needs[0]:
        return [None]
    cut = [a for a, (lo, hi) in enumerate(zip(starts, limits)) if (lo, hi) != (0, shape[a])]
    if not cut:
        return [g]
    k = cut[-1] + 1
    indices = []
    for a in range(k):
        view = [1] * k
        view[a] = limits[a] - starts[a]
        i = t.emit("iota", [], tuple(view), "i64", {"shape": view, "axis": a, "dtype": "i64"})
        indices.append(t.binary("add", i, t.const(starts[a], "i64")) if starts[a] else i)
    return [
        t.emit(
            "scatter_add",
            [t.zeros(shape, dtype), g, *indices],
            shape,
            dtype,
            {"indexed_axes": k, "bounds": "unchecked"},
        )
    ]


def _reduce(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    x = step.operands[0]
    shape, dtype = t.shape(x), t.dtype(x)
    if not needs[0] or not is_float(dtype):
        return [None]
    kind, axes = step.attributes["kind"], list(step.attributes["axes"])
    gdt = t.dtype(g)
    if kind in ("sum", "mean"):
        out = t.keepdims(g, shape, axes)
        if kind == "mean":
            count = math.prod(shape[a] for a in axes)
            out = t.binary("div", out, t.const(float(count), gdt))
        return [t.convert(out, dtype)]
    if kind in ("max", "min"):  # shared evenly among the elements equal to the extreme
        hit = t.binary("eq", x, t.keepdims(step.results[0], shape, axes))
        mask = t.convert(hit, dtype)
        count = t.keepdims(t.reduce_sum(mask, axes, dtype), shape, axes)
        share = t.binary("div", t.keepdims(g, shape, axes), count)
        return [t.binary("mul", share, mask)]
    return [_prod(step, g, t)]


def _prod(step: Step, g: str, t: Tape) -> str:
    """The product of the other elements for each element, without dividing by it (exact
    where elements are 0): the reduced axes flattened to one of size n, an n x n copy with
    the diagonal set to 1, and its product over the last axis."""
    x = step.operands[0]
    shape, dtype = t.shape(x), t.dtype(x)
    axes = list(step.attributes["axes"])
    acc = step.attributes["accumulate"]
    rest = [a for a in range(len(shape)) if a not in axes]
    kept = tuple(shape[a] for a in rest)
    n = math.prod(shape[a] for a in axes)
    perm = rest + axes
    flat = t.reshape(t.convert(t.transpose(x, perm), acc), (*kept, n))
    square = t.broadcast(t.reshape(flat, (*kept, 1, n)), (*kept, n, n))
    rows = t.emit("iota", [], (n, n), "i64", {"shape": [n, n], "axis": 0, "dtype": "i64"})
    cols = t.emit("iota", [], (n, n), "i64", {"shape": [n, n], "axis": 1, "dtype": "i64"})
    eye = t.reshape(t.binary("eq", rows, cols), (1,) * len(kept) + (n, n))
    others = t.select(eye, t.const(1.0, acc), square)
    others = t.emit(
        "reduce",
        [others],
        (*kept, n),
        acc,
        {"kind": "prod", "axes": [len(kept) + 1], "accumulate": acc, "identity": 1.0},
    )
    d = t.binary("mul", others, t.reshape(g, (*kept, 1)))
    d = t.reshape(d, (*kept, *(shape[a] for a in axes)))
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return t.convert(t.transpose(d, inverse), dtype)


def _contract(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    spec = step.attributes["spec"]
    acc = step.attributes["accumulate"]
    ins, out_letters = spec.split("->")
    letters = ins.split(",")
    results: list[str | None] = [None, None]
    for k in range(2):
        if not needs[k] or not is_float(t.dtype(step.operands[k])):
            continue
        mine, other = letters[k], letters[1 - k]
        shape, dtype = _operand(t, step, k)
        # Letters of this operand that the product's other factors carry; the rest were
        # summed in this operand alone, and its gradient is broadcast along them.
        reach = [c for c in mine if c in out_letters or c in other]
        partner = t.convert(step.operands[1 - k], acc)
        sizes = dict(zip(mine, shape))
        d = t.emit(
            "contract",
            [g, partner],
            tuple(sizes[c] for c in reach),
            acc,
            {"spec": f"{out_letters},{other}->{''.join(reach)}", "accumulate": acc},
        )
        if len(reach) != len(mine):
            d = t.broadcast(t.reshape(d, tuple(sizes[c] if c in reach else 1 for c in mine)), shape)
        results[k] = t.convert(d, dtype)
    return results


def _take(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    x, idx = step.operands
    shape, dtype = t.shape(x), t.dtype(x)
    if not needs[0] or not is_float(dtype):
        return [None, None]
    axis = step.attributes["axis"]
    r = len(t.shape(idx))
    rank = len(shape)
    # The index's axes of g first: take along axis 0 of x with that axis moved to the front.
    perm_g = list(range(axis, axis + r)) + list(range(axis)) + list(range(axis + r, rank - 1 + r))
    front = t.transpose(g, perm_g)
    moved = (shape[axis], *shape[:axis], *shape[axis + 1 :])
    d = t.emit(
        "scatter_add",
        [t.zeros(moved, dtype), front, idx],
        moved,
        dtype,
        {"indexed_axes": 1, "bounds": step.attributes["bounds"]},
    )
    back = [j + 1 if j < axis else (0 if j == axis else j) for j in range(rank)]
    return [t.transpose(d, back), None]


def _gather(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    x, *indices = step.operands
    shape, dtype = t.shape(x), t.dtype(x)
    if not needs[0] or not is_float(dtype):
        return [None] * len(step.operands)
    d = t.emit(
        "scatter_add",
        [t.zeros(shape, dtype), g, *indices],
        shape,
        dtype,
        {"indexed_axes": step.attributes["indexed_axes"], "bounds": step.attributes["bounds"]},
    )
    return [d] + [None] * len(indices)


def _scatter_add(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    _x, value, *indices = step.operands
    out: list[str | None] = [g if needs[0] else None] + [None] * (len(indices) + 1)
    if needs[1]:
        if indices:
            out[1] = t.emit(
                "gather",
                [g, *indices],
                t.shape(value),
                t.dtype(value),
                {"indexed_axes": len(indices), "bounds": step.attributes["bounds"]},
            )
        else:
            out[1] = t.fit(g, t.shape(value), t.dtype(value))
    return out


def _float_only(rule: Rule) -> Rule:
    def wrapped(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
        if not is_float(t.dtype(step.results[0])):
            return [None] * len(step.operands)
        return rule(step, g, t, needs)

    return wrapped


def _one_process(step: Step, g: str, t: Tape, needs: list[bool]) -> list[str | None]:
    from linnet.lang.passes.shard import one_process

    raise one_process(step, "the reverse pass")


VJP_RULES: dict[str, Rule] = {
    # The elementwise math of linnet.lang.ir.elementwise: from its derivative column, and
    # zero where the primitive is not differentiable (comparisons, logic, floor).
    **{name: _spelled(row.derivative) for name, row in SPELLINGS.items() if row.derivative},
    **{name: zero for name, row in SPELLINGS.items() if not row.primitive.differentiable},
    "neg": _float_only(_neg),
    "rsqrt": _unary(_d_rsqrt),
    "erf": _unary(_d_erf),
    "abs": _abs,
    "add": _float_only(_add),
    "sub": _float_only(_sub),
    "mul": _float_only(_mul),
    "div": _div,
    "rem": _rem,
    "pow": _pow,
    "maximum": _extreme("gt"),
    "minimum": _extreme("lt"),
    "select": _float_only(_select),
    "convert": _convert,
    # The bits of a float read as an integer (or back) are no differentiable function of it.
    "bitcast": zero,
    "constant": zero,
    "iota": zero,
    "reshape": _float_only(_reshape),
    "transpose": _float_only(_transpose),
    "broadcast": _float_only(_broadcast),
    "slice": _float_only(_slice),
    "reduce": _reduce,
    "contract": _contract,
    "take": _take,
    "gather": _gather,
    "scatter_add": _float_only(_scatter_add),
    "scatter": zero,  # a state write: gradients never flow through states (E0953)
    # A rank's graph (linnet.lang.passes.shard): the reverse pass differentiates one process's
    # graph; the transpose of a collective needs the other ranks' cotangents (E0963).
    "all_reduce": _one_process,
    "all_gather": _one_process,
}
"""One VJP rule per primitive (``tests/test_coverage.py`` checks it covers
:data:`~linnet.lang.ir.primitives.PRIMITIVES`): ``rule(step, g, tape, needs)``."""
