"""The ONNX emitter's builder: :class:`Scope` (the nodes of one ONNX graph or function body and
the ONNX value of each graph ref), the dtype tables and the small helpers the rules and the
emitter share. :mod:`.onnx` (the emitter) and :mod:`.onnx_rules` (a rule per primitive) build
on it.

>>> ONNX_DTYPES["bf16"]
'BFLOAT16'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.graph import Graph, Step
from linnet.lang.tensors.poly import SymInt, poly_text

OPSET = 21  # onnxruntime 1.20+ and onnx 1.17+ run and check opset 21
IR_VERSION = 10
DOMAIN = "linnet.std"
EXTERNAL_THRESHOLD = 1 << 30  # bytes of parameters above which `save_onnx` writes external data

# Linnet dtype -> the name of onnx_ir.DataType's member.
ONNX_DTYPES = {
    "f64": "DOUBLE",
    "f32": "FLOAT",
    "f16": "FLOAT16",
    "bf16": "BFLOAT16",
    "i64": "INT64",
    "i32": "INT32",
    "i16": "INT16",
    "i8": "INT8",
    "u8": "UINT8",
    "bool": "BOOL",
}
NUMPY_DTYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u8": "uint8",
    "bool": "bool",
}
_INTS = {"i64", "i32", "i16", "i8", "u8"}


def _ir() -> Any:
    try:
        import onnx_ir
    except ImportError:
        raise LinnetError(
            Diagnostic(
                "E0932",
                "ONNX export needs the onnx and onnx-ir packages, which are not installed",
                help="install them with `pip install 'linnet-lang[onnx]'`",
            )
        ) from None
    return onnx_ir


def where(graph: Graph, index: int, step: Step) -> str:
    """How an error names a step: its index, op and source line."""
    return f"step {index} ({step.op}) of `{graph.model}.{graph.entry}` at {step.loc or '?'}"


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

    def op(
        self,
        op_type: str,
        inputs: list[Any],
        attributes: dict | None = None,
        hint: str = "",
        domain: str = "",
        outputs: int = 1,
        exact: str = "",
    ) -> Any:
        """Append one node; returns its output value (a list when ``outputs`` > 1).
        ``exact``: the output's name, reserved beforehand (the graph's outputs)."""
        ir = self.ir
        results = [
            ir.Value(name=exact or self.fresh(hint or op_type.lower())) for _ in range(outputs)
        ]
        step = self.current
        node = ir.Node(
            domain,
            op_type,
            inputs,
            attributes=[
                ir.convenience.convert_attribute(k, v) for k, v in (attributes or {}).items()
            ],
            outputs=results,
            name=self.fresh(f"s{self.step}_{step.op if step else op_type}"),
        )
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
            return (
                scalar
                if dtype == "i64"
                else self.op("Cast", [scalar], {"to": _dtype(ir, dtype, self)}, hint=hint)
            )
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
                self.ranges[name] = self.op(
                    "Range", [self.const(0, "i64"), size, self.const(1, "i64")], hint=name + ".iota"
                )
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
        raise LinnetError(
            Diagnostic(
                "E0931",
                f"{at} uses dtype `{dtype}`, which ONNX export does not support",
                help=f"convert to one of {', '.join(ONNX_DTYPES)} before this step, or run the "
                "model with the PyTorch runtime",
            )
        )
    return getattr(ir.DataType, ONNX_DTYPES[dtype])


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
        value = (
            t.view(_torch_int16()).numpy().view(ml_dtypes.bfloat16)
            if str(t.dtype) == "torch.bfloat16"
            else t.numpy()
        )
    arr = np.ascontiguousarray(value)
    want = ml_dtypes.bfloat16 if dtype == "bf16" else NUMPY_DTYPES[dtype]
    return ir.tensor(arr.astype(want, copy=False), name=name)


def _torch_int16() -> Any:
    import torch

    return torch.int16


# ---------------------------------------------------------------- primitive rules
Rule = Callable[[Step, Scope], Any]
