"""The reverse pass: a lowered entry's graph -> a graph of its outputs and gradients.

:func:`differentiate` keeps every forward step (state writes included), then appends the
backward steps: the steps are walked last to first, and each one on a path from a chosen
input or parameter (``wrt``) to an output gets its primitive's VJP rule
(:data:`linnet.lang.grad.rules.VJP_RULES`). A value read by several steps has its
cotangents added up. The result is an ordinary :class:`~linnet.lang.ir.graph.Graph` that
passes :func:`~linnet.lang.ir.verify.verify`, so every emitter and interpreter runs it with
no new code:

* inputs: the entry's inputs, then (``seed="cotangents"``) one cotangent per float output,
  named ``d_<output>``, of the output's shape and dtype. With ``seed="scalar"`` the entry
  must return one rank-0 float (a loss), whose cotangent is 1.
* outputs: the entry's outputs, then one gradient per ``wrt`` item, in order, of its shape
  and dtype (zeros where nothing depends on it).

An op with a ``grad`` clause (lowered with :func:`linnet.lang.grad.lower_grad`, which
records the clause once per call) is differentiated by its clause, not by its body: the
clause's steps are appended with the call's arguments and incoming gradients bound.

>>> from linnet.lang import Program, lower
>>> prog = Program.from_text('''
... model M { entry run(x: Tensor[3; f32]) -> f32 {
...     let s = sum[i](x[i] * x[i])
...     return s } }''')
>>> g = differentiate(lower(prog, "run", {"x": [3]}), ["x"])
>>> g.inputs, g.outputs
(['%x'], ['%s', '%d_x'])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.grad.rules import VJP_RULES, Tape, is_float
from linnet.lang.ir import verify as _verify
from linnet.lang.ir.graph import KERNEL_ATTRIBUTES, Call, Graph, Step, ValueType

SEEDS = ("scalar", "cotangents")
_ANONYMOUS = re.compile(r"^%t(\.\d+)?$")  # values the source never named (`%t.37`)


@dataclass
class ClauseTemplate:
    """A ``grad`` clause lowered for one call: its steps, as the evaluator made them.

    ``incoming``: the placeholder value of each incoming gradient (one per result of the
    op); ``returned``: the gradient the clause returns for each tensor parameter, in order
    (a ref to a step of ``steps``, a placeholder, or a forward value); ``targets``: the
    call's argument for each tensor parameter (a forward ``%`` value or ``@`` parameter).
    """

    callee: str
    loc: str
    steps: list[Step] = field(default_factory=list)
    values: dict[str, ValueType] = field(default_factory=dict)
    incoming: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)


def resolve_wrt(graph: Graph, wrt: list[str] | str) -> list[str]:
    """``wrt`` as graph refs: an input's name (``x`` or ``%x``), a parameter's path, or
    ``"params"`` for every floating-point parameter (sorted by path).

    >>> resolve_wrt(Graph("e", "m", inputs=["%x"], values={"%x": ValueType((), "f32")}), "x")
    ['%x']
    """
    items = [wrt] if isinstance(wrt, str) else list(wrt)
    out: list[str] = []
    inputs = {ref[1:]: ref for ref in graph.inputs}
    for item in items:
        if not isinstance(item, str):
            raise coded_error(
                "E0950",
                f"`wrt` items are input names or parameter paths, not "
                f"{type(item).__name__} {item!r}",
                help="e.g. wrt=['x', 'model.norm.weight'] or wrt='params'",
            )
        if item == "params":
            refs = [
                f"@{p}" for p in sorted(graph.parameters) if is_float(graph.parameters[p].dtype)
            ]
        elif item.lstrip("%") in inputs:
            refs = [inputs[item.lstrip("%")]]
        elif item.lstrip("@") in graph.parameters:
            refs = [f"@{item.lstrip('@')}"]
        elif item.lstrip("@") in graph.states:
            raise coded_error(
                "E0951",
                f"`{item}` is a state of `{graph.model}`; gradients are taken "
                "with respect to inputs and parameters",
                help="states carry values between calls; differentiate with respect "
                "to the parameters or inputs that the state was computed from",
            )
        else:
            names = [r[1:] for r in graph.inputs] + sorted(graph.parameters)[:6]
            raise coded_error(
                "E0950",
                f"`{item}` is neither an input nor a parameter of `{graph.model}.{graph.entry}`",
                help="differentiate with respect to one of: "
                + ", ".join(names)
                + (", ..." if len(graph.parameters) > 6 else "")
                + " (or 'params' for every parameter)",
            )
        for ref in refs:
            vt = graph.values[ref] if ref.startswith("%") else graph.parameters[ref[1:]]
            if not is_float(vt.dtype):
                raise coded_error(
                    "E0951",
                    f"`{ref.lstrip('%@')}` is {vt.dtype}; only floating-point "
                    "inputs and parameters have gradients",
                    help="leave integer inputs such as token ids and positions out of `wrt`",
                )
            if ref in out:
                raise coded_error(
                    "E0950",
                    f"`{ref.lstrip('%@')}` is named twice in `wrt`",
                    help="name each input or parameter once",
                )
            out.append(ref)
    if not out:
        raise coded_error(
            "E0950",
            "`wrt` names nothing to differentiate with respect to",
            help="name an input or a parameter, or pass wrt='params'",
        )
    return out


def differentiate(
    graph: Graph,
    wrt: list[str] | str,
    seed: str = "scalar",
    clauses: dict[int, ClauseTemplate] | None = None,
) -> Graph:
    """The graph of ``graph``'s outputs and the gradients with respect to ``wrt``.

    ``wrt``: see :func:`resolve_wrt`. ``seed="scalar"``: the entry returns one rank-0 float
    and its gradient is taken; ``"cotangents"``: the graph gets one cotangent input per float
    output (a vector-Jacobian product). ``clauses``: grad clauses by call index, as
    :func:`linnet.lang.grad.lower_grad` records them. The input graph is not changed.

    >>> # differentiate(lower(prog, "loss", shapes, config), "params")
    """
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}")
    targets = resolve_wrt(graph, wrt)
    # Under --grad an op bound to a kernel runs its body (the spec's table of where kernels
    # run): the gradient graph's calls carry no kernel binding for an emitter to launch.
    out = Graph(
        graph.entry,
        graph.model,
        list(graph.inputs),
        list(graph.outputs),
        [
            Step(s.op, list(s.operands), list(s.results), dict(s.attributes), s.loc)
            for s in graph.steps
        ],
        [
            Call(
                c.callee,
                c.kind,
                c.start,
                c.stop,
                c.index,
                c.path,
                c.depth,
                c.loc,
                {k: v for k, v in c.attributes.items() if k not in KERNEL_ATTRIBUTES},
                c.iteration,
                c.repeated,
            )
            for c in graph.calls
        ],
        dict(graph.values),
        dict(graph.parameters),
        dict(graph.states),
        dict(graph.dims),
        dict(graph.dtypes),
        dict(graph.config),
        dict(graph.sources),
    )
    forward = len(out.steps)
    active = _active(graph, targets)
    tape = Tape(out)
    ct: dict[str, list[str]] = {}

    float_outputs = [
        o for o in graph.outputs if o.startswith("%") and is_float(graph.values[o].dtype)
    ]
    if seed == "scalar":
        if len(graph.outputs) != 1 or not float_outputs or graph.values[float_outputs[0]].shape:
            shown = ", ".join(_type(graph, o) for o in graph.outputs)
            raise coded_error(
                "E0952",
                f"`{graph.model}.{graph.entry}` returns {shown}, not one "
                "scalar float, so it has no gradient of its own",
                help="return a loss (a rank-0 float), or give cotangents for its "
                "outputs (seed='cotangents'; `--grad-seed cotangents`)",
            )
        tape.loc = graph.steps[-1].loc if graph.steps else ""
        ct[float_outputs[0]] = [tape.const(1.0, graph.values[float_outputs[0]].dtype)]
    else:
        for o in float_outputs:
            name = tape.fresh("d_" + o[1:])
            out.values[name] = graph.values[o]
            out.inputs.append(name)
            ct.setdefault(o, []).append(name)

    _check_states(graph, active, set(ct))
    clause_at = _clause_calls(graph, clauses or {})
    named: set[str] = set()  # cotangents already given their value's name

    def total(ref: str) -> str | None:
        """The cotangent of ``ref``: its contributions added up, named ``d_<ref>`` where
        the name is free to take (a value no other cotangent list still holds)."""
        parts = ct.pop(ref, None)
        if not parts:
            return None
        acc = parts[0]
        for p in parts[1:]:
            acc = tape.binary("add", acc, p)
        named_value = ref.startswith("%") and not _ANONYMOUS.match(ref)
        if (
            named_value
            and tape.renamable(acc)
            and acc not in out.outputs
            and not _pending(ct, acc)
            and acc not in named
        ):
            name = tape.fresh("d_" + _base(ref))
            _rename(tape, acc, name)
            acc = name
        named.add(acc)
        return acc

    # The backward steps of each iteration of a repeated block (a layer) get a call of their
    # own, as the forward's have: slices are cut there, and every layer's backward shares one
    # generated function (one kind), as every layer's forward does.
    layer_of = _iterations(graph)
    layers: list[Call] = []
    region: tuple[Call | None, int] = (None, len(out.steps))

    def close_region() -> None:
        layer, begin = region
        if layer is not None and len(out.steps) > begin:
            layers.append(
                Call(
                    layer.callee + ".grad",
                    layer.kind,
                    begin,
                    len(out.steps),
                    -1,
                    layer.path,
                    layer.depth + 1,
                    layer.loc,
                    {"grad": True},
                    layer.iteration,
                    layer.repeated,
                )
            )

    for i in range(forward - 1, -1, -1):
        if layer_of[i] is not region[0]:
            close_region()
            region = (layer_of[i], len(out.steps))
            tape.forget_constants()  # each layer's backward makes its own: one kind for all
        for call in clause_at.get(i, []):
            _apply_clause(call, clauses[call.index], tape, ct, active, total)  # type: ignore[index]
        step = graph.steps[i]
        if not step.results:
            continue
        g = total(step.results[0])
        if g is None:
            continue
        needs = [o in active for o in step.operands]
        if not any(needs):
            continue
        tape.loc = step.loc
        grads = VJP_RULES[step.op](step, g, tape, needs)
        for o, d, need in zip(step.operands, grads, needs):
            if d is not None and need:
                _accumulate(ct, tape, o, d)

    close_region()
    tape.forget_constants()
    tape.loc = ""
    for ref in targets:
        g = total(ref)
        vt = out.values[ref] if ref.startswith("%") else out.parameters[ref[1:]]
        if g is None:
            g = tape.zeros(vt.shape, vt.dtype)
        free = tape.renamable(g) and g not in out.outputs and not _pending(ct, g)
        if free and ref.startswith("%") and g in named:
            out.outputs.append(g)  # an input's gradient, already named `d_x` by total()
            continue
        name = tape.fresh("d_" + _base(ref))
        # The gradient gets its own name (`d_model_norm_weight`): a step of its own when the
        # sum is a value another step also reads.
        if free and g not in named:
            _rename(tape, g, name)
        else:
            name = tape.emit(
                "reshape", [g], vt.shape, vt.dtype, {"shape": list(vt.shape)}, hint=name[1:]
            )
        out.outputs.append(name)

    for c in out.calls:
        if c.kind == "entry":
            c.start, c.stop = 0, len(out.steps)
    if len(out.steps) > forward:
        depth = min((c.depth for c in out.calls if c.kind == "entry"), default=0) + 1
        out.calls.append(
            Call(
                f"grad::{graph.model}.{graph.entry}",
                "fn",
                forward,
                len(out.steps),
                len(out.calls),
                "",
                depth,
            )
        )
    for c in sorted(layers + tape.calls, key=lambda c: (c.start, -c.stop)):
        c.index = len(out.calls)
        out.calls.append(c)
    if _verify.checked():
        _verify.verify(out, "the reverse pass")
    return out


def _accumulate(ct: dict[str, list[str]], tape: Tape, ref: str, d: str) -> None:
    """Add ``d`` to ``ref``'s cotangent where it arrives (in the reader's layer, so that
    every layer's backward adds up the same contributions: one kind for all)."""
    have = ct.get(ref)
    ct[ref] = [tape.binary("add", have[0], d)] if have else [d]


