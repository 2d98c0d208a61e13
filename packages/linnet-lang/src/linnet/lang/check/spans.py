"""Span ops, the lowering-time pass that claims them (it lowers their bodies; the graph
side, matching, is :mod:`linnet.lang.passes.spans`): an op whose body composes other op
calls and whose kernel runs them as one.

``rms_norm_linear(x, nw, eps, w)`` in std has the body ``linear(rms_norm(x, nw, eps), w)``
and a kernel that computes both in one launch. A model never calls it: it calls `rms_norm`
and then `linear`, as it always did. :func:`claim_spans` finds, in a lowered graph, every run
of steps that computes what a span op's body computes (the same op calls, wired the same
way, with nothing in between and no value of the run used outside it except what the span
op returns) and records it as a call of the span op over those steps. The recorded call
carries the span op's kernel binding, so the emitters launch its kernel there exactly as for
any bound op (``emit/torch.py``'s ``kernel_launch`` prefers the longest bound call starting
at a step), and the planner offers it as a candidate region measured against the steps'
own code (``linnet.torch.planned``). The op bodies stay the definition: a span op's body is
the composition, and `linnet kernels` checks its kernel against that body.

Matching works at the level a user writes: an op call is one node (compared by callee; its
own steps are the callee's body), every step outside op calls is a node (compared by
primitive and attributes). A span op's pattern comes from its body lowered once at small
sample shapes; each match is then confirmed by lowering the span op again at the matched
values' own shapes and scalars, comparing node by node with attributes, and taking the
kernel binding (its generics, its `where` clause) from that lowering.

A claim whose results a decode step writes into states right after it is claimed a second
time with those writes (:func:`state_writes`: its kernel stores them). A *fused* span op
composes two span ops with the writes between them: its body calls the first, then
``with_rows(cache, at, rows)`` (std.nn.decode: the state with the rows written, as a value)
for each write, then the second on those caches (`rms_norm_qkv_rope_attention`: the attention
input, the KV-cache writes, the attention). No pattern can match it, since a model writes
states rather than calling ``with_rows``; :meth:`Spans.fuse` claims it over a claim of the
first with its writes, the reshapes after it and a claim of the second that reads the
written states at the written positions.

>>> # graph = claim_spans(graph, program)   # graph.calls gains the span calls it found
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.kernel_cases import (
    ENTRY,
    MODEL,
    KernelCase,
    sample_cases,
    std_program,
    wrapper_program,
)
from linnet.lang.check.lowering import lower
from linnet.lang.diagnostics.core import LinnetError
from linnet.lang.ir.graph import KERNEL_ATTRIBUTES, Call, Graph, ValueType
from linnet.lang.ir.stepsets import indexed
from linnet.lang.passes.spans import (
    _SENTINELS,
    WITH_ROWS,
    Fusion,
    Pattern,
    _common_path,
    _fusion_of,
    _producers,
    _same_ref,
    _Unify,
    closed,
    find_matches,
    graph_nodes,
    node_index,
    state_writes,
)
from linnet.lang.syntax.program import Program


@dataclass
class SpanMatch:
    """Where a span op's body stands in a graph: the steps, and the graph values bound to
    the op's parameters (refs, or literals for scalars) and results."""

    op: A.FuncDecl
    start: int
    stop: int
    args: list[Any]
    results: list[Any]
    calls: list[Call]
    binding: dict[str, Any] = field(default_factory=dict)  # the kernel's, once confirmed


# The std op whose call in a fused span op's body stands for a state write (a decode
# step's cache write) read after it: `with_rows(cache, at, rows)`, the cache with rows
# written at `at` (std.nn.decode).
# ---------------------------------------------------------------- span ops and patterns
def span_ops(program: Program) -> list[A.FuncDecl]:
    """The ops of ``program`` that are span ops: bound to a kernel, with a body that calls
    at least one other op."""
    out = []
    for module in program.modules.values():
        for item in module.items:
            if (
                isinstance(item, A.FuncDecl)
                and item.kind == "op"
                and item.kernel is not None
                and _calls_an_op(item, program)
            ):
                out.append(item)
    return out


def _calls_an_op(decl: A.FuncDecl, program: Program) -> bool:
    return bool(_called(decl, program))


