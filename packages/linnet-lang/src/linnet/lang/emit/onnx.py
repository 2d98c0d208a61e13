"""Graph → ONNX model, built with onnx-ir (imported lazily: linnet-lang stays pure Python).

One model per lowered entry. The entry's inputs come first, then one input per state (named
by its path: ``model.layers.0.self_attn.k_cache``); the outputs are the entry's, then each
state's value after the call (``<path>.next``), so a caller carries a KV cache between calls by
feeding each ``.next`` output back as the next call's state input. Parameters are
initializers when weights are given (stored as external data above a size threshold when the
model is saved), graph inputs named by path otherwise. Every std op the entry calls
(``std.nn.linear::linear``) becomes a call of an ONNX local function in the ``linnet.std``
domain (``nn.linear.linear``), nested as the calls nest, so the structure a backend matches on
survives; one function per callee and body (the layers of a model share theirs).

Every primitive has a rule in :data:`RULES` (``tests/test_coverage.py`` checks it). A step
with no rule, or a dtype ONNX lacks, is error E0930 / E0931 naming the step and its source
line. Each node keeps the source line it came from (``doc_string``, and the metadata key
``linnet.loc``), and its name is the step's index and op (``s45_contract``).

Shapes are those the entry was lowered for, except the dims a graph from
:func:`linnet.lang.export.symbolic_dims` has symbolic (``graph.symbolic``: the batch B, a
prompt's length L): there a size is a :class:`~linnet.lang.export.SymInt`, a polynomial of the
dims, and the model computes it at run time. Each dim is read once off an input's or a
state's shape (``B = Shape(tokens)[0:1]``); reshape and broadcast targets, iota lengths, slice
bounds and constants are built from the dims with ``Mul``/``Add``/``Concat``; inputs, states
and outputs get ``dim_param`` names (``B``, ``B*L``); a local function takes each dim its body
uses as an extra input after the values it reads: the dim's iota ``Range(0, L)``, whose shape
is the dim. Reshapes and expands say which dims they keep (:mod:`.onnx_shapes`), so shape
inference that reads no values (onnxruntime's ``symbolic_shape_infer`` on a function call)
carries every dim by name.

>>> from linnet.lang.emit.onnx import RULES
>>> from linnet.lang.ir.primitives import PRIMITIVES
>>> sorted(set(PRIMITIVES) - set(RULES))  # collectives (one rank's graph), and bitcast
['all_gather', 'all_reduce', 'bitcast']
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linnet.lang import __version__
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.emit.onnx_rules import (
    EXPECTED_MISSING,
    RULES,
    SYMBOLIC_ATTRIBUTES,
    WHY_MISSING,
)
from linnet.lang.emit.onnx_scope import (
    DOMAIN,
    EXTERNAL_THRESHOLD,
    IR_VERSION,
    NUMPY_DTYPES,
    ONNX_DTYPES,
    OPSET,
    Scope,
    _dtype,
    _ir,
    _is_dim,
    _shape,
    _source_line,
    _tensor,
    where,
)
from linnet.lang.ir.graph import Call, Graph

# The rule table and the dtype tables are the emitter's public names (the coverage test and
# linnet.lang.export read them here).
__all__ = [
    "DOMAIN",
    "EXPECTED_MISSING",
    "EXTERNAL_THRESHOLD",
    "NUMPY_DTYPES",
    "ONNX_DTYPES",
    "RULES",
    "SYMBOLIC_ATTRIBUTES",
    "OnnxEmitter",
    "check",
    "emit_onnx",
    "save_onnx",
    "std_op_calls",
    "to_proto",
]


def _std_name(callee: str) -> str:
    """`std.nn.linear::linear` -> `nn.linear.linear` (the function's name in `linnet.std`)."""
    return re.sub(r"[^0-9A-Za-z_.]", "_", callee.removeprefix("std.").replace("::", "."))


def std_op_calls(graph: Graph) -> list[Call]:
    """The calls that become local functions: std ops with at least one step."""
    return [
        c
        for c in graph.calls
        if c.kind == "op" and c.callee.startswith("std.") and c.stop > c.start
    ]


"""``rule(step, scope)``: appends nodes and returns the result's value (None for a state
write, which rebinds ``@state`` in the scope itself)."""


# ---------------------------------------------------------------- the emitter
@dataclass
class _Span:
    """What a call span reads from outside (in first-read order) and what it hands on."""

    reads: list[str]
    writes: list[str]


class OnnxEmitter:
    def __init__(self, graph: Graph, sources: Mapping[str, str] | None) -> None:
        self.ir = _ir()
        self.graph = graph
        self.sources = {k: v.splitlines() for k, v in (sources or graph.sources or {}).items()}
        self.functions: dict[tuple, Any] = {}  # body key -> ir.Function
        self.function_names: set[str] = set()
        self.fn_dims: dict[str, list[str]] = {}  # function -> the symbolic dims it takes
        self.calls = std_op_calls(graph)
        self.users = graph.users()
        self.last_write: dict[str, int] = {}
        for i, st in enumerate(graph.steps):
            if st.op == "scatter":
                self.last_write[st.operands[0]] = i

    # Which refs a span reads from before it and which of its values are read after it.
    def span(self, start: int, stop: int) -> _Span:
        defined: set[str] = set()
        reads: list[str] = []
        writes: list[str] = []
        for st in self.graph.steps[start:stop]:
            for o in st.operands:
                if o not in defined and o not in reads:
                    reads.append(o)
            if st.op == "scatter":
                defined.add(st.operands[0])
                if st.operands[0] not in writes:
                    writes.append(st.operands[0])
            defined.update(st.results)
        outs = []
        for st in self.graph.steps[start:stop]:
            for r in st.results:
                if r in self.graph.outputs or any(u >= stop for u in self.users.get(r, [])):
                    outs.append(r)
        # Every state the span writes leaves it: a later read, or the entry's final state.
        return _Span(reads, outs + writes)

    def children(self, start: int, stop: int, owner: Call | None) -> dict[int, Call]:
        """The outermost std-op calls in ``start..stop`` other than ``owner`` (the call whose
        body this is), by first step."""

        def contains(o: Call, c: Call) -> bool:
            return (
                o.start <= c.start
                and c.stop <= o.stop
                and (o.stop - o.start > c.stop - c.start or o.depth < c.depth)
            )

        mine = [
            c
            for c in self.calls
            if c is not owner
            and start <= c.start
            and c.stop <= stop
            and (owner is None or contains(owner, c))
        ]
        return {c.start: c for c in mine if not any(o is not c and contains(o, c) for o in mine)}

    def body(self, scope: Scope, start: int, stop: int, owner: Call | None) -> None:
        """Emit steps ``start..stop`` into ``scope``, std calls as function calls."""
        inner = self.children(start, stop, owner)
        i = start
        while i < stop:
            call = inner.get(i)
            if call is not None:
                self.call(scope, call)
                i = call.stop
                continue
            step = self.graph.steps[i]
            scope.step, scope.current = i, step
            rule = RULES.get(step.op)
            if rule is None:
                why = WHY_MISSING.get(step.op)
                raise LinnetError(
                    Diagnostic(
                        "E0930",
                        f"{where(self.graph, i, step)}: primitive `{step.op}` has no ONNX rule",
                        help="run this model with the PyTorch runtime, "
                        + (
                            "or export it to StableHLO (`linnet stablehlo`)"
                            if why
                            else "or add the primitive to linnet.lang.emit.onnx_rules.RULES"
                        ),
                        notes=[why] if why else [],
                    )
                )
            for ref in step.operands:
                if ref.startswith("@"):
                    scope.dtype(ref)
            for r in step.results:
                _dtype(self.ir, self.graph.values[r].dtype, scope)
            out = rule(step, scope)
            if step.results:
                scope.env[step.results[0]] = out
            scope.current = None
            i += 1

    def call(self, scope: Scope, call: Call) -> None:
        sp = self.span(call.start, call.stop)
        key_steps = []
        local: dict[str, str] = {r: f"in{k}" for k, r in enumerate(sp.reads)}
        for j, st in enumerate(self.graph.steps[call.start : call.stop]):
            ops = [local.get(o, o if not o.startswith("%") else "?") for o in st.operands]
            # repr: a SymInt shows its polynomial, so bodies whose sizes are different
            # functions of the dims (B and KV, both 2 here) are never one function
            types = [(repr(scope.shape(o)), scope.dtype(o)) for o in [*st.operands, *st.results]]
            for r in st.results:
                local[r] = f"v{j}"
            key_steps.append(
                (
                    st.op,
                    repr(sorted(st.attributes.items(), key=lambda kv: kv[0])),
                    tuple(ops),
                    tuple(types),
                )
            )
        key = (call.callee, tuple(key_steps), tuple(local.get(w, w) for w in sp.writes))
        fn = self.functions.get(key)
        if fn is None:
            fn = self.function(call, sp, key)
        args = [scope.env[r] for r in sp.reads] + [scope.range(d) for d in self.fn_dims[fn.name]]
        scope.step, scope.current = call.start, self.graph.steps[call.start]
        outs = scope.op(
            fn.name,
            args,
            domain=DOMAIN,
            outputs=max(len(sp.writes), 1),
            hint=sp.writes[0] if sp.writes else call.callee.rsplit(":", 1)[-1],
        )
        outs = outs if isinstance(outs, list) else [outs]
        node = scope.nodes[-1]
        node.name = scope.fresh(f"s{call.start}_{_std_name(call.callee)}")
        if call.path:
            node.metadata_props["linnet.path"] = call.path
        if call.loc:
            node.metadata_props["linnet.loc"] = call.loc
            node.doc_string = _source_line(self.sources, call.loc)
        for ref, value in zip(sp.writes, outs):
            scope.env[ref] = value
        scope.current = None

    def function(self, call: Call, sp: _Span, key: tuple) -> Any:
        ir = self.ir
        inner = Scope(ir, self.graph, self.sources, dim_inputs=[])
        inputs = []
        for ref in sp.reads:
            hint = ref.rsplit(".", 1)[-1] if ref.startswith("@") else ref
            v = ir.Value(name=inner.fresh(hint))
            inner.env[ref] = v
            inputs.append(v)
        self.body(inner, call.start, call.stop, call)
        assert inner.dim_inputs is not None
        inputs += [inner.ranges[d] for d in inner.dim_inputs]
        outputs = [inner.env[w] for w in sp.writes]
        if not outputs:  # a call whose results nothing reads: keep one so the node is valid
            outputs = [inner.nodes[-1].outputs[0]] if inner.nodes else inputs[:1]
        base = _std_name(call.callee)
        name, k = base, 1
        while name in self.function_names:
            k += 1
            name = f"{base}_{k}"
        self.function_names.add(name)
        self.fn_dims[name] = list(inner.dim_inputs)
        body = ir.Graph(
            inputs, outputs, nodes=inner.nodes, name=name, opset_imports={"": OPSET, DOMAIN: 1}
        )
        fn = ir.Function(DOMAIN, name, graph=body, attributes=[])
        fn.doc_string = f"{call.callee} (first called at {call.loc or '?'} for `{call.path}`)"
        self.functions[key] = fn
        return fn

    def model(
        self,
        params: Mapping[str, Any] | None,
        flag: str | None = None,
        checks: Mapping[str, Any] | None = None,
    ) -> Any:
        ir, g = self.ir, self.graph
        scope = Scope(ir, g, self.sources)
        inputs, initializers = [], []

        def value(name: str, dtype: str, shape: tuple[int, ...]) -> Any:
            return ir.Value(
                name=scope.fresh(name),
                type=ir.TensorType(_dtype(ir, dtype)),
                shape=_shape(ir, shape),
            )

        for ref in g.inputs:
            v = value(ref.lstrip("%"), g.values[ref].dtype, g.values[ref].shape)
            scope.env[ref] = v
            inputs.append(v)
        for path, vt in g.states.items():
            v = value(path, vt.dtype, vt.shape)
            scope.env["@" + path] = v
            inputs.append(v)
            _named_by_path(g, "state", path, v.name)
        for path, vt in g.parameters.items():
            v = value(path, vt.dtype, vt.shape)
            scope.env["@" + path] = v
            if params is None:
                inputs.append(v)
                _named_by_path(g, "parameter", path, v.name)
            else:
                if path not in params:
                    raise LinnetError(
                        Diagnostic(
                            "E0933",
                            f"no weights for parameter `{path}` of `{g.model}`",
                            help="pass every parameter the entry reads (the model's weights)",
                        )
                    )
                v.const_value = _tensor(ir, params[path], vt.dtype, path)
                initializers.append(v)
        # Each symbolic dim is read once off the first input or state with an axis of that
        # size: `B = Shape(tokens)[0:1]`.
        for dim in getattr(g, "symbolic", {}):
            for ref in [*g.inputs, *("@" + p for p in g.states)]:
                axes = [a for a, d in enumerate(scope.shape(ref)) if _is_dim(d, dim)]
                if axes:
                    scope.dims[dim] = scope.op(
                        "Shape", [scope.env[ref]], {"start": axes[0], "end": axes[0] + 1}, hint=dim
                    )
                    node = scope.nodes[-1]
                    node.name = scope.fresh(f"dim_{dim}")
                    node.doc_string = f"symbolic dim {dim}: axis {axes[0]} of {scope.env[ref].name}"
                    break
        # The outputs' names are taken first, so that no value inside gets them.
        out_refs = [*g.outputs, *("@" + p for p in g.states), *([flag] if flag else [])]
        out_names = [
            scope.fresh(r[1:] + ".value" if r.startswith("@") else r.lstrip("%")) for r in g.outputs
        ]
        out_names += [scope.fresh(p + ".next") for p in g.states]
        out_names += [scope.fresh("linnet.valid")] if flag else []
        self.body(scope, 0, len(g.steps), None)
        outputs = [
            scope.op("Identity", [scope.env[ref]], exact=name)
            for ref, name in zip(out_refs, out_names)
        ]
        for v, ref in zip(outputs, out_refs):
            v.type = ir.TensorType(_dtype(ir, scope.dtype(ref)))
            v.shape = _shape(ir, scope.shape(ref))
        graph = ir.Graph(
            inputs,
            outputs,
            nodes=scope.nodes,
            initializers=initializers,
            name=f"{g.model}.{g.entry}",
            opset_imports={"": OPSET, DOMAIN: 1},
        )
        model = ir.Model(
            graph,
            ir_version=IR_VERSION,
            producer_name="linnet-lang",
            producer_version=__version__,
            functions=list(self.functions.values()),
        )
        model.metadata_props["linnet.entry"] = g.entry
        model.metadata_props["linnet.model"] = g.model
        model.metadata_props["linnet.inputs"] = json.dumps([r.lstrip("%") for r in g.inputs])
        model.metadata_props["linnet.states"] = json.dumps(list(g.states))
        model.metadata_props["linnet.parameters"] = json.dumps(list(g.parameters))
        if checks is not None:
            model.metadata_props["linnet.valid"] = json.dumps(checks)
        symbolic = getattr(g, "symbolic", None)  # set by linnet.lang.export.symbolic_dims
        if symbolic:
            model.metadata_props["linnet.symbolic"] = json.dumps(list(symbolic))
        return model


def _named_by_path(g: Graph, kind: str, path: str, name: str) -> None:
    """E0944 where an entry input took a state's or parameter's path as its ONNX name: a
    caller feeds both by name (``{"s": x, **states}``), and the metadata lists the path."""
    if name != path:
        raise LinnetError(
            Diagnostic(
                "E0944",
                f"the ONNX model of `{g.model}.{g.entry}` would name input `{path}` and "
                f"{kind} `{path}` alike: ONNX feeds inputs by name",
                help=f"rename the entry's input `{path}` (its inputs, states and parameters share "
                "one namespace in ONNX)",
            )
        )


def emit_onnx(
    graph: Graph,
    params: Mapping[str, Any] | None = None,
    sources: Mapping[str, str] | None = None,
    validity: bool = True,
) -> Any:
    """An ``onnx_ir.Model`` for one lowered entry (see the module docstring for its form).

    ``params``: the weights by path (numpy arrays or torch tensors), stored as initializers;
    without them the parameters are graph inputs after the states. ``validity``: the last
    output is ``linnet.valid`` (:mod:`linnet.lang.export_checks`), what it checks in the
    metadata key ``linnet.valid``.

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }''')
    >>> m = emit_onnx(lower(prog, "run", {"x": [3]}))                  # doctest: +SKIP
    >>> [v.name for v in m.graph.inputs], m.graph.node(0).op_type      # doctest: +SKIP
    (['x'], 'Constant')
    """
    if not validity:
        return OnnxEmitter(graph, sources).model(params)
    from linnet.lang.export_checks import describe
    from linnet.lang.ir.validity import with_validity

    checked, flag = with_validity(graph)
    return OnnxEmitter(checked, sources).model(params, flag, describe(graph))


def to_proto(model: Any) -> Any:
    """The model as an ``onnx.ModelProto`` (weights inline)."""
    return _ir().to_proto(model)


def save_onnx(
    model: Any, path: str | Path, external_threshold: int = EXTERNAL_THRESHOLD
) -> list[Path]:
    """Write ``model`` to ``path``; with more than ``external_threshold`` bytes of weights,
    they go to ``<path>.data`` beside it (ONNX's external data; a protobuf holds at most
    2 GiB). Returns the files written.

    >>> save_onnx(emit_onnx(graph, weights), "decode.onnx")           # doctest: +SKIP
    [PosixPath('decode.onnx')]
    """
    ir = _ir()
    path = Path(path)
    size = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    if size > external_threshold:
        data = path.with_name(path.name + ".data")
        ir.save(model, path, external_data=data.name, size_threshold_bytes=1024)
        return [path, data]
    ir.save(model, path)
    return [path]


def check(model: Any) -> None:
    """``onnx.checker.check_model(full_check=True)`` on ``model``: a failure is an internal
    error (E0934), never a file that onnxruntime rejects later."""
    import onnx

    try:
        onnx.checker.check_model(to_proto(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LinnetError(
            Diagnostic(
                "E0934",
                f"the ONNX model for `{model.graph.name}` fails onnx.checker: {first}",
                help="this is a bug in linnet-lang's ONNX emitter: please report it",
            )
        ) from None
