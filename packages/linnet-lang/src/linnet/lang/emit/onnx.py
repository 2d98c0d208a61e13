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
>>> sorted(set(PRIMITIVES) - set(RULES))  # collectives: an exported graph is one rank's
['all_gather', 'all_reduce']
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linnet.lang import __version__
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.emit import onnx_edges, onnx_shapes
from linnet.lang.ir.graph import Call, Graph, Step
from linnet.lang.tensors.poly import SymInt, poly_text

OPSET = 21  # onnxruntime 1.20+ and onnx 1.17+ run and check opset 21
IR_VERSION = 10
DOMAIN = "linnet.std"
EXTERNAL_THRESHOLD = 1 << 30  # bytes of parameters above which `save_onnx` writes external data

# Linnet dtype -> the name of onnx_ir.DataType's member.
ONNX_DTYPES = {"f64": "DOUBLE", "f32": "FLOAT", "f16": "FLOAT16", "bf16": "BFLOAT16",
               "i64": "INT64", "i32": "INT32", "i16": "INT16", "i8": "INT8", "u8": "UINT8",
               "bool": "BOOL"}
NUMPY_DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "i64": "int64",
                "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "bool": "bool"}
_INTS = {"i64", "i32", "i16", "i8", "u8"}


def _ir() -> Any:
    try:
        import onnx_ir
    except ImportError:
        raise LinnetError(Diagnostic(
            "E0932", "ONNX export needs the onnx and onnx-ir packages, which are not installed",
            help="install them with `pip install 'linnet-lang[onnx]'`")) from None
    return onnx_ir


def where(graph: Graph, index: int, step: Step) -> str:
    """How an error names a step: its index, op and source line."""
    return f"step {index} ({step.op}) of `{graph.model}.{graph.entry}` at {step.loc or '?'}"


def _std_name(callee: str) -> str:
    """`std.nn.linear::linear` -> `nn.linear.linear` (the function's name in `linnet.std`)."""
    return re.sub(r"[^0-9A-Za-z_.]", "_", callee.removeprefix("std.").replace("::", "."))


def std_op_calls(graph: Graph) -> list[Call]:
    """The calls that become local functions: std ops with at least one step."""
    return [c for c in graph.calls
            if c.kind == "op" and c.callee.startswith("std.") and c.stop > c.start]


