"""The graph format: the one IR every emitter, runtime and backend reads.

A :class:`Graph` is an entry lowered for concrete shapes:

* ``steps``: one primitive call each (``op``, ``operands``, ``results``, ``attributes``).
  Operands are SSA value names (``%q``) or parameter/state paths (``@layers.0.attn.q.weight``).
* ``calls``: every fn/op/block call that lowering inlined, as a span ``start..stop`` of steps
  with its ``callee``, ``path`` and ``index``.
* ``values``: the shape and dtype of every SSA value; ``parameters`` and ``states`` by path.

The serialised form is JSON with ``format`` = :data:`FORMAT_VERSION`; see docs/graph-format.md.

>>> from linnet.lang import Program, lower
>>> g = lower(Program.from_file("examples/llama/llama.linnet"), "decode",
...           {"token": [1], "pos": [1]}, toy_config)                 # doctest: +SKIP
>>> [c.path for c in g.semantic_calls("std.nn.linear::linear")][:2]  # doctest: +SKIP
['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj']
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 1
FORMAT_NAME = "linnet.graph"
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _encode(value: Any) -> Any:
    """Strict JSON: infinities and NaN (masks, max identities) are written as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode_attributes(attrs: dict) -> dict:
    out = dict(attrs)
    for key in ("value", "identity"):
        if isinstance(out.get(key), str) and out[key] in _NONFINITE:
            out[key] = _NONFINITE[out[key]]
    return out


@dataclass(frozen=True)
class ValueType:
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}


@dataclass
class Step:
    op: str
    operands: list[str]
    results: list[str]
    attributes: dict[str, Any] = field(default_factory=dict)
    loc: str = ""

    def parameters(self) -> list[str]:
        """Paths this step reads or writes (operands starting with `@`), without the `@`."""
        return [o[1:] for o in self.operands if o.startswith("@")]

    def values(self) -> list[str]:
        return [o for o in self.operands if o.startswith("%")]

    def to_json(self) -> dict:
        out: dict[str, Any] = {"op": self.op, "operands": self.operands, "results": self.results}
        if self.attributes:
            out["attributes"] = _encode(self.attributes)
        if self.loc:
            out["loc"] = self.loc
        return out


# What a call of an op bound to a kernel records (check/kernels.py): the kernel and its
# generics, whether its `where` clause holds, and a chain's next kernel (each stage's
# ``kernel_then`` holds the one after it).
KERNEL_ATTRIBUTES = frozenset({"kernel", "kernel_generics", "kernel_applies", "kernel_then"})


