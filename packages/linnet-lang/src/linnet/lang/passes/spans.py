"""Span ops, the graph side: finding where a span op's body stands in a lowered graph
(:func:`find_matches`), the state writes a claimed kernel can do itself
(:func:`state_writes`) and how a fused span op composes two span ops (:class:`Fusion`).
Everything here reads the graph alone; lowering a span op's body into a :class:`Pattern`,
confirming a match at its own shapes and recording the claims is the lowering-time pass
:mod:`linnet.lang.check.spans` (which reads the program).

Matching works at the level a user writes: an op call is one node (compared by callee; its
own steps are the callee's body), every step outside op calls is a node (compared by
primitive and attributes).

>>> from linnet.lang.ir.graph import Graph, Step, ValueType
>>> g = Graph("e", "m", inputs=["%x"], outputs=["%y"], values={
...     "%x": ValueType((2,), "f32"), "%y": ValueType((2,), "f32")})
>>> g.steps.append(Step("neg", ["%x"], ["%y"]))
>>> [(n.kind, n.key) for n in graph_nodes(g)], closed(g, 0, 1, ["%y"])
([('step', 'neg')], True)
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.ir.graph import Call, Graph
from linnet.lang.ir.stepsets import read_outside

# Scalar parameters take these values in the sample lowering, so that a literal in the
# body can be told apart from a parameter: distinct, exact in binary, unlikely constants.
_SENTINELS = (0.3828125, 0.6171875, 0.8671875, 1.1328125, 1.3671875, 1.6171875)


@dataclass
class Node:
    """One op call (``kind == "call"``, ``key`` its callee) or one step outside op calls
    (``kind == "step"``, ``key`` its primitive) of a graph."""

    kind: str
    key: str
    inputs: list[Any]
    outputs: list[Any]
    start: int
    stop: int
    attributes: dict[str, Any] = field(default_factory=dict)
    call: Call | None = None


@dataclass
class Pattern:
    """A span op's body as nodes, from one lowering (check/spans.py): ``params`` are its
    parameters' refs in that lowering (tensors) or sentinel values (scalars), in the op's
    order."""

    name: str  # the span op's qualified name
    params: list[Any]
    scalars: dict[int, Any]  # param position -> sentinel value
    results: list[Any]
    nodes: list[Node]
    producers: dict[Any, Node]


WITH_ROWS = "std.nn.decode::with_rows"


@dataclass
class Fusion:
    """How a fused span op composes two span ops, read from its body (:func:`_fusion_of`):
    ``first`` (called first), then `with_rows` of some of its results into states, then
    ``last`` on those states (and reshapes of its other results).

    ``writes``: per `with_rows` call, (the fused op's cache parameter, its positions
    parameter, the index of ``first``'s result written, the index of ``last``'s argument
    that reads the state). ``params``: per other parameter of the fused op, (the index of
    ``first``'s argument it is, or None; the index of ``last``'s, or None). The fused op
    returns ``last``'s results, then the rows written, in ``writes``' order."""

    first: str
    last: str
    writes: list[tuple[int, int, int, int]]
    params: dict[int, tuple[int | None, int | None]]


def _fusion_of(pat: Pattern) -> Fusion | None:
    """The :class:`Fusion` a fused span op's body (its pattern) describes, or None."""
    calls = [n for n in pat.nodes if n.kind == "call"]
    if len(calls) < 3:
        return None
    first, middle, last = calls[0], calls[1:-1], calls[-1]
    if first.key == WITH_ROWS or last.key == WITH_ROWS or any(n.key != WITH_ROWS for n in middle):
        return None
    index = {ref: k for k, ref in enumerate(pat.params) if isinstance(ref, str)}
    writes = []
    for n in middle:
        cache, at, rows = n.inputs
        if (
            cache not in index
            or at not in index
            or rows not in first.outputs
            or n.outputs[0] not in last.inputs
        ):
            return None
        writes.append(
            (index[cache], index[at], first.outputs.index(rows), last.inputs.index(n.outputs[0]))
        )
    caches = {w[0] for w in writes}
    params: dict[int, tuple[int | None, int | None]] = {}
    for k, ref in enumerate(pat.params):
        if k in caches:
            continue
        i = next((j for j, x in enumerate(first.inputs) if _same_ref(x, ref)), None)
        p = next((j for j, x in enumerate(last.inputs) if _same_ref(x, ref)), None)
        if i is None and p is None:
            return None
        params[k] = (i, p)
    # Results: `last`'s, then the rows written, in order.
    rows = [first.outputs[w[2]] for w in writes]
    if list(pat.results) != [*last.outputs, *rows]:
        return None
    return Fusion(first.key, last.key, writes, params)