# ---------------------------------------------------------------- the builder
@dataclass
class Scope:
    """Nodes of one ONNX graph or function body, and the ONNX value of each graph ref."""

    ir: Any
    graph: Graph
    sources: Mapping[str, list[str]]
    env: dict[str, Any] = field(default_factory=dict)
    nodes: list[Any] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    step: int = 0
    current: Step | None = None
    # Symbolic dims (graph.symbolic): each one's ONNX value, a [1]-shaped int64 tensor. The
    # model's graph reads them off its inputs' shapes; a function body takes each one it
    # needs as an extra input, after the values it reads (``dim_inputs``, in first-use order):
    # the dim's iota ``Range(0, L)`` (``ranges``), whose *shape* is the dim, so that shape
    # inference that reads no values (inside a function) follows it (onnx_shapes).
    dims: dict[str, Any] = field(default_factory=dict)
    dim_inputs: list[str] | None = None
    ranges: dict[str, Any] = field(default_factory=dict)
    sizes: dict[Any, Any] = field(default_factory=dict)  # poly -> its value (computed once)

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^0-9A-Za-z_.]", "_", hint.lstrip("%@")) or "v"
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def dtype(self, ref: str) -> str:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].dtype
        return self.graph.values[ref].dtype

    def shape(self, ref: str) -> tuple[int, ...]:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].shape
        return self.graph.values[ref].shape

    def op(self, op_type: str, inputs: list[Any], attributes: dict | None = None,
           hint: str = "", domain: str = "", outputs: int = 1, exact: str = "") -> Any:
        """Append one node; returns its output value (a list when ``outputs`` > 1).
        ``exact``: the output's name, reserved beforehand (the graph's outputs)."""
        ir = self.ir
        results = [ir.Value(name=exact or self.fresh(hint or op_type.lower()))
                   for _ in range(outputs)]
        step = self.current
        node = ir.Node(domain, op_type, inputs, attributes=[
            ir.convenience.convert_attribute(k, v) for k, v in (attributes or {}).items()],
            outputs=results, name=self.fresh(f"s{self.step}_{step.op if step else op_type}"))
        if step is not None and step.loc:
            node.metadata_props["linnet.loc"] = step.loc
            node.doc_string = _source_line(self.sources, step.loc)
        self.nodes.append(node)
        return results if outputs > 1 else results[0]

    def const(self, value: Any, dtype: str, hint: str = "c") -> Any:
        """A Constant node: a Python scalar or list (int64 shapes) in ``dtype``."""
        import numpy as np

        ir = self.ir
        if isinstance(value, SymInt):  # a size as a scalar: [1] -> [], in the dtype wanted
            scalar = self.op("Squeeze", [self.size(value), self.ints([0], "axes")], hint=hint)
            return scalar if dtype == "i64" else self.op("Cast", [scalar], {
                "to": _dtype(ir, dtype, self)}, hint=hint)
        if dtype == "bf16":
            import ml_dtypes

            arr = np.asarray(value, dtype="float32").astype(ml_dtypes.bfloat16)
        else:
            arr = np.asarray(value, dtype=NUMPY_DTYPES[dtype])
        return self.op("Constant", [], {"value": ir.tensor(arr)}, hint=hint)

    def ints(self, values: list[int] | tuple[int, ...], hint: str = "shape") -> Any:
        """An int64 vector (a shape, bounds); computed from the symbolic dims where some of
        ``values`` are :class:`~linnet.lang.export.SymInt`s (``[B*L, 64]``)."""
        if not any(isinstance(v, SymInt) for v in values):
            return self.const(list(values), "i64", hint)
        key = ("vector", tuple(SymInt.poly_of(v) for v in values))
        if key in self.sizes:
            return self.sizes[key]
        parts: list[Any] = []
        run: list[int] = []
        for v in values:
            if isinstance(v, SymInt):
                if run:
                    parts.append(self.const(run, "i64", hint))
                    run = []
                parts.append(self.size(v))
            else:
                run.append(int(v))
        if run:
            parts.append(self.const(run, "i64", hint))
        out = parts[0] if len(parts) == 1 else self.op("Concat", parts, {"axis": 0}, hint=hint)
        self.sizes[key] = out
        return out

    def dim(self, name: str) -> Any:
        """The ONNX value of symbolic dim ``name`` (shape [1], int64)."""
        if name not in self.dims:  # a function body: the shape of the dim's iota input
            self.dims[name] = self.op("Shape", [self.range(name)], hint=name)
        return self.dims[name]

    def range(self, name: str) -> Any:
        """``Range(0, name)`` (int64, shape ``[name]``): in a function body an input after
        the values it reads, in the model's graph computed once from the dim."""
        if name not in self.ranges:
            if self.dim_inputs is not None:
                self.ranges[name] = self.ir.Value(name=self.fresh(name))
                self.dim_inputs.append(name)
            else:
                size = self.op("Squeeze", [self.dim(name), self.ints([0], "axes")])
                self.ranges[name] = self.op("Range", [self.const(0, "i64"), size,
                                                      self.const(1, "i64")], hint=name + ".iota")
        return self.ranges[name]

    def size(self, n: Any) -> Any:
        """A [1]-shaped int64 value of ``n``: an int, or a SymInt's polynomial of the dims
        (``6*B`` is ``Mul(B, 6)``), each computed once per graph."""
        poly = SymInt.poly_of(n)
        key = ("size", poly)
        if key in self.sizes:
            return self.sizes[key]
        total = None
        for mono, coef in sorted(poly, key=lambda t: (-len(t[0]), t[0])):
            term = None
            for d in mono:
                term = self.dim(d) if term is None else self.op("Mul", [term, self.dim(d)])
            if term is None:
                term = self.const([coef], "i64", "c")
            elif coef != 1:
                term = self.op("Mul", [term, self.const([coef], "i64", "c")])
            total = term if total is None else self.op("Add", [total, term])
        if total is None:
            total = self.const([0], "i64", "c")
        self.sizes[key] = total
        return total

    def cast(self, value: Any, src: str, dst: str) -> Any:
        if src == dst:
            return value
        return self.op("Cast", [value], {"to": _dtype(self.ir, dst, self)})

    def get(self, ref: str, want: str | None = None) -> Any:
        """The ONNX value of an operand, cast to ``want`` if given and different."""
        value = self.env[ref]
        return self.cast(value, self.dtype(ref), want) if want else value