def _iterations(graph: Graph) -> list[Call | None]:
    """For each step, the outermost call of an iteration of a repeated block holding it
    (the calls that cut a graph into slices, `passes/slices.py`), or None."""
    out: list[Call | None] = [None] * len(graph.steps)
    chosen_stop = -1
    for call in sorted(graph.calls, key=lambda c: (c.start, -c.stop)):
        if call.iteration is None or call.kind not in ("fn", "op") or call.start == call.stop:
            continue
        if call.start < chosen_stop:
            continue  # nested inside a chosen call
        chosen_stop = call.stop
        for i in range(call.start, call.stop):
            out[i] = call
    return out


def _type(graph: Graph, ref: str) -> str:
    vt = (
        graph.values[ref]
        if ref.startswith("%")
        else (graph.parameters.get(ref[1:]) or graph.states[ref[1:]])
    )
    return f"{vt.dtype}{list(vt.shape)}"


def _base(ref: str) -> str:
    """`%q.1` -> `q_1`, `%t.3` -> `t_3`: a readable stem for a cotangent's name."""
    return ref[1:].replace(".", "_")


def _pending(ct: dict[str, list[str]], ref: str) -> bool:
    """Whether a cotangent list still holds ``ref`` (usually none does: contributions are
    fresh values, shared only where a rule hands one gradient to two operands)."""
    return any(ref in parts for parts in ct.values())


