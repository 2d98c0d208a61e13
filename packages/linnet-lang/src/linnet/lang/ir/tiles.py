"""Tile graphs: a kernel lowered for concrete generics, at its own primitive level.

A bound kernel runs once per program of its grid, on tiles (small tensors whose shapes are
known when it is compiled). :func:`~linnet.lang.check.tile_lowering.lower_kernel` (in
``check/``: this module reads no syntax tree) runs the kernel's body through the same
evaluator that lowers ops (so index notation, reductions, `fn` calls, which are inlined,
and conversions mean what they mean everywhere), with the generics bound, into a
:class:`TileKernel`: a list of :class:`~linnet.lang.ir.graph.Step` over the primitives of
:data:`TILE_PRIMITIVES`:

* the element-wise primitives of ``ir/primitives.py``, ``constant``, ``iota``,
  ``broadcast``, ``reshape``, ``transpose``, ``convert``, ``select``, ``reduce`` and
  ``contract`` (a product of two tiles, `sum[k] a[i, k] * b[k, j]`), on tiles;
* ``program_id`` (``axis``): the program's index along a grid axis, an i32 scalar;
* ``load``: operands the tensor parameter (``@x``), then the index tiles, then the mask
  and ``other`` where they are tiles; ``index`` says per axis of the tensor which operand
  (``{"operand": k}``) or which int indexes it, ``mask`` and ``other`` the same (or a
  constant). Each index tile adds its axes in order (``x[rows, cols]`` is [BM, BN]);
* ``store``: no result; operands as ``load``'s, plus ``value`` (the stored tile);
* ``atomic_add``: operands a scratch buffer (``@count``: the kernel's ``scratch(...)``),
  its scalar indices and ``value`` (an i32 scalar); the result is the element's value
  before the addition (i32). Acquire and release at device scope: the program that sees
  the last count reads every other program's stores made before their counts;
* ``for``: a loop ``start..stop`` by ``step`` whose ``body`` is a list of steps; it carries
  values from one iteration to the next: the operands are their values before the loop,
  ``carried`` names them inside the body, ``yields`` are their values at the end of an
  iteration and the step's results their values after the loop. ``var`` is the loop index.

Emitters (``emit/triton.py``) have one rule per tile primitive; tests/test_coverage.py checks
their tables against :data:`TILE_PRIMITIVES`.

>>> from linnet.lang.check.tile_lowering import lower_kernel
>>> from linnet.lang.syntax.program import Program
>>> prog = Program.from_text('''
... kernel double<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N / B) {
...     let cols = program_id(0) * B + iota<i32>(B)
...     store(y[cols], load(x[cols], cols < N) * 2.0, cols < N)
... }''')
>>> k = lower_kernel(prog, "main::double", {"N": 10, "B": 4})
>>> k.grid, [s.op for s in k.steps]
((2,), ['program_id', 'constant', 'mul', 'iota', 'add', 'constant', 'lt', 'load', 'constant', 'mul', 'store'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from linnet.lang.ir.graph import Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES

# Primitives of the op level a kernel's body also uses, on tiles: those whose row says so
# (Primitive.on_tiles: not the gathers, the state writes, the collectives, nor `slice`).
_SHARED = frozenset(name for name, p in PRIMITIVES.items() if p.on_tiles)
#: Every primitive a tile graph holds: the shared ones, then the kernel's own.
TILE_PRIMITIVES: frozenset[str] = _SHARED | {"program_id", "load", "store", "atomic_add", "for"}


@dataclass
class TileKernel:
    """A kernel lowered for concrete generics (see the module docstring)."""

    name: str  # qualified: std.nn.activation::row_softmax
    generics: dict[str, Any]  # as bound: {"R": 4, "C": 8, "B": 1024}
    grid: tuple[int, ...]
    params: list[tuple[str, tuple[int, ...], str]]  # tensor parameters: name, shape, dtype
    results: list[tuple[str, tuple[int, ...], str]]
    scalars: dict[str, Any]  # scalar parameters: their values are compile-time constants
    steps: list[Step] = field(default_factory=list)
    values: dict[str, ValueType] = field(default_factory=dict)
    loc: str = ""  # file:line of the kernel's declaration
    lines: tuple[int, int] = (0, 0)  # its first and last source line
    # Results stored into states instead (:func:`redirect_stores`): these parameters are
    # written in place, and the last `tail` parameters are the ones the redirection added.
    inplace: tuple[str, ...] = ()
    tail: int = 0
    # `scratch(...)` buffers: name, shape, dtype. Its launcher keeps them between launches
    # (zeroed when first made, per device); counters a kernel adds to, it leaves at 0.
    scratch: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)

    @property
    def short_name(self) -> str:
        return self.name.rsplit("::", 1)[-1]

    def walk(self, steps: list[Step] | None = None):
        """Every step, those inside loops included (depth first)."""
        for s in self.steps if steps is None else steps:
            yield s
            if s.op == "for":
                yield from self.walk(s.attributes["body"])

    def summary(self) -> str:
        """One line per step, loops indented: for reading and for tests."""
        gen = ", ".join(f"{k}={v}" for k, v in self.generics.items())
        out = [f"kernel {self.name}<{gen}> grid{self.grid}"]

        def show(steps: list[Step], depth: int) -> None:
            for s in steps:
                res = ", ".join(s.results)
                attrs = {k: v for k, v in s.attributes.items() if k != "body"}
                out.append(
                    f"  {'  ' * depth}{res + ' = ' if res else ''}{s.op}"
                    f"({', '.join(s.operands)}) {attrs if attrs else ''}".rstrip()
                )
                if s.op == "for":
                    show(s.attributes["body"], depth + 1)

        show(self.steps, 0)
        return "\n".join(out)


def redirect_stores(k: TileKernel, writes: list[tuple[int, ...]]) -> TileKernel:
    """``k`` with results stored into states: for each ``(j, S)`` of ``writes``, result ``j``
    (``[N, ...]``) becomes a parameter of shape ``[N * S, ...]`` (a ``[N, S, ...]`` state, its
    first two axes as one), followed by a parameter ``<name>_at`` (``[N]``, i32): a store to
    row ``n`` of the result goes to row ``n * S + at[n]`` of the state, which is what
    ``state[n, at[n], ...] = result[n, ...]`` writes (a decode step's KV-cache write, done by
    the kernel that makes the result: ``passes/spans.py``'s :func:`state_writes`). For each
    ``(j, S, P)`` (a paged cache, ``[P, S, ...]``: ``state[page[n], at[n], ...] = result[n,
    ...]``) the parameter is ``[P * S, ...]``, followed by ``<name>_at`` and ``<name>_page``
    (``[N]``, i32 each), and row ``n`` goes to row ``page[n] * S + at[n]``. The kernel
    loads ``at`` (and ``page``) at each such store, for the rows it stores (rows past N read
    0: their stores are masked off, as they were into the result). The new parameters come
    last, in ``writes``' order; ``k`` itself is left as it is.

    >>> from linnet.lang.check.tile_lowering import lower_kernel
    >>> from linnet.lang.syntax.program import Program
    >>> prog = Program.from_text('''
    ... kernel twice<N: Dim, D: Dim>(x: Tensor[N, D; f32]) -> y: Tensor[N, D; f32] grid(1) {
    ...     let rows = iota<i32>(N)
    ...     let cols = iota<i32>(D)
    ...     store(y[rows, cols], load(x[rows, cols]) * 2.0)
    ... }''')
    >>> k = redirect_stores(lower_kernel(prog, "main::twice", {"N": 2, "D": 4}), [(0, 8)])
    >>> k.params, k.results, k.inplace, k.tail
    ([('x', (2, 4), 'f32'), ('y', (16, 4), 'f32'), ('y_at', (2,), 'i32')], [], ('y',), 2)
    >>> k = redirect_stores(lower_kernel(prog, "main::twice", {"N": 2, "D": 4}), [(0, 8, 5)])
    >>> k.params[1:], k.tail
    ([('y', (40, 4), 'f32'), ('y_at', (2,), 'i32'), ('y_page', (2,), 'i32')], 3)
    """
    import copy

    values = dict(k.values)
    taken = {p for p, _, _ in k.params + k.results}
    counter = [0]

    def fresh(base: str, shape: tuple[int, ...], dtype: str) -> str:
        name = f"%{base}"
        while name in values:
            counter[0] += 1
            name = f"%{base}.{counter[0]}"
        values[name] = ValueType(shape, dtype)
        return name

    def named(base: str) -> str:
        while base in taken:
            base += "_"
        taken.add(base)
        return base

    params = list(k.params)
    # result -> (positions param, pages param or "", N, S)
    moved: dict[str, tuple[str, str, int, int]] = {}
    for w in writes:
        j, positions = w[0], w[1]
        name, shape, dtype = k.results[j]
        at = named(name + "_at")
        rows = w[2] if len(w) > 2 else shape[0]
        params += [(name, (rows * positions, *shape[1:]), dtype), (at, (shape[0],), "i32")]
        page = named(name + "_page") if len(w) > 2 else ""
        if page:
            params.append((page, (shape[0],), "i32"))
        moved[name] = (at, page, shape[0], positions)

    def redirected(s: Step, out: list[Step]) -> Step:
        """The store ``s`` into the state: the steps making its row added to ``out``."""
        at, page, n, positions = moved[s.operands[0][1:]]
        index = list(s.attributes["index"])
        if isinstance(index[0], dict):
            rows = s.operands[index[0]["operand"]]
        else:  # a constant row
            rows = fresh("result_row", (), "i32")
            out.append(Step("constant", [], [rows], {"value": index[0], "dtype": "i32"}, s.loc))
        shape = values[rows].shape
        bound, live = fresh("result_rows", (), "i32"), fresh("row_live", shape, "bool")
        got, stride = fresh("row_at", shape, "i32"), fresh("positions", (), "i32")
        start, row = fresh("row_start", shape, "i32"), fresh("state_row", shape, "i32")
        masked = {"index": [{"operand": 1}], "mask": {"operand": 2}, "other": 0}
        out += [
            Step("constant", [], [bound], {"value": n, "dtype": "i32"}, s.loc),
            Step("lt", [rows, bound], [live], {}, s.loc),
            Step("load", ["@" + at, rows, live], [got], masked, s.loc),
            Step("constant", [], [stride], {"value": positions, "dtype": "i32"}, s.loc),
        ]
        first = rows
        if page:  # the row's page, loaded as its position is
            first = fresh("row_page", shape, "i32")
            out.append(Step("load", ["@" + page, rows, live], [first], masked, s.loc))
        out += [
            Step("mul", [first, stride], [start], {}, s.loc),
            Step("add", [start, got], [row], {}, s.loc),
        ]
        s = copy.copy(s)
        s.operands = [*s.operands, row]
        index[0] = {"operand": len(s.operands) - 1}
        s.attributes = {**s.attributes, "index": index}
        return s

    def rewrite(steps: list[Step]) -> list[Step]:
        out: list[Step] = []
        for s in steps:
            if s.op == "for":
                s = copy.copy(s)
                s.attributes = {**s.attributes, "body": rewrite(s.attributes["body"])}
            elif s.op == "store" and s.operands[0][1:] in moved:
                s = redirected(s, out)
            out.append(s)
        return out

    steps = rewrite(k.steps)
    written = [k.results[w[0]][0] for w in writes]
    return TileKernel(
        k.name,
        dict(k.generics),
        k.grid,
        params,
        [r for r in k.results if r[0] not in written],
        dict(k.scalars),
        steps,
        values,
        k.loc,
        k.lines,
        (*k.inplace, *written),
        k.tail + sum(3 if len(w) > 2 else 2 for w in writes),
        list(k.scratch),
    )