def _source_line(sources: Mapping[str, list[str]], loc: str) -> str:
    user = loc.split("|", 1)[0]
    file, _, line = user.rpartition(":")
    lines = sources.get(file)
    text = ""
    if lines and line.isdigit() and 0 < int(line) <= len(lines):
        text = "  " + lines[int(line) - 1].strip()
    return f"{loc}{text}"


def _dtype(ir: Any, dtype: str, scope: Scope | None = None) -> Any:
    if dtype not in ONNX_DTYPES:
        step = scope.current if scope else None
        at = where(scope.graph, scope.step, step) if scope and step else "this graph"
        raise LinnetError(Diagnostic(
            "E0931", f"{at} uses dtype `{dtype}`, which ONNX export does not support",
            help=f"convert to one of {', '.join(ONNX_DTYPES)} before this step, or run the "
                 "model with the PyTorch runtime"))
    return getattr(ir.DataType, ONNX_DTYPES[dtype])


# ---------------------------------------------------------------- primitive rules
Rule = Callable[[Step, Scope], Any]
"""``rule(step, scope)``: appends nodes and returns the result's value (None for a state
write, which rebinds ``@state`` in the scope itself)."""


def _out(s: Step, n: Scope) -> str:
    return n.graph.values[s.results[0]].dtype


def _unary(op_type: str) -> Rule:
    def rule(s: Step, n: Scope) -> Any:
        return n.op(op_type, [n.get(s.operands[0], _out(s, n))], hint=s.results[0])
    return rule


def _binary(op_type: str, compare: bool = False) -> Rule:
    def rule(s: Step, n: Scope) -> Any:
        a, b = s.operands
        # Comparisons and logic read operands of one dtype; arithmetic computes in the result's.
        want = (n.dtype(a) if n.dtype(a) == n.dtype(b) else "f32") if compare else _out(s, n)
        return n.op(op_type, [n.get(a, want), n.get(b, want)], hint=s.results[0])
    return rule


def _rsqrt(s: Step, n: Scope) -> Any:
    return n.op("Reciprocal", [n.op("Sqrt", [n.get(s.operands[0], _out(s, n))])],
                hint=s.results[0])


def _floor(s: Step, n: Scope) -> Any:
    x = n.get(s.operands[0], _out(s, n))
    if _out(s, n) in _INTS:  # an integer is its own floor
        return n.op("Identity", [x], hint=s.results[0])
    return n.op("Floor", [x], hint=s.results[0])


def _ne(s: Step, n: Scope) -> Any:
    return n.op("Not", [_binary("Equal", compare=True)(s, n)], hint=s.results[0])


def _select(s: Step, n: Scope) -> Any:
    c, a, b = s.operands
    dt = _out(s, n)
    return n.op("Where", [n.get(c, "bool"), n.get(a, dt), n.get(b, dt)], hint=s.results[0])


def _constant(s: Step, n: Scope) -> Any:
    _dtype(n.ir, s.attributes["dtype"], n)
    return n.const(s.attributes["value"], s.attributes["dtype"], hint=s.results[0])


def _transpose(s: Step, n: Scope) -> Any:
    return n.op("Transpose", [n.get(s.operands[0])], {"perm": list(s.attributes["perm"])},
                hint=s.results[0])


_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin",
           "prod": "ReduceProd"}


def _reduce(s: Step, n: Scope) -> Any:
    kind, axes = s.attributes["kind"], list(s.attributes["axes"])
    src = s.operands[0]
    # max and min compare in the operand's dtype; the others accumulate in `accumulate`.
    x = n.get(src) if kind in ("max", "min") else n.get(src, s.attributes["accumulate"])
    if not axes:
        out = n.op("Identity", [x])
    else:
        out = n.op(_REDUCE[kind], [x, n.ints(axes, "axes")], {"keepdims": 0})
        if kind in ("max", "min") and n.dtype(src) not in _INTS | {"bool"}:
            out = onnx_edges.nan_through(n, x, out, n.dtype(src), n.ints(axes, "axes"))
    have = n.dtype(src) if kind in ("max", "min") else s.attributes["accumulate"]
    return n.op("Identity", [n.cast(out, have, _out(s, n))], hint=s.results[0])