def _rename(tape: Tape, old: str, new: str) -> None:
    """Rename a value the backward steps made, in its step and the steps after it (the
    ones that can read it) and in the clause calls' results."""
    graph = tape.graph
    start = tape.made.pop(old)
    tape.made[new] = start
    graph.values[new] = graph.values.pop(old)
    for step in graph.steps[start:]:
        if old in step.operands:
            step.operands = [new if o == old else o for o in step.operands]
        if old in step.results:
            step.results = [new if r == old else r for r in step.results]
    for call in tape.calls:
        results = call.attributes.get("results")
        if results and old in results:
            call.attributes["results"] = [new if r == old else r for r in results]


def _active(graph: Graph, targets: list[str]) -> set[str]:
    """The refs that depend on a target through floating-point values."""
    active = set(targets)
    for step in graph.steps:
        if step.results and any(o in active for o in step.operands):
            r = step.results[0]
            if is_float(graph.values[r].dtype):
                active.add(r)
    return active


def _check_states(graph: Graph, active: set[str], seeded: set[str]) -> None:
    """E0953 where a differentiated output depends on a state that the entry wrote with a
    value depending on ``wrt``: gradients do not flow through states."""
    written: dict[str, int] = {}
    tainted: set[str] = set()
    for i, step in enumerate(graph.steps):
        if step.op == "scatter":
            if any(o in active for o in step.operands[1:]):
                written.setdefault(step.operands[0], i)
            continue
        if step.results and any(o in written or o in tainted for o in step.operands):
            tainted.add(step.results[0])
    # Only what the seeded outputs read matters: walk back from them.
    needed = set(seeded)
    for step in reversed(graph.steps):
        if step.results and step.results[0] in needed:
            needed.update(step.operands)
    # The first state written (program order), not a set's order: the message names the
    # same state in every run (a set of strings iterates in a per-process hash order).
    hit = next((s for s in written if s in needed), None)
    if hit is not None or any(o in tainted for o in seeded):
        state = hit or next(iter(written))
        loc = graph.steps[written[state]].loc
        raise coded_error(
            "E0953",
            f"`{graph.model}.{graph.entry}` writes the state "
            f"`{state[1:]}` (at {loc or '?'}) with a value that depends on what is "
            "differentiated, and reads it back: gradients do not flow through states",
            help="differentiate an entry that uses the values it computes directly "
            "(like `prefill`, whose attention reads k and v, not the cache) "
            "rather than one that reads them back from a state (`decode`)",
        )


