"""Which values of an entry's integer inputs are valid indices: one pass over a graph.

A token id indexes the embedding's rows, a position the KV cache's axis: an input outside
that range reads or writes outside a tensor (an IndexError on the CPU, a device assert that
kills the process on CUDA, or, for negative values, a silent Python-style wrap-around).
:func:`input_bounds` finds, once per lowered graph, the range ``[lo, hi)`` of every entry
input that reaches an index, so that a runtime checks inputs against it before it launches
anything. It also finds indices that are out of range whatever the inputs are (a prompt of
L tokens written into a cache of S < L positions): :attr:`Bounds.static`.

The analysis is an abstract interpretation of the integer steps: every value is tracked as
lying between two ends ``low(x) <= v <= high(x)``, monotone functions of one input element
``x`` (or a known interval). That covers what indices are made of (iota, constants,
reshapes, broadcasts, conversions, ``+``, ``-``, ``*`` and ``/`` by a constant,
``min``/``max`` with a constant), and the valid inputs are found exactly by bisection over
the input's dtype. An input that reaches an index through anything else (``pos * pos``,
``pos % 4``, a value read from a parameter at ``pos``) is listed in
:attr:`Bounds.unanalysed`: no range is derived for it.

Indices with ``bounds = zero`` read zero outside their axis (they are never out of range);
``unchecked`` gathers and every scatter index must be in range.

>>> from linnet.lang import Program, lower
>>> prog = Program.from_text('''
... model M<S: Dim> {
...     state cache: Tensor[S; f32]
...     entry put(x: Tensor[1; f32], pos: Tensor[1; i32]) -> Tensor[1; f32] {
...         self.cache[pos[0]] = x[0]
...         return x
...     }
... }''')
>>> b = input_bounds(lower(prog, "put", {"x": [1], "pos": [1]}, {"S": 8}))
>>> r = b.inputs["%pos"]
>>> (r.lo, r.hi)
(0, 8)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.ir.edges import INT_RANGES
from linnet.lang.ir.graph import Graph, Step
from linnet.lang.ir.primitives import PRIMITIVES, Category, in_category

INTS = {"i8", "i16", "i32", "i64", "u8"}


@dataclass(frozen=True)
class Use:
    """One index that an input (or a constant) reaches: step ``step`` indexes ``axis`` of
    ``target`` (a state or parameter path, or an SSA value), of size ``size``."""

    step: int
    op: str
    target: str
    axis: int
    size: int
    loc: str = ""

    def describe(self, graph: Graph | None = None) -> str:
        """What this index reaches into, for messages.

        >>> Use(0, "take", "@t", 0, 8).describe(Graph("e", "m", dims={"V": 8}))
        'axis 0 (size 8 = V) of parameter `t`'
        """
        kind = "tensor"
        if self.target.startswith("@"):
            path = self.target[1:]
            kind = "state" if graph is not None and path in graph.states else "parameter"
            name = path
        else:
            name = self.target.lstrip("%")
        names = dim_names(graph, self.size)
        size = f"size {self.size}" + (
            f" = {names[0]}" if len(names) == 1 else f": {' or '.join(names)}" if names else ""
        )
        loc = user_loc(graph, self.step, self.loc) if graph is not None else self.loc
        where = f" at {loc}" if loc else ""
        return f"axis {self.axis} ({size}) of {kind} `{name}`{where}"


def user_loc(graph: Graph, step: int, loc: str) -> str:
    """``file:line`` of the user's model behind ``step`` (std library lines are inside a
    call from it), with the file's name only.

    >>> user_loc(Graph("e", "m"), 0, "/home/me/models/llama.linnet:54")
    'llama.linnet:54'
    """
    if loc.startswith("std/"):
        best = None
        for call in graph.calls:
            if (
                call.start <= step < call.stop
                and call.loc
                and not call.loc.startswith("std/")
                and call.kind != "entry"
                and (best is None or call.depth > best.depth)
            ):
                best = call
        loc = best.loc if best is not None else loc
    file, _, line = loc.rpartition(":")
    if not file or file.startswith("std/"):
        return loc
    return f"{file.rsplit('/', 1)[-1]}:{line}"


@dataclass(frozen=True)
class InputRange:
    """The values of entry input ``input`` that every index it reaches accepts:
    ``lo <= value < hi``. ``lower`` and ``upper`` are the uses that set each end."""

    input: str
    lo: int
    hi: int
    lower: Use
    upper: Use

    @property
    def empty(self) -> bool:
        return self.lo >= self.hi

    def text(self) -> str:
        """``in [0, 128)``, or one end where the other is unbounded (``at least 0``)."""
        if self.lo <= _MIN:
            return f"below {self.hi}"
        if self.hi >= _MAX:
            return f"at least {self.lo}"
        return f"in [{self.lo}, {self.hi})"


@dataclass(frozen=True)
class StaticViolation:
    """An index that is out of range whatever the inputs are: its values span
    ``[lo, hi]`` (inclusive) but the axis has ``use.size`` entries."""

    use: Use
    lo: int
    hi: int

    def message(self, graph: Graph) -> str:
        """One line: the step, what it indexes, the values and the valid ones."""
        return (
            f"step {self.use.step} ({self.use.op}) indexes {self.use.describe(graph)} "
            f"with values {self.lo}..{self.hi}, outside 0..{self.use.size - 1}"
        )


@dataclass
class Bounds:
    """What :func:`input_bounds` found for one graph."""

    inputs: dict[str, InputRange] = field(default_factory=dict)
    static: list[StaticViolation] = field(default_factory=list)
    unanalysed: dict[str, list[Use]] = field(default_factory=dict)
    # Every integer value whose elements lie in a known interval (lo, hi), whatever the
    # inputs are: what the emitters read to leave out an index guard that cannot fire.
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)


# ---------------------------------------------------------------- the abstract values
Fn = Callable[[int], int]
_MAX_DEPTH = 200


def _identity(x: int) -> int:
    return x


def _constant(v: int) -> Fn:
    return lambda x: v


@dataclass(frozen=True)
class Term:
    """A value whose elements lie in ``[low(x), high(x)]``, ``x`` an element of entry input
    ``input``. Both ends are monotone in x: non-decreasing (``direction`` 1) or
    non-increasing (-1); ``direction`` 0: a known interval, ``input`` None."""

    input: str | None
    direction: int
    low: Fn
    high: Fn
    depth: int = 0  # how many operations the ends compose (bounded: see _term)

    @staticmethod
    def const(lo: int, hi: int | None = None) -> Term:
        return Term(None, 0, _constant(lo), _constant(lo if hi is None else hi))

    @staticmethod
    def of_input(name: str) -> Term:
        return Term(name, 1, _identity, _identity)

    @property
    def known(self) -> bool:
        return self.direction == 0

    def interval(self) -> tuple[int, int]:
        """The value's range (known terms only)."""
        return self.low(0), self.high(0)

    def shifted(self, lo: int, hi: int) -> Term | Opaque:
        if self.known:
            a, b = self.interval()
            return Term.const(a + lo, b + hi)
        low, high = self.low, self.high
        return self._derived(self.direction, lambda x: low(x) + lo, lambda x: high(x) + hi)

    def scaled(self, k: int) -> Term | Opaque:
        if self.known or k == 0:
            a, b = self.interval() if self.known else (0, 0)
            return Term.const(min(a * k, b * k), max(a * k, b * k))
        low, high = self.low, self.high
        if k > 0:
            return self._derived(self.direction, lambda x: low(x) * k, lambda x: high(x) * k)
        return self._derived(-self.direction, lambda x: high(x) * k, lambda x: low(x) * k)

    def clamped(self, m: int, op: str) -> Term | Opaque:
        f = max if op == "maximum" else min
        if self.known:
            a, b = self.interval()
            return Term.const(f(a, m), f(b, m))
        low, high = self.low, self.high
        return self._derived(self.direction, lambda x: f(low(x), m), lambda x: f(high(x), m))

    def divided(self, k: int) -> Term | Opaque:
        """Floor division by ``k > 0`` (integer ``/`` in Linnet rounds toward -inf)."""
        if self.known:
            a, b = self.interval()
            return Term.const(a // k, b // k)
        low, high = self.low, self.high
        return self._derived(self.direction, lambda x: low(x) // k, lambda x: high(x) // k)

    def _derived(self, direction: int, low: Fn, high: Fn) -> Term | Opaque:
        # The ends are nested closures: past a few hundred operations (no index is made so),
        # stop following rather than recurse that deep when they are evaluated.
        if self.depth >= _MAX_DEPTH:
            assert self.input is not None
            return Opaque(frozenset({self.input}))
        return Term(self.input, direction, low, high, self.depth + 1)


@dataclass(frozen=True)
class Opaque:
    """A value that depends on ``inputs`` in a way the analysis does not follow; ``range``:
    an interval ``(lo, hi)`` every element lies in whatever the inputs are, where one is
    known (``pos % 4`` lies in ``(0, 3)``; ``inputs`` may then be empty)."""

    inputs: frozenset[str]
    range: tuple[int, int] | None = None


Abstract = Term | Opaque | None  # None: a value that no input reaches and nothing is known of


def _deps(v: Abstract) -> frozenset[str]:
    if isinstance(v, Opaque):
        return v.inputs
    if isinstance(v, Term) and not v.known and v.input is not None:
        return frozenset({v.input})
    return frozenset()


def _opaque(*values: Abstract) -> Abstract:
    deps: frozenset[str] = frozenset()
    for v in values:
        deps |= _deps(v)
    return Opaque(deps) if deps else None


def _const_value(v: Abstract) -> int | None:
    if isinstance(v, Term) and v.known:
        lo, hi = v.interval()
        if lo == hi:
            return lo
    return None


def _add(a: Abstract, b: Abstract, sign: int) -> Abstract:  # a + b, or a - b
    if not isinstance(a, Term) or not isinstance(b, Term):
        return _opaque(a, b)
    if b.known:
        lo, hi = b.interval()
        return a.shifted(lo, hi) if sign > 0 else a.shifted(-hi, -lo)
    if a.known:
        lo, hi = a.interval()
        negated = b if sign > 0 else b.scaled(-1)
        return negated.shifted(lo, hi) if isinstance(negated, Term) else negated
    return _opaque(a, b)


def _mul(a: Abstract, b: Abstract) -> Abstract:
    if not isinstance(a, Term) or not isinstance(b, Term):
        return _opaque(a, b)
    if a.known and b.known:
        (alo, ahi), (blo, bhi) = a.interval(), b.interval()
        corners = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
        return Term.const(min(corners), max(corners))
    ka, kb = _const_value(a), _const_value(b)
    if kb is not None:
        return a.scaled(kb)
    if ka is not None:
        return b.scaled(ka)
    return _opaque(a, b)


def _extreme(a: Abstract, b: Abstract, op: str) -> Abstract:
    if not isinstance(a, Term) or not isinstance(b, Term):
        return _opaque(a, b)
    if a.known and b.known:
        (alo, ahi), (blo, bhi) = a.interval(), b.interval()
        if op == "maximum":
            return Term.const(max(alo, blo), max(ahi, bhi))
        return Term.const(min(alo, blo), min(ahi, bhi))
    term, other = (a, b) if b.known else (b, a)
    k = _const_value(other)
    if not other.known or k is None:
        return _opaque(a, b)
    return term.clamped(k, op)


def _floordiv(a: Abstract, b: Abstract) -> Abstract:
    k = _const_value(b)
    if isinstance(a, Term) and k is not None and k > 0:
        return a.divided(k)
    return _opaque(a, b)


def _rem(a: Abstract, b: Abstract) -> Abstract:
    k = _const_value(b)
    if isinstance(a, Term) and a.known and k is not None and k > 0:
        lo, hi = a.interval()
        return Term.const(lo, hi) if lo >= 0 and hi < k else Term.const(0, k - 1)
    return _opaque(a, b)


def _first(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The least x in [lo, hi] with pred(x), for pred false then true (None: never true)."""
    if not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _solve(t: Term, n: int, xmin: int, xmax: int) -> tuple[int | None, int | None, bool]:
    """The inputs x in ``[xmin, xmax]`` with ``0 <= low(x)`` and ``high(x) <= n - 1``:
    ``(xlo, xhi, never)``, inclusive ends, None where the dtype's own end is the bound;
    ``never`` when no x is valid. Both ends are monotone: each condition holds on a half
    line, found by bisection (exact, whatever the composition of the ends)."""
    low, high = t.low, t.high
    if t.direction > 0:
        a = _first(lambda x: low(x) >= 0, xmin, xmax)  # [a, xmax]
        c = _first(lambda x: high(x) > n - 1, xmin, xmax)  # [xmin, c - 1]
        xlo, xhi = a, (xmax if c is None else c - 1)
    else:
        a = _first(lambda x: low(x) < 0, xmin, xmax)  # [xmin, a - 1]
        c = _first(lambda x: high(x) <= n - 1, xmin, xmax)  # [c, xmax]
        xlo, xhi = c, (xmax if a is None else a - 1)
    if xlo is None or xhi < xlo:
        return None, None, True
    return (None if xlo == xmin else xlo), (None if xhi == xmax else xhi), False


_DTYPE_RANGES = {
    "i8": (-(2**7), 2**7 - 1),
    "i16": (-(2**15), 2**15 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u8": (0, 255),
}


# ---------------------------------------------------------------- the analysis
def input_bounds(graph: Graph) -> Bounds:
    """The valid range of every entry input of ``graph`` that reaches an index, and the
    indices that are out of range for any input (see the module docstring).

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<V: Dim> {
    ...     param table: Tensor[V, 2; f32]
    ...     entry look(ids: Tensor[3; i32]) -> Tensor[3, 2; f32] {
    ...         let out[i, d] = self.table[ids[i] + 1, d]
    ...         return out
    ...     }
    ... }''')
    >>> b = input_bounds(lower(prog, "look", {"ids": [3]}, {"V": 10}))
    >>> (b.inputs["%ids"].lo, b.inputs["%ids"].hi)
    (-1, 9)
    """
    env: dict[str, Abstract] = {}
    for name in graph.inputs:
        vt = graph.values.get(name)
        env[name] = (
            Term.of_input(name)
            if vt is not None and vt.dtype in INTS
            else Opaque(frozenset({name}))
        )
    out = Bounds()
    lows: dict[str, tuple[int, Use]] = {}
    highs: dict[str, tuple[int, Use]] = {}

    def use(index: Abstract, u: Use) -> None:
        if u.size <= 0:
            return
        if isinstance(index, Opaque):
            for name in sorted(index.inputs):
                out.unanalysed.setdefault(name, []).append(u)
            return
        if not isinstance(index, Term):
            return
        if index.known:
            lo, hi = index.interval()
            if lo < 0 or hi >= u.size:
                out.static.append(StaticViolation(u, lo, hi))
            return
        assert index.input is not None
        vt = graph.values.get(index.input)
        xmin, xmax = _DTYPE_RANGES.get(vt.dtype if vt else "i64", _DTYPE_RANGES["i64"])
        xlo, xhi, never = _solve(index, u.size, xmin, xmax)
        name = index.input
        if never:
            xlo, xhi = 0, -1
        if xlo is not None and (name not in lows or xlo > lows[name][0]):
            lows[name] = (xlo, u)
        if xhi is not None and (name not in highs or xhi + 1 < highs[name][0]):
            highs[name] = (xhi + 1, u)

    for i, step in enumerate(graph.steps):
        args = [env.get(o) for o in step.operands]
        rule = BOUNDS_RULES[step.op]
        for ix, axis in rule.indices(step):
            data = step.operands[0]
            shape = _shape(graph, data)
            if axis < len(shape):
                use(env.get(ix), Use(i, step.op, data, axis, shape[axis], step.loc))
        if not step.results:
            continue
        vt = graph.values.get(step.results[0])
        if vt is None or vt.dtype not in INTS | {"bool"}:
            # Floats: only their dependence on inputs is kept (an index computed from a
            # float is not followed).
            env[step.results[0]] = _opaque(*args)
        else:
            value = env[step.results[0]] = rule.value(step, args, graph)
            known = interval(value)
            if known is not None and vt.dtype in INTS:
                out.ranges[step.results[0]] = known

    for name in set(lows) | set(highs):
        lo, lower = lows.get(name, (_MIN, None))
        hi, upper = highs.get(name, (_MAX, None))
        first = lower or upper
        assert first is not None
        out.inputs[name] = InputRange(name, lo, hi, lower or first, upper or first)
    return out


_MIN, _MAX = -(2**63), 2**63


# ---------------------------------------------------------------- the rules
ValueRule = Callable[[Step, list[Abstract], Graph], Abstract]
IndexRule = Callable[[Step], list[tuple[str, int]]]


def _no_indices(step: Step) -> list[tuple[str, int]]:
    return []


class BoundsRule(NamedTuple):
    """A primitive's part in the analysis: ``value`` makes its result's abstract value from
    its operands'; ``indices`` lists the ``(operand, axis)`` pairs it indexes its first
    operand with, which must be in range (checked against the inputs, or statically)."""

    value: ValueRule
    indices: IndexRule = _no_indices


def interval(v: Abstract) -> tuple[int, int] | None:
    """The interval ``(lo, hi)`` every element of an abstract value lies in, where it is
    known whatever the inputs are (None: not known).

    >>> interval(Term.const(0, 7)), interval(Opaque(frozenset({"%pos"}), (0, 3)))
    ((0, 7), (0, 3))
    """
    if isinstance(v, Term):
        return v.interval() if v.known else None
    return v.range if isinstance(v, Opaque) else None


def _ranged(v: Abstract, r: tuple[int, int] | None) -> Abstract:
    """``v``, with the interval ``r`` its elements lie in where ``v`` itself is not known."""
    if r is None or isinstance(v, Term):
        return v
    return Opaque(v.inputs if isinstance(v, Opaque) else frozenset(), r)


def _dependence(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    """A step the analysis does not follow: only which inputs it depends on is kept."""
    return _opaque(*args)


def _iota(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    attrs = step.attributes
    return Term.const(0, attrs["shape"][attrs["axis"]] - 1)


def _constant_rule(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    value = step.attributes.get("value")
    if isinstance(value, bool | int):
        return Term.const(int(value))
    if isinstance(value, float) and value.is_integer():
        return Term.const(int(value))
    return None


def _same_elements(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    """Reshapes, broadcasts, transposes and slices move elements, never change them."""
    return args[0]


def _convert(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    src = graph.values.get(step.operands[0])
    if src is not None and (src.dtype in INTS or src.dtype == "bool"):
        return args[0]
    return _opaque(*args)


def _bitcast(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    """The operand's bits read as another type: nothing of its range carries over. An
    integer result lies in its type's range (a u8 in 0..255); its dependence is kept."""
    deps = _deps(args[0])
    r = INT_RANGES.get(step.attributes.get("dtype", ""))
    if r is None:
        return _opaque(*args)
    return Opaque(deps, r)


def _truth(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    """Comparisons and logic: 0 or 1."""
    return _opaque(*args) or Term.const(0, 1)


def _neg(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    return args[0].scaled(-1) if isinstance(args[0], Term) else _opaque(*args)


def _add_rule(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    sign = 1 if step.op == "add" else -1
    out = _add(args[0], args[1], sign)
    a, b = interval(args[0]), interval(args[1])
    if isinstance(out, Term) or a is None or b is None:
        return out
    return _ranged(out, (a[0] + b[0], a[1] + b[1]) if sign > 0 else (a[0] - b[1], a[1] - b[0]))


def _mul_rule(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    return _mul(args[0], args[1])


def _extreme_rule(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    out = _extreme(args[0], args[1], step.op)
    a, b = interval(args[0]), interval(args[1])
    if isinstance(out, Term) or a is None or b is None:
        return out
    f = max if step.op == "maximum" else min
    return _ranged(out, (f(a[0], b[0]), f(a[1], b[1])))


def _div_rule(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    return _floordiv(args[0], args[1])


def _rem_rule(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    out = _rem(args[0], args[1])
    k = interval(args[1])
    if isinstance(out, Term) or k is None or k[0] != k[1] or k[0] <= 0:
        return out
    # `%` takes the divisor's sign (Python's and torch's remainder): in [0, k) for k > 0,
    # whatever the dividend is.
    return _ranged(out, (0, k[0] - 1))


def _read_rule(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    return _read(step, args, graph)


def _take_index(step: Step) -> list[tuple[str, int]]:
    """An unchecked take's index (under ``bounds = zero`` it reads 0 outside: never wrong)."""
    if step.attributes.get("bounds") == "zero":
        return []
    return [(step.operands[1], step.attributes.get("axis", 0))]


def _gather_indices(step: Step) -> list[tuple[str, int]]:
    if step.attributes.get("bounds") == "zero":
        return []
    return [(ix, axis) for axis, ix in enumerate(step.operands[1:])]


def _scatter_indices(step: Step) -> list[tuple[str, int]]:
    """Every position a state write indexes (operands ``@state, value, i0, ...``)."""
    return [(ix, axis) for axis, ix in enumerate(step.operands[2:])]


_VALUES: dict[str, ValueRule] = {
    # By default a step's elements are not followed, only its dependence on the inputs (a
    # float op, a reduction, a collective): a new primitive is analysed soundly unless a
    # rule here says more.
    **{name: _dependence for name in PRIMITIVES},
    **{name: _truth for name, p in PRIMITIVES.items() if p.bool_result},
    "iota": _iota,
    "constant": _constant_rule,
    **{name: _same_elements for name in in_category(Category.SHAPE)},
    "convert": _convert,
    "bitcast": _bitcast,
    "neg": _neg,
    "add": _add_rule,
    "sub": _add_rule,
    "mul": _mul_rule,
    "maximum": _extreme_rule,
    "minimum": _extreme_rule,
    "div": _div_rule,
    "rem": _rem_rule,
    "take": _read_rule,
    "gather": _read_rule,
}
_INDICES: dict[str, IndexRule] = {
    "take": _take_index,
    "gather": _gather_indices,
    "scatter": _scatter_indices,
}

BOUNDS_RULES: dict[str, BoundsRule] = {
    name: BoundsRule(_VALUES[name], _INDICES.get(name, _no_indices)) for name in PRIMITIVES
}
"""Each primitive's part in the one integer range analysis (see the module docstring): how
its result's abstract value follows from its operands', and which of its operands index an
axis that must hold them. ``tests/test_coverage.py`` checks every primitive has a rule. The
same walk gives the runtimes' input ranges and the emitters' :func:`value_ranges`."""


def _read(step: Step, args: list[Abstract], graph: Graph) -> Abstract:
    """What a take or gather reads: elements of its data, or 0 (bounds zero, outside)."""
    data, *idx = args
    zero = step.attributes.get("bounds") == "zero"
    if not isinstance(data, Term):
        return _opaque(data)  # a parameter's or state's values: not an input's
    if data.known:
        lo, hi = data.interval()
        return Term.const(min(lo, 0), max(hi, 0)) if zero else Term.const(lo, hi)
    shape = _shape(graph, step.operands[0])
    axes = [step.attributes.get("axis", 0)] if step.op == "take" else list(range(len(idx)))
    inside = all(
        isinstance(x, Term)
        and x.known
        and x.interval()[0] >= 0
        and a < len(shape)
        and x.interval()[1] < shape[a]
        for a, x in zip(axes, idx)
    )
    if inside or not zero:
        return data  # some of the input's elements (an unchecked read never reads 0)
    return _opaque(data, *idx)


def _shape(graph: Graph, ref: str) -> tuple[int, ...]:
    if ref.startswith("@"):
        path = ref[1:]
        table = graph.states if path in graph.states else graph.parameters
        return table[path].shape if path in table else ()
    vt = graph.values.get(ref)
    return vt.shape if vt is not None else ()


def dim_names(graph: Graph | None, size: int) -> list[str]:
    """The model's dims of value ``size`` (``['S']`` for 128 in the toy Llama), to name an
    axis in a message.

    >>> dim_names(Graph("e", "m", dims={"S": 8, "B": 1, "V": 8}), 8)
    ['S', 'V']
    """
    if graph is None:
        return []
    return sorted(k for k, v in graph.dims.items() if v == size and isinstance(v, int))


# ---------------------------------------------------------------- what the runtimes share
# The input checks that need no framework: every runtime calls these (linnet.torch.inputs,
# linnet.jax.inputs), so a model rejects the same bad input the same way on each.
# Each graph's own analysis, by graph object; the steps list it was made from is kept with
# it, so a graph whose steps were replaced since is analysed again.
_CACHE: dict[int, tuple[list[Step], int, Bounds]] = {}
# A rank's graph checks its inputs as the whole graph does (share_bounds).
_SHARED: dict[int, Bounds] = {}


def _analysis(graph: Graph) -> Bounds:
    key = id(graph)
    found = _CACHE.get(key)
    if found is None or found[0] is not graph.steps or found[1] != len(graph.steps):
        if found is None:
            weakref.finalize(graph, _CACHE.pop, key, None)
        found = _CACHE[key] = (graph.steps, len(graph.steps), input_bounds(graph))
    return found[2]


def bounds_for(graph: Graph) -> Bounds:
    """``input_bounds(graph)``, computed once per graph object (both runtimes' input checks
    and generation read it), or the whole graph's for a rank's graph (:func:`share_bounds`).

    >>> bounds_for(Graph("e", "m")).inputs
    {}
    """
    shared = _SHARED.get(id(graph))
    return shared if shared is not None else _analysis(graph)


def value_ranges(graph: Graph) -> dict[str, tuple[int, int]]:
    """The interval ``(lo, hi)`` of every integer value of ``graph`` known whatever the inputs
    are (:attr:`Bounds.ranges`), from the same analysis as :func:`bounds_for`, computed once
    per graph: the emitters leave out a ``bounds = zero`` guard where the index is in range.

    >>> from linnet.lang.ir.graph import Step, ValueType
    >>> g = Graph("e", "m", values={"%i": ValueType((4,), "i32")})
    >>> g.steps = [Step("iota", [], ["%i"], {"shape": [4], "axis": 0, "dtype": "i32"})]
    >>> value_ranges(g)
    {'%i': (0, 3)}
    """
    return _analysis(graph).ranges


def share_bounds(graph: Graph, like: Graph) -> None:
    """Check ``graph``'s inputs as ``like``'s are: a rank's graph (linnet.lang.passes.shard) takes
    the inputs of the whole graph it came from, whose index ranges (the vocabulary, the
    cache) its split tables no longer show. Its own :func:`value_ranges` stay its own.

    >>> share_bounds(Graph("e", "m"), Graph("e", "m"))
    """
    key = id(graph)
    _SHARED[key] = bounds_for(like)
    weakref.finalize(graph, _SHARED.pop, key, None)


def check_static(graph: Graph, entry: str) -> None:
    """Raise E0782 where an index is out of range whatever the inputs' values are: the
    inputs' shapes make it so (a prompt of L tokens into a cache of S < L positions). The
    runtimes call it before anything runs, so both reject such inputs alike.

    >>> check_static(Graph("e", "m"), "e")   # nothing to find in an empty graph
    """
    found = bounds_for(graph).static
    if not found:
        return
    v = found[0]
    what = v.use.describe(graph)
    culprits = [
        f"`{name.lstrip('%')}` is {list(graph.values[name].shape)}"
        for name in graph.inputs
        if v.hi >= v.use.size and v.hi + 1 in graph.values[name].shape
    ]
    names = dim_names(graph, v.use.size)
    dim = f" ({' or '.join(names)} = {v.use.size})" if names else ""
    verb = "write" if v.use.op == "scatter" else "read"
    if culprits:
        raise coded_error(
            "E0782",
            f"the shapes of the inputs of `{entry}` (input {', '.join(culprits)}) make "
            f"step {v.use.step} ({v.use.op}) {verb} positions {v.lo}..{v.hi} of {what}, which "
            f"holds {v.use.size}",
            help=f"an input is longer than the axis it indexes{dim}: "
            f"e.g. a prompt longer than the KV cache; shorten the input to at most "
            f"{v.use.size} along that axis, or load the model with a larger size in the config",
        )
    raise coded_error(
        "E0782",
        f"`{entry}` would {verb} positions {v.lo}..{v.hi} of {what}, which holds "
        f"{v.use.size} (step {v.use.step}, {v.use.op})",
        help=f"the model indexes past the end of that axis for these dims{dim}: check the "
        "config's sizes and the model's constant indices",
    )