def kernel_stages(attributes: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(kernel, generics) of each kernel a bound call launches, in order: one, or a chain's
    (`kernel a<...> then b<...> then c<...>`).

    >>> kernel_stages({"kernel": "m::a", "kernel_generics": {"N": 2},
    ...                "kernel_then": {"kernel": "m::b", "kernel_generics": {"N": 2}}})
    [('m::a', {'N': 2}), ('m::b', {'N': 2})]
    """
    out: list[tuple[str, dict[str, Any]]] = []
    stage: dict[str, Any] | None = attributes
    while stage and stage.get("kernel"):
        out.append((stage["kernel"], stage.get("kernel_generics") or {}))
        stage = stage.get("kernel_then")
    return out


@dataclass
class Call:
    """An inlined call: steps ``start..stop`` (stop exclusive) came from calling ``callee``."""

    callee: str
    kind: str  # the callee's kind: op, fn (functions and block methods) or entry
    start: int
    stop: int
    index: int
    path: str = ""
    depth: int = 0
    loc: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    # For a method called on an element of a repeated block array (`for layer in self.layers`,
    # `self.layers[i]`): the element's index (3 for model.layers.3) and the array's path
    # ("model.layers"). Later stages read these instead of parsing paths.
    iteration: int | None = None
    repeated: str = ""

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "callee": self.callee,
            "kind": self.kind,
            "start": self.start,
            "stop": self.stop,
            "index": self.index,
            "path": self.path,
            "depth": self.depth,
        }
        if self.loc:
            out["loc"] = self.loc
        # Written only when set, so graphs without repeated blocks read as before.
        if self.iteration is not None:
            out["iteration"] = self.iteration
        if self.repeated:
            out["repeated"] = self.repeated
        if self.attributes:
            out["attributes"] = _encode(self.attributes)
        return out


@dataclass
class Graph:
    """An entry lowered for concrete shapes (see the module docstring)."""

    entry: str
    model: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    values: dict[str, ValueType] = field(default_factory=dict)
    parameters: dict[str, ValueType] = field(default_factory=dict)
    states: dict[str, ValueType] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)  # the model's DType generics
    config: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    # What bound calls launch and their backward passes, recorded at lowering time by
    # check/kernel_instances.py (ir/kernels.py's KernelInstance and BackwardBody, by
    # instance_key and backward_key): in memory only, not in the JSON format.
    kernels: dict[str, Any] = field(default_factory=dict)
    backwards: dict[str, Any] = field(default_factory=dict)

    def semantic_calls(self, callee: str) -> list[Call]:
        """The calls of ``callee`` (a qualified name such as ``std.nn.linear::linear``).

        >>> g = Graph("decode", "m")
        >>> g.calls.append(Call("std.nn.linear::linear", "op", 0, 1, 0, "q_proj"))
        >>> [c.path for c in g.semantic_calls("std.nn.linear::linear")]
        ['q_proj']
        """
        return [c for c in self.calls if c.callee == callee]

    def producers(self) -> dict[str, int]:
        """Map each SSA value to the index of the step that made it."""
        return {r: i for i, s in enumerate(self.steps) for r in s.results}

    def users(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, s in enumerate(self.steps):
            for o in s.operands:
                out.setdefault(o, []).append(i)
        return out

    def iter_ops(self) -> Iterator[str]:
        return (s.op for s in self.steps)

    def to_json(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "model": self.model,
            "entry": self.entry,
            "dims": self.dims,
            "dtypes": self.dtypes,
            "config": _encode(self.config),
            "inputs": self.inputs,
            "outputs": self.outputs,
            "parameters": {k: v.to_json() for k, v in self.parameters.items()},
            "states": {k: v.to_json() for k, v in self.states.items()},
            "values": {k: v.to_json() for k, v in self.values.items()},
            "steps": [s.to_json() for s in self.steps],
            "calls": [c.to_json() for c in self.calls],
        }

    def dumps(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_json(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, data: dict) -> Graph:
        """Read a serialised graph; a wrong format or version is a :class:`LinnetError`."""
        from linnet.lang.diagnostics.core import Diagnostic, LinnetError

        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise LinnetError(
                Diagnostic(
                    "E0900",
                    "this is not a Linnet graph",
                    help="write one with `linnet graph FILE --entry E`",
                )
            )
        if data.get("version") != FORMAT_VERSION:
            raise LinnetError(
                Diagnostic(
                    "E0901",
                    f"graph format version {data.get('version')} is not supported "
                    f"(this linnet-lang reads version {FORMAT_VERSION})",
                    help="write the graph again with this version of linnet-lang",
                )
            )

        def vt(d: dict) -> ValueType:
            return ValueType(tuple(d["shape"]), d["dtype"])

        return cls(
            entry=data["entry"],
            model=data["model"],
            inputs=list(data["inputs"]),
            outputs=list(data["outputs"]),
            steps=[
                Step(
                    s["op"],
                    s["operands"],
                    s["results"],
                    _decode_attributes(s.get("attributes", {})),
                    s.get("loc", ""),
                )
                for s in data["steps"]
            ],
            calls=[
                Call(
                    c["callee"],
                    c["kind"],
                    c["start"],
                    c["stop"],
                    c["index"],
                    c["path"],
                    c.get("depth", 0),
                    c.get("loc", ""),
                    c.get("attributes", {}),
                    c.get("iteration"),
                    c.get("repeated", ""),
                )
                for c in data["calls"]
            ],
            values={k: vt(v) for k, v in data["values"].items()},
            parameters={k: vt(v) for k, v in data["parameters"].items()},
            states={k: vt(v) for k, v in data["states"].items()},
            dims=dict(data.get("dims", {})),
            dtypes=dict(data.get("dtypes", {})),
            config=dict(data.get("config", {})),
        )

    @classmethod
    def loads(cls, text: str) -> Graph:
        return cls.from_json(json.loads(text))

    def summary(self) -> str:
        """A short human-readable listing: one line per step, calls as headers."""
        starts: dict[int, list[Call]] = {}
        for c in self.calls:
            starts.setdefault(c.start, []).append(c)
        lines = [f"graph {self.model}.{self.entry}  (format {FORMAT_NAME} v{FORMAT_VERSION})"]
        for name in self.inputs:
            v = self.values[name]
            lines.append(f"  input {name}: {v.dtype}{list(v.shape)}")
        for i, s in enumerate(self.steps):
            for c in sorted(starts.get(i, []), key=lambda c: c.depth):
                where = f" [{c.path}]" if c.path else ""
                lines.append(f"  {'  ' * c.depth}call {c.callee}{where}  steps {c.start}..{c.stop}")
            res = ", ".join(
                f"{r}: {self.values[r].dtype}{list(self.values[r].shape)}" for r in s.results
            )
            attrs = ", ".join(f"{k}={v}" for k, v in s.attributes.items())
            lhs = f"{res} = " if res else ""
            lines.append(
                f"  {i:5d}  {lhs}{s.op}({', '.join(s.operands)})"
                + (f" {{{attrs}}}" if attrs else "")
            )
        lines.append(f"  return {', '.join(self.outputs)}")
        return "\n".join(lines)