def _contract(s: Step, n: Scope) -> Any:
    acc = s.attributes["accumulate"]
    a, b = (n.get(o, acc) for o in s.operands)
    out = n.op("Einsum", [a, b], {"equation": s.attributes["spec"]})
    return n.op("Identity", [n.cast(out, acc, _out(s, n))], hint=s.results[0])


def _index(n: Scope, ref: str, size: int, zero: bool) -> tuple[Any, Any]:
    """An index as int64, clamped into the axis, and the bool mask of the positions inside
    it (None when reads are unchecked). An index that must be in range is clamped too:
    ONNX's Gather would count -1 from the end and ScatterND fail or write outside; a caller
    reads the model's `linnet.valid` output (linnet.lang.ir.validity) to know."""
    idx = n.get(ref, "i64")
    lo, hi = n.const(0, "i64"), n.const(size - 1, "i64")
    if not zero:
        return n.op("Max", [n.op("Min", [idx, hi]), lo]), None
    valid = n.op("And", [n.op("GreaterOrEqual", [idx, lo]), n.op("LessOrEqual", [idx, hi])])
    return n.op("Max", [n.op("Min", [idx, hi]), lo]), valid


def _masked(n: Scope, s: Step, out: Any, valid: Any, have: list[int], view: list[int]) -> Any:
    """Zero where ``valid`` (of shape ``have``, reshaped to ``view``) is false."""
    mask = onnx_shapes.reshape(n, valid, have, view)
    return n.op("Where", [mask, out, n.const(0, _out(s, n))], hint=s.results[0])


def _take(s: Step, n: Scope) -> Any:
    x, ref = s.operands
    axis, zero = s.attributes["axis"], s.attributes["bounds"] == "zero"
    shape, ishape = n.shape(x), n.shape(ref)
    idx, valid = _index(n, ref, shape[axis], zero)
    out = n.op("Gather", [n.get(x), idx], {"axis": axis})
    if valid is None:
        return n.op("Identity", [out], hint=s.results[0])
    view = [1] * axis + list(ishape) + [1] * (len(shape) - axis - 1)
    return _masked(n, s, out, valid, list(ishape), view)


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> list[int]:
    rank = max((len(sh) for sh in shapes), default=0)
    out = [1] * rank
    for sh in shapes:
        for i, d in enumerate((1,) * (rank - len(sh)) + tuple(sh)):
            out[i] = max(out[i], d)
    return out


def _stacked(n: Scope, refs: list[str], sizes: tuple[int, ...], zero: bool
             ) -> tuple[Any, Any, list[int]]:
    """Indices broadcast together and stacked on a last axis (GatherND's and ScatterND's
    form), the mask of positions inside every axis, and the broadcast shape."""
    common = _broadcast_shape([n.shape(r) for r in refs])
    parts, valid = [], None
    for a, ref in enumerate(refs):
        idx, ok = _index(n, ref, sizes[a], zero)
        idx = onnx_shapes.expand(n, idx, n.shape(ref), common)
        parts.append(n.op("Unsqueeze", [idx, n.ints([-1], "axes")]))
        if ok is not None:
            ok = onnx_shapes.expand(n, ok, n.shape(ref), common)
            valid = ok if valid is None else n.op("And", [valid, ok])
    stacked = parts[0] if len(parts) == 1 else n.op("Concat", parts, {"axis": -1})
    return stacked, valid, common


def _gather(s: Step, n: Scope) -> Any:
    x, *refs = s.operands
    shape, zero = n.shape(x), s.attributes["bounds"] == "zero"
    if not refs:
        return n.op("Identity", [n.get(x)], hint=s.results[0])
    idx, valid, common = _stacked(n, refs, shape, zero)
    out = n.op("GatherND", [n.get(x), idx])
    if valid is None:
        return n.op("Identity", [out], hint=s.results[0])
    return _masked(n, s, out, valid, common, common + [1] * (len(shape) - len(refs)))


