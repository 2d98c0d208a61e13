"""Tensor parallelism: one rank's graph of an entry split over ``world`` ranks (issue 21).

:func:`shard` rewrites a lowered :class:`~linnet.lang.ir.graph.Graph` into the graph that
rank ``rank`` of ``world`` runs. Every value, parameter and state is either **replicated**
(each rank holds all of it) or **split** along one axis into ``world`` equal, contiguous
blocks (rank r holds block r). The pass walks the steps in order and propagates that
layout through the dataflow; where a step needs another layout than its operand has, it
inserts the step that converts it:

* a split value a step cannot take split is gathered (``all_gather``);
* a replicated value a step needs split is cut to the rank's block (a ``slice``: no
  communication);
* a step whose result is a partial sum (a contraction or a sum over a split axis, a take
  from a table split along the taken axis) is followed by an ``all_reduce``.

Parameters and states are laid out where they are first used. The policy, found from the
std calls and the dataflow, never from parameter names:

* a ``std.nn.linear::linear`` (or ``linear_bias``) call whose input is replicated is
  **column-parallel**: its weight ``[O, I]`` (and bias) split along O, its output split
  along the features (q/k/v, gate/up, and the LM head);
* a linear whose input is split along the features it contracts is **row-parallel**: its
  weight split along I, its partial product all-reduced (o and down);
* split features reshaped into heads split the heads: attention runs on the rank's KV
  heads, and the KV cache (written by ``scatter``) is split along its KV-head axis;
* an embedding table (``std.nn.embedding::embedding``) is **vocab-parallel**: split along
  V, each rank reads the rows it holds (ids shifted by its offset, zero elsewhere), then an
  all-reduce sums the ranks' rows;
* an entry's split outputs (the LM head's logits, split along the vocabulary) are
  all-gathered: every rank returns the whole result;
* a column-parallel linear whose split output would have to be gathered before it reaches
  a row-parallel one or the result (a fused qkv or gate_up sliced apart, a norm over its
  features) is kept replicated instead: the pass runs again without it (once per linear at
  most), so the only gather left is the result's.

A size the layout must split that does not divide by ``world`` is error E0960, naming the
dim (the KV heads, the vocabulary...); a linear with fewer output features than ranks (a
one-output gate) is replicated, there being nothing to split. The result passes :func:`~linnet.lang.ir.verify.verify`.

>>> from linnet.lang.ir.graph import Graph, Step, ValueType, Call
>>> g = Graph("run", "m", inputs=["%x"], outputs=["%y"],
...           values={"%x": ValueType((1, 4), "f32"), "%h": ValueType((1, 8), "f32"),
...                   "%y": ValueType((1, 4), "f32")},
...           parameters={"up": ValueType((8, 4), "f32"), "down": ValueType((4, 8), "f32")})
>>> g.steps = [Step("contract", ["%x", "@up"], ["%h"], {"spec": "ac,bc->ab"}),
...            Step("contract", ["%h", "@down"], ["%y"], {"spec": "ac,bc->ab"})]
>>> g.calls = [Call("std.nn.linear::linear", "op", 0, 1, 0, "up"),
...            Call("std.nn.linear::linear", "op", 1, 2, 1, "down")]
>>> s = shard(g, world=2, rank=1)
>>> s.parameters, [st.op for st in s.graph.steps], s.graph.parameters["up"].shape
({'up': 0, 'down': 1}, ['contract', 'contract', 'all_reduce'], (4, 4))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.diagnostics.core import LinnetError, coded_error
from linnet.lang.ir.graph import Call, Graph, Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES, Category

LINEARS = (
    "std.nn.linear::linear",
    "std.nn.linear::linear_bias",
    "std.nn.linear::linear_in_out_bias",
)
EMBEDDINGS = ("std.nn.embedding::embedding",)
COLLECTIVES = ("all_reduce", "all_gather")

_UNDECIDED = object()


@dataclass
class Sharding:
    """What :func:`shard` made: the rank's graph and the layout of what it holds.

    ``parameters`` and ``states`` map each split path to its split axis (a path not listed
    is replicated); ``graph`` holds the rank's shapes (a split axis is ``1/world`` of the
    whole), ``global_graph`` the graph it came from.

    >>> Sharding(Graph("e", "m"), Graph("e", "m"), 2, 0).collectives()
    []
    """

    graph: Graph
    global_graph: Graph
    world: int
    rank: int
    parameters: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)

    def collectives(self) -> list[int]:
        """The indices of the rank's collective steps."""
        return [i for i, s in enumerate(self.graph.steps) if s.op in COLLECTIVES]

    def block(self, path: str, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
        """``(axis, start, stop)`` of this rank's block of parameter or state ``path`` whose
        whole shape is ``shape``; None where it is replicated.

        >>> Sharding(Graph("e", "m"), Graph("e", "m"), 2, 1, {"w": 0}).block("w", (8, 4))
        (0, 4, 8)
        """
        axis = self.parameters.get(path, self.states.get(path))
        if axis is None:
            return None
        size = shape[axis] // self.world
        return axis, self.rank * size, (self.rank + 1) * size


def dim_names(graph: Graph, size: int) -> str:
    """The model's dims of this size, for messages: ``"KV = 2"``, or ``"size 96"``.

    >>> dim_names(Graph("e", "m", dims={"KV": 2, "G": 2, "D": 64}), 2)
    'KV = G = 2'
    """
    names = [n for n, v in graph.dims.items() if v == size]
    return " = ".join(names) + f" = {size}" if names else f"size {size}"


class _Pass:
    def __init__(self, graph: Graph, world: int, rank: int, keep: frozenset[int] = frozenset()):
        self.g, self.world, self.rank = graph, world, rank
        # Linears (by call index) kept replicated: their column-parallel output had to be
        # gathered before it reached a row-parallel linear (a fused qkv sliced apart, a
        # norm over it), which costs more than it saves. `bad` collects those of this run.
        self.keep = keep
        self.bad: set[int] = set()
        self.origin: dict[str, frozenset[int]] = {}  # split value -> the linears it comes from
        self.step_origin: frozenset[int] = frozenset()
        self.final = False
        self.split: dict[str, int | None] = {v: None for v in graph.inputs}
        self.layout: dict[str, Any] = {}  # parameter/state path -> axis, None, or undecided
        self.values: dict[str, ValueType] = {v: graph.values[v] for v in graph.inputs}
        self.taken: set[str] = set(graph.values)
        self.pre: list[Step] = []
        self.post: list[Step] = []
        self.rewritten = False
        self.converted: dict[tuple[str, Any], str] = {}
        self.g_values_extra: dict[str, ValueType] = {}  # the values the pass made, whole
        self.innermost: list[Call | None] = [None] * len(graph.steps)
        for c in sorted(graph.calls, key=lambda c: c.depth):
            for i in range(c.start, c.stop):
                self.innermost[i] = c if self._op_call(c) else self.innermost[i]
        self.where = ""
        self.users = graph.users()
        # A partial sum whose one user is the `as T` of its own linear (16-bit models): the
        # all-reduce follows that convert instead, inside no std op's span (result -> the
        # partial's fresh name), and moves T-sized data, as Megatron-LM's does.
        self.deferred: dict[str, str] = {}

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _op_call(c: Call) -> bool:
        return c.callee in LINEARS or c.callee in EMBEDDINGS

    def gshape(self, ref: str) -> tuple[int, ...]:
        if ref.startswith("@"):
            p = ref[1:]
            return (self.g.states.get(p) or self.g.parameters[p]).shape
        if ref in self.g.values:
            return self.g.values[ref].shape
        return self.g_values_extra[ref].shape

    def dtype(self, ref: str) -> str:
        if ref.startswith("@"):
            p = ref[1:]
            return (self.g.states.get(p) or self.g.parameters[p]).dtype
        return (self.g.values.get(ref) or self.values[ref]).dtype

    def axis_of(self, ref: str) -> Any:
        if ref.startswith("@"):
            return self.layout.get(ref[1:], _UNDECIDED)
        return self.split.get(ref)

    def fresh(self, base: str) -> str:
        stem, n = f"%{base.lstrip('%@').split('.')[0].replace('%', '')}.tp", 1
        while f"{stem}{n}" in self.taken:
            n += 1
        self.taken.add(f"{stem}{n}")
        return f"{stem}{n}"

    def local(self, shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
        if axis is None:
            return tuple(shape)
        out = list(shape)
        out[axis] //= self.world
        return tuple(out)

    def divides(self, size: int, what: str) -> None:
        if size % self.world:
            raise coded_error(
                "E0960",
                f"{what} has {dim_names(self.g, size)}, which does not divide by the "
                f"world size {self.world}{self.where}",
                help=_ranks_help(size),
            )

    def emit(
        self,
        into: list[Step],
        op: str,
        operands: list[str],
        attrs: dict,
        shape: tuple[int, ...],
        dtype: str,
        base: str,
        axis: int | None,
        global_shape: tuple[int, ...],
    ) -> str:
        name = self.fresh(base)
        into.append(Step(op, operands, [name], attrs, self.loc))
        self.values[name] = ValueType(tuple(shape), dtype)
        self.g_values_extra[name] = ValueType(tuple(global_shape), dtype)
        self.split[name] = axis
        return name

    def decide(self, path: str, axis: int | None) -> None:
        if axis is not None:
            kind = "state" if path in self.g.states else "parameter"
            self.divides(self.gshape("@" + path)[axis], f"axis {axis} of {kind} `{path}`")
        self.layout[path] = axis

    def need(self, ref: str, axis: int | None) -> str:
        """``ref`` laid out split along ``axis`` (None: replicated), converting if needed."""
        have = self.axis_of(ref)
        if have is _UNDECIDED:
            self.decide(ref[1:], axis)
            return ref
        if have == axis:
            return ref
        key = (ref, axis)
        if key in self.converted:
            return self.converted[key]
        shape, dtype, cur = self.gshape(ref), self.dtype(ref), ref
        if have is not None:  # gather the blocks: the whole value on every rank
            if not self.final:
                self.bad |= self.origin.get(ref, frozenset())
            cur = self.emit(
                self.pre,
                "all_gather",
                [cur],
                {"axis": have, "world": self.world},
                shape,
                dtype,
                ref.lstrip("%@"),
                None,
                shape,
            )
            self.converted[(ref, None)] = cur
        if axis is not None:  # this rank's block of a replicated value
            self.divides(shape[axis], f"axis {axis} of `{ref.lstrip('%@')}`")
            size = shape[axis] // self.world
            starts = [0] * len(shape)
            limits = list(shape)
            starts[axis], limits[axis] = self.rank * size, (self.rank + 1) * size
            cur = self.emit(
                self.pre,
                "slice",
                [cur],
                {"starts": starts, "limits": limits},
                self.local(shape, axis),
                dtype,
                ref.lstrip("%@"),
                axis,
                shape,
            )
        self.converted[key] = cur
        return cur

    # ------------------------------------------------------------ the walk
    def run(self) -> Sharding:
        groups: list[tuple[list[Step], Step | None, list[Step], bool]] = []
        for i, step in enumerate(self.g.steps):
            self.pre, self.post, self.rewritten = [], [], False
            self.step_origin = frozenset()
            self.loc = step.loc
            self.index = i
            call = self.innermost[i]
            block = max(
                (c for c in self.g.calls if c.start <= i < c.stop and c.path),
                key=lambda c: c.depth,
                default=None,
            )
            at = call or block
            self.where = f" (step {i}, {at.callee} at `{at.path}`)" if at and at.path else ""
            new = self.step(step)
            groups.append((self.pre, new, self.post, self.rewritten))
        tail: list[Step] = []
        outputs = []
        self.final = True  # gathering a result (the LM head's logits) is the plan
        for o in self.g.outputs:
            if o.startswith("%"):
                self.pre = []
                self.loc = self.g.steps[-1].loc if self.g.steps else ""
                outputs.append(self.need(o, None))
                tail.extend(self.pre)
            else:
                outputs.append(o)
        return self.assemble(groups, tail, outputs)

    def step(self, s: Step) -> Step:
        return SHARD_RULES[s.op](self, s)

    def out(
        self, s: Step, operands: list[str], axis: int | None, attrs: dict | None = None
    ) -> Step:
        r = s.results[0]
        self.split[r] = axis
        if axis is not None:
            self.origin[r] = self.step_origin.union(
                *(self.origin.get(o, frozenset()) for o in operands)
            )
        self.values[r] = ValueType(self.local(self.g.values[r].shape, axis), self.g.values[r].dtype)
        return Step(
            s.op, operands, list(s.results), dict(s.attributes if attrs is None else attrs), s.loc
        )

    def partial(
        self, s: Step, operands: list[str], kind: str = "sum", attrs: dict | None = None
    ) -> Step:
        """A step whose result on each rank is a partial sum: the all-reduce follows it."""
        new = self.out(s, operands, None, attrs)
        r = s.results[0]
        vt = self.values[r]
        # The step makes a fresh name; the reduced value keeps the step's own name, so
        # every later step reads the whole sum.
        part = self.fresh(r)
        new.results = [part]
        self.values[part] = vt
        self.g_values_extra[part] = vt
        nxt = self.index + 1
        call = self.innermost[self.index]
        if (
            kind == "sum"
            and self.users.get(r) == [nxt]
            and nxt < len(self.g.steps)
            and self.g.steps[nxt].op == "convert"
            and call is not None
            and call.stop == nxt + 1
            and self.innermost[nxt] is call
        ):
            del self.values[r]
            self.deferred[r] = part
            return new
        self.post.append(
            Step("all_reduce", [part], [r], {"kind": kind, "world": self.world}, s.loc)
        )
        return new

    def _convert(self, s: Step) -> Step:
        x = s.operands[0]
        if x not in self.deferred:
            return self.elementwise(s)
        r = s.results[0]
        part = self.fresh(r)
        vt = ValueType(self.g.values[r].shape, self.g.values[r].dtype)
        self.split[r] = None
        self.values[r] = self.values[part] = self.g_values_extra[part] = vt
        self.post.append(
            Step("all_reduce", [part], [r], {"kind": "sum", "world": self.world}, s.loc)
        )
        return Step(s.op, [self.deferred[x]], [part], dict(s.attributes), s.loc)

    def replicated(self, s: Step) -> Step:
        ops = [self.need(o, None) for o in s.operands]
        if s.results:
            return self.out(s, ops, None)
        return Step(s.op, ops, [], dict(s.attributes), s.loc)

    def elementwise(self, s: Step) -> Step:
        shape = self.g.values[s.results[0]].shape
        axis = None
        for o in s.operands:
            a = self.axis_of(o)
            if a is not _UNDECIDED and a is not None and self.gshape(o)[a] > 1:
                axis = a
                break
        if axis is None:
            return self.replicated(s)
        ops = [
            self.need(
                o, axis if len(self.gshape(o)) == len(shape) and self.gshape(o)[axis] > 1 else None
            )
            for o in s.operands
        ]
        return self.out(s, ops, axis)

    def _constant(self, s: Step) -> Step:
        return self.out(s, [], None)

    _iota = _constant

    def _reshape(self, s: Step) -> Step:
        x = s.operands[0]
        a = self.axis_of(x)
        out_shape = tuple(s.attributes["shape"])
        if a is _UNDECIDED or a is None:
            return self.replicated(s)
        in_shape = self.gshape(x)
        before = math.prod(in_shape[:a])
        for r, size in enumerate(out_shape):
            if math.prod(out_shape[:r]) == before and size > 1:
                if size % self.world:
                    raise coded_error(
                        "E0960",
                        f"splitting `{x.lstrip('%@')}` over {self.world} ranks splits "
                        f"axis {r} of its reshape to {list(out_shape)}, which has "
                        f"{dim_names(self.g, size)}: it does not divide by the world "
                        f"size {self.world}{self.where}",
                        help=_ranks_help(size),
                    )
                attrs = dict(s.attributes, shape=list(self.local(out_shape, r)))
                return self.out(s, [x], r, attrs)
            if math.prod(out_shape[: r + 1]) > before:
                break
        return self.replicated(s)

    def _transpose(self, s: Step) -> Step:
        x = s.operands[0]
        a = self.axis_of(x)
        if a is _UNDECIDED or a is None:
            return self.replicated(s)
        return self.out(s, [x], list(s.attributes["perm"]).index(a))

    def _broadcast(self, s: Step) -> Step:
        x = s.operands[0]
        a = self.axis_of(x)
        if a is _UNDECIDED or a is None or self.gshape(x)[a] == 1:
            return self.replicated(s)
        attrs = dict(s.attributes, shape=list(self.local(tuple(s.attributes["shape"]), a)))
        return self.out(s, [x], a, attrs)

    def _slice(self, s: Step) -> Step:
        x = s.operands[0]
        a = self.axis_of(x)
        shape = self.gshape(x)
        if (
            a is _UNDECIDED
            or a is None
            or s.attributes["starts"][a] != 0
            or s.attributes["limits"][a] != shape[a]
        ):
            return self.replicated(s)
        starts, limits = list(s.attributes["starts"]), list(s.attributes["limits"])
        limits[a] //= self.world
        return self.out(s, [x], a, dict(s.attributes, starts=starts, limits=limits))

    def _reduce(self, s: Step) -> Step:
        x = s.operands[0]
        a = self.axis_of(x)
        if a is _UNDECIDED or a is None:
            return self.replicated(s)
        axes = list(s.attributes["axes"])
        keep = len(self.g.values[s.results[0]].shape) == len(self.gshape(x))
        if a not in axes:
            return self.out(s, [x], a if keep else a - sum(1 for b in axes if b < a))
        if s.attributes["kind"] in ("sum", "max", "min"):
            return self.partial(s, [x], s.attributes["kind"])
        return self.replicated(s)

    def _contract(self, s: Step) -> Step:
        spec = s.attributes["spec"]
        ins, result = spec.split("->")
        letters = ins.split(",")
        ops = list(s.operands)
        call = self.innermost[self.index]
        if (
            call is not None
            and call.callee in LINEARS
            and len(ops) == 2
            and ops[1].startswith("@")
            and self.axis_of(ops[1]) is _UNDECIDED
            and self.axis_of(ops[0]) is None
            and call.index not in self.keep
        ):
            w = ops[1]
            out_letter = next(ch for ch in letters[1] if ch in result)
            axis = letters[1].index(out_letter)
            if self.gshape(w)[axis] < self.world:
                # Fewer output features than ranks (Qwen2-MoE's one-output shared expert
                # gate): nothing to split, so the weight stays whole on every rank.
                self.decide(w[1:], None)
            else:
                # Column-parallel: the weight split along its output features.
                self.step_origin = frozenset({call.index})
                self.divides(self.gshape(w)[axis], f"the output features of linear `{call.path}`")
                self.decide(w[1:], axis)
        chosen = None
        for o, lt in zip(ops, letters):
            a = self.axis_of(o)
            if a is not _UNDECIDED and a is not None:
                chosen = lt[a]
                break
        if chosen is None:
            return self.replicated(s)
        new_ops = [
            self.need(o, lt.index(chosen) if chosen in lt else None) for o, lt in zip(ops, letters)
        ]
        if chosen in result:
            return self.out(s, new_ops, result.index(chosen))
        return self.partial(s, new_ops)

    def _take(self, s: Step) -> Step:
        x, idx = s.operands
        axis = s.attributes["axis"]
        ax, ai = self.axis_of(x), self.axis_of(idx)
        call = self.innermost[self.index]
        if ax is _UNDECIDED and ai is None and call is not None and call.callee in EMBEDDINGS:
            self.divides(self.gshape(x)[axis], f"the table of embedding `{call.path}`")
            self.decide(x[1:], axis)
            ax = axis
        if ax is _UNDECIDED:
            self.decide(x[1:], None)
            ax = None
        irank = len(self.gshape(idx))
        if ax == axis and ai is None:
            # Vocab-parallel: this rank holds rows offset.. of the table; it reads those of
            # its ids (zero for the others) and the all-reduce adds the ranks' rows up. Rank 0
            # subtracts 0 too: every rank's graph has the same steps, so its slices are of
            # the same kinds (one generated function per layer on every rank).
            size = self.gshape(x)[axis] // self.world
            dtype = self.dtype(idx)
            off = self.emit(
                self.pre,
                "constant",
                [],
                {"value": self.rank * size, "dtype": dtype},
                (),
                dtype,
                "offset",
                None,
                (),
            )
            shifted = self.emit(
                self.pre,
                "sub",
                [idx, off],
                {},
                self.gshape(idx),
                dtype,
                idx.lstrip("%@"),
                None,
                self.gshape(idx),
            )
            self.rewritten = True
            return self.partial(s, [x, shifted], "sum", dict(s.attributes, bounds="zero"))
        if ax is not None and ax != axis and ai is None:
            return self.out(s, [x, idx], ax if ax < axis else ax - 1 + irank)
        if ai is not None and ax is None:
            return self.out(s, [x, idx], axis + ai)
        return self.replicated(s)

    def _gather(self, s: Step) -> Step:
        x, *idx = s.operands
        ax = self.axis_of(x)
        if ax is _UNDECIDED:
            self.decide(x[1:], None)
            ax = None
        k = len(idx)
        if ax is not None and ax >= k and all(self.axis_of(i) is None for i in idx):
            br = len(self.g.values[s.results[0]].shape) - (len(self.gshape(x)) - k)
            return self.out(s, [x, *idx], br + ax - k)
        return self.replicated(s)

    def _scatter(self, s: Step) -> Step:
        state, value, *idx = s.operands
        path = state[1:]
        k = len(idx)
        br = len(self.gshape(value)) - (len(self.gshape(state)) - k)
        av, have = self.axis_of(value), self.layout.get(path, _UNDECIDED)
        if have is _UNDECIDED:
            self.decide(path, None if av is None or av < br else k + av - br)
            have = self.layout[path]
        if have is not None and have < k:
            raise coded_error(
                "E0961",
                f"state `{path}` is split along axis {have}, which `{s.op}` indexes{self.where}",
                help="this layout is not supported yet: leave tensor parallelism "
                "off for this model",
            )
        ops = [
            state,
            self.need(value, None if have is None else br + have - k),
            *(self.need(i, None) for i in idx),
        ]
        return Step(s.op, ops, [], dict(s.attributes), s.loc)

    # ------------------------------------------------------------ the result
    def assemble(self, groups: list, tail: list[Step], outputs: list[str]) -> Sharding:
        steps: list[Step] = []
        first: list[int] = []  # where old step i's group starts in the new list
        own: list[int] = []  # where old step i itself is
        end: list[int] = []  # after old step i's all-reduces
        changed: list[bool] = []  # the group holds a conversion or a rewrite
        for pre, new, post, rewritten in groups:
            first.append(len(steps))
            steps.extend(pre)
            own.append(len(steps))
            steps.append(new)
            steps.extend(post)
            end.append(len(steps))
            changed.append(bool(pre) or rewritten)
        steps.extend(tail)
        n_old = len(self.g.steps)
        calls = []
        for c in self.g.calls:
            if c.start >= c.stop:
                at = first[c.start] if c.start < n_old else len(steps)
                calls.append(_moved(c, at, at))
                continue
            inner = range(c.start, c.stop)
            if c.kind == "op":
                # A std op whose body the pass changed inside (a conversion before one of
                # its steps, a collective between them, a rewritten gather) is no longer
                # that op on the rank's operands: its steps stay, the call goes, so no fast
                # path or backend replaces them by the op.
                if any(changed[i] for i in inner) or any(
                    end[i] > own[i] + 1 for i in range(c.start, c.stop - 1)
                ):
                    continue
                calls.append(_moved(c, own[c.start], own[c.stop - 1] + 1))
            else:
                stop = len(steps) if c.stop == n_old and c.kind == "entry" else end[c.stop - 1]
                calls.append(_moved(c, first[c.start], stop))
        g = self.g
        values = {}
        for v, vt in self.values.items():
            values[v] = vt
        graph = Graph(
            entry=g.entry,
            model=g.model,
            inputs=list(g.inputs),
            outputs=outputs,
            steps=steps,
            calls=calls,
            values=values,
            parameters={
                p: ValueType(self.local(vt.shape, _axis(self.layout, p)), vt.dtype)
                for p, vt in g.parameters.items()
            },
            states={
                p: ValueType(self.local(vt.shape, _axis(self.layout, p)), vt.dtype)
                for p, vt in g.states.items()
            },
            dims=dict(g.dims),
            dtypes=dict(g.dtypes),
            config=dict(g.config, tensor_parallel={"world": self.world, "rank": self.rank}),
            sources=dict(g.sources),
        )
        return Sharding(
            graph,
            g,
            self.world,
            self.rank,
            {
                p: a
                for p, a in self.layout.items()
                if a is not None and a is not _UNDECIDED and p in g.parameters
            },
            {
                p: a
                for p, a in self.layout.items()
                if a is not None and a is not _UNDECIDED and p in g.states
            },
        )


ShardRule = Callable[[_Pass, Step], Step]

SHARD_RULES: dict[str, ShardRule] = {
    # Elementwise steps keep the split of their split operand (the others are cut to match).
    **{
        name: _Pass.elementwise
        for name, p in PRIMITIVES.items()
        if p.category is Category.ELEMENTWISE
    },
    # A `convert` may carry the all-reduce deferred from its linear's partial sum.
    "convert": _Pass._convert,
    "constant": _Pass._constant,
    "iota": _Pass._constant,
    "reshape": _Pass._reshape,
    "transpose": _Pass._transpose,
    "broadcast": _Pass._broadcast,
    "slice": _Pass._slice,
    "reduce": _Pass._reduce,
    "contract": _Pass._contract,
    "take": _Pass._take,
    "gather": _Pass._gather,
    "scatter": _Pass._scatter,
    # Made by the reverse pass, which never runs on a rank's graph: its operands are
    # gathered whole, and so is its result.
    "scatter_add": _Pass.replicated,
    # Only this pass makes collectives, once; a graph holding one already is a rank's graph,
    # whose values are whole on every rank.
    "all_reduce": _Pass.replicated,
    "all_gather": _Pass.replicated,
}
"""How each primitive's step is rewritten for one rank (see the module docstring): a
function of the pass and the step, returning the rank's step (the pass records the
conversions it needs before and after it). ``tests/test_coverage.py`` checks every primitive
has one."""


def one_process(step: Step, target: str) -> LinnetError:
    """E0963: a collective step reached ``target``, which runs one process (the JAX
    emitter, the reverse pass): only the PyTorch runtime runs a rank's graph.

    >>> one_process(Step("all_reduce", ["%x"], ["%y"]), "generated JAX").diagnostics[0].code
    'E0963'
    """
    return coded_error(
        "E0963",
        f"`{step.op}` at {step.loc or '?'} communicates between the ranks of "
        f"a tensor-parallel graph, and {target} runs one process",
        help="run the rank's graph with linnet.torch (load(..., world=N), "
        "docs/parallel.md), or shard nothing (world=1) for this target",
    )


def _ranks_help(size: int) -> str:
    """The help of E0960: the world sizes that divide ``size``.

    >>> _ranks_help(6)
    'run on a number of ranks that divides 6 (1, 2, 3, 6), or leave tensor parallelism off'
    """
    ok = ", ".join(str(d) for d in range(1, size + 1) if size % d == 0)
    return f"run on a number of ranks that divides {size} ({ok}), or leave tensor parallelism off"


def _axis(layout: dict[str, Any], path: str) -> int | None:
    a = layout.get(path)
    return None if a is _UNDECIDED else a


def _moved(c: Call, start: int, stop: int) -> Call:
    return Call(
        c.callee,
        c.kind,
        start,
        stop,
        c.index,
        c.path,
        c.depth,
        c.loc,
        dict(c.attributes),
        c.iteration,
        c.repeated,
    )


def shard(graph: Graph, world: int, rank: int) -> Sharding:
    """Rank ``rank``'s graph of ``graph`` split over ``world`` ranks (module docstring).

    ``world`` 1 returns the graph as it is (nothing split, no collective).

    >>> shard(Graph("e", "m"), 1, 0).parameters
    {}
    """
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise coded_error(
            "E0962",
            f"the world size must be a positive int, not {world!r}",
            help="e.g. load(..., world=2) for two ranks",
        )
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world:
        raise coded_error(
            "E0962",
            f"rank {rank!r} is not in 0..{world - 1}",
            help="the rank comes from torch.distributed.get_rank()",
        )
    if world == 1:
        return Sharding(graph, graph, 1, 0)
    keep: frozenset[int] = frozenset()
    while True:  # each run keeps more linears replicated: at most one run per linear
        p = _Pass(graph, world, rank, keep)
        out = p.run()
        if not p.bad - keep:
            break
        keep |= p.bad
    from linnet.lang.ir.verify import verify

    verify(out.graph, "sharding")
    return out