# ---------------------------------------------------------------- nodes of a graph
def graph_nodes(
    graph: Graph, lo: int = 0, hi: int | None = None, skip: Call | None = None
) -> list[Node]:
    """The nodes of steps ``lo..hi``: outermost op calls there (span calls and ``skip``
    left out), and the steps outside them, in step order."""
    hi = len(graph.steps) if hi is None else hi
    calls = [
        c
        for c in graph.calls
        if c.kind == "op"
        and c is not skip
        and not c.attributes.get("span")
        and lo <= c.start < c.stop <= hi
    ]
    outer = [
        c
        for c in calls
        if not any(
            o is not c
            and o.start <= c.start
            and c.stop <= o.stop
            and (o.start, -o.stop, o.index) < (c.start, -c.stop, c.index)
            for o in calls
        )
    ]
    covered: dict[int, Call] = {}
    for c in outer:
        for i in range(c.start, c.stop):
            covered.setdefault(i, c)
    out: list[Node] = []
    i = lo
    while i < hi:
        here = covered.get(i)
        if here is not None:
            attrs = here.attributes
            out.append(
                Node(
                    "call",
                    here.callee,
                    list(attrs.get("args") or []),
                    list(attrs.get("results") or []),
                    here.start,
                    here.stop,
                    call=here,
                )
            )
            i = here.stop
            continue
        s = graph.steps[i]
        out.append(
            Node("step", s.op, list(s.operands), list(s.results), i, i + 1, dict(s.attributes))
        )
        i += 1
    return out


def _producers(nodes: Iterable[Node]) -> dict[Any, Node]:
    out: dict[Any, Node] = {}
    for n in nodes:
        for r in n.outputs:
            if isinstance(r, str):
                out[r] = n
    return out