def _scatter(s: Step, n: Scope) -> None:
    state, value, *refs = s.operands
    shape, dt = n.shape(state), n.dtype(state)
    if not refs:
        new = n.op("Expand", [n.get(value, dt), n.ints(shape)], hint=state[1:])
    else:
        idx, _, common = _stacked(n, refs, shape, zero=False)
        updates = n.op("Expand", [n.get(value, dt), n.ints(common + list(shape[len(refs):]))])
        new = n.op("ScatterND", [n.get(state), idx, updates], hint=state[1:])
    n.env[state] = new  # later reads of the state see this version
    return None


def _scatter_add(s: Step, n: Scope) -> Any:
    """A copy of the operand with the value added at the positions: ScatterND with
    ``reduction="add"`` (coinciding positions add up). Under bounds zero a position outside
    adds nothing: its index is clamped into the axis and its value masked to 0 (ScatterND
    would wrap a negative index), as emit/torch.py and emit/jax.py do."""
    x, value, *refs = s.operands
    dt, shape = _out(s, n), n.shape(x)
    v = n.get(value, dt)
    if not refs:
        return n.op("Add", [n.get(x, dt), v], hint=s.results[0])
    k = len(refs)
    idx, valid, common = _stacked(n, refs, shape, s.attributes["bounds"] == "zero")
    if valid is not None:
        mask = onnx_shapes.reshape(n, valid, common, common + [1] * (len(shape) - k))
        v = n.op("Where", [mask, v, n.const(0, dt)])
    updates = n.op("Expand", [v, n.ints(common + list(shape[k:]))])
    return n.op("ScatterND", [n.get(x, dt), idx, updates], {"reduction": "add"},
                hint=s.results[0])


RULES: dict[str, Rule] = {
    "neg": _unary("Neg"), "not": _unary("Not"), "exp": _unary("Exp"), "log": _unary("Log"),
    "sqrt": _unary("Sqrt"), "rsqrt": _rsqrt, "sin": _unary("Sin"), "cos": _unary("Cos"),
    "tanh": _unary("Tanh"), "sigmoid": _unary("Sigmoid"), "erf": _unary("Erf"),
    "abs": _unary("Abs"), "floor": _floor,
    "add": _binary("Add"), "sub": _binary("Sub"), "mul": _binary("Mul"),
    "div": onnx_edges.RULES["div"], "rem": onnx_edges.RULES["rem"], "pow": _binary("Pow"),
    "maximum": _binary("Max"), "minimum": _binary("Min"),
    "lt": _binary("Less", True), "le": _binary("LessOrEqual", True),
    "gt": _binary("Greater", True), "ge": _binary("GreaterOrEqual", True),
    "eq": _binary("Equal", True), "ne": _ne,
    "and": _binary("And", True), "or": _binary("Or", True), "select": _select,
    "convert": onnx_edges.RULES["convert"], "constant": _constant, "iota": onnx_shapes.iota,
    "reshape": onnx_shapes.reshape_rule, "transpose": _transpose,
    "broadcast": onnx_shapes.broadcast_rule,
    "reduce": _reduce, "contract": _contract, "take": _take, "gather": _gather,
    "scatter": _scatter, "scatter_add": _scatter_add, "slice": onnx_shapes.slice_rule,
}
"""One rule per primitive (``tests/test_coverage.py`` checks it covers the registry)."""

_NONE: frozenset[str] = frozenset()
SYMBOLIC_ATTRIBUTES: dict[str, frozenset[str]] = {
    **{op: _NONE for op in ("neg", "not", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh",
                            "sigmoid", "erf", "abs", "floor", "add", "sub", "mul", "div", "rem",
                            "pow", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne",
                            "and", "or", "select", "convert")},
    "constant": frozenset({"value"}),  # `L as f32`: a size, cast (Scope.const)
    "iota": frozenset({"shape"}),  # Range(0, L) reshaped and expanded (_iota)
    "reshape": frozenset({"shape"}), "broadcast": frozenset({"shape"}),  # Scope.ints
    "slice": frozenset({"starts", "limits"}),  # Slice's starts and ends (Scope.ints)
    # The rest read their sizes off the operands' shapes (SymInts too); an attribute of theirs
    # (an axis, an einsum spec, a bounds mode) that changed with a dim would be a new graph.
    "transpose": _NONE, "reduce": _NONE, "contract": _NONE, "take": _NONE, "gather": _NONE,
    "scatter_add": _NONE, "scatter": _NONE,
}
"""Per primitive, the attributes whose numbers may be :class:`~linnet.lang.export.SymInt`s
(the rule computes them from the dims at run time): what
:func:`linnet.lang.export.symbolic_dims` lets change with a symbolic dim. Any other attribute
that changes is E0936, never a number fixed silently."""