def _called(decl: A.FuncDecl, program: Program) -> set[str]:
    """The qualified names of the ops ``decl``'s body calls by name."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, A.Call) and isinstance(node.callee, A.Name):
            names.add(node.callee.name)
        if isinstance(node, list | tuple):
            for x in node:
                walk(x)
        elif hasattr(node, "__dataclass_fields__"):
            for f in node.__dataclass_fields__:
                if f != "span":
                    walk(getattr(node, f))

    walk(decl.body)
    out = set()
    for name in names:
        target = _resolve(program, decl.module, name)
        if isinstance(target, A.FuncDecl) and target.kind == "op":
            out.add(target.qualified_name)
    return out


def _resolve(program: Program, module: A.Module | None, name: str) -> Any:
    if module is None:
        return None
    item = module.find(name)
    if item is not None:
        return item
    for use in module.items:
        if isinstance(use, A.Use) and name in [n for n, _ in use.names]:
            other = program.module(".".join(use.module))
            if other is not None:
                return other.find(name)
    return None


def pattern(program: Program, op: A.FuncDecl) -> Pattern | None:
    """``op``'s body as nodes, lowered at a small sample of its generics on which its
    kernel applies (None: no such sample, or the body does not lower)."""
    # Small dims first; an op whose `where` asks for more (a kernel for 33 to 64 rows) is
    # sampled up to 64.
    cases = sample_cases(program, op, count=1, seed=0, max_size=24) or sample_cases(
        program, op, count=1, seed=0, max_size=64
    )
    if not cases:
        return None
    case = cases[0]
    config = {}
    scalar_names = list(case.scalars)
    for k, name in enumerate(scalar_names[: len(_SENTINELS)]):
        config[name] = _SENTINELS[k] if case.scalars[name].startswith("f") else k + 3
    try:
        g = lower(
            wrapper_program(program, op, case),
            ENTRY,
            {n: list(s) for n, (s, _) in case.params.items()},
            config,
            model=MODEL,
            check=False,
        )
    except LinnetError:
        return None
    return _pattern_of(op, g, config)


def _pattern_of(op: A.FuncDecl, g: Graph, config: dict[str, Any]) -> Pattern | None:
    call = next((c for c in g.calls if c.callee == op.qualified_name), None)
    if call is None:
        return None
    params: list[Any] = []
    scalars: dict[int, Any] = {}
    args = list(call.attributes.get("args") or [])
    for k, p in enumerate(op.params):
        value = args[k] if k < len(args) else None
        if p.name in config:
            scalars[k] = config[p.name]
            params.append(config[p.name])
        else:
            params.append(value)
    nodes = graph_nodes(g, call.start, call.stop, skip=call)
    return Pattern(
        op.qualified_name,
        params,
        scalars,
        list(call.attributes.get("results") or []),
        nodes,
        _producers(nodes),
    )


# ---------------------------------------------------------------- confirming and claiming
class Spans:
    """The span ops of some programs, their patterns, and :meth:`claim` for graphs. One
    per process is enough (:func:`claim_spans` keeps one for the std library).

    ``base``: a :class:`Spans` (std's, :func:`std_spans`) whose patterns and confirmations
    are reused for the ops it holds (the same program, the same declaration), so that a
    user program's :class:`Spans` does not redo std's work; what it finds is the same."""

    def __init__(self, programs: list[Program], base: Spans | None = None):
        self.programs = programs
        self.base = base
        self.ops: list[tuple[Program, A.FuncDecl]] = []
        # Span ops whose bodies read a state after a write (`with_rows`): claimed over two
        # claims and the writes between them (:meth:`fuse`), not matched as patterns.
        self.fused: list[tuple[Program, A.FuncDecl]] = []
        seen: set[str] = set()
        for p in programs:
            for op in span_ops(p):
                if op.qualified_name not in seen:
                    seen.add(op.qualified_name)
                    (self.fused if WITH_ROWS in _called(op, p) else self.ops).append((p, op))
        self._patterns: dict[str, Pattern | None] = {}
        self._confirmed: dict[tuple, dict[str, Any] | None] = {}
        self._fusions: dict[str, Fusion | None] = {}

    def _owner(self, program: Program, op: A.FuncDecl) -> Spans:
        """The :class:`Spans` that keeps ``op``'s patterns and confirmations: the base's
        where it holds this very op of this very program, else this one."""
        base = self.base
        if base is not None and any(p is program and o is op for p, o in base.ops):
            return base._owner(program, op)
        return self

    def pattern(self, program: Program, op: A.FuncDecl) -> Pattern | None:
        owner = self._owner(program, op)
        if owner is not self:
            return owner.pattern(program, op)
        if op.qualified_name not in self._patterns:
            self._patterns[op.qualified_name] = pattern(program, op)
        return self._patterns[op.qualified_name]

    def matches(self, graph: Graph) -> list[SpanMatch]:
        """Every confirmed span of ``graph`` whose kernel applies, longest first where two
        start at one step."""
        nodes = node_index(graph_nodes(graph))  # made once for every op's pattern
        out: list[SpanMatch] = []
        seen: set[tuple[str, int, int]] = set()
        for program, op in self.ops:
            pat = self.pattern(program, op)
            if pat is None:
                continue
            for u, results in find_matches(graph, pat, nodes):
                got = list(u.nodes.values())
                lo, hi = min(n.start for n in got), max(n.stop for n in got)
                if sum(n.stop - n.start for n in got) != hi - lo:
                    continue  # other steps stand between: not one span
                if (op.qualified_name, lo, hi) in seen:
                    continue  # the same steps with the results matched in another order
                seen.add((op.qualified_name, lo, hi))
                if not closed(graph, lo, hi, results):
                    continue
                args = [u.params.get(k) for k in range(len(op.params))]
                if any(a is None for a in args):
                    continue
                m = SpanMatch(
                    op,
                    lo,
                    hi,
                    args,
                    results,
                    sorted((n.call for n in got if n.call is not None), key=lambda c: c.start),
                )
                binding = self.confirm(program, graph, m, pat)
                if binding is not None:
                    m.binding = binding
                    out.append(m)
        out.sort(key=lambda m: (m.start, m.start - m.stop))
        return out

    def confirm(
        self, program: Program, graph: Graph, m: SpanMatch, pat: Pattern
    ) -> dict[str, Any] | None:
        """Lower the span op at the match's own types and scalars; its kernel binding if
        the body is node for node what the graph has there and the kernel applies."""
        types = [
            graph.values.get(a) or graph.parameters.get(a[1:]) or graph.states.get(a[1:])
            if isinstance(a, str)
            else a
            for a in m.args
        ]
        outs = [graph.values.get(r) for r in m.results]
        if any(t is None for t in types) or any(t is None for t in outs):
            return None
        key = (m.op.qualified_name, repr(types), repr(outs))
        confirmed = self._owner(program, m.op)._confirmed
        if key not in confirmed:
            confirmed[key] = self._lower_at(program, m.op, types, outs)
        found = confirmed[key]
        if found is None:
            return None
        g2, binding = found["graph"], found["binding"]
        pat2 = _pattern_of(m.op, g2, found["config"])
        if pat2 is None:
            return None
        lo_nodes = graph_nodes(graph, m.start, m.stop)
        producers = _producers(lo_nodes)
        u = _Unify(pat2, producers, strict=True)
        if not all(u.value(pr, gr) for pr, gr in zip(pat2.results, m.results)):
            return None
        if len(u.nodes) != len(pat2.nodes) or any(
            not _same_ref(u.params.get(k), a) for k, a in enumerate(m.args) if k not in pat2.scalars
        ):
            return None
        return binding if binding.get("kernel_applies") else None

    def _lower_at(
        self, program: Program, op: A.FuncDecl, types: list[Any], outs: list[Any]
    ) -> dict[str, Any] | None:
        params: dict[str, tuple[tuple[int, ...], str]] = {}
        scalars: dict[str, str] = {}
        config: dict[str, Any] = {}
        for p, t in zip(op.params, types):
            if isinstance(t, ValueType):
                params[p.name] = (tuple(t.shape), t.dtype)
            else:
                kind = p.type.name if isinstance(p.type, A.ScalarType) else "f32"
                scalars[p.name] = kind
                config[p.name] = t
        case = KernelCase(
            op.qualified_name, "", {}, params, scalars, [(tuple(o.shape), o.dtype) for o in outs]
        )
        try:
            g = lower(
                wrapper_program(program, op, case),
                ENTRY,
                {n: list(s) for n, (s, _) in params.items()},
                config,
                model=MODEL,
                check=False,
            )
        except LinnetError:
            return None
        call = next((c for c in g.calls if c.callee == op.qualified_name), None)
        if call is None or not call.attributes.get("kernel"):
            return None
        binding = {k: call.attributes[k] for k in KERNEL_ATTRIBUTES if k in call.attributes}
        return {"graph": g, "binding": binding, "config": config}

    def program_for(self, program: Program) -> Program:
        """A copy of ``program`` that also holds the span ops' modules: what an emitter
        lowers a span op's kernel from (``program`` itself is left as it is)."""
        view = copy.copy(program)
        view.modules = dict(program.modules)
        for p in self.programs:
            for name, module in p.modules.items():
                view.modules.setdefault(name, module)
        return view

    def claim(self, graph: Graph) -> Graph:
        """A copy of ``graph`` with a call of each span op recorded where it stands (see
        the module docstring); ``graph`` itself is left as it is."""
        out = copy.copy(graph)
        out.calls = list(graph.calls)
        index = max((c.index for c in graph.calls), default=-1) + 1
        with indexed(graph):  # matching reads it whole for each candidate span
            found = self.matches(graph)
        for m in found:
            inner = [c for c in graph.calls if m.start <= c.start and c.stop <= m.stop]
            depth = min((c.depth for c in m.calls), default=0)
            paths = [c.path for c in m.calls if c.path]
            iters = {c.iteration for c in m.calls}
            repeated = {c.repeated for c in m.calls}
            out.calls.append(
                Call(
                    m.op.qualified_name,
                    "op",
                    m.start,
                    m.stop,
                    index,
                    _common_path(paths),
                    depth,
                    m.calls[0].loc if m.calls else "",
                    {
                        **m.binding,
                        "args": list(m.args),
                        "results": list(m.results),
                        "span": True,
                        "claims": [c.callee for c in m.calls],
                        "inner": len(inner),
                    },
                    iters.pop() if len(iters) == 1 else None,
                    repeated.pop() if len(repeated) == 1 else "",
                )
            )
            index += 1
        producers, users = out.producers(), out.users()
        for c in list(out.calls):
            writes = state_writes(out, c, producers, users)
            if writes:
                written = {w["result"] for w in writes}
                results = list(c.attributes.get("results") or [])
                out.calls.append(
                    Call(
                        c.callee,
                        "op",
                        c.start,
                        max(w["step"] for w in writes) + 1,
                        index,
                        c.path,
                        c.depth,
                        c.loc,
                        {
                            **c.attributes,
                            "results": [r for j, r in enumerate(results) if j not in written],
                            "writes": writes,
                            "span": True,
                            "claims": c.attributes.get("claims", [c.callee]),
                        },
                        c.iteration,
                        c.repeated,
                    )
                )
                index += 1
        for c in self.fuse(out, index):
            out.calls.append(c)
        return out

    def fusion(self, program: Program, op: A.FuncDecl) -> Fusion | None:
        """How the fused span op ``op`` composes two span ops (see :class:`Fusion`), read
        from its body lowered once; None where the body is not of that form."""
        owner = self._owner(program, op)
        if owner is not self:
            return owner.fusion(program, op)
        if op.qualified_name not in self._fusions:
            pat = self.pattern(program, op)
            self._fusions[op.qualified_name] = None if pat is None else _fusion_of(pat)
        return self._fusions[op.qualified_name]

    def fuse(self, graph: Graph, index: int) -> list[Call]:
        """Calls of the fused span ops over ``graph``'s claims: where a claim of ``first``
        with its state writes (:func:`state_writes`) is followed, after reshapes of its
        remaining results alone, by a claim of ``last`` that reads those states at the
        written positions, one call of the fused op spans both, the writes and the reshapes,
        with the first claim's writes (its last kernel stores the rows into the states, after
        every kernel before it has read them). ``index`` numbers the new calls."""
        if not self.fused:
            return []
        steps = graph.steps
        users = graph.users()
        starts: dict[int, list[Call]] = {}
        for c in graph.calls:
            if c.kind == "op" and c.attributes.get("span") and not c.attributes.get("writes"):
                starts.setdefault(c.start, []).append(c)
        out: list[Call] = []
        for program, op in self.fused:
            f = self.fusion(program, op)
            if f is None:
                continue
            for w in graph.calls:
                if w.callee != f.first or not w.attributes.get("writes"):
                    continue
                j = w.stop
                while j < len(steps) and steps[j].op == "reshape":
                    j += 1
                for a in starts.get(j, []):
                    if a.callee != f.last:
                        continue
                    call = self._fused_call(program, op, f, graph, w, a, users, index)
                    if call is not None:
                        out.append(call)
                        index += 1
        return out

    def _fused_call(
        self,
        program: Program,
        op: A.FuncDecl,
        f: Fusion,
        graph: Graph,
        w: Call,
        a: Call,
        users: dict[str, list[int]],
        index: int,
    ) -> Call | None:
        """The call of ``op`` over claim ``w`` (``f.first`` with writes), the reshapes after
        it and claim ``a`` (``f.last``), if the graph wires them as ``op``'s body does and its
        kernel applies at these shapes; else None."""
        wa, aa = list(w.attributes.get("args") or []), list(a.attributes.get("args") or [])
        writes = list(w.attributes.get("writes") or [])
        if any(x.get("page") for x in writes):
            return None  # a fused op's attention reads a dense cache at the written rows
        # The writes: each of the body's `with_rows` is one of the claim's, into the state
        # `last` reads there, at the positions the body names.
        args: dict[int, Any] = {}
        for cache, at, result, into in f.writes:
            found = [x for x in writes if x["result"] == result and x["state"] == aa[into]]
            if len(found) != 1:
                return None
            args[cache] = aa[into]
            args.setdefault(at, found[0]["at"])
            if not _same_ref(args[at], found[0]["at"]):
                return None
        if len(writes) != len(f.writes):
            return None
        for k, (i, p) in f.params.items():
            got = [wa[i]] if i is not None else []
            got += [aa[p]] if p is not None else []
            if k in args:
                got.append(args[k])
            if not got or any(not _same_ref(got[0], g) for g in got[1:]):
                return None
            args[k] = got[0]
        if sorted(args) != list(range(len(op.params))):
            return None
        # Between the claims: reshapes of `first`'s results alone, making `last`'s arguments
        # where the body reshapes them.
        kept = list(w.attributes.get("results") or [])
        made: set[str] = set()
        for j in range(w.stop, a.start):
            step = graph.steps[j]
            if len(step.operands) != 1 or step.operands[0] not in set(kept) | made:
                return None
            made.update(step.results)
            if any(not (w.stop < u < a.stop) for r in step.results for u in users.get(r, [])):
                return None
        results = list(a.attributes.get("results") or [])
        if not closed(graph, w.start, a.stop, results):
            return None
        types = [
            graph.values.get(x) or graph.parameters.get(x[1:]) or graph.states.get(x[1:])
            if isinstance(x, str)
            else x
            for x in (args[k] for k in range(len(op.params)))
        ]
        outs: list[Any] = [graph.values.get(r) for r in results]
        for x in writes:  # the rows written: one a sequence of the state
            state = graph.states.get(x["state"][1:])
            outs.append(
                None if state is None else ValueType(state.shape[:1] + state.shape[2:], state.dtype)
            )
        if any(t is None for t in types) or any(t is None for t in outs):
            return None
        key = (op.qualified_name, repr(types), repr(outs))
        confirmed = self._owner(program, op)._confirmed
        if key not in confirmed:
            confirmed[key] = self._lower_at(program, op, types, outs)
        lowered = confirmed[key]
        if lowered is None or not lowered["binding"].get("kernel_applies"):
            return None
        first_writes = {x["result"]: x for x in writes}
        claims = list(w.attributes.get("claims") or [w.callee]) + list(
            a.attributes.get("claims") or [a.callee]
        )
        return Call(
            op.qualified_name,
            "op",
            w.start,
            a.stop,
            index,
            _common_path([c for c in (w.path, a.path) if c]),
            min(w.depth, a.depth),
            w.loc,
            {
                **lowered["binding"],
                "args": [args[k] for k in range(len(op.params))],
                "results": results,
                "span": True,
                "claims": claims,
                "writes": [
                    {**first_writes[result], "result": len(results) + n}
                    for n, (_, _, result, _) in enumerate(f.writes)
                ],
                "inner": sum(1 for c in graph.calls if w.start <= c.start and c.stop <= a.stop),
            },
            w.iteration if w.iteration == a.iteration else None,
            w.repeated if w.repeated == a.repeated else "",
        )


@lru_cache(maxsize=1)
def std_spans() -> Spans:
    """The std library's span ops (parsed and checked once per process)."""
    return Spans([std_program()])


def spans_for(program: Program | None) -> Spans:
    """The span ops of the std library and of ``program`` (a user's file may define span
    ops too; one :class:`Spans` is kept per program)."""
    spans = std_spans()
    if program is None or not span_ops(program):
        return spans
    # Kept on the program itself: it lives as long as the program does, and no longer.
    found = getattr(program, "_spans", None)
    if not isinstance(found, Spans):
        found = Spans([*spans.programs, program], base=spans)  # std's work done once
        program._spans = found  # type: ignore[attr-defined]
    return found


def claim_spans(graph: Graph, program: Program | None = None) -> Graph:
    """``graph`` with every span of a span op recorded as a call of it: the std library's
    span ops, and ``program``'s own.

    >>> # planned = claim_spans(model.graph("decode", [token, pos]), model.program)
    """
    return spans_for(program).claim(graph)


__all__ = ["SpanMatch", "Spans", "claim_spans", "pattern", "span_ops", "spans_for", "std_spans"]