# ---------------------------------------------------------------- matching
class _Unify:
    """Pattern nodes against graph nodes, backwards from the results: each pattern node to
    one graph node of the same callee (or primitive), each parameter to one graph value."""

    def __init__(self, pat: Pattern, producers: dict[Any, Node], strict: bool):
        self.pat = pat
        self.producers = producers
        self.strict = strict
        self.nodes: dict[int, Node] = {}  # id(pattern node) -> graph node
        self.used: set[int] = set()  # id(graph node)
        self.params: dict[int, Any] = {}  # param position -> graph ref or literal

    def value(self, pv: Any, gv: Any) -> bool:
        pat = self.pat
        for k, p in enumerate(pat.params):
            if k in pat.scalars:
                if not isinstance(pv, str) and pv == p and not isinstance(gv, str):
                    return self.bind(k, gv)
            elif isinstance(pv, str) and pv == p:
                return self.bind(k, gv)
        if not isinstance(pv, str):  # a literal of the body
            return not isinstance(gv, str) and _same_literal(pv, gv)
        pn = pat.producers.get(pv)
        if pn is None:
            return False  # a value of the sample's own (cannot happen): no match
        if not isinstance(gv, str):
            return False
        gn = self.producers.get(gv)
        if gn is None or not self.node(pn, gn):
            return False
        return pn.outputs.index(pv) == gn.outputs.index(gv)

    def bind(self, k: int, gv: Any) -> bool:
        if k in self.params:
            return _same_ref(self.params[k], gv)
        self.params[k] = gv
        return True

    def node(self, pn: Node, gn: Node) -> bool:
        seen = self.nodes.get(id(pn))
        if seen is not None:
            return seen is gn
        if (
            id(gn) in self.used
            or pn.kind != gn.kind
            or pn.key != gn.key
            or len(pn.inputs) != len(gn.inputs)
            or len(pn.outputs) != len(gn.outputs)
        ):
            return False
        if pn.kind == "step" and not self.same_attributes(pn, gn):
            return False
        self.nodes[id(pn)] = gn
        self.used.add(id(gn))
        return all(self.value(pv, gv) for pv, gv in zip(pn.inputs, gn.inputs))

    def same_attributes(self, pn: Node, gn: Node) -> bool:
        if self.strict:
            return _canon(pn.attributes) == _canon(gn.attributes)
        # At the sample's shapes only what does not scale with them can be compared.
        keys = {k for k in pn.attributes if k in ("fn", "dtype", "kind", "op")}
        if pn.key == "constant" and any(pn.attributes.get("value") == s for s in _SENTINELS):
            return True
        if pn.key == "constant":
            keys.add("value")
        return all(_canon(pn.attributes.get(k)) == _canon(gn.attributes.get(k)) for k in keys)


