"""The StableHLO emitter's builder: :class:`Scope` (one function's text: its operations, the
SSA name and type of each graph ref), the dtype tables and the literal writers the rules and the
emitter share. :mod:`.stablehlo` (the emitter) and :mod:`.stablehlo_rules` (a rule per
primitive) build on it.

>>> scalar_literal(1.5, "f32")
'1.500000000e+00'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.graph import Graph, Step

MLIR_DTYPES = {
    "f64": "f64",
    "f32": "f32",
    "f16": "f16",
    "bf16": "bf16",
    "i64": "i64",
    "i32": "i32",
    "i16": "i16",
    "i8": "i8",
    "u8": "ui8",
    "bool": "i1",
}
_FLOATS = {"f64", "f32", "f16", "bf16"}
_INTS = {"i64", "i32", "i16", "i8", "u8"}
# IEEE bit patterns of +inf and NaN (MLIR writes non-finite float constants in hex).
_INF_BITS = {
    "f64": (0x7FF0000000000000, 0x7FF8000000000000, 16),
    "f32": (0x7F800000, 0x7FC00000, 8),
    "f16": (0x7C00, 0x7E00, 4),
    "bf16": (0x7F80, 0x7FC0, 4),
}
_SIGN = {"f64": 1 << 63, "f32": 1 << 31, "f16": 1 << 15, "bf16": 1 << 15}
_INT_RANGE = {
    "i64": (-(2**63), 2**63 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "i16": (-(2**15), 2**15 - 1),
    "i8": (-128, 127),
    "u8": (0, 255),
}


def where(graph: Graph, index: int, step: Step) -> str:
    """How an error names a step: its index, op and source line."""
    return f"step {index} ({step.op}) of `{graph.model}.{graph.entry}` at {step.loc or '?'}"


def _ints(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def _array(values: Sequence[int]) -> str:
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in values) if values else "") + ">"


def scalar_literal(value: Any, dtype: str) -> str:
    """A constant's element as MLIR writes it in ``dense<...>``.

    >>> scalar_literal(float("-inf"), "f32"), scalar_literal(0.5, "f32"), scalar_literal(1, "bool")
    ('0xFF800000', '5.000000000e-01', 'true')
    """
    if dtype == "bool":
        return "true" if value else "false"
    if dtype in _INTS:
        return str(int(value))
    v = float(value)
    if math.isfinite(v):
        return (
            f"{v:.9e}"
            if dtype != "f64"
            else repr(v)
            if "e" in repr(v) or "." in repr(v)
            else f"{v:.1f}"
        )
    inf, nan, width = _INF_BITS[dtype]
    bits = nan if math.isnan(v) else inf | (_SIGN[dtype] if v < 0 else 0)
    return f"0x{bits:0{width}X}"


# ---------------------------------------------------------------- one function's text
@dataclass
class Scope:
    graph: Graph
    lines: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # graph ref -> SSA name
    types: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # SSA -> type
    names: set[str] = field(default_factory=set)
    step: int = 0
    current: Step | None = None
    loc: str = ""
    portable: bool = False  # StableHLO operations only (stablehlo_portable): no chlo.erf

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^0-9A-Za-z_]", "_", hint.lstrip("%@")) or "v"
        if base[0].isdigit():
            base = "v" + base
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return "%" + name

    def ref_type(self, ref: str) -> tuple[tuple[int, ...], str]:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].shape, table[path].dtype
        v = self.graph.values[ref]
        return v.shape, v.dtype

    def ty(self, ssa_or_shape: Any, dtype: str | None = None) -> str:
        if dtype is None:
            shape, dtype = self.types[ssa_or_shape]
        else:
            shape = ssa_or_shape
        if dtype not in MLIR_DTYPES:
            at = where(self.graph, self.step, self.current) if self.current else "this graph"
            raise LinnetError(
                Diagnostic(
                    "E0941",
                    f"{at} uses dtype `{dtype}`, which StableHLO export does not support",
                    help=f"convert to one of {', '.join(MLIR_DTYPES)} before this step, or run "
                    "the model with the PyTorch runtime",
                )
            )
        dims = "".join(f"{d}x" for d in shape)
        return f"tensor<{dims}{MLIR_DTYPES[dtype]}>"

    def op(
        self,
        name: str,
        operands: list[str],
        shape: Sequence[int],
        dtype: str,
        attrs: str = "",
        region: str = "",
        hint: str = "",
    ) -> str:
        """Append one operation (generic form); returns its result's SSA name."""
        out = self.fresh(hint or name.rsplit(".", 1)[-1])
        self.types[out] = (tuple(shape), dtype)
        ins = ", ".join(self.ty(o) for o in operands)
        text = f'{out} = "{name}"({", ".join(operands)})'
        if region:
            text += f" ({region})"
        if attrs:
            text += f" {{{attrs}}}"
        text += f" : ({ins}) -> {self.ty(out)}"
        if self.loc:
            text += f' loc("{_escape(self.loc)}")'
        self.lines.append(text)
        return out

    def get(self, ref: str, dtype: str | None = None, shape: Sequence[int] | None = None) -> str:
        """A graph operand's SSA value, converted to ``dtype`` and broadcast to ``shape``."""
        v = self.env[ref]
        return self.coerce(v, dtype, shape)

    def coerce(self, v: str, dtype: str | None = None, shape: Sequence[int] | None = None) -> str:
        have_shape, have = self.types[v]
        if dtype is not None and dtype != have:
            v = self.op("stablehlo.convert", [v], have_shape, dtype)
        if shape is not None and tuple(shape) != have_shape:
            v = self.broadcast(v, shape)
        return v

    def broadcast(self, v: str, shape: Sequence[int]) -> str:
        """numpy broadcasting of ``v`` to ``shape`` (axes aligned on the right)."""
        have_shape, dtype = self.types[v]
        offset = len(shape) - len(have_shape)
        dims = list(range(offset, len(shape)))
        return self.op(
            "stablehlo.broadcast_in_dim",
            [v],
            shape,
            dtype,
            f"broadcast_dimensions = {_array(dims)}",
        )

    def const(self, value: Any, dtype: str, hint: str = "c") -> str:
        lit = scalar_literal(value, dtype)
        return self.op(
            "stablehlo.constant",
            [],
            (),
            dtype,
            f"value = dense<{lit}> : {self.ty((), dtype)}",
            hint=hint,
        )

    def reshape(self, v: str, shape: Sequence[int]) -> str:
        if tuple(shape) == self.types[v][0]:
            return v
        return self.op("stablehlo.reshape", [v], shape, self.types[v][1])


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


# ---------------------------------------------------------------- primitive rules
Rule = Callable[[Step, Scope], Any]