# A rank's graph (linnet.lang.ir.shard) is not exported: an ONNX model is one process's
# program (E0930 names the step).
EXPECTED_MISSING: frozenset[str] = frozenset({"all_reduce", "all_gather"})


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
            return o.start <= c.start and c.stop <= o.stop and (
                o.stop - o.start > c.stop - c.start or o.depth < c.depth)

        mine = [c for c in self.calls if c is not owner and start <= c.start and c.stop <= stop
                and (owner is None or contains(owner, c))]
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
                raise LinnetError(Diagnostic(
                    "E0930", f"{where(self.graph, i, step)}: primitive `{step.op}` has no "
                             "ONNX rule",
                    help="run this model with the PyTorch runtime, or add the primitive to "
                         "linnet.lang.emit.onnx.RULES"))
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
        for j, st in enumerate(self.graph.steps[call.start:call.stop]):
            ops = [local.get(o, o if not o.startswith("%") else "?") for o in st.operands]
            # repr: a SymInt shows its polynomial, so bodies whose sizes are different
            # functions of the dims (B and KV, both 2 here) are never one function
            types = [(repr(scope.shape(o)), scope.dtype(o)) for o in [*st.operands,
                                                                      *st.results]]
            for r in st.results:
                local[r] = f"v{j}"
            key_steps.append((st.op, repr(sorted(st.attributes.items(), key=lambda kv: kv[0])),
                              tuple(ops), tuple(types)))
        key = (call.callee, tuple(key_steps), tuple(local.get(w, w) for w in sp.writes))
        fn = self.functions.get(key)
        if fn is None:
            fn = self.function(call, sp, key)
        args = [scope.env[r] for r in sp.reads] + [scope.range(d) for d in self.fn_dims[fn.name]]
        scope.step, scope.current = call.start, self.graph.steps[call.start]
        outs = scope.op(fn.name, args, domain=DOMAIN, outputs=max(len(sp.writes), 1),
                        hint=sp.writes[0] if sp.writes else call.callee.rsplit(":", 1)[-1])
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
        body = ir.Graph(inputs, outputs, nodes=inner.nodes, name=name,
                        opset_imports={"": OPSET, DOMAIN: 1})
        fn = ir.Function(DOMAIN, name, graph=body, attributes=[])
        fn.doc_string = f"{call.callee} (first called at {call.loc or '?'} for `{call.path}`)"
        self.functions[key] = fn
        return fn

    def model(self, params: Mapping[str, Any] | None, flag: str | None = None,
              checks: Mapping[str, Any] | None = None) -> Any:
        ir, g = self.ir, self.graph
        scope = Scope(ir, g, self.sources)
        inputs, initializers = [], []

        def value(name: str, dtype: str, shape: tuple[int, ...]) -> Any:
            return ir.Value(name=scope.fresh(name), type=ir.TensorType(_dtype(ir, dtype)),
                            shape=_shape(ir, shape))

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
                    raise LinnetError(Diagnostic(
                        "E0933", f"no weights for parameter `{path}` of `{g.model}`",
                        help="pass every parameter the entry reads (the model's weights)"))
                v.const_value = _tensor(ir, params[path], vt.dtype, path)
                initializers.append(v)
        # Each symbolic dim is read once off the first input or state with an axis of that
        # size: `B = Shape(tokens)[0:1]`.
        for dim in getattr(g, "symbolic", {}):
            for ref in [*g.inputs, *("@" + p for p in g.states)]:
                axes = [a for a, d in enumerate(scope.shape(ref)) if _is_dim(d, dim)]
                if axes:
                    scope.dims[dim] = scope.op("Shape", [scope.env[ref]], {
                        "start": axes[0], "end": axes[0] + 1}, hint=dim)
                    node = scope.nodes[-1]
                    node.name = scope.fresh(f"dim_{dim}")
                    node.doc_string = (f"symbolic dim {dim}: axis {axes[0]} of "
                                       f"{scope.env[ref].name}")
                    break
        # The outputs' names are taken first, so that no value inside gets them.
        out_refs = [*g.outputs, *("@" + p for p in g.states), *([flag] if flag else [])]
        out_names = [scope.fresh(r[1:] + ".value" if r.startswith("@") else r.lstrip("%"))
                     for r in g.outputs]
        out_names += [scope.fresh(p + ".next") for p in g.states]
        out_names += [scope.fresh("linnet.valid")] if flag else []
        self.body(scope, 0, len(g.steps), None)
        outputs = [scope.op("Identity", [scope.env[ref]], exact=name)
                   for ref, name in zip(out_refs, out_names)]
        for v, ref in zip(outputs, out_refs):
            v.type = ir.TensorType(_dtype(ir, scope.dtype(ref)))
            v.shape = _shape(ir, scope.shape(ref))
        graph = ir.Graph(inputs, outputs, nodes=scope.nodes, initializers=initializers,
                         name=f"{g.model}.{g.entry}", opset_imports={"": OPSET, DOMAIN: 1})
        model = ir.Model(graph, ir_version=IR_VERSION, producer_name="linnet-lang",
                         producer_version=__version__,
                         functions=list(self.functions.values()))
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
        raise LinnetError(Diagnostic(
            "E0944", f"the ONNX model of `{g.model}.{g.entry}` would name input `{path}` and "
                     f"{kind} `{path}` alike: ONNX feeds inputs by name",
            help=f"rename the entry's input `{path}` (its inputs, states and parameters share "
                 "one namespace in ONNX)"))