def _same_literal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def _same_ref(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return _same_literal(a, b)


def _canon(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _canon(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(_canon(x) for x in v)
    return v


@dataclass
class NodeIndex:
    """A graph's nodes with what matching looks up in them, made once for every span op's
    pattern that a claim matches against them (:func:`node_index`)."""

    nodes: list[Node]
    producers: dict[Any, Node]
    by_key: dict[tuple[Any, Any], list[Node]]
    users: dict[str, list[Node]]


def node_index(nodes: list[Node]) -> NodeIndex:
    """``nodes`` indexed by the values they make and read and by (kind, key)."""
    return NodeIndex(nodes, _producers(nodes), _by_key(nodes), _users(nodes))


def find_matches(
    graph: Graph, pat: Pattern, nodes: list[Node] | NodeIndex | None = None
) -> list[tuple[_Unify, list[Node]]]:
    """Every place where ``pat`` stands in ``graph``, at the sample's level of detail: the
    unification and the graph nodes of each result, result 0 anchoring the search.
    ``nodes``: the graph's nodes (:func:`graph_nodes`), or their :func:`node_index`, which a
    caller matching many patterns makes once."""
    index = (
        nodes
        if isinstance(nodes, NodeIndex)
        else node_index(graph_nodes(graph) if nodes is None else nodes)
    )
    producers, by_key, users = index.producers, index.by_key, index.users
    first = pat.producers.get(pat.results[0]) if pat.results else None
    if first is None:
        return []
    out = []
    for gn in by_key.get((first.kind, first.key), ()):
        u = _Unify(pat, producers, strict=False)
        gv = gn.outputs[first.outputs.index(pat.results[0])]
        if not u.value(pat.results[0], gv):
            continue
        results = [gv]
        ok = True
        for pr in pat.results[1:]:
            found = _other_result(pat, u, pr, by_key, users)
            if found is None:
                ok = False
                break
            results.append(found)
        if ok and len(u.nodes) == len(pat.nodes):
            out.append((u, results))
    return out


def _by_key(nodes: list[Node]) -> dict[tuple[Any, Any], list[Node]]:
    """``nodes`` grouped by (kind, key), each group in the list's order."""
    grouped: dict[tuple[Any, Any], list[Node]] = {}
    for gn in nodes:
        grouped.setdefault((gn.kind, gn.key), []).append(gn)
    return grouped


def _users(nodes: list[Node]) -> dict[str, list[Node]]:
    """Each graph value's readers among ``nodes``, each once, in the list's order."""
    out: dict[str, list[Node]] = {}
    for gn in nodes:
        for v in gn.inputs:
            if isinstance(v, str):
                readers = out.setdefault(v, [])
                if not readers or readers[-1] is not gn:
                    readers.append(gn)
    return out


def _bound_input(pat: Pattern, u: _Unify, pn: Node) -> str | None:
    """A graph value that a node unified with ``pn`` must read, from the bindings so far: an
    input of ``pn`` that is a bound tensor parameter or a result of a pattern node already
    matched; None where no input of ``pn`` is bound yet."""
    for pv in pn.inputs:
        if not isinstance(pv, str):
            continue
        for k, p in enumerate(pat.params):
            if k not in pat.scalars and pv == p:
                bound = u.params.get(k)
                if isinstance(bound, str):
                    return bound
                break
        else:
            producer = pat.producers.get(pv)
            gn = u.nodes.get(id(producer)) if producer is not None else None
            if gn is not None:
                out = gn.outputs[producer.outputs.index(pv)]  # type: ignore[union-attr]
                if isinstance(out, str):
                    return out
    return None


def _other_result(
    pat: Pattern,
    u: _Unify,
    pr: Any,
    by_key: dict[tuple[Any, Any], list[Node]],
    users: dict[str, list[Node]],
) -> Any:
    """The graph value of a further result: the first graph node that unifies with its
    producer under the bindings so far (a copy is tried on each). Where an input of the
    producer is bound already (q, k and v's products read the one norm's output), only the
    readers of that value are tried, in the graph's order: any other node would fail to
    unify on that input, so the first match is the same, without trying every node of the
    graph of the producer's kind (every `linear` call of 32 layers)."""
    pn = pat.producers.get(pr)
    if pn is None:
        return None
    if id(pn) in u.nodes:
        gn = u.nodes[id(pn)]
        return gn.outputs[pn.outputs.index(pr)]
    candidates: Iterable[Node] = by_key.get((pn.kind, pn.key), ())
    bound = _bound_input(pat, u, pn)
    if bound is not None:
        candidates = [gn for gn in users.get(bound, ()) if gn.kind == pn.kind and gn.key == pn.key]
    for gn in candidates:
        if id(gn) in u.used:
            continue
        trial = copy.copy(u)
        trial.nodes, trial.used, trial.params = dict(u.nodes), set(u.used), dict(u.params)
        gv = gn.outputs[pn.outputs.index(pr)]
        if trial.value(pr, gv):
            u.nodes, u.used, u.params = trial.nodes, trial.used, trial.params
            return gv
    return None


def closed(graph: Graph, lo: int, hi: int, results: list[Any]) -> bool:
    """Nothing the steps ``lo..hi`` make is read after them, or is an output of the
    graph, except ``results``."""
    keep = {r for r in results if isinstance(r, str)}
    made = {r for s in graph.steps[lo:hi] for r in s.results}
    inner = made - keep
    if inner & set(graph.outputs):
        return False
    return not read_outside(graph, inner, lo, hi)


def state_writes(
    graph: Graph,
    call: Call,
    producers: dict[str, int] | None = None,
    users: dict[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """The state writes a kernel call's launch can do itself: the `scatter` steps right
    after it that write a result of the call, and nothing else reads, into a state at
    ``[b, at[b]]`` for every row ``b`` of the result (``self.k[b, pos[b], h, d] = k_rot[b,
    h, d]``, a decode step's cache write), or at ``[page[b], at[b]]`` with ``page`` made
    before the call (``self.k_pages[page[b], slot[b], h, d] = k_rot[b, h, d]``, a paged
    cache's). Each is ``{"result": position among the call's results, "state": the state's
    ref, "at": the positions' ref, "page": the pages' ref (None for a dense cache),
    "pages": the state's first axis, "step": the scatter's step, "positions": the state's
    second axis}``; none where the call has no kernel, a result would be left for nothing,
    or the steps are not of that form. A call over the call's steps and these (its written
    results left out of its results, ``writes`` set) is a second claim: its kernel stores
    those results into the state (``ir/tiles.py``'s
    :func:`~linnet.lang.ir.tiles.redirect_stores`), and a planner times it beside the first.
    """
    a = call.attributes
    if (
        call.kind != "op"
        or not a.get("kernel")
        or not a.get("kernel_applies")
        or a.get("writes")
        or call.stop <= call.start
    ):
        return []
    results = list(a.get("results") or [])
    if any(not isinstance(r, str) for r in results):
        return []
    producers = graph.producers() if producers is None else producers
    users = graph.users() if users is None else users
    out: list[dict[str, Any]] = []
    between: list[int] = []  # steps making the writes' indices (an iota of the rows)
    i = call.stop
    while i < len(graph.steps) and graph.steps[i].op in ("scatter", *_INDEX_STEPS):
        step = graph.steps[i]
        if step.op != "scatter":
            between.append(i)
            i += 1
            continue
        if len(step.operands) != 4 or step.attributes.get("indexed_axes") != 2:
            break
        state, value, rows, at = step.operands
        if value not in results or any(w["result"] == results.index(value) for w in out):
            break
        vt, st = graph.values.get(value), graph.states.get(state[1:])
        at_t = graph.values.get(at)
        rows_step = producers.get(rows)
        if vt is None or st is None or at_t is None:
            break
        if call.start <= producers.get(at, -1) < call.stop:
            break  # made by the steps the kernel replaces: not there at its launch
        n = vt.shape[0] if vt.shape else None
        if not (
            tuple(at_t.shape) == (n,)
            and at_t.dtype == "i32"
            and len(st.shape) == len(vt.shape) + 1
            and tuple(st.shape[2:]) == tuple(vt.shape[1:])
            and st.dtype == vt.dtype
        ):
            break
        r = graph.steps[rows_step] if rows_step is not None else None
        page: str | None = None
        if r is not None and r.op == "iota":  # row b of the state: a dense cache
            if not (
                list(r.attributes.get("shape", [])) == [n]
                and r.attributes.get("axis") == 0
                and st.shape[0] == n
            ):
                break
        else:  # a page of the state made before the call (or an input): a paged cache
            rows_t = graph.values.get(rows)
            if (
                rows_t is None
                or tuple(rows_t.shape) != (n,)
                or rows_t.dtype != "i32"
                or (rows_step is not None and rows_step >= call.start)
            ):
                break
            page = rows
        if value in graph.outputs or set(users.get(value, [])) != {i}:
            break  # another step reads the result: it is still needed
        out.append(
            {
                "result": results.index(value),
                "state": state,
                "at": at,
                "page": page,
                "pages": st.shape[0],
                "step": i,
                "positions": st.shape[1],
            }
        )
        i += 1
    if not out or len(out) == len(results):
        return []  # a launch with no result left: not written (nothing measured needs it)
    # What the index steps claimed with the writes make is read by those writes alone.
    last = max(w["step"] for w in out)
    for j in between:
        if j < last and any(
            r in graph.outputs or any(not j < u <= last for u in users.get(r, []))
            for r in graph.steps[j].results
        ):
            return []
    return out


# Steps that may stand between a call and its state writes: they make the writes' indices.
_INDEX_STEPS = ("iota", "constant", "broadcast", "reshape", "convert")


def _common_path(paths: list[str]) -> str:
    if not paths:
        return ""
    parts = [p.split(".") for p in paths]
    common = []
    for segs in zip(*parts):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return ".".join(common)


__all__ = [
    "WITH_ROWS",
    "Fusion",
    "Node",
    "NodeIndex",
    "Pattern",
    "closed",
    "find_matches",
    "graph_nodes",
    "node_index",
    "state_writes",
]
