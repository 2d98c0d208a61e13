"""Which accesses of a tile kernel go out of bounds, or race between programs, whatever the
data: one pass over a kernel lowered for concrete generics (``ir/tiles.py``).

A kernel's indices and masks are mostly made of program ids, iotas, loop indices and
constants, which are known when the kernel is compiled. :func:`access_faults` runs those
integer and bool steps (and nothing else) for the kernel's programs, as plain Python, and
looks at every `load`, `store` and `atomic_add` whose indices and mask it could compute:

* **out of bounds**: a lane the mask lets through (or every lane, unmasked) whose index on
  some axis is outside the tensor's size on that axis. Linnet indexes each axis on its own:
  `x[row, C]` of a `[R, C]` tensor is out of bounds even where the address is row + 1's
  first element. On a GPU such a store writes someone else's memory (a crash, or a wrong
  result anywhere in the process).
* **race**: an element of a scratch buffer (or a state the kernel writes in place) that one
  program stores and another loads, neither after an `atomic_add`. Programs run in any
  order and at once, so the load may see the store or not. After its first `atomic_add` a
  program's accesses are not compared: the count orders them (the "last program" pattern,
  E0547's page), which this pass does not follow.

What it cannot see, it leaves alone (never a false finding): an index or mask computed from
loaded data or an atomic's count, floats converted to indices. Large grids and loops are
sampled: each grid axis and loop of more than :data:`WHOLE` programs or iterations runs its
first two, middle one and last two (where a partial tile is). Every fault it reports is
real for these generics: it names the program, the loop index and the lane that shows it.

>>> from linnet.lang.syntax.program import Program
>>> from linnet.lang.check.tile_lowering import lower_kernel
>>> prog = Program.from_text('''
... kernel double<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32]
...     grid((N + B - 1) / B) {
...     let cols = program_id(0) * B + iota<i32>(B)
...     store(y[cols], load(x[cols], cols < N) * 2.0)
... }''')
>>> [f.describe() for f in access_faults(lower_kernel(prog, "main::double", {"N": 6, "B": 4}))]
['`store` writes y[6], outside `y` (Tensor[6; f32]: axis 0 has 6 entries), in program (1,) (lane [2])']
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from linnet.lang.ir.graph import Step
from linnet.lang.ir.tiles import TileKernel

INTS = {"i8", "i16", "i32", "i64", "u8"}
ACCESSES = ("load", "store", "atomic_add")
# A grid axis or loop of at most this many programs or iterations runs whole; a longer one
# runs its first two, its middle one and its last two (a partial tile is at the end, and
# neighbours are where programs race).
WHOLE = 5
# A loop that carries a value an index needs runs in order, at most this many iterations
# (past them, what it carries is unknown and its accesses are not looked at).
CARRIED_ITERATIONS = 1024
# A tile of more lanes than this is not computed (its value is unknown): no kernel's index
# tiles come near it, and a hostile source's `iota<i32>(1 << 30)` must not fill memory.
LANES = 1 << 16
# The work done for one kernel before the pass stops with what it found (a step costs
# STEP_COST plus its lanes): deep loop nests over large grids stay near a second.
BUDGET = 4_000_000
STEP_COST = 64


@dataclass(frozen=True)
class AccessFault:
    """One access that is wrong whatever the data (see the module docstring).

    ``kind`` is ``"out of bounds"`` or ``"race"``; ``op`` the access (`load`, `store`,
    `atomic_add`); ``tensor`` and ``shape`` what it reads or writes; ``element`` the index
    on every axis; ``axis`` the one out of range (out of bounds); ``program`` and ``loops``
    (loop index name and value) where it happens, ``lane`` which lane of the access tile;
    ``dtype`` the tensor's element type. A race also names ``other`` (the program that
    stored the element) and ``other_loc`` (where).
    """

    kind: str
    op: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str
    loc: str
    element: tuple[int, ...]
    program: tuple[int, ...]
    axis: int = -1
    lane: tuple[int, ...] = ()
    loops: tuple[tuple[str, int], ...] = ()
    other: tuple[int, ...] = ()
    other_loc: str = ""

    @property
    def code(self) -> str:
        """E0548 (out of bounds) or E0549 (a race)."""
        return "E0548" if self.kind == "out of bounds" else "E0549"

    def where(self) -> str:
        """``in program (1,) at k = 3 (lane [2])``."""
        loops = "".join(f" at {name} = {value}" for name, value in self.loops)
        lane = f" (lane {list(self.lane)})" if self.lane else ""
        return f"in program {self.program}{loops}{lane}"

    def describe(self) -> str:
        """One line: what is accessed, why it is wrong, and where.

        >>> AccessFault("out of bounds", "load", "x", (2, 3), "f32", "k.linnet:4", (1, 3),
        ...             (1,), 1, (3,)).describe()
        '`load` reads x[1, 3], outside `x` (Tensor[2, 3; f32]: axis 1 has 3 entries), in program (1,) (lane [3])'
        """
        at = f"{self.tensor}[{', '.join(map(str, self.element))}]"
        typ = f"Tensor[{', '.join(map(str, self.shape))}; {self.dtype}]"
        if self.kind == "out of bounds":
            verb = {"load": "reads", "store": "writes", "atomic_add": "adds to"}[self.op]
            n = self.shape[self.axis]
            return (
                f"`{self.op}` {verb} {at}, outside `{self.tensor}` ({typ}: axis {self.axis} "
                f"has {n} {'entry' if n == 1 else 'entries'}), {self.where()}"
            )
        return (
            f"`{self.op}` of {at} {self.where()} races with the `store` of program "
            f"{self.other}"
            + (f" ({self.other_loc})" if self.other_loc else "")
            + ": programs run in any order, and no `atomic_add` orders the two"
        )


def access_faults(k: TileKernel) -> list[AccessFault]:
    """The accesses of ``k`` that are out of bounds or race whatever the data: at most one
    fault per access step (its first lane found), races after them.

    >>> from linnet.lang.syntax.program import Program
    >>> from linnet.lang.check.tile_lowering import lower_kernel
    >>> prog = Program.from_text('''
    ... kernel rows<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32]
    ...     grid(R) where B >= C {
    ...     let cols = iota<i32>(B)
    ...     store(y[program_id(0), cols], load(x[program_id(0), cols], cols < C), cols < C)
    ... }''')
    >>> access_faults(lower_kernel(prog, "main::rows", {"R": 3, "C": 5, "B": 8}))
    []
    """
    shapes = {name: (shape, dtype) for name, shape, dtype in k.params + k.results + k.scratch}
    run = _Run(k, shapes, _needed(k), _tracked(k))
    try:
        for program in _programs(k.grid):
            run.program, run.synced, run.loops = program, False, ()
            run.steps(k.steps, {})
    except _Spent:
        pass  # what was found holds; the rest is not looked at
    return list(run.faults.values()) + run.races


class _Spent(Exception):
    """The pass has done BUDGET's work for this kernel."""