def _clause_calls(graph: Graph, clauses: dict[int, ClauseTemplate]) -> dict[int, list[Call]]:
    """The outermost calls that a grad clause differentiates, by their last step (where the
    backward walk enters them)."""
    chosen: list[Call] = []
    for call in sorted(
        (c for c in graph.calls if c.index in clauses), key=lambda c: (c.start, -c.stop)
    ):
        if (
            chosen
            and call.start < chosen[-1].stop
            and call.stop <= chosen[-1].stop
            and chosen[-1].stop > chosen[-1].start
        ):
            continue  # inside a call whose own clause covers it
        chosen.append(call)
    at: dict[int, list[Call]] = {}
    for call in chosen:
        at.setdefault(max(call.stop - 1, 0), []).append(call)
    return at


def _apply_clause(
    call: Call,
    template: ClauseTemplate,
    tape: Tape,
    ct: dict[str, list[str]],
    active: set[str],
    total: Any,
) -> None:
    """Differentiate ``call`` by its grad clause: take its results' cotangents (the steps of
    its body then pass back only what values shared with outside code receive), append the
    clause's steps with fresh names, and add each returned gradient to its argument's."""
    results = call.attributes.get("results") or []
    incoming = [total(r) if isinstance(r, str) else None for r in results]
    if not any(incoming) or not any(t in active for t in template.targets):
        for r, g in zip(results, incoming):
            if g is not None:
                _accumulate(ct, tape, r, g)
        return
    graph = tape.graph
    start = len(graph.steps)
    rename: dict[str, str] = {}
    for placeholder, g in zip(template.incoming, incoming):
        if g is None:
            vt = template.values[placeholder]
            g = tape.zeros(vt.shape, vt.dtype)
        rename[placeholder] = g
    for step in template.steps:
        tape.loc = step.loc or template.loc
        operands = [rename.get(o, o) for o in step.operands]
        (r,) = step.results
        vt = template.values[r]
        hint = r[1:] if not r.startswith("%t") else ""
        rename[r] = tape.emit(step.op, operands, vt.shape, vt.dtype, step.attributes, hint=hint)
    for target, ret in zip(template.targets, template.returned):
        if target not in active:
            continue
        d = rename.get(ret, ret)
        vt = tape.type(target)
        _accumulate(ct, tape, target, tape.convert(tape.reshape(d, vt.shape), vt.dtype))
    if len(graph.steps) > start:
        # Named `callee.grad`: a backend or fast path matching the op's own name must not
        # take its backward for it.
        tape.calls.append(
            Call(
                call.callee + ".grad",
                "op",
                start,
                len(graph.steps),
                -1,
                call.path,
                call.depth + 1,
                call.loc,
                {
                    "args": list(call.attributes.get("args", [])),
                    "results": [rename.get(r, r) for r in template.returned],
                    "grad": True,
                },
            )
        )