def _is_dim(d: Any, name: str) -> bool:
    return isinstance(d, SymInt) and d.poly == (((name,), 1),)


def _shape(ir: Any, shape: tuple[int, ...]) -> Any:
    """An ONNX shape: a symbolic size is a ``dim_param`` named by its polynomial (``B``,
    ``B*L``), the rest are numbers."""
    return ir.Shape([poly_text(d.poly) if isinstance(d, SymInt) else int(d) for d in shape])


def _tensor(ir: Any, value: Any, dtype: str, name: str) -> Any:
    """A weight (a numpy array, or a torch tensor: read through numpy) as an ir tensor."""
    import ml_dtypes
    import numpy as np

    if hasattr(value, "detach"):  # torch: bf16 has no numpy dtype, its bits go through int16
        t = value.detach().cpu().contiguous()
        value = t.view(_torch_int16()).numpy().view(ml_dtypes.bfloat16) \
            if str(t.dtype) == "torch.bfloat16" else t.numpy()
    arr = np.ascontiguousarray(value)
    want = ml_dtypes.bfloat16 if dtype == "bf16" else NUMPY_DTYPES[dtype]
    return ir.tensor(arr.astype(want, copy=False), name=name)


def _torch_int16() -> Any:
    import torch

    return torch.int16


def emit_onnx(graph: Graph, params: Mapping[str, Any] | None = None,
              sources: Mapping[str, str] | None = None, validity: bool = True) -> Any:
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


def save_onnx(model: Any, path: str | Path, external_threshold: int = EXTERNAL_THRESHOLD) -> list[Path]:
    """Write ``model`` to ``path``; with more than ``external_threshold`` bytes of weights,
    they go to ``<path>.data`` beside it (ONNX's external data; a protobuf holds at most
    2 GiB). Returns the files written.

    >>> save_onnx(emit_onnx(graph, weights), "decode.onnx")           # doctest: +SKIP
    [PosixPath('decode.onnx')]
    """
    ir = _ir()
    path = Path(path)
    size = sum(v.const_value.nbytes for v in model.graph.initializers.values()
               if v.const_value is not None)
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
        raise LinnetError(Diagnostic(
            "E0934", f"the ONNX model for `{model.graph.name}` fails onnx.checker: {first}",
            help="this is a bug in linnet-lang's ONNX emitter: please report it")) from None