# ---------------------------------------------------------------- what to run


def _programs(grid: tuple[int, ...]) -> Iterable[tuple[int, ...]]:
    """The programs looked at: every one along an axis of at most WHOLE, else a sample."""
    return itertools.product(*(_sample(range(g)) for g in grid))


def _sample(values: range) -> list[int]:
    n = len(values)
    if n <= WHOLE:
        return list(values)
    picks = {0, 1, n // 2, n - 2, n - 1}
    return [values[i] for i in sorted(picks)]


def _needed(k: TileKernel) -> set[str]:
    """The values an access's indices or mask depend on (through any step but a load or an
    atomic, whose results are data): the only ones run."""
    needed: set[str] = set()
    steps = list(k.walk())
    for s in steps:
        if s.op in ACCESSES:
            a = s.attributes
            needed.update(s.operands[i["operand"]] for i in a["index"] if isinstance(i, dict))
            if isinstance(a.get("mask"), dict):
                needed.add(s.operands[a["mask"]["operand"]])
    changed = True
    while changed:
        changed = False
        for s in reversed(steps):
            if s.op == "for":
                a = s.attributes
                for group in zip(s.operands, a["carried"], a["yields"], s.results):
                    if any(r in needed for r in group[1:]) and not set(group) <= needed:
                        needed.update(group)
                        changed = True
            elif s.op not in ACCESSES and any(r in needed for r in s.results):
                new = set(s.operands) - needed
                if new:
                    needed |= new
                    changed = True
    return needed


def _tracked(k: TileKernel) -> set[str]:
    """Tensors the kernel both loads and stores (scratch buffers, states written in place):
    the only ones two programs can race on (results are never loaded, parameters never
    stored)."""
    loaded, stored = set(), set()
    for s in k.walk():
        if s.op == "load":
            loaded.add(s.operands[0][1:])
        elif s.op == "store":
            stored.add(s.operands[0][1:])
    return loaded & stored


# ---------------------------------------------------------------- tiles as Python lists


class Tile:
    """A known tile: its ``shape``, the axes its elements vary along (``live``, in order:
    the others are broadcast) and its elements over those axes, row-major. A bool tile that
    is the `and` of tiles varying along different axes (a mask `rows[i] < M && cols[j] <
    N`) keeps them as ``factors`` instead of their product, which is all a mask is needed
    for and can be thousands of lanes."""

    __slots__ = ("data", "factors", "live", "shape")

    def __init__(
        self,
        shape: tuple[int, ...],
        live: tuple[int, ...],
        data: list[Any],
        factors: tuple[Tile, ...] = (),
    ) -> None:
        self.shape, self.live, self.data, self.factors = shape, live, data, factors

    @staticmethod
    def scalar(value: Any) -> Tile:
        return Tile((), (), [value])

    def over(self, live: tuple[int, ...]) -> list[Any]:
        """The elements over ``live`` (a superset of the tile's own, in order)."""
        if self.factors:
            parts = [f.over(live) for f in self.factors]
            return [all(x) for x in zip(*parts)]
        if live == self.live:
            return self.data
        dims = tuple(self.shape[a] for a in live)
        src = tuple(self.shape[a] if a in self.live else 1 for a in live)
        return [self.data[i] for i in _spread(src, dims)]

    def broadcast(self, shape: tuple[int, ...]) -> Tile:
        """This tile broadcast to ``shape`` (NumPy's rule: new axes on the left)."""
        if shape == self.shape:
            return self
        shift = len(shape) - len(self.shape)
        return Tile(
            shape,
            tuple(a + shift for a in self.live),
            self.data,
            tuple(f.broadcast(shape) for f in self.factors),
        )


def _live(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(a for a, n in enumerate(shape) if n != 1)


@lru_cache(maxsize=4096)
def _spread(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int, ...]:
    """For each element of a ``dst``-shaped tile (row-major), the position in a ``src``-shaped
    tile of the same rank broadcast to it (its axes of size 1 repeated)."""
    strides = [math.prod(src[i + 1 :]) if src[i] != 1 else 0 for i in range(len(src))]
    out = [0]
    for size, stride in zip(dst, strides):
        out = [o + j * stride for o in out for j in range(size)]
    return tuple(out)


@lru_cache(maxsize=1024)
def _permuted(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """For each element of the transposed tile, its position in the tile."""
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    out = [0]
    for axis in perm:
        out = [o + j * strides[axis] for o in out for j in range(shape[axis])]
    return tuple(out)


def _coords(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def _map(fn: Callable[..., Any], shape: tuple[int, ...], tiles: list[Tile]) -> Tile | None:
    """``fn`` of the tiles element by element, each broadcast to ``shape``, over the axes
    any of them varies along (None past LANES)."""
    spread = [t.broadcast(shape) for t in tiles]
    live = tuple(sorted({a for t in spread for a in _all_live(t)}))
    if math.prod(shape[a] for a in live) > LANES:
        return None
    return Tile(shape, live, [fn(*xs) for xs in zip(*(t.over(live) for t in spread))])


def _all_live(t: Tile) -> tuple[int, ...]:
    return tuple(sorted({a for f in t.factors for a in f.live})) if t.factors else t.live


def _and(shape: tuple[int, ...], a: Tile, b: Tile) -> Tile:
    """``a && b``: their factors, kept apart (see :class:`Tile`)."""
    parts = [f for t in (a.broadcast(shape), b.broadcast(shape)) for f in (t.factors or (t,))]
    return Tile(shape, tuple(sorted({x for f in parts for x in f.live})), [], tuple(parts))


def _reshape(t: Tile, shape: tuple[int, ...]) -> Tile | None:
    """``t`` in ``shape``: where only axes of size 1 come or go, the same elements (a mask's
    factors each so); otherwise its elements laid out again (None past LANES)."""
    if [n for n in t.shape if n != 1] == [n for n in shape if n != 1]:
        where = dict(zip(_live(t.shape), _live(shape)))
        factors = tuple(_reshape(f, shape) for f in t.factors)
        if any(f is None for f in factors):
            return None
        return Tile(shape, tuple(where[a] for a in t.live), t.data, factors)  # type: ignore[arg-type]
    if math.prod(shape) > LANES:
        return None
    return Tile(shape, _live(shape), t.over(_live(t.shape)))


def _transpose(t: Tile, perm: tuple[int, ...]) -> Tile:
    """``t`` with its axes in the order ``perm``."""
    # Over its axes of size more than one, a tile's elements are those of its whole shape.
    data = t.over(_live(t.shape))
    shape = tuple(t.shape[a] for a in perm)
    return Tile(shape, _live(shape), [data[i] for i in _permuted(t.shape, perm)])


def _reduce(t: Tile, kind: str, axes: list[int], shape: tuple[int, ...]) -> Tile | None:
    """An integer or bool tile summed, or its largest or smallest element, over ``axes``."""
    reducers: dict[str, Callable[[list[Any]], Any]] = {"sum": sum, "max": max, "min": min}
    fn = reducers.get(kind)
    if fn is None:
        return None
    full = _live(t.shape)
    data = t.over(full)
    dims = tuple(t.shape[a] for a in full)
    groups: dict[tuple[int, ...], list[Any]] = {}
    for j, x in enumerate(data):
        c = _coords(j, dims)
        groups.setdefault(tuple(c[i] for i, a in enumerate(full) if a not in axes), []).append(x)
    out = [fn(groups[key]) for key in sorted(groups)]
    if len(out) != math.prod(shape):
        return None
    return Tile(shape, _live(shape), out)


def _logical(fn: Callable[[bool, bool], bool]) -> Callable[[Any, Any], bool]:
    return lambda a, b: fn(bool(a), bool(b))


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    # Linnet's integer division floors and its remainder takes the divisor's sign: Python's.
    "div": operator.floordiv,
    "rem": operator.mod,
    "maximum": max,
    "minimum": min,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
    "or": _logical(operator.or_),
}
_UNARY: dict[str, Callable[[Any], Any]] = {"neg": operator.neg, "abs": abs, "not": operator.not_}


def _witness(factors: list[Tile], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A lane of ``shape`` where every factor holds, or None: factors that share an axis are
    looked at together, over their axes only."""
    groups: list[tuple[set[int], list[Tile]]] = []
    for f in factors:
        axes, members = set(f.live), [f]
        for g in [g for g in groups if g[0] & axes]:
            groups.remove(g)
            axes |= g[0]
            members += g[1]
        groups.append((axes, members))
    lane = [0] * len(shape)
    for axes, members in groups:
        live = tuple(sorted(axes))
        if math.prod(shape[a] for a in live) > LANES:
            return None  # too large to look at: not known to be out of bounds
        both = [f.over(live) for f in members]
        try:
            hit = list(map(all, zip(*both))).index(True)
        except ValueError:
            return None
        for a, c in zip(live, _coords(hit, tuple(shape[a] for a in live))):
            lane[a] = c
    return tuple(lane)


class _Run:
    """The kernel's integer steps run for one program after another; the faults found."""

    def __init__(
        self,
        k: TileKernel,
        shapes: dict[str, tuple[tuple[int, ...], str]],
        needed: set[str],
        tracked: set[str],
    ) -> None:
        self.k, self.shapes, self.needed, self.tracked = k, shapes, needed, tracked
        self.program: tuple[int, ...] = ()
        self.loops: tuple[tuple[str, int], ...] = ()
        self.synced = False  # after the program's first atomic_add
        self.faults: dict[int, AccessFault] = {}  # by access step, its first
        self.races: list[AccessFault] = []
        self.seen: set[int] = set()  # accesses looked at (see access)
        self.budget = BUDGET
        # Per tracked tensor: element -> (program, loc) of its first store; and the
        # programs (two at most) that loaded it.
        self.stored: dict[str, dict[int, tuple[tuple[int, ...], str]]] = {}
        self.loaded: dict[str, dict[int, list[_Load]]] = {}

    def steps(self, steps: list[Step], env: dict[str, Tile]) -> None:
        for s in steps:
            if s.op == "for":
                self.loop(s, env)
            elif s.op in ACCESSES:
                self.access(s, env)
                if s.op == "atomic_add":
                    self.synced = True
            elif s.results and s.results[0] in self.needed:
                _set(env, s.results[0], self.value(s, env))

    def loop(self, s: Step, env: dict[str, Tile]) -> None:
        a = s.attributes
        iterations = range(a["start"], a["stop"], a["step"])
        carries = any(c in self.needed for c in a["carried"])
        if carries:  # in order, each iteration from the one before
            for c, init in zip(a["carried"], s.operands):
                _set(env, c, env.get(init))
            picked: Iterable[int] = iterations[:CARRIED_ITERATIONS]
        else:
            picked = _sample(iterations)
        outer = self.loops
        name = a["var"].lstrip("%")
        for i in picked:
            self.spend(0)
            env[a["var"]] = Tile.scalar(i)
            self.loops = (*outer, (name, i))
            self.steps(a["body"], env)
            if carries:
                ends = [env.get(y) for y in a["yields"]]
                for c, v in zip(a["carried"], ends):
                    _set(env, c, v)
        self.loops = outer
        done = carries and len(iterations) <= CARRIED_ITERATIONS
        for r, c in zip(s.results, a["carried"]):
            _set(env, r, env.get(c) if done else None)

    def value(self, s: Step, env: dict[str, Tile]) -> Tile | None:
        """The step's result, or None where it is not known (data, floats, an operation
        this pass does not run)."""
        vt = self.k.values.get(s.results[0])
        if vt is None or vt.dtype not in INTS | {"bool"}:
            return None
        shape, a = tuple(vt.shape), s.attributes
        self.spend(math.prod(shape))
        if math.prod(shape) > LANES and s.op not in ("broadcast", "reshape", "and"):
            return None
        ops = [env.get(o) for o in s.operands]
        if any(o is None for o in ops):
            return None
        tiles: list[Tile] = ops  # type: ignore[assignment]
        try:
            if s.op == "and":
                return _and(shape, *tiles)
            if s.op in _BINARY:
                return _map(_BINARY[s.op], shape, tiles)
            if s.op in _UNARY:
                return _map(_UNARY[s.op], shape, tiles)
        except ZeroDivisionError:
            return None
        if s.op == "constant":
            v = a.get("value")
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            return Tile.scalar(v) if isinstance(v, int) else None
        if s.op == "program_id":
            return Tile.scalar(self.program[a["axis"]])
        if s.op == "iota":
            axis = a["axis"]
            return Tile(
                shape,
                _live(shape)[:0] + ((axis,) if shape[axis] != 1 else ()),
                list(range(shape[axis])),
            )
        if s.op == "broadcast":
            return tiles[0].broadcast(shape)
        if s.op == "reshape":
            return _reshape(tiles[0], shape)
        if s.op == "transpose":
            return _transpose(tiles[0], tuple(a["perm"]))
        if s.op == "convert":
            src = self.k.values.get(s.operands[0])
            if src is None or src.dtype not in INTS | {"bool"}:
                return None
            return _map(bool if vt.dtype == "bool" else int, shape, tiles)
        if s.op == "select":
            return _map(lambda c, x, y: x if c else y, shape, tiles)
        if s.op == "reduce":
            return _reduce(tiles[0], a["kind"], a["axes"], shape)
        return None

    def spend(self, lanes: int) -> None:
        self.budget -= STEP_COST + lanes
        if self.budget < 0:
            raise _Spent

    def access(self, s: Step, env: dict[str, Tile]) -> None:
        a = s.attributes
        tensor = s.operands[0][1:]
        size = self.shapes[tensor][0]
        index: list[Tile] = []
        at: list[int] = []  # where each index's axes start in the access tile
        tile: tuple[int, ...] = ()
        for i in a["index"]:
            v = env.get(s.operands[i["operand"]]) if isinstance(i, dict) else Tile.scalar(i)
            if v is None:
                return  # computed from data: not seen here
            at.append(len(tile))
            index.append(v)
            tile += v.shape
        mask = a.get("mask")
        active: list[Tile] = []
        if isinstance(mask, dict):
            m = env.get(s.operands[mask["operand"]])
            if m is None:
                return
            m = m.broadcast(tile)
            active = list(m.factors or (m,))
        elif mask is not None and not mask:
            return  # masked off whole
        # Each index as a tile of the access's shape, its axes in their place.
        placed = [Tile(tile, tuple(p + x for x in v.live), v.data) for v, p in zip(index, at)]
        # The same indices and mask as at another program or iteration: nothing new.
        # (Its hash is kept, not the tuple: thousands of big tuples slow the collector.)
        key = hash(
            (
                id(s),
                *((v.live, tuple(v.data)) for v in placed),
                *((f.live, tuple(f.data)) for f in active),
            )
        )
        self.spend(0)
        if id(s) not in self.faults and key not in self.seen:
            self.seen.add(key)
            self.spend(math.prod(tile))
            for axis, v in enumerate(placed):
                n = size[axis]
                if all(0 <= x < n for x in v.data):
                    continue
                bad = Tile(tile, v.live, [not 0 <= x < n for x in v.data])
                lane = _witness([bad, *active], tile)
                if lane is not None:
                    self.faults[id(s)] = self.fault("out of bounds", s, tensor, placed, lane, axis)
                    break
        if tensor in self.tracked and not self.synced and math.prod(tile) <= LANES:
            self.spend(math.prod(tile))
            self.track(s, tensor, placed, active, tile)

    def track(
        self, s: Step, tensor: str, placed: list[Tile], active: list[Tile], tile: tuple[int, ...]
    ) -> None:
        """Record which elements this program stores or loads; a race where another program
        did the other."""
        size = self.shapes[tensor][0]
        strides = [math.prod(size[i + 1 :]) for i in range(len(size))]
        full = tuple(range(len(tile)))
        columns = [v.over(full) for v in placed]
        mask = Tile(tile, (), [True], tuple(active)).over(full) if active else None
        stored = self.stored.setdefault(tensor, {})
        loaded = self.loaded.setdefault(tensor, {})
        for j in range(math.prod(tile)):
            if mask is not None and not mask[j]:
                continue
            element = tuple(c[j] for c in columns)
            if any(not 0 <= e < n for e, n in zip(element, size)):
                continue
            flat = sum(e * st for e, st in zip(element, strides))
            lane = _coords(j, tile)
            if s.op == "load":
                first = stored.get(flat)
                if first is not None and first[0] != self.program:
                    fault = self.fault("race", s, tensor, placed, lane)
                    self.add_race(replace(fault, other=first[0], other_loc=first[1]))
                    return
                seen = loaded.setdefault(flat, [])
                if len(seen) < 2 and all(x.program != self.program for x in seen):
                    seen.append(_Load(self.program, s.loc, element, self.loops, lane))
            elif s.op == "store":
                for x in loaded.get(flat, []):
                    if x.program != self.program:  # it loaded what this program now stores
                        self.add_race(
                            AccessFault(
                                "race",
                                "load",
                                tensor,
                                *self.shapes[tensor],
                                x.loc,
                                x.element,
                                x.program,
                                lane=x.lane,
                                loops=x.loops,
                                other=self.program,
                                other_loc=s.loc,
                            )
                        )
                        return
                stored.setdefault(flat, (self.program, s.loc))

    def add_race(self, fault: AccessFault) -> None:
        if not any(r.tensor == fault.tensor for r in self.races):  # one a tensor
            self.races.append(fault)

    def fault(
        self,
        kind: str,
        s: Step,
        tensor: str,
        placed: list[Tile],
        lane: tuple[int, ...],
        axis: int = -1,
    ) -> AccessFault:
        shape, dtype = self.shapes[tensor]
        return AccessFault(
            kind,
            s.op,
            tensor,
            shape,
            dtype,
            s.loc,
            tuple(_at(v, lane) for v in placed),
            self.program,
            axis,
            lane,
            self.loops,
        )


def _at(t: Tile, lane: tuple[int, ...]) -> Any:
    """``t``'s element at ``lane`` (a position in its shape)."""
    dims = tuple(t.shape[a] for a in t.live)
    flat = 0
    for a, n in zip(t.live, dims):
        flat = flat * n + lane[a]
    return t.data[flat]


@dataclass(frozen=True)
class _Load:
    """Where a program loaded an element of a tracked tensor (for a race found later)."""

    program: tuple[int, ...]
    loc: str
    element: tuple[int, ...]
    loops: tuple[tuple[str, int], ...]
    lane: tuple[int, ...]


def _set(env: dict[str, Tile], ref: str, value: Tile | None) -> None:
    if value is None:
        env.pop(ref, None)
    else:
        env[ref] = value
